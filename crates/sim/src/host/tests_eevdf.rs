//! Hand-computed behaviour tests of the EEVDF fair class (see eevdf.rs). Times in the comments are
//! in ms; vruntimes (v), deadlines (d) and V in virtual ms.

use super::tests::{hogs, near, run_until, FAIR, MS, S};
use super::*;

fn ev_host(cpus: u32, base_slice_ns: u64) -> Host {
    Host::new(HostParams {
        cpus,
        fair: FairModel::Eevdf,
        base_slice_ns,
        ..HostParams::default()
    })
}

fn sw(at: u64, prev: Tid, out: SwitchOut, next: Tid) -> Switch {
    Switch {
        at,
        cpu: 0,
        prev: Some((prev, out)),
        next: Some(next),
    }
}

/// Two nice-0 hogs on CPU 0: the first runs its first deadline (half a slice,
/// PLACE_DEADLINE_INITIAL), the second likewise, then each a full slice in turn. The slice is
/// 0.7 ms scaled by 1 + ilog2(min(cpus, 8)).
#[test]
fn eevdf_hogs_alternate_every_scaled_base_slice() {
    for (cpus, slice) in [
        (1, 700_000),
        (2, 1_400_000),
        (4, 2_100_000),
        (16, 2_800_000),
    ] {
        let mut h = Host::new(HostParams {
            cpus,
            ..HostParams::default()
        });
        let mut out = Vec::new();
        let t: Vec<Tid> = (0..2).map(|_| h.spawn(FAIR, Some(vec![0]))).collect();
        for &x in &t {
            h.wake(0, x, None, &mut out);
        }
        out.clear();
        run_until(&mut h, 20 * MS, &mut out);
        let mut at = vec![slice / 2, slice];
        while at.last().is_some_and(|&a| a + slice <= 20 * MS) {
            at.push(at.last().copied().unwrap_or(0) + slice);
        }
        let want: Vec<Switch> = at
            .iter()
            .enumerate()
            .map(|(i, &a)| sw(a, t[i % 2], SwitchOut::Preempted, t[(i + 1) % 2]))
            .collect();
        assert_eq!(out, want, "{cpus} cpus");
    }
}

#[test]
fn eevdf_two_equal_hogs_share_evenly() {
    let (mut h, mut out) = (ev_host(1, 700_000), Vec::new());
    let t = hogs(&mut h, 2, FAIR, 0, &mut out);
    run_until(&mut h, S, &mut out);
    let (a, b) = (h.cpu_time(t[0], S), h.cpu_time(t[1], S));
    assert_eq!(a + b, S);
    // Alternating 0.7 ms slices: at most one slice apart.
    assert!(near(a, S / 2, 700_000), "{a} vs {b}");
}

#[test]
fn eevdf_nice_0_and_nice_5_share_by_weight() {
    let (mut h, mut out) = (ev_host(1, 700_000), Vec::new());
    let a = hogs(&mut h, 1, FAIR, 0, &mut out)[0];
    let b = hogs(&mut h, 1, Class::Fair { nice: 5 }, 0, &mut out)[0];
    run_until(&mut h, S, &mut out);
    let want = S * 1024 / (1024 + 335);
    let (ta, tb) = (h.cpu_time(a, S), h.cpu_time(b, S));
    assert_eq!(ta + tb, S);
    // EEVDF keeps each lag within about a slice.
    assert!(near(ta, want, 700_000), "nice 0 got {ta}, want {want}");
}

