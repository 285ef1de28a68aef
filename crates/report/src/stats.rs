//! Latency histograms: parsing cyclictest's JSON, merging, percentiles.
//!
//! A histogram has one bucket per microsecond (cyclictest `-h N`). Samples
//! beyond the last bucket are *overflows*: their exact value is unknown, but
//! they lie between the bucket limit and the maximum cyclictest reports, so
//! percentiles that fall among them are reported as that maximum (an upper
//! bound, never an underestimate).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Latency samples of one or more cyclictest threads / runs, in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// Bucket (µs) -> sample count; only non-empty buckets.
    pub buckets: BTreeMap<u64, u64>,
    /// Samples beyond the last bucket.
    pub overflows: u64,
    /// Every sample, overflows included.
    pub samples: u64,
    /// Sum of all samples (µs): cyclictest's exact average times its cycles.
    pub sum_us: f64,
    /// Largest sample (µs), overflows included.
    pub max_us: u64,
}

/// The numbers a report shows for a histogram.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub samples: u64,
    pub overflows: u64,
    pub avg_us: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub struct ParseError(pub String);

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

fn num_u64(v: &Value) -> Option<u64> {
    v.as_u64()
        .or_else(|| v.as_f64().map(|f| f.max(0.0).round() as u64))
}

impl Histogram {
    /// Adds `count` samples of `us` microseconds.
    pub fn record(&mut self, us: u64, count: u64) {
        if count == 0 {
            return;
        }
        *self.buckets.entry(us).or_insert(0) += count;
        self.samples += count;
        self.sum_us += us as f64 * count as f64;
        self.max_us = self.max_us.max(us);
    }

    /// Adds one sample of `ns` nanoseconds, rounded to the nearest
    /// microsecond bucket (half up): what a simulator, which knows latencies
    /// to the nanosecond, records so that its histograms read like
    /// cyclictest's.
    pub fn record_ns(&mut self, ns: u64) {
        self.record(ns.saturating_add(500) / 1000, 1);
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        for (&us, &n) in &other.buckets {
            *self.buckets.entry(us).or_insert(0) += n;
        }
        self.overflows += other.overflows;
        self.samples += other.samples;
        self.sum_us += other.sum_us;
        self.max_us = self.max_us.max(other.max_us);
    }

    /// Sum of histograms.
    pub fn merged<'a>(parts: impl IntoIterator<Item = &'a Histogram>) -> Histogram {
        let mut h = Histogram::default();
        for p in parts {
            h.merge(p);
        }
        h
    }

    /// Parses the `--json` file of cyclictest (rt-tests >= 2.0) run with
    /// `-h`: every thread's histogram merged. Overflows are the thread's
    /// cycles that no bucket holds.
    pub fn from_cyclictest_json(text: &str) -> Result<Histogram, ParseError> {
        let v: Value = serde_json::from_str(text.trim())
            .map_err(|e| ParseError(format!("cyclictest JSON: {e}")))?;
        let threads = v
            .get("thread")
            .and_then(Value::as_object)
            .ok_or_else(|| ParseError("cyclictest JSON: no \"thread\" object".into()))?;
        if threads.is_empty() {
            return Err(ParseError("cyclictest JSON: no threads".into()));
        }
        let mut total = Histogram::default();
        for (id, t) in threads {
            let mut h = Histogram::default();
            if let Some(buckets) = t.get("histogram").and_then(Value::as_object) {
                for (k, n) in buckets {
                    let us: u64 = k.parse().map_err(|_| {
                        ParseError(format!("thread {id}: bad histogram bucket {k:?}"))
                    })?;
                    let n = num_u64(n).ok_or_else(|| {
                        ParseError(format!("thread {id}: bad count for bucket {k}"))
                    })?;
                    h.record(us, n);
                }
            }
            let cycles = t
                .get("cycles")
                .and_then(num_u64)
                .ok_or_else(|| ParseError(format!("thread {id}: no \"cycles\" (run with -h?)")))?;
            let in_buckets = h.samples;
            h.overflows = cycles.saturating_sub(in_buckets);
            h.samples = in_buckets + h.overflows;
            if let Some(max) = t.get("max").and_then(num_u64) {
                h.max_us = h.max_us.max(max);
            }
            match t.get("avg").and_then(Value::as_f64) {
                // cyclictest's average covers every cycle, overflows included.
                Some(avg) if cycles > 0 => h.sum_us = avg * cycles as f64,
                // Without it, count overflows at the maximum (an upper bound).
                _ => h.sum_us += h.overflows as f64 * h.max_us as f64,
            }
            total.merge(&h);
        }
        Ok(total)
    }

    /// Smallest latency `x` such that at least `q` of the samples are <= x;
    /// a rank among the overflows gives the maximum. 0 when empty.
    pub fn percentile(&self, q: f64) -> u64 {
        if self.samples == 0 {
            return 0;
        }
        let rank = ((q * self.samples as f64).ceil() as u64).clamp(1, self.samples);
        let mut acc = 0u64;
        for (&us, &n) in &self.buckets {
            acc += n;
            if acc >= rank {
                return us;
            }
        }
        self.max_us
    }

    pub fn avg_us(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            self.sum_us / self.samples as f64
        }
    }

    pub fn summary(&self) -> Summary {
        Summary {
            samples: self.samples,
            overflows: self.overflows,
            avg_us: (self.avg_us() * 10.0).round() / 10.0,
            p50_us: self.percentile(0.50),
            p99_us: self.percentile(0.99),
            p999_us: self.percentile(0.999),
            max_us: self.max_us,
        }
    }

    /// Complementary CDF as (latency µs, fraction of samples >= latency),
    /// one point per non-empty bucket, overflows at the maximum. Every
    /// fraction is > 0 (log axes welcome).
    pub fn ccdf(&self) -> Vec<(f64, f64)> {
        if self.samples == 0 {
            return Vec::new();
        }
        let total = self.samples as f64;
        let mut below = 0u64;
        let mut out = Vec::with_capacity(self.buckets.len() + 1);
        for (&us, &n) in &self.buckets {
            out.push((us as f64, (self.samples - below) as f64 / total));
            below += n;
        }
        if self.overflows > 0 {
            let last = self.buckets.keys().next_back().copied().unwrap_or(0);
            if self.max_us > last {
                out.push((self.max_us as f64, self.overflows as f64 / total));
            }
        }
        out
    }
}

