//! The sched_ext backend end to end: pvschedd loads pvsched's own sched_ext
//! scheduler for the whole host, in the KVM host VM (`crates/hostvm`; its
//! kernel has sched_ext, this machine's has not), and serves a real fake
//! VMM process through it. Each test runs itself inside the host VM
//! ([`kvm_test!`]).
//!
//! What is asserted is behaviour (the kernel's sched_ext state, the
//! scheduler's own counters, the thread's parameters), never a time.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use pvsched_host::backend::sched_ext::kernel_state;
use pvsched_host::events::wire::{PVS_SCX_CUT_DAEMON, PVS_SCX_CUT_GRANT};
use pvsched_hostvm::kvm_test;
use pvsched_vmtest::wait_until;
use support::{params, tempdir, vm_name, Daemon, FakeVmm, FakeVmmConfig};

mod support;

const CS_HARDIRQ: u32 = 1 << 1;

/// A fake VMM with one vCPU thread named like KVM's, confined to CPU 0 with
/// everything else a test starts there, and the config serving it.
fn vmm(
    dir: &Path,
    name: &str,
    fifo: Option<u32>,
    cs: Option<u32>,
    spin: bool,
) -> (FakeVmm, String) {
    let mut c = one_vcpu_on_cpu0();
    c.guest_fifo = fifo;
    c.guest_cs = cs;
    c.spin = spin;
    support::qmp_vm(dir, name, c)
}

/// A fake VMM config: one vCPU thread named like KVM's, confined to CPU 0.
fn one_vcpu_on_cpu0() -> FakeVmmConfig {
    let mut c = FakeVmmConfig::new(Path::new(""));
    c.vcpus = 1;
    c.name_format = "CPU {}/KVM".into();
    c.wrapper = vec!["taskset".into(), "-c".into(), "0".into()];
    c
}

/// Waits until the scheduler has boosted vCPU 0 by its own decision (the
/// guest's RT work; a host hog on its CPU makes each wakeup an enqueue).
fn wait_kernel_boosted(d: &Daemon) {
    wait_until(Duration::from_secs(20), Duration::from_millis(20), || {
        (d.status().vms[0].vcpus[0].scx_kernel_boosts >= 5).then_some(())
    })
    .unwrap_or_else(|| panic!("never boosted; status {:?}; log:\n{}", d.status(), d.log()));
}

/// pvschedd on the sched_ext backend (it must load), `daemon` more keys.
fn sched_ext_daemon(dir: &Path, daemon: &str, rest: &str) -> Daemon {
    let d = Daemon::start(dir, &format!("backend = \"sched_ext\"\n{daemon}\n{rest}"));
    let b = d.status().backend;
    assert_eq!(b.active, "sched_ext", "backend {b:?}; log:\n{}", d.log());
    d
}

/// A busy loop on CPU 0, killed when dropped.
struct Hog(Child);

impl Hog {
    fn on_cpu0() -> Self {
        Self::on_cpu(0)
    }

    fn on_cpu(cpu: u32) -> Self {
        Hog(Command::new("taskset")
            .args(["-c", &cpu.to_string(), "sh", "-c", "while :; do :; done"])
            .spawn()
            .expect("start a host hog"))
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

kvm_test! {
    /// Load, serve and unload: while pvschedd runs, the kernel runs its
    /// scheduler (`pvsched`) and a boost lives in the scheduler's grant, not
    /// in the thread's kernel parameters; once it stops, sched_ext is off
    /// again, the thread has the parameters it started with and no state
    /// file is left.
    fn sched_ext_backend_loads_serves_and_leaves_nothing_behind() {
        let dir = tempdir("scx-load");
        let name = vm_name("scx-load");
        let (vmm, entry) = vmm(&dir, &name, Some(10), None, false);
        let tid = vmm.tids[0];
        let before = params(tid);
        assert_eq!(kernel_state().as_deref(), Some("disabled"));

        let mut d = sched_ext_daemon(&dir, "", &entry);
        d.wait_serving(&name, 1);
        assert_eq!(kernel_state().as_deref(), Some("enabled"));
        let ops = std::fs::read_to_string("/sys/kernel/sched_ext/root/ops").unwrap_or_default();
        assert_eq!(ops.trim(), "pvsched");
        // The guest says a FIFO task runs: boosted, by the scheduler.
        let hog = Hog::on_cpu0();
        wait_kernel_boosted(&d);
        drop(hog);
        assert!(!params(tid).is_rt(), "the kernel must keep the thread fair: {}", params(tid));

        let exit = d.signal(libc::SIGTERM);
        assert!(exit.success(), "pvschedd exit {exit:?}; log:\n{}", d.log());
        wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
            (kernel_state().as_deref() == Some("disabled")).then_some(())
        })
        .unwrap_or_else(|| panic!("sched_ext still {:?} after pvschedd stopped", kernel_state()));
        assert!(params(tid).same_setting(&before), "{} != {}", params(tid), before);
        assert!(!d.state_file().exists(), "state file left");
    }
}

kvm_test! {
    /// The kernel ends the scheduler (`sysrq-S`, as its watchdog or an error
    /// would): pvschedd says why, falls back to the rt backend and keeps
    /// serving the VM, whose boost is now the RT class's. Its event thread,
    /// which the scheduler ran ahead of every boost outside the RT class
    /// (where the host's RT tasks pushed it between CPUs), is SCHED_FIFO
    /// again, above the boosts it now applies in the RT class.
    fn sched_ext_ejected_by_the_kernel_falls_back_to_rt_and_keeps_serving() {
        let dir = tempdir("scx-eject");
        let name = vm_name("scx-eject");
        let (vmm, entry) = vmm(&dir, &name, Some(10), None, false);
        let tid = vmm.tids[0];
        let d = sched_ext_daemon(&dir, "", &entry);
        d.wait_serving(&name, 1);
        let _hog = Hog::on_cpu0();
        wait_kernel_boosted(&d);
        // The main thread is the event thread.
        let event_thread = params(d.pid());
        assert!(!event_thread.is_rt(), "event thread in the RT class under the scheduler: {event_thread}");

        std::fs::write("/proc/sys/kernel/sysrq", "1").expect("enable sysrq");
        std::fs::write("/proc/sysrq-trigger", "S").expect("sysrq-S");

        let b = wait_until(Duration::from_secs(20), Duration::from_millis(20), || {
            let b = d.status().backend;
            (b.active == "rt").then_some(b)
        })
        .unwrap_or_else(|| panic!("no fallback; log:\n{}", d.log()));
        assert_eq!(b.fallbacks, 1);
        let note = b.note.unwrap_or_default();
        assert!(note.contains("sched_ext"), "{note}");
        assert!(d.log().contains("falling back to the rt backend"), "{}", d.log());
        wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
            params(tid).is_rt().then_some(())
        })
        .unwrap_or_else(|| panic!("the boost did not move to the RT class: {}; log:\n{}", params(tid), d.log()));
        assert_eq!(d.status().vms.len(), 1, "the VM must still be served");
        let event_thread = params(d.pid());
        assert!(
            event_thread.policy == libc::SCHED_FIFO as u32 && event_thread.priority > params(tid).priority,
            "event thread {event_thread} not SCHED_FIFO above the boost {}; log:\n{}",
            params(tid),
            d.log()
        );
    }
}

