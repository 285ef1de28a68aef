//! The message-passing scenario (`--scenario message-passing`): one guest
//! (2 vCPUs) running message-passing programs whose rate is bound by vCPU
//! wakeups, under each guest idle mode of pvsched.ko (`default`,
//! `haltpoll`, `hinted`, `advisor`), on an idle and on a loaded host.
//! pvschedd serves the guest in every case, so that only the guest's idle
//! path differs.
//!
//! Per (repeat, load) block: pvschedd starts afresh (its idle meters are
//! cumulative), a warm-up runs the workloads in `default` mode, and the
//! advisor's window for the budget is taken from the daemon; then each case,
//! in rotated order: pvsched.ko reloaded with the case's `idle=` mode, the
//! host load started, `pingpong -g 0` and `prodcons` measured, the load
//! stopped. Results: see `msgpass_report`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pvsched_base::kvm_params::{self, HaltPoll};
use pvsched_control::{ApplyTarget, Request, Response};
use pvsched_vmtest::{Accel, Vm};
use serde_json::Value;

use crate::daemon::{Binaries, Daemon, Locator, VM_NAME};
use crate::error::{guest, io, BenchError, Result};
use crate::foreign;
use crate::guest as gp;
use crate::harness::axes::{mode_order, Load};
use crate::harness::disturbance::DISTURBED;
use crate::harness::journal::first_line;
use crate::harness::journal::{Journal, Journaled};
use crate::harness::meta::Meta;
use crate::harness::output::json;
use crate::harness::plan::{announce, listed};
use crate::harness::settings::Settings;
use crate::harness::start::{in_private_tmp, Start};
use crate::harness::vm::ThreadBaseline;
use crate::host::{self, Machine};
use crate::msgpass_report::{
    self, parse_advice, parse_idle, parse_schedstat, parse_uptime, sections, Block, IdleCase,
    IdleFile, Measurement, MsgMeta, MsgRaw, MsgReport, Session, Workload, IDLE_FILE,
};
use crate::plot;
use crate::progress::Progress;

/// The standard settings plus what only this scenario has.
#[derive(Clone, Debug)]
pub struct MsgSettings {
    /// out, repeat, duration (seconds per workload), loads, accel, smp,
    /// memory, pvschedd, its overlay, retries and the command line; the
    /// intervals, modes, audio and ping-pong settings are not used.
    pub base: Settings,
    pub cases: Vec<IdleCase>,
    /// The advisor's CPU budget, permille of a vCPU; also the poll share
    /// the `hinted` target allows.
    pub budget_permille: u32,
}

/// Bound on one control-socket request to pvschedd.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// Seconds between starting the host load (or loading the module) and the
/// first measurement: stress-ng's workers spread out, and the daemon's wake
/// hints (a window of about a second) reach the reloaded module.
const SETTLE: Duration = Duration::from_secs(1);

/// Phases and nominal seconds of the whole run: per (repeat, load) block a
/// warm-up of every workload, then every workload under every case.
pub fn plan(s: &MsgSettings) -> (usize, f64) {
    let b = &s.base;
    let blocks = b.repeat * b.loads.len();
    let w = Workload::ALL.len();
    let phases = blocks * (1 + s.cases.len() * w);
    let secs = blocks as f64 * (1 + s.cases.len()) as f64 * (w as u64 * b.duration) as f64;
    (phases, secs)
}

/// The guest command of one measurement: the idle driver's counters and the
/// guest clock before and after the program, between `@@` markers.
pub fn measure_cmd(w: Workload, secs: u64) -> String {
    format!(
        "I={IDLE_FILE}; echo @@IDLE0; cat $I 2>/dev/null; echo @@UP0 $(cat /proc/uptime); \
         echo @@PROG; {} 2>&1; rc=$?; echo @@UP1 $(cat /proc/uptime); echo @@IDLE1; \
         cat $I 2>/dev/null; echo @@RC $rc; exit $rc",
        w.command(secs)
    )
}

