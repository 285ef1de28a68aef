//! Where the guests run. `--platform local` (the default): on this machine,
//! with the accelerator `--accel` picks. `--platform kvm`: with KVM, in a
//! KVM host VM (`pvsched-hostvm`): this process builds the guest images
//! here (the host VM sees this machine's files read-only), boots the host
//! VM with the output folder shared into it, and runs the same command
//! there with `--accel kvm`, streaming its progress. A failure of the host
//! VM itself (an emulation fault) is never a result: the run starts again
//! on a fresh host VM, up to [`ATTEMPTS`] times, and the report says so.

use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pvsched_hostvm::{HostVm, HostVmConfig};
use serde::{Deserialize, Serialize};

use crate::error::{io, BenchError, Result};

/// The platforms of `--platform`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Platform {
    /// This machine, with the accelerator `--accel` picks.
    #[default]
    Local,
    /// KVM guests in a KVM host VM (a stock Debian 13 kernel under TCG):
    /// every figure emulated, comparable only within the run.
    Kvm,
}

/// Runs (host VM boots) of a `--platform kvm` bench before it gives up.
pub const ATTEMPTS: usize = 3;

/// What the host VM was, for the report (`host-vm.json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostVmFacts {
    pub kernel: String,
    pub qemu: String,
    pub cpus: u32,
    pub memory_mb: u32,
    /// From QEMU's start to the command prompt, of the run that counted.
    pub boot_s: f64,
    /// Why each earlier attempt's host VM failed (its results were dropped).
    pub failed_attempts: Vec<String>,
    /// Wall time of the whole bench, boots and failed attempts included.
    pub wall_s: f64,
}

impl HostVmFacts {
    /// The report's paragraph on the platform.
    pub fn markdown(&self) -> String {
        let mut md = format!(
            "## Platform: KVM in the host VM\n\n\
             Every guest of this run ran under KVM inside a host VM: Debian's {kernel} kernel \
             booted under TCG (`-cpu max`, SVM emulated) by QEMU {qemu}, {cpus} vCPUs, {mem} MiB, \
             this machine's userland shared read-only over virtiofs (`crates/hostvm`). The \
             host VM's boot took {boot:.1} s; the run {wall:.0} s in all. Everything in the \
             host VM is emulated, so its absolute times are slow: compare the modes within \
             this run, never its figures with the TCG run's or a real host's.\n",
            kernel = self.kernel,
            qemu = self.qemu,
            cpus = self.cpus,
            mem = self.memory_mb,
            boot = self.boot_s,
            wall = self.wall_s,
        );
        if self.failed_attempts.is_empty() {
            md.push_str("\nThe host VM did not fail: one attempt.\n");
        } else {
            md.push_str(&format!(
                "\nThe host VM itself failed {} time(s); each such run was dropped whole and \
                 started again on a fresh host VM:\n\n",
                self.failed_attempts.len()
            ));
            for (i, f) in self.failed_attempts.iter().enumerate() {
                md.push_str(&format!("- attempt {}: {}\n", i + 1, first_lines(f, 3)));
            }
        }
        md
    }
}

fn first_lines(text: &str, n: usize) -> String {
    text.lines().take(n).collect::<Vec<_>>().join(" / ")
}

/// The arguments to run again inside the host VM: ours without `--platform`
/// and `--out` (given again, absolute), with `--accel kvm`.
pub fn inner_args(args: &[String], out: &Path) -> Result<Vec<String>> {
    let mut inner = Vec::new();
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--platform" | "--out" => {
                it.next();
            }
            // The host VM sees this machine's /tmp as its own tmpfs: the
            // file travels in the output folder.
            "--pvschedd-config" => {
                let given = it.next().map(String::as_str).unwrap_or("");
                let copy = out.join("pvschedd-config.toml");
                std::fs::copy(given, &copy).map_err(io(format!(
                    "--pvschedd-config {given}: copying it for the host VM"
                )))?;
                inner.extend(["--pvschedd-config".into(), copy.display().to_string()]);
            }
            "--accel" => {
                let v = it.next().map(String::as_str).unwrap_or("");
                if v != "kvm" && v != "auto" {
                    return Err(BenchError::Usage(format!(
                        "--platform kvm runs its guests with KVM; --accel {v} contradicts it"
                    )));
                }
            }
            _ if a.starts_with("--platform=") || a.starts_with("--out=") => {}
            _ if a.starts_with("--accel=") => {
                let v = &a["--accel=".len()..];
                if v != "kvm" && v != "auto" {
                    return Err(BenchError::Usage(format!(
                        "--platform kvm runs its guests with KVM; --accel {v} contradicts it"
                    )));
                }
            }
            _ => inner.push(a.clone()),
        }
    }
    inner.extend(["--accel".into(), "kvm".into(), "--out".into()]);
    inner.push(out.display().to_string());
    Ok(inner)
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The guest images the inner run needs, built here: inside the host VM
/// this machine's files are read-only, so a cache miss there is an error.
pub fn prebuild_images(modcost: bool) -> Result<()> {
    eprintln!("pvsched-bench: building the guest images here (cached after the first run)");
    let cache = pvsched_vmtest::cache_root().with_file_name("pvsched-bench");
    crate::guest::build_image(&cache)?;
    if modcost {
        let perf = crate::modcost::find_perf()?;
        crate::modcost::build_image(&perf)?;
    }
    Ok(())
}

