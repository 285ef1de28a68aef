//! The message-passing scenario's results and report (`--scenario
//! message-passing`): the guest idle modes compared, what one measurement
//! keeps, the parsers of what the guest and pvschedd print, and from those
//! the Markdown tables, the JSON and the targets.
//!
//! The targets (issue 13, guest idle driver): on the idle host, `hinted`
//! throughput >= 1.3x `default` with the guest polling at most the budget
//! (`--budget-permille`, 5 % of a vCPU by default); on the loaded host,
//! stress-ng's bogo-ops/s with `hinted` >= 95 % of `default`.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{BenchError, Result};
use crate::harness::axes::Load;
use crate::harness::figures::ratio;
use crate::harness::figures::Spread;
use crate::harness::meta::Meta;
use crate::host::StressorRate;

/// Smallest `hinted / default` throughput ratio the idle-host target allows.
pub const THROUGHPUT_TARGET: f64 = 1.3;
/// Smallest share of `default`'s host bogo-ops/s `hinted` may leave on the
/// loaded host.
pub const HOST_WORK_TARGET: f64 = 0.95;

/// The guest module's idle debugfs file.
pub const IDLE_FILE: &str = "/sys/kernel/debug/pvsched/idle";

/// prodcons: the producer's work per message, ns. Long enough that the
/// consumer (a few µs per message under TCG) keeps up and the queue is
/// mostly empty, so that messages find the consumer's vCPU idle: with none,
/// the producer fills the ring and the consumer drains it in batches of up to
/// 64 messages per wakeup, which hides the idle path (seen: one consumer wait
/// per ~60 messages). The report shows the consumer's waits per message.
pub const PRODCONS_WORK_NS: u64 = 5_000;

/// prodcons: the queue's capacity. One: a hand-off (the shape of a
/// synchronous queue), so each message waits for the consumer to take the
/// last and both sides' wakeups are on the throughput's path; with 64 and the
/// producer working 20 µs per message, the consumer kept up through every
/// idle mode and throughput measured the producer, not the idle path
/// (1.00x between the default idle and haltpoll, run of 2026-11-23).
pub const PRODCONS_QUEUE: u32 = 1;

/// How the guest idles: which `idle=` mode pvsched.ko is loaded with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdleCase {
    /// `idle=off`: the kernel's default idle (HLT).
    Default,
    /// `idle=haltpoll`: the stock guest haltpoll algorithm and defaults.
    Haltpoll,
    /// `idle=hinted`: pvsched's driver, polling from the host's hints.
    Hinted,
    /// `idle=fixed idle_poll_us=W`: the host advisor's window.
    Advisor,
    /// `idle=off` with KVM's halt polling off (`halt_poll_ns` 0): KVM only.
    KvmPollOff,
    /// `idle=off` with KVM's halt polling capped at the advisor's window
    /// (`pvschedctl idle --apply host`): KVM only.
    KvmPollAdvisor,
}

impl IdleCase {
    /// Every case, in report order.
    pub const ALL: [IdleCase; 6] = [
        IdleCase::Default,
        IdleCase::Haltpoll,
        IdleCase::Hinted,
        IdleCase::Advisor,
        IdleCase::KvmPollOff,
        IdleCase::KvmPollAdvisor,
    ];

    pub fn name(self) -> &'static str {
        match self {
            IdleCase::Default => "default",
            IdleCase::Haltpoll => "haltpoll",
            IdleCase::Hinted => "hinted",
            IdleCase::Advisor => "advisor",
            IdleCase::KvmPollOff => "kvm-poll-off",
            IdleCase::KvmPollAdvisor => "kvm-poll-advisor",
        }
    }

    /// The module's `idle=` mode, as its debugfs header names it too.
    pub fn driver_mode(self) -> &'static str {
        match self {
            IdleCase::Default => "off",
            IdleCase::Haltpoll => "haltpoll",
            IdleCase::Hinted => "hinted",
            IdleCase::Advisor => "fixed",
            IdleCase::KvmPollOff | IdleCase::KvmPollAdvisor => "off",
        }
    }

    /// Whether the case sets KVM's halt polling (the host's kvm module), and
    /// so needs a KVM guest on a host whose kvm parameters root may write.
    pub fn sets_kvm_polling(self) -> bool {
        matches!(self, IdleCase::KvmPollOff | IdleCase::KvmPollAdvisor)
    }

    /// pvsched.ko's parameters for this case; the advisor's needs its
    /// window (µs), without which there is none.
    pub fn insmod_params(self, window_us: Option<u32>) -> Option<String> {
        match self {
            IdleCase::Advisor => {
                window_us.map(|w| format!("idle={} idle_poll_us={w}", self.driver_mode()))
            }
            _ => Some(format!("idle={}", self.driver_mode())),
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            IdleCase::Default => "`idle=off`: no idle driver, the kernel's default idle (HLT)",
            IdleCase::Haltpoll => {
                "`idle=haltpoll`: the stock guest haltpoll algorithm and defaults (adaptive \
                 window up to 200 µs), no host information"
            }
            IdleCase::Hinted => {
                "`idle=hinted`: pvsched's driver: haltpoll's adaptive window, capped at 4x the \
                 host's measured wake-up p99, within the host's polling budget, and no polling \
                 while the host says it is overloaded"
            }
            IdleCase::Advisor => {
                "`idle=fixed idle_poll_us=W`: poll up to W, the window `pvschedctl idle` \
                 advised after the warm-up of that load, then halt"
            }
            IdleCase::KvmPollOff => {
                "`idle=off` and KVM's halt polling off (`halt_poll_ns` 0): every halt blocks \
                 the vCPU thread (KVM only; `default` is KVM's own polling)"
            }
            IdleCase::KvmPollAdvisor => {
                "`idle=off` and KVM's halt polling capped at the advisor's host-wide window \
                 (`pvschedctl idle --apply host` after that load's warm-up, put back after the \
                 session; KVM only)"
            }
        }
    }
}

