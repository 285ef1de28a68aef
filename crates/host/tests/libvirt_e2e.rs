//! End to end with a real libvirtd: the Debian packages installed with apt
//! (pvsched, and pvsched-dkms building the guest module), libvirtd started
//! as on a host without systemd (`scripts/libvirtd.sh`), the installed
//! `/usr/sbin/pvschedd` with libvirt discovery, and three TCG domains
//! defined with virsh: one with `<shmem name='pvsched-...'>` ivshmem-plain,
//! served and boosted; one whose ivshmem-doorbell `<shmem>` has
//! `<server path='/run/pvsched/ivshmem.sock'/>`, served through pvschedd's
//! own ivshmem server with the doorbell (no `--doorbell`, no region file);
//! one without, never touched.
//!
//! Needs root, QEMU, the Debian cloud kernel and its headers, dkms and
//! libvirt (`scripts/install-deps.sh`). It changes the host as a user's
//! install would: the packages stay installed, and `scripts/libvirtd.sh`
//! may add one line to /etc/libvirt/qemu.conf (see there). The domains,
//! their files and a libvirtd it started are removed at the end, failed or
//! not. Progress lines go to stderr (`--nocapture` to watch).

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pvsched_vmtest::{find_cloud_kernel, wait_until, GuestImage, ImageConfig, GUEST_MODULE_PATH};
use support::libvirt::{
    dkms_module, install_packages, progress, vcpu_tids, Domain, Libvirtd, RtWatch, Shmem, Stage,
};
use support::{params, wait_boosted, Daemon};

const ON: &str = "pvs-e2e-on";
/// Served through pvschedd's ivshmem socket (`<server path=...>`), with the
/// doorbell.
const DB: &str = "pvs-e2e-db";
const OFF: &str = "pvs-e2e-off";
const BOOT: Duration = Duration::from_secs(120);
const CMD: Duration = Duration::from_secs(30);
/// A guest RT task spinning on vCPU 1 (busybox taskset, util-linux chrt).
const SPIN: &str =
    "chrt -f 10 taskset -c 1 sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & echo $!";

/// The module's lines in the guest's kernel log.
fn pvsched_dmesg(d: &Domain) -> String {
    d.exec_ok("dmesg | grep -i pvsched || true", CMD)
}

/// Loads the module and starts the spinner; the spinner's guest pid.
fn load_and_spin(d: &Domain) -> u32 {
    d.exec_ok(&format!("insmod {GUEST_MODULE_PATH}"), CMD);
    let pid: u32 = d
        .exec_ok(SPIN, CMD)
        .trim()
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("{}: no spinner pid", d.name));
    // `$!` is the forked child: it may not have reached chrt and taskset yet.
    let mut sched = String::new();
    for _ in 0..20 {
        sched = d.exec_ok(&format!("chrt -p {pid}; taskset -p {pid}"), CMD);
        if sched.contains("SCHED_FIFO")
            && sched.contains("priority: 10")
            && sched.trim_end().ends_with(": 2")
        {
            return pid;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!(
        "{}: spinner {pid} is not FIFO 10 on CPU 1:\n{sched}",
        d.name
    );
}

#[test]
fn status_files_name_the_vcpu_threads_before_the_domain() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/libvirt");
    let with = std::fs::read_to_string(dir.join("status-with-shmem.xml")).unwrap();
    let without = std::fs::read_to_string(dir.join("status-without-shmem.xml")).unwrap();

    assert_eq!(vcpu_tids(&with), vec![(0, 19096), (1, 19097)]);
    assert_eq!(vcpu_tids(&without), vec![(0, 19129), (1, 19130)]);
    assert!(with.contains("<shmem name='pvsched-pvs-e2e-on'>"));
    assert!(!without.contains("<shmem"));
}

