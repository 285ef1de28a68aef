//! vCPU threads by name: the names VMMs give their vCPU threads carry the
//! vCPU index (and, for QEMU, the accelerator).

use std::io;

use serde::Serialize;

use crate::thread::threads_of;

/// How the VMM runs the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    Kvm,
    Tcg,
    Unknown,
}

/// Parses a vCPU index out of a thread name: QEMU `CPU n/KVM` / `CPU n/TCG`
/// (with `-name ..,debug-threads=on`), crosvm `crosvm_vcpuN`,
/// cloud-hypervisor `vcpuN`, Firecracker `fc_vcpu N`.
pub fn vcpu_index_from_name(comm: &str) -> Option<(u32, Accel)> {
    let comm = comm.trim_end_matches('\n');
    if let Some(rest) = comm.strip_prefix("CPU ") {
        let (n, accel) = rest.split_once('/')?;
        let accel = match accel {
            "KVM" => Accel::Kvm,
            "TCG" => Accel::Tcg,
            _ => Accel::Unknown,
        };
        return Some((n.parse().ok()?, accel));
    }
    for (prefix, accel) in [
        ("crosvm_vcpu", Accel::Kvm),
        ("fc_vcpu ", Accel::Kvm),
        ("vcpu", Accel::Kvm),
    ] {
        if let Some(n) = comm.strip_prefix(prefix) {
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                return Some((n.parse().ok()?, accel));
            }
        }
    }
    None
}

/// The vCPU threads of process `tgid` by name: (vCPU index, tid) sorted by
/// index, and the accelerator the names tell (`Unknown` when none does).
pub fn vcpu_threads_by_name(tgid: i32) -> io::Result<(Vec<(u32, i32)>, Accel)> {
    let mut accel = Accel::Unknown;
    let mut vcpus: Vec<(u32, i32)> = threads_of(tgid)?
        .into_iter()
        .filter_map(|(tid, comm)| {
            let (idx, a) = vcpu_index_from_name(&comm)?;
            accel = a;
            Some((idx, tid))
        })
        .collect();
    vcpus.sort_unstable();
    Ok((vcpus, accel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vcpu_names_of_every_known_vmm_parse_to_their_index() {
        let cases = [
            ("CPU 0/KVM", Some((0, Accel::Kvm))),
            ("CPU 12/TCG\n", Some((12, Accel::Tcg))),
            ("crosvm_vcpu3", Some((3, Accel::Kvm))),
            ("vcpu7", Some((7, Accel::Kvm))),
            ("fc_vcpu 1", Some((1, Accel::Kvm))),
            ("qemu-system-x86", None),
            ("vcpu", None),
            ("CPU x/KVM", None),
            ("worker", None),
        ];

        for (name, want) in cases {
            assert_eq!(vcpu_index_from_name(name), want, "{name}");
        }
    }

    #[test]
    fn a_process_without_vcpu_threads_has_none() {
        let (vcpus, accel) = vcpu_threads_by_name(std::process::id() as i32).unwrap();

        assert!(vcpus.is_empty());
        assert_eq!(accel, Accel::Unknown);
    }
}
