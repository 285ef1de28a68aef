//! Where the host's IPIs come from over a measured phase: the kernel's
//! `ipi:ipi_send_cpu` and `ipi:ipi_send_cpumask` tracepoints, recorded in a
//! tracefs instance of the bench's own (so nobody else's tracing is touched),
//! classified by the kernel function that sent the IPI (its `callsite`: a
//! wakeup preempting the target CPU's task, an RT task pushed to another
//! CPU, a queued remote wakeup, `sched_setattr` on a running thread) and by
//! the task current on the sending CPU (QEMU's main loop, a vCPU thread,
//! pvschedd, the host's cyclictest, stress-ng).
//!
//! `/proc/interrupts` (`interrupts.rs`) counts what arrives; this says why.
//! Each event costs the kernel a ring-buffer write (well under a µs), the
//! same in every mode.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Why an IPI was sent, from its callsite.
pub fn cause(callsite: &str) -> &'static str {
    match callsite {
        "wakeup_preempt" | "check_preempt_curr" | "resched_curr" | "__resched_curr" => {
            "wakeup preempts"
        }
        "push_rt_task" | "push_rt_tasks" | "tell_cpu_to_push" | "rto_push_irq_work_func" => {
            "RT push"
        }
        "ttwu_queue_wakelist" | "__ttwu_queue_wakelist" | "__smp_call_single_queue" => {
            "remote wakeup"
        }
        "__sched_setscheduler" => "sched_setattr",
        _ => "other",
    }
}

/// Who was current on the sending CPU, by thread name. In interrupt context
/// that is whoever was interrupted.
pub fn sender(comm: &str) -> &'static str {
    if comm.starts_with("qemu-system") {
        "QEMU main loop"
    } else if comm.starts_with("CPU ") && (comm.ends_with("/TCG") || comm.ends_with("/KVM")) {
        "vCPU"
    } else if comm == "pvschedd" {
        "pvschedd"
    } else if comm == "cyclictest" {
        "host cyclictest"
    } else if comm.starts_with("stress-ng") {
        "stress-ng"
    } else {
        "other"
    }
}

/// The map key of a (cause, sender) pair.
pub fn key(cause: &str, sender: &str) -> String {
    format!("{cause} | {sender}")
}

/// What a tracefs `trace` text holds: counts per [`key`], the callsites of
/// the IPIs whose cause is "other" (by function), and the events the buffer
/// lost (entries written but not in the buffer).
#[derive(Debug, Default)]
pub struct Parsed {
    pub counts: BTreeMap<String, u64>,
    pub other_callsites: BTreeMap<String, u64>,
    pub lost: u64,
}

/// The frames of a kernel stack recorded with an event (`options/stacktrace`)
/// that say an RT task is being pushed: on the 7.x kernels `push_rt_task`
/// sends its IPI from `wakeup_preempt`, whose callsite alone reads as a
/// wakeup preemption. Without stacks ([`STACKS_ENV`] unset) such a push is
/// counted as a wakeup preemption (the reports' text predates this, and
/// committed reports must render again identically).
const RT_PUSH_FRAMES: [&str; 2] = ["push_rt_task", "push_rt_tasks"];

/// An IPI read from its event line, counted once the stack that may follow
/// it is read too.
struct Pending {
    why: &'static str,
    func: String,
    sender: &'static str,
    rt_push: bool,
}

fn count(p: Pending, counts: &mut BTreeMap<String, u64>, other: &mut BTreeMap<String, u64>) {
    let why = if p.rt_push { "RT push" } else { p.why };
    if why == "other" {
        *other.entry(p.func).or_insert(0) += 1;
    }
    *counts.entry(key(why, p.sender)).or_insert(0) += 1;
}