impl fmt::Display for IdleCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for IdleCase {
    type Err = BenchError;
    fn from_str(s: &str) -> std::result::Result<Self, BenchError> {
        IdleCase::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| BenchError::Unknown {
                what: "message-passing case",
                given: s.to_string(),
                choices: "default, haltpoll, hinted, advisor, kvm-poll-off, kvm-poll-advisor",
            })
    }
}

/// The guest programs of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Pipe ping-pong between two vCPUs, no gap.
    Pingpong,
    /// The lock-protected producer/consumer queue.
    Prodcons,
}

impl Workload {
    pub const ALL: [Workload; 2] = [Workload::Pingpong, Workload::Prodcons];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Pingpong => "pingpong",
            Workload::Prodcons => "prodcons",
        }
    }

    /// What its throughput counts.
    pub fn unit(self) -> &'static str {
        match self {
            Workload::Pingpong => "round trips/s",
            Workload::Prodcons => "msgs/s",
        }
    }

    /// What its latency measures.
    pub fn latency(self) -> &'static str {
        match self {
            Workload::Pingpong => "round trip",
            Workload::Prodcons => "enqueue -> dequeue",
        }
    }

    /// The guest command for `secs` seconds, producer / sender on vCPU 0,
    /// consumer / echo on vCPU 1.
    pub fn command(self, secs: u64) -> String {
        match self {
            // -n 0: bounded by time only; -g 0: the next message at once.
            Workload::Pingpong => format!("pingpong -d {secs} -n 0 -g 0 -a 0 -b 1"),
            Workload::Prodcons => {
                format!("prodcons -d {secs} -q {PRODCONS_QUEUE} -w {PRODCONS_WORK_NS} -a 0 -b 1")
            }
        }
    }

    /// (count, per second, latency p50 µs, p99 µs) from the program's JSON line.
    pub fn figures(self, line: &Value) -> Result<(u64, f64, f64, f64)> {
        let what = self.name();
        let num = |k: &str| {
            line.get(k)
                .and_then(Value::as_f64)
                .ok_or_else(|| BenchError::Parse {
                    what: what.into(),
                    msg: format!("no number `{k}` in {line}"),
                })
        };
        let (count, rate, p50, p99) = match self {
            Workload::Pingpong => ("round_trips", "round_trips_per_s", "p50_us", "p99_us"),
            Workload::Prodcons => ("messages", "msgs_per_s", "latency_p50_us", "latency_p99_us"),
        };
        Ok((num(count)? as u64, num(rate)?, num(p50)?, num(p99)?))
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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
    fn add(&mut self, o: &IdleCounters) {
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

/// The advisor's polling window as the run took it, at the start of one
/// (repeat, load) block.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Advice {
    /// The window rounded up to whole µs (what `idle_poll_us` gets).
    pub window_us: u32,
    /// As the daemon said it.
    pub window_us_exact: f64,
    /// Halts the window catches over the warm-up (0..1), and the CPU it
    /// would poll (share of a core).
    pub hit_rate: f64,
    pub cpu_share: f64,
    /// Where it came from: the VM-wide advice (every vCPU's halts) or,
    /// from a daemon without it, the largest of the vCPUs' windows.
    pub source: String,
    /// Each vCPU's own advice, µs.
    pub per_vcpu_us: Vec<f64>,
}

/// The advice in `pvschedctl idle --json`'s reply (`report`) for the VM
/// `vm`: the VM-wide `host_advice` when the daemon gives one (asked for one
/// VM, it covers that VM's vCPUs), else the largest vCPU window, so that no
/// vCPU polls less than its own advice. None when nothing was measured.
pub fn parse_advice(report: &Value, vm: &str) -> Result<Option<Advice>> {
    let err = |msg: String| BenchError::Parse {
        what: "pvschedctl idle --json".into(),
        msg,
    };
    let outcome = |v: &Value| -> Option<(f64, f64, f64)> {
        Some((
            v.get("window_us")?.as_f64()?,
            v.get("hit_rate")?.as_f64()?,
            v.get("cpu_share")?.as_f64()?,
        ))
    };
    let vms = report
        .get("vms")
        .and_then(Value::as_array)
        .ok_or_else(|| err(format!("no `vms` list in {report}")))?;
    let this = vms
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(vm))
        .ok_or_else(|| err(format!("VM {vm:?} is not in the report")))?;
    let mut per_vcpu = Vec::new();
    for v in this
        .get("vcpus")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let halts: u64 = v
            .get("halts")
            .and_then(Value::as_array)
            .map(|b| b.iter().filter_map(|x| x.get(1)?.as_u64()).sum())
            .unwrap_or(0);
        let a = v
            .get("advice")
            .and_then(outcome)
            .ok_or_else(|| err(format!("a vCPU without `advice`: {v}")))?;
        if halts > 0 {
            per_vcpu.push(a);
        }
    }
    let (exact, hit_rate, cpu_share, source) = match report.get("host_advice").and_then(outcome) {
        Some((w, h, c)) => (w, h, c, "VM-wide advice (every vCPU's halts)"),
        None => match per_vcpu.iter().copied().max_by(|a, b| a.0.total_cmp(&b.0)) {
            Some((w, h, c)) => (w, h, c, "the largest vCPU window"),
            None => return Ok(None),
        },
    };
    if !(exact.is_finite() && (0.0..=u32::MAX as f64).contains(&exact)) {
        return Err(err(format!("window {exact} µs")));
    }
    Ok(Some(Advice {
        window_us: exact.ceil() as u32,
        window_us_exact: exact,
        hit_rate,
        cpu_share,
        source: source.into(),
        per_vcpu_us: per_vcpu.iter().map(|a| a.0).collect(),
    }))
}

/// `@@NAME rest` markers of a measurement's guest command: each section's
/// first-line rest and the lines up to the next marker.
pub fn sections(out: &str) -> BTreeMap<String, (String, String)> {
    let mut m: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in out.lines() {
        if let Some(rest) = line.trim().strip_prefix("@@") {
            let (name, arg) = rest.split_once(' ').unwrap_or((rest, ""));
            m.insert(name.to_string(), (arg.trim().to_string(), String::new()));
            current = Some(name.to_string());
        } else if let Some(body) = current.as_ref().and_then(|c| m.get_mut(c)) {
            body.1.push_str(line);
            body.1.push('\n');
        }
    }
    m
}

