//! pvsched-bench: vanilla vs static RT vs pvsched, guest and host latency
//! under load, measured side by side in one run. See README.md.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use pvsched_bench::accel::AccelChoice;
use pvsched_bench::harness;
use pvsched_bench::harness::axes::{Load, Mode};
use pvsched_bench::harness::settings::ModCostSettings;
use pvsched_bench::harness::settings::Settings;
use pvsched_bench::platform::{self, Platform};
use pvsched_bench::scenarios::locks::{self, LockSettings};
use pvsched_bench::scenarios::locks::{LockCase, LockMode, Workload};
use pvsched_bench::scenarios::msgpass::IdleCase;
use pvsched_bench::scenarios::msgpass::{self, MsgSettings};
use pvsched_bench::scenarios::rogue::Case;
use pvsched_bench::scenarios::rogue::{self, RogueSettings};
use pvsched_bench::scenarios::standard;
use pvsched_bench::scenarios::Scenario;
use pvsched_bench::{BenchError, Result};

#[derive(Parser, Debug)]
#[command(
    name = "pvsched-bench",
    version,
    about = "Guest and host latency under load for vanilla, static-rt and pvsched, in one run",
    after_help = "Writes report.md, report.json, <load>-<interval>us.json and .png, raw.json \
                  and the raw tool outputs into --out. Needs root (RT priorities, sched_setattr \
                  on QEMU's threads)."
)]
struct Cli {
    /// standard, or rogue: a rogue guest (rtspin at SCHED_FIFO on every
    /// vCPU) beside a well-behaved one; the neighbour's and the host's
    /// latency and the rogue's CPU share, with and without pvsched. The
    /// rogue scenario defaults to --loads loaded --intervals 1000.
    /// message-passing: pipe ping-pong and a producer/consumer queue across
    /// two vCPUs per guest idle mode (--cases); defaults to --duration 5
    /// (seconds per workload) --smp 2.
    /// locks: two guests running a lock-heavy workload (lockstress) at once,
    /// overcommitting the host, and one alone, per --lock-modes; defaults to
    /// --repeat 5 --duration 10 --smp 2 (--quick: --repeat 2 --duration 5).
    #[arg(long, value_enum, default_value = "standard")]
    scenario: Scenario,
    /// Message-passing scenario: the guest idle modes, interleaved: default
    /// (idle=off), haltpoll, hinted, advisor (idle=fixed with the window
    /// pvschedd advises for --budget-permille), poll-1ms (idle=fixed
    /// idle_poll_us=1000: wake-ups find their vCPU running); under KVM also
    /// kvm-poll-off (idle=off, KVM's halt_poll_ns 0: wake-ups find it
    /// halted) and kvm-poll-advisor (idle=off, KVM's halt polling capped at
    /// the advisor's window by pvschedctl idle --apply host), where root may
    /// write the kvm module's parameters.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "default,haltpoll,hinted,advisor"
    )]
    cases: Vec<IdleCase>,
    /// Message-passing scenario: CPU a vCPU may spend polling, permille of
    /// a core: the advisor's budget and the hinted target's bound.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
    budget_permille: u32,
    /// Rogue scenario: the cases, interleaved: pvsched-quiet (pvschedd, the
    /// rogue VM idle), pvsched-rogue, vanilla-rogue, vanilla-quiet.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "pvsched-quiet,pvsched-rogue,vanilla-rogue"
    )]
    rogue_cases: Vec<Case>,
    /// Lock scenario: the cases, interleaved: overcommitted (both guests run
    /// the workload), alone (the first guest runs it, the second idles).
    #[arg(long, value_delimiter = ',', default_value = "overcommitted,alone")]
    lock_cases: Vec<LockCase>,
    /// Lock scenario: the modes, interleaved: vanilla (no daemon),
    /// pvsched-nolock (pvschedd on the rt backend, honor_lock_holders =
    /// false), pvsched-lock (rt, honor_lock_holders = true); only where
    /// asked for, pvsched-scx-nolock (pvschedd on the sched_ext backend,
    /// scx_extension_us = 0, honor_lock_holders = false) and
    /// pvsched-scx-lock (sched_ext, scx_extension_us at the daemon's default
    /// or --pvschedd-config's, honor_lock_holders = true), which need a
    /// kernel with sched_ext (--platform kvm runs them in the host VM, which
    /// has it; elsewhere pvschedd does not start and they are skipped).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "vanilla,pvsched-nolock,pvsched-lock"
    )]
    lock_modes: Vec<LockMode>,
    /// Lock scenario: the guest workload: rename (a file renamed between two
    /// directories: the rename mutex and two directory rwsems), files
    /// (create + unlink in one directory: its rwsem), write (4 KiB writes
    /// into one file: its rwsem), mmap (mmap/fault/munmap: mmap_lock),
    /// rename-own (the control: renames within each thread's own directory,
    /// no lock shared between threads), web (an application: BusyBox httpd
    /// forking per connection, a client per thread asking for a 4 KiB page).
    #[arg(long, default_value = "rename")]
    lock_workload: Workload,
    /// Lock scenario: workload threads per guest [default: 2 per vCPU].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    lock_threads: Option<u32>,
    /// Rogue scenario: SCHED_FIFO priority of the rogue's rtspin in its guest.
    #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(u32).range(1..=99))]
    rogue_priority: u32,
    /// Output directory [default: bench-results/<timestamp>].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Repeats of every (load, interval, mode) cell, modes interleaved
    /// [default: 3; --quick: 2].
    #[arg(long)]
    repeat: Option<usize>,
    /// Seconds per cyclictest measurement [default: 10; --quick: 6].
    #[arg(long)]
    duration: Option<u64>,
    /// cyclictest intervals in µs [default: 500,1000; --quick: 1000].
    #[arg(long, value_delimiter = ',')]
    intervals: Option<Vec<u32>>,
    /// Host loads: idle, loaded [default: idle,loaded].
    #[arg(long, value_delimiter = ',')]
    loads: Option<Vec<Load>>,
    /// Modes: vanilla, static-rt, pvsched; pvsched-scx (pvschedd on the
    /// sched_ext backend), pvsched-scx-lock (the same with
    /// honor_lock_holders = true) and pvsched-timer (pvschedd as in pvsched but not
    /// handed the VM's doorbell: the same VM served on its recheck timer,
    /// to set pvschedd's wakeups and CPU against pvsched's; not with
    /// --no-doorbell) only where asked for.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "vanilla,static-rt,pvsched"
    )]
    modes: Vec<Mode>,
    /// auto (KVM only where a stock guest runs; the reason is printed), tcg or kvm.
    #[arg(long, default_value = "auto")]
    accel: AccelChoice,
    /// local: the guests run on this machine (--accel). kvm: KVM guests in a
    /// KVM host VM booted for the run (`crates/hostvm`; `make deps` fetches
    /// its kernel): the same scenario, every figure emulated; the standard
    /// and rogue scenarios then default to --smp 1 (the emulated SVM resets
    /// multi-vCPU guests under load, crates/hostvm/README.md). Output
    /// defaults to bench-results/<timestamp>-kvm.
    #[arg(long, value_enum, default_value = "local")]
    platform: Platform,
    /// Guest vCPUs [default: the host's CPU count].
    #[arg(long)]
    smp: Option<u32>,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 512)]
    memory_mb: u32,
    /// pvschedd binary [default: pvschedd next to this executable, i.e.
    /// target/release/].
    #[arg(long)]
    pvschedd: Option<PathBuf>,
    /// SCHED_RR priority of the vCPU threads in the static-rt mode (8: the
    /// same as the host and guest cyclictest, as published; lower it to see
    /// what a static boost band costs).
    #[arg(long, default_value_t = pvsched_bench::host::RT_PRIO, value_parser = clap::value_parser!(u32).range(1..=99))]
    static_rt_priority: u32,
    /// TOML file with `[daemon]` and `[defaults]` settings for pvschedd in
    /// the pvsched mode (to compare a tuning; the report records it)
    /// [default: pvschedd's defaults].
    #[arg(long, value_name = "TOML")]
    pvschedd_config: Option<PathBuf>,
    /// Seconds of the audio-like task per session, 0 for none [default: --duration].
    #[arg(long)]
    audio_secs: Option<u64>,
    /// Seconds of ping-pong per session, 0 for none [default: 3; --quick: 2].
    #[arg(long)]
    pingpong_secs: Option<u64>,
    /// Measure a cyclictest phase again, up to N times, when processes outside
    /// the bench took more than 10 % of the machine meanwhile (shared
    /// machines) [default: 2; --quick: 1].
    #[arg(long, value_name = "N")]
    retry_disturbed: Option<usize>,
    /// Give the guest its region as ivshmem-plain (no guest doorbell: pvschedd
    /// re-reads boosted vCPUs on its recheck timer), as runs before the
    /// doorbell did [default: ivshmem-doorbell, served by the bench].
    #[arg(long)]
    no_doorbell: bool,
    /// Guest module overhead phase (standard scenario): runs of `perf bench
    /// sched pipe` in a guest with pvsched.ko loaded and bound, and as many
    /// without, interleaved, after the sessions; 0 skips the phase.
    #[arg(long, value_name = "N", default_value_t = pvsched_bench::harness::settings::DEFAULT_REPEAT)]
    modcost_repeat: usize,
    /// Guest module overhead phase: `perf bench sched pipe -l` loops per run
    /// (about 100-130 µs of host time each under TCG).
    #[arg(long, value_name = "LOOPS", default_value_t = pvsched_bench::harness::settings::DEFAULT_LOOPS,
          value_parser = clap::value_parser!(u32).range(100..))]
    modcost_loops: u32,
    /// Guest module overhead phase: the clock of perf's µs/op. `icount`
    /// (TCG): the guest's time under `-icount shift=0,sleep=off`, 1 ns per
    /// guest instruction, one vCPU; `host`: the guest clock on host time.
    /// KVM always uses the host's.
    #[arg(long, value_enum, default_value = "icount")]
    modcost_clock: pvsched_bench::harness::settings::ModCostClock,
    /// cyclictest histogram size in µs (later samples count as overflows at the max).
    #[arg(long, default_value_t = 100_000)]
    buckets: u32,
    /// The demo preset: --repeat 2 --duration 6 --intervals 1000 --pingpong-secs 2
    /// (explicit options still win). A few minutes on 2 cores.
    #[arg(long)]
    quick: bool,
    /// Render the report again from a previous run's raw.json (no guest).
    #[arg(long, value_name = "RAW_JSON")]
    from_raw: Option<PathBuf>,
    /// Internal (`--platform kvm`): this run is repeat REP of the load at
    /// LOAD_INDEX of a larger run, numbered and rotated as in it.
    #[arg(long, value_name = "REP:LOAD_INDEX", hide = true)]
    chunk_of: Option<String>,
    /// With --platform kvm: go on with the run in --out, keeping the jobs
    /// (chunks) that finished there and running the rest.
    #[arg(long)]
    resume: bool,
}

