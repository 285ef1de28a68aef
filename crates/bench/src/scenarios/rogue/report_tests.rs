//! The rogue scenario's cases, shares, counters, targets and report.

use std::collections::BTreeMap;

use pvsched_control::VmStatus;

use super::analysis::*;
use super::markdown::*;
use super::model::*;
use super::report::*;
use crate::harness::axes::by_name;
use crate::harness::axes::{Load, Mode};
use crate::harness::meta::Meta;
use crate::stats::Histogram;

fn flat(us: u64, n: u64) -> Histogram {
    let mut h = Histogram::default();
    h.record(us, n);
    h
}

/// One phase of `case`: neighbour p99 `g`, host p99 `h`, rogue share `share`.
fn phase(case: Case, rep: usize, g: u64, h: u64, share: f64) -> Phase {
    let mut daemon = BTreeMap::new();
    if case.mode() == Mode::Pvsched {
        daemon.insert(
            ROGUE.to_string(),
            VmCounters {
                vcpus: 2,
                boosts: 10,
                throttles: 2,
                over_budget: 5,
                boosted_s: 5.0,
                in_debt_at_end: rep == 1,
                ..Default::default()
            },
        );
    }
    Phase {
        load: Load::Loaded,
        interval_us: 1000,
        case,
        rep,
        guest: flat(g, 100),
        host: flat(h, 100),
        guest_expected: 100,
        host_expected: 100,
        foreign_cpu: 0.02,
        window_s: 10.0,
        rogue_share: share,
        rogue_vcpu_share: share * 0.9,
        neighbour_share: 0.1,
        params: BTreeMap::from([(
            THREAD_GROUPS[0].to_string(),
            ParamsSeen {
                samples: 100,
                rt: if case.spinning() { 90 } else { 0 },
                rt_by_params: if case.spinning() {
                    BTreeMap::from([("rr/4".to_string(), 80), ("rr/2".to_string(), 10)])
                } else {
                    BTreeMap::new()
                },
            },
        )]),
        rogue_spinning: if case.spinning() { 2 } else { 0 },
        daemon,
    }
}

fn raw(phases: Vec<Phase>) -> RogueRaw {
    RogueRaw {
        scenario: "rogue".into(),
        meta: RogueMeta {
            base: Meta {
                repeat: 2,
                duration_s: 10,
                load_cmd: "stress-ng --cpu 2".into(),
                ..Default::default()
            },
            rogue_vcpus: 2,
            share_definition: SHARE_DEFINITION.into(),
            ..Default::default()
        },
        loads: vec![Load::Loaded],
        intervals: vec![1000],
        cases: Case::DEFAULT.to_vec(),
        phases,
        sessions: vec![],
    }
}

fn sample() -> RogueReport {
    build(&raw(vec![
        phase(Case::PvschedQuiet, 1, 300, 80, 0.05),
        phase(Case::PvschedRogue, 1, 330, 90, 0.50),
        phase(Case::VanillaRogue, 1, 4000, 70, 0.30),
        phase(Case::PvschedQuiet, 2, 300, 80, 0.05),
        phase(Case::PvschedRogue, 2, 330, 90, 0.60),
        phase(Case::VanillaRogue, 2, 4000, 70, 0.40),
    ]))
}

#[test]
fn case_names_round_trip_and_say_what_differs() {
    for c in Case::ALL {
        assert_eq!(by_name::<Case>(c.name()).unwrap(), c);
        assert_eq!(serde_json::to_value(c).unwrap(), c.name());
    }
    assert!(Case::PvschedRogue.spinning() && !Case::PvschedQuiet.spinning());
    assert_eq!(Case::VanillaRogue.mode(), Mode::Vanilla);
    assert!(by_name::<Case>("rogue").is_none());
}

#[test]
fn shares_pool_the_windows_and_keep_each_repeat() {
    // Act
    let r = sample();

    // Assert: (0.5 + 0.6) / 2 over equal windows.
    let pv = &r.cells[0].cases["pvsched-rogue"];
    assert_eq!(pv.rogue_share.pct, 55.0);
    assert_eq!(pv.rogue_share.pct_per_repeat, vec![50.0, 60.0]);
    assert_eq!(pv.rogue_spinning_per_repeat, vec![2, 2]);
}

