//! What the lock-holder scenario measures and keeps in raw.json: its modes,
//! cases and workloads, and per measurement each VM's lockstress result,
//! CPU time and lock counters (the guests' and pvschedd's).

use std::collections::BTreeMap;
use std::fmt;

use clap::ValueEnum;
use pvsched_control::VmStatus;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::harness::meta::Meta;
pub use crate::kvm_preemptions::KvmPreemptions;

/// The first VM: runs the workload in both cases.
pub const VM_A: &str = "lock-a";
/// The second VM: runs the workload in the overcommitted case, idles in `alone`.
pub const VM_B: &str = "lock-b";

/// What the report's derived figures mean (printed under the header and
/// kept in the JSON).
pub const DEFINITIONS: [&str; 6] = [
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
     and of those the ones whose holder's vCPU was preempted: for a named holder, KVM's \
     steal-time flag (the guest kernel's vcpu_is_preempted(), ABI 1.6) where the guest has \
     it, else the host half. Vanilla's is shown only where its guests have KVM's flag: \
     without it, and without host halves, a guest cannot see a preempted holder.",
    "Holder preemptions avoided = 1 - (holder-preempted contentions per contention with lock \
     handling) / (the same without), each rate summed over every repeat of the case (and over \
     both VMs for `both`); per backend: rt, pvsched-lock against pvsched-nolock; sched_ext, \
     pvsched-scx-lock against pvsched-scx-nolock; where vanilla's guests count (KVM's flag), \
     also each against vanilla.",
    "sched_ext extensions: the slice-end extensions the sched_ext scheduler granted the VM's \
     vCPUs over the window (a vCPU whose guest showed a critical section when its slice ended, \
     kept on its CPU for `scx_extension_us` more) and those it refused over their allowance, \
     `scx_extensions` and `scx_extensions_refused` of every vCPU in pvschedd's status, summed \
     per VM: a lock holder kept running at the moment it would have been preempted; of them, \
     those for a lock holder (another vCPU's published wait named it, `scx_lock_extensions`).",
];

/// pvschedd's `[daemon] backend`: the mechanism that carries its boosts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LockBackend {
    /// The RT class (`sched_setattr`); every run before the sched_ext
    /// modes, hence the default of a report row without a backend.
    #[default]
    #[serde(rename = "rt")]
    Rt,
    /// pvschedd's own sched_ext scheduler for the whole host.
    #[serde(rename = "sched_ext")]
    SchedExt,
}

impl LockBackend {
    /// The name pvschedd's config and status use.
    pub fn name(self) -> &'static str {
        match self {
            LockBackend::Rt => "rt",
            LockBackend::SchedExt => "sched_ext",
        }
    }

    /// For `skip_serializing_if`: rt rows stay as they were before the
    /// field existed, so old reports render again byte for byte.
    pub fn is_rt(&self) -> bool {
        *self == LockBackend::Rt
    }

    /// The pair of modes that measures lock handling on this backend:
    /// (without, with).
    pub fn lock_pair(self) -> (LockMode, LockMode) {
        match self {
            LockBackend::Rt => (LockMode::PvschedNolock, LockMode::PvschedLock),
            LockBackend::SchedExt => (LockMode::PvschedScxNolock, LockMode::PvschedScxLock),
        }
    }
}

impl fmt::Display for LockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What pvschedd runs with in a pvsched mode; the mode's values win over
/// `--pvschedd-config`'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModeDaemon {
    /// `[daemon] backend`.
    pub backend: LockBackend,
    /// `[defaults] honor_lock_holders`.
    pub honor_lock_holders: bool,
    /// `[daemon] scx_extension_us`; None: `--pvschedd-config`'s, else the
    /// daemon's default.
    pub scx_extension_us: Option<u64>,
}

/// How the host treats the VMs' vCPU threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LockMode {
    /// No daemon: plain CFS.
    Vanilla,
    /// pvschedd serving both VMs on the rt backend, `honor_lock_holders = false`.
    PvschedNolock,
    /// pvschedd serving both VMs on the rt backend, `honor_lock_holders = true`.
    PvschedLock,
    /// pvschedd serving both VMs on the sched_ext backend, no slice-end
    /// extension (`scx_extension_us = 0`), `honor_lock_holders = false`.
    PvschedScxNolock,
    /// pvschedd serving both VMs on the sched_ext backend, slice-end
    /// extensions at `scx_extension_us`, `honor_lock_holders = true`.
    PvschedScxLock,
}