/// Whether no value is given twice in a list option.
fn distinct<T: Ord>(values: &[T]) -> bool {
    let mut seen = std::collections::BTreeSet::new();
    values.iter().all(|v| seen.insert(v))
}

/// Why the options cannot run `pvsched-timer` as given, if they cannot:
/// only the standard scenario takes `--modes`, and the mode is pvsched
/// without the VM's doorbell, which `--no-doorbell` already takes from
/// every mode (the comparison would be pvsched against itself).
fn timer_mode_refusal(cli: &Cli) -> Option<String> {
    if !cli.modes.contains(&Mode::PvschedTimer) {
        return None;
    }
    let modes_of = match cli.scenario {
        Scenario::Standard => None,
        Scenario::Rogue => Some(
            "its --rogue-cases run vanilla and pvsched, and its pvschedd already serves both \
             VMs without doorbells, on the recheck timer",
        ),
        Scenario::MessagePassing => Some("its cases are the guest idle modes (--cases)"),
        Scenario::Locks => Some("its modes are --lock-modes"),
    };
    if let Some(why) = modes_of {
        return Some(format!(
            "--modes pvsched-timer: the {} scenario does not take --modes: {why}; \
             pvsched-timer is a mode of the standard scenario",
            cli.scenario.name()
        ));
    }
    if cli.no_doorbell {
        return Some(
            "--modes pvsched-timer with --no-doorbell: pvsched-timer is pvsched without the \
             VM's doorbell, and --no-doorbell takes the doorbell from pvsched too, so both \
             would run on the recheck timer; drop one of the two"
                .into(),
        );
    }
    None
}

