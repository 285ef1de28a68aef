//! The lock-holder scenario (`--scenario locks`): two guests (2 vCPUs each
//! by default) on the host's CPUs, both running a lock-heavy guest workload
//! at once (`overcommitted`: more vCPUs than CPUs, so a lock holder's vCPU
//! gets preempted on the host while the other vCPU of its guest waits for
//! the lock), or the first alone (`alone`); per mode (`vanilla`, pvschedd
//! without and with lock-holder handling) the throughput of each guest, the
//! lock contentions and holder preemptions the guests counted, pvschedd's
//! lock counters, and each guest's CPU time over the window. Modes are
//! interleaved per repeat, their order rotated.
//!
//! Results: see `locks_report`.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pvsched_abi::F_LOCK_WAIT;
use pvsched_vmtest::{Accel, Vm};

use crate::daemon::daemon_counters;
use crate::daemon::pin_daemon;
use crate::daemon::{Binaries, Daemon, VmEntry};
use crate::error::{guest, io, BenchError, Result};
use crate::foreign;
use crate::guest as gp;
use crate::harness::axes::mode_order;
use crate::harness::disturbance::DISTURBED;
use crate::harness::journal::first_line;
use crate::harness::journal::{Journal, Journaled};
use crate::harness::meta::Meta;
use crate::harness::output::json;
use crate::harness::plan::{announce, listed};
use crate::harness::settings::Settings;
use crate::harness::start::{in_private_tmp, Start};
use crate::harness::vm::{boot_pair, Guest};
use crate::host::Machine;
use crate::locks_report::{
    self, DaemonLocks, GuestLocks, LockCase, LockMode, LocksMeta, LocksRaw, LocksReport,
    LockstressResult, Phase, SessionStatus, VmPhase, Workload, DEFINITIONS, VM_A, VM_B,
};
use crate::plot;
use crate::progress::Progress;

/// The standard settings plus what only this scenario has.
#[derive(Clone, Debug)]
pub struct LockSettings {
    /// out, repeat, duration (the workload's seconds per measurement),
    /// accel, smp, memory, pvschedd, its overlay, retries, doorbell and the
    /// command line; the rest is not used.
    pub base: Settings,
    pub cases: Vec<LockCase>,
    pub modes: Vec<LockMode>,
    pub workload: Workload,
    /// Threads per guest; 0: lockstress's default, 2 per vCPU.
    pub threads: u32,
}

/// Phases and nominal seconds of the whole run.
pub fn plan(s: &LockSettings) -> (usize, f64) {
    let phases = s.base.repeat * s.cases.len() * s.modes.len();
    (phases, phases as f64 * s.base.duration as f64)
}

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
        "{}; {}; rc=$?; {}; exit $rc",
        hits(HITS[0]),
        lockstress_args(secs, workload, threads),
        hits(HITS[1])
    )
}

/// lockstress's result and the kernel's contentions meanwhile (None when
/// the trigger's totals are missing) from the guest command's output.
pub fn parse_run(out: &str) -> Result<(LockstressResult, Option<u64>)> {
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
    Ok((result, kernel))
}

/// The overlay of a pvsched mode: `--pvschedd-config`'s, with the mode's
/// `honor_lock_holders` in `[defaults]` (the mode's value wins).
pub fn mode_overlay(overlay: &toml::Table, honor: bool) -> toml::Table {
    let mut o = overlay.clone();
    let defaults = o
        .entry("defaults")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let toml::Value::Table(t) = defaults {
        t.insert("honor_lock_holders".into(), honor.into());
    }
    o
}

/// Whether the guest module accepted `F_LOCK_WAIT`, and its lock counters
/// summed over the slots (None: not accepted, or a slot not read).
fn guest_locks(vm: &Vm, vcpus: u32) -> (bool, Option<GuestLocks>) {
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
            }),
            None => return (true, None),
        }
    }
    (true, Some(sum))
}

/// Reads of a slot (each of `READ_RETRIES` seqcount tries) before its
/// counters count as unreadable for the window.
const READ_TRIES: u32 = 200;

/// What the sampler reads at each end of the window.
struct Ends {
    at: Instant,
    ticks: Vec<u64>,
    locks: Vec<(bool, Option<GuestLocks>)>,
    status: BTreeMap<String, pvsched_control::VmStatus>,
    /// The machine's busy ticks.
    busy: Option<u64>,
    /// pvschedd's own ticks and its counters (pvsched modes).
    daemon_ticks: Option<u64>,
    daemon_counters: BTreeMap<String, f64>,
}

