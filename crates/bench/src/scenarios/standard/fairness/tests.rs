//! The fairness tables' arithmetic (a phase's CPU time pooled, the
//! entitlement), their sentences, and an old raw.json without the counters.

use super::super::model::*;
use super::super::report::*;
use super::super::share::CpuUse;
use super::analysis::*;
use super::markdown::*;
use crate::harness::axes::{Load, Mode};

/// A phase of 10 s on 2 CPUs: VM `vm` CPU-s of which each vCPU `vcpu`,
/// the load `load`, one `--cpu` worker `hog`, pvschedd's `boosted`
/// (and, when boosted, 0.4 CPU-s of pvschedd's own).
fn phase(vm: f64, vcpu: f64, load: f64, hog: f64, boosted: Option<f64>) -> CpuUse {
    CpuUse {
        wall_s: 10.0,
        host_cpus: 2,
        vm_s: vm,
        vcpu_s: vec![vcpu, vcpu],
        load_s: Some(load),
        hog_s: vec![hog, hog],
        busy_s: 19.0,
        boosted_s: boosted,
        boost_budget_permille: boosted.map(|_| 200),
        daemon_s: boosted.map(|_| 0.4),
        daemon_threads_s: match boosted {
            Some(_) => [("pvschedd".into(), 0.3), ("pvsched-discove".into(), 0.1)].into(),
            None => Default::default(),
        },
        // pvsched (boosted) polls 1 s of the 20 in the guest's idle driver.
        guest_poll_s: Some(if boosted.is_some() { 1.0 } else { 0.0 }),
        guest_idle: Some(
            if boosted.is_some() {
                "hinted"
            } else {
                "none (auto)"
            }
            .into(),
        ),
    }
}

fn add(r: &mut Results, mode: Mode, rep: usize, u: CpuUse) {
    r.latency
        .entry((Load::Loaded, 1000, mode))
        .or_default()
        .push(LatencyRun {
            rep,
            cpu: Some(u),
            ..Default::default()
        });
}