kvm_test! {
    /// A boosted vCPU thread that wakes on a CPU where a host hog runs
    /// preempts the hog at once (the scheduler's own count), and keeps
    /// running its 1 ms periods although the hog never sleeps.
    fn sched_ext_boosted_vcpu_preempts_a_host_hog() {
        let dir = tempdir("scx-preempt");
        let name = vm_name("scx-preempt");
        let (_vmm, entry) = vmm(&dir, &name, Some(10), None, false);
        let d = sched_ext_daemon(&dir, "", &entry);
        d.wait_serving(&name, 1);
        let _hog = Hog::on_cpu0();

        let v = wait_until(Duration::from_secs(30), Duration::from_millis(50), || {
            let v = d.status().vms[0].vcpus[0].clone();
            // Until the first scan finds its slot the daemon decides the boost itself.
            (v.scx_boost_preempts >= 20 && v.scx_kernel_boosts >= 20).then_some(v)
        })
        .unwrap_or_else(|| {
            panic!(
                "the boosted vCPU did not preempt the hog: {:?} {:?}; log:\n{}",
                d.status().backend,
                d.status().vms[0].vcpus[0],
                d.log()
            )
        });
        // The scheduler's own decision: the daemon decides no guest RT boost here.
        assert!(v.scx_kernel_boosts >= 20 && !v.params.is_rt(), "boost: {:?}", v);
        let b = d.status().backend;
        assert!(b.boost_preempts >= 20);
        // The program timed each boosted wakeup to its run.
        assert!(b.queued_to_run_boosted.count >= 20, "{b:?}");
        assert!(b.queued_to_run_boosted.p50_us > 0.0, "{b:?}");
    }
}

kvm_test! {
    /// A task that sleeps often, woken on a CPU where a host hog runs,
    /// preempts the hog (its virtual time is far behind the hog's) with
    /// `scx_wakeup_preempt_us` at its default; turned off (0), no woken
    /// task preempts and each waits for the hog's slice to end.
    fn sched_ext_a_woken_sleeper_preempts_a_hog_unless_turned_off() {
        for (us, preempts) in [(1000, true), (0, false)] {
            let dir = tempdir(&format!("scx-wakeup-{us}"));
            let d = sched_ext_daemon(
                &dir,
                &format!("scx_wakeup_preempt_us = {us}"),
                "[discovery]\nauto = false\n",
            );
            let _hog = Hog::on_cpu0();
            let _sleeper = Hog(Command::new("taskset")
                .args(["-c", "0", "sh", "-c", "while :; do sleep 0.01; done"])
                .spawn()
                .expect("start a sleeper"));

            // Turned off, 5 s of a sleeper's wakeups show none.
            let within = Duration::from_secs(if preempts { 20 } else { 5 });
            let seen = wait_until(within, Duration::from_millis(100), || {
                (d.status().backend.wakeup_preempts >= 20).then_some(())
            });
            let b = d.status().backend;
            if preempts {
                assert!(seen.is_some(), "no wakeup preemption: {b:?}; log:\n{}", d.log());
            } else {
                assert_eq!(b.wakeup_preempts, 0, "{b:?}");
                assert!(b.enqueues > 100, "the scheduler ran: {b:?}");
            }
        }
    }
}

kvm_test! {
    /// Each CPU runs from its own queue, but three hogs on the host VM's two
    /// CPUs still share them evenly: a CPU whose own tasks ran ahead by more
    /// than a slice of virtual time takes the oldest from the other (counted),
    /// so none of them keeps a CPU to itself.
    fn sched_ext_per_cpu_queues_share_the_machine_evenly_among_more_tasks_than_cpus() {
        let dir = tempdir("scx-balance");
        let d = sched_ext_daemon(&dir, "", "[discovery]\nauto = false\n");
        let hogs: Vec<Hog> = (0..3)
            .map(|_| {
                Hog(Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
                    .expect("start a hog"))
            })
            .collect();
        std::thread::sleep(Duration::from_secs(1));
        let before: Vec<u64> = hogs.iter().map(|h| cpu_ticks(h.0.id())).collect();
        let pulls_before = d.status().backend.fair_pulls;

        std::thread::sleep(Duration::from_secs(6));

        let got: Vec<u64> = hogs
            .iter()
            .zip(&before)
            .map(|(h, b)| cpu_ticks(h.0.id()) - b)
            .collect();
        let b = d.status().backend;
        let (min, max) = (got.iter().min().unwrap(), got.iter().max().unwrap());
        // Even: 2/3 of a CPU each; one hog alone on a CPU would have 2x the others.
        assert!(*min as f64 >= 0.75 * *max as f64, "ticks per hog {got:?}: {b:?}");
        assert!(b.fair_pulls > pulls_before, "no task taken from another CPU: {b:?}");
    }
}

kvm_test! {
    /// A guest that claims a critical section all the time, on a busy CPU:
    /// at its slice ends the scheduler extends it, one extension of
    /// `scx_extension_us` per slice, until its allowance (a share of its
    /// time plus a burst of two) is spent; then it refuses, and the time
    /// granted never exceeds the allowance.
    fn sched_ext_extends_a_vcpu_in_a_critical_section_only_within_its_allowance() {
        let dir = tempdir("scx-extend");
        let name = vm_name("scx-extend");
        let (_vmm, entry) = vmm(&dir, &name, None, Some(CS_HARDIRQ), true);
        // The allowance starts when the daemon first sees the vCPU, after this.
        let start = Instant::now();
        let d = sched_ext_daemon(
            &dir,
            "scx_extension_us = 4000\nscx_extension_share_permille = 50",
            &format!("[defaults]\nhonor_critical_sections = false\n{entry}"),
        );
        d.wait_serving(&name, 1);
        let _hog = Hog::on_cpu0();

        let v = wait_until(Duration::from_secs(60), Duration::from_millis(50), || {
            let v = d.status().vms[0].vcpus[0].clone();
            (v.scx_extensions >= 2 && v.scx_extensions_refused >= 10).then_some(v)
        })
        .unwrap_or_else(|| {
            panic!(
                "no extension, or none refused: {:?}; log:\n{}",
                d.status().vms[0].vcpus[0],
                d.log()
            )
        });
        let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
        // 5 % of the time since it was served and a burst of two 4 ms
        // extensions.
        let bound = 0.05 * elapsed_ms + 8.0;
        assert!(v.scx_extended_ms <= bound, "{} ms extended > {bound} ms: {v:?}", v.scx_extended_ms);
        // Always in its section: every extension runs its 4 ms (the one
        // running as the status is read is charged when it ends).
        let whole = v.scx_extensions as f64 * 4.0;
        assert!(v.scx_extended_ms <= whole + 1e-6, "{v:?}");
        assert!(v.scx_extended_ms >= whole - 4.0 - 1e-6, "{v:?}");
        assert!(!v.params.is_rt(), "critical sections are not honoured as boosts here: {v:?}");
    }
}

kvm_test! {
    /// A vCPU alone on its CPU is not extended: with nothing waiting for
    /// the CPU, the dispatch keeps it running at its slice end anyway, and
    /// an extension would only spend its allowance and poll its slot. A
    /// guest in a critical section all the time spins on CPU 0: alone,
    /// its slice ends are counted uncontended and almost none is extended;
    /// with a host hog beside it, they are.
    fn sched_ext_extends_no_vcpu_that_nothing_waits_to_preempt() {
        let dir = tempdir("scx-unwaited");
        let name = vm_name("scx-unwaited");
        let (_vmm, entry) = vmm(&dir, &name, None, Some(CS_HARDIRQ), true);
        let d = sched_ext_daemon(
            &dir,
            "scx_extension_us = 4000\nscx_extension_share_permille = 500",
            &format!("[defaults]\nhonor_critical_sections = false\n{entry}"),
        );
        d.wait_serving(&name, 1);
        let uncontended = || d.status().backend.slice_ends_uncontended;

        let u0 = uncontended();
        let (alone, _, _) = extensions_over(&d, 2);
        let alone_ends = uncontended() - u0;
        let _hog = Hog::on_cpu0();
        std::thread::sleep(Duration::from_millis(200));
        let (beside, _, _) = extensions_over(&d, 2);
        eprintln!(
            "alone: {alone} extensions, {alone_ends} uncontended slice ends; beside a hog: \
             {beside} extensions"
        );

        // 2 s of 5 ms slices: about 400 slice ends, a few with a kernel
        // thread waiting.
        assert!(alone_ends >= 100, "{alone_ends} uncontended slice ends: {:?}", d.status().backend);
        assert!(alone <= 20, "{alone} extensions with nothing waiting; log:\n{}", d.log());
        assert!(beside >= 30, "{beside} extensions beside a hog: {:?}", d.status().backend);
    }
}

