//! The standard scenario's report.md.

use std::fmt::Write as _;

use serde_json::Value;

use super::analysis::*;
use super::fairness;
use super::report::*;
use crate::harness::axes::Mode;
use crate::harness::figures::join;
use crate::harness::markdown as md;

/// What the host pays per mode beyond CPU time (interrupts, the daemon's
/// wakeups by cause), and where a reaction's time goes.
fn host_costs_markdown(o: &mut String, r: &Report) {
    let rows: Vec<(&Scenario, &str, &ModeReport)> = r
        .scenarios
        .iter()
        .flat_map(|s| s.modes.iter().map(move |(m, x)| (s, m.as_str(), x)))
        .filter(|(_, _, x)| x.interrupts.is_some())
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\n## What the host pays besides CPU time (cyclictest phases)\n\n\
         The host's interrupts per second over the phases (`/proc/interrupts`, both CPUs: \
         local timer, rescheduling IPIs, function-call IPIs; on a machine that is itself a VM \
         each is an exit to the outer hypervisor), beside the host's cyclictest p99; for \
         pvsched, its event thread's wakeups per second by cause (records, its timer, a guest \
         doorbell) and the doorbell rings, over its whole sessions.\n"
    );
    let _ = writeln!(
        o,
        "| load | interval | mode | host p99 µs | timer irq/s | resched IPI/s | call IPI/s | \
         daemon wakeups/s: records / timer / doorbell | rings/s |"
    );
    let _ = writeln!(o, "|---|---|---|--:|--:|--:|--:|---|--:|");
    for (s, mode, x) in rows {
        let Some(i) = x.interrupts else { continue };
        let d = |k: &str| x.daemon_per_s.get(k).copied();
        let (wakeups, rings) = if x.daemon_per_s.is_empty() {
            ("".to_string(), "".to_string())
        } else {
            let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
            (
                format!(
                    "{} / {} / {}",
                    f(d("wakeups_records")),
                    f(d("wakeups_timer")),
                    f(d("wakeups_doorbell"))
                ),
                f(d("doorbell_rings")),
            )
        };
        let _ = writeln!(
            o,
            "| {} | {} µs | {mode} | {} | {:.0} | {:.0} | {:.0} | {wakeups} | {rings} |",
            s.load, s.interval_us, x.host.summary.p99_us, i.local_timer, i.resched, i.call
        );
    }
    ipi_sources_markdown(o, r);
    let breakdown: Vec<(&str, &ModeReport)> = pvsched_per_load(r)
        .into_iter()
        .filter(|(_, m)| m.reaction.is_some())
        .collect();
    if breakdown.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\nWhere a reaction's time goes (pvschedd's histograms, bucket upper bounds, µs): the \
         whole reaction; its first part, host event -> the event thread awake \
         (`pvsched_reaction_wakeup_seconds`: the BPF ring's wakeup and the host scheduler \
         running a SCHED_FIFO thread); and one `sched_setattr` call \
         (`pvsched_setattr_seconds`). The rest is the daemon's own work.\n"
    );
    let _ = writeln!(
        o,
        "| load | reactions | p50 / p99 | event -> awake p50 / p99 | sched_setattr p50 / p99 |"
    );
    let _ = writeln!(o, "|---|--:|---|---|---|");
    let b = |v: Option<f64>| v.map_or("> 20000".into(), |v| format!("{v:.0}"));
    let pair = |x: &Option<Reaction>| {
        x.as_ref()
            .map_or("-".into(), |x| format!("{} / {}", b(x.p50_us), b(x.p99_us)))
    };
    for (load, m) in breakdown {
        let _ = writeln!(
            o,
            "| {load} | {} | {} | {} | {} |",
            m.reaction.as_ref().map_or(0, |x| x.actions),
            pair(&m.reaction),
            pair(&m.reaction_wakeup),
            pair(&m.setattr)
        );
    }
}

