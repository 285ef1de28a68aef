//! The sched_ext backend's loader: pvsched's scheduler (`src/bpf/sched_ext.bpf.c`)
//! loaded and attached for the whole host, the grants the policy hands it
//! (`scx_grants`), what it did per vCPU (`scx_vcpus`, read through a
//! mapping) and why the kernel
//! ended it (its `exit_info`). Dropping [`SchedExt`] detaches the scheduler:
//! every task goes back to the kernel's fair class, as it does when the
//! daemon dies and the link's file descriptor closes.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Mutex;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, MapHandle, OpenObject};
use memmap2::{MmapOptions, MmapRaw};
use pvsched_policy::KernelGrant;

use crate::events::wire::{
    pvs_scx_boost_queued, pvs_scx_grant, pvs_scx_vcpu, PVS_SCX_BOOST_GUEST,
    PVS_SCX_BOOST_PROACTIVE, PVS_SCX_K_CS, PVS_SCX_K_WAKE,
};

#[allow(
    clippy::all,
    clippy::pedantic,
    dead_code,
    non_camel_case_types,
    non_snake_case,
    unused_qualifications
)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/sched_ext.skel.rs"));
}

use skel::{SchedExtSkel, SchedExtSkelBuilder};

/// Where the kernel says whether a sched_ext scheduler runs.
pub const STATE_FILE: &str = "/sys/kernel/sched_ext/state";
/// The kvm module's BTF, where its tracepoints are found.
const KVM_BTF: &str = "/sys/kernel/btf/kvm";
/// The kernel's lockdown modes, the one in force in brackets.
const LOCKDOWN: &str = "/sys/kernel/security/lockdown";

/// Why the sched_ext backend is not available or failed.
#[derive(Debug, thiserror::Error)]
pub enum SchedExtError {
    #[error("BPF {what}: {source}")]
    Bpf {
        what: String,
        #[source]
        source: libbpf_rs::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("another sched_ext scheduler runs ({STATE_FILE}: {state}; /sys/kernel/sched_ext/root/ops: {ops})")]
    Busy { state: String, ops: String },
    #[error("the kernel has no sched_ext ({STATE_FILE} missing: needs Linux >= 6.13 with CONFIG_SCHED_CLASS_EXT)")]
    NoSchedExt,
}

impl SchedExtError {
    fn bpf(what: impl Into<String>) -> impl FnOnce(libbpf_rs::Error) -> Self {
        let what = what.into();
        move |source| SchedExtError::Bpf { what, source }
    }
}

/// The scheduler's tunables (its `const volatile` globals), from the
/// daemon config's `scx_*` keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedExtOptions {
    /// The time slice of every task.
    pub slice_ns: u64,
    /// One extension at a slice end for a vCPU in a critical section; 0: none.
    pub extension_ns: u64,
    /// While a vCPU runs an extension its slot is read every this often, and
    /// the extension ends once the guest is out of its critical section;
    /// 0: every extension runs its length.
    pub extension_poll_ns: u64,
    /// A vCPU still holding a lock when its extension runs out goes on for
    /// at most this much, its slot read every `extension_tail_poll_ns`, and
    /// is preempted at the first read that finds it out of its locks; 0:
    /// none.
    pub extension_tail_ns: u64,
    pub extension_tail_poll_ns: u64,
    /// A woken task preempts a running one whose vtime is ahead by more
    /// than this; 0: never.
    pub wakeup_preempt_ns: u64,
    /// Thread ids the maps can hold (vCPU and latency-path threads).
    pub max_threads: u32,
    /// The thread run ahead of every boost, in this scheduler's class
    /// (pvschedd's event thread, which leaves the RT class while the
    /// scheduler is loaded); 0: none.
    pub daemon_tid: u32,
    /// A vCPU woken onto a CPU where another vCPU of its VM runs goes to a
    /// CPU without one, where it may run.
    pub spread_vm_vcpus: bool,
    /// A lock holder's guest that accepts `F_EXT_NOTICE` is shown its
    /// extension and ends it by yielding at its next point out of its
    /// locks (two programs on KVM's tracepoints; needs the kvm module).
    pub guest_yield: bool,
}

