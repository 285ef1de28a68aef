//! The eventual-fairness tables' figures: per load and mode, the VM's CPU
//! share over the cyclictest phases against its share under vanilla and
//! against the fair-class entitlement of its vCPU threads, the share
//! pvschedd kept them boosted, and the host load's CPU share and throughput
//! beside it.

use std::collections::BTreeMap;

use super::super::model::*;
use super::super::report::*;
use super::super::share::CpuUse;
use crate::harness::axes::{Load, Mode};
use crate::harness::figures::ratio;

/// CPU use summed over phases.
#[derive(Clone, Debug, Default)]
pub(super) struct Pool {
    /// sum of wall x host CPUs, wall x vCPUs, wall.
    pub(super) machine: f64,
    pub(super) vcpu_wall: f64,
    pub(super) wall: f64,
    pub(super) vm: f64,
    pub(super) vcpu_each: Vec<f64>,
    /// (seconds, wall x host CPUs) of the phases that had a load.
    pub(super) load: Option<(f64, f64)>,
    /// (seconds, wall x workers) of the stress-ng `--cpu` workers.
    pub(super) hogs: (f64, f64),
    /// (seconds, wall x vCPUs) of the phases pvschedd reported on.
    pub(super) boosted: Option<(f64, f64)>,
    pub(super) budget_permille: Option<u32>,
    pub(super) busy: f64,
    /// (seconds, wall x host CPUs) of the phases pvschedd's time was read in.
    pub(super) daemon: Option<(f64, f64)>,
    /// pvschedd's seconds by thread name (over the phases in `daemon`).
    pub(super) daemon_threads: BTreeMap<String, f64>,
    /// (seconds, wall x host CPUs) of the phases with the guest's idle counters.
    pub(super) poll: Option<(f64, f64)>,
    pub(super) idle_drivers: Vec<String>,
    pub(super) phases: usize,
}

impl Pool {
    fn add(&mut self, u: &CpuUse) {
        let machine = u.wall_s * u.host_cpus.max(1) as f64;
        let vcpu_wall = u.wall_s * u.vcpu_s.len() as f64;
        self.machine += machine;
        self.vcpu_wall += vcpu_wall;
        self.wall += u.wall_s;
        self.vm += u.vm_s;
        if self.vcpu_each.len() < u.vcpu_s.len() {
            self.vcpu_each.resize(u.vcpu_s.len(), 0.0);
        }
        for (acc, v) in self.vcpu_each.iter_mut().zip(&u.vcpu_s) {
            *acc += v;
        }
        if let Some(l) = u.load_s {
            let (s, w) = self.load.get_or_insert((0.0, 0.0));
            *s += l;
            *w += machine;
        }
        self.hogs.0 += u.hog_s.iter().sum::<f64>();
        self.hogs.1 += u.wall_s * u.hog_s.len() as f64;
        if let Some(b) = u.boosted_s {
            let (s, w) = self.boosted.get_or_insert((0.0, 0.0));
            *s += b;
            *w += vcpu_wall;
        }
        self.budget_permille = self.budget_permille.or(u.boost_budget_permille);
        self.busy += u.busy_s;
        if let Some(d) = u.daemon_s {
            let (s, w) = self.daemon.get_or_insert((0.0, 0.0));
            *s += d;
            *w += machine;
            for (name, secs) in &u.daemon_threads_s {
                *self.daemon_threads.entry(name.clone()).or_insert(0.0) += secs;
            }
        }
        if let Some(p) = u.guest_poll_s {
            let (s, w) = self.poll.get_or_insert((0.0, 0.0));
            *s += p;
            *w += machine;
        }
        if let Some(d) = &u.guest_idle {
            if !self.idle_drivers.contains(d) {
                self.idle_drivers.push(d.clone());
            }
        }
        self.phases += 1;
    }

    fn pct(&self, secs: f64) -> f64 {
        pct_of(secs, self.machine)
    }

    fn vcpu(&self) -> f64 {
        self.vcpu_each.iter().sum()
    }
}

