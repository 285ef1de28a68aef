//! Boots a host VM and runs commands in it, printing each one's output:
//!
//! `cargo run --release -p pvsched-hostvm --example hostvm-run -- [--cpus N]
//! [--memory-mb M] [--kvm-amd PARAM]... [--exchange DIR] [--timeout SECS] 'cmd' ...`
//!
//! The command line is this example's own (no clap: it is a tool for
//! developers); a failing command ends it with that command's status.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use pvsched_hostvm::{HostVm, HostVmConfig};

fn main() -> ExitCode {
    let mut cfg = HostVmConfig::new("run");
    let mut timeout = Duration::from_secs(600);
    let mut cmds = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |what: &str| {
            args.next().unwrap_or_else(|| {
                eprintln!("hostvm-run: {a} needs {what}");
                std::process::exit(2)
            })
        };
        match a.as_str() {
            "--cpus" => cfg.cpus = value("a number").parse().unwrap_or(2),
            "--memory-mb" => cfg.memory_mb = value("a number").parse().unwrap_or(3072),
            "--kvm-amd" => cfg.kvm_amd_params.push(value("a module parameter")),
            "--exchange" => cfg.exchange = Some(PathBuf::from(value("a folder"))),
            "--timeout" => timeout = Duration::from_secs(value("seconds").parse().unwrap_or(600)),
            _ => cmds.push(a),
        }
    }
    let vm = match HostVm::boot(&cfg) {
        Ok(vm) => vm,
        Err(e) => {
            eprintln!("hostvm-run: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "hostvm-run: up in {:.1} s: kernel {}, QEMU {}, {} vCPUs",
        vm.boot_time().as_secs_f64(),
        vm.packages().kernel.release,
        vm.packages().qemu.version,
        vm.cpus()
    );
    for cmd in cmds {
        match vm.exec(&cmd, timeout) {
            Ok((rc, out)) => {
                print!("{out}");
                if rc != 0 {
                    eprintln!("hostvm-run: `{cmd}` exited {rc}");
                    return ExitCode::from(u8::try_from(rc).unwrap_or(1));
                }
            }
            Err(e) => {
                eprintln!("hostvm-run: `{cmd}`: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
