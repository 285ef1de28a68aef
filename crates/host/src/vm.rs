//! One VM the daemon serves: its region, its threads, its policy state, and
//! what is in force on each thread.

use pvsched_base::ivshmem;
use pvsched_base::region_file::RegionFile;
use pvsched_policy::{serving, Decision, Decisions, DurationHistogram, Event, VmLimits, VmState};
use tracing::{info, warn};

use crate::events::Quiet;
use crate::found::{Found, VmThreads};
use crate::managed::Managed;
use crate::metrics::VmMetrics;
use crate::statefile::{Restored, ThreadRecord};

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("vm {vm}: limits: {source}")]
    Limits {
        vm: String,
        source: pvsched_policy::LimitsError,
    },
    #[error("vm {vm}: region: {source}")]
    Region {
        vm: String,
        source: pvsched_base::region_file::RegionFileError,
    },
    #[error("vm {vm}: region {path}: {source}")]
    RegionInit {
        vm: String,
        path: String,
        source: pvsched_abi::AbiError,
    },
    #[error("vm {vm}: thread {tid}: {op}: {source}")]
    Thread {
        vm: String,
        tid: i32,
        op: &'static str,
        source: std::io::Error,
    },
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
    /// Idle histograms as last pushed to the metrics (they take deltas).
    reported_idle: Vec<(DurationHistogram, DurationHistogram)>,
    /// The region offers `F_IDLE_HINTS`: the host halves carry wake latencies.
    idle_hints: bool,
    /// The region offers `F_DOORBELL`: the guest rings when it clears the
    /// reason for a boost, so its boosted vCPUs need no recheck timer.
    pub doorbell: bool,
    pub gone: bool,
}

