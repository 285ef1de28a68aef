//! pvsched's sched_ext scheduler in place of the fair class (mode `pvsched-scx`): a model of
//! `crates/host/src/bpf/sched_ext.bpf.c` and of the parts of the kernel's sched_ext core it
//! relies on. RT threads stay in the RT class above it, with every RT rule of `mod.rs`
//! (placement, push/pull, throttling); every fair-class thread is scheduled here instead of
//! by CFS or EEVDF. The module docs of `mod.rs` hold for the RT class; this file's rules
//! replace its fair ones (placement, balance, idle pull, slices, vruntime).
//!
//! **Queues.** Per CPU a local queue (FIFO) and a fair queue (`fair_dsq(cpu)`) ordered by
//! vtime (ties: insertion order); one shared BOOST queue (FIFO). A CPU that needs a task (its
//! task blocked, was preempted, or its slice ended; an RT thread left it) runs, below any RT
//! thread: its local queue's head; else (`pvs_dispatch`) the first BOOST task allowed on it;
//! else, with `own` the vtime of its fair queue's head (`fair_head`) or, at a slice end, its
//! task's vtime so far (`vtime_so_far`: its vtime at the start of its run plus what it ran
//! since, over its weight) if that is older or the queue is empty (`keep`), and `oldest` the
//! least head vtime of the other CPUs' fair queues (the first such CPU, `from`): from
//! `from`'s queue if there is no `own` or `oldest + slice_ns` is before it (a pull, counted
//! in `fair_pulls`); else its task runs on (`keep`, below); else its own queue's; else
//! (its own queue held only tasks that may not run here) `from`'s (a pull). Heads are
//! compared whatever their affinity; a queue is taken from at its first task allowed on the
//! CPU (the kernel's consume skips tasks whose affinity forbids the CPU), and one with none
//! gives nothing (the next rule applies). Every task in a CPU's fair queue may run on it
//! here (it is enqueued on an allowed CPU and this model changes no affinity), so the last
//! rule, kept as the program has it, is not reached. No other balance. As in the kernel,
//! nothing tells an idle CPU that a queue has a task (a wakeup goes to an idle CPU by
//! `select_cpu`, below); an idle CPU takes from the queues only when it is kicked or gets a
//! task.
//!
//! **Wakeup** (`pvs_select_cpu`, `scx_bpf_select_cpu_dfl` as this model has it): the previous
//! CPU if it is idle, else the first idle allowed CPU round robin from prev+1: a direct
//! dispatch to that CPU's local queue with a fresh slice and no boost (the thread's
//! `enq_boost`, `wake_boost` and `cs_preempted` are cleared). Else `enqueue` (wakeup) with the
//! thread on its previous CPU (the first allowed from prev+1 if prev is not allowed).
//!
//! **Enqueue** (`pvs_enqueue`; wakeup, or not: a slice end, a kick, a boosted insert's
//! preemption). For a registered thread (a vCPU or the VMM's main loop; `Host::scx_register`):
//! the boost is the daemon's grant boost if it holds (`boost_holds`: a proactive boost, or a
//! thread without a slot, always; a guest one while the slot showed a guest reason when the
//! thread last stopped: RT work, a critical section or a pending RT wakeup), else 0; then the
//! kernel-boost rule (`kernel_boost`): a wakeup first repays the thread's burst (`kburst`:
//! its own boosted run time, less every run not boosted at all) by the time it was halted;
//! none unless the grant's `kboost` > 0, the thread's `kboost_ns` < `kboost_allowed_ns` and
//! it is not throttled; a burst above `max_boost_ns` throttles it (no boost of the
//! program's for `throttle_ns`, the burst forgotten); one above `demote_after_ns` boosts at
//! priority 1 (demoted: counted in `kboost_demoted_ns`); RT if the slot showed guest RT work at the last stop or
//! (a wakeup) the thread halted within `halt_window_ns` of guest RT work; CS if (not a
//! wakeup) it was preempted in a critical section and the grant allows critical sections;
//! WAKE if a wakeup and the grant allows wakeups with `wake_boost_ns` > 0. A reason whose
//! `kboost` is above the daemon's boost wins (counted in `kboosts`; a WAKE boost gets a
//! slice of `wake_boost_ns`, any other `slice_ns`). `wake_boost` and `cs_preempted` are
//! cleared. A boosted thread goes, if its CPU runs a task of a weaker boost (`cpu_boost`:
//! set when a task starts running, 0 for an unboosted one, cleared when it stops, so 0 on an
//! idle CPU and on one running an RT thread), to the head of that CPU's local queue,
//! preempting the fair task running there (`SCX_ENQ_PREEMPT`, which implies the head; an RT
//! thread is not preempted: the boosted thread waits for it); else to the tail of BOOST,
//! and the first CPU from 0 whose `cpu_boost` is weaker is kicked (its fair task preempted,
//! or, idle, it picks; a CPU running an RT thread does nothing). An unboosted thread goes to
//! its CPU's fair queue (`scx_bpf_task_cpu`: the CPU it last ran on or was placed on, above)
//! at `vtime = max(vtime, vtime_now - slice_ns)` with a slice of `slice_ns`; a woken
//! one then kicks its CPU if the unboosted fair task running there is ahead of it by more
//! than `wakeup_preempt_ns` of vtime as of now (`preempt_on_wakeup`: its vtime at the start
//! of its run plus what it ran since, over its weight).
//!
//! **Running and stopping** (`pvs_running`, `pvs_stopping`). Running: `vtime_now = max(
//! vtime_now, vtime)`, `cpu_boost` = the boost decided at its last enqueue, a registered
//! thread's run starts (boosted or not, and the kernel reason). Stopping (it blocks, is
//! preempted, or its slice ended and another task takes the CPU): `used` = the time it ran
//! since it started running (the BPF's `se.sum_exec_runtime` difference, so a slice resumed
//! after an RT preemption or a run kept on at a slice end counts what it ran); an unboosted
//! run is charged `vtime += used * 1024 / weight` (the BPF's `* 100 / weight` with its
//! weight 100 at nice 0; the model's nice weights), a boosted one nothing; a run under a
//! kernel boost adds its time to `kboost_ns` (and `kboost_cs_ns` for CS). Then, for a
//! thread with a slot, what the next enqueue
//! decides (`vcpu_stopping`), from the engine's [`ScxGuestView`] of its guest at that
//! instant: `guest_reason` (RT work, a critical section or a pending RT wakeup shown),
//! `guest_rt` (RT work: the current guest task FIFO/RR/DEADLINE or a boost request, the vCPU
//! not idle), `cs_preempted` (runnable and in a critical section), `last_rt` (now, if RT
//! work is shown or the guest's `rt_switch_count` moved since the last stop), `wake_boost`
//! (blocked, `halt_window_ns` > 0, and `last_rt` within it). A thread never run has `vtime =
//! vtime_now` at spawn (`pvs_enable`).
//!
//! **Slices.** A slice end (exact here; the kernel notices it at the next tick, 4 ms at
//! HZ=250): a registered thread with a slot whose guest shows a critical section, that
//! had no extension in this slice, and whose CPU something would take from it (the pick
//! below, with it as `prev`, neither keeps it nor finds nothing: `cpu_wanted`) gets one of `extension_ns` if its total `ext_ns +
//! extension_ns` stays within its record's `ext_allowed_ns` (`pvs_tick`; else
//! `ext_refused`). It runs in pieces of `extension_poll_ns` (the poll's timer): at each the
//! guest is read again, and one out of its critical section ends the extension there
//! (`ext_ended_early`); it is charged, when it ends (at the stop, or when the thread is kept
//! for another slice), for what it ran (`close_extension`). Otherwise the CPU picks as
//! above *before* the thread is put back (the kernel's `balance_one` calls `ops.dispatch`
//! first, with the thread as `prev`, still `SCX_TASK_QUEUED`): if it finds a task, the
//! thread stops and is enqueued (not a wakeup; into this CPU's fair queue if unboosted) and
//! the found task runs; if `pvs_dispatch` keeps
//! it, it runs on with a fresh slice of `slice_ns`, without stopping, enqueue or
//! `pvs_running` (so `vtime_now` is not raised, and it is charged only when it stops, for the
//! whole run since it started running; `cpu_boost` and the run's boost carry on); if nothing
//! is found (its own queue's older tasks all forbid the CPU, no pull; not reached here,
//! above), the kernel keeps it (no `SCX_OPS_ENQ_LAST`) on a refilled slice of its default
//! 20 ms (`SCX_SLICE_DFL`), likewise. The same holds for a kick or a preempting insert (its
//! slice set to 0; the local head or BOOST then goes first). A thread put back by its own
//! CPU's switch finds `cpu_boost` 0 there: boosted, it goes to that CPU's local head and runs
//! next after the task just picked.
//!
//! **RT preemption.** An RT thread that takes a CPU from a fair task: the task stops
//! (runnable) and goes back to the head of that CPU's local queue with its slice left
//! (`put_prev_task_scx`; no enqueue), or, with no slice left, through enqueue.
//!
//! **The daemon's side** (`pvsched-scx`, `engine`): grants ([`Host::scx_set_boost`]: a
//! boost newly granted to a thread waiting in its CPU's fair queue, where `pvs_boost_queued`
//! looks for it, moves it at once: to that CPU's local head preempting a weaker task, else to
//! BOOST's tail without a kick) and
//! allowances ([`Host::scx_allow`]); it reads [`ScxStats`].
//!
//! **Not modelled.** The scheduler's IPIs and kicks cost nothing and act at once; the tick
//! (slice ends are exact); `SCX_OPS_ENQ_LAST`, `cpu_release` and bypass mode; failed slot
//! reads; `queued_at` delay histograms; the BPF's maps' capacity (4096 threads).

