//! The EEVDF fair class, as Linux 6.18's `kernel/sched/fair.c` has it with its default features
//! (PLACE_LAG, PLACE_DEADLINE_INITIAL, PLACE_REL_DEADLINE, RUN_TO_PARITY, DELAY_DEQUEUE,
//! DELAY_ZERO on; NEXT_BUDDY off). The shared paths of `sched.rs` and `timer.rs` call in here when
//! `Host::eevdf` is set.
//!
//! **Entities.** Each fair thread has a vruntime `v` (advancing by `delta * 1024 / w`, exactly, as
//! in the CFS model), a weight `w`, a slice `r` = the base slice (`base_slice_ns` scaled by `1 +
//! ilog2(min(cpus, 8))`; no custom slices) and a virtual deadline `vd`. `vslice = r * 1024 / w`
//! (floored). A CPU's EEVDF queue holds its queued fair threads, delayed ones included (below);
//! its running fair thread (`curr`) is not in it, as in Linux's tree.
//!
//! **V and eligibility.** `V = floor(sum(w_i * v_i) / sum(w_i))` over the queue and curr (the
//! queue's `min_vruntime` when both are empty: `avg_vruntime`). A thread is eligible when `v <= V`,
//! tested exactly as `entity_eligible`: `sum(w_i * v_i) >= v * sum(w_i)`.
//!
//! **Pick** (`pick_eevdf`, protection on, as every real pick has it): if curr and the queue hold
//! one entity, it; else curr if it is eligible and protected (`v < vprot`); else the eligible
//! entity with the earliest `vd` (ties: the earlier queued), curr winning only with a strictly
//! earlier `vd`. A picked delayed thread is dequeued for good (lag clipped to <= 0, DELAY_ZERO) and
//! the pick repeats. A thread picked to run (not re-picked while running) gets `vprot = vd`: with
//! every slice equal, RUN_TO_PARITY protects it until its current slice ends.
//!
//! **Slice end** (`update_deadline`): once curr's `v >= vd`, `vd = v + vslice` and, if any other
//! entity is queued, a resched: the pick runs and curr keeps the CPU only if it wins (then without
//! protection: it is not picked anew). The crossing is an exact timer (Linux notices it at the
//! tick, 4 ms at HZ=250, or at the next scheduler event). Running alone, curr gets its new deadline
//! at the next accounting on its CPU (any event there), as Linux's `update_curr` does; no timer.
//! Also as `update_curr`: any accounting of an unprotected curr with another entity queued asks
//! for a resched (handled before the call returns). Linux also does that at every tick; the model
//! has no tick, so an unprotected curr that won the pick keeps the CPU until its next slice end
//! or the next event on its CPU.
//!
//! **Sleep** (`dequeue_entity` with DELAY_DEQUEUE): a thread that blocks while eligible leaves with
//! `vlag = clamp(V - v, +-limit)`, `limit = (r + TICK_NS) * 1024 / w` (6.18's `update_entity_lag`
//! with every slice equal). One that blocks while not eligible stays queued on its CPU, counted in
//! V, but not runnable: no balance or idle pull moves it, `nr_running` leaves it out; it leaves
//! when picked (lag 0 then), when woken (requeued in place on its CPU, no wake placement, as
//! `ttwu_runnable`: kept where it is if `V - v <= 0`, else placed anew with lag 0, then wakeup
//! preemption as for any wake), or when its class changes (any `set_class`; Linux keeps it queued
//! across a nice change) with `vlag = min(clamped V - v, 0)`.
//!
//! **Placement** (`place_entity`): a woken, migrated or class-changed thread joining a CPU gets
//! `v = V - vlag * (W + w) / W` (`W`: total weight there before it; lag 0 if `W = 0`), V and W
//! taken before it joins, so its lag is kept exactly. `vd = v + vslice`, `v + vslice / 2` on its
//! first wake (PLACE_DEADLINE_INITIAL, as a fork), or `v + rel` if it left by migration or class
//! change with `rel = vd - v` (PLACE_REL_DEADLINE). A lag and `rel` kept under another weight are
//! first scaled by `old_w / new_w` (`reweight_entity`).
//!
//! **Migration** (idle pull, balance) and **class changes** keep lag: the thread leaves with its
//! lag and relative deadline taken on the old CPU (after accounting its curr) and is placed with
//! them on the new one. A fair thread that becomes RT keeps them until it is fair again; a nice
//! change of a queued or running thread is a leave and a re-placement under the new weight; of a
//! blocked one, just the weight (the scaling happens at its next placement). A running thread that
//! becomes fair, or changes nice, gets fresh protection (`set_next_entity`), then the pick runs if
//! it became RT-to-fair, got lighter, or a resched was pending (it keeps the CPU while eligible).
//!
//! **Wakeup preemption** (`check_preempt_wakeup_fair`): a fair thread queued on a CPU running a
//! fair thread preempts it when the pick (curr included, protection on) is the wakee, or (a
//! resched pending from the accounting, as Linux's need_resched) when the pick is not curr. So a
//! protected, eligible curr is not preempted until its slice ends; an ineligible one loses
//! protection. (PREEMPT_SHORT never applies: all slices are equal.)
//!
//! **Not modelled.** The tick: Linux without HRTICK (off by default) notices a slice end only at
//! its next tick or scheduler event on that CPU, so with 6.18's slices (0.7-2.8 ms) below the
//! 4 ms tick, real CPU hogs sharing a CPU switch about every tick, not every slice as here.
//! Reschedules take effect at once (no lazy preemption). Also not: custom slices (PREEMPT_SHORT);
//! NEXT_BUDDY/yield buddies; cgroups; Linux's inverse-weight rounding of `calc_delta_fair`;
//! moving a delayed thread by the balance; the TTWU_QUEUE_DELAYED path (off by default).

