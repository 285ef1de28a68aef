//! The message-passing scenario's parsers, report and targets.

use serde_json::Value;

use super::analysis::*;
use super::markdown::*;
use super::model::*;
use super::readings::*;
use crate::guest_idle::*;
use crate::harness::axes::by_name;
use crate::harness::axes::Load;
use crate::harness::meta::Meta;
use crate::host::StressorRate;

#[test]
fn prodcons_and_pingpong_lines_give_count_rate_and_latency() {
    // Arrange: what the programs print.
    let pc: Value = serde_json::from_str(
        "{\"messages\":120000,\"msgs_per_s\":24000.5,\"latency_p50_us\":21.50,\
         \"latency_p99_us\":180.25,\"latency_max_us\":900.0,\"consumer_waits\":100000,\
         \"producer_waits\":3,\"elapsed_s\":5.000}",
    )
    .unwrap();
    let pp: Value = serde_json::from_str(
        "{\"round_trips\":4367,\"avg_us\":74.4,\"p50_us\":39.6,\"p99_us\":1173.3,\
         \"max_us\":4689.8,\"elapsed_s\":5.001,\"round_trips_per_s\":873.2}",
    )
    .unwrap();

    // Act / Assert
    assert_eq!(
        Workload::Prodcons.figures(&pc).unwrap(),
        (120000, 24000.5, 21.5, 180.25)
    );
    assert_eq!(
        Workload::Pingpong.figures(&pp).unwrap(),
        (4367, 873.2, 39.6, 1173.3)
    );
    // pingpong from before it printed a rate.
    let old: Value =
        serde_json::from_str("{\"round_trips\":4367,\"p50_us\":1,\"p99_us\":2}").unwrap();
    let e = Workload::Pingpong.figures(&old).unwrap_err();
    assert!(e.to_string().contains("round_trips_per_s"), "{e}");
}

#[test]
fn a_measurements_output_splits_at_its_markers() {
    let out = "@@IDLE0\nmode=off registered=0\n@@UP0 12.50 20.00\n@@PROG\n{\"a\":1}\n\
               @@UP1 17.52 30.00\n@@IDLE1\n@@RC 0\n";
    let s = sections(out);
    assert_eq!(s["IDLE0"].1, "mode=off registered=0\n");
    assert_eq!(parse_uptime(&s["UP0"].0), Some(12.5));
    assert_eq!(parse_uptime(&s["UP1"].0), Some(17.52));
    assert_eq!(s["PROG"].1.trim(), "{\"a\":1}");
    assert_eq!(s["IDLE1"].1, "");
    assert_eq!(s["RC"].0, "0");
    assert_eq!(parse_schedstat("123456789 555 42\n"), Some(123456789));
    assert_eq!(parse_schedstat(""), None);
}

/// `pvschedctl idle --json` for VM `bench` with two vCPUs advising 14
/// and 40 µs, and the VM-wide advice when given.
fn idle_json(host_advice: Option<f64>) -> Value {
    let vcpu = |i: u32, w: f64, halts: u64| {
        serde_json::json!({
            "index": i, "observed_s": 10.0,
            "halts": [[12.0, halts], [2048.0, 3]], "wakes": [[30.0, 18]],
            "wake_p50_us": 30.0, "wake_p99_us": 30.0,
            "advice": {"window_us": w, "hit_rate": 0.8, "cpu_share": 0.01},
            "in_force": null
        })
    };
    let mut r = serde_json::json!({
        "budget_permille": 50, "kvm_halt_poll": null,
        "vms": [{"name": "bench", "accel": "tcg",
                 "vcpus": [vcpu(0, 14.0, 10), vcpu(1, 40.0, 20)]}]
    });
    if let Some(w) = host_advice {
        r["host_advice"] = serde_json::json!({"window_us": w, "hit_rate": 0.7, "cpu_share": 0.03});
    }
    r
}

