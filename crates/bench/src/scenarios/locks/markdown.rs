//! The lock-holder scenario's report.md.

use std::fmt::{self, Write as _};

use super::analysis::*;
use super::model::*;
use super::report::*;
use crate::harness::figures::Spread;
use crate::harness::markdown as md;

/// `median [min-max]`, or the one value.
fn spread(s: &Spread, places: usize) -> String {
    if s.per_repeat.len() > 1 {
        format!("{:.p$} [{:.p$}-{:.p$}]", s.median, s.min, s.max, p = places)
    } else if s.per_repeat.len() == 1 {
        format!("{:.p$}", s.median, p = places)
    } else {
        "n/a".into()
    }
}

fn opt_spread(s: &Option<Spread>, places: usize) -> String {
    s.as_ref()
        .map(|s| spread(s, places))
        .unwrap_or_else(|| "n/a".into())
}

fn list(v: &[f64], places: usize) -> String {
    v.iter()
        .map(|x| format!("{x:.places$}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn opt<T: fmt::Display>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_else(|| "n/a".into())
}

/// Whether `mode` has a summary in some case of `r`.
fn ran(r: &LocksReport, mode: LockMode) -> bool {
    r.cases.iter().any(|c| c.modes.contains_key(mode.name()))
}

/// Whether a sched_ext mode ran: the report then names each pvsched mode's
/// backend (runs without one read as they always did).
fn scx_ran(r: &LocksReport) -> bool {
    LockMode::ALL
        .into_iter()
        .any(|m| m.backend() == Some(LockBackend::SchedExt) && ran(r, m))
}

/// The Markdown report (also what the bench prints at the end).
pub fn markdown(r: &LocksReport) -> String {
    let m = &r.meta.base;
    let lm = &r.meta;
    let mut o = String::new();
    let _ = writeln!(o, "# pvsched bench, lock holders: {}\n", m.started);
    md::run_lines(&mut o, m, &[&m.machine.qemu]);
    let _ = writeln!(
        o,
        "Guests: {} ({} vCPUs each, kernel {}), booted for the whole run  ",
        lm.vms
            .iter()
            .map(|(n, module)| format!("`{n}` (pvsched.ko {module})"))
            .collect::<Vec<_>>()
            .join(" and "),
        m.guest_cpus,
        m.guest_kernel
    );
    let _ = writeln!(
        o,
        "Workload (`{}`, {} threads per VM): `{}`: {}  ",
        lm.workload, lm.threads, lm.workload_cmd, lm.workload_describe
    );
    let _ = writeln!(o, "Kernel contention count: {}  ", lm.kernel_counter);
    let pvsched_modes = r.cases.iter().any(|c| {
        c.modes
            .keys()
            .any(|k| k.as_str() != LockMode::Vanilla.name())
    });
    let scx = scx_ran(r);
    // What each mode sets itself, whatever --pvschedd-config says.
    let own = if ran(r, LockMode::PvschedScxNolock) {
        "each mode's `backend` and `honor_lock_holders`, and pvsched-scx-nolock's \
         `scx_extension_us = 0`"
    } else {
        "each mode's `backend` and `honor_lock_holders`"
    };
    if !pvsched_modes {
        let _ = writeln!(o, "pvschedd: not used (no pvsched mode ran)  ");
    } else if scx && m.pvschedd_settings.trim().is_empty() {
        let _ = writeln!(
            o,
            "pvschedd: {}, default configuration but {own}, serving both VMs  ",
            lm.pvschedd
        );
    } else if scx {
        let _ = writeln!(
            o,
            "pvschedd: {}, defaults plus `{}` (but {own}), serving both VMs  ",
            lm.pvschedd,
            m.pvschedd_settings.trim().replace('\n', "; ")
        );
    } else if m.pvschedd_settings.trim().is_empty() {
        let _ = writeln!(
            o,
            "pvschedd: {}, default configuration but `honor_lock_holders`, serving both VMs  ",
            lm.pvschedd
        );
    } else {
        let _ = writeln!(
            o,
            "pvschedd: {}, defaults plus `{}` (but `honor_lock_holders`), serving both VMs  ",
            lm.pvschedd,
            m.pvschedd_settings.trim().replace('\n', "; ")
        );
    }
    let _ = writeln!(
        o,
        "Each (case, mode): {} repeats x {} s, modes interleaved (order rotated per repeat). \
         Wall time {:.1} min.\n",
        m.repeat,
        m.duration_s,
        m.wall_s / 60.0
    );
    let _ = writeln!(o, "Cases:");
    for c in LockCase::ALL {
        if r.cases.iter().any(|x| x.case == c.name()) {
            let _ = writeln!(o, "- `{}`: {}", c.name(), c.describe());
        }
    }
    let _ = writeln!(o, "\nModes:");
    for mode in LockMode::ALL {
        if ran(r, mode) {
            // The rt modes' text does not name their backend: beside the
            // sched_ext modes it must.
            let backend = match mode.backend() {
                Some(LockBackend::Rt) if scx => "; rt backend",
                _ => "",
            };
            let _ = writeln!(o, "- `{}`: {}{backend}", mode.name(), mode.describe());
        }
    }
    let _ = writeln!(o, "\nDefinitions:");
    for d in &lm.definitions {
        let _ = writeln!(o, "- {d}");
    }
    let _ = writeln!(o);

    let _ = writeln!(o, "## Targets (reported, not asserted)\n");
    let _ = writeln!(o, "| target | result |");
    let _ = writeln!(o, "|---|---|");
    for t in &r.targets {
        let _ = writeln!(o, "| {} | {} |", t.what, t.verdict());
    }

    let _ = writeln!(
        o,
        "\n## Throughput (ops/s: median [min-max] over the repeats)\n"
    );
    let _ = writeln!(
        o,
        "| case | mode | both VMs | per repeat | VM | ops/s | per repeat | slowest / fastest thread | other load % per repeat |"
    );
    let _ = writeln!(o, "|---|---|--:|---|---|--:|---|--:|---|");
    for c in &r.cases {
        for (mode, ms) in ordered(&c.modes) {
            let running = ms.vms.iter().filter(|v| v.ran).count();
            for (i, v) in ms.vms.iter().filter(|v| v.ran).enumerate() {
                let (both, per) = if running < 2 {
                    ("—".to_string(), String::new())
                } else if i == 0 {
                    (
                        opt_spread(&ms.total_ops_per_s, 0),
                        ms.total_ops_per_s
                            .as_ref()
                            .map(|s| list(&s.per_repeat, 0))
                            .unwrap_or_default(),
                    )
                } else {
                    (String::new(), String::new())
                };
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    c.case,
                    mode,
                    both,
                    per,
                    v.name,
                    opt_spread(&v.ops_per_s, 0),
                    v.ops_per_s
                        .as_ref()
                        .map(|s| list(&s.per_repeat, 0))
                        .unwrap_or_default(),
                    v.thread_evenness
                        .map(|e| format!("{e:.2}"))
                        .unwrap_or_else(|| "n/a".into()),
                    if i == 0 {
                        list(&ms.other_load_pct_per_repeat, 1)
                    } else {
                        String::new()
                    }
                );
            }
        }
    }

    let _ = writeln!(
        o,
        "\n## Throughput ratios (same run, paired by repeat: median [min-max])\n"
    );
    let _ = writeln!(o, "| case | VM | ratio | median [min-max] | per repeat |");
    let _ = writeln!(o, "|---|---|---|--:|---|");
    for c in &r.cases {
        for x in &c.ratios {
            let _ = writeln!(
                o,
                "| {} | {} | {} / {} | {:.2}x [{:.2}-{:.2}] | {} |",
                c.case,
                x.vm,
                x.mode,
                x.vs,
                x.ratio.median,
                x.ratio.min,
                x.ratio.max,
                list(&x.ratio.per_repeat, 3)
            );
        }
    }

    let _ = writeln!(
        o,
        "\n## Lock contentions and holder preemptions (sums over the repeats)\n"
    );
    let _ = writeln!(
        o,
        "| case | mode | VM | guest contentions | per s | holder preempted | per contention % | kernel contention_begin events | repeats with guest counters |"
    );
    let _ = writeln!(o, "|---|---|---|--:|--:|--:|--:|--:|--:|");
    for c in &r.cases {
        for (mode, ms) in ordered(&c.modes) {
            for v in &ms.vms {
                let g = v.guest_locks;
                let vanilla = mode == LockMode::Vanilla && !r.vanilla_counts_holders;
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {}/{} |",
                    c.case,
                    mode,
                    v.name,
                    opt(g.map(|g| g.contended)),
                    opt(v.contentions_per_s.map(|x| format!("{x:.0}"))),
                    if vanilla {
                        "— (no host halves)".to_string()
                    } else {
                        opt(g.map(|g| g.preempted))
                    },
                    if vanilla {
                        "—".to_string()
                    } else {
                        opt(v.preempted_pct.map(|p| format!("{p:.2}")))
                    },
                    opt(v.kernel_contentions),
                    v.guest_locks_repeats,
                    ms.repeats
                );
            }
        }
    }

    let avoided_rows: Vec<_> = r
        .cases
        .iter()
        .flat_map(|c| c.avoided.iter().map(move |a| (c, a)))
        .collect();
    if !avoided_rows.is_empty() {
        let _ = writeln!(
            o,
            "\n## Holder preemptions avoided (guest counters, whole run)\n"
        );
        // Only rt rows: the table of the reports from before the sched_ext
        // modes; else a column names each row's backend and pair.
        let per_backend = avoided_rows
            .iter()
            .any(|(_, a)| !a.backend.is_rt() || a.against_vanilla);
        if per_backend {
            let _ = writeln!(
                o,
                "Per backend, its mode with lock handling against the one without: rt, \
                 pvsched-lock vs pvsched-nolock; sched_ext, pvsched-scx-lock vs \
                 pvsched-scx-nolock.{}\n",
                if r.vanilla_counts_holders {
                    " Rows `vs vanilla`: the same mode against vanilla (its KVM guests \
                     count their holders' preemptions by KVM's steal-time flag): what \
                     pvsched as a whole avoids."
                } else {
                    ""
                }
            );
            per_backend_avoided_header(&mut o);
        } else {
            let _ = writeln!(
                o,
                "| case | VM | pvsched-nolock: preempted / contentions | % | pvsched-lock: preempted / contentions | % | avoided |"
            );
            let _ = writeln!(o, "|---|---|--:|--:|--:|--:|--:|");
        }
        for (c, a) in avoided_rows {
            let backend = if per_backend || a.against_vanilla {
                backend_cell(a)
            } else {
                String::new()
            };
            let pcts = (a.without_pct, a.with_pct, a.avoided_pct);
            avoided_row(&mut o, &c.case, &backend, a, a.without, a.with, pcts);
        }
        named_holders_avoided(&mut o, r);
    }

    let daemon_rows: Vec<_> = r
        .cases
        .iter()
        .flat_map(|c| {
            ordered(&c.modes).into_iter().flat_map(move |(mode, ms)| {
                ms.vms
                    .iter()
                    .filter_map(move |v| v.daemon.as_ref().map(|d| (c, mode, v, d)))
            })
        })
        .collect();
    if !daemon_rows.is_empty() {
        let _ = writeln!(
            o,
            "\n## pvschedd's lock counters over the windows (sums over the repeats)\n\n\
             Extensions at the preemption: a wait already named the vCPU when the host \
             preempted it (a host scheduler that asked the guest before preempting, as \
             eCS's does, could have kept it on its CPU instead). The others began with \
             a wait pvschedd saw only after the preemption: nothing but a reaction can \
             serve those.\n"
        );
        let _ = writeln!(
            o,
            "| case | mode | VM | contentions | holder preempted | extensions | at the preemption | refused (debt) | preemptions avoided | extended ms | repaid ms | debt ms at the ends |"
        );
        let _ = writeln!(o, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
        for (c, mode, v, d) in daemon_rows {
            let at = if d.extensions > 0 {
                format!(
                    "{} ({:.0} %)",
                    d.extensions_at_preemption,
                    d.extensions_at_preemption as f64 / d.extensions as f64 * 100.0
                )
            } else {
                d.extensions_at_preemption.to_string()
            };
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} |",
                c.case,
                mode,
                v.name,
                d.contentions,
                d.holder_preempted,
                d.extensions,
                at,
                d.extensions_refused,
                d.preemptions_avoided,
                d.extended_ms,
                d.repaid_ms,
                d.debt_ms_at_end
            );
        }
    }

    scx_extension_table(&mut o, r);
    scx_holder_preemption_table(&mut o, r);
    guest_held_table(&mut o, r);
    kvm_preemption_table(&mut o, r);

    let _ = writeln!(
        o,
        "\n## Work per CPU-second of the VMs\n\n\
         The VMs' summed ops/s over the CPUs their QEMU processes used (only the VMs \
         that ran the workload), per repeat: median [min-max].\n"
    );
    let _ = writeln!(o, "| case | mode | ops per CPU-second | per repeat |");
    let _ = writeln!(o, "|---|---|--:|---|");
    for c in &r.cases {
        for (mode, ms) in ordered(&c.modes) {
            if let Some(e) = &ms.ops_per_cpu_s {
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} |",
                    c.case,
                    mode,
                    spread(e, 0),
                    list(&e.per_repeat, 0)
                );
            }
        }
    }
    if let Some(e) = &r.efficiency {
        let _ = writeln!(
            o,
            "\nVanilla alone did {:.0} ops per CPU-second, overcommitted {:.0}: \
             {:.2}x. Overcommitted, the machine is full and each mode gets the VMs \
             their CPU time, so lock handling raises their throughput only as far as it \
             raises their work per CPU-second: at the alone rate they would do {:.2}x \
             of vanilla's throughput.",
            e.alone, e.overcommitted, e.alone_over_overcommitted, e.alone_over_overcommitted
        );
    }

    let _ = writeln!(
        o,
        "\n## CPU time of the VMs over the windows (QEMU utime + stime)\n"
    );
    let _ = writeln!(
        o,
        "| case | mode | VM | CPU-s per window | % of the machine | share of the VMs' CPU % | per repeat | worst deviation from equal, per repeat % |"
    );
    let _ = writeln!(o, "|---|---|---|--:|--:|--:|---|---|");
    for c in &r.cases {
        for (mode, ms) in ordered(&c.modes) {
            for (i, v) in ms.vms.iter().enumerate() {
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {} | {} | {} | {} |",
                    c.case,
                    mode,
                    v.name,
                    spread(&v.cpu_s, 2),
                    spread(&v.cpu_pct_of_machine, 1),
                    spread(&v.cpu_split_pct, 1),
                    list(&v.cpu_split_pct.per_repeat, 1),
                    if i == 0 {
                        ms.split_deviation_pct
                            .as_ref()
                            .map(|s| list(&s.per_repeat, 1))
                            .unwrap_or_default()
                    } else {
                        String::new()
                    }
                );
            }
        }
    }

    let _ = writeln!(
        o,
        "\n## Where the machine went (over the windows)\n\n\
         Per mode, median [min-max] over the repeats, percent of the machine: busy \
         (/proc/stat), the VMs' QEMU processes, pvschedd's own process (utime + stime); \
         what busy leaves beside them is the kernel's threads, the bench and other jobs. \
         pvschedd's event-thread wakeups per second by cause and the BPF records it read \
         (those queued without a wakeup in brackets), pooled over the windows.\n"
    );
    let _ = writeln!(
        o,
        "| case | mode | machine busy % | VMs % | pvschedd % | pvschedd wakeups/s: records / timer / doorbell | BPF records/s (quiet) |"
    );
    let _ = writeln!(o, "|---|---|--:|--:|--:|---|--:|");
    for c in &r.cases {
        for (mode, ms) in ordered(&c.modes) {
            let d = |k: &str| {
                ms.daemon_per_s
                    .get(k)
                    .map(|v| format!("{v:.0}"))
                    .unwrap_or_default()
            };
            let wakeups = if ms.daemon_per_s.is_empty() {
                String::new()
            } else {
                format!(
                    "{} / {} / {}",
                    d("wakeups_records"),
                    d("wakeups_timer"),
                    d("wakeups_doorbell")
                )
            };
            let records = if ms.daemon_per_s.is_empty() {
                String::new()
            } else {
                format!("{} ({})", d("bpf_records"), d("bpf_lazy_records"))
            };
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} |",
                c.case,
                mode,
                opt_spread(&ms.machine_busy_pct, 1),
                opt_spread(&ms.vms_pct, 1),
                opt_spread(&ms.daemon_pct, 2),
                wakeups,
                records
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

/// The VMs with the sched_ext scheduler's counters, per case and mode in
/// report order, that `shown` keeps.
fn scx_rows(
    r: &LocksReport,
    shown: impl Fn(LockMode, &ScxExtensions) -> bool + Copy,
) -> Vec<(&CaseReport, LockMode, &VmSummary, &ScxExtensions)> {
    r.cases
        .iter()
        .flat_map(|c| {
            ordered(&c.modes).into_iter().flat_map(move |(mode, ms)| {
                ms.vms.iter().filter_map(move |v| {
                    let x = v.scx_extensions.as_ref()?;
                    shown(mode, x).then_some((c, mode, v, x))
                })
            })
        })
        .collect()
}

/// The sched_ext scheduler's slice-end extensions per case, mode and VM:
/// rows of the sched_ext modes, and of any other mode that counted some;
/// nothing for runs without them.
fn scx_extension_table(o: &mut String, r: &LocksReport) {
    let rows = scx_rows(r, |mode, x| {
        mode.backend() == Some(LockBackend::SchedExt) || x.any()
    });
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\n## sched_ext extensions at the preemption (slice end; sums over the repeats)\n\n\
         The sched_ext scheduler decides at the instant it would preempt a vCPU: one whose \
         guest shows a critical section when its slice ends, or that another vCPU's \
         published lock wait names as the holder (for a lock holder), keeps its CPU for \
         `scx_extension_us` more (granted), unless the extensions would take more than its \
         allowance (`scx_extension_share_permille`; refused). pvsched-scx-nolock runs with \
         `scx_extension_us = 0`: none.\n"
    );
    // Runs before the extension at a boosted vCPU's preemption had none,
    // and runs before the extension's poll ended none early: their tables
    // stay as they were.
    let deferred = rows.iter().any(|(_, _, _, x)| x.at_preemption > 0);
    let early = rows.iter().any(|(_, _, _, x)| x.ended_early > 0);
    let tails = rows.iter().any(|(_, _, _, x)| x.tails > 0);
    let yielded = rows.iter().any(|(_, _, _, x)| x.yielded > 0);
    if deferred {
        let _ = writeln!(
            o,
            "A boosted vCPU (woken onto a busy CPU, or granted a boost) that would preempt a \
             vCPU whose guest shows a lock held waits instead while the holder runs one \
             extension (at a boosted preemption), within the same allowance.\n"
        );
    }
    if early {
        let _ = writeln!(
            o,
            "While a vCPU runs an extension the scheduler reads its slot again every \
             `scx_extension_poll_us`, and ends the extension at the first read that finds the \
             guest out of its critical section (ended early: preempted at a lock-free point); \
             extended ms counts what the extensions ran.\n"
        );
    }
    if tails {
        let _ = writeln!(
            o,
            "An extension that runs out while the guest still shows a lock held goes on for a \
             tail of at most `scx_extension_tail_us`, its slot read every \
             `scx_extension_tail_poll_us`, and ends at the first read that finds the guest out \
             of its locks (tail ended at a lock-free point), else at the tail's end; within the \
             same allowance.\n"
        );
    }
    if yielded {
        let _ = writeln!(
            o,
            "A guest that accepts `F_EXT_NOTICE` sees in its slot that it runs on an extension \
             and ends it itself: it yields at its next point out of its sleeping locks, and the \
             scheduler takes the CPU back there (ended at the guest's yield).\n"
        );
    }
    let mut head = String::from(if deferred {
        "| case | mode | VM | extensions granted at the preemption (slice end or boosted vCPU) | of them for a lock holder | of those at a boosted vCPU's preemption |"
    } else {
        "| case | mode | VM | extensions granted at the preemption (slice end) | of them for a lock holder |"
    });
    if early {
        head.push_str(" ended early at a lock-free point |");
    }
    if tails {
        head.push_str(" ran out in a lock: went on for a tail | tail ended at a lock-free point |");
    }
    if yielded {
        head.push_str(" ended at the guest's yield |");
    }
    head.push_str(" refused (allowance) | extended ms |");
    let cols = head.matches('|').count() - 1;
    let _ = writeln!(o, "{head}");
    let _ = writeln!(o, "|---|---|---|{}", "--:|".repeat(cols - 3));
    for (c, mode, v, x) in rows {
        let mut cells = String::new();
        if deferred {
            cells.push_str(&format!(" {} |", x.at_preemption));
        }
        if early {
            cells.push_str(&format!(" {} |", x.ended_early));
        }
        if tails {
            cells.push_str(&format!(" {} | {} |", x.tails, x.tails_ended_early));
        }
        if yielded {
            cells.push_str(&format!(" {} |", x.yielded));
        }
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} |{cells} {} | {:.1} |",
            c.case, mode, v.name, x.granted, x.for_lock_holder, x.refused, x.extended_ms
        );
    }
}

