//! The module overhead phase's run: its own guest, `perf bench sched pipe`
//! with and without pvsched.ko in rotated order, each run taken again when
//! others disturbed it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pvsched_vmtest::{Accel, GuestImage, ImageConfig, Vm};

use super::model::*;
use crate::error::{guest, io, BenchError, Result};
use crate::foreign;
use crate::harness::axes::mode_order;
use crate::harness::disturbance::{Judgement, Retries};
use crate::harness::settings::{ModCostClock, ModCostSettings, Settings};
use crate::harness::start::{find_perf, which};
use crate::harness::vm::vm_config;
use crate::progress::Progress;

/// For the progress line only: host µs per operation to expect under TCG
/// (icount: ~130).
const NOMINAL_US_PER_OP: f64 = 130.0;

/// Phases and nominal seconds the phase adds to a run.
pub fn plan(m: &ModCostSettings) -> (usize, f64) {
    let runs = 2 * m.repeat;
    (runs, runs as f64 * nominal_secs(m.loops))
}

fn nominal_secs(loops: u32) -> f64 {
    f64::from(loops) * NOMINAL_US_PER_OP / 1e6
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
pub(super) fn single_tcg_script(qemu: &Path, icount: bool) -> String {
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
