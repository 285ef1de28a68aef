//! The plan a run prints before it starts: what it crosses with what, how
//! many phases, and how long it should take.

use std::fmt::Display;
use std::path::Path;

use crate::progress::human;

/// `items` joined by commas, as the plan lists a run's loads, cases or modes.
pub fn listed<T: Display>(items: impl IntoIterator<Item = T>) -> String {
    items
        .into_iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Prints the plan: `what` the run crosses, its `phases` and `nominal`
/// seconds of measurement, the `expected` wall time with `overheads`, and
/// the folder `out` the results go to.
pub fn announce(
    what: &str,
    phases: usize,
    nominal: f64,
    expected: f64,
    overheads: &str,
    out: &Path,
) {
    eprintln!(
        "pvsched-bench: {what}: {phases} phases, {} of measurement (about {} with {overheads}); \
         results in {}",
        human(nominal),
        human(expected),
        out.display()
    );
}
