//! End to end on a real QEMU guest (TCG here) with the real pvsched.ko and the
//! real pvschedd: guest scheduling state in, host sched_setattr out, checked
//! with sched_getattr from outside the daemon.
//!
//! One VM is booted per test binary and shared (tests take a lock); each test
//! starts its own daemon.

use std::path::Path;
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use pvsched_abi::{GuestHalf, POLICY_FIFO};
use pvsched_base::sched::ThreadParams;
use pvsched_control::{ApplyTarget, Request, Response};
use pvsched_host::discovery::threads_by_name;
use pvsched_host::statefile::StateFile;
use pvsched_vmtest::{guest_test, wait_until, GuestImage, ImageConfig, Vm, VmConfig};
use support::{params, tempdir, Daemon, RtObserver};

mod support;

const SCHED_OTHER: u32 = 0;
const SCHED_FIFO: u32 = 1;
/// Default max_rt_priority: a guest FIFO 42 maps to host FIFO 4.
const CAP: u32 = 4;

struct Fixture {
    vm: Vm,
    image: GuestImage,
}

fn image() -> GuestImage {
    // rttoggle comes with vmtest's guest programs.
    GuestImage::build(&ImageConfig::default())
        .expect("guest image (make test installs the kernel, QEMU and busybox)")
}

fn boot(image: &GuestImage) -> Vm {
    let vm = Vm::boot(VmConfig::new(image.clone()).smp(2)).expect("boot guest");
    let (rc, out) = vm.insmod("").expect("insmod");
    assert_eq!(rc, 0, "insmod: {out}");
    vm
}

static FIXTURE: OnceLock<Mutex<Fixture>> = OnceLock::new();

/// Boots the shared guest again if it was lost (`pvsched_vmtest::guest_test!`).
fn replace_lost_guest(panic_text: &str) -> Option<String> {
    let mut f = fixture();
    let why = pvsched_vmtest::guest_lost(&f.vm, panic_text)?;
    f.vm = boot(&f.image);
    Some(why)
}

/// Statics are never dropped: at exit, stop the shared guest (our own QEMU, by
/// PID) and remove its directory.
extern "C" fn stop_shared_guest() {
    if let Some(f) = FIXTURE.get().and_then(|m| m.try_lock().ok()) {
        // SAFETY: SIGKILL to the QEMU process this test binary started.
        unsafe { libc::kill(f.vm.qemu_pid() as i32, libc::SIGKILL) };
        let _ = std::fs::remove_dir_all(f.vm.dir());
    }
}

fn fixture() -> MutexGuard<'static, Fixture> {
    FIXTURE
        .get_or_init(|| {
            let image = image();
            let vm = boot(&image);
            // SAFETY: registers a plain extern "C" function, run at exit.
            unsafe { libc::atexit(stop_shared_guest) };
            Mutex::new(Fixture { vm, image })
        })
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The `[[vm]]` entries that serve `vms` by their regions and QMP sockets.
fn vm_entries(vms: &[(&str, &Vm)]) -> String {
    let mut toml = String::from("[discovery]\nauto = false\n");
    for (name, vm) in vms {
        toml += &support::vm_entry(name, vm.region_path().expect("region"), vm.qmp_socket());
    }
    toml
}

/// A pvschedd in a fresh directory serving `vms`, with demotion out of the
/// way: these tests watch a boost at the cap (the guest's FIFO 42 mapped to
/// 4) from its start to its end or throttle, and a burst past
/// `demote_after_ns` (4 ms) would leave the cap for priority 1 until repaid.
/// Demotion has tests of its own (crates/policy/tests/behaviour.rs) and the
/// rogue-guest benchmark.
fn start_daemon(name: &str, vms: &[(&str, &Vm)]) -> Daemon {
    let toml = format!(
        "[defaults]\ndemote_after_ns = 1_000_000_000\n{}",
        vm_entries(vms)
    );
    Daemon::start(&tempdir(name), &toml)
}

