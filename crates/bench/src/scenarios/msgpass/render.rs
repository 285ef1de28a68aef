//! The message-passing scenario's files: raw.json, report.json, report.md
//! and the throughput plot, from a run or again from its raw.json.

use std::path::{Path, PathBuf};

use super::analysis::*;
use super::markdown::*;
use super::model::*;
use super::report::*;
use crate::error::Result;
use crate::harness::output::json;
use crate::plot;

/// Writes raw.json, report.json, the plot and report.md into `out`.
pub fn render(out: &Path, raw: &MsgRaw) -> Result<MsgReport> {
    let write = |name: &str, text: &str| crate::harness::output::write_into(out, name, text);
    write("raw.json", &json(raw))?;
    let mut report = build(raw);
    let mut panels = Vec::new();
    for w in Workload::ALL {
        for lr in &report.loads {
            let Some(cases) = lr.workloads.get(w.name()) else {
                continue;
            };
            let bars: Vec<plot::Bar> = IdleCase::ALL
                .iter()
                .filter_map(|c| {
                    cases.get(c.name()).map(|st| plot::Bar {
                        mode: c.name(),
                        value: st.throughput.median,
                        low: st.throughput.min,
                        high: st.throughput.max,
                    })
                })
                .collect();
            panels.push(plot::BarPanel {
                title: format!("{w}, host {}", lr.load),
                y_desc: w.unit().to_string(),
                bars,
            });
        }
    }
    if !panels.is_empty() {
        let name = "throughput.png".to_string();
        let title = format!(
            "message passing per guest idle mode: median over {} repeats x {} s, line: min-max ({})",
            raw.meta.base.repeat,
            raw.meta.base.duration_s,
            raw.meta.base.accel.to_uppercase()
        );
        plot::bar_panels(&out.join(&name), &title, &panels, raw.loads.len())?;
        report.plots.push(name);
    }
    write("report.json", &json(&report))?;
    write("report.md", &markdown(&report))?;
    Ok(report)
}

/// Re-renders a report from a previous message-passing run's raw.json (into
/// its directory).
pub fn rerender(raw_path: &Path) -> Result<(MsgReport, PathBuf)> {
    crate::harness::raw::rerender(raw_path, render)
}