use super::rq::bit;
use super::{Cpu, Host, Switch, ThreadState, Tid};

/// Linux's `TICK_NSEC` at HZ=250 (Debian's config and the benchmark host's), part of the lag
/// clamp.
pub(super) const TICK_NS: u64 = 4_000_000;

/// `calc_delta_fair`: `d` ns of a weight-`w` thread in virtual ns.
fn vdelta(d: u64, w: u64) -> i64 {
    (u128::from(d) * 1024 / u128::from(w)) as i64
}

/// A virtual-time span of a weight-`from` thread as the same service at weight `to`
/// (`div_s64(x * from, to)`).
fn rescale(x: i64, from: u64, to: u64) -> i64 {
    (i128::from(x) * i128::from(from) / i128::from(to)) as i64
}

impl Host {
    fn is_fair(&self, t: Tid) -> bool {
        self.threads[t as usize].class.rt_prio().is_none()
    }

    /// `c`'s running fair thread, if any.
    fn fair_curr_of(&self, c: Cpu) -> Option<Tid> {
        self.rqs[c as usize].curr.filter(|&t| self.is_fair(t))
    }

    /// Sum of weight * vruntime and of weight over `c`'s queue, and its running fair thread if
    /// `with_curr`.
    fn ev_sums(&self, c: Cpu, with_curr: bool) -> (i128, i128) {
        let rq = &self.rqs[c as usize];
        let (mut sum, mut load) = (rq.ev_sum, i128::from(rq.ev_load));
        if let Some(t) = self.fair_curr_of(c).filter(|_| with_curr) {
            let th = &self.threads[t as usize];
            sum += i128::from(th.weight) * i128::from(th.vr);
            load += i128::from(th.weight);
        }
        (sum, load)
    }

    /// `avg_vruntime`: V, floored; `min_vruntime` when nothing is queued or running.
    pub(super) fn avg_vr(&self, c: Cpu, with_curr: bool) -> i64 {
        let (sum, load) = self.ev_sums(c, with_curr);
        if load == 0 {
            self.rqs[c as usize].min_vr
        } else {
            sum.div_euclid(load) as i64
        }
    }

    /// `entity_eligible` for vruntime `v` on `c` (curr counted).
    fn eligible(&self, c: Cpu, v: i64) -> bool {
        let (sum, load) = self.ev_sums(c, true);
        sum >= i128::from(v) * load
    }

    /// `update_entity_lag` of `t`, counted in `c`'s V (queued there or its curr).
    fn entity_lag(&self, c: Cpu, t: Tid) -> i64 {
        let v = self.avg_vr(c, true);
        let th = &self.threads[t as usize];
        let limit = vdelta(self.slice + TICK_NS, th.weight);
        (v - th.vr).clamp(-limit, limit)
    }

