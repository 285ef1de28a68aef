//! VM discovery: which VMs exist now and their vCPU threads, found on a
//! thread of its own every `discovery_interval_ms` and sent to the event
//! loop as a snapshot. Thread ids come only from the VMM (QMP
//! `query-cpus-fast`) or from the host's /proc: never from the shared region.
//!
//! Whom it believes: a VMM is served only when its process runs (real and
//! effective uid) as one of `[discovery] allowed_users` and is not pvschedd
//! itself; only then are its thread names taken for vCPU indices. A VM
//! found by its region file (auto discovery, or a `[[vm]]` entry with
//! neither `qmp` nor `pid`) is served by the process that maps that file
//! (device and inode, never path text in a command line), and only when the
//! file is a regular file owned by an allowed user or the daemon, and
//! writable by no one else (group-writable only for an allowed group). A
//! QMP socket's peer (`SO_PEERCRED`) must be an allowed VMM, and every
//! thread it reports must be one of its own threads.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::eventfd::EventFd;
use nix::sys::stat::{major, minor};
use pvsched_base::qmp::{Qmp, QmpError};
use pvsched_base::thread::tgid_of;
use pvsched_base::vcpu_names::vcpu_threads_by_name;
pub use pvsched_base::vcpu_names::Accel;
use tracing::{debug, info};

use crate::config::{Allowed, Resolved};

/// Bound of each QMP exchange (connect and greeting, each command).
const QMP_TIMEOUT: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error(
        "{region}: mapped by several processes with vCPU threads ({pids:?}); refusing to guess"
    )]
    AmbiguousVmm { region: PathBuf, pids: Vec<i32> },
    #[error("{path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    #[error("process {0} has no vCPU threads by any known naming")]
    NoVcpuThreads(i32),
    #[error("no process of an allowed user maps {0}")]
    NotMapped(PathBuf),
    #[error(transparent)]
    Qmp(#[from] QmpError),
    #[error("QMP {path}: thread {tid} is not a thread of the socket's peer, process {peer}")]
    QmpForeignThread { path: PathBuf, tid: i32, peer: i32 },
    #[error("QMP {path}: the socket's peer is not visible here (pid 0)")]
    QmpPeerHidden { path: PathBuf },
    #[error(
        "QMP {path}: the socket's peer runs as uid {uid}, not one of [discovery] allowed_users"
    )]
    QmpPeerUser { path: PathBuf, uid: u32 },
    #[error("{path}: group-writable (mode {mode:o}) by group {gid}, not one of [discovery] allowed_groups")]
    RegionGroupWritable { path: PathBuf, mode: u32, gid: u32 },
    #[error("{0}: not a regular file (a symlink or other); refusing")]
    RegionNotRegular(PathBuf),
    #[error("{path}: owned by uid {uid}, not one of [discovery] allowed_users")]
    RegionOwner { path: PathBuf, uid: u32 },
    #[error("{path}: world-writable (mode {mode:o}); refusing")]
    RegionWorldWritable { path: PathBuf, mode: u32 },
    #[error("process {0} is pvschedd itself")]
    SelfProcess(i32),
    #[error("process {pid} runs as uid {uid}, not one of [discovery] allowed_users")]
    UntrustedVmm { pid: i32, uid: u32 },
}

