//! The standard run: build the image, boot one VM, then for every repeat,
//! load and mode (interleaved) a session; then the module overhead phase
//! and the simulation, and the report.

use std::time::Duration;

use super::modcost;
use super::model::*;
use super::plan::*;
use super::render::*;
use super::report::*;
use super::session::*;
use crate::daemon::Binaries;
use crate::error::{guest, BenchError, Result};
use crate::guest::{self};
use crate::harness::axes::{mode_order, Load, Mode};
use crate::harness::journal::{first_line, Journal, Journaled};
use crate::harness::meta::Meta;
use crate::harness::plan::{announce, listed};
use crate::harness::settings::Settings;
use crate::harness::start::{in_private_tmp, Start};
use crate::harness::vm::{boot, listed_threads, thread_baseline, vcpu_threads};
use crate::host::Machine;
use crate::plot;
use crate::progress::Progress;

/// Runs the whole bench; returns the report and whether every phase worked.
pub fn run(s: &Settings) -> Result<(Report, bool)> {
    let start = Start::begin(s)?;
    let bins = if s.modes.iter().any(|m| m.is_pvsched()) {
        Some(Binaries::locate(s.pvschedd.as_deref())?)
    } else {
        None
    };
    plot::init_font()?;
    let (phases, nominal) = plan(s);
    announce(
        &format!(
            "{} repeats x loads [{}] x intervals [{}] x modes [{}]",
            s.repeat,
            listed(&s.loads),
            listed(s.intervals.iter().map(|i| format!("{i}us"))),
            listed(&s.modes)
        ),
        phases,
        nominal,
        nominal * 1.6 + 20.0,
        "overheads",
        &start.out,
    );
    in_private_tmp(|| run_in(s, start, bins))
}

fn run_in(s: &Settings, start: Start, bins: Option<Binaries>) -> Result<(Report, bool)> {
    let (started, t0, out, run_dir, raw_dir) = start.into_parts();
    let out = out.as_path();
    let (phases, nominal) = plan(s);
    let machine = Machine::probe(&pvsched_vmtest::workspace_root());
    eprintln!("pvsched-bench: building the guest image (cached after the first run)");
    let cache = pvsched_vmtest::cache_root().with_file_name("pvsched-bench");
    let image = guest::build_image(&cache)?;
    eprintln!("pvsched-bench: booting the guest ({} vCPUs)", s.smp);
    let (vm, accel_reason, accel) = boot(s, image.clone(), "bench")?;
    eprintln!("pvsched-bench: accelerator: {accel_reason}");
    let guest_cpus = vm.guest_cpus().max(1);
    let (rc, insmod_out) = vm.insmod("").map_err(guest("insmod"))?;
    let guest_module = if rc == 0 {
        "loaded".to_string()
    } else {
        format!("NOT loaded ({})", first_line(insmod_out.trim()))
    };
    if rc != 0 && s.modes.iter().any(|m| m.is_pvsched()) {
        return Err(BenchError::GuestModule { output: insmod_out });
    }
    let vcpus = vcpu_threads(&vm)?;
    let baseline = thread_baseline(vm.qemu_pid())?;
    eprintln!(
        "pvsched-bench: guest up: {} vCPUs (threads {}), kernel {}, pvsched.ko {}",
        guest_cpus,
        listed_threads(&vcpus),
        vm.kernel_release(),
        guest_module
    );
    // Warm up: the first run after boot pays for TCG's translations.
    eprintln!("pvsched-bench: warm-up (3 s guest cyclictest, not counted)");
    let _ = vm.exec(
        &guest::cyclictest_cmd(1000, 3, guest_cpus as usize, 1000),
        Duration::from_secs(60),
    );

    let mut b = Bench {
        s,
        image,
        accel,
        guests_lost: 0,
        guest_cpus,
        host_cpus: machine.cpus,
        vm,
        vcpus,
        baseline,
        bins,
        run_dir,
        raw_dir,
        results: Results::default(),
        journal: Journal::default(),
        progress: Progress::new(phases, nominal),
        pvsched_broken: None,
    };
    if machine.cpus != guest_cpus as usize {
        b.journal.notes.push(format!(
            "guest has {guest_cpus} vCPUs on {} host CPUs",
            machine.cpus
        ));
    }
    'outer: for rep in s.first_repeat..s.first_repeat + s.repeat {
        for (li, &load) in s.loads.iter().enumerate() {
            for mode in mode_order(&s.modes, rep - 1, li + s.load_offset) {
                loop {
                    let (errors, notes, results) =
                        (b.journal.errors, b.journal.notes.len(), b.results.clone());
                    b.session(rep, load, mode);
                    if b.journal.errors == errors || b.vm_alive() {
                        break;
                    }
                    // The guest died mid-session: what it measured is dropped,
                    // and the session runs again on a new guest.
                    b.results = results;
                    b.journal.errors = errors;
                    if let Err(e) = b.guest_lost(&format!("rep{rep}-{load}-{mode}"), notes) {
                        b.error(format!("the guest stopped answering: run aborted ({e})"));
                        break 'outer;
                    }
                }
            }
        }
    }
    if b.guests_lost > 0 {
        b.note(format!(
            "{} guest(s) lost mid-session and booted again; each of those sessions was \
             measured again in full (Notes above: `guest lost`)",
            b.guests_lost
        ));
    }
    // The guest module overhead phase boots a guest of its own; this one
    // stops first, so that nothing competes with it.
    let mut modcost_raw = None;
    if s.modcost.repeat > 0 {
        if let Err(e) = b.vm.poweroff(Duration::from_secs(60)) {
            b.note(format!(
                "powering the guest off: {}",
                first_line(&e.to_string())
            ));
        }
        let m = modcost::run::run(
            s,
            accel,
            b.host_cpus,
            &b.run_dir,
            &b.raw_dir,
            &mut b.progress,
        );
        m.notes.into_iter().for_each(|n| b.note(n));
        m.errors.into_iter().for_each(|e| b.error(e));
        modcost_raw = m.raw;
    }
    let simulated = if s.loads.contains(&Load::Loaded) && s.modes.contains(&Mode::Pvsched) {
        match super::simulated::run(&s.intervals, s.doorbell) {
            Ok(x) => Some(x),
            Err(e) => {
                b.error(format!("the KVM simulation: {e}"));
                None
            }
        }
    } else {
        None
    };

    let meta = Meta {
        guest_cpus,
        guest_kernel: b.vm.kernel_release().to_string(),
        guest_module,
        notes: b.journal.notes.clone(),
        ..Meta::of_run(s, (started, t0), (accel, accel_reason), machine)
    };
    let raw = RawFile {
        meta,
        loads: s.loads.clone(),
        intervals: s.intervals.clone(),
        modes: s.modes.clone(),
        results: b.results,
        modcost: modcost_raw,
        simulated,
    };
    let ok = b.journal.errors == 0;
    drop(b.vm);
    let report = render(out, &raw)?;
    Ok((report, ok))
}