impl Default for SchedExtOptions {
    fn default() -> Self {
        Self {
            slice_ns: 5_000_000,
            extension_ns: 4_000_000,
            extension_poll_ns: 250_000,
            extension_tail_ns: 1_000_000,
            extension_tail_poll_ns: 50_000,
            wakeup_preempt_ns: 0,
            max_threads: 4096,
            daemon_tid: 0,
            spread_vm_vcpus: false,
            guest_yield: true,
        }
    }
}

/// What a thread's grant says about its boost (`struct pvs_scx_grant`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScxBoost {
    None,
    /// For something the guest says: holds while its slot still says so.
    Guest(u32),
    /// Proactive: holds until the daemon ends it.
    Proactive(u32),
}

/// What a thread may have from the program without the daemon: totals
/// since it was registered, compared by the program with its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScxAllowance {
    /// Extension time at slice ends (the record's `ext_allowed_ns`).
    pub extension_ns: u64,
    /// Time boosted by the program's own decisions (the record's
    /// `kboost_allowed_ns`).
    pub kernel_boost_ns: u64,
    /// The policy's terms for those decisions.
    pub kernel: KernelGrant,
    /// Where the other slots of the vCPU's VM are, for the extension of a
    /// lock holder at its slice end; `peers` 0: none.
    pub lock: LockScan,
}

/// The vCPU's place among its VM's slots (`grant.vcpu_index`, `lock_peers`,
/// `slot_stride`): the program finds the other vCPUs' slots beside its own
/// and extends this vCPU at a slice end while one of them publishes a lock
/// wait naming it as the holder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockScan {
    pub index: u32,
    pub peers: u32,
    pub stride: u32,
}

/// Why the kernel ended the scheduler (ops.exit's `scx_exit_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScxExit {
    /// `enum scx_exit_kind`: 64.. unregistered (65 by BPF, 66 by the
    /// kernel, 67 sysrq-S), 1024.. an error (1026: a task stalled).
    pub kind: i32,
    pub exit_code: i64,
    pub reason: String,
    pub msg: String,
}

impl std::fmt::Display for ScxExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (kind {})", self.reason, self.kind)?;
        if !self.msg.is_empty() {
            write!(f, ": {}", self.msg)?;
        }
        Ok(())
    }
}

/// The program-wide counters (`struct pvs_scx_totals`, as the skeleton has it).
pub type ScxTotals = skel::types::pvs_scx_totals;
/// What the scheduler did for one thread (`struct pvs_scx_vcpu`).
pub type ScxVcpu = pvs_scx_vcpu;

/// pvsched's sched_ext scheduler, attached while this lives.
pub struct SchedExt {
    // Drop order: the link first (the scheduler is detached), then the maps.
    _link: Link,
    grants: MapHandle,
    /// What this daemon last wrote to `grants`, which only it writes (the
    /// program reads them): a change is one map update, not a lookup and
    /// an update (each a syscall, ~0.2 ms in an emulated host).
    written: Mutex<HashMap<u32, pvs_scx_grant>>,
    /// `scx_vcpus`, mapped: one record per registered thread, at its
    /// grant's `record` (a lookup per vCPU per scan was a syscall, ~80 µs
    /// of CPU each in the loaded host VM).
    vcpus: MmapRaw,
    records: Mutex<RecordSlots>,
    /// The program's `.bss` (totals, exit state), mapped read-only: read at
    /// every scan, where a map lookup (a syscall) cost ~250 µs of CPU in an
    /// emulated host.
    bss: MmapRaw,
    /// `pvs_boost_queued`, run with BPF_PROG_TEST_RUN.
    boost_queued: OwnedFd,
    /// `ext_poll`, held open: the kernel frees a map's timers once no user
    /// space holds it, and the extension's poll would start none.
    _ext_poll: MapHandle,
    /// The extension notice's and the guest yield's programs, attached to
    /// KVM's tracepoints (none without `guest_yield` or the kvm module).
    _yield_links: Vec<Link>,
    options: SchedExtOptions,
}

