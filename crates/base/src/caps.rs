//! Capabilities: keep only the ones a running program still needs.
//!
//! Mechanism only: which capabilities to keep is the caller's policy. Uses
//! the `caps` crate (capget/capset with the V3 ABI, PR_CAPBSET_DROP, the
//! ambient set) rather than hand-rolled syscalls; `PR_SET_NO_NEW_PRIVS` is
//! one `prctl`.
//!
//! Linux capabilities belong to a thread, not a process: [`keep_only`]
//! changes the calling thread, and threads it spawns afterwards inherit the
//! result. Call it before spawning the threads that must not have more.

use std::collections::HashSet;

use caps::CapSet;
pub use caps::Capability;

#[derive(Debug, thiserror::Error)]
pub enum CapsError {
    /// Reading or changing a capability set failed.
    #[error("{op}: {source}")]
    Caps {
        op: &'static str,
        #[source]
        source: caps::errors::CapsError,
    },
    /// `prctl(PR_SET_NO_NEW_PRIVS)` failed.
    #[error("prctl(PR_SET_NO_NEW_PRIVS): {0}")]
    NoNewPrivs(#[source] std::io::Error),
}

fn op(op: &'static str) -> impl FnOnce(caps::errors::CapsError) -> CapsError {
    move |source| CapsError::Caps { op, source }
}

/// What [`keep_only`] left the calling thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    /// Capabilities asked for and held: now the effective and permitted sets.
    pub kept: Vec<Capability>,
    /// Capabilities asked for that the thread did not have (not root, or a
    /// service manager's bounding set without them).
    pub missing: Vec<Capability>,
    /// Whether the bounding set was reduced too (needs CAP_SETPCAP, which an
    /// unprivileged caller lacks; with no-new-privs set, an exec cannot gain
    /// anything from it either way).
    pub bounding_reduced: bool,
}

/// Reduces the calling thread's capabilities to `keep` (those of them it
/// has): bounding set first (while CAP_SETPCAP is still effective), then
/// ambient and inheritable cleared, effective and permitted set to what is
/// kept; then sets `PR_SET_NO_NEW_PRIVS`. The user ids do not change.
///
/// A caller without capabilities is not an error: it keeps what it has of
/// `keep` (maybe nothing), and [`Kept::missing`] says what it lacked.
pub fn keep_only(keep: &[Capability]) -> Result<Kept, CapsError> {
    let keep: HashSet<Capability> = keep.iter().copied().collect();
    let permitted = caps::read(None, CapSet::Permitted).map_err(op("capget"))?;
    let effective = caps::read(None, CapSet::Effective).map_err(op("capget"))?;
    // The bounding set limits what an exec could ever grant again.
    let bounding_reduced = effective.contains(&Capability::CAP_SETPCAP);
    if bounding_reduced {
        for cap in caps::all().into_iter().filter(|c| !keep.contains(c)) {
            if caps::has_cap(None, CapSet::Bounding, cap).map_err(op("PR_CAPBSET_READ"))? {
                caps::drop(None, CapSet::Bounding, cap).map_err(op("PR_CAPBSET_DROP"))?;
            }
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(op("PR_CAP_AMBIENT_CLEAR_ALL"))?;
    caps::clear(None, CapSet::Inheritable).map_err(op("capset inheritable"))?;
    let kept: HashSet<Capability> = keep.intersection(&permitted).copied().collect();
    // Effective first: it must stay a subset of permitted at every step.
    caps::set(None, CapSet::Effective, &kept).map_err(op("capset effective"))?;
    caps::set(None, CapSet::Permitted, &kept).map_err(op("capset permitted"))?;
    set_no_new_privs()?;
    let mut missing: Vec<Capability> = keep.difference(&kept).copied().collect();
    let mut kept: Vec<Capability> = kept.into_iter().collect();
    kept.sort_unstable_by_key(|c| c.index());
    missing.sort_unstable_by_key(|c| c.index());
    Ok(Kept {
        kept,
        missing,
        bounding_reduced,
    })
}

/// Sets `PR_SET_NO_NEW_PRIVS` on the calling thread (inherited by threads
/// and children it creates afterwards): no exec can gain privileges.
pub fn set_no_new_privs() -> Result<(), CapsError> {
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if r != 0 {
        return Err(CapsError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The bit mask of `caps`, as in the `Cap*` lines of `/proc/<pid>/status`.
pub fn mask(caps: &[Capability]) -> u64 {
    caps.iter().fold(0, |m, c| m | c.bitmask())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_matches_the_kernels_bit_numbers() {
        // CAP_DAC_OVERRIDE is bit 1, CAP_SYS_NICE 23, CAP_PERFMON 38.
        let m = mask(&[
            Capability::CAP_DAC_OVERRIDE,
            Capability::CAP_SYS_NICE,
            Capability::CAP_PERFMON,
        ]);

        assert_eq!(m, (1 << 1) | (1 << 23) | (1 << 38));
    }

    #[test]
    fn keeping_only_what_a_thread_has_drops_the_rest_of_it() {
        // In a thread of its own: capabilities are per thread, so the test
        // process (and the other tests) keep theirs.
        let before = caps::read(None, CapSet::Permitted).unwrap();
        let wanted = [Capability::CAP_SYS_NICE, Capability::CAP_DAC_OVERRIDE];

        let (kept, eff, prm, nnp) = std::thread::spawn(move || {
            let kept = keep_only(&wanted).unwrap();
            let eff = caps::read(None, CapSet::Effective).unwrap();
            let prm = caps::read(None, CapSet::Permitted).unwrap();
            // SAFETY: prctl with integer arguments only.
            let nnp = unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) };
            (kept, eff, prm, nnp)
        })
        .join()
        .unwrap();

        let expect: HashSet<Capability> = wanted
            .iter()
            .copied()
            .filter(|c| before.contains(c))
            .collect();
        assert_eq!(eff, expect);
        assert_eq!(prm, expect);
        assert_eq!(nnp, 1);
        assert_eq!(kept.kept.len() + kept.missing.len(), wanted.len());
    }
}
