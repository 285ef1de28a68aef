//! Per-VM state and the decision procedure: the state and its events here; the
//! counters it reports in `stats.rs`, lock waits and extensions in `lock_waits.rs`, and
//! the choice of each vCPU's params (rules 1-7 of the crate docs) in `evaluate.rs`.

use pvsched_abi as abi;

use crate::decision::{Decision, Decisions, Reason, SchedParams, Target};
use crate::event::{Event, EventKind, ExitReason, Rivals};
use crate::fairness::{Budget, BudgetParams};
use crate::guest::{GuestPolicy, GuestView, LockHolder};
use crate::idle::IdleMeter;
use crate::limits::{HostPolicy, LimitsError, VmLimits, MAX_VCPUS};
use crate::locks::{self, Extension, LockLedger};

mod evaluate;
mod kernel;
mod lock_waits;
mod stats;

use evaluate::*;
pub use kernel::KernelGrant;
pub use stats::{RunStatus, VcpuStats, VmStats};

/// A running proactive boost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Proactive {
    reason: Reason,
    until: u64,
    /// The guest's seq when the boost started (None if the guest did not speak): a guest
    /// update with another seq is the guest speaking for itself, which ends the boost.
    seq: Option<u32>,
    /// Policy and priority of the boost (re-clamped to the limits when offered): a halt
    /// boost keeps the priority of the RT work it follows, so that the vCPU's cycle
    /// RT work -> halt -> RT work costs no parameter change.
    class: HostPolicy,
    priority: u8,
}

#[derive(Clone, Debug)]
struct Vcpu {
    guest: GuestView,
    status: RunStatus,
    proactive: Option<Proactive>,
    /// `now` at which the current continuous boost began; `Some` iff the target is RT.
    boost_start: Option<u64>,
    /// Boosted time not yet matched by unboosted time (grows 1:1 while the target is RT,
    /// drains 1:1 while it is not): a flicker of unboost cannot restart the `max_boost`
    /// clock. Reaching `max_boost_ns` throttles.
    burst_ns: u64,
    /// `now` up to which `burst_ns` is accounted.
    burst_since: u64,
    /// A burst reached `demote_after_ns` and has not been repaid: every boost runs at RT
    /// priority 1 until the burst drains to zero through time the vCPU was halted or did
    /// not want a boost. Time it was held back (throttled, over budget) does not repay it,
    /// nor does the throttle's reset of the burst, so a guest that always asks stays at the
    /// bottom of the range from its first long burst on.
    demoted: bool,
    /// `now` of the last consistent guest read: an inconsistent read within
    /// `inconsistent_grace_ns` of it keeps the last view (the guest may have been preempted
    /// mid-update); later, the guest asks for nothing.
    last_consistent: Option<u64>,
    /// `now` of the last guest read showing RT work (for halt boosts).
    last_rt: Option<u64>,
    throttled_until: Option<u64>,
    target: Target,
    /// `now` since which the vCPU is charged to the boost budget; `Some` iff charged.
    charged_since: Option<u64>,
    /// The reason kind ([`Reason::index`]) charged since `now`; `Some` iff charged.
    charged_kind: Option<(usize, u64)>,
    /// `now` since which the vCPU is charged while demoted; `Some` iff so.
    demoted_since: Option<u64>,
    /// What this vCPU adds to the budget's drain right now, in vCPUs: 0 if not charged,
    /// `demoted_charge` if demoted, else 1.
    charge_weight: u32,
    /// This vCPU's critical-section budget, accounted up to `cs_at`.
    cs: Budget,
    cs_at: u64,
    /// `now` since which the vCPU is charged to its critical-section budget (charged, and
    /// boosted for a critical section); `Some` iff so.
    cs_charged_since: Option<u64>,
    /// A lock-holder extension in force.
    lock_ext: Option<Extension>,
    /// On a CPU under a lock-holder extension: adds to the lock debt.
    lock_charging: bool,
    /// What this vCPU repays of the lock debt per ns, permille (0: not repaying).
    repay_permille: u64,
    /// What the host's last report of it (preempted, halted, woken) saw on the other
    /// CPUs (`Event::Woken`); `Rivals::Host` until a report says otherwise.
    rivals: Rivals,
    stats: VcpuStats,
}