#[test]
fn p99_ratios_compare_the_rogue_with_the_quiet_run_of_the_same_mode() {
    let r = sample();
    let x = &r.cells[0].ratios;
    assert_eq!(x.neighbour_p99_pvsched, Some(1.1));
    assert_eq!(x.host_p99_pvsched, Some(1.125));
    assert_eq!(x.neighbour_p99_vanilla, None, "vanilla-quiet did not run");
    assert_eq!(x.rogue_share_pvsched_minus_vanilla_pts, Some(20.0));
}

#[test]
fn targets_met_and_missed_say_by_how_much() {
    // Act
    let r = sample();

    // Assert: p99 1.1x and 1.125x met; share 55 % against 35 + 10 missed.
    assert_eq!(r.targets.len(), 3);
    assert!(r.targets[0].met && r.targets[1].met);
    let share = &r.targets[2];
    assert!(!share.met);
    assert_eq!(share.limit, 45.0);
    assert!(
        share.verdict().contains("MISSED by 10.0 points"),
        "{}",
        share.verdict()
    );
}

#[test]
fn daemon_counters_sum_over_the_repeats() {
    let r = sample();
    let d = &r.cells[0].cases["pvsched-rogue"].daemon[ROGUE];
    assert_eq!((d.boosts, d.throttles, d.over_budget), (20, 4, 10));
    // 10 boosted vCPU-s of 2 x 10 s x 2 vCPUs.
    assert_eq!(d.boosted_pct, 25.0);
    assert_eq!(d.in_debt_at_end, 1);
    assert!(r.cells[0].cases["vanilla-rogue"].daemon.is_empty());
}

#[test]
fn thread_params_seen_add_up_over_the_repeats() {
    let r = sample();
    let p = &r.cells[0].cases["pvsched-rogue"].params["rogue vCPUs"];
    assert_eq!((p.samples, p.rt), (200, 180));
    assert_eq!(p.rt_pct(), 90.0);
    assert_eq!(p.rt_params(), "rr/4 80.0 %, rr/2 10.0 %");
    let md = markdown(&r);
    assert!(
        md.contains("| loaded | 1000 µs | pvsched-rogue | rogue vCPUs | 200 | 90.0 | rr/4 80.0 %, rr/2 10.0 % |"),
        "{md}"
    );
}

#[test]
fn counters_between_two_statuses_are_differences() {
    // Arrange: a status with one VM, counters as given.
    let status = |generation: u64, boosts: u64, boosted_s: f64| -> VmStatus {
        let v = serde_json::json!({
            "name": ROGUE, "tgid": 1, "accel": "tcg", "region": "/r",
            "generation": generation, "guest_bound": true, "in_debt": true, "debt_ms": 3.0,
            "boosts": boosts, "throttles": 1, "clamped_inputs": 0, "boosted_s": boosted_s,
            "over_budget": boosts / 2, "vcpus": [], "latency_path": []
        });
        serde_json::from_value(v).unwrap()
    };

    // Act
    let same = VmCounters::between(&status(1, 10, 1.0), &status(1, 30, 4.0));
    let anew = VmCounters::between(&status(1, 10, 1.0), &status(2, 4, 0.5));

    // Assert
    assert_eq!(
        (same.boosts, same.over_budget, same.boosted_s),
        (20, 10, 3.0)
    );
    assert!(same.in_debt_at_end);
    assert_eq!((anew.boosts, anew.boosted_s), (4, 0.5));
}

#[test]
fn markdown_shows_every_case_the_shares_and_the_targets() {
    let md = markdown(&sample());
    for needle in [
        "| loaded | 1000 µs | pvsched-quiet | 300 |",
        "| loaded | 1000 µs | pvsched-rogue | 55.0 | 50.0, 60.0 |",
        "## Targets",
        "MISSED by 10.0 points",
        "| loaded | 1000 µs | pvsched-rogue | rogue | 20 | 4 | 10 |",
        "utime + stime",
    ] {
        assert!(md.contains(needle), "{needle:?} not in\n{md}");
    }
}

#[test]
fn raw_round_trips_through_json() {
    // Arrange
    let r = raw(vec![phase(Case::PvschedRogue, 1, 330, 90, 0.5)]);

    // Act
    let text = serde_json::to_string(&r).unwrap();
    let back: RogueRaw = serde_json::from_str(&text).unwrap();

    // Assert
    assert!(text.contains("\"case\":\"pvsched-rogue\""));
    assert_eq!(back.phases[0].daemon[ROGUE].boosts, 10);
    assert_eq!(back.meta.rogue_vcpus, 2);
}
