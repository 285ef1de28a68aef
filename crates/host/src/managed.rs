//! A thread whose scheduling parameters the daemon manages: what was in
//! force before it came (restored on exit and recorded in the state file)
//! and what it set.

use pvsched_base::sched::{self, ThreadParams, SCHED_OTHER};
use pvsched_base::thread::ThreadHandle;

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
    /// Parameters in force now (as last set, or the original).
    pub applied: ThreadParams,
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
    /// Refuses a thread id that no longer names the thread we opened.
    pub fn apply(&mut self, want: &ThreadParams) -> std::io::Result<bool> {
        let same_slice = want.runtime == 0 || want.runtime == self.applied.runtime;
        if want.same_class(&self.applied) && same_slice {
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

    /// Puts the original parameters back, flags included (when they differ
    /// and the thread lives). Ok(true) when a call was made.
    pub fn restore(&mut self) -> std::io::Result<bool> {
        let original = self.original;
        if !self.handle.is_alive() || original.same_setting(&self.applied) {
            return Ok(false);
        }
        sched::set_params(self.handle.tid, &original)?;
        self.applied = original;
        Ok(true)
    }
}
