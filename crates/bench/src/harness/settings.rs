//! What a run is asked to do: the CLI's options resolved into the settings
//! every scenario starts from, and the default output folder.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::axes::{Load, Mode};
use crate::accel::AccelChoice;

/// What to run (the CLI, resolved).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Settings {
    pub out: PathBuf,
    pub repeat: usize,
    /// Seconds per cyclictest measurement.
    pub duration: u64,
    pub intervals: Vec<u32>,
    pub loads: Vec<Load>,
    pub modes: Vec<Mode>,
    #[serde(skip, default = "auto")]
    pub accel: AccelChoice,
    pub smp: u32,
    pub memory_mb: u32,
    pub pvschedd: Option<PathBuf>,
    /// SCHED_RR priority of every vCPU thread in the static-rt mode.
    pub static_rt_priority: u32,
    /// `[daemon]` / `[defaults]` settings over pvschedd's defaults
    /// (`--pvschedd-config`); empty: the defaults.
    pub pvschedd_overlay: toml::Table,
    /// cyclictest histogram buckets (µs).
    pub buckets: u32,
    /// Seconds of audiosim per session (0: none).
    pub audio_secs: u64,
    /// Seconds of ping-pong per session (0: none).
    pub pingpong_secs: u64,
    /// Measure a cyclictest phase again (up to this many times) when other
    /// processes took more than 10 % of the machine meanwhile.
    #[serde(default)]
    pub retry_disturbed: usize,
    /// The guest module overhead phase (`--modcost-repeat`, `--modcost-loops`).
    #[serde(default)]
    pub modcost: ModCostSettings,
    /// The guest's region as `ivshmem-doorbell`, served by the bench, its
    /// eventfd handed to every pvschedd (`--no-doorbell`: ivshmem-plain and
    /// the recheck timer, as before). Runs before it had none.
    #[serde(default)]
    pub doorbell: bool,
    pub command: String,
    /// The number of this run's first repeat, and how far its first load is
    /// from the whole run's first: a `--platform kvm` chunk is one repeat of
    /// one load of a larger run, and numbers its repeat and rotates its modes
    /// as that run would (`--chunk-of REP:LOAD_INDEX`). 1 and 0 otherwise.
    #[serde(default = "first_repeat")]
    pub first_repeat: usize,
    #[serde(default)]
    pub load_offset: usize,
}

fn first_repeat() -> usize {
    1
}

fn auto() -> AccelChoice {
    AccelChoice::Auto
}

pub(crate) fn timestamp(fmt_file: bool) -> String {
    let mut t: libc::time_t = 0;
    // SAFETY: libc::tm is plain data: all-zero is a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: time(2) and localtime_r(3) with valid pointers.
    unsafe {
        libc::time(&mut t);
        libc::localtime_r(&t, &mut tm);
    }
    let (y, mo, d, h, mi, s) = (
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
    );
    if fmt_file {
        format!("{y:04}{mo:02}{d:02}-{h:02}{mi:02}{s:02}")
    } else {
        format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}")
    }
}

/// `bench-results/<timestamp>`.
pub fn default_out() -> PathBuf {
    PathBuf::from("bench-results").join(timestamp(true))
}

/// How the phase times an operation (`--modcost-clock`; module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ModCostClock {
    /// Guest time under `-icount shift=0,sleep=off`: 1 ns per guest
    /// instruction (TCG only, one vCPU).
    #[default]
    Icount,
    /// The guest's clock running on host time, as before icount.
    Host,
}

impl ModCostClock {
    pub fn name(self) -> &'static str {
        match self {
            Self::Icount => "icount",
            Self::Host => "host",
        }
    }

    /// What µs/op means under this clock, for the report.
    pub(crate) fn unit(self) -> &'static str {
        match self {
            Self::Icount => {
                "guest time under `-icount shift=0,sleep=off`: 1 ns per guest instruction, \
                 so µs/op is thousands of guest instructions per operation"
            }
            Self::Host => "guest time on the host clock",
        }
    }
}

/// What the phase runs (`--modcost-repeat`, `--modcost-loops`, `--modcost-clock`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModCostSettings {
    /// Runs of each variant (0: no phase).
    pub repeat: usize,
    /// `perf bench sched pipe -l` loops per run.
    pub loops: u32,
    /// The clock asked for; KVM falls back to the host's.
    #[serde(default)]
    pub clock: ModCostClock,
}

/// Repeats per variant by default. On the host clock a run's spread under
/// TCG is several percent, and 9 was meant to put a 2 % difference clear of
/// zero (it did not, at up to 15 %); under icount 4 runs already do.
pub const DEFAULT_REPEAT: usize = 9;

/// About 2-3 s per run under TCG (~100-130 µs of host time per operation).
pub const DEFAULT_LOOPS: u32 = 20_000;

impl Default for ModCostSettings {
    fn default() -> Self {
        Self {
            repeat: DEFAULT_REPEAT,
            loops: DEFAULT_LOOPS,
            clock: ModCostClock::default(),
        }
    }
}

#[cfg(test)]
impl Settings {
    /// What the scenarios' plan tests start from: 3 repeats of 10 s, both
    /// loads, every mode, intervals 500 and 1000 µs, 10 s of audio and 3 s
    /// of ping-pong, no module overhead phase.
    pub(crate) fn example() -> Settings {
        Settings {
            out: "x".into(),
            repeat: 3,
            duration: 10,
            intervals: vec![500, 1000],
            loads: vec![Load::Idle, Load::Loaded],
            modes: Mode::ALL.to_vec(),
            accel: AccelChoice::Auto,
            smp: 2,
            memory_mb: 512,
            pvschedd: None,
            pvschedd_overlay: toml::Table::new(),
            static_rt_priority: crate::host::RT_PRIO,
            buckets: 100_000,
            audio_secs: 10,
            pingpong_secs: 3,
            retry_disturbed: 2,
            doorbell: false,
            modcost: ModCostSettings {
                repeat: 0,
                ..Default::default()
            },
            command: String::new(),
            first_repeat: 1,
            load_offset: 0,
        }
    }
}
