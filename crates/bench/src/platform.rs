//! Where the guests run. `--platform local` (the default): on this machine,
//! with the accelerator `--accel` picks. `--platform kvm`: with KVM, in a
//! KVM host VM (`pvsched-hostvm`): this process builds the guest images
//! here (the host VM sees this machine's files read-only), boots the host
//! VM with the output folder shared into it, and runs the same command
//! there with `--accel kvm`, streaming its progress. A failure of the host
//! VM itself (an emulation fault) is never a result: what it interrupted
//! runs again on a fresh host VM ([`MAX_HOST_VM_FAILURES`] failures at most),
//! and the report says so. The standard scenario runs in chunks (one repeat
//! of one load each, [`Chunking`]) merged into one report, so that a failure
//! costs a chunk: the host VM failed every 10-15 minutes in runs of ~50.

use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pvsched_hostvm::{shell_quote, HostVm, HostVmConfig};
use serde::{Deserialize, Serialize};

use crate::error::{io, BenchError, Result};
use crate::harness::axes::Load;
use crate::scenarios::standard::model::RawFile;

/// The platforms of `--platform`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Platform {
    /// This machine, with the accelerator `--accel` picks.
    #[default]
    Local,
    /// KVM guests in a KVM host VM (a stock Debian 13 kernel under TCG):
    /// every figure emulated, comparable only within the run.
    Kvm,
}

/// What the host VM was, for the report (`host-vm.json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostVmFacts {
    pub kernel: String,
    pub qemu: String,
    pub cpus: u32,
    pub memory_mb: u32,
    /// From QEMU's start to the command prompt, of the run that counted.
    pub boot_s: f64,
    /// Each failure of the host VM: what it interrupted (dropped, run again) and why.
    pub failed_attempts: Vec<String>,
    /// Wall time of the whole bench, boots and failed attempts included.
    pub wall_s: f64,
    /// The host VM CPUs its KVM guests were confined to (`crates/hostvm`,
    /// `PVSCHED_HOSTVM_GUEST_CPUS`); empty: every one. None: a run from
    /// before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_cpus: Option<Vec<u32>>,
}

impl HostVmFacts {
    /// The report's paragraph on the platform.
    pub fn markdown(&self) -> String {
        let mut md = format!(
            "## Platform: KVM in the host VM\n\n\
             Every guest of this run ran under KVM inside a host VM: Debian's {kernel} kernel \
             booted under TCG (`-cpu max`, SVM emulated) by QEMU {qemu}, {cpus} vCPUs, {mem} MiB, \
             this machine's userland shared read-only over virtiofs (`crates/hostvm`). The \
             host VM's boot took {boot:.1} s; the run {wall:.0} s in all. Everything in the \
             host VM is emulated, so its absolute times are slow: compare the modes within \
             this run, never its figures with the TCG run's or a real host's.\n",
            kernel = self.kernel,
            qemu = self.qemu,
            cpus = self.cpus,
            mem = self.memory_mb,
            boot = self.boot_s,
            wall = self.wall_s,
        );
        match self.guest_cpus.as_deref() {
            None => {}
            Some([]) => md.push_str(
                "\nKVM guests ran on every CPU of the host VM \
                 (`PVSCHED_HOSTVM_GUEST_CPUS=all`).\n",
            ),
            Some(cpus) => md.push_str(&format!(
                "\nKVM guests were confined to host VM CPU(s) {}: the vCPUs of every guest \
                 share them (`PVSCHED_HOSTVM_GUEST_CPUS`).\n",
                cpus.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            )),
        }
        if self.failed_attempts.is_empty() {
            md.push_str("\nThe host VM did not fail.\n");
        } else {
            md.push_str(&format!(
                "\nThe host VM itself failed {} time(s); what each failure interrupted was \
                 dropped whole and run again on a fresh host VM:\n\n",
                self.failed_attempts.len()
            ));
            for (i, f) in self.failed_attempts.iter().enumerate() {
                md.push_str(&format!("- failure {}: {}\n", i + 1, first_lines(f, 3)));
            }
        }
        md
    }
}

fn first_lines(text: &str, n: usize) -> String {
    text.lines().take(n).collect::<Vec<_>>().join(" / ")
}