/// See [`Parsed`].
pub fn parse(text: &str) -> Parsed {
    let mut counts = BTreeMap::new();
    let mut other_callsites = BTreeMap::new();
    let mut lost = 0;
    let mut pending: Option<Pending> = None;
    for line in text.lines() {
        // A frame of the stack of the event above (" => func+0x1/0x2").
        if let Some(frame) = line.trim_start().strip_prefix("=> ") {
            if let Some(p) = pending.as_mut() {
                let func = frame.split('+').next().unwrap_or(frame);
                p.rt_push |= RT_PUSH_FRAMES.contains(&func);
            }
            continue;
        }
        if line.ends_with("<stack trace>") {
            continue;
        }
        if let Some(p) = pending.take() {
            count(p, &mut counts, &mut other_callsites);
        }
        if let Some(rest) = line.strip_prefix("# entries-in-buffer/entries-written: ") {
            let nums: Vec<u64> = rest
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|n| n.parse().ok())
                .collect();
            if let [kept, written, ..] = nums[..] {
                lost = written.saturating_sub(kept);
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        // Both ipi_send_cpu and ipi_send_cpumask.
        let Some(ev) = line.find(": ipi_send_cpu") else {
            continue;
        };
        // "<comm>-<pid> [<cpu>] <flags> <ts>: ipi_send_cpu...": the comm may
        // hold spaces and dashes; the pid is after its last dash before " [".
        let head = &line[..ev];
        let Some(bracket) = head.find(" [") else {
            continue;
        };
        let task = head[..bracket].trim();
        let comm = task.rsplit_once('-').map_or(task, |(c, _)| c);
        let Some(cs) = line[ev..]
            .split_whitespace()
            .find_map(|w| w.strip_prefix("callsite="))
        else {
            continue;
        };
        let func = cs.split('+').next().unwrap_or(cs);
        pending = Some(Pending {
            why: cause(func),
            func: func.to_string(),
            sender: sender(comm),
            rt_push: false,
        });
    }
    if let Some(p) = pending.take() {
        count(p, &mut counts, &mut other_callsites);
    }
    Parsed {
        counts,
        other_callsites,
        lost,
    }
}

/// IPIs per second by [`key`] over one phase, and how many the buffer lost.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sources {
    pub per_s: BTreeMap<String, f64>,
    pub lost: u64,
    /// The "other" IPIs per second by the function that sent them (runs
    /// recorded before it was kept have none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub other_callsites: BTreeMap<String, f64>,
}

impl Sources {
    /// Sum of the rates whose key starts with `cause`.
    pub fn cause_total(&self, cause: &str) -> f64 {
        self.per_s
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{cause} | ")))
            .map(|(_, v)| v)
            .sum::<f64>()
            // An empty float sum is -0.0, printed "-0".
            + 0.0
    }

    /// The rate of one (cause, sender) pair.
    pub fn get(&self, cause: &str, sender: &str) -> f64 {
        self.per_s.get(&key(cause, sender)).copied().unwrap_or(0.0)
    }

    pub fn total(&self) -> f64 {
        self.per_s.values().sum()
    }
}

/// The mean rate of each key over `runs` (a key missing from a run counts 0).
pub fn mean(runs: &[&Sources]) -> Option<Sources> {
    if runs.is_empty() {
        return None;
    }
    let n = runs.len() as f64;
    let mut out = Sources::default();
    for r in runs {
        for (k, v) in &r.per_s {
            *out.per_s.entry(k.clone()).or_insert(0.0) += v / n;
        }
        for (k, v) in &r.other_callsites {
            *out.other_callsites.entry(k.clone()).or_insert(0.0) += v / n;
        }
        out.lost += r.lost;
    }
    Some(out)
}

/// A tracefs instance recording the IPI tracepoints; removed when dropped.
pub struct Trace {
    dir: PathBuf,
    started: Instant,
    keep: Option<PathBuf>,
}

