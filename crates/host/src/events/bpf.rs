//! Loader of `src/bpf/pvsched.bpf.c` and consumer of its ring buffer.

use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, MapHandle, OpenObject, RingBuffer, RingBufferBuilder};
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use super::{decode, wire, EventSourceError, HostEvent};

#[allow(
    clippy::all,
    clippy::pedantic,
    dead_code,
    non_camel_case_types,
    non_snake_case,
    unused_qualifications
)]
pub(crate) mod skel {
    include!(concat!(env!("OUT_DIR"), "/pvsched.skel.rs"));
}

use skel::{PvschedSkel, PvschedSkelBuilder};

/// Which vmlinux.h the programs were built with (`min`, `btf`, or `file
/// <path>`; see build.rs).
pub const VMLINUX_H_USED: &str = env!("PVSCHED_VMLINUX_H_USED");

/// Tunables of the BPF programs (the `const volatile` globals of
/// pvsched.bpf.c) and sizes of its maps. Usable as `#[command(flatten)]`
/// CLI options and as a serde (TOML) table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct BpfOptions {
    /// Report a tracked thread getting a CPU (SWITCH_IN).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub emit_switch_in: bool,
    /// Report a tracked thread being woken, with the waker's class.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub emit_waking: bool,
    /// Load and attach the KVM programs (kvm_exit, kvm_vcpu_wakeup,
    /// kvm_apic_accept_irq). They only fire where KVM runs the guest.
    #[arg(long = "bpf-kvm", default_value_t = true, action = clap::ArgAction::Set)]
    pub kvm: bool,
    /// Report HLT exits of tracked vCPUs.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub emit_hlt_exits: bool,
    /// Report PAUSE (pause-loop) exits of tracked vCPUs; can be frequent.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub emit_pause_exits: bool,
    /// Report halt durations (kvm_vcpu_wakeup).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub emit_kvm_wakeup: bool,
    /// Report interrupts accepted by a vCPU of a tracked VMM.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub emit_kvm_irq: bool,
    /// Attach the irq/softirq/hrtimer entry-exit programs so that wakeups
    /// done in IRQ context (timers, devices) are not blamed on the task they
    /// interrupted. Off: the waker is always the current task.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub irq_context: bool,
    /// Do not report a tracked thread preempted by this process (the
    /// daemon) unless the CPU then goes to a third task: reporting the
    /// preemptions the daemon causes by waking up for an event would wake it
    /// again, a feedback loop.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub hide_self: bool,
    /// Let the daemon mark, per vCPU, records that need not wake it (they
    /// are read at its next wakeup): `BpfSource::set_lazy`. Off: every
    /// record may wake it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub lazy_wakeup: bool,
    /// Ring buffer size in bytes (power of two, >= page size); each event is
    /// 48 bytes in the ring (40 + 8 header).
    #[arg(long, default_value_t = 256 * 1024)]
    pub ringbuf_bytes: u32,
    /// Capacity of the vCPU-thread map.
    #[arg(long, default_value_t = 4096)]
    pub max_tracked: u32,
    /// Capacity of the VMM-process map.
    #[arg(long, default_value_t = 256)]
    pub max_vmms: u32,
    /// kvm_exit is a tracefs tracepoint: mount tracefs on /sys/kernel/tracing
    /// if neither it nor /sys/kernel/debug/tracing is there.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub mount_tracefs: bool,
    /// Also load the test-only program (kvm_exit filter driven by
    /// BPF_PROG_TEST_RUN) and keep program fds for test runs.
    #[arg(skip)]
    #[serde(skip)]
    #[doc(hidden)]
    pub selftest: bool,
}

impl Default for BpfOptions {
    fn default() -> Self {
        BpfOptions {
            emit_switch_in: true,
            emit_waking: true,
            kvm: true,
            emit_hlt_exits: true,
            emit_pause_exits: true,
            emit_kvm_wakeup: true,
            emit_kvm_irq: true,
            irq_context: true,
            hide_self: true,
            lazy_wakeup: true,
            ringbuf_bytes: 256 * 1024,
            max_tracked: 4096,
            max_vmms: 256,
            mount_tracefs: true,
            selftest: false,
        }
    }
}

/// Which KVM programs are attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvmAttach {
    /// tp/kvm/kvm_exit (HLT, PAUSE).
    pub exit: bool,
    /// raw_tp/kvm_vcpu_wakeup.
    pub vcpu_wakeup: bool,
    /// raw_tp/kvm_apic_accept_irq.
    pub apic_irq: bool,
}

