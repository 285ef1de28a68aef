//! The eventual-fairness tables of report.md, their definitions, and the
//! sentences computed from their numbers that read them.

use std::fmt::Write as _;

use super::super::report::*;
use super::analysis::{pct, times};
use crate::harness::axes::Mode;

/// How the shares are made (printed under the section's title).
pub const DEFINITION: &str = "Over the cyclictest phases of each session (the bulk of it; \
    audio and ping-pong are not included), CPU time / (phase wall time x host CPUs), from /proc: \
    the QEMU process (utime + stime of every thread, exited ones included; split into its vCPU \
    threads, `/proc/<pid>/task/<tid>/stat`, and the rest: the main loop, I/O threads), \
    stress-ng's process tree (reaped children included) and the machine's busy time \
    (`/proc/stat`, steal included; what busy leaves beside VM and load is the cyclictests, \
    pvschedd, the bench, kernel threads and other jobs); in the pvsched mode pvschedd's own \
    process (utime + stime of its threads, *pvschedd %*). Per repeat: that repeat's phases pooled; \
    the other columns pool every repeat. *vs vanilla*: this mode's pooled share / vanilla's. \
    *boosted*: the vCPU time pvschedd counted as boosted and not halted (its status `boosted_s`, \
    the difference over each phase) / (wall x vCPUs), beside the budget it enforces \
    (`boost_share_permille`, banked over `fairness_window_ns`). *host load throughput*: \
    stress-ng's bogo-ops/s over the whole session (geometric mean over the stressors) / \
    vanilla's.";

/// What the entitlement is (printed once, under [`DEFINITION`]).
pub const ENTITLEMENT_DEFINITION: &str = "*Fair-class entitlement* of the vCPU threads = \
    sum over the vCPU threads of min(d_i, r) / host CPUs: d_i is the CPU rate vCPU thread i \
    used under static-rt under the same load (at RT nothing preempts it, so it runs whenever it \
    is runnable: its demand), r the CPU rate the fair class gave an always-runnable nice-0 \
    thread under vanilla in the same run (the mean of stress-ng's `--cpu` workers; on the idle \
    host, with no such competitor, a whole CPU). Assumed: every thread has the same weight \
    (nice 0, as QEMU and stress-ng run), the guest wants the same CPU in every mode, and the \
    fair class shares max-min (a thread wanting less than r takes what it wants, the others \
    share the rest equally). Without static-rt the demand is unknown and the entitlement is an \
    upper bound (vCPUs x r). Under vanilla the vCPU threads got what the fair class gave them, \
    which is the other yardstick (*vs vanilla*).";

/// The section of report.md; nothing when no phase was measured (a
/// raw.json from before the shares).
pub fn markdown(o: &mut String, shares: &[LoadShare]) {
    if shares.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\n## Eventual fairness: CPU shares over the cyclictest phases\n"
    );
    let _ = writeln!(o, "{DEFINITION}\n");
    let _ = writeln!(o, "{ENTITLEMENT_DEFINITION}");
    for ls in shares {
        let _ = writeln!(
            o,
            "\n### {} host ({} CPUs, {} vCPUs)\n",
            ls.load, ls.host_cpus, ls.vcpus
        );
        let _ = writeln!(
            o,
            "| mode | VM CPU % per repeat | VM % (vCPU threads + rest) | VM vs vanilla | vCPUs vs entitlement | boosted % of vCPU time (budget) | guest idle polling % (driver) | host load CPU % | host load CPU vs vanilla | host load throughput vs vanilla | pvschedd % | machine busy % |"
        );
        let _ = writeln!(o, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
        for m in Mode::EVERY {
            let Some(r) = ls.modes.get(m.name()) else {
                continue;
            };
            let boosted = match (r.boosted_pct, r.boost_budget_pct) {
                (Some(b), Some(x)) => format!("{b:.1} ({x:.0})"),
                (Some(b), None) => format!("{b:.1}"),
                _ => String::new(),
            };
            let poll = match r.guest_poll_pct {
                Some(x) => format!("{x:.1} ({})", r.guest_idle.join(", ")),
                None => "n/a".into(),
            };
            let _ = writeln!(
                o,
                "| {} | {} | {:.1} ({:.1} + {:.1}) | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
                m.name(),
                r.vm_pct_per_repeat
                    .iter()
                    .map(|p| format!("{p:.1}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                r.vm_pct,
                r.vcpu_pct,
                r.vm_pct - r.vcpu_pct,
                times(r.vm_vs_vanilla),
                times(r.vcpu_vs_entitlement),
                boosted,
                poll,
                pct(r.load_pct),
                times(r.load_cpu_vs_vanilla),
                r.load_throughput_vs_vanilla
                    .map_or_else(|| "n/a".into(), |t| format!("{:.1} %", t * 100.0)),
                r.daemon_pct.map_or_else(String::new, |d| format!("{d:.2}")),
                r.busy_pct
            );
        }
        for m in Mode::EVERY {
            let Some(r) = ls
                .modes
                .get(m.name())
                .filter(|r| !r.daemon_threads_pct.is_empty())
            else {
                continue;
            };
            let by_thread: Vec<String> = r
                .daemon_threads_pct
                .iter()
                .map(|(name, pct)| format!("{name} {pct:.2}"))
                .collect();
            let _ = writeln!(
                o,
                "\npvschedd % by thread, {}: {} (`pvschedd` is its event thread).",
                m.name(),
                by_thread.join(", ")
            );
        }
        match &ls.entitlement {
            Some(e) => {
                let demand = e.demand_cpus.as_ref().map_or_else(
                    || "d_i unknown (static-rt did not run)".to_string(),
                    |d| {
                        format!(
                            "d = [{}] CPUs (static-rt)",
                            d.iter()
                                .map(|x| format!("{x:.3}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    },
                );
                let _ =
                    writeln!(
                    o,
                    "\nEntitlement of the vCPU threads: {:.1} % of the machine{} (r = {:.3} CPUs, \
                     from {}; {demand}).",
                    e.pct,
                    if e.upper_bound { ", an upper bound" } else { "" },
                    e.fair_rate_cpus,
                    e.fair_rate_from
                );
            }
            None => {
                let _ = writeln!(
                    o,
                    "\nEntitlement of the vCPU threads: not computed (no vanilla phase with \
                     stress-ng's --cpu workers measured under this load)."
                );
            }
        }
        if !ls.reading.is_empty() {
            let _ = writeln!(o, "\n{}", ls.reading.join(" "));
        }
    }
}
