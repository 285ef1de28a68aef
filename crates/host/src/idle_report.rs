//! `pvschedctl idle`: the idle transitions the policy measured per vCPU, the
//! advisor's halt-polling window within a CPU budget, and what the window in
//! force (the kvm module's cap; nothing under TCG, whose vCPU threads do not
//! poll) would have done over the same halts.

use std::path::Path;

use pvsched_base::kvm_params::{self, HaltPoll};
use pvsched_base::vcpu_names::Accel;
use pvsched_control::{IdleReport, PollOutcome, VcpuIdle, VmIdle};
use pvsched_policy::serving::{advise_vcpu, observed_ns, PooledHalts};
use pvsched_policy::{DurationHistogram, PollPrice};

use crate::vm::ServedVm;

/// Budgets above this are refused: a poll that may take half a core per vCPU
/// is not a halt-polling setting.
pub const MAX_BUDGET_PERMILLE: u32 = 500;

fn outcome(p: &PollPrice, elapsed_ns: u64) -> PollOutcome {
    PollOutcome {
        window_us: p.window_ns as f64 / 1e3,
        hit_rate: p.hit_rate(),
        cpu_share: p.cpu_share(elapsed_ns),
    }
}

fn buckets(h: &DurationHistogram) -> Vec<(f64, u64)> {
    h.buckets()
        .map(|(upper, count, _)| {
            let us = if upper == u64::MAX {
                f64::INFINITY
            } else {
                upper as f64 / 1e3
            };
            (us, count)
        })
        .collect()
}

/// The report for `vms` (all, or the one named `only`) at `now`.
pub fn report<'a>(
    vms: impl Iterator<Item = &'a ServedVm>,
    only: Option<&str>,
    budget_permille: u32,
    kvm_params_dir: &Path,
    now: u64,
) -> Result<IdleReport, String> {
    if budget_permille == 0 || budget_permille > MAX_BUDGET_PERMILLE {
        return Err(format!(
            "budget must be 1..={MAX_BUDGET_PERMILLE} permille of a core, not {budget_permille}"
        ));
    }
    let kvm = kvm_params::read_halt_poll_from(kvm_params_dir)
        .map_err(|e| format!("kvm module parameters: {e}"))?;
    let mut out = Vec::new();
    // Every reported vCPU's halts, for the host-wide cap: budgets add up per vCPU.
    let mut all_halts = PooledHalts::default();
    for vm in vms.filter(|vm| only.is_none_or(|n| n == vm.name)) {
        let tcg = vm.threads.accel == Accel::Tcg;
        let mut vcpus = Vec::new();
        for v in 0..vm.policy.nr_vcpus() {
            let Some(m) = vm.policy.idle_meter(v) else {
                continue;
            };
            let elapsed = observed_ns(m, now);
            all_halts.add(m, now);
            let advice = advise_vcpu(m, now, budget_permille);
            let in_force = match (tcg, kvm) {
                (false, Some(HaltPoll { halt_poll_ns, .. })) => {
                    Some(outcome(&m.halt_to_wake.price(halt_poll_ns), elapsed))
                }
                _ => None,
            };
            vcpus.push(VcpuIdle {
                index: v,
                observed_s: elapsed as f64 / 1e9,
                halts: buckets(&m.halt_to_wake),
                wakes: buckets(&m.wake_to_run),
                wake_p50_us: m.wake_to_run.quantile_upper_ns(0.5) as f64 / 1e3,
                wake_p99_us: m.wake_to_run.quantile_upper_ns(0.99) as f64 / 1e3,
                polled_by_kvm: m.polled,
                advice: outcome(&advice, elapsed),
                in_force,
            });
        }
        out.push(VmIdle {
            name: vm.name.clone(),
            accel: format!("{:?}", vm.threads.accel).to_lowercase(),
            vcpus,
        });
    }
    if let (Some(name), true) = (only, out.is_empty()) {
        return Err(format!("no VM named {name:?}"));
    }
    Ok(IdleReport {
        budget_permille,
        kvm_halt_poll: kvm,
        host_advice: all_halts
            .advise(budget_permille)
            .map(|host| outcome(&host, all_halts.observed_ns())),
        applied: None,
        vms: out,
    })
}

/// The kvm module parameters that put the host-wide advice in force: the cap
/// becomes the advised window (0 turns host polling off); KVM's adaptive
/// grow/shrink stay as they are, and so does a grow start below the cap.
pub fn host_setting(report: &IdleReport, current: HaltPoll) -> Result<HaltPoll, String> {
    let advice = report
        .host_advice
        .ok_or("no halts measured yet: nothing to base a setting on")?;
    let window = (advice.window_us * 1e3).round() as u64;
    Ok(HaltPoll {
        halt_poll_ns: window,
        grow_start_ns: match window {
            0 => current.grow_start_ns,
            w => current.grow_start_ns.min(w),
        },
        ..current
    })
}