/// The lock holders the sched_ext scheduler preempted, per case, mode and
/// VM, by how; nothing for runs that counted none (guests without
/// `CS_LOCK`, or runs from before the count).
fn scx_holder_preemption_table(o: &mut String, r: &LocksReport) {
    let rows = scx_rows(r, |_, x| x.holder_preempted() > 0);
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\n## Lock holders the sched_ext scheduler preempted (host's count; sums over the repeats)\n\n\
         A vCPU that stopped runnable while its guest showed a sleeping lock held (`CS_LOCK`, \
         published only with lock holders honoured), whether or not anyone waited: at the \
         slice end after an extension in that slice, at a slice end without one (no \
         extension due, or refused over the allowance), or before its slice end (a boosted \
         vCPU, a kick, a higher scheduling class). Unlike the guests' count it does not \
         depend on KVM telling the guest of a preemption.\n"
    );
    let _ = writeln!(
        o,
        "| case | mode | VM | preempted holding a lock | after an extension | at a slice end without one | before the slice end |"
    );
    let _ = writeln!(o, "|---|---|---|--:|--:|--:|--:|");
    for (c, mode, v, x) in rows {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} |",
            c.case,
            mode,
            v.name,
            x.holder_preempted(),
            x.holder_preempted_extended,
            x.holder_preempted_unextended,
            x.holder_preempted_early
        );
    }
    scx_holder_preempted_time_table(o, r);
    // Runs before the breakdown have none: their report stays as it was.
    let by: Vec<_> = scx_rows(r, |_, x| x.holder_preempted_early_by.iter().any(|&n| n > 0));
    if by.is_empty() {
        return;
    }
    // Runs before the holders resumed after the daemon were counted show no
    // such column: their report stays as it was.
    let resumed = by.iter().any(|(.., x)| x.holders_resumed > 0);
    let _ = writeln!(
        o,
        "\nBefore the slice end, by what took the CPU (the scheduler notes its own \
         preemptions on the CPU as it decides them; none of them: a higher scheduling class \
         or the kernel){}:\n",
        if resumed {
            ". Resumed: of pvschedd's, the holders that ran again right after it, on \
             their CPU, for the rest of their slice"
        } else {
            ""
        }
    );
    // The guest's yield came last (F_EXT_NOTICE): a column only where a
    // holder was ever preempted there, in its lock, so earlier reports stay.
    let cuts = if by
        .iter()
        .any(|(.., x)| x.holder_preempted_early_by.get(CUT_NAMES.len() - 1) > Some(&0))
    {
        CUT_NAMES.len()
    } else {
        CUT_NAMES.len() - 1
    };
    let mut heads: Vec<&str> = CUT_NAMES[..cuts].to_vec();
    if resumed {
        heads.push("resumed");
    }
    let _ = writeln!(o, "| case | mode | VM | {} |", heads.join(" | "));
    let _ = writeln!(o, "|---|---|---|{}", "--:|".repeat(heads.len()));
    for (c, mode, v, x) in by {
        let mut cells: Vec<String> = (0..cuts)
            .map(|i| {
                x.holder_preempted_early_by
                    .get(i)
                    .copied()
                    .unwrap_or(0)
                    .to_string()
            })
            .collect();
        if resumed {
            cells.push(x.holders_resumed.to_string());
        }
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} |",
            c.case,
            mode,
            v.name,
            cells.join(" | ")
        );
    }
}

