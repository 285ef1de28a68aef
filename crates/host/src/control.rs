//! The control socket: its server thread (one JSON request line, one JSON
//! reply line; types in `pvsched-control`), and the answers the event
//! thread gives between events (status, metrics, tunables, recordings).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};
use pvsched_abi::{HS_HALTED, HS_PREEMPTED, HS_RUNNING};
use pvsched_base::clock::monotonic_ns;
use pvsched_control::{
    LockStatus, Recording, Request, Response, Status, ThreadStatus, TrackInfo, VcpuStatus, VmStatus,
};
use pvsched_policy::VmLimits;
use tracing::info;

use crate::backend::{BackendState, SchedExt};
use crate::config::{self, Resolved};
use crate::events::EventSource;
use crate::kvm_apply::HaltPollApply;
use crate::metrics::Metrics;
use crate::state_keeper::StateKeeper;
use crate::vm_table::VmTable;

/// A request and where its reply goes.
pub type ControlMsg = (Request, SyncSender<Response>);

/// The event thread's end of the control socket: the requests its server
/// thread passes on, and what they started (a recording).
pub struct ControlServer {
    requests: Receiver<ControlMsg>,
    /// Signalled by the server thread for each request passed on.
    wake: Arc<EventFd>,
    /// The recording `pvschedctl record` started, while it runs.
    recording: Option<Recording>,
    started: Instant,
}

/// The parts of the daemon a request reads or changes.
pub struct Served<'a> {
    pub cfg: &'a mut Resolved,
    pub vms: &'a mut VmTable,
    pub source: &'a EventSource,
    pub metrics: &'a Metrics,
    pub halt_poll: &'a mut HaltPollApply,
    pub state: &'a StateKeeper,
    pub backend: &'a BackendState,
    pub scx: Option<&'a SchedExt>,
}

impl ControlServer {
    /// Starts the server thread on a new socket at `path` ([`spawn`]).
    pub fn start(path: PathBuf, stop: Arc<AtomicBool>) -> std::io::Result<Self> {
        let (tx, requests) = mpsc::channel();
        let wake = EventFd::from_flags(EfdFlags::EFD_NONBLOCK).map_err(|e| {
            let e = std::io::Error::from(e);
            std::io::Error::new(e.kind(), format!("eventfd: {e}"))
        })?;
        let wake = Arc::new(wake);
        spawn(path, tx, wake.clone(), stop)?;
        Ok(Self {
            requests,
            wake,
            recording: None,
            started: Instant::now(),
        })
    }

    /// Readable while requests wait.
    pub fn wake_fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// The recording in progress, if any.
    pub fn recording(&mut self) -> Option<&mut Recording> {
        self.recording.as_mut()
    }

    /// Answers every request waiting, on the event thread.
    pub fn answer_waiting(&mut self, mut d: Served<'_>) {
        let _ = self.wake.read();
        while let Ok((req, reply)) = self.requests.try_recv() {
            let resp = self.answer(req, &mut d);
            let _ = reply.send(resp);
        }
    }
}

/// The longest request line read (a request is a few hundred bytes).
const MAX_REQUEST_BYTES: u64 = 64 * 1024;

