//! The guest doorbell end to end: a real QEMU guest (TCG) whose region is an
//! `ivshmem-doorbell` device served by the test (`pvsched_vmtest`), the real
//! pvsched.ko ringing it, and the real pvschedd holding the host vector's
//! eventfd (`--doorbell`). With the recheck timer and the scan slowed to one
//! second, only the ring can make the unboost prompt. And a QEMU started by
//! hand on pvschedd's own ivshmem socket, served with no argument at all.

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use pvsched_abi::{F_DOORBELL, POLICY_FIFO};
use pvsched_base::sched::ThreadParams;
use pvsched_host::discovery::threads_by_name;
use pvsched_vmtest::{guest_test, wait_until, GuestImage, ImageConfig, RegionSetup, Vm, VmConfig};
use support::{params, tempdir, Daemon, RtObserver};

mod support;

const SCHED_FIFO: u32 = 1;
/// Default max_rt_priority: a guest FIFO 42 maps to host FIFO 4.
const CAP: u32 = 4;

static VM: OnceLock<Mutex<Vm>> = OnceLock::new();

/// Statics are never dropped: at exit, stop the shared guest (our own QEMU,
/// by PID) and remove its directory.
extern "C" fn stop_shared_guest() {
    if let Some(vm) = VM.get().and_then(|m| m.try_lock().ok()) {
        // SAFETY: SIGKILL to the QEMU process this test binary started.
        unsafe { libc::kill(vm.qemu_pid() as i32, libc::SIGKILL) };
        let _ = std::fs::remove_dir_all(vm.dir());
    }
}

fn boot_doorbell_vm() -> Vm {
    let image = GuestImage::build(&ImageConfig::default())
        .expect("guest image (make test installs the kernel, QEMU and busybox)");
    let vm = Vm::boot(VmConfig::new(image).smp(2).doorbell(true)).expect("boot guest");
    let (rc, out) = vm.insmod("").expect("insmod");
    assert_eq!(rc, 0, "insmod: {out}");
    vm
}

/// One doorbell guest for the tests of this binary (they take its lock).
fn doorbell_vm() -> MutexGuard<'static, Vm> {
    VM.get_or_init(|| {
        let vm = boot_doorbell_vm();
        // SAFETY: registers a plain extern "C" function, run at exit.
        unsafe { libc::atexit(stop_shared_guest) };
        Mutex::new(vm)
    })
    .lock()
    .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Boots the shared guest again if it was lost (`pvsched_vmtest::guest_test!`).
fn replace_lost_guest(panic_text: &str) -> Option<String> {
    let mut vm = doorbell_vm();
    let why = pvsched_vmtest::guest_lost(&vm, panic_text)?;
    *vm = boot_doorbell_vm();
    Some(why)
}

/// pvschedd serving `vm` as "db" with its doorbell, `daemon` added to [daemon].
fn start_daemon(vm: &Vm, name: &str, daemon: &str) -> Daemon {
    let dir = tempdir(name);
    let toml = format!(
        "[daemon]\nstate_file = \"{d}/state.json\"\ncontrol_socket = \"{d}/control.sock\"\n\
         metrics = \"off\"\n{daemon}\n\
         [defaults]\ndemote_after_ns = 1_000_000_000\n[discovery]\nauto = false\n{vm_entry}",
        d = dir.display(),
        vm_entry = support::vm_entry("db", vm.region_path().expect("region"), vm.qmp_socket()),
    );
    let fd = vm.doorbell().expect("doorbell eventfd");
    let d = Daemon::start_with_doorbells(
        std::path::Path::new(env!("CARGO_BIN_EXE_pvschedd")),
        &dir,
        &toml,
        &[("db", fd)],
    );
    d.wait_serving("db", 2);
    d
}

fn guest_rings(vm: &Vm) -> u64 {
    let (_, out) = vm
        .exec(
            "cat /sys/kernel/debug/pvsched/status",
            Duration::from_secs(10),
        )
        .expect("debugfs status");
    out.split_whitespace()
        .filter_map(|w| w.strip_prefix("doorbell_rings="))
        .filter_map(|n| n.parse::<u64>().ok())
        .sum()
}

