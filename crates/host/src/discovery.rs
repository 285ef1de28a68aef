//! VM discovery: which VMs exist now and their vCPU threads, found on a
//! thread of its own every `discovery_interval_ms` and sent to the event
//! loop as a snapshot. Thread ids come only from the VMM (QMP
//! `query-cpus-fast`) or from the host's /proc: never from the shared region.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::eventfd::EventFd;
use pvsched_base::qmp::{Qmp, QmpError};
use pvsched_base::thread::tgid_of;
use pvsched_base::vcpu_names::vcpu_threads_by_name;
pub use pvsched_base::vcpu_names::Accel;
use tracing::{debug, info};

use crate::config::Resolved;

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("{path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    #[error("no process has {0} in its command line")]
    NoProcess(PathBuf),
    #[error("process {0} has no vCPU threads by any known naming")]
    NoVcpuThreads(i32),
    #[error(transparent)]
    Qmp(#[from] QmpError),
}

/// A running VM as the host sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmThreads {
    /// The VMM process.
    pub tgid: i32,
    /// (vCPU index, thread id), sorted by index, indices 0..n without gaps.
    pub vcpus: Vec<(u32, i32)>,
    /// Other VMM threads on the guest's latency path (under TCG, QEMU's main
    /// loop delivers guest timers).
    pub latency_path: Vec<i32>,
    pub accel: Accel,
}

/// vCPU threads of process `tgid` by thread name.
pub fn threads_by_name(tgid: i32) -> Result<VmThreads, DiscoveryError> {
    let (vcpus, accel) = vcpu_threads_by_name(tgid).map_err(|e| DiscoveryError::Io {
        path: PathBuf::from(format!("/proc/{tgid}/task")),
        op: "read_dir",
        source: e,
    })?;
    finish(tgid, vcpus, accel)
}

/// vCPU threads from the VMM's own account (`query-cpus-fast`, and
/// `query-kvm` for the accelerator).
pub fn threads_by_qmp(qmp: &mut Qmp) -> Result<VmThreads, DiscoveryError> {
    let vcpus = qmp.vcpu_thread_ids()?;
    let accel = match qmp.kvm_enabled() {
        Some(true) => Accel::Kvm,
        Some(false) => Accel::Tcg,
        None => Accel::Unknown,
    };
    let first = vcpus.first().map(|v| v.1).unwrap_or(0);
    let tgid = tgid_of(first).map_err(|e| DiscoveryError::Io {
        path: PathBuf::from(format!("/proc/{first}/status")),
        op: "read Tgid",
        source: e,
    })?;
    finish(tgid, vcpus, accel)
}

fn finish(
    tgid: i32,
    mut vcpus: Vec<(u32, i32)>,
    accel: Accel,
) -> Result<VmThreads, DiscoveryError> {
    vcpus.sort_unstable();
    vcpus.dedup_by_key(|v| v.0);
    if vcpus.is_empty() || vcpus.iter().enumerate().any(|(i, v)| v.0 as usize != i) {
        return Err(DiscoveryError::NoVcpuThreads(tgid));
    }
    let latency_path = if accel == Accel::Tcg {
        vec![tgid]
    } else {
        Vec::new()
    };
    Ok(VmThreads {
        tgid,
        vcpus,
        latency_path,
        accel,
    })
}

/// Finds the process whose command line mentions `needle` (the region path
/// in `mem-path=`), skipping ourselves.
pub fn process_with_arg(needle: &Path) -> Result<i32, DiscoveryError> {
    let needle = needle.to_string_lossy();
    let me = std::process::id() as i32;
    let proc_dir = fs::read_dir("/proc").map_err(|e| DiscoveryError::Io {
        path: "/proc".into(),
        op: "read_dir",
        source: e,
    })?;
    let mut found: Vec<i32> = proc_dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    c.split(|b| *b == 0).any(|arg| {
                        String::from_utf8_lossy(arg)
                            .split(',')
                            .any(|kv| kv == format!("mem-path={needle}"))
                    })
                })
                .unwrap_or(false)
        })
        .collect();
    found.sort_unstable();
    found
        .first()
        .copied()
        .ok_or_else(|| DiscoveryError::NoProcess(needle.as_ref().into()))
}

/// A VM found by the discovery thread.
#[derive(Clone, Debug)]
pub struct Found {
    pub name: String,
    /// Index of its `[[vm]]` entry; `None` for an auto-discovered VM.
    pub cfg_index: Option<usize>,
    pub region: PathBuf,
    pub region_mode: u32,
    pub threads: VmThreads,
}

