//! What a run varies: the host's load, the host's mode, and the order in
//! which the cases of a repeat take their turns.

use std::fmt;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// How the host treats the vCPU threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ValueEnum)]
pub enum Mode {
    /// SCHED_OTHER, as QEMU starts them.
    Vanilla,
    /// Every vCPU thread SCHED_RR 8 (chrt -r 8, libvirt `<vcpusched>`).
    StaticRt,
    /// pvschedd running with its default policy, on the rt backend.
    Pvsched,
    /// pvschedd on the sched_ext backend (kernels with sched_ext: the host
    /// VM's), same policy.
    PvschedScx,
}

impl Mode {
    /// The default modes (`pvsched-scx` only where asked for).
    pub const ALL: [Mode; 3] = [Mode::Vanilla, Mode::StaticRt, Mode::Pvsched];
    /// Every mode, in the order reports show them.
    pub const EVERY: [Mode; 4] = [
        Mode::Vanilla,
        Mode::StaticRt,
        Mode::Pvsched,
        Mode::PvschedScx,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Vanilla => "vanilla",
            Mode::StaticRt => "static-rt",
            Mode::Pvsched => "pvsched",
            Mode::PvschedScx => "pvsched-scx",
        }
    }

    /// pvschedd serves the VM in this mode.
    pub fn is_pvsched(self) -> bool {
        matches!(self, Mode::Pvsched | Mode::PvschedScx)
    }

    /// pvschedd's `daemon.backend` in this mode.
    pub fn backend(self) -> Option<&'static str> {
        match self {
            Mode::Pvsched => Some("rt"),
            Mode::PvschedScx => Some("sched_ext"),
            Mode::Vanilla | Mode::StaticRt => None,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What else runs on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ValueEnum)]
pub enum Load {
    Idle,
    /// stress-ng as in the published setup, scaled to the cores.
    Loaded,
}

impl Load {
    pub fn name(self) -> &'static str {
        match self {
            Load::Idle => "idle",
            Load::Loaded => "loaded",
        }
    }
}

impl fmt::Display for Load {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The value of the case enum `T` that the CLI and the files call `name`.
pub fn by_name<T: clap::ValueEnum>(name: &str) -> Option<T> {
    T::from_str(name, false).ok()
}

/// Order of the modes in repeat `rep` under load number `load_idx`: rotated,
/// so that over the repeats every mode takes every position (first after the
/// load starts, last...) equally often and drift favours none.
pub fn mode_order<T: Copy>(modes: &[T], rep: usize, load_idx: usize) -> Vec<T> {
    if modes.is_empty() {
        return Vec::new();
    }
    let k = (rep + load_idx) % modes.len();
    modes[k..].iter().chain(&modes[..k]).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_order_rotates_so_each_mode_leads_once_per_cycle() {
        let m = Mode::ALL;
        let firsts: Vec<Mode> = (0..3).map(|r| mode_order(&m, r, 0)[0]).collect();
        assert_eq!(firsts, vec![Mode::Vanilla, Mode::StaticRt, Mode::Pvsched]);
        assert_eq!(
            mode_order(&m, 1, 1),
            vec![Mode::Pvsched, Mode::Vanilla, Mode::StaticRt]
        );
    }

    #[test]
    fn names_round_trip() {
        for m in Mode::ALL {
            assert_eq!(by_name::<Mode>(m.name()).unwrap(), m);
        }
        assert_eq!(by_name::<Load>("loaded").unwrap(), Load::Loaded);
        assert!(by_name::<Load>("busy").is_none());
    }
}