/// Set (to anything) in the bench's environment, each phase's IPI trace is
/// recorded with the kernel stack of every IPI and kept beside the phase's
/// raw files: to find where IPIs come from (a developer's aid; the traces
/// are large).
pub const STACKS_ENV: &str = "PVSCHED_BENCH_IPI_STACKS";

fn tracefs() -> Option<PathBuf> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("instances").is_dir() && p.join("events/ipi/ipi_send_cpu").is_dir())
}

fn write(dir: &Path, file: &str, value: &str) -> std::io::Result<()> {
    std::fs::write(dir.join(file), value)
}

impl Trace {
    /// Starts recording; None where tracefs, its instances or the IPI
    /// tracepoints are missing, or without the rights to use them. With
    /// [`STACKS_ENV`] set, the trace is kept at `keep` with stacks.
    pub fn start(keep: PathBuf) -> Option<Self> {
        let keep = std::env::var_os(STACKS_ENV).map(|_| keep);
        let dir = tracefs()?
            .join("instances")
            .join(format!("pvsched-bench-{}", std::process::id()));
        if dir.exists() {
            let _ = std::fs::remove_dir(&dir);
        }
        std::fs::create_dir(&dir).ok()?;
        let mut t = Trace {
            dir,
            started: Instant::now(),
            keep,
        };
        let stacks = if t.keep.is_some() { "1" } else { "0" };
        let ok = write(&t.dir, "tracing_on", "0")
            .and_then(|_| write(&t.dir, "buffer_size_kb", "8192"))
            .and_then(|_| write(&t.dir, "options/stacktrace", stacks))
            .and_then(|_| write(&t.dir, "events/ipi/ipi_send_cpu/enable", "1"))
            .and_then(|_| {
                // Older kernels have only ipi_send_cpu's predecessor events.
                let mask = t.dir.join("events/ipi/ipi_send_cpumask/enable");
                if mask.exists() {
                    std::fs::write(mask, "1")
                } else {
                    Ok(())
                }
            })
            .and_then(|_| write(&t.dir, "tracing_on", "1"));
        ok.ok()?;
        t.started = Instant::now();
        Some(t)
    }

