//! The bench's guests: their QEMU configuration, booting one or two with
//! the accelerator `--accel` chooses, their vCPU threads and the scheduling
//! parameters of every QEMU thread (what "restored" means after a mode).

use std::collections::BTreeMap;
use std::time::Duration;

use pvsched_base::qmp::Qmp;
use pvsched_base::sched::{get_params, set_params_verified, ThreadParams};
use pvsched_base::thread::threads_of;
use pvsched_base::vcpu_names::vcpu_threads_by_name;
use pvsched_vmtest::{Accel, GuestImage, Vm, VmConfig};

use super::journal::first_line;
use super::settings::Settings;
use crate::accel::{self, AccelChoice, KvmFacts};
use crate::daemon::{Locator, VmEntry};
use crate::error::{guest, io, BenchError, Result};
use crate::guest as gp;

/// Bound on one QMP exchange with the bench's QEMU.
const QMP_TIMEOUT: Duration = Duration::from_secs(20);

/// vCPU index -> thread id, from QMP `query-cpus-fast` on the VM's socket.
pub(crate) fn qmp_vcpu_threads(vm: &Vm) -> Result<Vec<(u32, i32)>> {
    Qmp::connect(vm.qmp_socket(), QMP_TIMEOUT)
        .and_then(|mut q| q.vcpu_thread_ids())
        .map_err(|source| BenchError::Qmp {
            what: "vCPU threads".into(),
            source,
        })
}

/// Every thread of a QEMU process with its parameters: what "restored"
/// means after a mode.
pub(crate) type ThreadBaseline = BTreeMap<i32, (String, ThreadParams)>;

/// The parameters of every thread of `pid` now.
pub(crate) fn thread_baseline(pid: u32) -> Result<ThreadBaseline> {
    let mut baseline = BTreeMap::new();
    for (tid, comm) in threads_of(pid as i32).map_err(io(format!("threads of QEMU (pid {pid})")))? {
        if let Ok(p) = get_params(tid) {
            baseline.insert(tid, (comm, p));
        }
    }
    Ok(baseline)
}

/// Puts every thread of `baseline` back to its parameters there; returns a
/// line for each thread that was not (restored or not).
pub(crate) fn restore_threads(baseline: &ThreadBaseline, after: &str) -> Vec<String> {
    let mut notes = Vec::new();
    for (&tid, (comm, base)) in baseline {
        let Ok(now) = get_params(tid) else {
            continue; // thread gone (QEMU worker threads come and go)
        };
        if now != *base {
            let fixed = set_params_verified(tid, base);
            notes.push(format!(
                "after {after}: thread {tid} ({comm}) was {now}, expected {base}: {}",
                match fixed {
                    Ok(()) => "restored".to_string(),
                    Err(e) => format!("restoring failed: {e}"),
                }
            ));
        }
    }
    notes
}

/// vCPU index -> thread id of `vm`: over QMP, else by thread names.
pub(crate) fn vcpu_threads(vm: &Vm) -> Result<Vec<(u32, i32)>> {
    let qemu = vm.qemu_pid();
    let vcpus = match qmp_vcpu_threads(vm) {
        Ok(v) if !v.is_empty() => v,
        other => {
            let why = match other {
                Ok(_) => "no vCPUs".to_string(),
                Err(e) => e.to_string(),
            };
            eprintln!(
                "pvsched-bench: VM {}: QMP query-cpus-fast: {why}; using thread names",
                vm.name()
            );
            vcpu_threads_by_name(qemu as i32)
                .map_err(io(format!("vCPU threads of QEMU (pid {qemu}) by name")))?
                .0
        }
    };
    if vcpus.is_empty() {
        return Err(BenchError::NoVcpuThreads { pid: qemu });
    }
    Ok(vcpus)
}

/// The QEMU configuration of a bench VM called `name`.
pub(crate) fn vm_config(
    s: &Settings,
    image: &pvsched_vmtest::GuestImage,
    name: &str,
    accel: Accel,
) -> VmConfig {
    VmConfig::new(image.clone())
        .name(name)
        .smp(s.smp)
        .memory_mb(s.memory_mb)
        .accel(accel)
        .doorbell(s.doorbell)
}

/// Boots the VM `name` with the accelerator `--accel` chooses (TCG when a
/// KVM boot fails under `auto`); returns it, the reason for the choice and
/// the accelerator.
pub(crate) fn boot(
    s: &Settings,
    image: pvsched_vmtest::GuestImage,
    name: &str,
) -> Result<(Vm, String, Accel)> {
    let decision = accel::decide(s.accel, &KvmFacts::probe());
    let cfg = |a: Accel| vm_config(s, &image, name, a);
    match Vm::boot(cfg(decision.accel)) {
        Ok(vm) => Ok((vm, decision.reason, decision.accel)),
        Err(e) if s.accel == AccelChoice::Auto && decision.accel == Accel::Kvm => {
            let reason = format!(
                "TCG: the KVM probe (booting the guest with -accel kvm) failed: {}",
                first_line(&e.to_string())
            );
            eprintln!("pvsched-bench: {reason}");
            let vm = Vm::boot(cfg(Accel::Tcg)).map_err(guest("booting the guest"))?;
            Ok((vm, reason, Accel::Tcg))
        }
        Err(e) => {
            // A KVM guest in the host VM is lost at boot now and then
            // (crates/hostvm/README.md, "Emulation faults"): once more
            // before the run is given up.
            eprintln!(
                "pvsched-bench: booting the guest failed ({}); booting it once more",
                first_line(&e.to_string())
            );
            let vm = Vm::boot(cfg(decision.accel))
                .map_err(guest(format!("booting the guest ({})", decision.reason)))?;
            Ok((vm, decision.reason, decision.accel))
        }
    }
}

