//! Lock-holder extensions end to end without a guest: a real pvschedd, a real
//! fake VMM whose two vCPU threads spin (vCPU 1 pinned to one CPU beside a
//! real CPU hog of this test, so the host's scheduler preempts it), and the
//! test writing the guest halves as pvsched.ko would when a task on vCPU 0
//! waits for a lock vCPU 1 holds.
//!
//! What must happen: each preemption of vCPU 1 while the wait is published
//! starts an extension (vCPU 1 boosted, then unboosted at its end or when the
//! wait goes), the time it ran boosted becomes the VM's lock debt, and the
//! debt is repaid at `debt_nice` once the extensions stop: pvschedctl status
//! shows extensions granted, preemptions cut short, and the debt going back
//! to zero with as much repaid as was extended. The waiter's own vCPU is
//! never boosted.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pvsched_abi::{
    GuestHalf, F_EXT_NOTICE, F_LOCK_HOLD, F_LOCK_WAIT, GF_ACTIVE, LOCK_F_WRITE, LOCK_NONE,
};
use pvsched_base::region_file::RegionFile;
use pvsched_control::LockStatus;
use pvsched_vmtest::wait_until;
use support::{params, qmp_vm, tempdir, vm_name, Daemon, FakeVmmConfig, RtObserver};

mod support;

/// Pins thread `tid` (0: the caller) to `cpu`.
fn pin(tid: i32, cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above; cpu is below CPU_SETSIZE on this machine.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: a valid set of the size passed, for a thread id we started.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) };
    assert_eq!(
        rc,
        0,
        "sched_setaffinity: {}",
        std::io::Error::last_os_error()
    );
}

fn locks(d: &Daemon, vm: &str) -> LockStatus {
    d.status()
        .vms
        .into_iter()
        .find(|v| v.name == vm)
        .map(|v| v.locks)
        .unwrap_or_default()
}

