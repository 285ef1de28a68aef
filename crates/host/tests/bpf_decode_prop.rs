//! decode(): any bytes give an event or a typed error, never a panic; every
//! event survives encode -> decode.

use proptest::prelude::*;
use pvsched_host::events::{decode, wire, DecodeError, EventKind, HostEvent, RawEvent};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
        let r = decode(&bytes);
        if bytes.len() != wire::EVENT_SIZE {
            prop_assert_eq!(r, Err(DecodeError::BadLength { len: bytes.len() }));
        }
    }

    /// Records of the right size with random fields: mostly errors, but
    /// whatever decodes carries the record's ids unchanged.
    #[test]
    fn sized_records(kind in 0u32..9, flags in any::<u32>(), tid in any::<u32>(), vm in any::<u32>(),
                     vcpu in any::<u32>(), cpu in any::<u32>(), arg in any::<u64>(), ts in any::<u64>(),
                     small_flags in any::<bool>()) {
        let flags = if small_flags { flags & wire::PVS_F_ALL } else { flags };
        let raw = RawEvent { ts_ns: ts, kind, flags, tid, vm, vcpu, cpu, arg };
        match decode(&raw.to_bytes()) {
            Ok(ev) => {
                prop_assert_eq!((ev.vm, ev.vcpu, ev.ts_ns), (vm, vcpu, ts));
                if !matches!(ev, HostEvent { kind: EventKind::KvmIrq, .. }) {
                    prop_assert_eq!(ev.tid, tid);
                }
                prop_assert!(flags & !wire::allowed_flags(kind).unwrap() == 0);
            }
            Err(DecodeError::BadLength { .. }) => prop_assert!(false, "right length"),
            Err(_) => {}
        }
    }

    #[test]
    fn raw_round_trip(ts in any::<u64>(), kind in any::<u32>(), flags in any::<u32>(), tid in any::<u32>(),
                      vm in any::<u32>(), vcpu in any::<u32>(), cpu in any::<u32>(), arg in any::<u64>()) {
        let raw = RawEvent { ts_ns: ts, kind, flags, tid, vm, vcpu, cpu, arg };
        prop_assert_eq!(RawEvent::parse(&raw.to_bytes()), Ok(raw));
    }
}
