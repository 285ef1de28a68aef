//! End-to-end checks of the guest module (guest/pvsched.ko) in a QEMU guest,
//! asserted from the host by reading the region file.
//!
//! Three guests at most: "live" (a bound module, shared by the checks that
//! read slots; each check leaves the module loaded), "scratch" (headers the
//! module must refuse, and a region with fewer slots than CPUs; each check
//! rewrites the header and unloads the module at the end), and one that is
//! powered off. A missing QEMU, kernel or busybox FAILS these tests with what
//! to install; they never skip. A test whose guest the emulation lost (a
//! reply stopped mid-way, no fault in the guest's kernel log) runs again on a
//! fresh guest, once, and says so (`guest_test!`, README "Lost guests").

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard, Once, OnceLock};
use std::time::{Duration, Instant};

use pvsched_abi as abi;
use pvsched_abi::{GuestHalf, Header, HostHalf, Region};
use pvsched_base::region_file::RegionFile;
use pvsched_vmtest::{
    guest_test, wait_until, workspace_root, GuestImage, RegionSetup, Vm, VmConfig,
};

/// Timeout of a guest command, and of waiting for something to show in a slot.
/// Generous: on a 2-core host loaded by other builds a TCG guest can run ten
/// times slower than usual; a passing run never waits for them.
/// What a TCG guest's module accepts of `F_ALL`: all but the extension
/// notice, whose yield is a KVM hypercall (the module looks for KVM's CPUID
/// signature; `e2e_kvm` tests it under KVM).
const F_ALL_BUT_KVM: u64 = abi::F_ALL & !abi::F_EXT_NOTICE;

const T: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(5);

fn image() -> GuestImage {
    static IMAGE: OnceLock<Result<GuestImage, String>> = OnceLock::new();
    IMAGE
        .get_or_init(|| GuestImage::build_default().map_err(|e| e.to_string()))
        .clone()
        .unwrap_or_else(|e| panic!("cannot build the guest image: {e}"))
}

/// A VM shared by several tests: booted on first use, one test at a time,
/// dropped (QEMU killed, temp dir removed) when the test process exits.
struct Shared {
    vm: OnceLock<Mutex<Option<Result<Vm, String>>>>,
}

impl Shared {
    const fn new() -> Self {
        Self {
            vm: OnceLock::new(),
        }
    }

    fn lock(&'static self, boot: impl FnOnce() -> Result<Vm, String>) -> VmGuard {
        register_cleanup();
        let cell = self.vm.get_or_init(|| Mutex::new(None));
        // A test that failed while holding the VM poisons the lock; the VM is
        // still usable for the others.
        let mut guard = cell.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            *guard = Some(boot());
        }
        VmGuard { guard }
    }

    /// Why this guest, if booted, was lost to the emulation after a test
    /// panicked with `panic_text` (then it is dropped: the next test boots
    /// another).
    fn lost(&self, panic_text: &str) -> Option<String> {
        let mut guard = self.vm.get()?.lock().unwrap_or_else(|e| e.into_inner());
        let why = match guard.as_ref() {
            Some(Ok(vm)) => pvsched_vmtest::guest_lost(vm, panic_text)?,
            _ => return None,
        };
        guard.take();
        Some(why)
    }

    fn drop_vm(&self) {
        if let Some(cell) = self.vm.get() {
            let mut guard = match cell.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return,
            };
            guard.take();
        }
    }
}

struct VmGuard {
    guard: MutexGuard<'static, Option<Result<Vm, String>>>,
}

impl VmGuard {
    fn vm(&self) -> &Vm {
        match self.guard.as_ref() {
            Some(Ok(vm)) => vm,
            Some(Err(e)) => panic!("the shared guest did not boot: {e}"),
            None => panic!("the shared guest is gone"),
        }
    }
}

static LIVE: Shared = Shared::new();
static SCRATCH: Shared = Shared::new();

extern "C" fn cleanup() {
    LIVE.drop_vm();
    SCRATCH.drop_vm();
}

fn register_cleanup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain extern "C" function, run at exit.
        unsafe {
            libc::atexit(cleanup);
        }
    });
}

/// Drops a shared guest the emulation lost, for the test's next run to boot
/// again (`pvsched_vmtest::guest_test!`); a guest of the test's own went
/// with the failed run.
fn replace_lost_guest(panic_text: &str) -> Option<String> {
    if let Some(why) = LIVE.lost(panic_text) {
        return Some(format!("the live guest: {why}"));
    }
    if let Some(why) = SCRATCH.lost(panic_text) {
        return Some(format!("the scratch guest: {why}"));
    }
    pvsched_vmtest::lost::stalled_without_fault(panic_text)
        .then(|| "its own guest: a reply stopped mid-way".to_string())
}

/// The live guest, with pvsched loaded and bound.
fn live() -> VmGuard {
    let g = LIVE.lock(|| {
        // Every feature, the doorbell too: its rings are counted on the
        // register of an ivshmem-plain device (under TCG a write there costs
        // no exit), as no pvschedd would offer them.
        let mut cfg = VmConfig::new(image()).name("live").smp(2).offer(abi::F_ALL);
        cfg.qemu = Some(single_thread_tcg());
        let vm = Vm::boot(cfg).map_err(|e| e.to_string())?;
        Ok(vm)
    });
    let vm = g.vm();
    if !loaded(vm) {
        let (rc, out) = vm.insmod("").expect("insmod");
        assert_eq!(rc, 0, "insmod failed: {out}");
    }
    g
}

/// The scratch guest: a 4-page region the tests fill with any header; the
/// module is not loaded between tests.
fn scratch() -> VmGuard {
    let g = SCRATCH.lock(|| {
        let mut cfg =
            VmConfig::new(image())
                .name("scratch")
                .smp(2)
                .region(RegionSetup::RawHeader {
                    slot_count: 60,
                    header: Header::default(),
                });
        cfg.qemu = Some(single_thread_tcg());
        Vm::boot(cfg).map_err(|e| e.to_string())
    });
    if loaded(g.vm()) {
        g.vm().rmmod().expect("rmmod");
    }
    g
}

/// Kills a guest process when dropped, also when a check fails, so that one
/// failure does not leave a spinner (or an open /dev/pvsched) to the next test.
struct Reap<'a> {
    vm: &'a Vm,
    pid: u32,
}

impl Drop for Reap<'_> {
    fn drop(&mut self) {
        let _ = self
            .vm
            .exec(&format!("kill -9 {} 2>/dev/null", self.pid), T);
    }
}

fn reap(vm: &Vm, pid: u32) -> Reap<'_> {
    Reap { vm, pid }
}

fn loaded(vm: &Vm) -> bool {
    vm.exec("test -d /sys/module/pvsched", T).expect("exec").0 == 0
}

fn region(vm: &Vm) -> &Region {
    vm.region().expect("the VM has a region")
}

/// A consistent copy of slot `i`. A vCPU thread the host deschedules in the
/// middle of a publish leaves `seq` odd for a while: retry for a few seconds.
fn slot(vm: &Vm, i: u32) -> GuestHalf {
    let mut last = None;
    wait_until(Duration::from_secs(10), POLL, || {
        match region(vm).read_guest(i) {
            Ok(g) => Some(g),
            Err(e) => {
                last = Some(e);
                None
            }
        }
    })
    .unwrap_or_else(|| panic!("slot {i}: {last:?}"))
}

/// Polls slot `i` until `pred` holds; panics with the last copy otherwise.
fn wait_slot(
    vm: &Vm,
    i: u32,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&GuestHalf) -> bool,
) -> GuestHalf {
    let mut last = None;
    wait_until(timeout, POLL, || {
        let g = region(vm).read_guest(i).ok()?;
        last = Some(g);
        pred(&g).then_some(g)
    })
    .unwrap_or_else(|| panic!("slot {i}: {what} not seen in {timeout:?}; last: {last:?}"))
}

/// Dmesg lines since the last call (the ring buffer is cleared each time).
fn new_dmesg(vm: &Vm) -> String {
    vm.exec_ok("dmesg -c", T).expect("dmesg")
}

fn is_rt(g: &GuestHalf, prio: u32) -> bool {
    g.policy == abi::POLICY_FIFO && g.rt_priority == prio
}

// ---------------------------------------------------------------- build

