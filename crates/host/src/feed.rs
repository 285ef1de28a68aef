//! What a host event means to the policy: the policy event it becomes and
//! how a recording shows it (which slots to read before it is the policy's
//! rule: `pvsched_policy::SlotReads`).

use pvsched_control::TraceKind;
use pvsched_policy::{Event, ExitReason, Rivals, WakeSource};

use crate::events::{self, EventKind, HostEvent, KvmExitReason};

/// What the program saw on the other CPUs at `ev` ([`HostEvent::rivals`],
/// [`HostEvent::host_rivals`]), as the policy names it.
pub fn rivals_of(ev: &HostEvent) -> Rivals {
    if ev.host_rivals {
        Rivals::Host
    } else if ev.rivals {
        Rivals::PeerVms
    } else {
        Rivals::None
    }
}

/// The policy's view of one host event of vCPU `vcpu`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostEventMeaning {
    /// The policy event, if the policy has one for it.
    pub event: Option<Event>,
    /// How `pvschedctl record` shows it.
    pub trace: Option<TraceKind>,
}

impl HostEventMeaning {
    /// `rivals`: [`rivals_of`] the event.
    pub fn of(kind: EventKind, vcpu: u32, rivals: Rivals) -> Self {
        let (event, trace) = match kind {
            EventKind::SwitchOut { runnable: true } => (
                Some(Event::Preempted { vcpu, rivals }),
                Some(TraceKind::Preempted),
            ),
            EventKind::SwitchOut { runnable: false } => (
                Some(Event::Blocked { vcpu, rivals }),
                Some(TraceKind::Halted),
            ),
            EventKind::SwitchIn { .. } => (Some(Event::Running { vcpu }), Some(TraceKind::Running)),
            EventKind::Waking { source, cpu_idle } => {
                let source = match source {
                    events::WakeSource::Vcpu => WakeSource::OtherVcpu,
                    events::WakeSource::SameVmm => WakeSource::Io,
                    events::WakeSource::Other => WakeSource::Unknown,
                };
                (
                    Some(Event::Woken {
                        vcpu,
                        source,
                        cpu_idle,
                        rivals,
                    }),
                    Some(TraceKind::Woken),
                )
            }
            EventKind::KvmExit { reason } => {
                let reason = match reason {
                    KvmExitReason::Hlt => ExitReason::Hlt,
                    KvmExitReason::Pause => ExitReason::Pause,
                };
                (Some(Event::KvmExit { vcpu, reason }), None)
            }
            EventKind::KvmIrq => (Some(Event::InterruptTargeted { vcpu }), None),
            // Measured by the idle meter (every halt, polled ones included); decides nothing.
            EventKind::KvmHaltWakeup {
                halt_ns, polled, ..
            } => (
                Some(Event::KvmHaltEnded {
                    vcpu,
                    halt_ns,
                    polled,
                }),
                None,
            ),
        };
        Self { event, trace }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preemption_becomes_preempted() {
        let m = HostEventMeaning::of(EventKind::SwitchOut { runnable: true }, 3, Rivals::None);

        assert_eq!(
            m.event,
            Some(Event::Preempted {
                vcpu: 3,
                rivals: Rivals::None
            })
        );
        assert_eq!(m.trace, Some(TraceKind::Preempted));
    }

    #[test]
    fn a_switch_in_becomes_running() {
        let m = HostEventMeaning::of(EventKind::SwitchIn { cpu: 1 }, 0, Rivals::Host);

        assert_eq!(m.event, Some(Event::Running { vcpu: 0 }));
        assert_eq!(m.trace, Some(TraceKind::Running));
    }

    #[test]
    fn the_rivals_a_record_saw_reach_the_policy_as_none_peer_vms_or_host() {
        let ev = |rivals, host_rivals| HostEvent {
            ts_ns: 1,
            tid: 2,
            vm: 0,
            vcpu: 0,
            kind: EventKind::SwitchOut { runnable: true },
            quiet: false,
            rivals,
            host_rivals,
        };
        assert_eq!(rivals_of(&ev(false, false)), Rivals::None);
        assert_eq!(rivals_of(&ev(true, false)), Rivals::PeerVms);
        assert_eq!(rivals_of(&ev(true, true)), Rivals::Host);
    }
}
