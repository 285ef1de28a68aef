//! Errors of the host VM harness. [`Error::HostVmFailed`] is the host VM's
//! own failure (emulation), which callers retry; every other error is a
//! result or a set-up problem and is never retried.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The host VM died, hung or hit a known emulation fault: not a result.
    #[error("the host VM failed ({reason}); its kernel log ends:\n{kernel_log}")]
    HostVmFailed { reason: String, kernel_log: String },

    /// The host VM's init could not set the system up (a set-up problem).
    #[error("the host VM's init failed: {0}")]
    InitFailed(String),

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },

    /// A package or tool the host VM needs is not there.
    #[error("{what} not found: {hint}")]
    Missing { what: String, hint: String },

    #[error("{0}")]
    Other(String),

    /// A test run inside the host VM failed: its output.
    #[error("{0}")]
    TestFailed(String),

    /// The guest harness, for what is not the host VM's failure.
    #[error(transparent)]
    Vm(#[from] pvsched_vmtest::Error),
}

impl Error {
    /// Whether this is the host VM's own failure, worth a fresh host VM.
    pub fn is_host_vm_failure(&self) -> bool {
        matches!(self, Error::HostVmFailed { .. })
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let context = context.into();
    move |source| Error::Io { context, source }
}
