//! KVM's own count of the vCPU preemptions it reported to guests, and of
//! those it did not (debugfs `kvm/preemption_reported` and
//! `kvm/preemption_other`, summed over every vCPU of the host).
//!
//! A guest learns that a vCPU is preempted from the steal-time flag KVM
//! sets when it schedules a vCPU thread out while runnable, and KVM sets it
//! only when the thread left the guest at an instruction boundary (on SVM:
//! for a host interrupt); a vCPU preempted while KVM handled another exit
//! (the IPI that woke its sibling, say) runs no more but is not flagged.
//! Holder preemptions the guests count by the flag are comparable across
//! modes only where these two counts say how many went unreported.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The counters' directory in a host with debugfs mounted.
pub const KVM_DEBUGFS: &str = "/sys/kernel/debug/kvm";

/// vCPU preemptions over a window, every vCPU of the host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvmPreemptions {
    /// Flagged to the guest (steal time's `preempted`).
    pub reported: u64,
    /// Not flagged: the vCPU left the guest elsewhere than at an
    /// instruction boundary.
    pub other: u64,
}

impl KvmPreemptions {
    /// The counters now, from `dir` (None: no KVM debugfs there, an older
    /// KVM without them, or unreadable).
    pub fn sample(dir: &Path) -> Option<KvmPreemptions> {
        let read = |name: &str| -> Option<u64> {
            std::fs::read_to_string(dir.join(name))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        Some(KvmPreemptions {
            reported: read("preemption_reported")?,
            other: read("preemption_other")?,
        })
    }

    /// The counts between two samples (None when a counter went back: a
    /// sample of another host, or KVM reloaded).
    pub fn between(before: &KvmPreemptions, after: &KvmPreemptions) -> Option<KvmPreemptions> {
        Some(KvmPreemptions {
            reported: after.reported.checked_sub(before.reported)?,
            other: after.other.checked_sub(before.other)?,
        })
    }

    /// Share of the preemptions the guests were told of.
    pub fn reported_share(&self) -> Option<f64> {
        let all = self.reported + self.other;
        (all > 0).then(|| self.reported as f64 / all as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preemptions_are_read_from_kvm_debugfs_and_differenced() {
        let dir = std::env::temp_dir().join(format!("pvsched-kvm-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch folder");
        let write = |name: &str, v: &str| std::fs::write(dir.join(name), v).expect("write");
        assert_eq!(KvmPreemptions::sample(&dir), None, "no files: no counts");
        write("preemption_reported", "120\n");
        write("preemption_other", "30\n");
        let a = KvmPreemptions::sample(&dir).expect("both files");
        write("preemption_reported", "150\n");
        write("preemption_other", "120\n");
        let b = KvmPreemptions::sample(&dir).expect("both files");
        let _ = std::fs::remove_dir_all(&dir);

        let d = KvmPreemptions::between(&a, &b).expect("counters went up");
        assert_eq!(
            d,
            KvmPreemptions {
                reported: 30,
                other: 90
            }
        );
        assert_eq!(d.reported_share(), Some(0.25));
        assert_eq!(KvmPreemptions::between(&b, &a), None, "counters went back");
        assert_eq!(KvmPreemptions::default().reported_share(), None);
    }
}
