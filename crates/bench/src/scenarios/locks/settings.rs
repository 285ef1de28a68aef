//! The lock scenario's settings (the standard ones plus its own) and
//! its plan: how many phases and seconds of measurement a run has.

use super::model::*;
use crate::harness::settings::Settings;

/// The standard settings plus what only this scenario has.
#[derive(Clone, Debug)]
pub struct LockSettings {
    /// out, repeat, duration (the workload's seconds per measurement),
    /// accel, smp, memory, pvschedd, its overlay, retries, doorbell and the
    /// command line; the rest is not used.
    pub base: Settings,
    pub cases: Vec<LockCase>,
    pub modes: Vec<LockMode>,
    pub workload: Workload,
    /// Threads per guest; 0: lockstress's default, 2 per vCPU.
    pub threads: u32,
}

/// Phases and nominal seconds of the whole run.
pub fn plan(s: &LockSettings) -> (usize, f64) {
    let phases = s.base.repeat * s.cases.len() * s.modes.len();
    (phases, phases as f64 * s.base.duration as f64)
}
