//! From the standard scenario's raw results to its report: merged
//! histograms per (load, interval, mode), each mode's figures, the ratios
//! between modes and the latency targets.

use std::collections::BTreeMap;

use super::fairness;
use super::model::*;
use super::report::*;
use crate::harness::axes::{Load, Mode};
use crate::harness::figures::{ratio, side};
use crate::harness::meta::Meta;
use crate::stats::Histogram;

/// Sums cumulative histograms with the same bounds and reads quantiles off
/// the result; None without samples.
pub fn reaction(histograms: &[&[(Option<f64>, u64)]]) -> Option<Reaction> {
    let first = histograms.iter().find(|h| !h.is_empty())?;
    let mut sum: Vec<(Option<f64>, u64)> = first.iter().map(|&(le, _)| (le, 0)).collect();
    let len = sum.len();
    for h in histograms.iter().filter(|h| h.len() == len) {
        for (acc, &(le, n)) in sum.iter_mut().zip(h.iter()) {
            if acc.0 == le {
                acc.1 += n;
            }
        }
    }
    let total = sum.last()?.1;
    if total == 0 {
        return None;
    }
    let quantile = |q: f64| {
        let want = ((q * total as f64).ceil() as u64).max(1);
        sum.iter()
            .find(|(_, n)| *n >= want)
            .and_then(|&(le, _)| le.map(|s| s * 1e6))
    };
    Some(Reaction {
        actions: total,
        p50_us: quantile(0.5),
        p90_us: quantile(0.9),
        p99_us: quantile(0.99),
        max_us: quantile(1.0),
    })
}

fn median(v: Vec<f64>) -> f64 {
    crate::stats::median(&v).unwrap_or(0.0)
}

