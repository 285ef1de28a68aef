//! The host's CPU scheduler: a pure, deterministic, event-driven model of Linux's scheduler as far
//! as double scheduling needs it: the RT classes, and a fair class that is either 6.1's CFS (as
//! Debian 12's host kernel has it) or 6.18's EEVDF (`HostParams::fair`, the default; see
//! `eevdf.rs`). No I/O, clocks or randomness: time (`now`, ns) is passed in and never goes
//! backwards. With `HostParams::scx` set, pvsched's sched_ext scheduler replaces the fair class
//! (`scx.rs`, whose module docs replace the fair rules below: placement, balance, idle pull,
//! slices, vruntime); the RT rules hold as written.
//!
//! # The model
//!
//! **Runqueues.** One per CPU. The running thread (`curr`) is not in its queue, as in Linux's CFS
//! tree. `nr_running` counts the running and the queued threads.
//!
//! **Classes.** RT (FIFO and RR, prio 1..=99, higher wins) always beats fair, except on a CPU whose
//! RT queue is throttled. Among RT threads: highest prio first, FIFO order within a prio; a
//! preempted RT thread goes back to the *head* of its prio's queue, a woken or RR-expired one to
//! the tail. RR rotates after `rr_timeslice_ns` of its own run time (kept across sleeps and
//! preemptions, refilled on expiry as Linux's `rt.time_slice`) when a thread of its prio is queued
//! on its CPU; FIFO runs until it blocks or a higher prio arrives. `set_class` requeues a queued RT
//! thread at the head when it lowers its priority, at the tail when it raises it, in place when the
//! prio is unchanged (as `__sched_setscheduler`).
//!
//! **Fair (CFS, 6.1, `FairModel::Cfs`).** Latency, minimum and wakeup granularity are scaled by
//! `1 + ilog2(min(cpus, 8))` (SCHED_TUNABLESCALING_LOG). Weights from nice are the kernel's
//! `sched_prio_to_weight`; vruntime advances by `delta * 1024 / weight` (exactly: the division's
//! remainder is carried). The queued thread with the least vruntime runs next (of equal ones, the
//! earlier queued, as in the kernel's rbtree). Its slice is `max(period * w / total_w, min_gran)`
//! over the CPU's runnable fair threads, the period being the latency, stretched to `nr * min_gran`
//! when `nr > latency / min_gran`. When the running thread has used its slice and another fair
//! thread is queued, it is put back and the least vruntime runs (the running one stays only if its
//! vruntime is strictly less; it then starts a new slice). Slice ends are exact timers (Linux
//! checks them at the tick, 4 ms at HZ=250): a thread that ran past its slice alone is preempted as
//! soon as another queues (Linux: at the next tick). The tick's other check (curr a slice ahead of
//! the leftmost) is not modelled. A woken thread's vruntime is `max(own, min_vruntime - latency/2)`
//! (GENTLE_FAIR_SLEEPERS); it preempts the running fair thread when `curr.vruntime -
//! wakee.vruntime` exceeds `wakeup_gran * 1024 / w_wakee`; then the least vruntime runs (no
//! NEXT/LAST buddies). A thread's first wake places it at the target's `min_vruntime` (no
//! START_DEBIT, no sleeper credit). A migrating thread's vruntime is renormalised (minus the old
//! CPU's `min_vruntime`, plus the new one's); a thread that leaves the fair class keeps its
//! vruntime relative to `min_vruntime` (a sleeping one is first placed as at a wake), and gets it
//! back on return, as `detach/attach_task_cfs_rq` do. A weight change keeps the vruntime (6.1 does
//! not rescale it). No cgroups or autogroups: every fair thread competes flat on its CPU.
//!
//! **Fair (EEVDF, 6.18, `FairModel::Eevdf`).** See `eevdf.rs` for the rules. RT, throttling,
//! placement, push/pull and balance are shared with CFS; the idle pull and the balance move only
//! runnable threads (not delayed-dequeue ones).
//!
//! **RT throttling, per CPU.** RT run time accumulates per CPU; when it reaches `rt_runtime_ns`
//! within the current period the CPU's RT queue is throttled: its running RT thread is preempted
//! (back to the head of its queue) and fair threads (or idle) run until the next period boundary
//! (multiples of `rt_period_ns` from 0), where the accumulated time drops by `rt_runtime_ns`
//! (floored at 0) and the queue unthrottles. No runtime borrowing between CPUs (6.1 defaults to no
//! RT_RUNTIME_SHARE). `rt_runtime_ns >= rt_period_ns` (u64::MAX included) disables it, as the
//! kernel does. A throttled CPU is not a target for RT placement or push, and does not pull RT
//! threads; other CPUs may pull its queued RT threads.
//!
//! **Placement on wake.** The previous CPU if it is idle; else the first idle allowed CPU scanning
//! round robin from prev+1; else, for RT, the allowed CPU whose current thread has the lowest
//! priority (idle < fair < RT prio; prev wins ties, then round robin from prev+1) if that is lower
//! than the wakee's (RT push), else prev; for fair, prev (or the waker's CPU if prev is not
//! allowed, else the first allowed from prev+1). A thread never run before has prev = its first
//! allowed CPU. `waker_cpu` is otherwise unused (no wake_affine). EEVDF: a thread still queued
//! by DELAY_DEQUEUE wakes where it is, without placement.
//!
//! **RT push and pull.** After an RT thread is picked on a CPU with other RT threads queued there,
//! the highest queued one allowed elsewhere is pushed to the lowest-priority CPU (as above) if that
//! CPU's current thread ranks below it, repeatedly (Linux's `push_rt_tasks`): so an RT thread
//! preempted by a higher one, or rotated out by RR, moves to a CPU running fair work or a lower RT
//! prio if there is one. A queued thread raised into RT by `set_class` is pushed the same way. A
//! CPU pulls the highest-prio RT thread queued on another CPU (allowed here, higher than its own
//! queued RT) when it would go idle, when an RT thread leaves it (blocks, is preempted, rotates;
//! Linux's `balance_rt`), and when `set_class` lowers its running RT thread (then the pulled one
//! preempts it if it ranks higher).
//!
//! **Fair balance.** A CPU that would go idle (after the RT pull) pulls one queued fair thread:
//! from the CPU with the most queued fair threads (ties: lowest CPU), the least-vruntime one
//! allowed here. Every `balance_interval_ns` (multiples from 0, while any CPU has a queued fair
//! thread), queued fair threads move from the busiest CPU (by runnable fair weight, a running RT
//! thread counting as 1024 as Linux's lowered capacity would) to the least busy allowed one while a
//! move strictly reduces the imbalance (`w < load_src - load_dst`); a moved thread may preempt at
//! its destination as at a wake. To stay cheap, each move looks only at the 4 busiest CPUs and 32
//! queued threads of each, and a balance makes at most `2 * cpus` moves. Linux's busy-CPU interval
//! scaling, cache-hotness and NUMA/SMT domains are not modelled. Affinity is always respected.
//!
//! **Timers.** `next_timer` is the earliest of: per-CPU deadlines (a fair slice end while a fair
//! thread is queued (EEVDF: any other entity, a delayed one included; a resched the call itself
//! asked for falls due at once), an RR slice end (also when alone: it refills), the RT-throttle
//! point of a running RT thread), kept in a `BTreeSet`; the next RT period boundary while any CPU
//! has RT time, a running RT thread or a throttled queue; the next balance while any CPU has a
//! queued fair thread (and cpus > 1). Every call first handles the deadlines strictly before its
//! `now` (each at its own time, as `on_timer` does; a `Switch`'s `at` is then its deadline, <=
//! now), then acts, then handles those at `now`: after any call `next_timer() > now`.
//!
//! **CPU pressure.** When asked for, PSI's `some` CPU pressure (time a runnable thread waited
//! for a CPU), per CPU and aggregated as the kernel does; it only observes. See `psi.rs`.
//!
//! **Determinism.** Decisions use `Vec`s, bitmasks and ordered sets only; ties go to the lower
//! `Tid`/`Cpu` unless stated.