/// What vCPU 0 of the daemon's first VM did over `secs` seconds: its
/// counters' growth (extensions, ms extended, and the ones a test names).
struct VcpuGrowth {
    a: pvsched_control::VcpuStatus,
    b: pvsched_control::VcpuStatus,
}

impl VcpuGrowth {
    fn over(d: &Daemon, secs: u64) -> Self {
        let v = || d.status().vms[0].vcpus[0].clone();
        let a = v();
        std::thread::sleep(Duration::from_secs(secs));
        VcpuGrowth { a, b: v() }
    }

    fn of(&self, field: fn(&pvsched_control::VcpuStatus) -> u64) -> u64 {
        field(&self.b) - field(&self.a)
    }

    fn extensions(&self) -> u64 {
        self.of(|v| v.scx_extensions)
    }

    fn extended_ms(&self) -> f64 {
        self.b.scx_extended_ms - self.a.scx_extended_ms
    }
}

/// The extensions of vCPU 0 of the daemon's first VM over `secs` seconds:
/// (granted, ended early, ms they ran).
fn extensions_over(d: &Daemon, secs: u64) -> (u64, u64, f64) {
    let g = VcpuGrowth::over(d, secs);
    (
        g.extensions(),
        g.of(|v| v.scx_extensions_ended_early),
        g.extended_ms(),
    )
}

kvm_test! {
    /// An extension ends at the guest's first lock-free point: a guest
    /// that is in a critical section for the first 1.5 ms of every 3.1 ms, on a
    /// busy CPU, is extended at its slice ends; with the extension's poll
    /// (`scx_extension_poll_us`) the scheduler reads its slot again while
    /// the extension runs and takes the CPU back once the section is over,
    /// charging what it ran (well under the 4 ms extension); without it,
    /// each extension runs its whole length into the next section.
    fn sched_ext_ends_an_extension_when_the_guest_leaves_its_critical_section() {
        let dir = tempdir("scx-ext-poll");
        let name = vm_name("scx-ext-poll");
        let mut c = one_vcpu_on_cpu0();
        c.guest_cs = Some(CS_HARDIRQ);
        // A period the 4 ms tick does not divide: ticks fall at every phase.
        c.guest_cs_duty = Some((1500, 3100));
        c.spin = true;
        let (_vmm, entry) = support::qmp_vm(&dir, &name, c);
        let _hog = Hog::on_cpu0();
        let keys = "scx_extension_us = 4000\nscx_extension_share_permille = 500";
        let rest = format!("[defaults]\nhonor_critical_sections = false\n{entry}");

        let mut d = sched_ext_daemon(&dir, &format!("{keys}\nscx_extension_poll_us = 0"), &rest);
        d.wait_serving(&name, 1);
        let (granted, early, ms) = extensions_over(&d, 3);
        eprintln!("without the poll: {granted} extensions, {early} ended early, {ms:.1} ms");
        assert!(granted >= 20, "{granted} extensions in 3 s; log:\n{}", d.log());
        assert_eq!(early, 0, "no poll, none ended early");
        // Each runs its length (one stopped sooner by a higher class may run less).
        assert!(ms >= 3.5 * granted as f64, "{ms} ms for {granted} extensions of 4 ms");
        assert!(d.signal(libc::SIGTERM).success(), "{}", d.log());

        let d = sched_ext_daemon(&dir, &format!("{keys}\nscx_extension_poll_us = 250"), &rest);
        d.wait_serving(&name, 1);
        let (granted, early, ms) = extensions_over(&d, 3);
        eprintln!("with the poll: {granted} extensions, {early} ended early, {ms:.1} ms");
        assert!(granted >= 20, "{granted} extensions in 3 s; log:\n{}", d.log());
        // The section ends within 1.5 ms of any instant: most end early, and
        // the time they run is about half of what whole ones would.
        assert!(
            early * 2 >= granted,
            "{early} of {granted} extensions ended early: {:?}",
            d.status().backend
        );
        assert!(
            ms <= 2.5 * granted as f64,
            "{ms:.1} ms for {granted} extensions: they ran on past the section's end"
        );
        assert!(ms <= 4.0 * granted as f64 + 1e-6, "charged over the extension's length");
    }
}

/// Over `secs` seconds, vCPU 0 of the daemon's first VM: (extensions,
/// tails, tails ended early, preempted holding a lock after an
/// extension, ms extended).
fn tails_over(d: &Daemon, secs: u64) -> (u64, u64, u64, u64, f64) {
    let g = VcpuGrowth::over(d, secs);
    (
        g.extensions(),
        g.of(|v| v.scx_extension_tails),
        g.of(|v| v.scx_extension_tails_ended_early),
        g.of(|v| v.scx_holder_preempted_extended),
        g.extended_ms(),
    )
}

kvm_test! {
    /// A holder that takes lock after lock is out of its locks for 150 µs
    /// of every 1.1 ms, beside a hog on its CPU, its extensions polled
    /// every 1 ms: most polls miss the gaps, and without a tail
    /// (`scx_extension_tail_us = 0`) about half the extensions run out with
    /// the lock held, the holder preempted in it. With the tail, such an
    /// extension goes on, its slot read every 50 µs (every ~120 µs in the
    /// host VM), and ends at the next gap: far fewer holders are preempted
    /// in the lock, and none runs past its extension and tail.
    fn sched_ext_a_holder_still_in_its_lock_when_its_extension_runs_out_is_preempted_at_its_next_gap() {
        let dir = tempdir("scx-tail");
        let name = vm_name("scx-tail");
        let mut c = one_vcpu_on_cpu0();
        c.guest_cs = Some(pvsched_abi::CS_LOCK);
        c.guest_cs_duty = Some((950, 1100));
        c.spin = true;
        let (_vmm, entry) = support::qmp_vm(&dir, &name, c);
        let _hog = Hog::on_cpu0();
        let keys = "scx_extension_us = 4000\nscx_extension_share_permille = 500\n\
                    scx_extension_poll_us = 1000";
        let rest = format!(
            "[defaults]\nhonor_lock_holders = true\n{entry}[vm.limits]\nhonor_lock_holders = true\n"
        );

        let mut d = sched_ext_daemon(&dir, &format!("{keys}\nscx_extension_tail_us = 0"), &rest);
        d.wait_serving(&name, 1);
        let (granted, tails, _, whole_a, _) = tails_over(&d, 3);
        eprintln!("without tails: {granted} extensions, {whole_a} holders preempted after one");
        assert!(granted >= 20, "{granted} extensions in 3 s; log:\n{}", d.log());
        assert_eq!(tails, 0, "tails off, none granted");
        assert!(whole_a * 4 >= granted, "{whole_a} of {granted} ran out in the lock: the setup");
        let rate_a = whole_a as f64 / granted as f64;
        assert!(d.signal(libc::SIGTERM).success(), "{}", d.log());

        let d = sched_ext_daemon(
            &dir,
            &format!("{keys}\nscx_extension_tail_us = 1000\nscx_extension_tail_poll_us = 50"),
            &rest,
        );
        d.wait_serving(&name, 1);
        let (granted, tails, tails_early, whole_b, ms) = tails_over(&d, 3);
        eprintln!(
            "with tails: {granted} extensions, {tails} tails, {tails_early} ended at a gap, \
             {whole_b} holders preempted after one, {ms:.1} ms"
        );
        assert!(granted >= 20, "{granted} extensions in 3 s; log:\n{}", d.log());
        assert!(tails * 5 >= granted, "{tails} tails for {granted} extensions: {:?}", d.status().backend);
        assert!(tails_early * 2 >= tails, "{tails_early} of {tails} tails ended at a gap");
        let rate_b = whole_b as f64 / granted as f64;
        assert!(
            rate_b <= 0.5 * rate_a,
            "holders preempted in the lock after an extension: {rate_b:.2} per extension with \
             tails, {rate_a:.2} without"
        );
        assert!(ms <= 5.0 * granted as f64 + 1e-6, "charged over the extension and tail: {ms} ms");
    }
}