impl LockMode {
    /// Every mode, in the order reports show them.
    pub const ALL: [LockMode; 5] = [
        LockMode::Vanilla,
        LockMode::PvschedNolock,
        LockMode::PvschedLock,
        LockMode::PvschedScxNolock,
        LockMode::PvschedScxLock,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LockMode::Vanilla => "vanilla",
            LockMode::PvschedNolock => "pvsched-nolock",
            LockMode::PvschedLock => "pvsched-lock",
            LockMode::PvschedScxNolock => "pvsched-scx-nolock",
            LockMode::PvschedScxLock => "pvsched-scx-lock",
        }
    }

    /// What pvschedd runs with in this mode; None: no daemon.
    pub fn daemon(self) -> Option<ModeDaemon> {
        let (backend, honor_lock_holders, scx_extension_us) = match self {
            LockMode::Vanilla => return None,
            LockMode::PvschedNolock => (LockBackend::Rt, false, None),
            LockMode::PvschedLock => (LockBackend::Rt, true, None),
            // No extension at all: the sched_ext scheduler alone, without
            // any lock handling, is what its lock handling is measured against.
            LockMode::PvschedScxNolock => (LockBackend::SchedExt, false, Some(0)),
            LockMode::PvschedScxLock => (LockBackend::SchedExt, true, None),
        };
        Some(ModeDaemon {
            backend,
            honor_lock_holders,
            scx_extension_us,
        })
    }

    /// The `honor_lock_holders` pvschedd runs with; None: no daemon.
    pub fn honor_lock_holders(self) -> Option<bool> {
        self.daemon().map(|d| d.honor_lock_holders)
    }

    /// pvschedd's backend in this mode; None: no daemon.
    pub fn backend(self) -> Option<LockBackend> {
        self.daemon().map(|d| d.backend)
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
            LockMode::PvschedScxNolock => {
                "pvschedd serving both VMs on the sched_ext backend, `scx_extension_us = 0`, \
                 `honor_lock_holders = false` (no lock-holder handling)"
            }
            LockMode::PvschedScxLock => {
                "pvschedd serving both VMs on the sched_ext backend, `honor_lock_holders = \
                 true` (a vCPU in a critical section extended at its slice end by \
                 `scx_extension_us`, preempted lock holders extended)"
            }
        }
    }
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which VMs run the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ValueEnum)]
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

/// The guest workload (`lockstress -w`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    Rename,
    Files,
    Write,
    Mmap,
    RenameOwn,
    Web,
}

impl Workload {
    pub const ALL: [Workload; 6] = [
        Workload::Rename,
        Workload::Files,
        Workload::Write,
        Workload::Mmap,
        Workload::RenameOwn,
        Workload::Web,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Rename => "rename",
            Workload::Files => "files",
            Workload::Write => "write",
            Workload::Mmap => "mmap",
            Workload::RenameOwn => "rename-own",
            Workload::Web => "web",
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
            Workload::Web => {
                "an application: BusyBox httpd, forking a process per connection, serves a \
                 4 KiB page on the loopback to a client per thread (HTTP/1.0): fork and exit \
                 (mmap_lock, the binary's i_mmap_rwsem), the accept queue, the file's \
                 lookups; one op = one request answered 200"
            }
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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

/// The guest module's lists of the locks its running tasks hold (lock
/// holders honoured, `F_LOCK_HOLD`): the `held_*` counters of its debugfs
/// status, summed over its CPUs. They say whether `CS_LOCK` tells the truth:
/// an unlock the hooks miss leaves a lock listed until a timer tick finds
/// the task in user mode (`user_resets`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestHeld {
    /// Lock calls listed (`held_takes`).
    pub takes: u64,
    /// Unlocks that found their lock listed (`held_releases`).
    pub releases: u64,
    /// Unlocks of a lock not listed: trylocks', takes passed over
    /// (`held_unmatched`).
    pub unmatched: u64,
    /// Lists found non-empty at a timer tick in user mode, and emptied
    /// (`held_user_resets`).
    pub user_resets: u64,
    /// Takes not listed, the list full (`held_dropped`).
    pub dropped: u64,
    /// Takes passed over while the host did not contend the vCPU
    /// (`held_uncontended`).
    pub uncontended: u64,
}

impl GuestHeld {
    /// The counters as the guest command prints them: six numbers in
    /// [`GuestHeld`]'s order.
    pub fn parse(fields: &str) -> Option<GuestHeld> {
        let n: Vec<u64> = fields
            .split_whitespace()
            .map(str::parse)
            .collect::<std::result::Result<_, _>>()
            .ok()?;
        let [takes, releases, unmatched, user_resets, dropped, uncontended] = n[..] else {
            return None;
        };
        Some(GuestHeld {
            takes,
            releases,
            unmatched,
            user_resets,
            dropped,
            uncontended,
        })
    }

