//! The message-passing scenario's report: per load, workload and idle case
//! the figures over the repeats, the host's own work, and the targets with
//! their verdicts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::model::*;
use crate::guest_idle::*;
use crate::harness::figures::Spread;

/// Smallest `hinted / default` throughput ratio the idle-host target allows.
pub const THROUGHPUT_TARGET: f64 = 1.3;

/// Smallest share of `default`'s host bogo-ops/s `hinted` may leave on the
/// loaded host.
pub const HOST_WORK_TARGET: f64 = 0.95;

/// One workload under one case, over the repeats.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CaseStats {
    pub repeats: usize,
    /// Round trips/s or msgs/s.
    pub throughput: Spread,
    /// Median throughput / `default`'s median throughput (same load).
    pub vs_default: Option<f64>,
    pub latency_p50_us: Spread,
    pub latency_p99_us: Spread,
    /// Host CPU of the vCPU threads, percent of one core per vCPU.
    pub host_cpu_pct: Spread,
    /// Guest polling time, percent of the vCPUs' time (None: no idle driver).
    pub guest_poll_pct: Option<Spread>,
    /// The idle driver's counters, summed over the repeats.
    pub counters: Option<IdleCounters>,
    /// prodcons: the times the consumer found the queue empty, per message
    /// (near 1: every message a wakeup; near 1/64: batches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_waits_per_msg: Option<Spread>,
}

/// stress-ng's bogo-ops/s under one case, over the repeats.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostWork {
    /// Median per stressor.
    pub ops_per_s: BTreeMap<String, f64>,
    /// Geometric mean over the stressors of (median / `default`'s median).
    pub vs_default: Option<f64>,
}

/// One load's results.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    pub load: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_cmd: Option<String>,
    /// The advisor's window per repeat, µs (None: no advice that repeat).
    pub advisor_window_us: Vec<Option<u32>>,
    /// workload -> case -> figures.
    pub workloads: BTreeMap<String, BTreeMap<String, CaseStats>>,
    /// case -> host throughput (loaded host).
    pub host_work: BTreeMap<String, HostWork>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MsgTarget {
    pub load: String,
    pub what: String,
    /// None: a case it needs did not run.
    pub value: Option<f64>,
    pub limit: f64,
    /// "x" (a ratio) or "%".
    pub unit: String,
    /// Whether the value must be at least (else at most) the limit.
    pub at_least: bool,
    pub met: Option<bool>,
}

impl MsgTarget {
    pub(super) fn new(
        load: &str,
        what: String,
        value: Option<f64>,
        limit: f64,
        unit: &str,
        at_least: bool,
    ) -> Self {
        MsgTarget {
            load: load.to_string(),
            what,
            value,
            limit,
            unit: unit.to_string(),
            at_least,
            met: value.map(|v| {
                if at_least {
                    v >= limit - 1e-9
                } else {
                    v <= limit + 1e-9
                }
            }),
        }
    }

    pub fn verdict(&self) -> String {
        let v = |x: f64| {
            if self.unit == "x" {
                format!("{x:.2}x")
            } else {
                format!("{x:.1} %")
            }
        };
        let bound = if self.at_least { "at least" } else { "at most" };
        match (self.value, self.met) {
            (Some(x), Some(true)) => format!("met ({}, {bound} {})", v(x), v(self.limit)),
            (Some(x), _) => {
                let by = if self.unit == "x" {
                    format!("{:.0} %", ((x / self.limit) - 1.0).abs() * 100.0)
                } else {
                    format!("{:.1} points", (x - self.limit).abs())
                };
                format!("MISSED by {by} ({}, {bound} {})", v(x), v(self.limit))
            }
            (None, _) => "not measured (a case it compares did not run)".into(),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MsgReport {
    pub schema: String,
    pub meta: MsgMeta,
    pub loads: Vec<LoadReport>,
    pub targets: Vec<MsgTarget>,
    /// PNG files, relative to the output directory.
    pub plots: Vec<String>,
}

/// What the tables' columns mean.
pub const DEFINITIONS: [&str; 4] = [
    "Throughput: the program's own count over its own run time (pingpong: round trips/s; \
     prodcons: messages dequeued/s).",
    "Host CPU % per vCPU: the run time of the VM's vCPU threads \
     (/proc/<qemu>/task/<tid>/schedstat) over the measurement, summed, / (host wall time x \
     vCPUs): what the guest's polling costs the host; 100 % = every vCPU thread on a core the \
     whole time.",
    "Guest poll %: the idle driver's poll_ns over the measurement (debugfs idle, every CPU) / \
     (guest wall time x vCPUs): the share the budget bounds.",
    "polls, poll hits, poll timeouts, overload halts, halts: the idle driver's counters \
     (differences around each measurement), summed over the CPUs and the repeats.",
];
