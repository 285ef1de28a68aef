//! Generates the Rust side of `abi/pvsched_abi.h`, the one definition of the
//! shared region, so nothing of it is written twice:
//!
//! - `OUT_DIR/pvsched_abi.rs`: bindgen's output for every `pvsched_*` struct
//!   and `PVSCHED_*` constant of the header, named the Rust way
//!   (`struct pvsched_guest_half` -> `GuestHalf`, `PVSCHED_GF_IDLE` ->
//!   `GF_IDLE`); included by `src/layout.rs`.
//! - `OUT_DIR/layout_check.c` and `OUT_DIR/layout_check.rs`: the same list of
//!   fields, struct sizes and constants that bindgen saw, once as the C
//!   compiler computes them (compiled here with `cc`, the compiler the guest
//!   module is built with) and once as Rust does; `tests/c_layout.rs`
//!   compares the two. Both lists are made from the header on every build,
//!   so there is nothing to keep up to date by hand.
//!
//! bindgen needs libclang (Debian's libclang1-14), as crates/host's does.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bindgen::callbacks::{FieldInfo, IntKind, ItemInfo, ItemKind, ParseCallbacks};

/// What bindgen showed the callbacks, in header order.
#[derive(Debug, Default)]
struct Seen {
    /// `(C struct name, Rust name)`.
    structs: Vec<(String, String)>,
    /// `(Rust struct name, field)`.
    fields: Vec<(String, String)>,
    /// `PVSCHED_*` integer macros (C name).
    consts: Vec<String>,
    /// `PVSCHED_*` function-like macros of one parameter (C name).
    fn_macros: Vec<String>,
}

#[derive(Debug)]
struct Callbacks(Rc<RefCell<Seen>>);

const C_PREFIX: &str = "PVSCHED_";
const C_STRUCT_PREFIX: &str = "pvsched_";

/// `pvsched_guest_half` -> `GuestHalf`.
fn rust_type_name(c: &str) -> Option<String> {
    let rest = c.strip_prefix(C_STRUCT_PREFIX)?;
    Some(
        rest.split('_')
            .map(|w| {
                let mut chars = w.chars();
                chars.next().map_or_else(String::new, |first| {
                    first.to_ascii_uppercase().to_string() + chars.as_str()
                })
            })
            .collect(),
    )
}

/// The Rust type of a `#define`d constant: that of the fields it goes in.
/// Values (and names) come from the header; a value that does not fit its
/// type fails to compile.
fn const_kind(name: &str) -> IntKind {
    let usize_kind = IntKind::Custom {
        name: "usize",
        is_signed: false,
    };
    match name {
        // Sizes and offsets into a mapping.
        "CACHELINE" | "HEADER_SIZE" | "SLOT_SIZE" => usize_kind,
        // header.abi_major, header.abi_minor.
        "ABI_MAJOR" | "ABI_MINOR" => IntKind::U16,
        // The 64-bit words: header.magic, the feature words, guest_pending.
        "MAGIC" => IntKind::U64,
        // The yield hypercall's arguments (64-bit registers).
        "YIELD_TO_NONE" | "YIELD_TAG" => IntKind::U64,
        n if n.starts_with("F_") => IntKind::U64,
        n if n.starts_with("PENDING_") && !n.ends_with("_SHIFT") => IntKind::U64,
        // Everything else goes in (or counts) 32-bit fields.
        _ => IntKind::U32,
    }
}

impl ParseCallbacks for Callbacks {
    fn item_name(&self, info: ItemInfo) -> Option<String> {
        match info.kind {
            ItemKind::Var => info.name.strip_prefix(C_PREFIX).map(str::to_string),
            ItemKind::Type => {
                let rust = rust_type_name(info.name)?;
                let mut seen = self.0.borrow_mut();
                if !seen.structs.iter().any(|(c, _)| c == info.name) {
                    seen.structs.push((info.name.to_string(), rust.clone()));
                }
                Some(rust)
            }
            _ => None,
        }
    }

