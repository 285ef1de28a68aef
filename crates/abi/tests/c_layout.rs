//! The Rust mirror and the C header can never drift: every field's offset and
//! size, every struct's size and every constant is compared with what the C
//! compiler made of `abi/pvsched_abi.h` (built by build.rs from tests/c/layout.c).

use std::collections::BTreeMap;
use std::ffi::{c_char, CStr};
use std::mem::{offset_of, size_of};

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

/// Size of a field without constructing the struct.
fn field_size<T, F>(_: fn(&T) -> &F) -> u64 {
    size_of::<F>() as u64
}

macro_rules! fields {
    ($map:ident, $cname:literal, $ty:ty { $($f:ident),* $(,)? }) => {
        $map.insert($cname.to_string(), (0, size_of::<$ty>() as u64));
        $(
            $map.insert(
                concat!($cname, ".", stringify!($f)).to_string(),
                (offset_of!($ty, $f) as u64, field_size(|s: &$ty| &s.$f)),
            );
        )*
    };
}

fn rust_fields() -> BTreeMap<String, (u64, u64)> {
    let mut m = BTreeMap::new();
    fields!(
        m,
        "pvsched_header",
        Header {
            magic,
            abi_major,
            abi_minor,
            header_size,
            slot_size,
            slot_count,
            doorbell,
            host_features,
            generation,
            host_reserved,
            guest_features,
            guest_generation,
            guest_abi_minor,
            guest_nr_cpus,
            guest_reserved,
        }
    );
    fields!(
        m,
        "pvsched_guest_half",
        GuestHalf {
            seq,
            flags,
            cs_flags,
            policy,
            rt_priority,
            nice,
            update_ns,
            hardirq_count,
            softirq_count,
            nmi_count,
            switch_count,
            guest_pending,
            boost_req_count,
            lock_holder,
            lock_flags,
            lock_contended_count,
            lock_preempted_count,
            guest_reserved,
        }
    );
    fields!(
        m,
        "pvsched_host_half",
        HostHalf {
            seq,
            status,
            flags,
            policy,
            rt_priority,
            nice,
            update_ns,
            boost_count,
            throttle_count,
            preempt_count,
            boosted_ns,
            wake_p50_ns,
            wake_p99_ns,
            poll_budget_permille,
            host_reserved1,
            host_reserved,
        }
    );
    fields!(m, "pvsched_slot", Slot { guest, host });
    m
}

