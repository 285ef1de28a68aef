//! The table of served VMs: VMs that discovery reports are opened and
//! tracked by the event source, VMs that are gone (or whose threads
//! changed) are restored and untracked, and the state file is rewritten
//! whenever the set of managed threads changes.

use tracing::{error, info, warn};

use crate::discovery::Snapshot;
use crate::event_loop::Daemon;
use crate::statefile::StateFile;
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
        let mut changed = false;
        for f in &found {
            if self.vms.iter().flatten().any(|vm| vm.name == f.name) {
                continue;
            }
            let id = self
                .vms
                .iter()
                .position(Option::is_none)
                .unwrap_or(self.vms.len()) as u32;
            let limits = f
                .cfg_index
                .and_then(|i| self.cfg.vm_limits.get(i).cloned())
                .unwrap_or_else(|| self.cfg.default_limits.clone());
            let vm_metrics = self.metrics.vm(&f.name);
            match ServedVm::open(f, id, limits, vm_metrics) {
                Ok(vm) => {
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
                    changed = true;
                }
                Err(e) => warn!(vm = %f.name, error = %e, "cannot serve VM"),
            }
        }
        if changed {
            self.save_state();
        }
        self.metrics
            .vms
            .set(self.vms.iter().flatten().count() as i64);
    }

    pub(crate) fn drop_gone(&mut self) {
        let mut changed = false;
        for slot in self.vms.iter_mut() {
            if !slot.as_ref().is_some_and(|vm| vm.gone) {
                continue;
            }
            if let Some(mut vm) = slot.take() {
                let restored = vm.restore_all();
                for m in &vm.vcpus {
                    self.source.untrack(m.handle.tid as u32);
                }
                self.source.untrack_vmm(vm.threads.tgid as u32);
                info!(vm = %vm.name, tgid = vm.threads.tgid, restored, "VM gone; no longer served");
                changed = true;
            }
        }
        if changed {
            self.save_state();
            self.metrics
                .vms
                .set(self.vms.iter().flatten().count() as i64);
        }
    }

    fn save_state(&self) {
        let mut state = StateFile::new();
        for vm in self.vms.iter().flatten() {
            state.threads.extend(vm.records());
        }
        if let Err(e) = state.save(&self.state_path) {
            error!(error = %e, "cannot write state file: a crash would leave boosted threads unrestored");
        }
    }
}
