//! Property tests: the trust-boundary invariants hold for any guest input, any event
//! sequence and any valid limits.

mod common;

use common::{arb_half, arb_limits, check_budgets, check_params, Charged};
use proptest::prelude::*;
use pvsched_abi as abi;
use pvsched_policy::{
    Decision, Decisions, Event, ExitReason, GuestView, Rivals, RunStatus, VmLimits, VmState,
    WakeSource,
};

/// Ticks at one instant before we call it a livelock (one per vCPU state change at most).
const MAX_TICKS_AT_ONCE: usize = 8;

/// With ticks at every deadline, a 1 ns `max_boost`, `throttle` or `cs_window` cost one tick
/// per ns: gaps are capped at this many of the shortest period so that runs stay small.
/// Without ticks, gaps are taken as they come.
const MAX_PERIODS_PER_GAP: u64 = 64;

fn arb_vcpu() -> impl Strategy<Value = u32> {
    prop_oneof![8 => 0u32..4, 1 => 4u32..8, 1 => any::<u32>()]
}

fn arb_event() -> impl Strategy<Value = Event> {
    let wake = prop_oneof![
        Just(WakeSource::Timer),
        Just(WakeSource::Io),
        Just(WakeSource::OtherVcpu),
        Just(WakeSource::Unknown),
    ];
    let exit = prop_oneof![
        Just(ExitReason::Hlt),
        Just(ExitReason::Pause),
        Just(ExitReason::Other),
    ];
    let rivals = prop_oneof![
        Just(Rivals::None),
        Just(Rivals::PeerVms),
        Just(Rivals::Host),
    ];
    prop_oneof![
        5 => (arb_vcpu(), arb_half(), prop::bool::weighted(0.9)).prop_map(
            |(vcpu, guest, consistent)| Event::GuestUpdate { vcpu, guest, consistent }
        ),
        1 => arb_vcpu().prop_map(|vcpu| Event::Running { vcpu }),
        1 => (arb_vcpu(), rivals.clone()).prop_map(|(vcpu, rivals)| Event::Preempted { vcpu, rivals }),
        1 => (arb_vcpu(), rivals.clone()).prop_map(|(vcpu, rivals)| Event::Blocked { vcpu, rivals }),
        1 => (arb_vcpu(), wake, any::<bool>(), rivals).prop_map(
            |(vcpu, source, cpu_idle, rivals)| Event::Woken {
                vcpu,
                source,
                cpu_idle,
                rivals,
            }
        ),
        1 => arb_vcpu().prop_map(|vcpu| Event::InterruptTargeted { vcpu }),
        1 => (arb_vcpu(), exit).prop_map(|(vcpu, reason)| Event::KvmExit { vcpu, reason }),
        1 => Just(Event::Tick),
        1 => any::<bool>().prop_map(|overloaded| Event::OverloadHint { overloaded }),
    ]
}

/// Gaps between events: mostly short, sometimes zero, sometimes huge.
fn arb_gap() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..=100_000,
        3 => 0u64..=100_000_000,
        1 => Just(0u64),
        1 => 0u64..=10_000_000_000,
    ]
}

fn arb_run() -> impl Strategy<Value = (VmLimits, u32, Vec<(u64, Event)>)> {
    (
        arb_limits(),
        1u32..=4,
        prop::collection::vec((arb_gap(), arb_event()), 0..120),
    )
}

/// Everything a run produced, for comparison between runs.
#[derive(Debug, PartialEq)]
struct Trace {
    decisions: Vec<(u64, Decision)>,
    stats: pvsched_policy::VmStats,
    halves: Vec<abi::HostHalf>,
}

