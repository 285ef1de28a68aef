//! What guest tasks do when a burst of their work ends: sleep to the next period,
//! take or hand over a lock, pass a message; and the tasks a VM spec asks for.

use super::{us, Ev, Sim};
use crate::costs::Costs;
use crate::guest::{
    Behaviour, GClass, GuestVm, Lock, LockPhase, TState, Task, TaskId, VWork, FOREVER,
};
use crate::host::ThreadState;
use crate::rng::Rng;
use crate::scenario::{GuestTaskSpec, LockKind};

impl Sim {
    pub(super) fn task_burst_done(&mut self, vm: u32, v: u32, t: TaskId) {
        let now = self.now;
        let g = &mut self.vms[vm as usize];
        let behaviour = g.tasks[t as usize].behaviour.clone();
        match behaviour {
            Behaviour::Periodic {
                interval,
                work,
                mut next,
            } => {
                next += interval;
                while next <= now {
                    next += interval;
                }
                g.tasks[t as usize].behaviour = Behaviour::Periodic {
                    interval,
                    work,
                    next,
                };
                self.sleep_until_timer(vm, v, t, next);
            }
            Behaviour::Audio { period, work, next } => {
                // This period's work ends now; it was due when the next period began.
                let deadline = next + period;
                self.rec.audio_period(vm, next, now > deadline);
                let mut n = next + period;
                while n <= now {
                    n += period;
                    self.rec.audio_period(vm, n, true);
                }
                g.tasks[t as usize].behaviour = Behaviour::Audio {
                    period,
                    work,
                    next: n,
                };
                self.sleep_until_timer(vm, v, t, n);
            }
            Behaviour::Hog => g.tasks[t as usize].remaining = FOREVER,
            Behaviour::Lock {
                lock_base,
                locks,
                kind,
                spin_limit,
                outside,
                hold,
                phase,
                which,
            } => {
                let li = (lock_base + which) as usize;
                match phase {
                    LockPhase::Outside => {
                        let mut arm = None;
                        let lock: &mut Lock = &mut g.locks[li];
                        let (phase, remaining) = if lock.owner.is_none() {
                            lock.owner = Some(t);
                            (LockPhase::Holding, hold)
                        } else {
                            lock.waiters.push_back(t);
                            // lock:contention_begin: the module looks the holder up.
                            let d = self.daemon.as_ref();
                            g.lock_contention(t, li, kind, |s| {
                                d.is_some_and(|d| d.vcpu_preempted(vm, s))
                            });
                            match kind {
                                LockKind::Spin if spin_limit > 0 => {
                                    let gen = g.tasks[t as usize].arm_timer();
                                    arm = Some((now + spin_limit, gen));
                                    (LockPhase::Spinning, FOREVER)
                                }
                                LockKind::Spin => (LockPhase::Spinning, FOREVER),
                                LockKind::Mutex => (LockPhase::Blocked, 0),
                            }
                        };
                        set_lock_phase(&mut g.tasks[t as usize], phase, which);
                        g.tasks[t as usize].remaining = remaining;
                        if phase == LockPhase::Blocked {
                            g.dequeue(t, TState::Waiting);
                        }
                        g.vcpus[v as usize].seq += 1;
                        if let Some((at, gen)) = arm {
                            self.push(at, Ev::GuestTimer { vm, task: t, gen });
                        }
                    }
                    LockPhase::Holding => {
                        self.rec.lock_acquired(vm, now);
                        let next_which = (which + 1) % locks;
                        set_lock_phase(&mut g.tasks[t as usize], LockPhase::Outside, next_which);
                        g.tasks[t as usize].remaining = outside.max(1);
                        g.vcpus[v as usize].seq += 1;
                        let lock = &mut g.locks[li];
                        lock.owner = None;
                        if let Some(w) = lock.waiters.pop_front() {
                            lock.owner = Some(w);
                            let wt = &mut g.tasks[w as usize];
                            let was = match wt.behaviour {
                                Behaviour::Lock { phase, .. } => phase,
                                _ => LockPhase::Outside,
                            };
                            set_lock_phase(wt, LockPhase::Holding, which);
                            wt.remaining = hold;
                            wt.cancel_timer();
                            let wv = wt.vcpu;
                            match was {
                                LockPhase::Blocked => self.wake_task(vm, w, Some(v)),
                                _ => {
                                    // A spinner: if it spins right now, it takes the lock now.
                                    let g = &self.vms[vm as usize];
                                    let wtid = g.vcpus[wv as usize].tid;
                                    if wv != v
                                        && g.vcpus[wv as usize].work == VWork::Task(w)
                                        && matches!(self.host.state(wtid), ThreadState::Running(_))
                                    {
                                        self.cut(wtid, now);
                                        self.vms[vm as usize].tasks[w as usize].remaining = hold;
                                        self.dispatch(vm, wv);
                                    }
                                }
                            }
                        }
                    }
                    LockPhase::Spinning | LockPhase::Blocked => {}
                }
            }
            Behaviour::PingPong {
                peer,
                work,
                starter,
                gap,
                resting,
            } => {
                let g = &mut self.vms[vm as usize];
                g.dequeue(t, TState::Sleeping);
                g.vcpus[v as usize].seq += 1;
                if starter && !resting && gap > 0 {
                    // A reply handled: rest, then send the next message.
                    self.rec.message(vm, now, true);
                    let rest = self.rng.exp(gap);
                    let task = &mut self.vms[vm as usize].tasks[t as usize];
                    set_resting(task, true);
                    let gen = task.arm_timer();
                    self.push(now + rest, Ev::GuestTimer { vm, task: t, gen });
                    return;
                }
                if starter && !resting {
                    self.rec.message(vm, now, true);
                }
                let g = &mut self.vms[vm as usize];
                set_resting(&mut g.tasks[t as usize], false);
                g.tasks[peer as usize].remaining = work;
                self.wake_task(vm, peer, Some(v));
            }
        }
    }

