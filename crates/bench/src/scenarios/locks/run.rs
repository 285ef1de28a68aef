//! The lock scenario's run: two guests booted once, then per repeat every
//! case and mode (interleaved, rotated) measured over one window, with
//! pvschedd started per session for the pvsched modes.

use std::collections::BTreeMap;
use std::time::Duration;

use super::commands::*;
use super::model::*;
use super::render::render;
use super::report::*;
use super::session::*;
use super::settings::*;
use crate::daemon::{pin_daemon, Binaries};
use crate::error::Result;
use crate::harness::axes::mode_order;
use crate::harness::journal::{first_line, Journal, Journaled};
use crate::harness::meta::Meta;
use crate::harness::plan::{announce, listed};
use crate::harness::start::{in_private_tmp, Start};
use crate::harness::vm::{boot_pair, listed_threads, Guest};
use crate::host::Machine;
use crate::plot;
use crate::progress::Progress;

/// Guests lost in a run (each booted again with its partner, the session
/// measured again) before the run is given up.
const MAX_LOST_GUESTS: usize = 3;

/// Runs the scenario; returns the report and whether every phase worked.
pub fn run(s: &LockSettings) -> Result<(LocksReport, bool)> {
    let b = &s.base;
    let start = Start::begin(b)?;
    let pvsched = s.modes.iter().any(|m| m.honor_lock_holders().is_some());
    let daemon = pvsched
        .then(|| pin_daemon(Binaries::locate(b.pvschedd.as_deref())?, &start.run_dir))
        .transpose()?;
    plot::init_font()?;
    let (phases, nominal) = plan(s);
    announce(
        &format!(
            "lock scenario: {} repeats x cases [{}] x modes [{}], {} s of `{}` each",
            b.repeat,
            listed(&s.cases),
            listed(&s.modes),
            b.duration,
            lockstress_args(b.duration, s.workload, s.threads)
        ),
        phases,
        nominal,
        nominal * 1.5 + 60.0,
        "boots and overheads",
        &start.out,
    );
    in_private_tmp(|| run_in(s, start, daemon))
}

/// The lock scenario once its folders are there: boots the guests, runs
/// every session and renders the report. `daemon`: the pinned pvschedd and
/// what the report says about it, when a mode needs it.
fn run_in(
    s: &LockSettings,
    start: Start,
    daemon: Option<(Binaries, String)>,
) -> Result<(LocksReport, bool)> {
    let (started, t0, out, run_dir, raw_dir) = start.into_parts();
    let out = out.as_path();
    let pvsched = daemon.is_some();
    let (bins, pvschedd) = daemon.unzip();
    let pvschedd = pvschedd.unwrap_or_else(|| "not used".to_string());
    let b = &s.base;
    let (phases, nominal) = plan(s);
    let machine = Machine::probe(&pvsched_vmtest::workspace_root());
    let booted = boot_guests(s, pvsched)?;
    let (accel_reason, accel) = (booted.accel_reason, booted.accel);
    let (guests, notes, kernel_counter) = (booted.guests, booted.notes, booted.kernel_counter);
    // What the report says of the guests, as first booted: a run aborted
    // after losing them still has it.
    let first = &guests[0].1;
    let (guest_cpus, guest_kernel, guest_module) = (
        first.cpus,
        first.vm.kernel_release().to_string(),
        first.module.clone(),
    );
    let vm_modules: Vec<(String, String)> = guests
        .iter()
        .map(|(n, g)| (n.to_string(), g.module.clone()))
        .collect();
    let host_cpus = machine.cpus;
    let mut bench = Bench {
        s,
        guests,
        bins,
        run_dir,
        raw_dir,
        host_cpus,
        phases: Vec::new(),
        sessions: Vec::new(),
        journal: Journal::with_notes(notes),
        progress: Progress::new(phases, nominal),
        broken: BTreeMap::new(),
    };
    let vcpus: u32 = bench.guests.iter().map(|(_, g)| g.cpus).sum();
    if vcpus as usize <= host_cpus {
        bench.note(format!(
            "the two guests have {vcpus} vCPUs on {host_cpus} host CPUs: the overcommitted \
             case is not overcommitted"
        ));
    }
    for note in overlay_notes(&b.pvschedd_overlay, &s.modes) {
        bench.note(note);
    }
    let mut lost = 0;
    'outer: for rep in 1..=b.repeat {
        for (ci, &case) in s.cases.iter().enumerate() {
            for mode in mode_order(&s.modes, rep - 1, ci) {
                loop {
                    let errors = bench.journal.errors;
                    bench.session(rep, case, mode);
                    if bench.journal.errors == errors || bench.vms_alive() {
                        break;
                    }
                    // A guest lost (under KVM in the host VM, to the emulation: a reset or
                    // a silent stop): both are booted again and the session measured
                    // again, a few times per run; its failure stays in the notes.
                    lost += 1;
                    if lost > MAX_LOST_GUESTS {
                        bench.error(format!(
                            "a guest stopped answering, the {lost}th time: run aborted"
                        ));
                        break 'outer;
                    }
                    bench.guests.clear();
                    match boot_guests(s, pvsched) {
                        Ok(again) => {
                            bench.guests = again.guests;
                            bench.journal.errors = errors;
                            // pvschedd failed on the guests that were lost, maybe
                            // for them: it gets its chance on the new ones.
                            bench.broken.clear();
                            bench.note(format!(
                                "rep{rep}-{case}-{mode}: a guest stopped answering (lost {lost} \
                                 of at most {MAX_LOST_GUESTS}); both booted again, measured again"
                            ));
                            bench.progress.add(b.duration as f64);
                        }
                        Err(e) => {
                            bench.error(format!(
                                "a guest stopped answering and booting both again failed: {e}: \
                                 run aborted"
                            ));
                            break 'outer;
                        }
                    }
                }
            }
        }
    }
    let threads = bench
        .phases
        .iter()
        .flat_map(|p| p.vms.iter())
        .find_map(|v| v.result.as_ref().map(|r| r.threads))
        .unwrap_or(s.threads);
    let meta = LocksMeta {
        base: Meta {
            guest_cpus,
            guest_kernel,
            guest_module,
            notes: bench.journal.notes.clone(),
            load_cmd: String::new(),
            static_rt_priority: 0,
            ..Meta::of_run(b, (started, t0), (accel, accel_reason), machine)
        },
        vms: vm_modules,
        workload: s.workload.name().to_string(),
        workload_describe: s.workload.describe().to_string(),
        workload_cmd: lockstress_args(b.duration, s.workload, s.threads).replacen(
            &format!("-d {}", b.duration),
            "-d {secs}",
            1,
        ),
        threads,
        pvschedd,
        kernel_counter,
        definitions: DEFINITIONS.iter().map(|d| d.to_string()).collect(),
    };
    let raw = LocksRaw {
        scenario: "locks".into(),
        meta,
        cases: s.cases.clone(),
        modes: s.modes.clone(),
        phases: bench.phases,
        sessions: bench.sessions,
    };
    let ok = bench.journal.errors == 0;
    drop(bench.guests);
    let report = render(out, &raw)?;
    Ok((report, ok))
}

