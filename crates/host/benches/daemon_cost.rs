//! What pvschedd costs and how fast it reacts, on a real QEMU guest:
//! - daemon CPU at rest (guest idle) and under an event storm (guest
//!   context-switching hard while the host is loaded);
//! - reaction latency (BPF event timestamp -> sched_setattr returned), from
//!   the daemon's own histogram, p50 / p99.
//!
//! `cargo bench -p pvsched-host --bench daemon_cost` (root; boots a TCG guest).
//! A measurement, not a test: it prints numbers and asserts nothing.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pvsched_control::{call, Request, Response};
use pvsched_vmtest::{wait_until, GuestImage, Vm, VmConfig};

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime, stime are fields 14, 15: indices 11, 12 after the comm.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no memory effects.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
}

fn metrics(socket: &std::path::Path) -> String {
    match call(socket, &Request::Metrics, Duration::from_secs(5)) {
        Ok(Response::Metrics { text }) => text,
        other => panic!("metrics: {other:?}"),
    }
}

/// (upper bound seconds, cumulative count) of the reaction histogram.
fn reaction_buckets(text: &str) -> Vec<(f64, f64)> {
    text.lines()
        .filter(|l| l.starts_with("pvsched_reaction_latency_seconds_bucket"))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total == 0.0 {
        return None;
    }
    let want = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, c) in buckets {
        if c >= want {
            if le.is_infinite() {
                return Some(prev.0);
            }
            let frac = if c > prev.1 {
                (want - prev.1) / (c - prev.1)
            } else {
                1.0
            };
            return Some(prev.0 + frac * (le - prev.0));
        }
        prev = (le, c);
    }
    None
}

fn events_total(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("pvsched_events_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn main() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("daemon-cost");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let image = GuestImage::build_default().expect("guest image");
    let vm = Vm::boot(VmConfig::new(image).smp(2)).expect("boot");
    vm.insmod("").expect("insmod");
    let socket = dir.join("control.sock");
    std::fs::write(
        dir.join("pvsched.toml"),
        format!(
            "[daemon]\nstate_file = \"{d}/state.json\"\ncontrol_socket = \"{d}/control.sock\"\nmetrics = \"off\"\n\
             [discovery]\nauto = false\n[[vm]]\nname = \"cost\"\nregion = \"{}\"\nqmp = \"{}\"\n",
            vm.region_path().unwrap().display(),
            vm.qmp_socket().display(),
            d = dir.display()
        ),
    )
    .unwrap();
    let mut daemon: Child = Command::new(env!("CARGO_BIN_EXE_pvschedd"))
        .arg("--config")
        .arg(dir.join("pvsched.toml"))
        .stderr(Stdio::null())
        .spawn()
        .expect("pvschedd");
    let pid = daemon.id();
    wait_until(Duration::from_secs(15), Duration::from_millis(50), || {
        matches!(call(&socket, &Request::Status, Duration::from_secs(2)), Ok(Response::Status(s)) if !s.vms.is_empty()).then_some(())
    })
    .expect("pvschedd serving");

    let measure = |label: &str, secs: u64| {
        let (t0, c0, e0) = (
            Instant::now(),
            cpu_ticks(pid),
            events_total(&metrics(&socket)),
        );
        std::thread::sleep(Duration::from_secs(secs));
        let (dt, dc, de) = (
            t0.elapsed().as_secs_f64(),
            cpu_ticks(pid) - c0,
            events_total(&metrics(&socket)) - e0,
        );
        let cpu = dc as f64 / clk_tck() / dt * 100.0;
        println!(
            "{label:<28} daemon CPU {cpu:6.2} % of a core   events {:8.0}/s",
            de / dt
        );
    };
    eprintln!("measuring at rest (guest idle) ...");
    measure("at rest", 10);

    eprintln!("measuring under an event storm (guest hackbench + a 1-ms `chrt -f` sleep loop, host stress-ng) ...");
    let mut stress = Command::new("stress-ng")
        .args(["--cpu", "2", "--timeout", "30s", "--quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("stress-ng");
    let storm = vm
        .spawn("hackbench -l 100000 -g 2 -f 5 -P & while true; do chrt -f 20 sleep 0.001; done")
        .expect("storm");
    std::thread::sleep(Duration::from_secs(2));
    measure("event storm", 10);
    let _ = vm.exec(
        &format!("kill {}; killall hackbench; true", storm.pid),
        Duration::from_secs(10),
    );
    let _ = stress.kill();
    let _ = stress.wait();

    let text = metrics(&socket);
    let buckets = reaction_buckets(&text);
    let n = buckets.last().map(|b| b.1).unwrap_or(0.0);
    match (quantile(&buckets, 0.5), quantile(&buckets, 0.99)) {
        (Some(p50), Some(p99)) => println!(
            "reaction latency (event -> sched_setattr returned), {n:.0} samples: p50 {:.1} us, p99 {:.1} us",
            p50 * 1e6,
            p99 * 1e6
        ),
        _ => println!("reaction latency: no samples"),
    }
    // SAFETY: SIGTERM to our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = daemon.wait();
}
