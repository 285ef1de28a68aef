//! Polling fallback: `/proc/<tid>/task/<tid>/stat` of each tracked thread.
//!
//! What it sees: at each poll, whether the thread is `R` (running or
//! runnable: /proc cannot tell which) or blocked (`S`, `D`, ...), and the
//! CPU it last ran on. It reports changes between two polls:
//! blocked -> R as [`EventKind::SwitchIn`], R -> blocked as
//! [`EventKind::SwitchOut`] with `runnable: false`, and the state at the
//! first poll after [`ProcPollSource::try_track`].
//!
//! What it cannot see: anything shorter than the interval (a vCPU that
//! halts and is woken between two polls, a preemption of a few ms), who woke
//! a thread, preemption itself (a preempted thread is still `R`: it never
//! reports `runnable: true`), and KVM exits. Timestamps are the poll's time,
//! up to one interval late.
//!
//! Cost: one pread() of a ~300-byte /proc file per thread per poll
//! (measured: see src/bpf/README.md); nothing allocates after `try_track`.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::time::Duration;

use tracing::debug;

use pvsched_base::clock::monotonic_ns;

use super::{EventKind, EventSourceError, HostEvent};

/// Options of [`ProcPollSource`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PollOptions {
    /// Time between two polls.
    pub interval: Duration,
}

