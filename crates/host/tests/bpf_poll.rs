//! The /proc polling fallback sees a tracked thread block and run.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use pvsched_host::events::{EventKind, HostEvent, PollOptions, ProcPollSource};

#[test]
fn sleeping_then_spinning_thread_changes_state() {
    let mut src = ProcPollSource::new(PollOptions {
        interval: Duration::from_millis(2),
    })
    .unwrap();
    let (tx, rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let h = thread::spawn(move || {
        tx.send(unsafe { libc::gettid() } as u32).unwrap();
        go_rx.recv().unwrap();
        // Long phases: a loaded machine may delay the poller by tens of ms.
        for _ in 0..3 {
            thread::sleep(Duration::from_millis(120));
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(120) {
                std::hint::spin_loop();
            }
        }
    });
    let tid = rx.recv().unwrap();
    src.try_track(tid, 5, 1).unwrap();
    go_tx.send(()).unwrap();
    let mut evs = Vec::new();
    let end = Instant::now() + Duration::from_millis(800);
    while Instant::now() < end {
        src.poll(Duration::from_millis(10), |e| evs.push(e))
            .unwrap();
    }
    h.join().unwrap();
    let outs = evs.iter().filter(|e| matches!(e, HostEvent { tid: t, vm: 5, vcpu: 1, kind: EventKind::SwitchOut { runnable: false, .. }, .. } if *t == tid)).count();
    let ins = evs
        .iter()
        .filter(|e| matches!(e, HostEvent { tid: t, vm: 5, vcpu: 1, kind: EventKind::SwitchIn { .. }, .. } if *t == tid))
        .count();
    assert!(outs >= 2 && ins >= 2, "outs {outs} ins {ins}: {evs:?}");
    // Strictly alternating: only changes are reported.
    for w in evs.windows(2) {
        assert_ne!(
            std::mem::discriminant(&w[0].kind),
            std::mem::discriminant(&w[1].kind),
            "{evs:?}"
        );
    }
    assert!(src.polls() > 50, "polls {}", src.polls());

    // The thread is gone: no more events, no error.
    let mut after = Vec::new();
    for _ in 0..3 {
        src.sample(|e| after.push(e));
    }
    assert!(after.is_empty(), "{after:?}");
    src.untrack(tid);
    assert_eq!(src.tracked(), 0);
}

#[test]
fn consume_respects_the_interval() {
    let mut src = ProcPollSource::new(PollOptions {
        interval: Duration::from_millis(50),
    })
    .unwrap();
    src.try_track(unsafe { libc::gettid() } as u32, 0, 0)
        .unwrap();
    let due = src.next_poll_ns();
    assert_eq!(src.consume(|_| {}), 0, "not due yet");
    assert_eq!(src.polls(), 0);
    let n = src.poll(Duration::from_millis(200), |_| {}).unwrap();
    assert_eq!(n, 1, "first poll reports the current state");
    assert_eq!(src.polls(), 1);
    assert!(src.next_poll_ns() >= due + 50_000_000);
    assert!(src.try_track(u32::MAX - 1, 0, 0).is_err(), "no such thread");
}
