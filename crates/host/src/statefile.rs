//! The state file: every thread whose scheduling parameters the daemon may
//! change, with its original parameters, written before the first change.
//! A daemon that starts after a crash restores what its predecessor left.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use pvsched_base::kvm_params::{self, HaltPoll};
use pvsched_base::sched::{self, ThreadParams};
use pvsched_base::thread::ThreadHandle;

#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("{path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    #[error("{path}: not a pvsched state file: {msg}")]
    Parse { path: PathBuf, msg: String },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadRecord {
    pub vm: String,
    pub tgid: i32,
    pub tid: i32,
    pub start_time: u64,
    pub original: ThreadParams,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFile {
    pub version: u32,
    pub daemon_pid: u32,
    pub threads: Vec<ThreadRecord>,
    /// The kvm module's halt-polling parameters before `pvschedctl idle --apply
    /// host` changed them; put back at the next start.
    #[serde(default)]
    pub kvm_halt_poll: Option<SavedHaltPoll>,
}

/// Halt-polling parameters to put back, and the directory they belong in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedHaltPoll {
    pub dir: PathBuf,
    pub params: HaltPoll,
}

const VERSION: u32 = 1;

impl StateFile {
    pub fn new() -> Self {
        Self {
            version: VERSION,
            daemon_pid: std::process::id(),
            threads: Vec::new(),
            kvm_halt_poll: None,
        }
    }

    /// Writes the file atomically (temporary file + rename), mode 0600.
    pub fn save(&self, path: &Path) -> Result<(), StateFileError> {
        let io = |op, e| StateFileError::Io {
            path: path.to_path_buf(),
            op,
            source: e,
        };
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(|e| io("create dir", e))?;
        }
        let tmp = path.with_extension("tmp");
        let json = serde_json::to_vec_pretty(self)
            .map_err(|e| io("serialize", std::io::Error::other(e)))?;
        {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(|e| io("create", e))?;
            f.write_all(&json).map_err(|e| io("write", e))?;
            f.sync_all().map_err(|e| io("sync", e))?;
        }
        fs::rename(&tmp, path).map_err(|e| io("rename", e))
    }

    pub fn load(path: &Path) -> Result<Option<Self>, StateFileError> {
        let bytes = match fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(StateFileError::Io {
                    path: path.to_path_buf(),
                    op: "read",
                    source: e,
                })
            }
        };
        let state: StateFile =
            serde_json::from_slice(&bytes).map_err(|e| StateFileError::Parse {
                path: path.to_path_buf(),
                msg: e.to_string(),
            })?;
        if state.version != VERSION {
            return Err(StateFileError::Parse {
                path: path.to_path_buf(),
                msg: format!("version {} (this build reads {VERSION})", state.version),
            });
        }
        Ok(Some(state))
    }
}

/// What a restore of recorded threads did.
#[derive(Debug, Default)]
pub struct Restored {
    /// Threads put back to their original parameters.
    pub restored: usize,
    /// Threads that still exist (same identity) but could not be put back:
    /// they stay recorded, and are tried again.
    pub left: Vec<ThreadRecord>,
    /// kvm module parameters still to put back (a write failed).
    pub kvm_halt_poll: Option<SavedHaltPoll>,
}

/// Puts every recorded thread that still exists (same process, same start
/// time) back to its original parameters, flags included.
pub fn restore_records(records: &[ThreadRecord]) -> Restored {
    let mut out = Restored::default();
    for r in records {
        if !ThreadHandle::matches_recorded(r.tgid, r.tid, r.start_time) {
            continue; // gone, or the id now names another thread
        }
        let result = sched::get_params(r.tid).and_then(|now| {
            if now.same_setting(&r.original) {
                return Ok(false);
            }
            sched::set_params(r.tid, &r.original)?;
            info!(vm = %r.vm, tid = r.tid, from = %now, to = %r.original, "restored thread");
            Ok(true)
        });
        match result {
            Ok(changed) => out.restored += usize::from(changed),
            // It exited between the identity check and now.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => {
                warn!(vm = %r.vm, tid = r.tid, error = %e, "cannot restore thread; kept in the state file");
                out.left.push(r.clone());
            }
        }
    }
    out
}

/// At start: restores what a previous instance recorded. The file is
/// removed only when every thread it lists was restored or is gone; the
/// threads that could not be restored are returned, for the caller to keep
/// recording and to try again. A file of a daemon that is still running is
/// refused.
pub fn recover(path: &Path) -> Result<Restored, StateFileError> {
    let Some(state) = StateFile::load(path)? else {
        return Ok(Restored::default());
    };
    if state.daemon_pid != std::process::id() && process_alive_as_pvschedd(state.daemon_pid) {
        return Err(StateFileError::Parse {
            path: path.to_path_buf(),
            msg: format!("pvschedd {} is still running", state.daemon_pid),
        });
    }
    let mut done = restore_records(&state.threads);
    if let Some(k) = state.kvm_halt_poll {
        match kvm_params::write_halt_poll_to(&k.dir, &k.params) {
            Ok(()) => info!(
                halt_poll_ns = k.params.halt_poll_ns,
                "put the kvm halt-polling parameters a previous pvschedd changed back"
            ),
            Err(e) => {
                warn!(error = %e, "cannot put the kvm halt-polling parameters back; kept in the state file");
                done.kvm_halt_poll = Some(k);
            }
        }
    }
    info!(
        path = %path.display(), previous_pid = state.daemon_pid, restored = done.restored,
        left = done.left.len(), "recovered state of a previous pvschedd"
    );
    if done.left.is_empty() && done.kvm_halt_poll.is_none() {
        fs::remove_file(path).map_err(|e| StateFileError::Io {
            path: path.to_path_buf(),
            op: "remove",
            source: e,
        })?;
    }
    Ok(done)
}

fn process_alive_as_pvschedd(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim() == "pvschedd")
        .unwrap_or(false)
}
