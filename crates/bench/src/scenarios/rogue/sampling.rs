//! What the host samples over a rogue scenario window: the QEMU processes'
//! CPU ticks (their shares of the machine) and the scheduling parameters
//! of their threads.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pvsched_base::sched::get_params;

use super::model::*;
use crate::foreign;

/// CPU ticks of both QEMU processes at one moment.
#[derive(Clone, Copy)]
pub(super) struct Ticks {
    pub(super) rogue: u64,
    pub(super) neighbour: u64,
    pub(super) at: Instant,
}

pub(super) fn ticks(rogue: u32, neighbour: u32) -> Ticks {
    Ticks {
        rogue: foreign::process_ticks(rogue).unwrap_or(0),
        neighbour: foreign::process_ticks(neighbour).unwrap_or(0),
        at: Instant::now(),
    }
}

/// utime + stime of the threads `tids` of process `pid`, in clock ticks
/// (threads gone count 0).
pub(super) fn task_ticks(pid: u32, tids: &[i32]) -> u64 {
    tids.iter()
        .filter_map(|t| std::fs::read_to_string(format!("/proc/{pid}/task/{t}/stat")).ok())
        .filter_map(|text| foreign::parse_utime_stime(&text))
        .sum()
}

/// How often the host's scheduling parameters of the watched threads are read.
const WATCH_EVERY: Duration = Duration::from_millis(10);

/// SCHED_FIFO priority of the thread that samples CPU times and parameters:
/// above pvschedd's boosts (2..4) and its event thread (5), below the
/// cyclictests (8). At SCHED_OTHER it ran mostly while no boosted vCPU
/// held the CPUs, and so undercounted the boosts (seen: 3-22 % RT samples
/// while pvschedd counted ~85 % boosted time).
pub(super) const SAMPLER_PRIORITY: u32 = 6;

/// `sched_getattr` of every thread of `groups` every [`WATCH_EVERY`] until
/// `until`.
pub(super) fn watch_params(
    groups: &[(&str, Vec<i32>)],
    until: Instant,
) -> BTreeMap<String, ParamsSeen> {
    let mut seen: BTreeMap<String, ParamsSeen> = BTreeMap::new();
    loop {
        for (g, tids) in groups {
            let e = seen.entry(g.to_string()).or_default();
            for &tid in tids {
                if let Ok(p) = get_params(tid) {
                    e.samples += 1;
                    if p.is_rt() {
                        e.rt += 1;
                        *e.rt_by_params.entry(p.to_string()).or_default() += 1;
                    }
                }
            }
        }
        let now = Instant::now();
        if now >= until {
            return seen;
        }
        std::thread::sleep(WATCH_EVERY.min(until - now));
    }
}

/// Share of the machine (0..1) of `b - a` ticks over `secs` on `cpus` CPUs.
pub fn share_of(a: u64, b: u64, secs: f64, cpus: usize) -> f64 {
    let wall = secs * cpus.max(1) as f64 * foreign::ticks_per_second() as f64;
    if wall <= 0.0 {
        return 0.0;
    }
    b.saturating_sub(a) as f64 / wall
}
