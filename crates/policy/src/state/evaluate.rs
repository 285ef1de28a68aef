//! The choice of a vCPU's params at an evaluation: guest and proactive reasons, the
//! strongest of them, throttles and budgets, and the unboosted params.

use super::*;

impl VmState {
    /// Recomputes the target of vCPU `i` at `now`; pushes a decision if it changed.
    pub(super) fn evaluate(&mut self, i: usize, now: u64, out: &mut Decisions) {
        let waited_on = self.wanted_by_waiters(i);
        let limits = &self.limits;
        let in_debt = self.budget.latched();
        let reserve_held = limits.speculative_reserve_permille > 0
            && self
                .budget
                .below(&self.budget_rates, limits.speculative_reserve_permille);
        let lock_debt = self.locks.in_debt();
        let cs = self.cs_rates;
        let vm_rt = recent(limits, self.last_rt, now);
        let kernel_rt = self.kernel_rt;
        let v = &mut self.vcpus[i];

        if v.proactive.is_some_and(|p| now >= p.until) {
            v.proactive = None;
        }
        if v.lock_ext.is_some_and(|e| now >= e.until || !waited_on) {
            v.lock_ext = None;
        }
        if v.throttled_until.is_some_and(|t| now >= t) {
            v.throttled_until = None;
        }

        account_burst(v, now);
        if v.boost_start.is_some() && v.burst_ns >= limits.demote_after_ns {
            v.demoted = true;
        }
        v.advance_cs(&cs, now);

        let mut boost = if v.throttled_until.is_some() {
            None
        } else {
            best_boost(limits, v, vm_rt, kernel_rt, true, true)
        };
        // Budgets: a latched boost budget refuses every boost; a latched critical-section
        // budget refuses the critical section, and the next-strongest reason may stand.
        let mut over_budget = false;
        if let Some((_, reason)) = &boost {
            if in_debt {
                boost = None;
                over_budget = true;
            } else if matches!(reason, Reason::CriticalSection(_)) && v.cs.latched() {
                boost = best_boost(limits, v, vm_rt, kernel_rt, false, true);
                over_budget = boost.is_none();
            }
        }
        // Below the reserve, only the guest's RT work may draw on the budget.
        if reserve_held && boost.as_ref().is_some_and(|(_, r)| speculative(*r)) {
            boost = best_boost(limits, v, vm_rt, kernel_rt, false, false);
            over_budget = boost.is_none();
        }
        if boost.is_some() && v.boost_start.is_some() && v.burst_ns >= limits.max_boost_ns {
            v.throttled_until = Some(now.saturating_add(limits.throttle_ns));
            v.stats.throttles += 1;
            self.stats.throttles_total += 1;
            // The throttle repays the burst.
            v.burst_ns = 0;
            boost = None;
        }
        let throttled = v.throttled_until.is_some() || over_budget;
        // A long burst yields to every fresh boost: bottom of the RT range, until repaid.
        if let Some((params, _)) = boost.as_mut() {
            if v.demoted {
                params.rt_priority = 1;
            }
        }

        // The fair-class nice the vCPU would have; lock debt is repaid by running above it.
        let mut base_nice = None;
        let (params, reason) = match boost {
            Some(c) => c,
            None => {
                let (mut params, mut reason) = cfs_params(limits, &v.guest);
                base_nice = Some(params.nice);
                if in_debt && limits.latch_nice > params.nice {
                    params.nice = limits.latch_nice;
                    reason = Reason::Debt;
                } else if lock_debt && limits.debt_nice > params.nice {
                    params.nice = limits.debt_nice;
                    reason = Reason::LockDebt;
                }
                if v.throttled_until.is_some() {
                    reason = Reason::Throttled;
                } else if over_budget {
                    reason = Reason::OverBudget;
                }
                (params, reason)
            }
        };

        let is_rt = params.is_rt();
        match (is_rt, v.boost_start) {
            (true, None) => {
                v.boost_start = Some(now);
                v.stats.boosts += 1;
                self.stats.boosts_total += 1;
            }
            (false, Some(_)) => v.boost_start = None,
            _ => {}
        }

        // The budget pays for CPU time taken at RT: a boosted vCPU waiting for a CPU (behind
        // the host's RT tasks or another VM's boost at the same priority) is not charged, or
        // a well-behaved guest stuck behind a rogue would spend its budget waiting.
        let charge = is_rt && v.status.on_cpu();
        match (charge, v.charged_since) {
            (true, None) => {
                v.charged_since = Some(now);
                self.charged += 1;
            }
            (false, Some(since)) => {
                v.stats.boosted_ns = v.stats.boosted_ns.saturating_add(now - since);
                v.charged_since = None;
                self.charged -= 1;
            }
            _ => {}
        }
        let kind = charge.then(|| reason.index());
        if v.charged_kind.map(|(k, _)| k) != kind {
            if let Some((k, since)) = v.charged_kind {
                v.stats.boosted_ns_by_reason[k] =
                    v.stats.boosted_ns_by_reason[k].saturating_add(now - since);
            }
            v.charged_kind = kind.map(|k| (k, now));
        }
        // A demoted vCPU's boosted time costs `demoted_charge` times as much budget.
        let weight = match (charge, v.demoted) {
            (false, _) => 0,
            (true, false) => 1,
            (true, true) => limits.demoted_charge,
        };
        self.charge_units = self.charge_units - v.charge_weight + weight;
        v.charge_weight = weight;
        match (charge && v.demoted, v.demoted_since) {
            (true, None) => v.demoted_since = Some(now),
            (false, Some(since)) => {
                v.stats.demoted_ns = v.stats.demoted_ns.saturating_add(now - since);
                v.demoted_since = None;
            }
            _ => {}
        }
        // Lock debt: an extension on a CPU adds to it, an unboosted vCPU on a CPU above its
        // nice while the VM owes repays it (crate::locks).
        let lock_charging = charge && reason == Reason::LockHolder;
        let repay = match base_nice {
            Some(base) if lock_debt && v.status.on_cpu() => {
                locks::repay_permille(base, params.nice)
            }
            _ => 0,
        };
        if lock_charging != v.lock_charging || repay != v.repay_permille {
            let charging =
                self.locks.charging() - u32::from(v.lock_charging) + u32::from(lock_charging);
            let repaying = self.locks.repaying_permille() - v.repay_permille + repay;
            self.locks.set_rates(charging, repaying);
            v.lock_charging = lock_charging;
            v.repay_permille = repay;
        }
        // The critical-section budget is charged by the reason in force, which may change
        // under the same params (a guest RT task taking over from a critical section).
        let cs_charge = charge && matches!(reason, Reason::CriticalSection(_));
        match (cs_charge, v.cs_charged_since) {
            (true, None) => v.cs_charged_since = Some(now),
            (false, Some(since)) => {
                v.stats.cs_boosted_ns = v.stats.cs_boosted_ns.saturating_add(now - since);
                v.cs_charged_since = None;
            }
            _ => {}
        }

        if reason == Reason::OverBudget && v.target.reason != Reason::OverBudget {
            v.stats.over_budget += 1;
            self.stats.over_budget_total += 1;
        }
        let changed = params != v.target.params
            || !reason.same_kind(&v.target.reason)
            || (params.is_rt() && vm_rt != v.target.rt_work);
        // The latch may raise an unboosted vCPU's nice to latch_nice, lock debt to debt_nice.
        let in_debt = in_debt || lock_debt;
        v.target.reason = reason;
        v.target.throttled = throttled;
        v.target.in_debt = in_debt;
        v.target.rt_work = vm_rt;
        if changed {
            v.target.params = params;
            v.target.since = now;
            v.stats.decisions += 1;
            self.stats.decisions_total += 1;
            out.push(Decision {
                vcpu: i as u32,
                params,
                reason,
                throttled,
                in_debt,
                rt_work: vm_rt,
            });
        }
    }
}