/// The arguments to run again inside the host VM: ours without `--platform`
/// and `--out` (each job gives its own), with `--accel kvm`; a
/// `--pvschedd-config` file copied into `out`, which the host VM sees.
pub fn inner_args(args: &[String], out: &Path) -> Result<Vec<String>> {
    let mut inner = Vec::new();
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--platform" | "--out" => {
                it.next();
            }
            // The host VM sees this machine's /tmp as its own tmpfs: the
            // file travels in the output folder.
            "--pvschedd-config" => {
                let given = it.next().map(String::as_str).unwrap_or("");
                let copy = out.join("pvschedd-config.toml");
                std::fs::copy(given, &copy).map_err(io(format!(
                    "--pvschedd-config {given}: copying it for the host VM"
                )))?;
                inner.extend(["--pvschedd-config".into(), copy.display().to_string()]);
            }
            "--accel" => {
                let v = it.next().map(String::as_str).unwrap_or("");
                if v != "kvm" && v != "auto" {
                    return Err(BenchError::Usage(format!(
                        "--platform kvm runs its guests with KVM; --accel {v} contradicts it"
                    )));
                }
            }
            _ if a.starts_with("--platform=") || a.starts_with("--out=") => {}
            _ if a.starts_with("--accel=") => {
                let v = &a["--accel=".len()..];
                if v != "kvm" && v != "auto" {
                    return Err(BenchError::Usage(format!(
                        "--platform kvm runs its guests with KVM; --accel {v} contradicts it"
                    )));
                }
            }
            _ => inner.push(a.clone()),
        }
    }
    inner.extend(["--accel".into(), "kvm".into()]);
    Ok(inner)
}

/// The guest images the inner run needs, built here: inside the host VM
/// this machine's files are read-only, so a cache miss there is an error.
pub fn prebuild_images(modcost: bool) -> Result<()> {
    eprintln!("pvsched-bench: building the guest images here (cached after the first run)");
    let cache = pvsched_vmtest::cache_root().with_file_name("pvsched-bench");
    crate::guest::build_image(&cache)?;
    if modcost {
        let perf = crate::harness::start::find_perf()?;
        crate::scenarios::standard::modcost::run::build_image(&perf)?;
    }
    Ok(())
}

/// How the standard scenario is cut into chunks: every repeat of every load
/// is a run of its own (`--repeat 1 --loads L --chunk-of REP:LOAD_INDEX`),
/// so that a failure of the host VM costs one chunk, not the run; the
/// chunks' raw results are merged and rendered as one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Chunking {
    pub repeat: usize,
    pub loads: Vec<Load>,
    /// `--modcost-repeat` of the whole run: given to the last chunk only.
    pub modcost_repeat: usize,
}

/// One run of the bench in the host VM, into its own folder.
struct Job {
    name: String,
    args: Vec<String>,
    out: PathBuf,
}

/// Host VM failures one `--platform kvm` run survives in all; each costs
/// the job it interrupted, which runs again on a fresh host VM.
pub const MAX_HOST_VM_FAILURES: usize = 6;

/// Options the chunks set themselves.
const CHUNK_OPTIONS: [&str; 3] = ["--repeat", "--loads", "--modcost-repeat"];

/// `args` without the options in `drop` (as `--opt V` or `--opt=V`).
fn without(args: &[String], drop: &[&str]) -> Vec<String> {
    let mut kept = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if drop.contains(&a.as_str()) {
            it.next();
        } else if !drop.iter().any(|d| a.starts_with(&format!("{d}="))) {
            kept.push(a.clone());
        }
    }
    kept
}

/// The chunks of a run: every repeat of every load, in run order; the last
/// one also runs the guest module overhead phase.
fn chunk_jobs(base: &[String], c: &Chunking, out: &Path) -> Vec<Job> {
    let base = without(base, &CHUNK_OPTIONS);
    let total = c.repeat * c.loads.len();
    let mut jobs = Vec::new();
    for rep in 1..=c.repeat {
        for (li, load) in c.loads.iter().enumerate() {
            let last = jobs.len() + 1 == total;
            let mut args = base.clone();
            args.extend([
                "--repeat".into(),
                "1".into(),
                "--loads".into(),
                load.name().into(),
                "--chunk-of".into(),
                format!("{rep}:{li}"),
                "--modcost-repeat".into(),
                (if last { c.modcost_repeat } else { 0 }).to_string(),
            ]);
            let name = format!("rep{rep}-{}", load.name());
            jobs.push(Job {
                out: out.join("parts").join(&name),
                name,
                args,
            });
        }
    }
    jobs
}

