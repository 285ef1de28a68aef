//! pvsched-report: latency statistics and plots shared by the benchmark
//! (`pvsched-bench`, measured) and the simulator (`pvsched-sim`, simulated),
//! so that both count and draw results the same way.
//!
//! - [`stats`] holds [`Histogram`], one bucket per microsecond, filled from
//!   cyclictest's JSON ([`Histogram::from_cyclictest_json`]) or sample by
//!   sample ([`Histogram::record`], [`Histogram::record_ns`]); percentiles,
//!   CCDF and the [`Summary`] a report shows.
//! - [`plot`] draws latency CCDF plots as PNG.
//! - [`error`] holds [`ReportError`].

pub mod error;
pub mod plot;
pub mod stats;

pub use error::{ReportError, Result};
pub use stats::{Histogram, Summary};