/// A guest's vCPU threads as the start-up lines print them: `index:tid ...`.
pub(crate) fn listed_threads(vcpus: &[(u32, i32)]) -> String {
    vcpus
        .iter()
        .map(|(i, t)| format!("{i}:{t}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One of the two guests, with what the bench knows of it (also the lock
/// scenario's).
pub(crate) struct Guest {
    pub(crate) vm: Vm,
    pub(crate) vcpus: Vec<(u32, i32)>,
    pub(crate) cpus: u32,
    pub(crate) module: String,
    pub(crate) baseline: ThreadBaseline,
}

impl Guest {
    pub(crate) fn new(vm: Vm, needs_module: bool) -> Result<Guest> {
        let cpus = vm.guest_cpus().max(1);
        let (rc, out) = vm
            .insmod("")
            .map_err(guest(format!("insmod in {}", vm.name())))?;
        if rc != 0 && needs_module {
            return Err(BenchError::GuestModule { output: out });
        }
        let module = if rc == 0 {
            "loaded".to_string()
        } else {
            format!("NOT loaded ({})", first_line(out.trim()))
        };
        let vcpus = vcpu_threads(&vm)?;
        let baseline = thread_baseline(vm.qemu_pid())?;
        Ok(Guest {
            vm,
            vcpus,
            cpus,
            module,
            baseline,
        })
    }

    pub(crate) fn entry(&self, name: &str, by_pid: bool) -> Result<VmEntry> {
        let region = self
            .vm
            .region_path()
            .ok_or_else(|| BenchError::PvschedUnavailable(format!("VM {name} has no region file")))?
            .to_path_buf();
        if !region.exists() {
            return Err(BenchError::PvschedUnavailable(format!(
                "the region file {} of VM {name} is gone (its directory was removed by another \
                 process): pvschedd cannot serve this VM",
                region.display()
            )));
        }
        Ok(VmEntry {
            name: name.to_string(),
            region,
            locator: if by_pid {
                Locator::Pid(self.vm.qemu_pid())
            } else {
                Locator::Qmp(self.vm.qmp_socket().to_path_buf())
            },
            vcpus: self.vcpus.len(),
            doorbell: None,
        })
    }
}

/// Boots both VMs at once (two TCG boots on two cores take about as long
/// as one after the other, but the wait is not added): the neighbour with
/// `--accel`'s choice and its KVM fallback, the rogue with the accelerator
/// the neighbour ended up with.
/// The two-guest scenarios' start: builds (or takes from the cache) the
/// guest image and boots `first` and `second` with it ([`boot_two`]),
/// saying so; returns the VMs, the accelerator's reason and the accelerator.
pub(crate) fn boot_pair(
    s: &Settings,
    first: &str,
    second: &str,
) -> Result<(Vm, Vm, String, Accel)> {
    eprintln!("pvsched-bench: building the guest image (cached after the first run)");
    let cache = pvsched_vmtest::cache_root().with_file_name("pvsched-bench");
    let image = gp::build_image(&cache)?;
    eprintln!(
        "pvsched-bench: booting two guests ({} vCPUs each): {first} and {second}",
        s.smp
    );
    let booted = boot_two(s, image, first, second)?;
    eprintln!("pvsched-bench: accelerator: {}", booted.2);
    Ok(booted)
}

/// Boots the VMs `first` and `second` at once: `first` with `--accel`'s
/// choice and its KVM fallback, `second` with the accelerator `first` ended
/// up with (booted again if it differs).
fn boot_two(
    s: &Settings,
    image: GuestImage,
    first: &str,
    second: &str,
) -> Result<(Vm, Vm, String, Accel)> {
    let decision = accel::decide(s.accel, &KvmFacts::probe());
    let (one, two) = std::thread::scope(|sc| {
        let two = sc.spawn(|| Vm::boot(vm_config(s, &image, second, decision.accel)));
        let one = boot(s, image.clone(), first);
        (one, two.join())
    });
    let (one, reason, accel) = one?;
    let two = match two {
        Ok(Ok(vm)) if decision.accel == accel => vm,
        _ => Vm::boot(vm_config(s, &image, second, accel))
            .map_err(guest(format!("booting the VM {second}")))?,
    };
    Ok((one, two, reason, accel))
}
