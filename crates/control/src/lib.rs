//! The control protocol between pvschedctl and pvschedd: one JSON request
//! line, one JSON response line, over the daemon's Unix socket.
//! The types live here so that clients need neither the daemon nor libbpf.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use pvsched_base::sched::ThreadParams;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    Status,
    Metrics,
    /// A run-time tunable, for one VM or (vm = None) the defaults and every VM.
    Set {
        vm: Option<String>,
        key: String,
        value: String,
    },
    /// Records host events and decisions for `seconds`, then returns them.
    Record {
        seconds: f64,
    },
    /// Look for VMs now, not at the next discovery round (a libvirt hook:
    /// a domain started or stopped). `reason` is logged.
    Rescan {
        reason: String,
    },
    /// Idle transitions measured per vCPU, and the halt-polling window the
    /// advisor recommends within `budget_permille` of a core per vCPU.
    Idle {
        vm: Option<String>,
        budget_permille: u32,
    },
    /// Acts on the advisor (`Idle` with the same arguments reports what it would do):
    /// sets, or puts back, the host's halt polling. Answered with `Response::Idle`,
    /// whose `applied` says what changed.
    IdleApply {
        vm: Option<String>,
        budget_permille: u32,
        target: ApplyTarget,
    },
}

/// Where `IdleApply` acts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApplyTarget {
    /// The kvm module's `halt_poll_ns` (every KVM VM on the host): the advisor's
    /// window over the halts of every vCPU served (or of `vm`'s). pvschedd puts the
    /// values it found back when it stops, or after a crash at its next start.
    Host,
    /// One VM's own cap (`KVM_CAP_HALT_POLL` on the VM's file descriptor), where its
    /// VMM offers a way to set it.
    Vm,
    /// Put back the kvm module parameters found before the first `host`.
    Restore,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    Status(Box<Status>),
    Metrics { text: String },
    Ok { message: String },
    Record(Recording),
    Idle(IdleReport),
    Error { message: String },
}

/// `pvschedctl idle`: per VM and vCPU, the measured halt -> wake and
/// wake -> running distributions, the advisor's polling window and what it
/// and the window in force would have done over the same halts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IdleReport {
    pub budget_permille: u32,
    /// The host's kvm module halt-polling parameters, if the module is loaded.
    pub kvm_halt_poll: Option<HaltPollParams>,
    /// The advisor over the halts of every vCPU reported, for the host-wide cap.
    #[serde(default)]
    pub host_advice: Option<PollOutcome>,
    /// What an `IdleApply` changed.
    #[serde(default)]
    pub applied: Option<Applied>,
    pub vms: Vec<VmIdle>,
}

pub use pvsched_base::kvm_params::HaltPoll as HaltPollParams;

