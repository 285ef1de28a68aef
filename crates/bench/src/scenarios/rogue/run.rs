//! The rogue scenario's run: its settings and plan, both guests booted at
//! once, then every (repeat, load, case) session, interleaved.

use std::time::Duration;

use super::model::*;
use super::render::*;
use super::report::*;
use super::session::*;
use super::settings::*;
use crate::daemon::{pin_daemon, Binaries};
use crate::error::Result;
use crate::harness::axes::{mode_order, Mode};
use crate::harness::journal::{first_line, Journal, Journaled};
use crate::harness::meta::Meta;
use crate::harness::plan::{announce, listed};
use crate::harness::start::{in_private_tmp, Start};
use crate::harness::vm::{boot_pair, listed_threads, Guest};
use crate::host::Machine;
use crate::progress::Progress;
use crate::{guest as gp, plot};

/// Guests lost mid-session a run survives (each time both are booted again).
const MAX_GUESTS_LOST: usize = 6;

/// Runs the scenario; returns the report and whether every phase worked.
pub fn run(s: &RogueSettings) -> Result<(RogueReport, bool)> {
    let b = &s.base;
    let start = Start::begin(b)?;
    let pvsched = s.cases.iter().any(|c| c.mode() == Mode::Pvsched);
    let daemon = pvsched
        .then(|| pin_daemon(Binaries::locate(b.pvschedd.as_deref())?, &start.run_dir))
        .transpose()?;
    plot::init_font()?;
    let (phases, nominal) = plan(s);
    announce(
        &format!(
            "rogue scenario: {} repeats x loads [{}] x intervals [{}] x cases [{}]",
            b.repeat,
            listed(&b.loads),
            listed(b.intervals.iter().map(|i| format!("{i}us"))),
            listed(&s.cases)
        ),
        phases,
        nominal,
        nominal * 2.5 + 90.0,
        "boots and overheads",
        &start.out,
    );
    in_private_tmp(|| run_in(s, start, daemon))
}

/// A short run of each guest's workload before anything is measured.
fn warm_up(neighbour: &Guest, rogue: &Guest, priority: u32) {
    eprintln!("pvsched-bench: warm-up (3 s neighbour cyclictest, 1 s rogue spin; not counted)");
    let _ = neighbour.vm.exec(
        &gp::cyclictest_cmd(1000, 3, neighbour.cpus as usize, 1000),
        Duration::from_secs(60),
    );
    let _ = rogue.vm.exec(
        &format!("rtspin -c 0 -P fifo -p {priority} -t 1 -s 0"),
        Duration::from_secs(60),
    );
}

