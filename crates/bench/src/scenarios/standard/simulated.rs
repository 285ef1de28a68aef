//! The same policy under KVM, simulated beside the run: `pvsched-sim`'s
//! `busy-host` scenario (one 2-vCPU VM on a 2-CPU host loaded like this
//! bench's loaded host, guest and host cyclictest at RR 8) with the KVM cost
//! set, at each interval the run measured, in vanilla, static-rt and
//! pvsched (with the guest doorbell when the run had it), without the
//! scenario's audio task: the bench's cyclictest phases run cyclictest
//! alone (audiosim has a phase of its own), and in the same guest at the
//! same priority the audio task's 300 µs bursts put a floor of ~250 µs
//! under the simulated guest p99 of static-rt and pvsched alike. This machine runs
//! no stock guest under KVM; the host-cost issue asks where the policy lands
//! there. Every figure of this section is simulated, and says so. The
//! simulator drives the real `pvsched-policy` at its defaults: a
//! `--pvschedd-config` overlay of the run is not applied to it.

use pvsched_sim::engine::{self, Mode};
use pvsched_sim::scenario::Scenario;
use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Result};

/// The scenario simulated.
pub const SCENARIO: &str = "busy-host";
/// The cost set.
pub const COSTS: &str = "kvm";
/// Seed of every simulation (the section is the same for the same code).
pub const SEED: u64 = 1;

/// One simulated mode at one interval: p99s in µs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SimulatedMode {
    /// The bench's name for the mode (vanilla, static-rt, pvsched).
    pub mode: String,
    /// The simulator's mode behind it (pvsched-doorbell with a doorbell).
    pub sim_mode: String,
    pub guest_p99_us: u64,
    pub host_p99_us: u64,
    /// CPU time of the host's hogs, fraction of the machine.
    pub host_hog_share: f64,
}

/// One interval's simulated modes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SimulatedInterval {
    pub interval_us: u32,
    pub modes: Vec<SimulatedMode>,
}

impl SimulatedInterval {
    fn get(&self, mode: &str) -> Option<&SimulatedMode> {
        self.modes.iter().find(|m| m.mode == mode)
    }

    /// pvsched / vanilla of the guest's and the host's p99.
    pub fn ratios(&self) -> Option<(f64, f64)> {
        let (p, v) = (self.get("pvsched")?, self.get("vanilla")?);
        let r = |a: u64, b: u64| crate::harness::figures::ratio(a as f64, b as f64);
        Some((
            r(p.guest_p99_us, v.guest_p99_us)?,
            r(p.host_p99_us, v.host_p99_us)?,
        ))
    }
}

/// The whole section: what ran and the results.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Simulated {
    pub scenario: String,
    pub costs: String,
    pub seed: u64,
    pub duration_s: f64,
    pub intervals: Vec<SimulatedInterval>,
}

/// The scenario at `interval_us`: every periodic task (the guest's and the
/// host's cyclictest) at that interval, no audio task, the KVM cost set, the
/// given modes.
fn scenario_at(interval_us: u32, modes: &[&str]) -> Result<Scenario> {
    let fail = |msg: String| BenchError::Tool {
        what: format!("pvsched-sim scenario {SCENARIO}"),
        detail: msg,
    };
    let mut sc = Scenario::load(SCENARIO).map_err(|e| fail(e.to_string()))?;
    sc.costs = COSTS.into();
    sc.modes = modes.iter().map(|m| m.to_string()).collect();
    for t in &mut sc.host.tasks {
        if let pvsched_sim::scenario::HostTaskSpec::Periodic { interval_us: i, .. } = t {
            *i = u64::from(interval_us);
        }
    }
    for vm in &mut sc.vms {
        vm.tasks
            .retain(|t| !matches!(t, pvsched_sim::scenario::GuestTaskSpec::Audio { .. }));
        for t in &mut vm.tasks {
            if let pvsched_sim::scenario::GuestTaskSpec::Periodic { interval_us: i, .. } = t {
                *i = u64::from(interval_us);
            }
        }
    }
    // Checked like a file.
    let text = toml::to_string(&sc).map_err(|e| fail(e.to_string()))?;
    Scenario::parse(&text, SCENARIO).map_err(|e| fail(e.to_string()))
}

/// Runs the scenario at each interval (about a second in all).
pub fn run(intervals: &[u32], doorbell: bool) -> Result<Simulated> {
    let pv = if doorbell {
        "pvsched-doorbell"
    } else {
        "pvsched"
    };
    let pairs = [
        ("vanilla", "vanilla"),
        ("static-rt", "static-rt"),
        ("pvsched", pv),
    ];
    let sim_modes: Vec<&str> = pairs.iter().map(|p| p.1).collect();
    let mut out = Simulated {
        scenario: SCENARIO.into(),
        costs: COSTS.into(),
        seed: SEED,
        ..Default::default()
    };
    for &interval_us in intervals {
        let sc = scenario_at(interval_us, &sim_modes)?;
        out.duration_s = sc.duration_s;
        let mut cell = SimulatedInterval {
            interval_us,
            modes: Vec::new(),
        };
        for (name, sim_mode) in pairs {
            let mode = Mode::parse(sim_mode).ok_or_else(|| BenchError::Tool {
                what: "pvsched-sim".into(),
                detail: format!("no mode {sim_mode}"),
            })?;
            let r = engine::run(&sc, None, mode, SEED, false).map_err(|e| BenchError::Tool {
                what: format!("pvsched-sim {SCENARIO} {sim_mode} at {interval_us} µs"),
                detail: e.to_string(),
            })?;
            cell.modes.push(SimulatedMode {
                mode: name.into(),
                sim_mode: sim_mode.into(),
                guest_p99_us: r.guest_latency.p99_us,
                host_p99_us: r.host_latency.p99_us,
                host_hog_share: r.host_hog_share,
            });
        }
        out.intervals.push(cell);
    }
    Ok(out)
}

