//! A QEMU guest with a pvsched region, driven over its serial console.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pvsched_abi::{Header, Region};
use pvsched_base::ivshmem;
use pvsched_base::qmp::Qmp;
use pvsched_base::region_file::RegionFile;
use pvsched_base::thread::threads_of;
use pvsched_base::vcpu_names::{vcpu_index_from_name, Accel as VcpuAccel};

use crate::error::{io_err, path_ctx, Error, Result};
use crate::image::{which, GuestImage, GUEST_MODULE_PATH, INSTALL_HINT};
use crate::lost::{stall_report, NO_END_MARKER};
use crate::spawn::spawn_tied;

/// Kernel command line before [`VmConfig::append`]. `no_timer_check`: on a
/// heavily loaded host the IO-APIC timer check at boot can fail under TCG and
/// panic the guest ("IO-APIC + timer doesn't work!"); seen at load 25 on 2 cores.
/// `nokaslr`: a stalled guest's instruction pointers are then named from the
/// kernel's `System.map` (`lost`).
pub const BASE_APPEND: &str = "console=ttyS1 panic=-1 quiet no_timer_check nokaslr";

/// Printed by the guest's init, followed by `<nproc> <uname -r>`, once it
/// serves commands ([`crate::image::LOOP`]).
pub const READY: &str = "__PVS_READY__";
/// Longest command line the console accepts (the tty line buffer is 4 KiB).
pub const MAX_COMMAND_LEN: usize = 3500;
/// Extra time the host waits beyond a command's own timeout (TCG is slow).
const GRACE: Duration = Duration::from_secs(30);
/// Console silence after which [`Vm::exec`] sends XON (see `kick_console`).
const KICK_AFTER: Duration = Duration::from_secs(2);
/// Bound on one [`Vm::qmp`] exchange (connect and negotiation, then the command).
const QMP_TIMEOUT: Duration = Duration::from_secs(20);

/// How QEMU runs the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    /// `-accel tcg -cpu max`: works everywhere, the default.
    Tcg,
    /// `-accel kvm -cpu host`: for hosts with working KVM (not this CI's).
    Kvm,
}

/// The shared region given to the guest as ivshmem-plain BAR2.
#[derive(Clone, Debug)]
pub enum RegionSetup {
    /// No ivshmem device.
    None,
    /// A fresh region file in the VM's directory, initialised as the host
    /// daemon would (`Region::init_header`).
    Fresh { slot_count: u32, host_features: u64 },
    /// A region file whose host line is `header`, written raw (bad magic,
    /// other majors, bad geometry...); the rest is zero.
    RawHeader { slot_count: u32, header: Header },
    /// An existing file (e.g. one pvschedd created), sized for the VM's vCPUs
    /// (`smp`); never removed by the VM.
    Existing(PathBuf),
    /// An `ivshmem-doorbell` device whose region and doorbell come from the
    /// ivshmem server at this socket (pvschedd's): nothing local.
    IvshmemServer(PathBuf),
}

/// Everything [`Vm::boot`] needs.
#[derive(Clone, Debug)]
pub struct VmConfig {
    /// Guest name (`-name`, thread names); made unique per VM.
    pub name: String,
    pub image: GuestImage,
    pub smp: u32,
    pub memory_mb: u32,
    pub accel: Accel,
    pub region: RegionSetup,
    /// Mode of a region file the VM creates.
    pub region_mode: u32,
    pub boot_timeout: Duration,
    /// Appended to [`BASE_APPEND`].
    pub append: String,
    /// Further QEMU arguments.
    pub extra_args: Vec<String>,
    /// The QEMU binary; default `qemu-system-x86_64` from `$PATH`.
    pub qemu: Option<PathBuf>,
    /// Give the region as `ivshmem-doorbell` instead of `ivshmem-plain`: the
    /// VM serves the ivshmem protocol to QEMU itself (region fd, and the
    /// host vector's eventfd, [`Vm::doorbell`], which the guest rings).
    pub doorbell: bool,
    /// Host CPUs QEMU (every thread of it) may run on. `None` (the default):
    /// wherever the caller may, except that inside a KVM host VM a guest of
    /// more than one vCPU is confined to the CPUs it gives guests
    /// ([`host_vm_guest_cpus`]; one vCPU cannot run on two CPUs at once).
    pub host_cpus: Option<Vec<u32>>,
}

/// Set by the KVM host VM's init (`pvsched-hostvm`): the host VM CPUs its KVM
/// guests run on, comma-separated.
pub const HOST_VM_GUEST_CPUS_ENV: &str = "PVSCHED_HOSTVM_GUEST_CPUS";

/// Inside a KVM host VM, the CPUs guests are confined to
/// ([`HOST_VM_GUEST_CPUS_ENV`]): its emulated SVM loses guests whose vCPUs
/// run on two of its CPUs at once (`crates/hostvm/README.md`).
pub fn host_vm_guest_cpus() -> Option<Vec<u32>> {
    std::env::var_os(crate::image::IN_HOST_VM_ENV)?;
    let v = std::env::var(HOST_VM_GUEST_CPUS_ENV).ok()?;
    let cpus: Vec<u32> = v.split(',').filter_map(|c| c.trim().parse().ok()).collect();
    (!cpus.is_empty()).then_some(cpus)
}

/// What a fresh region offers a VM without a doorbell server, as pvschedd
/// does: every feature but `F_DOORBELL`. A guest offered a doorbell on an
/// `ivshmem-plain` device rings its register for nothing, and under KVM in
/// the host VM such a write (an MMIO exit KVM emulates) stopped the guest
/// with a KVM internal error (benchmarks/LOG.md, "A doorbell rung into an
/// `ivshmem-plain` device").
pub const OFFERED_WITHOUT_DOORBELL: u64 = pvsched_abi::F_ALL & !pvsched_abi::F_DOORBELL;

