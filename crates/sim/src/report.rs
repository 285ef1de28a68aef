//! The simulator's report: a Markdown table per variant (modes side by side), the
//! scenario's targets with verdicts, and latency CCDF plots drawn by the same code as the
//! benchmark's.

use std::fmt::Write;
use std::path::Path;

use pvsched_report::plot::{latency_ccdf, Curve};

use crate::error::SimError;
use crate::results::ModeResult;
use crate::scenario::Scenario;

/// One target and whether the run meets it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Target {
    pub what: String,
    pub result: String,
    pub met: Option<bool>,
}

fn find<'a>(rs: &'a [ModeResult], variant: Option<&str>, mode: &str) -> Option<&'a ModeResult> {
    rs.iter()
        .find(|r| r.mode == mode && r.variant.as_deref() == variant)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::INFINITY
    }
}

fn verdict(what: String, value: f64, limit: f64, below: bool) -> Target {
    let met = if below {
        value <= limit
    } else {
        value >= limit
    };
    Target {
        result: format!(
            "{} ({value:.2}x, limit {}{limit:.2}x)",
            if met { "met" } else { "missed" },
            if below { "<= " } else { ">= " }
        ),
        what,
        met: Some(met),
    }
}

/// The targets the issue sets for the shipped scenarios (none for other files).
pub fn targets(sc: &Scenario, rs: &[ModeResult]) -> Vec<Target> {
    let mut out = Vec::new();
    match sc.name.as_str() {
        "busy-host" | "idle-host" => {
            let (Some(v), Some(s), Some(p)) = (
                find(rs, None, "vanilla"),
                find(rs, None, "static-rt"),
                find(rs, None, "pvsched"),
            ) else {
                return out;
            };
            if sc.name == "busy-host" {
                out.push(verdict(
                    "guest p99 vanilla / pvsched (vanilla >> pvsched)".into(),
                    ratio(v.guest_latency.p99_us as f64, p.guest_latency.p99_us as f64),
                    3.0,
                    false,
                ));
                out.push(verdict(
                    "guest avg vanilla / pvsched (vanilla >> pvsched)".into(),
                    ratio(v.guest_latency.avg_us, p.guest_latency.avg_us),
                    3.0,
                    false,
                ));
                out.push(verdict(
                    "host p99 static-rt / vanilla (static RT hurts the host)".into(),
                    ratio(s.host_latency.p99_us as f64, v.host_latency.p99_us as f64),
                    1.0 + 1e-9,
                    false,
                ));
            }
            out.push(verdict(
                "guest p99 pvsched / static-rt".into(),
                ratio(p.guest_latency.p99_us as f64, s.guest_latency.p99_us as f64),
                1.5,
                true,
            ));
            out.push(verdict(
                "host p99 pvsched / vanilla".into(),
                ratio(p.host_latency.p99_us as f64, v.host_latency.p99_us as f64),
                1.1,
                true,
            ));
        }
        "rogue-guest" => {
            let with = Some("with-rogue");
            let without = Some("without-rogue");
            let (Some(pw), Some(po), Some(vw)) = (
                find(rs, with, "pvsched"),
                find(rs, without, "pvsched"),
                find(rs, with, "vanilla"),
            ) else {
                return out;
            };
            let vm = |r: &ModeResult, name: &str| r.vms.iter().find(|v| v.name == name).cloned();
            if let (Some(n1), Some(n0)) = (vm(pw, "neighbour"), vm(po, "neighbour")) {
                if let (Some(l1), Some(l0)) = (n1.latency, n0.latency) {
                    out.push(verdict(
                        "neighbour p99 with / without the rogue (pvsched)".into(),
                        ratio(l1.p99_us as f64, l0.p99_us as f64),
                        1.2,
                        true,
                    ));
                }
            }
            out.push(verdict(
                "host p99 with / without the rogue (pvsched)".into(),
                ratio(pw.host_latency.p99_us as f64, po.host_latency.p99_us as f64),
                1.2,
                true,
            ));
            if let (Some(r1), Some(r0)) = (vm(pw, "rogue"), vm(vw, "rogue")) {
                let met = r1.cpu_share <= r0.cpu_share + 0.10;
                out.push(Target {
                    what: "rogue CPU share under pvsched <= its share under vanilla + 10 points"
                        .into(),
                    result: format!(
                        "{} ({:.1} %, limit {:.1} %)",
                        if met { "met" } else { "missed" },
                        r1.cpu_share * 100.0,
                        (r0.cpu_share + 0.10) * 100.0
                    ),
                    met: Some(met),
                });
            }
        }
        "lock-holder" => {
            let Some(v) = find(rs, None, "vanilla") else {
                return out;
            };
            for mode in ["pvsched", "pvsched-doorbell", "pvsched-locks"] {
                let Some(p) = find(rs, None, mode) else {
                    continue;
                };
                let tput =
                    |r: &ModeResult| r.vms.iter().map(|x| x.lock_acquisitions_per_s).sum::<f64>();
                let pre = |r: &ModeResult| r.vms.iter().map(|x| x.holder_preemptions).sum::<u64>();
                let avoided = 1.0 - ratio(pre(p) as f64, pre(v) as f64);
                out.push(Target {
                    what: format!("{mode}: lock throughput vs vanilla; holder preemptions avoided (eCS: 1.2-2.3x, 86-100 %)"),
                    result: format!(
                        "{:.2}x; {:.0} % avoided ({} vs {})",
                        ratio(tput(p), tput(v)),
                        avoided * 100.0,
                        pre(p),
                        pre(v)
                    ),
                    met: None,
                });
            }
        }
        _ => {}
    }
    out
}