impl Vcpu {
    fn new(cs: Budget) -> Vcpu {
        Vcpu {
            guest: GuestView::inconsistent(),
            status: RunStatus::Unknown,
            proactive: None,
            boost_start: None,
            burst_ns: 0,
            burst_since: 0,
            demoted: false,
            last_consistent: None,
            last_rt: None,
            throttled_until: None,
            target: Target {
                params: SchedParams::NORMAL,
                reason: Reason::None,
                since: 0,
                throttled: false,
                in_debt: false,
                rt_work: false,
            },
            charged_since: None,
            charged_kind: None,
            demoted_since: None,
            charge_weight: 0,
            cs,
            cs_at: 0,
            cs_charged_since: None,
            lock_ext: None,
            lock_charging: false,
            repay_permille: 0,
            rivals: Rivals::Host,
            stats: VcpuStats::default(),
        }
    }

    /// Brings the critical-section budget up to `now` under the charge in force since
    /// `cs_at`.
    fn advance_cs(&mut self, p: &BudgetParams, now: u64) {
        let dt = now.saturating_sub(self.cs_at);
        let charged = u32::from(self.cs_charged_since.is_some());
        self.cs.advance(p, dt, charged);
        self.cs_at = self.cs_at.max(now);
    }

    /// The critical-section budget as it stands at `now` (for reports).
    fn cs_at_time(&self, p: &BudgetParams, now: u64) -> Budget {
        let mut b = self.cs;
        let charged = u32::from(self.cs_charged_since.is_some());
        b.advance(p, now.saturating_sub(self.cs_at), charged);
        b
    }
}

/// A boost candidate: (params, reason). Candidates are offered strongest-reason first, so a
/// later one replaces the current best only with a strictly higher RT priority.
type Candidate = (SchedParams, Reason);

/// All state of one VM: its limits, its vCPUs, its budgets. See the crate docs for the rules.
#[derive(Clone, Debug)]
pub struct VmState {
    limits: VmLimits,
    vcpus: Vec<Vcpu>,
    /// Idle transitions per vCPU (measurement only: no decision reads them).
    idle: Vec<IdleMeter>,
    /// The VM's boost budget (every boosted, non-halted vCPU-ns), and its rates.
    budget: Budget,
    budget_rates: BudgetParams,
    /// The rates of every vCPU's critical-section budget.
    cs_rates: BudgetParams,
    /// vCPUs charged to the boost budget right now.
    charged: u32,
    /// The budget's drain right now, in vCPUs: the sum of the vCPUs' `charge_weight`.
    charge_units: u32,
    now: u64,
    /// Every vCPU must be re-evaluated at the next event (new limits, new state).
    reeval_all: bool,
    /// The host scheduler decides the guest's RT work and halt boosts itself
    /// ([`VmState::set_kernel_decides_rt`]).
    kernel_rt: bool,
    overloaded: bool,
    /// Lock debt and extension counters.
    locks: LockLedger,
    /// Per vCPU: how many other vCPUs' lock waits name it as the holder.
    lock_named: Vec<u32>,
    /// vCPUs whose lock wait names no holder (any other vCPU may hold it).
    lock_any: u32,
    /// vCPUs to evaluate at this event besides the one it names (extensions started or
    /// ended by another vCPU's read).
    extra_eval: Vec<usize>,
    /// The guest has shown a lock wait or counted a contention (`F_LOCK_WAIT`): its code
    /// reads the host halves' status.
    lock_guest: bool,
    /// When any vCPU last showed guest RT work (`boost_only_against_rivals` spares a VM
    /// that runs such work).
    last_rt: Option<u64>,
    stats: VmStats,
}

