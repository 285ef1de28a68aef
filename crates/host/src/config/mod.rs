//! pvschedd configuration: TOML, every key documented with its default in
//! `packaging/pvsched.toml`. Global defaults, then per-VM entries.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use pvsched_policy::{serving, Reason, VmLimits};
use serde::{Deserialize, Serialize};

pub use crate::backend::BackendChoice;
pub use crate::events::EventSourceKind;
use crate::events::{BpfOptions, PollOptions, SourceOptions};

mod limits;

pub use limits::{check_band, set_limit, LimitsConfig, PolicyList};

pub const DEFAULT_CONFIG_PATH: &str = "/etc/pvsched/pvsched.toml";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {key}: {msg}")]
    Invalid {
        path: String,
        key: String,
        msg: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {msg}")]
    Parse { path: String, msg: String },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonConfig {
    /// What the daemon boosted, so that a successor can restore it after a crash.
    pub state_file: PathBuf,
    /// Unix socket pvschedctl talks to.
    pub control_socket: PathBuf,
    /// Prometheus text metrics: "127.0.0.1:PORT", "unix:/path", or "off".
    pub metrics: String,
    pub event_source: EventSourceKind,
    /// Interval of the polling fallback, in microseconds.
    pub poll_interval_us: u64,
    /// Re-read interval of boosted vCPUs' slots (prompt unboost), microseconds.
    pub recheck_boosted_us: u64,
    /// Re-read interval of every slot (guests whose vCPUs the host never
    /// preempts still get their RT tasks mapped), microseconds.
    pub scan_interval_us: u64,
    /// A VM's guest doorbell (`--doorbell`) wakes the event thread at most once
    /// per this many µs: a guest ringing in a loop costs the host no more than
    /// the recheck timer would.
    pub doorbell_interval_us: u64,
    /// How often VMs are looked for (appearing / disappearing), milliseconds.
    pub discovery_interval_ms: u64,
    /// SCHED_FIFO priority of the event thread; must exceed every VM's
    /// max_rt_priority so that boosted vCPUs never delay their own unboost. Just
    /// above the boost band by default, below the host's own RT work.
    pub priority: u8,
    /// Lock the daemon's memory (no page faults on the event path).
    pub mlock: bool,
    /// Also boost VMM threads on the guest's latency path (TCG: QEMU's main
    /// loop delivers guest timers) while any vCPU of the VM is boosted.
    pub boost_latency_path: bool,
    /// The boost reasons (`pvsched_policy::Reason::BOOSTING` names) whose boosts
    /// the fair class carries instead of the RT band: the thread stays
    /// SCHED_OTHER, at `fair_boost_nice` with an EEVDF slice of
    /// `fair_boost_slice_us` (Linux >= 6.12), so that when it wakes its short
    /// slice wins the pick and preempts a longer-sliced task, and no boost moves
    /// it between classes: the RT class never pushes or pulls it across CPUs
    /// (the host-cost cause measured in BENCHMARKS.md). Empty: every boost is RT.
    pub fair_boost_reasons: Vec<String>,
    /// Carry every boost of a VM that ran no guest RT work within its
    /// `halt_boost_ns` in the fair class, whatever the reason: such a VM's
    /// boosts are for throughput (lock holders, message passing), which the
    /// fair class serves without the RT class's pushes (BENCHMARKS.md, "Boosts
    /// in the fair class"); a VM running RT work keeps the band's latency.
    pub fair_boost_without_rt_work: bool,
    /// Nice of a fair-class boost (-20..=19): its weight against the host's CFS tasks
    /// (in the same cpu cgroup: across cgroups only the slice counts).
    pub fair_boost_nice: i8,
    /// Slice of a fair-class boost, µs (100..=100000, what the kernel accepts).
    pub fair_boost_slice_us: u64,
    /// Let the BPF source queue the records that cannot change a decision
    /// now (e.g. those of a boosted vCPU that is re-read on a timer anyway)
    /// without waking the daemon; they are read at its next wakeup. Each
    /// wakeup saved is a context switch (and an IPI) on a host CPU.
    pub lazy_events: bool,
    /// With `lazy_events`: a vCPU thread woken while the CPU it last ran on is
    /// idle does not wake the daemon (it gets that CPU at once, a boost would
    /// change nothing); the record is read late, and starts no proactive boost.
    /// On an idle host this takes the daemon off every guest wake-up.
    pub quiet_idle_wakeups: bool,
    /// With `quiet_idle_wakeups`: also when *any* host CPU is idle and the vCPU
    /// thread may run on every CPU: the fair class's wakeup placement puts it on
    /// the idle CPU, where a boost would make it preempt whatever runs on its
    /// runqueue in place (measured, BENCHMARKS.md: a lone VM on an idle host lost
    /// a third of its throughput to boosts, part of it this way). For hosts with
    /// one LLC; switch it off on hosts with several.
    pub quiet_any_idle_wakeups: bool,
    /// Let the BPF programs flag a vCPU's preemptions, halts and wakeups that
    /// happen while no host CPU runs a task from outside its VM (each runs its
    /// idle task, pvschedd or a thread of the VM's own process), for the
    /// policy's `boost_only_against_rivals`. Costs a read of every CPU's line
    /// per such record, stopping at the first rival. Off: every record counts
    /// as having rivals.
    pub find_rivals: bool,
    /// With `find_rivals` and a VM's `boost_only_against_rivals`: while the VM
    /// has run no guest RT work within its `halt_boost_ns`, its vCPUs'
    /// preemptions and wakeups seen with no rival are queued without waking
    /// the daemon (they can start no boost then). A lone VM passing messages
    /// between its vCPUs woke it ~5000 times a second for nothing (BENCHMARKS.md,
    /// "Records without rivals"). Guest RT work that starts then is seen at the
    /// next read, within `scan_interval_us`.
    pub quiet_without_rivals: bool,
    /// Offer guests idle hints (ABI `F_IDLE_HINTS`: each vCPU's measured wake-up
    /// latency, for a guest idle driver that polls instead of halting when a
    /// wake-up costs more than the poll). Off: the guest's idle path is its own.
    pub offer_idle_hints: bool,
    /// The host counts as overloaded (`HF_OVERLOADED`: guests' idle drivers stop
    /// polling) while CPU pressure (PSI `some`, 10 s average) is above this, percent
    /// (default and rule: `pvsched_policy::serving`, which the simulator shares).
    pub overload_cpu_pressure_percent: f64,
    /// The kvm module's parameter directory, which `pvschedctl idle --apply host`
    /// writes `halt_poll_ns` into (and puts back).
    pub kvm_params_dir: PathBuf,
    /// Which mechanism carries boosts: `rt` (the RT class, `sched_setattr`),
    /// `sched_ext` (pvsched's own sched_ext scheduler for the whole host:
    /// boosted vCPUs dispatched first, a vCPU in a critical section extended
    /// at its slice end; the daemon does not start without it) or `auto`
    /// (sched_ext where the kernel has it and it loads, else rt). When the
    /// kernel ends the scheduler the daemon falls back to rt.
    pub backend: BackendChoice,
    /// sched_ext backend: the time slice of every fair-class task, µs.
    pub scx_slice_us: u64,
    /// sched_ext backend: the extension a vCPU whose guest is in a critical
    /// section gets at a slice end, µs (one per slice; 0: none).
    pub scx_extension_us: u64,
    /// sched_ext backend: while a vCPU runs an extension, its slot is read
    /// again every this many µs, and the extension ends at the first read
    /// that finds the guest out of its critical section (preempted at a
    /// lock-free point, and charged for what it ran); 0: every extension
    /// runs its whole length.
    pub scx_extension_poll_us: u64,
    /// sched_ext backend: a vCPU whose guest still holds a sleeping lock
    /// when its extension runs out goes on for at most this many µs more
    /// (within the same allowance), its slot read every
    /// `scx_extension_tail_poll_us`, and is preempted at the first read
    /// that finds it out of its locks: a holder that takes lock after lock
    /// is out of them for tens of µs at a time, which a read every 250 µs
    /// rarely finds. Needs the poll; 0: none.
    pub scx_extension_tail_us: u64,
    /// sched_ext backend: how often a tail reads the slot, µs.
    pub scx_extension_tail_poll_us: u64,
    /// sched_ext backend: a woken task preempts the fair-class task running
    /// on its CPU when that one's virtual time is ahead of its own by more
    /// than this, µs at nice 0 (the fair class's wakeup granularity, 1000);
    /// 0 (the default): never, a woken task waits for the running one's
    /// slice to end. Off by default: in the host VM it sent ~20x the IPIs
    /// (BENCHMARKS.md, K7).
    pub scx_wakeup_preempt_us: u64,
    /// sched_ext backend: extensions may take at most this share of a vCPU's
    /// time, permille, plus a burst of two extensions and a scan interval's
    /// share (the allowance is raised at each scan).
    pub scx_extension_share_permille: u32,
    /// sched_ext backend: the scan interval, µs, in place of
    /// `scan_interval_us`. The scheduler decides boosts itself there; the
    /// scan charges what it spent and renews its allowance, so a VM may
    /// overdraw its budget by at most this much per vCPU. 200 ms: each
    /// wakeup of the daemon costs the host CPU time and an IPI or two, and
    /// the scheduler needs none in between (BENCHMARKS C4).
    pub scx_scan_interval_us: u64,
    /// sched_ext backend: a vCPU that wakes while another vCPU of its VM
    /// runs on the CPU it would queue on goes to a CPU that runs none of
    /// them (when one exists it may run on): two vCPUs of a VM sharing a
    /// CPU take turns, and a lock holder among them waits off its CPU while
    /// its waiter runs (BENCHMARKS.md, LH15). Off by default: LH16 showed
    /// no gain beyond the spread of its repeats.
    pub scx_spread_vm_vcpus: bool,
    /// sched_ext backend: a lock holder's guest that accepts
    /// `F_EXT_NOTICE` is shown the extension it runs on (its slot, written
    /// at each entry to the guest) and ends it itself, yielding at its next
    /// point out of its locks: preempted between two locks instead of
    /// inside the next one. Needs the kvm module loaded.
    pub scx_guest_yield: bool,
}

impl DaemonConfig {
    /// The sched_ext scheduler's tunables.
    pub fn sched_ext_options(&self) -> crate::backend::SchedExtOptions {
        crate::backend::SchedExtOptions {
            slice_ns: self.scx_slice_us * 1000,
            extension_ns: self.scx_extension_us * 1000,
            extension_poll_ns: self.scx_extension_poll_us * 1000,
            extension_tail_ns: self.scx_extension_tail_us * 1000,
            extension_tail_poll_ns: self.scx_extension_tail_poll_us * 1000,
            wakeup_preempt_ns: self.scx_wakeup_preempt_us * 1000,
            spread_vm_vcpus: self.scx_spread_vm_vcpus,
            guest_yield: self.scx_guest_yield,
            ..Default::default()
        }
    }

    /// The event source's options.
    pub fn source_options(&self) -> SourceOptions {
        SourceOptions {
            kind: self.event_source,
            bpf: BpfOptions {
                lazy_wakeup: self.lazy_events,
                quiet_idle_wakeups: self.quiet_idle_wakeups,
                quiet_any_idle_wakeups: self.quiet_any_idle_wakeups,
                find_rivals: self.find_rivals,
                ..BpfOptions::default()
            },
            poll: PollOptions {
                interval: std::time::Duration::from_micros(self.poll_interval_us.max(1)),
            },
        }
    }
}

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            state_file: "/run/pvsched/state.json".into(),
            control_socket: "/run/pvsched/control.sock".into(),
            metrics: "127.0.0.1:9477".into(),
            event_source: EventSourceKind::Auto,
            poll_interval_us: 1000,
            recheck_boosted_us: serving::DEFAULT_RECHECK_NS / 1000,
            scan_interval_us: 10_000,
            doorbell_interval_us: 500,
            discovery_interval_ms: serving::DEFAULT_DISCOVERY_INTERVAL_NS / 1_000_000,
            priority: 5,
            mlock: true,
            boost_latency_path: true,
            fair_boost_reasons: Vec::new(),
            fair_boost_without_rt_work: false,
            fair_boost_nice: -20,
            fair_boost_slice_us: 100,
            lazy_events: true,
            quiet_idle_wakeups: true,
            quiet_any_idle_wakeups: true,
            find_rivals: true,
            quiet_without_rivals: true,
            offer_idle_hints: true,
            overload_cpu_pressure_percent: serving::DEFAULT_OVERLOAD_CPU_PRESSURE_PERCENT,
            kvm_params_dir: pvsched_base::kvm_params::DEFAULT_DIR.into(),
            backend: BackendChoice::Auto,
            scx_slice_us: 5000,
            scx_extension_us: 4000,
            scx_extension_poll_us: 250,
            scx_extension_tail_us: 1000,
            scx_extension_tail_poll_us: 50,
            scx_wakeup_preempt_us: 0,
            scx_extension_share_permille: pvsched_policy::DEFAULT_SCX_EXTENSION_SHARE_PERMILLE,
            scx_scan_interval_us: pvsched_policy::DEFAULT_SCX_SCAN_INTERVAL_NS / 1000,
            scx_spread_vm_vcpus: false,
            scx_guest_yield: true,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Serve every VM whose VMM maps a file `<region_dir>/<region_prefix><name>`
    /// (`-object memory-backend-file,mem-path=...`), with the default limits.
    pub auto: bool,
    pub region_dir: PathBuf,
    pub region_prefix: String,
    /// Accounts a VMM may run as (real and effective uid) to be served, and
    /// that may own a region file (besides the daemon's own): names or ids.
    /// Names unknown on this host are skipped.
    pub allowed_users: Vec<Account>,
    /// Groups a group-writable region file may belong to: names or ids.
    pub allowed_groups: Vec<Account>,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        let names = |n: &[&str]| n.iter().map(|s| Account::Name(s.to_string())).collect();
        Self {
            auto: true,
            region_dir: "/dev/shm".into(),
            region_prefix: "pvsched-".into(),
            allowed_users: names(&["root", "libvirt-qemu", "qemu"]),
            allowed_groups: names(&["root", "kvm", "libvirt-qemu", "qemu"]),
        }
    }
}

