//! The actuator: the one place where a policy decision becomes a
//! `sched_setattr` on a managed thread (`managed.rs`), with the boost's
//! scheduling class as the daemon config maps it.

use pvsched_base::clock::monotonic_ns;
use pvsched_base::sched::{
    ThreadParams, SCHED_BATCH, SCHED_FIFO, SCHED_IDLE, SCHED_OTHER, SCHED_RR,
};
use pvsched_control::{Recording, TraceKind, TraceRecord};
use pvsched_policy::{Decision, HostPolicy, Reason};
use tracing::{debug, warn};

use crate::backend::SchedExt;
use crate::config::DaemonConfig;
use crate::metrics::Metrics;
use crate::vm::ServedVm;

/// How a boost becomes kernel parameters. The policy says "boosted, at RT
/// priority p, for this reason"; which scheduling class carries it is the
/// mechanism's choice (`daemon.fair_boost_reasons`).
///
/// RT (the default): SCHED_RR / SCHED_FIFO at the policy's priority, above
/// every CFS task. Fair: SCHED_OTHER at `nice` with an EEVDF slice request of
/// `slice_ns`: the thread stays in the fair class, so no boost moves it
/// between classes and the RT class never pushes or pulls it across CPUs,
/// and its short slice makes it win the pick and preempt a longer-sliced
/// task when it wakes (Linux >= 6.12).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoostMapping {
    /// Per [`Reason::index`]: boosts for this reason are carried by the fair class.
    pub fair: [bool; Reason::COUNT],
    /// Every boost of a VM that ran no guest RT work within `halt_boost_ns` is
    /// carried by the fair class, whatever its reason.
    pub fair_without_rt_work: bool,
    pub nice: i8,
    pub slice_ns: u64,
}

impl BoostMapping {
    /// From the daemon config's `fair_boost_*` keys. The reason names are
    /// checked by `Config::parse`; an unknown one maps nothing.
    pub fn of(d: &DaemonConfig) -> Self {
        let mut m = BoostMapping {
            fair_without_rt_work: d.fair_boost_without_rt_work,
            nice: d.fair_boost_nice,
            slice_ns: d.fair_boost_slice_us * 1000,
            ..BoostMapping::RT
        };
        for i in d
            .fair_boost_reasons
            .iter()
            .filter_map(|n| Reason::index_of(n))
        {
            m.fair[i] = true;
        }
        m
    }

    /// Every boost in the RT class.
    pub const RT: BoostMapping = BoostMapping {
        fair: [false; Reason::COUNT],
        fair_without_rt_work: false,
        nice: -20,
        slice_ns: 100_000,
    };

    /// The fair-class params of a boost for `reason` in a VM with or without recent
    /// guest RT work, if it is carried there.
    fn fair_for(&self, reason: Reason, rt_work: bool) -> Option<ThreadParams> {
        (self.fair[reason.index()] || (self.fair_without_rt_work && !rt_work))
            .then(|| ThreadParams::fair_with_slice(i32::from(self.nice), self.slice_ns))
    }
}

/// The kernel's parameters for a policy decision. Reset-on-fork always:
/// children of a boosted vCPU thread never inherit the boost.
pub fn thread_params(d: &Decision, boost: &BoostMapping) -> ThreadParams {
    let p = d.params;
    let policy = match p.policy {
        HostPolicy::Other => SCHED_OTHER,
        HostPolicy::Batch => SCHED_BATCH,
        HostPolicy::Idle => SCHED_IDLE,
        HostPolicy::Fifo => SCHED_FIFO,
        HostPolicy::Rr => SCHED_RR,
    };
    let params = if matches!(policy, SCHED_FIFO | SCHED_RR) {
        boost
            .fair_for(d.reason, d.rt_work)
            .unwrap_or(ThreadParams::rt(policy, u32::from(p.rt_priority)))
    } else {
        ThreadParams {
            policy,
            ..ThreadParams::other(i32::from(p.nice))
        }
    };
    params.reset_on_fork()
}

