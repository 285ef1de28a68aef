//! A real libvirt for the end-to-end test (`libvirt_e2e.rs`): the Debian
//! packages installed as a user installs them, libvirtd started without
//! systemd (`scripts/libvirtd.sh`), TCG domains defined with `virsh` and
//! driven over their serial console (a Unix socket), and a watch that no
//! thread of a process ever runs RT.
//!
//! Everything that starts something has a guard that undoes it on drop, so a
//! failed assertion leaves no domain, file or daemon behind.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pvsched_base::sched::{get_params, ThreadParams};
use pvsched_base::thread::threads_of;
use pvsched_vmtest::{workspace_root, GuestImage};

/// Where the staged kernel, initramfs, console sockets and kernel logs live:
/// QEMU runs as libvirt-qemu and must reach them (mode 0755, under libvirt's
/// own images directory, which is 0711).
pub const STAGE_DIR: &str = "/var/lib/libvirt/images/pvsched-test";
/// libvirtd's status files of running QEMU domains.
pub const STATUS_DIR: &str = "/run/libvirt/qemu";
const URI: &str = "qemu:///system";
/// Kernel command line: as pvsched-vmtest's (ttyS1 is the kernel console).
const CMDLINE: &str = "console=ttyS1 panic=-1 quiet no_timer_check";
/// Console silence after which a command in flight gets an XON (see
/// pvsched-vmtest's `kick_console`: TCG's serial output stalls now and then).
const KICK_AFTER: Duration = Duration::from_secs(2);

/// A progress line on stderr, with the time since `t0`.
pub fn progress(t0: Instant, msg: &str) {
    eprintln!("[libvirt_e2e +{:6.1}s] {msg}", t0.elapsed().as_secs_f64());
}

