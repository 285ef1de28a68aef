//! The rogue-guest scenario (`--scenario rogue`): two guests side by side,
//! a well-behaved *neighbour* (the usual guest cyclictest) and a *rogue*
//! (`rtspin` at SCHED_FIFO on every vCPU), a host cyclictest at the same
//! time, pvschedd serving both VMs. The cases (pvsched with the rogue idle,
//! pvsched with it spinning, vanilla with it spinning...) are interleaved
//! per repeat as the standard scenario interleaves its modes.
//!
//! Measured per phase: both cyclictests, the CPU time of each QEMU process
//! over the window (its share of the machine), pvschedd's counters of each
//! VM over the window, the share of the machine others took meanwhile.
//! Results: see `rogue_report`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pvsched_base::sched::{get_params, set_params, ThreadParams};
use pvsched_base::thread::threads_of;
use pvsched_vmtest::{Accel, Vm};
use serde_json::Value;

use crate::daemon::pin_daemon;
use crate::daemon::{Binaries, Daemon, VmEntry};
use crate::error::{guest, BenchError, Result};
use crate::foreign;
use crate::guest as gp;
use crate::harness::axes::{mode_order, Load, Mode};
use crate::harness::disturbance::DISTURBED;
use crate::harness::journal::first_line;
use crate::harness::journal::{Journal, Journaled};
use crate::harness::meta::Meta;
use crate::harness::output::json;
use crate::harness::plan::{announce, listed};
use crate::harness::settings::Settings;
use crate::harness::start::{in_private_tmp, Start};
use crate::harness::vm::{boot_pair, Guest};
use crate::host::{self, HostCyclictest, Machine};
use crate::plot;
use crate::progress::Progress;
use crate::rogue_report::{
    self, Case, ParamsSeen, Phase, RogueMeta, RogueRaw, RogueReport, SessionStatus, VmCounters,
    NEIGHBOUR, ROGUE, SHARE_DEFINITION, THREAD_GROUPS,
};
use crate::stats::Histogram;

/// The standard settings plus what only this scenario has.
#[derive(Clone, Debug)]
pub struct RogueSettings {
    /// out, repeat, duration, intervals, loads, accel, smp, memory, pvschedd,
    /// its overlay, buckets, retries and the command line; the modes, audio
    /// and ping-pong settings are not used.
    pub base: Settings,
    pub cases: Vec<Case>,
    /// SCHED_FIFO priority of the rogue's rtspin in the guest.
    pub priority: u32,
}

/// Phases and nominal seconds of the whole run.
pub fn plan(s: &RogueSettings) -> (usize, f64) {
    let b = &s.base;
    let phases = b.repeat * b.loads.len() * s.cases.len() * b.intervals.len();
    (phases, phases as f64 * b.duration as f64)
}

/// Longest a rogue rtspin runs if nothing kills it (the bench dying between
/// its start and its kill): the measurement and a margin.
fn spin_bound(duration: u64) -> u64 {
    duration + 120
}

/// The guest command that starts the rogue on vCPUs `0..vcpus` and returns
/// once every rtspin says it runs at SCHED_FIFO (or after ~30 s), printing
/// their lines. Each rtspin's output goes to its own file, so the command
/// does not wait for them.
pub fn spin_cmd(vcpus: u32, priority: u32, secs: u64) -> String {
    let mut c = String::from("rm -f /tmp/rogue-*.log; ");
    for cpu in 0..vcpus {
        c.push_str(&format!(
            "rtspin -c {cpu} -P fifo -p {priority} -t {secs} -s 0 </dev/null \
             >/tmp/rogue-{cpu}.log 2>&1 & "
        ));
    }
    c.push_str(&format!(
        "i=0; while [ \"$(cat /tmp/rogue-*.log 2>/dev/null | grep -c 'rtspin: ready')\" -lt {vcpus} ] \
         && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; cat /tmp/rogue-*.log"
    ));
    c
}

/// The guest command that stops the rogue and fails if an rtspin survives.
pub const STOP_CMD: &str = "killall rtspin 2>/dev/null; i=0; \
    while pidof rtspin >/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; \
    ! pidof rtspin >/dev/null";