impl VmState {
    /// A VM with `nr_vcpus` vCPUs (1..=[`MAX_VCPUS`]), all at [`SchedParams::NORMAL`], and
    /// full budgets. The first [`VmState::handle`] re-evaluates every vCPU, so limits that
    /// exclude nice 0 take effect at once.
    pub fn new(limits: VmLimits, nr_vcpus: u32) -> Result<VmState, LimitsError> {
        limits.validate()?;
        if nr_vcpus == 0 || nr_vcpus > MAX_VCPUS {
            return Err(LimitsError::NrVcpus(nr_vcpus));
        }
        let budget_rates = budget_params(&limits, nr_vcpus);
        let cs_rates = cs_params(&limits);
        let cs = Budget::full(&cs_rates);
        Ok(VmState {
            budget: Budget::full(&budget_rates),
            budget_rates,
            cs_rates,
            limits,
            vcpus: vec![Vcpu::new(cs); nr_vcpus as usize],
            idle: vec![IdleMeter::default(); nr_vcpus as usize],
            charged: 0,
            charge_units: 0,
            now: 0,
            reeval_all: true,
            kernel_rt: false,
            overloaded: false,
            locks: LockLedger::default(),
            lock_named: vec![0; nr_vcpus as usize],
            lock_any: 0,
            extra_eval: Vec::new(),
            lock_guest: false,
            last_rt: None,
            stats: VmStats {
                nr_vcpus,
                ..VmStats::default()
            },
        })
    }

    /// Replaces the limits (run-time tunables). Takes effect at the next event: every vCPU is
    /// re-evaluated then, and [`VmState::next_deadline`] reports "now" until it happens.
    /// Debts and latches are kept; banked tokens are capped at the new capacities.
    pub fn set_limits(&mut self, limits: VmLimits) -> Result<(), LimitsError> {
        limits.validate()?;
        // Critical-section budgets are accounted lazily: bring them to now at the old rates.
        let (old_cs, now) = (self.cs_rates, self.now);
        for v in &mut self.vcpus {
            v.advance_cs(&old_cs, now);
        }
        self.budget_rates = budget_params(&limits, self.nr_vcpus());
        self.cs_rates = cs_params(&limits);
        self.limits = limits;
        self.budget.rescale(&self.budget_rates);
        for v in &mut self.vcpus {
            v.cs.rescale(&self.cs_rates);
        }
        self.reeval_all = true;
        Ok(())
    }

    pub fn limits(&self) -> &VmLimits {
        &self.limits
    }

    pub fn nr_vcpus(&self) -> u32 {
        self.vcpus.len() as u32
    }

    /// Latest `now` handled.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// What the engine wants for `vcpu` now; `None` for an index the VM does not have.
    pub fn target(&self, vcpu: u32) -> Option<&Target> {
        self.vcpus.get(vcpu as usize).map(|v| &v.target)
    }

    /// The last sanitized guest view of `vcpu`.
    pub fn guest_view(&self, vcpu: u32) -> Option<&GuestView> {
        self.vcpus.get(vcpu as usize).map(|v| &v.guest)
    }

    /// Whether the VM's boost budget is latched: it spent its budget and is earning it back;
    /// no vCPU of it is boosted meanwhile.
    pub fn in_debt(&self) -> bool {
        self.budget.latched()
    }

    /// The boost budget bucket (in the units of [`VmState::budget_params`]).
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The rates of the boost budget.
    pub fn budget_params(&self) -> BudgetParams {
        self.budget_rates
    }

    /// `vcpu`'s critical-section budget as of the last event; `None` for an index the VM
    /// does not have.
    pub fn cs_budget(&self, vcpu: u32) -> Option<Budget> {
        let v = self.vcpus.get(vcpu as usize)?;
        Some(v.cs_at_time(&self.cs_params(), self.now))
    }

    /// The rates of each vCPU's critical-section budget.
    pub fn cs_params(&self) -> BudgetParams {
        self.cs_rates
    }