struct Bench<'a> {
    s: &'a LockSettings,
    /// [`VM_A`], [`VM_B`].
    guests: Vec<(&'static str, Guest)>,
    bins: Option<Binaries>,
    run_dir: PathBuf,
    raw_dir: PathBuf,
    host_cpus: usize,
    phases: Vec<Phase>,
    sessions: Vec<SessionStatus>,
    journal: Journal,
    progress: Progress,
    /// pvsched modes that could not be set up, and why.
    broken: BTreeMap<LockMode, String>,
}

impl Journaled for Bench<'_> {
    fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }
}

impl Bench<'_> {
    fn ends(&self, daemon: Option<&Daemon>) -> Ends {
        Ends {
            at: Instant::now(),
            ticks: self
                .guests
                .iter()
                .map(|(_, g)| foreign::process_ticks(g.vm.qemu_pid()).unwrap_or(0))
                .collect(),
            locks: self
                .guests
                .iter()
                .map(|(_, g)| guest_locks(&g.vm, g.cpus))
                .collect(),
            status: daemon
                .and_then(|d| d.status().ok())
                .map(|st| st.vms.into_iter().map(|v| (v.name.clone(), v)).collect())
                .unwrap_or_default(),
            busy: foreign::machine_busy_ticks(),
            daemon_ticks: daemon.and_then(|d| foreign::process_ticks(d.pid())),
            daemon_counters: daemon
                .and_then(|d| d.metrics_text().ok())
                .map(|t| daemon_counters(&t))
                .unwrap_or_default(),
        }
    }

    /// pvschedd serving both VMs with the mode's `honor_lock_holders` (over
    /// QMP; once more by thread names if that fails), or nothing for vanilla.
    fn apply(&mut self, mode: LockMode) -> Result<Option<Daemon>> {
        let Some(honor) = mode.honor_lock_holders() else {
            return Ok(None);
        };
        if let Some(why) = self.broken.get(&mode) {
            return Err(BenchError::PvschedUnavailable(why.clone()));
        }
        let bins = self.bins.clone().ok_or_else(|| {
            BenchError::PvschedUnavailable("pvsched modes without pvschedd binaries".into())
        })?;
        let overlay = mode_overlay(&self.s.base.pvschedd_overlay, honor);
        let guests = &self.guests;
        let entries = |by_pid: bool| -> Result<Vec<VmEntry>> {
            guests
                .iter()
                .map(|(name, g)| {
                    let mut e = g.entry(name, by_pid)?;
                    e.doorbell = g.vm.doorbell().map(|fd| fd.as_raw_fd());
                    Ok(e)
                })
                .collect()
        };
        let run_dir = self.run_dir.clone();
        let started =
            match entries(false).and_then(|e| Daemon::start_vms(&bins, &run_dir, &e, &overlay)) {
                Ok(d) => Ok(d),
                Err(e) => {
                    let retry = entries(true)
                        .and_then(|e| Daemon::start_vms(&bins, &run_dir, &e, &overlay));
                    self.note(format!(
                        "{mode}: pvschedd did not serve both VMs found over QMP; tried again with \
                     their QEMU pids (thread names): {}",
                        first_line(&e.to_string())
                    ));
                    retry
                }
            };
        started.map(Some).inspect_err(|e| {
            self.broken.insert(
                mode,
                format!(
                    "{mode} skipped: pvschedd did not serve the VMs earlier in this run ({})",
                    first_line(&e.to_string())
                ),
            );
        })
    }

    /// Stops the daemon (if any), returns its last status, checks every
    /// QEMU thread of both VMs.
    fn restore(&mut self, daemon: Option<Daemon>, mode: LockMode) -> Option<serde_json::Value> {
        let mut status = None;
        if let Some(d) = daemon {
            match d.status() {
                Ok(st) => status = serde_json::to_value(st).ok(),
                Err(e) => self.note(format!("pvschedd status at the end: {e}")),
            }
            if let Err(e) = d.stop() {
                self.error(e.to_string());
            }
        }
        let msgs: Vec<String> = self
            .guests
            .iter()
            .flat_map(|(_, g)| crate::harness::vm::restore_threads(&g.baseline, mode.name()))
            .collect();
        for m in msgs {
            self.note(m);
        }
        status
    }

    /// One measurement: lockstress in the VMs the case runs it in, at once;
    /// CPU time, guest counters and pvschedd's status sampled at the start
    /// and `--duration` seconds later. Returns the share of the machine
    /// others took.
    fn measure(
        &mut self,
        rep: usize,
        case: LockCase,
        mode: LockMode,
        daemon: Option<&Daemon>,
    ) -> Result<f64> {
        let tag = format!("rep{rep}-{case}-{mode}");
        let secs = self.s.base.duration;
        self.progress
            .phase(&format!("{case}/{mode} rep {rep}"), secs as f64);
        let cmd = lockstress_cmd(secs, self.s.workload, self.s.threads);
        let before = foreign::sample();
        let start = self.ends(daemon);
        let until = start.at + Duration::from_secs(secs);
        let this = &*self;
        let (outs, end) = std::thread::scope(|sc| {
            let sampler = sc.spawn(move || {
                std::thread::sleep(until.saturating_duration_since(Instant::now()));
                this.ends(daemon)
            });
            let runs: Vec<_> = this
                .guests
                .iter()
                .map(|(name, g)| {
                    let cmd = &cmd;
                    case.runs(name)
                        .then(|| sc.spawn(move || g.vm.exec(cmd, Duration::from_secs(secs + 90))))
                })
                .collect();
            let outs: Vec<_> = runs
                .into_iter()
                .map(|h| h.map(|h| h.join()))
                .collect::<Vec<_>>();
            (outs, sampler.join())
        });
        let foreign_cpu = foreign::fraction(&before, &foreign::sample(), self.host_cpus);
        let end = end.map_err(|_| BenchError::Tool {
            what: "window sampler".into(),
            detail: "its thread panicked".into(),
        })?;
        let window_s = end.at.duration_since(start.at).as_secs_f64();
        let hz = foreign::ticks_per_second() as f64;
        let mut vms = Vec::new();
        for (i, ((name, _), out)) in self.guests.iter().zip(outs).enumerate() {
            let (result, kernel) = match out {
                None => (None, None),
                Some(joined) => {
                    let (rc, text) = joined
                        .map_err(|_| BenchError::Tool {
                            what: format!("lockstress in {name}"),
                            detail: "its thread panicked".into(),
                        })?
                        .map_err(guest(format!("lockstress in {name}")))?;
                    let log = self.raw_dir.join(format!("{tag}-{name}.log"));
                    std::fs::write(&log, &text)
                        .map_err(io(format!("writing {}", log.display())))?;
                    if rc != 0 {
                        return Err(BenchError::Tool {
                            what: format!("lockstress in {name}"),
                            detail: format!("exit {rc}: {}", text.trim()),
                        });
                    }
                    let (r, k) = parse_run(&text)?;
                    (Some(r), k)
                }
            };
            let (lock_wait, a) = start.locks[i];
            let guest_locks = match (a, end.locks[i].1) {
                (Some(a), Some(b)) if lock_wait => Some(GuestLocks::between(&a, &b)),
                _ => None,
            };
            let daemon_locks = match (start.status.get(*name), end.status.get(*name)) {
                (Some(a), Some(b)) => Some(DaemonLocks::between(a, b)),
                _ => None,
            };
            vms.push(VmPhase {
                name: name.to_string(),
                ran: case.runs(name),
                result,
                cpu_s: end.ticks[i].saturating_sub(start.ticks[i]) as f64 / hz,
                lock_wait,
                guest_locks,
                kernel_contentions: kernel,
                daemon: daemon_locks,
            });
        }
        let machine_s = window_s * self.host_cpus as f64;
        let phase = Phase {
            case,
            mode,
            rep,
            window_s,
            host_cpus: self.host_cpus,
            foreign_cpu,
            vms,
            machine_busy: match (start.busy, end.busy) {
                (Some(a), Some(b)) if machine_s > 0.0 => {
                    Some((b.saturating_sub(a) as f64 / hz / machine_s).clamp(0.0, 1.0))
                }
                _ => None,
            },
            daemon_cpu_s: match (start.daemon_ticks, end.daemon_ticks) {
                (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / hz),
                _ => None,
            },
            daemon_counters: start
                .daemon_counters
                .iter()
                .filter_map(|(k, a)| Some((k.clone(), (end.daemon_counters.get(k)? - a).max(0.0))))
                .collect(),
        };
        eprintln!("    {}", phase_line(&phase));
        self.phases.push(phase);
        Ok(foreign_cpu)
    }

    /// [`Self::measure`], again (up to `--retry-disturbed` times) while
    /// others took more than [`DISTURBED`] of the machine; when every try
    /// was disturbed, the least disturbed one is kept.
    fn measure_undisturbed(
        &mut self,
        rep: usize,
        case: LockCase,
        mode: LockMode,
        daemon: Option<&Daemon>,
    ) {
        let tag = format!("rep{rep}-{case}-{mode}");
        let retries = self.s.base.retry_disturbed;
        let mut tries = 0;
        let mut best: Option<Phase> = None;
        loop {
            let last = match self.measure(rep, case, mode, daemon) {
                Ok(_) => self.phases.pop(),
                Err(e) => {
                    self.error(format!("{tag}: {e}"));
                    None
                }
            };
            let Some(last_f) = last.as_ref().map(|p| p.foreign_cpu) else {
                // Failed: keep what an earlier try measured, if any.
                if let Some(p) = best {
                    self.note(foreign::disturbed_note(&tag, p.foreign_cpu));
                    self.phases.push(p);
                }
                return;
            };
            best = least_disturbed(best, last);
            if last_f > DISTURBED && tries < retries {
                tries += 1;
                self.note(foreign::retry_note(&tag, last_f, tries, retries));
                self.progress.add(self.s.base.duration as f64);
                continue;
            }
            if let Some(p) = best {
                if p.foreign_cpu > DISTURBED {
                    self.note(format!(
                        "{} (the least disturbed of {} tries)",
                        foreign::disturbed_note(&tag, p.foreign_cpu),
                        tries + 1
                    ));
                }
                self.phases.push(p);
            }
            return;
        }
    }

    /// One (repeat, case, mode) session: daemon on, the measurement, daemon
    /// off (threads verified).
    fn session(&mut self, rep: usize, case: LockCase, mode: LockMode) {
        let label = format!("{case}/{mode} rep {rep}");
        let nominal = self.s.base.duration as f64;
        match self.apply(mode) {
            Err(e) => {
                if self.broken.get(&mode).is_some_and(|w| *w == e.to_string()) {
                    // Already said when it broke.
                } else {
                    self.error(format!("rep{rep}-{case}-{mode}: {e}"));
                }
                self.progress.skip(&label, nominal);
            }
            Ok(daemon) => {
                self.measure_undisturbed(rep, case, mode, daemon.as_ref());
                if let Some(status) = self.restore(daemon, mode) {
                    self.sessions.push(SessionStatus {
                        case,
                        mode,
                        rep,
                        status,
                    });
                }
            }
        }
    }

    /// Whether both guests still run commands (three tries each).
    fn vms_alive(&mut self) -> bool {
        let mut dead = None;
        for (name, g) in &self.guests {
            if !(1..=3).any(|_| matches!(g.vm.exec("true", Duration::from_secs(60)), Ok((0, _)))) {
                dead = Some(*name);
                break;
            }
        }
        match dead {
            Some(name) => {
                self.note(format!("VM {name} does not answer `true` any more"));
                false
            }
            None => true,
        }
    }
}