/// rtspin processes that said they are ready, in a guest command's output.
pub fn count_ready(out: &str) -> u32 {
    out.lines().filter(|l| l.contains("rtspin: ready")).count() as u32
}

/// CPU ticks of both QEMU processes at one moment.
#[derive(Clone, Copy)]
struct Ticks {
    rogue: u64,
    neighbour: u64,
    at: Instant,
}

fn ticks(rogue: u32, neighbour: u32) -> Ticks {
    Ticks {
        rogue: foreign::process_ticks(rogue).unwrap_or(0),
        neighbour: foreign::process_ticks(neighbour).unwrap_or(0),
        at: Instant::now(),
    }
}

/// utime + stime of the threads `tids` of process `pid`, in clock ticks
/// (threads gone count 0).
fn task_ticks(pid: u32, tids: &[i32]) -> u64 {
    tids.iter()
        .filter_map(|t| std::fs::read_to_string(format!("/proc/{pid}/task/{t}/stat")).ok())
        .filter_map(|text| foreign::parse_utime_stime(&text))
        .sum()
}

/// How often the host's scheduling parameters of the watched threads are read.
const WATCH_EVERY: Duration = Duration::from_millis(10);

/// SCHED_FIFO priority of the thread that samples CPU times and parameters:
/// above pvschedd's boosts (2..4) and its event thread (5), below the
/// cyclictests (8). At SCHED_OTHER it ran mostly while no boosted vCPU
/// held the CPUs, and so undercounted the boosts (seen: 3-22 % RT samples
/// while pvschedd counted ~85 % boosted time).
const SAMPLER_PRIORITY: u32 = 6;

/// `sched_getattr` of every thread of `groups` every [`WATCH_EVERY`] until
/// `until`.
fn watch_params(groups: &[(&str, Vec<i32>)], until: Instant) -> BTreeMap<String, ParamsSeen> {
    let mut seen: BTreeMap<String, ParamsSeen> = BTreeMap::new();
    loop {
        for (g, tids) in groups {
            let e = seen.entry(g.to_string()).or_default();
            for &tid in tids {
                if let Ok(p) = get_params(tid) {
                    e.samples += 1;
                    if p.is_rt() {
                        e.rt += 1;
                        *e.rt_by_params.entry(p.to_string()).or_default() += 1;
                    }
                }
            }
        }
        let now = Instant::now();
        if now >= until {
            return seen;
        }
        std::thread::sleep(WATCH_EVERY.min(until - now));
    }
}

/// Share of the machine (0..1) of `b - a` ticks over `secs` on `cpus` CPUs.
pub fn share_of(a: u64, b: u64, secs: f64, cpus: usize) -> f64 {
    let wall = secs * cpus.max(1) as f64 * foreign::ticks_per_second() as f64;
    if wall <= 0.0 {
        return 0.0;
    }
    b.saturating_sub(a) as f64 / wall
}

struct Bench<'a> {
    s: &'a RogueSettings,
    neighbour: Guest,
    rogue: Guest,
    bins: Option<Binaries>,
    run_dir: PathBuf,
    raw_dir: PathBuf,
    host_cpus: usize,
    phases: Vec<Phase>,
    sessions: Vec<SessionStatus>,
    journal: Journal,
    progress: Progress,
    pvsched_broken: Option<String>,
}

impl Journaled for Bench<'_> {
    fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }
}