/// A two-vCPU fake VMM on CPU 0, both threads spinning, whose vCPU 1
/// publishes a mutex wait naming vCPU 0 as the holder, all the time.
fn lock_vmm(dir: &Path, name: &str) -> (FakeVmm, String) {
    let mut c = one_vcpu_on_cpu0();
    c.vcpus = 2;
    c.spin = true;
    c.guest_lock_wait = Some((1, 0));
    support::qmp_vm(dir, name, c)
}

/// Lock extensions so far: the holder's, the waiter's, and the holder's
/// status.
fn lock_extensions(d: &Daemon) -> (u64, u64, pvsched_control::VcpuStatus) {
    let vm = d.status().vms[0].clone();
    let holder = vm.vcpus[0].clone();
    (
        holder.scx_lock_extensions,
        vm.vcpus[1].scx_lock_extensions,
        holder,
    )
}

kvm_test! {
    /// A lock holder's preemptions do not wake pvschedd on the sched_ext
    /// backend (they are queued for its next wakeup): the scheduler extends it at the preemption itself and the
    /// policy extends no holder after the fact, so the records of a vCPU a
    /// published wait names are queued for the next scan. They woke the
    /// daemon, whose event thread runs ahead of every vCPU, and those
    /// wakeups were most of the holders' preemptions before their slice end
    /// (BENCHMARKS.md, LH33).
    fn sched_ext_a_waited_on_vcpus_preemptions_do_not_wake_the_daemon() {
        let dir = tempdir("scx-lock-quiet");
        let name = vm_name("scx-lock-quiet");
        let (_vmm, entry) = lock_vmm(&dir, &name);
        let _hog = Hog::on_cpu0();
        let d = sched_ext_daemon(
            &dir,
            "",
            &format!("[defaults]\nhonor_lock_holders = true\n{entry}"),
        );
        d.wait_serving(&name, 2);
        // The wait is read at a scan: vCPU 0 is waited on from then on.
        std::thread::sleep(Duration::from_millis(1000));
        let preempted = || d.metric("pvsched_events_total{kind=\"preempted\"}");
        let lazy = || d.metric("pvsched_bpf_lazy_records");
        let (p0, l0) = (preempted(), lazy());
        std::thread::sleep(Duration::from_secs(3));
        let (p, l) = (preempted() - p0, lazy() - l0);
        eprintln!("{p} preemptions, {l} records queued without a wakeup");
        // Beside a hog on one CPU the two spinning vCPUs are preempted at
        // every slice end: hundreds in 3 s, half of them vCPU 0's.
        assert!(p >= 100.0, "{p} preemptions in 3 s; log:\n{}", d.log());
        // Every preemption is queued quietly, the holder's too (before: only
        // vCPU 1's, about half). The switch-ins that end them still wake it:
        // the host half shows a lock guest's waiters the holder preempted.
        assert!(
            l >= 0.9 * p,
            "{l} records queued quietly for {p} preemptions; log:\n{}",
            d.log()
        );
    }
}

kvm_test! {
    /// Lock holders at the preemption: a vCPU that another vCPU of its VM
    /// waits on (the waiter's slot names it) keeps its CPU at its slice ends
    /// for an extension, read by the scheduler from the waiter's slot at that
    /// instant, only with `honor_lock_holders`; the waiter, named by no one,
    /// gets none; the extensions stay within the allowance, and their time
    /// is charged to the holder's vtime and repaid: beside the waiter and a
    /// hog on one CPU the extended holder takes its third of it (with its
    /// vtime left uncharged for an extended slice it took 66 %).
    fn sched_ext_extends_a_lock_holder_at_its_slice_end_charged_and_repaid() {
        let dir = tempdir("scx-lock");
        let name = vm_name("scx-lock");
        let (vmm, entry) = lock_vmm(&dir, &name);
        let keys = "scx_extension_us = 4000\nscx_extension_share_permille = 500";
        let hog = Hog::on_cpu0();

        // Without lock handling: no extension for the named holder.
        let mut d = sched_ext_daemon(
            &dir,
            keys,
            &format!("[defaults]\nhonor_lock_holders = false\n{entry}"),
        );
        d.wait_serving(&name, 2);
        std::thread::sleep(Duration::from_millis(1500));
        let (holder, waiter, status) = lock_extensions(&d);
        assert_eq!((holder, waiter), (0, 0), "without honor_lock_holders: {status:?}");
        assert_eq!(d.status().backend.lock_extensions, 0);
        assert!(d.signal(libc::SIGTERM).success(), "{}", d.log());

        let start = Instant::now();
        let d = sched_ext_daemon(
            &dir,
            keys,
            &format!("[defaults]\nhonor_lock_holders = true\n{entry}"),
        );
        d.wait_serving(&name, 2);
        let (pid, tids) = (vmm.pid as u32, vmm.tids.clone());
        let ticks = |tid| thread_ticks(pid, tid);
        let (h0, w0, c0) = (ticks(tids[0]), ticks(tids[1]), cpu_ticks(hog.0.id()));
        std::thread::sleep(Duration::from_secs(4));
        let (h1, w1, c1) = (ticks(tids[0]), ticks(tids[1]), cpu_ticks(hog.0.id()));
        let (holder, waiter, status) = lock_extensions(&d);
        let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;

        // About one per turn of the three threads (~15 ms): hundreds in 4 s.
        assert!(holder >= 20, "holder extended {holder} times: {status:?}; log:\n{}", d.log());
        assert_eq!(waiter, 0, "the waiter is named by no one");
        assert_eq!(status.scx_extensions, holder, "no critical section claimed: {status:?}");
        // 50 % of the time since it was served and the burst: two extensions
        // and half a scan interval (the allowance is raised at each scan).
        let scan_ns = pvsched_host::config::DaemonConfig::default().scx_scan_interval_us * 1000;
        let burst_ms = pvsched_policy::extension_burst_ns(4_000_000, 500, scan_ns) as f64 / 1e6;
        let bound = 0.5 * elapsed_ms + burst_ms;
        assert!(status.scx_extended_ms <= bound, "{status:?} over {bound} ms");
        // Charged in vtime: the holder's share of CPU 0 stays near a third.
        let total = (h1 - h0) + (w1 - w0) + (c1 - c0);
        let share = (h1 - h0) as f64 / total.max(1) as f64;
        eprintln!(
            "holder: {holder} lock extensions, {:.0} ms; CPU 0 ticks holder {} waiter {} hog {}",
            status.scx_extended_ms,
            h1 - h0,
            w1 - w0,
            c1 - c0
        );
        assert!(
            share < 0.40,
            "the holder took {:.0} % of CPU 0 beside the waiter ({} ticks) and a hog ({} \
             ticks): its extensions were not repaid",
            share * 100.0,
            w1 - w0,
            c1 - c0
        );
        // The scheduler's total counts the same extensions as the holder's
        // record. Both move while the VMM runs (and are read at different
        // instants), so compare them with the VMM stopped.
        // SAFETY: kill(2) on the fake VMM this test started; no memory involved.
        assert_eq!(unsafe { libc::kill(vmm.pid, libc::SIGSTOP) }, 0);
        let settled = wait_until(Duration::from_secs(5), Duration::from_millis(100), || {
            let s = d.status();
            let holder = s.vms[0].vcpus[0].scx_lock_extensions;
            (s.backend.lock_extensions == holder).then_some(holder)
        });
        // SAFETY: as above.
        unsafe { libc::kill(vmm.pid, libc::SIGCONT) };
        assert!(settled.is_some(), "totals differ from the holder's record: {:?}", d.status());
    }
}