/// Seconds since boot from `/proc/uptime`'s text.
pub fn parse_uptime(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

/// The run time (ns) in `/proc/<pid>/task/<tid>/schedstat`'s text.
pub fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// One workload's run in one session.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Measurement {
    pub workload: Option<Workload>,
    /// Round trips or messages, and per second.
    pub count: u64,
    pub per_s: f64,
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
    /// The program's own JSON line.
    pub program: Value,
    /// Guest seconds between the two idle readings (`/proc/uptime`).
    pub guest_window_s: f64,
    /// Host seconds between the two CPU time samples.
    pub host_window_s: f64,
    /// Run time of each vCPU thread over the host window, seconds
    /// (`/proc/<qemu>/task/<tid>/schedstat`).
    pub vcpu_run_s: Vec<f64>,
    /// The idle driver's counters over the guest window (None: no idle file).
    pub idle: Option<IdleCounters>,
    pub guest_cpus: u32,
    /// Fraction of the machine that went to processes outside the bench.
    pub foreign_cpu: f64,
}

impl Measurement {
    /// Host CPU the vCPU threads burned, share of one core per vCPU.
    pub fn host_cpu_per_vcpu(&self) -> f64 {
        if self.host_window_s <= 0.0 || self.vcpu_run_s.is_empty() {
            return 0.0;
        }
        self.vcpu_run_s.iter().sum::<f64>() / self.host_window_s / self.vcpu_run_s.len() as f64
    }

    /// Time the guest spent polling, share of its vCPUs' time.
    pub fn poll_share(&self) -> Option<f64> {
        let idle = self.idle?;
        (self.guest_window_s > 0.0 && self.guest_cpus > 0)
            .then(|| idle.poll_ns as f64 / 1e9 / self.guest_window_s / f64::from(self.guest_cpus))
    }
}

/// One (repeat, load, case) session.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Session {
    pub rep: usize,
    pub load: Load,
    pub case: IdleCase,
    /// pvsched.ko's parameters.
    pub params: String,
    /// The idle driver's header as loaded (`mode=... registered=...`), or
    /// why there is none.
    pub driver: String,
    /// stress-ng over the session (loaded host).
    pub load_rates: Vec<StressorRate>,
    pub runs: Vec<Measurement>,
}

/// The start of one (repeat, load) block: pvschedd started afresh, the
/// warm-up in `default` mode, the advice taken after it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Block {
    pub rep: usize,
    pub load: Load,
    pub advice: Option<Advice>,
    /// `pvschedctl idle --json`'s reply after the warm-up.
    pub idle_report: Option<Value>,
    /// pvschedd's status at the end of the block.
    pub daemon_status: Option<Value>,
}

/// Facts about the run besides [`Meta`].
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MsgMeta {
    #[serde(flatten)]
    pub base: Meta,
    pub budget_permille: u32,
    /// Whether the guest module has the idle driver (its debugfs file).
    pub idle_driver: String,
    /// The guest commands, by workload.
    pub commands: BTreeMap<String, String>,
    /// What "host CPU" and "guest poll" mean in the tables.
    pub definitions: Vec<String>,
}

/// Everything `--from-raw` needs to render the report again.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MsgRaw {
    /// Always "message-passing": tells this file from the others' raw.json.
    pub scenario: String,
    pub meta: MsgMeta,
    pub loads: Vec<Load>,
    pub cases: Vec<IdleCase>,
    pub blocks: Vec<Block>,
    pub sessions: Vec<Session>,
}

fn geomean(v: &[f64]) -> Option<f64> {
    if v.is_empty() || v.iter().any(|x| *x <= 0.0 || !x.is_finite()) {
        return None;
    }
    Some((v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
}

/// One workload under one case, over the repeats.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CaseStats {
    pub repeats: usize,
    /// Round trips/s or msgs/s.
    pub throughput: Spread,
    /// Median throughput / `default`'s median throughput (same load).
    pub vs_default: Option<f64>,
    pub latency_p50_us: Spread,
    pub latency_p99_us: Spread,
    /// Host CPU of the vCPU threads, percent of one core per vCPU.
    pub host_cpu_pct: Spread,
    /// Guest polling time, percent of the vCPUs' time (None: no idle driver).
    pub guest_poll_pct: Option<Spread>,
    /// The idle driver's counters, summed over the repeats.
    pub counters: Option<IdleCounters>,
    /// prodcons: the times the consumer found the queue empty, per message
    /// (near 1: every message a wakeup; near 1/64: batches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_waits_per_msg: Option<Spread>,
}

/// stress-ng's bogo-ops/s under one case, over the repeats.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostWork {
    /// Median per stressor.
    pub ops_per_s: BTreeMap<String, f64>,
    /// Geometric mean over the stressors of (median / `default`'s median).
    pub vs_default: Option<f64>,
}

/// One load's results.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    pub load: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_cmd: Option<String>,
    /// The advisor's window per repeat, µs (None: no advice that repeat).
    pub advisor_window_us: Vec<Option<u32>>,
    /// workload -> case -> figures.
    pub workloads: BTreeMap<String, BTreeMap<String, CaseStats>>,
    /// case -> host throughput (loaded host).
    pub host_work: BTreeMap<String, HostWork>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MsgTarget {
    pub load: String,
    pub what: String,
    /// None: a case it needs did not run.
    pub value: Option<f64>,
    pub limit: f64,
    /// "x" (a ratio) or "%".
    pub unit: String,
    /// Whether the value must be at least (else at most) the limit.
    pub at_least: bool,
    pub met: Option<bool>,
}

impl MsgTarget {
    fn new(
        load: &str,
        what: String,
        value: Option<f64>,
        limit: f64,
        unit: &str,
        at_least: bool,
    ) -> Self {
        MsgTarget {
            load: load.to_string(),
            what,
            value,
            limit,
            unit: unit.to_string(),
            at_least,
            met: value.map(|v| {
                if at_least {
                    v >= limit - 1e-9
                } else {
                    v <= limit + 1e-9
                }
            }),
        }
    }

