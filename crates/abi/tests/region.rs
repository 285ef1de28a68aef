//! Behaviour of the region accessors: header initialisation, validation of
//! arbitrary bytes, seqcount reads and writes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use pvsched_abi::*;

type IsExpected = fn(&AbiError) -> bool;

fn region_with(slots: u32) -> OwnedRegion {
    let mut owned = OwnedRegion::zeroed(bar_size(slots) as usize).unwrap();
    owned.region_mut().init_header(slots, F_ALL).unwrap();
    owned
}

#[test]
fn init_header_writes_a_valid_header_for_the_slot_count() {
    let owned = region_with(4);

    let v = owned.region().validate().unwrap();

    assert_eq!(v.header.magic, MAGIC);
    assert_eq!(v.header.abi_major, ABI_MAJOR);
    assert_eq!(v.header.slot_count, 4);
    assert_eq!(v.header.host_features, F_ALL);
    assert_eq!(v.header.generation, 1);
    assert_eq!(v.layout.slot_size, SLOT_SIZE);
}

#[test]
fn reinitialising_bumps_the_generation_and_clears_guest_state() {
    let mut owned = region_with(2);
    let r = owned.region();
    r.write_guest(
        1,
        &GuestHalf {
            flags: GF_ACTIVE,
            policy: POLICY_FIFO,
            ..Default::default()
        },
    )
    .unwrap();

    let generation = owned.region_mut().init_header(2, F_HOST_HALF).unwrap();

    assert_eq!(generation, 2);
    assert_eq!(owned.region().read_guest(1).unwrap(), GuestHalf::default());
}