/// Runs `cmd`; its stdout, or a panic with everything it printed.
pub fn run(cmd: &mut Command) -> String {
    let what = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `virsh -c qemu:///system ARGS`: stdout, or stdout and stderr as the error.
pub fn virsh(args: &[&str]) -> Result<String, String> {
    let out = Command::new("virsh")
        .arg("-c")
        .arg(URI)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run virsh: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "virsh {args:?}: {}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

// ---------------------------------------------------------------------------
// Packages

/// The newest `target/packages/<prefix>*<suffix>`.
fn find_deb(dir: &Path, prefix: &str, suffix: &str) -> Option<PathBuf> {
    let mut debs: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(prefix) && n.ends_with(suffix)
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    debs.sort();
    debs.pop().map(|(_, p)| p)
}

/// Builds the two packages unless `target/packages/` has them, installs
/// them with apt as a user would, and returns the DKMS module version.
pub fn install_packages(t0: Instant) -> String {
    let root = workspace_root();
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("packages");
    // Debs older than the daemon binary they would package are stale: a
    // test of them would test old code.
    let built = root.join("target/release/pvschedd");
    let fresh = |deb: &Path| match (deb.metadata(), built.metadata()) {
        (Ok(d), Ok(b)) => match (d.modified(), b.modified()) {
            (Ok(d), Ok(b)) => d >= b,
            _ => false,
        },
        _ => false,
    };
    let find = || {
        let host = find_deb(&dir, "pvsched_", "_amd64.deb").filter(|d| fresh(d))?;
        Some((host, find_deb(&dir, "pvsched-dkms_", "_all.deb")?))
    };
    let (host, dkms) = match find() {
        Some(debs) => debs,
        None => {
            progress(t0, "packages: building (scripts/build-packages.sh)");
            run(Command::new(root.join("scripts/build-packages.sh")).current_dir(&root));
            find().unwrap_or_else(|| panic!("no pvsched debs in {} after building", dir.display()))
        }
    };
    progress(
        t0,
        &format!(
            "packages: apt-get install --reinstall {} {}",
            host.display(),
            dkms.display()
        ),
    );
    run(Command::new("apt-get")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args([
            "install",
            "-y",
            "-q",
            "--reinstall",
            // Wait for another apt or dpkg instead of failing at once.
            "-o",
            "DPkg::Lock::Timeout=300",
            "-o",
            "Dpkg::Options::=--force-confdef",
            "-o",
            "Dpkg::Options::=--force-confold",
        ])
        .arg(&host)
        .arg(&dkms));
    // The version DKMS knows the module by: its source tree, /usr/src/pvsched-<ver>.
    let files = run(Command::new("dpkg").args(["-L", "pvsched-dkms"]));
    files
        .lines()
        .find_map(|l| {
            l.strip_prefix("/usr/src/pvsched-")?
                .strip_suffix("/dkms.conf")
                .map(str::to_string)
        })
        .unwrap_or_else(|| {
            panic!("pvsched-dkms installs no /usr/src/pvsched-*/dkms.conf:\n{files}")
        })
}

/// The module DKMS built for kernel `release` (built here if the package's
/// postinst did not), uncompressed, at a path whose file changes only when
/// its content does: the guest image cache keys on the file's mtime.
pub fn dkms_module(version: &str, release: &str, t0: Instant) -> PathBuf {
    let status =
        run(Command::new("dkms").args(["status", "-m", "pvsched", "-v", version, "-k", release]));
    if !status.contains(": installed") {
        progress(
            t0,
            &format!("dkms install -m pvsched -v {version} -k {release}"),
        );
        run(Command::new("dkms").args(["install", "-m", "pvsched", "-v", version, "-k", release]));
    }
    let dir = PathBuf::from(format!("/lib/modules/{release}/updates/dkms"));
    let data = if let Ok(d) = std::fs::read(dir.join("pvsched.ko")) {
        d
    } else {
        let (path, tool) = [
            ("pvsched.ko.xz", "xz"),
            ("pvsched.ko.zst", "zstd"),
            ("pvsched.ko.gz", "gzip"),
        ]
        .iter()
        .map(|(f, t)| (dir.join(f), *t))
        .find(|(p, _)| p.exists())
        .unwrap_or_else(|| panic!("no pvsched.ko(.xz/.zst/.gz) in {}", dir.display()));
        let out = Command::new(tool)
            .arg("-dc")
            .arg(&path)
            .output()
            .unwrap_or_else(|e| panic!("{tool} -dc {}: {e}", path.display()));
        assert!(
            out.status.success(),
            "{tool} -dc {}: {}",
            path.display(),
            out.status
        );
        out.stdout
    };
    let keep = pvsched_vmtest::cache_root().join("libvirt-e2e");
    std::fs::create_dir_all(&keep).unwrap();
    let ko = keep.join("pvsched.ko");
    if std::fs::read(&ko).ok().as_deref() != Some(&data[..]) {
        std::fs::write(&ko, &data).unwrap();
    }
    ko
}

// ---------------------------------------------------------------------------
// libvirtd

/// libvirtd (and virtlogd) running; on drop, stopped again if this guard
/// started them (`scripts/libvirtd.sh stop` stops only those).
pub struct Libvirtd {
    started: bool,
}

impl Libvirtd {
    /// `scripts/libvirtd.sh start`: starts what is not running, restarts a
    /// libvirtd older than its hooks (the package just installed ours).
    pub fn start(t0: Instant) -> Self {
        let script = workspace_root().join("scripts/libvirtd.sh");
        let out = run(Command::new(&script).arg("start"));
        for line in out.lines() {
            progress(t0, &format!("libvirtd.sh: {line}"));
        }
        Libvirtd {
            started: out.lines().any(|l| l.ends_with(" started")),
        }
    }
}

impl Drop for Libvirtd {
    fn drop(&mut self) {
        if self.started {
            let script = workspace_root().join("scripts/libvirtd.sh");
            match Command::new(&script).arg("stop").output() {
                Ok(o) => eprint!("{}", String::from_utf8_lossy(&o.stdout)),
                Err(e) => eprintln!("libvirtd.sh stop: {e}"),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The staged guest

/// The image's kernel and initramfs copied into [`STAGE_DIR`]; the directory
/// is removed on drop (kept with `PVSCHED_VMTEST_KEEP=1`).
pub struct Stage {
    pub dir: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

impl Stage {
    pub fn new(image: &GuestImage) -> Self {
        let dir = PathBuf::from(STAGE_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let kernel = dir.join("vmlinuz");
        let initrd = dir.join("initramfs.cpio");
        for (from, to) in [(&image.kernel, &kernel), (&image.initramfs, &initrd)] {
            std::fs::copy(from, to)
                .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
            std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        Stage {
            dir,
            kernel,
            initrd,
        }
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        if std::env::var_os("PVSCHED_VMTEST_KEEP").is_some() {
            eprintln!("kept {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The pvsched `<shmem>` element of a test domain.
#[derive(Clone, Copy, Debug)]
pub enum Shmem<'a> {
    /// `ivshmem-plain`: libvirt has QEMU create `/dev/shm/<name>`, removed
    /// when the domain is dropped.
    Plain(&'a str),
    /// `ivshmem-doorbell` with `<server path=...>`: the region and the
    /// doorbell come from pvschedd's ivshmem socket.
    Server { name: &'a str, socket: &'a Path },
}

impl Shmem<'_> {
    fn xml(&self) -> String {
        match self {
            Shmem::Plain(s) => format!(
                "    <shmem name='{s}'>\n      <model type='ivshmem-plain'/>\n      <size unit='M'>1</size>\n    </shmem>\n"
            ),
            Shmem::Server { name, socket } => format!(
                "    <shmem name='{name}'>\n      <model type='ivshmem-doorbell'/>\n      <server path='{}'/>\n      <msi vectors='1' ioeventfd='on'/>\n    </shmem>\n",
                socket.display()
            ),
        }
    }
}

/// A TCG domain as `packaging/libvirt/example-domain.xml` has it: direct
/// kernel boot, ttyS0 a Unix socket (commands), ttyS1 a file (kernel
/// console), and the pvsched `<shmem>` element if `shmem` is given.
pub fn domain_xml(name: &str, stage: &Stage, vcpus: u32, shmem: Option<Shmem<'_>>) -> String {
    let shmem = shmem.map_or(String::new(), |s| s.xml());
    format!(
        "<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>512</memory>
  <vcpu placement='static'>{vcpus}</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{kernel}</kernel>
    <initrd>{initrd}</initrd>
    <cmdline>{CMDLINE}</cmdline>
  </os>
  <features>
    <acpi/>
    <apic/>
  </features>
  <cpu mode='maximum'/>
  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <controller type='usb' model='none'/>
    <serial type='unix'>
      <source mode='bind' path='{console}'/>
      <target port='0'/>
    </serial>
    <serial type='file'>
      <source path='{klog}'/>
      <target port='1'/>
    </serial>
{shmem}    <memballoon model='none'/>
  </devices>
</domain>
",
        kernel = stage.kernel.display(),
        initrd = stage.initrd.display(),
        console = console_path(stage, name).display(),
        klog = kernel_log_path(stage, name).display(),
    )
}

fn console_path(stage: &Stage, name: &str) -> PathBuf {
    stage.dir.join(format!("{name}.console"))
}

fn kernel_log_path(stage: &Stage, name: &str) -> PathBuf {
    stage.dir.join(format!("{name}.kernel.log"))
}

/// Stops and forgets domain `name` if it exists (a leftover of a killed run).
pub fn remove_domain(name: &str) {
    let _ = virsh(&["destroy", name]);
    let _ = virsh(&["undefine", name]);
}

// ---------------------------------------------------------------------------
// Console

#[derive(Default)]
struct Buf {
    data: Vec<u8>,
    eof: bool,
}

/// The guest's command channel (pvsched-vmtest's init on ttyS0: a line
/// `<id> <timeout-s> <command>` in, output framed by `__PVS_BEGIN_<id>__` /
/// `__PVS_END_<id>__ <rc>` out).
struct Console {
    stream: Mutex<UnixStream>,
    buf: Arc<(Mutex<Buf>, Condvar)>,
    reader: Option<JoinHandle<()>>,
    next_id: Mutex<u64>,
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if from >= hay.len() {
        return None;
    }
    hay[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

impl Console {
    fn connect(path: &Path) -> Self {
        let stream =
            pvsched_vmtest::wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
                UnixStream::connect(path).ok()
            })
            .unwrap_or_else(|| panic!("cannot connect to the console {}", path.display()));
        let mut rd = stream.try_clone().unwrap();
        let buf = Arc::new((Mutex::new(Buf::default()), Condvar::new()));
        let b2 = Arc::clone(&buf);
        let reader = std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            loop {
                let n = match rd.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let mut b = b2.0.lock().unwrap_or_else(|e| e.into_inner());
                b.data.extend_from_slice(&chunk[..n]);
                b2.1.notify_all();
            }
            let mut b = b2.0.lock().unwrap_or_else(|e| e.into_inner());
            b.eof = true;
            b2.1.notify_all();
        });
        Console {
            stream: Mutex::new(stream),
            buf,
            reader: Some(reader),
            next_id: Mutex::new(1),
        }
    }

    fn send(&self, bytes: &[u8]) {
        let mut s = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        let _ = s.write_all(bytes).and_then(|_| s.flush());
    }

    fn tail(&self, bytes: usize) -> String {
        let b = self.buf.0.lock().unwrap_or_else(|e| e.into_inner());
        let start = b.data.len().saturating_sub(bytes);
        String::from_utf8_lossy(&b.data[start..]).replace('\r', "")
    }

    /// Waits until the guest serves commands. Output written while no one was
    /// connected is lost, the ready line with it: a probe command every 2 s
    /// is answered once the loop runs.
    fn wait_ready(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let mut probe = 0u32;
        let mut next_probe = Instant::now() + Duration::from_secs(2);
        let mut b = self.buf.0.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if find(&b.data, b"__PVS_READY__", 0).is_some()
                || (1..=probe)
                    .any(|p| find(&b.data, format!("__PVS_END_r{p}__ ").as_bytes(), 0).is_some())
            {
                return Ok(());
            }
            if b.eof {
                return Err("console closed".into());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("not ready after {timeout:?}"));
            }
            if now >= next_probe {
                drop(b);
                probe += 1;
                self.send(format!("r{probe} 5 true\n").as_bytes());
                next_probe = Instant::now() + Duration::from_secs(2);
                b = self.buf.0.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            b = self
                .buf
                .1
                .wait_timeout(b, next_probe.min(deadline) - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn exec(&self, cmd: &str, timeout: Duration) -> Result<(i32, String), String> {
        let id = {
            let mut n = self.next_id.lock().unwrap_or_else(|e| e.into_inner());
            *n += 1;
            *n
        };
        let secs = timeout.as_secs().max(1);
        let begin = format!("__PVS_BEGIN_{id}__ ");
        let end = format!("__PVS_END_{id}__ ");
        self.send(format!("{id} {secs} {cmd}\n").as_bytes());
        // TCG is slow: the host waits longer than the guest's own timeout.
        let deadline = Instant::now() + Duration::from_secs(secs + 30);
        let mut b = self.buf.0.lock().unwrap_or_else(|e| e.into_inner());
        let (mut seen_len, mut seen_at) = (b.data.len(), Instant::now());
        loop {
            if let Some(e) = find(&b.data, end.as_bytes(), 0) {
                if let Some(nl) = find(&b.data, b"\n", e) {
                    let text = |x: usize, y: usize| {
                        String::from_utf8_lossy(&b.data[x..y]).replace('\r', "")
                    };
                    let rc: i32 = text(e + end.len(), nl)
                        .split_whitespace()
                        .next()
                        .and_then(|r| r.parse().ok())
                        .ok_or_else(|| format!("bad end line for {cmd}"))?;
                    let start = find(&b.data[..e], begin.as_bytes(), 0)
                        .and_then(|s| find(&b.data[..e], b"\n", s))
                        .map_or(0, |l| l + 1);
                    let out = text(start.min(e), e);
                    b.data.drain(..=nl);
                    return Ok((rc, out));
                }
            }
            if b.eof {
                return Err(format!("console closed during {cmd}"));
            }
            let now = Instant::now();
            if now >= deadline {
                drop(b);
                return Err(format!(
                    "no answer to {cmd}; console tail:\n{}",
                    self.tail(3000)
                ));
            }
            if b.data.len() != seen_len {
                (seen_len, seen_at) = (b.data.len(), now);
            } else if now.duration_since(seen_at) >= KICK_AFTER {
                drop(b);
                self.send(&[0x11]);
                seen_at = Instant::now();
                b = self.buf.0.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            b = self
                .buf
                .1
                .wait_timeout(b, KICK_AFTER)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        if let Ok(s) = self.stream.lock() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

// ---------------------------------------------------------------------------
// Domain

/// A defined and started libvirt domain; on drop destroyed, undefined, its
/// console socket, kernel log and region file removed.
pub struct Domain {
    pub name: String,
    shmem: Option<String>,
    console_path: PathBuf,
    kernel_log: PathBuf,
    console: Option<Console>,
}

impl Domain {
    /// Defines and starts `name` from [`domain_xml`], then connects to its
    /// console (before the guest gets far: QEMU starts paused).
    pub fn start(name: &str, stage: &Stage, vcpus: u32, shmem: Option<Shmem<'_>>) -> Self {
        remove_domain(name);
        let console_path = console_path(stage, name);
        let kernel_log = kernel_log_path(stage, name);
        let _ = std::fs::remove_file(&console_path);
        let _ = std::fs::remove_file(&kernel_log);
        let plain = match shmem {
            Some(Shmem::Plain(s)) => Some(s.to_string()),
            _ => None,
        };
        if let Some(s) = &plain {
            let _ = std::fs::remove_file(Path::new("/dev/shm").join(s));
        }
        let xml_path = stage.dir.join(format!("{name}.xml"));
        std::fs::write(&xml_path, domain_xml(name, stage, vcpus, shmem)).unwrap();
        // From here on the guard cleans up, whatever fails.
        let mut d = Domain {
            name: name.to_string(),
            shmem: plain,
            console_path,
            kernel_log,
            console: None,
        };
        virsh(&["define", &xml_path.display().to_string()]).unwrap_or_else(|e| panic!("{e}"));
        virsh(&["start", name]).unwrap_or_else(|e| panic!("{e}"));
        d.console = Some(Console::connect(&d.console_path));
        d
    }

    fn console(&self) -> &Console {
        self.console.as_ref().expect("console connected")
    }

    /// Waits until the guest's init serves commands.
    pub fn wait_ready(&self, timeout: Duration) {
        self.console()
            .wait_ready(timeout)
            .unwrap_or_else(|e| panic!("domain {}: {e}\n{}", self.name, self.diagnostics()));
    }

    /// Runs `cmd` in the guest: exit status and output.
    pub fn exec(&self, cmd: &str, timeout: Duration) -> (i32, String) {
        self.console()
            .exec(cmd, timeout)
            .unwrap_or_else(|e| panic!("domain {}: {e}\n{}", self.name, self.diagnostics()))
    }

    /// Runs `cmd` in the guest; its output, or a panic if it fails.
    pub fn exec_ok(&self, cmd: &str, timeout: Duration) -> String {
        let (rc, out) = self.exec(cmd, timeout);
        assert_eq!(rc, 0, "domain {}: `{cmd}` exited {rc}:\n{out}", self.name);
        out
    }

    /// The guest kernel's console (ttyS1, a file on the host).
    pub fn kernel_log(&self) -> String {
        std::fs::read_to_string(&self.kernel_log).unwrap_or_default()
    }

    /// Console and kernel log tails, for failure messages.
    pub fn diagnostics(&self) -> String {
        let klog = self.kernel_log();
        let klog = &klog[klog.len().saturating_sub(3000)..];
        format!(
            "console tail:\n{}\nkernel log tail:\n{klog}",
            self.console
                .as_ref()
                .map(|c| c.tail(3000))
                .unwrap_or_default()
        )
    }

    /// libvirtd's status file of the running domain.
    pub fn status_file(&self) -> PathBuf {
        Path::new(STATUS_DIR).join(format!("{}.xml", self.name))
    }

    pub fn status_xml(&self) -> String {
        std::fs::read_to_string(self.status_file())
            .unwrap_or_else(|e| panic!("{}: {e}", self.status_file().display()))
    }

    /// QEMU's pid, from `<domstatus pid='...'>`.
    pub fn qemu_pid(&self) -> i32 {
        let xml = self.status_xml();
        attr(&xml, "<domstatus ", "pid").unwrap_or_else(|| panic!("no <domstatus pid=...>:\n{xml}"))
    }

    /// (vCPU index, thread id) from the status file's
    /// `<vcpus><vcpu id='N' pid='TID'/>`, sorted by index.
    pub fn vcpu_tids(&self) -> Vec<(u32, i32)> {
        let xml = self.status_xml();
        vcpu_tids(&xml)
    }

    /// `virsh destroy`.
    pub fn destroy(&self) {
        virsh(&["destroy", &self.name]).unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        self.console.take();
        remove_domain(&self.name);
        let _ = std::fs::remove_file(&self.console_path);
        let _ = std::fs::remove_file(&self.kernel_log);
        let _ = std::fs::remove_file(self.console_path.with_extension("xml"));
        // QEMU leaves the ivshmem-plain memory file behind when it stops.
        if let Some(s) = &self.shmem {
            let _ = std::fs::remove_file(Path::new("/dev/shm").join(s));
        }
    }
}

/// The integer attribute `name` of the first element starting with `open`.
fn attr(xml: &str, open: &str, name: &str) -> Option<i32> {
    let at = xml.find(open)?;
    let tag = &xml[at..at + xml[at..].find('>')?];
    let key = format!(" {name}='");
    let v = &tag[tag.find(&key)? + key.len()..];
    v[..v.find('\'')?].parse().ok()
}

/// The `<vcpus>` list of a status file (before `<domain`: the domain's own
/// `<vcpu placement=...>` element is something else).
pub fn vcpu_tids(xml: &str) -> Vec<(u32, i32)> {
    let head = &xml[..xml.find("<domain ").unwrap_or(xml.len())];
    let mut out: Vec<(u32, i32)> = head
        .match_indices("<vcpu id=")
        .filter_map(|(i, _)| {
            let rest = &head[i..];
            let id = attr(rest, "<vcpu ", "id")?;
            let pid = attr(rest, "<vcpu ", "pid")?;
            Some((u32::try_from(id).ok()?, pid))
        })
        .collect();
    out.sort_unstable();
    out
}

// ---------------------------------------------------------------------------
// RT watch

/// Threads seen RT: (tid, name, parameters).
pub type RtSeen = Vec<(i32, String, ThreadParams)>;

/// Samples every thread of a process every few ms (itself SCHED_FIFO, so
/// that spinning RT threads cannot starve it) and remembers each one seen
/// with an RT policy.
pub struct RtWatch {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<(u64, RtSeen)>>,
}

impl RtWatch {
    pub fn start(pid: i32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            let _rt = super::RtObserver::new();
            let mut seen: RtSeen = Vec::new();
            let mut samples = 0u64;
            while !s2.load(Ordering::Relaxed) {
                let Ok(threads) = threads_of(pid) else {
                    break; // the process is gone
                };
                for (tid, comm) in threads {
                    if let Ok(p) = get_params(tid) {
                        if p.is_rt() && !seen.iter().any(|(t, _, _)| *t == tid) {
                            seen.push((tid, comm, p));
                        }
                    }
                }
                samples += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            (samples, seen)
        });
        RtWatch {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops sampling: how many samples were taken, and every thread seen RT.
    pub fn finish(mut self) -> (u64, RtSeen) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for RtWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
