//! Lock waits end to end on hand-built guest states: the guest publishes the wait as the
//! module does (the engine's lock path), the daemon reads the slots as pvschedd does, and
//! the real policy extends the preempted holder. Events are fed by hand, in an order the
//! host could produce; the host model is not run.

use pvsched_abi as abi;
use pvsched_policy::{Event, Rivals, VmStats};

use super::{Ev, Mode, Sim};
use crate::guest::{Behaviour, GClass, Lock, LockPhase, TState, Task, VWork};
use crate::host::Class;
use crate::scenario::{LockKind, Scenario};

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

/// A VM of `vcpus` vCPUs and no tasks of its own, KVM costs (`daemon_reaction_ns` 20 µs).
fn sim(mode: Mode, vcpus: u32) -> Sim {
    let text = format!(
        r#"
name = "locks"
duration_s = 1.0
warmup_s = 0.0
costs = "kvm"
modes = ["{}"]

[host]
cpus = 4

[[vms]]
name = "vm"
vcpus = {vcpus}
"#,
        mode.name()
    );
    let sc = Scenario::parse(&text, "test").expect("the test scenario parses");
    let limits = sc.limits_for(None).expect("valid limits");
    Sim::build(&sc, None, mode, sc.costs_for(None), limits, 1, false)
}

/// One lock task per vCPU (task i on vCPU i, running it, between two critical sections)
/// and lock 0, of `kind`, held by task 1.
fn lock_tasks(s: &mut Sim, kind: LockKind) {
    let g = &mut s.vms[0];
    let n = g.vcpus.len() as u32;
    g.locks.push(Lock {
        owner: Some(1),
        waiters: Default::default(),
    });
    for v in 0..n {
        g.tasks.push(Task {
            vcpu: v,
            class: GClass::Fair,
            state: TState::Runnable,
            remaining: 0,
            behaviour: Behaviour::Lock {
                lock_base: 0,
                locks: 1,
                kind,
                spin_limit: 0,
                outside: 40 * US,
                hold: 10 * US,
                phase: if v == 1 {
                    LockPhase::Holding
                } else {
                    LockPhase::Outside
                },
                which: 0,
            },
            expiry: None,
            timer_gen: 0,
        });
        g.enqueue(v);
        g.vcpus[v as usize].cur = Some(v);
        g.vcpus[v as usize].work = VWork::Task(v);
    }
}

fn at(s: &mut Sim, now: u64) {
    s.now = now;
}

fn stats(s: &Sim) -> VmStats {
    s.daemon.as_ref().map(|d| d.stats()[0]).unwrap_or_default()
}

fn boosted(s: &Sim, v: u32) -> bool {
    s.daemon.as_ref().is_some_and(|d| d.is_boosted(0, v))
}

/// The classes the daemon has queued for vCPU `v`: (when, class).
fn applies(s: &Sim, v: u32) -> Vec<(u64, Class)> {
    let mut out: Vec<(u64, Class)> = s
        .queue
        .iter()
        .filter_map(|q| match q.ev {
            Ev::Apply {
                vm: 0, vcpu, class, ..
            } if vcpu == v => Some((q.at, class)),
            _ => None,
        })
        .collect();
    out.sort_by_key(|a| a.0);
    out
}

/// vCPU 0's task contends at 1 ms for the mutex task 1 (vCPU 1, running) holds, sleeps,
/// and vCPU 0 idles (on its way to a halt: no host event yet, its slot unread); then
/// vCPU 1 is preempted at 1 ms + 10 µs. Returns the sim then.
fn mutex_waiter_then_holder_preempted(mode: Mode) -> Sim {
    let mut s = sim(mode, 2);
    lock_tasks(&mut s, LockKind::Mutex);
    at(&mut s, MS);
    s.feed(0, 0, Event::Running { vcpu: 0 });
    s.feed(0, 1, Event::Running { vcpu: 1 });

    // Its burst outside the lock ends: lock:contention_begin, it sleeps, vCPU 0 idles.
    s.task_burst_done(0, 0, 0);
    s.dispatch(0, 0);
    assert_eq!(s.vms[0].vcpus[0].work, VWork::Exit, "halting");

    // Only the read of the other slots at this preemption can show the wait.
    at(&mut s, MS + 10 * US);
    s.feed(
        0,
        1,
        Event::Preempted {
            vcpu: 1,
            rivals: Rivals::Host,
        },
    );
    s
}

