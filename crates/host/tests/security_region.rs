//! The region file is no weapon against the daemon: its owner (the VMM's
//! user) truncating it while pvschedd has it mapped, or a huge sparse file
//! under a region's name, costs the owner's own VM and nothing else. Real
//! pvschedd, real fake VMM processes, real files in /dev/shm, real
//! truncation.

mod support;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use pvsched_vmtest::wait_until;
use support::{params, tempdir, vm_name, wait_boosted, Daemon, FakeVmm, FakeVmmConfig, ShmFile};

const GIB: u64 = 1 << 30;

/// A fake VMM for `region` answering QMP, and its `[[vm]]` entry.
fn vmm(
    dir: &Path,
    name: &str,
    region: &Path,
    cfg: impl FnOnce(&mut FakeVmmConfig),
) -> (FakeVmm, String) {
    let qmp = dir.join(format!("{name}.qmp"));
    let mut c = FakeVmmConfig::new(region);
    c.qmp = Some(qmp.clone());
    cfg(&mut c);
    let vmm = FakeVmm::spawn(&c);
    let entry = support::vm_entry(name, region, &qmp);
    (vmm, entry)
}

/// Whether VM `vm` is served; panics, with the log, if pvschedd died.
fn served(d: &mut Daemon, vm: &str) -> bool {
    assert!(d.running(), "pvschedd died; log:\n{}", d.log());
    d.status().vms.iter().any(|v| v.name == vm)
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The owner sets the length of the region file at `path`.
fn resize(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn a_region_truncated_by_its_owner_drops_only_its_vm_restores_its_threads_and_serves_it_once_whole()
{
    let dir = tempdir("region-truncated");
    let (a, b) = (vm_name("trunc-a"), vm_name("trunc-b"));
    // Two vCPUs need one page.
    let (region_a, region_b) = (ShmFile::new(&a, 4096), ShmFile::new(&b, 4096));
    let fifo = |c: &mut FakeVmmConfig| c.guest_fifo = Some(10);
    let (vmm_a, entry_a) = vmm(&dir, &a, &region_a.0, fifo);
    let (vmm_b, entry_b) = vmm(&dir, &b, &region_b.0, fifo);
    let mut d = Daemon::start(
        &dir,
        &format!("[discovery]\nauto = false\n{entry_a}{entry_b}"),
    );
    d.wait_serving(&a, 2);
    d.wait_serving(&b, 2);
    wait_boosted(&d, vmm_a.tids[0]);
    wait_boosted(&d, vmm_b.tids[0]);

    // The owner truncates the file pvschedd has mapped.
    resize(&region_a.0, 0);
    let dropped = wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        (!served(&mut d, &a)).then_some(())
    });

    assert!(dropped.is_some(), "{a} still served; log:\n{}", d.log());
    assert!(d.running(), "pvschedd died; log:\n{}", d.log());
    // Dropped for its region: its VMM still runs.
    assert!(alive(vmm_a.pid), "the VMM of {a} died");
    for &tid in &vmm_a.tids {
        let p = params(tid);
        assert_eq!(
            (p.policy, p.priority, p.nice),
            (libc::SCHED_OTHER as u32, 0, 0),
            "thread {tid} of {a}"
        );
    }
    assert!(
        served(&mut d, &b),
        "{b} no longer served; log:\n{}",
        d.log()
    );
    wait_boosted(&d, vmm_b.tids[1]);

    // The owner gives the file its size back: the VM, which discovery finds
    // unchanged all along (it sends no new snapshot), is served again.
    resize(&region_a.0, 4096);
    d.wait_serving(&a, 2);
}

#[test]
fn a_huge_sparse_file_named_like_a_region_is_not_served_nor_filled() {
    let dir = tempdir("region-huge");
    let (huge, ok) = (vm_name("huge"), vm_name("ok"));
    let region_huge = ShmFile::new(&huge, 64 * GIB);
    let region_ok = ShmFile::new(&ok, 4096);
    let (_vmm_huge, entry_huge) = vmm(&dir, &huge, &region_huge.0, |c| c.no_map = true);
    let (_vmm_ok, entry_ok) = vmm(&dir, &ok, &region_ok.0, |_| {});

    let mut d = Daemon::start(
        &dir,
        &format!("[discovery]\nauto = false\n{entry_huge}{entry_ok}"),
    );
    d.wait_serving(&ok, 2);
    // The daemon found the huge VM's VMM and decided on its region.
    wait_until(Duration::from_secs(20), Duration::from_millis(20), || {
        d.log()
            .lines()
            .any(|l| {
                l.contains(&format!("vm={huge} "))
                    && (l.contains("cannot serve VM") || l.contains("serving VM"))
            })
            .then_some(())
    })
    .unwrap_or_else(|| panic!("{huge} never tried; log:\n{}", d.log()));

    assert!(!served(&mut d, &huge), "{huge} served; log:\n{}", d.log());
    let meta = std::fs::metadata(&region_huge.0).unwrap();
    assert_eq!(meta.len(), 64 * GIB);
    assert_eq!(meta.blocks(), 0, "the sparse file got pages");
    assert!(
        served(&mut d, &ok),
        "{ok} no longer served; log:\n{}",
        d.log()
    );
}
