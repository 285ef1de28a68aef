//! The ivshmem server's side of QEMU's `ivshmem-doorbell` protocol, and the
//! eventfd the guest rings the host with.
//!
//! `ivshmem-doorbell` takes its memory and its peers' eventfds from a server
//! on a Unix socket (QEMU `docs/specs/ivshmem-spec.rst`): on connect the
//! server sends the protocol version (0), the client's ID, -1 with the
//! shared memory's fd, then for each other peer its ID once per interrupt
//! vector, each with an eventfd. A guest write of `peer << 16 | vector` into
//! the device's Doorbell register makes QEMU signal that eventfd. pvsched's
//! host is such a peer with one vector: the daemon waits on the eventfd.
//!
//! Each message is one little-endian `i64`, and at most one fd (SCM_RIGHTS).
//! QEMU reads the first three synchronously while it creates the device, so
//! the server must answer while QEMU starts; a client cannot reconnect to a
//! restarted server, so whoever starts the VM keeps the eventfd and may hand
//! it to every pvschedd it starts (`pvschedd --doorbell NAME=FD`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The protocol version this module speaks.
pub const PROTOCOL_VERSION: i64 = 0;
/// The client ID a VMM gets: its own, never rung by pvsched.
pub const CLIENT_ID: u16 = 1;
/// The host's peer ID: the guest rings `HOST_PEER << 16 | HOST_VECTOR`.
pub const HOST_PEER: u16 = 0;
/// The one vector the host listens on.
pub const HOST_VECTOR: u16 = 0;

/// Sends one message: `value`, with `fd` attached if any.
fn send(stream: &UnixStream, value: i64, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let bytes = value.to_le_bytes();
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // u64 storage keeps the control buffer aligned for a cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid; the fields set below point at live
    // buffers (`iov`, `control`) that outlive the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE only computes a size.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        debug_assert!(space <= std::mem::size_of_val(&control));
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points at `space` writable, aligned bytes, so
        // CMSG_FIRSTHDR returns a header inside them, and CMSG_DATA of it has
        // room for one RawFd (CMSG_SPACE above).
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd.as_raw_fd());
        }
    }
    // SAFETY: msg is fully initialised above; the socket fd is open.
    let n = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != bytes.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "ivshmem message sent in part",
        ));
    }
    Ok(())
}

/// Serves one `ivshmem-doorbell` client that just connected: the version, its
/// ID ([`CLIENT_ID`]), the region's fd (`region`, opened read-write: QEMU maps
/// it shared, and its size becomes BAR2's), then the host as peer
/// [`HOST_PEER`] with `host_vectors` (one eventfd per vector). The client
/// gets no vectors of its own: nothing here interrupts the guest.
pub fn serve_client(
    stream: &UnixStream,
    region: BorrowedFd<'_>,
    host_vectors: &[BorrowedFd<'_>],
) -> io::Result<()> {
    send(stream, PROTOCOL_VERSION, None)?;
    send(stream, i64::from(CLIENT_ID), None)?;
    send(stream, -1, Some(region))?;
    for fd in host_vectors {
        send(stream, i64::from(HOST_PEER), Some(*fd))?;
    }
    Ok(())
}

/// Receives one message as QEMU's ivshmem device does: the value and the
/// descriptor attached, if any. The client's side, for tests and the fake VMM.
pub fn recv(stream: &UnixStream) -> io::Result<(i64, Option<OwnedFd>)> {
    let mut bytes = [0u8; 8];
    let mut iov = libc::iovec {
        iov_base: bytes.as_mut_ptr().cast(),
        iov_len: 8,
    };
    let mut control = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid; the fields set below point at live
    // buffers that outlive the recvmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: msg is fully initialised; the socket fd is open.
    let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n != 8 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("ivshmem message of {n} bytes"),
        ));
    }
    // SAFETY: msg was filled by recvmsg; CMSG_FIRSTHDR returns null or a
    // header inside `control`.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    // SAFETY: a non-null header from recvmsg with SCM_RIGHTS carries at
    // least one descriptor, now ours.
    let fd = (!cmsg.is_null()
        && unsafe {
            (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS
        })
    .then(|| unsafe {
        OwnedFd::from_raw_fd(std::ptr::read_unaligned(
            libc::CMSG_DATA(cmsg).cast::<RawFd>(),
        ))
    });
    Ok((i64::from_le_bytes(bytes), fd))
}

/// What a client is served ([`serve_client`]), as it receives it.
pub struct Served {
    pub id: i64,
    pub shm: OwnedFd,
    /// The host peer's vectors.
    pub host_vectors: Vec<OwnedFd>,
}

