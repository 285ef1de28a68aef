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
mod poll;

pub use bpf::{enable_run_time_stats, BpfOptions, BpfSource, KvmAttach, ProgStats, VMLINUX_H_USED};
pub use poll::{PollOptions, ProcPollSource};

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

/// One event about a registered vCPU thread. Plain data; `ts_ns` is
/// CLOCK_MONOTONIC nanoseconds when the kernel (or the poller) saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HostEvent {
    /// The thread left its CPU: preempted while runnable (`runnable`), or
    /// blocked (a vCPU that blocks is halted).
    SwitchOut {
        ts_ns: u64,
        tid: u32,
        vm: u32,
        vcpu: u32,
        runnable: bool,
    },
    /// The thread got a CPU (`cpu`).
    SwitchIn {
        ts_ns: u64,
        tid: u32,
        vm: u32,
        vcpu: u32,
        cpu: u32,
    },
    /// The thread is being woken.
    Waking {
        ts_ns: u64,
        tid: u32,
        vm: u32,
        vcpu: u32,
        source: WakeSource,
    },
    /// HLT or PAUSE exit of the vCPU (KVM only).
    KvmExit {
        ts_ns: u64,
        tid: u32,
        vm: u32,
        vcpu: u32,
        reason: KvmExitReason,
    },
    /// End of a halt (`kvm_vcpu_wakeup`): how long it lasted, whether
    /// halt-polling caught the wakeup (`polled`), and whether the poll window
    /// was valid (`valid`). For halt-poll tuning (KVM only).
    KvmHaltWakeup {
        ts_ns: u64,
        tid: u32,
        vm: u32,
        vcpu: u32,
        halt_ns: u64,
        polled: bool,
        valid: bool,
    },
    /// An interrupt was accepted by the local APIC of vCPU `vcpu` of `vm`
    /// (the APIC ID, taken as the vCPU index; KVM only).
    KvmIrq { ts_ns: u64, vm: u32, vcpu: u32 },
}

impl HostEvent {
    /// `(vm, vcpu, ts_ns, tid)`; `tid` is 0 for [`HostEvent::KvmIrq`], whose
    /// target thread the kernel does not name.
    pub fn ids(&self) -> (u32, u32, u64, i32) {
        match *self {
            HostEvent::SwitchOut {
                ts_ns,
                tid,
                vm,
                vcpu,
                ..
            }
            | HostEvent::SwitchIn {
                ts_ns,
                tid,
                vm,
                vcpu,
                ..
            }
            | HostEvent::Waking {
                ts_ns,
                tid,
                vm,
                vcpu,
                ..
            }
            | HostEvent::KvmExit {
                ts_ns,
                tid,
                vm,
                vcpu,
                ..
            }
            | HostEvent::KvmHaltWakeup {
                ts_ns,
                tid,
                vm,
                vcpu,
                ..
            } => (vm, vcpu, ts_ns, tid as i32),
            HostEvent::KvmIrq { ts_ns, vm, vcpu } => (vm, vcpu, ts_ns, 0),
        }
    }

    /// CLOCK_MONOTONIC nanoseconds of the event.
    pub fn ts_ns(&self) -> u64 {
        self.ids().2
    }
}

/// The ring-buffer record, `struct pvs_event` of `src/bpf/intf.h`.
pub mod wire {
    /// `sizeof(struct pvs_event)`.
    pub const EVENT_SIZE: usize = 40;
    /// Byte offsets of the fields (little-endian).
    pub const OFF_TS_NS: usize = 0;
    pub const OFF_KIND: usize = 8;
    pub const OFF_FLAGS: usize = 12;
    pub const OFF_TID: usize = 16;
    pub const OFF_VM: usize = 20;
    pub const OFF_VCPU: usize = 24;
    pub const OFF_CPU: usize = 28;
    pub const OFF_ARG: usize = 32;

    /// `enum pvs_event_kind`.
    pub const EV_SWITCH_OUT: u32 = 1;
    pub const EV_SWITCH_IN: u32 = 2;
    pub const EV_WAKING: u32 = 3;
    pub const EV_KVM_EXIT: u32 = 4;
    pub const EV_KVM_WAKEUP: u32 = 5;
    pub const EV_KVM_IRQ: u32 = 6;

