//! pvschedd as the ivshmem server of `ivshmem-doorbell` devices
//! (`[ivshmem_server]`): a QEMU that connects to its socket gets the VM's
//! region and the host vector's eventfd (`pvsched_base::ivshmem`), and is
//! served with the doorbell, with no region file to discover, no QMP and no
//! `--doorbell` argument.
//!
//! Whom it serves: the process at the other end of the connection
//! (`SO_PEERCRED`), if it runs (real and effective uid) as an allowed VMM user
//! and is not pvschedd; it is then held by a pidfd, and named by its own
//! `-name` (the VM's name; its vCPU threads are found by their names, which
//! needs `debug-threads=on`). One VM per process and per name; at most
//! `max_vms`. Anything else gets nothing: the connection is closed at once
//! and the refusal logged (at most [`REFUSALS_LOGGED`] per 10 s).
//!
//! Bounded: the server speaks first and all it sends (five 8-byte messages)
//! fits an empty socket buffer, so it never waits for a client: a client
//! that does not read, or reads slowly, costs nothing, and one whose buffer
//! would block is dropped. QEMU never writes to the socket: a client that
//! does is not QEMU, and is dropped after at most [`MAX_CLIENT_BYTES`].
//!
//! Lifetime: a VM is served through the socket until its process exits or
//! closes the connection; then its doorbell is dropped, its region and
//! record removed, and discovery drops the VM (its threads restored).
//!
//! Restarts: QEMU cannot reconnect to a new server, but it keeps the
//! eventfd. Each VM's record (`<dir>/<name>.peer`: pid, start time, the
//! eventfd's kernel id) lets the next pvschedd find the process again and take
//! a copy of that eventfd from it ([`recover`], `pidfd_getfd`, at start-up
//! while it still has CAP_SYS_PTRACE). A VM whose doorbell cannot be taken
//! back is served on the recheck timer, never without unboosts.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::eventfd::EventFd;
use pvsched_base::{ivshmem, process_fds, qmp::peer_cred, thread};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::config::{Allowed, Resolved};
use crate::discovery::{check_vmm, DiscoveryError, DiscoveryMsg};
use crate::doorbell::Doorbell;

/// Most bytes read from a client before it is dropped: QEMU sends none.
pub const MAX_CLIENT_BYTES: usize = 64;
/// Largest `/proc/PID/cmdline` read for the VM's name.
const MAX_CMDLINE_BYTES: u64 = 1 << 16;
/// Refusals logged per [`REFUSAL_WINDOW`]; the rest are counted.
pub const REFUSALS_LOGGED: u32 = 20;
const REFUSAL_WINDOW: Duration = Duration::from_secs(10);
/// How long the server thread sleeps in poll at most (it checks `stop`).
const POLL_MS: i32 = 500;
/// Longest VM name taken from `-name`.
const MAX_NAME: usize = 64;

/// The VMs served through the socket, by name, for the discovery thread.
pub type SocketVms = Arc<Mutex<BTreeMap<String, SocketVm>>>;

/// A VM served through the socket, as discovery needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketVm {
    /// The QEMU process.
    pub pid: i32,
    /// Its region (root's, in the server's directory).
    pub region: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("ivshmem server: {path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
}

/// Why a client got nothing.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("a [[vm]] entry has the name {0}")]
    ConfigName(String),
    #[error("{max} VMs are served through the socket already ([ivshmem_server] max_vms)")]
    Full { max: u32 },
    #[error("{0}")]
    Io(String),
    #[error("process {pid}: {msg}: start QEMU with -name NAME,debug-threads=on")]
    Name { pid: i32, msg: String },
    #[error("VM {name} is served already (process {pid})")]
    NameTaken { name: String, pid: i32 },
    #[error("no peer credentials: {0}")]
    PeerCred(io::Error),
    #[error("process {0} is served already")]
    SameProcess(i32),
    #[error("uid {0} is not one of [discovery] allowed_users")]
    User(u32),
    #[error(transparent)]
    Vmm(#[from] DiscoveryError),
}

/// What a restarted pvschedd needs to find a served VM again.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct PeerRecord {
    pid: i32,
    /// Field 22 of its stat: the pid is not mistaken for a later process.
    start_time: u64,
    /// The doorbell eventfd's kernel id (`None`: a kernel that shows none).
    eventfd_id: Option<u64>,
}