#[test]
fn the_advice_is_the_vm_wide_window_rounded_up() {
    // Act
    let a = parse_advice(&idle_json(Some(25.2)), "bench")
        .unwrap()
        .unwrap();

    // Assert
    assert_eq!(a.window_us, 26);
    assert_eq!(a.window_us_exact, 25.2);
    assert_eq!(a.hit_rate, 0.7);
    assert_eq!(a.per_vcpu_us, vec![14.0, 40.0]);
    assert!(a.source.starts_with("VM-wide"), "{}", a.source);
}

#[test]
fn without_a_vm_wide_window_the_largest_vcpu_window_is_taken() {
    let a = parse_advice(&idle_json(None), "bench").unwrap().unwrap();
    assert_eq!(a.window_us, 40);
    assert!(a.source.contains("largest"), "{}", a.source);
}

#[test]
fn no_halts_means_no_advice_and_an_unknown_vm_is_an_error() {
    let mut r = idle_json(None);
    for v in r["vms"][0]["vcpus"].as_array_mut().unwrap() {
        v["halts"] = serde_json::json!([]);
    }
    assert_eq!(parse_advice(&r, "bench").unwrap(), None);
    assert!(parse_advice(&idle_json(None), "other").is_err());
    assert!(parse_advice(&serde_json::json!({"x": 1}), "bench").is_err());
}

#[test]
fn the_advice_parses_from_what_the_daemon_types_serialize() {
    // Arrange: the control crate's own types, as pvschedctl idle --json prints them.
    let report = pvsched_control::VmIdle {
        name: "bench".into(),
        accel: "tcg".into(),
        vcpus: vec![pvsched_control::VcpuIdle {
            index: 0,
            observed_s: 3.0,
            halts: vec![(12.0, 10)],
            wakes: vec![],
            wake_p50_us: 0.0,
            wake_p99_us: 0.0,
            polled_by_kvm: 0,
            advice: pvsched_control::PollOutcome {
                window_us: 12.0,
                hit_rate: 1.0,
                cpu_share: 0.001,
            },
            in_force: None,
        }],
    };
    let json = serde_json::json!({ "vms": [serde_json::to_value(&report).unwrap()] });

    // Act
    let a = parse_advice(&json, "bench").unwrap().unwrap();

    // Assert
    assert_eq!(a.window_us, 12);
}

#[test]
fn cases_name_their_module_parameters() {
    assert_eq!(
        IdleCase::Default.insmod_params(Some(30)).as_deref(),
        Some("idle=off")
    );
    assert_eq!(
        IdleCase::Advisor.insmod_params(Some(30)).as_deref(),
        Some("idle=fixed idle_poll_us=30")
    );
    assert_eq!(IdleCase::Advisor.insmod_params(None), None);
    assert_eq!(
        IdleCase::Poll1ms.insmod_params(None).as_deref(),
        Some("idle=fixed idle_poll_us=1000")
    );
    assert!(!IdleCase::Poll1ms.sets_kvm_polling());
    for c in IdleCase::ALL {
        assert_eq!(by_name::<IdleCase>(c.name()).unwrap(), c);
        assert_eq!(serde_json::to_value(c).unwrap(), c.name());
    }
    assert!(by_name::<IdleCase>("fixed").is_none());
}

// --- the report from hand-built numbers ---

fn run(w: Workload, per_s: f64, poll_ns: u64, run_s: f64) -> Measurement {
    let count = (per_s * 5.0) as u64;
    Measurement {
        workload: Some(w),
        count,
        per_s,
        latency_p50_us: 1e6 / per_s / 2.0,
        latency_p99_us: 1e6 / per_s * 3.0,
        program: match w {
            Workload::Prodcons => {
                serde_json::json!({"messages": count, "consumer_waits": count / 2})
            }
            Workload::Pingpong => Value::Null,
        },
        guest_window_s: 5.0,
        host_window_s: 5.0,
        vcpu_run_s: vec![run_s, run_s],
        idle: Some(IdleCounters {
            polls: 100,
            poll_hits: 80,
            poll_timeouts: 20,
            poll_ns,
            halts: 20,
            ..Default::default()
        }),
        guest_cpus: 2,
        foreign_cpu: 0.0,
    }
}