/// How long the preempted holders waited to run again, by how they were
/// preempted; nothing for runs from before it was measured.
fn scx_holder_preempted_time_table(o: &mut String, r: &LocksReport) {
    let rows = scx_rows(r, |_, x| {
        x.holder_preempted_extended_ms
            + x.holder_preempted_unextended_ms
            + x.holder_preempted_early_ms
            > 0.0
    });
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\nHow long they waited to run again, ms in all (and per preemption), by how: a \
         guest's waits that find their holder preempted follow this time more than the \
         number of preemptions:\n"
    );
    let _ = writeln!(
        o,
        "| case | mode | VM | in all | after an extension | at a slice end without one | before the slice end |"
    );
    let _ = writeln!(o, "|---|---|---|--:|--:|--:|--:|");
    let cell = |ms: f64, n: u64| {
        if n == 0 {
            format!("{ms:.1}")
        } else {
            format!("{ms:.1} ({:.2})", ms / n as f64)
        }
    };
    for (c, mode, v, x) in rows {
        let all = x.holder_preempted_extended_ms
            + x.holder_preempted_unextended_ms
            + x.holder_preempted_early_ms;
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} |",
            c.case,
            mode,
            v.name,
            cell(all, x.holder_preempted()),
            cell(x.holder_preempted_extended_ms, x.holder_preempted_extended),
            cell(
                x.holder_preempted_unextended_ms,
                x.holder_preempted_unextended
            ),
            cell(x.holder_preempted_early_ms, x.holder_preempted_early)
        );
    }
}

