//! One message-passing run in progress: per (repeat, load) block a warm-up
//! and every idle case's session, each workload measured on both sides.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use pvsched_base::kvm_params::HaltPoll;
use pvsched_vmtest::{Accel, Vm};

use super::model::*;
use super::readings::*;
use super::settings::*;
use crate::daemon::{Binaries, VM_NAME};
use crate::error::{guest, BenchError, Result};
use crate::foreign;
use crate::harness::axes::{mode_order, Load};
use crate::harness::disturbance::{Judgement, Retries};
use crate::harness::journal::{Journal, Journaled};
use crate::harness::vm::ThreadBaseline;
use crate::host::{self};
use crate::progress::Progress;

pub(super) struct Bench<'a> {
    pub(super) s: &'a MsgSettings,
    pub(super) vm: Vm,
    pub(super) vcpus: Vec<(u32, i32)>,
    pub(super) baseline: ThreadBaseline,
    pub(super) bins: Binaries,
    pub(super) run_dir: PathBuf,
    pub(super) raw_dir: PathBuf,
    pub(super) host_cpus: usize,
    pub(super) guest_cpus: u32,
    pub(super) blocks: Vec<Block>,
    pub(super) sessions: Vec<Session>,
    pub(super) journal: Journal,
    pub(super) progress: Progress,
    /// Cases that cannot run in this guest, and why.
    pub(super) unavailable: std::collections::BTreeMap<IdleCase, String>,
    pub(super) accel: Accel,
    /// KVM's halt polling before a `kvm-poll-off` session set it.
    pub(super) kvm_poll_before: Option<HaltPoll>,
}

impl Journaled for Bench<'_> {
    fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }
}

