//! The guest module's own cost, a phase of the standard scenario:
//! `perf bench sched pipe` (both tasks pinned to one vCPU: two context
//! switches and two wakeups per operation, the probes' hot path) in a guest
//! with pvsched.ko loaded and bound, against the same guest without it.
//!
//! How "with" and "without" are made: one extra guest, booted after the main
//! sessions (the main guest powered off first, so that nothing competes with
//! it; no stress-ng, no pvschedd), with a region file the bench initialises
//! itself (vmtest's `RegionSetup::Fresh`: `pvsched_abi::RegionFile`, as
//! pvschedd does, every feature offered), and `insmod` / `rmmod` between the
//! runs. One guest rather than two booted alternately: the two variants then
//! differ by the module only, not by where QEMU's memory or the guest's page
//! cache happened to land. Loading and unloading re-patches tracepoint
//! sites, on which QEMU 7.2's multi-threaded TCG now and then hangs the
//! guest (guest/README.md, "Tests"), so under TCG this guest runs QEMU with
//! single-threaded TCG (`-accel tcg,thread=single`, through a wrapper
//! script, as `crates/vmtest/tests/guest_module.rs` does). Without pvschedd
//! the host halves stay zero: what is measured is the guest module alone.
//!
//! The clock (`--modcost-clock`): under TCG by default the guest's own
//! time under QEMU's `-icount shift=0,sleep=off`, in which the guest clock
//! advances exactly 1 ns per guest instruction, so perf's µs/op is thousands
//! of guest instructions per operation. On the host clock two 2 s runs of the
//! same variant differed by up to 15 % (TCG translation, the host's other
//! work, this machine's own hypervisor), which hid a 2 % target under 9 + 9
//! runs; instruction counts repeat within a few tenths of a percent. What it
//! measures is the module's path length, not its cache misses or the cost of
//! its stores to a page the host also reads. QEMU 7.2 with icount hangs
//! bringing up a second vCPU, so this guest has one (both tasks on vCPU 0).
//! KVM has no icount: there the host clock is used.
//!
//! Order: rotated per repeat (without, with; with, without; ...), so that a
//! slow drift of the host favours neither. After every load or unload a short
//! warm-up run (not counted) lets TCG translate the re-patched code again.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pvsched_vmtest::{Accel, GuestImage, ImageConfig, Vm};
use serde::{Deserialize, Serialize};

use crate::error::{guest, io, BenchError, Result};
use crate::foreign;
use crate::harness::axes::mode_order;
use crate::harness::disturbance::{Judgement, Retries, DISTURBED};
use crate::harness::settings::{ModCostClock, ModCostSettings, Settings};
use crate::harness::start::{find_perf, which};
use crate::harness::vm::vm_config;
use crate::progress::Progress;
use crate::stats::{median, quantile};

/// The target: the module may cost at most this much, percent of
/// the median time per operation.
pub const TARGET_PCT: f64 = 2.0;
/// For the progress line only: host µs per operation to expect under TCG
/// (icount: ~130).
const NOMINAL_US_PER_OP: f64 = 130.0;
/// Bootstrap resamples of the overhead's interval.
const RESAMPLES: usize = 4000;

/// Phases and nominal seconds the phase adds to a run.
pub fn plan(m: &ModCostSettings) -> (usize, f64) {
    let runs = 2 * m.repeat;
    (runs, runs as f64 * nominal_secs(m.loops))
}

fn nominal_secs(loops: u32) -> f64 {
    f64::from(loops) * NOMINAL_US_PER_OP / 1e6
}

/// One `perf bench sched pipe` run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PipeRun {
    pub rep: usize,
    /// pvsched.ko loaded and bound during the run.
    pub module: bool,
    /// perf's `usecs/op`.
    pub usecs_per_op: f64,
    /// CPU time of QEMU's vCPU thread(s) on the host over the whole guest
    /// command (perf's start and exit included), µs per operation; None if
    /// it could not be read.
    #[serde(default)]
    pub vcpu_cpu_us_per_op: Option<f64>,
    /// Publishes into the pinned vCPU's slot during the run (its `seq`
    /// advanced by two per publish); with the module only.
    #[serde(default)]
    pub publishes: Option<u64>,
    /// Share of the machine that went to processes outside the bench.
    pub foreign_cpu: f64,
}

