//! One lock scenario run in progress: both guests, and per (repeat, case,
//! mode) a session measured over one window, sampled at both ends.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pvsched_abi::{F_EXT_NOTICE, F_LOCK_HOLD};

use super::commands::*;
use super::model::*;
use super::settings::*;
use crate::daemon::{daemon_counters, Binaries, Daemon, VmEntry};
use crate::error::{guest, io, BenchError, Result};
use crate::foreign;
use crate::harness::disturbance::{disturbed_note, Judgement, Retries, DISTURBED};
use crate::harness::journal::{first_line, Journal, Journaled};
use crate::harness::vm::Guest;
use crate::kvm_preemptions::{KvmPreemptions, KVM_DEBUGFS};
use crate::progress::Progress;

/// What the sampler reads at each end of the window.
struct Ends {
    at: Instant,
    ticks: Vec<u64>,
    locks: Vec<(bool, Option<GuestLocks>)>,
    status: BTreeMap<String, pvsched_control::VmStatus>,
    /// The backend pvschedd serves on (`backend.active`; pvsched modes).
    backend_active: Option<String>,
    /// The machine's busy ticks.
    busy: Option<u64>,
    /// pvschedd's own ticks and its counters (pvsched modes).
    daemon_ticks: Option<u64>,
    daemon_counters: BTreeMap<String, f64>,
    /// KVM's vCPU preemptions, reported to the guests and not.
    kvm_preemptions: Option<KvmPreemptions>,
}

pub(super) struct Bench<'a> {
    pub(super) s: &'a LockSettings,
    /// [`VM_A`], [`VM_B`].
    pub(super) guests: Vec<(&'static str, Guest)>,
    pub(super) bins: Option<Binaries>,
    pub(super) run_dir: PathBuf,
    pub(super) raw_dir: PathBuf,
    pub(super) host_cpus: usize,
    pub(super) phases: Vec<Phase>,
    pub(super) sessions: Vec<SessionStatus>,
    pub(super) journal: Journal,
    pub(super) progress: Progress,
    /// pvsched modes that could not be set up, and why.
    pub(super) broken: BTreeMap<LockMode, String>,
}

impl Journaled for Bench<'_> {
    fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }
}