    /// `enum pvs_event_flag`.
    pub const F_RUNNABLE: u32 = 1 << 0;
    pub const F_WAKER_VCPU: u32 = 1 << 1;
    pub const F_WAKER_SAME_VMM: u32 = 1 << 2;
    pub const F_WAKER_IRQ: u32 = 1 << 3;
    pub const F_EXIT_HLT: u32 = 1 << 4;
    pub const F_EXIT_PAUSE: u32 = 1 << 5;
    pub const F_ISA_VMX: u32 = 1 << 6;
    pub const F_WAITED: u32 = 1 << 7;
    pub const F_POLL_VALID: u32 = 1 << 8;
    pub const F_ALL: u32 = (1 << 9) - 1;

    /// Flags each kind may carry; anything else is a decode error.
    pub const fn allowed_flags(kind: u32) -> Option<u32> {
        match kind {
            EV_SWITCH_OUT => Some(F_RUNNABLE),
            EV_SWITCH_IN => Some(0),
            EV_WAKING => Some(F_WAKER_VCPU | F_WAKER_SAME_VMM | F_WAKER_IRQ),
            EV_KVM_EXIT => Some(F_EXIT_HLT | F_EXIT_PAUSE | F_ISA_VMX),
            EV_KVM_WAKEUP => Some(F_WAITED | F_POLL_VALID),
            EV_KVM_IRQ => Some(0),
            _ => None,
        }
    }

    /// `enum pvs_stat`: indexes of the per-CPU `stats` array.
    pub const STAT_DROPPED: u32 = 0;
    pub const STAT_EMITTED: u32 = 1;
    pub const STAT_LAZY: u32 = 2;
    pub const STAT_NR: u32 = 3;

    /// `enum pvs_lazy`: bits of a `lazy` array element.
    pub const LAZY_SWITCH_IN: u32 = 1 << 0;
    pub const LAZY_PREEMPTED: u32 = 1 << 1;
    pub const LAZY_BLOCKED: u32 = 1 << 2;
    pub const LAZY_WAKING: u32 = 1 << 3;
    pub const LAZY_KVM_EXIT: u32 = 1 << 4;
    pub const LAZY_KVM_WAKEUP: u32 = 1 << 5;
    pub const LAZY_ALL: u32 = (1 << 6) - 1;

    /// Size of `struct pvs_vcpu`, the `tracked` map's value.
    pub const VCPU_SIZE: usize = 16;

    /// kvm_exit reasons (arch/x86/include/uapi/asm/{vmx,svm}.h).
    pub const KVM_ISA_VMX: u32 = 1;
    pub const KVM_ISA_SVM: u32 = 2;
    pub const VMX_EXIT_HLT: u32 = 12;
    pub const VMX_EXIT_PAUSE: u32 = 40;
    pub const SVM_EXIT_PAUSE: u32 = 0x77;
    pub const SVM_EXIT_HLT: u32 = 0x78;
}

/// Why a ring-buffer record is not a [`HostEvent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("record of {len} bytes, expected {}", wire::EVENT_SIZE)]
    BadLength { len: usize },
    #[error("unknown event kind {0}")]
    UnknownKind(u32),
    #[error("event kind {kind}: flags {flags:#x} not valid for it")]
    BadFlags { kind: u32, flags: u32 },
    #[error("kvm exit record with neither or both of HLT and PAUSE (flags {0:#x})")]
    BadExitReason(u32),
    #[error("waking record with more than one waker class (flags {0:#x})")]
    BadWaker(u32),
}

/// A decoded but uninterpreted `struct pvs_event`: every field, including
/// those [`HostEvent`] leaves out (waker tid, target CPU, raw exit reason,
/// vector, ...). See the table in `src/bpf/intf.h`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawEvent {
    pub ts_ns: u64,
    pub kind: u32,
    pub flags: u32,
    pub tid: u32,
    pub vm: u32,
    pub vcpu: u32,
    pub cpu: u32,
    pub arg: u64,
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

