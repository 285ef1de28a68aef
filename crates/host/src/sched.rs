//! OS glue for scheduling parameters: `sched_setattr` / `sched_getattr` on a
//! thread id, and a handle that tells whether a thread id still names the
//! thread we discovered (thread ids are reused).

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use pvsched_policy::{HostPolicy, SchedParams};
use serde::{Deserialize, Serialize};

/// `struct sched_attr`, first version (48 bytes): what every kernel since 3.14 takes.
#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}

const SCHED_ATTR_SIZE_VER0: u32 = 48;
/// Linux UAPI policy numbers.
const SCHED_OTHER: u32 = 0;
const SCHED_FIFO: u32 = 1;
const SCHED_RR: u32 = 2;
const SCHED_BATCH: u32 = 3;
const SCHED_IDLE: u32 = 5;
const SCHED_DEADLINE: u32 = 6;
/// Reset-on-fork: children of a boosted vCPU thread never inherit the boost.
const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

/// Scheduling parameters as the kernel reports them, including policies the
/// daemon never applies (deadline), so that originals restore faithfully.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadParams {
    pub policy: u32,
    pub priority: u32,
    pub nice: i32,
    #[serde(default)]
    pub flags: u64,
    #[serde(default)]
    pub runtime: u64,
    #[serde(default)]
    pub deadline: u64,
    #[serde(default)]
    pub period: u64,
}

impl ThreadParams {
    pub fn from_sched(p: SchedParams) -> Self {
        let policy = match p.policy {
            HostPolicy::Other => SCHED_OTHER,
            HostPolicy::Batch => SCHED_BATCH,
            HostPolicy::Idle => SCHED_IDLE,
            HostPolicy::Fifo => SCHED_FIFO,
            HostPolicy::Rr => SCHED_RR,
        };
        let rt = matches!(policy, SCHED_FIFO | SCHED_RR);
        Self {
            policy,
            priority: if rt { u32::from(p.rt_priority) } else { 0 },
            nice: if rt { 0 } else { i32::from(p.nice) },
            flags: SCHED_FLAG_RESET_ON_FORK,
            runtime: 0,
            deadline: 0,
            period: 0,
        }
    }

    pub fn is_rt(&self) -> bool {
        matches!(self.policy, SCHED_FIFO | SCHED_RR | SCHED_DEADLINE)
    }

    /// Same policy, priority and nice (the parts the policy engine decides).
    pub fn same_class(&self, other: &ThreadParams) -> bool {
        self.policy == other.policy && self.priority == other.priority && self.nice == other.nice
    }

    pub fn policy_name(&self) -> &'static str {
        match self.policy {
            SCHED_OTHER => "other",
            SCHED_FIFO => "fifo",
            SCHED_RR => "rr",
            SCHED_BATCH => "batch",
            SCHED_IDLE => "idle",
            SCHED_DEADLINE => "deadline",
            _ => "unknown",
        }
    }
}

impl std::fmt::Display for ThreadParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_rt() {
            write!(f, "{}/{}", self.policy_name(), self.priority)
        } else {
            write!(f, "{}/nice {}", self.policy_name(), self.nice)
        }
    }
}

/// Applies `params` to thread `tid`.
pub fn set_params(tid: i32, params: &ThreadParams) -> io::Result<()> {
    let attr = SchedAttr {
        size: SCHED_ATTR_SIZE_VER0,
        sched_policy: params.policy,
        sched_flags: params.flags,
        sched_nice: params.nice,
        sched_priority: params.priority,
        sched_runtime: params.runtime,
        sched_deadline: params.deadline,
        sched_period: params.period,
    };
    // SAFETY: `attr` is a valid, initialised sched_attr of the size it
    // declares, alive across the call; the kernel only reads it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            tid,
            &attr as *const SchedAttr,
            0u32,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reads thread `tid`'s scheduling parameters from the kernel.
pub fn get_params(tid: i32) -> io::Result<ThreadParams> {
    let mut attr = SchedAttr::default();
    // SAFETY: the kernel writes at most `size` (48) bytes into `attr`, which is
    // 48 bytes, writable and alive across the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid,
            &mut attr as *mut SchedAttr,
            SCHED_ATTR_SIZE_VER0,
            0u32,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ThreadParams {
        policy: attr.sched_policy,
        priority: attr.sched_priority,
        nice: attr.sched_nice,
        flags: attr.sched_flags & SCHED_FLAG_RESET_ON_FORK,
        runtime: attr.sched_runtime,
        deadline: attr.sched_deadline,
        period: attr.sched_period,
    })
}

