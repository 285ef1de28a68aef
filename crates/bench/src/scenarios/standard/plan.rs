//! The standard scenario's plan: how many phases and seconds of
//! measurement a session and the whole run have.

use crate::harness::settings::Settings;

/// Nominal seconds of one (load, mode) session and its phase count.
pub(super) fn session_plan(s: &Settings) -> (f64, usize) {
    let mut secs = s.duration as f64 * s.intervals.len() as f64;
    let mut phases = s.intervals.len();
    for extra in [s.audio_secs, s.pingpong_secs] {
        if extra > 0 {
            secs += extra as f64;
            phases += 1;
        }
    }
    (secs, phases)
}

/// Phases and nominal seconds of the whole run.
pub fn plan(s: &Settings) -> (usize, f64) {
    let sessions = s.repeat * s.loads.len() * s.modes.len();
    let (secs, phases) = session_plan(s);
    let (mc_phases, mc_secs) = super::modcost::run::plan(&s.modcost);
    (
        sessions * phases + mc_phases,
        sessions as f64 * secs + mc_secs,
    )
}
