//! Host event sources: what the host scheduler and KVM say about vCPU threads.
//!
//! Two sources produce the same [`HostEvent`]s:
//! - [`BpfSource`]: BPF programs on `sched_switch`, `sched_waking` and the KVM
//!   tracepoints (`src/bpf/pvsched.bpf.c`, described in `src/bpf/README.md`)
//!   filter in the kernel (only registered vCPU threads, only state changes)
//!   and hand records to the daemon through one ring buffer.
//! - [`ProcPollSource`]: without CAP_BPF or kernel BTF, reads
//!   `/proc/<tid>/task/<tid>/{stat,schedstat}` of the registered threads at
//!   a fixed interval and reports the state changes it sees.
//!
//! [`EventSource`] picks one of them ([`EventSource::open`]).
//! Timestamps are CLOCK_MONOTONIC nanoseconds in both (`bpf_ktime_get_ns()`
//! in the kernel), so `now - ts_ns` is the daemon's reaction latency.

use std::os::fd::RawFd;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

mod bpf;
mod lazy;
mod poll;
pub mod wire;

pub use bpf::{enable_run_time_stats, BpfOptions, BpfSource, KvmAttach, ProgStats, VMLINUX_H_USED};
pub use lazy::Quiet;
pub use poll::{PollOptions, ProcPollSource};
pub use wire::{decode, DecodeError, RawEvent};

/// Who woke a vCPU thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WakeSource {
    /// Another vCPU thread of the same VM (an IPI).
    Vcpu,
    /// Another thread of the same VMM process (QEMU I/O thread, main loop,
    /// vhost worker): I/O completion, TCG timers.
    SameVmm,
    /// Anything else: a timer or device interrupt (the wakeup ran in IRQ
    /// context), another process, or unknown (polling source).
    Other,
}

/// The VM exits the daemon cares about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KvmExitReason {
    /// The guest executed HLT: the vCPU is going idle.
    Hlt,
    /// Pause-loop exit: the guest spins (likely on a lock whose holder is
    /// preempted).
    Pause,
}

/// One event about a registered vCPU thread: which thread, of which VM and
/// vCPU, when (CLOCK_MONOTONIC ns, when the kernel or the poller saw it),
/// and what happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostEvent {
    pub ts_ns: u64,
    /// The vCPU thread; 0 for [`EventKind::KvmIrq`], whose target thread
    /// the kernel does not name.
    pub tid: u32,
    pub vm: u32,
    pub vcpu: u32,
    pub kind: EventKind,
    /// Queued without waking the daemon (`PVS_F_QUIET`, set by the program
    /// that submitted it): read late, so its latency is no reaction time.
    pub quiet: bool,
    /// [`EventKind::SwitchOut`] and [`EventKind::Waking`]: some CPU ran a
    /// task from outside the thread's VM (not idle, not pvschedd, not a
    /// thread of the same process) when it was recorded. False only when
    /// the program saw none (`PVS_F_NO_RIVAL`); true where it does not look
    /// (and in recordings made before the field existed).
    #[serde(default = "rivals_unknown")]
    pub rivals: bool,
    /// As [`HostEvent::rivals`], for a task from outside every VM pvschedd
    /// serves (`PVS_F_NO_HOST_RIVAL` clear): false when the only rivals
    /// were other served VMs' threads, or none. Implies `rivals`.
    #[serde(default = "rivals_unknown")]
    pub host_rivals: bool,
}

/// [`HostEvent::rivals`] where nobody looked: the policy's default.
fn rivals_unknown() -> bool {
    true
}

/// What happened to the vCPU thread of a [`HostEvent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// The thread left its CPU: preempted while runnable (`runnable`), or
    /// blocked (a vCPU that blocks is halted).
    SwitchOut { runnable: bool },
    /// The thread got a CPU (`cpu`).
    SwitchIn { cpu: u32 },
    /// The thread is being woken; `cpu_idle`: the CPU it last ran on was
    /// idle, so it runs at once without a boost.
    Waking { source: WakeSource, cpu_idle: bool },
    /// HLT or PAUSE exit of the vCPU (KVM only).
    KvmExit { reason: KvmExitReason },
    /// End of a halt (`kvm_vcpu_wakeup`): how long it lasted, whether
    /// halt-polling caught the wakeup (`polled`), and whether the poll window
    /// was valid (`valid`). For halt-poll tuning (KVM only).
    KvmHaltWakeup {
        halt_ns: u64,
        polled: bool,
        valid: bool,
    },
    /// An interrupt was accepted by the local APIC of the vCPU (the APIC ID,
    /// taken as the vCPU index; KVM only).
    KvmIrq,
}

