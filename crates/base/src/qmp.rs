//! A small QMP client (QEMU Machine Protocol over a Unix socket): greeting,
//! capabilities negotiation, synchronous commands. Every read is bounded in
//! size and every exchange in time, so a VMM that misbehaves cannot stall or
//! exhaust the caller; the peer's credentials are kept for the caller to check.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The largest QMP message accepted: `query-cpus-fast` for 4096 vCPUs is
/// well under 1 MiB.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Asynchronous events skipped while waiting for one reply.
const MAX_SKIPPED_MESSAGES: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP {path}: {command}: {error}")]
    Command {
        path: PathBuf,
        command: String,
        error: String,
    },
    #[error("QMP {path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
    #[error("QMP {path}: {msg}")]
    Protocol { path: PathBuf, msg: String },
    #[error("QMP {path}: no complete reply within {timeout:?}")]
    Timeout { path: PathBuf, timeout: Duration },
}

/// Credentials of the process at the other end of a Unix socket
/// (`SO_PEERCRED`, taken when it connected or listened).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// `SO_PEERCRED` of a connected Unix socket.
pub fn peer_cred(stream: &UnixStream) -> io::Result<PeerCred> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, which is a
    // valid, owned ucred of that size.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// Connects to the Unix socket at `path` before `deadline`. A listener that
/// does not accept (a hung VMM, or QEMU serving another QMP client) fills its
/// backlog, and a blocking `connect` then waits forever: this one is
/// non-blocking and retries until the deadline.
fn connect_before(path: &Path, deadline: Instant) -> io::Result<UnixStream> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is a plain C struct for which all zeroes is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a Unix socket path (too long, or a NUL byte)",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len =
        (std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: socket takes integers and returns a new descriptor or -1.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    loop {
        // SAFETY: `addr` is a valid sockaddr_un and `len` does not exceed it.
        let rc = unsafe { libc::connect(fd.as_raw_fd(), (&raw const addr).cast(), len) };
        if rc == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            // A Unix socket's backlog is full: no in-progress state to wait
            // on, so try again shortly.
            Some(libc::EAGAIN) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the listener accepts no connection",
                    ));
                }
                std::thread::sleep(left.min(Duration::from_millis(10)));
            }
            _ => return Err(e),
        }
    }
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// One QMP connection, negotiated and ready for commands.
pub struct Qmp {
    path: PathBuf,
    stream: UnixStream,
    peer: PeerCred,
    timeout: Duration,
    /// Bytes read past the last complete message.
    pending: Vec<u8>,
}

