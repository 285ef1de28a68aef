//! Internal deadlines: fair slice ends, RR slice ends, RT throttling and its period, balance.

use super::rq::{bit, cpus_of};
use super::{Class, Cpu, Host, Switch, SwitchOut};

/// What falls due next.
enum Due {
    Cpu(Cpu),
    Period,
    Balance,
}

impl Host {
    /// Earliest time an internal deadline falls due, or None.
    pub fn next_timer(&self) -> Option<u64> {
        self.next_due().map(|(t, _)| t)
    }

    fn next_due(&self) -> Option<(u64, Due)> {
        let mut best = self.deadlines.first().map(|&(t, c)| (t, Due::Cpu(c)));
        if self.rt_period != 0 && best.as_ref().is_none_or(|b| self.next_period < b.0) {
            best = Some((self.next_period, Due::Period));
        }
        if self.fair_queued != 0
            && self.p.cpus > 1
            && best.as_ref().is_none_or(|b| self.next_balance < b.0)
        {
            best = Some((self.next_balance, Due::Balance));
        }
        best
    }

    /// Handles every internal deadline <= now, each at its own time.
    pub fn on_timer(&mut self, now: u64, out: &mut Vec<Switch>) {
        debug_assert!(now >= self.now, "time went backwards: {now} < {}", self.now);
        self.run_timers(now, true, out);
        self.account_pressure(now);
        self.now = now;
    }

    /// Start of a call at `now`: handles the deadlines strictly before it.
    pub(super) fn begin(&mut self, now: u64, out: &mut Vec<Switch>) {
        debug_assert!(now >= self.now, "time went backwards: {now} < {}", self.now);
        self.run_timers(now, false, out);
        self.account_pressure(now);
        self.now = now;
    }

    /// End of a call: handles the deadlines at `now` (e.g. a slice the call shortened).
    pub(super) fn finish(&mut self, now: u64, out: &mut Vec<Switch>) {
        self.run_timers(now, true, out);
    }

    fn run_timers(&mut self, limit: u64, inclusive: bool, out: &mut Vec<Switch>) {
        let mut same_time = 0u32;
        loop {
            self.refresh_dirty();
            let Some((t, due)) = self.next_due() else {
                return;
            };
            if t > limit || (t == limit && !inclusive) {
                return;
            }
            debug_assert!(t >= self.now, "deadline {t} in the past of {}", self.now);
            same_time = if t == self.now { same_time + 1 } else { 0 };
            assert!(same_time < 1_000_000, "host timers loop at {t}");
            self.account_pressure(t);
            self.now = self.now.max(t);
            match due {
                Due::Cpu(c) => self.cpu_deadline(c, out),
                Due::Period => self.rt_period_boundary(out),
                Due::Balance => {
                    self.balance(out);
                    self.next_balance = self.next_multiple(self.p.balance_interval_ns);
                }
            }
        }
    }

    /// Recomputes the deadline and RT-period bit of every CPU touched since the last time.
    fn refresh_dirty(&mut self) {
        while self.dirty != 0 {
            let c = self.dirty.trailing_zeros();
            self.dirty &= self.dirty - 1;
            if self.throttling {
                let rq = &self.rqs[c as usize];
                let on = rq.rt_time > 0 || rq.throttled || self.rt_curr & bit(c) != 0;
                if on && self.rt_period == 0 {
                    self.next_period = self.next_multiple(self.p.rt_period_ns);
                }
                if on {
                    self.rt_period |= bit(c);
                } else {
                    self.rt_period &= !bit(c);
                }
            }
            let d = self.compute_deadline(c);
            let rq = &mut self.rqs[c as usize];
            if d != rq.deadline {
                if rq.deadline != u64::MAX {
                    self.deadlines.remove(&(rq.deadline, c));
                }
                if d != u64::MAX {
                    self.deadlines.insert((d, c));
                }
                rq.deadline = d;
            }
        }
    }

    /// The fair slice of `c`'s running fair thread over its runnable fair threads.
    fn fair_slice(&self, c: Cpu, w: u64) -> u64 {
        let rq = &self.rqs[c as usize];
        let nr = rq.tree.len() as u64 + 1;
        let period = if nr > self.nr_latency {
            nr * self.min_gran
        } else {
            self.latency
        };
        let load = rq.tree_load + w;
        ((u128::from(period) * u128::from(w) / u128::from(load)) as u64).max(self.min_gran)
    }

