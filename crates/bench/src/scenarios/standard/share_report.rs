//! The report's eventual-fairness tables: per load and mode, the VM's CPU
//! share over the cyclictest phases against its share under vanilla and
//! against the fair-class entitlement of its vCPU threads, the share
//! pvschedd kept them boosted, and the host load's CPU share and throughput
//! beside it; then sentences computed from those numbers that read them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::model::*;
use super::report::*;
use super::share::CpuUse;
use crate::harness::axes::{Load, Mode};
use crate::harness::figures::ratio;

/// How the shares are made (printed under the section's title).
pub const DEFINITION: &str = "Over the cyclictest phases of each session (the bulk of it; \
    audio and ping-pong are not included), CPU time / (phase wall time x host CPUs), from /proc: \
    the QEMU process (utime + stime of every thread, exited ones included; split into its vCPU \
    threads, `/proc/<pid>/task/<tid>/stat`, and the rest: the main loop, I/O threads), \
    stress-ng's process tree (reaped children included) and the machine's busy time \
    (`/proc/stat`, steal included; what busy leaves beside VM and load is the cyclictests, \
    pvschedd, the bench, kernel threads and other jobs); in the pvsched mode pvschedd's own \
    process (utime + stime of its threads, *pvschedd %*). Per repeat: that repeat's phases pooled; \
    the other columns pool every repeat. *vs vanilla*: this mode's pooled share / vanilla's. \
    *boosted*: the vCPU time pvschedd counted as boosted and not halted (its status `boosted_s`, \
    the difference over each phase) / (wall x vCPUs), beside the budget it enforces \
    (`boost_share_permille`, banked over `fairness_window_ns`). *host load throughput*: \
    stress-ng's bogo-ops/s over the whole session (geometric mean over the stressors) / \
    vanilla's.";

/// What the entitlement is (printed once, under [`DEFINITION`]).
pub const ENTITLEMENT_DEFINITION: &str = "*Fair-class entitlement* of the vCPU threads = \
    sum over the vCPU threads of min(d_i, r) / host CPUs: d_i is the CPU rate vCPU thread i \
    used under static-rt under the same load (at RT nothing preempts it, so it runs whenever it \
    is runnable: its demand), r the CPU rate the fair class gave an always-runnable nice-0 \
    thread under vanilla in the same run (the mean of stress-ng's `--cpu` workers; on the idle \
    host, with no such competitor, a whole CPU). Assumed: every thread has the same weight \
    (nice 0, as QEMU and stress-ng run), the guest wants the same CPU in every mode, and the \
    fair class shares max-min (a thread wanting less than r takes what it wants, the others \
    share the rest equally). Without static-rt the demand is unknown and the entitlement is an \
    upper bound (vCPUs x r). Under vanilla the vCPU threads got what the fair class gave them, \
    which is the other yardstick (*vs vanilla*).";