/// What the event source counted since the start (see [`EventSource::counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceCounters {
    /// Records submitted (BPF), and of those the lazy ones.
    pub records: u64,
    pub lazy_records: u64,
    /// Events lost (ring buffer full, or undecodable).
    pub dropped_events: u64,
}

/// Errors of the event sources.
#[derive(Debug, thiserror::Error)]
pub enum EventSourceError {
    /// A libbpf operation failed.
    #[error("BPF {what}: {source}")]
    Bpf {
        what: String,
        #[source]
        source: libbpf_rs::Error,
    },
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// BPF cannot work here at all (no kernel BTF, no privilege).
    #[error("BPF unavailable: {0}")]
    Unavailable(String),
}

impl EventSourceError {
    pub(crate) fn bpf(what: impl Into<String>) -> impl FnOnce(libbpf_rs::Error) -> Self {
        let what = what.into();
        move |source| EventSourceError::Bpf { what, source }
    }

    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| EventSourceError::Io { what, source }
    }
}

/// Which source [`EventSource::open`] may use (`daemon.event_source`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventSourceKind {
    /// BPF when it loads, else polling (logged).
    #[default]
    Auto,
    Bpf,
    Poll,
}

/// Options of [`EventSource::open`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceOptions {
    /// `Auto`: BPF, else polling; `Bpf`: BPF or fail; `Poll`: polling only.
    pub kind: EventSourceKind,
    pub bpf: BpfOptions,
    pub poll: PollOptions,
}

/// The daemon's event source: BPF, or the polling fallback.
#[allow(clippy::large_enum_variant)]
pub enum EventSource {
    Bpf(BpfSource),
    Poll(ProcPollSource),
}

impl EventSource {
    /// Opens the source `opts.kind` asks for; with `Auto`, BPF when it loads,
    /// else polling. Logs one line saying which and why.
    pub fn open(opts: &SourceOptions) -> Result<Self, EventSourceError> {
        match opts.kind {
            EventSourceKind::Bpf => {
                let s = BpfSource::load(opts.bpf.clone())?;
                info!(kvm = s.kvm_attached(), "event source: BPF (configured)");
                Ok(EventSource::Bpf(s))
            }
            EventSourceKind::Poll => {
                let s = ProcPollSource::new(opts.poll.clone())?;
                info!(
                    interval_us = opts.poll.interval.as_micros() as u64,
                    "event source: /proc polling (configured)"
                );
                Ok(EventSource::Poll(s))
            }
            EventSourceKind::Auto => match BpfSource::load(opts.bpf.clone()) {
                Ok(s) => {
                    info!(kvm = s.kvm_attached(), "event source: BPF");
                    Ok(EventSource::Bpf(s))
                }
                Err(e) => {
                    let s = ProcPollSource::new(opts.poll.clone())?;
                    warn!(
                        error = %e,
                        interval_us = opts.poll.interval.as_micros() as u64,
                        "event source: /proc polling, because BPF did not load \
                         (short preemptions between polls are invisible)"
                    );
                    Ok(EventSource::Poll(s))
                }
            },
        }
    }