/// Whether a lock-holder extension may start: with `boost_only_against_rivals`, only while
/// something outside the VM competes (another served VM counts: an extension is repaid)
/// or the VM ran guest RT work recently (`vm_rt`). Reordering the VM's own threads is what
/// that work needs: its vCPU ahead of its siblings, and the siblings that take its timers
/// and send it IPIs boosted too. A VM without it only loses to the stacking its boosts
/// cause.
pub(super) fn rivals_allow_extension(limits: &VmLimits, v: &Vcpu, vm_rt: bool) -> bool {
    !limits.boost_only_against_rivals || v.rivals > Rivals::None || vm_rt
}

/// Whether a speculative boost (a critical section, a proactive reason) may start: as for
/// an extension, except that other served VMs are rivals only with `peer_vms_are_rivals`
/// (they get the same boosts: see that limit), and with
/// `speculative_boosts_need_rt_work` only for a VM that ran guest RT work recently.
pub(super) fn speculation_allowed(limits: &VmLimits, v: &Vcpu, vm_rt: bool) -> bool {
    let least = if limits.peer_vms_are_rivals {
        Rivals::PeerVms
    } else {
        Rivals::Host
    };
    let rivals_ok = !limits.boost_only_against_rivals || v.rivals >= least || vm_rt;
    rivals_ok && (vm_rt || !limits.speculative_boosts_need_rt_work)
}