/// Both guests booted and ready to measure: module loaded, the kernel's
/// contention counter set, the workload warmed up.
struct Booted {
    guests: Vec<(&'static str, Guest)>,
    accel_reason: String,
    accel: pvsched_vmtest::Accel,
    /// What the run's notes say about them.
    notes: Vec<String>,
    /// How the kernel's own contention count is read, for the report.
    kernel_counter: String,
}

fn boot_guests(s: &LockSettings, pvsched: bool) -> Result<Booted> {
    let (avm, bvm, accel_reason, accel) = boot_pair(&s.base, VM_A, VM_B)?;
    let guests = vec![
        (VM_A, Guest::new(avm, pvsched)?),
        (VM_B, Guest::new(bvm, pvsched)?),
    ];
    let mut notes = Vec::new();
    let mut kernel_counter = Vec::new();
    for (name, g) in &guests {
        let lock_wait = guest_locks(&g.vm, g.cpus).0;
        eprintln!(
            "pvsched-bench: {name} up: {} vCPUs (threads {}), QEMU pid {}, pvsched.ko {}, \
             F_LOCK_WAIT {}",
            g.cpus,
            listed_threads(&g.vcpus),
            g.vm.qemu_pid(),
            g.module,
            if lock_wait {
                "accepted"
            } else {
                "not accepted"
            }
        );
        if !lock_wait {
            notes.push(format!(
                "{name}: the guest module did not accept F_LOCK_WAIT after boot: its lock \
                 counters cannot be read"
            ));
        }
        match g.vm.exec(&trigger_cmd(), Duration::from_secs(30)) {
            Ok((0, o)) if o.contains("trigger ok") => {}
            other => {
                let why = match other {
                    Ok((rc, o)) => format!("exit {rc}: {}", first_line(o.trim())),
                    Err(e) => first_line(&e.to_string()).to_string(),
                };
                kernel_counter.push(format!("{name}: no hist trigger ({why})"));
            }
        }
    }
    let kernel_counter = if kernel_counter.is_empty() {
        format!(
            "a hist trigger (`hist:keys=flags`) on `lock:contention_begin` in each guest \
             ({TRACEPOINT}), its total read just before and just after lockstress: every \
             contention the guest kernel traced (mutex spins included), whoever held the lock"
        )
    } else {
        format!("not available: {}", kernel_counter.join("; "))
    };
    eprintln!("pvsched-bench: warm-up (2 s of the workload in both guests; not counted)");
    let warm = lockstress_cmd(2, s.workload, s.threads);
    std::thread::scope(|sc| {
        for (_, g) in &guests {
            let warm = &warm;
            sc.spawn(move || {
                let _ = g.vm.exec(warm, Duration::from_secs(90));
            });
        }
    });
    Ok(Booted {
        guests,
        accel_reason,
        accel,
        notes,
        kernel_counter,
    })
}