/// Domains started by libvirt: found in libvirtd's status files, served
/// when their XML carries `<shmem name='<shmem_prefix>NAME'>`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LibvirtConfig {
    /// Look for libvirt domains (nothing happens where libvirt is absent).
    pub enabled: bool,
    /// Where libvirtd keeps a status file per running QEMU domain.
    pub status_dir: PathBuf,
    /// Where libvirt's ivshmem-plain devices keep their memory
    /// (`<shm_dir>/<shmem name>`).
    pub shm_dir: PathBuf,
    /// The `<shmem name=...>` prefix that opts a domain in.
    pub shmem_prefix: String,
    /// The account libvirt runs QEMU as (qemu.conf `user`): the QEMU
    /// process and the region file must both belong to it.
    pub qemu_user: Account,
}

impl Default for LibvirtConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            status_dir: "/run/libvirt/qemu".into(),
            shm_dir: "/dev/shm".into(),
            shmem_prefix: "pvsched-".into(),
            qemu_user: Account::Name("libvirt-qemu".into()),
        }
    }
}

impl LibvirtConfig {
    /// `qemu_user` as a uid on this host; `None` (libvirt discovery off,
    /// logged at debug) where no such user exists.
    pub fn qemu_uid(&self) -> Option<u32> {
        match &self.qemu_user {
            Account::Id(id) => Some(*id),
            Account::Name(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                n.parse().ok()
            }
            Account::Name(n) => match nix::unistd::User::from_name(n) {
                Ok(Some(u)) => Some(u.uid.as_raw()),
                _ => {
                    tracing::debug!("[libvirt] qemu_user {n:?}: no such user here; libvirt domains are not looked for");
                    None
                }
            },
        }
    }
}

