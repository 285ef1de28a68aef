//! `pvschedctl idle`: the measured idle transitions as text histograms, and the
//! advisor's halt-polling window next to the one in force.

use std::fmt::Write;

use pvsched_control::{IdleReport, PollOutcome, VcpuIdle};

const BAR: usize = 40;

/// Buckets merged to powers of two for display: (upper bound µs, count).
fn octaves(buckets: &[(f64, u64)]) -> Vec<(f64, u64)> {
    let mut out: Vec<(f64, u64)> = Vec::new();
    for &(upper, count) in buckets {
        // The power of two at or above the bucket's bound.
        let p = if upper.is_finite() {
            2f64.powf(upper.log2().ceil())
        } else {
            f64::INFINITY
        };
        match out.last_mut() {
            Some(last) if last.0 == p => last.1 += count,
            _ => out.push((p, count)),
        }
    }
    out
}

fn label(us: f64) -> String {
    if !us.is_finite() {
        "longer".into()
    } else if us >= 1000.0 {
        format!("< {:.0} ms", us / 1000.0)
    } else {
        format!("< {us:.0} µs")
    }
}

fn histogram(out: &mut String, title: &str, buckets: &[(f64, u64)]) {
    let total: u64 = buckets.iter().map(|b| b.1).sum();
    let _ = writeln!(out, "    {title} ({total}):");
    if total == 0 {
        let _ = writeln!(out, "      (none yet)");
        return;
    }
    let rows = octaves(buckets);
    let max = rows.iter().map(|r| r.1).max().unwrap_or(1).max(1);
    for (us, n) in rows {
        let len = (n as usize * BAR).div_ceil(max as usize);
        let _ = writeln!(
            out,
            "      {:>10} {:>8} {:5.1} % {}",
            label(us),
            n,
            n as f64 * 100.0 / total as f64,
            "#".repeat(len)
        );
    }
}

fn outcome(o: &PollOutcome) -> String {
    format!(
        "window {:.0} µs: catches {:.1} % of halts, polls {:.2} % of a core",
        o.window_us,
        o.hit_rate * 100.0,
        o.cpu_share * 100.0
    )
}

fn vcpu(out: &mut String, v: &VcpuIdle, budget_permille: u32, tcg: bool) {
    let _ = writeln!(out, "  vCPU {} ({:.1} s observed)", v.index, v.observed_s);
    histogram(out, "halt -> wake", &v.halts);
    if v.polled_by_kvm > 0 {
        let total: u64 = v.halts.iter().map(|b| b.1).sum();
        let _ = writeln!(
            out,
            "    of those, caught by KVM's halt polling: {} ({:.1} %)",
            v.polled_by_kvm,
            v.polled_by_kvm as f64 * 100.0 / total.max(1) as f64
        );
    }
    histogram(out, "wake -> running", &v.wakes);
    if !v.wakes.is_empty() {
        let _ = writeln!(
            out,
            "    wake -> running p50 < {:.0} µs, p99 < {:.0} µs",
            v.wake_p50_us, v.wake_p99_us
        );
    }
    let _ = writeln!(
        out,
        "    recommended (budget {:.1} % of a core): {}",
        budget_permille as f64 / 10.0,
        outcome(&v.advice)
    );
    match (&v.in_force, tcg) {
        (Some(f), _) => {
            let _ = writeln!(out, "    in force (kvm halt_poll_ns): {}", outcome(f));
        }
        (None, true) => {
            let _ = writeln!(
                out,
                "    in force: none (TCG: the vCPU threads do not halt-poll; the recommendation is for KVM)"
            );
        }
        (None, false) => {
            let _ = writeln!(out, "    in force: unknown (kvm module not loaded)");
        }
    }
}

/// The whole report as text.
pub fn render(r: &IdleReport) -> String {
    let mut out = String::new();
    match &r.kvm_halt_poll {
        Some(k) => {
            let _ = writeln!(
                out,
                "kvm module: halt_poll_ns {} grow {} grow_start {} shrink {}",
                k.halt_poll_ns, k.grow, k.grow_start_ns, k.shrink
            );
        }
        None => {
            let _ = writeln!(out, "kvm module: not loaded");
        }
    }
    if let Some(h) = &r.host_advice {
        let _ = writeln!(
            out,
            "host-wide (kvm halt_poll_ns, every vCPU's halts, budget {:.1} % of a core each): {}",
            r.budget_permille as f64 / 10.0,
            outcome(h)
        );
    }
    if let Some(a) = &r.applied {
        let _ = writeln!(
            out,
            "applied ({:?}): halt_poll_ns {} -> {} (grow {} grow_start {} shrink {})",
            a.target,
            a.before.halt_poll_ns,
            a.after.halt_poll_ns,
            a.after.grow,
            a.after.grow_start_ns,
            a.after.shrink
        );
    }
    if r.vms.is_empty() {
        let _ = writeln!(out, "no VMs served");
    }
    for vm in &r.vms {
        let _ = writeln!(out, "VM {} ({})", vm.name, vm.accel);
        for v in &vm.vcpus {
            vcpu(&mut out, v, r.budget_permille, vm.accel == "tcg");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvsched_control::{Applied, ApplyTarget, HaltPollParams, VmIdle};

    #[test]
    fn the_report_shows_histograms_and_both_windows() {
        let r = IdleReport {
            budget_permille: 50,
            kvm_halt_poll: Some(HaltPollParams {
                halt_poll_ns: 200_000,
                grow: 2,
                grow_start_ns: 10_000,
                shrink: 0,
            }),
            host_advice: Some(PollOutcome {
                window_us: 14.0,
                hit_rate: 15.0 / 18.0,
                cpu_share: 0.0002,
            }),
            applied: Some(Applied {
                target: ApplyTarget::Host,
                before: HaltPollParams {
                    halt_poll_ns: 200_000,
                    grow: 2,
                    grow_start_ns: 10_000,
                    shrink: 0,
                },
                after: HaltPollParams {
                    halt_poll_ns: 14_000,
                    grow: 2,
                    grow_start_ns: 10_000,
                    shrink: 0,
                },
            }),
            vms: vec![VmIdle {
                name: "a".into(),
                accel: "tcg".into(),
                vcpus: vec![VcpuIdle {
                    index: 0,
                    observed_s: 2.0,
                    halts: vec![(12.0, 10), (14.0, 5), (2048.0, 3)],
                    wakes: vec![(30.0, 18)],
                    wake_p50_us: 30.0,
                    wake_p99_us: 30.0,
                    polled_by_kvm: 0,
                    advice: PollOutcome {
                        window_us: 14.0,
                        hit_rate: 15.0 / 18.0,
                        cpu_share: 0.0004,
                    },
                    in_force: None,
                }],
            }],
        };

        let text = render(&r);

        assert!(text.contains("halt -> wake (18)"), "{text}");
        assert!(text.contains("< 16 µs"), "{text}");
        assert!(text.contains("catches 83.3 % of halts"), "{text}");
        assert!(
            text.contains("TCG: the vCPU threads do not halt-poll"),
            "{text}"
        );
        assert!(text.contains("halt_poll_ns 200000 -> 14000"), "{text}");
        assert!(text.contains("host-wide"), "{text}");
    }
}
