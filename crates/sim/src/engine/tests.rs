//! The guest idle drivers in small simulations: a one-vCPU guest whose periodic task leaves
//! it idle about 25 µs at a time on a host whose idle exit costs 100 µs, so that the wake →
//! running latency pvschedd measures (the hint) is large and the idle periods short: the
//! hinted driver would poll all the time but for its budget.

use pvsched_abi::HF_OVERLOADED;
use pvsched_policy::Event;

use super::{Mode, Sim};
use crate::daemon::SCX_SCAN_INTERVAL_NS;
use crate::results::IdleCounters;
use crate::scenario::Scenario;

const MS: u64 = 1_000_000;

const SHORT_IDLES: &str = r#"
name = "short-idles"
duration_s = 3.0
warmup_s = 0.0
costs = "kvm"
modes = ["pvsched"]
guest_idle = "hinted"
cost_overrides = { idle_wakeup_ns = 100000, idle_exit_before_switch = true, halt_poll = { max_ns = 0 } }

[host]
cpus = 2
tasks = [HOST_TASKS]

[pvsched]
idle_poll_budget_permille = BUDGET

[[vms]]
name = "vm"
vcpus = 1
tasks = [{ kind = "periodic", interval_us = 30, work_us = 2 }]
"#;

/// The test guest with `host_tasks` on the host, the hinted driver's budget `budget`
/// permille (the VM's `idle_poll_budget_permille`).
fn sim_with(host_tasks: &str, mode: Mode, budget: u32) -> Sim {
    let text = SHORT_IDLES
        .replace("HOST_TASKS", host_tasks)
        .replace("BUDGET", &budget.to_string());
    let sc = Scenario::parse(&text, "test").expect("the test scenario parses");
    let limits = sc.limits_for(None).expect("valid limits");
    Sim::build(&sc, None, mode, sc.costs_for(None), limits, 1, false)
}

/// A budget of a whole core: the budget never stops a poll.
fn sim(host_tasks: &str, mode: Mode) -> Sim {
    sim_with(host_tasks, mode, 1000)
}

/// The VM's idle counters over (`from`, `to`].
fn between(s: &mut Sim, from: u64, to: u64) -> IdleCounters {
    s.run_until(from);
    let a = s.rec.idle_counters(0);
    s.run_until(to);
    let b = s.rec.idle_counters(0);
    IdleCounters {
        guest_polls: b.guest_polls - a.guest_polls,
        guest_poll_hits: b.guest_poll_hits - a.guest_poll_hits,
        guest_halts: b.guest_halts - a.guest_halts,
        overload_halts: b.overload_halts - a.overload_halts,
        unhinted_halts: b.unhinted_halts - a.unhinted_halts,
        budget_halts: b.budget_halts - a.budget_halts,
        ..IdleCounters::default()
    }
}

fn host_half(s: &Sim) -> pvsched_abi::HostHalf {
    let d = s.daemon.as_ref().expect("a pvsched mode has the daemon");
    d.host_half(0, 0, s.now)
}

#[test]
fn hinted_polls_once_the_hint_is_large_and_idles_are_short() {
    let mut s = sim("", Mode::Pvsched);

    // No hint in the first second (the policy's first window is still open): it halts.
    let first = between(&mut s, 0, 900 * MS);
    let hint = host_half(&s);
    let later = between(&mut s, 1_100 * MS, 1_900 * MS);
    let hint_later = host_half(&s);

    assert_eq!((hint.wake_p50_ns, hint.wake_p99_ns), (0, 0));
    assert_eq!(first.guest_polls, 0);
    assert!(first.unhinted_halts > 1_000, "{first:?}");
    assert!(hint_later.wake_p99_ns >= 100_000, "{hint_later:?}");
    assert!(later.guest_polls > 10_000, "{later:?}");
    assert!(
        later.guest_poll_hits * 10 >= later.guest_polls * 9,
        "the timer ends the polls: {later:?}"
    );
    assert!(later.guest_halts * 10 < later.guest_polls, "{later:?}");
    assert_eq!(later.budget_halts, 0, "{later:?}");
}

/// Host ns vCPU 0's idle driver polled in (`from`, `to`], and the idle counters.
fn polled_between(s: &mut Sim, from: u64, to: u64) -> (u64, IdleCounters) {
    s.run_until(from);
    let a = s.rec.guest_poll_ns(0);
    let c = between(s, from, to);
    (s.rec.guest_poll_ns(0) - a, c)
}