/// Runs the bench `args` (our own command line) in a KVM host VM, writing
/// into `out`; the standard scenario in chunks (`chunking`). Returns the
/// exit status (0 done, 1 some phases failed, 2 nothing ran).
pub fn run_in_host_vm(
    args: &[String],
    out: &Path,
    modcost: bool,
    chunking: Option<Chunking>,
    resume: bool,
) -> Result<i32> {
    let t0 = Instant::now();
    std::fs::create_dir_all(out).map_err(io(format!("creating {}", out.display())))?;
    let out = out
        .canonicalize()
        .map_err(io(format!("resolving {}", out.display())))?;
    // A failed job's results are removed whole: only ours may be there.
    let taken = std::fs::read_dir(&out)
        .map_err(io(format!("reading {}", out.display())))?
        .next()
        .is_some();
    if taken && !resume {
        return Err(BenchError::Usage(format!(
            "--out {}: not empty; --platform kvm writes into a new or empty folder \
             (--resume goes on with the run there)",
            out.display()
        )));
    }
    let args: Vec<String> = args.iter().filter(|a| *a != "--resume").cloned().collect();
    let inner = inner_args(&args, &out)?;
    prebuild_images(modcost)?;
    let jobs = match &chunking {
        Some(c) => chunk_jobs(&inner, c, &out),
        None => vec![Job {
            name: "the run".into(),
            args: inner,
            out: out.clone(),
        }],
    };
    let cfg = HostVmConfig::new("bench").exchange(&out);
    let (codes, mut facts) = run_jobs(&jobs, &cfg)?;
    let rc = if chunking.is_some() {
        let parts: Vec<PathBuf> = jobs.iter().map(|j| j.out.join("raw.json")).collect();
        merge_and_render(&parts, &out, t0)?;
        codes.iter().copied().max().unwrap_or(0).min(1)
    } else {
        codes.first().copied().unwrap_or(2)
    };
    facts.wall_s = t0.elapsed().as_secs_f64();
    write_facts(&out, &facts)?;
    Ok(rc)
}