/// pvschedd as the ivshmem server of `ivshmem-doorbell` devices: a QEMU that
/// connects (`-chardev socket,path=SOCKET` + `-device ivshmem-doorbell`, or
/// libvirt's `<shmem><model type='ivshmem-doorbell'/><server path=.../>`)
/// gets its region and the doorbell from pvschedd, which knows the VMM by
/// the connection (`crates/host/src/ivshmem_server.rs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IvshmemServerConfig {
    /// Listen for QEMU on `socket`.
    pub enabled: bool,
    /// The socket QEMU connects to; empty: `ivshmem.sock` beside
    /// `[daemon] control_socket` (`/run/pvsched/ivshmem.sock`).
    pub socket: PathBuf,
    /// Where the regions of VMs served this way and their peer records are
    /// kept (root's, mode 0700); empty: `ivshmem/` beside the control socket.
    pub dir: PathBuf,
    /// Most VMs served through the socket at once; further connections are
    /// refused (and logged).
    pub max_vms: u32,
}

impl Default for IvshmemServerConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            socket: PathBuf::new(),
            dir: PathBuf::new(),
            max_vms: 64,
        }
    }
}

impl IvshmemServerConfig {
    /// The socket path, defaulted beside `control_socket`.
    pub fn socket_path(&self, control_socket: &Path) -> PathBuf {
        if self.socket.as_os_str().is_empty() {
            beside(control_socket, "ivshmem.sock")
        } else {
            self.socket.clone()
        }
    }

