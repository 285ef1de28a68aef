//! The lock-holder scenario's report: per case and mode the VMs' throughput
//! and counters over the repeats, the ratios to vanilla, the avoided holder
//! preemptions, and the targets with their verdicts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::model::*;
use crate::harness::figures::Spread;

/// Target: summed throughput, pvsched-lock (sched_ext runs:
/// pvsched-scx-lock) / vanilla, overcommitted.
pub const SPEEDUP_TARGET: f64 = 1.2;

/// Target (issue 33, sched_ext runs): `lock-a`'s throughput alone,
/// pvsched-scx-lock / vanilla: lock handling costs a VM alone nothing.
pub const ALONE_TARGET: f64 = 1.0;

/// Target: holder preemptions avoided, percent.
pub const AVOIDED_TARGET_PCT: f64 = 85.0;

/// Target: largest deviation of a VM's CPU time from an equal split, percent
/// of the equal split.
pub const SPLIT_TARGET_PCT: f64 = 5.0;

/// One VM under one (case, mode), over the repeats.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VmSummary {
    pub name: String,
    pub ran: bool,
    /// Repeats with a lockstress result.
    pub results: usize,
    /// ops/s over the repeats that ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops_per_s: Option<Spread>,
    /// Slowest thread's ops / fastest thread's, median over the repeats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_evenness: Option<f64>,
    /// CPU-seconds per window.
    pub cpu_s: Spread,
    /// Its QEMU's CPU time, percent of the machine.
    pub cpu_pct_of_machine: Spread,
    /// Its share of the VMs' CPU time, percent.
    pub cpu_split_pct: Spread,
    /// Guest lock counters summed over the repeats (those with F_LOCK_WAIT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_locks: Option<GuestLocks>,
    /// Repeats whose guest counters could be read.
    pub guest_locks_repeats: usize,
    /// Guest contentions per second of window (those repeats).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contentions_per_s: Option<f64>,
    /// Holder-preempted per contention, percent, over the summed counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_pct: Option<f64>,
    /// Kernel `contention_begin` events summed over the repeats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_contentions: Option<u64>,
    /// The guest module's lock lists summed over the repeats (None: none
    /// listed a lock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_held: Option<GuestHeld>,
    /// pvschedd's counters summed over the repeats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon: Option<DaemonLocks>,
    /// The sched_ext scheduler's slice-end extensions summed over the
    /// repeats (None: none kept, as in runs from before they were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scx_extensions: Option<ScxExtensions>,
}

/// One (case, mode) over the repeats.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModeSummary {
    pub repeats: usize,
    /// Summed ops/s of the VMs that ran the workload, per repeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_ops_per_s: Option<Spread>,
    /// Largest deviation of a VM's CPU time from the equal split, percent,
    /// per repeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_deviation_pct: Option<Spread>,
    /// Operations per CPU-second of the VMs that ran the workload, per
    /// repeat ([`Phase::ops_per_cpu_s`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops_per_cpu_s: Option<Spread>,
    pub vms: Vec<VmSummary>,
    pub other_load_pct_per_repeat: Vec<f64>,
    /// Where the machine went, per repeat: busy, the VMs' QEMU processes
    /// and pvschedd, percent of the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_busy_pct: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vms_pct: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon_pct: Option<Spread>,
    /// pvschedd's counters per second of window, pooled over the repeats.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub daemon_per_s: BTreeMap<String, f64>,
    /// KVM's vCPU preemptions summed over the repeats that sampled them:
    /// reported to the guests (the steal-time flag their holder counts
    /// read) and not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kvm_preemptions: Option<KvmPreemptions>,
}

/// A throughput ratio, one mode over vanilla, paired by repeat.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Ratio {
    /// A VM's name, or `both` (the sum).
    pub vm: String,
    pub mode: String,
    pub vs: String,
    pub ratio: Spread,
}

/// The share of holder preemptions avoided on one backend, whole run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Avoided {
    /// The backend whose pair of modes this compares
    /// ([`LockBackend::lock_pair`]). Absent from the JSON for rt, as in
    /// reports from before the sched_ext modes (which all compared rt).
    #[serde(default, skip_serializing_if = "LockBackend::is_rt")]
    pub backend: LockBackend,
    /// Compares the backend's mode with lock handling against vanilla
    /// instead of against its mode without: what pvsched as a whole avoids.
    /// Only where vanilla's guests count their holders' preemptions
    /// ([`LocksReport::vanilla_counts_holders`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub against_vanilla: bool,
    /// A VM's name, or `both`.
    pub vm: String,
    /// The counters without lock handling (pvsched-nolock,
    /// pvsched-scx-nolock, or vanilla), summed over the repeats.
    pub without: GuestLocks,
    /// With it (pvsched-lock, pvsched-scx-lock).
    pub with: GuestLocks,
    /// Holder-preempted per contention, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub without_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub with_pct: Option<f64>,
    /// 1 - with / without, percent (None: no contention or no holder
    /// preempted without lock handling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avoided_pct: Option<f64>,
    /// The same three of the named holders' counters alone
    /// ([`GuestLocks::named`]; None before ABI 1.7's guests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub named_without_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub named_with_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub named_avoided_pct: Option<f64>,
}

/// Vanilla's work per CPU-second alone and overcommitted, from one run.
/// Both VMs get their CPU time in the overcommitted case whatever the mode
/// (the machine is full and the split even), so lock handling can raise
/// their throughput only by raising the work they do per CPU-second: at the
/// alone case's rate they would do `alone / overcommitted` of vanilla's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Efficiency {
    /// Median ops per CPU-second, vanilla, alone.
    pub alone: f64,
    /// The same, overcommitted (both VMs).
    pub overcommitted: f64,
    /// alone / overcommitted.
    pub alone_over_overcommitted: f64,
}

/// One case of the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CaseReport {
    pub case: String,
    pub modes: BTreeMap<String, ModeSummary>,
    pub ratios: Vec<Ratio>,
    pub avoided: Vec<Avoided>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LockTarget {
    pub what: String,
    /// None: not measured (`why`).
    pub value: Option<f64>,
    pub limit: f64,
    /// "x" (at least), "%>=" (at least), "%<=" (at most).
    pub unit: String,
    pub met: Option<bool>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why: String,
}

impl LockTarget {
    pub fn verdict(&self) -> String {
        let Some(v) = self.value else {
            return format!("not measured: {}", self.why);
        };
        let f = |x: f64| match self.unit.as_str() {
            "x" => format!("{x:.2}x"),
            _ => format!("{x:.1} %"),
        };
        let at_least = self.unit != "%<=";
        match self.met {
            Some(true) => format!(
                "met ({}, {} {})",
                f(v),
                if at_least { "target >=" } else { "target <=" },
                f(self.limit)
            ),
            _ => format!(
                "MISSED ({}, {} {})",
                f(v),
                if at_least { "target >=" } else { "target <=" },
                f(self.limit)
            ),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LocksReport {
    pub schema: String,
    pub meta: LocksMeta,
    pub cases: Vec<CaseReport>,
    pub targets: Vec<LockTarget>,
    /// Whether vanilla's guests counted their holders' preemptions: KVM
    /// guests read them from KVM's steal-time flag (ABI 1.6), which needs
    /// no host half; TCG guests, and KVM guests before 1.6, see none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub vanilla_counts_holders: bool,
    /// What overcommitting costs vanilla's work per CPU-second (None
    /// unless the run has vanilla in both cases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<Efficiency>,
    /// PNG files, relative to the output directory.
    pub plots: Vec<String>,
}
