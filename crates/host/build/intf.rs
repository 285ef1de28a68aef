//! Generates the Rust side of `src/bpf/intf.h` with bindgen: every
//! constant (enumerators and `#define`s) and the shared structs, so the BPF
//! programs and the daemon cannot drift apart. Used by build.rs and, through
//! `#[path]`, by the test that shows a header change reaching the Rust side.

use std::path::Path;

/// Rust source for the items of `header` named `pvs_*` / `PVS_*`.
pub fn generate(header: &Path) -> Result<String, String> {
    // The header uses the kernel's fixed-width types, which the BPF side
    // gets from vmlinux.h.
    let wrapper = format!(
        "typedef unsigned int __u32;\ntypedef int __s32;\ntypedef unsigned long long __u64;\ntypedef long long __s64;\n#include \"{}\"\n",
        header.display()
    );
    bindgen::Builder::default()
        .header_contents("pvsched_intf_wrapper.h", &wrapper)
        .allowlist_item("(pvs|PVS)_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .use_core()
        .generate()
        .map(|b| b.to_string())
        .map_err(|e| format!("bindgen {}: {e}", header.display()))
}