    /// The directory of regions and peer records, defaulted beside
    /// `control_socket`.
    pub fn dir_path(&self, control_socket: &Path) -> PathBuf {
        if self.dir.as_os_str().is_empty() {
            beside(control_socket, "ivshmem")
        } else {
            self.dir.clone()
        }
    }
}

/// `name` in the directory of `path`.
fn beside(path: &Path, name: &str) -> PathBuf {
    path.parent().unwrap_or(Path::new("/")).join(name)
}

/// A user or group in the configuration: a name, resolved on this host when
/// the configuration is loaded, or a numeric id (also as a string of digits).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Account {
    Id(u32),
    Name(String),
}

/// The ids `[discovery] allowed_users` and `allowed_groups` name on this host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allowed {
    pub uids: BTreeSet<u32>,
    pub gids: BTreeSet<u32>,
}

impl DiscoveryConfig {
    /// Resolves the allowed accounts to ids. A name this host does not know
    /// is skipped (logged at debug): distributions name their VMM accounts
    /// differently, and the default list names several.
    pub fn allowed(&self) -> Allowed {
        fn resolve(
            list: &[Account],
            kind: &str,
            lookup: impl Fn(&str) -> nix::Result<Option<u32>>,
        ) -> BTreeSet<u32> {
            list.iter()
                .filter_map(|a| match a {
                    Account::Id(id) => Some(*id),
                    Account::Name(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                        n.parse().ok()
                    }
                    Account::Name(n) => match lookup(n) {
                        Ok(Some(id)) => Some(id),
                        Ok(None) => {
                            tracing::debug!("[discovery] allowed {kind} {n:?}: no such {kind} here; skipped");
                            None
                        }
                        Err(e) => {
                            tracing::debug!("[discovery] allowed {kind} {n:?}: lookup failed ({e}); skipped");
                            None
                        }
                    },
                })
                .collect()
        }
        use nix::unistd::{Group, User};
        Allowed {
            uids: resolve(&self.allowed_users, "user", |n| {
                User::from_name(n).map(|u| u.map(|u| u.uid.as_raw()))
            }),
            gids: resolve(&self.allowed_groups, "group", |n| {
                Group::from_name(n).map(|g| g.map(|g| g.gid.as_raw()))
            }),
        }
    }