    pub fn verdict(&self) -> String {
        let v = |x: f64| {
            if self.unit == "x" {
                format!("{x:.2}x")
            } else {
                format!("{x:.1} %")
            }
        };
        let bound = if self.at_least { "at least" } else { "at most" };
        match (self.value, self.met) {
            (Some(x), Some(true)) => format!("met ({}, {bound} {})", v(x), v(self.limit)),
            (Some(x), _) => {
                let by = if self.unit == "x" {
                    format!("{:.0} %", ((x / self.limit) - 1.0).abs() * 100.0)
                } else {
                    format!("{:.1} points", (x - self.limit).abs())
                };
                format!("MISSED by {by} ({}, {bound} {})", v(x), v(self.limit))
            }
            (None, _) => "not measured (a case it compares did not run)".into(),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MsgReport {
    pub schema: String,
    pub meta: MsgMeta,
    pub loads: Vec<LoadReport>,
    pub targets: Vec<MsgTarget>,
    /// PNG files, relative to the output directory.
    pub plots: Vec<String>,
}

fn round(x: f64, places: i32) -> f64 {
    let k = 10f64.powi(places);
    (x * k).round() / k
}

fn case_stats(runs: &[&Measurement]) -> CaseStats {
    let f = |g: &dyn Fn(&Measurement) -> f64, places| {
        Spread::of(runs.iter().map(|m| round(g(m), places)).collect())
    };
    let polls: Vec<f64> = runs.iter().filter_map(|m| m.poll_share()).collect();
    let waits: Vec<f64> = runs
        .iter()
        .filter_map(|m| {
            let w = m.program.get("consumer_waits")?.as_f64()?;
            let n = m.program.get("messages")?.as_f64()?;
            (n > 0.0).then(|| round(w / n, 3))
        })
        .collect();
    let counters = runs.iter().filter_map(|m| m.idle).fold(None, |acc, c| {
        let mut t: IdleCounters = acc.unwrap_or_default();
        t.add(&c);
        Some(t)
    });
    CaseStats {
        repeats: runs.len(),
        throughput: f(&|m| m.per_s, 1),
        vs_default: None,
        latency_p50_us: f(&|m| m.latency_p50_us, 1),
        latency_p99_us: f(&|m| m.latency_p99_us, 1),
        host_cpu_pct: f(&|m| m.host_cpu_per_vcpu() * 100.0, 1),
        guest_poll_pct: (polls.len() == runs.len() && !polls.is_empty())
            .then(|| Spread::of(polls.iter().map(|p| round(p * 100.0, 2)).collect())),
        counters,
        empty_waits_per_msg: (waits.len() == runs.len() && !waits.is_empty())
            .then(|| Spread::of(waits)),
    }
}

fn host_work(sessions: &[&Session]) -> Option<HostWork> {
    let mut per: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for s in sessions {
        for r in &s.load_rates {
            per.entry(r.stressor.clone()).or_default().push(r.ops_per_s);
        }
    }
    (!per.is_empty()).then(|| HostWork {
        ops_per_s: per
            .into_iter()
            .map(|(k, v)| (k, round(Spread::of(v).median, 1)))
            .collect(),
        vs_default: None,
    })
}

/// The figures of one load.
pub fn load_report(raw: &MsgRaw, load: Load) -> LoadReport {
    let sessions = |c: IdleCase| -> Vec<&Session> {
        raw.sessions
            .iter()
            .filter(|s| s.load == load && s.case == c)
            .collect()
    };
    let mut lr = LoadReport {
        load: load.name().to_string(),
        load_cmd: (load == Load::Loaded).then(|| raw.meta.base.load_cmd.clone()),
        advisor_window_us: raw
            .blocks
            .iter()
            .filter(|b| b.load == load)
            .map(|b| b.advice.as_ref().map(|a| a.window_us))
            .collect(),
        ..Default::default()
    };
    for w in Workload::ALL {
        let mut by_case = BTreeMap::new();
        for &c in &raw.cases {
            let runs: Vec<&Measurement> = sessions(c)
                .into_iter()
                .flat_map(|s| s.runs.iter())
                .filter(|m| m.workload == Some(w))
                .collect();
            if !runs.is_empty() {
                by_case.insert(c.name().to_string(), case_stats(&runs));
            }
        }
        let base = by_case
            .get(IdleCase::Default.name())
            .map(|d| d.throughput.median);
        for st in by_case.values_mut() {
            st.vs_default = base
                .and_then(|b| ratio(st.throughput.median, b))
                .map(|r| round(r, 3));
        }
        if !by_case.is_empty() {
            lr.workloads.insert(w.name().to_string(), by_case);
        }
    }
    for &c in &raw.cases {
        if let Some(h) = host_work(&sessions(c)) {
            lr.host_work.insert(c.name().to_string(), h);
        }
    }
    let base = lr.host_work.get(IdleCase::Default.name()).cloned();
    for h in lr.host_work.values_mut() {
        h.vs_default = base.as_ref().and_then(|b| {
            let rel: Vec<f64> = h
                .ops_per_s
                .iter()
                .filter_map(|(k, v)| b.ops_per_s.get(k).and_then(|d| ratio(*v, *d)))
                .collect();
            (rel.len() == h.ops_per_s.len())
                .then(|| geomean(&rel))
                .flatten()
                .map(|g| round(g, 3))
        });
    }
    lr
}

/// The targets, for the loads that ran (a case missing: not measured).
pub fn targets(loads: &[LoadReport], budget_permille: u32) -> Vec<MsgTarget> {
    let hinted = IdleCase::Hinted.name();
    let budget_pct = f64::from(budget_permille) / 10.0;
    let mut out = Vec::new();
    for lr in loads {
        match lr.load.as_str() {
            "idle" => {
                for w in Workload::ALL {
                    let st = lr.workloads.get(w.name()).and_then(|m| m.get(hinted));
                    out.push(MsgTarget::new(
                        &lr.load,
                        format!(
                            "{w} throughput ({}): hinted >= {THROUGHPUT_TARGET} x default",
                            w.unit()
                        ),
                        st.and_then(|s| s.vs_default),
                        THROUGHPUT_TARGET,
                        "x",
                        true,
                    ));
                    out.push(MsgTarget::new(
                        &lr.load,
                        format!("{w}: hinted guest poll share <= budget ({budget_pct:.1} %)"),
                        st.and_then(|s| s.guest_poll_pct.as_ref()).map(|p| p.median),
                        budget_pct,
                        "%",
                        false,
                    ));
                }
            }
            "loaded" => out.push(MsgTarget::new(
                &lr.load,
                format!(
                    "host stress-ng bogo-ops/s: hinted >= {:.0} % of default",
                    HOST_WORK_TARGET * 100.0
                ),
                lr.host_work
                    .get(hinted)
                    .and_then(|h| h.vs_default)
                    .map(|r| round(r * 100.0, 1)),
                HOST_WORK_TARGET * 100.0,
                "%",
                true,
            )),
            _ => {}
        }
    }
    out
}

/// Builds the report (loads in run order).
pub fn build(raw: &MsgRaw) -> MsgReport {
    let loads: Vec<LoadReport> = raw.loads.iter().map(|&l| load_report(raw, l)).collect();
    MsgReport {
        schema: "pvsched-bench-msgpass/1".into(),
        meta: raw.meta.clone(),
        targets: targets(&loads, raw.meta.budget_permille),
        loads,
        plots: Vec::new(),
    }
}

/// `median [min-max]`, or the one value.
fn spread(s: &Spread, places: usize) -> String {
    if s.per_repeat.len() > 1 {
        format!("{:.p$} [{:.p$}-{:.p$}]", s.median, s.min, s.max, p = places)
    } else {
        format!("{:.p$}", s.median, p = places)
    }
}

fn opt_ratio(r: Option<f64>) -> String {
    r.map(|r| format!("{r:.2}x"))
        .unwrap_or_else(|| "n/a".into())
}

/// Cases in the canonical order.
fn ordered<T>(m: &BTreeMap<String, T>) -> Vec<(&'static str, &T)> {
    IdleCase::ALL
        .iter()
        .filter_map(|c| m.get(c.name()).map(|v| (c.name(), v)))
        .collect()
}

/// The Markdown report (also what the bench prints at the end).
pub fn markdown(r: &MsgReport) -> String {
    let mm = &r.meta;
    let m = &mm.base;
    let mut o = String::new();
    let _ = writeln!(o, "# pvsched bench, message passing: {}\n", m.started);
    let _ = writeln!(o, "Command: `{}`  ", m.command);
    let _ = writeln!(
        o,
        "Machine: {}, {} CPUs, {} GiB, kernel {}, {}  ",
        m.machine.cpu_model, m.machine.cpus, m.machine.memory_gib, m.machine.kernel, m.machine.os
    );
    let _ = writeln!(
        o,
        "Tools: {}; {}; pvsched {}  ",
        m.machine.qemu, m.machine.stress_ng, m.machine.git
    );
    let _ = writeln!(o, "Accelerator: {}  ", m.accel_reason);
    let _ = writeln!(
        o,
        "Guest: {} vCPUs, kernel {}, pvsched.ko {}; idle driver: {}  ",
        m.guest_cpus, m.guest_kernel, m.guest_module, mm.idle_driver
    );
    let _ = writeln!(
        o,
        "pvschedd serves the guest in every case (started afresh per repeat and load); {}  ",
        if m.pvschedd_settings.trim().is_empty() {
            "default configuration".to_string()
        } else {
            format!(
                "defaults plus `{}`",
                m.pvschedd_settings.trim().replace('\n', "; ")
            )
        }
    );
    let _ = writeln!(o, "Host load (\"loaded\"): `{}`  ", m.load_cmd);
    let _ = writeln!(
        o,
        "Polling budget: {:.1} % of a vCPU (`--budget-permille {}`)  ",
        f64::from(mm.budget_permille) / 10.0,
        mm.budget_permille
    );
    for (w, c) in &mm.commands {
        let _ = writeln!(o, "{w}: `{c}`  ");
    }
    let _ = writeln!(
        o,
        "Each case: {} repeats x {} s per workload, cases interleaved (rotated per repeat) \
         after a warm-up in `default` mode; medians over the repeats, [min-max]. Wall time \
         {:.1} min.\n",
        m.repeat,
        m.duration_s,
        m.wall_s / 60.0
    );
    let _ = writeln!(o, "Cases:");
    let cases: Vec<&str> = r
        .loads
        .iter()
        .flat_map(|l| l.workloads.values().flat_map(|c| c.keys()))
        .map(String::as_str)
        .collect();
    for c in IdleCase::ALL {
        if cases.contains(&c.name()) {
            let _ = writeln!(o, "- `{}`: {}", c.name(), c.describe());
        }
    }
    let _ = writeln!(o);
    for d in &mm.definitions {
        let _ = writeln!(o, "{d}  ");
    }
    let _ = writeln!(o);

    if !r.targets.is_empty() {
        let _ = writeln!(o, "## Targets\n");
        let _ = writeln!(o, "| load | target | result |");
        let _ = writeln!(o, "|---|---|---|");
        for t in &r.targets {
            let _ = writeln!(o, "| {} | {} | {} |", t.load, t.what, t.verdict());
        }
        let _ = writeln!(o);
    }

    for lr in &r.loads {
        let _ = writeln!(o, "## Host {}\n", lr.load);
        if let Some(cmd) = &lr.load_cmd {
            let _ = writeln!(o, "Load: `{cmd}`  ");
        }
        let _ = writeln!(
            o,
            "Advisor's window W per repeat: {}\n",
            lr.advisor_window_us
                .iter()
                .map(|w| w
                    .map(|w| format!("{w} µs"))
                    .unwrap_or_else(|| "none".into()))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for w in Workload::ALL {
            let Some(cases) = lr.workloads.get(w.name()) else {
                continue;
            };
            let _ = writeln!(o, "### {w} ({}, latency: {})\n", w.unit(), w.latency());
            let waits = cases.values().any(|c| c.empty_waits_per_msg.is_some());
            let _ = writeln!(
                o,
                "| mode | throughput | vs default | latency p50 µs | latency p99 µs | host CPU % per vCPU | guest poll % | polls | poll hits | poll timeouts | overload halts | halts |{}",
                if waits { " consumer waits per msg |" } else { "" }
            );
            let _ = writeln!(
                o,
                "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|{}",
                if waits { "--:|" } else { "" }
            );
            for (name, st) in ordered(cases) {
                let c = st.counters;
                let n = |f: fn(&IdleCounters) -> u64| {
                    c.as_ref()
                        .map(|c| f(c).to_string())
                        .unwrap_or_else(|| "-".into())
                };
                let _ = writeln!(
                    o,
                    "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |{}",
                    spread(&st.throughput, 0),
                    opt_ratio(st.vs_default),
                    spread(&st.latency_p50_us, 1),
                    spread(&st.latency_p99_us, 1),
                    spread(&st.host_cpu_pct, 1),
                    st.guest_poll_pct
                        .as_ref()
                        .map(|p| spread(p, 2))
                        .unwrap_or_else(|| "-".into()),
                    n(|c| c.polls),
                    n(|c| c.poll_hits),
                    n(|c| c.poll_timeouts),
                    n(|c| c.overload_halts),
                    n(|c| c.halts),
                    match (&st.empty_waits_per_msg, waits) {
                        (Some(w), _) => format!(" {} |", spread(w, 3)),
                        (None, true) => " - |".into(),
                        (None, false) => String::new(),
                    }
                );
            }
            let _ = writeln!(o);
        }
        if !lr.host_work.is_empty() {
            let stressors: Vec<&String> = lr
                .host_work
                .values()
                .flat_map(|h| h.ops_per_s.keys())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let _ = writeln!(
                o,
                "### The host's own work: stress-ng bogo-ops/s (median per stressor)\n"
            );
            let mut head = String::from("| mode |");
            let mut rule = String::from("|---|");
            for s in &stressors {
                let _ = write!(head, " {s} |");
                rule.push_str("--:|");
            }
            let _ = writeln!(o, "{head} vs default (geomean) |");
            let _ = writeln!(o, "{rule}--:|");
            for (name, h) in ordered(&lr.host_work) {
                let mut row = format!("| {name} |");
                for s in &stressors {
                    match h.ops_per_s.get(*s) {
                        Some(v) => {
                            let _ = write!(row, " {v:.1} |");
                        }
                        None => row.push_str(" - |"),
                    }
                }
                let _ = writeln!(o, "{row} {} |", opt_ratio(h.vs_default));
            }
            let _ = writeln!(o);
        }
    }

    if !m.notes.is_empty() {
        let _ = writeln!(o, "## Notes\n");
        for n in &m.notes {
            let _ = writeln!(o, "- {n}");
        }
        let _ = writeln!(o);
    }
    if !r.plots.is_empty() {
        let _ = writeln!(o, "## Plots\n");
        for p in &r.plots {
            let _ = writeln!(o, "![{p}]({p})");
        }
    }
    o
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

    #[test]
    fn prodcons_and_pingpong_lines_give_count_rate_and_latency() {
        // Arrange: what the programs print.
        let pc: Value = serde_json::from_str(
            "{\"messages\":120000,\"msgs_per_s\":24000.5,\"latency_p50_us\":21.50,\
             \"latency_p99_us\":180.25,\"latency_max_us\":900.0,\"consumer_waits\":100000,\
             \"producer_waits\":3,\"elapsed_s\":5.000}",
        )
        .unwrap();
        let pp: Value = serde_json::from_str(
            "{\"round_trips\":4367,\"avg_us\":74.4,\"p50_us\":39.6,\"p99_us\":1173.3,\
             \"max_us\":4689.8,\"elapsed_s\":5.001,\"round_trips_per_s\":873.2}",
        )
        .unwrap();

        // Act / Assert
        assert_eq!(
            Workload::Prodcons.figures(&pc).unwrap(),
            (120000, 24000.5, 21.5, 180.25)
        );
        assert_eq!(
            Workload::Pingpong.figures(&pp).unwrap(),
            (4367, 873.2, 39.6, 1173.3)
        );
        // pingpong from before it printed a rate.
        let old: Value =
            serde_json::from_str("{\"round_trips\":4367,\"p50_us\":1,\"p99_us\":2}").unwrap();
        let e = Workload::Pingpong.figures(&old).unwrap_err();
        assert!(e.to_string().contains("round_trips_per_s"), "{e}");
    }

    #[test]
    fn a_measurements_output_splits_at_its_markers() {
        let out = "@@IDLE0\nmode=off registered=0\n@@UP0 12.50 20.00\n@@PROG\n{\"a\":1}\n\
                   @@UP1 17.52 30.00\n@@IDLE1\n@@RC 0\n";
        let s = sections(out);
        assert_eq!(s["IDLE0"].1, "mode=off registered=0\n");
        assert_eq!(parse_uptime(&s["UP0"].0), Some(12.5));
        assert_eq!(parse_uptime(&s["UP1"].0), Some(17.52));
        assert_eq!(s["PROG"].1.trim(), "{\"a\":1}");
        assert_eq!(s["IDLE1"].1, "");
        assert_eq!(s["RC"].0, "0");
        assert_eq!(parse_schedstat("123456789 555 42\n"), Some(123456789));
        assert_eq!(parse_schedstat(""), None);
    }

    /// `pvschedctl idle --json` for VM `bench` with two vCPUs advising 14
    /// and 40 µs, and the VM-wide advice when given.
    fn idle_json(host_advice: Option<f64>) -> Value {
        let vcpu = |i: u32, w: f64, halts: u64| {
            serde_json::json!({
                "index": i, "observed_s": 10.0,
                "halts": [[12.0, halts], [2048.0, 3]], "wakes": [[30.0, 18]],
                "wake_p50_us": 30.0, "wake_p99_us": 30.0,
                "advice": {"window_us": w, "hit_rate": 0.8, "cpu_share": 0.01},
                "in_force": null
            })
        };
        let mut r = serde_json::json!({
            "budget_permille": 50, "kvm_halt_poll": null,
            "vms": [{"name": "bench", "accel": "tcg",
                     "vcpus": [vcpu(0, 14.0, 10), vcpu(1, 40.0, 20)]}]
        });
        if let Some(w) = host_advice {
            r["host_advice"] =
                serde_json::json!({"window_us": w, "hit_rate": 0.7, "cpu_share": 0.03});
        }
        r
    }

    #[test]
    fn the_advice_is_the_vm_wide_window_rounded_up() {
        // Act
        let a = parse_advice(&idle_json(Some(25.2)), "bench")
            .unwrap()
            .unwrap();

        // Assert
        assert_eq!(a.window_us, 26);
        assert_eq!(a.window_us_exact, 25.2);
        assert_eq!(a.hit_rate, 0.7);
        assert_eq!(a.per_vcpu_us, vec![14.0, 40.0]);
        assert!(a.source.starts_with("VM-wide"), "{}", a.source);
    }

    #[test]
    fn without_a_vm_wide_window_the_largest_vcpu_window_is_taken() {
        let a = parse_advice(&idle_json(None), "bench").unwrap().unwrap();
        assert_eq!(a.window_us, 40);
        assert!(a.source.contains("largest"), "{}", a.source);
    }

    #[test]
    fn no_halts_means_no_advice_and_an_unknown_vm_is_an_error() {
        let mut r = idle_json(None);
        for v in r["vms"][0]["vcpus"].as_array_mut().unwrap() {
            v["halts"] = serde_json::json!([]);
        }
        assert_eq!(parse_advice(&r, "bench").unwrap(), None);
        assert!(parse_advice(&idle_json(None), "other").is_err());
        assert!(parse_advice(&serde_json::json!({"x": 1}), "bench").is_err());
    }

    #[test]
    fn the_advice_parses_from_what_the_daemon_types_serialize() {
        // Arrange: the control crate's own types, as pvschedctl idle --json prints them.
        let report = pvsched_control::VmIdle {
            name: "bench".into(),
            accel: "tcg".into(),
            vcpus: vec![pvsched_control::VcpuIdle {
                index: 0,
                observed_s: 3.0,
                halts: vec![(12.0, 10)],
                wakes: vec![],
                wake_p50_us: 0.0,
                wake_p99_us: 0.0,
                polled_by_kvm: 0,
                advice: pvsched_control::PollOutcome {
                    window_us: 12.0,
                    hit_rate: 1.0,
                    cpu_share: 0.001,
                },
                in_force: None,
            }],
        };
        let json = serde_json::json!({ "vms": [serde_json::to_value(&report).unwrap()] });

        // Act
        let a = parse_advice(&json, "bench").unwrap().unwrap();

        // Assert
        assert_eq!(a.window_us, 12);
    }

    #[test]
    fn cases_name_their_module_parameters() {
        assert_eq!(
            IdleCase::Default.insmod_params(Some(30)).as_deref(),
            Some("idle=off")
        );
        assert_eq!(
            IdleCase::Advisor.insmod_params(Some(30)).as_deref(),
            Some("idle=fixed idle_poll_us=30")
        );
        assert_eq!(IdleCase::Advisor.insmod_params(None), None);
        for c in IdleCase::ALL {
            assert_eq!(c.name().parse::<IdleCase>().unwrap(), c);
            assert_eq!(serde_json::to_value(c).unwrap(), c.name());
        }
        assert!("fixed".parse::<IdleCase>().is_err());
    }

    // --- the report from hand-built numbers ---

    fn run(w: Workload, per_s: f64, poll_ns: u64, run_s: f64) -> Measurement {
        let count = (per_s * 5.0) as u64;
        Measurement {
            workload: Some(w),
            count,
            per_s,
            latency_p50_us: 1e6 / per_s / 2.0,
            latency_p99_us: 1e6 / per_s * 3.0,
            program: match w {
                Workload::Prodcons => {
                    serde_json::json!({"messages": count, "consumer_waits": count / 2})
                }
                Workload::Pingpong => Value::Null,
            },
            guest_window_s: 5.0,
            host_window_s: 5.0,
            vcpu_run_s: vec![run_s, run_s],
            idle: Some(IdleCounters {
                polls: 100,
                poll_hits: 80,
                poll_timeouts: 20,
                poll_ns,
                halts: 20,
                ..Default::default()
            }),
            guest_cpus: 2,
            foreign_cpu: 0.0,
        }
    }

    fn session(
        rep: usize,
        load: Load,
        case: IdleCase,
        rate: f64,
        poll_ns: u64,
        ops: f64,
    ) -> Session {
        Session {
            rep,
            load,
            case,
            params: case.insmod_params(Some(30)).unwrap_or_default(),
            driver: format!("mode={}", case.driver_mode()),
            load_rates: if load == Load::Loaded {
                vec![
                    StressorRate {
                        stressor: "cpu".into(),
                        ops_per_s: ops,
                        ..Default::default()
                    },
                    StressorRate {
                        stressor: "vm".into(),
                        ops_per_s: ops * 2.0,
                        ..Default::default()
                    },
                ]
            } else {
                vec![]
            },
            runs: vec![
                run(Workload::Pingpong, rate, poll_ns, 2.5),
                run(Workload::Prodcons, rate * 10.0, poll_ns, 4.0),
            ],
        }
    }

    /// Idle host: hinted at `gain` x default, polling `poll_ns` per 5 s x 2
    /// vCPUs; loaded host: hinted's stress-ng at `host` x default.
    fn raw(gain: f64, poll_ns: u64, host: f64) -> MsgRaw {
        let mut sessions = Vec::new();
        for rep in 1..=3 {
            let jitter = rep as f64 * 10.0;
            for load in [Load::Idle, Load::Loaded] {
                sessions.push(session(
                    rep,
                    load,
                    IdleCase::Default,
                    1000.0 + jitter,
                    0,
                    500.0,
                ));
                sessions.push(session(
                    rep,
                    load,
                    IdleCase::Hinted,
                    (1000.0 + jitter) * gain,
                    poll_ns,
                    500.0 * host,
                ));
            }
        }
        MsgRaw {
            scenario: "message-passing".into(),
            meta: MsgMeta {
                base: Meta {
                    repeat: 3,
                    duration_s: 5,
                    load_cmd: "stress-ng --cpu 2".into(),
                    ..Default::default()
                },
                budget_permille: 50,
                ..Default::default()
            },
            loads: vec![Load::Idle, Load::Loaded],
            cases: vec![IdleCase::Default, IdleCase::Hinted],
            blocks: (1..=3)
                .map(|rep| Block {
                    rep,
                    load: Load::Idle,
                    advice: Some(Advice {
                        window_us: 20 + rep as u32,
                        ..Default::default()
                    }),
                    idle_report: None,
                    daemon_status: None,
                })
                .collect(),
            sessions,
        }
    }

    #[test]
    fn medians_spreads_and_ratios_come_from_the_repeats() {
        // Act
        let r = build(&raw(1.5, 100_000_000, 1.0));

        // Assert
        let idle = &r.loads[0];
        let pp = &idle.workloads["pingpong"];
        assert_eq!(pp["default"].throughput.median, 1020.0);
        assert_eq!(pp["default"].throughput.min, 1010.0);
        assert_eq!(pp["default"].throughput.max, 1030.0);
        assert_eq!(pp["hinted"].vs_default, Some(1.5));
        // 2.5 s of 5 s on each vCPU.
        assert_eq!(pp["hinted"].host_cpu_pct.median, 50.0);
        // 0.1 s polled over 5 s x 2 vCPUs.
        assert_eq!(pp["hinted"].guest_poll_pct.as_ref().unwrap().median, 1.0);
        assert_eq!(pp["hinted"].counters.unwrap().polls, 300);
        assert_eq!(pp["hinted"].empty_waits_per_msg, None);
        let pc = &idle.workloads["prodcons"]["hinted"];
        assert_eq!(pc.empty_waits_per_msg.as_ref().unwrap().median, 0.5);
        assert_eq!(idle.advisor_window_us, vec![Some(21), Some(22), Some(23)]);
        assert!(idle.host_work.is_empty());
        let loaded = &r.loads[1];
        assert_eq!(loaded.host_work["default"].ops_per_s["vm"], 1000.0);
        assert_eq!(loaded.host_work["hinted"].vs_default, Some(1.0));
    }

    #[test]
    fn targets_are_met_when_hinted_gains_within_budget_and_spares_the_host() {
        // Act: 1.5x, 1 % polling, the host's work unchanged.
        let r = build(&raw(1.5, 100_000_000, 1.0));

        // Assert
        assert_eq!(r.targets.len(), 5);
        for t in &r.targets {
            assert_eq!(t.met, Some(true), "{} {}", t.what, t.verdict());
        }
        assert!(r.targets[0]
            .verdict()
            .starts_with("met (1.50x, at least 1.30x)"));
    }

    #[test]
    fn targets_missed_say_by_how_much() {
        // Act: 1.1x, 10 % polling (1 s of 10 vCPU-s), the host at 90 %.
        let r = build(&raw(1.1, 1_000_000_000, 0.9));

        // Assert
        let t = |what: &str| {
            r.targets
                .iter()
                .find(|t| t.what.contains(what))
                .unwrap_or_else(|| panic!("no target {what}"))
        };
        let thr = t("pingpong throughput");
        assert_eq!(thr.met, Some(false));
        assert!(
            thr.verdict().starts_with("MISSED by 15 %"),
            "{}",
            thr.verdict()
        );
        let poll = t("pingpong: hinted guest poll share");
        assert_eq!((poll.value, poll.met), (Some(10.0), Some(false)));
        assert!(
            poll.verdict().contains("MISSED by 5.0 points"),
            "{}",
            poll.verdict()
        );
        let host = t("bogo-ops");
        assert_eq!((host.value, host.met), (Some(90.0), Some(false)));
        assert!(
            host.verdict().contains("MISSED by 5.0 points"),
            "{}",
            host.verdict()
        );
    }

    #[test]
    fn targets_whose_cases_did_not_run_are_not_measured() {
        // Arrange: only default ran.
        let mut x = raw(1.5, 0, 1.0);
        x.sessions.retain(|s| s.case == IdleCase::Default);
        x.cases = vec![IdleCase::Default];

        // Act
        let r = build(&x);

        // Assert
        assert_eq!(r.targets.len(), 5);
        assert!(r.targets.iter().all(|t| t.met.is_none()));
        assert!(r.targets[0].verdict().starts_with("not measured"));
    }

    #[test]
    fn markdown_shows_each_mode_the_targets_and_the_hosts_work() {
        let md = markdown(&build(&raw(1.5, 100_000_000, 1.0)));
        for needle in [
            "## Targets",
            "| idle | pingpong throughput (round trips/s): hinted >= 1.3 x default | met",
            "## Host idle",
            "Advisor's window W per repeat: 21 µs, 22 µs, 23 µs",
            "### prodcons (msgs/s, latency: enqueue -> dequeue)",
            "| default | 1020 [1010-1030] | 1.00x |",
            "| overload halts | halts | consumer waits per msg |",
            " | 0.500 [0.500-0.500] |",
            "| hinted | 1530 [1515-1545] | 1.50x |",
            "| mode | cpu | vm | vs default (geomean) |",
            "| hinted | 500.0 | 1000.0 | 1.00x |",
        ] {
            assert!(md.contains(needle), "{needle:?} not in\n{md}");
        }
    }

    #[test]
    fn raw_round_trips_through_json() {
        // Arrange
        let r = raw(1.5, 10, 1.0);

        // Act
        let text = serde_json::to_string(&r).unwrap();
        let back: MsgRaw = serde_json::from_str(&text).unwrap();

        // Assert
        assert!(text.contains("\"case\":\"hinted\""));
        assert!(text.contains("\"workload\":\"prodcons\""));
        assert_eq!(back.sessions.len(), r.sessions.len());
        assert_eq!(back.sessions[1].runs[0].idle.unwrap().poll_ns, 10);
    }
}
