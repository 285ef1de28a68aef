//! The committed evidence stays reproducible: every report under
//! `benchmarks/` that keeps its raw data (`raw.json`) renders again, with
//! today's `pvsched-bench --from-raw`, into exactly the report.md and
//! report.json committed beside it. A change to the bench that alters what
//! a report says for the same measurements fails here.

use std::path::{Path, PathBuf};
use std::process::Command;

fn evidence_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benchmarks")
}

fn raw_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            raw_files(&p, out);
        } else if p.file_name().is_some_and(|n| n == "raw.json") {
            out.push(p);
        }
    }
}

/// The scenario a raw.json was written by: its `scenario` field, absent
/// from the standard scenario's.
fn scenario_of(raw: &Path) -> String {
    let text = std::fs::read_to_string(raw).expect("read raw.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("raw.json is JSON");
    v.get("scenario")
        .and_then(|s| s.as_str())
        .unwrap_or("standard")
        .to_string()
}

#[test]
fn every_committed_report_with_raw_data_renders_again_identically() {
    let mut raws = Vec::new();
    raw_files(&evidence_root(), &mut raws);
    raws.sort();
    assert!(
        !raws.is_empty(),
        "no raw.json under {}",
        evidence_root().display()
    );
    let scratch = std::env::temp_dir().join(format!("pvsched-rerender-{}", std::process::id()));
    let mut differ = Vec::new();
    for (i, raw) in raws.iter().enumerate() {
        let dir = raw.parent().expect("a folder");
        let work = scratch.join(i.to_string());
        std::fs::create_dir_all(&work).expect("scratch folder");
        // The raw data and the platform's facts are the inputs; all else is output.
        for input in ["raw.json", "host-vm.json"] {
            if dir.join(input).exists() {
                std::fs::copy(dir.join(input), work.join(input)).expect("copy an input");
            }
        }
        let out = Command::new(env!("CARGO_BIN_EXE_pvsched-bench"))
            .args(["--scenario", &scenario_of(raw), "--from-raw"])
            .arg(work.join("raw.json"))
            .output()
            .expect("run pvsched-bench");
        assert!(
            out.status.success(),
            "{}: {}",
            raw.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        for file in ["report.md", "report.json"] {
            let committed = std::fs::read(dir.join(file)).expect("the committed report");
            let again = std::fs::read(work.join(file)).expect("the rendered report");
            if committed != again {
                differ.push(format!("{}", dir.join(file).display()));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(
        differ.is_empty(),
        "rendered differently from their raw.json: {differ:?}"
    );
}
