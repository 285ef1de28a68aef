//! What the policy counts, per vCPU and per VM, and the host's view of a vCPU thread.

use super::*;

/// What the host last saw a vCPU thread do (host-half `status`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RunStatus {
    /// No scheduler event seen yet.
    #[default]
    Unknown,
    /// Switched in.
    Running,
    /// Runnable but not running (preempted, or woken and not yet switched in).
    Preempted,
    /// Blocked: the guest halted.
    Halted,
}

impl RunStatus {
    /// Whether the thread may be on a CPU: switched in, or no event seen yet (assumed
    /// running, so an unknown vCPU is charged rather than free).
    pub const fn on_cpu(self) -> bool {
        matches!(self, RunStatus::Running | RunStatus::Unknown)
    }

    /// `PVSCHED_HS_*`.
    pub const fn abi(self) -> u32 {
        match self {
            RunStatus::Unknown => abi::HS_UNKNOWN,
            RunStatus::Running => abi::HS_RUNNING,
            RunStatus::Preempted => abi::HS_PREEMPTED,
            RunStatus::Halted => abi::HS_HALTED,
        }
    }
}

/// Counters of one vCPU, as of the last event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuStats {
    pub status: RunStatus,
    /// Transitions from unboosted to boosted.
    pub boosts: u64,
    /// Throttles applied.
    pub throttles: u64,
    /// Times seen preempted while runnable.
    pub preemptions: u64,
    /// Proactive boosts started (or extended).
    pub proactive_boosts: u64,
    /// Decisions emitted.
    pub decisions: u64,
    /// Guest-half fields clamped or ignored.
    pub clamped_inputs: u64,
    /// Time boosted and not halted (the time charged to the VM's boost budget), ns.
    pub boosted_ns: u64,
    /// Of that, time boosted for a critical section (charged to this vCPU's critical-section
    /// budget too), ns.
    pub cs_boosted_ns: u64,
    /// Critical-section budget left, ns (rounded down; 0 while latched).
    pub cs_budget_ns: u64,
    /// Critical-section time to earn back before the latch clears, ns (rounded up; 0 when
    /// not latched).
    pub cs_debt_ns: u64,
    /// Critical-section boosts are refused: the budget ran dry and is not repaid yet.
    pub cs_latched: bool,
    /// Times a wanted boost was refused (or ended) for want of budget.
    pub over_budget: u64,
    /// `boosted_ns` split by the reason of the boost in force, by [`Reason::index`]
    /// (where the boost budget goes).
    pub boosted_ns_by_reason: [u64; Reason::COUNT],
    /// Of `boosted_ns`, time the host scheduler boosted by its own decisions
    /// ([`VmState::charge_kernel_boost`]), ns.
    pub kernel_boosted_ns: u64,
    /// Of `boosted_ns`, the time demoted (charged `demoted_charge` times), ns.
    pub demoted_ns: u64,
}

/// Counters of one VM, as of the last event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmStats {
    pub nr_vcpus: u32,
    /// vCPUs currently charged to the budget (boosted and not halted).
    pub boosted_vcpus: u32,
    pub boosts_total: u64,
    pub throttles_total: u64,
    pub proactive_boosts_total: u64,
    pub decisions_total: u64,
    /// Guest-half fields clamped or ignored, all vCPUs.
    pub clamped_inputs_total: u64,
    /// Events naming a vCPU index the VM does not have (ignored).
    pub out_of_range_events: u64,
    /// Events whose `now` was earlier than a previous one (handled at the previous `now`).
    pub time_regressions: u64,
    /// Boosted, non-halted vCPU time, ns, all vCPUs.
    pub boosted_ns_total: u64,
    /// Boost budget to earn back before its latch clears, ns (rounded up; 0 when not latched).
    pub debt_ns: u64,
    /// Boost budget left, ns (rounded down; 0 while latched).
    pub budget_ns: u64,
    /// The boost budget is latched: no vCPU of the VM is boosted until `debt_ns` is repaid.
    pub in_debt: bool,
    /// Time boosted for a critical section, ns, all vCPUs.
    pub cs_boosted_ns_total: u64,
    /// Critical-section budget left, ns, summed over the vCPUs.
    pub cs_budget_ns: u64,
    /// Critical-section debt, ns, summed over the vCPUs.
    pub cs_debt_ns: u64,
    /// vCPUs whose critical-section budget is latched.
    pub cs_latched_vcpus: u32,
    /// Wanted boosts refused (or ended) for want of budget, all vCPUs.
    pub over_budget_total: u64,
    /// `boosted_ns_total` split by the reason of the boost in force, by [`Reason::index`].
    pub boosted_ns_by_reason: [u64; Reason::COUNT],
    /// Of `boosted_ns_total`, the host scheduler's own boosts, ns, all vCPUs.
    pub kernel_boosted_ns_total: u64,
    /// Of `boosted_ns_total`, the time of demoted vCPUs, ns, all vCPUs.
    pub demoted_ns_total: u64,
    /// Times the boost budget latched, and the time it stayed latched, ns (up to the last
    /// event).
    pub budget_latches: u64,
    pub budget_latched_ns: u64,
    /// Lock contentions the guest counted (its counters as last read, summed).
    pub lock_contentions: u64,
    /// Of those, the ones whose holder's vCPU it saw preempted (guest counters).
    pub lock_holder_preempted: u64,
    /// Lock-holder extensions granted, refused (lock debt at its cap), and cut short by the
    /// vCPU running again (a preemption avoided).
    pub lock_extensions: u64,
    /// Of the extensions, those granted at the preemption (a wait named the vCPU already).
    pub lock_extensions_at_preemption: u64,
    pub lock_extensions_refused: u64,
    pub lock_preemptions_avoided: u64,
    /// Extension time on a CPU, ns; of it repaid, ns; not repaid yet, ns.
    pub lock_extended_ns: u64,
    pub lock_repaid_ns: u64,
    pub lock_debt_ns: u64,
    pub overloaded: bool,
    /// Latest `now` seen.
    pub now: u64,
    /// Events handled, by [`EventKind::index`].
    pub events: [u64; EventKind::COUNT],
}

