//! The signals that stop pvschedd: blocked in every thread and read from
//! a signalfd by the event loop, so each one stops it through the restore
//! path instead of killing it with threads left boosted.

use nix::sys::signal::{SigSet, Signal};

use crate::error::DaemonError;

/// The signals that stop the daemon (restoring every thread first): every
/// signal whose default action ends a process and that another process can
/// send on purpose. SIGKILL cannot be caught (the state file covers it);
/// faults (SIGSEGV, SIGBUS, ...) are not sent on purpose.
pub const STOP_SIGNALS: [Signal; 7] = [
    Signal::SIGALRM,
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGTERM,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Blocks the [`STOP_SIGNALS`] in the calling thread (and threads it
/// spawns later): they are read from a signalfd by the event loop.
pub fn block_stop_signals() -> Result<SigSet, DaemonError> {
    let mut mask = SigSet::empty();
    for sig in STOP_SIGNALS {
        mask.add(sig);
    }
    mask.thread_block().map_err(|source| DaemonError::Os {
        op: "sigprocmask",
        source,
    })?;
    Ok(mask)
}