/// Whether guest RT work last seen at `last_rt` (see [`GuestView::shows_rt_work`]) is
/// within `halt_boost_ns` of `now`.
pub(super) fn recent(limits: &VmLimits, last_rt: Option<u64>, now: u64) -> bool {
    last_rt.is_some_and(|t| now.saturating_sub(t) <= limits.halt_boost_ns)
}

/// Whether a halting vCPU gets a halt boost: switched on and guest RT work seen on it
/// recently (which also spares it `boost_only_against_rivals`).
pub(super) fn halt_boost_due(limits: &VmLimits, v: &Vcpu, now: u64) -> bool {
    limits.proactive_halt && recent(limits, v.last_rt, now)
}

pub(super) fn start_proactive(limits: &VmLimits, v: &mut Vcpu, now: u64, reason: Reason) {
    v.stats.proactive_boosts += 1;
    let length = if reason == Reason::ProactiveHalt {
        limits.halt_boost_ns
    } else {
        limits.proactive_boost_ns
    };
    let until = now.saturating_add(length);
    let seq = v.guest.speaks().then_some(v.guest.seq);
    let (mut class, mut priority) = (limits.boost_policy, limits.boost_priority);
    let t = v.target.params;
    if reason == Reason::ProactiveHalt && t.is_rt() && t.rt_priority > priority {
        (class, priority) = (t.policy, t.rt_priority);
    }
    v.proactive = Some(match v.proactive {
        // Extend a running boost; keep the guest seq it started from, and the
        // stronger of the two classes.
        Some(p) => Proactive {
            reason,
            until: until.max(p.until),
            seq: p.seq,
            class: if p.priority >= priority {
                p.class
            } else {
                class
            },
            priority: p.priority.max(priority),
        },
        None => Proactive {
            reason,
            until,
            seq,
            class,
            priority,
        },
    });
}

/// RT params for a boost of `wanted` class at `prio`, within the limits; `None` when no RT
/// class is allowed.
pub(super) fn rt_params(limits: &VmLimits, wanted: HostPolicy, prio: u8) -> Option<SchedParams> {
    let policy = limits.rt_policy(wanted)?;
    Some(SchedParams {
        policy,
        rt_priority: limits.cap_prio(prio),
        nice: limits.clamp_nice(0),
    })
}

/// Offers a candidate: replaces `best` only with a strictly higher priority, so among equal
/// priorities the earlier-offered (stronger) reason wins.
pub(super) fn offer(best: &mut Option<Candidate>, cand: Option<SchedParams>, reason: Reason) {
    if let Some(params) = cand {
        let stronger = match best {
            Some((b, _)) => params.rt_priority > b.rt_priority,
            None => true,
        };
        if stronger {
            *best = Some((params, reason));
        }
    }
}

pub(super) fn host_rt(policy: GuestPolicy) -> HostPolicy {
    match policy {
        GuestPolicy::Rr => HostPolicy::Rr,
        _ => HostPolicy::Fifo,
    }
}

/// The strongest boost the guest itself asks for, if any. Order of strength on equal
/// priority: critical section, deadline task, RT task, pending hint, boost request.
pub(super) fn best_guest(limits: &VmLimits, g: &GuestView, allow_cs: bool) -> Option<Candidate> {
    if !g.speaks() {
        return None;
    }
    let mut best = None;
    let boost = || rt_params(limits, limits.boost_policy, limits.boost_priority);
    if allow_cs && limits.honor_critical_sections && g.cs_flags != 0 {
        offer(&mut best, boost(), Reason::CriticalSection(g.cs_flags));
    }
    if !g.idle && limits.honor_guest_rt {
        if g.policy == GuestPolicy::Deadline {
            let p = rt_params(limits, HostPolicy::Fifo, limits.deadline_priority);
            offer(&mut best, p, Reason::GuestDeadline);
        } else if g.policy.is_rt() {
            let p = rt_params(limits, host_rt(g.policy), g.rt_priority);
            let reason = Reason::GuestRt {
                policy: g.policy.abi(),
                priority: g.rt_priority,
            };
            offer(&mut best, p, reason);
        }
    }
    if limits.honor_pending_hint {
        if let Some(h) = g.pending {
            let p = if h.policy == GuestPolicy::Deadline {
                rt_params(limits, HostPolicy::Fifo, limits.deadline_priority)
            } else {
                rt_params(limits, host_rt(h.policy), h.rt_priority)
            };
            offer(&mut best, p, Reason::PendingHint);
        }
    }
    if !g.idle && limits.honor_boost_request && g.boost_req {
        offer(&mut best, boost(), Reason::BoostRequest);
    }
    best
}