/// Of two measurements (either may be missing), the one others disturbed
/// least.
pub fn least_disturbed(a: Option<Phase>, b: Option<Phase>) -> Option<Phase> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.foreign_cpu < a.foreign_cpu { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// The progress line of one measurement.
pub fn phase_line(p: &Phase) -> String {
    let split = p.cpu_split().unwrap_or_default();
    let vms: Vec<String> = p
        .vms
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let ops = match &v.result {
                Some(r) => format!("{:.0} ops/s", r.ops_per_s),
                None => "idle".into(),
            };
            let locks = match &v.guest_locks {
                Some(g) => format!(
                    ", {} contentions, {} holder preempted",
                    g.contended, g.preempted
                ),
                None => String::new(),
            };
            let ext = match &v.daemon {
                Some(d) => format!(", {} extensions", d.extensions),
                None => String::new(),
            };
            format!(
                "{} {ops} (CPU {:.2} s, {:.1} % of the VMs){locks}{ext}",
                v.name,
                v.cpu_s,
                split.get(i).copied().unwrap_or(0.0) * 100.0
            )
        })
        .collect();
    let daemon = match (p.daemon_cpu_s, p.machine_seconds()) {
        (Some(d), Some(m)) => format!(" | pvschedd {:.1} %", d / m * 100.0),
        _ => String::new(),
    };
    format!(
        "{}{daemon} | other load {:.0} %",
        vms.join(" | "),
        p.foreign_cpu * 100.0
    )
}

