//! The event thread: host events and timers in, policy decisions out.
//!
//! One thread does everything on the latency path (events, slot reads,
//! decisions, sched_setattr, host halves), woken by epoll on the event
//! source, one timer, signals, and two channels (discovery, control) whose
//! slow work runs on threads of their own.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use pvsched_policy::{Decision, Decisions, Event, ExitReason, Reason, VmLimits, WakeSource};
use tracing::{debug, error, info, warn};

use crate::config::{self, Resolved};
use crate::control::{self, Recording, Request, Response, TraceKind, TraceRecord, TrackInfo};
use crate::discovery::{self, Qmp, VmThreads};
use crate::events::{EventSource, HostEvent};
use crate::metrics::Metrics;
use crate::sched::ThreadParams;
use crate::statefile::{self, StateFile};
use crate::vm::ServedVm;

/// CLOCK_MONOTONIC in ns: the clock of BPF timestamps too.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into a valid, owned struct.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Blocks SIGTERM and SIGINT in the calling thread (and threads it spawns
/// later): they are read from a signalfd by the event loop.
pub fn block_stop_signals() -> Result<SigSet, DaemonError> {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGTERM);
    mask.add(Signal::SIGINT);
    mask.thread_block().map_err(os("sigprocmask"))?;
    Ok(mask)
}

/// A VM found by the discovery thread.
#[derive(Clone, Debug)]
pub struct Found {
    pub name: String,
    pub cfg_index: Option<usize>,
    pub region: PathBuf,
    pub region_mode: u32,
    pub threads: VmThreads,
}

pub enum DiscoveryMsg {
    Snapshot { found: Vec<Found>, overloaded: bool },
}

type ControlMsg = (Request, SyncSender<Response>);

const TOKEN_SOURCE: u64 = 1;
const TOKEN_TIMER: u64 = 2;
const TOKEN_SIGNAL: u64 = 3;
const TOKEN_DISCOVERY: u64 = 4;
const TOKEN_CONTROL: u64 = 5;

