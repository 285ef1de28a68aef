//! The module overhead phase: its plan, command and parsing, the QEMU
//! wrapper, the overhead and its interval, the summary and its Markdown.

use std::path::Path;

use super::markdown::*;
use super::model::*;
use super::run::*;
use super::summary::*;
use crate::harness::settings::{ModCostClock, ModCostSettings};

fn run(rep: usize, module: bool, us: f64) -> PipeRun {
    PipeRun {
        rep,
        module,
        usecs_per_op: us,
        vcpu_cpu_us_per_op: Some(us * 0.9),
        publishes: module.then_some(400),
        foreign_cpu: 0.01,
    }
}

fn raw(pairs: &[(f64, f64)]) -> ModCostRaw {
    let mut runs = Vec::new();
    for (i, &(off, on)) in pairs.iter().enumerate() {
        runs.push(run(i + 1, false, off));
        runs.push(run(i + 1, true, on));
    }
    ModCostRaw {
        command: pipe_cmd("perf", 1, 20000),
        loops: 20000,
        guest_cpus: 2,
        accel: "tcg, single-threaded".into(),
        clock: ModCostClock::Icount,
        host_features: "0xf".into(),
        runs,
    }
}

#[test]
fn overhead_is_the_ratio_of_the_medians() {
    // Medians 102 and 100: +2 %.
    let p = overhead_pct(&[101.0, 102.0, 110.0], &[99.0, 100.0, 100.5]).unwrap();
    assert!((p - 2.0).abs() < 1e-9, "{p}");
    assert_eq!(overhead_pct(&[1.0], &[]), None);
    assert_eq!(overhead_pct(&[1.0], &[0.0]), None);
}

#[test]
fn bootstrap_interval_brackets_the_estimate_and_shrinks_to_it_without_spread() {
    let with = [103.0, 104.5, 102.0, 105.0, 103.5, 104.0, 102.5];
    let without = [100.0, 101.0, 99.5, 100.5, 98.5, 101.5, 100.2];
    let p = overhead_pct(&with, &without).unwrap();

    let (lo, hi) = bootstrap_pct(&with, &without, 2000).unwrap();

    assert!(lo <= p && p <= hi, "{lo} <= {p} <= {hi}");
    assert!(
        lo > 0.0,
        "separated samples: the interval excludes 0 ({lo})"
    );
    assert_eq!(bootstrap_pct(&with, &without, 2000), Some((lo, hi)));
    let (lo, hi) = bootstrap_pct(&[103.0; 5], &[100.0; 5], 500).unwrap();
    assert!((lo - 3.0).abs() < 1e-9 && (hi - 3.0).abs() < 1e-9);
    assert_eq!(bootstrap_pct(&[], &[1.0], 10), None);
}

#[test]
fn summary_separates_a_clear_difference_from_noise() {
    // Arrange: +5 % with little spread; then +1 % inside a 10 % spread.
    let clear: Vec<(f64, f64)> = (0..7)
        .map(|i| (100.0 + i as f64 * 0.1, 105.0 + i as f64 * 0.1))
        .collect();
    let noisy: Vec<(f64, f64)> = [(90.0, 101.0), (110.0, 91.0), (100.0, 111.0), (95.0, 96.0)]
        .into_iter()
        .collect();

    // Act
    let a = summarize(&raw(&clear));
    let b = summarize(&raw(&noisy));

    // Assert
    assert_eq!(a.noise, "above the noise");
    assert_eq!(a.met, Some(false));
    assert_eq!(a.with.runs, 7);
    assert!((a.overhead_pct.unwrap() - 500.0 / 100.3).abs() < 1e-6);
    assert_eq!(a.overhead_pct_per_repeat.len(), 7);
    assert!((a.with.publishes_per_op.unwrap() - 0.02).abs() < 1e-12);
    assert_eq!(a.without.publishes_per_op, None);
    assert!((a.with.ops_per_s_median - 1e6 / 105.3).abs() < 1e-6);
    assert_eq!(b.noise, "within the noise");
    assert_eq!(b.without.usecs_per_op_min, 90.0);
    assert_eq!(b.without.usecs_per_op_max, 110.0);
}

