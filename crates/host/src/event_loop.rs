//! The event loop: host events and timers in, policy decisions out.
//!
//! One thread does everything on the latency path (events, slot reads,
//! decisions, sched_setattr, host halves), woken by epoll on the event
//! source, one timer, signals, and two channels (discovery, control) whose
//! slow work runs on threads of their own.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use pvsched_base::clock::monotonic_ns;
use pvsched_control::{Recording, TraceRecord};
use pvsched_policy::{serving, Decision, Decisions, Event, SlotReads};
use tracing::{error, info, warn};

use crate::actuator;
use crate::config::Resolved;
use crate::control::{self, ControlMsg};
use crate::discovery::{self, DiscoveryMsg, DiscoveryRequest};
use crate::doorbell::Doorbell;
use crate::events::{EventSource, HostEvent};
use crate::feed::{rivals_of, HostEventMeaning};
use crate::metrics::Metrics;
pub use crate::signals::{block_stop_signals, STOP_SIGNALS};
use crate::statefile::{self, restore_records, ThreadRecord};
use crate::vm::ServedVm;

const TOKEN_SOURCE: u64 = 1;
const TOKEN_TIMER: u64 = 2;
const TOKEN_SIGNAL: u64 = 3;
const TOKEN_DISCOVERY: u64 = 4;
const TOKEN_CONTROL: u64 = 5;
/// Doorbell `i` (`Daemon::doorbells`) is `TOKEN_DOORBELL + i`.
const TOKEN_DOORBELL: u64 = 16;

pub struct Daemon {
    pub(crate) cfg: Resolved,
    /// How boosts become kernel parameters (from the daemon config).
    boost_mapping: actuator::BoostMapping,
    pub(crate) source: EventSource,
    /// Served VMs; the index is the VM id in the event source's maps.
    pub(crate) vms: Vec<Option<ServedVm>>,
    pub(crate) metrics: Arc<Metrics>,
    /// Scratch output of one `handle` call.
    scratch: Decisions,
    /// Decisions collected for the VM being handled, applied in order.
    decisions: Vec<Decision>,
    pub(crate) state_path: PathBuf,
    /// Recorded threads that live but could not be restored (by a
    /// predecessor or by us): kept in the state file, tried again.
    pub(crate) leftover: Vec<ThreadRecord>,
    pub(crate) recording: Option<Recording>,
    pub(crate) started: Instant,
    next_scan: u64,
    next_recheck: u64,
    /// When the event thread last returned from epoll: the end of the
    /// wakeup part of a reaction (`reaction_wakeup_seconds`).
    woke_ns: u64,
    /// Absolute expiry the timerfd is set to (0: not yet): it is only
    /// reprogrammed when the next deadline moves, a syscall (and, in a VM, a
    /// timer-device exit) saved on most wakeups.
    armed_ns: u64,
    /// Host events of one drain, reused.
    batch: Vec<HostEvent>,
    /// Slots (VM id, vCPU) that records read late asked to read: read once the
    /// drain is over, at the present (see `on_host_event`).
    late_reads: Vec<(u32, u32)>,
    pub(crate) overloaded: bool,
    /// The kvm module's halt-polling parameters as found before `pvschedctl idle
    /// --apply host` first changed them: put back at shutdown (and recorded in the
    /// state file, for the next start after a crash).
    pub(crate) kvm_original: Option<statefile::SavedHaltPoll>,
    disc_rx: Receiver<DiscoveryMsg>,
    disc_fd: Arc<EventFd>,
    /// VMs to open, to the discovery thread.
    pub(crate) open_tx: Sender<DiscoveryRequest>,
    /// VMs being opened there, by name, with the VM id reserved for each.
    pub(crate) opening: BTreeMap<String, u32>,
    /// Why each VM that could not be opened was refused (logged once).
    pub(crate) refused: BTreeMap<String, String>,
    ctl_rx: Receiver<ControlMsg>,
    ctl_fd: Arc<EventFd>,
    stop: Arc<AtomicBool>,
    /// Guest doorbells, by VM name (`--doorbell`).
    pub(crate) doorbells: Vec<Doorbell>,
    /// When each doorbell, disarmed by its last ring, is armed again
    /// (`u64::MAX`: armed).
    doorbell_rearm: Vec<u64>,
    /// When each doorbell's last ring was handled (0: never).
    doorbell_last: Vec<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{op}: {source}")]
    Os {
        op: &'static str,
        source: nix::Error,
    },
    #[error(transparent)]
    State(#[from] statefile::StateFileError),
}

fn os(op: &'static str) -> impl FnOnce(nix::Error) -> DaemonError {
    move |source| DaemonError::Os { op, source }
}

impl Daemon {
    /// Starts the discovery and control threads; serving starts with
    /// [`Daemon::run`]. `leftover`: threads a predecessor left changed that
    /// could not be restored yet.
    pub fn new(
        cfg: Resolved,
        source: EventSource,
        metrics: Arc<Metrics>,
        recovered: statefile::Restored,
        doorbells: Vec<Doorbell>,
    ) -> Result<Self, DaemonError> {
        let leftover = recovered.left;
        let state_path = cfg.config.daemon.state_file.clone();
        let (disc_tx, disc_rx) = mpsc::channel();
        let (open_tx, open_rx) = mpsc::channel();
        let disc_fd = Arc::new(EventFd::from_flags(EfdFlags::EFD_NONBLOCK).map_err(os("eventfd"))?);
        let (ctl_tx, ctl_rx) = mpsc::channel();
        let ctl_fd = Arc::new(EventFd::from_flags(EfdFlags::EFD_NONBLOCK).map_err(os("eventfd"))?);
        let stop = Arc::new(AtomicBool::new(false));
        discovery::spawn(cfg.clone(), disc_tx, open_rx, disc_fd.clone(), stop.clone())?;
        control::spawn(
            cfg.config.daemon.control_socket.clone(),
            ctl_tx,
            ctl_fd.clone(),
            stop.clone(),
        )?;
        Ok(Self {
            boost_mapping: cfg.config.daemon.boost_mapping(),
            cfg,
            source,
            vms: Vec::new(),
            metrics,
            scratch: Decisions::with_capacity(64),
            decisions: Vec::with_capacity(64),
            state_path,
            leftover,
            recording: None,
            started: Instant::now(),
            next_scan: 0,
            woke_ns: 0,
            armed_ns: 0,
            batch: Vec::with_capacity(256),
            late_reads: Vec::new(),
            next_recheck: u64::MAX,
            overloaded: false,
            kvm_original: recovered.kvm_halt_poll,
            disc_rx,
            disc_fd,
            open_tx,
            opening: BTreeMap::new(),
            refused: BTreeMap::new(),
            ctl_rx,
            ctl_fd,
            stop,
            doorbells,
            doorbell_rearm: Vec::new(),
            doorbell_last: Vec::new(),
        })
    }

