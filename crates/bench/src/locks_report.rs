//! The lock-holder scenario's results and report (`--scenario locks`): the
//! modes and cases compared, what one measurement keeps, and from those the
//! Markdown tables, the JSON and the targets.
//!
//! The targets (issue 14), reported against, never asserted: in the
//! overcommitted case (two 2-vCPU VMs on the host's CPUs, both running the
//! lock-heavy workload), the summed throughput with lock-holder handling
//! (`pvsched-lock`) >= 1.2x `vanilla`; the share of holder preemptions
//! avoided, counted by the guests over the whole run, >= 85 %; each VM's
//! CPU time over a measurement within 5 % of an equal split.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::str::FromStr;

use pvsched_control::VmStatus;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::BenchError;
use crate::harness::figures::Spread;
use crate::harness::meta::Meta;

/// The first VM: runs the workload in both cases.
pub const VM_A: &str = "lock-a";
/// The second VM: runs the workload in the overcommitted case, idles in `alone`.
pub const VM_B: &str = "lock-b";

/// Target: summed throughput, pvsched-lock / vanilla, overcommitted.
pub const SPEEDUP_TARGET: f64 = 1.2;
/// Target: holder preemptions avoided, percent.
pub const AVOIDED_TARGET_PCT: f64 = 85.0;
/// Target: largest deviation of a VM's CPU time from an equal split, percent
/// of the equal split.
pub const SPLIT_TARGET_PCT: f64 = 5.0;

/// What the report's derived figures mean (printed under the header and
/// kept in the JSON).
pub const DEFINITIONS: [&str; 5] = [
    "Throughput: the operations lockstress finished in its window / the window (ops/s), \
     per VM; `both` is the sum of the two VMs' ops/s of the same repeat.",
    "Ratios (mode / vanilla): per repeat, the mode's ops/s over vanilla's ops/s of the same \
     case and repeat (modes interleaved, rotated per repeat); median and min-max over the \
     repeats.",
    "CPU time of a VM: utime + stime of its QEMU process (all threads, /proc/<pid>/stat) over \
     the measurement window; its split = its CPU time / both VMs' CPU time (equal split: \
     50 %); deviation = |split - equal| / equal.",
    "Guest lock counters: `lock_contended_count` and `lock_preempted_count` of every slot of \
     the VM's region (ABI 1.3, F_LOCK_WAIT), read by the bench on the host at the start and \
     the end of the window: contentions whose holder ran on another vCPU (or was unknown), \
     and of those the ones whose holder's vCPU the host half showed preempted. In vanilla no \
     daemon writes the host halves, so the guest cannot see a preempted holder: the \
     holder-preempted count is shown for the pvsched modes only.",
    "Holder preemptions avoided = 1 - (holder-preempted contentions per contention with lock \
     handling, pvsched-lock) / (the same without, pvsched-nolock), each rate summed over \
     every repeat of the case (and over both VMs for `both`).",
];

/// How the host treats the VMs' vCPU threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LockMode {
    /// No daemon: plain CFS.
    Vanilla,
    /// pvschedd serving both VMs, `honor_lock_holders = false`.
    PvschedNolock,
    /// pvschedd serving both VMs, `honor_lock_holders = true`.
    PvschedLock,
}

impl LockMode {
    pub const ALL: [LockMode; 3] = [
        LockMode::Vanilla,
        LockMode::PvschedNolock,
        LockMode::PvschedLock,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LockMode::Vanilla => "vanilla",
            LockMode::PvschedNolock => "pvsched-nolock",
            LockMode::PvschedLock => "pvsched-lock",
        }
    }

    /// The `honor_lock_holders` pvschedd runs with; None: no daemon.
    pub fn honor_lock_holders(self) -> Option<bool> {
        match self {
            LockMode::Vanilla => None,
            LockMode::PvschedNolock => Some(false),
            LockMode::PvschedLock => Some(true),
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            LockMode::Vanilla => "no daemon (plain CFS)",
            LockMode::PvschedNolock => {
                "pvschedd serving both VMs, `honor_lock_holders = false` (no lock-holder handling)"
            }
            LockMode::PvschedLock => {
                "pvschedd serving both VMs, `honor_lock_holders = true` (preempted \
                 lock holders extended)"
            }
        }
    }
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LockMode {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        LockMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| BenchError::Unknown {
                what: "lock mode",
                given: s.to_string(),
                choices: "vanilla, pvsched-nolock, pvsched-lock",
            })
    }
}

/// Which VMs run the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LockCase {
    /// Both VMs at once: more vCPUs than host CPUs.
    Overcommitted,
    /// `lock-a` alone (`lock-b` booted, idle).
    Alone,
}

impl LockCase {
    pub const ALL: [LockCase; 2] = [LockCase::Overcommitted, LockCase::Alone];

    pub fn name(self) -> &'static str {
        match self {
            LockCase::Overcommitted => "overcommitted",
            LockCase::Alone => "alone",
        }
    }

    /// Whether the VM `name` runs the workload in this case.
    pub fn runs(self, name: &str) -> bool {
        match self {
            LockCase::Overcommitted => true,
            LockCase::Alone => name == VM_A,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            LockCase::Overcommitted => "both VMs run the workload at once",
            LockCase::Alone => "`lock-a` runs the workload, `lock-b` is booted and idle",
        }
    }
}

impl fmt::Display for LockCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LockCase {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        LockCase::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| BenchError::Unknown {
                what: "lock case",
                given: s.to_string(),
                choices: "overcommitted, alone",
            })
    }
}

/// The guest workload (`lockstress -w`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    Rename,
    Files,
    Write,
    Mmap,
    RenameOwn,
}

impl Workload {
    pub const ALL: [Workload; 5] = [
        Workload::Rename,
        Workload::Files,
        Workload::Write,
        Workload::Mmap,
        Workload::RenameOwn,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Rename => "rename",
            Workload::Files => "files",
            Workload::Write => "write",
            Workload::Mmap => "mmap",
            Workload::RenameOwn => "rename-own",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Workload::Rename => {
                "every thread renames its own file from one tmpfs directory to another and \
                 back: the superblock's rename mutex (s_vfs_rename_mutex) and both directories' \
                 i_rwsem for writing, held for most of each rename; one op = 2 renames"
            }
            Workload::Files => {
                "every thread creates, closes and unlinks files in one shared tmpfs directory: \
                 the directory's i_rwsem for writing; one op = create + close + unlink"
            }
            Workload::Write => {
                "every thread writes 4 KiB into one shared tmpfs file: its i_rwsem for writing; \
                 one op = one pwrite"
            }
            Workload::Mmap => {
                "the threads of one process map 16 KiB, fault its 4 pages in and unmap it: \
                 mmap_lock for writing (mmap, munmap) against reading (faults); one op = \
                 mmap + 4 faults + munmap"
            }
            Workload::RenameOwn => {
                "the control without a shared lock: every thread renames its own file within \
                 its own tmpfs directory and back (that directory's i_rwsem only, which no \
                 other thread takes); one op = 2 renames"
            }
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| BenchError::Unknown {
                what: "lock workload",
                given: s.to_string(),
                choices: "rename, files, write, mmap, rename-own",
            })
    }
}

/// What `lockstress` prints (one JSON line).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LockstressResult {
    pub workload: String,
    pub threads: u32,
    pub cpus: u32,
    /// Operations finished by the end of the window.
    pub ops: u64,
    pub ops_per_s: f64,
    pub elapsed_s: f64,
    /// Operations finished in each whole second.
    #[serde(default)]
    pub per_s: Vec<u64>,
    pub thread_ops_min: u64,
    pub thread_ops_max: u64,
    #[serde(default)]
    pub failed: bool,
}

/// A VM's guest lock counters (`F_LOCK_WAIT`), summed over its slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestLocks {
    /// `lock_contended_count`.
    pub contended: u64,
    /// `lock_preempted_count`.
    pub preempted: u64,
}

impl GuestLocks {
    /// The counters between two readings: a counter that went back (the
    /// module re-bound, its counters restarted) gives what `after` shows.
    pub fn between(before: &GuestLocks, after: &GuestLocks) -> GuestLocks {
        let fresh = after.contended < before.contended || after.preempted < before.preempted;
        if fresh {
            *after
        } else {
            GuestLocks {
                contended: after.contended - before.contended,
                preempted: after.preempted - before.preempted,
            }
        }
    }