impl Bench<'_> {
    fn ends(&self, daemon: Option<&Daemon>) -> Ends {
        let status = daemon.and_then(|d| d.status().ok());
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
            backend_active: status.as_ref().map(|st| st.backend.active.clone()),
            status: status
                .map(|st| st.vms.into_iter().map(|v| (v.name.clone(), v)).collect())
                .unwrap_or_default(),
            busy: foreign::machine_busy_ticks(),
            daemon_ticks: daemon.and_then(|d| foreign::process_ticks(d.pid())),
            daemon_counters: daemon
                .and_then(|d| d.metrics_text().ok())
                .map(|t| daemon_counters(&t))
                .unwrap_or_default(),
            kvm_preemptions: KvmPreemptions::sample(Path::new(KVM_DEBUGFS)),
        }
    }

    /// pvschedd serving both VMs with the mode's backend and lock handling
    /// (over QMP; once more by thread names if that fails), or nothing for
    /// vanilla.
    fn apply(&mut self, mode: LockMode) -> Result<Option<Daemon>> {
        let Some(mode_daemon) = mode.daemon() else {
            self.without_lock_holders(mode);
            return Ok(None);
        };
        if let Some(why) = self.broken.get(&mode) {
            return Err(BenchError::PvschedUnavailable(why.clone()));
        }
        let bins = self.bins.clone().ok_or_else(|| {
            BenchError::PvschedUnavailable("pvsched modes without pvschedd binaries".into())
        })?;
        let overlay = mode_overlay(&self.s.base.pvschedd_overlay, mode_daemon);
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
            let (result, kernel, held) = match out {
                None => (None, None, None),
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
                    let run = parse_run(&text)?;
                    (Some(run.result), run.kernel_contentions, run.held)
                }
            };
            let (lock_wait, a) = start.locks[i];
            let guest_locks = match (a, end.locks[i].1) {
                (Some(a), Some(b)) if lock_wait => Some(GuestLocks::between(&a, &b)),
                _ => None,
            };
            let (daemon_locks, scx_extensions) =
                match (start.status.get(*name), end.status.get(*name)) {
                    (Some(a), Some(b)) => (
                        Some(DaemonLocks::between(a, b)),
                        Some(ScxExtensions::between(a, b)),
                    ),
                    _ => (None, None),
                };
            vms.push(VmPhase {
                name: name.to_string(),
                ran: case.runs(name),
                result,
                cpu_s: end.ticks[i].saturating_sub(start.ticks[i]) as f64 / hz,
                lock_wait,
                guest_locks,
                kernel_contentions: kernel,
                guest_held: held,
                daemon: daemon_locks,
                scx_extensions,
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
            backend_active: end.backend_active,
            kvm_preemptions: match (start.kvm_preemptions, end.kvm_preemptions) {
                (Some(a), Some(b)) => KvmPreemptions::between(&a, &b),
                _ => None,
            },
        };
        if let Some(note) = backend_mismatch(&tag, mode, phase.backend_active.as_deref()) {
            self.note(note);
        }
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
    /// A mode without pvschedd runs its guests as a host without pvsched
    /// would, but a region that still offers `F_LOCK_HOLD` (as booted, or as
    /// the last pvschedd left it) keeps the guest module listing every lock
    /// call, at a cost, for no host (LH58: 3.5 million takes listed in
    /// vanilla's overcommitted windows). Each such region is initialised
    /// again without it, its lock waits still counted (`F_LOCK_WAIT`), and
    /// the guests given a few seconds to bind to it.
    fn without_lock_holders(&mut self, mode: LockMode) {
        let (mut rebound, mut failed) = (Vec::new(), Vec::new());
        for (name, g) in self.guests.iter_mut() {
            let Some(region) = g.vm.region_mut() else {
                continue;
            };
            let h = region.header();
            if h.host_features & F_LOCK_HOLD == 0 {
                continue;
            }
            match region.init_header_with_doorbell(
                h.slot_count,
                h.host_features & !(F_LOCK_HOLD | F_EXT_NOTICE),
                h.doorbell,
            ) {
                Ok(generation) => rebound.push((*name, generation)),
                Err(e) => failed.push(format!(
                    "{mode}: {name}'s region not initialised again without lock holders: {e}"
                )),
            }
        }
        for msg in failed {
            self.note(msg);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for (name, generation) in rebound {
            let bound = |s: &Self| {
                s.guests
                    .iter()
                    .find(|(n, _)| *n == name)
                    .and_then(|(_, g)| g.vm.region())
                    .is_some_and(|r| r.header().guest_generation == generation)
            };
            while !bound(self) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if !bound(self) {
                self.note(format!(
                    "{mode}: {name}'s guest did not bind to its region without lock holders within 5 s"
                ));
            }
        }
    }

    pub(super) fn session(&mut self, rep: usize, case: LockCase, mode: LockMode) {
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
    pub(super) fn vms_alive(&mut self) -> bool {
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

/// What to say when pvschedd ended a window of `mode` on another backend
/// than the mode's (the kernel ended the sched_ext scheduler and the daemon
/// fell back to rt): the measurement is not the mode's. None when it served
/// on the mode's, or its backend is unknown.
pub fn backend_mismatch(tag: &str, mode: LockMode, active: Option<&str>) -> Option<String> {
    let wanted = mode.backend()?;
    let active = active.filter(|a| !a.is_empty())?;
    (active != wanted.name()).then(|| {
        format!(
            "{tag}: pvschedd served on the {active} backend at the end of the window, not \
             {wanted} (the kernel ended the sched_ext scheduler?): the measurement is kept but \
             is not {mode}'s"
        )
    })
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
            let scx = match &v.scx_extensions {
                Some(x) if x.any() => format!(
                    ", {} slice-end extensions ({} refused)",
                    x.granted, x.refused
                ),
                _ => String::new(),
            };
            format!(
                "{} {ops} (CPU {:.2} s, {:.1} % of the VMs){locks}{ext}{scx}",
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
