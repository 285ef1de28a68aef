//! pvsched-sim as a user runs it: determinism, every shipped scenario, clear errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pvsched-sim"))
        .args(args)
        .output()
        .expect("running pvsched-sim")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pvsched-sim-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "pvsched-sim failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("json written")).expect("valid json")
}

#[test]
fn the_same_seed_gives_byte_identical_json_and_another_seed_does_not() {
    let (a, b, c) = (tmp("a.json"), tmp("b.json"), tmp("c.json"));
    for (path, seed) in [(&a, "7"), (&b, "7"), (&c, "8")] {
        ok(&sim(&[
            "--scenario",
            "busy-host",
            "--duration",
            "0.5",
            "--seed",
            seed,
            "--quiet",
            "--json",
            path.to_str().unwrap(),
        ]));
    }
    let (ta, tb, tc) = (
        std::fs::read(&a).unwrap(),
        std::fs::read(&b).unwrap(),
        std::fs::read(&c).unwrap(),
    );
    assert_eq!(ta, tb);
    assert_ne!(ta, tc);

    // Lock waits, slot reads at preemptions, extensions and lock debt too.
    let (d, e) = (tmp("d.json"), tmp("e.json"));
    for path in [&d, &e] {
        ok(&sim(&[
            "--scenario",
            "lock-holder",
            "--modes",
            "pvsched-locks",
            "--duration",
            "0.3",
            "--seed",
            "7",
            "--quiet",
            "--json",
            path.to_str().unwrap(),
        ]));
    }
    let td = std::fs::read(&d).unwrap();
    assert_eq!(td, std::fs::read(&e).unwrap());
    let doc = json(&d);
    assert!(doc["results"][0]["vms"][0]["locks"]["extensions"].as_u64() > Some(0));
}

#[test]
fn every_shipped_scenario_runs_and_reports_each_mode() {
    for name in [
        "busy-host",
        "idle-host",
        "rogue-guest",
        "lock-holder",
        "message-passing",
        "fleet",
    ] {
        let path = tmp(&format!("{name}.json"));
        let dur = if name == "fleet" { "0.1" } else { "0.3" };
        let table = ok(&sim(&[
            "--scenario",
            name,
            "--duration",
            dur,
            "--quiet",
            "--json",
            path.to_str().unwrap(),
        ]));
        let doc = json(&path);
        let modes = doc["scenario"]["modes"].as_array().unwrap().len();
        let variants = doc["scenario"]["variants"].as_array().unwrap().len().max(1);
        let results = doc["results"].as_array().unwrap();
        assert_eq!(results.len(), modes * variants, "{name}");
        for r in results {
            assert!(r["events"].as_u64().unwrap() > 0, "{name}: no events");
            assert!(table.contains(r["mode"].as_str().unwrap()), "{name}");
        }
    }
}

#[test]
fn plots_are_written_as_png() {
    let dir = tmp("plots");
    let out = sim(&[
        "--scenario",
        "idle-host",
        "--duration",
        "0.3",
        "--quiet",
        "--plot",
        dir.to_str().unwrap(),
    ]);
    ok(&out);
    let png = std::fs::read(dir.join("idle-host.png")).expect("plot written");
    assert_eq!(&png[..4], b"\x89PNG");
}

#[test]
fn a_bad_scenario_is_refused_with_the_reason() {
    let path = tmp("bad.toml");
    std::fs::write(
        &path,
        "name = \"x\"\nduration_s = 1.0\ncosts = \"tcg\"\nmodes = [\"vanilla\"]\n[host]\ncpus = 0\n",
    )
    .unwrap();
    let out = sim(&["--scenario", path.to_str().unwrap(), "--quiet"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("host.cpus must be 1..=64"), "{err}");

    let out = sim(&["--scenario", "no-such-scenario", "--quiet"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-scenario"));

    let out = sim(&["--scenario", "busy-host", "--modes", "turbo", "--quiet"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown mode"));
}