/// A VM served through the socket.
struct Peer {
    name: String,
    pid: i32,
    pidfd: OwnedFd,
    /// QEMU's connection; `None` for a VM taken over from an earlier pvschedd.
    conn: Option<UnixStream>,
    region: PathBuf,
    record: PathBuf,
}

/// The VMs an earlier pvschedd served through the socket and whose QEMU
/// still runs: [`recover`]'s result, for [`spawn`], and the doorbells taken
/// back, for the event loop.
pub struct Recovered {
    peers: Vec<Peer>,
    pub doorbells: Vec<Doorbell>,
}

/// The server's socket and directory, from the configuration.
fn paths(cfg: &Resolved) -> (PathBuf, PathBuf) {
    let c = &cfg.config;
    let control = &c.daemon.control_socket;
    (
        c.ivshmem_server.socket_path(control),
        c.ivshmem_server.dir_path(control),
    )
}

/// The socket pvschedd listens on, from the configuration.
pub fn socket_path(cfg: &Resolved) -> PathBuf {
    paths(cfg).0
}

/// The region size of every VM served through the socket: the largest a
/// guest may need, a power of two (QEMU takes the size from the fd).
fn region_size() -> u64 {
    pvsched_abi::bar_size(pvsched_abi::MAX_SLOTS)
}

/// Takes back, at start-up, the VMs an earlier pvschedd served through the
/// socket: each record whose process still runs (same start time, still an
/// allowed VMM) and whose region is still there; and its doorbell, copied
/// from QEMU by the eventfd's id (needs ptrace access to QEMU: run before
/// the capabilities are dropped). Records of processes that are gone are
/// removed with their regions.
pub fn recover(cfg: &Resolved) -> Recovered {
    let mut out = Recovered {
        peers: Vec::new(),
        doorbells: Vec::new(),
    };
    if !cfg.config.ivshmem_server.enabled {
        return out;
    }
    let (_, dir) = paths(cfg);
    let Ok(entries) = fs::read_dir(&dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".peer"))
            .filter(|n| valid_name(n))
            .map(str::to_string)
        else {
            continue;
        };
        let region = dir.join(format!("{name}.region"));
        match take_back(&name, &path, &region, &cfg.allowed) {
            Ok((peer, doorbell)) => {
                info!(
                    vm = %name,
                    pid = peer.pid,
                    doorbell = doorbell.is_some(),
                    "took back a VM served through the ivshmem socket before the restart"
                );
                if let Some(d) = doorbell {
                    out.doorbells.push(d);
                }
                out.peers.push(peer);
            }
            Err(why) => {
                info!(vm = %name, %why, "ivshmem peer record of an earlier pvschedd dropped");
                let _ = fs::remove_file(&region);
                let _ = fs::remove_file(&path);
            }
        }
    }
    out
}

/// One record of [`recover`]: the peer, and its doorbell if it could be
/// taken back (else the VM is served on the recheck timer).
fn take_back(
    name: &str,
    record: &Path,
    region: &Path,
    allowed: &Allowed,
) -> Result<(Peer, Option<Doorbell>), String> {
    let text = read_bounded(record, 4096).map_err(|e| e.to_string())?;
    let rec: PeerRecord = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    let alive = || thread::start_time(rec.pid, rec.pid).is_ok_and(|t| t == rec.start_time);
    if !alive() {
        return Err(format!("process {} is gone", rec.pid));
    }
    check_vmm(rec.pid, allowed).map_err(|e| e.to_string())?;
    if !region.is_file() {
        return Err(format!("{} is gone", region.display()));
    }
    let pidfd = process_fds::pidfd_open(rec.pid).map_err(|e| format!("pidfd_open: {e}"))?;
    // The pidfd names the process checked above, not a later one.
    if !alive() {
        return Err(format!("process {} is gone", rec.pid));
    }
    let doorbell = match rec
        .eventfd_id
        .ok_or_else(|| "this kernel shows no eventfd id".to_string())
        .and_then(|id| doorbell_of(rec.pid, id, pidfd.as_fd()))
    {
        Ok(fd) => Some(Doorbell {
            vm: name.to_string(),
            fd,
        }),
        Err(e) => {
            warn!(
                vm = %name,
                pid = rec.pid,
                error = %e,
                "the doorbell of a VM served before the restart cannot be taken back: its boosted \
                 vCPUs are re-read on the recheck timer"
            );
            None
        }
    };
    Ok((
        Peer {
            name: name.to_string(),
            pid: rec.pid,
            pidfd,
            conn: None,
            region: region.to_path_buf(),
            record: record.to_path_buf(),
        },
        doorbell,
    ))
}

