//! From raw results to the report: JSON (the simulator's shape), Markdown,
//! ratios and targets.
//!
//! JSON shape, one scenario per (load, interval):
//! `{load, load_cmd, interval_us, duration_s, repeat,
//!   modes: {<mode>: {guest: {avg_us, p50_us, p99_us, p999_us, max_us, ...},
//!                    host: {...}, audio, pingpong, host_load}},
//!   ratios: {"pvsched/static-rt": {...}, "pvsched/vanilla": {...}, ...}}`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::harness::axes::{Load, Mode};
use crate::harness::figures::{join, ratio, side, Side};
use crate::harness::meta::Meta;
use crate::model::Results;
use crate::share_report::{self, LoadShare};
use crate::stats::Histogram;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Audio {
    pub periods: u64,
    pub glitches: u64,
    pub glitches_per_repeat: Vec<u64>,
    pub period_us: u64,
    pub buffer_us: u64,
    /// Worst scheduling delay over the repeats.
    pub late_max_us: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PingPong {
    /// Medians over the repeats of each repeat's p50 / p99 round trip.
    pub p50_us: f64,
    pub p99_us: f64,
    pub p99_us_per_repeat: Vec<f64>,
    /// Each repeat's p50, in run order (absent from older reports).
    #[serde(default)]
    pub p50_us_per_repeat: Vec<f64>,
    pub round_trips: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostLoad {
    /// Mean over the repeats of each stressor's bogo ops per second.
    pub ops_per_s: BTreeMap<String, f64>,
    /// Geometric mean over the stressors of (this mode / vanilla).
    pub vs_vanilla: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModeReport {
    pub guest: Side,
    pub host: Side,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audio: Option<Audio>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pingpong: Option<PingPong>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_load: Option<HostLoad>,
    /// Percent of the machine's CPU time taken by processes outside the
    /// bench during each repeat's cyclictest (shared machine, steal).
    #[serde(default)]
    pub other_load_pct_per_repeat: Vec<f64>,
    /// pvsched only: boosts / throttles the daemon reported, per repeat.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub daemon: Vec<Value>,
    /// pvsched only: the daemon's reaction latency over every repeat.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reaction: Option<Reaction>,
    /// pvsched only: of a reaction, event -> event thread awake, and one
    /// `sched_setattr`; same form.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reaction_wakeup: Option<Reaction>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub setattr: Option<Reaction>,
    /// The host's interrupts per second, mean over this interval's phases.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub interrupts: Option<crate::interrupts::Rates>,
    /// The host's IPIs per second by cause and sender, mean over this
    /// interval's phases.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ipi_sources: Option<crate::ipi_sources::Sources>,
    /// pvsched only: the daemon's counters per second of its sessions
    /// (`model::DAEMON_COUNTERS` keys).
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub daemon_per_s: BTreeMap<String, f64>,
}

/// pvschedd's reaction latency (host event timestamp -> `sched_setattr`
/// returned, for the changes an event caused; its metrics' histogram, summed
/// over the repeats): bucket upper bounds, µs (`None`: above the last bound).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Reaction {
    pub actions: u64,
    pub p50_us: Option<f64>,
    pub p90_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// The highest non-empty bucket's bound.
    pub max_us: Option<f64>,
}

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

/// a / b for the numbers a reader compares; None when b is 0 or missing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Ratios {
    pub guest_avg: Option<f64>,
    pub guest_p99: Option<f64>,
    pub guest_max: Option<f64>,
    pub host_avg: Option<f64>,
    pub host_p99: Option<f64>,
    pub host_max: Option<f64>,
    pub glitches: Option<f64>,
    pub host_load: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    pub load: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_cmd: Option<String>,
    pub interval_us: u32,
    pub duration_s: u64,
    pub repeat: usize,
    pub modes: BTreeMap<String, ModeReport>,
    pub ratios: BTreeMap<String, Ratios>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub load: String,
    pub interval_us: u32,
    pub what: String,
    /// pvsched's value and the limit it is held to (µs).
    pub value_us: u64,
    pub limit_us: f64,
    /// pvsched / the other mode.
    pub ratio: f64,
    /// The ratio the target allows.
    pub allowed_ratio: f64,
    pub met: bool,
}

impl Target {
    pub fn verdict(&self) -> String {
        if self.met {
            format!("met ({:.2}x, limit {:.2}x)", self.ratio, self.allowed_ratio)
        } else {
            format!(
                "MISSED by {:.0} % ({:.2}x, limit {:.2}x)",
                (self.ratio / self.allowed_ratio - 1.0) * 100.0,
                self.ratio,
                self.allowed_ratio
            )
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub schema: String,
    pub meta: Meta,
    pub scenarios: Vec<Scenario>,
    pub targets: Vec<Target>,
    /// PNG files, relative to the output directory.
    pub plots: Vec<String>,
    /// Eventual fairness: per load, the VM's CPU share per mode against
    /// vanilla and its fair-class entitlement, with the host load beside it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fair_share: Vec<LoadShare>,
    /// The guest module's overhead on `perf bench sched pipe` (the phase ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modcost: Option<crate::modcost::ModCostReport>,
    /// The same policy under KVM, simulated (the loaded host ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated: Option<crate::simulated::Simulated>,
    /// The host-cost targets with what remains where missed (read off the
    /// rest of the report).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_cost_targets: Vec<crate::host_cost_targets::HostCostTarget>,
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

/// What the host pays per mode beyond CPU time (interrupts, the daemon's
/// wakeups by cause), and where a reaction's time goes.
fn host_costs_markdown(o: &mut String, r: &Report) {
    let rows: Vec<(&Scenario, &str, &ModeReport)> = r
        .scenarios
        .iter()
        .flat_map(|s| s.modes.iter().map(move |(m, x)| (s, m.as_str(), x)))
        .filter(|(_, _, x)| x.interrupts.is_some())
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\n## What the host pays besides CPU time (cyclictest phases)\n\n\
         The host's interrupts per second over the phases (`/proc/interrupts`, both CPUs: \
         local timer, rescheduling IPIs, function-call IPIs; on a machine that is itself a VM \
         each is an exit to the outer hypervisor), beside the host's cyclictest p99; for \
         pvsched, its event thread's wakeups per second by cause (records, its timer, a guest \
         doorbell) and the doorbell rings, over its whole sessions.\n"
    );
    let _ = writeln!(
        o,
        "| load | interval | mode | host p99 µs | timer irq/s | resched IPI/s | call IPI/s | \
         daemon wakeups/s: records / timer / doorbell | rings/s |"
    );
    let _ = writeln!(o, "|---|---|---|--:|--:|--:|--:|---|--:|");
    for (s, mode, x) in rows {
        let Some(i) = x.interrupts else { continue };
        let d = |k: &str| x.daemon_per_s.get(k).copied();
        let (wakeups, rings) = if x.daemon_per_s.is_empty() {
            ("".to_string(), "".to_string())
        } else {
            let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
            (
                format!(
                    "{} / {} / {}",
                    f(d("wakeups_records")),
                    f(d("wakeups_timer")),
                    f(d("wakeups_doorbell"))
                ),
                f(d("doorbell_rings")),
            )
        };
        let _ = writeln!(
            o,
            "| {} | {} µs | {mode} | {} | {:.0} | {:.0} | {:.0} | {wakeups} | {rings} |",
            s.load, s.interval_us, x.host.summary.p99_us, i.local_timer, i.resched, i.call
        );
    }
    ipi_sources_markdown(o, r);
    let breakdown: Vec<(&str, &ModeReport)> = pvsched_per_load(r)
        .into_iter()
        .filter(|(_, m)| m.reaction.is_some())
        .collect();
    if breakdown.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\nWhere a reaction's time goes (pvschedd's histograms, bucket upper bounds, µs): the \
         whole reaction; its first part, host event -> the event thread awake \
         (`pvsched_reaction_wakeup_seconds`: the BPF ring's wakeup and the host scheduler \
         running a SCHED_FIFO thread); and one `sched_setattr` call \
         (`pvsched_setattr_seconds`). The rest is the daemon's own work.\n"
    );
    let _ = writeln!(
        o,
        "| load | reactions | p50 / p99 | event -> awake p50 / p99 | sched_setattr p50 / p99 |"
    );
    let _ = writeln!(o, "|---|--:|---|---|---|");
    let b = |v: Option<f64>| v.map_or("> 20000".into(), |v| format!("{v:.0}"));
    let pair = |x: &Option<Reaction>| {
        x.as_ref()
            .map_or("-".into(), |x| format!("{} / {}", b(x.p50_us), b(x.p99_us)))
    };
    for (load, m) in breakdown {
        let _ = writeln!(
            o,
            "| {load} | {} | {} | {} | {} |",
            m.reaction.as_ref().map_or(0, |x| x.actions),
            pair(&m.reaction),
            pair(&m.reaction_wakeup),
            pair(&m.setattr)
        );
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

/// Where each pvsched session's boost budget went, from pvschedd's status at
/// its end: boosted time by reason, the latches and their length, refusals.
fn budget_markdown(o: &mut String, r: &Report) {
    let rows: Vec<(&str, usize, &Value)> = pvsched_per_load(r)
        .into_iter()
        .flat_map(|(load, m)| {
            m.daemon.iter().enumerate().flat_map(move |(i, d)| {
                d["vms"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(move |vm| (load, i + 1, vm))
            })
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(o, "\n## pvschedd's boost budget, per session\n");
    let _ = writeln!(
        o,
        "From pvschedd's status at the end of each pvsched session (every phase of it): \
         boosted vCPU time (on a CPU) by the reason in force, ms; demoted ms (charged \
         `demoted_charge` times); the times the budget latched and how long it stayed \
         latched; boosts refused for budget.\n"
    );
    let _ = writeln!(
        o,
        "| load | session | boosted s | by reason (ms) | demoted ms | latches | latched ms | refused |"
    );
    let _ = writeln!(o, "|---|--:|--:|---|--:|--:|--:|--:|");
    let f = |vm: &Value, k: &str| vm[k].as_f64().unwrap_or(0.0);
    for (load, i, vm) in rows {
        let mut by: Vec<(String, f64)> = vm["boosted_ms_by_reason"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_f64().unwrap_or(0.0)))
                    .collect()
            })
            .unwrap_or_default();
        by.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let by: Vec<String> = by.iter().map(|(k, v)| format!("{k} {v:.0}")).collect();
        let _ = writeln!(
            o,
            "| {load} | {i} | {:.2} | {} | {:.0} | {} | {:.0} | {} |",
            f(vm, "boosted_s"),
            if by.is_empty() {
                "-".into()
            } else {
                by.join(", ")
            },
            f(vm, "demoted_ms"),
            vm["budget_latches"].as_u64().unwrap_or(0),
            f(vm, "budget_latched_ms"),
            vm["over_budget"].as_u64().unwrap_or(0),
        );
    }
}

/// Where the host's IPIs come from, per (load, interval, mode).
fn ipi_sources_markdown(o: &mut String, r: &Report) {
    let rows: Vec<(&Scenario, &str, &crate::ipi_sources::Sources)> = r
        .scenarios
        .iter()
        .flat_map(|s| s.modes.iter().map(move |(m, x)| (s, m.as_str(), x)))
        .filter_map(|(s, m, x)| x.ipi_sources.as_ref().map(|i| (s, m, i)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\nWhere the IPIs come from (the `ipi:ipi_send_cpu` and `ipi_send_cpumask` \
         tracepoints over the same phases, per second): by the kernel function that sent \
         each one (a wakeup preempting the target CPU's task; an RT task pushed to another \
         CPU, which the kernel does when a higher RT task preempts it, on that task's wakeup \
         path; a queued remote wakeup; `sched_setattr` on a thread running elsewhere) and by \
         the task current on the sending CPU. Under TCG, QEMU's main loop delivers the \
         guest's timers by waking vCPU threads.\n"
    );
    let _ = writeln!(
        o,
        "| load | interval | mode | IPIs/s | wakeup preempts: QEMU main loop / vCPUs / rest | \
         RT push: by host cyclictest / pvschedd / rest | remote wakeups | sched_setattr | other | lost |"
    );
    let _ = writeln!(o, "|---|---|---|--:|---|---|--:|--:|--:|--:|");
    for (s, mode, i) in rows {
        let split = |cause: &str, a: &str, b: &str| {
            let (x, y) = (i.get(cause, a), i.get(cause, b));
            format!(
                "{x:.0} / {y:.0} / {:.0}",
                (i.cause_total(cause) - x - y).max(0.0)
            )
        };
        let _ = writeln!(
            o,
            "| {} | {} µs | {mode} | {:.0} | {} | {} | {:.0} | {:.0} | {:.0} | {} |",
            s.load,
            s.interval_us,
            i.total(),
            split("wakeup preempts", "QEMU main loop", "vCPU"),
            split("RT push", "host cyclictest", "pvschedd"),
            i.cause_total("remote wakeup"),
            i.cause_total("sched_setattr"),
            i.cause_total("other"),
            i.lost
        );
    }
}

/// The daemon's counters summed over `sessions`, per second of their daemons.
pub fn daemon_per_s(sessions: &[crate::model::SessionRun]) -> BTreeMap<String, f64> {
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

/// The pairs compared in every scenario, when both modes ran.
pub const PAIRS: [(Mode, Mode); 3] = [
    (Mode::Pvsched, Mode::StaticRt),
    (Mode::Pvsched, Mode::Vanilla),
    (Mode::StaticRt, Mode::Vanilla),
];

/// The project's targets under load: (what, side, other mode, allowed ratio).
pub const TARGETS: [(&str, &str, Mode, f64); 3] = [
    (
        "guest p99: pvsched <= 1.5 x static-rt",
        "guest",
        Mode::StaticRt,
        1.5,
    ),
    (
        "guest p99: pvsched <= 1/3 x vanilla",
        "guest",
        Mode::Vanilla,
        1.0 / 3.0,
    ),
    (
        "host p99: pvsched <= 1.1 x vanilla",
        "host",
        Mode::Vanilla,
        1.1,
    ),
];

pub fn targets(s: &Scenario) -> Vec<Target> {
    let mut out = Vec::new();
    let Some(pv) = s.modes.get(Mode::Pvsched.name()) else {
        return out;
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
            what: what.to_string(),
            value_us: v,
            limit_us: (w as f64 * allowed * 10.0).round() / 10.0,
            ratio: (r * 1000.0).round() / 1000.0,
            allowed_ratio: allowed,
            met: r <= allowed + 1e-9,
        });
    }
    out
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
    Report {
        schema: "pvsched-bench/1".into(),
        meta,
        fair_share: share_report::build(results, loads, modes, &scenarios),
        scenarios,
        targets: all_targets,
        plots: Vec::new(),
        modcost: None,
        simulated: None,
        host_cost_targets: Vec::new(),
    }
}

fn opt_ratio(r: Option<f64>) -> String {
    match r {
        Some(r) if r >= 10.0 => format!("{r:.0}x"),
        Some(r) => format!("{r:.2}x"),
        None => "n/a".into(),
    }
}

fn us(v: u64) -> String {
    v.to_string()
}

/// The Markdown report (also what the bench prints at the end).
pub fn markdown(r: &Report) -> String {
    let m = &r.meta;
    let mut o = String::new();
    let _ = writeln!(o, "# pvsched bench: {}\n", m.started);
    let _ = writeln!(o, "Command: `{}`  ", m.command);
    let _ = writeln!(
        o,
        "Machine: {}, {} CPUs, {} GiB, kernel {}, {}  ",
        m.machine.cpu_model, m.machine.cpus, m.machine.memory_gib, m.machine.kernel, m.machine.os
    );
    let _ = writeln!(
        o,
        "Tools: {}; {}; {}; pvsched {}  ",
        m.machine.qemu, m.machine.cyclictest, m.machine.stress_ng, m.machine.git
    );
    let _ = writeln!(o, "Accelerator: {}  ", m.accel_reason);
    let _ = writeln!(
        o,
        "Guest: {} vCPUs, kernel {}, pvsched.ko {}  ",
        m.guest_cpus, m.guest_kernel, m.guest_module
    );
    let _ = writeln!(o, "Host load (\"loaded\"): `{}`  ", m.load_cmd);
    let _ = writeln!(
        o,
        "static-rt: every vCPU thread SCHED_RR {} (as `chrt -r` / libvirt `<vcpusched>`)  ",
        if m.static_rt_priority == 0 {
            8
        } else {
            m.static_rt_priority
        }
    );
    if m.pvschedd_settings.trim().is_empty() {
        let _ = writeln!(o, "pvschedd: default configuration  ");
    } else {
        let _ = writeln!(
            o,
            "pvschedd: defaults plus `{}`  ",
            m.pvschedd_settings.trim().replace('\n', "; ")
        );
    }
    let _ = writeln!(
        o,
        "Each cell: {} repeats x {} s, modes interleaved (rotated per repeat); guest and host \
         `cyclictest -p 8 --policy=rr` at the same time; histograms of the repeats merged. \
         Wall time {:.1} min.\n",
        m.repeat,
        m.duration_s,
        m.wall_s / 60.0
    );

    headline(&mut o, r);
    let _ = writeln!(
        o,
        "## Latency (µs): guest and host cyclictest, side by side\n"
    );
    let _ = writeln!(
        o,
        "| load | interval | mode | guest avg | guest p99 | guest p99.9 | guest max | host avg | host p99 | host max | guest p99 per repeat | host p99 per repeat | guest loops | other load % per repeat |"
    );
    let _ = writeln!(
        o,
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|---|--:|---|"
    );
    for s in &r.scenarios {
        for (name, mr) in ordered(&s.modes) {
            let g = &mr.guest.summary;
            let h = &mr.host.summary;
            let _ = writeln!(
                o,
                "| {} | {} µs | {} | {:.0} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {:.0} % | {} |",
                s.load,
                s.interval_us,
                name,
                g.avg_us,
                us(g.p99_us),
                us(g.p999_us),
                us(g.max_us),
                h.avg_us,
                us(h.p99_us),
                us(h.max_us),
                join(&mr.guest.p99_us_per_repeat),
                join(&mr.host.p99_us_per_repeat),
                mr.guest.loops_ratio * 100.0,
                mr.other_load_pct_per_repeat
                    .iter()
                    .map(|p| format!("{p:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }

    let _ = writeln!(o, "\n## Ratios (same run)\n");
    let _ = writeln!(
        o,
        "| load | interval | pair | guest avg | guest p99 | guest max | host avg | host p99 | host max | audio glitches | host load throughput |"
    );
    let _ = writeln!(o, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|");
    for s in &r.scenarios {
        for (pair, x) in &s.ratios {
            let _ = writeln!(
                o,
                "| {} | {} µs | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                s.load,
                s.interval_us,
                pair,
                opt_ratio(x.guest_avg),
                opt_ratio(x.guest_p99),
                opt_ratio(x.guest_max),
                opt_ratio(x.host_avg),
                opt_ratio(x.host_p99),
                opt_ratio(x.host_max),
                opt_ratio(x.glitches),
                opt_ratio(x.host_load),
            );
        }
    }

    let _ = writeln!(
        o,
        "\n## Audio, ping-pong and host throughput, per load and mode\n"
    );
    let mut audio_desc = String::new();
    let _ = writeln!(
        o,
        "| load | mode | audio glitches / periods | glitches per repeat | worst audio delay µs | ping-pong p50 µs | ping-pong p99 µs | host load bogo ops/s | host load vs vanilla |"
    );
    let _ = writeln!(o, "|---|---|--:|---|--:|--:|--:|---|--:|");
    let mut seen = std::collections::BTreeSet::new();
    for s in &r.scenarios {
        if !seen.insert(s.load.clone()) {
            continue;
        }
        for (name, mr) in ordered(&s.modes) {
            let (gl, per, late) = match &mr.audio {
                Some(a) => {
                    if audio_desc.is_empty() {
                        audio_desc = format!(
                            "audiosim: SCHED_FIFO 8 in the guest, period {} µs, glitch = a period done later than {} µs after its start.",
                            a.period_us, a.buffer_us
                        );
                    }
                    (
                        format!("{} / {}", a.glitches, a.periods),
                        join(&a.glitches_per_repeat),
                        a.late_max_us.to_string(),
                    )
                }
                None => ("n/a".into(), "".into(), "".into()),
            };
            let (p50, p99) = match &mr.pingpong {
                Some(p) => (format!("{:.0}", p.p50_us), format!("{:.0}", p.p99_us)),
                None => ("n/a".into(), "n/a".into()),
            };
            let (ops, rel) = match &mr.host_load {
                Some(l) => (
                    l.ops_per_s
                        .iter()
                        .map(|(k, v)| format!("{k} {v:.0}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    l.vs_vanilla
                        .map(|v| format!("{:.1} %", v * 100.0))
                        .unwrap_or_else(|| "n/a".into()),
                ),
                None => ("(idle)".into(), "".into()),
            };
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                s.load, name, gl, per, late, p50, p99, ops, rel
            );
        }
    }
    if !audio_desc.is_empty() {
        let _ = writeln!(
            o,
            "\n{audio_desc} Ping-pong: two guest threads on two vCPUs passing a byte through pipes (SCHED_OTHER)."
        );
    }

    share_report::markdown(&mut o, &r.fair_share);
    crate::modcost::markdown(&mut o, r.modcost.as_ref());

    let reactions: Vec<(&str, &Reaction)> = pvsched_per_load(r)
        .into_iter()
        .filter_map(|(load, m)| m.reaction.as_ref().map(|x| (load, x)))
        .collect();
    if !reactions.is_empty() {
        let _ = writeln!(
            o,
            "\n## pvschedd's reaction latency (host event -> sched_setattr returned)\n"
        );
        let _ = writeln!(
            o,
            "The daemon's own histogram (`pvsched_reaction_latency_seconds`), over every pvsched \
             session of the load: the changes an event caused (not those of its timers); \
             figures are bucket upper bounds.\n"
        );
        let _ = writeln!(o, "| load | actions | p50 µs | p90 µs | p99 µs | max µs |");
        let _ = writeln!(o, "|---|--:|--:|--:|--:|--:|");
        let b = |v: Option<f64>| v.map_or("> 20000".into(), |v| format!("{v:.0}"));
        for (load, x) in reactions {
            let _ = writeln!(
                o,
                "| {load} | {} | {} | {} | {} | {} |",
                x.actions,
                b(x.p50_us),
                b(x.p90_us),
                b(x.p99_us),
                b(x.max_us)
            );
        }
    }

    budget_markdown(&mut o, r);
    host_costs_markdown(&mut o, r);
    crate::simulated::markdown(&mut o, r.simulated.as_ref());
    crate::host_cost_targets::markdown(&mut o, &r.host_cost_targets);

    if !r.targets.is_empty() {
        let _ = writeln!(o, "\n## Targets (loaded host)\n");
        let _ = writeln!(o, "| interval | target | pvsched µs | limit µs | result |");
        let _ = writeln!(o, "|---|---|--:|--:|---|");
        for t in &r.targets {
            let _ = writeln!(
                o,
                "| {} µs | {} | {} | {:.0} | {} |",
                t.interval_us,
                t.what,
                t.value_us,
                t.limit_us,
                t.verdict()
            );
        }
    }
    if !m.notes.is_empty() {
        let _ = writeln!(o, "\n## Notes\n");
        for n in &m.notes {
            let _ = writeln!(o, "- {n}");
        }
    }
    if !r.plots.is_empty() {
        let _ = writeln!(o, "\n## Plots\n");
        for p in &r.plots {
            let _ = writeln!(o, "![{p}]({p})");
        }
    }
    o
}

/// The comparison the project is about: p99 under load, three modes side
/// by side, guest and host.
fn headline(o: &mut String, r: &Report) {
    let loaded: Vec<&Scenario> = r.scenarios.iter().filter(|s| s.load == "loaded").collect();
    if loaded.is_empty() {
        return;
    }
    let modes: Vec<&str> = Mode::ALL
        .iter()
        .map(|m| m.name())
        .filter(|m| loaded.iter().any(|s| s.modes.contains_key(*m)))
        .collect();
    let _ = writeln!(o, "## Loaded host: p99 latency (µs), modes side by side\n");
    let mut head = String::from("| interval |");
    let mut rule = String::from("|---|");
    for side in ["guest", "host"] {
        for m in &modes {
            let _ = write!(head, " {side} p99 {m} |");
            rule.push_str("--:|");
        }
    }
    let _ = writeln!(o, "{head}\n{rule}");
    for s in loaded {
        let mut row = format!("| {} µs |", s.interval_us);
        for side in ["guest", "host"] {
            for m in &modes {
                let v = s.modes.get(*m).map(|mr| {
                    if side == "guest" {
                        mr.guest.summary.p99_us
                    } else {
                        mr.host.summary.p99_us
                    }
                });
                let _ = write!(
                    row,
                    " {} |",
                    v.map(|v| v.to_string()).unwrap_or("n/a".into())
                );
            }
        }
        let _ = writeln!(o, "{row}");
    }
    let _ = writeln!(o);
}

/// Modes in the canonical order (vanilla, static-rt, pvsched).
pub fn ordered(modes: &BTreeMap<String, ModeReport>) -> Vec<(&str, &ModeReport)> {
    Mode::ALL
        .iter()
        .filter_map(|m| modes.get(m.name()).map(|r| (m.name(), r)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::AudioResult;
    use crate::host::StressorRate;
    use crate::model::{LatencyRun, SessionRun};

    fn flat(us: u64, n: u64) -> Histogram {
        let mut h = Histogram::default();
        h.record(us, n);
        h
    }

    /// Guest p99 = `g` µs and host p99 = `h` µs for `mode`, loaded, 1000 µs.
    fn add(r: &mut Results, mode: Mode, g: u64, h: u64, glitches: u64, cpu_ops: f64) {
        r.latency
            .entry((Load::Loaded, 1000, mode))
            .or_default()
            .push(LatencyRun {
                rep: 0,
                guest: flat(g, 100),
                host: flat(h, 100),
                guest_expected: 100,
                host_expected: 100,
                foreign_cpu: 0.05,
                cpu: None,
                interrupts: None,
                ipi_sources: None,
            });
        r.sessions
            .entry((Load::Loaded, mode))
            .or_default()
            .push(SessionRun {
                audio: Some(AudioResult {
                    periods: 1000,
                    glitches,
                    period_us: 2902,
                    buffer_us: 2902,
                    ..Default::default()
                }),
                load: vec![StressorRate {
                    stressor: "cpu".into(),
                    ops_per_s: cpu_ops,
                    ..Default::default()
                }],
                ..Default::default()
            });
    }

    fn sample() -> Report {
        let mut r = Results::default();
        add(&mut r, Mode::Vanilla, 4000, 50, 300, 1000.0);
        add(&mut r, Mode::StaticRt, 1000, 300, 10, 800.0);
        add(&mut r, Mode::Pvsched, 1200, 52, 12, 950.0);
        build(
            &r,
            Meta {
                repeat: 1,
                duration_s: 10,
                load_cmd: "stress-ng --cpu 2".into(),
                ..Default::default()
            },
            &[Load::Loaded],
            &[1000],
            &Mode::ALL,
        )
    }

    #[test]
    fn report_json_has_the_simulator_shape() {
        // Act
        let v = serde_json::to_value(sample()).unwrap();

        // Assert
        let s = &v["scenarios"][0];
        assert_eq!(s["load"], "loaded");
        assert_eq!(s["interval_us"], 1000);
        for mode in ["vanilla", "static-rt", "pvsched"] {
            for side in ["guest", "host"] {
                for key in ["avg_us", "p50_us", "p99_us", "p999_us", "max_us"] {
                    assert!(
                        s["modes"][mode][side][key].is_number(),
                        "modes.{mode}.{side}.{key} missing in {s}"
                    );
                }
            }
        }
        assert_eq!(s["modes"]["pvsched"]["guest"]["p99_us"], 1200);
        assert_eq!(s["modes"]["pvsched"]["other_load_pct_per_repeat"][0], 5.0);
    }

    #[test]
    fn ratios_are_pvsched_over_the_other_mode() {
        // Act
        let r = sample();
        let s = &r.scenarios[0];

        // Assert
        let vs_rt = &s.ratios["pvsched/static-rt"];
        assert!((vs_rt.guest_p99.unwrap() - 1.2).abs() < 1e-9);
        let vs_van = &s.ratios["pvsched/vanilla"];
        assert!((vs_van.guest_p99.unwrap() - 0.3).abs() < 1e-9);
        assert!((vs_van.host_p99.unwrap() - 1.04).abs() < 1e-9);
        assert!((vs_van.glitches.unwrap() - 0.04).abs() < 1e-9);
        assert!((vs_van.host_load.unwrap() - 0.95).abs() < 1e-9);
    }

    #[test]
    fn ratio_with_a_zero_denominator_is_none() {
        assert_eq!(ratio(5.0, 0.0), None);
        assert_eq!(ratio(0.0, 5.0), Some(0.0));
    }

    #[test]
    fn targets_met_and_missed_say_by_how_much() {
        // Arrange: guest 1.2x static-rt (met), 0.3x vanilla (met), host 1.04x (met).
        let mut r = sample();
        assert!(r.targets.iter().all(|t| t.met), "{:?}", r.targets);

        // Act: make the host side miss: 66 / 50 = 1.32x against 1.1x.
        r.scenarios[0]
            .modes
            .get_mut("pvsched")
            .unwrap()
            .host
            .summary
            .p99_us = 66;
        let t = targets(&r.scenarios[0]);

        // Assert
        let host = t.iter().find(|t| t.what.starts_with("host")).unwrap();
        assert!(!host.met);
        assert!(
            host.verdict().contains("MISSED by 20 %"),
            "{}",
            host.verdict()
        );
    }

    #[test]
    fn host_load_is_relative_to_vanilla() {
        let r = sample();
        let pv = &r.scenarios[0].modes["pvsched"];
        assert_eq!(pv.host_load.as_ref().unwrap().vs_vanilla, Some(0.95));
    }

    #[test]
    fn daemon_counters_are_per_second_of_the_daemons_lifetimes() {
        let text = "pvsched_wakeups_total{cause=\"timer\"} 300\n\
                    pvsched_doorbell_rings_total 40\n";
        let session = |t: &str, secs: f64| crate::model::SessionRun {
            daemon_counters: crate::daemon::DAEMON_COUNTERS
                .iter()
                .filter_map(|(k, n)| Some((k.to_string(), crate::daemon::prometheus_value(t, n)?)))
                .collect(),
            daemon_seconds: secs,
            ..Default::default()
        };

        let per_s = daemon_per_s(&[session(text, 10.0), session(text, 20.0)]);

        assert_eq!(per_s.get("wakeups_timer"), Some(&20.0));
        assert_eq!(per_s.get("doorbell_rings"), Some(&(80.0 / 30.0)));
        assert_eq!(per_s.get("wakeups_records"), None);
        assert!(daemon_per_s(&[]).is_empty());
    }

    #[test]
    fn reaction_quantiles_are_read_off_the_summed_histograms() {
        // Two sessions' cumulative buckets (le in seconds): 10 µs, 50 µs, 500 µs, +Inf.
        let a = [
            (Some(10e-6), 60),
            (Some(50e-6), 90),
            (Some(500e-6), 99),
            (None, 100),
        ];
        let b = [
            (Some(10e-6), 40),
            (Some(50e-6), 90),
            (Some(500e-6), 100),
            (None, 100),
        ];

        let r = reaction(&[&a, &b]).unwrap();

        assert_eq!(r.actions, 200);
        assert_eq!(r.p50_us, Some(10.0)); // 100 of 200 at or below 10 µs
        assert_eq!(r.p90_us, Some(50.0));
        assert_eq!(r.p99_us, Some(500.0));
        assert_eq!(r.max_us, None); // one above the last bound
        assert!(reaction(&[&[]]).is_none());
    }

    #[test]
    fn prometheus_histogram_buckets_are_parsed() {
        let text = "# HELP x\npvsched_reaction_latency_seconds_sum 0.01\n\
                    pvsched_reaction_latency_seconds_bucket{le=\"0.00001\"} 3\n\
                    pvsched_reaction_latency_seconds_bucket{le=\"+Inf\"} 5\n\
                    pvsched_other_bucket{le=\"1.0\"} 9\n";

        let b = crate::daemon::prometheus_buckets(text, "pvsched_reaction_latency_seconds");

        assert_eq!(b, vec![(Some(0.00001), 3), (None, 5)]);
        // What raw.json keeps reads back (JSON has no infinity).
        let json = serde_json::to_string(&b).unwrap();
        let back: Vec<(Option<f64>, u64)> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, b);
    }

    #[test]
    fn markdown_shows_where_each_sessions_boost_budget_went() {
        let mut r = sample();
        r.scenarios[0]
            .modes
            .get_mut(Mode::Pvsched.name())
            .unwrap()
            .daemon = vec![serde_json::json!({"vms": [{
            "boosted_s": 6.97, "demoted_ms": 21.0, "budget_latches": 3,
            "budget_latched_ms": 3000.0, "over_budget": 313,
            "boosted_ms_by_reason": {"guest_rt": 605.0, "proactive_wake": 4601.4}
        }]})];

        let md = markdown(&r);

        assert!(
            md.contains(
                "| loaded | 1 | 6.97 | proactive_wake 4601, guest_rt 605 | 21 | 3 | 3000 | 313 |"
            ),
            "{md}"
        );
        assert!(!markdown(&sample()).contains("boost budget, per session"));
    }

    #[test]
    fn markdown_shows_every_mode_and_the_targets() {
        let md = markdown(&sample());
        for needle in [
            "| loaded | 1000 µs | vanilla | 4000 |",
            "pvsched/static-rt",
            "## Targets",
            "met (1.20x",
            "| 1000 µs | 4000 | 1000 | 1200 | 50 | 300 | 52 |",
        ] {
            assert!(md.contains(needle), "{needle:?} not in\n{md}");
        }
    }
}