/// The rogue scenario's settings: the standard ones with this scenario's
/// defaults (loaded host, 1000 µs; the demo preset as for the standard run).
fn rogue_settings(mut cli: Cli) -> Result<RogueSettings> {
    let q = cli.quick;
    if cli.out.is_none() {
        cli.out = Some(if q {
            PathBuf::from("bench-results/demo-rogue")
        } else {
            PathBuf::from(format!(
                "{}-rogue",
                harness::settings::default_out().display()
            ))
        });
    }
    cli.loads.get_or_insert_with(|| vec![Load::Loaded]);
    cli.intervals.get_or_insert_with(|| vec![1000]);
    let cases = cli.rogue_cases.clone();
    let priority = cli.rogue_priority;
    let mut base = settings(cli)?;
    base.modes = vec![Mode::Vanilla, Mode::Pvsched];
    if cases.is_empty() {
        return Err(BenchError::Usage(
            "--rogue-cases: give at least one case".into(),
        ));
    }
    if !distinct(&cases) {
        return Err(BenchError::Usage(
            "--rogue-cases: a case is given twice".into(),
        ));
    }
    // Its pvschedd is started without the doorbells: plain ivshmem keeps it
    // comparable with its earlier runs.
    let base = Settings {
        doorbell: false,
        ..base
    };
    Ok(RogueSettings {
        base,
        cases,
        priority,
    })
}

