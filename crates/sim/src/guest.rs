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

use crate::scenario::{LockKind, PolicyName};

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
    /// Guest cpuidle-haltpoll.
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
    pub guest_polled: bool,
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
            guest_polled: false,
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