#[test]
fn a_preempted_mutex_holder_that_a_sleeping_waiter_names_is_extended() {
    let mut s = mutex_waiter_then_holder_preempted(Mode::PvschedLocks);

    let half = s.vms[0].guest_half(0, s.now);
    assert_eq!(
        (half.lock_holder, half.lock_flags),
        (2, abi::LOCK_F_MUTEX | abi::LOCK_F_SLEEP),
        "vCPU 0's slot names vCPU 1"
    );
    assert_eq!(s.vms[0].tasks[0].state, TState::Waiting);
    let st = stats(&s);
    assert_eq!((st.lock_contentions, st.lock_holder_preempted), (1, 0));
    assert_eq!(st.lock_extensions, 1);
    assert!(boosted(&s, 1) && !boosted(&s, 0));
    // The extension is pvschedd's boost, RR 2, applied daemon_reaction_ns (20 µs) later.
    assert_eq!(applies(&s, 1), vec![(MS + 30 * US, Class::Rr { prio: 2 })]);

    // vCPU 1 runs again at 1.1 ms (a preemption cut short) and its extension ends at
    // 2.01 ms, 1 ms after it began: 910 µs on a CPU, all of it lock debt.
    at(&mut s, MS + 100 * US);
    s.feed(0, 1, Event::Running { vcpu: 1 });
    let end = MS + 10 * US + MS;
    if let Some(d) = s.daemon.as_mut() {
        d.handle(0, end, &[], Some(Event::Tick));
    }
    let st = stats(&s);
    assert_eq!(st.lock_preemptions_avoided, 1);
    assert_eq!(st.lock_extended_ns, end - (MS + 100 * US));
    assert!(!boosted(&s, 1), "the extension is over");
}

#[test]
fn without_lock_waits_the_preempted_holder_is_not_extended() {
    let s = mutex_waiter_then_holder_preempted(Mode::Pvsched);

    let half = s.vms[0].guest_half(0, s.now);
    assert_eq!(
        (half.lock_holder, half.lock_contended_count),
        (abi::LOCK_NONE, 0)
    );
    let st = stats(&s);
    assert_eq!((st.lock_contentions, st.lock_extensions), (0, 0));
    assert!(!boosted(&s, 1));
}