/// Runs the scenario; returns the report and whether every phase worked.
pub fn run(s: &LockSettings) -> Result<(LocksReport, bool)> {
    let b = &s.base;
    let start = Start::begin(b)?;
    let pvsched = s.modes.iter().any(|m| m.honor_lock_holders().is_some());
    let daemon = pvsched
        .then(|| pin_daemon(Binaries::locate(b.pvschedd.as_deref())?, &start.run_dir))
        .transpose()?;
    plot::init_font()?;
    let (phases, nominal) = plan(s);
    announce(
        &format!(
            "lock scenario: {} repeats x cases [{}] x modes [{}], {} s of `{}` each",
            b.repeat,
            listed(&s.cases),
            listed(&s.modes),
            b.duration,
            lockstress_args(b.duration, s.workload, s.threads)
        ),
        phases,
        nominal,
        nominal * 1.5 + 60.0,
        "boots and overheads",
        &start.out,
    );
    in_private_tmp(|| run_in(s, start, daemon))
}

/// The lock scenario once its folders are there: boots the guests, runs
/// every session and renders the report. `daemon`: the pinned pvschedd and
/// what the report says about it, when a mode needs it.
fn run_in(
    s: &LockSettings,
    start: Start,
    daemon: Option<(Binaries, String)>,
) -> Result<(LocksReport, bool)> {
    let (started, t0, out, run_dir, raw_dir) = start.into_parts();
    let out = out.as_path();
    let pvsched = daemon.is_some();
    let (bins, pvschedd) = daemon.unzip();
    let pvschedd = pvschedd.unwrap_or_else(|| "not used".to_string());
    let b = &s.base;
    let (phases, nominal) = plan(s);
    let machine = Machine::probe(&pvsched_vmtest::workspace_root());
    let (avm, bvm, accel_reason, accel) = boot_pair(b, VM_A, VM_B)?;
    let guests = vec![
        (VM_A, Guest::new(avm, pvsched)?),
        (VM_B, Guest::new(bvm, pvsched)?),
    ];
    let mut notes = Vec::new();
    let mut kernel_counter = Vec::new();
    for (name, g) in &guests {
        let lock_wait = guest_locks(&g.vm, g.cpus).0;
        eprintln!(
            "pvsched-bench: {name} up: {} vCPUs (threads {}), QEMU pid {}, pvsched.ko {}, \
             F_LOCK_WAIT {}",
            g.cpus,
            g.vcpus
                .iter()
                .map(|(i, t)| format!("{i}:{t}"))
                .collect::<Vec<_>>()
                .join(" "),
            g.vm.qemu_pid(),
            g.module,
            if lock_wait {
                "accepted"
            } else {
                "not accepted"
            }
        );
        if !lock_wait {
            notes.push(format!(
                "{name}: the guest module did not accept F_LOCK_WAIT after boot: its lock \
                 counters cannot be read"
            ));
        }
        match g.vm.exec(&trigger_cmd(), Duration::from_secs(30)) {
            Ok((0, o)) if o.contains("trigger ok") => {}
            other => {
                let why = match other {
                    Ok((rc, o)) => format!("exit {rc}: {}", first_line(o.trim())),
                    Err(e) => first_line(&e.to_string()).to_string(),
                };
                kernel_counter.push(format!("{name}: no hist trigger ({why})"));
            }
        }
    }
    let kernel_counter = if kernel_counter.is_empty() {
        format!(
            "a hist trigger (`hist:keys=flags`) on `lock:contention_begin` in each guest \
             ({TRACEPOINT}), its total read just before and just after lockstress: every \
             contention the guest kernel traced (mutex spins included), whoever held the lock"
        )
    } else {
        format!("not available: {}", kernel_counter.join("; "))
    };
    eprintln!("pvsched-bench: warm-up (2 s of the workload in both guests; not counted)");
    let warm = lockstress_cmd(2, s.workload, s.threads);
    std::thread::scope(|sc| {
        for (_, g) in &guests {
            let warm = &warm;
            sc.spawn(move || {
                let _ = g.vm.exec(warm, Duration::from_secs(90));
            });
        }
    });
    let host_cpus = machine.cpus;
    let mut bench = Bench {
        s,
        guests,
        bins,
        run_dir,
        raw_dir,
        host_cpus,
        phases: Vec::new(),
        sessions: Vec::new(),
        journal: Journal::with_notes(notes),
        progress: Progress::new(phases, nominal),
        broken: BTreeMap::new(),
    };
    let vcpus: u32 = bench.guests.iter().map(|(_, g)| g.cpus).sum();
    if vcpus as usize <= host_cpus {
        bench.note(format!(
            "the two guests have {vcpus} vCPUs on {host_cpus} host CPUs: the overcommitted \
             case is not overcommitted"
        ));
    }
    if b.pvschedd_overlay
        .get("defaults")
        .and_then(|d| d.get("honor_lock_holders"))
        .is_some()
    {
        bench.note(
            "--pvschedd-config sets honor_lock_holders: each pvsched mode sets its own".into(),
        );
    }
    'outer: for rep in 1..=b.repeat {
        for (ci, &case) in s.cases.iter().enumerate() {
            for mode in mode_order(&s.modes, rep - 1, ci) {
                let errors = bench.journal.errors;
                bench.session(rep, case, mode);
                if bench.journal.errors > errors && !bench.vms_alive() {
                    bench.error("a guest stopped answering: run aborted".into());
                    break 'outer;
                }
            }
        }
    }
    let threads = bench
        .phases
        .iter()
        .flat_map(|p| p.vms.iter())
        .find_map(|v| v.result.as_ref().map(|r| r.threads))
        .unwrap_or(s.threads);
    let first = &bench.guests[0].1;
    let meta = LocksMeta {
        base: Meta {
            command: b.command.clone(),
            started,
            wall_s: t0.elapsed().as_secs_f64(),
            repeat: b.repeat,
            duration_s: b.duration,
            accel: match accel {
                Accel::Tcg => "tcg".into(),
                Accel::Kvm => "kvm".into(),
            },
            accel_reason,
            guest_cpus: first.cpus,
            guest_kernel: first.vm.kernel_release().to_string(),
            guest_module: first.module.clone(),
            load_cmd: String::new(),
            pvschedd_settings: b.pvschedd_overlay.to_string(),
            static_rt_priority: 0,
            machine,
            notes: bench.journal.notes.clone(),
        },
        vms: bench
            .guests
            .iter()
            .map(|(n, g)| (n.to_string(), g.module.clone()))
            .collect(),
        workload: s.workload.name().to_string(),
        workload_describe: s.workload.describe().to_string(),
        workload_cmd: lockstress_args(b.duration, s.workload, s.threads).replacen(
            &format!("-d {}", b.duration),
            "-d {secs}",
            1,
        ),
        threads,
        pvschedd,
        kernel_counter,
        definitions: DEFINITIONS.iter().map(|d| d.to_string()).collect(),
    };
    let raw = LocksRaw {
        scenario: "locks".into(),
        meta,
        cases: s.cases.clone(),
        modes: s.modes.clone(),
        phases: bench.phases,
        sessions: bench.sessions,
    };
    let ok = bench.journal.errors == 0;
    drop(bench.guests);
    let report = render(out, &raw)?;
    Ok((report, ok))
}

