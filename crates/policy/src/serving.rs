//! How pvschedd serves a VM's policy, beyond the policy's own decisions: which guest halves
//! it reads at a host event, which vCPUs its recheck timer re-reads and when that timer
//! expires next, when the host counts as overloaded, and how the halt-polling advisor pools
//! and prices halts. pvschedd and the simulator (`pvsched-sim`) both call these, so the
//! simulated daemon cannot drift from the real one. Pure, as the rest of the crate.

use crate::event::Event;
use crate::idle::{advise, DurationHistogram, IdleMeter, PollPrice};
use crate::state::{RunStatus, VmState};

/// pvschedd's default overload threshold (`daemon.overload_cpu_pressure_percent`): the
/// host counts as overloaded (`HF_OVERLOADED`) while CPU pressure is above it. Measured on
/// the 2-CPU development host (BENCHMARKS.md, message passing): a TCG guest's own
/// message-passing load alone keeps it at 10-15 %; stress-ng on every CPU at 50-77 %.
pub const DEFAULT_OVERLOAD_CPU_PRESSURE_PERCENT: f64 = 30.0;

/// pvschedd's default recheck period of boosted vCPUs (`daemon.recheck_boosted_us`).
pub const DEFAULT_RECHECK_NS: u64 = 500_000;

/// pvschedd's default discovery round (`daemon.discovery_interval_ms`), which also reads
/// the host's CPU pressure.
pub const DEFAULT_DISCOVERY_INTERVAL_NS: u64 = 1_000_000_000;

/// The longest halt-polling window the advisor considers: 1 ms, far above KVM's 200 µs
/// default; a longer poll is a busy vCPU, not a halt.
pub const ADVISOR_MAX_WINDOW_NS: u64 = 1_000_000;

/// A lazy record (queued without waking pvschedd) older than this when it
/// is read has its slot reads made after the drain, at the present: a boost
/// decided at its time would be charged from before it existed (a lone
/// vCPU's records wait for a scan, seconds). A younger one is read with its
/// event, as every record is: the policy then decides on the guest's state of
/// that moment. Deferring every lazy record's read cost a loaded TCG guest
/// its latency win (p99 0.07x of vanilla -> 0.24x, benchmarks/LOG.md).
pub const LATE_RECORD_NS: u64 = 2_000_000;

/// Whether a lazy record of time `record_ns`, read at `now`, has its slot
/// reads at the present (see [`LATE_RECORD_NS`]).
pub fn reads_at_present(record_ns: u64, now: u64) -> bool {
    now.saturating_sub(record_ns) > LATE_RECORD_NS
}

/// Whether the host is overloaded at CPU pressure `some_avg10_percent` (PSI cpu `some
/// avg10`, 0..=100) against `threshold_percent`: strictly above it.
pub fn overloaded(some_avg10_percent: f64, threshold_percent: f64) -> bool {
    some_avg10_percent > threshold_percent
}

/// The vCPUs whose guest halves are read, in this order, before a host event about `vcpu`
/// is fed to the policy: its own when the event reads it first
/// ([`Event::reads_slot_first`]), every other one when lock waits naming `vcpu` may be
/// there ([`VmState::reads_waiters_on`]). No event (a record the policy has no event for):
/// none.
#[derive(Clone, Debug)]
pub struct SlotReads {
    next: u32,
    nr_vcpus: u32,
    vcpu: u32,
    own: bool,
    others: bool,
}

impl SlotReads {
    pub fn for_event(vm: &VmState, vcpu: u32, event: Option<&Event>) -> Self {
        SlotReads {
            next: 0,
            nr_vcpus: vm.nr_vcpus(),
            vcpu,
            own: event.is_some_and(Event::reads_slot_first),
            others: event.is_some_and(|e| vm.reads_waiters_on(e)),
        }
    }
}

impl Iterator for SlotReads {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        while self.next < self.nr_vcpus {
            let w = self.next;
            self.next += 1;
            let read = if w == self.vcpu {
                self.own
            } else {
                self.others
            };
            if read {
                return Some(w);
            }
        }
        None
    }
}

/// Whether the recheck timer re-reads a vCPU's slot: boosted and not halted (only a vCPU
/// that may run can change its slot), in a VM without a doorbell (its guest rings instead).
pub fn recheck_reads(doorbell: bool, boosted: bool, status: Option<RunStatus>) -> bool {
    !doorbell && boosted && status != Some(RunStatus::Halted)
}

/// Whether a VM keeps the recheck timer running, given each vCPU's (boosted, status): a
/// vCPU it would re-read ([`recheck_reads`]), or, with records read lazily, any boosted
/// vCPU, halted too (the daemon may learn late that it runs again: only when it wakes).
pub fn recheck_wanted(
    doorbell: bool,
    lazy_records: bool,
    mut vcpus: impl Iterator<Item = (bool, Option<RunStatus>)>,
) -> bool {
    if lazy_records {
        !doorbell && vcpus.any(|(boosted, _)| boosted)
    } else {
        vcpus.any(|(boosted, status)| recheck_reads(doorbell, boosted, status))
    }
}

/// The recheck timer's next expiry after a decision at `now`: no later than one `period_ns`
/// from now while `wanted`, an expiry already armed kept; never (`u64::MAX`) otherwise.
pub fn next_recheck(armed: u64, now: u64, period_ns: u64, wanted: bool) -> u64 {
    if wanted {
        armed.min(now.saturating_add(period_ns))
    } else {
        u64::MAX
    }
}

