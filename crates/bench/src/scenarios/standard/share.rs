//! Eventual fairness, measured: the CPU time the VM (its vCPU threads and
//! the rest of QEMU), the host load (stress-ng's process tree) and the
//! whole machine used over each cyclictest phase of the standard scenario,
//! and, in the pvsched mode, the time pvschedd kept the vCPUs boosted.
//! The report's table is `share_report`'s.
//!
//! Everything comes from /proc in clock ticks (`utime + stime`, which the
//! kernel scales to the tasks' exact run time) and pvschedd's status; a
//! phase's [`CpuUse`] is the difference of two [`Snapshot`]s.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::daemon::{Daemon, VM_NAME};
use crate::error::{io, BenchError, Result};
use crate::foreign;
use crate::guest_idle::{parse_idle, IdleFile, IDLE_FILE};

/// `comm` of stress-ng's `--cpu` workers: always runnable at nice 0, so
/// their CPU rate is what the fair class gives such a thread (the fair
/// rate of `share_report`'s entitlement).
pub const HOG_COMM: &str = "stress-ng-cpu";

/// CPU time used over one phase, in CPU-seconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuUse {
    /// Wall time between the two snapshots.
    pub wall_s: f64,
    pub host_cpus: usize,
    /// The QEMU process: every thread, exited ones included
    /// (`/proc/<pid>/stat`).
    pub vm_s: f64,
    /// Each vCPU thread (`/proc/<pid>/task/<tid>/stat`), in vCPU order.
    pub vcpu_s: Vec<f64>,
    /// stress-ng and every process below it, reaped ones included; None
    /// without a host load.
    #[serde(default)]
    pub load_s: Option<f64>,
    /// Each stress-ng `--cpu` worker alive at both ends.
    #[serde(default)]
    pub hog_s: Vec<f64>,
    /// The machine's busy time (`/proc/stat`: user, nice, system, irq,
    /// softirq, steal).
    pub busy_s: f64,
    /// pvsched: boosted, non-halted vCPU time as pvschedd counts it
    /// (status `boosted_s`).
    #[serde(default)]
    pub boosted_s: Option<f64>,
    /// pvsched: the boost budget pvschedd enforced, permille of each
    /// vCPU's time (`boost_share_permille`).
    #[serde(default)]
    pub boost_budget_permille: Option<u32>,
    /// pvsched: pvschedd's own process (utime + stime of every thread).
    #[serde(default)]
    pub daemon_s: Option<f64>,
    /// pvsched: pvschedd's time by thread name (its event loop `pvschedd`,
    /// `pvsched-discovery`, ...), threads alive at both ends.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub daemon_threads_s: BTreeMap<String, f64>,
    /// Time the guest's idle driver (pvsched.ko) spent polling, summed over
    /// the vCPUs, from its debugfs counters read just before and just after
    /// the phase; None when they could not be read.
    #[serde(default)]
    pub guest_poll_s: Option<f64>,
    /// The guest's idle driver at the end of the phase: its mode, or
    /// `none (<mode>)` when none is registered.
    #[serde(default)]
    pub guest_idle: Option<String>,
}

/// The counters at one moment, in clock ticks (seconds for `boosted_s`).
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub at: Instant,
    pub vm: u64,
    /// Per vCPU thread, in vCPU order.
    pub vcpus: Vec<u64>,
    pub load: Option<u64>,
    /// pid -> own ticks of each stress-ng `--cpu` worker.
    pub hogs: BTreeMap<u32, u64>,
    pub busy: u64,
    pub boosted_s: Option<f64>,
    /// pvschedd's ticks (the pvsched mode).
    pub daemon: Option<u64>,
    /// pvschedd's threads: tid -> (name, own ticks).
    pub daemon_threads: BTreeMap<u32, (String, u64)>,
}