    fn int_macro(&self, name: &str, _value: i64) -> Option<IntKind> {
        let short = name.strip_prefix(C_PREFIX)?;
        let mut seen = self.0.borrow_mut();
        if !seen.consts.iter().any(|c| c == name) {
            seen.consts.push(name.to_string());
        }
        Some(const_kind(short))
    }

    fn func_macro(&self, name: &str, _value: &[&[u8]]) {
        // `NAME(param)`: one parameter, no comma.
        if name.starts_with(C_PREFIX) && !name.contains(',') {
            let mut seen = self.0.borrow_mut();
            if !seen.fn_macros.iter().any(|c| c == name) {
                seen.fn_macros.push(name.to_string());
            }
        }
    }

    fn field_visibility(&self, info: FieldInfo<'_>) -> Option<bindgen::FieldVisibilityKind> {
        let mut seen = self.0.borrow_mut();
        let key = (info.type_name.to_string(), info.field_name.to_string());
        if !seen.fields.contains(&key) {
            seen.fields.push(key);
        }
        None
    }
}

fn generate(header: &Path) -> Result<(String, Seen), String> {
    let seen = Rc::new(RefCell::new(Seen::default()));
    // The header's user-space branch names its fixed-width types after the
    // kernel's (`typedef uint64_t __u64;`); spelling them as the <stdint.h>
    // types makes bindgen use Rust's `u64` etc. for the fields instead of
    // exporting `__u64` aliases.
    let bindings = bindgen::Builder::default()
        .header(header.display().to_string())
        .clang_args([
            "-std=c11",
            "-fparse-all-comments",
            "-D__u16=uint16_t",
            "-D__u32=uint32_t",
            "-D__s32=int32_t",
            "-D__u64=uint64_t",
        ])
        .allowlist_item("(pvsched|PVSCHED)_.*")
        .parse_callbacks(Box::new(Callbacks(Rc::clone(&seen))))
        .derive_default(true)
        .derive_partialeq(true)
        .derive_eq(true)
        .generate_comments(true)
        .use_core()
        .generate()
        .map_err(|e| format!("bindgen {}: {e}", header.display()))?;
    let rust = bindings.to_string();
    drop(bindings);
    let seen = Rc::try_unwrap(seen)
        .map_err(|_| "bindgen kept its callbacks".to_string())?
        .into_inner();
    Ok((rust, seen))
}

