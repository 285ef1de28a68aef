//! The lock scenario's run: two guests booted once, then per repeat every
//! case and mode (interleaved, rotated) measured over one window, with
//! pvschedd started per session for the pvsched modes.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::commands::*;
use super::model::*;
use super::render::render;
use super::report::*;
use super::settings::*;
use crate::daemon::{daemon_counters, pin_daemon, Binaries, Daemon, VmEntry};
use crate::error::{guest, io, BenchError, Result};
use crate::harness::axes::mode_order;
use crate::harness::disturbance::{disturbed_note, Judgement, Retries, DISTURBED};
use crate::harness::journal::{first_line, Journal, Journaled};
use crate::harness::meta::Meta;
use crate::harness::plan::{announce, listed};
use crate::harness::start::{in_private_tmp, Start};
use crate::harness::vm::{boot_pair, Guest};
use crate::host::Machine;
use crate::progress::Progress;
use crate::{foreign, plot};

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
        let mut retries = Retries::new(&tag, self.s.base.retry_disturbed);
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
                    self.note(disturbed_note(&tag, p.foreign_cpu));
                    self.phases.push(p);
                }
                return;
            };
            best = least_disturbed(best, last);
            if let Judgement::Again(note) = retries.judge(last_f) {
                self.note(note);
                self.progress.add(self.s.base.duration as f64);
                continue;
            }
            if let Some(p) = best {
                if p.foreign_cpu > DISTURBED {
                    self.note(format!(
                        "{} (the least disturbed of {} tries)",
                        disturbed_note(&tag, p.foreign_cpu),
                        retries.retried() + 1
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
            guest_cpus: first.cpus,
            guest_kernel: first.vm.kernel_release().to_string(),
            guest_module: first.module.clone(),
            notes: bench.journal.notes.clone(),
            load_cmd: String::new(),
            static_rt_priority: 0,
            ..Meta::of_run(b, (started, t0), (accel, accel_reason), machine)
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
