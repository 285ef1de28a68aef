//! The rogue-guest scenario's results and report (`--scenario rogue`):
//! the cases compared, what one measurement keeps, and from those the
//! Markdown table, the JSON and the targets.
//!
//! The targets (security issue "a rogue guest beside a well-behaved VM"):
//! under pvsched, the neighbour's guest p99 and the host's p99 with the
//! rogue spinning stay <= 1.2x the same run's p99 with the rogue idle; the
//! rogue QEMU's share of the machine under pvsched stays <= its share under
//! vanilla (plain CFS) + 10 percentage points.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::str::FromStr;

use pvsched_control::VmStatus;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::BenchError;
use crate::harness::axes::{Load, Mode};
use crate::harness::figures::{join, ratio, side, Side};
use crate::harness::meta::Meta;
use crate::stats::Histogram;

/// The well-behaved VM's name (QEMU `-name` prefix, pvschedd's `[[vm]]`).
pub const NEIGHBOUR: &str = crate::daemon::VM_NAME;
/// The rogue VM's name.
pub const ROGUE: &str = "rogue";

/// Largest p99 ratio (rogue spinning / rogue idle, pvsched) the target allows.
pub const P99_LIMIT: f64 = 1.2;
/// How far (fraction of the machine) the rogue's share under pvsched may
/// exceed its share under vanilla.
pub const SHARE_MARGIN: f64 = 0.10;

/// What "CPU share" means in this report.
pub const SHARE_DEFINITION: &str = "CPU share of a VM = (utime + stime of its QEMU process, \
    all threads, from /proc/<pid>/stat, over the measurement window) / (window x host CPUs). \
    The window is the cyclictest duration, sampled from the start of the host cyclictest; \
    100 % = every host CPU for the whole window.";

/// One configuration of the run: the host mode and whether the rogue spins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
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

impl FromStr for Case {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        Case::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| BenchError::Unknown {
                what: "rogue case",
                given: s.to_string(),
                choices: "pvsched-quiet, pvsched-rogue, vanilla-rogue, vanilla-quiet",
            })
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

/// A CPU share over the repeats, in percent of the machine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Share {
    /// Over every window of the cell (ticks summed / windows summed).
    pub pct: f64,
    pub pct_per_repeat: Vec<f64>,
}

/// pvschedd's counters of one VM, summed over the repeats of a cell.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DaemonSummary {
    pub boosts: u64,
    pub throttles: u64,
    pub over_budget: u64,
    pub clamped_inputs: u64,
    pub boosted_s: f64,
    /// Boosted vCPU time / (windows x the VM's vCPUs), percent.
    pub boosted_pct: f64,
    pub boosted_pct_per_repeat: Vec<f64>,
    /// Repeats that ended with the VM's boost budget latched.
    pub in_debt_at_end: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CaseReport {
    /// The neighbour's guest cyclictest.
    pub guest: Side,
    pub host: Side,
    pub rogue_share: Share,
    /// The rogue's vCPU threads alone.
    pub rogue_vcpu_share: Share,
    pub neighbour_share: Share,
    /// Scheduling parameters seen per thread group, summed over the repeats.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, ParamsSeen>,
    pub other_load_pct_per_repeat: Vec<f64>,
    pub rogue_spinning_per_repeat: Vec<u32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub daemon: BTreeMap<String, DaemonSummary>,
}

/// The comparisons of one cell; None when a case is missing or a
/// denominator is 0.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CellRatios {
    /// Neighbour guest p99, pvsched-rogue / pvsched-quiet.
    pub neighbour_p99_pvsched: Option<f64>,
    /// Host p99, pvsched-rogue / pvsched-quiet.
    pub host_p99_pvsched: Option<f64>,
    /// Neighbour guest p99, vanilla-rogue / vanilla-quiet.
    pub neighbour_p99_vanilla: Option<f64>,
    /// Host p99, vanilla-rogue / vanilla-quiet.
    pub host_p99_vanilla: Option<f64>,
    /// Rogue share under pvsched minus under vanilla, percentage points.
    pub rogue_share_pvsched_minus_vanilla_pts: Option<f64>,
}

