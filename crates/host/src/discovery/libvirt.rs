//! Domains started by libvirt, found through what libvirt publishes, never
//! around it: libvirtd writes a status file per running QEMU domain
//! (`/run/libvirt/qemu/<domain>.xml`: root's, mode 0600) holding the QEMU
//! pid, each vCPU's thread id and the domain XML. A domain is served when
//! that XML carries `<shmem name='pvsched-NAME'>` with an ivshmem model;
//! its region is the file libvirt has QEMU create, `/dev/shm/pvsched-NAME`.
//! libvirt owns the QMP monitor, so it is never used here.
//!
//! Whom it believes: the status file only if root owns it and no one else
//! may write it (libvirtd runs as root); the QEMU process and the region
//! file only if both belong to `[libvirt] qemu_user` (and the process to an
//! allowed user, as every VMM), the process maps that very file, and every
//! vCPU thread id is a thread of that process.
//!
//! A libvirt hook (`packaging/libvirt/hooks/qemu.d/pvsched`) asks the daemon
//! to look again when a domain starts or stops (`pvschedctl libvirt-hook`),
//! so a domain is served without waiting for the next discovery round.

use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use pvsched_base::thread::tgid_of;

use super::vmm::{check_region_file, check_vmm, finish, maps_file, Accel, DiscoveryError};
use crate::config::{Allowed, LibvirtConfig};
use crate::found::Found;

/// Largest status file read (libvirt's are a few tens of KiB).
const MAX_STATUS_BYTES: u64 = 4 << 20;

/// What a status file says about a domain that asks for pvsched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain {
    pub name: String,
    /// The QEMU process.
    pub pid: i32,
    /// (vCPU index, thread id), as libvirt recorded them.
    pub vcpus: Vec<(u32, i32)>,
    pub accel: Accel,
    /// The `<shmem name=...>` that opted the domain in.
    pub shmem: String,
}

#[derive(Debug, thiserror::Error)]
pub enum LibvirtError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not libvirt's (owner uid {uid}, mode {mode:o}); refusing")]
    NotLibvirts { path: PathBuf, uid: u32, mode: u32 },
    #[error("{path}: {msg}")]
    Parse { path: PathBuf, msg: String },
    #[error(
        "domain {domain}: process {pid} runs as uid {uid}, not [libvirt] qemu_user (uid {want})"
    )]
    QemuUser {
        domain: String,
        pid: i32,
        uid: u32,
        want: u32,
    },
    #[error("domain {domain}: {path} is owned by uid {uid}, not [libvirt] qemu_user (uid {want})")]
    RegionOwner {
        domain: String,
        path: PathBuf,
        uid: u32,
        want: u32,
    },
    #[error("domain {domain}: process {pid} does not map {path}")]
    RegionNotMapped {
        domain: String,
        pid: i32,
        path: PathBuf,
    },
    #[error("domain {domain}: vCPU {index} thread {tid} is not a thread of process {pid}")]
    ForeignThread {
        domain: String,
        index: u32,
        tid: i32,
        pid: i32,
    },
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
}

impl LibvirtError {
    /// A refusal on the trust rules, as opposed to a domain that is going
    /// away or a file being rewritten.
    pub fn is_refusal(&self) -> bool {
        match self {
            Self::Io { .. } | Self::Parse { .. } => false,
            Self::Discovery(e) => e.is_refusal(),
            _ => true,
        }
    }
}