/// `make W=1` of the DKMS tree (which `make -C guest dkms-tree` assembles with
/// the ABI header) prints no warning.
#[test]
fn module_builds_with_w1_and_no_warnings() {
    let root = workspace_root();
    let tmp = std::env::temp_dir().join(format!("pvsched-w1-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let tree = tmp.join("tree");
    let run = |cmd: &mut Command| {
        let out = cmd.output().expect("running make");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{cmd:?} failed:\n{text}");
        text
    };
    run(Command::new("make")
        .arg("-C")
        .arg(root.join("guest"))
        .arg("dkms-tree")
        .arg(format!("DKMS_TREE={}", tree.display())));
    assert!(
        tree.join("abi/pvsched_abi.h").exists(),
        "DKMS tree lacks the ABI header"
    );
    assert!(tree.join("dkms.conf").exists(), "DKMS tree lacks dkms.conf");
    let log = run(Command::new("make").arg("-C").arg(&tree).arg("W=1"));
    let _ = std::fs::remove_dir_all(&tmp);
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.to_lowercase().contains("warning"))
        .collect();
    assert!(
        warnings.is_empty(),
        "W=1 build warns:\n{}",
        warnings.join("\n")
    );
    assert!(
        log.contains("pvsched.ko"),
        "no pvsched.ko in the build log:\n{log}"
    );
}

// ---------------------------------------------------------------- live guest

guest_test! {
fn bind_writes_the_guest_line_and_marks_slots_active() {
    let g = live();
    let vm = g.vm();
    let h = region(vm).header();
    assert_eq!(
        h.guest_generation, h.generation,
        "guest bound to another generation: {h:?}"
    );
    assert_ne!(h.guest_generation, 0);
    assert_eq!(
        h.guest_features, F_ALL_BUT_KVM,
        "offered F_ALL, module supports all but what needs KVM: {h:?}"
    );
    assert_eq!(h.guest_abi_minor, u32::from(abi::ABI_MINOR));
    assert_eq!(h.guest_nr_cpus, 2);
    for i in 0..2 {
        let s = slot(vm, i);
        assert_ne!(s.flags & abi::GF_ACTIVE, 0, "slot {i} not active: {s:?}");
        assert_eq!(s.flags & !abi::GF_ALL, 0, "slot {i} reserved flags: {s:?}");
        assert_eq!(s.seq % 2, 0);
    }
    let status = vm
        .exec_ok("cat /sys/kernel/debug/pvsched/status", T)
        .unwrap();
    assert!(status.contains("generation="), "{status}");
    assert!(status.contains("sched_switch"), "{status}");
}
}

guest_test! {
fn rt_task_on_cpu1_shows_fifo_42_in_slot1_while_it_runs() {
    let g = live();
    let vm = g.vm();
    let p = vm.spawn("rtspin -c 1 -P fifo -p 42 -t 4").unwrap();
    let _reap_p = reap(vm, p.pid);
    let seen = wait_slot(vm, 1, "SCHED_FIFO 42", WAIT, |s| is_rt(s, 42));
    assert_ne!(seen.flags & abi::GF_ACTIVE, 0);
    assert_eq!(
        seen.flags & abi::GF_IDLE,
        0,
        "running an RT task, not idle: {seen:?}"
    );
    // It spins on CPU 1 only: slot 0 never shows it.
    let s0 = slot(vm, 0);
    assert!(!is_rt(&s0, 42), "slot 0 shows the CPU 1 task: {s0:?}");
    assert!(vm.wait_gone(p.pid, WAIT).unwrap(), "rtspin did not end");
    let after = wait_slot(vm, 1, "not FIFO 42 after exit", WAIT, |s| !is_rt(s, 42));
    assert_ne!(after.flags & abi::GF_ACTIVE, 0);
    let log = vm.exec_ok(&format!("cat {}", p.log), T).unwrap();
    assert!(log.contains("rtspin: ready"), "rtspin log: {log}");
}
}

guest_test! {
fn interrupt_activity_moves_the_cpus_cs_counters() {
    let g = live();
    let vm = g.vm();
    let before = [slot(vm, 0), slot(vm, 1)];
    // Timer interrupts and their softirqs on CPU 1 (and whatever the console
    // does on CPU 0): a task on CPU 1 sleeping in short steps.
    vm.exec_ok(
        "taskset -c 1 sh -c 'for i in 1 2 3 4 5 6 7 8 9 10; do usleep 20000; done'",
        T,
    )
    .unwrap();
    let after = wait_slot(vm, 1, "hardirq and softirq counts grow", WAIT, |s| {
        s.hardirq_count > before[1].hardirq_count && s.softirq_count > before[1].softirq_count
    });
    assert!(
        after.switch_count > before[1].switch_count,
        "{before:?} -> {after:?}"
    );
    assert!(after.update_ns > before[1].update_ns);
    let s0 = wait_slot(vm, 0, "CPU 0 hardirq count grows", WAIT, |s| {
        s.hardirq_count > before[0].hardirq_count
    });
    // Not stuck in a critical section: once the CPU is quiet, cs_flags is 0.
    for i in 0..2 {
        wait_slot(vm, i, "cs_flags 0 while quiet", WAIT, |s| s.cs_flags == 0);
    }
    // Best effort: while CPU 1 takes interrupts, the host may catch it inside
    // one (TCG makes handlers slow enough to see). Reported, not asserted.
    let p = vm
        .spawn("taskset -c 1 sh -c 'for i in $(seq 200); do usleep 1000; done'")
        .unwrap();
    let _reap_p = reap(vm, p.pid);
    let deadline = Instant::now() + Duration::from_secs(2);
    let (mut samples, mut hard, mut soft) = (0u32, 0u32, 0u32);
    while Instant::now() < deadline {
        if let Ok(s) = region(vm).read_guest(1) {
            samples += 1;
            hard += u32::from(s.cs_flags & abi::CS_HARDIRQ != 0);
            soft += u32::from(s.cs_flags & abi::CS_SOFTIRQ != 0);
        }
    }
    eprintln!(
        "cs_flags samples on CPU 1: {samples}, HARDIRQ in {hard}, SOFTIRQ in {soft}; \
         CPU 0 hardirqs {} -> {}",
        before[0].hardirq_count, s0.hardirq_count
    );
    vm.wait_gone(p.pid, WAIT).unwrap();
}
}

guest_test! {
/// Two normal tasks passing a byte back and forth on CPU 1 switch to each
/// other without going idle: nothing the host reads changes, so the slot is
/// published for the interrupts meanwhile, not for every switch (it was,
/// before publish-on-change: two publishes per round trip).
fn switches_between_normal_tasks_are_not_published() {
    let g = live();
    let vm = g.vm();
    let rounds = 5000u32;
    let before = slot(vm, 1);
    let out = vm
        .exec_ok(&format!("pipepong -a 1 -b 1 -n {rounds} -t 60"), T)
        .unwrap();
    let after = slot(vm, 1);
    assert!(out.contains(&format!("rounds={rounds}")), "pipepong: {out}");
    let publishes = after.seq.wrapping_sub(before.seq) / 2;
    let switches = 2 * rounds;
    eprintln!("{switches} switches on CPU 1 (at least), {publishes} publishes");
    assert!(
        publishes < switches / 4,
        "{publishes} publishes for {switches} switches: {before:?} -> {after:?}"
    );
    // The slot's counters still move with the publishes that happen.
    assert!(after.switch_count > before.switch_count);
}
}

/// Runs `boostreq` on CPU 1 at SCHED_FIFO 10 (so that no normal task preempts
/// it: leaving the CPU ends a request) and checks that the request is seen on
/// slot 1, counted once, and ended the way `mode` says. After the release,
/// boostreq spins (ioctl, close) or sleeps (sleep) for 600 s, so "still
/// running" is a fact, not a race; the test kills it.
fn boost_case(vm: &Vm, mode: &str) {
    let count0 = slot(vm, 1).boost_req_count;
    let p = vm
        .spawn(&format!("boostreq -c 1 -p 10 -t 0.8 -r {mode} -a 600"))
        .unwrap();
    let _reap_p = reap(vm, p.pid);
    let on = wait_slot(vm, 1, &format!("BOOST_REQ ({mode})"), WAIT, |s| {
        s.flags & abi::GF_BOOST_REQ != 0
    });
    assert_eq!(
        on.boost_req_count,
        count0 + 1,
        "one grant counted ({mode}): {on:?}"
    );
    assert!(is_rt(&on, 10), "granted to the FIFO 10 task: {on:?}");
    match mode {
        // Released while it keeps running on CPU 1: the slot shows both.
        "ioctl" | "close" => {
            wait_slot(
                vm,
                1,
                &format!("released, still running ({mode})"),
                WAIT,
                |s| s.flags & abi::GF_BOOST_REQ == 0 && is_rt(s, 10),
            );
        }
        // Left the CPU (sleeping): cleared, the process still exists.
        "sleep" => {
            wait_slot(vm, 1, "cleared by sleeping", WAIT, |s| {
                s.flags & abi::GF_BOOST_REQ == 0
            });
            assert!(vm.is_running(p.pid).unwrap(), "boostreq should be asleep");
            let log = vm.exec_ok(&format!("cat {}", p.log), T).unwrap();
            assert!(
                !log.contains("boostreq: done"),
                "boostreq ended early: {log}"
            );
        }
        "exit" => {
            wait_slot(vm, 1, "cleared by exit", WAIT, |s| {
                s.flags & abi::GF_BOOST_REQ == 0
            });
            assert!(vm.wait_gone(p.pid, WAIT).unwrap(), "boostreq did not exit");
            let log = vm.exec_ok(&format!("cat {}", p.log), T).unwrap();
            assert!(
                log.contains("boostreq: done cpu=1 release=exit"),
                "boostreq: {log}"
            );
        }
        _ => unreachable!(),
    }
    vm.exec(&format!("kill -9 {} 2>/dev/null", p.pid), T)
        .unwrap();
    assert!(vm.wait_gone(p.pid, WAIT).unwrap(), "boostreq not killed");
    let after = slot(vm, 1);
    assert_eq!(after.flags & abi::GF_BOOST_REQ, 0, "{after:?}");
    assert_eq!(
        after.boost_req_count,
        count0 + 1,
        "no second grant ({mode})"
    );
}

guest_test! {
fn boost_request_appears_and_clears_as_documented() {
    let g = live();
    let vm = g.vm();
    for mode in ["ioctl", "close", "sleep", "exit"] {
        boost_case(vm, mode);
    }
    let (rc, _) = vm.exec("test -c /dev/pvsched", T).unwrap();
    assert_eq!(rc, 0, "/dev/pvsched missing");
}
}

guest_test! {
fn host_half_is_shown_in_debugfs() {
    let g = live();
    let vm = g.vm();
    let host = HostHalf {
        status: abi::HS_PREEMPTED,
        flags: abi::HF_BOOSTED | abi::HF_OVERLOADED,
        policy: abi::HOST_POLICY_RR,
        rt_priority: 8,
        nice: -5,
        boost_count: 11,
        throttle_count: 3,
        preempt_count: 7,
        boosted_ns: 123456,
        ..HostHalf::default()
    };
    region(vm).write_host(1, &host).unwrap();
    let status = vm
        .exec_ok("cat /sys/kernel/debug/pvsched/status", T)
        .unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("cpu1 "))
        .unwrap_or_else(|| panic!("no cpu1 line:\n{status}"));
    for want in [
        "host_status=preempted",
        "boosted=1",
        "throttled=0",
        "overloaded=1",
        "host_policy=2",
        "host_prio=8",
        "host_nice=-5",
        "boosts=11",
        "throttles=3",
        "preempts=7",
        "boosted_ns=123456",
    ] {
        assert!(line.contains(want), "missing {want} in {line}");
    }
    region(vm).write_host(1, &HostHalf::default()).unwrap();
}
}