/// A measurement from the guest command's output `out`: everything but the
/// host-side figures.
pub fn parse_measurement(w: Workload, out: &str, guest_cpus: u32) -> Result<Measurement> {
    let parse = |msg: String| BenchError::Parse {
        what: format!("{w} measurement"),
        msg,
    };
    let s = sections(out);
    let get = |k: &str| {
        s.get(k)
            .ok_or_else(|| parse(format!("no @@{k} in {:?}", tail(out))))
    };
    let prog = &get("PROG")?.1;
    let line =
        gp::last_json_line(prog).ok_or_else(|| parse(format!("no JSON in {:?}", tail(prog))))?;
    let program: Value = serde_json::from_str(line).map_err(|source| BenchError::Json {
        what: format!("{w} line {line:?}"),
        source,
    })?;
    let (count, per_s, p50, p99) = w.figures(&program)?;
    let up = |k: &str| -> Result<f64> {
        let (arg, _) = get(k)?;
        parse_uptime(arg).ok_or_else(|| parse(format!("@@{k}: not an uptime: {arg:?}")))
    };
    let guest_window_s = up("UP1")? - up("UP0")?;
    let idle = |k: &str| -> Result<Option<IdleFile>> {
        let body = &get(k)?.1;
        if body.trim().is_empty() {
            Ok(None)
        } else {
            parse_idle(body).map(Some)
        }
    };
    let idle = match (idle("IDLE0")?, idle("IDLE1")?) {
        (Some(a), Some(b)) => b.total().since(&a.total()),
        _ => None,
    };
    Ok(Measurement {
        workload: Some(w),
        count,
        per_s,
        latency_p50_us: p50,
        latency_p99_us: p99,
        program,
        guest_window_s,
        idle,
        guest_cpus,
        ..Default::default()
    })
}

fn tail(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    chars[chars.len().saturating_sub(400)..].iter().collect()
}

/// Run time (ns) of each thread `tids` of process `pid`; an error when one
/// is gone (a vCPU thread of a running VM does not go).
fn run_times(pid: u32, tids: &[i32]) -> Result<Vec<u64>> {
    tids.iter()
        .map(|t| {
            let p = format!("/proc/{pid}/task/{t}/schedstat");
            let text = std::fs::read_to_string(&p).map_err(io(format!("reading {p}")))?;
            parse_schedstat(&text).ok_or_else(|| BenchError::Parse {
                what: p,
                msg: format!("not a schedstat line: {text:?}"),
            })
        })
        .collect()
}

struct Bench<'a> {
    s: &'a MsgSettings,
    vm: Vm,
    vcpus: Vec<(u32, i32)>,
    baseline: ThreadBaseline,
    bins: Binaries,
    run_dir: PathBuf,
    raw_dir: PathBuf,
    host_cpus: usize,
    guest_cpus: u32,
    blocks: Vec<Block>,
    sessions: Vec<Session>,
    journal: Journal,
    progress: Progress,
    /// Cases that cannot run in this guest, and why.
    unavailable: std::collections::BTreeMap<IdleCase, String>,
    accel: Accel,
    /// KVM's halt polling before a `kvm-poll-off` session set it.
    kvm_poll_before: Option<HaltPoll>,
}

impl Journaled for Bench<'_> {
    fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }
}