fn pct_of(secs: f64, wall: f64) -> f64 {
    if wall > 0.0 {
        round(secs / wall * 100.0, 100.0)
    } else {
        0.0
    }
}

fn round(v: f64, per: f64) -> f64 {
    (v * per).round() / per
}

fn round_ratio(r: Option<f64>) -> Option<f64> {
    r.map(|r| round(r, 1000.0))
}

/// Every repeat pooled, and each repeat's pool in repeat order, of the
/// measured phases of (load, mode).
fn pools(results: &Results, load: Load, mode: Mode) -> Option<(Pool, Vec<Pool>)> {
    let mut all = Pool::default();
    let mut per_rep: BTreeMap<usize, Pool> = BTreeMap::new();
    for ((l, _, m), runs) in &results.latency {
        if (*l, *m) != (load, mode) {
            continue;
        }
        for r in runs {
            if let Some(u) = &r.cpu {
                all.add(u);
                per_rep.entry(r.rep).or_default().add(u);
            }
        }
    }
    (all.phases > 0).then(|| (all, per_rep.into_values().collect()))
}

/// The entitlement under `load`, from vanilla's fair rate and static-rt's
/// demand; None when the fair rate is unknown (no vanilla phase, or no
/// stress-ng `--cpu` worker measured under load).
pub(super) fn entitlement(
    load: Load,
    vanilla: Option<&Pool>,
    static_rt: Option<&Pool>,
    vcpus: usize,
    host_cpus: usize,
) -> Option<Entitlement> {
    let (rate, from) = match load {
        Load::Idle => (
            1.0,
            "the idle host: no always-runnable competitor, a whole CPU".to_string(),
        ),
        Load::Loaded => {
            let v = vanilla?;
            if v.hogs.1 <= 0.0 {
                return None;
            }
            (
                (v.hogs.0 / v.hogs.1).min(1.0),
                "stress-ng's --cpu workers under vanilla".to_string(),
            )
        }
    };
    let demand: Option<Vec<f64>> = static_rt
        .filter(|p| p.wall > 0.0)
        .map(|p| p.vcpu_each.iter().map(|s| s / p.wall).collect());
    let cpus = match &demand {
        Some(d) => d.iter().map(|d| d.min(rate)).sum(),
        None => vcpus as f64 * rate,
    };
    Some(Entitlement {
        pct: round(cpus / host_cpus.max(1) as f64 * 100.0, 100.0),
        fair_rate_cpus: round(rate, 1000.0),
        fair_rate_from: from,
        upper_bound: demand.is_none(),
        demand_cpus: demand.map(|d| d.into_iter().map(|x| round(x, 1000.0)).collect()),
    })
}