/// What raw.json keeps of the phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModCostRaw {
    /// The guest command of one run.
    pub command: String,
    pub loops: u32,
    pub guest_cpus: u32,
    /// How QEMU ran this guest, e.g. "tcg, single-threaded".
    pub accel: String,
    /// The clock perf's µs/op was measured on (raw files before icount: host).
    #[serde(default = "host_clock")]
    pub clock: ModCostClock,
    /// Host features the region offered (hex).
    pub host_features: String,
    /// In run order; disturbed runs taken again are not kept.
    pub runs: Vec<PipeRun>,
}

fn host_clock() -> ModCostClock {
    ModCostClock::Host
}

/// The phase's outcome: the runs (if the guest came up), notes, errors.
#[derive(Debug, Default)]
pub struct Outcome {
    pub raw: Option<ModCostRaw>,
    pub notes: Vec<String>,
    pub errors: Vec<String>,
}

/// The guest command of one run: both tasks on vCPU `cpu`.
pub fn pipe_cmd(perf: &str, cpu: u32, loops: u32) -> String {
    format!("taskset -c {cpu} {perf} bench sched pipe -l {loops}")
}

/// perf's `<n> usecs/op` line.
pub fn parse_usecs_per_op(out: &str) -> Result<f64> {
    out.lines()
        .find(|l| l.contains("usecs/op"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|w| w.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v > 0.0)
        .ok_or_else(|| BenchError::Parse {
            what: "perf bench sched pipe".into(),
            msg: format!(
                "no usecs/op line in {:?}",
                out.chars().take(400).collect::<String>()
            ),
        })
}

/// Sum of the run time (ns, `/proc/<pid>/task/<tid>/schedstat`) of QEMU's
/// vCPU threads (`... /TCG`, `... /KVM`: `CPU 1/TCG`, or `ALL CPUs/TCG`
/// with single-threaded TCG).
fn vcpu_cpu_ns(qemu: u32) -> Option<u64> {
    let threads = pvsched_base::thread::threads_of(qemu as i32).ok()?;
    let mut sum = 0u64;
    let mut any = false;
    for (tid, comm) in threads {
        if !(comm.ends_with("/TCG") || comm.ends_with("/KVM")) {
            continue;
        }
        let text = std::fs::read_to_string(format!("/proc/{qemu}/task/{tid}/schedstat")).ok()?;
        sum += text.split_whitespace().next()?.parse::<u64>().ok()?;
        any = true;
    }
    any.then_some(sum)
}

/// Whether QEMU runs one TCG thread for all vCPUs.
fn single_threaded_tcg(qemu: u32) -> bool {
    pvsched_base::thread::threads_of(qemu as i32)
        .map(|t| t.iter().any(|(_, c)| c == "ALL CPUs/TCG"))
        .unwrap_or(false)
}

/// QEMU's options for the icount clock (module docs).
pub const ICOUNT_ARGS: &str = "-icount shift=0,sleep=off";

/// A script that runs `qemu` with `-accel tcg,thread=single` in place of the
/// harness's `-accel tcg`, and with [`ICOUNT_ARGS`] if `icount`.
fn single_tcg_script(qemu: &Path, icount: bool) -> String {
    format!(
        "#!/bin/sh\n# pvsched-bench, guest module overhead phase: single-threaded TCG{}\n\
         for a do shift; [ \"$a\" = tcg ] && a=tcg,thread=single; set -- \"$@\" \"$a\"; done\n\
         exec '{}' \"$@\"{}\n",
        if icount { ", icount clock" } else { "" },
        qemu.display(),
        if icount {
            format!(" {ICOUNT_ARGS}")
        } else {
            String::new()
        }
    )
}

/// Writes [`single_tcg_script`] for the host's QEMU into `dir`.
fn write_single_tcg_wrapper(dir: &Path, icount: bool) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let qemu = which("qemu-system-x86_64").ok_or_else(|| BenchError::Missing {
        what: "qemu-system-x86_64".into(),
        hint: "run scripts/install-deps.sh (or `make deps`)".into(),
    })?;
    let path = dir.join("qemu-tcg-single.sh");
    let script = single_tcg_script(&qemu, icount);
    std::fs::write(&path, script).map_err(io(format!("writing {}", path.display())))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .map_err(io(format!("chmod {}", path.display())))?;
    Ok(path)
}

/// The phase's guest: the default vmtest image plus `perf`.
pub fn build_image(perf: &Path) -> Result<GuestImage> {
    let mut cfg = ImageConfig::default();
    cfg.binaries.push(perf.to_path_buf());
    GuestImage::build(&cfg).map_err(guest("guest image with perf"))
}

struct Phase<'a> {
    vm: Vm,
    cmd: String,
    warmup_cmd: String,
    loops: u32,
    cpu: u32,
    host_cpus: usize,
    retry_disturbed: usize,
    raw_dir: &'a Path,
    progress: &'a mut Progress,
    notes: Vec<String>,
}

