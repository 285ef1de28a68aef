//! The rogue scenario's report: per (load, interval) cell each case's
//! latency, CPU shares, pvschedd's counters and thread parameters over the
//! repeats, the ratios between cases, and the targets with their verdicts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::model::*;
use crate::harness::figures::Side;

/// Largest p99 ratio (rogue spinning / rogue idle, pvsched) the target allows.
pub const P99_LIMIT: f64 = 1.2;

/// How far (fraction of the machine) the rogue's share under pvsched may
/// exceed its share under vanilla.
pub const SHARE_MARGIN: f64 = 0.10;

/// A CPU share over the repeats, in percent of the machine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Share {
    /// Over every window of the cell (ticks summed / windows summed).
    pub pct: f64,
    pub pct_per_repeat: Vec<f64>,
}

/// pvschedd's counters of one VM, summed over the repeats of a cell.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DaemonSummary {
    pub boosts: u64,
    pub throttles: u64,
    pub over_budget: u64,
    pub clamped_inputs: u64,
    pub boosted_s: f64,
    /// Boosted vCPU time / (windows x the VM's vCPUs), percent.
    pub boosted_pct: f64,
    pub boosted_pct_per_repeat: Vec<f64>,
    /// Repeats that ended with the VM's boost budget latched.
    pub in_debt_at_end: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CaseReport {
    /// The neighbour's guest cyclictest.
    pub guest: Side,
    pub host: Side,
    pub rogue_share: Share,
    /// The rogue's vCPU threads alone.
    pub rogue_vcpu_share: Share,
    pub neighbour_share: Share,
    /// Scheduling parameters seen per thread group, summed over the repeats.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, ParamsSeen>,
    pub other_load_pct_per_repeat: Vec<f64>,
    pub rogue_spinning_per_repeat: Vec<u32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub daemon: BTreeMap<String, DaemonSummary>,
}

/// The comparisons of one cell; None when a case is missing or a
/// denominator is 0.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CellRatios {
    /// Neighbour guest p99, pvsched-rogue / pvsched-quiet.
    pub neighbour_p99_pvsched: Option<f64>,
    /// Host p99, pvsched-rogue / pvsched-quiet.
    pub host_p99_pvsched: Option<f64>,
    /// Neighbour guest p99, vanilla-rogue / vanilla-quiet.
    pub neighbour_p99_vanilla: Option<f64>,
    /// Host p99, vanilla-rogue / vanilla-quiet.
    pub host_p99_vanilla: Option<f64>,
    /// Rogue share under pvsched minus under vanilla, percentage points.
    pub rogue_share_pvsched_minus_vanilla_pts: Option<f64>,
}

/// One (load, interval) of the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub load: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_cmd: Option<String>,
    pub interval_us: u32,
    pub duration_s: u64,
    pub repeat: usize,
    pub cases: BTreeMap<String, CaseReport>,
    pub ratios: CellRatios,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RogueTarget {
    pub load: String,
    pub interval_us: u32,
    pub what: String,
    pub value: f64,
    pub limit: f64,
    /// "x" (a ratio) or "%" (of the machine).
    pub unit: String,
    pub met: bool,
}

impl RogueTarget {
    pub fn verdict(&self) -> String {
        let v = |x: f64| {
            if self.unit == "x" {
                format!("{x:.2}x")
            } else {
                format!("{x:.1} %")
            }
        };
        if self.met {
            format!("met ({}, limit {})", v(self.value), v(self.limit))
        } else if self.unit == "x" {
            format!(
                "MISSED by {:.0} % ({}, limit {})",
                (self.value / self.limit - 1.0) * 100.0,
                v(self.value),
                v(self.limit)
            )
        } else {
            format!(
                "MISSED by {:.1} points ({}, limit {})",
                self.value - self.limit,
                v(self.value),
                v(self.limit)
            )
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RogueReport {
    pub schema: String,
    pub meta: RogueMeta,
    pub cells: Vec<Cell>,
    pub targets: Vec<RogueTarget>,
    /// PNG files, relative to the output directory.
    pub plots: Vec<String>,
}
