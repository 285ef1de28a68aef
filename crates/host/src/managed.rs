//! A thread whose scheduling parameters the daemon manages: what was in
//! force before it came (restored on exit and recorded in the state file)
//! and what it set.

use pvsched_base::sched::{self, ThreadParams, SCHED_OTHER};
use pvsched_base::thread::ThreadHandle;
use pvsched_policy::ExtensionAllowance;

use crate::backend::{SchedExt, ScxBoost};
use crate::events::Quiet;
use crate::statefile::ThreadRecord;

/// Parameters that only a fair-class boost has: SCHED_OTHER with a slice
/// request (the daemon's other fair-class params leave `runtime` at 0).
pub fn is_fair_boost(p: &ThreadParams) -> bool {
    p.policy == SCHED_OTHER && p.runtime != 0
}

/// A thread whose parameters the daemon manages.
#[derive(Debug)]
pub struct Managed {
    pub handle: ThreadHandle,
    /// Parameters before the daemon touched it: restored on exit.
    pub original: ThreadParams,
    /// Parameters in force now (as last set, or the original). With the
    /// sched_ext backend a boost (RT params) is carried by the scheduler's
    /// grant (`scx_boost`) while the kernel keeps `kernel`.
    pub applied: ThreadParams,
    /// What `sched_setattr` last set (or the original).
    pub kernel: ThreadParams,
    /// The boost is carried by the sched_ext scheduler's grant.
    pub scx_boost: bool,
    /// Its slice-end extension allowance on the sched_ext backend.
    pub ext_allowance: ExtensionAllowance,
    /// The scheduler's own boosted time (`pvs_scx_vcpu.kboost_ns`) charged to the
    /// policy's budget so far.
    pub kboost_charged_ns: u64,
    /// Of it, for critical sections (`kboost_cs_ns`).
    pub kboost_cs_charged_ns: u64,
    /// Of it, run demoted (`kboost_demoted_ns`, charged more).
    pub kboost_demoted_charged_ns: u64,
    /// The address of its slot in the VMM the sched_ext scheduler was
    /// given (0: not found yet).
    pub scx_slot: u64,
    /// Which of its records the event source queues without a wakeup, as
    /// last set.
    pub quiet: Quiet,
    /// `sched_setattr` failures on this thread (logged at 1, 2, 4, 8, ...).
    pub failures: u64,
}

impl Managed {
    /// Opens thread `tid` of process `tgid` and reads its parameters.
    pub fn open(tgid: i32, tid: i32) -> Result<Self, (&'static str, std::io::Error)> {
        let handle = ThreadHandle::open(tgid, tid).map_err(|e| ("open", e))?;
        let original = sched::get_params(tid).map_err(|e| ("sched_getattr", e))?;
        Ok(Self {
            handle,
            original,
            applied: original,
            kernel: original,
            scx_boost: false,
            ext_allowance: ExtensionAllowance::default(),
            kboost_charged_ns: 0,
            kboost_cs_charged_ns: 0,
            kboost_demoted_charged_ns: 0,
            scx_slot: 0,
            quiet: Quiet::NONE,
            failures: 0,
        })
    }

    /// What the state file keeps of it.
    pub fn record(&self, vm: &str) -> ThreadRecord {
        ThreadRecord {
            vm: vm.to_string(),
            tgid: self.handle.tgid,
            tid: self.handle.tid,
            start_time: self.handle.start_time,
            original: self.original,
        }
    }

    /// Boosted by us: RT now and not RT before we came, or given a fair-class
    /// boost (a thread's original, as read back, also carries its slice).
    pub fn boosted(&self) -> bool {
        let rt = self.applied.is_rt() && !self.original.is_rt();
        let fair = is_fair_boost(&self.applied) && self.applied != self.original;
        rt || fair
    }

    /// Applies `want` unless already in force. Ok(true) when a call was made.
    /// Refuses a thread id that no longer names the thread we opened. With
    /// `scx` (the sched_ext backend) an RT `want` is a boost in the
    /// scheduler's grant (`proactive`: one the guest's slot does not back)
    /// and the kernel keeps the thread's fair-class parameters.
    pub fn apply(
        &mut self,
        want: &ThreadParams,
        scx: Option<&SchedExt>,
        proactive: bool,
    ) -> std::io::Result<bool> {
        let by_scx = scx.is_some() && want.is_rt();
        let same_slice = want.runtime == 0 || want.runtime == self.applied.runtime;
        if want.same_class(&self.applied) && same_slice && by_scx == self.scx_boost {
            return Ok(false);
        }
        if !self.handle.is_alive() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "thread exited",
            ));
        }
        let tid = self.handle.tid as u32;
        match scx {
            Some(s) if by_scx => {
                let p = want.priority;
                let boost = if proactive {
                    ScxBoost::Proactive(p)
                } else {
                    ScxBoost::Guest(p)
                };
                s.set_boost(tid, boost).map_err(std::io::Error::other)?;
                if !self.scx_boost {
                    // A boost that starts while the thread waits in the
                    // vtime queue takes effect now, not at its turn.
                    s.boost_queued(tid).map_err(std::io::Error::other)?;
                }
                self.scx_boost = true;
            }
            _ => {
                if self.scx_boost {
                    if let Some(s) = scx {
                        s.set_boost(tid, ScxBoost::None)
                            .map_err(std::io::Error::other)?;
                    }
                    self.scx_boost = false;
                }
                let same_kernel = want.same_class(&self.kernel)
                    && (want.runtime == 0 || want.runtime == self.kernel.runtime);
                if !same_kernel {
                    sched::set_params(self.handle.tid, want)?;
                    self.kernel = *want;
                }
            }
        }
        self.applied = *want;
        Ok(true)
    }

    /// The sched_ext scheduler is gone (ejected by the kernel): a boost it
    /// carried becomes the RT parameters it stood for. Ok(true) when a call
    /// was made.
    pub fn move_to_kernel(&mut self) -> std::io::Result<bool> {
        if !self.scx_boost {
            return Ok(false);
        }
        self.scx_boost = false;
        let want = self.applied;
        self.applied = self.kernel;
        self.apply(&want, None, false)
    }

    /// Puts the original parameters back, flags included (when they differ
    /// and the thread lives). Ok(true) when a call was made. A boost the
    /// sched_ext scheduler carries ends with the thread's grant (the caller
    /// unregisters it) or with the scheduler.
    pub fn restore(&mut self) -> std::io::Result<bool> {
        if self.scx_boost {
            self.scx_boost = false;
            self.applied = self.kernel;
        }
        let original = self.original;
        if !self.handle.is_alive() || original.same_setting(&self.kernel) {
            self.applied = self.kernel;
            return Ok(false);
        }
        sched::set_params(self.handle.tid, &original)?;
        self.applied = original;
        self.kernel = original;
        Ok(true)
    }
}
