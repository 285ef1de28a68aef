//! The ring-buffer record and map values of `src/bpf/intf.h`, decoded.
//!
//! Every constant and struct here is generated from the header at build
//! time (bindgen, `build/intf.rs`): none is copied by hand.

use std::mem::{offset_of, size_of};

use super::{EventKind, HostEvent, KvmExitReason, WakeSource};

/// The items of `src/bpf/intf.h`, as bindgen generates them.
#[allow(
    clippy::all,
    dead_code,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals
)]
pub mod intf {
    include!(concat!(env!("OUT_DIR"), "/intf.rs"));
}

pub use intf::*;

/// `sizeof(struct pvs_event)`.
pub const EVENT_SIZE: usize = PVS_EVENT_SIZE as usize;
/// `sizeof(struct pvs_vcpu)`, the `tracked` map's value.
pub const VCPU_SIZE: usize = size_of::<pvs_vcpu>();

const _: () = assert!(size_of::<pvs_event>() == EVENT_SIZE);

/// Flags each kind may carry; anything else is a decode error.
pub const fn allowed_flags(kind: u32) -> Option<u32> {
    match kind {
        PVS_EV_SWITCH_OUT => {
            Some(PVS_F_RUNNABLE | PVS_F_NO_RIVAL | PVS_F_NO_HOST_RIVAL | PVS_F_QUIET)
        }
        PVS_EV_SWITCH_IN => Some(PVS_F_QUIET),
        PVS_EV_WAKING => Some(
            PVS_F_WAKER_VCPU
                | PVS_F_WAKER_SAME_VMM
                | PVS_F_WAKER_IRQ
                | PVS_F_CPU_IDLE
                | PVS_F_NO_RIVAL
                | PVS_F_NO_HOST_RIVAL
                | PVS_F_QUIET,
        ),
        PVS_EV_KVM_EXIT => Some(PVS_F_EXIT_HLT | PVS_F_EXIT_PAUSE | PVS_F_ISA_VMX | PVS_F_QUIET),
        PVS_EV_KVM_WAKEUP => Some(PVS_F_WAITED | PVS_F_POLL_VALID | PVS_F_QUIET),
        PVS_EV_KVM_IRQ => Some(PVS_F_NO_RIVAL | PVS_F_NO_HOST_RIVAL | PVS_F_QUIET),
        _ => None,
    }
}

/// Why a ring-buffer record is not a [`HostEvent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("event kind {kind}: flags {flags:#x} not valid for it")]
    BadFlags { kind: u32, flags: u32 },
    #[error("kvm exit record with neither or both of HLT and PAUSE (flags {0:#x})")]
    BadExitReason(u32),
    #[error("record of {len} bytes, expected {EVENT_SIZE}")]
    BadLength { len: usize },
    #[error("record flagged with no rival but a host rival (flags {0:#x})")]
    BadRivals(u32),
    #[error("waking record with more than one waker class (flags {0:#x})")]
    BadWaker(u32),
    #[error("unknown event kind {0}")]
    UnknownKind(u32),
}

/// A decoded but uninterpreted `struct pvs_event`: every field, including
/// those [`HostEvent`] leaves out (waker tid, target CPU, raw exit reason,
/// vector, ...). See the table in `src/bpf/intf.h`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

macro_rules! off {
    ($field:ident) => {
        offset_of!(pvs_event, $field)
    };
}