/// The `q` quantile of a handful of values (per-repeat figures), with linear
/// interpolation between order statistics (R's type 7, numpy's default);
/// None for no values.
pub fn quantile(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let h = (s.len() - 1) as f64 * q.clamp(0.0, 1.0);
    let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
    Some(s[lo] + (s[hi] - s[lo]) * (h - lo as f64))
}

/// The median (the mean of the middle two for an even count); None for no
/// values.
pub fn median(v: &[f64]) -> Option<f64> {
    quantile(v, 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_between_order_statistics() {
        let v = [4.0, 1.0, 3.0, 2.0];
        assert_eq!(median(&v), Some(2.5));
        assert_eq!(quantile(&v, 0.25), Some(1.75));
        assert_eq!(quantile(&v, 0.75), Some(3.25));
        assert_eq!(quantile(&v, 0.0), Some(1.0));
        assert_eq!(quantile(&v, 1.0), Some(4.0));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[]), None);
    }

    fn hist(pairs: &[(u64, u64)]) -> Histogram {
        let mut h = Histogram::default();
        for &(us, n) in pairs {
            h.record(us, n);
        }
        h
    }

    const TWO_THREADS: &str = r#"{
      "file_version": 1, "num_threads": 2,
      "thread": {
        "0": {"histogram": {"10": 5, "20": 4}, "cycles": 10, "min": 10, "max": 900, "avg": 100.0, "cpu": 0},
        "1": {"histogram": {"10": 1, "30": 9}, "cycles": 10, "min": 10, "max": 30, "avg": 28.0, "cpu": 1}
      }
    }"#;

    #[test]
    fn cyclictest_json_threads_are_merged_with_overflows_from_cycles() {
        // Arrange: thread 0 has 10 cycles but 9 in buckets (one overflow, max 900).

        // Act
        let h = Histogram::from_cyclictest_json(TWO_THREADS).unwrap();

        // Assert
        assert_eq!(h.samples, 20);
        assert_eq!(h.overflows, 1);
        assert_eq!(h.buckets.get(&10), Some(&6));
        assert_eq!(h.buckets.get(&30), Some(&9));
        assert_eq!(h.max_us, 900);
        assert!((h.avg_us() - 64.0).abs() < 1e-9, "avg {}", h.avg_us());
    }

    #[test]
    fn cyclictest_json_without_threads_is_an_error() {
        let err = Histogram::from_cyclictest_json(r#"{"thread": {}}"#).unwrap_err();
        assert!(err.0.contains("no threads"), "{err}");
    }

    #[test]
    fn cyclictest_json_that_is_not_json_is_an_error() {
        assert!(Histogram::from_cyclictest_json("# Total: 000").is_err());
    }

    #[test]
    fn percentiles_pick_the_first_bucket_reaching_the_rank() {
        // Arrange: 100 samples, 1..=100 us.
        let mut h = Histogram::default();
        for us in 1..=100 {
            h.record(us, 1);
        }

        // Act / Assert
        assert_eq!(h.percentile(0.50), 50);
        assert_eq!(h.percentile(0.99), 99);
        assert_eq!(h.percentile(0.999), 100);
        assert_eq!(h.percentile(0.0), 1);
        assert_eq!(h.percentile(1.0), 100);
    }

    #[test]
    fn percentile_among_overflows_is_the_maximum() {
        // Arrange: 98 samples at 5 us, 2 overflows with max 7000.
        let mut h = hist(&[(5, 98)]);
        h.overflows = 2;
        h.samples += 2;
        h.max_us = 7000;

        // Act / Assert
        assert_eq!(h.percentile(0.98), 5);
        assert_eq!(h.percentile(0.99), 7000);
    }

    #[test]
    fn empty_histogram_summarises_to_zeros() {
        let s = Histogram::default().summary();
        assert_eq!(s, Summary::default());
    }

    #[test]
    fn merging_sums_counts_and_keeps_the_larger_maximum() {
        // Arrange
        let a = hist(&[(10, 2), (20, 1)]);
        let mut b = hist(&[(10, 1), (50, 1)]);
        b.overflows = 1;
        b.samples += 1;
        b.max_us = 400;
        b.sum_us += 400.0;

        // Act
        let m = Histogram::merged([&a, &b]);

        // Assert
        assert_eq!(m.buckets.get(&10), Some(&3));
        assert_eq!(m.samples, 6);
        assert_eq!(m.overflows, 1);
        assert_eq!(m.max_us, 400);
        assert!((m.sum_us - (20.0 + 20.0 + 10.0 + 50.0 + 400.0)).abs() < 1e-9);
    }

    #[test]
    fn merging_is_order_independent() {
        let a = hist(&[(1, 3), (9, 2)]);
        let b = hist(&[(4, 1), (9, 7)]);
        assert_eq!(Histogram::merged([&a, &b]), Histogram::merged([&b, &a]));
    }

    #[test]
    fn ccdf_starts_at_one_and_ends_at_the_tail_fraction() {
        // Arrange: 4 samples: 10, 10, 20, and one overflow at 500.
        let mut h = hist(&[(10, 2), (20, 1)]);
        h.overflows = 1;
        h.samples += 1;
        h.max_us = 500;

        // Act
        let c = h.ccdf();

        // Assert
        assert_eq!(c, vec![(10.0, 1.0), (20.0, 0.5), (500.0, 0.25)]);
    }

    #[test]
    fn record_ns_rounds_to_the_nearest_microsecond_bucket() {
        // Arrange
        let mut h = Histogram::default();

        // Act
        for ns in [0, 499, 500, 1_499, 1_500, 2_000, u64::MAX] {
            h.record_ns(ns);
        }

        // Assert: 0 and 499 ns -> 0 us; 500 and 1499 -> 1; 1500 and 2000 -> 2.
        assert_eq!(h.buckets.get(&0), Some(&2));
        assert_eq!(h.buckets.get(&1), Some(&2));
        assert_eq!(h.buckets.get(&2), Some(&2));
        assert_eq!(h.samples, 7);
        assert_eq!(h.overflows, 0);
        assert_eq!(h.max_us, u64::MAX / 1000);
    }

    #[test]
    fn record_ns_histograms_summarise_like_recorded_microseconds() {
        let mut a = Histogram::default();
        let mut b = Histogram::default();
        for us in 1..=100u64 {
            a.record(us, 1);
            b.record_ns(us * 1000 + 123);
        }
        assert_eq!(a.summary(), b.summary());
    }

    #[test]
    fn summary_reports_rounded_average_and_percentiles() {
        let h = hist(&[(1, 1), (2, 2)]);
        let s = h.summary();
        assert_eq!(s.avg_us, 1.7);
        assert_eq!((s.p50_us, s.p99_us, s.max_us, s.samples), (2, 2, 2, 3));
    }
}
