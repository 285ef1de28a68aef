//! Property tests: the trust-boundary invariants hold for any guest input, any event
//! sequence and any valid limits.

use proptest::prelude::*;
use pvsched_abi as abi;
use pvsched_abi::GuestHalf;
use pvsched_policy::{
    AllowedPolicies, Decision, Decisions, Event, ExitReason, GuestView, HostPolicy, RunStatus,
    VmLimits, VmState, WakeSource,
};

/// Ticks at one instant before we call it a livelock (one per vCPU state change at most).
const MAX_TICKS_AT_ONCE: usize = 8;

/// With ticks at every deadline, a 1 ns `max_boost` and `throttle` cost one tick per ns:
/// gaps are capped at this many of the shortest period so that runs stay small. Without
/// ticks, gaps are taken as they come.
const MAX_PERIODS_PER_GAP: u64 = 64;

fn arb_u32_biased(small: u32) -> impl Strategy<Value = u32> {
    prop_oneof![0..=small, any::<u32>()]
}

/// Any guest half: every field any value, biased toward values that mean something.
fn arb_half() -> impl Strategy<Value = GuestHalf> {
    let flags = prop_oneof![0..=abi::GF_ALL, any::<u32>()];
    let cs = prop_oneof![Just(0u32), 0..=abi::CS_ALL, any::<u32>()];
    let nice = prop_oneof![-25i32..=25, any::<i32>()];
    let seq = prop_oneof![(0u32..64).prop_map(|s| s * 2), any::<u32>()];
    let pending = prop_oneof![
        Just(0u64),
        (0u64..8, 0u64..=120)
            .prop_map(|(pol, prio)| abi::PENDING_VALID | (pol << abi::PENDING_POLICY_SHIFT) | prio),
        any::<u64>(),
    ];
    (
        (seq, flags, cs, arb_u32_biased(7), arb_u32_biased(120), nice),
        (any::<u64>(), any::<[u64; 4]>(), pending, any::<u64>()),
        any::<[u64; 6]>(),
    )
        .prop_map(
            |(
                (seq, flags, cs_flags, policy, rt_priority, nice),
                (update_ns, counts, guest_pending, boost_req_count),
                guest_reserved,
            )| GuestHalf {
                seq,
                flags,
                cs_flags,
                policy,
                rt_priority,
                nice,
                update_ns,
                hardirq_count: counts[0],
                softirq_count: counts[1],
                nmi_count: counts[2],
                switch_count: counts[3],
                guest_pending,
                boost_req_count,
                guest_reserved,
            },
        )
}

fn arb_duration() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..=1_000, 1u64..=200_000_000]
}

fn arb_limits() -> impl Strategy<Value = VmLimits> {
    let allowed = any::<[bool; 4]>().prop_map(|[batch, idle, fifo, rr]| AllowedPolicies {
        other: true,
        batch,
        idle,
        fifo,
        rr,
    });
    let prios = (1u8..=99, 1u8..=99, 1u8..=99);
    let nices = (-20i8..=19, -20i8..=19, -20i8..=19);
    let bools = any::<[bool; 7]>();
    let durations = (
        arb_duration(),
        arb_duration(),
        arb_duration(),
        1u64..=2_000_000_000,
    );
    (
        allowed,
        any::<bool>(),
        prios,
        nices,
        bools,
        durations,
        0u32..=1000,
    )
        .prop_map(
            |(allowed, fifo, (bp, mp, dp), (a, b, debt_nice), h, (pb, mb, th, win), share)| {
                VmLimits {
                    allowed,
                    boost_policy: if fifo {
                        HostPolicy::Fifo
                    } else {
                        HostPolicy::Rr
                    },
                    boost_priority: bp,
                    max_rt_priority: mp,
                    deadline_priority: dp,
                    nice_min: a.min(b),
                    nice_max: a.max(b),
                    honor_critical_sections: h[0],
                    honor_guest_rt: h[1],
                    honor_boost_request: h[2],
                    honor_pending_hint: h[3],
                    proactive_wake: h[4],
                    proactive_irq: h[5],
                    proactive_halt: h[6],
                    halt_boost_ns: th.max(pb),
                    proactive_boost_ns: pb,
                    max_boost_ns: mb,
                    // Zero (no grace) or the proactive length: both must keep every bound.
                    inconsistent_grace_ns: if h[0] ^ h[6] { pb } else { 0 },
                    throttle_ns: th,
                    boost_share_permille: share,
                    fairness_window_ns: win,
                    debt_nice,
                }
            },
        )
}

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
    prop_oneof![
        5 => (arb_vcpu(), arb_half(), prop::bool::weighted(0.9)).prop_map(
            |(vcpu, guest, consistent)| Event::GuestUpdate { vcpu, guest, consistent }
        ),
        1 => arb_vcpu().prop_map(|vcpu| Event::Running { vcpu }),
        1 => arb_vcpu().prop_map(|vcpu| Event::Preempted { vcpu }),
        1 => arb_vcpu().prop_map(|vcpu| Event::Blocked { vcpu }),
        1 => (arb_vcpu(), wake).prop_map(|(vcpu, source)| Event::Woken { vcpu, source }),
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

fn check_params(limits: &VmLimits, d: &Decision) -> Result<(), TestCaseError> {
    let p = d.params;
    prop_assert!(limits.allowed.allows(p.policy), "policy not allowed: {d:?}");
    if p.is_rt() {
        prop_assert!(p.rt_priority >= 1, "RT at prio 0: {d:?}");
        prop_assert!(
            p.rt_priority <= limits.max_rt_priority,
            "prio above cap: {d:?}"
        );
    } else {
        prop_assert_eq!(p.rt_priority, 0, "CFS with an RT prio: {:?}", d);
    }
    prop_assert!((-20..=19).contains(&p.nice), "nice out of range: {d:?}");
    let in_range = (limits.nice_min..=limits.nice_max).contains(&p.nice);
    let debt = d.in_debt && !p.is_rt() && p.nice == limits.debt_nice;
    prop_assert!(in_range || debt, "nice outside the limits: {d:?}");
    Ok(())
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
    let period = limits
        .max_boost_ns
        .min(limits.throttle_ns)
        .min(limits.proactive_boost_ns);
    let max_gap = period.saturating_mul(MAX_PERIODS_PER_GAP);

    // Per vCPU, since its boost began: boosted time on a CPU minus time halted (a halted
    // vCPU uses no CPU; the policy's burst drains then, as when unboosted).
    let mut deliver = |vm: &mut VmState,
                       at: u64,
                       ev: &Event,
                       decisions: &mut Vec<(u64, Decision)>,
                       boosted_since: &mut Vec<Option<u64>>|
     -> Result<(), TestCaseError> {
        let prev = vm.now();
        for (i, since) in boosted_since.iter_mut().enumerate() {
            let halted = vm
                .vcpu_stats(i as u32)
                .is_some_and(|s| s.status == RunStatus::Halted);
            if let Some(acc) = since.as_mut() {
                let dt = at.max(prev) - prev;
                *acc = if halted {
                    acc.saturating_sub(dt)
                } else {
                    *acc + dt
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
            };
            check_params(&new, &d)?;
        }
    }
}
