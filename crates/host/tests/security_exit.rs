//! Every way pvschedd stops leaves no thread boosted, and run-time changes
//! obey the configuration's rules. Real daemon, real fake VMM processes,
//! real signals, real `kill -9`, real thread-id reuse.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use pvsched_base::sched::{set_params, ThreadParams};
use pvsched_base::thread::start_time;
use pvsched_host::statefile::StateFile;
use pvsched_vmtest::wait_until;
use support::{
    params, qmp_vm, serial, tempdir, wait_boosted, workspace_bin, Daemon, FakeVmm, FakeVmmConfig,
    RtObserver,
};

/// A fake VMM whose guest claims a FIFO task on every vCPU, spinning, with
/// a truthful QMP socket; and the `[[vm]]` entry that serves it.
/// A fake VMM whose guest spins RT on every vCPU, and its `[[vm]]` entry
/// (ending in its `[vm.limits]` table). Never demoted: these tests watch
/// the boost's priority, and a guest that always asks would otherwise stay
/// at priority 1 from its first long burst on.
fn spinning_vm(dir: &Path, name: &str) -> (FakeVmm, String) {
    let mut cfg = FakeVmmConfig::new(Path::new(""));
    cfg.guest_fifo = Some(10);
    cfg.spin = true;
    let (vmm, entry) = qmp_vm(dir, name, cfg);
    (
        vmm,
        format!("{entry}[vm.limits]\ndemote_after_ns = 1_000_000_000\n"),
    )
}

fn assert_original(tids: &[i32]) {
    for &tid in tids {
        let now = params(tid);
        assert!(
            now.same_setting(&ThreadParams::other(0)),
            "thread {tid}: {now} (flags {:#x})",
            now.flags
        );
    }
}

#[test]
fn every_stop_signal_restores_the_boosted_threads() {
    let _serial = serial();
    let dir = tempdir("stop-signals");
    let (vmm, entry) = spinning_vm(&dir, "sig");
    for sig in [
        libc::SIGALRM,
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGTERM,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ] {
        let mut d = Daemon::start(&dir, &entry);
        wait_boosted(&d, vmm.tids[0]);

        let status = d.signal(sig);

        assert!(
            status.code().is_some(),
            "signal {sig} killed it: {status:?}"
        );
        assert_original(&vmm.tids);
        assert!(!d.state_file().exists(), "signal {sig}: state file left");
    }
}

#[test]
fn a_vm_whose_threads_cannot_be_recorded_is_not_boosted() {
    let _serial = serial();
    let dir = tempdir("state-unwritable");
    let (vmm, entry) = spinning_vm(&dir, "norec");
    // Where the state file is written first (then renamed) is a directory:
    // every write fails, reading (there is no file) does not.
    std::fs::create_dir_all(dir.join("state.tmp")).unwrap();

    let d = Daemon::start(&dir, &entry);
    let _rt = RtObserver::new();
    let served = wait_until(Duration::from_secs(3), Duration::from_millis(20), || {
        (!d.status().vms.is_empty() || params(vmm.tids[0]).is_rt()).then_some(())
    });

    assert!(
        served.is_none(),
        "served without a state file; log:\n{}",
        d.log()
    );
    assert_original(&vmm.tids);
    assert!(d.log().contains("cannot record"), "log:\n{}", d.log());
}