/// The kvm module parameters before and after an `IdleApply`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub target: ApplyTarget,
    pub before: HaltPollParams,
    pub after: HaltPollParams,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmIdle {
    pub name: String,
    pub accel: String,
    pub vcpus: Vec<VcpuIdle>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VcpuIdle {
    pub index: u32,
    /// Seconds the distributions cover.
    pub observed_s: f64,
    /// Halt -> wake intervals: (bucket upper bound µs, count), non-empty buckets.
    pub halts: Vec<(f64, u64)>,
    /// Wake -> running latencies, the same way.
    pub wakes: Vec<(f64, u64)>,
    pub wake_p50_us: f64,
    pub wake_p99_us: f64,
    /// Of the halts, those KVM's own halt polling caught (the thread never
    /// blocked): known from `kvm_vcpu_wakeup`, so 0 under TCG.
    #[serde(default)]
    pub polled_by_kvm: u64,
    /// The advisor's window and its price over the measured halts.
    pub advice: PollOutcome,
    /// The polling window in force (the kvm module's cap; none under TCG),
    /// priced the same way.
    pub in_force: Option<PollOutcome>,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PollOutcome {
    pub window_us: f64,
    /// Halts the window catches, 0..=1.
    pub hit_rate: f64,
    /// CPU spent polling, share of one core.
    pub cpu_share: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub pid: u32,
    pub uptime_s: f64,
    pub event_source: String,
    pub dropped_events: u64,
    /// Which mechanism carries boosts (`daemon.backend`).
    #[serde(default)]
    pub backend: BackendStatus,
    pub vms: Vec<VmStatus>,
}

/// The backend: configured, running, and the sched_ext scheduler's counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BackendStatus {
    /// `auto`, `sched_ext` or `rt`, as configured.
    pub configured: String,
    /// `sched_ext` or `rt`: the one serving now.
    pub active: String,
    /// Why rt serves although sched_ext was wanted: `auto` found none, or
    /// the kernel ended the scheduler (its reason).
    pub note: Option<String>,
    /// Times the kernel ended the scheduler while serving.
    pub fallbacks: u64,
    /// The scheduler's counters (sched_ext active), as of the last scan:
    /// enqueues, boosted enqueues that preempted a task / went to the boost
    /// queue, slice-end extensions granted / refused over the allowance.
    pub enqueues: u64,
    pub boost_preempts: u64,
    pub boost_queued: u64,
    pub extensions: u64,
    pub extensions_refused: u64,
    /// Of `extensions`, those for a lock holder (its guest showed a lock
    /// held, or a waiter's published wait named the vCPU).
    #[serde(default)]
    pub lock_extensions: u64,
    /// Of `lock_extensions`, those at a preemption a boosted vCPU deferred.
    #[serde(default)]
    pub lock_extensions_at_preemption: u64,
    /// vCPUs preempted while their guest showed a sleeping lock held
    /// (`CS_LOCK`, lock holders honoured), as the scheduler saw them: at a
    /// slice end after an extension in that slice, at a slice end without
    /// one (none due, or refused), and before the slice end (a boosted
    /// vCPU, a kick, a higher scheduling class).
    #[serde(default)]
    pub holder_preempted_extended: u64,
    #[serde(default)]
    pub holder_preempted_unextended: u64,
    #[serde(default)]
    pub holder_preempted_early: u64,
    /// Extensions ended early, at a poll that found the guest out of its
    /// critical section (`scx_extension_poll_us`): the vCPU preempted at a
    /// lock-free point instead of at the extension's end.
    #[serde(default)]
    pub extensions_ended_early: u64,
    /// The extension poll's slot reads, and its timers that failed to start.
    #[serde(default)]
    pub extension_polls: u64,
    #[serde(default)]
    pub extension_poll_errors: u64,
    /// Extensions that ran out with the guest still holding a lock and went
    /// on for a tail (`scx_extension_tail_us`), and of those, the tails
    /// ended at a lock-free point.
    #[serde(default)]
    pub extension_tails: u64,
    #[serde(default)]
    pub extension_tails_ended_early: u64,
    /// A vCPU's slice ends that earned an extension or a tail with nothing
    /// waiting for its CPU: none granted, it runs on anyway.
    #[serde(default)]
    pub slice_ends_uncontended: u64,
    /// Preemptions of a lock-handling VM's vCPU decided where its slot
    /// could not be read (another CPU, the daemon's grant), left to that
    /// vCPU's CPU, which reads it before it lets the vCPU go; and the
    /// holders those CPUs (and the boost queue's and wakeups' kicks) found
    /// in their lock and kept for an extension.
    #[serde(default)]
    pub preemptions_checked: u64,
    #[serde(default)]
    pub holders_kept_at_dispatch: u64,
    /// Holders preempted in their lock for pvschedd's event thread before
    /// their slice end that ran again right after it, on their CPU, for
    /// the rest of their slice.
    #[serde(default)]
    pub holders_resumed: u64,
    /// Extensions a lock holder's guest ended itself, yielding at a point
    /// out of its locks (`F_EXT_NOTICE`), and yields that came with no
    /// extension running (late, or a stale notice).
    #[serde(default)]
    pub extension_yields: u64,
    #[serde(default)]
    pub yields_unextended: u64,
    /// Extension notices written to guests' slots (shown or cleared), and
    /// writes that failed.
    #[serde(default)]
    pub notices_written: u64,
    #[serde(default)]
    pub notice_writes_failed: u64,
    /// Woken vCPUs sent to a CPU without another vCPU of their VM
    /// (`scx_spread_vm_vcpus`).
    #[serde(default)]
    pub vcpus_spread: u64,
    /// Wakeups of pvschedd's event thread sent to the waker's CPU, where
    /// the scheduler reads the running guest's lock flag at once, away from
    /// one that ran a vCPU of a lock-handling VM.
    #[serde(default)]
    pub daemon_moved: u64,
    /// Boosts granted to a vCPU waiting in the vtime queue, which was then
    /// moved ahead at once.
    #[serde(default)]
    pub boost_moved: u64,
    /// Enqueues the scheduler boosted by its own decision (guest RT work
    /// shown, or a wakeup within the halt window), within the policy's terms.
    #[serde(default)]
    pub kernel_boosts: u64,
    /// Woken fair-class tasks that preempted a task running with a later
    /// virtual time (`scx_wakeup_preempt_us`).
    #[serde(default)]
    pub wakeup_preempts: u64,
    /// vCPUs the scheduler stopped boosting for a while after a long burst
    /// of its own boosts (the policy's `max_boost_ns`, `throttle_ns`).
    #[serde(default)]
    pub kernel_throttles: u64,
    /// Fair-class tasks a CPU took from another CPU's queue (the others
    /// run where they ran last).
    #[serde(default)]
    pub fair_pulls: u64,
    /// The scheduling decision's own latency on the sched_ext backend: vCPU
    /// threads queued (woken or enqueued) to running, boosted and not, from
    /// the program's timestamps: how many, and the median and 99th
    /// percentile as the upper bound of their log2 bucket, µs.
    #[serde(default)]
    pub queued_to_run_boosted: DelaySummary,
    #[serde(default)]
    pub queued_to_run_other: DelaySummary,
}

/// A delay distribution kept in log2 buckets: count, p50 and p99 (upper
/// bounds of their buckets), µs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DelaySummary {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
}