impl Qmp {
    /// Connects, reads the greeting and negotiates capabilities; `timeout`
    /// bounds the whole of each exchange (this one and every command's).
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self, QmpError> {
        let io = |op, source| QmpError::Io {
            path: path.to_path_buf(),
            op,
            source,
        };
        let deadline = Instant::now() + timeout;
        let stream = match connect_before(path, deadline) {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                return Err(QmpError::Timeout {
                    path: path.to_path_buf(),
                    timeout,
                })
            }
            Err(e) => return Err(io("connect", e)),
        };
        stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| io("set timeout", e))?;
        let peer = peer_cred(&stream).map_err(|e| io("SO_PEERCRED", e))?;
        let mut qmp = Self {
            path: path.to_path_buf(),
            stream,
            peer,
            timeout,
            pending: Vec::new(),
        };
        let greeting = qmp.read_message(deadline)?;
        if greeting.get("QMP").is_none() {
            return Err(qmp.protocol(format!("unexpected greeting {greeting}")));
        }
        qmp.execute("qmp_capabilities")?;
        Ok(qmp)
    }

    /// The VMM end of the socket, as the kernel reports it.
    pub fn peer(&self) -> PeerCred {
        self.peer
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn protocol(&self, msg: String) -> QmpError {
        QmpError::Protocol {
            path: self.path.clone(),
            msg,
        }
    }

    /// Reads one newline-terminated JSON message, at most
    /// [`MAX_MESSAGE_BYTES`], before `deadline`.
    fn read_message(&mut self, deadline: Instant) -> Result<Value, QmpError> {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(nl) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=nl).collect();
                return serde_json::from_slice(&line)
                    .map_err(|e| self.protocol(format!("bad JSON: {e}")));
            }
            if self.pending.len() > MAX_MESSAGE_BYTES {
                return Err(self.protocol(format!("message longer than {MAX_MESSAGE_BYTES} bytes")));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(QmpError::Timeout {
                    path: self.path.clone(),
                    timeout: self.timeout,
                });
            }
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| QmpError::Io {
                    path: self.path.clone(),
                    op: "set timeout",
                    source: e,
                })?;
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(self.protocol("connection closed".into())),
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(QmpError::Timeout {
                        path: self.path.clone(),
                        timeout: self.timeout,
                    })
                }
                Err(e) => {
                    return Err(QmpError::Io {
                        path: self.path.clone(),
                        op: "read",
                        source: e,
                    })
                }
            }
        }
    }

    /// Sends one request object and returns the reply message (the object
    /// with `return` or `error`); asynchronous events meanwhile are skipped.
    pub fn request(&mut self, request: &Value) -> Result<Value, QmpError> {
        let deadline = Instant::now() + self.timeout;
        let mut line = request.to_string();
        line.push('\n');
        self.stream
            .write_all(line.as_bytes())
            .map_err(|e| QmpError::Io {
                path: self.path.clone(),
                op: "write",
                source: e,
            })?;
        for _ in 0..MAX_SKIPPED_MESSAGES {
            let msg = self.read_message(deadline)?;
            if msg.get("return").is_some() || msg.get("error").is_some() {
                return Ok(msg);
            }
        }
        Err(self.protocol(format!("no reply among {MAX_SKIPPED_MESSAGES} messages")))
    }

    /// Runs `command` without arguments and returns its `return` value.
    pub fn execute(&mut self, command: &str) -> Result<Value, QmpError> {
        let reply = self.request(&serde_json::json!({ "execute": command }))?;
        match reply.get("return") {
            Some(ret) => Ok(ret.clone()),
            None => Err(QmpError::Command {
                path: self.path.clone(),
                command: command.to_string(),
                error: reply.get("error").map(Value::to_string).unwrap_or_default(),
            }),
        }
    }

    /// `query-cpus-fast`: (vCPU index, thread id) as the VMM reports them,
    /// sorted by index; entries out of range are errors.
    pub fn vcpu_thread_ids(&mut self) -> Result<Vec<(u32, i32)>, QmpError> {
        let cpus = self.execute("query-cpus-fast")?;
        let list = cpus
            .as_array()
            .ok_or_else(|| self.protocol("query-cpus-fast: not a list".into()))?;
        let mut vcpus = Vec::with_capacity(list.len());
        for cpu in list {
            let idx = cpu.get("cpu-index").and_then(Value::as_u64);
            let tid = cpu.get("thread-id").and_then(Value::as_i64);
            match (idx, tid) {
                (Some(i), Some(t))
                    if i < u64::from(u32::MAX) && t > 0 && t <= i64::from(i32::MAX) =>
                {
                    vcpus.push((i as u32, t as i32))
                }
                _ => return Err(self.protocol(format!("query-cpus-fast: bad entry {cpu}"))),
            }
        }
        vcpus.sort_unstable();
        Ok(vcpus)
    }

    /// `query-kvm`: whether KVM runs the guest (`None` if the VMM does not say).
    pub fn kvm_enabled(&mut self) -> Option<bool> {
        self.execute("query-kvm")
            .ok()
            .and_then(|v| v.get("enabled").and_then(Value::as_bool))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::os::unix::net::UnixListener;

    /// A fake VMM on a socket in a fresh directory: greets, then answers
    /// each request line with the next of `replies`.
    fn fake_vmm(replies: Vec<String>) -> (tempdir::Dir, std::thread::JoinHandle<()>) {
        let dir = tempdir::Dir::new();
        let listener = UnixListener::bind(dir.path().join("qmp.sock")).unwrap();
        let t = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let mut w = conn.try_clone().unwrap();
            let mut r = std::io::BufReader::new(conn);
            w.write_all(b"{\"QMP\": {\"version\": {}}}\n").unwrap();
            for reply in replies {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                if w.write_all(reply.as_bytes()).is_err() {
                    return;
                }
            }
            // Hold the connection until the client is done.
            let mut rest = Vec::new();
            let _ = r.read_to_end(&mut rest);
        });
        (dir, t)
    }

    mod tempdir {
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let p = std::env::temp_dir()
                    .join(format!("pvsched-base-qmp-{}-{n}", std::process::id()));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn vcpu_thread_ids_come_sorted_from_query_cpus_fast() {
        let (dir, t) = fake_vmm(vec![
            "{\"return\": {}}\n".into(),
            "{\"event\": \"RESUME\"}\n{\"return\": [{\"cpu-index\": 1, \"thread-id\": 11}, {\"cpu-index\": 0, \"thread-id\": 10}]}\n".into(),
        ]);
        let mut q = Qmp::connect(&dir.path().join("qmp.sock"), Duration::from_secs(5)).unwrap();

        assert_eq!(q.vcpu_thread_ids().unwrap(), vec![(0, 10), (1, 11)]);
        assert_eq!(q.peer().pid, std::process::id() as i32);
        drop(q);
        t.join().unwrap();
    }

    #[test]
    fn a_reply_that_never_ends_is_cut_off_by_size() {
        let huge = format!("{{\"return\": \"{}", "x".repeat(MAX_MESSAGE_BYTES + 10));
        let (dir, t) = fake_vmm(vec![huge]);

        let err = Qmp::connect(&dir.path().join("qmp.sock"), Duration::from_secs(20))
            .err()
            .unwrap();

        assert!(err.to_string().contains("longer than"), "{err}");
        drop(dir);
        let _ = t.join();
    }

    #[test]
    fn a_silent_peer_times_out() {
        let (dir, t) = fake_vmm(vec![]);
        let started = Instant::now();

        let err = Qmp::connect(&dir.path().join("qmp.sock"), Duration::from_millis(300))
            .err()
            .unwrap();

        assert!(matches!(err, QmpError::Timeout { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        drop(dir);
        let _ = t.join();
    }

    #[test]
    fn a_listener_that_never_accepts_times_out_at_connect() {
        use std::os::fd::AsRawFd;
        let dir = tempdir::Dir::new();
        let path = dir.path().join("qmp.sock");
        let listener = UnixListener::bind(&path).unwrap();
        // SAFETY: listen on our own listening socket: a backlog of 0 lets
        // one connection wait unaccepted, the next finds it full.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
        let _queued = UnixStream::connect(&path).unwrap();
        let started = Instant::now();

        let err = Qmp::connect(&path, Duration::from_millis(300))
            .err()
            .unwrap();

        assert!(matches!(err, QmpError::Timeout { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn bad_entries_in_query_cpus_fast_are_refused() {
        let (dir, t) = fake_vmm(vec![
            "{\"return\": {}}\n".into(),
            "{\"return\": [{\"cpu-index\": 0, \"thread-id\": -5}]}\n".into(),
        ]);
        let mut q = Qmp::connect(&dir.path().join("qmp.sock"), Duration::from_secs(5)).unwrap();

        assert!(q.vcpu_thread_ids().is_err());
        drop(q);
        t.join().unwrap();
    }
}
