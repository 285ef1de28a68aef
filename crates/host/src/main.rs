//! pvschedd: boosts vCPU threads while their guest says it matters.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use pvsched_base::caps::{self, Capability};
use pvsched_host::backend;
use pvsched_host::config::{Config, DaemonConfig, EventSourceKind, DEFAULT_CONFIG_PATH};
use pvsched_host::event_loop::{block_stop_signals, Daemon, TakenOver};
use pvsched_host::events::EventSource;
use pvsched_host::metrics::{self, Metrics};
use pvsched_host::statefile;
use tracing::{error, info, warn};

#[derive(Parser, Debug)]
#[command(
    name = "pvschedd",
    version,
    about = "Cooperative guest/host vCPU scheduling daemon"
)]
struct Cli {
    /// Configuration file (TOML). Every key is optional.
    #[arg(long, default_value = DEFAULT_CONFIG_PATH)]
    config: PathBuf,
    /// Validate the configuration and exit.
    #[arg(long)]
    check_config: bool,
    /// Override daemon.event_source: auto, bpf or poll.
    #[arg(long, value_parser = ["auto", "bpf", "poll"])]
    event_source: Option<String>,
    /// Override daemon.backend: auto, sched_ext or rt.
    #[arg(long, value_parser = ["auto", "sched_ext", "rt"])]
    backend: Option<String>,
    /// Override daemon.state_file.
    #[arg(long)]
    state_file: Option<PathBuf>,
    /// Override daemon.control_socket.
    #[arg(long)]
    control_socket: Option<PathBuf>,
    /// Override daemon.metrics ("host:port", "unix:/path" or "off").
    #[arg(long)]
    metrics: Option<String>,
    /// Log filter (tracing EnvFilter syntax), e.g. "info" or "pvsched_host=debug".
    #[arg(long, default_value = "info", env = "PVSCHED_LOG")]
    log: String,
    /// NAME=FD: inherited descriptor FD is the eventfd that VM NAME's guest
    /// rings (the host vector of its ivshmem-doorbell device, from whoever
    /// serves the ivshmem protocol to its QEMU). Repeatable.
    #[arg(long = "doorbell", value_name = "NAME=FD")]
    doorbells: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log).unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // SAFETY: first thing after parsing: the descriptors named are inherited
    // and nothing in this process has opened or owns them.
    let doorbells = match unsafe { pvsched_host::doorbell::adopt(&cli.doorbells) } {
        Ok(d) => d,
        Err(e) => {
            eprintln!("pvschedd: {e}");
            return ExitCode::from(2);
        }
    };
    let must_exist = cli.config.as_os_str() != DEFAULT_CONFIG_PATH;
    let mut resolved = match Config::load(&cli.config, must_exist) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pvschedd: config error: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.check_config {
        println!(
            "{}: ok ({} VM entries, auto discovery {})",
            cli.config.display(),
            resolved.config.vms.len(),
            if resolved.config.discovery.auto {
                "on"
            } else {
                "off"
            }
        );
        return ExitCode::SUCCESS;
    }
    let d = &mut resolved.config.daemon;
    if let Some(s) = &cli.event_source {
        d.event_source = match s.as_str() {
            "bpf" => EventSourceKind::Bpf,
            "poll" => EventSourceKind::Poll,
            _ => EventSourceKind::Auto,
        };
    }
    if let Some(b) = &cli.backend {
        d.backend = match b.as_str() {
            "sched_ext" => backend::BackendChoice::SchedExt,
            "rt" => backend::BackendChoice::Rt,
            _ => backend::BackendChoice::Auto,
        };
    }
    if let Some(p) = cli.state_file {
        d.state_file = p;
    }
    if let Some(p) = cli.control_socket {
        d.control_socket = p;
    }
    if let Some(m) = cli.metrics {
        d.metrics = m;
    }
    match run(resolved, doorbells) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn run(
    resolved: pvsched_host::config::Resolved,
    given_doorbells: Vec<pvsched_host::doorbell::Doorbell>,
) -> Result<(), Box<dyn std::error::Error>> {
    let d = resolved.config.daemon.clone();
    // Block the stop signals before any thread exists, so that every thread
    // inherits the mask and they reach the event thread's signalfd instead of
    // killing the process with threads left boosted.
    block_stop_signals()?;
    // A predecessor that crashed may have left threads boosted.
    let recovered = statefile::recover(&d.state_file).map_err(|e| format!("state file: {e}"))?;
    if recovered.restored > 0 {
        info!(
            restored = recovered.restored,
            "restored threads a previous pvschedd left changed"
        );
    }
    if !recovered.left.is_empty() {
        warn!(
            left = recovered.left.len(),
            "threads a previous pvschedd left changed could not be restored; kept in the state file and tried again"
        );
    }
    let fair = !d.fair_boost_reasons.is_empty() || d.fair_boost_without_rt_work;
    if fair && !pvsched_base::sched::fair_slices_supported() {
        warn!(
            reasons = ?d.fair_boost_reasons,
            without_rt_work = d.fair_boost_without_rt_work,
            "boosts in the fair class: this kernel ignores a fair thread's slice request (Linux >= 6.12 \
             keeps it); those boosts are nice {} only",
            d.fair_boost_nice
        );
    }
    // VMs an earlier pvschedd served through the ivshmem socket, and their
    // doorbells taken back from QEMU (pidfd_getfd needs CAP_SYS_PTRACE,
    // dropped below).
    let (mut doorbells, socket_peers) = pvsched_host::ivshmem_server::recover(&resolved).split();
    doorbells.extend(given_doorbells);
    // SCHED_FIFO above every boost it applies (a boosted vCPU must never
    // delay its own unboost), memory locked; from here, before the BPF
    // programs load: on a loaded host a SCHED_OTHER start-up waited behind
    // the load for its verification (65 s in the loaded host VM, where 4 s
    // idle). Only this, the event thread, runs RT: reset on fork, the
    // helper threads spawned below start in the default policy.
    if let Err(e) = pvsched_base::sched::make_current_thread_fifo(u32::from(d.priority), d.mlock) {
        warn!(error = %e, "event thread stays SCHED_OTHER: reactions may be late under load");
    }
    let source = EventSource::open(&d.source_options())?;
    info!(source = source.name(), "event source");
    // The scheduler loads while the daemon still has CAP_BPF/CAP_SYS_ADMIN.
    let scx_options = backend::SchedExtOptions {
        daemon_tid: u32::try_from(pvsched_base::thread::gettid()).unwrap_or(0),
        ..d.sched_ext_options()
    };
    let (scx, note) =
        backend::choose(d.backend, scx_options).map_err(|e| format!("backend sched_ext: {e}"))?;
    if scx.is_some() {
        // Its own scheduler runs it ahead of every boost from here; in the
        // RT class the host's RT tasks pushed it between CPUs (an IPI each).
        // Back to SCHED_FIFO if the kernel ends the scheduler.
        if let Err(e) =
            pvsched_base::sched::set_params(0, &pvsched_base::sched::ThreadParams::other(0))
        {
            warn!(error = %e, "event thread stays SCHED_FIFO under the sched_ext scheduler");
        }
    }
    let backend = backend::BackendState::new(d.backend, scx.is_some(), note);
    // Least privilege from here on. Capabilities belong to a thread, not the
    // process: drop them before the first helper thread (metrics, discovery,
    // control) is spawned, so that every thread inherits the reduced sets.
    // What start-up still does (bind sockets, mlockall, SCHED_FIFO) works
    // with what is kept.
    drop_privileges(&d)?;
    let metrics = Arc::new(Metrics::new());
    metrics::serve(&d.metrics, metrics.clone())
        .map_err(|e| format!("metrics {}: {e}", d.metrics))?;
    let daemon = Daemon::new(
        resolved,
        source,
        metrics,
        TakenOver {
            state: recovered,
            doorbells,
            socket_peers,
        },
        scx,
        backend,
    )?;
    daemon.run()?;
    Ok(())
}

