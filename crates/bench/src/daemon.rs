//! pvschedd as a child of the bench, for the pvsched modes: a generated
//! config serving exactly the bench VM, started per session, SIGTERMed after.
//! Its status comes over the control socket (`pvsched_control`), the same
//! request and reply `pvschedctl status --json` uses.

use std::fs::OpenOptions;
use std::os::fd::{BorrowedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pvsched_control::{Request, Response, Status, VmStatus};

use crate::error::{io, BenchError, Result};
use crate::harness::axes::Mode;
use std::collections::BTreeMap;

/// Name of the VM in the daemon's config and status.
pub const VM_NAME: &str = "bench";

/// How long one control-socket request may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// Where pvschedd is.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub pvschedd: PathBuf,
}

impl Binaries {
    /// `pvschedd` as given (default: next to this executable, i.e.
    /// `target/release/pvschedd`). Errors name the build command.
    pub fn locate(pvschedd: Option<&Path>) -> Result<Binaries> {
        let here = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from("."));
        let d = pvschedd
            .map(Path::to_path_buf)
            .unwrap_or_else(|| here.join("pvschedd"));
        if !d.is_file() {
            return Err(BenchError::Missing {
                what: format!("pvsched mode: {}", d.display()),
                hint: "build it with `cargo build --release -p pvsched-host`, point --pvschedd \
                       at pvschedd, or leave the mode out (--modes vanilla,static-rt)"
                    .into(),
            });
        }
        Ok(Binaries { pvschedd: d })
    }
}

/// How pvschedd finds the VM's vCPU threads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Locator {
    /// QMP `query-cpus-fast` on this socket (the default).
    Qmp(PathBuf),
    /// Thread names (`CPU n/TCG`) of this QEMU process: no QMP needed.
    Pid(u32),
}

/// Sections of pvschedd's config that `--pvschedd-config` may set: the
/// daemon's knobs and the default limits. Discovery and the VM entry stay
/// the bench's own.
pub const OVERLAY_SECTIONS: [&str; 2] = ["daemon", "defaults"];

/// Reads a `--pvschedd-config` file: TOML with only `[daemon]` and
/// `[defaults]` tables. pvschedd itself validates the keys and values when
/// it starts.
pub fn read_overlay(path: &Path) -> Result<toml::Table> {
    let what = format!("--pvschedd-config {}", path.display());
    let text = std::fs::read_to_string(path).map_err(io(what.clone()))?;
    parse_overlay(&what, &text)
}

/// The overlay in `text`; errors start with `what` (the option and file).
fn parse_overlay(what: &str, text: &str) -> Result<toml::Table> {
    let t: toml::Table = text.parse().map_err(|source| BenchError::Toml {
        what: what.to_string(),
        source,
    })?;
    for (k, v) in &t {
        if !OVERLAY_SECTIONS.contains(&k.as_str()) {
            return Err(BenchError::Usage(format!(
                "{what}: `{k}`: only the tables [{}] may be set (the bench serves its own VM)",
                OVERLAY_SECTIONS.join("], [")
            )));
        }
        if !v.is_table() {
            return Err(BenchError::Usage(format!("{what}: `{k}` must be a table")));
        }
    }
    Ok(t)
}

/// One VM pvschedd is to serve: its `[[vm]]` entry, and how many vCPU
/// threads its status must show before the bench measures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmEntry {
    pub name: String,
    pub region: PathBuf,
    pub locator: Locator,
    pub vcpus: usize,
    /// The eventfd the VM's guest rings (an `ivshmem-doorbell` VM, which the
    /// bench serves and which outlives the daemon), handed to pvschedd as
    /// `--doorbell NAME=FD`.
    pub doorbell: Option<RawFd>,
}

/// `overlay` (`--pvschedd-config`) with `[daemon] backend` set to `mode`'s
/// backend (for the pvsched modes), and `[defaults] honor_lock_holders` where
/// the mode sets it.
pub fn overlay_for(overlay: &toml::Table, mode: Mode) -> toml::Table {
    let mut out = overlay.clone();
    if let Some(backend) = mode.backend() {
        overlay_set(&mut out, "daemon", "backend", backend.into());
    }
    if let Some(honor) = mode.honor_lock_holders() {
        overlay_set(&mut out, "defaults", "honor_lock_holders", honor.into());
    }
    out
}

