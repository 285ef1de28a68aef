//! Compiles `tests/c/layout.c` against `abi/pvsched_abi.h`, so that the layout
//! test compares the Rust mirror with what a C compiler makes of the header.

fn main() {
    let abi_dir = "../../abi";
    println!("cargo:rerun-if-changed={abi_dir}/pvsched_abi.h");
    println!("cargo:rerun-if-changed=tests/c/layout.c");
    cc::Build::new()
        .file("tests/c/layout.c")
        .include(abi_dir)
        .flag_if_supported("-std=c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("pvsched_abi_c_layout");
}
