//! The BPF event source: loads `src/bpf/pvsched.bpf.c` (`load.rs`),
//! registers the vCPU threads and VMM processes to watch, and delivers the
//! ring buffer's records as [`HostEvent`]s. Test runs and run-time
//! statistics of the programs are in `selftest.rs`.

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libbpf_rs::{Link, MapCore, MapFlags, MapHandle, RingBuffer};
use tracing::warn;

use super::lazy::{LazyCells, Quiet};
use super::wire::{pvs_vcpu_key, PVS_STAT_DROPPED, PVS_STAT_EMITTED, PVS_STAT_LAZY, VCPU_SIZE};
use super::{EventSourceError, HostEvent};

mod load;
mod selftest;

pub use load::{BpfOptions, KvmAttach};
use selftest::TestProgs;
pub use selftest::{enable_run_time_stats, ProgStats};

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

/// Which vmlinux.h the programs were built with (`min`, `btf`, or `file
/// <path>`; see build.rs).
pub const VMLINUX_H_USED: &str = env!("PVSCHED_VMLINUX_H_USED");

/// Records are decoded in the ring-buffer callback into this fixed-capacity
/// batch, then handed to the caller's closure: no allocation per event.
const BATCH: usize = 64;

struct Batch {
    events: Vec<HostEvent>,
    decode_errors: u64,
}

/// The BPF event source. Programs stay attached while it lives.
pub struct BpfSource {
    // Drop order: the ring buffer (which has the `events` map mmapped and in
    // its epoll set) before the map handle.
    ringbuf: RingBuffer<'static>,
    events: MapHandle,
    batch: Arc<Mutex<Batch>>,
    tracked: MapHandle,
    /// vCPU -> its lazy slot, for records about a vCPU other than the
    /// thread that causes them (KVM_IRQ).
    vcpu_slots: MapHandle,
    /// The `vcpu_slots` entry each tracked thread wrote, and its slot.
    slot_keys: HashMap<u32, (pvs_vcpu_key, u32)>,
    /// Before its map handle: unmapped first.
    lazy: LazyCells,
    _lazy_map: MapHandle,
    vmm_tgid: MapHandle,
    stats: MapHandle,
    stats_buf: Mutex<Vec<u64>>,
    links: Vec<(&'static str, Link)>,
    prog_fds: Vec<(&'static str, OwnedFd)>,
    kvm: KvmAttach,
    test_progs: Option<TestProgs>,
}

impl BpfSource {
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
    /// waking the daemon until [`BpfSource::set_quiet`] says otherwise.
    pub fn try_track(&mut self, tid: u32, vm: u32, vcpu: u32) -> Result<(), EventSourceError> {
        if tid == 0 {
            return Err(EventSourceError::Invalid("tid 0".into()));
        }
        let (slot, new) = self.lazy.slot_for(tid)?;
        let value = super::wire::pvs_vcpu {
            vm,
            vcpu,
            lazy_slot: slot,
            switch_seq: 0,
        };
        let mut val = [0u8; VCPU_SIZE];
        val[..4].copy_from_slice(&value.vm.to_ne_bytes());
        val[4..8].copy_from_slice(&value.vcpu.to_ne_bytes());
        val[8..12].copy_from_slice(&value.lazy_slot.to_ne_bytes());
        match self.tracked.update(&tid.to_ne_bytes(), &val, MapFlags::ANY) {
            Ok(()) => {
                self.lazy.bind(tid, slot);
                let key = pvs_vcpu_key { vm, vcpu };
                // Without it the vCPU's interrupts wake the daemon, as
                // before the map: logged, not fatal.
                if let Err(e) =
                    self.vcpu_slots
                        .update(&key_bytes(&key), &slot.to_ne_bytes(), MapFlags::ANY)
                {
                    warn!(tid, vm, vcpu, error = %e, "cannot map vCPU to its lazy slot");
                }
                self.slot_keys.insert(tid, (key, slot));
                Ok(())
            }
            Err(e) => {
                if new {
                    self.lazy.unbind_new(slot);
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
        if let Some((key, slot)) = self.slot_keys.remove(&tid) {
            // Only if no newer thread of that vCPU took the entry since.
            let current = self
                .vcpu_slots
                .lookup(&key_bytes(&key), MapFlags::ANY)
                .ok()
                .flatten();
            if current.as_deref() == Some(&slot.to_ne_bytes()[..]) {
                let _ = self.vcpu_slots.delete(&key_bytes(&key));
            }
        }
        self.lazy.release(tid);
    }

    /// Which records of tracked thread `tid` are queued without waking the
    /// reader ([`Quiet::NONE`]: all wake it). A memory store, no syscall;
    /// unknown threads are ignored.
    pub fn set_quiet(&mut self, tid: u32, quiet: Quiet) {
        self.lazy.set(tid, quiet);
    }

    /// Records submitted without a wakeup since load.
    pub fn lazy_events(&self) -> u64 {
        self.stat(PVS_STAT_LAZY)
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
        self.stat(PVS_STAT_DROPPED) + undecodable
    }

    /// Events the programs submitted since load.
    pub fn emitted_events(&self) -> u64 {
        self.stat(PVS_STAT_EMITTED)
    }

    /// Ring buffer map (for inspection).
    pub fn events_map(&self) -> &MapHandle {
        &self.events
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

/// The `vcpu_slots` key's bytes, laid out as bindgen's `struct pvs_vcpu_key`.
fn key_bytes(key: &pvs_vcpu_key) -> [u8; size_of::<pvs_vcpu_key>()] {
    let mut b = [0u8; size_of::<pvs_vcpu_key>()];
    let (vm, vcpu) = (offset_of!(pvs_vcpu_key, vm), offset_of!(pvs_vcpu_key, vcpu));
    b[vm..vm + 4].copy_from_slice(&key.vm.to_ne_bytes());
    b[vcpu..vcpu + 4].copy_from_slice(&key.vcpu.to_ne_bytes());
    b
}