/// Runs the events; with `ticks`, delivers a Tick at every deadline before the event after
/// it. Checks the invariants on the way.
fn run(
    limits: &VmLimits,
    nr: u32,
    events: &[(u64, Event)],
    ticks: bool,
) -> Result<Trace, TestCaseError> {
    let mut vm = VmState::new(limits.clone(), nr).expect("arb_limits are valid");
    let mut out = Decisions::with_capacity(nr as usize);
    let mut decisions = Vec::new();
    let mut boosted_since: Vec<Option<u64>> = vec![None; nr as usize];
    let mut now = 0u64;
    // A critical-section budget latches and clears about once per cs window.
    let period = limits
        .max_boost_ns
        .min(limits.throttle_ns)
        .min(limits.proactive_boost_ns)
        .min(limits.cs_window_ns);
    let max_gap = period.saturating_mul(MAX_PERIODS_PER_GAP);

    // Charged time, counted here from what the engine shows between events: boosted and not
    // halted (all vCPUs: the boost budget), and of that, for a critical section (per vCPU).
    let mut charged = Charged {
        all: 0,
        cs: vec![0; nr as usize],
    };

    // Per vCPU, since its boost began: boosted time on a CPU minus time halted (a halted
    // vCPU uses no CPU; the policy's burst drains then, as when unboosted); time waiting for
    // a CPU neither adds nor drains.
    let mut deliver = |vm: &mut VmState,
                       at: u64,
                       ev: &Event,
                       decisions: &mut Vec<(u64, Decision)>,
                       boosted_since: &mut Vec<Option<u64>>|
     -> Result<(), TestCaseError> {
        let prev = vm.now();
        charged.add(vm, at.max(prev) - prev);
        for (i, since) in boosted_since.iter_mut().enumerate() {
            let status = vm.vcpu_stats(i as u32).map(|s| s.status);
            if let Some(acc) = since.as_mut() {
                let dt = at.max(prev) - prev;
                *acc = match status {
                    Some(RunStatus::Halted) => acc.saturating_sub(dt),
                    Some(s) if s.on_cpu() => *acc + dt,
                    _ => *acc,
                };
            }
        }
        vm.handle(at, ev, &mut out);
        let at = vm.now();
        for d in out.iter() {
            check_params(limits, d)?;
            let since = &mut boosted_since[d.vcpu as usize];
            match (d.params.is_rt(), *since) {
                (true, None) => *since = Some(0),
                (false, Some(acc)) => {
                    if ticks {
                        prop_assert!(
                            acc <= limits.max_boost_ns,
                            "boosted {} ns on CPU > max {}: {d:?}",
                            acc,
                            limits.max_boost_ns
                        );
                    }
                    *since = None;
                }
                _ => {}
            }
            decisions.push((at, *d));
        }
        for (i, since) in boosted_since.iter().enumerate() {
            let t = vm.target(i as u32).expect("in range");
            prop_assert_eq!(t.params.is_rt(), since.is_some(), "target vs decisions");
            if let (true, Some(acc)) = (ticks, since) {
                prop_assert!(*acc <= limits.max_boost_ns, "still boosted too long");
            }
        }
        Ok(())
    };

    for (gap, ev) in events {
        let gap = if ticks { (*gap).min(max_gap) } else { *gap };
        let t = now.saturating_add(gap);
        if ticks {
            let mut same_instant = (0usize, u64::MAX);
            while let Some(d) = vm.next_deadline() {
                if d > t {
                    break;
                }
                let at = d.max(vm.now());
                same_instant = if at == same_instant.1 {
                    (same_instant.0 + 1, at)
                } else {
                    (1, at)
                };
                prop_assert!(
                    same_instant.0 <= MAX_TICKS_AT_ONCE,
                    "deadline livelock at {at}"
                );
                deliver(
                    &mut vm,
                    at,
                    &Event::Tick,
                    &mut decisions,
                    &mut boosted_since,
                )?;
            }
        }
        deliver(&mut vm, t, ev, &mut decisions, &mut boosted_since)?;
        now = t;
    }

    if ticks {
        check_budgets(limits, nr, now, &charged)?;
    }

    let mut halves = Vec::new();
    for v in 0..nr + 2 {
        let h = vm.host_half(v, now);
        if let Some(t) = vm.target(v) {
            prop_assert_eq!(h.flags & abi::HF_BOOSTED != 0, t.params.is_rt());
            prop_assert_eq!(h.policy, t.params.policy.uapi());
            prop_assert!(vm.vcpu_stats(v).is_some());
        } else {
            prop_assert_eq!(h, abi::HostHalf::default());
        }
        halves.push(h);
    }
    Ok(Trace {
        decisions,
        stats: vm.vm_stats(),
        halves,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn guest_view_of_any_half_is_in_range(half in arb_half(), consistent in any::<bool>()) {
        let v = GuestView::from_read(&half, consistent);
        prop_assert!((-20..=19).contains(&v.nice));
        prop_assert!(v.rt_priority <= 99);
        prop_assert_eq!(v.policy.is_rt(), v.rt_priority >= 1);
        prop_assert_eq!(v.cs_flags & !abi::CS_ALL, 0);
        if let Some(p) = v.pending {
            prop_assert!(p.rt_priority <= 99);
        }
        if !consistent {
            prop_assert_eq!(v, GuestView::inconsistent());
        }
    }

    #[test]
    fn decisions_stay_within_the_limits_and_max_boost((limits, nr, events) in arb_run()) {
        run(&limits, nr, &events, true)?;
    }

    #[test]
    fn caps_hold_even_without_ticks((limits, nr, events) in arb_run()) {
        run(&limits, nr, &events, false)?;
    }

    #[test]
    fn same_inputs_give_same_outputs((limits, nr, events) in arb_run()) {
        let a = run(&limits, nr, &events, true)?;
        let b = run(&limits, nr, &events, true)?;
        prop_assert_eq!(a, b);
    }

    #[test]
    fn new_limits_hold_for_every_vcpu_after_the_next_event(
        (limits, nr, events) in arb_run(),
        new in arb_limits(),
        split in any::<prop::sample::Index>(),
    ) {
        let mut vm = VmState::new(limits, nr).expect("valid");
        let mut out = Decisions::new();
        let cut = if events.is_empty() { 0 } else { split.index(events.len()) };
        let mut now = 0u64;
        for (gap, ev) in &events[..cut] {
            now = now.saturating_add(*gap);
            vm.handle(now, ev, &mut out);
        }
        vm.set_limits(new.clone()).expect("valid");
        prop_assert_eq!(vm.next_deadline(), Some(vm.now()));
        vm.handle(now, &Event::Tick, &mut out);
        for v in 0..nr {
            let t = vm.target(v).expect("in range");
            let d = Decision {
                vcpu: v,
                params: t.params,
                reason: t.reason,
                throttled: t.throttled,
                in_debt: t.in_debt,
                rt_work: t.rt_work,
            };
            check_params(&new, &d)?;
        }
    }
}