/// Writes raw.json, report.json, the plot and report.md into `out`.
pub fn render(out: &Path, raw: &LocksRaw) -> Result<LocksReport> {
    let write = |name: &str, text: &str| crate::harness::output::write_into(out, name, text);
    write("raw.json", &json(raw))?;
    let mut report = locks_report::build(raw);
    let mut panels = Vec::new();
    for c in &report.cases {
        let modes = locks_report::ordered(&c.modes);
        let bar = |m: LockMode, s: &crate::harness::figures::Spread| plot::Bar {
            mode: m.name(),
            value: s.median,
            low: s.min,
            high: s.max,
        };
        let running: Vec<&str> = modes
            .first()
            .map(|(_, ms)| {
                ms.vms
                    .iter()
                    .filter(|v| v.ran)
                    .map(|v| v.name.as_str())
                    .collect()
            })
            .unwrap_or_default();
        if running.len() > 1 {
            panels.push(plot::BarPanel {
                title: format!("{}: both VMs", c.case),
                y_desc: "ops/s (sum)".into(),
                bars: modes
                    .iter()
                    .filter_map(|(m, ms)| ms.total_ops_per_s.as_ref().map(|s| bar(*m, s)))
                    .collect(),
            });
        }
        for name in running {
            panels.push(plot::BarPanel {
                title: format!("{}: {name}", c.case),
                y_desc: "ops/s".into(),
                bars: modes
                    .iter()
                    .filter_map(|(m, ms)| {
                        let v = ms.vms.iter().find(|v| v.name == name)?;
                        v.ops_per_s.as_ref().map(|s| bar(*m, s))
                    })
                    .collect(),
            });
        }
    }
    panels.retain(|p| !p.bars.is_empty());
    if !panels.is_empty() {
        let name = "throughput.png".to_string();
        let title = plot_title(raw);
        // One row: room in the title for the run and its command.
        plot::bar_panels(&out.join(&name), &title, &panels, panels.len().min(4))?;
        report.plots.push(name);
    }
    write("report.json", &json(&report))?;
    write("report.md", &locks_report::markdown(&report))?;
    Ok(report)
}

