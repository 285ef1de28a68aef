//! End to end under KVM: real KVM guests (with the real pvsched.ko) in a KVM
//! host VM (`crates/hostvm`), served by the real pvschedd, one test per KVM
//! event path. Each test runs itself inside the host VM ([`kvm_test!`]):
//! outside it boots (once per test binary) a host VM and runs the same test
//! there; a failure of the host VM itself is retried on a fresh one, a failed
//! assertion never is.
//!
//! Everything in the host VM is emulated (SVM under TCG): these tests assert
//! that each path works (counters move, threads are boosted, parameters are
//! put back), never how fast.

use std::path::Path;
use std::time::Duration;

use pvsched_base::kvm_params::{read_halt_poll, write_halt_poll_to, HaltPoll, DEFAULT_DIR};
use pvsched_control::{ApplyTarget, IdleReport, Request, Response};
use pvsched_host::discovery::threads_by_name;
use pvsched_host::statefile::StateFile;
use pvsched_hostvm::{guest_answers, guest_lost, kvm_test};
use pvsched_vmtest::{
    guest_status, wait_until, Accel, Error as VmError, GuestImage, ImageConfig, Vm, VmConfig,
};
use support::{params, tempdir, Daemon};

mod support;

/// A KVM guest of `smp` vCPUs with pvsched.ko loaded; `host_cpus` confines it.
fn kvm_guest(smp: u32, host_cpus: Option<Vec<u32>>) -> Vm {
    let image = GuestImage::build(&ImageConfig::default())
        .expect("guest image (built outside the host VM by kvm_test!)");
    let vm = match Vm::boot(
        VmConfig::new(image)
            .smp(smp)
            .accel(Accel::Kvm)
            .host_cpus(host_cpus)
            .boot_timeout(Duration::from_secs(240)),
    ) {
        Ok(vm) => vm,
        Err(e @ (VmError::BootTimeout { .. } | VmError::QemuExited { .. })) => {
            guest_lost::lost(format!("booting: {e}"))
        }
        Err(e) => panic!("boot a KVM guest in the host VM: {e}"),
    };
    let (rc, out) = guest_answers(&vm, vm.insmod(""), "insmod");
    assert_eq!(rc, 0, "insmod: {out}");
    vm
}

/// pvschedd serving `vm` as "kvm" (by its region and QMP socket), `limits`
/// as its `[defaults]`.
fn serve(name: &str, vm: &Vm, defaults: &str) -> Daemon {
    serve_on(name, vm, "", defaults)
}

/// [`serve`] with `daemon` more keys of its `[daemon]` section.
fn serve_on(name: &str, vm: &Vm, daemon: &str, defaults: &str) -> Daemon {
    let toml = format!(
        "{daemon}\n[defaults]\n{defaults}\n[discovery]\nauto = false\n{}",
        support::vm_entry("kvm", vm.region_path().expect("region"), vm.qmp_socket())
    );
    let d = Daemon::start(&tempdir(name), &toml);
    d.wait_serving("kvm", vm.guest_cpus() as usize);
    let accel = d.status().vms[0].accel.clone();
    assert_eq!(accel, "kvm", "the daemon must see a KVM guest");
    d
}

fn idle_report(d: &Daemon) -> IdleReport {
    match d.request(
        &Request::Idle {
            vm: None,
            budget_permille: 50,
        },
        Duration::from_secs(5),
    ) {
        Response::Idle(r) => r,
        other => panic!("{other:?}\n{}", d.log()),
    }
}

fn vcpu_tid(vm: &Vm, vcpu: usize) -> i32 {
    threads_by_name(vm.qemu_pid() as i32)
        .expect("vCPU threads")
        .vcpus[vcpu]
        .1
}

/// A child process killed (and reaped) when this goes out of scope.
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `[defaults]` honouring lock holders and nothing else: a boost above a
/// host hog would take the vCPU's contention away, and with it the locks
/// its guest lists.
const LOCK_HOLDERS_ONLY: &str = "honor_lock_holders = true\nhonor_critical_sections = false\n\
     proactive_wake = false\nproactive_irq = false\nproactive_halt = false";

