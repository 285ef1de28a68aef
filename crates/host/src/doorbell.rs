//! Guest doorbells: for a VM whose QEMU has an `ivshmem-doorbell` device,
//! the eventfd of the host's vector (`pvsched_base::ivshmem`), which the
//! guest rings when it clears the reason for a boost in force.
//!
//! Whoever serves the ivshmem protocol to that QEMU (it must be there when
//! QEMU starts, and QEMU cannot reconnect to a new server) keeps the eventfd
//! and hands it to pvschedd at start: `pvschedd --doorbell NAME=FD`. A VM with
//! a doorbell is offered `F_DOORBELL`, and its boosted vCPUs are not re-read
//! on the recheck timer: the ring says when to look (the 10 ms scan stays).

use std::collections::BTreeSet;
use std::os::fd::{AsFd, OwnedFd, RawFd};

use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use pvsched_base::ivshmem;
use tracing::warn;

use crate::metrics::Metrics;

/// One VM's doorbell.
#[derive(Debug)]
pub struct Doorbell {
    /// The VM's name, as discovery names it.
    pub vm: String,
    /// The host vector's eventfd, non-blocking.
    pub fd: OwnedFd,
}

#[derive(Debug, thiserror::Error)]
pub enum DoorbellError {
    #[error("--doorbell {arg}: VM {vm} named twice")]
    Duplicate { arg: String, vm: String },
    #[error("--doorbell {arg}: descriptor {fd}: {source}")]
    Fd {
        arg: String,
        fd: RawFd,
        source: std::io::Error,
    },
    #[error("--doorbell {arg}: descriptor {fd} is not an eventfd")]
    NotEventfd { arg: String, fd: RawFd },
    #[error("--doorbell {0}: expected NAME=FD with a descriptor number of 3 or more")]
    Syntax(String),
}

/// Parses `NAME=FD` arguments and takes the descriptors: each must be open,
/// an eventfd, and is made non-blocking and close-on-exec.
///
/// # Safety
/// Each FD named must be inherited and not owned by anything in this process
/// (call it at start, before any file is opened).
pub unsafe fn adopt(args: &[String]) -> Result<Vec<Doorbell>, DoorbellError> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for arg in args {
        let (vm, fd) = arg
            .rsplit_once('=')
            .ok_or_else(|| DoorbellError::Syntax(arg.clone()))?;
        let fd: RawFd = fd
            .parse()
            .ok()
            .filter(|&fd| fd >= 3)
            .ok_or_else(|| DoorbellError::Syntax(arg.clone()))?;
        if vm.is_empty() {
            return Err(DoorbellError::Syntax(arg.clone()));
        }
        if !seen.insert(vm.to_string()) {
            return Err(DoorbellError::Duplicate {
                arg: arg.clone(),
                vm: vm.to_string(),
            });
        }
        let err = |source| DoorbellError::Fd {
            arg: arg.clone(),
            fd,
            source,
        };
        // SAFETY: the caller promises the descriptor is inherited and unowned.
        let owned = unsafe { ivshmem::adopt_fd(fd) }.map_err(err)?;
        if !ivshmem::is_eventfd(owned.as_fd()) {
            return Err(DoorbellError::NotEventfd {
                arg: arg.clone(),
                fd,
            });
        }
        ivshmem::set_nonblocking(owned.as_fd()).map_err(err)?;
        out.push(Doorbell {
            vm: vm.to_string(),
            fd: owned,
        });
    }
    Ok(out)
}

/// Every doorbell pvschedd was given, each registered one-shot in the event
/// loop's epoll set under a token of its own, so that a ring is handled at
/// most once per `doorbell_interval_us`: a guest writing its Doorbell
/// register in a loop wakes the FIFO event thread no more often than that
/// (by default, as often as the recheck timer the doorbell replaces would).
/// Sparse rings are re-armed at once, without a timer.
pub struct Doorbells {
    bells: Vec<Doorbell>,
    /// Doorbell `i`'s epoll token is `token_base + i`.
    token_base: u64,
    /// When each doorbell, disarmed by its last ring, is armed again
    /// (`u64::MAX`: armed).
    rearm_at: Vec<u64>,
    /// When each doorbell's last ring was handled (0: never).
    last_ring: Vec<u64>,
}

impl Doorbells {
    pub fn new(bells: Vec<Doorbell>, token_base: u64) -> Self {
        let n = bells.len();
        Self {
            bells,
            token_base,
            rearm_at: vec![u64::MAX; n],
            last_ring: vec![0; n],
        }
    }

    pub fn is_empty(&self) -> bool {
        self.bells.is_empty()
    }

    /// Whether VM `vm` has a doorbell.
    pub fn serves(&self, vm: &str) -> bool {
        self.bells.iter().any(|d| d.vm == vm)
    }

