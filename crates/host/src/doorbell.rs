//! Guest doorbells: for a VM whose QEMU has an `ivshmem-doorbell` device,
//! the eventfd of the host's vector (`pvsched_base::ivshmem`), which the
//! guest rings when it clears the reason for a boost in force.
//!
//! pvschedd's own ivshmem server (`crate::ivshmem_server`) hands it the
//! doorbells of the VMs that connect to its socket. Anyone else who serves
//! the ivshmem protocol to a QEMU (it must be there when QEMU starts, and
//! QEMU cannot reconnect to a new server) keeps the eventfd and hands it to
//! pvschedd at start: `pvschedd --doorbell NAME=FD`. A VM with
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

/// Every doorbell pvschedd has (given at start, or from its ivshmem server
/// as VMs connect), each registered one-shot in the event loop's epoll set
/// under a token of its own, so that a ring is handled at most once per
/// `doorbell_interval_us`: a guest writing its Doorbell register in a loop
/// wakes the FIFO event thread no more often than that (by default, as often
/// as the recheck timer the doorbell replaces would). Sparse rings are
/// re-armed at once, without a timer.
pub struct Doorbells {
    /// Doorbell slot `i`'s epoll token is `token_base + i`; a freed slot is
    /// reused.
    bells: Vec<Option<Bell>>,
    token_base: u64,
}

struct Bell {
    d: Doorbell,
    /// When it is armed again after its last ring (`u64::MAX`: armed).
    rearm_at: u64,
    /// When its last ring was handled (0: never).
    last_ring: u64,
}

impl Doorbells {
    pub fn new(bells: Vec<Doorbell>, token_base: u64) -> Self {
        Self {
            bells: bells
                .into_iter()
                .map(|d| {
                    Some(Bell {
                        d,
                        rearm_at: u64::MAX,
                        last_ring: 0,
                    })
                })
                .collect(),
            token_base,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.bells.iter().all(Option::is_none)
    }

    /// Whether VM `vm` has a doorbell.
    pub fn serves(&self, vm: &str) -> bool {
        self.bells.iter().flatten().any(|b| b.d.vm == vm)
    }

    /// The doorbell an epoll token names.
    pub fn of_token(&self, token: u64) -> Option<usize> {
        let i = usize::try_from(token.checked_sub(self.token_base)?).ok()?;
        self.bells.get(i)?.as_ref().map(|_| i)
    }

    fn event(&self, i: usize) -> EpollEvent {
        EpollEvent::new(
            EpollFlags::EPOLLIN | EpollFlags::EPOLLONESHOT,
            self.token_base + i as u64,
        )
    }

    /// Adds every doorbell to `epoll`, armed.
    pub fn register(&self, epoll: &Epoll) -> nix::Result<()> {
        for (i, b) in self.bells.iter().enumerate() {
            if let Some(b) = b {
                epoll.add(b.d.fd.as_fd(), self.event(i))?;
            }
        }
        Ok(())
    }

    /// Adds a doorbell that arrived while serving (a VM that connected to the
    /// ivshmem server), armed; it replaces one of the same VM.
    pub fn add(&mut self, epoll: &Epoll, d: Doorbell) -> nix::Result<()> {
        self.remove(epoll, &d.vm)?;
        let i = match self.bells.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.bells.push(None);
                self.bells.len() - 1
            }
        };
        epoll.add(d.fd.as_fd(), self.event(i))?;
        self.bells[i] = Some(Bell {
            d,
            rearm_at: u64::MAX,
            last_ring: 0,
        });
        Ok(())
    }

    /// Drops VM `vm`'s doorbell, if it has one.
    pub fn remove(&mut self, epoll: &Epoll, vm: &str) -> nix::Result<()> {
        for slot in &mut self.bells {
            if slot.as_ref().is_some_and(|b| b.d.vm == vm) {
                if let Some(b) = slot.take() {
                    epoll.delete(b.d.fd.as_fd())?;
                }
            }
        }
        Ok(())
    }

    /// When the next disarmed doorbell is to be armed again.
    pub fn next_rearm(&self) -> Option<u64> {
        self.bells.iter().flatten().map(|b| b.rearm_at).min()
    }

    /// Arms again, in `epoll`, each doorbell whose pause after a ring is over
    /// at `now`.
    pub fn rearm(&mut self, epoll: &Epoll, now: u64) -> nix::Result<()> {
        for i in 0..self.bells.len() {
            let mut ev = self.event(i);
            let Some(b) = self.bells[i].as_mut() else {
                continue;
            };
            if b.rearm_at > now {
                continue;
            }
            b.rearm_at = u64::MAX;
            epoll.modify(b.d.fd.as_fd(), &mut ev)?;
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
        let b = self.bells.get_mut(i)?.as_mut()?;
        let last = b.last_ring;
        if last != 0 && now < last.saturating_add(interval_ns) {
            metrics.wakeups_doorbell.inc();
            b.rearm_at = last + interval_ns;
            return None;
        }
        b.last_ring = now;
        b.rearm_at = if last == 0 || now - last >= 2 * interval_ns {
            now
        } else {
            now + interval_ns
        };
        let rings = match ivshmem::drain(b.d.fd.as_fd()) {
            Ok(n) => n,
            Err(e) => {
                warn!(vm = %b.d.vm, error = %e, "doorbell read failed");
                0
            }
        };
        if rings == 0 {
            return None;
        }
        metrics.wakeups_doorbell.inc();
        metrics.doorbell_rings.inc_by(rings);
        Some(&b.d.vm)
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