impl VmStats {
    /// Events of one kind handled so far.
    pub fn events_of(&self, kind: EventKind) -> u64 {
        self.events[kind.index()]
    }
}

impl VmState {
    /// Counters of `vcpu` as of the last event.
    pub fn vcpu_stats(&self, vcpu: u32) -> Option<VcpuStats> {
        let v = self.vcpus.get(vcpu as usize)?;
        let mut s = v.stats;
        s.status = v.status;
        s.boosted_ns = s.boosted_ns.saturating_add(charged_ns(v, self.now));
        s.cs_boosted_ns = s
            .cs_boosted_ns
            .saturating_add(since_ns(v.cs_charged_since, self.now));
        if let Some((kind, since)) = v.charged_kind {
            s.boosted_ns_by_reason[kind] =
                s.boosted_ns_by_reason[kind].saturating_add(self.now.saturating_sub(since));
        }
        s.demoted_ns = s
            .demoted_ns
            .saturating_add(since_ns(v.demoted_since, self.now));
        let p = self.cs_params();
        let cs = v.cs_at_time(&p, self.now);
        s.cs_budget_ns = cs.remaining_ns(&p);
        s.cs_debt_ns = cs.debt_ns(&p);
        s.cs_latched = cs.latched();
        Some(s)
    }

    /// Counters of the VM as of the last event.
    pub fn vm_stats(&self) -> VmStats {
        let mut s = self.stats;
        s.boosted_vcpus = self.charged;
        let p = self.budget_params();
        s.debt_ns = self.budget.debt_ns(&p);
        s.budget_ns = self.budget.remaining_ns(&p);
        s.in_debt = self.budget.latched();
        for i in 0..self.nr_vcpus() {
            if let Some(v) = self.vcpu_stats(i) {
                s.cs_boosted_ns_total = s.cs_boosted_ns_total.saturating_add(v.cs_boosted_ns);
                s.cs_budget_ns = s.cs_budget_ns.saturating_add(v.cs_budget_ns);
                s.cs_debt_ns = s.cs_debt_ns.saturating_add(v.cs_debt_ns);
                s.cs_latched_vcpus += u32::from(v.cs_latched);
                for (total, ns) in s
                    .boosted_ns_by_reason
                    .iter_mut()
                    .zip(v.boosted_ns_by_reason)
                {
                    *total = total.saturating_add(ns);
                }
                s.demoted_ns_total = s.demoted_ns_total.saturating_add(v.demoted_ns);
            }
        }
        for v in &self.vcpus {
            s.lock_contentions = s.lock_contentions.saturating_add(v.guest.lock_contended);
            s.lock_holder_preempted = s
                .lock_holder_preempted
                .saturating_add(v.guest.lock_preempted);
        }
        s.lock_extensions = self.locks.extensions;
        s.lock_extensions_at_preemption = self.locks.at_preemption;
        s.lock_extensions_refused = self.locks.refused;
        s.lock_preemptions_avoided = self.locks.avoided;
        s.lock_extended_ns = self.locks.extended_ns();
        s.lock_repaid_ns = self.locks.repaid_ns();
        s.lock_debt_ns = self.locks.debt_ns();
        s.overloaded = self.overloaded;
        s.now = self.now;
        s
    }
}
