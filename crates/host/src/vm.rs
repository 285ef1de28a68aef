//! One VM the daemon serves: its region, its threads, its policy state, and
//! what is in force on each thread.

use std::path::Path;

use pvsched_abi::{RegionFile, F_ALL};
use pvsched_policy::{Decision, Decisions, Event, VmLimits, VmState};
use tracing::{info, warn};

use crate::discovery::VmThreads;
use crate::metrics::VmMetrics;
use crate::sched::{self, ThreadHandle, ThreadParams};
use crate::statefile::ThreadRecord;

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("vm {vm}: region: {source}")]
    Region {
        vm: String,
        source: pvsched_abi::RegionFileError,
    },
    #[error("vm {vm}: region {path}: {source}")]
    RegionInit {
        vm: String,
        path: String,
        source: pvsched_abi::AbiError,
    },
    #[error("vm {vm}: limits: {source}")]
    Limits {
        vm: String,
        source: pvsched_policy::LimitsError,
    },
    #[error("vm {vm}: thread {tid}: {op}: {source}")]
    Thread {
        vm: String,
        tid: i32,
        op: &'static str,
        source: std::io::Error,
    },
}

/// A thread whose parameters the daemon manages.
#[derive(Debug)]
pub struct Managed {
    pub handle: ThreadHandle,
    /// Parameters before the daemon touched it: restored on exit.
    pub original: ThreadParams,
    /// Parameters in force now (as last set, or the original).
    pub applied: ThreadParams,
    /// The event source's lazy bits for this thread, as last set.
    pub lazy: u32,
}

impl Managed {
    fn open(vm: &str, tgid: i32, tid: i32) -> Result<Self, VmError> {
        let thread_err = |op, source| VmError::Thread {
            vm: vm.to_string(),
            tid,
            op,
            source,
        };
        let handle = ThreadHandle::open(tgid, tid).map_err(|e| thread_err("open", e))?;
        let original = sched::get_params(tid).map_err(|e| thread_err("sched_getattr", e))?;
        Ok(Self {
            handle,
            original,
            applied: original,
            lazy: 0,
        })
    }

    pub fn record(&self, vm: &str) -> ThreadRecord {
        ThreadRecord {
            vm: vm.to_string(),
            tgid: self.handle.tgid,
            tid: self.handle.tid,
            start_time: self.handle.start_time,
            original: self.original,
        }
    }

    /// Applies `want` unless already in force. Ok(true) when a call was made.
    /// Refuses a thread id that no longer names the thread we opened.
    pub fn apply(&mut self, want: &ThreadParams) -> std::io::Result<bool> {
        if want.same_class(&self.applied) {
            return Ok(false);
        }
        if !self.handle.is_alive() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "thread exited",
            ));
        }
        sched::set_params(self.handle.tid, want)?;
        self.applied = *want;
        Ok(true)
    }

    /// Puts the original parameters back (when they differ and the thread lives).
    pub fn restore(&mut self) -> std::io::Result<bool> {
        let original = self.original;
        if !self.handle.is_alive() {
            return Ok(false);
        }
        if original.same_class(&self.applied) {
            return Ok(false);
        }
        sched::set_params(self.handle.tid, &original)?;
        self.applied = original;
        Ok(true)
    }
}

pub struct ServedVm {
    pub name: String,
    /// Index in the daemon's table; the VM id in BPF maps.
    pub id: u32,
    /// Index of the [[vm]] config entry, if any.
    pub cfg_index: Option<usize>,
    pub region: RegionFile,
    pub generation: u64,
    pub threads: VmThreads,
    pub vcpus: Vec<Managed>,
    pub latency_path: Vec<Managed>,
    pub policy: VmState,
    pub metrics: VmMetrics,
    /// Totals already pushed to the metrics (they take deltas).
    pub reported_clamped: u64,
    pub gone: bool,
}