impl Bench<'_> {
    fn verify_restored(&mut self, after: &str) {
        let mut msgs = crate::harness::vm::restore_threads(&self.neighbour.baseline, after);
        msgs.extend(crate::harness::vm::restore_threads(
            &self.rogue.baseline,
            after,
        ));
        for m in msgs {
            self.note(m);
        }
    }

    /// pvschedd serving both VMs (over QMP; once more by thread names if
    /// that fails), or nothing for vanilla.
    fn apply(&mut self, mode: Mode) -> Result<Option<Daemon>> {
        if mode != Mode::Pvsched {
            return Ok(None);
        }
        if let Some(why) = &self.pvsched_broken {
            return Err(BenchError::PvschedUnavailable(why.clone()));
        }
        let bins = self.bins.clone().ok_or_else(|| {
            BenchError::PvschedUnavailable("pvsched cases without pvschedd binaries".into())
        })?;
        let (neighbour, rogue) = (&self.neighbour, &self.rogue);
        let entries = |by_pid: bool| -> Result<Vec<VmEntry>> {
            Ok(vec![
                neighbour.entry(NEIGHBOUR, by_pid)?,
                rogue.entry(ROGUE, by_pid)?,
            ])
        };
        let overlay = &self.s.base.pvschedd_overlay;
        let run_dir = self.run_dir.clone();
        let started =
            match entries(false).and_then(|e| Daemon::start_vms(&bins, &run_dir, &e, overlay)) {
                Ok(d) => Ok(d),
                Err(e) => {
                    let retry =
                        entries(true).and_then(|e| Daemon::start_vms(&bins, &run_dir, &e, overlay));
                    self.note(format!(
                        "pvschedd did not serve both VMs found over QMP; tried again with their \
                     QEMU pids (thread names): {}",
                        first_line(&e.to_string())
                    ));
                    retry
                }
            };
        started.map(Some).inspect_err(|_| {
            self.pvsched_broken = Some(
                "pvsched cases skipped: pvschedd did not serve the VMs earlier in this run".into(),
            );
        })
    }

    /// Stops the daemon (if any), returns its last status, checks every
    /// QEMU thread of both VMs.
    fn restore(&mut self, daemon: Option<Daemon>, case: Case) -> Option<Value> {
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
        self.verify_restored(case.name());
        status
    }

    /// Starts rtspin on every rogue vCPU; returns how many said they run.
    fn spin(&mut self, tag: &str) -> Result<u32> {
        let t = Instant::now();
        let cmd = spin_cmd(
            self.rogue.cpus,
            self.s.priority,
            spin_bound(self.s.base.duration),
        );
        let out = match self.rogue.vm.exec_ok(&cmd, Duration::from_secs(60)) {
            Ok(out) => out,
            Err(e) => {
                // Some may run: stop them before the next measurement.
                let _ = self.unspin();
                return Err(guest("starting the rogue's rtspin")(e));
            }
        };
        let _ = std::fs::write(self.raw_dir.join(format!("{tag}-rogue.log")), &out);
        let n = count_ready(&out);
        eprintln!(
            "    rogue: rtspin FIFO {} running on {n} of {} vCPUs (started in {:.1} s)",
            self.s.priority,
            self.rogue.cpus,
            t.elapsed().as_secs_f64()
        );
        if n < self.rogue.cpus {
            let _ = self.unspin();
            return Err(BenchError::Tool {
                what: "rogue rtspin".into(),
                detail: format!(
                    "only {n} of {} vCPUs started spinning: {}",
                    self.rogue.cpus,
                    out.trim()
                ),
            });
        }
        Ok(n)
    }

    /// Kills the rogue's rtspin; an error if one survives.
    fn unspin(&self) -> Result<()> {
        self.rogue
            .vm
            .exec_ok(STOP_CMD, Duration::from_secs(60))
            .map(|_| ())
            .map_err(guest("stopping the rogue's rtspin"))
    }

    /// The QEMU threads of both VMs in [`THREAD_GROUPS`]' groups.
    fn thread_groups(&self) -> Vec<(&'static str, Vec<i32>)> {
        let mut out = Vec::new();
        for (g, (vcpu_group, other_group)) in [
            (&self.rogue, (THREAD_GROUPS[0], THREAD_GROUPS[1])),
            (&self.neighbour, (THREAD_GROUPS[2], THREAD_GROUPS[3])),
        ] {
            let vcpus: Vec<i32> = g.vcpus.iter().map(|v| v.1).collect();
            let others: Vec<i32> = threads_of(g.vm.qemu_pid() as i32)
                .unwrap_or_default()
                .into_iter()
                .map(|(tid, _)| tid)
                .filter(|t| !vcpus.contains(t))
                .collect();
            out.push((vcpu_group, vcpus));
            out.push((other_group, others));
        }
        out
    }

    /// pvschedd's status of every VM, by name (empty without a daemon or
    /// when it does not answer).
    fn vm_statuses(daemon: Option<&Daemon>) -> BTreeMap<String, pvsched_control::VmStatus> {
        daemon
            .and_then(|d| d.status().ok())
            .map(|st| st.vms.into_iter().map(|v| (v.name.clone(), v)).collect())
            .unwrap_or_default()
    }

    /// One measurement with the rogue started before and stopped after (in
    /// the spinning cases); returns the share of the machine others took.
    fn measure(
        &mut self,
        rep: usize,
        load: Load,
        interval: u32,
        case: Case,
        daemon: Option<&Daemon>,
    ) -> Result<f64> {
        let tag = format!("rep{rep}-{load}-{interval}us-{case}");
        self.progress.phase(
            &format!("{load}/{interval}us/{case} rep {rep}"),
            self.s.base.duration as f64,
        );
        let spinning = if case.spinning() { self.spin(&tag)? } else { 0 };
        let result = self.measure_spinning(rep, load, interval, case, daemon, spinning, &tag);
        if spinning > 0 {
            if let Err(e) = self.unspin() {
                self.error(format!("{tag}: {e}"));
            }
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn measure_spinning(
        &mut self,
        rep: usize,
        load: Load,
        interval: u32,
        case: Case,
        daemon: Option<&Daemon>,
        spinning: u32,
        tag: &str,
    ) -> Result<f64> {
        let s = &self.s.base;
        let (rogue_pid, neighbour_pid) = (self.rogue.vm.qemu_pid(), self.neighbour.vm.qemu_pid());
        let groups = self.thread_groups();
        let rogue_vcpus: Vec<i32> = self.rogue.vcpus.iter().map(|v| v.1).collect();
        let status_before = Self::vm_statuses(daemon);
        let before = foreign::sample();
        let t0 = ticks(rogue_pid, neighbour_pid);
        let vcpu_t0 = task_ticks(rogue_pid, &rogue_vcpus);
        let host_json = self.raw_dir.join(format!("{tag}-host.json"));
        let host_run = HostCyclictest::start(
            interval,
            s.duration,
            self.host_cpus,
            s.buckets,
            &host_json,
            &self.raw_dir.join(format!("{tag}-host.log")),
        )?;
        // The shares are sampled over exactly the cyclictest duration, and
        // the threads' parameters watched meanwhile, by a thread, while this
        // one waits for the guest's cyclictest.
        let until = t0.at + Duration::from_secs(s.duration);
        let (guest_run, t1) = std::thread::scope(|sc| {
            let (groups, rogue_vcpus) = (&groups, &rogue_vcpus);
            let sampler = sc.spawn(move || {
                let rt = set_params(0, &ThreadParams::fifo(SAMPLER_PRIORITY));
                let params = watch_params(groups, until);
                let t1 = ticks(rogue_pid, neighbour_pid);
                (t1, task_ticks(rogue_pid, rogue_vcpus), params, rt)
            });
            let g = self.neighbour.vm.exec(
                &gp::cyclictest_cmd(
                    interval,
                    s.duration,
                    self.neighbour.cpus as usize,
                    s.buckets,
                ),
                Duration::from_secs(s.duration + 60),
            );
            (g, sampler.join())
        });
        let host_hist = host_run.finish();
        let foreign_cpu = foreign::fraction(&before, &foreign::sample(), self.host_cpus);
        let status_after = Self::vm_statuses(daemon);
        let (t1, vcpu_t1, params, sampler_rt) = t1.map_err(|_| BenchError::Tool {
            what: "CPU time sampler".into(),
            detail: "its thread panicked".into(),
        })?;
        if let Err(e) = sampler_rt {
            self.note(format!(
                "{tag}: the sampler thread stayed SCHED_OTHER ({e}): it may undercount the \
                 time RT threads held the CPUs"
            ));
        }
        let guest_hist = crate::guest::guest_histogram(
            &self.raw_dir,
            tag,
            "the neighbour's guest cyclictest",
            guest_run,
        )?;
        let host_hist = host_hist?;
        let window_s = t1.at.duration_since(t0.at).as_secs_f64();
        let rogue_share = share_of(t0.rogue, t1.rogue, window_s, self.host_cpus);
        let neighbour_share = share_of(t0.neighbour, t1.neighbour, window_s, self.host_cpus);
        let rogue_vcpu_share = share_of(vcpu_t0, vcpu_t1, window_s, self.host_cpus);
        let daemon_counters: BTreeMap<String, VmCounters> = status_after
            .iter()
            .filter_map(|(name, after)| {
                let before = status_before.get(name)?;
                Some((name.clone(), VmCounters::between(before, after)))
            })
            .collect();
        let per_thread = s.duration * 1_000_000 / u64::from(interval);
        let rc = daemon_counters.get(ROGUE);
        eprintln!(
            "    neighbour p99 {} us max {} us | host p99 {} us max {} us | rogue {:.1} % \
             neighbour {:.1} % of the machine | other load {:.0} %{}{}",
            guest_hist.percentile(0.99),
            guest_hist.max_us,
            host_hist.percentile(0.99),
            host_hist.max_us,
            rogue_share * 100.0,
            neighbour_share * 100.0,
            foreign_cpu * 100.0,
            match params.get(THREAD_GROUPS[0]) {
                Some(p) => format!(" | rogue vCPUs at RT {:.0} % of samples", p.rt_pct()),
                None => String::new(),
            },
            match rc {
                Some(c) => format!(
                    " | rogue: {} boosts, {} throttles, {} over budget, {:.2} boosted vCPU-s{}",
                    c.boosts,
                    c.throttles,
                    c.over_budget,
                    c.boosted_s,
                    if c.in_debt_at_end { ", in debt" } else { "" }
                ),
                None => String::new(),
            }
        );
        self.phases.push(Phase {
            load,
            interval_us: interval,
            case,
            rep,
            guest: guest_hist,
            host: host_hist,
            guest_expected: per_thread * u64::from(self.neighbour.cpus),
            host_expected: per_thread * self.host_cpus as u64,
            foreign_cpu,
            window_s,
            rogue_share,
            rogue_vcpu_share,
            neighbour_share,
            params,
            rogue_spinning: spinning,
            daemon: daemon_counters,
        });
        Ok(foreign_cpu)
    }

    /// [`Self::measure`], again (up to `--retry-disturbed` times) while
    /// others took more than [`DISTURBED`] of the machine.
    fn measure_undisturbed(
        &mut self,
        rep: usize,
        load: Load,
        interval: u32,
        case: Case,
        daemon: Option<&Daemon>,
    ) {
        let tag = format!("rep{rep}-{load}-{interval}us-{case}");
        let mut tries = 0;
        loop {
            match self.measure(rep, load, interval, case, daemon) {
                Err(e) => {
                    self.error(format!("{tag}: {e}"));
                    return;
                }
                Ok(f) if f > DISTURBED && tries < self.s.base.retry_disturbed => {
                    tries += 1;
                    self.phases.pop();
                    self.note(foreign::retry_note(
                        &tag,
                        f,
                        tries,
                        self.s.base.retry_disturbed,
                    ));
                    self.progress.add(self.s.base.duration as f64);
                }
                Ok(f) if f > DISTURBED => {
                    self.note(foreign::disturbed_note(&tag, f));
                    return;
                }
                Ok(_) => return,
            }
        }
    }

    /// One (repeat, load, case) session: load on, daemon on, the
    /// measurements, daemon off (threads verified), load off.
    fn session(&mut self, rep: usize, load: Load, case: Case) {
        let b = &self.s.base;
        let tag = format!("rep{rep}-{load}-{case}");
        if case.mode() == Mode::Pvsched && self.pvsched_broken.is_some() {
            for &interval in &b.intervals {
                self.progress.skip(
                    &format!("{load}/{interval}us/{case} rep {rep}"),
                    b.duration as f64,
                );
            }
            return;
        }
        // The load and its first second before the measurement.
        let nominal = b.duration * b.intervals.len() as u64;
        let stress = match (load == Load::Loaded)
            .then(|| {
                host::Load::start_session(
                    self.host_cpus,
                    nominal * 3 + 300,
                    &self.run_dir,
                    &self.raw_dir,
                    &tag,
                )
            })
            .transpose()
        {
            Ok(l) => l,
            Err(e) => {
                self.error(format!("{tag}: host load: {e}"));
                return;
            }
        };
        if stress.is_some() {
            std::thread::sleep(Duration::from_secs(1));
        }
        match self.apply(case.mode()) {
            Err(e) => {
                self.error(format!("{tag}: {e}"));
                for &interval in &self.s.base.intervals {
                    self.progress.skip(
                        &format!("{load}/{interval}us/{case} rep {rep}"),
                        self.s.base.duration as f64,
                    );
                }
            }
            Ok(daemon) => {
                for &interval in &self.s.base.intervals {
                    self.measure_undisturbed(rep, load, interval, case, daemon.as_ref());
                }
                if let Some(status) = self.restore(daemon, case) {
                    self.sessions.push(SessionStatus {
                        load,
                        case,
                        rep,
                        status,
                    });
                }
            }
        }
        if let Some(l) = stress {
            if let Err(e) = l.stop() {
                self.error(format!("{tag}: stopping the host load: {e}"));
            }
        }
    }

    /// Whether both guests still run commands (a loaded TCG guest can be
    /// slow: three tries each).
    fn vms_alive(&mut self) -> bool {
        let alive = |vm: &Vm| {
            (1..=3).any(|_| matches!(vm.exec("true", Duration::from_secs(60)), Ok((0, _))))
        };
        for name in [NEIGHBOUR, ROGUE] {
            let vm = if name == ROGUE {
                &self.rogue.vm
            } else {
                &self.neighbour.vm
            };
            if !alive(vm) {
                self.note(format!("VM {name} does not answer `true` any more"));
                return false;
            }
        }
        true
    }
}

/// Runs the scenario; returns the report and whether every phase worked.
pub fn run(s: &RogueSettings) -> Result<(RogueReport, bool)> {
    let b = &s.base;
    let start = Start::begin(b)?;
    let pvsched = s.cases.iter().any(|c| c.mode() == Mode::Pvsched);
    let daemon = pvsched
        .then(|| pin_daemon(Binaries::locate(b.pvschedd.as_deref())?, &start.run_dir))
        .transpose()?;
    plot::init_font()?;
    let (phases, nominal) = plan(s);
    announce(
        &format!(
            "rogue scenario: {} repeats x loads [{}] x intervals [{}] x cases [{}]",
            b.repeat,
            listed(&b.loads),
            listed(b.intervals.iter().map(|i| format!("{i}us"))),
            listed(&s.cases)
        ),
        phases,
        nominal,
        nominal * 2.5 + 90.0,
        "boots and overheads",
        &start.out,
    );
    in_private_tmp(|| run_in(s, start, daemon))
}

/// The rogue scenario once its folders are there: boots the guests, runs
/// every session and renders the report. `daemon`: the pinned pvschedd and
/// what the report says about it, when a case needs it.
fn run_in(
    s: &RogueSettings,
    start: Start,
    daemon: Option<(Binaries, String)>,
) -> Result<(RogueReport, bool)> {
    let (started, t0, out, run_dir, raw_dir) = start.into_parts();
    let out = out.as_path();
    let pvsched = daemon.is_some();
    let (bins, pvschedd) = daemon.unzip();
    let pvschedd = pvschedd.unwrap_or_else(|| "not used".to_string());
    let b = &s.base;
    let (phases, nominal) = plan(s);
    let machine = Machine::probe(&pvsched_vmtest::workspace_root());
    let (nvm, rvm, accel_reason, accel) = boot_pair(b, NEIGHBOUR, ROGUE)?;
    let neighbour = Guest::new(nvm, pvsched)?;
    let rogue = Guest::new(rvm, pvsched)?;
    let rt_throttle = rogue
        .vm
        .exec_ok(
            "echo $(cat /proc/sys/kernel/sched_rt_runtime_us) us of every \
             $(cat /proc/sys/kernel/sched_rt_period_us) us",
            Duration::from_secs(30),
        )
        .map(|o| o.trim().to_string())
        .unwrap_or_else(|e| format!("unknown ({})", first_line(&e.to_string())));
    for (name, g) in [(NEIGHBOUR, &neighbour), (ROGUE, &rogue)] {
        eprintln!(
            "pvsched-bench: {name} up: {} vCPUs (threads {}), QEMU pid {}, pvsched.ko {}",
            g.cpus,
            g.vcpus
                .iter()
                .map(|(i, t)| format!("{i}:{t}"))
                .collect::<Vec<_>>()
                .join(" "),
            g.vm.qemu_pid(),
            g.module
        );
    }
    eprintln!("pvsched-bench: warm-up (3 s neighbour cyclictest, 1 s rogue spin; not counted)");
    let _ = neighbour.vm.exec(
        &gp::cyclictest_cmd(1000, 3, neighbour.cpus as usize, 1000),
        Duration::from_secs(60),
    );
    let _ = rogue.vm.exec(
        &format!("rtspin -c 0 -P fifo -p {} -t 1 -s 0", s.priority),
        Duration::from_secs(60),
    );

    let mut bench = Bench {
        s,
        host_cpus: machine.cpus,
        neighbour,
        rogue,
        bins,
        run_dir,
        raw_dir,
        phases: Vec::new(),
        sessions: Vec::new(),
        journal: Journal::default(),
        progress: Progress::new(phases, nominal),
        pvsched_broken: None,
    };
    if machine.cpus != bench.neighbour.cpus as usize {
        bench.journal.notes.push(format!(
            "each guest has {} vCPUs on {} host CPUs",
            bench.neighbour.cpus, machine.cpus
        ));
    }
    'outer: for rep in 1..=b.repeat {
        for (li, &load) in b.loads.iter().enumerate() {
            for case in mode_order(&s.cases, rep - 1, li) {
                let errors = bench.journal.errors;
                bench.session(rep, load, case);
                if bench.journal.errors > errors && !bench.vms_alive() {
                    bench.error("a guest stopped answering: run aborted".into());
                    break 'outer;
                }
            }
        }
    }
    loops_notes(&mut bench);

    let meta = RogueMeta {
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
            guest_cpus: bench.neighbour.cpus,
            guest_kernel: bench.neighbour.vm.kernel_release().to_string(),
            guest_module: bench.neighbour.module.clone(),
            load_cmd: format!("stress-ng {}", host::load_args(machine.cpus).join(" ")),
            pvschedd_settings: b.pvschedd_overlay.to_string(),
            static_rt_priority: b.static_rt_priority,
            machine,
            notes: bench.journal.notes.clone(),
        },
        rogue_vcpus: bench.rogue.cpus,
        rogue_module: bench.rogue.module.clone(),
        rogue_cmd: format!("rtspin -c {{cpu}} -P fifo -p {} -s 0", s.priority),
        rogue_rt_throttle: rt_throttle,
        pvschedd,
        share_definition: SHARE_DEFINITION.into(),
    };
    let raw = RogueRaw {
        scenario: "rogue".into(),
        meta,
        loads: b.loads.clone(),
        intervals: b.intervals.clone(),
        cases: s.cases.clone(),
        phases: bench.phases,
        sessions: bench.sessions,
    };
    let ok = bench.journal.errors == 0;
    drop(bench.neighbour);
    drop(bench.rogue);
    let report = render(out, &raw)?;
    Ok((report, ok))
}

