//! The guest side of a simulated VM: its tasks, their locks, and the scheduler each vCPU
//! runs over the tasks bound to it.
//!
//! Model (stated, simple): every guest task is bound to one vCPU (as cyclictest `-a` and
//! per-CPU kernel work are); a vCPU runs its highest-priority runnable RT task, FIFO among
//! equals, else its runnable fair tasks round robin with a `GUEST_SLICE_NS` slice of vCPU
//! run time. A wakeup on another vCPU is an IPI to it; on the same vCPU, a preemption
//! check at the next dispatch point. What the guest module would publish for a vCPU is
//! [`GuestVm::guest_half`].

use std::collections::VecDeque;

use pvsched_abi as abi;
use serde::{Deserialize, Serialize};

use crate::scenario::{LockKind, PolicyName};

/// The guest's cpuidle driver: what an idle vCPU does before and instead of halting (a
/// scenario's or variant's `guest_idle`). The vCPU is idle when it has no runnable task; its
/// idle period ends when it runs guest work again (an interrupt, a task).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuestIdle {
    /// No driver (`default_idle`): HLT at once.
    #[default]
    Halt,
    /// The stock haltpoll governor (`GuestHaltPoll::STOCK`): every idle period polls up to
    /// a per-vCPU window, then halts; the window adapts to how long each halt lasted.
    Haltpoll,
    /// Poll `guest_halt_poll_ns` (a fixed window), then halt.
    Fixed,
    /// pvsched's hinted driver ([`HintedIdle`]): haltpoll's adaptive window, capped from
    /// the host's measure of this vCPU's wakeup, within the poll budget the host grants, and
    /// no polling while the host says it is overloaded or has no measure yet.
    Hinted,
}

impl GuestIdle {
    pub fn name(self) -> &'static str {
        match self {
            GuestIdle::Halt => "halt",
            GuestIdle::Haltpoll => "haltpoll",
            GuestIdle::Fixed => "fixed",
            GuestIdle::Hinted => "hinted",
        }
    }
}

/// The haltpoll governor's per-CPU window, as `adjust_poll_limit` in
/// drivers/cpuidle/governors/haltpoll.c (Linux 6.1; the pvsched module's `haltpoll` mode
/// builds the same defaults in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestHaltPoll {
    /// `guest_halt_poll_ns`: the largest window, and the halt length above which it shrinks.
    pub max_ns: u64,
    pub grow: u64,
    pub grow_start_ns: u64,
    /// 0: a long halt resets the window to 0.
    pub shrink: u64,
}

impl GuestHaltPoll {
    /// The module parameters' defaults (`guest_halt_poll_allow_shrink` on).
    pub const STOCK: GuestHaltPoll = GuestHaltPoll {
        max_ns: 200_000,
        grow: 2,
        grow_start_ns: 50_000,
        shrink: 2,
    };

    /// The window after a halt of `block_ns` with window `limit` (a poll that a wakeup
    /// ended leaves it alone, as the governor's reflect does for the poll state).
    pub fn adapt(&self, limit: u64, block_ns: u64) -> u64 {
        if block_ns > limit && block_ns <= self.max_ns {
            limit
                .saturating_mul(self.grow)
                .max(self.grow_start_ns)
                .min(self.max_ns)
        } else if block_ns > self.max_ns {
            limit.checked_div(self.shrink).unwrap_or(0)
        } else {
            limit
        }
    }
}

/// The hinted driver's bounds on its poll window's cap: the module's 1 µs floor and its
/// `idle_max_poll_us` default.
pub const HINTED_MIN_NS: u64 = 1_000;
pub const HINTED_MAX_NS: u64 = 200_000;
/// The cap is this many times the host's p99 wake → running latency (`HINT_POLL_FACTOR`):
/// the host sees only its scheduler's part of a halt's cost.
pub const HINT_POLL_FACTOR: u64 = 4;
/// A vCPU looks at its host half at most this often (`PVSCHED_HINT_REFRESH_NS`).
pub const HINT_REFRESH_NS: u64 = 10_000_000;
/// The poll budget's bucket holds this long a window's worth (`HINT_BUDGET_WINDOW_NS`).
pub const HINT_BUDGET_WINDOW_NS: u64 = 100_000_000;
/// The module's `idle_budget_permille` default: the budget when the host grants none.
pub const HINT_DEFAULT_BUDGET_PERMILLE: u32 = 50;

/// What an idle vCPU does at an idle entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleChoice {
    /// Poll up to this many ns, then halt.
    Poll(u64),
    Halt,
    /// Hinted: halt at once, the host says it is overloaded.
    HaltOverloaded,
    /// Hinted: halt at once, no hint (no host half, or nothing measured yet).
    HaltUnhinted,
    /// Hinted: a window was due but the budget holds less than all of it.
    HaltBudget,
}

