//! From the lock-holder scenario's raw results to its report: summaries
//! over the repeats, ratios paired by repeat, the avoided share, the CPU
//! split and the targets.

use std::collections::BTreeMap;

use super::model::*;
use super::report::*;
use crate::harness::figures::Spread;

/// [`Efficiency`] of `cases`, when both have vanilla.
pub fn efficiency(cases: &[CaseReport]) -> Option<Efficiency> {
    let rate = |case: LockCase| {
        let c = cases.iter().find(|c| c.case == case.name())?;
        let m = c.modes.get(LockMode::Vanilla.name())?;
        m.ops_per_cpu_s.as_ref().map(|s| s.median)
    };
    let alone = rate(LockCase::Alone)?;
    let overcommitted = rate(LockCase::Overcommitted)?;
    (overcommitted > 0.0).then(|| Efficiency {
        alone,
        overcommitted,
        alone_over_overcommitted: round(alone / overcommitted, 3),
    })
}

fn round(x: f64, places: i32) -> f64 {
    let m = 10f64.powi(places);
    (x * m).round() / m
}

/// The phases of one (case, mode), in run order.
pub fn phases_of(raw: &LocksRaw, case: LockCase, mode: LockMode) -> Vec<&Phase> {
    raw.phases
        .iter()
        .filter(|p| p.case == case && p.mode == mode)
        .collect()
}

/// The VMs' names in the phases, in first-seen order.
fn vm_names(phases: &[&Phase]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for p in phases {
        for v in &p.vms {
            if !names.contains(&v.name) {
                names.push(v.name.clone());
            }
        }
    }
    names
}

fn vm_summary(phases: &[&Phase], name: &str, index: usize) -> VmSummary {
    let of: Vec<(&Phase, &VmPhase)> = phases
        .iter()
        .filter_map(|p| p.vm(name).map(|v| (*p, v)))
        .collect();
    let ran = of.iter().any(|(_, v)| v.ran);
    let results: Vec<&LockstressResult> =
        of.iter().filter_map(|(_, v)| v.result.as_ref()).collect();
    let evenness: Vec<f64> = results
        .iter()
        .filter(|r| r.thread_ops_max > 0)
        .map(|r| r.thread_ops_min as f64 / r.thread_ops_max as f64)
        .collect();
    let mut guest: Option<GuestLocks> = None;
    let mut guest_window = 0.0;
    let mut guest_repeats = 0;
    let mut daemon: Option<DaemonLocks> = None;
    let mut scx: Option<ScxExtensions> = None;
    let mut kernel: Option<u64> = None;
    let mut held: Option<GuestHeld> = None;
    for (p, v) in &of {
        if let Some(h) = v.guest_held.filter(|h| h.takes > 0) {
            held.get_or_insert_with(GuestHeld::default).add(&h);
        }
        if let Some(g) = &v.guest_locks {
            guest.get_or_insert_with(GuestLocks::default).add(g);
            guest_window += p.window_s;
            guest_repeats += 1;
        }
        if let Some(d) = &v.daemon {
            daemon.get_or_insert_with(DaemonLocks::default).add(d);
        }
        if let Some(x) = &v.scx_extensions {
            scx.get_or_insert_with(ScxExtensions::default).add(x);
        }
        if let Some(k) = v.kernel_contentions {
            *kernel.get_or_insert(0) += k;
        }
    }
    if let Some(d) = daemon.as_mut() {
        d.extended_ms = round(d.extended_ms, 3);
        d.repaid_ms = round(d.repaid_ms, 3);
        d.debt_ms_at_end = round(d.debt_ms_at_end, 3);
    }
    if let Some(x) = scx.as_mut() {
        x.extended_ms = round(x.extended_ms, 3);
        x.holder_preempted_extended_ms = round(x.holder_preempted_extended_ms, 3);
        x.holder_preempted_unextended_ms = round(x.holder_preempted_unextended_ms, 3);
        x.holder_preempted_early_ms = round(x.holder_preempted_early_ms, 3);
    }
    VmSummary {
        name: name.to_string(),
        ran,
        results: results.len(),
        ops_per_s: (!results.is_empty())
            .then(|| Spread::of(results.iter().map(|r| round(r.ops_per_s, 1)).collect())),
        thread_evenness: crate::stats::median(&evenness).map(|e| round(e, 3)),
        cpu_s: Spread::of(of.iter().map(|(_, v)| round(v.cpu_s, 3)).collect()),
        cpu_pct_of_machine: Spread::of(
            of.iter()
                .map(|(p, v)| {
                    let wall = p.window_s * p.host_cpus.max(1) as f64;
                    if wall > 0.0 {
                        round(v.cpu_s / wall * 100.0, 1)
                    } else {
                        0.0
                    }
                })
                .collect(),
        ),
        cpu_split_pct: Spread::of(
            of.iter()
                .filter_map(|(p, _)| p.cpu_split()?.get(index).map(|s| round(s * 100.0, 1)))
                .collect(),
        ),
        contentions_per_s: guest
            .filter(|_| guest_window > 0.0)
            .map(|g| round(g.contended as f64 / guest_window, 1)),
        preempted_pct: guest
            .and_then(|g| g.preempted_rate())
            .map(|r| round(r * 100.0, 2)),
        guest_locks: guest,
        guest_locks_repeats: guest_repeats,
        kernel_contentions: kernel,
        guest_held: held,
        daemon,
        scx_extensions: scx,
    }
}