    pub fn add(&mut self, other: &GuestLocks) {
        self.contended += other.contended;
        self.preempted += other.preempted;
    }

    /// Holder-preempted contentions per contention; None without contentions.
    pub fn preempted_rate(&self) -> Option<f64> {
        (self.contended > 0).then(|| self.preempted as f64 / self.contended as f64)
    }
}

/// pvschedd's lock counters of one VM over a window (differences of two
/// `VmStatus::locks`; the debt as at the end).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DaemonLocks {
    pub contentions: u64,
    pub holder_preempted: u64,
    pub extensions: u64,
    /// Of them, granted when the host preempted a vCPU a wait already named
    /// (0 in raw files from before the counter).
    #[serde(default)]
    pub extensions_at_preemption: u64,
    pub extensions_refused: u64,
    pub preemptions_avoided: u64,
    pub extended_ms: f64,
    pub repaid_ms: f64,
    /// Lock debt at the end of the window (summed over repeats in a summary).
    pub debt_ms_at_end: f64,
}

impl DaemonLocks {
    /// The counters between two statuses of the same VM. A VM served anew
    /// in between (another generation, or counters that went back) gives
    /// what `after` shows.
    pub fn between(before: &VmStatus, after: &VmStatus) -> DaemonLocks {
        let (b, a) = (&before.locks, &after.locks);
        let fresh = after.generation != before.generation
            || a.contentions < b.contentions
            || a.extensions < b.extensions;
        let d = |x: u64, y: u64| if fresh { x } else { x.saturating_sub(y) };
        let f = |x: f64, y: f64| if fresh { x } else { (x - y).max(0.0) };
        DaemonLocks {
            contentions: d(a.contentions, b.contentions),
            holder_preempted: d(a.holder_preempted, b.holder_preempted),
            extensions: d(a.extensions, b.extensions),
            extensions_at_preemption: d(a.extensions_at_preemption, b.extensions_at_preemption),
            extensions_refused: d(a.extensions_refused, b.extensions_refused),
            preemptions_avoided: d(a.preemptions_avoided, b.preemptions_avoided),
            extended_ms: f(a.extended_ms, b.extended_ms),
            repaid_ms: f(a.repaid_ms, b.repaid_ms),
            debt_ms_at_end: a.debt_ms,
        }
    }

    pub fn add(&mut self, o: &DaemonLocks) {
        self.contentions += o.contentions;
        self.holder_preempted += o.holder_preempted;
        self.extensions += o.extensions;
        self.extensions_at_preemption += o.extensions_at_preemption;
        self.extensions_refused += o.extensions_refused;
        self.preemptions_avoided += o.preemptions_avoided;
        self.extended_ms += o.extended_ms;
        self.repaid_ms += o.repaid_ms;
        self.debt_ms_at_end += o.debt_ms_at_end;
    }
}

/// One VM in one measurement.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VmPhase {
    pub name: String,
    /// Whether it ran the workload (else it idled).
    pub ran: bool,
    /// lockstress's output (None: idle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<LockstressResult>,
    /// CPU-seconds of its QEMU process over the window.
    pub cpu_s: f64,
    /// Whether the guest module accepted `F_LOCK_WAIT` at the start of the window.
    pub lock_wait: bool,
    /// Guest lock counters over the window (None: no `F_LOCK_WAIT`, or the
    /// region could not be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_locks: Option<GuestLocks>,
    /// `lock:contention_begin` events of the whole guest kernel during the
    /// workload (a hist trigger's total, read around lockstress; None: idle,
    /// or no trigger).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_contentions: Option<u64>,
    /// pvschedd's lock counters over the window (pvsched modes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon: Option<DaemonLocks>,
}

/// One measurement: one (case, mode, repeat).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    pub case: LockCase,
    pub mode: LockMode,
    pub rep: usize,
    /// Seconds between the two CPU-time samples.
    pub window_s: f64,
    pub host_cpus: usize,
    /// Fraction of the machine that went to processes outside the bench.
    pub foreign_cpu: f64,
    /// In [`VM_A`], [`VM_B`] order.
    pub vms: Vec<VmPhase>,
    /// Fraction of the machine busy over the window (/proc/stat; None:
    /// unreadable, or a raw file from before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_busy: Option<f64>,
    /// pvschedd's own CPU-seconds over the window (pvsched modes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon_cpu_s: Option<f64>,
    /// pvschedd's counters over the window (`model::DAEMON_COUNTERS` keys:
    /// event-thread wakeups by cause, doorbell rings, BPF records).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub daemon_counters: BTreeMap<String, f64>,
}

impl Phase {
    pub fn vm(&self, name: &str) -> Option<&VmPhase> {
        self.vms.iter().find(|v| v.name == name)
    }

    /// CPU-seconds the machine had over the window (window x CPUs); None
    /// for an empty window.
    pub fn machine_seconds(&self) -> Option<f64> {
        let s = self.window_s * self.host_cpus as f64;
        (s > 0.0).then_some(s)
    }

    /// ops/s of the VMs that ran the workload, summed; None when one of
    /// them has no result.
    pub fn total_ops_per_s(&self) -> Option<f64> {
        let ran: Vec<&VmPhase> = self.vms.iter().filter(|v| v.ran).collect();
        if ran.is_empty() {
            return None;
        }
        ran.iter()
            .map(|v| v.result.as_ref().map(|r| r.ops_per_s))
            .sum()
    }

    /// Operations per CPU-second the VMs that ran the workload spent: their
    /// summed ops/s over the CPUs their QEMU processes used. None without a
    /// result or CPU time.
    pub fn ops_per_cpu_s(&self) -> Option<f64> {
        let ops = self.total_ops_per_s()?;
        let cpu_s: f64 = self.vms.iter().filter(|v| v.ran).map(|v| v.cpu_s).sum();
        (cpu_s > 0.0 && self.window_s > 0.0).then(|| ops / (cpu_s / self.window_s))
    }

    /// Each VM's share of the VMs' CPU time (0..1), in `vms` order; None
    /// when they used none.
    pub fn cpu_split(&self) -> Option<Vec<f64>> {
        let total: f64 = self.vms.iter().map(|v| v.cpu_s).sum();
        (total > 0.0).then(|| self.vms.iter().map(|v| v.cpu_s / total).collect())
    }

    /// The largest |share - equal| / equal over the VMs, percent; None
    /// unless every VM ran the workload.
    pub fn split_deviation_pct(&self) -> Option<f64> {
        if !self.vms.iter().all(|v| v.ran) {
            return None;
        }
        let split = self.cpu_split()?;
        let equal = 1.0 / split.len() as f64;
        split
            .iter()
            .map(|s| (s - equal).abs() / equal * 100.0)
            .reduce(f64::max)
    }
}

/// pvschedd's status at the end of one session, as `pvschedctl status --json` prints it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SessionStatus {
    pub case: LockCase,
    pub mode: LockMode,
    pub rep: usize,
    pub status: Value,
}

/// Facts about the run besides [`Meta`].
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LocksMeta {
    #[serde(flatten)]
    pub base: Meta,
    /// The VMs, in order, with their pvsched.ko state after boot.
    pub vms: Vec<(String, String)>,
    pub workload: String,
    pub workload_describe: String,
    /// The guest command (`{secs}` stands for the duration).
    pub workload_cmd: String,
    /// Threads per VM (lockstress's count on the first VM).
    pub threads: u32,
    /// The pvschedd binary the run used (copied at the start).
    pub pvschedd: String,
    /// How the kernel-wide contention count was taken, or why not.
    pub kernel_counter: String,
    pub definitions: Vec<String>,
}

/// Everything `--from-raw` needs to render the report again.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LocksRaw {
    /// Always "locks": tells this file from the other scenarios' raw.json.
    pub scenario: String,
    pub meta: LocksMeta,
    pub cases: Vec<LockCase>,
    pub modes: Vec<LockMode>,
    pub phases: Vec<Phase>,
    pub sessions: Vec<SessionStatus>,
}

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
    /// pvschedd's counters summed over the repeats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon: Option<DaemonLocks>,
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

/// The share of holder preemptions avoided, whole run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Avoided {
    /// A VM's name, or `both`.
    pub vm: String,
    /// pvsched-nolock's counters, summed over the repeats.
    pub without: GuestLocks,
    /// pvsched-lock's.
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