#[test]
fn a_libvirt_domain_with_the_element_is_boosted_and_one_without_is_never_touched() {
    let t0 = Instant::now();
    // Guards are declared in the order things start, so that they are
    // dropped in reverse: domains and the watch, daemon, staged files, libvirtd.
    progress(t0, "packages");
    let version = install_packages(t0);
    let (_, release) = find_cloud_kernel().expect("a Debian cloud kernel in /boot");
    let ko = dkms_module(&version, &release, t0);
    progress(
        t0,
        &format!("module {} (dkms {version}, {release})", ko.display()),
    );

    let image = GuestImage::build(&ImageConfig {
        module: false,
        files: vec![(ko, GUEST_MODULE_PATH.into())],
        ..Default::default()
    })
    .expect("guest image");
    progress(t0, &format!("image {}", image.dir.display()));

    let _libvirtd = Libvirtd::start(t0);
    let stage = Stage::new(&image);

    // The installed libvirt hook tells pvschedd on its default socket: this
    // daemon listens there, and looks for VMs once a minute on its own (once
    // at start, before any domain runs), so only the hook can get a domain
    // served, and dropped, in time.
    let dir = PathBuf::from("/run/pvsched");
    std::fs::create_dir_all(&dir).unwrap();
    assert!(
        std::os::unix::net::UnixStream::connect(dir.join("control.sock")).is_err(),
        "a pvschedd already listens on /run/pvsched/control.sock: stop it first"
    );
    let _ = std::fs::remove_file(dir.join("pvschedd.log"));
    let toml = format!(
        "[daemon]\nstate_file = \"{d}/state.json\"\ncontrol_socket = \"{d}/control.sock\"\nmetrics = \"off\"\n\
         discovery_interval_ms = 60000\n[discovery]\nauto = false\n[libvirt]\nenabled = true\n",
        d = dir.display()
    );
    let mut daemon = Daemon::start_binary(Path::new("/usr/sbin/pvschedd"), &dir, &toml);
    progress(
        t0,
        &format!(
            "pvschedd {} (log {}/pvschedd.log)",
            daemon.pid(),
            dir.display()
        ),
    );

    let off = Domain::start(OFF, &stage, 2, None);
    let off_pid = off.qemu_pid();
    let watch = RtWatch::start(off_pid);
    let on = Domain::start(ON, &stage, 2, Some(Shmem::Plain(&format!("pvsched-{ON}"))));
    let ivshmem_socket = dir.join("ivshmem.sock");
    let db = Domain::start(
        DB,
        &stage,
        2,
        Some(Shmem::Server {
            name: &format!("pvsched-{DB}"),
            socket: &ivshmem_socket,
        }),
    );
    progress(
        t0,
        &format!(
            "domains started: {ON} (qemu {}), {DB} (qemu {}, on pvschedd's ivshmem socket), \
             {OFF} (qemu {off_pid})",
            on.qemu_pid(),
            db.qemu_pid()
        ),
    );

    for d in [&on, &db, &off] {
        d.wait_ready(BOOT);
        let cpus = d.exec_ok("nproc", CMD);
        assert_eq!(cpus.trim(), "2", "{}: guest CPUs", d.name);
        let tids = d.vcpu_tids();
        assert_eq!(tids.len(), 2, "{}: status file vCPUs {tids:?}", d.name);
        for (i, tid) in &tids {
            let comm = std::fs::read_to_string(format!("/proc/{}/task/{tid}/comm", d.qemu_pid()))
                .unwrap_or_default();
            assert_eq!(
                comm.trim(),
                format!("CPU {i}/TCG"),
                "{}: thread {tid}",
                d.name
            );
        }
    }
    progress(t0, "guests ready (2 CPUs each, vCPU threads CPU n/TCG)");

    // The module binds only to a region pvschedd has initialised: serve first.
    daemon.wait_serving(ON, 2);
    daemon.wait_serving(DB, 2);
    let served = daemon.status();
    assert!(
        !served.vms.iter().any(|v| v.name == OFF),
        "{OFF} has no <shmem> but is served: {served:?}"
    );
    assert!(
        daemon
            .log()
            .contains(&format!("libvirt hook: domain {ON} started")),
        "served, but not after libvirt's hook; log:\n{}",
        daemon.log()
    );
    progress(
        t0,
        &format!("pvschedd serves {ON} with 2 vCPUs (told by libvirt's hook), not {OFF}"),
    );

    load_and_spin(&on);
    let dmesg = pvsched_dmesg(&on);
    assert!(
        dmesg.contains("bound:") && dmesg.contains("generation"),
        "{ON}: the module did not bind to the region:\n{dmesg}"
    );
    load_and_spin(&db);
    let dmesg_db = pvsched_dmesg(&db);
    assert!(
        dmesg_db.contains("bound:") && dmesg_db.contains("generation"),
        "{DB}: the module did not bind to the region pvschedd served:\n{dmesg_db}"
    );
    load_and_spin(&off);
    let dmesg_off = pvsched_dmesg(&off);
    assert!(
        !dmesg_off.contains("0000:"),
        "{OFF} has no ivshmem device, yet the module found one:\n{dmesg_off}"
    );
    progress(
        t0,
        "module bound in the served guest, loaded without a device in the other; spinners run",
    );

    let vcpu1 = on
        .vcpu_tids()
        .into_iter()
        .find(|(i, _)| *i == 1)
        .map(|(_, t)| t)
        .expect("vCPU 1 in the status file");
    wait_boosted(&daemon, vcpu1);
    progress(t0, &format!("{ON} vCPU 1 (tid {vcpu1}) boosted"));
    let status = daemon.status();
    assert!(
        !status.vms.iter().any(|v| v.name == OFF),
        "{OFF} served: {status:?}"
    );
    let vm = status.vms.iter().find(|v| v.name == ON).expect("served");
    assert!(vm.guest_bound, "{ON}: guest not bound: {vm:?}");
    assert!(!vm.doorbell, "{ON}: ivshmem-plain has no doorbell: {vm:?}");

    // The domain on the socket: served by its QEMU's connection, with the
    // doorbell, its region pvschedd's; its vCPU boosted as the other's.
    let served_db = status.vms.iter().find(|v| v.name == DB).expect("served");
    assert_eq!(served_db.tgid, db.qemu_pid());
    assert!(
        served_db.doorbell,
        "{DB}: served without the doorbell: {served_db:?}"
    );
    assert!(
        served_db
            .region
            .starts_with(&dir.join("ivshmem").display().to_string()),
        "{DB}: region {}",
        served_db.region
    );
    let db_vcpu1 = db
        .vcpu_tids()
        .into_iter()
        .find(|(i, _)| *i == 1)
        .map(|(_, t)| t)
        .expect("vCPU 1 in the status file");
    wait_boosted(&daemon, db_vcpu1);
    let bound = wait_until(Duration::from_secs(10), Duration::from_millis(100), || {
        daemon
            .status()
            .vms
            .into_iter()
            .find(|v| v.name == DB && v.guest_bound)
    });
    assert!(bound.is_some(), "{DB}: guest not bound");
    progress(
        t0,
        &format!("{DB} served through the ivshmem socket with the doorbell; vCPU 1 boosted"),
    );
    db.destroy();
    wait_until(Duration::from_secs(5), Duration::from_millis(100), || {
        (!daemon.status().vms.iter().any(|v| v.name == DB)
            && !dir.join(format!("ivshmem/{DB}.region")).exists())
        .then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "{DB} still served (or its region left) 5 s after destroy; log:\n{}",
            daemon.log()
        )
    });
    progress(t0, &format!("{DB} destroyed: dropped, its region removed"));

    on.destroy();
    progress(t0, &format!("virsh destroy {ON}"));
    wait_until(Duration::from_secs(5), Duration::from_millis(100), || {
        (!daemon.status().vms.iter().any(|v| v.name == ON)).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "{ON} still served 5 s after destroy; log:\n{}",
            daemon.log()
        )
    });
    progress(t0, &format!("{ON} left the status"));

    let (samples, rt) = watch.finish();
    assert!(samples > 100, "RT watch took only {samples} samples");
    assert!(
        rt.is_empty(),
        "threads of {OFF} (qemu {off_pid}) ran RT: {rt:?}\nlog:\n{}",
        daemon.log()
    );
    for (_, tid) in off.vcpu_tids() {
        assert!(!params(tid).is_rt(), "{OFF} thread {tid} is RT");
    }
    progress(t0, &format!("{OFF}: no thread ever RT ({samples} samples)"));

    let exit = daemon.signal(libc::SIGTERM);
    assert!(
        exit.success(),
        "pvschedd exited {exit}; log:\n{}",
        daemon.log()
    );
    let log = daemon.log();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert!(
        errors.is_empty(),
        "pvschedd logged errors:\n{}",
        errors.join("\n")
    );
    for w in log.lines().filter(|l| l.contains(" WARN ")) {
        progress(t0, &format!("pvschedd warned: {w}"));
    }
    progress(t0, "pvschedd stopped cleanly; cleaning up");
}
