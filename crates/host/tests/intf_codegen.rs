//! The BPF interface header is the one definition: the Rust constants and
//! structs are generated from it at build time, so a change to a value in
//! `src/bpf/intf.h` reaches the Rust side with no hand edit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pvsched_host::events::wire;

#[path = "../build/intf.rs"]
mod intf;

fn header() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bpf/intf.h")
}

/// `pub const NAME: TYPE = VALUE;` lines of generated Rust.
fn constants(rust: &str) -> BTreeMap<String, u64> {
    rust.lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("pub const ")?;
            let (name, rest) = rest.split_once(':')?;
            let value = rest.split_once('=')?.1.trim().trim_end_matches(';');
            Some((name.trim().to_string(), value.parse().ok()?))
        })
        .collect()
}

#[test]
fn the_compiled_constants_are_the_headers() {
    let generated = constants(&intf::generate(&header()).unwrap());
    let compiled: BTreeMap<&str, u64> = [
        ("PVS_EVENT_SIZE", u64::from(wire::PVS_EVENT_SIZE)),
        ("PVS_EV_SWITCH_OUT", u64::from(wire::PVS_EV_SWITCH_OUT)),
        ("PVS_EV_SWITCH_IN", u64::from(wire::PVS_EV_SWITCH_IN)),
        ("PVS_EV_WAKING", u64::from(wire::PVS_EV_WAKING)),
        ("PVS_EV_KVM_EXIT", u64::from(wire::PVS_EV_KVM_EXIT)),
        ("PVS_EV_KVM_WAKEUP", u64::from(wire::PVS_EV_KVM_WAKEUP)),
        ("PVS_EV_KVM_IRQ", u64::from(wire::PVS_EV_KVM_IRQ)),
        ("PVS_F_RUNNABLE", u64::from(wire::PVS_F_RUNNABLE)),
        ("PVS_F_ALL", u64::from(wire::PVS_F_ALL)),
        ("PVS_LAZY_ALL", u64::from(wire::PVS_LAZY_ALL)),
        ("PVS_STAT_LAZY", u64::from(wire::PVS_STAT_LAZY)),
        ("PVS_SVM_EXIT_HLT", u64::from(wire::PVS_SVM_EXIT_HLT)),
    ]
    .into();

    assert!(generated.len() >= 30, "{generated:?}");
    for (name, value) in compiled {
        assert_eq!(generated.get(name), Some(&value), "{name}");
    }
}

#[test]
fn a_value_changed_in_the_header_changes_the_generated_rust() {
    let text = std::fs::read_to_string(header()).unwrap();
    assert!(text.contains("PVS_EV_WAKING = 3,"));
    assert!(text.contains("#define PVS_VMX_EXIT_HLT 12"));
    let dir = std::env::temp_dir().join(format!("pvsched-intf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let changed = dir.join("intf.h");
    std::fs::write(
        &changed,
        text.replace("PVS_EV_WAKING = 3,", "PVS_EV_WAKING = 9,")
            .replace("#define PVS_VMX_EXIT_HLT 12", "#define PVS_VMX_EXIT_HLT 13"),
    )
    .unwrap();

    let generated = constants(&intf::generate(&changed).unwrap());

    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(generated.get("PVS_EV_WAKING"), Some(&9));
    assert_eq!(generated.get("PVS_VMX_EXIT_HLT"), Some(&13));
    assert_eq!(generated.get("PVS_EV_SWITCH_IN"), Some(&2));
}
