//! Whom pvschedd believes about VMs. Auto discovery and `[[vm]]` entries
//! serve only VMMs that run as an allowed account, found by who maps the
//! region file (not by command-line text); a region file others may write
//! is refused; a QMP socket's peer must be an allowed VMM and may only name
//! its own threads; a QMP peer that stalls cannot stall discovery. Real
//! daemon, real fake VMMs run as root and as `nobody`, a real wrapper, real
//! lying and hostile QMP sockets.

mod support;

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::{Duration, Instant};

use pvsched_abi::F_ALL;
use pvsched_base::region_file::RegionFile;
use pvsched_base::sched::{SCHED_FIFO, SCHED_OTHER};
use pvsched_base::thread::gettid;
use pvsched_vmtest::wait_until;
use support::{params, tempdir, wait_boosted, Daemon, FakeVmm, FakeVmmConfig, ShmDir};

const ROOT: (u32, u32) = (0, 0);
const NOBODY: (u32, u32) = (65534, 65534);

/// Discovery runs every 100 ms in these tests.
const INTERVAL: &str = "discovery_interval_ms = 100\n";

/// `[discovery]` with auto discovery over the test's own `/dev/shm` directory.
fn auto_discovery(shm: &ShmDir) -> String {
    format!(
        "{INTERVAL}[discovery]\nauto = true\nregion_dir = \"{}\"\nregion_prefix = \"pvsched-\"\n",
        shm.path().display()
    )
}

