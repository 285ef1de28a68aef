//! Loading the BPF object: options, the programs' tunables and map sizes,
//! attaching (the sched programs must attach; IRQ-context and KVM ones each
//! on its own), the ring buffer and its decoding callback.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapHandle, OpenObject, RingBuffer, RingBufferBuilder};
use serde::Serialize;
use tracing::{debug, warn};

use super::selftest::TestProgs;
use super::skel::{self, PvschedSkel, PvschedSkelBuilder};
use super::{Batch, BpfSource, BATCH};
use crate::events::lazy::LazyCells;
use crate::events::wire::decode;
use crate::events::EventSourceError;

/// Tunables of the BPF programs (the `const volatile` globals of
/// pvsched.bpf.c) and sizes of its maps. The daemon sets `lazy_wakeup`
/// from its configuration; tests and benches set the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BpfOptions {
    /// Report a tracked thread getting a CPU (SWITCH_IN).
    pub emit_switch_in: bool,
    /// Report a tracked thread being woken, with the waker's class.
    pub emit_waking: bool,
    /// Load and attach the KVM programs (kvm_exit, kvm_vcpu_wakeup,
    /// kvm_apic_accept_irq). They only fire where KVM runs the guest.
    pub kvm: bool,
    /// Report HLT exits of tracked vCPUs.
    pub emit_hlt_exits: bool,
    /// Report PAUSE (pause-loop) exits of tracked vCPUs; can be frequent.
    pub emit_pause_exits: bool,
    /// Report halt durations (kvm_vcpu_wakeup).
    pub emit_kvm_wakeup: bool,
    /// Report interrupts accepted by a vCPU of a tracked VMM.
    pub emit_kvm_irq: bool,
    /// Attach the irq/softirq/hrtimer entry-exit programs so that wakeups
    /// done in IRQ context (timers, devices) are not blamed on the task they
    /// interrupted. Off: the waker is always the current task.
    pub irq_context: bool,
    /// Do not report a tracked thread preempted by this process (the
    /// daemon) unless the CPU then goes to a third task: reporting the
    /// preemptions the daemon causes by waking up for an event would wake it
    /// again, a feedback loop.
    pub hide_self: bool,
    /// Let the daemon mark, per vCPU, records that need not wake it (they
    /// are read at its next wakeup): `BpfSource::set_lazy`. Off: every
    /// record may wake it.
    pub lazy_wakeup: bool,
    /// Queue a tracked thread's wakeup without waking the daemon when the
    /// CPU it last ran on is idle: it gets that CPU at once, no boost needed
    /// (records flagged `CPU_IDLE`). Needs `lazy_wakeup`.
    pub quiet_idle_wakeups: bool,
    /// With `quiet_idle_wakeups`: also when *any* CPU is idle and the thread may
    /// run on every CPU (the fair class's wakeup placement finds the idle one;
    /// a boost would make it preempt in place instead). For hosts with one LLC.
    pub quiet_any_idle_wakeups: bool,
    /// Flag a tracked thread's switch-outs and wakeups `NO_RIVAL` when no CPU
    /// runs a task from outside its process (each runs its idle task, the
    /// daemon or a thread of the same VMM): the policy's
    /// `boost_only_against_rivals` then starts no speculative boost (unless the
    /// VM runs guest RT work).
    pub find_rivals: bool,
    /// Ring buffer size in bytes (power of two, >= page size); each event is
    /// 48 bytes in the ring (40 + 8 header).
    pub ringbuf_bytes: u32,
    /// Capacity of the vCPU-thread map.
    pub max_tracked: u32,
    /// Capacity of the VMM-process map.
    pub max_vmms: u32,
    /// kvm_exit is a tracefs tracepoint: mount tracefs on /sys/kernel/tracing
    /// if neither it nor /sys/kernel/debug/tracing is there.
    pub mount_tracefs: bool,
    /// Also load the test-only program (kvm_exit filter driven by
    /// BPF_PROG_TEST_RUN) and keep program fds for test runs.
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
            quiet_idle_wakeups: true,
            quiet_any_idle_wakeups: true,
            find_rivals: true,
            ringbuf_bytes: 256 * 1024,
            max_tracked: 4096,
            max_vmms: 256,
            mount_tracefs: true,
            selftest: false,
        }
    }
}

