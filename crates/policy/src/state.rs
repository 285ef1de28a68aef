//! Per-VM state and the decision procedure.

use pvsched_abi as abi;

use crate::decision::{Decision, Decisions, Reason, SchedParams, Target};
use crate::event::{Event, EventKind, ExitReason, Rivals};
use crate::fairness::{Budget, BudgetParams};
use crate::guest::{GuestPolicy, GuestView, LockHolder};
use crate::idle::IdleMeter;
use crate::limits::{HostPolicy, LimitsError, VmLimits, MAX_VCPUS};
use crate::locks::{self, Extension, LockLedger};

/// What the host last saw a vCPU thread do (host-half `status`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RunStatus {
    /// No scheduler event seen yet.
    #[default]
    Unknown,
    /// Switched in.
    Running,
    /// Runnable but not running (preempted, or woken and not yet switched in).
    Preempted,
    /// Blocked: the guest halted.
    Halted,
}

impl RunStatus {
    /// Whether the thread may be on a CPU: switched in, or no event seen yet (assumed
    /// running, so an unknown vCPU is charged rather than free).
    pub const fn on_cpu(self) -> bool {
        matches!(self, RunStatus::Running | RunStatus::Unknown)
    }

    /// `PVSCHED_HS_*`.
    pub const fn abi(self) -> u32 {
        match self {
            RunStatus::Unknown => abi::HS_UNKNOWN,
            RunStatus::Running => abi::HS_RUNNING,
            RunStatus::Preempted => abi::HS_PREEMPTED,
            RunStatus::Halted => abi::HS_HALTED,
        }
    }
}

/// Counters of one vCPU, as of the last event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuStats {
    pub status: RunStatus,
    /// Transitions from unboosted to boosted.
    pub boosts: u64,
    /// Throttles applied.
    pub throttles: u64,
    /// Times seen preempted while runnable.
    pub preemptions: u64,
    /// Proactive boosts started (or extended).
    pub proactive_boosts: u64,
    /// Decisions emitted.
    pub decisions: u64,
    /// Guest-half fields clamped or ignored.
    pub clamped_inputs: u64,
    /// Time boosted and not halted (the time charged to the VM's boost budget), ns.
    pub boosted_ns: u64,
    /// Of that, time boosted for a critical section (charged to this vCPU's critical-section
    /// budget too), ns.
    pub cs_boosted_ns: u64,
    /// Critical-section budget left, ns (rounded down; 0 while latched).
    pub cs_budget_ns: u64,
    /// Critical-section time to earn back before the latch clears, ns (rounded up; 0 when
    /// not latched).
    pub cs_debt_ns: u64,
    /// Critical-section boosts are refused: the budget ran dry and is not repaid yet.
    pub cs_latched: bool,
    /// Times a wanted boost was refused (or ended) for want of budget.
    pub over_budget: u64,
    /// `boosted_ns` split by the reason of the boost in force, by [`Reason::index`]
    /// (where the boost budget goes).
    pub boosted_ns_by_reason: [u64; Reason::COUNT],
    /// Of `boosted_ns`, the time demoted (charged `demoted_charge` times), ns.
    pub demoted_ns: u64,
}

