//! The rogue-guest scenario (`--scenario rogue`): two guests side by side,
//! a well-behaved *neighbour* (the usual guest cyclictest) and a *rogue*
//! (`rtspin` at SCHED_FIFO on every vCPU), a host cyclictest at the same
//! time, pvschedd serving both VMs. The cases (pvsched with the rogue idle,
//! pvsched with it spinning, vanilla with it spinning...) are interleaved
//! per repeat as the standard scenario interleaves its modes.
//!
//! Measured per phase: both cyclictests, the CPU time of each QEMU process
//! over the window (its share of the machine), pvschedd's counters of each
//! VM over the window, the share of the machine others took meanwhile.
//!
//! The targets (security issue "a rogue guest beside a well-behaved VM"):
//! under pvsched, the neighbour's guest p99 and the host's p99 with the
//! rogue spinning stay <= 1.2x the same run's p99 with the rogue idle; the
//! rogue QEMU's share of the machine under pvsched stays <= its share under
//! vanilla (plain CFS) + 10 percentage points.
//!
//! `model`: what one phase keeps (raw.json); `commands`: what the rogue
//! runs; `sampling`: what the host samples over a window; `run`, `session`:
//! the run; `report`, `analysis`, `markdown`: the report, from the model;
//! `render`: the files.

pub mod analysis;
pub mod commands;
pub mod markdown;
pub mod model;
pub mod render;
pub mod report;
pub mod run;
pub mod sampling;
pub mod session;
pub mod settings;

#[cfg(test)]
mod report_tests;
#[cfg(test)]
mod run_tests;

pub use markdown::markdown;
pub use model::Case;
pub use render::rerender;
pub use run::run;
pub use settings::RogueSettings;