/// The client's side of [`serve_client`] with `vectors` host vectors:
/// checks the version, the order and that each fd is there.
pub fn client_handshake(stream: &UnixStream, vectors: usize) -> io::Result<Served> {
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let (version, _) = recv(stream)?;
    if version != PROTOCOL_VERSION {
        return Err(bad(format!("protocol version {version}")));
    }
    let (id, _) = recv(stream)?;
    let (minus_one, shm) = recv(stream)?;
    let shm = shm
        .filter(|_| minus_one == -1)
        .ok_or_else(|| bad(format!("expected -1 and the memory, got {minus_one}")))?;
    let mut host_vectors = Vec::new();
    for _ in 0..vectors {
        let (peer, fd) = recv(stream)?;
        let fd = fd
            .filter(|_| peer == i64::from(HOST_PEER))
            .ok_or_else(|| bad(format!("expected a vector of peer {HOST_PEER}, got {peer}")))?;
        host_vectors.push(fd);
    }
    Ok(Served {
        id,
        shm,
        host_vectors,
    })
}

/// A new non-blocking, close-on-exec eventfd.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd has no memory-safety preconditions.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `fd` is an eventfd (`/proc/self/fd/N` names `anon_inode:[eventfd]`).
pub fn is_eventfd(fd: BorrowedFd<'_>) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|p| p.as_os_str() == "anon_inode:[eventfd]")
}

/// Makes `fd` non-blocking.
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: fcntl on an fd we borrow; F_GETFL/F_SETFL touch no memory.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Reads an eventfd's counter (the rings since the last read); 0 when it
/// was not signalled (non-blocking fd).
pub fn drain(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut v = 0u64;
    // SAFETY: reads 8 bytes into a u64 we own.
    let n = unsafe { libc::read(fd.as_raw_fd(), (&raw mut v).cast(), 8) };
    if n == 8 {
        return Ok(v);
    }
    let e = io::Error::last_os_error();
    if n < 0 && e.kind() == io::ErrorKind::WouldBlock {
        return Ok(0);
    }
    if n < 0 {
        Err(e)
    } else {
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "short eventfd read",
        ))
    }
}

/// Signals an eventfd once (what QEMU does for a guest's doorbell write).
pub fn ring(fd: BorrowedFd<'_>) -> io::Result<()> {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a u64 we own.
    let n = unsafe { libc::write(fd.as_raw_fd(), (&raw const one).cast(), 8) };
    if n == 8 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Hands `fd` to the program `cmd` runs as its descriptor `target` (for
/// `pvschedd --doorbell NAME=TARGET`); the parent's copy is untouched.
/// `target` should be above 2 and distinct per call.
pub fn pass_fd(cmd: &mut Command, fd: BorrowedFd<'_>, target: RawFd) {
    let src = fd.as_raw_fd();
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls dup2/fcntl, which are async-signal-safe; `src` stays open in the
    // parent until spawn returns, so it is open in the child.
    unsafe {
        cmd.pre_exec(move || {
            if src == target {
                // dup2 onto itself keeps FD_CLOEXEC: clear it instead.
                let flags = libc::fcntl(target, libc::F_GETFD);
                if flags < 0 || libc::fcntl(target, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::dup2(src, target) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Borrows a raw descriptor number received from a parent (`--doorbell`):
/// takes ownership of it if it is open.
///
/// # Safety
/// `fd` must not be owned by anything else in this process.
pub unsafe fn adopt_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_GETFD only asks whether the descriptor is open.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open (checked above) and, by the caller's promise, ours alone.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: F_SETFD on an fd we own: close it on exec from now on.
    unsafe { libc::fcntl(owned.as_fd().as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok(owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_client_gets_version_id_region_and_the_host_vector_in_that_order() {
        let (server, client) = UnixStream::pair().unwrap();
        let region = tempfile_with(b"region bytes");
        let host = eventfd().unwrap();

        serve_client(&server, region.as_fd(), &[host.as_fd()]).unwrap();

        let served = client_handshake(&client, 1).unwrap();
        assert_eq!(served.id, i64::from(CLIENT_ID));
        let mut text = String::new();
        std::fs::File::from(served.shm)
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "region bytes");
        // QEMU writes 1 to the vector's eventfd for a doorbell: the host reads it.
        ring(served.host_vectors[0].as_fd()).unwrap();
        assert_eq!(drain(host.as_fd()).unwrap(), 1);
        assert_eq!(drain(host.as_fd()).unwrap(), 0);
    }

    #[test]
    fn a_client_told_of_no_memory_fails_its_handshake() {
        let (server, client) = UnixStream::pair().unwrap();
        send(&server, PROTOCOL_VERSION, None).unwrap();
        send(&server, i64::from(CLIENT_ID), None).unwrap();
        send(&server, -1, None).unwrap();

        assert!(client_handshake(&client, 1).is_err());
    }

    #[test]
    fn only_an_eventfd_is_taken_for_one() {
        let e = eventfd().unwrap();
        let f = tempfile_with(b"");

        assert!(is_eventfd(e.as_fd()));
        assert!(!is_eventfd(f.as_fd()));
    }

    fn tempfile_with(bytes: &[u8]) -> std::fs::File {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("pvsched-ivshmem-test-{}-{n}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        f
    }
}