/// pvschedd with the guest doorbell against the same VM on its recheck
/// timer, per load where both ran: each mode's row and their ratio.
fn doorbell_vs_timer_markdown(o: &mut String, r: &Report) {
    if r.doorbell_vs_timer.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\n## pvschedd with the guest doorbell against its recheck timer (same VM, same run)\n\n\
         In `pvsched` pvschedd is handed the VM's doorbell: it offers the guest `F_DOORBELL`, \
         the guest rings when it clears a boost's reason, and boosted vCPUs need no recheck \
         timer. In `pvsched-timer` the same pvschedd serves the same VM without it (no \
         `--doorbell`) and re-reads boosted vCPUs on its recheck timer. pvschedd's own \
         process, percent of the machine over the cyclictest phases (the fairness table's \
         *pvschedd %*), and its event thread's wakeups per second by cause over its whole \
         sessions (*timer*: the recheck timer and the periodic scan, which share one timer), \
         with the guest's doorbell rings, and the vCPU preemptions pvschedd saw per second \
         (what a host-to-guest \"you were preempted\" interrupt would cost).\n"
    );
    let _ = writeln!(
        o,
        "| load | mode | pvschedd % of the machine | wakeups/s | records | timer | doorbell | rings/s | preemptions/s |"
    );
    let _ = writeln!(o, "|---|---|--:|--:|--:|--:|--:|--:|--:|");
    let pct = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.2}"));
    let rate = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.0}"));
    let times = |a: Option<f64>, b: Option<f64>| {
        opt_ratio(
            a.zip(b)
                .and_then(|(a, b)| crate::harness::figures::ratio(a, b)),
        )
    };
    for c in &r.doorbell_vs_timer {
        for (mode, d) in [
            ("pvsched (doorbell)", &c.doorbell),
            (Mode::PvschedTimer.name(), &c.timer),
        ] {
            let _ = writeln!(
                o,
                "| {} | {mode} | {} | {} | {} | {} | {} | {} | {} |",
                c.load,
                pct(d.cpu_pct),
                rate(d.wakeups_per_s),
                rate(d.records_per_s),
                rate(d.timer_per_s),
                rate(d.doorbell_per_s),
                rate(d.rings_per_s),
                rate(d.preempted_per_s)
            );
        }
        let (a, b) = (&c.doorbell, &c.timer);
        let _ = writeln!(
            o,
            "| {} | {DOORBELL_VS_TIMER} | {} | {} | {} | {} | {} | {} | {} |",
            c.load,
            opt_ratio(c.cpu_ratio),
            opt_ratio(c.wakeups_ratio),
            times(a.records_per_s, b.records_per_s),
            opt_ratio(c.timer_wakeups_ratio),
            times(a.doorbell_per_s, b.doorbell_per_s),
            times(a.rings_per_s, b.rings_per_s),
            times(a.preempted_per_s, b.preempted_per_s)
        );
    }
}

/// Where each pvsched session's boost budget went, from pvschedd's status at
/// its end: boosted time by reason, the latches and their length, refusals.
fn budget_markdown(o: &mut String, r: &Report) {
    let rows: Vec<(&str, usize, &Value)> = pvsched_per_load(r)
        .into_iter()
        .flat_map(|(load, m)| {
            m.daemon.iter().enumerate().flat_map(move |(i, d)| {
                d["vms"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(move |vm| (load, i + 1, vm))
            })
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(o, "\n## pvschedd's boost budget, per session\n");
    let _ = writeln!(
        o,
        "From pvschedd's status at the end of each pvsched session (every phase of it): \
         boosted vCPU time (on a CPU) by the reason in force, ms; demoted ms (charged \
         `demoted_charge` times); the times the budget latched and how long it stayed \
         latched; boosts refused for budget.\n"
    );
    let _ = writeln!(
        o,
        "| load | session | boosted s | by reason (ms) | demoted ms | latches | latched ms | refused |"
    );
    let _ = writeln!(o, "|---|--:|--:|---|--:|--:|--:|--:|");
    let f = |vm: &Value, k: &str| vm[k].as_f64().unwrap_or(0.0);
    for (load, i, vm) in rows {
        let mut by: Vec<(String, f64)> = vm["boosted_ms_by_reason"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_f64().unwrap_or(0.0)))
                    .collect()
            })
            .unwrap_or_default();
        by.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let by: Vec<String> = by.iter().map(|(k, v)| format!("{k} {v:.0}")).collect();
        let _ = writeln!(
            o,
            "| {load} | {i} | {:.2} | {} | {:.0} | {} | {:.0} | {} |",
            f(vm, "boosted_s"),
            if by.is_empty() {
                "-".into()
            } else {
                by.join(", ")
            },
            f(vm, "demoted_ms"),
            vm["budget_latches"].as_u64().unwrap_or(0),
            f(vm, "budget_latched_ms"),
            vm["over_budget"].as_u64().unwrap_or(0),
        );
    }
}