kvm_test! {
    /// The lock-claiming rogue: a guest whose vCPU claims to hold a lock
    /// (`CS_LOCK`, offered with `honor_lock_holders`) all the time, spinning
    /// beside a host hog on one CPU. The scheduler extends it at slice ends as
    /// a lock holder, but no further than its allowance (5 % of its time and
    /// a burst), the time is charged to its vtime, and its boosts stay within
    /// the boost budget (10 % here): the hog keeps most of its fair half.
    fn sched_ext_holds_a_guest_that_always_claims_a_lock_to_its_allowance_and_budget() {
        let dir = tempdir("scx-lockrogue");
        let name = vm_name("scx-lockrogue");
        let (vmm, entry) = vmm(&dir, &name, None, Some(pvsched_abi::CS_LOCK), true);
        let start = Instant::now();
        let d = sched_ext_daemon(
            &dir,
            "scx_extension_us = 4000\nscx_extension_share_permille = 50",
            &format!(
                "[defaults]\nhonor_lock_holders = true\n{entry}[vm.limits]\n\
                 honor_lock_holders = true\nboost_share_permille = 100\n\
                 fairness_window_ns = 1_000_000_000\n"
            ),
        );
        d.wait_serving(&name, 1);
        let hog = Hog::on_cpu0();
        let (hog_pid, vmm_pid, tid) = (hog.0.id(), vmm.pid as u32, vmm.tids[0]);
        let (t0, c0, v0) = (Instant::now(), cpu_ticks(hog_pid), thread_ticks(vmm_pid, tid));
        let b0 = d.status().vms[0].boosted_s;

        let v = wait_until(Duration::from_secs(60), Duration::from_millis(50), || {
            let v = d.status().vms[0].vcpus[0].clone();
            (v.scx_lock_extensions >= 2 && v.scx_extensions_refused >= 10).then_some(v)
        })
        .unwrap_or_else(|| {
            panic!(
                "no lock extension, or none refused: {:?}; log:\n{}",
                d.status().vms[0].vcpus[0],
                d.log()
            )
        });
        std::thread::sleep(Duration::from_secs(4).saturating_sub(t0.elapsed()));
        let secs = t0.elapsed().as_secs_f64();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let hog_share = (cpu_ticks(hog_pid) - c0) as f64 / hz / secs;
        let ran = (thread_ticks(vmm_pid, tid) - v0) as f64 / hz;
        let boosted = d.status().vms[0].boosted_s - b0;
        let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
        let last = d.status().vms[0].vcpus[0].clone();

        assert_eq!(v.scx_lock_extensions, v.scx_extensions, "each one for the lock: {v:?}");
        let scan_ns = pvsched_host::config::DaemonConfig::default().scx_scan_interval_us * 1000;
        let burst_ms = pvsched_policy::extension_burst_ns(4_000_000, 50, scan_ns) as f64 / 1e6;
        let bound = 0.05 * elapsed_ms + burst_ms;
        assert!(last.scx_extended_ms <= bound, "{last:?} over {bound} ms");
        assert!(
            boosted <= 0.1 * secs + 0.1 + 0.25,
            "boosted {boosted:.3} s of {secs:.1} s at a 10 % budget; status {:?}",
            d.status().vms[0]
        );
        eprintln!(
            "lock rogue: {} lock extensions ({:.0} ms), {} refused; ran {ran:.2} s, boosted \
             {boosted:.2} s, hog {:.0} % of CPU 0 in {secs:.1} s",
            last.scx_lock_extensions,
            last.scx_extended_ms,
            last.scx_extensions_refused,
            hog_share * 100.0
        );
        assert!(
            hog_share > 0.3,
            "the hog got {:.0} % of its CPU beside a guest always claiming a lock; status {:?}",
            hog_share * 100.0,
            d.status().vms[0]
        );
    }
}

kvm_test! {
    /// Extension at the preemption: a vCPU whose guest shows a sleeping lock
    /// held (`CS_LOCK`, with lock holders honoured) spins on CPU 0, where
    /// another VM's vCPU with guest RT work wakes again and again, boosted by
    /// the scheduler at each wakeup. A boosted wakeup would preempt the
    /// holder: the holder runs one extension first, counted as a lock
    /// extension at the preemption, within its allowance, and is counted
    /// preempted holding a lock when it ends; the RT vCPU's boosts go on.
    fn sched_ext_lets_a_lock_holder_run_an_extension_before_a_boosted_vcpu_preempts_it() {
        let dir = tempdir("scx-lockpreempt");
        let (holder_name, rt_name) = (vm_name("scx-holder"), vm_name("scx-rtwaker"));
        let (_holder, holder_entry) =
            vmm(&dir, &holder_name, None, Some(pvsched_abi::CS_LOCK), true);
        let (_rt, rt_entry) = vmm(&dir, &rt_name, Some(10), None, false);
        let start = Instant::now();
        let d = sched_ext_daemon(
            &dir,
            "scx_extension_us = 2000\nscx_extension_share_permille = 100",
            &format!(
                "[defaults]\nhonor_lock_holders = true\n{holder_entry}{}",
                rt_entry.replace("[discovery]\nauto = false\n", "")
            ),
        );
        d.wait_serving(&holder_name, 1);
        d.wait_serving(&rt_name, 1);
        let vcpu = |name: &str| {
            let s = d.status();
            s.vms.iter().find(|v| v.name == name).map(|v| v.vcpus[0].clone())
        };
        let rt_boosts0 = vcpu(&rt_name).map_or(0, |v| v.scx_kernel_boosts);

        let held = wait_until(Duration::from_secs(60), Duration::from_millis(50), || {
            vcpu(&holder_name).filter(|v| v.scx_lock_extensions_at_preemption >= 5)
        })
        .unwrap_or_else(|| {
            panic!(
                "no lock extension at a boosted preemption: holder {:?}, RT vCPU {:?}; \
                 backend {:?}; log:\n{}",
                vcpu(&holder_name),
                vcpu(&rt_name),
                d.status().backend,
                d.log()
            )
        });
        let rt = vcpu(&rt_name).expect("the RT VM is served");
        let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
        let backend = d.status().backend;

        eprintln!(
            "holder: {} lock extensions, {} at a boosted preemption, {:.0} ms, {} refused; \
             preempted holding the lock: {} after an extension, {} at a slice end without, \
             {} before the slice end; RT vCPU: {} kernel boosts",
            held.scx_lock_extensions,
            held.scx_lock_extensions_at_preemption,
            held.scx_extended_ms,
            held.scx_extensions_refused,
            held.scx_holder_preempted_extended,
            held.scx_holder_preempted_unextended,
            held.scx_holder_preempted_early,
            rt.scx_kernel_boosts - rt_boosts0
        );
        assert!(
            held.scx_lock_extensions_at_preemption <= held.scx_lock_extensions
                && held.scx_lock_extensions <= held.scx_extensions,
            "{held:?}"
        );
        assert!(
            backend.lock_extensions_at_preemption >= held.scx_lock_extensions_at_preemption,
            "{backend:?}"
        );
        // The holder always shows a lock held: the boosted vCPU preempts it
        // when its extension ends, and the scheduler counts that.
        assert!(
            held.scx_holder_preempted_extended >= 1,
            "no holder preemption after an extension counted: {held:?}"
        );
        assert!(
            backend.holder_preempted_extended >= held.scx_holder_preempted_extended
                && backend.holder_preempted_unextended >= held.scx_holder_preempted_unextended
                && backend.holder_preempted_early >= held.scx_holder_preempted_early,
            "{backend:?} against {held:?}"
        );
        let scan_ns = pvsched_host::config::DaemonConfig::default().scx_scan_interval_us * 1000;
        let burst_ms = pvsched_policy::extension_burst_ns(2_000_000, 100, scan_ns) as f64 / 1e6;
        let bound = 0.1 * elapsed_ms + burst_ms;
        assert!(held.scx_extended_ms <= bound, "{held:?} over {bound} ms");
        assert!(
            rt.scx_kernel_boosts > rt_boosts0,
            "the RT vCPU was not boosted any more beside the holder: {rt:?}"
        );
    }
}