impl Bench<'_> {
    /// The idle debugfs file now; None when the module has none.
    fn idle_file(&self) -> Result<Option<IdleFile>> {
        let (rc, out) = self
            .vm
            .exec(&format!("cat {IDLE_FILE}"), Duration::from_secs(30))
            .map_err(guest("reading the idle debugfs file"))?;
        if rc != 0 {
            return Ok(None);
        }
        parse_idle(&out).map(Some)
    }

    /// Puts the idle driver in `case`'s mode: through the module's writable
    /// parameters when pvsched.ko is loaded (`idle` last: writing it switches
    /// the driver), else `insmod pvsched.ko PARAMS`; then checks the mode;
    /// returns the driver's header line (or why there is none, for `default`).
    /// No reload between cases: a reload re-patches every tracepoint call
    /// site, which QEMU 7.2's multi-threaded TCG mishandles now and then
    /// (guest/README.md).
    fn load_module(&mut self, case: IdleCase, params: &str) -> Result<String> {
        let loaded = self
            .vm
            .exec("test -d /sys/module/pvsched", Duration::from_secs(30))
            .map_err(guest("looking for pvsched.ko"))?
            .0
            == 0;
        let (rc, out) = if loaded {
            let mut kvs: Vec<(&str, &str)> = params
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .collect();
            kvs.sort_by_key(|(k, _)| *k == "idle");
            let script = kvs
                .iter()
                .map(|(k, v)| format!("echo {v} > /sys/module/pvsched/parameters/{k}"))
                .collect::<Vec<_>>()
                .join(" && ");
            self.vm
                .exec(&script, Duration::from_secs(60))
                .map_err(guest(format!("switching pvsched.ko to {params}")))?
        } else {
            self.vm
                .insmod(params)
                .map_err(guest(format!("insmod pvsched.ko {params}")))?
        };
        // The kernel ignores parameters a module does not know, with a warning.
        let warnings = self
            .vm
            .exec(
                "dmesg | grep -i 'pvsched' | grep -i 'parameter' | tail -n 3",
                Duration::from_secs(30),
            )
            .map(|(_, o)| o.trim().to_string())
            .unwrap_or_default();
        if rc != 0 {
            return Err(BenchError::Tool {
                what: format!("insmod pvsched.ko {params}"),
                detail: format!("exit {rc}: {} {warnings}", out.trim()),
            });
        }
        let header = |f: &IdleFile| f.header_line.clone();
        match (case, self.idle_file()?) {
            // `idle=off` (default and the KVM polling cases): no driver registered.
            (_, None) if case.driver_mode() == "off" => Ok(format!(
                "no idle driver in pvsched.ko ({IDLE_FILE} absent): the kernel's default idle"
            )),
            (_, Some(f)) if case.driver_mode() == "off" && f.mode == "off" && !f.registered => {
                Ok(header(&f))
            }
            (_, Some(f)) if f.mode == case.driver_mode() && f.registered => Ok(header(&f)),
            (_, Some(f)) => Err(BenchError::Tool {
                what: format!("insmod pvsched.ko {params}"),
                detail: format!(
                    "the idle driver is not in mode {} and registered: {}",
                    case.driver_mode(),
                    header(&f)
                ),
            }),
            (_, None) => Err(BenchError::Tool {
                what: format!("insmod pvsched.ko {params}"),
                detail: format!(
                    "pvsched.ko has no idle driver ({IDLE_FILE} absent){}",
                    if warnings.is_empty() {
                        String::new()
                    } else {
                        format!("; dmesg: {}", warnings.replace('\n', " / "))
                    }
                ),
            }),
        }
    }

    /// pvschedd serving the VM: found over QMP, else by thread names.
    fn start_daemon(&mut self) -> Result<Daemon> {
        let region = self
            .vm
            .region_path()
            .ok_or_else(|| BenchError::PvschedUnavailable("the VM has no region file".into()))?
            .to_path_buf();
        let n = self.vcpus.len();
        // The polling budget the hinted driver is granted: the run's budget,
        // unless --pvschedd-config sets one.
        let mut overlay = self.s.base.pvschedd_overlay.clone();
        if let toml::Value::Table(d) = overlay
            .entry("defaults")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        {
            d.entry("idle_poll_budget_permille")
                .or_insert(toml::Value::Integer(i64::from(self.s.budget_permille)));
        }
        let overlay = &overlay;
        let by_qmp = Locator::Qmp(self.vm.qmp_socket().to_path_buf());
        match Daemon::start(
            &self.bins,
            &self.run_dir,
            &region,
            &by_qmp,
            n,
            overlay,
            None,
        ) {
            Ok(d) => Ok(d),
            Err(e) => {
                self.note(format!(
                    "pvschedd did not serve the VM found over QMP; trying again with its QEMU \
                     pid (thread names): {}",
                    first_line(&e.to_string())
                ));
                let by_pid = Locator::Pid(self.vm.qemu_pid());
                Daemon::start(
                    &self.bins,
                    &self.run_dir,
                    &region,
                    &by_pid,
                    n,
                    overlay,
                    None,
                )
            }
        }
    }

    /// `pvschedctl idle --json --budget-permille B` for the VM, over the
    /// daemon's control socket.
    fn idle_report(&self) -> Result<Value> {
        let socket = self.socket();
        let req = Request::Idle {
            vm: Some(VM_NAME.to_string()),
            budget_permille: self.s.budget_permille,
        };
        match pvsched_control::call(&socket, &req, CONTROL_TIMEOUT) {
            Ok(Response::Idle(r)) => serde_json::to_value(r).map_err(|source| BenchError::Json {
                what: "pvschedd idle report".into(),
                source,
            }),
            Ok(Response::Error { message }) => {
                Err(BenchError::Daemon(format!("pvschedd idle: {message}")))
            }
            Ok(other) => Err(BenchError::Daemon(format!(
                "pvschedd idle: unexpected reply {other:?}"
            ))),
            Err(source) => Err(BenchError::Control {
                what: "pvschedd idle".into(),
                source,
            }),
        }
    }

    /// Sets KVM's halt polling for `case` through pvschedd (`off`: a cap of
    /// 0; `advisor`: `idle --apply host`, the advisor's host-wide window);
    /// the parameters now in force, or why the case cannot run here.
    fn set_kvm_polling(&mut self, case: IdleCase) -> std::result::Result<HaltPoll, String> {
        if self.accel != Accel::Kvm {
            return Err("it sets KVM's halt polling: the guest must run under KVM".into());
        }
        let before = match kvm_params::read_halt_poll() {
            Ok(Some(p)) => p,
            Ok(None) => return Err("the kvm module is not loaded".into()),
            Err(e) => return Err(format!("reading the kvm parameters: {e}")),
        };
        match case {
            IdleCase::KvmPollOff => {
                let off = HaltPoll {
                    halt_poll_ns: 0,
                    ..before
                };
                kvm_params::write_halt_poll_to(Path::new(kvm_params::DEFAULT_DIR), &off)
                    .map_err(|e| format!("setting halt_poll_ns to 0: {e}"))?;
                self.kvm_poll_before = Some(before);
                Ok(off)
            }
            _ => {
                let req = Request::IdleApply {
                    vm: None,
                    budget_permille: self.s.budget_permille,
                    target: ApplyTarget::Host,
                };
                match pvsched_control::call(&self.socket(), &req, CONTROL_TIMEOUT) {
                    Ok(Response::Idle(r)) => r
                        .applied
                        .map(|a| a.after)
                        .ok_or_else(|| "pvschedd applied nothing".to_string()),
                    Ok(Response::Error { message }) => Err(format!("pvschedd: {message}")),
                    Ok(other) => Err(format!("pvschedd: unexpected reply {other:?}")),
                    Err(e) => Err(format!("pvschedd: {e}")),
                }
            }
        }
    }

    /// Puts KVM's halt polling back as it was before [`Self::set_kvm_polling`].
    fn restore_kvm_polling(&mut self) -> Result<()> {
        if let Some(before) = self.kvm_poll_before.take() {
            return kvm_params::write_halt_poll_to(Path::new(kvm_params::DEFAULT_DIR), &before)
                .map_err(|e| BenchError::Daemon(format!("writing the kvm parameters: {e}")));
        }
        let req = Request::IdleApply {
            vm: None,
            budget_permille: self.s.budget_permille,
            target: ApplyTarget::Restore,
        };
        match pvsched_control::call(&self.socket(), &req, CONTROL_TIMEOUT) {
            Ok(Response::Idle(_)) => Ok(()),
            Ok(other) => Err(BenchError::Daemon(format!("pvschedd restore: {other:?}"))),
            Err(source) => Err(BenchError::Control {
                what: "pvschedd idle --apply restore".into(),
                source,
            }),
        }
    }

    /// pvschedd's control socket (where daemon::config_toml_vms puts it).
    fn socket(&self) -> PathBuf {
        self.run_dir.join("pvschedd.sock")
    }

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
    /// others took more than [`DISTURBED`] of the machine.
    fn measure_undisturbed(&mut self, w: Workload, tag: &str, label: &str) -> Result<Measurement> {
        let secs = self.s.base.duration as f64;
        let mut tries = 0;
        loop {
            self.progress.phase(label, secs);
            let m = self.measure(w, tag)?;
            if m.foreign_cpu <= DISTURBED {
                return Ok(m);
            }
            if tries >= self.s.base.retry_disturbed {
                self.note(foreign::disturbed_note(
                    &format!("{tag}-{w}"),
                    m.foreign_cpu,
                ));
                return Ok(m);
            }
            tries += 1;
            self.note(foreign::retry_note(
                &format!("{tag}-{w}"),
                m.foreign_cpu,
                tries,
                self.s.base.retry_disturbed,
            ));
            self.progress.add(secs);
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
    fn block(&mut self, rep: usize, load: Load, load_idx: usize) {
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
    fn vm_alive(&mut self) -> bool {
        (1..=3).any(|_| matches!(self.vm.exec("true", Duration::from_secs(60)), Ok((0, _))))
    }
}

/// Runs the scenario; returns the report and whether every phase worked.
pub fn run(s: &MsgSettings) -> Result<(MsgReport, bool)> {
    let b = &s.base;
    let start = Start::begin(b)?;
    let bins = Binaries::locate(b.pvschedd.as_deref())?;
    plot::init_font()?;
    let (phases, nominal) = plan(s);
    announce(
        &format!(
            "message-passing scenario: {} repeats x loads [{}] x (warm-up + cases [{}]) x {} \
             workloads of {} s",
            b.repeat,
            listed(&b.loads),
            listed(&s.cases),
            Workload::ALL.len(),
            b.duration
        ),
        phases,
        nominal,
        // Boot and image ~60 s; per session a module reload and the settle
        // time; per block a daemon start.
        nominal * 1.2
            + 60.0
            + (b.repeat * b.loads.len()) as f64 * (10.0 + (s.cases.len() + 1) as f64 * 6.0),
        "the boot, module reloads and overheads",
        &start.out,
    );
    in_private_tmp(|| run_in(s, start, bins))
}

fn run_in(s: &MsgSettings, start: Start, bins: Binaries) -> Result<(MsgReport, bool)> {
    let (started, t0, out, run_dir, raw_dir) = start.into_parts();
    let out = out.as_path();
    let b = &s.base;
    let (phases, nominal) = plan(s);
    let machine = Machine::probe(&pvsched_vmtest::workspace_root());
    eprintln!("pvsched-bench: building the guest image (cached after the first run)");
    let cache = pvsched_vmtest::cache_root().with_file_name("pvsched-bench");
    let image = gp::build_image(&cache)?;
    eprintln!("pvsched-bench: booting the guest ({} vCPUs)", b.smp);
    let (vm, accel_reason, accel) = crate::harness::vm::boot(b, image, VM_NAME)?;
    eprintln!("pvsched-bench: accelerator: {accel_reason}");
    let guest_cpus = vm.guest_cpus().max(1);
    if guest_cpus < 2 {
        return Err(BenchError::Usage(format!(
            "the message-passing scenario needs 2 vCPUs (the programs pin to vCPUs 0 and 1); \
             the guest has {guest_cpus}"
        )));
    }
    let vcpus = crate::harness::vm::vcpu_threads(&vm)?;
    let baseline = crate::harness::vm::thread_baseline(vm.qemu_pid())?;
    let mut bench = Bench {
        s,
        vm,
        vcpus,
        baseline,
        bins,
        run_dir,
        raw_dir,
        host_cpus: machine.cpus,
        guest_cpus,
        blocks: Vec::new(),
        sessions: Vec::new(),
        journal: Journal::default(),
        progress: Progress::new(phases, nominal),
        unavailable: Default::default(),
        accel,
        kvm_poll_before: None,
    };
    let params = IdleCase::Default.insmod_params(None).unwrap_or_default();
    let idle_driver = bench.load_module(IdleCase::Default, &params)?;
    eprintln!(
        "pvsched-bench: guest up: {} vCPUs (threads {}), kernel {}, pvsched.ko {params}: {}",
        guest_cpus,
        bench
            .vcpus
            .iter()
            .map(|(i, t)| format!("{i}:{t}"))
            .collect::<Vec<_>>()
            .join(" "),
        bench.vm.kernel_release(),
        idle_driver
    );
    if machine.cpus != guest_cpus as usize {
        bench.journal.notes.push(format!(
            "guest has {guest_cpus} vCPUs on {} host CPUs",
            machine.cpus
        ));
    }
    'outer: for rep in 1..=b.repeat {
        for (li, &load) in b.loads.iter().enumerate() {
            let errors = bench.journal.errors;
            bench.block(rep, load, li);
            if bench.journal.errors > errors && !bench.vm_alive() {
                bench.error("the guest stopped answering: run aborted".into());
                break 'outer;
            }
        }
    }
    for (case, why) in &bench.unavailable {
        bench
            .journal
            .notes
            .push(format!("{case} did not run: {why}"));
    }

    let commands = Workload::ALL
        .iter()
        .map(|w| (w.name().to_string(), w.command(b.duration)))
        .collect();
    let meta = MsgMeta {
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
            guest_cpus,
            guest_kernel: bench.vm.kernel_release().to_string(),
            guest_module: "loaded".into(),
            load_cmd: format!("stress-ng {}", host::load_args(machine.cpus).join(" ")),
            pvschedd_settings: b.pvschedd_overlay.to_string(),
            static_rt_priority: 0,
            machine,
            notes: bench.journal.notes.clone(),
        },
        budget_permille: s.budget_permille,
        idle_driver,
        commands,
        definitions: DEFINITIONS.iter().map(|d| d.to_string()).collect(),
    };
    let raw = MsgRaw {
        scenario: "message-passing".into(),
        meta,
        loads: b.loads.clone(),
        cases: s.cases.clone(),
        blocks: bench.blocks,
        sessions: bench.sessions,
    };
    let ok = bench.journal.errors == 0;
    drop(bench.vm);
    let report = render(out, &raw)?;
    Ok((report, ok))
}