/// Sets `[table] key = value` in an overlay, over what it held (a mode's
/// value wins over `--pvschedd-config`'s).
pub fn overlay_set(overlay: &mut toml::Table, table: &str, key: &str, value: toml::Value) {
    let t = overlay
        .entry(table)
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if !t.is_table() {
        *t = toml::Value::Table(toml::Table::new());
    }
    if let toml::Value::Table(t) = t {
        t.insert(key.into(), value);
    }
}

/// The daemon config the bench generates: nothing but our VM, metrics off,
/// state and socket in the run directory, the rt backend; every policy knob
/// at its default unless `overlay` (from `--pvschedd-config`) sets it
/// (`[daemon] backend = "sched_ext"` for the sched_ext backend).
pub fn config_toml(run_dir: &Path, region: &Path, vm: &Locator, overlay: &toml::Table) -> String {
    let entry = VmEntry {
        name: VM_NAME.into(),
        region: region.to_path_buf(),
        locator: vm.clone(),
        vcpus: 0,
        doorbell: None,
    };
    config_toml_vms(run_dir, &[entry], overlay)
}

/// [`config_toml`] for several VMs: one `[[vm]]` entry each, in order.
pub fn config_toml_vms(run_dir: &Path, vms: &[VmEntry], overlay: &toml::Table) -> String {
    let s = |p: &Path| toml::Value::String(p.display().to_string());
    let mut daemon = toml::Table::new();
    daemon.insert("metrics".into(), "off".into());
    // The rt backend unless the overlay names another: the `pvsched` mode's
    // figures stay comparable across kernels with and without sched_ext.
    daemon.insert("backend".into(), "rt".into());
    let mut discovery = toml::Table::new();
    discovery.insert("auto".into(), false.into());
    let entries: Vec<toml::Value> = vms
        .iter()
        .map(|vm| {
            let mut entry = toml::Table::new();
            entry.insert("name".into(), vm.name.clone().into());
            entry.insert("region".into(), s(&vm.region));
            match &vm.locator {
                Locator::Qmp(p) => entry.insert("qmp".into(), s(p)),
                Locator::Pid(pid) => entry.insert("pid".into(), i64::from(*pid).into()),
            };
            entry.into()
        })
        .collect();
    let mut defaults = toml::Table::new();
    for (section, table) in [("daemon", &mut daemon), ("defaults", &mut defaults)] {
        if let Some(toml::Value::Table(o)) = overlay.get(section) {
            table.extend(o.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }
    // The state file and socket are the bench's: it reads them.
    daemon.insert("state_file".into(), s(&run_dir.join("pvschedd-state.json")));
    daemon.insert("control_socket".into(), s(&run_dir.join("pvschedd.sock")));
    let mut root = toml::Table::new();
    root.insert("daemon".into(), daemon.into());
    root.insert("discovery".into(), discovery.into());
    if !defaults.is_empty() {
        root.insert("defaults".into(), defaults.into());
    }
    root.insert("vm".into(), toml::Value::Array(entries));
    format!(
        "# Generated by pvsched-bench: serve only the bench's VM{}{}.\n{root}",
        if vms.len() == 1 { "" } else { "s" },
        if overlay.is_empty() {
            ", defaults otherwise"
        } else {
            ", with --pvschedd-config's settings"
        }
    )
}

/// Whether the daemon's status shows our VM with `vcpus` vCPU threads
/// known; returns the VM's entry then.
pub fn served_vm(status: &Status, vcpus: usize) -> Option<&VmStatus> {
    served(status, VM_NAME, vcpus)
}

/// Whether the daemon's status shows the VM `name` with `vcpus` vCPU
/// threads known; returns the VM's entry then.
/// How long [`Daemon::start_vms`] waits for the guests to bind to the
/// regions pvschedd initialized (the module looks once a second).
const GUEST_BIND_WAIT: Duration = Duration::from_secs(5);

pub fn served<'a>(status: &'a Status, name: &str, vcpus: usize) -> Option<&'a VmStatus> {
    let vm = status.vms.iter().find(|v| v.name == name)?;
    let known = vm.vcpus.iter().filter(|c| c.tid > 0).count();
    (known >= vcpus).then_some(vm)
}