#[test]
fn init_header_refuses_more_slots_than_fit() {
    let mut owned = OwnedRegion::zeroed(4096).unwrap();

    let err = owned.region_mut().init_header(100, F_ALL).unwrap_err();

    assert!(
        matches!(
            err,
            AbiError::SlotsBeyondMapping {
                slot_count: 100,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn validate_names_each_kind_of_bad_header() {
    let owned = region_with(2);
    let r = owned.region();
    let good = r.header();
    let cases: Vec<(Header, IsExpected)> = vec![
        (
            Header {
                magic: 0xdead,
                ..good
            },
            |e| matches!(e, AbiError::BadMagic { found: 0xdead }),
        ),
        (
            Header {
                abi_major: 2,
                ..good
            },
            |e| {
                matches!(
                    e,
                    AbiError::UnsupportedMajor {
                        found: 2,
                        supported: 1
                    }
                )
            },
        ),
        (
            Header {
                header_size: 64,
                ..good
            },
            |e| matches!(e, AbiError::BadHeaderSize { .. }),
        ),
        (
            Header {
                slot_size: 200,
                ..good
            },
            |e| matches!(e, AbiError::BadSlotSize { .. }),
        ),
        (
            Header {
                slot_count: 0,
                ..good
            },
            |e| matches!(e, AbiError::BadSlotCount { .. }),
        ),
        (
            Header {
                slot_count: 5000,
                ..good
            },
            |e| matches!(e, AbiError::BadSlotCount { .. }),
        ),
        (
            Header {
                slot_count: 16,
                ..good
            },
            |e| matches!(e, AbiError::SlotsBeyondMapping { slot_count: 16, .. }),
        ),
    ];

    for (header, is_expected) in cases {
        r.write_header(&header);
        let err = r.validate().unwrap_err();
        assert!(is_expected(&err), "{header:?} gave {err}");
    }
}

#[test]
fn guest_half_round_trips_through_the_seqcount() {
    let owned = region_with(3);
    let r = owned.region();
    let half = GuestHalf {
        flags: GF_ACTIVE,
        cs_flags: CS_HARDIRQ,
        policy: POLICY_FIFO,
        rt_priority: 42,
        nice: -3,
        hardirq_count: 7,
        guest_pending: PENDING_VALID | 9,
        ..Default::default()
    };

    r.write_guest(2, &half).unwrap();
    let read = r.read_guest(2).unwrap();

    assert_eq!(read, GuestHalf { seq: 2, ..half });
    assert_eq!(r.guest_pending(2).unwrap(), PENDING_VALID | 9);
}

#[test]
fn host_half_writes_leave_seq_even_and_advance_it_by_two() {
    let owned = region_with(1);
    let r = owned.region();
    let host = HostHalf {
        status: HS_RUNNING,
        flags: HF_BOOSTED,
        policy: HOST_POLICY_RR,
        rt_priority: 8,
        ..Default::default()
    };

    r.write_host(0, &host).unwrap();
    r.write_host(0, &host).unwrap();

    assert_eq!(r.read_host(0).unwrap(), HostHalf { seq: 4, ..host });
}

#[test]
fn a_half_stuck_mid_write_reads_as_inconsistent() {
    let owned = region_with(2);
    let r = owned.region();
    r.write_guest(
        1,
        &GuestHalf {
            seq: 0,
            flags: GF_ACTIVE,
            ..Default::default()
        },
    )
    .unwrap();
    // A guest that died between the two seq stores leaves seq odd.
    let mut bytes = r.to_bytes();
    bytes[HEADER_SIZE + SLOT_SIZE] |= 1;
    r.load_bytes(&bytes).unwrap();

    let err = r.read_guest(1).unwrap_err();

    assert_eq!(
        err,
        ReadError::Inconsistent {
            slot: 1,
            retries: READ_RETRIES
        }
    );
}

#[test]
fn slots_outside_the_region_are_refused() {
    let owned = region_with(2);

    let err = owned.region().read_guest(2).unwrap_err();

    assert_eq!(err, ReadError::OutOfRange { slot: 2, limit: 2 });
}

#[test]
fn a_reader_never_sees_a_torn_half_while_a_writer_runs() {
    // Writer keeps every field equal to one counter value; a consistent copy
    // must have them all equal.
    let owned = Arc::new(region_with(1));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (owned, stop) = (owned.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n: u64 = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let v = n as u32;
                owned
                    .region()
                    .write_guest(
                        0,
                        &GuestHalf {
                            flags: v,
                            cs_flags: v,
                            policy: v,
                            rt_priority: v,
                            nice: v as i32,
                            update_ns: n,
                            hardirq_count: n,
                            softirq_count: n,
                            nmi_count: n,
                            switch_count: n,
                            ..Default::default()
                        },
                    )
                    .unwrap();
            }
        })
    };

    let mut consistent = 0;
    for _ in 0..200_000 {
        if let Ok(g) = owned.region().read_guest(0) {
            consistent += 1;
            let v = g.flags;
            assert!(
                [g.cs_flags, g.policy, g.rt_priority, g.nice as u32]
                    .iter()
                    .all(|x| *x == v),
                "{g:?}"
            );
            assert!(
                [
                    g.update_ns,
                    g.hardirq_count,
                    g.softirq_count,
                    g.nmi_count,
                    g.switch_count
                ]
                .iter()
                .all(|x| *x == g.update_ns && *x as u32 == v),
                "{g:?}"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();

    assert!(consistent > 0, "no consistent read at all");
}

#[test]
fn bar_size_is_a_power_of_two_of_at_least_a_page() {
    for slots in [1, 2, 15, 16, 100, MAX_SLOTS] {
        let size = bar_size(slots);
        assert!(
            size.is_power_of_two() && size >= 4096 && size >= region_bytes(slots),
            "{slots}: {size}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_bytes_validate_to_a_view_inside_the_mapping_or_an_error(
        bytes in proptest::collection::vec(any::<u8>(), 128..4096),
        magic_ok in any::<bool>(),
        major_ok in any::<bool>(),
    ) {
        let mut bytes = bytes;
        // Steer some cases past the first checks so deeper ones are reached.
        if magic_ok { bytes[..8].copy_from_slice(&MAGIC.to_le_bytes()); }
        if major_ok { bytes[8..10].copy_from_slice(&ABI_MAJOR.to_le_bytes()); }
        let owned = OwnedRegion::from_bytes(&bytes).unwrap();
        let r = owned.region();

        if let Ok(v) = r.validate() {
            let end = v.layout.header_size as u64 + u64::from(v.layout.slot_count) * v.layout.slot_size as u64;
            prop_assert!(end <= r.len() as u64);
            let mut r2 = OwnedRegion::from_bytes(&bytes).unwrap();
            r2.region_mut().adopt(&v);
            for slot in 0..v.layout.slot_count {
                let _ = r2.region().read_guest(slot);
            }
        }
    }
}

#[test]
fn the_daemons_host_half_write_leaves_the_schedulers_extension_notice_alone() {
    let owned = region_with(2);
    let r = owned.region();
    // The scheduler's store of notice 7 into slot 1 (its own word).
    let notice_at = HEADER_SIZE
        + SLOT_SIZE
        + core::mem::offset_of!(Slot, host)
        + core::mem::offset_of!(HostHalf, ext_notice);
    let mut bytes = r.to_bytes();
    bytes[notice_at..notice_at + 4].copy_from_slice(&7u32.to_le_bytes());
    r.load_bytes(&bytes).unwrap();
    let host = HostHalf {
        status: HS_RUNNING,
        boost_count: 2,
        ..Default::default()
    };

    r.write_host(1, &host).unwrap();

    assert_eq!(r.ext_notice(1).unwrap(), 7);
    assert_eq!(
        r.read_host(1).unwrap(),
        HostHalf {
            seq: 2,
            ext_notice: 7,
            ..host
        }
    );
    assert_eq!(r.ext_notice(0).unwrap(), 0);
}