pub struct Daemon {
    cfg: Resolved,
    source: EventSource,
    vms: Vec<Option<ServedVm>>,
    metrics: Arc<Metrics>,
    /// Scratch output of one `handle` call.
    scratch: Decisions,
    /// Decisions collected for the VM being handled, applied in order.
    decisions: Vec<Decision>,
    state_path: PathBuf,
    recording: Option<Recording>,
    started: Instant,
    next_scan: u64,
    next_recheck: u64,
    /// Absolute expiry the timerfd is set to (0: not yet): it is only
    /// reprogrammed when the next deadline moves, a syscall (and, in a VM, a
    /// timer-device exit) saved on most wakeups.
    armed_ns: u64,
    /// Host events of one drain, reused.
    batch: Vec<HostEvent>,
    overloaded: bool,
    disc_rx: Receiver<DiscoveryMsg>,
    disc_fd: Arc<EventFd>,
    ctl_rx: Receiver<ControlMsg>,
    ctl_fd: Arc<EventFd>,
    stop: Arc<AtomicBool>,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{op}: {source}")]
    Os {
        op: &'static str,
        source: nix::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    State(#[from] statefile::StateFileError),
}

/// The `wire::LAZY_*` class of a host event.
fn lazy_class(ev: &HostEvent) -> u32 {
    use crate::events::wire::*;
    match ev {
        HostEvent::SwitchIn { .. } => LAZY_SWITCH_IN,
        HostEvent::SwitchOut { runnable: true, .. } => LAZY_PREEMPTED,
        HostEvent::SwitchOut {
            runnable: false, ..
        } => LAZY_BLOCKED,
        HostEvent::Waking { .. } => LAZY_WAKING,
        HostEvent::KvmExit { .. } => LAZY_KVM_EXIT,
        HostEvent::KvmHaltWakeup { .. } => LAZY_KVM_WAKEUP,
        HostEvent::KvmIrq { .. } => 0,
    }
}

fn os(op: &'static str) -> impl FnOnce(nix::Error) -> DaemonError {
    move |source| DaemonError::Os { op, source }
}

impl Daemon {
    pub fn new(
        cfg: Resolved,
        source: EventSource,
        metrics: Arc<Metrics>,
    ) -> Result<Self, DaemonError> {
        let state_path = cfg.config.daemon.state_file.clone();
        let (disc_tx, disc_rx) = mpsc::channel();
        let disc_fd = Arc::new(EventFd::from_flags(EfdFlags::EFD_NONBLOCK).map_err(os("eventfd"))?);
        let (ctl_tx, ctl_rx) = mpsc::channel();
        let ctl_fd = Arc::new(EventFd::from_flags(EfdFlags::EFD_NONBLOCK).map_err(os("eventfd"))?);
        let stop = Arc::new(AtomicBool::new(false));
        spawn_discovery(cfg.clone(), disc_tx, disc_fd.clone(), stop.clone())?;
        spawn_control(
            cfg.config.daemon.control_socket.clone(),
            ctl_tx,
            ctl_fd.clone(),
            stop.clone(),
        )?;
        Ok(Self {
            cfg,
            source,
            vms: Vec::new(),
            metrics,
            scratch: Decisions::with_capacity(64),
            decisions: Vec::with_capacity(64),
            state_path,
            recording: None,
            started: Instant::now(),
            next_scan: 0,
            armed_ns: 0,
            batch: Vec::with_capacity(256),
            next_recheck: u64::MAX,
            overloaded: false,
            disc_rx,
            disc_fd,
            ctl_rx,
            ctl_fd,
            stop,
        })
    }

    /// Runs until SIGTERM / SIGINT, then restores every thread.
    pub fn run(mut self) -> Result<(), DaemonError> {
        let mask = block_stop_signals()?;
        let sigfd = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK).map_err(os("signalfd"))?;
        let timer = TimerFd::new(ClockId::CLOCK_MONOTONIC, TimerFlags::TFD_NONBLOCK)
            .map_err(os("timerfd"))?;
        let epoll = Epoll::new(EpollCreateFlags::empty()).map_err(os("epoll"))?;
        let src_fd = self.source.fd();
        // SAFETY: the event source owns this descriptor and outlives the epoll
        // set, which is dropped at the end of this function.
        let src = unsafe { BorrowedFd::borrow_raw(src_fd) };
        for (fd, token) in [
            (src, TOKEN_SOURCE),
            (timer.as_fd(), TOKEN_TIMER),
            (sigfd.as_fd(), TOKEN_SIGNAL),
            (self.disc_fd.as_fd(), TOKEN_DISCOVERY),
            (self.ctl_fd.as_fd(), TOKEN_CONTROL),
        ] {
            epoll
                .add(fd, EpollEvent::new(EpollFlags::EPOLLIN, token))
                .map_err(os("epoll_ctl"))?;
        }
        info!("serving");
        let mut events = [EpollEvent::empty(); 8];
        let mut running = true;
        while running {
            self.arm(&timer)?;
            let n = match epoll.wait(&mut events, EpollTimeout::NONE) {
                Ok(n) => n,
                Err(nix::Error::EINTR) => continue,
                Err(e) => return Err(os("epoll_wait")(e)),
            };
            for ev in &events[..n] {
                match ev.data() {
                    TOKEN_SOURCE => {
                        self.metrics.wakeups_records.inc();
                        self.drain_source();
                    }
                    TOKEN_TIMER => {
                        let _ = timer.wait();
                        self.metrics.wakeups_timer.inc();
                        // Expired: the next arm() must set it again.
                        self.armed_ns = 0;
                        // Records submitted without a wakeup come first.
                        if self.source.is_bpf() {
                            self.drain_source();
                        }
                        self.on_timer(monotonic_ns());
                    }
                    TOKEN_SIGNAL => {
                        if let Ok(Some(sig)) = sigfd.read_signal() {
                            info!(signal = sig.ssi_signo, "stopping");
                            running = false;
                        }
                    }
                    TOKEN_DISCOVERY => {
                        let _ = self.disc_fd.read();
                        while let Ok(msg) = self.disc_rx.try_recv() {
                            self.on_discovery(msg);
                        }
                    }
                    TOKEN_CONTROL => {
                        let _ = self.ctl_fd.read();
                        while let Ok((req, reply)) = self.ctl_rx.try_recv() {
                            let resp = self.on_control(req);
                            let _ = reply.send(resp);
                        }
                    }
                    _ => {}
                }
            }
            // Poll sources have no fd activity of their own between ticks.
            if !self.source.is_bpf() {
                self.drain_source();
            }
        }
        self.shutdown();
        Ok(())
    }

    fn arm(&mut self, timer: &TimerFd) -> Result<(), DaemonError> {
        let mut next = self.next_scan.min(self.next_recheck);
        for vm in self.vms.iter().flatten() {
            if let Some(d) = vm.policy.next_deadline() {
                next = next.min(d);
            }
        }
        if let Some(p) = self.source.next_poll_ns() {
            next = next.min(p);
        }
        let next = next.max(1);
        if next == self.armed_ns {
            return Ok(());
        }
        self.armed_ns = next;
        let ts = TimeSpec::new((next / 1_000_000_000) as i64, (next % 1_000_000_000) as i64);
        timer
            .set(
                Expiration::OneShot(ts),
                TimerSetTimeFlags::TFD_TIMER_ABSTIME,
            )
            .map_err(os("timerfd_settime"))
    }

    fn drain_source(&mut self) {
        let mut batch = std::mem::take(&mut self.batch);
        self.source.consume(&mut |ev| batch.push(ev));
        for ev in batch.drain(..) {
            self.on_host_event(ev);
        }
        self.batch = batch;
    }

    fn on_host_event(&mut self, ev: HostEvent) {
        let (vm_id, vcpu, ts, tid) = ev.ids();
        let Some(vm) = self.vms.get_mut(vm_id as usize).and_then(Option::as_mut) else {
            return;
        };
        if vcpu >= vm.policy.nr_vcpus() {
            return;
        }
        // A record queued without a wakeup is read late: the policy gets the
        // time it happened (its accounting), the reaction metric skips it.
        let lazy = vm
            .vcpus
            .get(vcpu as usize)
            .is_some_and(|m| m.lazy & lazy_class(&ev) != 0);
        let wall = monotonic_ns();
        let now = ts.min(wall);
        let mut acc = std::mem::take(&mut self.decisions);
        acc.clear();
        let scratch = &mut self.scratch;
        let (event, trace) = match ev {
            HostEvent::SwitchOut { runnable: true, .. } => {
                vm.guest_update(now, vcpu, scratch, &mut acc);
                (Some(Event::Preempted { vcpu }), Some(TraceKind::Preempted))
            }
            HostEvent::SwitchOut {
                runnable: false, ..
            } => {
                // The guest published "idle" before halting: let the policy see it.
                vm.guest_update(now, vcpu, scratch, &mut acc);
                (Some(Event::Blocked { vcpu }), Some(TraceKind::Halted))
            }
            HostEvent::SwitchIn { .. } => (Some(Event::Running { vcpu }), Some(TraceKind::Running)),
            HostEvent::Waking { source, .. } => {
                vm.guest_update(now, vcpu, scratch, &mut acc);
                (
                    Some(Event::Woken {
                        vcpu,
                        source: source.into(),
                    }),
                    Some(TraceKind::Woken),
                )
            }
            HostEvent::KvmExit { reason, .. } => (
                Some(Event::KvmExit {
                    vcpu,
                    reason: reason.into(),
                }),
                None,
            ),
            HostEvent::KvmIrq { .. } => (Some(Event::InterruptTargeted { vcpu }), None),
            HostEvent::KvmHaltWakeup { .. } => (None, None),
        };
        if let Some(event) = event {
            self.metrics
                .events
                .get_or_create(&crate::metrics::KindLabel {
                    kind: event.kind().name(),
                })
                .inc();
            vm.feed(now, &event, scratch, &mut acc);
        }
        if let (Some(rec), Some(kind)) = (self.recording.as_mut(), trace) {
            rec.records.push(TraceRecord {
                ts_ns: ts,
                tid,
                kind,
                reason: None,
                params: None,
            });
        }
        self.decisions = acc;
        // Timers and the host half are set from the present.
        self.apply(vm_id, (!lazy).then_some(ts), wall);
    }

    /// Applies the pending decisions of VM `vm_id`.
    fn apply(&mut self, vm_id: u32, event_ts: Option<u64>, now: u64) {
        let decisions = std::mem::take(&mut self.decisions);
        let boost_latency_path = self.cfg.config.daemon.boost_latency_path;
        let metrics = self.metrics.clone();
        let mut lost = false;
        if let Some(vm) = self.vms.get_mut(vm_id as usize).and_then(Option::as_mut) {
            for (i, d) in decisions.iter().enumerate() {
                // One event may yield several decisions for a vCPU: the last wins.
                if decisions[i + 1..].iter().any(|later| later.vcpu == d.vcpu) {
                    continue;
                }
                let Some(m) = vm.vcpus.get_mut(d.vcpu as usize) else {
                    continue;
                };
                let want = ThreadParams::from_sched(d.params);
                let was_rt = m.applied.is_rt();
                match m.apply(&want) {
                    Ok(true) => {
                        let done = monotonic_ns();
                        if let Some(ts) = event_ts {
                            if done >= ts {
                                metrics.reaction_seconds.observe((done - ts) as f64 * 1e-9);
                            }
                        }
                        metrics.decision(&vm.metrics, d.reason.name());
                        if want.is_rt() && !was_rt {
                            vm.metrics.boosts.inc();
                        }
                        if d.reason == Reason::Throttled {
                            vm.metrics.throttles.inc();
                        }
                        debug!(vm = %vm.name, vcpu = d.vcpu, params = %want, reason = %d.reason, "applied");
                    }
                    Ok(false) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => lost = true,
                    Err(e) => {
                        metrics.setattr_errors.inc();
                        warn!(vm = %vm.name, vcpu = d.vcpu, error = %e, "sched_setattr failed");
                    }
                }
                vm.publish(now, d.vcpu);
            }
            if let Some(rec) = self.recording.as_mut() {
                for d in decisions.iter() {
                    let Some(m) = vm.vcpus.get(d.vcpu as usize) else {
                        continue;
                    };
                    let kind = if d.throttled {
                        TraceKind::Throttle
                    } else if d.params.is_rt() {
                        TraceKind::Boost
                    } else {
                        TraceKind::Unboost
                    };
                    rec.records.push(TraceRecord {
                        ts_ns: now,
                        tid: m.handle.tid,
                        kind,
                        reason: Some(d.reason.name().to_string()),
                        params: Some(ThreadParams::from_sched(d.params).to_string()),
                    });
                }
            }
            if boost_latency_path && !vm.latency_path.is_empty() && !decisions.is_empty() {
                let boost = vm
                    .vcpus
                    .iter()
                    .filter(|m| m.applied.is_rt() && !m.original.is_rt())
                    .map(|m| m.applied)
                    .max_by_key(|p| p.priority);
                for lp in vm.latency_path.iter_mut() {
                    let want = boost.unwrap_or(lp.original);
                    if let Err(e) = lp.apply(&want) {
                        debug!(vm = %vm.name, tid = lp.handle.tid, error = %e, "latency-path thread");
                    }
                }
            }
            if lost {
                vm.gone = true;
            }
        }
        let mut decisions = decisions;
        decisions.clear();
        self.decisions = decisions;
        self.update_recheck(now);
        self.sync_lazy(vm_id);
    }

    /// Whether records can be marked lazy (configured, and a BPF source).
    fn lazy_active(&self) -> bool {
        self.cfg.config.daemon.lazy_events && self.source.supports_lazy()
    }

    /// Tells the event source which records of VM `vm_id`'s vCPUs need not
    /// wake us, after the daemon's view of them changed.
    fn sync_lazy(&mut self, vm_id: u32) {
        if !self.lazy_active() {
            return;
        }
        let Some(vm) = self.vms.get_mut(vm_id as usize).and_then(Option::as_mut) else {
            return;
        };
        for v in 0..vm.vcpus.len() {
            let bits = vm.lazy_bits(v as u32);
            let m = &mut vm.vcpus[v];
            if m.lazy != bits {
                m.lazy = bits;
                self.source.set_lazy(m.handle.tid as u32, bits);
                tracing::trace!(vm = %vm.name, vcpu = v, bits, "lazy records");
            }
        }
    }

    fn update_recheck(&mut self, now: u64) {
        // Only boosted vCPUs that may run can change their slot (a halted one
        // cannot). With lazy records the daemon learns that a halted boosted
        // vCPU runs again only when it wakes: the timer runs while any vCPU
        // is boosted, at most one wakeup per recheck_boosted_us for them all.
        let any = if self.lazy_active() {
            self.vms.iter().flatten().any(ServedVm::any_boosted)
        } else {
            self.vms.iter().flatten().any(ServedVm::any_boosted_on_cpu)
        };
        self.next_recheck = if any {
            self.next_recheck
                .min(now + self.cfg.config.daemon.recheck_boosted_us * 1000)
        } else {
            u64::MAX
        };
        let boosted: usize = self
            .vms
            .iter()
            .flatten()
            .map(|vm| {
                vm.vcpus
                    .iter()
                    .filter(|m| m.applied.is_rt() && !m.original.is_rt())
                    .count()
            })
            .sum();
        self.metrics.boosted_vcpus.set(boosted as i64);
    }

    fn on_timer(&mut self, now: u64) {
        let scan = now >= self.next_scan;
        let recheck = now >= self.next_recheck;
        if recheck {
            self.next_recheck = u64::MAX;
        }
        if scan {
            self.next_scan = now + self.cfg.config.daemon.scan_interval_us * 1000;
            // A map read (syscall): once per scan, not per drain.
            self.metrics
                .dropped_events
                .set(self.source.dropped_events() as i64);
            let (records, lazy) = self.source.record_counts();
            self.metrics.records.set(records as i64);
            self.metrics.lazy_records.set(lazy as i64);
        }
        // Slot index == VM id; no list collected on this 2-kHz path.
        for id in 0..self.vms.len() as u32 {
            let mut acc = std::mem::take(&mut self.decisions);
            acc.clear();
            let overloaded = self.overloaded;
            let scratch = &mut self.scratch;
            let Some(vm) = self.vms.get_mut(id as usize).and_then(Option::as_mut) else {
                continue;
            };
            for v in 0..vm.policy.nr_vcpus() {
                if scan || (recheck && vm.boosted_on_cpu(v)) {
                    vm.guest_update(now, v, scratch, &mut acc);
                }
            }
            if vm.policy.next_deadline().is_some_and(|d| d <= now) || scan {
                vm.feed(now, &Event::Tick, scratch, &mut acc);
            }
            if scan {
                vm.feed(now, &Event::OverloadHint { overloaded }, scratch, &mut acc);
                for v in 0..vm.policy.nr_vcpus() {
                    vm.publish(now, v);
                }
                let stats = vm.policy.vm_stats();
                vm.metrics
                    .boosted_seconds
                    .set(stats.boosted_ns_total as f64 * 1e-9);
                if stats.clamped_inputs_total > vm.reported_clamped {
                    vm.metrics
                        .clamped
                        .inc_by(stats.clamped_inputs_total - vm.reported_clamped);
                    vm.reported_clamped = stats.clamped_inputs_total;
                }
            }
            self.decisions = acc;
            self.apply(id, None, now);
        }
        self.drop_gone();
    }

    fn on_discovery(&mut self, msg: DiscoveryMsg) {
        let DiscoveryMsg::Snapshot { found, overloaded } = msg;
        self.overloaded = overloaded;
        let by_name: BTreeMap<&str, &Found> = found.iter().map(|f| (f.name.as_str(), f)).collect();
        // Drop VMs that are gone or whose threads changed.
        for slot in self.vms.iter_mut() {
            let stale = match slot {
                Some(vm) => match by_name.get(vm.name.as_str()) {
                    None => true,
                    Some(f) => f.threads != vm.threads,
                },
                None => false,
            };
            if stale {
                if let Some(vm) = slot.as_mut() {
                    vm.gone = true;
                }
            }
        }
        self.drop_gone();
        let mut changed = false;
        for f in &found {
            if self.vms.iter().flatten().any(|vm| vm.name == f.name) {
                continue;
            }
            let id = self
                .vms
                .iter()
                .position(Option::is_none)
                .unwrap_or(self.vms.len()) as u32;
            let limits = f
                .cfg_index
                .and_then(|i| self.cfg.vm_limits.get(i).cloned())
                .unwrap_or_else(|| self.cfg.default_limits.clone());
            let vm_metrics = self.metrics.vm(&f.name);
            match ServedVm::open(
                &f.name,
                id,
                f.cfg_index,
                &f.region,
                f.region_mode,
                f.threads.clone(),
                limits,
                vm_metrics,
            ) {
                Ok(vm) => {
                    for (i, m) in vm.vcpus.iter().enumerate() {
                        self.source.track(m.handle.tid as u32, id, i as u32);
                    }
                    self.source.track_vmm(vm.threads.tgid as u32, id);
                    info!(
                        vm = %vm.name, tgid = vm.threads.tgid, vcpus = vm.vcpus.len(),
                        accel = ?vm.threads.accel, generation = vm.generation, "serving VM"
                    );
                    if (id as usize) < self.vms.len() {
                        self.vms[id as usize] = Some(vm);
                    } else {
                        self.vms.push(Some(vm));
                    }
                    changed = true;
                }
                Err(e) => warn!(vm = %f.name, error = %e, "cannot serve VM"),
            }
        }
        if changed {
            self.save_state();
        }
        self.metrics
            .vms
            .set(self.vms.iter().flatten().count() as i64);
    }

    fn drop_gone(&mut self) {
        let mut changed = false;
        for slot in self.vms.iter_mut() {
            if slot.as_ref().is_some_and(|vm| vm.gone) {
                if let Some(mut vm) = slot.take() {
                    let restored = vm.restore_all();
                    for m in &vm.vcpus {
                        self.source.untrack(m.handle.tid as u32);
                    }
                    self.source.untrack_vmm(vm.threads.tgid as u32);
                    info!(vm = %vm.name, tgid = vm.threads.tgid, restored, "VM gone; no longer served");
                    changed = true;
                }
            }
        }
        if changed {
            self.save_state();
            self.metrics
                .vms
                .set(self.vms.iter().flatten().count() as i64);
        }
    }

    fn save_state(&self) {
        let mut state = StateFile::new();
        for vm in self.vms.iter().flatten() {
            state.threads.extend(vm.records());
        }
        if let Err(e) = state.save(&self.state_path) {
            error!(error = %e, "cannot write state file: a crash would leave boosted threads unrestored");
        }
    }

    fn shutdown(&mut self) {
        let mut restored = 0;
        for vm in self.vms.iter_mut().flatten() {
            restored += vm.restore_all();
            for v in 0..vm.policy.nr_vcpus() {
                let _ = vm.region.region().write_host(v, &Default::default());
            }
        }
        self.stop.store(true, Ordering::Relaxed);
        let _ = std::fs::remove_file(&self.state_path);
        let _ = std::fs::remove_file(&self.cfg.config.daemon.control_socket);
        info!(restored, "restored every thread; exiting");
    }

    fn on_control(&mut self, req: Request) -> Response {
        match req {
            Request::Status => Response::Status(self.status()),
            Request::Metrics => Response::Metrics {
                text: self.metrics.encode(),
            },
            Request::Set { vm, key, value } => self.set(vm.as_deref(), &key, &value),
            Request::Record { seconds } => {
                // seconds > 0 starts a recording, 0 stops and returns it.
                if seconds > 0.0 {
                    let tracks = self
                        .vms
                        .iter()
                        .flatten()
                        .flat_map(|vm| {
                            vm.vcpus.iter().enumerate().map(|(i, m)| TrackInfo {
                                vm: vm.name.clone(),
                                tgid: vm.threads.tgid,
                                vcpu: i as u32,
                                tid: m.handle.tid,
                            })
                        })
                        .collect();
                    self.recording = Some(Recording {
                        start_ns: monotonic_ns(),
                        tracks,
                        ..Default::default()
                    });
                    Response::Ok {
                        message: "recording".into(),
                    }
                } else {
                    match self.recording.take() {
                        Some(mut rec) => {
                            rec.end_ns = monotonic_ns();
                            Response::Record(rec)
                        }
                        None => Response::Error {
                            message: "not recording".into(),
                        },
                    }
                }
            }
        }
    }

    fn set(&mut self, vm: Option<&str>, key: &str, value: &str) -> Response {
        let mut changed = Vec::new();
        if vm.is_none() {
            match config::set_limit(&self.cfg.default_limits, key, value) {
                Ok(l) => self.cfg.default_limits = l,
                Err(e) => {
                    return Response::Error {
                        message: e.to_string(),
                    }
                }
            }
        }
        for served in self.vms.iter_mut().flatten() {
            if vm.is_some_and(|n| n != served.name) {
                continue;
            }
            let new: VmLimits = match config::set_limit(served.policy.limits(), key, value) {
                Ok(l) => l,
                Err(e) => {
                    return Response::Error {
                        message: e.to_string(),
                    }
                }
            };
            if let Err(e) = served.policy.set_limits(new.clone()) {
                return Response::Error {
                    message: e.to_string(),
                };
            }
            if let Some(i) = served.cfg_index {
                if let Some(l) = self.cfg.vm_limits.get_mut(i) {
                    *l = new;
                }
            }
            changed.push(served.name.clone());
        }
        if let Some(name) = vm {
            if changed.is_empty() {
                return Response::Error {
                    message: format!("no VM named {name:?} is served"),
                };
            }
        }
        info!(key, value, vms = ?changed, "tunable set");
        Response::Ok {
            message: format!(
                "{key} = {value} for {}",
                if vm.is_none() {
                    "defaults and every VM".to_string()
                } else {
                    changed.join(", ")
                }
            ),
        }
    }

    fn status(&self) -> control::Status {
        let vms = self
            .vms
            .iter()
            .flatten()
            .map(|vm| {
                let stats = vm.policy.vm_stats();
                let header = vm.region.region().header();
                control::VmStatus {
                    name: vm.name.clone(),
                    tgid: vm.threads.tgid,
                    accel: format!("{:?}", vm.threads.accel).to_lowercase(),
                    region: vm.region.path().display().to_string(),
                    generation: vm.generation,
                    guest_bound: header.guest_generation == vm.generation,
                    in_debt: vm.policy.in_debt(),
                    debt_ms: vm.policy.budget().debt_ns() as f64 * 1e-6,
                    boosts: vm.metrics.boosts.get(),
                    throttles: vm.metrics.throttles.get(),
                    clamped_inputs: stats.clamped_inputs_total,
                    boosted_s: stats.boosted_ns_total as f64 * 1e-9,
                    vcpus: vm
                        .vcpus
                        .iter()
                        .enumerate()
                        .map(|(i, m)| {
                            let t = vm.policy.target(i as u32);
                            let g = vm.policy.guest_view(i as u32);
                            let s = vm.policy.vcpu_stats(i as u32).unwrap_or_default();
                            let host = vm.policy.host_half(i as u32, monotonic_ns());
                            control::VcpuStatus {
                                index: i as u32,
                                tid: m.handle.tid,
                                params: m.applied,
                                reason: t.map(|t| t.reason.name()).unwrap_or("none").to_string(),
                                throttled: t.is_some_and(|t| t.throttled),
                                host_status: match host.status {
                                    pvsched_abi::HS_RUNNING => "running",
                                    pvsched_abi::HS_PREEMPTED => "preempted",
                                    pvsched_abi::HS_HALTED => "halted",
                                    _ => "unknown",
                                }
                                .to_string(),
                                guest_policy: g.map(|g| g.policy.abi()).unwrap_or(0),
                                guest_rt_priority: g.map(|g| u32::from(g.rt_priority)).unwrap_or(0),
                                guest_cs_flags: g.map(|g| g.cs_flags).unwrap_or(0),
                                boosts: s.boosts,
                                throttles: s.throttles,
                                boosted_ms: s.boosted_ns as f64 * 1e-6,
                            }
                        })
                        .collect(),
                    latency_path: vm
                        .latency_path
                        .iter()
                        .map(|m| control::ThreadStatus {
                            tid: m.handle.tid,
                            params: m.applied,
                        })
                        .collect(),
                }
            })
            .collect();
        control::Status {
            pid: std::process::id(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            event_source: self.source.name().to_string(),
            dropped_events: self.source.dropped_events(),
            vms,
        }
    }
}

impl From<crate::events::WakeSource> for WakeSource {
    fn from(s: crate::events::WakeSource) -> Self {
        match s {
            crate::events::WakeSource::Vcpu => WakeSource::OtherVcpu,
            crate::events::WakeSource::SameVmm => WakeSource::Io,
            crate::events::WakeSource::Other => WakeSource::Unknown,
        }
    }
}

impl From<crate::events::KvmExitReason> for ExitReason {
    fn from(r: crate::events::KvmExitReason) -> Self {
        match r {
            crate::events::KvmExitReason::Hlt => ExitReason::Hlt,
            crate::events::KvmExitReason::Pause => ExitReason::Pause,
        }
    }
}

/// Every interval: the VMs that exist now (configured ones and, with auto
/// discovery, any VMM mapping a region file), and whether the host is
/// overloaded.
fn spawn_discovery(
    cfg: Resolved,
    tx: Sender<DiscoveryMsg>,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    let interval = Duration::from_millis(cfg.config.daemon.discovery_interval_ms);
    std::thread::Builder::new()
        .name("pvsched-discovery".into())
        .spawn(move || {
            let mut logged: BTreeMap<String, String> = BTreeMap::new();
            while !stop.load(Ordering::Relaxed) {
                let found = discover_once(&cfg, &mut logged);
                let overloaded = cpu_pressure_some_avg10().is_some_and(|p| p > 10.0);
                if tx
                    .send(DiscoveryMsg::Snapshot { found, overloaded })
                    .is_err()
                {
                    break;
                }
                let _ = wake.write(1);
                std::thread::sleep(interval);
            }
        })?;
    Ok(())
}

fn discover_once(cfg: &Resolved, logged: &mut BTreeMap<String, String>) -> Vec<Found> {
    let c = &cfg.config;
    let mut found = Vec::new();
    // Each new reason once per VM: at info for a configured VM (the admin
    // expects it to be served), at debug for a stale auto-discovery file.
    let mut note = |name: &str, msg: String, configured: bool| {
        if logged.get(name) != Some(&msg) {
            if configured {
                info!(vm = name, "{msg}");
            } else {
                debug!(vm = name, "{msg}");
            }
            logged.insert(name.to_string(), msg);
        }
    };
    for (i, vm) in c.vms.iter().enumerate() {
        let region = vm.region_path(&c.discovery);
        let threads = if let Some(qmp) = &vm.qmp {
            Qmp::connect(qmp, Duration::from_millis(500)).and_then(|mut q| q.vcpu_threads())
        } else if let Some(pid) = vm.pid {
            discovery::threads_by_name(pid)
        } else {
            discovery::process_with_arg(&region).and_then(discovery::threads_by_name)
        };
        match threads {
            Ok(threads) => found.push(Found {
                name: vm.name.clone(),
                cfg_index: Some(i),
                region,
                region_mode: vm.region_mode,
                threads,
            }),
            Err(e) => note(&vm.name, format!("not served yet: {e}"), true),
        }
    }
    if c.discovery.auto {
        let Ok(dir) = std::fs::read_dir(&c.discovery.region_dir) else {
            return found;
        };
        for entry in dir.flatten() {
            let file_name = entry.file_name().to_string_lossy().into_owned();
            let Some(name) = file_name.strip_prefix(&c.discovery.region_prefix) else {
                continue;
            };
            if name.is_empty()
                || found.iter().any(|f| f.name == name)
                || c.vms.iter().any(|v| v.name == name)
            {
                continue;
            }
            let region = entry.path();
            match discovery::process_with_arg(&region).and_then(discovery::threads_by_name) {
                Ok(threads) => found.push(Found {
                    name: name.to_string(),
                    cfg_index: None,
                    region,
                    region_mode: 0o600,
                    threads,
                }),
                Err(e) => note(name, format!("not running: {e}"), false),
            }
        }
    }
    found
}

fn cpu_pressure_some_avg10() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
    let line = text.lines().find(|l| l.starts_with("some"))?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix("avg10="))
        .and_then(|v| v.parse().ok())
}

