//! `pvschedctl idle --apply`: puts the advisor's window in force as the kvm
//! module's halt-polling cap, and puts the parameters found back (on request,
//! at shutdown, or after a crash from the state file).

use pvsched_base::kvm_params;
use pvsched_base::vcpu_names::Accel;
use pvsched_control::{Applied, ApplyTarget, IdleReport};
use tracing::info;

use crate::event_loop::Daemon;
use crate::idle_report;
use crate::statefile::SavedHaltPoll;

impl Daemon {
    /// Answers `IdleApply`: the report, with what changed.
    pub(crate) fn idle_apply(
        &mut self,
        vm: Option<&str>,
        budget_permille: u32,
        target: ApplyTarget,
        now: u64,
    ) -> Result<IdleReport, String> {
        let dir = self.cfg.config.daemon.kvm_params_dir.clone();
        let mut report =
            idle_report::report(self.vms.iter().flatten(), vm, budget_permille, &dir, now)?;
        let current = report
            .kvm_halt_poll
            .ok_or("the kvm module is not loaded: there is no halt polling to set")?;
        let after = match target {
            ApplyTarget::Vm => return Err(self.per_vm_refusal(vm)),
            ApplyTarget::Restore => {
                self.kvm_original
                    .as_ref()
                    .ok_or("nothing to put back: pvschedd has not changed the kvm parameters")?
                    .params
            }
            ApplyTarget::Host => idle_report::host_setting(&report, current)?,
        };
        let recorded_now = target == ApplyTarget::Host && self.kvm_original.is_none();
        if recorded_now {
            // Recorded before the write, so that a crash right after it is undone too.
            self.kvm_original = Some(SavedHaltPoll {
                dir: dir.clone(),
                params: current,
            });
            if let Err(e) = self.save_state(std::iter::empty()) {
                self.kvm_original = None;
                return Err(format!("recording the parameters to put back: {e}"));
            }
        }
        if let Err(e) = kvm_params::write_halt_poll_to(&dir, &after) {
            // A partial write keeps the record (what was found is put back at
            // exit); a write that changed nothing (read-only parameters) needs none.
            let unchanged = kvm_params::read_halt_poll_from(&dir).ok().flatten() == Some(current);
            if recorded_now && unchanged {
                self.kvm_original = None;
                let _ = self.save_state(std::iter::empty());
            }
            return Err(format!("kvm module parameters: {e}"));
        }
        if target == ApplyTarget::Restore {
            self.kvm_original = None;
            self.save_state(std::iter::empty())
                .map_err(|e| format!("state file after putting the parameters back: {e}"))?;
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

    /// Why a per-VM cap cannot be set for the VMs named: KVM takes it only on
    /// the VM's own file descriptor, which its VMM holds, and QEMU has no
    /// option or QMP command that sets it.
    fn per_vm_refusal(&self, only: Option<&str>) -> String {
        let vms: Vec<String> = self
            .vms
            .iter()
            .flatten()
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

    /// Puts the kvm parameters found before the first `--apply host` back.
    pub(crate) fn restore_kvm_params(&mut self) -> Result<(), String> {
        let Some(original) = &self.kvm_original else {
            return Ok(());
        };
        kvm_params::write_halt_poll_to(&original.dir, &original.params)
            .map_err(|e| e.to_string())?;
        info!(
            halt_poll_ns = original.params.halt_poll_ns,
            "kvm halt-polling parameters put back"
        );
        self.kvm_original = None;
        Ok(())
    }
}
