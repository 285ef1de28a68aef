//! The lock scenario's guest commands, their parsing, each mode's daemon
//! settings, the plan, the plot title and the choice among disturbed tries.

use std::collections::BTreeMap;
use std::path::Path;

use super::commands::*;
use super::model::*;
use super::render::*;
use super::session::*;
use super::settings::*;
use crate::harness::meta::Meta;
use crate::harness::settings::Settings;

#[test]
fn the_guest_command_reads_the_trigger_around_lockstress() {
    // Act
    let c = lockstress_cmd(10, Workload::Rename, 0);

    // Assert
    assert!(c.contains("lockstress -d 10 -w rename;"), "{c}");
    assert!(!c.contains(" -t "), "{c}");
    assert!(c.find("LOCKHITS0").unwrap() < c.find("lockstress -d").unwrap());
    assert!(c.find("LOCKHITS1").unwrap() > c.find("lockstress -d").unwrap());
    assert!(c.ends_with("exit $rc"));
    assert!(c.len() < pvsched_vmtest::MAX_COMMAND_LEN);
    assert!(!c.contains('\n'));
    assert!(lockstress_cmd(5, Workload::Files, 8).contains("lockstress -d 5 -w files -t 8;"));
    assert!(trigger_cmd().len() < pvsched_vmtest::MAX_COMMAND_LEN);
}

#[test]
fn a_run_parses_with_and_without_the_trigger() {
    // Arrange
    let json = "{\"workload\":\"rename\",\"threads\":4,\"cpus\":2,\"ops\":61601,\
                \"ops_per_s\":6132.6,\"elapsed_s\":10.045,\"per_s\":[18034,7980],\
                \"thread_ops_min\":13775,\"thread_ops_max\":17395,\"failed\":false}";
    let out = format!("LOCKHITS0 1200\n{json}\nLOCKHITS1 33328\n");

    // Act
    let run = parse_run(&out).unwrap();
    let none = parse_run(&format!("LOCKHITS0 \n{json}\nLOCKHITS1 \n")).unwrap();

    // Assert
    let r = &run.result;
    assert_eq!((r.ops, r.threads, r.per_s.len()), (61601, 4, 2));
    assert_eq!(r.ops_per_s, 6132.6);
    assert_eq!(run.kernel_contentions, Some(32128));
    assert_eq!(none.kernel_contentions, None);
    assert_eq!((run.held, none.held), (None, None));
    assert!(parse_run("lockstress: open: ENOSPC").is_err());
}

#[test]
fn each_pvsched_mode_sets_its_own_lock_handling() {
    // Arrange: a user overlay that already sets it and another key.
    let user: toml::Table = "[defaults]\nhonor_lock_holders = true\nboost_share_permille = 300\n\
                             [daemon]\nlazy_events = false\n"
        .parse()
        .unwrap();

    // Act
    let off = mode_overlay(&user, daemon_of(LockMode::PvschedNolock));
    let on = mode_overlay(&toml::Table::new(), daemon_of(LockMode::PvschedLock));

    // Assert
    assert_eq!(off["defaults"]["honor_lock_holders"].as_bool(), Some(false));
    assert_eq!(
        off["defaults"]["boost_share_permille"].as_integer(),
        Some(300)
    );
    assert_eq!(off["daemon"]["lazy_events"].as_bool(), Some(false));
    assert_eq!(on["defaults"]["honor_lock_holders"].as_bool(), Some(true));
    let cfg = crate::daemon::config_toml_vms(Path::new("/r"), &[], &off);
    assert!(cfg.contains("honor_lock_holders = false"), "{cfg}");
}

/// The daemon settings of a pvsched mode.
fn daemon_of(mode: LockMode) -> ModeDaemon {
    mode.daemon().expect("a pvsched mode")
}

/// The config pvschedd gets in `mode` with `--pvschedd-config` `user`, parsed.
fn generated_config(user: &str, mode: LockMode) -> toml::Table {
    let user: toml::Table = user.parse().unwrap();
    let overlay = mode_overlay(&user, daemon_of(mode));
    crate::daemon::config_toml_vms(Path::new("/r"), &[], &overlay)
        .parse()
        .unwrap()
}

