//! The rogue scenario's files: raw.json, report.json, report.md and a CCDF
//! plot per cell, from a run or again from its raw.json.

use std::path::{Path, PathBuf};

use super::analysis::*;
use super::markdown::*;
use super::model::*;
use super::report::*;
use crate::error::Result;
use crate::harness::output::json;
use crate::plot;
use crate::stats::Histogram;

/// Writes raw.json, report.json, the plots and report.md into `out`.
pub fn render(out: &Path, raw: &RogueRaw) -> Result<RogueReport> {
    let write = |name: &str, text: &str| crate::harness::output::write_into(out, name, text);
    write("raw.json", &json(raw))?;
    let mut report = build(raw);
    for &load in &raw.loads {
        for &interval in &raw.intervals {
            let hists: Vec<(Case, Histogram, Histogram)> = Case::ALL
                .iter()
                .filter(|c| raw.cases.contains(c))
                .filter(|c| !phases_of(raw, load, interval, **c).is_empty())
                .map(|&c| {
                    let (g, h) = merged(raw, load, interval, c);
                    (c, g, h)
                })
                .collect();
            if hists.is_empty() {
                continue;
            }
            let curves = |guest: bool| -> Vec<plot::Curve<'_>> {
                hists
                    .iter()
                    .map(|(c, g, h)| plot::Curve {
                        mode: c.name(),
                        hist: if guest { g } else { h },
                    })
                    .collect()
            };
            let name = format!("rogue-{load}-{interval}us.png");
            let title = format!(
                "rogue guest beside the neighbour: neighbour (left) and host (right) cyclictest, \
                 host {load}, {interval} µs ({}, {} x {} s per case)",
                raw.meta.base.accel.to_uppercase(),
                raw.meta.base.repeat,
                raw.meta.base.duration_s
            );
            plot::latency_ccdf(
                &out.join(&name),
                &title,
                interval,
                &curves(true),
                &curves(false),
            )?;
            report.plots.push(name);
        }
    }
    write("report.json", &json(&report))?;
    write("report.md", &markdown(&report))?;
    Ok(report)
}

/// Re-renders a report from a previous rogue run's raw.json (into its directory).
pub fn rerender(raw_path: &Path) -> Result<(RogueReport, PathBuf)> {
    crate::harness::raw::rerender(raw_path, render)
}