#[test]
fn hinted_polls_within_its_budget_a_whole_window_or_none() {
    for budget in [50, 250] {
        let mut s = sim_with("", Mode::Pvsched, budget);
        let (from, to) = (0, 1_900 * MS);

        let (polled, c) = polled_between(&mut s, from, to);
        let (polled_later, later) = polled_between(&mut s, to, 2_900 * MS);

        // The bucket fills at `budget` of the time and holds 100 ms' worth; the polls here
        // run no longer than their window (nothing preempts the vCPU), so never into debt.
        let share = |ns: u64| ns * u64::from(budget) / 1000;
        let bucket = share(100 * MS);
        assert!(
            polled <= share(to - from) + bucket,
            "budget {budget}: {polled} ns polled in {} ns, {c:?}",
            to - from
        );
        assert!(
            polled_later <= share(1_000 * MS) + bucket,
            "budget {budget}: {polled_later} ns polled in 1 s, {later:?}"
        );
        // It wants to poll nearly all the time: the budget decides, and it is spent.
        assert!(later.budget_halts > 1_000, "budget {budget}: {later:?}");
        assert!(
            polled_later >= share(1_000 * MS) * 8 / 10,
            "budget {budget}: {polled_later} ns polled in 1 s, {later:?}"
        );
        // Whole windows: a window is at least 50 µs and the idle periods about 25 µs, so
        // nearly every poll is caught; budget-cut polls would time out.
        assert!(
            later.guest_poll_hits * 10 >= later.guest_polls * 9,
            "budget {budget}: {later:?}"
        );
    }
}

#[test]
fn hinted_halts_at_once_while_the_host_half_says_overloaded() {
    let mut s = sim("", Mode::Pvsched);
    // Past the first discovery round (1 s, not overloaded) with a hint: it polls.
    let before = between(&mut s, 1_050 * MS, 1_100 * MS);
    assert!(before.guest_polls > 100, "{before:?}");

    let now = s.now;
    if let Some(d) = s.daemon.as_mut() {
        d.handle(0, now, &[], Some(Event::OverloadHint { overloaded: true }));
    }
    s.daemon_after(0);
    // From when the vCPU has read its host half again (at most 10 ms later) to just before
    // the next round (2 s), which would read the pressure again.
    let during = between(&mut s, 1_111 * MS, 1_990 * MS);

    assert_ne!(host_half(&s).flags & HF_OVERLOADED, 0);
    assert_eq!(during.guest_polls, 0, "{during:?}");
    assert!(during.overload_halts > 5_000, "{during:?}");
    assert_eq!(during.overload_halts, during.guest_halts, "{during:?}");
}

#[test]
fn without_a_host_half_hinted_is_halt() {
    let mut s = sim("", Mode::Vanilla);

    let c = between(&mut s, 0, 1_900 * MS);

    assert_eq!(c.guest_polls, 0);
    assert_eq!(c.unhinted_halts, c.guest_halts);
    assert!(c.guest_halts > 1_000, "{c:?}");
}