/// The capabilities the running daemon keeps, each for one thing it does
/// after start-up; everything else (CAP_BPF, CAP_SYS_ADMIN for a tracefs
/// mount, CAP_SETPCAP, ...) is only needed before.
fn running_capabilities(d: &DaemonConfig) -> Vec<Capability> {
    let mut keep = vec![
        // sched_setattr: RT policies, threads of other users, and restoring a
        // nice value lower than the present one.
        Capability::CAP_SYS_NICE,
        // Region files and QMP sockets owned by the VMM's user (0600), opened
        // read-write by a daemon that stays uid 0.
        Capability::CAP_DAC_OVERRIDE,
        // /proc/<pid>/maps of other users' processes (discovery): recent
        // kernels (tested: 6.18) accept CAP_PERFMON for read-only access to
        // another process's mm; CAP_SYS_PTRACE would also allow attaching.
        Capability::CAP_PERFMON,
    ];
    if d.mlock && memlock_limited() {
        // mlockall(MCL_FUTURE) locks every later mapping (thread stacks, heap,
        // region files): beyond a finite RLIMIT_MEMLOCK they fail without it.
        keep.push(Capability::CAP_IPC_LOCK);
    }
    keep
}

/// Whether RLIMIT_MEMLOCK is finite.
fn memlock_limited() -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit we own.
    let r = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    r != 0 || lim.rlim_cur != libc::RLIM_INFINITY
}

/// Keeps only [`running_capabilities`] (effective, permitted, bounding),
/// clears the inheritable and ambient sets and sets no-new-privs. The uid
/// stays 0 (files in /run and /dev/shm). Without privileges (a test as an
/// ordinary user) it keeps what it has: nothing to drop is not an error.
fn drop_privileges(d: &DaemonConfig) -> Result<(), Box<dyn std::error::Error>> {
    let keep = running_capabilities(d);
    let kept = caps::keep_only(&keep).map_err(|e| format!("dropping capabilities: {e}"))?;
    let names = |c: &[Capability]| {
        c.iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    info!(
        kept = %names(&kept.kept),
        bounding = kept.bounding_reduced,
        "capabilities dropped; no new privileges"
    );
    if !kept.missing.is_empty() {
        warn!(
            missing = %names(&kept.missing),
            "started without capabilities the daemon uses: boosts or discovery may fail"
        );
    }
    Ok(())
}
