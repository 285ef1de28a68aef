//! Errors of the harness. Each says what was being done and, where it helps,
//! what to install or where to look (console log, QEMU's stderr).

use std::io;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("region: {0}")]
    Abi(#[from] pvsched_abi::AbiError),

    /// The command cannot travel over the serial console as one line.
    #[error("command not sendable over the console ({reason}): {command}")]
    BadCommand { command: String, reason: String },

    /// [`crate::Vm::qmp`] was given something that is not a JSON object.
    #[error("QMP command is not JSON ({source}): {command}")]
    BadQmpCommand {
        command: String,
        #[source]
        source: serde_json::Error,
    },

    /// The guest did not print its ready marker in time.
    #[error("VM {vm}: guest not ready after {timeout:?}; console tail:\n{console}")]
    BootTimeout {
        vm: String,
        timeout: Duration,
        console: String,
    },

    /// A host command (make, cc, ldd, ...) failed.
    #[error("{command} failed ({status}):\n{output}")]
    Command {
        command: String,
        status: String,
        output: String,
    },

    /// The guest did not start a command within the time asked
    /// ([`crate::Vm::exec_started_within`]): it is not answering.
    #[error("VM {vm}: command not started within {within:?}: {command}\nconsole tail:\n{console}")]
    CommandNotStarted {
        vm: String,
        command: String,
        within: Duration,
        console: String,
    },

    /// A guest command did not finish in time: the guest killed it
    /// (`answered`), or its reply never ended on the console (the guest, or
    /// its console, stalled).
    #[error("VM {vm}: command timed out after {timeout:?}: {command}\nconsole tail:\n{console}")]
    CommandTimeout {
        vm: String,
        command: String,
        timeout: Duration,
        answered: bool,
        console: String,
    },

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },

    /// A host tool or file the harness needs is not there.
    #[error("{what} not found ({hint})")]
    Missing { what: String, hint: String },

    #[error("{0}")]
    Other(String),

    /// QEMU exited (or closed its console) while we waited for the guest.
    #[error("VM {vm}: QEMU exited ({status}); stderr:\n{stderr}\nconsole tail:\n{console}")]
    QemuExited {
        vm: String,
        status: String,
        stderr: String,
        console: String,
    },

    /// A QMP exchange failed (connection, negotiation, timeout, bad reply);
    /// the message names the socket.
    #[error(transparent)]
    Qmp(#[from] pvsched_base::qmp::QmpError),

    #[error("region file: {0}")]
    RegionFile(#[from] pvsched_base::region_file::RegionFileError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let context = context.into();
    move |source| Error::Io { context, source }
}

pub(crate) fn path_ctx(what: &str, path: &std::path::Path) -> String {
    format!("{what} {}", path.display())
}

/// Returns `path` if it exists, else a [`Error::Missing`] with `hint`.
pub(crate) fn require(path: PathBuf, hint: &str) -> Result<PathBuf> {
    if path.exists() {
        Ok(path)
    } else {
        Err(Error::Missing {
            what: path.display().to_string(),
            hint: hint.to_string(),
        })
    }
}