impl ServedVm {
    /// Opens (or creates) the region of VM `found`, (re)initialises its
    /// header when it does not fit the VM, and opens every thread; `id` is
    /// its VM id in the event source.
    pub fn open(
        found: &Found,
        id: u32,
        limits: VmLimits,
        metrics: VmMetrics,
        features: u64,
    ) -> Result<Self, VmError> {
        let Found {
            name,
            cfg_index,
            region: region_path,
            region_mode,
            region_from_server,
            threads,
        } = found;
        let (name, cfg_index, region_mode) = (name.as_str(), *cfg_index, *region_mode);
        let threads = threads.clone();
        // More than u32::MAX threads is refused with the rest (> MAX_SLOTS).
        let nr = u32::try_from(threads.vcpus.len()).unwrap_or(u32::MAX);
        // Created exclusively if missing; an existing file must be a regular
        // file with one link and exactly the size for `nr` slots, or it is
        // refused untouched. The mapping is that size and guarded against
        // truncation (`region_intact`).
        // The ivshmem server's region is only ever opened: one it removed
        // (its VM ended) is not made again here.
        let opened = if *region_from_server {
            RegionFile::open(region_path, nr)
        } else {
            RegionFile::create(region_path, nr, region_mode)
        };
        let mut region = opened.map_err(|e| VmError::Region {
            vm: name.to_string(),
            source: e,
        })?;
        // With a doorbell, the guest rings the host's vector of the ivshmem
        // server protocol (pvsched_base::ivshmem).
        let doorbell = if features & pvsched_abi::F_DOORBELL != 0 {
            pvsched_abi::doorbell_value(ivshmem::HOST_PEER, ivshmem::HOST_VECTOR)
        } else {
            0
        };
        let generation = match region.region().validate() {
            // A region left by an earlier pvschedd is kept (its guest stays bound)
            // when it offers what this one does.
            Ok(v)
                if v.header.slot_count == nr
                    && v.header.host_features == features
                    && v.header.doorbell == doorbell =>
            {
                region.region_mut().adopt(&v);
                v.header.generation
            }
            _ => {
                let g = region
                    .region_mut()
                    .init_header_with_doorbell(nr, features, doorbell)
                    .map_err(|e| VmError::RegionInit {
                        vm: name.to_string(),
                        path: region_path.display().to_string(),
                        source: e,
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
        let open = |tid: i32| {
            Managed::open(threads.tgid, tid).map_err(|(op, source)| VmError::Thread {
                vm: name.to_string(),
                tid,
                op,
                source,
            })
        };
        let vcpus = threads
            .vcpus
            .iter()
            .map(|(_, tid)| open(*tid))
            .collect::<Result<Vec<_>, _>>()?;
        let latency_path = threads
            .latency_path
            .iter()
            .filter_map(|tid| match open(*tid) {
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
            reported_idle: Vec::new(),
            idle_hints: features & pvsched_abi::F_IDLE_HINTS != 0,
            doorbell: features & pvsched_abi::F_DOORBELL != 0,
            gone: false,
        })
    }

    /// Whether the region is still the VM's file at the size it was mapped
    /// at. Its owner may truncate it under us: an access then reads zero
    /// pages (not the guest's), so the VM must be dropped. The fault flag
    /// always; the file's size too (one `fstat`) when `stat`.
    pub fn region_intact(&self, stat: bool) -> bool {
        let checked = if stat {
            self.region.check_intact()
        } else {
            self.region.check_not_faulted()
        };
        match checked {
            Ok(()) => true,
            Err(e) => {
                warn!(vm = %self.name, error = %e, "region file changed under us; dropping the VM");
                false
            }
        }
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
        let mut half = self.policy.host_half(vcpu, now);
        if !self.idle_hints {
            (
                half.wake_p50_ns,
                half.wake_p99_ns,
                half.poll_budget_permille,
            ) = (0, 0, 0);
        }
        let _ = self.region.region().write_host(vcpu, &half);
    }

    /// Whether the recheck timer re-reads vCPU `v`'s slot ([`serving::recheck_reads`]).
    pub fn recheck_reads(&self, v: u32) -> bool {
        let boosted = self.vcpus.get(v as usize).is_some_and(Managed::boosted);
        serving::recheck_reads(self.doorbell, boosted, self.policy.status(v))
    }

    /// Which records of vCPU `v` need not wake the daemon at `now`;
    /// `quiet_without_rivals`: the daemon option of that name.
    pub fn quiet(&self, v: u32, now: u64, quiet_without_rivals: bool) -> Quiet {
        let boosted = self.vcpus.get(v as usize).is_some_and(Managed::boosted);
        let shows_preempted = self.policy.lock_guest()
            && self.policy.status(v) == Some(pvsched_policy::RunStatus::Preempted);
        let limits = self.policy.limits();
        let kernel_decides = self.policy.kernel_decides_rt();
        // Where the scheduler decides, it extends lock holders itself: a wait
        // naming the vCPU asks nothing of the daemon (Quiet::kernel_decides).
        let waited_on = !kernel_decides && self.policy.lock_waited_on(v);
        let quiet = Quiet::for_vcpu(
            boosted,
            limits,
            waited_on,
            shows_preempted,
            quiet_without_rivals && !self.policy.rt_work_recent(now),
        );
        if kernel_decides {
            let pending_hints = self.policy.nr_vcpus() > 1 && limits.honor_pending_hint;
            quiet.kernel_decides(pending_hints, shows_preempted)
        } else {
            quiet
        }
    }

    /// Whether this VM keeps the recheck timer running ([`serving::recheck_wanted`]);
    /// `lazy_records`: records may reach the daemon late.
    pub fn recheck_wanted(&self, lazy_records: bool) -> bool {
        let vcpus = self
            .vcpus
            .iter()
            .enumerate()
            .map(|(v, m)| (m.boosted(), self.policy.status(v as u32)));
        serving::recheck_wanted(self.doorbell, lazy_records, vcpus)
    }

    /// Where each vCPU's slot is in the VMM's address space (0: not found),
    /// for the sched_ext scheduler, which reads a slot while its vCPU thread
    /// runs: the VMM's shared mapping of the region file (device and inode).
    pub fn slot_addresses(&self) -> Vec<u64> {
        let n = self.vcpus.len();
        let mapping = self.region.metadata().ok().and_then(|meta| {
            use std::os::unix::fs::MetadataExt;
            let file = crate::discovery::FileId {
                major: nix::sys::stat::major(meta.dev()),
                minor: nix::sys::stat::minor(meta.dev()),
                ino: meta.ino(),
            };
            crate::discovery::mappings_of(self.threads.tgid, file)
                .ok()?
                .into_iter()
                .next()
        });
        let layout = self.region.region().layout();
        (0..n)
            .map(|i| {
                let at = (layout.header_size + i * layout.slot_size) as u64;
                mapping.and_then(|m| m.address_of(at)).unwrap_or(0)
            })
            .collect()
    }

    /// Bytes from one slot to the next in the region.
    pub fn slot_stride(&self) -> u32 {
        self.region.region().layout().slot_size as u32
    }

    /// The strongest boost among the vCPUs (what the latency path gets).
    pub fn strongest_boost(&self) -> Option<pvsched_base::sched::ThreadParams> {
        self.vcpus
            .iter()
            .filter(|m| m.boosted())
            .map(|m| m.applied)
            .max_by_key(|p| p.priority)
    }

    /// Pushes the policy's totals to the VM's metrics (they take deltas).
    pub fn report_stats(&mut self) {
        let stats = self.policy.vm_stats();
        self.metrics
            .boosted_seconds
            .set(stats.boosted_ns_total as f64 * 1e-9);
        let counts = [
            stats.lock_contentions,
            stats.lock_holder_preempted,
            stats.lock_extensions,
            stats.lock_extensions_at_preemption,
            stats.lock_extensions_refused,
            stats.lock_preemptions_avoided,
        ];
        for (gauge, n) in self.metrics.locks.counts.iter().zip(counts) {
            gauge.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        let times = [
            stats.lock_extended_ns,
            stats.lock_repaid_ns,
            stats.lock_debt_ns,
        ];
        for (gauge, ns) in self.metrics.locks.seconds.iter().zip(times) {
            gauge.set(ns as f64 * 1e-9);
        }
        if stats.clamped_inputs_total > self.reported_clamped {
            self.metrics
                .clamped
                .inc_by(stats.clamped_inputs_total - self.reported_clamped);
            self.reported_clamped = stats.clamped_inputs_total;
        }
        self.report_idle();
    }

    /// Pushes what the idle meters recorded since the last report: each new
    /// sample as its bucket's mean, which falls in the same metric bucket.
    fn report_idle(&mut self) {
        let n = self.policy.nr_vcpus() as usize;
        self.reported_idle.resize_with(n, Default::default);
        for (v, (halts_seen, wakes_seen)) in self.reported_idle.iter_mut().enumerate() {
            let Some(m) = self.policy.idle_meter(v as u32) else {
                continue;
            };
            observe_new(&self.metrics.halt_seconds, &m.halt_to_wake, halts_seen);
            observe_new(&self.metrics.wake_seconds, &m.wake_to_run, wakes_seen);
            halts_seen.clone_from(&m.halt_to_wake);
            wakes_seen.clone_from(&m.wake_to_run);
        }
    }

    /// Clears every host half: the guest sees no host (at exit).
    pub fn clear_host_halves(&self) {
        for v in 0..self.policy.nr_vcpus() {
            let _ = self.region.region().write_host(v, &Default::default());
        }
    }

    /// At exit, a region that offers lock holders is initialised again
    /// without them: while the guest accepts `F_LOCK_HOLD` its module lists
    /// every lock call its tasks make under contention, for a host that reads
    /// the lists, and with no pvschedd none does (BENCHMARKS.md, LH58: 3.5
    /// million takes listed in windows no daemon served). The other features
    /// stay offered: the guest binds again at once and keeps counting its lock
    /// waits, and a pvschedd started again without lock holders finds it bound.
    pub fn withdraw_lock_holders(&mut self) {
        let h = self.region.region().header();
        if h.host_features & pvsched_abi::F_LOCK_HOLD == 0 {
            return;
        }
        // The extension notice serves lock holders only: it goes with them.
        let features = h.host_features & !(pvsched_abi::F_LOCK_HOLD | pvsched_abi::F_EXT_NOTICE);
        match self
            .region
            .region_mut()
            .init_header_with_doorbell(h.slot_count, features, h.doorbell)
        {
            Ok(generation) => info!(
                vm = %self.name,
                generation,
                "lock holders withdrawn from the region"
            ),
            Err(e) => warn!(vm = %self.name, error = %e, "lock holders not withdrawn"),
        }
    }

    /// Restores every thread: how many changed, and the records of those
    /// that live but could not be restored (they must stay recorded).
    pub fn restore_all(&mut self) -> Restored {
        let mut out = Restored::default();
        for m in self.vcpus.iter_mut().chain(self.latency_path.iter_mut()) {
            match m.restore() {
                Ok(changed) => out.restored += usize::from(changed),
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => {
                    warn!(vm = %self.name, tid = m.handle.tid, error = %e, "cannot restore");
                    out.left.push(m.record(&self.name));
                }
            }
        }
        out
    }
}

fn observe_new(
    metric: &prometheus_client::metrics::histogram::Histogram,
    now: &DurationHistogram,
    seen: &DurationHistogram,
) {
    for b in 0..pvsched_policy::idle::BUCKETS {
        let ((c1, s1), (c0, s0)) = (now.bucket(b), seen.bucket(b));
        let n = c1.saturating_sub(c0);
        if n == 0 {
            continue;
        }
        let mean_s = s1.saturating_sub(s0) as f64 / n as f64 * 1e-9;
        for _ in 0..n {
            metric.observe(mean_s);
        }
    }
}