guest_test! {
fn a_guest_clearing_its_reason_rings_and_is_unboosted_without_the_recheck_timer() {
    let vm = doorbell_vm();
    assert!(vm.doorbell_connected());
    let d = start_daemon(
        &vm,
        "doorbell",
        "recheck_boosted_us = 1_000_000\nscan_interval_us = 1_000_000",
    );
    let header = vm.region().expect("region").header();
    assert_ne!(header.host_features & F_DOORBELL, 0, "{header:?}");
    let threads = threads_by_name(vm.qemu_pid() as i32).expect("vCPU threads");
    let tid = threads.vcpus[1].1;
    // The module counts from its last bind (the daemon's header re-binds it):
    // read the count once the guest is bound to the daemon's generation, or a
    // bind after the read restarts it and the rings look fewer than they were.
    wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
        let h = vm.region()?.header();
        (h.generation != 0 && h.guest_generation == h.generation).then_some(())
    })
    .unwrap_or_else(|| panic!("the guest never bound to the region; log:\n{}", d.log()));
    let rings_before = guest_rings(&vm);

    // Act: a guest task on vCPU 1 alternates 30 ms of FIFO 42 with 30 ms of
    // SCHED_OTHER; time the slot showing SCHED_OTHER -> the host unboosting.
    let cycles = 16;
    let task = vm.spawn(&format!("rttoggle 1 42 30 {cycles}")).unwrap();
    let mut delays = Vec::new();
    let observer = RtObserver::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let at_cap = |p: ThreadParams| p.policy == SCHED_FIFO && p.priority == CAP;
    while delays.len() < cycles - 2 && Instant::now() < deadline {
        if wait_until(
            Duration::from_millis(500),
            Duration::from_micros(100),
            || at_cap(params(tid)).then_some(()),
        )
        .is_none()
        {
            continue;
        }
        let region = vm.region().expect("region");
        let Some(cleared) = wait_until(
            Duration::from_millis(200),
            Duration::from_micros(20),
            || {
                region
                    .read_guest(1)
                    .ok()
                    .filter(|g| g.policy != POLICY_FIFO)
                    .map(|_| Instant::now())
            },
        ) else {
            continue;
        };
        if let Some(done) = wait_until(
            Duration::from_millis(500),
            Duration::from_micros(20),
            || (!at_cap(params(tid))).then(Instant::now),
        ) {
            delays.push(done.saturating_duration_since(cleared));
        }
    }
    drop(observer);
    vm.wait_gone(task.pid, Duration::from_secs(20)).unwrap();
    delays.sort();
    let rings = d.metric("pvsched_doorbell_rings_total");
    let guest = guest_rings(&vm).saturating_sub(rings_before);

    // Assert: the guest rang, the daemon read the rings, and the unboost
    // came with them (the timers alone would take up to a second).
    let us: Vec<u128> = delays.iter().map(|d| d.as_micros()).collect();
    eprintln!("unboost delays with the doorbell (us, sorted): {us:?}; rings: guest {guest}, daemon {rings}");
    assert!(
        delays.len() >= 8,
        "only {} transitions: {us:?}\n{}",
        delays.len(),
        d.log()
    );
    assert!(guest >= delays.len() as u64, "guest rang {guest} times");
    assert!(rings >= 1.0, "the daemon read no ring:\n{}", d.log());
    let median = delays[delays.len() / 2];
    assert!(
        median <= Duration::from_millis(5),
        "median unboost delay {median:?} (the timers run at 1 s): {us:?}"
    );
}
}

guest_test! {
/// A hostile guest writes its Doorbell register in a loop: QEMU signals the
/// host vector's eventfd once per write. The test signals that same eventfd
/// in a loop (faster than a TCG guest could write), and the daemon's event
/// thread (SCHED_FIFO) wakes for it at most once per `doorbell_interval_us`.
fn a_doorbell_rung_in_a_loop_wakes_the_daemon_at_most_once_per_doorbell_interval() {
    let vm = doorbell_vm();
    let interval_ms = 2;
    let d = start_daemon(
        &vm,
        "flood",
        &format!("doorbell_interval_us = {}", interval_ms * 1000),
    );
    let fd = vm.doorbell().expect("doorbell eventfd");
    let wakeups = || d.metric("pvsched_wakeups_total{cause=\"doorbell\"}");
    let (w0, r0) = (wakeups(), d.metric("pvsched_doorbell_rings_total"));

    // Act: 2 s of rings, as fast as this thread can write.
    let t = Instant::now();
    let mut written = 0u64;
    while t.elapsed() < Duration::from_secs(2) {
        for _ in 0..100 {
            pvsched_base::ivshmem::ring(fd).expect("ring");
        }
        written += 100;
    }
    let elapsed = t.elapsed();
    std::thread::sleep(Duration::from_millis(50));
    let (woke, rings) = (
        wakeups() - w0,
        d.metric("pvsched_doorbell_rings_total") - r0,
    );

    // Assert: every ring read, few wakeups.
    eprintln!("{written} rings written, {rings} read, {woke} wakeups in {elapsed:?}");
    let bound = (elapsed.as_secs_f64() + 0.05) * 1000.0 / interval_ms as f64 + 2.0;
    assert!(woke >= 1.0, "the rings never woke the daemon:\n{}", d.log());
    assert!(
        woke <= bound,
        "{woke} doorbell wakeups in {elapsed:?} (bound {bound})"
    );
    assert!(
        rings >= 10.0 * woke,
        "{rings} rings read for {woke} wakeups"
    );
}
}

