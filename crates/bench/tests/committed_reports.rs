//! The committed evidence stays reproducible: every report under
//! `benchmarks/` that keeps its raw data (`raw.json`) renders again, with
//! today's `pvsched-bench --from-raw`, into exactly the report.md and
//! report.json committed beside it. The golden fixtures under
//! `tests/fixtures/` do the same for the scenarios and platforms those runs
//! do not cover (see its README.md). A change to the bench that alters what
//! a report says for the same measurements fails here.

use std::path::{Path, PathBuf};
use std::process::Command;

fn evidence_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benchmarks")
}

fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
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

/// How a raw.json is handed to `pvsched-bench`.
#[derive(Clone, Copy)]
enum Naming {
    /// `--scenario <its scenario> --from-raw`, as before the bench told
    /// the scenario from the file.
    Scenario,
    /// `--from-raw` alone: the bench reads the scenario from the file.
    FileAlone,
}

/// Renders every raw.json under `root` again in a scratch folder and
/// returns the committed files (those `compared` names) it rendered
/// differently.
fn rerender_all(root: &Path, compared: fn(&str) -> bool, naming: Naming) -> Vec<String> {
    let mut raws = Vec::new();
    raw_files(root, &mut raws);
    raws.sort();
    assert!(!raws.is_empty(), "no raw.json under {}", root.display());
    let scratch = std::env::temp_dir().join(format!(
        "pvsched-rerender-{}-{}-{}",
        std::process::id(),
        root.file_name().and_then(|n| n.to_str()).unwrap_or("root"),
        match naming {
            Naming::Scenario => "named",
            Naming::FileAlone => "unnamed",
        }
    ));
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
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pvsched-bench"));
        if let Naming::Scenario = naming {
            cmd.args(["--scenario", &scenario_of(raw)]);
        }
        let out = cmd
            .arg("--from-raw")
            .arg(work.join("raw.json"))
            .output()
            .expect("run pvsched-bench");
        assert!(
            out.status.success(),
            "{}: {}",
            raw.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("the committed folder")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(compared))
            .collect();
        files.sort();
        for committed in files {
            let name = committed.file_name().expect("a file name");
            let again = std::fs::read(work.join(name)).unwrap_or_default();
            if std::fs::read(&committed).expect("the committed report") != again {
                differ.push(committed.display().to_string());
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    differ
}

/// The committed runs: their report.md and report.json.
fn report_files(name: &str) -> bool {
    matches!(name, "report.md" | "report.json")
}

/// The golden fixtures: every text file the bench wrote, raw.json (as the
/// bench writes it back) included.
fn every_text_file(name: &str) -> bool {
    name.ends_with(".md") && name != "README.md" || name.ends_with(".json")
}

#[test]
fn every_committed_report_with_raw_data_renders_again_identically() {
    let differ = rerender_all(&evidence_root(), report_files, Naming::Scenario);
    assert!(
        differ.is_empty(),
        "rendered differently from their raw.json: {differ:?}"
    );
}

#[test]
fn every_golden_fixture_renders_again_identically() {
    let differ = rerender_all(&fixtures_root(), every_text_file, Naming::Scenario);
    assert!(
        differ.is_empty(),
        "rendered differently from their raw.json: {differ:?}"
    );
}

#[test]
fn every_raw_file_renders_without_naming_its_scenario() {
    let mut differ = rerender_all(&evidence_root(), report_files, Naming::FileAlone);
    differ.extend(rerender_all(
        &fixtures_root(),
        every_text_file,
        Naming::FileAlone,
    ));
    assert!(
        differ.is_empty(),
        "rendered differently from their raw.json: {differ:?}"
    );
}
