//! Lazy records: which records of a vCPU need not wake the daemon.
//!
//! A record that cannot change a decision now is still queued in the ring
//! buffer, but without a wakeup: the daemon reads it at its next wakeup
//! (another record, its timer) with the time it happened. This module owns
//! the whole feature: the rule ([`Quiet::for_vcpu`]), the classes of
//! records ([`Quiet::covers`]) and the per-vCPU cells in the BPF `lazy`
//! array that the programs read ([`LazyCells`]). The event loop only tells
//! the source, per vCPU, whether it is boosted and under which limits.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use pvsched_policy::VmLimits;

use super::wire::{
    PVS_LAZY_ALL, PVS_LAZY_BLOCKED, PVS_LAZY_KVM_EXIT, PVS_LAZY_KVM_IRQ, PVS_LAZY_KVM_WAKEUP,
    PVS_LAZY_NO_HOST_RIVAL, PVS_LAZY_NO_RIVAL, PVS_LAZY_PREEMPTED, PVS_LAZY_SWITCH_IN,
    PVS_LAZY_WAKING,
};
use super::EventSourceError;
#[cfg(test)]
use super::{EventKind, HostEvent};

/// The classes of a vCPU's records that are queued without waking the
/// daemon (`enum pvs_lazy` bits). `Quiet::NONE`: every record wakes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quiet(u32);

impl Quiet {
    pub const NONE: Quiet = Quiet(0);
    pub const ALL: Quiet = Quiet(PVS_LAZY_ALL);

    /// The rule. While any vCPU is boosted the daemon wakes on its recheck
    /// timer, which drains the queue and re-reads the boosted vCPUs found on
    /// a CPU: nothing a boosted vCPU does needs a wakeup of its own. An
    /// unboosted one: its switch-ins and halts never start a boost (a boost
    /// follows a wakeup, a preemption, an interrupt or a slot read), and its
    /// wakeups or preemptions do not either when the limits make nothing of
    /// them. An interrupt for it (`KVM_IRQ`, read in the target's cell) starts a boost
    /// only with `proactive_irq`, as a speculative one: the same limits quiet it as its
    /// wakeups (an IPI storm between one VM's vCPUs woke the daemon for each, to boost
    /// nothing).
    ///
    /// `waited_on`: another vCPU's guest waits for a lock this one holds: its preemption
    /// starts an extension, its switch-in ends the preemption the waiters see.
    /// `shows_preempted`: its host half says preempted to a guest whose lock waiters act on
    /// that (they stop spinning): the switch-in that ends it must be published at once.
    /// `quiet_without_rt_work`: its VM ran no guest RT work within `halt_boost_ns` and
    /// `daemon.quiet_without_rivals` is on: with `boost_only_against_rivals` a preemption
    /// or wakeup seen while no CPU runs a task from outside the VM starts no boost
    /// (`PVS_LAZY_NO_RIVAL`: the program queues those flagged `PVS_F_NO_RIVAL` quietly),
    /// and without `peer_vms_are_rivals` nor one seen while only other served VMs' threads
    /// ran (`PVS_LAZY_NO_HOST_RIVAL`; an extension such a preemption could start needs a
    /// wait naming the vCPU, which makes it `waited_on`).
    /// With `speculative_boosts_need_rt_work` such a VM's preemptions and wakeups start no
    /// speculative boost whatever the rivals, so all of them are queued quietly.
    /// Guest RT work starting then is seen at the next read (a record with rivals, a
    /// doorbell, the scan), within `scan_interval_us`.
    pub fn for_vcpu(
        boosted: bool,
        limits: &VmLimits,
        waited_on: bool,
        shows_preempted: bool,
        quiet_without_rt_work: bool,
    ) -> Quiet {
        if waited_on && limits.honor_lock_holders {
            return Quiet(PVS_LAZY_BLOCKED | PVS_LAZY_KVM_WAKEUP);
        }
        if boosted {
            return Quiet::ALL;
        }
        let mut bits = PVS_LAZY_BLOCKED | PVS_LAZY_KVM_WAKEUP;
        if !shows_preempted {
            bits |= PVS_LAZY_SWITCH_IN;
        }
        // A wakeup matters for a proactive boost, or for the guest's pending
        // hint, read then.
        if !limits.proactive_wake && !limits.honor_pending_hint {
            bits |= PVS_LAZY_WAKING;
        }
        if !limits.proactive_irq {
            bits |= PVS_LAZY_KVM_IRQ;
        }
        if !(limits.honor_critical_sections
            || limits.honor_guest_rt
            || limits.honor_boost_request
            || limits.honor_pending_hint)
        {
            // Nothing the guest says can start a boost on a preemption.
            bits |= PVS_LAZY_PREEMPTED;
        }
        if quiet_without_rt_work && limits.boost_only_against_rivals {
            bits |= PVS_LAZY_NO_RIVAL;
            if !limits.peer_vms_are_rivals {
                bits |= PVS_LAZY_NO_HOST_RIVAL;
            }
        }
        if quiet_without_rt_work && limits.speculative_boosts_need_rt_work {
            bits |= PVS_LAZY_PREEMPTED | PVS_LAZY_WAKING | PVS_LAZY_KVM_IRQ;
        }
        Quiet(bits)
    }

