//! Behaviour tests of the sched_ext model (`scx.rs`): boosts, queues, slices, the kernel-boost
//! rule, and invariants over random calls.

use pvsched_policy::KernelGrant;

use super::tests::{run_until, FAIR, MS, S};
use super::*;

fn scx_host(cpus: u32) -> Host {
    Host::new(HostParams {
        cpus,
        scx: Some(ScxParams::default()),
        ..HostParams::default()
    })
}

/// A host whose woken tasks never preempt by vtime: what a boost alone does shows.
fn scx_host_without_wakeup_preemption(cpus: u32) -> Host {
    Host::new(HostParams {
        cpus,
        scx: Some(ScxParams {
            wakeup_preempt_ns: 0,
            ..ScxParams::default()
        }),
        ..HostParams::default()
    })
}

/// A registered vCPU thread (with a slot), blocked, allowed `allow`.
fn vcpu(h: &mut Host, allow: ScxAllowance) -> Tid {
    let t = h.spawn(FAIR, None);
    h.scx_register(t, true);
    h.scx_allow(t, allow);
    t
}

/// Kernel boosts at priority 2 with a second of allowance, halts within 100 ms boosted; no
/// burst rules.
const KBOOST: ScxAllowance = ScxAllowance {
    extension_ns: 0,
    kboost_allowed_ns: S,
    kernel: KernelGrant {
        priority: 2,
        allowance_ns: 0,
        halt_window_ns: 100 * MS,
        critical_sections: true,
        wakeups: false,
        wake_boost_ns: 0,
        demote_after_ns: 0,
        max_boost_ns: 0,
        throttle_ns: 0,
    },
};

/// KBOOST with other kernel terms.
fn kboost(kernel: KernelGrant) -> ScxAllowance {
    ScxAllowance { kernel, ..KBOOST }
}

const RT_WORK: ScxGuestView = ScxGuestView {
    idle: false,
    rt: true,
    cs: false,
    pending: false,
    rt_switches: 0,
};

fn sw(at: u64, cpu: Cpu, prev: Tid, how: SwitchOut, next: Tid) -> Switch {
    Switch {
        at,
        cpu,
        prev: Some((prev, how)),
        next: Some(next),
    }
}

/// A fair hog spawned and woken at 0 (it gets an idle CPU).
/// A fair thread, spawned and woken at `at`.
fn woken(h: &mut Host, at: u64, out: &mut Vec<Switch>) -> Tid {
    let t = h.spawn(FAIR, None);
    h.wake(at, t, None, out);
    t
}

fn hog(h: &mut Host, out: &mut Vec<Switch>) -> Tid {
    let t = woken(h, 0, out);
    h.check_invariants();
    t
}

#[test]
fn a_boosted_wakeup_preempts_a_running_fair_hog_on_its_cpu() {
    let (mut h, mut out) = (scx_host(1), Vec::new());
    let hog = hog(&mut h, &mut out);
    let v = vcpu(&mut h, ScxAllowance::default());
    h.scx_set_boost(0, v, 2, true, &mut out);
    out.clear();

    h.wake(MS, v, None, &mut out);
    h.check_invariants();

    assert_eq!(out, vec![sw(MS, 0, hog, SwitchOut::Preempted, v)]);
    assert_eq!(h.scx_queue_of(hog), "fair");
    assert_eq!(h.scx_stats(v).map(|s| s.boost_preempts), Some(1));
}

#[test]
fn an_unboosted_wakeup_waits_for_the_slice_end() {
    let (mut h, mut out) = (scx_host(1), Vec::new());
    let hog = hog(&mut h, &mut out);
    let w = h.spawn(FAIR, None);
    out.clear();

    h.wake(MS, w, None, &mut out);
    h.check_invariants();
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(h.scx_queue_of(w), "fair");

    run_until(&mut h, 6 * MS, &mut out);
    // The slice (5 ms) ends; the CPU picks before the hog is put back.
    assert_eq!(out, vec![sw(5 * MS, 0, hog, SwitchOut::Preempted, w)]);
}

