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

use pvsched_base::ivshmem;

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