fn vcpu_tid(vm: &Vm, vcpu: u32) -> i32 {
    let threads = threads_by_name(vm.qemu_pid() as i32).expect("vCPU threads");
    threads.vcpus[vcpu as usize].1
}

/// Time thread `tid` has been on a CPU or waiting for one (runnable), from
/// /proc/<tid>/schedstat (run time + run-queue delay).
/// A thread's time on a CPU and time waiting for one, from its schedstat.
fn run_and_wait(tid: i32) -> (Duration, Duration) {
    let text = std::fs::read_to_string(format!("/proc/{tid}/schedstat")).expect("schedstat");
    let mut f = text
        .split_whitespace()
        .map(|v| v.parse::<u64>().expect("schedstat field"));
    let (run, delay) = (f.next().expect("run time"), f.next().expect("run delay"));
    (Duration::from_nanos(run), Duration::from_nanos(delay))
}

/// A consistent copy of a guest half. The guest may be mid-update, or its vCPU
/// preempted mid-update (by this RT observer, even): sleep between tries.
fn slot(vm: &Vm, vcpu: u32) -> GuestHalf {
    let region = vm.region().expect("region");
    for _ in 0..10_000 {
        if let Ok(g) = region.read_guest(vcpu) {
            return g;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    panic!("slot {vcpu} never read consistently");
}

fn wait_for<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    wait_until(timeout, Duration::from_micros(200), &mut probe)
        .unwrap_or_else(|| panic!("timed out: {what}"))
}

/// Starts pvschedd in `dir` with `config` (serving VM "e2e", 2 vCPUs), waits
/// until vCPU thread `tid` is `boosted`, kills the daemon with SIGKILL, then
/// ends the guest's RT work (`task` and any rtspin); returns the daemon's pid
/// and the thread's parameters right after.
fn kill_9_while_boosted(
    dir: &Path,
    config: &str,
    vm: &Vm,
    task: &pvsched_vmtest::GuestProcess,
    tid: i32,
    boosted: impl Fn(&ThreadParams) -> bool,
) -> (i32, ThreadParams) {
    let mut d = Daemon::start(dir, config);
    d.wait_serving("e2e", 2);
    wait_for("boosted again", Duration::from_secs(10), || {
        boosted(&params(tid)).then_some(())
    });
    let pid = d.pid();
    d.signal(libc::SIGKILL);
    vm.exec_ok(
        &format!("kill {}; killall rtspin; true", task.pid),
        Duration::from_secs(10),
    )
    .unwrap();
    (pid, params(tid))
}

/// The output of a guest process started with `Vm::spawn`, for failure messages.
fn guest_log(vm: &Vm, task: &pvsched_vmtest::GuestProcess) -> String {
    vm.exec(&format!("cat {}", task.log), Duration::from_secs(10))
        .map(|(_, out)| out)
        .unwrap_or_default()
}

guest_test! {
fn guest_fifo_task_boosts_its_vcpu_thread_and_its_exit_unboosts_it() {
    let f = fixture();
    let d = start_daemon("boost", &[("e2e", &f.vm)]);
    d.wait_serving("e2e", 2);
    let tid = vcpu_tid(&f.vm, 1);
    // Unboosted between its wakeups' proactive boosts (SCHED_RR, 1 ms each).
    wait_for(
        "vCPU 1 thread at SCHED_OTHER",
        Duration::from_secs(2),
        || (params(tid).policy == SCHED_OTHER).then_some(()),
    );

    let task = f.vm.spawn("rtspin -c 1 -P fifo -p 42 -t 0.2 -s 0").unwrap();
    let observer = RtObserver::new();
    let guest_rt = wait_until(Duration::from_secs(10), Duration::from_micros(100), || {
        let s = slot(&f.vm, 1);
        (s.policy == POLICY_FIFO && s.rt_priority == 42).then(Instant::now)
    })
    .unwrap_or_else(|| {
        panic!(
            "slot 1 never showed FIFO 42: {:?}; guest: {}",
            slot(&f.vm, 1),
            guest_log(&f.vm, &task)
        )
    });
    let boosted = wait_for("vCPU 1 thread at FIFO 4", Duration::from_secs(2), || {
        let p = params(tid);
        (p.policy == SCHED_FIFO && p.priority == CAP).then(Instant::now)
    });
    let delay = boosted.saturating_duration_since(guest_rt);
    drop(observer);
    f.vm.wait_gone(task.pid, Duration::from_secs(20)).unwrap();
    wait_for(
        "vCPU 1 thread back to SCHED_OTHER",
        Duration::from_secs(1),
        || (params(tid).policy == SCHED_OTHER).then_some(()),
    );

    eprintln!("guest FIFO 42 seen in the slot -> host FIFO {CAP}: {delay:?}");
    assert!(delay < Duration::from_millis(50), "boost took {delay:?}");
    assert_ne!(slot(&f.vm, 1).policy, POLICY_FIFO);
}
}

guest_test! {
fn a_guest_rt_task_spinning_5s_is_throttled_and_counted() {
    let f = fixture();
    let d = start_daemon("throttle", &[("e2e", &f.vm)]);
    d.wait_serving("e2e", 2);
    let tid = vcpu_tid(&f.vm, 1);

    let task = f.vm.spawn("rtspin -c 1 -P fifo -p 42 -t 5 -s 0").unwrap();
    wait_for("slot 1 shows FIFO 42", Duration::from_secs(10), || {
        (slot(&f.vm, 1).policy == POLICY_FIFO).then_some(())
    });
    // Sample the thread's policy while the guest task spins. max_boost bounds
    // a boost's net burst: time on a CPU minus time blocked (the vCPU thread
    // blocks on QEMU's lock, or halts); time waiting for a CPU counts neither
    // way. A FIFO run is measured the same way, from the thread's schedstat.
    let observer = RtObserver::new();
    let start = Instant::now();
    // The unboost happened somewhere between the last sample that saw FIFO
    // and the first that did not: the thread may have run unboosted for all
    // of that gap (a late sample on a busy machine), so the gap is not
    // counted against the boost.
    let (mut rt_runs, mut longest, mut run_start, mut throttled_seen) =
        (0, Duration::ZERO, None, false);
    let mut last_fifo_sample = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        let p = params(tid);
        let sampled = Instant::now();
        let guest_rt = slot(&f.vm, 1).policy == POLICY_FIFO;
        match (p.policy == SCHED_FIFO, run_start) {
            (true, None) => {
                run_start = Some((sampled, run_and_wait(tid)));
                rt_runs += 1;
            }
            (false, Some((wall, (run0, wait0)))) => {
                let gap = sampled.saturating_duration_since(last_fifo_sample);
                let wall = wall.elapsed();
                let (run1, wait1) = run_and_wait(tid);
                let (ran, waited) = (run1.saturating_sub(run0), wait1.saturating_sub(wait0));
                let blocked = wall.saturating_sub(ran + waited);
                longest = longest.max(ran.saturating_sub(blocked).saturating_sub(gap));
                run_start = None;
                throttled_seen |= guest_rt;
            }
            _ => {}
        }
        if p.policy == SCHED_FIFO {
            last_fifo_sample = sampled;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    drop(observer);
    let throttles = match d.request(&Request::Status, Duration::from_secs(5)) {
        Response::Status(s) => s.vms[0].throttles,
        other => panic!("{other:?}"),
    };
    let metrics = match d.request(&Request::Metrics, Duration::from_secs(5)) {
        Response::Metrics { text } => text,
        other => panic!("{other:?}"),
    };
    f.vm.wait_gone(task.pid, Duration::from_secs(20)).unwrap();

    eprintln!("boosted runs {rt_runs}, largest net burst {longest:?}, throttles {throttles}");
    assert!(
        throttled_seen,
        "never unboosted while the guest still asked"
    );
    assert!(rt_runs >= 2, "boost never came back after a throttle");
    // max_boost 50 ms, plus reaction slack (measured: 50.0-50.1).
    assert!(
        longest < Duration::from_millis(60),
        "a boosted run's net burst was {longest:?}"
    );
    assert!(throttles >= 2, "status counts {throttles} throttles");
    let line = metrics
        .lines()
        .find(|l| l.starts_with("pvsched_throttles_total{vm=\"e2e\"}"))
        .unwrap_or_else(|| panic!("no throttle metric in:\n{metrics}"));
    let counted: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(counted >= 2.0, "{line}");
}
}

guest_test! {
fn unboost_follows_the_guest_clearing_its_reason_within_2ms() {
    let f = fixture();
    // No demotion (start_daemon): the boost stays at the cap through the
    // 30 ms RT phase until the guest clears its reason, so leaving the cap
    // is the unboost.
    let d = start_daemon("unboost", &[("e2e", &f.vm)]);
    d.wait_serving("e2e", 2);
    let tid = vcpu_tid(&f.vm, 1);

    let cycles = 20;
    let task = f.vm.spawn(&format!("rttoggle 1 42 30 {cycles}")).unwrap();
    let mut delays = Vec::new();
    let observer = RtObserver::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while delays.len() < cycles - 2 && Instant::now() < deadline {
        // Wait for the guest task's boost (FIFO at the cap), then time the guest clearing
        // its RT policy -> the host leaving that boost. Another, shorter boost with a reason
        // of its own (a proactive RR boost on a host wakeup) may follow: not this one.
        let at_cap = |p: ThreadParams| p.policy == SCHED_FIFO && p.priority == CAP;
        if wait_until(
            Duration::from_millis(500),
            Duration::from_micros(100),
            || at_cap(params(tid)).then_some(()),
        )
        .is_none()
        {
            continue;
        }
        let Some(cleared) = wait_until(
            Duration::from_millis(200),
            Duration::from_micros(20),
            || (slot(&f.vm, 1).policy != POLICY_FIFO).then(Instant::now),
        ) else {
            continue;
        };
        if let Some(done) = wait_until(
            Duration::from_millis(100),
            Duration::from_micros(20),
            || (!at_cap(params(tid))).then(Instant::now),
        ) {
            delays.push(done.saturating_duration_since(cleared));
        }
    }
    drop(observer);
    f.vm.wait_gone(task.pid, Duration::from_secs(20)).unwrap();
    delays.sort();

    let us: Vec<u128> = delays.iter().map(|d| d.as_micros()).collect();
    eprintln!("unboost delays (us, sorted): {us:?}");
    assert!(
        delays.len() >= 10,
        "only {} transitions observed",
        delays.len()
    );
    let median = delays[delays.len() / 2];
    assert!(
        median <= Duration::from_millis(2),
        "median unboost delay {median:?}"
    );
}
}

guest_test! {
fn sigterm_restores_at_once_and_a_restart_after_kill_9_restores_what_was_left() {
    let f = fixture();
    let dir = tempdir("crash");
    let tid = vcpu_tid(&f.vm, 1);
    let spin = "rtspin -c 1 -P fifo -p 42 -t 0.04 -s 0";

    // SIGTERM while boosted: restored by the time the daemon has exited.
    let mut d = Daemon::start(&dir, &vm_entries(&[("e2e", &f.vm)]));
    d.wait_serving("e2e", 2);
    let task = f.vm.spawn(&format!("while true; do {spin}; done")).unwrap();
    wait_for("boosted", Duration::from_secs(10), || {
        (params(tid).policy == SCHED_FIFO).then_some(())
    });
    let status = d.signal(libc::SIGTERM);
    let after_term = params(tid);
    assert!(status.success(), "pvschedd exit {status:?}\n{}", d.log());
    assert_eq!(after_term.policy, SCHED_OTHER, "SIGTERM left {after_term}");

    // kill -9 while boosted leaves the thread boosted...
    let (pid, left) = kill_9_while_boosted(
        &dir,
        &vm_entries(&[("e2e", &f.vm)]),
        &f.vm,
        &task,
        tid,
        |p| p.policy == SCHED_FIFO,
    );
    assert_eq!(
        left.policy, SCHED_FIFO,
        "kill -9 of {pid} should leave the boost in place"
    );

    // ...and a new start with no VM configured restores it from the state file.
    let restart = Instant::now();
    let mut empty = Daemon::start(&dir, &vm_entries(&[]));
    wait_for("restored by the successor", Duration::from_secs(1), || {
        (params(tid).policy == SCHED_OTHER).then_some(())
    });
    eprintln!("restored {:?} after the restart", restart.elapsed());
    wait_for(
        "the successor logs the restore",
        Duration::from_secs(2),
        || empty.log().contains("restored thread").then_some(()),
    );
    empty.signal(libc::SIGTERM);
}
}

guest_test! {
fn a_vm_killed_while_served_is_dropped_and_the_others_are_still_served() {
    let f = fixture();
    let other = boot(&f.image);
    let mut d = start_daemon("gone", &[("e2e", &f.vm), ("doomed", &other)]);
    d.wait_serving("e2e", 2);
    d.wait_serving("doomed", 2);

    drop(other); // kills its QEMU
    wait_for("doomed dropped", Duration::from_secs(10), || {
        (!d.status().vms.iter().any(|v| v.name == "doomed")).then_some(())
    });
    let tid = vcpu_tid(&f.vm, 1);
    let task = f.vm.spawn("rtspin -c 1 -P fifo -p 42 -t 0.2 -s 0").unwrap();
    wait_for("e2e still boosted", Duration::from_secs(10), || {
        (params(tid).policy == SCHED_FIFO).then_some(())
    });
    f.vm.wait_gone(task.pid, Duration::from_secs(20)).unwrap();
    let log = d.log();
    d.signal(libc::SIGTERM);

    assert!(log.contains("VM gone") && log.contains("doomed"), "{log}");
}
}

guest_test! {
fn record_writes_a_perfetto_trace_with_a_track_per_vcpu_and_boost_slices() {
    let f = fixture();
    let d = start_daemon("record", &[("e2e", &f.vm)]);
    d.wait_serving("e2e", 2);
    let out = d.dir.join("trace.json");

    let task =
        f.vm.spawn("sleep 0.5; rtspin -c 1 -P fifo -p 42 -t 0.2 -s 0")
            .unwrap();
    // Built beside pvschedd by `cargo build --bins` (make test does it first).
    let pvschedctl = Path::new(env!("CARGO_BIN_EXE_pvschedd")).with_file_name("pvschedctl");
    assert!(
        pvschedctl.exists(),
        "{} missing: run `cargo build --workspace --bins` first",
        pvschedctl.display()
    );
    let ctl = Command::new(&pvschedctl)
        .arg("--socket")
        .arg(d.socket())
        .args(["record", "--seconds", "2", "--out"])
        .arg(&out)
        .output();
    f.vm.wait_gone(task.pid, Duration::from_secs(20)).unwrap();
    let ctl = ctl.expect("run pvschedctl (cargo builds it with the workspace)");
    assert!(
        ctl.status.success(),
        "pvschedctl: {}",
        String::from_utf8_lossy(&ctl.stderr)
    );
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).unwrap()).expect("valid JSON");
    let events = trace["traceEvents"].as_array().expect("traceEvents");

    let tracks: Vec<_> = events
        .iter()
        .filter(|e| {
            e["name"] == "thread_name"
                && e["args"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("vCPU ") && n.contains("(tid"))
        })
        .collect();
    assert_eq!(tracks.len(), 2, "one track per vCPU");
    let vcpu1 = i64::from(vcpu_tid(&f.vm, 1));
    assert!(
        events.iter().any(|e| e["ph"] == "X"
            && e["name"].as_str().is_some_and(|n| n.starts_with("boost"))
            && e["tid"].as_i64().is_some_and(|t| t % 10_000_000 == vcpu1)),
        "no boost slice for vCPU 1"
    );
    assert!(events
        .iter()
        .any(|e| e["ph"] == "X" && e["tid"].as_i64() == Some(vcpu1) && e["name"] == "running"));
}
}

