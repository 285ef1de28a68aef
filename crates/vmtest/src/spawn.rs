//! Starting QEMU so that it cannot outlive the test process.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits,
//! not the process. Tests run on short-lived threads and may share a VM, so
//! children are forked by one helper thread that lives as long as the
//! process: QEMU gets SIGKILL when the process dies, even by a signal that
//! skips every `Drop`.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

type Request = (Command, mpsc::Sender<io::Result<Child>>);

static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();

fn spawner() -> &'static Mutex<mpsc::Sender<Request>> {
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("vmtest-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawning the vmtest-spawner thread");
        Mutex::new(tx)
    })
}

/// Spawns `cmd`; the child is killed (SIGKILL) when this process exits.
pub fn spawn_tied(mut cmd: Command) -> io::Result<Child> {
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe system calls.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, tx))
        .map_err(|_| io::Error::other("vmtest-spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("vmtest-spawner thread is gone"))?
}
