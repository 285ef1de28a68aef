//! The event loop: one simulated machine in one mode, from the scenario to the results.
//!
//! Time is in ns from 0. Events are ordered by (time, insertion order), so a run is a pure
//! function of the scenario, the mode and the seed. The host model ([`crate::host`])
//! decides who runs; this module makes the running threads do their work: host tasks,
//! vCPU threads (the guest's interrupts, context switches, tasks, halts) and the VMM's
//! main loop, and, in the pvsched modes, the daemon ([`crate::daemon`]).
//!
//! `vcpu.rs`: a vCPU thread's work (interrupts, guest switches, halts, the guest's idle
//! driver); `tasks.rs`: what guest tasks do (periodic, audio, locks, ping-pong); `feed.rs`:
//! pvschedd's inputs.

mod feed;
#[cfg(test)]
mod lock_tests;
mod tasks;
#[cfg(test)]
mod tests;
mod vcpu;

use tasks::add_guest_tasks;

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use pvsched_policy::serving::DEFAULT_DISCOVERY_INTERVAL_NS;
use pvsched_policy::{Event, Rivals};

use crate::costs::Costs;
use crate::daemon::Daemon;
use crate::guest::{Behaviour, GuestIdle, GuestVm, TaskId, VWork, Vcpu, FOREVER};
use crate::host::{Class, Host, HostParams, Switch, SwitchOut, ThreadState, Tid};
use crate::results::{ModeResult, Recorder};
use crate::rng::Rng;
use crate::scenario::{HostTaskSpec, PolicyName, Scenario};

/// What is compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Vanilla,
    StaticRt,
    /// pvschedd and the guest module, without the doorbell and lock waits (pvschedd's
    /// defaults: `honor_lock_holders` off, no reads of the other slots at a preemption).
    Pvsched,
    /// pvsched, and the guest rings a doorbell when a boosted vCPU's reason clears (it
    /// leaves a critical section, its RT task stops): the daemon re-reads the slot at once
    /// instead of at its next recheck (the host-cost issue's design, built since; pvschedd
    /// re-reads every boosted vCPU of the VM at a ring).
    PvschedDoorbell,
    /// pvsched with the doorbell, and the guest publishes its lock waits (ABI 1.3's
    /// `F_LOCK_WAIT`, as the module builds them: in the waiter's slot, a mutex's holder's
    /// vCPU or "any other vCPU" for a spinlock while one is preempted), which the policy
    /// answers with lock-holder extensions and lock debt.
    PvschedLocks,
    /// pvschedd on its sched_ext backend: the host's fair class is pvsched's own sched_ext
    /// scheduler (`host/scx.rs`), which decides the guest's RT work itself within the
    /// policy's terms; the policy's own boosts are grants; no doorbell, no lock waits.
    PvschedScx,
}

impl Mode {
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "vanilla" => Some(Mode::Vanilla),
            "static-rt" => Some(Mode::StaticRt),
            "pvsched" => Some(Mode::Pvsched),
            "pvsched-doorbell" => Some(Mode::PvschedDoorbell),
            "pvsched-locks" => Some(Mode::PvschedLocks),
            "pvsched-scx" => Some(Mode::PvschedScx),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Vanilla => "vanilla",
            Mode::StaticRt => "static-rt",
            Mode::Pvsched => "pvsched",
            Mode::PvschedDoorbell => "pvsched-doorbell",
            Mode::PvschedLocks => "pvsched-locks",
            Mode::PvschedScx => "pvsched-scx",
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    HostTimer,
    Step {
        tid: Tid,
        gen: u32,
    },
    HostTask {
        task: u32,
    },
    GuestTimer {
        vm: u32,
        task: TaskId,
        gen: u32,
    },
    /// A daemon decision takes effect (`vcpu == u32::MAX`: the VM's main loop; `proactive`:
    /// on the sched_ext backend, a boost that holds until the daemon ends it).
    Apply {
        vm: u32,
        vcpu: u32,
        class: Class,
        proactive: bool,
    },
    /// pvschedd's scan on the sched_ext backend: charges and renews the scheduler's terms.
    ScxScan,
    DaemonTick {
        vm: u32,
    },
    /// pvschedd's discovery round: the host's CPU pressure, hence the overload flag.
    Discovery,
    /// pvschedd sees vCPU `vcpu` switched in, after its CPU's idle exit.
    SwitchIn {
        vm: u32,
        vcpu: u32,
        gen: u32,
    },
    MeasureStart,
    Progress,
}

