//! The message-passing scenario's settings (the standard ones plus its own) and
//! its plan: how many phases and seconds of measurement a run has.

use super::model::*;
use crate::harness::settings::Settings;

/// The standard settings plus what only this scenario has.
#[derive(Clone, Debug)]
pub struct MsgSettings {
    /// out, repeat, duration (seconds per workload), loads, accel, smp,
    /// memory, pvschedd, its overlay, retries and the command line; the
    /// intervals, modes, audio and ping-pong settings are not used.
    pub base: Settings,
    pub cases: Vec<IdleCase>,
    /// The advisor's CPU budget, permille of a vCPU; also the poll share
    /// the `hinted` target allows.
    pub budget_permille: u32,
}

/// Phases and nominal seconds of the whole run: per (repeat, load) block a
/// warm-up of every workload, then every workload under every case.
pub fn plan(s: &MsgSettings) -> (usize, f64) {
    let b = &s.base;
    let blocks = b.repeat * b.loads.len();
    let w = Workload::ALL.len();
    let phases = blocks * (1 + s.cases.len() * w);
    let secs = blocks as f64 * (1 + s.cases.len()) as f64 * (w as u64 * b.duration) as f64;
    (phases, secs)
}
