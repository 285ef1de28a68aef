//! Boosts a host scheduler decides itself (the sched_ext backend): the terms the policy
//! gives it per vCPU, and the charge of what it reports to have spent. The policy stays
//! the authority for the budget; the scheduler decides at the wakeup, within these terms.

use super::*;

/// What a host scheduler may decide for one vCPU without asking: boosts at `priority` (0:
/// none) when the vCPU's guest shows RT work, or when it wakes from a halt within
/// `halt_window_ns` of such work, for at most `allowance_ns` more boosted time until the
/// next grant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelGrant {
    pub priority: u8,
    pub allowance_ns: u64,
    pub halt_window_ns: u64,
}

impl VmState {
    /// Whether the host scheduler decides the boosts for the guest's RT work (an RT or
    /// deadline task, a boost request) and halt boosts itself, within [`KernelGrant`]s:
    /// then this policy leaves those reasons to it and decides the rest (pending hints,
    /// critical sections, proactive wakeups and interrupts, lock holders), still charging
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

    /// The terms for vCPU `vcpu` now. These boosts are for the guest's RT work (what the
    /// speculative reserve keeps budget for), so only a latched budget, a throttle, guest
    /// RT not honoured or no RT class allowed take them away; a demoted vCPU gets priority
    /// 1. The allowance is the budget left, split evenly over the vCPUs (each spends from it
    /// until the next grant, so the VM cannot overdraw by more than a grant's interval).
    pub fn kernel_grant(&self, vcpu: u32) -> KernelGrant {
        let l = &self.limits;
        let Some(v) = self.vcpus.get(vcpu as usize) else {
            return KernelGrant::default();
        };
        let priority = match rt_params(l, l.boost_policy, l.boost_priority) {
            Some(p)
                if l.honor_guest_rt && !self.budget.latched() && v.throttled_until.is_none() =>
            {
                if v.demoted {
                    1
                } else {
                    p.rt_priority
                }
            }
            _ => 0,
        };
        let allowance_ns = if priority == 0 {
            0
        } else {
            self.budget.remaining_ns(&self.budget_rates) / u64::from(self.nr_vcpus().max(1))
        };
        KernelGrant {
            priority,
            allowance_ns,
            halt_window_ns: if l.proactive_halt { l.halt_boost_ns } else { 0 },
        }
    }

    /// Charges `ns` of boosted time the host scheduler took for vCPU `vcpu` by its own
    /// decisions (reported at `now`) to the VM's boost budget, which may latch; the next
    /// [`VmState::handle`] re-evaluates every vCPU if it did.
    pub fn charge_kernel_boost(&mut self, now: u64, vcpu: u32, ns: u64) {
        let Some(v) = self.vcpus.get_mut(vcpu as usize) else {
            self.stats.out_of_range_events += 1;
            return;
        };
        if ns == 0 {
            return;
        }
        v.stats.boosted_ns = v.stats.boosted_ns.saturating_add(ns);
        v.stats.kernel_boosted_ns = v.stats.kernel_boosted_ns.saturating_add(ns);
        self.stats.boosted_ns_total = self.stats.boosted_ns_total.saturating_add(ns);
        self.stats.kernel_boosted_ns_total = self.stats.kernel_boosted_ns_total.saturating_add(ns);
        if now > self.now {
            self.advance(now);
        }
        let was_latched = self.budget.latched();
        self.budget.spend(&self.budget_rates, ns);
        if !was_latched && self.budget.latched() {
            self.stats.budget_latches += 1;
            self.reeval_all = true;
        }
    }
}