impl DiscoveryError {
    /// A refusal on the trust rules (logged where the admin sees it), as
    /// opposed to a VM that is just not running.
    fn is_refusal(&self) -> bool {
        !matches!(
            self,
            Self::Io { .. } | Self::NoVcpuThreads(_) | Self::NotMapped(_)
        )
    }
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

/// vCPU threads of process `tgid` by thread name. The names are the
/// process's own choice: callers check the process first ([`check_vmm`]).
pub fn threads_by_name(tgid: i32) -> Result<VmThreads, DiscoveryError> {
    let (vcpus, accel) = vcpu_threads_by_name(tgid).map_err(|e| DiscoveryError::Io {
        path: PathBuf::from(format!("/proc/{tgid}/task")),
        op: "read_dir",
        source: e,
    })?;
    finish(tgid, vcpus, accel)
}

/// vCPU threads from the VMM's own account (`query-cpus-fast`, and
/// `query-kvm` for the accelerator). The VMM is the socket's peer: it must
/// be an allowed VMM ([`check_vmm`]) and may only name its own threads.
pub fn threads_by_qmp(qmp: &mut Qmp, allowed: &Allowed) -> Result<VmThreads, DiscoveryError> {
    let path = qmp.path().to_path_buf();
    let peer = qmp.peer();
    if peer.pid <= 0 {
        return Err(DiscoveryError::QmpPeerHidden { path });
    }
    // The credentials of whoever opened the socket, then the process as it
    // runs now (QEMU may listen as root and drop to its own account).
    if !allowed.uids.contains(&peer.uid) {
        return Err(DiscoveryError::QmpPeerUser {
            path,
            uid: peer.uid,
        });
    }
    check_vmm(peer.pid, allowed)?;
    let vcpus = qmp.vcpu_thread_ids()?;
    for &(_, tid) in &vcpus {
        let own = Path::new(&format!("/proc/{}/task/{tid}", peer.pid)).exists()
            && tgid_of(tid).is_ok_and(|t| t == peer.pid);
        if !own {
            return Err(DiscoveryError::QmpForeignThread {
                path,
                tid,
                peer: peer.pid,
            });
        }
    }
    let accel = match qmp.kvm_enabled() {
        Some(true) => Accel::Kvm,
        Some(false) => Accel::Tcg,
        None => Accel::Unknown,
    };
    finish(peer.pid, vcpus, accel)
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

/// Real and effective uid of process `pid` (the `Uid:` line of its status).
fn uids_of(pid: i32) -> io::Result<(u32, u32)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let mut ids = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .into_iter()
        .flat_map(str::split_whitespace)
        .map(str::parse::<u32>);
    match (ids.next(), ids.next()) {
        (Some(Ok(real)), Some(Ok(effective))) => Ok((real, effective)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/status: no Uid line"),
        )),
    }
}

/// Whether process `pid` may be served as a VMM: not pvschedd itself, and
/// running (real and effective uid) as an allowed user. Its thread names are
/// believed only after this.
pub fn check_vmm(pid: i32, allowed: &Allowed) -> Result<(), DiscoveryError> {
    if pid == std::process::id() as i32 {
        return Err(DiscoveryError::SelfProcess(pid));
    }
    let (real, effective) = uids_of(pid).map_err(|e| DiscoveryError::Io {
        path: PathBuf::from(format!("/proc/{pid}/status")),
        op: "read Uid",
        source: e,
    })?;
    match [real, effective]
        .into_iter()
        .find(|u| !allowed.uids.contains(u))
    {
        Some(uid) => Err(DiscoveryError::UntrustedVmm { pid, uid }),
        None => Ok(()),
    }
}

/// A file as `/proc/<pid>/maps` names a mapping's file: device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    pub major: u64,
    pub minor: u64,
    pub ino: u64,
}

/// Checks that the region file at `path` may be trusted and returns its
/// identity: a regular file (not a symlink: the path itself is looked at),
/// owned by an allowed user or by the daemon's user, not world-writable,
/// and group-writable only for an allowed group.
pub fn check_region_file(path: &Path, allowed: &Allowed) -> Result<FileId, DiscoveryError> {
    let meta = fs::symlink_metadata(path).map_err(|e| DiscoveryError::Io {
        path: path.to_path_buf(),
        op: "lstat",
        source: e,
    })?;
    if !meta.file_type().is_file() {
        return Err(DiscoveryError::RegionNotRegular(path.to_path_buf()));
    }
    let (uid, gid, mode) = (meta.uid(), meta.gid(), meta.mode() & 0o7777);
    if !allowed.uids.contains(&uid) && uid != nix::unistd::geteuid().as_raw() {
        return Err(DiscoveryError::RegionOwner {
            path: path.to_path_buf(),
            uid,
        });
    }
    if mode & 0o002 != 0 {
        return Err(DiscoveryError::RegionWorldWritable {
            path: path.to_path_buf(),
            mode,
        });
    }
    if mode & 0o020 != 0 && !allowed.gids.contains(&gid) {
        return Err(DiscoveryError::RegionGroupWritable {
            path: path.to_path_buf(),
            mode,
            gid,
        });
    }
    Ok(FileId {
        major: major(meta.dev()),
        minor: minor(meta.dev()),
        ino: meta.ino(),
    })
}

/// The file of a shared mapping in one line of `/proc/<pid>/maps`
/// (`address perms offset major:minor inode [path]`); the path text is
/// ignored, it can be anything.
fn shared_mapping_file(line: &[u8]) -> Option<FileId> {
    let mut fields = line
        .split(|b| *b == b' ')
        .filter(|f| !f.is_empty())
        .map(|f| std::str::from_utf8(f).ok());
    let _addr = fields.next()?;
    let perms = fields.next()??;
    let _offset = fields.next()?;
    let dev = fields.next()??;
    let ino: u64 = fields.next()??.parse().ok()?;
    if ino == 0 || perms.as_bytes().get(3) != Some(&b's') {
        return None;
    }
    let (maj, min) = dev.split_once(':')?;
    Some(FileId {
        major: u64::from_str_radix(maj, 16).ok()?,
        minor: u64::from_str_radix(min, 16).ok()?,
        ino,
    })
}