fn scenario(throughput: &[(Mode, f64)]) -> Scenario {
    Scenario {
        load: "loaded".into(),
        modes: throughput
            .iter()
            .map(|&(m, t)| {
                (
                    m.name().to_string(),
                    ModeReport {
                        host_load: Some(HostLoad {
                            vs_vanilla: Some(t),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                )
            })
            .collect(),
        ..Default::default()
    }
}

/// vanilla: VM 4 CPU-s of 20 (20 %), vCPUs 1.5 + 1.5, hogs at 0.3 CPUs;
/// static-rt: vCPUs 4 + 4 (demand 0.4 CPUs each); pvsched: two repeats.
fn sample(pv_vcpu: [f64; 2]) -> Vec<LoadShare> {
    let mut r = Results::default();
    add(&mut r, Mode::Vanilla, 1, phase(4.0, 1.5, 12.0, 3.0, None));
    add(&mut r, Mode::StaticRt, 1, phase(9.0, 4.0, 8.0, 2.0, None));
    for (rep, v) in pv_vcpu.into_iter().enumerate() {
        add(
            &mut r,
            Mode::Pvsched,
            rep + 1,
            phase(2.0 * v + 1.0, v, 10.0, 2.5, Some(3.0)),
        );
    }
    build(
        &r,
        &[Load::Idle, Load::Loaded],
        &Mode::ALL,
        &[scenario(&[
            (Mode::Vanilla, 1.0),
            (Mode::StaticRt, 0.7),
            (Mode::Pvsched, 0.9),
        ])],
    )
}

#[test]
fn shares_ratios_and_the_entitlement_are_computed_from_the_phases() {
    // Act: pvsched's vCPUs at 2.0 and 2.5 CPU-s per thread per repeat.
    let t = sample([2.0, 2.5]);

    // Assert: the idle load had no phases: no table.
    assert_eq!(t.len(), 1);
    let ls = &t[0];
    assert_eq!((ls.load.as_str(), ls.host_cpus, ls.vcpus), ("loaded", 2, 2));
    // r = 3 CPU-s / 10 s = 0.3 CPUs; d = 0.4 each: sum of min = 0.6 of 2 CPUs.
    let e = ls.entitlement.as_ref().unwrap();
    assert_eq!(e.fair_rate_cpus, 0.3);
    assert_eq!(e.demand_cpus, Some(vec![0.4, 0.4]));
    assert!(!e.upper_bound);
    assert_eq!(e.pct, 30.0);
    let van = &ls.modes["vanilla"];
    assert_eq!(van.vm_pct, 20.0);
    assert_eq!(van.vcpu_pct, 15.0);
    assert_eq!(van.vm_vs_vanilla, Some(1.0));
    assert_eq!(van.vcpu_vs_entitlement, Some(0.5));
    assert_eq!(van.load_pct, Some(60.0));
    assert_eq!(van.busy_pct, 95.0);
    let pv = &ls.modes["pvsched"];
    // Repeats: VM 5 and 6 CPU-s of 20; pooled 11 of 40.
    assert_eq!(pv.vm_pct_per_repeat, vec![25.0, 30.0]);
    assert_eq!(pv.vm_pct, 27.5);
    assert_eq!(pv.vcpu_pct_per_repeat, vec![20.0, 25.0]);
    assert_eq!(pv.vm_vs_vanilla, Some(1.375));
    assert_eq!(pv.vcpu_vs_entitlement, Some(0.75));
    // 6 boosted vCPU-s of 2 x 10 s x 2 vCPUs.
    assert_eq!(pv.boosted_pct, Some(15.0));
    assert_eq!(pv.boost_budget_pct, Some(20.0));
    assert_eq!(pv.load_pct, Some(50.0));
    assert_eq!(pv.load_cpu_vs_vanilla, Some(0.833));
    assert_eq!(pv.load_throughput_vs_vanilla, Some(0.9));
    assert_eq!(pv.phases, 2);
    // pvschedd: 0.4 CPU-s of 20 per phase, 0.3 of them its event thread.
    assert_eq!(pv.daemon_pct, Some(2.0));
    let by_thread: Vec<(&str, f64)> = pv
        .daemon_threads_pct
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(by_thread, vec![("pvsched-discove", 0.5), ("pvschedd", 1.5)]);
    assert_eq!(ls.modes["static-rt"].boosted_pct, None);
    assert!(ls.modes["static-rt"].daemon_threads_pct.is_empty());
}

#[test]
fn the_reading_says_within_or_above_the_entitlement_from_the_numbers() {
    // Within: 20 % and 25 % against 30 %.
    let within = sample([2.0, 2.5]).remove(0).reading.join(" ");
    for needle in [
        "Under pvsched the VM used 27.5 % of the machine (22.5 % in its vCPU threads), 1.38x its share under vanilla (20.0 %); under static-rt 45.0 %.",
        "is 30.0 % of the machine: under pvsched they got 22.5 % (0.75x of it), within it in every repeat; under vanilla 0.50x.",
        "boosted 15.0 % of their vCPU time (budget 20 %)",
        "the guest's idle driver (hinted) polled 5.0 % of the machine (vanilla 0.0 %, static-rt 0.0 %)",
        "kept 90.0 % of its vanilla throughput under pvsched (70.0 % under static-rt)",
        "went from 60.0 % under vanilla to 50.0 %, the VM's from 20.0 % to 27.5 %",
        "no more than its fair-class share",
    ] {
        assert!(within.contains(needle), "{needle:?} not in {within}");
    }

    // Above in every repeat: 35 % and 40 %; mixed: 20 % and 40 %.
    let above = sample([3.5, 4.0]).remove(0).reading.join(" ");
    assert!(
        above.contains("above it in every repeat (+7.5 points pooled)"),
        "{above}"
    );
    assert!(
        above.contains("more than its fair-class share, 7.5 points"),
        "{above}"
    );
    let mixed = sample([2.0, 4.0]).remove(0).reading.join(" ");
    assert!(mixed.contains("above it in 1 of 2 repeats"), "{mixed}");
    assert!(mixed.contains("about its fair-class share"), "{mixed}");
}

#[test]
fn without_static_rt_the_entitlement_is_an_upper_bound_and_without_vanilla_none() {
    // Arrange
    let mut r = Results::default();
    add(&mut r, Mode::Vanilla, 1, phase(4.0, 1.5, 12.0, 3.0, None));
    add(
        &mut r,
        Mode::Pvsched,
        1,
        phase(5.0, 2.0, 10.0, 2.5, Some(3.0)),
    );

    // Act
    let t = build(&r, &[Load::Loaded], &Mode::ALL, &[]);
    r.latency.remove(&(Load::Loaded, 1000, Mode::Vanilla));
    let none = build(&r, &[Load::Loaded], &Mode::ALL, &[]);

    // Assert: 2 vCPUs x 0.3 CPUs of 2 CPUs.
    let e = t[0].entitlement.as_ref().unwrap();
    assert!(e.upper_bound);
    assert_eq!(e.pct, 30.0);
    assert!(t[0].reading.join(" ").contains("an upper bound"));
    assert!(none[0].entitlement.is_none());
    assert!(none[0].reading[0].contains("vanilla did not run"));
}

#[test]
fn on_the_idle_host_a_share_above_the_demand_is_read_as_the_guest_using_more() {
    // Arrange: static-rt's vCPUs 1 CPU-s each in 10 s (10 % of 2 CPUs),
    // pvsched's 2 each (20 %); no host load.
    let mut r = Results::default();
    for (mode, vcpu) in [
        (Mode::Vanilla, 1.0),
        (Mode::StaticRt, 1.0),
        (Mode::Pvsched, 2.0),
    ] {
        let mut u = phase(2.0 * vcpu, vcpu, 0.0, 0.0, None);
        (u.load_s, u.hog_s) = (None, Vec::new());
        r.latency
            .entry((Load::Idle, 1000, mode))
            .or_default()
            .push(LatencyRun {
                rep: 1,
                cpu: Some(u),
                ..Default::default()
            });
    }

    // Act
    let t = build(&r, &[Load::Idle], &Mode::ALL, &[]);

    // Assert
    let text = t[0].reading.join(" ");
    assert_eq!(t[0].entitlement.as_ref().unwrap().pct, 10.0);
    assert!(
        text.contains("above it in every repeat (+10.0 points pooled)"),
        "{text}"
    );
    assert!(text.contains("nobody waited for"), "{text}");
    assert!(!text.contains("host load"), "{text}");
    assert_eq!(t[0].modes["pvsched"].load_pct, None);
}

#[test]
fn the_idle_host_entitles_the_vcpus_to_their_demand() {
    let p = Pool {
        wall: 10.0,
        vcpu_each: vec![3.0, 1.0],
        ..Default::default()
    };
    let e = entitlement(Load::Idle, None, Some(&p), 2, 2).unwrap();
    assert_eq!(e.fair_rate_cpus, 1.0);
    assert_eq!(e.pct, 20.0);
}

#[test]
fn a_raw_json_from_before_the_shares_reads_and_has_no_table() {
    // Arrange: a phase as raw.json kept it before `cpu` existed.
    let mut before = Results::default();
    before
        .latency
        .entry((Load::Loaded, 1000, Mode::Vanilla))
        .or_default()
        .push(LatencyRun::default());
    let mut old = serde_json::to_value(&before).unwrap();
    let entry = &mut old["latency"]["loaded/1000/vanilla"][0];
    assert!(entry.as_object_mut().unwrap().remove("cpu").is_none());
    assert!(entry["guest_expected"].is_number());

    // Act
    let r: Results = serde_json::from_value(old).unwrap();
    let t = build(&r, &[Load::Loaded], &Mode::ALL, &[]);

    // Assert
    assert!(r.latency[&(Load::Loaded, 1000, Mode::Vanilla)][0]
        .cpu
        .is_none());
    assert!(t.is_empty());
    let mut with = Results::default();
    add(
        &mut with,
        Mode::Vanilla,
        1,
        phase(4.0, 1.5, 12.0, 3.0, None),
    );
    let text = serde_json::to_string(&with).unwrap();
    let back: Results = serde_json::from_str(&text).unwrap();
    assert_eq!(
        back.latency[&(Load::Loaded, 1000, Mode::Vanilla)][0].cpu,
        with.latency[&(Load::Loaded, 1000, Mode::Vanilla)][0].cpu
    );
}

#[test]
fn markdown_has_a_table_per_load_and_nothing_without_shares() {
    // Act
    let mut md = String::new();
    markdown(&mut md, &sample([2.0, 2.5]));
    let mut empty = String::new();
    markdown(&mut empty, &[]);

    // Assert
    for needle in [
        "## Eventual fairness",
        "### loaded host (2 CPUs, 2 vCPUs)",
        "| vanilla | 20.0 | 20.0 (15.0 + 5.0) | 1.00x | 0.50x |  | 0.0 (none (auto)) | 60.0 | 1.00x | 100.0 % |  | 95.0 |",
        "| pvsched | 25.0, 30.0 | 27.5 (22.5 + 5.0) | 1.38x | 0.75x | 15.0 (20) | 5.0 (hinted) | 50.0 | 0.83x | 90.0 % | 2.00 | 95.0 |",
        "pvschedd % by thread, pvsched: pvsched-discove 0.50, pvschedd 1.50 (",
        "r = 0.300 CPUs, from stress-ng's --cpu workers under vanilla; d = [0.400, 0.400] CPUs",
    ] {
        assert!(md.contains(needle), "{needle:?} not in\n{md}");
    }
    assert!(empty.is_empty());
}