/// Thread identity that survives thread-id reuse: (tgid, tid, start time),
/// plus a pidfd where the kernel has thread pidfds (6.9+).
#[derive(Debug)]
pub struct ThreadHandle {
    pub tid: i32,
    pub tgid: i32,
    /// Field 22 of /proc/<tid>/stat: start time in clock ticks since boot.
    pub start_time: u64,
    pidfd: Option<OwnedFd>,
}

/// `PIDFD_THREAD` (= O_EXCL): a pidfd for a thread rather than a process.
const PIDFD_THREAD: u32 = libc::O_EXCL as u32;

impl ThreadHandle {
    /// Opens a handle on thread `tid` of process `tgid`; fails if the thread
    /// does not exist or belongs to another process.
    pub fn open(tgid: i32, tid: i32) -> io::Result<Self> {
        let start_time = start_time(tgid, tid)?;
        // SAFETY: pidfd_open takes two integers and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid, PIDFD_THREAD) };
        let pidfd = if fd >= 0 {
            // SAFETY: `fd` is a fresh descriptor that nothing else owns.
            Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
        } else {
            None
        };
        // Re-check after opening: the pidfd must name the same thread.
        if start_time != self::start_time(tgid, tid)? {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "thread changed while opening",
            ));
        }
        Ok(Self {
            tid,
            tgid,
            start_time,
            pidfd,
        })
    }

    /// True while the thread we opened is alive: then `tid` still names it.
    pub fn is_alive(&self) -> bool {
        match &self.pidfd {
            Some(fd) => {
                let mut pfd = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd, zero timeout.
                let n = unsafe { libc::poll(&mut pfd, 1, 0) };
                // A thread pidfd becomes readable when the thread exits.
                n == 0
            }
            None => start_time(self.tgid, self.tid)
                .map(|t| t == self.start_time)
                .unwrap_or(false),
        }
    }

    /// Same identity check from a recorded (tgid, tid, start time) triple:
    /// used when restoring from a state file of an earlier daemon.
    pub fn matches_recorded(tgid: i32, tid: i32, recorded_start: u64) -> bool {
        start_time(tgid, tid)
            .map(|t| t == recorded_start)
            .unwrap_or(false)
    }
}

/// Start time (clock ticks since boot) of thread `tid` of process `tgid`.
pub fn start_time(tgid: i32, tid: i32) -> io::Result<u64> {
    let stat = fs::read_to_string(format!("/proc/{tgid}/task/{tid}/stat"))?;
    parse_start_time(&stat).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{tgid}/task/{tid}/stat: unparsable"),
        )
    })
}

/// Field 22 of a /proc stat line. The comm (field 2) may contain spaces and
/// parentheses, so fields are counted after its last ')'.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ')' come fields 3.. ; start time is field 22 => index 19.
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_read_after_a_comm_with_spaces_and_parens() {
        let stat =
            "1234 (CPU 0/KVM) (x)) S 1 1234 1234 0 -1 4194560 0 0 0 0 5 6 0 0 20 0 3 0 98765 0 0";

        assert_eq!(parse_start_time(stat), Some(98765));
    }

    #[test]
    fn own_thread_params_read_back_what_was_set() {
        let tid = gettid();
        let before = get_params(tid).unwrap();
        let nicer = ThreadParams {
            nice: before.nice.max(1),
            ..before
        };

        set_params(tid, &nicer).unwrap();

        assert_eq!(get_params(tid).unwrap().nice, nicer.nice);
    }

    #[test]
    fn handle_of_a_live_thread_is_alive_and_of_an_exited_one_is_not() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(gettid()).unwrap();
            done_rx.recv().ok();
        });
        let tid = rx.recv().unwrap();
        let handle = ThreadHandle::open(std::process::id() as i32, tid).unwrap();
        assert!(handle.is_alive());

        done_tx.send(()).unwrap();
        t.join().unwrap();

        assert!(!handle.is_alive());
    }

    #[test]
    fn a_thread_of_another_process_is_refused() {
        assert!(ThreadHandle::open(1, gettid()).is_err());
    }

    fn gettid() -> i32 {
        // SAFETY: gettid has no arguments and cannot fail.
        unsafe { libc::gettid() }
    }
}