impl DelaySummary {
    /// From log2 buckets of ns (bucket i: [2^i, 2^(i+1)) ns).
    pub fn of_log2_buckets(buckets: &[u64]) -> Self {
        let count: u64 = buckets.iter().sum();
        let at = |q: f64| {
            let want = (count as f64 * q).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (i, n) in buckets.iter().enumerate() {
                seen += n;
                if seen >= want {
                    return (1u64 << (i + 1).min(63)) as f64 / 1000.0;
                }
            }
            0.0
        };
        if count == 0 {
            return Self::default();
        }
        Self {
            count,
            p50_us: at(0.5),
            p99_us: at(0.99),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmStatus {
    pub name: String,
    pub tgid: i32,
    pub accel: String,
    pub region: String,
    pub generation: u64,
    pub guest_bound: bool,
    /// The guest rings a doorbell when it clears a boost's reason (its
    /// boosted vCPUs need no recheck timer); false: they are re-read on it.
    #[serde(default)]
    pub doorbell: bool,
    /// The VM's boost budget is latched: it spent its budget and gets no boost until
    /// `debt_ms` is earned back.
    pub in_debt: bool,
    /// Boost budget to earn back before the latch clears, ms (0 when not latched).
    pub debt_ms: f64,
    pub boosts: u64,
    pub throttles: u64,
    pub clamped_inputs: u64,
    pub boosted_s: f64,
    /// Boost budget left, ms of vCPU time (0 while latched).
    #[serde(default)]
    pub budget_ms: f64,
    /// One window's boost budget, ms of vCPU time (all vCPUs).
    #[serde(default)]
    pub budget_max_ms: f64,
    /// Critical-section budget left, ms, summed over the vCPUs.
    #[serde(default)]
    pub cs_budget_ms: f64,
    /// Critical-section debt, ms, summed over the vCPUs.
    #[serde(default)]
    pub cs_debt_ms: f64,
    /// vCPUs whose critical-section budget is latched.
    #[serde(default)]
    pub cs_latched_vcpus: u32,
    /// Wanted boosts refused (or ended) for want of budget.
    #[serde(default)]
    pub over_budget: u64,
    /// Lock waits and the extensions given to lock holders.
    #[serde(default)]
    pub locks: LockStatus,
    /// `boosted_s` split by the reason of the boost in force, ms, by reason
    /// name (kinds with no boosted time left out): where the boost budget went.
    #[serde(default)]
    pub boosted_ms_by_reason: BTreeMap<String, f64>,
    /// Of `boosted_s`, ms of demoted vCPUs (charged `demoted_charge` times).
    #[serde(default)]
    pub demoted_ms: f64,
    /// Times the boost budget latched, and ms it stayed latched.
    #[serde(default)]
    pub budget_latches: u64,
    #[serde(default)]
    pub budget_latched_ms: f64,
    pub vcpus: Vec<VcpuStatus>,
    pub latency_path: Vec<ThreadStatus>,
}

/// A VM's lock waits, as its guest counted them (`F_LOCK_WAIT` counters,
/// summed over its slots as last read), and the extensions pvschedd gave
/// the vCPUs of lock holders, with the fairness debt they left.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LockStatus {
    /// Lock contentions the guest saw whose holder ran on another vCPU or
    /// was unknown (guest counter).
    pub contentions: u64,
    /// Of those, the ones whose holder's vCPU the host half showed preempted
    /// (guest counter).
    pub holder_preempted: u64,
    /// Extensions granted: a preempted holder's vCPU boosted for at most
    /// `lock_extension_ns`.
    pub extensions: u64,
    /// Of them, those granted when the host preempted a vCPU a wait already
    /// named; the rest began with a wait seen after the preemption.
    #[serde(default)]
    pub extensions_at_preemption: u64,
    /// Extensions refused: the VM's lock debt had reached `lock_debt_max_ns`.
    pub extensions_refused: u64,
    /// Extensions whose holder ran again before the extension ended.
    pub preemptions_avoided: u64,
    /// On-CPU time the extensions gave, ms.
    pub extended_ms: f64,
    /// Of it, repaid so far, ms.
    pub repaid_ms: f64,
    /// Not yet repaid, ms.
    pub debt_ms: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VcpuStatus {
    pub index: u32,
    pub tid: i32,
    pub params: ThreadParams,
    pub reason: String,
    pub throttled: bool,
    pub host_status: String,
    pub guest_policy: u32,
    pub guest_rt_priority: u32,
    pub guest_cs_flags: u32,
    pub boosts: u64,
    pub throttles: u64,
    pub boosted_ms: f64,
    /// Critical-section budget left, ms (0 while latched).
    #[serde(default)]
    pub cs_budget_ms: f64,
    /// Critical-section budget to earn back before its latch clears, ms.
    #[serde(default)]
    pub cs_debt_ms: f64,
    /// Critical-section boosts of this vCPU are refused until `cs_debt_ms` is repaid.
    #[serde(default)]
    pub cs_latched: bool,
    /// sched_ext backend: slice-end extensions the scheduler granted this
    /// vCPU, their total time, and those refused over its allowance.
    #[serde(default)]
    pub scx_extensions: u64,
    #[serde(default)]
    pub scx_extended_ms: f64,
    #[serde(default)]
    pub scx_extensions_refused: u64,
    /// Of `scx_extensions`, those for a lock holder: its guest showed a
    /// sleeping lock held (`CS_LOCK`), or another vCPU of the VM published
    /// a lock wait naming this one.
    #[serde(default)]
    pub scx_lock_extensions: u64,
    /// Of `scx_lock_extensions`, those at a preemption: a boosted vCPU
    /// would have preempted this one while its guest showed a lock held,
    /// and waited for the extension instead.
    #[serde(default)]
    pub scx_lock_extensions_at_preemption: u64,
    /// sched_ext backend: preemptions of this vCPU while its guest showed a
    /// sleeping lock held, by how (`BackendStatus::holder_preempted_*`).
    #[serde(default)]
    pub scx_holder_preempted_extended: u64,
    #[serde(default)]
    pub scx_holder_preempted_unextended: u64,
    #[serde(default)]
    pub scx_holder_preempted_early: u64,
    /// sched_ext backend: this vCPU's extensions ended early, at a
    /// lock-free point (`BackendStatus::extensions_ended_early`).
    #[serde(default)]
    pub scx_extensions_ended_early: u64,
    /// sched_ext backend: this vCPU's extension tails, and those ended at a
    /// lock-free point (`BackendStatus::extension_tails`).
    #[serde(default)]
    pub scx_extension_tails: u64,
    #[serde(default)]
    pub scx_extension_tails_ended_early: u64,
    /// sched_ext backend: of `scx_holder_preempted_early`, by what took the
    /// CPU, indexed by the scheduler's `enum pvs_scx_cut` (0: none of its
    /// own, a higher class or the kernel; 1: a boosted vCPU; 2: the boost
    /// queue's kick; 3: pvschedd's event thread; 4: a boost granted to a
    /// queued vCPU; 5: the extension's poll; 6: a wakeup preemption; 7: its
    /// guest's yield out of its locks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scx_holder_preempted_early_by: Vec<u64>,
    /// sched_ext backend: of this vCPU's preemptions in its lock for
    /// pvschedd's event thread, those after which it ran again right after
    /// the daemon (`BackendStatus::holders_resumed`).
    #[serde(default)]
    pub scx_holders_resumed: u64,
    /// sched_ext backend: extensions this vCPU's guest ended itself by
    /// yielding out of its locks (`BackendStatus::extension_yields`).
    #[serde(default)]
    pub scx_extension_yields: u64,
    /// sched_ext backend: how long this vCPU waited to run again after
    /// those preemptions in its lock, ms, by how they came (after an
    /// extension, at a slice end without one, before the slice end).
    #[serde(default)]
    pub scx_holder_preempted_extended_ms: f64,
    #[serde(default)]
    pub scx_holder_preempted_unextended_ms: f64,
    #[serde(default)]
    pub scx_holder_preempted_early_ms: f64,
    /// sched_ext backend: boosted enqueues that preempted a task.
    #[serde(default)]
    pub scx_boost_preempts: u64,
    /// sched_ext backend: enqueues the scheduler boosted by its own
    /// decision, and the boosted time they took (charged to the budget).
    #[serde(default)]
    pub scx_kernel_boosts: u64,
    #[serde(default)]
    pub kernel_boosted_ms: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThreadStatus {
    pub tid: i32,
    pub params: ThreadParams,
}

/// What `pvschedctl record` gets back: thread names and a time-ordered list.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Recording {
    pub start_ns: u64,
    pub end_ns: u64,
    pub tracks: Vec<TrackInfo>,
    pub records: Vec<TraceRecord>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrackInfo {
    pub vm: String,
    pub tgid: i32,
    pub vcpu: u32,
    pub tid: i32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceKind {
    /// The vCPU thread got a CPU.
    Running,
    /// Switched out while runnable.
    Preempted,
    /// Switched out blocked: the guest halted.
    Halted,
    /// Woken (runnable, not yet running).
    Woken,
    /// Params changed to RT.
    Boost,
    /// Params changed back to non-RT.
    Unboost,
    /// Boost refused by the throttle.
    Throttle,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceRecord {
    pub ts_ns: u64,
    pub tid: i32,
    pub kind: TraceKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("{path}: {op}: {source} (is pvschedd running?)")]
    Io {
        path: String,
        op: &'static str,
        source: std::io::Error,
    },
    #[error("{path}: bad response: {msg}")]
    Protocol { path: String, msg: String },
}

/// Sends one request and waits for its response.
pub fn call(socket: &Path, request: &Request, timeout: Duration) -> Result<Response, ControlError> {
    let path = socket.display().to_string();
    let io = |op, e| ControlError::Io {
        path: path.clone(),
        op,
        source: e,
    };
    let mut stream = UnixStream::connect(socket).map_err(|e| io("connect", e))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| io("timeout", e))?;
    let mut line =
        serde_json::to_string(request).map_err(|e| io("encode", std::io::Error::other(e)))?;
    line.push('\n');
    stream
        .write_all(line.as_bytes())
        .map_err(|e| io("write", e))?;
    let mut reply = String::new();
    BufReader::new(stream)
        .read_line(&mut reply)
        .map_err(|e| io("read", e))?;
    serde_json::from_str(&reply).map_err(|e| ControlError::Protocol {
        path,
        msg: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_travel_as_one_json_line_tagged_by_cmd() {
        let req = Request::Set {
            vm: Some("audio".into()),
            key: "max_rt_priority".into(),
            value: "3".into(),
        };
        let line = serde_json::to_string(&req).unwrap();

        assert!(
            line.contains("\"cmd\":\"set\"") && !line.contains('\n'),
            "{line}"
        );
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), req);
    }

    #[test]
    fn replies_round_trip_with_thread_params() {
        let resp = Response::Status(Box::new(Status {
            pid: 1,
            uptime_s: 2.0,
            event_source: "bpf".into(),
            dropped_events: 0,
            backend: BackendStatus::default(),
            vms: vec![],
        }));
        let line = serde_json::to_string(&resp).unwrap();

        assert_eq!(serde_json::from_str::<Response>(&line).unwrap(), resp);
        let p: ThreadParams =
            serde_json::from_str(r#"{"policy":2,"priority":3,"nice":0}"#).unwrap();
        assert_eq!(p, ThreadParams::rr(3));
    }

    #[test]
    fn a_status_from_a_daemon_without_budget_fields_still_parses() {
        let vcpu = r#"{"index":0,"tid":10,"params":{"policy":0,"priority":0,"nice":0},
            "reason":"none","throttled":false,"host_status":"running","guest_policy":0,
            "guest_rt_priority":0,"guest_cs_flags":0,"boosts":0,"throttles":0,"boosted_ms":0.0}"#;
        let vm = format!(
            r#"{{"name":"a","tgid":1,"accel":"kvm","region":"/r","generation":1,
            "guest_bound":true,"in_debt":false,"debt_ms":0.0,"boosts":0,"throttles":0,
            "clamped_inputs":0,"boosted_s":0.0,"vcpus":[{vcpu}],"latency_path":[]}}"#
        );

        let parsed: VmStatus = serde_json::from_str(&vm).unwrap();

        assert_eq!(parsed.cs_latched_vcpus, 0);
        assert!(!parsed.vcpus[0].cs_latched);
    }
}

#[cfg(test)]
mod delay_summary_tests {
    use super::DelaySummary;

    #[test]
    fn percentiles_are_the_upper_bounds_of_their_log2_buckets() {
        let mut b = vec![0u64; 40];
        b[10] = 98; // [1024, 2048) ns
        b[20] = 2; // [1.05, 2.1) ms
        let s = DelaySummary::of_log2_buckets(&b);
        assert_eq!(s.count, 100);
        assert_eq!(s.p50_us, 2.048);
        assert_eq!(s.p99_us, 2097.152);
        assert_eq!(
            DelaySummary::of_log2_buckets(&[0; 40]),
            DelaySummary::default()
        );
    }
}
