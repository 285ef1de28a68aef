//! The message-passing scenario's report.md.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::model::*;
use super::report::*;
use crate::guest_idle::*;
use crate::harness::figures::Spread;
use crate::harness::markdown as md;

/// `median [min-max]`, or the one value.
fn spread(s: &Spread, places: usize) -> String {
    if s.per_repeat.len() > 1 {
        format!("{:.p$} [{:.p$}-{:.p$}]", s.median, s.min, s.max, p = places)
    } else {
        format!("{:.p$}", s.median, p = places)
    }
}

fn opt_ratio(r: Option<f64>) -> String {
    r.map(|r| format!("{r:.2}x"))
        .unwrap_or_else(|| "n/a".into())
}

/// Cases in the canonical order.
fn ordered<T>(m: &BTreeMap<String, T>) -> Vec<(&'static str, &T)> {
    IdleCase::ALL
        .iter()
        .filter_map(|c| m.get(c.name()).map(|v| (c.name(), v)))
        .collect()
}

/// The Markdown report (also what the bench prints at the end).
pub fn markdown(r: &MsgReport) -> String {
    let mm = &r.meta;
    let m = &mm.base;
    let mut o = String::new();
    let _ = writeln!(o, "# pvsched bench, message passing: {}\n", m.started);
    md::run_lines(&mut o, m, &[&m.machine.qemu, &m.machine.stress_ng]);
    let _ = writeln!(
        o,
        "Guest: {} vCPUs, kernel {}, pvsched.ko {}; idle driver: {}  ",
        m.guest_cpus, m.guest_kernel, m.guest_module, mm.idle_driver
    );
    let _ = writeln!(
        o,
        "pvschedd serves the guest in every case (started afresh per repeat and load); {}  ",
        if m.pvschedd_settings.trim().is_empty() {
            "default configuration".to_string()
        } else {
            format!(
                "defaults plus `{}`",
                m.pvschedd_settings.trim().replace('\n', "; ")
            )
        }
    );
    let _ = writeln!(o, "Host load (\"loaded\"): `{}`  ", m.load_cmd);
    let _ = writeln!(
        o,
        "Polling budget: {:.1} % of a vCPU (`--budget-permille {}`)  ",
        f64::from(mm.budget_permille) / 10.0,
        mm.budget_permille
    );
    for (w, c) in &mm.commands {
        let _ = writeln!(o, "{w}: `{c}`  ");
    }
    let _ = writeln!(
        o,
        "Each case: {} repeats x {} s per workload, cases interleaved (rotated per repeat) \
         after a warm-up in `default` mode; medians over the repeats, [min-max]. Wall time \
         {:.1} min.\n",
        m.repeat,
        m.duration_s,
        m.wall_s / 60.0
    );
    let _ = writeln!(o, "Cases:");
    let cases: Vec<&str> = r
        .loads
        .iter()
        .flat_map(|l| l.workloads.values().flat_map(|c| c.keys()))
        .map(String::as_str)
        .collect();
    for c in IdleCase::ALL {
        if cases.contains(&c.name()) {
            let _ = writeln!(o, "- `{}`: {}", c.name(), c.describe());
        }
    }
    let _ = writeln!(o);
    for d in &mm.definitions {
        let _ = writeln!(o, "{d}  ");
    }
    let _ = writeln!(o);

    if !r.targets.is_empty() {
        let _ = writeln!(o, "## Targets\n");
        let _ = writeln!(o, "| load | target | result |");
        let _ = writeln!(o, "|---|---|---|");
        for t in &r.targets {
            let _ = writeln!(o, "| {} | {} | {} |", t.load, t.what, t.verdict());
        }
        let _ = writeln!(o);
    }

    for lr in &r.loads {
        let _ = writeln!(o, "## Host {}\n", lr.load);
        if let Some(cmd) = &lr.load_cmd {
            let _ = writeln!(o, "Load: `{cmd}`  ");
        }
        let _ = writeln!(
            o,
            "Advisor's window W per repeat: {}\n",
            lr.advisor_window_us
                .iter()
                .map(|w| w
                    .map(|w| format!("{w} µs"))
                    .unwrap_or_else(|| "none".into()))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for w in Workload::ALL {
            let Some(cases) = lr.workloads.get(w.name()) else {
                continue;
            };
            let _ = writeln!(o, "### {w} ({}, latency: {})\n", w.unit(), w.latency());
            let waits = cases.values().any(|c| c.empty_waits_per_msg.is_some());
            let _ = writeln!(
                o,
                "| mode | throughput | vs default | latency p50 µs | latency p99 µs | host CPU % per vCPU | guest poll % | polls | poll hits | poll timeouts | overload halts | halts |{}",
                if waits { " consumer waits per msg |" } else { "" }
            );
            let _ = writeln!(
                o,
                "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|{}",
                if waits { "--:|" } else { "" }
            );
            for (name, st) in ordered(cases) {
                let c = st.counters;
                let n = |f: fn(&IdleCounters) -> u64| {
                    c.as_ref()
                        .map(|c| f(c).to_string())
                        .unwrap_or_else(|| "-".into())
                };
                let _ = writeln!(
                    o,
                    "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |{}",
                    spread(&st.throughput, 0),
                    opt_ratio(st.vs_default),
                    spread(&st.latency_p50_us, 1),
                    spread(&st.latency_p99_us, 1),
                    spread(&st.host_cpu_pct, 1),
                    st.guest_poll_pct
                        .as_ref()
                        .map(|p| spread(p, 2))
                        .unwrap_or_else(|| "-".into()),
                    n(|c| c.polls),
                    n(|c| c.poll_hits),
                    n(|c| c.poll_timeouts),
                    n(|c| c.overload_halts),
                    n(|c| c.halts),
                    match (&st.empty_waits_per_msg, waits) {
                        (Some(w), _) => format!(" {} |", spread(w, 3)),
                        (None, true) => " - |".into(),
                        (None, false) => String::new(),
                    }
                );
            }
            let _ = writeln!(o);
        }
        if !lr.host_work.is_empty() {
            let stressors: Vec<&String> = lr
                .host_work
                .values()
                .flat_map(|h| h.ops_per_s.keys())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let _ = writeln!(
                o,
                "### The host's own work: stress-ng bogo-ops/s (median per stressor)\n"
            );
            let mut head = String::from("| mode |");
            let mut rule = String::from("|---|");
            for s in &stressors {
                let _ = write!(head, " {s} |");
                rule.push_str("--:|");
            }
            let _ = writeln!(o, "{head} vs default (geomean) |");
            let _ = writeln!(o, "{rule}--:|");
            for (name, h) in ordered(&lr.host_work) {
                let mut row = format!("| {name} |");
                for s in &stressors {
                    match h.ops_per_s.get(*s) {
                        Some(v) => {
                            let _ = write!(row, " {v:.1} |");
                        }
                        None => row.push_str(" - |"),
                    }
                }
                let _ = writeln!(o, "{row} {} |", opt_ratio(h.vs_default));
            }
            let _ = writeln!(o);
        }
    }

    if !m.notes.is_empty() {
        let _ = writeln!(o, "## Notes\n");
        for n in &m.notes {
            let _ = writeln!(o, "- {n}");
        }
        let _ = writeln!(o);
    }
    if !r.plots.is_empty() {
        let _ = writeln!(o, "## Plots\n");
        for p in &r.plots {
            let _ = writeln!(o, "![{p}]({p})");
        }
    }
    o
}