    /// `t` leaves `c` by migration or a class change: keeps its lag and relative deadline.
    pub(super) fn ev_detach(&mut self, c: Cpu, t: Tid) {
        let lag = self.entity_lag(c, t);
        let th = &mut self.threads[t as usize];
        th.vlag = lag;
        th.lag_w = th.weight;
        th.rel_dl = Some(th.dl - th.vr);
    }

    /// `place_entity`: `t`, not yet counted on `c`, joins it (queued next, or as its curr).
    pub(super) fn ev_place(&mut self, c: Cpu, t: Tid, initial: bool) {
        let with_curr = self.rqs[c as usize].curr != Some(t);
        let (_, load) = self.ev_sums(c, with_curr);
        let v_avg = self.avg_vr(c, with_curr);
        let vslice = vdelta(self.slice, self.threads[t as usize].weight);
        let th = &mut self.threads[t as usize];
        let w = th.weight;
        if th.lag_w != w {
            // reweight_entity: lag and relative deadline are in units of the old weight.
            let old_w = th.lag_w;
            th.vlag = rescale(th.vlag, old_w, w);
            th.rel_dl = th.rel_dl.map(|r| rescale(r, old_w, w));
            th.lag_w = w;
        }
        let lag = if load > 0 {
            (i128::from(th.vlag) * (load + i128::from(w)) / load) as i64
        } else {
            0
        };
        th.vr = v_avg - lag;
        th.vr_rem = 0;
        th.dl = th.vr
            + match th.rel_dl.take() {
                Some(rel) => rel,
                None if initial => vslice / 2,
                None => vslice,
            };
    }

    /// `pick_eevdf` on `c` with protection, curr included; may return a delayed thread.
    fn ev_pick(&self, c: Cpu) -> Option<Tid> {
        let rq = &self.rqs[c as usize];
        let curr = self.fair_curr_of(c);
        match (curr, rq.ev.len()) {
            (None, 0) => return None,
            (Some(t), 0) => return Some(t),
            (None, 1) => return rq.ev.first().map(|e| e.2),
            _ => {}
        }
        let (sum, load) = self.ev_sums(c, true);
        let elig = |t: Tid| sum >= i128::from(self.threads[t as usize].vr) * load;
        let curr = curr.filter(|&t| elig(t));
        if let Some(t) = curr {
            let th = &self.threads[t as usize];
            if th.vr < th.vprot {
                return Some(t);
            }
        }
        let best = rq.ev.iter().find(|&&(_, _, t)| elig(t)).copied();
        match (curr, best) {
            (Some(t), Some((d, _, _))) if self.threads[t as usize].dl < d => Some(t),
            (_, Some((_, _, b))) => Some(b),
            (Some(t), None) => Some(t),
            // Some entity is always eligible; kept total for safety.
            (None, None) => rq.ev.first().map(|e| e.2),
        }
    }

    /// `ev_pick`, first dequeuing the delayed threads it picks (as `pick_next_entity`): the
    /// running or a runnable queued thread, or None.
    pub(super) fn ev_pick_settled(&mut self, c: Cpu) -> Option<Tid> {
        loop {
            let p = self.ev_pick(c)?;
            if !self.threads[p as usize].delayed {
                return Some(p);
            }
            self.ev_finish_delayed(c, p);
        }
    }

    /// A resched of `c`'s running fair thread: the pick runs; another winner preempts it.
    pub(super) fn ev_resched(&mut self, c: Cpu, out: &mut Vec<Switch>) {
        let cur = self.rqs[c as usize].curr;
        let p = self.ev_pick_settled(c);
        self.rqs[c as usize].resched = false;
        if p != cur {
            self.preempt_curr(c, out);
        }
    }

    /// `update_curr`'s EEVDF part for `c`'s running fair thread (called when it has run): a new
    /// deadline once its vruntime passes it, and a resched then or while it is unprotected, if
    /// anything else is queued.
    pub(super) fn ev_tick(&mut self, c: Cpu) {
        let Some(t) = self.fair_curr_of(c) else {
            return;
        };
        let slice = self.slice;
        let th = &mut self.threads[t as usize];
        let passed = th.vr >= th.dl;
        if passed {
            th.dl = th.vr + vdelta(slice, th.weight);
        }
        let unprotected = th.vr >= th.vprot;
        let rq = &mut self.rqs[c as usize];
        if (passed || unprotected) && !rq.ev.is_empty() {
            rq.resched = true;
        }
        self.dirty |= bit(c);
    }

