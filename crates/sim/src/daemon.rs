//! pvschedd as the simulator runs it: the real policy engine (`pvsched-policy`), one
//! [`VmState`] per VM, fed the events the daemon's BPF programs would deliver and the guest
//! halves it would read (at a preemption, a halt, a wakeup, and on its recheck timer for
//! boosted vCPUs; at a preemption also every other vCPU's, where lock waits naming the
//! preempted vCPU are, when the policy asks: [`VmState::reads_waiters_on`]), its decisions
//! taking effect `reaction_ns` later. Every discovery round it tells the policy whether the
//! host is overloaded (CPU pressure, as pvschedd's discovery thread decides it) when a guest
//! reads the flag (the hinted idle driver). What it leaves out: the daemon's own CPU time
//! (slot reads are free), lost events, and lazy records (the sim delivers every record at
//! once; the daemon reads a boosted vCPU's records up to one recheck period late, except a
//! waited-on vCPU's switch-ins and preemptions, which wake it as here); the host halves
//! are read as the policy has them at that moment (the daemon publishes them at its 10 ms
//! scan and at each decision, and a status change at once for a vCPU unboosted or waited
//! on: a lock waiter may see a boosted vCPU's status up to 10 ms later than here).

use pvsched_abi::{GuestHalf, HostHalf};
use pvsched_policy::{
    advise, Decisions, DurationHistogram, Event, HostPolicy, PollPrice, SchedParams, VmLimits,
    VmState, VmStats,
};

/// The advisor's longest window, as pvschedd's (`idle_report.rs`).
const ADVISOR_MAX_WINDOW_NS: u64 = 1_000_000;

/// pvschedd's discovery round (`daemon.discovery_interval_ms` default), which reads the
/// host's CPU pressure.
pub const DISCOVERY_INTERVAL_NS: u64 = 1_000_000_000;

/// Whether pvschedd would call the host overloaded at CPU pressure `some_share` (0..=1):
/// PSI cpu `some avg10` above 10 % (crates/host/src/discovery).
pub fn overloaded(some_share: f64) -> bool {
    some_share * 100.0 > 10.0
}

use crate::host::Class;

pub struct Daemon {
    vms: Vec<DaemonVm>,
    out: Decisions,
    latency_path: bool,
    reaction_ns: u64,
    recheck_ns: u64,
}

struct DaemonVm {
    state: VmState,
    /// Whether each vCPU's target is an RT boost, and its class.
    boosted: Vec<Option<Class>>,
    /// Decisions to take effect: (at, vcpu or u32::MAX for the main loop, class).
    pending: Vec<(u64, u32, Class)>,
    /// The main loop's class last asked for.
    main_loop: Class,
    /// When the next tick is due (the one queued).
    tick_at: Option<u64>,
}

/// The host class of a policy decision.
pub fn class_of(p: SchedParams) -> Class {
    match p.policy {
        HostPolicy::Fifo => Class::Fifo {
            prio: p.rt_priority,
        },
        HostPolicy::Rr => Class::Rr {
            prio: p.rt_priority,
        },
        // Batch and idle are fair-class threads; the model weighs them by nice.
        HostPolicy::Other | HostPolicy::Batch | HostPolicy::Idle => Class::Fair { nice: p.nice },
    }
}

fn prio_of(c: Class) -> u8 {
    match c {
        Class::Fifo { prio } | Class::Rr { prio } => prio,
        Class::Fair { .. } => 0,
    }
}

impl Daemon {
    pub fn new(
        vcpus_per_vm: &[u32],
        limits: VmLimits,
        latency_path: bool,
        reaction_ns: u64,
        recheck_ns: u64,
    ) -> Daemon {
        let vms = vcpus_per_vm
            .iter()
            .map(|&n| DaemonVm {
                // The limits were validated with the scenario.
                state: VmState::new(limits.clone(), n).unwrap_or_else(|e| {
                    panic!("limits validated with the scenario were refused: {e}")
                }),
                boosted: vec![None; n as usize],
                pending: Vec::new(),
                main_loop: Class::Fair { nice: 0 },
                tick_at: None,
            })
            .collect();
        Daemon {
            vms,
            out: Decisions::new(),
            latency_path,
            reaction_ns,
            recheck_ns,
        }
    }

    /// Reads of guest halves, in order, then one event (if any), as the daemon handles a
    /// host event of the VM.
    pub fn handle(&mut self, vm: u32, now: u64, reads: &[(u32, GuestHalf)], ev: Option<Event>) {
        let reaction = self.reaction_ns;
        let dv = &mut self.vms[vm as usize];
        for &(vcpu, guest) in reads {
            dv.state.handle(
                now,
                &Event::GuestUpdate {
                    vcpu,
                    guest,
                    consistent: true,
                },
                &mut self.out,
            );
            dv.take(&self.out, now + reaction);
        }
        if let Some(ev) = ev {
            dv.state.handle(now, &ev, &mut self.out);
            dv.take(&self.out, now + reaction);
        }
    }

    /// Whether `ev` (about a vCPU of `vm`) comes with reads of the VM's other slots, where
    /// lock waits that may name it are ([`VmState::reads_waiters_on`]).
    pub fn reads_waiters_on(&self, vm: u32, ev: &Event) -> bool {
        self.vms[vm as usize].state.reads_waiters_on(ev)
    }

