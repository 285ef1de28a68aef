//! Wake, block, class changes, picking, preemption, placement, RT push/pull and the idle pull.

use super::rq::{bit, cpus_of, rr_first};
use super::{weight_of, Class, Cpu, Host, Switch, SwitchOut, ThreadState, Tid};
use std::cmp::Reverse;
use std::collections::BTreeSet;

impl Host {
    pub(super) fn do_wake(&mut self, t: Tid, waker: Option<Cpu>, out: &mut Vec<Switch>) {
        if self.threads[t as usize].delayed {
            self.ev_wake_delayed(t, out);
            return;
        }
        if self.on_scx(t) {
            self.scx_wake(t, out);
            return;
        }
        let th = &self.threads[t as usize];
        let prev = th.cpu;
        let c = match th.class.rt_prio() {
            Some(p) => self.select_rt(t, prev, p),
            None => self.select_fair(t, prev, waker),
        };
        self.update_curr(c);
        if self.eevdf && self.threads[t as usize].class.rt_prio().is_none() {
            let fresh = self.threads[t as usize].fresh;
            self.ev_place(c, t, fresh);
        } else if self.threads[t as usize].class.rt_prio().is_none() {
            let min = self.rqs[c as usize].min_vr;
            let th = &self.threads[t as usize];
            let vr = if th.fresh {
                min
            } else {
                let v = th.vr - self.rqs[prev as usize].min_vr + min;
                v.max(min - (self.latency / 2) as i64)
            };
            self.threads[t as usize].vr = vr;
        }
        self.threads[t as usize].fresh = false;
        self.enqueue(c, t, false);
        self.check_preempt(c, t, out);
    }

    pub(super) fn do_block(&mut self, c: Cpu, t: Tid, out: &mut Vec<Switch>) {
        self.update_curr(c);
        let rt = self.is_rt(t);
        if self.scx.on && !rt {
            self.scx_stopping(c, t, false);
        }
        let delay = self.eevdf && !rt && self.ev_sleep(c, t);
        self.rqs[c as usize].curr = None;
        self.threads[t as usize].state = ThreadState::Blocked;
        if delay {
            self.ev_delay(c, t);
        }
        self.schedule(c, Some((t, SwitchOut::Blocked)), rt, out);
    }

    pub(super) fn do_set_class(&mut self, t: Tid, class: Class, out: &mut Vec<Switch>) {
        let old = self.threads[t as usize].class;
        let c = self.threads[t as usize].cpu;
        let state = self.threads[t as usize].state;
        if self.threads[t as usize].delayed {
            self.update_curr(c);
            self.ev_finish_delayed(c, t);
        }
        if state != ThreadState::Blocked {
            self.update_curr(c);
        }
        let in_place = old.rt_prio().is_some() && old.rt_prio() == class.rt_prio();
        let queued = state == ThreadState::Runnable(c);
        let (was_fair, is_fair) = (old.rt_prio().is_none(), class.rt_prio().is_none());
        if self.eevdf && was_fair && state != ThreadState::Blocked {
            self.ev_detach(c, t);
        }
        if queued && !in_place {
            self.dequeue(c, t);
        }
        if !self.eevdf {
            self.convert_vr(t, old, class, state == ThreadState::Blocked);
        }
        let th = &mut self.threads[t as usize];
        th.class = class;
        th.weight = weight_of(class);
        match state {
            ThreadState::Blocked => {}
            ThreadState::Runnable(_) => {
                if !in_place {
                    if self.eevdf && is_fair {
                        self.ev_place(c, t, false);
                    }
                    // Linux requeues at the head when the priority is lowered.
                    self.enqueue(c, t, class.rank() < old.rank());
                }
                self.check_preempt(c, t, out);
                if class.rt_prio().is_some() {
                    self.push_rt(c, out);
                }
            }
            ThreadState::Running(_) => {
                if self.eevdf && is_fair {
                    // Put back and set as next again: placed anew, freshly protected.
                    self.ev_place(c, t, false);
                    let th = &mut self.threads[t as usize];
                    th.vprot = th.dl;
                }
                self.curr_class_changed(c);
                self.running_class_changed(c, t, old, class, out);
            }
        }
    }

    /// Moves `t`'s vruntime between the fair timeline and the relative form kept outside it.
    fn convert_vr(&mut self, t: Tid, old: Class, new: Class, sleeping: bool) {
        let th = &self.threads[t as usize];
        if th.fresh || old.rt_prio().is_some() == new.rt_prio().is_some() {
            return;
        }
        let min = self.rqs[th.cpu as usize].min_vr;
        let vr = if new.rt_prio().is_some() {
            let v = if sleeping {
                th.vr.max(min - (self.latency / 2) as i64)
            } else {
                th.vr
            };
            v - min
        } else {
            th.vr + min
        };
        self.threads[t as usize].vr = vr;
    }

