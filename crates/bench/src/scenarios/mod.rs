//! The scenarios, each on the one harness: its run, what it keeps
//! (raw.json) and its report. [`Scenario`] names them, for `--scenario`
//! and in raw.json.

pub mod locks;
pub mod msgpass;
pub mod rogue;
pub mod standard;

use std::path::Path;

use serde::Deserialize;

use crate::error::{BenchError, Result};

/// What a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// One guest; vanilla, static-rt and pvsched side by side (BENCHMARKS.md).
    Standard,
    /// Two guests: a well-behaved neighbour beside a rogue spinning at
    /// SCHED_FIFO on every vCPU; pvschedd serves both.
    Rogue,
    /// One guest (2 vCPUs) passing messages between its vCPUs under each
    /// guest idle mode of pvsched.ko; pvschedd serves it throughout.
    MessagePassing,
    /// Two guests (2 vCPUs each) running a lock-heavy workload at once on
    /// the host's CPUs, and one alone; vanilla, pvschedd without and with
    /// lock-holder handling.
    Locks,
}

impl Scenario {
    /// The name `--scenario` takes and raw.json's `scenario` field holds.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Standard => "standard",
            Scenario::Rogue => "rogue",
            Scenario::MessagePassing => "message-passing",
            Scenario::Locks => "locks",
        }
    }

    /// The scenario that wrote the raw.json at `raw_path`: its `scenario`
    /// field, absent from the standard scenario's.
    pub fn of_raw(raw_path: &Path) -> Result<Scenario> {
        #[derive(Deserialize)]
        struct Written {
            #[serde(default)]
            scenario: Option<String>,
        }
        let (written, _): (Written, _) = crate::harness::raw::load(raw_path)?;
        let Some(name) = written.scenario else {
            return Ok(Scenario::Standard);
        };
        <Scenario as clap::ValueEnum>::value_variants()
            .iter()
            .copied()
            .find(|s| s.name() == name)
            .ok_or_else(|| {
                BenchError::Usage(format!(
                    "{}: written by an unknown scenario {name:?}",
                    raw_path.display()
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` written as a raw.json of its own.
    fn raw_file(tag: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("pvsched-of-raw-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("raw.json");
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn a_raw_file_names_its_scenario_and_one_without_the_field_is_standard() {
        let cases = [
            ("standard", r#"{"meta": {}}"#, Some(Scenario::Standard)),
            ("rogue", r#"{"scenario": "rogue"}"#, Some(Scenario::Rogue)),
            (
                "mp",
                r#"{"scenario": "message-passing"}"#,
                Some(Scenario::MessagePassing),
            ),
            (
                "locks",
                r#"{"scenario": "locks", "x": [1]}"#,
                Some(Scenario::Locks),
            ),
            ("other", r#"{"scenario": "weather"}"#, None),
        ];
        for (tag, text, want) in cases {
            let p = raw_file(tag, text);
            assert_eq!(Scenario::of_raw(&p).ok(), want, "{text}");
            let _ = std::fs::remove_dir_all(p.parent().unwrap());
        }
    }

    #[test]
    fn every_scenario_name_is_the_one_the_cli_takes() {
        for s in <Scenario as clap::ValueEnum>::value_variants() {
            let cli_name = clap::ValueEnum::to_possible_value(s).unwrap();
            assert_eq!(cli_name.get_name(), s.name());
        }
    }
}
