//! pvsched-policy: the decision engine of the host daemon (pvschedd).
//!
//! `(state, event, now) -> decisions`. Pure: no I/O, no clock, no threads, no randomness;
//! the same inputs always give the same outputs, so a test that replays events sees exactly
//! what the daemon would have done. Time is the caller's `now` (ns, host monotonic clock).
//!
//! ```
//! use pvsched_policy::{Decisions, Event, VmLimits, VmState};
//! use pvsched_abi as abi;
//!
//! let mut vm = VmState::new(VmLimits::default(), 2).unwrap();
//! let mut out = Decisions::with_capacity(2);
//! let guest = abi::GuestHalf { flags: abi::GF_ACTIVE, cs_flags: abi::CS_HARDIRQ, ..Default::default() };
//! vm.handle(1_000, &Event::GuestUpdate { vcpu: 0, guest, consistent: true }, &mut out);
//! assert_eq!(out.len(), 1);
//! assert!(out[0].params.is_rt());
//! // Arm one timer for the next instant a Tick could change something: here the instant
//! // the vCPU's critical-section budget (2 ms, earned back at 0.5 ns per ns) runs dry.
//! assert_eq!(vm.next_deadline(), Some(1_000 + 4_000_000));
//! ```
//!
//! # Rules
//!
//! Per vCPU, at every event about it (and for every vCPU at a [`Event::Tick`], after
//! [`VmState::set_limits`], and when the VM's boost budget latches or clears):
//!
//! 1. **Guest reasons** (only from a consistent half with `GF_ACTIVE` set): a critical
//!    section (`cs_flags != 0`), an RT task (1:1 policy and priority), a `SCHED_DEADLINE`
//!    task (FIFO at `deadline_priority`), a valid pending hint naming an RT/deadline task,
//!    an explicit `GF_BOOST_REQ`. With `GF_IDLE` set the task fields and the boost request
//!    describe no task and are ignored. Each is switchable (`honor_*`).
//! 2. **Proactive reasons**: the host woke the vCPU, an interrupt was targeted at it, it
//!    halted (each switchable). They last `proactive_boost_ns`, or until the guest speaks
//!    for itself (a consistent active update that has a reason of its own, or that the
//!    guest wrote after the boost began).
//! 3. **Strongest wins**: the highest RT priority after capping at `max_rt_priority`; on
//!    equal priority, in this order: critical section, guest deadline, guest RT, pending
//!    hint, boost request, proactive. RT classes go through the allowed set (FIFO <-> RR
//!    fallback; neither allowed: no boost).
//! 4. **Throttle**: a vCPU whose boost has lasted `max_boost_ns` without a break is put on
//!    its unboosted params for `throttle_ns` (`Reason::Throttled`), whatever it asks. After
//!    that the rules apply again and a new boost starts a new clock.
//! 5. **Unboosted params**: the guest's CFS class (NORMAL -> Other, BATCH -> Batch if
//!    allowed, IDLE -> Idle if allowed else Other at `nice_max`) with its nice clamped into
//!    `nice_min..=nice_max`; RT/deadline tasks that are not boosted, idle vCPUs and silent
//!    guests get Other at `clamp(0)`. `Reason::GuestNice` when the guest's class or nice
//!    made the params differ from that plain Other.
//! 6. **Budgets** ([`fairness`]): every boosted, non-halted vCPU-ns is charged to the VM's
//!    *boost budget* (`boost_share_permille` of its vCPU time, banked over
//!    `fairness_window_ns`); a boosted, non-halted ns whose reason is a critical section is
//!    charged to that vCPU's *critical-section budget* too (`cs_budget_ns` per
//!    `cs_window_ns`). A budget that runs dry latches until it is earned back (the boost
//!    budget: `budget_resume_permille` of it; a critical-section budget: all of it). While
//!    the boost budget is latched no vCPU is boosted, boosts in force end at once, and
//!    unboosted vCPUs get `nice = max(nice, latch_nice)` (`Reason::Debt` when that raised it);
//!    while a vCPU's critical-section budget is latched its critical sections are ignored
//!    (another reason may still boost it). A wanted boost refused so is `Reason::OverBudget`,
//!    `throttled`.
//!
//! A decision is emitted only when a vCPU's params, or the kind of its reason, change.

pub mod decision;
pub mod event;
pub mod extension;
pub mod fairness;
pub mod guest;
pub mod idle;
pub mod limits;
pub mod locks;
pub mod serving;
pub mod state;

pub use decision::{Decision, Decisions, Reason, SchedParams, Target};
pub use event::{Event, EventKind, ExitReason, Rivals, WakeSource};
pub use extension::{
    extension_burst_ns, ExtensionAllowance, DEFAULT_SCX_EXTENSION_SHARE_PERMILLE,
    DEFAULT_SCX_SCAN_INTERVAL_NS,
};
pub use fairness::{Budget, BudgetParams};
pub use guest::{GuestPolicy, GuestView, LockHolder, PendingHint};
pub use idle::{advise, DurationHistogram, IdleMeter, PollPrice, WakeHint};
pub use limits::{AllowedPolicies, HostPolicy, LimitsError, VmLimits, MAX_CS_WINDOW_NS, MAX_VCPUS};
pub use locks::LockLedger;
pub use serving::{PooledHalts, SlotReads};
pub use state::{KernelGrant, RunStatus, VcpuStats, VmState, VmStats};
