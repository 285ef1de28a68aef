//! Thread identity: thread ids are reused, so a thread is named by (tgid,
//! tid, start time) and, where the kernel has thread pidfds (6.9+), held by
//! a pidfd. Also the threads of a process, from /proc.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The calling thread's id.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// `PIDFD_THREAD` (= O_EXCL): a pidfd for a thread rather than a process.
const PIDFD_THREAD: u32 = libc::O_EXCL as u32;

/// A thread we found, held so that its id is never mistaken for a later
/// thread's.
#[derive(Debug)]
pub struct ThreadHandle {
    pub tid: i32,
    pub tgid: i32,
    /// Field 22 of /proc/<tid>/stat: start time in clock ticks since boot.
    pub start_time: u64,
    pidfd: Option<OwnedFd>,
}

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

    /// Whether every thread of `handles` is alive: one `poll` over those
    /// held by a pidfd, the /proc check for the others.
    pub fn all_alive(handles: &[ThreadHandle]) -> bool {
        let mut polled: Vec<libc::pollfd> = handles
            .iter()
            .filter_map(|h| h.pidfd.as_ref())
            .map(|fd| libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        if !polled.is_empty() {
            // SAFETY: `polled` holds polled.len() valid pollfds; zero
            // timeout.
            let n = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, 0) };
            // A thread pidfd becomes readable when the thread exits.
            if n != 0 {
                return false;
            }
        }
        handles
            .iter()
            .filter(|h| h.pidfd.is_none())
            .all(ThreadHandle::is_alive)
    }

    /// Same identity check from a recorded (tgid, tid, start time) triple:
    /// used when restoring from a state file of an earlier process.
    pub fn matches_recorded(tgid: i32, tid: i32, recorded_start: u64) -> bool {
        start_time(tgid, tid)
            .map(|t| t == recorded_start)
            .unwrap_or(false)
    }
}

/// Start time (clock ticks since boot) of thread `tid` of process `tgid`.
pub fn start_time(tgid: i32, tid: i32) -> io::Result<u64> {
    let stat = crate::procfs::read_to_string(format!("/proc/{tgid}/task/{tid}/stat"))?;
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

/// The process a thread belongs to, from /proc/<tid>/status.
pub fn tgid_of(tid: i32) -> io::Result<i32> {
    let status = crate::procfs::read_to_string(format!("/proc/{tid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("/proc/{tid}/status: no Tgid"),
            )
        })
}

/// Every thread of process `pid` with its name: (tid, comm), sorted by tid.
/// Threads that exit while the directory is read are left out.
pub fn threads_of(pid: i32) -> io::Result<Vec<(i32, String)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(entry) = entry else { continue };
        let Some(tid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(comm) = fs::read_to_string(entry.path().join("comm")) else {
            continue;
        };
        out.push((tid, comm.trim_end_matches('\n').to_string()));
    }
    out.sort();
    Ok(out)
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

    /// Whether `cond` holds within 5 s. A joined thread has cleared its
    /// tid but may still be listed in /proc for a moment (its release
    /// comes after), which the kernels without thread pidfds are read by.
    fn eventually(cond: impl Fn() -> bool) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if cond() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        cond()
    }

    /// A thread of this process that lives until `done` is sent: its id,
    /// `done`, and the thread to join.
    fn parked_thread() -> (
        i32,
        std::sync::mpsc::Sender<()>,
        std::thread::JoinHandle<()>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(gettid()).unwrap();
            done_rx.recv().ok();
        });
        (rx.recv().unwrap(), done_tx, t)
    }

    #[test]
    fn handle_of_a_live_thread_is_alive_and_of_an_exited_one_is_not() {
        let (tid, done_tx, t) = parked_thread();
        let handle = ThreadHandle::open(std::process::id() as i32, tid).unwrap();
        assert!(handle.is_alive());

        done_tx.send(()).unwrap();
        t.join().unwrap();

        assert!(eventually(|| !handle.is_alive()));
    }

    #[test]
    fn handles_are_all_alive_until_one_thread_exits() {
        let (tid, done_tx, t) = parked_thread();
        let pid = std::process::id() as i32;
        let handles = [
            ThreadHandle::open(pid, pid).unwrap(),
            ThreadHandle::open(pid, tid).unwrap(),
        ];
        assert!(ThreadHandle::all_alive(&handles));

        done_tx.send(()).unwrap();
        t.join().unwrap();

        assert!(eventually(|| !ThreadHandle::all_alive(&handles)));
        assert!(ThreadHandle::all_alive(&handles[..1]));
    }

    #[test]
    fn a_thread_of_another_process_is_refused() {
        assert!(ThreadHandle::open(1, gettid()).is_err());
    }

    #[test]
    fn own_threads_are_listed_with_their_names() {
        let me = std::process::id() as i32;
        let threads = threads_of(me).unwrap();

        assert!(threads.iter().any(|(tid, _)| *tid == gettid()));
        assert_eq!(tgid_of(gettid()).unwrap(), me);
    }
}
