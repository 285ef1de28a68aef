//! pvschedctl: talks to pvschedd over its control socket.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use pvsched_control::{call, ApplyTarget, Request, Response};

#[derive(Parser, Debug)]
#[command(
    name = "pvschedctl",
    version,
    about = "Status, tunables, live view and traces of pvschedd"
)]
struct Cli {
    /// pvschedd's control socket.
    #[arg(
        long,
        default_value = "/run/pvsched/control.sock",
        env = "PVSCHED_SOCKET"
    )]
    socket: PathBuf,
    /// Bound of one exchange with pvschedd (connect, request, reply).
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Per VM and vCPU: thread, parameters in force, reason, counters.
    Status {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Change a run-time tunable (a [defaults] key of pvsched.toml).
    Set {
        /// Only this VM (default: the defaults and every VM).
        #[arg(long)]
        vm: Option<String>,
        key: String,
        value: String,
    },
    /// Live view, refreshed every interval (Ctrl-C to leave).
    Top {
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// Stop after this many refreshes (default: run until interrupted).
        #[arg(long)]
        iterations: Option<u64>,
    },
    /// Record host events and decisions into a Chrome trace-event file
    /// (open it in Perfetto: one track per vCPU thread).
    Record {
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        #[arg(long, default_value = "pvsched-trace.json")]
        out: PathBuf,
    },
    /// Idle transitions per vCPU (halt -> wake, wake -> running) and the
    /// halt-polling window that catches the most wakeups within a CPU budget.
    Idle {
        /// Only this VM.
        #[arg(long)]
        vm: Option<String>,
        /// CPU a vCPU may spend polling, permille of a core (50 = 5 %).
        #[arg(long, default_value_t = 50)]
        budget_permille: u32,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
        /// Act on the advice: `host` sets the kvm module's halt_poll_ns to the
        /// window advised over every vCPU's halts (pvschedd puts the old values
        /// back when it stops); `vm` a VM's own cap, where its VMM can set one;
        /// `restore` puts the kvm parameters back now.
        #[arg(long, value_enum)]
        apply: Option<Apply>,
    },
    /// Prometheus metrics text.
    Metrics,
    /// Tell pvschedd to look for VMs now (a VM manager's start/stop hook,
    /// e.g. a Proxmox hookscript), not at its next discovery round.
    Rescan {
        /// Logged by pvschedd.
        #[arg(long, default_value = "pvschedctl rescan")]
        reason: String,
    },
    /// For libvirt's hook (`/etc/libvirt/hooks/qemu.d/pvsched DOMAIN OP ...`):
    /// tells pvschedd to look for VMs now. It reads what it trusts itself.
    LibvirtHook {
        domain: String,
        operation: String,
        /// libvirt's sub-operation and extra argument (ignored).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        rest: Vec<String>,
    },
}

/// Where `idle --apply` acts.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Apply {
    Host,
    Vm,
    Restore,
}

impl Apply {
    fn target(self) -> ApplyTarget {
        match self {
            Apply::Host => ApplyTarget::Host,
            Apply::Vm => ApplyTarget::Vm,
            Apply::Restore => ApplyTarget::Restore,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pvschedctl: {e}");
            ExitCode::FAILURE
        }
    }
}

fn ask(cli: &Cli, req: &Request, timeout: Duration) -> Result<Response, String> {
    match call(&cli.socket, req, timeout).map_err(|e| e.to_string())? {
        Response::Error { message } => Err(message),
        other => Ok(other),
    }
}

fn run(cli: &Cli) -> Result<(), String> {
    let t = Duration::from_millis(cli.timeout_ms);
    match &cli.cmd {
        Cmd::Status { json } => match ask(cli, &Request::Status, t)? {
            Response::Status(s) if *json => {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&s).map_err(|e| e.to_string())?
                )
            }
            Response::Status(s) => print!("{}", pvsched_ctl::table::render(&s)),
            other => return Err(format!("unexpected reply {other:?}")),
        },
        Cmd::Idle {
            vm,
            budget_permille,
            json,
            apply,
        } => {
            let req = match apply {
                None => Request::Idle {
                    vm: vm.clone(),
                    budget_permille: *budget_permille,
                },
                Some(a) => Request::IdleApply {
                    vm: vm.clone(),
                    budget_permille: *budget_permille,
                    target: a.target(),
                },
            };
            match ask(cli, &req, t)? {
                Response::Idle(r) if *json => println!(
                    "{}",
                    serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?
                ),
                Response::Idle(r) => print!("{}", pvsched_ctl::idle::render(&r)),
                other => return Err(format!("unexpected reply {other:?}")),
            }
        }
        Cmd::Rescan { reason } => {
            let req = Request::Rescan {
                reason: reason.clone(),
            };
            if let Response::Ok { message } = ask(cli, &req, t)? {
                println!("{message}");
            }
        }
        Cmd::LibvirtHook {
            domain, operation, ..
        } => {
            let req = Request::Rescan {
                reason: format!("libvirt hook: domain {domain} {operation}"),
            };
            ask(cli, &req, t)?;
        }
        Cmd::Set { vm, key, value } => {
            let req = Request::Set {
                vm: vm.clone(),
                key: key.clone(),
                value: value.clone(),
            };
            if let Response::Ok { message } = ask(cli, &req, t)? {
                println!("{message}");
            }
        }
        Cmd::Top {
            interval_ms,
            iterations,
        } => {
            let mut n = 0u64;
            loop {
                if let Response::Status(s) = ask(cli, &Request::Status, t)? {
                    // Clear the screen and home the cursor, then redraw.
                    print!("\x1b[2J\x1b[H{}", pvsched_ctl::table::render(&s));
                }
                n += 1;
                if iterations.is_some_and(|max| n >= max) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(*interval_ms));
            }
        }
        Cmd::Record { seconds, out } => {
            if !(*seconds > 0.0 && *seconds <= 3600.0) {
                return Err(format!("--seconds must be in (0, 3600], not {seconds}"));
            }
            eprintln!("pvschedctl: recording {seconds} s ...");
            let timeout = Duration::from_secs_f64(seconds + 30.0);
            match ask(cli, &Request::Record { seconds: *seconds }, timeout)? {
                Response::Record(rec) => {
                    let trace = pvsched_ctl::trace::to_chrome_trace(&rec);
                    let text = serde_json::to_string(&trace).map_err(|e| e.to_string())?;
                    std::fs::write(out, text).map_err(|e| format!("{}: {e}", out.display()))?;
                    println!(
                        "{}: {} records, {} vCPU tracks (open in https://ui.perfetto.dev)",
                        out.display(),
                        rec.records.len(),
                        rec.tracks.len()
                    );
                }
                other => return Err(format!("unexpected reply {other:?}")),
            }
        }
        Cmd::Metrics => {
            if let Response::Metrics { text } = ask(cli, &Request::Metrics, t)? {
                print!("{text}");
            }
        }
    }
    Ok(())
}
