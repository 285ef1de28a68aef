//! Host side of a measurement: cyclictest, the stress-ng load, machine facts.
//! Every child is started with `spawn_tied` (it dies with the bench) and
//! stopped by its own PID.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{io, BenchError, Result};
use crate::stats::Histogram;

/// Priority and policy of every cyclictest (guest and host), as published.
pub const RT_PRIO: u32 = 8;

/// `cyclictest` arguments shared by guest and host.
pub fn cyclictest_args(interval_us: u32, secs: u64, threads: usize, buckets: u32) -> Vec<String> {
    vec![
        "-m".into(),
        "-q".into(),
        "-p".into(),
        RT_PRIO.to_string(),
        "--policy=rr".into(),
        "-i".into(),
        interval_us.to_string(),
        "-D".into(),
        secs.to_string(),
        "-t".into(),
        threads.to_string(),
        "-a".into(),
        "-h".into(),
        buckets.to_string(),
    ]
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) of our own child, not yet reaped: its PID is still ours.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// Waits for `child` up to `timeout`, then SIGKILLs it (by its PID).
fn wait_or_kill(child: &mut Child, timeout: Duration) -> Result<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Ok(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                signal(child, libc::SIGKILL);
                let _ = child.wait();
                return Err(BenchError::Tool {
                    what: format!("pid {}", child.id()),
                    detail: format!("still running after {timeout:?}: killed"),
                });
            }
            Err(e) => return Err(io(format!("waiting for pid {}", child.id()))(e)),
        }
    }
}

fn spawn(mut cmd: Command, log: &Path) -> Result<Child> {
    let err = File::create(log).map_err(io(format!("creating {}", log.display())))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(err));
    let shown = format!("{cmd:?}");
    pvsched_vmtest::spawn_tied(cmd).map_err(io(format!("starting {shown}")))
}

/// cyclictest on the host, running while the guest's runs.
pub struct HostCyclictest {
    child: Child,
    json: PathBuf,
    log: PathBuf,
    secs: u64,
}

impl HostCyclictest {
    pub fn start(
        interval_us: u32,
        secs: u64,
        threads: usize,
        buckets: u32,
        json: &Path,
        log: &Path,
    ) -> Result<Self> {
        let mut cmd = Command::new("cyclictest");
        cmd.args(cyclictest_args(interval_us, secs, threads, buckets))
            .arg(format!("--json={}", json.display()));
        let child = spawn(cmd, log)?;
        Ok(Self {
            child,
            json: json.to_path_buf(),
            log: log.to_path_buf(),
            secs,
        })
    }

    /// Waits for the run to end and parses its histogram.
    pub fn finish(mut self) -> Result<Histogram> {
        let status = wait_or_kill(&mut self.child, Duration::from_secs(self.secs + 30))?;
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        if !status.success() {
            return Err(BenchError::Tool {
                what: "host cyclictest".into(),
                detail: format!("failed ({status}): {}", log.trim()),
            });
        }
        let text = std::fs::read_to_string(&self.json)
            .map_err(io(format!("reading {}", self.json.display())))?;
        Histogram::from_cyclictest_json(&text).map_err(|source| BenchError::Histogram {
            what: "host cyclictest".into(),
            source,
        })
    }
}