/// Counters of one VM, as of the last event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmStats {
    pub nr_vcpus: u32,
    /// vCPUs currently charged to the budget (boosted and not halted).
    pub boosted_vcpus: u32,
    pub boosts_total: u64,
    pub throttles_total: u64,
    pub proactive_boosts_total: u64,
    pub decisions_total: u64,
    /// Guest-half fields clamped or ignored, all vCPUs.
    pub clamped_inputs_total: u64,
    /// Events naming a vCPU index the VM does not have (ignored).
    pub out_of_range_events: u64,
    /// Events whose `now` was earlier than a previous one (handled at the previous `now`).
    pub time_regressions: u64,
    /// Boosted, non-halted vCPU time, ns, all vCPUs.
    pub boosted_ns_total: u64,
    /// Boost budget to earn back before its latch clears, ns (rounded up; 0 when not latched).
    pub debt_ns: u64,
    /// Boost budget left, ns (rounded down; 0 while latched).
    pub budget_ns: u64,
    /// The boost budget is latched: no vCPU of the VM is boosted until `debt_ns` is repaid.
    pub in_debt: bool,
    /// Time boosted for a critical section, ns, all vCPUs.
    pub cs_boosted_ns_total: u64,
    /// Critical-section budget left, ns, summed over the vCPUs.
    pub cs_budget_ns: u64,
    /// Critical-section debt, ns, summed over the vCPUs.
    pub cs_debt_ns: u64,
    /// vCPUs whose critical-section budget is latched.
    pub cs_latched_vcpus: u32,
    /// Wanted boosts refused (or ended) for want of budget, all vCPUs.
    pub over_budget_total: u64,
    /// `boosted_ns_total` split by the reason of the boost in force, by [`Reason::index`].
    pub boosted_ns_by_reason: [u64; Reason::COUNT],
    /// Of `boosted_ns_total`, the time of demoted vCPUs, ns, all vCPUs.
    pub demoted_ns_total: u64,
    /// Times the boost budget latched, and the time it stayed latched, ns (up to the last
    /// event).
    pub budget_latches: u64,
    pub budget_latched_ns: u64,
    /// Lock contentions the guest counted (its counters as last read, summed).
    pub lock_contentions: u64,
    /// Of those, the ones whose holder's vCPU it saw preempted (guest counters).
    pub lock_holder_preempted: u64,
    /// Lock-holder extensions granted, refused (lock debt at its cap), and cut short by the
    /// vCPU running again (a preemption avoided).
    pub lock_extensions: u64,
    /// Of the extensions, those granted at the preemption (a wait named the vCPU already).
    pub lock_extensions_at_preemption: u64,
    pub lock_extensions_refused: u64,
    pub lock_preemptions_avoided: u64,
    /// Extension time on a CPU, ns; of it repaid, ns; not repaid yet, ns.
    pub lock_extended_ns: u64,
    pub lock_repaid_ns: u64,
    pub lock_debt_ns: u64,
    pub overloaded: bool,
    /// Latest `now` seen.
    pub now: u64,
    /// Events handled, by [`EventKind::index`].
    pub events: [u64; EventKind::COUNT],
}

