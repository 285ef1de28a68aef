//! pvschedd: boosts vCPU threads while their guest says it matters.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use pvsched_host::config::{Config, EventSourceKind, DEFAULT_CONFIG_PATH};
use pvsched_host::event_loop::{block_stop_signals, Daemon};
use pvsched_host::events::{EventSource, SourceOptions};
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
    if let Some(p) = cli.state_file {
        d.state_file = p;
    }
    if let Some(p) = cli.control_socket {
        d.control_socket = p;
    }
    if let Some(m) = cli.metrics {
        d.metrics = m;
    }
    match run(resolved) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn run(resolved: pvsched_host::config::Resolved) -> Result<(), Box<dyn std::error::Error>> {
    let d = resolved.config.daemon.clone();
    // Block the stop signals before any thread exists, so that every thread
    // inherits the mask and they reach the event thread's signalfd instead of
    // killing the process with threads left boosted.
    block_stop_signals()?;
    // A predecessor that crashed may have left threads boosted.
    match statefile::recover(&d.state_file) {
        Ok(n) if n > 0 => info!(
            restored = n,
            "restored threads a previous pvschedd left changed"
        ),
        Ok(_) => {}
        Err(e) => return Err(format!("state file: {e}").into()),
    }
    let source = EventSource::open(&SourceOptions::from_config(&d))?;
    info!(source = source.name(), "event source");
    let metrics = Arc::new(Metrics::new());
    metrics::serve(&d.metrics, metrics.clone())
        .map_err(|e| format!("metrics {}: {e}", d.metrics))?;
    let daemon = Daemon::new(resolved, source, metrics)?;
    // Only the event thread runs RT: the helper threads were spawned above
    // and keep the default policy.
    // SCHED_FIFO above every boost it applies (a boosted vCPU must never
    // delay its own unboost), memory locked.
    if let Err(e) = pvsched_base::sched::make_current_thread_fifo(u32::from(d.priority), d.mlock) {
        warn!(error = %e, "event thread stays SCHED_OTHER: reactions may be late under load");
    }
    daemon.run()?;
    Ok(())
}