/// The kernel's lockdown mode when it is on (`integrity`, `confidentiality`):
/// BPF programs may not write user memory then.
fn locked_down() -> Option<String> {
    lockdown_in_force(&std::fs::read_to_string(LOCKDOWN).ok()?)
}

/// The mode in brackets of the lockdown file's `none [integrity]
/// confidentiality`, unless it is `none`.
fn lockdown_in_force(modes: &str) -> Option<String> {
    let mode = modes.split_whitespace().find(|m| m.starts_with('['))?;
    let mode = mode.trim_matches(|c| c == '[' || c == ']');
    (mode != "none").then(|| mode.to_string())
}

/// Whether the running kernel has sched_ext and no scheduler of it runs.
pub fn available() -> Result<(), SchedExtError> {
    let state = std::fs::read_to_string(STATE_FILE)
        .map_err(|_| SchedExtError::NoSchedExt)?
        .trim()
        .to_string();
    if state == "disabled" {
        return Ok(());
    }
    let ops = std::fs::read_to_string("/sys/kernel/sched_ext/root/ops")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    Err(SchedExtError::Busy { state, ops })
}

/// The kernel's sched_ext state (`enabled`, `disabled`, ...), if it has one.
pub fn kernel_state() -> Option<String> {
    std::fs::read_to_string(STATE_FILE)
        .ok()
        .map(|s| s.trim().to_string())
}