fn session(rep: usize, load: Load, case: IdleCase, rate: f64, poll_ns: u64, ops: f64) -> Session {
    Session {
        rep,
        load,
        case,
        params: case.insmod_params(Some(30)).unwrap_or_default(),
        driver: format!("mode={}", case.driver_mode()),
        load_rates: if load == Load::Loaded {
            vec![
                StressorRate {
                    stressor: "cpu".into(),
                    ops_per_s: ops,
                    ..Default::default()
                },
                StressorRate {
                    stressor: "vm".into(),
                    ops_per_s: ops * 2.0,
                    ..Default::default()
                },
            ]
        } else {
            vec![]
        },
        runs: vec![
            run(Workload::Pingpong, rate, poll_ns, 2.5),
            run(Workload::Prodcons, rate * 10.0, poll_ns, 4.0),
        ],
    }
}

/// Idle host: hinted at `gain` x default, polling `poll_ns` per 5 s x 2
/// vCPUs; loaded host: hinted's stress-ng at `host` x default.
fn raw(gain: f64, poll_ns: u64, host: f64) -> MsgRaw {
    let mut sessions = Vec::new();
    for rep in 1..=3 {
        let jitter = rep as f64 * 10.0;
        for load in [Load::Idle, Load::Loaded] {
            sessions.push(session(
                rep,
                load,
                IdleCase::Default,
                1000.0 + jitter,
                0,
                500.0,
            ));
            sessions.push(session(
                rep,
                load,
                IdleCase::Hinted,
                (1000.0 + jitter) * gain,
                poll_ns,
                500.0 * host,
            ));
        }
    }
    MsgRaw {
        scenario: "message-passing".into(),
        meta: MsgMeta {
            base: Meta {
                repeat: 3,
                duration_s: 5,
                load_cmd: "stress-ng --cpu 2".into(),
                ..Default::default()
            },
            budget_permille: 50,
            ..Default::default()
        },
        loads: vec![Load::Idle, Load::Loaded],
        cases: vec![IdleCase::Default, IdleCase::Hinted],
        blocks: (1..=3)
            .map(|rep| Block {
                rep,
                load: Load::Idle,
                advice: Some(Advice {
                    window_us: 20 + rep as u32,
                    ..Default::default()
                }),
                idle_report: None,
                daemon_status: None,
            })
            .collect(),
        sessions,
    }
}

#[test]
fn medians_spreads_and_ratios_come_from_the_repeats() {
    // Act
    let r = build(&raw(1.5, 100_000_000, 1.0));

    // Assert
    let idle = &r.loads[0];
    let pp = &idle.workloads["pingpong"];
    assert_eq!(pp["default"].throughput.median, 1020.0);
    assert_eq!(pp["default"].throughput.min, 1010.0);
    assert_eq!(pp["default"].throughput.max, 1030.0);
    assert_eq!(pp["hinted"].vs_default, Some(1.5));
    // 2.5 s of 5 s on each vCPU.
    assert_eq!(pp["hinted"].host_cpu_pct.median, 50.0);
    // 0.1 s polled over 5 s x 2 vCPUs.
    assert_eq!(pp["hinted"].guest_poll_pct.as_ref().unwrap().median, 1.0);
    assert_eq!(pp["hinted"].counters.unwrap().polls, 300);
    assert_eq!(pp["hinted"].empty_waits_per_msg, None);
    let pc = &idle.workloads["prodcons"]["hinted"];
    assert_eq!(pc.empty_waits_per_msg.as_ref().unwrap().median, 0.5);
    assert_eq!(idle.advisor_window_us, vec![Some(21), Some(22), Some(23)]);
    assert!(idle.host_work.is_empty());
    let loaded = &r.loads[1];
    assert_eq!(loaded.host_work["default"].ops_per_s["vm"], 1000.0);
    assert_eq!(loaded.host_work["hinted"].vs_default, Some(1.0));
}