fn mode_summary(phases: &[&Phase], names: &[String]) -> ModeSummary {
    let totals: Vec<f64> = phases
        .iter()
        .filter_map(|p| p.total_ops_per_s())
        .map(|t| round(t, 1))
        .collect();
    let devs: Vec<f64> = phases
        .iter()
        .filter_map(|p| p.split_deviation_pct())
        .map(|d| round(d, 2))
        .collect();
    let kvm_preemptions = phases
        .iter()
        .filter_map(|p| p.kvm_preemptions)
        .reduce(|a, b| KvmPreemptions {
            reported: a.reported + b.reported,
            other: a.other + b.other,
        });
    ModeSummary {
        kvm_preemptions,
        repeats: phases.len(),
        total_ops_per_s: (!totals.is_empty()).then(|| Spread::of(totals)),
        split_deviation_pct: (!devs.is_empty()).then(|| Spread::of(devs)),
        ops_per_cpu_s: spread_of(
            phases
                .iter()
                .filter_map(|p| Some(round(p.ops_per_cpu_s()?, 1))),
        ),
        vms: names
            .iter()
            .enumerate()
            .map(|(i, n)| vm_summary(phases, n, i))
            .collect(),
        other_load_pct_per_repeat: phases
            .iter()
            .map(|p| round(p.foreign_cpu * 100.0, 1))
            .collect(),
        machine_busy_pct: spread_of(
            phases
                .iter()
                .filter_map(|p| Some(round(p.machine_busy? * 100.0, 1))),
        ),
        vms_pct: spread_of(phases.iter().filter_map(|p| {
            let cpu_s: f64 = p.vms.iter().map(|v| v.cpu_s).sum();
            Some(round(cpu_s / p.machine_seconds()? * 100.0, 1))
        })),
        daemon_pct: spread_of(
            phases
                .iter()
                .filter_map(|p| Some(round(p.daemon_cpu_s? / p.machine_seconds()? * 100.0, 2))),
        ),
        daemon_per_s: per_second(phases),
    }
}

/// A [`Spread`] of `v`; None when it is empty.
fn spread_of(v: impl Iterator<Item = f64>) -> Option<Spread> {
    let v: Vec<f64> = v.collect();
    (!v.is_empty()).then(|| Spread::of(v))
}

/// Each daemon counter summed over the phases that have it, per second of
/// those phases' windows.
fn per_second(phases: &[&Phase]) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for p in phases {
        for (k, v) in &p.daemon_counters {
            let e = sums.entry(k.clone()).or_default();
            e.0 += v;
            e.1 += p.window_s;
        }
    }
    sums.into_iter()
        .filter(|(_, (_, secs))| *secs > 0.0)
        .map(|(k, (n, secs))| (k, round(n / secs, 1)))
        .collect()
}

/// Per repeat present in both, `num`'s figure / `den`'s (`f` picks it; a
/// None or a zero denominator skips the repeat).
pub fn paired_ratios(
    num: &[&Phase],
    den: &[&Phase],
    f: impl Fn(&Phase) -> Option<f64>,
) -> Vec<f64> {
    num.iter()
        .filter_map(|n| {
            let d = den.iter().find(|d| d.rep == n.rep)?;
            let (a, b) = (f(n)?, f(d)?);
            (b > 0.0).then(|| round(a / b, 3))
        })
        .collect()
}

