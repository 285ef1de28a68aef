//! Plain-text rendering of `pvschedctl status` / `top`.

use std::fmt::Write;

use pvsched_host::control::Status;

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
            let guest = match v.guest_policy {
                1 => format!("fifo/{}", v.guest_rt_priority),
                2 => format!("rr/{}", v.guest_rt_priority),
                3 => "batch".into(),
                5 => "idle".into(),
                6 => "deadline".into(),
                _ => "normal".into(),
            };
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