#[test]
fn a_preempted_lock_holder_is_extended_and_the_vm_repays_the_time() {
    let _one = support::serial();
    let dir = tempdir("lock-holder");
    let name = vm_name("locks");
    let mut cfg = FakeVmmConfig::new(&dir);
    cfg.vcpus = 2;
    cfg.spin = true;
    let (vmm, entry) = qmp_vm(&dir, &name, cfg);
    let toml = format!(
        "[daemon]\nstate_file = \"{d}/state.json\"\ncontrol_socket = \"{d}/control.sock\"\n\
         metrics = \"off\"\n[defaults]\nhonor_lock_holders = true\n{entry}",
        d = dir.display(),
    );
    let d = Daemon::start_with_config(&dir, &toml);
    d.wait_serving(&name, 2);
    let (waiter, holder) = (vmm.tids[0], vmm.tids[1]);
    pin(waiter, 0);
    pin(holder, 1);
    // A CPU hog beside the holder: the host's fair scheduler preempts one for the other.
    let stop = Arc::new(AtomicBool::new(false));
    let hog = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            pin(0, 1);
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    };

    let file = RegionFile::open(&dir.join(format!("{name}.region")), 2).expect("open the region");
    let r = file.region();
    let waits = GuestHalf {
        seq: 2,
        flags: GF_ACTIVE,
        lock_holder: 2, // vCPU 1 + 1
        lock_flags: LOCK_F_WRITE,
        ..GuestHalf::default()
    };
    r.write_guest(
        1,
        &GuestHalf {
            seq: 2,
            flags: GF_ACTIVE,
            ..GuestHalf::default()
        },
    )
    .expect("write vCPU 1's half");
    r.write_guest(0, &waits).expect("write vCPU 0's half");

    // Extensions come with the holder's preemptions.
    let mut waiter_boosted = false;
    let granted = {
        let _rt = RtObserver::new();
        wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
            waiter_boosted |= params(waiter).is_rt();
            let l = locks(&d, &name);
            (l.extensions >= 20 && l.preemptions_avoided >= 10).then_some(l)
        })
    };
    let granted = granted.unwrap_or_else(|| {
        panic!(
            "too few extensions: {:?}; log:\n{}",
            locks(&d, &name),
            d.log()
        )
    });
    assert!(granted.extended_ms > 0.0, "{granted:?}");
    assert!(!waiter_boosted, "the waiter's vCPU was boosted");

    // The wait ends: no more extensions, and the debt is repaid.
    r.write_guest(
        0,
        &GuestHalf {
            seq: 4,
            flags: GF_ACTIVE,
            lock_holder: LOCK_NONE,
            ..GuestHalf::default()
        },
    )
    .expect("write vCPU 0's half");
    let repaid = wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        let l = locks(&d, &name);
        (l.debt_ms == 0.0).then_some(l)
    })
    .unwrap_or_else(|| {
        panic!(
            "debt never repaid: {:?}; log:\n{}",
            locks(&d, &name),
            d.log()
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    let after = locks(&d, &name);
    stop.store(true, Ordering::Relaxed);
    hog.join().expect("hog thread");

    assert!(
        (repaid.repaid_ms - repaid.extended_ms).abs() < 1e-6,
        "repaid {} ms of {} ms extended",
        repaid.repaid_ms,
        repaid.extended_ms
    );
    assert_eq!(
        after.extensions, repaid.extensions,
        "extensions after the wait ended"
    );
    assert!(!params(holder).is_rt(), "holder still boosted");
    drop(vmm);
}

/// The region's header as the daemon of `toml` leaves it when it stops.
fn header_after_stop(tag: &str, defaults: &str) -> (pvsched_abi::Header, pvsched_abi::Header) {
    let dir = tempdir(tag);
    let name = vm_name(tag);
    let mut cfg = FakeVmmConfig::new(&dir);
    cfg.vcpus = 2;
    let (_vmm, entry) = qmp_vm(&dir, &name, cfg);
    let toml = format!(
        "[daemon]\nstate_file = \"{d}/state.json\"\ncontrol_socket = \"{d}/control.sock\"\n\
         metrics = \"off\"\n[defaults]\n{defaults}\n{entry}",
        d = dir.display(),
    );
    let mut d = Daemon::start_with_config(&dir, &toml);
    d.wait_serving(&name, 2);
    let file = RegionFile::open(&dir.join(format!("{name}.region")), 2).expect("open the region");
    let served = file.region().header();
    let status = d.signal(libc::SIGTERM);
    assert!(status.success(), "pvschedd exited {status:?}");
    (served, file.region().header())
}

#[test]
fn a_stopping_daemon_withdraws_lock_holders_from_the_region_and_keeps_the_rest_offered() {
    let _one = support::serial();
    // Arrange, act: a daemon honouring lock holders stops; so does one that
    // does not.
    let (served, left) = header_after_stop("lock-withdraw", "honor_lock_holders = true");
    let (plain, plain_left) = header_after_stop("lock-plain", "honor_lock_holders = false");

    // Assert: the guest no longer lists its locks for no host (it binds to
    // the new generation); its lock waits are still offered. A region that
    // never offered lock holders is left as it was.
    assert_ne!(served.host_features & F_LOCK_HOLD, 0, "{served:?}");
    assert_eq!(left.host_features & F_LOCK_HOLD, 0, "{left:?}");
    assert_ne!(served.host_features & F_EXT_NOTICE, 0, "{served:?}");
    assert_eq!(
        left.host_features,
        served.host_features & !(F_LOCK_HOLD | F_EXT_NOTICE)
    );
    assert_ne!(left.host_features & F_LOCK_WAIT, 0, "{left:?}");
    assert_eq!(left.generation, served.generation + 1, "{left:?}");
    assert_eq!(left.slot_count, served.slot_count);
    assert_eq!(plain.host_features & F_LOCK_HOLD, 0, "{plain:?}");
    assert_eq!(plain_left.generation, plain.generation, "{plain_left:?}");
    assert_eq!(plain_left.host_features, plain.host_features);
}
