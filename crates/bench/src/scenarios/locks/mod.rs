//! The lock-holder scenario (`--scenario locks`): two guests (2 vCPUs each
//! by default) on the host's CPUs, both running a lock-heavy guest workload
//! at once (`overcommitted`: more vCPUs than CPUs, so a lock holder's vCPU
//! gets preempted on the host while the other vCPU of its guest waits for
//! the lock), or the first alone (`alone`); per mode (`vanilla`, pvschedd
//! without and with lock-holder handling) the throughput of each guest, the
//! lock contentions and holder preemptions the guests counted, pvschedd's
//! lock counters, and each guest's CPU time over the window. Modes are
//! interleaved per repeat, their order rotated.
//!
//! The targets (issue 14), reported against, never asserted: in the
//! overcommitted case (two 2-vCPU VMs on the host's CPUs, both running the
//! lock-heavy workload), the summed throughput with lock-holder handling
//! (`pvsched-lock`) >= 1.2x `vanilla`; the share of holder preemptions
//! avoided, counted by the guests over the whole run, >= 85 %; each VM's
//! CPU time over a measurement within 5 % of an equal split.
//!
//! `model`: what one measurement keeps (raw.json); `commands`: what runs in
//! the guests; `settings`: its settings and plan; `run`, `session`: the
//! run; `report`, `analysis`, `markdown`: the report, from the model;
//! `render`: the files.

pub mod analysis;
pub mod commands;
pub mod markdown;
pub mod model;
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
pub use model::{LockCase, LockMode, Workload};
pub use render::rerender;
pub use run::run;
pub use settings::LockSettings;
