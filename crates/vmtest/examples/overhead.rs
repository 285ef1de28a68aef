//! Overhead of pvsched.ko in the guest: `perf bench sched pipe` (and
//! hackbench) with and without the module, alternating rounds in one guest.
//!
//! `cargo run --release -p pvsched-vmtest --example overhead -- [ROUNDS] [LOOPS] [--pipe-only]`
//!
//! Needs perf for the guest kernel (Debian: linux-perf; its perf 6.1 matches
//! the 6.1 cloud kernel).

use std::path::PathBuf;
use std::time::Duration;

use pvsched_vmtest::{default_binaries, GuestImage, ImageConfig, Vm, VmConfig};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// `usecs/op` from `perf bench sched pipe` output.
fn usecs_per_op(out: &str) -> Option<f64> {
    out.lines()
        .find(|l| l.contains("usecs/op"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|w| w.parse().ok())
}

/// `Time: <seconds>` from hackbench output.
fn hackbench_time(out: &str) -> Option<f64> {
    out.lines()
        .find_map(|l| l.strip_prefix("Time:"))
        .and_then(|t| t.trim().parse().ok())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pipe_only = std::env::args().any(|a| a == "--pipe-only");
    let mut args = std::env::args().skip(1).filter(|a| a != "--pipe-only");
    let rounds: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(5);
    let loops: u32 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(20000);
    let mut binaries = default_binaries();
    binaries.push(PathBuf::from("/usr/bin/perf"));
    let image = GuestImage::build(&ImageConfig {
        binaries,
        ..ImageConfig::default()
    })?;
    let cfg = VmConfig::new(image).name("overhead").smp(2);
    let vm = Vm::boot(cfg)?;
    let t = Duration::from_secs(600);
    let mut benches: Vec<(&str, String)> = vec![
        (
            "pipe, both tasks on CPU 1 (usecs/op)",
            format!("taskset -c 1 perf bench sched pipe -l {loops}"),
        ),
        (
            "pipe, tasks free (usecs/op)",
            format!("perf bench sched pipe -l {}", loops / 4),
        ),
        (
            "hackbench -g 2 -l 200 (s)",
            "hackbench -g 2 -l 200".to_string(),
        ),
    ];
    if pipe_only {
        benches.truncate(1);
    }
    let mut results: Vec<[Vec<f64>; 2]> = benches.iter().map(|_| [vec![], vec![]]).collect();
    // Warm up caches and the page cache once.
    vm.exec_ok(&benches[0].1, t)?;
    for round in 0..rounds {
        for loaded in [false, true] {
            if loaded {
                let (rc, out) = vm.insmod("")?;
                assert_eq!(rc, 0, "insmod: {out}");
            }
            for (i, (name, cmd)) in benches.iter().enumerate() {
                let out = vm.exec_ok(cmd, t)?;
                let v = if name.contains("hackbench") {
                    hackbench_time(&out)
                } else {
                    usecs_per_op(&out)
                }
                .ok_or_else(|| format!("cannot parse {cmd}: {out}"))?;
                results[i][usize::from(loaded)].push(v);
                eprintln!("round {round} module={loaded} {name}: {v}");
            }
            if loaded {
                let (rc, out) = vm.rmmod()?;
                assert_eq!(rc, 0, "rmmod: {out}");
            }
        }
    }
    println!(
        "| benchmark ({rounds} rounds) | without: median (min) | with: median (min) | median of per-round ratios |"
    );
    println!("|---|---|---|---|");
    for (i, (name, _)) in benches.iter().enumerate() {
        let mut ratios: Vec<f64> = results[i][1]
            .iter()
            .zip(&results[i][0])
            .map(|(on, off)| on / off)
            .collect();
        let ratio = median(&mut ratios);
        let (off, on) = (&mut results[i][0].clone(), &mut results[i][1].clone());
        let (off_min, on_min) = (
            off.iter().copied().fold(f64::INFINITY, f64::min),
            on.iter().copied().fold(f64::INFINITY, f64::min),
        );
        println!(
            "| {name} | {:.3} ({off_min:.3}) | {:.3} ({on_min:.3}) | {:+.1} % |",
            median(off),
            median(on),
            (ratio - 1.0) * 100.0
        );
    }
    for (i, (name, _)) in benches.iter().enumerate() {
        println!(
            "{name}: without {:?} with {:?}",
            results[i][0], results[i][1]
        );
    }
    Ok(())
}
