//! The standard report's JSON shape, ratios, targets and Markdown.

use super::analysis::*;
use super::markdown::*;
use super::model::*;
use super::report::*;
use crate::guest::AudioResult;
use crate::harness::axes::{Load, Mode};
use crate::harness::figures::ratio;
use crate::harness::meta::Meta;
use crate::host::StressorRate;
use crate::stats::Histogram;

fn flat(us: u64, n: u64) -> Histogram {
    let mut h = Histogram::default();
    h.record(us, n);
    h
}

/// Guest p99 = `g` µs and host p99 = `h` µs for `mode`, loaded, 1000 µs.
fn add(r: &mut Results, mode: Mode, g: u64, h: u64, glitches: u64, cpu_ops: f64) {
    r.latency
        .entry((Load::Loaded, 1000, mode))
        .or_default()
        .push(LatencyRun {
            rep: 0,
            guest: flat(g, 100),
            host: flat(h, 100),
            guest_expected: 100,
            host_expected: 100,
            foreign_cpu: 0.05,
            cpu: None,
            interrupts: None,
            ipi_sources: None,
        });
    r.sessions
        .entry((Load::Loaded, mode))
        .or_default()
        .push(SessionRun {
            audio: Some(AudioResult {
                periods: 1000,
                glitches,
                period_us: 2902,
                buffer_us: 2902,
                ..Default::default()
            }),
            load: vec![StressorRate {
                stressor: "cpu".into(),
                ops_per_s: cpu_ops,
                ..Default::default()
            }],
            ..Default::default()
        });
}

fn sample() -> Report {
    let mut r = Results::default();
    add(&mut r, Mode::Vanilla, 4000, 50, 300, 1000.0);
    add(&mut r, Mode::StaticRt, 1000, 300, 10, 800.0);
    add(&mut r, Mode::Pvsched, 1200, 52, 12, 950.0);
    build(
        &r,
        Meta {
            repeat: 1,
            duration_s: 10,
            load_cmd: "stress-ng --cpu 2".into(),
            ..Default::default()
        },
        &[Load::Loaded],
        &[1000],
        &Mode::ALL,
    )
}

#[test]
fn report_json_has_the_simulator_shape() {
    // Act
    let v = serde_json::to_value(sample()).unwrap();

    // Assert
    let s = &v["scenarios"][0];
    assert_eq!(s["load"], "loaded");
    assert_eq!(s["interval_us"], 1000);
    for mode in ["vanilla", "static-rt", "pvsched"] {
        for side in ["guest", "host"] {
            for key in ["avg_us", "p50_us", "p99_us", "p999_us", "max_us"] {
                assert!(
                    s["modes"][mode][side][key].is_number(),
                    "modes.{mode}.{side}.{key} missing in {s}"
                );
            }
        }
    }
    assert_eq!(s["modes"]["pvsched"]["guest"]["p99_us"], 1200);
    assert_eq!(s["modes"]["pvsched"]["other_load_pct_per_repeat"][0], 5.0);
}

#[test]
fn ratios_are_pvsched_over_the_other_mode() {
    // Act
    let r = sample();
    let s = &r.scenarios[0];

    // Assert
    let vs_rt = &s.ratios["pvsched/static-rt"];
    assert!((vs_rt.guest_p99.unwrap() - 1.2).abs() < 1e-9);
    let vs_van = &s.ratios["pvsched/vanilla"];
    assert!((vs_van.guest_p99.unwrap() - 0.3).abs() < 1e-9);
    assert!((vs_van.host_p99.unwrap() - 1.04).abs() < 1e-9);
    assert!((vs_van.glitches.unwrap() - 0.04).abs() < 1e-9);
    assert!((vs_van.host_load.unwrap() - 0.95).abs() < 1e-9);
}

#[test]
fn ratio_with_a_zero_denominator_is_none() {
    assert_eq!(ratio(5.0, 0.0), None);
    assert_eq!(ratio(0.0, 5.0), Some(0.0));
}

