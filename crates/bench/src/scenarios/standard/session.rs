//! One standard run in progress: the guest, and per (repeat, load, mode) a
//! session: the mode applied, each interval's cyclictests, the audio task
//! and the ping-pong, the mode undone and every QEMU thread checked.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use pvsched_base::sched::{set_params_verified, ThreadParams};
use pvsched_vmtest::{Accel, Vm};
use serde_json::Value;

use super::model::*;
use super::plan::*;
use super::share;
use crate::daemon::{
    bench_vm_entry, daemon_counters, prometheus_buckets, Binaries, Daemon, Locator,
};
use crate::error::{guest, BenchError, Result};
use crate::guest::{self, guest_histogram, AudioResult, PingPongResult};
use crate::harness::axes::{Load, Mode};
use crate::harness::disturbance::{Judgement, Retries};
use crate::harness::journal::{first_line, Journal, Journaled};
use crate::harness::settings::Settings;
use crate::harness::vm::{
    qmp_vcpu_threads, restore_threads, thread_baseline, vcpu_threads, vm_config,
};
use crate::host::{self, HostCyclictest};
use crate::progress::Progress;
use crate::{foreign, interrupts, ipi_sources};

enum Applied {
    Nothing,
    StaticRt,
    Daemon(Daemon),
}

/// What a pvsched session's daemon reported at its end.
#[derive(Default)]
struct DaemonEnd {
    reaction: Vec<(Option<f64>, u64)>,
    reaction_wakeup: Vec<(Option<f64>, u64)>,
    setattr: Vec<(Option<f64>, u64)>,
    counters: BTreeMap<String, f64>,
    seconds: f64,
}

pub(super) struct Bench<'a> {
    pub(super) s: &'a Settings,
    pub(super) vm: Vm,
    /// What a lost guest is booted again from.
    pub(super) image: pvsched_vmtest::GuestImage,
    pub(super) accel: Accel,
    /// Guests lost mid-session (QEMU gone or silent) and booted again.
    pub(super) guests_lost: usize,
    pub(super) vcpus: Vec<(u32, i32)>,
    /// Every QEMU thread's parameters right after boot: what "restored" means.
    pub(super) baseline: BTreeMap<i32, (String, ThreadParams)>,
    pub(super) bins: Option<Binaries>,
    pub(super) run_dir: PathBuf,
    pub(super) raw_dir: PathBuf,
    pub(super) host_cpus: usize,
    pub(super) guest_cpus: u32,
    pub(super) results: Results,
    pub(super) journal: Journal,
    pub(super) progress: Progress,
    pub(super) pvsched_broken: Option<String>,
}

impl Journaled for Bench<'_> {
    fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }
}

