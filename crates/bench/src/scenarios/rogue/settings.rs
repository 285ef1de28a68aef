//! The rogue scenario's settings (the standard ones plus its own) and
//! its plan: how many phases and seconds of measurement a run has.

use super::model::*;
use crate::harness::settings::Settings;

/// The standard settings plus what only this scenario has.
#[derive(Clone, Debug)]
pub struct RogueSettings {
    /// out, repeat, duration, intervals, loads, accel, smp, memory, pvschedd,
    /// its overlay, buckets, retries and the command line; the modes, audio
    /// and ping-pong settings are not used.
    pub base: Settings,
    pub cases: Vec<Case>,
    /// SCHED_FIFO priority of the rogue's rtspin in the guest.
    pub priority: u32,
}

/// Phases and nominal seconds of the whole run.
pub fn plan(s: &RogueSettings) -> (usize, f64) {
    let b = &s.base;
    let phases = b.repeat * b.loads.len() * s.cases.len() * b.intervals.len();
    (phases, phases as f64 * b.duration as f64)
}
