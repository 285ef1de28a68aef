//! pvschedd as the simulator runs it: the real policy engine (`pvsched-policy`), one
//! [`VmState`] per VM, fed the events the daemon's BPF programs would deliver and the guest
//! halves it would read, its decisions taking effect `reaction_ns` later. The daemon's own
//! rules come from [`pvsched_policy::serving`], which pvschedd calls too: the slots read at
//! a host event ([`SlotReads`]: at a preemption, a halt, a wakeup; at a preemption also every
//! other vCPU's, where lock waits naming the preempted vCPU are, when the policy asks), the
//! boosted vCPUs its recheck timer re-reads (none in a VM with a doorbell) and when, the
//! overload flag from CPU pressure at every discovery round (when a guest reads the flag:
//! the hinted idle driver), and the halt-polling advisor. What it leaves out: the daemon's own CPU time
//! (slot reads are free), lost events, and lazy records (the sim delivers every record at
//! once; the daemon reads a boosted vCPU's records up to one recheck period late, except a
//! waited-on vCPU's switch-ins and preemptions, which wake it as here); the host halves
//! are read as the policy has them at that moment (the daemon publishes them at its 10 ms
//! scan and at each decision, and a status change at once for a vCPU unboosted or waited
//! on: a lock waiter may see a boosted vCPU's status up to 10 ms later than here).
//!
//! On the sched_ext backend ([`Daemon::scx_backend`], mode `pvsched-scx`) the host's
//! scheduler decides the guest's RT work itself (`VmState::set_kernel_decides_rt`: every
//! slot is readable here); the policy's own boosts become grants (the engine applies them
//! as the boost of the thread's grant, `proactive` for a proactive or lock-holder reason, as
//! pvschedd's actuator says); no recheck timer runs (pvschedd runs none on that backend: the
//! scheduler checks the slot at each enqueue); and every [`SCX_SCAN_INTERVAL_NS`] the scan
//! charges what the scheduler boosted itself and renews each vCPU's terms
//! ([`Daemon::scx_scan`], pvschedd's `check_backend`), then reads every slot.

use pvsched_abi::{GuestHalf, HostHalf};
use pvsched_policy::serving::{self, PooledHalts, SlotReads};
use pvsched_policy::{
    Decisions, Event, ExtensionAllowance, HostPolicy, PollPrice, SchedParams, VmLimits, VmState,
    VmStats,
};

use crate::host::{Class, ScxAllowance, ScxParams, ScxStats};

/// pvschedd's scan interval on the sched_ext backend (its default).
pub const SCX_SCAN_INTERVAL_NS: u64 = pvsched_policy::DEFAULT_SCX_SCAN_INTERVAL_NS;

/// The share of a vCPU's time its extensions may take, permille, plus a burst
/// (`extension_burst_ns`): pvschedd's default.
pub const SCX_EXTENSION_SHARE_PERMILLE: u64 =
    pvsched_policy::DEFAULT_SCX_EXTENSION_SHARE_PERMILLE as u64;

/// A decision to take effect: (at, vcpu or u32::MAX for the main loop, class, proactive).
pub type Apply = (u64, u32, Class, bool);

/// Whether pvschedd, at its default threshold, would call the host overloaded at CPU
/// pressure `some_share` (PSI cpu `some avg10`, 0..=1).
pub fn overloaded(some_share: f64) -> bool {
    serving::overloaded(
        some_share * 100.0,
        serving::DEFAULT_OVERLOAD_CPU_PRESSURE_PERCENT,
    )
}

pub struct Daemon {
    vms: Vec<DaemonVm>,
    out: Decisions,
    latency_path: bool,
    reaction_ns: u64,
    recheck_ns: u64,
    /// The guests ring a doorbell when a boost's reason clears: no recheck timer.
    doorbell: bool,
    /// The sched_ext backend: no recheck timer either.
    scx: bool,
}

struct DaemonVm {
    state: VmState,
    /// Whether each vCPU's target is an RT boost, and its class.
    boosted: Vec<Option<Class>>,
    /// Decisions to take effect.
    pending: Vec<Apply>,
    /// The main loop's class last asked for.
    main_loop: Class,
    /// When the next tick is due (the one queued).
    tick_at: Option<u64>,
    /// Per vCPU on the sched_ext backend: what was charged so far and its extension terms.
    scx: Vec<ScxCharged>,
}