    /// The time `c`'s running fair thread `t` reaches its deadline, or now if a resched is due.
    pub(super) fn ev_deadline(&self, c: Cpu, t: Tid) -> u64 {
        let rq = &self.rqs[c as usize];
        if rq.resched {
            return self.now;
        }
        if rq.ev.is_empty() {
            return u64::MAX;
        }
        let th = &self.threads[t as usize];
        // vr and vr_rem are as of curr_start.
        let to_go = th.dl - th.vr;
        if to_go <= 0 {
            return self.now;
        }
        let need = to_go as u128 * u128::from(th.weight) - u128::from(th.vr_rem);
        let dt = u64::try_from(need.div_ceil(1024)).unwrap_or(u64::MAX);
        rq.curr_start.saturating_add(dt).max(self.now)
    }

    /// `c`'s deadline fell due with fair `curr` running: slice end or a pending resched.
    pub(super) fn ev_cpu_deadline(&mut self, c: Cpu, out: &mut Vec<Switch>) {
        self.ev_tick(c);
        if self.rqs[c as usize].resched {
            self.ev_resched(c, out);
        }
    }

    /// `c`'s running fair thread `t` blocks (its run time accounted, still `curr`). Returns
    /// whether its dequeue is delayed (not eligible, DELAY_DEQUEUE); else its lag is kept.
    pub(super) fn ev_sleep(&mut self, c: Cpu, t: Tid) -> bool {
        if !self.eligible(c, self.threads[t as usize].vr) {
            return true;
        }
        let lag = self.entity_lag(c, t);
        let th = &mut self.threads[t as usize];
        th.vlag = lag;
        th.lag_w = th.weight;
        th.rel_dl = None;
        false
    }

    /// After `ev_sleep` said so and `t` left `c`'s CPU: `t` stays queued there, delayed.
    pub(super) fn ev_delay(&mut self, c: Cpu, t: Tid) {
        self.seq += 1;
        let th = &mut self.threads[t as usize];
        th.seq = self.seq;
        th.delayed = true;
        self.ev_insert(c, t);
    }

    /// The delayed `t` leaves `c`'s queue for good, its lag clipped to <= 0 (DELAY_ZERO).
    pub(super) fn ev_finish_delayed(&mut self, c: Cpu, t: Tid) {
        let lag = self.entity_lag(c, t).min(0);
        self.ev_remove(c, t);
        let th = &mut self.threads[t as usize];
        th.delayed = false;
        th.vlag = lag;
        th.lag_w = th.weight;
        th.rel_dl = None;
    }

    /// Wakes the delayed `t` in place on its CPU (`requeue_delayed_entity`), then checks
    /// preemption.
    pub(super) fn ev_wake_delayed(&mut self, t: Tid, out: &mut Vec<Switch>) {
        let c = self.threads[t as usize].cpu;
        self.update_curr(c);
        let lag = self.entity_lag(c, t);
        self.ev_remove(c, t);
        let th = &mut self.threads[t as usize];
        th.delayed = false;
        th.fresh = false;
        if lag > 0 {
            th.vlag = 0;
            th.lag_w = th.weight;
            th.rel_dl = None;
            self.ev_place(c, t, false);
            self.enqueue(c, t, false);
        } else {
            self.enqueue_seq(c, t, false, false);
        }
        debug_assert_eq!(self.threads[t as usize].state, ThreadState::Runnable(c));
        self.check_preempt(c, t, out);
    }

    /// Wakeup preemption of `c`'s running fair thread by the fair `t` just queued there
    /// (accounting done): whether to preempt.
    pub(super) fn ev_wakeup_preempts(&mut self, c: Cpu, t: Tid) -> bool {
        let cur = self.rqs[c as usize].curr;
        let pending = self.rqs[c as usize].resched;
        let p = self.ev_pick_settled(c);
        if pending {
            self.rqs[c as usize].resched = false;
            p != cur
        } else {
            p == Some(t)
        }
    }
}