/// Runs the bench `args` (our own command line) in a KVM host VM, writing
/// into `out`. Returns the inner bench's exit status (0 done, 1 some phases
/// failed, 2 nothing ran).
pub fn run_in_host_vm(args: &[String], out: &Path, modcost: bool) -> Result<i32> {
    let t0 = Instant::now();
    std::fs::create_dir_all(out).map_err(io(format!("creating {}", out.display())))?;
    let out = out
        .canonicalize()
        .map_err(io(format!("resolving {}", out.display())))?;
    // A failed attempt's results are removed whole: only ours may be there.
    let taken = std::fs::read_dir(&out)
        .map_err(io(format!("reading {}", out.display())))?
        .next()
        .is_some();
    if taken {
        return Err(BenchError::Usage(format!(
            "--out {}: not empty; --platform kvm writes into a new or empty folder",
            out.display()
        )));
    }
    let inner = inner_args(args, &out)?;
    prebuild_images(modcost)?;
    let root = pvsched_vmtest::workspace_root();
    let rev = crate::host::source_revision(&root);
    let exe = std::env::current_exe().map_err(io("finding this executable"))?;
    let log = out.join("host-vm-bench.log");
    let status = out.join("host-vm-bench.status");
    let cmd = format!(
        "cd {root} && {rev_env}={rev} {exe} {args} >{log} 2>&1; echo $? >{status}",
        root = shell_quote(&root.display().to_string()),
        rev_env = crate::host::SOURCE_REV_ENV,
        rev = shell_quote(&rev),
        exe = shell_quote(&exe.display().to_string()),
        args = inner
            .iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" "),
        log = shell_quote(&log.display().to_string()),
        status = shell_quote(&status.display().to_string()),
    );
    let cfg = HostVmConfig::new("bench").exchange(&out);
    let mut failed = Vec::new();
    for attempt in 1..=ATTEMPTS {
        if attempt > 1 {
            clear_results(&out)?;
        }
        eprintln!(
            "pvsched-bench: --platform kvm: booting the host VM (attempt {attempt} of {ATTEMPTS})"
        );
        let outcome = HostVm::boot(&cfg).and_then(|vm| {
            eprintln!(
                "pvsched-bench: host VM up in {:.1} s: kernel {}, QEMU {}, {} vCPUs; running the \
                 bench in it",
                vm.boot_time().as_secs_f64(),
                vm.packages().kernel.release,
                vm.packages().qemu.version,
                vm.cpus()
            );
            let rc = follow(&vm, &cmd, &log, &status)?;
            Ok((rc, vm_facts(&vm, &cfg)))
        });
        match outcome {
            Ok((rc, mut facts)) => {
                facts.failed_attempts = failed;
                facts.wall_s = t0.elapsed().as_secs_f64();
                write_facts(&out, &facts)?;
                return Ok(rc);
            }
            Err(e) if e.is_host_vm_failure() => {
                eprintln!("pvsched-bench: attempt {attempt}: {e}");
                failed.push(e.to_string());
            }
            Err(e) => {
                return Err(BenchError::Daemon(format!(
                    "--platform kvm: the host VM harness: {e}"
                )))
            }
        }
    }
    Err(BenchError::Daemon(format!(
        "--platform kvm: the host VM failed in each of {ATTEMPTS} attempts; the last: {}",
        failed.last().map(String::as_str).unwrap_or("")
    )))
}

fn vm_facts(vm: &HostVm, cfg: &HostVmConfig) -> HostVmFacts {
    HostVmFacts {
        kernel: vm.packages().kernel.release.clone(),
        qemu: vm.packages().qemu.version.clone(),
        cpus: vm.cpus(),
        memory_mb: cfg.memory_mb,
        boot_s: vm.boot_time().as_secs_f64(),
        ..HostVmFacts::default()
    }
}