/// CPU use summed over phases.
#[derive(Clone, Debug, Default)]
struct Pool {
    /// sum of wall x host CPUs, wall x vCPUs, wall.
    machine: f64,
    vcpu_wall: f64,
    wall: f64,
    vm: f64,
    vcpu_each: Vec<f64>,
    /// (seconds, wall x host CPUs) of the phases that had a load.
    load: Option<(f64, f64)>,
    /// (seconds, wall x workers) of the stress-ng `--cpu` workers.
    hogs: (f64, f64),
    /// (seconds, wall x vCPUs) of the phases pvschedd reported on.
    boosted: Option<(f64, f64)>,
    budget_permille: Option<u32>,
    busy: f64,
    /// (seconds, wall x host CPUs) of the phases pvschedd's time was read in.
    daemon: Option<(f64, f64)>,
    /// (seconds, wall x host CPUs) of the phases with the guest's idle counters.
    poll: Option<(f64, f64)>,
    idle_drivers: Vec<String>,
    phases: usize,
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
fn entitlement(
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

fn times(r: Option<f64>) -> String {
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

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.1}"))
}

/// The section of report.md; nothing when no phase was measured (a
/// raw.json from before the shares).
pub fn markdown(o: &mut String, shares: &[LoadShare]) {
    if shares.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\n## Eventual fairness: CPU shares over the cyclictest phases\n"
    );
    let _ = writeln!(o, "{DEFINITION}\n");
    let _ = writeln!(o, "{ENTITLEMENT_DEFINITION}");
    for ls in shares {
        let _ = writeln!(
            o,
            "\n### {} host ({} CPUs, {} vCPUs)\n",
            ls.load, ls.host_cpus, ls.vcpus
        );
        let _ = writeln!(
            o,
            "| mode | VM CPU % per repeat | VM % (vCPU threads + rest) | VM vs vanilla | vCPUs vs entitlement | boosted % of vCPU time (budget) | guest idle polling % (driver) | host load CPU % | host load CPU vs vanilla | host load throughput vs vanilla | pvschedd % | machine busy % |"
        );
        let _ = writeln!(o, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
        for m in Mode::ALL {
            let Some(r) = ls.modes.get(m.name()) else {
                continue;
            };
            let boosted = match (r.boosted_pct, r.boost_budget_pct) {
                (Some(b), Some(x)) => format!("{b:.1} ({x:.0})"),
                (Some(b), None) => format!("{b:.1}"),
                _ => String::new(),
            };
            let poll = match r.guest_poll_pct {
                Some(x) => format!("{x:.1} ({})", r.guest_idle.join(", ")),
                None => "n/a".into(),
            };
            let _ = writeln!(
                o,
                "| {} | {} | {:.1} ({:.1} + {:.1}) | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
                m.name(),
                r.vm_pct_per_repeat
                    .iter()
                    .map(|p| format!("{p:.1}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                r.vm_pct,
                r.vcpu_pct,
                r.vm_pct - r.vcpu_pct,
                times(r.vm_vs_vanilla),
                times(r.vcpu_vs_entitlement),
                boosted,
                poll,
                pct(r.load_pct),
                times(r.load_cpu_vs_vanilla),
                r.load_throughput_vs_vanilla
                    .map_or_else(|| "n/a".into(), |t| format!("{:.1} %", t * 100.0)),
                r.daemon_pct.map_or_else(String::new, |d| format!("{d:.2}")),
                r.busy_pct
            );
        }
        match &ls.entitlement {
            Some(e) => {
                let demand = e.demand_cpus.as_ref().map_or_else(
                    || "d_i unknown (static-rt did not run)".to_string(),
                    |d| {
                        format!(
                            "d = [{}] CPUs (static-rt)",
                            d.iter()
                                .map(|x| format!("{x:.3}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    },
                );
                let _ =
                    writeln!(
                    o,
                    "\nEntitlement of the vCPU threads: {:.1} % of the machine{} (r = {:.3} CPUs, \
                     from {}; {demand}).",
                    e.pct,
                    if e.upper_bound { ", an upper bound" } else { "" },
                    e.fair_rate_cpus,
                    e.fair_rate_from
                );
            }
            None => {
                let _ = writeln!(
                    o,
                    "\nEntitlement of the vCPU threads: not computed (no vanilla phase with \
                     stress-ng's --cpu workers measured under this load)."
                );
            }
        }
        if !ls.reading.is_empty() {
            let _ = writeln!(o, "\n{}", ls.reading.join(" "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A phase of 10 s on 2 CPUs: VM `vm` CPU-s of which each vCPU `vcpu`,
    /// the load `load`, one `--cpu` worker `hog`, pvschedd's `boosted`
    /// (and, when boosted, 0.4 CPU-s of pvschedd's own).
    fn phase(vm: f64, vcpu: f64, load: f64, hog: f64, boosted: Option<f64>) -> CpuUse {
        CpuUse {
            wall_s: 10.0,
            host_cpus: 2,
            vm_s: vm,
            vcpu_s: vec![vcpu, vcpu],
            load_s: Some(load),
            hog_s: vec![hog, hog],
            busy_s: 19.0,
            boosted_s: boosted,
            boost_budget_permille: boosted.map(|_| 200),
            daemon_s: boosted.map(|_| 0.4),
            // pvsched (boosted) polls 1 s of the 20 in the guest's idle driver.
            guest_poll_s: Some(if boosted.is_some() { 1.0 } else { 0.0 }),
            guest_idle: Some(
                if boosted.is_some() {
                    "hinted"
                } else {
                    "none (auto)"
                }
                .into(),
            ),
        }
    }

    fn add(r: &mut Results, mode: Mode, rep: usize, u: CpuUse) {
        r.latency
            .entry((Load::Loaded, 1000, mode))
            .or_default()
            .push(LatencyRun {
                rep,
                cpu: Some(u),
                ..Default::default()
            });
    }

    fn scenario(throughput: &[(Mode, f64)]) -> Scenario {
        Scenario {
            load: "loaded".into(),
            modes: throughput
                .iter()
                .map(|&(m, t)| {
                    (
                        m.name().to_string(),
                        ModeReport {
                            host_load: Some(HostLoad {
                                vs_vanilla: Some(t),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                    )
                })
                .collect(),
            ..Default::default()
        }
    }

    /// vanilla: VM 4 CPU-s of 20 (20 %), vCPUs 1.5 + 1.5, hogs at 0.3 CPUs;
    /// static-rt: vCPUs 4 + 4 (demand 0.4 CPUs each); pvsched: two repeats.
    fn sample(pv_vcpu: [f64; 2]) -> Vec<LoadShare> {
        let mut r = Results::default();
        add(&mut r, Mode::Vanilla, 1, phase(4.0, 1.5, 12.0, 3.0, None));
        add(&mut r, Mode::StaticRt, 1, phase(9.0, 4.0, 8.0, 2.0, None));
        for (rep, v) in pv_vcpu.into_iter().enumerate() {
            add(
                &mut r,
                Mode::Pvsched,
                rep + 1,
                phase(2.0 * v + 1.0, v, 10.0, 2.5, Some(3.0)),
            );
        }
        build(
            &r,
            &[Load::Idle, Load::Loaded],
            &Mode::ALL,
            &[scenario(&[
                (Mode::Vanilla, 1.0),
                (Mode::StaticRt, 0.7),
                (Mode::Pvsched, 0.9),
            ])],
        )
    }

    #[test]
    fn shares_ratios_and_the_entitlement_are_computed_from_the_phases() {
        // Act: pvsched's vCPUs at 2.0 and 2.5 CPU-s per thread per repeat.
        let t = sample([2.0, 2.5]);

        // Assert: the idle load had no phases: no table.
        assert_eq!(t.len(), 1);
        let ls = &t[0];
        assert_eq!((ls.load.as_str(), ls.host_cpus, ls.vcpus), ("loaded", 2, 2));
        // r = 3 CPU-s / 10 s = 0.3 CPUs; d = 0.4 each: sum of min = 0.6 of 2 CPUs.
        let e = ls.entitlement.as_ref().unwrap();
        assert_eq!(e.fair_rate_cpus, 0.3);
        assert_eq!(e.demand_cpus, Some(vec![0.4, 0.4]));
        assert!(!e.upper_bound);
        assert_eq!(e.pct, 30.0);
        let van = &ls.modes["vanilla"];
        assert_eq!(van.vm_pct, 20.0);
        assert_eq!(van.vcpu_pct, 15.0);
        assert_eq!(van.vm_vs_vanilla, Some(1.0));
        assert_eq!(van.vcpu_vs_entitlement, Some(0.5));
        assert_eq!(van.load_pct, Some(60.0));
        assert_eq!(van.busy_pct, 95.0);
        let pv = &ls.modes["pvsched"];
        // Repeats: VM 5 and 6 CPU-s of 20; pooled 11 of 40.
        assert_eq!(pv.vm_pct_per_repeat, vec![25.0, 30.0]);
        assert_eq!(pv.vm_pct, 27.5);
        assert_eq!(pv.vcpu_pct_per_repeat, vec![20.0, 25.0]);
        assert_eq!(pv.vm_vs_vanilla, Some(1.375));
        assert_eq!(pv.vcpu_vs_entitlement, Some(0.75));
        // 6 boosted vCPU-s of 2 x 10 s x 2 vCPUs.
        assert_eq!(pv.boosted_pct, Some(15.0));
        assert_eq!(pv.boost_budget_pct, Some(20.0));
        assert_eq!(pv.load_pct, Some(50.0));
        assert_eq!(pv.load_cpu_vs_vanilla, Some(0.833));
        assert_eq!(pv.load_throughput_vs_vanilla, Some(0.9));
        assert_eq!(pv.phases, 2);
        assert_eq!(ls.modes["static-rt"].boosted_pct, None);
    }

    #[test]
    fn the_reading_says_within_or_above_the_entitlement_from_the_numbers() {
        // Within: 20 % and 25 % against 30 %.
        let within = sample([2.0, 2.5]).remove(0).reading.join(" ");
        for needle in [
            "Under pvsched the VM used 27.5 % of the machine (22.5 % in its vCPU threads), 1.38x its share under vanilla (20.0 %); under static-rt 45.0 %.",
            "is 30.0 % of the machine: under pvsched they got 22.5 % (0.75x of it), within it in every repeat; under vanilla 0.50x.",
            "boosted 15.0 % of their vCPU time (budget 20 %)",
            "the guest's idle driver (hinted) polled 5.0 % of the machine (vanilla 0.0 %, static-rt 0.0 %)",
            "kept 90.0 % of its vanilla throughput under pvsched (70.0 % under static-rt)",
            "went from 60.0 % under vanilla to 50.0 %, the VM's from 20.0 % to 27.5 %",
            "no more than its fair-class share",
        ] {
            assert!(within.contains(needle), "{needle:?} not in {within}");
        }

        // Above in every repeat: 35 % and 40 %; mixed: 20 % and 40 %.
        let above = sample([3.5, 4.0]).remove(0).reading.join(" ");
        assert!(
            above.contains("above it in every repeat (+7.5 points pooled)"),
            "{above}"
        );
        assert!(
            above.contains("more than its fair-class share, 7.5 points"),
            "{above}"
        );
        let mixed = sample([2.0, 4.0]).remove(0).reading.join(" ");
        assert!(mixed.contains("above it in 1 of 2 repeats"), "{mixed}");
        assert!(mixed.contains("about its fair-class share"), "{mixed}");
    }

    #[test]
    fn without_static_rt_the_entitlement_is_an_upper_bound_and_without_vanilla_none() {
        // Arrange
        let mut r = Results::default();
        add(&mut r, Mode::Vanilla, 1, phase(4.0, 1.5, 12.0, 3.0, None));
        add(
            &mut r,
            Mode::Pvsched,
            1,
            phase(5.0, 2.0, 10.0, 2.5, Some(3.0)),
        );

        // Act
        let t = build(&r, &[Load::Loaded], &Mode::ALL, &[]);
        r.latency.remove(&(Load::Loaded, 1000, Mode::Vanilla));
        let none = build(&r, &[Load::Loaded], &Mode::ALL, &[]);

        // Assert: 2 vCPUs x 0.3 CPUs of 2 CPUs.
        let e = t[0].entitlement.as_ref().unwrap();
        assert!(e.upper_bound);
        assert_eq!(e.pct, 30.0);
        assert!(t[0].reading.join(" ").contains("an upper bound"));
        assert!(none[0].entitlement.is_none());
        assert!(none[0].reading[0].contains("vanilla did not run"));
    }

    #[test]
    fn on_the_idle_host_a_share_above_the_demand_is_read_as_the_guest_using_more() {
        // Arrange: static-rt's vCPUs 1 CPU-s each in 10 s (10 % of 2 CPUs),
        // pvsched's 2 each (20 %); no host load.
        let mut r = Results::default();
        for (mode, vcpu) in [
            (Mode::Vanilla, 1.0),
            (Mode::StaticRt, 1.0),
            (Mode::Pvsched, 2.0),
        ] {
            let mut u = phase(2.0 * vcpu, vcpu, 0.0, 0.0, None);
            (u.load_s, u.hog_s) = (None, Vec::new());
            r.latency
                .entry((Load::Idle, 1000, mode))
                .or_default()
                .push(LatencyRun {
                    rep: 1,
                    cpu: Some(u),
                    ..Default::default()
                });
        }

        // Act
        let t = build(&r, &[Load::Idle], &Mode::ALL, &[]);

        // Assert
        let text = t[0].reading.join(" ");
        assert_eq!(t[0].entitlement.as_ref().unwrap().pct, 10.0);
        assert!(
            text.contains("above it in every repeat (+10.0 points pooled)"),
            "{text}"
        );
        assert!(text.contains("nobody waited for"), "{text}");
        assert!(!text.contains("host load"), "{text}");
        assert_eq!(t[0].modes["pvsched"].load_pct, None);
    }

    #[test]
    fn the_idle_host_entitles_the_vcpus_to_their_demand() {
        let p = Pool {
            wall: 10.0,
            vcpu_each: vec![3.0, 1.0],
            ..Default::default()
        };
        let e = entitlement(Load::Idle, None, Some(&p), 2, 2).unwrap();
        assert_eq!(e.fair_rate_cpus, 1.0);
        assert_eq!(e.pct, 20.0);
    }

    #[test]
    fn a_raw_json_from_before_the_shares_reads_and_has_no_table() {
        // Arrange: a phase as raw.json kept it before `cpu` existed.
        let mut before = Results::default();
        before
            .latency
            .entry((Load::Loaded, 1000, Mode::Vanilla))
            .or_default()
            .push(LatencyRun::default());
        let mut old = serde_json::to_value(&before).unwrap();
        let entry = &mut old["latency"]["loaded/1000/vanilla"][0];
        assert!(entry.as_object_mut().unwrap().remove("cpu").is_none());
        assert!(entry["guest_expected"].is_number());

        // Act
        let r: Results = serde_json::from_value(old).unwrap();
        let t = build(&r, &[Load::Loaded], &Mode::ALL, &[]);

        // Assert
        assert!(r.latency[&(Load::Loaded, 1000, Mode::Vanilla)][0]
            .cpu
            .is_none());
        assert!(t.is_empty());
        let mut with = Results::default();
        add(
            &mut with,
            Mode::Vanilla,
            1,
            phase(4.0, 1.5, 12.0, 3.0, None),
        );
        let text = serde_json::to_string(&with).unwrap();
        let back: Results = serde_json::from_str(&text).unwrap();
        assert_eq!(
            back.latency[&(Load::Loaded, 1000, Mode::Vanilla)][0].cpu,
            with.latency[&(Load::Loaded, 1000, Mode::Vanilla)][0].cpu
        );
    }

    #[test]
    fn markdown_has_a_table_per_load_and_nothing_without_shares() {
        // Act
        let mut md = String::new();
        markdown(&mut md, &sample([2.0, 2.5]));
        let mut empty = String::new();
        markdown(&mut empty, &[]);

        // Assert
        for needle in [
            "## Eventual fairness",
            "### loaded host (2 CPUs, 2 vCPUs)",
            "| vanilla | 20.0 | 20.0 (15.0 + 5.0) | 1.00x | 0.50x |  | 0.0 (none (auto)) | 60.0 | 1.00x | 100.0 % |  | 95.0 |",
            "| pvsched | 25.0, 30.0 | 27.5 (22.5 + 5.0) | 1.38x | 0.75x | 15.0 (20) | 5.0 (hinted) | 50.0 | 0.83x | 90.0 % | 2.00 | 95.0 |",
            "r = 0.300 CPUs, from stress-ng's --cpu workers under vanilla; d = [0.400, 0.400] CPUs",
        ] {
            assert!(md.contains(needle), "{needle:?} not in\n{md}");
        }
        assert!(empty.is_empty());
    }
}