/// Notes the cells where the neighbour's cyclictest lost many of its
/// periods (a starved guest skips them, which p99 alone understates).
fn loops_notes(bench: &mut Bench<'_>) {
    let mut low = Vec::new();
    for p in &bench.phases {
        if p.guest_expected > 0 {
            let r = p.guest.samples as f64 / p.guest_expected as f64;
            if r < 0.9 {
                low.push(format!(
                    "rep{}-{}-{}us-{}: the neighbour's cyclictest ran {:.0} % of its loops",
                    p.rep,
                    p.load,
                    p.interval_us,
                    p.case,
                    r * 100.0
                ));
            }
        }
    }
    for n in low {
        bench.note(n);
    }
}

/// Writes raw.json, report.json, the plots and report.md into `out`.
pub fn render(out: &Path, raw: &RogueRaw) -> Result<RogueReport> {
    let write = |name: &str, text: &str| crate::harness::output::write_into(out, name, text);
    write("raw.json", &json(raw))?;
    let mut report = rogue_report::build(raw);
    for &load in &raw.loads {
        for &interval in &raw.intervals {
            let hists: Vec<(Case, Histogram, Histogram)> = Case::ALL
                .iter()
                .filter(|c| raw.cases.contains(c))
                .filter(|c| !rogue_report::phases_of(raw, load, interval, **c).is_empty())
                .map(|&c| {
                    let (g, h) = rogue_report::merged(raw, load, interval, c);
                    (c, g, h)
                })
                .collect();
            if hists.is_empty() {
                continue;
            }
            let curves = |guest: bool| -> Vec<plot::Curve<'_>> {
                hists
                    .iter()
                    .map(|(c, g, h)| plot::Curve {
                        mode: c.name(),
                        hist: if guest { g } else { h },
                    })
                    .collect()
            };
            let name = format!("rogue-{load}-{interval}us.png");
            let title = format!(
                "rogue guest beside the neighbour: neighbour (left) and host (right) cyclictest, \
                 host {load}, {interval} µs ({}, {} x {} s per case)",
                raw.meta.base.accel.to_uppercase(),
                raw.meta.base.repeat,
                raw.meta.base.duration_s
            );
            plot::latency_ccdf(
                &out.join(&name),
                &title,
                interval,
                &curves(true),
                &curves(false),
            )?;
            report.plots.push(name);
        }
    }
    write("report.json", &json(&report))?;
    write("report.md", &rogue_report::markdown(&report))?;
    Ok(report)
}

