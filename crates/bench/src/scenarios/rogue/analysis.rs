//! From the rogue scenario's raw results to its report: the cases' merged
//! histograms, pooled shares and summed counters, the ratios, the targets.

use std::collections::BTreeMap;

use super::model::*;
use super::report::*;
use crate::harness::axes::Load;
use crate::harness::figures::{ratio, side};
use crate::stats::Histogram;

/// The phases of one (load, interval, case), in run order.
pub fn phases_of(raw: &RogueRaw, load: Load, interval: u32, case: Case) -> Vec<&Phase> {
    raw.phases
        .iter()
        .filter(|p| p.load == load && p.interval_us == interval && p.case == case)
        .collect()
}

/// The merged histograms (neighbour guest, host) of one (load, interval, case).
pub fn merged(raw: &RogueRaw, load: Load, interval: u32, case: Case) -> (Histogram, Histogram) {
    let ph = phases_of(raw, load, interval, case);
    (
        Histogram::merged(ph.iter().map(|p| &p.guest)),
        Histogram::merged(ph.iter().map(|p| &p.host)),
    )
}

fn share(phases: &[&Phase], f: impl Fn(&Phase) -> f64) -> Share {
    let window: f64 = phases.iter().map(|p| p.window_s).sum();
    let busy: f64 = phases.iter().map(|p| f(p) * p.window_s).sum();
    Share {
        pct: if window > 0.0 {
            pct(busy / window)
        } else {
            0.0
        },
        pct_per_repeat: phases.iter().map(|p| pct(f(p))).collect(),
    }
}

fn daemon_summary(phases: &[&Phase]) -> BTreeMap<String, DaemonSummary> {
    let mut out: BTreeMap<String, DaemonSummary> = BTreeMap::new();
    let mut vcpu_time: BTreeMap<String, f64> = BTreeMap::new();
    for p in phases {
        for (vm, c) in &p.daemon {
            let d = out.entry(vm.clone()).or_default();
            d.boosts += c.boosts;
            d.throttles += c.throttles;
            d.over_budget += c.over_budget;
            d.clamped_inputs += c.clamped_inputs;
            d.boosted_s += c.boosted_s;
            let vt = p.window_s * c.vcpus as f64;
            *vcpu_time.entry(vm.clone()).or_default() += vt;
            d.boosted_pct_per_repeat
                .push(if vt > 0.0 { pct(c.boosted_s / vt) } else { 0.0 });
            d.in_debt_at_end += usize::from(c.in_debt_at_end);
        }
    }
    for (vm, d) in out.iter_mut() {
        let vt = vcpu_time.get(vm).copied().unwrap_or(0.0);
        d.boosted_s = (d.boosted_s * 1000.0).round() / 1000.0;
        d.boosted_pct = if vt > 0.0 { pct(d.boosted_s / vt) } else { 0.0 };
    }
    out
}

fn case_report(phases: &[&Phase]) -> CaseReport {
    let guest: Vec<&Histogram> = phases.iter().map(|p| &p.guest).collect();
    let host: Vec<&Histogram> = phases.iter().map(|p| &p.host).collect();
    CaseReport {
        guest: side(&guest, phases.iter().map(|p| p.guest_expected).sum()),
        host: side(&host, phases.iter().map(|p| p.host_expected).sum()),
        rogue_share: share(phases, |p| p.rogue_share),
        rogue_vcpu_share: share(phases, |p| p.rogue_vcpu_share),
        neighbour_share: share(phases, |p| p.neighbour_share),
        params: {
            let mut m: BTreeMap<String, ParamsSeen> = BTreeMap::new();
            for p in phases {
                for (g, seen) in &p.params {
                    m.entry(g.clone()).or_default().add(seen);
                }
            }
            m
        },
        other_load_pct_per_repeat: phases.iter().map(|p| pct(p.foreign_cpu)).collect(),
        rogue_spinning_per_repeat: phases.iter().map(|p| p.rogue_spinning).collect(),
        daemon: daemon_summary(phases),
    }
}

fn round3(x: Option<f64>) -> Option<f64> {
    x.map(|r| (r * 1000.0).round() / 1000.0)
}