/// What the tables' columns mean.
pub const DEFINITIONS: [&str; 4] = [
    "Throughput: the program's own count over its own run time (pingpong: round trips/s; \
     prodcons: messages dequeued/s).",
    "Host CPU % per vCPU: the run time of the VM's vCPU threads \
     (/proc/<qemu>/task/<tid>/schedstat) over the measurement, summed, / (host wall time x \
     vCPUs): what the guest's polling costs the host; 100 % = every vCPU thread on a core the \
     whole time.",
    "Guest poll %: the idle driver's poll_ns over the measurement (debugfs idle, every CPU) / \
     (guest wall time x vCPUs): the share the budget bounds.",
    "polls, poll hits, poll timeouts, overload halts, halts: the idle driver's counters \
     (differences around each measurement), summed over the CPUs and the repeats.",
];

/// Writes raw.json, report.json, the plot and report.md into `out`.
pub fn render(out: &Path, raw: &MsgRaw) -> Result<MsgReport> {
    let write = |name: &str, text: &str| crate::harness::output::write_into(out, name, text);
    write("raw.json", &json(raw))?;
    let mut report = msgpass_report::build(raw);
    let mut panels = Vec::new();
    for w in Workload::ALL {
        for lr in &report.loads {
            let Some(cases) = lr.workloads.get(w.name()) else {
                continue;
            };
            let bars: Vec<plot::Bar> = IdleCase::ALL
                .iter()
                .filter_map(|c| {
                    cases.get(c.name()).map(|st| plot::Bar {
                        mode: c.name(),
                        value: st.throughput.median,
                        low: st.throughput.min,
                        high: st.throughput.max,
                    })
                })
                .collect();
            panels.push(plot::BarPanel {
                title: format!("{w}, host {}", lr.load),
                y_desc: w.unit().to_string(),
                bars,
            });
        }
    }
    if !panels.is_empty() {
        let name = "throughput.png".to_string();
        let title = format!(
            "message passing per guest idle mode: median over {} repeats x {} s, line: min-max ({})",
            raw.meta.base.repeat,
            raw.meta.base.duration_s,
            raw.meta.base.accel.to_uppercase()
        );
        plot::bar_panels(&out.join(&name), &title, &panels, raw.loads.len())?;
        report.plots.push(name);
    }
    write("report.json", &json(&report))?;
    write("report.md", &msgpass_report::markdown(&report))?;
    Ok(report)
}