    fn compute_deadline(&self, c: Cpu) -> u64 {
        let rq = &self.rqs[c as usize];
        let Some(t) = rq.curr else { return u64::MAX };
        let th = &self.threads[t as usize];
        let pending = self.now - rq.curr_start;
        match th.class {
            Class::Fair { .. } if self.scx.on => self.scx_deadline(c, t),
            Class::Fair { .. } if self.eevdf => self.ev_deadline(c, t),
            Class::Fair { .. } => {
                if rq.tree.is_empty() {
                    return u64::MAX;
                }
                let ran = th.sum_exec + pending - th.slice_exec0;
                self.now + self.fair_slice(c, th.weight).saturating_sub(ran)
            }
            Class::Fifo { .. } | Class::Rr { .. } => {
                let mut d = u64::MAX;
                if matches!(th.class, Class::Rr { .. }) {
                    d = self.now + th.rr_left.saturating_sub(pending);
                }
                if self.throttling && !rq.throttled {
                    let left = self.p.rt_runtime_ns.saturating_sub(rq.rt_time + pending);
                    d = d.min(self.now + left);
                }
                d
            }
        }
    }

    /// `c`'s deadline is due: throttle, rotate RR, or end the fair slice.
    fn cpu_deadline(&mut self, c: Cpu, out: &mut Vec<Switch>) {
        self.update_curr(c);
        let Some(t) = self.rqs[c as usize].curr else {
            return;
        };
        if self.on_scx(t) {
            self.scx_slice_end(c, t, out);
            return;
        }
        if self.eevdf && !self.is_rt(t) {
            self.ev_cpu_deadline(c, out);
            return;
        }
        let rq = &self.rqs[c as usize];
        let th = &self.threads[t as usize];
        match th.class {
            Class::Fifo { prio } | Class::Rr { prio } => {
                if self.throttling && !rq.throttled && rq.rt_time >= self.p.rt_runtime_ns {
                    self.rqs[c as usize].throttled = true;
                    self.throttled |= bit(c);
                    self.put_prev(c, true);
                    self.schedule(c, Some((t, SwitchOut::Preempted)), true, out);
                    return;
                }
                if matches!(th.class, Class::Rr { .. }) && th.rr_left == 0 {
                    self.threads[t as usize].rr_left = self.p.rr_timeslice_ns;
                    if !self.rqs[c as usize].rt_q[prio as usize].is_empty() {
                        self.put_prev(c, false);
                        self.schedule(c, Some((t, SwitchOut::Preempted)), true, out);
                    }
                }
            }
            Class::Fair { .. } => {
                let ran = th.sum_exec - th.slice_exec0;
                let Some(&(left, _, _)) = rq.tree.first() else {
                    return;
                };
                if ran < self.fair_slice(c, th.weight) {
                    return;
                }
                if left <= th.vr {
                    self.put_prev(c, false);
                    self.schedule(c, Some((t, SwitchOut::Preempted)), false, out);
                } else {
                    let th = &mut self.threads[t as usize];
                    th.slice_exec0 = th.sum_exec;
                }
            }
        }
    }

    /// An RT period boundary: every CPU's RT time drops by the runtime; throttled queues whose
    /// time is now below it unthrottle, and their RT threads preempt.
    fn rt_period_boundary(&mut self, out: &mut Vec<Switch>) {
        for c in cpus_of(self.rt_period) {
            self.update_curr(c);
            let runtime = self.p.rt_runtime_ns;
            let rq = &mut self.rqs[c as usize];
            rq.rt_time = rq.rt_time.saturating_sub(runtime);
            if rq.throttled && rq.rt_time < runtime {
                rq.throttled = false;
                self.throttled &= !bit(c);
                if self.rqs[c as usize].rt_nr > 0 {
                    if self.rqs[c as usize].curr.is_some() {
                        self.preempt_curr(c, out);
                    } else {
                        self.schedule(c, None, false, out);
                    }
                }
            }
        }
        self.next_period = self.next_multiple(self.p.rt_period_ns);
    }

    /// EEVDF queue invariants of `c` (tests only): it holds the runnable queued fair threads
    /// and the delayed ones, with their current keys and sums.
    #[cfg(test)]
    fn check_ev(&self, c: Cpu) {
        use super::ThreadState;
        let rq = &self.rqs[c as usize];
        if !self.eevdf {
            assert!(rq.ev.is_empty() && rq.ev_load == 0 && rq.ev_sum == 0);
            return;
        }
        let (mut sum, mut load, mut runnable) = (0i128, 0u64, 0usize);
        for &(d, seq, t) in &rq.ev {
            let th = &self.threads[t as usize];
            assert_eq!((th.dl, th.seq), (d, seq), "EEVDF key of {t}");
            assert!(th.class.rt_prio().is_none(), "RT {t} in EEVDF queue");
            if th.delayed {
                assert_eq!((th.state, th.cpu), (ThreadState::Blocked, c), "delayed {t}");
            } else {
                assert_eq!(th.state, ThreadState::Runnable(c), "EEVDF entry {t}");
                assert!(rq.tree.contains(&(th.vr, th.seq, t)), "{t} not in tree");
                runnable += 1;
            }
            sum += i128::from(th.weight) * i128::from(th.vr);
            load += th.weight;
        }
        assert_eq!(runnable, rq.tree.len(), "EEVDF queue vs tree, cpu {c}");
        assert_eq!((sum, load), (rq.ev_sum, rq.ev_load), "EEVDF sums, cpu {c}");
        if let Some(t) = rq.curr {
            let th = &self.threads[t as usize];
            if th.class.rt_prio().is_none() {
                assert!(
                    th.vr < th.dl || rq.ev.is_empty() || rq.resched,
                    "curr {t} past its deadline"
                );
            }
        }
    }