    /// The rule where the sched_ext scheduler decides the VM's boosts itself
    /// (`VmState::set_kernel_decides_rt`): a halt, a preemption and a wakeup
    /// start no boost the daemon decides (the scheduler took it at the
    /// enqueue), so those records are read at the next scan; except a
    /// wakeup, while `pending_hints` (a VM of several vCPUs whose pending
    /// hints the policy honours: another vCPU may have raised one for this
    /// one while it waited, which only the daemon reads in time), and the
    /// switch-in that ends a preemption a lock guest's host half shows
    /// (`shows_preempted`, as in [`Quiet::for_vcpu`]). A lock wait naming
    /// the vCPU changes nothing here (`self` is to be ruled without it): the
    /// scheduler extends a holder at the preemption itself, and the policy
    /// then extends none after the fact. Its records woke the daemon, which
    /// runs ahead of every vCPU, and its wakeups were most of the holders'
    /// preemptions before their slice end (LH33).
    pub fn kernel_decides(self, pending_hints: bool, shows_preempted: bool) -> Quiet {
        let mut bits = self.0 | PVS_LAZY_KVM_EXIT | PVS_LAZY_PREEMPTED | PVS_LAZY_BLOCKED;
        if !shows_preempted {
            bits |= PVS_LAZY_SWITCH_IN;
        }
        if !pending_hints {
            bits |= PVS_LAZY_WAKING;
        }
        Quiet(bits)
    }

    /// Whether `ev` would be queued without a wakeup under this setting, as
    /// the program decides (the daemon reads the decision from the record's
    /// `PVS_F_QUIET`; the tests state the rule in event kinds with this).
    #[cfg(test)]
    pub fn covers(self, ev: &HostEvent) -> bool {
        let class = match ev.kind {
            EventKind::SwitchIn { .. } => PVS_LAZY_SWITCH_IN,
            EventKind::SwitchOut { runnable: true } => PVS_LAZY_PREEMPTED,
            EventKind::SwitchOut { runnable: false } => PVS_LAZY_BLOCKED,
            EventKind::Waking { .. } => PVS_LAZY_WAKING,
            EventKind::KvmExit { .. } => PVS_LAZY_KVM_EXIT,
            EventKind::KvmHaltWakeup { .. } => PVS_LAZY_KVM_WAKEUP,
            // Read in its target vCPU's cell (`vcpu_slots`).
            EventKind::KvmIrq => PVS_LAZY_KVM_IRQ,
        };
        let looks = matches!(
            ev.kind,
            EventKind::SwitchOut { .. } | EventKind::Waking { .. } | EventKind::KvmIrq
        );
        self.0 & class != 0
            || (looks && !ev.rivals && self.0 & PVS_LAZY_NO_RIVAL != 0)
            || (looks && !ev.host_rivals && self.0 & PVS_LAZY_NO_HOST_RIVAL != 0)
    }

    /// The `enum pvs_lazy` bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// From raw bits (unknown bits dropped).
    pub fn from_bits(bits: u32) -> Quiet {
        Quiet(bits & PVS_LAZY_ALL)
    }
}

/// The `lazy` array map, mmapped: one u64 of `enum pvs_lazy` bits per slot
/// (array map elements are 8-byte aligned: a u32 value would still take 8),
/// and which tracked thread holds which slot.
pub(crate) struct LazyCells {
    base: NonNull<AtomicU64>,
    slots: u32,
    bytes: usize,
    by_tid: HashMap<u32, u32>,
    free: Vec<u32>,
}

// SAFETY: the mapping is shared memory of u64 cells accessed only through
// AtomicU64; it is owned by this value and unmapped once, on drop.
unsafe impl Send for LazyCells {}