    /// "bpf" or "poll".
    pub fn name(&self) -> &'static str {
        match self {
            EventSource::Bpf(_) => "bpf",
            EventSource::Poll(_) => "poll",
        }
    }

    pub fn is_bpf(&self) -> bool {
        matches!(self, EventSource::Bpf(_))
    }

    /// A descriptor that becomes readable when [`EventSource::consume`] has
    /// something to do (ring buffer data; the poller's timer). Owned by the
    /// source.
    pub fn fd(&self) -> RawFd {
        match self {
            EventSource::Bpf(s) => s.fd(),
            EventSource::Poll(s) => s.fd(),
        }
    }

    /// CLOCK_MONOTONIC ns of the next poll (polling source), `None` for BPF.
    pub fn next_poll_ns(&self) -> Option<u64> {
        match self {
            EventSource::Bpf(_) => None,
            EventSource::Poll(s) => Some(s.next_poll_ns()),
        }
    }

    /// Delivers what is ready without blocking; returns the number of events.
    pub fn consume(&mut self, f: impl FnMut(HostEvent)) -> usize {
        match self {
            EventSource::Bpf(s) => s.consume(f),
            EventSource::Poll(s) => s.consume(f),
        }
    }

    /// Waits up to `timeout` for events, then delivers them.
    pub fn poll(
        &mut self,
        timeout: Duration,
        f: impl FnMut(HostEvent),
    ) -> Result<usize, EventSourceError> {
        match self {
            EventSource::Bpf(s) => s.poll(timeout, f),
            EventSource::Poll(s) => s.poll(timeout, f),
        }
    }

    /// Registers vCPU thread `tid` as vCPU `vcpu` of VM `vm`. Failures are
    /// logged (see [`BpfSource::try_track`] for the fallible form).
    pub fn track(&mut self, tid: u32, vm: u32, vcpu: u32) {
        let r = match self {
            EventSource::Bpf(s) => s.try_track(tid, vm, vcpu),
            EventSource::Poll(s) => s.try_track(tid, vm, vcpu),
        };
        if let Err(e) = r {
            warn!(tid, vm, vcpu, error = %e, "cannot track vCPU thread: no events for it");
        }
    }

    pub fn untrack(&mut self, tid: u32) {
        match self {
            EventSource::Bpf(s) => s.untrack(tid),
            EventSource::Poll(s) => s.untrack(tid),
        }
    }

    /// Registers VMM process `tgid` as VM `vm` (attributes KVM interrupts).
    pub fn track_vmm(&mut self, tgid: u32, vm: u32) {
        if let EventSource::Bpf(s) = self {
            if let Err(e) = s.try_track_vmm(tgid, vm) {
                warn!(tgid, vm, error = %e, "cannot track VMM process");
            }
        }
    }

    pub fn untrack_vmm(&mut self, tgid: u32) {
        if let EventSource::Bpf(s) = self {
            s.untrack_vmm(tgid);
        }
    }

    /// Which records of `tid` need not wake the daemon (see
    /// [`Quiet`]); the polling source has no wakeups to save.
    pub fn set_quiet(&mut self, tid: u32, quiet: Quiet) {
        if let EventSource::Bpf(s) = self {
            s.set_quiet(tid, quiet);
        }
    }

    /// Whether [`EventSource::set_quiet`] does anything.
    pub fn supports_quiet(&self) -> bool {
        matches!(self, EventSource::Bpf(_))
    }

    /// Records submitted, and of those the lazy ones, since the start (BPF).
    pub fn record_counts(&self) -> (u64, u64) {
        match self {
            EventSource::Bpf(s) => (s.emitted_events(), s.lazy_events()),
            EventSource::Poll(_) => (0, 0),
        }
    }

    /// Events lost (ring buffer full, or undecodable), since the start.
    pub fn dropped_events(&self) -> u64 {
        match self {
            EventSource::Bpf(s) => s.dropped_events(),
            EventSource::Poll(_) => 0,
        }
    }

    /// Its counters now: three map reads (syscalls) on the BPF source, so
    /// read for a metrics answer or once a second, not at every scan.
    pub fn counters(&self) -> SourceCounters {
        let (records, lazy_records) = self.record_counts();
        SourceCounters {
            records,
            lazy_records,
            dropped_events: self.dropped_events(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_serde() {
        let ev = HostEvent {
            ts_ns: 1,
            tid: 2,
            vm: 3,
            vcpu: 4,
            kind: EventKind::KvmHaltWakeup {
                halt_ns: 5,
                polled: true,
                valid: false,
            },
            quiet: true,
            rivals: false,
            host_rivals: false,
        };
        let s = serde_json::to_string(&ev).unwrap();
        assert_eq!(serde_json::from_str::<HostEvent>(&s).unwrap(), ev);
    }
}
