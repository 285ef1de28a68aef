//! Measurements of the event sources (not pass/fail: they print numbers).
//!
//! cargo test --release -p pvsched-host --test bpf_bench -- --ignored --nocapture --test-threads=1
//!
//! Needs root for the BPF parts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use pvsched_host::events::{
    enable_run_time_stats, BpfOptions, BpfSource, EventKind, HostEvent, PollOptions, ProcPollSource,
};

fn gettid() -> u32 {
    unsafe { libc::gettid() as u32 }
}

fn mono() -> u64 {
    pvsched_base::clock::monotonic_ns()
}

fn thread_cpu() -> u64 {
    pvsched_base::clock::thread_cpu_ns()
}

fn pct(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p) as usize]
}

fn root() -> bool {
    let ok = unsafe { libc::geteuid() } == 0;
    if !ok {
        eprintln!("skipping: needs root");
    }
    ok
}

fn print_prog_stats(src: &BpfSource) {
    for p in src.prog_stats() {
        if p.run_cnt > 0 {
            println!(
                "  {:<22} {:>9} runs {:>6.0} ns/run",
                p.name,
                p.run_cnt,
                p.run_time_ns as f64 / p.run_cnt as f64
            );
        }
    }
}

/// A tracked thread doing `n` sleeps of `us` µs; returns its wall time and CPU time.
fn sleeper(n: u32, us: u64, tid_tx: mpsc::Sender<u32>, go: mpsc::Receiver<()>) -> (u64, u64) {
    tid_tx.send(gettid()).unwrap();
    go.recv().unwrap();
    let (w0, c0) = (mono(), thread_cpu());
    for _ in 0..n {
        thread::sleep(Duration::from_micros(us));
    }
    (mono() - w0, thread_cpu() - c0)
}

/// 10k sleeps of 100 µs by a tracked thread, consumer blocked in poll():
/// consumer CPU per event, and delivery latency (kernel timestamp to
/// callback).
#[test]
#[ignore]
fn sleep_pipeline() {
    if !root() {
        return;
    }
    const N: u32 = 10_000;
    // Baseline: the same sleeps, no BPF.
    let (ttx, trx) = mpsc::channel();
    let (gtx, grx) = mpsc::channel();
    let h = thread::spawn(move || sleeper(N, 100, ttx, grx));
    trx.recv().unwrap();
    gtx.send(()).unwrap();
    let (base_wall, base_cpu) = h.join().unwrap();

    let mut src = BpfSource::load(BpfOptions::default()).unwrap();
    let _stats = enable_run_time_stats().unwrap();
    let (ttx, trx) = mpsc::channel();
    let (gtx, grx) = mpsc::channel();
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let h = thread::spawn(move || {
        let r = sleeper(N, 100, ttx, grx);
        d2.store(true, Ordering::Release);
        r
    });
    let tid = trx.recv().unwrap();
    src.try_track(tid, 0, 0).unwrap();
    let mut lat = Vec::with_capacity(4 * N as usize);
    let mut count = [0u64; 3];
    gtx.send(()).unwrap();
    let c0 = thread_cpu();
    let w0 = mono();
    loop {
        let finished = done.load(Ordering::Acquire);
        src.poll(Duration::from_millis(10), |e| {
            lat.push(mono().saturating_sub(e.ts_ns));
            match e {
                HostEvent {
                    kind: EventKind::SwitchOut { .. },
                    ..
                } => count[0] += 1,
                HostEvent {
                    kind: EventKind::SwitchIn { .. },
                    ..
                } => count[1] += 1,
                HostEvent {
                    kind: EventKind::Waking { .. },
                    ..
                } => count[2] += 1,
                _ => {}
            }
        })
        .unwrap();
        if finished {
            src.consume(|e| {
                lat.push(mono().saturating_sub(e.ts_ns));
            });
            break;
        }
    }
    let cons_cpu = thread_cpu() - c0;
    let wall = mono() - w0;
    let (bpf_wall, bpf_cpu) = h.join().unwrap();
    let n = lat.len() as u64;
    println!("== sleep pipeline: {N} sleeps of 100 us, tracked, consumer in poll()");
    println!(
        "events {n} (out {} in {} waking {}), dropped {}, {:.0} events/s over {:.2} s",
        count[0],
        count[1],
        count[2],
        src.dropped_events(),
        n as f64 / (wall as f64 / 1e9),
        wall as f64 / 1e9
    );
    println!(
        "consumer CPU: {:.1} ms total, {:.0} ns/event (includes wakeup from poll, one per batch)",
        cons_cpu as f64 / 1e6,
        cons_cpu as f64 / n as f64
    );
    println!(
        "delivery latency (kernel ts -> callback): p50 {} us, p99 {} us, max {} us",
        pct(&mut lat, 0.5) / 1000,
        pct(&mut lat, 0.99) / 1000,
        pct(&mut lat, 1.0) / 1000
    );
    println!(
        "traced thread: wall {:.1} ms (no BPF {:.1} ms), CPU {:.1} ms (no BPF {:.1} ms): {:+.0} ns CPU per sleep",
        bpf_wall as f64 / 1e6,
        base_wall as f64 / 1e6,
        bpf_cpu as f64 / 1e6,
        base_cpu as f64 / 1e6,
        (bpf_cpu as f64 - base_cpu as f64) / N as f64
    );
    println!("in-kernel program cost (BPF_ENABLE_STATS, whole machine, all tasks):");
    print_prog_stats(&src);
}