impl SchedExt {
    /// Loads and attaches the scheduler: from here every fair-class task of
    /// the host is scheduled by it.
    pub fn load(options: SchedExtOptions) -> Result<Self, SchedExtError> {
        if !Path::new(STATE_FILE).exists() {
            return Err(SchedExtError::NoSchedExt);
        }
        available()?;
        let mut storage = MaybeUninit::<OpenObject>::uninit();
        let mut open = SchedExtSkelBuilder::default()
            .open(&mut storage)
            .map_err(SchedExtError::bpf("open"))?;
        let cpus = libbpf_rs::num_possible_cpus()
            .map_err(SchedExtError::bpf("count the possible CPUs"))?;
        let cpus = u32::try_from(cpus).unwrap_or(u32::MAX);
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.slice_ns = options.slice_ns;
            ro.extension_ns = options.extension_ns;
            ro.extension_poll_ns = options.extension_poll_ns;
            ro.extension_tail_ns = options.extension_tail_ns;
            ro.extension_tail_poll_ns = options.extension_tail_poll_ns;
            ro.wakeup_preempt_ns = options.wakeup_preempt_ns;
            ro.nr_cpu_ids = cpus;
            ro.daemon_tid = options.daemon_tid;
            ro.spread_vm_vcpus = u32::from(options.spread_vm_vcpus);
        }
        let threads = options.max_threads.max(1);
        open.maps
            .scx_grants
            .set_max_entries(threads)
            .map_err(SchedExtError::bpf("size map scx_grants"))?;
        open.maps
            .scx_vcpus
            .set_max_entries(threads)
            .map_err(SchedExtError::bpf("size map scx_vcpus"))?;
        open.maps
            .cpu_boost
            .set_max_entries(cpus.max(1))
            .map_err(SchedExtError::bpf("size map cpu_boost"))?;
        open.maps
            .cpu_run
            .set_max_entries(cpus.max(1))
            .map_err(SchedExtError::bpf("size map cpu_run"))?;
        open.maps
            .cpu_holder
            .set_max_entries(cpus.max(1))
            .map_err(SchedExtError::bpf("size map cpu_holder"))?;
        open.maps
            .ext_poll
            .set_max_entries(cpus.max(1))
            .map_err(SchedExtError::bpf("size map ext_poll"))?;
        // Both attach to the kvm module's tracepoints, found in its BTF; the
        // notice is a write to user memory, which a locked-down kernel
        // refuses (the whole scheduler would fail to load).
        let guest_yield = options.guest_yield && {
            let why_not = if !Path::new(KVM_BTF).exists() {
                Some(format!("no {KVM_BTF} (the kvm module is not loaded)"))
            } else {
                locked_down().map(|mode| format!("the kernel is locked down ({mode})"))
            };
            if let Some(why) = &why_not {
                tracing::warn!(
                    "sched_ext: {why}: lock holders' guests are not shown their extensions \
                     and do not yield"
                );
            }
            why_not.is_none()
        };
        open.progs.pvs_notice_extension.set_autoload(guest_yield);
        open.progs.pvs_guest_yield.set_autoload(guest_yield);
        let started = std::time::Instant::now();
        let mut skel: SchedExtSkel<'_> = open.load().map_err(SchedExtError::bpf("load"))?;
        let verified = started.elapsed();
        let handle = |m: &libbpf_rs::MapMut<'_>, name: &str| {
            MapHandle::try_from(m).map_err(SchedExtError::bpf(format!("map {name} handle")))
        };
        let grants = handle(&skel.maps.scx_grants, "scx_grants")?;
        let vcpus = map_records(&skel.maps.scx_vcpus, threads)?;
        let bss = map_bss(&skel.maps.bss)?;
        let ext_poll = handle(&skel.maps.ext_poll, "ext_poll")?;
        let boost_queued = skel
            .progs
            .pvs_boost_queued
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| SchedExtError::Io {
                what: "dup pvs_boost_queued".into(),
                source,
            })?;
        let mut yield_links = Vec::new();
        if guest_yield {
            yield_links.push(skel.progs.pvs_notice_extension.attach().map_err(
                SchedExtError::bpf("attach pvs_notice_extension (kvm_entry)"),
            )?);
            yield_links.push(
                skel.progs
                    .pvs_guest_yield
                    .attach()
                    .map_err(SchedExtError::bpf("attach pvs_guest_yield (kvm_hypercall)"))?,
            );
        }
        let link = skel
            .maps
            .pvsched_ops
            .attach_struct_ops()
            .map_err(SchedExtError::bpf("attach the scheduler (struct_ops)"))?;
        // Both are slow on an emulated or loaded host: say which.
        tracing::debug!(
            load_ms = verified.as_millis() as u64,
            attach_ms = (started.elapsed() - verified).as_millis() as u64,
            "sched_ext: scheduler loaded and attached"
        );
        // The link keeps the scheduler, the handles its maps.
        drop(skel);
        Ok(Self {
            _link: link,
            grants,
            written: Mutex::default(),
            vcpus,
            records: Mutex::new(RecordSlots::new(threads)),
            bss,
            boost_queued,
            _ext_poll: ext_poll,
            _yield_links: yield_links,
            options,
        })
    }

    pub fn options(&self) -> SchedExtOptions {
        self.options
    }

    /// Starts scheduling thread `tid` as a vCPU: its slot at `slot_addr`
    /// in its VMM (0: unknown), no boost, no extension allowed yet.
    pub fn register(&self, tid: u32, slot_addr: u64) -> Result<(), SchedExtError> {
        // Registered again: it starts over, in the same record.
        let again = self.written_grants().get(&tid).map(|g| g.record);
        let record = match again {
            Some(r) => r,
            None => self
                .records_lock()
                .take()
                .ok_or_else(|| SchedExtError::Io {
                    what: format!("no record left in scx_vcpus for thread {tid} (max_threads)"),
                    source: std::io::Error::from_raw_os_error(libc::ENOSPC),
                })?,
        };
        self.write_record(record, &pvs_scx_vcpu::default());
        let grant = pvs_scx_grant {
            slot_addr,
            record,
            ..Default::default()
        };
        if let Err(e) = self.write_grant(tid, &grant) {
            if again.is_none() {
                self.records_lock().give_back(record);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Stops treating `tid` as a vCPU.
    pub fn unregister(&self, tid: u32) {
        // Absent entries are fine: the thread was never registered.
        let _ = self.grants.delete(&tid.to_ne_bytes());
        if let Some(g) = self.written_grants().remove(&tid) {
            self.records_lock().give_back(g.record);
        }
    }

    fn records_lock(&self) -> std::sync::MutexGuard<'_, RecordSlots> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record_ptr(&self, record: u32) -> *mut pvs_scx_vcpu {
        // In bounds: `record` < max_entries (RecordSlots hands out no other),
        // and the mapping holds max_entries records of `record_stride()`.
        // SAFETY: the offset stays inside the mapping (see above).
        unsafe {
            self.vcpus
                .as_mut_ptr()
                .add(record as usize * record_stride())
                .cast::<pvs_scx_vcpu>()
        }
    }

    fn write_record(&self, record: u32, v: &pvs_scx_vcpu) {
        // SAFETY: a record of the mapping (`record_ptr`), 8-byte aligned
        // (the array's stride is); no grant names it yet, so the program
        // does not write it meanwhile.
        unsafe { std::ptr::write_volatile(self.record_ptr(record), *v) }
    }

    fn written_grants(&self) -> std::sync::MutexGuard<'_, HashMap<u32, pvs_scx_grant>> {
        self.written.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Thread `tid`'s grant as last written (all zero: none yet).
    fn grant(&self, tid: u32) -> Result<pvs_scx_grant, SchedExtError> {
        Ok(self.written_grants().get(&tid).copied().unwrap_or_default())
    }

    fn write_grant(&self, tid: u32, grant: &pvs_scx_grant) -> Result<(), SchedExtError> {
        self.grants
            .update(&tid.to_ne_bytes(), as_bytes(grant), MapFlags::ANY)
            .map_err(SchedExtError::bpf(format!("scx_grants[{tid}]")))?;
        self.written_grants().insert(tid, *grant);
        Ok(())
    }

    /// Sets the boost thread `tid` is dispatched with.
    pub fn set_boost(&self, tid: u32, boost: ScxBoost) -> Result<(), SchedExtError> {
        let mut g = self.grant(tid)?;
        (g.boost, g.boost_kind) = match boost {
            ScxBoost::None => (0, PVS_SCX_BOOST_GUEST),
            ScxBoost::Guest(p) => (p.max(1), PVS_SCX_BOOST_GUEST),
            ScxBoost::Proactive(p) => (p.max(1), PVS_SCX_BOOST_PROACTIVE),
        };
        self.write_grant(tid, &g)
    }

    /// Moves thread `tid`, just granted a boost, ahead if it waits in the
    /// vtime queue (`pvs_boost_queued`); Ok(true) when it did.
    pub fn boost_queued(&self, tid: u32) -> Result<bool, SchedExtError> {
        let mut ctx = pvs_scx_boost_queued { tid, moved: 0 };
        let size = size_of::<pvs_scx_boost_queued>() as u32;
        let p = (&mut ctx as *mut pvs_scx_boost_queued).cast::<std::ffi::c_void>();
        let mut opts = libbpf_rs::libbpf_sys::bpf_test_run_opts {
            sz: size_of::<libbpf_rs::libbpf_sys::bpf_test_run_opts>() as _,
            ctx_in: p,
            ctx_size_in: size,
            ..Default::default()
        };
        // SAFETY: opts points at `ctx`, ours, for the call only; a syscall
        // program's context is copied back into it (ctx_in).
        let r = unsafe {
            libbpf_rs::libbpf_sys::bpf_prog_test_run_opts(self.boost_queued.as_raw_fd(), &mut opts)
        };
        if r != 0 {
            return Err(SchedExtError::Io {
                what: "run pvs_boost_queued".into(),
                source: std::io::Error::from_raw_os_error(-r),
            });
        }
        Ok(ctx.moved != 0)
    }

    /// Sets where thread `tid`'s slot is in its VMM.
    pub fn set_slot(&self, tid: u32, slot_addr: u64) -> Result<(), SchedExtError> {
        let mut g = self.grant(tid)?;
        g.slot_addr = slot_addr;
        self.write_grant(tid, &g)
    }

    /// Sets what thread `tid` may have from the program itself: its total
    /// extension time and the boosts it decides (`grant.kboost`). The two
    /// totals, which grow at every scan, are stored into the thread's
    /// record through the mapping; the grant is written (a syscall) only
    /// when its rules changed.
    pub fn allow(&self, tid: u32, allowance: ScxAllowance) -> Result<(), SchedExtError> {
        let mut g = self.grant(tid)?;
        let before = g;
        let k = allowance.kernel;
        g.kboost = u32::from(k.priority);
        g.halt_window_ns = k.halt_window_ns;
        g.kflags = if k.critical_sections { PVS_SCX_K_CS } else { 0 }
            | if k.wakeups { PVS_SCX_K_WAKE } else { 0 };
        g.wake_boost_ns = k.wake_boost_ns;
        g.demote_after_ns = k.demote_after_ns;
        g.max_boost_ns = k.max_boost_ns;
        g.throttle_ns = k.throttle_ns;
        g.vcpu_index = allowance.lock.index;
        g.lock_peers = allowance.lock.peers;
        g.slot_stride = allowance.lock.stride;
        if as_bytes(&g) != as_bytes(&before) {
            self.write_grant(tid, &g)?;
        }
        if let Some(record) = self.written_grants().get(&tid).map(|g| g.record) {
            let r = self.record_ptr(record);
            // SAFETY: fields of a record of the mapping (`record_ptr`),
            // 8-byte aligned; the program only reads these two, and an
            // aligned 8-byte store is seen whole.
            unsafe {
                std::ptr::write_volatile(
                    std::ptr::addr_of_mut!((*r).ext_allowed_ns),
                    allowance.extension_ns,
                );
                std::ptr::write_volatile(
                    std::ptr::addr_of_mut!((*r).kboost_allowed_ns),
                    allowance.kernel_boost_ns,
                );
            }
        }
        Ok(())
    }

    /// What the scheduler did for thread `tid`.
    pub fn vcpu(&self, tid: u32) -> Option<ScxVcpu> {
        let record = self.written_grants().get(&tid)?.record;
        // SAFETY: a record of the mapping (`record_ptr`), 8-byte aligned;
        // the program updates it concurrently, so it is copied with a
        // volatile read (any bit pattern is a valid pvs_scx_vcpu; a copy
        // may mix counters from before and after one update).
        Some(unsafe { std::ptr::read_volatile(self.record_ptr(record)) })
    }

    fn bss(&self) -> skel::types::bss {
        // SAFETY: `map_bss` mapped at least size_of::<bss>() readable bytes,
        // alive as long as `self`; the program writes them concurrently, so
        // they are copied with a volatile read, and any bit pattern is a
        // valid `bss` (integers and arrays). A copy may mix counters from
        // before and after a program's update: each is still a value it had.
        unsafe { std::ptr::read_volatile(self.bss.as_ptr().cast::<skel::types::bss>()) }
    }

    /// The program-wide counters.
    pub fn totals(&self) -> ScxTotals {
        self.bss().totals
    }

    /// Why the kernel ended the scheduler, once it has (its watchdog, an
    /// error, `sysrq-S`, ...: then every task is back in the fair class),
    /// and [`SchedExt::totals`], from one copy of the program's `.bss`.
    pub fn state(&self) -> (Option<ScxExit>, ScxTotals) {
        let b = self.bss();
        let e = &b.exit_info;
        let exit = (e.exited != 0).then(|| ScxExit {
            kind: e.kind,
            exit_code: e.exit_code,
            reason: c_string(&e.reason),
            msg: c_string(&e.msg),
        });
        (exit, b.totals)
    }
}

/// Bytes from one `scx_vcpus` record to the next (an array's values are
/// 8-byte aligned).
fn record_stride() -> usize {
    size_of::<pvs_scx_vcpu>().next_multiple_of(8)
}

/// Maps `scx_vcpus` (created mmapable) read-write: the daemon zeroes a
/// record before it hands it out.
fn map_records(map: &libbpf_rs::MapMut<'_>, threads: u32) -> Result<MmapRaw, SchedExtError> {
    if map.value_size() as usize != size_of::<pvs_scx_vcpu>() || map.max_entries() != threads {
        return Err(SchedExtError::Io {
            what: format!(
                "map scx_vcpus: {} records of {} bytes, expected {threads} of {}",
                map.max_entries(),
                map.value_size(),
                size_of::<pvs_scx_vcpu>()
            ),
            source: std::io::Error::from(std::io::ErrorKind::InvalidData),
        });
    }
    map_array(map, threads as usize * record_stride(), true)
}

/// Maps the first `len` bytes of the values of `map` (an array created
/// mmapable), read-write or read-only.
fn map_array(
    map: &libbpf_rs::MapMut<'_>,
    len: usize,
    writable: bool,
) -> Result<MmapRaw, SchedExtError> {
    let fd = map.as_fd().as_raw_fd();
    let mut options = MmapOptions::new();
    options.len(len);
    let mapped = if writable {
        options.map_raw(fd)
    } else {
        options.map_raw_read_only(fd)
    };
    mapped.map_err(|source| SchedExtError::Io {
        what: format!("mmap map {}", map.name().to_string_lossy()),
        source,
    })
}

/// Which `scx_vcpus` records are handed out. A freed record is handed out
/// again only after every other free one: a callback of the program still
/// running for a thread just unregistered writes to a record no new
/// thread has yet.
struct RecordSlots {
    used: Vec<bool>,
    next: usize,
}

impl RecordSlots {
    fn new(n: u32) -> Self {
        Self {
            used: vec![false; n as usize],
            next: 0,
        }
    }

    fn take(&mut self) -> Option<u32> {
        let n = self.used.len();
        let i = (0..n)
            .map(|k| (self.next + k) % n)
            .find(|&i| !self.used[i])?;
        self.used[i] = true;
        self.next = (i + 1) % n;
        u32::try_from(i).ok()
    }

    fn give_back(&mut self, record: u32) {
        if let Some(u) = self.used.get_mut(record as usize) {
            *u = false;
        }
    }
}

/// Maps the program's `.bss` read-only (libbpf creates global-data maps
/// mmapable; offset 0 is the map's one value).
fn map_bss(map: &libbpf_rs::MapMut<'_>) -> Result<MmapRaw, SchedExtError> {
    let size = size_of::<skel::types::bss>();
    if (map.value_size() as usize) < size {
        return Err(SchedExtError::Io {
            what: format!(
                "map .bss: {} bytes, the skeleton's has {size}",
                map.value_size()
            ),
            source: std::io::Error::from(std::io::ErrorKind::InvalidData),
        });
    }
    map_array(map, size, false)
}

fn c_string<C: Copy + Into<i32>>(chars: &[C]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c.into() as u8)
        .take_while(|&c| c != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The bytes of a plain-data map value.
fn as_bytes<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: T is one of the bindgen/skeleton `repr(C)` structs of
    // integers and arrays (no padding the kernel would read uninitialised:
    // intf.h pads explicitly), viewed for its size only while `v` lives.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

#[cfg(test)]
mod tests {
    use super::{lockdown_in_force, RecordSlots};

    #[test]
    fn the_lockdown_mode_in_force_is_the_bracketed_one_unless_none() {
        assert_eq!(
            lockdown_in_force("[none] integrity confidentiality\n"),
            None
        );
        assert_eq!(
            lockdown_in_force("none [integrity] confidentiality\n").as_deref(),
            Some("integrity")
        );
        assert_eq!(
            lockdown_in_force("none integrity [confidentiality]\n").as_deref(),
            Some("confidentiality")
        );
        assert_eq!(lockdown_in_force(""), None);
    }

    #[test]
    fn a_freed_record_is_handed_out_again_only_after_the_other_free_ones() {
        let mut r = RecordSlots::new(3);
        assert_eq!((r.take(), r.take()), (Some(0), Some(1)));
        r.give_back(0);
        assert_eq!(r.take(), Some(2));
        assert_eq!(r.take(), Some(0));
    }

    #[test]
    fn no_record_is_handed_out_twice_and_none_beyond_the_array() {
        let mut r = RecordSlots::new(2);
        assert_eq!((r.take(), r.take(), r.take()), (Some(0), Some(1), None));
        r.give_back(7);
        assert_eq!(r.take(), None);
        r.give_back(1);
        assert_eq!(r.take(), Some(1));
    }
}