guest_test! {
/// rmmod while an RT task runs on CPU 1: every slot inactive, guest
/// generation 0; loading again binds again.
fn rmmod_leaves_every_slot_inactive_and_generation_zero() {
    let g = live();
    let vm = g.vm();
    let p = vm.spawn("rtspin -c 1 -P fifo -p 30 -t 3").unwrap();
    let _reap_p = reap(vm, p.pid);
    wait_slot(vm, 1, "FIFO 30", WAIT, |s| is_rt(s, 30));
    new_dmesg(vm);
    let (rc, out) = vm.rmmod().unwrap();
    assert_eq!(rc, 0, "rmmod: {out}");
    let h = region(vm).header();
    assert_eq!(h.guest_generation, 0, "{h:?}");
    assert_eq!(h.guest_features, 0, "{h:?}");
    for i in 0..h.slot_count {
        let s = slot(vm, i);
        assert_eq!(s.flags & abi::GF_ACTIVE, 0, "slot {i} still active: {s:?}");
        assert_eq!(s.flags, 0, "slot {i}: {s:?}");
        assert_eq!(s.cs_flags, 0, "slot {i}: {s:?}");
        assert_eq!(s.seq % 2, 0, "slot {i} left mid-write: {s:?}");
        assert_eq!(region(vm).guest_pending(i).unwrap(), 0);
    }
    let log = new_dmesg(vm);
    assert!(log.contains("unbound: all slots inactive"), "dmesg: {log}");
    // Nothing writes after unload.
    let snapshot = region(vm).to_bytes();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        snapshot == region(vm).to_bytes(),
        "region changed after rmmod"
    );
    vm.wait_gone(p.pid, WAIT).unwrap();
    let (rc, out) = vm.insmod("").unwrap();
    assert_eq!(rc, 0, "insmod again: {out}");
    let h = region(vm).header();
    assert_eq!(h.guest_generation, h.generation);
    wait_slot(vm, 1, "active again", T, |s| s.flags & abi::GF_ACTIVE != 0);
}
}

/// `key=<number>` from the debugfs line of `cpu`.
fn status_field(status: &str, cpu: u32, key: &str) -> u64 {
    pvsched_vmtest::guest_status::status_field(status, cpu, key)
        .unwrap_or_else(|| panic!("no cpu{cpu} {key} in:\n{status}"))
}

guest_test! {
/// An RT task woken from CPU 0 onto a busy CPU 1 gets a pending hint in slot
/// 1 (written by CPU 0), which CPU 1 clears when it switches to the task.
/// (Onto an idle CPU the kernel queues the wakeup on that CPU itself, which
/// then runs the task at once: no hint needed, none written.)
fn rt_wakeup_onto_a_busy_cpu_raises_a_pending_hint_that_is_cleared() {
    let g = live();
    let vm = g.vm();
    let status = || {
        vm.exec_ok("cat /sys/kernel/debug/pvsched/status", T)
            .unwrap()
    };
    let s0 = status();
    let (raised0, cleared0) = (
        status_field(&s0, 0, "hints_raised"),
        status_field(&s0, 1, "hints_cleared"),
    );
    let hog = vm.spawn("rtspin -c 1 -P other -t 6").unwrap();
    let _reap_hog = reap(vm, hog.pid);
    let reader = vm
        .spawn("rm -f /tmp/hint; mkfifo /tmp/hint; chrt -f 50 taskset -c 1 cat /tmp/hint")
        .unwrap();
    let _reap_reader = reap(vm, reader.pid);
    vm.exec_ok(
        "sleep 0.5; taskset -c 0 sh -c 'for i in $(seq 100); do echo x; usleep 5000; done > /tmp/hint'",
        Duration::from_secs(60),
    )
    .unwrap();
    vm.wait_gone(reader.pid, T).unwrap();
    vm.wait_gone(hog.pid, T).unwrap();
    let s1 = status();
    let raised = status_field(&s1, 0, "hints_raised") - raised0;
    let cleared = status_field(&s1, 1, "hints_cleared") - cleared0;
    assert!(raised > 0, "CPU 0 raised no hint for CPU 1:\n{s1}");
    assert!(cleared > 0, "CPU 1 cleared no hint:\n{s1}");
    for i in 0..2 {
        let word = wait_until(T, POLL, || {
            let w = region(vm).guest_pending(i).ok()?;
            (w == 0).then_some(w)
        });
        assert_eq!(word, Some(0), "slot {i} pending hint left set");
    }
    eprintln!("pending hints: {raised} raised by CPU 0, {cleared} cleared by CPU 1");
}
}

guest_test! {
/// pvschedd restarting re-initializes the region (new generation, slots and
/// guest line zeroed): the module notices within a couple of seconds and binds
/// to the new generation.
fn host_reinitialization_is_followed_by_a_new_binding() {
    let g = live();
    let vm = g.vm();
    let old = region(vm).header().generation;
    new_dmesg(vm);
    let mut file = RegionFile::open(vm.region_path().unwrap(), 2).unwrap();
    let gen = file.region_mut().init_header(2, abi::F_ALL).unwrap();
    assert_eq!(gen, old + 1);
    let h = wait_until(WAIT, POLL, || {
        let h = region(vm).header();
        (h.guest_generation == gen).then_some(h)
    })
    .unwrap_or_else(|| panic!("no binding to generation {gen}: {:?}", region(vm).header()));
    assert_eq!(h.guest_features, F_ALL_BUT_KVM);
    for i in 0..2 {
        wait_slot(vm, i, "active after rebinding", T, |s| {
            s.flags & abi::GF_ACTIVE != 0
        });
    }
    let log = new_dmesg(vm);
    let want = format!("host reinitialized the region (generation {old} -> {gen}): binding again");
    assert!(log.contains(&want), "want {want:?} in dmesg:\n{log}");
    assert!(
        log.contains(&format!(
            "bound: ABI 1.{}, generation {gen}",
            abi::ABI_MINOR
        )),
        "{log}"
    );
}
}