/// One (load, interval) of the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub load: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_cmd: Option<String>,
    pub interval_us: u32,
    pub duration_s: u64,
    pub repeat: usize,
    pub cases: BTreeMap<String, CaseReport>,
    pub ratios: CellRatios,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RogueTarget {
    pub load: String,
    pub interval_us: u32,
    pub what: String,
    pub value: f64,
    pub limit: f64,
    /// "x" (a ratio) or "%" (of the machine).
    pub unit: String,
    pub met: bool,
}

impl RogueTarget {
    pub fn verdict(&self) -> String {
        let v = |x: f64| {
            if self.unit == "x" {
                format!("{x:.2}x")
            } else {
                format!("{x:.1} %")
            }
        };
        if self.met {
            format!("met ({}, limit {})", v(self.value), v(self.limit))
        } else if self.unit == "x" {
            format!(
                "MISSED by {:.0} % ({}, limit {})",
                (self.value / self.limit - 1.0) * 100.0,
                v(self.value),
                v(self.limit)
            )
        } else {
            format!(
                "MISSED by {:.1} points ({}, limit {})",
                self.value - self.limit,
                v(self.value),
                v(self.limit)
            )
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RogueReport {
    pub schema: String,
    pub meta: RogueMeta,
    pub cells: Vec<Cell>,
    pub targets: Vec<RogueTarget>,
    /// PNG files, relative to the output directory.
    pub plots: Vec<String>,
}

fn pct(x: f64) -> f64 {
    (x * 1000.0).round() / 10.0
}

/// The phases of one (load, interval, case), in run order.
pub fn phases_of(raw: &RogueRaw, load: Load, interval: u32, case: Case) -> Vec<&Phase> {
    raw.phases
        .iter()
        .filter(|p| p.load == load && p.interval_us == interval && p.case == case)
        .collect()
}

/// The merged histograms (neighbour guest, host) of one (load, interval, case).
pub fn merged(raw: &RogueRaw, load: Load, interval: u32, case: Case) -> (Histogram, Histogram) {
    let ph = phases_of(raw, load, interval, case);
    (
        Histogram::merged(ph.iter().map(|p| &p.guest)),
        Histogram::merged(ph.iter().map(|p| &p.host)),
    )
}

fn share(phases: &[&Phase], f: impl Fn(&Phase) -> f64) -> Share {
    let window: f64 = phases.iter().map(|p| p.window_s).sum();
    let busy: f64 = phases.iter().map(|p| f(p) * p.window_s).sum();
    Share {
        pct: if window > 0.0 {
            pct(busy / window)
        } else {
            0.0
        },
        pct_per_repeat: phases.iter().map(|p| pct(f(p))).collect(),
    }
}

fn daemon_summary(phases: &[&Phase]) -> BTreeMap<String, DaemonSummary> {
    let mut out: BTreeMap<String, DaemonSummary> = BTreeMap::new();
    let mut vcpu_time: BTreeMap<String, f64> = BTreeMap::new();
    for p in phases {
        for (vm, c) in &p.daemon {
            let d = out.entry(vm.clone()).or_default();
            d.boosts += c.boosts;
            d.throttles += c.throttles;
            d.over_budget += c.over_budget;
            d.clamped_inputs += c.clamped_inputs;
            d.boosted_s += c.boosted_s;
            let vt = p.window_s * c.vcpus as f64;
            *vcpu_time.entry(vm.clone()).or_default() += vt;
            d.boosted_pct_per_repeat
                .push(if vt > 0.0 { pct(c.boosted_s / vt) } else { 0.0 });
            d.in_debt_at_end += usize::from(c.in_debt_at_end);
        }
    }
    for (vm, d) in out.iter_mut() {
        let vt = vcpu_time.get(vm).copied().unwrap_or(0.0);
        d.boosted_s = (d.boosted_s * 1000.0).round() / 1000.0;
        d.boosted_pct = if vt > 0.0 { pct(d.boosted_s / vt) } else { 0.0 };
    }
    out
}

fn case_report(phases: &[&Phase]) -> CaseReport {
    let guest: Vec<&Histogram> = phases.iter().map(|p| &p.guest).collect();
    let host: Vec<&Histogram> = phases.iter().map(|p| &p.host).collect();
    CaseReport {
        guest: side(&guest, phases.iter().map(|p| p.guest_expected).sum()),
        host: side(&host, phases.iter().map(|p| p.host_expected).sum()),
        rogue_share: share(phases, |p| p.rogue_share),
        rogue_vcpu_share: share(phases, |p| p.rogue_vcpu_share),
        neighbour_share: share(phases, |p| p.neighbour_share),
        params: {
            let mut m: BTreeMap<String, ParamsSeen> = BTreeMap::new();
            for p in phases {
                for (g, seen) in &p.params {
                    m.entry(g.clone()).or_default().add(seen);
                }
            }
            m
        },
        other_load_pct_per_repeat: phases.iter().map(|p| pct(p.foreign_cpu)).collect(),
        rogue_spinning_per_repeat: phases.iter().map(|p| p.rogue_spinning).collect(),
        daemon: daemon_summary(phases),
    }
}

fn round3(x: Option<f64>) -> Option<f64> {
    x.map(|r| (r * 1000.0).round() / 1000.0)
}

fn cell_ratios(cases: &BTreeMap<String, CaseReport>) -> CellRatios {
    let get = |c: Case| cases.get(c.name());
    let p99 = |a: Case, b: Case, guest: bool| {
        let (x, y) = (get(a)?, get(b)?);
        let pick = |r: &CaseReport| {
            if guest {
                r.guest.summary.p99_us
            } else {
                r.host.summary.p99_us
            }
        };
        round3(ratio(pick(x) as f64, pick(y) as f64))
    };
    CellRatios {
        neighbour_p99_pvsched: p99(Case::PvschedRogue, Case::PvschedQuiet, true),
        host_p99_pvsched: p99(Case::PvschedRogue, Case::PvschedQuiet, false),
        neighbour_p99_vanilla: p99(Case::VanillaRogue, Case::VanillaQuiet, true),
        host_p99_vanilla: p99(Case::VanillaRogue, Case::VanillaQuiet, false),
        rogue_share_pvsched_minus_vanilla_pts: match (
            get(Case::PvschedRogue),
            get(Case::VanillaRogue),
        ) {
            (Some(p), Some(v)) => {
                Some(((p.rogue_share.pct - v.rogue_share.pct) * 10.0).round() / 10.0)
            }
            _ => None,
        },
    }
}

/// The issue's three targets for one cell (those whose cases ran).
pub fn targets(cell: &Cell) -> Vec<RogueTarget> {
    let mut out = Vec::new();
    let get = |c: Case| cell.cases.get(c.name());
    let t = |what: &str, value: f64, limit: f64, unit: &str| RogueTarget {
        load: cell.load.clone(),
        interval_us: cell.interval_us,
        what: what.to_string(),
        value,
        limit,
        unit: unit.to_string(),
        met: value <= limit + 1e-9,
    };
    if let Some(r) = cell.ratios.neighbour_p99_pvsched {
        out.push(t(
            "neighbour guest p99: pvsched-rogue <= 1.2 x pvsched-quiet",
            r,
            P99_LIMIT,
            "x",
        ));
    }
    if let Some(r) = cell.ratios.host_p99_pvsched {
        out.push(t(
            "host p99: pvsched-rogue <= 1.2 x pvsched-quiet",
            r,
            P99_LIMIT,
            "x",
        ));
    }
    if let (Some(p), Some(v)) = (get(Case::PvschedRogue), get(Case::VanillaRogue)) {
        out.push(t(
            "rogue CPU share: pvsched-rogue <= vanilla-rogue + 10 points",
            p.rogue_share.pct,
            ((v.rogue_share.pct + SHARE_MARGIN * 100.0) * 10.0).round() / 10.0,
            "%",
        ));
    }
    out
}

/// Builds the report: cells in (load, interval) order of the run.
pub fn build(raw: &RogueRaw) -> RogueReport {
    let mut cells = Vec::new();
    let mut all_targets = Vec::new();
    for &load in &raw.loads {
        for &interval in &raw.intervals {
            let mut cell = Cell {
                load: load.name().to_string(),
                load_cmd: (load == Load::Loaded).then(|| raw.meta.base.load_cmd.clone()),
                interval_us: interval,
                duration_s: raw.meta.base.duration_s,
                repeat: raw.meta.base.repeat,
                ..Default::default()
            };
            for &case in &raw.cases {
                let ph = phases_of(raw, load, interval, case);
                if !ph.is_empty() {
                    cell.cases.insert(case.name().to_string(), case_report(&ph));
                }
            }
            cell.ratios = cell_ratios(&cell.cases);
            all_targets.extend(targets(&cell));
            cells.push(cell);
        }
    }
    RogueReport {
        schema: "pvsched-bench-rogue/1".into(),
        meta: raw.meta.clone(),
        cells,
        targets: all_targets,
        plots: Vec::new(),
    }
}

/// The cases of a cell in report order.
pub fn ordered(cases: &BTreeMap<String, CaseReport>) -> Vec<(Case, &CaseReport)> {
    Case::ALL
        .iter()
        .filter_map(|c| cases.get(c.name()).map(|r| (*c, r)))
        .collect()
}

fn opt_ratio(r: Option<f64>) -> String {
    r.map(|r| format!("{r:.2}x"))
        .unwrap_or_else(|| "n/a".into())
}

fn pcts(v: &[f64]) -> String {
    v.iter()
        .map(|p| format!("{p:.1}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The Markdown report (also what the bench prints at the end).
pub fn markdown(r: &RogueReport) -> String {
    let m = &r.meta.base;
    let rm = &r.meta;
    let mut o = String::new();
    let _ = writeln!(o, "# pvsched bench, rogue guest: {}\n", m.started);
    let _ = writeln!(o, "Command: `{}`  ", m.command);
    let _ = writeln!(
        o,
        "Machine: {}, {} CPUs, {} GiB, kernel {}, {}  ",
        m.machine.cpu_model, m.machine.cpus, m.machine.memory_gib, m.machine.kernel, m.machine.os
    );
    let _ = writeln!(
        o,
        "Tools: {}; {}; {}; pvsched {}  ",
        m.machine.qemu, m.machine.cyclictest, m.machine.stress_ng, m.machine.git
    );
    let _ = writeln!(o, "Accelerator: {}  ", m.accel_reason);
    let _ = writeln!(
        o,
        "Guests: neighbour `{NEIGHBOUR}` ({} vCPUs, pvsched.ko {}) and rogue `{ROGUE}` ({} vCPUs, \
         pvsched.ko {}), kernel {}, both booted for the whole run  ",
        m.guest_cpus, m.guest_module, rm.rogue_vcpus, rm.rogue_module, m.guest_kernel
    );
    let _ = writeln!(
        o,
        "Neighbour: guest `cyclictest -p 8 --policy=rr` on every vCPU; host: the same on every \
         host CPU, at the same time  "
    );
    let _ = writeln!(
        o,
        "Rogue (`-rogue` cases): `{}` on each of its vCPUs, started before and killed after each \
         measurement (guest RT throttling: {})  ",
        rm.rogue_cmd, rm.rogue_rt_throttle
    );
    let _ = writeln!(o, "Host load (\"loaded\"): `{}`  ", m.load_cmd);
    if m.pvschedd_settings.trim().is_empty() {
        let _ = writeln!(
            o,
            "pvschedd: {}, default configuration, serving both VMs  ",
            rm.pvschedd
        );
    } else {
        let _ = writeln!(
            o,
            "pvschedd: {}, defaults plus `{}`, serving both VMs  ",
            rm.pvschedd,
            m.pvschedd_settings.trim().replace('\n', "; ")
        );
    }
    let _ = writeln!(
        o,
        "Each cell: {} repeats x {} s, cases interleaved (rotated per repeat); histograms of the \
         repeats merged. Wall time {:.1} min.  ",
        m.repeat,
        m.duration_s,
        m.wall_s / 60.0
    );
    let _ = writeln!(o, "{}\n", rm.share_definition);
    let _ = writeln!(o, "Cases:");
    for c in Case::ALL {
        if r.cells.iter().any(|cell| cell.cases.contains_key(c.name())) {
            let _ = writeln!(o, "- `{}`: {}", c.name(), c.describe());
        }
    }
    let _ = writeln!(o);

    if !r.targets.is_empty() {
        let _ = writeln!(o, "## Targets\n");
        let _ = writeln!(o, "| load | interval | target | result |");
        let _ = writeln!(o, "|---|---|---|---|");
        for t in &r.targets {
            let _ = writeln!(
                o,
                "| {} | {} µs | {} | {} |",
                t.load,
                t.interval_us,
                t.what,
                t.verdict()
            );
        }
        let _ = writeln!(o);
    }

    let _ = writeln!(
        o,
        "## Latency (µs): the neighbour's guest cyclictest and the host's\n"
    );
    let _ = writeln!(
        o,
        "| load | interval | case | neighbour avg | neighbour p99 | neighbour p99.9 | neighbour max | neighbour p99 per repeat | neighbour loops | host avg | host p99 | host max | host p99 per repeat | other load % per repeat |"
    );
    let _ = writeln!(
        o,
        "|---|---|---|--:|--:|--:|--:|---|--:|--:|--:|--:|---|---|"
    );
    for c in &r.cells {
        for (case, cr) in ordered(&c.cases) {
            let g = &cr.guest.summary;
            let h = &cr.host.summary;
            let _ = writeln!(
                o,
                "| {} | {} µs | {} | {:.0} | {} | {} | {} | {} | {:.0} % | {:.0} | {} | {} | {} | {} |",
                c.load,
                c.interval_us,
                case,
                g.avg_us,
                g.p99_us,
                g.p999_us,
                g.max_us,
                join(&cr.guest.p99_us_per_repeat),
                cr.guest.loops_ratio * 100.0,
                h.avg_us,
                h.p99_us,
                h.max_us,
                join(&cr.host.p99_us_per_repeat),
                pcts(&cr.other_load_pct_per_repeat)
            );
        }
    }

    let _ = writeln!(o, "\n## Ratios (same run)\n");
    let _ = writeln!(
        o,
        "| load | interval | neighbour p99 pvsched-rogue / pvsched-quiet | host p99 pvsched-rogue / pvsched-quiet | neighbour p99 vanilla-rogue / vanilla-quiet | host p99 vanilla-rogue / vanilla-quiet | rogue share pvsched - vanilla (points) |"
    );
    let _ = writeln!(o, "|---|---|--:|--:|--:|--:|--:|");
    for c in &r.cells {
        let x = &c.ratios;
        let _ = writeln!(
            o,
            "| {} | {} µs | {} | {} | {} | {} | {} |",
            c.load,
            c.interval_us,
            opt_ratio(x.neighbour_p99_pvsched),
            opt_ratio(x.host_p99_pvsched),
            opt_ratio(x.neighbour_p99_vanilla),
            opt_ratio(x.host_p99_vanilla),
            x.rogue_share_pvsched_minus_vanilla_pts
                .map(|p| format!("{p:+.1}"))
                .unwrap_or_else(|| "n/a".into()),
        );
    }

    let _ = writeln!(
        o,
        "\n## CPU share of the machine during the measurements (%)\n"
    );
    let _ = writeln!(
        o,
        "| load | interval | case | rogue | rogue per repeat | of which its vCPU threads | neighbour | neighbour per repeat | rogue vCPUs spinning per repeat |"
    );
    let _ = writeln!(o, "|---|---|---|--:|---|--:|--:|---|---|");
    for c in &r.cells {
        for (case, cr) in ordered(&c.cases) {
            let _ = writeln!(
                o,
                "| {} | {} µs | {} | {:.1} | {} | {:.1} | {:.1} | {} | {} |",
                c.load,
                c.interval_us,
                case,
                cr.rogue_share.pct,
                pcts(&cr.rogue_share.pct_per_repeat),
                cr.rogue_vcpu_share.pct,
                cr.neighbour_share.pct,
                pcts(&cr.neighbour_share.pct_per_repeat),
                join(&cr.rogue_spinning_per_repeat)
            );
        }
    }

    let params_rows: Vec<_> = r
        .cells
        .iter()
        .flat_map(|c| {
            ordered(&c.cases).into_iter().flat_map(move |(case, cr)| {
                THREAD_GROUPS
                    .iter()
                    .filter_map(move |g| cr.params.get(*g).map(|p| (c, case, *g, p)))
            })
        })
        .collect();
    if !params_rows.is_empty() {
        let _ = writeln!(
            o,
            "\n## Host scheduling of the QEMU threads during the measurements \
             (`sched_getattr` of each thread every 10 ms, by a SCHED_FIFO 6 thread of the \
             bench: above pvschedd's boosts, below the cyclictests)\n"
        );
        let _ = writeln!(
            o,
            "| load | interval | case | threads | samples | at RT % | RT parameters (% of samples) |"
        );
        let _ = writeln!(o, "|---|---|---|---|--:|--:|---|");
        for (c, case, g, p) in params_rows {
            let _ = writeln!(
                o,
                "| {} | {} µs | {} | {} | {} | {:.1} | {} |",
                c.load,
                c.interval_us,
                case,
                g,
                p.samples,
                p.rt_pct(),
                p.rt_params()
            );
        }
    }

    let daemon_rows: Vec<_> = r
        .cells
        .iter()
        .flat_map(|c| {
            ordered(&c.cases)
                .into_iter()
                .flat_map(move |(case, cr)| cr.daemon.iter().map(move |(vm, d)| (c, case, vm, d)))
        })
        .collect();
    if !daemon_rows.is_empty() {
        let _ = writeln!(
            o,
            "\n## pvschedd's counters over the measurement windows (sums over the repeats)\n"
        );
        let _ = writeln!(
            o,
            "| load | interval | case | VM | boosts | throttles | refused for budget (over_budget) | clamped inputs | boosted vCPU-s | boosted % of the VM's vCPU time | per repeat | repeats ending in debt |"
        );
        let _ = writeln!(o, "|---|---|---|---|--:|--:|--:|--:|--:|--:|---|--:|");
        for (c, case, vm, d) in daemon_rows {
            let _ = writeln!(
                o,
                "| {} | {} µs | {} | {} | {} | {} | {} | {} | {:.2} | {:.1} | {} | {} |",
                c.load,
                c.interval_us,
                case,
                vm,
                d.boosts,
                d.throttles,
                d.over_budget,
                d.clamped_inputs,
                d.boosted_s,
                d.boosted_pct,
                pcts(&d.boosted_pct_per_repeat),
                d.in_debt_at_end
            );
        }
    }

    if !m.notes.is_empty() {
        let _ = writeln!(o, "\n## Notes\n");
        for n in &m.notes {
            let _ = writeln!(o, "- {n}");
        }
    }
    if !r.plots.is_empty() {
        let _ = writeln!(o, "\n## Plots\n");
        for p in &r.plots {
            let _ = writeln!(o, "![{p}]({p})");
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(us: u64, n: u64) -> Histogram {
        let mut h = Histogram::default();
        h.record(us, n);
        h
    }

    /// One phase of `case`: neighbour p99 `g`, host p99 `h`, rogue share `share`.
    fn phase(case: Case, rep: usize, g: u64, h: u64, share: f64) -> Phase {
        let mut daemon = BTreeMap::new();
        if case.mode() == Mode::Pvsched {
            daemon.insert(
                ROGUE.to_string(),
                VmCounters {
                    vcpus: 2,
                    boosts: 10,
                    throttles: 2,
                    over_budget: 5,
                    boosted_s: 5.0,
                    in_debt_at_end: rep == 1,
                    ..Default::default()
                },
            );
        }
        Phase {
            load: Load::Loaded,
            interval_us: 1000,
            case,
            rep,
            guest: flat(g, 100),
            host: flat(h, 100),
            guest_expected: 100,
            host_expected: 100,
            foreign_cpu: 0.02,
            window_s: 10.0,
            rogue_share: share,
            rogue_vcpu_share: share * 0.9,
            neighbour_share: 0.1,
            params: BTreeMap::from([(
                THREAD_GROUPS[0].to_string(),
                ParamsSeen {
                    samples: 100,
                    rt: if case.spinning() { 90 } else { 0 },
                    rt_by_params: if case.spinning() {
                        BTreeMap::from([("rr/4".to_string(), 80), ("rr/2".to_string(), 10)])
                    } else {
                        BTreeMap::new()
                    },
                },
            )]),
            rogue_spinning: if case.spinning() { 2 } else { 0 },
            daemon,
        }
    }

    fn raw(phases: Vec<Phase>) -> RogueRaw {
        RogueRaw {
            scenario: "rogue".into(),
            meta: RogueMeta {
                base: Meta {
                    repeat: 2,
                    duration_s: 10,
                    load_cmd: "stress-ng --cpu 2".into(),
                    ..Default::default()
                },
                rogue_vcpus: 2,
                share_definition: SHARE_DEFINITION.into(),
                ..Default::default()
            },
            loads: vec![Load::Loaded],
            intervals: vec![1000],
            cases: Case::DEFAULT.to_vec(),
            phases,
            sessions: vec![],
        }
    }

    fn sample() -> RogueReport {
        build(&raw(vec![
            phase(Case::PvschedQuiet, 1, 300, 80, 0.05),
            phase(Case::PvschedRogue, 1, 330, 90, 0.50),
            phase(Case::VanillaRogue, 1, 4000, 70, 0.30),
            phase(Case::PvschedQuiet, 2, 300, 80, 0.05),
            phase(Case::PvschedRogue, 2, 330, 90, 0.60),
            phase(Case::VanillaRogue, 2, 4000, 70, 0.40),
        ]))
    }

    #[test]
    fn case_names_round_trip_and_say_what_differs() {
        for c in Case::ALL {
            assert_eq!(c.name().parse::<Case>().unwrap(), c);
            assert_eq!(serde_json::to_value(c).unwrap(), c.name());
        }
        assert!(Case::PvschedRogue.spinning() && !Case::PvschedQuiet.spinning());
        assert_eq!(Case::VanillaRogue.mode(), Mode::Vanilla);
        assert!("rogue".parse::<Case>().is_err());
    }

    #[test]
    fn shares_pool_the_windows_and_keep_each_repeat() {
        // Act
        let r = sample();

        // Assert: (0.5 + 0.6) / 2 over equal windows.
        let pv = &r.cells[0].cases["pvsched-rogue"];
        assert_eq!(pv.rogue_share.pct, 55.0);
        assert_eq!(pv.rogue_share.pct_per_repeat, vec![50.0, 60.0]);
        assert_eq!(pv.rogue_spinning_per_repeat, vec![2, 2]);
    }

    #[test]
    fn p99_ratios_compare_the_rogue_with_the_quiet_run_of_the_same_mode() {
        let r = sample();
        let x = &r.cells[0].ratios;
        assert_eq!(x.neighbour_p99_pvsched, Some(1.1));
        assert_eq!(x.host_p99_pvsched, Some(1.125));
        assert_eq!(x.neighbour_p99_vanilla, None, "vanilla-quiet did not run");
        assert_eq!(x.rogue_share_pvsched_minus_vanilla_pts, Some(20.0));
    }

    #[test]
    fn targets_met_and_missed_say_by_how_much() {
        // Act
        let r = sample();

        // Assert: p99 1.1x and 1.125x met; share 55 % against 35 + 10 missed.
        assert_eq!(r.targets.len(), 3);
        assert!(r.targets[0].met && r.targets[1].met);
        let share = &r.targets[2];
        assert!(!share.met);
        assert_eq!(share.limit, 45.0);
        assert!(
            share.verdict().contains("MISSED by 10.0 points"),
            "{}",
            share.verdict()
        );
    }

    #[test]
    fn daemon_counters_sum_over_the_repeats() {
        let r = sample();
        let d = &r.cells[0].cases["pvsched-rogue"].daemon[ROGUE];
        assert_eq!((d.boosts, d.throttles, d.over_budget), (20, 4, 10));
        // 10 boosted vCPU-s of 2 x 10 s x 2 vCPUs.
        assert_eq!(d.boosted_pct, 25.0);
        assert_eq!(d.in_debt_at_end, 1);
        assert!(r.cells[0].cases["vanilla-rogue"].daemon.is_empty());
    }

    #[test]
    fn thread_params_seen_add_up_over_the_repeats() {
        let r = sample();
        let p = &r.cells[0].cases["pvsched-rogue"].params["rogue vCPUs"];
        assert_eq!((p.samples, p.rt), (200, 180));
        assert_eq!(p.rt_pct(), 90.0);
        assert_eq!(p.rt_params(), "rr/4 80.0 %, rr/2 10.0 %");
        let md = markdown(&r);
        assert!(
            md.contains("| loaded | 1000 µs | pvsched-rogue | rogue vCPUs | 200 | 90.0 | rr/4 80.0 %, rr/2 10.0 % |"),
            "{md}"
        );
    }

    #[test]
    fn counters_between_two_statuses_are_differences() {
        // Arrange: a status with one VM, counters as given.
        let status = |generation: u64, boosts: u64, boosted_s: f64| -> VmStatus {
            let v = serde_json::json!({
                "name": ROGUE, "tgid": 1, "accel": "tcg", "region": "/r",
                "generation": generation, "guest_bound": true, "in_debt": true, "debt_ms": 3.0,
                "boosts": boosts, "throttles": 1, "clamped_inputs": 0, "boosted_s": boosted_s,
                "over_budget": boosts / 2, "vcpus": [], "latency_path": []
            });
            serde_json::from_value(v).unwrap()
        };

        // Act
        let same = VmCounters::between(&status(1, 10, 1.0), &status(1, 30, 4.0));
        let anew = VmCounters::between(&status(1, 10, 1.0), &status(2, 4, 0.5));

        // Assert
        assert_eq!(
            (same.boosts, same.over_budget, same.boosted_s),
            (20, 10, 3.0)
        );
        assert!(same.in_debt_at_end);
        assert_eq!((anew.boosts, anew.boosted_s), (4, 0.5));
    }

    #[test]
    fn markdown_shows_every_case_the_shares_and_the_targets() {
        let md = markdown(&sample());
        for needle in [
            "| loaded | 1000 µs | pvsched-quiet | 300 |",
            "| loaded | 1000 µs | pvsched-rogue | 55.0 | 50.0, 60.0 |",
            "## Targets",
            "MISSED by 10.0 points",
            "| loaded | 1000 µs | pvsched-rogue | rogue | 20 | 4 | 10 |",
            "utime + stime",
        ] {
            assert!(md.contains(needle), "{needle:?} not in\n{md}");
        }
    }

    #[test]
    fn raw_round_trips_through_json() {
        // Arrange
        let r = raw(vec![phase(Case::PvschedRogue, 1, 330, 90, 0.5)]);

        // Act
        let text = serde_json::to_string(&r).unwrap();
        let back: RogueRaw = serde_json::from_str(&text).unwrap();

        // Assert
        assert!(text.contains("\"case\":\"pvsched-rogue\""));
        assert_eq!(back.phases[0].daemon[ROGUE].boosts, 10);
        assert_eq!(back.meta.rogue_vcpus, 2);
    }
}