/// What [`apply_decisions`] needs besides the VM and its decisions.
pub struct ApplyContext<'a> {
    /// When the event behind the decisions happened, for the reaction-time
    /// metric; `None` for timer work and events read late.
    pub event_ts: Option<u64>,
    /// When the event thread woke up for that event (epoll returned).
    pub woke_ns: u64,
    pub now: u64,
    /// Boost the VM's latency-path threads with its strongest vCPU boost.
    pub boost_latency_path: bool,
    /// How a boost decision becomes kernel parameters.
    pub boost: &'a BoostMapping,
    pub metrics: &'a Metrics,
    pub recording: Option<&'a mut Recording>,
    /// The sched_ext backend's scheduler, which then carries every boost
    /// (`None`: the rt backend).
    pub scx: Option<&'a SchedExt>,
}

/// Puts `decisions` (in order; the last for a vCPU wins) into force on
/// `vm`'s threads, publishes each vCPU's host half, and marks the VM gone
/// if a thread has exited.
pub fn apply_decisions(vm: &mut ServedVm, decisions: &[Decision], ctx: ApplyContext<'_>) {
    let ApplyContext {
        event_ts,
        woke_ns,
        now,
        boost_latency_path,
        boost,
        metrics,
        recording,
        scx,
    } = ctx;
    // The scheduler carries every boost itself: none goes to the fair class.
    let boost = if scx.is_some() {
        &BoostMapping::RT
    } else {
        boost
    };
    let mut lost = false;
    for (i, d) in decisions.iter().enumerate() {
        if decisions[i + 1..].iter().any(|later| later.vcpu == d.vcpu) {
            continue;
        }
        let Some(m) = vm.vcpus.get_mut(d.vcpu as usize) else {
            continue;
        };
        let want = thread_params(d, boost);
        let was_boosted = m.boosted();
        let call = monotonic_ns();
        match m.apply(&want, scx, d.reason.is_proactive()) {
            Ok(true) => {
                let done = monotonic_ns();
                if let Some(ts) = event_ts.filter(|&ts| done >= ts) {
                    metrics.reaction_seconds.observe((done - ts) as f64 * 1e-9);
                    metrics
                        .reaction_wakeup_seconds
                        .observe(woke_ns.saturating_sub(ts) as f64 * 1e-9);
                    metrics
                        .setattr_seconds
                        .observe(done.saturating_sub(call) as f64 * 1e-9);
                }
                metrics.decision(&vm.metrics, d.reason.name());
                if m.boosted() && !was_boosted {
                    vm.metrics.boosts.inc();
                }
                if d.reason == Reason::Throttled {
                    vm.metrics.throttles.inc();
                }
                debug!(vm = %vm.name, vcpu = d.vcpu, params = %want, reason = %d.reason, "applied");
            }
            Ok(false) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => lost = true,
            Err(e) => {
                metrics.setattr_errors.inc();
                m.failures += 1;
                if m.failures.is_power_of_two() {
                    // RT group scheduling: a thread in a cpu cgroup without
                    // RT runtime cannot be made RT, whoever asks.
                    let hint = if want.is_rt() && e.raw_os_error() == Some(libc::EPERM) {
                        "; its cpu cgroup may have no RT runtime (cpu.rt_runtime_us 0, \
                         CONFIG_RT_GROUP_SCHED): see docs/FLEET.md"
                    } else {
                        ""
                    };
                    warn!(vm = %vm.name, vcpu = d.vcpu, tid = m.handle.tid, params = %want,
                        failures = m.failures, error = %e, "sched_setattr failed{hint}");
                }
            }
        }
        vm.publish(now, d.vcpu);
    }
    if let Some(rec) = recording {
        record_decisions(rec, vm, decisions, now, boost);
    }
    if boost_latency_path && !vm.latency_path.is_empty() && !decisions.is_empty() {
        let boost = vm.strongest_boost();
        for lp in vm.latency_path.iter_mut() {
            let want = boost.unwrap_or(lp.original);
            if let Err(e) = lp.apply(&want, scx, true) {
                debug!(vm = %vm.name, tid = lp.handle.tid, error = %e, "latency-path thread");
            }
        }
    }
    if lost {
        vm.gone = true;
    }
}

