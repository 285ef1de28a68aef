//! Load: one pvschedd serving 8 small VMs whose vCPU threads switch
//! thousands of times a second each; when the BPF ring buffer overflows
//! (the daemon stopped by a real SIGSTOP while the programs keep
//! submitting), the lost events are counted, in the status and in the
//! metrics alike, and the daemon goes on serving.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use pvsched_control::{Request, Response};
use pvsched_vmtest::wait_until;
use support::{tempdir, Daemon, FakeVmm, FakeVmmConfig};

const VMS: usize = 8;
const VCPUS: u32 = 6;
/// Records the daemon's ring buffer holds: 256 KiB of 48-byte records.
const RING_RECORDS: f64 = (256 * 1024 / 48) as f64;

/// A fake VMM with `VCPUS` vCPU threads sleeping 1 ms in a loop (each
/// wakeup: a waking, a switch-in and a switch-out record), served through
/// QMP; and its `[[vm]]` entry.
fn busy_vm(dir: &Path, name: &str, guest_fifo: Option<u32>) -> (FakeVmmConfig, String) {
    let region = dir.join(format!("{name}.region"));
    let qmp = dir.join(format!("{name}.qmp"));
    let mut cfg = FakeVmmConfig::new(&region);
    cfg.vcpus = VCPUS;
    cfg.guest_fifo = guest_fifo;
    cfg.qmp = Some(qmp.clone());
    let entry = support::vm_entry(name, &region, &qmp);
    (cfg, entry)
}

/// The value of the unlabelled metric `name` in Prometheus text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn metrics(d: &Daemon) -> String {
    match d.request(&Request::Metrics, Duration::from_secs(5)) {
        Response::Metrics { text } => text,
        other => panic!("metrics: {other:?}"),
    }
}

fn records(d: &Daemon) -> f64 {
    metric(&metrics(d), "pvsched_bpf_records").expect("pvsched_bpf_records")
}

#[test]
fn events_lost_under_load_are_counted_and_the_daemon_keeps_serving() {
    let dir = tempdir("load-events");
    // In the [daemon] section: BPF or fail (polling loses nothing to count).
    let mut extra = String::from("event_source = \"bpf\"\n[discovery]\nauto = false\n");
    let mut load = Vec::new();
    for i in 0..VMS {
        let (cfg, entry) = busy_vm(&dir, &format!("load{i}"), None);
        load.push(FakeVmm::spawn(&cfg));
        extra.push_str(&entry);
    }
    // Configured from the start, started only after the loss.
    // One spinning vCPU: boosted, it still leaves a CPU to the rest.
    let (mut late_cfg, late_entry) = busy_vm(&dir, "late", Some(3));
    late_cfg.vcpus = 1;
    late_cfg.spin = true;
    extra.push_str(&late_entry);
    let mut d = Daemon::start(&dir, &extra);
    for i in 0..VMS {
        d.wait_serving(&format!("load{i}"), VCPUS as usize);
    }
    let (r0, t0) = (records(&d), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let (r1, t1) = (records(&d), Instant::now());
    let rate = (r1 - r0) / (t1 - t0).as_secs_f64();
    eprintln!("{VMS} VMs x {VCPUS} vCPUs: {rate:.0} BPF records/s");

    // Act: the daemon stops reading while the programs keep submitting, for
    // three ring buffers' worth of records (0.3 to 3 s).
    let stop = Duration::from_secs_f64((3.0 * RING_RECORDS / rate).clamp(0.3, 3.0));
    // SAFETY: kill(2) on the PID of our own, not yet reaped, child.
    unsafe { libc::kill(d.pid(), libc::SIGSTOP) };
    std::thread::sleep(stop);
    // SAFETY: as above.
    unsafe { libc::kill(d.pid(), libc::SIGCONT) };

    let dropped = wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
        Some(d.status().dropped_events).filter(|n| *n > 0)
    });
    assert!(
        dropped.is_some(),
        "the ring overflowed but no loss was counted; log:\n{}",
        d.log()
    );
    // Still serving: a VM that appears now is found and its vCPU boosted
    // (the daemon's count: a boosted spinning thread may starve this test).
    let late = FakeVmm::spawn(&late_cfg);
    let boosted = wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        d.status()
            .vms
            .iter()
            .any(|v| v.name == "late" && v.tgid == late.pid && v.boosts > 0)
            .then_some(())
    });
    assert!(
        boosted.is_some(),
        "not serving after the loss; log:\n{}",
        d.log()
    );
    // Without load the count settles, and the metric agrees with it.
    for mut vmm in load {
        vmm.kill();
    }
    let agreed = wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
        let m = metric(&metrics(&d), "pvsched_dropped_events")?;
        let s = d.status().dropped_events;
        (m == s as f64).then_some(s)
    });
    eprintln!(
        "lost {} records; {:.0} records in all",
        agreed.unwrap_or(0),
        records(&d)
    );
    assert!(
        agreed.is_some_and(|n| n >= dropped.unwrap_or(0)),
        "pvsched_dropped_events never matched the status ({:?}); log:\n{}",
        dropped,
        d.log()
    );
    assert!(d.running(), "daemon died; log:\n{}", d.log());
}