/// Where the host's IPIs come from, per (load, interval, mode).
fn ipi_sources_markdown(o: &mut String, r: &Report) {
    let rows: Vec<(&Scenario, &str, &crate::ipi_sources::Sources)> = r
        .scenarios
        .iter()
        .flat_map(|s| s.modes.iter().map(move |(m, x)| (s, m.as_str(), x)))
        .filter_map(|(s, m, x)| x.ipi_sources.as_ref().map(|i| (s, m, i)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\nWhere the IPIs come from (the `ipi:ipi_send_cpu` and `ipi_send_cpumask` \
         tracepoints over the same phases, per second): by the kernel function that sent \
         each one (a wakeup preempting the target CPU's task; an RT task pushed to another \
         CPU, which the kernel does when a higher RT task preempts it, on that task's wakeup \
         path; a queued remote wakeup; `sched_setattr` on a thread running elsewhere) and by \
         the task current on the sending CPU. Under TCG, QEMU's main loop delivers the \
         guest's timers by waking vCPU threads.\n"
    );
    let _ = writeln!(
        o,
        "| load | interval | mode | IPIs/s | wakeup preempts: QEMU main loop / vCPUs / rest | \
         RT push: by host cyclictest / pvschedd / rest | remote wakeups | sched_setattr | other | lost |"
    );
    let _ = writeln!(o, "|---|---|---|--:|---|---|--:|--:|--:|--:|");
    for &(s, mode, i) in &rows {
        let split = |cause: &str, a: &str, b: &str| {
            let (x, y) = (i.get(cause, a), i.get(cause, b));
            format!(
                "{x:.0} / {y:.0} / {:.0}",
                (i.cause_total(cause) - x - y).max(0.0)
            )
        };
        let _ = writeln!(
            o,
            "| {} | {} µs | {mode} | {:.0} | {} | {} | {:.0} | {:.0} | {:.0} | {} |",
            s.load,
            s.interval_us,
            i.total(),
            split("wakeup preempts", "QEMU main loop", "vCPU"),
            split("RT push", "host cyclictest", "pvschedd"),
            i.cause_total("remote wakeup"),
            i.cause_total("sched_setattr"),
            i.cause_total("other"),
            i.lost
        );
    }
    // The "other" column by the function that sent each IPI, where recorded.
    let others: Vec<String> = rows
        .iter()
        .filter(|(_, _, i)| !i.other_callsites.is_empty())
        .map(|(s, mode, i)| {
            let mut by: Vec<(&String, &f64)> = i.other_callsites.iter().collect();
            by.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
            let top: Vec<String> = by
                .iter()
                .take(4)
                .map(|(f, v)| format!("`{f}` {v:.1}"))
                .collect();
            format!("{} {} µs {mode}: {}", s.load, s.interval_us, top.join(", "))
        })
        .collect();
    if !others.is_empty() {
        let _ = writeln!(
            o,
            "\n\"Other\" IPIs per second by the kernel function that sent them (the first four): {}.",
            others.join("; ")
        );
    }
}

fn opt_ratio(r: Option<f64>) -> String {
    match r {
        Some(r) if r >= 10.0 => format!("{r:.0}x"),
        Some(r) => format!("{r:.2}x"),
        None => "n/a".into(),
    }
}

fn us(v: u64) -> String {
    v.to_string()
}

/// The Markdown report (also what the bench prints at the end).
pub fn markdown(r: &Report) -> String {
    let m = &r.meta;
    let mut o = String::new();
    let _ = writeln!(o, "# pvsched bench: {}\n", m.started);
    md::run_lines(
        &mut o,
        m,
        &[&m.machine.qemu, &m.machine.cyclictest, &m.machine.stress_ng],
    );
    let _ = writeln!(
        o,
        "Guest: {} vCPUs, kernel {}, pvsched.ko {}  ",
        m.guest_cpus, m.guest_kernel, m.guest_module
    );
    let _ = writeln!(o, "Host load (\"loaded\"): `{}`  ", m.load_cmd);
    let _ = writeln!(
        o,
        "static-rt: every vCPU thread SCHED_RR {} (as `chrt -r` / libvirt `<vcpusched>`)  ",
        if m.static_rt_priority == 0 {
            8
        } else {
            m.static_rt_priority
        }
    );
    if m.pvschedd_settings.trim().is_empty() {
        let _ = writeln!(o, "pvschedd: default configuration  ");
    } else {
        let _ = writeln!(
            o,
            "pvschedd: defaults plus `{}`  ",
            m.pvschedd_settings.trim().replace('\n', "; ")
        );
    }
    let _ = writeln!(
        o,
        "Each cell: {} repeats x {} s, modes interleaved (rotated per repeat); guest and host \
         `cyclictest -p 8 --policy=rr` at the same time; histograms of the repeats merged. \
         Wall time {:.1} min.\n",
        m.repeat,
        m.duration_s,
        m.wall_s / 60.0
    );

    headline(&mut o, r);
    let _ = writeln!(
        o,
        "## Latency (µs): guest and host cyclictest, side by side\n"
    );
    md::head(
        &mut o,
        &[
            "load",
            "interval",
            "mode",
            "guest avg:",
            "guest p99:",
            "guest p99.9:",
            "guest max:",
            "host avg:",
            "host p99:",
            "host max:",
            "guest p99 per repeat",
            "host p99 per repeat",
            "guest loops:",
            "other load % per repeat",
        ],
    );
    for s in &r.scenarios {
        for (name, mr) in ordered(&s.modes) {
            let (g, h) = (&mr.guest.summary, &mr.host.summary);
            let other: Vec<String> = mr
                .other_load_pct_per_repeat
                .iter()
                .map(|p| format!("{p:.0}"))
                .collect();
            md::row(
                &mut o,
                &[
                    s.load.clone(),
                    format!("{} µs", s.interval_us),
                    name.to_string(),
                    format!("{:.0}", g.avg_us),
                    us(g.p99_us),
                    us(g.p999_us),
                    us(g.max_us),
                    format!("{:.0}", h.avg_us),
                    us(h.p99_us),
                    us(h.max_us),
                    join(&mr.guest.p99_us_per_repeat),
                    join(&mr.host.p99_us_per_repeat),
                    format!("{:.0} %", mr.guest.loops_ratio * 100.0),
                    other.join(", "),
                ],
            );
        }
    }

    let _ = writeln!(o, "\n## Ratios (same run)\n");
    let _ = writeln!(
        o,
        "| load | interval | pair | guest avg | guest p99 | guest max | host avg | host p99 | host max | audio glitches | host load throughput |"
    );
    let _ = writeln!(o, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|");
    for s in &r.scenarios {
        for (pair, x) in &s.ratios {
            let _ = writeln!(
                o,
                "| {} | {} µs | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                s.load,
                s.interval_us,
                pair,
                opt_ratio(x.guest_avg),
                opt_ratio(x.guest_p99),
                opt_ratio(x.guest_max),
                opt_ratio(x.host_avg),
                opt_ratio(x.host_p99),
                opt_ratio(x.host_max),
                opt_ratio(x.glitches),
                opt_ratio(x.host_load),
            );
        }
    }

    let _ = writeln!(
        o,
        "\n## Audio, ping-pong and host throughput, per load and mode\n"
    );
    let mut audio_desc = String::new();
    let _ = writeln!(
        o,
        "| load | mode | audio glitches / periods | glitches per repeat | worst audio delay µs | ping-pong p50 µs | ping-pong p99 µs | host load bogo ops/s | host load vs vanilla |"
    );
    let _ = writeln!(o, "|---|---|--:|---|--:|--:|--:|---|--:|");
    let mut seen = std::collections::BTreeSet::new();
    for s in &r.scenarios {
        if !seen.insert(s.load.clone()) {
            continue;
        }
        for (name, mr) in ordered(&s.modes) {
            let (gl, per, late) = match &mr.audio {
                Some(a) => {
                    if audio_desc.is_empty() {
                        audio_desc = format!(
                            "audiosim: SCHED_FIFO 8 in the guest, period {} µs, glitch = a period done later than {} µs after its start.",
                            a.period_us, a.buffer_us
                        );
                    }
                    (
                        format!("{} / {}", a.glitches, a.periods),
                        join(&a.glitches_per_repeat),
                        a.late_max_us.to_string(),
                    )
                }
                None => ("n/a".into(), "".into(), "".into()),
            };
            let (p50, p99) = match &mr.pingpong {
                Some(p) => (format!("{:.0}", p.p50_us), format!("{:.0}", p.p99_us)),
                None => ("n/a".into(), "n/a".into()),
            };
            let (ops, rel) = match &mr.host_load {
                Some(l) => (
                    l.ops_per_s
                        .iter()
                        .map(|(k, v)| format!("{k} {v:.0}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    l.vs_vanilla
                        .map(|v| format!("{:.1} %", v * 100.0))
                        .unwrap_or_else(|| "n/a".into()),
                ),
                None => ("(idle)".into(), "".into()),
            };
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                s.load, name, gl, per, late, p50, p99, ops, rel
            );
        }
    }
    if !audio_desc.is_empty() {
        let _ = writeln!(
            o,
            "\n{audio_desc} Ping-pong: two guest threads on two vCPUs passing a byte through pipes (SCHED_OTHER)."
        );
    }

    fairness::markdown::markdown(&mut o, &r.fair_share);
    super::modcost::markdown::markdown(&mut o, r.modcost.as_ref());

    let reactions: Vec<(&str, &Reaction)> = pvsched_per_load(r)
        .into_iter()
        .filter_map(|(load, m)| m.reaction.as_ref().map(|x| (load, x)))
        .collect();
    if !reactions.is_empty() {
        let _ = writeln!(
            o,
            "\n## pvschedd's reaction latency (host event -> sched_setattr returned)\n"
        );
        let _ = writeln!(
            o,
            "The daemon's own histogram (`pvsched_reaction_latency_seconds`), over every pvsched \
             session of the load: the changes an event caused (not those of its timers); \
             figures are bucket upper bounds.\n"
        );
        let _ = writeln!(o, "| load | actions | p50 µs | p90 µs | p99 µs | max µs |");
        let _ = writeln!(o, "|---|--:|--:|--:|--:|--:|");
        let b = |v: Option<f64>| v.map_or("> 20000".into(), |v| format!("{v:.0}"));
        for (load, x) in reactions {
            let _ = writeln!(
                o,
                "| {load} | {} | {} | {} | {} | {} |",
                x.actions,
                b(x.p50_us),
                b(x.p90_us),
                b(x.p99_us),
                b(x.max_us)
            );
        }
    }

    budget_markdown(&mut o, r);
    host_costs_markdown(&mut o, r);
    doorbell_vs_timer_markdown(&mut o, r);
    super::simulated::markdown(&mut o, r.simulated.as_ref());
    super::host_cost_targets::markdown(&mut o, &r.host_cost_targets);

    if !r.targets.is_empty() {
        let _ = writeln!(o, "\n## Targets (loaded host)\n");
        let _ = writeln!(o, "| interval | target | pvsched µs | limit µs | result |");
        let _ = writeln!(o, "|---|---|--:|--:|---|");
        for t in &r.targets {
            let _ = writeln!(
                o,
                "| {} µs | {} | {} | {:.0} | {} |",
                t.interval_us,
                t.what,
                t.value_us,
                t.limit_us,
                t.verdict()
            );
        }
    }
    if !m.notes.is_empty() {
        let _ = writeln!(o, "\n## Notes\n");
        for n in &m.notes {
            let _ = writeln!(o, "- {n}");
        }
    }
    if !r.plots.is_empty() {
        let _ = writeln!(o, "\n## Plots\n");
        for p in &r.plots {
            let _ = writeln!(o, "![{p}]({p})");
        }
    }
    o
}

/// The comparison the project is about: p99 under load, three modes side
/// by side, guest and host.
fn headline(o: &mut String, r: &Report) {
    let loaded: Vec<&Scenario> = r.scenarios.iter().filter(|s| s.load == "loaded").collect();
    if loaded.is_empty() {
        return;
    }
    let modes: Vec<&str> = Mode::EVERY
        .iter()
        .map(|m| m.name())
        .filter(|m| loaded.iter().any(|s| s.modes.contains_key(*m)))
        .collect();
    let _ = writeln!(o, "## Loaded host: p99 latency (µs), modes side by side\n");
    let mut head = String::from("| interval |");
    let mut rule = String::from("|---|");
    for side in ["guest", "host"] {
        for m in &modes {
            let _ = write!(head, " {side} p99 {m} |");
            rule.push_str("--:|");
        }
    }
    let _ = writeln!(o, "{head}\n{rule}");
    for s in loaded {
        let mut row = format!("| {} µs |", s.interval_us);
        for side in ["guest", "host"] {
            for m in &modes {
                let v = s.modes.get(*m).map(|mr| {
                    if side == "guest" {
                        mr.guest.summary.p99_us
                    } else {
                        mr.host.summary.p99_us
                    }
                });
                let _ = write!(
                    row,
                    " {} |",
                    v.map(|v| v.to_string()).unwrap_or("n/a".into())
                );
            }
        }
        let _ = writeln!(o, "{row}");
    }
    let _ = writeln!(o);
}