/// The `lazy` array map, mmapped: one u64 of `enum pvs_lazy` bits per slot
/// (array map elements are 8-byte aligned: a u32 value would still take 8).
struct LazyMap {
    base: std::ptr::NonNull<std::sync::atomic::AtomicU64>,
    slots: u32,
    bytes: usize,
}

// SAFETY: the mapping is shared memory of u64 cells accessed only through
// AtomicU64; it is owned by this value and unmapped once, on drop.
unsafe impl Send for LazyMap {}

impl LazyMap {
    fn map(fd: RawFd, slots: u32) -> Result<LazyMap, EventSourceError> {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let bytes = (slots as usize * 8).div_ceil(page).max(1) * page;
        // SAFETY: a new shared mapping of a BPF_F_MMAPABLE array map's fd;
        // the kernel checks the length against the map. Nothing else aliases it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(EventSourceError::Io {
                what: "mmap of the lazy map".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        let base = std::ptr::NonNull::new(p.cast()).ok_or_else(|| {
            EventSourceError::Invalid("mmap of the lazy map returned NULL".into())
        })?;
        Ok(LazyMap { base, slots, bytes })
    }

    fn set(&self, slot: u32, bits: u32) {
        if slot < self.slots {
            // SAFETY: slot < slots, and slots * 8 <= bytes are mapped.
            let cell = unsafe { &*self.base.as_ptr().add(slot as usize) };
            cell.store(u64::from(bits), std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Drop for LazyMap {
    fn drop(&mut self) {
        // SAFETY: our own mapping, of this length, unmapped only here.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.bytes);
        }
    }
}

/// Records are decoded in the ring-buffer callback into this fixed-capacity
/// batch, then handed to the caller's closure: no allocation per event.
const BATCH: usize = 64;

struct Batch {
    events: Vec<HostEvent>,
    decode_errors: u64,
}

/// Program fds kept for BPF_PROG_TEST_RUN (selftest only).
struct TestProgs {
    kvm_exit: OwnedFd,
    kvm_vcpu_wakeup: Option<OwnedFd>,
    kvm_apic_accept_irq: Option<OwnedFd>,
}

/// The BPF event source. Programs stay attached while it lives.
pub struct BpfSource {
    // Drop order: the ring buffer (which has the `events` map mmapped and in
    // its epoll set) before the map handle.
    ringbuf: RingBuffer<'static>,
    events: MapHandle,
    batch: Arc<Mutex<Batch>>,
    tracked: MapHandle,
    /// Before its map handle: unmapped first.
    lazy: LazyMap,
    _lazy_map: MapHandle,
    /// Tracked thread -> its slot in `lazy`; free slots.
    lazy_slots: std::collections::HashMap<u32, u32>,
    free_slots: Vec<u32>,
    vmm_tgid: MapHandle,
    stats: MapHandle,
    stats_buf: Mutex<Vec<u64>>,
    links: Vec<(&'static str, Link)>,
    prog_fds: Vec<(&'static str, OwnedFd)>,
    kvm: KvmAttach,
    test_progs: Option<TestProgs>,
}

fn libbpf_log(level: libbpf_rs::PrintLevel, msg: String) {
    let msg = msg.trim_end();
    match level {
        libbpf_rs::PrintLevel::Warn => debug!(target: "libbpf", "{msg}"),
        _ => tracing::trace!(target: "libbpf", "{msg}"),
    }
}

fn tracefs_present() -> bool {
    Path::new("/sys/kernel/tracing/events").exists()
        || Path::new("/sys/kernel/debug/tracing/events").exists()
}

fn mount_tracefs() -> std::io::Result<()> {
    // SAFETY: mount(2) with NUL-terminated string literals and no data.
    let r = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            c"/sys/kernel/tracing".as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn attach(
    links: &mut Vec<(&'static str, Link)>,
    name: &'static str,
    prog: &libbpf_rs::ProgramMut<'_>,
) -> Result<(), EventSourceError> {
    let link = prog
        .attach()
        .map_err(EventSourceError::bpf(format!("attach {name}")))?;
    links.push((name, link));
    Ok(())
}

/// Run count and run time of one program, from the kernel's BPF stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProgStats {
    pub name: &'static str,
    /// Runs counted while stats were enabled.
    pub run_cnt: u64,
    /// Total run time in ns while stats were enabled.
    pub run_time_ns: u64,
}

/// Turns on the kernel's per-program run-time accounting (BPF_ENABLE_STATS)
/// for as long as the returned descriptor is open. Costs two clock reads
/// per program run; off by default.
pub fn enable_run_time_stats() -> Result<OwnedFd, EventSourceError> {
    // SAFETY: BPF_ENABLE_STATS takes no pointers; it returns a new fd or an error.
    let fd = unsafe {
        libbpf_rs::libbpf_sys::bpf_enable_stats(libbpf_rs::libbpf_sys::BPF_STATS_RUN_TIME)
    };
    if fd < 0 {
        return Err(EventSourceError::Io {
            what: "BPF_ENABLE_STATS".into(),
            source: std::io::Error::from_raw_os_error(-fd),
        });
    }
    // SAFETY: fd is a new descriptor (checked >= 0 above), owned by nobody else.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

impl BpfSource {
    /// Loads the programs and attaches them. The sched programs must attach;
    /// the KVM ones (if `opts.kvm`) are attached each on its own, failures
    /// logged and reported by [`BpfSource::kvm_attach_status`]. If the KVM
    /// programs make the load fail, it is retried without them.
    pub fn load(opts: BpfOptions) -> Result<Self, EventSourceError> {
        if !Path::new("/sys/kernel/btf/vmlinux").exists() {
            return Err(EventSourceError::Unavailable(
                "no kernel BTF (/sys/kernel/btf/vmlinux; CONFIG_DEBUG_INFO_BTF)".into(),
            ));
        }
        if !opts.ringbuf_bytes.is_power_of_two() || opts.ringbuf_bytes < 4096 {
            return Err(EventSourceError::Invalid(format!(
                "ringbuf_bytes {} is not a power of two >= 4096",
                opts.ringbuf_bytes
            )));
        }
        libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, libbpf_log)));

        let mut want_kvm = opts.kvm;
        if want_kvm && opts.mount_tracefs && !tracefs_present() {
            match mount_tracefs() {
                Ok(()) => debug!("mounted tracefs on /sys/kernel/tracing (for kvm_exit)"),
                Err(e) => warn!(error = %e, "cannot mount tracefs: kvm_exit will not attach"),
            }
        }
        match Self::load_with(&opts, want_kvm) {
            Ok(s) => Ok(s),
            Err(EventSourceError::Bpf { what, source }) if want_kvm => {
                if source.kind() == libbpf_rs::ErrorKind::PermissionDenied {
                    return Err(EventSourceError::Bpf { what, source });
                }
                warn!(error = %source, "BPF load with the KVM programs failed; loading without them");
                want_kvm = false;
                Self::load_with(&opts, want_kvm)
            }
            Err(e) => Err(e),
        }
    }

    fn load_with(opts: &BpfOptions, kvm: bool) -> Result<Self, EventSourceError> {
        let mut storage = MaybeUninit::<OpenObject>::uninit();
        let builder = PvschedSkelBuilder::default();
        let mut open = builder
            .open(&mut storage)
            .map_err(EventSourceError::bpf("open"))?;

        {
            let ro = open
                .maps
                .rodata_data
                .as_deref_mut()
                .ok_or_else(|| EventSourceError::Invalid("BPF object has no .rodata".into()))?;
            ro.emit_switch_in = opts.emit_switch_in;
            ro.emit_waking = opts.emit_waking;
            ro.emit_hlt_exits = opts.emit_hlt_exits;
            ro.emit_pause_exits = opts.emit_pause_exits;
            ro.emit_kvm_wakeup = opts.emit_kvm_wakeup;
            ro.emit_kvm_irq = opts.emit_kvm_irq;
            ro.track_irq_context = opts.irq_context;
            ro.lazy_wakeup = opts.lazy_wakeup;
            ro.self_tgid = if opts.hide_self {
                std::process::id()
            } else {
                0
            };
        }
        let size = |map: &mut libbpf_rs::OpenMapMut<'_>, name: &str, n: u32| {
            map.set_max_entries(n.max(1))
                .map_err(EventSourceError::bpf(format!("size map {name}")))
        };
        size(&mut open.maps.tracked, "tracked", opts.max_tracked)?;
        size(&mut open.maps.lazy, "lazy", opts.max_tracked)?;
        size(&mut open.maps.vmm_tgid, "vmm_tgid", opts.max_vmms)?;
        size(&mut open.maps.events, "events", opts.ringbuf_bytes)?;
        open.progs.pvs_kvm_exit.set_autoload(kvm);
        open.progs.pvs_kvm_vcpu_wakeup.set_autoload(kvm);
        open.progs.pvs_kvm_apic_accept_irq.set_autoload(kvm);
        open.progs.pvs_kvm_exit_test.set_autoload(opts.selftest);
        for p in [
            &mut open.progs.pvs_irq_entry,
            &mut open.progs.pvs_irq_exit,
            &mut open.progs.pvs_softirq_entry,
            &mut open.progs.pvs_softirq_exit,
            &mut open.progs.pvs_hrtimer_entry,
            &mut open.progs.pvs_hrtimer_exit,
        ] {
            p.set_autoload(opts.irq_context);
        }

        let skel: PvschedSkel<'_> = open.load().map_err(EventSourceError::bpf(if kvm {
            "load (with KVM programs)"
        } else {
            "load"
        }))?;

        let mut links = Vec::new();
        attach(&mut links, "sched_switch", &skel.progs.pvs_sched_switch)?;
        attach(&mut links, "sched_waking", &skel.progs.pvs_sched_waking)?;
        if opts.irq_context {
            let irq_progs = [
                ("irq_handler_entry", &skel.progs.pvs_irq_entry),
                ("irq_handler_exit", &skel.progs.pvs_irq_exit),
                ("softirq_entry", &skel.progs.pvs_softirq_entry),
                ("softirq_exit", &skel.progs.pvs_softirq_exit),
                ("hrtimer_expire_entry", &skel.progs.pvs_hrtimer_entry),
                ("hrtimer_expire_exit", &skel.progs.pvs_hrtimer_exit),
            ];
            for (name, prog) in irq_progs {
                if let Err(e) = attach(&mut links, name, prog) {
                    warn!(error = %e, "IRQ-context program not attached: wakers in {name} misclassified");
                }
            }
        }
        let mut status = KvmAttach::default();
        if kvm {
            let kvm_progs = [
                ("kvm_exit", &skel.progs.pvs_kvm_exit),
                ("kvm_vcpu_wakeup", &skel.progs.pvs_kvm_vcpu_wakeup),
                ("kvm_apic_accept_irq", &skel.progs.pvs_kvm_apic_accept_irq),
            ];
            for (name, prog) in kvm_progs {
                match attach(&mut links, name, prog) {
                    Ok(()) => match name {
                        "kvm_exit" => status.exit = true,
                        "kvm_vcpu_wakeup" => status.vcpu_wakeup = true,
                        _ => status.apic_irq = true,
                    },
                    Err(e) => warn!(error = %e, "KVM program not attached: no {name} events"),
                }
            }
        }

        let handle = |m: &libbpf_rs::MapMut<'_>, name: &str| {
            MapHandle::try_from(m).map_err(EventSourceError::bpf(format!("map {name} handle")))
        };
        let tracked = handle(&skel.maps.tracked, "tracked")?;
        let lazy_map = handle(&skel.maps.lazy, "lazy")?;
        let lazy = LazyMap::map(lazy_map.as_fd().as_raw_fd(), opts.max_tracked.max(1))?;
        let vmm_tgid = handle(&skel.maps.vmm_tgid, "vmm_tgid")?;
        let stats = handle(&skel.maps.stats, "stats")?;
        let events = handle(&skel.maps.events, "events")?;