/// The message-passing scenario's settings: the standard ones with this
/// scenario's defaults (5 s per workload, 2 vCPUs).
fn msgpass_settings(mut cli: Cli) -> Result<MsgSettings> {
    if cli.out.is_none() {
        cli.out = Some(PathBuf::from(format!(
            "{}-message-passing",
            harness::settings::default_out().display()
        )));
    }
    cli.duration.get_or_insert(5);
    cli.smp.get_or_insert(2);
    let cases = cli.cases.clone();
    let budget_permille = cli.budget_permille;
    let base = settings(cli)?;
    if base.smp < 2 {
        return Err(BenchError::Usage(
            "--smp: the message-passing programs pin to vCPUs 0 and 1: 2 at least".into(),
        ));
    }
    if cases.is_empty() || !distinct(&cases) {
        return Err(BenchError::Usage(
            "--cases: give each case once, at least one".into(),
        ));
    }
    let base = Settings {
        doorbell: false,
        ..base
    };
    Ok(MsgSettings {
        base,
        cases,
        budget_permille,
    })
}

/// The lock scenario's settings: the standard ones with this scenario's
/// defaults (5 x 10 s per case and mode, 2 vCPUs per guest; --quick 2 x 5 s).
fn locks_settings(mut cli: Cli) -> Result<LockSettings> {
    let q = cli.quick;
    if cli.out.is_none() {
        cli.out = Some(if q {
            PathBuf::from("bench-results/demo-locks")
        } else {
            PathBuf::from(format!(
                "{}-locks",
                harness::settings::default_out().display()
            ))
        });
    }
    cli.repeat.get_or_insert(if q { 2 } else { 5 });
    cli.duration.get_or_insert(if q { 5 } else { 10 });
    cli.smp.get_or_insert(2);
    let cases = cli.lock_cases.clone();
    let modes = cli.lock_modes.clone();
    let workload = cli.lock_workload;
    let threads = cli.lock_threads.unwrap_or(0);
    let base = settings(cli)?;
    if cases.is_empty() || !distinct(&cases) {
        return Err(BenchError::Usage(
            "--lock-cases: give each case once, at least one".into(),
        ));
    }
    if modes.is_empty() || !distinct(&modes) {
        return Err(BenchError::Usage(
            "--lock-modes: give each mode once, at least one".into(),
        ));
    }
    Ok(LockSettings {
        base,
        cases,
        modes,
        workload,
        threads,
    })
}

