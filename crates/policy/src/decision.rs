//! What the engine outputs: scheduling parameters for a vCPU thread, and why.

use crate::limits::HostPolicy;

/// The scheduling parameters of one vCPU thread, as `sched_setattr` takes them.
///
/// `rt_priority` is 0 for the CFS classes and 1..=99 for FIFO/RR; `nice` is -20..=19 and
/// only matters for the CFS classes (the engine still keeps it inside the VM's limits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SchedParams {
    pub policy: HostPolicy,
    pub rt_priority: u8,
    pub nice: i8,
}

impl SchedParams {
    /// A plain host thread: `SCHED_OTHER`, nice 0. What a vCPU thread starts with.
    pub const NORMAL: SchedParams = SchedParams {
        policy: HostPolicy::Other,
        rt_priority: 0,
        nice: 0,
    };

    /// True when these params boost the thread (FIFO or RR).
    pub const fn is_rt(&self) -> bool {
        self.policy.is_rt()
    }
}

impl Default for SchedParams {
    fn default() -> Self {
        SchedParams::NORMAL
    }
}

/// Why a vCPU has the params it has. The strongest reason wins (see the crate docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Nothing to act on: plain params.
    None,
    /// The guest is in a kernel critical section; the payload is its `PVSCHED_CS_*` flags
    /// (only known bits).
    CriticalSection(u32),
    /// The guest runs an RT task: its (sanitized) guest policy and priority.
    GuestRt { policy: u32, priority: u8 },
    /// The guest runs a `SCHED_DEADLINE` task (mapped to FIFO at `deadline_priority`).
    GuestDeadline,
    /// The guest's running task asked for a boost (`GF_BOOST_REQ`).
    BoostRequest,
    /// An RT task is waiting to run on this vCPU (`guest_pending`).
    PendingHint,
    /// Proactive boost: the host woke the vCPU thread.
    ProactiveWake,
    /// Proactive boost: an interrupt was targeted at the vCPU.
    ProactiveIrq,
    /// Proactive boost: the vCPU halted.
    ProactiveHalt,
    /// Lock-holder extension: another vCPU's guest waits for a lock this vCPU holds (or,
    /// holder unknown, for one some other vCPU holds) and this vCPU was preempted.
    LockHolder,
    /// Boosted too long: held at CFS params until the throttle ends.
    Throttled,
    /// A boost was wanted, but the budget of its class is spent (the VM's boost budget, or
    /// this vCPU's critical-section budget for a critical section): held at CFS params until
    /// the debt is repaid.
    OverBudget,
    /// The VM's boost budget is latched: unboosted vCPU at `latch_nice` (when above its own).
    Debt,
    /// The VM is repaying lock-holder extensions: unboosted vCPU at `debt_nice`.
    LockDebt,
    /// The guest's CFS task has a nice or class (batch, idle) of its own.
    GuestNice,
}

impl Reason {
    /// Whether the host decided this boost from what it saw, not from what the guest shows
    /// now (a wakeup, an interrupt, a halt, a lock wait naming the vCPU): such a boost holds
    /// until the policy ends it, while a guest reason holds only while the slot shows it
    /// (the sched_ext scheduler checks that at each enqueue, `pvs_scx_boost_kind`).
    pub const fn is_proactive(&self) -> bool {
        matches!(
            self,
            Reason::ProactiveWake
                | Reason::ProactiveIrq
                | Reason::ProactiveHalt
                | Reason::LockHolder
        )
    }

    /// Short snake_case name, for metrics labels and traces.
    pub const fn name(&self) -> &'static str {
        Reason::NAMES[self.index()]
    }

    /// Number of kinds of reason ([`Reason::index`]).
    pub const COUNT: usize = 15;

    /// Every kind's [`Reason::name`], by [`Reason::index`].
    pub const NAMES: [&'static str; Reason::COUNT] = [
        "none",
        "critical_section",
        "guest_rt",
        "guest_deadline",
        "boost_request",
        "pending_hint",
        "proactive_wake",
        "proactive_irq",
        "proactive_halt",
        "lock_holder",
        "throttled",
        "over_budget",
        "debt",
        "lock_debt",
        "guest_nice",
    ];

    /// Dense index of the kind (payload ignored), `< COUNT`: for per-reason counters.
    pub const fn index(&self) -> usize {
        match self {
            Reason::None => 0,
            Reason::CriticalSection(_) => 1,
            Reason::GuestRt { .. } => 2,
            Reason::GuestDeadline => 3,
            Reason::BoostRequest => 4,
            Reason::PendingHint => 5,
            Reason::ProactiveWake => 6,
            Reason::ProactiveIrq => 7,
            Reason::ProactiveHalt => 8,
            Reason::LockHolder => 9,
            Reason::Throttled => 10,
            Reason::OverBudget => 11,
            Reason::Debt => 12,
            Reason::LockDebt => 13,
            Reason::GuestNice => 14,
        }
    }

    /// The kinds of reason that boost a vCPU (the others hold it at CFS params), by
    /// [`Reason::name`]. The guest's own reasons (its RT and deadline tasks, boost requests,
    /// pending hints) and the host's speculative ones (critical sections, proactive
    /// reasons, lock-holder extensions).
    pub const BOOSTING: [&'static str; 9] = [
        "guest_rt",
        "guest_deadline",
        "boost_request",
        "pending_hint",
        "critical_section",
        "proactive_wake",
        "proactive_irq",
        "proactive_halt",
        "lock_holder",
    ];

    /// The [`Reason::index`] of the kind named `name` ([`Reason::NAMES`]).
    pub fn index_of(name: &str) -> Option<usize> {
        Reason::NAMES.iter().position(|n| *n == name)
    }

    /// Same reason ignoring its payload. Decisions are emitted when the kind changes, not
    /// when e.g. only the set of critical-section flags does (that would be a syscall for
    /// nothing on every guest irq entry).
    pub(crate) fn same_kind(&self, other: &Reason) -> bool {
        core::mem::discriminant(self) == core::mem::discriminant(other)
    }
}