/// A busy loop of this test's on host CPU 0, ended when dropped.
fn host_hog_on_cpu0() -> KilledOnDrop {
    KilledOnDrop(
        std::process::Command::new("taskset")
            .args(["-c", "0", "sh", "-c", "while :; do :; done"])
            .spawn()
            .expect("start a host hog"),
    )
}

/// Runs `cmd` in the guest to its end.
fn guest_run(vm: &Vm, cmd: &str, timeout: Duration) {
    let task = guest_answers(vm, vm.spawn(cmd), "spawn in the guest");
    assert!(
        guest_answers(
            vm,
            vm.wait_gone(task.pid, timeout),
            "wait for the guest task"
        ),
        "`{cmd}` did not end within {timeout:?}"
    );
}

/// Ends a task spawned in the guest. A guest that no longer answers was
/// lost to the emulation (its halts and interrupts stopped with it): the test
/// is run again rather than failed on what a dead guest did not do.
fn guest_kill(vm: &Vm, pid: u32) {
    guest_answers(
        vm,
        vm.exec(&format!("kill {pid}"), Duration::from_secs(20)),
        "kill the guest task",
    );
}

kvm_test! {
    /// `kvm_exit` with the HLT reason: a guest that ran RT work and halts
    /// keeps its vCPU thread boosted while halted (`proactive_halt`), and the
    /// daemon counts the exits it handled.
    fn kvm_hlt_exits_keep_a_halted_rt_vcpu_boosted() {
        let vm = kvm_guest(1, None);
        let d = serve("kvm-hlt", &vm, "");
        let tid = vcpu_tid(&vm, 0);

        // RT work that sleeps: 5 ms periods at SCHED_FIFO, halting between.
        let cmd = "chrt -f 10 sh -c 'for i in $(seq 400); do usleep 5000; done'";
        let task = guest_answers(&vm, vm.spawn(cmd), "spawn");
        // A halt boost also starts from the guest's idle flag or the thread
        // blocking; the HLT exits may arrive after it (read lazily).
        let exits = || d.metric("pvsched_events_total{kind=\"kvm_exit\"}");
        let mut seen = false;
        wait_until(Duration::from_secs(60), Duration::from_millis(1), || {
            if !seen {
                let v = d.status().vms[0].vcpus[0].clone();
                seen = v.reason == "proactive_halt" && params(tid).is_rt();
            }
            (seen && exits() > 0.0).then_some(())
        });
        let exits = exits();
        let by_reason = d.status().vms[0].boosted_ms_by_reason.clone();
        guest_kill(&vm, task.pid);

        assert!(
            exits > 0.0,
            "no kvm_exit event handled; boosted by reason: {by_reason:?}; log:\n{}",
            d.log()
        );
        assert!(
            seen,
            "the halted RT vCPU was never seen boosted for proactive_halt; by reason: \
             {by_reason:?}; log:\n{}",
            d.log()
        );
    }
}

