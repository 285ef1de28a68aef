//! Booting the host VM and running commands in it; telling its own failures
//! (emulation: a dead QEMU, a hung kernel, a known fault) from results.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pvsched_vmtest::{Accel, GuestImage, GuestProcess, RegionSetup, Vm, VmConfig};

use crate::error::{io_err, Error, Result};
use crate::initramfs::{self, INIT_FAILED};
use crate::packages::Packages;
use crate::virtiofsd::{Cache, Virtiofsd};

/// What to boot.
#[derive(Clone, Debug)]
pub struct HostVmConfig {
    /// Used in the VM's name and folder.
    pub name: String,
    /// vCPUs of the host VM [`default_cpus`].
    pub cpus: u32,
    pub memory_mb: u32,
    /// A folder of this machine mounted read-write at the same path in the
    /// host VM (results, logs); the rest of the file system is read-only.
    pub exchange: Option<PathBuf>,
    pub boot_timeout: Duration,
    /// Parameters of the `kvm_amd` module, e.g. `["npt=0"]`.
    pub kvm_amd_params: Vec<String>,
    /// The host VM CPUs KVM guests are confined to (pvsched-vmtest applies it
    /// to every QEMU it starts in the host VM), or `None` for all of them
    /// [`default_guest_cpus`].
    pub guest_cpus: Option<Vec<u32>>,
}

/// CPUs guests are confined to unless said otherwise: `$PVSCHED_HOSTVM_GUEST_CPUS`
/// (`all` for none), else CPU 0. Measured (README, "Emulation faults"): a guest
/// whose vCPUs ran on two CPUs of the host VM at once was reset by the emulation
/// within a minute of cyclictest; confined to one, it ran on.
pub fn default_guest_cpus() -> Option<Vec<u32>> {
    match std::env::var("PVSCHED_HOSTVM_GUEST_CPUS").ok().as_deref() {
        Some("all") => None,
        Some(v) => {
            let cpus: Vec<u32> = v.split(',').filter_map(|c| c.trim().parse().ok()).collect();
            Some(if cpus.is_empty() { vec![0] } else { cpus })
        }
        None => Some(vec![0]),
    }
}

/// vCPUs of a host VM unless said otherwise: `$PVSCHED_HOSTVM_CPUS`, else 2.
pub fn default_cpus() -> u32 {
    std::env::var("PVSCHED_HOSTVM_CPUS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| (1..=64).contains(n))
        .unwrap_or(2)
}

impl HostVmConfig {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            cpus: default_cpus(),
            memory_mb: 3072,
            exchange: None,
            boot_timeout: Duration::from_secs(300),
            kvm_amd_params: Vec::new(),
            guest_cpus: default_guest_cpus(),
        }
    }

    pub fn cpus(mut self, cpus: u32) -> Self {
        self.cpus = cpus;
        self
    }

    pub fn memory_mb(mut self, mb: u32) -> Self {
        self.memory_mb = mb;
        self
    }

    pub fn exchange(mut self, dir: &Path) -> Self {
        self.exchange = Some(dir.to_path_buf());
        self
    }
}

/// Kernel messages of the host VM that mean the emulation failed, not the
/// code under test: live text patching seen half-done by another vCPU of
/// multi-threaded TCG (`../shared/ENVIRONMENT.md`).
const EMULATION_FAULTS: [&str; 1] = ["Oops: int3"];

/// Kernel messages worth quoting when something fails in the host VM.
const KERNEL_TROUBLE: [&str; 7] = [
    "Oops",
    "BUG:",
    "soft lockup",
    "rcu_preempt detected stalls",
    "rcu: INFO",
    "Kernel panic",
    "hung_task",
];

/// How long a host VM that answers nothing may take for `true`.
const ALIVE_TIMEOUT: Duration = Duration::from_secs(60);

/// A running host VM. Dropping it kills QEMU and then the virtiofsd servers.
pub struct HostVm {
    // Field order is drop order: QEMU before the servers it is connected to.
    vm: Vm,
    _shares: Vec<Virtiofsd>,
    _dir: TempDir,
    packages: Packages,
    cpus: u32,
    boot_time: Duration,
}