/// [`Efficiency`] of `cases`, when both have vanilla.
pub fn efficiency(cases: &[CaseReport]) -> Option<Efficiency> {
    let rate = |case: LockCase| {
        let c = cases.iter().find(|c| c.case == case.name())?;
        let m = c.modes.get(LockMode::Vanilla.name())?;
        m.ops_per_cpu_s.as_ref().map(|s| s.median)
    };
    let alone = rate(LockCase::Alone)?;
    let overcommitted = rate(LockCase::Overcommitted)?;
    (overcommitted > 0.0).then(|| Efficiency {
        alone,
        overcommitted,
        alone_over_overcommitted: round(alone / overcommitted, 3),
    })
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
    /// What overcommitting costs vanilla's work per CPU-second (None
    /// unless the run has vanilla in both cases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<Efficiency>,
    /// PNG files, relative to the output directory.
    pub plots: Vec<String>,
}

fn round(x: f64, places: i32) -> f64 {
    let m = 10f64.powi(places);
    (x * m).round() / m
}

/// The phases of one (case, mode), in run order.
pub fn phases_of(raw: &LocksRaw, case: LockCase, mode: LockMode) -> Vec<&Phase> {
    raw.phases
        .iter()
        .filter(|p| p.case == case && p.mode == mode)
        .collect()
}

/// The VMs' names in the phases, in first-seen order.
fn vm_names(phases: &[&Phase]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for p in phases {
        for v in &p.vms {
            if !names.contains(&v.name) {
                names.push(v.name.clone());
            }
        }
    }
    names
}

fn vm_summary(phases: &[&Phase], name: &str, index: usize) -> VmSummary {
    let of: Vec<(&Phase, &VmPhase)> = phases
        .iter()
        .filter_map(|p| p.vm(name).map(|v| (*p, v)))
        .collect();
    let ran = of.iter().any(|(_, v)| v.ran);
    let results: Vec<&LockstressResult> =
        of.iter().filter_map(|(_, v)| v.result.as_ref()).collect();
    let evenness: Vec<f64> = results
        .iter()
        .filter(|r| r.thread_ops_max > 0)
        .map(|r| r.thread_ops_min as f64 / r.thread_ops_max as f64)
        .collect();
    let mut guest: Option<GuestLocks> = None;
    let mut guest_window = 0.0;
    let mut guest_repeats = 0;
    let mut daemon: Option<DaemonLocks> = None;
    let mut kernel: Option<u64> = None;
    for (p, v) in &of {
        if let Some(g) = &v.guest_locks {
            guest.get_or_insert_with(GuestLocks::default).add(g);
            guest_window += p.window_s;
            guest_repeats += 1;
        }
        if let Some(d) = &v.daemon {
            daemon.get_or_insert_with(DaemonLocks::default).add(d);
        }
        if let Some(k) = v.kernel_contentions {
            *kernel.get_or_insert(0) += k;
        }
    }
    if let Some(d) = daemon.as_mut() {
        d.extended_ms = round(d.extended_ms, 3);
        d.repaid_ms = round(d.repaid_ms, 3);
        d.debt_ms_at_end = round(d.debt_ms_at_end, 3);
    }
    VmSummary {
        name: name.to_string(),
        ran,
        results: results.len(),
        ops_per_s: (!results.is_empty())
            .then(|| Spread::of(results.iter().map(|r| round(r.ops_per_s, 1)).collect())),
        thread_evenness: crate::stats::median(&evenness).map(|e| round(e, 3)),
        cpu_s: Spread::of(of.iter().map(|(_, v)| round(v.cpu_s, 3)).collect()),
        cpu_pct_of_machine: Spread::of(
            of.iter()
                .map(|(p, v)| {
                    let wall = p.window_s * p.host_cpus.max(1) as f64;
                    if wall > 0.0 {
                        round(v.cpu_s / wall * 100.0, 1)
                    } else {
                        0.0
                    }
                })
                .collect(),
        ),
        cpu_split_pct: Spread::of(
            of.iter()
                .filter_map(|(p, _)| p.cpu_split()?.get(index).map(|s| round(s * 100.0, 1)))
                .collect(),
        ),
        contentions_per_s: guest
            .filter(|_| guest_window > 0.0)
            .map(|g| round(g.contended as f64 / guest_window, 1)),
        preempted_pct: guest
            .and_then(|g| g.preempted_rate())
            .map(|r| round(r * 100.0, 2)),
        guest_locks: guest,
        guest_locks_repeats: guest_repeats,
        kernel_contentions: kernel,
        daemon,
    }
}

fn mode_summary(phases: &[&Phase], names: &[String]) -> ModeSummary {
    let totals: Vec<f64> = phases
        .iter()
        .filter_map(|p| p.total_ops_per_s())
        .map(|t| round(t, 1))
        .collect();
    let devs: Vec<f64> = phases
        .iter()
        .filter_map(|p| p.split_deviation_pct())
        .map(|d| round(d, 2))
        .collect();
    ModeSummary {
        repeats: phases.len(),
        total_ops_per_s: (!totals.is_empty()).then(|| Spread::of(totals)),
        split_deviation_pct: (!devs.is_empty()).then(|| Spread::of(devs)),
        ops_per_cpu_s: spread_of(
            phases
                .iter()
                .filter_map(|p| Some(round(p.ops_per_cpu_s()?, 1))),
        ),
        vms: names
            .iter()
            .enumerate()
            .map(|(i, n)| vm_summary(phases, n, i))
            .collect(),
        other_load_pct_per_repeat: phases
            .iter()
            .map(|p| round(p.foreign_cpu * 100.0, 1))
            .collect(),
        machine_busy_pct: spread_of(
            phases
                .iter()
                .filter_map(|p| Some(round(p.machine_busy? * 100.0, 1))),
        ),
        vms_pct: spread_of(phases.iter().filter_map(|p| {
            let cpu_s: f64 = p.vms.iter().map(|v| v.cpu_s).sum();
            Some(round(cpu_s / p.machine_seconds()? * 100.0, 1))
        })),
        daemon_pct: spread_of(
            phases
                .iter()
                .filter_map(|p| Some(round(p.daemon_cpu_s? / p.machine_seconds()? * 100.0, 2))),
        ),
        daemon_per_s: per_second(phases),
    }
}

/// A [`Spread`] of `v`; None when it is empty.
fn spread_of(v: impl Iterator<Item = f64>) -> Option<Spread> {
    let v: Vec<f64> = v.collect();
    (!v.is_empty()).then(|| Spread::of(v))
}

/// Each daemon counter summed over the phases that have it, per second of
/// those phases' windows.
fn per_second(phases: &[&Phase]) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for p in phases {
        for (k, v) in &p.daemon_counters {
            let e = sums.entry(k.clone()).or_default();
            e.0 += v;
            e.1 += p.window_s;
        }
    }
    sums.into_iter()
        .filter(|(_, (_, secs))| *secs > 0.0)
        .map(|(k, (n, secs))| (k, round(n / secs, 1)))
        .collect()
}

/// Per repeat present in both, `num`'s figure / `den`'s (`f` picks it; a
/// None or a zero denominator skips the repeat).
pub fn paired_ratios(
    num: &[&Phase],
    den: &[&Phase],
    f: impl Fn(&Phase) -> Option<f64>,
) -> Vec<f64> {
    num.iter()
        .filter_map(|n| {
            let d = den.iter().find(|d| d.rep == n.rep)?;
            let (a, b) = (f(n)?, f(d)?);
            (b > 0.0).then(|| round(a / b, 3))
        })
        .collect()
}

/// The ratios of every pvsched mode to vanilla in one case: per VM that
/// ran the workload, and `both` (the sum) when more than one did.
fn case_ratios(raw: &LocksRaw, case: LockCase, names: &[String]) -> Vec<Ratio> {
    let vanilla = phases_of(raw, case, LockMode::Vanilla);
    if vanilla.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for mode in [LockMode::PvschedLock, LockMode::PvschedNolock] {
        if !raw.modes.contains(&mode) {
            continue;
        }
        let ph = phases_of(raw, case, mode);
        let mut push = |vm: &str, v: Vec<f64>| {
            if !v.is_empty() {
                out.push(Ratio {
                    vm: vm.to_string(),
                    mode: mode.name().to_string(),
                    vs: LockMode::Vanilla.name().to_string(),
                    ratio: Spread::of(v),
                });
            }
        };
        let running: Vec<&String> = names.iter().filter(|n| case.runs(n)).collect();
        if running.len() > 1 {
            push("both", paired_ratios(&ph, &vanilla, Phase::total_ops_per_s));
        }
        for n in running {
            push(
                n,
                paired_ratios(&ph, &vanilla, |p| {
                    p.vm(n)?.result.as_ref().map(|r| r.ops_per_s)
                }),
            );
        }
    }
    out
}