/// Which KVM programs are attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KvmAttach {
    /// tp/kvm/kvm_exit (HLT, PAUSE).
    pub exit: bool,
    /// raw_tp/kvm_vcpu_wakeup.
    pub vcpu_wakeup: bool,
    /// raw_tp/kvm_apic_accept_irq.
    pub apic_irq: bool,
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

    /// Opens, configures, loads and attaches the object; `kvm`: with the
    /// KVM programs.
    fn load_with(opts: &BpfOptions, kvm: bool) -> Result<Self, EventSourceError> {
        let mut storage = MaybeUninit::<OpenObject>::uninit();
        let mut open = PvschedSkelBuilder::default()
            .open(&mut storage)
            .map_err(EventSourceError::bpf("open"))?;
        configure(&mut open, opts, kvm)?;
        let skel: PvschedSkel<'_> = open.load().map_err(EventSourceError::bpf(if kvm {
            "load (with KVM programs)"
        } else {
            "load"
        }))?;
        let (links, kvm_status) = attach_all(&skel, opts.irq_context, kvm)?;

        let handle = |m: &libbpf_rs::MapMut<'_>, name: &str| {
            MapHandle::try_from(m).map_err(EventSourceError::bpf(format!("map {name} handle")))
        };
        let tracked = handle(&skel.maps.tracked, "tracked")?;
        let vcpu_slots = handle(&skel.maps.vcpu_slots, "vcpu_slots")?;
        let lazy_map = handle(&skel.maps.lazy, "lazy")?;
        let lazy = LazyCells::map(lazy_map.as_fd().as_raw_fd(), opts.max_tracked.max(1))?;
        let vmm_tgid = handle(&skel.maps.vmm_tgid, "vmm_tgid")?;
        let stats = handle(&skel.maps.stats, "stats")?;
        let events = handle(&skel.maps.events, "events")?;
        let test_progs = if opts.selftest {
            Some(test_progs(&skel, kvm)?)
        } else {
            None
        };
        let (ringbuf, batch) = ring_buffer(&events)?;
        let prog_fds = program_fds(&skel);
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
            vcpu_slots,
            slot_keys: HashMap::new(),
            lazy,
            _lazy_map: lazy_map,
            vmm_tgid,
            stats,
            stats_buf: Mutex::new(vec![0u64; ncpus]),
            links,
            prog_fds,
            kvm: kvm_status,
            test_progs,
        })
    }
}

/// Attached programs, by tracepoint name.
type Links = Vec<(&'static str, Link)>;

/// Sets the programs' `const volatile` tunables, sizes the maps and picks
/// which programs load.
fn configure(
    open: &mut skel::OpenPvschedSkel<'_>,
    opts: &BpfOptions,
    kvm: bool,
) -> Result<(), EventSourceError> {
    let cpus = libbpf_rs::num_possible_cpus()
        .map_err(EventSourceError::bpf("count the possible CPUs".to_string()))?;
    let cpus = u32::try_from(cpus).unwrap_or(u32::MAX);
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
    ro.quiet_idle_wakeups = opts.quiet_idle_wakeups;
    ro.quiet_any_idle_wakeups = opts.quiet_any_idle_wakeups;
    ro.find_rivals = opts.find_rivals;
    ro.nr_cpu_ids = cpus;
    ro.nr_cpus = pvsched_base::sched::online_cpus()
        .map_err(|e| EventSourceError::Invalid(format!("count the online CPUs: {e}")))?;
    ro.self_tgid = if opts.hide_self {
        std::process::id()
    } else {
        0
    };
    let size = |map: &mut libbpf_rs::OpenMapMut<'_>, name: &str, n: u32| {
        map.set_max_entries(n.max(1))
            .map_err(EventSourceError::bpf(format!("size map {name}")))
    };
    size(&mut open.maps.tracked, "tracked", opts.max_tracked)?;
    size(&mut open.maps.lazy, "lazy", opts.max_tracked)?;
    size(&mut open.maps.vcpu_slots, "vcpu_slots", opts.max_tracked)?;
    size(&mut open.maps.vmm_tgid, "vmm_tgid", opts.max_vmms)?;
    size(&mut open.maps.events, "events", opts.ringbuf_bytes)?;
    size(&mut open.maps.cpu_lines, "cpu_lines", cpus)?;
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
    Ok(())
}

