//! What the message-passing scenario reads: the guest programs' command
//! and output (their sections, the guest's uptime), a vCPU thread's run
//! time on the host, and pvschedd's idle advice.

use std::collections::BTreeMap;

use serde_json::Value;

use super::model::*;
use crate::error::{io, BenchError, Result};
use crate::guest as gp;
use crate::guest_idle::*;

/// The advice in `pvschedctl idle --json`'s reply (`report`) for the VM
/// `vm`: the VM-wide `host_advice` when the daemon gives one (asked for one
/// VM, it covers that VM's vCPUs), else the largest vCPU window, so that no
/// vCPU polls less than its own advice. None when nothing was measured.
pub fn parse_advice(report: &Value, vm: &str) -> Result<Option<Advice>> {
    let err = |msg: String| BenchError::Parse {
        what: "pvschedctl idle --json".into(),
        msg,
    };
    let outcome = |v: &Value| -> Option<(f64, f64, f64)> {
        Some((
            v.get("window_us")?.as_f64()?,
            v.get("hit_rate")?.as_f64()?,
            v.get("cpu_share")?.as_f64()?,
        ))
    };
    let vms = report
        .get("vms")
        .and_then(Value::as_array)
        .ok_or_else(|| err(format!("no `vms` list in {report}")))?;
    let this = vms
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(vm))
        .ok_or_else(|| err(format!("VM {vm:?} is not in the report")))?;
    let mut per_vcpu = Vec::new();
    for v in this
        .get("vcpus")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let halts: u64 = v
            .get("halts")
            .and_then(Value::as_array)
            .map(|b| b.iter().filter_map(|x| x.get(1)?.as_u64()).sum())
            .unwrap_or(0);
        let a = v
            .get("advice")
            .and_then(outcome)
            .ok_or_else(|| err(format!("a vCPU without `advice`: {v}")))?;
        if halts > 0 {
            per_vcpu.push(a);
        }
    }
    let (exact, hit_rate, cpu_share, source) = match report.get("host_advice").and_then(outcome) {
        Some((w, h, c)) => (w, h, c, "VM-wide advice (every vCPU's halts)"),
        None => match per_vcpu.iter().copied().max_by(|a, b| a.0.total_cmp(&b.0)) {
            Some((w, h, c)) => (w, h, c, "the largest vCPU window"),
            None => return Ok(None),
        },
    };
    if !(exact.is_finite() && (0.0..=u32::MAX as f64).contains(&exact)) {
        return Err(err(format!("window {exact} µs")));
    }
    Ok(Some(Advice {
        window_us: exact.ceil() as u32,
        window_us_exact: exact,
        hit_rate,
        cpu_share,
        source: source.into(),
        per_vcpu_us: per_vcpu.iter().map(|a| a.0).collect(),
    }))
}

/// `@@NAME rest` markers of a measurement's guest command: each section's
/// first-line rest and the lines up to the next marker.
pub fn sections(out: &str) -> BTreeMap<String, (String, String)> {
    let mut m: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in out.lines() {
        if let Some(rest) = line.trim().strip_prefix("@@") {
            let (name, arg) = rest.split_once(' ').unwrap_or((rest, ""));
            m.insert(name.to_string(), (arg.trim().to_string(), String::new()));
            current = Some(name.to_string());
        } else if let Some(body) = current.as_ref().and_then(|c| m.get_mut(c)) {
            body.1.push_str(line);
            body.1.push('\n');
        }
    }
    m
}

/// Seconds since boot from `/proc/uptime`'s text.
pub fn parse_uptime(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

/// The run time (ns) in `/proc/<pid>/task/<tid>/schedstat`'s text.
pub fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// The guest command of one measurement: the idle driver's counters and the
/// guest clock before and after the program, between `@@` markers.
pub fn measure_cmd(w: Workload, secs: u64) -> String {
    format!(
        "I={IDLE_FILE}; echo @@IDLE0; cat $I 2>/dev/null; echo @@UP0 $(cat /proc/uptime); \
         echo @@PROG; {} 2>&1; rc=$?; echo @@UP1 $(cat /proc/uptime); echo @@IDLE1; \
         cat $I 2>/dev/null; echo @@RC $rc; exit $rc",
        w.command(secs)
    )
}

/// A measurement from the guest command's output `out`: everything but the
/// host-side figures.
pub fn parse_measurement(w: Workload, out: &str, guest_cpus: u32) -> Result<Measurement> {
    let parse = |msg: String| BenchError::Parse {
        what: format!("{w} measurement"),
        msg,
    };
    let s = sections(out);
    let get = |k: &str| {
        s.get(k)
            .ok_or_else(|| parse(format!("no @@{k} in {:?}", tail(out))))
    };
    let prog = &get("PROG")?.1;
    let line =
        gp::last_json_line(prog).ok_or_else(|| parse(format!("no JSON in {:?}", tail(prog))))?;
    let program: Value = serde_json::from_str(line).map_err(|source| BenchError::Json {
        what: format!("{w} line {line:?}"),
        source,
    })?;
    let (count, per_s, p50, p99) = w.figures(&program)?;
    let up = |k: &str| -> Result<f64> {
        let (arg, _) = get(k)?;
        parse_uptime(arg).ok_or_else(|| parse(format!("@@{k}: not an uptime: {arg:?}")))
    };
    let guest_window_s = up("UP1")? - up("UP0")?;
    let idle = |k: &str| -> Result<Option<IdleFile>> {
        let body = &get(k)?.1;
        if body.trim().is_empty() {
            Ok(None)
        } else {
            parse_idle(body).map(Some)
        }
    };
    let idle = match (idle("IDLE0")?, idle("IDLE1")?) {
        (Some(a), Some(b)) => b.total().since(&a.total()),
        _ => None,
    };
    Ok(Measurement {
        workload: Some(w),
        count,
        per_s,
        latency_p50_us: p50,
        latency_p99_us: p99,
        program,
        guest_window_s,
        idle,
        guest_cpus,
        ..Default::default()
    })
}

pub(super) fn tail(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    chars[chars.len().saturating_sub(400)..].iter().collect()
}

/// Run time (ns) of each thread `tids` of process `pid`; an error when one
/// is gone (a vCPU thread of a running VM does not go).
pub(super) fn run_times(pid: u32, tids: &[i32]) -> Result<Vec<u64>> {
    tids.iter()
        .map(|t| {
            let p = format!("/proc/{pid}/task/{t}/schedstat");
            let text = std::fs::read_to_string(&p).map_err(io(format!("reading {p}")))?;
            parse_schedstat(&text).ok_or_else(|| BenchError::Parse {
                what: p,
                msg: format!("not a schedstat line: {text:?}"),
            })
        })
        .collect()
}