/// The difference `b - a` in CPU-seconds (`hz`: clock ticks per second).
/// Counters that went backwards count 0; a hog or load present at one end
/// only is left out.
pub fn between(a: &Snapshot, b: &Snapshot, hz: u64, host_cpus: usize) -> CpuUse {
    let hz = hz.max(1) as f64;
    let secs = |x: u64, y: u64| y.saturating_sub(x) as f64 / hz;
    CpuUse {
        wall_s: b.at.saturating_duration_since(a.at).as_secs_f64(),
        host_cpus,
        vm_s: secs(a.vm, b.vm),
        vcpu_s: a
            .vcpus
            .iter()
            .zip(&b.vcpus)
            .map(|(&x, &y)| secs(x, y))
            .collect(),
        load_s: match (a.load, b.load) {
            (Some(x), Some(y)) => Some(secs(x, y)),
            _ => None,
        },
        hog_s: a
            .hogs
            .iter()
            .filter_map(|(pid, &x)| b.hogs.get(pid).map(|&y| secs(x, y)))
            .collect(),
        busy_s: secs(a.busy, b.busy),
        boosted_s: match (a.boosted_s, b.boosted_s) {
            (Some(x), Some(y)) => Some((y - x).max(0.0)),
            _ => None,
        },
        boost_budget_permille: None,
        daemon_s: match (a.daemon, b.daemon) {
            (Some(x), Some(y)) => Some(secs(x, y)),
            _ => None,
        },
        daemon_threads_s: by_thread_name(&a.daemon_threads, &b.daemon_threads, hz),
        guest_poll_s: None,
        guest_idle: None,
    }
}

/// Seconds per thread name between two readings of a process's threads
/// (tid -> name, ticks): a thread present at one end only is left out.
fn by_thread_name(
    a: &BTreeMap<u32, (String, u64)>,
    b: &BTreeMap<u32, (String, u64)>,
    hz: f64,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (tid, (name, x)) in a {
        if let Some((_, y)) = b.get(tid) {
            *out.entry(name.clone()).or_insert(0.0) += y.saturating_sub(*x) as f64 / hz;
        }
    }
    out
}

/// A process's threads now: tid -> (name, own utime + stime ticks); a
/// thread that ended while it was read is left out.
fn threads_of(pid: u32) -> BTreeMap<u32, (String, u64)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return BTreeMap::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|tid| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
            let e = parse_entry(&text)?;
            Some((tid, (e.comm, e.own)))
        })
        .collect()
}

/// The guest's idle debugfs file now; None when it cannot be read (no idle
/// driver support in the module, or the guest did not answer).
pub fn read_guest_idle(vm: &pvsched_vmtest::Vm) -> Option<IdleFile> {
    match vm.exec(&format!("cat {IDLE_FILE}"), Duration::from_secs(30)) {
        Ok((0, out)) => parse_idle(&out).ok(),
        _ => None,
    }
}

/// The guest idle driver's polling between two readings of its file:
/// (seconds polled, summed over the vCPUs: None when a counter went back;
/// the driver at the end).
pub fn guest_idle(a: &IdleFile, b: &IdleFile) -> (Option<f64>, String) {
    let poll = b.total().since(&a.total()).map(|c| c.poll_ns as f64 / 1e9);
    let mode = if b.registered {
        b.mode.clone()
    } else {
        format!("none ({})", b.mode)
    };
    (poll, mode)
}

/// The boost budget pvschedd runs with: `[defaults] boost_share_permille`
/// of `--pvschedd-config`, else the policy's default.
pub fn boost_budget_permille(overlay: &toml::Table) -> u32 {
    overlay
        .get("defaults")
        .and_then(|d| d.get("boost_share_permille"))
        .and_then(toml::Value::as_integer)
        .and_then(|v| u32::try_from(v).ok())
        .unwrap_or_else(|| pvsched_policy::limits::VmLimits::default().boost_share_permille)
}

/// One process of the table: (pid, ppid, utime + stime + cutime + cstime,
/// utime + stime, comm).
#[derive(Clone, Debug, PartialEq)]
pub struct ProcEntry {
    pub pid: u32,
    pub ppid: u32,
    pub with_children: u64,
    pub own: u64,
    pub comm: String,
}