/// A folder removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A script that runs the fetched QEMU with its own module directory: it
/// also searches the system's, and aborts on the system QEMU's modules
/// ("Only modules from the same build can be loaded"). A private mount
/// namespace lets it see its own there; every step execs, so the script's
/// PID is QEMU's.
fn qemu_wrapper(p: &Packages, dir: &Path) -> Result<PathBuf> {
    if let Some(q) = std::env::var_os("PVSCHED_HOSTVM_QEMU") {
        // Another QEMU, for comparing (it must be able to find its own modules).
        return Ok(PathBuf::from(q));
    }
    let script = format!(
        "#!/bin/sh\n\
         # pvsched-hostvm: QEMU {version}, with its own module directory\n\
         exec unshare -m /bin/sh -c 'mount --make-rprivate / && \
         if [ -d {sysmods} ]; then mount --bind \"$0\" {sysmods}; fi && \
         exec \"$@\"' '{mods}' '{qemu}' -L '{data}' -L /usr/share/seabios \"$@\"\n",
        version = p.qemu.version,
        sysmods = "/usr/lib/x86_64-linux-gnu/qemu",
        mods = p.qemu.modules.display(),
        qemu = p.qemu.binary.display(),
        data = p.qemu.data.display(),
    );
    let path = dir.join("qemu-hostvm");
    std::fs::write(&path, script).map_err(io_err(format!("writing {}", path.display())))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .map_err(io_err(format!("chmod {}", path.display())))?;
    Ok(path)
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl HostVm {
    /// Boots a host VM and waits until it serves commands.
    pub fn boot(cfg: &HostVmConfig) -> Result<Self> {
        let packages = Packages::locate()?;
        let work = crate::work_dir();
        let initrd = initramfs::build(&packages.kernel, &work)?;
        let dir = std::env::temp_dir().join(format!(
            "pvsched-hostvm-{}-{}-{}",
            cfg.name,
            std::process::id(),
            crate::next_serial()
        ));
        std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let dir = TempDir(dir);
        let wrapper = qemu_wrapper(&packages, &dir.0)?;
        let mut shares = vec![Virtiofsd::start(
            Path::new("/"),
            "root",
            Cache::Always,
            &dir.0,
        )?];
        let mut append = String::new();
        if let Some(x) = &cfg.exchange {
            let x = x
                .canonicalize()
                .map_err(io_err(format!("exchange folder {}", x.display())))?;
            let shown = x.display().to_string();
            if shown.contains(char::is_whitespace) || shown == "/" {
                return Err(Error::Other(format!(
                    "exchange folder {shown}: must be a folder without spaces, not /"
                )));
            }
            shares.push(Virtiofsd::start(&x, "xchg", Cache::None, &dir.0)?);
            append = format!("pvs_hostvm.xchg={shown}");
        }
        if let Some(cpus) = &cfg.guest_cpus {
            let list: Vec<String> = cpus.iter().map(u32::to_string).collect();
            append.push_str(&format!(" pvs_hostvm.guest_cpus={}", list.join(",")));
        }
        if !cfg.kvm_amd_params.is_empty() {
            append.push_str(&format!(
                " pvs_hostvm.kvm-amd={}",
                cfg.kvm_amd_params.join(",")
            ));
        }
        let mut extra = vec![
            "-object".to_string(),
            format!(
                "memory-backend-memfd,id=mem,size={}M,share=on",
                cfg.memory_mb
            ),
            "-numa".into(),
            "node,memdev=mem".into(),
        ];
        for (i, s) in shares.iter().enumerate() {
            extra.extend(s.qemu_args(i));
        }
        let image = GuestImage {
            kernel: packages.kernel.vmlinuz.clone(),
            kernel_release: packages.kernel.release.clone(),
            initramfs: initrd,
            module: None,
            dir: work,
        };
        let mut vcfg = VmConfig::new(image)
            .name(&format!("hostvm-{}", cfg.name))
            .smp(cfg.cpus)
            .memory_mb(cfg.memory_mb)
            .accel(Accel::Tcg)
            .region(RegionSetup::None)
            .boot_timeout(cfg.boot_timeout)
            .append(&append)
            .extra_args(extra);
        vcfg.qemu = Some(wrapper);
        // The host VM itself runs wherever this process may.
        vcfg.host_cpus = None;
        let started = Instant::now();
        let vm = match Vm::boot(vcfg) {
            Ok(vm) => vm,
            Err(e) => return Err(boot_failure(e)),
        };
        Ok(Self {
            vm,
            _shares: shares,
            _dir: dir,
            packages,
            cpus: cfg.cpus,
            boot_time: started.elapsed(),
        })
    }

    /// Runs `cmd` (one line of shell) as root in the host VM; its exit status
    /// and output. The host VM's own failure comes as [`Error::HostVmFailed`].
    pub fn exec(&self, cmd: &str, timeout: Duration) -> Result<(i32, String)> {
        // A host VM that does not even start the command is hung: told now,
        // not after the command's whole timeout (CI saw one CPU of it stop
        // answering IPIs, "Watchdog remote CPU 1 read timed out").
        match self
            .vm
            .exec_started_within(cmd, timeout, Some(ALIVE_TIMEOUT))
        {
            Ok(r) => Ok(r),
            Err(e) => Err(self.classify(e)),
        }
    }

    /// Like [`HostVm::exec`], failing on a non-zero status too.
    pub fn exec_ok(&self, cmd: &str, timeout: Duration) -> Result<String> {
        let (rc, out) = self.exec(cmd, timeout)?;
        if rc != 0 {
            return Err(Error::Other(format!(
                "in the host VM, `{cmd}` exited {rc}:\n{out}"
            )));
        }
        Ok(out)
    }

    /// Starts `cmd` in the background in the host VM.
    pub fn spawn(&self, cmd: &str) -> Result<GuestProcess> {
        self.vm.spawn(cmd).map_err(|e| self.classify(e))
    }

    /// The host VM's kernel messages so far.
    pub fn kernel_log(&self) -> String {
        self.vm.kernel_log()
    }

    pub fn packages(&self) -> &Packages {
        &self.packages
    }

    pub fn cpus(&self) -> u32 {
        self.cpus
    }

    /// From QEMU's start to the command prompt.
    pub fn boot_time(&self) -> Duration {
        self.boot_time
    }

    /// Why this host VM has failed, if it has: QEMU gone, a known emulation
    /// fault in its kernel log, or no answer to `true`.
    pub fn failure(&self) -> Option<String> {
        // SAFETY: kill with signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(self.vm.qemu_pid() as libc::pid_t, 0) } == 0;
        if !alive || !Path::new(&format!("/proc/{}", self.vm.qemu_pid())).exists() {
            return Some("QEMU exited".into());
        }
        let log = self.kernel_log();
        if let Some(f) = EMULATION_FAULTS.iter().find(|f| log.contains(**f)) {
            return Some(format!("kernel: {f} (an emulation fault)"));
        }
        match self.vm.exec("true", ALIVE_TIMEOUT) {
            Ok(_) => None,
            Err(e) => Some(format!(
                "no answer to `true` within {ALIVE_TIMEOUT:?} ({e})"
            )),
        }
    }

    /// Kernel log lines that say something went wrong in the host VM's kernel.
    pub fn kernel_trouble(&self) -> Vec<String> {
        self.kernel_log()
            .lines()
            .filter(|l| KERNEL_TROUBLE.iter().any(|t| l.contains(t)))
            .map(str::to_string)
            .collect()
    }

    fn classify(&self, e: pvsched_vmtest::Error) -> Error {
        match stalled(&e).or_else(|| self.failure()) {
            Some(reason) => Error::HostVmFailed {
                reason: format!("{reason}; while: {e}"),
                kernel_log: tail(&self.kernel_log(), 40),
            },
            None => Error::Vm(e),
        }
    }
}

/// Why `e` is by itself the host VM's failure: a command it did not even
/// start within [`ALIVE_TIMEOUT`] means it stalled that long, and what ran
/// in it meanwhile (a bench's measurement) is not to be trusted, even when
/// a `true` after is answered (a rogue run of 2026-11-28 ended there with a
/// harness error instead of running again).
fn stalled(e: &pvsched_vmtest::Error) -> Option<String> {
    matches!(e, pvsched_vmtest::Error::CommandNotStarted { .. })
        .then(|| "it stalled: a command did not start".to_string())
}

/// A boot that did not reach the prompt: the init's own failure is a set-up
/// problem; a timeout or a QEMU exit is the host VM's.
fn boot_failure(e: pvsched_vmtest::Error) -> Error {
    let text = e.to_string();
    if let Some(at) = text.find(INIT_FAILED) {
        let line = text[at + INIT_FAILED.len()..].lines().next().unwrap_or("");
        return Error::InitFailed(line.trim().to_string());
    }
    match e {
        pvsched_vmtest::Error::BootTimeout { .. } | pvsched_vmtest::Error::QemuExited { .. } => {
            Error::HostVmFailed {
                reason: "boot".into(),
                kernel_log: tail(&text, 40),
            }
        }
        other => Error::Vm(other),
    }
}

/// A failure of the host VM that was retried, for reports.
#[derive(Clone, Debug)]
pub struct Retried {
    pub attempt: usize,
    pub reason: String,
}

/// Runs `f` on a fresh host VM, booting another one (up to `attempts` in
/// all) when the host VM itself fails; every other error ends it at once.
/// Returns `f`'s value and the failures that were retried (callers report
/// them: a retried run is never silent).
pub fn with_retries<T>(
    cfg: &HostVmConfig,
    attempts: usize,
    mut f: impl FnMut(&HostVm) -> Result<T>,
) -> Result<(T, Vec<Retried>)> {
    let mut retried = Vec::new();
    let mut attempt = 1;
    loop {
        let outcome = HostVm::boot(cfg).and_then(|vm| f(&vm));
        match outcome {
            Ok(v) => return Ok((v, retried)),
            Err(e) if e.is_host_vm_failure() && attempt < attempts => {
                eprintln!(
                    "pvsched-hostvm: attempt {attempt} of {attempts}: {e}; booting another host VM"
                );
                retried.push(Retried {
                    attempt,
                    reason: e.to_string(),
                });
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_the_host_vm_did_not_start_is_its_failure_and_other_errors_are_not() {
        let not_started = pvsched_vmtest::Error::CommandNotStarted {
            vm: "hostvm".into(),
            command: "true".into(),
            within: ALIVE_TIMEOUT,
            console: String::new(),
        };
        assert!(stalled(&not_started).is_some());
        assert!(stalled(&pvsched_vmtest::Error::Other("exit 1".into())).is_none());
    }
}