#[test]
fn targets_met_and_missed_say_by_how_much() {
    // Arrange: guest 1.2x static-rt (met), 0.3x vanilla (met), host 1.04x (met).
    let mut r = sample();
    assert!(r.targets.iter().all(|t| t.met), "{:?}", r.targets);

    // Act: make the host side miss: 66 / 50 = 1.32x against 1.1x.
    r.scenarios[0]
        .modes
        .get_mut("pvsched")
        .unwrap()
        .host
        .summary
        .p99_us = 66;
    let t = targets(&r.scenarios[0]);

    // Assert
    let host = t.iter().find(|t| t.what.starts_with("host")).unwrap();
    assert!(!host.met);
    assert!(
        host.verdict().contains("MISSED by 20 %"),
        "{}",
        host.verdict()
    );
}

#[test]
fn host_load_is_relative_to_vanilla() {
    let r = sample();
    let pv = &r.scenarios[0].modes["pvsched"];
    assert_eq!(pv.host_load.as_ref().unwrap().vs_vanilla, Some(0.95));
}

#[test]
fn daemon_counters_are_per_second_of_the_daemons_lifetimes() {
    let text = "pvsched_wakeups_total{cause=\"timer\"} 300\n\
                pvsched_doorbell_rings_total 40\n";
    let session = |t: &str, secs: f64| SessionRun {
        daemon_counters: crate::daemon::DAEMON_COUNTERS
            .iter()
            .filter_map(|(k, n)| Some((k.to_string(), crate::daemon::prometheus_value(t, n)?)))
            .collect(),
        daemon_seconds: secs,
        ..Default::default()
    };

    let per_s = daemon_per_s(&[session(text, 10.0), session(text, 20.0)]);

    assert_eq!(per_s.get("wakeups_timer"), Some(&20.0));
    assert_eq!(per_s.get("doorbell_rings"), Some(&(80.0 / 30.0)));
    assert_eq!(per_s.get("wakeups_records"), None);
    assert!(daemon_per_s(&[]).is_empty());
}

#[test]
fn reaction_quantiles_are_read_off_the_summed_histograms() {
    // Two sessions' cumulative buckets (le in seconds): 10 µs, 50 µs, 500 µs, +Inf.
    let a = [
        (Some(10e-6), 60),
        (Some(50e-6), 90),
        (Some(500e-6), 99),
        (None, 100),
    ];
    let b = [
        (Some(10e-6), 40),
        (Some(50e-6), 90),
        (Some(500e-6), 100),
        (None, 100),
    ];

    let r = reaction(&[&a, &b]).unwrap();

    assert_eq!(r.actions, 200);
    assert_eq!(r.p50_us, Some(10.0)); // 100 of 200 at or below 10 µs
    assert_eq!(r.p90_us, Some(50.0));
    assert_eq!(r.p99_us, Some(500.0));
    assert_eq!(r.max_us, None); // one above the last bound
    assert!(reaction(&[&[]]).is_none());
}

#[test]
fn prometheus_histogram_buckets_are_parsed() {
    let text = "# HELP x\npvsched_reaction_latency_seconds_sum 0.01\n\
                pvsched_reaction_latency_seconds_bucket{le=\"0.00001\"} 3\n\
                pvsched_reaction_latency_seconds_bucket{le=\"+Inf\"} 5\n\
                pvsched_other_bucket{le=\"1.0\"} 9\n";

    let b = crate::daemon::prometheus_buckets(text, "pvsched_reaction_latency_seconds");

    assert_eq!(b, vec![(Some(0.00001), 3), (None, 5)]);
    // What raw.json keeps reads back (JSON has no infinity).
    let json = serde_json::to_string(&b).unwrap();
    let back: Vec<(Option<f64>, u64)> = serde_json::from_str(&json).unwrap();
    assert_eq!(back, b);
}

