//! The state file as the running daemon keeps it: rewritten whenever what a
//! successor would have to put back after a crash changes (the served VMs'
//! threads, threads left unrestored, the kvm halt-polling parameters), and
//! at exit removed, or kept with what is still left.

use std::path::PathBuf;

use tracing::{error, warn};

use crate::statefile::{restore_records, SavedHaltPoll, StateFile, StateFileError, ThreadRecord};

pub struct StateKeeper {
    path: PathBuf,
    /// Recorded threads that live but could not be restored (by a
    /// predecessor or by us): kept in the state file, tried again.
    unrestored: Vec<ThreadRecord>,
}

impl StateKeeper {
    pub fn new(path: PathBuf, unrestored: Vec<ThreadRecord>) -> Self {
        Self { path, unrestored }
    }

    /// Writes the state file: `served` (the threads of VMs served or about to
    /// be), the threads left unrestored, and the kvm parameters to put back.
    pub fn save(
        &self,
        served: impl Iterator<Item = ThreadRecord>,
        kvm_original: Option<&SavedHaltPoll>,
    ) -> Result<(), StateFileError> {
        let mut state = StateFile::new();
        state.threads.extend(served);
        state.threads.extend(self.unrestored.iter().cloned());
        state.kvm_halt_poll = kvm_original.cloned();
        state.save(&self.path)
    }

    /// Keeps `left` (threads that could not be restored) for the next save.
    pub fn keep_unrestored(&mut self, left: impl IntoIterator<Item = ThreadRecord>) {
        self.unrestored.extend(left);
    }

    /// Tries again to restore the threads left unrestored: whether any was
    /// (the file must then be rewritten).
    pub fn retry_unrestored(&mut self) -> bool {
        if self.unrestored.is_empty() {
            return false;
        }
        let done = restore_records(&self.unrestored);
        let changed = done.left.len() != self.unrestored.len();
        if changed {
            self.unrestored = done.left;
        }
        changed
    }

    /// At exit, once no VM is served: tries the threads left unrestored once
    /// more (how many were restored) and removes the file when nothing is
    /// left to put back, else rewrites it with what is, for the next start.
    pub fn finish(&mut self, kvm_original: Option<&SavedHaltPoll>) -> usize {
        let done = restore_records(&self.unrestored);
        self.unrestored = done.left;
        if self.unrestored.is_empty() && kvm_original.is_none() {
            let _ = std::fs::remove_file(&self.path);
        } else if let Err(e) = self.save(std::iter::empty(), kvm_original) {
            error!(error = %e, left = self.unrestored.len(), "cannot record the threads left unrestored");
        } else {
            warn!(
                left = self.unrestored.len(),
                "threads left unrestored stay in the state file"
            );
        }
        done.restored
    }
}