fn geomean(v: &[f64]) -> Option<f64> {
    if v.is_empty() || v.iter().any(|x| *x <= 0.0) {
        return None;
    }
    Some((v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
}

/// Merged histograms of one (load, interval, mode): guest, host.
pub fn merged(results: &Results, load: Load, interval: u32, mode: Mode) -> (Histogram, Histogram) {
    let runs = results
        .latency
        .get(&(load, interval, mode))
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    (
        Histogram::merged(runs.iter().map(|r| &r.guest)),
        Histogram::merged(runs.iter().map(|r| &r.host)),
    )
}

fn mean_rates(results: &Results, load: Load, mode: Mode) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for s in results.sessions.get(&(load, mode)).into_iter().flatten() {
        for r in &s.load {
            let e = sums.entry(r.stressor.clone()).or_insert((0.0, 0));
            e.0 += r.ops_per_s;
            e.1 += 1;
        }
    }
    sums.into_iter()
        .map(|(k, (s, n))| (k, (s / n as f64 * 10.0).round() / 10.0))
        .collect()
}

fn mode_report(results: &Results, load: Load, interval: u32, mode: Mode) -> ModeReport {
    let runs = results
        .latency
        .get(&(load, interval, mode))
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let guest: Vec<&Histogram> = runs.iter().map(|r| &r.guest).collect();
    let host: Vec<&Histogram> = runs.iter().map(|r| &r.host).collect();
    let sessions = results
        .sessions
        .get(&(load, mode))
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let audios: Vec<_> = sessions.iter().filter_map(|s| s.audio.as_ref()).collect();
    let audio = (!audios.is_empty()).then(|| Audio {
        periods: audios.iter().map(|a| a.periods).sum(),
        glitches: audios.iter().map(|a| a.glitches).sum(),
        glitches_per_repeat: audios.iter().map(|a| a.glitches).collect(),
        period_us: audios[0].period_us,
        buffer_us: audios[0].buffer_us,
        late_max_us: audios.iter().map(|a| a.late_max_us).max().unwrap_or(0),
    });
    let pings: Vec<_> = sessions
        .iter()
        .filter_map(|s| s.pingpong.as_ref())
        .collect();
    let pingpong = (!pings.is_empty()).then(|| PingPong {
        p50_us: median(pings.iter().map(|p| p.p50_us).collect()),
        p99_us: median(pings.iter().map(|p| p.p99_us).collect()),
        p99_us_per_repeat: pings.iter().map(|p| p.p99_us).collect(),
        p50_us_per_repeat: pings.iter().map(|p| p.p50_us).collect(),
        round_trips: pings.iter().map(|p| p.round_trips).sum(),
    });
    let rates = mean_rates(results, load, mode);
    let host_load = (!rates.is_empty()).then(|| {
        let base = mean_rates(results, load, Mode::Vanilla);
        let rel: Vec<f64> = rates
            .iter()
            .filter_map(|(k, v)| base.get(k).and_then(|b| ratio(*v, *b)))
            .collect();
        HostLoad {
            vs_vanilla: if rel.len() == rates.len() {
                geomean(&rel).map(|g| (g * 1000.0).round() / 1000.0)
            } else {
                None
            },
            ops_per_s: rates,
        }
    });
    ModeReport {
        other_load_pct_per_repeat: runs
            .iter()
            .map(|r| (r.foreign_cpu * 1000.0).round() / 10.0)
            .collect(),
        guest: side(&guest, runs.iter().map(|r| r.guest_expected).sum()),
        host: side(&host, runs.iter().map(|r| r.host_expected).sum()),
        audio,
        pingpong,
        host_load,
        daemon: sessions
            .iter()
            .filter_map(|s| s.daemon_status.clone())
            .collect(),
        reaction: reaction(
            &sessions
                .iter()
                .map(|s| s.reaction.as_slice())
                .collect::<Vec<_>>(),
        ),
        reaction_wakeup: reaction(
            &sessions
                .iter()
                .map(|s| s.reaction_wakeup.as_slice())
                .collect::<Vec<_>>(),
        ),
        setattr: reaction(
            &sessions
                .iter()
                .map(|s| s.setattr.as_slice())
                .collect::<Vec<_>>(),
        ),
        interrupts: crate::interrupts::mean(
            &runs.iter().filter_map(|r| r.interrupts).collect::<Vec<_>>(),
        ),
        ipi_sources: crate::ipi_sources::mean(
            &runs
                .iter()
                .filter_map(|r| r.ipi_sources.as_ref())
                .collect::<Vec<_>>(),
        ),
        daemon_per_s: daemon_per_s(sessions),
    }
}

/// The pvsched mode's report of each load's first scenario (the
/// session-wide figures, such as the daemon's histograms, are the same in
/// every interval of a load).
pub(crate) fn pvsched_per_load(r: &Report) -> Vec<(&str, &ModeReport)> {
    let mut seen = std::collections::BTreeSet::new();
    r.scenarios
        .iter()
        .filter(|s| seen.insert(s.load.clone()))
        .filter_map(|s| {
            s.modes
                .get(Mode::Pvsched.name())
                .map(|m| (s.load.as_str(), m))
        })
        .collect()
}

/// The daemon's counters summed over `sessions`, per second of their daemons.
pub fn daemon_per_s(sessions: &[SessionRun]) -> BTreeMap<String, f64> {
    let seconds: f64 = sessions.iter().map(|s| s.daemon_seconds).sum();
    let mut out = BTreeMap::new();
    if seconds <= 0.0 {
        return out;
    }
    for s in sessions {
        for (k, v) in &s.daemon_counters {
            *out.entry(k.clone()).or_insert(0.0) += v / seconds;
        }
    }
    out
}

/// Ratios a / b of two modes' reports.
pub fn ratios(a: &ModeReport, b: &ModeReport) -> Ratios {
    let f = |x: u64| x as f64;
    Ratios {
        guest_avg: ratio(a.guest.summary.avg_us, b.guest.summary.avg_us),
        guest_p99: ratio(f(a.guest.summary.p99_us), f(b.guest.summary.p99_us)),
        guest_max: ratio(f(a.guest.summary.max_us), f(b.guest.summary.max_us)),
        host_avg: ratio(a.host.summary.avg_us, b.host.summary.avg_us),
        host_p99: ratio(f(a.host.summary.p99_us), f(b.host.summary.p99_us)),
        host_max: ratio(f(a.host.summary.max_us), f(b.host.summary.max_us)),
        glitches: match (&a.audio, &b.audio) {
            (Some(x), Some(y)) => ratio(f(x.glitches), f(y.glitches)),
            _ => None,
        },
        host_load: match (&a.host_load, &b.host_load) {
            (Some(x), Some(y)) => {
                let rel: Vec<f64> = x
                    .ops_per_s
                    .iter()
                    .filter_map(|(k, v)| y.ops_per_s.get(k).and_then(|w| ratio(*v, *w)))
                    .collect();
                geomean(&rel)
            }
            _ => None,
        },
    }
}

/// pvschedd with the guest doorbell (`pvsched`) against the same VM on its
/// recheck timer (`pvsched-timer`), per load where both modes ran: its CPU
/// share from the fairness tables `shares`, its wakeups from the load's
/// first scenario with both modes (session-wide figures, the same in every
/// interval of a load).
pub fn doorbell_vs_timer(scenarios: &[Scenario], shares: &[LoadShare]) -> Vec<DoorbellVsTimer> {
    let (with, without) = (Mode::Pvsched.name(), Mode::PvschedTimer.name());
    let mut seen = std::collections::BTreeSet::new();
    scenarios
        .iter()
        .filter_map(|s| Some((s, s.modes.get(with)?, s.modes.get(without)?)))
        .filter(|(s, _, _)| seen.insert(s.load.clone()))
        .map(|(s, doorbell, timer)| {
            let share = shares.iter().find(|l| l.load == s.load);
            let cost = |mode: &str, m: &ModeReport| {
                let per_s = |k: &str| m.daemon_per_s.get(k).copied();
                let causes = ["wakeups_records", "wakeups_timer", "wakeups_doorbell"];
                let known: Vec<f64> = causes.iter().filter_map(|k| per_s(k)).collect();
                DaemonCost {
                    cpu_pct: share
                        .and_then(|l| l.modes.get(mode))
                        .and_then(|x| x.daemon_pct),
                    wakeups_per_s: (!known.is_empty()).then(|| known.iter().sum()),
                    records_per_s: per_s("wakeups_records"),
                    timer_per_s: per_s("wakeups_timer"),
                    doorbell_per_s: per_s("wakeups_doorbell"),
                    rings_per_s: per_s("doorbell_rings"),
                    preempted_per_s: per_s("events_preempted"),
                }
            };
            let (doorbell, timer) = (cost(with, doorbell), cost(without, timer));
            let rounded = |a: Option<f64>, b: Option<f64>| {
                ratio(a?, b?).map(|r| (r * 1000.0).round() / 1000.0)
            };
            DoorbellVsTimer {
                load: s.load.clone(),
                cpu_ratio: rounded(doorbell.cpu_pct, timer.cpu_pct),
                wakeups_ratio: rounded(doorbell.wakeups_per_s, timer.wakeups_per_s),
                timer_wakeups_ratio: rounded(doorbell.timer_per_s, timer.timer_per_s),
                doorbell,
                timer,
            }
        })
        .collect()
}

/// The targets of each pvsched mode that ran (the sched_ext backend's and
/// the one without the doorbell named as such).
pub fn targets(s: &Scenario) -> Vec<Target> {
    let mut out = Vec::new();
    for mode in [
        Mode::Pvsched,
        Mode::PvschedTimer,
        Mode::PvschedScx,
        Mode::PvschedScxLock,
    ] {
        mode_targets(s, mode, &mut out);
    }
    out
}

fn mode_targets(s: &Scenario, mode: Mode, out: &mut Vec<Target>) {
    let Some(pv) = s.modes.get(mode.name()) else {
        return;
    };
    for (what, which, other, allowed) in TARGETS {
        let Some(o) = s.modes.get(other.name()) else {
            continue;
        };
        let (v, w) = if which == "guest" {
            (pv.guest.summary.p99_us, o.guest.summary.p99_us)
        } else {
            (pv.host.summary.p99_us, o.host.summary.p99_us)
        };
        let Some(r) = ratio(v as f64, w as f64) else {
            continue;
        };
        out.push(Target {
            load: s.load.clone(),
            interval_us: s.interval_us,
            what: if mode == Mode::Pvsched {
                what.to_string()
            } else {
                what.replace("pvsched", mode.name())
            },
            value_us: v,
            limit_us: (w as f64 * allowed * 10.0).round() / 10.0,
            ratio: (r * 1000.0).round() / 1000.0,
            allowed_ratio: allowed,
            met: r <= allowed + 1e-9,
        });
    }
}

/// Builds the report. Scenarios in (load, interval) order of the settings;
/// targets for the loaded host.
pub fn build(
    results: &Results,
    meta: Meta,
    loads: &[Load],
    intervals: &[u32],
    modes: &[Mode],
) -> Report {
    let mut scenarios = Vec::new();
    let mut all_targets = Vec::new();
    for &load in loads {
        for &interval in intervals {
            let mut s = Scenario {
                load: load.name().to_string(),
                load_cmd: (load == Load::Loaded).then(|| meta.load_cmd.clone()),
                interval_us: interval,
                duration_s: meta.duration_s,
                repeat: meta.repeat,
                ..Default::default()
            };
            for &mode in modes {
                if results.latency.contains_key(&(load, interval, mode)) {
                    s.modes.insert(
                        mode.name().to_string(),
                        mode_report(results, load, interval, mode),
                    );
                }
            }
            for (a, b) in PAIRS {
                if let (Some(x), Some(y)) = (s.modes.get(a.name()), s.modes.get(b.name())) {
                    s.ratios.insert(format!("{a}/{b}"), ratios(x, y));
                }
            }
            if load == Load::Loaded {
                all_targets.extend(targets(&s));
            }
            scenarios.push(s);
        }
    }
    let fair_share = fairness::analysis::build(results, loads, modes, &scenarios);
    Report {
        schema: "pvsched-bench/1".into(),
        meta,
        doorbell_vs_timer: doorbell_vs_timer(&scenarios, &fair_share),
        fair_share,
        scenarios,
        targets: all_targets,
        plots: Vec::new(),
        modcost: None,
        simulated: None,
        host_cost_targets: Vec::new(),
    }
}

/// Modes in the canonical order (vanilla, static-rt, pvsched, pvsched-timer,
/// pvsched-scx).
pub fn ordered(modes: &BTreeMap<String, ModeReport>) -> Vec<(&str, &ModeReport)> {
    Mode::EVERY
        .iter()
        .filter_map(|m| modes.get(m.name()).map(|r| (m.name(), r)))
        .collect()
}