/// The times vCPU `v` was preempted holding a lock before its slice end by
/// `cut` (`enum pvs_scx_cut`).
fn early_by(v: &pvsched_control::VcpuStatus, cut: u32) -> u64 {
    let by = &v.scx_holder_preempted_early_by;
    by.get(cut as usize).copied().unwrap_or(0)
}

/// Pins the calling thread to `cpu`.
fn pin_self(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).expect("a CPU in the set");
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .expect("pin the test thread");
}

kvm_test! {
    /// pvschedd's event thread, which preempts where it wakes, is woken by
    /// status requests sent from either CPU in turn, while a VM's two vCPUs,
    /// whose guest holds a sleeping lock for 1.5 ms of every 3.1 ms, spin
    /// beside a host hog on each CPU. The lock flag the scheduler keeps for
    /// a CPU is as of its vCPU's last tick: a wakeup onto the CPU the daemon
    /// last ran on, from the other, went by a flag out of date about half
    /// the time and preempted a holder in its lock. Now the daemon goes to
    /// the waker's CPU (`daemon_moved`), where the flag of what runs is read
    /// at once, and preempts no holder in its lock.
    fn sched_ext_wakes_the_daemon_where_the_lock_flag_is_read_at_once() {
        let dir = tempdir("scx-daemon-where");
        let name = vm_name("scx-daemon-where");
        let mut c = FakeVmmConfig::new(Path::new(""));
        c.vcpus = 2;
        c.name_format = "CPU {}/KVM".into();
        c.guest_cs = Some(pvsched_abi::CS_LOCK);
        // A period the 4 ms tick does not divide: ticks fall at every phase.
        c.guest_cs_duty = Some((1500, 3100));
        c.spin = true;
        let (_vmm, entry) = support::qmp_vm(&dir, &name, c);
        let d = sched_ext_daemon(
            &dir,
            "",
            &format!("[defaults]\nhonor_lock_holders = true\n{entry}"),
        );
        d.wait_serving(&name, 2);
        let _hogs = (Hog::on_cpu(0), Hog::on_cpu(1));
        let by_daemon = || -> u64 {
            let vcpus = d.status().vms[0].vcpus.clone();
            vcpus.iter().map(|v| early_by(v, PVS_SCX_CUT_DAEMON)).sum()
        };
        std::thread::sleep(Duration::from_millis(500));
        let (moved0, daemon0) = (d.status().backend.daemon_moved, by_daemon());

        // Each status request wakes the daemon's event thread.
        let t0 = Instant::now();
        let mut requests = 0u64;
        while t0.elapsed() < Duration::from_secs(3) {
            pin_self((requests % 2) as usize);
            let _ = d.status();
            requests += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
        pin_self(0);
        let (backend, daemon) = (d.status().backend, by_daemon() - daemon0);
        let moved = backend.daemon_moved - moved0;

        eprintln!(
            "{requests} status requests; daemon wakeups sent to the waker's CPU: {moved}; \
             holders preempted in their lock by the daemon: {daemon}"
        );
        assert!(
            daemon * 50 <= requests,
            "the daemon preempted a holder in its lock {daemon} times for {requests} wakeups: \
             {backend:?}"
        );
        assert!(
            moved * 4 >= requests,
            "the daemon was not sent to the waker's CPU: {backend:?}; log:\n{}",
            d.log()
        );
    }
}

/// Confines thread `tid` to `cpu`.
fn pin_thread(tid: i32, cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).expect("a CPU in the set");
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set).expect("pin a thread");
}

kvm_test! {
    /// A holder preempted in its lock for pvschedd's event thread runs again
    /// right after it, for what its slice had left, instead of waiting
    /// behind the task the fair queue has next: the event thread runs
    /// briefly, and the holder's turn was not over. A VM's one vCPU, whose
    /// guest always shows a sleeping lock held, spins beside a host hog on
    /// CPU 0, with no extension allowance beyond the first burst (so the
    /// daemon's wakeups preempt it); the daemon's event thread is confined
    /// to CPU 0 and woken by status requests from CPU 1. Before, every such holder went
    /// back to the fair queue, behind the hog's slice.
    fn sched_ext_a_holder_preempted_for_the_daemon_runs_again_right_after_it() {
        let dir = tempdir("scx-daemon-resume");
        let name = vm_name("scx-daemon-resume");
        let mut c = one_vcpu_on_cpu0();
        c.guest_cs = Some(pvsched_abi::CS_LOCK);
        c.spin = true;
        let (_vmm, entry) = support::qmp_vm(&dir, &name, c);
        let d = sched_ext_daemon(
            &dir,
            "scx_extension_us = 4000\nscx_extension_share_permille = 0",
            &format!("[defaults]\nhonor_lock_holders = true\n{entry}"),
        );
        d.wait_serving(&name, 1);
        // The event thread is pvschedd's main thread; its control thread,
        // which wakes it for each request, stays free to run on CPU 1.
        pin_thread(d.pid(), 0);
        let _hog = Hog::on_cpu0();
        let holder = || d.status().vms[0].vcpus[0].clone();
        // The first burst of extensions spent: every one after is refused.
        wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
            (holder().scx_extensions_refused >= 5).then_some(())
        })
        .unwrap_or_else(|| panic!("no extension refused: {:?}; log:\n{}", holder(), d.log()));
        let before = holder();

        // Each status request wakes the daemon's event thread on CPU 0.
        pin_self(1);
        let t0 = Instant::now();
        let mut requests = 0u64;
        while t0.elapsed() < Duration::from_secs(3) {
            let _ = d.status();
            requests += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
        pin_self(0);
        let after = holder();
        let by_daemon =
            early_by(&after, PVS_SCX_CUT_DAEMON) - early_by(&before, PVS_SCX_CUT_DAEMON);
        let resumed = after.scx_holders_resumed - before.scx_holders_resumed;
        // Its waits to run again: after the daemon's preemptions, against
        // those after its slice ends, behind the hog's slice.
        let early = after.scx_holder_preempted_early - before.scx_holder_preempted_early;
        let at_end =
            after.scx_holder_preempted_unextended - before.scx_holder_preempted_unextended;
        let early_ms =
            after.scx_holder_preempted_early_ms - before.scx_holder_preempted_early_ms;
        let at_end_ms =
            after.scx_holder_preempted_unextended_ms - before.scx_holder_preempted_unextended_ms;

        eprintln!(
            "{requests} status requests; holder preempted in its lock by the daemon: \
             {by_daemon}, of them resumed right after it: {resumed}; waited {early_ms:.1} ms \
             after {early} preemptions before its slice end, {at_end_ms:.1} ms after {at_end} \
             at its slice end"
        );
        // The holder runs about half of CPU 0: about half the wakeups find it.
        assert!(
            by_daemon * 10 >= requests,
            "the daemon preempted the holder {by_daemon} times for {requests} wakeups: {after:?}"
        );
        assert!(
            resumed <= by_daemon && resumed * 10 >= by_daemon * 9,
            "{resumed} of {by_daemon} holders preempted for the daemon ran again right after \
             it: {after:?}; log:\n{}",
            d.log()
        );
        // A turn behind the hog is a slice; right after the daemon, a
        // fraction of one (7.0 against 0.7 ms a wait; with the holder put
        // back in the fair queue, 6.7 against 3.0).
        assert!(
            at_end > 0 && early > 0 && early_ms / early as f64 * 4.0 < at_end_ms / at_end as f64,
            "waits after the daemon's preemptions ({early_ms:.1} ms for {early}) not shorter \
             than after slice ends ({at_end_ms:.1} ms for {at_end}): {after:?}"
        );
    }
}