fn record_decisions(
    rec: &mut Recording,
    vm: &ServedVm,
    decisions: &[Decision],
    now: u64,
    boost: &BoostMapping,
) {
    for d in decisions {
        let Some(m) = vm.vcpus.get(d.vcpu as usize) else {
            continue;
        };
        let kind = if d.throttled {
            TraceKind::Throttle
        } else if d.params.is_rt() {
            TraceKind::Boost
        } else {
            TraceKind::Unboost
        };
        rec.records.push(TraceRecord {
            ts_ns: now,
            tid: m.handle.tid,
            kind,
            reason: Some(d.reason.name().to_string()),
            params: Some(thread_params(d, boost).to_string()),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::managed::{is_fair_boost, Managed};
    use pvsched_base::sched;
    use pvsched_policy::SchedParams;

    fn mapping(fair: &[&str]) -> BoostMapping {
        let mut m = BoostMapping {
            nice: -20,
            slice_ns: 100_000,
            ..BoostMapping::RT
        };
        for name in fair {
            m.fair[Reason::index_of(name).unwrap()] = true;
        }
        m
    }

    const RR2: SchedParams = SchedParams {
        policy: HostPolicy::Rr,
        rt_priority: 2,
        nice: 0,
    };

    /// The decision to put `params` on vCPU 0 for `reason`, in a VM with or without
    /// recent guest RT work.
    fn decided(params: SchedParams, reason: Reason, rt_work: bool) -> Decision {
        Decision {
            vcpu: 0,
            params,
            reason,
            throttled: false,
            in_debt: false,
            rt_work,
        }
    }

    /// [`thread_params`] of a decision in a VM with recent guest RT work.
    fn params_of(params: SchedParams, reason: Reason, m: &BoostMapping) -> ThreadParams {
        thread_params(&decided(params, reason, true), m)
    }

    #[test]
    fn a_boost_decision_becomes_rr_with_reset_on_fork() {
        let p = params_of(
            SchedParams {
                rt_priority: 3,
                ..RR2
            },
            Reason::GuestRt {
                policy: 2,
                priority: 3,
            },
            &BoostMapping::RT,
        );

        assert_eq!(p, ThreadParams::rr(3).reset_on_fork());
    }

    #[test]
    fn boosts_for_the_reasons_named_fair_become_a_short_fair_slice_and_the_rest_stay_rt() {
        let m = mapping(&["proactive_wake", "critical_section", "lock_holder"]);
        let fair = ThreadParams::fair_with_slice(-20, 100_000).reset_on_fork();
        let guest_rt = Reason::GuestRt {
            policy: 2,
            priority: 2,
        };

        let wake = params_of(RR2, Reason::ProactiveWake, &m);
        let section = params_of(RR2, Reason::CriticalSection(1), &m);
        let lock = params_of(RR2, Reason::LockHolder, &m);
        let own = params_of(RR2, guest_rt, &m);
        let halt = params_of(RR2, Reason::ProactiveHalt, &m);
        let unboost = params_of(SchedParams::NORMAL, Reason::None, &m);

        assert_eq!((wake, section, lock), (fair, fair, fair));
        assert!(is_fair_boost(&wake));
        assert_eq!(own, ThreadParams::rr(2).reset_on_fork());
        assert_eq!(halt, ThreadParams::rr(2).reset_on_fork());
        assert_eq!(unboost, ThreadParams::other(0).reset_on_fork());
        assert!(!is_fair_boost(&unboost));
    }

    #[test]
    fn with_fair_without_rt_work_a_vm_without_recent_rt_work_is_boosted_fair_and_one_with_it_rt() {
        let m = BoostMapping {
            fair_without_rt_work: true,
            ..mapping(&[])
        };
        let fair = ThreadParams::fair_with_slice(-20, 100_000).reset_on_fork();
        let rr2 = ThreadParams::rr(2).reset_on_fork();

        let quiet_vm = thread_params(&decided(RR2, Reason::ProactiveWake, false), &m);
        let rt_vm = thread_params(&decided(RR2, Reason::ProactiveWake, true), &m);
        let unboost = thread_params(&decided(SchedParams::NORMAL, Reason::None, false), &m);
        let default = thread_params(
            &decided(RR2, Reason::ProactiveWake, false),
            &BoostMapping::RT,
        );

        assert_eq!((quiet_vm, rt_vm), (fair, rr2));
        assert_eq!(unboost, ThreadParams::other(0).reset_on_fork());
        assert_eq!(default, rr2);
    }

    #[test]
    fn an_unboost_decision_keeps_its_nice() {
        let p = params_of(
            SchedParams {
                nice: 5,
                ..SchedParams::NORMAL
            },
            Reason::Debt,
            &BoostMapping::RT,
        );

        assert_eq!(p, ThreadParams::other(5).reset_on_fork());
    }

    #[test]
    fn the_configured_fair_boost_reasons_map_to_their_nice_and_slice() {
        let r = Config::parse(
            "[daemon]\nfair_boost_reasons = [\"proactive_wake\", \"lock_holder\"]\n\
             fair_boost_nice = -10\nfair_boost_slice_us = 300\n",
            "t.toml",
        )
        .unwrap();

        let m = BoostMapping::of(&r.config.daemon);
        let fair: Vec<&str> = (0..Reason::COUNT)
            .filter(|&i| m.fair[i])
            .map(|i| Reason::NAMES[i])
            .collect();
        assert_eq!(fair, ["proactive_wake", "lock_holder"]);
        assert_eq!((m.nice, m.slice_ns), (-10, 300_000));
        assert_eq!(
            BoostMapping::of(&DaemonConfig::default()).fair,
            BoostMapping::RT.fair
        );
    }

    /// Runs `f` on a managed handle of a thread of this process that waits meanwhile.
    fn with_parked_thread<T>(f: impl FnOnce(i32, &mut Managed) -> T) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(pvsched_base::thread::gettid()).unwrap();
            done_rx.recv().ok();
        });
        let tid = rx.recv().unwrap();
        let mut m = Managed::open(std::process::id() as i32, tid).unwrap();
        let out = f(tid, &mut m);
        done_tx.send(()).unwrap();
        t.join().unwrap();
        out
    }

    #[test]
    fn a_managed_thread_is_restored_to_its_original() {
        with_parked_thread(|tid, m| {
            let nicer = ThreadParams::other(m.original.nice + 1);

            assert!(m.apply(&nicer, None, false).unwrap());
            assert!(!m.apply(&nicer, None, false).unwrap());
            assert!(m.restore().unwrap());
            assert_eq!(sched::get_params(tid).unwrap().nice, m.original.nice);
        });
    }

    #[test]
    fn a_fair_boost_counts_as_boosted_until_the_thread_is_restored() {
        let seen = with_parked_thread(|_, m| {
            // The original nice, so that no privilege is needed: the slice alone marks it.
            let fair = BoostMapping {
                nice: m.original.nice as i8,
                slice_ns: 200_000,
                ..mapping(&["proactive_halt"])
            };
            let boost = params_of(RR2, Reason::ProactiveHalt, &fair);

            let before = m.boosted();
            assert!(m.apply(&boost, None, false).unwrap());
            let during = m.boosted();
            assert!(!m.apply(&boost, None, false).unwrap());
            assert!(m.restore().unwrap());
            (before, during, m.boosted())
        });

        assert_eq!(seen, (false, true, false));
    }
}