/// The tables for `loads` (each load some mode has shares of); host
/// throughput ratios come from the scenarios.
pub fn build(
    results: &Results,
    loads: &[Load],
    modes: &[Mode],
    scenarios: &[Scenario],
) -> Vec<LoadShare> {
    let mut out = Vec::new();
    for &load in loads {
        let measured: BTreeMap<Mode, (Pool, Vec<Pool>)> = modes
            .iter()
            .filter_map(|&m| pools(results, load, m).map(|p| (m, p)))
            .collect();
        let Some(first) = results
            .latency
            .iter()
            .filter(|((l, _, _), _)| *l == load)
            .flat_map(|(_, runs)| runs.iter().filter_map(|r| r.cpu.as_ref()))
            .next()
        else {
            continue;
        };
        let (host_cpus, vcpus) = (first.host_cpus, first.vcpu_s.len());
        let vanilla = measured.get(&Mode::Vanilla).map(|p| &p.0);
        let e = entitlement(
            load,
            vanilla,
            measured.get(&Mode::StaticRt).map(|p| &p.0),
            vcpus,
            host_cpus,
        );
        let throughput = |m: Mode| {
            scenarios
                .iter()
                .find(|s| s.load == load.name())
                .and_then(|s| s.modes.get(m.name()))
                .and_then(|mr| mr.host_load.as_ref())
                .and_then(|h| h.vs_vanilla)
        };
        let mut rows = BTreeMap::new();
        for (&mode, (all, reps)) in &measured {
            let vm_pct = all.pct(all.vm);
            let vcpu_pct = all.pct(all.vcpu());
            let load_pct = all.load.map(|(s, w)| pct_of(s, w));
            rows.insert(
                mode.name().to_string(),
                ModeShare {
                    vm_pct,
                    vm_pct_per_repeat: reps.iter().map(|p| p.pct(p.vm)).collect(),
                    vcpu_pct,
                    vcpu_pct_per_repeat: reps.iter().map(|p| p.pct(p.vcpu())).collect(),
                    vm_vs_vanilla: round_ratio(
                        vanilla.and_then(|v| ratio(all.vm / all.machine, v.vm / v.machine)),
                    ),
                    vcpu_vs_entitlement: round_ratio(
                        e.as_ref().and_then(|e| ratio(all.pct(all.vcpu()), e.pct)),
                    ),
                    boosted_pct: all.boosted.map(|(s, w)| pct_of(s, w)),
                    boost_budget_pct: all
                        .boosted
                        .and(all.budget_permille)
                        .map(|p| f64::from(p) / 10.0),
                    load_pct,
                    load_cpu_vs_vanilla: round_ratio(
                        vanilla
                            .and_then(|v| v.load)
                            .zip(all.load)
                            .and_then(|((vs, vw), (s, w))| ratio(s / w, vs / vw)),
                    ),
                    load_throughput_vs_vanilla: throughput(mode),
                    busy_pct: all.pct(all.busy),
                    daemon_pct: all.daemon.map(|(s, w)| pct_of(s, w)),
                    daemon_threads_pct: all
                        .daemon
                        .map(|(_, w)| {
                            all.daemon_threads
                                .iter()
                                .map(|(name, s)| (name.clone(), pct_of(*s, w)))
                                .collect()
                        })
                        .unwrap_or_default(),
                    guest_poll_pct: all.poll.map(|(s, w)| pct_of(s, w)),
                    guest_idle: all.idle_drivers.clone(),
                    phases: all.phases,
                },
            );
        }
        let reading = reading(load, e.as_ref(), &rows);
        out.push(LoadShare {
            load: load.name().to_string(),
            host_cpus,
            vcpus,
            entitlement: e,
            modes: rows,
            reading,
        });
    }
    out
}

pub(super) fn times(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a".into(), |r| format!("{r:.2}x"))
}

/// Where the per-repeat vCPU shares lie against the entitlement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Within,
    Above,
    Mixed { above: usize, of: usize },
}

fn side(per_repeat: &[f64], limit: f64) -> Option<Side> {
    let above = per_repeat.iter().filter(|x| **x > limit).count();
    match (above, per_repeat.len()) {
        (_, 0) => None,
        (0, _) => Some(Side::Within),
        (a, n) if a == n => Some(Side::Above),
        (above, of) => Some(Side::Mixed { above, of }),
    }
}