    /// Whether `vcpu` of `vm` is preempted as its host half shows it (`HS_PREEMPTED`): the
    /// policy's status of it now.
    pub fn vcpu_preempted(&self, vm: u32, vcpu: u32) -> bool {
        self.vms[vm as usize]
            .state
            .vcpu_stats(vcpu)
            .is_some_and(|s| s.status.abi() == pvsched_abi::HS_PREEMPTED)
    }

    /// Whether the tick queued for `vm` at `now` is the current one.
    pub fn tick_due(&mut self, vm: u32, now: u64) -> bool {
        let dv = &mut self.vms[vm as usize];
        if dv.tick_at == Some(now) {
            dv.tick_at = None;
            true
        } else {
            false
        }
    }

    /// The host half the daemon publishes for `vcpu` of `vm` (its idle hints among it).
    pub fn host_half(&self, vm: u32, vcpu: u32, now: u64) -> HostHalf {
        self.vms[vm as usize].state.host_half(vcpu, now)
    }

    pub fn is_boosted(&self, vm: u32, vcpu: u32) -> bool {
        self.vms[vm as usize].boosted[vcpu as usize].is_some()
    }

    pub fn boosted_vcpus(&self, vm: u32) -> impl Iterator<Item = u32> + '_ {
        self.vms[vm as usize]
            .boosted
            .iter()
            .enumerate()
            .filter(|(_, b)| b.is_some())
            .map(|(i, _)| i as u32)
    }

    /// Moves the decisions of `vm` to apply into `applies` (with the main loop's, when it
    /// follows the VM's strongest boost); returns its next tick, if a new one must be queued.
    pub fn drain(
        &mut self,
        vm: u32,
        now: u64,
        applies: &mut Vec<(u64, u32, Class)>,
    ) -> Option<u64> {
        let latency_path = self.latency_path;
        let recheck = self.recheck_ns;
        let dv = &mut self.vms[vm as usize];
        applies.clear();
        applies.append(&mut dv.pending);
        if latency_path && !applies.is_empty() {
            let strongest = dv
                .boosted
                .iter()
                .flatten()
                .copied()
                .max_by_key(|c| prio_of(*c));
            let want = strongest.unwrap_or(Class::Fair { nice: 0 });
            if want != dv.main_loop {
                dv.main_loop = want;
                let at = applies.last().map_or(now, |a| a.0);
                applies.push((at, u32::MAX, want));
            }
        }
        let mut next = dv.state.next_deadline().map(|t| t.max(now));
        if dv.boosted.iter().any(|b| b.is_some()) {
            let r = now + recheck;
            next = Some(next.map_or(r, |t| t.min(r)));
        }
        match (next, dv.tick_at) {
            (Some(t), Some(q)) if t >= q => None,
            (Some(t), _) => {
                dv.tick_at = Some(t);
                Some(t)
            }
            (None, _) => None,
        }
    }

    /// Halts VM `vm`'s idle meters recorded, and how many of them KVM's halt polling
    /// caught (known only from `Event::KvmHaltEnded`), over its vCPUs.
    pub fn halts_and_polled(&self, vm: u32) -> (u64, u64) {
        let Some(d) = self.vms.get(vm as usize) else {
            return (0, 0);
        };
        (0..d.state.nr_vcpus())
            .filter_map(|v| d.state.idle_meter(v))
            .fold((0, 0), |(h, p), m| {
                (h + m.halt_to_wake.count(), p + m.polled)
            })
    }

    pub fn stats(&self) -> Vec<VmStats> {
        self.vms.iter().map(|v| v.state.vm_stats()).collect()
    }

    /// What the halt-polling advisor (`pvschedctl idle`) would recommend for each VM from
    /// the halts the policy measured up to `now`, within `budget_permille` of a core per
    /// vCPU (the VM's vCPUs' halts together, priced per vCPU).
    /// Each entry: the advisor's price and its CPU share per vCPU.
    pub fn advice(&self, now: u64, budget_permille: u32) -> Vec<Option<(PollPrice, f64)>> {
        self.vms
            .iter()
            .map(|v| {
                let nr = v.state.nr_vcpus();
                let mut halts = DurationHistogram::default();
                let mut since = None::<u64>;
                for i in 0..nr {
                    if let Some(m) = v.state.idle_meter(i) {
                        halts.merge(&m.halt_to_wake);
                        since = match (since, m.since()) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                    }
                }
                let elapsed = since.map(|s| now.saturating_sub(s))? * u64::from(nr);
                (halts.count() > 0).then(|| {
                    let p = advise(&halts, elapsed, budget_permille, ADVISOR_MAX_WINDOW_NS);
                    (p, p.cpu_share(elapsed))
                })
            })
            .collect()
    }
}

impl DaemonVm {
    fn take(&mut self, out: &Decisions, at: u64) {
        for d in out.iter() {
            let class = class_of(d.params);
            self.boosted[d.vcpu as usize] = d.params.is_rt().then_some(class);
            self.pending.push((at, d.vcpu, class));
        }
    }
}