/// Runs `jobs` in turn on a host VM, booting a fresh one after a failure
/// of the host VM and running the interrupted job again (at most
/// [`MAX_HOST_VM_FAILURES`] failures in all). Each job's exit status; the
/// host VM that ran the last one.
fn run_jobs(jobs: &[Job], cfg: &HostVmConfig) -> Result<(Vec<i32>, HostVmFacts)> {
    let root = pvsched_vmtest::workspace_root();
    let rev = crate::host::source_revision(&root);
    let exe = std::env::current_exe().map_err(io("finding this executable"))?;
    let harness = |e: pvsched_hostvm::Error| {
        BenchError::Daemon(format!("--platform kvm: the host VM harness: {e}"))
    };
    let mut failed: Vec<String> = Vec::new();
    let mut vm: Option<HostVm> = None;
    let mut facts = HostVmFacts::default();
    let mut codes = Vec::new();
    for (n, job) in jobs.iter().enumerate() {
        if let Some(rc) = finished(job) {
            eprintln!(
                "pvsched-bench: --platform kvm: {} finished before (exit {rc}): kept",
                job.name
            );
            codes.push(rc);
            continue;
        }
        loop {
            if cfg.exchange.as_ref() != Some(&job.out) {
                let _ = std::fs::remove_dir_all(&job.out);
            } else {
                clear_results(&job.out)?;
            }
            std::fs::create_dir_all(&job.out)
                .map_err(io(format!("creating {}", job.out.display())))?;
            if vm.is_none() {
                eprintln!(
                    "pvsched-bench: --platform kvm: booting the host VM ({} failure(s) so far)",
                    failed.len()
                );
                match HostVm::boot(cfg) {
                    Ok(v) => {
                        eprintln!(
                            "pvsched-bench: host VM up in {:.1} s: kernel {}, QEMU {}, {} vCPUs",
                            v.boot_time().as_secs_f64(),
                            v.packages().kernel.release,
                            v.packages().qemu.version,
                            v.cpus()
                        );
                        facts = vm_facts(&v, cfg);
                        vm = Some(v);
                    }
                    Err(e) if e.is_host_vm_failure() => {
                        failed.push(format!("booting: {e}"));
                        check_failures(&failed)?;
                        continue;
                    }
                    Err(e) => return Err(harness(e)),
                }
            }
            let Some(v) = vm.as_ref() else { continue };
            eprintln!(
                "pvsched-bench: --platform kvm: {} ({} of {}) in the host VM",
                job.name,
                n + 1,
                jobs.len()
            );
            let mut args = job.args.clone();
            args.extend(["--out".into(), job.out.display().to_string()]);
            let log = job.out.join("host-vm-bench.log");
            let status = job.out.join("host-vm-bench.status");
            // The developer's aid of ipi_sources, asked for outside, works inside.
            let stacks = match std::env::var_os(crate::ipi_sources::STACKS_ENV) {
                Some(_) => format!("{}=1 ", crate::ipi_sources::STACKS_ENV),
                None => String::new(),
            };
            let cmd = format!(
                "cd {root} && {stacks}{rev_env}={rev} {exe} {args} >{log} 2>&1; echo $? >{status}",
                root = shell_quote(&root.display().to_string()),
                rev_env = crate::host::SOURCE_REV_ENV,
                rev = shell_quote(&rev),
                exe = shell_quote(&exe.display().to_string()),
                args = args
                    .iter()
                    .map(|a| shell_quote(a))
                    .collect::<Vec<_>>()
                    .join(" "),
                log = shell_quote(&log.display().to_string()),
                status = shell_quote(&status.display().to_string()),
            );
            match follow(v, &cmd, &log, &status) {
                Ok(2) if jobs.len() > 1 => {
                    return Err(BenchError::Daemon(format!(
                        "--platform kvm: {} ran nothing: {}",
                        job.name,
                        log.display()
                    )))
                }
                Ok(rc) => {
                    codes.push(rc);
                    break;
                }
                Err(e) if e.is_host_vm_failure() => {
                    eprintln!(
                        "pvsched-bench: {}: {e}; it runs again on a fresh host VM",
                        job.name
                    );
                    failed.push(format!("{}: {e}", job.name));
                    vm = None;
                    check_failures(&failed)?;
                }
                Err(e) => return Err(harness(e)),
            }
        }
    }
    facts.failed_attempts = failed;
    Ok((codes, facts))
}