/// Starts the control thread on a new socket at `path` (mode 0600):
/// requests go to the event thread through `tx` (signalling `wake`), which
/// answers between events. `record` sleeps here, not there.
pub fn spawn(
    path: PathBuf,
    tx: Sender<ControlMsg>,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let ask = move |req: Request| -> Response {
        let (rtx, rrx) = mpsc::sync_channel(1);
        if tx.send((req, rtx)).is_err() {
            return Response::Error {
                message: "daemon stopping".into(),
            };
        }
        let _ = wake.write(1);
        rrx.recv_timeout(Duration::from_secs(5))
            .unwrap_or(Response::Error {
                message: "daemon did not answer".into(),
            })
    };
    std::thread::Builder::new()
        .name("pvsched-control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
                let mut line = String::new();
                let Ok(reader) = conn.try_clone() else {
                    continue;
                };
                let mut reader = BufReader::new(reader.take(MAX_REQUEST_BYTES));
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let resp = match serde_json::from_str::<Request>(&line) {
                    Ok(Request::Record { seconds }) if seconds > 0.0 && seconds <= 3600.0 => {
                        match ask(Request::Record { seconds }) {
                            Response::Ok { .. } => {
                                std::thread::sleep(Duration::from_secs_f64(seconds));
                                ask(Request::Record { seconds: 0.0 })
                            }
                            other => other,
                        }
                    }
                    Ok(Request::Record { seconds }) => Response::Error {
                        message: format!("record: seconds must be in (0, 3600], not {seconds}"),
                    },
                    Ok(req) => ask(req),
                    Err(e) => Response::Error {
                        message: format!("bad request: {e}"),
                    },
                };
                let mut out = serde_json::to_string(&resp)
                    .unwrap_or_else(|_| "{\"type\":\"error\",\"message\":\"encode\"}".into());
                out.push('\n');
                let _ = conn.write_all(out.as_bytes());
            }
        })?;
    Ok(())
}

fn error(message: impl Into<String>) -> Response {
    Response::Error {
        message: message.into(),
    }
}

impl ControlServer {
    /// Answers one request.
    fn answer(&mut self, req: Request, d: &mut Served<'_>) -> Response {
        match req {
            Request::Status => Response::Status(Box::new(self.status(d))),
            Request::Metrics => {
                d.metrics.set_source_counters(&d.source.counters());
                for vm in d.vms.iter_mut() {
                    vm.report_stats();
                }
                Response::Metrics {
                    text: d.metrics.encode(),
                }
            }
            Request::Set { vm, key, value } => set(d, vm.as_deref(), &key, &value),
            Request::Idle {
                vm,
                budget_permille,
            } => match d
                .halt_poll
                .report(d.vms, vm.as_deref(), budget_permille, monotonic_ns())
            {
                Ok(r) => Response::Idle(r),
                Err(message) => error(&message),
            },
            Request::IdleApply {
                vm,
                budget_permille,
                target,
            } => {
                let (vms, state) = (&*d.vms, d.state);
                let save = |kvm: Option<&_>| state.save(vms.records(), kvm);
                let now = monotonic_ns();
                match d
                    .halt_poll
                    .apply(vms, vm.as_deref(), budget_permille, target, now, save)
                {
                    Ok(r) => Response::Idle(r),
                    Err(message) => error(&message),
                }
            }
            Request::Rescan { reason } => {
                let reason: String = reason.chars().take(200).collect();
                tracing::info!(%reason, "looking for VMs now");
                match d.vms.rescan() {
                    Ok(()) => Response::Ok {
                        message: "looking for VMs now".into(),
                    },
                    Err(message) => error(message),
                }
            }
            // seconds > 0 starts a recording, 0 stops and returns it.
            Request::Record { seconds } if seconds > 0.0 => {
                let tracks = d
                    .vms
                    .iter()
                    .flat_map(|vm| {
                        vm.vcpus.iter().enumerate().map(|(i, m)| TrackInfo {
                            vm: vm.name.clone(),
                            tgid: vm.threads.tgid,
                            vcpu: i as u32,
                            tid: m.handle.tid,
                        })
                    })
                    .collect();
                self.recording = Some(Recording {
                    start_ns: monotonic_ns(),
                    tracks,
                    ..Default::default()
                });
                Response::Ok {
                    message: "recording".into(),
                }
            }
            Request::Record { .. } => match self.recording.take() {
                Some(mut rec) => {
                    rec.end_ns = monotonic_ns();
                    Response::Record(rec)
                }
                None => error("not recording"),
            },
        }
    }