impl RawEvent {
    /// Parses one record; only the length is checked.
    pub fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() != wire::EVENT_SIZE {
            return Err(DecodeError::BadLength { len: bytes.len() });
        }
        Ok(RawEvent {
            ts_ns: u64_at(bytes, wire::OFF_TS_NS),
            kind: u32_at(bytes, wire::OFF_KIND),
            flags: u32_at(bytes, wire::OFF_FLAGS),
            tid: u32_at(bytes, wire::OFF_TID),
            vm: u32_at(bytes, wire::OFF_VM),
            vcpu: u32_at(bytes, wire::OFF_VCPU),
            cpu: u32_at(bytes, wire::OFF_CPU),
            arg: u64_at(bytes, wire::OFF_ARG),
        })
    }

    /// The record as the BPF programs write it.
    pub fn to_bytes(&self) -> [u8; wire::EVENT_SIZE] {
        let mut b = [0u8; wire::EVENT_SIZE];
        b[wire::OFF_TS_NS..][..8].copy_from_slice(&self.ts_ns.to_le_bytes());
        b[wire::OFF_KIND..][..4].copy_from_slice(&self.kind.to_le_bytes());
        b[wire::OFF_FLAGS..][..4].copy_from_slice(&self.flags.to_le_bytes());
        b[wire::OFF_TID..][..4].copy_from_slice(&self.tid.to_le_bytes());
        b[wire::OFF_VM..][..4].copy_from_slice(&self.vm.to_le_bytes());
        b[wire::OFF_VCPU..][..4].copy_from_slice(&self.vcpu.to_le_bytes());
        b[wire::OFF_CPU..][..4].copy_from_slice(&self.cpu.to_le_bytes());
        b[wire::OFF_ARG..][..8].copy_from_slice(&self.arg.to_le_bytes());
        b
    }

    /// Interprets the record. Strict: unknown kinds and flags a kind cannot
    /// carry are errors (the programs and this decoder are built together).
    pub fn to_event(&self) -> Result<HostEvent, DecodeError> {
        use wire::*;
        let &RawEvent {
            ts_ns,
            kind,
            flags,
            tid,
            vm,
            vcpu,
            cpu,
            arg,
        } = self;
        let allowed = allowed_flags(kind).ok_or(DecodeError::UnknownKind(kind))?;
        if flags & !allowed != 0 {
            return Err(DecodeError::BadFlags { kind, flags });
        }
        Ok(match kind {
            EV_SWITCH_OUT => HostEvent::SwitchOut {
                ts_ns,
                tid,
                vm,
                vcpu,
                runnable: flags & F_RUNNABLE != 0,
            },
            EV_SWITCH_IN => HostEvent::SwitchIn {
                ts_ns,
                tid,
                vm,
                vcpu,
                cpu,
            },
            EV_WAKING => {
                let classes = flags & (F_WAKER_VCPU | F_WAKER_SAME_VMM | F_WAKER_IRQ);
                if classes.count_ones() > 1 {
                    return Err(DecodeError::BadWaker(flags));
                }
                let source = if flags & F_WAKER_VCPU != 0 {
                    WakeSource::Vcpu
                } else if flags & F_WAKER_SAME_VMM != 0 {
                    WakeSource::SameVmm
                } else {
                    WakeSource::Other
                };
                HostEvent::Waking {
                    ts_ns,
                    tid,
                    vm,
                    vcpu,
                    source,
                }
            }
            EV_KVM_EXIT => {
                let reason = match (flags & F_EXIT_HLT != 0, flags & F_EXIT_PAUSE != 0) {
                    (true, false) => KvmExitReason::Hlt,
                    (false, true) => KvmExitReason::Pause,
                    _ => return Err(DecodeError::BadExitReason(flags)),
                };
                HostEvent::KvmExit {
                    ts_ns,
                    tid,
                    vm,
                    vcpu,
                    reason,
                }
            }
            EV_KVM_WAKEUP => HostEvent::KvmHaltWakeup {
                ts_ns,
                tid,
                vm,
                vcpu,
                halt_ns: arg,
                polled: flags & F_WAITED == 0,
                valid: flags & F_POLL_VALID != 0,
            },
            EV_KVM_IRQ => HostEvent::KvmIrq { ts_ns, vm, vcpu },
            _ => return Err(DecodeError::UnknownKind(kind)),
        })
    }
}

/// Ring-buffer record to event. Any input gives an event or an error, never
/// a panic.
pub fn decode(bytes: &[u8]) -> Result<HostEvent, DecodeError> {
    RawEvent::parse(bytes)?.to_event()
}