impl Bench<'_> {
    /// The host load for a session (loaded host), started [`SETTLE`] ago.
    fn start_stress(&mut self, load: Load, tag: &str) -> Result<Option<host::Load>> {
        if load != Load::Loaded {
            std::thread::sleep(SETTLE);
            return Ok(None);
        }
        // A bound in case the bench dies without stopping it.
        let nominal = Workload::ALL.len() as u64 * self.s.base.duration;
        let l = host::Load::start_session(
            self.host_cpus,
            nominal * 3 + 300,
            &self.run_dir,
            &self.raw_dir,
            tag,
        )?;
        std::thread::sleep(SETTLE);
        Ok(Some(l))
    }

    /// One workload, measured on both sides: the program's figures and the
    /// idle counters in the guest, the vCPU threads' run time on the host.
    fn measure(&mut self, w: Workload, tag: &str) -> Result<Measurement> {
        let secs = self.s.base.duration;
        let qemu = self.vm.qemu_pid();
        let tids: Vec<i32> = self.vcpus.iter().map(|v| v.1).collect();
        let before = foreign::sample();
        let t0 = Instant::now();
        let run0 = run_times(qemu, &tids)?;
        let result = self
            .vm
            .exec(&measure_cmd(w, secs), Duration::from_secs(secs + 60));
        let run1 = run_times(qemu, &tids)?;
        let host_window_s = t0.elapsed().as_secs_f64();
        let foreign_cpu = foreign::fraction(&before, &foreign::sample(), self.host_cpus);
        let (rc, out) = result.map_err(guest(format!("{w} in the guest")))?;
        let _ = std::fs::write(self.raw_dir.join(format!("{tag}-{w}.txt")), &out);
        if rc != 0 {
            return Err(BenchError::Tool {
                what: w.to_string(),
                detail: format!("exit {rc}: {}", tail(&out)),
            });
        }
        let mut m = parse_measurement(w, &out, self.guest_cpus)?;
        m.host_window_s = host_window_s;
        m.vcpu_run_s = run0
            .iter()
            .zip(&run1)
            .map(|(a, b)| b.saturating_sub(*a) as f64 / 1e9)
            .collect();
        m.foreign_cpu = foreign_cpu;
        eprintln!(
            "    {w}: {:.0} {}, latency p50 {:.1} us p99 {:.1} us | host CPU {:.1} % per vCPU | \
             guest poll {} | other load {:.0} %",
            m.per_s,
            w.unit(),
            m.latency_p50_us,
            m.latency_p99_us,
            m.host_cpu_per_vcpu() * 100.0,
            match (m.poll_share(), m.idle) {
                (Some(p), Some(c)) => format!(
                    "{:.2} % ({} polls, {} hits, {} timeouts, {} overload halts, {} halts)",
                    p * 100.0,
                    c.polls,
                    c.poll_hits,
                    c.poll_timeouts,
                    c.overload_halts,
                    c.halts
                ),
                _ => "n/a (no idle driver)".into(),
            },
            m.foreign_cpu * 100.0
        );
        Ok(m)
    }

    /// [`Self::measure`], again (up to `--retry-disturbed` times) while
    /// others took more than [`DISTURBED`](crate::harness::disturbance::DISTURBED) of the machine.
    fn measure_undisturbed(&mut self, w: Workload, tag: &str, label: &str) -> Result<Measurement> {
        let secs = self.s.base.duration as f64;
        let mut retries = Retries::new(&format!("{tag}-{w}"), self.s.base.retry_disturbed);
        loop {
            self.progress.phase(label, secs);
            let m = self.measure(w, tag)?;
            match retries.judge(m.foreign_cpu) {
                Judgement::Keep => return Ok(m),
                Judgement::Disturbed(note) => {
                    self.note(note);
                    return Ok(m);
                }
                Judgement::Again(note) => {
                    self.note(note);
                    self.progress.add(secs);
                }
            }
        }
    }

    /// Counts the phases of a session that does not run.
    fn skip_session(&mut self, rep: usize, load: Load, case: IdleCase) {
        for w in Workload::ALL {
            self.progress.skip(
                &format!("{load}/{case}/{w} rep {rep}"),
                self.s.base.duration as f64,
            );
        }
    }

    /// The warm-up of a block: `default` mode, the load on, every workload
    /// once (not counted); then the advisor's window from the daemon.
    fn warm_up(&mut self, rep: usize, load: Load) -> Block {
        let mut block = Block {
            rep,
            load,
            advice: None,
            idle_report: None,
            daemon_status: None,
        };
        let tag = format!("rep{rep}-{load}-warmup");
        let secs = self.s.base.duration;
        self.progress.phase(
            &format!("{load}/warm-up (default) rep {rep}"),
            (Workload::ALL.len() as u64 * secs) as f64,
        );
        let params = IdleCase::Default.insmod_params(None).unwrap_or_default();
        if let Err(e) = self.load_module(IdleCase::Default, &params) {
            self.error(format!("{tag}: {e}"));
            return block;
        }
        let stress = match self.start_stress(load, &tag) {
            Ok(l) => l,
            Err(e) => {
                self.error(format!("{tag}: host load: {e}"));
                return block;
            }
        };
        for w in Workload::ALL {
            let r = self
                .vm
                .exec(&w.command(secs), Duration::from_secs(secs + 60));
            match r {
                Ok((0, out)) => {
                    let _ = std::fs::write(self.raw_dir.join(format!("{tag}-{w}.txt")), out);
                }
                Ok((rc, out)) => self.error(format!("{tag}: {w} exited {rc}: {}", tail(&out))),
                Err(e) => self.error(format!("{tag}: {w}: {e}")),
            }
        }
        if let Some(l) = stress {
            if let Err(e) = l.stop() {
                self.error(format!("{tag}: stopping the host load: {e}"));
            }
        }
        match self
            .idle_report()
            .and_then(|r| parse_advice(&r, VM_NAME).map(|a| (a, r)))
        {
            Ok((advice, report)) => {
                match &advice {
                    Some(a) => eprintln!(
                        "    advisor ({:.1} % budget): window {:.1} us -> idle_poll_us={} \
                         (catches {:.0} % of halts, polls {:.2} % of a core; {}; per vCPU {:?} us)",
                        f64::from(self.s.budget_permille) / 10.0,
                        a.window_us_exact,
                        a.window_us,
                        a.hit_rate * 100.0,
                        a.cpu_share * 100.0,
                        a.source,
                        a.per_vcpu_us
                    ),
                    None => self.note(format!(
                        "{tag}: pvschedd measured no halts in the warm-up: no advice, the \
                         advisor case is skipped this repeat"
                    )),
                }
                block.advice = advice;
                block.idle_report = Some(report);
            }
            Err(e) => self.error(format!("{tag}: the advisor's window: {e}")),
        }
        block
    }

    /// One (repeat, load, case) session: module in the case's mode, load
    /// on, every workload, load off.
    fn session(&mut self, rep: usize, load: Load, case: IdleCase, window: Option<u32>) {
        let tag = format!("rep{rep}-{load}-{case}");
        if let Some(why) = self.unavailable.get(&case) {
            eprintln!("    {case}: skipped ({why})");
            self.skip_session(rep, load, case);
            return;
        }
        let Some(params) = case.insmod_params(window) else {
            self.note(format!("{tag}: skipped: no advised window this repeat"));
            self.skip_session(rep, load, case);
            return;
        };
        let kvm_poll = if case.sets_kvm_polling() {
            match self.set_kvm_polling(case) {
                Ok(p) => Some(p),
                Err(why) => {
                    self.note(format!(
                        "{tag}: case {case} unavailable, skipped for the rest of the run: {why}"
                    ));
                    self.unavailable.insert(case, why);
                    self.skip_session(rep, load, case);
                    return;
                }
            }
        } else {
            None
        };
        let driver = match self.load_module(case, &params) {
            Ok(d) => d,
            Err(e) => {
                let why = format!("pvsched.ko {params}: {e}");
                self.note(format!(
                    "{tag}: case {case} unavailable in this guest, skipped for the rest of the \
                     run: {why}"
                ));
                self.unavailable.insert(case, why);
                self.skip_session(rep, load, case);
                if kvm_poll.is_some() {
                    if let Err(e) = self.restore_kvm_polling() {
                        self.error(format!("{tag}: putting KVM's halt polling back: {e}"));
                    }
                }
                return;
            }
        };
        eprintln!("    pvsched.ko {params}: {driver}");
        // The session's record names KVM's polling too (the module never sees it).
        let params = match &kvm_poll {
            Some(p) => format!("{params}, KVM halt_poll_ns={}", p.halt_poll_ns),
            None => params,
        };
        let stress = match self.start_stress(load, &tag) {
            Ok(l) => l,
            Err(e) => {
                self.error(format!("{tag}: host load: {e}"));
                self.skip_session(rep, load, case);
                if kvm_poll.is_some() {
                    if let Err(e) = self.restore_kvm_polling() {
                        self.error(format!("{tag}: putting KVM's halt polling back: {e}"));
                    }
                }
                return;
            }
        };
        let mut runs = Vec::new();
        for w in Workload::ALL {
            let label = format!("{load}/{case}/{w} rep {rep}");
            match self.measure_undisturbed(w, &tag, &label) {
                Ok(m) => runs.push(m),
                Err(e) => self.error(format!("{tag}-{w}: {e}")),
            }
        }
        let mut load_rates = Vec::new();
        if let Some(l) = stress {
            match l.stop() {
                Ok(r) => load_rates = r,
                Err(e) => self.error(format!("{tag}: stopping the host load: {e}")),
            }
        }
        if kvm_poll.is_some() {
            if let Err(e) = self.restore_kvm_polling() {
                self.error(format!("{tag}: putting KVM's halt polling back: {e}"));
            }
        }
        if load == Load::Loaded && !load_rates.is_empty() {
            let ops: Vec<String> = load_rates
                .iter()
                .map(|r| format!("{} {:.1}", r.stressor, r.ops_per_s))
                .collect();
            eprintln!("    host stress-ng bogo-ops/s: {}", ops.join(", "));
        }
        self.sessions.push(Session {
            rep,
            load,
            case,
            params,
            driver,
            load_rates,
            runs,
        });
    }

    /// One (repeat, load) block: pvschedd afresh, the warm-up and advice,
    /// every case in rotated order, pvschedd stopped and every QEMU thread
    /// checked.
    pub(super) fn block(&mut self, rep: usize, load: Load, load_idx: usize) {
        let daemon = match self.start_daemon() {
            Ok(d) => d,
            Err(e) => {
                self.error(format!("rep{rep}-{load}: pvschedd: {e}"));
                let secs = (Workload::ALL.len() as u64 * self.s.base.duration) as f64;
                self.progress
                    .skip(&format!("{load}/warm-up (default) rep {rep}"), secs);
                for case in self.s.cases.clone() {
                    self.skip_session(rep, load, case);
                }
                self.verify_restored(&format!("rep{rep}-{load}: a failed pvschedd start"));
                return;
            }
        };
        eprintln!("    pvschedd (pid {}) serving the guest", daemon.pid());
        let mut block = self.warm_up(rep, load);
        let window = block.advice.as_ref().map(|a| a.window_us);
        for case in mode_order(&self.s.cases, rep - 1, load_idx) {
            self.session(rep, load, case, window);
        }
        match daemon.status() {
            Ok(st) => block.daemon_status = serde_json::to_value(st).ok(),
            Err(e) => self.note(format!("rep{rep}-{load}: pvschedd status at the end: {e}")),
        }
        if let Err(e) = daemon.stop() {
            self.error(format!("rep{rep}-{load}: {e}"));
        }
        self.verify_restored(&format!("rep{rep}-{load}"));
        self.blocks.push(block);
    }

    /// Puts every QEMU thread back to its boot-time parameters; notes any
    /// thread that was not there.
    fn verify_restored(&mut self, after: &str) {
        for m in crate::harness::vm::restore_threads(&self.baseline, after) {
            self.note(m);
        }
    }

    /// Whether the guest still runs commands (three tries: a loaded TCG
    /// guest can be slow to answer).
    pub(super) fn vm_alive(&mut self) -> bool {
        (1..=3).any(|_| matches!(self.vm.exec("true", Duration::from_secs(60)), Ok((0, _))))
    }
}

/// Seconds between starting the host load (or loading the module) and the
/// first measurement: stress-ng's workers spread out, and the daemon's wake
/// hints (a window of about a second) reach the reloaded module.
const SETTLE: Duration = Duration::from_secs(1);