/// The sentences under a load's table, from its numbers.
fn reading(load: Load, e: Option<&Entitlement>, rows: &BTreeMap<String, ModeShare>) -> Vec<String> {
    let get = |m: Mode| rows.get(m.name());
    let (pv, van, rt) = (get(Mode::Pvsched), get(Mode::Vanilla), get(Mode::StaticRt));
    let mut out = Vec::new();
    let Some(p) = pv else {
        out.push("pvsched did not run under this load: nothing to compare.".into());
        return out;
    };
    let static_rt = rt
        .map(|r| format!("; under static-rt {:.1} %", r.vm_pct))
        .unwrap_or_default();
    out.push(match van {
        Some(v) => format!(
            "Under pvsched the VM used {:.1} % of the machine ({:.1} % in its vCPU threads), \
             {} its share under vanilla ({:.1} %){static_rt}.",
            p.vm_pct,
            p.vcpu_pct,
            times(p.vm_vs_vanilla),
            v.vm_pct
        ),
        None => format!(
            "Under pvsched the VM used {:.1} % of the machine ({:.1} % in its vCPU threads){static_rt}; \
             vanilla did not run, so there is no share to compare it with.",
            p.vm_pct, p.vcpu_pct
        ),
    });
    let verdict = e.and_then(|e| side(&p.vcpu_pct_per_repeat, e.pct).map(|s| (e, s)));
    if let Some((e, s)) = verdict {
        let where_ = match s {
            Side::Within => "within it in every repeat".to_string(),
            Side::Above => format!(
                "above it in every repeat ({:+.1} points pooled)",
                p.vcpu_pct - e.pct
            ),
            Side::Mixed { above, of } => format!("above it in {above} of {of} repeats"),
        };
        let vanilla = van
            .map(|v| format!("; under vanilla {}", times(v.vcpu_vs_entitlement)))
            .unwrap_or_default();
        out.push(format!(
            "The fair-class entitlement of its vCPU threads is {:.1} % of the machine{}: under \
             pvsched they got {:.1} % ({} of it), {where_}{vanilla}.",
            e.pct,
            if e.upper_bound {
                " (an upper bound: static-rt did not run, so their demand is unknown)"
            } else {
                ""
            },
            p.vcpu_pct,
            times(p.vcpu_vs_entitlement),
        ));
        if load == Load::Idle && s != Side::Within {
            out.push(
                "On the idle host nothing competes for the CPUs, so the entitlement is the \
                 demand static-rt measured: a share above it is the guest using more CPU in \
                 this mode, which nobody waited for."
                    .into(),
            );
        }
    }
    if let Some(poll) = p.guest_poll_pct.filter(|x| *x > 0.0) {
        let others: Vec<String> = [Mode::Vanilla, Mode::StaticRt]
            .into_iter()
            .filter_map(|m| get(m).and_then(|r| r.guest_poll_pct.map(|x| format!("{m} {x:.1} %"))))
            .collect();
        out.push(format!(
            "Of the vCPU threads' time under pvsched, the guest's idle driver ({}) polled {poll:.1} \
             % of the machine{}.",
            p.guest_idle.join(", "),
            if others.is_empty() {
                String::new()
            } else {
                format!(" ({})", others.join(", "))
            }
        ));
    }
    if let Some(b) = p.boosted_pct {
        out.push(format!(
            "pvschedd kept them boosted {b:.1} % of their vCPU time{}.",
            p.boost_budget_pct
                .map(|x| format!(" (budget {x:.0} %)"))
                .unwrap_or_default()
        ));
    }
    if let Some(d) = p.daemon_pct {
        out.push(format!(
            "pvschedd's own process used {d:.2} % of the machine."
        ));
    }
    if let (Some(t), Some(l), Some(v)) = (p.load_throughput_vs_vanilla, p.load_pct, van) {
        let static_rt = rt
            .and_then(|r| r.load_throughput_vs_vanilla)
            .map(|x| format!(" ({:.1} % under static-rt)", x * 100.0))
            .unwrap_or_default();
        out.push(format!(
            "The host load kept {:.1} % of its vanilla throughput under pvsched{static_rt}; its CPU \
             share went from {} under vanilla to {l:.1} %, the VM's from {:.1} % to {:.1} %.",
            t * 100.0,
            v.load_pct
                .map_or_else(|| "n/a".to_string(), |x| format!("{x:.1} %")),
            v.vm_pct,
            p.vm_pct
        ));
        if t < 1.0 {
            if let Some((e, s)) = verdict {
                out.push(match s {
                    Side::Within => format!(
                        "So the throughput the host load lost under pvsched went to a guest \
                         getting no more than its fair-class share{}.",
                        if e.upper_bound { " (bound)" } else { "" }
                    ),
                    Side::Above => format!(
                        "So the guest took more than its fair-class share, {:.1} points of the \
                         machine beyond it, and the host load paid for it.",
                        p.vcpu_pct - e.pct
                    ),
                    Side::Mixed { .. } => "So the guest got about its fair-class share \
                                           (repeats on both sides of it) while the host load \
                                           lost throughput."
                        .to_string(),
                });
            }
        }
    }
    out
}

pub(super) fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.1}"))
}