impl Phase<'_> {
    fn note(&mut self, msg: String) {
        eprintln!("pvsched-bench: {msg}");
        self.notes.push(msg);
    }

    fn guest_generation(&self) -> Option<u64> {
        self.vm.region().map(|r| r.header().guest_generation)
    }

    fn seq(&self) -> Option<u32> {
        self.vm
            .region()
            .and_then(|r| r.read_guest(self.cpu).ok())
            .map(|g| g.seq)
    }

    /// Loads (and checks the binding) or unloads the module, then warms up.
    fn switch(&mut self, module: bool) -> Result<()> {
        if module {
            let (rc, out) = self.vm.insmod("").map_err(guest("insmod pvsched.ko"))?;
            if rc != 0 {
                return Err(BenchError::GuestModule { output: out });
            }
            if self.guest_generation().unwrap_or(0) == 0 {
                let dmesg = self.vm.dmesg().unwrap_or_default();
                return Err(BenchError::Tool {
                    what: "insmod pvsched.ko".into(),
                    detail: format!(
                        "loaded but not bound to the region (guest_generation 0); dmesg: {}",
                        dmesg
                            .lines()
                            .filter(|l| l.contains("pvsched"))
                            .collect::<Vec<_>>()
                            .join(" | ")
                    ),
                });
            }
        } else {
            let (rc, out) = self.vm.rmmod().map_err(guest("rmmod pvsched"))?;
            if rc != 0 {
                return Err(BenchError::Tool {
                    what: "rmmod pvsched".into(),
                    detail: format!("exited {rc}: {}", out.trim()),
                });
            }
        }
        self.vm
            .exec_ok(&self.warmup_cmd, run_timeout(self.loops / 10))
            .map_err(guest("perf bench sched pipe (warm-up)"))?;
        Ok(())
    }

    /// One counted run; returns it (not recorded yet).
    fn measure(&mut self, rep: usize, module: bool) -> Result<PipeRun> {
        let label = format!(
            "module overhead/{} rep {rep}",
            if module { "with" } else { "without" }
        );
        self.progress.phase(&label, nominal_secs(self.loops));
        let qemu = self.vm.qemu_pid();
        let before = foreign::sample();
        let cpu0 = vcpu_cpu_ns(qemu);
        let seq0 = if module { self.seq() } else { None };
        let out = self
            .vm
            .exec_ok(&self.cmd, run_timeout(self.loops))
            .map_err(guest("perf bench sched pipe"))?;
        let seq1 = if module { self.seq() } else { None };
        let cpu1 = vcpu_cpu_ns(qemu);
        let foreign_cpu = foreign::fraction(&before, &foreign::sample(), self.host_cpus);
        let tag = format!(
            "modcost-rep{rep}-{}",
            if module { "with" } else { "without" }
        );
        let _ = std::fs::write(self.raw_dir.join(format!("{tag}.txt")), &out);
        let usecs_per_op = parse_usecs_per_op(&out)?;
        let vcpu_cpu_us_per_op = match (cpu0, cpu1) {
            (Some(a), Some(b)) if b >= a => Some((b - a) as f64 / 1e3 / f64::from(self.loops)),
            _ => None,
        };
        let publishes = match (seq0, seq1) {
            (Some(a), Some(b)) => Some(u64::from(b.wrapping_sub(a) / 2)),
            _ => None,
        };
        eprintln!(
            "    {usecs_per_op:.2} usecs/op{}{} | other load {:.0} %",
            vcpu_cpu_us_per_op
                .map(|c| format!(" | vCPU CPU {c:.2} us/op"))
                .unwrap_or_default(),
            publishes
                .map(|p| format!(" | {p} publishes"))
                .unwrap_or_default(),
            foreign_cpu * 100.0
        );
        Ok(PipeRun {
            rep,
            module,
            usecs_per_op,
            vcpu_cpu_us_per_op,
            publishes,
            foreign_cpu,
        })
    }

    /// [`Self::measure`], taken again (up to `--retry-disturbed` times) while
    /// others took more than [`DISTURBED`] of the machine.
    fn measure_undisturbed(&mut self, rep: usize, module: bool) -> Result<PipeRun> {
        let what = format!(
            "module overhead rep {rep} {}",
            if module { "with" } else { "without" }
        );
        let mut retries = Retries::new(&what, self.retry_disturbed);
        loop {
            let run = self.measure(rep, module)?;
            match retries.judge(run.foreign_cpu) {
                Judgement::Keep => return Ok(run),
                Judgement::Disturbed(note) => {
                    self.note(note);
                    return Ok(run);
                }
                Judgement::Again(note) => {
                    self.note(note);
                    self.progress.add(nominal_secs(self.loops));
                }
            }
        }
    }
}