    /// The status view of every served VM.
    fn status(&self, d: &Served<'_>) -> Status {
        let now = monotonic_ns();
        let vms = d
            .vms
            .iter()
            .map(|vm| {
                let stats = vm.policy.vm_stats();
                let header = vm.region.region().header();
                let vcpus = vm
                    .vcpus
                    .iter()
                    .enumerate()
                    .map(|(i, m)| {
                        let t = vm.policy.target(i as u32);
                        let g = vm.policy.guest_view(i as u32);
                        let s = vm.policy.vcpu_stats(i as u32).unwrap_or_default();
                        let host = vm.policy.host_half(i as u32, now);
                        let x = d
                            .scx
                            .and_then(|s| s.vcpu(m.handle.tid as u32))
                            .unwrap_or_default();
                        VcpuStatus {
                            index: i as u32,
                            tid: m.handle.tid,
                            params: m.applied,
                            reason: t.map(|t| t.reason.name()).unwrap_or("none").to_string(),
                            throttled: t.is_some_and(|t| t.throttled),
                            host_status: match host.status {
                                HS_RUNNING => "running",
                                HS_PREEMPTED => "preempted",
                                HS_HALTED => "halted",
                                _ => "unknown",
                            }
                            .to_string(),
                            guest_policy: g.map(|g| g.policy.abi()).unwrap_or(0),
                            guest_rt_priority: g.map(|g| u32::from(g.rt_priority)).unwrap_or(0),
                            guest_cs_flags: g.map(|g| g.cs_flags).unwrap_or(0),
                            boosts: s.boosts,
                            throttles: s.throttles,
                            boosted_ms: s.boosted_ns as f64 * 1e-6,
                            cs_budget_ms: s.cs_budget_ns as f64 * 1e-6,
                            cs_debt_ms: s.cs_debt_ns as f64 * 1e-6,
                            cs_latched: s.cs_latched,
                            scx_extensions: x.ext_count,
                            scx_extended_ms: x.ext_ns as f64 * 1e-6,
                            scx_extensions_refused: x.ext_refused,
                            scx_lock_extensions: x.ext_lock_count,
                            scx_lock_extensions_at_preemption: u64::from(x.ext_at_preempt_count),
                            scx_holder_preempted_extended: x.holder_preempted_extended,
                            scx_holder_preempted_unextended: x.holder_preempted_unextended,
                            scx_holder_preempted_early: x.holder_preempted_early,
                            scx_extensions_ended_early: x.ext_ended_early,
                            scx_extension_tails: x.ext_tails,
                            scx_extension_tails_ended_early: x.ext_tails_ended_early,
                            scx_holder_preempted_early_by: x.holder_preempted_early_by.to_vec(),
                            scx_holders_resumed: x.holder_resumed,
                            scx_extension_yields: x.ext_yielded,
                            scx_holder_preempted_extended_ms: x.holder_preempted_ns_extended as f64
                                * 1e-6,
                            scx_holder_preempted_unextended_ms: x.holder_preempted_ns_unextended
                                as f64
                                * 1e-6,
                            scx_holder_preempted_early_ms: x.holder_preempted_ns_early as f64
                                * 1e-6,
                            scx_boost_preempts: x.boost_preempts,
                            scx_kernel_boosts: x.kboosts,
                            kernel_boosted_ms: s.kernel_boosted_ns as f64 * 1e-6,
                        }
                    })
                    .collect();
                let budget = vm.policy.budget_params();
                let budget_max_ns = pvsched_policy::Budget::full(&budget).remaining_ns(&budget);
                VmStatus {
                    name: vm.name.clone(),
                    tgid: vm.threads.tgid,
                    accel: format!("{:?}", vm.threads.accel).to_lowercase(),
                    region: vm.region.path().display().to_string(),
                    generation: vm.generation,
                    guest_bound: header.guest_generation == vm.generation,
                    doorbell: vm.doorbell,
                    in_debt: stats.in_debt,
                    debt_ms: stats.debt_ns as f64 * 1e-6,
                    boosts: vm.metrics.boosts.get(),
                    throttles: vm.metrics.throttles.get(),
                    clamped_inputs: stats.clamped_inputs_total,
                    boosted_s: stats.boosted_ns_total as f64 * 1e-9,
                    budget_ms: stats.budget_ns as f64 * 1e-6,
                    budget_max_ms: budget_max_ns as f64 * 1e-6,
                    cs_budget_ms: stats.cs_budget_ns as f64 * 1e-6,
                    cs_debt_ms: stats.cs_debt_ns as f64 * 1e-6,
                    cs_latched_vcpus: stats.cs_latched_vcpus,
                    over_budget: stats.over_budget_total,
                    boosted_ms_by_reason: stats
                        .boosted_ns_by_reason
                        .iter()
                        .zip(pvsched_policy::Reason::NAMES)
                        .filter(|(ns, _)| **ns > 0)
                        .map(|(ns, name)| (name.to_string(), *ns as f64 * 1e-6))
                        .collect(),
                    demoted_ms: stats.demoted_ns_total as f64 * 1e-6,
                    budget_latches: stats.budget_latches,
                    budget_latched_ms: stats.budget_latched_ns as f64 * 1e-6,
                    locks: LockStatus {
                        contentions: stats.lock_contentions,
                        holder_preempted: stats.lock_holder_preempted,
                        extensions: stats.lock_extensions,
                        extensions_at_preemption: stats.lock_extensions_at_preemption,
                        extensions_refused: stats.lock_extensions_refused,
                        preemptions_avoided: stats.lock_preemptions_avoided,
                        extended_ms: stats.lock_extended_ns as f64 * 1e-6,
                        repaid_ms: stats.lock_repaid_ns as f64 * 1e-6,
                        debt_ms: stats.lock_debt_ns as f64 * 1e-6,
                    },
                    vcpus,
                    latency_path: vm
                        .latency_path
                        .iter()
                        .map(|m| ThreadStatus {
                            tid: m.handle.tid,
                            params: m.applied,
                        })
                        .collect(),
                }
            })
            .collect();
        Status {
            pid: std::process::id(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            event_source: d.source.name().to_string(),
            dropped_events: d.source.dropped_events(),
            backend: d.backend.status_now(d.scx),
            vms,
        }
    }
}

/// Sets tunable `key` for VM `vm`, or for the defaults and every VM.
/// All or nothing: every new value is checked (by the configuration
/// file's rules) before any is put in force.
fn set(d: &mut Served<'_>, vm: Option<&str>, key: &str, value: &str) -> Response {
    let daemon_priority = d.cfg.config.daemon.priority;
    let parse = |base: &VmLimits| config::set_limit(base, key, value, daemon_priority);
    let defaults = match vm {
        None => match parse(&d.cfg.default_limits) {
            Ok(l) => Some(l),
            Err(e) => return error(e.to_string()),
        },
        Some(_) => None,
    };
    let mut changes: Vec<(u32, VmLimits)> = Vec::new();
    for served in d.vms.iter() {
        if vm.is_some_and(|n| n != served.name) {
            continue;
        }
        let new = match parse(served.policy.limits()) {
            Ok(l) => l,
            Err(e) => return error(format!("vm {}: {e}", served.name)),
        };
        if let Err(e) = new.validate() {
            return error(format!("vm {}: {key}: {e}", served.name));
        }
        changes.push((served.id, new));
    }
    if let Some(name) = vm {
        if changes.is_empty() {
            return error(format!("no VM named {name:?} is served"));
        }
    }
    if let Some(l) = defaults {
        d.cfg.default_limits = l;
    }
    let mut changed = Vec::with_capacity(changes.len());
    for (id, new) in changes {
        let Some(served) = d.vms.get_mut(id) else {
            continue;
        };
        if let Err(e) = served.policy.set_limits(new.clone()) {
            // Validated above: not expected; say so rather than hide it.
            return error(format!("vm {}: {e}", served.name));
        }
        if let Some(l) = served.cfg_index.and_then(|c| d.cfg.vm_limits.get_mut(c)) {
            *l = new;
        }
        changed.push(served.name.clone());
    }
    info!(key, value, vms = ?changed, "tunable set");
    let whom = if vm.is_none() {
        "defaults and every VM".to_string()
    } else {
        changed.join(", ")
    };
    Response::Ok {
        message: format!("{key} = {value} for {whom}"),
    }
}