kvm_test! {
    /// `kvm_vcpu_wakeup`: the idle meter takes every halt from KVM's own
    /// report and tells the wake-ups KVM's halt polling caught from the
    /// halts that blocked: with a 20 ms polling window the guest's 2 ms
    /// sleeps are caught, with none they block.
    fn kvm_vcpu_wakeups_feed_the_idle_meter_polled_and_blocked() {
        let before = read_halt_poll().expect("kvm parameters").expect("kvm loaded");
        // Put back on every way out: a lost guest's attempt would otherwise
        // leave 20 ms of halt polling to the tests after it.
        let _restore = RestoreHaltPoll(before);
        let set = |ns: u64| {
            write_halt_poll_to(
                Path::new(DEFAULT_DIR),
                &HaltPoll {
                    halt_poll_ns: ns,
                    ..before
                },
            )
            .expect("the host VM's kvm parameters are writable")
        };
        let vm = kvm_guest(1, None);
        let d = serve("kvm-wakeup", &vm, "");
        let sleeps = "for i in $(seq 300); do usleep 2000; done";

        let halts = |v: &pvsched_control::VcpuIdle| v.halts.iter().map(|b| b.1).sum::<u64>();
        // Runs the sleeps until the meter has `enough` (at most 5 times): in
        // a slow emulation a third of the sleeps or fewer end in a halt the
        // meter can time (2026-11-28: 82 and 93 of 300; once 97 polled
        // halts in three rounds).
        let measure = |enough: &dyn Fn(&pvsched_control::VcpuIdle) -> bool| {
            let mut v = idle_report(&d).vms[0].vcpus[0].clone();
            for _ in 0..5 {
                guest_run(&vm, sleeps, Duration::from_secs(120));
                v = idle_report(&d).vms[0].vcpus[0].clone();
                if enough(&v) {
                    break;
                }
            }
            v
        };
        set(20_000_000);
        let polling = measure(&|v| halts(v) >= 100 && v.polled_by_kvm >= 100);
        set(0);
        let blocking = measure(&|v| halts(v) >= halts(&polling) + 100);

        assert!(halts(&polling) >= 100, "halts measured: {polling:?}");
        assert!(
            polling.polled_by_kvm >= 100,
            "KVM's polling caught {} of the wake-ups; {polling:?}",
            polling.polled_by_kvm
        );
        assert!(halts(&blocking) >= halts(&polling) + 100, "{blocking:?}");
        assert!(
            blocking.polled_by_kvm < polling.polled_by_kvm + 30,
            "without polling the polled count must stay: {} then {}",
            polling.polled_by_kvm,
            blocking.polled_by_kvm
        );
    }
}

kvm_test! {
    /// `kvm_apic_accept_irq`: a timer interrupt for a vCPU that a host task
    /// has preempted boosts it (`proactive_irq`); one injected by the vCPU's
    /// own thread is not even recorded (the BPF filter; bpf_load tests it).
    fn an_interrupt_for_a_preempted_kvm_vcpu_boosts_it() {
        // Guest and a host hog share CPU 0, so the vCPU waits behind it.
        let vm = kvm_guest(1, Some(vec![0]));
        let d = serve("kvm-irq", &vm, "proactive_halt = false\nproactive_wake = false");
        // Killed on every way out: a hog left behind by a failed attempt
        // would starve the host VM's CPU 0 for the tests after it.
        let _hog = host_hog_on_cpu0();

        // Up to three rounds of 1 ms sleeps: in a slow emulation a round
        // can see only a few timer interrupts land while the hog holds the
        // CPU (a fresh-clone run of 2026-11-29: 5 in one round, none
        // boosted).
        let targeted = || d.metric("pvsched_events_total{kind=\"interrupt_targeted\"}");
        let irq_boosts =
            || d.metric("pvsched_decisions_total{vm=\"kvm\",reason=\"proactive_irq\"}");
        for _ in 0..3 {
            guest_run(
                &vm,
                "for i in $(seq 300); do usleep 1000; done",
                Duration::from_secs(120),
            );
            if irq_boosts() > 0.0 {
                break;
            }
        }
        let (targeted, irq_boosts) = (targeted(), irq_boosts());

        assert!(targeted > 0.0, "no interrupt_targeted event; log:\n{}", d.log());
        assert!(
            irq_boosts > 0.0,
            "{targeted} interrupts targeted, no proactive_irq boost; log:\n{}",
            d.log()
        );
    }
}

