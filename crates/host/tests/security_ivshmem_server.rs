//! Attacks on pvschedd's ivshmem server, with real processes: a VMM of an
//! account that is not allowed, a client that writes to the socket (QEMU
//! never does), one that connects and never reads, a second VMM claiming a
//! served VM's name, one without a name, and a name taken from a `[[vm]]`
//! entry. Each gets nothing (or is dropped), is logged, and stalls no one.

mod support;

use std::path::Path;
use std::time::Duration;

use pvsched_vmtest::wait_until;
use support::{tempdir, Daemon, FakeVmm, FakeVmmConfig};

const NOBODY: (u32, u32) = (65534, 65534);
const CONFIG: &str = "discovery_interval_ms = 100\n[discovery]\nauto = false\n";

fn socket(dir: &Path) -> std::path::PathBuf {
    dir.join("ivshmem.sock")
}

/// Waits until pvschedd's log says `needle`: a refused client sees its
/// connection closed before the refusal is written to the log.
fn wait_log(d: &Daemon, needle: &str) {
    wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        d.log().contains(needle).then_some(())
    })
    .unwrap_or_else(|| panic!("{needle:?} not in the log:\n{}", d.log()));
}

fn served(d: &Daemon) -> Vec<String> {
    d.status().vms.into_iter().map(|v| v.name).collect()
}

#[test]
fn a_vmm_of_an_account_not_allowed_gets_nothing_and_is_logged() {
    let dir = tempdir("ivs-nobody");
    let d = Daemon::start(&dir, CONFIG);
    let mut cfg = FakeVmmConfig::ivshmem(&socket(&dir), "intruder");
    cfg.user = Some(NOBODY);

    let refused = FakeVmm::try_spawn(&cfg)
        .err()
        .expect("served a disallowed account");

    assert!(refused.starts_with("ivshmem-refused"), "{refused}");
    wait_log(&d, "uid 65534 is not one of");
    assert!(d.log().contains("refused a client"), "{}", d.log());
    assert!(!dir.join("ivshmem/intruder.region").exists());
    std::thread::sleep(Duration::from_millis(300));
    assert!(served(&d).is_empty());
}

#[test]
fn a_client_that_writes_is_dropped_and_one_that_never_reads_stalls_no_one() {
    let dir = tempdir("ivs-garbage");
    let d = Daemon::start(&dir, CONFIG);
    let mut silent = FakeVmmConfig::ivshmem(&socket(&dir), "silent");
    silent.ivshmem.as_mut().unwrap().no_read = true;
    let mut garbage = FakeVmmConfig::ivshmem(&socket(&dir), "garbage");
    garbage.ivshmem.as_mut().unwrap().garbage = true;

    let _silent = FakeVmm::spawn(&silent);
    let _garbage = FakeVmm::spawn(&garbage);
    let good = FakeVmm::spawn(&FakeVmmConfig::ivshmem(&socket(&dir), "good"));

    d.wait_serving("good", 2);
    assert_eq!(
        d.status()
            .vms
            .iter()
            .find(|v| v.name == "good")
            .unwrap()
            .tgid,
        good.pid
    );
    wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
        d.log().contains("not QEMU").then_some(())
    })
    .unwrap_or_else(|| panic!("the writing client was not dropped; log:\n{}", d.log()));
    wait_until(Duration::from_secs(15), Duration::from_millis(50), || {
        (!served(&d).contains(&"garbage".to_string())
            && !dir.join("ivshmem/garbage.region").exists())
        .then_some(())
    })
    .unwrap_or_else(|| panic!("the writing client is still served: {:?}", served(&d)));
}

#[test]
fn a_second_vmm_claiming_a_served_name_is_refused() {
    let dir = tempdir("ivs-name");
    let d = Daemon::start(&dir, CONFIG);
    let first = FakeVmm::spawn(&FakeVmmConfig::ivshmem(&socket(&dir), "web"));
    d.wait_serving("web", 2);

    let second = FakeVmm::try_spawn(&FakeVmmConfig::ivshmem(&socket(&dir), "web"));

    assert!(second.is_err(), "a second VMM named web was served");
    wait_log(&d, "VM web is served already");
    assert_eq!(d.status().vms[0].tgid, first.pid);
}

#[test]
fn a_vmm_without_a_usable_name_or_with_a_configured_ones_is_refused_with_the_reason() {
    let dir = tempdir("ivs-noname");
    let entry = format!(
        "[[vm]]\nname = \"configured\"\nregion = \"{}\"\npid = 1\n",
        dir.join("configured.region").display()
    );
    let d = Daemon::start(&dir, &format!("{CONFIG}{entry}"));
    let mut nameless = FakeVmmConfig::ivshmem(&socket(&dir), "x");
    nameless.ivshmem.as_mut().unwrap().name = None;

    let unnamed = FakeVmm::try_spawn(&nameless);
    let dotted = FakeVmm::try_spawn(&FakeVmmConfig::ivshmem(&socket(&dir), "..x"));
    let configured = FakeVmm::try_spawn(&FakeVmmConfig::ivshmem(&socket(&dir), "configured"));

    assert!(unnamed.is_err() && dotted.is_err() && configured.is_err());
    wait_log(&d, "no -name");
    wait_log(&d, "not starting with '.'");
    wait_log(&d, "a [[vm]] entry has the name configured");
}