    /// Runs until a stop signal, then restores every thread. Every way out
    /// restores: an error, and a panic of the event thread too.
    pub fn run(mut self) -> Result<(), DaemonError> {
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve()));
        self.shutdown();
        match served {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    fn serve(&mut self) -> Result<(), DaemonError> {
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
        // One-shot: a ring is handled at most once per doorbell_interval_us
        // (`on_doorbell`, `rearm_doorbells`), so a guest writing its Doorbell
        // register in a loop wakes this FIFO thread no more often than that
        // (by default, as often as the recheck timer the doorbell replaces
        // would). Sparse rings are re-armed at once, without a timer.
        for (i, d) in self.doorbells.iter().enumerate() {
            epoll
                .add(
                    d.fd.as_fd(),
                    EpollEvent::new(
                        EpollFlags::EPOLLIN | EpollFlags::EPOLLONESHOT,
                        TOKEN_DOORBELL + i as u64,
                    ),
                )
                .map_err(os("epoll_ctl"))?;
        }
        self.doorbell_rearm = vec![u64::MAX; self.doorbells.len()];
        self.doorbell_last = vec![0; self.doorbells.len()];
        info!("serving");
        let mut events = [EpollEvent::empty(); 8];
        loop {
            if !self.doorbells.is_empty() {
                self.rearm_doorbells(&epoll, monotonic_ns())?;
            }
            self.arm(&timer)?;
            let n = match epoll.wait(&mut events, EpollTimeout::NONE) {
                Ok(n) => n,
                Err(nix::Error::EINTR) => continue,
                Err(e) => return Err(os("epoll_wait")(e)),
            };
            self.woke_ns = monotonic_ns();
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
                            return Ok(());
                        }
                    }
                    TOKEN_DISCOVERY => {
                        let _ = self.disc_fd.read();
                        while let Ok(msg) = self.disc_rx.try_recv() {
                            match msg {
                                DiscoveryMsg::Snapshot(snapshot) => self.on_discovery(snapshot),
                                DiscoveryMsg::Opened { name, id, result } => {
                                    self.on_opened(name, id, result)
                                }
                            }
                        }
                    }
                    TOKEN_CONTROL => {
                        let _ = self.ctl_fd.read();
                        while let Ok((req, reply)) = self.ctl_rx.try_recv() {
                            let resp = self.on_control(req);
                            let _ = reply.send(resp);
                        }
                    }
                    t if t >= TOKEN_DOORBELL => {
                        self.on_doorbell((t - TOKEN_DOORBELL) as usize);
                    }
                    _ => {}
                }
            }
            // Poll sources have no fd activity of their own between ticks.
            if !self.source.is_bpf() {
                self.drain_source();
            }
        }
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
        if let Some(&r) = self.doorbell_rearm.iter().min() {
            next = next.min(r);
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
        self.read_late_slots();
    }

    /// Reads the slots records read late asked for, once each, at the present.
    fn read_late_slots(&mut self) {
        if self.late_reads.is_empty() {
            return;
        }
        let mut reads = std::mem::take(&mut self.late_reads);
        reads.sort_unstable();
        reads.dedup();
        let now = monotonic_ns();
        let mut i = 0;
        while i < reads.len() {
            let id = reads[i].0;
            let mut acc = std::mem::take(&mut self.decisions);
            acc.clear();
            let scratch = &mut self.scratch;
            let mut vm = self.vms.get_mut(id as usize).and_then(Option::as_mut);
            while i < reads.len() && reads[i].0 == id {
                if let Some(vm) = vm.as_deref_mut() {
                    vm.guest_update(now, reads[i].1, scratch, &mut acc);
                }
                i += 1;
            }
            self.decisions = acc;
            self.apply(id, None, now);
        }
        reads.clear();
        self.late_reads = reads;
    }

    fn on_host_event(&mut self, ev: HostEvent) {
        let rivals = rivals_of(&ev);
        let HostEvent {
            ts_ns: ts,
            tid,
            vm: vm_id,
            vcpu,
            kind,
            quiet: lazy,
            ..
        } = ev;
        let Some(vm) = self.vms.get_mut(vm_id as usize).and_then(Option::as_mut) else {
            return;
        };
        if vcpu >= vm.policy.nr_vcpus() {
            return;
        }
        // A record queued without a wakeup (the program says so) is read
        // late: the policy gets the time it happened (its accounting), the
        // reaction metric skips it. The slots it asks to read are read after
        // the drain, at the present: a slot shows the present, and a boost
        // decided at the record's time would be charged from then, before it
        // was applied (a lone vCPU's records queued for a 5 s scan charged 3 s
        // of boost at once, and the budget latched).
        let wall = monotonic_ns();
        let now = ts.min(wall);
        let mut acc = std::mem::take(&mut self.decisions);
        acc.clear();
        let scratch = &mut self.scratch;
        let meaning = HostEventMeaning::of(kind, vcpu, rivals);
        let reads = SlotReads::for_event(&vm.policy, vcpu, meaning.event.as_ref());
        if lazy {
            self.late_reads.extend(reads.map(|w| (vm_id, w)));
        } else {
            for w in reads {
                vm.guest_update(now, w, scratch, &mut acc);
            }
        }
        let status_before = vm.policy.status(vcpu);
        let (event, trace) = (meaning.event, meaning.trace);
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
                tid: tid as i32,
                kind,
                reason: None,
                params: None,
            });
        }
        // The host half shows the vCPU's status to its guest (lock waiters look at their
        // holder's): a change no decision publishes is published here, for an unboosted
        // vCPU or one a waiter names (a boosted one's seq is what its doorbell rings
        // against: no extra updates).
        let status_changed = vm.policy.status(vcpu) != status_before;
        let decided = acc.iter().any(|d| d.vcpu == vcpu);
        if status_changed && !decided {
            let boosted = vm.vcpus.get(vcpu as usize).is_some_and(|m| m.boosted());
            if !boosted || vm.policy.lock_waited_on(vcpu) {
                vm.publish(wall, vcpu);
            }
        }
        self.decisions = acc;
        // Timers and the host half are set from the present.
        self.apply(vm_id, (!lazy).then_some(ts), wall);
    }

    /// Applies the pending decisions of VM `vm_id`.
    fn apply(&mut self, vm_id: u32, event_ts: Option<u64>, now: u64) {
        let mut decisions = std::mem::take(&mut self.decisions);
        if let Some(vm) = self.vms.get_mut(vm_id as usize).and_then(Option::as_mut) {
            actuator::apply_decisions(
                vm,
                &decisions,
                actuator::ApplyContext {
                    event_ts,
                    woke_ns: self.woke_ns,
                    now,
                    boost_latency_path: self.cfg.config.daemon.boost_latency_path,
                    boost: &self.boost_mapping,
                    metrics: &self.metrics,
                    recording: self.recording.as_mut(),
                },
            );
        }
        decisions.clear();
        self.decisions = decisions;
        self.update_recheck(now);
        self.sync_quiet(vm_id, now);
    }

    /// Whether records can be queued without a wakeup (configured, and a
    /// BPF source).
    fn quiet_active(&self) -> bool {
        self.cfg.config.daemon.lazy_events && self.source.supports_quiet()
    }

    /// Tells the event source which records of VM `vm_id`'s vCPUs need not
    /// wake us at `now`, after the daemon's view of them changed (and at every
    /// scan: a VM's guest RT work ages out without an event).
    fn sync_quiet(&mut self, vm_id: u32, now: u64) {
        if !self.quiet_active() {
            return;
        }
        let quiet_without_rivals = self.cfg.config.daemon.quiet_without_rivals;
        let Some(vm) = self.vms.get_mut(vm_id as usize).and_then(Option::as_mut) else {
            return;
        };
        for v in 0..vm.vcpus.len() {
            let quiet = vm.quiet(v as u32, now, quiet_without_rivals);
            let m = &mut vm.vcpus[v];
            if m.quiet != quiet {
                m.quiet = quiet;
                self.source.set_quiet(m.handle.tid as u32, quiet);
                tracing::trace!(vm = %vm.name, vcpu = v, ?quiet, "quiet records");
            }
        }
    }

    /// Arms again, in `epoll`, each doorbell whose pause after a ring is over.
    fn rearm_doorbells(&mut self, epoll: &Epoll, now: u64) -> Result<(), DaemonError> {
        for (i, d) in self.doorbells.iter().enumerate() {
            if self.doorbell_rearm[i] > now {
                continue;
            }
            self.doorbell_rearm[i] = u64::MAX;
            epoll
                .modify(
                    d.fd.as_fd(),
                    &mut EpollEvent::new(
                        EpollFlags::EPOLLIN | EpollFlags::EPOLLONESHOT,
                        TOKEN_DOORBELL + i as u64,
                    ),
                )
                .map_err(os("epoll_ctl"))?;
        }
        Ok(())
    }

    /// The guest of doorbell `i` rang: it published that a boosted vCPU has
    /// no reason left. Records queued without a wakeup come first, then every
    /// boosted vCPU of that VM is re-read (the ring does not say which).
    ///
    /// Rate: a ring less than `doorbell_interval_us` after the last one
    /// handled is left pending (the doorbell disarmed, one-shot) until that
    /// interval is over. After a ring handled, the doorbell is re-armed at
    /// once if the one before was at least two intervals earlier (sparse
    /// rings cost one wakeup each, no timer), else one interval later.
    fn on_doorbell(&mut self, i: usize) {
        let Some(d) = self.doorbells.get(i) else {
            return;
        };
        let interval = self.cfg.config.daemon.doorbell_interval_us * 1000;
        let (now, last) = (monotonic_ns(), self.doorbell_last[i]);
        if last != 0 && now < last.saturating_add(interval) {
            self.metrics.wakeups_doorbell.inc();
            self.doorbell_rearm[i] = last + interval;
            return;
        }
        self.doorbell_last[i] = now;
        self.doorbell_rearm[i] = if last == 0 || now - last >= 2 * interval {
            now
        } else {
            now + interval
        };
        let rings = match pvsched_base::ivshmem::drain(d.fd.as_fd()) {
            Ok(n) => n,
            Err(e) => {
                warn!(vm = %d.vm, error = %e, "doorbell read failed");
                0
            }
        };
        if rings == 0 {
            return;
        }
        self.metrics.wakeups_doorbell.inc();
        self.metrics.doorbell_rings.inc_by(rings);
        let name = d.vm.clone();
        if self.source.is_bpf() {
            self.drain_source();
        }
        let now = monotonic_ns();
        let Some(id) = self
            .vms
            .iter()
            .flatten()
            .find(|vm| vm.name == name)
            .map(|vm| vm.id)
        else {
            return;
        };
        let mut acc = std::mem::take(&mut self.decisions);
        acc.clear();
        if let Some(vm) = self.vms.get_mut(id as usize).and_then(Option::as_mut) {
            for v in 0..vm.policy.nr_vcpus() {
                if vm.vcpus.get(v as usize).is_some_and(|m| m.boosted()) {
                    vm.guest_update(now, v, &mut self.scratch, &mut acc);
                }
            }
        }
        self.decisions = acc;
        self.apply(id, None, now);
        // Answer the ring: a vCPU still boosted after the re-read (its guest
        // had a reason again by then) gets its host half written anyway, so
        // its seq moves and the guest, which rings once per host-half seq,
        // rings again when the reason ends. Without this a boost kept at the
        // ring lasted until the next scan rewrote the half and the guest
        // published again.
        if let Some(vm) = self.vms.get(id as usize).and_then(Option::as_ref) {
            for v in 0..vm.policy.nr_vcpus() {
                if vm.vcpus.get(v as usize).is_some_and(|m| m.boosted()) {
                    vm.publish(now, v);
                }
            }
        }
    }

    fn update_recheck(&mut self, now: u64) {
        // Only boosted vCPUs that may run can change their slot (a halted one
        // cannot). With quiet records the daemon learns that a halted boosted
        // vCPU runs again only when it wakes: the timer runs while any vCPU
        // is boosted, at most one wakeup per recheck_boosted_us for them all.
        // A VM with a doorbell needs none of it: its guest rings.
        let lazy = self.quiet_active();
        let wanted = self.vms.iter().flatten().any(|vm| vm.recheck_wanted(lazy));
        self.next_recheck = serving::next_recheck(
            self.next_recheck,
            now,
            self.cfg.config.daemon.recheck_boosted_us * 1000,
            wanted,
        );
        let boosted: usize = self
            .vms
            .iter()
            .flatten()
            .map(|vm| vm.vcpus.iter().filter(|m| m.boosted()).count())
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
            self.retry_leftover();
            // A region truncated under us is no longer the guest's: its VM
            // is restored and dropped before anything reads it (one fstat
            // per VM per scan).
            for vm in self.vms.iter_mut().flatten() {
                if !vm.region_intact() {
                    vm.gone = true;
                }
            }
            self.drop_gone();
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
                if scan || (recheck && vm.recheck_reads(v)) {
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
                vm.report_stats();
            }
            self.decisions = acc;
            self.apply(id, None, now);
        }
        self.drop_gone();
    }

    /// Restores every thread and clears the host halves; removes the state
    /// file only when every thread it would list was restored or is gone
    /// (else it is rewritten with those, for the next start).
    fn shutdown(&mut self) {
        let mut restored = 0;
        for vm in self.vms.iter_mut().flatten() {
            let done = vm.restore_all();
            restored += done.restored;
            self.leftover.extend(done.left);
            vm.clear_host_halves();
        }
        self.vms.clear();
        self.stop.store(true, Ordering::Relaxed);
        if let Err(e) = self.restore_kvm_params() {
            error!(error = %e, "cannot put the kvm module's halt-polling parameters back");
        }
        let done = restore_records(&self.leftover);
        restored += done.restored;
        self.leftover = done.left;
        if self.leftover.is_empty() && self.kvm_original.is_none() {
            let _ = std::fs::remove_file(&self.state_path);
        } else if let Err(e) = self.save_state(std::iter::empty()) {
            error!(error = %e, left = self.leftover.len(), "cannot record the threads left unrestored");
        } else {
            warn!(
                left = self.leftover.len(),
                "threads left unrestored stay in the state file"
            );
        }
        let _ = std::fs::remove_file(&self.cfg.config.daemon.control_socket);
        info!(restored, "restored every thread; exiting");
    }
}