/// Serves the control socket: requests go to the event thread, which answers
/// between events. `record` sleeps here, not there.
fn spawn_control(
    path: PathBuf,
    tx: Sender<ControlMsg>,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixListener;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let ask = move |req: Request| -> Response {
        let (rtx, rrx) = mpsc::sync_channel(1);
        if tx.send((req, rtx)).is_err() {
            return Response::Error {
                message: "daemon stopping".into(),
            };
        }
        let _ = wake.write(1);
        rrx.recv_timeout(Duration::from_secs(5))
            .unwrap_or(Response::Error {
                message: "daemon did not answer".into(),
            })
    };
    std::thread::Builder::new()
        .name("pvsched-control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(mut conn) = conn else { continue };
                let mut line = String::new();
                let Ok(reader) = conn.try_clone() else {
                    continue;
                };
                if BufReader::new(reader).read_line(&mut line).is_err() {
                    continue;
                }
                let resp = match serde_json::from_str::<Request>(&line) {
                    Ok(Request::Record { seconds }) if seconds > 0.0 && seconds <= 3600.0 => {
                        match ask(Request::Record { seconds }) {
                            Response::Ok { .. } => {
                                std::thread::sleep(Duration::from_secs_f64(seconds));
                                ask(Request::Record { seconds: 0.0 })
                            }
                            other => other,
                        }
                    }
                    Ok(Request::Record { seconds }) => Response::Error {
                        message: format!("record: seconds must be in (0, 3600], not {seconds}"),
                    },
                    Ok(req) => ask(req),
                    Err(e) => Response::Error {
                        message: format!("bad request: {e}"),
                    },
                };
                let mut out = serde_json::to_string(&resp)
                    .unwrap_or_else(|_| "{\"type\":\"error\",\"message\":\"encode\"}".into());
                out.push('\n');
                let _ = conn.write_all(out.as_bytes());
            }
        })?;
    Ok(())
}