/// Process `pid`'s copy of the eventfd whose kernel id is `id`,
/// non-blocking.
fn doorbell_of(pid: i32, id: u64, pidfd: std::os::fd::BorrowedFd<'_>) -> Result<OwnedFd, String> {
    let fd = process_fds::find_eventfd(pid, id)
        .map_err(|e| format!("/proc/{pid}/fdinfo: {e}"))?
        .ok_or_else(|| format!("process {pid} no longer holds eventfd {id}"))?;
    let copy = process_fds::copy_fd(pidfd, fd).map_err(|e| format!("pidfd_getfd: {e}"))?;
    ivshmem::set_nonblocking(copy.as_fd()).map_err(|e| e.to_string())?;
    Ok(copy)
}

/// Binds the socket (mode 0666: who may connect is decided per connection)
/// and starts the server thread with the VMs `recovered` from an earlier
/// pvschedd. Doorbells of new VMs go to the event loop as
/// [`DiscoveryMsg::Doorbell`] before the VM is listed in `vms` for
/// discovery, so it is opened with its doorbell; [`DiscoveryMsg::DoorbellGone`]
/// when it ends. Each message signals `wake`.
pub fn spawn(
    cfg: &Resolved,
    recovered: Vec<PeerHandoff>,
    vms: SocketVms,
    tx: Sender<DiscoveryMsg>,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
) -> Result<(), ServerError> {
    let (socket, dir) = paths(cfg);
    let io = |path: &Path, op| {
        let path = path.to_path_buf();
        move |source| ServerError::Io { path, op, source }
    };
    fs::create_dir_all(&dir).map_err(io(&dir, "mkdir"))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(io(&dir, "chmod"))?;
    // A socket left by an earlier pvschedd: QEMU does not reconnect, so no
    // one is served through it any more.
    let _ = fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).map_err(io(&socket, "bind"))?;
    fs::set_permissions(&socket, fs::Permissions::from_mode(0o666))
        .map_err(io(&socket, "chmod"))?;
    listener
        .set_nonblocking(true)
        .map_err(io(&socket, "set_nonblocking"))?;
    let mut server = Server {
        listener,
        dir,
        allowed: cfg.allowed.clone(),
        config_names: cfg.config.vms.iter().map(|v| v.name.clone()).collect(),
        max_vms: cfg.config.ivshmem_server.max_vms,
        peers: recovered.into_iter().map(|h| h.0).collect(),
        vms,
        tx,
        wake,
        refusals: RefusalLog::default(),
    };
    server.publish_recovered();
    info!(socket = %socket.display(), "ivshmem server listening");
    std::thread::Builder::new()
        .name("pvsched-ivshmem".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if server.serve_once().is_err() {
                    break;
                }
            }
        })
        .map_err(io(&socket, "spawn"))?;
    Ok(())
}

/// A recovered peer on its way from [`recover`] to [`spawn`].
pub struct PeerHandoff(Peer);

impl Recovered {
    /// Splits into the doorbells (for the event loop) and the peers (for
    /// [`spawn`]).
    pub fn split(self) -> (Vec<Doorbell>, Vec<PeerHandoff>) {
        (
            self.doorbells,
            self.peers.into_iter().map(PeerHandoff).collect(),
        )
    }
}

struct Server {
    listener: UnixListener,
    dir: PathBuf,
    allowed: Allowed,
    config_names: Vec<String>,
    max_vms: u32,
    peers: Vec<Peer>,
    vms: SocketVms,
    tx: Sender<DiscoveryMsg>,
    wake: Arc<EventFd>,
    refusals: RefusalLog,
}

/// The event loop is gone: the server stops.
struct Disconnected;

impl Server {
    /// Lists the recovered VMs for discovery (their doorbells went to the
    /// event loop at its start).
    fn publish_recovered(&mut self) {
        let mut vms = self.vms.lock().unwrap_or_else(|e| e.into_inner());
        for p in &self.peers {
            vms.insert(
                p.name.clone(),
                SocketVm {
                    pid: p.pid,
                    region: p.region.clone(),
                },
            );
        }
    }