/// The report's section (nothing if the simulation did not run).
pub fn markdown(o: &mut String, s: Option<&Simulated>) {
    use std::fmt::Write as _;
    let Some(s) = s else {
        return;
    };
    let _ = writeln!(o, "\n## The same policy under KVM (simulated)\n");
    let _ = writeln!(
        o,
        "**Simulated**, not measured: `pvsched-sim` scenario `{}` (one 2-vCPU VM on 2 CPUs loaded \
         like the loaded host above), `{}` cost set, seed {}, {} s per mode, every periodic \
         task at the run's interval, no audio task (as in the cyclictest phases); the real \
         policy at its defaults. The simulated pvsched \
         mode is `{}`.\n",
        s.scenario,
        s.costs,
        s.seed,
        s.duration_s,
        s.intervals
            .first()
            .and_then(|i| i.get("pvsched"))
            .map_or("pvsched", |m| m.sim_mode.as_str())
    );
    let _ = writeln!(
        o,
        "| interval | guest p99 vanilla / static-rt / pvsched µs | host p99 vanilla / static-rt / pvsched µs | guest p99 pvsched/vanilla | host p99 pvsched/vanilla | host hogs % of machine, vanilla / pvsched |"
    );
    let _ = writeln!(o, "|---|---|---|--:|--:|---|");
    for i in &s.intervals {
        let three = |f: &dyn Fn(&SimulatedMode) -> u64| {
            ["vanilla", "static-rt", "pvsched"]
                .iter()
                .map(|m| i.get(m).map_or("n/a".into(), |x| f(x).to_string()))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let (g, h) = i.ratios().map_or(("n/a".into(), "n/a".into()), |(g, h)| {
            (format!("{g:.2}x"), format!("{h:.2}x"))
        });
        let hogs = |m: &str| {
            i.get(m)
                .map_or("n/a".into(), |x| format!("{:.1}", x.host_hog_share * 100.0))
        };
        let _ = writeln!(
            o,
            "| {} µs | {} | {} | {g} | {h} | {} / {} |",
            i.interval_us,
            three(&|x| x.guest_p99_us),
            three(&|x| x.host_p99_us),
            hogs("vanilla"),
            hogs("pvsched")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_periodic_task_takes_the_interval_and_the_costs_are_kvm() {
        let sc = scenario_at(500, &["vanilla"]).unwrap();

        assert_eq!(sc.costs, "kvm");
        let host: Vec<u64> = sc
            .host
            .tasks
            .iter()
            .filter_map(|t| match t {
                pvsched_sim::scenario::HostTaskSpec::Periodic { interval_us, .. } => {
                    Some(*interval_us)
                }
                _ => None,
            })
            .collect();
        let guest: Vec<u64> = sc
            .vms
            .iter()
            .flat_map(|v| v.tasks.iter())
            .filter_map(|t| match t {
                pvsched_sim::scenario::GuestTaskSpec::Periodic { interval_us, .. } => {
                    Some(*interval_us)
                }
                _ => None,
            })
            .collect();
        assert!(
            !host.is_empty() && host.iter().all(|&i| i == 500),
            "{host:?}"
        );
        assert!(
            !guest.is_empty() && guest.iter().all(|&i| i == 500),
            "{guest:?}"
        );
        assert!(
            sc.vms
                .iter()
                .flat_map(|v| v.tasks.iter())
                .all(|t| !matches!(t, pvsched_sim::scenario::GuestTaskSpec::Audio { .. })),
            "the cyclictest phases run no audio task"
        );
    }

    #[test]
    fn a_short_simulation_gives_every_mode_and_the_section_says_it_is_simulated() {
        let mut s = run(&[1000], true).unwrap();
        let i = &s.intervals[0];

        assert_eq!(
            i.modes.iter().map(|m| m.mode.as_str()).collect::<Vec<_>>(),
            ["vanilla", "static-rt", "pvsched"]
        );
        assert_eq!(i.modes[2].sim_mode, "pvsched-doorbell");
        assert!(i
            .modes
            .iter()
            .all(|m| m.guest_p99_us > 0 && m.host_p99_us > 0));
        let (g, _) = i.ratios().unwrap();
        assert!(
            g < 1.0,
            "the policy cuts the guest's p99 under KVM too: {g}"
        );
        s.intervals[0].modes.truncate(1);
        let mut md = String::new();
        markdown(&mut md, Some(&s));
        assert!(md.contains("## The same policy under KVM (simulated)"));
        assert!(md.contains("**Simulated**, not measured"));
        assert!(md.contains("| 1000 µs | "), "{md}");
        let mut none = String::new();
        markdown(&mut none, None);
        assert!(none.is_empty());
    }
}