impl RawEvent {
    /// Parses one record; only the length is checked.
    pub fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() != EVENT_SIZE {
            return Err(DecodeError::BadLength { len: bytes.len() });
        }
        Ok(RawEvent {
            ts_ns: u64_at(bytes, off!(ts_ns)),
            kind: u32_at(bytes, off!(kind)),
            flags: u32_at(bytes, off!(flags)),
            tid: u32_at(bytes, off!(tid)),
            vm: u32_at(bytes, off!(vm)),
            vcpu: u32_at(bytes, off!(vcpu)),
            cpu: u32_at(bytes, off!(cpu)),
            arg: u64_at(bytes, off!(arg)),
        })
    }

    /// The record as the BPF programs write it.
    pub fn to_bytes(&self) -> [u8; EVENT_SIZE] {
        let mut b = [0u8; EVENT_SIZE];
        b[off!(ts_ns)..][..8].copy_from_slice(&self.ts_ns.to_le_bytes());
        b[off!(kind)..][..4].copy_from_slice(&self.kind.to_le_bytes());
        b[off!(flags)..][..4].copy_from_slice(&self.flags.to_le_bytes());
        b[off!(tid)..][..4].copy_from_slice(&self.tid.to_le_bytes());
        b[off!(vm)..][..4].copy_from_slice(&self.vm.to_le_bytes());
        b[off!(vcpu)..][..4].copy_from_slice(&self.vcpu.to_le_bytes());
        b[off!(cpu)..][..4].copy_from_slice(&self.cpu.to_le_bytes());
        b[off!(arg)..][..8].copy_from_slice(&self.arg.to_le_bytes());
        b
    }

    /// Interprets the record. Strict: unknown kinds and flags a kind cannot
    /// carry are errors (the programs and this decoder are built together).
    pub fn to_event(&self) -> Result<HostEvent, DecodeError> {
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
        // No rival at all is no rival from outside the served VMs either.
        if flags & PVS_F_NO_RIVAL != 0 && flags & PVS_F_NO_HOST_RIVAL == 0 {
            return Err(DecodeError::BadRivals(flags));
        }
        let kind = match kind {
            PVS_EV_SWITCH_OUT => EventKind::SwitchOut {
                runnable: flags & PVS_F_RUNNABLE != 0,
            },
            PVS_EV_SWITCH_IN => EventKind::SwitchIn { cpu },
            PVS_EV_WAKING => {
                let classes = flags & (PVS_F_WAKER_VCPU | PVS_F_WAKER_SAME_VMM | PVS_F_WAKER_IRQ);
                if classes.count_ones() > 1 {
                    return Err(DecodeError::BadWaker(flags));
                }
                let source = if flags & PVS_F_WAKER_VCPU != 0 {
                    WakeSource::Vcpu
                } else if flags & PVS_F_WAKER_SAME_VMM != 0 {
                    WakeSource::SameVmm
                } else {
                    WakeSource::Other
                };
                EventKind::Waking {
                    source,
                    cpu_idle: flags & PVS_F_CPU_IDLE != 0,
                }
            }
            PVS_EV_KVM_EXIT => {
                let reason = match (flags & PVS_F_EXIT_HLT != 0, flags & PVS_F_EXIT_PAUSE != 0) {
                    (true, false) => KvmExitReason::Hlt,
                    (false, true) => KvmExitReason::Pause,
                    _ => return Err(DecodeError::BadExitReason(flags)),
                };
                EventKind::KvmExit { reason }
            }
            PVS_EV_KVM_WAKEUP => EventKind::KvmHaltWakeup {
                halt_ns: arg,
                polled: flags & PVS_F_WAITED == 0,
                valid: flags & PVS_F_POLL_VALID != 0,
            },
            PVS_EV_KVM_IRQ => EventKind::KvmIrq,
            _ => return Err(DecodeError::UnknownKind(kind)),
        };
        // The kernel does not name an interrupt's target thread.
        let tid = if kind == EventKind::KvmIrq { 0 } else { tid };
        Ok(HostEvent {
            ts_ns,
            tid,
            vm,
            vcpu,
            kind,
            quiet: flags & PVS_F_QUIET != 0,
            rivals: flags & PVS_F_NO_RIVAL == 0,
            host_rivals: flags & PVS_F_NO_HOST_RIVAL == 0,
        })
    }
}