impl LazyCells {
    /// Maps `slots` cells of the BPF_F_MMAPABLE array `fd`.
    pub(crate) fn map(fd: RawFd, slots: u32) -> Result<LazyCells, EventSourceError> {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let bytes = (slots as usize * 8).div_ceil(page).max(1) * page;
        // SAFETY: a new shared mapping of a BPF_F_MMAPABLE array map's fd;
        // the kernel checks the length against the map. Nothing else aliases it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(EventSourceError::Io {
                what: "mmap of the lazy map".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        let base = NonNull::new(p.cast()).ok_or_else(|| {
            EventSourceError::Invalid("mmap of the lazy map returned NULL".into())
        })?;
        Ok(LazyCells {
            base,
            slots,
            bytes,
            by_tid: HashMap::new(),
            free: (0..slots).rev().collect(),
        })
    }

    fn store(&self, slot: u32, bits: u32) {
        if slot < self.slots {
            // SAFETY: slot < slots, and slots * 8 <= bytes are mapped.
            let cell = unsafe { &*self.base.as_ptr().add(slot as usize) };
            cell.store(u64::from(bits), Ordering::Relaxed);
        }
    }

    /// The slot of `tid` (a new one, every record waking, if it has none).
    pub(crate) fn slot_for(&mut self, tid: u32) -> Result<(u32, bool), EventSourceError> {
        if let Some(&s) = self.by_tid.get(&tid) {
            return Ok((s, false));
        }
        let s = self.free.pop().ok_or_else(|| {
            EventSourceError::Invalid(format!(
                "tid {tid}: all {} vCPU slots in use (bpf max_tracked)",
                self.slots
            ))
        })?;
        self.store(s, 0);
        Ok((s, true))
    }

    /// Records that `tid` holds `slot` (after the `tracked` map says so).
    pub(crate) fn bind(&mut self, tid: u32, slot: u32) {
        self.by_tid.insert(tid, slot);
    }

    /// Gives back a slot taken by [`LazyCells::slot_for`] but not bound.
    pub(crate) fn unbind_new(&mut self, slot: u32) {
        self.free.push(slot);
    }

    /// Frees `tid`'s slot, if any.
    pub(crate) fn release(&mut self, tid: u32) {
        if let Some(slot) = self.by_tid.remove(&tid) {
            self.store(slot, 0);
            self.free.push(slot);
        }
    }

    /// Sets which records of `tid` are quiet. A memory store, no syscall;
    /// unknown threads are ignored.
    pub(crate) fn set(&self, tid: u32, quiet: Quiet) {
        if let Some(&slot) = self.by_tid.get(&tid) {
            self.store(slot, quiet.bits());
        }
    }
}

