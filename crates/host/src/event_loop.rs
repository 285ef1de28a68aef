//! The event loop: host events and timers in, policy decisions out.
//!
//! One thread does everything on the latency path (events, slot reads,
//! decisions, sched_setattr, host halves), woken by epoll on the event
//! source, one timer, signals, and two channels (discovery, control) whose
//! slow work runs on threads of their own.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use pvsched_base::clock::monotonic_ns;
use pvsched_control::TraceRecord;
use pvsched_policy::{serving, Decision, Decisions, Event, SlotReads};
use tracing::{debug, error, info, warn};

use crate::actuator;
use crate::backend::{BackendState, LockScan, SchedExt, ScxAllowance};
use crate::config::Resolved;
use crate::control::{ControlServer, Served};
use crate::discovery::{self, DiscoveryMsg, Snapshot};
use crate::doorbell::{Doorbell, Doorbells};
use crate::error::os;
pub use crate::error::DaemonError;
use crate::events::{EventSource, HostEvent};
use crate::feed::{rivals_of, HostEventMeaning};
use crate::found::Found;
use crate::ivshmem_server::{self, PeerHandoff, SocketVms};
use crate::kvm_apply::HaltPollApply;
use crate::metrics::Metrics;
pub use crate::signals::{block_stop_signals, STOP_SIGNALS};
use crate::state_keeper::StateKeeper;
use crate::statefile::{self, StateFileError, ThreadRecord};
use crate::vm::ServedVm;
use crate::vm_table::{OpenTerms, VmTable};

const TOKEN_SOURCE: u64 = 1;
const TOKEN_TIMER: u64 = 2;
const TOKEN_SIGNAL: u64 = 3;
const TOKEN_DISCOVERY: u64 = 4;
const TOKEN_CONTROL: u64 = 5;
/// Doorbell `i` (`Daemon::doorbells`) is `TOKEN_DOORBELL + i`.
const TOKEN_DOORBELL: u64 = 16;
/// How often the event source's counters and each VM's statistics are
/// copied into the metrics.
const COUNTERS_INTERVAL_NS: u64 = 1_000_000_000;
/// How often each region's size is checked (`fstat`) for a truncation no
/// access has hit yet; a faulted access is caught at every scan. An
/// emulated host pays for each system call of a scan.
const REGION_STAT_INTERVAL_NS: u64 = 1_000_000_000;

/// pvschedd's event thread: the policy's mechanism, one part per job.
pub struct Daemon {
    cfg: Resolved,
    /// How boosts become kernel parameters (from the daemon config).
    boost_mapping: actuator::BoostMapping,
    source: EventSource,
    vms: VmTable,
    metrics: Arc<Metrics>,
    /// The state file, for a successor after a crash.
    state: StateKeeper,
    halt_poll: HaltPollApply,
    control: ControlServer,
    doorbells: Doorbells,
    /// Scratch output of one `handle` call.
    scratch: Decisions,
    /// Decisions collected for the VM being handled, applied in order.
    decisions: Vec<Decision>,
    next_scan: u64,
    next_recheck: u64,
    /// When the event source's counters are next copied into the metrics.
    next_counters: u64,
    /// When each region's size is next checked.
    next_region_stat: u64,
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
    overloaded: bool,
    /// The VMs of the discovery thread's last snapshot (it sends one only
    /// when something changed): a VM among them not served, whose open
    /// failed or which was dropped, is opened again from here at most once
    /// per discovery interval (`next_reopen`).
    last_found: Vec<Found>,
    next_reopen: u64,
    /// The sched_ext backend's scheduler while it runs (`None`: rt backend).
    scx: Option<SchedExt>,
    backend: BackendState,
    disc_rx: Receiver<DiscoveryMsg>,
    disc_fd: Arc<EventFd>,
    stop: Arc<AtomicBool>,
}

/// What a starting daemon takes over: from a predecessor, the threads it
/// left changed that could not be restored yet and the VMs it served through
/// the ivshmem socket; the doorbells it was given (`--doorbell`) or took
/// back from those VMs.
pub struct TakenOver {
    pub state: statefile::Restored,
    pub doorbells: Vec<Doorbell>,
    pub socket_peers: Vec<PeerHandoff>,
}

