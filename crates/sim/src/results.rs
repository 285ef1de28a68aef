//! What a run measures, over the measured window (after the warm-up): latency histograms
//! (the same type the benchmark fills from cyclictest, so measured and simulated figures
//! read alike), CPU shares, workload counters and the policy's totals.

use pvsched_policy::{PollPrice, VmStats};
use pvsched_report::{Histogram, Summary};
use serde::{Deserialize, Serialize};

use crate::scenario::Scenario;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VmResult {
    pub name: String,
    /// Its cyclictest's wakeup latency (µs), if it runs one.
    pub latency: Option<Summary>,
    pub latency_hist: Histogram,
    /// Its threads' (vCPUs and main loop) CPU time, as a fraction of the machine.
    pub cpu_share: f64,
    /// Of which at an RT class.
    pub rt_share: f64,
    pub audio_periods: u64,
    pub audio_glitches: u64,
    pub lock_acquisitions_per_s: f64,
    /// Host preemptions of a vCPU whose current guest task held a lock.
    pub holder_preemptions: u64,
    pub round_trips_per_s: f64,
    /// The policy's counters (pvsched modes).
    pub boosts: u64,
    pub throttles: u64,
    pub over_budget: u64,
    pub boosted_s: f64,
    /// The halt-polling advisor on the halts the policy measured (pvsched modes; budget
    /// 5 % of a core per vCPU): its window µs, the halts it catches and its CPU share
    /// per vCPU.
    pub advisor: Option<Advice>,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Advice {
    pub window_us: f64,
    pub hit_rate: f64,
    pub cpu_share: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModeResult {
    pub scenario: String,
    pub variant: Option<String>,
    pub mode: String,
    pub seed: u64,
    pub costs: String,
    pub cpus: u32,
    pub window_s: f64,
    /// Every VM's cyclictest, merged.
    pub guest_latency: Summary,
    pub guest_hist: Histogram,
    pub host_latency: Summary,
    pub host_hist: Histogram,
    /// CPU time of the host's hogs, as a fraction of the machine.
    pub host_hog_share: f64,
    pub vms: Vec<VmResult>,
    /// Simulated events (the run's size; events per second are printed, not stored, so
    /// the JSON of a seed is the same on every machine).
    pub events: u64,
}

struct VmCounters {
    name: String,
    latency: Histogram,
    audio_periods: u64,
    audio_glitches: u64,
    locks: u64,
    holder_preemptions: u64,
    messages: u64,
}

pub struct Recorder {
    from: u64,
    start_times: Vec<(u64, u64)>,
    guest: Vec<VmCounters>,
    host_latency: Histogram,
}

impl Recorder {
    pub fn new(from: u64) -> Recorder {
        Recorder {
            from,
            start_times: Vec::new(),
            guest: Vec::new(),
            host_latency: Histogram::default(),
        }
    }

    pub fn add_vm(&mut self, name: &str) {
        self.guest.push(VmCounters {
            name: name.to_string(),
            latency: Histogram::default(),
            audio_periods: 0,
            audio_glitches: 0,
            locks: 0,
            holder_preemptions: 0,
            messages: 0,
        });
    }

    /// CPU and RT time of every thread when the window opens.
    pub fn start(&mut self, times: Vec<(u64, u64)>) {
        self.start_times = times;
    }

    pub fn host_latency(&mut self, expiry: u64, ns: u64) {
        if expiry >= self.from {
            self.host_latency.record_ns(ns);
        }
    }

    pub fn guest_latency(&mut self, vm: u32, expiry: u64, ns: u64) {
        if expiry >= self.from {
            self.guest[vm as usize].latency.record_ns(ns);
        }
    }

    pub fn audio_period(&mut self, vm: u32, start: u64, glitch: bool) {
        if start >= self.from {
            let c = &mut self.guest[vm as usize];
            c.audio_periods += 1;
            c.audio_glitches += u64::from(glitch);
        }
    }

    pub fn holder_preempted(&mut self, vm: u32, at: u64) {
        if at >= self.from {
            self.guest[vm as usize].holder_preemptions += 1;
        }
    }

    pub fn lock_acquired(&mut self, vm: u32, at: u64) {
        if at >= self.from {
            self.guest[vm as usize].locks += 1;
        }
    }

    /// A ping-pong message handled; the starter's count round trips.
    pub fn message(&mut self, vm: u32, at: u64, starter: bool) {
        if at >= self.from && starter {
            self.guest[vm as usize].messages += 1;
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        self,
        sc: &Scenario,
        variant: Option<&str>,
        mode: &str,
        seed: u64,
        cpus: u32,
        end_times: Vec<(u64, u64)>,
        vm_threads: &[Vec<u32>],
        hog_threads: &[u32],
        policy: Option<Vec<VmStats>>,
        advice: Option<Vec<Option<(PollPrice, f64)>>>,
        events: u64,
    ) -> ModeResult {
        let window_s = sc.duration_s;
        let machine_ns = window_s * 1e9 * f64::from(cpus);
        let delta = |t: u32| -> (u64, u64) {
            let (c1, r1) = end_times[t as usize];
            let (c0, r0) = self.start_times.get(t as usize).copied().unwrap_or((0, 0));
            (c1.saturating_sub(c0), r1.saturating_sub(r0))
        };
        let hog_ns: u64 = hog_threads.iter().map(|&t| delta(t).0).sum();
        let mut guest_hist = Histogram::default();
        let mut vms = Vec::new();
        for (i, c) in self.guest.into_iter().enumerate() {
            let (cpu, rt) = vm_threads[i]
                .iter()
                .map(|&t| delta(t))
                .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
            guest_hist.merge(&c.latency);
            let stats = policy.as_ref().and_then(|p| p.get(i));
            vms.push(VmResult {
                name: c.name,
                latency: (c.latency.samples > 0).then(|| c.latency.summary()),
                latency_hist: c.latency,
                cpu_share: cpu as f64 / machine_ns,
                rt_share: rt as f64 / machine_ns,
                audio_periods: c.audio_periods,
                audio_glitches: c.audio_glitches,
                lock_acquisitions_per_s: c.locks as f64 / window_s,
                holder_preemptions: c.holder_preemptions,
                round_trips_per_s: c.messages as f64 / window_s,
                boosts: stats.map_or(0, |s| s.boosts_total),
                throttles: stats.map_or(0, |s| s.throttles_total),
                over_budget: stats.map_or(0, |s| s.over_budget_total),
                boosted_s: stats.map_or(0.0, |s| s.boosted_ns_total as f64 * 1e-9),
                advisor: advice
                    .as_ref()
                    .and_then(|a| a.get(i).copied().flatten())
                    .map(|(p, cpu_share)| Advice {
                        window_us: p.window_ns as f64 / 1e3,
                        hit_rate: p.hit_rate(),
                        cpu_share,
                    }),
            });
        }
        ModeResult {
            scenario: sc.name.clone(),
            variant: variant.map(str::to_string),
            mode: mode.to_string(),
            seed,
            costs: sc.costs.clone(),
            cpus,
            window_s,
            guest_latency: guest_hist.summary(),
            guest_hist,
            host_latency: self.host_latency.summary(),
            host_hist: self.host_latency,
            host_hog_share: hog_ns as f64 / machine_ns,
            vms,
            events,
        }
    }
}