fn cell(x: Option<u64>) -> String {
    x.map_or("-".into(), |v| v.to_string())
}

/// The Markdown report.
pub fn markdown(sc: &Scenario, rs: &[ModeResult], targets: &[Target]) -> String {
    let mut s = String::new();
    let costs = rs.first().map_or(sc.costs.as_str(), |r| r.costs.as_str());
    let _ = writeln!(
        s,
        "# pvsched-sim: {} (simulated, {} cost set, {} CPUs, {:.0} s per mode, seed {})\n",
        sc.name,
        costs,
        sc.host.cpus,
        sc.duration_s,
        rs.first().map_or(0, |r| r.seed)
    );
    if !sc.description.is_empty() {
        let _ = writeln!(s, "{}\n", sc.description.trim());
    }
    let variants = variants_of(rs);
    for var in variants {
        if let Some(v) = var {
            let _ = writeln!(s, "## Variant: {v}\n");
        }
        let _ = writeln!(
            s,
            "| mode | guest avg µs | guest p50 | guest p99 | guest p99.9 | guest max | host avg µs | host p99 | host max | host hogs % of machine |"
        );
        let _ = writeln!(s, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
        for r in rs.iter().filter(|r| r.variant.as_deref() == var) {
            let g = &r.guest_latency;
            let h = &r.host_latency;
            let has_g = g.samples > 0;
            let has_h = h.samples > 0;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
                r.mode,
                if has_g {
                    format!("{:.0}", g.avg_us)
                } else {
                    "-".into()
                },
                cell(has_g.then_some(g.p50_us)),
                cell(has_g.then_some(g.p99_us)),
                cell(has_g.then_some(g.p999_us)),
                cell(has_g.then_some(g.max_us)),
                if has_h {
                    format!("{:.0}", h.avg_us)
                } else {
                    "-".into()
                },
                cell(has_h.then_some(h.p99_us)),
                cell(has_h.then_some(h.max_us)),
                r.host_hog_share * 100.0
            );
        }
        let _ = writeln!(
            s,
            "\n| mode | VM | p99 µs | CPU % of machine | at RT % | audio glitches | lock acq/s | holder preemptions | round trips/s | boosts | throttles | over budget |"
        );
        let _ = writeln!(s, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
        for r in rs.iter().filter(|r| r.variant.as_deref() == var) {
            // Fleets: the first few VMs and a total.
            for vm in r.vms.iter().take(8) {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {:.1} | {:.1} | {} | {:.0} | {} | {:.0} | {} | {} | {} |",
                    r.mode,
                    vm.name,
                    cell(vm.latency.as_ref().map(|l| l.p99_us)),
                    vm.cpu_share * 100.0,
                    vm.rt_share * 100.0,
                    if vm.audio_periods > 0 {
                        format!("{} of {}", vm.audio_glitches, vm.audio_periods)
                    } else {
                        "-".into()
                    },
                    vm.lock_acquisitions_per_s,
                    vm.holder_preemptions,
                    vm.round_trips_per_s,
                    vm.boosts,
                    vm.throttles,
                    vm.over_budget
                );
            }
            if r.vms.len() > 8 {
                let _ = writeln!(
                    s,
                    "| {} | ({} more VMs) | | {:.1} (all) | {:.1} (all) | | | | | | | |",
                    r.mode,
                    r.vms.len() - 8,
                    r.vms.iter().map(|v| v.cpu_share).sum::<f64>() * 100.0,
                    r.vms.iter().map(|v| v.rt_share).sum::<f64>() * 100.0
                );
            }
        }
        let advised: Vec<_> = rs
            .iter()
            .filter(|r| r.variant.as_deref() == var)
            .flat_map(|r| r.vms.iter().take(8).map(move |vm| (r, vm)))
            .filter_map(|(r, vm)| vm.advisor.map(|a| (r, vm, a)))
            .collect();
        if !advised.is_empty() {
            let _ = writeln!(
                s,
                "\nHalt-polling advisor on the halts the policy measured (budget 5 % of a core per vCPU, whole run):\n\n| mode | VM | window µs | halts caught | CPU per vCPU |\n|---|---|--:|--:|--:|"
            );
            for (r, vm, a) in advised {
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.0} | {:.1} % | {:.2} % |",
                    r.mode,
                    vm.name,
                    a.window_us,
                    a.hit_rate * 100.0,
                    a.cpu_share * 100.0
                );
            }
        }
        if sc.sets_guest_idle() {
            idle_table(&mut s, rs.iter().filter(|r| r.variant.as_deref() == var));
        }
        if has_locks(sc) {
            lock_table(&mut s, rs.iter().filter(|r| r.variant.as_deref() == var));
        }
        let _ = writeln!(s);
    }
    if sc.sets_guest_idle() && rs.iter().any(|r| r.variant.is_some()) {
        idle_summary(&mut s, rs);
    }
    if !targets.is_empty() {
        let _ = writeln!(
            s,
            "## Targets (simulated)\n\n| target | result |\n|---|---|"
        );
        for t in targets {
            let _ = writeln!(s, "| {} | {} |", t.what, t.result);
        }
        let _ = writeln!(s);
    }
    s
}

