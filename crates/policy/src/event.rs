//! What the engine reacts to. The daemon builds these from BPF events and slot reads; the
//! simulator from its simulated host.

use pvsched_abi::GuestHalf;

/// Why the host woke a vCPU thread (from the waker in `sched_waking`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WakeSource {
    /// A host timer (guest timer interrupt, hrtimer emulation).
    Timer,
    /// An I/O thread of the VMM (virtio completion, ...).
    Io,
    /// Another vCPU of the same VM (IPI).
    OtherVcpu,
    /// Anything else, or not known.
    Unknown,
}

/// What else the host's CPUs ran at a report of a vCPU (preempted, halted, woken): what
/// its VM competes with. Ordered: each variant adds to the one before it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rivals {
    /// Every CPU ran its idle task, pvschedd or a thread of the VM's own process: the VM
    /// competes only with itself, and a boost would only reorder its own threads.
    None,
    /// Besides those, only threads of other VMs pvschedd serves: VMs that get the same
    /// boosts (see [`crate::VmLimits::peer_vms_are_rivals`]).
    PeerVms,
    /// A task that is none of those (a host task, an unserved VM). Also where nobody
    /// looked.
    #[default]
    Host,
}

/// `kvm_exit` reasons the engine tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExitReason {
    /// HLT: the vCPU is about to halt (treated like `Blocked` for proactive halt boosts).
    Hlt,
    /// PAUSE-loop exit: the guest spins (counted only).
    Pause,
    /// Anything else (counted only).
    Other,
}

/// One input to [`crate::VmState::handle`]. vCPU indices are slot indices; out-of-range
/// ones are ignored and counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A fresh copy of the vCPU's guest half. `consistent` is false when the seqcount read
    /// never became consistent within its retries: treated as "no request".
    GuestUpdate {
        vcpu: u32,
        guest: GuestHalf,
        consistent: bool,
    },
    /// The host switched the vCPU thread in.
    Running { vcpu: u32 },
    /// The host switched the vCPU thread out while it was runnable. `rivals`: see
    /// [`Event::Woken`].
    Preempted { vcpu: u32, rivals: Rivals },
    /// The host switched the vCPU thread out not runnable: the guest halted. `rivals`: see
    /// [`Event::Woken`].
    Blocked { vcpu: u32, rivals: Rivals },
    /// The host is waking the vCPU thread (`sched_waking`). `cpu_idle`: the
    /// host CPU it wakes on runs nothing else, so it runs at once and a
    /// proactive boost would change nothing (none is started). `rivals`: what the host's
    /// other CPUs ran then (see [`crate::VmLimits::boost_only_against_rivals`]).
    Woken {
        vcpu: u32,
        source: WakeSource,
        cpu_idle: bool,
        rivals: Rivals,
    },
    /// An interrupt was targeted at the vCPU (`kvm_apic_accept_irq`, `kvm_msi_set_irq`).
    InterruptTargeted { vcpu: u32 },
    /// A `kvm_exit` of the vCPU.
    KvmExit { vcpu: u32, reason: ExitReason },
    /// KVM's account of a halt that ended (`kvm_vcpu_wakeup`): `halt_ns` from the guest's
    /// HLT to its wakeup, halt polling included; `polled`: KVM's halt polling caught the
    /// wakeup, so the thread never blocked and no scheduler event saw the halt.
    KvmHaltEnded {
        vcpu: u32,
        halt_ns: u64,
        polled: bool,
    },
    /// Time passed: re-evaluate every vCPU (expiries, throttles, debt). Deliver one at
    /// [`crate::VmState::next_deadline`].
    Tick,
    /// The host's CPUs are (not) contended; reported to the guest in the host half.
    OverloadHint { overloaded: bool },
}

impl Event {
    /// The vCPU the event is about, if any.
    pub const fn vcpu(&self) -> Option<u32> {
        match *self {
            Event::GuestUpdate { vcpu, .. }
            | Event::Running { vcpu }
            | Event::Preempted { vcpu, .. }
            | Event::Blocked { vcpu, .. }
            | Event::Woken { vcpu, .. }
            | Event::InterruptTargeted { vcpu }
            | Event::KvmExit { vcpu, .. }
            | Event::KvmHaltEnded { vcpu, .. } => Some(vcpu),
            Event::Tick | Event::OverloadHint { .. } => None,
        }
    }

    /// Whether the vCPU's guest half should be read just before this event is handled:
    /// the moments the guest's state may start a boost (preempted, woken) or end one
    /// (halted: the guest published "idle" before halting). pvschedd and the simulator
    /// both feed the policy by this rule.
    pub const fn reads_slot_first(&self) -> bool {
        matches!(
            self,
            Event::Preempted { .. } | Event::Blocked { .. } | Event::Woken { .. }
        )
    }

    /// The payload-free kind (for per-kind counters).
    pub const fn kind(&self) -> EventKind {
        match self {
            Event::GuestUpdate { .. } => EventKind::GuestUpdate,
            Event::Running { .. } => EventKind::Running,
            Event::Preempted { .. } => EventKind::Preempted,
            Event::Blocked { .. } => EventKind::Blocked,
            Event::Woken { .. } => EventKind::Woken,
            Event::InterruptTargeted { .. } => EventKind::InterruptTargeted,
            Event::KvmExit { .. } => EventKind::KvmExit,
            Event::KvmHaltEnded { .. } => EventKind::KvmHaltEnded,
            Event::Tick => EventKind::Tick,
            Event::OverloadHint { .. } => EventKind::OverloadHint,
        }
    }
}

/// The kind of an [`Event`], without payload (for per-kind counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    GuestUpdate,
    Running,
    Preempted,
    Blocked,
    Woken,
    InterruptTargeted,
    KvmExit,
    KvmHaltEnded,
    Tick,
    OverloadHint,
}

impl EventKind {
    /// Number of kinds.
    pub const COUNT: usize = 10;

    /// All kinds, in index order.
    pub const ALL: [EventKind; EventKind::COUNT] = [
        EventKind::GuestUpdate,
        EventKind::Running,
        EventKind::Preempted,
        EventKind::Blocked,
        EventKind::Woken,
        EventKind::InterruptTargeted,
        EventKind::KvmExit,
        EventKind::KvmHaltEnded,
        EventKind::Tick,
        EventKind::OverloadHint,
    ];

    /// Position in [`EventKind::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Short snake_case name for metrics labels.
    pub const fn name(self) -> &'static str {
        match self {
            EventKind::GuestUpdate => "guest_update",
            EventKind::Running => "running",
            EventKind::Preempted => "preempted",
            EventKind::Blocked => "blocked",
            EventKind::Woken => "woken",
            EventKind::InterruptTargeted => "interrupt_targeted",
            EventKind::KvmExit => "kvm_exit",
            EventKind::KvmHaltEnded => "kvm_halt_ended",
            EventKind::Tick => "tick",
            EventKind::OverloadHint => "overload_hint",
        }
    }
}

impl core::fmt::Display for EventKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}