/// One CPU, 1 ms slices. A and S start together; A runs its half slice, S runs 0.1 ms and
/// blocks eligible with lag 0.2; B starts. A and B share until A is picked at 3.1, protected
/// until the end of that slice (v 1.5 -> 2.5, i.e. 4.1).
fn parity_setup() -> (Host, [Tid; 3], Vec<Switch>) {
    let (mut h, mut out) = (ev_host(1, MS), Vec::new());
    let a = hogs(&mut h, 1, FAIR, 0, &mut out)[0];
    let s = hogs(&mut h, 1, FAIR, 0, &mut out)[0];
    // 0.5: A's first deadline (v 0.5): V 0.25, S (v 0, d 0.5) runs.
    run_until(&mut h, 600_000, &mut out);
    // 0.6: S (v 0.1) blocks; V 0.3: eligible, keeps lag 0.2. A (d 1.5) runs, protected.
    h.block(600_000, s, &mut out);
    assert_eq!(h.threads[s as usize].vlag, 200_000);
    // B is placed at V = 0.5 with d = 0.5 + 0.5: A is protected, no preemption.
    let b = hogs(&mut h, 1, FAIR, 600_000, &mut out)[0];
    // 1.6: A (v 1.5) ends its slice, V 1.0: B runs. 2.1: B (v 1.0, new d 2.0) wins again
    // (A is not eligible). 3.1: B (v 2.0), V 1.75: A (v 1.5, d 2.5) runs, protected to v 2.5.
    run_until(&mut h, 3_200_000 - 1, &mut out);
    let want = vec![
        Switch {
            at: 0,
            cpu: 0,
            prev: None,
            next: Some(a),
        },
        sw(500_000, a, SwitchOut::Preempted, s),
        sw(600_000, s, SwitchOut::Blocked, a),
        sw(1_600_000, a, SwitchOut::Preempted, b),
        sw(3_100_000, b, SwitchOut::Preempted, a),
    ];
    assert_eq!(out, want);
    out.clear();
    (h, [a, s, b], out)
}

/// RUN_TO_PARITY: S wakes at 3.2 with positive lag beside A, which has just started its slice.
/// A (v 1.6) stays eligible and protected, so S waits until A's slice ends at 4.1, then runs.
#[test]
fn eevdf_positive_lag_wakee_waits_for_protected_slice_end() {
    let (mut h, [a, s, _], mut out) = parity_setup();
    h.wake(3_200_000, s, None, &mut out);
    h.check_invariants();
    // V 1.8 over A (v 1.6) and B (v 2.0), W 2048: v = 1.8 - 0.2 * 3072 / 2048 = 1.5, d 2.5.
    let th = &h.threads[s as usize];
    assert_eq!((th.vr, th.dl), (1_500_000, 2_500_000));
    assert!(out.is_empty(), "{out:?}");
    // 4.1: A (v 2.5), V 2.0: S (v 1.5, d 2.5) is eligible with the earliest deadline.
    run_until(&mut h, 5 * MS, &mut out);
    assert_eq!(out, vec![sw(4_100_000, a, SwitchOut::Preempted, s)]);
}

/// The same wake at 2.5 finds B re-picked at 2.1 without protection (and, once S is placed at
/// v 1.15 with d 2.15, no longer eligible: V 1.35 < v 1.4): S preempts at once.
#[test]
fn eevdf_positive_lag_wakee_preempts_unprotected_curr_at_once() {
    let (mut h, mut out) = (ev_host(1, MS), Vec::new());
    let a = hogs(&mut h, 1, FAIR, 0, &mut out)[0];
    let s = hogs(&mut h, 1, FAIR, 0, &mut out)[0];
    run_until(&mut h, 600_000, &mut out);
    h.block(600_000, s, &mut out);
    let b = hogs(&mut h, 1, FAIR, 600_000, &mut out)[0];
    run_until(&mut h, 2_500_000 - 1, &mut out);
    assert_eq!(h.current(0), Some(b));
    out.clear();
    h.wake(2_500_000, s, None, &mut out);
    let th = &h.threads[s as usize];
    assert_eq!((th.vr, th.dl), (1_150_000, 2_150_000));
    assert_eq!(out, vec![sw(2_500_000, b, SwitchOut::Preempted, s)]);
    assert_eq!(h.state(a), ThreadState::Runnable(0));
}

/// One CPU, 1 ms slices: A and B alternate; A blocks at 1.3 (v 0.8) while V is 0.65, not
/// eligible: DELAY_DEQUEUE keeps it queued. B runs, protected to v 1.5 (2.3).
fn delayed_setup() -> (Host, Tid, Tid, Vec<Switch>) {
    let (mut h, mut out) = (ev_host(1, MS), Vec::new());
    let t = hogs(&mut h, 2, FAIR, 0, &mut out);
    let (a, b) = (t[0], t[1]);
    // 0.5: A -> B; 1.0: B (v 0.5, d 1.5) ties A (v 0.5, d 1.5): A, queued first, runs.
    run_until(&mut h, 1_300_000, &mut out);
    assert_eq!(h.current(0), Some(a));
    out.clear();
    h.block(1_300_000, a, &mut out);
    h.check_invariants();
    assert_eq!(out, vec![sw(1_300_000, a, SwitchOut::Blocked, b)]);
    assert_eq!(h.state(a), ThreadState::Blocked);
    assert!(h.threads[a as usize].delayed);
    assert_eq!(h.nr_running(0), 1);
    out.clear();
    (h, a, b, out)
}

