//! Threads, per-CPU runqueues, and the queue operations that keep the bitmasks current.

use super::{Class, Cpu, Host, ThreadState, Tid};
use std::cmp::Reverse;
use std::collections::{BTreeSet, VecDeque};

pub(super) fn bit(c: Cpu) -> u64 {
    1u64 << c
}

/// The CPUs of a mask, ascending.
pub(super) fn cpus_of(mut m: u64) -> impl Iterator<Item = Cpu> {
    std::iter::from_fn(move || {
        (m != 0).then(|| {
            let c = m.trailing_zeros();
            m &= m - 1;
            c
        })
    })
}

/// The first CPU of `mask` at or after `start`, wrapping round.
pub(super) fn rr_first(mask: u64, start: u32) -> Option<Cpu> {
    if mask == 0 {
        return None;
    }
    let hi = if start >= 64 {
        0
    } else {
        mask & (u64::MAX << start)
    };
    Some(if hi != 0 {
        hi.trailing_zeros()
    } else {
        mask.trailing_zeros()
    })
}

pub(super) struct Thread {
    pub class: Class,
    /// Fair weight (1024 for RT threads, unused).
    pub weight: u64,
    pub affinity: u64,
    pub state: ThreadState,
    /// The CPU it runs or is queued on; when blocked, the previous one.
    pub cpu: Cpu,
    /// Never woken yet.
    pub fresh: bool,
    /// Fair: vruntime on `cpu`'s timeline. Not fair: relative to `min_vruntime` (CFS) or stale
    /// (EEVDF, which places by lag).
    pub vr: i64,
    /// Remainder of the vruntime division, in units of 1/weight ns.
    pub vr_rem: u64,
    pub sum_exec: u64,
    pub rt_exec: u64,
    /// RR time slice left (Linux's `rt.time_slice`).
    pub rr_left: u64,
    /// `sum_exec` when the current fair slice began.
    pub slice_exec0: u64,
    /// Insertion number of its fair queue entry.
    pub seq: u64,
    // EEVDF only (see eevdf.rs).
    /// Virtual deadline, on `cpu`'s timeline while queued or running fair.
    pub dl: i64,
    /// Lag (`V - vruntime`, clamped) kept from its last dequeue, in units of weight `lag_w`.
    pub vlag: i64,
    pub lag_w: u64,
    /// Deadline relative to vruntime kept by a dequeue other than a sleep (PLACE_REL_DEADLINE).
    pub rel_dl: Option<i64>,
    /// Slice protection (RUN_TO_PARITY): protected while `vr < vprot`.
    pub vprot: i64,
    /// Blocked but still queued on `cpu` (DELAY_DEQUEUE).
    pub delayed: bool,
}

impl Thread {
    pub fn new(class: Class, weight: u64, affinity: u64, rr_slice: u64) -> Thread {
        Thread {
            class,
            weight,
            affinity,
            state: ThreadState::Blocked,
            cpu: affinity.trailing_zeros(),
            fresh: true,
            vr: 0,
            vr_rem: 0,
            sum_exec: 0,
            rt_exec: 0,
            rr_left: rr_slice,
            slice_exec0: 0,
            seq: 0,
            dl: 0,
            vlag: 0,
            lag_w: weight,
            rel_dl: None,
            vprot: 0,
            delayed: false,
        }
    }
}

pub(super) struct Rq {
    pub curr: Option<Tid>,
    /// When `curr`'s unaccounted stretch began.
    pub curr_start: u64,
    /// Queued fair threads by (vruntime, insertion number, tid): of equal vruntimes the
    /// earlier queued comes first, as in the kernel's rbtree.
    pub tree: BTreeSet<(i64, u64, Tid)>,
    /// Total weight of `tree`.
    pub tree_load: u64,
    /// EEVDF: queued fair threads, delayed ones included, by (deadline, insertion number, tid).
    pub ev: BTreeSet<(i64, u64, Tid)>,
    /// EEVDF: sum of weight * vruntime, and of weight, over `ev`.
    pub ev_sum: i128,
    pub ev_load: u64,
    /// EEVDF: the running fair thread is to be re-picked (update_curr's resched).
    pub resched: bool,
    pub min_vr: i64,
    /// Queued RT threads per prio (index 0 unused).
    pub rt_q: Vec<VecDeque<Tid>>,
    /// Bit p set when `rt_q[p]` is non-empty.
    pub rt_bits: u128,
    pub rt_nr: u32,
    /// RT run time in the current throttling period.
    pub rt_time: u64,
    pub throttled: bool,
    /// The running thread's RT prio, 0 if none.
    pub curr_prio: u8,
    /// This CPU's entry in `Host::deadlines`, u64::MAX for none.
    pub deadline: u64,
}