#[test]
fn markdown_shows_where_each_sessions_boost_budget_went() {
    let mut r = sample();
    r.scenarios[0]
        .modes
        .get_mut(Mode::Pvsched.name())
        .unwrap()
        .daemon = vec![serde_json::json!({"vms": [{
        "boosted_s": 6.97, "demoted_ms": 21.0, "budget_latches": 3,
        "budget_latched_ms": 3000.0, "over_budget": 313,
        "boosted_ms_by_reason": {"guest_rt": 605.0, "proactive_wake": 4601.4}
    }]})];

    let md = markdown(&r);

    assert!(
        md.contains(
            "| loaded | 1 | 6.97 | proactive_wake 4601, guest_rt 605 | 21 | 3 | 3000 | 313 |"
        ),
        "{md}"
    );
    assert!(!markdown(&sample()).contains("boost budget, per session"));
}

#[test]
fn markdown_shows_every_mode_and_the_targets() {
    let md = markdown(&sample());
    for needle in [
        "| loaded | 1000 µs | vanilla | 4000 |",
        "pvsched/static-rt",
        "## Targets",
        "met (1.20x",
        "| 1000 µs | 4000 | 1000 | 1200 | 50 | 300 | 52 |",
    ] {
        assert!(md.contains(needle), "{needle:?} not in\n{md}");
    }
}

/// `mode`'s pvschedd, if `mode` ran in `r`: `cpu_s` CPU-seconds of its own over
/// each 10 s phase on 2 CPUs, and `counters` (daemon counter key -> count)
/// over a 10 s session.
fn serve(r: &mut Results, mode: Mode, cpu_s: f64, counters: &[(&str, f64)]) {
    for run in r
        .latency
        .get_mut(&(Load::Loaded, 1000, mode))
        .into_iter()
        .flatten()
    {
        run.cpu = Some(super::share::CpuUse {
            wall_s: 10.0,
            host_cpus: 2,
            vcpu_s: vec![1.0, 1.0],
            daemon_s: Some(cpu_s),
            ..Default::default()
        });
    }
    for s in r
        .sessions
        .get_mut(&(Load::Loaded, mode))
        .into_iter()
        .flatten()
    {
        s.daemon_counters = counters.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        s.daemon_seconds = 10.0;
    }
}

/// `modes` of a loaded run, pvsched's pvschedd with the doorbell (1 % of
/// the machine; wakeups/s: records 300, timer 100, doorbell 50) and
/// pvsched-timer's on the timer (4 %; records 300, timer 2000).
fn doorbell_run(modes: &[Mode]) -> Report {
    let mut r = Results::default();
    for &m in modes {
        add(&mut r, m, 1000, 50, 10, 900.0);
    }
    serve(
        &mut r,
        Mode::Pvsched,
        0.2,
        &[
            ("wakeups_records", 3000.0),
            ("wakeups_timer", 1000.0),
            ("wakeups_doorbell", 500.0),
            ("doorbell_rings", 600.0),
            ("events_preempted", 700.0),
        ],
    );
    serve(
        &mut r,
        Mode::PvschedTimer,
        0.8,
        &[
            ("wakeups_records", 3000.0),
            ("wakeups_timer", 20000.0),
            ("wakeups_doorbell", 0.0),
            ("doorbell_rings", 0.0),
            ("events_preempted", 1400.0),
        ],
    );
    let mut report = build(&r, Meta::default(), &[Load::Loaded], &[1000], &Mode::EVERY);
    report.host_cost_targets = super::host_cost_targets::build(&report);
    report
}