    /// Checks the model's invariants (tests only).
    #[cfg(test)]
    pub(super) fn check_invariants(&self) {
        use super::ThreadState;
        for (c, rq) in self.rqs.iter().enumerate() {
            let c = c as Cpu;
            let b = bit(c);
            assert_eq!(rq.curr.is_none(), self.idle & b != 0, "idle mask cpu {c}");
            let load: u64 = rq
                .tree
                .iter()
                .map(|&(v, _, t)| {
                    let th = &self.threads[t as usize];
                    assert_eq!(
                        (th.vr, th.state),
                        (v, ThreadState::Runnable(c)),
                        "tree entry {t}"
                    );
                    th.weight
                })
                .sum();
            assert_eq!(load, rq.tree_load, "tree load cpu {c}");
            assert_eq!(
                !rq.tree.is_empty(),
                self.fair_queued & b != 0,
                "fair_queued cpu {c}"
            );
            let rt: Vec<_> = rq.rt_iter().collect();
            assert_eq!(rt.len() as u32, rq.rt_nr, "rt_nr cpu {c}");
            assert_eq!(rq.rt_nr > 0, self.rt_queued & b != 0, "rt_queued cpu {c}");
            for &(p, t) in &rt {
                let th = &self.threads[t as usize];
                assert_eq!(
                    (th.class.rt_prio(), th.state),
                    (Some(p), ThreadState::Runnable(c))
                );
            }
            assert_eq!(rq.throttled, self.throttled & b != 0, "throttled cpu {c}");
            self.check_ev(c);
            for p in 1..100u8 {
                let queued = !rq.rt_q[p as usize].is_empty();
                assert_eq!(
                    queued,
                    rq.rt_bits & (1u128 << p) != 0,
                    "rt_bits cpu {c} prio {p}"
                );
                assert_eq!(queued, self.rt_index.contains(&(std::cmp::Reverse(p), c)));
                let running = rq
                    .curr
                    .is_some_and(|t| self.threads[t as usize].class.rt_prio() == Some(p));
                assert_eq!(
                    running,
                    self.rt_prio_curr[p as usize] & b != 0,
                    "rt_prio_curr cpu {c}"
                );
                assert_eq!(running, rq.curr_prio == p);
            }
            let best_rt = rq.rt_highest().filter(|_| !rq.throttled);
            match rq.curr {
                None => assert!(
                    rq.tree.is_empty() && rq.ev.is_empty() && best_rt.is_none(),
                    "idle cpu {c} has work"
                ),
                Some(t) => {
                    let th = &self.threads[t as usize];
                    assert_eq!(th.state, ThreadState::Running(c));
                    assert_eq!(th.class.rt_prio().is_some(), self.rt_curr & b != 0);
                    assert_eq!(th.class.rt_prio().is_none(), self.fair_curr & b != 0);
                    match th.class.rt_prio() {
                        Some(p) => {
                            assert!(!rq.throttled, "RT running on throttled cpu {c}");
                            assert!(
                                best_rt.is_none_or(|q| q <= p),
                                "higher RT queued on cpu {c}"
                            );
                        }
                        None => assert!(best_rt.is_none(), "RT queued behind fair on cpu {c}"),
                    }
                }
            }
            assert!(
                rq.deadline > self.now || rq.deadline == u64::MAX,
                "stale deadline cpu {c}"
            );
        }
        for (t, th) in self.threads.iter().enumerate() {
            if th.delayed {
                assert!(
                    self.eevdf && th.state == ThreadState::Blocked,
                    "delayed {t}"
                );
                assert!(
                    self.rqs[th.cpu as usize]
                        .ev
                        .contains(&(th.dl, th.seq, t as super::Tid)),
                    "delayed {t} not queued"
                );
            }
        }
        self.check_scx();
        assert_eq!(self.dirty, 0);
        assert!(
            self.next_timer().is_none_or(|t| t > self.now),
            "due timer left"
        );
    }
}