#[test]
fn a_spin_waiter_publishes_any_only_when_a_sibling_was_preempted_at_its_contention() {
    let mut s = sim(Mode::PvschedLocks, 3);
    lock_tasks(&mut s, LockKind::Spin);
    at(&mut s, MS);
    for v in 0..3 {
        s.feed(0, v, Event::Running { vcpu: v });
    }

    // Task 0 contends while every vCPU runs: counted, nothing shown.
    s.task_burst_done(0, 0, 0);
    let first = s.vms[0].guest_half(0, s.now);
    // The holder's vCPU is preempted after: the other slots are read, none names it.
    at(&mut s, MS + 10 * US);
    s.feed(
        0,
        1,
        Event::Preempted {
            vcpu: 1,
            rivals: Rivals::Host,
        },
    );
    let after_first = stats(&s);

    // Task 2 contends now: vCPU 1's host half says preempted, so "any other vCPU".
    at(&mut s, MS + 20 * US);
    s.task_burst_done(0, 2, 2);
    let second = s.vms[0].guest_half(2, s.now);
    // vCPU 2 is preempted in turn: its slot is read; the wait extends every other
    // preempted vCPU (vCPU 1), never the waiter's own.
    at(&mut s, MS + 30 * US);
    s.feed(
        0,
        2,
        Event::Preempted {
            vcpu: 2,
            rivals: Rivals::Host,
        },
    );
    let st = stats(&s);

    assert!(s.vms[0].tasks[0].spinning() && s.vms[0].tasks[2].spinning());
    assert_eq!(
        (first.lock_holder, first.lock_flags),
        (abi::LOCK_NONE, 0),
        "no sibling preempted at the contention"
    );
    assert_eq!(
        (first.lock_contended_count, first.lock_preempted_count),
        (1, 0)
    );
    assert_eq!(after_first.lock_extensions, 0);
    assert_eq!(after_first.lock_contentions, 1);
    assert_eq!(
        (second.lock_holder, second.lock_flags),
        (abi::LOCK_ANY, abi::LOCK_F_SPIN)
    );
    assert_eq!(
        (second.lock_contended_count, second.lock_preempted_count),
        (1, 1)
    );
    assert_eq!((st.lock_contentions, st.lock_holder_preempted), (2, 1));
    assert_eq!(st.lock_extensions, 1);
    assert!(boosted(&s, 1) && !boosted(&s, 2) && !boosted(&s, 0));
}

#[test]
fn a_spinner_handed_the_lock_while_spinning_clears_its_wait() {
    let mut s = sim(Mode::PvschedLocks, 3);
    lock_tasks(&mut s, LockKind::Spin);
    at(&mut s, MS);
    for v in 0..3 {
        s.feed(0, v, Event::Running { vcpu: v });
    }
    s.feed(
        0,
        1,
        Event::Preempted {
            vcpu: 1,
            rivals: Rivals::Host,
        },
    );
    s.task_burst_done(0, 0, 0);
    let waiting = s.vms[0].guest_half(0, s.now).lock_holder;

    // The holder's critical section ends: FIFO hand-over to task 0, which takes the lock
    // at vCPU 0's next dispatch (at once when its thread runs on the host; the host model
    // is not run here, so it is dispatched by hand).
    s.task_burst_done(0, 1, 1);
    let handed = s.vms[0].guest_half(0, s.now).lock_holder;
    s.dispatch(0, 0);

    assert_eq!(waiting, abi::LOCK_ANY);
    assert_eq!(
        handed,
        abi::LOCK_ANY,
        "shown until the waiter runs with the lock"
    );
    assert!(s.vms[0].tasks[0].holds_lock());
    assert_eq!(s.vms[0].guest_half(0, s.now).lock_holder, abi::LOCK_NONE);
    assert_eq!(s.vms[0].vcpus[0].lock_wait, None);
}

#[test]
fn the_lock_holder_scenario_publishes_waits_and_extends_in_pvsched_locks_only() {
    let mut sc = Scenario::load("lock-holder").expect("shipped");
    sc.duration_s = 0.3;
    sc.warmup_s = 0.1;
    let totals = |mode| {
        let r = super::run(&sc, None, mode, 1, false).expect("runs");
        let l: Vec<_> = r.vms.iter().map(|v| v.locks).collect();
        (
            l.iter().map(|l| l.contentions).sum::<u64>(),
            l.iter().map(|l| l.holder_preempted).sum::<u64>(),
            l.iter().map(|l| l.extensions).sum::<u64>(),
            l.iter().map(|l| l.extended_ms).sum::<f64>(),
        )
    };

    let (c, p, e, ms) = totals(Mode::PvschedLocks);
    let plain = totals(Mode::PvschedDoorbell);

    assert!(c > 1_000, "contentions {c}");
    assert!(p > 0 && p < c, "holder preempted {p} of {c}");
    assert!(e > 0 && ms > 0.0, "extensions {e}, {ms} ms");
    assert_eq!(plain, (0, 0, 0, 0.0), "no waits published, none honoured");
}