fn cell_ratios(cases: &BTreeMap<String, CaseReport>) -> CellRatios {
    let get = |c: Case| cases.get(c.name());
    let p99 = |a: Case, b: Case, guest: bool| {
        let (x, y) = (get(a)?, get(b)?);
        let pick = |r: &CaseReport| {
            if guest {
                r.guest.summary.p99_us
            } else {
                r.host.summary.p99_us
            }
        };
        round3(ratio(pick(x) as f64, pick(y) as f64))
    };
    CellRatios {
        neighbour_p99_pvsched: p99(Case::PvschedRogue, Case::PvschedQuiet, true),
        host_p99_pvsched: p99(Case::PvschedRogue, Case::PvschedQuiet, false),
        neighbour_p99_vanilla: p99(Case::VanillaRogue, Case::VanillaQuiet, true),
        host_p99_vanilla: p99(Case::VanillaRogue, Case::VanillaQuiet, false),
        rogue_share_pvsched_minus_vanilla_pts: match (
            get(Case::PvschedRogue),
            get(Case::VanillaRogue),
        ) {
            (Some(p), Some(v)) => {
                Some(((p.rogue_share.pct - v.rogue_share.pct) * 10.0).round() / 10.0)
            }
            _ => None,
        },
    }
}

/// The three targets for one cell (those whose cases ran).
pub fn targets(cell: &Cell) -> Vec<RogueTarget> {
    let mut out = Vec::new();
    let get = |c: Case| cell.cases.get(c.name());
    let t = |what: &str, value: f64, limit: f64, unit: &str| RogueTarget {
        load: cell.load.clone(),
        interval_us: cell.interval_us,
        what: what.to_string(),
        value,
        limit,
        unit: unit.to_string(),
        met: value <= limit + 1e-9,
    };
    if let Some(r) = cell.ratios.neighbour_p99_pvsched {
        out.push(t(
            "neighbour guest p99: pvsched-rogue <= 1.2 x pvsched-quiet",
            r,
            P99_LIMIT,
            "x",
        ));
    }
    if let Some(r) = cell.ratios.host_p99_pvsched {
        out.push(t(
            "host p99: pvsched-rogue <= 1.2 x pvsched-quiet",
            r,
            P99_LIMIT,
            "x",
        ));
    }
    if let (Some(p), Some(v)) = (get(Case::PvschedRogue), get(Case::VanillaRogue)) {
        out.push(t(
            "rogue CPU share: pvsched-rogue <= vanilla-rogue + 10 points",
            p.rogue_share.pct,
            ((v.rogue_share.pct + SHARE_MARGIN * 100.0) * 10.0).round() / 10.0,
            "%",
        ));
    }
    out
}

/// Builds the report: cells in (load, interval) order of the run.
pub fn build(raw: &RogueRaw) -> RogueReport {
    let mut cells = Vec::new();
    let mut all_targets = Vec::new();
    for &load in &raw.loads {
        for &interval in &raw.intervals {
            let mut cell = Cell {
                load: load.name().to_string(),
                load_cmd: (load == Load::Loaded).then(|| raw.meta.base.load_cmd.clone()),
                interval_us: interval,
                duration_s: raw.meta.base.duration_s,
                repeat: raw.meta.base.repeat,
                ..Default::default()
            };
            for &case in &raw.cases {
                let ph = phases_of(raw, load, interval, case);
                if !ph.is_empty() {
                    cell.cases.insert(case.name().to_string(), case_report(&ph));
                }
            }
            cell.ratios = cell_ratios(&cell.cases);
            all_targets.extend(targets(&cell));
            cells.push(cell);
        }
    }
    RogueReport {
        schema: "pvsched-bench-rogue/1".into(),
        meta: raw.meta.clone(),
        cells,
        targets: all_targets,
        plots: Vec::new(),
    }
}

/// The cases of a cell in report order.
pub fn ordered(cases: &BTreeMap<String, CaseReport>) -> Vec<(Case, &CaseReport)> {
    Case::ALL
        .iter()
        .filter_map(|c| cases.get(c.name()).map(|r| (*c, r)))
        .collect()
}