/// The guest module's lists of held locks per case, mode and VM; nothing for
/// runs that listed none (no lock holders honoured, or from before).
fn guest_held_table(o: &mut String, r: &LocksReport) {
    let rows: Vec<_> = r
        .cases
        .iter()
        .flat_map(|c| {
            ordered(&c.modes).into_iter().flat_map(move |(mode, ms)| {
                ms.vms
                    .iter()
                    .filter_map(move |v| Some((c, mode, v, v.guest_held?)))
            })
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\n## The guests' lists of held locks (guest module's debugfs counters; sums over the repeats)\n\n\
         What `CS_LOCK` is made of (lock holders honoured): the lock calls the module listed while \
         its host contended the vCPU, the unlocks that found their lock listed, unlocks of a lock \
         not listed (trylocks', takes passed over), lists a timer tick found non-empty in user \
         mode and emptied (an unlock the hooks missed: the lock showed held until then), takes \
         dropped from a full list, and takes passed over while the host did not contend the \
         vCPU.\n"
    );
    let _ = writeln!(
        o,
        "| case | mode | VM | listed | released | unlocks not listed | reset in user mode | dropped | passed over |"
    );
    let _ = writeln!(o, "|---|---|---|--:|--:|--:|--:|--:|--:|");
    for (c, mode, v, h) in rows {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.case,
            mode,
            v.name,
            h.takes,
            h.releases,
            h.unmatched,
            h.user_resets,
            h.dropped,
            h.uncontended
        );
    }
}

/// KVM's vCPU preemptions per case and mode, those the guests were told of
/// and those they were not; nothing for runs without them.
fn kvm_preemption_table(o: &mut String, r: &LocksReport) {
    let rows: Vec<_> = r
        .cases
        .iter()
        .flat_map(|c| {
            ordered(&c.modes)
                .into_iter()
                .filter_map(move |(mode, ms)| Some((c, mode, ms.kvm_preemptions?)))
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\n## vCPU preemptions KVM reported to the guests (sums over the repeats)\n\n\
         The guests count a holder preempted by KVM's steal-time flag, which KVM sets only for \
         a vCPU scheduled out after leaving the guest at an instruction boundary (on AMD: for \
         a host interrupt; debugfs `kvm/preemption_reported`). A vCPU scheduled out while KVM \
         handled another exit (the IPI that woke its sibling, say) runs no more but is not \
         flagged (`kvm/preemption_other`). The holder counts of two modes compare only as \
         far as their shares reported do. Every vCPU of the host VM, both VMs.\n"
    );
    let _ = writeln!(
        o,
        "| case | mode | preemptions reported | not reported | reported share |"
    );
    let _ = writeln!(o, "|---|---|--:|--:|--:|");
    for (c, mode, k) in rows {
        let share = k
            .reported_share()
            .map_or_else(|| "-".to_string(), |s| format!("{:.1} %", s * 100.0));
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {share} |",
            c.case, mode, k.reported, k.other
        );
    }
}

/// The avoided table again, of the named holders' counters alone (ABI 1.7),
/// where the guests counted them: what the targets judge.
fn named_holders_avoided(o: &mut String, r: &LocksReport) {
    let rows: Vec<_> = r
        .cases
        .iter()
        .flat_map(|c| c.avoided.iter().map(move |a| (c, a)))
        .filter(|(_, a)| a.without.named().is_some() || a.with.named().is_some())
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\n### Named holders only\n\nThe same pairs, counting only the contentions whose lock \
         named its holder (a mutex's or a write-held rwsem's owner) running on another vCPU \
         (`lock_named_contended_count`, `lock_named_preempted_count`, ABI 1.7), each preempted \
         by KVM's steal-time flag. The totals above also count a wait whose holder is unknown \
         (a spinlock, a read-held rwsem) as preempted whenever the host half shows any other \
         vCPU of the guest preempted (vanilla has no host halves): that is no holder's \
         preemption. Where the guests count these, the avoided target is judged on them.\n"
    );
    per_backend_avoided_header(o);
    for (c, a) in rows {
        let pcts = (a.named_without_pct, a.named_with_pct, a.named_avoided_pct);
        let (without, with) = (a.without.named(), a.with.named());
        let none = GuestLocks::default();
        avoided_row(
            o,
            &c.case,
            &backend_cell(a),
            a,
            without.unwrap_or(none),
            with.unwrap_or(none),
            pcts,
        );
    }
}