/// Removes what an earlier run or attempt left in `out` (its partial
/// results), keeping the files given to the run.
fn clear_results(out: &Path) -> Result<()> {
    let entries = std::fs::read_dir(out).map_err(io(format!("reading {}", out.display())))?;
    for e in entries.flatten() {
        let p = e.path();
        if p.file_name().is_some_and(|n| n == "pvschedd-config.toml") {
            continue;
        }
        let r = if p.is_dir() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        r.map_err(io(format!("removing {}", p.display())))?;
    }
    Ok(())
}

/// Writes `host-vm.json` and puts the platform's paragraph at the top of
/// the inner run's report.md.
fn write_facts(out: &Path, facts: &HostVmFacts) -> Result<()> {
    let json = serde_json::to_string_pretty(facts).map_err(|source| BenchError::Json {
        what: "host-vm.json".into(),
        source,
    })?;
    let path = out.join("host-vm.json");
    std::fs::write(&path, json).map_err(io(format!("writing {}", path.display())))?;
    let report = out.join("report.md");
    if let Ok(md) = std::fs::read_to_string(&report) {
        // After the title line, before the rest.
        let (title, rest) = md.split_once('\n').unwrap_or((md.as_str(), ""));
        let merged = format!("{title}\n\n{}\n{rest}", facts.markdown());
        std::fs::write(&report, merged).map_err(io(format!("writing {}", report.display())))?;
    }
    Ok(())
}

/// How often the host VM is asked whether the inner bench is done.
const POLL: Duration = Duration::from_secs(5);

/// Starts `cmd` in the host VM and follows it: copies its log to our
/// stderr as it grows, asks every [`POLL`] whether the status file is there.
/// A host VM that stops answering fails the attempt (the harness tells).
fn follow(vm: &HostVm, cmd: &str, log: &Path, status: &Path) -> pvsched_hostvm::Result<i32> {
    let _ = std::fs::remove_file(status);
    vm.spawn(cmd)?;
    let mut offset = 0u64;
    loop {
        std::thread::sleep(POLL);
        offset = copy_new_lines(log, offset);
        // An exec that gets no answer is classified by the harness (QEMU
        // gone, an emulation fault, or a hung host VM).
        vm.exec("true", Duration::from_secs(60))?;
        if let Ok(text) = std::fs::read_to_string(status) {
            copy_new_lines(log, offset);
            return text.trim().parse::<i32>().map_err(|_| {
                pvsched_hostvm::Error::Other(format!(
                    "the bench in the host VM left an unreadable status {text:?}"
                ))
            });
        }
    }
}

/// Prints the lines of `log` past `offset` to stderr; the new offset.
fn copy_new_lines(log: &Path, offset: u64) -> u64 {
    let Ok(mut f) = std::fs::File::open(log) else {
        return offset;
    };
    if f.seek(SeekFrom::Start(offset)).is_err() {
        return offset;
    }
    let mut r = BufReader::new(f);
    let mut pos = offset;
    let mut line = String::new();
    while let Ok(n) = r.read_line(&mut line) {
        if n == 0 || !line.ends_with('\n') {
            break;
        }
        pos += n as u64;
        eprint!("  | {line}");
        line.clear();
    }
    pos
}

/// The default output folder of a `--platform kvm` run.
pub fn default_out(base: PathBuf) -> PathBuf {
    PathBuf::from(format!("{}-kvm", base.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn inner_args_drop_the_platform_and_give_kvm_and_the_absolute_out() {
        // Act
        let inner = inner_args(
            &args("pvsched-bench --platform kvm --repeat 2 --out rel --smp 1"),
            Path::new("/abs/out"),
        )
        .unwrap();

        // Assert
        assert_eq!(
            inner,
            args("--repeat 2 --smp 1 --accel kvm --out /abs/out"),
            "the host VM run must neither recurse nor write elsewhere"
        );
    }

    #[test]
    fn inner_args_refuse_tcg() {
        // Act
        let r = inner_args(
            &args("pvsched-bench --platform=kvm --accel tcg"),
            Path::new("/o"),
        );

        // Assert
        assert!(matches!(r, Err(BenchError::Usage(m)) if m.contains("--accel tcg")));
    }

    #[test]
    fn the_report_names_every_failed_attempt() {
        // Arrange
        let facts = HostVmFacts {
            kernel: "7.3.4".into(),
            qemu: "10.0.2".into(),
            cpus: 2,
            memory_mb: 3072,
            boot_s: 5.2,
            failed_attempts: vec!["QEMU exited\nmore".into(), "no answer".into()],
            wall_s: 900.0,
        };

        // Act
        let md = facts.markdown();

        // Assert
        assert!(md.contains("failed 2 time(s)"), "{md}");
        assert!(md.contains("- attempt 1: QEMU exited / more"), "{md}");
        assert!(md.contains("- attempt 2: no answer"), "{md}");
        assert!(md.contains("KVM in the host VM"), "{md}");
    }
}