    /// Stops recording and returns the rates (the instance is removed).
    pub fn finish(self) -> Option<Sources> {
        let seconds = self.started.elapsed().as_secs_f64();
        write(&self.dir, "tracing_on", "0").ok()?;
        let text = std::fs::read_to_string(self.dir.join("trace")).ok()?;
        if let Some(keep) = &self.keep {
            if let Err(e) = std::fs::write(keep, &text) {
                eprintln!("warning: keeping the IPI trace at {}: {e}", keep.display());
            }
        }
        let parsed = parse(&text);
        let rates = |m: BTreeMap<String, u64>| {
            m.into_iter()
                .map(|(k, v)| (k, v as f64 / seconds))
                .collect()
        };
        (seconds > 0.0).then(|| Sources {
            per_s: rates(parsed.counts),
            lost: parsed.lost,
            other_callsites: rates(parsed.other_callsites),
        })
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        let _ = write(&self.dir, "tracing_on", "0");
        let _ = write(&self.dir, "events/ipi/enable", "0");
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "\
# tracer: nop
#
# entries-in-buffer/entries-written: 6/8   #P:2
#
  stress-ng-fork-7502    [001] dNs5. 14752.930752: ipi_send_cpu: cpu=0 callsite=wakeup_preempt+0x92/0xa0 callback=0x0
  qemu-system-x86-1330    [000] d..2. 14752.930800: ipi_send_cpu: cpu=1 callsite=wakeup_preempt+0x92/0xa0 callback=0x0
  CPU 1/TCG-1335    [000] d..2. 14752.930900: ipi_send_cpu: cpu=1 callsite=wakeup_preempt+0x92/0xa0 callback=0x0
  cyclictest-901    [001] d..2. 14752.931000: ipi_send_cpu: cpu=0 callsite=push_rt_task+0x1c5/0x260 callback=0x0
  pvschedd-88      [000] d..2. 14752.931100: ipi_send_cpu: cpu=1 callsite=__sched_setscheduler+0x7a0/0x9b0 callback=0x0
  <idle>-0       [000] d.h2. 14752.931200: ipi_send_cpumask: cpumask=0-1 callsite=on_each_cpu_cond_mask+0x20/0x40 callback=do_sync_core+0x0/0x30
";

    #[test]
    fn each_ipi_is_counted_by_its_callsite_and_the_task_that_sent_it() {
        let Parsed {
            counts: c,
            other_callsites,
            lost,
        } = parse(TRACE);
        assert_eq!(lost, 2);
        assert_eq!(c[&key("wakeup preempts", "stress-ng")], 1);
        assert_eq!(c[&key("wakeup preempts", "QEMU main loop")], 1);
        assert_eq!(c[&key("wakeup preempts", "vCPU")], 1);
        assert_eq!(c[&key("RT push", "host cyclictest")], 1);
        assert_eq!(c[&key("sched_setattr", "pvschedd")], 1);
        // The ipi_send_cpumask line (the sync after text patching).
        assert_eq!(c[&key("other", "other")], 1);
        assert_eq!(c.values().sum::<u64>(), 6);
        // Of the "other" ones, the sending function is kept.
        assert_eq!(
            other_callsites.into_iter().collect::<Vec<_>>(),
            vec![("on_each_cpu_cond_mask".to_string(), 1)]
        );
    }

    #[test]
    fn a_wakeup_preempt_callsite_under_push_rt_task_is_an_rt_push() {
        // As the 7.3 kernel records them with options/stacktrace.
        let text = "\
  cyclictest-309  [001] d..2. 1.0: ipi_send_cpu: cpu=0 callsite=wakeup_preempt+0x92/0xa0 callback=0x0
  cyclictest-309  [001] d..2. 1.0: <stack trace>
 => trace_event_raw_event_ipi_send_cpu+0x6a/0xa0
 => __resched_curr+0x9c/0x120
 => wakeup_preempt+0x92/0xa0
 => push_rt_task+0x1c5/0x260
 => push_rt_tasks+0x15/0x30
  stress-ng-cpu-77 [000] dNs5. 1.1: ipi_send_cpu: cpu=1 callsite=wakeup_preempt+0x92/0xa0 callback=0x0
  stress-ng-cpu-77 [000] dNs5. 1.1: <stack trace>
 => __resched_curr+0x9c/0x120
 => wakeup_preempt+0x92/0xa0
 => ttwu_do_activate+0x80/0x1f0
";
        let c = parse(text).counts;
        assert_eq!(c[&key("RT push", "host cyclictest")], 1);
        assert_eq!(c[&key("wakeup preempts", "stress-ng")], 1);
        assert_eq!(c.values().sum::<u64>(), 2);
    }

    #[test]
    fn ipi_send_cpumask_lines_are_counted_too() {
        let text = "  <idle>-0 [000] d.h2. 1.0: ipi_send_cpumask: cpumask=0-1 callsite=smp_call_function_many_cond+0x1/0x2 callback=x\n";
        let c = parse(text).counts;
        assert_eq!(c[&key("other", "other")], 1);
    }

    #[test]
    fn means_count_a_missing_key_as_zero() {
        let a = Sources {
            per_s: [(key("RT push", "pvschedd"), 10.0)].into_iter().collect(),
            lost: 1,
            other_callsites: [("kick_cpus_irq_workfn".to_string(), 4.0)]
                .into_iter()
                .collect(),
        };
        let b = Sources::default();
        let m = mean(&[&a, &b]).unwrap();
        assert_eq!(m.get("RT push", "pvschedd"), 5.0);
        assert_eq!(m.cause_total("RT push"), 5.0);
        assert_eq!(m.lost, 1);
        assert_eq!(m.other_callsites["kick_cpus_irq_workfn"], 2.0);
    }
}