impl Drop for LazyCells {
    fn drop(&mut self) {
        // SAFETY: our own mapping, of this length, unmapped only here.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wakeup by another vCPU onto a busy CPU: one that may start a boost.
    fn waking_on_busy_cpu() -> EventKind {
        EventKind::Waking {
            source: super::super::WakeSource::Vcpu,
            cpu_idle: false,
        }
    }

    fn ev(kind: EventKind) -> HostEvent {
        HostEvent {
            ts_ns: 1,
            tid: 2,
            vm: 0,
            vcpu: 0,
            kind,
            quiet: false,
            rivals: true,
            host_rivals: true,
        }
    }

    #[test]
    fn where_the_scheduler_decides_only_a_wakeup_that_may_carry_a_pending_hint_wakes_the_daemon() {
        let base = Quiet::for_vcpu(false, &VmLimits::default(), false, false, false);
        let one_vcpu = base.kernel_decides(false, false);
        let several = base.kernel_decides(true, false);
        let halt = EventKind::KvmExit {
            reason: super::super::KvmExitReason::Hlt,
        };

        for kind in [
            EventKind::SwitchOut { runnable: true },
            EventKind::SwitchOut { runnable: false },
            EventKind::SwitchIn { cpu: 0 },
            halt,
        ] {
            assert!(
                one_vcpu.covers(&ev(kind)) && several.covers(&ev(kind)),
                "{kind:?}"
            );
        }
        assert!(one_vcpu.covers(&ev(waking_on_busy_cpu())));
        assert!(!several.covers(&ev(waking_on_busy_cpu())));
        assert!(
            !one_vcpu.covers(&ev(EventKind::KvmIrq)),
            "an interrupt may start a boost the scheduler cannot see"
        );
    }

    #[test]
    fn where_the_scheduler_decides_a_waited_on_vcpus_preemption_does_not_wake_the_daemon() {
        // The rt backend: a lock wait naming the vCPU makes its preemption and
        // switch-in wake the daemon (it extends the holder after the fact).
        let limits = VmLimits {
            honor_lock_holders: true,
            ..VmLimits::default()
        };
        let rt = Quiet::for_vcpu(false, &limits, true, false, false);
        assert!(!rt.covers(&ev(EventKind::SwitchOut { runnable: true })));
        assert!(!rt.covers(&ev(EventKind::SwitchIn { cpu: 0 })));

        // sched_ext: the scheduler extends it at the preemption; the daemon
        // does nothing with either record.
        let scx = Quiet::for_vcpu(false, &limits, false, false, false).kernel_decides(false, false);
        assert!(scx.covers(&ev(EventKind::SwitchOut { runnable: true })));
        assert!(scx.covers(&ev(EventKind::SwitchIn { cpu: 0 })));

        // A host half showing the holder preempted to its waiters is ended at once.
        let shown = Quiet::for_vcpu(false, &limits, false, true, false).kernel_decides(false, true);
        assert!(!shown.covers(&ev(EventKind::SwitchIn { cpu: 0 })));
    }

    #[test]
    fn a_boosted_vcpu_wakes_the_daemon_for_nothing() {
        let q = Quiet::for_vcpu(true, &VmLimits::default(), false, false, false);

        assert!(q.covers(&ev(EventKind::SwitchOut { runnable: true })));
        assert!(q.covers(&ev(EventKind::Waking {
            source: super::super::WakeSource::Other,
            cpu_idle: false,
        })));
        assert!(q.covers(&ev(EventKind::KvmIrq)));
    }

    #[test]
    fn an_interrupt_for_a_vcpu_wakes_the_daemon_only_where_it_may_start_a_boost() {
        let irq = ev(EventKind::KvmIrq);
        let alone = HostEvent {
            rivals: false,
            host_rivals: false,
            ..irq
        };
        let peers = HostEvent {
            host_rivals: false,
            ..irq
        };
        let default = VmLimits::default();
        let no_irq_boost = VmLimits {
            proactive_irq: false,
            ..VmLimits::default()
        };
        let need_rt = VmLimits {
            speculative_boosts_need_rt_work: true,
            ..VmLimits::default()
        };

        let rt_work = Quiet::for_vcpu(false, &default, false, false, false);
        let no_rt_work = Quiet::for_vcpu(false, &default, false, false, true);

        // With rivals, or guest RT work lately, it may start a boost.
        assert!(!rt_work.covers(&irq) && !rt_work.covers(&alone));
        assert!(!no_rt_work.covers(&irq));
        // Against nobody, or only other served VMs, it would reorder the
        // VM's own threads: quiet (the IPIs between one VM's vCPUs).
        assert!(no_rt_work.covers(&alone) && no_rt_work.covers(&peers));
        assert!(no_rt_work.kernel_decides(true, false).covers(&alone));
        // No interrupt boosts at all, or none without RT work: quiet.
        assert!(Quiet::for_vcpu(false, &no_irq_boost, false, false, false).covers(&irq));
        assert!(Quiet::for_vcpu(false, &need_rt, false, false, true).covers(&irq));
        assert!(!Quiet::for_vcpu(false, &need_rt, false, false, false).covers(&irq));
    }

    #[test]
    fn an_unboosted_vcpu_wakes_it_for_preemptions_and_wakeups_that_may_start_a_boost() {
        let q = Quiet::for_vcpu(false, &VmLimits::default(), false, false, false);

        assert!(q.covers(&ev(EventKind::SwitchIn { cpu: 0 })));
        assert!(q.covers(&ev(EventKind::SwitchOut { runnable: false })));
        assert!(!q.covers(&ev(EventKind::SwitchOut { runnable: true })));
    }

    #[test]
    fn when_the_guest_is_ignored_preemptions_are_quiet_too() {
        let limits = VmLimits {
            honor_critical_sections: false,
            honor_guest_rt: false,
            honor_boost_request: false,
            honor_pending_hint: false,
            proactive_wake: false,
            ..VmLimits::default()
        };

        let q = Quiet::for_vcpu(false, &limits, false, false, false);

        assert!(q.covers(&ev(EventKind::SwitchOut { runnable: true })));
        assert!(q.covers(&ev(waking_on_busy_cpu())));
    }

    #[test]
    fn a_vcpu_a_lock_waiter_names_wakes_it_when_it_runs_or_is_preempted_even_boosted() {
        let on = VmLimits {
            honor_lock_holders: true,
            ..VmLimits::default()
        };
        for boosted in [false, true] {
            let q = Quiet::for_vcpu(boosted, &on, true, false, false);

            assert!(!q.covers(&ev(EventKind::SwitchIn { cpu: 0 })));
            assert!(!q.covers(&ev(EventKind::SwitchOut { runnable: true })));
            assert!(q.covers(&ev(EventKind::SwitchOut { runnable: false })));
        }
        let off = VmLimits {
            honor_lock_holders: false,
            ..VmLimits::default()
        };
        assert!(Quiet::for_vcpu(true, &off, true, false, false)
            .covers(&ev(EventKind::SwitchIn { cpu: 0 })));
    }

    #[test]
    fn without_recent_rt_work_preemptions_and_wakeups_with_no_rival_are_quiet() {
        let waking = waking_on_busy_cpu();
        let alone = |kind| HostEvent {
            rivals: false,
            host_rivals: false,
            ..ev(kind)
        };
        let off = VmLimits {
            boost_only_against_rivals: false,
            ..VmLimits::default()
        };

        let q = Quiet::for_vcpu(false, &VmLimits::default(), false, false, true);
        let rt_work = Quiet::for_vcpu(false, &VmLimits::default(), false, false, false);
        let rule_off = Quiet::for_vcpu(false, &off, false, false, true);

        assert!(q.covers(&alone(EventKind::SwitchOut { runnable: true })));
        assert!(q.covers(&alone(waking)));
        assert!(!q.covers(&ev(EventKind::SwitchOut { runnable: true })));
        assert!(!q.covers(&ev(waking)));
        assert!(!rt_work.covers(&alone(EventKind::SwitchOut { runnable: true })));
        assert!(!rule_off.covers(&alone(waking)));
    }

    #[test]
    fn without_recent_rt_work_preemptions_and_wakeups_with_only_served_vms_as_rivals_are_quiet_unless_they_count(
    ) {
        let waking = waking_on_busy_cpu();
        let peers = |kind| HostEvent {
            host_rivals: false,
            ..ev(kind)
        };
        let counted = VmLimits {
            peer_vms_are_rivals: true,
            ..VmLimits::default()
        };

        let q = Quiet::for_vcpu(false, &VmLimits::default(), false, false, true);
        let rt_work = Quiet::for_vcpu(false, &VmLimits::default(), false, false, false);
        let peers_count = Quiet::for_vcpu(false, &counted, false, false, true);

        assert!(q.covers(&peers(EventKind::SwitchOut { runnable: true })));
        assert!(q.covers(&peers(waking)));
        assert!(!q.covers(&ev(waking)));
        assert!(!rt_work.covers(&peers(waking)));
        assert!(!peers_count.covers(&peers(EventKind::SwitchOut { runnable: true })));
        assert!(!peers_count.covers(&peers(waking)));
    }

    #[test]
    fn when_speculative_boosts_need_rt_work_a_vm_without_it_is_quiet_on_preemption_and_wakeup_even_with_rivals(
    ) {
        let waking = waking_on_busy_cpu();
        let limits = VmLimits {
            speculative_boosts_need_rt_work: true,
            ..VmLimits::default()
        };

        let q = Quiet::for_vcpu(false, &limits, false, false, true);
        let rt_work = Quiet::for_vcpu(false, &limits, false, false, false);
        let waited_on = Quiet::for_vcpu(
            false,
            &VmLimits {
                honor_lock_holders: true,
                ..limits.clone()
            },
            true,
            false,
            true,
        );

        assert!(q.covers(&ev(EventKind::SwitchOut { runnable: true })));
        assert!(q.covers(&ev(waking)));
        assert!(!rt_work.covers(&ev(EventKind::SwitchOut { runnable: true })));
        assert!(!rt_work.covers(&ev(waking)));
        assert!(!waited_on.covers(&ev(EventKind::SwitchOut { runnable: true })));
    }

    #[test]
    fn the_switch_in_of_a_vcpu_shown_preempted_to_a_lock_waiting_guest_wakes_it() {
        let q = Quiet::for_vcpu(false, &VmLimits::default(), false, true, false);

        assert!(!q.covers(&ev(EventKind::SwitchIn { cpu: 0 })));
        assert!(q.covers(&ev(EventKind::SwitchOut { runnable: false })));
    }
}