/// A region file for `vcpus` vCPUs with a valid header (as a VMM's earlier
/// run, or the account's owner, would leave it), then given `owner` and
/// `mode`.
fn region_file(path: &Path, vcpus: u32, owner: (u32, u32), mode: u32) {
    let mut f = RegionFile::create(path, vcpus, 0o600).unwrap();
    f.region_mut().init_header(vcpus, F_ALL).unwrap();
    drop(f);
    std::os::unix::fs::chown(path, Some(owner.0), Some(owner.1)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A fake VMM of `user` whose guest claims a FIFO task on each vCPU, with
/// KVM-style thread names.
fn vmm_config(region: &Path, vcpus: u32, user: (u32, u32)) -> FakeVmmConfig {
    let mut cfg = FakeVmmConfig::new(region);
    cfg.vcpus = vcpus;
    cfg.name_format = "CPU {}/KVM".into();
    cfg.guest_fifo = Some(3);
    cfg.user = (user != ROOT).then_some(user);
    cfg
}

/// Waits until process `pid` has `region` mapped (the fake VMM maps it in
/// the background).
fn wait_mapped(pid: i32, region: &Path) {
    let needle = region.display().to_string();
    wait_until(Duration::from_secs(10), Duration::from_millis(10), || {
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .ok()?
            .contains(&needle)
            .then_some(())
    })
    .unwrap_or_else(|| panic!("process {pid} never mapped {needle}"));
}

/// Thread `tid` runs as it started: SCHED_OTHER at nice 0.
fn assert_plain(tid: i32) {
    let p = params(tid);
    assert_eq!(
        (p.policy, p.priority, p.nice),
        (SCHED_OTHER, 0, 0),
        "thread {tid}: {p:?}"
    );
}

/// Watches the daemon for ten discovery intervals: none of `vms` is ever
/// served and none of `tids` is ever boosted.
fn assert_never_served(d: &Daemon, vms: &[&str], tids: &[i32]) {
    let until = Instant::now() + Duration::from_millis(1000);
    while Instant::now() < until {
        let status = d.status();
        for vm in vms {
            assert!(
                !status.vms.iter().any(|v| v.name == *vm),
                "{vm} is served; log:\n{}",
                d.log()
            );
        }
        for &tid in tids {
            assert!(
                !params(tid).is_rt(),
                "thread {tid} boosted: {:?}",
                params(tid)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the daemon's log holds `text` (discovery got that far).
fn wait_logged(d: &Daemon, text: &str) {
    wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        d.log().contains(text).then_some(())
    })
    .unwrap_or_else(|| panic!("never logged {text:?}; log:\n{}", d.log()));
}

/// A host whose user database names none of the allowed accounts (a minimal
/// VM without /etc/passwd, a typo): a root VMM is not served, and the log
/// says why at start-up instead of nothing at all.
#[test]
fn allowed_accounts_that_resolve_to_nobody_are_said_and_serve_nothing() {
    let shm = ShmDir::new("nobody-resolves");
    let region = shm.path().join("pvsched-lone");
    region_file(&region, 1, ROOT, 0o600);
    let vmm = FakeVmm::spawn(&vmm_config(&region, 1, ROOT));
    wait_mapped(vmm.pid, &region);
    let dir = tempdir("disc-resolves-nobody");
    let toml = format!(
        "{}allowed_users = [\"no-such-user-here\"]\nallowed_groups = [\"no-such-group-here\"]\n",
        auto_discovery(&shm)
    );

    let d = Daemon::start(&dir, &toml);

    wait_logged(&d, "name no account on this host");
    assert_never_served(&d, &["lone"], &vmm.tids);
    assert_plain(vmm.tids[0]);
}

#[test]
fn an_unprivileged_users_vmm_is_never_served_and_a_root_one_is() {
    let shm = ShmDir::new("nobody");
    let evil_region = shm.path().join("pvsched-evil");
    let good_region = shm.path().join("pvsched-good");
    region_file(&evil_region, 2, NOBODY, 0o600);
    region_file(&good_region, 1, ROOT, 0o600);
    let mut evil_cfg = vmm_config(&evil_region, 2, NOBODY);
    evil_cfg.spin = true;
    let evil = FakeVmm::spawn(&evil_cfg);
    let good = FakeVmm::spawn(&vmm_config(&good_region, 1, ROOT));
    wait_mapped(evil.pid, &evil_region);
    wait_mapped(good.pid, &good_region);
    let dir = tempdir("disc-nobody");

    let d = Daemon::start(&dir, &auto_discovery(&shm));

    // The positive control: same daemon, same round of discovery.
    d.wait_serving("good", 1);
    wait_boosted(&d, good.tids[0]);
    assert_never_served(&d, &["evil"], &evil.tids);
    for &tid in &evil.tids {
        assert_plain(tid);
    }
    wait_logged(&d, "owned by uid 65534");
}

#[test]
fn a_region_file_others_may_write_or_a_symlink_is_refused() {
    let shm = ShmDir::new("modes");
    let p = |name: &str| shm.path().join(name);
    // Group-writable by a group that is not allowed (nogroup).
    region_file(&p("pvsched-groupw"), 1, (0, 65534), 0o660);
    // Group-writable by an allowed group (root): the positive control.
    region_file(&p("pvsched-rootgroup"), 1, ROOT, 0o660);
    // World-writable once the VMM has mapped it (as a chmod after the fact).
    region_file(&p("pvsched-worldw"), 1, ROOT, 0o600);
    // A symlink under a region's name to a file the VMM maps.
    region_file(&p("link-target"), 1, ROOT, 0o600);
    symlink(p("link-target"), p("pvsched-link")).unwrap();
    let vmms: Vec<FakeVmm> = [
        "pvsched-groupw",
        "pvsched-rootgroup",
        "pvsched-worldw",
        "link-target",
    ]
    .iter()
    .map(|name| {
        let vmm = FakeVmm::spawn(&vmm_config(&p(name), 1, ROOT));
        wait_mapped(vmm.pid, &p(name));
        vmm
    })
    .collect();
    std::fs::set_permissions(p("pvsched-worldw"), std::fs::Permissions::from_mode(0o666)).unwrap();
    let dir = tempdir("disc-modes");

    let d = Daemon::start(&dir, &auto_discovery(&shm));

    d.wait_serving("rootgroup", 1);
    wait_boosted(&d, vmms[1].tids[0]);
    let refused_tids = [vmms[0].tids[0], vmms[2].tids[0], vmms[3].tids[0]];
    assert_never_served(&d, &["groupw", "worldw", "link"], &refused_tids);
    wait_logged(&d, "by group 65534");
}

#[test]
fn a_region_two_vmms_map_is_refused_as_ambiguous() {
    let shm = ShmDir::new("twice");
    let shared = shm.path().join("pvsched-shared");
    let single = shm.path().join("pvsched-single");
    region_file(&shared, 1, ROOT, 0o600);
    region_file(&single, 1, ROOT, 0o600);
    let first = FakeVmm::spawn(&vmm_config(&shared, 1, ROOT));
    let second = FakeVmm::spawn(&vmm_config(&shared, 1, ROOT));
    let alone = FakeVmm::spawn(&vmm_config(&single, 1, ROOT));
    for (vmm, region) in [(&first, &shared), (&second, &shared), (&alone, &single)] {
        wait_mapped(vmm.pid, region);
    }
    let dir = tempdir("disc-twice");

    let d = Daemon::start(&dir, &auto_discovery(&shm));

    d.wait_serving("single", 1);
    assert_never_served(&d, &["shared"], &[first.tids[0], second.tids[0]]);
    wait_logged(&d, "refusing to guess");
}

#[test]
fn the_vmm_under_a_wrapper_is_served_not_the_wrapper() {
    let shm = ShmDir::new("wrapper");
    let region = shm.path().join("pvsched-wrapped");
    region_file(&region, 2, ROOT, 0o600);
    let mut cfg = vmm_config(&region, 2, ROOT);
    cfg.wrapper = vec!["timeout".into(), "120".into()];
    let vmm = FakeVmm::spawn(&cfg);
    assert_ne!(
        vmm.pid,
        vmm.child_pid(),
        "the wrapper runs the VMM as a child"
    );
    wait_mapped(vmm.pid, &region);
    let dir = tempdir("disc-wrapper");

    let d = Daemon::start(&dir, &auto_discovery(&shm));

    d.wait_serving("wrapped", 2);
    let status = d.status();
    let vm = status.vms.iter().find(|v| v.name == "wrapped").unwrap();
    assert_eq!(vm.tgid, vmm.pid);
    let tids: Vec<i32> = vm.vcpus.iter().map(|v| v.tid).collect();
    assert_eq!(tids, vmm.tids);
}

#[test]
fn a_process_that_only_names_the_region_is_not_served() {
    let shm = ShmDir::new("argv");
    let named = shm.path().join("pvsched-named");
    let mapped = shm.path().join("pvsched-mapped");
    region_file(&named, 1, ROOT, 0o600);
    region_file(&mapped, 1, ROOT, 0o600);
    let mut cfg = vmm_config(&named, 1, ROOT);
    cfg.no_map = true;
    let pretender = FakeVmm::spawn(&cfg);
    let real = FakeVmm::spawn(&vmm_config(&mapped, 1, ROOT));
    wait_mapped(real.pid, &mapped);
    let dir = tempdir("disc-argv");

    let d = Daemon::start(&dir, &auto_discovery(&shm));

    d.wait_serving("mapped", 1);
    assert_never_served(&d, &["named"], &pretender.tids);
}

#[test]
fn qmp_replies_naming_threads_outside_the_vmm_are_refused() {
    let dir = tempdir("qmp-lies");
    let entry = |name: &str| {
        format!(
            "[[vm]]\nname = \"{name}\"\nregion = \"{d}/{name}.region\"\nqmp = \"{d}/{name}.qmp\"\n",
            d = dir.display()
        )
    };
    let toml = format!(
        "{INTERVAL}[discovery]\nauto = false\n{}{}{}",
        entry("self"),
        entry("other"),
        entry("truth")
    );
    let d = Daemon::start(&dir, &toml);
    let me = gettid();
    let vmm = |name: &str, lie: Option<i32>| {
        let mut cfg = vmm_config(&dir.join(format!("{name}.region")), 1, ROOT);
        cfg.qmp = Some(dir.join(format!("{name}.qmp")));
        cfg.qmp_tids = lie.map(|t| vec![i64::from(t)]);
        FakeVmm::spawn(&cfg)
    };

    // (a) pvschedd's own main thread, (b) this test's thread.
    let _liar_self = vmm("self", Some(d.pid()));
    let _liar_other = vmm("other", Some(me));
    let truth = vmm("truth", None);

    d.wait_serving("truth", 1);
    wait_boosted(&d, truth.tids[0]);
    let daemon_before = params(d.pid());
    assert_eq!(daemon_before.policy, SCHED_FIFO, "{daemon_before:?}");
    assert_never_served(&d, &["self", "other"], &[me]);
    assert_eq!(
        params(d.pid()),
        daemon_before,
        "pvschedd's own thread changed"
    );
    assert_plain(me);
    wait_logged(&d, "is not a thread of the socket's peer");
}

#[test]
fn a_qmp_socket_of_an_unprivileged_user_is_refused() {
    let dir = tempdir("qmp-nobody");
    let nobody_dir = dir.join("nobody");
    std::fs::create_dir(&nobody_dir).unwrap();
    std::os::unix::fs::chown(&nobody_dir, Some(NOBODY.0), Some(NOBODY.1)).unwrap();
    let mut evil_cfg = vmm_config(&nobody_dir.join("evil.region"), 1, NOBODY);
    evil_cfg.qmp = Some(nobody_dir.join("evil.qmp"));
    evil_cfg.spin = true;
    let evil = FakeVmm::spawn(&evil_cfg);
    let mut good_cfg = vmm_config(&dir.join("good.region"), 1, ROOT);
    good_cfg.qmp = Some(dir.join("good.qmp"));
    let good = FakeVmm::spawn(&good_cfg);
    let toml = format!(
        "{INTERVAL}[discovery]\nauto = false\n\
         [[vm]]\nname = \"evil\"\nregion = \"{e}/evil.region\"\nqmp = \"{e}/evil.qmp\"\n\
         [[vm]]\nname = \"good\"\nregion = \"{g}/good.region\"\nqmp = \"{g}/good.qmp\"\n",
        e = nobody_dir.display(),
        g = dir.display()
    );

    let d = Daemon::start(&dir, &toml);

    d.wait_serving("good", 1);
    wait_boosted(&d, good.tids[0]);
    assert_never_served(&d, &["evil"], &evil.tids);
    wait_logged(&d, "peer runs as uid 65534");
}

/// A QMP socket in this process that accepts and never says a word.
fn silent_peer(path: &Path) {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
        }
    });
}

/// A QMP socket in this process whose greeting never ends.
fn endless_peer(path: &Path) {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let chunk = [b'x'; 65536];
        for mut conn in listener.incoming().flatten() {
            let _ = conn.write_all(b"{\"QMP\": \"");
            while conn.write_all(&chunk).is_ok() {}
        }
    });
}

