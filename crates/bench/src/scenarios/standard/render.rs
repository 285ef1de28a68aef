//! The standard scenario's files: raw.json, report.json, one JSON per
//! (load, interval) in the simulator's shape, a CCDF plot each, and
//! report.md; from a run or again from its raw.json.

use std::path::{Path, PathBuf};

use super::analysis::*;
use super::markdown::*;
use super::modcost;
use super::model::*;
use super::report::*;
use crate::error::Result;
use crate::harness::axes::Mode;
use crate::harness::output::{json, write_into};
use crate::plot;
use crate::stats::Histogram;

/// Writes raw.json, report.json, one JSON per scenario, the plots and
/// report.md into `out`.
pub fn render(out: &Path, raw: &RawFile) -> Result<Report> {
    let write = |name: &str, text: &str| write_into(out, name, text);
    write("raw.json", &json(raw))?;
    let mut report = build(
        &raw.results,
        raw.meta.clone(),
        &raw.loads,
        &raw.intervals,
        &raw.modes,
    );
    report.modcost = raw.modcost.as_ref().map(modcost::summary::summarize);
    report.simulated = raw.simulated.clone();
    report.host_cost_targets = super::host_cost_targets::build(&report);
    for sc in &report.scenarios {
        write(&format!("{}-{}us.json", sc.load, sc.interval_us), &json(sc))?;
    }
    for &load in &raw.loads {
        for &interval in &raw.intervals {
            let hists: Vec<(Mode, Histogram, Histogram)> = raw
                .modes
                .iter()
                .filter(|m| raw.results.latency.contains_key(&(load, interval, **m)))
                .map(|&m| {
                    let (g, h) = merged(&raw.results, load, interval, m);
                    (m, g, h)
                })
                .collect();
            if hists.is_empty() {
                continue;
            }
            let guest: Vec<plot::Curve> = hists
                .iter()
                .map(|(m, g, _)| plot::Curve {
                    mode: m.name(),
                    hist: g,
                })
                .collect();
            let host: Vec<plot::Curve> = hists
                .iter()
                .map(|(m, _, h)| plot::Curve {
                    mode: m.name(),
                    hist: h,
                })
                .collect();
            let name = format!("{load}-{interval}us.png");
            let title = format!(
                "cyclictest latency, host {load}, interval {interval} µs ({}, {} x {} s per mode)",
                raw.meta.accel.to_uppercase(),
                raw.meta.repeat,
                raw.meta.duration_s
            );
            plot::latency_ccdf(&out.join(&name), &title, interval, &guest, &host)?;
            report.plots.push(name);
        }
    }
    write("report.json", &json(&report))?;
    write("report.md", &markdown(&report))?;
    Ok(report)
}

/// Re-renders a report from a previous run's raw.json (into its directory).
pub fn rerender(raw_path: &Path) -> Result<(Report, PathBuf)> {
    crate::harness::raw::rerender(raw_path, render)
}
