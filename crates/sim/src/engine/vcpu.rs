//! A vCPU thread's work: guest timers and interrupts, the guest's dispatch (interrupt,
//! context switch, task, idle), halts with guest and host polling, the doorbell.
//!
//! The guest's idle driver (`GuestIdle`) decides at each idle entry between a poll
//! (`VWork::GuestPoll`, a running vCPU that a wakeup catches at once) and a halt (the HLT
//! exit, then KVM's own polling, then the vCPU thread blocks). A poll that runs out halts in
//! the same idle period, as the haltpoll governor's next pick and the pvsched driver do.

use pvsched_policy::{Event, WakeSource};

use super::Sim;
use crate::guest::{
    Behaviour, GClass, GuestHaltPoll, GuestIdle, IdleChoice, Irq, LockPhase, TaskId, VWork,
    GUEST_SLICE_NS,
};
use crate::host::ThreadState;
use crate::results::IdleEntry;

impl Sim {
    /// A guest timer of task `t`; false if it was a stale one.
    pub(super) fn guest_timer(&mut self, vm: u32, t: TaskId, gen: u32) -> bool {
        let now = self.now;
        let g = &mut self.vms[vm as usize];
        let task = &mut g.tasks[t as usize];
        if task.timer_gen != gen {
            return false;
        }
        match task.behaviour {
            Behaviour::Periodic { next, work, .. } | Behaviour::Audio { next, work, .. } => {
                task.expiry = Some(next);
                task.remaining = work;
            }
            // The end of a ping-pong starter's rest: it sends (a moment of work first).
            Behaviour::PingPong { resting: true, .. } => task.remaining = 1,
            // A paravirt spinlock waiter's spin limit: it halts until kicked.
            Behaviour::Lock {
                phase: LockPhase::Spinning,
                ..
            } => {
                self.spin_limit_reached(vm, t);
                return true;
            }
            _ => return false,
        }
        let v = task.vcpu;
        if self.costs.timer_via_main_loop {
            g.main_loop_queue.push_back((v, Irq::Timer(t)));
            let ml = g.main_loop;
            if g.main_loop_queue.len() == 1 {
                // It had no work: blocked, or about to block when it runs again.
                let work = self.costs.main_loop_work_ns.max(1);
                match self.host.state(ml) {
                    ThreadState::Blocked => {
                        self.threads[ml as usize].remaining = work;
                        self.scx_sync();
                        self.host.wake(now, ml, None, &mut self.sw);
                        self.flush();
                    }
                    state => {
                        self.cut(ml, now);
                        self.threads[ml as usize].remaining = work;
                        if matches!(state, ThreadState::Running(_)) {
                            self.schedule_step(ml);
                        }
                    }
                }
            }
        } else {
            self.deliver_irq(vm, v, Irq::Timer(t), None);
        }
        true
    }

    /// An interrupt for vCPU `v`: handled at once if it runs, when it runs if it waits for
    /// a CPU, after a host wakeup if it halted.
    pub(super) fn deliver_irq(&mut self, vm: u32, v: u32, irq: Irq, waker_cpu: Option<u32>) {
        let now = self.now;
        if !self.costs.timer_via_main_loop {
            // KVM's kvm_apic_accept_irq tracepoint: the daemon hears of every interrupt
            // injected (TCG has no such event).
            self.feed(vm, v, Event::InterruptTargeted { vcpu: v });
        }
        let vc = &mut self.vms[vm as usize].vcpus[v as usize];
        vc.irqs.push_back(irq);
        let tid = vc.tid;
        match self.host.state(tid) {
            ThreadState::Running(_) => {
                if vc.work.interruptible() {
                    let w = vc.work;
                    self.cut(tid, now);
                    let vc = &mut self.vms[vm as usize].vcpus[v as usize];
                    if w == VWork::HostPoll {
                        if let Some(h) = vc.halt_start.take() {
                            vc.poll_ns = self.costs.halt_poll.adapt(vc.poll_ns, now - h);
                            self.kvm_halt_ended(vm, v, now - h, true);
                        }
                    }
                    self.dispatch(vm, v);
                }
            }
            ThreadState::Runnable(_) => {}
            ThreadState::Blocked => {
                let source = match irq {
                    Irq::Timer(_) if self.costs.timer_via_main_loop => WakeSource::Io,
                    Irq::Timer(_) => WakeSource::Timer,
                    Irq::Ipi(_) => WakeSource::OtherVcpu,
                };
                let cpu_idle = self.host.last_cpu_idle(tid);
                let rivals = self.rivals_of(vm);
                self.feed(
                    vm,
                    v,
                    Event::Woken {
                        vcpu: v,
                        source,
                        cpu_idle,
                        rivals,
                    },
                );
                self.scx_sync();
                self.host.wake(now, tid, waker_cpu, &mut self.sw);
                self.flush();
            }
        }
    }