/// Raw capacity: 1M records produced in the kernel (BPF_PROG_TEST_RUN of
/// the kvm_exit filter, tracked thread), then drained by consume().
#[test]
#[ignore]
fn max_throughput() {
    if !root() {
        return;
    }
    const N: u32 = 1_000_000;
    let mut src = BpfSource::load(BpfOptions {
        selftest: true,
        ringbuf_bytes: 64 << 20,
        ..BpfOptions::default()
    })
    .unwrap();
    src.try_track(gettid(), 0, 0).unwrap();
    let stats = enable_run_time_stats().unwrap();
    let w0 = mono();
    for _ in 0..N {
        src.selftest_kvm_exit(12, 1).unwrap();
    }
    let produce = mono() - w0;
    drop(stats);
    let per_run = src
        .prog_stats()
        .iter()
        .find(|p| p.name == "kvm_exit_test")
        .map(|p| p.run_time_ns as f64 / p.run_cnt.max(1) as f64)
        .unwrap_or(0.0);
    src.untrack(gettid());
    let c0 = thread_cpu();
    let w1 = mono();
    let mut n = 0u64;
    let mut sum = 0u64;
    src.consume(|e| {
        n += 1;
        sum = sum.wrapping_add(e.ts_ns);
    });
    let consume_wall = mono() - w1;
    let consume_cpu = thread_cpu() - c0;
    println!("== max throughput: {N} kvm_exit HLT records");
    println!(
        "producer: {per_run:.0} ns/event in the program (filter + ringbuf reserve/submit + stats), {:.0} ns/event wall incl. the test-run syscall",
        produce as f64 / N as f64
    );
    println!(
        "consumer: {n} events, {:.0} ns/event CPU, {:.1} M events/s (one consumer thread), dropped {}",
        consume_cpu as f64 / n as f64,
        n as f64 / (consume_wall as f64 / 1e3),
        src.dropped_events()
    );
    assert_ne!(sum, 1); // keep the loop
}

