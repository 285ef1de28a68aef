//! What runs in the lock scenario's guests and what it says: lockstress with
//! the kernel's contention count around it, the guests' own lock counters
//! read from their regions, and each mode's pvschedd settings.

use std::time::Duration;

use pvsched_abi::F_LOCK_WAIT;
use pvsched_vmtest::guest_status::GUEST_STATUS_PATH;
use pvsched_vmtest::Vm;

use super::model::*;
use crate::daemon::overlay_set;
use crate::error::Result;
use crate::guest as gp;

/// The guest kernel's lock contention tracepoint (tracefs under debugfs).
pub const TRACEPOINT: &str = "/sys/kernel/debug/tracing/events/lock/contention_begin";

/// The guest command that counts every `lock:contention_begin` with a hist
/// trigger (keyed by the lock flags); prints `trigger ok` when it is set.
pub fn trigger_cmd() -> String {
    format!(
        "echo 'hist:keys=flags' > {TRACEPOINT}/trigger && grep -q 'hist:keys=flags' \
         {TRACEPOINT}/trigger && echo 'trigger ok'"
    )
}

/// Marks the trigger's total before and after the workload.
const HITS: [&str; 2] = ["LOCKHITS0", "LOCKHITS1"];

/// Marks the guest module's lock-list counters before and after it.
const HELD: [&str; 2] = ["LOCKHELD0", "LOCKHELD1"];

/// The guest module's `held_*` counters, in [`GuestHeld`]'s order, summed
/// over the CPUs of its debugfs status (zeros without the module).
fn held_cmd(mark: &str) -> String {
    format!(
        "echo \"{mark} $(awk '{{for (i = 1; i <= NF; i++) {{n = index($i, \"=\"); \
         s[substr($i, 1, n - 1)] += substr($i, n + 1)}}}} END {{print s[\"held_takes\"] + 0, \
         s[\"held_releases\"] + 0, s[\"held_unmatched\"] + 0, s[\"held_user_resets\"] + 0, \
         s[\"held_dropped\"] + 0, s[\"held_uncontended\"] + 0}}' {GUEST_STATUS_PATH} \
         2>/dev/null)\""
    )
}

/// The lockstress command line (`secs` seconds).
pub fn lockstress_args(secs: u64, workload: Workload, threads: u32) -> String {
    let mut c = format!("lockstress -d {secs} -w {workload}");
    if threads > 0 {
        c.push_str(&format!(" -t {threads}"));
    }
    c
}

/// The guest command: the trigger's total, lockstress, the total again.
pub fn lockstress_cmd(secs: u64, workload: Workload, threads: u32) -> String {
    let hits = |mark: &str| {
        format!("echo \"{mark} $(awk '/Hits:/{{print $2}}' {TRACEPOINT}/hist 2>/dev/null)\"")
    };
    format!(
        "{}; {}; {}; rc=$?; {}; {}; exit $rc",
        hits(HITS[0]),
        held_cmd(HELD[0]),
        lockstress_args(secs, workload, threads),
        hits(HITS[1]),
        held_cmd(HELD[1])
    )
}

/// What the guest command printed: lockstress's result, the kernel's
/// contentions meanwhile (None when the trigger's totals are missing) and
/// the guest module's lock lists meanwhile (None when missing).
#[derive(Clone, Debug, PartialEq)]
pub struct RunOutput {
    pub result: LockstressResult,
    pub kernel_contentions: Option<u64>,
    pub held: Option<GuestHeld>,
}

/// The guest command's output, parsed.
pub fn parse_run(out: &str) -> Result<RunOutput> {
    let result: LockstressResult = gp::parse_line("lockstress", out)?;
    let hits = |mark: &str| -> Option<u64> {
        out.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(mark))
            .and_then(|rest| rest.trim().parse().ok())
    };
    let kernel = match (hits(HITS[0]), hits(HITS[1])) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    let held_at = |mark: &str| {
        out.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(mark))
            .and_then(GuestHeld::parse)
    };
    let held = match (held_at(HELD[0]), held_at(HELD[1])) {
        (Some(a), Some(b)) => GuestHeld::between(&a, &b),
        _ => None,
    };
    Ok(RunOutput {
        result,
        kernel_contentions: kernel,
        held,
    })
}