/// Parses a libvirt QEMU status file: `None` if the domain does not carry a
/// `<shmem>` whose name starts with `prefix` (ivshmem-plain, or
/// ivshmem-doorbell without a `<server>`), or is not running.
pub fn parse_status(text: &str, prefix: &str) -> Result<Option<Domain>, String> {
    let doc = roxmltree::Document::parse(text).map_err(|e| e.to_string())?;
    let root = doc.root_element();
    if root.tag_name().name() != "domstatus" {
        return Err(format!(
            "root element <{}>, not <domstatus>",
            root.tag_name().name()
        ));
    }
    let Some(domain) = child(root, "domain") else {
        return Err("no <domain>".into());
    };
    let shmem = child(domain, "devices").and_then(|devices| {
        devices
            .children()
            .filter(|d| d.is_element() && d.tag_name().name() == "shmem")
            .find(|d| {
                let model = child(*d, "model").and_then(|m| m.attribute("type"));
                // A doorbell device with a <server> takes its memory from
                // that server, not a file: pvschedd's own ivshmem server
                // serves it (crate::ivshmem_server).
                d.attribute("name").is_some_and(|n| n.starts_with(prefix))
                    && matches!(model, Some("ivshmem-plain" | "ivshmem-doorbell"))
                    && child(*d, "server").is_none()
            })
            .and_then(|d| d.attribute("name"))
    });
    let Some(shmem) = shmem else {
        return Ok(None);
    };
    // libvirt names the file after the device: nothing else may be in it.
    if shmem.contains('/') || shmem == "." || shmem == ".." {
        return Err(format!("<shmem name={shmem:?}>: not a file name"));
    }
    let name = child(domain, "name")
        .and_then(|n| n.text())
        .ok_or("no <domain><name>")?
        .to_string();
    let Some(pid) = root.attribute("pid") else {
        return Ok(None);
    };
    let pid: i32 = pid
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("<domstatus pid={pid:?}>: not a process id"))?;
    let mut vcpus = Vec::new();
    if let Some(list) = child(root, "vcpus") {
        for v in list
            .children()
            .filter(|c| c.is_element() && c.tag_name().name() == "vcpu")
        {
            let (Some(id), Some(tid)) = (v.attribute("id"), v.attribute("pid")) else {
                continue;
            };
            let id: u32 = id.parse().map_err(|_| format!("<vcpu id={id:?}>"))?;
            let tid: i32 = tid
                .parse()
                .ok()
                .filter(|t| *t > 0)
                .ok_or_else(|| format!("<vcpu pid={tid:?}>"))?;
            vcpus.push((id, tid));
        }
    }
    let accel = match domain.attribute("type") {
        Some("kvm") => Accel::Kvm,
        Some("qemu") => Accel::Tcg,
        _ => Accel::Unknown,
    };
    Ok(Some(Domain {
        name,
        pid,
        vcpus,
        accel,
        shmem: shmem.to_string(),
    }))
}

/// The first child element of `n` named `tag`.
fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, tag: &str) -> Option<roxmltree::Node<'a, 'i>> {
    n.children()
        .find(|c| c.is_element() && c.tag_name().name() == tag)
}

/// Reads a status file that root owns and only root may write, bounded.
fn read_status(path: &Path) -> Result<String, LibvirtError> {
    let io = |source| LibvirtError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags_nofollow()
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    let mode = meta.mode() & 0o7777;
    if !meta.file_type().is_file() || meta.uid() != 0 || mode & 0o022 != 0 {
        return Err(LibvirtError::NotLibvirts {
            path: path.to_path_buf(),
            uid: meta.uid(),
            mode,
        });
    }
    let mut text = String::new();
    file.take(MAX_STATUS_BYTES)
        .read_to_string(&mut text)
        .map_err(io)?;
    Ok(text)
}

/// `open` flags for status files: a symlink is not followed.
trait NoFollow {
    fn custom_flags_nofollow(&mut self) -> &mut Self;
}

impl NoFollow for fs::OpenOptions {
    fn custom_flags_nofollow(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
    }
}

/// Checks one domain against the trust rules and turns it into a VM.
fn serve(
    d: Domain,
    cfg: &LibvirtConfig,
    qemu_uid: u32,
    allowed: &Allowed,
) -> Result<Found, LibvirtError> {
    let uid = fs::metadata(format!("/proc/{}", d.pid))
        .map_err(|source| LibvirtError::Io {
            path: PathBuf::from(format!("/proc/{}", d.pid)),
            source,
        })?
        .uid();
    if uid != qemu_uid {
        return Err(LibvirtError::QemuUser {
            domain: d.name,
            pid: d.pid,
            uid,
            want: qemu_uid,
        });
    }
    check_vmm(d.pid, allowed)?;
    let region = cfg.shm_dir.join(&d.shmem);
    let file = check_region_file(&region, allowed)?;
    let owner = fs::symlink_metadata(&region)
        .map_err(|source| LibvirtError::Io {
            path: region.clone(),
            source,
        })?
        .uid();
    if owner != qemu_uid {
        return Err(LibvirtError::RegionOwner {
            domain: d.name,
            path: region,
            uid: owner,
            want: qemu_uid,
        });
    }
    if !maps_file(d.pid, file)? {
        return Err(LibvirtError::RegionNotMapped {
            domain: d.name,
            pid: d.pid,
            path: region,
        });
    }
    for &(index, tid) in &d.vcpus {
        let own = Path::new(&format!("/proc/{}/task/{tid}", d.pid)).exists()
            && tgid_of(tid).is_ok_and(|t| t == d.pid);
        if !own {
            return Err(LibvirtError::ForeignThread {
                domain: d.name,
                index,
                tid,
                pid: d.pid,
            });
        }
    }
    let threads = finish(d.pid, d.vcpus, d.accel)?;
    Ok(Found {
        name: d.name,
        cfg_index: None,
        region,
        region_mode: 0o600,
        region_from_server: false,
        threads,
    })
}

