//! Writing a report's files.

use std::path::Path;

use serde::Serialize;

use crate::error::{io, Result};

/// Writes file `name` of a report directory `out`.
pub fn write_into(out: &Path, name: &str, text: &str) -> Result<()> {
    let p = out.join(name);
    std::fs::write(&p, text).map_err(io(format!("writing {}", p.display())))
}

/// Pretty JSON for any of the report types.
pub(crate) fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}
