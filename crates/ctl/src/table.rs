//! Plain-text rendering of `pvschedctl status` / `top`.

use std::fmt::Write;

use pvsched_base::sched::{is_rt_policy, policy_name, SCHED_DEADLINE};
use pvsched_control::{Status, VcpuStatus, VmStatus};

/// The guest task's class as the status table shows it: `fifo/5`, `rr/3`,
/// `batch`, `idle`, `deadline`, and `normal` for SCHED_OTHER (or a policy
/// number this build does not know).
fn guest_task(policy: u32, rt_priority: u32) -> String {
    match policy_name(policy) {
        "other" | "unknown" => "normal".into(),
        name if is_rt_policy(policy) && policy != SCHED_DEADLINE => {
            format!("{name}/{rt_priority}")
        }
        name => name.into(),
    }
}

/// The VM's budgets: the boost budget (all boosted time) and the vCPUs' critical-section
/// budgets, each with what is left or, while latched, what must be earned back first.
fn budgets(vm: &VmStatus) -> String {
    let boost = if vm.in_debt {
        format!(
            "boost budget SPENT: no boost until {:.1} ms is earned back",
            vm.debt_ms
        )
    } else {
        format!(
            "boost budget {:.1} of {:.1} ms left",
            vm.budget_ms, vm.budget_max_ms
        )
    };
    let cs = if vm.cs_latched_vcpus > 0 {
        format!(
            "critical sections refused on {} vCPU(s) until {:.2} ms is earned back",
            vm.cs_latched_vcpus, vm.cs_debt_ms
        )
    } else {
        format!("critical-section budget {:.2} ms left", vm.cs_budget_ms)
    };
    format!(
        "  {boost}  |  {cs}  |  boosts refused for budget {}  |  latched {} time(s), {:.1} ms  \
         |  demoted {:.1} ms",
        vm.over_budget, vm.budget_latches, vm.budget_latched_ms, vm.demoted_ms
    )
}

/// Where the VM's boosted time went: ms per reason, largest first.
fn boosted_by_reason(vm: &VmStatus) -> String {
    let mut by: Vec<(&String, &f64)> = vm.boosted_ms_by_reason.iter().collect();
    by.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
    let cells: Vec<String> = by
        .iter()
        .map(|(reason, ms)| format!("{reason} {ms:.1}"))
        .collect();
    format!("  boosted ms by reason: {}", cells.join(", "))
}

/// The VM's lock waits (guest counts) and the extensions given to lock holders.
fn locks(vm: &VmStatus) -> String {
    let l = &vm.locks;
    format!(
        "  lock contentions {} (holder preempted {})  |  extensions {} (at the preemption {}, \
         refused {}, preemptions cut short {}), {:.2} ms  |  lock debt {:.2} ms (repaid {:.2} ms)",
        l.contentions,
        l.holder_preempted,
        l.extensions,
        l.extensions_at_preemption,
        l.extensions_refused,
        l.preemptions_avoided,
        l.extended_ms,
        l.debt_ms,
        l.repaid_ms
    )
}

/// A vCPU's critical-section budget: ms left, or ms owed while latched.
fn cs_cell(v: &VcpuStatus) -> String {
    if v.cs_latched {
        format!("owes {:.2}", v.cs_debt_ms)
    } else {
        format!("{:.2}", v.cs_budget_ms)
    }
}

