//! The message-passing scenario's plan and its measurement command and
//! parsing.

use super::model::*;
use super::readings::*;
use super::settings::*;
use crate::harness::settings::Settings;

fn settings(cases: Vec<IdleCase>) -> MsgSettings {
    MsgSettings {
        base: Settings {
            duration: 5,
            intervals: vec![],
            modes: vec![],
            audio_secs: 0,
            pingpong_secs: 0,
            retry_disturbed: 1,
            ..Settings::example()
        },
        cases,
        budget_permille: 50,
    }
}

#[test]
fn plan_counts_a_warm_up_and_every_workload_of_every_case() {
    // 3 repeats x 2 loads = 6 blocks of (1 warm-up + 4 cases x 2 workloads).
    let (phases, secs) = plan(&settings(IdleCase::ALL[..4].to_vec()));
    assert_eq!(phases, 6 * 9);
    // 6 blocks x 5 sessions (warm-up included) x 2 workloads x 5 s.
    assert_eq!(secs, 300.0);
    assert_eq!(plan(&settings(vec![IdleCase::Default])), (18, 120.0));
}

#[test]
fn the_measurement_command_fits_the_console_and_marks_every_part() {
    for w in Workload::ALL {
        let c = measure_cmd(w, 5);
        assert!(c.len() < pvsched_vmtest::MAX_COMMAND_LEN);
        assert!(!c.chars().any(|c| c.is_control()), "{c}");
        for m in ["@@IDLE0", "@@UP0", "@@PROG", "@@UP1", "@@IDLE1", "@@RC"] {
            assert!(c.contains(m), "{m} not in {c}");
        }
    }
    assert!(measure_cmd(Workload::Pingpong, 3).contains("pingpong -d 3 -n 0 -g 0 -a 0 -b 1"));
    assert!(measure_cmd(Workload::Prodcons, 3).contains("prodcons -d 3 -q 1 -w 5000 -a 0 -b 1"));
}

#[test]
fn a_measurement_parses_from_the_guest_output() {
    // Arrange: what the guest prints with the hinted driver.
    let idle = |polls: u64, poll_ns: u64| {
        format!(
            "mode=hinted registered=1 driver=pvsched poll_max_us=200 fixed_poll_us=0\n\
             cpu0 polls={polls} poll_hits=1 poll_timeouts=0 poll_ns={poll_ns} halts=3 \
             overload_halts=0 unhinted_halts=0 limit_ns=1 wake_p50_ns=1 wake_p99_ns=1 overloaded=0\n\
             cpu1 polls=0 poll_hits=0 poll_timeouts=0 poll_ns=0 halts=3 overload_halts=0 \
             unhinted_halts=0 limit_ns=1 wake_p50_ns=1 wake_p99_ns=1 overloaded=0\n"
        )
    };
    let out = format!(
        "@@IDLE0\n{}@@UP0 100.00 150.00\n@@PROG\nprodcons: warning\n\
         {{\"messages\":5000,\"msgs_per_s\":1000.0,\"latency_p50_us\":30.00,\
         \"latency_p99_us\":90.00}}\n@@UP1 105.00 155.00\n@@IDLE1\n{}@@RC 0\n",
        idle(10, 1_000),
        idle(60, 100_001_000)
    );

    // Act
    let m = parse_measurement(Workload::Prodcons, &out, 2).unwrap();

    // Assert
    assert_eq!((m.count, m.per_s), (5000, 1000.0));
    assert_eq!((m.latency_p50_us, m.latency_p99_us), (30.0, 90.0));
    assert!((m.guest_window_s - 5.0).abs() < 1e-9);
    let c = m.idle.unwrap();
    assert_eq!((c.polls, c.poll_ns, c.halts), (50, 100_000_000, 0));
    // 0.1 s of polling over 5 s x 2 vCPUs.
    assert!((m.poll_share().unwrap() - 0.01).abs() < 1e-9);
}

#[test]
fn a_measurement_without_an_idle_driver_has_no_poll_share() {
    let out = "@@IDLE0\n@@UP0 1.00 1.00\n@@PROG\n{\"round_trips\":10,\"round_trips_per_s\":2.0,\
               \"p50_us\":1.0,\"p99_us\":2.0}\n@@UP1 6.00 2.00\n@@IDLE1\n@@RC 0\n";
    let m = parse_measurement(Workload::Pingpong, out, 2).unwrap();
    assert_eq!(m.idle, None);
    assert_eq!(m.poll_share(), None);
    assert_eq!(m.per_s, 2.0);
}

#[test]
fn a_truncated_measurement_is_an_error_that_says_what_is_missing() {
    let e = parse_measurement(Workload::Pingpong, "@@IDLE0\n@@UP0 1 1\n", 2).unwrap_err();
    assert!(e.to_string().contains("no @@PROG"), "{e}");
    let e = parse_measurement(
        Workload::Pingpong,
        "@@PROG\nSegmentation fault\n@@UP0 1\n@@UP1 2\n@@IDLE0\n@@IDLE1\n",
        2,
    )
    .unwrap_err();
    assert!(e.to_string().contains("no JSON"), "{e}");
}
