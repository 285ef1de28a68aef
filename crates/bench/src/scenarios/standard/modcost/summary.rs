//! The module overhead phase's summary: each variant's µs/op over the
//! runs, the overhead of the medians with its bootstrap interval, against
//! the target.

use serde::{Deserialize, Serialize};

use super::model::*;
use crate::harness::disturbance::DISTURBED;
use crate::harness::settings::ModCostClock;
use crate::stats::{median, quantile};

/// The target: the module may cost at most this much, percent of
/// the median time per operation.
pub const TARGET_PCT: f64 = 2.0;

/// Bootstrap resamples of the overhead's interval.
const RESAMPLES: usize = 4000;

/// One variant's figures over its runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    pub runs: usize,
    pub usecs_per_op_median: f64,
    pub ops_per_s_median: f64,
    pub usecs_per_op_min: f64,
    pub usecs_per_op_max: f64,
    /// Interquartile range: first and third quartiles.
    pub usecs_per_op_q1: f64,
    pub usecs_per_op_q3: f64,
    /// In run order.
    pub usecs_per_op_per_repeat: Vec<f64>,
    /// Median of the vCPU threads' host CPU time per operation (whole
    /// command, perf's start and exit included).
    pub vcpu_cpu_us_per_op_median: Option<f64>,
    /// Median publishes per operation (with the module).
    pub publishes_per_op: Option<f64>,
    /// Runs during which others took more than 10 % of the machine.
    pub disturbed_runs: usize,
}

/// The report's section.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModCostReport {
    pub command: String,
    pub loops: u32,
    pub guest_cpus: u32,
    pub accel: String,
    /// The clock of µs/op (reports before icount: host).
    #[serde(default = "host_clock")]
    pub clock: ModCostClock,
    pub host_features: String,
    pub without: Variant,
    pub with: Variant,
    /// median usecs/op with / median without - 1, percent.
    pub overhead_pct: Option<f64>,
    /// 95 % bootstrap interval of that (each variant's runs resampled).
    pub overhead_low_pct: Option<f64>,
    pub overhead_high_pct: Option<f64>,
    /// Per repeat (with / without of the same repeat - 1), percent.
    pub overhead_pct_per_repeat: Vec<f64>,
    /// The same from the vCPU threads' host CPU time per operation.
    pub vcpu_cpu_overhead_pct: Option<f64>,
    /// "above the noise" when the interval excludes 0, else "within the noise".
    pub noise: String,
    pub target_pct: f64,
    /// overhead_pct <= target_pct.
    pub met: Option<bool>,
}

/// (median(a) / median(b) - 1) x 100.
pub fn overhead_pct(with: &[f64], without: &[f64]) -> Option<f64> {
    let (a, b) = (median(with)?, median(without)?);
    (b > 0.0).then(|| (a / b - 1.0) * 100.0)
}

/// A 95 % percentile-bootstrap interval of [`overhead_pct`]: each variant's
/// values resampled with replacement, `resamples` times, from a fixed seed
/// (the same data give the same interval).
pub fn bootstrap_pct(with: &[f64], without: &[f64], resamples: usize) -> Option<(f64, f64)> {
    if with.is_empty() || without.is_empty() || resamples == 0 {
        return None;
    }
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    };
    let mut stats = Vec::with_capacity(resamples);
    let (mut a, mut b) = (vec![0.0; with.len()], vec![0.0; without.len()]);
    for _ in 0..resamples {
        for x in a.iter_mut() {
            *x = with[next(with.len())];
        }
        for x in b.iter_mut() {
            *x = without[next(without.len())];
        }
        if let Some(p) = overhead_pct(&a, &b) {
            stats.push(p);
        }
    }
    Some((quantile(&stats, 0.025)?, quantile(&stats, 0.975)?))
}

fn variant(runs: &[&PipeRun], loops: u32) -> Variant {
    let us: Vec<f64> = runs.iter().map(|r| r.usecs_per_op).collect();
    let cpu: Vec<f64> = runs.iter().filter_map(|r| r.vcpu_cpu_us_per_op).collect();
    let publ: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.publishes)
        .map(|p| p as f64 / f64::from(loops.max(1)))
        .collect();
    let med = median(&us).unwrap_or(0.0);
    Variant {
        runs: runs.len(),
        usecs_per_op_median: med,
        ops_per_s_median: if med > 0.0 { 1e6 / med } else { 0.0 },
        usecs_per_op_min: us.iter().copied().fold(f64::INFINITY, f64::min),
        usecs_per_op_max: us.iter().copied().fold(0.0, f64::max),
        usecs_per_op_q1: quantile(&us, 0.25).unwrap_or(0.0),
        usecs_per_op_q3: quantile(&us, 0.75).unwrap_or(0.0),
        usecs_per_op_per_repeat: us,
        vcpu_cpu_us_per_op_median: median(&cpu),
        publishes_per_op: median(&publ),
        disturbed_runs: runs.iter().filter(|r| r.foreign_cpu > DISTURBED).count(),
    }
}

/// The report's figures from the raw runs.
pub fn summarize(raw: &ModCostRaw) -> ModCostReport {
    let pick = |m: bool| -> Vec<&PipeRun> { raw.runs.iter().filter(|r| r.module == m).collect() };
    let (on, off) = (pick(true), pick(false));
    let us = |v: &[&PipeRun]| v.iter().map(|r| r.usecs_per_op).collect::<Vec<_>>();
    let cpu = |v: &[&PipeRun]| {
        v.iter()
            .filter_map(|r| r.vcpu_cpu_us_per_op)
            .collect::<Vec<_>>()
    };
    let (a, b) = (us(&on), us(&off));
    let overhead = overhead_pct(&a, &b);
    let interval = bootstrap_pct(&a, &b, RESAMPLES);
    let mut per_repeat = Vec::new();
    for r in &on {
        if let Some(w) = off.iter().find(|x| x.rep == r.rep) {
            per_repeat.push((r.usecs_per_op / w.usecs_per_op - 1.0) * 100.0);
        }
    }
    let noise = match interval {
        Some((lo, hi)) if lo > 0.0 || hi < 0.0 => "above the noise",
        Some(_) => "within the noise",
        None => "not measured",
    };
    ModCostReport {
        command: raw.command.clone(),
        loops: raw.loops,
        guest_cpus: raw.guest_cpus,
        accel: raw.accel.clone(),
        clock: raw.clock,
        host_features: raw.host_features.clone(),
        without: variant(&off, raw.loops),
        with: variant(&on, raw.loops),
        overhead_pct: overhead,
        overhead_low_pct: interval.map(|i| i.0),
        overhead_high_pct: interval.map(|i| i.1),
        overhead_pct_per_repeat: per_repeat,
        vcpu_cpu_overhead_pct: overhead_pct(&cpu(&on), &cpu(&off)),
        noise: noise.into(),
        target_pct: TARGET_PCT,
        met: overhead.map(|p| p <= TARGET_PCT),
    }
}