fn pct(x: f64) -> String {
    format!("{:.1}", x * 100.0)
}

fn pressure(r: &ModeResult) -> String {
    r.host_cpu_pressure
        .map_or("-".into(), |p| format!("{:.0} %", p * 100.0))
}

/// The guest idle driver's table for one variant's results.
fn idle_table<'a>(s: &mut String, these: impl Iterator<Item = &'a ModeResult>) {
    let _ = writeln!(
        s,
        "\nGuest idle (host CPU % of machine; polls caught: ended by a wakeup, the rest ran out and halted; hinted's halts: overload and unhinted at once, budget where a window was due but the budget held less; host CPU pressure: PSI cpu some avg10 at the last discovery round):\n\n| mode | VM | guest idle | guest poll % | host poll % | polls | caught | halts | overload halts | unhinted halts | budget halts | host CPU pressure |\n|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
    );
    for r in these {
        for vm in r.vms.iter().take(8) {
            let i = &vm.idle;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.mode,
                vm.name,
                r.guest_idle,
                pct(i.guest_poll_share),
                pct(i.host_poll_share),
                i.guest_polls,
                i.guest_poll_hits,
                i.guest_halts,
                i.overload_halts,
                i.unhinted_halts,
                i.budget_halts,
                pressure(r)
            );
        }
    }
}

/// Whether a VM of the scenario runs a lock workload.
fn has_locks(sc: &Scenario) -> bool {
    sc.vms
        .iter()
        .flat_map(|v| v.tasks.iter())
        .any(|t| matches!(t, crate::scenario::GuestTaskSpec::Lock { .. }))
}

/// Lock throughput and CPU beside the policy's lock counters, per mode and VM.
fn lock_table<'a>(s: &mut String, these: impl Iterator<Item = &'a ModeResult>) {
    let _ = writeln!(
        s,
        "\nLocks (simulated; holder preemptions: host preemptions of a vCPU whose current task held a lock, counted by the sim; the rest: the policy's counters over the measured window, as `pvschedctl status` has them: contentions and holder preempted are the guests' counters as last read, pvsched-locks only; at the preemption: extensions granted when the host preempted a vCPU a wait already named (the rest began with a wait seen later); avoided: the vCPU ran again before its extension ended; extended: extension time on a CPU, the lock debt incurred; debt: owed at the end):\n\n| mode | VM | lock acq/s | CPU % of machine | at RT % | holder preemptions | contentions | holder preempted | extensions | at the preemption | refused | avoided | extended ms | repaid ms | debt ms |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
    );
    for r in these {
        for vm in r.vms.iter().take(8) {
            let l = &vm.locks;
            let _ = writeln!(
                s,
                "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.2} |",
                r.mode,
                vm.name,
                vm.lock_acquisitions_per_s,
                pct(vm.cpu_share),
                pct(vm.rt_share),
                vm.holder_preemptions,
                l.contentions,
                l.holder_preempted,
                l.extensions,
                l.at_preemption,
                l.refused,
                l.avoided,
                l.extended_ms,
                l.repaid_ms,
                l.debt_ms
            );
        }
    }
}

