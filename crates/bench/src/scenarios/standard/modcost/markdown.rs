//! The module overhead phase's part of report.md.

use super::summary::*;

/// The Markdown section (nothing without the phase).
pub fn markdown(o: &mut String, r: Option<&ModCostReport>) {
    use std::fmt::Write as _;
    let Some(r) = r else {
        return;
    };
    let _ = writeln!(
        o,
        "\n## Guest module overhead: `perf bench sched pipe` in the guest\n"
    );
    let _ = writeln!(
        o,
        "`{}` in a {}-vCPU guest of its own ({}; booted after the sessions, idle host, \
         no pvschedd), pvsched.ko loaded and bound to a region the bench initialised \
         (features {}) against the same guest without it (`insmod` / `rmmod` between \
         runs, order rotated per repeat, a warm-up run after each); {} + {} runs. \
         µs/op is {}. Lower is better.\n",
        r.command,
        r.guest_cpus,
        r.accel,
        r.host_features,
        r.without.runs,
        r.with.runs,
        r.clock.unit()
    );
    let _ = writeln!(
        o,
        "| variant | µs/op median | ops/s median | min .. max | IQR | vCPU host CPU µs/op | publishes/op | disturbed runs |"
    );
    let _ = writeln!(o, "|---|--:|--:|---|---|--:|--:|--:|");
    for (name, v) in [("without module", &r.without), ("with pvsched.ko", &r.with)] {
        let _ = writeln!(
            o,
            "| {name} | {:.2} | {:.0} | {:.2} .. {:.2} | {:.2} .. {:.2} | {} | {} | {} |",
            v.usecs_per_op_median,
            v.ops_per_s_median,
            v.usecs_per_op_min,
            v.usecs_per_op_max,
            v.usecs_per_op_q1,
            v.usecs_per_op_q3,
            v.vcpu_cpu_us_per_op_median
                .map(|c| format!("{c:.2}"))
                .unwrap_or_else(|| "n/a".into()),
            v.publishes_per_op
                .map(|p| format!("{p:.3}"))
                .unwrap_or_else(|| "".into()),
            v.disturbed_runs
        );
    }
    let pct = |p: Option<f64>| p.map_or("n/a".to_string(), |p| format!("{p:+.1} %"));
    let _ = writeln!(
        o,
        "\nOverhead (medians): **{}**, 95 % bootstrap interval {} .. {}: {}. \
         Per repeat: {}. From the vCPU threads' host CPU time: {}.",
        pct(r.overhead_pct),
        pct(r.overhead_low_pct),
        pct(r.overhead_high_pct),
        r.noise,
        r.overhead_pct_per_repeat
            .iter()
            .map(|p| format!("{p:+.1}"))
            .collect::<Vec<_>>()
            .join(", "),
        pct(r.vcpu_cpu_overhead_pct)
    );
    let verdict = match (r.met, r.overhead_high_pct) {
        (Some(true), Some(hi)) if hi <= r.target_pct => {
            "met, and the interval lies below it".to_string()
        }
        (Some(true), _) => "met (the median; the interval reaches above it)".to_string(),
        (Some(false), _) => "MISSED".to_string(),
        (None, _) => "not measured".to_string(),
    };
    let _ = writeln!(
        o,
        "\nTarget: guest module overhead <= {:.0} %: {verdict}.",
        r.target_pct
    );
}