#[test]
fn pvschedd_with_the_doorbell_is_set_against_the_timer_when_both_ran() {
    // Act
    let r = doorbell_run(&[Mode::Vanilla, Mode::Pvsched, Mode::PvschedTimer]);

    // Assert: the figures come from the fairness table and the counters.
    let [c] = r.doorbell_vs_timer.as_slice() else {
        panic!("one load: {:?}", r.doorbell_vs_timer);
    };
    assert_eq!(c.load, "loaded");
    assert_eq!(c.doorbell.cpu_pct, Some(1.0));
    assert_eq!(c.timer.cpu_pct, Some(4.0));
    assert_eq!(c.cpu_ratio, Some(0.25));
    assert_eq!(c.doorbell.wakeups_per_s, Some(450.0));
    assert_eq!(c.timer.wakeups_per_s, Some(2300.0));
    assert_eq!(c.wakeups_ratio, Some(0.196));
    assert_eq!(c.timer_wakeups_ratio, Some(0.05));
    assert_eq!(c.timer.doorbell_per_s, Some(0.0));
    assert_eq!(c.doorbell.preempted_per_s, Some(70.0));
    let loaded = &r.fair_share[0].modes;
    assert_eq!(loaded[Mode::PvschedTimer.name()].daemon_pct, Some(4.0));
    assert!(r.scenarios[0].ratios.contains_key("pvsched/pvsched-timer"));
}

#[test]
fn the_markdown_prints_both_pvschedds_and_their_ratio_line() {
    // Act
    let md = markdown(&doorbell_run(&[
        Mode::Vanilla,
        Mode::Pvsched,
        Mode::PvschedTimer,
    ]));

    // Assert
    for needle in [
        "## pvschedd with the guest doorbell against its recheck timer (same VM, same run)",
        "| load | mode | pvschedd % of the machine | wakeups/s | records | timer | doorbell | rings/s | preemptions/s |",
        "| loaded | pvsched (doorbell) | 1.00 | 450 | 300 | 100 | 50 | 60 | 70 |",
        "| loaded | pvsched-timer | 4.00 | 2300 | 300 | 2000 | 0 | 0 | 140 |",
        "| loaded | pvsched (doorbell) / pvsched-timer | 0.25x | 0.20x | 1.00x | 0.05x | n/a | n/a | 0.50x |",
        // The host-cost section's line for the loaded host.
        "| loaded: pvschedd with the guest doorbell (pvsched) against the same VM on its \
         recheck timer (pvsched-timer) | pvsched (doorbell) / pvsched-timer: CPU 0.25x (1.00 \
         / 4.00 % of the machine), wakeups 0.20x (450 / 2300 per s; timer 100 / 2000 per s) | \
         shown |",
        // The mode in the tables that list every mode.
        "| loaded | 1000 µs | pvsched-timer | 1000 |",
        "| loaded | 1000 µs | pvsched/pvsched-timer |",
    ] {
        assert!(md.contains(needle), "{needle:?} not in\n{md}");
    }
}

#[test]
fn without_both_modes_there_is_no_doorbell_comparison() {
    for modes in [
        &[Mode::Vanilla, Mode::StaticRt, Mode::Pvsched][..],
        &[Mode::Vanilla, Mode::PvschedTimer][..],
    ] {
        // Act
        let r = doorbell_run(modes);
        let md = markdown(&r);
        let json = serde_json::to_value(&r).unwrap();

        // Assert
        assert!(r.doorbell_vs_timer.is_empty(), "{modes:?}");
        assert!(json.get("doorbell_vs_timer").is_none(), "{modes:?}");
        assert!(!md.contains("against its recheck timer"), "{modes:?}");
        assert!(
            !md.contains("pvsched (doorbell) / pvsched-timer"),
            "{modes:?}"
        );
        assert!(!md.contains("pvsched/pvsched-timer"), "{modes:?}");
    }
    // The comparisons of the default modes are those they always were.
    let keys: Vec<String> = sample().scenarios[0].ratios.keys().cloned().collect();
    assert_eq!(
        keys,
        ["pvsched/static-rt", "pvsched/vanilla", "static-rt/vanilla"]
    );
}