impl Drop for HostCyclictest {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            signal(&self.child, libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// The source revision to report, when set (see `Machine::probe`).
pub const SOURCE_REV_ENV: &str = "PVSCHED_SOURCE_REV";

/// The host load of the published setup, scaled to `cpus` cores.
///
/// `--iomix-bytes 64M` bounds the file iomix rewrites (default 1 GiB): with
/// the default, stopping stress-ng takes ~11 s of fsync after a 30 s run
/// here, which would leak into the next measurement.
pub fn load_args(cpus: usize) -> Vec<String> {
    [
        "--cpu",
        &cpus.to_string(),
        "--iomix",
        "1",
        "--iomix-bytes",
        "64M",
        "--vm",
        "1",
        "--vm-bytes",
        "128M",
        "--fork",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// One stressor's throughput over a session.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StressorRate {
    pub stressor: String,
    pub bogo_ops: u64,
    pub wall_s: f64,
    /// bogo ops per second of wall-clock time.
    pub ops_per_s: f64,
}

/// Parses the `metrics:` list of `stress-ng --yaml FILE`.
pub fn parse_stress_yaml(text: &str) -> Vec<StressorRate> {
    let mut out: Vec<StressorRate> = Vec::new();
    let mut in_metrics = false;
    for line in text.lines() {
        let t = line.trim();
        if !line.starts_with(' ') && !t.is_empty() {
            in_metrics = t == "metrics:";
            continue;
        }
        if !in_metrics {
            continue;
        }
        let t = t.trim_start_matches("- ");
        let Some((k, v)) = t.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k.trim() {
            "stressor" => out.push(StressorRate {
                stressor: v.to_string(),
                ..Default::default()
            }),
            "bogo-ops" => {
                if let Some(s) = out.last_mut() {
                    s.bogo_ops = v.parse::<f64>().unwrap_or(0.0) as u64;
                }
            }
            "bogo-ops-per-second-real-time" => {
                if let Some(s) = out.last_mut() {
                    s.ops_per_s = v.parse().unwrap_or(0.0);
                }
            }
            "wall-clock-time" => {
                if let Some(s) = out.last_mut() {
                    s.wall_s = v.parse().unwrap_or(0.0);
                }
            }
            _ => {}
        }
    }
    out
}

/// stress-ng running as the host load.
pub struct Load {
    child: Child,
    yaml: PathBuf,
    log: PathBuf,
}

impl Load {
    /// The host load of session `tag` (`--timeout` `bound_s` seconds, in
    /// case the bench dies without stopping it): its temporary files in
    /// `run_dir`, its YAML and log in `raw_dir`.
    pub fn start_session(
        host_cpus: usize,
        bound_s: u64,
        run_dir: &Path,
        raw_dir: &Path,
        tag: &str,
    ) -> Result<Self> {
        let mut args = load_args(host_cpus);
        args.push("--timeout".into());
        args.push(format!("{bound_s}s"));
        Load::start(
            &args,
            &run_dir.join("stress"),
            &raw_dir.join(format!("{tag}-stress.yaml")),
            &raw_dir.join(format!("{tag}-stress.log")),
        )
    }

    /// Starts `stress-ng ARGS --metrics-brief --yaml FILE` with its
    /// temporary files under `tmp`.
    pub fn start(args: &[String], tmp: &Path, yaml: &Path, log: &Path) -> Result<Self> {
        std::fs::create_dir_all(tmp).map_err(io(format!("creating {}", tmp.display())))?;
        let _ = std::fs::remove_file(yaml);
        let mut cmd = Command::new("stress-ng");
        cmd.args(args)
            .arg("--metrics-brief")
            .arg("--yaml")
            .arg(yaml)
            .arg("--temp-path")
            .arg(tmp)
            .current_dir(tmp);
        let mut child = spawn(cmd, log)?;
        std::thread::sleep(Duration::from_millis(200));
        if let Ok(Some(s)) = child.try_wait() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            return Err(BenchError::Tool {
                what: "stress-ng".into(),
                detail: format!("exited at once ({s}): {}", text.trim()),
            });
        }
        Ok(Self {
            child,
            yaml: yaml.to_path_buf(),
            log: log.to_path_buf(),
        })
    }

    /// stress-ng's pid (the root of the load's process tree).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM (stress-ng then writes its metrics), wait, parse.
    pub fn stop(mut self) -> Result<Vec<StressorRate>> {
        signal(&self.child, libc::SIGTERM);
        let status = wait_or_kill(&mut self.child, Duration::from_secs(60))?;
        let text = std::fs::read_to_string(&self.yaml).map_err(|e| {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            io(format!(
                "stress-ng ({status}) wrote no {} (its log: {})",
                self.yaml.display(),
                log.trim()
            ))(e)
        })?;
        let rates = parse_stress_yaml(&text);
        if rates.is_empty() {
            return Err(BenchError::Parse {
                what: self.yaml.display().to_string(),
                msg: "no stress-ng metrics".into(),
            });
        }
        Ok(rates)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // Not stopped by `stop` (an error path): stress-ng passes SIGTERM
            // on to its stressors.
            signal(&self.child, libc::SIGTERM);
            let _ = wait_or_kill(&mut self.child, Duration::from_secs(30));
        }
    }
}

fn first_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.push_str(&String::from_utf8_lossy(&o.stderr));
            s.lines().next().unwrap_or("").trim().to_string()
        })
        .unwrap_or_else(|| format!("{cmd}: not found"))
}

