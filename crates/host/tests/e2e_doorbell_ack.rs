//! The daemon's side of the doorbell without a guest: a real pvschedd holding
//! an eventfd as a VM's doorbell (`--doorbell`), a real fake VMM whose vCPU
//! thread sleeps and wakes, and the test writing the guest half and ringing
//! the eventfd as pvsched.ko would.
//!
//! The guest rings once per host-half `seq` (so that a host keeping a boost
//! is not rung in a loop). A ring that finds the guest with a reason again
//! (an interrupt came between the ring and the read) keeps the boost; unless
//! the daemon then writes the host half, its `seq` stays, and the guest's next
//! "no reason" publish does not ring: the boost lasted until the next scan.

use std::time::Duration;

use pvsched_abi::{GuestHalf, F_DOORBELL, GF_ACTIVE, POLICY_FIFO};
use pvsched_base::region_file::RegionFile;
use pvsched_vmtest::wait_until;
use support::{params, tempdir, vm_name, wait_boosted, Daemon, ShmFile};

mod support;

fn ring(fd: std::os::fd::BorrowedFd<'_>) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: an 8-byte write from a live buffer to an eventfd we own.
    let n = unsafe { libc::write(std::os::fd::AsRawFd::as_raw_fd(&fd), one.as_ptr().cast(), 8) };
    assert_eq!(n, 8, "eventfd write: {}", std::io::Error::last_os_error());
}

#[test]
fn a_ring_that_finds_the_boost_still_needed_is_answered_with_a_host_half_write() {
    let dir = tempdir("doorbell-ack");
    let name = vm_name("ack");
    let region = ShmFile::new(&name, 4096);
    // The scan (which rewrites every host half) slowed to 5 s: within the
    // test only a decision or the ring's answer writes the half.
    let (vmm, toml) = support::one_vcpu_vm(&dir, &name, &region.0, 5_000_000);
    let tid = vmm.tids[0];
    let efd = pvsched_base::ivshmem::eventfd().expect("eventfd");
    let d = Daemon::start_with_doorbells(
        std::path::Path::new(env!("CARGO_BIN_EXE_pvschedd")),
        &dir,
        &toml,
        &[(name.as_str(), std::os::fd::AsFd::as_fd(&efd))],
    );
    d.wait_serving(&name, 1);

    let file = RegionFile::open(&region.0, 1).expect("open the region");
    let r = file.region();
    assert_ne!(
        r.header().host_features & F_DOORBELL,
        0,
        "doorbell not offered"
    );
    // The guest: a FIFO task runs on vCPU 0. The thread's next wakeup makes
    // the daemon read it and boost.
    let rt = GuestHalf {
        flags: GF_ACTIVE,
        policy: POLICY_FIFO,
        rt_priority: 10,
        ..GuestHalf::default()
    };
    r.write_guest(0, &rt).expect("write guest half");
    wait_boosted(&d, tid);

    // Quiet: the host half no longer moves on its own.
    let seq = wait_until(Duration::from_secs(5), Duration::from_millis(100), || {
        let a = r.read_host(0).ok()?.seq;
        std::thread::sleep(Duration::from_millis(100));
        let b = r.read_host(0).ok()?.seq;
        (a == b).then_some(b)
    })
    .expect("the host half kept changing without a ring");

    // Rung while the reason is still there: the boost stays, and the host
    // half is written all the same.
    ring(std::os::fd::AsFd::as_fd(&efd));
    let answered = wait_until(Duration::from_secs(2), Duration::from_millis(5), || {
        (r.read_host(0).ok()?.seq != seq).then_some(())
    });
    assert!(
        answered.is_some(),
        "host half seq still {seq} after the ring; log:\n{}",
        d.log()
    );
    assert!(
        params(tid).is_rt(),
        "the boost ended though the guest still runs RT; log:\n{}",
        d.log()
    );
    drop(vmm);
}