/// The hinted driver's state of one vCPU, as `pvsched_enter_hinted()` keeps it
/// (guest/pvsched_idle.c, `struct pvsched_idle_cpu`). Per idle entry:
///
/// 1. the host half is re-read if its 10 ms are up ([`HintedIdle::refresh`]);
/// 2. overloaded, or no hint: halt at once, the window left alone;
/// 3. the token bucket is counted; the window (the limit) is polled whole if the bucket
///    holds all of it, else not at all (a poll cut short mostly times out);
/// 4. a poll costs all its time ([`HintedIdle::poll_ended`]); a halt adapts the limit as
///    haltpoll does, from the whole idle period (poll and halt), capped at `cap_ns`
///    ([`HintedIdle::halt_ended`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HintedIdle {
    /// The poll window; from 0, as `haltpoll_enable_device()` starts.
    pub limit_ns: u64,
    /// The window's upper bound from the hint: 4 x p99 clamped to [1 µs, 200 µs]; 0: none.
    pub cap_ns: u64,
    /// Poll time left in the budget (< 0: owed).
    pub tokens_ns: i64,
    /// When the tokens were counted to.
    pub tokens_at: u64,
    /// The budget in force (the host's `poll_budget_permille`, else the module default).
    pub budget_permille: u32,
    /// When the host half is read next.
    pub refresh_due: u64,
    pub overloaded: bool,
    /// A measured hint is in force (p50 and p99 > 0).
    pub hinted: bool,
    /// When the current entry began, while its halt may adapt the limit.
    pub entered_at: Option<u64>,
    /// When the current poll began.
    pub poll_from: Option<u64>,
}

impl HintedIdle {
    /// Whether the host half is to be read at `now` (the driver reads it at most every
    /// [`HINT_REFRESH_NS`], at an idle entry).
    pub fn refresh_due(&self, now: u64) -> bool {
        now >= self.refresh_due
    }

    /// Applies the host half read at `now` (`None`: there is none, as in the vanilla mode:
    /// no hint), as `pvsched_idle_apply()`.
    pub fn refresh(&mut self, now: u64, half: Option<&abi::HostHalf>) {
        self.refresh_due = now + HINT_REFRESH_NS;
        let (flags, p50, p99, budget) = half.map_or((0, 0, 0, 0), |h| {
            (
                h.flags,
                h.wake_p50_ns,
                h.wake_p99_ns,
                h.poll_budget_permille.min(1000),
            )
        });
        self.overloaded = flags & abi::HF_OVERLOADED != 0;
        self.budget_permille = if budget == 0 {
            HINT_DEFAULT_BUDGET_PERMILLE
        } else {
            budget
        };
        self.hinted = p50 != 0 && p99 != 0;
        self.cap_ns = if self.hinted {
            (u64::from(p99) * HINT_POLL_FACTOR).clamp(HINTED_MIN_NS, HINTED_MAX_NS)
        } else {
            0
        };
        // A lower cap (a new hint) takes effect at once.
        self.limit_ns = self.limit_ns.min(self.cap_ns);
    }

    /// The bucket counted to `now`: `budget_permille` of the time since the last count,
    /// in whole µs as the module counts it, up to [`HINT_BUDGET_WINDOW_NS`]' worth.
    /// Returns what may be spent (never below 0).
    fn tokens(&mut self, now: u64) -> u64 {
        let rate = i64::from(self.budget_permille);
        let full = (HINT_BUDGET_WINDOW_NS / 1000) as i64 * rate;
        if now > self.tokens_at {
            let us = i64::try_from((now - self.tokens_at) / 1000).unwrap_or(i64::MAX);
            self.tokens_ns = self.tokens_ns.saturating_add(us.saturating_mul(rate));
        }
        self.tokens_at = now;
        self.tokens_ns = self.tokens_ns.min(full);
        self.tokens_ns.max(0) as u64
    }

    /// The driver at an idle entry at `now` (after [`HintedIdle::refresh`] if it was due).
    pub fn enter(&mut self, now: u64) -> IdleChoice {
        // A poll not ended before (the engine ends each one) is paid for all the same.
        self.poll_ended(now);
        self.entered_at = None;
        if self.overloaded {
            return IdleChoice::HaltOverloaded;
        }
        if !self.hinted {
            return IdleChoice::HaltUnhinted;
        }
        self.entered_at = Some(now);
        let limit = self.limit_ns;
        if limit > self.tokens(now) {
            return IdleChoice::HaltBudget;
        }
        if limit == 0 {
            return IdleChoice::Halt;
        }
        self.poll_from = Some(now);
        IdleChoice::Poll(limit)
    }

    /// The entry's poll ended at `now`, woken or not: the budget pays all of it.
    pub fn poll_ended(&mut self, now: u64) {
        if let Some(from) = self.poll_from.take() {
            let spent = i64::try_from(now.saturating_sub(from)).unwrap_or(i64::MAX);
            self.tokens_ns = self.tokens_ns.saturating_sub(spent);
        }
    }

    /// A poll caught the wakeup: the limit stays (the driver returns without adapting).
    pub fn woken_polling(&mut self, now: u64) {
        self.poll_ended(now);
        self.entered_at = None;
    }

    /// The entry's halt ended at `now`: haltpoll's rule on the whole idle period, with the
    /// cap in the place of `guest_halt_poll_ns`.
    pub fn halt_ended(&mut self, now: u64) {
        if let Some(at) = self.entered_at.take() {
            let rule = GuestHaltPoll {
                max_ns: self.cap_ns,
                ..GuestHaltPoll::STOCK
            };
            self.limit_ns = rule.adapt(self.limit_ns, now.saturating_sub(at));
        }
    }
}

/// Guest fair-class slice, in vCPU run time.
pub const GUEST_SLICE_NS: u64 = 4_000_000;
/// Work left of a task that never ends (hog, spinner).
pub const FOREVER: u64 = u64::MAX / 4;

pub type TaskId = u32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GClass {
    Fair,
    Rt { fifo: bool, prio: u8 },
}