use std::collections::{BTreeSet, VecDeque};

use pvsched_policy::KernelGrant;

use super::rq::{bit, rr_first};
use super::{weight_of, Class, Cpu, Host, Switch, SwitchOut, ThreadState, Tid};

/// The kernel's `SCX_SLICE_DFL`: the slice a task the kernel keeps on its CPU (`ops.dispatch`
/// found nothing and did not keep it) gets refilled with.
pub const SCX_SLICE_DFL_NS: u64 = 20_000_000;

/// The BPF scheduler's tunables (`SchedExtOptions`, pvschedd's defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ScxParams {
    /// `slice_ns`: every task's slice.
    pub slice_ns: u64,
    /// `extension_ns`: one extension per slice for a vCPU in a critical section; 0: none.
    pub extension_ns: u64,
    /// `extension_poll_ns`: while a thread runs an extension, its slot is read every this
    /// long from the grant, and the extension ends at the first read that finds no critical
    /// section; 0: every extension runs its length.
    pub extension_poll_ns: u64,
    /// `wakeup_preempt_ns`: a woken unboosted task preempts the unboosted fair task running
    /// on its CPU when that one's vtime (as of now) is ahead by more than this; 0 (pvschedd's
    /// default): never.
    pub wakeup_preempt_ns: u64,
}

impl Default for ScxParams {
    fn default() -> ScxParams {
        ScxParams {
            slice_ns: 5_000_000,
            extension_ns: 4_000_000,
            extension_poll_ns: 250_000,
            wakeup_preempt_ns: 0,
        }
    }
}

/// What the BPF reads from a vCPU's slot when its thread stops (`slot_guest_reason`) and at a
/// slice end (`cs_flags`), as the engine keeps it for the thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScxGuestView {
    /// The guest half says idle (or not active).
    pub idle: bool,
    /// The current guest task is FIFO/RR/DEADLINE, or asks for a boost.
    pub rt: bool,
    /// A critical-section flag is set.
    pub cs: bool,
    /// An RT wakeup is pending (`guest_pending` valid).
    pub pending: bool,
    /// The guest's `rt_switch_count`.
    pub rt_switches: u64,
}

/// What the daemon allows a thread at each scan (`pvs_scx_grant`'s other fields), as
/// pvschedd's `ScxAllowance` has it: the policy's terms for the scheduler's own boosts
/// (`KernelGrant`: the priority, the halt window, critical sections, wakeups, the burst
/// rules; its `allowance_ns` is folded into `kboost_allowed_ns`) and the two totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScxAllowance {
    /// Total extension time allowed since registration (`ext_allowed_ns`).
    pub extension_ns: u64,
    /// Total kernel-boosted time allowed (`kboost_allowed_ns`).
    pub kboost_allowed_ns: u64,
    pub kernel: KernelGrant,
}

/// Why the scheduler boosted a thread itself (`pvs_scx_kreason`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KReason {
    #[default]
    None,
    Rt,
    Cs,
    Wake,
}