#[test]
fn the_overload_flag_follows_host_cpu_pressure() {
    let mut idle = sim("", Mode::Pvsched);
    // Two hogs per CPU: every CPU always has a thread waiting.
    let mut busy = sim(r#"{ kind = "hog", count = 4 }"#, Mode::Pvsched);

    idle.run_until(1_500 * MS);
    busy.run_until(1_500 * MS);

    assert_eq!(host_half(&idle).flags & HF_OVERLOADED, 0);
    assert!(
        idle.cpu_pressure.is_some_and(|p| p < 0.10),
        "{:?}",
        idle.cpu_pressure
    );
    assert_ne!(host_half(&busy).flags & HF_OVERLOADED, 0);
    assert!(
        busy.cpu_pressure.is_some_and(|p| p > 0.9),
        "{:?}",
        busy.cpu_pressure
    );
}

/// Under KVM costs the simulated daemon hears KVM's account of every halt
/// (`kvm_vcpu_wakeup`) as pvschedd does: with KVM's polling window above the guest's
/// 28 µs idles, the polling catches them; with polling off, none is caught.
#[test]
fn under_kvm_the_idle_meter_takes_kvm_halt_reports_and_counts_polled_ones() {
    let run = |max_ns: u64| {
        let text = SHORT_IDLES
            .replace("HOST_TASKS", "")
            .replace("BUDGET", "1000")
            .replace("guest_idle = \"hinted\"", "guest_idle = \"halt\"")
            .replace("max_ns = 0", &format!("max_ns = {max_ns}"));
        let sc = Scenario::parse(&text, "test").expect("the test scenario parses");
        let limits = sc.limits_for(None).expect("valid limits");
        let mut s = Sim::build(
            &sc,
            None,
            Mode::Pvsched,
            sc.costs_for(None),
            limits,
            1,
            false,
        );
        s.run_until(500 * MS);
        s.daemon.as_ref().expect("pvsched mode").halts_and_polled(0)
    };

    let (halts, polled) = run(200_000);
    let (halts_off, polled_off) = run(0);

    assert!(halts > 1000, "{halts} halts");
    assert!(
        polled * 10 > halts * 9,
        "{polled} of {halts} caught by polling"
    );
    assert!(halts_off > 1000, "{halts_off} halts");
    assert_eq!(polled_off, 0);
}

/// hostvm-busy's loaded host and VM (one vCPU, a 1 ms RT cyclictest), 3 s, in `costs`.
const LOADED_HOST: &str = r#"
name = "loaded-host"
duration_s = 3.0
warmup_s = 0.0
costs = "COSTS"
modes = ["pvsched-scx"]

[host]
cpus = 2
tasks = [
    { kind = "hog", count = 3 },
    { kind = "bursty", count = 1, run_us = 300, sleep_us = 700 },
    { kind = "bursty", count = 1, run_us = 150, sleep_us = 150 },
    { kind = "periodic", count = 2, interval_us = 1000, work_us = 5, policy = "rr", prio = 8 },
]

[[vms]]
name = "vm"
vcpus = 1
tasks = [{ kind = "periodic", interval_us = 1000, work_us = 5, policy = "rr", prio = 8 }]
"#;

#[test]
fn on_the_sched_ext_backend_the_schedulers_own_boosts_are_charged_within_the_budget() {
    // KVM in the host VM: the vCPU wants about 45 % of a CPU, more than its budget's 30 %.
    let text = LOADED_HOST.replace("COSTS", "kvm-hostvm");
    let sc = Scenario::parse(&text, "test").expect("the test scenario parses");
    let limits = sc.limits_for(None).expect("valid limits");
    let (share, window) = (limits.boost_share_permille, limits.fairness_window_ns);
    let mut s = Sim::build(
        &sc,
        None,
        Mode::PvschedScx,
        sc.costs_for(None),
        limits,
        1,
        false,
    );
    let end = 3_000 * MS;
    s.run_until(end);

    let stats = s.daemon.as_ref().expect("a pvsched mode").stats()[0];
    let tid = s.vms[0].vcpus[0].tid;
    let done = s.host.scx_stats(tid).unwrap_or_default();
    assert!(stats.kernel_boosted_ns_total > 100 * MS, "{stats:?}");
    assert!(done.kboosts > 100, "{done:?}");
    // What the scans charged is what the scheduler took, up to its last scan.
    assert!(done.kboost_ns >= stats.kernel_boosted_ns_total, "{done:?}");
    assert!(done.kboost_ns - stats.kernel_boosted_ns_total <= SCX_SCAN_INTERVAL_NS);
    // Within the budget: its share of the time, its capacity (a window's share), and at
    // most one scan interval's overdraft.
    let earned = u64::from(share) * end / 1000;
    let capacity = u64::from(share) * window / 1000;
    assert!(
        stats.boosted_ns_total <= earned + capacity + SCX_SCAN_INTERVAL_NS,
        "{} ns boosted, budget {earned} + {capacity}",
        stats.boosted_ns_total
    );
    // The scans' allowances kept it under the budget, not a latch: the budget was spent
    // (about its share each scan) without ever running dry; what is left is what it
    // earned since the last scan.
    assert_eq!(stats.budget_latches, 0, "{stats:?}");
    assert!(
        stats.budget_ns <= u64::from(share) * SCX_SCAN_INTERVAL_NS / 1000 + MS,
        "{stats:?}"
    );
}