    /// KVM's `kvm_vcpu_wakeup` for a halt of `halt_ns` that ended (`polled`: caught by
    /// its halt polling), as pvschedd's feed turns it into [`Event::KvmHaltEnded`]: the
    /// idle meter then takes KVM's account. TCG has no such event.
    pub(super) fn kvm_halt_ended(&mut self, vm: u32, v: u32, halt_ns: u64, polled: bool) {
        if !self.costs.timer_via_main_loop {
            self.feed(
                vm,
                v,
                Event::KvmHaltEnded {
                    vcpu: v,
                    halt_ns,
                    polled,
                },
            );
        }
    }

    /// A task became runnable without an interrupt of its own: wakes its vCPU if halted
    /// (boot), else the next dispatch point picks it.
    pub(super) fn kick_vcpu(&mut self, vm: u32, v: u32, waker_cpu: Option<u32>) {
        let vc = &self.vms[vm as usize].vcpus[v as usize];
        let tid = vc.tid;
        if self.host.state(tid) == ThreadState::Blocked {
            let cpu_idle = self.host.last_cpu_idle(tid);
            let rivals = self.rivals_of(vm);
            self.feed(
                vm,
                v,
                Event::Woken {
                    vcpu: v,
                    source: WakeSource::Unknown,
                    cpu_idle,
                    rivals,
                },
            );
            self.scx_sync();
            self.host.wake(self.now, tid, waker_cpu, &mut self.sw);
            self.flush();
        } else if vc.work.interruptible() && matches!(self.host.state(tid), ThreadState::Running(_))
        {
            self.cut(tid, self.now);
            self.dispatch(vm, v);
        }
    }

    /// Wakes task `t`, from vCPU `from` (None: not from a vCPU).
    pub(super) fn wake_task(&mut self, vm: u32, t: TaskId, from: Option<u32>) {
        let tv = self.vms[vm as usize].tasks[t as usize].vcpu;
        if from == Some(tv) {
            self.vms[vm as usize].enqueue(t);
            return;
        }
        let cpu =
            from.and_then(
                |f| match self.host.state(self.vms[vm as usize].vcpus[f as usize].tid) {
                    ThreadState::Running(c) => Some(c),
                    _ => None,
                },
            );
        self.deliver_irq(vm, tv, Irq::Ipi(t), cpu);
    }

    /// Chooses the next work item of running vCPU `v`.
    pub(super) fn dispatch(&mut self, vm: u32, v: u32) {
        let now = self.now;
        let costs = &self.costs;
        let g = &mut self.vms[vm as usize];
        let tid = g.vcpus[v as usize].tid;
        let next = if let Some(irq) = g.vcpus[v as usize].irqs.pop_front() {
            g.vcpus[v as usize].seq += 1;
            Some((VWork::Irq(irq), costs.guest(costs.guest_irq_ns)))
        } else {
            match g.pick(v) {
                Some(t) if g.vcpus[v as usize].cur != Some(t) => {
                    Some((VWork::Switch(t), costs.guest(costs.guest_switch_ns)))
                }
                Some(t) => {
                    if !g.tasks[t as usize].waits_for_lock() {
                        // It runs with its lock: lock:contention_end.
                        g.lock_wait_end(v, t);
                    }
                    let vc = &g.vcpus[v as usize];
                    let r = g.tasks[t as usize].remaining;
                    let r = if g.tasks[t as usize].class == GClass::Fair && vc.fair.len() > 1 {
                        r.min(GUEST_SLICE_NS.saturating_sub(vc.slice_used).max(1))
                    } else {
                        r
                    };
                    Some((VWork::Task(t), r))
                }
                None => {
                    let vc = &mut g.vcpus[v as usize];
                    if vc.cur.take().is_some() {
                        vc.seq += 1;
                    }
                    g.lock_wait_switch(v, None);
                    None
                }
            }
        };
        let (work, remaining) = match next {
            Some(w) => {
                self.idle_end(vm, v);
                w
            }
            None => self.idle_entry(vm, v),
        };
        let g = &mut self.vms[vm as usize];
        g.vcpus[v as usize].work = work;
        let th = &mut self.threads[tid as usize];
        th.remaining = remaining;
        th.gen = th.gen.wrapping_add(1);
        if th.from.is_none_or(|f| f < now) {
            th.from = Some(now);
        }
        self.schedule_step(tid);
        if self.doorbell {
            self.ring_if_reason_cleared(vm, v);
        }
    }

