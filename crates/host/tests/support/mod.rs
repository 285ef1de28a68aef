//! Shared harness of pvschedd's integration tests: a real pvschedd child
//! with its own configuration, state file, socket and log, and real fake
//! VMM processes (`pvsched-fake-vmm`, from `crates/vmtest`) to serve.
//!
//! Each test binary includes it with `mod support;` and uses what it needs.
#![allow(dead_code)]

pub mod libvirt;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use pvsched_base::sched::{get_params, ThreadParams};
use pvsched_control::{call, Request, Response, Status};
use pvsched_vmtest::wait_until;

/// One test of a binary at a time, for tests whose spinning RT threads or
/// daemons would disturb another's measurements.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A VM name unique to this test process.
pub fn vm_name(name: &str) -> String {
    format!("t{}-{name}", std::process::id())
}

/// A region file in /dev/shm of `len` bytes, as QEMU's
/// `memory-backend-file` makes it (owned by the VMM's user: here the
/// test's), removed on drop.
pub struct ShmFile(pub PathBuf);

impl ShmFile {
    pub fn new(vm: &str, len: u64) -> Self {
        let path = PathBuf::from(format!("/dev/shm/pvsched-{vm}"));
        let _ = std::fs::remove_file(&path);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        f.set_len(len).unwrap();
        Self(path)
    }
}

impl Drop for ShmFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A directory on /dev/shm's tmpfs private to one test, so that no other
/// pvschedd on the machine (their default region_dir is /dev/shm itself)
/// scans it; removed on drop.
pub struct ShmDir(pub PathBuf);