impl Default for PollOptions {
    fn default() -> Self {
        PollOptions {
            interval: Duration::from_millis(1),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Unknown,
    Runnable,
    Blocked,
    Gone,
}

struct Polled {
    tid: u32,
    vm: u32,
    vcpu: u32,
    file: File,
    state: State,
}

/// The polling event source.
pub struct ProcPollSource {
    threads: Vec<Polled>,
    interval_ns: u64,
    next_due_ns: u64,
    timer: OwnedFd,
    buf: [u8; 1024],
    polls: u64,
}

/// `(state, processor)` from a /proc stat line, or None if malformed.
fn parse_stat(line: &[u8]) -> Option<(u8, u32)> {
    // "tid (comm) S ppid ..."; comm may hold spaces and parentheses.
    let close = line.iter().rposition(|&b| b == b')')?;
    let mut fields = line.get(close + 2..)?.split(|&b| b == b' ');
    let state = *fields.next()?.first()?;
    // state is field 3, processor field 39: 35 fields in between.
    let cpu = fields.nth(35)?;
    let mut n: u32 = 0;
    if cpu.is_empty() {
        return None;
    }
    for &d in cpu {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add((d - b'0') as u32)?;
    }
    Some((state, n))
}

impl ProcPollSource {
    pub fn new(opts: PollOptions) -> Result<Self, EventSourceError> {
        if opts.interval.is_zero() {
            return Err(EventSourceError::Invalid("poll interval 0".into()));
        }
        // SAFETY: timerfd_create(2) takes no pointers.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(EventSourceError::Io {
                what: "timerfd_create".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: fd is a new descriptor (checked >= 0 above), owned by nobody else.
        let timer = unsafe { OwnedFd::from_raw_fd(fd) };
        let interval_ns = opts.interval.as_nanos().min(u64::MAX as u128) as u64;
        let mut s = ProcPollSource {
            threads: Vec::new(),
            interval_ns,
            next_due_ns: monotonic_ns() + interval_ns,
            timer,
            buf: [0; 1024],
            polls: 0,
        };
        s.arm()?;
        Ok(s)
    }

    fn arm(&mut self) -> Result<(), EventSourceError> {
        let its = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (self.next_due_ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (self.next_due_ns % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: our own timerfd; the itimerspec outlives the call, no old value asked.
        let r = unsafe {
            libc::timerfd_settime(
                self.timer.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &its,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            return Err(EventSourceError::Io {
                what: "timerfd_settime".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Time between polls.
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval_ns)
    }

    /// Registers thread `tid` as vCPU `vcpu` of VM `vm`; fails if the thread
    /// does not exist.
    pub fn try_track(&mut self, tid: u32, vm: u32, vcpu: u32) -> Result<(), EventSourceError> {
        if tid == 0 {
            return Err(EventSourceError::Invalid("tid 0".into()));
        }
        let path = format!("/proc/{tid}/task/{tid}/stat");
        let file = File::open(&path).map_err(EventSourceError::io(path))?;
        let p = Polled {
            tid,
            vm,
            vcpu,
            file,
            state: State::Unknown,
        };
        match self.threads.iter_mut().find(|t| t.tid == tid) {
            Some(t) => *t = p,
            None => self.threads.push(p),
        }
        Ok(())
    }

    pub fn untrack(&mut self, tid: u32) {
        self.threads.retain(|t| t.tid != tid);
    }

    /// Number of tracked threads (gone ones included until untracked).
    pub fn tracked(&self) -> usize {
        self.threads.len()
    }

    /// The timer descriptor: readable when the next poll is due.
    pub fn fd(&self) -> RawFd {
        self.timer.as_raw_fd()
    }

    /// CLOCK_MONOTONIC ns when the next poll is due.
    pub fn next_poll_ns(&self) -> u64 {
        self.next_due_ns
    }

    /// Polls done so far.
    pub fn polls(&self) -> u64 {
        self.polls
    }

    /// Polls every tracked thread now and reports changes. Allocation-free.
    pub fn sample(&mut self, mut f: impl FnMut(HostEvent)) -> usize {
        let ts_ns = monotonic_ns();
        let mut n = 0;
        self.polls += 1;
        for t in self.threads.iter_mut() {
            if t.state == State::Gone {
                continue;
            }
            let len = match t.file.read_at(&mut self.buf, 0) {
                Ok(0) | Err(_) => {
                    debug!(tid = t.tid, "polled thread is gone");
                    t.state = State::Gone;
                    continue;
                }
                Ok(len) => len,
            };
            let Some((st, cpu)) = parse_stat(&self.buf[..len]) else {
                continue;
            };
            let new = match st {
                b'R' => State::Runnable,
                b'Z' | b'X' | b'x' => State::Gone,
                _ => State::Blocked,
            };
            if new == t.state {
                continue;
            }
            t.state = new;
            let (tid, vm, vcpu) = (t.tid, t.vm, t.vcpu);
            let kind = match new {
                State::Runnable => EventKind::SwitchIn { cpu },
                State::Blocked => EventKind::SwitchOut { runnable: false },
                State::Gone | State::Unknown => continue,
            };
            f(HostEvent {
                ts_ns,
                tid,
                vm,
                vcpu,
                kind,
                // Seen at a poll: late by up to an interval, but no queue.
                quiet: false,
                // Not looked at: the policy's default.
                rivals: true,
                host_rivals: true,
            });
            n += 1;
        }
        n
    }

    /// Polls if a poll is due (and re-arms the timer); never blocks.
    pub fn consume(&mut self, f: impl FnMut(HostEvent)) -> usize {
        let mut expirations = 0u64;
        // Drain the timer so that a level-triggered epoll does not spin.
        // SAFETY: read(2) of 8 bytes into a u64 of ours, from our own timerfd.
        unsafe { libc::read(self.timer.as_raw_fd(), (&raw mut expirations).cast(), 8) };
        let now = monotonic_ns();
        if now < self.next_due_ns {
            return 0;
        }
        let n = self.sample(f);
        // Next due time on the interval grid, skipping missed ticks.
        let behind = (now - self.next_due_ns) / self.interval_ns + 1;
        self.next_due_ns += behind * self.interval_ns;
        if let Err(e) = self.arm() {
            debug!(error = %e, "re-arming the poll timer");
        }
        n
    }

    /// Waits until the next poll is due, at most `timeout`, then consumes.
    pub fn poll(
        &mut self,
        timeout: Duration,
        f: impl FnMut(HostEvent),
    ) -> Result<usize, EventSourceError> {
        let now = monotonic_ns();
        if now < self.next_due_ns {
            let wait = Duration::from_nanos(self.next_due_ns - now).min(timeout);
            super::bpf::wait_readable(self.fd(), wait)?;
        }
        Ok(self.consume(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_stat_lines() {
        let line = b"1234 (CPU 0/KVM) S 1 1234 1234 0 -1 4194624 100 0 0 0 5 6 0 0 20 0 3 0 100 1000 10 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 -1 7 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
        assert_eq!(parse_stat(line), Some((b'S', 7)));
        let line = b"99 (a) b) c) R 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1 1 1 1 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0\n";
        assert_eq!(parse_stat(line), Some((b'R', 1)));
        assert_eq!(parse_stat(b"1 (x) R 1 2"), None);
        assert_eq!(parse_stat(b""), None);
        assert_eq!(parse_stat(b"1 (x)"), None);
    }

    #[test]
    fn own_thread_state() {
        let mut s = ProcPollSource::new(PollOptions::default()).unwrap();
        // SAFETY: gettid(2) has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        s.try_track(tid, 1, 0).unwrap();
        let mut evs = Vec::new();
        s.sample(|e| evs.push(e));
        // We are running while we read our own stat.
        assert!(
            matches!(evs.as_slice(), [HostEvent { tid: t, vm: 1, vcpu: 0, kind: EventKind::SwitchIn { .. }, .. }] if *t == tid),
            "{evs:?}"
        );
        evs.clear();
        s.sample(|e| evs.push(e));
        assert!(evs.is_empty(), "no change, no event: {evs:?}");
        assert!(s.try_track(0, 0, 0).is_err());
    }
}
