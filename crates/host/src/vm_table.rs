//! The table of served VMs: VMs that discovery reports are opened and
//! tracked by the event source, VMs that are gone (or whose threads
//! changed) are restored and untracked, and the state file is rewritten
//! whenever the set of managed threads changes.

use tracing::{error, info, warn};

use crate::discovery::{DiscoveryRequest, OpenRequest, Snapshot};
use crate::event_loop::Daemon;
use pvsched_abi::{F_ALL, F_DOORBELL, F_IDLE_HINTS};

use crate::statefile::{restore_records, StateFile, StateFileError, ThreadRecord};
use crate::vm::ServedVm;

impl Daemon {
    pub(crate) fn on_discovery(&mut self, snapshot: Snapshot) {
        let Snapshot { found, overloaded } = snapshot;
        self.overloaded = overloaded;
        // Drop VMs that are gone or whose threads changed.
        for vm in self.vms.iter_mut().flatten() {
            match found.iter().find(|f| f.name == vm.name) {
                None => vm.gone = true,
                Some(f) if f.threads != vm.threads => vm.gone = true,
                Some(_) => {}
            }
        }
        self.drop_gone();
        // New VMs are opened on the discovery thread (file-system work),
        // each with a VM id reserved here.
        for f in found {
            if self.opening.contains_key(&f.name)
                || self.vms.iter().flatten().any(|vm| vm.name == f.name)
            {
                continue;
            }
            let Some(id) = self.free_ids().next() else {
                continue;
            };
            let limits = f
                .cfg_index
                .and_then(|i| self.cfg.vm_limits.get(i).cloned())
                .unwrap_or_else(|| self.cfg.default_limits.clone());
            let metrics = self.metrics.vm(&f.name);
            self.opening.insert(f.name.clone(), id);
            let mut features = F_ALL;
            if !self.cfg.config.daemon.offer_idle_hints {
                features &= !F_IDLE_HINTS;
            }
            if !self.doorbells.iter().any(|d| d.vm == f.name) {
                features &= !F_DOORBELL;
            }
            let req = OpenRequest {
                found: f,
                id,
                limits,
                metrics,
                features,
            };
            if self
                .open_tx
                .send(DiscoveryRequest::Open(Box::new(req)))
                .is_err()
            {
                error!("the discovery thread is gone: no VM can be opened");
                return;
            }
        }
    }

    /// A VM opened on the discovery thread: served once the state file
    /// lists its threads (none is boosted before).
    pub(crate) fn on_opened(
        &mut self,
        name: String,
        id: u32,
        result: Result<Box<ServedVm>, String>,
    ) {
        self.opening.remove(&name);
        let vm = match result {
            Ok(vm) => *vm,
            Err(e) => {
                if self.refused.get(&name) != Some(&e) {
                    warn!(vm = %name, error = %e, "cannot serve VM");
                    self.refused.insert(name, e);
                }
                return;
            }
        };
        self.refused.remove(&name);
        if let Err(e) = self.save_state(vm.records().into_iter()) {
            error!(vm = %name, error = %e, "cannot record the threads in the state file: not serving");
            return;
        }
        for (i, m) in vm.vcpus.iter().enumerate() {
            self.source.track(m.handle.tid as u32, id, i as u32);
        }
        self.source.track_vmm(vm.threads.tgid as u32, id);
        info!(
            vm = %vm.name, tgid = vm.threads.tgid, vcpus = vm.vcpus.len(),
            accel = ?vm.threads.accel, generation = vm.generation, "serving VM"
        );
        let slot = id as usize;
        if self.vms.len() <= slot {
            self.vms.resize_with(slot + 1, || None);
        }
        self.vms[slot] = Some(vm);
        self.metrics
            .vms
            .set(self.vms.iter().flatten().count() as i64);
    }

    /// VM ids free for new VMs, lowest first: empty slots, then new ones,
    /// but none reserved for a VM being opened.
    fn free_ids(&self) -> impl Iterator<Item = u32> + '_ {
        let empty = self
            .vms
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.is_none())
            .map(|(i, _)| i as u32);
        empty
            .chain(self.vms.len() as u32..)
            .filter(|id| !self.opening.values().any(|r| r == id))
    }

    pub(crate) fn drop_gone(&mut self) {
        let mut changed = false;
        for slot in self.vms.iter_mut() {
            if !slot.as_ref().is_some_and(|vm| vm.gone) {
                continue;
            }
            if let Some(mut vm) = slot.take() {
                let done = vm.restore_all();
                for m in &vm.vcpus {
                    self.source.untrack(m.handle.tid as u32);
                }
                self.source.untrack_vmm(vm.threads.tgid as u32);
                info!(
                    vm = %vm.name, tgid = vm.threads.tgid, restored = done.restored,
                    left = done.left.len(), "VM gone; no longer served"
                );
                self.leftover.extend(done.left);
                changed = true;
            }
        }
        if changed {
            // A failure leaves the previous file, which lists more threads
            // than are served: safe, since recovery checks each identity.
            if let Err(e) = self.save_state(std::iter::empty()) {
                error!(error = %e, "cannot rewrite the state file");
            }
            self.metrics
                .vms
                .set(self.vms.iter().flatten().count() as i64);
        }
    }

    /// Tries again to restore threads whose restore failed earlier (by this
    /// daemon or a predecessor); records the ones still left.
    pub(crate) fn retry_leftover(&mut self) {
        if self.leftover.is_empty() {
            return;
        }
        let done = restore_records(&self.leftover);
        if done.left.len() != self.leftover.len() {
            self.leftover = done.left;
            if let Err(e) = self.save_state(std::iter::empty()) {
                error!(error = %e, "cannot rewrite the state file");
            }
        }
    }

    /// Writes the state file: every served VM's threads, `extra` (VMs about
    /// to be served) and the threads left unrestored.
    pub(crate) fn save_state(
        &self,
        extra: impl Iterator<Item = ThreadRecord>,
    ) -> Result<(), StateFileError> {
        let mut state = StateFile::new();
        for vm in self.vms.iter().flatten() {
            state.threads.extend(vm.records());
        }
        state.threads.extend(extra);
        state.threads.extend(self.leftover.iter().cloned());
        state.kvm_halt_poll = self.kvm_original.clone();
        state.save(&self.state_path)
    }
}
