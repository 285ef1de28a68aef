//! The rogue scenario's report.md.

use std::fmt::Write as _;

use super::analysis::*;
use super::model::*;
use super::report::*;
use crate::harness::figures::join;
use crate::harness::markdown as md;

fn opt_ratio(r: Option<f64>) -> String {
    r.map(|r| format!("{r:.2}x"))
        .unwrap_or_else(|| "n/a".into())
}

fn pcts(v: &[f64]) -> String {
    v.iter()
        .map(|p| format!("{p:.1}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The Markdown report (also what the bench prints at the end).
pub fn markdown(r: &RogueReport) -> String {
    let m = &r.meta.base;
    let rm = &r.meta;
    let mut o = String::new();
    let _ = writeln!(o, "# pvsched bench, rogue guest: {}\n", m.started);
    md::run_lines(
        &mut o,
        m,
        &[&m.machine.qemu, &m.machine.cyclictest, &m.machine.stress_ng],
    );
    let _ = writeln!(
        o,
        "Guests: neighbour `{NEIGHBOUR}` ({} vCPUs, pvsched.ko {}) and rogue `{ROGUE}` ({} vCPUs, \
         pvsched.ko {}), kernel {}, both booted for the whole run  ",
        m.guest_cpus, m.guest_module, rm.rogue_vcpus, rm.rogue_module, m.guest_kernel
    );
    let _ = writeln!(
        o,
        "Neighbour: guest `cyclictest -p 8 --policy=rr` on every vCPU; host: the same on every \
         host CPU, at the same time  "
    );
    let _ = writeln!(
        o,
        "Rogue (`-rogue` cases): `{}` on each of its vCPUs, started before and killed after each \
         measurement (guest RT throttling: {})  ",
        rm.rogue_cmd, rm.rogue_rt_throttle
    );
    let _ = writeln!(o, "Host load (\"loaded\"): `{}`  ", m.load_cmd);
    if m.pvschedd_settings.trim().is_empty() {
        let _ = writeln!(
            o,
            "pvschedd: {}, default configuration, serving both VMs  ",
            rm.pvschedd
        );
    } else {
        let _ = writeln!(
            o,
            "pvschedd: {}, defaults plus `{}`, serving both VMs  ",
            rm.pvschedd,
            m.pvschedd_settings.trim().replace('\n', "; ")
        );
    }
    let _ = writeln!(
        o,
        "Each cell: {} repeats x {} s, cases interleaved (rotated per repeat); histograms of the \
         repeats merged. Wall time {:.1} min.  ",
        m.repeat,
        m.duration_s,
        m.wall_s / 60.0
    );
    let _ = writeln!(o, "{}\n", rm.share_definition);
    let _ = writeln!(o, "Cases:");
    for c in Case::ALL {
        if r.cells.iter().any(|cell| cell.cases.contains_key(c.name())) {
            let _ = writeln!(o, "- `{}`: {}", c.name(), c.describe());
        }
    }
    let _ = writeln!(o);

    if !r.targets.is_empty() {
        let _ = writeln!(o, "## Targets\n");
        let _ = writeln!(o, "| load | interval | target | result |");
        let _ = writeln!(o, "|---|---|---|---|");
        for t in &r.targets {
            let _ = writeln!(
                o,
                "| {} | {} µs | {} | {} |",
                t.load,
                t.interval_us,
                t.what,
                t.verdict()
            );
        }
        let _ = writeln!(o);
    }

    let _ = writeln!(
        o,
        "## Latency (µs): the neighbour's guest cyclictest and the host's\n"
    );
    md::head(
        &mut o,
        &[
            "load",
            "interval",
            "case",
            "neighbour avg:",
            "neighbour p99:",
            "neighbour p99.9:",
            "neighbour max:",
            "neighbour p99 per repeat",
            "neighbour loops:",
            "host avg:",
            "host p99:",
            "host max:",
            "host p99 per repeat",
            "other load % per repeat",
        ],
    );
    for c in &r.cells {
        for (case, cr) in ordered(&c.cases) {
            let (g, h) = (&cr.guest.summary, &cr.host.summary);
            md::row(
                &mut o,
                &[
                    c.load.to_string(),
                    format!("{} µs", c.interval_us),
                    case.to_string(),
                    format!("{:.0}", g.avg_us),
                    g.p99_us.to_string(),
                    g.p999_us.to_string(),
                    g.max_us.to_string(),
                    join(&cr.guest.p99_us_per_repeat),
                    format!("{:.0} %", cr.guest.loops_ratio * 100.0),
                    format!("{:.0}", h.avg_us),
                    h.p99_us.to_string(),
                    h.max_us.to_string(),
                    join(&cr.host.p99_us_per_repeat),
                    pcts(&cr.other_load_pct_per_repeat),
                ],
            );
        }
    }

    let _ = writeln!(o, "\n## Ratios (same run)\n");
    let _ = writeln!(
        o,
        "| load | interval | neighbour p99 pvsched-rogue / pvsched-quiet | host p99 pvsched-rogue / pvsched-quiet | neighbour p99 vanilla-rogue / vanilla-quiet | host p99 vanilla-rogue / vanilla-quiet | rogue share pvsched - vanilla (points) |"
    );
    let _ = writeln!(o, "|---|---|--:|--:|--:|--:|--:|");
    for c in &r.cells {
        let x = &c.ratios;
        let _ = writeln!(
            o,
            "| {} | {} µs | {} | {} | {} | {} | {} |",
            c.load,
            c.interval_us,
            opt_ratio(x.neighbour_p99_pvsched),
            opt_ratio(x.host_p99_pvsched),
            opt_ratio(x.neighbour_p99_vanilla),
            opt_ratio(x.host_p99_vanilla),
            x.rogue_share_pvsched_minus_vanilla_pts
                .map(|p| format!("{p:+.1}"))
                .unwrap_or_else(|| "n/a".into()),
        );
    }

    let _ = writeln!(
        o,
        "\n## CPU share of the machine during the measurements (%)\n"
    );
    let _ = writeln!(
        o,
        "| load | interval | case | rogue | rogue per repeat | of which its vCPU threads | neighbour | neighbour per repeat | rogue vCPUs spinning per repeat |"
    );
    let _ = writeln!(o, "|---|---|---|--:|---|--:|--:|---|---|");
    for c in &r.cells {
        for (case, cr) in ordered(&c.cases) {
            let _ = writeln!(
                o,
                "| {} | {} µs | {} | {:.1} | {} | {:.1} | {:.1} | {} | {} |",
                c.load,
                c.interval_us,
                case,
                cr.rogue_share.pct,
                pcts(&cr.rogue_share.pct_per_repeat),
                cr.rogue_vcpu_share.pct,
                cr.neighbour_share.pct,
                pcts(&cr.neighbour_share.pct_per_repeat),
                join(&cr.rogue_spinning_per_repeat)
            );
        }
    }

    let params_rows: Vec<_> = r
        .cells
        .iter()
        .flat_map(|c| {
            ordered(&c.cases).into_iter().flat_map(move |(case, cr)| {
                THREAD_GROUPS
                    .iter()
                    .filter_map(move |g| cr.params.get(*g).map(|p| (c, case, *g, p)))
            })
        })
        .collect();
    if !params_rows.is_empty() {
        let _ = writeln!(
            o,
            "\n## Host scheduling of the QEMU threads during the measurements \
             (`sched_getattr` of each thread every 10 ms, by a SCHED_FIFO 6 thread of the \
             bench: above pvschedd's boosts, below the cyclictests)\n"
        );
        let _ = writeln!(
            o,
            "| load | interval | case | threads | samples | at RT % | RT parameters (% of samples) |"
        );
        let _ = writeln!(o, "|---|---|---|---|--:|--:|---|");
        for (c, case, g, p) in params_rows {
            let _ = writeln!(
                o,
                "| {} | {} µs | {} | {} | {} | {:.1} | {} |",
                c.load,
                c.interval_us,
                case,
                g,
                p.samples,
                p.rt_pct(),
                p.rt_params()
            );
        }
    }

    let daemon_rows: Vec<_> = r
        .cells
        .iter()
        .flat_map(|c| {
            ordered(&c.cases)
                .into_iter()
                .flat_map(move |(case, cr)| cr.daemon.iter().map(move |(vm, d)| (c, case, vm, d)))
        })
        .collect();
    if !daemon_rows.is_empty() {
        let _ = writeln!(
            o,
            "\n## pvschedd's counters over the measurement windows (sums over the repeats)\n"
        );
        let _ = writeln!(
            o,
            "| load | interval | case | VM | boosts | throttles | refused for budget (over_budget) | clamped inputs | boosted vCPU-s | boosted % of the VM's vCPU time | per repeat | repeats ending in debt |"
        );
        let _ = writeln!(o, "|---|---|---|---|--:|--:|--:|--:|--:|--:|---|--:|");
        for (c, case, vm, d) in daemon_rows {
            let _ = writeln!(
                o,
                "| {} | {} µs | {} | {} | {} | {} | {} | {} | {:.2} | {:.1} | {} | {} |",
                c.load,
                c.interval_us,
                case,
                vm,
                d.boosts,
                d.throttles,
                d.over_budget,
                d.clamped_inputs,
                d.boosted_s,
                d.boosted_pct,
                pcts(&d.boosted_pct_per_repeat),
                d.in_debt_at_end
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
