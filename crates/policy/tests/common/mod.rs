//! Generators and checks shared by the property tests.

use proptest::prelude::*;
use pvsched_abi as abi;
use pvsched_abi::GuestHalf;
use pvsched_policy::{AllowedPolicies, Decision, HostPolicy, Reason, VmLimits, VmState};

pub fn arb_u32_biased(small: u32) -> impl Strategy<Value = u32> {
    prop_oneof![0..=small, any::<u32>()]
}

/// Any guest half: every field any value, biased toward values that mean something.
pub fn arb_half() -> impl Strategy<Value = GuestHalf> {
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
    let lock_holder = prop_oneof![0u32..=5, Just(abi::LOCK_ANY), any::<u32>()];
    let lock_flags = prop_oneof![0..=abi::LOCK_F_ALL, any::<u32>()];
    (
        (seq, flags, cs, arb_u32_biased(7), arb_u32_biased(120), nice),
        (any::<u64>(), any::<[u64; 4]>(), pending, any::<u64>()),
        (lock_holder, lock_flags, any::<[u64; 2]>()),
        (any::<u64>(), any::<[u64; 2]>()),
    )
        .prop_map(
            |(
                (seq, flags, cs_flags, policy, rt_priority, nice),
                (update_ns, counts, guest_pending, boost_req_count),
                (lock_holder, lock_flags, lock_counts),
                (rt_switch_count, named_counts),
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
                lock_holder,
                lock_flags,
                lock_contended_count: lock_counts[0],
                lock_preempted_count: lock_counts[1],
                rt_switch_count,
                lock_named_contended_count: named_counts[0],
                lock_named_preempted_count: named_counts[1],
            },
        )
}

pub fn arb_duration() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..=1_000, 1u64..=200_000_000]
}

/// Mostly realistic critical-section windows (runs are capped at 64 of the shortest period),
/// sometimes a few ns.
pub fn arb_cs_window() -> impl Strategy<Value = u64> {
    prop_oneof![1 => 1u64..=1_000, 4 => 100_000u64..=200_000_000]
}

pub fn arb_limits() -> impl Strategy<Value = VmLimits> {
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
        (arb_cs_window(), any::<prop::sample::Index>()),
    )
        .prop_map(
            |(
                allowed,
                fifo,
                (bp, mp, dp),
                (a, b, debt_nice),
                h,
                (pb, mb, th, win),
                share,
                (cs_window, cs_pick),
            )| {
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
                    boost_only_against_rivals: h[4] ^ h[5],
                    peer_vms_are_rivals: h[0] ^ h[2],
                    speculative_boosts_need_rt_work: h[1] ^ h[3],
                    halt_boost_ns: th.max(pb),
                    proactive_boost_ns: pb,
                    max_boost_ns: mb,
                    demote_after_ns: pb,
                    // 1 or 3, from a flag already drawn: both must keep every bound.
                    demoted_charge: if h[2] { 3 } else { 1 },
                    // Zero (no grace) or the proactive length: both must keep every bound.
                    inconsistent_grace_ns: if h[0] ^ h[6] { pb } else { 0 },
                    throttle_ns: th,
                    boost_share_permille: share,
                    idle_poll_budget_permille: share,
                    fairness_window_ns: win,
                    // The whole window or a part of it, from values already drawn: both
                    // must keep every bound.
                    budget_resume_permille: if h[3] { 1000 } else { share.max(1) },
                    // None, or the share drawn: both must keep every bound.
                    speculative_reserve_permille: if h[5] { 0 } else { share },
                    // From a value already drawn (the tuple is at its size limit).
                    latch_nice: debt_nice.saturating_sub(3).max(-20),
                    debt_nice,
                    cs_budget_ns: cs_pick.index(cs_window as usize) as u64 + 1,
                    cs_window_ns: cs_window,
                    // From flags already drawn (the tuple is at its size limit).
                    honor_lock_holders: !h[1],
                    lock_extension_ns: pb,
                    lock_debt_max_ns: th,
                    lock_repay_from_ns: th / 2,
                    lock_extend_running: h[3],
                }
            },
        )
}

pub fn check_params(limits: &VmLimits, d: &Decision) -> Result<(), TestCaseError> {
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
    // A latched boost budget or lock-holder extensions owed may go above nice_max, to
    // latch_nice or debt_nice exactly.
    let repaying = d.in_debt || d.reason == Reason::LockDebt;
    let debt =
        repaying && !p.is_rt() && (p.nice == limits.latch_nice || p.nice == limits.debt_nice);
    prop_assert!(in_range || debt, "nice outside the limits: {d:?}");
    Ok(())
}

/// Boosted time on a CPU as the engine's targets and statuses show it between events, ns.
pub struct Charged {
    pub all: u64,
    pub cs: Vec<u64>,
}

impl Charged {
    /// `dt` ns passed with every vCPU at its current target and status.
    pub fn add(&mut self, vm: &VmState, dt: u64) {
        for (i, cs) in self.cs.iter_mut().enumerate() {
            let (Some(t), Some(s)) = (vm.target(i as u32), vm.vcpu_stats(i as u32)) else {
                continue;
            };
            if t.params.is_rt() && s.status.on_cpu() {
                self.all += dt;
                if matches!(t.reason, Reason::CriticalSection(_)) {
                    *cs += dt;
                }
            }
        }
    }
}

/// With ticks at every deadline, boosted time over `elapsed` ns is at most what the budgets
/// bank (one window) plus what they earn, plus under 1 ns per vCPU (a latch sets at the
/// first whole ns the bucket is empty).
pub fn check_budgets(
    limits: &VmLimits,
    nr: u32,
    elapsed: u64,
    charged: &Charged,
) -> Result<(), TestCaseError> {
    let (t, n) = (u128::from(elapsed), u128::from(nr));
    let share = u128::from(limits.boost_share_permille);
    let boost_bound = share * n * (u128::from(limits.fairness_window_ns) + t) / 1000 + n;
    prop_assert!(
        u128::from(charged.all) <= boost_bound,
        "boosted {} ns > boost budget bound {} over {} ns",
        charged.all,
        boost_bound,
        elapsed
    );
    let (b, w) = (
        u128::from(limits.cs_budget_ns),
        u128::from(limits.cs_window_ns),
    );
    let cs_bound = b + b * t / w + 1;
    for (i, cs) in charged.cs.iter().enumerate() {
        prop_assert!(
            u128::from(*cs) <= cs_bound,
            "vCPU {} boosted {} ns for critical sections > bound {} over {} ns",
            i,
            cs,
            cs_bound,
            elapsed
        );
    }
    Ok(())
}
