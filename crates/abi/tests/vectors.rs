//! Test vectors under `abi/testdata/`: region images with known contents,
//! read here and reusable by the guest-module tests.
//!
//! The images are made by `build_vectors()` below; this test fails if a
//! committed file differs from what it builds. After an intended ABI change:
//! `PVSCHED_REGEN_VECTORS=1 cargo test -p pvsched-abi --test vectors`.

use std::path::PathBuf;

use pvsched_abi::*;

type IsExpected = fn(&AbiError) -> bool;

const SLOTS: u32 = 4;

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../abi/testdata")
}

fn valid() -> OwnedRegion {
    let mut owned = OwnedRegion::zeroed(bar_size(SLOTS) as usize).unwrap();
    let r = owned.region_mut();
    r.init_header(SLOTS, F_ALL).unwrap();
    r.init_header(SLOTS, F_ALL).unwrap();
    r.init_header(SLOTS, F_ALL).unwrap(); // generation 3
    r.write_guest(
        0,
        &GuestHalf {
            flags: GF_ACTIVE | GF_IDLE,
            switch_count: 10,
            ..Default::default()
        },
    )
    .unwrap();
    r.write_guest(
        1,
        &GuestHalf {
            flags: GF_ACTIVE,
            cs_flags: CS_HARDIRQ,
            policy: POLICY_FIFO,
            rt_priority: 42,
            update_ns: 123_456_789,
            hardirq_count: 1000,
            softirq_count: 200,
            switch_count: 55,
            rt_switch_count: 21,
            ..Default::default()
        },
    )
    .unwrap();
    r.write_guest(
        2,
        &GuestHalf {
            flags: GF_ACTIVE | GF_BOOST_REQ,
            policy: POLICY_NORMAL,
            nice: 5,
            guest_pending: PENDING_VALID | (u64::from(POLICY_RR) << PENDING_POLICY_SHIFT) | 10,
            boost_req_count: 1,
            lock_holder: 2,
            lock_flags: LOCK_F_WRITE | LOCK_F_SLEEP,
            lock_contended_count: 7,
            lock_preempted_count: 2,
            lock_named_contended_count: 5,
            lock_named_preempted_count: 1,
            ..Default::default()
        },
    )
    .unwrap();
    r.write_host(
        1,
        &HostHalf {
            status: HS_RUNNING,
            flags: HF_BOOSTED,
            policy: HOST_POLICY_FIFO,
            rt_priority: 10,
            boost_count: 3,
            ..Default::default()
        },
    )
    .unwrap();
    owned
}

fn with_header(edit: impl FnOnce(&mut Header)) -> OwnedRegion {
    let owned = valid();
    let mut h = owned.region().header();
    edit(&mut h);
    owned.region().write_header(&h);
    owned
}

fn build_vectors() -> Vec<(&'static str, Vec<u8>)> {
    let torn = valid();
    let mut bytes = torn.region().to_bytes();
    bytes[HEADER_SIZE + SLOT_SIZE] |= 1; // slot 1 guest seq odd
    let mut garbage = vec![0u8; 4096];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in garbage.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    vec![
        ("valid_4slots.bin", valid().region().to_bytes()),
        (
            "bad_magic.bin",
            with_header(|h| h.magic = 0x4b4f4f4c_4e4f4e21)
                .region()
                .to_bytes(),
        ),
        (
            "major_2.bin",
            with_header(|h| h.abi_major = 2).region().to_bytes(),
        ),
        (
            "slots_beyond_mapping.bin",
            with_header(|h| h.slot_count = 100).region().to_bytes(),
        ),
        (
            "bad_slot_size.bin",
            with_header(|h| h.slot_size = 96).region().to_bytes(),
        ),
        ("torn_slot1.bin", bytes),
        ("garbage.bin", garbage),
    ]
}

#[test]
fn committed_vectors_match_what_the_generator_builds() {
    let regen = std::env::var_os("PVSCHED_REGEN_VECTORS").is_some();
    for (name, bytes) in build_vectors() {
        let path = testdata().join(name);
        if regen {
            std::fs::write(&path, &bytes).unwrap();
        }
        let committed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            committed == bytes,
            "{name} differs from the generator (regenerate after an ABI change)"
        );
    }
}

fn load(name: &str) -> OwnedRegion {
    let bytes = std::fs::read(testdata().join(name)).unwrap();
    OwnedRegion::from_bytes(&bytes).unwrap()
}

#[test]
fn valid_vector_decodes_to_its_documented_contents() {
    let owned = load("valid_4slots.bin");
    let r = owned.region();

    let v = r.validate().unwrap();
    let s0 = r.read_guest(0).unwrap();
    let s1 = r.read_guest(1).unwrap();
    let s2 = r.read_guest(2).unwrap();
    let s3 = r.read_guest(3).unwrap();
    let h1 = r.read_host(1).unwrap();

    assert_eq!(
        (
            v.header.slot_count,
            v.header.generation,
            v.header.host_features
        ),
        (4, 3, F_ALL)
    );
    assert_eq!(s0.flags, GF_ACTIVE | GF_IDLE);
    assert_eq!(
        (
            s1.policy,
            s1.rt_priority,
            s1.cs_flags,
            s1.hardirq_count,
            s1.rt_switch_count
        ),
        (POLICY_FIFO, 42, CS_HARDIRQ, 1000, 21)
    );
    assert_eq!((s2.flags, s2.nice), (GF_ACTIVE | GF_BOOST_REQ, 5));
    assert_eq!(s2.guest_pending, PENDING_VALID | 0x20a);
    assert_eq!(
        (
            s2.lock_holder,
            s2.lock_flags,
            s2.lock_contended_count,
            s2.lock_preempted_count,
            s2.lock_named_contended_count,
            s2.lock_named_preempted_count
        ),
        (2, LOCK_F_WRITE | LOCK_F_SLEEP, 7, 2, 5, 1)
    );
    assert_eq!(s3.flags, 0);
    assert_eq!(
        (h1.flags, h1.policy, h1.rt_priority),
        (HF_BOOSTED, HOST_POLICY_FIFO, 10)
    );
}

#[test]
fn invalid_vectors_are_refused_with_their_documented_error() {
    let expect: [(&str, IsExpected); 5] = [
        ("bad_magic.bin", |e| matches!(e, AbiError::BadMagic { .. })),
        ("major_2.bin", |e| {
            matches!(e, AbiError::UnsupportedMajor { found: 2, .. })
        }),
        ("slots_beyond_mapping.bin", |e| {
            matches!(e, AbiError::SlotsBeyondMapping { .. })
        }),
        ("bad_slot_size.bin", |e| {
            matches!(e, AbiError::BadSlotSize { found: 96 })
        }),
        ("garbage.bin", |e| matches!(e, AbiError::BadMagic { .. })),
    ];

    for (name, is_expected) in expect {
        let err = load(name).region().validate().unwrap_err();
        assert!(is_expected(&err), "{name}: {err}");
    }
}

#[test]
fn torn_vector_reads_slot1_as_inconsistent_and_the_rest_as_valid() {
    let owned = load("torn_slot1.bin");
    let r = owned.region();

    assert!(r.validate().is_ok());
    assert!(matches!(
        r.read_guest(1),
        Err(ReadError::Inconsistent { slot: 1, .. })
    ));
    assert_eq!(r.read_guest(0).unwrap().flags, GF_ACTIVE | GF_IDLE);
}