struct Queued {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> Ordering {
        // BinaryHeap is a max-heap: earliest first.
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Clone, Copy, Debug)]
enum Owner {
    HostTask(u32),
    Vcpu { vm: u32, vcpu: u32 },
    MainLoop(u32),
}

#[derive(Clone, Copy, Debug)]
struct ThreadRt {
    owner: Owner,
    gen: u32,
    /// When its current work item makes progress from (a switch-in's cost after the
    /// switch); `None` while not running.
    from: Option<u64>,
    remaining: u64,
}

#[derive(Clone, Debug)]
enum HostKind {
    Hog,
    Bursty {
        run: u64,
        sleep: u64,
    },
    Periodic {
        interval: u64,
        work: u64,
        next: u64,
        expiry: Option<u64>,
    },
}

#[derive(Clone, Debug)]
struct HostTask {
    tid: Tid,
    kind: HostKind,
}

pub struct Sim {
    now: u64,
    seq: u64,
    queue: BinaryHeap<Queued>,
    host: Host,
    host_timer_at: Option<u64>,
    costs: Costs,
    threads: Vec<ThreadRt>,
    host_tasks: Vec<HostTask>,
    vms: Vec<GuestVm>,
    daemon: Option<Daemon>,
    sw: Vec<Switch>,
    sw_spare: Vec<Switch>,
    rng: Rng,
    rec: Recorder,
    end: u64,
    events: u64,
    /// Scratch for the daemon's decisions.
    applies: Vec<crate::daemon::Apply>,
    /// Scratch for the slots the daemon reads for one event.
    reads: Vec<(u32, pvsched_abi::GuestHalf)>,
    /// The policy's counters when the measured window opened (pvsched modes).
    policy_at_start: Option<Vec<pvsched_policy::VmStats>>,
    /// The guest rings when a boost's reason clears (pvsched-doorbell, pvsched-locks).
    doorbell: bool,
    /// The guests' idle driver.
    guest_idle: GuestIdle,
    /// The host's fair class is pvsched's sched_ext scheduler (`pvsched-scx`).
    scx: bool,
    /// The host's CPU pressure at the last discovery round, when tracked.
    cpu_pressure: Option<f64>,
    progress: Option<(u64, std::time::Instant)>,
}

/// Runs `scenario` in `mode`: the results of the measured window.
pub fn run(
    scenario: &Scenario,
    variant: Option<&crate::scenario::Variant>,
    mode: Mode,
    seed: u64,
    progress: bool,
) -> Result<ModeResult, crate::error::SimError> {
    let costs = scenario.costs_for(variant);
    let limits = scenario.limits_for(variant)?;
    let mut sim = Sim::build(scenario, variant, mode, costs, limits, seed, progress);
    sim.run_to_end();
    Ok(sim.finish(scenario, variant, mode, seed))
}

fn secs(s: f64) -> u64 {
    (s * 1e9).round() as u64
}

fn us(u: u64) -> u64 {
    u.saturating_mul(1_000)
}

fn host_class(policy: PolicyName, prio: u8, nice: i8) -> Class {
    match policy {
        PolicyName::Normal => Class::Fair { nice },
        PolicyName::Fifo => Class::Fifo { prio },
        PolicyName::Rr => Class::Rr { prio },
    }
}

