//! Scheduling parameters of host threads (QEMU's vCPU threads):
//! `sched_setattr` / `sched_getattr` on thread ids (the syscalls live in
//! `pvsched_host::sched`).

use std::fmt;
use std::io;

/// A thread's policy, RT priority and nice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub policy: u32,
    pub priority: u32,
    pub nice: i32,
}

pub const SCHED_OTHER: u32 = libc::SCHED_OTHER as u32;
pub const SCHED_RR: u32 = libc::SCHED_RR as u32;

impl Params {
    /// SCHED_OTHER, nice 0: what QEMU's threads start with.
    pub const NORMAL: Params = Params {
        policy: SCHED_OTHER,
        priority: 0,
        nice: 0,
    };

    pub fn rr(priority: u32) -> Params {
        Params {
            policy: SCHED_RR,
            priority,
            nice: 0,
        }
    }

    pub fn is_normal(&self) -> bool {
        self.policy == SCHED_OTHER && self.priority == 0
    }
}

impl fmt::Display for Params {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.policy as i32 {
            libc::SCHED_OTHER => "OTHER",
            libc::SCHED_FIFO => "FIFO",
            libc::SCHED_RR => "RR",
            libc::SCHED_BATCH => "BATCH",
            libc::SCHED_IDLE => "IDLE",
            6 => "DEADLINE",
            _ => "?",
        };
        if self.policy == libc::SCHED_FIFO as u32 || self.policy == SCHED_RR {
            write!(f, "{name} {}", self.priority)
        } else {
            write!(f, "{name} nice {}", self.nice)
        }
    }
}

/// Reads a thread's parameters (`sched_getattr(2)`, through pvschedd's own wrapper).
pub fn get(tid: i32) -> io::Result<Params> {
    let t = pvsched_host::sched::get_params(tid)?;
    Ok(Params {
        policy: t.policy,
        priority: t.priority,
        nice: t.nice,
    })
}

/// Applies `p` to a thread (`sched_setattr(2)`), no flags: as `chrt` would.
pub fn set(tid: i32, p: Params) -> io::Result<()> {
    let t = pvsched_host::sched::ThreadParams {
        policy: p.policy,
        priority: p.priority,
        nice: p.nice,
        flags: 0,
        runtime: 0,
        deadline: 0,
        period: 0,
    };
    pvsched_host::sched::set_params(tid, &t)
}

/// Sets `p` and reads it back; an error if the kernel kept something else.
pub fn set_verified(tid: i32, p: Params) -> io::Result<()> {
    set(tid, p)?;
    let got = get(tid)?;
    let same = got.policy == p.policy
        && got.priority == p.priority
        && (p.policy != SCHED_OTHER || got.nice == p.nice);
    if !same {
        return Err(io::Error::other(format!(
            "thread {tid}: asked for {p}, kernel reports {got}"
        )));
    }
    Ok(())
}

/// Every thread of a process: (tid, comm).
pub fn threads(pid: u32) -> io::Result<Vec<(i32, String)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let entry = entry?;
        let Ok(tid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(entry.path().join("comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        out.push((tid, comm));
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_thread_reads_back_as_normal() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
        let p = get(tid).unwrap();
        assert_eq!(p.policy, SCHED_OTHER);
    }

    #[test]
    fn params_display_names_policy_and_priority() {
        assert_eq!(Params::rr(8).to_string(), "RR 8");
        assert_eq!(Params::NORMAL.to_string(), "OTHER nice 0");
    }
}