impl core::fmt::Display for Reason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the engine currently wants for one vCPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub params: SchedParams,
    /// The reason of the current params (payload refreshed on every evaluation).
    pub reason: Reason,
    /// `now` when `params` or the kind of `reason` last changed.
    pub since: u64,
    /// A boost is refused right now: `max_boost` throttle, or a wanted boost over budget.
    pub throttled: bool,
    /// The VM was repaying at the last evaluation of this vCPU: its boost budget latched,
    /// or lock-holder extensions owed (unboosted vCPUs then run at `latch_nice`,
    /// `debt_nice`).
    pub in_debt: bool,
    /// The VM ran guest RT work (an RT or deadline task, a pending hint naming one) within
    /// `halt_boost_ns` at the last evaluation of this vCPU. A boosted target whose VM
    /// starts or stops showing it is decided anew, so that a mechanism that carries the
    /// boosts of such VMs differently (pvschedd's `fair_boost_without_rt_work`) follows.
    pub rt_work: bool,
}

/// A change of target for one vCPU: apply `params` to its thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub vcpu: u32,
    pub params: SchedParams,
    pub reason: Reason,
    pub throttled: bool,
    pub in_debt: bool,
    /// See [`Target::rt_work`].
    pub rt_work: bool,
}

/// Reusable output buffer of [`crate::VmState::handle`]: the decisions of one event, in
/// vCPU order. Keep one around and pass it to every call; it only allocates when it has to
/// grow past its largest use so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decisions {
    items: Vec<Decision>,
}

impl Decisions {
    /// An empty buffer.
    pub fn new() -> Self {
        Decisions { items: Vec::new() }
    }

    /// An empty buffer that holds `n` decisions without allocating (use the VM's vCPU
    /// count: no event yields more than one decision per vCPU).
    pub fn with_capacity(n: usize) -> Self {
        Decisions {
            items: Vec::with_capacity(n),
        }
    }

    /// Forgets all decisions, keeps the memory.
    pub fn clear(&mut self) {
        self.items.clear();
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn as_slice(&self) -> &[Decision] {
        &self.items
    }

    pub fn iter(&self) -> core::slice::Iter<'_, Decision> {
        self.items.iter()
    }

    pub(crate) fn push(&mut self, d: Decision) {
        self.items.push(d);
    }

    /// Puts the decisions in vCPU order (stable: one decision per vCPU per event anyway).
    pub(crate) fn sort_by_vcpu(&mut self) {
        self.items.sort_by_key(|d| d.vcpu);
    }
}

impl core::ops::Deref for Decisions {
    type Target = [Decision];

    fn deref(&self) -> &[Decision] {
        &self.items
    }
}

impl<'a> IntoIterator for &'a Decisions {
    type Item = &'a Decision;
    type IntoIter = core::slice::Iter<'a, Decision>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_display_uses_short_snake_case_names() {
        assert_eq!(Reason::CriticalSection(2).to_string(), "critical_section");
        assert_eq!(
            Reason::GuestRt {
                policy: 1,
                priority: 5
            }
            .to_string(),
            "guest_rt"
        );
        assert_eq!(Reason::ProactiveIrq.to_string(), "proactive_irq");
        assert_eq!(Reason::OverBudget.to_string(), "over_budget");
    }

    #[test]
    fn every_reason_kind_has_its_own_index_and_name() {
        let all = [
            Reason::None,
            Reason::CriticalSection(1),
            Reason::GuestRt {
                policy: 1,
                priority: 2,
            },
            Reason::GuestDeadline,
            Reason::BoostRequest,
            Reason::PendingHint,
            Reason::ProactiveWake,
            Reason::ProactiveIrq,
            Reason::ProactiveHalt,
            Reason::LockHolder,
            Reason::Throttled,
            Reason::OverBudget,
            Reason::Debt,
            Reason::LockDebt,
            Reason::GuestNice,
        ];
        assert_eq!(all.len(), Reason::COUNT);
        for (i, r) in all.iter().enumerate() {
            assert_eq!(r.index(), i, "{r}");
            assert_eq!(Reason::NAMES[i], r.name());
        }
        assert_eq!(Reason::None.to_string(), "none");
    }

    #[test]
    fn normal_params_are_not_rt() {
        assert!(!SchedParams::NORMAL.is_rt());
        let rr = SchedParams {
            policy: HostPolicy::Rr,
            rt_priority: 8,
            nice: 0,
        };
        assert!(rr.is_rt());
    }
}