fn ping_pong(rounds: u32, tids: Option<&mut BpfSource>) -> f64 {
    let (a_tx, a_rx) = mpsc::sync_channel::<u32>(0);
    let (b_tx, b_rx) = mpsc::sync_channel::<u32>(0);
    let (tid_tx, tid_rx) = mpsc::channel();
    let h = thread::spawn(move || {
        tid_tx.send(gettid()).unwrap();
        while let Ok(x) = a_rx.recv() {
            if b_tx.send(x).is_err() {
                break;
            }
        }
    });
    let other = tid_rx.recv().unwrap();
    if let Some(src) = tids {
        src.try_track(other, 0, 0).unwrap();
        src.try_track(gettid(), 0, 1).unwrap();
    }
    let t0 = Instant::now();
    for i in 0..rounds {
        a_tx.send(i).unwrap();
        b_rx.recv().unwrap();
    }
    let per = t0.elapsed().as_nanos() as f64 / rounds as f64;
    drop(a_tx);
    h.join().unwrap();
    per
}

/// What the programs cost every context switch on the host: ping-pong
/// between two threads, without BPF, with BPF tracking other threads, and
/// with both threads tracked (events emitted, nobody consuming until the
/// end; big ring buffer).
#[test]
#[ignore]
fn context_switch_overhead() {
    if !root() {
        return;
    }
    const R: u32 = 100_000;
    let base: Vec<f64> = (0..3).map(|_| ping_pong(R, None)).collect();
    let mut src = BpfSource::load(BpfOptions {
        ringbuf_bytes: 128 << 20,
        ..BpfOptions::default()
    })
    .unwrap();
    let stats = enable_run_time_stats().unwrap();
    let untracked: Vec<f64> = (0..3).map(|_| ping_pong(R, None)).collect();
    let tracked: Vec<f64> = (0..3)
        .map(|_| {
            let r = ping_pong(R, Some(&mut src));
            src.consume(|_| {});
            r
        })
        .collect();
    let emitted = src.emitted_events();
    drop(stats);
    println!("in-kernel program cost during the BPF runs (whole machine):");
    print_prog_stats(&src);
    drop(src);
    let after: Vec<f64> = (0..3).map(|_| ping_pong(R, None)).collect();
    let f = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join("/")
    };
    println!("== context switch overhead: ns per ping-pong round trip (2 wakeups, >= 2 switches), 3 runs each");
    println!("no BPF:                         {}", f(&base));
    println!("BPF loaded, threads untracked:  {}", f(&untracked));
    println!(
        "BPF loaded, threads tracked:    {}   ({emitted} events emitted)",
        f(&tracked)
    );
    println!("no BPF again:                   {}", f(&after));
}

/// Cost of one ProcPollSource poll, per thread.
#[test]
#[ignore]
fn proc_poll_cost() {
    for nthreads in [1usize, 8, 64] {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let hs: Vec<_> = (0..nthreads)
            .map(|_| {
                let stop = stop.clone();
                let tx = tx.clone();
                thread::spawn(move || {
                    tx.send(gettid()).unwrap();
                    while !stop.load(Ordering::Relaxed) {
                        thread::sleep(Duration::from_millis(5));
                    }
                })
            })
            .collect();
        let mut src = ProcPollSource::new(PollOptions::default()).unwrap();
        for i in 0..nthreads {
            src.try_track(rx.recv().unwrap(), 0, i as u32).unwrap();
        }
        let polls = 20_000 / nthreads as u32;
        let mut events = 0usize;
        let c0 = thread_cpu();
        let w0 = mono();
        for _ in 0..polls {
            events += src.sample(|_| {});
        }
        let cpu = thread_cpu() - c0;
        let wall = mono() - w0;
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            h.join().unwrap();
        }
        println!(
            "== proc poll: {nthreads} threads, {polls} polls: {:.2} us CPU per poll, {:.2} us per thread per poll (wall {:.2}), {events} events",
            cpu as f64 / polls as f64 / 1e3,
            cpu as f64 / polls as f64 / nthreads as f64 / 1e3,
            wall as f64 / polls as f64 / nthreads as f64 / 1e3
        );
    }
}