    /// Why auto-discovery cannot serve any VM, when no account it allows
    /// resolved here: a name only resolves through the host's user database,
    /// and a system without one (a minimal VM, a container with no
    /// /etc/passwd) would otherwise serve nothing and say nothing.
    pub fn serves_nobody(&self, allowed: &Allowed) -> Option<String> {
        if !self.auto || !allowed.uids.is_empty() || !allowed.gids.is_empty() {
            return None;
        }
        let list = |l: &[Account]| {
            l.iter()
                .map(|a| match a {
                    Account::Id(id) => id.to_string(),
                    Account::Name(n) => format!("{n:?}"),
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        Some(format!(
            "[discovery] allowed_users [{}] and allowed_groups [{}] name no account on this \
             host (is /etc/passwd there, and does it name them?): auto-discovery will serve no \
             VM; name the VMM's account by number, or serve VMs with [[vm]] entries",
            list(&self.allowed_users),
            list(&self.allowed_groups)
        ))
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// Name used in logs, metrics and pvschedctl.
    pub name: String,
    /// Region file; default `<region_dir>/<region_prefix><name>`.
    pub region: Option<PathBuf>,
    /// QMP socket of the VMM: vCPU thread ids from `query-cpus-fast`.
    pub qmp: Option<PathBuf>,
    /// VMM pid, when there is no QMP socket: vCPU threads by name.
    pub pid: Option<i32>,
    /// Mode of a region file the daemon creates: 0600, or 0640 to let the
    /// VMM's group read it. Never group- or world-writable: a VMM that runs
    /// as another user creates (and owns) its region file itself, as
    /// libvirt does, and the daemon opens it.
    #[serde(default = "default_region_mode")]
    pub region_mode: u32,
    #[serde(default)]
    pub limits: LimitsConfig,
}

fn default_region_mode() -> u32 {
    0o600
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub daemon: DaemonConfig,
    pub discovery: DiscoveryConfig,
    pub libvirt: LibvirtConfig,
    pub ivshmem_server: IvshmemServerConfig,
    /// Limits every VM starts from.
    pub defaults: LimitsConfig,
    #[serde(rename = "vm")]
    pub vms: Vec<VmConfig>,
}

/// A config that passed validation: limits resolved per VM.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub config: Config,
    pub default_limits: VmLimits,
    pub vm_limits: Vec<VmLimits>,
    /// `[discovery]`'s allowed accounts as ids on this host.
    pub allowed: Allowed,
    /// `[libvirt] qemu_user` as a uid here; `None`: libvirt is not looked at.
    pub libvirt_uid: Option<u32>,
}

impl Config {
    /// Reads and validates `path`; a missing default path means defaults.
    pub fn load(path: &Path, must_exist: bool) -> Result<Resolved, ConfigError> {
        let shown = path.display().to_string();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => String::new(),
            Err(e) => {
                return Err(ConfigError::Io {
                    path: shown,
                    source: e,
                })
            }
        };
        Self::parse(&text, &shown)
    }

    pub fn parse(text: &str, shown: &str) -> Result<Resolved, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: shown.to_string(),
            msg: e.to_string().trim_end().replace('\n', " "),
        })?;
        config.resolve().map_err(|e| match e {
            ConfigError::Invalid { key, msg, .. } => ConfigError::Invalid {
                path: shown.to_string(),
                key,
                msg,
            },
            other => other,
        })
    }

    fn resolve(self) -> Result<Resolved, ConfigError> {
        let invalid = |key: &str, msg: String| ConfigError::Invalid {
            path: String::new(),
            key: key.into(),
            msg,
        };
        let d = &self.daemon;
        for (key, v) in [
            ("daemon.poll_interval_us", d.poll_interval_us),
            ("daemon.recheck_boosted_us", d.recheck_boosted_us),
            ("daemon.scan_interval_us", d.scan_interval_us),
            ("daemon.scx_scan_interval_us", d.scx_scan_interval_us),
            ("daemon.doorbell_interval_us", d.doorbell_interval_us),
            ("daemon.discovery_interval_ms", d.discovery_interval_ms),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be > 0".into()));
            }
        }
        if !(1..=99).contains(&d.priority) {
            return Err(invalid(
                "daemon.priority",
                format!("must be 1..=99, not {}", d.priority),
            ));
        }
        if let Some(bad) = d
            .fair_boost_reasons
            .iter()
            .find(|n| !Reason::BOOSTING.contains(&n.as_str()))
        {
            return Err(invalid(
                "daemon.fair_boost_reasons",
                format!(
                    "{bad:?} is not a boost reason ({})",
                    Reason::BOOSTING.join(", ")
                ),
            ));
        }
        if !(-20..=19).contains(&d.fair_boost_nice) {
            return Err(invalid(
                "daemon.fair_boost_nice",
                format!("must be -20..=19, not {}", d.fair_boost_nice),
            ));
        }
        if !(100..=100_000).contains(&d.fair_boost_slice_us) {
            return Err(invalid(
                "daemon.fair_boost_slice_us",
                format!(
                    "must be 100..=100000 (the kernel's slice range), not {}",
                    d.fair_boost_slice_us
                ),
            ));
        }
        if !(500..=100_000).contains(&d.scx_slice_us) {
            return Err(invalid(
                "daemon.scx_slice_us",
                format!("must be 500..=100000, not {}", d.scx_slice_us),
            ));
        }
        if d.scx_wakeup_preempt_us > 100_000 {
            return Err(invalid(
                "daemon.scx_wakeup_preempt_us",
                format!("must be 0..=100000, not {}", d.scx_wakeup_preempt_us),
            ));
        }
        if d.scx_extension_us > 100_000 {
            return Err(invalid(
                "daemon.scx_extension_us",
                format!("must be 0..=100000, not {}", d.scx_extension_us),
            ));
        }
        if d.scx_extension_poll_us != 0 && !(20..=100_000).contains(&d.scx_extension_poll_us) {
            return Err(invalid(
                "daemon.scx_extension_poll_us",
                format!("must be 0 or 20..=100000, not {}", d.scx_extension_poll_us),
            ));
        }
        if d.scx_extension_tail_us > 100_000 {
            return Err(invalid(
                "daemon.scx_extension_tail_us",
                format!("must be 0..=100000, not {}", d.scx_extension_tail_us),
            ));
        }
        if !(20..=100_000).contains(&d.scx_extension_tail_poll_us) {
            return Err(invalid(
                "daemon.scx_extension_tail_poll_us",
                format!("must be 20..=100000, not {}", d.scx_extension_tail_poll_us),
            ));
        }
        if d.scx_extension_share_permille > 1000 {
            return Err(invalid(
                "daemon.scx_extension_share_permille",
                format!("must be 0..=1000, not {}", d.scx_extension_share_permille),
            ));
        }
        if !(0.0..=100.0).contains(&d.overload_cpu_pressure_percent) {
            return Err(invalid(
                "daemon.overload_cpu_pressure_percent",
                format!("must be 0..=100, not {}", d.overload_cpu_pressure_percent),
            ));
        }
        if d.metrics != "off"
            && !d.metrics.starts_with("unix:")
            && d.metrics.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(invalid(
                "daemon.metrics",
                format!("{:?} is neither host:port, unix:/path nor off", d.metrics),
            ));
        }
        let default_limits = self.defaults.apply(&VmLimits::default(), "defaults.")?;
        let mut names = BTreeSet::new();
        let mut vm_limits = Vec::with_capacity(self.vms.len());
        for (i, vm) in self.vms.iter().enumerate() {
            let key = format!("vm[{i}]");
            if vm.name.is_empty()
                || !vm
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(invalid(
                    &format!("{key}.name"),
                    format!("{:?}: use letters, digits, - and _", vm.name),
                ));
            }
            if !names.insert(vm.name.clone()) {
                return Err(invalid(
                    &format!("{key}.name"),
                    format!("{:?} appears twice", vm.name),
                ));
            }
            if vm.qmp.is_some() && vm.pid.is_some() {
                return Err(invalid(
                    &format!("vm.{}.qmp", vm.name),
                    "give qmp or pid, not both".into(),
                ));
            }
            if vm.pid.is_some_and(|p| p <= 0) {
                return Err(invalid(
                    &format!("vm.{}.pid", vm.name),
                    "must be a process id (> 0)".into(),
                ));
            }
            if vm.region_mode & 0o022 != 0 || vm.region_mode > 0o777 {
                return Err(invalid(
                    &format!("vm.{}.region_mode", vm.name),
                    format!(
                        "{:o}: group- or world-writable, or not a mode (at most 0o640)",
                        vm.region_mode
                    ),
                ));
            }
            let limits = vm
                .limits
                .apply(&default_limits, &format!("vm.{}.limits.", vm.name))?;
            check_band(&limits, d.priority, &format!("vm.{}.limits.", vm.name))?;
            vm_limits.push(limits);
        }
        check_band(&default_limits, d.priority, "defaults.")?;
        let allowed = self.discovery.allowed();
        if let Some(warning) = self.discovery.serves_nobody(&allowed) {
            tracing::warn!("{warning}");
        }
        let p = &self.libvirt.shmem_prefix;
        if self.libvirt.enabled && (p.is_empty() || p.contains('/')) {
            return Err(invalid(
                "libvirt.shmem_prefix",
                format!("{p:?}: must be a non-empty file-name prefix"),
            ));
        }
        let libvirt_uid = if self.libvirt.enabled {
            self.libvirt.qemu_uid()
        } else {
            None
        };
        Ok(Resolved {
            config: self,
            default_limits,
            vm_limits,
            allowed,
            libvirt_uid,
        })
    }
}