impl VmStats {
    /// Events of one kind handled so far.
    pub fn events_of(&self, kind: EventKind) -> u64 {
        self.events[kind.index()]
    }
}

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
    pub fn reads_waiters_on(&self, event: &Event) -> bool {
        self.limits.honor_lock_holders && matches!(event, Event::Preempted { .. })
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

    /// Counters of `vcpu` as of the last event.
    pub fn vcpu_stats(&self, vcpu: u32) -> Option<VcpuStats> {
        let v = self.vcpus.get(vcpu as usize)?;
        let mut s = v.stats;
        s.status = v.status;
        s.boosted_ns = s.boosted_ns.saturating_add(charged_ns(v, self.now));
        s.cs_boosted_ns = s
            .cs_boosted_ns
            .saturating_add(since_ns(v.cs_charged_since, self.now));
        if let Some((kind, since)) = v.charged_kind {
            s.boosted_ns_by_reason[kind] =
                s.boosted_ns_by_reason[kind].saturating_add(self.now.saturating_sub(since));
        }
        s.demoted_ns = s
            .demoted_ns
            .saturating_add(since_ns(v.demoted_since, self.now));
        let p = self.cs_params();
        let cs = v.cs_at_time(&p, self.now);
        s.cs_budget_ns = cs.remaining_ns(&p);
        s.cs_debt_ns = cs.debt_ns(&p);
        s.cs_latched = cs.latched();
        Some(s)
    }

    /// Counters of the VM as of the last event.
    pub fn vm_stats(&self) -> VmStats {
        let mut s = self.stats;
        s.boosted_vcpus = self.charged;
        let p = self.budget_params();
        s.debt_ns = self.budget.debt_ns(&p);
        s.budget_ns = self.budget.remaining_ns(&p);
        s.in_debt = self.budget.latched();
        for i in 0..self.nr_vcpus() {
            if let Some(v) = self.vcpu_stats(i) {
                s.cs_boosted_ns_total = s.cs_boosted_ns_total.saturating_add(v.cs_boosted_ns);
                s.cs_budget_ns = s.cs_budget_ns.saturating_add(v.cs_budget_ns);
                s.cs_debt_ns = s.cs_debt_ns.saturating_add(v.cs_debt_ns);
                s.cs_latched_vcpus += u32::from(v.cs_latched);
                for (total, ns) in s
                    .boosted_ns_by_reason
                    .iter_mut()
                    .zip(v.boosted_ns_by_reason)
                {
                    *total = total.saturating_add(ns);
                }
                s.demoted_ns_total = s.demoted_ns_total.saturating_add(v.demoted_ns);
            }
        }
        for v in &self.vcpus {
            s.lock_contentions = s.lock_contentions.saturating_add(v.guest.lock_contended);
            s.lock_holder_preempted = s
                .lock_holder_preempted
                .saturating_add(v.guest.lock_preempted);
        }
        s.lock_extensions = self.locks.extensions;
        s.lock_extensions_at_preemption = self.locks.at_preemption;
        s.lock_extensions_refused = self.locks.refused;
        s.lock_preemptions_avoided = self.locks.avoided;
        s.lock_extended_ns = self.locks.extended_ns();
        s.lock_repaid_ns = self.locks.repaid_ns();
        s.lock_debt_ns = self.locks.debt_ns();
        s.overloaded = self.overloaded;
        s.now = self.now;
        s
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
            host_reserved: [0; 6],
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
                if view.shows_rt_work() {
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

    /// The lock wait vCPU `i`'s view publishes, as the policy counts it: only from a guest
    /// that speaks, and naming a vCPU the VM has other than `i` itself.
    fn lock_wait_of(&self, i: usize, view: &GuestView) -> LockHolder {
        match view.lock_holder {
            _ if !view.speaks() => LockHolder::None,
            LockHolder::Vcpu(h) if h as usize >= self.vcpus.len() || h as usize == i => {
                LockHolder::None
            }
            w => w,
        }
    }

    /// Whether another vCPU's lock wait names vCPU `h`: as the holder, or with the holder
    /// unknown.
    fn wanted_by_waiters(&self, h: usize) -> bool {
        let Some(v) = self.vcpus.get(h) else {
            return false;
        };
        let own_any = u32::from(self.lock_wait_of(h, &v.guest) == LockHolder::Any);
        self.lock_named.get(h).is_some_and(|&n| n > 0) || self.lock_any > own_any
    }

    /// vCPU `i`'s view went from `old` to its current one: recount who is waited on, end
    /// extensions no wait names any more (at this event's evaluation), and extend the
    /// preempted holders the new wait names.
    fn lock_wait_changed(&mut self, i: usize, old: &GuestView, now: u64) {
        let before = self.lock_wait_of(i, old);
        let view = &self.vcpus[i].guest;
        self.lock_guest |= view.lock_holder != LockHolder::None || view.lock_contended > 0;
        let after = self.lock_wait_of(i, view);
        if before != after {
            match before {
                LockHolder::Vcpu(h) => {
                    self.lock_named[h as usize] -= 1;
                    self.extra_eval.push(h as usize);
                }
                LockHolder::Any => {
                    self.lock_any -= 1;
                    for (h, v) in self.vcpus.iter().enumerate() {
                        if v.lock_ext.is_some() {
                            self.extra_eval.push(h);
                        }
                    }
                }
                LockHolder::None => {}
            }
            match after {
                LockHolder::Vcpu(h) => self.lock_named[h as usize] += 1,
                LockHolder::Any => self.lock_any += 1,
                LockHolder::None => {}
            }
        }
        match after {
            // Also for a wait read again: its holder may have been preempted since.
            LockHolder::Vcpu(h) => {
                self.try_extend(h as usize, now);
            }
            // A new wait with the holder unknown extends the siblings preempted now, once:
            // the guest publishes one only when it saw a sibling preempted, and in an
            // overcommitted VM some sibling nearly always is (the simulator: the holder's
            // vCPU was among them in 4.5 % of such waits), so later preemptions are not
            // extended for it.
            LockHolder::Any if before != after => {
                for h in (0..self.vcpus.len()).filter(|&h| h != i) {
                    self.try_extend(h, now);
                }
            }
            LockHolder::Any | LockHolder::None => {}
        }
    }

    /// Extends vCPU `h` if it is preempted, waited on, not extended already, and the VM's
    /// lock debt is below its cap (else the refusal is counted). Returns whether it did.
    fn try_extend(&mut self, h: usize, now: u64) -> bool {
        if !self.limits.honor_lock_holders || !self.wanted_by_waiters(h) {
            return false;
        }
        // A running holder a wait names is extended too with `lock_extend_running`: its
        // boost keeps the host from preempting it (eCS's extension) instead of taking a
        // CPU back after the preemption.
        let running_ok = self.limits.lock_extend_running && self.lock_waited_on(h as u32);
        let vm_rt = recent(&self.limits, self.last_rt, now);
        let v = &mut self.vcpus[h];
        // With nothing from outside the VM on the host, an extension only preempts
        // another of the VM's own threads (measured: the lone lock VM at 0.85x of vanilla
        // with extensions, 0.98x without).
        if !rivals_allow_extension(&self.limits, v, vm_rt) {
            return false;
        }
        let preempted = v.status == RunStatus::Preempted;
        let running = v.status == RunStatus::Running && running_ok;
        if !(preempted || running) || v.lock_ext.is_some() {
            return false;
        }
        if self.locks.debt_ns() >= self.limits.lock_debt_max_ns {
            self.locks.refused += 1;
            return false;
        }
        v.lock_ext = Some(Extension {
            until: now.saturating_add(self.limits.lock_extension_ns),
            // A running holder's extension cuts no preemption short.
            ran: running,
        });
        self.locks.extensions += 1;
        self.extra_eval.push(h);
        true
    }

    /// Recomputes the target of vCPU `i` at `now`; pushes a decision if it changed.
    fn evaluate(&mut self, i: usize, now: u64, out: &mut Decisions) {
        let waited_on = self.wanted_by_waiters(i);
        let limits = &self.limits;
        let in_debt = self.budget.latched();
        let lock_debt = self.locks.in_debt();
        let cs = self.cs_rates;
        let vm_rt = recent(limits, self.last_rt, now);
        let v = &mut self.vcpus[i];

        if v.proactive.is_some_and(|p| now >= p.until) {
            v.proactive = None;
        }
        if v.lock_ext.is_some_and(|e| now >= e.until || !waited_on) {
            v.lock_ext = None;
        }
        if v.throttled_until.is_some_and(|t| now >= t) {
            v.throttled_until = None;
        }

        account_burst(v, now);
        if v.boost_start.is_some() && v.burst_ns >= limits.demote_after_ns {
            v.demoted = true;
        }
        v.advance_cs(&cs, now);

        let mut boost = if v.throttled_until.is_some() {
            None
        } else {
            best_boost(limits, v, vm_rt, true)
        };
        // Budgets: a latched boost budget refuses every boost; a latched critical-section
        // budget refuses the critical section, and the next-strongest reason may stand.
        let mut over_budget = false;
        if let Some((_, reason)) = &boost {
            if in_debt {
                boost = None;
                over_budget = true;
            } else if matches!(reason, Reason::CriticalSection(_)) && v.cs.latched() {
                boost = best_boost(limits, v, vm_rt, false);
                over_budget = boost.is_none();
            }
        }
        if boost.is_some() && v.boost_start.is_some() && v.burst_ns >= limits.max_boost_ns {
            v.throttled_until = Some(now.saturating_add(limits.throttle_ns));
            v.stats.throttles += 1;
            self.stats.throttles_total += 1;
            // The throttle repays the burst.
            v.burst_ns = 0;
            boost = None;
        }
        let throttled = v.throttled_until.is_some() || over_budget;
        // A long burst yields to every fresh boost: bottom of the RT range, until repaid.
        if let Some((params, _)) = boost.as_mut() {
            if v.demoted {
                params.rt_priority = 1;
            }
        }

        // The fair-class nice the vCPU would have; lock debt is repaid by running above it.
        let mut base_nice = None;
        let (params, reason) = match boost {
            Some(c) => c,
            None => {
                let (mut params, mut reason) = cfs_params(limits, &v.guest);
                base_nice = Some(params.nice);
                if in_debt && limits.latch_nice > params.nice {
                    params.nice = limits.latch_nice;
                    reason = Reason::Debt;
                } else if lock_debt && limits.debt_nice > params.nice {
                    params.nice = limits.debt_nice;
                    reason = Reason::LockDebt;
                }
                if v.throttled_until.is_some() {
                    reason = Reason::Throttled;
                } else if over_budget {
                    reason = Reason::OverBudget;
                }
                (params, reason)
            }
        };

        let is_rt = params.is_rt();
        match (is_rt, v.boost_start) {
            (true, None) => {
                v.boost_start = Some(now);
                v.stats.boosts += 1;
                self.stats.boosts_total += 1;
            }
            (false, Some(_)) => v.boost_start = None,
            _ => {}
        }

        // The budget pays for CPU time taken at RT: a boosted vCPU waiting for a CPU (behind
        // the host's RT tasks or another VM's boost at the same priority) is not charged, or
        // a well-behaved guest stuck behind a rogue would spend its budget waiting.
        let charge = is_rt && v.status.on_cpu();
        match (charge, v.charged_since) {
            (true, None) => {
                v.charged_since = Some(now);
                self.charged += 1;
            }
            (false, Some(since)) => {
                v.stats.boosted_ns = v.stats.boosted_ns.saturating_add(now - since);
                v.charged_since = None;
                self.charged -= 1;
            }
            _ => {}
        }
        let kind = charge.then(|| reason.index());
        if v.charged_kind.map(|(k, _)| k) != kind {
            if let Some((k, since)) = v.charged_kind {
                v.stats.boosted_ns_by_reason[k] =
                    v.stats.boosted_ns_by_reason[k].saturating_add(now - since);
            }
            v.charged_kind = kind.map(|k| (k, now));
        }
        // A demoted vCPU's boosted time costs `demoted_charge` times as much budget.
        let weight = match (charge, v.demoted) {
            (false, _) => 0,
            (true, false) => 1,
            (true, true) => limits.demoted_charge,
        };
        self.charge_units = self.charge_units - v.charge_weight + weight;
        v.charge_weight = weight;
        match (charge && v.demoted, v.demoted_since) {
            (true, None) => v.demoted_since = Some(now),
            (false, Some(since)) => {
                v.stats.demoted_ns = v.stats.demoted_ns.saturating_add(now - since);
                v.demoted_since = None;
            }
            _ => {}
        }
        // Lock debt: an extension on a CPU adds to it, an unboosted vCPU on a CPU above its
        // nice while the VM owes repays it (crate::locks).
        let lock_charging = charge && reason == Reason::LockHolder;
        let repay = match base_nice {
            Some(base) if lock_debt && v.status.on_cpu() => {
                locks::repay_permille(base, params.nice)
            }
            _ => 0,
        };
        if lock_charging != v.lock_charging || repay != v.repay_permille {
            let charging =
                self.locks.charging() - u32::from(v.lock_charging) + u32::from(lock_charging);
            let repaying = self.locks.repaying_permille() - v.repay_permille + repay;
            self.locks.set_rates(charging, repaying);
            v.lock_charging = lock_charging;
            v.repay_permille = repay;
        }
        // The critical-section budget is charged by the reason in force, which may change
        // under the same params (a guest RT task taking over from a critical section).
        let cs_charge = charge && matches!(reason, Reason::CriticalSection(_));
        match (cs_charge, v.cs_charged_since) {
            (true, None) => v.cs_charged_since = Some(now),
            (false, Some(since)) => {
                v.stats.cs_boosted_ns = v.stats.cs_boosted_ns.saturating_add(now - since);
                v.cs_charged_since = None;
            }
            _ => {}
        }

        if reason == Reason::OverBudget && v.target.reason != Reason::OverBudget {
            v.stats.over_budget += 1;
            self.stats.over_budget_total += 1;
        }
        let changed = params != v.target.params
            || !reason.same_kind(&v.target.reason)
            || (params.is_rt() && vm_rt != v.target.rt_work);
        // The latch may raise an unboosted vCPU's nice to latch_nice, lock debt to debt_nice.
        let in_debt = in_debt || lock_debt;
        v.target.reason = reason;
        v.target.throttled = throttled;
        v.target.in_debt = in_debt;
        v.target.rt_work = vm_rt;
        if changed {
            v.target.params = params;
            v.target.since = now;
            v.stats.decisions += 1;
            self.stats.decisions_total += 1;
            out.push(Decision {
                vcpu: i as u32,
                params,
                reason,
                throttled,
                in_debt,
                rt_work: vm_rt,
            });
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

/// Whether a lock-holder extension may start: with `boost_only_against_rivals`, only while
/// something outside the VM competes (another served VM counts: an extension is repaid)
/// or the VM ran guest RT work recently (`vm_rt`). Reordering the VM's own threads is what
/// that work needs: its vCPU ahead of its siblings, and the siblings that take its timers
/// and send it IPIs boosted too. A VM without it only loses to the stacking its boosts
/// cause.
fn rivals_allow_extension(limits: &VmLimits, v: &Vcpu, vm_rt: bool) -> bool {
    !limits.boost_only_against_rivals || v.rivals > Rivals::None || vm_rt
}

/// Whether a speculative boost (a critical section, a proactive reason) may start: as for
/// an extension, except that other served VMs are rivals only with `peer_vms_are_rivals`
/// (they get the same boosts: see that limit), and with
/// `speculative_boosts_need_rt_work` only for a VM that ran guest RT work recently.
fn speculation_allowed(limits: &VmLimits, v: &Vcpu, vm_rt: bool) -> bool {
    let least = if limits.peer_vms_are_rivals {
        Rivals::PeerVms
    } else {
        Rivals::Host
    };
    let rivals_ok = !limits.boost_only_against_rivals || v.rivals >= least || vm_rt;
    rivals_ok && (vm_rt || !limits.speculative_boosts_need_rt_work)
}

/// Whether guest RT work last seen at `last_rt` (see [`GuestView::shows_rt_work`]) is
/// within `halt_boost_ns` of `now`.
fn recent(limits: &VmLimits, last_rt: Option<u64>, now: u64) -> bool {
    last_rt.is_some_and(|t| now.saturating_sub(t) <= limits.halt_boost_ns)
}

/// Whether a halting vCPU gets a halt boost: switched on and guest RT work seen on it
/// recently (which also spares it `boost_only_against_rivals`).
fn halt_boost_due(limits: &VmLimits, v: &Vcpu, now: u64) -> bool {
    limits.proactive_halt && recent(limits, v.last_rt, now)
}

fn start_proactive(limits: &VmLimits, v: &mut Vcpu, now: u64, reason: Reason) {
    v.stats.proactive_boosts += 1;
    let length = if reason == Reason::ProactiveHalt {
        limits.halt_boost_ns
    } else {
        limits.proactive_boost_ns
    };
    let until = now.saturating_add(length);
    let seq = v.guest.speaks().then_some(v.guest.seq);
    let (mut class, mut priority) = (limits.boost_policy, limits.boost_priority);
    let t = v.target.params;
    if reason == Reason::ProactiveHalt && t.is_rt() && t.rt_priority > priority {
        (class, priority) = (t.policy, t.rt_priority);
    }
    v.proactive = Some(match v.proactive {
        // Extend a running boost; keep the guest seq it started from, and the
        // stronger of the two classes.
        Some(p) => Proactive {
            reason,
            until: until.max(p.until),
            seq: p.seq,
            class: if p.priority >= priority {
                p.class
            } else {
                class
            },
            priority: p.priority.max(priority),
        },
        None => Proactive {
            reason,
            until,
            seq,
            class,
            priority,
        },
    });
}

/// RT params for a boost of `wanted` class at `prio`, within the limits; `None` when no RT
/// class is allowed.
fn rt_params(limits: &VmLimits, wanted: HostPolicy, prio: u8) -> Option<SchedParams> {
    let policy = limits.rt_policy(wanted)?;
    Some(SchedParams {
        policy,
        rt_priority: limits.cap_prio(prio),
        nice: limits.clamp_nice(0),
    })
}

/// Offers a candidate: replaces `best` only with a strictly higher priority, so among equal
/// priorities the earlier-offered (stronger) reason wins.
fn offer(best: &mut Option<Candidate>, cand: Option<SchedParams>, reason: Reason) {
    if let Some(params) = cand {
        let stronger = match best {
            Some((b, _)) => params.rt_priority > b.rt_priority,
            None => true,
        };
        if stronger {
            *best = Some((params, reason));
        }
    }
}

fn host_rt(policy: GuestPolicy) -> HostPolicy {
    match policy {
        GuestPolicy::Rr => HostPolicy::Rr,
        _ => HostPolicy::Fifo,
    }
}

/// The strongest boost the guest itself asks for, if any. Order of strength on equal
/// priority: critical section, deadline task, RT task, pending hint, boost request.
fn best_guest(limits: &VmLimits, g: &GuestView, allow_cs: bool) -> Option<Candidate> {
    if !g.speaks() {
        return None;
    }
    let mut best = None;
    let boost = || rt_params(limits, limits.boost_policy, limits.boost_priority);
    if allow_cs && limits.honor_critical_sections && g.cs_flags != 0 {
        offer(&mut best, boost(), Reason::CriticalSection(g.cs_flags));
    }
    if !g.idle && limits.honor_guest_rt {
        if g.policy == GuestPolicy::Deadline {
            let p = rt_params(limits, HostPolicy::Fifo, limits.deadline_priority);
            offer(&mut best, p, Reason::GuestDeadline);
        } else if g.policy.is_rt() {
            let p = rt_params(limits, host_rt(g.policy), g.rt_priority);
            let reason = Reason::GuestRt {
                policy: g.policy.abi(),
                priority: g.rt_priority,
            };
            offer(&mut best, p, reason);
        }
    }
    if limits.honor_pending_hint {
        if let Some(h) = g.pending {
            let p = if h.policy == GuestPolicy::Deadline {
                rt_params(limits, HostPolicy::Fifo, limits.deadline_priority)
            } else {
                rt_params(limits, host_rt(h.policy), h.rt_priority)
            };
            offer(&mut best, p, Reason::PendingHint);
        }
    }
    if !g.idle && limits.honor_boost_request && g.boost_req {
        offer(&mut best, boost(), Reason::BoostRequest);
    }
    best
}

/// The strongest boost for a vCPU: the guest's reasons, then a running proactive boost
/// (if its switch is still on). `cs_ok` false leaves critical sections out (their budget is
/// spent).
fn best_boost(limits: &VmLimits, v: &Vcpu, vm_rt: bool, cs_ok: bool) -> Option<Candidate> {
    // A critical section starts a boost only when the vCPU is not running on the host
    // (preempted, waking, or not seen yet): a running vCPU needs no CPU, and its critical
    // sections last microseconds, shorter than any reaction. Nor, in a VM without recent
    // RT work, while nothing outside the VM competes (`boost_only_against_rivals`). A boost it already has is kept while the
    // flags stay set.
    let kept = matches!(v.target.reason, Reason::CriticalSection(_));
    let allow_cs = cs_ok
        && (kept || (v.status != RunStatus::Running && speculation_allowed(limits, v, vm_rt)));
    let mut best = best_guest(limits, &v.guest, allow_cs);
    if limits.honor_lock_holders && v.lock_ext.is_some() {
        let params = rt_params(limits, limits.boost_policy, limits.boost_priority);
        offer(&mut best, params, Reason::LockHolder);
    }
    if let Some(p) = v.proactive {
        let enabled = match p.reason {
            Reason::ProactiveWake => limits.proactive_wake,
            Reason::ProactiveIrq => limits.proactive_irq,
            Reason::ProactiveHalt => limits.proactive_halt,
            _ => false,
        };
        if enabled {
            let params = rt_params(limits, p.class, p.priority);
            offer(&mut best, params, p.reason);
        }
    }
    best
}

/// Unboosted params: the guest's CFS class and nice, inside the limits.
fn cfs_params(limits: &VmLimits, g: &GuestView) -> (SchedParams, Reason) {
    let plain = SchedParams {
        policy: HostPolicy::Other,
        rt_priority: 0,
        nice: limits.clamp_nice(0),
    };
    if !g.speaks() || g.idle {
        return (plain, Reason::None);
    }
    let params = match g.policy {
        GuestPolicy::Normal => SchedParams {
            nice: limits.clamp_nice(g.nice),
            ..plain
        },
        GuestPolicy::Batch => SchedParams {
            policy: if limits.allowed.batch {
                HostPolicy::Batch
            } else {
                HostPolicy::Other
            },
            nice: limits.clamp_nice(g.nice),
            ..plain
        },
        GuestPolicy::Idle => SchedParams {
            policy: if limits.allowed.idle {
                HostPolicy::Idle
            } else {
                HostPolicy::Other
            },
            nice: limits.nice_max,
            ..plain
        },
        GuestPolicy::Fifo | GuestPolicy::Rr | GuestPolicy::Deadline => plain,
    };
    let reason = if params == plain {
        Reason::None
    } else {
        Reason::GuestNice
    };
    (params, reason)
}