impl Bench<'_> {
    /// Puts every QEMU thread back to its boot-time parameters; notes any
    /// thread that was not there.
    fn verify_restored(&mut self, after: &str) {
        for msg in restore_threads(&self.baseline, after) {
            self.note(msg);
        }
    }

    fn apply(&mut self, mode: Mode) -> Result<Applied> {
        match mode {
            Mode::Vanilla => Ok(Applied::Nothing),
            Mode::StaticRt => {
                // As `chrt -r` would: SCHED_RR, no flags.
                let rr = ThreadParams::rr(self.s.static_rt_priority);
                for &(idx, tid) in &self.vcpus.clone() {
                    if let Err(source) = set_params_verified(tid, &rr) {
                        self.verify_restored("a failed static-rt setup");
                        return Err(BenchError::Sched {
                            what: format!("static-rt: vCPU {idx} thread {tid}"),
                            source,
                        });
                    }
                }
                Ok(Applied::StaticRt)
            }
            Mode::Pvsched | Mode::PvschedTimer | Mode::PvschedScx | Mode::PvschedScxLock => {
                let unavailable = |why: &str| BenchError::PvschedUnavailable(why.to_string());
                if let Some(why) = &self.pvsched_broken {
                    return Err(unavailable(why));
                }
                let bins = self
                    .bins
                    .clone()
                    .ok_or_else(|| unavailable("pvsched mode without pvschedd binaries"))?;
                let region = self
                    .vm
                    .region_path()
                    .ok_or_else(|| unavailable("the VM has no region file"))?
                    .to_path_buf();
                if !region.exists() {
                    let why = format!(
                        "the VM's region file {} is gone (its directory was removed by \
                         another process): pvschedd cannot serve this VM",
                        region.display()
                    );
                    self.pvsched_broken = Some(why.clone());
                    return Err(unavailable(&why));
                }
                let run_dir = self.run_dir.clone();
                let nvcpus = self.vcpus.len();
                let by_qmp = Locator::Qmp(self.vm.qmp_socket().to_path_buf());
                let by_pid = Locator::Pid(self.vm.qemu_pid());
                let overlay = &crate::daemon::overlay_for(&self.s.pvschedd_overlay, mode);
                let vm_doorbell = self.vm.doorbell().map(|fd| fd.as_raw_fd());
                let start = |how: &Locator| {
                    let entry = bench_vm_entry(mode, &region, how, nvcpus, vm_doorbell);
                    Daemon::start_vms(&bins, &run_dir, &[entry], overlay)
                };
                // pvschedd finds the vCPU threads over QMP, which a starved
                // QEMU main loop may not answer in time: then once more by
                // thread names.
                let started = match start(&by_qmp) {
                    Ok(d) => Ok(d),
                    Err(e) => {
                        // Is QEMU's QMP answering at all? (For the report.)
                        let t = Instant::now();
                        let probe = match qmp_vcpu_threads(&self.vm) {
                            Ok(_) => format!("the bench's own QMP query took {:?}", t.elapsed()),
                            Err(q) => format!(
                                "the bench's own QMP query failed after {:?}: {q}",
                                t.elapsed()
                            ),
                        };
                        self.note(format!(
                            "pvschedd did not serve the VM found over QMP ({probe}); \
                             trying again with `pid = {}` (thread names): {}",
                            self.vm.qemu_pid(),
                            first_line(&e.to_string())
                        ));
                        start(&by_pid)
                    }
                };
                match started {
                    Ok(d) => Ok(Applied::Daemon(d)),
                    Err(e) => {
                        self.pvsched_broken = Some(
                            "pvsched mode skipped: pvschedd did not serve the VM earlier in this run"
                                .into(),
                        );
                        Err(e)
                    }
                }
            }
        }
    }

    /// Undoes `applied`; returns the daemon's last status and its
    /// reaction-latency histogram.
    fn restore(&mut self, applied: Applied, mode: Mode) -> (Option<Value>, DaemonEnd) {
        let mut status = None;
        let mut end = DaemonEnd::default();
        match applied {
            Applied::Nothing => {}
            Applied::StaticRt => {
                for &(idx, tid) in &self.vcpus.clone() {
                    let base = self
                        .baseline
                        .get(&tid)
                        .map(|b| b.1)
                        .unwrap_or(ThreadParams::other(0));
                    if let Err(e) = set_params_verified(tid, &base) {
                        self.error(format!("restoring vCPU {idx} thread {tid}: {e}"));
                    }
                }
            }
            Applied::Daemon(d) => {
                // Kept as JSON in raw.json: what `pvschedctl status --json` prints.
                match d.status() {
                    Ok(st) => status = serde_json::to_value(st).ok(),
                    Err(e) => self.note(format!("pvschedd status at the end: {e}")),
                }
                match d.metrics_text() {
                    Ok(text) => {
                        end.reaction =
                            prometheus_buckets(&text, "pvsched_reaction_latency_seconds");
                        end.reaction_wakeup =
                            prometheus_buckets(&text, "pvsched_reaction_wakeup_seconds");
                        end.setattr = prometheus_buckets(&text, "pvsched_setattr_seconds");
                        end.counters = daemon_counters(&text);
                        end.seconds = d.uptime().as_secs_f64();
                    }
                    Err(e) => self.note(format!("pvschedd metrics at the end: {e}")),
                }
                if let Err(e) = d.stop() {
                    self.error(e.to_string());
                }
            }
        }
        self.verify_restored(mode.name());
        (status, end)
    }

    /// One cyclictest measurement, with the CPU time `probe` reads over it;
    /// returns the share of the machine that went to others meanwhile.
    fn latency(
        &mut self,
        rep: usize,
        load: Load,
        interval: u32,
        mode: Mode,
        probe: &share::Probe,
    ) -> Result<f64> {
        let s = self.s;
        let tag = format!("rep{rep}-{load}-{interval}us-{mode}");
        self.progress.phase(
            &format!("{load}/{interval}us/{mode} rep {rep}"),
            s.duration as f64,
        );
        let idle_before = share::read_guest_idle(&self.vm);
        let irq_before = interrupts::sample().map(|c| (c, Instant::now()));
        let ipi_trace = ipi_sources::Trace::start(self.raw_dir.join(format!("{tag}-ipi.trace")));
        let before = foreign::sample();
        let cpu_before = probe.snapshot();
        let host_json = self.raw_dir.join(format!("{tag}-host.json"));
        let host_run = HostCyclictest::start(
            interval,
            s.duration,
            self.host_cpus,
            s.buckets,
            &host_json,
            &self.raw_dir.join(format!("{tag}-host.log")),
        )?;
        let guest_run = self.vm.exec(
            &guest::cyclictest_cmd(interval, s.duration, self.guest_cpus as usize, s.buckets),
            Duration::from_secs(s.duration + 60),
        );
        let host_hist = host_run.finish();
        let ipi = ipi_trace.and_then(ipi_sources::Trace::finish);
        let irq = irq_before.and_then(|(a, t)| {
            interrupts::rates(&a, &interrupts::sample()?, t.elapsed().as_secs_f64())
        });
        let foreign_cpu = foreign::fraction(&before, &foreign::sample(), self.host_cpus);
        let cpu = match cpu_before.and_then(|a| Ok((a, probe.snapshot()?))) {
            Ok((a, b)) => {
                let mut u = probe.between(&a, &b, self.host_cpus);
                if let (Some(x), Some(y)) = (idle_before, share::read_guest_idle(&self.vm)) {
                    let (poll, driver) = share::guest_idle(&x, &y);
                    (u.guest_poll_s, u.guest_idle) = (poll, Some(driver));
                }
                Some(u)
            }
            Err(e) => {
                self.note(format!("{tag}: CPU shares not measured: {e}"));
                None
            }
        };
        let guest_hist = guest_histogram(&self.raw_dir, &tag, "guest cyclictest", guest_run)?;
        let host_hist = host_hist?;
        let per_thread = s.duration * 1_000_000 / u64::from(interval);
        eprintln!(
            "    guest p99 {} us max {} us | host p99 {} us max {} us | other load {:.0} %{}",
            guest_hist.percentile(0.99),
            guest_hist.max_us,
            host_hist.percentile(0.99),
            host_hist.max_us,
            foreign_cpu * 100.0,
            cpu.as_ref()
                .map(|c| format!(" | {}", c.line()))
                .unwrap_or_default()
        );
        self.results
            .latency
            .entry((load, interval, mode))
            .or_default()
            .push(LatencyRun {
                rep,
                guest: guest_hist,
                host: host_hist,
                guest_expected: per_thread * u64::from(self.guest_cpus),
                host_expected: per_thread * self.host_cpus as u64,
                foreign_cpu,
                cpu,
                interrupts: irq,
                ipi_sources: ipi,
            });
        Ok(foreign_cpu)
    }

    /// [`Self::latency`], measured again (up to `--retry-disturbed` times)
    /// while others took more than [`DISTURBED`](crate::harness::disturbance::DISTURBED) of the machine.
    fn latency_undisturbed(
        &mut self,
        rep: usize,
        load: Load,
        interval: u32,
        mode: Mode,
        probe: &share::Probe,
    ) {
        let tag = format!("rep{rep}-{load}-{interval}us-{mode}");
        let mut retries = Retries::new(&tag, self.s.retry_disturbed);
        loop {
            let foreign = match self.latency(rep, load, interval, mode, probe) {
                Ok(f) => f,
                Err(e) => return self.error(format!("{tag}: {e}")),
            };
            match retries.judge(foreign) {
                Judgement::Keep => return,
                Judgement::Disturbed(note) => return self.note(note),
                Judgement::Again(note) => {
                    if let Some(v) = self.results.latency.get_mut(&(load, interval, mode)) {
                        v.pop();
                    }
                    self.note(note);
                    self.progress.add(self.s.duration as f64);
                }
            }
        }
    }

    fn audio(&mut self, rep: usize, load: Load, mode: Mode) -> Result<AudioResult> {
        let secs = self.s.audio_secs;
        self.progress
            .phase(&format!("{load}/audio/{mode} rep {rep}"), secs as f64);
        let out = self
            .vm
            .exec_ok(&guest::audiosim_cmd(secs), Duration::from_secs(secs + 60))
            .map_err(guest("audiosim"))?;
        let r: AudioResult = guest::parse_line("audiosim", &out)?;
        eprintln!(
            "    audio: {} glitches in {} periods, worst delay {} us",
            r.glitches, r.periods, r.late_max_us
        );
        Ok(r)
    }

    fn pingpong(&mut self, rep: usize, load: Load, mode: Mode) -> Result<PingPongResult> {
        let secs = self.s.pingpong_secs;
        self.progress
            .phase(&format!("{load}/ping-pong/{mode} rep {rep}"), secs as f64);
        let out = self
            .vm
            .exec_ok(
                &guest::pingpong_cmd(secs, self.guest_cpus),
                Duration::from_secs(secs + 60),
            )
            .map_err(guest("pingpong"))?;
        let r: PingPongResult = guest::parse_line("pingpong", &out)?;
        eprintln!(
            "    ping-pong: {} round trips, p50 {:.0} us, p99 {:.0} us",
            r.round_trips, r.p50_us, r.p99_us
        );
        Ok(r)
    }

    /// One (repeat, load, mode) session: load on, mode on, every phase,
    /// mode off (verified), load off.
    pub(super) fn session(&mut self, rep: usize, load: Load, mode: Mode) {
        let s = self.s;
        let (nominal, _) = session_plan(s);
        if mode.is_pvsched() && self.pvsched_broken.is_some() {
            self.skip_session(rep, load, mode);
            return;
        }
        let tag = format!("rep{rep}-{load}-{mode}");
        let stress = if load == Load::Loaded {
            let bound_s = (nominal * 3.0) as u64 + 300;
            match host::Load::start_session(
                self.host_cpus,
                bound_s,
                &self.run_dir,
                &self.raw_dir,
                &tag,
            ) {
                Ok(l) => {
                    std::thread::sleep(Duration::from_secs(1));
                    Some(l)
                }
                Err(e) => {
                    self.error(format!("{tag}: host load: {e}"));
                    return;
                }
            }
        } else {
            None
        };
        let mut run = SessionRun {
            rep,
            ..Default::default()
        };
        match self.apply(mode) {
            Err(e) => {
                self.error(format!("{tag}: {e}"));
                self.skip_session(rep, load, mode);
            }
            Ok(applied) => {
                let probe = self.probe(stress.as_ref(), &applied);
                for &interval in &s.intervals {
                    self.latency_undisturbed(rep, load, interval, mode, &probe);
                }
                if s.audio_secs > 0 {
                    match self.audio(rep, load, mode) {
                        Ok(a) => run.audio = Some(a),
                        Err(e) => self.error(format!("{tag}: {e}")),
                    }
                }
                if s.pingpong_secs > 0 {
                    match self.pingpong(rep, load, mode) {
                        Ok(p) => run.pingpong = Some(p),
                        Err(e) => self.error(format!("{tag}: {e}")),
                    }
                }
                let (status, end) = self.restore(applied, mode);
                run.daemon_status = status;
                run.reaction = end.reaction;
                run.reaction_wakeup = end.reaction_wakeup;
                run.setattr = end.setattr;
                run.daemon_counters = end.counters;
                run.daemon_seconds = end.seconds;
            }
        }
        if let Some(l) = stress {
            match l.stop() {
                Ok(rates) => run.load = rates,
                Err(e) => self.error(format!("{tag}: stopping the host load: {e}")),
            }
        }
        self.results
            .sessions
            .entry((load, mode))
            .or_default()
            .push(run);
    }

    /// What a session's cyclictest phases read CPU time from: QEMU, its
    /// vCPU threads, the host load's tree and, in the pvsched modes, pvschedd.
    fn probe<'a>(&self, stress: Option<&host::Load>, applied: &'a Applied) -> share::Probe<'a> {
        let mut vcpus = self.vcpus.clone();
        vcpus.sort_unstable();
        share::Probe {
            qemu: self.vm.qemu_pid(),
            vcpus: vcpus.into_iter().map(|(_, tid)| tid).collect(),
            load: stress.map(host::Load::pid),
            daemon: match applied {
                Applied::Daemon(d) => Some(d),
                _ => None,
            },
            boost_budget_permille: Some(share::boost_budget_permille(&self.s.pvschedd_overlay)),
        }
    }

    /// Counts the phases of a session that cannot run.
    fn skip_session(&mut self, rep: usize, load: Load, mode: Mode) {
        let s = self.s;
        for &interval in &s.intervals {
            self.progress.skip(
                &format!("{load}/{interval}us/{mode} rep {rep}"),
                s.duration as f64,
            );
        }
        if s.audio_secs > 0 {
            self.progress.skip(
                &format!("{load}/audio/{mode} rep {rep}"),
                s.audio_secs as f64,
            );
        }
        if s.pingpong_secs > 0 {
            self.progress.skip(
                &format!("{load}/ping-pong/{mode} rep {rep}"),
                s.pingpong_secs as f64,
            );
        }
    }

    /// The guest died during session `tag` (its notes from index `notes` on
    /// say how): folds those notes into one, and boots a new guest, as the
    /// first one was, unless `MAX_GUESTS_LOST` are gone already.
    pub(super) fn guest_lost(&mut self, tag: &str, notes: usize) -> Result<()> {
        self.journal.guest_lost(notes, tag, "a new guest");
        self.guests_lost += 1;
        if self.guests_lost > MAX_GUESTS_LOST {
            return Err(BenchError::Tool {
                what: "the guest".into(),
                detail: format!("lost {} times", self.guests_lost),
            });
        }
        let (nominal, phases) = session_plan(self.s);
        for _ in 0..phases {
            self.progress.add(nominal / phases as f64);
        }
        let vm = Vm::boot(vm_config(self.s, &self.image, "bench", self.accel))
            .map_err(guest("booting the guest again"))?;
        let (rc, out) = vm.insmod("").map_err(guest("insmod"))?;
        if rc != 0 {
            return Err(BenchError::GuestModule { output: out });
        }
        self.vcpus = vcpu_threads(&vm)?;
        self.baseline = thread_baseline(vm.qemu_pid())?;
        // pvschedd cannot serve a guest that died before it started (its
        // QMP socket and process gone): that says nothing of pvschedd, and
        // the session is measured again on this guest, not skipped.
        self.pvsched_broken = None;
        let _ = vm.exec(
            &guest::cyclictest_cmd(1000, 3, self.guest_cpus as usize, 1000),
            Duration::from_secs(60),
        );
        self.vm = vm;
        Ok(())
    }

    /// Whether the guest still runs commands (three tries: a loaded TCG
    /// guest can be slow to answer).
    pub(super) fn vm_alive(&mut self) -> bool {
        for attempt in 1..=3 {
            match self.vm.exec("true", Duration::from_secs(60)) {
                Ok((0, _)) => return true,
                Ok((rc, out)) => {
                    self.note(format!("guest check {attempt}: `true` exited {rc}: {out}"))
                }
                Err(e) => self.note(format!(
                    "guest check {attempt}: {}",
                    first_line(&e.to_string())
                )),
            }
        }
        false
    }
}

/// Guests a run may lose (QEMU gone mid-session) and boot again before it
/// gives up: on a real host one is already news; under emulation (the KVM
/// host VM, `crates/hostvm/README.md`) guests are lost now and then.
pub const MAX_GUESTS_LOST: usize = 20;