/// A bound for one run of `loops` operations: 10 ms each (100x what TCG
/// takes) and a minute for perf to start.
fn run_timeout(loops: u32) -> Duration {
    Duration::from_secs(60 + u64::from(loops) / 100)
}

/// Runs the phase: boots its guest (`accel`: what the main guest ran on),
/// measures, powers the guest off.
pub fn run(
    s: &Settings,
    accel: Accel,
    host_cpus: usize,
    run_dir: &Path,
    raw_dir: &Path,
    progress: &mut Progress,
) -> Outcome {
    let mut o = Outcome::default();
    let m = &s.modcost;
    if m.repeat == 0 {
        return o;
    }
    let fail = |o: &mut Outcome, e: BenchError| {
        o.errors.push(format!("guest module overhead phase: {e}"));
    };
    let perf = match find_perf() {
        Ok(p) => p,
        Err(e) => {
            fail(&mut o, e);
            return o;
        }
    };
    eprintln!(
        "pvsched-bench: guest module overhead: building its image (with {})",
        perf.display()
    );
    let image = match build_image(&perf) {
        Ok(i) => i,
        Err(e) => {
            fail(&mut o, e);
            return o;
        }
    };
    let clock = match (m.clock, accel) {
        (ModCostClock::Icount, Accel::Kvm) => {
            o.notes.push(
                "guest module overhead: KVM has no icount clock: measured on the host clock".into(),
            );
            ModCostClock::Host
        }
        (c, _) => c,
    };
    let icount = clock == ModCostClock::Icount;
    let mut cfg = vm_config(s, &image, "modcost", accel);
    if icount {
        cfg = cfg.smp(1);
    }
    if accel == Accel::Tcg {
        match write_single_tcg_wrapper(run_dir, icount) {
            Ok(w) => cfg.qemu = Some(w),
            Err(e) => {
                fail(&mut o, e);
                return o;
            }
        }
    }
    let features = match &cfg.region {
        pvsched_vmtest::RegionSetup::Fresh { host_features, .. } => format!("{host_features:#x}"),
        other => format!("{other:?}"),
    };
    eprintln!(
        "pvsched-bench: guest module overhead: booting its guest ({} vCPUs{})",
        if icount { 1 } else { s.smp },
        match (accel, icount) {
            (Accel::Tcg, true) => ", single-threaded TCG, icount clock",
            (Accel::Tcg, false) => ", single-threaded TCG",
            (Accel::Kvm, _) => "",
        }
    );
    let vm = match Vm::boot(cfg) {
        Ok(vm) => vm,
        Err(e) => {
            fail(&mut o, guest("booting the module overhead guest")(e));
            return o;
        }
    };
    let accel_name = match accel {
        Accel::Kvm => "kvm".to_string(),
        Accel::Tcg if single_threaded_tcg(vm.qemu_pid()) => "tcg, single-threaded".to_string(),
        Accel::Tcg => {
            o.notes.push(
                "guest module overhead: QEMU did not take thread=single (no `ALL CPUs/TCG` \
                 thread): multi-threaded TCG"
                    .into(),
            );
            "tcg, multi-threaded".to_string()
        }
    };
    let guest_cpus = vm.guest_cpus().max(1);
    let perf_name = perf
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "perf".into());
    let cpu = guest_cpus - 1;
    let mut phase = Phase {
        cmd: pipe_cmd(&perf_name, cpu, m.loops),
        warmup_cmd: pipe_cmd(&perf_name, cpu, (m.loops / 10).max(1)),
        vm,
        loops: m.loops,
        cpu,
        host_cpus,
        retry_disturbed: s.retry_disturbed,
        raw_dir,
        progress,
        notes: Vec::new(),
    };
    let mut raw = ModCostRaw {
        command: phase.cmd.clone(),
        loops: m.loops,
        guest_cpus,
        accel: accel_name,
        clock,
        host_features: features,
        runs: Vec::new(),
    };
    // A full run first: TCG translates perf and the pipe path once.
    let warm = phase
        .vm
        .exec_ok(&phase.cmd, run_timeout(m.loops))
        .map_err(guest("perf bench sched pipe (warm-up)"));
    let mut loaded = false;
    let result = warm.and_then(|_| {
        for rep in 1..=m.repeat {
            for module in mode_order(&[false, true], rep - 1, 0) {
                if module != loaded {
                    phase.switch(module)?;
                    loaded = module;
                }
                let r = phase.measure_undisturbed(rep, module)?;
                raw.runs.push(r);
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        fail(&mut o, e);
    }
    if loaded {
        let _ = phase.vm.rmmod();
    }
    let _ = phase.vm.poweroff(Duration::from_secs(30));
    o.notes.append(&mut phase.notes);
    if !raw.runs.is_empty() {
        o.raw = Some(raw);
    }
    o
}

/// One variant's figures over its runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    pub runs: usize,
    pub usecs_per_op_median: f64,
    pub ops_per_s_median: f64,
    pub usecs_per_op_min: f64,
    pub usecs_per_op_max: f64,
    /// Interquartile range: first and third quartiles.
    pub usecs_per_op_q1: f64,
    pub usecs_per_op_q3: f64,
    /// In run order.
    pub usecs_per_op_per_repeat: Vec<f64>,
    /// Median of the vCPU threads' host CPU time per operation (whole
    /// command, perf's start and exit included).
    pub vcpu_cpu_us_per_op_median: Option<f64>,
    /// Median publishes per operation (with the module).
    pub publishes_per_op: Option<f64>,
    /// Runs during which others took more than 10 % of the machine.
    pub disturbed_runs: usize,
}

/// The report's section.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModCostReport {
    pub command: String,
    pub loops: u32,
    pub guest_cpus: u32,
    pub accel: String,
    /// The clock of µs/op (reports before icount: host).
    #[serde(default = "host_clock")]
    pub clock: ModCostClock,
    pub host_features: String,
    pub without: Variant,
    pub with: Variant,
    /// median usecs/op with / median without - 1, percent.
    pub overhead_pct: Option<f64>,
    /// 95 % bootstrap interval of that (each variant's runs resampled).
    pub overhead_low_pct: Option<f64>,
    pub overhead_high_pct: Option<f64>,
    /// Per repeat (with / without of the same repeat - 1), percent.
    pub overhead_pct_per_repeat: Vec<f64>,
    /// The same from the vCPU threads' host CPU time per operation.
    pub vcpu_cpu_overhead_pct: Option<f64>,
    /// "above the noise" when the interval excludes 0, else "within the noise".
    pub noise: String,
    pub target_pct: f64,
    /// overhead_pct <= target_pct.
    pub met: Option<bool>,
}

