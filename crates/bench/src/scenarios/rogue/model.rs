//! What the rogue scenario measures and keeps in raw.json: its cases, and
//! per phase both cyclictests, the VMs' CPU shares, pvschedd's counters of
//! each VM and the parameters its threads were seen at.

use std::collections::BTreeMap;
use std::fmt;

use clap::ValueEnum;
use pvsched_control::VmStatus;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::harness::axes::{Load, Mode};
use crate::harness::meta::Meta;
use crate::stats::Histogram;

/// The well-behaved VM's name (QEMU `-name` prefix, pvschedd's `[[vm]]`).
pub const NEIGHBOUR: &str = crate::daemon::VM_NAME;
/// The rogue VM's name.
pub const ROGUE: &str = "rogue";

/// What "CPU share" means in this report.
pub const SHARE_DEFINITION: &str = "CPU share of a VM = (utime + stime of its QEMU process, \
    all threads, from /proc/<pid>/stat, over the measurement window) / (window x host CPUs). \
    The window is the cyclictest duration, sampled from the start of the host cyclictest; \
    100 % = every host CPU for the whole window.";

/// One configuration of the run: the host mode and whether the rogue spins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Case {
    /// pvschedd serves both VMs; the rogue VM is booted, idle: the baseline.
    PvschedQuiet,
    /// pvschedd serves both VMs; rtspin at SCHED_FIFO on every rogue vCPU.
    PvschedRogue,
    /// No daemon, the rogue spinning: the share plain CFS gives it.
    VanillaRogue,
    /// No daemon, the rogue idle (context: what the rogue costs without pvsched).
    VanillaQuiet,
}

impl Case {
    /// Every case, in report order.
    pub const ALL: [Case; 4] = [
        Case::PvschedQuiet,
        Case::PvschedRogue,
        Case::VanillaRogue,
        Case::VanillaQuiet,
    ];
    /// What `--rogue-cases` defaults to: what the targets need.
    pub const DEFAULT: [Case; 3] = [Case::PvschedQuiet, Case::PvschedRogue, Case::VanillaRogue];

    pub fn name(self) -> &'static str {
        match self {
            Case::PvschedQuiet => "pvsched-quiet",
            Case::PvschedRogue => "pvsched-rogue",
            Case::VanillaRogue => "vanilla-rogue",
            Case::VanillaQuiet => "vanilla-quiet",
        }
    }

    pub fn mode(self) -> Mode {
        match self {
            Case::PvschedQuiet | Case::PvschedRogue => Mode::Pvsched,
            Case::VanillaRogue | Case::VanillaQuiet => Mode::Vanilla,
        }
    }

    /// Whether the rogue spins in this case.
    pub fn spinning(self) -> bool {
        matches!(self, Case::PvschedRogue | Case::VanillaRogue)
    }

    pub fn describe(self) -> &'static str {
        match self {
            Case::PvschedQuiet => "pvschedd serves both VMs, the rogue VM idle",
            Case::PvschedRogue => "pvschedd serves both VMs, the rogue spinning",
            Case::VanillaRogue => "no daemon (plain CFS), the rogue spinning",
            Case::VanillaQuiet => "no daemon (plain CFS), the rogue VM idle",
        }
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// pvschedd's counters of one VM over a measurement window (differences of
/// two status snapshots; `in_debt` as at the end).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VmCounters {
    pub vcpus: usize,
    pub boosts: u64,
    pub throttles: u64,
    /// Wanted boosts refused (or ended) for want of budget.
    pub over_budget: u64,
    pub clamped_inputs: u64,
    /// Boosted vCPU-seconds.
    pub boosted_s: f64,
    pub in_debt_at_end: bool,
}

impl VmCounters {
    /// The counters between two statuses of the same VM. A VM served anew
    /// in between (counters restarted) gives what `after` shows.
    pub fn between(before: &VmStatus, after: &VmStatus) -> VmCounters {
        let fresh = after.generation != before.generation || after.boosts < before.boosts;
        let d = |a: u64, b: u64| if fresh { a } else { a.saturating_sub(b) };
        VmCounters {
            vcpus: after.vcpus.len(),
            boosts: d(after.boosts, before.boosts),
            throttles: d(after.throttles, before.throttles),
            over_budget: d(after.over_budget, before.over_budget),
            clamped_inputs: d(after.clamped_inputs, before.clamped_inputs),
            boosted_s: if fresh {
                after.boosted_s
            } else {
                (after.boosted_s - before.boosted_s).max(0.0)
            },
            in_debt_at_end: after.in_debt,
        }
    }
}