/// Errors of the event sources.
#[derive(Debug, thiserror::Error)]
pub enum EventSourceError {
    /// BPF cannot work here at all (no kernel BTF, no privilege).
    #[error("BPF unavailable: {0}")]
    Unavailable(String),
    /// A libbpf operation failed.
    #[error("BPF {what}: {source}")]
    Bpf {
        what: String,
        #[source]
        source: libbpf_rs::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid argument: {0}")]
    Invalid(String),
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

/// Which source [`EventSource::open`] may use.
pub use crate::config::EventSourceKind;

/// Options of [`EventSource::open`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SourceOptions {
    /// `Auto`: BPF, else polling; `Bpf`: BPF or fail; `Poll`: polling only.
    pub kind: EventSourceKind,
    pub bpf: BpfOptions,
    pub poll: PollOptions,
}

impl SourceOptions {
    /// From the `[daemon]` section of the configuration.
    pub fn from_config(d: &crate::config::DaemonConfig) -> Self {
        SourceOptions {
            kind: d.event_source,
            bpf: BpfOptions {
                lazy_wakeup: d.lazy_events,
                ..BpfOptions::default()
            },
            poll: PollOptions {
                interval: Duration::from_micros(d.poll_interval_us.max(1)),
            },
        }
    }
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

    /// Which records of `tid` need not wake the daemon (`wire::LAZY_*`);
    /// the polling source has no wakeups to save.
    pub fn set_lazy(&mut self, tid: u32, bits: u32) {
        if let EventSource::Bpf(s) = self {
            s.set_lazy(tid, bits);
        }
    }

