//! Whom pvschedd believes about libvirt domains: libvirtd's status files
//! (root's, written by no one else) for the QEMU pid and vCPU thread ids, the
//! `<shmem name='pvsched-*'>` element to opt in, and a QEMU process and
//! region file that both belong to `[libvirt] qemu_user`. Real daemon, real
//! fake VMMs (as root and as `nobody`), status files written as libvirtd
//! writes them, and forged ones. The real libvirtd is in `libvirt_e2e.rs`.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pvsched_base::thread::gettid;
use support::{params, tempdir, wait_boosted, Daemon, FakeVmm, FakeVmmConfig, ShmDir};

const NOBODY: (u32, u32) = (65534, 65534);

/// A libvirt host in miniature: a status directory and a shared-memory
/// directory of the test's own.
struct Libvirt {
    status: PathBuf,
    shm: ShmDir,
}

impl Libvirt {
    fn new(name: &str) -> Self {
        let status = tempdir(&format!("libvirt-{name}")).join("qemu");
        std::fs::create_dir_all(&status).unwrap();
        Libvirt {
            status,
            shm: ShmDir::new(&format!("libvirt-{name}")),
        }
    }

    /// The daemon's configuration: auto discovery off, libvirt on, with QEMU
    /// running as `qemu_user`.
    fn config(&self, qemu_user: &str) -> String {
        format!(
            "discovery_interval_ms = 100\n[discovery]\nauto = false\n[libvirt]\nstatus_dir = \"{}\"\nshm_dir = \"{}\"\nqemu_user = \"{qemu_user}\"\n",
            self.status.display(),
            self.shm.path().display()
        )
    }

    /// The region file as QEMU creates it for `<size unit='M'>1</size>`:
    /// 1 MiB of zeros, owned by QEMU's user.
    fn region(&self, shmem: &str, owner: (u32, u32)) -> PathBuf {
        let path = self.shm.path().join(shmem);
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(1 << 20).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&path, Some(owner.0), Some(owner.1)).unwrap();
        path
    }

    /// Writes `<domain>.xml` as libvirtd does: root's, mode 0600.
    fn status_file(&self, domain: &str, xml: &str) -> PathBuf {
        let path = self.status.join(format!("{domain}.xml"));
        std::fs::write(&path, xml).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    }
}

/// A status file of a running TCG domain, in libvirt's layout.
fn status_xml(domain: &str, pid: i32, tids: &[i32], shmem: Option<&str>) -> String {
    let vcpus: String = tids
        .iter()
        .enumerate()
        .map(|(i, t)| format!("    <vcpu id='{i}' pid='{t}'/>\n"))
        .collect();
    let device = shmem.map_or(String::new(), |s| {
        format!(
            "      <shmem name='{s}'>\n        <model type='ivshmem-plain'/>\n        <size unit='M'>1</size>\n        <alias name='shmem0'/>\n      </shmem>\n"
        )
    });
    format!(
        "<domstatus state='running' reason='booted' pid='{pid}'>\n  <monitor path='/var/lib/libvirt/qemu/domain-1-{domain}/monitor.sock' type='unix'/>\n  <vcpus>\n{vcpus}  </vcpus>\n  <domain type='qemu' id='1'>\n    <name>{domain}</name>\n    <vcpu placement='static'>{n}</vcpu>\n    <devices>\n      <emulator>/usr/bin/qemu-system-x86_64</emulator>\n{device}    </devices>\n  </domain>\n</domstatus>\n",
        n = tids.len()
    )
}

/// A fake QEMU that maps `region` and whose guest claims an RT task on every
/// vCPU.
fn qemu(region: &Path, user: Option<(u32, u32)>) -> FakeVmm {
    let mut cfg = FakeVmmConfig::new(region);
    cfg.guest_fifo = Some(10);
    cfg.user = user;
    FakeVmm::spawn(&cfg)
}

/// Whether the daemon serves `vm` now.
fn served(d: &Daemon, vm: &str) -> bool {
    d.status().vms.iter().any(|v| v.name == vm)
}

/// Lets several discovery rounds (100 ms each) pass.
fn rounds() {
    std::thread::sleep(Duration::from_millis(600));
}

#[test]
fn a_domain_with_the_element_is_served_under_its_name_and_boosted() {
    let _serial = support::serial();
    let lv = Libvirt::new("served");
    let region = lv.region("pvsched-web", (0, 0));
    let vmm = qemu(&region, None);
    lv.status_file(
        "web",
        &status_xml("web", vmm.pid, &vmm.tids, Some("pvsched-web")),
    );

    let dir = tempdir("libvirt-served-daemon");
    let d = Daemon::start(&dir, &lv.config("root"));
    d.wait_serving("web", 2);
    wait_boosted(&d, vmm.tids[0]);

    let vm = d
        .status()
        .vms
        .into_iter()
        .find(|v| v.name == "web")
        .unwrap();
    assert_eq!(vm.region, region.display().to_string());
}