/// A QEMU started by hand with its `ivshmem-doorbell` device on pvschedd's
/// socket (`-chardev socket,path=.../ivshmem.sock`) is served with the
/// doorbell through pvschedd's own ivshmem server: no region file, no
/// `[[vm]]` entry, no QMP, no `--doorbell`. The real module binds to the
/// region pvschedd handed QEMU, and its rings reach pvschedd, and a
/// restarted pvschedd, which takes the doorbell back from QEMU.
#[test]
fn a_hand_started_qemu_on_pvschedds_socket_is_served_with_the_doorbell() {
    let dir = tempdir("doorbell-socket");
    let config = "recheck_boosted_us = 1_000_000\nscan_interval_us = 1_000_000\n\
                  discovery_interval_ms = 200\n[defaults]\ndemote_after_ns = 1_000_000_000\n\
                  [discovery]\nauto = false\n";
    let mut d = Daemon::start(&dir, config);
    let image = GuestImage::build(&ImageConfig::default())
        .expect("guest image (make test installs the kernel, QEMU and busybox)");
    let mut cfg = VmConfig::new(image).smp(2);
    cfg.region = RegionSetup::IvshmemServer(dir.join("ivshmem.sock"));
    let vm = Vm::boot(cfg).expect("boot a guest on pvschedd's ivshmem socket");
    let (rc, out) = vm.insmod("").expect("insmod");
    assert_eq!(rc, 0, "insmod: {out}");

    d.wait_serving(vm.name(), 2);
    let bound = wait_until(Duration::from_secs(20), Duration::from_millis(100), || {
        d.status()
            .vms
            .into_iter()
            .find(|v| v.name == vm.name() && v.guest_bound)
    })
    .unwrap_or_else(|| panic!("the guest never bound to the region; log:\n{}", d.log()));
    assert!(bound.doorbell, "{bound:?}");
    assert_eq!(bound.tgid, vm.qemu_pid() as i32);
    let rings_before = guest_rings(&vm);

    // Act: a guest task on vCPU 1 alternates FIFO 42 and SCHED_OTHER.
    let task = vm.spawn("rttoggle 1 42 30 8").unwrap();
    vm.wait_gone(task.pid, Duration::from_secs(30)).unwrap();

    // Assert: the guest rang the doorbell pvschedd served, and pvschedd
    // read the rings from the eventfd it handed QEMU.
    let guest = guest_rings(&vm).saturating_sub(rings_before);
    let rings = d.metric("pvsched_doorbell_rings_total");
    eprintln!("rings: guest {guest}, daemon {rings}");
    assert!(guest >= 1, "the guest never rang");
    assert!(rings >= 1.0, "the daemon read no ring:\n{}", d.log());

    // pvschedd restarts under the running guest: QEMU cannot reconnect, the
    // new pvschedd takes the doorbell back from it and reads its rings.
    assert!(d.signal(libc::SIGTERM).success());
    let again = Daemon::start(&dir, config);
    again.wait_serving(vm.name(), 2);
    let served = again.status().vms.into_iter().find(|v| v.name == vm.name());
    assert!(
        served
            .as_ref()
            .is_some_and(|v| v.doorbell && v.tgid == vm.qemu_pid() as i32),
        "{served:?}\n{}",
        again.log()
    );
    let task = vm.spawn("rttoggle 1 42 30 8").unwrap();
    vm.wait_gone(task.pid, Duration::from_secs(30)).unwrap();
    let rings = again.metric("pvsched_doorbell_rings_total");
    assert!(
        rings >= 1.0,
        "the restarted daemon read no ring:\n{}",
        again.log()
    );
}