impl VmConfig {
    /// Two vCPUs, 512 MiB, TCG, a fresh region with one slot per vCPU and
    /// every feature offered but the doorbell ([`VmConfig::doorbell`] adds it).
    pub fn new(image: GuestImage) -> Self {
        Self {
            name: "pvs".into(),
            image,
            smp: 2,
            memory_mb: 512,
            accel: Accel::Tcg,
            region: RegionSetup::Fresh {
                slot_count: 2,
                host_features: OFFERED_WITHOUT_DOORBELL,
            },
            region_mode: 0o600,
            boot_timeout: Duration::from_secs(180),
            append: String::new(),
            extra_args: Vec::new(),
            qemu: None,
            doorbell: false,
            host_cpus: None,
        }
    }

    /// Confines QEMU to these host CPUs (see [`VmConfig::host_cpus`]).
    pub fn host_cpus(mut self, cpus: Option<Vec<u32>>) -> Self {
        self.host_cpus = cpus;
        self
    }

    /// The region as `ivshmem-doorbell` (see [`VmConfig::doorbell`]); a
    /// `Fresh` region offers `F_DOORBELL` then, and only then.
    pub fn doorbell(mut self, on: bool) -> Self {
        self.doorbell = on;
        if let RegionSetup::Fresh { host_features, .. } = &mut self.region {
            if on {
                *host_features |= pvsched_abi::F_DOORBELL;
            } else {
                *host_features &= !pvsched_abi::F_DOORBELL;
            }
        }
        self
    }

    /// The features a `Fresh` region offers (for a test of what the guest
    /// does with an offer pvschedd would not make).
    pub fn offer(mut self, features: u64) -> Self {
        if let RegionSetup::Fresh { host_features, .. } = &mut self.region {
            *host_features = features;
        }
        self
    }

    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// Sets the vCPU count (and the slot count of a `Fresh` region to match).
    pub fn smp(mut self, smp: u32) -> Self {
        self.smp = smp;
        if let RegionSetup::Fresh { slot_count, .. } = &mut self.region {
            *slot_count = smp;
        }
        self
    }

    pub fn memory_mb(mut self, mb: u32) -> Self {
        self.memory_mb = mb;
        self
    }

    pub fn accel(mut self, accel: Accel) -> Self {
        self.accel = accel;
        self
    }

    pub fn region(mut self, region: RegionSetup) -> Self {
        self.region = region;
        self
    }

    pub fn boot_timeout(mut self, timeout: Duration) -> Self {
        self.boot_timeout = timeout;
        self
    }

    pub fn append(mut self, args: &str) -> Self {
        self.append = args.to_string();
        self
    }

    pub fn extra_args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.extra_args.extend(args.into_iter().map(Into::into));
        self
    }
}

/// A process started in the guest with [`Vm::spawn`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestProcess {
    pub pid: u32,
    /// Guest file with its stdout and stderr.
    pub log: String,
}

#[derive(Default)]
struct ConsoleBuf {
    data: Vec<u8>,
    eof: bool,
}

struct Console {
    buf: Mutex<ConsoleBuf>,
    cond: Condvar,
}

impl Console {
    fn tail(&self, bytes: usize) -> String {
        let buf = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        let start = buf.data.len().saturating_sub(bytes);
        String::from_utf8_lossy(&buf.data[start..]).replace('\r', "")
    }
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if from >= hay.len() || needle.is_empty() {
        return None;
    }
    hay[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// Finds a command's end line in a console buffer that grows between calls,
/// without searching the whole buffer again each time.
struct EndLineScan<'a> {
    marker: &'a [u8],
    /// Where the next search starts, less an overlap for a marker cut in two.
    scanned: usize,
}

impl<'a> EndLineScan<'a> {
    fn new(marker: &'a [u8]) -> Self {
        EndLineScan { marker, scanned: 0 }
    }