/// What the run ran on, for the report.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Machine {
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub os: String,
    pub qemu: String,
    pub cyclictest: String,
    pub stress_ng: String,
    pub git: String,
}

impl Machine {
    pub fn probe(root: &Path) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: f64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let os = std::fs::read_to_string("/etc/os-release")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .unwrap_or("")
            .trim_matches('"')
            .to_string();
        let git = source_revision(root);
        Machine {
            cpu_model,
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            memory_gib: (mem_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            kernel: first_line("uname", &["-r"]),
            os,
            qemu: first_line("qemu-system-x86_64", &["--version"]),
            cyclictest: first_line("dpkg-query", &["-W", "-f=rt-tests ${Version}", "rt-tests"]),
            stress_ng: first_line("stress-ng", &["--version"]),
            git,
        }
    }
}

/// The checkout's revision for reports: `$PVSCHED_SOURCE_REV` when set (by
/// whoever runs the bench where the checkout cannot be asked cheaply: the KVM
/// host VM sees it read-only over virtiofs, where `git status` hashes every
/// file again), else `git rev-parse --short HEAD`, marked when the tree has
/// uncommitted changes.
pub fn source_revision(root: &Path) -> String {
    if let Ok(rev) = std::env::var(SOURCE_REV_ENV) {
        return rev;
    }
    let root = root.display().to_string();
    let rev = first_line("git", &["-C", &root, "rev-parse", "--short", "HEAD"]);
    let dirty = Command::new("git")
        .args(["-C", &root, "status", "--porcelain"])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    if dirty {
        format!("{rev} (with uncommitted changes)")
    } else {
        rev
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = "---\nsystem-info:\n      cpus: 2\n\nmetrics:\n    - stressor: cpu\n      bogo-ops: 448276\n      bogo-ops-per-second-usr-sys-time: 1855.914040\n      bogo-ops-per-second-real-time: 744.933265\n      wall-clock-time: 601.766657\n\n    - stressor: fork\n      bogo-ops: 213952\n      bogo-ops-per-second-real-time: 355.540955\n      wall-clock-time: 601.764711\n\n...\n";

    #[test]
    fn stress_yaml_gives_one_rate_per_stressor() {
        // Act
        let r = parse_stress_yaml(YAML);

        // Assert
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].stressor, "cpu");
        assert_eq!(r[0].bogo_ops, 448276);
        assert!((r[0].ops_per_s - 744.933265).abs() < 1e-9);
        assert!((r[1].wall_s - 601.764711).abs() < 1e-9);
    }

    #[test]
    fn stress_yaml_without_metrics_is_empty() {
        assert!(parse_stress_yaml("---\nsystem-info:\n      cpus: 2\n").is_empty());
    }

    #[test]
    fn load_is_scaled_to_the_cores() {
        let a = load_args(4);
        assert_eq!(&a[..2], &["--cpu".to_string(), "4".to_string()]);
        assert!(a.windows(2).any(|w| w[0] == "--vm-bytes" && w[1] == "128M"));
    }
}