/// The module's count of probe registrations and unregistrations since load
/// (debugfs status): each patched kernel text.
fn probe_changes(vm: &Vm) -> u64 {
    debugfs_status(vm)
        .lines()
        .find_map(|l| l.strip_prefix("probe_changes="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no probe_changes in:\n{}", debugfs_status(vm)))
}

/// Re-initializes the live guest's region with `features` and waits until
/// the module has bound to the new generation.
fn rebind_with(vm: &Vm, features: u64) {
    let mut file = RegionFile::open(vm.region_path().unwrap(), 2).unwrap();
    let gen = file.region_mut().init_header(2, features).unwrap();
    wait_until(WAIT, POLL, || {
        let h = region(vm).header();
        (h.guest_generation == gen).then_some(())
    })
    .unwrap_or_else(|| {
        let log = vm.kernel_log();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        panic!(
            "no binding to generation {gen}: {:?}\nkernel log tail:\n{}",
            region(vm).header(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    });
}

guest_test! {
/// A host that re-initializes the region with other features (pvschedd
/// restarted without a doorbell it had, or with idle hints off) gets a new
/// binding that registers and unregisters no probe: each such change patches
/// kernel text, and patching the IPI vectors' tracepoints while rebinding
/// live-locked a TCG guest (benchmarks/LOG.md, "A guest hung by its own
/// rebind"). Only a feature that has probes of its own changes the set, by
/// exactly those probes.
fn a_rebind_to_other_features_touches_only_the_probes_they_change() {
    let g = live();
    let vm = g.vm();
    rebind_with(vm, abi::F_ALL);
    let before = probe_changes(vm);

    for features in [
        abi::F_ALL & !abi::F_DOORBELL,
        abi::F_ALL & !abi::F_IDLE_HINTS,
        abi::F_ALL,
    ] {
        rebind_with(vm, features);
        assert_eq!(
            probe_changes(vm),
            before,
            "rebinding to features {features:#x} touched probes:\n{}",
            debugfs_status(vm)
        );
    }
    rebind_with(vm, abi::F_ALL & !abi::F_LOCK_WAIT);
    let without_locks = probe_changes(vm);
    let status = debugfs_status(vm);
    rebind_with(vm, abi::F_ALL);

    // contention_begin and contention_end, out and back in.
    assert_eq!(without_locks, before + 2, "{status}");
    assert!(!status.contains("contention_begin"), "{status}");
    assert_eq!(probe_changes(vm), before + 4);
    assert!(debugfs_status(vm).contains("contention_begin"));
}
}

// ---------------------------------------------------------------- lock waits

fn debugfs_status(vm: &Vm) -> String {
    vm.exec_ok("cat /sys/kernel/debug/pvsched/status", T)
        .unwrap()
}

/// Writes slot `i`'s host half as a host would: `status`, the rest zero (a
/// new host-half seq each time).
fn write_status(vm: &Vm, i: u32, status: u32) {
    let host = HostHalf {
        status,
        ..HostHalf::default()
    };
    region(vm).write_host(i, &host).unwrap();
}

/// Zeroes both host halves when dropped, also when a check fails.
struct ClearHosts<'a>(&'a Vm);

impl Drop for ClearHosts<'_> {
    fn drop(&mut self) {
        for i in 0..2 {
            let _ = region(self.0).write_host(i, &HostHalf::default());
        }
    }
}

/// Both host halves say "running", and no wait shows "any other vCPU" (one
/// an earlier test left while it said "preempted" ends with its wait).
fn nobody_preempted(vm: &Vm) {
    for i in 0..2 {
        write_status(vm, i, abi::HS_RUNNING);
    }
    for i in 0..2 {
        wait_slot(vm, i, "no LOCK_ANY wait", WAIT, |s| {
            s.lock_holder != abi::LOCK_ANY
        });
    }
}

/// `lockpair` (a guest program) ended with SIGKILL: nothing shown as waited
/// for afterwards, on either slot, and no kernel complaint.
fn end_lockpair(vm: &Vm, pid: u32) {
    vm.exec_ok(&format!("kill -9 {pid}"), T).unwrap();
    assert!(vm.wait_gone(pid, WAIT).unwrap(), "lockpair did not end");
    for i in 0..2 {
        wait_slot(vm, i, "no lock wait after lockpair ended", WAIT, |s| {
            s.lock_holder == abi::LOCK_NONE && s.lock_flags == 0
        });
    }
    let log = vm.kernel_log();
    let trouble = kernel_trouble(&log);
    assert!(
        trouble.is_empty(),
        "kernel complained:\n{}",
        trouble.join("\n")
    );
}

guest_test! {
/// ABI 1.3 lock waits, with a known holder. `lockpair -m mmap`: a thread on
/// CPU 1 holds its process's mmap_lock (an rwsem) for writing while it runs
/// mprotect() over 128 MiB; a thread on CPU 0 faults pages in and waits to
/// read it. The test, as the host, reads slot 0: it names slot 1 (lock_holder
/// 2, LOCK_F_READ), the contention count rises, and nothing is counted as
/// preempted or shown as "any other vCPU" while no host half says preempted.
/// Then slot 1's host half says PREEMPTED: slot 0 counts preempted holders
/// (in the named part too: ABI 1.7), and rings the doorbell register once
/// per host-half update. After the
/// program is killed both slots show no wait.
fn a_wait_for_an_rwsem_writer_on_another_vcpu_names_its_slot() {
    let g = live();
    let vm = g.vm();
    let h = region(vm).header();
    assert_eq!(h.guest_features, F_ALL_BUT_KVM, "lock waits, doorbell: {h:?}");
    let _clear = ClearHosts(vm);
    nobody_preempted(vm);
    let before = slot(vm, 0);
    let p = vm
        .spawn("lockpair -m mmap -s 128 -H 1 -W 0 -t 300")
        .unwrap();
    let _reap_p = reap(vm, p.pid);

    let named = wait_slot(vm, 0, "lock_holder 2 with LOCK_F_READ", WAIT, |s| {
        s.lock_holder == 2 && s.lock_flags & abi::LOCK_F_READ != 0
    });
    assert_eq!(
        named.lock_flags & !(abi::LOCK_F_READ | abi::LOCK_F_SLEEP),
        0,
        "a read wait for an rwsem: {named:?}"
    );
    assert!(
        named.lock_contended_count > before.lock_contended_count,
        "{before:?} -> {named:?}"
    );
    // Two seconds of contention with nobody preempted.
    let (mut samples, mut shown) = (0u32, 0u32);
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        for i in 0..2 {
            let Ok(s) = region(vm).read_guest(i) else {
                continue;
            };
            assert_ne!(
                s.lock_holder,
                abi::LOCK_ANY,
                "slot {i}: 'any other vCPU' while no host half says preempted: {s:?}"
            );
            assert_eq!(s.lock_flags & !abi::LOCK_F_ALL, 0, "slot {i}: {s:?}");
            if i == 0 {
                samples += 1;
                shown += u32::from(s.lock_holder == 2);
            }
        }
        std::thread::sleep(POLL);
    }
    let quiet = slot(vm, 0);
    eprintln!(
        "slot 0 named slot 1 in {shown} of {samples} samples (first: lock_flags {:#x}); \
         contentions {} -> {}",
        named.lock_flags, before.lock_contended_count, quiet.lock_contended_count
    );
    assert_eq!(
        quiet.lock_preempted_count, before.lock_preempted_count,
        "counted as preempted while no host half said so: {quiet:?}"
    );
    assert!(
        quiet.lock_contended_count > named.lock_contended_count,
        "{named:?} -> {quiet:?}"
    );
    // ABI 1.7: the waits name their holder, so the named part rises too,
    // never past the totals, and nothing named is counted as preempted.
    let named_rise = quiet.lock_named_contended_count - before.lock_named_contended_count;
    assert!(
        named_rise > 0 && named_rise <= quiet.lock_contended_count - before.lock_contended_count,
        "{before:?} -> {quiet:?}"
    );
    assert_eq!(
        quiet.lock_named_preempted_count, before.lock_named_preempted_count,
        "{quiet:?}"
    );

    // The host says vCPU 1 is preempted: CPU 0's waits count it, and a
    // wait shown with its holder preempted rings the host.
    let rings = |vm: &Vm, want: u64, what: &str| {
        let mut last = String::new();
        wait_until(WAIT, Duration::from_millis(50), || {
            last = debugfs_status(vm);
            (status_field(&last, 0, "lock_doorbell_rings") >= want).then_some(())
        })
        .unwrap_or_else(|| panic!("{what}:\n{last}"));
    };
    let rings0 = status_field(&debugfs_status(vm), 0, "lock_doorbell_rings");
    write_status(vm, 1, abi::HS_PREEMPTED);
    let pre = wait_slot(vm, 0, "lock_preempted_count rises", WAIT, |s| {
        s.lock_preempted_count > quiet.lock_preempted_count
    });
    wait_slot(vm, 0, "slot 1 named while it is preempted", WAIT, |s| {
        s.lock_holder == 2
    });
    // A named holder preempted (no KVM steal time under TCG: as the host
    // half says) counts in the named part as well.
    let named_pre = wait_slot(vm, 0, "lock_named_preempted_count rises", WAIT, |s| {
        s.lock_named_preempted_count > quiet.lock_named_preempted_count
    });
    assert!(
        named_pre.lock_named_preempted_count - quiet.lock_named_preempted_count
            <= named_pre.lock_preempted_count - quiet.lock_preempted_count,
        "{quiet:?} -> {named_pre:?}"
    );
    rings(vm, rings0 + 1, "no ring for a wait on a preempted holder");
    // More waits find slot 1 preempted, but its host half did not change:
    // no ring more.
    let more = slot(vm, 0).lock_preempted_count;
    wait_slot(vm, 0, "lock_preempted_count rises again", WAIT, |s| {
        s.lock_preempted_count > more
    });
    let status = debugfs_status(vm);
    assert_eq!(
        status_field(&status, 0, "lock_doorbell_rings"),
        rings0 + 1,
        "one ring per host-half update:\n{status}"
    );
    assert!(
        status_field(&status, 0, "lock_preempted") > pre.lock_preempted_count,
        "{status}"
    );
    // A new update of slot 1's host half (a new seq): one ring more.
    write_status(vm, 1, abi::HS_PREEMPTED);
    rings(vm, rings0 + 2, "no ring after a new host-half update");

    end_lockpair(vm, p.pid);
}
}

guest_test! {
/// Mutexes, and a hint used the other way. `lockpair -m seqfile`: threads on
/// CPUs 0 and 1 read /proc/kallsyms through one file, each holding its
/// position mutex and the seq_file's mutex while it reads. Slot 0 names slot
/// 1 with LOCK_F_MUTEX; while no host half says preempted, no spin is
/// stopped; once slot 1's says PREEMPTED, CPU 0's optimistic spins on the
/// holder are stopped (need_resched) and counted in debugfs.
fn a_mutex_spin_on_a_holder_whose_vcpu_is_preempted_is_stopped() {
    let g = live();
    let vm = g.vm();
    let _clear = ClearHosts(vm);
    nobody_preempted(vm);
    let stopped0 = status_field(&debugfs_status(vm), 0, "lock_spins_stopped");
    let p = vm.spawn("lockpair -m seqfile -H 1 -W 0 -t 300").unwrap();
    let _reap_p = reap(vm, p.pid);

    let named = wait_slot(vm, 0, "lock_holder 2 with LOCK_F_MUTEX", WAIT, |s| {
        s.lock_holder == 2 && s.lock_flags & abi::LOCK_F_MUTEX != 0
    });
    assert_eq!(
        named.lock_flags & (abi::LOCK_F_READ | abi::LOCK_F_WRITE),
        0,
        "a mutex wait: {named:?}"
    );
    let log = vm.exec_ok(&format!("sleep 1; cat {}", p.log), T).unwrap();
    assert!(log.contains("lockpair: ready mode=seqfile"), "{log}");
    let status = debugfs_status(vm);
    assert_eq!(
        status_field(&status, 0, "lock_spins_stopped"),
        stopped0,
        "a spin stopped while no host half said preempted:\n{status}"
    );

    write_status(vm, 1, abi::HS_PREEMPTED);
    let mut last = String::new();
    wait_until(WAIT, Duration::from_millis(50), || {
        last = debugfs_status(vm);
        (status_field(&last, 0, "lock_spins_stopped") > stopped0).then_some(())
    })
    .unwrap_or_else(|| panic!("no mutex spin stopped on CPU 0:\n{last}"));
    eprintln!(
        "CPU 0 spins stopped: {}",
        status_field(&last, 0, "lock_spins_stopped") - stopped0
    );

    end_lockpair(vm, p.pid);
}
}

guest_test! {
/// ABI 1.6 lock holders (`F_LOCK_HOLD`), with a known holder and waiter.
/// `lockpair -m mmap`: the thread on CPU 1 holds its process's mmap_lock for
/// writing through each mprotect() (`down_write_killable`), the thread on
/// CPU 0 waits to read it. The test, as the host, samples both slots: slot
/// 1 shows `CS_LOCK` while its holder runs, slot 0 names slot 1 while it
/// waits and never shows `CS_LOCK` for the lock it waits for; debugfs shows
/// the hooked lock calls and CPU 1's takes and releases. Once the program
/// ends no slot shows `CS_LOCK`. A host that does not offer the feature gets
/// no `CS_LOCK` from the same program, and the rebinds on and off patch no
/// text: the hooks stay registered, idle.
fn a_holder_of_a_sleeping_lock_shows_cs_lock_and_its_waiter_does_not() {
    let g = live();
    let vm = g.vm();
    let _clear = ClearHosts(vm);
    rebind_with(vm, abi::F_ALL);
    nobody_preempted(vm);
    let status = debugfs_status(vm);
    for call in ["mutex_lock", "down_write_killable", "mutex_unlock", "up_write"] {
        assert!(
            status.contains(call),
            "{call} not hooked:\n{status}"
        );
    }
    let takes0 = status_field(&status, 1, "held_takes");

    let sample = |secs: u64| {
        let p = vm
            .spawn(&format!("lockpair -m mmap -s 128 -H 1 -W 0 -t {secs}"))
            .unwrap();
        let reap_p = reap(vm, p.pid);
        wait_slot(vm, 0, "slot 0 waits for slot 1", WAIT, |s| s.lock_holder == 2);
        // (samples, slot 1 with CS_LOCK, slot 0 naming slot 1)
        let mut seen = (0u32, 0u32, 0u32);
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            let (Ok(waiter), Ok(holder)) = (region(vm).read_guest(0), region(vm).read_guest(1))
            else {
                continue;
            };
            seen.0 += 1;
            seen.1 += u32::from(holder.cs_flags & abi::CS_LOCK != 0);
            if waiter.lock_holder == 2 {
                seen.2 += 1;
                assert_eq!(
                    waiter.cs_flags & abi::CS_LOCK,
                    0,
                    "the waiter shows the lock it waits for as held: {waiter:?}"
                );
            }
            std::thread::sleep(POLL);
        }
        end_lockpair(vm, p.pid);
        drop(reap_p);
        seen
    };

    let (samples, held, waited) = sample(300);
    let status = debugfs_status(vm);
    eprintln!(
        "F_LOCK_HOLD: slot 1 CS_LOCK in {held} of {samples} samples, slot 0 waiting in {waited}"
    );
    assert!(held > 0, "slot 1 never showed CS_LOCK:\n{status}");
    assert!(waited > 0, "slot 0 never waited:\n{status}");
    assert!(
        status_field(&status, 1, "held_takes") > takes0
            && status_field(&status, 1, "held_releases") > 0,
        "{status}"
    );
    for i in 0..2 {
        wait_slot(vm, i, "no CS_LOCK after lockpair ended", WAIT, |s| {
            s.cs_flags & abi::CS_LOCK == 0
        });
    }

    // Not offered: the same pattern shows no holder; no text patched.
    let changes = probe_changes(vm);
    rebind_with(vm, abi::F_ALL & !abi::F_LOCK_HOLD);
    let status = debugfs_status(vm);
    assert!(status.contains("lock_hold=off"), "{status}");
    let (samples, held, waited) = sample(300);
    rebind_with(vm, abi::F_ALL);
    let status = debugfs_status(vm);
    assert_eq!(probe_changes(vm), changes, "a rebind patched text:\n{status}");
    assert!(status.contains("lock_hold=on"), "{status}");
    eprintln!(
        "without F_LOCK_HOLD: slot 1 CS_LOCK in {held} of {samples} samples, slot 0 waiting in {waited}"
    );
    assert_eq!(held, 0, "CS_LOCK shown without F_LOCK_HOLD");
    assert!(waited > 0, "slot 0 never waited without F_LOCK_HOLD");
}
}

