//! The message-passing scenario (`--scenario message-passing`): one guest
//! (2 vCPUs) running message-passing programs whose rate is bound by vCPU
//! wakeups, under each guest idle mode of pvsched.ko (`default`,
//! `haltpoll`, `hinted`, `advisor`), on an idle and on a loaded host.
//! pvschedd serves the guest in every case, so that only the guest's idle
//! path differs.
//!
//! Per (repeat, load) block: pvschedd starts afresh (its idle meters are
//! cumulative), a warm-up runs the workloads in `default` mode, and the
//! advisor's window for the budget is taken from the daemon; then each case,
//! in rotated order: pvsched.ko reloaded with the case's `idle=` mode, the
//! host load started, `pingpong -g 0` and `prodcons` measured, the load
//! stopped.
//!
//! The targets (issue 13, guest idle driver): on the idle host, `hinted`
//! throughput >= 1.3x `default` with the guest polling at most the budget
//! (`--budget-permille`, 5 % of a vCPU by default); on the loaded host,
//! stress-ng's bogo-ops/s with `hinted` >= 95 % of `default`.
//!
//! `model`: what one measurement keeps (raw.json); `readings`: what the
//! guest and pvschedd print, parsed; `run`, `session`, `controls`: the run;
//! `report`, `analysis`, `markdown`: the report, from the model; `render`:
//! the files.

pub mod analysis;
pub mod controls;
pub mod markdown;
pub mod model;
pub mod readings;
pub mod render;
pub mod report;
pub mod run;
pub mod session;
pub mod settings;

#[cfg(test)]
mod report_tests;
#[cfg(test)]
mod run_tests;

pub use markdown::markdown;
pub use model::{IdleCase, Workload};
pub use render::rerender;
pub use run::run;
pub use settings::MsgSettings;
