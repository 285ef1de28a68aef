//! `pvschedctl idle --apply`: puts the advisor's window in force as the kvm
//! module's halt-polling cap, and puts the parameters found back (on request,
//! at shutdown, or after a crash from the state file).

use std::path::PathBuf;

use pvsched_base::kvm_params;
use pvsched_base::vcpu_names::Accel;
use pvsched_control::{Applied, ApplyTarget, IdleReport};
use tracing::info;

use crate::idle_report;
use crate::statefile::{SavedHaltPoll, StateFileError};
use crate::vm_table::VmTable;

/// The kvm module's halt-polling parameters as pvschedd sets them.
pub struct HaltPollApply {
    /// The module's parameter directory (`daemon.kvm_params_dir`).
    dir: PathBuf,
    /// The parameters as found before `pvschedctl idle --apply host` first
    /// changed them: put back at shutdown (and recorded in the state file,
    /// for the next start after a crash).
    original: Option<SavedHaltPoll>,
}

impl HaltPollApply {
    /// `original`: parameters a predecessor changed and could not put back.
    pub fn new(dir: PathBuf, original: Option<SavedHaltPoll>) -> Self {
        Self { dir, original }
    }

    /// What the state file must record, to be put back after a crash.
    pub fn original(&self) -> Option<&SavedHaltPoll> {
        self.original.as_ref()
    }

    /// Answers `Idle`: the report for `vms` (all, or the one named `only`).
    pub fn report(
        &self,
        vms: &VmTable,
        only: Option<&str>,
        budget_permille: u32,
        now: u64,
    ) -> Result<IdleReport, String> {
        idle_report::report(vms.iter(), only, budget_permille, &self.dir, now)
    }

    /// Answers `IdleApply`: the report, with what changed. `save` writes the
    /// state file with the parameters to put back it is given.
    pub fn apply(
        &mut self,
        vms: &VmTable,
        vm: Option<&str>,
        budget_permille: u32,
        target: ApplyTarget,
        now: u64,
        save: impl Fn(Option<&SavedHaltPoll>) -> Result<(), StateFileError>,
    ) -> Result<IdleReport, String> {
        let dir = self.dir.clone();
        let mut report = self.report(vms, vm, budget_permille, now)?;
        let current = report
            .kvm_halt_poll
            .ok_or("the kvm module is not loaded: there is no halt polling to set")?;
        let after = match target {
            ApplyTarget::Vm => return Err(per_vm_refusal(vms, vm)),
            ApplyTarget::Restore => {
                self.original
                    .as_ref()
                    .ok_or("nothing to put back: pvschedd has not changed the kvm parameters")?
                    .params
            }
            ApplyTarget::Host => idle_report::host_setting(&report, current)?,
        };
        let recorded_now = target == ApplyTarget::Host && self.original.is_none();
        if recorded_now {
            // Recorded before the write, so that a crash right after it is undone too.
            let original = SavedHaltPoll {
                dir: dir.clone(),
                params: current,
            };
            save(Some(&original))
                .map_err(|e| format!("recording the parameters to put back: {e}"))?;
            self.original = Some(original);
        }
        if let Err(e) = kvm_params::write_halt_poll_to(&dir, &after) {
            // A partial write keeps the record (what was found is put back at
            // exit); a write that changed nothing (read-only parameters) needs none.
            let unchanged = kvm_params::read_halt_poll_from(&dir).ok().flatten() == Some(current);
            if recorded_now && unchanged {
                self.original = None;
                let _ = save(None);
            }
            return Err(format!("kvm module parameters: {e}"));
        }
        if target == ApplyTarget::Restore {
            self.original = None;
            save(None).map_err(|e| format!("state file after putting the parameters back: {e}"))?;
        }
        info!(
            ?target,
            before = current.halt_poll_ns,
            after = after.halt_poll_ns,
            "kvm halt_poll_ns set"
        );
        report.kvm_halt_poll = Some(after);
        report.applied = Some(Applied {
            target,
            before: current,
            after,
        });
        Ok(report)
    }

    /// Puts the kvm parameters found before the first `--apply host` back.
    pub fn restore(&mut self) -> Result<(), String> {
        let Some(original) = &self.original else {
            return Ok(());
        };
        kvm_params::write_halt_poll_to(&original.dir, &original.params)
            .map_err(|e| e.to_string())?;
        info!(
            halt_poll_ns = original.params.halt_poll_ns,
            "kvm halt-polling parameters put back"
        );
        self.original = None;
        Ok(())
    }
}

/// Why a per-VM cap cannot be set for the VMs named: KVM takes it only on
/// the VM's own file descriptor, which its VMM holds, and QEMU has no
/// option or QMP command that sets it.
fn per_vm_refusal(vms: &VmTable, only: Option<&str>) -> String {
    let vms: Vec<String> = vms
        .iter()
        .filter(|v| only.is_none_or(|n| n == v.name))
        .map(|v| match v.threads.accel {
            Accel::Tcg => format!("{}: TCG (its vCPU threads never halt-poll)", v.name),
            _ => format!(
                "{}: its VMM (QEMU) has no way to set KVM_CAP_HALT_POLL on the VM",
                v.name
            ),
        })
        .collect();
    if vms.is_empty() {
        return "no VM to apply a per-VM cap to".into();
    }
    format!(
        "per-VM halt polling not applied: {}; use --apply host",
        vms.join("; ")
    )
}