impl Rq {
    pub fn new() -> Rq {
        Rq {
            curr: None,
            curr_start: 0,
            tree: BTreeSet::new(),
            tree_load: 0,
            ev: BTreeSet::new(),
            ev_sum: 0,
            ev_load: 0,
            resched: false,
            min_vr: 0,
            rt_q: (0..100).map(|_| VecDeque::new()).collect(),
            rt_bits: 0,
            rt_nr: 0,
            rt_time: 0,
            throttled: false,
            curr_prio: 0,
            deadline: u64::MAX,
        }
    }

    /// The highest queued RT prio, if any.
    pub fn rt_highest(&self) -> Option<u8> {
        (self.rt_bits != 0).then(|| (127 - self.rt_bits.leading_zeros()) as u8)
    }

    /// Queued RT threads, highest prio first, queue order within a prio.
    pub fn rt_iter(&self) -> impl Iterator<Item = (u8, Tid)> + '_ {
        let mut bits = self.rt_bits;
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let p = 127 - bits.leading_zeros();
                bits &= !(1u128 << p);
                p as u8
            })
        })
        .flat_map(move |p| self.rt_q[p as usize].iter().map(move |&t| (p, t)))
    }
}

impl Host {
    pub(super) fn is_rt(&self, t: Tid) -> bool {
        self.threads[t as usize].class.rt_prio().is_some()
    }

    pub(super) fn allowed(&self, t: Tid, c: Cpu) -> bool {
        self.threads[t as usize].affinity & bit(c) != 0
    }

    /// Puts `t` on `c`'s queue (RT: at the head of its prio if `head`, else the tail).
    pub(super) fn enqueue(&mut self, c: Cpu, t: Tid, head: bool) {
        self.enqueue_seq(c, t, head, true);
    }

    /// `enqueue`; a fair thread gets a new insertion number if `renumber` (else it keeps its
    /// place among equal keys, for a delayed thread requeued in place).
    pub(super) fn enqueue_seq(&mut self, c: Cpu, t: Tid, head: bool, renumber: bool) {
        let th = &mut self.threads[t as usize];
        th.state = ThreadState::Runnable(c);
        th.cpu = c;
        let rq = &mut self.rqs[c as usize];
        match th.class.rt_prio() {
            None => {
                if renumber {
                    self.seq += 1;
                    th.seq = self.seq;
                }
                rq.tree.insert((th.vr, th.seq, t));
                rq.tree_load += th.weight;
                if self.eevdf {
                    self.ev_insert(c, t);
                }
                if self.fair_queued == 0 {
                    self.next_balance = self.next_multiple(self.p.balance_interval_ns);
                }
                self.fair_queued |= bit(c);
            }
            Some(p) => {
                let q = &mut rq.rt_q[p as usize];
                if q.is_empty() {
                    self.rt_index.insert((Reverse(p), c));
                }
                if head {
                    q.push_front(t);
                } else {
                    q.push_back(t);
                }
                rq.rt_bits |= 1u128 << p;
                rq.rt_nr += 1;
                self.rt_queued |= bit(c);
            }
        }
        self.dirty |= bit(c);
    }

    /// Takes the queued thread `t` off `c`'s queue (its state is left to the caller).
    pub(super) fn dequeue(&mut self, c: Cpu, t: Tid) {
        let th = &self.threads[t as usize];
        debug_assert_eq!(th.state, ThreadState::Runnable(c));
        let rq = &mut self.rqs[c as usize];
        match th.class.rt_prio() {
            None => {
                let removed = rq.tree.remove(&(th.vr, th.seq, t));
                debug_assert!(removed, "thread {t} not in CPU {c}'s tree");
                rq.tree_load -= th.weight;
                if rq.tree.is_empty() {
                    self.fair_queued &= !bit(c);
                }
                if self.eevdf {
                    self.ev_remove(c, t);
                }
            }
            Some(p) => {
                let q = &mut rq.rt_q[p as usize];
                let i = q.iter().position(|&x| x == t);
                debug_assert!(i.is_some(), "thread {t} not in CPU {c}'s RT queue {p}");
                if let Some(i) = i {
                    q.remove(i);
                }
                if q.is_empty() {
                    rq.rt_bits &= !(1u128 << p);
                    self.rt_index.remove(&(Reverse(p), c));
                }
                rq.rt_nr -= 1;
                if rq.rt_nr == 0 {
                    self.rt_queued &= !bit(c);
                }
            }
        }
        self.dirty |= bit(c);
    }