/// Guest counters of `phases` summed over the VMs `vms` and the repeats.
fn summed_guest(phases: &[&Phase], vms: &[&str]) -> GuestLocks {
    let mut g = GuestLocks::default();
    for p in phases {
        for v in p.vms.iter().filter(|v| vms.contains(&v.name.as_str())) {
            if let Some(c) = &v.guest_locks {
                g.add(c);
            }
        }
    }
    g
}

/// The share of holder preemptions avoided: 1 - rate(with) / rate(without),
/// each rate = holder-preempted / contentions over the summed counters.
pub fn avoided(without: GuestLocks, with: GuestLocks) -> Option<f64> {
    let (r0, r1) = (without.preempted_rate()?, with.preempted_rate()?);
    (r0 > 0.0).then(|| 1.0 - r1 / r0)
}

fn case_avoided(raw: &LocksRaw, case: LockCase, names: &[String]) -> Vec<Avoided> {
    let (without, with) = (
        phases_of(raw, case, LockMode::PvschedNolock),
        phases_of(raw, case, LockMode::PvschedLock),
    );
    if without.is_empty() || with.is_empty() {
        return Vec::new();
    }
    let running: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| case.runs(n))
        .collect();
    let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
    if running.len() > 1 {
        groups.push(("both".into(), running.clone()));
    }
    groups.extend(running.iter().map(|n| (n.to_string(), vec![*n])));
    groups
        .into_iter()
        .map(|(vm, members)| {
            let (a, b) = (
                summed_guest(&without, &members),
                summed_guest(&with, &members),
            );
            Avoided {
                vm,
                without: a,
                with: b,
                without_pct: a.preempted_rate().map(|r| round(r * 100.0, 2)),
                with_pct: b.preempted_rate().map(|r| round(r * 100.0, 2)),
                avoided_pct: avoided(a, b).map(|x| round(x * 100.0, 1)),
            }
        })
        .collect()
}

/// The issue's three targets, from the overcommitted case.
pub fn targets(cases: &[CaseReport]) -> Vec<LockTarget> {
    let t = |what: &str, value: Option<f64>, limit: f64, unit: &str, why: &str| LockTarget {
        what: what.to_string(),
        value,
        limit,
        unit: unit.to_string(),
        met: value.map(|v| {
            if unit == "%<=" {
                v <= limit + 1e-9
            } else {
                v >= limit - 1e-9
            }
        }),
        why: if value.is_none() {
            why.to_string()
        } else {
            String::new()
        },
    };
    let oc = cases
        .iter()
        .find(|c| c.case == LockCase::Overcommitted.name());
    let speedup = oc.and_then(|c| {
        c.ratios
            .iter()
            .find(|r| r.vm == "both" && r.mode == LockMode::PvschedLock.name())
            .map(|r| r.ratio.median)
    });
    let avoided = oc.and_then(|c| {
        c.avoided
            .iter()
            .find(|a| a.vm == "both")
            .and_then(|a| a.avoided_pct)
    });
    let split = oc.and_then(|c| {
        c.modes
            .get(LockMode::PvschedLock.name())
            .and_then(|m| m.split_deviation_pct.as_ref())
            .map(|s| s.max)
    });
    vec![
        t(
            "overcommitted: throughput of both VMs, pvsched-lock / vanilla (median of the \
             per-repeat ratios)",
            speedup,
            SPEEDUP_TARGET,
            "x",
            "needs the overcommitted case with vanilla and pvsched-lock",
        ),
        t(
            "overcommitted: holder preemptions avoided, counted by the guests over the run \
             (pvsched-lock vs pvsched-nolock)",
            avoided,
            AVOIDED_TARGET_PCT,
            "%>=",
            "needs pvsched-nolock and pvsched-lock, guests publishing F_LOCK_WAIT, and \
             holder-preempted contentions without lock handling",
        ),
        t(
            "overcommitted, pvsched-lock: each VM's CPU time within 5 % of an equal split \
             (the worst repeat's deviation)",
            split,
            SPLIT_TARGET_PCT,
            "%<=",
            "needs the overcommitted case with pvsched-lock",
        ),
    ]
}

/// Builds the report: cases and modes in the run's order.
pub fn build(raw: &LocksRaw) -> LocksReport {
    let mut cases = Vec::new();
    for &case in &raw.cases {
        let all: Vec<&Phase> = raw.phases.iter().filter(|p| p.case == case).collect();
        if all.is_empty() {
            continue;
        }
        let names = vm_names(&all);
        let mut c = CaseReport {
            case: case.name().to_string(),
            ..Default::default()
        };
        for &mode in &raw.modes {
            let ph = phases_of(raw, case, mode);
            if !ph.is_empty() {
                c.modes
                    .insert(mode.name().to_string(), mode_summary(&ph, &names));
            }
        }
        c.ratios = case_ratios(raw, case, &names);
        c.avoided = case_avoided(raw, case, &names);
        cases.push(c);
    }
    LocksReport {
        schema: "pvsched-bench-locks/1".into(),
        meta: raw.meta.clone(),
        targets: targets(&cases),
        efficiency: efficiency(&cases),
        cases,
        plots: Vec::new(),
    }
}

/// The modes of a case in report order.
pub fn ordered(modes: &BTreeMap<String, ModeSummary>) -> Vec<(LockMode, &ModeSummary)> {
    LockMode::ALL
        .iter()
        .filter_map(|m| modes.get(m.name()).map(|s| (*m, s)))
        .collect()
}

/// `median [min-max]`, or the one value.
fn spread(s: &Spread, places: usize) -> String {
    if s.per_repeat.len() > 1 {
        format!("{:.p$} [{:.p$}-{:.p$}]", s.median, s.min, s.max, p = places)
    } else if s.per_repeat.len() == 1 {
        format!("{:.p$}", s.median, p = places)
    } else {
        "n/a".into()
    }
}

fn opt_spread(s: &Option<Spread>, places: usize) -> String {
    s.as_ref()
        .map(|s| spread(s, places))
        .unwrap_or_else(|| "n/a".into())
}