    /// One poll: accepts new clients, ends the VMs whose process exited or
    /// whose connection closed or spoke.
    fn serve_once(&mut self) -> Result<(), Disconnected> {
        let mut fds = vec![libc::pollfd {
            fd: self.listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        for p in &self.peers {
            fds.push(libc::pollfd {
                fd: p.pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            fds.push(libc::pollfd {
                fd: p.conn.as_ref().map_or(-1, |c| c.as_raw_fd()),
                events: libc::POLLIN | libc::POLLRDHUP,
                revents: 0,
            });
        }
        // SAFETY: `fds` is a valid array of pollfds of that length; a
        // negative fd is ignored by poll.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, POLL_MS) };
        if n <= 0 {
            return Ok(());
        }
        let mut ended = Vec::new();
        for (i, p) in self.peers.iter_mut().enumerate() {
            let (exit, conn) = (fds[1 + 2 * i].revents, fds[2 + 2 * i].revents);
            if exit != 0 {
                ended.push((i, "its process exited".to_string()));
            } else if conn != 0 {
                if let Some(why) = p.conn.as_mut().and_then(client_spoke) {
                    ended.push((i, why));
                }
            }
        }
        for (i, why) in ended.into_iter().rev() {
            let p = self.peers.swap_remove(i);
            self.end(p, &why)?;
        }
        if fds[0].revents != 0 {
            self.accept_all()?;
        }
        Ok(())
    }

    fn accept_all(&mut self) -> Result<(), Disconnected> {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => self.admit(stream)?,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    warn!(error = %e, "ivshmem server: accept");
                    return Ok(());
                }
            }
        }
    }

    /// Serves a client that just connected, or refuses it (closes it, logs).
    fn admit(&mut self, stream: UnixStream) -> Result<(), Disconnected> {
        let (cred, served) = match peer_cred(&stream) {
            Ok(c) => (Some(c), self.serve_client(stream, c)),
            Err(e) => (None, Err(Refusal::PeerCred(e))),
        };
        match served {
            Ok((peer, doorbell)) => {
                info!(vm = %peer.name, pid = peer.pid, "served through the ivshmem socket");
                self.send(DiscoveryMsg::Doorbell(doorbell))?;
                self.vms.lock().unwrap_or_else(|e| e.into_inner()).insert(
                    peer.name.clone(),
                    SocketVm {
                        pid: peer.pid,
                        region: peer.region.clone(),
                    },
                );
                self.peers.push(peer);
            }
            Err(why) => self.refusals.note(cred, &why),
        }
        Ok(())
    }

    /// The checks and the handshake of [`Server::admit`], for the peer whose
    /// credentials are `cred`.
    fn serve_client(
        &mut self,
        stream: UnixStream,
        cred: pvsched_base::qmp::PeerCred,
    ) -> Result<(Peer, Doorbell), Refusal> {
        if !self.allowed.uids.contains(&cred.uid) {
            return Err(Refusal::User(cred.uid));
        }
        check_vmm(cred.pid, &self.allowed)?;
        if self.peers.iter().any(|p| p.pid == cred.pid) {
            return Err(Refusal::SameProcess(cred.pid));
        }
        if self.peers.len() >= self.max_vms as usize {
            return Err(Refusal::Full { max: self.max_vms });
        }
        let start_time = thread::start_time(cred.pid, cred.pid)
            .map_err(|e| Refusal::Io(format!("process {}: {e}", cred.pid)))?;
        let pidfd = process_fds::pidfd_open(cred.pid)
            .map_err(|e| Refusal::Io(format!("pidfd_open {}: {e}", cred.pid)))?;
        // Checked again on what the pidfd holds: the process checked above
        // has not been replaced under the same pid.
        check_vmm(cred.pid, &self.allowed)?;
        if !thread::start_time(cred.pid, cred.pid).is_ok_and(|t| t == start_time) {
            return Err(Refusal::Io(format!("process {} changed", cred.pid)));
        }
        let name = vm_name(cred.pid)?;
        if self.config_names.contains(&name) {
            return Err(Refusal::ConfigName(name));
        }
        if let Some(p) = self.peers.iter().find(|p| p.name == name) {
            return Err(Refusal::NameTaken { name, pid: p.pid });
        }
        let region = self.dir.join(format!("{name}.region"));
        let record = self.dir.join(format!("{name}.peer"));
        let io = |op: &str, path: &Path| {
            let msg = format!("{op} {}", path.display());
            move |e: io::Error| Refusal::Io(format!("{msg}: {e}"))
        };
        // No live peer has this name: what is there is an earlier VM's.
        let _ = fs::remove_file(&region);
        let _ = fs::remove_file(&record);
        let shm = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&region)
            .map_err(io("creating", &region))?;
        let served = (|| {
            shm.set_len(region_size()).map_err(io("sizing", &region))?;
            let eventfd = ivshmem::eventfd().map_err(io("eventfd for", &region))?;
            // Never wait for a client: all it is sent fits an empty buffer.
            stream
                .set_nonblocking(true)
                .map_err(io("set_nonblocking for", &region))?;
            ivshmem::serve_client(&stream, shm.as_fd(), &[eventfd.as_fd()])
                .map_err(|e| Refusal::Io(format!("sending the handshake: {e}")))?;
            let rec = PeerRecord {
                pid: cred.pid,
                start_time,
                eventfd_id: process_fds::eventfd_id(eventfd.as_fd()),
            };
            write_record(&record, &rec).map_err(io("writing", &record))?;
            Ok(eventfd)
        })();
        let eventfd = match served {
            Ok(e) => e,
            Err(e) => {
                let _ = fs::remove_file(&region);
                let _ = fs::remove_file(&record);
                return Err(e);
            }
        };
        Ok((
            Peer {
                name: name.clone(),
                pid: cred.pid,
                pidfd,
                conn: Some(stream),
                region,
                record,
            },
            Doorbell {
                vm: name,
                fd: eventfd,
            },
        ))
    }