/// A job that finished in an earlier run (`--resume`): its exit status, when
/// it ran something (0 or 1) and left its raw results.
fn finished(job: &Job) -> Option<i32> {
    let rc: i32 = std::fs::read_to_string(job.out.join("host-vm-bench.status"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    ((rc == 0 || rc == 1) && job.out.join("raw.json").exists()).then_some(rc)
}

fn check_failures(failed: &[String]) -> Result<()> {
    if failed.len() >= MAX_HOST_VM_FAILURES {
        return Err(BenchError::Daemon(format!(
            "--platform kvm: the host VM failed {} times; the last: {}",
            failed.len(),
            failed.last().map(String::as_str).unwrap_or("")
        )));
    }
    Ok(())
}

/// Merges the chunks' raw results (`parts`, each a `raw.json`) into one
/// run's `out/raw.json` and renders its report there.
fn merge_and_render(parts: &[PathBuf], out: &Path, t0: Instant) -> Result<()> {
    let mut merged: Option<RawFile> = None;
    for p in parts {
        let (raw, _): (RawFile, PathBuf) = crate::harness::raw::load(p)?;
        merged = Some(match merged {
            None => raw,
            Some(m) => merge_raw(m, raw),
        });
    }
    let Some(mut m) = merged else {
        return Err(BenchError::Daemon("--platform kvm: no chunk ran".into()));
    };
    m.meta.command = std::env::args().collect::<Vec<_>>().join(" ");
    m.meta.wall_s = t0.elapsed().as_secs_f64();
    let path = out.join("raw.json");
    std::fs::write(&path, crate::harness::output::json(&m))
        .map_err(io(format!("writing {}", path.display())))?;
    crate::scenarios::standard::render::rerender(&path)?;
    Ok(())
}

/// `a` and `b` as one run: their loads, their repeats (each chunk numbers
/// its own), their notes; the rest from `a`, or from `b` where `a` has none.
pub fn merge_raw(mut a: RawFile, b: RawFile) -> RawFile {
    for l in b.loads {
        if !a.loads.contains(&l) {
            a.loads.push(l);
        }
    }
    for (k, v) in b.results.latency {
        a.results.latency.entry(k).or_default().extend(v);
    }
    for (k, v) in b.results.sessions {
        a.results.sessions.entry(k).or_default().extend(v);
    }
    for v in a.results.latency.values_mut() {
        v.sort_by_key(|r| r.rep);
    }
    for v in a.results.sessions.values_mut() {
        v.sort_by_key(|r| r.rep);
    }
    let reps: std::collections::BTreeSet<usize> = a
        .results
        .sessions
        .values()
        .flatten()
        .map(|r| r.rep)
        .collect();
    a.meta.repeat = reps.len().max(a.meta.repeat);
    a.meta.notes.extend(b.meta.notes);
    a.modcost = a.modcost.or(b.modcost);
    a.simulated = a.simulated.or(b.simulated);
    a
}

fn vm_facts(vm: &HostVm, cfg: &HostVmConfig) -> HostVmFacts {
    HostVmFacts {
        kernel: vm.packages().kernel.release.clone(),
        qemu: vm.packages().qemu.version.clone(),
        cpus: vm.cpus(),
        memory_mb: cfg.memory_mb,
        boot_s: vm.boot_time().as_secs_f64(),
        guest_cpus: Some(cfg.guest_cpus.clone().unwrap_or_default()),
        ..HostVmFacts::default()
    }
}

/// Removes what an earlier run or attempt left in `out` (its partial
/// results), keeping the files given to the run.
fn clear_results(out: &Path) -> Result<()> {
    let entries = std::fs::read_dir(out).map_err(io(format!("reading {}", out.display())))?;
    for e in entries.flatten() {
        let p = e.path();
        if p.file_name().is_some_and(|n| n == "pvschedd-config.toml") {
            continue;
        }
        let r = if p.is_dir() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        r.map_err(io(format!("removing {}", p.display())))?;
    }
    Ok(())
}

/// Writes `host-vm.json` and puts the platform's paragraph at the top of
/// the inner run's report.md.
fn write_facts(out: &Path, facts: &HostVmFacts) -> Result<()> {
    let json = serde_json::to_string_pretty(facts).map_err(|source| BenchError::Json {
        what: "host-vm.json".into(),
        source,
    })?;
    let path = out.join("host-vm.json");
    std::fs::write(&path, json).map_err(io(format!("writing {}", path.display())))?;
    add_platform_paragraph(out)
}

/// Puts the platform's paragraph (from `host-vm.json`, when the run in `out`
/// ran in a host VM) at the top of its freshly rendered report.md: after a
/// run, and after `--from-raw` renders it again.
pub fn add_platform_paragraph(out: &Path) -> Result<()> {
    let path = out.join("host-vm.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    let facts: HostVmFacts = serde_json::from_str(&text).map_err(|source| BenchError::Json {
        what: path.display().to_string(),
        source,
    })?;
    let report = out.join("report.md");
    if let Ok(md) = std::fs::read_to_string(&report) {
        // After the title line, before the rest.
        let (title, rest) = md.split_once('\n').unwrap_or((md.as_str(), ""));
        let merged = format!("{title}\n\n{}\n{rest}", facts.markdown());
        std::fs::write(&report, merged).map_err(io(format!("writing {}", report.display())))?;
    }
    Ok(())
}

/// How often the host VM is asked whether the inner bench is done.
const POLL: Duration = Duration::from_secs(5);

/// Starts `cmd` in the host VM and follows it: copies its log to our
/// stderr as it grows, asks every [`POLL`] whether the status file is there.
/// A host VM that stops answering fails the attempt (the harness tells).
fn follow(vm: &HostVm, cmd: &str, log: &Path, status: &Path) -> pvsched_hostvm::Result<i32> {
    let _ = std::fs::remove_file(status);
    vm.spawn(cmd)?;
    let mut offset = 0u64;
    loop {
        std::thread::sleep(POLL);
        offset = copy_new_lines(log, offset);
        // An exec that gets no answer is classified by the harness (QEMU
        // gone, an emulation fault, or a hung host VM).
        vm.exec("true", Duration::from_secs(60))?;
        if let Ok(text) = std::fs::read_to_string(status) {
            copy_new_lines(log, offset);
            return text.trim().parse::<i32>().map_err(|_| {
                pvsched_hostvm::Error::Other(format!(
                    "the bench in the host VM left an unreadable status {text:?}"
                ))
            });
        }
    }
}

/// Prints the lines of `log` past `offset` to stderr; the new offset.
fn copy_new_lines(log: &Path, offset: u64) -> u64 {
    let Ok(mut f) = std::fs::File::open(log) else {
        return offset;
    };
    if f.seek(SeekFrom::Start(offset)).is_err() {
        return offset;
    }
    let mut r = BufReader::new(f);
    let mut pos = offset;
    let mut line = String::new();
    while let Ok(n) = r.read_line(&mut line) {
        if n == 0 || !line.ends_with('\n') {
            break;
        }
        pos += n as u64;
        eprint!("  | {line}");
        line.clear();
    }
    pos
}

/// The default output folder of a `--platform kvm` run.
pub fn default_out(base: PathBuf) -> PathBuf {
    PathBuf::from(format!("{}-kvm", base.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn inner_args_drop_the_platform_and_give_kvm_and_the_absolute_out() {
        // Act
        let inner = inner_args(
            &args("pvsched-bench --platform kvm --repeat 2 --out rel --smp 1"),
            Path::new("/abs/out"),
        )
        .unwrap();

        // Assert
        assert_eq!(
            inner,
            args("--repeat 2 --smp 1 --accel kvm"),
            "the host VM run must neither recurse nor write elsewhere"
        );
    }

    #[test]
    fn inner_args_refuse_tcg() {
        // Act
        let r = inner_args(
            &args("pvsched-bench --platform=kvm --accel tcg"),
            Path::new("/o"),
        );

        // Assert
        assert!(matches!(r, Err(BenchError::Usage(m)) if m.contains("--accel tcg")));
    }

    fn raw(load: Load, rep: usize, note: &str) -> RawFile {
        use crate::harness::axes::Mode;
        use crate::scenarios::standard::model::{LatencyRun, SessionRun};
        let mut r = RawFile {
            meta: Default::default(),
            loads: vec![load],
            intervals: vec![1000],
            modes: vec![Mode::Vanilla],
            results: Default::default(),
            modcost: None,
            simulated: None,
        };
        r.meta.repeat = 1;
        r.meta.notes.push(note.into());
        r.results.latency.insert(
            (load, 1000, Mode::Vanilla),
            vec![LatencyRun {
                rep,
                ..Default::default()
            }],
        );
        r.results.sessions.insert(
            (load, Mode::Vanilla),
            vec![SessionRun {
                rep,
                ..Default::default()
            }],
        );
        r
    }

    #[test]
    fn chunks_merge_into_one_run_of_every_load_and_repeat() {
        // Arrange: chunks in run order, as chunk_jobs makes them.
        let parts = [
            raw(Load::Idle, 1, "a"),
            raw(Load::Loaded, 1, "b"),
            raw(Load::Idle, 2, "c"),
            raw(Load::Loaded, 2, "d"),
        ];

        // Act
        let m = parts.into_iter().reduce(merge_raw).unwrap();

        // Assert
        use crate::harness::axes::Mode;
        assert_eq!(m.loads, [Load::Idle, Load::Loaded]);
        assert_eq!(m.meta.repeat, 2);
        assert_eq!(m.meta.notes, ["a", "b", "c", "d"]);
        for load in [Load::Idle, Load::Loaded] {
            let reps: Vec<usize> = m.results.latency[&(load, 1000, Mode::Vanilla)]
                .iter()
                .map(|r| r.rep)
                .collect();
            assert_eq!(reps, [1, 2], "{load:?}");
            assert_eq!(m.results.sessions[&(load, Mode::Vanilla)].len(), 2);
        }
    }

    #[test]
    fn every_repeat_of_every_load_is_a_chunk_and_only_the_last_measures_the_module() {
        // Arrange
        let c = Chunking {
            repeat: 2,
            loads: vec![Load::Idle, Load::Loaded],
            modcost_repeat: 5,
        };

        // Act
        let jobs = chunk_jobs(
            &args("--repeat 3 --loads=idle --modcost-repeat 9 --duration 6"),
            &c,
            Path::new("/o"),
        );

        // Assert
        let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
        assert_eq!(
            names,
            ["rep1-idle", "rep1-loaded", "rep2-idle", "rep2-loaded"]
        );
        assert_eq!(
            jobs[1].args,
            args("--duration 6 --repeat 1 --loads loaded --chunk-of 1:1 --modcost-repeat 0")
        );
        assert!(jobs[3]
            .args
            .ends_with(&args("--chunk-of 2:1 --modcost-repeat 5")));
        assert_eq!(jobs[2].out, Path::new("/o/parts/rep2-idle"));
    }

    #[test]
    fn resume_keeps_only_jobs_that_ran_and_left_raw_results() {
        // Arrange: one folder per state a job can be left in.
        let root = std::env::temp_dir().join(format!("pvsched-resume-{}", std::process::id()));
        let job = |name: &str, status: Option<&str>, raw: bool| {
            let out = root.join(name);
            std::fs::create_dir_all(&out).unwrap();
            if let Some(s) = status {
                std::fs::write(out.join("host-vm-bench.status"), s).unwrap();
            }
            if raw {
                std::fs::write(out.join("raw.json"), "{}").unwrap();
            }
            Job {
                name: name.into(),
                args: vec![],
                out,
            }
        };

        // Act
        let done = finished(&job("done", Some("0\n"), true));
        let some_failed = finished(&job("some-failed", Some("1\n"), true));
        let nothing_ran = finished(&job("nothing-ran", Some("2\n"), true));
        let interrupted = finished(&job("interrupted", None, false));
        let no_raw = finished(&job("no-raw", Some("0\n"), false));
        let _ = std::fs::remove_dir_all(&root);

        // Assert
        assert_eq!(done, Some(0));
        assert_eq!(some_failed, Some(1));
        assert_eq!((nothing_ran, interrupted, no_raw), (None, None, None));
    }

    #[test]
    fn the_report_names_every_failed_attempt() {
        // Arrange
        let facts = HostVmFacts {
            kernel: "7.3.4".into(),
            qemu: "10.0.2".into(),
            cpus: 2,
            memory_mb: 3072,
            boot_s: 5.2,
            failed_attempts: vec!["QEMU exited\nmore".into(), "no answer".into()],
            wall_s: 900.0,
            guest_cpus: None,
        };

        // Act
        let md = facts.markdown();

        // Assert
        assert!(md.contains("failed 2 time(s)"), "{md}");
        assert!(md.contains("- failure 1: QEMU exited / more"), "{md}");
        assert!(md.contains("- failure 2: no answer"), "{md}");
        assert!(md.contains("KVM in the host VM"), "{md}");
        assert!(
            !md.contains("KVM guests"),
            "no word on the guests' CPUs when unknown: {md}"
        );
    }

    #[test]
    fn the_report_says_which_host_vm_cpus_the_guests_shared() {
        let facts = |cpus: Vec<u32>| HostVmFacts {
            cpus: 2,
            guest_cpus: Some(cpus),
            ..HostVmFacts::default()
        };
        let md = facts(vec![0]).markdown();
        assert!(
            md.contains("KVM guests were confined to host VM CPU(s) 0:"),
            "{md}"
        );
        let md = facts(vec![]).markdown();
        assert!(
            md.contains("KVM guests ran on every CPU of the host VM"),
            "{md}"
        );
    }
}
