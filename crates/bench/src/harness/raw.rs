//! Reading back a run's `raw.json`, which every scenario's `--from-raw`
//! renders again into the file's directory.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use crate::error::{io, BenchError, Result};

/// The raw results at `raw_path` and the directory they belong in.
pub fn load<T: DeserializeOwned>(raw_path: &Path) -> Result<(T, PathBuf)> {
    let text =
        std::fs::read_to_string(raw_path).map_err(io(format!("reading {}", raw_path.display())))?;
    let raw = serde_json::from_str(&text).map_err(|source| BenchError::Json {
        what: raw_path.display().to_string(),
        source,
    })?;
    let dir = raw_path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    Ok((raw, dir))
}

/// Renders the raw results at `raw_path` again with `render`, into the
/// file's directory; returns the report and that directory.
pub fn rerender<T: DeserializeOwned, R>(
    raw_path: &Path,
    render: impl FnOnce(&Path, &T) -> Result<R>,
) -> Result<(R, PathBuf)> {
    let (raw, dir): (T, PathBuf) = load(raw_path)?;
    Ok((render(&dir, &raw)?, dir))
}