impl VmConfig {
    pub fn region_path(&self, discovery: &DiscoveryConfig) -> PathBuf {
        self.region.clone().unwrap_or_else(|| {
            discovery
                .region_dir
                .join(format!("{}{}", discovery.region_prefix, self.name))
        })
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_config_gives_every_default() {
        let r = Config::parse("", "t.toml").unwrap();

        assert_eq!(r.default_limits, VmLimits::default());
        assert_eq!(r.config.daemon, DaemonConfig::default());
        assert!(r.config.vms.is_empty());
    }

    #[test]
    fn the_shipped_example_config_is_valid_and_all_defaults() {
        let text = include_str!("../../../../packaging/pvsched.toml");

        let r = Config::parse(text, "packaging/pvsched.toml").unwrap();

        assert_eq!(r.default_limits, VmLimits::default());
        assert_eq!(r.config.daemon, DaemonConfig::default());
        assert_eq!(r.config.discovery, DiscoveryConfig::default());
        assert_eq!(r.config.libvirt, LibvirtConfig::default());
        assert_eq!(r.config.ivshmem_server, IvshmemServerConfig::default());
    }

    #[test]
    fn the_ivshmem_socket_and_dir_default_beside_the_control_socket() {
        let d = IvshmemServerConfig::default();
        let set = Config::parse(
            "[ivshmem_server]\nsocket = \"/s/q.sock\"\ndir = \"/s/r\"\n",
            "t.toml",
        )
        .unwrap()
        .config
        .ivshmem_server;
        let control = Path::new("/run/x/control.sock");

        assert_eq!(d.socket_path(control), Path::new("/run/x/ivshmem.sock"));
        assert_eq!(d.dir_path(control), Path::new("/run/x/ivshmem"));
        assert_eq!(set.socket_path(control), Path::new("/s/q.sock"));
        assert_eq!(set.dir_path(control), Path::new("/s/r"));
    }

    #[test]
    fn bad_extension_tail_values_are_refused() {
        let tail = Config::parse("[daemon]\nscx_extension_tail_us = 100001\n", "t.toml");
        let poll = Config::parse("[daemon]\nscx_extension_tail_poll_us = 10\n", "t.toml");
        let off = Config::parse("[daemon]\nscx_extension_tail_us = 0\n", "t.toml").unwrap();

        assert!(
            matches!(tail, Err(ConfigError::Invalid { key, .. }) if key == "daemon.scx_extension_tail_us")
        );
        assert!(
            matches!(poll, Err(ConfigError::Invalid { key, .. }) if key == "daemon.scx_extension_tail_poll_us")
        );
        assert_eq!(off.config.daemon.sched_ext_options().extension_tail_ns, 0);
    }

    #[test]
    fn bad_fair_boost_values_are_refused() {
        let slice = Config::parse("[daemon]\nfair_boost_slice_us = 50\n", "t.toml");
        let nice = Config::parse("[daemon]\nfair_boost_nice = -21\n", "t.toml");
        let unboost = Config::parse("[daemon]\nfair_boost_reasons = [\"debt\"]\n", "t.toml");

        assert!(
            matches!(slice, Err(ConfigError::Invalid { key, .. }) if key == "daemon.fair_boost_slice_us")
        );
        assert!(
            matches!(nice, Err(ConfigError::Invalid { key, .. }) if key == "daemon.fair_boost_nice")
        );
        assert!(
            matches!(unboost, Err(ConfigError::Invalid { key, .. }) if key == "daemon.fair_boost_reasons")
        );
    }

    #[test]
    fn a_discovery_that_resolves_no_account_says_it_serves_nobody() {
        let text = r#"
            [discovery]
            allowed_users = ["no-such-user-here"]
            allowed_groups = ["no-such-group-here"]
        "#;
        let r = Config::parse(text, "t.toml").unwrap();
        let by_id = Config::parse("[discovery]\nallowed_users = [0]\n", "t.toml").unwrap();

        let warning = r.config.discovery.serves_nobody(&r.allowed);

        let w = warning.expect("a warning");
        assert!(
            w.contains("\"no-such-user-here\"") && w.contains("/etc/passwd"),
            "{w}"
        );
        assert_eq!(by_id.config.discovery.serves_nobody(&by_id.allowed), None);
    }

    #[test]
    fn allowed_accounts_resolve_names_and_ids_and_skip_unknown_names() {
        let text = r#"
            [discovery]
            allowed_users = ["root", 107, "4242", "no-such-user-here"]
            allowed_groups = ["root", "no-such-group-here", 65534]
        "#;

        let r = Config::parse(text, "t.toml").unwrap();

        assert_eq!(r.allowed.uids, [0, 107, 4242].into());
        assert_eq!(r.allowed.gids, [0, 65534].into());
    }

    #[test]
    fn a_vm_pid_must_be_a_process_id() {
        let err = Config::parse("[[vm]]\nname = \"a\"\npid = 0", "t.toml")
            .unwrap_err()
            .to_string();

        assert!(err.contains("vm.a.pid"), "{err}");
    }

    #[test]
    fn per_vm_limits_override_the_defaults() {
        let text = r#"
            [daemon]
            priority = 30
            [defaults]
            max_rt_priority = 20
            [[vm]]
            name = "audio"
            qmp = "/run/audio.qmp"
            [vm.limits]
            boost_priority = 15
            allowed = ["other", "fifo"]
        "#;

        let r = Config::parse(text, "t.toml").unwrap();

        assert_eq!(r.default_limits.max_rt_priority, 20);
        assert_eq!(r.vm_limits[0].boost_priority, 15);
        assert!(r.vm_limits[0].allowed.fifo && !r.vm_limits[0].allowed.rr);
    }

    #[test]
    fn each_bad_config_names_its_key() {
        let cases = [
            (
                "[defaults]\nmax_rt_priority = 0",
                "defaults.max_rt_priority",
            ),
            ("[defaults]\nbogus = 1", "bogus"),
            ("[daemon]\npriority = 3", "defaults.max_rt_priority"),
            ("[daemon]\nmetrics = \"nowhere\"", "daemon.metrics"),
            (
                "[daemon]\nrecheck_boosted_us = 0",
                "daemon.recheck_boosted_us",
            ),
            (
                "[daemon]\noverload_cpu_pressure_percent = 101.0",
                "daemon.overload_cpu_pressure_percent",
            ),
            (
                "[defaults]\nidle_poll_budget_permille = 1001",
                "defaults.idle_poll_budget_permille",
            ),
            (
                "[[vm]]\nname = \"a\"\n[vm.limits]\nnice_min = 30",
                "vm.a.limits.nice_min",
            ),
            (
                "[[vm]]\nname = \"a\"\nregion_mode = 0o666",
                "vm.a.region_mode",
            ),
            (
                "[[vm]]\nname = \"a\"\nregion_mode = 0o660",
                "vm.a.region_mode",
            ),
            ("[[vm]]\nname = \"a\"\nvcpus = 4", "vcpus"),
            ("[[vm]]\nname = \"a\"\n[[vm]]\nname = \"a\"", "vm[1].name"),
            ("[[vm]]\nname = \"a b\"", "vm[0].name"),
            (
                "[defaults]\nboost_policy = \"deadline\"",
                "defaults.boost_policy",
            ),
            ("[defaults]\nmax_boost_ns = -1", "max_boost_ns"),
        ];

        for (text, key) in cases {
            let err = Config::parse(text, "t.toml").unwrap_err().to_string();
            assert!(
                err.starts_with("t.toml:") && err.contains(key),
                "{text:?} gave {err:?}"
            );
        }
    }
}