/// The rogue scenario once its folders are there: boots the guests, runs
/// every session and renders the report. `daemon`: the pinned pvschedd and
/// what the report says about it, when a case needs it.
fn run_in(
    s: &RogueSettings,
    start: Start,
    daemon: Option<(Binaries, String)>,
) -> Result<(RogueReport, bool)> {
    let (started, t0, out, run_dir, raw_dir) = start.into_parts();
    let out = out.as_path();
    let pvsched = daemon.is_some();
    let (bins, pvschedd) = daemon.unzip();
    let pvschedd = pvschedd.unwrap_or_else(|| "not used".to_string());
    let b = &s.base;
    let (phases, nominal) = plan(s);
    let machine = Machine::probe(&pvsched_vmtest::workspace_root());
    let (nvm, rvm, accel_reason, accel) = boot_pair(b, NEIGHBOUR, ROGUE)?;
    let neighbour = Guest::new(nvm, pvsched)?;
    let rogue = Guest::new(rvm, pvsched)?;
    let rt_throttle = rogue
        .vm
        .exec_ok(
            "echo $(cat /proc/sys/kernel/sched_rt_runtime_us) us of every \
             $(cat /proc/sys/kernel/sched_rt_period_us) us",
            Duration::from_secs(30),
        )
        .map(|o| o.trim().to_string())
        .unwrap_or_else(|e| format!("unknown ({})", first_line(&e.to_string())));
    for (name, g) in [(NEIGHBOUR, &neighbour), (ROGUE, &rogue)] {
        eprintln!(
            "pvsched-bench: {name} up: {} vCPUs (threads {}), QEMU pid {}, pvsched.ko {}",
            g.cpus,
            listed_threads(&g.vcpus),
            g.vm.qemu_pid(),
            g.module
        );
    }
    warm_up(&neighbour, &rogue, s.priority);

    let mut bench = Bench {
        s,
        host_cpus: machine.cpus,
        neighbour,
        rogue,
        bins,
        run_dir,
        raw_dir,
        phases: Vec::new(),
        sessions: Vec::new(),
        journal: Journal::default(),
        progress: Progress::new(phases, nominal),
        pvsched_broken: None,
    };
    if machine.cpus != bench.neighbour.cpus as usize {
        bench.journal.notes.push(format!(
            "each guest has {} vCPUs on {} host CPUs",
            bench.neighbour.cpus, machine.cpus
        ));
    }
    let mut guests_lost = 0;
    'outer: for rep in 1..=b.repeat {
        for (li, &load) in b.loads.iter().enumerate() {
            for case in mode_order(&s.cases, rep - 1, li) {
                loop {
                    let (errors, notes) = (bench.journal.errors, bench.journal.notes.len());
                    let (phases, sessions) = (bench.phases.len(), bench.sessions.len());
                    bench.session(rep, load, case);
                    if bench.journal.errors == errors || bench.vms_alive() {
                        break;
                    }
                    // A guest died mid-session (the emulation loses guests now
                    // and then under KVM in the host VM): what the session
                    // measured is dropped, and it runs again on two new guests.
                    bench.phases.truncate(phases);
                    bench.sessions.truncate(sessions);
                    bench.journal.errors = errors;
                    guests_lost += 1;
                    bench.journal.guest_lost(
                        notes,
                        &format!("rep{rep}-{load}-{case}"),
                        "new guests",
                    );
                    if guests_lost > MAX_GUESTS_LOST {
                        bench.error(format!(
                            "a guest stopped answering {guests_lost} times: run aborted"
                        ));
                        break 'outer;
                    }
                    if let Err(e) = bench.boot_again(b, pvsched) {
                        bench.error(format!("booting the guests again: {e}: run aborted"));
                        break 'outer;
                    }
                    warm_up(&bench.neighbour, &bench.rogue, s.priority);
                }
            }
        }
    }
    if guests_lost > 0 {
        bench.note(format!(
            "{guests_lost} time(s) a guest was lost mid-session; both guests were booted again \
             and that session measured again in full (Notes above: `guest lost`)"
        ));
    }
    loops_notes(&mut bench);

    let meta = RogueMeta {
        base: Meta {
            guest_cpus: bench.neighbour.cpus,
            guest_kernel: bench.neighbour.vm.kernel_release().to_string(),
            guest_module: bench.neighbour.module.clone(),
            notes: bench.journal.notes.clone(),
            ..Meta::of_run(b, (started, t0), (accel, accel_reason), machine)
        },
        rogue_vcpus: bench.rogue.cpus,
        rogue_module: bench.rogue.module.clone(),
        rogue_cmd: format!("rtspin -c {{cpu}} -P fifo -p {} -s 0", s.priority),
        rogue_rt_throttle: rt_throttle,
        pvschedd,
        share_definition: SHARE_DEFINITION.into(),
    };
    let raw = RogueRaw {
        scenario: "rogue".into(),
        meta,
        loads: b.loads.clone(),
        intervals: b.intervals.clone(),
        cases: s.cases.clone(),
        phases: bench.phases,
        sessions: bench.sessions,
    };
    let ok = bench.journal.errors == 0;
    drop(bench.neighbour);
    drop(bench.rogue);
    let report = render(out, &raw)?;
    Ok((report, ok))
}

/// Notes the cells where the neighbour's cyclictest lost many of its
/// periods (a starved guest skips them, which p99 alone understates).
fn loops_notes(bench: &mut Bench<'_>) {
    let mut low = Vec::new();
    for p in &bench.phases {
        if p.guest_expected > 0 {
            let r = p.guest.samples as f64 / p.guest_expected as f64;
            if r < 0.9 {
                low.push(format!(
                    "rep{}-{}-{}us-{}: the neighbour's cyclictest ran {:.0} % of its loops",
                    p.rep,
                    p.load,
                    p.interval_us,
                    p.case,
                    r * 100.0
                ));
            }
        }
    }
    for n in low {
        bench.note(n);
    }
}