/// (median(a) / median(b) - 1) x 100.
pub fn overhead_pct(with: &[f64], without: &[f64]) -> Option<f64> {
    let (a, b) = (median(with)?, median(without)?);
    (b > 0.0).then(|| (a / b - 1.0) * 100.0)
}

/// A 95 % percentile-bootstrap interval of [`overhead_pct`]: each variant's
/// values resampled with replacement, `resamples` times, from a fixed seed
/// (the same data give the same interval).
pub fn bootstrap_pct(with: &[f64], without: &[f64], resamples: usize) -> Option<(f64, f64)> {
    if with.is_empty() || without.is_empty() || resamples == 0 {
        return None;
    }
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    };
    let mut stats = Vec::with_capacity(resamples);
    let (mut a, mut b) = (vec![0.0; with.len()], vec![0.0; without.len()]);
    for _ in 0..resamples {
        for x in a.iter_mut() {
            *x = with[next(with.len())];
        }
        for x in b.iter_mut() {
            *x = without[next(without.len())];
        }
        if let Some(p) = overhead_pct(&a, &b) {
            stats.push(p);
        }
    }
    Some((quantile(&stats, 0.025)?, quantile(&stats, 0.975)?))
}

fn variant(runs: &[&PipeRun], loops: u32) -> Variant {
    let us: Vec<f64> = runs.iter().map(|r| r.usecs_per_op).collect();
    let cpu: Vec<f64> = runs.iter().filter_map(|r| r.vcpu_cpu_us_per_op).collect();
    let publ: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.publishes)
        .map(|p| p as f64 / f64::from(loops.max(1)))
        .collect();
    let med = median(&us).unwrap_or(0.0);
    Variant {
        runs: runs.len(),
        usecs_per_op_median: med,
        ops_per_s_median: if med > 0.0 { 1e6 / med } else { 0.0 },
        usecs_per_op_min: us.iter().copied().fold(f64::INFINITY, f64::min),
        usecs_per_op_max: us.iter().copied().fold(0.0, f64::max),
        usecs_per_op_q1: quantile(&us, 0.25).unwrap_or(0.0),
        usecs_per_op_q3: quantile(&us, 0.75).unwrap_or(0.0),
        usecs_per_op_per_repeat: us,
        vcpu_cpu_us_per_op_median: median(&cpu),
        publishes_per_op: median(&publ),
        disturbed_runs: runs.iter().filter(|r| r.foreign_cpu > DISTURBED).count(),
    }
}