impl Daemon {
    /// Starts the ivshmem server and the discovery and control threads;
    /// serving starts with [`Daemon::run`].
    pub fn new(
        cfg: Resolved,
        source: EventSource,
        metrics: Arc<Metrics>,
        taken: TakenOver,
        scx: Option<SchedExt>,
        backend: BackendState,
    ) -> Result<Self, DaemonError> {
        let d = &cfg.config.daemon;
        let TakenOver {
            state: recovered,
            doorbells,
            socket_peers,
        } = taken;
        let state = StateKeeper::new(d.state_file.clone(), recovered.left);
        let halt_poll = HaltPollApply::new(d.kvm_params_dir.clone(), recovered.kvm_halt_poll);
        let (disc_tx, disc_rx) = mpsc::channel();
        let (open_tx, open_rx) = mpsc::channel();
        let disc_fd = Arc::new(EventFd::from_flags(EfdFlags::EFD_NONBLOCK).map_err(os("eventfd"))?);
        let stop = Arc::new(AtomicBool::new(false));
        let socket_vms = SocketVms::default();
        if cfg.config.ivshmem_server.enabled {
            ivshmem_server::spawn(
                &cfg,
                socket_peers,
                socket_vms.clone(),
                disc_tx.clone(),
                disc_fd.clone(),
                stop.clone(),
            )?;
        }
        discovery::spawn(
            cfg.clone(),
            socket_vms,
            disc_tx,
            open_rx,
            disc_fd.clone(),
            stop.clone(),
        )?;
        let control = ControlServer::start(d.control_socket.clone(), stop.clone())?;
        Ok(Self {
            boost_mapping: actuator::BoostMapping::of(d),
            cfg,
            source,
            vms: VmTable::new(open_tx),
            metrics,
            state,
            halt_poll,
            control,
            doorbells: Doorbells::new(doorbells, TOKEN_DOORBELL),
            scratch: Decisions::with_capacity(64),
            decisions: Vec::with_capacity(64),
            next_scan: 0,
            next_counters: 0,
            next_region_stat: 0,
            woke_ns: 0,
            armed_ns: 0,
            batch: Vec::with_capacity(256),
            late_reads: Vec::new(),
            next_recheck: u64::MAX,
            overloaded: false,
            last_found: Vec::new(),
            next_reopen: 0,
            scx,
            backend,
            disc_rx,
            disc_fd,
            stop,
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
            (self.control.wake_fd(), TOKEN_CONTROL),
        ] {
            epoll
                .add(fd, EpollEvent::new(EpollFlags::EPOLLIN, token))
                .map_err(os("epoll_ctl"))?;
        }
        // One-shot, re-armed by the ring rate (`Doorbells`).
        self.doorbells.register(&epoll).map_err(os("epoll_ctl"))?;
        info!("serving");
        let mut events = [EpollEvent::empty(); 8];
        loop {
            if !self.doorbells.is_empty() {
                self.doorbells
                    .rearm(&epoll, monotonic_ns())
                    .map_err(os("epoll_ctl"))?;
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
                                DiscoveryMsg::Snapshot(snapshot) => {
                                    self.on_discovery(snapshot, monotonic_ns())
                                }
                                DiscoveryMsg::Opened { name, id, result } => {
                                    self.on_opened(name, id, result)
                                }
                                DiscoveryMsg::Doorbell(d) => {
                                    self.doorbells.add(&epoll, d).map_err(os("epoll_ctl"))?;
                                    // A VM just connected to the ivshmem socket:
                                    // serve it now, not at the next round.
                                    if let Err(e) = self.vms.rescan() {
                                        error!("{e}");
                                    }
                                }
                                DiscoveryMsg::DoorbellGone(vm) => {
                                    self.on_doorbell_gone(&epoll, &vm)?
                                }
                            }
                        }
                    }
                    TOKEN_CONTROL => self.control.answer_waiting(Served {
                        cfg: &mut self.cfg,
                        vms: &mut self.vms,
                        source: &self.source,
                        metrics: &self.metrics,
                        halt_poll: &mut self.halt_poll,
                        state: &self.state,
                        backend: &self.backend,
                        scx: self.scx.as_ref(),
                    }),
                    t => {
                        if let Some(i) = self.doorbells.of_token(t) {
                            self.on_doorbell(i);
                        }
                    }
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
        for vm in self.vms.iter() {
            if let Some(d) = vm.policy.next_deadline() {
                next = next.min(d);
            }
        }
        if let Some(p) = self.source.next_poll_ns() {
            next = next.min(p);
        }
        if let Some(r) = self.doorbells.next_rearm() {
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
            let mut vm = self.vms.get_mut(id);
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
        let Some(vm) = self.vms.get_mut(vm_id) else {
            return;
        };
        if vcpu >= vm.policy.nr_vcpus() {
            return;
        }
        // A record queued without a wakeup (the program says so) is read
        // late: the policy gets the time it happened (its accounting), the
        // reaction metric skips it. When it is older than
        // `serving::LATE_RECORD_NS`, the slots it asks to read are read after
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
        if lazy && serving::reads_at_present(ts, wall) {
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
        if let (Some(rec), Some(kind)) = (self.control.recording(), trace) {
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
        if let Some(vm) = self.vms.get_mut(vm_id) {
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
                    recording: self.control.recording(),
                    scx: self.scx.as_ref(),
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
        let Some(vm) = self.vms.get_mut(vm_id) else {
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

    /// The guest of doorbell `i` rang: it published that a boosted vCPU has
    /// no reason left (`Doorbells::ring` says whether the ring is handled
    /// now). Records queued without a wakeup come first, then every boosted
    /// vCPU of that VM is re-read (the ring does not say which).
    fn on_doorbell(&mut self, i: usize) {
        let interval = self.cfg.config.daemon.doorbell_interval_us * 1000;
        let rung = self
            .doorbells
            .ring(i, monotonic_ns(), interval, &self.metrics);
        let Some(name) = rung.map(str::to_string) else {
            return;
        };
        if self.source.is_bpf() {
            self.drain_source();
        }
        let now = monotonic_ns();
        let Some(id) = self.vms.id_of(&name) else {
            return;
        };
        let mut acc = std::mem::take(&mut self.decisions);
        acc.clear();
        if let Some(vm) = self.vms.get_mut(id) {
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
        if let Some(vm) = self.vms.get(id) {
            for v in 0..vm.policy.nr_vcpus() {
                if vm.vcpus.get(v as usize).is_some_and(|m| m.boosted()) {
                    vm.publish(now, v);
                }
            }
        }
    }

    /// The doorbell of VM `vm` is gone (its QEMU left the ivshmem socket):
    /// while the VM is still served, its boosted vCPUs are re-read on the
    /// recheck timer again.
    fn on_doorbell_gone(&mut self, epoll: &Epoll, vm: &str) -> Result<(), DaemonError> {
        self.doorbells.remove(epoll, vm).map_err(os("epoll_ctl"))?;
        if let Some(served) = self.vms.iter_mut().find(|v| v.name == vm) {
            served.doorbell = false;
        }
        self.update_recheck(monotonic_ns());
        Ok(())
    }

    fn update_recheck(&mut self, now: u64) {
        // Only boosted vCPUs that may run can change their slot (a halted one
        // cannot). With quiet records the daemon learns that a halted boosted
        // vCPU runs again only when it wakes: the timer runs while any vCPU
        // is boosted, at most one wakeup per recheck_boosted_us for them all.
        // A VM with a doorbell needs none of it: its guest rings.
        // On the sched_ext backend a boost matters only when its vCPU is
        // queued, and the scheduler then checks the slot itself (a guest
        // boost holds while the slot backs it): no timer.
        let lazy = self.quiet_active();
        let wanted = self.scx.is_none() && self.vms.iter().any(|vm| vm.recheck_wanted(lazy));
        self.next_recheck = serving::next_recheck(
            self.next_recheck,
            now,
            self.cfg.config.daemon.recheck_boosted_us * 1000,
            wanted,
        );
        let boosted: usize = self
            .vms
            .iter()
            .map(|vm| vm.vcpus.iter().filter(|m| m.boosted()).count())
            .sum();
        self.metrics.boosted_vcpus.set(boosted as i64);
    }

    fn on_timer(&mut self, now: u64) {
        let scan = now >= self.next_scan;
        let recheck = now >= self.next_recheck;
        // The metrics the endpoint serves are refreshed once a second, not at
        // every scan (10-50 ms: on an emulated host the per-VM copy alone
        // took ~65 µs of each); a metrics request over the control socket
        // refreshes them itself.
        let report = scan && now >= self.next_counters;
        if recheck {
            self.next_recheck = u64::MAX;
        }
        if scan {
            let d = &self.cfg.config.daemon;
            let interval_us = if self.scx.is_some() {
                d.scx_scan_interval_us
            } else {
                d.scan_interval_us
            };
            self.next_scan = now + interval_us * 1000;
            // Map reads (syscalls, ~0.2 ms each in an emulated host).
            if report {
                self.next_counters = now + COUNTERS_INTERVAL_NS;
                self.metrics.set_source_counters(&self.source.counters());
            }
            self.retry_leftover();
            self.check_backend(now);
            // A region truncated under us is no longer the guest's: its VM
            // is restored and dropped (an access past the end, which reads
            // zero pages, at the next scan; a truncation no access hit yet
            // within a second: one fstat per VM).
            let stat = now >= self.next_region_stat;
            if stat {
                self.next_region_stat = now + REGION_STAT_INTERVAL_NS;
            }
            for vm in self.vms.iter_mut() {
                if !vm.region_intact(stat) {
                    vm.gone = true;
                }
            }
            self.drop_gone();
            if now >= self.next_reopen && self.vms.any_unserved(&self.last_found) {
                self.open_found(now);
            }
        }
        // Slot index == VM id; no list collected on this 2-kHz path.
        for id in 0..self.vms.id_bound() {
            let mut acc = std::mem::take(&mut self.decisions);
            acc.clear();
            let overloaded = self.overloaded;
            let scratch = &mut self.scratch;
            let Some(vm) = self.vms.get_mut(id) else {
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
            }
            if report {
                vm.report_stats();
            }
            self.decisions = acc;
            self.apply(id, None, now);
        }
        self.drop_gone();
    }

    /// At each scan, on the sched_ext backend: falls back to the rt backend
    /// when the kernel has ended the scheduler (every task is back in the
    /// fair class then: a boost it carried becomes an RT boost again), else
    /// raises each vCPU's extension allowance.
    fn check_backend(&mut self, now: u64) {
        let Some(scx) = self.scx.as_ref() else {
            return;
        };
        // One map read for both.
        let (exited, totals) = scx.state();
        if let Some(exit) = exited {
            error!(reason = %exit, "the kernel ended pvsched's sched_ext scheduler; falling back to the rt backend");
            self.metrics.scx_fallbacks.inc();
            self.backend.fell_back(exit.to_string());
            self.scx = None;
            // This thread left the RT class while the scheduler ran it ahead
            // of every boost; on the rt backend it is above them by SCHED_FIFO.
            let priority = u32::from(self.cfg.config.daemon.priority);
            // Memory stays locked from start-up.
            if let Err(e) = pvsched_base::sched::make_current_thread_fifo(priority, false) {
                error!(error = %e, "the event thread cannot return to SCHED_FIFO: reactions may be late under load");
            }
            for vm in self.vms.iter_mut() {
                // The policy decides the guest's RT work again, through the RT class.
                vm.policy.set_kernel_decides_rt(false);
                for m in vm.vcpus.iter_mut().chain(vm.latency_path.iter_mut()) {
                    if let Err(e) = m.move_to_kernel() {
                        warn!(vm = %vm.name, tid = m.handle.tid, error = %e, "boost to the RT class");
                    }
                }
            }
            self.update_recheck(now);
            return;
        }
        let d = &self.cfg.config.daemon;
        let share = u64::from(d.scx_extension_share_permille);
        let interval_ns = d.scx_scan_interval_us.saturating_mul(1000);
        let burst =
            pvsched_policy::extension_burst_ns(scx.options().extension_ns, share, interval_ns);
        for vm in self.vms.iter_mut() {
            crate::vm_table::find_slots(scx, vm);
            // The scheduler decides the guest's RT work where it can read every slot.
            let readable = vm.vcpus.iter().all(|m| m.scx_slot != 0);
            vm.policy.set_kernel_decides_rt(readable);
            // Lock holders are extended by the scheduler at the preemption, where it can
            // read the waiters' slots (and the policy then leaves them to it).
            let (peers, stride) = if readable && vm.policy.limits().honor_lock_holders {
                (vm.vcpus.len() as u32, vm.slot_stride())
            } else {
                (0, 0)
            };
            for (i, m) in vm.vcpus.iter_mut().enumerate() {
                let tid = m.handle.tid as u32;
                let Some(done) = scx.vcpu(tid) else { continue };
                // The scheduler's own boosts since the last scan, paid from the budget
                // before the next terms are set.
                let spent = done.kboost_ns.saturating_sub(m.kboost_charged_ns);
                let spent_cs = done.kboost_cs_ns.saturating_sub(m.kboost_cs_charged_ns);
                let spent_demoted = done
                    .kboost_demoted_ns
                    .saturating_sub(m.kboost_demoted_charged_ns);
                m.kboost_charged_ns = done.kboost_ns;
                m.kboost_cs_charged_ns = done.kboost_cs_ns;
                m.kboost_demoted_charged_ns = done.kboost_demoted_ns;
                vm.policy
                    .charge_kernel_boost(now, i as u32, spent, spent_cs, spent_demoted);
                let kernel = vm.policy.kernel_grant(i as u32, now);
                let allowance = ScxAllowance {
                    extension_ns: m.ext_allowance.next(now, done.ext_ns, share, burst),
                    kernel_boost_ns: done.kboost_ns.saturating_add(kernel.allowance_ns),
                    kernel,
                    lock: LockScan {
                        index: i as u32,
                        peers,
                        stride,
                    },
                };
                if let Err(e) = scx.allow(tid, allowance) {
                    debug!(vm = %vm.name, tid, error = %e, "allowance");
                }
            }
        }
        self.backend.record(totals);
    }

    /// Restores every thread, clears the host halves and withdraws lock
    /// holders from the regions that offered them; removes the state
    /// file only when every thread it would list was restored or is gone
    /// (else it is rewritten with those, for the next start).
    fn shutdown(&mut self) {
        let done = self.vms.restore_all();
        self.state.keep_unrestored(done.left);
        self.stop.store(true, Ordering::Relaxed);
        if let Err(e) = self.halt_poll.restore() {
            error!(error = %e, "cannot put the kvm module's halt-polling parameters back");
        }
        let restored = done.restored + self.state.finish(self.halt_poll.original());
        let _ = std::fs::remove_file(&self.cfg.config.daemon.control_socket);
        // A QEMU started now is refused at once instead of waiting on a
        // socket no one serves. The regions and peer records stay: the VMs
        // still map them, and the next pvschedd takes them back.
        if self.cfg.config.ivshmem_server.enabled {
            let _ = std::fs::remove_file(ivshmem_server::socket_path(&self.cfg));
        }
        info!(restored, "restored every thread; exiting");
    }

    fn on_discovery(&mut self, snapshot: Snapshot, now: u64) {
        let Snapshot { found, overloaded } = snapshot;
        self.overloaded = overloaded;
        // Drop VMs that are gone or whose threads changed, then open new ones.
        self.vms.mark_missing(&found);
        self.drop_gone();
        self.last_found = found;
        self.open_found(now);
    }

    /// Opens the VMs of the last snapshot that are neither served nor being
    /// opened; the next try is a discovery interval later.
    fn open_found(&mut self, now: u64) {
        let interval_ns = self
            .cfg
            .config
            .daemon
            .discovery_interval_ms
            .saturating_mul(1_000_000);
        self.next_reopen = now.saturating_add(interval_ns);
        let terms = OpenTerms {
            cfg: &self.cfg,
            metrics: &self.metrics,
            doorbells: &self.doorbells,
        };
        self.vms.open_new(self.last_found.clone(), terms);
    }

    /// A VM opened on the discovery thread: served once the state file
    /// lists its threads (none is boosted before).
    fn on_opened(&mut self, name: String, id: u32, result: Result<Box<ServedVm>, String>) {
        let Some(vm) = self.vms.opened(name, result) else {
            return;
        };
        if let Err(e) = self.save_state(vm.records().into_iter()) {
            error!(vm = %vm.name, error = %e, "cannot record the threads in the state file: not serving");
            return;
        }
        self.vms.serve(id, vm, &mut self.source, self.scx.as_ref());
        self.metrics.vms.set(self.vms.served() as i64);
    }

    /// Restores and drops the VMs marked gone.
    fn drop_gone(&mut self) {
        let Some(left) = self.vms.drop_gone(&mut self.source, self.scx.as_ref()) else {
            return;
        };
        self.state.keep_unrestored(left);
        // A failure leaves the previous file, which lists more threads
        // than are served: safe, since recovery checks each identity.
        if let Err(e) = self.save_state(std::iter::empty()) {
            error!(error = %e, "cannot rewrite the state file");
        }
        self.metrics.vms.set(self.vms.served() as i64);
    }

    /// Tries again to restore threads whose restore failed earlier (by this
    /// daemon or a predecessor); records the ones still left.
    fn retry_leftover(&mut self) {
        if self.state.retry_unrestored() {
            if let Err(e) = self.save_state(std::iter::empty()) {
                error!(error = %e, "cannot rewrite the state file");
            }
        }
    }

    /// Writes the state file: every served VM's threads, `extra` (VMs about
    /// to be served), the threads left unrestored and the kvm parameters to
    /// put back.
    fn save_state(&self, extra: impl Iterator<Item = ThreadRecord>) -> Result<(), StateFileError> {
        let served = self.vms.records().chain(extra);
        self.state.save(served, self.halt_poll.original())
    }
}