#[test]
fn the_rt_modes_run_the_rt_backend_whatever_the_config_names() {
    // Arrange
    let user = "[daemon]\nbackend = \"sched_ext\"\nscx_extension_us = 2000\n";

    // Act
    let nolock = generated_config(user, LockMode::PvschedNolock);
    let lock = generated_config(user, LockMode::PvschedLock);

    // Assert
    for (cfg, honor) in [(&nolock, false), (&lock, true)] {
        assert_eq!(cfg["daemon"]["backend"].as_str(), Some("rt"), "{cfg}");
        assert_eq!(cfg["defaults"]["honor_lock_holders"].as_bool(), Some(honor));
        // Nothing of the rt backend's: the user's value stays, unused.
        assert_eq!(cfg["daemon"]["scx_extension_us"].as_integer(), Some(2000));
    }
    // Explicit in the mode's overlay, not left to the generated default.
    let overlay = mode_overlay(&toml::Table::new(), daemon_of(LockMode::PvschedLock));
    assert_eq!(overlay["daemon"]["backend"].as_str(), Some("rt"));
}

#[test]
fn pvsched_scx_nolock_runs_sched_ext_without_extensions_or_lock_handling() {
    // Arrange: a config asking for the rt backend, an extension and lock handling.
    let user = "[daemon]\nbackend = \"rt\"\nscx_extension_us = 2000\nlazy_events = false\n\
                [defaults]\nhonor_lock_holders = true\n";

    // Act
    let cfg = generated_config(user, LockMode::PvschedScxNolock);
    let bare = generated_config("", LockMode::PvschedScxNolock);

    // Assert
    for c in [&cfg, &bare] {
        assert_eq!(c["daemon"]["backend"].as_str(), Some("sched_ext"), "{c}");
        assert_eq!(c["daemon"]["scx_extension_us"].as_integer(), Some(0));
        assert_eq!(c["defaults"]["honor_lock_holders"].as_bool(), Some(false));
    }
    assert_eq!(cfg["daemon"]["lazy_events"].as_bool(), Some(false));
}

#[test]
fn pvsched_scx_lock_keeps_the_configs_extension_or_the_daemons_default() {
    // Act
    let configured = generated_config(
        "[daemon]\nbackend = \"rt\"\nscx_extension_us = 2000\n",
        LockMode::PvschedScxLock,
    );
    let default = generated_config("", LockMode::PvschedScxLock);

    // Assert
    for c in [&configured, &default] {
        assert_eq!(c["daemon"]["backend"].as_str(), Some("sched_ext"), "{c}");
        assert_eq!(c["defaults"]["honor_lock_holders"].as_bool(), Some(true));
    }
    assert_eq!(
        configured["daemon"]["scx_extension_us"].as_integer(),
        Some(2000)
    );
    // Not set: pvschedd's own default (4000 µs) applies.
    assert!(
        default["daemon"].get("scx_extension_us").is_none(),
        "{default}"
    );
}

#[test]
fn every_mode_names_its_backend_and_only_vanilla_has_no_daemon() {
    use LockMode::*;
    assert_eq!(Vanilla.daemon(), None);
    assert_eq!(PvschedNolock.backend(), Some(LockBackend::Rt));
    assert_eq!(PvschedLock.backend(), Some(LockBackend::Rt));
    assert_eq!(PvschedScxNolock.backend(), Some(LockBackend::SchedExt));
    assert_eq!(PvschedScxLock.backend(), Some(LockBackend::SchedExt));
    assert_eq!(
        LockBackend::SchedExt.lock_pair(),
        (PvschedScxNolock, PvschedScxLock)
    );
    assert_eq!(LockBackend::Rt.lock_pair(), (PvschedNolock, PvschedLock));
    assert_eq!(
        LockMode::ALL,
        [
            Vanilla,
            PvschedNolock,
            PvschedLock,
            PvschedScxNolock,
            PvschedScxLock
        ]
    );
}