/// The report's figures from the raw runs.
pub fn summarize(raw: &ModCostRaw) -> ModCostReport {
    let pick = |m: bool| -> Vec<&PipeRun> { raw.runs.iter().filter(|r| r.module == m).collect() };
    let (on, off) = (pick(true), pick(false));
    let us = |v: &[&PipeRun]| v.iter().map(|r| r.usecs_per_op).collect::<Vec<_>>();
    let cpu = |v: &[&PipeRun]| {
        v.iter()
            .filter_map(|r| r.vcpu_cpu_us_per_op)
            .collect::<Vec<_>>()
    };
    let (a, b) = (us(&on), us(&off));
    let overhead = overhead_pct(&a, &b);
    let interval = bootstrap_pct(&a, &b, RESAMPLES);
    let mut per_repeat = Vec::new();
    for r in &on {
        if let Some(w) = off.iter().find(|x| x.rep == r.rep) {
            per_repeat.push((r.usecs_per_op / w.usecs_per_op - 1.0) * 100.0);
        }
    }
    let noise = match interval {
        Some((lo, hi)) if lo > 0.0 || hi < 0.0 => "above the noise",
        Some(_) => "within the noise",
        None => "not measured",
    };
    ModCostReport {
        command: raw.command.clone(),
        loops: raw.loops,
        guest_cpus: raw.guest_cpus,
        accel: raw.accel.clone(),
        clock: raw.clock,
        host_features: raw.host_features.clone(),
        without: variant(&off, raw.loops),
        with: variant(&on, raw.loops),
        overhead_pct: overhead,
        overhead_low_pct: interval.map(|i| i.0),
        overhead_high_pct: interval.map(|i| i.1),
        overhead_pct_per_repeat: per_repeat,
        vcpu_cpu_overhead_pct: overhead_pct(&cpu(&on), &cpu(&off)),
        noise: noise.into(),
        target_pct: TARGET_PCT,
        met: overhead.map(|p| p <= TARGET_PCT),
    }
}

