//! Which mechanism carries the policy's boosts: the RT class through
//! `sched_setattr` (the `rt` backend, every kernel), or pvsched's own
//! sched_ext scheduler (`sched_ext.rs`, kernels with sched_ext), which
//! dispatches boosted vCPUs first and extends a vCPU in a critical section
//! at its slice end. The policy is the same for both (docs/DESIGN.md, "The
//! sched_ext backend").

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

pub mod sched_ext;

pub use sched_ext::{
    LockScan, SchedExt, SchedExtError, SchedExtOptions, ScxAllowance, ScxBoost, ScxExit, ScxTotals,
};

/// `daemon.backend`: which backend to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendChoice {
    /// sched_ext where the kernel has it and the scheduler loads, else rt.
    #[default]
    Auto,
    /// sched_ext or nothing: the daemon does not start without it.
    SchedExt,
    /// The RT class through `sched_setattr`.
    Rt,
}

impl BackendChoice {
    pub const fn name(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::SchedExt => "sched_ext",
            BackendChoice::Rt => "rt",
        }
    }
}

/// Loads the backend `choice` asks for: `Ok(None)` is the rt backend (with
/// why, for `auto`, sched_ext was not taken); an error only for
/// `sched_ext`, which must load.
pub fn choose(
    choice: BackendChoice,
    options: SchedExtOptions,
) -> Result<(Option<SchedExt>, Option<String>), SchedExtError> {
    match choice {
        BackendChoice::Rt => Ok((None, None)),
        BackendChoice::SchedExt => {
            let s = SchedExt::load(options)?;
            info!(
                slice_us = options.slice_ns / 1000,
                extension_us = options.extension_ns / 1000,
                "backend sched_ext: pvsched's scheduler attached"
            );
            Ok((Some(s), None))
        }
        BackendChoice::Auto => match SchedExt::load(options) {
            Ok(s) => {
                info!(
                    slice_us = options.slice_ns / 1000,
                    extension_us = options.extension_ns / 1000,
                    "backend sched_ext (auto): pvsched's scheduler attached"
                );
                Ok((Some(s), None))
            }
            Err(e) => {
                let why = e.to_string();
                if matches!(e, SchedExtError::NoSchedExt) {
                    info!("backend rt (auto): {why}");
                } else {
                    warn!("backend rt (auto): sched_ext did not load: {why}");
                }
                Ok((None, Some(why)))
            }
        },
    }
}

/// What `pvschedctl status` says about the backend.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackendState {
    pub status: pvsched_control::BackendStatus,
}

impl BackendState {
    pub fn new(configured: BackendChoice, scx: bool, note: Option<String>) -> Self {
        Self {
            status: pvsched_control::BackendStatus {
                configured: configured.name().to_string(),
                active: if scx { "sched_ext" } else { "rt" }.to_string(),
                note,
                ..Default::default()
            },
        }
    }

    /// The kernel ended the scheduler for `why`.
    pub fn fell_back(&mut self, why: String) {
        self.status.active = "rt".to_string();
        self.status.note = Some(format!("the kernel ended the sched_ext scheduler: {why}"));
        self.status.fallbacks += 1;
    }

    /// The status with the scheduler's counters as of now (`scx`: it is
    /// loaded), for a status request between two scans.
    pub fn status_now(&self, scx: Option<&SchedExt>) -> pvsched_control::BackendStatus {
        let mut now = self.clone();
        if let Some(scx) = scx {
            now.record(scx.totals());
        }
        now.status
    }

    /// The scheduler's counters as of now.
    pub fn record(&mut self, t: ScxTotals) {
        let s = &mut self.status;
        s.enqueues = t.enqueues;
        s.boost_preempts = t.boost_preempts;
        s.boost_queued = t.boost_queued;
        s.extensions = t.extensions;
        s.extensions_refused = t.ext_refused;
        s.lock_extensions = t.ext_lock;
        s.lock_extensions_at_preemption = t.ext_at_preempt;
        s.holder_preempted_extended = t.holder_preempted_extended;
        s.holder_preempted_unextended = t.holder_preempted_unextended;
        s.holder_preempted_early = t.holder_preempted_early;
        s.extensions_ended_early = t.ext_ended_early;
        s.extension_polls = t.ext_polls;
        s.extension_poll_errors = t.ext_poll_errors;
        s.extension_tails = t.ext_tails;
        s.extension_tails_ended_early = t.ext_tails_ended_early;
        s.slice_ends_uncontended = t.slice_ends_uncontended;
        s.preemptions_checked = t.preempts_checked;
        s.holders_kept_at_dispatch = t.holders_kept_at_dispatch;
        s.holders_resumed = t.holders_resumed;
        s.extension_yields = t.ext_yielded;
        s.yields_unextended = t.yields_unextended;
        s.notices_written = t.notice_writes;
        s.notice_writes_failed = t.notice_write_failed;
        s.vcpus_spread = t.vcpus_spread;
        s.daemon_moved = t.daemon_moved;
        s.boost_moved = t.boost_moved;
        s.kernel_boosts = t.kboosts;
        s.wakeup_preempts = t.wakeup_preempts;
        s.kernel_throttles = t.kthrottles;
        s.fair_pulls = t.fair_pulls;
        s.queued_to_run_boosted =
            pvsched_control::DelaySummary::of_log2_buckets(&t.queued_to_run_boosted);
        s.queued_to_run_other =
            pvsched_control::DelaySummary::of_log2_buckets(&t.queued_to_run_other);
    }
}