/// Attaches the sched programs (which must attach), the IRQ-context ones and
/// the KVM ones (each on its own, failures logged).
fn attach_all(
    skel: &PvschedSkel<'_>,
    irq_context: bool,
    kvm: bool,
) -> Result<(Links, KvmAttach), EventSourceError> {
    let mut links = Vec::new();
    attach(&mut links, "sched_switch", &skel.progs.pvs_sched_switch)?;
    attach(&mut links, "sched_waking", &skel.progs.pvs_sched_waking)?;
    if irq_context {
        for (name, prog) in irq_programs(skel) {
            if let Err(e) = attach(&mut links, name, prog) {
                warn!(error = %e, "IRQ-context program not attached: wakers in {name} misclassified");
            }
        }
    }
    let mut status = KvmAttach::default();
    if kvm {
        let kvm_progs = [
            ("kvm_exit", &skel.progs.pvs_kvm_exit, &mut status.exit),
            (
                "kvm_vcpu_wakeup",
                &skel.progs.pvs_kvm_vcpu_wakeup,
                &mut status.vcpu_wakeup,
            ),
            (
                "kvm_apic_accept_irq",
                &skel.progs.pvs_kvm_apic_accept_irq,
                &mut status.apic_irq,
            ),
        ];
        for (name, prog, attached) in kvm_progs {
            match attach(&mut links, name, prog) {
                Ok(()) => *attached = true,
                Err(e) => warn!(error = %e, "KVM program not attached: no {name} events"),
            }
        }
    }
    Ok((links, status))
}

/// Program fds kept for BPF_PROG_TEST_RUN.
fn test_progs(skel: &PvschedSkel<'_>, kvm: bool) -> Result<TestProgs, EventSourceError> {
    let dup = |p: &libbpf_rs::ProgramMut<'_>| p.as_fd().try_clone_to_owned();
    Ok(TestProgs {
        kvm_exit: dup(&skel.progs.pvs_kvm_exit_test)
            .map_err(EventSourceError::io("dup prog fd"))?,
        kvm_vcpu_wakeup: kvm
            .then(|| dup(&skel.progs.pvs_kvm_vcpu_wakeup).ok())
            .flatten(),
        kvm_apic_accept_irq: kvm
            .then(|| dup(&skel.progs.pvs_kvm_apic_accept_irq).ok())
            .flatten(),
    })
}

/// The ring buffer on `events`; its callback decodes records into a batch
/// of fixed capacity (no allocation per event).
fn ring_buffer(
    events: &MapHandle,
) -> Result<(RingBuffer<'static>, Arc<Mutex<Batch>>), EventSourceError> {
    let batch = Arc::new(Mutex::new(Batch {
        events: Vec::with_capacity(BATCH),
        decode_errors: 0,
    }));
    let cb_batch = Arc::clone(&batch);
    let mut rb = RingBufferBuilder::new();
    rb.add(events, move |bytes: &[u8]| {
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
    Ok((ringbuf, batch))
}

type Program<'a> = (&'static str, &'a libbpf_rs::ProgramMut<'a>);

/// The IRQ-context programs (wakeups from IRQ context are not blamed on
/// the interrupted task), by tracepoint name.
fn irq_programs<'a>(skel: &'a PvschedSkel<'a>) -> [Program<'a>; 6] {
    [
        ("irq_handler_entry", &skel.progs.pvs_irq_entry),
        ("irq_handler_exit", &skel.progs.pvs_irq_exit),
        ("softirq_entry", &skel.progs.pvs_softirq_entry),
        ("softirq_exit", &skel.progs.pvs_softirq_exit),
        ("hrtimer_expire_entry", &skel.progs.pvs_hrtimer_entry),
        ("hrtimer_expire_exit", &skel.progs.pvs_hrtimer_exit),
    ]
}

/// Descriptors of every loaded program (for run-time statistics).
fn program_fds(skel: &PvschedSkel<'_>) -> Vec<(&'static str, OwnedFd)> {
    let sched = [
        ("sched_switch", &skel.progs.pvs_sched_switch),
        ("sched_waking", &skel.progs.pvs_sched_waking),
    ];
    let kvm = [
        ("kvm_exit", &skel.progs.pvs_kvm_exit),
        ("kvm_vcpu_wakeup", &skel.progs.pvs_kvm_vcpu_wakeup),
        ("kvm_apic_accept_irq", &skel.progs.pvs_kvm_apic_accept_irq),
        ("kvm_exit_test", &skel.progs.pvs_kvm_exit_test),
    ];
    sched
        .into_iter()
        .chain(irq_programs(skel))
        .chain(kvm)
        .filter(|(_, prog)| prog.autoload())
        .filter_map(|(name, prog)| Some((name, prog.as_fd().try_clone_to_owned().ok()?)))
        .collect()
}