/// The header of an avoided table whose rows name their backend.
fn per_backend_avoided_header(o: &mut String) {
    let _ = writeln!(
        o,
        "| case | backend | VM | without: preempted / contentions | % | with: preempted / contentions | % | avoided |"
    );
    let _ = writeln!(o, "|---|---|---|--:|--:|--:|--:|--:|");
}

/// An avoided row's backend cell, with the `|` that ends it.
fn backend_cell(a: &Avoided) -> String {
    if a.against_vanilla {
        format!(" {} vs vanilla |", a.backend)
    } else {
        format!(" {} |", a.backend)
    }
}

/// One row of an avoided table: the counters compared (the totals or the
/// named part) and their rates and share avoided, in percent.
fn avoided_row(
    o: &mut String,
    case: &str,
    backend: &str,
    a: &Avoided,
    without: GuestLocks,
    with: GuestLocks,
    (without_pct, with_pct, avoided_pct): (Option<f64>, Option<f64>, Option<f64>),
) {
    let _ = writeln!(
        o,
        "| {case} |{backend} {} | {} / {} | {} | {} / {} | {} | {} |",
        a.vm,
        without.preempted,
        without.contended,
        opt(without_pct.map(|p| format!("{p:.2}"))),
        with.preempted,
        with.contended,
        opt(with_pct.map(|p| format!("{p:.2}"))),
        opt(avoided_pct.map(|p| format!("{p:.1} %")))
    );
}
