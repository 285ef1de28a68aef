//! What every report says about its run: the command, when, the machine,
//! the guest, the accelerator and the notes.

use serde::{Deserialize, Serialize};

use crate::host::Machine;

/// Facts about the run that the numbers need next to them.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Meta {
    pub command: String,
    pub started: String,
    pub wall_s: f64,
    pub repeat: usize,
    pub duration_s: u64,
    pub accel: String,
    pub accel_reason: String,
    pub guest_cpus: u32,
    pub guest_kernel: String,
    pub guest_module: String,
    pub load_cmd: String,
    /// pvschedd settings over its defaults (`--pvschedd-config`), as TOML;
    /// empty: the defaults.
    #[serde(default)]
    pub pvschedd_settings: String,
    /// SCHED_RR priority of the vCPU threads in the static-rt mode (0 in
    /// reports from before it was recorded: it was 8).
    #[serde(default)]
    pub static_rt_priority: u32,
    pub machine: Machine,
    pub notes: Vec<String>,
}