    /// Makes `next` the running thread of `c` (whose `curr` has been taken off).
    pub(super) fn set_curr(&mut self, c: Cpu, next: Option<Tid>) {
        let rq = &mut self.rqs[c as usize];
        rq.curr = next;
        rq.curr_start = self.now;
        rq.resched = false;
        if let Some(t) = next {
            let th = &mut self.threads[t as usize];
            th.state = ThreadState::Running(c);
            th.cpu = c;
            th.slice_exec0 = th.sum_exec;
        }
        self.curr_class_changed(c);
        self.update_min_vr(c);
    }

    /// Re-derives `c`'s curr masks (after its running thread or that thread's class changed).
    pub(super) fn curr_class_changed(&mut self, c: Cpu) {
        let b = bit(c);
        let rq = &mut self.rqs[c as usize];
        self.idle &= !b;
        self.fair_curr &= !b;
        self.rt_curr &= !b;
        self.rt_prio_curr[rq.curr_prio as usize] &= !b;
        rq.curr_prio = 0;
        match rq.curr.map(|t| self.threads[t as usize].class.rt_prio()) {
            None => self.idle |= b,
            Some(None) => self.fair_curr |= b,
            Some(Some(p)) => {
                self.rt_curr |= b;
                rq.curr_prio = p;
                self.rt_prio_curr[p as usize] |= b;
            }
        }
        self.dirty |= b;
    }

    /// Puts `c`'s running thread back on its queue (RT: at the head if `head`).
    pub(super) fn put_prev(&mut self, c: Cpu, head: bool) -> Tid {
        let t = self.rqs[c as usize]
            .curr
            .take()
            .expect("put_prev on an idle CPU");
        self.enqueue(c, t, head);
        t
    }

    /// `min_vruntime = max(min_vruntime, min(curr.vruntime, leftmost.vruntime))`.
    pub(super) fn update_min_vr(&mut self, c: Cpu) {
        let rq = &self.rqs[c as usize];
        let curr = rq
            .curr
            .filter(|&t| !self.is_rt(t))
            .map(|t| self.threads[t as usize].vr);
        let left = rq.tree.first().map(|&(v, _, _)| v);
        let v = match (curr, left) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => return,
        };
        let rq = &mut self.rqs[c as usize];
        rq.min_vr = rq.min_vr.max(v);
    }

    /// Charges `c`'s running thread for the time since `curr_start`.
    pub(super) fn update_curr(&mut self, c: Cpu) {
        let now = self.now;
        self.dirty |= bit(c);
        let rq = &mut self.rqs[c as usize];
        let Some(t) = rq.curr else { return };
        let delta = now - rq.curr_start;
        rq.curr_start = now;
        if delta == 0 {
            return;
        }
        let th = &mut self.threads[t as usize];
        th.sum_exec += delta;
        if self.scx.on && th.class.rt_prio().is_none() {
            self.scx_charge(t, delta);
            return;
        }
        match th.class {
            Class::Fair { .. } => {
                let num = u128::from(delta) * 1024 + u128::from(th.vr_rem);
                th.vr += (num / u128::from(th.weight)) as i64;
                th.vr_rem = (num % u128::from(th.weight)) as u64;
                self.update_min_vr(c);
                if self.eevdf {
                    self.ev_tick(c);
                }
            }
            Class::Fifo { .. } | Class::Rr { .. } => {
                th.rt_exec += delta;
                if matches!(th.class, Class::Rr { .. }) {
                    th.rr_left = th.rr_left.saturating_sub(delta);
                }
                if self.throttling {
                    rq.rt_time += delta;
                }
            }
        }
    }

    /// Adds the fair thread `t` (not running) to `c`'s EEVDF queue with its current deadline.
    pub(super) fn ev_insert(&mut self, c: Cpu, t: Tid) {
        let th = &self.threads[t as usize];
        let rq = &mut self.rqs[c as usize];
        let fresh = rq.ev.insert((th.dl, th.seq, t));
        debug_assert!(fresh, "thread {t} already in CPU {c}'s EEVDF queue");
        rq.ev_sum += i128::from(th.weight) * i128::from(th.vr);
        rq.ev_load += th.weight;
        self.dirty |= bit(c);
    }

    /// Takes `t` off `c`'s EEVDF queue.
    pub(super) fn ev_remove(&mut self, c: Cpu, t: Tid) {
        let th = &self.threads[t as usize];
        let rq = &mut self.rqs[c as usize];
        let removed = rq.ev.remove(&(th.dl, th.seq, t));
        debug_assert!(removed, "thread {t} not in CPU {c}'s EEVDF queue");
        rq.ev_sum -= i128::from(th.weight) * i128::from(th.vr);
        rq.ev_load -= th.weight;
        self.dirty |= bit(c);
    }

    /// The smallest multiple of `interval` after `self.now`.
    pub(super) fn next_multiple(&self, interval: u64) -> u64 {
        (self.now / interval + 1) * interval
    }
}
