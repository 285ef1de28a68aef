//! The table of served VMs: VMs that discovery reports are opened (on the
//! discovery thread, each with a VM id reserved here) and tracked by the
//! event source; VMs that are gone (or whose threads changed) are restored
//! and untracked.

use std::collections::BTreeMap;
use std::sync::mpsc::Sender;

use pvsched_abi::{F_ALL, F_DOORBELL, F_EXT_NOTICE, F_IDLE_HINTS, F_LOCK_HOLD};
use tracing::{error, info, warn};

use crate::backend::SchedExt;
use crate::config::Resolved;
use crate::discovery::{DiscoveryRequest, OpenRequest};
use crate::doorbell::Doorbells;
use crate::events::EventSource;
use crate::found::Found;
use crate::metrics::Metrics;
use crate::statefile::{Restored, ThreadRecord};
use crate::vm::ServedVm;

pub struct VmTable {
    /// Served VMs; the index is the VM id in the event source's maps.
    slots: Vec<Option<ServedVm>>,
    /// VMs to open, to the discovery thread.
    open_tx: Sender<DiscoveryRequest>,
    /// VMs being opened there, by name, with the VM id reserved for each.
    opening: BTreeMap<String, u32>,
    /// Why each VM that could not be opened was refused (logged once).
    refused: BTreeMap<String, String>,
}

/// What a new VM is opened with, from the daemon's configuration.
pub struct OpenTerms<'a> {
    pub cfg: &'a Resolved,
    pub metrics: &'a Metrics,
    pub doorbells: &'a Doorbells,
}

impl VmTable {
    pub fn new(open_tx: Sender<DiscoveryRequest>) -> Self {
        Self {
            slots: Vec::new(),
            open_tx,
            opening: BTreeMap::new(),
            refused: BTreeMap::new(),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &ServedVm> + '_ {
        self.slots.iter().flatten()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut ServedVm> + '_ {
        self.slots.iter_mut().flatten()
    }

    pub fn get(&self, id: u32) -> Option<&ServedVm> {
        self.slots.get(id as usize).and_then(Option::as_ref)
    }

    pub fn get_mut(&mut self, id: u32) -> Option<&mut ServedVm> {
        self.slots.get_mut(id as usize).and_then(Option::as_mut)
    }

    /// One past the highest VM id in use (ids below it may be free).
    pub fn id_bound(&self) -> u32 {
        self.slots.len() as u32
    }

    /// The VM id of the served VM named `name`.
    pub fn id_of(&self, name: &str) -> Option<u32> {
        self.iter().find(|vm| vm.name == name).map(|vm| vm.id)
    }

    /// How many VMs are served.
    pub fn served(&self) -> usize {
        self.iter().count()
    }

    /// Every served VM's threads, as the state file records them.
    pub fn records(&self) -> impl Iterator<Item = ThreadRecord> + '_ {
        self.iter().flat_map(ServedVm::records)
    }

    /// Marks as gone each served VM that discovery no longer `found`, or
    /// found with other threads.
    pub fn mark_missing(&mut self, found: &[Found]) {
        for vm in self.iter_mut() {
            match found.iter().find(|f| f.name == vm.name) {
                None => vm.gone = true,
                Some(f) if f.threads != vm.threads => vm.gone = true,
                Some(_) => {}
            }
        }
    }

