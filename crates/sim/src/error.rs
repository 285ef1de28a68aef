//! The simulator's errors: each names what failed and why.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("plot: {0}")]
    Plot(#[from] pvsched_report::ReportError),
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("scenario {what}: {msg}")]
    Scenario { what: String, msg: String },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}
