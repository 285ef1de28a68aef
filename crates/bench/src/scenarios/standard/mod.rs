//! The standard scenario (BENCHMARKS.md): one guest; vanilla, static-rt
//! and pvsched interleaved on an idle and a loaded host; guest and host
//! cyclictest at once, an audio-like task, a ping-pong and the host's
//! throughput; then the guest module's overhead, and the same policy under
//! KVM, simulated.
//!
//! `model`: what a run keeps (raw.json); `plan`, `run`, `session`: the run;
//! `share`: the CPU each party used over a phase; `modcost`: the guest
//! module overhead phase; `simulated`: the policy under KVM, simulated;
//! `report`, `analysis`, `markdown`: the report, from the model, with
//! `fairness` (eventual fairness) and `host_cost_targets`; `render`:
//! the files.

pub mod analysis;
pub mod fairness;
pub mod host_cost_targets;
pub mod markdown;
pub mod modcost;
pub mod model;
pub mod plan;
pub mod render;
pub mod report;
pub mod run;
pub mod session;
pub mod share;
pub mod simulated;

#[cfg(test)]
mod report_tests;
#[cfg(test)]
mod run_tests;

pub use markdown::markdown;
pub use model::RawFile;
pub use render::rerender;
pub use run::run;