/// The C and Rust halves of the layout check.
fn layout_check(seen: &Seen) -> Result<(String, String), String> {
    let c_name = |rust: &str| {
        seen.structs
            .iter()
            .find(|(_, r)| r == rust)
            .map(|(c, _)| c.clone())
            .ok_or_else(|| format!("field of unknown struct {rust}"))
    };
    let mut c = String::from(
        "/* Generated by crates/abi/build.rs from pvsched_abi.h. */\n\
         #include <stddef.h>\n#include <stdint.h>\n#include \"pvsched_abi.h\"\n\n\
         struct pvsched_c_field {\n\tconst char *name;\n\tuint64_t offset;\n\tuint64_t size;\n};\n\n\
         struct pvsched_c_const {\n\tconst char *name;\n\tuint64_t value;\n};\n\n\
         const struct pvsched_c_field pvsched_c_fields[] = {\n",
    );
    let mut rs = String::from(
        "// Generated by crates/abi/build.rs from pvsched_abi.h.\n\n\
         /// `(C name, offset, size)` of every struct (offset 0) and field.\n\
         #[allow(clippy::unnecessary_cast)]\n\
         fn rust_fields() -> Vec<(&'static str, u64, u64)> {\n    vec![\n",
    );
    let structs: BTreeSet<&str> = seen.fields.iter().map(|(t, _)| t.as_str()).collect();
    for rust in &structs {
        let cn = c_name(rust)?;
        writeln!(c, "\t{{ \"{cn}\", 0, sizeof(struct {cn}) }},").map_err(|e| e.to_string())?;
        writeln!(
            rs,
            "        (\"{cn}\", 0, core::mem::size_of::<{rust}>() as u64),"
        )
        .map_err(|e| e.to_string())?;
    }
    for (rust, field) in &seen.fields {
        let cn = c_name(rust)?;
        writeln!(
            c,
            "\t{{ \"{cn}.{field}\", offsetof(struct {cn}, {field}),\n\t  sizeof(((struct {cn} *)0)->{field}) }},"
        )
        .map_err(|e| e.to_string())?;
        writeln!(
            rs,
            "        (\"{cn}.{field}\", core::mem::offset_of!({rust}, {field}) as u64, \
             field_size(|s: &{rust}| &s.{field})),"
        )
        .map_err(|e| e.to_string())?;
    }
    c.push_str(
        "};\n\nconst uint64_t pvsched_c_field_count =\n\
         \tsizeof(pvsched_c_fields) / sizeof(pvsched_c_fields[0]);\n\n\
         const struct pvsched_c_const pvsched_c_consts[] = {\n",
    );
    rs.push_str(
        "    ]\n}\n\n\
         /// `(C name, value)` of every constant, and of every one-parameter\n\
         /// function-like macro at a few arguments.\n\
         #[allow(clippy::unnecessary_cast)]\n\
         fn rust_consts() -> Vec<(&'static str, u64)> {\n    vec![\n",
    );
    for name in &seen.consts {
        let short = &name[C_PREFIX.len()..];
        writeln!(c, "\t{{ \"{name}\", (uint64_t)({name}) }},").map_err(|e| e.to_string())?;
        writeln!(rs, "        (\"{name}\", {short} as u64),").map_err(|e| e.to_string())?;
    }
    for sig in &seen.fn_macros {
        // `PVSCHED_REGION_BYTES(slots)` -> `region_bytes(u32)`.
        let name = sig.split('(').next().unwrap_or(sig);
        let rust_fn = name[C_PREFIX.len()..].to_ascii_lowercase();
        for arg in [0u32, 1, 3, 4096] {
            writeln!(c, "\t{{ \"{name}({arg})\", (uint64_t)({name}({arg})) }},")
                .map_err(|e| e.to_string())?;
            writeln!(rs, "        (\"{name}({arg})\", {rust_fn}({arg}) as u64),")
                .map_err(|e| e.to_string())?;
        }
    }
    c.push_str(
        "};\n\nconst uint64_t pvsched_c_const_count =\n\
         \tsizeof(pvsched_c_consts) / sizeof(pvsched_c_consts[0]);\n",
    );
    rs.push_str("    ]\n}\n");
    Ok((c, rs))
}

fn run() -> Result<(), String> {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").ok_or("no CARGO_MANIFEST_DIR")?);
    let out = PathBuf::from(env::var_os("OUT_DIR").ok_or("no OUT_DIR")?);
    let abi_dir = manifest.join("../../abi");
    let header = abi_dir.join("pvsched_abi.h");
    println!("cargo:rerun-if-changed={}", header.display());

    let (rust, seen) = generate(&header)?;
    if seen.structs.is_empty() || seen.fields.is_empty() || seen.consts.is_empty() {
        return Err(format!(
            "bindgen found no pvsched items in {}",
            header.display()
        ));
    }
    let write = |name: &str, text: &str| {
        fs::write(out.join(name), text).map_err(|e| format!("write OUT_DIR/{name}: {e}"))
    };
    write("pvsched_abi.rs", &rust)?;
    let (c, rs) = layout_check(&seen)?;
    write("layout_check.c", &c)?;
    write("layout_check.rs", &rs)?;

    cc::Build::new()
        .file(out.join("layout_check.c"))
        .include(&abi_dir)
        .flag_if_supported("-std=c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("pvsched_abi_c_layout");
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        panic!("{e} (bindgen needs libclang: Debian's libclang1-14)");
    }
}