    /// The idle vCPU `v` picks its idle item: the driver's poll or the HLT exit.
    fn idle_entry(&mut self, vm: u32, v: u32) -> (VWork, u64) {
        let now = self.now;
        let mode = self.guest_idle;
        let vc = &mut self.vms[vm as usize].vcpus[v as usize];
        vc.idle_since.get_or_insert(now);
        if let Some(h) = vc.guest_halt_at.take() {
            // A halt ended without work to run: the governor starts over.
            match mode {
                GuestIdle::Haltpoll => {
                    vc.haltpoll_ns = GuestHaltPoll::STOCK.adapt(vc.haltpoll_ns, now - h)
                }
                GuestIdle::Hinted => vc.hinted.halt_ended(now),
                _ => {}
            }
            vc.guest_polled = false;
        }
        let (polled, haltpoll_ns) = (vc.guest_polled, vc.haltpoll_ns);
        let window = self.costs.guest_halt_poll_ns;
        let choice = match mode {
            _ if polled => IdleChoice::Halt,
            GuestIdle::Halt => IdleChoice::Halt,
            GuestIdle::Fixed if window > 0 => IdleChoice::Poll(window),
            GuestIdle::Haltpoll if haltpoll_ns > 0 => IdleChoice::Poll(haltpoll_ns),
            GuestIdle::Fixed | GuestIdle::Haltpoll => IdleChoice::Halt,
            GuestIdle::Hinted => {
                if vc.hinted.refresh_due(now) {
                    // The host half as the daemon has it now (none in vanilla, static-rt).
                    let half = self.daemon.as_ref().map(|d| d.host_half(vm, v, now));
                    let vc = &mut self.vms[vm as usize].vcpus[v as usize];
                    vc.hinted.refresh(now, half.as_ref());
                }
                self.vms[vm as usize].vcpus[v as usize].hinted.enter(now)
            }
        };
        let entry = match choice {
            IdleChoice::Poll(ns) => {
                self.rec.idle_entry(vm, now, IdleEntry::Poll);
                self.vms[vm as usize].vcpus[v as usize].poll_until = now + ns.max(1);
                return (VWork::GuestPoll, ns.max(1));
            }
            IdleChoice::Halt => IdleEntry::Halt,
            IdleChoice::HaltOverloaded => IdleEntry::OverloadHalt,
            IdleChoice::HaltUnhinted => IdleEntry::UnhintedHalt,
            IdleChoice::HaltBudget => IdleEntry::BudgetHalt,
        };
        self.rec.idle_entry(vm, now, entry);
        self.vms[vm as usize].vcpus[v as usize].guest_halt_at = Some(now);
        (VWork::Exit, (self.costs.exit_entry_ns / 2).max(1))
    }

    /// Running vCPU `v` has guest work again: its idle period, if any, ends now.
    fn idle_end(&mut self, vm: u32, v: u32) {
        let now = self.now;
        let vc = &mut self.vms[vm as usize].vcpus[v as usize];
        if vc.idle_since.take().is_none() {
            return;
        }
        if vc.work == VWork::GuestPoll && !vc.guest_polled {
            self.rec.idle_entry(vm, now, IdleEntry::PollHit);
            vc.hinted.woken_polling(now);
        }
        if let Some(h) = vc.guest_halt_at.take() {
            match self.guest_idle {
                GuestIdle::Haltpoll => {
                    vc.haltpoll_ns = GuestHaltPoll::STOCK.adapt(vc.haltpoll_ns, now - h)
                }
                GuestIdle::Hinted => vc.hinted.halt_ended(now),
                _ => {}
            }
        }
        vc.guest_polled = false;
    }