/// The Markdown section (nothing without the phase).
pub fn markdown(o: &mut String, r: Option<&ModCostReport>) {
    use std::fmt::Write as _;
    let Some(r) = r else {
        return;
    };
    let _ = writeln!(
        o,
        "\n## Guest module overhead: `perf bench sched pipe` in the guest\n"
    );
    let _ = writeln!(
        o,
        "`{}` in a {}-vCPU guest of its own ({}; booted after the sessions, idle host, \
         no pvschedd), pvsched.ko loaded and bound to a region the bench initialised \
         (features {}) against the same guest without it (`insmod` / `rmmod` between \
         runs, order rotated per repeat, a warm-up run after each); {} + {} runs. \
         µs/op is {}. Lower is better.\n",
        r.command,
        r.guest_cpus,
        r.accel,
        r.host_features,
        r.without.runs,
        r.with.runs,
        r.clock.unit()
    );
    let _ = writeln!(
        o,
        "| variant | µs/op median | ops/s median | min .. max | IQR | vCPU host CPU µs/op | publishes/op | disturbed runs |"
    );
    let _ = writeln!(o, "|---|--:|--:|---|---|--:|--:|--:|");
    for (name, v) in [("without module", &r.without), ("with pvsched.ko", &r.with)] {
        let _ = writeln!(
            o,
            "| {name} | {:.2} | {:.0} | {:.2} .. {:.2} | {:.2} .. {:.2} | {} | {} | {} |",
            v.usecs_per_op_median,
            v.ops_per_s_median,
            v.usecs_per_op_min,
            v.usecs_per_op_max,
            v.usecs_per_op_q1,
            v.usecs_per_op_q3,
            v.vcpu_cpu_us_per_op_median
                .map(|c| format!("{c:.2}"))
                .unwrap_or_else(|| "n/a".into()),
            v.publishes_per_op
                .map(|p| format!("{p:.3}"))
                .unwrap_or_else(|| "".into()),
            v.disturbed_runs
        );
    }
    let pct = |p: Option<f64>| p.map_or("n/a".to_string(), |p| format!("{p:+.1} %"));
    let _ = writeln!(
        o,
        "\nOverhead (medians): **{}**, 95 % bootstrap interval {} .. {}: {}. \
         Per repeat: {}. From the vCPU threads' host CPU time: {}.",
        pct(r.overhead_pct),
        pct(r.overhead_low_pct),
        pct(r.overhead_high_pct),
        r.noise,
        r.overhead_pct_per_repeat
            .iter()
            .map(|p| format!("{p:+.1}"))
            .collect::<Vec<_>>()
            .join(", "),
        pct(r.vcpu_cpu_overhead_pct)
    );
    let verdict = match (r.met, r.overhead_high_pct) {
        (Some(true), Some(hi)) if hi <= r.target_pct => {
            "met, and the interval lies below it".to_string()
        }
        (Some(true), _) => "met (the median; the interval reaches above it)".to_string(),
        (Some(false), _) => "MISSED".to_string(),
        (None, _) => "not measured".to_string(),
    };
    let _ = writeln!(
        o,
        "\nTarget: guest module overhead <= {:.0} %: {verdict}.",
        r.target_pct
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rep: usize, module: bool, us: f64) -> PipeRun {
        PipeRun {
            rep,
            module,
            usecs_per_op: us,
            vcpu_cpu_us_per_op: Some(us * 0.9),
            publishes: module.then_some(400),
            foreign_cpu: 0.01,
        }
    }

    fn raw(pairs: &[(f64, f64)]) -> ModCostRaw {
        let mut runs = Vec::new();
        for (i, &(off, on)) in pairs.iter().enumerate() {
            runs.push(run(i + 1, false, off));
            runs.push(run(i + 1, true, on));
        }
        ModCostRaw {
            command: pipe_cmd("perf", 1, 20000),
            loops: 20000,
            guest_cpus: 2,
            accel: "tcg, single-threaded".into(),
            clock: ModCostClock::Icount,
            host_features: "0xf".into(),
            runs,
        }
    }

    #[test]
    fn overhead_is_the_ratio_of_the_medians() {
        // Medians 102 and 100: +2 %.
        let p = overhead_pct(&[101.0, 102.0, 110.0], &[99.0, 100.0, 100.5]).unwrap();
        assert!((p - 2.0).abs() < 1e-9, "{p}");
        assert_eq!(overhead_pct(&[1.0], &[]), None);
        assert_eq!(overhead_pct(&[1.0], &[0.0]), None);
    }

    #[test]
    fn bootstrap_interval_brackets_the_estimate_and_shrinks_to_it_without_spread() {
        let with = [103.0, 104.5, 102.0, 105.0, 103.5, 104.0, 102.5];
        let without = [100.0, 101.0, 99.5, 100.5, 98.5, 101.5, 100.2];
        let p = overhead_pct(&with, &without).unwrap();

        let (lo, hi) = bootstrap_pct(&with, &without, 2000).unwrap();

        assert!(lo <= p && p <= hi, "{lo} <= {p} <= {hi}");
        assert!(
            lo > 0.0,
            "separated samples: the interval excludes 0 ({lo})"
        );
        assert_eq!(bootstrap_pct(&with, &without, 2000), Some((lo, hi)));
        let (lo, hi) = bootstrap_pct(&[103.0; 5], &[100.0; 5], 500).unwrap();
        assert!((lo - 3.0).abs() < 1e-9 && (hi - 3.0).abs() < 1e-9);
        assert_eq!(bootstrap_pct(&[], &[1.0], 10), None);
    }

    #[test]
    fn summary_separates_a_clear_difference_from_noise() {
        // Arrange: +5 % with little spread; then +1 % inside a 10 % spread.
        let clear: Vec<(f64, f64)> = (0..7)
            .map(|i| (100.0 + i as f64 * 0.1, 105.0 + i as f64 * 0.1))
            .collect();
        let noisy: Vec<(f64, f64)> = [(90.0, 101.0), (110.0, 91.0), (100.0, 111.0), (95.0, 96.0)]
            .into_iter()
            .collect();

        // Act
        let a = summarize(&raw(&clear));
        let b = summarize(&raw(&noisy));

        // Assert
        assert_eq!(a.noise, "above the noise");
        assert_eq!(a.met, Some(false));
        assert_eq!(a.with.runs, 7);
        assert!((a.overhead_pct.unwrap() - 500.0 / 100.3).abs() < 1e-6);
        assert_eq!(a.overhead_pct_per_repeat.len(), 7);
        assert!((a.with.publishes_per_op.unwrap() - 0.02).abs() < 1e-12);
        assert_eq!(a.without.publishes_per_op, None);
        assert!((a.with.ops_per_s_median - 1e6 / 105.3).abs() < 1e-6);
        assert_eq!(b.noise, "within the noise");
        assert_eq!(b.without.usecs_per_op_min, 90.0);
        assert_eq!(b.without.usecs_per_op_max, 110.0);
    }

    #[test]
    fn markdown_shows_both_variants_the_interval_and_the_target() {
        let r = summarize(&raw(&[(100.0, 101.0), (100.5, 101.2), (99.8, 100.9)]));
        let mut md = String::new();

        markdown(&mut md, Some(&r));

        for needle in [
            "## Guest module overhead",
            "| without module | 100.00 |",
            "| with pvsched.ko | 101.00 |",
            "Overhead (medians): **+1.0 %**",
            "Target: guest module overhead <= 2 %: met",
        ] {
            assert!(md.contains(needle), "{needle:?} not in\n{md}");
        }
        let mut none = String::new();
        markdown(&mut none, None);
        assert!(none.is_empty());
    }

    #[test]
    fn perf_output_gives_usecs_per_op() {
        let out = "# Running 'sched/pipe' benchmark:\n# Executed 20000 pipe operations between two processes\n\n     Total time: 1.845 [sec]\n\n      92.254650 usecs/op\n          10839 ops/sec\n";
        assert_eq!(parse_usecs_per_op(out).unwrap(), 92.25465);
        assert!(parse_usecs_per_op("perf: command not found").is_err());
    }

    #[test]
    fn the_command_pins_both_tasks_and_fits_the_console() {
        let c = pipe_cmd("perf", 1, 20000);
        assert_eq!(c, "taskset -c 1 perf bench sched pipe -l 20000");
        assert!(c.len() < pvsched_vmtest::MAX_COMMAND_LEN);
    }

    #[test]
    fn plan_counts_two_runs_per_repeat_and_zero_skips() {
        let (phases, secs) = plan(&ModCostSettings::default());
        assert_eq!(phases, 2 * crate::harness::settings::DEFAULT_REPEAT);
        assert!(secs > 0.0);
        assert_eq!(
            plan(&ModCostSettings {
                repeat: 0,
                loops: 1000,
                clock: ModCostClock::Host,
            }),
            (0, 0.0)
        );
    }

    #[test]
    fn raw_json_without_the_phase_still_reads_and_with_it_round_trips() {
        // Arrange: a raw.json as written before the phase existed.
        let mut file = super::super::model::RawFile {
            meta: Default::default(),
            loads: vec![],
            intervals: vec![],
            modes: vec![],
            results: Default::default(),
            modcost: None,
            simulated: None,
        };
        let old = serde_json::to_string(&file).unwrap();
        assert!(!old.contains("modcost"));

        // Act
        let back: super::super::model::RawFile = serde_json::from_str(&old).unwrap();
        file.modcost = Some(raw(&[(100.0, 101.0)]));
        let new: super::super::model::RawFile =
            serde_json::from_str(&serde_json::to_string(&file).unwrap()).unwrap();

        // Assert
        assert!(back.modcost.is_none());
        assert_eq!(new.modcost, file.modcost);
    }

    /// Runs the wrapper with `echo` as QEMU and returns the arguments QEMU got.
    fn args_through_wrapper(icount: bool) -> String {
        let dir = std::env::temp_dir().join(format!(
            "pvsched-bench-wrapper-{}-{icount}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("qemu.sh");
        std::fs::write(&script, single_tcg_script(Path::new("/bin/echo"), icount)).unwrap();
        let out = std::process::Command::new("sh")
            .arg(&script)
            .args(["-accel", "tcg", "-cpu", "max", "-append", "a b"])
            .output()
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        String::from_utf8(out.stdout)
            .unwrap()
            .trim_end()
            .to_string()
    }

    #[test]
    fn the_wrapper_runs_single_threaded_tcg_and_adds_icount_only_when_asked() {
        assert_eq!(
            args_through_wrapper(false),
            "-accel tcg,thread=single -cpu max -append a b"
        );
        assert_eq!(
            args_through_wrapper(true),
            "-accel tcg,thread=single -cpu max -append a b -icount shift=0,sleep=off"
        );
    }

    #[test]
    fn raw_files_from_before_icount_read_as_the_host_clock() {
        let mut v = serde_json::to_value(raw(&[(100.0, 101.0)])).unwrap();
        v.as_object_mut().unwrap().remove("clock");

        let back: ModCostRaw = serde_json::from_value(v).unwrap();

        assert_eq!(back.clock, ModCostClock::Host);
        assert!(summarize(&back).clock == ModCostClock::Host);
        let mut md = String::new();
        markdown(&mut md, Some(&summarize(&raw(&[(100.0, 101.0)]))));
        assert!(md.contains("1 ns per guest instruction"), "{md}");
    }
}