/// Re-renders a report from a previous rogue run's raw.json (into its directory).
pub fn rerender(raw_path: &Path) -> Result<(RogueReport, PathBuf)> {
    crate::harness::raw::rerender(raw_path, render)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spin_command_starts_one_fifo_rtspin_per_vcpu_and_waits_for_all() {
        // Act
        let c = spin_cmd(2, 99, 130);

        // Assert
        assert!(c.contains("rtspin -c 0 -P fifo -p 99 -t 130 -s 0"), "{c}");
        assert!(c.contains("rtspin -c 1 -P fifo -p 99 -t 130 -s 0"), "{c}");
        assert!(!c.contains("rtspin -c 2"), "{c}");
        assert!(c.contains("-lt 2 ]"), "{c}");
        assert!(c.len() < pvsched_vmtest::MAX_COMMAND_LEN);
        assert!(!c.contains('\n'));
    }

    #[test]
    fn ready_lines_are_counted() {
        let out = "rtspin: ready pid=70 cpu=0\nrtspin: ready pid=71 cpu=1\nrtspin: sched_setscheduler: EPERM\n";
        assert_eq!(count_ready(out), 2);
    }

    #[test]
    fn a_share_is_ticks_over_the_window_times_the_cpus() {
        let hz = foreign::ticks_per_second();
        // One CPU busy for the whole 10 s window on 2 CPUs: half the machine.
        assert!((share_of(0, 10 * hz, 10.0, 2) - 0.5).abs() < 1e-9);
        assert_eq!(share_of(5, 3, 10.0, 2), 0.0);
        assert_eq!(share_of(0, 100, 0.0, 2), 0.0);
    }

    #[test]
    fn cases_rotate_so_each_leads_once_per_cycle() {
        let c = Case::DEFAULT;
        let firsts: Vec<Case> = (0..3).map(|r| mode_order(&c, r, 0)[0]).collect();
        assert_eq!(firsts, c.to_vec());
    }

    #[test]
    fn plan_counts_one_phase_per_case_interval_load_and_repeat() {
        let s = RogueSettings {
            base: Settings {
                repeat: 2,
                duration: 6,
                intervals: vec![1000],
                loads: vec![Load::Loaded],
                modes: vec![],
                audio_secs: 0,
                pingpong_secs: 0,
                retry_disturbed: 1,
                ..Settings::example()
            },
            cases: Case::DEFAULT.to_vec(),
            priority: 99,
        };
        assert_eq!(plan(&s), (6, 36.0));
    }
}
