//! The lock scenario's files: raw.json, report.json, report.md and the
//! throughput plot, from a run or again from its raw.json.

use std::path::{Path, PathBuf};

use super::analysis::*;
use super::markdown::*;
use super::model::*;
use super::report::*;
use crate::error::Result;
use crate::harness::output::json;
use crate::plot;

/// Writes raw.json, report.json, the plot and report.md into `out`.
pub fn render(out: &Path, raw: &LocksRaw) -> Result<LocksReport> {
    let write = |name: &str, text: &str| crate::harness::output::write_into(out, name, text);
    write("raw.json", &json(raw))?;
    let mut report = build(raw);
    let mut panels = Vec::new();
    for c in &report.cases {
        let modes = ordered(&c.modes);
        let bar = |m: LockMode, s: &crate::harness::figures::Spread| plot::Bar {
            mode: m.name(),
            value: s.median,
            low: s.min,
            high: s.max,
        };
        let running: Vec<&str> = modes
            .first()
            .map(|(_, ms)| {
                ms.vms
                    .iter()
                    .filter(|v| v.ran)
                    .map(|v| v.name.as_str())
                    .collect()
            })
            .unwrap_or_default();
        if running.len() > 1 {
            panels.push(plot::BarPanel {
                title: format!("{}: both VMs", c.case),
                y_desc: "ops/s (sum)".into(),
                bars: modes
                    .iter()
                    .filter_map(|(m, ms)| ms.total_ops_per_s.as_ref().map(|s| bar(*m, s)))
                    .collect(),
            });
        }
        for name in running {
            panels.push(plot::BarPanel {
                title: format!("{}: {name}", c.case),
                y_desc: "ops/s".into(),
                bars: modes
                    .iter()
                    .filter_map(|(m, ms)| {
                        let v = ms.vms.iter().find(|v| v.name == name)?;
                        v.ops_per_s.as_ref().map(|s| bar(*m, s))
                    })
                    .collect(),
            });
        }
    }
    panels.retain(|p| !p.bars.is_empty());
    if !panels.is_empty() {
        let name = "throughput.png".to_string();
        let title = plot_title(raw);
        // One row: room in the title for the run and its command.
        plot::bar_panels(&out.join(&name), &title, &panels, panels.len().min(4))?;
        report.plots.push(name);
    }
    write("report.json", &json(&report))?;
    write("report.md", &markdown(&report))?;
    Ok(report)
}

/// The plot's title: what it shows, the run (its start) and its command.
pub fn plot_title(raw: &LocksRaw) -> String {
    let m = &raw.meta.base;
    let args = m.command.split_once(' ').map(|(_, a)| a).unwrap_or("");
    let args = if args.chars().count() > 70 {
        format!("{}…", args.chars().take(69).collect::<String>())
    } else {
        args.to_string()
    };
    format!(
        "lockstress {} ops/s per mode (bar: median, line: min-max of {} x {} s, {}); run {}: \
         pvsched-bench {args}",
        raw.meta.workload,
        m.repeat,
        m.duration_s,
        m.accel.to_uppercase(),
        m.started
    )
}

/// Re-renders a report from a previous lock run's raw.json (into its directory).
pub fn rerender(raw_path: &Path) -> Result<(LocksReport, PathBuf)> {
    crate::harness::raw::rerender(raw_path, render)
}
