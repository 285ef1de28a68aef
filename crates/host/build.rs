//! Builds the BPF objects and their Rust skeletons: the event programs
//! (src/bpf/pvsched.bpf.c) and the sched_ext scheduler
//! (src/bpf/sched_ext.bpf.c, always against `vmlinux_min.h` and its own
//! `scx_min.h`).
//!
//! `vmlinux.h` comes from `PVSCHED_VMLINUX_H`:
//! - unset or `min` (default): the checked-in `src/bpf/vmlinux_min.h`. The
//!   programs read kernel structs only through CO-RE flavours they declare
//!   themselves, so nothing else is needed, and the object (and skeleton) is
//!   the same whatever kernel the build machine runs or whether it has BTF.
//! - `btf`: generated with `bpftool btf dump file /sys/kernel/btf/vmlinux
//!   format c` (fails the build if that does not work).
//! - `auto`: `btf` when `/sys/kernel/btf/vmlinux` and bpftool are there,
//!   else `min`.
//! - anything else: the path of a vmlinux.h to use.
//!
//! The compiler is `clang` from PATH, or `PVSCHED_BPF_CLANG`.
//!
//! The Rust side of `src/bpf/intf.h` (constants and shared structs) is
//! generated with bindgen into `OUT_DIR/intf.rs` (see `build/intf.rs`).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use libbpf_cargo::SkeletonBuilder;

#[path = "build/intf.rs"]
mod intf;

const SRC: &str = "src/bpf/pvsched.bpf.c";
const SCX_SRC: &str = "src/bpf/sched_ext.bpf.c";
const BTF: &str = "/sys/kernel/btf/vmlinux";

fn bpftool_vmlinux_h(dst: &Path) -> Result<(), String> {
    let out = Command::new("bpftool")
        .args(["btf", "dump", "file", BTF, "format", "c"])
        .output()
        .map_err(|e| format!("cannot run bpftool: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "bpftool btf dump failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    fs::write(dst, &out.stdout).map_err(|e| format!("write {}: {e}", dst.display()))
}

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let bpf_dir = manifest.join("src/bpf");
    let hdr_dir = out.join("vmlinux");
    fs::create_dir_all(&hdr_dir).expect("create OUT_DIR/vmlinux");
    let hdr = hdr_dir.join("vmlinux.h");
    let minimal = bpf_dir.join("vmlinux_min.h");

    println!("cargo:rerun-if-env-changed=PVSCHED_VMLINUX_H");
    println!("cargo:rerun-if-env-changed=PVSCHED_BPF_CLANG");
    for f in [
        "pvsched.bpf.c",
        "sched_ext.bpf.c",
        "scx_min.h",
        "intf.h",
        "vmlinux_min.h",
    ] {
        println!("cargo:rerun-if-changed={}", bpf_dir.join(f).display());
    }

    let choice = env::var("PVSCHED_VMLINUX_H").unwrap_or_default();
    let used = match choice.as_str() {
        "" | "min" => {
            fs::copy(&minimal, &hdr).expect("copy vmlinux_min.h");
            "min".to_string()
        }
        "btf" => {
            if let Err(e) = bpftool_vmlinux_h(&hdr) {
                panic!("PVSCHED_VMLINUX_H=btf: {e}");
            }
            "btf".to_string()
        }
        "auto" => {
            if Path::new(BTF).exists() && bpftool_vmlinux_h(&hdr).is_ok() {
                "btf".to_string()
            } else {
                fs::copy(&minimal, &hdr).expect("copy vmlinux_min.h");
                "min".to_string()
            }
        }
        path => {
            println!("cargo:rerun-if-changed={path}");
            fs::copy(path, &hdr).unwrap_or_else(|e| panic!("copy {path}: {e}"));
            format!("file {path}")
        }
    };
    println!("cargo:rustc-env=PVSCHED_VMLINUX_H_USED={used}");

    match intf::generate(&bpf_dir.join("intf.h")) {
        Ok(rust) => fs::write(out.join("intf.rs"), rust).expect("write OUT_DIR/intf.rs"),
        Err(e) => panic!("{e} (bindgen needs libclang: Debian's libclang1-14)"),
    }
    println!("cargo:rerun-if-changed=build/intf.rs");

    let abi_dir = manifest.join("../../abi");
    println!(
        "cargo:rerun-if-changed={}",
        abi_dir.join("pvsched_abi.h").display()
    );
    for (src, skel) in [(SRC, "pvsched.skel.rs"), (SCX_SRC, "sched_ext.skel.rs")] {
        let mut builder = SkeletonBuilder::new();
        builder.source(manifest.join(src)).clang_args([
            "-Wall".into(),
            "-I".into(),
            hdr_dir.clone().into_os_string(),
            "-I".into(),
            bpf_dir.clone().into_os_string(),
            "-I".into(),
            abi_dir.clone().into_os_string(),
        ]);
        if let Some(clang) = env::var_os("PVSCHED_BPF_CLANG") {
            builder.clang(clang);
        }
        if let Err(e) = builder.build_and_generate(out.join(skel)) {
            panic!(
                "building {src} failed (needs clang, and libelf-dev + zlib1g-dev for libbpf-sys): {e:#}"
            );
        }
    }
}
