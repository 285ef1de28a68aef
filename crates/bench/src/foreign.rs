//! How much of the machine went to processes outside the bench during a
//! phase (other jobs on a shared machine, or time the hypervisor stole from
//! this one): the numbers of a disturbed phase say less, so the report
//! shows it.

use std::time::Instant;

/// CPU time counters at one moment, in clock ticks.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Busy time of every CPU (user, nice, system, irq, softirq, steal).
    busy: u64,
    /// Of which the bench's process tree (self, QEMU, stress-ng,
    /// cyclictest, pvschedd and their children, reaped ones included).
    ours: u64,
    at: Instant,
}

/// Busy ticks from the first line of /proc/stat.
pub fn parse_proc_stat(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 8 {
        return None;
    }
    // user nice system idle iowait irq softirq steal [guest guest_nice]:
    // guest time is already inside user.
    Some(v[0] + v[1] + v[2] + v[5] + v[6] + v[7])
}

/// (pid, ppid, utime + stime + cutime + cstime) from /proc/<pid>/stat.
pub fn parse_pid_stat(text: &str) -> Option<(u32, u32, u64)> {
    let pid = text.split_whitespace().next()?.parse().ok()?;
    // comm may hold spaces and parentheses: fields resume after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] = state (field 3), so field n is f[n - 3].
    let ppid = f.get(1)?.parse().ok()?;
    let mut t = 0u64;
    for n in 14..=17 {
        t += f.get(n - 3)?.parse::<i64>().ok()?.max(0) as u64;
    }
    Some((pid, ppid, t))
}

/// utime + stime of a process (every thread of it, live or exited; not
/// its children) from /proc/<pid>/stat, in clock ticks.
pub fn parse_utime_stime(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let mut t = 0u64;
    for n in 14..=15 {
        t += f.get(n - 3)?.parse::<u64>().ok()?;
    }
    Some(t)
}

/// [`parse_utime_stime`] of process `pid` now; None once it is gone.
pub fn process_ticks(pid: u32) -> Option<u64> {
    parse_utime_stime(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Clock ticks per second (`/proc/<pid>/stat` times).
pub fn ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64
}

fn ours() -> u64 {
    let me = std::process::id();
    let mut procs: Vec<(u32, u32, u64)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let name = e.file_name();
            let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                if let Some(p) = parse_pid_stat(&text) {
                    procs.push(p);
                }
            }
        }
    }
    descendants_time(me, &procs)
}

/// Summed time of `root` and every process below it.
pub fn descendants_time(root: u32, procs: &[(u32, u32, u64)]) -> u64 {
    let mut inside = vec![root];
    let mut total = 0;
    let mut i = 0;
    while i < inside.len() {
        let p = inside[i];
        for &(pid, ppid, t) in procs {
            if pid == p {
                total += t;
            }
            if ppid == p && pid != p {
                inside.push(pid);
            }
        }
        i += 1;
    }
    total
}

/// The machine's busy ticks now ([`parse_proc_stat`] of /proc/stat).
pub fn machine_busy_ticks() -> Option<u64> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

pub fn sample() -> Sample {
    Sample {
        busy: machine_busy_ticks().unwrap_or(0),
        ours: ours(),
        at: Instant::now(),
    }
}

/// Fraction (0..1) of all CPUs' time between `a` and `b` that went to
/// processes outside the bench.
pub fn fraction(a: &Sample, b: &Sample, cpus: usize) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let wall = b.at.duration_since(a.at).as_secs_f64() * cpus.max(1) as f64 * hz;
    if wall <= 0.0 {
        return 0.0;
    }
    let busy = b.busy.saturating_sub(a.busy) as f64;
    let ours = b.ours.saturating_sub(a.ours) as f64;
    ((busy - ours) / wall).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_busy_leaves_out_idle_and_iowait() {
        let t = "cpu  100 5 50 1000 70 3 2 10 40 0\ncpu0 1 2 3 4 5 6 7 8 9 0\n";
        assert_eq!(parse_proc_stat(t), Some(100 + 5 + 50 + 3 + 2 + 10));
    }

    #[test]
    fn pid_stat_survives_a_comm_with_spaces_and_parens() {
        // Arrange: fields 14-17 are 11 22 33 44.
        let t = "42 (CPU 0/TCG) (x) S 7 42 42 0 -1 4194560 100 0 0 0 11 22 33 44 20 0 3 0 100 0 0";

        // Act / Assert
        assert_eq!(parse_pid_stat(t), Some((42, 7, 110)));
    }

    #[test]
    fn utime_stime_leaves_out_the_children() {
        // Arrange: utime 11, stime 22, cutime 33, cstime 44.
        let t = "42 (qemu) (x) S 7 42 42 0 -1 4194560 100 0 0 0 11 22 33 44 20 0 3 0 100 0 0";

        // Act / Assert
        assert_eq!(parse_utime_stime(t), Some(33));
        assert_eq!(parse_utime_stime("42 (qemu"), None);
    }

    #[test]
    fn descendants_include_grandchildren_but_not_strangers() {
        let procs = [
            (1, 0, 1000),
            (10, 1, 5),
            (11, 10, 7),
            (12, 11, 9),
            (20, 1, 100),
        ];
        assert_eq!(descendants_time(10, &procs), 5 + 7 + 9);
    }

    #[test]
    fn fraction_is_zero_when_the_bench_did_all_the_work() {
        let t0 = Instant::now();
        let a = Sample {
            busy: 0,
            ours: 0,
            at: t0,
        };
        let b = Sample {
            busy: 100,
            ours: 100,
            at: t0 + std::time::Duration::from_secs(1),
        };
        assert_eq!(fraction(&a, &b, 2), 0.0);
    }
}