        let test_progs = if opts.selftest {
            let dup = |p: &libbpf_rs::ProgramMut<'_>| p.as_fd().try_clone_to_owned();
            Some(TestProgs {
                kvm_exit: dup(&skel.progs.pvs_kvm_exit_test)
                    .map_err(EventSourceError::io("dup prog fd"))?,
                kvm_vcpu_wakeup: if kvm {
                    dup(&skel.progs.pvs_kvm_vcpu_wakeup).ok()
                } else {
                    None
                },
                kvm_apic_accept_irq: if kvm {
                    dup(&skel.progs.pvs_kvm_apic_accept_irq).ok()
                } else {
                    None
                },
            })
        } else {
            None
        };

        let batch = Arc::new(Mutex::new(Batch {
            events: Vec::with_capacity(BATCH),
            decode_errors: 0,
        }));
        let cb_batch = Arc::clone(&batch);
        let mut rb = RingBufferBuilder::new();
        rb.add(&events, move |bytes: &[u8]| {
            let mut b = cb_batch.lock().unwrap_or_else(|p| p.into_inner());
            match decode(bytes) {
                Ok(ev) if b.events.len() < b.events.capacity() => b.events.push(ev),
                Ok(_) => b.decode_errors += 1, // cannot happen: consume_raw_n(BATCH)
                Err(_) => b.decode_errors += 1,
            }
            0
        })
        .map_err(EventSourceError::bpf("ring buffer"))?;
        let ringbuf = rb.build().map_err(EventSourceError::bpf("ring buffer"))?;