guest_test! {
fn idle_shows_measured_halts_and_a_recommendation_for_a_tcg_guest() {
    let f = fixture();
    let d = start_daemon("idle", &[("e2e", &f.vm)]);
    d.wait_serving("e2e", 2);
    // Short sleeps on every vCPU: halts of about 2 ms, each ended by a wakeup.
    let task = f
        .vm
        .spawn("for i in $(seq 150); do sleep 0.002; done & taskset -c 1 sh -c 'for i in $(seq 150); do sleep 0.002; done'; wait")
        .unwrap();
    f.vm.wait_gone(task.pid, Duration::from_secs(30)).unwrap();

    let report = match d.request(
        &Request::Idle {
            vm: None,
            budget_permille: 50,
        },
        Duration::from_secs(5),
    ) {
        Response::Idle(r) => r,
        other => panic!("{other:?}"),
    };
    let pvschedctl = Path::new(env!("CARGO_BIN_EXE_pvschedd")).with_file_name("pvschedctl");
    let ctl = Command::new(&pvschedctl)
        .arg("--socket")
        .arg(d.socket())
        .args(["idle", "--budget-permille", "50"])
        .output()
        .expect("run pvschedctl (cargo builds it with the workspace)");
    let text = String::from_utf8_lossy(&ctl.stdout);
    eprintln!("pvschedctl idle:\n{text}");
    // The metrics take what the meters recorded at the daemon's next scan.
    let halts_exported = || {
        let metrics = match d.request(&Request::Metrics, Duration::from_secs(5)) {
            Response::Metrics { text } => text,
            other => panic!("{other:?}"),
        };
        metrics
            .lines()
            .find(|l| l.starts_with("pvsched_vcpu_halt_seconds_count{vm=\"e2e\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0)
    };

    let vm = &report.vms[0];
    assert_eq!((vm.name.as_str(), vm.accel.as_str()), ("e2e", "tcg"));
    for v in &vm.vcpus {
        let halts: u64 = v.halts.iter().map(|b| b.1).sum();
        let wakes: u64 = v.wakes.iter().map(|b| b.1).sum();
        assert!(halts >= 50, "vCPU {}: {halts} halts measured", v.index);
        assert!(wakes >= 50, "vCPU {}: {wakes} wakeups measured", v.index);
        assert!(v.observed_s > 0.5, "vCPU {}: {} s", v.index, v.observed_s);
        assert!(v.advice.cpu_share <= 0.05, "over budget: {:?}", v.advice);
        assert!((0.0..=1.0).contains(&v.advice.hit_rate));
        assert!(v.in_force.is_none(), "TCG vCPU threads do not halt-poll");
    }
    assert!(
        ctl.status.success(),
        "pvschedctl: {}",
        String::from_utf8_lossy(&ctl.stderr)
    );
    assert!(text.contains("VM e2e (tcg)"), "{text}");
    assert!(text.contains("halt -> wake ("), "{text}");
    assert!(
        text.contains("recommended (budget 5.0 % of a core): window"),
        "{text}"
    );
    wait_for("halts in the metrics", Duration::from_secs(5), || {
        (halts_exported() >= 100.0).then_some(())
    });

    let bad = d.request(
        &Request::Idle {
            vm: Some("nope".into()),
            budget_permille: 50,
        },
        Duration::from_secs(5),
    );
    assert!(
        matches!(bad, Response::Error { ref message } if message.contains("no VM named")),
        "{bad:?}"
    );
}
}

fn idle_apply(d: &Daemon, target: ApplyTarget) -> Response {
    d.idle_apply(target)
}

/// The halts the advisor needs: short sleeps on both vCPUs.
fn sleep_on_both_vcpus(vm: &Vm) {
    let task = vm
        .spawn("for i in $(seq 100); do sleep 0.002; done & taskset -c 1 sh -c 'for i in $(seq 100); do sleep 0.002; done'; wait")
        .unwrap();
    vm.wait_gone(task.pid, Duration::from_secs(30)).unwrap();
}

guest_test! {
/// `--apply host` against a parameter directory of real files standing in for
/// /sys/module/kvm/parameters (read-only on this host, see the second test): the
/// cap becomes the advice, and SIGTERM, `--apply restore` and a start after
/// kill -9 each put back what was found.
fn applying_the_advice_sets_kvm_halt_polling_and_every_exit_puts_it_back() {
    use pvsched_base::kvm_params::{read_halt_poll_from, write_halt_poll_to, HaltPoll};
    let f = fixture();
    let dir = tempdir("apply");
    let params = dir.join("kvm-parameters");
    std::fs::create_dir_all(&params).unwrap();
    // This host's values, with a cap the advice cannot equal (not a bucket bound).
    let host = pvsched_base::kvm_params::read_halt_poll()
        .unwrap()
        .unwrap_or(HaltPoll {
            halt_poll_ns: 200_000,
            grow: 2,
            grow_start_ns: 10_000,
            shrink: 0,
        });
    let start = HaltPoll {
        halt_poll_ns: 123_457,
        ..host
    };
    write_halt_poll_to(&params, &start).unwrap();
    let now = || read_halt_poll_from(&params).unwrap().unwrap();
    let toml = format!(
        "kvm_params_dir = {:?}\n{}",
        params.display().to_string(),
        vm_entries(&[("e2e", &f.vm)])
    );

    // --apply host: the cap becomes the host-wide advice; SIGTERM puts it back.
    let mut d = Daemon::start(&dir, &toml);
    d.wait_serving("e2e", 2);
    sleep_on_both_vcpus(&f.vm);
    let report = match idle_apply(&d, ApplyTarget::Host) {
        Response::Idle(r) => r,
        other => panic!("{other:?}\n{}", d.log()),
    };
    let applied = report.applied.expect("applied");
    let advised_ns = (report.host_advice.expect("host advice").window_us * 1e3).round() as u64;
    assert_eq!(applied.before, start);
    assert_eq!(applied.after.halt_poll_ns, advised_ns);
    assert_eq!(now(), applied.after);
    let per_vm = idle_apply(&d, ApplyTarget::Vm);
    assert!(
        matches!(&per_vm, Response::Error { message } if message.contains("TCG")),
        "{per_vm:?}"
    );
    assert!(d.signal(libc::SIGTERM).success(), "{}", d.log());
    assert_eq!(now(), start, "SIGTERM left the cap changed");
    assert!(!d.state_file().exists());

    // --apply restore puts it back at once.
    let mut d = Daemon::start(&dir, &toml);
    d.wait_serving("e2e", 2);
    sleep_on_both_vcpus(&f.vm);
    assert!(matches!(
        idle_apply(&d, ApplyTarget::Host),
        Response::Idle(_)
    ));
    assert_ne!(now(), start);
    assert!(matches!(
        idle_apply(&d, ApplyTarget::Restore),
        Response::Idle(_)
    ));
    assert_eq!(now(), start, "--apply restore");
    d.signal(libc::SIGTERM);

    // kill -9 after --apply host leaves it set, and the next start puts it back.
    let mut d = Daemon::start(&dir, &toml);
    d.wait_serving("e2e", 2);
    sleep_on_both_vcpus(&f.vm);
    assert!(matches!(
        idle_apply(&d, ApplyTarget::Host),
        Response::Idle(_)
    ));
    d.signal(libc::SIGKILL);
    assert_ne!(now(), start, "kill -9 cannot put anything back");
    let state = StateFile::load(&d.state_file())
        .unwrap()
        .expect("state file");
    assert_eq!(state.kvm_halt_poll.map(|k| k.params), Some(start));
    let mut successor = Daemon::start(&dir, "[discovery]\nauto = false\n");
    wait_for(
        "the successor puts the cap back",
        Duration::from_secs(5),
        || (now() == start).then_some(()),
    );
    successor.signal(libc::SIGTERM);
    assert!(!successor.state_file().exists());
}
}

guest_test! {
/// The real /sys/module/kvm/parameters: applied and put back where the kernel
/// lets root write it; refused with a message naming the file where it is
/// read-only (this machine's kernel exports them 0444), and nothing recorded.
fn applying_to_the_real_kvm_module_works_or_says_why_not() {
    let f = fixture();
    let Some(before) = pvsched_base::kvm_params::read_halt_poll().unwrap() else {
        panic!("the kvm module is loaded on this host (ENVIRONMENT.md)");
    };
    let writable = std::fs::OpenOptions::new()
        .write(true)
        .open(Path::new(pvsched_base::kvm_params::DEFAULT_DIR).join("halt_poll_ns"))
        .is_ok();
    let mut d = start_daemon("apply-real", &[("e2e", &f.vm)]);
    d.wait_serving("e2e", 2);
    sleep_on_both_vcpus(&f.vm);

    let r = idle_apply(&d, ApplyTarget::Host);

    if writable {
        assert!(matches!(r, Response::Idle(_)), "{r:?}");
    } else {
        assert!(
            matches!(&r, Response::Error { message }
                if message.contains("/sys/module/kvm/parameters/halt_poll_ns") && message.contains("read-only")),
            "{r:?}"
        );
    }
    assert!(d.signal(libc::SIGTERM).success(), "{}", d.log());
    assert_eq!(
        pvsched_base::kvm_params::read_halt_poll().unwrap(),
        Some(before)
    );
    assert!(!d.state_file().exists());
}
}

guest_test! {
fn a_boost_in_the_fair_class_is_nice_minus_20_with_a_short_slice_and_every_exit_puts_it_back() {
    let f = fixture();
    let dir = tempdir("fair");
    let tid = vcpu_tid(&f.vm, 1);
    let original = params(tid);
    let toml = format!(
        // Daemon::start opens [daemon]: this key goes into it.
        "fair_boost_reasons = [\"guest_rt\"]\n\
         [defaults]\ndemote_after_ns = 1_000_000_000\n{}",
        vm_entries(&[("e2e", &f.vm)])
    );
    let in_fair_boost = |p: &ThreadParams| p.policy == SCHED_OTHER && p.nice == -20;
    let spin = "rtspin -c 1 -P fifo -p 42 -t 0.04 -s 0";
    let task = f.vm.spawn(&format!("while true; do {spin}; done")).unwrap();

    // The guest's FIFO task boosts its vCPU in the fair class; SIGTERM puts it back.
    let mut d = Daemon::start(&dir, &toml);
    d.wait_serving("e2e", 2);
    let boosted = wait_for("vCPU 1 at nice -20", Duration::from_secs(10), || {
        let p = params(tid);
        in_fair_boost(&p).then_some(p)
    });
    let status = d.signal(libc::SIGTERM);
    let after_term = params(tid);
    assert!(status.success(), "pvschedd exit {status:?}\n{}", d.log());

    // kill -9 while boosted leaves it; a successor with no VM restores it.
    let (_, left) = kill_9_while_boosted(&dir, &toml, &f.vm, &task, tid, in_fair_boost);
    let mut empty = Daemon::start(&dir, &vm_entries(&[]));
    let restored = wait_for("restored by the successor", Duration::from_secs(1), || {
        let p = params(tid);
        (p.policy == SCHED_OTHER && p.nice == original.nice).then_some(p)
    });
    empty.signal(libc::SIGTERM);

    assert_eq!(boosted.flags & 1, 1, "reset-on-fork: {boosted:?}");
    if pvsched_base::sched::fair_slices_supported() {
        assert_eq!(boosted.runtime, 100_000, "the 100 µs slice: {boosted:?}");
    }
    assert_eq!(
        (after_term.policy, after_term.nice, after_term.flags),
        (original.policy, original.nice, original.flags),
        "SIGTERM left {after_term:?}"
    );
    assert!(
        in_fair_boost(&left),
        "kill -9 should leave the boost: {left:?}"
    );
    assert_eq!(restored.flags, original.flags);
}
}