/// A `/proc/<pid>/stat` line as a [`ProcEntry`]; None if malformed.
pub fn parse_entry(text: &str) -> Option<ProcEntry> {
    let (pid, ppid, with_children) = foreign::parse_pid_stat(text)?;
    let own = foreign::parse_utime_stime(text)?;
    let comm = text.get(text.find('(')? + 1..text.rfind(')')?)?.to_string();
    Some(ProcEntry {
        pid,
        ppid,
        with_children,
        own,
        comm,
    })
}

/// `root` and every process below it in `procs`.
pub fn tree(root: u32, procs: &[ProcEntry]) -> Vec<&ProcEntry> {
    let mut inside = BTreeSet::from([root]);
    let mut queue = vec![root];
    while let Some(p) = queue.pop() {
        for e in procs.iter().filter(|e| e.ppid == p && e.pid != p) {
            if inside.insert(e.pid) {
                queue.push(e.pid);
            }
        }
    }
    procs.iter().filter(|e| inside.contains(&e.pid)).collect()
}

fn proc_table() -> Result<Vec<ProcEntry>> {
    let dir = std::fs::read_dir("/proc").map_err(io("listing /proc"))?;
    Ok(dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|text| parse_entry(&text))
        .collect())
}

/// What one phase's CPU time is read from.
pub struct Probe<'a> {
    pub qemu: u32,
    /// The vCPU threads, in vCPU order.
    pub vcpus: Vec<i32>,
    /// stress-ng's pid (the loaded host).
    pub load: Option<u32>,
    /// pvschedd (the pvsched mode).
    pub daemon: Option<&'a Daemon>,
    pub boost_budget_permille: Option<u32>,
}

impl Probe<'_> {
    /// The counters now.
    pub fn snapshot(&self) -> Result<Snapshot> {
        let stat = |path: String| -> Result<u64> {
            let text = std::fs::read_to_string(&path).map_err(io(format!("reading {path}")))?;
            foreign::parse_utime_stime(&text).ok_or_else(|| BenchError::Parse {
                what: path,
                msg: "no utime/stime fields".into(),
            })
        };
        let vm = stat(format!("/proc/{}/stat", self.qemu))?;
        let vcpus = self
            .vcpus
            .iter()
            .map(|t| stat(format!("/proc/{}/task/{t}/stat", self.qemu)))
            .collect::<Result<Vec<u64>>>()?;
        let (load, hogs) = match self.load {
            None => (None, BTreeMap::new()),
            Some(root) => {
                let procs = proc_table()?;
                let t = tree(root, &procs);
                if t.is_empty() {
                    return Err(BenchError::Tool {
                        what: format!("the host load (stress-ng, pid {root})"),
                        detail: "not in /proc: it exited".into(),
                    });
                }
                let hogs = t
                    .iter()
                    .filter(|e| e.comm == HOG_COMM)
                    .map(|e| (e.pid, e.own))
                    .collect();
                (Some(t.iter().map(|e| e.with_children).sum()), hogs)
            }
        };
        let busy = foreign::machine_busy_ticks().ok_or_else(|| BenchError::Parse {
            what: "/proc/stat".into(),
            msg: "unreadable, or no `cpu ` line with 8 counters".into(),
        })?;
        let (boosted_s, daemon, daemon_threads) = match self.daemon {
            None => (None, None, BTreeMap::new()),
            Some(d) => {
                let st = d.status()?;
                let vm = st.vms.iter().find(|v| v.name == VM_NAME).ok_or_else(|| {
                    BenchError::Daemon(format!("pvschedd's status has no VM {VM_NAME:?}"))
                })?;
                (
                    Some(vm.boosted_s),
                    Some(stat(format!("/proc/{}/stat", d.pid()))?),
                    threads_of(d.pid()),
                )
            }
        };
        Ok(Snapshot {
            at: Instant::now(),
            vm,
            vcpus,
            load,
            hogs,
            busy,
            boosted_s,
            daemon,
            daemon_threads,
        })
    }

    /// [`between`] two snapshots of this probe, with its boost budget.
    pub fn between(&self, a: &Snapshot, b: &Snapshot, host_cpus: usize) -> CpuUse {
        CpuUse {
            boost_budget_permille: self.daemon.and(self.boost_budget_permille),
            ..between(a, b, foreign::ticks_per_second(), host_cpus)
        }
    }
}