/// A reason that boosts on a guess rather than on the guest's RT work: refused below the
/// boost budget's reserve (`speculative_reserve_permille`).
fn speculative(r: Reason) -> bool {
    matches!(
        r,
        Reason::CriticalSection(_)
            | Reason::ProactiveWake
            | Reason::ProactiveIrq
            | Reason::LockHolder
    )
}

/// The strongest boost for a vCPU: the guest's reasons, then a running proactive boost
/// (if its switch is still on). `cs_ok` false leaves critical sections out (their budget is
/// spent); `speculative_ok` false every speculative reason (the boost budget's reserve for
/// the guest's RT work is reached: `speculative_reserve_permille`).
pub(super) fn best_boost(
    limits: &VmLimits,
    v: &Vcpu,
    vm_rt: bool,
    kernel_rt: bool,
    cs_ok: bool,
    speculative_ok: bool,
) -> Option<Candidate> {
    let cs_ok = cs_ok && speculative_ok;
    // A critical section starts a boost only when the vCPU is not running on the host
    // (preempted, waking, or not seen yet): a running vCPU needs no CPU, and its critical
    // sections last microseconds, shorter than any reaction. Nor, in a VM without recent
    // RT work, while nothing outside the VM competes (`boost_only_against_rivals`). A boost it already has is kept while the
    // flags stay set.
    let kept = matches!(v.target.reason, Reason::CriticalSection(_));
    // The host scheduler decides critical sections itself (VmState::set_kernel_decides_rt).
    let allow_cs = cs_ok
        && !kernel_rt
        && (kept || (v.status != RunStatus::Running && speculation_allowed(limits, v, vm_rt)));
    let mut best = best_guest(limits, &v.guest, allow_cs);
    // The host scheduler decides these itself (VmState::set_kernel_decides_rt).
    if kernel_rt
        && best.as_ref().is_some_and(|(_, r)| {
            matches!(
                r,
                Reason::GuestRt { .. } | Reason::GuestDeadline | Reason::BoostRequest
            )
        })
    {
        let without_rt = GuestView {
            policy: GuestPolicy::Normal,
            rt_priority: 0,
            boost_req: false,
            ..v.guest
        };
        best = best_guest(limits, &without_rt, allow_cs);
    }
    if speculative_ok && limits.honor_lock_holders && v.lock_ext.is_some() {
        let params = rt_params(limits, limits.boost_policy, limits.boost_priority);
        offer(&mut best, params, Reason::LockHolder);
    }
    if let Some(p) = v.proactive {
        let enabled = match p.reason {
            Reason::ProactiveWake => speculative_ok && limits.proactive_wake && !kernel_rt,
            Reason::ProactiveIrq => speculative_ok && limits.proactive_irq,
            Reason::ProactiveHalt => limits.proactive_halt && !kernel_rt,
            _ => false,
        };
        if enabled {
            let params = rt_params(limits, p.class, p.priority);
            offer(&mut best, params, p.reason);
        }
    }
    best
}

/// Unboosted params: the guest's CFS class and nice, inside the limits.
pub(super) fn cfs_params(limits: &VmLimits, g: &GuestView) -> (SchedParams, Reason) {
    let plain = SchedParams {
        policy: HostPolicy::Other,
        rt_priority: 0,
        nice: limits.clamp_nice(0),
    };
    if !g.speaks() || g.idle {
        return (plain, Reason::None);
    }
    let params = match g.policy {
        GuestPolicy::Normal => SchedParams {
            nice: limits.clamp_nice(g.nice),
            ..plain
        },
        GuestPolicy::Batch => SchedParams {
            policy: if limits.allowed.batch {
                HostPolicy::Batch
            } else {
                HostPolicy::Other
            },
            nice: limits.clamp_nice(g.nice),
            ..plain
        },
        GuestPolicy::Idle => SchedParams {
            policy: if limits.allowed.idle {
                HostPolicy::Idle
            } else {
                HostPolicy::Other
            },
            nice: limits.nice_max,
            ..plain
        },
        GuestPolicy::Fifo | GuestPolicy::Rr | GuestPolicy::Deadline => plain,
    };
    let reason = if params == plain {
        Reason::None
    } else {
        Reason::GuestNice
    };
    (params, reason)
}