    /// Whether [`EventSource::set_lazy`] does anything.
    pub fn supports_lazy(&self) -> bool {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(kind: u32, flags: u32) -> RawEvent {
        RawEvent {
            ts_ns: 7,
            kind,
            flags,
            tid: 100,
            vm: 1,
            vcpu: 2,
            cpu: 3,
            arg: 42,
        }
    }

    #[test]
    fn decode_each_kind() {
        use wire::*;
        let cases = [
            (
                raw(EV_SWITCH_OUT, F_RUNNABLE),
                HostEvent::SwitchOut {
                    ts_ns: 7,
                    tid: 100,
                    vm: 1,
                    vcpu: 2,
                    runnable: true,
                },
            ),
            (
                raw(EV_SWITCH_OUT, 0),
                HostEvent::SwitchOut {
                    ts_ns: 7,
                    tid: 100,
                    vm: 1,
                    vcpu: 2,
                    runnable: false,
                },
            ),
            (
                raw(EV_SWITCH_IN, 0),
                HostEvent::SwitchIn {
                    ts_ns: 7,
                    tid: 100,
                    vm: 1,
                    vcpu: 2,
                    cpu: 3,
                },
            ),
            (
                raw(EV_WAKING, F_WAKER_VCPU),
                HostEvent::Waking {
                    ts_ns: 7,
                    tid: 100,
                    vm: 1,
                    vcpu: 2,
                    source: WakeSource::Vcpu,
                },
            ),
            (
                raw(EV_WAKING, F_WAKER_SAME_VMM),
                HostEvent::Waking {
                    ts_ns: 7,
                    tid: 100,
                    vm: 1,
                    vcpu: 2,
                    source: WakeSource::SameVmm,
                },
            ),
            (
                raw(EV_WAKING, F_WAKER_IRQ),
                HostEvent::Waking {
                    ts_ns: 7,
                    tid: 100,
                    vm: 1,
                    vcpu: 2,
                    source: WakeSource::Other,
                },
            ),
            (
                raw(EV_WAKING, 0),
                HostEvent::Waking {
                    ts_ns: 7,
                    tid: 100,
                    vm: 1,
                    vcpu: 2,
                    source: WakeSource::Other,
                },
            ),
            (
                raw(EV_KVM_EXIT, F_EXIT_HLT | F_ISA_VMX),
                HostEvent::KvmExit {
                    ts_ns: 7,
                    tid: 100,
                    vm: 1,
                    vcpu: 2,
                    reason: KvmExitReason::Hlt,
                },
            ),
            (
                raw(EV_KVM_EXIT, F_EXIT_PAUSE),
                HostEvent::KvmExit {
                    ts_ns: 7,
                    tid: 100,
                    vm: 1,
                    vcpu: 2,
                    reason: KvmExitReason::Pause,
                },
            ),
            (
                raw(EV_KVM_WAKEUP, F_WAITED | F_POLL_VALID),
                HostEvent::KvmHaltWakeup {
                    ts_ns: 7,
                    tid: 100,
                    vm: 1,
                    vcpu: 2,
                    halt_ns: 42,
                    polled: false,
                    valid: true,
                },
            ),
            (
                raw(EV_KVM_WAKEUP, 0),
                HostEvent::KvmHaltWakeup {
                    ts_ns: 7,
                    tid: 100,
                    vm: 1,
                    vcpu: 2,
                    halt_ns: 42,
                    polled: true,
                    valid: false,
                },
            ),
            (
                raw(EV_KVM_IRQ, 0),
                HostEvent::KvmIrq {
                    ts_ns: 7,
                    vm: 1,
                    vcpu: 2,
                },
            ),
        ];
        for (r, want) in cases {
            assert_eq!(decode(&r.to_bytes()), Ok(want), "{r:?}");
            assert_eq!(RawEvent::parse(&r.to_bytes()), Ok(r));
        }
    }

    #[test]
    fn decode_errors() {
        use wire::*;
        assert_eq!(decode(&[]), Err(DecodeError::BadLength { len: 0 }));
        assert_eq!(decode(&[0; 41]), Err(DecodeError::BadLength { len: 41 }));
        assert_eq!(decode(&[0; 40]), Err(DecodeError::UnknownKind(0)));
        assert_eq!(
            decode(&raw(7, 0).to_bytes()),
            Err(DecodeError::UnknownKind(7))
        );
        assert_eq!(
            decode(&raw(EV_SWITCH_IN, F_RUNNABLE).to_bytes()),
            Err(DecodeError::BadFlags {
                kind: EV_SWITCH_IN,
                flags: F_RUNNABLE
            })
        );
        assert_eq!(
            decode(&raw(EV_KVM_EXIT, F_ISA_VMX).to_bytes()),
            Err(DecodeError::BadExitReason(F_ISA_VMX))
        );
        assert_eq!(
            decode(&raw(EV_KVM_EXIT, F_EXIT_HLT | F_EXIT_PAUSE).to_bytes()),
            Err(DecodeError::BadExitReason(F_EXIT_HLT | F_EXIT_PAUSE))
        );
        assert_eq!(
            decode(&raw(EV_WAKING, F_WAKER_VCPU | F_WAKER_IRQ).to_bytes()),
            Err(DecodeError::BadWaker(F_WAKER_VCPU | F_WAKER_IRQ))
        );
    }

    /// The hand-written decoder against the types libbpf-cargo generated
    /// from intf.h (through the BPF object's BTF).
    #[test]
    fn wire_matches_intf_h() {
        use crate::events::bpf::skel::types as t;
        use std::mem::{offset_of, size_of};
        assert_eq!(size_of::<t::pvs_event>(), wire::EVENT_SIZE);
        assert_eq!(offset_of!(t::pvs_event, ts_ns), wire::OFF_TS_NS);
        assert_eq!(offset_of!(t::pvs_event, kind), wire::OFF_KIND);
        assert_eq!(offset_of!(t::pvs_event, flags), wire::OFF_FLAGS);
        assert_eq!(offset_of!(t::pvs_event, tid), wire::OFF_TID);
        assert_eq!(offset_of!(t::pvs_event, vm), wire::OFF_VM);
        assert_eq!(offset_of!(t::pvs_event, vcpu), wire::OFF_VCPU);
        assert_eq!(offset_of!(t::pvs_event, cpu), wire::OFF_CPU);
        assert_eq!(offset_of!(t::pvs_event, arg), wire::OFF_ARG);
        assert_eq!(size_of::<t::pvs_vcpu>(), wire::VCPU_SIZE);
        assert_eq!(offset_of!(t::pvs_vcpu, vm), 0);
        assert_eq!(offset_of!(t::pvs_vcpu, vcpu), 4);
        assert_eq!(offset_of!(t::pvs_vcpu, lazy_slot), 8);

        let l = |x: t::pvs_lazy| x.0;
        assert_eq!(l(t::pvs_lazy::PVS_LAZY_SWITCH_IN), wire::LAZY_SWITCH_IN);
        assert_eq!(l(t::pvs_lazy::PVS_LAZY_PREEMPTED), wire::LAZY_PREEMPTED);
        assert_eq!(l(t::pvs_lazy::PVS_LAZY_BLOCKED), wire::LAZY_BLOCKED);
        assert_eq!(l(t::pvs_lazy::PVS_LAZY_WAKING), wire::LAZY_WAKING);
        assert_eq!(l(t::pvs_lazy::PVS_LAZY_KVM_EXIT), wire::LAZY_KVM_EXIT);
        assert_eq!(l(t::pvs_lazy::PVS_LAZY_KVM_WAKEUP), wire::LAZY_KVM_WAKEUP);
        assert_eq!(l(t::pvs_lazy::PVS_LAZY_ALL), wire::LAZY_ALL);

        let k = |x: t::pvs_event_kind| x.0;
        assert_eq!(k(t::pvs_event_kind::PVS_EV_SWITCH_OUT), wire::EV_SWITCH_OUT);
        assert_eq!(k(t::pvs_event_kind::PVS_EV_SWITCH_IN), wire::EV_SWITCH_IN);
        assert_eq!(k(t::pvs_event_kind::PVS_EV_WAKING), wire::EV_WAKING);
        assert_eq!(k(t::pvs_event_kind::PVS_EV_KVM_EXIT), wire::EV_KVM_EXIT);
        assert_eq!(k(t::pvs_event_kind::PVS_EV_KVM_WAKEUP), wire::EV_KVM_WAKEUP);
        assert_eq!(k(t::pvs_event_kind::PVS_EV_KVM_IRQ), wire::EV_KVM_IRQ);
        assert_eq!(k(t::pvs_event_kind::PVS_EV_KIND_MAX), wire::EV_KVM_IRQ);

        let f = |x: t::pvs_event_flag| x.0;
        assert_eq!(f(t::pvs_event_flag::PVS_F_RUNNABLE), wire::F_RUNNABLE);
        assert_eq!(f(t::pvs_event_flag::PVS_F_WAKER_VCPU), wire::F_WAKER_VCPU);
        assert_eq!(
            f(t::pvs_event_flag::PVS_F_WAKER_SAME_VMM),
            wire::F_WAKER_SAME_VMM
        );
        assert_eq!(f(t::pvs_event_flag::PVS_F_WAKER_IRQ), wire::F_WAKER_IRQ);
        assert_eq!(f(t::pvs_event_flag::PVS_F_EXIT_HLT), wire::F_EXIT_HLT);
        assert_eq!(f(t::pvs_event_flag::PVS_F_EXIT_PAUSE), wire::F_EXIT_PAUSE);
        assert_eq!(f(t::pvs_event_flag::PVS_F_ISA_VMX), wire::F_ISA_VMX);
        assert_eq!(f(t::pvs_event_flag::PVS_F_WAITED), wire::F_WAITED);
        assert_eq!(f(t::pvs_event_flag::PVS_F_POLL_VALID), wire::F_POLL_VALID);
        assert_eq!(f(t::pvs_event_flag::PVS_F_ALL), wire::F_ALL);

        assert_eq!(t::pvs_stat::PVS_STAT_DROPPED.0, wire::STAT_DROPPED);
        assert_eq!(t::pvs_stat::PVS_STAT_EMITTED.0, wire::STAT_EMITTED);
        assert_eq!(t::pvs_stat::PVS_STAT_LAZY.0, wire::STAT_LAZY);
        assert_eq!(t::pvs_stat::PVS_STAT_NR.0, wire::STAT_NR);
    }

    #[test]
    fn serde_round_trip() {
        let ev = HostEvent::KvmHaltWakeup {
            ts_ns: 1,
            tid: 2,
            vm: 3,
            vcpu: 4,
            halt_ns: 5,
            polled: true,
            valid: false,
        };
        let s = serde_json::to_string(&ev).unwrap();
        assert_eq!(serde_json::from_str::<HostEvent>(&s).unwrap(), ev);
    }
}
