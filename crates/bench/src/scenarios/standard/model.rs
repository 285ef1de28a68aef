//! What a standard run keeps (raw.json): per (load, interval, mode) the
//! cyclictest runs, per (load, mode) the sessions, and the module overhead
//! and simulated parts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::modcost::model::ModCostRaw;
use super::share::CpuUse;
use crate::guest::{AudioResult, PingPongResult};
use crate::harness::axes::{by_name, Load, Mode};
use crate::harness::meta::Meta;
use crate::host::StressorRate;
use crate::stats::Histogram;

/// One cyclictest measurement (guest and host at once).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LatencyRun {
    pub rep: usize,
    pub guest: Histogram,
    pub host: Histogram,
    /// Wakeups the guest threads should have had (duration / interval x threads).
    pub guest_expected: u64,
    pub host_expected: u64,
    /// Fraction of the machine's CPU time that went to processes outside
    /// the bench while this ran (other jobs, hypervisor steal).
    #[serde(default)]
    pub foreign_cpu: f64,
    /// CPU time of the VM, the host load and the machine over this phase
    /// (None in raw.json files from before it was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuUse>,
    /// The host's interrupts per second over this phase (None in raw.json
    /// files from before they were measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupts: Option<crate::interrupts::Rates>,
    /// The host's IPIs per second over this phase by cause and sender
    /// (`ipi_sources`; None where tracefs could not be used, and in older
    /// raw.json files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipi_sources: Option<crate::ipi_sources::Sources>,
}

/// Everything measured in one (load, mode) session besides cyclictest.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SessionRun {
    pub rep: usize,
    pub audio: Option<AudioResult>,
    pub pingpong: Option<PingPongResult>,
    /// stress-ng throughput over the whole session (loaded only).
    pub load: Vec<StressorRate>,
    /// `pvschedctl status --json` at the end of a pvsched session.
    pub daemon_status: Option<Value>,
    /// pvsched sessions: the daemon's reaction-latency histogram at the end
    /// (host event timestamp -> `sched_setattr` returned), as its metrics
    /// give it: (bucket upper bound in seconds, cumulative count); the last,
    /// `+Inf`, as `None` (JSON has no infinity).
    #[serde(default)]
    pub reaction: Vec<(Option<f64>, u64)>,
    /// pvsched sessions: of those reactions, event -> the daemon's event
    /// thread awake (`pvsched_reaction_wakeup_seconds`), and each
    /// `sched_setattr` call (`pvsched_setattr_seconds`), in the same form.
    #[serde(default)]
    pub reaction_wakeup: Vec<(Option<f64>, u64)>,
    #[serde(default)]
    pub setattr: Vec<(Option<f64>, u64)>,
    /// pvsched sessions: the daemon's counters at the end (it starts with
    /// the session): event-thread wakeups by cause, doorbell rings, BPF
    /// records and lazy records; and how long it ran, seconds.
    #[serde(default)]
    pub daemon_counters: BTreeMap<String, f64>,
    #[serde(default)]
    pub daemon_seconds: f64,
}

/// (load, interval µs, mode) -> one entry per repeat.
pub type LatencyMap = BTreeMap<(Load, u32, Mode), Vec<LatencyRun>>;
/// (load, mode) -> one entry per repeat.
pub type SessionMap = BTreeMap<(Load, Mode), Vec<SessionRun>>;

/// The raw results of a run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Results {
    /// (load, interval µs, mode) -> one entry per repeat.
    #[serde(with = "latency_map")]
    pub latency: LatencyMap,
    /// (load, mode) -> one entry per repeat.
    #[serde(with = "session_map")]
    pub sessions: SessionMap,
}

/// Tuple keys as "load/interval/mode" strings in JSON.
mod latency_map {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(m: &LatencyMap, s: S) -> Result<S::Ok, S::Error> {
        let named: BTreeMap<String, &Vec<LatencyRun>> = m
            .iter()
            .map(|((l, i, md), v)| (format!("{l}/{i}/{md}"), v))
            .collect();
        named.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<LatencyMap, D::Error> {
        let named: BTreeMap<String, Vec<LatencyRun>> = BTreeMap::deserialize(d)?;
        let mut out = BTreeMap::new();
        for (k, v) in named {
            let parts: Vec<&str> = k.split('/').collect();
            let bad = || serde::de::Error::custom(format!("bad key {k:?}"));
            if parts.len() != 3 {
                return Err(bad());
            }
            let l = by_name(parts[0]).ok_or_else(bad)?;
            let i = parts[1].parse().map_err(|_| bad())?;
            let m = by_name(parts[2]).ok_or_else(bad)?;
            out.insert((l, i, m), v);
        }
        Ok(out)
    }
}

mod session_map {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(m: &SessionMap, s: S) -> Result<S::Ok, S::Error> {
        let named: BTreeMap<String, &Vec<SessionRun>> = m
            .iter()
            .map(|((l, md), v)| (format!("{l}/{md}"), v))
            .collect();
        named.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SessionMap, D::Error> {
        let named: BTreeMap<String, Vec<SessionRun>> = BTreeMap::deserialize(d)?;
        let mut out = BTreeMap::new();
        for (k, v) in named {
            let bad = || serde::de::Error::custom(format!("bad key {k:?}"));
            let (l, m) = k.split_once('/').ok_or_else(bad)?;
            out.insert(
                (by_name(l).ok_or_else(bad)?, by_name(m).ok_or_else(bad)?),
                v,
            );
        }
        Ok(out)
    }
}

/// Everything `--from-raw` needs to render the report again.
#[derive(Serialize, Deserialize)]
pub struct RawFile {
    pub meta: Meta,
    pub loads: Vec<Load>,
    pub intervals: Vec<u32>,
    pub modes: Vec<Mode>,
    pub results: Results,
    /// The guest module overhead phase (absent from older raw.json files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modcost: Option<ModCostRaw>,
    /// The same policy under KVM, simulated at the run's intervals (absent
    /// from older raw.json files, and from runs without the loaded host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated: Option<super::simulated::Simulated>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_round_trip_through_json() {
        // Arrange
        let mut r = Results::default();
        r.latency
            .entry((Load::Loaded, 1000, Mode::Pvsched))
            .or_default()
            .push(LatencyRun {
                rep: 1,
                guest_expected: 20000,
                ..Default::default()
            });
        r.sessions
            .entry((Load::Idle, Mode::Vanilla))
            .or_default()
            .push(SessionRun::default());

        // Act
        let text = serde_json::to_string(&r).unwrap();
        let back: Results = serde_json::from_str(&text).unwrap();

        // Assert
        assert!(text.contains("\"loaded/1000/pvsched\""));
        assert_eq!(
            back.latency[&(Load::Loaded, 1000, Mode::Pvsched)][0].guest_expected,
            20000
        );
        assert_eq!(back.sessions.len(), 1);
    }
}
