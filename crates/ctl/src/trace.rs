//! A recording as a Chrome trace-event file (opens in Perfetto and
//! chrome://tracing): per VM a process, per vCPU thread a track of
//! running / preempted / halted / woken slices, and beside it a track of the
//! daemon's boost, unboost and throttle decisions with their reasons.

use std::collections::BTreeMap;

use pvsched_control::{Recording, TraceKind};
use serde_json::{json, Value};

/// Offset of a vCPU's decision track from its thread id (thread ids stay
/// below 2^22 on Linux, so the sum never names a real thread).
pub const DECISION_TRACK_OFFSET: i64 = 10_000_000;

fn us(ns: u64, start: u64) -> f64 {
    ns.saturating_sub(start) as f64 / 1000.0
}

pub fn to_chrome_trace(rec: &Recording) -> Value {
    let mut events = Vec::new();
    let mut pid_of: BTreeMap<i32, i32> = BTreeMap::new();
    let mut seen_vm = BTreeMap::new();
    for t in &rec.tracks {
        pid_of.insert(t.tid, t.tgid);
        if seen_vm.insert(t.tgid, ()).is_none() {
            events.push(json!({"ph": "M", "name": "process_name", "pid": t.tgid,
                "args": {"name": format!("VM {} (pid {})", t.vm, t.tgid)}}));
        }
        events.push(
            json!({"ph": "M", "name": "thread_name", "pid": t.tgid, "tid": t.tid,
            "args": {"name": format!("vCPU {} (tid {})", t.vcpu, t.tid)}}),
        );
        events.push(
            json!({"ph": "M", "name": "thread_sort_index", "pid": t.tgid, "tid": t.tid,
            "args": {"sort_index": t.vcpu * 2}}),
        );
        let dt = i64::from(t.tid) + DECISION_TRACK_OFFSET;
        events.push(
            json!({"ph": "M", "name": "thread_name", "pid": t.tgid, "tid": dt,
            "args": {"name": format!("vCPU {} pvsched decisions", t.vcpu)}}),
        );
        events.push(
            json!({"ph": "M", "name": "thread_sort_index", "pid": t.tgid, "tid": dt,
            "args": {"sort_index": t.vcpu * 2 + 1}}),
        );
    }
    let mut records: Vec<_> = rec
        .records
        .iter()
        .filter(|r| pid_of.contains_key(&r.tid))
        .collect();
    records.sort_by_key(|r| r.ts_ns);
    // Open slices: state per tid, boost per tid.
    let mut state: BTreeMap<i32, (u64, &'static str)> = BTreeMap::new();
    let mut boost: BTreeMap<i32, (u64, String, String)> = BTreeMap::new();
    let start = rec.start_ns;
    let close = |events: &mut Vec<Value>,
                 pid: i32,
                 tid: i64,
                 from: u64,
                 to: u64,
                 name: &str,
                 args: Value| {
        events.push(json!({"ph": "X", "name": name, "pid": pid, "tid": tid,
            "ts": us(from, start), "dur": us(to, from), "args": args}));
    };
    for r in records {
        let pid = pid_of[&r.tid];
        let tid = i64::from(r.tid);
        let state_name = match r.kind {
            TraceKind::Running => Some("running"),
            TraceKind::Preempted => Some("preempted (runnable)"),
            TraceKind::Halted => Some("halted"),
            TraceKind::Woken => Some("woken (runnable)"),
            _ => None,
        };
        if let Some(name) = state_name {
            if let Some((from, prev)) = state.insert(r.tid, (r.ts_ns, name)) {
                close(&mut events, pid, tid, from, r.ts_ns, prev, json!({}));
            }
            continue;
        }
        let reason = r.reason.clone().unwrap_or_default();
        let params = r.params.clone().unwrap_or_default();
        let dt = tid + DECISION_TRACK_OFFSET;
        if let Some((from, why, p)) = boost.remove(&r.tid) {
            close(
                &mut events,
                pid,
                dt,
                from,
                r.ts_ns,
                &format!("boost: {why}"),
                json!({"params": p}),
            );
        }
        match r.kind {
            TraceKind::Boost => {
                boost.insert(r.tid, (r.ts_ns, reason, params));
            }
            TraceKind::Throttle | TraceKind::Unboost => {
                let name = if r.kind == TraceKind::Throttle {
                    "throttle"
                } else {
                    "unboost"
                };
                events.push(
                    json!({"ph": "i", "s": "t", "name": name, "pid": pid, "tid": dt,
                    "ts": us(r.ts_ns, start), "args": {"reason": reason, "params": params}}),
                );
            }
            _ => {}
        }
    }
    let end = rec.end_ns.max(start);
    for (tid, (from, name)) in state {
        close(
            &mut events,
            pid_of[&tid],
            i64::from(tid),
            from,
            end,
            name,
            json!({}),
        );
    }
    for (tid, (from, why, p)) in boost {
        close(
            &mut events,
            pid_of[&tid],
            i64::from(tid) + DECISION_TRACK_OFFSET,
            from,
            end,
            &format!("boost: {why}"),
            json!({"params": p}),
        );
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms",
        "metadata": {"source": "pvschedctl record", "duration_s": (end - start) as f64 * 1e-9}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvsched_control::{TraceRecord, TrackInfo};

    fn rec(ts: u64, tid: i32, kind: TraceKind, reason: Option<&str>) -> TraceRecord {
        TraceRecord {
            ts_ns: ts,
            tid,
            kind,
            reason: reason.map(str::to_string),
            params: None,
        }
    }

    #[test]
    fn a_boost_between_two_decisions_becomes_one_slice_on_the_decision_track() {
        let recording = Recording {
            start_ns: 1_000,
            end_ns: 10_000_000,
            tracks: vec![TrackInfo {
                vm: "a".into(),
                tgid: 50,
                vcpu: 1,
                tid: 51,
            }],
            records: vec![
                rec(2_000, 51, TraceKind::Running, None),
                rec(3_000, 51, TraceKind::Boost, Some("guest_rt")),
                rec(5_000, 51, TraceKind::Preempted, None),
                rec(9_000, 51, TraceKind::Unboost, Some("none")),
                rec(9_500, 99, TraceKind::Running, None), // untracked: dropped
            ],
        };

        let trace = to_chrome_trace(&recording);
        let events = trace["traceEvents"].as_array().unwrap();
        let slices: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();

        let boost = slices
            .iter()
            .find(|e| e["name"] == "boost: guest_rt")
            .unwrap();
        assert_eq!(boost["tid"], 51 + DECISION_TRACK_OFFSET);
        assert_eq!(
            (boost["ts"].as_f64(), boost["dur"].as_f64()),
            (Some(2.0), Some(6.0))
        );
        let running = slices.iter().find(|e| e["name"] == "running").unwrap();
        assert_eq!(
            (running["tid"].as_i64(), running["dur"].as_f64()),
            (Some(51), Some(3.0))
        );
        assert!(slices.iter().all(|e| e["tid"] != 99));
        assert!(events
            .iter()
            .any(|e| e["name"] == "thread_name" && e["args"]["name"] == "vCPU 1 (tid 51)"));
    }
}