kvm_test! {
    /// `kvm_apic_accept_irq` read in its target's lazy bits: a lone 2-vCPU
    /// guest whose vCPUs pass messages sends an IPI at each wakeup, and with
    /// no rival on the host VM's CPUs such an interrupt can start no boost, so
    /// its record is queued without waking pvschedd. Before, each woke it (the
    /// web workload: 4391 interrupts and 12369 record wakeups in 10 s, LH25).
    /// On the sched_ext backend, without pending hints: no other record of a
    /// lone VM wakes it either.
    fn a_lone_vms_interrupts_between_its_own_vcpus_do_not_wake_the_daemon() {
        let vm = kvm_guest(2, None);
        let d = serve_on(
            "kvm-ipi",
            &vm,
            "backend = \"sched_ext\"",
            "honor_pending_hint = false",
        );
        assert_eq!(d.status().backend.active, "sched_ext", "log:\n{}", d.log());
        let targeted = || d.metric("pvsched_events_total{kind=\"interrupt_targeted\"}");
        let woken_by_records = || d.metric("pvsched_wakeups_total{cause=\"records\"}");
        let (t0, w0) = (targeted(), woken_by_records());

        guest_run(&vm, "pipepong -a 0 -b 1 -t 3", Duration::from_secs(120));

        let (t, w) = (targeted() - t0, woken_by_records() - w0);
        eprintln!("{t} interrupts targeted, {w} wakeups by records");
        assert!(t >= 100.0, "{t} interrupts targeted; log:\n{}", d.log());
        // Before: more wakeups than interrupts (10189 for 5036 in this test
        // on the old program); now a few per cent (339 for 5784 alone, 669
        // for 5900 beside the other tests: a kworker or another test's
        // process on a CPU is a rival, and its interrupts still wake it).
        assert!(
            w * 4.0 <= t,
            "{w} wakeups by records for {t} interrupts; log:\n{}",
            d.log()
        );
    }
}

kvm_test! {
    /// Halt polling for real: `idle --apply host` sets the host VM's own kvm
    /// module's `halt_poll_ns` to the advice, and SIGTERM, `--apply restore`
    /// and a successor after kill -9 each put back what was found.
    fn halt_polling_applied_to_the_real_kvm_module_is_put_back_on_every_exit() {
        let before = read_halt_poll().expect("kvm parameters").expect("kvm loaded");
        let now = || read_halt_poll().expect("read").expect("kvm loaded");
        let vm = kvm_guest(1, None);
        let apply = |d: &Daemon, target| d.idle_apply(target);
        let sleeps = "for i in $(seq 100); do usleep 2000; done";

        let mut d = serve("kvm-apply", &vm, "");
        guest_run(&vm, sleeps, Duration::from_secs(60));
        let applied = match apply(&d, ApplyTarget::Host) {
            Response::Idle(r) => r.applied.expect("applied"),
            other => panic!("{other:?}\n{}", d.log()),
        };
        let set = now();
        assert!(d.signal(libc::SIGTERM).success(), "{}", d.log());
        let after_term = now();

        let mut d = serve("kvm-apply-restore", &vm, "");
        guest_run(&vm, sleeps, Duration::from_secs(60));
        assert!(matches!(apply(&d, ApplyTarget::Host), Response::Idle(_)));
        assert!(matches!(apply(&d, ApplyTarget::Restore), Response::Idle(_)));
        let after_restore = now();
        d.signal(libc::SIGTERM);

        let mut d = serve("kvm-apply-kill", &vm, "");
        guest_run(&vm, sleeps, Duration::from_secs(60));
        assert!(matches!(apply(&d, ApplyTarget::Host), Response::Idle(_)));
        d.signal(libc::SIGKILL);
        let state = StateFile::load(&d.state_file()).expect("state").expect("state file");
        let mut successor = Daemon::start(&d.dir, "[discovery]\nauto = false\n");
        let put_back = wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            (now() == before).then_some(())
        });
        successor.signal(libc::SIGTERM);

        assert_eq!(applied.before, before);
        assert_eq!(set, applied.after, "the module holds what was applied");
        assert_eq!(after_term, before, "SIGTERM");
        assert_eq!(after_restore, before, "--apply restore");
        assert_eq!(state.kvm_halt_poll.map(|k| k.params), Some(before));
        assert!(put_back.is_some(), "the successor after kill -9 put it back");
    }
}

