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

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: &str = "mode=hinted registered=1 driver=pvsched poll_max_us=200 fixed_poll_us=0\n\
        cpu0 polls=10 poll_hits=7 poll_timeouts=3 poll_ns=5000 halts=4 overload_halts=1 \
        unhinted_halts=0 limit_ns=60000 wake_p50_ns=20000 wake_p99_ns=60000 overloaded=0\n\
        cpu1 polls=20 poll_hits=15 poll_timeouts=5 poll_ns=7000 halts=6 overload_halts=2 \
        unhinted_halts=1 limit_ns=60000 wake_p50_ns=20000 wake_p99_ns=60000 overloaded=1\n";

    #[test]
    fn the_idle_file_parses_into_a_header_and_one_line_per_cpu() {
        // Act
        let f = parse_idle(IDLE).unwrap();

        // Assert
        assert_eq!(f.mode, "hinted");
        assert!(f
            .header_line
            .starts_with("mode=hinted registered=1 driver=pvsched"));
        assert!(f.registered);
        assert_eq!(f.driver, "pvsched");
        assert_eq!(f.header["poll_max_us"], "200");
        assert_eq!(f.cpus.len(), 2);
        assert!(f.cpus[1].overloaded && !f.cpus[0].overloaded);
        assert_eq!(f.cpus[0].wake_p99_ns, 60000);
        let t = f.total();
        assert_eq!(
            (t.polls, t.poll_hits, t.poll_timeouts, t.poll_ns),
            (30, 22, 8, 12000)
        );
        assert_eq!((t.halts, t.overload_halts, t.unhinted_halts), (10, 3, 1));
    }

    #[test]
    fn an_idle_file_without_a_counter_or_with_garbage_is_an_error() {
        assert!(parse_idle("").is_err());
        assert!(parse_idle("registered=1\n").is_err(), "no mode");
        let no_polls = "mode=off registered=0\ncpu0 poll_hits=1 poll_timeouts=0 poll_ns=0 \
                        halts=1 overload_halts=0\n";
        let e = parse_idle(no_polls).unwrap_err();
        assert!(e.to_string().contains("no polls="), "{e}");
        assert!(parse_idle("mode=off\nnot a cpu line\n").is_err());
        let bad = IDLE.replace("polls=10", "polls=ten");
        assert!(parse_idle(&bad).is_err());
        // A header alone (no CPUs) is a file with no counters.
        let f = parse_idle("mode=off registered=0 driver=none\n").unwrap();
        assert!(!f.registered && f.cpus.is_empty());
    }

    #[test]
    fn counters_since_a_reading_are_differences_and_none_after_a_reload() {
        let a = parse_idle(IDLE).unwrap().total();
        let later = IdleCounters {
            polls: a.polls + 5,
            poll_ns: a.poll_ns + 1000,
            ..a
        };
        let d = later.since(&a).unwrap();
        assert_eq!((d.polls, d.poll_ns, d.halts), (5, 1000, 0));
        assert_eq!(IdleCounters::default().since(&a), None);
    }
}