/// The pvsched modes in the order their ratios to vanilla are listed: each
/// backend's mode with lock handling first (the order of reports from
/// before the sched_ext modes).
pub const RATIO_ORDER: [LockMode; 4] = [
    LockMode::PvschedLock,
    LockMode::PvschedNolock,
    LockMode::PvschedScxLock,
    LockMode::PvschedScxNolock,
];

/// The ratios of every pvsched mode to vanilla in one case: per VM that
/// ran the workload, and `both` (the sum) when more than one did.
fn case_ratios(raw: &LocksRaw, case: LockCase, names: &[String]) -> Vec<Ratio> {
    let vanilla = phases_of(raw, case, LockMode::Vanilla);
    if vanilla.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for mode in RATIO_ORDER {
        if !raw.modes.contains(&mode) {
            continue;
        }
        let ph = phases_of(raw, case, mode);
        let mut push = |vm: &str, v: Vec<f64>| {
            if !v.is_empty() {
                out.push(Ratio {
                    vm: vm.to_string(),
                    mode: mode.name().to_string(),
                    vs: LockMode::Vanilla.name().to_string(),
                    ratio: Spread::of(v),
                });
            }
        };
        let running: Vec<&String> = names.iter().filter(|n| case.runs(n)).collect();
        if running.len() > 1 {
            push("both", paired_ratios(&ph, &vanilla, Phase::total_ops_per_s));
        }
        for n in running {
            push(
                n,
                paired_ratios(&ph, &vanilla, |p| {
                    p.vm(n)?.result.as_ref().map(|r| r.ops_per_s)
                }),
            );
        }
    }
    out
}

/// Guest counters of `phases` summed over the VMs `vms` and the repeats.
fn summed_guest(phases: &[&Phase], vms: &[&str]) -> GuestLocks {
    let mut g = GuestLocks::default();
    for p in phases {
        for v in p.vms.iter().filter(|v| vms.contains(&v.name.as_str())) {
            if let Some(c) = &v.guest_locks {
                g.add(c);
            }
        }
    }
    g
}

/// The share of holder preemptions avoided: 1 - rate(with) / rate(without),
/// each rate = holder-preempted / contentions over the summed counters.
pub fn avoided(without: GuestLocks, with: GuestLocks) -> Option<f64> {
    let (r0, r1) = (without.preempted_rate()?, with.preempted_rate()?);
    (r0 > 0.0).then(|| 1.0 - r1 / r0)
}

/// The backends whose avoided holder preemptions a report gives, in order.
pub const BACKENDS: [LockBackend; 2] = [LockBackend::Rt, LockBackend::SchedExt];

/// Whether vanilla's guests counted holder preemptions: KVM guests that
/// read KVM's steal-time flag (ABI 1.6) count them without a host half.
/// Earlier KVM guests and TCG guests count none, so a run whose vanilla
/// counted none is taken for one of those.
pub fn vanilla_counts_holders(raw: &LocksRaw) -> bool {
    raw.meta.base.accel == "kvm"
        && raw
            .phases
            .iter()
            .filter(|p| p.mode == LockMode::Vanilla)
            .flat_map(|p| &p.vms)
            .filter_map(|v| v.guest_locks)
            .any(|g| g.preempted > 0)
}

/// The avoided share of every backend whose two modes ran in `case`, and,
/// where vanilla counts holders, of its mode with lock handling against
/// vanilla.
fn case_avoided(
    raw: &LocksRaw,
    case: LockCase,
    names: &[String],
    vanilla_counts: bool,
) -> Vec<Avoided> {
    let mut rows: Vec<Avoided> = BACKENDS
        .iter()
        .flat_map(|b| pair_avoided(raw, case, names, *b, b.lock_pair().0))
        .collect();
    if vanilla_counts {
        rows.extend(
            BACKENDS
                .iter()
                .flat_map(|b| pair_avoided(raw, case, names, *b, LockMode::Vanilla)),
        );
    }
    rows
}

