//! The standard scenario's report (report.json): per (load, interval) a
//! scenario of the modes' figures and their ratios, the targets, and the
//! module overhead, fairness, host-cost and simulated parts.
//!
//! JSON shape, one scenario per (load, interval):
//! `{load, load_cmd, interval_us, duration_s, repeat,
//!   modes: {<mode>: {guest: {avg_us, p50_us, p99_us, p999_us, max_us, ...},
//!                    host: {...}, audio, pingpong, host_load}},
//!   ratios: {"pvsched/static-rt": {...}, "pvsched/vanilla": {...}, ...}}`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::harness::axes::Mode;
use crate::harness::figures::Side;
use crate::harness::meta::Meta;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Audio {
    pub periods: u64,
    pub glitches: u64,
    pub glitches_per_repeat: Vec<u64>,
    pub period_us: u64,
    pub buffer_us: u64,
    /// Worst scheduling delay over the repeats.
    pub late_max_us: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PingPong {
    /// Medians over the repeats of each repeat's p50 / p99 round trip.
    pub p50_us: f64,
    pub p99_us: f64,
    pub p99_us_per_repeat: Vec<f64>,
    /// Each repeat's p50, in run order (absent from older reports).
    #[serde(default)]
    pub p50_us_per_repeat: Vec<f64>,
    pub round_trips: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostLoad {
    /// Mean over the repeats of each stressor's bogo ops per second.
    pub ops_per_s: BTreeMap<String, f64>,
    /// Geometric mean over the stressors of (this mode / vanilla).
    pub vs_vanilla: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModeReport {
    pub guest: Side,
    pub host: Side,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audio: Option<Audio>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pingpong: Option<PingPong>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_load: Option<HostLoad>,
    /// Percent of the machine's CPU time taken by processes outside the
    /// bench during each repeat's cyclictest (shared machine, steal).
    #[serde(default)]
    pub other_load_pct_per_repeat: Vec<f64>,
    /// pvsched only: boosts / throttles the daemon reported, per repeat.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub daemon: Vec<Value>,
    /// pvsched only: the daemon's reaction latency over every repeat.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reaction: Option<Reaction>,
    /// pvsched only: of a reaction, event -> event thread awake, and one
    /// `sched_setattr`; same form.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reaction_wakeup: Option<Reaction>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub setattr: Option<Reaction>,
    /// The host's interrupts per second, mean over this interval's phases.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub interrupts: Option<crate::interrupts::Rates>,
    /// The host's IPIs per second by cause and sender, mean over this
    /// interval's phases.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ipi_sources: Option<crate::ipi_sources::Sources>,
    /// pvsched only: the daemon's counters per second of its sessions
    /// (`model::DAEMON_COUNTERS` keys).
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub daemon_per_s: BTreeMap<String, f64>,
}

/// pvschedd's reaction latency (host event timestamp -> `sched_setattr`
/// returned, for the changes an event caused; its metrics' histogram, summed
/// over the repeats): bucket upper bounds, µs (`None`: above the last bound).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Reaction {
    pub actions: u64,
    pub p50_us: Option<f64>,
    pub p90_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// The highest non-empty bucket's bound.
    pub max_us: Option<f64>,
}

/// a / b for the numbers a reader compares; None when b is 0 or missing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Ratios {
    pub guest_avg: Option<f64>,
    pub guest_p99: Option<f64>,
    pub guest_max: Option<f64>,
    pub host_avg: Option<f64>,
    pub host_p99: Option<f64>,
    pub host_max: Option<f64>,
    pub glitches: Option<f64>,
    pub host_load: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    pub load: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_cmd: Option<String>,
    pub interval_us: u32,
    pub duration_s: u64,
    pub repeat: usize,
    pub modes: BTreeMap<String, ModeReport>,
    pub ratios: BTreeMap<String, Ratios>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub load: String,
    pub interval_us: u32,
    pub what: String,
    /// pvsched's value and the limit it is held to (µs).
    pub value_us: u64,
    pub limit_us: f64,
    /// pvsched / the other mode.
    pub ratio: f64,
    /// The ratio the target allows.
    pub allowed_ratio: f64,
    pub met: bool,
}

impl Target {
    pub fn verdict(&self) -> String {
        if self.met {
            format!("met ({:.2}x, limit {:.2}x)", self.ratio, self.allowed_ratio)
        } else {
            format!(
                "MISSED by {:.0} % ({:.2}x, limit {:.2}x)",
                (self.ratio / self.allowed_ratio - 1.0) * 100.0,
                self.ratio,
                self.allowed_ratio
            )
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub schema: String,
    pub meta: Meta,
    pub scenarios: Vec<Scenario>,
    pub targets: Vec<Target>,
    /// PNG files, relative to the output directory.
    pub plots: Vec<String>,
    /// Eventual fairness: per load, the VM's CPU share per mode against
    /// vanilla and its fair-class entitlement, with the host load beside it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fair_share: Vec<LoadShare>,
    /// The guest module's overhead on `perf bench sched pipe` (the phase ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modcost: Option<super::modcost::summary::ModCostReport>,
    /// The same policy under KVM, simulated (the loaded host ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated: Option<super::simulated::Simulated>,
    /// The host-cost targets with what remains where missed (read off the
    /// rest of the report).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_cost_targets: Vec<HostCostTarget>,
    /// Per load where both ran: pvschedd with the guest doorbell (`pvsched`)
    /// against the same VM on its recheck timer (`pvsched-timer`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub doorbell_vs_timer: Vec<DoorbellVsTimer>,
}

/// What pvschedd cost the host in one mode under one load.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DaemonCost {
    /// Its own process, percent of the machine over the cyclictest phases
    /// (the fairness table's `daemon_pct`; None: not measured).
    pub cpu_pct: Option<f64>,
    /// Its event thread's wakeups per second over its whole sessions, the
    /// causes below summed (None: no counters).
    pub wakeups_per_s: Option<f64>,
    /// By cause: host records; its timer (the recheck timer and the
    /// periodic scan share it); a guest doorbell.
    pub records_per_s: Option<f64>,
    pub timer_per_s: Option<f64>,
    pub doorbell_per_s: Option<f64>,
    /// The guest's rings of the doorbell, per second.
    pub rings_per_s: Option<f64>,
    /// vCPU preemptions pvschedd saw, per second: what a host-to-guest
    /// "you were preempted" interrupt would cost in interrupts (DESIGN.md,
    /// "pvschedd as the ivshmem server", host to guest).
    #[serde(default)]
    pub preempted_per_s: Option<f64>,
}

/// pvschedd serving the same VM with the guest doorbell and on its recheck
/// timer, under one load of one run; ratios are doorbell / timer (None
/// where the timer's figure is 0 or missing).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DoorbellVsTimer {
    pub load: String,
    /// The `pvsched` mode: pvschedd handed the VM's doorbell.
    pub doorbell: DaemonCost,
    /// The `pvsched-timer` mode: the same pvschedd without it.
    pub timer: DaemonCost,
    pub cpu_ratio: Option<f64>,
    pub wakeups_ratio: Option<f64>,
    pub timer_wakeups_ratio: Option<f64>,
}

/// The label of the doorbell / timer ratios in the report.
pub const DOORBELL_VS_TIMER: &str = "pvsched (doorbell) / pvsched-timer";

/// The pairs compared in every scenario, when both modes ran.
pub const PAIRS: [(Mode, Mode); 9] = [
    (Mode::Pvsched, Mode::StaticRt),
    (Mode::Pvsched, Mode::Vanilla),
    (Mode::StaticRt, Mode::Vanilla),
    (Mode::PvschedScx, Mode::Vanilla),
    (Mode::PvschedScx, Mode::StaticRt),
    (Mode::PvschedScx, Mode::Pvsched),
    // What the doorbell changes for the guest and the host's latency.
    (Mode::Pvsched, Mode::PvschedTimer),
    // What lock handling on the sched_ext backend costs the latency workload.
    (Mode::PvschedScxLock, Mode::PvschedScx),
    (Mode::PvschedScxLock, Mode::Vanilla),
];

/// The project's targets under load: (what, side, other mode, allowed ratio).
pub const TARGETS: [(&str, &str, Mode, f64); 3] = [
    (
        "guest p99: pvsched <= 1.5 x static-rt",
        "guest",
        Mode::StaticRt,
        1.5,
    ),
    (
        "guest p99: pvsched <= 1/3 x vanilla",
        "guest",
        Mode::Vanilla,
        1.0 / 3.0,
    ),
    (
        "host p99: pvsched <= 1.1 x vanilla",
        "host",
        Mode::Vanilla,
        1.1,
    ),
];

/// Host p99 pvsched / vanilla the target allows.
pub const HOST_P99_RATIO: f64 = 1.1;

/// Guest p99 pvsched / vanilla the target asks for at the same time.
pub const GUEST_P99_RATIO: f64 = 0.15;

/// Reaction p99 (host event -> `sched_setattr` returned), µs.
pub const REACTION_P99_US: f64 = 30.0;

/// One target's line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostCostTarget {
    pub target: String,
    /// This run's figure.
    pub result: String,
    /// None: shown, not a pass/fail target (or not measured).
    pub met: Option<bool>,
    /// Where missed: what this run measured behind it.
    pub remains: String,
}