/// What the scheduler did for a registered thread (`pvs_scx_vcpu`'s counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScxStats {
    pub kboost_ns: u64,
    pub kboost_cs_ns: u64,
    /// Of `kboost_ns`, run demoted.
    pub kboost_demoted_ns: u64,
    pub kthrottles: u64,
    pub kboosts: u64,
    /// Extension time run: each extension charged when it ends, at most `extension_ns`.
    pub ext_ns: u64,
    pub ext_count: u64,
    pub ext_refused: u64,
    /// Extensions a poll ended once the guest left its critical section.
    pub ext_ended_early: u64,
    pub boost_preempts: u64,
    pub boost_queued: u64,
    pub boost_dropped: u64,
}

/// A registered thread's grant and the program's record of it.
#[derive(Clone, Debug, Default)]
struct Reg {
    // pvs_scx_grant
    slot: bool,
    boost: u32,
    proactive: bool,
    allow: ScxAllowance,
    // pvs_scx_vcpu
    guest_reason: bool,
    guest_rt: bool,
    cs_preempted: bool,
    wake_boost: bool,
    last_rt: Option<u64>,
    rt_switches: u64,
    enq_boost: u32,
    enq_kreason: KReason,
    run_boosted: bool,
    run_kreason: KReason,
    run_start: u64,
    ext_in_slice: u64,
    /// When the extension running now started.
    ext_at: u64,
    /// The extension's slice ends at its next poll, not at its end (`extension_poll_ns`).
    ext_poll_due: bool,
    /// Boosted time of its own not yet matched by halted or unboosted time.
    kburst: u64,
    /// When it stopped halted (repaid at the wakeup).
    halted_at: Option<u64>,
    kthrottled_until: u64,
    enq_demoted: bool,
    run_demoted: bool,
    stats: ScxStats,
    /// The guest as the engine last showed it.
    view: ScxGuestView,
}

/// What a CPU that needs a task gets ([`Host::scx_pick`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pick {
    /// Its local queue's head.
    Local,
    /// BOOST's task at this index.
    Boost(usize),
    /// This entry of this CPU's fair queue (another CPU's: a pull).
    Fair(Cpu, (i64, u64, Tid)),
    /// `prev` runs on, on a fresh slice.
    Keep,
    Nothing,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    No,
    Local,
    Boost,
    Fair,
}

#[derive(Clone, Debug)]
struct Task {
    vtime: i64,
    /// `p->scx.slice`: what is left, as of its CPU's last accounting while it runs.
    slice: u64,
    /// Its run time (`sum_exec`) when it last started running.
    exec_at_run: u64,
    seq: u64,
    at: Where,
    reg: Option<Box<Reg>>,
}

/// The scheduler's state (empty and unused unless `on`).
#[derive(Default)]
pub(super) struct Scx {
    pub on: bool,
    p: ScxParams,
    tasks: Vec<Task>,
    local: Vec<VecDeque<Tid>>,
    boost: VecDeque<Tid>,
    /// Per CPU its fair queue (`fair_dsq(cpu)`), by vtime, then insertion.
    fair: Vec<BTreeSet<(i64, u64, Tid)>>,
    vtime_now: i64,
    /// Woken tasks that preempted a running one (`totals.wakeup_preempts`).
    pub wakeup_preempts: u64,
    /// Tasks a CPU took from another CPU's fair queue (`totals.fair_pulls`).
    pub fair_pulls: u64,
    cpu_boost: Vec<u32>,
    seq: u64,
    /// CPUs inside their own switch: a kick or preempting insert there does nothing more
    /// (the CPU has picked already; the kernel's `rq->curr` is still the task being put).
    switching: u64,
}

impl Scx {
    pub fn new(p: Option<ScxParams>, cpus: u32) -> Scx {
        match p {
            None => Scx::default(),
            Some(p) => Scx {
                on: true,
                p,
                local: (0..cpus).map(|_| VecDeque::new()).collect(),
                fair: (0..cpus).map(|_| BTreeSet::new()).collect(),
                cpu_boost: vec![0; cpus as usize],
                ..Scx::default()
            },
        }
    }
}

impl Host {
    /// Whether `t` is scheduled by the sched_ext model.
    pub(super) fn on_scx(&self, t: Tid) -> bool {
        self.scx.on && !self.is_rt(t)
    }

    pub(super) fn scx_spawned(&mut self) {
        if self.scx.on {
            let vtime = self.scx.vtime_now;
            self.scx.tasks.push(Task {
                vtime,
                slice: self.scx.p.slice_ns,
                exec_at_run: 0,
                seq: 0,
                at: Where::No,
                reg: None,
            });
        }
    }

    // ---- the daemon's and the engine's interface ----

    /// Registers `tid` with the scheduler (`SchedExt::register`): a vCPU thread (`slot`: the
    /// program reads its guest) or a latency-path thread. No boost, nothing allowed yet.
    pub fn scx_register(&mut self, tid: Tid, slot: bool) {
        if let Some(task) = self.scx.tasks.get_mut(tid as usize) {
            task.reg = Some(Box::new(Reg {
                slot,
                ..Reg::default()
            }));
        }
    }

    /// The guest of `tid` as it is now (what its slot would show).
    pub fn scx_set_view(&mut self, tid: Tid, view: ScxGuestView) {
        if let Some(r) = self.reg_mut(tid) {
            r.view = view;
        }
    }

    /// The daemon's allowance for `tid` (its scan, `SchedExt::allow`).
    pub fn scx_allow(&mut self, tid: Tid, allow: ScxAllowance) {
        if let Some(r) = self.reg_mut(tid) {
            r.allow = allow;
        }
    }

    /// The daemon's boost for `tid` (`SchedExt::set_boost`; 0: none): `proactive`, it holds
    /// until the daemon ends it, else while the slot backs it. A boost at the priority in
    /// force already changes nothing (pvschedd makes no call then). A boost newly granted to a
    /// thread waiting in its CPU's fair queue moves it ahead at once (`pvs_boost_queued`).
    pub fn scx_set_boost(
        &mut self,
        now: u64,
        tid: Tid,
        boost: u8,
        proactive: bool,
        out: &mut Vec<Switch>,
    ) {
        self.begin(now, out);
        let boost = u32::from(boost);
        let moved = match self.reg_mut(tid) {
            Some(r) if r.boost != boost => {
                let was = r.boost != 0;
                r.boost = boost;
                r.proactive = proactive;
                boost != 0 && !was
            }
            _ => false,
        };
        if moved && self.scx.tasks[tid as usize].at == Where::Fair {
            self.boost_queued(tid, boost, out);
        }
        self.finish(now, out);
    }