/// What pvschedd keeps per vCPU thread for the sched_ext backend (`Managed`'s fields).
#[derive(Clone, Debug, Default)]
struct ScxCharged {
    kboost_ns: u64,
    kboost_cs_ns: u64,
    kboost_demoted_ns: u64,
    ext: ExtensionAllowance,
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
        doorbell: bool,
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
                scx: vec![ScxCharged::default(); n as usize],
            })
            .collect();
        Daemon {
            vms,
            out: Decisions::new(),
            latency_path,
            reaction_ns,
            recheck_ns,
            doorbell,
            scx: false,
        }
    }

    /// Serves every VM on the sched_ext backend: the scheduler decides the guest's RT work
    /// (every slot is readable), no recheck timer.
    pub fn scx_backend(&mut self) {
        self.scx = true;
        for dv in &mut self.vms {
            dv.state.set_kernel_decides_rt(true);
        }
    }

    /// pvschedd's `check_backend` for `vcpu` of `vm` at `now`, given what the scheduler did
    /// for its thread so far (`done`): the kernel boosts since the last scan charged to the
    /// budget, then its new terms: the policy's [`pvsched_policy::KernelGrant`] with an
    /// allowance of what it took so far plus the grant's, and its extension allowance.
    pub fn scx_scan(&mut self, vm: u32, vcpu: u32, now: u64, done: ScxStats) -> ScxAllowance {
        let dv = &mut self.vms[vm as usize];
        let Some(c) = dv.scx.get_mut(vcpu as usize) else {
            return ScxAllowance::default();
        };
        let spent = done.kboost_ns.saturating_sub(c.kboost_ns);
        let spent_cs = done.kboost_cs_ns.saturating_sub(c.kboost_cs_ns);
        let spent_demoted = done.kboost_demoted_ns.saturating_sub(c.kboost_demoted_ns);
        c.kboost_ns = done.kboost_ns;
        c.kboost_cs_ns = done.kboost_cs_ns;
        c.kboost_demoted_ns = done.kboost_demoted_ns;
        dv.state
            .charge_kernel_boost(now, vcpu, spent, spent_cs, spent_demoted);
        let k = dv.state.kernel_grant(vcpu, now);
        let burst = pvsched_policy::extension_burst_ns(
            ScxParams::default().extension_ns,
            SCX_EXTENSION_SHARE_PERMILLE,
            SCX_SCAN_INTERVAL_NS,
        );
        ScxAllowance {
            extension_ns: c
                .ext
                .next(now, done.ext_ns, SCX_EXTENSION_SHARE_PERMILLE, burst),
            kboost_allowed_ns: done.kboost_ns.saturating_add(k.allowance_ns),
            kernel: k,
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

    /// The slots of `vm` pvschedd reads before `ev` about its `vcpu`, in order.
    pub fn slot_reads(&self, vm: u32, vcpu: u32, ev: &Event) -> SlotReads {
        SlotReads::for_event(&self.vms[vm as usize].state, vcpu, Some(ev))
    }

    /// Whether the recheck timer re-reads `vcpu` of `vm` ([`serving::recheck_reads`]).
    pub fn recheck_reads(&self, vm: u32, vcpu: u32) -> bool {
        let dv = &self.vms[vm as usize];
        let boosted = dv.boosted.get(vcpu as usize).is_some_and(Option::is_some);
        serving::recheck_reads(self.doorbell || self.scx, boosted, dv.state.status(vcpu))
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
    pub fn drain(&mut self, vm: u32, now: u64, applies: &mut Vec<Apply>) -> Option<u64> {
        let (latency_path, recheck) = (self.latency_path, self.recheck_ns);
        // No recheck timer with a doorbell, nor on the sched_ext backend.
        let doorbell = self.doorbell || self.scx;
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
                // The latency path's boost is proactive (pvschedd's actuator).
                applies.push((at, u32::MAX, want, true));
            }
        }
        let mut next = dv.state.next_deadline().map(|t| t.max(now));
        // Records reach the simulated daemon at once: none is lazy.
        let vcpus = (0..dv.state.nr_vcpus())
            .map(|v| (dv.boosted[v as usize].is_some(), dv.state.status(v)));
        if serving::recheck_wanted(doorbell, false, vcpus) {
            let r = serving::next_recheck(u64::MAX, now, recheck, true);
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
    /// vCPU: the VM's vCPUs' halts pooled as pvschedd pools them for its host-wide window
    /// ([`PooledHalts`]). Each entry: the advisor's price and its CPU share per vCPU.
    pub fn advice(&self, now: u64, budget_permille: u32) -> Vec<Option<(PollPrice, f64)>> {
        self.vms
            .iter()
            .map(|v| {
                let mut pooled = PooledHalts::default();
                for m in (0..v.state.nr_vcpus()).filter_map(|i| v.state.idle_meter(i)) {
                    pooled.add(m, now);
                }
                let p = pooled.advise(budget_permille)?;
                Some((p, p.cpu_share(pooled.observed_ns())))
            })
            .collect()
    }
}

impl DaemonVm {
    fn take(&mut self, out: &Decisions, at: u64) {
        for d in out.iter() {
            let class = class_of(d.params);
            self.boosted[d.vcpu as usize] = d.params.is_rt().then_some(class);
            self.pending
                .push((at, d.vcpu, class, d.reason.is_proactive()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvsched_abi::{CS_HARDIRQ, GF_ACTIVE};

    const RECHECK_NS: u64 = 500_000;

    /// One 1-vCPU VM whose vCPU was boosted at 1 µs (a critical section); its next tick.
    fn boosted(doorbell: bool) -> (Daemon, Option<u64>) {
        let mut d = Daemon::new(&[1], VmLimits::default(), false, 0, RECHECK_NS, doorbell);
        let guest = GuestHalf {
            flags: GF_ACTIVE,
            cs_flags: CS_HARDIRQ,
            ..Default::default()
        };
        d.handle(0, 1_000, &[(0, guest)], None);
        let tick = d.drain(0, 1_000, &mut Vec::new());
        (d, tick)
    }

    #[test]
    fn the_overload_flag_takes_pvschedds_default_threshold() {
        assert!(!overloaded(0.2));
        assert!(overloaded(0.31));
    }

    #[test]
    fn a_boosted_vcpu_is_rechecked_unless_its_guest_has_a_doorbell() {
        let (plain, plain_tick) = boosted(false);
        let (rings, rings_tick) = boosted(true);

        assert!(plain.is_boosted(0, 0) && rings.is_boosted(0, 0));
        assert!(plain.recheck_reads(0, 0));
        assert_eq!(plain_tick, Some(1_000 + RECHECK_NS));
        assert!(!rings.recheck_reads(0, 0));
        assert_ne!(rings_tick, Some(1_000 + RECHECK_NS));
    }
}
