//! What every report says about its run: the command, when, the machine,
//! the guest, the accelerator and the notes.

use std::time::Instant;

use pvsched_vmtest::Accel;
use serde::{Deserialize, Serialize};

use super::settings::Settings;
use crate::host::{self, Machine};

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

impl Meta {
    /// The meta of a run of `s` that began at `started` (`t0`) and booted
    /// its guests with `accel` (for `accel_reason`) on `machine`, loaded by
    /// the standard stress-ng; the guest's facts and the notes are the
    /// scenario's to fill in.
    pub fn of_run(
        s: &Settings,
        (started, t0): (String, Instant),
        (accel, accel_reason): (Accel, String),
        machine: Machine,
    ) -> Meta {
        Meta {
            command: s.command.clone(),
            started,
            wall_s: t0.elapsed().as_secs_f64(),
            repeat: s.repeat,
            duration_s: s.duration,
            accel: match accel {
                Accel::Tcg => "tcg".into(),
                Accel::Kvm => "kvm".into(),
            },
            accel_reason,
            load_cmd: format!("stress-ng {}", host::load_args(machine.cpus).join(" ")),
            pvschedd_settings: s.pvschedd_overlay.to_string(),
            static_rt_priority: s.static_rt_priority,
            machine,
            ..Meta::default()
        }
    }
}