    /// What the scheduler did for `tid`, if registered.
    pub fn scx_stats(&self, tid: Tid) -> Option<ScxStats> {
        let task = self.scx.tasks.get(tid as usize)?;
        task.reg.as_ref().map(|r| r.stats)
    }

    /// `tid`'s vtime (tests).
    #[cfg(test)]
    pub(super) fn scx_vtime(&self, tid: Tid) -> i64 {
        self.scx.tasks[tid as usize].vtime
    }

    /// Which queue `tid` waits in: "local", "boost", "fair" or "" (tests).
    #[cfg(test)]
    pub(super) fn scx_queue_of(&self, tid: Tid) -> &'static str {
        match self.scx.tasks[tid as usize].at {
            Where::No => "",
            Where::Local => "local",
            Where::Boost => "boost",
            Where::Fair => "fair",
        }
    }

    /// `tid`'s slice left as of its CPU's last accounting (tests).
    #[cfg(test)]
    pub(super) fn scx_slice(&self, tid: Tid) -> u64 {
        self.scx.tasks[tid as usize].slice
    }

    fn reg_mut(&mut self, tid: Tid) -> Option<&mut Reg> {
        self.scx.tasks.get_mut(tid as usize)?.reg.as_deref_mut()
    }

    // ---- wakeup and enqueue ----

    /// A fair thread wakes: `pvs_select_cpu`, then a direct dispatch or `pvs_enqueue`.
    pub(super) fn scx_wake(&mut self, t: Tid, out: &mut Vec<Switch>) {
        let th = &self.threads[t as usize];
        let (prev, aff) = (th.cpu, th.affinity);
        let idle = self.idle & !self.scx.switching & aff;
        let target = if idle & bit(prev) != 0 {
            Some(prev)
        } else {
            rr_first(idle, prev + 1)
        };
        if let Some(c) = target {
            if let Some(r) = self.reg_mut(t) {
                r.enq_boost = 0;
                r.enq_kreason = KReason::None;
                r.wake_boost = false;
                r.cs_preempted = false;
            }
            let slice = self.scx.p.slice_ns;
            self.insert_local(c, t, slice, false, false, out);
            return;
        }
        let c = if aff & bit(prev) != 0 {
            prev
        } else {
            rr_first(aff, prev + 1).unwrap_or(prev)
        };
        self.threads[t as usize].cpu = c;
        self.scx_enqueue(t, true, out);
    }

    /// `pvs_enqueue`.
    fn scx_enqueue(&mut self, t: Tid, wakeup: bool, out: &mut Vec<Switch>) {
        let (now, slice_ns) = (self.now, self.scx.p.slice_ns);
        let (mut boost, mut slice) = (0u32, slice_ns);
        if let Some(r) = self.reg_mut(t) {
            if r.boost > 0 && boost_holds(r) {
                boost = r.boost;
            }
            let why = kernel_boost(r, wakeup, now);
            r.wake_boost = false;
            r.cs_preempted = false;
            let a = r.allow;
            let k = a.kernel;
            let demoted = k.demote_after_ns > 0 && r.kburst > k.demote_after_ns;
            let kboost = if demoted { 1 } else { u32::from(k.priority) };
            r.enq_demoted = kboost < u32::from(k.priority);
            let why = if why != KReason::None && kboost > boost {
                boost = kboost;
                r.stats.kboosts += 1;
                if why == KReason::Wake {
                    slice = r.allow.kernel.wake_boost_ns;
                }
                why
            } else {
                KReason::None
            };
            r.enq_kreason = why;
            r.enq_boost = boost;
        }
        if boost > 0 {
            self.enqueue_boosted(t, boost, slice, out);
            return;
        }
        let floor = self.scx.vtime_now.saturating_sub(slice_ns as i64);
        let c = self.threads[t as usize].cpu;
        let s = &mut self.scx;
        let task = &mut s.tasks[t as usize];
        task.vtime = task.vtime.max(floor);
        task.slice = slice_ns;
        task.at = Where::Fair;
        s.seq += 1;
        task.seq = s.seq;
        s.fair[c as usize].insert((task.vtime, task.seq, t));
        self.threads[t as usize].state = ThreadState::Runnable(c);
        self.dirty |= bit(c);
        if wakeup {
            self.preempt_on_wakeup(t, c, out);
        }
    }

    /// `preempt_on_wakeup`: `t`, woken into its CPU's fair queue, preempts the unboosted fair
    /// task running on its CPU `c` if that one's vtime as of now ([`Host::vtime_so_far`]) is
    /// ahead of `t`'s by more than `wakeup_preempt_ns`: a kick, after which `c` picks
    /// (`pvs_dispatch`, [`Host::scx_pick`]).
    fn preempt_on_wakeup(&mut self, t: Tid, c: Cpu, out: &mut Vec<Switch>) {
        let gran = self.scx.p.wakeup_preempt_ns;
        let Some(cur) = self.rqs[c as usize].curr else {
            return;
        };
        if gran == 0 || self.is_rt(cur) || self.scx.cpu_boost[c as usize] != 0 {
            return;
        }
        let curr = self.vtime_so_far(cur);
        if self.scx.tasks[t as usize].vtime + (gran as i64) < curr {
            self.scx.wakeup_preempts += 1;
            self.scx_kick(c, out);
        }
    }

    /// `enqueue_boosted`: onto its CPU at once if that runs a weaker boost, else BOOST and a
    /// kick of the first CPU running a weaker one.
    fn enqueue_boosted(&mut self, t: Tid, boost: u32, slice: u64, out: &mut Vec<Switch>) {
        let c = self.threads[t as usize].cpu;
        if self.scx.cpu_boost[c as usize] < boost {
            if let Some(r) = self.reg_mut(t) {
                r.stats.boost_preempts += 1;
            }
            self.insert_local(c, t, slice, true, true, out);
            return;
        }
        if let Some(r) = self.reg_mut(t) {
            r.stats.boost_queued += 1;
        }
        let task = &mut self.scx.tasks[t as usize];
        task.slice = slice;
        task.at = Where::Boost;
        self.scx.boost.push_back(t);
        self.threads[t as usize].state = ThreadState::Runnable(c);
        self.dirty |= bit(c);
        if let Some(k) = (0..self.p.cpus).find(|&k| self.scx.cpu_boost[k as usize] < boost) {
            self.scx_kick(k, out);
        }
    }

    /// Puts `t` on `c`'s local queue with `slice` (at the head if `head`); `preempt`: the
    /// fair task running there gives way (`SCX_ENQ_PREEMPT`). An idle CPU picks at once.
    fn insert_local(
        &mut self,
        c: Cpu,
        t: Tid,
        slice: u64,
        head: bool,
        preempt: bool,
        out: &mut Vec<Switch>,
    ) {
        let task = &mut self.scx.tasks[t as usize];
        task.slice = slice;
        task.at = Where::Local;
        let q = &mut self.scx.local[c as usize];
        if head {
            q.push_front(t);
        } else {
            q.push_back(t);
        }
        let th = &mut self.threads[t as usize];
        th.cpu = c;
        th.state = ThreadState::Runnable(c);
        self.dirty |= bit(c);
        if self.scx.switching & bit(c) != 0 {
            return;
        }
        match self.rqs[c as usize].curr {
            None => self.schedule(c, None, false, out),
            Some(cur) if preempt && !self.is_rt(cur) => {
                self.update_curr(c);
                self.scx.tasks[cur as usize].slice = 0;
                self.scx_resched(c, out);
            }
            Some(_) => {}
        }
    }

    /// `scx_bpf_kick_cpu(c, SCX_KICK_PREEMPT)`: a fair task running there gives way; an idle
    /// CPU picks; an RT one runs on.
    fn scx_kick(&mut self, c: Cpu, out: &mut Vec<Switch>) {
        if self.scx.switching & bit(c) != 0 {
            return;
        }
        match self.rqs[c as usize].curr {
            None => self.schedule(c, None, false, out),
            Some(cur) if !self.is_rt(cur) => {
                self.update_curr(c);
                self.scx.tasks[cur as usize].slice = 0;
                self.scx_resched(c, out);
            }
            Some(_) => {}
        }
    }

    /// `pvs_boost_queued`: `t`, just granted `boost`, waits in its CPU's fair queue: to that
    /// CPU's local head preempting a weaker task, else to BOOST's tail (no kick).
    fn boost_queued(&mut self, t: Tid, boost: u32, out: &mut Vec<Switch>) {
        self.scx_dequeue(t);
        if let Some(r) = self.reg_mut(t) {
            r.enq_boost = boost;
            r.enq_kreason = KReason::None;
        }
        let c = self.threads[t as usize].cpu;
        let slice = self.scx.tasks[t as usize].slice;
        if self.scx.cpu_boost[c as usize] < boost {
            self.insert_local(c, t, slice, true, true, out);
        } else {
            self.scx.tasks[t as usize].at = Where::Boost;
            self.scx.boost.push_back(t);
            self.dirty |= bit(c);
        }
    }

    /// Takes the queued `t` off its scheduler queue (its state is left to the caller).
    fn scx_dequeue(&mut self, t: Tid) {
        let c = self.threads[t as usize].cpu;
        let s = &mut self.scx;
        let task = &mut s.tasks[t as usize];
        match task.at {
            Where::No => {}
            Where::Local => {
                let q = &mut s.local[c as usize];
                if let Some(i) = q.iter().position(|&x| x == t) {
                    q.remove(i);
                }
            }
            Where::Boost => {
                if let Some(i) = s.boost.iter().position(|&x| x == t) {
                    s.boost.remove(i);
                }
            }
            Where::Fair => {
                s.fair[c as usize].remove(&(task.vtime, task.seq, t));
            }
        }
        task.at = Where::No;
        self.dirty |= bit(c);
    }

    // ---- picking, running, stopping ----

    /// `t`'s vtime as of now (`vtime_so_far`; `preempt_on_wakeup`'s too): its vtime at the
    /// start of its run plus what it ran since, over its weight (not yet charged).
    fn vtime_so_far(&self, t: Tid) -> i64 {
        let th = &self.threads[t as usize];
        let task = &self.scx.tasks[t as usize];
        let ran = (th.sum_exec + self.pending(t, self.now)).saturating_sub(task.exec_at_run);
        task.vtime + (u128::from(ran) * 1024 / u128::from(th.weight.max(1))) as i64
    }

    /// What `c` runs next (nothing is taken): its local head (the kernel looks there before
    /// `ops.dispatch`); else `pvs_dispatch` with `prev`, `c`'s fair task whose slice ended
    /// (runnable; `None`: `c`'s task left it): the first BOOST task allowed on `c`; else,
    /// with `own` the vtime of the head of `c`'s fair queue, or `prev`'s vtime so far if that
    /// is older or the queue is empty (then `prev` is kept), and `oldest` the least head vtime
    /// of the other CPUs' fair queues (the first such CPU): `oldest`'s queue's first task
    /// allowed on `c` (a pull) if `own` is none or more than `slice_ns` newer; else `prev`
    /// kept; else the first task of `c`'s own queue allowed on it; else `oldest`'s queue's (a
    /// pull). Heads are compared whatever their affinity; a queue is taken from at its first
    /// task allowed on `c` (the kernel's consume), and one that has none gives nothing.
    fn scx_pick(&self, c: Cpu, prev: Option<Tid>) -> Pick {
        let s = &self.scx;
        if !s.local[c as usize].is_empty() {
            return Pick::Local;
        }
        if let Some(i) = s.boost.iter().position(|&t| self.allowed(t, c)) {
            return Pick::Boost(i);
        }
        let head = |q: usize| s.fair[q].first().map(|k| k.0);
        let first_allowed = |q: Cpu| {
            let k = s.fair[q as usize].iter().find(|k| self.allowed(k.2, c))?;
            Some(Pick::Fair(q, *k))
        };
        let mut own = head(c as usize);
        let mut keep = false;
        if let Some(p) = prev {
            let vt = self.vtime_so_far(p);
            if own.is_none_or(|o| vt < o) {
                own = Some(vt);
                keep = true;
            }
        }
        let mut other: Option<(i64, Cpu)> = None;
        for q in (0..s.fair.len()).filter(|&q| q != c as usize) {
            if let Some(v) = head(q) {
                if other.is_none_or(|(o, _)| v < o) {
                    other = Some((v, q as Cpu));
                }
            }
        }
        if let Some((oldest, from)) = other {
            let slice = s.p.slice_ns as i64;
            if own.is_none_or(|o| oldest + slice < o) {
                if let Some(p) = first_allowed(from) {
                    return p;
                }
            }
        }
        if keep {
            return Pick::Keep;
        }
        if let Some(p) = own.and_then(|_| first_allowed(c)) {
            return p;
        }
        // Its own queue held only tasks that may not run here.
        other
            .and_then(|(_, from)| first_allowed(from))
            .unwrap_or(Pick::Nothing)
    }

    /// Whether `c`, its task gone, would find a task ([`Host::scx_pick`] without `prev`).
    pub(super) fn scx_has_work(&self, c: Cpu) -> bool {
        self.scx_pick(c, None) != Pick::Nothing
    }

    /// The task `c` runs next, its task gone, off its queue ([`Host::scx_pick`]).
    pub(super) fn scx_take(&mut self, c: Cpu) -> Option<Tid> {
        let pick = self.scx_pick(c, None);
        self.scx_take_pick(c, pick)
    }

    /// Takes `pick`'s task off its queue onto `c` (counting a pull); `None` for no task.
    fn scx_take_pick(&mut self, c: Cpu, pick: Pick) -> Option<Tid> {
        let s = &mut self.scx;
        let t = match pick {
            Pick::Local => s.local[c as usize].pop_front()?,
            Pick::Boost(i) => s.boost.remove(i)?,
            Pick::Fair(q, k) => {
                s.fair[q as usize].remove(&k);
                if q != c {
                    s.fair_pulls += 1;
                }
                k.2
            }
            Pick::Keep | Pick::Nothing => return None,
        };
        s.tasks[t as usize].at = Where::No;
        let from = self.threads[t as usize].cpu;
        self.threads[t as usize].cpu = c;
        self.dirty |= bit(c) | bit(from);
        Some(t)
    }

    /// The length of `c`'s local queue.
    pub(super) fn scx_local_len(&self, c: Cpu) -> usize {
        self.scx.local[c as usize].len()
    }

    /// `pvs_running`: `t` starts running on `c`.
    pub(super) fn scx_running(&mut self, c: Cpu, t: Tid) {
        let now = self.now;
        let exec = self.threads[t as usize].sum_exec;
        let s = &mut self.scx;
        let task = &mut s.tasks[t as usize];
        task.exec_at_run = exec;
        s.vtime_now = s.vtime_now.max(task.vtime);
        s.cpu_boost[c as usize] = match task.reg.as_deref_mut() {
            Some(r) => {
                r.run_boosted = r.enq_boost != 0;
                r.run_kreason = r.enq_kreason;
                r.run_demoted = r.enq_kreason != KReason::None && r.enq_demoted;
                r.run_start = now;
                close_extension(r, now, s.p.extension_ns);
                r.enq_boost
            }
            None => 0,
        };
    }

    /// `pvs_stopping`: `t` (accounted) leaves `c`, `runnable` (preempted) or blocked.
    pub(super) fn scx_stopping(&mut self, c: Cpu, t: Tid, runnable: bool) {
        let now = self.now;
        let (weight, exec) = (
            self.threads[t as usize].weight,
            self.threads[t as usize].sum_exec,
        );
        let ext = self.scx.p.extension_ns;
        let task = &mut self.scx.tasks[t as usize];
        let used = exec.saturating_sub(task.exec_at_run);
        task.exec_at_run = exec;
        let mut boosted = false;
        if let Some(r) = task.reg.as_deref_mut() {
            close_extension(r, now, ext);
            boosted = r.run_boosted;
            r.run_boosted = false;
            vcpu_stopping(r, now, runnable, boosted);
        }
        if !boosted {
            task.vtime += (u128::from(used) * 1024 / u128::from(weight)) as i64;
        }
        self.scx.cpu_boost[c as usize] = 0;
    }

    /// `c`'s fair task `t` (accounted, off `curr`, not yet switched out) is put back after
    /// stopping: with slice left to its CPU's local head, else through enqueue.
    fn scx_put_prev(&mut self, c: Cpu, t: Tid, out: &mut Vec<Switch>) {
        let slice = self.scx.tasks[t as usize].slice;
        if slice > 0 {
            self.insert_local(c, t, slice, true, false, out);
        } else {
            self.scx_enqueue(t, false, out);
        }
    }

    /// An RT thread takes `c` from its fair task `t` (accounted; `curr` already cleared): it
    /// stops, and goes back with its slice left (`put_prev_task_scx`).
    pub(super) fn scx_preempted_by_rt(&mut self, c: Cpu, t: Tid, out: &mut Vec<Switch>) {
        self.scx.switching |= bit(c);
        self.scx_stopping(c, t, true);
        self.threads[t as usize].state = ThreadState::Runnable(c);
        self.scx_put_prev(c, t, out);
        self.scx.switching &= !bit(c);
    }

    /// `c`'s fair task has no slice left (its slice ended, a preempting insert or a kick):
    /// the CPU picks first with it as `prev` ([`Host::scx_pick`]); the task stops and is
    /// enqueued if something else runs, else it keeps running: on `slice_ns` if
    /// `pvs_dispatch` kept it, else on the kernel's default slice.
    pub(super) fn scx_resched(&mut self, c: Cpu, out: &mut Vec<Switch>) {
        self.update_curr(c);
        let Some(prev) = self.rqs[c as usize].curr else {
            return;
        };
        let rq = &self.rqs[c as usize];
        if !rq.throttled && rq.rt_nr > 0 {
            self.preempt_curr(c, out);
            return;
        }
        self.scx.switching |= bit(c);
        let pick = self.scx_pick(c, Some(prev));
        let keep = pick == Pick::Keep;
        let Some(next) = self.scx_take_pick(c, pick) else {
            // Kept by `pvs_dispatch` on a fresh slice; or, nothing found, by the kernel (no
            // `SCX_OPS_ENQ_LAST`) on its default one. Not stopped, not charged yet.
            let (slice_ns, ext, now) = (self.scx.p.slice_ns, self.scx.p.extension_ns, self.now);
            let task = &mut self.scx.tasks[prev as usize];
            if keep {
                task.slice = slice_ns;
                // Its extension is over: the next slice end may grant one.
                if let Some(r) = task.reg.as_deref_mut() {
                    close_extension(r, now, ext);
                }
            } else if task.slice == 0 {
                task.slice = SCX_SLICE_DFL_NS;
            }
            self.scx.switching &= !bit(c);
            self.dirty |= bit(c);
            return;
        };
        self.rqs[c as usize].curr = None;
        self.scx_stopping(c, prev, true);
        self.threads[prev as usize].state = ThreadState::Runnable(c);
        // Switched out before anything the put-back sets off elsewhere can switch it in.
        out.push(Switch {
            at: self.now,
            cpu: c,
            prev: Some((prev, SwitchOut::Preempted)),
            next: Some(next),
        });
        self.scx_put_prev(c, prev, out);
        self.set_curr(c, Some(next));
        self.scx_running(c, next);
        self.scx.switching &= !bit(c);
    }

    /// `c`'s fair task `t` reached the end of its slice (accounted): `pvs_tick`'s extension,
    /// else a resched.
    pub(super) fn scx_slice_end(&mut self, c: Cpu, t: Tid, out: &mut Vec<Switch>) {
        if self.scx.tasks[t as usize].slice > 0 {
            return;
        }
        let (ext, poll, now) = (
            self.scx.p.extension_ns,
            self.scx.p.extension_poll_ns,
            self.now,
        );
        // The extension runs in pieces of `poll` (the poll's timer): the slice ends at each.
        let piece = |left: u64| if poll > 0 && poll < left { poll } else { left };
        // `cpu_wanted`: with nothing that would take the CPU, the dispatch keeps the thread
        // running, and no extension is looked at.
        let wanted = !matches!(self.scx_pick(c, Some(t)), Pick::Keep | Pick::Nothing);
        let task = &mut self.scx.tasks[t as usize];
        if let Some(r) = task.reg.as_deref_mut() {
            if r.ext_poll_due {
                // A poll: still in its critical section, the extension runs on; out of it,
                // it ends here.
                r.ext_poll_due = false;
                let left = (r.ext_at + ext).saturating_sub(now);
                if r.view.cs && left > 0 {
                    task.slice = piece(left);
                    r.ext_poll_due = task.slice < left;
                    self.dirty |= bit(c);
                    return;
                }
                if !r.view.cs {
                    r.stats.ext_ended_early += 1;
                }
            } else if ext > 0 && r.slot && r.ext_in_slice == 0 && r.view.cs && wanted {
                if r.stats.ext_ns + ext > r.allow.extension_ns {
                    r.stats.ext_refused += 1;
                } else {
                    task.slice = piece(ext);
                    r.ext_poll_due = task.slice < ext;
                    r.stats.ext_count += 1;
                    r.ext_in_slice = ext;
                    r.ext_at = now;
                    self.dirty |= bit(c);
                    return;
                }
            }
        }
        self.scx_resched(c, out);
    }

    /// When `c`'s running fair task `t`'s slice ends.
    pub(super) fn scx_deadline(&self, c: Cpu, t: Tid) -> u64 {
        let pending = self.now - self.rqs[c as usize].curr_start;
        self.now + self.scx.tasks[t as usize].slice.saturating_sub(pending)
    }

    /// Accounts `delta` ns run by fair task `t`: its slice shrinks.
    pub(super) fn scx_charge(&mut self, t: Tid, delta: u64) {
        let task = &mut self.scx.tasks[t as usize];
        task.slice = task.slice.saturating_sub(delta);
    }

    /// CPUs with a fair task waiting for them: a local queue, or the CPU a task in BOOST or a
    /// fair queue is assigned to (for CPU pressure).
    pub(super) fn scx_waiting(&self) -> u64 {
        let s = &self.scx;
        let mut m = 0;
        for (c, q) in s.local.iter().enumerate() {
            if !q.is_empty() {
                m |= bit(c as Cpu);
            }
        }
        let shared = s.boost.iter().copied();
        let shared = shared.chain(s.fair.iter().flatten().map(|k| k.2));
        for t in shared {
            m |= bit(self.threads[t as usize].cpu);
        }
        m
    }

    /// A class change of `t` (accounted where it runs) with the scheduler on: a nice change
    /// reweighs; to RT it leaves the scheduler's queues (stopping if it runs), from RT it
    /// joins them (through enqueue, or as running with a fresh slice).
    pub(super) fn scx_set_class(&mut self, t: Tid, class: Class, out: &mut Vec<Switch>) {
        let old = self.threads[t as usize].class;
        let state = self.threads[t as usize].state;
        if let ThreadState::Running(c) = state {
            self.update_curr(c);
        }
        let (was_fair, is_fair) = (old.rt_prio().is_none(), class.rt_prio().is_none());
        let set = |h: &mut Host| {
            let th = &mut h.threads[t as usize];
            th.class = class;
            th.weight = weight_of(class);
            if !was_fair && is_fair {
                // `pvs_enable`: a task joining the scheduler starts at vtime_now.
                h.scx.tasks[t as usize].vtime = h.scx.vtime_now;
            }
        };
        match (was_fair, is_fair, state) {
            (_, _, ThreadState::Blocked) | (true, true, _) => set(self),
            (true, false, ThreadState::Runnable(_)) => {
                self.scx_dequeue(t);
                set(self);
                let c = self.threads[t as usize].cpu;
                self.enqueue(c, t, false);
                self.check_preempt(c, t, out);
                self.push_rt(c, out);
            }
            (true, false, ThreadState::Running(c)) => {
                self.scx_stopping(c, t, true);
                set(self);
                self.curr_class_changed(c);
                let p = class.rt_prio().unwrap_or(0);
                let rq = &self.rqs[c as usize];
                if rq.throttled || rq.rt_highest().is_some_and(|q| q > p) {
                    self.preempt_curr(c, out);
                }
            }
            (false, true, ThreadState::Runnable(c)) => {
                self.dequeue(c, t);
                set(self);
                self.scx_enqueue(t, false, out);
            }
            (false, true, ThreadState::Running(c)) => {
                set(self);
                self.curr_class_changed(c);
                self.scx.tasks[t as usize].slice = self.scx.p.slice_ns;
                self.scx_running(c, t);
                // An RT thread queued here, or one pulled from elsewhere, takes the CPU.
                let rq = &self.rqs[c as usize];
                let rt_here = !rq.throttled && (rq.rt_nr > 0 || self.pull_rt(c, 0).is_some());
                if rt_here {
                    self.preempt_curr(c, out);
                }
            }
            // RT to RT: the RT class's own path (`Host::set_class`).
            (false, false, _) => self.do_set_class(t, class, out),
        }
    }

    /// The scheduler's invariants (tests only).
    #[cfg(test)]
    pub(super) fn check_scx(&self) {
        let s = &self.scx;
        if !s.on {
            return;
        }
        assert_eq!(s.switching, 0, "a CPU left switching");
        let mut seen = 0usize;
        for (c, q) in s.local.iter().enumerate() {
            let c = c as Cpu;
            if self.rqs[c as usize].curr.is_none() {
                assert!(q.is_empty(), "idle CPU {c} with a local queue");
            }
            for &t in q {
                let th = &self.threads[t as usize];
                assert_eq!(s.tasks[t as usize].at, Where::Local, "{t} local");
                assert_eq!((th.state, th.cpu), (ThreadState::Runnable(c), c), "{t}");
                assert!(self.allowed(t, c));
                seen += 1;
            }
        }
        for &t in &s.boost {
            assert_eq!(s.tasks[t as usize].at, Where::Boost, "{t} boost");
            let th = &self.threads[t as usize];
            assert_eq!(th.state, ThreadState::Runnable(th.cpu), "{t}");
            seen += 1;
        }
        for (c, q) in s.fair.iter().enumerate() {
            for &(v, seq, t) in q {
                let task = &s.tasks[t as usize];
                assert_eq!(
                    (task.at, task.vtime, task.seq),
                    (Where::Fair, v, seq),
                    "{t}"
                );
                let th = &self.threads[t as usize];
                // In the queue of its CPU (`scx_bpf_task_cpu`), which it may run on.
                assert_eq!(th.state, ThreadState::Runnable(c as Cpu), "{t} in fair {c}");
                assert!(self.allowed(t, c as Cpu), "{t} in fair {c}");
                seen += 1;
            }
        }
        let queued = s.tasks.iter().filter(|task| task.at != Where::No).count();
        assert_eq!(queued, seen, "queued tasks vs queues");
        for (t, th) in self.threads.iter().enumerate() {
            let t = t as Tid;
            let fair = th.class.rt_prio().is_none();
            match th.state {
                ThreadState::Runnable(_) if fair => {
                    assert_ne!(s.tasks[t as usize].at, Where::No, "{t} runnable, no queue")
                }
                _ => assert_eq!(s.tasks[t as usize].at, Where::No, "{t} queued"),
            }
        }
        for (c, rq) in self.rqs.iter().enumerate() {
            let want = match rq.curr {
                Some(t) if !self.is_rt(t) => s.tasks[t as usize].reg.as_ref().map_or(0, |r| {
                    if r.run_boosted {
                        r.enq_boost
                    } else {
                        0
                    }
                }),
                _ => 0,
            };
            assert_eq!(s.cpu_boost[c], want, "cpu_boost of CPU {c}");
        }
    }
}