kvm_test! {
    /// A hand-started KVM guest (no QMP, no `[[vm]]` entry) is found by auto
    /// discovery through the region file its QEMU maps, its vCPU threads by
    /// name, and served: a guest FIFO task boosts its vCPU thread.
    fn a_hand_started_kvm_guest_is_discovered_and_served() {
        let vm = kvm_guest(1, None);
        let region = vm.region_path().expect("region").to_path_buf();
        let file = region.file_name().expect("file name").to_string_lossy().to_string();
        // The region file is <region_dir>/<region_prefix><name>: the name its last
        // character, the prefix the rest.
        let (prefix, name) = file.split_at(file.len() - 1);
        let toml = format!(
            "[discovery]\nauto = true\nregion_dir = {:?}\nregion_prefix = {prefix:?}\n",
            region.parent().expect("folder").display().to_string()
        );
        let d = Daemon::start(&tempdir("kvm-auto"), &toml);
        d.wait_serving(name, 1);
        let tid = vcpu_tid(&vm, 0);

        let cmd = "chrt -f 20 sh -c 'for i in $(seq 3000); do usleep 1000; done'";
        let task = guest_answers(&vm, vm.spawn(cmd), "spawn");
        let boosted = wait_until(Duration::from_secs(30), Duration::from_millis(2), || {
            params(tid).is_rt().then_some(())
        });
        let status = d.status();
        guest_kill(&vm, task.pid);

        assert_eq!(status.vms[0].accel, "kvm");
        assert!(
            boosted.is_some(),
            "the guest's FIFO task never boosted its vCPU thread; log:\n{}",
            d.log()
        );
    }
}

/// Writes the kvm module's halt-polling parameters back when dropped.
struct RestoreHaltPoll(HaltPoll);

impl Drop for RestoreHaltPoll {
    fn drop(&mut self) {
        if let Err(e) = write_halt_poll_to(Path::new(DEFAULT_DIR), &self.0) {
            eprintln!("cannot put the kvm module's halt polling back: {e}");
        }
    }
}

/// Field `key` of CPU `cpu`'s line in the guest module's debugfs status.
fn guest_status_field(vm: &Vm, cpu: u32, key: &str) -> u64 {
    let (rc, status) = guest_answers(
        vm,
        vm.exec(
            &format!("cat {}", guest_status::GUEST_STATUS_PATH),
            Duration::from_secs(20),
        ),
        "read the guest module's status",
    );
    assert_eq!(rc, 0, "{status}");
    guest_status::status_field(&status, cpu, key)
        .unwrap_or_else(|| panic!("no cpu{cpu} {key} in:\n{status}"))
}