impl GClass {
    pub fn of(policy: PolicyName, prio: u8) -> GClass {
        match policy {
            PolicyName::Normal => GClass::Fair,
            PolicyName::Fifo => GClass::Rt { fifo: true, prio },
            PolicyName::Rr => GClass::Rt { fifo: false, prio },
        }
    }

    pub fn rank(self) -> u32 {
        match self {
            GClass::Fair => 0,
            GClass::Rt { prio, .. } => 1 + u32::from(prio),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TState {
    Runnable,
    Sleeping,
    /// Blocked on a mutex.
    Waiting,
}

/// What a task does with its CPU time.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// cyclictest: `work` after each expiry; `latency` is measured at each start.
    Periodic {
        interval: u64,
        work: u64,
        next: u64,
    },
    /// Audio: `work` per `period`; a glitch when it ends after the next period begins.
    Audio {
        period: u64,
        work: u64,
        next: u64,
    },
    Hog,
    Lock {
        lock_base: u32,
        locks: u32,
        kind: LockKind,
        /// A spinning waiter gives up its vCPU after this long (as a paravirt qspinlock
        /// waiter halts until the holder kicks it); 0: spins until it gets the lock.
        spin_limit: u64,
        outside: u64,
        hold: u64,
        phase: LockPhase,
        /// The lock this task takes next / holds.
        which: u32,
    },
    PingPong {
        peer: TaskId,
        work: u64,
        /// The side that starts.
        starter: bool,
        /// Mean idle time (exponential) before the starter's next message; 0: at once.
        gap: u64,
        /// The starter is between its last reply and its next message.
        resting: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockPhase {
    Outside,
    /// Spinning for the lock (on the CPU).
    Spinning,
    /// Sleeping for the lock.
    Blocked,
    Holding,
}

#[derive(Clone, Debug)]
pub struct Task {
    pub vcpu: u32,
    pub class: GClass,
    pub state: TState,
    /// Host ns of work left in the current burst.
    pub remaining: u64,
    pub behaviour: Behaviour,
    /// Timer expiry this task was woken for, until it starts running (latency).
    pub expiry: Option<u64>,
    /// Generation of its timer (a stale timer event is ignored).
    pub timer_gen: u32,
}

impl Task {
    /// Arms its timer (an earlier one goes stale); returns the generation.
    pub fn arm_timer(&mut self) -> u32 {
        self.timer_gen += 1;
        self.timer_gen
    }

    pub fn cancel_timer(&mut self) {
        self.timer_gen += 1;
    }

    pub fn holds_lock(&self) -> bool {
        matches!(
            self.behaviour,
            Behaviour::Lock {
                phase: LockPhase::Holding,
                ..
            }
        )
    }

    pub fn spinning(&self) -> bool {
        matches!(
            self.behaviour,
            Behaviour::Lock {
                phase: LockPhase::Spinning,
                ..
            }
        )
    }

    /// Spinning or sleeping for a lock.
    pub fn waits_for_lock(&self) -> bool {
        matches!(
            self.behaviour,
            Behaviour::Lock {
                phase: LockPhase::Spinning | LockPhase::Blocked,
                ..
            }
        )
    }
}

#[derive(Clone, Debug, Default)]
pub struct Lock {
    pub owner: Option<TaskId>,
    /// Waiters in arrival order (spinners and sleepers alike: FIFO hand-over).
    pub waiters: VecDeque<TaskId>,
}

/// The lock wait a vCPU's slot shows (`PVSCHED_F_LOCK_WAIT`), as the guest module keeps it
/// per CPU (guest/pvsched_locks.c: `lock_task`, `lock_target`, `lock_kind`,
/// `lock_sleeping`): set at the waiter's contention, in the waiter's own slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockWait {
    /// The waiting task.
    pub task: TaskId,
    /// What the slot names: `LOCK_NONE` (nothing to ask of the host), the holder's vCPU
    /// + 1, or `LOCK_ANY`; looked up once, at the contention.
    pub target: u32,
    /// `LOCK_F_*` of the lock (`LOCK_F_MUTEX`, `LOCK_F_SPIN`).
    pub kind: u32,
    /// The waiter sleeps and its vCPU idles (`LOCK_F_SLEEP`).
    pub sleeping: bool,
}

/// An interrupt pending or being handled on a vCPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Irq {
    /// A guest timer expired for this task.
    Timer(TaskId),
    /// Another vCPU woke this task (reschedule IPI).
    Ipi(TaskId),
}

/// What a running vCPU thread is doing now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VWork {
    /// Nothing scheduled (not running on the host, or between items).
    None,
    /// Re-entering the guest after a halt.
    Entry,
    Irq(Irq),
    Switch(TaskId),
    Task(TaskId),
    /// The guest's idle driver polling (haltpoll, fixed, hinted).
    GuestPoll,
    /// The HLT exit.
    Exit,
    /// KVM host halt polling.
    HostPoll,
    /// Blocked in the host: halted.
    Halted,
}

impl VWork {
    /// Whether an interrupt arriving now cuts this item short.
    pub fn interruptible(self) -> bool {
        matches!(self, VWork::Task(_) | VWork::GuestPoll | VWork::HostPoll)
    }
}

#[derive(Clone, Debug)]
pub struct Vcpu {
    pub tid: u32,
    pub work: VWork,
    pub irqs: VecDeque<Irq>,
    pub cur: Option<TaskId>,
    pub rt: Vec<TaskId>,
    pub fair: VecDeque<TaskId>,
    /// vCPU run time the current fair task has had of its slice.
    pub slice_used: u64,
    /// KVM's adaptive halt-poll window.
    pub poll_ns: u64,
    /// When the current halt began (for the poll window's adaptation).
    pub halt_start: Option<u64>,
    /// The guest's current idle period began (no task to run); None while it runs work.
    pub idle_since: Option<u64>,
    /// The guest issued HLT in this idle period (the haltpoll governor's residency).
    pub guest_halt_at: Option<u64>,
    /// The haltpoll governor's window.
    pub haltpoll_ns: u64,
    /// The hinted driver's window, budget and hint.
    pub hinted: HintedIdle,
    /// This idle period's poll ran out: halt next.
    pub guest_polled: bool,
    /// When the current poll runs out (its limit is on the guest clock, which runs while
    /// the host has the vCPU preempted).
    pub poll_until: u64,
    /// pvschedd has yet to see its switch-in (`idle_exit_before_switch`): the generation
    /// of the pending one.
    pub switch_in: Option<u32>,
    pub switch_in_gen: u32,
    /// Published-state counter (the guest half's seq, halved).
    pub seq: u32,
    pub switches: u64,
    /// Switches to an RT task (the guest half's `rt_switch_count`).
    pub rt_switches: u64,
    pub hardirqs: u64,
    /// The `seq` at which the doorbell last rang (one ring per published change).
    pub rung_seq: u32,
    /// The lock wait in progress here (pvsched-locks).
    pub lock_wait: Option<LockWait>,
    /// The module's counters: contentions seen here, and of those the ones whose holder's
    /// vCPU (for an unknown holder: another vCPU) the host half said was preempted.
    pub lock_contended: u64,
    pub lock_preempted: u64,
}

impl Vcpu {
    pub fn new(tid: u32) -> Vcpu {
        Vcpu {
            tid,
            work: VWork::None,
            irqs: VecDeque::new(),
            cur: None,
            rt: Vec::new(),
            fair: VecDeque::new(),
            slice_used: 0,
            poll_ns: 0,
            halt_start: None,
            idle_since: None,
            guest_halt_at: None,
            haltpoll_ns: 0,
            hinted: HintedIdle::default(),
            guest_polled: false,
            poll_until: 0,
            switch_in: None,
            switch_in_gen: 0,
            seq: 0,
            switches: 0,
            rt_switches: 0,
            hardirqs: 0,
            rung_seq: u32::MAX,
            lock_wait: None,
            lock_contended: 0,
            lock_preempted: 0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct GuestVm {
    pub name: String,
    pub vcpus: Vec<Vcpu>,
    pub tasks: Vec<Task>,
    pub locks: Vec<Lock>,
    /// The VMM's main-loop thread.
    pub main_loop: u32,
    /// Timer expiries waiting for the main loop: (vcpu, irq).
    pub main_loop_queue: VecDeque<(u32, Irq)>,
    /// Whether the guest module publishes lock waits (`F_LOCK_WAIT`, pvsched-locks).
    pub publish_lock_waits: bool,
}

impl GuestVm {
    /// Adds a runnable task to its vCPU's queues.
    pub fn enqueue(&mut self, t: TaskId) {
        let task = &mut self.tasks[t as usize];
        task.state = TState::Runnable;
        let v = &mut self.vcpus[task.vcpu as usize];
        match task.class {
            GClass::Rt { .. } => {
                if !v.rt.contains(&t) {
                    v.rt.push(t);
                }
            }
            GClass::Fair => {
                if !v.fair.contains(&t) {
                    v.fair.push_back(t);
                }
            }
        }
    }

    /// Takes a task off its vCPU's queues (it sleeps or waits).
    pub fn dequeue(&mut self, t: TaskId, state: TState) {
        let task = &mut self.tasks[t as usize];
        task.state = state;
        let v = &mut self.vcpus[task.vcpu as usize];
        v.rt.retain(|&x| x != t);
        v.fair.retain(|&x| x != t);
        if v.cur == Some(t) {
            v.cur = None;
        }
    }

    /// The task vCPU `v` should run: its best RT task (FIFO among equals; the current one
    /// keeps the CPU against an equal), else the head of the fair queue (the current fair
    /// task stays at the head until its slice ends).
    pub fn pick(&self, v: u32) -> Option<TaskId> {
        let vc = &self.vcpus[v as usize];
        let mut best: Option<TaskId> = None;
        for &t in &vc.rt {
            let r = self.tasks[t as usize].class.rank();
            let better = match best {
                None => true,
                Some(b) => {
                    let rb = self.tasks[b as usize].class.rank();
                    r > rb || (r == rb && Some(t) == vc.cur)
                }
            };
            if better {
                best = Some(t);
            }
        }
        if best.is_some() {
            return best;
        }
        // The fair task at the head runs; one whose slice ends goes to the back (`rotate`).
        vc.fair.front().copied()
    }

    /// Moves a fair task whose slice ran out behind the others.
    pub fn rotate(&mut self, v: u32, t: TaskId) {
        let vc = &mut self.vcpus[v as usize];
        if let Some(pos) = vc.fair.iter().position(|&x| x == t) {
            vc.fair.remove(pos);
            vc.fair.push_back(t);
        }
        vc.slice_used = 0;
    }

    /// What the guest module publishes for vCPU `v` now.
    pub fn guest_half(&self, v: u32, now: u64) -> abi::GuestHalf {
        let vc = &self.vcpus[v as usize];
        let idle = vc.cur.is_none()
            && matches!(
                vc.work,
                VWork::GuestPoll | VWork::Exit | VWork::HostPoll | VWork::Halted | VWork::None
            );
        let mut flags = abi::GF_ACTIVE;
        if idle {
            flags |= abi::GF_IDLE;
        }
        let mut cs_flags = 0;
        if matches!(vc.work, VWork::Irq(_)) {
            cs_flags |= abi::CS_HARDIRQ;
        }
        let (mut policy, mut rt_priority) = (abi::POLICY_NORMAL, 0);
        if let Some(c) = vc.cur {
            let task = &self.tasks[c as usize];
            if let GClass::Rt { fifo, prio } = task.class {
                policy = if fifo {
                    abi::POLICY_FIFO
                } else {
                    abi::POLICY_RR
                };
                rt_priority = u32::from(prio);
            }
        }
        // The pending hint: the best RT task woken here and not yet running.
        let mut guest_pending = 0;
        if let Some(p) = self.pick(v) {
            let task = &self.tasks[p as usize];
            if Some(p) != vc.cur {
                if let GClass::Rt { fifo, prio } = task.class {
                    let pol = if fifo {
                        abi::POLICY_FIFO
                    } else {
                        abi::POLICY_RR
                    };
                    guest_pending = abi::PENDING_VALID
                        | (u64::from(pol) << abi::PENDING_POLICY_SHIFT)
                        | u64::from(prio);
                }
            }
        }
        let (mut lock_holder, mut lock_flags) = (abi::LOCK_NONE, 0);
        let (mut lock_contended_count, mut lock_preempted_count) = (0, 0);
        if self.publish_lock_waits {
            // pvsched_lock_show(): a wait whose lookup named nothing shows nothing.
            if let Some(w) = vc.lock_wait.filter(|w| w.target != abi::LOCK_NONE) {
                lock_holder = w.target;
                lock_flags = w.kind | if w.sleeping { abi::LOCK_F_SLEEP } else { 0 };
            }
            (lock_contended_count, lock_preempted_count) = (vc.lock_contended, vc.lock_preempted);
        }
        abi::GuestHalf {
            seq: vc.seq.wrapping_mul(2),
            flags,
            cs_flags,
            policy,
            rt_priority,
            nice: 0,
            update_ns: now,
            hardirq_count: vc.hardirqs,
            switch_count: vc.switches,
            rt_switch_count: vc.rt_switches,
            guest_pending,
            lock_holder,
            lock_flags,
            lock_contended_count,
            lock_preempted_count,
            ..Default::default()
        }
    }

    /// lock:contention_begin, as `pvsched_lock_begin()` handles it: task `t`, running on
    /// its vCPU, finds lock `li` (of `kind`) held and waits for it. The wait goes into the
    /// waiter's own slot, looked up once, now (`pvsched_lock_holder()`):
    ///
    /// - a mutex names its owner: if the owner task is on a vCPU (the current task of
    ///   another vCPU, whether the host runs that vCPU or not) the slot names that vCPU,
    ///   and the contention counts as preempted if its host half says so; an owner not on a
    ///   vCPU (asleep, or waiting for its vCPU in the guest) is counted and named by
    ///   nothing; an owner on the waiter's own vCPU is not a contention to count;
    /// - a spinlock does not record its owner: the slot says `LOCK_ANY` only if another
    ///   vCPU's host half says preempted (then the contention counts as preempted), else
    ///   nothing.
    ///
    /// `preempted(v)`: vCPU `v`'s host half says `HS_PREEMPTED` (never without a host half).
    /// Without the module's lock waits (every mode but pvsched-locks) nothing happens.
    /// Returns whether the slot changed.
    pub fn lock_contention(
        &mut self,
        t: TaskId,
        li: usize,
        kind: LockKind,
        preempted: impl Fn(u32) -> bool,
    ) -> bool {
        if !self.publish_lock_waits {
            return false;
        }
        let v = self.tasks[t as usize].vcpu;
        let (target, pre, flags) = match kind {
            LockKind::Mutex => {
                let Some(h) = self.locks[li].owner.filter(|&h| h != t) else {
                    return false;
                };
                let hv = self.tasks[h as usize].vcpu;
                if self.vcpus[hv as usize].cur != Some(h) {
                    (abi::LOCK_NONE, false, abi::LOCK_F_MUTEX)
                } else if hv == v {
                    return false;
                } else {
                    (hv + 1, preempted(hv), abi::LOCK_F_MUTEX)
                }
            }
            LockKind::Spin => {
                let n = self.vcpus.len() as u32;
                let pre = (0..n).any(|s| s != v && preempted(s));
                let target = if pre { abi::LOCK_ANY } else { abi::LOCK_NONE };
                (target, pre, abi::LOCK_F_SPIN)
            }
        };
        let vc = &mut self.vcpus[v as usize];
        vc.lock_contended += 1;
        vc.lock_preempted += u64::from(pre);
        if vc.lock_wait.is_some_and(|w| w.task != t) {
            // Another task's wait is shown (cannot happen here: a switch to another task
            // ends it); the module counts this one and keeps showing that one.
            return true;
        }
        vc.lock_wait = Some(LockWait {
            task: t,
            target,
            kind: flags,
            sleeping: false,
        });
        vc.seq += 1;
        true
    }

    /// vCPU `v` switches to task `next` (`None`: its idle loop), as `pvsched_lock_switch()`:
    /// a wait in progress lasts while its task runs and while the vCPU idles after the
    /// waiter slept (`LOCK_F_SLEEP`); any other task ends it. A spinlock waiter that halts
    /// (paravirt qspinlock's `pv_wait`) halts inside its wait, without a switch: no
    /// `LOCK_F_SLEEP`.
    pub fn lock_wait_switch(&mut self, v: u32, next: Option<TaskId>) {
        let vc = &mut self.vcpus[v as usize];
        let Some(w) = vc.lock_wait.as_mut() else {
            return;
        };
        let sleeping = match next {
            Some(t) if t == w.task => false,
            None if w.kind & abi::LOCK_F_MUTEX != 0 => true,
            None => w.sleeping,
            Some(_) => {
                vc.lock_wait = None;
                vc.seq += 1;
                return;
            }
        };
        if sleeping != w.sleeping {
            w.sleeping = sleeping;
            vc.seq += 1;
        }
    }

    /// Task `t` runs on vCPU `v` with its lock (lock:contention_end): its wait, if shown,
    /// ends.
    pub fn lock_wait_end(&mut self, v: u32, t: TaskId) {
        let vc = &mut self.vcpus[v as usize];
        if vc.lock_wait.is_some_and(|w| w.task == t) {
            vc.lock_wait = None;
            vc.seq += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm_with(classes: &[GClass]) -> GuestVm {
        let tasks = classes
            .iter()
            .map(|&class| Task {
                vcpu: 0,
                class,
                state: TState::Sleeping,
                remaining: FOREVER,
                behaviour: Behaviour::Hog,
                expiry: None,
                timer_gen: 0,
            })
            .collect();
        GuestVm {
            name: "t".into(),
            vcpus: vec![Vcpu::new(0)],
            tasks,
            locks: Vec::new(),
            main_loop: 1,
            main_loop_queue: VecDeque::new(),
            publish_lock_waits: true,
        }
    }

    #[test]
    fn the_best_rt_task_wins_and_fair_tasks_take_turns() {
        let mut vm = vm_with(&[
            GClass::Fair,
            GClass::Fair,
            GClass::Rt {
                fifo: true,
                prio: 5,
            },
            GClass::Rt {
                fifo: true,
                prio: 9,
            },
        ]);
        vm.enqueue(0);
        vm.enqueue(1);
        assert_eq!(vm.pick(0), Some(0));
        vm.vcpus[0].cur = Some(0);
        vm.vcpus[0].slice_used = GUEST_SLICE_NS;
        vm.rotate(0, 0);
        assert_eq!(vm.pick(0), Some(1));
        vm.enqueue(2);
        vm.enqueue(3);
        assert_eq!(vm.pick(0), Some(3));
        vm.dequeue(3, TState::Sleeping);
        assert_eq!(vm.pick(0), Some(2));
    }

    #[test]
    fn the_haltpoll_window_grows_from_grow_start_to_the_max_and_halves_on_long_halts() {
        let p = GuestHaltPoll::STOCK;

        let a = p.adapt(0, 10_000);
        let b = p.adapt(a, 60_000);
        let c = p.adapt(b, 150_000);
        let d = p.adapt(c, 150_000);

        assert_eq!((a, b, c, d), (50_000, 100_000, 200_000, 200_000));
        assert_eq!(
            p.adapt(100_000, 80_000),
            100_000,
            "caught by the window: kept"
        );
        assert_eq!(p.adapt(200_000, 300_000), 100_000);
        assert_eq!(p.adapt(0, 300_000), 0);
    }

    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    fn hint(p50: u32, p99: u32, flags: u32, budget: u32) -> abi::HostHalf {
        abi::HostHalf {
            wake_p50_ns: p50,
            wake_p99_ns: p99,
            flags,
            poll_budget_permille: budget,
            ..Default::default()
        }
    }

    fn hinted_with(half: abi::HostHalf, at: u64) -> HintedIdle {
        let mut h = HintedIdle::default();
        h.refresh(at, Some(&half));
        h
    }

    #[test]
    fn hinted_caps_the_window_at_4x_p99_within_1us_and_200us_and_takes_a_lower_cap_at_once() {
        let cap = |p99| hinted_with(hint(1_000, p99, 0, 0), S).cap_ns;
        assert_eq!(cap(30_000), 120_000);
        assert_eq!(cap(900_000), HINTED_MAX_NS);
        assert_eq!(cap(100), HINTED_MIN_NS);

        let mut h = hinted_with(hint(20_000, 50_000, 0, 0), S);
        h.limit_ns = 200_000;
        assert!(!h.refresh_due(S + 9 * MS), "read at most every 10 ms");
        assert!(h.refresh_due(S + 10 * MS));
        h.refresh(S + 10 * MS, Some(&hint(5_000, 10_000, 0, 0)));

        assert_eq!((h.cap_ns, h.limit_ns), (40_000, 40_000));
    }

    #[test]
    fn hinted_takes_the_hosts_budget_or_the_module_default() {
        let budget = |b| hinted_with(hint(1_000, 2_000, 0, b), S).budget_permille;
        assert_eq!(budget(250), 250);
        assert_eq!(budget(0), HINT_DEFAULT_BUDGET_PERMILLE);
        assert_eq!(budget(5_000), 1_000);
        assert_eq!(
            {
                let mut h = HintedIdle::default();
                h.refresh(S, None);
                h.budget_permille
            },
            HINT_DEFAULT_BUDGET_PERMILLE
        );
    }

    #[test]
    fn hinted_adapts_the_window_to_the_whole_idle_period_as_haltpoll_with_the_cap() {
        // cap 200 us; a budget of a whole core, so that the budget never decides here.
        let mut h = hinted_with(hint(20_000, 50_000, 0, 1_000), S);
        let mut t = S;

        // From 0: a halt, then grow to 50 us.
        assert_eq!(h.enter(t), IdleChoice::Halt);
        h.halt_ended(t + 30 * US);
        assert_eq!(h.limit_ns, 50 * US);

        // 50 us polled, then 40 us halted: 90 us in all grows it (the halt alone would not).
        t += MS;
        assert_eq!(h.enter(t), IdleChoice::Poll(50 * US));
        h.poll_ended(t + 50 * US);
        h.halt_ended(t + 90 * US);
        assert_eq!(h.limit_ns, 100 * US);

        // A wakeup caught by the poll leaves it alone.
        t += MS;
        assert_eq!(h.enter(t), IdleChoice::Poll(100 * US));
        h.woken_polling(t + 10 * US);
        h.halt_ended(t + 10 * US);
        assert_eq!(h.limit_ns, 100 * US);

        // Longer than the cap: halved.
        t += MS;
        assert_eq!(h.enter(t), IdleChoice::Poll(100 * US));
        h.poll_ended(t + 100 * US);
        h.halt_ended(t + 300 * US);
        assert_eq!(h.limit_ns, 50 * US);
    }

    #[test]
    fn hinted_polls_a_whole_window_or_none_and_pays_for_all_it_polled() {
        // The module default, 50 permille: the bucket holds 5 ms.
        let mut h = hinted_with(hint(20_000, 50_000, 0, 0), S);
        h.limit_ns = 200 * US;

        assert_eq!(h.enter(S), IdleChoice::Poll(200 * US));
        assert_eq!(h.tokens_ns, 5 * MS as i64, "full after a second");
        // A caught poll costs its time too.
        h.woken_polling(S + 150 * US);
        assert_eq!(h.tokens_ns, (5 * MS - 150 * US) as i64);

        // 150 us left: not a 150 us poll but none.
        h.tokens_ns = 150_000;
        let t = S + MS;
        h.tokens_at = t;
        assert_eq!(h.enter(t), IdleChoice::HaltBudget);
        h.halt_ended(t + 100 * US);
        // 1 ms later at 50 permille: 50 us more, a whole window again.
        assert_eq!(h.enter(t + MS), IdleChoice::Poll(200 * US));
        // A poll preempted far past its window: owed, no poll until repaid.
        h.poll_ended(t + MS + 2 * MS);
        assert!(h.tokens_ns < 0, "{}", h.tokens_ns);
        h.halt_ended(t + MS + 2 * MS + 10 * US);
        assert_eq!(h.enter(t + 4 * MS), IdleChoice::HaltBudget);
    }

    #[test]
    fn hinted_halts_at_once_when_overloaded_or_unhinted_and_keeps_its_window() {
        let mut over = hinted_with(hint(20_000, 50_000, abi::HF_OVERLOADED, 0), S);
        over.limit_ns = 100 * US;
        let mut unhinted = hinted_with(hint(0, 50_000, 0, 0), S);
        let mut none = HintedIdle::default();
        none.refresh(S, None);

        assert_eq!(over.enter(S), IdleChoice::HaltOverloaded);
        over.halt_ended(S + 500 * US);
        assert_eq!(over.limit_ns, 100 * US, "no adaptation");
        assert_eq!(over.tokens_at, 0, "no budget counted");
        assert_eq!(unhinted.enter(S), IdleChoice::HaltUnhinted);
        assert_eq!(none.enter(S), IdleChoice::HaltUnhinted);
    }

    /// vCPUs 0..n, each running a task of its own (task i on vCPU i), and lock 0 held by
    /// task 1 (on vCPU 1).
    fn lock_vm(n: u32, publish: bool) -> GuestVm {
        let lock_task = |vcpu| Task {
            vcpu,
            class: GClass::Fair,
            state: TState::Runnable,
            remaining: 10,
            behaviour: Behaviour::Lock {
                lock_base: 0,
                locks: 1,
                kind: LockKind::Mutex,
                spin_limit: 0,
                outside: 10,
                hold: 10,
                phase: LockPhase::Outside,
                which: 0,
            },
            expiry: None,
            timer_gen: 0,
        };
        let mut vm = GuestVm {
            name: "t".into(),
            vcpus: (0..n).map(Vcpu::new).collect(),
            tasks: (0..n).map(lock_task).collect(),
            locks: vec![Lock {
                owner: Some(1),
                waiters: VecDeque::new(),
            }],
            main_loop: n,
            main_loop_queue: VecDeque::new(),
            publish_lock_waits: publish,
        };
        for v in 0..n {
            vm.enqueue(v);
            vm.vcpus[v as usize].cur = Some(v);
            vm.vcpus[v as usize].work = VWork::Task(v);
        }
        vm
    }

    /// (lock_holder, lock_flags, lock_contended_count, lock_preempted_count) of vCPU `v`.
    fn lock_words(vm: &GuestVm, v: u32) -> (u32, u32, u64, u64) {
        let h = vm.guest_half(v, 1);
        (
            h.lock_holder,
            h.lock_flags,
            h.lock_contended_count,
            h.lock_preempted_count,
        )
    }

    #[test]
    fn a_mutex_wait_names_the_holders_vcpu_in_the_waiters_slot_until_another_task_runs() {
        let mut vm = lock_vm(2, true);

        // Task 0 (vCPU 0) contends; the holder, task 1, is vCPU 1's current task and the
        // host half of vCPU 1 says preempted.
        assert!(vm.lock_contention(0, 0, LockKind::Mutex, |v| v == 1));
        let spinning = lock_words(&vm, 0);
        // It sleeps: vCPU 0 goes idle, the wait stays, now with SLEEP.
        vm.dequeue(0, TState::Waiting);
        vm.lock_wait_switch(0, None);
        let sleeping = lock_words(&vm, 0);
        // vCPU 0 runs another task: the wait is gone, the counters stay.
        vm.lock_wait_switch(0, Some(7));
        let other = lock_words(&vm, 0);

        assert_eq!(spinning, (2, abi::LOCK_F_MUTEX, 1, 1));
        assert_eq!(sleeping, (2, abi::LOCK_F_MUTEX | abi::LOCK_F_SLEEP, 1, 1));
        assert_eq!(other, (abi::LOCK_NONE, 0, 1, 1));
        assert_eq!(
            lock_words(&vm, 1),
            (abi::LOCK_NONE, 0, 0, 0),
            "not the holder's slot"
        );
        // The holder's slot says nothing of the lock: the simulated guest does not mark
        // holders at acquisition (F_LOCK_HOLD, ABI minor 6, is not modelled).
        assert_eq!(vm.guest_half(1, 1).cs_flags & !abi::CS_ALL, 0);
    }

    #[test]
    fn a_mutex_wait_ends_when_its_task_runs_with_the_lock() {
        let mut vm = lock_vm(2, true);
        vm.lock_contention(0, 0, LockKind::Mutex, |_| false);
        vm.dequeue(0, TState::Waiting);
        vm.lock_wait_switch(0, None);

        // Handed the lock and switched back in: shown (no SLEEP) until it runs.
        vm.lock_wait_switch(0, Some(0));
        let back = lock_words(&vm, 0);
        vm.lock_wait_end(0, 0);

        assert_eq!(back, (2, abi::LOCK_F_MUTEX, 1, 0));
        assert_eq!(lock_words(&vm, 0), (abi::LOCK_NONE, 0, 1, 0));
    }

    #[test]
    fn a_mutex_holder_not_on_a_vcpu_is_counted_and_named_by_nothing() {
        let mut vm = lock_vm(2, true);
        // vCPU 1 runs another task; the holder waits for it in the guest.
        vm.vcpus[1].cur = Some(9);

        assert!(vm.lock_contention(0, 0, LockKind::Mutex, |_| true));
        assert_eq!(lock_words(&vm, 0), (abi::LOCK_NONE, 0, 1, 0));

        // A holder on the waiter's own vCPU is no contention to count (the module's
        // "running on this CPU").
        let mut same = lock_vm(2, true);
        same.tasks[1].vcpu = 0;
        same.vcpus[0].cur = Some(1);
        assert!(!same.lock_contention(0, 0, LockKind::Mutex, |_| true));
        assert_eq!(lock_words(&same, 0), (abi::LOCK_NONE, 0, 0, 0));
    }

    #[test]
    fn a_spin_wait_shows_any_only_while_another_vcpu_is_preempted() {
        let mut none = lock_vm(3, true);
        let mut own = lock_vm(3, true);
        let mut sibling = lock_vm(3, true);

        none.lock_contention(0, 0, LockKind::Spin, |_| false);
        // Its own vCPU does not count (it runs: the host half is stale).
        own.lock_contention(0, 0, LockKind::Spin, |v| v == 0);
        sibling.lock_contention(0, 0, LockKind::Spin, |v| v == 2);
        // A halted spinner (pv_wait) halts inside its wait: no SLEEP.
        sibling.dequeue(0, TState::Waiting);
        sibling.lock_wait_switch(0, None);

        assert_eq!(lock_words(&none, 0), (abi::LOCK_NONE, 0, 1, 0));
        assert_eq!(lock_words(&own, 0), (abi::LOCK_NONE, 0, 1, 0));
        assert_eq!(
            lock_words(&sibling, 0),
            (abi::LOCK_ANY, abi::LOCK_F_SPIN, 1, 1)
        );
    }

    #[test]
    fn without_lock_waits_the_slot_shows_none_and_counts_none() {
        let mut vm = lock_vm(2, false);

        assert!(!vm.lock_contention(0, 0, LockKind::Mutex, |_| true));
        assert!(!vm.lock_contention(0, 0, LockKind::Spin, |_| true));
        assert_eq!(lock_words(&vm, 0), (abi::LOCK_NONE, 0, 0, 0));
    }

    #[test]
    fn a_woken_rt_task_is_published_as_pending_until_it_runs() {
        let mut vm = vm_with(&[
            GClass::Fair,
            GClass::Rt {
                fifo: false,
                prio: 8,
            },
        ]);
        vm.enqueue(0);
        vm.vcpus[0].cur = Some(0);
        vm.vcpus[0].work = VWork::Task(0);
        vm.enqueue(1);

        let h = vm.guest_half(0, 10);
        assert_eq!(h.policy, abi::POLICY_NORMAL);
        assert_eq!(
            h.guest_pending,
            abi::PENDING_VALID | (u64::from(abi::POLICY_RR) << abi::PENDING_POLICY_SHIFT) | 8
        );

        vm.vcpus[0].cur = Some(1);
        let h = vm.guest_half(0, 20);
        assert_eq!(
            (h.policy, h.rt_priority, h.guest_pending),
            (abi::POLICY_RR, 8, 0)
        );
    }
}