fn locks_main(cli: Cli) -> ExitCode {
    scenario_main(
        cli,
        ScenarioFns {
            rerender: locks::rerender,
            settings: locks_settings,
            run: locks::run,
            out: |s| &s.base.out,
            markdown: pvsched_bench::scenarios::locks::markdown,
            plots: |r| &r.plots,
        },
    )
}

fn msgpass_main(cli: Cli) -> ExitCode {
    scenario_main(
        cli,
        ScenarioFns {
            rerender: msgpass::rerender,
            settings: msgpass_settings,
            run: msgpass::run,
            out: |s| &s.base.out,
            markdown: pvsched_bench::scenarios::msgpass::markdown,
            plots: |r| &r.plots,
        },
    )
}

fn settings(cli: Cli) -> Result<Settings> {
    let q = cli.quick;
    let chunk_of = cli.chunk_of.clone();
    let duration = cli.duration.unwrap_or(if q { 6 } else { 10 });
    let host_cpus = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let s = Settings {
        out: cli.out.unwrap_or_else(|| {
            if q {
                PathBuf::from("bench-results/demo")
            } else {
                harness::settings::default_out()
            }
        }),
        repeat: cli.repeat.unwrap_or(if q { 2 } else { 3 }),
        duration,
        intervals: cli
            .intervals
            .unwrap_or_else(|| if q { vec![1000] } else { vec![500, 1000] }),
        loads: cli.loads.unwrap_or_else(|| vec![Load::Idle, Load::Loaded]),
        modes: cli.modes,
        accel: cli.accel,
        smp: cli.smp.unwrap_or(host_cpus),
        memory_mb: cli.memory_mb,
        pvschedd: cli.pvschedd,
        static_rt_priority: cli.static_rt_priority,
        pvschedd_overlay: match &cli.pvschedd_config {
            Some(p) => pvsched_bench::daemon::read_overlay(p)?,
            None => toml::Table::new(),
        },
        buckets: cli.buckets,
        audio_secs: cli.audio_secs.unwrap_or(duration),
        pingpong_secs: cli.pingpong_secs.unwrap_or(if q { 2 } else { 3 }),
        retry_disturbed: cli.retry_disturbed.unwrap_or(if q { 1 } else { 2 }),
        doorbell: !cli.no_doorbell,
        modcost: ModCostSettings {
            repeat: cli.modcost_repeat,
            loops: cli.modcost_loops,
            clock: cli.modcost_clock,
        },
        command: std::env::args().collect::<Vec<_>>().join(" "),
        first_repeat: 1,
        load_offset: 0,
    };
    let mut s = s;
    if let Some(c) = &chunk_of {
        let parsed = c
            .split_once(':')
            .and_then(|(r, l)| Some((r.parse::<usize>().ok()?, l.parse::<usize>().ok()?)));
        match parsed {
            Some((rep, load)) if rep >= 1 => (s.first_repeat, s.load_offset) = (rep, load),
            _ => {
                return Err(BenchError::Usage(format!(
                    "--chunk-of {c}: REP:LOAD_INDEX, REP from 1"
                )))
            }
        }
    }
    let usage = |msg: &str| Err(BenchError::Usage(msg.into()));
    if s.repeat == 0 || s.duration == 0 || s.intervals.is_empty() || s.loads.is_empty() {
        return usage("--repeat, --duration, --intervals and --loads must not be empty or 0");
    }
    if s.modes.is_empty() {
        return usage("--modes: give at least one mode");
    }
    if s.intervals.iter().any(|&i| i < 50) {
        return usage("--intervals: 50 µs at least");
    }
    if !distinct(&s.modes) {
        return usage("--modes: a mode is given twice");
    }
    Ok(s)
}