    /// After the running thread `t` of `c` changed class from `old` to `new`.
    fn running_class_changed(
        &mut self,
        c: Cpu,
        t: Tid,
        old: Class,
        new: Class,
        out: &mut Vec<Switch>,
    ) {
        let rq = &self.rqs[c as usize];
        let rt_waiting = !rq.throttled && rq.rt_nr > 0;
        let vr = self.threads[t as usize].vr;
        let lowered = old.rt_prio().is_some() || weight_of(new) < weight_of(old);
        let resched = match new.rt_prio() {
            Some(p) => rq.throttled || rq.rt_highest().is_some_and(|q| q > p),
            None if self.eevdf => {
                // prio_changed/switched_to_fair's resched, or one pending from the accounting:
                // the pick runs (it keeps the freshly protected thread while eligible).
                let check = lowered || rq.resched;
                self.rqs[c as usize].resched = false;
                rt_waiting || (check && self.ev_pick_settled(c) != Some(t))
            }
            None => rt_waiting || (lowered && rq.tree.first().is_some_and(|&(v, _, _)| v <= vr)),
        };
        if resched {
            self.put_prev(c, new.rt_prio().is_some());
            self.schedule(
                c,
                Some((t, SwitchOut::Preempted)),
                old.rt_prio().is_some(),
                out,
            );
            return;
        }
        if old.rt_prio().is_some() && new.rt_prio().is_none() {
            // As switched_to_fair's resched: picked anew, a new slice.
            let th = &mut self.threads[t as usize];
            th.slice_exec0 = th.sum_exec;
        }
        if new.rank() < old.rank() && !self.rqs[c as usize].throttled {
            let local = self.rqs[c as usize].rt_highest().unwrap_or(0);
            let above = local.max(new.rt_prio().unwrap_or(0));
            if let Some(p) = self.pull_rt(c, above) {
                if u32::from(p) + 1 > new.rank() {
                    self.preempt_curr(c, out);
                }
            }
        }
    }

    /// `c`'s running thread is preempted: back on its queue (RT at the head), then pick.
    pub(super) fn preempt_curr(&mut self, c: Cpu, out: &mut Vec<Switch>) {
        self.update_curr(c);
        let Some(t) = self.rqs[c as usize].curr else {
            return;
        };
        let rt = self.is_rt(t);
        if self.scx.on && !rt {
            self.rqs[c as usize].curr = None;
            self.scx_preempted_by_rt(c, t, out);
        } else {
            self.put_prev(c, rt);
        }
        self.schedule(c, Some((t, SwitchOut::Preempted)), rt, out);
    }