    /// Handles one event at `now` (ns, host clock) and puts into `out` (cleared first) one
    /// [`Decision`] per vCPU whose target params or reason kind changed, in vCPU order.
    /// A `now` earlier than a previous one is handled as the previous one (and counted).
    pub fn handle(&mut self, now: u64, event: &Event, out: &mut Decisions) {
        out.clear();
        let now = if now < self.now {
            self.stats.time_regressions += 1;
            self.now
        } else {
            now
        };
        self.stats.events[event.kind().index()] += 1;
        let was_in_debt = self.budget.latched();
        let was_lock_debt = self.locks.in_debt();
        self.advance(now);
        if was_in_debt != self.budget.latched() || was_lock_debt != self.locks.in_debt() {
            self.reeval_all = true;
        }
        self.extra_eval.clear();

        let mut touched = None;
        if let Some(vcpu) = event.vcpu() {
            if (vcpu as usize) < self.vcpus.len() {
                // Up to now under the status before this event changes it.
                account_burst(&mut self.vcpus[vcpu as usize], now);
                self.apply(vcpu as usize, now, event);
                touched = Some(vcpu as usize);
            } else {
                self.stats.out_of_range_events += 1;
            }
        } else {
            match event {
                Event::Tick => self.reeval_all = true,
                Event::OverloadHint { overloaded } => self.overloaded = *overloaded,
                _ => {}
            }
        }

        if self.reeval_all {
            self.reeval_all = false;
            for i in 0..self.vcpus.len() {
                self.evaluate(i, now, out);
            }
        } else {
            if let Some(i) = touched {
                self.evaluate(i, now, out);
            }
            if !self.extra_eval.is_empty() {
                let mut extra = std::mem::take(&mut self.extra_eval);
                extra.sort_unstable();
                extra.dedup();
                for &i in &extra {
                    if Some(i) != touched {
                        self.evaluate(i, now, out);
                    }
                }
                self.extra_eval = extra;
                out.sort_by_vcpu();
            }
        }
        // Extensions started or ended move the lock debt's rates; a debt that appeared
        // re-evaluates the others at the next event (their nice).
        if was_lock_debt != self.locks.in_debt() {
            self.reeval_all = true;
        }
    }

    /// Whether a host event about `vcpu` should come with fresh reads of the other vCPUs'
    /// slots: its preemption, when lock holders are extended (the waiters that name it are
    /// on the other vCPUs' slots).
    /// (Also for a guest that never publishes waits: the policy does not know which
    /// guests do; N-1 reads per preemption, and those fresh reads end proactive boosts a
    /// little earlier.)
    /// Not where the host scheduler decides ([`VmState::set_kernel_decides_rt`]): it
    /// reads the waiters' slots itself, at the holder's slice end.
    pub fn reads_waiters_on(&self, event: &Event) -> bool {
        self.limits.honor_lock_holders
            && !self.kernel_rt
            && matches!(event, Event::Preempted { .. })
    }

    /// Whether a lock wait names `vcpu` as the holder: its runs and preemptions matter at
    /// once.
    pub fn lock_waited_on(&self, vcpu: u32) -> bool {
        self.lock_named.get(vcpu as usize).is_some_and(|&n| n > 0)
    }

    /// Whether the guest publishes lock waits (it has shown one, or counted a contention):
    /// its waiters act on the status in the host halves, which must then follow the
    /// vCPUs' switches closely.
    pub fn lock_guest(&self) -> bool {
        self.lock_guest
    }

    /// The VM's lock ledger (debt, counters).
    pub fn lock_ledger(&self) -> &LockLedger {
        &self.locks
    }

    /// Whether the VM ran guest RT work (an RT or deadline task, a boost request, a
    /// pending hint) within `halt_boost_ns` of `now`: what spares it
    /// `boost_only_against_rivals`.
    pub fn rt_work_recent(&self, now: u64) -> bool {
        recent(&self.limits, self.last_rt, now)
    }

