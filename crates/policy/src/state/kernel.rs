//! Boosts a host scheduler decides itself (the sched_ext backend): the terms the policy
//! gives it per vCPU, and the charge of what it reports to have spent. The policy stays
//! the authority for the budgets; the scheduler decides at the enqueue, within these terms.

use super::*;

/// What a host scheduler may decide for one vCPU without asking, until the next grant:
/// boosts at `priority` (0: none) when the vCPU's guest shows RT work or wakes from a halt
/// within `halt_window_ns` of such work; with `critical_sections`, when it was preempted
/// in one; with `wakeups`, a boost of `wake_boost_ns` when it wakes onto a busy CPU; for at
/// most `allowance_ns` more boosted time. A burst of such boosts (boosted time not yet
/// matched by as much halted or unboosted time) longer than `demote_after_ns` runs at
/// priority 1, charged `demoted_charge` times, and one longer than `max_boost_ns` gets
/// none of them for `throttle_ns`: this policy's rules for its own boosts (0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelGrant {
    pub priority: u8,
    pub allowance_ns: u64,
    pub halt_window_ns: u64,
    pub critical_sections: bool,
    pub wakeups: bool,
    pub wake_boost_ns: u64,
    pub demote_after_ns: u64,
    pub max_boost_ns: u64,
    pub throttle_ns: u64,
}

impl VmState {
    /// Whether the host scheduler decides the boosts it can see coming itself, within
    /// [`KernelGrant`]s: the guest's RT work (an RT or deadline task, a boost request),
    /// halts after it, preemptions in a critical section and wakeups onto a busy CPU. Then
    /// this policy leaves those reasons to it and decides the rest (pending hints raised
    /// while a vCPU waits, interrupts for a waiting vCPU, lock holders), still charging
    /// every boost to one budget. Changing it re-evaluates every vCPU at the next event.
    pub fn set_kernel_decides_rt(&mut self, on: bool) {
        if self.kernel_rt != on {
            self.kernel_rt = on;
            self.reeval_all = true;
        }
    }

    /// See [`VmState::set_kernel_decides_rt`].
    pub fn kernel_decides_rt(&self) -> bool {
        self.kernel_rt
    }

    /// The terms for vCPU `vcpu` at `now`, as this policy would decide the same reasons:
    /// no boost while the VM's budget is latched, the vCPU throttled or guest RT not
    /// honoured (a demoted vCPU gets priority 1); the speculative ones (critical sections,
    /// wakeups) only above the budget's reserve, against rivals as
    /// `boost_only_against_rivals` says, and a critical section only while its own budget
    /// lasts. The allowance is the budget left, split over the vCPUs (each spends from it
    /// until the next grant, so the VM overdraws by at most one grant's interval).
    pub fn kernel_grant(&self, vcpu: u32, now: u64) -> KernelGrant {
        let l = &self.limits;
        let Some(v) = self.vcpus.get(vcpu as usize) else {
            return KernelGrant::default();
        };
        let priority = match rt_params(l, l.boost_policy, l.boost_priority) {
            Some(p)
                if l.honor_guest_rt
                    && !self.budget.latched()
                    && v.throttled_until.is_none_or(|t| now >= t) =>
            {
                if v.demoted {
                    1
                } else {
                    p.rt_priority
                }
            }
            _ => return KernelGrant::default(),
        };
        let reserve_held = l.speculative_reserve_permille > 0
            && self
                .budget
                .below(&self.budget_rates, l.speculative_reserve_permille);
        let speculative = !reserve_held && speculation_allowed(l, v, recent(l, self.last_rt, now));
        KernelGrant {
            priority,
            allowance_ns: self.budget.remaining_ns(&self.budget_rates)
                / u64::from(self.nr_vcpus().max(1)),
            halt_window_ns: if l.proactive_halt { l.halt_boost_ns } else { 0 },
            critical_sections: speculative
                && l.honor_critical_sections
                && !v.cs_at_time(&self.cs_rates, now).latched(),
            wakeups: speculative && l.proactive_wake,
            wake_boost_ns: l.proactive_boost_ns,
            demote_after_ns: l.demote_after_ns,
            max_boost_ns: l.max_boost_ns,
            throttle_ns: l.throttle_ns,
        }
    }

    /// Charges `ns` of boosted time the host scheduler took for vCPU `vcpu` by its own
    /// decisions (reported at `now`), `cs_ns` of it for critical sections and `demoted_ns`
    /// of it demoted (charged `demoted_charge` times), to the VM's boost budget and the
    /// vCPU's critical-section budget, either of which may latch; the next
    /// [`VmState::handle`] re-evaluates every vCPU if the boost budget did.
    pub fn charge_kernel_boost(
        &mut self,
        now: u64,
        vcpu: u32,
        ns: u64,
        cs_ns: u64,
        demoted_ns: u64,
    ) {
        if vcpu as usize >= self.vcpus.len() {
            self.stats.out_of_range_events += 1;
            return;
        }
        if ns == 0 && cs_ns == 0 {
            return;
        }
        if now > self.now {
            self.advance(now);
        }
        let cs_rates = self.cs_rates;
        let v = &mut self.vcpus[vcpu as usize];
        v.stats.boosted_ns = v.stats.boosted_ns.saturating_add(ns);
        v.stats.kernel_boosted_ns = v.stats.kernel_boosted_ns.saturating_add(ns);
        v.stats.cs_boosted_ns = v.stats.cs_boosted_ns.saturating_add(cs_ns);
        v.advance_cs(&cs_rates, now);
        v.cs.spend(&cs_rates, cs_ns);
        self.stats.boosted_ns_total = self.stats.boosted_ns_total.saturating_add(ns);
        self.stats.kernel_boosted_ns_total = self.stats.kernel_boosted_ns_total.saturating_add(ns);
        let was_latched = self.budget.latched();
        let extra = u64::from(self.limits.demoted_charge.saturating_sub(1))
            .saturating_mul(demoted_ns.min(ns));
        self.budget
            .spend(&self.budget_rates, ns.saturating_add(extra));
        if !was_latched && self.budget.latched() {
            self.stats.budget_latches += 1;
            self.reeval_all = true;
        }
    }
}