/// The avoided share of `backend`'s mode with lock handling against
/// `without_mode` (its mode without, or vanilla) in `case`: `both` and
/// each VM that ran the workload; empty unless both modes ran.
fn pair_avoided(
    raw: &LocksRaw,
    case: LockCase,
    names: &[String],
    backend: LockBackend,
    without_mode: LockMode,
) -> Vec<Avoided> {
    let with_mode = backend.lock_pair().1;
    let (without, with) = (
        phases_of(raw, case, without_mode),
        phases_of(raw, case, with_mode),
    );
    if without.is_empty() || with.is_empty() {
        return Vec::new();
    }
    let running: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| case.runs(n))
        .collect();
    let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
    if running.len() > 1 {
        groups.push(("both".into(), running.clone()));
    }
    groups.extend(running.iter().map(|n| (n.to_string(), vec![*n])));
    groups
        .into_iter()
        .map(|(vm, members)| {
            let (a, b) = (
                summed_guest(&without, &members),
                summed_guest(&with, &members),
            );
            let pct = |g: Option<GuestLocks>| {
                g.and_then(|g| g.preempted_rate())
                    .map(|r| round(r * 100.0, 2))
            };
            let (na, nb) = (a.named(), b.named());
            Avoided {
                backend,
                against_vanilla: without_mode == LockMode::Vanilla,
                vm,
                without: a,
                with: b,
                without_pct: pct(Some(a)),
                with_pct: pct(Some(b)),
                avoided_pct: avoided(a, b).map(|x| round(x * 100.0, 1)),
                named_without_pct: pct(na),
                named_with_pct: pct(nb),
                named_avoided_pct: na
                    .zip(nb)
                    .and_then(|(x, y)| avoided(x, y))
                    .map(|x| round(x * 100.0, 1)),
            }
        })
        .collect()
}

/// Whether `modes` has a sched_ext mode: its run is judged by issue 33's
/// targets, from `pvsched-scx-lock`.
pub fn has_scx_modes(modes: &[LockMode]) -> bool {
    modes
        .iter()
        .any(|m| m.backend() == Some(LockBackend::SchedExt))
}

/// One target: met when `value` is at least `limit` (`x`, `%>=`) or at
/// most (`%<=`); `why` says what it needs when it is not measured.
fn target(what: &str, value: Option<f64>, limit: f64, unit: &str, why: &str) -> LockTarget {
    LockTarget {
        what: what.to_string(),
        value,
        limit,
        unit: unit.to_string(),
        met: value.map(|v| {
            if unit == "%<=" {
                v <= limit + 1e-9
            } else {
                v >= limit - 1e-9
            }
        }),
        why: if value.is_none() {
            why.to_string()
        } else {
            String::new()
        },
    }
}

fn case_of(cases: &[CaseReport], case: LockCase) -> Option<&CaseReport> {
    cases.iter().find(|c| c.case == case.name())
}

/// The median ratio of `mode` to vanilla for `vm` (or `both`) in `case`.
fn median_ratio(cases: &[CaseReport], case: LockCase, vm: &str, mode: LockMode) -> Option<f64> {
    case_of(cases, case)?
        .ratios
        .iter()
        .find(|r| r.vm == vm && r.mode == mode.name())
        .map(|r| r.ratio.median)
}

/// The share of holder preemptions avoided on `backend`, both VMs,
/// overcommitted: the named holders' (ABI 1.7), true, where the guests
/// counted them, else every contention's, false.
fn avoided_both(cases: &[CaseReport], backend: LockBackend) -> Option<(f64, bool)> {
    let a = case_of(cases, LockCase::Overcommitted)?
        .avoided
        .iter()
        .find(|a| a.vm == "both" && a.backend == backend && !a.against_vanilla)?;
    match a.named_avoided_pct {
        Some(p) => Some((p, true)),
        None => a.avoided_pct.map(|p| (p, false)),
    }
}

/// The avoided target of `backend`, whose pair of modes `pair` names.
fn avoided_target(cases: &[CaseReport], backend: LockBackend, pair: &str) -> LockTarget {
    let found = avoided_both(cases, backend);
    let what = if found.is_some_and(|(_, named)| named) {
        format!(
            "overcommitted: holder preemptions avoided, named holders (the owner a mutex or \
             write-held rwsem records), counted by the guests over the run ({pair})"
        )
    } else {
        format!("overcommitted: holder preemptions avoided, counted by the guests over the run ({pair})")
    };
    let (nolock, lock) = backend.lock_pair();
    target(
        &what,
        found.map(|(p, _)| p),
        AVOIDED_TARGET_PCT,
        "%>=",
        &format!(
            "needs {} and {}, guests publishing F_LOCK_WAIT, and holder-preempted contentions \
             without lock handling",
            nolock.name(),
            lock.name()
        ),
    )
}

/// The worst repeat's deviation from an equal split of `mode`, overcommitted.
fn worst_split(cases: &[CaseReport], mode: LockMode) -> Option<f64> {
    case_of(cases, LockCase::Overcommitted)?
        .modes
        .get(mode.name())
        .and_then(|m| m.split_deviation_pct.as_ref())
        .map(|s| s.max)
}