    /// Asks the discovery thread to open each VM `found` that is neither
    /// served nor being opened, with a VM id reserved for it.
    pub fn open_new(&mut self, found: Vec<Found>, terms: OpenTerms<'_>) {
        for f in found {
            if self.opening.contains_key(&f.name) || self.id_of(&f.name).is_some() {
                continue;
            }
            let Some(id) = self.free_ids().next() else {
                continue;
            };
            let limits = f
                .cfg_index
                .and_then(|i| terms.cfg.vm_limits.get(i).cloned())
                .unwrap_or_else(|| terms.cfg.default_limits.clone());
            let metrics = terms.metrics.vm(&f.name);
            self.opening.insert(f.name.clone(), id);
            let mut features = F_ALL;
            if !terms.cfg.config.daemon.offer_idle_hints {
                features &= !F_IDLE_HINTS;
            }
            if !terms.doorbells.serves(&f.name) {
                features &= !F_DOORBELL;
            }
            // A guest marks its lock holders (ftrace on its lock calls, a
            // cost on each) only for a host that extends them, and is shown
            // its extensions only then.
            if !limits.honor_lock_holders {
                features &= !(F_LOCK_HOLD | F_EXT_NOTICE);
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

    /// Whether a VM of `found` is neither served nor being opened.
    pub fn any_unserved(&self, found: &[Found]) -> bool {
        found
            .iter()
            .any(|f| !self.opening.contains_key(&f.name) && self.id_of(&f.name).is_none())
    }

    /// The discovery thread's answer for VM `name`: the VM, to serve once the
    /// state file lists its threads, or why it was refused (logged once).
    pub fn opened(
        &mut self,
        name: String,
        result: Result<Box<ServedVm>, String>,
    ) -> Option<ServedVm> {
        self.opening.remove(&name);
        match result {
            Ok(vm) => {
                self.refused.remove(&name);
                Some(*vm)
            }
            Err(e) => {
                if self.refused.get(&name) != Some(&e) {
                    warn!(vm = %name, error = %e, "cannot serve VM");
                    self.refused.insert(name, e);
                }
                None
            }
        }
    }

    /// Serves `vm` as VM `id`: the event source tracks its threads from now.
    /// With `scx` (the sched_ext backend) the scheduler knows its vCPU
    /// threads and where their slots are.
    pub fn serve(
        &mut self,
        id: u32,
        mut vm: ServedVm,
        source: &mut EventSource,
        scx: Option<&SchedExt>,
    ) {
        for (i, m) in vm.vcpus.iter().enumerate() {
            source.track(m.handle.tid as u32, id, i as u32);
        }
        if let Some(s) = scx {
            register_with(s, &mut vm);
        }
        source.track_vmm(vm.threads.tgid as u32, id);
        info!(
            vm = %vm.name, tgid = vm.threads.tgid, vcpus = vm.vcpus.len(),
            accel = ?vm.threads.accel, generation = vm.generation, "serving VM"
        );
        let slot = id as usize;
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, || None);
        }
        self.slots[slot] = Some(vm);
    }

    /// Restores and drops every VM marked gone, the event source untracking
    /// its threads: `None` when none was, else the records of the threads
    /// that live but could not be restored.
    pub fn drop_gone(
        &mut self,
        source: &mut EventSource,
        scx: Option<&SchedExt>,
    ) -> Option<Vec<ThreadRecord>> {
        let mut left = None::<Vec<ThreadRecord>>;
        for slot in self.slots.iter_mut() {
            if !slot.as_ref().is_some_and(|vm| vm.gone) {
                continue;
            }
            if let Some(mut vm) = slot.take() {
                let done = vm.restore_all();
                for m in &vm.vcpus {
                    source.untrack(m.handle.tid as u32);
                }
                if let Some(s) = scx {
                    for m in vm.vcpus.iter().chain(&vm.latency_path) {
                        s.unregister(m.handle.tid as u32);
                    }
                }
                source.untrack_vmm(vm.threads.tgid as u32);
                info!(
                    vm = %vm.name, tgid = vm.threads.tgid, restored = done.restored,
                    left = done.left.len(), "VM gone; no longer served"
                );
                left.get_or_insert_with(Vec::new).extend(done.left);
            }
        }
        left
    }

    /// At exit: restores every thread, clears every host half and empties the
    /// table.
    pub fn restore_all(&mut self) -> Restored {
        let mut out = Restored::default();
        for vm in self.iter_mut() {
            let done = vm.restore_all();
            out.restored += done.restored;
            out.left.extend(done.left);
            vm.clear_host_halves();
            vm.withdraw_lock_holders();
        }
        self.slots.clear();
        out
    }

    /// Asks the discovery thread for a round now.
    pub fn rescan(&self) -> Result<(), String> {
        self.open_tx
            .send(DiscoveryRequest::Rescan)
            .map_err(|_| "the discovery thread has stopped".to_string())
    }

    /// VM ids free for new VMs, lowest first: empty slots, then new ones,
    /// but none reserved for a VM being opened.
    fn free_ids(&self) -> impl Iterator<Item = u32> + '_ {
        let empty = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.is_none())
            .map(|(i, _)| i as u32);
        empty
            .chain(self.slots.len() as u32..)
            .filter(|id| !self.opening.values().any(|r| r == id))
    }
}

/// Registers `vm`'s vCPU threads (with their slots, where the VMM maps
/// them already) and latency-path threads (no slot) with the sched_ext
/// scheduler.
pub fn register_with(s: &SchedExt, vm: &mut ServedVm) {
    let slots = vm.slot_addresses();
    for (i, m) in vm.vcpus.iter_mut().enumerate() {
        m.scx_slot = slots.get(i).copied().unwrap_or(0);
        if let Err(e) = s.register(m.handle.tid as u32, m.scx_slot) {
            warn!(vm = %vm.name, vcpu = i, error = %e, "sched_ext: cannot register the vCPU thread");
        }
    }
    for m in &vm.latency_path {
        if let Err(e) = s.register(m.handle.tid as u32, 0) {
            warn!(vm = %vm.name, tid = m.handle.tid, error = %e, "sched_ext: cannot register the thread");
        }
    }
}

/// Gives the sched_ext scheduler the slots of `vm`'s vCPUs it has no
/// address for yet: a VMM may map its region file after it is served.
pub fn find_slots(s: &SchedExt, vm: &mut ServedVm) {
    if vm.vcpus.iter().all(|m| m.scx_slot != 0) {
        return;
    }
    let slots = vm.slot_addresses();
    for (i, m) in vm.vcpus.iter_mut().enumerate() {
        let found = slots.get(i).copied().unwrap_or(0);
        if m.scx_slot == 0 && found != 0 {
            match s.set_slot(m.handle.tid as u32, found) {
                Ok(()) => {
                    m.scx_slot = found;
                    info!(vm = %vm.name, vcpu = i, "sched_ext: slot found in the VMM");
                }
                Err(e) => warn!(vm = %vm.name, vcpu = i, error = %e, "sched_ext: slot address"),
            }
        }
    }
}
