//! Prometheus metrics. The event thread updates atomics through handles it
//! caches per VM; the metrics thread encodes the registry on request.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tracing::{info, warn};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VmLabel {
    pub vm: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabel {
    pub cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VmKindLabel {
    pub vm: String,
    pub kind: &'static str,
}

/// The lock counts of a VM (`pvsched_lock_events{kind}`), in [`LockMetrics::counts`] order.
pub const LOCK_COUNT_KINDS: [&str; 6] = [
    "contentions",
    "holder_preempted",
    "extensions",
    "extensions_at_preemption",
    "extensions_refused",
    "preemptions_avoided",
];
/// The lock times of a VM (`pvsched_lock_seconds{kind}`), in [`LockMetrics::seconds`] order.
pub const LOCK_TIME_KINDS: [&str; 3] = ["extended", "repaid", "debt"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub vm: String,
    pub reason: &'static str,
}

const REACTION_BUCKETS_US: [f64; 24] = [
    1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 70.0, 100.0, 150.0, 200.0,
    300.0, 500.0, 700.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0,
];

/// A constructor for the idle-transition histograms of a VM.
type IdleFamily = Family<VmLabel, Histogram, fn() -> Histogram>;

/// Idle transitions: powers of two from 1 µs to about 1 s (the advisor's own
/// quarter-octave buckets each fall inside one of these).
fn idle_histogram() -> Histogram {
    Histogram::new((0..21).map(|k| (1u64 << k) as f64 * 1e-6))
}

pub struct Metrics {
    registry: Registry,
    halt_seconds: IdleFamily,
    wake_seconds: IdleFamily,
    boosts: Family<VmLabel, Counter>,
    throttles: Family<VmLabel, Counter>,
    clamped: Family<VmLabel, Counter>,
    boosted_seconds: Family<VmLabel, Gauge<f64, AtomicU64>>,
    lock_events: Family<VmKindLabel, Gauge>,
    lock_seconds: Family<VmKindLabel, Gauge<f64, AtomicU64>>,
    decisions: Family<ReasonLabel, Counter>,
    pub events: Family<KindLabel, Counter>,
    /// Event-thread wakeups for host records / for its timer (each one a
    /// context switch on a host CPU).
    pub wakeups_records: Counter,
    pub wakeups_timer: Counter,
    /// ... and for a guest's doorbell (`--doorbell`).
    pub wakeups_doorbell: Counter,
    /// Doorbell rings read (several may come with one wakeup).
    pub doorbell_rings: Counter,
    pub reaction_seconds: Histogram,
    /// The first part of a reaction: host event timestamp to the event
    /// thread awake (epoll returned) for it; the rest is the daemon's own work.
    pub reaction_wakeup_seconds: Histogram,
    /// How long each `sched_setattr` of a reaction took.
    pub setattr_seconds: Histogram,
    pub setattr_errors: Counter,
    /// The kernel ended the sched_ext scheduler and the daemon fell back to rt.
    pub scx_fallbacks: Counter,
    pub dropped_events: Gauge,
    /// BPF records submitted, and of those the lazy ones (no wakeup).
    pub records: Gauge,
    pub lazy_records: Gauge,
    pub vms: Gauge,
    pub boosted_vcpus: Gauge,
}

/// Per-VM handles: cloning them once keeps label lookups off the event path.
#[derive(Clone)]
pub struct VmMetrics {
    pub boosts: Counter,
    pub throttles: Counter,
    pub clamped: Counter,
    pub boosted_seconds: Gauge<f64, AtomicU64>,
    pub halt_seconds: Histogram,
    pub wake_seconds: Histogram,
    pub locks: LockMetrics,
    label: VmLabel,
}

/// A VM's lock counts and times, as totals since it was served (set from the policy's).
#[derive(Clone)]
pub struct LockMetrics {
    /// [`LOCK_COUNT_KINDS`].
    pub counts: [Gauge; 6],
    /// [`LOCK_TIME_KINDS`], seconds.
    pub seconds: [Gauge<f64, AtomicU64>; 3],
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("pvsched");
        // Counters are shared handles: these two are the family's own.
        let wakeups = Family::<CauseLabel, Counter>::default();
        let wakeups_records = wakeups
            .get_or_create(&CauseLabel { cause: "records" })
            .clone();
        let wakeups_timer = wakeups
            .get_or_create(&CauseLabel { cause: "timer" })
            .clone();
        let wakeups_doorbell = wakeups
            .get_or_create(&CauseLabel { cause: "doorbell" })
            .clone();
        let m = Self {
            halt_seconds: Family::new_with_constructor(idle_histogram as fn() -> Histogram),
            wake_seconds: Family::new_with_constructor(idle_histogram as fn() -> Histogram),
            boosts: Family::default(),
            throttles: Family::default(),
            clamped: Family::default(),
            boosted_seconds: Family::default(),
            lock_events: Family::default(),
            lock_seconds: Family::default(),
            decisions: Family::default(),
            events: Family::default(),
            wakeups_records,
            wakeups_timer,
            wakeups_doorbell,
            doorbell_rings: Counter::default(),
            // 1 µs .. 20 ms, fine enough around the 30 µs target for p50/p99.
            reaction_seconds: Histogram::new(REACTION_BUCKETS_US.iter().map(|us| us * 1e-6)),
            reaction_wakeup_seconds: Histogram::new(REACTION_BUCKETS_US.iter().map(|us| us * 1e-6)),
            setattr_seconds: Histogram::new(REACTION_BUCKETS_US.iter().map(|us| us * 1e-6)),
            setattr_errors: Counter::default(),
            scx_fallbacks: Counter::default(),
            dropped_events: Gauge::default(),
            records: Gauge::default(),
            lazy_records: Gauge::default(),
            vms: Gauge::default(),
            boosted_vcpus: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register("boosts", "Boosts applied to vCPU threads", m.boosts.clone());
        registry.register(
            "throttles",
            "Boosts refused by throttling",
            m.throttles.clone(),
        );
        registry.register(
            "clamped_inputs",
            "Guest inputs out of range, clamped and not acted on raw",
            m.clamped.clone(),
        );
        registry.register(
            "boosted_seconds",
            "Total time vCPU threads of the VM ran boosted",
            m.boosted_seconds.clone(),
        );
        registry.register(
            "lock_events",
            "Lock waits of the VM since it was served: contentions and those whose holder's \
             vCPU was preempted (counted by the guest), extensions granted and refused, \
             preemptions cut short",
            m.lock_events.clone(),
        );
        registry.register(
            "lock_seconds",
            "Lock-holder extension time on a CPU since the VM was served, of it repaid, and \
             the debt left",
            m.lock_seconds.clone(),
        );
        registry.register(
            "decisions",
            "Parameter changes applied, by reason",
            m.decisions.clone(),
        );
        registry.register("events", "Events handled, by kind", m.events.clone());
        registry.register(
            "wakeups",
            "Event-thread wakeups, by cause (records of the event source, its timer, a guest doorbell)",
            wakeups.clone(),
        );
        registry.register(
            "doorbell_rings",
            "Guest doorbell rings read (a boosted vCPU's reason cleared)",
            m.doorbell_rings.clone(),
        );
        registry.register(
            "reaction_latency_seconds",
            "Host event timestamp to sched_setattr returned",
            m.reaction_seconds.clone(),
        );
        registry.register(
            "reaction_wakeup_seconds",
            "Of a reaction: host event timestamp to the event thread awake for it",
            m.reaction_wakeup_seconds.clone(),
        );
        registry.register(
            "setattr_seconds",
            "Of a reaction: one sched_setattr call",
            m.setattr_seconds.clone(),
        );
        registry.register(
            "setattr_errors",
            "sched_setattr calls that failed",
            m.setattr_errors.clone(),
        );
        registry.register(
            "scx_fallbacks",
            "Times the kernel ended the sched_ext scheduler and the daemon fell back to the rt backend",
            m.scx_fallbacks.clone(),
        );
        registry.register(
            "dropped_events",
            "Events lost in the BPF ring buffer",
            m.dropped_events.clone(),
        );
        registry.register(
            "bpf_records",
            "Records the BPF programs submitted since load",
            m.records.clone(),
        );
        registry.register(
            "bpf_lazy_records",
            "Of those, records submitted without waking the daemon",
            m.lazy_records.clone(),
        );
        registry.register(
            "vcpu_halt_seconds",
            "vCPU halts, halt to wakeup (the thread blocked until woken)",
            m.halt_seconds.clone(),
        );
        registry.register(
            "vcpu_wake_latency_seconds",
            "vCPU wakeups, woken to running",
            m.wake_seconds.clone(),
        );
        registry.register("vms", "VMs served", m.vms.clone());
        registry.register(
            "boosted_vcpus",
            "vCPU threads boosted now",
            m.boosted_vcpus.clone(),
        );
        Self { registry, ..m }
    }

    /// The event source's counters, as [`crate::events::EventSource::counters`] read them.
    pub fn set_source_counters(&self, c: &crate::events::SourceCounters) {
        self.dropped_events.set(c.dropped_events as i64);
        self.records.set(c.records as i64);
        self.lazy_records.set(c.lazy_records as i64);
    }

    pub fn vm(&self, name: &str) -> VmMetrics {
        let label = VmLabel {
            vm: name.to_string(),
        };
        VmMetrics {
            boosts: self.boosts.get_or_create(&label).clone(),
            throttles: self.throttles.get_or_create(&label).clone(),
            clamped: self.clamped.get_or_create(&label).clone(),
            boosted_seconds: self.boosted_seconds.get_or_create(&label).clone(),
            halt_seconds: self.halt_seconds.get_or_create(&label).clone(),
            wake_seconds: self.wake_seconds.get_or_create(&label).clone(),
            locks: LockMetrics {
                counts: LOCK_COUNT_KINDS.map(|kind| {
                    self.lock_events
                        .get_or_create(&VmKindLabel {
                            vm: name.to_string(),
                            kind,
                        })
                        .clone()
                }),
                seconds: LOCK_TIME_KINDS.map(|kind| {
                    self.lock_seconds
                        .get_or_create(&VmKindLabel {
                            vm: name.to_string(),
                            kind,
                        })
                        .clone()
                }),
            },
            label,
        }
    }

    pub fn decision(&self, vm: &VmMetrics, reason: &'static str) {
        self.decisions
            .get_or_create(&ReasonLabel {
                vm: vm.label.vm.clone(),
                reason,
            })
            .inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Serves `metrics` on `listen` ("host:port" over HTTP, or "unix:/path" as
/// plain text per connection) from a thread of its own.
pub fn serve(listen: &str, metrics: Arc<Metrics>) -> std::io::Result<()> {
    if listen == "off" {
        return Ok(());
    }
    if let Some(path) = listen.strip_prefix("unix:") {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        info!(path, "metrics on unix socket");
        std::thread::Builder::new()
            .name("pvsched-metrics".into())
            .spawn(move || {
                for mut conn in listener.incoming().flatten() {
                    let _ = conn.write_all(metrics.encode().as_bytes());
                }
            })?;
    } else {
        let listener = TcpListener::bind(listen)?;
        info!(listen, "metrics over HTTP");
        std::thread::Builder::new().name("pvsched-metrics".into()).spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(2)));
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf);
                let body = metrics.encode();
                let head = format!(
                    "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                if conn.write_all(head.as_bytes()).and_then(|_| conn.write_all(body.as_bytes())).is_err() {
                    warn!("metrics client went away");
                }
            }
        })?;
    }
    Ok(())
}