/// Ring-buffer record to event. Any input gives an event or an error, never
/// a panic.
pub fn decode(bytes: &[u8]) -> Result<HostEvent, DecodeError> {
    RawEvent::parse(bytes)?.to_event()
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

    fn ev(kind: EventKind) -> HostEvent {
        HostEvent {
            ts_ns: 7,
            tid: if kind == EventKind::KvmIrq { 0 } else { 100 },
            vm: 1,
            vcpu: 2,
            kind,
            quiet: false,
            rivals: true,
            host_rivals: true,
        }
    }

    #[test]
    fn every_kind_decodes_to_its_event() {
        let cases = [
            (
                PVS_EV_SWITCH_OUT,
                PVS_F_RUNNABLE,
                EventKind::SwitchOut { runnable: true },
            ),
            (
                PVS_EV_SWITCH_OUT,
                0,
                EventKind::SwitchOut { runnable: false },
            ),
            (PVS_EV_SWITCH_IN, 0, EventKind::SwitchIn { cpu: 3 }),
            (
                PVS_EV_WAKING,
                PVS_F_WAKER_VCPU,
                EventKind::Waking {
                    source: WakeSource::Vcpu,
                    cpu_idle: false,
                },
            ),
            (
                PVS_EV_WAKING,
                PVS_F_WAKER_SAME_VMM,
                EventKind::Waking {
                    source: WakeSource::SameVmm,
                    cpu_idle: false,
                },
            ),
            (
                PVS_EV_WAKING,
                PVS_F_WAKER_IRQ,
                EventKind::Waking {
                    source: WakeSource::Other,
                    cpu_idle: false,
                },
            ),
            (
                PVS_EV_WAKING,
                0,
                EventKind::Waking {
                    source: WakeSource::Other,
                    cpu_idle: false,
                },
            ),
            (
                PVS_EV_KVM_EXIT,
                PVS_F_EXIT_HLT | PVS_F_ISA_VMX,
                EventKind::KvmExit {
                    reason: KvmExitReason::Hlt,
                },
            ),
            (
                PVS_EV_KVM_EXIT,
                PVS_F_EXIT_PAUSE,
                EventKind::KvmExit {
                    reason: KvmExitReason::Pause,
                },
            ),
            (
                PVS_EV_KVM_WAKEUP,
                PVS_F_WAITED | PVS_F_POLL_VALID,
                EventKind::KvmHaltWakeup {
                    halt_ns: 42,
                    polled: false,
                    valid: true,
                },
            ),
            (
                PVS_EV_KVM_WAKEUP,
                0,
                EventKind::KvmHaltWakeup {
                    halt_ns: 42,
                    polled: true,
                    valid: false,
                },
            ),
            (PVS_EV_KVM_IRQ, 0, EventKind::KvmIrq),
        ];
        for (kind, flags, want) in cases {
            let r = raw(kind, flags);
            assert_eq!(decode(&r.to_bytes()), Ok(ev(want)), "{r:?}");
            assert_eq!(RawEvent::parse(&r.to_bytes()), Ok(r));
        }
    }

    #[test]
    fn the_quiet_flag_and_an_idle_cpu_wakeup_are_decoded_as_set_by_the_program() {
        let quiet_idle = raw(
            PVS_EV_WAKING,
            PVS_F_WAKER_IRQ | PVS_F_CPU_IDLE | PVS_F_QUIET,
        );

        let ev = decode(&quiet_idle.to_bytes()).unwrap();

        assert!(ev.quiet);
        assert_eq!(
            ev.kind,
            EventKind::Waking {
                source: WakeSource::Other,
                cpu_idle: true
            }
        );
        assert!(!decode(&raw(PVS_EV_SWITCH_IN, 0).to_bytes()).unwrap().quiet);
        assert!(
            decode(&raw(PVS_EV_SWITCH_IN, PVS_F_QUIET).to_bytes())
                .unwrap()
                .quiet
        );
        // Only a wakeup names an idle CPU; an interrupt record may be
        // queued quietly (its target's lazy bits).
        assert!(decode(&raw(PVS_EV_SWITCH_OUT, PVS_F_CPU_IDLE).to_bytes()).is_err());
        assert!(
            decode(&raw(PVS_EV_KVM_IRQ, PVS_F_QUIET).to_bytes())
                .unwrap()
                .quiet
        );
    }

    #[test]
    fn a_record_without_rivals_or_with_only_served_vms_as_rivals_is_decoded_so_and_every_other_has_host_rivals(
    ) {
        let rivals = |kind, flags| {
            let ev = decode(&raw(kind, flags).to_bytes()).unwrap();
            (ev.rivals, ev.host_rivals)
        };
        for kind in [PVS_EV_SWITCH_OUT, PVS_EV_WAKING, PVS_EV_KVM_IRQ] {
            let none = PVS_F_NO_RIVAL | PVS_F_NO_HOST_RIVAL;
            assert_eq!(rivals(kind, none), (false, false));
            assert_eq!(rivals(kind, PVS_F_NO_HOST_RIVAL), (true, false));
            assert_eq!(rivals(kind, 0), (true, true));
            // No rival at all cannot come with a host rival.
            assert_eq!(
                decode(&raw(kind, PVS_F_NO_RIVAL).to_bytes()),
                Err(DecodeError::BadRivals(PVS_F_NO_RIVAL))
            );
        }
        // Only switch-outs, wakeups and interrupts look for rivals.
        for kind in [PVS_EV_SWITCH_IN, PVS_EV_KVM_WAKEUP] {
            assert!(decode(&raw(kind, PVS_F_NO_RIVAL).to_bytes()).is_err());
            assert!(decode(&raw(kind, PVS_F_NO_HOST_RIVAL).to_bytes()).is_err());
        }
    }

    #[test]
    fn malformed_records_are_errors() {
        assert_eq!(decode(&[]), Err(DecodeError::BadLength { len: 0 }));
        assert_eq!(decode(&[0; 41]), Err(DecodeError::BadLength { len: 41 }));
        assert_eq!(decode(&[0; 40]), Err(DecodeError::UnknownKind(0)));
        assert_eq!(
            decode(&raw(7, 0).to_bytes()),
            Err(DecodeError::UnknownKind(7))
        );
        assert_eq!(
            decode(&raw(PVS_EV_SWITCH_IN, PVS_F_RUNNABLE).to_bytes()),
            Err(DecodeError::BadFlags {
                kind: PVS_EV_SWITCH_IN,
                flags: PVS_F_RUNNABLE
            })
        );
        assert_eq!(
            decode(&raw(PVS_EV_KVM_EXIT, PVS_F_ISA_VMX).to_bytes()),
            Err(DecodeError::BadExitReason(PVS_F_ISA_VMX))
        );
        assert_eq!(
            decode(&raw(PVS_EV_KVM_EXIT, PVS_F_EXIT_HLT | PVS_F_EXIT_PAUSE).to_bytes()),
            Err(DecodeError::BadExitReason(
                PVS_F_EXIT_HLT | PVS_F_EXIT_PAUSE
            ))
        );
        assert_eq!(
            decode(&raw(PVS_EV_WAKING, PVS_F_WAKER_VCPU | PVS_F_WAKER_IRQ).to_bytes()),
            Err(DecodeError::BadWaker(PVS_F_WAKER_VCPU | PVS_F_WAKER_IRQ))
        );
    }

    /// bindgen's view of the header against the BTF that libbpf-cargo read
    /// from the compiled BPF object: the same layout on both sides.
    #[test]
    fn generated_structs_match_the_bpf_object() {
        use crate::events::bpf::skel::types as btf;
        assert_eq!(size_of::<btf::pvs_event>(), size_of::<pvs_event>());
        assert_eq!(offset_of!(btf::pvs_event, kind), off!(kind));
        assert_eq!(offset_of!(btf::pvs_event, flags), off!(flags));
        assert_eq!(offset_of!(btf::pvs_event, tid), off!(tid));
        assert_eq!(offset_of!(btf::pvs_event, vm), off!(vm));
        assert_eq!(offset_of!(btf::pvs_event, vcpu), off!(vcpu));
        assert_eq!(offset_of!(btf::pvs_event, cpu), off!(cpu));
        assert_eq!(offset_of!(btf::pvs_event, arg), off!(arg));
        assert_eq!(size_of::<btf::pvs_vcpu>(), VCPU_SIZE);
        assert_eq!(
            offset_of!(btf::pvs_vcpu, lazy_slot),
            offset_of!(pvs_vcpu, lazy_slot)
        );
        assert_eq!(btf::pvs_lazy::PVS_LAZY_ALL.0, PVS_LAZY_ALL);
        assert_eq!(btf::pvs_event_flag::PVS_F_ALL.0, PVS_F_ALL);
    }
}
