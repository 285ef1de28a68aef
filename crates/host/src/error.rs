//! The event thread's errors, for the daemon and the helpers it starts with.

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    IvshmemServer(#[from] crate::ivshmem_server::ServerError),
    #[error("{op}: {source}")]
    Os {
        op: &'static str,
        source: nix::Error,
    },
    #[error(transparent)]
    State(#[from] crate::statefile::StateFileError),
}

/// Maps a failed system call `op` to a [`DaemonError`] that names it.
pub fn os(op: &'static str) -> impl FnOnce(nix::Error) -> DaemonError {
    move |source| DaemonError::Os { op, source }
}
