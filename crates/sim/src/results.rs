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
    /// Its idle vCPUs: the guest idle driver's and KVM's polling.
    #[serde(default)]
    pub idle: IdleCounters,
    /// Lock waits and lock-holder extensions, as the policy counts them (pvsched modes).
    #[serde(default)]
    pub locks: LockCounters,
}

/// A VM's lock counters from the policy's `VmStats`, over the measured window (what
/// `pvschedctl status` shows, as differences), the debt as of the end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LockCounters {
    /// Contentions the guest counted, and of those the ones whose holder's vCPU was
    /// preempted (for an unknown holder: another vCPU): its counters as last read.
    pub contentions: u64,
    pub holder_preempted: u64,
    /// Lock-holder extensions granted, refused (lock debt at its cap), and cut short (the
    /// vCPU ran before the extension ended).
    pub extensions: u64,
    /// Of the extensions, those granted at the preemption (a wait named the vCPU already).
    #[serde(default)]
    pub at_preemption: u64,
    pub refused: u64,
    pub avoided: u64,
    /// Extension time on a CPU (lock debt incurred), and debt repaid, ms.
    pub extended_ms: f64,
    pub repaid_ms: f64,
    /// Debt owed at the end, ms.
    pub debt_ms: f64,
}

impl LockCounters {
    /// `end`'s counters less `start`'s (the window's).
    pub fn between(start: &VmStats, end: &VmStats) -> LockCounters {
        let ms = |a: u64, b: u64| a.saturating_sub(b) as f64 * 1e-6;
        LockCounters {
            contentions: end.lock_contentions.saturating_sub(start.lock_contentions),
            holder_preempted: end
                .lock_holder_preempted
                .saturating_sub(start.lock_holder_preempted),
            extensions: end.lock_extensions.saturating_sub(start.lock_extensions),
            at_preemption: end
                .lock_extensions_at_preemption
                .saturating_sub(start.lock_extensions_at_preemption),
            refused: end
                .lock_extensions_refused
                .saturating_sub(start.lock_extensions_refused),
            avoided: end
                .lock_preemptions_avoided
                .saturating_sub(start.lock_preemptions_avoided),
            extended_ms: ms(end.lock_extended_ns, start.lock_extended_ns),
            repaid_ms: ms(end.lock_repaid_ns, start.lock_repaid_ns),
            debt_ms: end.lock_debt_ns as f64 * 1e-6,
        }
    }
}

/// What a VM's idle vCPUs did over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IdleCounters {
    /// Host CPU its vCPUs spent polling in the guest (the idle driver), as a fraction of
    /// the machine.
    pub guest_poll_share: f64,
    /// Host CPU spent in KVM's halt polling for its vCPUs, as a fraction of the machine.
    pub host_poll_share: f64,
    /// Guest polls started, and those a wakeup ended (the rest ran out and halted).
    pub guest_polls: u64,
    pub guest_poll_hits: u64,
    /// HLTs the guest issued.
    pub guest_halts: u64,
    /// Of those, hinted: halted at once, the host said overloaded.
    pub overload_halts: u64,
    /// Of those, hinted: halted at once, no hint (no host half, or nothing measured yet).
    pub unhinted_halts: u64,
    /// Of those, hinted: a window was due but the poll budget held less than all of it.
    #[serde(default)]
    pub budget_halts: u64,
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
    /// The guests' idle driver.
    #[serde(default)]
    pub guest_idle: String,
    /// The host's CPU pressure (PSI cpu `some avg10`, 0..=1) at the daemon's last discovery
    /// round, when the run tracks it (a pvsched mode with the hinted idle driver).
    #[serde(default)]
    pub host_cpu_pressure: Option<f64>,
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
    guest_poll_ns: u64,
    host_poll_ns: u64,
    idle: IdleCounters,
}

/// How an idle entry of the guest went (for [`Recorder::idle_entry`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleEntry {
    Poll,
    PollHit,
    Halt,
    OverloadHalt,
    UnhintedHalt,
    BudgetHalt,
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
            guest_poll_ns: 0,
            host_poll_ns: 0,
            idle: IdleCounters::default(),
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

    /// Polling of a vCPU of `vm` from `start` to `end` (host ns; the window's part counts):
    /// in the guest's idle driver, or else KVM's.
    pub fn poll(&mut self, vm: u32, guest: bool, start: u64, end: u64) {
        let ns = end.saturating_sub(start.max(self.from));
        let c = &mut self.guest[vm as usize];
        if guest {
            c.guest_poll_ns += ns;
        } else {
            c.host_poll_ns += ns;
        }
    }

    pub fn idle_entry(&mut self, vm: u32, at: u64, what: IdleEntry) {
        if at < self.from {
            return;
        }
        let c = &mut self.guest[vm as usize].idle;
        match what {
            IdleEntry::Poll => c.guest_polls += 1,
            IdleEntry::PollHit => c.guest_poll_hits += 1,
            IdleEntry::Halt => c.guest_halts += 1,
            IdleEntry::OverloadHalt => {
                c.guest_halts += 1;
                c.overload_halts += 1;
            }
            IdleEntry::UnhintedHalt => {
                c.guest_halts += 1;
                c.unhinted_halts += 1;
            }
            IdleEntry::BudgetHalt => {
                c.guest_halts += 1;
                c.budget_halts += 1;
            }
        }
    }

    /// The idle counters of `vm` so far.
    #[cfg(test)]
    pub fn idle_counters(&self, vm: u32) -> IdleCounters {
        self.guest[vm as usize].idle
    }

    /// Host ns the guest idle driver of `vm` polled so far (polls in progress not yet).
    #[cfg(test)]
    pub fn guest_poll_ns(&self, vm: u32) -> u64 {
        self.guest[vm as usize].guest_poll_ns
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
        policy: Option<(Vec<VmStats>, Vec<VmStats>)>,
        advice: Option<Vec<Option<(PollPrice, f64)>>>,
        idle: (&str, Option<f64>),
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
            let stats = policy.as_ref().and_then(|p| p.0.get(i));
            let at_start = policy
                .as_ref()
                .and_then(|p| p.1.get(i).copied())
                .unwrap_or_default();
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
                idle: IdleCounters {
                    guest_poll_share: c.guest_poll_ns as f64 / machine_ns,
                    host_poll_share: c.host_poll_ns as f64 / machine_ns,
                    ..c.idle
                },
                locks: stats.map_or_else(LockCounters::default, |s| {
                    LockCounters::between(&at_start, s)
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
            guest_idle: idle.0.to_string(),
            host_cpu_pressure: idle.1,
            vms,
            events,
        }
    }
}