/// The fair-class entitlement of the VM's vCPU threads under one load.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Entitlement {
    /// Percent of the machine.
    pub pct: f64,
    /// r: CPUs the fair class gave an always-runnable nice-0 thread.
    pub fair_rate_cpus: f64,
    /// Where r comes from.
    pub fair_rate_from: String,
    /// d_i: CPUs each vCPU thread used under static-rt; None when static-rt
    /// did not run (then `pct` is an upper bound).
    pub demand_cpus: Option<Vec<f64>>,
    pub upper_bound: bool,
}

/// One mode's shares under one load.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModeShare {
    /// The VM (QEMU, all threads), percent of the machine, every repeat pooled.
    pub vm_pct: f64,
    pub vm_pct_per_repeat: Vec<f64>,
    /// Its vCPU threads.
    pub vcpu_pct: f64,
    pub vcpu_pct_per_repeat: Vec<f64>,
    /// `vm_pct` / vanilla's.
    pub vm_vs_vanilla: Option<f64>,
    /// `vcpu_pct` / the entitlement.
    pub vcpu_vs_entitlement: Option<f64>,
    /// pvsched: boosted vCPU time, percent of the vCPUs' wall time.
    pub boosted_pct: Option<f64>,
    /// pvsched: the budget, percent of each vCPU's time.
    pub boost_budget_pct: Option<f64>,
    /// stress-ng's tree, percent of the machine (loaded host).
    pub load_pct: Option<f64>,
    pub load_cpu_vs_vanilla: Option<f64>,
    /// stress-ng's bogo-ops/s / vanilla's (the session's, from the scenarios).
    pub load_throughput_vs_vanilla: Option<f64>,
    /// The whole machine's busy time, percent.
    pub busy_pct: f64,
    /// pvsched: pvschedd's own process, percent of the machine.
    #[serde(default)]
    pub daemon_pct: Option<f64>,
    /// The same by thread name (`pvschedd` is its event loop).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub daemon_threads_pct: BTreeMap<String, f64>,
    /// Of the vCPU threads' time: the guest's idle driver polling, percent
    /// of the machine (None: its counters were not read).
    #[serde(default)]
    pub guest_poll_pct: Option<f64>,
    /// The guest's idle driver(s) seen at the ends of the phases.
    #[serde(default)]
    pub guest_idle: Vec<String>,
    /// Cyclictest phases measured.
    pub phases: usize,
}

/// The table of one load.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadShare {
    pub load: String,
    pub host_cpus: usize,
    pub vcpus: usize,
    pub entitlement: Option<Entitlement>,
    /// Mode name -> its shares.
    pub modes: BTreeMap<String, ModeShare>,
    /// Sentences that read the numbers (computed from them).
    pub reading: Vec<String>,
}