/// For each of `files`, the processes that map it shared, in one pass over
/// /proc. Only processes of allowed users are read (their uid is checked
/// before their maps), and never the daemon, which maps the regions it serves.
fn mappers(files: &[FileId], allowed: &Allowed) -> Result<Vec<Vec<i32>>, DiscoveryError> {
    let me = std::process::id() as i32;
    let mut out = vec![Vec::new(); files.len()];
    let proc_dir = fs::read_dir("/proc").map_err(|e| DiscoveryError::Io {
        path: "/proc".into(),
        op: "read_dir",
        source: e,
    })?;
    for pid in proc_dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
    {
        if pid == me
            || !uids_of(pid)
                .is_ok_and(|(r, e)| allowed.uids.contains(&r) && allowed.uids.contains(&e))
        {
            continue;
        }
        // Processes come and go: one that cannot be read maps nothing now.
        let Ok(maps) = fs::File::open(format!("/proc/{pid}/maps")) else {
            continue;
        };
        for line in BufReader::new(maps).split(b'\n') {
            let Ok(line) = line else { break };
            let Some(id) = shared_mapping_file(&line) else {
                continue;
            };
            for (i, _) in files.iter().enumerate().filter(|(_, f)| **f == id) {
                if !out[i].contains(&pid) {
                    out[i].push(pid);
                }
            }
        }
    }
    Ok(out)
}