/// The `[[vm]]` entry of the bench's one VM for pvschedd in `mode`:
/// `vm_doorbell`, the eventfd of an `ivshmem-doorbell` VM, only where the
/// mode hands it over (not in `pvsched-timer`, which serves the same VM on
/// its recheck timer).
pub fn bench_vm_entry(
    mode: Mode,
    region: &Path,
    locator: &Locator,
    vcpus: usize,
    vm_doorbell: Option<RawFd>,
) -> VmEntry {
    VmEntry {
        name: VM_NAME.into(),
        region: region.to_path_buf(),
        locator: locator.clone(),
        vcpus,
        doorbell: vm_doorbell.filter(|_| mode.hands_doorbell()),
    }
}

/// pvschedd's command line for `config` serving `vms`: `--config`, and
/// `--doorbell NAME=FD` for each VM with a doorbell, its eventfd set up to
/// be passed as FD (10 on) when the command is spawned.
fn pvschedd_command(pvschedd: &Path, config: &Path, vms: &[VmEntry]) -> Command {
    let mut cmd = Command::new(pvschedd);
    cmd.arg("--config").arg(config);
    for (i, (name, fd)) in vms
        .iter()
        .filter_map(|v| Some((&v.name, v.doorbell?)))
        .enumerate()
    {
        let target = 10 + i as RawFd;
        // SAFETY: a VmEntry's doorbell is the eventfd of a Vm the bench
        // keeps open for the whole run (a test's descriptor outlives its
        // command), so it is open when this command is spawned.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        pvsched_base::ivshmem::pass_fd(&mut cmd, fd, target);
        cmd.arg("--doorbell").arg(format!("{name}={target}"));
    }
    cmd
}

/// A running pvschedd.
pub struct Daemon {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
    started: Instant,
}

impl Daemon {
    /// Starts pvschedd and waits until it serves the VM with all its vCPUs.
    pub fn start(
        bins: &Binaries,
        run_dir: &Path,
        region: &Path,
        vm: &Locator,
        vcpus: usize,
        overlay: &toml::Table,
        doorbell: Option<RawFd>,
    ) -> Result<Daemon> {
        let entry = VmEntry {
            name: VM_NAME.into(),
            region: region.to_path_buf(),
            locator: vm.clone(),
            vcpus,
            doorbell,
        };
        Daemon::start_vms(bins, run_dir, &[entry], overlay)
    }

