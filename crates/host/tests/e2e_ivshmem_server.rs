//! pvschedd as the ivshmem server, end to end with the real daemon and real
//! VMM processes (`pvsched-fake-vmm --ivshmem-server`, which speaks the
//! client side as QEMU's ivshmem-doorbell does): a VMM that connects is
//! served by its `-name` with the doorbell and no `--doorbell` argument; one
//! that exits is dropped with its files; a restarted pvschedd takes the
//! running VMM's doorbell back. The refusals are in `security_ivshmem_server.rs`;
//! a real QEMU guest on the socket is in `e2e_doorbell.rs`.

mod support;

use std::path::Path;
use std::time::Duration;

use pvsched_vmtest::wait_until;
use support::{tempdir, wait_boosted, Daemon, FakeVmm, FakeVmmConfig};

/// Discovery every 100 ms, auto discovery off: only the socket serves.
const CONFIG: &str = "discovery_interval_ms = 100\n[discovery]\nauto = false\n";

/// Waits until `d` has counted more than `above` doorbell rings.
fn wait_rings_above(d: &Daemon, above: f64) -> f64 {
    wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
        let n = d.metric("pvsched_doorbell_rings_total");
        (n > above).then_some(n)
    })
    .unwrap_or_else(|| panic!("no doorbell ring counted above {above}; log:\n{}", d.log()))
}

fn served_with_doorbell(d: &Daemon, vm: &str) -> bool {
    d.status().vms.iter().any(|v| v.name == vm && v.doorbell)
}

fn socket(dir: &Path) -> std::path::PathBuf {
    dir.join("ivshmem.sock")
}

#[test]
fn a_vmm_on_the_socket_is_served_by_its_name_with_the_doorbell() {
    let dir = tempdir("ivs-served");
    // Boosts also without a rival on the host: the test shows the region is
    // shared, not the rivals rule.
    let d = Daemon::start(
        &dir,
        &format!("{CONFIG}[defaults]\nboost_only_against_rivals = false\n"),
    );
    let mut cfg = FakeVmmConfig::ivshmem(&socket(&dir), "vm-a");
    cfg.ivshmem.as_mut().unwrap().ring_every_ms = Some(20);
    cfg.guest_fifo = Some(3);
    // Running, not sleeping: a sleeping vCPU's wakeups onto an idle CPU are
    // quiet, and its boost would wait for a scan that finds it running.
    cfg.spin = true;

    let vmm = FakeVmm::spawn(&cfg);
    d.wait_serving("vm-a", 2);

    let status = d.status();
    let vm = status.vms.iter().find(|v| v.name == "vm-a").unwrap();
    assert_eq!(vm.tgid, vmm.pid);
    assert!(vm.doorbell, "served without its doorbell: {vm:?}");
    assert_eq!(Path::new(&vm.region), dir.join("ivshmem/vm-a.region"));
    let tids: Vec<i32> = vm.vcpus.iter().map(|v| v.tid).collect();
    assert_eq!(tids, vmm.tids);
    // The guest's rings reach pvschedd through the eventfd it handed out.
    wait_rings_above(&d, 0.0);
    // The guest half the VMM writes into the region it was handed is what
    // pvschedd reads: a FIFO task there boosts the vCPU thread.
    wait_boosted(&d, vmm.tids[0]);
}

#[test]
fn a_vmm_that_exits_is_dropped_with_its_region_and_record() {
    let dir = tempdir("ivs-exit");
    let d = Daemon::start(&dir, CONFIG);
    let mut vmm = FakeVmm::spawn(&FakeVmmConfig::ivshmem(&socket(&dir), "vm-b"));
    d.wait_serving("vm-b", 2);
    let region = dir.join("ivshmem/vm-b.region");
    let record = dir.join("ivshmem/vm-b.peer");
    assert!(region.exists() && record.exists());

    vmm.kill();

    wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
        d.status().vms.is_empty().then_some(())
    })
    .unwrap_or_else(|| panic!("still served after its VMM exited; log:\n{}", d.log()));
    wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
        (!region.exists() && !record.exists()).then_some(())
    })
    .expect("the region and record of a VMM that exited are removed");
    // The name is free again: a new VMM of that name is served.
    let again = FakeVmm::spawn(&FakeVmmConfig::ivshmem(&socket(&dir), "vm-b"));
    d.wait_serving("vm-b", 2);
    assert_eq!(d.status().vms[0].tgid, again.pid);
}

#[test]
fn a_restarted_pvschedd_takes_the_running_vmms_doorbell_back() {
    let dir = tempdir("ivs-restart");
    let mut first = Daemon::start(&dir, CONFIG);
    let mut cfg = FakeVmmConfig::ivshmem(&socket(&dir), "vm-c");
    cfg.ivshmem.as_mut().unwrap().ring_every_ms = Some(20);
    let vmm = FakeVmm::spawn(&cfg);
    first.wait_serving("vm-c", 2);
    let region = dir.join("ivshmem/vm-c.region");
    let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let served_inode = inode(&region);

    let stopped = first.signal(libc::SIGTERM);
    assert!(stopped.success(), "{stopped:?}");
    // Stopped: no socket for a new QEMU to wait on; the region stays.
    assert!(!socket(&dir).exists());
    assert!(region.exists());
    let second = Daemon::start(&dir, CONFIG);

    second.wait_serving("vm-c", 2);
    assert!(
        served_with_doorbell(&second, "vm-c"),
        "served on the timer after a restart; log:\n{}",
        second.log()
    );
    assert_eq!(second.status().vms[0].tgid, vmm.pid);
    assert_eq!(
        inode(&region),
        served_inode,
        "the same region, not a new one"
    );
    // The rings of the running VMM reach the new pvschedd.
    wait_rings_above(&second, 0.0);
    assert!(second
        .log()
        .contains("took back a VM served through the ivshmem socket"));
}

#[test]
fn a_restart_that_cannot_take_the_doorbell_back_serves_the_vm_on_the_timer() {
    let dir = tempdir("ivs-nodoorbell");
    let mut first = Daemon::start(&dir, CONFIG);
    let vmm = FakeVmm::spawn(&FakeVmmConfig::ivshmem(&socket(&dir), "vm-d"));
    first.wait_serving("vm-d", 2);
    first.signal(libc::SIGTERM);
    // The record names an eventfd the VMM does not hold.
    let record = dir.join("ivshmem/vm-d.peer");
    let text = std::fs::read_to_string(&record).unwrap();
    let mut rec: serde_json::Value = serde_json::from_str(&text).unwrap();
    rec["eventfd_id"] = serde_json::json!(u32::MAX);
    std::fs::write(&record, rec.to_string()).unwrap();

    let second = Daemon::start(&dir, CONFIG);

    second.wait_serving("vm-d", 2);
    let status = second.status();
    assert_eq!(status.vms[0].tgid, vmm.pid);
    assert!(!status.vms[0].doorbell, "{:?}", status.vms[0]);
    assert!(second.log().contains("re-read on the recheck timer"));
}