kvm_test! {
    /// A VM's vCPUs kept apart: a 2-vCPU VM whose vCPU 0 spins and whose
    /// vCPU 1 wakes every millisecond, beside a host hog on each CPU (no CPU
    /// is ever idle). A wakeup of vCPU 1 where vCPU 0 runs goes to the other
    /// CPU (`vcpus_spread`); with `scx_spread_vm_vcpus = false` none does.
    fn sched_ext_sends_a_waking_vcpu_away_from_the_cpu_its_sibling_runs_on() {
        let run = |spread: bool| {
            let dir = tempdir(if spread { "scx-spread" } else { "scx-nospread" });
            let name = vm_name("scx-spread");
            let mut c = FakeVmmConfig::new(Path::new(""));
            c.vcpus = 2;
            c.name_format = "CPU {}/KVM".into();
            c.spin_first = Some(1);
            let (_vmm, entry) = support::qmp_vm(&dir, &name, c);
            let d = sched_ext_daemon(&dir, &format!("scx_spread_vm_vcpus = {spread}"), &entry);
            d.wait_serving(&name, 2);
            let _hogs = (Hog::on_cpu(0), Hog::on_cpu(1));
            let spread_now = || d.status().backend.vcpus_spread;
            let before = spread_now();
            let moved = wait_until(Duration::from_secs(5), Duration::from_millis(50), || {
                (spread_now() > before + 20).then_some(())
            });
            std::thread::sleep(Duration::from_secs(2));
            (moved.is_some(), spread_now() - before, d.status().backend)
        };

        let (moved, spread, backend) = run(true);
        let (_, kept, backend_off) = run(false);

        eprintln!("wakeups sent away from a sibling: {spread} (spreading off: {kept})");
        assert!(moved, "no waking vCPU sent away from its sibling: {backend:?}");
        assert_eq!(kept, 0, "spreading off, yet {kept} sent away: {backend_off:?}");
    }
}

/// CPU time (utime + stime) of process `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    stat_ticks(&format!("/proc/{pid}/stat"))
}

/// utime + stime of thread `tid` of process `pid`, clock ticks.
fn thread_ticks(pid: u32, tid: i32) -> u64 {
    stat_ticks(&format!("/proc/{pid}/task/{tid}/stat"))
}