/// The targets: a run with a sched_ext mode among `modes` gets issue 33's
/// ([`scx_targets`]), any other the three from the rt pair
/// ([`rt_targets`]).
pub fn targets(cases: &[CaseReport], modes: &[LockMode]) -> Vec<LockTarget> {
    if has_scx_modes(modes) {
        scx_targets(cases)
    } else {
        rt_targets(cases)
    }
}

/// The three targets (issue 14), from the overcommitted case and
/// the rt pair.
pub fn rt_targets(cases: &[CaseReport]) -> Vec<LockTarget> {
    vec![
        target(
            "overcommitted: throughput of both VMs, pvsched-lock / vanilla (median of the \
             per-repeat ratios)",
            median_ratio(
                cases,
                LockCase::Overcommitted,
                "both",
                LockMode::PvschedLock,
            ),
            SPEEDUP_TARGET,
            "x",
            "needs the overcommitted case with vanilla and pvsched-lock",
        ),
        avoided_target(cases, LockBackend::Rt, "pvsched-lock vs pvsched-nolock"),
        target(
            "overcommitted, pvsched-lock: each VM's CPU time within 5 % of an equal split \
             (the worst repeat's deviation)",
            worst_split(cases, LockMode::PvschedLock),
            SPLIT_TARGET_PCT,
            "%<=",
            "needs the overcommitted case with pvsched-lock",
        ),
    ]
}

/// Issue 33's four targets, from pvsched-scx-lock: overcommitted
/// throughput, alone throughput, holder preemptions avoided on sched_ext,
/// the CPU split.
pub fn scx_targets(cases: &[CaseReport]) -> Vec<LockTarget> {
    vec![
        target(
            "overcommitted: throughput of both VMs, pvsched-scx-lock / vanilla (median of the \
             per-repeat ratios)",
            median_ratio(
                cases,
                LockCase::Overcommitted,
                "both",
                LockMode::PvschedScxLock,
            ),
            SPEEDUP_TARGET,
            "x",
            "needs the overcommitted case with vanilla and pvsched-scx-lock",
        ),
        target(
            "alone: throughput of lock-a, pvsched-scx-lock / vanilla (median of the per-repeat \
             ratios)",
            median_ratio(cases, LockCase::Alone, VM_A, LockMode::PvschedScxLock),
            ALONE_TARGET,
            "x",
            "needs the alone case with vanilla and pvsched-scx-lock",
        ),
        avoided_target(
            cases,
            LockBackend::SchedExt,
            "pvsched-scx-lock vs pvsched-scx-nolock",
        ),
        target(
            "overcommitted, pvsched-scx-lock: each VM's CPU time within 5 % of an equal split \
             (the worst repeat's deviation)",
            worst_split(cases, LockMode::PvschedScxLock),
            SPLIT_TARGET_PCT,
            "%<=",
            "needs the overcommitted case with pvsched-scx-lock",
        ),
    ]
}

/// Builds the report: cases and modes in the run's order.
pub fn build(raw: &LocksRaw) -> LocksReport {
    let vanilla_counts = vanilla_counts_holders(raw);
    let mut cases = Vec::new();
    for &case in &raw.cases {
        let all: Vec<&Phase> = raw.phases.iter().filter(|p| p.case == case).collect();
        if all.is_empty() {
            continue;
        }
        let names = vm_names(&all);
        let mut c = CaseReport {
            case: case.name().to_string(),
            ..Default::default()
        };
        for &mode in &raw.modes {
            let ph = phases_of(raw, case, mode);
            if !ph.is_empty() {
                c.modes
                    .insert(mode.name().to_string(), mode_summary(&ph, &names));
            }
        }
        c.ratios = case_ratios(raw, case, &names);
        c.avoided = case_avoided(raw, case, &names, vanilla_counts);
        cases.push(c);
    }
    LocksReport {
        schema: "pvsched-bench-locks/1".into(),
        meta: raw.meta.clone(),
        targets: targets(&cases, &raw.modes),
        vanilla_counts_holders: vanilla_counts,
        efficiency: efficiency(&cases),
        cases,
        plots: Vec::new(),
    }
}

/// The modes of a case in report order.
pub fn ordered(modes: &BTreeMap<String, ModeSummary>) -> Vec<(LockMode, &ModeSummary)> {
    LockMode::ALL
        .iter()
        .filter_map(|m| modes.get(m.name()).map(|s| (*m, s)))
        .collect()
}
