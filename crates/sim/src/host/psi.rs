//! CPU pressure as PSI reports it in /proc/pressure/cpu (`some`), which pvschedd reads to
//! decide that the host is overloaded (`avg10` above 30 % by default:
//! `pvsched_policy::serving::overloaded`).
//!
//! Per CPU, as `psi_group_cpu` (kernel/sched/psi.c, Linux 6.1): *some* time, while a thread
//! is runnable there but not running (queued; an RT queue throttled counts), and *non-idle*
//! time, while a thread runs or is queued there. A sample over a period aggregates the CPUs
//! as `collect_percpu_times` does: `sum(some_c * nonidle_c) / sum(nonidle_c)`, so that
//! pressure on busy CPUs is not diluted by idle ones. Simplified: `avg10` is the mean of
//! the samples over the last 10 s (or the run so far, if shorter: the simulated load is a
//! steady state that began before the run), where the kernel keeps an exponential average
//! updated every 2 s from 0 at boot. Off unless asked for ([`Host::track_cpu_pressure`]).

use std::collections::VecDeque;

use super::rq::cpus_of;
use super::Host;

/// The window `avg10` averages over.
pub const AVG_WINDOW_NS: u64 = 10_000_000_000;

pub(super) struct Psi {
    /// Accounted up to here.
    at: u64,
    some_ns: Vec<u64>,
    nonidle_ns: Vec<u64>,
    /// The totals at the last sample.
    sampled_at: u64,
    some_then: Vec<u64>,
    nonidle_then: Vec<u64>,
    /// Samples in the window: (period ns, aggregated some ns).
    samples: VecDeque<(u64, u64)>,
}

impl Host {
    /// Starts measuring CPU pressure from now (the host's time of its last call).
    pub fn track_cpu_pressure(&mut self) {
        let n = self.p.cpus as usize;
        self.psi = Some(Psi {
            at: self.now,
            some_ns: vec![0; n],
            nonidle_ns: vec![0; n],
            sampled_at: self.now,
            some_then: vec![0; n],
            nonidle_then: vec![0; n],
            samples: VecDeque::new(),
        });
    }

    /// Accounts the time up to `to` (the host's state has held since the last accounting).
    pub(super) fn account_pressure(&mut self, to: u64) {
        if self.psi.is_none() {
            return;
        }
        let scx = if self.scx.on { self.scx_waiting() } else { 0 };
        let waiting = self.fair_queued | self.rt_queued | scx;
        let busy = self.fair_curr | self.rt_curr | waiting;
        let Some(p) = self.psi.as_mut() else {
            return;
        };
        let dt = to.saturating_sub(p.at);
        if dt == 0 {
            return;
        }
        for c in cpus_of(waiting) {
            p.some_ns[c as usize] += dt;
        }
        for c in cpus_of(busy) {
            p.nonidle_ns[c as usize] += dt;
        }
        p.at = to;
    }

    /// Samples the pressure up to `now` and returns the share of time (0..=1) some thread
    /// waited for a CPU over the last [`AVG_WINDOW_NS`] (PSI's cpu `some avg10` / 100);
    /// None if not tracked or no time has passed since tracking began.
    pub fn cpu_pressure_some(&mut self, now: u64) -> Option<f64> {
        self.account_pressure(now);
        let p = self.psi.as_mut()?;
        let period = now.saturating_sub(p.sampled_at);
        if period > 0 {
            let (mut weighted, mut nonidle) = (0u128, 0u128);
            for c in 0..p.some_ns.len() {
                let s = u128::from(p.some_ns[c] - p.some_then[c]);
                let n = u128::from(p.nonidle_ns[c] - p.nonidle_then[c]);
                weighted += s * n;
                nonidle += n;
            }
            let some = weighted.checked_div(nonidle).unwrap_or(0);
            p.samples
                .push_back((period, u64::try_from(some).unwrap_or(period)));
            p.some_then.clone_from(&p.some_ns);
            p.nonidle_then.clone_from(&p.nonidle_ns);
            p.sampled_at = now;
        }
        let mut span: u64 = p.samples.iter().map(|s| s.0).sum();
        while p.samples.len() > 1 && span - p.samples[0].0 >= AVG_WINDOW_NS {
            span -= p.samples[0].0;
            p.samples.pop_front();
        }
        let some: u64 = p.samples.iter().map(|s| s.1).sum();
        (span > 0).then(|| some as f64 / span as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{run_until, FAIR, S};
    use super::super::{Host, HostParams, Switch, Tid};

    fn host(cpus: u32) -> Host {
        let mut h = Host::new(HostParams {
            cpus,
            ..HostParams::default()
        });
        h.track_cpu_pressure();
        h
    }

    /// Spawns a fair hog pinned to `cpu` and wakes it at 0.
    fn pinned_hog(h: &mut Host, cpu: u32, out: &mut Vec<Switch>) -> Tid {
        let t = h.spawn(FAIR, Some(vec![cpu]));
        h.wake(0, t, None, out);
        t
    }

    /// Runs to each whole second up to `to` and samples there; the last sample.
    fn sample_each_second(h: &mut Host, from: u64, to: u64, out: &mut Vec<Switch>) -> f64 {
        let mut last = None;
        for s in from..=to {
            run_until(h, s * S, out);
            last = h.cpu_pressure_some(s * S);
        }
        last.unwrap_or(f64::NAN)
    }

    #[test]
    fn two_hogs_sharing_a_cpu_are_full_pressure_even_beside_an_idle_cpu() {
        let (mut h, mut out) = (host(2), Vec::new());
        pinned_hog(&mut h, 0, &mut out);
        pinned_hog(&mut h, 0, &mut out);

        // CPU 1 is idle, so it does not dilute CPU 0's pressure (PSI weighs by non-idle time).
        let p = sample_each_second(&mut h, 1, 3, &mut out);

        assert!((p - 1.0).abs() < 1e-9, "{p}");
    }

    #[test]
    fn pressure_on_one_of_two_busy_cpus_is_half() {
        let (mut h, mut out) = (host(2), Vec::new());
        pinned_hog(&mut h, 0, &mut out);
        pinned_hog(&mut h, 0, &mut out);
        pinned_hog(&mut h, 1, &mut out);

        let p = sample_each_second(&mut h, 1, 3, &mut out);

        assert!((p - 0.5).abs() < 1e-9, "{p}");
    }

    #[test]
    fn one_hog_per_cpu_is_no_pressure() {
        let (mut h, mut out) = (host(2), Vec::new());
        pinned_hog(&mut h, 0, &mut out);
        pinned_hog(&mut h, 1, &mut out);

        let p = sample_each_second(&mut h, 1, 3, &mut out);

        assert_eq!(p, 0.0);
    }

    #[test]
    fn the_average_covers_the_last_ten_seconds() {
        let (mut h, mut out) = (host(1), Vec::new());
        pinned_hog(&mut h, 0, &mut out);
        pinned_hog(&mut h, 0, &mut out);
        // 5 s of two hogs on one CPU, then one.
        let during = sample_each_second(&mut h, 1, 5, &mut out);
        let running = h.current(0).expect("a hog runs");
        h.block(5 * S, running, &mut out);

        let at_10 = sample_each_second(&mut h, 6, 10, &mut out);
        let at_15 = sample_each_second(&mut h, 11, 15, &mut out);

        assert!((during - 1.0).abs() < 1e-9, "{during}");
        assert!((at_10 - 0.5).abs() < 1e-9, "{at_10}");
        assert_eq!(at_15, 0.0);
    }
}