/// How long a vCPU's idle meter has observed it at `now` (0 before its first halt).
pub fn observed_ns(meter: &IdleMeter, now: u64) -> u64 {
    meter.since().map_or(0, |s| now.saturating_sub(s))
}

/// The advisor's window for one vCPU's halts within `budget_permille` of a core.
pub fn advise_vcpu(meter: &IdleMeter, now: u64, budget_permille: u32) -> PollPrice {
    advise(
        &meter.halt_to_wake,
        observed_ns(meter, now),
        budget_permille,
        ADVISOR_MAX_WINDOW_NS,
    )
}

/// Several vCPUs' halts priced together, for one window that serves them all (the kvm
/// module's cap is host-wide): each vCPU's halts over its own observed time, the budgets
/// adding up per vCPU.
#[derive(Clone, Debug, Default)]
pub struct PooledHalts {
    halts: DurationHistogram,
    observed_ns: u64,
}

impl PooledHalts {
    pub fn add(&mut self, meter: &IdleMeter, now: u64) {
        self.halts.merge(&meter.halt_to_wake);
        self.observed_ns = self.observed_ns.saturating_add(observed_ns(meter, now));
    }

    /// The vCPU-ns the pooled halts were observed over.
    pub fn observed_ns(&self) -> u64 {
        self.observed_ns
    }

    /// The advisor's window for the pooled halts; none before any halt.
    pub fn advise(&self, budget_permille: u32) -> Option<PollPrice> {
        (self.halts.count() > 0).then(|| {
            advise(
                &self.halts,
                self.observed_ns,
                budget_permille,
                ADVISOR_MAX_WINDOW_NS,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Decisions;
    use crate::event::Rivals;
    use crate::limits::VmLimits;

    fn vm(honor_lock_holders: bool) -> VmState {
        let limits = VmLimits {
            honor_lock_holders,
            ..VmLimits::default()
        };
        VmState::new(limits, 4).expect("valid limits")
    }

    #[test]
    fn a_preemption_reads_its_slot_and_with_lock_holders_every_other_one() {
        let ev = Event::Preempted {
            vcpu: 2,
            rivals: Rivals::Host,
        };
        let own: Vec<u32> = SlotReads::for_event(&vm(false), 2, Some(&ev)).collect();
        let all: Vec<u32> = SlotReads::for_event(&vm(true), 2, Some(&ev)).collect();

        assert_eq!(own, vec![2]);
        assert_eq!(all, vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_switch_in_or_no_event_reads_nothing() {
        let running = Event::Running { vcpu: 1 };

        assert_eq!(
            SlotReads::for_event(&vm(true), 1, Some(&running)).count(),
            0
        );
        assert_eq!(SlotReads::for_event(&vm(true), 1, None).count(), 0);
    }

    #[test]
    fn the_recheck_reads_boosted_vcpus_that_may_run_without_a_doorbell() {
        assert!(recheck_reads(false, true, Some(RunStatus::Preempted)));
        assert!(recheck_reads(false, true, None));
        assert!(!recheck_reads(false, true, Some(RunStatus::Halted)));
        assert!(!recheck_reads(false, false, Some(RunStatus::Running)));
        assert!(!recheck_reads(true, true, Some(RunStatus::Running)));
    }

    #[test]
    fn lazy_records_keep_the_recheck_for_a_halted_boosted_vcpu() {
        let halted = || [(true, Some(RunStatus::Halted))].into_iter();

        assert!(recheck_wanted(false, true, halted()));
        assert!(!recheck_wanted(false, false, halted()));
        assert!(!recheck_wanted(true, true, halted()));
    }

    #[test]
    fn the_recheck_keeps_an_earlier_expiry_and_stops_when_unwanted() {
        assert_eq!(next_recheck(u64::MAX, 1_000, 500, true), 1_500);
        assert_eq!(next_recheck(1_200, 1_000, 500, true), 1_200);
        assert_eq!(next_recheck(1_200, 1_000, 500, false), u64::MAX);
    }

    #[test]
    fn overloaded_is_strictly_above_the_threshold() {
        assert!(!overloaded(30.0, DEFAULT_OVERLOAD_CPU_PRESSURE_PERCENT));
        assert!(overloaded(30.1, DEFAULT_OVERLOAD_CPU_PRESSURE_PERCENT));
    }

    #[test]
    fn pooled_halts_add_each_vcpus_observed_time() {
        let mut state = vm(false);
        let mut out = Decisions::new();
        for (vcpu, at) in [(0, 1_000), (1, 5_000)] {
            let halt = Event::KvmHaltEnded {
                vcpu,
                halt_ns: 10_000,
                polled: false,
            };
            state.handle(at, &halt, &mut out);
        }
        let mut pooled = PooledHalts::default();
        let now = 101_000;
        for v in 0..2 {
            pooled.add(state.idle_meter(v).expect("a meter per vCPU"), now);
        }
        let observed: u64 = (0..2)
            .map(|v| observed_ns(state.idle_meter(v).expect("meter"), now))
            .sum();

        assert_eq!(pooled.observed_ns(), observed);
        assert_eq!(pooled.advise(50).map(|p| p.halts), Some(2));
        assert_eq!(PooledHalts::default().advise(50), None);
    }

    #[test]
    fn only_a_late_record_has_its_slots_read_at_the_present() {
        assert!(!reads_at_present(10_000_000, 10_000_000 + LATE_RECORD_NS));
        assert!(reads_at_present(10_000_000, 10_000_001 + LATE_RECORD_NS));
        // A record stamped after the read (clocks of two CPUs) is never late.
        assert!(!reads_at_present(10_000_000, 9_000_000));
    }
}