/// A QMP socket in this process that never accepts: with a backlog of 0,
/// one connection waits in it and every later one finds it full.
fn deaf_peer(path: &Path) -> UnixListener {
    let listener = UnixListener::bind(path).unwrap();
    // SAFETY: listen(2) again on our own listening socket sets its backlog.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
    listener
}

#[test]
fn hostile_qmp_peers_time_out_and_the_daemon_serves_on() {
    let dir = tempdir("qmp-hostile");
    let q = |name: &str| dir.join(format!("{name}.qmp"));
    silent_peer(&q("silent"));
    endless_peer(&q("endless"));
    let _deaf = deaf_peer(&q("deaf"));
    let mut toml = format!("{INTERVAL}[discovery]\nauto = false\n");
    for name in ["silent", "endless", "deaf", "good"] {
        toml += &format!(
            "[[vm]]\nname = \"{name}\"\nregion = \"{d}/{name}.region\"\nqmp = \"{d}/{name}.qmp\"\n",
            d = dir.display()
        );
    }
    let d = Daemon::start(&dir, &toml);
    // One round is done (the last entry's socket is not there yet); the
    // deaf peer's backlog is full from now on.
    wait_logged(&d, &format!("{}: connect", q("good").display()));

    let mut good_cfg = vmm_config(&dir.join("good.region"), 1, ROOT);
    good_cfg.qmp = Some(q("good"));
    let good = FakeVmm::spawn(&good_cfg);

    d.wait_serving("good", 1);
    wait_boosted(&d, good.tids[0]);
    assert_never_served(&d, &["silent", "endless", "deaf"], &[]);
    let log = d.log();
    for name in ["silent", "endless", "deaf"] {
        let line = log
            .lines()
            .find(|l| l.contains(&format!("{}", q(name).display())))
            .unwrap_or_else(|| panic!("no reason logged for {name}; log:\n{log}"));
        assert!(
            line.contains("no complete reply within") || line.contains("longer than"),
            "{line}"
        );
    }
}