// ---------------------------------------------------------------- scratch guest

/// Writes `header` (host line) raw, zeroes the rest; insmod must refuse with
/// exactly one line containing `expect`, and change no byte of the region.
fn refusal_case(header: Header, expect: &str) {
    let g = scratch();
    let vm = g.vm();
    let r = region(vm);
    r.load_bytes(&vec![0u8; r.len()]).unwrap();
    r.write_header(&header);
    // Something recognisable in the slots: the module must not touch it.
    r.write_guest(
        0,
        &GuestHalf {
            flags: abi::GF_ACTIVE,
            policy: 7,
            ..GuestHalf::default()
        },
    )
    .unwrap();
    let before = r.to_bytes();
    new_dmesg(vm);
    let (rc, out) = vm.insmod("").unwrap();
    assert_eq!(
        rc, 0,
        "insmod of a module that refuses its device still loads: {out}"
    );
    let log = new_dmesg(vm);
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("pvsched") && !l.contains("taint") && !l.contains("verification"))
        .collect();
    assert_eq!(lines.len(), 1, "exactly one pvsched line expected:\n{log}");
    assert!(
        lines[0].contains(expect),
        "want {expect:?} in {:?}",
        lines[0]
    );
    assert!(lines[0].contains("refusing region:"), "{:?}", lines[0]);
    assert!(
        before == r.to_bytes(),
        "the module wrote to a refused region"
    );
    assert!(
        vm.exec("test -e /dev/pvsched", T).unwrap().0 != 0,
        "/dev/pvsched exists for a refused region"
    );
    let (rc, out) = vm.rmmod().unwrap();
    assert_eq!(rc, 0, "rmmod: {out}");
    assert!(before == r.to_bytes(), "rmmod wrote to a refused region");
}

fn good_header(slot_count: u32) -> Header {
    Header {
        magic: abi::MAGIC,
        abi_major: abi::ABI_MAJOR,
        abi_minor: abi::ABI_MINOR,
        header_size: abi::HEADER_SIZE as u16,
        slot_size: abi::SLOT_SIZE as u16,
        slot_count,
        host_features: abi::F_ALL,
        generation: 9,
        ..Header::default()
    }
}

guest_test! {
fn wrong_magic_is_refused_with_one_line_and_no_writes() {
    refusal_case(
        Header {
            magic: 0x1122_3344_5566_7788,
            ..good_header(2)
        },
        "refusing region: bad magic 0x1122334455667788 (expected 0x0044454843535650)",
    );
}
}

guest_test! {
fn unsupported_major_is_refused_with_one_line_and_no_writes() {
    refusal_case(
        Header {
            abi_major: 7,
            ..good_header(2)
        },
        "refusing region: unsupported ABI major 7 (supported 1)",
    );
}
}

guest_test! {
fn bad_geometry_is_refused_with_one_line_and_no_writes() {
    // 5000 slots cannot fit a 16 KiB BAR (and exceed PVSCHED_MAX_SLOTS).
    refusal_case(
        good_header(5000),
        "refusing region: bad geometry: header_size 128 slot_size 256 slot_count 5000 in a 16384-byte BAR2",
    );
}
}