/// What the discovery thread sends the event loop.
pub struct Snapshot {
    /// Every VM that exists now.
    pub found: Vec<Found>,
    /// CPU pressure says the host is overloaded.
    pub overloaded: bool,
}

/// Starts the discovery thread: every interval, the VMs that exist now
/// (configured ones and, with auto discovery, any VMM mapping a region
/// file) and whether the host is overloaded, sent on `tx`, then `wake`
/// is signalled.
pub fn spawn(
    cfg: Resolved,
    tx: Sender<Snapshot>,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    let interval = Duration::from_millis(cfg.config.daemon.discovery_interval_ms);
    std::thread::Builder::new()
        .name("pvsched-discovery".into())
        .spawn(move || {
            let mut logged: BTreeMap<String, String> = BTreeMap::new();
            while !stop.load(Ordering::Relaxed) {
                let found = discover_once(&cfg, &mut logged);
                let overloaded = cpu_pressure_some_avg10().is_some_and(|p| p > 10.0);
                if tx.send(Snapshot { found, overloaded }).is_err() {
                    break;
                }
                let _ = wake.write(1);
                std::thread::sleep(interval);
            }
        })?;
    Ok(())
}

fn discover_once(cfg: &Resolved, logged: &mut BTreeMap<String, String>) -> Vec<Found> {
    let c = &cfg.config;
    let mut found = Vec::new();
    // Each new reason once per VM: at info for a configured VM (the admin
    // expects it to be served), at debug for a stale auto-discovery file.
    let mut note = |name: &str, msg: String, configured: bool| {
        if logged.get(name) != Some(&msg) {
            if configured {
                info!(vm = name, "{msg}");
            } else {
                debug!(vm = name, "{msg}");
            }
            logged.insert(name.to_string(), msg);
        }
    };
    for (i, vm) in c.vms.iter().enumerate() {
        let region = vm.region_path(&c.discovery);
        let threads = if let Some(qmp) = &vm.qmp {
            Qmp::connect(qmp, Duration::from_millis(500))
                .map_err(DiscoveryError::from)
                .and_then(|mut q| threads_by_qmp(&mut q))
        } else if let Some(pid) = vm.pid {
            threads_by_name(pid)
        } else {
            process_with_arg(&region).and_then(threads_by_name)
        };
        match threads {
            Ok(threads) => found.push(Found {
                name: vm.name.clone(),
                cfg_index: Some(i),
                region,
                region_mode: vm.region_mode,
                threads,
            }),
            Err(e) => note(&vm.name, format!("not served yet: {e}"), true),
        }
    }
    if c.discovery.auto {
        let Ok(dir) = fs::read_dir(&c.discovery.region_dir) else {
            return found;
        };
        for entry in dir.flatten() {
            let file_name = entry.file_name().to_string_lossy().into_owned();
            let Some(name) = file_name.strip_prefix(&c.discovery.region_prefix) else {
                continue;
            };
            if name.is_empty()
                || found.iter().any(|f| f.name == name)
                || c.vms.iter().any(|v| v.name == name)
            {
                continue;
            }
            let region = entry.path();
            match process_with_arg(&region).and_then(threads_by_name) {
                Ok(threads) => found.push(Found {
                    name: name.to_string(),
                    cfg_index: None,
                    region,
                    region_mode: 0o600,
                    threads,
                }),
                Err(e) => note(name, format!("not running: {e}"), false),
            }
        }
    }
    found
}

/// `some avg10` of /proc/pressure/cpu: % of the last 10 s in which some
/// runnable task waited for a CPU.
fn cpu_pressure_some_avg10() -> Option<f64> {
    let text = fs::read_to_string("/proc/pressure/cpu").ok()?;
    let line = text.lines().find(|l| l.starts_with("some"))?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix("avg10="))
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vcpu_lists_with_gaps_are_refused() {
        assert!(finish(1, vec![(0, 10), (2, 12)], Accel::Kvm).is_err());
        assert!(finish(1, vec![], Accel::Kvm).is_err());
    }

    #[test]
    fn tcg_puts_the_main_loop_on_the_latency_path() {
        let t = finish(100, vec![(1, 11), (0, 10)], Accel::Tcg).unwrap();

        assert_eq!(t.vcpus, vec![(0, 10), (1, 11)]);
        assert_eq!(t.latency_path, vec![100]);
    }
}