fn rust_consts() -> BTreeMap<String, u64> {
    let c: &[(&str, u64)] = &[
        ("PVSCHED_MAGIC", MAGIC),
        ("PVSCHED_ABI_MAJOR", ABI_MAJOR.into()),
        ("PVSCHED_ABI_MINOR", ABI_MINOR.into()),
        ("PVSCHED_CACHELINE", CACHELINE as u64),
        ("PVSCHED_HEADER_SIZE", HEADER_SIZE as u64),
        ("PVSCHED_SLOT_SIZE", SLOT_SIZE as u64),
        ("PVSCHED_MAX_SLOTS", MAX_SLOTS.into()),
        ("PVSCHED_READ_RETRIES", READ_RETRIES.into()),
        ("PVSCHED_F_HOST_HALF", F_HOST_HALF),
        ("PVSCHED_F_PENDING_HINT", F_PENDING_HINT),
        ("PVSCHED_F_BOOST_REQUEST", F_BOOST_REQUEST),
        ("PVSCHED_F_IDLE_HINTS", F_IDLE_HINTS),
        ("PVSCHED_F_DOORBELL", F_DOORBELL),
        ("PVSCHED_F_LOCK_WAIT", F_LOCK_WAIT),
        ("PVSCHED_LOCK_NONE", LOCK_NONE.into()),
        ("PVSCHED_LOCK_ANY", LOCK_ANY.into()),
        ("PVSCHED_LOCK_F_SPIN", LOCK_F_SPIN.into()),
        ("PVSCHED_LOCK_F_READ", LOCK_F_READ.into()),
        ("PVSCHED_LOCK_F_WRITE", LOCK_F_WRITE.into()),
        ("PVSCHED_LOCK_F_MUTEX", LOCK_F_MUTEX.into()),
        ("PVSCHED_LOCK_F_SLEEP", LOCK_F_SLEEP.into()),
        ("PVSCHED_LOCK_F_ALL", LOCK_F_ALL.into()),
        ("PVSCHED_F_ALL", F_ALL),
        ("PVSCHED_IVSHMEM_DOORBELL_REG", IVSHMEM_DOORBELL_REG.into()),
        ("PVSCHED_GF_ACTIVE", GF_ACTIVE.into()),
        ("PVSCHED_GF_IDLE", GF_IDLE.into()),
        ("PVSCHED_GF_BOOST_REQ", GF_BOOST_REQ.into()),
        ("PVSCHED_GF_ALL", GF_ALL.into()),
        ("PVSCHED_CS_NMI", CS_NMI.into()),
        ("PVSCHED_CS_HARDIRQ", CS_HARDIRQ.into()),
        ("PVSCHED_CS_SOFTIRQ", CS_SOFTIRQ.into()),
        ("PVSCHED_CS_PREEMPT_OFF", CS_PREEMPT_OFF.into()),
        ("PVSCHED_CS_LOCK", CS_LOCK.into()),
        ("PVSCHED_CS_ALL", CS_ALL.into()),
        ("PVSCHED_POLICY_NORMAL", POLICY_NORMAL.into()),
        ("PVSCHED_POLICY_FIFO", POLICY_FIFO.into()),
        ("PVSCHED_POLICY_RR", POLICY_RR.into()),
        ("PVSCHED_POLICY_BATCH", POLICY_BATCH.into()),
        ("PVSCHED_POLICY_IDLE", POLICY_IDLE.into()),
        ("PVSCHED_POLICY_DEADLINE", POLICY_DEADLINE.into()),
        ("PVSCHED_PENDING_VALID", PENDING_VALID),
        ("PVSCHED_PENDING_PRIO_MASK", PENDING_PRIO_MASK),
        ("PVSCHED_PENDING_POLICY_SHIFT", PENDING_POLICY_SHIFT.into()),
        ("PVSCHED_PENDING_POLICY_MASK", PENDING_POLICY_MASK),
        ("PVSCHED_PENDING_RESERVED", PENDING_RESERVED),
        ("PVSCHED_HS_UNKNOWN", HS_UNKNOWN.into()),
        ("PVSCHED_HS_RUNNING", HS_RUNNING.into()),
        ("PVSCHED_HS_PREEMPTED", HS_PREEMPTED.into()),
        ("PVSCHED_HS_HALTED", HS_HALTED.into()),
        ("PVSCHED_HF_BOOSTED", HF_BOOSTED.into()),
        ("PVSCHED_HF_THROTTLED", HF_THROTTLED.into()),
        ("PVSCHED_HF_OVERLOADED", HF_OVERLOADED.into()),
        ("PVSCHED_HF_IN_DEBT", HF_IN_DEBT.into()),
        ("PVSCHED_HOST_POLICY_OTHER", HOST_POLICY_OTHER.into()),
        ("PVSCHED_HOST_POLICY_FIFO", HOST_POLICY_FIFO.into()),
        ("PVSCHED_HOST_POLICY_RR", HOST_POLICY_RR.into()),
        ("PVSCHED_HOST_POLICY_BATCH", HOST_POLICY_BATCH.into()),
        ("PVSCHED_HOST_POLICY_IDLE", HOST_POLICY_IDLE.into()),
        ("PVSCHED_REGION_BYTES(3)", region_bytes(3)),
    ];
    c.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn every_field_offset_and_size_matches_the_c_header() {
    let (c, rust) = (c_fields(), rust_fields());

    let only_c: Vec<_> = c.keys().filter(|k| !rust.contains_key(*k)).collect();
    let only_rust: Vec<_> = rust.keys().filter(|k| !c.contains_key(*k)).collect();
    let differ: Vec<_> = c
        .iter()
        .filter_map(|(k, v)| rust.get(k).filter(|r| *r != v).map(|r| (k, *v, *r)))
        .collect();

    assert!(only_c.is_empty(), "fields only in C: {only_c:?}");
    assert!(only_rust.is_empty(), "fields only in Rust: {only_rust:?}");
    assert!(
        differ.is_empty(),
        "(name, C (offset, size), Rust (offset, size)): {differ:?}"
    );
}

#[test]
fn listed_fields_cover_each_struct_without_gaps() {
    // A field added to one side but not to these lists changes a struct's
    // size or leaves a hole: caught here.
    let fields = rust_fields();
    for ty in [
        "pvsched_header",
        "pvsched_guest_half",
        "pvsched_host_half",
        "pvsched_slot",
    ] {
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
}

#[test]
fn every_constant_matches_the_c_header() {
    let (c, rust) = (c_consts(), rust_consts());

    assert_eq!(c, rust);
}