kvm_test! {
    /// Lock holders honoured (`F_LOCK_HOLD`): a KVM guest lists the sleeping
    /// locks its tasks take (and shows `CS_LOCK`) only while its host
    /// contends its vCPU, by KVM's steal time. `lockpair` (an mmap_lock
    /// writer and reader on the guest's one vCPU) alone on host VM CPU 0:
    /// most takes are passed over as uncontended. The same beside a host hog
    /// on that CPU: most are listed.
    fn a_kvm_guest_lists_its_held_locks_only_while_its_host_contends_its_vcpu() {
        let vm = kvm_guest(1, Some(vec![0]));
        // Lock holders honoured (the host offers F_LOCK_HOLD), but no boost
        // of the vCPU: a boost above the hog takes the contention away, and
        // the guest then rightly lists nothing (a fresh-clone run of
        // 2026-11-29 beside the hog: 4508 takes listed, 21439 passed over).
        let _d = serve(
            "kvm-hold",
            &vm,
            LOCK_HOLDERS_ONLY,
        );
        let counts = || {
            (
                guest_status_field(&vm, 0, "held_takes"),
                guest_status_field(&vm, 0, "held_uncontended"),
            )
        };
        let lockpair = "lockpair -m mmap -s 8 -H 0 -W 0 -t 3";

        let (t0, u0) = counts();
        guest_run(&vm, lockpair, Duration::from_secs(120));
        let (t1, u1) = counts();
        let _hog = host_hog_on_cpu0();
        guest_run(&vm, lockpair, Duration::from_secs(120));
        let (t2, u2) = counts();

        let (alone_listed, alone_passed) = (t1 - t0, u1 - u0);
        let (hog_listed, hog_passed) = (t2 - t1, u2 - u1);
        eprintln!(
            "lock takes listed / passed over: alone {alone_listed} / {alone_passed}, beside a \
             host hog {hog_listed} / {hog_passed}"
        );
        assert!(
            alone_passed > 4 * alone_listed,
            "alone on its CPU, {alone_listed} takes listed and {alone_passed} passed over"
        );
        assert!(
            hog_listed > 4 * hog_passed,
            "beside a host hog, {hog_listed} takes listed and {hog_passed} passed over"
        );
    }
}

kvm_test! {
    /// The sched_ext backend shows a lock holder's guest the extension it
    /// runs on (`F_EXT_NOTICE`, the slot's `ext_notice`, written at each
    /// entry to the guest), and the guest ends it itself: at its next lock
    /// call with no sleeping lock held it makes pvsched's yield hypercall,
    /// and the scheduler takes the CPU back there, between two locks,
    /// instead of at the extension's end inside the next one. `lockpair`
    /// (an mmap_lock writer and reader) on the guest's one vCPU beside a
    /// host hog on CPU 0, so that its slices end with a task waiting.
    /// Before the notice no extension ended at a yield.
    fn a_kvm_lock_holder_shown_its_extension_yields_between_two_locks() {
        let vm = kvm_guest(1, Some(vec![0]));
        let d = serve_on(
            "kvm-yield",
            &vm,
            "backend = \"sched_ext\"",
            LOCK_HOLDERS_ONLY,
        );
        let yields = || guest_status_field(&vm, 0, "held_yields");
        let holder = || d.status().vms[0].vcpus[0].clone();
        let (g0, before) = (yields(), holder());
        let hog = host_hog_on_cpu0();
        guest_run(
            &vm,
            "lockpair -m mmap -s 8 -H 0 -W 0 -t 5",
            Duration::from_secs(180),
        );
        drop(hog);
        let (g1, after) = (yields(), holder());
        let backend = d.status().backend;

        let lock_ext = after.scx_lock_extensions - before.scx_lock_extensions;
        let ended_by_yield = after.scx_extension_yields - before.scx_extension_yields;
        let guest_yields = g1 - g0;
        eprintln!(
            "lock extensions {lock_ext}, ended at the guest's yield {ended_by_yield}; the \
             guest yielded {guest_yields} times; notices written {}, failed {}; yields with \
             no extension {}",
            backend.notices_written, backend.notice_writes_failed, backend.yields_unextended
        );
        assert!(
            lock_ext >= 5,
            "only {lock_ext} extensions for a lock holder beside the hog: {after:?}\n{}",
            d.log()
        );
        // Every yield the scheduler took came from the guest's hook.
        assert!(
            ended_by_yield <= guest_yields,
            "{ended_by_yield} extensions ended at a yield, the guest yielded {guest_yields}"
        );
        // lockpair is out of its locks now and then for longer than the
        // poll (250 µs), which ends those extensions first; the rest end at
        // the guest's yield (82 of 120 and 59 of 134 in two runs).
        assert!(
            ended_by_yield >= 5 && ended_by_yield * 5 >= lock_ext,
            "{ended_by_yield} of {lock_ext} lock extensions ended at the guest's yield: \
             {after:?}; backend {backend:?}"
        );
        assert!(backend.notices_written > 0, "{backend:?}");
    }
}
