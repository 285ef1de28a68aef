//! Hand-computed behaviour tests of the host scheduler model: the CFS ones set
//! `FairModel::Cfs`; the RT and model-neutral ones run under both fair models.

use super::*;

pub(super) const MS: u64 = 1_000_000;
pub(super) const S: u64 = 1_000_000_000;
const MODELS: [FairModel; 2] = [FairModel::Cfs, FairModel::Eevdf];

/// A CFS host.
fn host(cpus: u32) -> Host {
    host_in(cpus, FairModel::Cfs)
}

fn host_in(cpus: u32, fair: FairModel) -> Host {
    Host::new(HostParams {
        cpus,
        fair,
        ..HostParams::default()
    })
}

pub(super) const FAIR: Class = Class::Fair { nice: 0 };

/// Handles every internal deadline up to `end`, checking the invariants after each.
pub(super) fn run_until(h: &mut Host, end: u64, out: &mut Vec<Switch>) {
    while let Some(t) = h.next_timer() {
        if t > end {
            break;
        }
        h.on_timer(t, out);
        h.check_invariants();
    }
}

/// Spawns and wakes `n` threads of `class` at `now`.
pub(super) fn hogs(
    h: &mut Host,
    n: usize,
    class: Class,
    now: u64,
    out: &mut Vec<Switch>,
) -> Vec<Tid> {
    (0..n)
        .map(|_| {
            let t = h.spawn(class, None);
            h.wake(now, t, None, out);
            h.check_invariants();
            t
        })
        .collect()
}

pub(super) fn near(got: u64, want: u64, tol: u64) -> bool {
    got.abs_diff(want) <= tol
}

#[test]
fn equal_fair_hogs_share_one_cpu_evenly() {
    let (mut h, mut out) = (host(1), Vec::new());
    let t = hogs(&mut h, 2, FAIR, 0, &mut out);
    run_until(&mut h, S, &mut out);
    let (a, b) = (h.cpu_time(t[0], S), h.cpu_time(t[1], S));
    assert_eq!(a + b, S);
    // One CPU: latency 6 ms, so a 3 ms slice each.
    assert!(near(a, S / 2, 3 * MS), "{a} vs {b}");
}

#[test]
fn nice_0_and_nice_5_share_by_weight() {
    let (mut h, mut out) = (host(1), Vec::new());
    let a = hogs(&mut h, 1, FAIR, 0, &mut out)[0];
    let b = hogs(&mut h, 1, Class::Fair { nice: 5 }, 0, &mut out)[0];
    run_until(&mut h, S, &mut out);
    let want = S * 1024 / (1024 + 335);
    let (ta, tb) = (h.cpu_time(a, S), h.cpu_time(b, S));
    assert_eq!(ta + tb, S);
    // Slices 4.52 and 1.48 ms.
    assert!(near(ta, want, 6 * MS), "nice 0 got {ta}, want {want}");
}

#[test]
fn rt_wakeup_preempts_fair_hog_at_once() {
    for fair in MODELS {
        let (mut h, mut out) = (host_in(1, fair), Vec::new());
        let hog = hogs(&mut h, 1, FAIR, 0, &mut out)[0];
        let rt = h.spawn(Class::Fifo { prio: 10 }, None);
        run_until(&mut h, 5 * MS, &mut out);
        out.clear();
        h.wake(5 * MS, rt, None, &mut out);
        let want = Switch {
            at: 5 * MS,
            cpu: 0,
            prev: Some((hog, SwitchOut::Preempted)),
            next: Some(rt),
        };
        assert_eq!(out, vec![want], "{fair:?}");
        assert_eq!(h.state(hog), ThreadState::Runnable(0));
    }
}

fn no_throttle_in(cpus: u32, fair: FairModel) -> Host {
    Host::new(HostParams {
        cpus,
        fair,
        rt_runtime_ns: u64::MAX,
        ..HostParams::default()
    })
}

#[test]
fn rr_equal_prio_alternate_every_timeslice() {
    for fair in MODELS {
        rr_equal_prio_alternate_every_timeslice_in(fair);
    }
}

fn rr_equal_prio_alternate_every_timeslice_in(fair: FairModel) {
    let (mut h, mut out) = (no_throttle_in(1, fair), Vec::new());
    let t = hogs(&mut h, 2, Class::Rr { prio: 5 }, 0, &mut out);
    out.clear();
    run_until(&mut h, S - 1, &mut out);
    let want: Vec<Switch> = (1..10u64)
        .map(|i| {
            let (prev, next) = if i % 2 == 1 {
                (t[0], t[1])
            } else {
                (t[1], t[0])
            };
            Switch {
                at: i * 100 * MS,
                cpu: 0,
                prev: Some((prev, SwitchOut::Preempted)),
                next: Some(next),
            }
        })
        .collect();
    assert_eq!(out, want);
}

