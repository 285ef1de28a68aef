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
    /// pvsched without the VM's doorbell: the same pvschedd (rt backend),
    /// not handed the guest's eventfd, offers no `F_DOORBELL` and re-reads
    /// boosted vCPUs on its recheck timer.
    // What the doorbell saves pvschedd, measured against the timer on the
    // same VM in one run.
    PvschedTimer,
    /// pvschedd on the sched_ext backend (kernels with sched_ext: the host
    /// VM's), same policy.
    PvschedScx,
    /// `pvsched-scx` with lock holders honoured (`honor_lock_holders`):
    /// what lock handling costs a latency workload, beside `pvsched-scx`.
    PvschedScxLock,
}

impl Mode {
    /// The default modes (`pvsched-scx` only where asked for).
    pub const ALL: [Mode; 3] = [Mode::Vanilla, Mode::StaticRt, Mode::Pvsched];
    /// Every mode, in the order reports show them.
    pub const EVERY: [Mode; 6] = [
        Mode::Vanilla,
        Mode::StaticRt,
        Mode::Pvsched,
        Mode::PvschedTimer,
        Mode::PvschedScx,
        Mode::PvschedScxLock,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Vanilla => "vanilla",
            Mode::StaticRt => "static-rt",
            Mode::Pvsched => "pvsched",
            Mode::PvschedTimer => "pvsched-timer",
            Mode::PvschedScx => "pvsched-scx",
            Mode::PvschedScxLock => "pvsched-scx-lock",
        }
    }

    /// pvschedd serves the VM in this mode.
    pub fn is_pvsched(self) -> bool {
        matches!(
            self,
            Mode::Pvsched | Mode::PvschedTimer | Mode::PvschedScx | Mode::PvschedScxLock
        )
    }

    /// pvschedd in this mode is handed the VM's doorbell (when the VM has
    /// one): every pvsched mode but `pvsched-timer`, whose point is to serve
    /// the same VM without it.
    pub fn hands_doorbell(self) -> bool {
        matches!(
            self,
            Mode::Pvsched | Mode::PvschedScx | Mode::PvschedScxLock
        )
    }

    /// The `[defaults] honor_lock_holders` this mode sets over
    /// `--pvschedd-config`'s; None: the config's.
    pub fn honor_lock_holders(self) -> Option<bool> {
        (self == Mode::PvschedScxLock).then_some(true)
    }

    /// pvschedd's `daemon.backend` in this mode.
    pub fn backend(self) -> Option<&'static str> {
        match self {
            Mode::Pvsched | Mode::PvschedTimer => Some("rt"),
            Mode::PvschedScx | Mode::PvschedScxLock => Some("sched_ext"),
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
        for m in Mode::EVERY {
            assert_eq!(by_name::<Mode>(m.name()).unwrap(), m);
        }
        assert_eq!(by_name::<Load>("loaded").unwrap(), Load::Loaded);
        assert!(by_name::<Load>("busy").is_none());
    }

    #[test]
    fn pvsched_timer_parses_and_runs_only_where_asked_for() {
        // `--modes` parses through clap's ValueEnum, as `by_name` does.
        assert_eq!(by_name::<Mode>("pvsched-timer"), Some(Mode::PvschedTimer));
        assert!(!Mode::ALL.contains(&Mode::PvschedTimer));
        let every: Vec<Mode> = Mode::EVERY.to_vec();
        let at = |m: Mode| every.iter().position(|x| *x == m);
        assert_eq!(at(Mode::PvschedTimer), at(Mode::Pvsched).map(|i| i + 1));
    }

    #[test]
    fn pvsched_timer_is_pvsched_on_rt_without_the_doorbell() {
        let timer = Mode::PvschedTimer;
        assert!(timer.is_pvsched());
        assert_eq!(timer.backend(), Mode::Pvsched.backend());
        assert!(Mode::Pvsched.hands_doorbell());
        assert!(Mode::PvschedScx.hands_doorbell());
        assert!(!timer.hands_doorbell());
        assert!(!Mode::Vanilla.hands_doorbell() && !Mode::StaticRt.hands_doorbell());
    }
}