pub fn render(s: &Status) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "pvschedd pid {}  up {:.0} s  source {}  dropped events {}  VMs {}",
        s.pid,
        s.uptime_s,
        s.event_source,
        s.dropped_events,
        s.vms.len()
    );
    let b = &s.backend;
    if !b.active.is_empty() {
        let _ = write!(out, "backend {} (configured {})", b.active, b.configured);
        if b.active == "sched_ext" {
            let _ = write!(
                out,
                "  enqueues {}  boosted: preempting {}, queued {}, moved ahead {}, by the \
                 scheduler itself {} (throttled {})  wakeup preemptions {}  extensions {} \
                 (for lock holders {}, at a boosted preemption {}, refused {})  lock holders \
                 preempted: after an extension {}, at a slice end without one {}, before \
                 the slice end {}  pulled from another CPU {}  vCPUs sent away from a \
                 sibling {}  daemon wakeups sent away from a lock holder {}",
                b.enqueues,
                b.boost_preempts,
                b.boost_queued,
                b.boost_moved,
                b.kernel_boosts,
                b.kernel_throttles,
                b.wakeup_preempts,
                b.extensions,
                b.lock_extensions,
                b.lock_extensions_at_preemption,
                b.extensions_refused,
                b.holder_preempted_extended,
                b.holder_preempted_unextended,
                b.holder_preempted_early,
                b.fair_pulls,
                b.vcpus_spread,
                b.daemon_moved
            );
        }
        for (what, d) in [
            ("boosted", &b.queued_to_run_boosted),
            ("other", &b.queued_to_run_other),
        ] {
            if d.count > 0 {
                let _ = write!(
                    out,
                    "  {what} vCPUs queued to running p50 {:.0} µs p99 {:.0} µs ({})",
                    d.p50_us, d.p99_us, d.count
                );
            }
        }
        if b.fallbacks > 0 {
            let _ = write!(out, "  fallbacks {}", b.fallbacks);
        }
        let _ = writeln!(out);
        if let Some(note) = &b.note {
            let _ = writeln!(out, "  {note}");
        }
    }
    for vm in &s.vms {
        let _ = writeln!(
            out,
            "\nVM {}  pid {}  accel {}  region {} (generation {}, guest {}, {})",
            vm.name,
            vm.tgid,
            vm.accel,
            vm.region,
            vm.generation,
            if vm.guest_bound { "bound" } else { "not bound" },
            if vm.doorbell {
                "doorbell"
            } else {
                "recheck timer"
            }
        );
        let _ = writeln!(
            out,
            "  boosts {}  throttles {}  clamped inputs {}  boosted {:.3} s",
            vm.boosts, vm.throttles, vm.clamped_inputs, vm.boosted_s,
        );
        let _ = writeln!(out, "{}", budgets(vm));
        if !vm.boosted_ms_by_reason.is_empty() {
            let _ = writeln!(out, "{}", boosted_by_reason(vm));
        }
        let _ = writeln!(out, "{}", locks(vm));
        let _ = writeln!(
            out,
            "  {:>4} {:>8} {:<14} {:<24} {:<10} {:<12} {:>7} {:>9} {:>11} {:>10}",
            "vcpu",
            "tid",
            "in force",
            "reason",
            "host",
            "guest task",
            "boosts",
            "throttles",
            "boosted ms",
            "cs ms"
        );
        for v in &vm.vcpus {
            let guest = guest_task(v.guest_policy, v.guest_rt_priority);
            let reason = if v.throttled {
                format!("{} (throttled)", v.reason)
            } else {
                v.reason.clone()
            };
            let _ = writeln!(
                out,
                "  {:>4} {:>8} {:<14} {:<24} {:<10} {:<12} {:>7} {:>9} {:>11.1} {:>10}",
                v.index,
                v.tid,
                v.params.to_string(),
                reason,
                v.host_status,
                guest,
                v.boosts,
                v.throttles,
                v.boosted_ms,
                cs_cell(v)
            );
        }
        for t in &vm.latency_path {
            let _ = writeln!(out, "  latency path: tid {} {}", t.tid, t.params);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_task_names_the_policy_and_an_rt_priority() {
        let cases = [
            (0, 0, "normal"),
            (1, 5, "fifo/5"),
            (2, 3, "rr/3"),
            (3, 0, "batch"),
            (5, 0, "idle"),
            (6, 0, "deadline"),
            (42, 0, "normal"),
        ];

        for (policy, prio, want) in cases {
            assert_eq!(guest_task(policy, prio), want, "policy {policy}");
        }
    }

    fn vm(in_debt: bool, cs_latched: bool) -> VmStatus {
        VmStatus {
            name: "audio".into(),
            tgid: 1,
            accel: "kvm".into(),
            region: "/dev/shm/pvsched-audio".into(),
            generation: 1,
            guest_bound: true,
            doorbell: false,
            in_debt,
            debt_ms: if in_debt { 250.0 } else { 0.0 },
            boosts: 3,
            throttles: 0,
            clamped_inputs: 0,
            boosted_s: 1.5,
            budget_ms: if in_debt { 0.0 } else { 812.3 },
            budget_max_ms: 1000.0,
            cs_budget_ms: if cs_latched { 0.0 } else { 2.0 },
            cs_debt_ms: if cs_latched { 1.5 } else { 0.0 },
            cs_latched_vcpus: u32::from(cs_latched),
            over_budget: 7,
            locks: pvsched_control::LockStatus {
                contentions: 120,
                holder_preempted: 9,
                extensions: 8,
                extensions_at_preemption: 5,
                extensions_refused: 1,
                preemptions_avoided: 7,
                extended_ms: 4.5,
                repaid_ms: 4.0,
                debt_ms: 0.5,
            },
            demoted_ms: 12.5,
            budget_latches: 2,
            budget_latched_ms: 250.0,
            boosted_ms_by_reason: [("guest_rt", 900.0), ("proactive_wake", 600.0)]
                .into_iter()
                .map(|(r, ms)| (r.to_string(), ms))
                .collect(),
            vcpus: vec![VcpuStatus {
                index: 0,
                tid: 42,
                params: pvsched_base::sched::ThreadParams::other(0),
                reason: "over_budget".into(),
                throttled: true,
                host_status: "preempted".into(),
                guest_policy: 0,
                guest_rt_priority: 0,
                guest_cs_flags: 2,
                boosts: 3,
                throttles: 0,
                boosted_ms: 1500.0,
                cs_budget_ms: if cs_latched { 0.0 } else { 2.0 },
                cs_debt_ms: if cs_latched { 1.5 } else { 0.0 },
                cs_latched,
                scx_extensions: 0,
                scx_extended_ms: 0.0,
                scx_extensions_refused: 0,
                scx_lock_extensions: 0,
                scx_lock_extensions_at_preemption: 0,
                scx_holder_preempted_extended: 0,
                scx_holder_preempted_unextended: 0,
                scx_holder_preempted_early: 0,
                scx_extensions_ended_early: 0,
                scx_extension_tails: 0,
                scx_extension_tails_ended_early: 0,
                scx_holder_preempted_early_by: Vec::new(),
                scx_holders_resumed: 0,
                scx_extension_yields: 0,
                scx_holder_preempted_extended_ms: 0.0,
                scx_holder_preempted_unextended_ms: 0.0,
                scx_holder_preempted_early_ms: 0.0,
                scx_boost_preempts: 0,
                scx_kernel_boosts: 0,
                kernel_boosted_ms: 0.0,
            }],
            latency_path: vec![],
        }
    }

    #[test]
    fn status_shows_each_budget_left_or_its_debt_and_latch() {
        let status = |vm| Status {
            pid: 1,
            uptime_s: 2.0,
            event_source: "bpf".into(),
            dropped_events: 0,
            backend: pvsched_control::BackendStatus {
                configured: "auto".into(),
                active: "rt".into(),
                note: Some("the kernel has no sched_ext".into()),
                ..Default::default()
            },
            vms: vec![vm],
        };

        let fine = render(&status(vm(false, false)));
        let spent = render(&status(vm(true, true)));

        assert!(
            fine.contains("boost budget 812.3 of 1000.0 ms left"),
            "{fine}"
        );
        assert!(
            fine.contains("critical-section budget 2.00 ms left"),
            "{fine}"
        );
        assert!(fine.contains("boosts refused for budget 7"), "{fine}");
        assert!(
            fine.contains("latched 2 time(s), 250.0 ms  |  demoted 12.5 ms"),
            "{fine}"
        );
        assert!(
            fine.contains("boosted ms by reason: guest_rt 900.0, proactive_wake 600.0"),
            "{fine}"
        );
        assert!(
            spent.contains("boost budget SPENT: no boost until 250.0 ms is earned back"),
            "{spent}"
        );
        assert!(
            spent.contains("critical sections refused on 1 vCPU(s) until 1.50 ms is earned back"),
            "{spent}"
        );
        assert!(spent.contains("over_budget (throttled)"), "{spent}");
        assert!(spent.contains("owes 1.50"), "{spent}");
        assert!(
            fine.contains("lock contentions 120 (holder preempted 9)"),
            "{fine}"
        );
        assert!(
            fine.contains(
                "extensions 8 (at the preemption 5, refused 1, preemptions cut short 7), 4.50 ms"
            ),
            "{fine}"
        );
        assert!(
            fine.contains("lock debt 0.50 ms (repaid 4.00 ms)"),
            "{fine}"
        );
    }
}