impl ShmDir {
    pub fn new(name: &str) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let p = PathBuf::from(format!(
            "/dev/shm/t{}-{name}.pvsched-test",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        ShmDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory for one test under the target's temporary directory,
/// traversable by every user (tests run programs as `nobody` in it).
/// A test's directory, 0755 under the system's temporary directory: the
/// fake VMMs of other users put sockets there, and a checkout may be private
/// (`mktemp -d` makes it 0700), so not under the target directory.
pub fn tempdir(name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("pvsched-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A binary of the workspace, built next to this test binary's directory
/// (`make test` builds every binary first).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} missing: run `cargo build --workspace --bins --release` first (make test does)",
        path.display()
    );
    path
}

/// The parameters in force on thread `tid`.
pub fn params(tid: i32) -> ThreadParams {
    get_params(tid).expect("sched_getattr")
}

/// Makes the calling test thread SCHED_FIFO above the daemon while it
/// lives, so that boosted vCPU threads spinning on every CPU cannot starve
/// the observer; SCHED_OTHER again on drop. What it starts meanwhile (a
/// `pvschedctl`) starts in the default policy.
pub struct RtObserver;

impl RtObserver {
    pub fn new() -> Self {
        pvsched_base::sched::set_params(0, &ThreadParams::fifo(60).reset_on_fork())
            .expect("make the observer SCHED_FIFO");
        RtObserver
    }
}

impl Drop for RtObserver {
    fn drop(&mut self) {
        let _ = pvsched_base::sched::set_params(0, &ThreadParams::other(0));
    }
}

/// Waits (as an RT observer) until thread `tid` is boosted.
pub fn wait_boosted(d: &Daemon, tid: i32) {
    let _rt = RtObserver::new();
    wait_until(Duration::from_secs(10), Duration::from_millis(2), || {
        params(tid).is_rt().then_some(())
    })
    .unwrap_or_else(|| panic!("thread {tid} never boosted; log:\n{}", d.log()));
}

/// A pvschedd child with its own state file, socket and log.
pub struct Daemon {
    child: Option<Child>,
    pub dir: PathBuf,
}

impl Daemon {
    /// Starts pvschedd in `dir` with `[daemon]` pointing into it, auto
    /// discovery off unless `extra` turns it on, and `extra` appended. The
    /// rt backend unless `extra` names one (it starts with `[daemon]` keys):
    /// these tests look at the RT parameters boosts set.
    pub fn start(dir: &Path, extra: &str) -> Self {
        let backend = if extra.contains("backend =") {
            ""
        } else {
            "backend = \"rt\"\n"
        };
        let toml = format!(
            "[daemon]\nstate_file = \"{d}/state.json\"\ncontrol_socket = \"{d}/control.sock\"\nmetrics = \"off\"\n{backend}{extra}",
            d = dir.display()
        );
        Self::start_with_config(dir, &toml)
    }

    /// Starts pvschedd with exactly `toml` as its configuration.
    pub fn start_with_config(dir: &Path, toml: &str) -> Self {
        Self::start_binary(Path::new(env!("CARGO_BIN_EXE_pvschedd")), dir, toml)
    }

    /// Starts `bin` (this build's pvschedd, or an installed
    /// `/usr/sbin/pvschedd`) in `dir` with exactly `toml` as its
    /// configuration; returns once its control socket accepts connections.
    pub fn start_binary(bin: &Path, dir: &Path, toml: &str) -> Self {
        Self::start_with_doorbells(bin, dir, toml, &[])
    }

    /// [`Daemon::start_binary`], handing pvschedd each `(vm, eventfd)` as
    /// `--doorbell vm=FD` (descriptors 10, 11, ... in the child).
    pub fn start_with_doorbells(
        bin: &Path,
        dir: &Path,
        toml: &str,
        doorbells: &[(&str, std::os::fd::BorrowedFd<'_>)],
    ) -> Self {
        let config = dir.join("pvsched.toml");
        std::fs::write(&config, toml).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("pvschedd.log"))
            .unwrap();
        let mut cmd = Command::new(bin);
        cmd.arg("--config")
            .arg(&config)
            .arg("--log")
            .arg(std::env::var("PVSCHED_E2E_LOG").unwrap_or_else(|_| "info".into()));
        for (i, (vm, fd)) in doorbells.iter().enumerate() {
            let target = 10 + i as i32;
            pvsched_base::ivshmem::pass_fd(&mut cmd, *fd, target);
            cmd.arg("--doorbell").arg(format!("{vm}={target}"));
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let d = Daemon {
            child: Some(child),
            dir: dir.to_path_buf(),
        };
        // Connectable, not just present: the socket file exists between
        // bind and listen, when a connection is refused.
        wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
            std::os::unix::net::UnixStream::connect(d.socket())
                .ok()
                .map(drop)
        })
        .unwrap_or_else(|| {
            panic!(
                "{} did not open its socket; log:\n{}",
                bin.display(),
                d.log()
            )
        });
        d
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("control.sock")
    }

    pub fn state_file(&self) -> PathBuf {
        self.dir.join("state.json")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pvschedd.log")).unwrap_or_default()
    }

    pub fn status(&self) -> Status {
        match call(&self.socket(), &Request::Status, Duration::from_secs(5)) {
            Ok(Response::Status(s)) => *s,
            other => panic!("status: {other:?}\nlog:\n{}", self.log()),
        }
    }

    pub fn request(&self, req: &Request, timeout: Duration) -> Response {
        call(&self.socket(), req, timeout).unwrap_or_else(|e| panic!("{e}\nlog:\n{}", self.log()))
    }

    /// The sum of the Prometheus samples whose line starts with `prefix` (a
    /// name, and labels if given), from the control socket.
    pub fn metric(&self, prefix: &str) -> f64 {
        let Response::Metrics { text } = self.request(&Request::Metrics, Duration::from_secs(5))
        else {
            panic!("metrics: not a metrics reply\nlog:\n{}", self.log());
        };
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }

    /// `pvschedctl idle --apply TARGET` for every VM, budget 5 %.
    pub fn idle_apply(&self, target: pvsched_control::ApplyTarget) -> Response {
        self.request(
            &Request::IdleApply {
                vm: None,
                budget_permille: 50,
                target,
            },
            Duration::from_secs(5),
        )
    }

    /// Waits until VM `vm` is served with `vcpus` vCPUs.
    pub fn wait_serving(&self, vm: &str, vcpus: usize) {
        wait_until(Duration::from_secs(15), Duration::from_millis(50), || {
            self.status()
                .vms
                .iter()
                .any(|v| v.name == vm && v.vcpus.len() == vcpus)
                .then_some(())
        })
        .unwrap_or_else(|| panic!("pvschedd does not serve {vm}; log:\n{}", self.log()));
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// Whether the child is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends `sig` to our own pvschedd child and reaps it.
    pub fn signal(&mut self, sig: i32) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        // SAFETY: kill on the PID of our own, not yet reaped, child.
        unsafe { libc::kill(child.id() as i32, sig) };
        child.wait().expect("wait pvschedd")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal(libc::SIGTERM);
        }
    }
}

/// How to start a fake VMM.
#[derive(Clone, Debug)]
pub struct FakeVmmConfig {
    pub region: PathBuf,
    pub vcpus: u32,
    pub name_format: String,
    /// The guest half says a FIFO task of this priority runs on every vCPU.
    pub guest_fifo: Option<u32>,
    /// The guest half claims these PVSCHED_CS_* flags all the time.
    pub guest_cs: Option<u32>,
    /// `--guest-cs-duty HOLD/PERIOD`: `guest_cs` only for the first HOLD µs of each
    /// PERIOD µs (needs `spin`).
    pub guest_cs_duty: Option<(u64, u64)>,
    /// `--guest-pending PRIO`: a pending hint for a FIFO task of that priority, always.
    pub guest_pending: Option<u32>,
    /// `--guest-rt-bursts`: an idle guest whose RT switch count moves each period.
    pub guest_rt_bursts: bool,
    /// `--guest-lock-wait W=H`: vCPU W publishes a mutex wait naming vCPU H.
    pub guest_lock_wait: Option<(u32, u32)>,
    pub spin: bool,
    /// `--spin-first N`: only vCPUs below N spin.
    pub spin_first: Option<u32>,
    /// Carry the region path in argv only, without mapping it.
    pub no_map: bool,
    pub qmp: Option<PathBuf>,
    /// Thread ids `query-cpus-fast` reports instead of its own.
    pub qmp_tids: Option<Vec<i64>>,
    /// Run as this (uid, gid) instead of ours.
    pub user: Option<(u32, u32)>,
    /// Programs to run it under, e.g. `["timeout", "120"]`.
    pub wrapper: Vec<String>,
    /// Take the region and doorbell from an ivshmem server instead.
    pub ivshmem: Option<IvshmemClient>,
}

/// A fake VMM's connection to an ivshmem server (`--ivshmem-server`).
#[derive(Clone, Debug, Default)]
pub struct IvshmemClient {
    pub socket: PathBuf,
    /// `-name NAME` on its command line, as QEMU's.
    pub name: Option<String>,
    pub ring_every_ms: Option<u64>,
    /// Write to the socket after the handshake (QEMU never does).
    pub garbage: bool,
    /// Connect and never read.
    pub no_read: bool,
}

impl FakeVmmConfig {
    pub fn new(region: &Path) -> Self {
        Self {
            region: region.to_path_buf(),
            vcpus: 2,
            name_format: "CPU {}/TCG".into(),
            guest_fifo: None,
            guest_cs: None,
            guest_cs_duty: None,
            guest_pending: None,
            guest_rt_bursts: false,
            guest_lock_wait: None,
            spin: false,
            spin_first: None,
            no_map: false,
            qmp: None,
            qmp_tids: None,
            user: None,
            wrapper: Vec::new(),
            ivshmem: None,
        }
    }

    /// A fake VMM that takes its region from the ivshmem server at `socket`
    /// and calls itself `name` (QEMU's `-name`).
    pub fn ivshmem(socket: &Path, name: &str) -> Self {
        let mut c = Self::new(Path::new(""));
        c.ivshmem = Some(IvshmemClient {
            socket: socket.to_path_buf(),
            name: Some(name.to_string()),
            ..IvshmemClient::default()
        });
        c
    }
}

/// A fake VMM started from `cfg` (its region in `dir`) with a truthful QMP
/// socket in `dir`, and the `[[vm]]` entry (auto discovery off) that serves
/// it by that socket.
pub fn qmp_vm(dir: &Path, name: &str, mut cfg: FakeVmmConfig) -> (FakeVmm, String) {
    let region = dir.join(format!("{name}.region"));
    let qmp = dir.join(format!("{name}.qmp"));
    cfg.region = region.clone();
    cfg.qmp = Some(qmp.clone());
    let vmm = FakeVmm::spawn(&cfg);
    let entry = format!(
        "[discovery]\nauto = false\n{}",
        vm_entry(name, &region, &qmp)
    );
    (vmm, entry)
}

/// A fake VMM with one vCPU (its thread sleeps 1 ms at a time) on the region
/// `region`, a QMP socket in `dir`, and the whole pvschedd configuration that
/// serves it alone, state and socket in `dir`, metrics off, the scan every
/// `scan_interval_us` (it rewrites every host half).
pub fn one_vcpu_vm(
    dir: &Path,
    name: &str,
    region: &Path,
    scan_interval_us: u64,
) -> (FakeVmm, String) {
    let qmp = dir.join(format!("{name}.qmp"));
    let mut c = FakeVmmConfig::new(region);
    c.vcpus = 1;
    c.qmp = Some(qmp.clone());
    let vmm = FakeVmm::spawn(&c);
    let toml = format!(
        "[daemon]\nstate_file = \"{d}/state.json\"\ncontrol_socket = \"{d}/control.sock\"\n\
         metrics = \"off\"\nscan_interval_us = {scan_interval_us}\n\
         [discovery]\nauto = false\n{entry}",
        d = dir.display(),
        entry = vm_entry(name, region, &qmp),
    );
    (vmm, toml)
}

/// The `[[vm]]` entry that serves VM `name` by its region and QMP socket.
pub fn vm_entry(name: &str, region: &Path, qmp: &Path) -> String {
    format!(
        "[[vm]]\nname = \"{name}\"\nregion = \"{}\"\nqmp = \"{}\"\n",
        region.display(),
        qmp.display()
    )
}

/// A running fake VMM (our child; killed by PID on drop).
pub struct FakeVmm {
    child: Child,
    /// The VMM process (not a wrapper's).
    pub pid: i32,
    /// Its vCPU threads, by index.
    pub tids: Vec<i32>,
}

/// A copy of workspace binary `name` that any user may run: another user
/// cannot reach the build's directory when the checkout is private.
/// Made once per test process (tests run in parallel threads).
fn bin_for_anyone(name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    static COPY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let dir = DIR.get_or_init(|| tempdir("bin"));
    let copy = dir.join(name);
    let _one_at_a_time = COPY.lock().unwrap_or_else(|e| e.into_inner());
    if !copy.exists() {
        let part = dir.join(format!("{name}.part"));
        std::fs::copy(workspace_bin(name), &part).expect("copy a workspace binary");
        std::fs::set_permissions(&part, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&part, &copy).expect("install the copy");
    }
    copy
}

impl FakeVmm {
    pub fn spawn(cfg: &FakeVmmConfig) -> Self {
        Self::try_spawn(cfg).unwrap_or_else(|line| panic!("fake VMM said {line:?}"))
    }

    /// Starts a fake VMM; `Err(its first line)` when it did not get ready
    /// (an ivshmem server refused it: `ivshmem-refused WHY`).
    pub fn try_spawn(cfg: &FakeVmmConfig) -> Result<Self, String> {
        let as_another_user = cfg.user.is_some() || !cfg.wrapper.is_empty();
        let bin = if as_another_user {
            bin_for_anyone("pvsched-fake-vmm")
        } else {
            workspace_bin("pvsched-fake-vmm")
        };
        let mut cmd = match cfg.wrapper.split_first() {
            Some((prog, args)) => {
                let mut c = Command::new(prog);
                c.args(args).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        if !cfg.region.as_os_str().is_empty() {
            cmd.arg(format!("mem-path={}", cfg.region.display()));
        }
        if let Some(i) = &cfg.ivshmem {
            cmd.arg("--ivshmem-server").arg(&i.socket);
            if let Some(n) = &i.name {
                cmd.args(["-name", &format!("{n},debug-threads=on")]);
            }
            if let Some(ms) = i.ring_every_ms {
                cmd.args(["--ring-every-ms", &ms.to_string()]);
            }
            if i.garbage {
                cmd.arg("--ivshmem-garbage");
            }
            if i.no_read {
                cmd.arg("--ivshmem-no-read");
            }
        }
        cmd.arg("--vcpus")
            .arg(cfg.vcpus.to_string())
            .arg("--name-format")
            .arg(&cfg.name_format);
        if let Some(p) = cfg.guest_fifo {
            cmd.arg("--guest-fifo").arg(p.to_string());
        }
        if let Some(f) = cfg.guest_cs {
            cmd.arg("--guest-cs").arg(f.to_string());
        }
        if let Some((hold, period)) = cfg.guest_cs_duty {
            cmd.args(["--guest-cs-duty", &format!("{hold}/{period}")]);
        }
        if let Some(p) = cfg.guest_pending {
            cmd.args(["--guest-pending", &p.to_string()]);
        }
        if cfg.guest_rt_bursts {
            cmd.arg("--guest-rt-bursts");
        }
        if let Some((w, h)) = cfg.guest_lock_wait {
            cmd.args(["--guest-lock-wait", &format!("{w}={h}")]);
        }
        if let Some(n) = cfg.spin_first {
            cmd.args(["--spin-first", &n.to_string()]);
        } else if cfg.spin {
            cmd.arg("--spin");
        }
        if cfg.no_map {
            cmd.arg("--no-map");
        }
        if let Some(q) = &cfg.qmp {
            cmd.arg("--qmp").arg(q);
        }
        if let Some(t) = &cfg.qmp_tids {
            let list: Vec<String> = t.iter().map(i64::to_string).collect();
            cmd.arg("--qmp-tids").arg(list.join(","));
        }
        if let Some((uid, gid)) = cfg.user {
            // As root, std also drops the supplementary groups (setgroups)
            // before it switches to `uid`.
            cmd.uid(uid).gid(gid);
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
        // ETXTBSY: another test thread forked while the binary's copy was
        // still open for writing; the child closes it at its exec. Retry.
        let mut tries = 0;
        let mut child = loop {
            match cmd.spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                r => break r.expect("start pvsched-fake-vmm"),
            }
        };
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("fake VMM ready line");
        let mut words = line.split_whitespace();
        if words.next() != Some("ready") {
            // SAFETY: kill(2) of our own child, not yet reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            let _ = child.wait();
            return Err(line);
        }
        let pid = words.next().and_then(|p| p.parse().ok()).expect("pid");
        let tids = words.filter_map(|t| t.parse().ok()).collect();
        Ok(FakeVmm { child, pid, tids })
    }

    /// The process we started (a wrapper, or the VMM itself).
    pub fn child_pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Kills the VMM (and the wrapper, if any) and reaps our child.
    pub fn kill(&mut self) {
        // SAFETY: kill(2) of the VMM, which is our child or our child's, and
        // of our own child; both not yet reaped by us.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::kill(self.child.id() as i32, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

impl Drop for FakeVmm {
    fn drop(&mut self) {
        self.kill();
    }
}
