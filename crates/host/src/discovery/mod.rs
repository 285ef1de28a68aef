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
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::eventfd::EventFd;
use pvsched_base::procfs::ProcFile;
use pvsched_base::qmp::Qmp;
use tracing::{debug, info};

use pvsched_policy::{serving, VmLimits};

use crate::config::{Allowed, Resolved};
use crate::doorbell::Doorbell;
use crate::found::Found;
use crate::ivshmem_server::SocketVms;
use crate::metrics::VmMetrics;
use crate::vm::ServedVm;
use qmp_cache::QmpCache;
use vmm::{mappers, vmm_among};

pub mod libvirt;
mod qmp_cache;
mod vmm;

pub use vmm::{
    check_region_file, check_region_meta, check_vmm, mappings_of, threads_by_name, threads_by_qmp,
    Accel, DiscoveryError, FileId, SharedMapping,
};

/// Bound of each QMP exchange (connect and greeting, each command).
const QMP_TIMEOUT: Duration = Duration::from_millis(500);

/// Rounds after a rescan request besides the immediate one: libvirt runs its
/// `started` hook around the time it writes the domain's status file.
const RESCAN_FOLLOW_UPS: [Duration; 3] = [
    Duration::from_millis(200),
    Duration::from_millis(1000),
    Duration::from_millis(3000),
];

/// What the discovery thread sends the event loop.
pub struct Snapshot {
    /// Every VM that exists now.
    pub found: Vec<Found>,
    /// CPU pressure says the host is overloaded.
    pub overloaded: bool,
}

/// A VM the event loop wants served: opened on the discovery thread, since
/// opening maps, validates and may zero the region (file-system work the
/// RT event thread must not wait for).
pub struct OpenRequest {
    pub found: Found,
    /// Its VM id in the event source, reserved by the event loop.
    pub id: u32,
    pub limits: VmLimits,
    pub metrics: VmMetrics,
    /// The `F_*` bits the region offers its guest.
    pub features: u64,
}

/// What the event loop asks of the discovery thread.
pub enum DiscoveryRequest {
    Open(Box<OpenRequest>),
    /// Run a round now, and again shortly after (a libvirt domain that just
    /// started may not have its status file written yet).
    Rescan,
}

/// Messages of the discovery thread to the event loop.
pub enum DiscoveryMsg {
    Snapshot(Snapshot),
    /// The answer to an [`OpenRequest`].
    Opened {
        name: String,
        id: u32,
        result: Result<Box<ServedVm>, String>,
    },
    /// The ivshmem server serves a new VM: its doorbell, sent before
    /// discovery lists the VM, so that it is opened with it.
    Doorbell(Doorbell),
    /// A VM served through the ivshmem socket ended: its doorbell goes.
    DoorbellGone(String),
}

/// Opens a VM and checks again, on what is now held, what discovery checked
/// on names: the region file as opened (`fstat`, so a path swapped since
/// cannot slip by) and the VMM process (its threads are pinned by their
/// handles now, so a reused pid cannot either).
fn open_vm(req: OpenRequest, allowed: &Allowed) -> Result<Box<ServedVm>, String> {
    let OpenRequest {
        found,
        id,
        limits,
        metrics,
        features,
    } = req;
    let vm = ServedVm::open(&found, id, limits, metrics, features).map_err(|e| e.to_string())?;
    let meta = vm
        .region
        .metadata()
        .map_err(|e| format!("{}: fstat: {e}", found.region.display()))?;
    check_region_meta(&found.region, &meta, allowed).map_err(|e| e.to_string())?;
    check_vmm(vm.threads.tgid, allowed).map_err(|e| e.to_string())?;
    Ok(Box::new(vm))
}