fn standard_main(cli: Cli) -> ExitCode {
    scenario_main(
        cli,
        ScenarioFns {
            rerender: standard::rerender,
            settings,
            run: standard::run,
            out: |s| &s.out,
            markdown: standard::markdown,
            plots: |r| &r.plots,
        },
    )
}

fn rogue_main(cli: Cli) -> ExitCode {
    scenario_main(
        cli,
        ScenarioFns {
            rerender: rogue::rerender,
            settings: rogue_settings,
            run: rogue::run,
            out: |s| &s.base.out,
            markdown: pvsched_bench::scenarios::rogue::markdown,
            plots: |r| &r.plots,
        },
    )
}

/// What the rogue, message-passing and lock scenarios plug into [`scenario_main`].
struct ScenarioFns<S, R> {
    rerender: fn(&Path) -> Result<(R, PathBuf)>,
    settings: fn(Cli) -> Result<S>,
    run: fn(&S) -> Result<(R, bool)>,
    out: fn(&S) -> &PathBuf,
    markdown: fn(&R) -> String,
    plots: fn(&R) -> &Vec<String>,
}

/// Renders `--from-raw` again, or runs the scenario; prints the report and
/// where it went. Exit 0: done; 1: some phases failed; 2: nothing ran.
fn scenario_main<S, R>(cli: Cli, sc: ScenarioFns<S, R>) -> ExitCode {
    let end = |report: &R, dir: &Path| {
        println!("{}", (sc.markdown)(report));
        println!("Report: {}", dir.join("report.md").display());
        println!("JSON:   {}", dir.join("report.json").display());
        for p in (sc.plots)(report) {
            println!("Plot:   {}", dir.join(p).display());
        }
    };
    if let Some(raw) = &cli.from_raw {
        let rendered = (sc.rerender)(raw)
            .and_then(|(r, dir)| platform::add_platform_paragraph(&dir).map(|_| (r, dir)));
        return match rendered {
            Ok((report, dir)) => {
                end(&report, &dir);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("pvsched-bench: {e}");
                ExitCode::from(2)
            }
        };
    }
    let s = match (sc.settings)(cli) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pvsched-bench: {e}");
            return ExitCode::from(2);
        }
    };
    match (sc.run)(&s) {
        Ok((report, ok)) => {
            let out = (sc.out)(&s);
            let dir = out.canonicalize().unwrap_or(out.clone());
            end(&report, &dir);
            if ok {
                ExitCode::SUCCESS
            } else {
                eprintln!("pvsched-bench: some phases failed (see Notes in the report)");
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("pvsched-bench: {e}");
            ExitCode::from(2)
        }
    }
}

