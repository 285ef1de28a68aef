//! The arithmetic every report shares: ratios, one side's latency over the
//! repeats, a figure's spread over the repeats, lists.

use serde::{Deserialize, Serialize};

use crate::stats::{Histogram, Summary};

/// Latency of one side (guest or host) of one mode: merged over repeats.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Side {
    #[serde(flatten)]
    pub summary: Summary,
    /// p99 of each repeat, in run order: the spread.
    pub p99_us_per_repeat: Vec<u64>,
    /// Wakeups that happened / wakeups the interval asked for (cyclictest
    /// skips the periods a late thread missed).
    pub loops_ratio: f64,
}

pub fn ratio(a: f64, b: f64) -> Option<f64> {
    if b > 0.0 && a.is_finite() && b.is_finite() {
        Some(a / b)
    } else {
        None
    }
}

pub(crate) fn side(hists: &[&Histogram], expected: u64) -> Side {
    let merged = Histogram::merged(hists.iter().copied());
    Side {
        summary: merged.summary(),
        p99_us_per_repeat: hists.iter().map(|h| h.percentile(0.99)).collect(),
        loops_ratio: if expected > 0 {
            ((merged.samples as f64 / expected as f64) * 1000.0).round() / 1000.0
        } else {
            0.0
        },
    }
}

pub(crate) fn join<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(", ")
}

/// A figure over the repeats: median, spread, each repeat in run order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub per_repeat: Vec<f64>,
}

impl Spread {
    pub fn of(v: Vec<f64>) -> Spread {
        let mut s = v.clone();
        s.sort_by(|a, b| a.total_cmp(b));
        Spread {
            median: median_sorted(&s),
            min: s.first().copied().unwrap_or(0.0),
            max: s.last().copied().unwrap_or(0.0),
            per_repeat: v,
        }
    }
}

fn median_sorted(s: &[f64]) -> f64 {
    crate::stats::median(s).unwrap_or(0.0)
}