    /// The earliest `now` at which a [`Event::Tick`] could change a decision (proactive boost
    /// expiry, `max_boost` reached, throttle end, a budget latch setting or clearing), or
    /// `None` if only a new event can. May be <= [`VmState::now`] (then tick at once).
    pub fn next_deadline(&self) -> Option<u64> {
        if self.reeval_all {
            return Some(self.now);
        }
        let mut best: Option<u64> = None;
        let mut offer = |t: u64| {
            best = Some(best.map_or(t, |b| b.min(t)));
        };
        let cs = self.cs_params();
        for v in &self.vcpus {
            let charged = u32::from(v.cs_charged_since.is_some());
            if let Some(dt) = v.cs.next_flip_ns(&cs, charged) {
                offer(v.cs_at.saturating_add(dt));
            }
            if let Some(p) = v.proactive {
                offer(p.until);
            }
            match (v.throttled_until, v.boost_start) {
                (Some(t), _) => offer(t),
                // Only time on a CPU grows a burst: a waiting vCPU's deadlines move on.
                (None, Some(_)) if v.status.on_cpu() => {
                    offer(
                        v.burst_since
                            .saturating_add(self.limits.max_boost_ns.saturating_sub(v.burst_ns)),
                    );
                    if !v.demoted && v.burst_ns < self.limits.demote_after_ns {
                        offer(
                            v.burst_since
                                .saturating_add(self.limits.demote_after_ns - v.burst_ns),
                        );
                    }
                }
                (None, _) => {}
            }
        }
        if let Some(dt) = self
            .budget
            .next_flip_ns(&self.budget_params(), self.charge_units)
        {
            offer(self.now.saturating_add(dt));
        }
        for v in &self.vcpus {
            if let Some(e) = v.lock_ext {
                offer(e.until);
            }
        }
        if let Some(dt) = self.locks.clears_in_ns() {
            offer(self.now.saturating_add(dt));
        }
        if let Some(dt) = self.locks.repay_starts_in_ns() {
            offer(self.now.saturating_add(dt));
        }
        best
    }

    /// Idle transitions of `vcpu` measured so far (halt -> wake, wake -> running).
    pub fn idle_meter(&self, vcpu: u32) -> Option<&IdleMeter> {
        self.idle.get(vcpu as usize)
    }

    /// What the host last saw `vcpu`'s thread do; `None` for an index the VM does not have.
    /// (The cheap part of [`VmState::vcpu_stats`], for the event path.)
    pub fn status(&self, vcpu: u32) -> Option<RunStatus> {
        self.vcpus.get(vcpu as usize).map(|v| v.status)
    }

    /// The host half to publish for `vcpu` at `now` (`seq` 0: the writer owns the seqcount).
    /// All zero for an index the VM does not have.
    pub fn host_half(&self, vcpu: u32, now: u64) -> abi::HostHalf {
        let Some(v) = self.vcpus.get(vcpu as usize) else {
            return abi::HostHalf::default();
        };
        let t = &v.target;
        let mut flags = 0;
        if t.params.is_rt() {
            flags |= abi::HF_BOOSTED;
        }
        if t.throttled {
            flags |= abi::HF_THROTTLED;
        }
        if self.overloaded {
            flags |= abi::HF_OVERLOADED;
        }
        if self.budget.latched() || self.locks.in_debt() {
            flags |= abi::HF_IN_DEBT;
        }
        let hint = self
            .idle
            .get(vcpu as usize)
            .map(IdleMeter::hint)
            .unwrap_or_default();
        abi::HostHalf {
            seq: 0,
            status: v.status.abi(),
            flags,
            policy: t.params.policy.uapi(),
            rt_priority: u32::from(t.params.rt_priority),
            nice: i32::from(t.params.nice),
            update_ns: now,
            boost_count: v.stats.boosts,
            throttle_count: v.stats.throttles,
            preempt_count: v.stats.preemptions,
            boosted_ns: v
                .stats
                .boosted_ns
                .saturating_add(charged_ns(v, now.max(self.now))),
            wake_p50_ns: hint.p50_ns,
            wake_p99_ns: hint.p99_ns,
            poll_budget_permille: self.limits.idle_poll_budget_permille,
            host_reserved1: 0,
            host_reserved: [0; 5],
            ext_notice: 0,
            host_reserved2: 0,
        }
    }