#[test]
fn a_woken_task_far_behind_in_vtime_preempts_the_running_one_unless_turned_off() {
    for gran in [MS, 0] {
        let mut h = Host::new(HostParams {
            cpus: 1,
            scx: Some(ScxParams {
                wakeup_preempt_ns: gran,
                ..ScxParams::default()
            }),
            ..HostParams::default()
        });
        let mut out = Vec::new();
        let hog = hog(&mut h, &mut out);
        let w = h.spawn(FAIR, None);
        out.clear();

        // At 3 ms the hog is 3 ms ahead of `w` (both started at vtime 0): past 1 ms.
        h.wake(3 * MS, w, None, &mut out);
        run_until(&mut h, 6 * MS, &mut out);
        h.check_invariants();

        let at = if gran > 0 { 3 * MS } else { 5 * MS };
        assert_eq!(
            out[0],
            sw(at, 0, hog, SwitchOut::Preempted, w),
            "gran {gran}"
        );
    }
}

#[test]
fn a_lone_task_keeps_its_cpu_past_its_slice() {
    let (mut h, mut out) = (scx_host(1), Vec::new());
    let hog = hog(&mut h, &mut out);
    out.clear();
    run_until(&mut h, S, &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(h.cpu_time(hog, S), S);
}

#[test]
fn a_cpu_keeps_its_task_at_the_slice_end_and_pulls_only_a_head_more_than_a_slice_older() {
    let (mut h, mut out) = (scx_host(2), Vec::new());
    // `a` on CPU 0 from 0, `b` on CPU 1 from 1 ms; `w` (1 ms of vtime) waits in CPU 1's
    // queue, having last run there.
    let a = hog(&mut h, &mut out);
    let w = woken(&mut h, 0, &mut out);
    assert_eq!(h.state(w), ThreadState::Running(1));
    h.block(MS, w, &mut out);
    let b = woken(&mut h, MS, &mut out);
    assert_eq!(h.state(b), ThreadState::Running(1));
    h.wake(2 * MS, w, None, &mut out);
    h.check_invariants();
    assert_eq!(h.state(w), ThreadState::Runnable(1));
    assert_eq!(h.scx_queue_of(w), "fair");
    out.clear();

    // 5 ms: `a` (5 ms of vtime) is kept on a fresh slice: `w` (1 ms) is not more than a
    // slice older. 6 ms: CPU 1 runs its own queue's `w` before `b` (5 ms).
    run_until(&mut h, 5 * MS, &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(h.state(a), ThreadState::Running(0));
    assert_eq!(h.scx_slice(a), 5 * MS);
    run_until(&mut h, 6 * MS, &mut out);
    assert_eq!(out, vec![sw(6 * MS, 1, b, SwitchOut::Preempted, w)]);
    assert_eq!(h.state(b), ThreadState::Runnable(1));
    // 10 ms: `a` (10 ms) is kept again: `b` (5 ms) is a slice older, not more. 11 ms: `b`
    // runs (`w`, now 6 ms, is not older). 15 ms: `w` (6 ms) is more than a slice older
    // than `a` (15 ms): CPU 0 pulls it, and `a` waits in CPU 0's queue.
    run_until(&mut h, 15 * MS, &mut out);
    assert_eq!(
        out,
        vec![
            sw(6 * MS, 1, b, SwitchOut::Preempted, w),
            sw(11 * MS, 1, w, SwitchOut::Preempted, b),
            sw(15 * MS, 0, a, SwitchOut::Preempted, w),
        ]
    );
    assert_eq!(h.scx.fair_pulls, 1);
    assert_eq!(h.state(a), ThreadState::Runnable(0));
}

#[test]
fn a_cpu_whose_task_blocks_runs_its_own_queue_first_then_pulls_from_another() {
    let (mut h, mut out) = (scx_host(2), Vec::new());
    let _a = hog(&mut h, &mut out);
    // `w1` last ran on CPU 1 (1 ms of vtime); `x` runs there.
    let w1 = woken(&mut h, 0, &mut out);
    h.block(MS, w1, &mut out);
    let x = woken(&mut h, MS, &mut out);
    // Both CPUs busy: `w0` (vtime 0) waits in CPU 0's queue, `w1` in CPU 1's.
    let w0 = woken(&mut h, 2 * MS, &mut out);
    h.wake(2 * MS, w1, None, &mut out);
    h.check_invariants();
    assert_eq!(h.state(w0), ThreadState::Runnable(0));
    assert_eq!(h.state(w1), ThreadState::Runnable(1));
    assert!(h.scx_vtime(w0) < h.scx_vtime(w1));
    out.clear();

    // Its own `w1`, though `w0` is older (by less than a slice).
    h.block(3 * MS, x, &mut out);
    h.check_invariants();
    assert_eq!(out, vec![sw(3 * MS, 1, x, SwitchOut::Blocked, w1)]);
    assert_eq!(h.scx.fair_pulls, 0);
    out.clear();

    // Its queue empty: `w0` from CPU 0's.
    h.block(4 * MS, w1, &mut out);
    h.check_invariants();
    assert_eq!(out, vec![sw(4 * MS, 1, w1, SwitchOut::Blocked, w0)]);
    assert_eq!(h.scx.fair_pulls, 1);
}

#[test]
fn a_pull_skips_tasks_the_cpu_may_not_run_and_the_cpu_keeps_its_task() {
    let (mut h, mut out) = (scx_host(2), Vec::new());
    let a = hog(&mut h, &mut out);
    let b = woken(&mut h, MS, &mut out);
    assert_eq!(h.state(b), ThreadState::Running(1));
    // `p`, bound to CPU 1, waits in its queue at vtime 0.
    let p = h.spawn(FAIR, Some(vec![1]));
    h.wake(7 * MS, p, None, &mut out);
    assert_eq!(h.state(p), ThreadState::Runnable(1));
    out.clear();

    // 10 ms: `p` is more than a slice older than `a` (10 ms), but may not run on CPU 0: `a`
    // runs on, on a fresh slice. 11 ms: CPU 1 runs `p`, its own queue's.
    run_until(&mut h, 10 * MS, &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(h.scx_slice(a), 5 * MS);
    assert_eq!(h.scx_queue_of(p), "fair");
    run_until(&mut h, 11 * MS, &mut out);
    h.check_invariants();
    assert_eq!(out, vec![sw(11 * MS, 1, b, SwitchOut::Preempted, p)]);
    assert_eq!(h.scx.fair_pulls, 0);
}

#[test]
fn three_hogs_on_two_cpus_get_even_shares_through_few_pulls() {
    let (mut h, mut out) = (scx_host(2), Vec::new());
    let ts: Vec<Tid> = (0..3).map(|_| hog(&mut h, &mut out)).collect();
    run_until(&mut h, 2 * S, &mut out);

    let cpu: Vec<u64> = ts.iter().map(|&t| h.cpu_time(t, 2 * S)).collect();
    let (min, max) = (*cpu.iter().min().unwrap(), *cpu.iter().max().unwrap());
    assert!(min * 4 >= max * 3, "{cpu:?}");
    // A task runs on another CPU than its last only when pulled, and that is rare: most of
    // the 800 slice ends (2 CPUs, 2 s, 5 ms) keep the task or take the CPU's own queue's.
    let mut last: Vec<Option<Cpu>> = vec![None; 3];
    let mut moves = 0;
    for s in &out {
        if let Some(n) = s.next {
            let l = &mut last[n as usize];
            moves += u64::from(l.is_some_and(|l| l != s.cpu));
            *l = Some(s.cpu);
        }
    }
    let pulls = h.scx.fair_pulls;
    assert!(pulls > 0 && moves <= pulls, "{moves} moves, {pulls} pulls");
    assert!(moves * 4 < 800, "{moves} moves");
}

#[test]
fn a_boosted_task_queued_while_every_cpu_runs_a_boosted_one_waits_in_boost_before_fair() {
    let (mut h, mut out) = (scx_host(2), Vec::new());
    let hogs: Vec<Tid> = (0..2).map(|_| hog(&mut h, &mut out)).collect();
    let vs: Vec<Tid> = (0..3)
        .map(|_| {
            let v = vcpu(&mut h, ScxAllowance::default());
            h.scx_set_boost(0, v, 2, true, &mut out);
            v
        })
        .collect();
    // Two boosted vCPUs take both CPUs (the second through BOOST and a kick).
    h.wake(MS, vs[0], None, &mut out);
    h.wake(MS, vs[1], None, &mut out);
    h.check_invariants();
    assert_eq!(h.state(vs[0]), ThreadState::Running(0));
    assert_eq!(h.state(vs[1]), ThreadState::Running(1));
    // An unboosted thread waits in its CPU's fair queue with a smaller vtime than the hogs'.
    let fair = woken(&mut h, 2 * MS, &mut out);
    h.wake(2 * MS, vs[2], None, &mut out);
    h.check_invariants();
    assert_eq!(h.scx_queue_of(vs[2]), "boost");
    assert_eq!(h.scx_queue_of(fair), "fair");
    assert!(h.scx_vtime(fair) <= h.scx_vtime(hogs[0]));
    out.clear();

    h.block(3 * MS, vs[0], &mut out);
    h.check_invariants();

    assert_eq!(out, vec![sw(3 * MS, 0, vs[0], SwitchOut::Blocked, vs[2])]);
}

#[test]
fn a_thread_preempted_by_rt_resumes_first_with_its_slice_left() {
    let (mut h, mut out) = (scx_host(1), Vec::new());
    let hog = hog(&mut h, &mut out);
    let waiter = woken(&mut h, 0, &mut out);
    let rt = h.spawn(Class::Fifo { prio: 10 }, None);
    out.clear();

    h.wake(2 * MS, rt, None, &mut out);
    h.check_invariants();
    assert_eq!(h.scx_queue_of(hog), "local");
    assert_eq!(h.scx_slice(hog), 3 * MS);
    h.block(2 * MS + 100_000, rt, &mut out);
    run_until(&mut h, 6 * MS, &mut out);

    let back = 2 * MS + 100_000;
    assert_eq!(
        out,
        vec![
            sw(2 * MS, 0, hog, SwitchOut::Preempted, rt),
            sw(back, 0, rt, SwitchOut::Blocked, hog),
            sw(back + 3 * MS, 0, hog, SwitchOut::Preempted, waiter),
        ]
    );
}

#[test]
fn a_run_split_by_an_rt_preemption_is_charged_only_what_it_ran() {
    let (mut h, mut out) = (scx_host(1), Vec::new());
    let hog = hog(&mut h, &mut out);
    let rt = h.spawn(Class::Fifo { prio: 10 }, None);
    let before = h.scx_vtime(hog);
    // 2 ms, preempted for 0.1 ms, then the 3 ms left of its slice; blocks at its end.
    h.wake(2 * MS, rt, None, &mut out);
    h.block(2 * MS + 100_000, rt, &mut out);
    run_until(&mut h, 5 * MS + 100_000, &mut out);
    h.block(5 * MS + 100_000, hog, &mut out);
    h.check_invariants();

    // 5 ms in all: the 2 ms before the preemption count once.
    assert_eq!(h.scx_vtime(hog) - before, 5 * MS as i64);
}

#[test]
fn a_guest_always_showing_rt_work_is_demoted_so_a_fresh_boost_preempts_it_then_throttled() {
    let rules = kboost(KernelGrant {
        demote_after_ns: 4 * MS,
        max_boost_ns: 50 * MS,
        throttle_ns: 50 * MS,
        ..KBOOST.kernel
    });
    // One CPU: a hog, a rogue vCPU that always shows RT work and spins (kernel-boosted at
    // priority 2 from its second slice, turn about with the hog), and a neighbour vCPU the
    // daemon boosts (priority 2) and wakes at 27 ms, while the rogue runs its second boosted
    // slice. Returns when the neighbour ran, and the rogue's record at 400 ms.
    let run = |allow: ScxAllowance| {
        let (mut h, mut out) = (scx_host_without_wakeup_preemption(1), Vec::new());
        hog(&mut h, &mut out);
        let rogue = vcpu(&mut h, allow);
        let neighbour = vcpu(&mut h, allow);
        h.scx_set_view(rogue, RT_WORK);
        h.wake(MS, rogue, None, &mut out);
        run_until(&mut h, 27 * MS, &mut out);
        h.scx_set_boost(27 * MS, neighbour, 2, true, &mut out);
        out.clear();
        h.wake(27 * MS, neighbour, None, &mut out);
        run_until(&mut h, 40 * MS, &mut out);
        let ran = out.iter().find(|s| s.next == Some(neighbour)).map(|s| s.at);
        h.scx_set_boost(40 * MS, neighbour, 0, false, &mut out);
        run_until(&mut h, 400 * MS, &mut out);
        h.check_invariants();
        (ran, h.scx_stats(rogue).unwrap_or_default())
    };

    let (ruled_ran, ruled) = run(rules);
    let (free_ran, free) = run(KBOOST);

    // Demoted to priority 1 after 4 ms of its boosts, the rogue gives way to the fresh
    // boost at once; without the rules the neighbour waits for the rogue's slice end.
    assert_eq!(ruled_ran, Some(27 * MS), "{ruled:?}");
    assert!(
        free_ran.is_some_and(|t| t > 27 * MS),
        "{free_ran:?} {free:?}"
    );
    // Throttled after 50 ms of it (twice in 400 ms), and charged apart while demoted.
    assert!(
        ruled.kthrottles >= 2 && ruled.kboost_demoted_ns > 0,
        "{ruled:?}"
    );
    assert_eq!(
        (free.kthrottles, free.kboost_demoted_ns),
        (0, 0),
        "{free:?}"
    );
}

#[test]
fn a_boosted_run_is_not_charged_in_vtime() {
    for boosted in [true, false] {
        let (mut h, mut out) = (scx_host(1), Vec::new());
        hog(&mut h, &mut out);
        let v = vcpu(&mut h, ScxAllowance::default());
        if boosted {
            h.scx_set_boost(0, v, 2, true, &mut out);
        }
        h.wake(MS, v, None, &mut out);
        let before = h.scx_vtime(v);
        // Boosted it runs at once, else at the hog's slice end (5 ms); 2 ms either way.
        let start = if boosted { MS } else { 5 * MS };
        run_until(&mut h, start, &mut out);
        assert_eq!(h.state(v), ThreadState::Running(0), "boosted {boosted}");
        h.block(start + 2 * MS, v, &mut out);
        h.check_invariants();

        let charged = h.scx_vtime(v) - before;
        assert_eq!(charged, if boosted { 0 } else { 2 * MS as i64 });
    }
}

/// One CPU: `v` (registered, `allow`) runs from 0 showing `view`, a hog and another fair
/// thread wait in its fair queue; at `v`'s slice end (5 ms) the hog runs and `v` is put back.
fn preempted_showing(allow: ScxAllowance, view: ScxGuestView) -> (Host, Tid, Tid, Tid) {
    let (mut h, mut out) = (scx_host(1), Vec::new());
    let v = vcpu(&mut h, allow);
    h.wake(0, v, None, &mut out);
    let (a, b) = (h.spawn(FAIR, None), h.spawn(FAIR, None));
    h.wake(0, a, None, &mut out);
    h.wake(0, b, None, &mut out);
    h.scx_set_view(v, view);
    run_until(&mut h, 5 * MS, &mut out);
    assert_eq!(h.state(a), ThreadState::Running(0));
    (h, v, a, b)
}

#[test]
fn guest_rt_work_shown_at_a_stop_boosts_the_next_enqueue() {
    let (mut h, v, a, b) = preempted_showing(KBOOST, RT_WORK);
    let mut out = Vec::new();

    assert_eq!(h.scx_queue_of(v), "local");
    assert_eq!(h.scx_stats(v).map(|s| s.kboosts), Some(1));
    // Next after the hog's slice, ahead of `b` (which waited longer, at a smaller vtime).
    run_until(&mut h, 10 * MS, &mut out);
    assert_eq!(out, vec![sw(10 * MS, 0, a, SwitchOut::Preempted, v)]);
    assert_eq!(h.scx_queue_of(b), "fair");
    h.block(12 * MS, v, &mut out);
    assert_eq!(h.scx_stats(v).map(|s| s.kboost_ns), Some(2 * MS));
}

#[test]
fn no_kernel_boost_at_priority_0_or_with_the_allowance_spent() {
    let none = kboost(KernelGrant {
        priority: 0,
        ..KBOOST.kernel
    });
    let spent = ScxAllowance {
        kboost_allowed_ns: 0,
        ..KBOOST
    };
    for allow in [none, spent] {
        let (h, v, _, _) = preempted_showing(allow, RT_WORK);
        assert_eq!(h.scx_queue_of(v), "fair", "{allow:?}");
        assert_eq!(h.scx_stats(v).map(|s| s.kboosts), Some(0));
    }
}

#[test]
fn a_critical_section_at_a_preemption_is_boosted_only_if_the_grant_allows_it() {
    let cs = ScxGuestView {
        cs: true,
        ..ScxGuestView::default()
    };
    let no_cs = kboost(KernelGrant {
        critical_sections: false,
        ..KBOOST.kernel
    });
    let (h, v, _, _) = preempted_showing(KBOOST, cs);
    assert_eq!(h.scx_queue_of(v), "local");
    let (h, v, _, _) = preempted_showing(no_cs, cs);
    assert_eq!(h.scx_queue_of(v), "fair");
}

/// One CPU, a hog running: `v` (`allow`, boosted by the daemon) runs from 1 ms, its guest
/// having switched to an RT task once (`rt_switches` 1); with `earlier_stop` it stops at 2 ms
/// and runs again from 3 ms. It halts (its guest idle) at 2 ms or 4 ms, the daemon's boost
/// ends, and it wakes 1 ms later: the switches of that wakeup.
fn halt_then_wake(allow: ScxAllowance, earlier_stop: bool) -> (Vec<Switch>, Tid, Tid) {
    let (mut h, mut out) = (scx_host_without_wakeup_preemption(1), Vec::new());
    let hog = hog(&mut h, &mut out);
    let v = vcpu(&mut h, allow);
    h.scx_set_boost(0, v, 2, true, &mut out);
    h.wake(MS, v, None, &mut out);
    let rt_ran = ScxGuestView {
        rt_switches: 1,
        ..ScxGuestView::default()
    };
    h.scx_set_view(v, rt_ran);
    let halt_at = if earlier_stop {
        // This stop sees the RT work; the halt, 2 ms later, sees nothing new.
        h.block(2 * MS, v, &mut out);
        h.wake(3 * MS, v, None, &mut out);
        4 * MS
    } else {
        2 * MS
    };
    assert_eq!(h.state(v), ThreadState::Running(0));
    let idle = ScxGuestView {
        idle: true,
        ..rt_ran
    };
    h.scx_set_view(v, idle);
    h.block(halt_at, v, &mut out);
    // The daemon's boost ends while it halts: only the scheduler's own can help now.
    h.scx_set_boost(halt_at, v, 0, false, &mut out);
    out.clear();
    h.wake(halt_at + MS, v, None, &mut out);
    h.check_invariants();
    assert_eq!(h.scx_stats(v).map(|s| s.boost_preempts > 0), Some(true));
    (out, v, hog)
}

#[test]
fn a_halt_within_the_window_of_guest_rt_work_boosts_the_wakeup() {
    let (out, v, hog) = halt_then_wake(KBOOST, false);
    assert_eq!(out, vec![sw(3 * MS, 0, hog, SwitchOut::Preempted, v)]);

    // No window, or the RT work seen longer ago than the window: it waits.
    let no_window = kboost(KernelGrant {
        halt_window_ns: 0,
        ..KBOOST.kernel
    });
    let short = kboost(KernelGrant {
        halt_window_ns: MS / 2,
        ..KBOOST.kernel
    });
    assert_eq!(halt_then_wake(no_window, false).0, vec![]);
    assert_eq!(halt_then_wake(short, true).0, vec![]);
    assert_eq!(halt_then_wake(short, false).0.len(), 1);
}

#[test]
fn a_guest_boost_the_slot_no_longer_backs_is_dropped_at_the_enqueue() {
    for proactive in [false, true] {
        let (mut h, mut out) = (scx_host(1), Vec::new());
        let v = vcpu(&mut h, ScxAllowance::default());
        h.wake(0, v, None, &mut out);
        h.scx_set_boost(0, v, 2, proactive, &mut out);
        let _other = woken(&mut h, 0, &mut out);
        // The slot shows nothing when the slice ends.
        run_until(&mut h, 5 * MS, &mut out);
        let want = if proactive { "local" } else { "fair" };
        assert_eq!(h.scx_queue_of(v), want);
        let dropped = h.scx_stats(v).map(|s| s.boost_dropped);
        assert_eq!(dropped, Some(u64::from(!proactive)));
    }
}

#[test]
fn a_grant_to_a_thread_waiting_in_fair_moves_it_ahead_at_once() {
    let (mut h, mut out) = (scx_host(1), Vec::new());
    let hog = hog(&mut h, &mut out);
    let v = vcpu(&mut h, ScxAllowance::default());
    h.wake(MS, v, None, &mut out);
    assert_eq!(h.scx_queue_of(v), "fair");
    out.clear();

    h.scx_set_boost(2 * MS, v, 2, false, &mut out);
    h.check_invariants();

    assert_eq!(out, vec![sw(2 * MS, 0, hog, SwitchOut::Preempted, v)]);
}

#[test]
fn a_critical_section_at_the_slice_end_gets_one_extension_within_its_allowance() {
    for allowed in [0, 8 * MS] {
        let (mut h, mut out) = (scx_host(1), Vec::new());
        let allow = ScxAllowance {
            extension_ns: allowed,
            ..ScxAllowance::default()
        };
        let v = vcpu(&mut h, allow);
        h.wake(0, v, None, &mut out);
        let other = woken(&mut h, 0, &mut out);
        let cs = ScxGuestView {
            cs: true,
            ..ScxGuestView::default()
        };
        h.scx_set_view(v, cs);
        out.clear();
        run_until(&mut h, 9 * MS + MS / 2, &mut out);

        let ends = if allowed > 0 { 9 * MS } else { 5 * MS };
        assert_eq!(out, vec![sw(ends, 0, v, SwitchOut::Preempted, other)]);
        let stats = h.scx_stats(v).unwrap_or_default();
        assert_eq!(
            (stats.ext_count, stats.ext_refused),
            (u64::from(allowed > 0), u64::from(allowed == 0))
        );
    }
}

#[test]
fn a_critical_section_alone_on_its_cpu_gets_no_extension_and_runs_on() {
    let (mut h, mut out) = (scx_host(1), Vec::new());
    let allow = ScxAllowance {
        extension_ns: 8 * MS,
        ..ScxAllowance::default()
    };
    let v = vcpu(&mut h, allow);
    h.wake(0, v, None, &mut out);
    h.scx_set_view(
        v,
        ScxGuestView {
            cs: true,
            ..ScxGuestView::default()
        },
    );
    out.clear();
    // Slice ends at 5 and 10 ms with nothing else on the CPU.
    run_until(&mut h, 11 * MS, &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(h.scx_stats(v).unwrap_or_default().ext_count, 0);

    // A task waits from 11 ms: the slice end at 15 ms extends it.
    let other = woken(&mut h, 11 * MS, &mut out);
    run_until(&mut h, 19 * MS + MS / 2, &mut out);
    assert_eq!(out, vec![sw(19 * MS, 0, v, SwitchOut::Preempted, other)]);
    assert_eq!(h.scx_stats(v).unwrap_or_default().ext_count, 1);
}

#[test]
fn an_extension_ends_at_the_first_poll_that_finds_the_guest_out_of_its_critical_section() {
    let cs = ScxGuestView {
        cs: true,
        ..ScxGuestView::default()
    };
    for poll in [0, MS / 4] {
        let mut h = Host::new(HostParams {
            cpus: 1,
            scx: Some(ScxParams {
                extension_poll_ns: poll,
                ..ScxParams::default()
            }),
            ..HostParams::default()
        });
        let mut out = Vec::new();
        let allow = ScxAllowance {
            extension_ns: 8 * MS,
            ..ScxAllowance::default()
        };
        let v = vcpu(&mut h, allow);
        h.wake(0, v, None, &mut out);
        let other = woken(&mut h, 0, &mut out);
        h.scx_set_view(v, cs);
        out.clear();
        // Extended at 5 ms; still in its section at the polls of 5.25 to 6 ms, out of it
        // from 6.1 ms.
        run_until(&mut h, 6 * MS + MS / 10, &mut out);
        assert!(out.is_empty(), "{out:?}");
        h.scx_set_view(v, ScxGuestView::default());
        run_until(&mut h, 9 * MS + MS / 2, &mut out);

        let stats = h.scx_stats(v).unwrap_or_default();
        let (ends, ran, early) = if poll > 0 {
            (6 * MS + MS / 4, MS + MS / 4, 1)
        } else {
            (9 * MS, 4 * MS, 0)
        };
        assert_eq!(
            out,
            vec![sw(ends, 0, v, SwitchOut::Preempted, other)],
            "poll {poll}"
        );
        assert_eq!(
            (stats.ext_count, stats.ext_ended_early, stats.ext_ns),
            (1, early, ran),
            "poll {poll}"
        );
    }
}

/// A small deterministic generator.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Random wakes, blocks, class changes, grants, allowances and guest views on the sched_ext
/// model; checks the invariants and that the switches say what the host does.
fn random_run(cpus: u32, threads: u32, calls: u64, seed: u64) -> Vec<Switch> {
    let mut h = scx_host(cpus);
    let mut rng = Lcg(seed);
    let class = |r: u64| match r % 10 {
        0 => Class::Fifo {
            prio: 1 + (r % 7) as u8,
        },
        1 => Class::Rr {
            prio: 1 + (r % 5) as u8,
        },
        _ => Class::Fair {
            nice: (r % 11) as i8 - 5,
        },
    };
    for _ in 0..threads {
        let r = rng.next(1 << 20);
        let aff = (r % 5 == 0).then(|| vec![(r / 8) as u32 % cpus, (r / 64) as u32 % cpus]);
        let t = h.spawn(class(r), aff);
        if r % 3 != 0 {
            h.scx_register(t, r % 7 != 0);
        }
    }
    let mut running: Vec<Option<Tid>> = vec![None; cpus as usize];
    let (mut out, mut all, mut now, mut n) = (Vec::new(), Vec::new(), 0u64, 0u64);
    while n < calls {
        now += rng.next(2_000_000);
        while let Some(t) = h.next_timer().filter(|&t| t <= now) {
            h.on_timer(t, &mut out);
            n += 1;
        }
        let t = rng.next(u64::from(threads)) as Tid;
        let r = rng.next(1 << 20);
        match r % 16 {
            0 => h.scx_set_boost(now, t, (r % 4) as u8, r % 3 == 0, &mut out),
            1 => h.scx_allow(
                t,
                ScxAllowance {
                    extension_ns: r % 3 * 4 * MS,
                    kboost_allowed_ns: r % 5 * 10 * MS,
                    kernel: KernelGrant {
                        priority: (r % 3) as u8,
                        allowance_ns: 0,
                        halt_window_ns: r % 2 * 100 * MS,
                        critical_sections: r % 4 != 0,
                        wakeups: r % 5 != 0,
                        wake_boost_ns: MS,
                        demote_after_ns: r % 2 * 4 * MS,
                        max_boost_ns: r % 2 * 50 * MS,
                        throttle_ns: 50 * MS,
                    },
                },
            ),
            2 | 3 => h.scx_set_view(
                t,
                ScxGuestView {
                    idle: r % 3 == 0,
                    rt: r % 4 == 0,
                    cs: r % 5 == 0,
                    pending: r % 6 == 0,
                    rt_switches: r % 3,
                },
            ),
            _ => match h.state(t) {
                ThreadState::Blocked => h.wake(now, t, Some(r as u32 % cpus), &mut out),
                ThreadState::Running(_) if r % 4 != 0 => h.block(now, t, &mut out),
                _ => h.set_class(now, t, class(r), &mut out),
            },
        }
        n += 1;
        h.check_invariants();
        for s in out.drain(..) {
            let c = s.cpu as usize;
            assert_eq!(running[c], s.prev.map(|p| p.0), "{s:?}");
            if let Some(next) = s.next {
                assert!(!running.contains(&Some(next)), "{next} on two CPUs: {s:?}");
            }
            running[c] = s.next;
            all.push(s);
        }
        for c in 0..cpus {
            assert_eq!(running[c as usize], h.current(c), "CPU {c} at {now}");
        }
    }
    all
}

#[test]
fn random_calls_keep_the_invariants_and_the_same_calls_give_the_same_switches() {
    let a = random_run(4, 30, 20_000, 5);
    let b = random_run(4, 30, 20_000, 5);
    assert!(a.len() > 1000, "{}", a.len());
    assert_eq!(a, b);
    random_run(16, 120, 20_000, 9);
}
