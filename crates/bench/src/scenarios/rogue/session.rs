//! One rogue scenario run in progress: both guests, and per (repeat, load,
//! case) a session measured over each interval's window.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use pvsched_base::sched::{set_params, ThreadParams};
use pvsched_base::thread::threads_of;
use pvsched_vmtest::Vm;
use serde_json::Value;

use super::commands::*;
use super::model::*;
use super::sampling::*;
use super::settings::*;
use crate::daemon::{Binaries, Daemon, VmEntry};
use crate::error::{guest, BenchError, Result};
use crate::harness::axes::{Load, Mode};
use crate::harness::disturbance::{Judgement, Retries};
use crate::harness::journal::{first_line, Journal, Journaled};
use crate::harness::vm::Guest;
use crate::host::{self, HostCyclictest};
use crate::progress::Progress;
use crate::{foreign, guest as gp};

pub(super) struct Bench<'a> {
    pub(super) s: &'a RogueSettings,
    pub(super) neighbour: Guest,
    pub(super) rogue: Guest,
    pub(super) bins: Option<Binaries>,
    pub(super) run_dir: PathBuf,
    pub(super) raw_dir: PathBuf,
    pub(super) host_cpus: usize,
    pub(super) phases: Vec<Phase>,
    pub(super) sessions: Vec<SessionStatus>,
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
    /// Boots both guests again (after one was lost), as the first pair was.
    pub(super) fn boot_again(
        &mut self,
        b: &crate::harness::settings::Settings,
        pvsched: bool,
    ) -> Result<()> {
        let (nvm, rvm, _, _) = crate::harness::vm::boot_pair(b, NEIGHBOUR, ROGUE)?;
        self.neighbour = Guest::new(nvm, pvsched)?;
        self.rogue = Guest::new(rvm, pvsched)?;
        // A pvschedd that could not serve guests that had died says nothing
        // of pvschedd: the session is measured again on these, not skipped.
        self.pvsched_broken = None;
        Ok(())
    }

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

    /// Starts rtspin on every rogue vCPU (without waiting for them to say
    /// they run: [`Self::spun`] reads that after the stop).
    fn spin(&mut self) -> Result<()> {
        let t = Instant::now();
        let cmd = spin_cmd(
            self.rogue.cpus,
            self.s.priority,
            spin_bound(self.s.base.duration),
        );
        if let Err(e) = self.rogue.vm.exec_ok(&cmd, Duration::from_secs(60)) {
            // Some may run: stop them before the next measurement.
            let _ = self.unspin();
            return Err(guest("starting the rogue's rtspin")(e));
        }
        eprintln!(
            "    rogue: rtspin FIFO {} started on {} vCPUs in {:.1} s",
            self.s.priority,
            self.rogue.cpus,
            t.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// After [`Self::unspin`]: whether an rtspin said it ran at SCHED_FIFO
    /// on every rogue vCPU (their output kept in the raw folder).
    fn spun(&mut self, tag: &str) -> Result<()> {
        let out = self
            .rogue
            .vm
            .exec_ok(READY_CMD, Duration::from_secs(60))
            .map_err(guest("reading the rogue's rtspin output"))?;
        let _ = std::fs::write(self.raw_dir.join(format!("{tag}-rogue.log")), &out);
        let n = count_ready(&out);
        if n < self.rogue.cpus {
            return Err(BenchError::Tool {
                what: "rogue rtspin".into(),
                detail: format!(
                    "only {n} of {} vCPUs ran spinning: {}",
                    self.rogue.cpus,
                    out.trim()
                ),
            });
        }
        Ok(())
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
        if !case.spinning() {
            return self.measure_spinning(rep, load, interval, case, daemon, 0, &tag);
        }
        self.spin()?;
        let result =
            self.measure_spinning(rep, load, interval, case, daemon, self.rogue.cpus, &tag);
        if let Err(e) = self.unspin() {
            self.error(format!("{tag}: {e}"));
        }
        let result = result?;
        // A phase whose rogue did not spin on every vCPU measured something
        // else: dropped, as a failed measurement.
        if let Err(e) = self.spun(&tag) {
            self.phases.pop();
            return Err(e);
        }
        Ok(result)
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
    /// others took more than [`DISTURBED`](crate::harness::disturbance::DISTURBED) of the machine.
    fn measure_undisturbed(
        &mut self,
        rep: usize,
        load: Load,
        interval: u32,
        case: Case,
        daemon: Option<&Daemon>,
    ) {
        let tag = format!("rep{rep}-{load}-{interval}us-{case}");
        let mut retries = Retries::new(&tag, self.s.base.retry_disturbed);
        loop {
            let foreign = match self.measure(rep, load, interval, case, daemon) {
                Ok(f) => f,
                Err(e) => return self.error(format!("{tag}: {e}")),
            };
            match retries.judge(foreign) {
                Judgement::Keep => return,
                Judgement::Disturbed(note) => return self.note(note),
                Judgement::Again(note) => {
                    self.phases.pop();
                    self.note(note);
                    self.progress.add(self.s.base.duration as f64);
                }
            }
        }
    }

    /// One (repeat, load, case) session: load on, daemon on, the
    /// measurements, daemon off (threads verified), load off.
    pub(super) fn session(&mut self, rep: usize, load: Load, case: Case) {
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
    pub(super) fn vms_alive(&mut self) -> bool {
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