/// Starts the discovery thread. Every `discovery_interval_ms` it finds the
/// VMs that exist now (configured ones and, with auto discovery, any
/// trusted VMM mapping a region file) and whether the host is overloaded,
/// and sends a [`Snapshot`]; in between it opens the VMs the event loop
/// asks for (`open`) and sends each back. Each message signals `wake`.
pub fn spawn(
    cfg: Resolved,
    socket_vms: SocketVms,
    tx: Sender<DiscoveryMsg>,
    open: Receiver<DiscoveryRequest>,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    let interval = Duration::from_millis(cfg.config.daemon.discovery_interval_ms);
    std::thread::Builder::new()
        .name("pvsched-discovery".into())
        .spawn(move || {
            let mut notes = Notes::default();
            let mut qmp_answers = QmpCache::default();
            let mut pressure = CpuPressure::open();
            // What the last snapshot sent said: an unchanged round sends
            // nothing (a wakeup of the event thread saved each second; it
            // retries unserved VMs of the last snapshot itself).
            let mut last_sent: Option<(Vec<Found>, bool)> = None;
            let mut next_round = Instant::now();
            // Extra rounds after a rescan request, soonest last.
            let mut follow_ups: Vec<Instant> = Vec::new();
            let handle = |req: DiscoveryRequest,
                          next_round: &mut Instant,
                          follow_ups: &mut Vec<Instant>,
                          qmp_answers: &mut QmpCache|
             -> Option<DiscoveryMsg> {
                match req {
                    DiscoveryRequest::Open(req) => Some(DiscoveryMsg::Opened {
                        name: req.found.name.clone(),
                        id: req.id,
                        result: open_vm(*req, &cfg.allowed),
                    }),
                    DiscoveryRequest::Rescan => {
                        qmp_answers.clear();
                        let now = Instant::now();
                        *next_round = now;
                        *follow_ups = RESCAN_FOLLOW_UPS.iter().rev().map(|d| now + *d).collect();
                        None
                    }
                }
            };
            while !stop.load(Ordering::Relaxed) {
                if follow_ups.last().is_some_and(|t| *t < next_round) {
                    next_round = follow_ups.pop().unwrap_or(next_round);
                }
                // Requests first: a round slowed by hostile QMP peers must
                // not starve them.
                let msg = if let Ok(req) = open.try_recv() {
                    match handle(req, &mut next_round, &mut follow_ups, &mut qmp_answers) {
                        Some(msg) => msg,
                        None => continue,
                    }
                } else if Instant::now() >= next_round {
                    next_round = Instant::now() + interval;
                    let found = discover_once(&cfg, &socket_vms, &mut notes, &mut qmp_answers);
                    let limit = cfg.config.daemon.overload_cpu_pressure_percent;
                    let overloaded = pressure
                        .some_avg10()
                        .is_some_and(|p| serving::overloaded(p, limit));
                    let round = (found, overloaded);
                    if last_sent.as_ref() == Some(&round) {
                        continue;
                    }
                    last_sent = Some(round.clone());
                    let (found, overloaded) = round;
                    DiscoveryMsg::Snapshot(Snapshot { found, overloaded })
                } else {
                    let left = next_round.saturating_duration_since(Instant::now());
                    match open.recv_timeout(left) {
                        Ok(req) => {
                            match handle(req, &mut next_round, &mut follow_ups, &mut qmp_answers) {
                                Some(msg) => msg,
                                None => continue,
                            }
                        }
                        Err(RecvTimeoutError::Timeout) => continue,
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                };
                if tx.send(msg).is_err() {
                    break;
                }
                let _ = wake.write(1);
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
        self.note_why(name, e, e.is_refusal(), configured);
    }

    fn note_why(&mut self, name: &str, e: &dyn std::fmt::Display, refusal: bool, configured: bool) {
        let msg = if configured {
            format!("not served yet: {e}")
        } else if refusal {
            format!("refused: {e}")
        } else {
            format!("not running: {e}")
        };
        self.seen.insert(name.to_string());
        if self.last.get(name) == Some(&msg) {
            return;
        }
        if configured || refusal {
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

fn discover_once(
    cfg: &Resolved,
    socket_vms: &SocketVms,
    notes: &mut Notes,
    qmp_answers: &mut QmpCache,
) -> Vec<Found> {
    let c = &cfg.config;
    let allowed = &cfg.allowed;
    let configured: Vec<&str> = c.vms.iter().map(|v| v.name.as_str()).collect();
    qmp_answers.retain(&configured);
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
            qmp_answers.threads(&vm.name, qmp, allowed, Instant::now(), || {
                Qmp::connect(qmp, QMP_TIMEOUT)
                    .map_err(DiscoveryError::from)
                    .and_then(|mut q| threads_by_qmp(&mut q, allowed))
            })
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
                region_from_server: false,
                threads,
            }),
            Err(e) => notes.note(&vm.name, &e, true),
        }
    }
    // VMs served through the ivshmem socket: their process is the
    // connection's peer, their region the server's; only the threads are
    // looked for (by name: QEMU's -name debug-threads=on).
    let served: Vec<(String, crate::ivshmem_server::SocketVm)> = socket_vms
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    for (name, vm) in served {
        match check_vmm(vm.pid, allowed).and_then(|()| threads_by_name(vm.pid)) {
            Ok(threads) => found.push(Found {
                name,
                cfg_index: None,
                region: vm.region,
                region_mode: 0o600,
                region_from_server: true,
                threads,
            }),
            Err(e) => notes.note(&name, &e, true),
        }
    }
    // libvirt's domains before auto discovery, which would otherwise find
    // the same region files by their prefix.
    if let (true, Some(qemu_uid)) = (c.libvirt.enabled, cfg.libvirt_uid) {
        for r in libvirt::discover(&c.libvirt, qemu_uid, allowed) {
            match r {
                Ok(f) if c.vms.iter().any(|v| v.name == f.name) => {
                    let e = format!("a [[vm]] entry has the name of libvirt domain {}", f.name);
                    notes.note_why(&f.name, &e, true, false);
                }
                Ok(f) => found.push(f),
                Err((name, e)) => notes.note_why(&name, &e, e.is_refusal(), false),
            }
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
                if found.iter().any(|f| f.region == region) {
                    continue;
                }
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
                            region_from_server: false,
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

/// /proc/pressure/cpu, kept open (None: the kernel has no PSI).
struct CpuPressure {
    file: Option<ProcFile>,
    text: String,
}

impl CpuPressure {
    fn open() -> Self {
        Self {
            file: ProcFile::open("/proc/pressure/cpu").ok(),
            text: String::new(),
        }
    }

    /// `some avg10`: % of the last 10 s in which some runnable task waited
    /// for a CPU.
    fn some_avg10(&mut self) -> Option<f64> {
        self.file.as_ref()?.read_into(&mut self.text).ok()?;
        some_avg10(&self.text)
    }
}

fn some_avg10(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("some"))?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix("avg10="))
        .and_then(|v| v.parse().ok())
}
