//! Recorded-event replay: raw ring-buffer records of the KVM programs
//! (tests/data/kvm_events.json, written by hand from the tracepoint formats)
//! decoded and compared with the events they stand for. The KVM tracepoints
//! only fire where KVM runs a guest, which this machine cannot do; the
//! programs themselves are exercised with BPF_PROG_TEST_RUN in bpf_load.rs.

use pvsched_host::events::{decode, DecodeError, EventKind, HostEvent};
use serde::Deserialize;

#[derive(Deserialize)]
struct Record {
    what: String,
    record: String,
    event: HostEvent,
}

#[derive(Deserialize)]
struct Invalid {
    what: String,
    record: String,
    error: String,
}

#[derive(Deserialize)]
struct Fixture {
    records: Vec<Record>,
    invalid: Vec<Invalid>,
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn fixture() -> Fixture {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/kvm_events.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn kvm_records_decode() {
    let f = fixture();
    assert!(f.records.len() >= 9);
    for r in &f.records {
        assert_eq!(decode(&unhex(&r.record)), Ok(r.event), "{}", r.what);
    }
    // Every KVM event kind and both exit reasons are covered.
    let has = |p: fn(&HostEvent) -> bool| f.records.iter().any(|r| p(&r.event));
    assert!(has(|e| matches!(
        e,
        HostEvent {
            kind: EventKind::KvmExit {
                reason: pvsched_host::events::KvmExitReason::Hlt,
                ..
            },
            ..
        }
    )));
    assert!(has(|e| matches!(
        e,
        HostEvent {
            kind: EventKind::KvmExit {
                reason: pvsched_host::events::KvmExitReason::Pause,
                ..
            },
            ..
        }
    )));
    assert!(has(|e| matches!(
        e,
        HostEvent {
            kind: EventKind::KvmHaltWakeup { polled: true, .. },
            ..
        }
    )));
    assert!(has(|e| matches!(
        e,
        HostEvent {
            kind: EventKind::KvmHaltWakeup { polled: false, .. },
            ..
        }
    )));
    assert!(has(|e| matches!(
        e,
        HostEvent {
            kind: EventKind::KvmIrq,
            ..
        }
    )));
}

#[test]
fn invalid_records_are_errors() {
    for r in fixture().invalid {
        let err = decode(&unhex(&r.record)).expect_err(&r.what);
        let name = match err {
            DecodeError::BadLength { .. } => "BadLength",
            DecodeError::UnknownKind(_) => "UnknownKind",
            DecodeError::BadFlags { .. } => "BadFlags",
            DecodeError::BadExitReason(_) => "BadExitReason",
            DecodeError::BadRivals(_) => "BadRivals",
            DecodeError::BadWaker(_) => "BadWaker",
        };
        assert_eq!(name, r.error, "{}", r.what);
    }
}

/// Events serialize to the JSON the fixture uses (for recorded replay).
#[test]
fn events_round_trip_through_json() {
    for r in fixture().records {
        let s = serde_json::to_string(&r.event).unwrap();
        assert_eq!(serde_json::from_str::<HostEvent>(&s).unwrap(), r.event);
    }
}