    /// Starts pvschedd serving `vms` and waits until it serves each of them
    /// with all its vCPUs.
    pub fn start_vms(
        bins: &Binaries,
        run_dir: &Path,
        vms: &[VmEntry],
        overlay: &toml::Table,
    ) -> Result<Daemon> {
        let config = run_dir.join("pvschedd.toml");
        std::fs::write(&config, config_toml_vms(run_dir, vms, overlay))
            .map_err(io(format!("writing {}", config.display())))?;
        let socket = run_dir.join("pvschedd.sock");
        let _ = std::fs::remove_file(&socket);
        let log = run_dir.join("pvschedd.log");
        let err = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(io(format!("opening {}", log.display())))?;
        let mut cmd = pvschedd_command(&bins.pvschedd, &config, vms);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(
                err.try_clone()
                    .map_err(io(format!("duplicating {}", log.display())))?,
            ))
            .stderr(Stdio::from(err));
        let child = pvsched_vmtest::spawn_tied(cmd)
            .map_err(io(format!("starting {}", bins.pvschedd.display())))?;
        let mut d = Daemon {
            child,
            socket,
            log,
            started: Instant::now(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(s)) = d.child.try_wait() {
                return Err(BenchError::Daemon(format!(
                    "pvschedd exited during start-up ({s}); its log ({}):\n{}",
                    d.log.display(),
                    d.log_tail()
                )));
            }
            if let Ok(st) = d.status() {
                if vms.iter().all(|v| served(&st, &v.name, v.vcpus).is_some()) {
                    d.wait_guests_bound(vms);
                    return Ok(d);
                }
            }
            if Instant::now() >= deadline {
                let last = match d.status() {
                    Ok(st) => serde_json::to_string(&st).unwrap_or_default(),
                    Err(e) => e.to_string(),
                };
                d.stop_quietly();
                let wanted = vms
                    .iter()
                    .map(|v| format!("VM {:?} with {} vCPUs", v.name, v.vcpus))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(BenchError::Daemon(format!(
                    "pvschedd is not serving {wanted} after 30 s \
                     (last status: {last}); its log ({}):\n{}",
                    d.log.display(),
                    d.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Waits, up to [`GUEST_BIND_WAIT`], until every VM's guest is bound to
    /// the region as pvschedd initialized it: a daemon whose offered
    /// features differ from the last one's re-initializes the region, and
    /// the guest module notices within about a second. A window started
    /// before would measure the guest unbound (its lock counters unread, in
    /// the lock scenario: LH5). A guest without the module never binds:
    /// the wait then ends at the bound, as the run would have gone on.
    fn wait_guests_bound(&self, vms: &[VmEntry]) {
        let deadline = Instant::now() + GUEST_BIND_WAIT;
        while Instant::now() < deadline {
            let bound = self.status().is_ok_and(|st| {
                vms.iter().all(|v| {
                    st.vms
                        .iter()
                        .find(|s| s.name == v.name)
                        .is_some_and(|s| s.guest_bound)
                })
            });
            if bound {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Time since it was started (its counters start with it).
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The daemon's status, over its control socket (what
    /// `pvschedctl status --json` prints).
    /// The daemon's Prometheus text, over its control socket.
    pub fn metrics_text(&self) -> Result<String> {
        let reply = pvsched_control::call(&self.socket, &Request::Metrics, CONTROL_TIMEOUT)
            .map_err(|source| BenchError::Control {
                what: "pvschedd metrics".into(),
                source,
            })?;
        match reply {
            Response::Metrics { text } => Ok(text),
            other => Err(BenchError::Daemon(format!(
                "pvschedd metrics: unexpected reply {other:?}"
            ))),
        }
    }

    pub fn status(&self) -> Result<Status> {
        let reply = pvsched_control::call(&self.socket, &Request::Status, CONTROL_TIMEOUT)
            .map_err(|source| BenchError::Control {
                what: "pvschedd status".into(),
                source,
            })?;
        match reply {
            Response::Status(s) => Ok(*s),
            Response::Error { message } => {
                Err(BenchError::Daemon(format!("pvschedd status: {message}")))
            }
            other => Err(BenchError::Daemon(format!(
                "pvschedd status: unexpected reply {other:?}"
            ))),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stop_quietly(&mut self) {
        // SAFETY: kill(2) of our own child, not yet reaped.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: as above.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait (SIGKILL after 10 s); an error if it did not exit
    /// cleanly.
    pub fn stop(mut self) -> Result<()> {
        // SAFETY: kill(2) of our own child, not yet reaped.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) if s.success() => return Ok(()),
                Ok(Some(s)) => {
                    return Err(BenchError::Daemon(format!(
                        "pvschedd exited with {s} on SIGTERM; log:\n{}",
                        self.log_tail()
                    )))
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    self.stop_quietly();
                    return Err(BenchError::Daemon(
                        "pvschedd ignored SIGTERM for 10 s: killed".into(),
                    ));
                }
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop_quietly();
        }
    }
}

/// Copies pvschedd into the run directory: the run then uses one binary
/// from start to end, even if someone rebuilds target/release meanwhile.
pub(crate) fn pin_daemon(bins: Binaries, run_dir: &Path) -> Result<(Binaries, String)> {
    let copy = run_dir.join("pvschedd");
    std::fs::copy(&bins.pvschedd, &copy).map_err(io(format!(
        "copying {} to {}",
        bins.pvschedd.display(),
        copy.display()
    )))?;
    let modified = std::fs::metadata(&bins.pvschedd)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| {
            let secs = d.as_secs() as libc::time_t;
            // SAFETY: libc::tm is plain data: all-zero is a valid value.
            let mut tm: libc::tm = unsafe { std::mem::zeroed() };
            // SAFETY: localtime_r(3) with valid pointers.
            unsafe { libc::localtime_r(&secs, &mut tm) };
            format!(
                "{:04}-{:02}-{:02} {:02}:{:02}",
                tm.tm_year + 1900,
                tm.tm_mon + 1,
                tm.tm_mday,
                tm.tm_hour,
                tm.tm_min
            )
        })
        .unwrap_or_else(|| "?".into());
    let what = format!("`{}` (built {modified})", bins.pvschedd.display());
    Ok((Binaries { pvschedd: copy }, what))
}

/// The daemon counters a session keeps (`SessionRun::daemon_counters`):
/// (key, Prometheus sample name).
pub const DAEMON_COUNTERS: [(&str, &str); 9] = [
    (
        "wakeups_records",
        "pvsched_wakeups_total{cause=\"records\"}",
    ),
    ("wakeups_timer", "pvsched_wakeups_total{cause=\"timer\"}"),
    (
        "wakeups_doorbell",
        "pvsched_wakeups_total{cause=\"doorbell\"}",
    ),
    ("doorbell_rings", "pvsched_doorbell_rings_total"),
    ("bpf_records", "pvsched_bpf_records"),
    ("bpf_lazy_records", "pvsched_bpf_lazy_records"),
    (
        "events_preempted",
        "pvsched_events_total{kind=\"preempted\"}",
    ),
    ("events_woken", "pvsched_events_total{kind=\"woken\"}"),
    (
        "events_interrupt_targeted",
        "pvsched_events_total{kind=\"interrupt_targeted\"}",
    ),
];

/// The [`DAEMON_COUNTERS`] present in pvschedd's Prometheus text `text`, by key.
pub fn daemon_counters(text: &str) -> BTreeMap<String, f64> {
    DAEMON_COUNTERS
        .iter()
        .filter_map(|(key, name)| Some((key.to_string(), prometheus_value(text, name)?)))
        .collect()
}

/// The value of the sample `name` (with its labels, as printed) in the
/// Prometheus text `text`.
pub fn prometheus_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.strip_prefix(name))
        .find_map(|rest| rest.strip_prefix(' ')?.trim().parse().ok())
}

/// The cumulative buckets of the Prometheus histogram `name` in `text`
/// (`NAME_bucket{le="X"} N` lines), in order, `+Inf` (`None`) last; empty if
/// absent.
pub fn prometheus_buckets(text: &str, name: &str) -> Vec<(Option<f64>, u64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut out: Vec<(Option<f64>, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .filter_map(|rest| {
            let (le, count) = rest.split_once("\"}")?;
            let le = match le {
                "+Inf" => None,
                v => Some(v.parse().ok()?),
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    out.sort_by(|a, b| {
        a.0.unwrap_or(f64::INFINITY)
            .total_cmp(&b.0.unwrap_or(f64::INFINITY))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_names_only_the_bench_vm_with_metrics_off() {
        // Act
        let t = config_toml(
            Path::new("/r"),
            Path::new("/tmp/x/region"),
            &Locator::Qmp("/tmp/x/qmp.sock".into()),
            &toml::Table::new(),
        );

        // Assert
        assert!(t.contains("metrics = \"off\""));
        assert!(t.contains("auto = false"));
        assert!(t.contains("region = \"/tmp/x/region\""));
        assert!(t.contains("qmp = \"/tmp/x/qmp.sock\""));
        assert!(t.contains("control_socket = \"/r/pvschedd.sock\""));
        assert_eq!(t.matches("[[vm]]").count(), 1);
        assert!(!t.contains("[defaults]"));
    }

    #[test]
    fn overlay_sets_daemon_and_defaults_but_not_the_socket() {
        // Arrange
        let o = parse_overlay(
            "o.toml",
            "[daemon]\nboost_latency_path = false\ncontrol_socket = \"/elsewhere\"\n\
             [defaults]\nproactive_wake = false\n",
        )
        .unwrap();

        // Act
        let t = config_toml(Path::new("/r"), Path::new("/x"), &Locator::Pid(1), &o);

        // Assert
        let parsed: toml::Table = t.parse().unwrap();
        assert_eq!(
            parsed["daemon"]["boost_latency_path"].as_bool(),
            Some(false)
        );
        assert_eq!(parsed["defaults"]["proactive_wake"].as_bool(), Some(false));
        assert_eq!(
            parsed["daemon"]["control_socket"].as_str(),
            Some("/r/pvschedd.sock")
        );
        assert_eq!(parsed["discovery"]["auto"].as_bool(), Some(false));
    }

    #[test]
    fn overlay_refuses_other_sections() {
        let e = parse_overlay("o.toml", "[discovery]\nauto = true\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("o.toml: `discovery`: only the tables"),
            "{e}"
        );
        assert!(parse_overlay("o.toml", "daemon = 3\n").is_err());
        let e = parse_overlay("o.toml", "[daemon\n").unwrap_err();
        assert!(matches!(e, BenchError::Toml { .. }), "{e}");
    }

    #[test]
    fn config_for_two_vms_has_one_entry_each_in_order() {
        // Arrange
        let vm = |name: &str, locator: Locator| VmEntry {
            name: name.into(),
            region: format!("/x/{name}/region").into(),
            locator,
            vcpus: 2,
            doorbell: None,
        };

        // Act
        let t = config_toml_vms(
            Path::new("/r"),
            &[
                vm("bench", Locator::Qmp("/x/bench/qmp.sock".into())),
                vm("rogue", Locator::Pid(77)),
            ],
            &toml::Table::new(),
        );

        // Assert
        let parsed: toml::Table = t.parse().unwrap();
        let vms = parsed["vm"].as_array().unwrap();
        assert_eq!(vms.len(), 2);
        assert_eq!(vms[0]["name"].as_str(), Some("bench"));
        assert_eq!(vms[0]["qmp"].as_str(), Some("/x/bench/qmp.sock"));
        assert_eq!(vms[1]["name"].as_str(), Some("rogue"));
        assert_eq!(vms[1]["region"].as_str(), Some("/x/rogue/region"));
        assert_eq!(vms[1]["pid"].as_integer(), Some(77));
        assert!(t.starts_with("# Generated by pvsched-bench: serve only the bench's VMs,"));
    }

    #[test]
    fn served_needs_the_named_vm_with_every_vcpu_thread() {
        let st = status("rogue", &[10, 11]);
        assert!(served(&st, "rogue", 2).is_some());
        assert!(served(&st, "bench", 2).is_none());
        assert!(served(&st, "rogue", 3).is_none());
    }

    #[test]
    fn config_by_pid_names_no_qmp_socket() {
        let t = config_toml(
            Path::new("/r"),
            Path::new("/x"),
            &Locator::Pid(4242),
            &toml::Table::new(),
        );
        assert!(t.contains("pid = 4242"));
        assert!(!t.contains("qmp"));
    }

    /// A status with one VM `name` whose vCPU threads are `tids` (0: not found).
    fn status(name: &str, tids: &[i32]) -> Status {
        // From JSON with only the fields without a default: the control
        // crate's counters added since (serde defaults) need no change here.
        let vcpu = |(index, &tid): (usize, &i32)| -> pvsched_control::VcpuStatus {
            let params = pvsched_base::sched::ThreadParams::other(0);
            serde_json::from_value(serde_json::json!({
                "index": index, "tid": tid, "params": params, "reason": "none",
                "throttled": false, "host_status": "running", "guest_policy": 0,
                "guest_rt_priority": 0, "guest_cs_flags": 0, "boosts": 0, "throttles": 0,
                "boosted_ms": 0.0
            }))
            .expect("a vCPU status")
        };
        Status {
            pid: 1,
            uptime_s: 1.0,
            event_source: "bpf".into(),
            dropped_events: 0,
            backend: Default::default(),
            vms: vec![VmStatus {
                name: name.into(),
                tgid: 100,
                accel: "tcg".into(),
                region: "/x".into(),
                generation: 1,
                guest_bound: true,
                doorbell: false,
                in_debt: false,
                debt_ms: 0.0,
                boosts: 0,
                throttles: 0,
                clamped_inputs: 0,
                boosted_s: 0.0,
                budget_ms: 0.0,
                budget_max_ms: 0.0,
                cs_budget_ms: 0.0,
                cs_debt_ms: 0.0,
                cs_latched_vcpus: 0,
                over_budget: 0,
                locks: Default::default(),
                boosted_ms_by_reason: Default::default(),
                demoted_ms: 0.0,
                budget_latches: 0,
                budget_latched_ms: 0.0,
                vcpus: tids.iter().enumerate().map(vcpu).collect(),
                latency_path: vec![],
            }],
        }
    }

    #[test]
    fn pvsched_timer_s_pvschedd_gets_no_doorbell_while_pvsched_s_does() {
        // Arrange: any open descriptor stands for the VM's eventfd (the
        // command is built, not spawned).
        let eventfd = std::fs::File::open("/dev/null").unwrap();
        let vm_doorbell = Some(std::os::fd::AsRawFd::as_raw_fd(&eventfd));
        let args = |mode: Mode| -> Vec<String> {
            let entry = bench_vm_entry(
                mode,
                Path::new("/x/region"),
                &Locator::Pid(7),
                2,
                vm_doorbell,
            );
            pvschedd_command(
                Path::new("/r/pvschedd"),
                Path::new("/r/pvschedd.toml"),
                &[entry],
            )
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
        };

        // Act
        let (with, without) = (args(Mode::Pvsched), args(Mode::PvschedTimer));

        // Assert
        assert_eq!(
            with,
            ["--config", "/r/pvschedd.toml", "--doorbell", "bench=10"]
        );
        assert_eq!(without, ["--config", "/r/pvschedd.toml"]);
        assert_eq!(args(Mode::PvschedScx), with);
    }

    #[test]
    fn pvsched_scx_lock_honours_lock_holders_on_sched_ext_and_pvsched_scx_keeps_the_config() {
        // Arrange: a user config that turns lock holders off and names rt.
        let user: toml::Table = "[daemon]\nbackend = \"rt\"\n[defaults]\nhonor_lock_holders = \
                                 false\nboost_priority = 9\n"
            .parse()
            .unwrap();
        let key = |t: &toml::Table, table: &str, key: &str| t[table][key].clone();

        // Act
        let lock = overlay_for(&user, Mode::PvschedScxLock);
        let plain = overlay_for(&user, Mode::PvschedScx);

        // Assert: the mode's backend and lock handling win; the rest is kept.
        assert_eq!(key(&lock, "daemon", "backend"), "sched_ext".into());
        assert_eq!(key(&lock, "defaults", "honor_lock_holders"), true.into());
        assert_eq!(key(&lock, "defaults", "boost_priority"), 9.into());
        assert_eq!(key(&plain, "daemon", "backend"), "sched_ext".into());
        assert_eq!(key(&plain, "defaults", "honor_lock_holders"), false.into());
        assert!(overlay_for(&toml::Table::new(), Mode::PvschedScx)
            .get("defaults")
            .is_none());
    }

    #[test]
    fn a_vm_without_a_doorbell_gives_no_doorbell_argument_in_any_mode() {
        let entry = bench_vm_entry(Mode::Pvsched, Path::new("/x"), &Locator::Pid(7), 2, None);
        assert_eq!(entry.doorbell, None);
        let cmd = pvschedd_command(Path::new("p"), Path::new("c.toml"), &[entry]);
        assert!(!cmd.get_args().any(|a| a == "--doorbell"));
    }

    #[test]
    fn served_vm_needs_every_vcpu_thread() {
        assert!(served_vm(&status("bench", &[10, 11]), 2).is_some());
        assert!(served_vm(&status("bench", &[10, 0]), 2).is_none());
        assert!(served_vm(&status("x", &[1, 2]), 2).is_none());
    }
}