guest_test! {
/// What a reply that never ended carries to explain the stall, here of a
/// guest QEMU was told to stop: its run state, each vCPU's registers, each
/// local APIC and the interrupt controllers, as QEMU printed them.
fn a_stall_report_shows_the_run_state_each_vcpu_and_the_interrupt_controllers() {
    let g = scratch();
    let vm = g.vm();
    vm.qmp(r#"{"execute":"stop"}"#).expect("stop");
    let report = pvsched_vmtest::lost::stall_report(vm);
    vm.qmp(r#"{"execute":"cont"}"#).expect("cont");
    eprintln!("{report}");
    assert!(report.contains(r#""status":"paused""#), "{report}");
    assert_eq!(report.matches("vCPU RIP 0x").count(), 2, "{report}");
    for cpu in 0..2 {
        let lapic = report
            .split(&format!("info lapic {cpu}:\n"))
            .nth(1)
            .unwrap_or_default();
        assert!(
            lapic.starts_with(&format!("dumping local APIC state for CPU {cpu}"))
                && lapic.contains("Timer"),
            "{report}"
        );
    }
    assert!(report.contains("ioapic"), "{report}");
}
}

guest_test! {
/// One slot for two CPUs: CPU 0 is served, CPU 1 is not (warned once), and a
/// boost request from CPU 1 fails with ENXIO.
fn fewer_slots_than_cpus_serves_the_cpus_that_have_one() {
    let g = scratch();
    let vm = g.vm();
    let r = region(vm);
    r.load_bytes(&vec![0u8; r.len()]).unwrap();
    r.write_header(&good_header(1));
    new_dmesg(vm);
    let (rc, out) = vm.insmod("").unwrap();
    assert_eq!(rc, 0, "insmod: {out}");
    let log = new_dmesg(vm);
    let warn: Vec<&str> = log.lines().filter(|l| l.contains("not served")).collect();
    assert_eq!(warn.len(), 1, "one warning expected:\n{log}");
    assert!(
        warn[0].contains("region has 1 slots for 2 CPUs: CPUs 1 and above are not served"),
        "{}",
        warn[0]
    );
    assert!(
        log.contains(&format!(
            "bound: ABI 1.{}, generation 9, 1 slots for 2 CPUs",
            abi::ABI_MINOR
        )),
        "{log}"
    );
    let h = r.header();
    assert_eq!(h.guest_generation, 9);
    assert_eq!(h.guest_nr_cpus, 2);
    let s0 = slot(vm, 0);
    assert_ne!(s0.flags & abi::GF_ACTIVE, 0, "{s0:?}");
    // Bytes beyond slot 0 stay zero: slot 1 is outside the region's geometry.
    let bytes = r.to_bytes();
    let slot1 = abi::HEADER_SIZE + abi::SLOT_SIZE;
    assert!(
        bytes[slot1..].iter().all(|b| *b == 0),
        "the module wrote past slot 0"
    );
    let out = vm.exec("boostreq -c 1 -t 0 -r ioctl -a 0", T).unwrap();
    assert_ne!(out.0, 0, "boost on an unserved CPU must fail: {}", out.1);
    assert!(
        out.1.contains("No such device or address"),
        "ENXIO expected: {}",
        out.1
    );
    let (rc, out) = vm.rmmod().unwrap();
    assert_eq!(rc, 0, "rmmod: {out}");
    assert_eq!(r.header().guest_generation, 0);
    assert_eq!(slot(vm, 0).flags, 0);
}
}

// ---------------------------------------------------------------- own guest

guest_test! {
/// The PCI shutdown hook leaves the slots inactive when the guest powers off.
fn poweroff_leaves_every_slot_inactive() {
    let vm = Vm::boot(VmConfig::new(image()).name("poweroff").smp(2)).expect("boot");
    let (rc, out) = vm.insmod("").unwrap();
    assert_eq!(rc, 0, "insmod: {out}");
    wait_slot(&vm, 1, "active", T, |s| s.flags & abi::GF_ACTIVE != 0);
    vm.poweroff(Duration::from_secs(60)).expect("poweroff");
    let h = region(&vm).header();
    assert_eq!(h.guest_generation, 0, "{h:?}");
    for i in 0..2 {
        assert_eq!(slot(&vm, i).flags, 0, "slot {i} after poweroff");
    }
    let path: PathBuf = vm.region_path().unwrap().to_path_buf();
    drop(vm);
    if std::env::var_os("PVSCHED_VMTEST_KEEP").is_none() {
        assert!(!path.exists(), "the VM's region file outlived it");
    }
}
}

/// tests/hintprobe, a module that calls pvsched's exported hints, built
/// against the Module.symvers of `image`'s pvsched (W=1, no warning). Kept in
/// the cache under a hash of what goes in, so that the image holding it is
/// reused on reruns.
fn hintprobe_ko(image: &GuestImage) -> PathBuf {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/hintprobe");
    let guest = workspace_root().join("guest");
    let symvers = image.dir.join("module-src/Module.symvers");
    let mut h = DefaultHasher::new();
    for f in [
        src.join("Kbuild"),
        src.join("pvsched_hintprobe.c"),
        guest.join("pvsched_hints.h"),
        symvers.clone(),
    ] {
        std::fs::read(&f)
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
            .hash(&mut h);
    }
    image.kernel_release.hash(&mut h);
    let name = format!("hintprobe-{:016x}", h.finish());
    let cache = pvsched_vmtest::cache_root();
    let dir = cache.join(&name);
    let ko = dir.join("pvsched_hintprobe.ko");
    if ko.exists() {
        return ko;
    }
    let tmp = cache.join(format!("{name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    for f in ["Kbuild", "pvsched_hintprobe.c"] {
        std::fs::copy(src.join(f), tmp.join(f)).unwrap();
    }
    let out = Command::new("make")
        .arg("-C")
        .arg(format!("/usr/src/linux-headers-{}", image.kernel_release))
        .arg(format!("M={}", tmp.display()))
        .arg("W=1")
        .arg(format!("PVSCHED_GUEST_DIR={}", guest.display()))
        .arg(format!("KBUILD_EXTRA_SYMBOLS={}", symvers.display()))
        .arg("modules")
        .output()
        .expect("running make");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "building the hint probe:\n{log}");
    assert!(
        !log.to_lowercase().contains("warning"),
        "the hint probe's W=1 build warns:\n{log}"
    );
    // Older builds of the probe are of no use any more.
    if let Ok(entries) = std::fs::read_dir(&cache) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("hintprobe-") && !n.contains(".tmp-") {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    if std::fs::rename(&tmp, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    ko
}

guest_test! {
/// The hints pvsched exports (pvsched_hints.h) as another guest module sees
/// them: tests/hintprobe, loaded on CPU 0 and then on CPU 1, prints what
/// pvsched_vcpu_preempted() (CPUs 0, 1, 2 and -1) and
/// pvsched_host_overloaded() return for host halves the test wrote; both say
/// false once the host no longer offers host halves.
fn another_module_reads_the_hosts_hints_through_the_exports() {
    let base = image();
    let mut cfg = pvsched_vmtest::ImageConfig::default();
    cfg.files.push((
        hintprobe_ko(&base),
        "/lib/modules/pvsched_hintprobe.ko".to_string(),
    ));
    let img = GuestImage::build(&cfg).expect("image with the hint probe");
    let mut vcfg = VmConfig::new(img).name("hints").smp(2);
    vcfg.qemu = Some(single_thread_tcg());
    let vm = Vm::boot(vcfg).expect("boot");
    let (rc, out) = vm.insmod("").unwrap();
    assert_eq!(rc, 0, "insmod: {out}");
    let write_hosts = |vm: &Vm| {
        let running_overloaded = HostHalf {
            status: abi::HS_RUNNING,
            flags: abi::HF_OVERLOADED,
            ..HostHalf::default()
        };
        region(vm).write_host(0, &running_overloaded).unwrap();
        write_status(vm, 1, abi::HS_PREEMPTED);
    };
    let probe = |vm: &Vm, cpu: u32| -> String {
        new_dmesg(vm);
        vm.exec_ok(
            &format!(
                "taskset -c {cpu} insmod /lib/modules/pvsched_hintprobe.ko && \
                 rmmod pvsched_hintprobe"
            ),
            T,
        )
        .unwrap();
        let log = new_dmesg(vm);
        log.lines()
            .find_map(|l| l.split_once("pvsched_hintprobe: ").map(|(_, r)| r))
            .unwrap_or_else(|| panic!("no line of the hint probe in dmesg:\n{log}"))
            .trim()
            .to_string()
    };

    write_hosts(&vm);
    assert_eq!(probe(&vm, 0), "cpu=0 preempted=0,1,0,0 overloaded=1");
    assert_eq!(probe(&vm, 1), "cpu=1 preempted=0,1,0,0 overloaded=0");

    // The host re-initializes without host halves: the module binds again,
    // and what host halves say no longer counts.
    reinit_region(&vm, abi::F_ALL & !abi::F_HOST_HALF);
    write_hosts(&vm);
    assert_eq!(probe(&vm, 0), "cpu=0 preempted=0,0,0,0 overloaded=0");

    let trouble_log = vm.kernel_log();
    let trouble = kernel_trouble(&trouble_log);
    assert!(
        trouble.is_empty(),
        "kernel complained:\n{}",
        trouble.join("\n")
    );
}
}

// ---------------------------------------------------------------- idle driver

const IDLE_STATUS: &str = "/sys/kernel/debug/pvsched/idle";
const CPUIDLE_DRIVER: &str = "/sys/devices/system/cpu/cpuidle/current_driver";
/// Every feature but idle hints: what a host of ABI 1.0 offers.
const F_BEFORE_IDLE_HINTS: u64 = abi::F_HOST_HALF | abi::F_PENDING_HINT | abi::F_BOOST_REQUEST;

fn idle_status(vm: &Vm) -> String {
    vm.exec_ok(&format!("cat {IDLE_STATUS}"), T)
        .unwrap_or_else(|e| panic!("reading {IDLE_STATUS}: {e}"))
}

/// `key=<value>` from the header line of the idle file.
fn idle_header_field(status: &str, key: &str) -> String {
    let line = status
        .lines()
        .next()
        .unwrap_or_else(|| panic!("empty idle file"));
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        .to_string()
}

/// `key` summed over both CPUs' lines of the idle file.
fn idle_sum(status: &str, key: &str) -> u64 {
    (0..2).map(|cpu| status_field(status, cpu, key)).sum()
}

/// The kernel's cpuidle driver: `none`, a name, or `absent` without the file.
fn cpuidle_driver(vm: &Vm) -> String {
    vm.exec_ok(
        &format!("cat {CPUIDLE_DRIVER} 2>/dev/null || echo absent"),
        T,
    )
    .unwrap()
    .trim()
    .to_string()
}

/// Re-initializes the region as a restarting pvschedd would, offering
/// `features`, and waits until the module bound to the new generation.
fn reinit_region(vm: &Vm, features: u64) -> u64 {
    let mut file = RegionFile::open(vm.region_path().unwrap(), 2).unwrap();
    let gen = file.region_mut().init_header(2, features).unwrap();
    wait_until(WAIT, POLL, || {
        (region(vm).header().guest_generation == gen).then_some(())
    })
    .unwrap_or_else(|| panic!("no binding to generation {gen}: {:?}", region(vm).header()));
    gen
}

fn write_hints(vm: &Vm, p50: u32, p99: u32, flags: u32) {
    for i in 0..2 {
        let host = HostHalf {
            status: abi::HS_RUNNING,
            flags,
            wake_p50_ns: p50,
            wake_p99_ns: p99,
            ..HostHalf::default()
        };
        region(vm).write_host(i, &host).unwrap();
    }
}

/// Cross-CPU wakeups for `secs` seconds (pipepong between CPUs 0 and 1).
fn wakeup_load(vm: &Vm, secs: u32) -> String {
    vm.exec_ok(&format!("pipepong -a 0 -b 1 -t {secs}"), T)
        .unwrap_or_else(|e| panic!("pipepong: {e}"))
}

/// Waits until both CPUs applied the hint (`wake_p99_ns`, `overloaded` in
/// the idle file): a CPU refreshes at most every 10 ms, when it goes idle.
fn wait_hints_applied(vm: &Vm, p99: u32, overloaded: bool) -> String {
    let mut last = String::new();
    wait_until(WAIT, Duration::from_millis(50), || {
        last = idle_status(vm);
        (0..2)
            .all(|cpu| {
                status_field(&last, cpu, "wake_p99_ns") == u64::from(p99)
                    && status_field(&last, cpu, "overloaded") == u64::from(overloaded)
            })
            .then_some(())
    })
    .unwrap_or_else(|| panic!("hint p99={p99} overloaded={overloaded} not applied:\n{last}"));
    last
}

/// Clears the host halves' hints when dropped, also when a check fails.
struct ClearHints<'a>(&'a Vm);

impl Drop for ClearHints<'_> {
    fn drop(&mut self) {
        write_hints(self.0, 0, 0, 0);
    }
}

/// `(after - before)` of `key` summed over both CPUs.
fn idle_delta(before: &str, after: &str, key: &str) -> u64 {
    idle_sum(after, key).saturating_sub(idle_sum(before, key))
}

guest_test! {
/// Default mode `auto`: the driver registers when the host offers idle
/// hints, not when it offers only the older features (checked at a fresh
/// load and after a host re-initialization, both ways).
fn the_idle_driver_loads_only_when_the_host_offers_idle_hints() {
    let g = live();
    let vm = g.vm();
    assert_eq!(region(vm).header().host_features, abi::F_ALL);
    assert_eq!(cpuidle_driver(vm), "pvsched");
    let s = idle_status(vm);
    assert_eq!(idle_header_field(&s, "registered"), "1", "{s}");
    assert_eq!(idle_header_field(&s, "mode"), "hinted", "{s}");
    assert_eq!(idle_header_field(&s, "driver"), "pvsched", "{s}");
    let states = vm
        .exec_ok("cat /sys/devices/system/cpu/cpu0/cpuidle/state*/name", T)
        .unwrap();
    assert_eq!(
        states.split_whitespace().collect::<Vec<_>>(),
        ["HINTED", "HALT"]
    );

    // The host restarts without idle hints: the driver goes with the old binding.
    new_dmesg(vm);
    reinit_region(vm, F_BEFORE_IDLE_HINTS);
    let not_registered = |why: &str| {
        let drv = cpuidle_driver(vm);
        assert!(
            drv == "none" || drv == "absent",
            "{why}: cpuidle driver {drv}"
        );
        let s = idle_status(vm);
        assert_eq!(idle_header_field(&s, "registered"), "0", "{why}: {s}");
        assert_eq!(idle_header_field(&s, "mode"), "auto", "{why}: {s}");
        let log = new_dmesg(vm);
        let lines: Vec<&str> = log.lines().filter(|l| l.contains("idle driver")).collect();
        assert_eq!(lines.len(), 1, "{why}: one idle driver line:\n{log}");
        assert!(
            lines[0]
                .contains("idle driver: none: mode auto and the host does not offer idle hints"),
            "{why}: {}",
            lines[0]
        );
    };
    not_registered("after a re-initialization without idle hints");
    // A fresh load on such a region.
    let (rc, out) = vm.rmmod().unwrap();
    assert_eq!(rc, 0, "rmmod: {out}");
    new_dmesg(vm);
    let (rc, out) = vm.insmod("").unwrap();
    assert_eq!(rc, 0, "insmod: {out}");
    assert_eq!(region(vm).header().guest_features, F_BEFORE_IDLE_HINTS);
    not_registered("loaded on a region without idle hints");

    // Idle hints offered again: registered again.
    reinit_region(vm, abi::F_ALL);
    assert_eq!(cpuidle_driver(vm), "pvsched");
    let s = idle_status(vm);
    assert_eq!(idle_header_field(&s, "registered"), "1", "{s}");
    let log = new_dmesg(vm);
    assert!(log.contains("idle driver: mode hinted, 2 states"), "{log}");

    // CPU hotplug: an offline CPU's cpuidle device goes, and comes back with it.
    let cpu1_idle = "test -d /sys/devices/system/cpu/cpu1/cpuidle";
    vm.exec_ok("echo 0 > /sys/devices/system/cpu/cpu1/online", T)
        .unwrap();
    let gone = vm.exec(cpu1_idle, T).unwrap().0 != 0;
    vm.exec_ok("echo 1 > /sys/devices/system/cpu/cpu1/online", T)
        .unwrap();
    assert!(gone, "CPU 1 offline kept its cpuidle device");
    let names = vm
        .exec_ok("cat /sys/devices/system/cpu/cpu1/cpuidle/state*/name", T)
        .unwrap();
    assert_eq!(
        names.split_whitespace().collect::<Vec<_>>(),
        ["HINTED", "HALT"]
    );
    wait_slot(vm, 1, "CPU 1 active again", WAIT, |s| {
        s.flags & abi::GF_ACTIVE != 0
    });
    assert_eq!(cpuidle_driver(vm), "pvsched");
}
}

guest_test! {
/// Hints of 20 us (p50) and 60 us (p99): the halt state takes them as exit
/// latency and target residency, cross-CPU wakeups are caught while polling
/// (within the default 5 % budget); with HF_OVERLOADED, it halts at once;
/// with no hint measured, it polls no more either.
fn the_idle_driver_polls_with_hints_and_halts_when_the_host_is_overloaded() {
    let g = live();
    let vm = g.vm();
    assert_eq!(cpuidle_driver(vm), "pvsched");
    let _clear = ClearHints(vm);
    write_hints(vm, 20_000, 60_000, 0);
    // From before the first read of the counters to after the last.
    let t0 = std::time::Instant::now();
    let before = wait_hints_applied(vm, 60_000, false);
    for cpu in 0..2 {
        assert_eq!(
            status_field(&before, cpu, "wake_p50_ns"),
            20_000,
            "{before}"
        );
        // A poll may last 4 x the p99 (200 us at most); the adaptive limit grows into it.
        assert_eq!(status_field(&before, cpu, "cap_ns"), 200_000, "{before}");
        assert_eq!(
            status_field(&before, cpu, "budget_permille"),
            50,
            "{before}"
        );
    }
    let table = vm
        .exec_ok(
            "cd /sys/devices/system/cpu/cpu0/cpuidle/state1 && cat latency residency",
            T,
        )
        .unwrap();
    assert_eq!(
        table.split_whitespace().collect::<Vec<_>>(),
        ["20", "60"],
        "HALT latency and residency (us) follow the hints"
    );
    let out = wakeup_load(vm, 4);
    let after = idle_status(vm);
    let elapsed_ns = t0.elapsed().as_nanos() as u64;
    eprintln!("hinted: {out}{after}");
    // The budget: 5 % of each CPU's time, plus the bucket each starts with (5 ms).
    let poll_ns = idle_delta(&before, &after, "poll_ns");
    assert!(
        poll_ns <= 2 * (elapsed_ns / 20 + 5_000_000),
        "polled {poll_ns} ns in {elapsed_ns} ns on 2 CPUs: over the 5 % budget\n{after}"
    );
    let polls = idle_delta(&before, &after, "polls");
    let hits = idle_delta(&before, &after, "poll_hits");
    assert!(polls > 0, "no polls with hints:\n{before}{after}");
    assert!(hits > 0, "no wakeup caught while polling:\n{before}{after}");
    assert!(hits <= polls);
    assert_eq!(
        idle_delta(&before, &after, "poll_hits") + idle_delta(&before, &after, "poll_timeouts"),
        polls,
        "each poll is a hit or a timeout"
    );
    assert!(idle_delta(&before, &after, "poll_ns") > 0);
    assert_eq!(
        idle_delta(&before, &after, "overload_halts"),
        0,
        "not overloaded:\n{after}"
    );

    write_hints(vm, 20_000, 60_000, abi::HF_OVERLOADED);
    let before = wait_hints_applied(vm, 60_000, true);
    let out = wakeup_load(vm, 4);
    let after = idle_status(vm);
    eprintln!("overloaded: {out}{after}");
    assert_eq!(
        idle_delta(&before, &after, "polls"),
        0,
        "polled while the host is overloaded:\n{before}{after}"
    );
    assert!(
        idle_delta(&before, &after, "overload_halts") > 0,
        "POLL chosen and halted for the overload, never counted:\n{before}{after}"
    );
    assert!(idle_delta(&before, &after, "halts") >= idle_delta(&before, &after, "overload_halts"));

    write_hints(vm, 0, 0, 0);
    let before = wait_hints_applied(vm, 0, false);
    wakeup_load(vm, 2);
    let after = idle_status(vm);
    assert_eq!(
        idle_delta(&before, &after, "polls"),
        0,
        "polled without a hint:\n{before}{after}"
    );
}
}

guest_test! {
/// `idle=hinted` on a host that re-initializes the region without idle
/// hints: the driver stays, reads no hint, and halts instead of polling.
fn hinted_mode_halts_after_a_host_reinitialization_drops_idle_hints() {
    let g = live();
    let vm = g.vm();
    let _clear = ClearHints(vm);
    // Switched at run time (no reload: no tracepoint re-patching).
    vm.exec_ok("echo hinted > /sys/module/pvsched/parameters/idle", T)
        .unwrap();
    write_hints(vm, 20_000, 60_000, 0);
    wait_hints_applied(vm, 60_000, false);
    new_dmesg(vm);
    reinit_region(vm, F_BEFORE_IDLE_HINTS);
    // The hints stay in the host halves: without the feature they mean nothing.
    write_hints(vm, 20_000, 60_000, 0);
    let log = new_dmesg(vm);
    assert!(
        log.contains("idle driver: mode hinted, 2 states (the host offers no hints: it halts)"),
        "{log}"
    );
    assert_eq!(cpuidle_driver(vm), "pvsched");
    let before = idle_status(vm);
    assert_eq!(idle_header_field(&before, "registered"), "1", "{before}");
    wakeup_load(vm, 3);
    let after = idle_status(vm);
    eprintln!("hinted without the feature:\n{after}");
    assert_eq!(idle_delta(&before, &after, "polls"), 0, "{before}{after}");
    assert!(idle_delta(&before, &after, "halts") > 0, "{before}{after}");
    for cpu in 0..2 {
        assert_eq!(status_field(&after, cpu, "wake_p99_ns"), 0, "{after}");
        assert_eq!(status_field(&after, cpu, "limit_ns"), 0, "{after}");
        assert_eq!(status_field(&after, cpu, "cap_ns"), 0, "{after}");
    }
    // Back to what the other tests expect: every feature, mode auto.
    reinit_region(vm, abi::F_ALL);
    vm.exec_ok("echo auto > /sys/module/pvsched/parameters/idle", T)
        .unwrap();
    assert_eq!(cpuidle_driver(vm), "pvsched");
}
}

/// dmesg lines that mean the kernel went wrong.
fn kernel_trouble(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            // "BUG:" and "kernel BUG", not the BUG inside DEBUG.
            [
                "BUG:",
                "kernel BUG",
                "Oops",
                "WARNING",
                "general protection",
                "Call Trace",
            ]
            .iter()
            .any(|w| l.contains(w))
        })
        .collect()
}

/// 50 loads and unloads with `idle=hinted` while two CPUs wake each other up
/// (and poll, with hints in the host halves): no kernel complaint, the
/// module gone at the end and the kernel back to no cpuidle driver.
/// QEMU run with single-threaded TCG: a wrapper script that turns the
/// harness's `-accel tcg` into `-accel tcg,thread=single`, removed on drop.
///
/// Why: with multi-threaded TCG (QEMU 7.2), loading or unloading pvsched
/// while the vCPUs send each other IPIs at a high rate hangs the guest now
/// and then: the kernel patches the tracepoint sites in the IPI handlers
/// (text_poke_bp), and one vCPU keeps executing a stale translation of the
/// temporary int3 at such a site, with interrupts off, while memory already
/// holds the final instruction (seen with QMP: the trapping CPU looping
/// through exc_int3 at __sysvec_call_function_single+0x29, which reads
/// `66 90`), so the other vCPU waits forever for it to answer the sync IPI.
/// It happens with `idle=off` as well: the tracepoint (un)registration of the
/// module (at load, unload, and every rebinding after a host
/// re-initialization), not the idle driver. One TCG thread for all vCPUs
/// cannot run code another vCPU is rewriting. Every guest of this file runs so.
struct SingleThreadTcg(PathBuf);

/// The wrapper of [`SingleThreadTcg`] for the shared guests, which every test
/// that binds, unbinds or rebinds the module uses; it lives as long as the
/// test process (a file in the temporary directory).
fn single_thread_tcg() -> PathBuf {
    static WRAPPER: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    WRAPPER
        .get_or_init(|| {
            let w = SingleThreadTcg::new();
            let path = w.0.clone();
            std::mem::forget(w);
            path
        })
        .clone()
}

impl SingleThreadTcg {
    fn new() -> Self {
        use std::os::unix::fs::PermissionsExt;
        let path =
            std::env::temp_dir().join(format!("pvsched-qemu-single-tcg-{}.sh", std::process::id()));
        let script = "#!/bin/sh\n\
            for a do shift; [ \"$a\" = tcg ] && a=tcg,thread=single; set -- \"$@\" \"$a\"; done\n\
            exec qemu-system-x86_64 \"$@\"\n";
        std::fs::write(&path, script).expect("writing the QEMU wrapper");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .expect("chmod of the QEMU wrapper");
        Self(path)
    }
}

impl Drop for SingleThreadTcg {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

guest_test! {
fn the_idle_driver_unloads_cleanly_50_times() {
    let qemu = SingleThreadTcg::new();
    let mut cfg = VmConfig::new(image()).name("idle-cycles").smp(2);
    cfg.qemu = Some(qemu.0.clone());
    let vm = Vm::boot(cfg).expect("boot");
    // The wrapper took: one TCG thread for all vCPUs.
    let tasks = std::fs::read_dir(format!("/proc/{}/task", vm.qemu_pid())).expect("QEMU threads");
    let single = tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "ALL CPUs/TCG")
    });
    assert!(single, "QEMU runs multi-threaded TCG");
    assert!(matches!(cpuidle_driver(&vm).as_str(), "none" | "absent"));
    write_hints(&vm, 20_000, 60_000, 0);
    let load = vm.spawn("pipepong -a 0 -b 1 -t 600").unwrap();
    let _reap = reap(&vm, load.pid);
    let cycles = vm
        .exec(
            &format!(
                "for i in $(seq 50); do \
                   insmod /lib/modules/pvsched.ko idle=hinted || exit 1; \
                   usleep $((i * 3000)); cat {IDLE_STATUS} >/tmp/idle.$i || exit 2; \
                   rmmod pvsched || exit 3; \
                 done"
            ),
            Duration::from_secs(600),
        )
        .unwrap();
    assert_eq!(cycles.0, 0, "load/unload cycle failed: {}", cycles.1);
    assert!(vm.is_running(load.pid).unwrap(), "the wakeup load died");
    // The load polled: the last cycle's counters, and its pipepong, say so.
    let last = vm.exec_ok("cat /tmp/idle.50", T).unwrap();
    assert_eq!(idle_header_field(&last, "mode"), "hinted", "{last}");
    assert!(
        idle_sum(&last, "polls") > 0,
        "no polls in the last cycle:\n{last}"
    );
    let log = vm.dmesg().unwrap();
    let trouble = kernel_trouble(&log);
    assert!(
        trouble.is_empty(),
        "kernel complained:\n{}",
        trouble.join("\n")
    );
    assert_eq!(
        log.matches("idle driver: mode hinted, 2 states").count(),
        50,
        "{log}"
    );
    assert_eq!(log.matches("unbound: all slots inactive").count(), 50);
    assert!(!loaded(&vm), "pvsched still loaded");
    assert!(matches!(cpuidle_driver(&vm).as_str(), "none" | "absent"));
    let h = region(&vm).header();
    assert_eq!(h.guest_generation, 0, "{h:?}");
    let kernel_log = vm.kernel_log();
    let trouble = kernel_trouble(&kernel_log);
    assert!(
        trouble.is_empty(),
        "kernel console:\n{}",
        trouble.join("\n")
    );
}
}