    /// Ends a VM served through the socket: the event loop drops its
    /// doorbell, discovery stops listing it, its files go.
    fn end(&mut self, p: Peer, why: &str) -> Result<(), Disconnected> {
        info!(vm = %p.name, pid = p.pid, why, "no longer served through the ivshmem socket");
        self.vms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&p.name);
        let _ = fs::remove_file(&p.region);
        let _ = fs::remove_file(&p.record);
        self.send(DiscoveryMsg::DoorbellGone(p.name))
    }

    fn send(&self, msg: DiscoveryMsg) -> Result<(), Disconnected> {
        self.tx.send(msg).map_err(|_| Disconnected)?;
        let _ = self.wake.write(1);
        Ok(())
    }
}

/// Reads what a served client sent: `Some(why)` if the VM is to end (the
/// connection closed, or the client wrote: QEMU never does), `None` if
/// nothing is there after all.
fn client_spoke(conn: &mut UnixStream) -> Option<String> {
    let mut buf = [0u8; MAX_CLIENT_BYTES];
    match conn.read(&mut buf) {
        Ok(0) => Some("QEMU closed the connection".into()),
        Ok(n) => Some(format!(
            "the client sent {n} bytes (QEMU's ivshmem client sends none): not QEMU"
        )),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
        Err(e) if e.kind() == io::ErrorKind::Interrupted => None,
        Err(e) => Some(format!("connection error: {e}")),
    }
}