    /// Task `t` of vCPU `v` sleeps until its timer at `at` (delivered `timer_latency_ns`
    /// later); a timer armed before is cancelled.
    fn sleep_until_timer(&mut self, vm: u32, v: u32, t: TaskId, at: u64) {
        let g = &mut self.vms[vm as usize];
        let gen = g.tasks[t as usize].arm_timer();
        g.dequeue(t, TState::Sleeping);
        g.vcpus[v as usize].seq += 1;
        self.push(
            at + self.costs.timer_latency_ns,
            Ev::GuestTimer { vm, task: t, gen },
        );
    }

    /// A spinning waiter spun `spin_limit`: it stops spinning and halts (sleeps) until the
    /// releaser hands it the lock and kicks it.
    pub(super) fn spin_limit_reached(&mut self, vm: u32, t: TaskId) {
        let g = &mut self.vms[vm as usize];
        let v = g.tasks[t as usize].vcpu;
        let tid = g.vcpus[v as usize].tid;
        let spinning_now = g.vcpus[v as usize].work == VWork::Task(t)
            && matches!(self.host.state(tid), ThreadState::Running(_));
        if spinning_now {
            self.cut(tid, self.now);
        }
        let g = &mut self.vms[vm as usize];
        if let Behaviour::Lock { which, .. } = g.tasks[t as usize].behaviour {
            set_lock_phase(&mut g.tasks[t as usize], LockPhase::Blocked, which);
        }
        g.tasks[t as usize].remaining = 0;
        g.dequeue(t, TState::Waiting);
        g.vcpus[v as usize].seq += 1;
        if spinning_now {
            self.dispatch(vm, v);
        }
    }
}

fn set_resting(task: &mut Task, value: bool) {
    if let Behaviour::PingPong { resting, .. } = &mut task.behaviour {
        *resting = value;
    }
}

fn set_lock_phase(task: &mut Task, new: LockPhase, new_which: u32) {
    if let Behaviour::Lock { phase, which, .. } = &mut task.behaviour {
        *phase = new;
        *which = new_which;
    }
}

/// The tasks of one VM from its spec, bound to vCPUs.
pub(super) fn add_guest_tasks(
    vm: &mut GuestVm,
    spec: &crate::scenario::VmSpec,
    costs: &Costs,
    rng: &mut Rng,
) {
    let nv = vm.vcpus.len() as u32;
    let task = |vm: &mut GuestVm, vcpu: u32, class: GClass, remaining: u64, b: Behaviour| {
        vm.tasks.push(Task {
            vcpu,
            class,
            state: TState::Sleeping,
            remaining,
            behaviour: b,
            expiry: None,
            timer_gen: 0,
        });
        vm.tasks.len() as u32 - 1
    };
    for t in &spec.tasks {
        match *t {
            GuestTaskSpec::Periodic {
                interval_us,
                work_us,
                policy,
                prio,
            } => {
                for v in 0..nv {
                    let interval = us(interval_us);
                    let next = rng.below(interval) + 1;
                    let work = costs.guest(us(work_us));
                    task(
                        vm,
                        v,
                        GClass::of(policy, prio),
                        work,
                        Behaviour::Periodic {
                            interval,
                            work,
                            next,
                        },
                    );
                }
            }
            GuestTaskSpec::Audio {
                period_us,
                work_us,
                policy,
                prio,
            } => {
                let period = us(period_us);
                // Work measured in the guest's own CPU time (audiosim spins on its thread
                // clock), which runs at wall speed even under TCG: not scaled.
                let work = us(work_us);
                let next = rng.below(period) + 1;
                task(
                    vm,
                    0,
                    GClass::of(policy, prio),
                    work,
                    Behaviour::Audio { period, work, next },
                );
            }
            GuestTaskSpec::Hog { policy, prio } => {
                for v in 0..nv {
                    task(vm, v, GClass::of(policy, prio), FOREVER, Behaviour::Hog);
                }
            }
            GuestTaskSpec::Lock {
                threads_per_vcpu,
                locks,
                lock_kind,
                outside_us,
                hold_us,
                spin_limit_us,
            } => {
                let lock_base = vm.locks.len() as u32;
                vm.locks.extend((0..locks).map(|_| Lock::default()));
                let (outside, hold) = (costs.guest(us(outside_us)), costs.guest(us(hold_us)));
                for v in 0..nv {
                    for k in 0..threads_per_vcpu {
                        let first = rng.below(outside.max(1)) + 1;
                        task(
                            vm,
                            v,
                            GClass::Fair,
                            first,
                            Behaviour::Lock {
                                lock_base,
                                locks,
                                kind: lock_kind,
                                spin_limit: us(spin_limit_us),
                                outside,
                                hold,
                                phase: LockPhase::Outside,
                                which: (v * threads_per_vcpu + k) % locks,
                            },
                        );
                    }
                }
            }
            GuestTaskSpec::PingPong { work_us, gap_us } => {
                let work = costs.guest(us(work_us));
                let gap = us(gap_us);
                let a = vm.tasks.len() as u32;
                task(
                    vm,
                    0,
                    GClass::Fair,
                    work,
                    Behaviour::PingPong {
                        peer: a + 1,
                        work,
                        starter: true,
                        gap,
                        resting: false,
                    },
                );
                task(
                    vm,
                    1,
                    GClass::Fair,
                    work,
                    Behaviour::PingPong {
                        peer: a,
                        work,
                        starter: false,
                        gap,
                        resting: false,
                    },
                );
            }
        }
    }
}