    /// After `t` was queued on `c`: preempts `c`'s running thread if `t` should run instead.
    pub(super) fn check_preempt(&mut self, c: Cpu, t: Tid, out: &mut Vec<Switch>) {
        if self.on_scx(t) {
            // The sched_ext model decides its own preemptions.
            return;
        }
        let rq = &self.rqs[c as usize];
        let th = &self.threads[t as usize];
        let Some(cur) = rq.curr else {
            if !(rq.throttled && th.class.rt_prio().is_some()) {
                self.schedule(c, None, false, out);
            }
            return;
        };
        let cth = &self.threads[cur as usize];
        let preempt = match (th.class.rt_prio(), cth.class.rt_prio()) {
            (Some(_), _) if rq.throttled => false,
            (Some(p), Some(q)) => p > q,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) if self.eevdf => {
                self.update_curr(c);
                self.ev_wakeup_preempts(c, t)
            }
            (None, None) => {
                self.update_curr(c);
                let (cv, tv) = (self.threads[cur as usize].vr, self.threads[t as usize].vr);
                let gran = self.wakeup_gran * 1024 / self.threads[t as usize].weight;
                cv - tv > 0 && (cv - tv) as u64 > gran
            }
        };
        if preempt {
            self.preempt_curr(c, out);
        }
    }

    /// Picks and installs `c`'s next thread; `c`'s previous one has left (`prev`, if any).
    /// Pulls RT work when `c` would go idle or an RT thread left, and fair work when idle.
    pub(super) fn schedule(
        &mut self,
        c: Cpu,
        prev: Option<(Tid, SwitchOut)>,
        prev_rt: bool,
        out: &mut Vec<Switch>,
    ) {
        debug_assert!(self.rqs[c as usize].curr.is_none());
        let rq = &self.rqs[c as usize];
        if !rq.throttled && self.rt_queued & !bit(c) != 0 {
            let local = rq.rt_highest();
            let going_idle =
                local.is_none() && rq.tree.is_empty() && !(self.scx.on && self.scx_has_work(c));
            if going_idle || prev_rt {
                self.pull_rt(c, local.unwrap_or(0));
            }
        }
        let rq = &self.rqs[c as usize];
        let rt_next = rq
            .rt_highest()
            .filter(|_| !rq.throttled)
            .and_then(|p| rq.rt_q[p as usize].front().copied());
        let fair_next = if rt_next.is_some() {
            None
        } else if self.scx.on {
            // Off its queue already.
            self.scx_take(c)
        } else if self.eevdf {
            self.ev_pick_settled(c)
        } else {
            rq.tree.first().map(|&(_, _, t)| t)
        };
        let next = if self.scx.on {
            rt_next.or(fair_next)
        } else {
            rt_next.or(fair_next).or_else(|| self.pull_fair(c))
        };
        if let Some(n) = next.filter(|&n| !self.on_scx(n)) {
            self.dequeue(c, n);
        }
        self.set_curr(c, next);
        if let Some(n) = next.filter(|&n| self.on_scx(n)) {
            self.scx_running(c, n);
        }
        if let Some(n) = next.filter(|&n| self.eevdf && !self.is_rt(n)) {
            if prev.map(|p| p.0) != Some(n) {
                // set_next_entity's RUN_TO_PARITY protection; a re-pick keeps the old one.
                let th = &mut self.threads[n as usize];
                th.vprot = th.dl;
            }
        }
        if prev.map(|p| p.0) != next {
            out.push(Switch {
                at: self.now,
                cpu: c,
                prev,
                next,
            });
        }
        if next.is_some_and(|n| self.is_rt(n)) {
            self.push_rt(c, out);
        }
    }

    /// Moves the queued thread `t` from `src` to `dst`, renormalising a fair vruntime (CFS) or
    /// keeping its lag and relative deadline (EEVDF).
    fn migrate(&mut self, src: Cpu, dst: Cpu, t: Tid) {
        let ev = self.eevdf && !self.is_rt(t);
        if ev {
            self.update_curr(src);
            self.ev_detach(src, t);
        }
        self.dequeue(src, t);
        self.update_curr(dst);
        if ev {
            self.ev_place(dst, t, false);
        } else if !self.is_rt(t) {
            let d = self.rqs[dst as usize].min_vr - self.rqs[src as usize].min_vr;
            self.threads[t as usize].vr += d;
        }
        self.enqueue(dst, t, false);
    }

    /// Pulls the highest-prio RT thread (> `above`) queued on another CPU and allowed on `c`.
    /// Returns its prio.
    pub(super) fn pull_rt(&mut self, c: Cpu, above: u8) -> Option<u8> {
        let (p, src, t) = self
            .rt_index
            .iter()
            .take_while(|&&(Reverse(p), _)| p > above)
            .filter(|&&(_, src)| src != c)
            .find_map(|&(Reverse(p), src)| {
                let q = &self.rqs[src as usize].rt_q[p as usize];
                q.iter()
                    .find(|&&t| self.allowed(t, c))
                    .map(|&t| (p, src, t))
            })?;
        self.migrate(src, c, t);
        Some(p)
    }

    /// When `c` would go idle: one queued fair thread from the CPU with the most queued fair
    /// threads (ties: lowest CPU), the least-vruntime one allowed on `c`.
    fn pull_fair(&mut self, c: Cpu) -> Option<Tid> {
        let srcs = self.fair_queued & !bit(c);
        let len = |h: &Host, s: Cpu| h.rqs[s as usize].tree.len();
        let busiest = cpus_of(srcs).max_by_key(|&s| (len(self, s), Reverse(s)))?;
        if let Some(t) = self.first_allowed_queued(busiest, c) {
            self.migrate(busiest, c, t);
            return Some(t);
        }
        // Affinity kept it: the others, most queued first.
        let mut rest: Vec<_> = cpus_of(srcs & !bit(busiest))
            .map(|s| (Reverse(len(self, s)), s))
            .collect();
        rest.sort_unstable();
        for (_, src) in rest {
            if let Some(t) = self.first_allowed_queued(src, c) {
                self.migrate(src, c, t);
                return Some(t);
            }
        }
        None
    }

    /// The least-vruntime fair thread queued on `src` that may run on `c`.
    fn first_allowed_queued(&self, src: Cpu, c: Cpu) -> Option<Tid> {
        self.rqs[src as usize]
            .tree
            .iter()
            .map(|&(_, _, t)| t)
            .find(|&t| self.allowed(t, c))
    }

    /// After an RT thread was picked on `c`: pushes queued RT threads to CPUs running lower.
    pub(super) fn push_rt(&mut self, c: Cpu, out: &mut Vec<Switch>) {
        loop {
            let rq = &self.rqs[c as usize];
            if rq.throttled || rq.rt_nr == 0 {
                return;
            }
            let others = !bit(c);
            let Some((p, t)) = rq
                .rt_iter()
                .find(|&(_, t)| self.threads[t as usize].affinity & others != 0)
            else {
                return;
            };
            let mask = self.threads[t as usize].affinity & !self.throttled & others;
            let Some(dst) = self.lowest_cpu(mask, c, p) else {
                return;
            };
            self.migrate(c, dst, t);
            self.check_preempt(dst, t, out);
        }
    }

    /// The CPU of `mask` running the lowest-ranked thread, if that ranks below RT prio `p`:
    /// idle first (round robin from prev+1, prev first), then fair, then the lowest RT prio.
    fn lowest_cpu(&self, mask: u64, prev: Cpu, p: u8) -> Option<Cpu> {
        let start = prev;
        if let Some(i) = rr_first(self.idle & mask, start) {
            return Some(i);
        }
        if let Some(i) = rr_first(self.fair_curr & mask, start) {
            return Some(i);
        }
        (1..p).find_map(|q| rr_first(self.rt_prio_curr[q as usize] & mask, start))
    }

    /// RT wake placement: prev if idle, the first idle from prev+1, the lowest-ranked CPU if
    /// it ranks below `p`, else prev. Throttled CPUs are not candidates.
    fn select_rt(&self, t: Tid, prev: Cpu, p: u8) -> Cpu {
        let aff = self.threads[t as usize].affinity;
        let mask = aff & !self.throttled;
        if mask & self.idle & bit(prev) != 0 {
            return prev;
        }
        if let Some(i) = rr_first(mask & self.idle, prev + 1) {
            return i;
        }
        if let Some(i) = self.lowest_cpu(mask, prev, p) {
            return i;
        }
        if aff & bit(prev) != 0 {
            prev
        } else {
            rr_first(aff, prev + 1).unwrap_or(prev)
        }
    }

    /// Fair wake placement: prev if idle, the first idle from prev+1, else prev (or the
    /// waker's CPU if prev is not allowed, else the first allowed from prev+1).
    fn select_fair(&self, t: Tid, prev: Cpu, waker: Option<Cpu>) -> Cpu {
        let aff = self.threads[t as usize].affinity;
        if aff & self.idle & bit(prev) != 0 {
            return prev;
        }
        if let Some(i) = rr_first(aff & self.idle, prev + 1) {
            return i;
        }
        if aff & bit(prev) != 0 {
            return prev;
        }
        match waker {
            Some(w) if aff & bit(w) != 0 => w,
            _ => rr_first(aff, prev + 1).unwrap_or(prev),
        }
    }

    /// Periodic fair balance: see the module documentation. Each move looks at the 4 busiest
    /// CPUs with queued fair threads (ties: highest CPU) and at most 32 queued threads of each
    /// (Linux's sched_nr_migrate) in vruntime order, each to its least busy allowed CPU (ties:
    /// lowest CPU); at most 2 * cpus moves per balance.
    pub(super) fn balance(&mut self, out: &mut Vec<Switch>) {
        let n = self.p.cpus;
        let mut by_load: BTreeSet<(u64, Cpu)> = (0..n)
            .map(|c| {
                let rq = &self.rqs[c as usize];
                (
                    rq.tree_load + rq.curr.map_or(0, |t| self.threads[t as usize].weight),
                    c,
                )
            })
            .collect();
        for _ in 0..2 * n {
            let srcs = by_load
                .iter()
                .rev()
                .filter(|&&(_, s)| self.fair_queued & bit(s) != 0);
            let least = by_load.first().map_or(0, |l| l.0);
            // No thread weighs less than 15.
            let mut srcs = srcs.copied().take_while(|&(ls, _)| ls > least + 15).take(4);
            let mv = srcs.find_map(|(ls, src)| {
                self.rqs[src as usize]
                    .tree
                    .iter()
                    .take(32)
                    .find_map(|&(_, _, t)| {
                        let th = &self.threads[t as usize];
                        let &(ld, dst) =
                            by_load.iter().find(|&&(_, d)| th.affinity & bit(d) != 0)?;
                        (ld < ls && th.weight < ls - ld).then_some(((ls, src), (ld, dst), t))
                    })
            });
            let Some(((ls, src), (ld, dst), t)) = mv else {
                return;
            };
            let w = self.threads[t as usize].weight;
            by_load.remove(&(ls, src));
            by_load.remove(&(ld, dst));
            by_load.insert((ls - w, src));
            by_load.insert((ld + w, dst));
            self.migrate(src, dst, t);
            self.check_preempt(dst, t, out);
        }
    }
}