impl ServedVm {
    /// Opens (or creates) the region, (re)initialises its header when it does
    /// not fit the VM, and opens every thread.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        name: &str,
        id: u32,
        cfg_index: Option<usize>,
        region_path: &Path,
        region_mode: u32,
        threads: VmThreads,
        limits: VmLimits,
        metrics: VmMetrics,
    ) -> Result<Self, VmError> {
        let nr = threads.vcpus.len() as u32;
        let mut region = if region_path.exists() {
            RegionFile::open(region_path)
        } else {
            RegionFile::create(region_path, nr, region_mode)
        }
        .map_err(|e| VmError::Region {
            vm: name.to_string(),
            source: e,
        })?;
        let generation = match region.region().validate() {
            Ok(v) if v.header.slot_count == nr => {
                region.region_mut().adopt(&v);
                v.header.generation
            }
            _ => {
                let g = region.region_mut().init_header(nr, F_ALL).map_err(|e| {
                    VmError::RegionInit {
                        vm: name.to_string(),
                        path: region_path.display().to_string(),
                        source: e,
                    }
                })?;
                info!(
                    vm = name,
                    generation = g,
                    slots = nr,
                    "initialised region header"
                );
                g
            }
        };
        let vcpus = threads
            .vcpus
            .iter()
            .map(|(_, tid)| Managed::open(name, threads.tgid, *tid))
            .collect::<Result<Vec<_>, _>>()?;
        let latency_path = threads
            .latency_path
            .iter()
            .filter_map(|tid| match Managed::open(name, threads.tgid, *tid) {
                Ok(m) => Some(m),
                Err(e) => {
                    warn!(error = %e, "latency-path thread not managed");
                    None
                }
            })
            .collect();
        let policy = VmState::new(limits, nr).map_err(|e| VmError::Limits {
            vm: name.to_string(),
            source: e,
        })?;
        Ok(Self {
            name: name.to_string(),
            id,
            cfg_index,
            region,
            generation,
            threads,
            vcpus,
            latency_path,
            policy,
            metrics,
            reported_clamped: 0,
            gone: false,
        })
    }

    pub fn records(&self) -> Vec<ThreadRecord> {
        self.vcpus
            .iter()
            .chain(self.latency_path.iter())
            .map(|m| m.record(&self.name))
            .collect()
    }

    /// Runs one event through the policy, appending its decisions to `acc`
    /// (`handle` clears its output, so each call gets the scratch buffer).
    pub fn feed(
        &mut self,
        now: u64,
        event: &Event,
        scratch: &mut Decisions,
        acc: &mut Vec<Decision>,
    ) {
        self.policy.handle(now, event, scratch);
        acc.extend_from_slice(scratch.as_slice());
    }

    /// Feeds a fresh read of vCPU `vcpu`'s guest half to the policy.
    pub fn guest_update(
        &mut self,
        now: u64,
        vcpu: u32,
        scratch: &mut Decisions,
        acc: &mut Vec<Decision>,
    ) {
        let (guest, consistent) = match self.region.region().read_guest(vcpu) {
            Ok(g) => (g, true),
            Err(_) => (Default::default(), false),
        };
        self.feed(
            now,
            &Event::GuestUpdate {
                vcpu,
                guest,
                consistent,
            },
            scratch,
            acc,
        );
    }

    /// Publishes the host half of `vcpu`.
    pub fn publish(&self, now: u64, vcpu: u32) {
        let half = self.policy.host_half(vcpu, now);
        let _ = self.region.region().write_host(vcpu, &half);
    }

    /// vCPU `v` is boosted by us and not halted (its guest may change its slot).
    pub fn boosted_on_cpu(&self, v: u32) -> bool {
        let boosted = self
            .vcpus
            .get(v as usize)
            .is_some_and(|m| m.applied.is_rt() && !m.original.is_rt());
        let halted = self
            .policy
            .vcpu_stats(v)
            .is_some_and(|s| s.status == pvsched_policy::RunStatus::Halted);
        boosted && !halted
    }

    /// Which records of vCPU `v` need not wake the daemon
    /// (`events::wire::LAZY_*`). While any vCPU is boosted the daemon wakes
    /// on the recheck timer, which drains the queue and re-reads the boosted
    /// vCPUs found on a CPU: nothing a boosted vCPU does needs a wakeup of
    /// its own. An unboosted one: its switch-ins and halts (a decision to
    /// boost follows a wakeup, a preemption, an interrupt or a slot read),
    /// and its wakeups or preemptions too when the limits make nothing of them.
    pub fn lazy_bits(&self, v: u32) -> u32 {
        use crate::events::wire::*;
        let boosted = self
            .vcpus
            .get(v as usize)
            .is_some_and(|m| m.applied.is_rt() && !m.original.is_rt());
        if !boosted {
            let l = self.policy.limits();
            let mut bits = LAZY_SWITCH_IN | LAZY_BLOCKED | LAZY_KVM_WAKEUP;
            // A wakeup matters for a proactive boost, or for the guest's
            // pending hint, read then.
            if !l.proactive_wake && !l.honor_pending_hint {
                bits |= LAZY_WAKING;
            }
            if !(l.honor_critical_sections
                || l.honor_guest_rt
                || l.honor_boost_request
                || l.honor_pending_hint)
            {
                // Nothing the guest says can start a boost on a preemption.
                bits |= LAZY_PREEMPTED;
            }
            bits
        } else {
            LAZY_ALL
        }
    }

    /// Whether any vCPU of this VM is boosted (halted or not).
    pub fn any_boosted(&self) -> bool {
        self.vcpus
            .iter()
            .any(|m| m.applied.is_rt() && !m.original.is_rt())
    }

    pub fn any_boosted_on_cpu(&self) -> bool {
        (0..self.vcpus.len() as u32).any(|v| self.boosted_on_cpu(v))
    }

    /// Restores every thread; returns how many changed.
    pub fn restore_all(&mut self) -> usize {
        let mut n = 0;
        for m in self.vcpus.iter_mut().chain(self.latency_path.iter_mut()) {
            match m.restore() {
                Ok(true) => n += 1,
                Ok(false) => {}
                Err(e) => warn!(vm = %self.name, tid = m.handle.tid, error = %e, "cannot restore"),
            }
        }
        n
    }
}
