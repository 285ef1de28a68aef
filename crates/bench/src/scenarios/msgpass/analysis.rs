//! From the message-passing scenario's raw results to its report: each
//! case's figures over the repeats, the host's work per case, the targets.

use std::collections::BTreeMap;

use super::model::*;
use super::report::*;
use crate::guest_idle::*;
use crate::harness::axes::Load;
use crate::harness::figures::{ratio, Spread};

fn geomean(v: &[f64]) -> Option<f64> {
    if v.is_empty() || v.iter().any(|x| *x <= 0.0 || !x.is_finite()) {
        return None;
    }
    Some((v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
}

fn round(x: f64, places: i32) -> f64 {
    let k = 10f64.powi(places);
    (x * k).round() / k
}

fn case_stats(runs: &[&Measurement]) -> CaseStats {
    let f = |g: &dyn Fn(&Measurement) -> f64, places| {
        Spread::of(runs.iter().map(|m| round(g(m), places)).collect())
    };
    let polls: Vec<f64> = runs.iter().filter_map(|m| m.poll_share()).collect();
    let waits: Vec<f64> = runs
        .iter()
        .filter_map(|m| {
            let w = m.program.get("consumer_waits")?.as_f64()?;
            let n = m.program.get("messages")?.as_f64()?;
            (n > 0.0).then(|| round(w / n, 3))
        })
        .collect();
    let counters = runs.iter().filter_map(|m| m.idle).fold(None, |acc, c| {
        let mut t: IdleCounters = acc.unwrap_or_default();
        t.add(&c);
        Some(t)
    });
    CaseStats {
        repeats: runs.len(),
        throughput: f(&|m| m.per_s, 1),
        vs_default: None,
        latency_p50_us: f(&|m| m.latency_p50_us, 1),
        latency_p99_us: f(&|m| m.latency_p99_us, 1),
        host_cpu_pct: f(&|m| m.host_cpu_per_vcpu() * 100.0, 1),
        guest_poll_pct: (polls.len() == runs.len() && !polls.is_empty())
            .then(|| Spread::of(polls.iter().map(|p| round(p * 100.0, 2)).collect())),
        counters,
        empty_waits_per_msg: (waits.len() == runs.len() && !waits.is_empty())
            .then(|| Spread::of(waits)),
    }
}

fn host_work(sessions: &[&Session]) -> Option<HostWork> {
    let mut per: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for s in sessions {
        for r in &s.load_rates {
            per.entry(r.stressor.clone()).or_default().push(r.ops_per_s);
        }
    }
    (!per.is_empty()).then(|| HostWork {
        ops_per_s: per
            .into_iter()
            .map(|(k, v)| (k, round(Spread::of(v).median, 1)))
            .collect(),
        vs_default: None,
    })
}

/// The figures of one load.
pub fn load_report(raw: &MsgRaw, load: Load) -> LoadReport {
    let sessions = |c: IdleCase| -> Vec<&Session> {
        raw.sessions
            .iter()
            .filter(|s| s.load == load && s.case == c)
            .collect()
    };
    let mut lr = LoadReport {
        load: load.name().to_string(),
        load_cmd: (load == Load::Loaded).then(|| raw.meta.base.load_cmd.clone()),
        advisor_window_us: raw
            .blocks
            .iter()
            .filter(|b| b.load == load)
            .map(|b| b.advice.as_ref().map(|a| a.window_us))
            .collect(),
        ..Default::default()
    };
    for w in Workload::ALL {
        let mut by_case = BTreeMap::new();
        for &c in &raw.cases {
            let runs: Vec<&Measurement> = sessions(c)
                .into_iter()
                .flat_map(|s| s.runs.iter())
                .filter(|m| m.workload == Some(w))
                .collect();
            if !runs.is_empty() {
                by_case.insert(c.name().to_string(), case_stats(&runs));
            }
        }
        let base = by_case
            .get(IdleCase::Default.name())
            .map(|d| d.throughput.median);
        for st in by_case.values_mut() {
            st.vs_default = base
                .and_then(|b| ratio(st.throughput.median, b))
                .map(|r| round(r, 3));
        }
        if !by_case.is_empty() {
            lr.workloads.insert(w.name().to_string(), by_case);
        }
    }
    for &c in &raw.cases {
        if let Some(h) = host_work(&sessions(c)) {
            lr.host_work.insert(c.name().to_string(), h);
        }
    }
    let base = lr.host_work.get(IdleCase::Default.name()).cloned();
    for h in lr.host_work.values_mut() {
        h.vs_default = base.as_ref().and_then(|b| {
            let rel: Vec<f64> = h
                .ops_per_s
                .iter()
                .filter_map(|(k, v)| b.ops_per_s.get(k).and_then(|d| ratio(*v, *d)))
                .collect();
            (rel.len() == h.ops_per_s.len())
                .then(|| geomean(&rel))
                .flatten()
                .map(|g| round(g, 3))
        });
    }
    lr
}

/// The targets, for the loads that ran (a case missing: not measured).
pub fn targets(loads: &[LoadReport], budget_permille: u32) -> Vec<MsgTarget> {
    let hinted = IdleCase::Hinted.name();
    let budget_pct = f64::from(budget_permille) / 10.0;
    let mut out = Vec::new();
    for lr in loads {
        match lr.load.as_str() {
            "idle" => {
                for w in Workload::ALL {
                    let st = lr.workloads.get(w.name()).and_then(|m| m.get(hinted));
                    out.push(MsgTarget::new(
                        &lr.load,
                        format!(
                            "{w} throughput ({}): hinted >= {THROUGHPUT_TARGET} x default",
                            w.unit()
                        ),
                        st.and_then(|s| s.vs_default),
                        THROUGHPUT_TARGET,
                        "x",
                        true,
                    ));
                    out.push(MsgTarget::new(
                        &lr.load,
                        format!("{w}: hinted guest poll share <= budget ({budget_pct:.1} %)"),
                        st.and_then(|s| s.guest_poll_pct.as_ref()).map(|p| p.median),
                        budget_pct,
                        "%",
                        false,
                    ));
                }
            }
            "loaded" => out.push(MsgTarget::new(
                &lr.load,
                format!(
                    "host stress-ng bogo-ops/s: hinted >= {:.0} % of default",
                    HOST_WORK_TARGET * 100.0
                ),
                lr.host_work
                    .get(hinted)
                    .and_then(|h| h.vs_default)
                    .map(|r| round(r * 100.0, 1)),
                HOST_WORK_TARGET * 100.0,
                "%",
                true,
            )),
            _ => {}
        }
    }
    out
}

/// Builds the report (loads in run order).
pub fn build(raw: &MsgRaw) -> MsgReport {
    let loads: Vec<LoadReport> = raw.loads.iter().map(|&l| load_report(raw, l)).collect();
    MsgReport {
        schema: "pvsched-bench-msgpass/1".into(),
        meta: raw.meta.clone(),
        targets: targets(&loads, raw.meta.budget_permille),
        loads,
        plots: Vec::new(),
    }
}