#[test]
fn fifo_equal_prio_never_alternate() {
    for fair in MODELS {
        let (mut h, mut out) = (no_throttle_in(1, fair), Vec::new());
        let t = hogs(&mut h, 2, Class::Fifo { prio: 5 }, 0, &mut out);
        out.clear();
        run_until(&mut h, S, &mut out);
        assert!(out.is_empty(), "{out:?}");
        assert_eq!((h.cpu_time(t[0], S), h.cpu_time(t[1], S)), (S, 0));
    }
}

#[test]
fn rt_throttling_leaves_fair_the_rest_of_each_period() {
    for fair in MODELS {
        let (mut h, mut out) = (host_in(1, fair), Vec::new());
        let fair = hogs(&mut h, 1, FAIR, 0, &mut out)[0];
        let rt = hogs(&mut h, 1, Class::Fifo { prio: 50 }, 0, &mut out)[0];
        run_until(&mut h, 960 * MS, &mut out);
        assert!(h.rt_throttled(0));
        assert_eq!(h.current(0), Some(fair));
        run_until(&mut h, 3 * S, &mut out);
        assert!(!h.rt_throttled(0));
        assert_eq!(h.rt_time(rt, 3 * S), 3 * 950 * MS);
        assert_eq!(h.cpu_time(fair, 3 * S), 3 * 50 * MS);
    }
}

#[test]
fn unthrottled_rt_hog_starves_fair() {
    for fair in MODELS {
        let (mut h, mut out) = (no_throttle_in(1, fair), Vec::new());
        let fair = hogs(&mut h, 1, FAIR, 0, &mut out)[0];
        let rt = hogs(&mut h, 1, Class::Fifo { prio: 50 }, 0, &mut out)[0];
        run_until(&mut h, 3 * S, &mut out);
        assert_eq!((h.cpu_time(rt, 3 * S), h.cpu_time(fair, 3 * S)), (3 * S, 0));
        assert_eq!(h.next_timer(), None);
    }
}

#[test]
fn two_hogs_on_two_cpus_run_one_per_cpu() {
    for fair in MODELS {
        let (mut h, mut out) = (host_in(2, fair), Vec::new());
        let t = hogs(&mut h, 2, FAIR, 0, &mut out);
        assert_eq!(h.state(t[0]), ThreadState::Running(0));
        assert_eq!(h.state(t[1]), ThreadState::Running(1));
        run_until(&mut h, S, &mut out);
        assert_eq!((h.cpu_time(t[0], S), h.cpu_time(t[1], S)), (S, S));
    }
}

#[test]
fn four_fair_hogs_on_two_cpus_balance_to_half_each() {
    for fair in MODELS {
        let (mut h, mut out) = (host_in(2, fair), Vec::new());
        let t = hogs(&mut h, 4, FAIR, 0, &mut out);
        // Placement leaves three on CPU 0; the balance at 4 ms moves one.
        assert_eq!((h.nr_running(0), h.nr_running(1)), (3, 1));
        run_until(&mut h, 4 * MS, &mut out);
        assert_eq!((h.nr_running(0), h.nr_running(1)), (2, 2));
        run_until(&mut h, S, &mut out);
        for &x in &t {
            // Two CPUs: latency 12 ms, a 6 ms slice each.
            assert!(
                near(h.cpu_time(x, S), S / 2, 6 * MS),
                "{x}: {}",
                h.cpu_time(x, S)
            );
        }
    }
}

#[test]
fn affinity_is_respected_by_placement_and_balance() {
    for fair in MODELS {
        let (mut h, mut out) = (host_in(2, fair), Vec::new());
        let t: Vec<Tid> = (0..2).map(|_| h.spawn(FAIR, Some(vec![1]))).collect();
        for &x in &t {
            h.wake(0, x, Some(0), &mut out);
        }
        let mut now = 0;
        while now < S {
            now += MS;
            run_until(&mut h, now, &mut out);
            assert_eq!(h.current(0), None);
            assert!(t.iter().all(|&x| matches!(
                h.state(x),
                ThreadState::Running(1) | ThreadState::Runnable(1)
            )));
        }
        assert!(near(h.cpu_time(t[0], S), S / 2, 6 * MS));
    }
}