/// `--platform kvm`: the same command in a KVM host VM (see
/// `pvsched_bench::platform`); prints its report.
fn host_vm_main(cli: &Cli) -> ExitCode {
    let mut args: Vec<String> = std::env::args().collect();
    let one_vcpu = matches!(cli.scenario, Scenario::Standard | Scenario::Rogue);
    if cli.smp.is_none() && one_vcpu {
        args.extend(["--smp".into(), "1".into()]);
    }
    let out = cli.out.clone().unwrap_or_else(|| {
        let base = harness::settings::default_out();
        match cli.scenario {
            Scenario::Standard => platform::default_out(base),
            Scenario::Rogue => PathBuf::from(format!("{}-rogue-kvm", base.display())),
            Scenario::MessagePassing => {
                PathBuf::from(format!("{}-message-passing-kvm", base.display()))
            }
            Scenario::Locks => PathBuf::from(format!("{}-locks-kvm", base.display())),
        }
    });
    let modcost = cli.scenario == Scenario::Standard && cli.modcost_repeat > 0;
    // The standard scenario in chunks (one repeat of one load each), merged.
    let chunking = (cli.scenario == Scenario::Standard).then(|| platform::Chunking {
        repeat: cli.repeat.unwrap_or(if cli.quick { 2 } else { 3 }),
        loads: cli
            .loads
            .clone()
            .unwrap_or_else(|| vec![Load::Idle, Load::Loaded]),
        modcost_repeat: cli.modcost_repeat,
    });
    match platform::run_in_host_vm(&args, &out, modcost, chunking, cli.resume) {
        Ok(rc) => {
            let report = out.join("report.md");
            match std::fs::read_to_string(&report) {
                Ok(md) => println!("{md}"),
                Err(e) => eprintln!("pvsched-bench: no report in {}: {e}", out.display()),
            }
            println!("Report: {}", report.display());
            ExitCode::from(u8::try_from(rc).unwrap_or(2))
        }
        Err(e) => {
            eprintln!("pvsched-bench: {e}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    // Before anything starts (a host VM, a guest): a run's options only;
    // --from-raw renders what a run measured.
    if cli.from_raw.is_none() {
        if let Some(why) = timer_mode_refusal(&cli) {
            eprintln!("pvsched-bench: {why}");
            return ExitCode::from(2);
        }
    }
    if cli.platform == Platform::Kvm && cli.from_raw.is_none() {
        return host_vm_main(&cli);
    }
    // A raw.json says which scenario wrote it; --scenario may only agree.
    if let Some(raw) = &cli.from_raw {
        match Scenario::of_raw(raw) {
            Ok(written) if cli.scenario == Scenario::Standard || cli.scenario == written => {
                cli.scenario = written;
            }
            Ok(written) => {
                eprintln!(
                    "pvsched-bench: {} is a {} run, not {}",
                    raw.display(),
                    written.name(),
                    cli.scenario.name()
                );
                return ExitCode::from(2);
            }
            Err(e) => {
                eprintln!("pvsched-bench: {e}");
                return ExitCode::from(2);
            }
        }
    }
    match cli.scenario {
        Scenario::Standard => standard_main(cli),
        Scenario::Rogue => rogue_main(cli),
        Scenario::MessagePassing => msgpass_main(cli),
        Scenario::Locks => locks_main(cli),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("pvsched-bench").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn pvsched_timer_parses_from_modes_and_is_not_a_default() {
        assert_eq!(
            cli(&["--modes", "pvsched,pvsched-timer"]).modes,
            vec![Mode::Pvsched, Mode::PvschedTimer]
        );
        assert!(!cli(&[]).modes.contains(&Mode::PvschedTimer));
        assert_eq!(
            timer_mode_refusal(&cli(&["--modes", "pvsched-timer"])),
            None
        );
        assert_eq!(timer_mode_refusal(&cli(&["--no-doorbell"])), None);
    }

    #[test]
    fn pvsched_timer_with_no_doorbell_is_refused() {
        let why = timer_mode_refusal(&cli(&["--modes", "pvsched,pvsched-timer", "--no-doorbell"]))
            .unwrap();
        assert!(
            why.starts_with("--modes pvsched-timer with --no-doorbell:"),
            "{why}"
        );
    }

    #[test]
    fn pvsched_timer_is_refused_by_the_scenarios_without_modes() {
        for scenario in ["rogue", "message-passing", "locks"] {
            let why = timer_mode_refusal(&cli(&[
                "--scenario",
                scenario,
                "--modes",
                "vanilla,pvsched-timer",
            ]))
            .unwrap();
            assert!(
                why.contains(&format!("the {scenario} scenario does not take --modes")),
                "{why}"
            );
        }
    }

    #[test]
    fn a_list_option_with_a_value_given_twice_is_not_distinct() {
        assert!(distinct(&[Mode::Vanilla, Mode::Pvsched]));
        assert!(distinct::<Mode>(&[]));
        assert!(!distinct(&[Mode::Vanilla, Mode::Pvsched, Mode::Vanilla]));
    }
}
