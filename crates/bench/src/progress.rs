//! One line per phase on stderr, with the time left.

use std::time::Instant;

pub struct Progress {
    total: usize,
    done: usize,
    /// Nominal seconds of the phases not started yet.
    remaining: f64,
    /// Nominal seconds of the phases started so far.
    started: f64,
    start: Instant,
}

/// "40 s", "4 min", "1 h 05 min".
pub fn human(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    if s < 90 {
        format!("{s} s")
    } else if s < 3600 {
        format!("{} min", (s + 30) / 60)
    } else {
        format!("{} h {:02} min", s / 3600, (s % 3600 + 30) / 60)
    }
}

impl Progress {
    pub fn new(total: usize, nominal_secs: f64) -> Self {
        Self {
            total,
            done: 0,
            remaining: nominal_secs,
            started: 0.0,
            start: Instant::now(),
        }
    }

    /// Real seconds per nominal second so far (overheads: boots, load
    /// start/stop, console transfers); a guess before the first phase ends.
    fn factor(&self) -> f64 {
        let elapsed = self.start.elapsed().as_secs_f64();
        if self.started > 0.0 && elapsed > 0.0 {
            (elapsed / self.started).clamp(1.0, 10.0)
        } else {
            1.5
        }
    }

    /// Prints `[k/N] label: running X s (about Y left)` for the phase that
    /// starts now.
    pub fn phase(&mut self, label: &str, nominal: f64) {
        self.done += 1;
        let left = self.remaining * self.factor();
        eprintln!(
            "[{}/{}] {label}: running {} (about {} left)",
            self.done,
            self.total,
            human(nominal),
            human(left)
        );
        self.remaining = (self.remaining - nominal).max(0.0);
        self.started += nominal;
    }

    /// One more phase than planned (a measurement taken again).
    pub fn add(&mut self, nominal: f64) {
        self.total += 1;
        self.remaining += nominal;
    }

    /// Counts a phase that will not run (its mode could not be set up).
    pub fn skip(&mut self, label: &str, nominal: f64) {
        self.done += 1;
        self.remaining = (self.remaining - nominal).max(0.0);
        eprintln!(
            "[{}/{}] {label}: skipped (about {} left)",
            self.done,
            self.total,
            human(self.remaining * self.factor())
        );
    }

    pub fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_times_read_naturally() {
        assert_eq!(human(40.2), "40 s");
        assert_eq!(human(240.0), "4 min");
        assert_eq!(human(3900.0), "1 h 05 min");
        assert_eq!(human(-3.0), "0 s");
    }

    #[test]
    fn phases_count_up_and_nominal_time_runs_down() {
        let mut p = Progress::new(2, 20.0);
        p.phase("a", 10.0);
        assert_eq!(p.done, 1);
        assert_eq!(p.remaining, 10.0);
        p.phase("b", 10.0);
        assert_eq!(p.remaining, 0.0);
    }
}
