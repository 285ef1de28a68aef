//! Another process's descriptors: a process pidfd, a copy of one of its
//! descriptors (`pidfd_getfd`, Linux 5.6+, needs ptrace access to it), and
//! an eventfd found among them by its kernel id (`eventfd-id` in fdinfo,
//! Linux 5.18+). pvschedd's ivshmem server uses these to take back, after a
//! restart, the doorbell eventfd it had handed to a QEMU that is still
//! running: QEMU cannot reconnect to a new server, but holds the eventfd.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// A pidfd for process `pid` (not a thread pidfd): readable once it exits.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether the process of `pidfd` has exited.
pub fn has_exited(pidfd: BorrowedFd<'_>) -> bool {
    let mut pfd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n != 0
}

/// A copy, in this process (close-on-exec), of descriptor `target` of the
/// process `pidfd` names.
pub fn copy_fd(pidfd: BorrowedFd<'_>, target: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_getfd takes three integers and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The `eventfd-id` field of an fdinfo text, if it has one.
pub fn parse_eventfd_id(fdinfo: &str) -> Option<u64> {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("eventfd-id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The kernel's id of our eventfd `fd` (`None`: not an eventfd, or a kernel
/// older than 5.18 that shows no id).
pub fn eventfd_id(fd: BorrowedFd<'_>) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    parse_eventfd_id(&text)
}

/// The descriptor number under which process `pid` holds the eventfd whose
/// kernel id is `id`, if it holds it.
pub fn find_eventfd(pid: i32, id: u64) -> io::Result<Option<RawFd>> {
    for entry in fs::read_dir(format!("/proc/{pid}/fdinfo"))?.flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        // A descriptor closed since the listing is just not it.
        let Ok(text) = fs::read_to_string(entry.path()) else {
            continue;
        };
        if parse_eventfd_id(&text) == Some(id) {
            return Ok(Some(fd));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ivshmem;
    use std::os::fd::AsFd;

    #[test]
    fn an_eventfd_is_found_by_its_id_and_its_copy_shares_the_counter() {
        let e = ivshmem::eventfd().unwrap();
        let Some(id) = eventfd_id(e.as_fd()) else {
            return; // a kernel before 5.18 shows no id: nothing to find by
        };
        let me = pidfd_open(std::process::id() as i32).unwrap();

        let fd = find_eventfd(std::process::id() as i32, id).unwrap();
        let copy = copy_fd(me.as_fd(), fd.unwrap()).unwrap();

        ivshmem::ring(copy.as_fd()).unwrap();
        assert_eq!(ivshmem::drain(e.as_fd()).unwrap(), 1);
        assert!(!has_exited(me.as_fd()));
    }

    #[test]
    fn an_id_no_descriptor_has_is_not_found() {
        let text = "pos:\t0\nflags:\t02\nmnt_id:\t17\nino:\t1\neventfd-count: 0\neventfd-id: 42\n";
        assert_eq!(parse_eventfd_id(text), Some(42));
        assert_eq!(parse_eventfd_id("pos:\t0\n"), None);
        assert_eq!(
            find_eventfd(std::process::id() as i32, u64::MAX).unwrap(),
            None
        );
    }

    #[test]
    fn an_exited_child_is_seen_through_its_pidfd() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pidfd = pidfd_open(child.id() as i32).unwrap();
        child.wait().unwrap();
        assert!(has_exited(pidfd.as_fd()));
    }
}