/// Logs refusals, at most [`REFUSALS_LOGGED`] per window: a disallowed
/// account connecting in a loop cannot flood the journal.
#[derive(Default)]
struct RefusalLog {
    window_start: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

impl RefusalLog {
    fn note(&mut self, cred: Option<pvsched_base::qmp::PeerCred>, why: &Refusal) {
        let now = Instant::now();
        if self
            .window_start
            .is_none_or(|t| now.duration_since(t) >= REFUSAL_WINDOW)
        {
            if self.suppressed > 0 {
                warn!(
                    count = self.suppressed,
                    "ivshmem server: further refusals not logged in the last window"
                );
            }
            self.window_start = Some(now);
            self.logged = 0;
            self.suppressed = 0;
        }
        if self.logged >= REFUSALS_LOGGED {
            self.suppressed += 1;
            return;
        }
        self.logged += 1;
        match cred {
            Some(c) => warn!(
                pid = c.pid,
                uid = c.uid,
                "ivshmem server: refused a client: {why}"
            ),
            None => warn!("ivshmem server: refused a client: {why}"),
        }
    }
}

/// The VM's name: QEMU's `-name` (`NAME`, `guest=NAME`, with options after
/// commas), if it is a plain name (it names files here).
fn vm_name(pid: i32) -> Result<String, Refusal> {
    let path = PathBuf::from(format!("/proc/{pid}/cmdline"));
    let bytes = read_bounded(&path, MAX_CMDLINE_BYTES).map_err(|e| Refusal::Name {
        pid,
        msg: format!("{}: {e}", path.display()),
    })?;
    name_from_cmdline(&bytes).map_err(|msg| Refusal::Name { pid, msg })
}

/// [`vm_name`] of a NUL-separated command line.
fn name_from_cmdline(cmdline: &[u8]) -> Result<String, String> {
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let value = args
        .iter()
        .position(|a| *a == b"-name" || *a == b"--name")
        .and_then(|i| args.get(i + 1))
        .ok_or("no -name")?;
    let value = std::str::from_utf8(value).map_err(|_| "-name is not UTF-8".to_string())?;
    let parts: Vec<&str> = value.split(',').collect();
    let name = parts
        .iter()
        .find_map(|p| p.strip_prefix("guest="))
        .or_else(|| parts.first().filter(|p| !p.contains('=')).copied())
        .ok_or_else(|| format!("-name {value:?} names no guest"))?;
    if !valid_name(name) {
        return Err(format!(
            "-name {name:?}: a VM served through the socket needs a name of 1 to {MAX_NAME} \
             letters, digits, '.', '_', '+' or '-', not starting with '.'"
        ));
    }
    Ok(name.to_string())
}

fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'+' | b'-'))
}

/// At most `max` bytes of `path`.
fn read_bounded(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    fs::File::open(path)?.take(max).read_to_end(&mut out)?;
    Ok(out)
}

/// Writes a peer record whole (a new file renamed over the old).
fn write_record(path: &Path, rec: &PeerRecord) -> io::Result<()> {
    let tmp = path.with_extension("peer.new");
    let text = serde_json::to_vec(rec).map_err(io::Error::other)?;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    f.write_all(&text)?;
    f.sync_all()?;
    fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmdline(args: &[&str]) -> Vec<u8> {
        let mut v = Vec::new();
        for a in args {
            v.extend_from_slice(a.as_bytes());
            v.push(0);
        }
        v
    }

    #[test]
    fn the_vm_is_named_by_qemus_name_option_in_every_form() {
        let plain = cmdline(&["qemu", "-name", "vm1,debug-threads=on"]);
        let guest = cmdline(&["qemu", "-m", "1G", "-name", "guest=dom-2,debug-threads=on"]);
        let opt_first = cmdline(&["qemu", "-name", "debug-threads=on,guest=x.y"]);

        assert_eq!(name_from_cmdline(&plain).unwrap(), "vm1");
        assert_eq!(name_from_cmdline(&guest).unwrap(), "dom-2");
        assert_eq!(name_from_cmdline(&opt_first).unwrap(), "x.y");
    }

    #[test]
    fn a_name_that_is_missing_or_not_a_plain_file_name_is_refused() {
        for bad in [
            cmdline(&["qemu", "-m", "1G"]),
            cmdline(&["qemu", "-name"]),
            cmdline(&["qemu", "-name", "../etc"]),
            cmdline(&["qemu", "-name", ".hidden"]),
            cmdline(&["qemu", "-name", "debug-threads=on"]),
            cmdline(&["qemu", "-name", &"x".repeat(MAX_NAME + 1)]),
            cmdline(&["qemu", "-name", "a b"]),
        ] {
            assert!(name_from_cmdline(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_peer_record_reads_back_what_was_written() {
        let dir = std::env::temp_dir().join(format!("pvsched-peer-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vm.peer");
        let rec = PeerRecord {
            pid: 7,
            start_time: 99,
            eventfd_id: Some(3),
        };

        write_record(&path, &rec).unwrap();
        let back: PeerRecord = serde_json::from_slice(&read_bounded(&path, 4096).unwrap()).unwrap();

        assert_eq!(back, rec);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_region_served_is_a_power_of_two_the_region_file_rules_accept() {
        let size = region_size();
        assert!(size.is_power_of_two());
        assert!(size <= pvsched_base::region_file::MAX_FILE_SIZE);
        assert!(size >= pvsched_abi::bar_size(1));
    }
}