mod eevdf;
mod psi;
mod rq;
mod sched;
mod scx;
mod timer;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_eevdf;
#[cfg(test)]
mod tests_scx;

pub use scx::{ScxAllowance, ScxGuestView, ScxParams, ScxStats};

use rq::{bit, Rq, Thread};
use std::cmp::Reverse;
use std::collections::BTreeSet;

pub type Tid = u32;
pub type Cpu = u32;

/// A host thread's scheduling class. RT prio 1..=99, higher wins; nice -20..=19.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Class {
    Fair { nice: i8 },
    Fifo { prio: u8 },
    Rr { prio: u8 },
}

impl Class {
    /// The RT priority, or None for fair.
    pub fn rt_prio(self) -> Option<u8> {
        match self {
            Class::Fair { .. } => None,
            Class::Fifo { prio } | Class::Rr { prio } => Some(prio),
        }
    }

    /// Cross-class rank: idle 0 < fair 1 < RT 1 + prio.
    fn rank(self) -> u32 {
        self.rt_prio().map_or(1, |p| 1 + u32::from(p))
    }
}

/// Which model of Linux's fair class the host runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FairModel {
    /// CFS as in Linux 6.1 (Debian 12).
    Cfs,
    /// EEVDF as in Linux 6.18.
    #[default]
    Eevdf,
}

