//! The table of served VMs: VMs that discovery reports are opened and
//! tracked by the event source, VMs that are gone (or whose threads
//! changed) are restored and untracked, and the state file is rewritten
//! whenever the set of managed threads changes.

use tracing::{error, info, warn};

use crate::discovery::Snapshot;
use crate::event_loop::Daemon;
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
        // Open the new VMs aside: none is served (and none can be boosted)
        // before the state file lists its threads.
        let mut new: Vec<ServedVm> = Vec::new();
        for f in &found {
            if self
                .vms
                .iter()
                .flatten()
                .chain(&new)
                .any(|vm| vm.name == f.name)
            {
                continue;
            }
            let id = self.free_ids().nth(new.len()).unwrap_or(u32::MAX);
            let limits = f
                .cfg_index
                .and_then(|i| self.cfg.vm_limits.get(i).cloned())
                .unwrap_or_else(|| self.cfg.default_limits.clone());
            let vm_metrics = self.metrics.vm(&f.name);
            match ServedVm::open(f, id, limits, vm_metrics) {
                Ok(vm) => new.push(vm),
                Err(e) => warn!(vm = %f.name, error = %e, "cannot serve VM"),
            }
        }
        if new.is_empty() {
            return;
        }
        let records = new.iter().flat_map(ServedVm::records);
        if let Err(e) = self.save_state(records) {
            let names: Vec<&str> = new.iter().map(|vm| vm.name.as_str()).collect();
            error!(error = %e, vms = ?names, "cannot record the threads in the state file: not serving");
            return;
        }
        for vm in new {
            let id = vm.id;
            for (i, m) in vm.vcpus.iter().enumerate() {
                self.source.track(m.handle.tid as u32, id, i as u32);
            }
            self.source.track_vmm(vm.threads.tgid as u32, id);
            info!(
                vm = %vm.name, tgid = vm.threads.tgid, vcpus = vm.vcpus.len(),
                accel = ?vm.threads.accel, generation = vm.generation, "serving VM"
            );
            if (id as usize) < self.vms.len() {
                self.vms[id as usize] = Some(vm);
            } else {
                self.vms.push(Some(vm));
            }
        }
        self.metrics
            .vms
            .set(self.vms.iter().flatten().count() as i64);
    }

    /// VM ids free for new VMs, lowest first: empty slots, then new ones.
    fn free_ids(&self) -> impl Iterator<Item = u32> + '_ {
        let empty = self
            .vms
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.is_none())
            .map(|(i, _)| i as u32);
        empty.chain(self.vms.len() as u32..)
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
        state.save(&self.state_path)
    }
}
