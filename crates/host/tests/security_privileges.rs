//! Least privilege: once started, pvschedd keeps only the capabilities it
//! uses (in every thread: capabilities are per thread), cannot gain any
//! back through an exec (bounding set, no-new-privs), and still does its
//! work with them, for a VMM of another user too. Real daemon run as root,
//! real fake VMMs (as root and as `nobody`), real signal.

mod support;

use std::path::Path;
use std::time::Duration;

use pvsched_abi::F_ALL;
use pvsched_base::caps::{mask, Capability};
use pvsched_base::region_file::RegionFile;
use pvsched_base::sched::{ThreadParams, SCHED_FIFO};
use pvsched_vmtest::wait_until;
use support::{params, qmp_vm, tempdir, Daemon, FakeVmm, FakeVmmConfig, ShmDir};

/// The documented set (crates/host/README.md, packaging/pvschedd.service):
/// sched_setattr, region files and QMP sockets of the VMM's user, other
/// users' /proc/<pid>/maps; and, while RLIMIT_MEMLOCK is finite (so here,
/// not under the unit's LimitMEMLOCK=infinity), mlockall's later mappings.
fn documented_caps() -> u64 {
    let mut caps = vec![
        Capability::CAP_SYS_NICE,
        Capability::CAP_DAC_OVERRIDE,
        Capability::CAP_PERFMON,
    ];
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit we own. The daemon inherits ours.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) },
        0
    );
    if lim.rlim_cur != libc::RLIM_INFINITY {
        caps.push(Capability::CAP_IPC_LOCK);
    }
    mask(&caps)
}

/// The `Cap*`, `NoNewPrivs` and `Uid` lines of one thread's status.
#[derive(PartialEq, Eq)]
struct Privileges {
    inheritable: u64,
    permitted: u64,
    effective: u64,
    bounding: u64,
    ambient: u64,
    no_new_privs: bool,
    uids: String,
}

impl std::fmt::Debug for Privileges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CapInh {:#x} CapPrm {:#x} CapEff {:#x} CapBnd {:#x} CapAmb {:#x} NoNewPrivs {} Uid {}",
            self.inheritable,
            self.permitted,
            self.effective,
            self.bounding,
            self.ambient,
            self.no_new_privs,
            self.uids
        )
    }
}

fn privileges(status: &str) -> Privileges {
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in\n{status}"))
            .trim()
            .to_string()
    };
    let hex = |key: &str| u64::from_str_radix(&field(key), 16).unwrap();
    Privileges {
        inheritable: hex("CapInh:"),
        permitted: hex("CapPrm:"),
        effective: hex("CapEff:"),
        bounding: hex("CapBnd:"),
        ambient: hex("CapAmb:"),
        no_new_privs: field("NoNewPrivs:") == "1",
        uids: field("Uid:")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// Every thread of process `pid`, by name, with its privileges.
fn thread_privileges(pid: i32) -> Vec<(String, Privileges)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        let Ok(status) = std::fs::read_to_string(task.join("status")) else {
            continue; // exited meanwhile
        };
        out.push((comm.trim().to_string(), privileges(&status)));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// A fake VMM run as root with one vCPU whose guest says a FIFO task of
/// priority 3 runs on it, spinning (`spin`: boosted, it takes a whole CPU)
/// or not; served through QMP; and its `[[vm]]` entry.
fn guest_rt_vm(dir: &Path, name: &str, spin: bool) -> (FakeVmm, String) {
    let mut cfg = FakeVmmConfig::new(Path::new(""));
    cfg.vcpus = 1;
    cfg.guest_fifo = Some(3);
    cfg.spin = spin;
    let (vmm, entry) = qmp_vm(dir, name, cfg);
    // Never demoted: the boost test looks for priority 3, which a spinning
    // guest keeps for only the first 4 ms of its first burst otherwise.
    (
        vmm,
        format!("{entry}[vm.limits]\ndemote_after_ns = 1_000_000_000\n"),
    )
}

#[test]
fn every_daemon_thread_keeps_only_the_documented_capabilities_and_no_new_privileges() {
    // Serving a VM, so that discovery, control, the event thread and the
    // metrics thread all exist and have done their work.
    let dir = tempdir("caps-masks");
    let (vmm, entry) = guest_rt_vm(&dir, "caps", false);
    let d = Daemon::start_with_config(
        &dir,
        &format!(
            "[daemon]\nstate_file = \"{d}/state.json\"\ncontrol_socket = \"{d}/control.sock\"\nmetrics = \"unix:{d}/metrics.sock\"\n{entry}",
            d = dir.display()
        ),
    );
    d.wait_serving("caps", vmm.tids.len());
    // A thread names itself once it first runs.
    let helpers = ["pvsched-control", "pvsched-discove", "pvsched-metrics"];
    let named = wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
        let threads = thread_privileges(d.pid());
        helpers
            .iter()
            .all(|h| threads.iter().any(|t| t.0 == *h))
            .then_some(())
    });
    assert!(
        named.is_some(),
        "helper threads missing: {:?}",
        thread_privileges(d.pid())
    );

    let threads = thread_privileges(d.pid());

    let want = documented_caps();
    let expected = Privileges {
        inheritable: 0,
        permitted: want,
        effective: want,
        bounding: want,
        ambient: 0,
        no_new_privs: true,
        uids: "0 0 0 0".into(),
    };
    assert!(threads.len() >= 4, "{threads:?}");
    for (name, got) in &threads {
        assert_eq!(got, &expected, "thread {name}");
    }

    // Only the event thread runs RT (it turns SCHED_FIFO before its BPF
    // programs load, reset on fork): a helper that inherited it would take
    // the CPU from boosted vCPUs for QMP and status answers.
    let event_thread = params(d.pid());
    assert_eq!(
        (event_thread.policy, event_thread.priority),
        (SCHED_FIFO, 5),
        "the event thread runs at the documented default priority"
    );
    for task in std::fs::read_dir(format!("/proc/{}/task", d.pid())).unwrap() {
        let tid: i32 = task.unwrap().file_name().to_str().unwrap().parse().unwrap();
        if tid == d.pid() {
            continue;
        }
        let Ok(p) = pvsched_base::sched::get_params(tid) else {
            continue; // exited meanwhile
        };
        assert_eq!(
            (p.policy, p.priority, p.nice),
            (pvsched_base::sched::SCHED_OTHER, 0, 0),
            "helper thread {tid}"
        );
    }
}