/// The host scheduler's tunables, before the CPU-count scaling of the three CFS ones and of
/// `base_slice_ns`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct HostParams {
    pub cpus: u32,
    pub fair: FairModel,
    /// EEVDF's request size (`sysctl_sched_base_slice`, 0.70 ms since Linux 6.15), scaled by
    /// `1 + ilog2(min(cpus, 8))`. Unused by CFS.
    pub base_slice_ns: u64,
    pub sched_latency_ns: u64,
    pub min_granularity_ns: u64,
    pub wakeup_granularity_ns: u64,
    pub rr_timeslice_ns: u64,
    /// u64::MAX (or any value >= rt_period_ns): no RT throttling.
    pub rt_runtime_ns: u64,
    pub rt_period_ns: u64,
    pub balance_interval_ns: u64,
    /// pvsched's sched_ext scheduler in place of the fair class (`scx.rs`; `fair` and the
    /// fair tunables are then unused); None: the fair class.
    pub scx: Option<ScxParams>,
}

impl Default for HostParams {
    fn default() -> HostParams {
        HostParams {
            cpus: 2,
            fair: FairModel::Eevdf,
            base_slice_ns: 700_000,
            sched_latency_ns: 6_000_000,
            min_granularity_ns: 750_000,
            wakeup_granularity_ns: 1_000_000,
            rr_timeslice_ns: 100_000_000,
            rt_runtime_ns: 950_000_000,
            rt_period_ns: 1_000_000_000,
            balance_interval_ns: 4_000_000,
            scx: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchOut {
    Preempted,
    Blocked,
}

/// One context switch, as the sched_switch tracepoint would report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Switch {
    pub at: u64,
    pub cpu: Cpu,
    pub prev: Option<(Tid, SwitchOut)>,
    pub next: Option<Tid>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadState {
    Blocked,
    Runnable(Cpu),
    Running(Cpu),
}

/// The kernel's `sched_prio_to_weight`, nice -20..=19.
const PRIO_TO_WEIGHT: [u64; 40] = [
    88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916, 9548, 7620, 6100, 4904,
    3906, 3121, 2501, 1991, 1586, 1277, 1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87,
    70, 56, 45, 36, 29, 23, 18, 15,
];

fn weight_of(class: Class) -> u64 {
    match class {
        Class::Fair { nice } => PRIO_TO_WEIGHT[(i32::from(nice) + 20) as usize],
        _ => 1024,
    }
}

fn check_class(class: Class) {
    match class {
        Class::Fair { nice } => assert!((-20..=19).contains(&nice), "nice {nice} out of -20..=19"),
        Class::Fifo { prio } | Class::Rr { prio } => {
            assert!((1..=99).contains(&prio), "RT prio {prio} out of 1..=99")
        }
    }
}

/// The host scheduler model. See the module documentation for the rules.
pub struct Host {
    p: HostParams,
    /// Scaled CFS tunables.
    latency: u64,
    min_gran: u64,
    wakeup_gran: u64,
    /// `latency / min_gran`: above this many runnable threads the period stretches.
    nr_latency: u64,
    /// The fair class is EEVDF (else CFS).
    eevdf: bool,
    /// Scaled EEVDF base slice.
    slice: u64,
    /// RT throttling in force (`rt_runtime < rt_period`).
    throttling: bool,
    threads: Vec<Thread>,
    rqs: Vec<Rq>,
    /// The time of the last call (or of the deadline being handled).
    now: u64,
    // Per-CPU bitmasks, kept current eagerly.
    idle: u64,
    fair_curr: u64,
    rt_curr: u64,
    /// Per RT prio, the CPUs running a thread of that prio (index 0 unused).
    rt_prio_curr: Vec<u64>,
    throttled: u64,
    fair_queued: u64,
    rt_queued: u64,
    // Kept current at the end of each step (see `timer.rs`).
    /// CPUs with RT time, a running RT thread or a throttled queue.
    rt_period: u64,
    /// CPUs whose deadline and `rt_period` bit need recomputing.
    dirty: u64,
    deadlines: BTreeSet<(u64, Cpu)>,
    /// (prio, CPU) of every non-empty RT queue, highest prio first: the RT pull's index.
    rt_index: BTreeSet<(Reverse<u8>, Cpu)>,
    /// Fair queue insertion counter.
    seq: u64,
    next_period: u64,
    next_balance: u64,
    /// CPU pressure, when tracked (`psi.rs`).
    psi: Option<psi::Psi>,
    /// The sched_ext scheduler, when it replaces the fair class (`scx.rs`).
    scx: scx::Scx,
}

impl Host {
    pub fn new(p: HostParams) -> Host {
        assert!(
            (1..=64).contains(&p.cpus),
            "cpus must be 1..=64, got {}",
            p.cpus
        );
        assert!(
            p.sched_latency_ns > 0 && p.min_granularity_ns > 0,
            "CFS tunables must be > 0"
        );
        assert!(p.rr_timeslice_ns > 0, "rr_timeslice_ns must be > 0");
        assert!(p.base_slice_ns > 0, "base_slice_ns must be > 0");
        assert!(
            p.rt_period_ns > 0 && p.balance_interval_ns > 0,
            "intervals must be > 0"
        );
        let factor = 1 + u64::from(p.cpus.min(8).ilog2());
        let latency = p.sched_latency_ns * factor;
        let min_gran = p.min_granularity_ns * factor;
        Host {
            latency,
            min_gran,
            wakeup_gran: p.wakeup_granularity_ns * factor,
            nr_latency: (latency / min_gran).max(1),
            eevdf: p.fair == FairModel::Eevdf && p.scx.is_none(),
            slice: p.base_slice_ns * factor,
            throttling: p.rt_runtime_ns < p.rt_period_ns,
            threads: Vec::new(),
            rqs: (0..p.cpus).map(|_| Rq::new()).collect(),
            now: 0,
            idle: if p.cpus == 64 {
                u64::MAX
            } else {
                (1u64 << p.cpus) - 1
            },
            fair_curr: 0,
            rt_curr: 0,
            rt_prio_curr: vec![0; 100],
            throttled: 0,
            fair_queued: 0,
            rt_queued: 0,
            rt_period: 0,
            dirty: 0,
            deadlines: BTreeSet::new(),
            rt_index: BTreeSet::new(),
            seq: 0,
            next_period: p.rt_period_ns,
            next_balance: p.balance_interval_ns,
            psi: None,
            scx: scx::Scx::new(p.scx, p.cpus),
            p,
        }
    }

    /// A new thread, blocked. `affinity`: allowed CPUs (None = all).
    pub fn spawn(&mut self, class: Class, affinity: Option<Vec<Cpu>>) -> Tid {
        check_class(class);
        let all = self.idle | self.fair_curr | self.rt_curr;
        let mask = match affinity {
            None => all,
            Some(cpus) => cpus.iter().fold(0, |m, &c| {
                assert!(c < self.p.cpus, "affinity CPU {c} >= cpus {}", self.p.cpus);
                m | bit(c)
            }),
        };
        assert!(mask != 0, "empty affinity");
        let tid = Tid::try_from(self.threads.len()).expect("fewer than 2^32 threads");
        self.threads.push(Thread::new(
            class,
            weight_of(class),
            mask,
            self.p.rr_timeslice_ns,
        ));
        self.scx_spawned();
        tid
    }

    /// Wakes `tid` (no-op if not blocked). `waker_cpu`: the CPU the waker runs on, if any.
    pub fn wake(&mut self, now: u64, tid: Tid, waker_cpu: Option<Cpu>, out: &mut Vec<Switch>) {
        self.begin(now, out);
        if self.threads[tid as usize].state == ThreadState::Blocked {
            self.do_wake(tid, waker_cpu, out);
        }
        self.finish(now, out);
    }

    /// The running thread `tid` blocks.
    pub fn block(&mut self, now: u64, tid: Tid, out: &mut Vec<Switch>) {
        self.begin(now, out);
        let state = self.threads[tid as usize].state;
        debug_assert!(
            matches!(state, ThreadState::Running(_)),
            "block({tid}): {state:?}"
        );
        if let ThreadState::Running(c) = state {
            self.do_block(c, tid, out);
        }
        self.finish(now, out);
    }

    /// sched_setattr: changes class and re-evaluates preemption at once.
    pub fn set_class(&mut self, now: u64, tid: Tid, class: Class, out: &mut Vec<Switch>) {
        check_class(class);
        self.begin(now, out);
        if self.threads[tid as usize].class != class {
            let old = self.threads[tid as usize].class;
            if self.scx.on && (old.rt_prio().is_none() || class.rt_prio().is_none()) {
                self.scx_set_class(tid, class, out);
            } else {
                self.do_set_class(tid, class, out);
            }
        }
        self.finish(now, out);
    }

    pub fn state(&self, tid: Tid) -> ThreadState {
        self.threads[tid as usize].state
    }

    pub fn class(&self, tid: Tid) -> Class {
        self.threads[tid as usize].class
    }

    pub fn current(&self, cpu: Cpu) -> Option<Tid> {
        self.rqs[cpu as usize].curr
    }

    /// Whether the CPU `tid` last ran on runs nothing: what pvschedd's BPF
    /// program checks at a wakeup (`quiet_idle_wakeups`).
    pub fn last_cpu_idle(&self, tid: Tid) -> bool {
        let cpu = self.threads[tid as usize].cpu;
        self.rqs[cpu as usize].curr.is_none()
    }

    /// The stretch `tid` has run since its CPU's last accounting, if it is running.
    fn pending(&self, tid: Tid, now: u64) -> u64 {
        match self.threads[tid as usize].state {
            ThreadState::Running(c) => now.saturating_sub(self.rqs[c as usize].curr_start),
            _ => 0,
        }
    }

    /// Total CPU time of `tid` up to `now` (including the running stretch).
    pub fn cpu_time(&self, tid: Tid, now: u64) -> u64 {
        self.threads[tid as usize].sum_exec + self.pending(tid, now)
    }

    /// Total RT-class CPU time of `tid` up to `now`.
    pub fn rt_time(&self, tid: Tid, now: u64) -> u64 {
        let th = &self.threads[tid as usize];
        let running_rt = th.class.rt_prio().is_some();
        th.rt_exec
            + if running_rt {
                self.pending(tid, now)
            } else {
                0
            }
    }

    /// Number of runnable threads (running + queued) on `cpu`.
    pub fn nr_running(&self, cpu: Cpu) -> usize {
        let rq = &self.rqs[cpu as usize];
        let local = if self.scx.on {
            self.scx_local_len(cpu)
        } else {
            0
        };
        usize::from(rq.curr.is_some()) + rq.tree.len() + rq.rt_nr as usize + local
    }

    /// Whether `cpu`'s RT runqueue is throttled now.
    pub fn rt_throttled(&self, cpu: Cpu) -> bool {
        self.rqs[cpu as usize].throttled
    }

    pub fn cpus(&self) -> u32 {
        self.p.cpus
    }
}