/// Not woken, the delayed A becomes eligible and is picked at B's slice end (2.3: V 1.15): it
/// leaves with lag 0 (DELAY_ZERO) and B goes on. Woken at 3.0 it is placed at V = 2.2 with
/// d 3.2; B (d 2.5) keeps the CPU until 3.3, then A runs.
#[test]
fn eevdf_delayed_sleeper_leaves_when_picked_with_zero_lag() {
    let (mut h, a, b, mut out) = delayed_setup();
    run_until(&mut h, 3 * MS - 1, &mut out);
    assert!(out.is_empty(), "{out:?}");
    let th = &h.threads[a as usize];
    assert!(!th.delayed && th.vlag == 0);
    h.wake(3 * MS, a, None, &mut out);
    let th = &h.threads[a as usize];
    assert_eq!((th.vr, th.dl), (2_200_000, 3_200_000));
    run_until(&mut h, 4 * MS, &mut out);
    assert_eq!(out, vec![sw(3_300_000, b, SwitchOut::Preempted, a)]);
}

/// Woken at 1.4 while still delayed (V 0.7 < v 0.8), A is requeued where it is (v 0.8, d 1.5)
/// and B, protected, keeps the CPU until 2.3. Woken at 1.8 instead (V 0.9: positive lag) it is
/// placed anew with lag 0 (v 1.0, d 2.0): the same switch at 2.3.
#[test]
fn eevdf_delayed_sleeper_woken_is_requeued_in_place() {
    for (wake, vr, dl) in [
        (1_400_000, 800_000, 1_500_000),
        (1_800_000, 1_000_000, 2_000_000),
    ] {
        let (mut h, a, b, mut out) = delayed_setup();
        h.wake(wake, a, None, &mut out);
        h.check_invariants();
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(h.state(a), ThreadState::Runnable(0));
        let th = &h.threads[a as usize];
        assert_eq!((th.vr, th.dl, th.delayed), (vr, dl, false));
        // (A's own slice then ends at 3.0, resp. 3.3.)
        run_until(&mut h, 2_900_000, &mut out);
        assert_eq!(out, vec![sw(2_300_000, b, SwitchOut::Preempted, a)]);
    }
}

/// A class change keeps lag and the relative deadline. One CPU, 1 ms slices: A runs, B (v 0,
/// d 0.5) waits. At 0.2 (V 0.1) B becomes FIFO, leaving with lag 0.1 and relative deadline 0.5,
/// and preempts A. Fair again at 1.2 while running, it is placed beside A (v 0.2) at
/// v = 0.2 - 0.1 * 2048 / 1024 = 0, d 0.5: lag 0.1 again, eligible and freshly protected, so it
/// keeps the CPU until its slice ends at 1.7, when A (d 0.5) wins.
#[test]
fn eevdf_class_change_keeps_lag_and_relative_deadline() {
    let (mut h, mut out) = (ev_host(1, MS), Vec::new());
    let t = hogs(&mut h, 2, FAIR, 0, &mut out);
    let (a, b) = (t[0], t[1]);
    out.clear();
    h.set_class(200_000, b, Class::Fifo { prio: 5 }, &mut out);
    assert_eq!(out, vec![sw(200_000, a, SwitchOut::Preempted, b)]);
    let th = &h.threads[b as usize];
    assert_eq!((th.vlag, th.rel_dl), (100_000, Some(500_000)));
    out.clear();
    h.set_class(1_200_000, b, FAIR, &mut out);
    h.check_invariants();
    assert!(out.is_empty(), "{out:?}");
    let th = &h.threads[b as usize];
    assert_eq!((th.vr, th.dl), (0, 500_000));
    assert_eq!(h.avg_vr(0, true) - th.vr, 100_000);
    // (A, d 0.5, then runs to 2.0.)
    run_until(&mut h, 1_900_000, &mut out);
    assert_eq!(out, vec![sw(1_700_000, b, SwitchOut::Preempted, a)]);
}

