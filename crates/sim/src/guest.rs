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
    /// pvsched's hinted driver ([`hinted_choice`]): polls only when the host's measure of
    /// this vCPU's wakeup says halting is expensive and the host is not overloaded.
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

/// The hinted driver's bounds on the halt state's target residency (= its poll window): the
/// module's 1 µs floor and its `idle_max_poll_us` default.
pub const HINTED_MIN_NS: u64 = 1_000;
pub const HINTED_MAX_NS: u64 = 200_000;

/// What an idle vCPU does at an idle entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleChoice {
    /// Poll up to this many ns, then halt.
    Poll(u64),
    Halt,
    /// Halt where the governor would have polled: the host says it is overloaded.
    HaltOverloaded,
    /// Halt: no hint (no host half, or nothing measured yet).
    HaltUnhinted,
}

/// A vCPU's previous idle period, as the guest measured it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastIdle {
    /// From idle entry to guest work again.
    pub ns: u64,
    /// It ended in a halt (else a poll caught the wakeup).
    pub halted: bool,
}

/// The hinted driver at an idle entry, from the host half the daemon publishes for this
/// vCPU (`None`: there is none, as in the vanilla mode), the vCPU's previous idle period
/// and the time to its next guest timer.
///
/// The halt state's target residency is the host's p99 wake → running latency clamped to
/// [`HINTED_MIN_NS`, `HINTED_MAX_NS`], its exit latency the p50 (clamped, at most the
/// target). The governor is menu simplified: its prediction is the earlier of the next
/// timer and the previous idle period, measured as menu measures it (the halt's exit
/// latency deducted, or half of it if it was under twice that); menu's correction factors
/// and typical interval over 8 periods are not modelled. It picks poll when the prediction
/// is below the target residency, and the driver then polls up to the target residency,
/// or halts at once while the host says it is overloaded.
pub fn hinted_choice(
    half: Option<&abi::HostHalf>,
    last: Option<LastIdle>,
    next_timer_ns: Option<u64>,
) -> IdleChoice {
    let Some(h) = half else {
        return IdleChoice::HaltUnhinted;
    };
    if h.wake_p50_ns == 0 || h.wake_p99_ns == 0 {
        return IdleChoice::HaltUnhinted;
    }
    let target = u64::from(h.wake_p99_ns).clamp(HINTED_MIN_NS, HINTED_MAX_NS);
    let exit = u64::from(h.wake_p50_ns)
        .clamp(HINTED_MIN_NS, HINTED_MAX_NS)
        .min(target);
    let measured = last.map(|l| match l.ns {
        d if !l.halted => d,
        d if d > 2 * exit => d - exit,
        d => d / 2,
    });
    let predicted = match (measured, next_timer_ns) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    if predicted.is_none_or(|d| d >= target) {
        return IdleChoice::Halt;
    }
    if h.flags & abi::HF_OVERLOADED != 0 {
        IdleChoice::HaltOverloaded
    } else {
        IdleChoice::Poll(target)
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
    /// When its armed timer expires (guest time; the idle governor's next timer event).
    pub timer_at: Option<u64>,
}

impl Task {
    /// Arms its timer for `at` (an earlier one goes stale); returns the generation.
    pub fn arm_timer(&mut self, at: u64) -> u32 {
        self.timer_gen += 1;
        self.timer_at = Some(at);
        self.timer_gen
    }

    pub fn cancel_timer(&mut self) {
        self.timer_gen += 1;
        self.timer_at = None;
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
}

#[derive(Clone, Debug, Default)]
pub struct Lock {
    pub owner: Option<TaskId>,
    /// Waiters in arrival order (spinners and sleepers alike: FIFO hand-over).
    pub waiters: VecDeque<TaskId>,
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
    /// Its previous idle period (the hinted governor's prediction).
    pub last_idle: Option<LastIdle>,
    /// The guest issued HLT in this idle period (the haltpoll governor's residency).
    pub guest_halt_at: Option<u64>,
    /// The haltpoll governor's window.
    pub haltpoll_ns: u64,
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
    pub hardirqs: u64,
    /// The `seq` at which the doorbell last rang (one ring per published change).
    pub rung_seq: u32,
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
            last_idle: None,
            guest_halt_at: None,
            haltpoll_ns: 0,
            guest_polled: false,
            poll_until: 0,
            switch_in: None,
            switch_in_gen: 0,
            seq: 0,
            switches: 0,
            hardirqs: 0,
            rung_seq: u32::MAX,
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
    /// Whether the guest module publishes lock holders (`CS_LOCK`).
    pub publish_locks: bool,
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

    /// The earliest timer armed by a task of vCPU `v`.
    pub fn next_timer(&self, v: u32) -> Option<u64> {
        self.tasks
            .iter()
            .filter(|t| t.vcpu == v)
            .filter_map(|t| t.timer_at)
            .min()
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
            if self.publish_locks && task.holds_lock() {
                cs_flags |= abi::CS_LOCK;
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
            guest_pending,
            ..Default::default()
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
                timer_at: None,
            })
            .collect();
        GuestVm {
            name: "t".into(),
            vcpus: vec![Vcpu::new(0)],
            tasks,
            locks: Vec::new(),
            main_loop: 1,
            main_loop_queue: VecDeque::new(),
            publish_locks: true,
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

    fn hint(p50: u32, p99: u32, flags: u32) -> abi::HostHalf {
        abi::HostHalf {
            wake_p50_ns: p50,
            wake_p99_ns: p99,
            flags,
            ..Default::default()
        }
    }

    fn polled(ns: u64) -> Option<LastIdle> {
        Some(LastIdle { ns, halted: false })
    }

    #[test]
    fn hinted_polls_up_to_the_clamped_p99_after_a_short_idle() {
        let h = hint(40_000, 90_000, 0);

        assert_eq!(
            hinted_choice(Some(&h), polled(30_000), None),
            IdleChoice::Poll(90_000)
        );
        assert_eq!(
            hinted_choice(Some(&hint(40_000, 900_000, 0)), polled(30_000), None),
            IdleChoice::Poll(HINTED_MAX_NS)
        );
        assert_eq!(
            hinted_choice(Some(&h), polled(120_000), None),
            IdleChoice::Halt
        );
        assert_eq!(hinted_choice(Some(&h), None, None), IdleChoice::Halt);
        assert_eq!(
            hinted_choice(Some(&h), polled(120_000), Some(20_000)),
            IdleChoice::Poll(90_000),
            "a timer due before the target residency"
        );
    }

    #[test]
    fn hinted_deducts_the_halt_exit_latency_from_a_halted_idle() {
        let h = hint(40_000, 90_000, 0);
        let halted = |ns| Some(LastIdle { ns, halted: true });

        // 120 us halted, minus the 40 us exit latency: 80 us, under the 90 us target.
        assert_eq!(
            hinted_choice(Some(&h), halted(120_000), None),
            IdleChoice::Poll(90_000)
        );
        assert_eq!(
            hinted_choice(Some(&h), halted(140_000), None),
            IdleChoice::Halt
        );
    }

    #[test]
    fn hinted_halts_at_once_when_overloaded_or_unhinted() {
        let over = hint(40_000, 90_000, abi::HF_OVERLOADED);

        assert_eq!(
            hinted_choice(Some(&over), polled(1_000), Some(1_000)),
            IdleChoice::HaltOverloaded
        );
        assert_eq!(
            hinted_choice(Some(&hint(0, 0, 0)), polled(1_000), None),
            IdleChoice::HaltUnhinted
        );
        assert_eq!(
            hinted_choice(None, polled(1_000), None),
            IdleChoice::HaltUnhinted
        );
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