        let mut prog_fds = Vec::new();
        {
            let all = [
                ("sched_switch", &skel.progs.pvs_sched_switch),
                ("sched_waking", &skel.progs.pvs_sched_waking),
                ("irq_handler_entry", &skel.progs.pvs_irq_entry),
                ("irq_handler_exit", &skel.progs.pvs_irq_exit),
                ("softirq_entry", &skel.progs.pvs_softirq_entry),
                ("softirq_exit", &skel.progs.pvs_softirq_exit),
                ("hrtimer_expire_entry", &skel.progs.pvs_hrtimer_entry),
                ("hrtimer_expire_exit", &skel.progs.pvs_hrtimer_exit),
                ("kvm_exit", &skel.progs.pvs_kvm_exit),
                ("kvm_vcpu_wakeup", &skel.progs.pvs_kvm_vcpu_wakeup),
                ("kvm_apic_accept_irq", &skel.progs.pvs_kvm_apic_accept_irq),
                ("kvm_exit_test", &skel.progs.pvs_kvm_exit_test),
            ];
            for (name, prog) in all {
                if prog.autoload() {
                    if let Ok(fd) = prog.as_fd().try_clone_to_owned() {
                        prog_fds.push((name, fd));
                    }
                }
            }
        }
        let ncpus =
            libbpf_rs::num_possible_cpus().map_err(EventSourceError::bpf("possible cpus"))?;
        // The skeleton (object, program and map fds) is dropped here: links
        // keep the programs, handles keep the maps.
        drop(skel);
        Ok(BpfSource {
            ringbuf,
            events,
            batch,
            tracked,
            lazy,
            _lazy_map: lazy_map,
            lazy_slots: std::collections::HashMap::new(),
            free_slots: (0..opts.max_tracked.max(1)).rev().collect(),
            vmm_tgid,
            stats,
            stats_buf: Mutex::new(vec![0u64; ncpus]),
            links,
            prog_fds,
            kvm: status,
            test_progs,
        })
    }

    /// True when every KVM program is attached.
    pub fn kvm_attached(&self) -> bool {
        self.kvm.exit && self.kvm.vcpu_wakeup && self.kvm.apic_irq
    }

    /// Which KVM programs are attached.
    pub fn kvm_attach_status(&self) -> KvmAttach {
        self.kvm
    }

    /// Names of the attached programs.
    pub fn attached(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.links.iter().map(|(n, _)| *n)
    }

    /// Registers vCPU thread `tid` as vCPU `vcpu` of VM `vm`, every record
    /// waking the daemon until [`BpfSource::set_lazy`] says otherwise.
    pub fn try_track(&mut self, tid: u32, vm: u32, vcpu: u32) -> Result<(), EventSourceError> {
        if tid == 0 {
            return Err(EventSourceError::Invalid("tid 0".into()));
        }
        let slot = match self.lazy_slots.get(&tid) {
            Some(&s) => s,
            None => self.free_slots.pop().ok_or_else(|| {
                EventSourceError::Invalid(format!(
                    "tid {tid}: all {} vCPU slots in use (bpf max_tracked)",
                    self.lazy.slots
                ))
            })?,
        };
        self.lazy.set(slot, 0);
        let mut val = [0u8; wire::VCPU_SIZE];
        val[..4].copy_from_slice(&vm.to_ne_bytes());
        val[4..8].copy_from_slice(&vcpu.to_ne_bytes());
        val[8..12].copy_from_slice(&slot.to_ne_bytes());
        match self.tracked.update(&tid.to_ne_bytes(), &val, MapFlags::ANY) {
            Ok(()) => {
                self.lazy_slots.insert(tid, slot);
                Ok(())
            }
            Err(e) => {
                if !self.lazy_slots.contains_key(&tid) {
                    self.free_slots.push(slot);
                }
                Err(EventSourceError::bpf(format!("track tid {tid}"))(e))
            }
        }
    }

    /// [`BpfSource::try_track`], failures logged.
    pub fn track(&mut self, tid: u32, vm: u32, vcpu: u32) {
        if let Err(e) = self.try_track(tid, vm, vcpu) {
            warn!(tid, vm, vcpu, error = %e, "cannot track vCPU thread");
        }
    }

    /// Forgets `tid` (no error if it was not tracked).
    pub fn untrack(&mut self, tid: u32) {
        let _ = self.tracked.delete(&tid.to_ne_bytes());
        if let Some(slot) = self.lazy_slots.remove(&tid) {
            self.lazy.set(slot, 0);
            self.free_slots.push(slot);
        }
    }

    /// Which records of tracked thread `tid` are queued without waking the
    /// reader (`wire::LAZY_*` bits; 0: all wake it). A memory store, no
    /// syscall; unknown threads are ignored.
    pub fn set_lazy(&mut self, tid: u32, bits: u32) {
        if let Some(&slot) = self.lazy_slots.get(&tid) {
            self.lazy.set(slot, bits & wire::LAZY_ALL);
        }
    }

    /// Records submitted without a wakeup since load.
    pub fn lazy_events(&self) -> u64 {
        self.stat(wire::STAT_LAZY)
    }

    /// Registers VMM process `tgid` as VM `vm`.
    pub fn try_track_vmm(&mut self, tgid: u32, vm: u32) -> Result<(), EventSourceError> {
        if tgid == 0 {
            return Err(EventSourceError::Invalid("tgid 0".into()));
        }
        self.vmm_tgid
            .update(&tgid.to_ne_bytes(), &vm.to_ne_bytes(), MapFlags::ANY)
            .map_err(EventSourceError::bpf(format!("track vmm {tgid}")))
    }

    /// [`BpfSource::try_track_vmm`], failures logged.
    pub fn track_vmm(&mut self, tgid: u32, vm: u32) {
        if let Err(e) = self.try_track_vmm(tgid, vm) {
            warn!(tgid, vm, error = %e, "cannot track VMM process");
        }
    }

    pub fn untrack_vmm(&mut self, tgid: u32) {
        let _ = self.vmm_tgid.delete(&tgid.to_ne_bytes());
    }

    /// The ring buffer's epoll descriptor: readable when records wait.
    pub fn fd(&self) -> RawFd {
        self.ringbuf.epoll_fd()
    }

    /// Delivers every waiting record, without blocking. Allocation-free.
    /// Returns the number of events delivered.
    pub fn consume(&mut self, mut f: impl FnMut(HostEvent)) -> usize {
        let mut total = 0;
        loop {
            let n = self.ringbuf.consume_raw_n(BATCH);
            let mut b = self.batch.lock().unwrap_or_else(|p| p.into_inner());
            for ev in b.events.drain(..) {
                f(ev);
                total += 1;
            }
            drop(b);
            if n < BATCH as i32 {
                break;
            }
        }
        total
    }

    /// Waits up to `timeout` for a record, then delivers all of them.
    pub fn poll(
        &mut self,
        timeout: Duration,
        f: impl FnMut(HostEvent),
    ) -> Result<usize, EventSourceError> {
        wait_readable(self.fd(), timeout)?;
        Ok(self.consume(f))
    }

    fn stat(&self, idx: u32) -> u64 {
        let mut buf = self.stats_buf.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: a per-CPU u64 array: the kernel writes one u64 per possible CPU,
        // which is what buf holds; the key is a u32 of ours.
        let r = unsafe {
            libbpf_rs::libbpf_sys::bpf_map_lookup_elem(
                self.stats.as_fd().as_raw_fd(),
                (&raw const idx).cast(),
                buf.as_mut_ptr().cast(),
            )
        };
        if r != 0 {
            return 0;
        }
        buf.iter().sum()
    }

    /// Events lost: ring buffer full (counted per CPU in the kernel), plus
    /// records that did not decode.
    pub fn dropped_events(&self) -> u64 {
        let undecodable = self.batch.lock().map(|b| b.decode_errors).unwrap_or(0);
        self.stat(wire::STAT_DROPPED) + undecodable
    }

    /// Events the programs submitted since load.
    pub fn emitted_events(&self) -> u64 {
        self.stat(wire::STAT_EMITTED)
    }

    /// Per-program run counts and times (zero unless stats are enabled, see
    /// [`enable_run_time_stats`]).
    pub fn prog_stats(&self) -> Vec<ProgStats> {
        self.prog_fds
            .iter()
            .map(|(name, fd)| {
                let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
                let mut len = std::mem::size_of_val(&info) as u32;
                // SAFETY: info and len are ours; the kernel writes at most len bytes.
                let r = unsafe {
                    libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(
                        fd.as_raw_fd(),
                        &mut info,
                        &mut len,
                    )
                };
                if r != 0 {
                    return ProgStats {
                        name,
                        ..Default::default()
                    };
                }
                ProgStats {
                    name,
                    run_cnt: info.run_cnt,
                    run_time_ns: info.run_time_ns,
                }
            })
            .collect()
    }

    /// Ring buffer map (for inspection).
    pub fn events_map(&self) -> &MapHandle {
        &self.events
    }

    /// BPF_PROG_TEST_RUN of a raw_tp program with `args` as its arguments
    /// (raw_tp test runs take no repeat count: loop to measure).
    fn test_run(fd: &OwnedFd, args: &[u64]) -> Result<(), EventSourceError> {
        let mut ctx: Vec<u8> = args.iter().flat_map(|a| a.to_ne_bytes()).collect();
        let mut opts = libbpf_rs::libbpf_sys::bpf_test_run_opts {
            sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_test_run_opts>() as _,
            ctx_in: ctx.as_mut_ptr().cast(),
            ctx_size_in: ctx.len() as u32,
            ..Default::default()
        };
        // SAFETY: opts points at ctx bytes of ours that outlive the call.
        let r = unsafe { libbpf_rs::libbpf_sys::bpf_prog_test_run_opts(fd.as_raw_fd(), &mut opts) };
        if r != 0 {
            return Err(EventSourceError::Io {
                what: "BPF_PROG_TEST_RUN".into(),
                source: std::io::Error::from_raw_os_error(-r),
            });
        }
        Ok(())
    }

    /// Test only: runs the kvm_exit filter in the kernel, in the calling
    /// thread, as if the tracepoint fired with `(exit_reason, isa)`.
    #[doc(hidden)]
    pub fn selftest_kvm_exit(&self, exit_reason: u32, isa: u32) -> Result<(), EventSourceError> {
        let t = self
            .test_progs
            .as_ref()
            .ok_or_else(|| EventSourceError::Invalid("selftest off".into()))?;
        Self::test_run(&t.kvm_exit, &[exit_reason as u64, isa as u64])
    }

    /// Test only: runs the attached kvm_vcpu_wakeup program in the calling
    /// thread with the tracepoint's arguments.
    #[doc(hidden)]
    pub fn selftest_kvm_vcpu_wakeup(
        &self,
        ns: u64,
        waited: bool,
        valid: bool,
    ) -> Result<(), EventSourceError> {
        let t = self
            .test_progs
            .as_ref()
            .and_then(|t| t.kvm_vcpu_wakeup.as_ref());
        let t = t.ok_or_else(|| {
            EventSourceError::Invalid("selftest off or KVM programs not loaded".into())
        })?;
        Self::test_run(t, &[ns, waited as u64, valid as u64])
    }

    /// Test only: runs the attached kvm_apic_accept_irq program in the
    /// calling thread with the tracepoint's arguments.
    #[doc(hidden)]
    pub fn selftest_kvm_apic_accept_irq(
        &self,
        apicid: u32,
        dm: u16,
        tm: u16,
        vec: u8,
    ) -> Result<(), EventSourceError> {
        let t = self
            .test_progs
            .as_ref()
            .and_then(|t| t.kvm_apic_accept_irq.as_ref());
        let t = t.ok_or_else(|| {
            EventSourceError::Invalid("selftest off or KVM programs not loaded".into())
        })?;
        Self::test_run(t, &[apicid as u64, dm as u64, tm as u64, vec as u64])
    }
}

/// ppoll() on one descriptor; `Ok` on readiness or timeout, EINTR included.
pub(crate) fn wait_readable(fd: RawFd, timeout: Duration) -> Result<(), EventSourceError> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: one valid pollfd and timespec of ours; no signal mask.
    let r = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(EventSourceError::Io {
                what: "ppoll".into(),
                source: e,
            });
        }
    }
    Ok(())
}