impl Sim {
    fn build(
        sc: &Scenario,
        variant: Option<&crate::scenario::Variant>,
        mode: Mode,
        costs: Costs,
        limits: pvsched_policy::VmLimits,
        seed: u64,
        progress: bool,
    ) -> Sim {
        // Lock holders are honoured in the lock-wait mode only (pvschedd's default is off).
        let limits = pvsched_policy::VmLimits {
            honor_lock_holders: mode == Mode::PvschedLocks,
            ..limits
        };
        let mut rng = Rng::new(seed);
        let scx = mode == Mode::PvschedScx;
        let host = Host::new(HostParams {
            cpus: sc.host.cpus,
            fair: sc.host.fair,
            scx: scx.then(crate::host::ScxParams::default),
            ..HostParams::default()
        });
        let warmup = secs(sc.warmup_s);
        let end = warmup + secs(sc.duration_s);
        let mut sim = Sim {
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            host,
            host_timer_at: None,
            costs,
            threads: Vec::new(),
            host_tasks: Vec::new(),
            vms: Vec::new(),
            daemon: None,
            sw: Vec::new(),
            sw_spare: Vec::new(),
            rng: rng.fork(1),
            rec: Recorder::new(warmup),
            end,
            events: 0,
            applies: Vec::new(),
            reads: Vec::new(),
            policy_at_start: None,
            doorbell: matches!(mode, Mode::PvschedDoorbell | Mode::PvschedLocks),
            guest_idle: sc.guest_idle_for(variant),
            scx,
            cpu_pressure: None,
            progress: progress.then(|| (0, std::time::Instant::now())),
        };

        // Host load and the host's latency task.
        for spec in sc.host_tasks_for(variant) {
            match *spec {
                HostTaskSpec::Hog { count, nice } => {
                    for _ in 0..count {
                        sim.spawn_host_task(Class::Fair { nice }, HostKind::Hog);
                    }
                }
                HostTaskSpec::Bursty {
                    count,
                    run_us,
                    sleep_us,
                } => {
                    for _ in 0..count {
                        sim.spawn_host_task(
                            Class::Fair { nice: 0 },
                            HostKind::Bursty {
                                run: us(run_us),
                                sleep: us(sleep_us),
                            },
                        );
                    }
                }
                HostTaskSpec::Steal { run_us, every_us } => {
                    for cpu in 0..sc.host.cpus {
                        sim.spawn_host_task_on(
                            Class::Fifo { prio: 99 },
                            Some(vec![cpu]),
                            HostKind::Bursty {
                                run: us(run_us),
                                sleep: us(every_us),
                            },
                        );
                    }
                }
                HostTaskSpec::Periodic {
                    count,
                    interval_us,
                    work_us,
                    policy,
                    prio,
                } => {
                    for k in 0..count {
                        let phase = rng.below(us(interval_us));
                        // One thread per CPU, pinned, as `cyclictest -a`.
                        sim.spawn_host_task_on(
                            host_class(policy, prio, 0),
                            Some(vec![k % sc.host.cpus]),
                            HostKind::Periodic {
                                interval: us(interval_us),
                                work: us(work_us),
                                next: phase,
                                expiry: None,
                            },
                        );
                    }
                }
            }
        }

        // VMs.
        let dropped = |name: &str| variant.is_some_and(|v| v.drop_vms.iter().any(|d| d == name));
        let vcpu_class = match mode {
            Mode::StaticRt => Class::Rr {
                prio: sc.pvsched.static_rt_priority,
            },
            _ => Class::Fair { nice: 0 },
        };
        for spec in sc.vms.iter().filter(|v| !dropped(&v.name)) {
            for k in 0..spec.count {
                let name = if spec.count == 1 {
                    spec.name.clone()
                } else {
                    format!("{}-{k}", spec.name)
                };
                let vm_idx = sim.vms.len() as u32;
                let main_loop = sim.host.spawn(Class::Fair { nice: 0 }, None);
                sim.add_thread(Owner::MainLoop(vm_idx));
                if scx {
                    // pvschedd registers the latency path (no slot) and the vCPUs.
                    sim.host.scx_register(main_loop, false);
                }
                let mut vcpus = Vec::new();
                for v in 0..spec.vcpus {
                    let tid = sim.host.spawn(vcpu_class, None);
                    if scx {
                        sim.host.scx_register(tid, true);
                    }
                    sim.add_thread(Owner::Vcpu {
                        vm: vm_idx,
                        vcpu: v,
                    });
                    vcpus.push(Vcpu::new(tid));
                }
                let mut vm = GuestVm {
                    name,
                    vcpus,
                    tasks: Vec::new(),
                    locks: Vec::new(),
                    main_loop,
                    main_loop_queue: Default::default(),
                    publish_lock_waits: mode == Mode::PvschedLocks,
                };
                sim.rec.add_vm(&vm.name);
                add_guest_tasks(&mut vm, spec, &sim.costs, &mut rng);
                sim.vms.push(vm);
            }
        }

        if matches!(
            mode,
            Mode::Pvsched | Mode::PvschedDoorbell | Mode::PvschedLocks | Mode::PvschedScx
        ) {
            let nr: Vec<u32> = sim.vms.iter().map(|v| v.vcpus.len() as u32).collect();
            let mut daemon = Daemon::new(
                &nr,
                limits,
                sc.pvsched.boost_latency_path,
                sim.costs.daemon_reaction_ns,
                sim.costs.daemon_recheck_ns,
                sim.doorbell,
            );
            if scx {
                daemon.scx_backend();
                // The daemon serves the VMs from the start: its first scan sets the terms.
                sim.push(0, Ev::ScxScan);
            }
            sim.daemon = Some(daemon);
            // The overload flag has a reader only in the hinted driver: other runs keep
            // their events (and figures) as they were.
            if sim.guest_idle == GuestIdle::Hinted {
                sim.host.track_cpu_pressure();
                sim.push(DEFAULT_DISCOVERY_INTERVAL_NS, Ev::Discovery);
            }
        }

        // Start: hogs and bursty tasks run, periodic ones arm, guests boot their tasks.
        for i in 0..sim.host_tasks.len() {
            match sim.host_tasks[i].kind {
                HostKind::Hog | HostKind::Bursty { .. } => {
                    let tid = sim.host_tasks[i].tid;
                    sim.threads[tid as usize].remaining = match sim.host_tasks[i].kind {
                        HostKind::Bursty { run, .. } => sim.rng.exp(run),
                        _ => FOREVER,
                    };
                    sim.host.wake(0, tid, None, &mut sim.sw);
                    sim.flush();
                }
                HostKind::Periodic { next, .. } => {
                    let lat = sim.costs.timer_latency_ns;
                    sim.push(next + lat, Ev::HostTask { task: i as u32 })
                }
            }
        }
        for vm in 0..sim.vms.len() as u32 {
            sim.boot_guest(vm);
        }
        sim.push(warmup, Ev::MeasureStart);
        if sim.progress.is_some() {
            sim.push(secs(1.0), Ev::Progress);
        }
        sim
    }