    /// The counters between two readings; None when one went back (the
    /// module re-bound).
    pub fn between(before: &GuestHeld, after: &GuestHeld) -> Option<GuestHeld> {
        Some(GuestHeld {
            takes: after.takes.checked_sub(before.takes)?,
            releases: after.releases.checked_sub(before.releases)?,
            unmatched: after.unmatched.checked_sub(before.unmatched)?,
            user_resets: after.user_resets.checked_sub(before.user_resets)?,
            dropped: after.dropped.checked_sub(before.dropped)?,
            uncontended: after.uncontended.checked_sub(before.uncontended)?,
        })
    }

    pub fn add(&mut self, o: &GuestHeld) {
        self.takes += o.takes;
        self.releases += o.releases;
        self.unmatched += o.unmatched;
        self.user_resets += o.user_resets;
        self.dropped += o.dropped;
        self.uncontended += o.uncontended;
    }
}

/// A VM's guest lock counters (`F_LOCK_WAIT`), summed over its slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestLocks {
    /// `lock_contended_count`.
    pub contended: u64,
    /// `lock_preempted_count`.
    pub preempted: u64,
    /// `lock_named_contended_count` (ABI 1.7; 0 from older guests and in
    /// raw files from before it): the contentions whose lock named its
    /// holder, running on another vCPU.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub named_contended: u64,
    /// `lock_named_preempted_count`: of those, the holder's vCPU preempted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub named_preempted: u64,
}

impl GuestLocks {
    /// The counters between two readings: a counter that went back (the
    /// module re-bound, its counters restarted) gives what `after` shows.
    pub fn between(before: &GuestLocks, after: &GuestLocks) -> GuestLocks {
        let fresh = after.contended < before.contended
            || after.preempted < before.preempted
            || after.named_contended < before.named_contended
            || after.named_preempted < before.named_preempted;
        if fresh {
            *after
        } else {
            GuestLocks {
                contended: after.contended - before.contended,
                preempted: after.preempted - before.preempted,
                named_contended: after.named_contended - before.named_contended,
                named_preempted: after.named_preempted - before.named_preempted,
            }
        }
    }

    pub fn add(&mut self, other: &GuestLocks) {
        self.contended += other.contended;
        self.preempted += other.preempted;
        self.named_contended += other.named_contended;
        self.named_preempted += other.named_preempted;
    }

    /// Holder-preempted contentions per contention; None without contentions.
    pub fn preempted_rate(&self) -> Option<f64> {
        (self.contended > 0).then(|| self.preempted as f64 / self.contended as f64)
    }

