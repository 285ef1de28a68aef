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
    eprintln!("{}", line(what, phases, nominal, expected, overheads, out));
}

/// The plan's line, as [`announce`] prints it.
fn line(
    what: &str,
    phases: usize,
    nominal: f64,
    expected: f64,
    overheads: &str,
    out: &Path,
) -> String {
    format!(
        "pvsched-bench: {what}: {phases} phases, {} of measurement (about {} with {overheads}); \
         results in {}",
        human(nominal),
        human(expected),
        out.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_line_names_what_is_crossed_the_phases_and_the_time() {
        let what = format!(
            "2 repeats x loads [{}] x intervals [{}]",
            listed(["idle", "loaded"]),
            listed([500, 1000].iter().map(|i| format!("{i}us")))
        );
        let l = line(&what, 24, 600.0, 980.0, "overheads", Path::new("/o"));
        assert_eq!(
            l,
            format!(
                "pvsched-bench: 2 repeats x loads [idle,loaded] x intervals [500us,1000us]: 24 \
                 phases, {} of measurement (about {} with overheads); results in /o",
                human(600.0),
                human(980.0)
            )
        );
    }
}
