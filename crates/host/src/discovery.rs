//! Finding a VM's vCPU threads. Thread ids come only from the VMM (QMP
//! `query-cpus-fast`) or from the host's /proc: never from the shared region.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

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
    #[error("QMP {path}: {msg}")]
    Qmp { path: PathBuf, msg: String },
}

/// How the VMM runs the guest: decides which extra threads sit on the guest's
/// latency path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    Kvm,
    Tcg,
    Unknown,
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

/// Parses a vCPU index out of the thread names VMMs give their vCPU threads:
/// QEMU `CPU n/KVM` / `CPU n/TCG` (with `-name ..,debug-threads=on`),
/// crosvm `crosvm_vcpuN`, cloud-hypervisor `vcpuN`, Firecracker `fc_vcpu N`.
pub fn vcpu_index_from_name(comm: &str) -> Option<(u32, Accel)> {
    let comm = comm.trim_end_matches('\n');
    if let Some(rest) = comm.strip_prefix("CPU ") {
        let (n, accel) = rest.split_once('/')?;
        let accel = match accel {
            "KVM" => Accel::Kvm,
            "TCG" => Accel::Tcg,
            _ => Accel::Unknown,
        };
        return Some((n.parse().ok()?, accel));
    }
    for (prefix, accel) in [
        ("crosvm_vcpu", Accel::Kvm),
        ("fc_vcpu ", Accel::Kvm),
        ("vcpu", Accel::Kvm),
    ] {
        if let Some(n) = comm.strip_prefix(prefix) {
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                return Some((n.parse().ok()?, accel));
            }
        }
    }
    None
}

/// vCPU threads of process `tgid` by thread name.
pub fn threads_by_name(tgid: i32) -> Result<VmThreads, DiscoveryError> {
    let dir = PathBuf::from(format!("/proc/{tgid}/task"));
    let entries = fs::read_dir(&dir).map_err(|e| DiscoveryError::Io {
        path: dir.clone(),
        op: "read_dir",
        source: e,
    })?;
    let mut vcpus = Vec::new();
    let mut accel = Accel::Unknown;
    for entry in entries.flatten() {
        let Some(tid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(comm) = fs::read_to_string(entry.path().join("comm")) else {
            continue; // thread exited meanwhile
        };
        if let Some((idx, a)) = vcpu_index_from_name(&comm) {
            vcpus.push((idx, tid));
            accel = a;
        }
    }
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

/// A minimal QMP client: capabilities negotiation and synchronous commands.
pub struct Qmp {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self, DiscoveryError> {
        let io = |op, e| DiscoveryError::Io {
            path: path.to_path_buf(),
            op,
            source: e,
        };
        let stream = UnixStream::connect(path).map_err(|e| io("connect", e))?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| io("set timeout", e))?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| io("set timeout", e))?;
        let writer = stream.try_clone().map_err(|e| io("clone", e))?;
        let mut qmp = Self {
            path: path.to_path_buf(),
            reader: BufReader::new(stream),
            writer,
        };
        let greeting = qmp.read_message()?;
        if greeting.get("QMP").is_none() {
            return Err(qmp.err(format!("unexpected greeting {greeting}")));
        }
        qmp.execute("qmp_capabilities")?;
        Ok(qmp)
    }

    fn err(&self, msg: String) -> DiscoveryError {
        DiscoveryError::Qmp {
            path: self.path.clone(),
            msg,
        }
    }

    fn read_message(&mut self) -> Result<Value, DiscoveryError> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .map_err(|e| DiscoveryError::Io {
                path: self.path.clone(),
                op: "read",
                source: e,
            })?;
        if n == 0 {
            return Err(self.err("connection closed".into()));
        }
        serde_json::from_str(&line).map_err(|e| self.err(format!("bad JSON: {e}")))
    }

    /// Runs a command and returns its `return` value; asynchronous events
    /// arriving meanwhile are skipped.
    pub fn execute(&mut self, command: &str) -> Result<Value, DiscoveryError> {
        let req = serde_json::json!({ "execute": command });
        writeln!(self.writer, "{req}").map_err(|e| DiscoveryError::Io {
            path: self.path.clone(),
            op: "write",
            source: e,
        })?;
        for _ in 0..64 {
            let msg = self.read_message()?;
            if let Some(ret) = msg.get("return") {
                return Ok(ret.clone());
            }
            if let Some(err) = msg.get("error") {
                return Err(self.err(format!("{command}: {err}")));
            }
        }
        Err(self.err(format!("{command}: no reply among 64 messages")))
    }

    /// vCPU threads from `query-cpus-fast`, the VMM's own account.
    pub fn vcpu_threads(&mut self) -> Result<VmThreads, DiscoveryError> {
        let cpus = self.execute("query-cpus-fast")?;
        let list = cpus
            .as_array()
            .ok_or_else(|| self.err("query-cpus-fast: not a list".into()))?;
        let mut vcpus = Vec::with_capacity(list.len());
        for cpu in list {
            let idx = cpu.get("cpu-index").and_then(Value::as_u64);
            let tid = cpu.get("thread-id").and_then(Value::as_i64);
            match (idx, tid) {
                (Some(i), Some(t))
                    if i < u64::from(u32::MAX) && t > 0 && t <= i64::from(i32::MAX) =>
                {
                    vcpus.push((i as u32, t as i32))
                }
                _ => return Err(self.err(format!("query-cpus-fast: bad entry {cpu}"))),
            }
        }
        let kvm = self
            .execute("query-kvm")
            .ok()
            .and_then(|v| v.get("enabled").and_then(Value::as_bool));
        let accel = match kvm {
            Some(true) => Accel::Kvm,
            Some(false) => Accel::Tcg,
            None => Accel::Unknown,
        };
        let first = vcpus.first().map(|v| v.1).unwrap_or(0);
        let tgid = tgid_of(first)?;
        finish(tgid, vcpus, accel)
    }
}

/// The process a thread belongs to, from /proc/<tid>/status.
pub fn tgid_of(tid: i32) -> Result<i32, DiscoveryError> {
    let path = PathBuf::from(format!("/proc/{tid}/status"));
    let status = fs::read_to_string(&path).map_err(|e| DiscoveryError::Io {
        path: path.clone(),
        op: "read",
        source: e,
    })?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or(DiscoveryError::Io {
            path,
            op: "parse Tgid",
            source: std::io::Error::from(std::io::ErrorKind::InvalidData),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vcpu_names_of_every_known_vmm_parse_to_their_index() {
        let cases = [
            ("CPU 0/KVM", Some((0, Accel::Kvm))),
            ("CPU 12/TCG\n", Some((12, Accel::Tcg))),
            ("crosvm_vcpu3", Some((3, Accel::Kvm))),
            ("vcpu7", Some((7, Accel::Kvm))),
            ("fc_vcpu 1", Some((1, Accel::Kvm))),
            ("qemu-system-x86", None),
            ("vcpu", None),
            ("CPU x/KVM", None),
            ("worker", None),
        ];

        for (name, want) in cases {
            assert_eq!(vcpu_index_from_name(name), want, "{name}");
        }
    }

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