/// What the host's scheduler was told about a group of threads during a
/// window: `sched_getattr` of each, every few milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ParamsSeen {
    /// (thread, moment) samples.
    pub samples: u64,
    /// Of which at an RT policy (FIFO, RR, deadline).
    pub rt: u64,
    /// RT samples by parameters (`rr/4`).
    pub rt_by_params: BTreeMap<String, u64>,
}

impl ParamsSeen {
    pub fn add(&mut self, other: &ParamsSeen) {
        self.samples += other.samples;
        self.rt += other.rt;
        for (k, v) in &other.rt_by_params {
            *self.rt_by_params.entry(k.clone()).or_default() += v;
        }
    }

    /// Percent of the samples at RT.
    pub fn rt_pct(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            pct(self.rt as f64 / self.samples as f64)
        }
    }

    /// `rr/4 80.1 %, rr/2 3.0 %` (percent of all samples), most seen first.
    pub fn rt_params(&self) -> String {
        let mut v: Vec<(&String, &u64)> = self.rt_by_params.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        v.iter()
            .map(|(k, n)| format!("{k} {:.1} %", pct(**n as f64 / self.samples.max(1) as f64)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Thread groups of [`Phase::params`], in report order.
pub const THREAD_GROUPS: [&str; 4] = [
    "rogue vCPUs",
    "rogue other threads",
    "neighbour vCPUs",
    "neighbour other threads",
];

/// One measurement: the neighbour's and the host's cyclictest at once, the
/// CPU shares over the same window, pvschedd's counters.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Phase {
    pub load: Load,
    pub interval_us: u32,
    pub case: Case,
    pub rep: usize,
    /// The neighbour's guest cyclictest.
    pub guest: Histogram,
    pub host: Histogram,
    pub guest_expected: u64,
    pub host_expected: u64,
    /// Fraction of the machine that went to processes outside the bench.
    pub foreign_cpu: f64,
    /// Seconds between the two CPU time samples.
    pub window_s: f64,
    /// CPU share of the rogue's QEMU (0..1 of the machine; see [`SHARE_DEFINITION`]).
    pub rogue_share: f64,
    /// The same for the rogue's vCPU threads alone (/proc/<pid>/task/<tid>/stat).
    #[serde(default)]
    pub rogue_vcpu_share: f64,
    pub neighbour_share: f64,
    /// Scheduling parameters of the QEMU threads during the window, per
    /// group of [`THREAD_GROUPS`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, ParamsSeen>,
    /// rtspin processes that said they run at SCHED_FIFO (0: the rogue idle).
    pub rogue_spinning: u32,
    /// pvschedd's counters over the window, per VM name (pvsched cases).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub daemon: BTreeMap<String, VmCounters>,
}

/// pvschedd's status at the end of one session, as `pvschedctl status --json` prints it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SessionStatus {
    pub load: Load,
    pub case: Case,
    pub rep: usize,
    pub status: Value,
}

/// Facts about the run besides [`Meta`].
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RogueMeta {
    #[serde(flatten)]
    pub base: Meta,
    pub rogue_vcpus: u32,
    pub rogue_module: String,
    /// The command run on each rogue vCPU (`{cpu}` stands for the index).
    pub rogue_cmd: String,
    /// The rogue guest's `sched_rt_runtime_us / sched_rt_period_us`.
    pub rogue_rt_throttle: String,
    /// The pvschedd binary the run used (copied at the start).
    pub pvschedd: String,
    pub share_definition: String,
}

/// Everything `--from-raw` needs to render the report again.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RogueRaw {
    /// Always "rogue": tells this file from the standard scenario's raw.json.
    pub scenario: String,
    pub meta: RogueMeta,
    pub loads: Vec<Load>,
    pub intervals: Vec<u32>,
    pub cases: Vec<Case>,
    pub phases: Vec<Phase>,
    pub sessions: Vec<SessionStatus>,
}

pub(super) fn pct(x: f64) -> f64 {
    (x * 1000.0).round() / 10.0
}