/// A state file listing a live thread whose restore fails (the recorded
/// original is not a valid setting: FIFO at priority 0).
fn unrestorable_state(path: &Path, tgid: i32, tid: i32) {
    let text = format!(
        r#"{{"version":1,"daemon_pid":999999,"threads":[{{"vm":"x","tgid":{tgid},"tid":{tid},"start_time":{},"original":{{"policy":1,"priority":0,"nice":0}}}}]}}"#,
        start_time(tgid, tid).unwrap()
    );
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_state_file_is_kept_while_a_thread_it_lists_could_not_be_restored() {
    let _serial = serial();
    let dir = tempdir("restore-fails");
    let region = dir.join("left.region");
    let mut cfg = FakeVmmConfig::new(&region);
    cfg.no_map = true;
    let vmm = FakeVmm::spawn(&cfg);
    let tid = vmm.tids[0];
    set_params(tid, &ThreadParams::rr(3)).unwrap();
    unrestorable_state(&dir.join("state.json"), vmm.pid, tid);

    let mut d = Daemon::start(&dir, "[discovery]\nauto = false\n");
    d.status();
    let during = StateFile::load(&d.state_file()).unwrap();
    d.signal(libc::SIGTERM);
    let after = StateFile::load(&d.state_file()).unwrap();

    set_params(tid, &ThreadParams::other(0)).unwrap();
    for state in [during, after] {
        let state = state.expect("state file removed with a thread unrestored");
        assert!(state.threads.iter().any(|t| t.tid == tid), "{state:?}");
    }
}

#[test]
fn a_cap_above_the_daemons_priority_is_refused_at_run_time() {
    let _serial = serial();
    let dir = tempdir("set-band");
    let (vmm, entry) = spinning_vm(&dir, "band");
    let d = Daemon::start(&dir, &entry);
    wait_boosted(&d, vmm.tids[0]);
    let ctl = |args: &[&str]| {
        std::process::Command::new(workspace_bin("pvschedctl"))
            .arg("--socket")
            .arg(d.socket())
            .args(args)
            .output()
            .unwrap()
    };

    let _rt = RtObserver::new();
    let boosted_at = |prio: u32| {
        wait_until(Duration::from_secs(5), Duration::from_millis(1), || {
            let p = params(vmm.tids[0]);
            (p.is_rt() && p.priority == prio).then_some(())
        })
    };
    // The default cap: the guest's FIFO 10 runs at 4 on the host.
    assert!(boosted_at(4).is_some());

    let refused = ctl(&["set", "max_rt_priority", "50"]);
    let refused_one = ctl(&["set", "--vm", "band", "max_rt_priority", "5"]);
    let accepted = ctl(&["set", "max_rt_priority", "3"]);

    assert!(!refused.status.success(), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("below daemon.priority"),
        "{refused:?}"
    );
    assert!(!refused_one.status.success(), "{refused_one:?}");
    assert!(accepted.status.success(), "{accepted:?}");
    assert!(boosted_at(3).is_some(), "the new cap is not in force");
}

/// A small deterministic generator (xorshift): random kill points that the
/// same test run repeats.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn kill_9_at_any_point_leaves_nothing_a_restart_does_not_restore() {
    let _serial = serial();
    let dir = tempdir("kill9");
    let (vmm, entry) = spinning_vm(&dir, "k9");
    // A guest spinning RT on every vCPU spends the default boost budget
    // (20 %) in a fraction of a second and is then left alone, so few kills
    // would find a vCPU boosted. With the whole budget it is boosted about
    // half the time (max_boost_ns on, throttle_ns off).
    let entry = format!("{entry}boost_share_permille = 1000\n");
    let region = dir.join("k9.region");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let rounds = 50;
    let mut boosted_at_kill = 0;
    for round in 0..rounds {
        // Start (recovering what the last one left), run a random while:
        // starting, discovering, initialising the region, boosting.
        let mut d = Daemon::start(&dir, &entry);
        // RT before the sleep: on a machine with as many CPUs as the VM has
        // spinning boosted vCPUs, a SCHED_OTHER test thread would only wake
        // once they were unboosted, and the kill would never find one boosted.
        let _rt = RtObserver::new();
        std::thread::sleep(Duration::from_millis(rng.below(1500)));
        d.signal(libc::SIGKILL);

        // The state file parses, and lists every thread left boosted.
        let state = StateFile::load(&d.state_file())
            .unwrap_or_else(|e| panic!("round {round}: state file unreadable: {e}"));
        let listed: Vec<i32> = state
            .iter()
            .flat_map(|s| &s.threads)
            .map(|t| t.tid)
            .collect();
        for &tid in &vmm.tids {
            if params(tid).is_rt() {
                boosted_at_kill += 1;
                assert!(
                    listed.contains(&tid),
                    "round {round}: thread {tid} boosted but not in the state file {state:?}"
                );
            }
        }
    }
    // A last start with no VM only recovers.
    let mut d = Daemon::start(&dir, "[discovery]\nauto = false\n");
    d.signal(libc::SIGTERM);

    assert_original(&vmm.tids);
    assert!(!d.state_file().exists());
    let file = pvsched_base::region_file::RegionFile::open(&region, 2).unwrap();
    assert!(file.region().validate().is_ok(), "region left invalid");
    eprintln!("{rounds} kills, {boosted_at_kill} of them with a vCPU boosted");
    assert!(
        boosted_at_kill > 0,
        "no kill hit a boosted vCPU: the test tested nothing"
    );
}

/// Writes `last` to /proc/sys/kernel/ns_last_pid: the next process or
/// thread created gets `last + 1` if it is free.
fn set_last_pid(last: i32) -> bool {
    std::fs::write("/proc/sys/kernel/ns_last_pid", last.to_string()).is_ok()
}

#[test]
fn a_reused_thread_id_of_another_process_is_never_touched() {
    let _serial = serial();
    // One daemon configured for 20 VMs that come and go one after another.
    let dir = tempdir("tid-reuse");
    let rounds = 20;
    let mut toml = String::from("[discovery]\nauto = false\n");
    for round in 0..rounds {
        toml += &format!(
            "[[vm]]\nname = \"life{round}\"\nregion = \"{d}/life{round}.region\"\nqmp = \"{d}/life{round}.qmp\"\n",
            d = dir.display()
        );
    }
    let d = Daemon::start(&dir, &toml);
    let mut reused = 0;
    for round in 0..rounds {
        let name = format!("life{round}");
        let (mut vmm, _) = spinning_vm(&dir, &name);
        d.wait_serving(&name, 2);
        wait_boosted(&d, vmm.tids[1]);
        let victim_tid = vmm.tids[1];

        // The VM dies; a process of somebody else gets its vCPU's thread id
        // before the daemon has noticed.
        vmm.kill();
        let Some(mut victim) = set_last_pid(victim_tid - 1)
            .then(|| std::process::Command::new("sleep").arg("2").spawn().ok())
            .flatten()
        else {
            continue;
        };
        if victim.id() as i32 == victim_tid {
            reused += 1;
            let _rt = RtObserver::new();
            let until = Instant::now() + Duration::from_millis(1500);
            while Instant::now() < until {
                assert!(
                    !params(victim_tid).is_rt(),
                    "round {round}: reused thread id {victim_tid} boosted; log:\n{}",
                    d.log()
                );
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        // SAFETY: kill(2) of our own child, not yet reaped.
        unsafe { libc::kill(victim.id() as i32, libc::SIGKILL) };
        let _ = victim.wait();
    }
    eprintln!("thread id reused by another process in {reused} of {rounds} rounds");
    assert!(reused >= 5, "thread ids were reused only {reused} times");
}