    /// The marker's offset and the offset of the newline ending its line,
    /// once both are in `data`.
    fn poll(&mut self, data: &[u8]) -> Option<(usize, usize)> {
        let from = self.scanned.saturating_sub(self.marker.len() + 8);
        match find(data, self.marker, from) {
            Some(at) => match find(data, b"\n", at + self.marker.len()) {
                Some(nl) => Some((at, nl)),
                None => {
                    // The line came in part: search again from the marker,
                    // as the rest may be longer than the overlap.
                    self.scanned = at;
                    None
                }
            },
            None => {
                self.scanned = data.len();
                None
            }
        }
    }
}

/// The last `bytes` (or fewer) of `text`, cut at a character boundary.
fn tail_of(text: &str, bytes: usize) -> &str {
    let mut start = text.len().saturating_sub(bytes);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

static VM_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The ivshmem server of one `ivshmem-doorbell` VM: answers QEMU's one
/// connection (`pvsched_base::ivshmem::serve_client`) on a thread, since
/// QEMU waits for it while it starts.
struct DoorbellServer {
    socket: PathBuf,
    eventfd: OwnedFd,
    thread: JoinHandle<std::io::Result<UnixStream>>,
}

impl DoorbellServer {
    fn start(dir: &Path, region: &Path, timeout: Duration) -> Result<Self> {
        let socket = dir.join("doorbell.sock");
        let listener = UnixListener::bind(&socket).map_err(io_err(path_ctx("binding", &socket)))?;
        listener
            .set_nonblocking(true)
            .map_err(io_err("doorbell socket"))?;
        let shm = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(region)
            .map_err(io_err(path_ctx("opening", region)))?;
        let eventfd = ivshmem::eventfd().map_err(io_err("doorbell eventfd"))?;
        let host = eventfd.try_clone().map_err(io_err("doorbell eventfd"))?;
        let deadline = Instant::now() + timeout;
        let thread = std::thread::Builder::new()
            .name("vmtest-ivshmem".into())
            .spawn(move || loop {
                match listener.accept() {
                    Ok((conn, _)) => {
                        conn.set_nonblocking(false)?;
                        ivshmem::serve_client(&conn, shm.as_fd(), &[host.as_fd()])?;
                        return Ok(conn);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() >= deadline {
                            return Err(std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                "QEMU never connected to the ivshmem server",
                            ));
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => return Err(e),
                }
            })
            .map_err(io_err("starting the ivshmem server"))?;
        Ok(Self {
            socket,
            eventfd,
            thread,
        })
    }

    /// The eventfd and QEMU's connection, once served.
    fn connected(self) -> Result<(OwnedFd, UnixStream)> {
        let conn = self
            .thread
            .join()
            .map_err(|_| Error::Io {
                context: "ivshmem server".into(),
                source: std::io::Error::other("the server thread panicked"),
            })?
            .map_err(io_err("serving the ivshmem protocol to QEMU"))?;
        Ok((self.eventfd, conn))
    }
}

/// A running guest. Dropping it kills QEMU (by its PID) and removes the VM's
/// temporary directory (set `PVSCHED_VMTEST_KEEP=1` to keep it for a look).
pub struct Vm {
    name: String,
    dir: PathBuf,
    child: Mutex<Child>,
    pid: u32,
    stdin: Mutex<ChildStdin>,
    console: Arc<Console>,
    reader: Option<JoinHandle<()>>,
    next_id: AtomicU64,
    kicks: AtomicU64,
    /// Serializes commands: one in flight on the console at a time.
    exec_lock: Mutex<()>,
    region: Option<RegionFile>,
    region_path: Option<PathBuf>,
    /// The host vector's eventfd of an `ivshmem-doorbell` region, and the
    /// server connection QEMU holds (kept open while it runs).
    doorbell: Option<OwnedFd>,
    doorbell_conn: Option<UnixStream>,
    qmp_path: PathBuf,
    nr_cpus: u32,
    kernel_release: String,
}

impl std::fmt::Debug for Vm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vm")
            .field("name", &self.name)
            .field("pid", &self.pid)
            .field("dir", &self.dir)
            .finish()
    }
}

fn unique_dir(name: &str) -> Result<(PathBuf, u64)> {
    let n = VM_COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "pvsched-vmtest-{name}-{}-{n}-{:x}",
        std::process::id(),
        nanos & 0xffff_ffff
    ));
    fs::create_dir(&dir).map_err(io_err(path_ctx("creating", &dir)))?;
    Ok((dir, n))
}

fn prepare_region(
    setup: &RegionSetup,
    dir: &Path,
    mode: u32,
    smp: u32,
) -> Result<Option<(PathBuf, RegionFile)>> {
    match setup {
        RegionSetup::None | RegionSetup::IvshmemServer(_) => Ok(None),
        RegionSetup::Fresh {
            slot_count,
            host_features,
        } => {
            let path = dir.join("region");
            let mut file = RegionFile::create(&path, *slot_count, mode)?;
            file.region_mut().init_header(*slot_count, *host_features)?;
            Ok(Some((path, file)))
        }
        RegionSetup::RawHeader { slot_count, header } => {
            let path = dir.join("region");
            let file = RegionFile::create(&path, *slot_count, mode)?;
            file.region().write_header(header);
            Ok(Some((path, file)))
        }
        RegionSetup::Existing(path) => {
            let file = RegionFile::open(path, smp)?;
            Ok(Some((path.clone(), file)))
        }
    }
}

