//! What the module overhead phase keeps (raw.json): every `perf bench sched
//! pipe` run with and without the module.

use serde::{Deserialize, Serialize};

use crate::harness::settings::ModCostClock;

/// One `perf bench sched pipe` run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PipeRun {
    pub rep: usize,
    /// pvsched.ko loaded and bound during the run.
    pub module: bool,
    /// perf's `usecs/op`.
    pub usecs_per_op: f64,
    /// CPU time of QEMU's vCPU thread(s) on the host over the whole guest
    /// command (perf's start and exit included), µs per operation; None if
    /// it could not be read.
    #[serde(default)]
    pub vcpu_cpu_us_per_op: Option<f64>,
    /// Publishes into the pinned vCPU's slot during the run (its `seq`
    /// advanced by two per publish); with the module only.
    #[serde(default)]
    pub publishes: Option<u64>,
    /// Share of the machine that went to processes outside the bench.
    pub foreign_cpu: f64,
}

/// What raw.json keeps of the phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModCostRaw {
    /// The guest command of one run.
    pub command: String,
    pub loops: u32,
    pub guest_cpus: u32,
    /// How QEMU ran this guest, e.g. "tcg, single-threaded".
    pub accel: String,
    /// The clock perf's µs/op was measured on (raw files before icount: host).
    #[serde(default = "host_clock")]
    pub clock: ModCostClock,
    /// Host features the region offered (hex).
    pub host_features: String,
    /// In run order; disturbed runs taken again are not kept.
    pub runs: Vec<PipeRun>,
}

pub(super) fn host_clock() -> ModCostClock {
    ModCostClock::Host
}