/// `boost_holds`: a proactive boost, or one of a thread without a slot, holds; a guest one
/// while the slot showed a reason at the last stop.
fn boost_holds(r: &mut Reg) -> bool {
    if r.proactive || !r.slot || r.guest_reason {
        return true;
    }
    r.stats.boost_dropped += 1;
    false
}

/// `kernel_boost`: why the scheduler boosts the thread itself at this enqueue.
fn kernel_boost(r: &mut Reg, wakeup: bool, now: u64) -> KReason {
    // A halt repays the burst (time queued for a CPU counts neither way).
    if wakeup {
        if let Some(h) = r.halted_at.take() {
            r.kburst = r.kburst.saturating_sub(now.saturating_sub(h));
        }
    }
    let a = r.allow;
    if a.kernel.priority == 0
        || r.stats.kboost_ns >= a.kboost_allowed_ns
        || now < r.kthrottled_until
    {
        return KReason::None;
    }
    if a.kernel.max_boost_ns > 0 && r.kburst > a.kernel.max_boost_ns {
        r.kthrottled_until = now + a.kernel.throttle_ns;
        r.kburst = 0;
        r.stats.kthrottles += 1;
        return KReason::None;
    }
    if r.guest_rt || (wakeup && r.wake_boost) {
        return KReason::Rt;
    }
    if !wakeup && r.cs_preempted && a.kernel.critical_sections {
        return KReason::Cs;
    }
    if wakeup && a.kernel.wakeups && a.kernel.wake_boost_ns > 0 {
        return KReason::Wake;
    }
    KReason::None
}

