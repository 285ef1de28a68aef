//! pvsched-bench: the end-to-end benchmark, scenarios on one harness. The
//! standard scenario: one QEMU guest (the pvsched module loaded), three
//! host modes interleaved (vanilla, static-rt, pvsched), an idle and a
//! loaded host; guest and host cyclictest at once, an audio-like task, a
//! ping-pong and host throughput; a Markdown table, JSON in the simulator's
//! shape and latency plots. Also the rogue-guest scenario (`rogue`), the
//! message-passing one (`msgpass`: the guest's idle modes under
//! wakeup-bound programs) and the lock-holder one (`locks`: two
//! overcommitted guests contending on kernel locks), each a module of
//! `scenarios` on what `harness` gives them all.
//!
//! See README.md for what is measured and how to read it.

pub mod accel;
pub mod daemon;
pub mod error;
pub mod foreign;
pub mod guest;
pub mod guest_idle;
pub mod harness;
pub mod host;
pub mod interrupts;
pub mod ipi_sources;
pub mod kvm_preemptions;
pub mod platform;
pub mod progress;
pub mod scenarios;

// Shared with the simulator; re-exported so `crate::stats::…` and
// `crate::plot::…` keep their paths.
pub use pvsched_report::{plot, stats};

pub use error::{BenchError, Result};
