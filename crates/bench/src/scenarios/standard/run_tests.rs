//! The standard scenario's plan.

use super::plan::*;
use crate::harness::settings::Settings;

fn settings() -> Settings {
    // The session count below; modcost::plan has its own test.
    Settings::example()
}

#[test]
fn plan_counts_every_phase_of_every_session() {
    // 3 repeats x 2 loads x 3 modes = 18 sessions of 2 cyclictest + audio + ping-pong.
    let (phases, secs) = plan(&settings());
    assert_eq!(phases, 18 * 4);
    assert_eq!(secs, 18.0 * 33.0);
}