/// The plot's title: what it shows, the run (its start) and its command.
pub fn plot_title(raw: &LocksRaw) -> String {
    let m = &raw.meta.base;
    let args = m.command.split_once(' ').map(|(_, a)| a).unwrap_or("");
    let args = if args.chars().count() > 70 {
        format!("{}…", args.chars().take(69).collect::<String>())
    } else {
        args.to_string()
    };
    format!(
        "lockstress {} ops/s per mode (bar: median, line: min-max of {} x {} s, {}); run {}: \
         pvsched-bench {args}",
        raw.meta.workload,
        m.repeat,
        m.duration_s,
        m.accel.to_uppercase(),
        m.started
    )
}

/// Re-renders a report from a previous lock run's raw.json (into its directory).
pub fn rerender(raw_path: &Path) -> Result<(LocksReport, PathBuf)> {
    crate::harness::raw::rerender(raw_path, render)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_command_reads_the_trigger_around_lockstress() {
        // Act
        let c = lockstress_cmd(10, Workload::Rename, 0);

        // Assert
        assert!(c.contains("lockstress -d 10 -w rename;"), "{c}");
        assert!(!c.contains(" -t "), "{c}");
        assert!(c.find("LOCKHITS0").unwrap() < c.find("lockstress -d").unwrap());
        assert!(c.find("LOCKHITS1").unwrap() > c.find("lockstress -d").unwrap());
        assert!(c.ends_with("exit $rc"));
        assert!(c.len() < pvsched_vmtest::MAX_COMMAND_LEN);
        assert!(!c.contains('\n'));
        assert!(lockstress_cmd(5, Workload::Files, 8).contains("lockstress -d 5 -w files -t 8;"));
        assert!(trigger_cmd().len() < pvsched_vmtest::MAX_COMMAND_LEN);
    }

    #[test]
    fn a_run_parses_with_and_without_the_trigger() {
        // Arrange
        let json = "{\"workload\":\"rename\",\"threads\":4,\"cpus\":2,\"ops\":61601,\
                    \"ops_per_s\":6132.6,\"elapsed_s\":10.045,\"per_s\":[18034,7980],\
                    \"thread_ops_min\":13775,\"thread_ops_max\":17395,\"failed\":false}";
        let out = format!("LOCKHITS0 1200\n{json}\nLOCKHITS1 33328\n");

        // Act
        let (r, k) = parse_run(&out).unwrap();
        let (_, none) = parse_run(&format!("LOCKHITS0 \n{json}\nLOCKHITS1 \n")).unwrap();

        // Assert
        assert_eq!((r.ops, r.threads, r.per_s.len()), (61601, 4, 2));
        assert_eq!(r.ops_per_s, 6132.6);
        assert_eq!(k, Some(32128));
        assert_eq!(none, None);
        assert!(parse_run("lockstress: open: ENOSPC").is_err());
    }

    #[test]
    fn each_pvsched_mode_sets_its_own_lock_handling() {
        // Arrange: a user overlay that already sets it and another key.
        let user: toml::Table =
            "[defaults]\nhonor_lock_holders = true\nboost_share_permille = 300\n\
                                 [daemon]\nlazy_events = false\n"
                .parse()
                .unwrap();

        // Act
        let off = mode_overlay(&user, false);
        let on = mode_overlay(&toml::Table::new(), true);

        // Assert
        assert_eq!(off["defaults"]["honor_lock_holders"].as_bool(), Some(false));
        assert_eq!(
            off["defaults"]["boost_share_permille"].as_integer(),
            Some(300)
        );
        assert_eq!(off["daemon"]["lazy_events"].as_bool(), Some(false));
        assert_eq!(on["defaults"]["honor_lock_holders"].as_bool(), Some(true));
        let cfg = crate::daemon::config_toml_vms(Path::new("/r"), &[], &off);
        assert!(cfg.contains("honor_lock_holders = false"), "{cfg}");
    }

    #[test]
    fn plan_counts_one_phase_per_case_mode_and_repeat() {
        let s = LockSettings {
            base: Settings {
                repeat: 5,
                ..Settings::example()
            },
            cases: LockCase::ALL.to_vec(),
            modes: LockMode::ALL.to_vec(),
            workload: Workload::Rename,
            threads: 0,
        };
        assert_eq!(plan(&s), (30, 300.0));
    }

    #[test]
    fn the_plot_title_names_the_run_and_its_command() {
        // Arrange
        let mut raw = LocksRaw {
            scenario: "locks".into(),
            meta: LocksMeta {
                base: Meta {
                    command: "target/release/pvsched-bench --scenario locks --repeat 1".into(),
                    started: "2026-11-24 22:05:11".into(),
                    repeat: 1,
                    duration_s: 5,
                    accel: "tcg".into(),
                    ..Default::default()
                },
                workload: "rename".into(),
                ..Default::default()
            },
            cases: vec![],
            modes: vec![],
            phases: vec![],
            sessions: vec![],
        };

        // Act
        let t = plot_title(&raw);
        raw.meta.base.command = format!("x {}", "--a ".repeat(40));
        let long = plot_title(&raw);

        // Assert
        assert_eq!(
            t,
            "lockstress rename ops/s per mode (bar: median, line: min-max of 1 x 5 s, TCG); \
             run 2026-11-24 22:05:11: pvsched-bench --scenario locks --repeat 1"
        );
        assert!(long.ends_with('…') && long.len() < 200, "{long}");
    }

    #[test]
    fn the_least_disturbed_try_is_kept() {
        let p = |f: f64| Phase {
            case: LockCase::Overcommitted,
            mode: LockMode::Vanilla,
            rep: 1,
            window_s: 10.0,
            host_cpus: 2,
            foreign_cpu: f,
            vms: vec![],
            machine_busy: None,
            daemon_cpu_s: None,
            daemon_counters: BTreeMap::new(),
        };
        assert_eq!(
            least_disturbed(Some(p(0.3)), Some(p(0.2))).map(|x| x.foreign_cpu),
            Some(0.2)
        );
        assert_eq!(
            least_disturbed(Some(p(0.1)), Some(p(0.2))).map(|x| x.foreign_cpu),
            Some(0.1)
        );
        assert_eq!(
            least_disturbed(None, Some(p(0.5))).map(|x| x.foreign_cpu),
            Some(0.5)
        );
        assert!(least_disturbed(None, None).is_none());
    }

    #[test]
    fn the_progress_line_names_each_vm() {
        let p = Phase {
            case: LockCase::Alone,
            mode: LockMode::PvschedLock,
            rep: 1,
            window_s: 10.0,
            host_cpus: 2,
            foreign_cpu: 0.02,
            machine_busy: None,
            daemon_cpu_s: None,
            daemon_counters: BTreeMap::new(),
            vms: vec![
                VmPhase {
                    name: VM_A.into(),
                    ran: true,
                    result: Some(LockstressResult {
                        ops_per_s: 1234.4,
                        ..Default::default()
                    }),
                    cpu_s: 15.0,
                    guest_locks: Some(GuestLocks {
                        contended: 7,
                        preempted: 1,
                    }),
                    ..Default::default()
                },
                VmPhase {
                    name: VM_B.into(),
                    cpu_s: 5.0,
                    ..Default::default()
                },
            ],
        };
        let l = phase_line(&p);
        assert!(
            l.starts_with("lock-a 1234 ops/s (CPU 15.00 s, 75.0 % of the VMs), 7 contentions, 1 holder preempted | lock-b idle (CPU 5.00 s, 25.0 % of the VMs)"),
            "{l}"
        );
        assert!(l.ends_with("other load 2 %"));
    }
}