    /// Moves the clock to `now`: charges the budget for the interval since the last event.
    fn advance(&mut self, now: u64) {
        let dt = now - self.now;
        // Also at dt == 0: an empty bucket being drained latches at once.
        let was_latched = self.budget.latched();
        self.budget
            .advance(&self.budget_rates, dt, self.charge_units);
        if was_latched {
            self.stats.budget_latched_ns = self.stats.budget_latched_ns.saturating_add(dt);
        } else if self.budget.latched() {
            self.stats.budget_latches += 1;
        }
        if dt > 0 {
            let charged_ns = (dt as u128) * (self.charged as u128);
            self.stats.boosted_ns_total = self
                .stats
                .boosted_ns_total
                .saturating_add(u64::try_from(charged_ns).unwrap_or(u64::MAX));
        }
        self.locks.advance(dt, self.limits.lock_repay_from_ns);
        self.now = now;
    }

    /// Updates one vCPU's inputs from an event about it (no decision yet).
    fn apply(&mut self, i: usize, now: u64, event: &Event) {
        let limits = &self.limits;
        let v = &mut self.vcpus[i];
        match *event {
            Event::GuestUpdate {
                ref guest,
                consistent,
                ..
            } => {
                if consistent {
                    v.last_consistent = Some(now);
                } else if v
                    .last_consistent
                    .is_some_and(|t| now.saturating_sub(t) <= limits.inconsistent_grace_ns)
                {
                    // Mid-update, most likely: nothing new; keep the last view.
                    return;
                }
                let view = GuestView::from_read(guest, consistent);
                if view.shows_rt_work() || view.ran_rt_since(&v.guest) {
                    v.last_rt = Some(now);
                    self.last_rt = Some(now);
                }
                v.stats.clamped_inputs += u64::from(view.clamped);
                self.stats.clamped_inputs_total += u64::from(view.clamped);
                if let Some(p) = v.proactive {
                    // The guest speaking for itself ends a proactive boost: it either has a
                    // reason of its own now, or it has run since and has nothing urgent.
                    if view.speaks()
                        && (p.seq != Some(view.seq) || best_guest(limits, &view, true).is_some())
                    {
                        v.proactive = None;
                    }
                }
                let old = v.guest;
                v.guest = view;
                self.lock_wait_changed(i, &old, now);
                let v = &mut self.vcpus[i];
                // A guest gone idle after RT work is about to halt, which
                // would start a halt boost: keep the boost across instead of
                // an unboost and a boost microseconds apart. A vCPU that
                // stays on-CPU idle (idle=poll) still meets max_boost_ns.
                let limits = &self.limits;
                if v.guest.speaks() && v.guest.idle && halt_boost_due(limits, v, now) {
                    self.stats.proactive_boosts_total += 1;
                    start_proactive(limits, v, now, Reason::ProactiveHalt);
                }
            }
            Event::Running { .. } => {
                v.status = RunStatus::Running;
                self.idle[i].running(now);
                if let Some(e) = v.lock_ext.as_mut().filter(|e| !e.ran) {
                    e.ran = true;
                    self.locks.avoided += 1;
                }
            }
            Event::Preempted { rivals, .. } => {
                v.rivals = rivals;
                v.status = RunStatus::Preempted;
                v.stats.preemptions += 1;
                // Only a wait naming this vCPU: see lock_wait_changed for unknown holders.
                if self.lock_waited_on(i as u32) && self.try_extend(i, now) {
                    self.locks.at_preemption += 1;
                }
            }
            Event::Blocked { rivals, .. } => {
                v.rivals = rivals;
                // A holder that halts needs no CPU: its extension is over.
                v.lock_ext = None;
                v.status = RunStatus::Halted;
                self.idle[i].blocked(now);
                if halt_boost_due(limits, v, now) {
                    self.stats.proactive_boosts_total += 1;
                    start_proactive(limits, v, now, Reason::ProactiveHalt);
                }
            }
            Event::Woken {
                cpu_idle, rivals, ..
            } => {
                v.rivals = rivals;
                self.idle[i].woken(now);
                if v.status != RunStatus::Running {
                    v.status = RunStatus::Preempted;
                }
                let vm_rt = recent(limits, self.last_rt, now);
                if limits.proactive_wake && !cpu_idle && speculation_allowed(limits, v, vm_rt) {
                    self.stats.proactive_boosts_total += 1;
                    start_proactive(limits, v, now, Reason::ProactiveWake);
                }
            }
            Event::InterruptTargeted { .. } => {
                // A running vCPU takes the interrupt at once, and a halted one is woken by
                // it (its `Woken` decides, idle CPUs included): only one waiting for a CPU
                // gains from a boost. Under KVM most interrupts are the guest's own timers,
                // injected in the running vCPU thread itself.
                if limits.proactive_irq
                    && matches!(v.status, RunStatus::Preempted | RunStatus::Unknown)
                    && speculation_allowed(limits, v, recent(limits, self.last_rt, now))
                {
                    self.stats.proactive_boosts_total += 1;
                    start_proactive(limits, v, now, Reason::ProactiveIrq);
                }
            }
            Event::KvmExit { reason, .. } => {
                if reason == ExitReason::Hlt && halt_boost_due(limits, v, now) {
                    self.stats.proactive_boosts_total += 1;
                    start_proactive(limits, v, now, Reason::ProactiveHalt);
                }
            }
            Event::KvmHaltEnded {
                halt_ns, polled, ..
            } => self.idle[i].kvm_halt(now, halt_ns, polled),
            Event::Tick | Event::OverloadHint { .. } => {}
        }
    }
}