#[test]
fn markdown_shows_both_variants_the_interval_and_the_target() {
    let r = summarize(&raw(&[(100.0, 101.0), (100.5, 101.2), (99.8, 100.9)]));
    let mut md = String::new();

    markdown(&mut md, Some(&r));

    for needle in [
        "## Guest module overhead",
        "| without module | 100.00 |",
        "| with pvsched.ko | 101.00 |",
        "Overhead (medians): **+1.0 %**",
        "Target: guest module overhead <= 2 %: met",
    ] {
        assert!(md.contains(needle), "{needle:?} not in\n{md}");
    }
    let mut none = String::new();
    markdown(&mut none, None);
    assert!(none.is_empty());
}

#[test]
fn perf_output_gives_usecs_per_op() {
    let out = "# Running 'sched/pipe' benchmark:\n# Executed 20000 pipe operations between two processes\n\n     Total time: 1.845 [sec]\n\n      92.254650 usecs/op\n          10839 ops/sec\n";
    assert_eq!(parse_usecs_per_op(out).unwrap(), 92.25465);
    assert!(parse_usecs_per_op("perf: command not found").is_err());
}

#[test]
fn the_command_pins_both_tasks_and_fits_the_console() {
    let c = pipe_cmd("perf", 1, 20000);
    assert_eq!(c, "taskset -c 1 perf bench sched pipe -l 20000");
    assert!(c.len() < pvsched_vmtest::MAX_COMMAND_LEN);
}

#[test]
fn plan_counts_two_runs_per_repeat_and_zero_skips() {
    let (phases, secs) = plan(&ModCostSettings::default());
    assert_eq!(phases, 2 * crate::harness::settings::DEFAULT_REPEAT);
    assert!(secs > 0.0);
    assert_eq!(
        plan(&ModCostSettings {
            repeat: 0,
            loops: 1000,
            clock: ModCostClock::Host,
        }),
        (0, 0.0)
    );
}

#[test]
fn raw_json_without_the_phase_still_reads_and_with_it_round_trips() {
    // Arrange: a raw.json as written before the phase existed.
    let mut file = crate::scenarios::standard::model::RawFile {
        meta: Default::default(),
        loads: vec![],
        intervals: vec![],
        modes: vec![],
        results: Default::default(),
        modcost: None,
        simulated: None,
    };
    let old = serde_json::to_string(&file).unwrap();
    assert!(!old.contains("modcost"));

    // Act
    let back: crate::scenarios::standard::model::RawFile = serde_json::from_str(&old).unwrap();
    file.modcost = Some(raw(&[(100.0, 101.0)]));
    let new: crate::scenarios::standard::model::RawFile =
        serde_json::from_str(&serde_json::to_string(&file).unwrap()).unwrap();

    // Assert
    assert!(back.modcost.is_none());
    assert_eq!(new.modcost, file.modcost);
}

/// Runs the wrapper with `echo` as QEMU and returns the arguments QEMU got.
fn args_through_wrapper(icount: bool) -> String {
    let dir = std::env::temp_dir().join(format!(
        "pvsched-bench-wrapper-{}-{icount}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("qemu.sh");
    std::fs::write(&script, single_tcg_script(Path::new("/bin/echo"), icount)).unwrap();
    let out = std::process::Command::new("sh")
        .arg(&script)
        .args(["-accel", "tcg", "-cpu", "max", "-append", "a b"])
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .trim_end()
        .to_string()
}

#[test]
fn the_wrapper_runs_single_threaded_tcg_and_adds_icount_only_when_asked() {
    assert_eq!(
        args_through_wrapper(false),
        "-accel tcg,thread=single -cpu max -append a b"
    );
    assert_eq!(
        args_through_wrapper(true),
        "-accel tcg,thread=single -cpu max -append a b -icount shift=0,sleep=off"
    );
}

#[test]
fn raw_files_from_before_icount_read_as_the_host_clock() {
    let mut v = serde_json::to_value(raw(&[(100.0, 101.0)])).unwrap();
    v.as_object_mut().unwrap().remove("clock");

    let back: ModCostRaw = serde_json::from_value(v).unwrap();

    assert_eq!(back.clock, ModCostClock::Host);
    assert!(summarize(&back).clock == ModCostClock::Host);
    let mut md = String::new();
    markdown(&mut md, Some(&summarize(&raw(&[(100.0, 101.0)]))));
    assert!(md.contains("1 ns per guest instruction"), "{md}");
}
