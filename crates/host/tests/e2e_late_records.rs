//! Records the BPF program queues without waking pvschedd (lazy records: a lone VM's
//! vCPU with no rival on the host) are read late, each with the time it happened. A slot
//! read they ask for shows the present, and a boost decided from it is applied at the
//! present: its boosted time must be charged from then. Read at the record's time, a boost
//! was charged from up to a scan interval before it existed, and a guest that had just
//! started an RT task found its boost budget spent (e2e_doorbell_ack failed so on an idle
//! machine).

use std::time::Instant;

use pvsched_abi::{GuestHalf, GF_ACTIVE, POLICY_FIFO};
use pvsched_base::region_file::RegionFile;
use support::{params, tempdir, vm_name, wait_boosted, Daemon, ShmFile};

mod support;

#[test]
fn a_boost_decided_from_records_read_late_is_charged_from_when_it_was_applied() {
    let _serial = support::serial();
    let dir = tempdir("late-records");
    let name = vm_name("late");
    let region = ShmFile::new(&name, 4096);
    // Its vCPU thread sleeps and wakes every millisecond: on an idle host, records
    // without rivals, queued quietly until the next read. The scan every 2 s: the read
    // that drains them comes late.
    let (vmm, toml) = support::one_vcpu_vm(&dir, &name, &region.0, 2_000_000);
    let tid = vmm.tids[0];
    let d = Daemon::start_with_config(&dir, &toml);
    d.wait_serving(&name, 1);

    // The guest starts an RT task.
    let file = RegionFile::open(&region.0, 1).expect("open the region");
    let rt = GuestHalf {
        flags: GF_ACTIVE,
        policy: POLICY_FIFO,
        rt_priority: 10,
        ..GuestHalf::default()
    };
    file.region().write_guest(0, &rt).expect("write guest half");
    wait_boosted(&d, tid);
    let boosted_at = Instant::now();
    let st = d.status();
    let since_boost_ms = boosted_at.elapsed().as_secs_f64() * 1000.0;

    let vm = st
        .vms
        .iter()
        .find(|v| v.name == name)
        .expect("the VM is served");
    let v = &vm.vcpus[0];
    // Charged from its start, at most the time since the test saw it, plus the 2 ms poll
    // and some slack for the status call.
    assert!(
        v.boosted_ms <= since_boost_ms + 20.0,
        "boost charged {} ms, {since_boost_ms:.1} ms after it was applied; reason {}; \
         log:\n{}",
        v.boosted_ms,
        v.reason,
        d.log()
    );
    assert_eq!(vm.budget_latches, 0, "budget latched; log:\n{}", d.log());
    assert!(params(tid).is_rt(), "boost gone; log:\n{}", d.log());
    drop(vmm);
}