/// Re-renders a report from a previous message-passing run's raw.json (into
/// its directory).
pub fn rerender(raw_path: &Path) -> Result<(MsgReport, PathBuf)> {
    crate::harness::raw::rerender(raw_path, render)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(cases: Vec<IdleCase>) -> MsgSettings {
        MsgSettings {
            base: Settings {
                duration: 5,
                intervals: vec![],
                modes: vec![],
                audio_secs: 0,
                pingpong_secs: 0,
                retry_disturbed: 1,
                ..Settings::example()
            },
            cases,
            budget_permille: 50,
        }
    }

    #[test]
    fn plan_counts_a_warm_up_and_every_workload_of_every_case() {
        // 3 repeats x 2 loads = 6 blocks of (1 warm-up + 4 cases x 2 workloads).
        let (phases, secs) = plan(&settings(IdleCase::ALL[..4].to_vec()));
        assert_eq!(phases, 6 * 9);
        // 6 blocks x 5 sessions (warm-up included) x 2 workloads x 5 s.
        assert_eq!(secs, 300.0);
        assert_eq!(plan(&settings(vec![IdleCase::Default])), (18, 120.0));
    }

    #[test]
    fn the_measurement_command_fits_the_console_and_marks_every_part() {
        for w in Workload::ALL {
            let c = measure_cmd(w, 5);
            assert!(c.len() < pvsched_vmtest::MAX_COMMAND_LEN);
            assert!(!c.chars().any(|c| c.is_control()), "{c}");
            for m in ["@@IDLE0", "@@UP0", "@@PROG", "@@UP1", "@@IDLE1", "@@RC"] {
                assert!(c.contains(m), "{m} not in {c}");
            }
        }
        assert!(measure_cmd(Workload::Pingpong, 3).contains("pingpong -d 3 -n 0 -g 0 -a 0 -b 1"));
        assert!(measure_cmd(Workload::Prodcons, 3).contains("prodcons -d 3 -q 1 -w 5000 -a 0 -b 1"));
    }

    #[test]
    fn a_measurement_parses_from_the_guest_output() {
        // Arrange: what the guest prints with the hinted driver.
        let idle = |polls: u64, poll_ns: u64| {
            format!(
                "mode=hinted registered=1 driver=pvsched poll_max_us=200 fixed_poll_us=0\n\
                 cpu0 polls={polls} poll_hits=1 poll_timeouts=0 poll_ns={poll_ns} halts=3 \
                 overload_halts=0 unhinted_halts=0 limit_ns=1 wake_p50_ns=1 wake_p99_ns=1 overloaded=0\n\
                 cpu1 polls=0 poll_hits=0 poll_timeouts=0 poll_ns=0 halts=3 overload_halts=0 \
                 unhinted_halts=0 limit_ns=1 wake_p50_ns=1 wake_p99_ns=1 overloaded=0\n"
            )
        };
        let out = format!(
            "@@IDLE0\n{}@@UP0 100.00 150.00\n@@PROG\nprodcons: warning\n\
             {{\"messages\":5000,\"msgs_per_s\":1000.0,\"latency_p50_us\":30.00,\
             \"latency_p99_us\":90.00}}\n@@UP1 105.00 155.00\n@@IDLE1\n{}@@RC 0\n",
            idle(10, 1_000),
            idle(60, 100_001_000)
        );

        // Act
        let m = parse_measurement(Workload::Prodcons, &out, 2).unwrap();

        // Assert
        assert_eq!((m.count, m.per_s), (5000, 1000.0));
        assert_eq!((m.latency_p50_us, m.latency_p99_us), (30.0, 90.0));
        assert!((m.guest_window_s - 5.0).abs() < 1e-9);
        let c = m.idle.unwrap();
        assert_eq!((c.polls, c.poll_ns, c.halts), (50, 100_000_000, 0));
        // 0.1 s of polling over 5 s x 2 vCPUs.
        assert!((m.poll_share().unwrap() - 0.01).abs() < 1e-9);
    }

    #[test]
    fn a_measurement_without_an_idle_driver_has_no_poll_share() {
        let out =
            "@@IDLE0\n@@UP0 1.00 1.00\n@@PROG\n{\"round_trips\":10,\"round_trips_per_s\":2.0,\
                   \"p50_us\":1.0,\"p99_us\":2.0}\n@@UP1 6.00 2.00\n@@IDLE1\n@@RC 0\n";
        let m = parse_measurement(Workload::Pingpong, out, 2).unwrap();
        assert_eq!(m.idle, None);
        assert_eq!(m.poll_share(), None);
        assert_eq!(m.per_s, 2.0);
    }

    #[test]
    fn a_truncated_measurement_is_an_error_that_says_what_is_missing() {
        let e = parse_measurement(Workload::Pingpong, "@@IDLE0\n@@UP0 1 1\n", 2).unwrap_err();
        assert!(e.to_string().contains("no @@PROG"), "{e}");
        let e = parse_measurement(
            Workload::Pingpong,
            "@@PROG\nSegmentation fault\n@@UP0 1\n@@UP1 2\n@@IDLE0\n@@IDLE1\n",
            2,
        )
        .unwrap_err();
        assert!(e.to_string().contains("no JSON"), "{e}");
    }
}