/// What one load of the module with `params` did under cross-CPU wakeups.
struct ModeRun {
    /// The kernel's cpuidle driver while loaded.
    driver: String,
    /// dmesg of the load.
    log: String,
    before: String,
    after: String,
}

/// Switches the loaded module to `params` (`idle=MODE [idle_poll_us=N]`) at
/// run time through sysfs, as the benchmark does (a reload would re-patch
/// every tracepoint call site: see guest/README.md on QEMU's TCG), runs the
/// wakeup load and reads the counters around it.
fn mode_run(vm: &Vm, params: &str) -> ModeRun {
    new_dmesg(vm);
    let mut mode = "";
    for kv in params.split_whitespace() {
        let (k, v) = kv.split_once('=').expect("key=value");
        if k == "idle" {
            mode = v;
        } else {
            vm.exec_ok(&format!("echo {v} > /sys/module/pvsched/parameters/{k}"), T)
                .unwrap();
        }
    }
    vm.exec_ok(
        &format!("echo {mode} > /sys/module/pvsched/parameters/idle"),
        T,
    )
    .unwrap();
    let before = idle_status(vm);
    wakeup_load(vm, 3);
    let after = idle_status(vm);
    eprintln!("{params}:\n{after}");
    let log = new_dmesg(vm);
    let driver = cpuidle_driver(vm);
    assert!(kernel_trouble(&log).is_empty(), "{log}");
    ModeRun {
        driver,
        log,
        before,
        after,
    }
}

