//! What the message-passing scenario measures and keeps in raw.json: the
//! guest idle cases and workloads, and per measurement the programs'
//! figures, the idle driver's counters and the vCPU threads' run time.

use std::collections::BTreeMap;
use std::fmt;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{BenchError, Result};
use crate::guest_idle::*;
use crate::harness::axes::Load;
use crate::harness::meta::Meta;
use crate::host::StressorRate;

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

/// `poll-1ms`'s window: the most pvsched.ko's `idle_poll_us` takes.
pub const POLL_1MS_US: u32 = 1000;

/// How the guest idles: which `idle=` mode pvsched.ko is loaded with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ValueEnum)]
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
    /// `idle=fixed idle_poll_us=1000`: the guest polls as long as the
    /// module lets it, so a wake-up mostly finds its vCPU running; against
    /// `kvm-poll-off`, what waking a halted vCPU costs.
    #[serde(rename = "poll-1ms")]
    #[value(name = "poll-1ms")]
    Poll1ms,
}

impl IdleCase {
    /// Every case, in report order.
    pub const ALL: [IdleCase; 7] = [
        IdleCase::Default,
        IdleCase::Haltpoll,
        IdleCase::Hinted,
        IdleCase::Advisor,
        IdleCase::KvmPollOff,
        IdleCase::KvmPollAdvisor,
        IdleCase::Poll1ms,
    ];

    pub fn name(self) -> &'static str {
        match self {
            IdleCase::Default => "default",
            IdleCase::Haltpoll => "haltpoll",
            IdleCase::Hinted => "hinted",
            IdleCase::Advisor => "advisor",
            IdleCase::KvmPollOff => "kvm-poll-off",
            IdleCase::KvmPollAdvisor => "kvm-poll-advisor",
            IdleCase::Poll1ms => "poll-1ms",
        }
    }

    /// The module's `idle=` mode, as its debugfs header names it too.
    pub fn driver_mode(self) -> &'static str {
        match self {
            IdleCase::Default => "off",
            IdleCase::Haltpoll => "haltpoll",
            IdleCase::Hinted => "hinted",
            IdleCase::Advisor | IdleCase::Poll1ms => "fixed",
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
            IdleCase::Poll1ms => Some(format!(
                "idle={} idle_poll_us={POLL_1MS_US}",
                self.driver_mode()
            )),
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
            IdleCase::Poll1ms => {
                "`idle=fixed idle_poll_us=1000`: the guest polls up to 1 ms (the module's \
                 most) before it halts, so a wake-up mostly finds its vCPU running, with no \
                 halt exit and no host wake-up (poll hits): against `kvm-poll-off`, what \
                 waking a halted vCPU costs"
            }
        }
    }
}

impl fmt::Display for IdleCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The guest programs of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ValueEnum)]
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
