//! The Rust side and the C header cannot drift: both are made from
//! `abi/pvsched_abi.h` on every build. build.rs lists every struct, field and
//! constant bindgen found in the header, and writes that list twice: as C
//! (compiled with the C compiler the guest module is built with) and as Rust
//! (`OUT_DIR/layout_check.rs`, included here). These tests compare what the
//! two compilers made of it: offsets, sizes, and constant values (the C
//! compiler's, against bindgen's evaluation of the macros).

use std::collections::BTreeMap;
use std::ffi::{c_char, CStr};

use pvsched_abi::*;

#[repr(C)]
struct CField {
    name: *const c_char,
    offset: u64,
    size: u64,
}

#[repr(C)]
struct CConst {
    name: *const c_char,
    value: u64,
}

extern "C" {
    static pvsched_c_fields: [CField; 0];
    static pvsched_c_field_count: u64;
    static pvsched_c_consts: [CConst; 0];
    static pvsched_c_const_count: u64;
}

/// Size of a field without constructing the struct.
fn field_size<T, F>(_: fn(&T) -> &F) -> u64 {
    std::mem::size_of::<F>() as u64
}

include!(concat!(env!("OUT_DIR"), "/layout_check.rs"));

fn c_fields() -> BTreeMap<String, (u64, u64)> {
    // SAFETY: the C arrays are static, `count` entries long, with
    // NUL-terminated string literals for names.
    unsafe {
        let n = pvsched_c_field_count as usize;
        let base = std::ptr::addr_of!(pvsched_c_fields).cast::<CField>();
        (0..n)
            .map(|i| {
                let f = &*base.add(i);
                let name = CStr::from_ptr(f.name).to_string_lossy().into_owned();
                (name, (f.offset, f.size))
            })
            .collect()
    }
}

fn c_consts() -> BTreeMap<String, u64> {
    // SAFETY: as in `c_fields`.
    unsafe {
        let n = pvsched_c_const_count as usize;
        let base = std::ptr::addr_of!(pvsched_c_consts).cast::<CConst>();
        (0..n)
            .map(|i| {
                let c = &*base.add(i);
                let name = CStr::from_ptr(c.name).to_string_lossy().into_owned();
                (name, c.value)
            })
            .collect()
    }
}

fn rust_field_map() -> BTreeMap<String, (u64, u64)> {
    rust_fields()
        .into_iter()
        .map(|(name, offset, size)| (name.to_string(), (offset, size)))
        .collect()
}

#[test]
fn every_field_offset_and_size_matches_the_c_compiler() {
    let (c, rust) = (c_fields(), rust_field_map());

    assert_eq!(c.len(), rust_fields().len(), "a field listed twice");
    assert_eq!(c, rust, "(offset, size) per field, C left, Rust right");
}

#[test]
fn the_fields_cover_each_struct_without_gaps() {
    // Implicit padding would be a hole two compilers may fill differently,
    // and a struct bindgen saw no fields of would pass the comparison above.
    let fields = rust_field_map();
    let structs = [
        "pvsched_header",
        "pvsched_guest_half",
        "pvsched_host_half",
        "pvsched_slot",
    ];
    for ty in structs {
        let (_, total) = fields[ty];
        let mut members: Vec<(u64, u64)> = fields
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{ty}.")))
            .map(|(_, v)| *v)
            .collect();
        members.sort();
        let mut next = 0;
        for (offset, size) in members {
            assert_eq!(offset, next, "{ty}: gap or overlap at offset {offset}");
            next = offset + size;
        }
        assert_eq!(
            next, total,
            "{ty}: fields end at {next}, struct is {total} bytes"
        );
    }
    let all: Vec<&str> = fields
        .keys()
        .filter(|k| !k.contains('.'))
        .map(String::as_str)
        .collect();
    assert_eq!(all.len(), structs.len(), "structs in the header: {all:?}");
}

#[test]
fn every_constant_matches_the_c_compiler() {
    let (c, rust) = (c_consts(), rust_consts());
    let rust: BTreeMap<String, u64> = rust.into_iter().map(|(k, v)| (k.to_string(), v)).collect();

    // Not vacuous: the header's constants and its one function-like macro.
    assert!(rust.len() >= 55, "{rust:?}");
    assert_eq!(rust.get("PVSCHED_MAGIC"), Some(&0x0044_4548_4353_5650));
    assert_eq!(rust.get("PVSCHED_REGION_BYTES(3)"), Some(&(128 + 3 * 256)));
    assert_eq!(c, rust);
}
