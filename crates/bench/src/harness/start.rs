//! A run's start: the tools it needs, its output folders and the private
//! temporary folder its VMs live in.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::axes::Load;
use super::settings::{timestamp, Settings};
use crate::error::{io, BenchError, Result};

/// A run under way: when it began and the folders its files go to.
pub struct Start {
    /// Local time, as the report gives it.
    pub started: String,
    pub t0: Instant,
    /// The output folder (absolute), its `run/` and its `raw/`.
    pub out: PathBuf,
    pub run_dir: PathBuf,
    pub raw_dir: PathBuf,
}

impl Start {
    /// Begins a run of `s`: notes the time, makes the output folders and
    /// checks that the tools it needs are there.
    pub fn begin(s: &Settings) -> Result<Start> {
        let started = timestamp(false);
        let t0 = Instant::now();
        let (out, run_dir, raw_dir) = output_dirs(&s.out)?;
        preflight(s)?;
        Ok(Start {
            started,
            t0,
            out,
            run_dir,
            raw_dir,
        })
    }

    /// (started, t0, out, run_dir, raw_dir): what a scenario's run takes
    /// apart into its own state.
    pub fn into_parts(self) -> (String, Instant, PathBuf, PathBuf, PathBuf) {
        (self.started, self.t0, self.out, self.run_dir, self.raw_dir)
    }
}

pub(crate) fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

pub(crate) fn mkdir(p: &Path) -> Result<()> {
    std::fs::create_dir_all(p).map_err(io(format!("creating {}", p.display())))
}

/// A run's output directory `out` (created, made absolute) with its `run/`
/// and `raw/` subdirectories: (out, run, raw).
pub(crate) fn output_dirs(out: &Path) -> Result<(PathBuf, PathBuf, PathBuf)> {
    mkdir(out)?;
    let out = out
        .canonicalize()
        .map_err(io(format!("resolving {}", out.display())))?;
    let (run_dir, raw_dir) = (out.join("run"), out.join("raw"));
    mkdir(&run_dir)?;
    mkdir(&raw_dir)?;
    Ok((out, run_dir, raw_dir))
}

/// Fails before a long boot when a tool the run needs is missing, with what
/// to do.
pub(crate) fn preflight(s: &Settings) -> Result<()> {
    for (tool, needed) in [
        ("cyclictest", true),
        ("qemu-system-x86_64", true),
        ("stress-ng", s.loads.contains(&Load::Loaded)),
    ] {
        if needed && which(tool).is_none() {
            return Err(BenchError::Missing {
                what: tool.into(),
                hint: "run scripts/install-deps.sh (or `make deps`)".into(),
            });
        }
    }
    if s.modcost.repeat > 0 {
        find_perf()?;
    }
    Ok(())
}

/// Runs `f` with `TMPDIR` set to a directory of our own, removed after.
/// The VMs' directories (region file, QMP socket) go there, not /tmp: on a
/// shared machine a cleanup of /tmp/pvsched-* by someone else would pull
/// the region from under pvschedd.
pub(crate) fn in_private_tmp<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    let private_tmp = PathBuf::from(format!("/var/tmp/pvsched-bench-{}", std::process::id()));
    mkdir(&private_tmp)?;
    std::env::set_var("TMPDIR", &private_tmp);
    let result = f();
    let _ = std::fs::remove_dir_all(&private_tmp);
    result
}

/// The host's `perf` as the guest gets it: `perf` on `$PATH` when it is an
/// executable, else (a wrapper script that picks a versioned binary, as in
/// Debian before 12) the newest `/usr/bin/perf_*` or
/// `/usr/lib/linux-tools-*/perf`.
pub fn find_perf() -> Result<PathBuf> {
    let missing = || BenchError::Missing {
        what: "perf (the guest module overhead phase runs `perf bench sched pipe`)".into(),
        hint: "install linux-perf (scripts/install-deps.sh), or --modcost-repeat 0".into(),
    };
    let perf = which("perf").ok_or_else(missing)?;
    let head = std::fs::read(&perf).map_err(io(format!("reading {}", perf.display())))?;
    if head.starts_with(b"\x7fELF") {
        return Ok(perf);
    }
    let mut found: Vec<PathBuf> = Vec::new();
    for (dir, prefix) in [("/usr/bin", "perf_"), ("/usr/lib", "linux-tools-")] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if !name.starts_with(prefix) {
                continue;
            }
            let p = if prefix == "perf_" {
                e.path()
            } else {
                e.path().join("perf")
            };
            if p.is_file() {
                found.push(p);
            }
        }
    }
    found.sort_by_key(|p| version_key(p));
    found.pop().ok_or_else(missing)
}

/// Numbers in a path, for a version sort (`perf_5.10` < `perf_6.1`).
fn version_key(p: &Path) -> Vec<u64> {
    p.to_string_lossy()
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_sort_puts_the_newest_perf_last() {
        let mut v = [
            PathBuf::from("/usr/bin/perf_6.1"),
            PathBuf::from("/usr/bin/perf_5.10"),
        ];
        v.sort_by_key(|p| version_key(p));
        assert_eq!(v[1], PathBuf::from("/usr/bin/perf_6.1"));
    }
}