/// The overlay of a pvsched mode: `--pvschedd-config`'s, with the mode's
/// `[daemon] backend`, `[defaults] honor_lock_holders` and, where the mode
/// fixes it, `[daemon] scx_extension_us` (the mode's values win; a
/// `scx_extension_us` the mode leaves open stays the user's, else the
/// daemon's default).
pub fn mode_overlay(overlay: &toml::Table, daemon: ModeDaemon) -> toml::Table {
    let mut o = overlay.clone();
    // Explicit even for rt, the generated config's default: the mode, not
    // the config, decides which backend is measured.
    overlay_set(&mut o, "daemon", "backend", daemon.backend.name().into());
    if let Some(us) = daemon.scx_extension_us {
        overlay_set(
            &mut o,
            "daemon",
            "scx_extension_us",
            saturating_i64(us).into(),
        );
    }
    overlay_set(
        &mut o,
        "defaults",
        "honor_lock_holders",
        daemon.honor_lock_holders.into(),
    );
    o
}

/// TOML integers are i64.
fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The journal's notes on `--pvschedd-config` settings the pvsched modes of
/// `modes` set themselves (the mode's value wins) or keep.
pub fn overlay_notes(overlay: &toml::Table, modes: &[LockMode]) -> Vec<String> {
    let sets = |section: &str, key: &str| overlay.get(section).and_then(|t| t.get(key));
    let with_daemon: Vec<(LockMode, ModeDaemon)> = modes
        .iter()
        .filter_map(|m| Some((*m, m.daemon()?)))
        .collect();
    let mut notes = Vec::new();
    if sets("defaults", "honor_lock_holders").is_some() {
        notes.push(
            "--pvschedd-config sets honor_lock_holders: each pvsched mode sets its own".into(),
        );
    }
    if let Some(backend) = sets("daemon", "backend").filter(|_| !with_daemon.is_empty()) {
        let each: Vec<String> = with_daemon
            .iter()
            .map(|(m, d)| format!("{m}: {}", d.backend))
            .collect();
        notes.push(format!(
            "--pvschedd-config sets [daemon] backend = {backend}: each pvsched mode sets its \
             own, which wins ({})",
            each.join(", ")
        ));
    }
    let scx: Vec<&(LockMode, ModeDaemon)> = with_daemon
        .iter()
        .filter(|(_, d)| d.backend == LockBackend::SchedExt)
        .collect();
    if let Some(us) = sets("daemon", "scx_extension_us").filter(|_| !scx.is_empty()) {
        let each: Vec<String> = scx
            .iter()
            .map(|(m, d)| match d.scx_extension_us {
                Some(own) => format!("{m} runs with its own {own}, which wins"),
                None => format!("{m} keeps the config's {us}"),
            })
            .collect();
        notes.push(format!(
            "--pvschedd-config sets [daemon] scx_extension_us = {us}: {}",
            each.join("; ")
        ));
    }
    notes
}

/// Whether the guest module accepted `F_LOCK_WAIT`, and its lock counters
/// summed over the slots (None: not accepted, or a slot not read).
pub(super) fn guest_locks(vm: &Vm, vcpus: u32) -> (bool, Option<GuestLocks>) {
    let Some(region) = vm.region() else {
        return (false, None);
    };
    let on = region.header().guest_features & F_LOCK_WAIT != 0;
    if !on {
        return (false, None);
    }
    let mut sum = GuestLocks::default();
    for slot in 0..vcpus {
        // A busy guest rewrites its half many times a millisecond: a
        // seqcount read can lose READ_RETRIES races in a row; try again.
        let read = (0..READ_TRIES).find_map(|i| {
            if i > 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
            region.read_guest(slot).ok()
        });
        match read {
            Some(g) => sum.add(&GuestLocks {
                contended: g.lock_contended_count,
                preempted: g.lock_preempted_count,
                named_contended: g.lock_named_contended_count,
                named_preempted: g.lock_named_preempted_count,
            }),
            None => return (true, None),
        }
    }
    (true, Some(sum))
}

/// Reads of a slot (each of `READ_RETRIES` seqcount tries) before its
/// counters count as unreadable for the window.
const READ_TRIES: u32 = 200;
