//! The rogue scenario's commands, shares, the rotation of its cases and its
//! plan.

use super::commands::*;
use super::model::*;
use super::sampling::*;
use super::settings::*;
use crate::foreign;
use crate::harness::axes::{mode_order, Load};
use crate::harness::settings::Settings;

#[test]
fn the_spin_command_starts_one_fifo_rtspin_per_vcpu_and_does_not_wait_in_the_guest() {
    // Act
    let c = spin_cmd(2, 99, 130);

    // Assert
    assert!(c.contains("rtspin -c 0 -P fifo -p 99 -t 130 -s 0"), "{c}");
    assert!(c.contains("rtspin -c 1 -P fifo -p 99 -t 130 -s 0"), "{c}");
    assert!(!c.contains("rtspin -c 2"), "{c}");
    assert!(c.contains(">/tmp/rogue-1.log 2>&1 &"), "{c}");
    // No loop the starved guest shell would have to run.
    assert!(!c.contains("while") && !c.contains("sleep"), "{c}");
    assert!(c.len() < pvsched_vmtest::MAX_COMMAND_LEN);
    assert!(!c.contains('\n'));
}

#[test]
fn ready_lines_are_counted() {
    let out = "rtspin: ready pid=70 cpu=0\nrtspin: ready pid=71 cpu=1\nrtspin: sched_setscheduler: EPERM\n";
    assert_eq!(count_ready(out), 2);
}

#[test]
fn a_share_is_ticks_over_the_window_times_the_cpus() {
    let hz = foreign::ticks_per_second();
    // One CPU busy for the whole 10 s window on 2 CPUs: half the machine.
    assert!((share_of(0, 10 * hz, 10.0, 2) - 0.5).abs() < 1e-9);
    assert_eq!(share_of(5, 3, 10.0, 2), 0.0);
    assert_eq!(share_of(0, 100, 0.0, 2), 0.0);
}

#[test]
fn cases_rotate_so_each_leads_once_per_cycle() {
    let c = Case::DEFAULT;
    let firsts: Vec<Case> = (0..3).map(|r| mode_order(&c, r, 0)[0]).collect();
    assert_eq!(firsts, c.to_vec());
}

#[test]
fn plan_counts_one_phase_per_case_interval_load_and_repeat() {
    let s = RogueSettings {
        base: Settings {
            repeat: 2,
            duration: 6,
            intervals: vec![1000],
            loads: vec![Load::Loaded],
            modes: vec![],
            audio_secs: 0,
            pingpong_secs: 0,
            retry_disturbed: 1,
            ..Settings::example()
        },
        cases: Case::DEFAULT.to_vec(),
        priority: 99,
    };
    assert_eq!(plan(&s), (6, 36.0));
}