/// The extension `r` runs, if any, ends at `now` (`close_extension`): charged for what it ran,
/// at most `ext`.
fn close_extension(r: &mut Reg, now: u64, ext: u64) {
    if r.ext_in_slice == 0 {
        return;
    }
    r.stats.ext_ns += now.saturating_sub(r.ext_at).min(ext);
    r.ext_in_slice = 0;
    r.ext_poll_due = false;
}

/// `vcpu_stopping`: the kernel-boosted time of the run that ends (to the burst too; a run
/// not boosted at all repays it, a halt at its wakeup), and what the slot shows.
fn vcpu_stopping(r: &mut Reg, now: u64, runnable: bool, boosted: bool) {
    let d = now.saturating_sub(r.run_start);
    if r.run_kreason != KReason::None {
        r.stats.kboost_ns += d;
        r.kburst += d;
        if r.run_kreason == KReason::Cs {
            r.stats.kboost_cs_ns += d;
        }
        if r.run_demoted {
            r.stats.kboost_demoted_ns += d;
        }
    } else if !boosted {
        r.kburst = r.kburst.saturating_sub(d);
    }
    if !runnable {
        r.halted_at = Some(now);
    }
    r.run_kreason = KReason::None;
    r.run_demoted = false;
    if !r.slot {
        return;
    }
    let v = r.view;
    let (rt, cs) = (!v.idle && v.rt, !v.idle && v.cs);
    r.guest_reason = rt || cs || v.pending;
    r.guest_rt = rt;
    r.cs_preempted = runnable && cs;
    if rt || v.rt_switches != r.rt_switches {
        r.last_rt = Some(now);
        r.rt_switches = v.rt_switches;
    }
    let window = r.allow.kernel.halt_window_ns;
    r.wake_boost = !runnable && window > 0 && r.last_rt.is_some_and(|l| now - l <= window);
}
