//! What a run measures: modes, loads, and the raw results they collect.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::BenchError;
use crate::guest::{AudioResult, PingPongResult};
use crate::host::StressorRate;
use crate::share::CpuUse;
use crate::stats::Histogram;

/// How the host treats the vCPU threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Mode {
    /// SCHED_OTHER, as QEMU starts them.
    Vanilla,
    /// Every vCPU thread SCHED_RR 8 (chrt -r 8, libvirt `<vcpusched>`).
    StaticRt,
    /// pvschedd running with its default policy.
    Pvsched,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Vanilla, Mode::StaticRt, Mode::Pvsched];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Vanilla => "vanilla",
            Mode::StaticRt => "static-rt",
            Mode::Pvsched => "pvsched",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| BenchError::Unknown {
                what: "mode",
                given: s.to_string(),
                choices: "vanilla, static-rt, pvsched",
            })
    }
}

/// What else runs on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Load {
    Idle,
    /// stress-ng as in the published setup, scaled to the cores.
    Loaded,
}

impl Load {
    pub fn name(self) -> &'static str {
        match self {
            Load::Idle => "idle",
            Load::Loaded => "loaded",
        }
    }
}

impl fmt::Display for Load {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Load {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        match s {
            "idle" => Ok(Load::Idle),
            "loaded" => Ok(Load::Loaded),
            _ => Err(BenchError::Unknown {
                what: "load",
                given: s.to_string(),
                choices: "idle, loaded",
            }),
        }
    }
}

/// Order of the modes in repeat `rep` under load number `load_idx`: rotated,
/// so that over the repeats every mode takes every position (first after the
/// load starts, last...) equally often and drift favours none.
pub fn mode_order<T: Copy>(modes: &[T], rep: usize, load_idx: usize) -> Vec<T> {
    if modes.is_empty() {
        return Vec::new();
    }
    let k = (rep + load_idx) % modes.len();
    modes[k..].iter().chain(&modes[..k]).copied().collect()
}

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

/// The daemon counters a session keeps (`SessionRun::daemon_counters`):
/// (key, Prometheus sample name).
pub const DAEMON_COUNTERS: [(&str, &str); 6] = [
    (
        "wakeups_records",
        "pvsched_wakeups_total{cause=\"records\"}",
    ),
    ("wakeups_timer", "pvsched_wakeups_total{cause=\"timer\"}"),
    (
        "wakeups_doorbell",
        "pvsched_wakeups_total{cause=\"doorbell\"}",
    ),
    ("doorbell_rings", "pvsched_doorbell_rings_total"),
    ("bpf_records", "pvsched_bpf_records"),
    ("bpf_lazy_records", "pvsched_bpf_lazy_records"),
];

/// The [`DAEMON_COUNTERS`] present in pvschedd's Prometheus text `text`, by key.
pub fn daemon_counters(text: &str) -> BTreeMap<String, f64> {
    DAEMON_COUNTERS
        .iter()
        .filter_map(|(key, name)| Some((key.to_string(), prometheus_value(text, name)?)))
        .collect()
}

/// The value of the sample `name` (with its labels, as printed) in the
/// Prometheus text `text`.
pub fn prometheus_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.strip_prefix(name))
        .find_map(|rest| rest.strip_prefix(' ')?.trim().parse().ok())
}

/// The cumulative buckets of the Prometheus histogram `name` in `text`
/// (`NAME_bucket{le="X"} N` lines), in order, `+Inf` (`None`) last; empty if
/// absent.
pub fn prometheus_buckets(text: &str, name: &str) -> Vec<(Option<f64>, u64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut out: Vec<(Option<f64>, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .filter_map(|rest| {
            let (le, count) = rest.split_once("\"}")?;
            let le = match le {
                "+Inf" => None,
                v => Some(v.parse().ok()?),
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    out.sort_by(|a, b| {
        a.0.unwrap_or(f64::INFINITY)
            .total_cmp(&b.0.unwrap_or(f64::INFINITY))
    });
    out
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
            let l = parts[0].parse().map_err(|_| bad())?;
            let i = parts[1].parse().map_err(|_| bad())?;
            let m = parts[2].parse().map_err(|_| bad())?;
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
                (l.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?),
                v,
            );
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_order_rotates_so_each_mode_leads_once_per_cycle() {
        let m = Mode::ALL;
        let firsts: Vec<Mode> = (0..3).map(|r| mode_order(&m, r, 0)[0]).collect();
        assert_eq!(firsts, vec![Mode::Vanilla, Mode::StaticRt, Mode::Pvsched]);
        assert_eq!(
            mode_order(&m, 1, 1),
            vec![Mode::Pvsched, Mode::Vanilla, Mode::StaticRt]
        );
    }

    #[test]
    fn names_round_trip() {
        for m in Mode::ALL {
            assert_eq!(m.name().parse::<Mode>().unwrap(), m);
        }
        assert_eq!("loaded".parse::<Load>().unwrap(), Load::Loaded);
        assert!("busy".parse::<Load>().is_err());
    }

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