#[test]
fn with_only_those_capabilities_it_still_runs_fifo_boosts_a_vcpu_and_restores_it_on_sigterm() {
    let dir = tempdir("caps-boost");
    let (vmm, entry) = guest_rt_vm(&dir, "capboost", true);
    let before: Vec<ThreadParams> = vmm.tids.iter().map(|&t| params(t)).collect();
    let mut d = Daemon::start(&dir, &entry);

    let boosted = wait_until(Duration::from_secs(10), Duration::from_millis(5), || {
        let p = params(vmm.tids[0]);
        (p.is_rt() && p.priority == 3).then_some(p)
    });
    let daemon = privileges(&std::fs::read_to_string(format!("/proc/{}/status", d.pid())).unwrap());
    // The main thread is the event thread: mlockall and SCHED_FIFO after
    // the drop.
    let event_thread = params(d.pid());
    let status = d.signal(libc::SIGTERM);

    assert!(
        boosted.is_some(),
        "vCPU 0 never boosted to RT 3; log:\n{}",
        d.log()
    );
    assert_eq!(
        daemon.effective,
        documented_caps(),
        "boosted with more: {daemon:?}"
    );
    assert_eq!(
        (event_thread.policy, event_thread.priority),
        (SCHED_FIFO, 5),
        "event thread; log:\n{}",
        d.log()
    );
    assert!(status.success(), "pvschedd: {status:?}; log:\n{}", d.log());
    for (tid, orig) in vmm.tids.iter().zip(&before) {
        let now = params(*tid);
        assert_eq!(
            (now.policy, now.priority, now.nice),
            (orig.policy, orig.priority, orig.nice),
            "thread {tid} not restored"
        );
    }
}

#[test]
fn a_vmm_of_another_allowed_user_is_found_opened_and_boosted_with_only_those_capabilities() {
    // Each kept capability at work: `nobody` (allowed here, as libvirt-qemu
    // is by default) maps a region file it owns, mode 0600. Finding it reads
    // nobody's /proc/<pid>/maps (CAP_PERFMON), opening it read-write needs
    // CAP_DAC_OVERRIDE, boosting nobody's thread CAP_SYS_NICE.
    let nobody = (65534, 65534);
    let shm = ShmDir::new("caps-user");
    let region = shm.0.join("pvsched-other");
    let mut f = RegionFile::create(&region, 1, 0o600).unwrap();
    f.region_mut().init_header(1, F_ALL).unwrap();
    drop(f);
    std::os::unix::fs::chown(&region, Some(nobody.0), Some(nobody.1)).unwrap();
    let mut cfg = FakeVmmConfig::new(&region);
    cfg.vcpus = 1;
    cfg.name_format = "CPU {}/KVM".into();
    cfg.guest_fifo = Some(3);
    cfg.spin = true;
    // Run as nobody by setpriv (it execs: the VMM keeps its pid).
    cfg.wrapper = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ]
    .map(String::from)
    .to_vec();
    let vmm = FakeVmm::spawn(&cfg);
    let vmm_status = std::fs::read_to_string(format!("/proc/{}/status", vmm.pid)).unwrap();
    assert_eq!(privileges(&vmm_status).uids, "65534 65534 65534 65534");
    let dir = tempdir("caps-user");

    let d = Daemon::start(
        &dir,
        &format!(
            "discovery_interval_ms = 100\n[discovery]\nauto = true\nregion_dir = \"{}\"\nregion_prefix = \"pvsched-\"\nallowed_users = [\"root\", \"nobody\"]\n",
            shm.0.display()
        ),
    );
    let boosted = wait_until(Duration::from_secs(10), Duration::from_millis(5), || {
        params(vmm.tids[0]).is_rt().then_some(())
    });
    let daemon = privileges(&std::fs::read_to_string(format!("/proc/{}/status", d.pid())).unwrap());

    assert!(
        boosted.is_some(),
        "nobody's vCPU never boosted; log:\n{}",
        d.log()
    );
    assert_eq!(
        daemon.effective,
        documented_caps(),
        "boosted with more: {daemon:?}"
    );
}
