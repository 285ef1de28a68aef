//! The message-passing scenario's run: its settings and plan, one guest
//! booted, then per repeat and load a block of sessions.

use super::model::*;
use super::render::*;
use super::report::*;
use super::session::*;
use super::settings::*;
use crate::daemon::{Binaries, VM_NAME};
use crate::error::{BenchError, Result};
use crate::harness::journal::{Journal, Journaled};
use crate::harness::meta::Meta;
use crate::harness::plan::{announce, listed};
use crate::harness::start::{in_private_tmp, Start};
use crate::harness::vm::listed_threads;
use crate::host::Machine;
use crate::progress::Progress;
use crate::{guest as gp, plot};

/// Runs the scenario; returns the report and whether every phase worked.
pub fn run(s: &MsgSettings) -> Result<(MsgReport, bool)> {
    let b = &s.base;
    let start = Start::begin(b)?;
    let bins = Binaries::locate(b.pvschedd.as_deref())?;
    plot::init_font()?;
    let (phases, nominal) = plan(s);
    announce(
        &format!(
            "message-passing scenario: {} repeats x loads [{}] x (warm-up + cases [{}]) x {} \
             workloads of {} s",
            b.repeat,
            listed(&b.loads),
            listed(&s.cases),
            Workload::ALL.len(),
            b.duration
        ),
        phases,
        nominal,
        // Boot and image ~60 s; per session a module reload and the settle
        // time; per block a daemon start.
        nominal * 1.2
            + 60.0
            + (b.repeat * b.loads.len()) as f64 * (10.0 + (s.cases.len() + 1) as f64 * 6.0),
        "the boot, module reloads and overheads",
        &start.out,
    );
    in_private_tmp(|| run_in(s, start, bins))
}

fn run_in(s: &MsgSettings, start: Start, bins: Binaries) -> Result<(MsgReport, bool)> {
    let (started, t0, out, run_dir, raw_dir) = start.into_parts();
    let out = out.as_path();
    let b = &s.base;
    let (phases, nominal) = plan(s);
    let machine = Machine::probe(&pvsched_vmtest::workspace_root());
    eprintln!("pvsched-bench: building the guest image (cached after the first run)");
    let cache = pvsched_vmtest::cache_root().with_file_name("pvsched-bench");
    let image = gp::build_image(&cache)?;
    eprintln!("pvsched-bench: booting the guest ({} vCPUs)", b.smp);
    let (vm, accel_reason, accel) = crate::harness::vm::boot(b, image, VM_NAME)?;
    eprintln!("pvsched-bench: accelerator: {accel_reason}");
    let guest_cpus = vm.guest_cpus().max(1);
    if guest_cpus < 2 {
        return Err(BenchError::Usage(format!(
            "the message-passing scenario needs 2 vCPUs (the programs pin to vCPUs 0 and 1); \
             the guest has {guest_cpus}"
        )));
    }
    let vcpus = crate::harness::vm::vcpu_threads(&vm)?;
    let baseline = crate::harness::vm::thread_baseline(vm.qemu_pid())?;
    let mut bench = Bench {
        s,
        vm,
        vcpus,
        baseline,
        bins,
        run_dir,
        raw_dir,
        host_cpus: machine.cpus,
        guest_cpus,
        blocks: Vec::new(),
        sessions: Vec::new(),
        journal: Journal::default(),
        progress: Progress::new(phases, nominal),
        unavailable: Default::default(),
        accel,
        kvm_poll_before: None,
    };
    let params = IdleCase::Default.insmod_params(None).unwrap_or_default();
    let idle_driver = bench.load_module(IdleCase::Default, &params)?;
    eprintln!(
        "pvsched-bench: guest up: {} vCPUs (threads {}), kernel {}, pvsched.ko {params}: {}",
        guest_cpus,
        listed_threads(&bench.vcpus),
        bench.vm.kernel_release(),
        idle_driver
    );
    if machine.cpus != guest_cpus as usize {
        bench.journal.notes.push(format!(
            "guest has {guest_cpus} vCPUs on {} host CPUs",
            machine.cpus
        ));
    }
    'outer: for rep in 1..=b.repeat {
        for (li, &load) in b.loads.iter().enumerate() {
            let errors = bench.journal.errors;
            bench.block(rep, load, li);
            if bench.journal.errors > errors && !bench.vm_alive() {
                bench.error("the guest stopped answering: run aborted".into());
                break 'outer;
            }
        }
    }
    for (case, why) in &bench.unavailable {
        bench
            .journal
            .notes
            .push(format!("{case} did not run: {why}"));
    }

    let commands = Workload::ALL
        .iter()
        .map(|w| (w.name().to_string(), w.command(b.duration)))
        .collect();
    let meta = MsgMeta {
        base: Meta {
            guest_cpus,
            guest_kernel: bench.vm.kernel_release().to_string(),
            guest_module: "loaded".into(),
            notes: bench.journal.notes.clone(),
            static_rt_priority: 0,
            ..Meta::of_run(b, (started, t0), (accel, accel_reason), machine)
        },
        budget_permille: s.budget_permille,
        idle_driver,
        commands,
        definitions: DEFINITIONS.iter().map(|d| d.to_string()).collect(),
    };
    let raw = MsgRaw {
        scenario: "message-passing".into(),
        meta,
        loads: b.loads.clone(),
        cases: s.cases.clone(),
        blocks: bench.blocks,
        sessions: bench.sessions,
    };
    let ok = bench.journal.errors == 0;
    drop(bench.vm);
    let report = render(out, &raw)?;
    Ok((report, ok))
}
