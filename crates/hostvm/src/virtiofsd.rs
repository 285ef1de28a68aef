//! One virtiofsd per share: QEMU's vhost-user file system server, started
//! before QEMU (which connects to its socket) and killed, by its PID, when
//! the host VM goes. It exits by itself once QEMU disconnects.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{io_err, Error, Result};

/// Debian 12's virtiofsd (package qemu-system-common).
pub const VIRTIOFSD: &str = "/usr/lib/qemu/virtiofsd";

/// How a share's contents may be cached in the host VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cache {
    /// Files do not change under the host VM (the root file system).
    Always,
    /// Both sides write (the exchange folder).
    None,
}

/// A running virtiofsd serving `source` on `socket`.
pub struct Virtiofsd {
    child: Child,
    pub socket: PathBuf,
    pub tag: String,
}

impl Virtiofsd {
    /// Starts virtiofsd for `source` and waits for its socket.
    pub fn start(source: &Path, tag: &str, cache: Cache, dir: &Path) -> Result<Self> {
        if !Path::new(VIRTIOFSD).is_file() {
            return Err(Error::Missing {
                what: VIRTIOFSD.into(),
                hint: "install qemu-system-x86 (`make deps`)".into(),
            });
        }
        let socket = dir.join(format!("virtiofs-{tag}.sock"));
        let log_path = dir.join(format!("virtiofsd-{tag}.log"));
        let log =
            File::create(&log_path).map_err(io_err(format!("creating {}", log_path.display())))?;
        let err = log.try_clone().map_err(io_err("virtiofsd log"))?;
        let mut cmd = Command::new(VIRTIOFSD);
        cmd.arg(format!("--socket-path={}", socket.display()))
            .arg("-o")
            .arg(format!("source={}", source.display()))
            .arg("-o")
            .arg(match cache {
                Cache::Always => "cache=always",
                Cache::None => "cache=none",
            })
            // The namespace sandbox cannot pivot_root into "/".
            .args(["-o", "sandbox=chroot"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        let mut child = pvsched_vmtest::spawn_tied(cmd).map_err(io_err("starting virtiofsd"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                return Err(Error::Other(format!(
                    "virtiofsd for {} exited ({status}): {log}",
                    source.display()
                )));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Other(format!(
                    "virtiofsd for {} made no socket in 10 s",
                    source.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Self {
            child,
            socket,
            tag: tag.to_string(),
        })
    }

    /// QEMU arguments that give the host VM this share.
    pub fn qemu_args(&self, id: usize) -> [String; 4] {
        [
            "-chardev".into(),
            format!("socket,id=vfs{id},path={}", self.socket.display()),
            "-device".into(),
            format!("vhost-user-fs-pci,chardev=vfs{id},tag={}", self.tag),
        ]
    }
}

impl Drop for Virtiofsd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