#[test]
fn the_journal_says_which_config_values_the_modes_override_or_keep() {
    // Arrange
    let user: toml::Table = "[daemon]\nbackend = \"sched_ext\"\nscx_extension_us = 2000\n\
                             [defaults]\nhonor_lock_holders = true\n"
        .parse()
        .unwrap();
    use LockMode::*;

    // Act
    let all = overlay_notes(&user, &LockMode::ALL);
    let rt_only = overlay_notes(&user, &[Vanilla, PvschedNolock, PvschedLock]);
    let vanilla = overlay_notes(&user, &[Vanilla]);
    let quiet = overlay_notes(&toml::Table::new(), &LockMode::ALL);

    // Assert
    assert_eq!(
        all,
        [
            "--pvschedd-config sets honor_lock_holders: each pvsched mode sets its own",
            "--pvschedd-config sets [daemon] backend = \"sched_ext\": each pvsched mode sets \
             its own, which wins (pvsched-nolock: rt, pvsched-lock: rt, pvsched-scx-nolock: \
             sched_ext, pvsched-scx-lock: sched_ext)",
            "--pvschedd-config sets [daemon] scx_extension_us = 2000: pvsched-scx-nolock runs \
             with its own 0, which wins; pvsched-scx-lock keeps the config's 2000",
        ]
    );
    // The extension only matters to the sched_ext modes.
    assert_eq!(rt_only.len(), 2, "{rt_only:?}");
    assert!(rt_only[1].contains("(pvsched-nolock: rt, pvsched-lock: rt)"));
    assert_eq!(vanilla.len(), 1, "{vanilla:?}");
    assert!(quiet.is_empty());
}

#[test]
fn a_window_ended_on_another_backend_than_the_modes_is_named() {
    use LockMode::*;
    let note = backend_mismatch(
        "rep1-overcommitted-pvsched-scx-lock",
        PvschedScxLock,
        Some("rt"),
    );
    assert!(
        note.as_deref().is_some_and(|n| n.starts_with(
            "rep1-overcommitted-pvsched-scx-lock: pvschedd served on the rt backend at the end \
             of the window, not sched_ext"
        )),
        "{note:?}"
    );
    assert_eq!(
        backend_mismatch("t", PvschedScxLock, Some("sched_ext")),
        None
    );
    assert_eq!(backend_mismatch("t", PvschedLock, Some("rt")), None);
    assert_eq!(backend_mismatch("t", PvschedLock, None), None);
    assert_eq!(backend_mismatch("t", Vanilla, Some("rt")), None);
}

#[test]
fn plan_counts_one_phase_per_case_mode_and_repeat() {
    let s = LockSettings {
        base: Settings {
            repeat: 5,
            ..Settings::example()
        },
        cases: LockCase::ALL.to_vec(),
        modes: LockMode::ALL.to_vec(),
        workload: Workload::Rename,
        threads: 0,
    };
    // 5 repeats x 2 cases x 5 modes, 10 s each.
    assert_eq!(plan(&s), (50, 500.0));
}

#[test]
fn the_plot_title_names_the_run_and_its_command() {
    // Arrange
    let mut raw = LocksRaw {
        scenario: "locks".into(),
        meta: LocksMeta {
            base: Meta {
                command: "target/release/pvsched-bench --scenario locks --repeat 1".into(),
                started: "2026-11-24 22:05:11".into(),
                repeat: 1,
                duration_s: 5,
                accel: "tcg".into(),
                ..Default::default()
            },
            workload: "rename".into(),
            ..Default::default()
        },
        cases: vec![],
        modes: vec![],
        phases: vec![],
        sessions: vec![],
    };

    // Act
    let t = plot_title(&raw);
    raw.meta.base.command = format!("x {}", "--a ".repeat(40));
    let long = plot_title(&raw);

    // Assert
    assert_eq!(
        t,
        "lockstress rename ops/s per mode (bar: median, line: min-max of 1 x 5 s, TCG); \
         run 2026-11-24 22:05:11: pvsched-bench --scenario locks --repeat 1"
    );
    assert!(long.ends_with('…') && long.len() < 200, "{long}");
}