    fn spawn_host_task(&mut self, class: Class, kind: HostKind) {
        self.spawn_host_task_on(class, None, kind);
    }

    fn spawn_host_task_on(&mut self, class: Class, cpus: Option<Vec<u32>>, kind: HostKind) {
        let tid = self.host.spawn(class, cpus);
        let i = self.host_tasks.len() as u32;
        self.add_thread(Owner::HostTask(i));
        self.host_tasks.push(HostTask { tid, kind });
    }

    fn add_thread(&mut self, owner: Owner) {
        self.threads.push(ThreadRt {
            owner,
            gen: 0,
            from: None,
            remaining: 0,
        });
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Queued {
            at,
            seq: self.seq,
            ev,
        });
    }

    fn boot_guest(&mut self, vm: u32) {
        let n = self.vms[vm as usize].tasks.len() as u32;
        for t in 0..n {
            let task = &mut self.vms[vm as usize].tasks[t as usize];
            match task.behaviour {
                Behaviour::Periodic { next, .. } | Behaviour::Audio { next, .. } => {
                    let gen = task.timer_gen;
                    let lat = self.costs.timer_latency_ns;
                    self.push(next + lat, Ev::GuestTimer { vm, task: t, gen });
                }
                Behaviour::PingPong { starter: false, .. } => {}
                Behaviour::Lock { .. } | Behaviour::Hog | Behaviour::PingPong { .. } => {
                    let v = task.vcpu;
                    self.vms[vm as usize].enqueue(t);
                    self.kick_vcpu(vm, v, None);
                }
            }
        }
    }

    fn run_to_end(&mut self) {
        self.run_until(self.end);
        self.now = self.end;
    }

    /// Handles every event up to `t` (inclusive).
    fn run_until(&mut self, t: u64) {
        while self.queue.peek().is_some_and(|q| q.at <= t) {
            let Some(q) = self.queue.pop() else {
                break;
            };
            debug_assert!(q.at >= self.now);
            self.now = q.at;
            if self.handle(q.ev) {
                self.events += 1;
            }
            // Even after a stale event: the host's next deadline must always be queued, or
            // a later call would make the host catch up on it in the past.
            self.arm_host_timer();
        }
    }

    fn arm_host_timer(&mut self) {
        if let Some(t) = self.host.next_timer() {
            if self.host_timer_at.is_none_or(|a| t < a || a < self.now) {
                self.host_timer_at = Some(t);
                self.push(t.max(self.now), Ev::HostTimer);
            }
        }
    }

    /// Handles one event; false if it was stale (a step or timer since superseded) or only
    /// the progress line, so that the event count is the simulation's own work.
    fn handle(&mut self, ev: Ev) -> bool {
        let now = self.now;
        match ev {
            Ev::HostTimer => {
                if self.host_timer_at.is_some_and(|a| a <= now) {
                    self.host_timer_at = None;
                }
                if self.host.next_timer().is_none_or(|t| t > now) {
                    return false;
                }
                self.scx_sync();
                self.host.on_timer(now, &mut self.sw);
                self.flush();
            }
            Ev::Step { tid, gen } => {
                let th = &self.threads[tid as usize];
                if th.gen != gen || th.from.is_none() {
                    return false;
                }
                // Accounts the item's progress (a task's work, a slice) up to its end.
                self.cut(tid, now);
                debug_assert_eq!(self.threads[tid as usize].remaining, 0);
                self.step(tid);
            }
            Ev::HostTask { task } => self.host_task_timer(task),
            Ev::GuestTimer { vm, task, gen } => return self.guest_timer(vm, task, gen),
            Ev::Apply {
                vm,
                vcpu,
                class,
                proactive,
            } => {
                let tid = if vcpu == u32::MAX {
                    self.vms[vm as usize].main_loop
                } else {
                    self.vms[vm as usize].vcpus[vcpu as usize].tid
                };
                if self.scx {
                    self.scx_apply(tid, class, proactive);
                } else if self.host.class(tid) != class {
                    self.host.set_class(now, tid, class, &mut self.sw);
                    self.flush();
                }
            }
            Ev::DaemonTick { vm } => return self.daemon_tick(vm),
            Ev::ScxScan => self.scx_scan(),
            Ev::Discovery => self.discovery_round(),
            Ev::SwitchIn { vm, vcpu, gen } => {
                let vc = &mut self.vms[vm as usize].vcpus[vcpu as usize];
                if vc.switch_in != Some(gen) {
                    return false;
                }
                vc.switch_in = None;
                self.feed(vm, vcpu, Event::Running { vcpu });
            }
            Ev::MeasureStart => {
                let times: Vec<(u64, u64)> = (0..self.threads.len() as u32)
                    .map(|t| (self.host.cpu_time(t, now), self.host.rt_time(t, now)))
                    .collect();
                self.rec.start(times);
                self.policy_at_start = self.daemon.as_ref().map(|d| d.stats());
            }
            Ev::Progress => {
                if let Some((_, started)) = self.progress {
                    eprintln!(
                        "pvsched-sim: {:.0} of {:.0} simulated s, {} events, {:.1} s",
                        now as f64 * 1e-9,
                        self.end as f64 * 1e-9,
                        self.events,
                        started.elapsed().as_secs_f64()
                    );
                }
                self.push(now + secs(1.0), Ev::Progress);
                return false;
            }
        }
        true
    }

    // ---- host switches ----

    fn flush(&mut self) {
        while !self.sw.is_empty() {
            let mut batch = std::mem::take(&mut self.sw);
            std::mem::swap(&mut self.sw, &mut self.sw_spare);
            for s in batch.drain(..) {
                self.on_switch(s);
            }
            self.sw_spare = batch;
        }
    }

    fn on_switch(&mut self, s: Switch) {
        debug_assert!(
            s.at >= self.now,
            "a switch in the past: {s:?} at {}",
            self.now
        );
        if let Some((tid, how)) = s.prev {
            self.thread_off(tid, s.at, how);
        }
        if let Some(tid) = s.next {
            self.thread_on(tid, s.at, s.prev.is_none());
        }
    }

    /// Brings the running thread's progress up to `now` and stops its pending step.
    fn cut(&mut self, tid: Tid, now: u64) {
        let th = &mut self.threads[tid as usize];
        if let Some(f) = th.from {
            let done = now.saturating_sub(f).min(th.remaining);
            th.remaining -= done;
            th.from = Some(f.max(now));
            if let Owner::Vcpu { vm, vcpu } = th.owner {
                let g = &mut self.vms[vm as usize];
                match g.vcpus[vcpu as usize].work {
                    VWork::Task(t) => {
                        // The item may be a slice of the task's work: the task keeps the rest.
                        g.vcpus[vcpu as usize].slice_used += done;
                        let task = &mut g.tasks[t as usize];
                        task.remaining = task.remaining.saturating_sub(done);
                    }
                    VWork::GuestPoll => self.rec.poll(vm, true, f, f + done),
                    VWork::HostPoll => self.rec.poll(vm, false, f, f + done),
                    _ => {}
                }
            }
        }
        th.gen = th.gen.wrapping_add(1);
    }

    fn schedule_step(&mut self, tid: Tid) {
        let th = &self.threads[tid as usize];
        if let Some(f) = th.from {
            if th.remaining < FOREVER {
                let (at, gen) = (f + th.remaining, th.gen);
                self.push(at, Ev::Step { tid, gen });
            }
        }
    }

    /// What the host CPUs run besides VM `vm`: what pvschedd's BPF programs flag
    /// (`find_rivals`). The simulated daemon takes no host CPU, so only idle CPUs and the
    /// VM's own vCPU and main-loop threads are no rivals; every simulated VM is served
    /// (the mode is the whole host's), so another VM's thread is a peer VM's.
    /// Stops at the first host task, as the programs' search does (called at every
    /// switch-out and wakeup of a vCPU).
    pub(super) fn rivals_of(&self, vm: u32) -> Rivals {
        let mut seen = Rivals::None;
        for t in (0..self.host.cpus()).filter_map(|cpu| self.host.current(cpu)) {
            match self.threads[t as usize].owner {
                Owner::Vcpu { vm: of, .. } | Owner::MainLoop(of) if of == vm => {}
                Owner::Vcpu { .. } | Owner::MainLoop(_) => seen = Rivals::PeerVms,
                Owner::HostTask(_) => return Rivals::Host,
            }
        }
        seen
    }

    fn thread_off(&mut self, tid: Tid, at: u64, how: SwitchOut) {
        self.cut(tid, at);
        self.threads[tid as usize].from = None;
        if let Owner::Vcpu { vm, vcpu } = self.threads[tid as usize].owner {
            if self.vms[vm as usize].vcpus[vcpu as usize]
                .switch_in
                .take()
                .is_some()
            {
                // Off its CPU before the idle exit ended: it was switched in all the same.
                self.feed(vm, vcpu, Event::Running { vcpu });
            }
            let g = &self.vms[vm as usize];
            if how == SwitchOut::Preempted {
                if let Some(c) = g.vcpus[vcpu as usize].cur {
                    let task = &g.tasks[c as usize];
                    if task.holds_lock() {
                        self.rec.holder_preempted(vm, at);
                    }
                }
            }
            let rivals = self.rivals_of(vm);
            let ev = match how {
                SwitchOut::Preempted => Event::Preempted { vcpu, rivals },
                SwitchOut::Blocked => Event::Blocked { vcpu, rivals },
            };
            self.feed(vm, vcpu, ev);
        }
    }

    fn thread_on(&mut self, tid: Tid, at: u64, cpu_was_idle: bool) {
        let cost = self.costs.host_switch_ns
            + if cpu_was_idle {
                self.costs.idle_wakeup_ns
            } else {
                0
            };
        let start = at + cost;
        self.threads[tid as usize].from = Some(start);
        match self.threads[tid as usize].owner {
            Owner::HostTask(i) => {
                if let HostKind::Periodic { expiry, .. } = &mut self.host_tasks[i as usize].kind {
                    if let Some(e) = expiry.take() {
                        self.rec.host_latency(e, start - e);
                    }
                }
                self.schedule_step(tid);
            }
            Owner::MainLoop(_) => self.schedule_step(tid),
            Owner::Vcpu { vm, vcpu } => {
                if cpu_was_idle && self.costs.idle_exit_before_switch && self.daemon.is_some() {
                    let vc = &mut self.vms[vm as usize].vcpus[vcpu as usize];
                    vc.switch_in_gen = vc.switch_in_gen.wrapping_add(1);
                    let gen = vc.switch_in_gen;
                    vc.switch_in = Some(gen);
                    self.push(
                        at + self.costs.idle_wakeup_ns,
                        Ev::SwitchIn { vm, vcpu, gen },
                    );
                } else {
                    self.feed(vm, vcpu, Event::Running { vcpu });
                }
                let vc = &mut self.vms[vm as usize].vcpus[vcpu as usize];
                match vc.work {
                    VWork::Halted | VWork::None => {
                        let ended = vc.halt_start.take();
                        if let Some(h) = ended {
                            vc.poll_ns = self.costs.halt_poll.adapt(vc.poll_ns, at - h);
                        }
                        vc.work = VWork::Entry;
                        self.threads[tid as usize].remaining = self.costs.exit_entry_ns / 2;
                        self.schedule_step(tid);
                        if let Some(h) = ended {
                            self.kvm_halt_ended(vm, vcpu, at - h, false);
                        }
                    }
                    VWork::Task(_) => self.dispatch(vm, vcpu),
                    w if w.interruptible() && !vc.irqs.is_empty() => self.dispatch(vm, vcpu),
                    VWork::GuestPoll => {
                        // Back from a preemption: it polls on only if its time is not up.
                        let left = vc.poll_until.saturating_sub(start).max(1);
                        self.threads[tid as usize].remaining = left;
                        self.schedule_step(tid);
                    }
                    _ => self.schedule_step(tid),
                }
            }
        }
    }

    /// The running thread `tid` finished its work item.
    fn step(&mut self, tid: Tid) {
        match self.threads[tid as usize].owner {
            Owner::HostTask(i) => self.host_task_step(i),
            Owner::MainLoop(vm) => {
                let g = &mut self.vms[vm as usize];
                if let Some((v, irq)) = g.main_loop_queue.pop_front() {
                    let cpu = match self.host.state(tid) {
                        ThreadState::Running(c) => Some(c),
                        _ => None,
                    };
                    self.deliver_irq(vm, v, irq, cpu);
                }
                // The wakeup it delivered may have preempted it (a vCPU at RT on its CPU).
                let running = matches!(self.host.state(tid), ThreadState::Running(_));
                if self.vms[vm as usize].main_loop_queue.is_empty() {
                    if running {
                        self.scx_sync();
                        self.host.block(self.now, tid, &mut self.sw);
                        self.flush();
                    }
                    // Else it blocks as soon as it runs again (no work left).
                } else {
                    self.threads[tid as usize].remaining = self.costs.main_loop_work_ns.max(1);
                    self.threads[tid as usize].gen += 1;
                    if running {
                        self.schedule_step(tid);
                    }
                }
            }
            Owner::Vcpu { vm, vcpu } => self.vcpu_item_done(vm, vcpu),
        }
    }

    // ---- host tasks ----

    fn host_task_timer(&mut self, i: u32) {
        let now = self.now;
        let tid = self.host_tasks[i as usize].tid;
        match &mut self.host_tasks[i as usize].kind {
            HostKind::Periodic {
                next, expiry, work, ..
            } => {
                *expiry = Some(*next);
                self.threads[tid as usize].remaining = *work;
            }
            HostKind::Bursty { run, .. } => {
                let run = *run;
                self.threads[tid as usize].remaining = self.rng.exp(run);
            }
            HostKind::Hog => return,
        }
        self.scx_sync();
        self.host.wake(now, tid, None, &mut self.sw);
        self.flush();
    }

    fn host_task_step(&mut self, i: u32) {
        let now = self.now;
        let tid = self.host_tasks[i as usize].tid;
        let wake_at = match &mut self.host_tasks[i as usize].kind {
            HostKind::Periodic { interval, next, .. } => {
                *next += *interval;
                while *next <= now {
                    *next += *interval;
                }
                *next + self.costs.timer_latency_ns
            }
            HostKind::Bursty { sleep, .. } => {
                let s = *sleep;
                now + self.rng.exp(s)
            }
            HostKind::Hog => {
                self.threads[tid as usize].remaining = FOREVER;
                return;
            }
        };
        self.push(wake_at, Ev::HostTask { task: i });
        self.scx_sync();
        self.host.block(now, tid, &mut self.sw);
        self.flush();
    }

    fn finish(
        mut self,
        sc: &Scenario,
        variant: Option<&crate::scenario::Variant>,
        mode: Mode,
        seed: u64,
    ) -> ModeResult {
        let now = self.now;
        // Polls still running at the end count up to it.
        for (vm, g) in self.vms.iter().enumerate() {
            for vc in &g.vcpus {
                let th = &self.threads[vc.tid as usize];
                if let (Some(f), VWork::GuestPoll | VWork::HostPoll) = (th.from, vc.work) {
                    let end = now.min(f.saturating_add(th.remaining));
                    self.rec
                        .poll(vm as u32, vc.work == VWork::GuestPoll, f, end.max(f));
                }
            }
        }
        let times: Vec<(u64, u64)> = (0..self.threads.len() as u32)
            .map(|t| (self.host.cpu_time(t, now), self.host.rt_time(t, now)))
            .collect();
        let mut vm_threads: Vec<Vec<u32>> = vec![Vec::new(); self.vms.len()];
        let mut hog_threads = Vec::new();
        for (i, th) in self.threads.iter().enumerate() {
            match th.owner {
                Owner::Vcpu { vm, .. } | Owner::MainLoop(vm) => {
                    vm_threads[vm as usize].push(i as u32)
                }
                Owner::HostTask(k) => {
                    if matches!(self.host_tasks[k as usize].kind, HostKind::Hog) {
                        hog_threads.push(i as u32);
                    }
                }
            }
        }
        let stats = self
            .daemon
            .as_ref()
            .map(|d| (d.stats(), self.policy_at_start.take().unwrap_or_default()));
        let advice = self.daemon.as_ref().map(|d| d.advice(now, 50));
        self.rec.finish(
            sc,
            variant.map(|v| v.name.as_str()),
            mode.name(),
            seed,
            self.host.cpus(),
            times,
            &vm_threads,
            &hog_threads,
            stats,
            advice,
            (self.guest_idle.name(), self.cpu_pressure),
            self.events,
        )
    }
}