impl Vm {
    /// Starts QEMU and waits until the guest serves commands.
    pub fn boot(cfg: VmConfig) -> Result<Self> {
        let qemu = match &cfg.qemu {
            Some(q) => q.clone(),
            None => which("qemu-system-x86_64").ok_or_else(|| Error::Missing {
                what: "qemu-system-x86_64".into(),
                hint: INSTALL_HINT.into(),
            })?,
        };
        let (dir, n) = unique_dir(&cfg.name)?;
        let name = format!("{}-{}-{n}", cfg.name, std::process::id());
        let region = match prepare_region(&cfg.region, &dir, cfg.region_mode, cfg.smp) {
            Ok(r) => r,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let qmp_path = dir.join("qmp.sock");
        let stderr_path = dir.join("qemu.stderr");
        let stderr =
            File::create(&stderr_path).map_err(io_err(path_ctx("creating", &stderr_path)))?;

        let mut cmd = Command::new(&qemu);
        match cfg.accel {
            Accel::Tcg => cmd.args(["-accel", "tcg", "-cpu", "max"]),
            Accel::Kvm => cmd.args(["-accel", "kvm", "-cpu", "host"]),
        };
        cmd.arg("-smp")
            .arg(cfg.smp.to_string())
            .arg("-m")
            .arg(cfg.memory_mb.to_string())
            .args(["-nographic", "-no-reboot", "-nic", "none"])
            // ttyS0: the command channel (stdio); ttyS1: the kernel console,
            // into a host file that survives a hung or crashed guest.
            .args(["-serial", "mon:stdio", "-serial"])
            .arg(format!("file:{}", dir.join("kernel.log").display()))
            .arg("-name")
            .arg(format!("{name},debug-threads=on"))
            .arg("-kernel")
            .arg(&cfg.image.kernel)
            .arg("-initrd")
            .arg(&cfg.image.initramfs)
            .arg("-append")
            .arg(format!("{BASE_APPEND} {}", cfg.append).trim_end())
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp_path.display()));
        let mut doorbell = None;
        if let RegionSetup::IvshmemServer(socket) = &cfg.region {
            cmd.arg("-chardev")
                .arg(format!("socket,id=pvsdb,path={}", socket.display()))
                .args(["-device", "ivshmem-doorbell,chardev=pvsdb,vectors=1"]);
        }
        match &region {
            Some((path, _)) if cfg.doorbell => {
                let server = match DoorbellServer::start(&dir, path, cfg.boot_timeout) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = fs::remove_dir_all(&dir);
                        return Err(e);
                    }
                };
                cmd.arg("-chardev")
                    .arg(format!("socket,id=pvsdb,path={}", server.socket.display()))
                    .args(["-device", "ivshmem-doorbell,chardev=pvsdb,vectors=1"]);
                doorbell = Some(server);
            }
            Some((path, file)) => {
                cmd.arg("-object")
                    .arg(format!(
                        "memory-backend-file,id=pvs,share=on,mem-path={},size={}",
                        path.display(),
                        file.len()
                    ))
                    .args(["-device", "ivshmem-plain,memdev=pvs"]);
            }
            None => {}
        }
        let confined = cfg.host_cpus.clone().or_else(|| {
            if cfg.smp > 1 {
                host_vm_guest_cpus()
            } else {
                None
            }
        });
        if let Some(cpus) = confined {
            // SAFETY: the closure runs between fork and exec and makes one
            // async-signal-safe system call.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    pvsched_base::sched::set_own_affinity(&cpus)
                });
            }
        }
        cmd.args(&cfg.extra_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr));
        fs::write(dir.join("qemu.cmdline"), format!("{cmd:?}\n"))
            .map_err(io_err("writing qemu.cmdline"))?;

        let log_path = dir.join("console.log");
        let mut log = File::create(&log_path).map_err(io_err(path_ctx("creating", &log_path)))?;
        let mut child = match spawn_tied(cmd) {
            Ok(c) => c,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(Error::Io {
                    context: format!("starting {}", qemu.display()),
                    source: e,
                });
            }
        };
        let pid = child.id();
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = child.stdout.take().expect("piped stdout");
        let console = Arc::new(Console {
            buf: Mutex::new(ConsoleBuf::default()),
            cond: Condvar::new(),
        });
        let c2 = Arc::clone(&console);
        let reader = std::thread::Builder::new()
            .name(format!("vmtest-console-{name}"))
            .spawn(move || {
                let mut chunk = [0u8; 8192];
                loop {
                    let n = match stdout.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    let _ = log.write_all(&chunk[..n]);
                    let mut buf = c2.buf.lock().unwrap_or_else(|e| e.into_inner());
                    buf.data.extend_from_slice(&chunk[..n]);
                    c2.cond.notify_all();
                }
                let mut buf = c2.buf.lock().unwrap_or_else(|e| e.into_inner());
                buf.eof = true;
                c2.cond.notify_all();
            })
            .map_err(io_err("starting the console reader"));
        let reader = match reader {
            Ok(r) => r,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = fs::remove_dir_all(&dir);
                return Err(e);
            }
        };

        let (region_path, region) = match region {
            Some((p, f)) => (Some(p), Some(f)),
            None => (None, None),
        };
        // QEMU connected while it created the device, before the guest booted.
        let (doorbell, doorbell_conn) = match doorbell {
            Some(server) => match server.connected() {
                Ok((fd, conn)) => (Some(fd), Some(conn)),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let _ = fs::remove_dir_all(&dir);
                    return Err(e);
                }
            },
            None => (None, None),
        };
        let mut vm = Vm {
            name,
            dir,
            child: Mutex::new(child),
            pid,
            stdin: Mutex::new(stdin),
            console,
            reader: Some(reader),
            next_id: AtomicU64::new(1),
            kicks: AtomicU64::new(0),
            exec_lock: Mutex::new(()),
            region,
            region_path,
            doorbell,
            doorbell_conn,
            qmp_path,
            nr_cpus: 0,
            kernel_release: String::new(),
        };
        let line = vm.wait_ready(cfg.boot_timeout)?;
        let mut words = line.split_whitespace().skip(1);
        vm.nr_cpus = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
        vm.kernel_release = words.next().unwrap_or("").to_string();
        Ok(vm)
    }

    /// Waits for the ready line and returns it; drops the console up to it.
    fn wait_ready(&self, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        let mut buf = self.console.buf.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(at) = find(&buf.data, READY.as_bytes(), 0) {
                if let Some(nl) = find(&buf.data, b"\n", at) {
                    let line = String::from_utf8_lossy(&buf.data[at..nl])
                        .trim()
                        .to_string();
                    buf.data.drain(..=nl);
                    return Ok(line);
                }
            }
            if buf.eof {
                drop(buf);
                return Err(self.exited_error());
            }
            let now = Instant::now();
            if now >= deadline {
                drop(buf);
                return Err(Error::BootTimeout {
                    vm: self.name.clone(),
                    timeout,
                    console: self.console.tail(4000),
                });
            }
            buf = self
                .console
                .cond
                .wait_timeout(buf, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn exited_error(&self) -> Error {
        let status = {
            let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
            // The console closed: QEMU is exiting; give it a moment.
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                match child.try_wait() {
                    Ok(Some(s)) => break s.to_string(),
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Ok(None) => break "still running, console closed".to_string(),
                    Err(e) => break format!("unknown: {e}"),
                }
            }
        };
        Error::QemuExited {
            vm: self.name.clone(),
            status,
            stderr: fs::read_to_string(self.dir.join("qemu.stderr")).unwrap_or_default(),
            console: format!(
                "{}\nkernel log tail:\n{}",
                self.console.tail(4000),
                tail_of(&self.kernel_log(), 3000)
            ),
        }
    }

    /// Runs `cmd` with `/bin/sh -c` in the guest; returns its exit status and
    /// its output (stdout and stderr). The guest kills it after `timeout`
    /// (rounded up to whole seconds), which returns [`Error::CommandTimeout`].
    /// One line of printable ASCII, at most [`MAX_COMMAND_LEN`] bytes.
    pub fn exec(&self, cmd: &str, timeout: Duration) -> Result<(i32, String)> {
        self.exec_started_within(cmd, timeout, None)
    }

    /// Like [`Vm::exec`], but a guest that has not started the command
    /// (printed its begin marker) within `must_start` is not answering:
    /// [`Error::CommandNotStarted`], not a wait for the whole `timeout`. For
    /// long commands in a guest that may hang (the KVM host VM).
    pub fn exec_started_within(
        &self,
        cmd: &str,
        timeout: Duration,
        must_start: Option<Duration>,
    ) -> Result<(i32, String)> {
        if let Some(c) = cmd.chars().find(|c| c.is_control() && *c != '\t') {
            return Err(Error::BadCommand {
                command: cmd.to_string(),
                reason: format!("control character {c:?}"),
            });
        }
        if cmd.len() > MAX_COMMAND_LEN || cmd.trim().is_empty() {
            return Err(Error::BadCommand {
                command: cmd.to_string(),
                reason: format!("empty or longer than {MAX_COMMAND_LEN} bytes"),
            });
        }
        let _serial = self.exec_lock.lock().unwrap_or_else(|e| e.into_inner());
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let secs = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
        let secs = secs.max(1);
        let begin = format!("__PVS_BEGIN_{id}__ ");
        let end = format!("\n__PVS_END_{id}__ ");
        let start = Instant::now();
        {
            let mut stdin = self.stdin.lock().unwrap_or_else(|e| e.into_inner());
            stdin
                .write_all(format!("{id} {secs} {cmd}\n").as_bytes())
                .and_then(|_| stdin.flush())
                .map_err(|_| self.exited_error())?;
        }
        let deadline = start + Duration::from_secs(secs) + GRACE;
        let mut buf = self.console.buf.lock().unwrap_or_else(|e| e.into_inner());
        let mut scan = EndLineScan::new(end.as_bytes());
        let (mut seen_len, mut seen_at) = (buf.data.len(), Instant::now());
        loop {
            if let Some((e, nl)) = scan.poll(&buf.data) {
                // Begin line: "<marker> <uptime>"; end line: "<marker> <rc> <uptime>".
                let text =
                    |a: usize, b: usize| String::from_utf8_lossy(&buf.data[a..b]).replace('\r', "");
                let end_fields = text(e + end.len(), nl);
                let mut end_fields = end_fields.split_whitespace();
                let rc_text = end_fields.next().unwrap_or("").to_string();
                let end_up = end_fields.next().unwrap_or("?").to_string();
                let (out_start, begin_up) = match find(&buf.data[..e], begin.as_bytes(), 0) {
                    Some(b) => {
                        let line_end = find(&buf.data[..e + 1], b"\n", b).unwrap_or(e);
                        (
                            line_end + 1,
                            text(b + begin.len(), line_end).trim().to_string(),
                        )
                    }
                    None => (0, "?".to_string()),
                };
                let output = text(out_start.min(e), e);
                buf.data.drain(..=nl);
                drop(buf);
                let rc: i32 = rc_text.parse().map_err(|_| {
                    Error::Other(format!(
                        "VM {}: bad exit status {rc_text:?} for {cmd}",
                        self.name
                    ))
                })?;
                if rc == 137 && start.elapsed() >= Duration::from_secs(secs) {
                    return Err(Error::CommandTimeout {
                        vm: self.name.clone(),
                        command: cmd.to_string(),
                        timeout,
                        answered: true,
                        console: format!(
                            "{output}[killed in the guest; guest uptime {begin_up} -> {end_up}, \
                             host wait {:?}]",
                            start.elapsed()
                        ),
                    });
                }
                return Ok((rc, output));
            }
            if buf.eof {
                drop(buf);
                return Err(self.exited_error());
            }
            let now = Instant::now();
            if let Some(start_within) = must_start {
                if now.duration_since(start) >= start_within
                    && find(&buf.data, begin.as_bytes(), 0).is_none()
                {
                    drop(buf);
                    return Err(Error::CommandNotStarted {
                        vm: self.name.clone(),
                        command: cmd.to_string(),
                        within: start_within,
                        console: self.console.tail(2000),
                    });
                }
            }
            if now >= deadline {
                drop(buf);
                return Err(Error::CommandTimeout {
                    vm: self.name.clone(),
                    command: cmd.to_string(),
                    timeout,
                    answered: false,
                    console: format!(
                        "{}{NO_END_MARKER} {} console kicks so far]\n{}kernel log tail:\n{}",
                        self.console.tail(4000),
                        self.kicks.load(Ordering::Relaxed),
                        stall_report(self),
                        tail_of(&self.kernel_log(), 3000)
                    ),
                });
            }
            if buf.data.len() != seen_len {
                (seen_len, seen_at) = (buf.data.len(), now);
            } else if now.duration_since(seen_at) >= KICK_AFTER {
                drop(buf);
                if std::env::var_os("PVSCHED_VMTEST_DEBUG").is_some() {
                    eprintln!(
                        "pvsched-vmtest: VM {}: console silent {:?} into `{cmd}`: XON",
                        self.name,
                        start.elapsed()
                    );
                }
                self.kick_console();
                seen_at = Instant::now();
                buf = self.console.buf.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let wait = (deadline - now).min(KICK_AFTER);
            buf = self
                .console
                .cond
                .wait_timeout(buf, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sends XON (^Q) to the guest's console. The guest's tty swallows it (and
    /// restarts output if something had stopped it); the receive interrupt
    /// also makes the 8250 driver look at its transmitter. Under TCG on a busy
    /// host the guest's serial output was seen to stall now and then with
    /// bytes pending, until the next byte came in: a silent console while a
    /// command runs gets one of these every couple of seconds.
    fn kick_console(&self) {
        self.kicks.fetch_add(1, Ordering::Relaxed);
        let mut stdin = self.stdin.lock().unwrap_or_else(|e| e.into_inner());
        let _ = stdin.write_all(&[0x11]).and_then(|_| stdin.flush());
    }

    /// XON bytes sent so far to restart a silent console.
    pub fn console_kicks(&self) -> u64 {
        self.kicks.load(Ordering::Relaxed)
    }

    /// Like [`Vm::exec`], but a non-zero exit status is an error too.
    pub fn exec_ok(&self, cmd: &str, timeout: Duration) -> Result<String> {
        let (rc, out) = self.exec(cmd, timeout)?;
        if rc != 0 {
            return Err(Error::Command {
                command: format!("(guest {}) {cmd}", self.name),
                status: format!("exit status {rc}"),
                output: out,
            });
        }
        Ok(out)
    }

    /// Starts `cmd` in the background in the guest (output to a log file in
    /// the guest's /tmp) and returns its PID.
    pub fn spawn(&self, cmd: &str) -> Result<GuestProcess> {
        let n = self.next_id.load(Ordering::Relaxed);
        let log = format!("/tmp/spawn-{n}.log");
        let out = self.exec_ok(
            &format!("( {cmd} ) </dev/null >{log} 2>&1 & echo $!"),
            Duration::from_secs(30),
        )?;
        let pid = out
            .trim()
            .lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| Error::Other(format!("spawn {cmd}: no PID in {out:?}")))?;
        Ok(GuestProcess { pid, log })
    }

    /// Whether a guest process still runs (zombies count as gone).
    pub fn is_running(&self, pid: u32) -> Result<bool> {
        let (_, out) = self.exec(
            &format!("cat /proc/{pid}/stat 2>/dev/null"),
            Duration::from_secs(20),
        )?;
        let state = out
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        Ok(matches!(state, Some(s) if s != 'Z' && s != 'X'))
    }

    /// Waits until a guest process is gone (zombies count as gone); returns
    /// false on timeout. The guest waits by itself and answers once: a
    /// `cat /proc/PID/stat` over the console every 100 ms, as this did
    /// before, kept the serial port busy for the whole wait, and in the KVM
    /// host VM the resets of a KVM guest came mid-way through such a reply
    /// (four of four, 2026-11-28), at most every other attempt of a test.
    pub fn wait_gone(&self, pid: u32, timeout: Duration) -> Result<bool> {
        let (_, out) = self.exec(&wait_gone_cmd(pid, timeout), timeout + WAIT_GONE_MARGIN)?;
        Ok(out.contains("gone=1"))
    }

    /// The guest kernel's console output so far (ttyS1, written by QEMU to
    /// `kernel.log` in the VM's directory): every message from the end of
    /// boot on (`dmesg -n 8`), and a panic or an oops even when the guest no
    /// longer answers.
    pub fn kernel_log(&self) -> String {
        fs::read_to_string(self.dir.join("kernel.log")).unwrap_or_default()
    }

    /// The guest kernel log (`dmesg`).
    pub fn dmesg(&self) -> Result<String> {
        self.exec_ok("dmesg", Duration::from_secs(30))
    }

    /// `insmod` of the image's pvsched.ko with `params`; returns status and output.
    pub fn insmod(&self, params: &str) -> Result<(i32, String)> {
        self.exec(
            &format!("insmod {GUEST_MODULE_PATH} {params}"),
            Duration::from_secs(60),
        )
    }

    /// `rmmod pvsched`; returns status and output.
    pub fn rmmod(&self) -> Result<(i32, String)> {
        self.exec("rmmod pvsched", Duration::from_secs(60))
    }

    /// QEMU's PID on the host.
    pub fn qemu_pid(&self) -> u32 {
        self.pid
    }

    /// The QMP socket (`-qmp unix:...,server=on,wait=off`).
    pub fn qmp_socket(&self) -> &Path {
        &self.qmp_path
    }

    /// The region file, if the VM has one.
    /// The eventfd the guest's doorbell rings (a [`VmConfig::doorbell`] VM):
    /// hand it to pvschedd with `--doorbell NAME=FD`.
    pub fn doorbell(&self) -> Option<BorrowedFd<'_>> {
        self.doorbell.as_ref().map(AsFd::as_fd)
    }

    /// Whether QEMU still holds its ivshmem server connection.
    pub fn doorbell_connected(&self) -> bool {
        self.doorbell_conn.is_some()
    }

    pub fn region_path(&self) -> Option<&Path> {
        self.region_path.as_deref()
    }

    /// The host's mapping of the region file, if the VM has one.
    pub fn region(&self) -> Option<&Region> {
        self.region.as_ref().map(|f| f.region())
    }

    /// The same, to initialise its header again as a host would.
    pub fn region_mut(&mut self) -> Option<&mut Region> {
        self.region.as_mut().map(|f| f.region_mut())
    }

    /// The VM's temporary directory (console.log, qemu.stderr, qemu.cmdline).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The name given to QEMU (`-name`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// CPUs the guest reported when it became ready (`nproc`).
    pub fn guest_cpus(&self) -> u32 {
        self.nr_cpus
    }

    /// `uname -r` of the guest.
    pub fn kernel_release(&self) -> &str {
        &self.kernel_release
    }

    /// The last `bytes` of console output the harness has not consumed.
    pub fn console_tail(&self, bytes: usize) -> String {
        self.console.tail(bytes)
    }

    /// vCPU threads of QEMU on the host, by thread name (`CPU <n>/TCG` or
    /// `CPU <n>/KVM`, from `debug-threads=on`): (vCPU index, thread id),
    /// sorted by index. Other threads, whatever their names, are left out.
    pub fn vcpu_threads(&self) -> Result<Vec<(u32, u32)>> {
        let threads = threads_of(self.pid as i32)
            .map_err(io_err(format!("reading /proc/{}/task", self.pid)))?;
        Ok(qemu_vcpu_threads(threads))
    }

    /// Sends one QMP command (a JSON object such as
    /// `{"execute":"query-cpus-fast"}`) and returns the reply message (the
    /// object with `"return"` or `"error"`) as one line of JSON. Each call
    /// opens its own connection (greeting and capabilities negotiated;
    /// events skipped); the exchange is bounded by 20 s.
    pub fn qmp(&self, command: &str) -> Result<String> {
        qmp_exchange(&self.qmp_path, command, QMP_TIMEOUT)
    }

    /// Asks the guest to power off (`poweroff -f`: the module's shutdown hook
    /// runs) and waits for QEMU to exit.
    pub fn poweroff(&self, timeout: Duration) -> Result<ExitStatus> {
        {
            let mut stdin = self.stdin.lock().unwrap_or_else(|e| e.into_inner());
            let _ = stdin
                .write_all(b"0 30 poweroff -f\n")
                .and_then(|_| stdin.flush());
        }
        self.wait_exit(timeout)
    }

    /// Waits for QEMU to exit on its own.
    pub fn wait_exit(&self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let status = {
                let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
                child.try_wait().map_err(io_err("waiting for QEMU"))?
            };
            if let Some(s) = status {
                return Ok(s);
            }
            if Instant::now() >= deadline {
                return Err(Error::Other(format!(
                    "VM {}: QEMU still running after {timeout:?}",
                    self.name
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        {
            let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
            if let Ok(None) = child.try_wait() {
                // SAFETY: plain kill(2) of our own child, which we have not
                // reaped yet, so the PID cannot have been reused.
                unsafe {
                    libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
                }
            }
            let _ = child.wait();
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        if std::env::var_os("PVSCHED_VMTEST_KEEP").is_some() {
            eprintln!("pvsched-vmtest: kept {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// One QMP command on a fresh connection to `socket`: the reply message as
/// one line of JSON (see [`Vm::qmp`]).
fn qmp_exchange(socket: &Path, command: &str, timeout: Duration) -> Result<String> {
    let request: serde_json::Value =
        serde_json::from_str(command.trim()).map_err(|source| Error::BadQmpCommand {
            command: command.to_string(),
            source,
        })?;
    let mut qmp = Qmp::connect(socket, timeout)?;
    Ok(qmp.request(&request)?.to_string())
}

/// QEMU's vCPU threads among `threads` ((tid, comm) of one process): those
/// named `CPU <n>/TCG` or `CPU <n>/KVM` (names parsed by
/// `pvsched_base::vcpu_names`; other VMMs' vCPU names are not QEMU's and are
/// left out), as (vCPU index, thread id) sorted by index.
fn qemu_vcpu_threads(threads: Vec<(i32, String)>) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = threads
        .into_iter()
        .filter(|(_, comm)| comm.starts_with("CPU "))
        .filter_map(|(tid, comm)| match vcpu_index_from_name(&comm)? {
            (idx, VcpuAccel::Tcg | VcpuAccel::Kvm) => Some((idx, u32::try_from(tid).ok()?)),
            (_, VcpuAccel::Unknown) => None,
        })
        .collect();
    out.sort_unstable();
    out
}

/// What [`Vm::wait_gone`] allows beyond its timeout for the guest's answer.
const WAIT_GONE_MARGIN: Duration = Duration::from_secs(30);

/// A guest command that polls `/proc/PID/stat` every 100 ms until the
/// process is gone or a zombie (`gone=1`) or `timeout` has passed on the
/// guest's clock (`gone=0`), and says so once.
fn wait_gone_cmd(pid: u32, timeout: Duration) -> String {
    let secs = timeout.as_secs().max(1);
    format!(
        "end=$(( $(cut -d. -f1 /proc/uptime) + {secs} )); g=0; while :; do \
         st=$(cat /proc/{pid}/stat 2>/dev/null); st=${{st##*\") \"}}; st=${{st%% *}}; \
         case \"$st\" in ''|Z|X) g=1; break;; esac; \
         [ \"$(cut -d. -f1 /proc/uptime)\" -ge \"$end\" ] && break; sleep 0.1; done; \
         echo \"gone=$g\""
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered(cfg: &VmConfig) -> u64 {
        match cfg.region {
            RegionSetup::Fresh { host_features, .. } => host_features,
            _ => panic!("not a fresh region: {:?}", cfg.region),
        }
    }

    #[test]
    fn a_fresh_region_offers_the_doorbell_only_on_a_doorbell_device() {
        let image = GuestImage {
            kernel: PathBuf::new(),
            kernel_release: String::new(),
            initramfs: PathBuf::new(),
            module: None,
            dir: PathBuf::new(),
        };
        let plain = VmConfig::new(image).smp(3);
        assert_eq!(
            offered(&plain),
            pvsched_abi::F_ALL & !pvsched_abi::F_DOORBELL
        );
        let doorbell = plain.clone().doorbell(true);
        assert_eq!(offered(&doorbell), pvsched_abi::F_ALL);
        assert_eq!(offered(&doorbell.doorbell(false)), offered(&plain));
        let all = plain.offer(pvsched_abi::F_ALL);
        assert_eq!(offered(&all), pvsched_abi::F_ALL);
    }

    /// `wait_gone_cmd` run by this machine's `/bin/sh` (dash, as the
    /// guest's) against `pid`.
    fn run_wait_gone(pid: u32, timeout: Duration) -> String {
        let out = Command::new("/bin/sh")
            .args(["-c", &wait_gone_cmd(pid, timeout)])
            .output()
            .expect("run /bin/sh");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    #[test]
    fn wait_gone_cmd_tells_a_running_process_from_an_exited_or_zombie_one() {
        let cmd = wait_gone_cmd(123, Duration::from_secs(20));
        assert!(
            cmd.len() < crate::MAX_COMMAND_LEN && !cmd.contains('\n'),
            "{cmd}"
        );

        let mut running = Command::new("sleep").arg("30").spawn().expect("sleep");
        let t = Instant::now();
        assert_eq!(
            run_wait_gone(running.id(), Duration::from_secs(1)),
            "gone=0"
        );
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());

        // Not reaped: a zombie until wait() below.
        let mut ended = Command::new("true").spawn().expect("true");
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(run_wait_gone(ended.id(), Duration::from_secs(20)), "gone=1");
        let _ = ended.wait();
        assert_eq!(run_wait_gone(ended.id(), Duration::from_secs(20)), "gone=1");

        let _ = running.kill();
        let _ = running.wait();
    }

    #[test]
    fn only_qemu_tcg_and_kvm_vcpu_threads_are_taken() {
        let threads = [
            (100, "qemu-system-x86"),
            (103, "CPU 1/TCG"),
            (102, "CPU 0/TCG"),
            (104, "CPU 2/KVM"),
            (105, "CPU 3/HVF"),
            (106, "vcpu4"),
            (107, "worker"),
        ]
        .map(|(tid, comm)| (tid, comm.to_string()))
        .to_vec();

        assert_eq!(
            qemu_vcpu_threads(threads),
            vec![(0, 102), (1, 103), (2, 104)]
        );
    }

    #[test]
    fn vm_can_be_shared_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Vm>();
    }

    #[test]
    fn an_end_line_that_arrives_in_pieces_is_found() {
        let marker = b"\n__PVS_END_4__ ";
        let mut scan = EndLineScan::new(marker);
        let mut data = b"__PVS_BEGIN_4__ 44.12\r\noutput".to_vec();
        assert_eq!(scan.poll(&data), None);
        // The marker and more than the overlap of its line, no newline yet.
        data.extend_from_slice(b"\r\n__PVS_END_4__ 101 152.43");
        assert_eq!(scan.poll(&data), None);
        data.extend_from_slice(b"\r\n");
        let at = find(&data, marker, 0).expect("marker");
        assert_eq!(scan.poll(&data), Some((at, data.len() - 1)));
    }

    #[test]
    fn an_end_marker_cut_in_two_is_found() {
        let marker = b"\n__PVS_END_7__ ";
        let mut scan = EndLineScan::new(marker);
        let mut data = b"out\r\n__PVS_EN".to_vec();
        assert_eq!(scan.poll(&data), None);
        data.extend_from_slice(b"D_7__ 0 3.5\n");
        assert_eq!(scan.poll(&data), Some((4, data.len() - 1)));
    }

    #[test]
    fn find_locates_needles() {
        assert_eq!(find(b"abcabc", b"bc", 0), Some(1));
        assert_eq!(find(b"abcabc", b"bc", 2), Some(4));
        assert_eq!(find(b"abc", b"x", 0), None);
        assert_eq!(find(b"abc", b"a", 3), None);
    }

    /// A fake QEMU on a socket in a fresh directory: greets, then answers
    /// each request line with the next of `replies`.
    fn fake_qemu(replies: &'static [&'static str]) -> (PathBuf, JoinHandle<Vec<String>>) {
        use std::io::BufRead;
        use std::os::unix::net::UnixListener;
        let (dir, _) = unique_dir("qmp-test").unwrap();
        let sock = dir.join("qmp.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let t = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let mut w = conn.try_clone().unwrap();
            let mut r = std::io::BufReader::new(conn);
            w.write_all(b"{\"QMP\": {\"version\": {}}}\n").unwrap();
            let mut seen = Vec::new();
            for reply in replies {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                seen.push(line.trim().to_string());
                w.write_all(reply.as_bytes()).unwrap();
            }
            seen
        });
        (sock, t)
    }

    #[test]
    fn qmp_returns_the_reply_message_as_one_json_line() {
        let (sock, t) = fake_qemu(&[
            "{\"return\": {}}\n",
            "{\"event\": \"RESUME\"}\n{\"error\": {\"class\": \"GenericError\", \"desc\": \"no\"}}\n",
        ]);

        let reply =
            qmp_exchange(&sock, r#" {"execute":"stop"} "#, Duration::from_secs(10)).unwrap();

        let v: serde_json::Value = serde_json::from_str(&reply).unwrap();
        assert_eq!(v["error"]["desc"], "no");
        assert!(!reply.contains('\n'));
        let seen = t.join().unwrap();
        assert_eq!(seen[1], r#"{"execute":"stop"}"#);
        let _ = fs::remove_dir_all(sock.parent().unwrap());
    }

    #[test]
    fn qmp_refuses_a_command_that_is_not_json() {
        let err = qmp_exchange(
            Path::new("/nonexistent"),
            "query-kvm",
            Duration::from_secs(1),
        )
        .unwrap_err();

        assert!(matches!(err, Error::BadQmpCommand { .. }), "{err}");
    }
}