fn list(v: &[f64], places: usize) -> String {
    v.iter()
        .map(|x| format!("{x:.places$}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn opt<T: fmt::Display>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_else(|| "n/a".into())
}

/// The Markdown report (also what the bench prints at the end).
pub fn markdown(r: &LocksReport) -> String {
    let m = &r.meta.base;
    let lm = &r.meta;
    let mut o = String::new();
    let _ = writeln!(o, "# pvsched bench, lock holders: {}\n", m.started);
    let _ = writeln!(o, "Command: `{}`  ", m.command);
    let _ = writeln!(
        o,
        "Machine: {}, {} CPUs, {} GiB, kernel {}, {}  ",
        m.machine.cpu_model, m.machine.cpus, m.machine.memory_gib, m.machine.kernel, m.machine.os
    );
    let _ = writeln!(o, "Tools: {}; pvsched {}  ", m.machine.qemu, m.machine.git);
    let _ = writeln!(o, "Accelerator: {}  ", m.accel_reason);
    let _ = writeln!(
        o,
        "Guests: {} ({} vCPUs each, kernel {}), booted for the whole run  ",
        lm.vms
            .iter()
            .map(|(n, module)| format!("`{n}` (pvsched.ko {module})"))
            .collect::<Vec<_>>()
            .join(" and "),
        m.guest_cpus,
        m.guest_kernel
    );
    let _ = writeln!(
        o,
        "Workload (`{}`, {} threads per VM): `{}`: {}  ",
        lm.workload, lm.threads, lm.workload_cmd, lm.workload_describe
    );
    let _ = writeln!(o, "Kernel contention count: {}  ", lm.kernel_counter);
    let pvsched_modes = r.cases.iter().any(|c| {
        c.modes
            .keys()
            .any(|k| k.as_str() != LockMode::Vanilla.name())
    });
    if !pvsched_modes {
        let _ = writeln!(o, "pvschedd: not used (no pvsched mode ran)  ");
    } else if m.pvschedd_settings.trim().is_empty() {
        let _ = writeln!(
            o,
            "pvschedd: {}, default configuration but `honor_lock_holders`, serving both VMs  ",
            lm.pvschedd
        );
    } else {
        let _ = writeln!(
            o,
            "pvschedd: {}, defaults plus `{}` (but `honor_lock_holders`), serving both VMs  ",
            lm.pvschedd,
            m.pvschedd_settings.trim().replace('\n', "; ")
        );
    }
    let _ = writeln!(
        o,
        "Each (case, mode): {} repeats x {} s, modes interleaved (order rotated per repeat). \
         Wall time {:.1} min.\n",
        m.repeat,
        m.duration_s,
        m.wall_s / 60.0
    );
    let _ = writeln!(o, "Cases:");
    for c in LockCase::ALL {
        if r.cases.iter().any(|x| x.case == c.name()) {
            let _ = writeln!(o, "- `{}`: {}", c.name(), c.describe());
        }
    }
    let _ = writeln!(o, "\nModes:");
    for mode in LockMode::ALL {
        if r.cases.iter().any(|c| c.modes.contains_key(mode.name())) {
            let _ = writeln!(o, "- `{}`: {}", mode.name(), mode.describe());
        }
    }
    let _ = writeln!(o, "\nDefinitions:");
    for d in &lm.definitions {
        let _ = writeln!(o, "- {d}");
    }
    let _ = writeln!(o);

    let _ = writeln!(o, "## Targets (reported, not asserted)\n");
    let _ = writeln!(o, "| target | result |");
    let _ = writeln!(o, "|---|---|");
    for t in &r.targets {
        let _ = writeln!(o, "| {} | {} |", t.what, t.verdict());
    }

    let _ = writeln!(
        o,
        "\n## Throughput (ops/s: median [min-max] over the repeats)\n"
    );
    let _ = writeln!(
        o,
        "| case | mode | both VMs | per repeat | VM | ops/s | per repeat | slowest / fastest thread | other load % per repeat |"
    );
    let _ = writeln!(o, "|---|---|--:|---|---|--:|---|--:|---|");
    for c in &r.cases {
        for (mode, ms) in ordered(&c.modes) {
            let running = ms.vms.iter().filter(|v| v.ran).count();
            for (i, v) in ms.vms.iter().filter(|v| v.ran).enumerate() {
                let (both, per) = if running < 2 {
                    ("—".to_string(), String::new())
                } else if i == 0 {
                    (
                        opt_spread(&ms.total_ops_per_s, 0),
                        ms.total_ops_per_s
                            .as_ref()
                            .map(|s| list(&s.per_repeat, 0))
                            .unwrap_or_default(),
                    )
                } else {
                    (String::new(), String::new())
                };
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    c.case,
                    mode,
                    both,
                    per,
                    v.name,
                    opt_spread(&v.ops_per_s, 0),
                    v.ops_per_s
                        .as_ref()
                        .map(|s| list(&s.per_repeat, 0))
                        .unwrap_or_default(),
                    v.thread_evenness
                        .map(|e| format!("{e:.2}"))
                        .unwrap_or_else(|| "n/a".into()),
                    if i == 0 {
                        list(&ms.other_load_pct_per_repeat, 1)
                    } else {
                        String::new()
                    }
                );
            }
        }
    }

    let _ = writeln!(
        o,
        "\n## Throughput ratios (same run, paired by repeat: median [min-max])\n"
    );
    let _ = writeln!(o, "| case | VM | ratio | median [min-max] | per repeat |");
    let _ = writeln!(o, "|---|---|---|--:|---|");
    for c in &r.cases {
        for x in &c.ratios {
            let _ = writeln!(
                o,
                "| {} | {} | {} / {} | {:.2}x [{:.2}-{:.2}] | {} |",
                c.case,
                x.vm,
                x.mode,
                x.vs,
                x.ratio.median,
                x.ratio.min,
                x.ratio.max,
                list(&x.ratio.per_repeat, 3)
            );
        }
    }

    let _ = writeln!(
        o,
        "\n## Lock contentions and holder preemptions (sums over the repeats)\n"
    );
    let _ = writeln!(
        o,
        "| case | mode | VM | guest contentions | per s | holder preempted | per contention % | kernel contention_begin events | repeats with guest counters |"
    );
    let _ = writeln!(o, "|---|---|---|--:|--:|--:|--:|--:|--:|");
    for c in &r.cases {
        for (mode, ms) in ordered(&c.modes) {
            for v in &ms.vms {
                let g = v.guest_locks;
                let vanilla = mode == LockMode::Vanilla;
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {}/{} |",
                    c.case,
                    mode,
                    v.name,
                    opt(g.map(|g| g.contended)),
                    opt(v.contentions_per_s.map(|x| format!("{x:.0}"))),
                    if vanilla {
                        "— (no host halves)".to_string()
                    } else {
                        opt(g.map(|g| g.preempted))
                    },
                    if vanilla {
                        "—".to_string()
                    } else {
                        opt(v.preempted_pct.map(|p| format!("{p:.2}")))
                    },
                    opt(v.kernel_contentions),
                    v.guest_locks_repeats,
                    ms.repeats
                );
            }
        }
    }

    let avoided_rows: Vec<_> = r
        .cases
        .iter()
        .flat_map(|c| c.avoided.iter().map(move |a| (c, a)))
        .collect();
    if !avoided_rows.is_empty() {
        let _ = writeln!(
            o,
            "\n## Holder preemptions avoided (guest counters, whole run)\n"
        );
        let _ = writeln!(
            o,
            "| case | VM | pvsched-nolock: preempted / contentions | % | pvsched-lock: preempted / contentions | % | avoided |"
        );
        let _ = writeln!(o, "|---|---|--:|--:|--:|--:|--:|");
        for (c, a) in avoided_rows {
            let _ = writeln!(
                o,
                "| {} | {} | {} / {} | {} | {} / {} | {} | {} |",
                c.case,
                a.vm,
                a.without.preempted,
                a.without.contended,
                opt(a.without_pct.map(|p| format!("{p:.2}"))),
                a.with.preempted,
                a.with.contended,
                opt(a.with_pct.map(|p| format!("{p:.2}"))),
                opt(a.avoided_pct.map(|p| format!("{p:.1} %")))
            );
        }
    }

    let daemon_rows: Vec<_> = r
        .cases
        .iter()
        .flat_map(|c| {
            ordered(&c.modes).into_iter().flat_map(move |(mode, ms)| {
                ms.vms
                    .iter()
                    .filter_map(move |v| v.daemon.as_ref().map(|d| (c, mode, v, d)))
            })
        })
        .collect();
    if !daemon_rows.is_empty() {
        let _ = writeln!(
            o,
            "\n## pvschedd's lock counters over the windows (sums over the repeats)\n\n\
             Extensions at the preemption: a wait already named the vCPU when the host \
             preempted it (a host scheduler that asked the guest before preempting, as \
             eCS's does, could have kept it on its CPU instead). The others began with \
             a wait pvschedd saw only after the preemption: nothing but a reaction can \
             serve those.\n"
        );
        let _ = writeln!(
            o,
            "| case | mode | VM | contentions | holder preempted | extensions | at the preemption | refused (debt) | preemptions avoided | extended ms | repaid ms | debt ms at the ends |"
        );
        let _ = writeln!(o, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
        for (c, mode, v, d) in daemon_rows {
            let at = if d.extensions > 0 {
                format!(
                    "{} ({:.0} %)",
                    d.extensions_at_preemption,
                    d.extensions_at_preemption as f64 / d.extensions as f64 * 100.0
                )
            } else {
                d.extensions_at_preemption.to_string()
            };
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} |",
                c.case,
                mode,
                v.name,
                d.contentions,
                d.holder_preempted,
                d.extensions,
                at,
                d.extensions_refused,
                d.preemptions_avoided,
                d.extended_ms,
                d.repaid_ms,
                d.debt_ms_at_end
            );
        }
    }

    let _ = writeln!(
        o,
        "\n## Work per CPU-second of the VMs\n\n\
         The VMs' summed ops/s over the CPUs their QEMU processes used (only the VMs \
         that ran the workload), per repeat: median [min-max].\n"
    );
    let _ = writeln!(o, "| case | mode | ops per CPU-second | per repeat |");
    let _ = writeln!(o, "|---|---|--:|---|");
    for c in &r.cases {
        for (mode, ms) in ordered(&c.modes) {
            if let Some(e) = &ms.ops_per_cpu_s {
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} |",
                    c.case,
                    mode,
                    spread(e, 0),
                    list(&e.per_repeat, 0)
                );
            }
        }
    }
    if let Some(e) = &r.efficiency {
        let _ = writeln!(
            o,
            "\nVanilla alone did {:.0} ops per CPU-second, overcommitted {:.0}: \
             {:.2}x. Overcommitted, the machine is full and each mode gets the VMs \
             their CPU time, so lock handling raises their throughput only as far as it \
             raises their work per CPU-second: at the alone rate they would do {:.2}x \
             of vanilla's throughput.",
            e.alone, e.overcommitted, e.alone_over_overcommitted, e.alone_over_overcommitted
        );
    }

    let _ = writeln!(
        o,
        "\n## CPU time of the VMs over the windows (QEMU utime + stime)\n"
    );
    let _ = writeln!(
        o,
        "| case | mode | VM | CPU-s per window | % of the machine | share of the VMs' CPU % | per repeat | worst deviation from equal, per repeat % |"
    );
    let _ = writeln!(o, "|---|---|---|--:|--:|--:|---|---|");
    for c in &r.cases {
        for (mode, ms) in ordered(&c.modes) {
            for (i, v) in ms.vms.iter().enumerate() {
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {} | {} | {} | {} |",
                    c.case,
                    mode,
                    v.name,
                    spread(&v.cpu_s, 2),
                    spread(&v.cpu_pct_of_machine, 1),
                    spread(&v.cpu_split_pct, 1),
                    list(&v.cpu_split_pct.per_repeat, 1),
                    if i == 0 {
                        ms.split_deviation_pct
                            .as_ref()
                            .map(|s| list(&s.per_repeat, 1))
                            .unwrap_or_default()
                    } else {
                        String::new()
                    }
                );
            }
        }
    }

    let _ = writeln!(
        o,
        "\n## Where the machine went (over the windows)\n\n\
         Per mode, median [min-max] over the repeats, percent of the machine: busy \
         (/proc/stat), the VMs' QEMU processes, pvschedd's own process (utime + stime); \
         what busy leaves beside them is the kernel's threads, the bench and other jobs. \
         pvschedd's event-thread wakeups per second by cause and the BPF records it read \
         (those queued without a wakeup in brackets), pooled over the windows.\n"
    );
    let _ = writeln!(
        o,
        "| case | mode | machine busy % | VMs % | pvschedd % | pvschedd wakeups/s: records / timer / doorbell | BPF records/s (quiet) |"
    );
    let _ = writeln!(o, "|---|---|--:|--:|--:|---|--:|");
    for c in &r.cases {
        for (mode, ms) in ordered(&c.modes) {
            let d = |k: &str| {
                ms.daemon_per_s
                    .get(k)
                    .map(|v| format!("{v:.0}"))
                    .unwrap_or_default()
            };
            let wakeups = if ms.daemon_per_s.is_empty() {
                String::new()
            } else {
                format!(
                    "{} / {} / {}",
                    d("wakeups_records"),
                    d("wakeups_timer"),
                    d("wakeups_doorbell")
                )
            };
            let records = if ms.daemon_per_s.is_empty() {
                String::new()
            } else {
                format!("{} ({})", d("bpf_records"), d("bpf_lazy_records"))
            };
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} |",
                c.case,
                mode,
                opt_spread(&ms.machine_busy_pct, 1),
                opt_spread(&ms.vms_pct, 1),
                opt_spread(&ms.daemon_pct, 2),
                wakeups,
                records
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

    /// A VM's part of a phase: `ops_per_s` (None: idle), CPU-seconds, guest
    /// counters (contended, preempted).
    fn vm(name: &str, ops: Option<f64>, cpu_s: f64, locks: Option<(u64, u64)>) -> VmPhase {
        VmPhase {
            name: name.into(),
            ran: ops.is_some(),
            result: ops.map(|o| LockstressResult {
                workload: "rename".into(),
                threads: 4,
                cpus: 2,
                ops: (o * 10.0) as u64,
                ops_per_s: o,
                elapsed_s: 10.0,
                per_s: vec![],
                thread_ops_min: 90,
                thread_ops_max: 100,
                failed: false,
            }),
            cpu_s,
            lock_wait: locks.is_some(),
            guest_locks: locks.map(|(c, p)| GuestLocks {
                contended: c,
                preempted: p,
            }),
            kernel_contentions: ops.map(|_| 1000),
            daemon: None,
        }
    }

    fn phase(case: LockCase, mode: LockMode, rep: usize, vms: Vec<VmPhase>) -> Phase {
        Phase {
            case,
            mode,
            rep,
            window_s: 10.0,
            host_cpus: 2,
            foreign_cpu: 0.01,
            vms,
            machine_busy: None,
            daemon_cpu_s: None,
            daemon_counters: BTreeMap::new(),
        }
    }

    fn raw(phases: Vec<Phase>) -> LocksRaw {
        LocksRaw {
            scenario: "locks".into(),
            meta: LocksMeta {
                base: Meta {
                    repeat: 2,
                    duration_s: 10,
                    ..Default::default()
                },
                definitions: DEFINITIONS.iter().map(|d| d.to_string()).collect(),
                ..Default::default()
            },
            cases: LockCase::ALL.to_vec(),
            modes: LockMode::ALL.to_vec(),
            phases,
            sessions: vec![],
        }
    }

    /// Overcommitted, two repeats; hand-made numbers:
    /// vanilla:        A 100, 120  B 100, 80   (both 200, 200)
    /// pvsched-nolock: A 110, 120  B  90, 100  (both 200, 220)
    /// pvsched-lock:   A 130, 150  B 130, 110  (both 260, 260)
    /// guest counters (contended, preempted), per VM per repeat:
    /// nolock: A (1000, 200), (1000, 300)   B (500, 100), (500, 0)
    /// lock:   A (1000, 20),  (1000, 10)    B (1000, 30), (1000, 0)
    /// CPU-s: vanilla 9 / 11 and 10 / 10; lock 10.4 / 9.6 and 10 / 10.
    fn sample() -> LocksReport {
        use LockCase::Overcommitted as O;
        use LockMode::*;
        build(&raw(vec![
            phase(
                O,
                Vanilla,
                1,
                vec![
                    vm(VM_A, Some(100.0), 9.0, Some((800, 0))),
                    vm(VM_B, Some(100.0), 11.0, Some((800, 0))),
                ],
            ),
            phase(
                O,
                PvschedNolock,
                1,
                vec![
                    vm(VM_A, Some(110.0), 10.0, Some((1000, 200))),
                    vm(VM_B, Some(90.0), 10.0, Some((500, 100))),
                ],
            ),
            phase(
                O,
                PvschedLock,
                1,
                vec![
                    vm(VM_A, Some(130.0), 10.4, Some((1000, 20))),
                    vm(VM_B, Some(130.0), 9.6, Some((1000, 30))),
                ],
            ),
            phase(
                O,
                PvschedLock,
                2,
                vec![
                    vm(VM_A, Some(150.0), 10.0, Some((1000, 10))),
                    vm(VM_B, Some(110.0), 10.0, Some((1000, 0))),
                ],
            ),
            phase(
                O,
                Vanilla,
                2,
                vec![
                    vm(VM_A, Some(120.0), 10.0, Some((800, 0))),
                    vm(VM_B, Some(80.0), 10.0, Some((800, 0))),
                ],
            ),
            phase(
                O,
                PvschedNolock,
                2,
                vec![
                    vm(VM_A, Some(120.0), 10.0, Some((1000, 300))),
                    vm(VM_B, Some(100.0), 10.0, Some((500, 0))),
                ],
            ),
        ]))
    }

    fn ratio<'a>(r: &'a LocksReport, vm: &str, mode: LockMode) -> &'a Spread {
        &r.cases[0]
            .ratios
            .iter()
            .find(|x| x.vm == vm && x.mode == mode.name())
            .unwrap()
            .ratio
    }

    #[test]
    fn names_round_trip() {
        for m in LockMode::ALL {
            assert_eq!(m.name().parse::<LockMode>().unwrap(), m);
            assert_eq!(serde_json::to_value(m).unwrap(), m.name());
        }
        for c in LockCase::ALL {
            assert_eq!(c.name().parse::<LockCase>().unwrap(), c);
        }
        for w in Workload::ALL {
            assert_eq!(w.name().parse::<Workload>().unwrap(), w);
        }
        assert!("pvsched".parse::<LockMode>().is_err());
        assert_eq!(LockMode::PvschedNolock.honor_lock_holders(), Some(false));
        assert_eq!(LockMode::Vanilla.honor_lock_holders(), None);
        assert!(LockCase::Alone.runs(VM_A) && !LockCase::Alone.runs(VM_B));
    }

    #[test]
    fn ratios_pair_the_repeats_and_sum_the_vms() {
        // Act
        let r = sample();

        // Assert: both: 260/200 = 1.3 in each repeat.
        let both = ratio(&r, "both", LockMode::PvschedLock);
        assert_eq!(both.per_repeat, vec![1.3, 1.3]);
        assert_eq!((both.median, both.min, both.max), (1.3, 1.3, 1.3));
        // nolock: 200/200 = 1.0, 220/200 = 1.1 -> median 1.05.
        let nolock = ratio(&r, "both", LockMode::PvschedNolock);
        assert_eq!(nolock.per_repeat, vec![1.0, 1.1]);
        assert!((nolock.median - 1.05).abs() < 1e-9);
        // A: 130/100 = 1.3, 150/120 = 1.25; B: 1.3, 110/80 = 1.375.
        assert_eq!(
            ratio(&r, VM_A, LockMode::PvschedLock).per_repeat,
            vec![1.3, 1.25]
        );
        assert_eq!(
            ratio(&r, VM_B, LockMode::PvschedLock).per_repeat,
            vec![1.3, 1.375]
        );
    }

    #[test]
    fn avoided_share_compares_the_rates_over_the_whole_run() {
        // Act
        let r = sample();

        // Assert: both VMs: without 600 / 3000 = 20 %; with 60 / 4000 =
        // 1.5 %; avoided 1 - 1.5 / 20 = 92.5 %.
        let a = &r.cases[0].avoided;
        assert_eq!(a[0].vm, "both");
        assert_eq!(
            a[0].without,
            GuestLocks {
                contended: 3000,
                preempted: 600
            }
        );
        assert_eq!(a[0].without_pct, Some(20.0));
        assert_eq!(a[0].with_pct, Some(1.5));
        assert_eq!(a[0].avoided_pct, Some(92.5));
        // A alone: 500 / 2000 = 25 % vs 30 / 2000 = 1.5 %: 94 %.
        assert_eq!(a[1].vm, VM_A);
        assert_eq!(a[1].avoided_pct, Some(94.0));
        // B: 100 / 1000 = 10 % vs 30 / 2000 = 1.5 %: 85 %.
        assert_eq!(a[2].avoided_pct, Some(85.0));
    }

    #[test]
    fn avoided_is_none_without_preemptions_to_avoid() {
        let g = |c, p| GuestLocks {
            contended: c,
            preempted: p,
        };
        assert_eq!(avoided(g(100, 0), g(100, 0)), None);
        assert_eq!(avoided(g(0, 0), g(100, 1)), None);
        assert_eq!(avoided(g(100, 10), g(0, 0)), None);
        // More preempted with lock handling: a negative share.
        assert_eq!(avoided(g(100, 10), g(100, 20)), Some(-1.0));
    }

    #[test]
    fn cpu_split_and_its_deviation_from_equal() {
        // Arrange: 10.4 / 9.6 CPU-s: 52 % / 48 %: 4 % off the equal split.
        let p = phase(
            LockCase::Overcommitted,
            LockMode::PvschedLock,
            1,
            vec![
                vm(VM_A, Some(1.0), 10.4, None),
                vm(VM_B, Some(1.0), 9.6, None),
            ],
        );

        // Act / Assert
        let split = p.cpu_split().unwrap();
        assert!((split[0] - 0.52).abs() < 1e-9 && (split[1] - 0.48).abs() < 1e-9);
        assert!((p.split_deviation_pct().unwrap() - 4.0).abs() < 1e-9);
        let idle = phase(
            LockCase::Alone,
            LockMode::Vanilla,
            1,
            vec![vm(VM_A, Some(1.0), 0.0, None), vm(VM_B, None, 0.0, None)],
        );
        assert_eq!(idle.cpu_split(), None);
    }

    #[test]
    fn summaries_keep_each_repeat_and_the_machine_share() {
        // Act
        let r = sample();

        // Assert
        let v = &r.cases[0].modes["vanilla"];
        assert_eq!(v.repeats, 2);
        assert_eq!(
            v.total_ops_per_s.as_ref().unwrap().per_repeat,
            vec![200.0, 200.0]
        );
        // Repeat 1: 9 / 11 CPU-s: 45 / 55 %: 10 % off; repeat 2: 0 %.
        assert_eq!(
            v.split_deviation_pct.as_ref().unwrap().per_repeat,
            vec![10.0, 0.0]
        );
        let a = &v.vms[0];
        assert_eq!(a.name, VM_A);
        assert_eq!(a.cpu_split_pct.per_repeat, vec![45.0, 50.0]);
        // 9 CPU-s of 10 s x 2 CPUs: 45 % of the machine.
        assert_eq!(a.cpu_pct_of_machine.per_repeat, vec![45.0, 50.0]);
        assert_eq!(a.thread_evenness, Some(0.9));
        assert_eq!(a.kernel_contentions, Some(2000));
        // 1600 guest contentions over 20 s of windows.
        assert_eq!(a.contentions_per_s, Some(80.0));
        let lock = &r.cases[0].modes["pvsched-lock"].vms[0];
        assert_eq!(lock.preempted_pct, Some(1.5));
    }

    #[test]
    fn targets_read_the_overcommitted_case() {
        // Act
        let r = sample();

        // Assert: 1.3x >= 1.2x met; 92.5 % >= 85 % met; worst deviation of
        // pvsched-lock 4 % <= 5 % met.
        assert_eq!(r.targets.len(), 3);
        assert_eq!(r.targets[0].value, Some(1.3));
        assert_eq!(r.targets[1].value, Some(92.5));
        assert_eq!(r.targets[2].value, Some(4.0));
        assert!(
            r.targets.iter().all(|t| t.met == Some(true)),
            "{:?}",
            r.targets
        );
        assert!(r.targets[0].verdict().starts_with("met (1.30x"));
    }

    #[test]
    fn a_missing_mode_leaves_its_target_unmeasured() {
        // Arrange: vanilla only.
        let r = build(&raw(vec![phase(
            LockCase::Overcommitted,
            LockMode::Vanilla,
            1,
            vec![
                vm(VM_A, Some(100.0), 10.0, None),
                vm(VM_B, Some(100.0), 10.0, None),
            ],
        )]));

        // Assert
        assert!(r
            .targets
            .iter()
            .all(|t| t.value.is_none() && t.met.is_none()));
        assert!(r.targets[0].verdict().starts_with("not measured"));
        assert!(r.cases[0].ratios.is_empty() && r.cases[0].avoided.is_empty());
    }

    #[test]
    fn a_missed_target_says_so() {
        let t = LockTarget {
            what: "x".into(),
            value: Some(7.5),
            limit: 5.0,
            unit: "%<=".into(),
            met: Some(false),
            why: String::new(),
        };
        assert_eq!(t.verdict(), "MISSED (7.5 %, target <= 5.0 %)");
    }

    #[test]
    fn the_alone_case_compares_one_vm_and_ignores_the_idle_one() {
        // Arrange
        use LockCase::Alone as A;
        let r = build(&raw(vec![
            phase(
                A,
                LockMode::Vanilla,
                1,
                vec![vm(VM_A, Some(200.0), 19.0, None), vm(VM_B, None, 1.0, None)],
            ),
            phase(
                A,
                LockMode::PvschedLock,
                1,
                vec![vm(VM_A, Some(210.0), 19.0, None), vm(VM_B, None, 1.0, None)],
            ),
        ]));

        // Assert: no `both`; A 210 / 200.
        let c = &r.cases[0];
        assert_eq!(c.case, "alone");
        assert_eq!(c.ratios.len(), 1);
        assert_eq!(c.ratios[0].vm, VM_A);
        assert_eq!(c.ratios[0].ratio.per_repeat, vec![1.05]);
        assert_eq!(
            c.modes["vanilla"]
                .total_ops_per_s
                .as_ref()
                .unwrap()
                .per_repeat,
            vec![200.0]
        );
        assert!(
            markdown(&r).contains("| alone | vanilla | — |  | lock-a | 200 |"),
            "{}",
            markdown(&r)
        );
        // The targets are the overcommitted case's.
        assert!(r.targets.iter().all(|t| t.value.is_none()));
    }

    #[test]
    fn counters_between_two_readings_restart_with_the_module() {
        let g = |c, p| GuestLocks {
            contended: c,
            preempted: p,
        };
        assert_eq!(GuestLocks::between(&g(10, 2), &g(30, 5)), g(20, 3));
        assert_eq!(GuestLocks::between(&g(10, 2), &g(4, 1)), g(4, 1));
    }

    #[test]
    fn work_per_cpu_second_counts_the_vms_that_ran_and_compares_alone_with_overcommitted() {
        // Arrange: vanilla overcommitted, both VMs at 100 ops/s on 10 CPU-s each over 10 s
        // (2 CPUs: 100 ops per CPU-s); alone, lock-a at 300 ops/s on 15 CPU-s (1.5 CPUs:
        // 200 per CPU-s) beside an idle lock-b whose 0.5 CPU-s do not count.
        use LockCase::{Alone, Overcommitted};
        let over = phase(
            Overcommitted,
            LockMode::Vanilla,
            1,
            vec![
                vm(VM_A, Some(100.0), 10.0, None),
                vm(VM_B, Some(100.0), 10.0, None),
            ],
        );
        let alone = phase(
            Alone,
            LockMode::Vanilla,
            1,
            vec![vm(VM_A, Some(300.0), 15.0, None), vm(VM_B, None, 0.5, None)],
        );

        // Act
        let r = build(&raw(vec![over.clone(), alone.clone()]));
        let only_over = build(&raw(vec![over.clone()]));

        // Assert
        assert_eq!(over.ops_per_cpu_s(), Some(100.0));
        assert_eq!(alone.ops_per_cpu_s(), Some(200.0));
        let e = r.efficiency.as_ref().expect("both cases have vanilla");
        assert_eq!(
            (e.alone, e.overcommitted, e.alone_over_overcommitted),
            (200.0, 100.0, 2.0)
        );
        assert!(only_over.efficiency.is_none());
        let md = markdown(&r);
        assert!(md.contains("| alone | vanilla | 200 | 200 |"), "{md}");
        assert!(
            md.contains("at the alone rate they would do 2.00x of vanilla's throughput"),
            "{md}"
        );
    }

    #[test]
    fn daemon_counters_between_two_statuses_are_differences() {
        // Arrange
        let status = |generation: u64, contentions: u64, extended: f64| -> VmStatus {
            let v = serde_json::json!({
                "name": VM_A, "tgid": 1, "accel": "tcg", "region": "/r",
                "generation": generation, "guest_bound": true, "in_debt": false, "debt_ms": 0.0,
                "boosts": 0, "throttles": 0, "clamped_inputs": 0, "boosted_s": 0.0,
                "locks": { "contentions": contentions, "holder_preempted": contentions / 10,
                           "extensions": contentions / 20,
                           "extensions_at_preemption": contentions / 50, "extensions_refused": 1,
                           "preemptions_avoided": contentions / 40, "extended_ms": extended,
                           "repaid_ms": extended / 2.0, "debt_ms": 0.5 },
                "vcpus": [], "latency_path": []
            });
            serde_json::from_value(v).unwrap()
        };

        // Act
        let same = DaemonLocks::between(&status(1, 100, 2.0), &status(1, 500, 6.0));
        let anew = DaemonLocks::between(&status(1, 100, 2.0), &status(2, 40, 1.0));

        // Assert
        assert_eq!(
            (same.contentions, same.holder_preempted, same.extensions),
            (400, 40, 20)
        );
        assert_eq!(same.preemptions_avoided, 10);
        assert_eq!(same.extensions_at_preemption, 8);
        assert_eq!((same.extended_ms, same.repaid_ms), (4.0, 2.0));
        assert_eq!(same.extensions_refused, 0);
        assert_eq!(same.debt_ms_at_end, 0.5);
        assert_eq!((anew.contentions, anew.extended_ms), (40, 1.0));
    }

    #[test]
    fn markdown_shows_the_targets_the_tables_and_the_definitions() {
        let md = markdown(&sample());
        for needle in [
            "## Targets (reported, not asserted)",
            "| overcommitted | pvsched-lock | 260 [260-260] | 260, 260 | lock-a | 140 [130-150] |",
            "| overcommitted | both | pvsched-lock / vanilla | 1.30x [1.30-1.30] | 1.300, 1.300 |",
            "| overcommitted | both | 600 / 3000 | 20.00 | 60 / 4000 | 1.50 | 92.5 % |",
            "| overcommitted | vanilla | lock-a | 1600 | 80 | — (no host halves) | — |",
            "| overcommitted | vanilla | lock-a | 9.50 [9.00-10.00] | 47.5 [45.0-50.0] | 47.5 [45.0-50.0] | 45.0, 50.0 | 10.0, 0.0 |",
            "Holder preemptions avoided = 1 -",
        ] {
            assert!(md.contains(needle), "{needle:?} not in\n{md}");
        }
    }

    #[test]
    fn the_machine_table_splits_busy_time_and_gives_the_daemons_wakeups_per_second() {
        // Arrange: two pvsched-lock repeats of 10 s on 2 CPUs (20 CPU-s
        // each); the VMs use 9 + 8 and 8 + 8 CPU-s, pvschedd 0.6 and 0.4;
        // 3000 then 1000 record wakeups, 100 timer wakeups in the first only.
        use LockCase::Overcommitted as O;
        use LockMode::*;
        let with = |rep, a, b, busy, daemon: f64, counters: &[(&str, f64)]| {
            let mut p = phase(
                O,
                PvschedLock,
                rep,
                vec![vm(VM_A, Some(1.0), a, None), vm(VM_B, Some(1.0), b, None)],
            );
            p.machine_busy = Some(busy);
            p.daemon_cpu_s = Some(daemon);
            p.daemon_counters = counters.iter().map(|(k, v)| (k.to_string(), *v)).collect();
            p
        };
        let mut vanilla = phase(
            O,
            Vanilla,
            1,
            vec![
                vm(VM_A, Some(1.0), 10.0, None),
                vm(VM_B, Some(1.0), 9.8, None),
            ],
        );
        vanilla.machine_busy = Some(1.0);
        let r = build(&raw(vec![
            vanilla,
            with(
                1,
                9.0,
                8.0,
                0.95,
                0.6,
                &[("wakeups_records", 3000.0), ("wakeups_timer", 100.0)],
            ),
            with(2, 8.0, 8.0, 0.9, 0.4, &[("wakeups_records", 1000.0)]),
        ]));

        // Act
        let md = markdown(&r);

        // Assert: VMs 85 and 80 %, pvschedd 3 and 2 %; record wakeups
        // 4000 over 20 s, timer wakeups 100 over the 10 s that counted them.
        for needle in [
            "## Where the machine went (over the windows)",
            "| overcommitted | vanilla | 100.0 | 99.0 | n/a |  |  |",
            "| overcommitted | pvsched-lock | 92.5 [90.0-95.0] | 82.5 [80.0-85.0] | 2.50 [2.00-3.00] | 200 / 10 /  |",
        ] {
            assert!(md.contains(needle), "{needle:?} not in\n{md}");
        }
    }

    #[test]
    fn raw_round_trips_through_json() {
        // Arrange
        let r = raw(vec![phase(
            LockCase::Overcommitted,
            LockMode::PvschedLock,
            1,
            vec![vm(VM_A, Some(5.0), 1.0, Some((3, 1)))],
        )]);

        // Act
        let text = serde_json::to_string(&r).unwrap();
        let back: LocksRaw = serde_json::from_str(&text).unwrap();

        // Assert
        assert!(text.contains("\"mode\":\"pvsched-lock\""));
        assert_eq!(back.phases, r.phases);
    }
}