/// The balance keeps a moved thread's lag (V - v, up to the rounding of V) and its deadline
/// relative to its vruntime. CPU 1 runs a pinned hog; A, B, C start on CPU 0; at 4 ms one of the
/// queued two moves to CPU 1.
#[test]
fn eevdf_migration_keeps_lag_and_relative_deadline() {
    let (mut h, mut out) = (ev_host(2, 700_000), Vec::new());
    let pinned = h.spawn(FAIR, Some(vec![1]));
    h.wake(0, pinned, None, &mut out);
    let t = hogs(&mut h, 3, FAIR, 0, &mut out);
    assert!(t.iter().all(|&x| h.threads[x as usize].cpu == 0));
    run_until(&mut h, 4 * MS - 1, &mut out);
    // V on CPU 0 at 4 ms, its running thread's vruntime brought up to date.
    let rq = &h.rqs[0];
    let cur = &h.threads[rq.curr.expect("CPU 0 busy") as usize];
    let v_cur = cur.vr + ((4 * MS - rq.curr_start) * 1024 / cur.weight) as i64;
    let load = i128::from(rq.ev_load + cur.weight);
    let v0 = ((rq.ev_sum + i128::from(cur.weight) * i128::from(v_cur)) / load) as i64;
    let before: Vec<(i64, i64)> = t
        .iter()
        .map(|&x| {
            let th = &h.threads[x as usize];
            (v0 - th.vr, th.dl - th.vr)
        })
        .collect();
    run_until(&mut h, 4 * MS, &mut out);
    let moved: Vec<usize> = (0..3)
        .filter(|&i| h.threads[t[i] as usize].cpu == 1)
        .collect();
    assert_eq!(moved.len(), 1, "one thread moves");
    let i = moved[0];
    let th = &h.threads[t[i] as usize];
    let (lag, rel) = (h.avg_vr(1, true) - th.vr, th.dl - th.vr);
    assert_eq!(rel, before[i].1);
    assert!(
        before[i].0 > 0 && lag.abs_diff(before[i].0) <= 2,
        "{lag} vs {before:?}"
    );
}

/// Random wakes, blocks and class changes on 4 CPUs keep the invariants and go through the
/// delayed-dequeue paths (a delayed thread woken in place, one picked and dequeued).
#[test]
fn eevdf_random_run_covers_delayed_dequeue() {
    let mut h = ev_host(4, 700_000);
    let n = 24u32;
    for i in 0..n {
        let class = if i % 6 == 0 {
            Class::Rr { prio: 3 }
        } else {
            Class::Fair {
                nice: (i % 5) as i8 - 2,
            }
        };
        h.spawn(class, None);
    }
    let (mut out, mut now, mut x) = (Vec::new(), 0u64, 12345u64);
    let (mut woken_delayed, mut finished) = (0, 0);
    for _ in 0..50_000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let r = x >> 33;
        now += r % 300_000;
        let delayed_before: Vec<bool> = h.threads.iter().map(|t| t.delayed).collect();
        run_until(&mut h, now, &mut out);
        let t = (r / 300_000 % u64::from(n)) as Tid;
        match h.state(t) {
            ThreadState::Blocked => {
                woken_delayed += usize::from(h.threads[t as usize].delayed);
                h.wake(now, t, None, &mut out);
            }
            ThreadState::Running(_) if r % 7 != 0 => h.block(now, t, &mut out),
            _ if r % 11 == 0 => {
                let nice = (r % 7) as i8 - 3;
                h.set_class(now, t, Class::Fair { nice }, &mut out);
            }
            _ => {}
        }
        h.check_invariants();
        finished += delayed_before
            .iter()
            .zip(&h.threads)
            .filter(|(&d, th)| d && !th.delayed && th.state == ThreadState::Blocked)
            .count();
    }
    assert!(
        woken_delayed > 50 && finished > 50,
        "{woken_delayed} {finished}"
    );
}