/// The VM's boost budget: `boost_share_permille` of its vCPU time over `fairness_window_ns`.
fn budget_params(limits: &VmLimits, nr_vcpus: u32) -> BudgetParams {
    BudgetParams::share(
        limits.boost_share_permille,
        nr_vcpus,
        limits.fairness_window_ns,
    )
    .resuming_at(limits.budget_resume_permille)
}

/// One vCPU's critical-section budget: `cs_budget_ns` per `cs_window_ns`.
fn cs_params(limits: &VmLimits) -> BudgetParams {
    BudgetParams::window(limits.cs_budget_ns, 1, limits.cs_window_ns)
}

/// Boosted, non-halted time of the running charge interval, up to `now`.
fn charged_ns(v: &Vcpu, now: u64) -> u64 {
    since_ns(v.charged_since, now)
}

/// Time since `since` up to `now`, 0 if `None`.
fn since_ns(since: Option<u64>, now: u64) -> u64 {
    since.map_or(0, |s| now.saturating_sub(s))
}

/// Brings a vCPU's burst up to `now`: boosted time on a CPU adds, boosted time waiting for
/// one (behind a higher or equal RT priority) neither adds nor drains, anything else drains.
/// Halted time is not burst: a halted vCPU uses no CPU whatever its policy. A demotion
/// ends when the burst has drained to zero through time that was not held back.
fn account_burst(v: &mut Vcpu, now: u64) {
    let dt = now.saturating_sub(v.burst_since);
    let halted = v.status == RunStatus::Halted;
    if v.boost_start.is_some() && v.status.on_cpu() {
        v.burst_ns = v.burst_ns.saturating_add(dt);
    } else if v.boost_start.is_some() && !halted {
        // Boosted and waiting for a CPU: it takes nothing, and repays nothing either.
    } else {
        v.burst_ns = v.burst_ns.saturating_sub(dt);
        if v.burst_ns == 0 && dt > 0 && (halted || !v.target.throttled) {
            v.demoted = false;
        }
    }
    v.burst_since = v.burst_since.max(now);
}