    /// The doorbell an epoll token names.
    pub fn of_token(&self, token: u64) -> Option<usize> {
        let i = usize::try_from(token.checked_sub(self.token_base)?).ok()?;
        (i < self.bells.len()).then_some(i)
    }

    fn event(&self, i: usize) -> EpollEvent {
        EpollEvent::new(
            EpollFlags::EPOLLIN | EpollFlags::EPOLLONESHOT,
            self.token_base + i as u64,
        )
    }

    /// Adds every doorbell to `epoll`, armed.
    pub fn register(&self, epoll: &Epoll) -> nix::Result<()> {
        for (i, d) in self.bells.iter().enumerate() {
            epoll.add(d.fd.as_fd(), self.event(i))?;
        }
        Ok(())
    }

    /// When the next disarmed doorbell is to be armed again.
    pub fn next_rearm(&self) -> Option<u64> {
        self.rearm_at.iter().min().copied()
    }

    /// Arms again, in `epoll`, each doorbell whose pause after a ring is over
    /// at `now`.
    pub fn rearm(&mut self, epoll: &Epoll, now: u64) -> nix::Result<()> {
        for i in 0..self.bells.len() {
            if self.rearm_at[i] > now {
                continue;
            }
            self.rearm_at[i] = u64::MAX;
            epoll.modify(self.bells[i].fd.as_fd(), &mut self.event(i))?;
        }
        Ok(())
    }

    /// Doorbell `i` woke the event loop at `now`: the VM whose guest rang, if
    /// the ring is handled now. A ring less than `interval_ns` after the last
    /// one handled is left pending (the doorbell stays disarmed) until that
    /// interval is over. After a ring handled, the doorbell is re-armed at
    /// once if the one before was at least two intervals earlier (sparse
    /// rings cost one wakeup each, no timer), else one interval later.
    pub fn ring(
        &mut self,
        i: usize,
        now: u64,
        interval_ns: u64,
        metrics: &Metrics,
    ) -> Option<&str> {
        let d = self.bells.get(i)?;
        let last = self.last_ring[i];
        if last != 0 && now < last.saturating_add(interval_ns) {
            metrics.wakeups_doorbell.inc();
            self.rearm_at[i] = last + interval_ns;
            return None;
        }
        self.last_ring[i] = now;
        self.rearm_at[i] = if last == 0 || now - last >= 2 * interval_ns {
            now
        } else {
            now + interval_ns
        };
        let rings = match ivshmem::drain(d.fd.as_fd()) {
            Ok(n) => n,
            Err(e) => {
                warn!(vm = %d.vm, error = %e, "doorbell read failed");
                0
            }
        };
        if rings == 0 {
            return None;
        }
        metrics.wakeups_doorbell.inc();
        metrics.doorbell_rings.inc_by(rings);
        Some(&d.vm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, IntoRawFd};

    #[test]
    fn a_malformed_argument_is_refused_with_its_text() {
        for bad in ["vm", "=5", "vm=", "vm=x", "vm=1", "vm=-4"] {
            // SAFETY: no descriptor is taken for a malformed argument.
            let e = unsafe { adopt(&[bad.to_string()]) }.unwrap_err();
            assert!(matches!(e, DoorbellError::Syntax(ref a) if a == bad), "{e}");
        }
    }

    #[test]
    fn only_an_open_eventfd_is_taken() {
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let not_eventfd = format!("vm={}", file.as_raw_fd());
        let closed = format!("vm={}", 1_000_000);
        let efd = ivshmem::eventfd().unwrap().into_raw_fd();

        // SAFETY: `file` stays owned by the test: the refusal drops the
        // OwnedFd made of it, so the File is forgotten below, not closed twice.
        let e = unsafe { adopt(&[not_eventfd]) }.unwrap_err();
        std::mem::forget(file);
        // SAFETY: not open.
        let c = unsafe { adopt(&[closed]) }.unwrap_err();
        // SAFETY: `efd` was released by into_raw_fd: adopt owns it now.
        let ok = unsafe { adopt(&[format!("a={efd}")]) }.unwrap();

        assert!(matches!(e, DoorbellError::NotEventfd { .. }), "{e}");
        assert!(matches!(c, DoorbellError::Fd { .. }), "{c}");
        assert_eq!(ok.len(), 1);
        assert_eq!(ok[0].vm, "a");
    }

    #[test]
    fn a_vm_named_twice_is_refused() {
        let a = ivshmem::eventfd().unwrap().into_raw_fd();
        let b = ivshmem::eventfd().unwrap().into_raw_fd();

        // SAFETY: both released by into_raw_fd; the first is owned (and
        // closed) by the refused call's partial result, the second leaks.
        let e = unsafe { adopt(&[format!("vm={a}"), format!("vm={b}")]) }.unwrap_err();

        assert!(matches!(e, DoorbellError::Duplicate { .. }), "{e}");
    }
}