fn stat_ticks(path: &str) -> u64 {
    let stat = std::fs::read_to_string(path).expect("stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0)
}

kvm_test! {
    /// A guest that asks for RT all the time, its vCPU spinning beside a
    /// host hog on one CPU: the scheduler boosts it only while the policy's
    /// budget grants it (10 % of its time here), so the hog keeps the fair
    /// half of the CPU for most of the time, the latch shows, and the time
    /// charged as boosted is within the budget and within the time the
    /// vCPU thread ran.
    fn sched_ext_holds_a_guest_that_always_asks_to_its_boost_budget() {
        let dir = tempdir("scx-greedy");
        let name = vm_name("scx-greedy");
        let (vmm, entry) = vmm(&dir, &name, Some(10), None, true);
        let d = sched_ext_daemon(
            &dir,
            "",
            &format!(
                "{entry}[vm.limits]\nboost_share_permille = 100\nfairness_window_ns = 1_000_000_000\n"
            ),
        );
        d.wait_serving(&name, 1);
        let hog = Hog::on_cpu0();
        let pid = hog.0.id();
        let (vmm_pid, tid) = (vmm.pid as u32, vmm.tids[0]);

        let (t0, c0, b0) = (Instant::now(), cpu_ticks(pid), d.status().vms[0].boosted_s);
        let v0 = thread_ticks(vmm_pid, tid);
        let mut latched = false;
        while t0.elapsed() < Duration::from_secs(4) {
            latched |= d.status().vms[0].in_debt;
            std::thread::sleep(Duration::from_millis(20));
        }
        let boosted = d.status().vms[0].boosted_s - b0;
        let secs = t0.elapsed().as_secs_f64();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let hog_share = (cpu_ticks(pid) - c0) as f64 / hz / secs;
        let ran = (thread_ticks(vmm_pid, tid) - v0) as f64 / hz;
        // 10 % of the time, the bank of one window (0.1 s) and an overdraw of
        // a scan interval or two per latch; a clock tick of /proc's rounding.
        assert!(
            boosted <= 0.1 * secs + 0.1 + 0.25,
            "boosted {boosted:.3} s of {secs:.1} s at a 10 % budget; status {:?}",
            d.status().vms[0]
        );
        assert!(
            boosted <= ran + 2.0 / hz,
            "boosted {boosted:.3} s but the vCPU thread ran {ran:.3} s"
        );

        assert!(latched, "the budget never latched; log:\n{}", d.log());
        // Unbounded, the boosted vCPU would take all of CPU 0; at a 10 % budget the two
        // share it fairly most of the time (the hog ~45 %).
        assert!(
            hog_share > 0.3,
            "the hog got {:.0} % of its CPU beside a guest always asking; status {:?}",
            hog_share * 100.0,
            d.status().vms[0]
        );
    }
}

kvm_test! {
    /// A boost the daemon grants while the vCPU thread waits in the vtime
    /// queue (a spinning vCPU beside three hogs on one CPU, a pending RT
    /// wakeup in its slot, as another vCPU raises one for a vCPU that waits:
    /// the daemon's to act on, boosted and refused in turns by the budget)
    /// moves it ahead at once, instead of at its turn by vtime.
    fn sched_ext_a_boost_granted_to_a_queued_vcpu_moves_it_ahead() {
        let dir = tempdir("scx-queued");
        let name = vm_name("scx-queued");
        let mut c = one_vcpu_on_cpu0();
        c.guest_pending = Some(10);
        c.spin = true;
        let (_vmm, entry) = support::qmp_vm(&dir, &name, c);
        let d = sched_ext_daemon(&dir, "", &entry);
        d.wait_serving(&name, 1);
        let _hogs = [Hog::on_cpu0(), Hog::on_cpu0(), Hog::on_cpu0()];

        let b = wait_until(Duration::from_secs(30), Duration::from_millis(50), || {
            let b = d.status().backend;
            (b.boost_moved >= 3).then_some(b)
        })
        .unwrap_or_else(|| {
            panic!(
                "no queued vCPU moved ahead: {:?} {:?}; log:\n{}",
                d.status().backend,
                d.status().vms[0].vcpus[0],
                d.log()
            )
        });
        assert!(b.queued_to_run_boosted.count >= 3, "{b:?}");
    }
}

/// A VM whose one vCPU, on CPU 0, is granted boosts while it waits (its
/// guest raises pending hints), beside another VM's vCPU on CPU 0 whose
/// guest shows a sleeping lock held (all the time, or `duty`: held µs of
/// every period µs), two host hogs on CPU 0, lock holders honoured.
struct HintedBesideHolder {
    daemon: Daemon,
    holding: String,
    _vmms: (FakeVmm, FakeVmm),
    _hogs: [Hog; 2],
}

impl HintedBesideHolder {
    fn start(tag: &str, duty: Option<(u64, u64)>) -> Self {
        let dir = tempdir(tag);
        let (hinted, holding) = (vm_name("scx-hint"), vm_name("scx-holder"));
        let mut c = one_vcpu_on_cpu0();
        c.guest_pending = Some(10);
        c.spin = true;
        let (vmm_hinted, entry) = support::qmp_vm(&dir, &hinted, c);
        let mut c = one_vcpu_on_cpu0();
        c.guest_cs = Some(pvsched_abi::CS_LOCK);
        c.guest_cs_duty = duty;
        c.spin = true;
        let (vmm_holding, entry_holding) = support::qmp_vm(&dir, &holding, c);
        let entry_holding = entry_holding
            .strip_prefix("[discovery]\nauto = false\n")
            .expect("a VM entry after the discovery table");
        let daemon = sched_ext_daemon(
            &dir,
            "",
            &format!("[defaults]\nhonor_lock_holders = true\n{entry}{entry_holding}"),
        );
        daemon.wait_serving(&hinted, 1);
        daemon.wait_serving(&holding, 1);
        Self {
            daemon,
            holding,
            _vmms: (vmm_hinted, vmm_holding),
            _hogs: [Hog::on_cpu0(), Hog::on_cpu0()],
        }
    }

    /// The holder's vCPU as pvschedd's status shows it now.
    fn holder(&self) -> pvsched_control::VcpuStatus {
        let vms = self.daemon.status().vms;
        let vm = vms
            .iter()
            .find(|v| v.name == self.holding)
            .expect("the holder's VM");
        vm.vcpus[0].clone()
    }
}

kvm_test! {
    /// A boost the daemon grants to a queued vCPU (as in the test above)
    /// does not preempt a lock holder on that CPU: beside it on CPU 0 runs
    /// another VM's vCPU whose guest always shows a sleeping lock held. The
    /// queued vCPU runs next, at the holder's slice end; before, the grant
    /// preempted the holder whenever it ran there.
    fn sched_ext_a_boost_granted_to_a_queued_vcpu_does_not_preempt_a_lock_holder() {
        let run = HintedBesideHolder::start("scx-queued-holder", None);
        let (d, holder) = (&run.daemon, || run.holder());
        let by_grant = |v: &pvsched_control::VcpuStatus| early_by(v, PVS_SCX_CUT_GRANT);
        let (moved0, grant0) = (d.status().backend.boost_moved, by_grant(&holder()));

        let b = wait_until(Duration::from_secs(40), Duration::from_millis(100), || {
            let b = d.status().backend;
            (b.boost_moved >= moved0 + 12).then_some(b)
        })
        .unwrap_or_else(|| {
            panic!("too few queued vCPUs moved ahead: {:?}; log:\n{}", d.status().backend, d.log())
        });
        let h = holder();
        let grant = by_grant(&h) - grant0;
        eprintln!(
            "{} queued vCPUs moved ahead; the holder preempted by a grant {grant} times, \
             before its slice end by anything {:?}",
            b.boost_moved - moved0,
            h.scx_holder_preempted_early_by
        );
        assert_eq!(grant, 0, "a grant preempted the holder: {h:?}");
    }
}

kvm_test! {
    /// As above, but the holder's guest is in its lock 1.5 ms of every
    /// 3.1 ms: the flag kept for its CPU, as of its last tick, is out of
    /// date about half the time, and a grant on the daemon's thread cannot
    /// read its slot. The grant leaves the preemption to the holder's CPU
    /// (`preemptions_checked`), whose dispatch reads the slot: a holder in
    /// its lock keeps the CPU for an extension (`holders_kept_at_dispatch`),
    /// one out of it is preempted. Before, a grant went by the kept flag
    /// and preempted the holder in its lock whenever that flag was stale.
    fn sched_ext_a_boost_granted_beside_a_holder_in_and_out_of_its_lock_preempts_it_only_out_of_it() {
        // A period the 4 ms tick does not divide: ticks fall at every phase.
        let run = HintedBesideHolder::start("scx-queued-duty", Some((1500, 3100)));
        let (d, holder) = (&run.daemon, || run.holder());
        let by_grant = |v: &pvsched_control::VcpuStatus| early_by(v, PVS_SCX_CUT_GRANT);
        let b0 = d.status().backend;
        let grant0 = by_grant(&holder());

        let b = wait_until(Duration::from_secs(60), Duration::from_millis(100), || {
            let b = d.status().backend;
            (b.boost_moved >= b0.boost_moved + 24).then_some(b)
        })
        .unwrap_or_else(|| {
            panic!("too few queued vCPUs moved ahead: {:?}; log:\n{}", d.status().backend, d.log())
        });
        let h = holder();
        let grant = by_grant(&h) - grant0;
        let (moved, checked, kept) = (
            b.boost_moved - b0.boost_moved,
            b.preemptions_checked - b0.preemptions_checked,
            b.holders_kept_at_dispatch - b0.holders_kept_at_dispatch,
        );
        eprintln!(
            "{moved} queued vCPUs moved ahead; preemptions left to the holder's CPU {checked}, \
             holders kept there for an extension {kept}; the holder preempted in its lock by a \
             grant {grant} times, before its slice end by anything {:?}",
            h.scx_holder_preempted_early_by
        );
        assert!(checked > 0, "no grant left the preemption to the holder's CPU: {b:?}");
        assert!(kept > 0, "no holder kept at its CPU's dispatch: {b:?}");
        assert!(
            grant * 20 <= moved,
            "a grant preempted the holder in its lock {grant} times in {moved}: {h:?}"
        );
    }
}

kvm_test! {
    /// A guest whose RT work runs between the host's reads (its slot always
    /// shows it idle; only its RT switch count moves, as a KVM guest's
    /// cyclictest does): each time its vCPU thread sleeps, the scheduler sees
    /// the count moved, and boosts the wakeup itself, ahead of a host hog on
    /// its CPU; the boosted time is charged to the VM's budget.
    fn sched_ext_boosts_a_wakeup_after_guest_rt_work_itself() {
        let dir = tempdir("scx-kboost");
        let name = vm_name("scx-kboost");
        let mut c = one_vcpu_on_cpu0();
        c.guest_rt_bursts = true;
        let (_vmm, entry) = support::qmp_vm(&dir, &name, c);
        let d = sched_ext_daemon(&dir, "", &entry);
        d.wait_serving(&name, 1);
        let _hog = Hog::on_cpu0();

        let v = wait_until(Duration::from_secs(30), Duration::from_millis(50), || {
            let v = d.status().vms[0].vcpus[0].clone();
            (v.scx_kernel_boosts >= 50 && v.kernel_boosted_ms > 0.0).then_some(v)
        })
        .unwrap_or_else(|| {
            panic!(
                "the scheduler did not boost the wakeups itself: {:?} {:?}; log:\n{}",
                d.status().backend,
                d.status().vms[0].vcpus[0],
                d.log()
            )
        });
        assert!(v.scx_boost_preempts > 0, "{v:?}");
        assert!(d.status().backend.kernel_boosts >= 50);
        assert!(d.status().vms[0].boosted_s > 0.0, "charged to the budget: {:?}", d.status().vms[0]);
    }
}

kvm_test! {
    /// The same guest with its VM's boost budget at 0: the policy's terms
    /// give the scheduler nothing, and it boosts nothing itself.
    fn sched_ext_boosts_nothing_itself_without_budget() {
        let dir = tempdir("scx-kboost-none");
        let name = vm_name("scx-kboost-none");
        let mut c = one_vcpu_on_cpu0();
        c.guest_rt_bursts = true;
        let (_vmm, entry) = support::qmp_vm(&dir, &name, c);
        let d = sched_ext_daemon(
            &dir,
            "",
            &format!("{entry}[vm.limits]\nboost_share_permille = 0\n"),
        );
        d.wait_serving(&name, 1);
        let _hog = Hog::on_cpu0();

        // As long as the test above needs to see its boosts, and longer.
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let v = d.status().vms[0].vcpus[0].clone();
        assert_eq!(v.scx_kernel_boosts, 0, "{v:?}");
        assert_eq!(d.status().backend.kernel_boosts, 0);
    }
}