guest_test! {
/// The comparison modes: `haltpoll` (adaptive limit) and `fixed` (a set
/// window) poll under cross-CPU wakeups without any hint; `off` registers
/// nothing; an unknown mode or a window above 1000 us is refused at load.
fn haltpoll_fixed_and_off_modes_do_what_they_say() {
    let g = scratch();
    let vm = g.vm();
    let r = region(vm);
    r.load_bytes(&vec![0u8; r.len()]).unwrap();
    r.write_header(&good_header(2));
    let (rc, out) = vm.insmod("idle=off").unwrap();
    assert_eq!(rc, 0, "insmod idle=off: {out}");

    let run = mode_run(vm, "idle=haltpoll");
    let (b, a) = (&run.before, &run.after);

    assert_eq!(run.driver, "pvsched");
    assert!(
        run.log.contains("idle driver: mode haltpoll, 1 state\n"),
        "{}",
        run.log
    );
    assert_eq!(idle_header_field(a, "registered"), "1");
    assert!(idle_delta(b, a, "polls") > 0, "{a}");
    assert!(idle_delta(b, a, "poll_hits") > 0, "{a}");
    // The halts come when a poll runs out: on an idle CPU. Under the
    // wakeup load alone every poll may be woken within the limit (CI saw
    // no poll run out in 3 s), and the halts at the switch, while the limit
    // is still 0, may come before or after `before` is read.
    let idle_before = idle_status(vm);
    vm.exec_ok("sleep 1", T).unwrap();
    let idle_after = idle_status(vm);
    assert!(
        idle_delta(&idle_before, &idle_after, "poll_timeouts") > 0,
        "{idle_after}"
    );
    assert!(
        idle_delta(&idle_before, &idle_after, "halts") > 0,
        "{idle_after}"
    );
    for cpu in 0..2 {
        let limit = status_field(a, cpu, "limit_ns");
        assert!(
            limit <= 200_000,
            "haltpoll limit above guest_halt_poll_ns: {a}"
        );
        assert_eq!(status_field(a, cpu, "wake_p99_ns"), 0);
    }

    let run = mode_run(vm, "idle=fixed idle_poll_us=50");
    let (b, a) = (&run.before, &run.after);
    assert_eq!(run.driver, "pvsched");
    assert!(
        run.log.contains("idle driver: mode fixed, 1 state\n"),
        "{}",
        run.log
    );
    assert_eq!(idle_header_field(a, "fixed_poll_us"), "50");
    assert!(idle_delta(b, a, "polls") > 0, "{a}");
    for cpu in 0..2 {
        assert_eq!(status_field(a, cpu, "limit_ns"), 50_000, "{a}");
    }

    let run = mode_run(vm, "idle=fixed idle_poll_us=0");
    let (b, a) = (&run.before, &run.after);
    assert!(
        run.log.contains("idle driver: mode fixed, 1 state\n"),
        "{}",
        run.log
    );
    assert_eq!(
        idle_delta(b, a, "polls"),
        0,
        "idle_poll_us=0 halts at once: {a}"
    );
    assert!(idle_delta(b, a, "halts") > 0, "{a}");

    let run = mode_run(vm, "idle=off");
    assert!(
        matches!(run.driver.as_str(), "none" | "absent"),
        "{}",
        run.driver
    );
    assert!(
        run.log.contains("idle driver: none: mode off"),
        "{}",
        run.log
    );
    assert_eq!(idle_header_field(&run.after, "registered"), "0");
    assert_eq!(idle_sum(&run.after, "halts"), 0, "{}", run.after);
    let bogus = vm
        .exec("echo bogus > /sys/module/pvsched/parameters/idle", T)
        .unwrap();
    assert_ne!(
        bogus.0, 0,
        "an unknown mode written at run time must be refused"
    );
    let (rc, out) = vm.rmmod().unwrap();
    assert_eq!(rc, 0, "rmmod: {out}");
    assert!(matches!(cpuidle_driver(vm).as_str(), "none" | "absent"));

    let (rc, out) = vm.insmod("idle=bogus").unwrap();
    assert_ne!(rc, 0, "an unknown idle mode must be refused: {out}");
    let (rc, out) = vm.insmod("idle=fixed idle_poll_us=5000").unwrap();
    assert_ne!(rc, 0, "idle_poll_us above 1000 must be refused: {out}");
    assert!(!loaded(vm));
}
}