#[test]
fn the_least_disturbed_try_is_kept() {
    let p = |f: f64| Phase {
        case: LockCase::Overcommitted,
        mode: LockMode::Vanilla,
        rep: 1,
        window_s: 10.0,
        host_cpus: 2,
        foreign_cpu: f,
        vms: vec![],
        machine_busy: None,
        daemon_cpu_s: None,
        daemon_counters: BTreeMap::new(),
        backend_active: None,
        kvm_preemptions: None,
    };
    assert_eq!(
        least_disturbed(Some(p(0.3)), Some(p(0.2))).map(|x| x.foreign_cpu),
        Some(0.2)
    );
    assert_eq!(
        least_disturbed(Some(p(0.1)), Some(p(0.2))).map(|x| x.foreign_cpu),
        Some(0.1)
    );
    assert_eq!(
        least_disturbed(None, Some(p(0.5))).map(|x| x.foreign_cpu),
        Some(0.5)
    );
    assert!(least_disturbed(None, None).is_none());
}

#[test]
fn the_progress_line_names_each_vm() {
    let p = Phase {
        case: LockCase::Alone,
        mode: LockMode::PvschedLock,
        rep: 1,
        window_s: 10.0,
        host_cpus: 2,
        foreign_cpu: 0.02,
        machine_busy: None,
        daemon_cpu_s: None,
        daemon_counters: BTreeMap::new(),
        backend_active: None,
        kvm_preemptions: None,
        vms: vec![
            VmPhase {
                name: VM_A.into(),
                ran: true,
                result: Some(LockstressResult {
                    ops_per_s: 1234.4,
                    ..Default::default()
                }),
                cpu_s: 15.0,
                guest_locks: Some(GuestLocks {
                    contended: 7,
                    preempted: 1,
                    ..Default::default()
                }),
                ..Default::default()
            },
            VmPhase {
                name: VM_B.into(),
                cpu_s: 5.0,
                ..Default::default()
            },
        ],
    };
    let l = phase_line(&p);
    let mut scx = p.clone();
    scx.vms[0].scx_extensions = Some(ScxExtensions {
        granted: 12,
        refused: 3,
        extended_ms: 48.0,
        for_lock_holder: 0,
        at_preemption: 0,
        ..Default::default()
    });
    assert!(
        phase_line(&scx).contains("1 holder preempted, 12 slice-end extensions (3 refused) |"),
        "{}",
        phase_line(&scx)
    );
    assert!(!l.contains("slice-end"), "{l}");
    assert!(
        l.starts_with("lock-a 1234 ops/s (CPU 15.00 s, 75.0 % of the VMs), 7 contentions, 1 holder preempted | lock-b idle (CPU 5.00 s, 25.0 % of the VMs)"),
        "{l}"
    );
    assert!(l.ends_with("other load 2 %"));
}

#[test]
fn the_guest_modules_lock_lists_are_read_around_the_workload() {
    // Arrange: the guest command's output, its lock-list counters before
    // and after lockstress; and one whose module went (a counter back).
    let json = "{\"workload\":\"rename\",\"threads\":4,\"cpus\":2,\"ops\":100,\
                \"ops_per_s\":10.0,\"elapsed_s\":10.0,\"per_s\":[10],\
                \"thread_ops_min\":20,\"thread_ops_max\":30,\"failed\":false}";
    let out = format!(
        "LOCKHITS0 1\nLOCKHELD0 100 90 40 2 0 7\n{json}\nLOCKHITS1 2\nLOCKHELD1 5100 5080 840 12 1 9\n"
    );
    let back = format!("LOCKHELD0 100 90 40 2 0 7\n{json}\nLOCKHELD1 0 0 0 0 0 0\n");

    // Act
    let run = parse_run(&out).unwrap();
    let gone = parse_run(&back).unwrap();

    // Assert
    assert_eq!(
        run.held,
        Some(GuestHeld {
            takes: 5000,
            releases: 4990,
            unmatched: 800,
            user_resets: 10,
            dropped: 1,
            uncontended: 2,
        })
    );
    assert_eq!(gone.held, None);
    assert!(lockstress_cmd(10, Workload::Rename, 0).contains("held_user_resets"));
}