    /// The named holders' part as counters of their own (their totals are
    /// the named ones); None where the guests counted none (before ABI 1.7).
    pub fn named(&self) -> Option<GuestLocks> {
        (self.named_contended > 0).then_some(GuestLocks {
            contended: self.named_contended,
            preempted: self.named_preempted,
            named_contended: 0,
            named_preempted: 0,
        })
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

/// The sched_ext scheduler's slice-end extensions of one VM's vCPUs over a
/// window (`scx_*` of every vCPU in pvschedd's status, summed; 0 on the rt
/// backend).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ScxExtensions {
    /// Extensions granted at a slice end (`scx_extensions`): the vCPU's
    /// guest showed a critical section when the scheduler would have
    /// preempted it.
    pub granted: u64,
    /// Refused over the vCPU's allowance (`scx_extensions_refused`).
    pub refused: u64,
    /// On-CPU time the granted extensions gave, ms (`scx_extended_ms`).
    pub extended_ms: f64,
    /// Of `granted`, those for a lock holder: a waiter's published wait
    /// named the vCPU (`scx_lock_extensions`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub for_lock_holder: u64,
    /// Of `for_lock_holder`, those at a preemption: a boosted vCPU would
    /// have preempted the holder and waited for the extension instead
    /// (`scx_lock_extensions_at_preemption`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub at_preemption: u64,
    /// vCPUs preempted while their guest showed a sleeping lock held, as
    /// the scheduler saw them (`scx_holder_preempted_*`): at the slice end
    /// after an extension, at a slice end without one, before the slice
    /// end. Only guests that publish `CS_LOCK` (lock holders honoured).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub holder_preempted_extended: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub holder_preempted_unextended: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub holder_preempted_early: u64,
    /// Of `granted`, those ended early at a lock-free point: a poll found
    /// the guest out of its critical section (`scx_extensions_ended_early`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ended_early: u64,
    /// Extensions that ran out with the guest still holding a lock and went
    /// on for a tail, and of those, the tails ended at a lock-free point
    /// (`scx_extension_tails`, `scx_extension_tails_ended_early`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tails: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tails_ended_early: u64,
    /// Of `granted`, those the guest ended itself, yielding at a point out
    /// of its locks (`scx_extension_yields`, `F_EXT_NOTICE`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub yielded: u64,
    /// Of `holder_preempted_early`, by what took the CPU (the scheduler's
    /// `enum pvs_scx_cut`, [`CUT_NAMES`]); empty for runs before the count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holder_preempted_early_by: Vec<u64>,
    /// Of those by pvschedd's event thread, the holders that ran again
    /// right after it for the rest of their slice (`scx_holders_resumed`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub holders_resumed: u64,
    /// How long the holders preempted waited to run again, ms, by how they
    /// were preempted (as the three counts above); 0 for runs before it.
    #[serde(default, skip_serializing_if = "is_zero_ms")]
    pub holder_preempted_extended_ms: f64,
    #[serde(default, skip_serializing_if = "is_zero_ms")]
    pub holder_preempted_unextended_ms: f64,
    #[serde(default, skip_serializing_if = "is_zero_ms")]
    pub holder_preempted_early_ms: f64,
}

/// What took a holder's CPU before its slice end, by the index of the
/// scheduler's `enum pvs_scx_cut` (intf.h).
pub const CUT_NAMES: [&str; 8] = [
    "a higher class or the kernel",
    "a boosted vCPU",
    "the boost queue's kick",
    "pvschedd's event thread",
    "a boost granted to a queued vCPU",
    "the extension's poll",
    "a wakeup preemption",
    "its guest's yield",
];

/// `into` += `add`, element by element (the longer length kept).
fn add_counts(into: &mut Vec<u64>, add: &[u64]) {
    if into.len() < add.len() {
        into.resize(add.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(add) {
        *a += b;
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero_ms(ms: &f64) -> bool {
    *ms == 0.0
}

impl ScxExtensions {
    /// The VM's counters in one status: its vCPUs' summed.
    pub fn of(status: &VmStatus) -> ScxExtensions {
        let mut sum = ScxExtensions::default();
        for c in &status.vcpus {
            sum.granted += c.scx_extensions;
            sum.refused += c.scx_extensions_refused;
            sum.extended_ms += c.scx_extended_ms;
            sum.for_lock_holder += c.scx_lock_extensions;
            sum.at_preemption += c.scx_lock_extensions_at_preemption;
            sum.holder_preempted_extended += c.scx_holder_preempted_extended;
            sum.holder_preempted_unextended += c.scx_holder_preempted_unextended;
            sum.holder_preempted_early += c.scx_holder_preempted_early;
            sum.ended_early += c.scx_extensions_ended_early;
            sum.tails += c.scx_extension_tails;
            sum.tails_ended_early += c.scx_extension_tails_ended_early;
            sum.yielded += c.scx_extension_yields;
            add_counts(
                &mut sum.holder_preempted_early_by,
                &c.scx_holder_preempted_early_by,
            );
            sum.holders_resumed += c.scx_holders_resumed;
            sum.holder_preempted_extended_ms += c.scx_holder_preempted_extended_ms;
            sum.holder_preempted_unextended_ms += c.scx_holder_preempted_unextended_ms;
            sum.holder_preempted_early_ms += c.scx_holder_preempted_early_ms;
        }
        sum
    }

    /// The counters between two statuses of the same VM. A VM served anew
    /// in between (another generation, or counters that went back) gives
    /// what `after` shows.
    pub fn between(before: &VmStatus, after: &VmStatus) -> ScxExtensions {
        let (b, a) = (ScxExtensions::of(before), ScxExtensions::of(after));
        let fresh =
            after.generation != before.generation || a.granted < b.granted || a.refused < b.refused;
        if fresh {
            return a;
        }
        ScxExtensions {
            granted: a.granted - b.granted,
            refused: a.refused - b.refused,
            extended_ms: (a.extended_ms - b.extended_ms).max(0.0),
            for_lock_holder: a.for_lock_holder.saturating_sub(b.for_lock_holder),
            at_preemption: a.at_preemption.saturating_sub(b.at_preemption),
            holder_preempted_extended: a
                .holder_preempted_extended
                .saturating_sub(b.holder_preempted_extended),
            holder_preempted_unextended: a
                .holder_preempted_unextended
                .saturating_sub(b.holder_preempted_unextended),
            holder_preempted_early: a
                .holder_preempted_early
                .saturating_sub(b.holder_preempted_early),
            ended_early: a.ended_early.saturating_sub(b.ended_early),
            tails: a.tails.saturating_sub(b.tails),
            tails_ended_early: a.tails_ended_early.saturating_sub(b.tails_ended_early),
            yielded: a.yielded.saturating_sub(b.yielded),
            holder_preempted_early_by: a
                .holder_preempted_early_by
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    n.saturating_sub(b.holder_preempted_early_by.get(i).copied().unwrap_or(0))
                })
                .collect(),
            holders_resumed: a.holders_resumed.saturating_sub(b.holders_resumed),
            holder_preempted_extended_ms: (a.holder_preempted_extended_ms
                - b.holder_preempted_extended_ms)
                .max(0.0),
            holder_preempted_unextended_ms: (a.holder_preempted_unextended_ms
                - b.holder_preempted_unextended_ms)
                .max(0.0),
            holder_preempted_early_ms: (a.holder_preempted_early_ms - b.holder_preempted_early_ms)
                .max(0.0),
        }
    }

    pub fn add(&mut self, o: &ScxExtensions) {
        self.granted += o.granted;
        self.refused += o.refused;
        self.extended_ms += o.extended_ms;
        self.for_lock_holder += o.for_lock_holder;
        self.at_preemption += o.at_preemption;
        self.holder_preempted_extended += o.holder_preempted_extended;
        self.holder_preempted_unextended += o.holder_preempted_unextended;
        self.holder_preempted_early += o.holder_preempted_early;
        self.ended_early += o.ended_early;
        self.tails += o.tails;
        self.tails_ended_early += o.tails_ended_early;
        self.yielded += o.yielded;
        add_counts(
            &mut self.holder_preempted_early_by,
            &o.holder_preempted_early_by,
        );
        self.holders_resumed += o.holders_resumed;
        self.holder_preempted_extended_ms += o.holder_preempted_extended_ms;
        self.holder_preempted_unextended_ms += o.holder_preempted_unextended_ms;
        self.holder_preempted_early_ms += o.holder_preempted_early_ms;
    }

    /// Holder preemptions the scheduler saw, however they came.
    pub fn holder_preempted(&self) -> u64 {
        self.holder_preempted_extended
            + self.holder_preempted_unextended
            + self.holder_preempted_early
    }

    /// Whether the scheduler granted or refused any.
    pub fn any(&self) -> bool {
        self.granted > 0 || self.refused > 0
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
    /// The guest module's lock lists during the workload (read around
    /// lockstress; None: idle, or from before they were read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_held: Option<GuestHeld>,
    /// pvschedd's lock counters over the window (pvsched modes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon: Option<DaemonLocks>,
    /// The sched_ext scheduler's slice-end extensions of the VM's vCPUs over
    /// the window (pvsched modes; None in raw files from before they were
    /// kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scx_extensions: Option<ScxExtensions>,
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
    /// The backend pvschedd served on at the end of the window
    /// (`backend.active` of its status: `rt` after the kernel ended the
    /// sched_ext scheduler; None: no daemon, or a raw file from before it
    /// was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_active: Option<String>,
    /// KVM's vCPU preemptions over the window, every vCPU of the host:
    /// those the guests' steal-time flag showed and those it did not
    /// (`crate::kvm_preemptions`; None: no KVM debugfs, or a raw file from
    /// before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kvm_preemptions: Option<KvmPreemptions>,
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