    /// The doorbell: a boosted vCPU whose guest half no longer shows a reason rings, and
    /// the daemon reads the VM's boosted vCPUs' slots now rather than at its next recheck.
    pub(super) fn ring_if_reason_cleared(&mut self, vm: u32, v: u32) {
        let now = self.now;
        let Some(d) = self.daemon.as_mut() else {
            return;
        };
        let vc = &self.vms[vm as usize].vcpus[v as usize];
        if !d.is_boosted(vm, v) || vc.rung_seq == vc.seq {
            return;
        }
        let half = self.vms[vm as usize].guest_half(v, now);
        let reason = half.cs_flags != 0
            || half.policy != pvsched_abi::POLICY_NORMAL
            || half.guest_pending != 0;
        if reason {
            return;
        }
        self.vms[vm as usize].vcpus[v as usize].rung_seq =
            self.vms[vm as usize].vcpus[v as usize].seq;
        // pvschedd re-reads every boosted vCPU of the VM: the ring does not say which.
        let mut reads = std::mem::take(&mut self.reads);
        reads.clear();
        let g = &self.vms[vm as usize];
        reads.extend(d.boosted_vcpus(vm).map(|w| (w, g.guest_half(w, now))));
        d.handle(vm, now, &reads, None);
        self.reads = reads;
        self.daemon_after(vm);
    }

    pub(super) fn vcpu_item_done(&mut self, vm: u32, v: u32) {
        let now = self.now;
        let work = self.vms[vm as usize].vcpus[v as usize].work;
        match work {
            VWork::Entry | VWork::None | VWork::Halted => {}
            VWork::Irq(irq) => {
                let g = &mut self.vms[vm as usize];
                g.vcpus[v as usize].hardirqs += 1;
                g.vcpus[v as usize].seq += 1;
                match irq {
                    Irq::Timer(t) | Irq::Ipi(t) => g.enqueue(t),
                }
            }
            VWork::Switch(t) => {
                let g = &mut self.vms[vm as usize];
                let vc = &mut g.vcpus[v as usize];
                vc.cur = Some(t);
                vc.switches += 1;
                vc.seq += 1;
                vc.slice_used = 0;
                if matches!(g.tasks[t as usize].class, GClass::Rt { .. }) {
                    g.vcpus[v as usize].rt_switches += 1;
                }
                g.lock_wait_switch(v, Some(t));
                let task = &mut g.tasks[t as usize];
                if let (Some(e), Behaviour::Periodic { .. }) = (task.expiry, &task.behaviour) {
                    task.expiry = None;
                    self.rec.guest_latency(vm, e, now - e);
                }
            }
            VWork::Task(t) => {
                if self.vms[vm as usize].tasks[t as usize].remaining > 0 {
                    self.vms[vm as usize].rotate(v, t);
                } else {
                    self.task_burst_done(vm, v, t);
                }
            }
            VWork::GuestPoll => {
                // It ran out: the halt follows in the same idle period.
                let vc = &mut self.vms[vm as usize].vcpus[v as usize];
                vc.guest_polled = true;
                vc.hinted.poll_ended(now);
            }
            VWork::Exit => {
                let vc = &mut self.vms[vm as usize].vcpus[v as usize];
                if !vc.irqs.is_empty() {
                    // An interrupt came during the exit: back into the guest.
                    self.dispatch(vm, v);
                    return;
                }
                vc.halt_start = Some(now);
                let tid = vc.tid;
                if vc.poll_ns > 0 {
                    vc.work = VWork::HostPoll;
                    let th = &mut self.threads[tid as usize];
                    th.remaining = vc.poll_ns;
                    th.gen = th.gen.wrapping_add(1);
                    self.schedule_step(tid);
                } else {
                    vc.work = VWork::Halted;
                    self.scx_sync();
                    self.host.block(now, tid, &mut self.sw);
                    self.flush();
                }
                return;
            }
            VWork::HostPoll => {
                let vc = &mut self.vms[vm as usize].vcpus[v as usize];
                vc.work = VWork::Halted;
                let tid = vc.tid;
                self.scx_sync();
                self.host.block(now, tid, &mut self.sw);
                self.flush();
                return;
            }
        }
        // The item may have blocked the thread (never for the items above), or an
        // interrupt may have dispatched already: only a running, item-less vCPU goes on.
        let tid = self.vms[vm as usize].vcpus[v as usize].tid;
        if matches!(self.host.state(tid), ThreadState::Running(_)) {
            self.dispatch(vm, v);
        }
    }
}