#[test]
fn preempted_rt_is_pushed_to_a_cpu_running_fair() {
    for fair in MODELS {
        let (mut h, mut out) = (host_in(2, fair), Vec::new());
        let fair = hogs(&mut h, 2, FAIR, 0, &mut out)[1];
        assert_eq!(h.state(fair), ThreadState::Running(1));
        let low = h.spawn(Class::Rr { prio: 2 }, Some(vec![0, 1]));
        let high = h.spawn(Class::Fifo { prio: 5 }, Some(vec![0]));
        h.wake(MS, low, None, &mut out);
        assert_eq!(h.state(low), ThreadState::Running(0));
        out.clear();
        h.wake(2 * MS, high, None, &mut out);
        assert_eq!(h.state(high), ThreadState::Running(0));
        assert_eq!(h.state(low), ThreadState::Running(1));
        assert_eq!(h.state(fair), ThreadState::Runnable(1));
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(out.iter().all(|s| s.at == 2 * MS));
    }
}

#[test]
fn cpu_going_idle_pulls_queued_rt() {
    for fair in MODELS {
        let (mut h, mut out) = (no_throttle_in(2, fair), Vec::new());
        let z = hogs(&mut h, 1, Class::Fifo { prio: 20 }, 0, &mut out)[0];
        let x = hogs(&mut h, 1, Class::Fifo { prio: 10 }, 0, &mut out)[0];
        // Both CPUs run higher prios: it queues on its prev CPU.
        let y = hogs(&mut h, 1, Class::Fifo { prio: 5 }, 0, &mut out)[0];
        assert_eq!(
            (h.state(z), h.state(x)),
            (ThreadState::Running(0), ThreadState::Running(1))
        );
        assert_eq!(h.state(y), ThreadState::Runnable(0));
        out.clear();
        h.block(MS, x, &mut out);
        let want = Switch {
            at: MS,
            cpu: 1,
            prev: Some((x, SwitchOut::Blocked)),
            next: Some(y),
        };
        assert_eq!(out, vec![want]);
    }
}

#[test]
fn cpu_going_idle_pulls_queued_fair() {
    for fair in MODELS {
        let (mut h, mut out) = (host_in(2, fair), Vec::new());
        let t = hogs(&mut h, 3, FAIR, 0, &mut out);
        assert_eq!(h.state(t[2]), ThreadState::Runnable(0));
        out.clear();
        // Before either model's first slice end on CPU 0 (EEVDF: half a 1.4 ms slice).
        h.block(MS / 2, t[1], &mut out);
        let want = Switch {
            at: MS / 2,
            cpu: 1,
            prev: Some((t[1], SwitchOut::Blocked)),
            next: Some(t[2]),
        };
        assert_eq!(out, vec![want]);
    }
}

#[test]
fn set_class_raising_queued_above_current_preempts_at_once() {
    for fair in MODELS {
        let (mut h, mut out) = (host_in(1, fair), Vec::new());
        let t = hogs(&mut h, 2, FAIR, 0, &mut out);
        assert_eq!(h.current(0), Some(t[0]));
        out.clear();
        // Before either model's first slice end (EEVDF: half a 0.7 ms slice).
        h.set_class(MS / 4, t[1], Class::Rr { prio: 2 }, &mut out);
        let want = Switch {
            at: MS / 4,
            cpu: 0,
            prev: Some((t[0], SwitchOut::Preempted)),
            next: Some(t[1]),
        };
        assert_eq!(out, vec![want]);
    }
}

#[test]
fn set_class_lowering_running_below_queued_preempts_it() {
    for fair in MODELS {
        let (mut h, mut out) = (no_throttle_in(1, fair), Vec::new());
        let a = hogs(&mut h, 1, Class::Fifo { prio: 10 }, 0, &mut out)[0];
        let b = hogs(&mut h, 1, Class::Fifo { prio: 5 }, 0, &mut out)[0];
        assert_eq!(h.current(0), Some(a));
        out.clear();
        h.set_class(MS, a, Class::Fifo { prio: 1 }, &mut out);
        let want = Switch {
            at: MS,
            cpu: 0,
            prev: Some((a, SwitchOut::Preempted)),
            next: Some(b),
        };
        assert_eq!(out, vec![want]);
        // RT to fair with an RT thread queued: preempted too.
        out.clear();
        h.set_class(2 * MS, a, Class::Fifo { prio: 9 }, &mut out);
        assert_eq!(h.current(0), Some(a));
        h.set_class(3 * MS, a, FAIR, &mut out);
        assert_eq!(
            (h.current(0), h.state(a)),
            (Some(b), ThreadState::Runnable(0))
        );
    }
}

