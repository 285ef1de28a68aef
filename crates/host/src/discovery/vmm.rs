//! Which process is a VM's VMM, which of its threads are vCPUs, and
//! whether to believe it: the trust rules of discovery (see the module docs
//! of `discovery`).

use std::fs;
use std::io::{self, BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::sys::stat::{major, minor};
use pvsched_base::procfs::ProcFile;
use pvsched_base::qmp::{Qmp, QmpError};
use pvsched_base::thread::tgid_of;
use pvsched_base::vcpu_names::vcpu_threads_by_name;
pub use pvsched_base::vcpu_names::Accel;

use crate::found::VmThreads;

use crate::config::Allowed;

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
    pub(super) fn is_refusal(&self) -> bool {
        !matches!(
            self,
            Self::Io { .. } | Self::NoVcpuThreads(_) | Self::NotMapped(_)
        )
    }
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

/// The VM of process `tgid` from its vCPU list (indices 0..n without gaps).
pub(super) fn finish(
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
    let status = pvsched_base::procfs::read_to_string(format!("/proc/{pid}/status"))?;
    uids_in(pid, &status)
}

/// The real and effective uid in process `pid`'s status text.
fn uids_in(pid: i32, status: &str) -> io::Result<(u32, u32)> {
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
    not_self(pid)?;
    check_uids(pid, uids_of(pid), allowed)
}

/// [`check_vmm`] on process `pid`'s status as `status` holds it, open
/// (a read fails once the process is gone) and read into `text`.
pub fn check_vmm_status(
    pid: i32,
    status: &ProcFile,
    text: &mut String,
    allowed: &Allowed,
) -> Result<(), DiscoveryError> {
    not_self(pid)?;
    let uids = status.read_into(text).and_then(|()| uids_in(pid, text));
    check_uids(pid, uids, allowed)
}

fn not_self(pid: i32) -> Result<(), DiscoveryError> {
    if pid == std::process::id() as i32 {
        return Err(DiscoveryError::SelfProcess(pid));
    }
    Ok(())
}

fn check_uids(
    pid: i32,
    uids: io::Result<(u32, u32)>,
    allowed: &Allowed,
) -> Result<(), DiscoveryError> {
    let (real, effective) = uids.map_err(|e| DiscoveryError::Io {
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
    check_region_meta(path, &meta, allowed)
}

/// The rules of [`check_region_file`] on `meta`, which may come from the
/// open file itself (`fstat`): then no swap of the path can slip by.
pub fn check_region_meta(
    path: &Path,
    meta: &fs::Metadata,
    allowed: &Allowed,
) -> Result<FileId, DiscoveryError> {
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

/// A shared file mapping as one line of `/proc/<pid>/maps` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedMapping {
    pub file: FileId,
    /// First and one-past-last address.
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start`.
    pub offset: u64,
}

impl SharedMapping {
    /// The address of byte `at` of the file in this mapping, if mapped here.
    pub fn address_of(&self, at: u64) -> Option<u64> {
        let addr = self.start.checked_add(at.checked_sub(self.offset)?)?;
        (addr < self.end).then_some(addr)
    }
}

/// The shared mapping in one line of `/proc/<pid>/maps`
/// (`address perms offset major:minor inode [path]`); the path text is
/// ignored, it can be anything.
fn shared_mapping(line: &[u8]) -> Option<SharedMapping> {
    let mut fields = line
        .split(|b| *b == b' ')
        .filter(|f| !f.is_empty())
        .map(|f| std::str::from_utf8(f).ok());
    let (start, end) = fields.next()??.split_once('-')?;
    let perms = fields.next()??;
    let offset = u64::from_str_radix(fields.next()??, 16).ok()?;
    let dev = fields.next()??;
    let ino: u64 = fields.next()??.parse().ok()?;
    if ino == 0 || perms.as_bytes().get(3) != Some(&b's') {
        return None;
    }
    let (maj, min) = dev.split_once(':')?;
    Some(SharedMapping {
        file: FileId {
            major: u64::from_str_radix(maj, 16).ok()?,
            minor: u64::from_str_radix(min, 16).ok()?,
            ino,
        },
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset,
    })
}

/// The file of a shared mapping in one line of `/proc/<pid>/maps`.
fn shared_mapping_file(line: &[u8]) -> Option<FileId> {
    shared_mapping(line).map(|m| m.file)
}

/// The shared mappings of `file` in process `pid` (its `/proc/<pid>/maps`:
/// device and inode, never the path text).
pub fn mappings_of(pid: i32, file: FileId) -> Result<Vec<SharedMapping>, DiscoveryError> {
    let path = PathBuf::from(format!("/proc/{pid}/maps"));
    let maps = fs::File::open(&path).map_err(|e| DiscoveryError::Io {
        path: path.clone(),
        op: "open",
        source: e,
    })?;
    let mut out = Vec::new();
    for line in BufReader::new(maps).split(b'\n') {
        let line = line.map_err(|e| DiscoveryError::Io {
            path: path.clone(),
            op: "read",
            source: e,
        })?;
        out.extend(shared_mapping(&line).filter(|m| m.file == file));
    }
    Ok(out)
}

/// For each of `files`, the processes that map it shared, in one pass over
/// /proc. Only processes of allowed users are read (their uid is checked
/// before their maps), and never the daemon, which maps the regions it serves.
pub(super) fn mappers(
    files: &[FileId],
    allowed: &Allowed,
) -> Result<Vec<Vec<i32>>, DiscoveryError> {
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

/// Whether process `pid` maps `file` shared (read from its
/// `/proc/<pid>/maps`: device and inode, never the path text).
pub(super) fn maps_file(pid: i32, file: FileId) -> Result<bool, DiscoveryError> {
    Ok(!mappings_of(pid, file)?.is_empty())
}

/// The VMM among the processes that map `region`: the one with vCPU
/// threads (a fork or a helper mapping it has none); several is ambiguous.
pub(super) fn vmm_among(region: &Path, pids: &[i32]) -> Result<VmThreads, DiscoveryError> {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

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
