//! pvsched.ko's idle debugfs file (`/sys/kernel/debug/pvsched/idle`): the
//! guest idle driver's mode and its counters per CPU, as the message-passing
//! scenario and the standard scenario's host-cost figures read it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Result};

/// The guest module's idle debugfs file.
pub const IDLE_FILE: &str = "/sys/kernel/debug/pvsched/idle";

/// The idle driver's counters, summed over the CPUs (cumulative since the
/// module was loaded, or a difference of two readings).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdleCounters {
    pub polls: u64,
    pub poll_hits: u64,
    pub poll_timeouts: u64,
    pub poll_ns: u64,
    pub halts: u64,
    pub overload_halts: u64,
    pub unhinted_halts: u64,
}

impl IdleCounters {
    pub(crate) fn add(&mut self, o: &IdleCounters) {
        self.polls += o.polls;
        self.poll_hits += o.poll_hits;
        self.poll_timeouts += o.poll_timeouts;
        self.poll_ns += o.poll_ns;
        self.halts += o.halts;
        self.overload_halts += o.overload_halts;
        self.unhinted_halts += o.unhinted_halts;
    }

    /// `self - before`; None when a counter went back (the module was
    /// reloaded in between: the difference means nothing).
    pub fn since(&self, before: &IdleCounters) -> Option<IdleCounters> {
        Some(IdleCounters {
            polls: self.polls.checked_sub(before.polls)?,
            poll_hits: self.poll_hits.checked_sub(before.poll_hits)?,
            poll_timeouts: self.poll_timeouts.checked_sub(before.poll_timeouts)?,
            poll_ns: self.poll_ns.checked_sub(before.poll_ns)?,
            halts: self.halts.checked_sub(before.halts)?,
            overload_halts: self.overload_halts.checked_sub(before.overload_halts)?,
            unhinted_halts: self.unhinted_halts.checked_sub(before.unhinted_halts)?,
        })
    }
}

/// One CPU's line of the idle debugfs file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuIdle {
    pub cpu: u32,
    pub counters: IdleCounters,
    pub limit_ns: u64,
    pub wake_p50_ns: u64,
    pub wake_p99_ns: u64,
    pub overloaded: bool,
}

/// `/sys/kernel/debug/pvsched/idle`, parsed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IdleFile {
    /// The header line as the module wrote it.
    #[serde(default)]
    pub header_line: String,
    pub mode: String,
    pub registered: bool,
    pub driver: String,
    /// Every `key=value` of the header line.
    pub header: BTreeMap<String, String>,
    pub cpus: Vec<CpuIdle>,
}

impl IdleFile {
    /// The counters summed over the CPUs.
    pub fn total(&self) -> IdleCounters {
        let mut t = IdleCounters::default();
        for c in &self.cpus {
            t.add(&c.counters);
        }
        t
    }
}

fn key_values(line: &str) -> BTreeMap<&str, &str> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect()
}

/// Parses the idle debugfs file: a header line
/// `mode=hinted registered=1 driver=pvsched ...` then one line per CPU
/// `cpu0 polls=N poll_hits=N ...`. Keys it does not know are ignored; the
/// counters the report uses must be there.
pub fn parse_idle(text: &str) -> Result<IdleFile> {
    let err = |msg: String| BenchError::Parse {
        what: IDLE_FILE.into(),
        msg,
    };
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let head = lines.next().ok_or_else(|| err("empty".into()))?;
    let h = key_values(head);
    let mode = h
        .get("mode")
        .ok_or_else(|| err(format!("no mode= in the header {head:?}")))?
        .to_string();
    let mut file = IdleFile {
        header_line: head.to_string(),
        mode,
        registered: h.get("registered") == Some(&"1"),
        driver: h.get("driver").map(|s| s.to_string()).unwrap_or_default(),
        header: h
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        cpus: Vec::new(),
    };
    for line in lines {
        let Some(cpu) = line
            .split_whitespace()
            .next()
            .and_then(|w| w.strip_prefix("cpu"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            return Err(err(format!("not a CPU line: {line:?}")));
        };
        let kv = key_values(line);
        let num = |k: &str, required: bool| -> Result<u64> {
            match kv.get(k) {
                Some(v) => v
                    .parse()
                    .map_err(|_| err(format!("cpu{cpu}: {k}={v} is not a number"))),
                None if required => Err(err(format!("cpu{cpu}: no {k}= in {line:?}"))),
                None => Ok(0),
            }
        };
        file.cpus.push(CpuIdle {
            cpu,
            counters: IdleCounters {
                polls: num("polls", true)?,
                poll_hits: num("poll_hits", true)?,
                poll_timeouts: num("poll_timeouts", true)?,
                poll_ns: num("poll_ns", true)?,
                halts: num("halts", true)?,
                overload_halts: num("overload_halts", true)?,
                unhinted_halts: num("unhinted_halts", false)?,
            },
            limit_ns: num("limit_ns", false)?,
            wake_p50_ns: num("wake_p50_ns", false)?,
            wake_p99_ns: num("wake_p99_ns", false)?,
            overloaded: num("overloaded", false)? != 0,
        });
    }
    Ok(file)
}