#[test]
fn targets_are_met_when_hinted_gains_within_budget_and_spares_the_host() {
    // Act: 1.5x, 1 % polling, the host's work unchanged.
    let r = build(&raw(1.5, 100_000_000, 1.0));

    // Assert
    assert_eq!(r.targets.len(), 5);
    for t in &r.targets {
        assert_eq!(t.met, Some(true), "{} {}", t.what, t.verdict());
    }
    assert!(r.targets[0]
        .verdict()
        .starts_with("met (1.50x, at least 1.30x)"));
}

#[test]
fn targets_missed_say_by_how_much() {
    // Act: 1.1x, 10 % polling (1 s of 10 vCPU-s), the host at 90 %.
    let r = build(&raw(1.1, 1_000_000_000, 0.9));

    // Assert
    let t = |what: &str| {
        r.targets
            .iter()
            .find(|t| t.what.contains(what))
            .unwrap_or_else(|| panic!("no target {what}"))
    };
    let thr = t("pingpong throughput");
    assert_eq!(thr.met, Some(false));
    assert!(
        thr.verdict().starts_with("MISSED by 15 %"),
        "{}",
        thr.verdict()
    );
    let poll = t("pingpong: hinted guest poll share");
    assert_eq!((poll.value, poll.met), (Some(10.0), Some(false)));
    assert!(
        poll.verdict().contains("MISSED by 5.0 points"),
        "{}",
        poll.verdict()
    );
    let host = t("bogo-ops");
    assert_eq!((host.value, host.met), (Some(90.0), Some(false)));
    assert!(
        host.verdict().contains("MISSED by 5.0 points"),
        "{}",
        host.verdict()
    );
}

#[test]
fn targets_whose_cases_did_not_run_are_not_measured() {
    // Arrange: only default ran.
    let mut x = raw(1.5, 0, 1.0);
    x.sessions.retain(|s| s.case == IdleCase::Default);
    x.cases = vec![IdleCase::Default];

    // Act
    let r = build(&x);

    // Assert
    assert_eq!(r.targets.len(), 5);
    assert!(r.targets.iter().all(|t| t.met.is_none()));
    assert!(r.targets[0].verdict().starts_with("not measured"));
}

#[test]
fn markdown_shows_each_mode_the_targets_and_the_hosts_work() {
    let md = markdown(&build(&raw(1.5, 100_000_000, 1.0)));
    for needle in [
        "## Targets",
        "| idle | pingpong throughput (round trips/s): hinted >= 1.3 x default | met",
        "## Host idle",
        "Advisor's window W per repeat: 21 µs, 22 µs, 23 µs",
        "### prodcons (msgs/s, latency: enqueue -> dequeue)",
        "| default | 1020 [1010-1030] | 1.00x |",
        "| overload halts | halts | consumer waits per msg |",
        " | 0.500 [0.500-0.500] |",
        "| hinted | 1530 [1515-1545] | 1.50x |",
        "| mode | cpu | vm | vs default (geomean) |",
        "| hinted | 500.0 | 1000.0 | 1.00x |",
    ] {
        assert!(md.contains(needle), "{needle:?} not in\n{md}");
    }
}

#[test]
fn raw_round_trips_through_json() {
    // Arrange
    let r = raw(1.5, 10, 1.0);

    // Act
    let text = serde_json::to_string(&r).unwrap();
    let back: MsgRaw = serde_json::from_str(&text).unwrap();

    // Assert
    assert!(text.contains("\"case\":\"hinted\""));
    assert!(text.contains("\"workload\":\"prodcons\""));
    assert_eq!(back.sessions.len(), r.sessions.len());
    assert_eq!(back.sessions[1].runs[0].idle.unwrap().poll_ns, 10);
}