/// Every running libvirt domain that asks for pvsched: served ones, and the
/// others with why not (by domain name, or by status file name when it
/// could not be read).
pub fn discover(
    cfg: &LibvirtConfig,
    qemu_uid: u32,
    allowed: &Allowed,
) -> Vec<Result<Found, (String, LibvirtError)>> {
    let Ok(dir) = fs::read_dir(&cfg.status_dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "xml") {
            continue;
        }
        let file_name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let domain = read_status(&path).and_then(|text| {
            parse_status(&text, &cfg.shmem_prefix).map_err(|msg| LibvirtError::Parse {
                path: path.clone(),
                msg,
            })
        });
        match domain {
            Ok(None) => {}
            Ok(Some(d)) => {
                let name = d.name.clone();
                out.push(serve(d, cfg, qemu_uid, allowed).map_err(|e| (name, e)));
            }
            Err(e) => out.push(Err((file_name, e))),
        }
    }
    out.sort_by(|a, b| {
        let key = |r: &Result<Found, (String, LibvirtError)>| match r {
            Ok(f) => f.name.clone(),
            Err((n, _)) => n.clone(),
        };
        key(a).cmp(&key(b))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNNING: &str = r#"<domstatus state='running' reason='booted' pid='4242'>
  <vcpus>
    <vcpu id='0' pid='4250'/>
    <vcpu id='1' pid='4251'/>
  </vcpus>
  <domain type='qemu' id='3'>
    <name>web</name>
    <devices>
      <shmem name='other'><model type='ivshmem-plain'/></shmem>
      <shmem name='pvsched-web'>
        <model type='ivshmem-plain'/>
        <size unit='M'>1</size>
      </shmem>
    </devices>
  </domain>
</domstatus>"#;

    #[test]
    fn a_running_domain_with_the_element_gives_its_pid_vcpus_and_region_name() {
        let d = parse_status(RUNNING, "pvsched-").unwrap().unwrap();

        assert_eq!(d.name, "web");
        assert_eq!(d.pid, 4242);
        assert_eq!(d.vcpus, vec![(0, 4250), (1, 4251)]);
        assert_eq!(d.accel, Accel::Tcg);
        assert_eq!(d.shmem, "pvsched-web");
    }

    #[test]
    fn a_domain_without_the_element_or_with_another_model_is_not_asked_for() {
        let without = RUNNING.replace("pvsched-web", "shared-web");
        let wrong_model = RUNNING.replace(
            "<model type='ivshmem-plain'/>\n        <size",
            "<model type='something'/>\n        <size",
        );

        assert_eq!(parse_status(&without, "pvsched-").unwrap(), None);
        assert_eq!(parse_status(&wrong_model, "pvsched-").unwrap(), None);
    }

    #[test]
    fn a_doorbell_device_with_a_server_is_left_to_the_ivshmem_server() {
        let served = RUNNING.replace(
            "<model type='ivshmem-plain'/>",
            "<model type='ivshmem-doorbell'/><server path='/run/pvsched/ivshmem.sock'/>",
        );
        let without_server = RUNNING.replace(
            "<model type='ivshmem-plain'/>",
            "<model type='ivshmem-doorbell'/>",
        );

        assert_eq!(parse_status(&served, "pvsched-").unwrap(), None);
        assert!(parse_status(&without_server, "pvsched-").unwrap().is_some());
    }

    #[test]
    fn libvirtds_own_status_files_parse_as_written() {
        // Captured from libvirt 9.0 (crates/host/tests/data/libvirt/README.md).
        let with = include_str!("../../tests/data/libvirt/status-with-shmem.xml");
        let without = include_str!("../../tests/data/libvirt/status-without-shmem.xml");

        let d = parse_status(with, "pvsched-").unwrap().unwrap();

        assert_eq!(d.name, "pvs-e2e-on");
        assert_eq!(d.pid, 19090);
        assert_eq!(d.vcpus, vec![(0, 19096), (1, 19097)]);
        assert_eq!(d.accel, Accel::Tcg);
        assert_eq!(d.shmem, "pvsched-pvs-e2e-on");
        assert_eq!(parse_status(without, "pvsched-").unwrap(), None);
    }

    #[test]
    fn hostile_status_contents_are_errors_not_panics() {
        for bad in [
            "",
            "<domain/>",
            "<domstatus pid='1'/>",
            &RUNNING.replace("pid='4242'", "pid='-1'"),
            &RUNNING.replace("pid='4250'", "pid='x'"),
            &RUNNING.replace("pvsched-web'", "pvsched-../../etc/passwd'"),
        ] {
            assert!(parse_status(bad, "pvsched-").is_err(), "{bad}");
        }
    }
}