/// Every variant and mode on one line each: the scenario's throughput and VM CPU beside
/// the idle drivers' polling and the host's own work (VMs summed).
fn idle_summary(s: &mut String, rs: &[ModeResult]) {
    let _ = writeln!(
        s,
        "## Guest idle drivers, all variants (simulated; % of machine)\n\n| variant | mode | guest idle | round trips/s | VM CPU % | guest poll % | host poll % | polls caught | host hogs % | host CPU pressure |\n|---|---|---|--:|--:|--:|--:|--:|--:|--:|"
    );
    for r in rs {
        let sum = |f: fn(&crate::results::VmResult) -> f64| r.vms.iter().map(f).sum::<f64>();
        let polls: u64 = r.vms.iter().map(|v| v.idle.guest_polls).sum();
        let hits: u64 = r.vms.iter().map(|v| v.idle.guest_poll_hits).sum();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} |",
            r.variant.as_deref().unwrap_or("-"),
            r.mode,
            r.guest_idle,
            sum(|v| v.round_trips_per_s),
            pct(sum(|v| v.cpu_share)),
            pct(sum(|v| v.idle.guest_poll_share)),
            pct(sum(|v| v.idle.host_poll_share)),
            if polls > 0 {
                format!("{:.0} % of {polls}", hits as f64 * 100.0 / polls as f64)
            } else {
                "-".into()
            },
            pct(r.host_hog_share),
            pressure(r)
        );
    }
    let _ = writeln!(s);
}

/// The variants of `rs`, in the order they ran (`None`: the scenario has none).
fn variants_of(rs: &[ModeResult]) -> Vec<Option<&str>> {
    let mut variants: Vec<Option<&str>> = Vec::new();
    for r in rs {
        if !variants.contains(&r.variant.as_deref()) {
            variants.push(r.variant.as_deref());
        }
    }
    variants
}

/// One curve per mode that has samples in the histogram `hist` picks.
fn curves<'a>(
    these: &[&'a ModeResult],
    hist: impl Fn(&'a ModeResult) -> &'a pvsched_report::Histogram,
) -> Vec<Curve<'a>> {
    these
        .iter()
        .map(|&r| (r, hist(r)))
        .filter(|(_, h)| h.samples > 0)
        .map(|(r, h)| Curve {
            mode: &r.mode,
            hist: h,
        })
        .collect()
}

/// One CCDF plot per variant into `dir`.
pub fn plots(
    sc: &Scenario,
    rs: &[ModeResult],
    dir: &Path,
) -> Result<Vec<std::path::PathBuf>, SimError> {
    std::fs::create_dir_all(dir).map_err(|source| SimError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let interval = sc
        .vms
        .iter()
        .flat_map(|v| v.tasks.iter())
        .find_map(|t| match t {
            crate::scenario::GuestTaskSpec::Periodic { interval_us, .. } => {
                Some(*interval_us as u32)
            }
            _ => None,
        })
        .unwrap_or(1000);
    let variants = variants_of(rs);
    let mut written = Vec::new();
    for var in variants {
        let these: Vec<&ModeResult> = rs.iter().filter(|r| r.variant.as_deref() == var).collect();
        let guest = curves(&these, |r| &r.guest_hist);
        let host = curves(&these, |r| &r.host_hist);
        if guest.is_empty() && host.is_empty() {
            continue;
        }
        let file = match var {
            Some(v) => format!("{}-{v}.png", sc.name),
            None => format!("{}.png", sc.name),
        };
        let path = dir.join(file);
        let title = format!(
            "{}{} (simulated, {})",
            sc.name,
            var.map(|v| format!(" / {v}")).unwrap_or_default(),
            these.first().map_or("", |r| r.costs.as_str())
        );
        latency_ccdf(&path, &title, interval, &guest, &host)?;
        written.push(path);
    }
    Ok(written)
}