#[test]
fn a_domain_without_the_element_is_never_served() {
    let _serial = support::serial();
    let lv = Libvirt::new("without");
    let region = lv.region("pvsched-plain", (0, 0));
    let vmm = qemu(&region, None);
    lv.status_file("plain", &status_xml("plain", vmm.pid, &vmm.tids, None));
    let dir = tempdir("libvirt-without-daemon");

    let d = Daemon::start(&dir, &lv.config("root"));
    rounds();

    assert!(!served(&d, "plain"));
    for &tid in &vmm.tids {
        assert!(!params(tid).is_rt(), "thread {tid} was boosted");
    }
}

#[test]
fn a_status_file_someone_else_could_have_written_is_not_believed() {
    let _serial = support::serial();
    let lv = Libvirt::new("forged");
    let region = lv.region("pvsched-forged", (0, 0));
    let vmm = qemu(&region, None);
    let path = lv.status_file(
        "forged",
        &status_xml("forged", vmm.pid, &vmm.tids, Some("pvsched-forged")),
    );
    // Group- and world-writable, as if a local user had put it there.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let dir = tempdir("libvirt-forged-daemon");

    let d = Daemon::start(&dir, &lv.config("root"));
    rounds();

    assert!(!served(&d, "forged"));
    assert!(d.log().contains("not libvirt's"), "{}", d.log());
    for &tid in &vmm.tids {
        assert!(!params(tid).is_rt(), "thread {tid} was boosted");
    }
}

#[test]
fn a_qemu_process_of_another_user_than_qemu_user_is_refused() {
    let _serial = support::serial();
    let lv = Libvirt::new("user");
    // A local user's process and file, named in a status file (say, a
    // domain of a session libvirtd run by that user).
    let region = lv.region("pvsched-mine", NOBODY);
    let vmm = qemu(&region, Some(NOBODY));
    lv.status_file(
        "mine",
        &status_xml("mine", vmm.pid, &vmm.tids, Some("pvsched-mine")),
    );
    let dir = tempdir("libvirt-user-daemon");

    let d = Daemon::start(&dir, &lv.config("root"));
    rounds();

    assert!(!served(&d, "mine"));
    assert!(d.log().contains("not [libvirt] qemu_user"), "{}", d.log());
    for &tid in &vmm.tids {
        assert!(!params(tid).is_rt(), "thread {tid} was boosted");
    }
}

#[test]
fn vcpu_thread_ids_that_are_not_the_qemu_processs_own_are_refused() {
    let _serial = support::serial();
    let lv = Libvirt::new("foreign");
    let region = lv.region("pvsched-foreign", (0, 0));
    let vmm = qemu(&region, None);
    // vCPU 1 names a thread of this test process instead.
    let me = gettid();
    lv.status_file(
        "foreign",
        &status_xml(
            "foreign",
            vmm.pid,
            &[vmm.tids[0], me],
            Some("pvsched-foreign"),
        ),
    );
    let dir = tempdir("libvirt-foreign-daemon");

    let d = Daemon::start(&dir, &lv.config("root"));
    rounds();

    assert!(!served(&d, "foreign"));
    assert!(
        d.log().contains("is not a thread of process"),
        "{}",
        d.log()
    );
    assert!(!params(me).is_rt());
}

#[test]
fn a_domain_whose_process_does_not_map_the_named_region_is_refused() {
    let _serial = support::serial();
    let lv = Libvirt::new("unmapped");
    let mapped = lv.region("pvsched-real", (0, 0));
    lv.region("pvsched-other", (0, 0));
    let vmm = qemu(&mapped, None);
    // The element names a file this process has not mapped.
    lv.status_file(
        "other",
        &status_xml("other", vmm.pid, &vmm.tids, Some("pvsched-other")),
    );
    let dir = tempdir("libvirt-unmapped-daemon");

    let d = Daemon::start(&dir, &lv.config("root"));
    rounds();

    assert!(!served(&d, "other"));
    assert!(d.log().contains("does not map"), "{}", d.log());
}

#[test]
fn the_libvirt_hook_gets_a_new_domain_served_without_waiting_for_the_next_round() {
    let _serial = support::serial();
    let lv = Libvirt::new("hook");
    let dir = tempdir("libvirt-hook-daemon");
    // One discovery round a minute: only the hook can be in time.
    let config = lv.config("root").replace(
        "discovery_interval_ms = 100",
        "discovery_interval_ms = 60000",
    );
    let d = Daemon::start(&dir, &config);
    std::thread::sleep(Duration::from_millis(300));
    let region = lv.region("pvsched-late", (0, 0));
    let vmm = qemu(&region, None);
    lv.status_file(
        "late",
        &status_xml("late", vmm.pid, &vmm.tids, Some("pvsched-late")),
    );

    // As libvirtd runs the hook: `qemu.d/pvsched late started begin -`.
    let hook = std::process::Command::new(support::workspace_bin("pvschedctl"))
        .arg("--socket")
        .arg(d.socket())
        .args([
            "--timeout-ms",
            "1000",
            "libvirt-hook",
            "late",
            "started",
            "begin",
            "-",
        ])
        .output()
        .unwrap();

    assert!(hook.status.success(), "{hook:?}");
    d.wait_serving("late", 2);
    assert!(
        d.log().contains("libvirt hook: domain late started"),
        "{}",
        d.log()
    );
}