/// One CPU: a hog runs alone for 10 ms; a sleeper wakes (placed at min_vruntime), takes the
/// CPU at once (the hog's slice is long over), runs 0.5 ms and sleeps at vruntime 10.5 ms.
fn sleeper_setup() -> (Host, Tid, Tid) {
    let (mut h, mut out) = (host(1), Vec::new());
    let hog = hogs(&mut h, 1, FAIR, 0, &mut out)[0];
    let s = h.spawn(FAIR, None);
    h.wake(10 * MS, s, None, &mut out);
    assert_eq!(h.current(0), Some(s));
    h.block(10 * MS + MS / 2, s, &mut out);
    assert_eq!(h.current(0), Some(hog));
    (h, hog, s)
}

#[test]
fn long_sleeper_preempts_hog_at_wake() {
    let (mut h, hog, s) = sleeper_setup();
    let mut out = Vec::new();
    run_until(&mut h, 100 * MS, &mut out);
    // hog vruntime 99.5 ms; the sleeper's is placed at 99.5 - 3 ms: 3 ms > 1 ms ahead.
    h.wake(100 * MS, s, None, &mut out);
    let want = Switch {
        at: 100 * MS,
        cpu: 0,
        prev: Some((hog, SwitchOut::Preempted)),
        next: Some(s),
    };
    assert_eq!(out, vec![want]);
}

#[test]
fn brief_sleeper_does_not_preempt_within_wakeup_gran() {
    let mut out = Vec::new();
    // At 11.9 ms the hog's vruntime is 11.4 ms, the sleeper's 10.5 ms: 0.9 ms < 1 ms.
    let (mut h, hog, s) = sleeper_setup();
    h.wake(11 * MS + 9 * MS / 10, s, None, &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(h.current(0), Some(hog));
    // At 12.1 ms: 1.1 ms > 1 ms, it preempts.
    let (mut h, hog, s) = sleeper_setup();
    h.wake(12 * MS + MS / 10, s, None, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].prev, Some((hog, SwitchOut::Preempted)));
}

/// A small deterministic generator (the model itself has no randomness).
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

/// Random wakes, blocks and class changes; returns the switches and the number of calls.
fn random_run(
    fair: FairModel,
    cpus: u32,
    threads: u32,
    calls: u64,
    seed: u64,
    check: bool,
) -> (Vec<Switch>, u64) {
    let mut h = host_in(cpus, fair);
    let mut rng = Lcg(seed);
    let class = |r: u64| match r % 8 {
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
        h.spawn(class(r), aff);
    }
    let (mut out, mut now, mut n) = (Vec::new(), 0u64, 0u64);
    while n < calls {
        now += rng.next(50_000);
        while let Some(t) = h.next_timer().filter(|&t| t <= now) {
            h.on_timer(t, &mut out);
            n += 1;
        }
        let t = rng.next(u64::from(threads)) as Tid;
        let r = rng.next(1 << 20);
        match h.state(t) {
            ThreadState::Blocked => h.wake(now, t, Some(r as u32 % cpus), &mut out),
            ThreadState::Running(_) if r % 4 != 0 => h.block(now, t, &mut out),
            _ => h.set_class(now, t, class(r), &mut out),
        }
        n += 1;
        if check {
            h.check_invariants();
        }
    }
    (out, n)
}

#[test]
fn same_calls_give_same_switches() {
    for fair in MODELS {
        let a = random_run(fair, 8, 40, 20_000, 7, true);
        let b = random_run(fair, 8, 40, 20_000, 7, false);
        assert!(a.0.len() > 1000);
        assert_eq!(a, b, "{fair:?}");
    }
}

#[test]
fn fleet_sized_random_run_keeps_invariants() {
    for fair in MODELS {
        random_run(fair, 64, 500, 20_000, 11, true);
        let start = std::time::Instant::now();
        let (sw, n) = random_run(fair, 64, 500, 2_000_000, 13, false);
        let secs = start.elapsed().as_secs_f64();
        eprintln!(
            "host model ({fair:?}): {n} calls, {} switches in {secs:.2} s: {:.2} M calls/s",
            sw.len(),
            n as f64 / secs / 1e6
        );
    }
}
