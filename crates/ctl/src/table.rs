//! Plain-text rendering of `pvschedctl status` / `top`.

use std::fmt::Write;

use pvsched_base::sched::{is_rt_policy, policy_name, SCHED_DEADLINE};
use pvsched_control::Status;

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
    for vm in &s.vms {
        let _ = writeln!(
            out,
            "\nVM {}  pid {}  accel {}  region {} (generation {}, guest {})",
            vm.name,
            vm.tgid,
            vm.accel,
            vm.region,
            vm.generation,
            if vm.guest_bound { "bound" } else { "not bound" }
        );
        let _ = writeln!(
            out,
            "  boosts {}  throttles {}  clamped inputs {}  boosted {:.3} s  {}",
            vm.boosts,
            vm.throttles,
            vm.clamped_inputs,
            vm.boosted_s,
            if vm.in_debt {
                format!("IN DEBT {:.1} ms", vm.debt_ms)
            } else {
                "no debt".into()
            }
        );
        let _ = writeln!(
            out,
            "  {:>4} {:>8} {:<14} {:<18} {:<10} {:<12} {:>7} {:>9} {:>11}",
            "vcpu",
            "tid",
            "in force",
            "reason",
            "host",
            "guest task",
            "boosts",
            "throttles",
            "boosted ms"
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
                "  {:>4} {:>8} {:<14} {:<18} {:<10} {:<12} {:>7} {:>9} {:>11.1}",
                v.index,
                v.tid,
                v.params.to_string(),
                reason,
                v.host_status,
                guest,
                v.boosts,
                v.throttles,
                v.boosted_ms
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
}