impl CpuUse {
    /// Percent of the machine (`host_cpus` x wall) that `secs` is.
    pub fn pct(&self, secs: f64) -> f64 {
        let wall = self.wall_s * self.host_cpus.max(1) as f64;
        if wall > 0.0 {
            secs / wall * 100.0
        } else {
            0.0
        }
    }

    /// The progress line's summary: VM (vCPU threads), load, machine.
    pub fn line(&self) -> String {
        let mut s = format!(
            "VM {:.0} % of the CPUs (vCPUs {:.0} %)",
            self.pct(self.vm_s),
            self.pct(self.vcpu_s.iter().sum())
        );
        if let Some(l) = self.load_s {
            s.push_str(&format!(", load {:.0} %", self.pct(l)));
        }
        if let Some(b) = self.boosted_s {
            let vcpu_wall = self.wall_s * self.vcpu_s.len().max(1) as f64;
            if vcpu_wall > 0.0 {
                s.push_str(&format!(
                    ", boosted {:.0} % of vCPU time",
                    b / vcpu_wall * 100.0
                ));
            }
        }
        if let (Some(p), Some(d)) = (self.guest_poll_s, &self.guest_idle) {
            s.push_str(&format!(", guest idle polling {:.1} % ({d})", self.pct(p)));
        }
        if let Some(d) = self.daemon_s {
            s.push_str(&format!(", pvschedd {:.1} %", self.pct(d)));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(
        at: Instant,
        vm: u64,
        vcpus: &[u64],
        load: Option<u64>,
        hogs: &[(u32, u64)],
    ) -> Snapshot {
        Snapshot {
            at,
            vm,
            vcpus: vcpus.to_vec(),
            load,
            hogs: hogs.iter().copied().collect(),
            busy: 0,
            boosted_s: None,
            daemon: None,
            daemon_threads: BTreeMap::new(),
        }
    }

    #[test]
    fn a_share_is_the_tick_difference_over_wall_times_cpus() {
        // Arrange: 10 s on 2 CPUs at 100 Hz; QEMU +500 ticks (5 s), vCPUs
        // +200 and +100 ticks, the load +1200 ticks, the machine +1900.
        let t0 = Instant::now();
        let mut a = snap(t0, 1000, &[300, 400], Some(50), &[(7, 10), (8, 20)]);
        let mut b = snap(
            t0 + Duration::from_secs(10),
            1500,
            &[500, 500],
            Some(1250),
            &[(7, 410), (9, 99)],
        );
        a.busy = 100;
        b.busy = 2000;
        a.boosted_s = Some(1.0);
        b.boosted_s = Some(3.5);
        a.daemon = Some(40);
        b.daemon = Some(90);
        let thread = |name: &str, ticks: u64| (name.to_string(), ticks);
        a.daemon_threads = [
            (1, thread("pvschedd", 30)),
            (2, thread("pvsched-discovery", 10)),
        ]
        .into_iter()
        .collect();
        b.daemon_threads = [
            (1, thread("pvschedd", 60)),
            (2, thread("pvsched-discovery", 25)),
            (3, thread("pvsched-control", 5)),
        ]
        .into_iter()
        .collect();

        // Act
        let u = between(&a, &b, 100, 2);

        // Assert
        assert!((u.wall_s - 10.0).abs() < 1e-9);
        assert!((u.vm_s - 5.0).abs() < 1e-9);
        assert_eq!(u.vcpu_s, vec![2.0, 1.0]);
        assert_eq!(u.load_s, Some(12.0));
        assert_eq!(u.hog_s, vec![4.0], "only the worker seen at both ends");
        assert!((u.busy_s - 19.0).abs() < 1e-9);
        assert_eq!(u.boosted_s, Some(2.5));
        assert_eq!(u.daemon_s, Some(0.5));
        let by_thread: Vec<(&str, f64)> = u
            .daemon_threads_s
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        assert_eq!(
            by_thread,
            vec![("pvsched-discovery", 0.15), ("pvschedd", 0.3)],
            "per thread name; a thread seen at one end only is left out"
        );
        assert!((u.pct(u.vm_s) - 25.0).abs() < 1e-9);
        assert!((u.pct(u.busy_s) - 95.0).abs() < 1e-9);
    }

    #[test]
    fn counters_that_go_backwards_or_vanish_count_nothing() {
        let t0 = Instant::now();
        let a = snap(t0, 900, &[10], Some(5), &[]);
        let b = snap(t0 + Duration::from_secs(1), 800, &[20], None, &[]);

        let u = between(&a, &b, 100, 2);

        assert_eq!(u.vm_s, 0.0);
        assert_eq!(u.load_s, None);
        assert_eq!(u.pct(u.vcpu_s[0]), 5.0);
        assert_eq!(CpuUse::default().pct(1.0), 0.0, "no wall time: no share");
    }

    #[test]
    fn the_load_tree_holds_descendants_and_their_workers_only() {
        // Arrange: stress-ng 10 -> workers 11 (cpu), 12 (iomix) -> 13 (iomix);
        // 20 is a stranger with the workers' name.
        let line = |pid: u32, ppid: u32, comm: &str, own: u64, kids: u64| {
            format!("{pid} ({comm}) R {ppid} 1 1 0 -1 0 0 0 0 0 {own} 0 {kids} 0 20 0 1 0 1 0 0")
        };
        let procs: Vec<ProcEntry> = [
            line(10, 1, "stress-ng", 1, 40),
            line(11, 10, HOG_COMM, 300, 0),
            line(12, 10, "stress-ng-iomix", 5, 0),
            line(13, 12, "stress-ng-iomix", 7, 0),
            line(20, 1, HOG_COMM, 999, 0),
        ]
        .iter()
        .map(|l| parse_entry(l).unwrap())
        .collect();

        // Act
        let t = tree(10, &procs);

        // Assert
        let pids: Vec<u32> = t.iter().map(|e| e.pid).collect();
        assert_eq!(pids, vec![10, 11, 12, 13]);
        assert_eq!(
            t.iter().map(|e| e.with_children).sum::<u64>(),
            41 + 300 + 5 + 7
        );
        assert_eq!(procs[1].comm, HOG_COMM);
        assert_eq!(procs[0].own, 1);
        assert!(tree(99, &procs).is_empty());
    }

    #[test]
    fn guest_polling_is_the_difference_of_two_idle_readings() {
        // Arrange: two vCPUs; 0.2 s then 0.5 s polled on cpu0, 0.1 s on cpu1.
        let file = |registered: u8, p0: u64, p1: u64| {
            format!(
                "mode=hinted registered={registered} driver=pvsched\n\
                 cpu0 polls=5 poll_hits=1 poll_timeouts=0 poll_ns={p0} halts=3 overload_halts=0 unhinted_halts=0\n\
                 cpu1 polls=5 poll_hits=1 poll_timeouts=0 poll_ns={p1} halts=3 overload_halts=0 unhinted_halts=0\n"
            )
        };
        let a = parse_idle(&file(1, 200_000_000, 0)).unwrap();
        let b = parse_idle(&file(1, 500_000_000, 100_000_000)).unwrap();
        let none = parse_idle(&file(0, 0, 0)).unwrap();

        // Act
        let (poll, mode) = guest_idle(&a, &b);
        let (back, none_mode) = guest_idle(&b, &none);

        // Assert
        assert!((poll.unwrap() - 0.4).abs() < 1e-9);
        assert_eq!(mode, "hinted");
        assert_eq!(back, None, "counters reset: no difference");
        assert_eq!(none_mode, "none (hinted)");
    }

    #[test]
    fn the_boost_budget_is_the_overlays_else_the_policys_default() {
        let default = pvsched_policy::limits::VmLimits::default().boost_share_permille;
        assert_eq!(boost_budget_permille(&toml::Table::new()), default);
        let o: toml::Table = "[defaults]\nboost_share_permille = 300\n".parse().unwrap();
        assert_eq!(boost_budget_permille(&o), 300);
        let o: toml::Table = "[daemon]\nboost_share_permille = 300\n".parse().unwrap();
        assert_eq!(boost_budget_permille(&o), default);
    }
}