/// The VMM among the processes that map `region`: the one with vCPU
/// threads (a fork or a helper mapping it has none); several is ambiguous.
fn vmm_among(region: &Path, pids: &[i32]) -> Result<VmThreads, DiscoveryError> {
    let mut with_vcpus: Vec<VmThreads> = pids
        .iter()
        .filter_map(|pid| threads_by_name(*pid).ok())
        .collect();
    match with_vcpus.len() {
        1 => Ok(with_vcpus.remove(0)),
        0 => match pids.first() {
            Some(pid) => Err(DiscoveryError::NoVcpuThreads(*pid)),
            None => Err(DiscoveryError::NotMapped(region.to_path_buf())),
        },
        _ => Err(DiscoveryError::AmbiguousVmm {
            region: region.to_path_buf(),
            pids: with_vcpus.iter().map(|t| t.tgid).collect(),
        }),
    }
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
/// (configured ones and, with auto discovery, any allowed VMM mapping a
/// region file) and whether the host is overloaded, sent on `tx`, then
/// `wake` is signalled.
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
            let mut logged = Notes::default();
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

/// Why each VM is not served, logged once per reason: at info for a
/// configured VM (the admin expects it to be served) and for a refusal on
/// the trust rules, at debug for a stale auto-discovery file.
#[derive(Default)]
struct Notes {
    last: BTreeMap<String, String>,
    /// Names noted in this round: the others are forgotten at its end, so
    /// that files that come and go do not grow the map.
    seen: BTreeSet<String>,
}

impl Notes {
    fn note(&mut self, name: &str, e: &DiscoveryError, configured: bool) {
        let msg = if configured {
            format!("not served yet: {e}")
        } else if e.is_refusal() {
            format!("refused: {e}")
        } else {
            format!("not running: {e}")
        };
        self.seen.insert(name.to_string());
        if self.last.get(name) == Some(&msg) {
            return;
        }
        if configured || e.is_refusal() {
            info!(vm = name, "{msg}");
        } else {
            debug!(vm = name, "{msg}");
        }
        self.last.insert(name.to_string(), msg);
    }

    fn end_round(&mut self) {
        let seen = std::mem::take(&mut self.seen);
        self.last.retain(|name, _| seen.contains(name));
    }
}

/// A VM to be found by who maps its region file.
struct ByRegion {
    name: String,
    cfg_index: Option<usize>,
    region: PathBuf,
    region_mode: u32,
    file: FileId,
}

fn discover_once(cfg: &Resolved, notes: &mut Notes) -> Vec<Found> {
    let c = &cfg.config;
    let allowed = &cfg.allowed;
    let mut found = Vec::new();
    let mut by_region: Vec<ByRegion> = Vec::new();
    for (i, vm) in c.vms.iter().enumerate() {
        let region = vm.region_path(&c.discovery);
        // A file that exists must pass the same checks as an auto-discovered
        // one; a missing one is created by the daemon when the VM is served
        // (found by QMP or pid), or waited for (found by who maps it).
        let by_vmm = vm.qmp.is_some() || vm.pid.is_some();
        let file = match check_region_file(&region, allowed) {
            Ok(id) => Some(id),
            Err(DiscoveryError::Io { source, .. })
                if by_vmm && source.kind() == io::ErrorKind::NotFound =>
            {
                None
            }
            Err(e) => {
                notes.note(&vm.name, &e, true);
                continue;
            }
        };
        let threads = if let Some(qmp) = &vm.qmp {
            Qmp::connect(qmp, QMP_TIMEOUT)
                .map_err(DiscoveryError::from)
                .and_then(|mut q| threads_by_qmp(&mut q, allowed))
        } else if let Some(pid) = vm.pid {
            check_vmm(pid, allowed).and_then(|()| threads_by_name(pid))
        } else if let Some(file) = file {
            by_region.push(ByRegion {
                name: vm.name.clone(),
                cfg_index: Some(i),
                region,
                region_mode: vm.region_mode,
                file,
            });
            continue;
        } else {
            continue;
        };
        match threads {
            Ok(threads) => found.push(Found {
                name: vm.name.clone(),
                cfg_index: Some(i),
                region,
                region_mode: vm.region_mode,
                threads,
            }),
            Err(e) => notes.note(&vm.name, &e, true),
        }
    }
    if c.discovery.auto {
        if let Ok(dir) = fs::read_dir(&c.discovery.region_dir) {
            for entry in dir.flatten() {
                let file_name = entry.file_name().to_string_lossy().into_owned();
                let Some(name) = file_name.strip_prefix(&c.discovery.region_prefix) else {
                    continue;
                };
                if name.is_empty() || c.vms.iter().any(|v| v.name == name) {
                    continue;
                }
                let region = entry.path();
                match check_region_file(&region, allowed) {
                    Ok(file) => by_region.push(ByRegion {
                        name: name.to_string(),
                        cfg_index: None,
                        region,
                        region_mode: 0o600,
                        file,
                    }),
                    Err(e) => notes.note(name, &e, false),
                }
            }
        }
    }
    if !by_region.is_empty() {
        let files: Vec<FileId> = by_region.iter().map(|b| b.file).collect();
        match mappers(&files, allowed) {
            Ok(pids) => {
                for (b, pids) in by_region.into_iter().zip(pids) {
                    match vmm_among(&b.region, &pids) {
                        Ok(threads) => found.push(Found {
                            name: b.name,
                            cfg_index: b.cfg_index,
                            region: b.region,
                            region_mode: b.region_mode,
                            threads,
                        }),
                        Err(e) => notes.note(&b.name, &e, b.cfg_index.is_some()),
                    }
                }
            }
            Err(e) => {
                for b in &by_region {
                    notes.note(&b.name, &e, b.cfg_index.is_some());
                }
            }
        }
    }
    notes.end_round();
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

    #[test]
    fn only_shared_file_mappings_are_read_from_maps_lines() {
        let shared = b"7f1c2a000000-7f1c2a001000 rw-s 00000000 00:1a 4242 /dev/shm/pvsched-a";
        let private = b"7f1c2a000000-7f1c2a001000 rw-p 00000000 00:1a 4242 /dev/shm/pvsched-a";
        let anon = b"7ffd4b9f2000-7ffd4ba13000 rw-s 00000000 00:00 0 [stack]";
        let big_minor = b"7f00-7f01 r--s 00001000 103:1f02 99 /a path with spaces (deleted)";

        assert_eq!(
            shared_mapping_file(shared),
            Some(FileId {
                major: 0,
                minor: 0x1a,
                ino: 4242
            })
        );
        assert_eq!(shared_mapping_file(private), None);
        assert_eq!(shared_mapping_file(anon), None);
        assert_eq!(
            shared_mapping_file(big_minor),
            Some(FileId {
                major: 0x103,
                minor: 0x1f02,
                ino: 99
            })
        );
    }

    #[test]
    fn the_daemon_never_serves_itself() {
        let allowed = Allowed {
            uids: [0, nix::unistd::getuid().as_raw()].into(),
            gids: BTreeSet::new(),
        };

        let err = check_vmm(std::process::id() as i32, &allowed).unwrap_err();

        assert!(matches!(err, DiscoveryError::SelfProcess(_)), "{err}");
    }

    #[test]
    fn a_process_of_a_user_not_allowed_is_refused() {
        let nobody_allowed = Allowed::default();

        let err = check_vmm(1, &nobody_allowed).unwrap_err();

        assert!(
            matches!(err, DiscoveryError::UntrustedVmm { pid: 1, .. }),
            "{err}"
        );
    }
}
