//! Hostile region contents at scale, the daemon's way: any bytes as a region image ->
//! `OwnedRegion::from_bytes` -> `validate` (a VM whose header fails is not served) -> its
//! geometry adopted once -> `read_guest` per slot -> `Event::GuestUpdate` into a `VmState`
//! with random valid limits, between host events (preempt, wake, halt, KVM exits, ticks) with
//! time advancing, while the guest keeps rewriting any byte of the region. Ticks arrive at
//! every `next_deadline()`, as the daemon's timer delivers them.
//!
//! Whatever the bytes: no panic; every decision names a vCPU the VM has and stays inside its
//! limits (allowed policy, RT priority in 1..=max_rt_priority, nice in range); boosted time
//! stays within the budgets (one window banked plus what they earn, under 1 ns of slack per
//! vCPU); a snapshot of the region validates as the region does.

mod common;

use common::{arb_half, arb_limits, check_budgets, check_params, Charged};
use proptest::prelude::*;
use pvsched_abi as abi;
use pvsched_abi::{GuestHalf, OwnedRegion};
use pvsched_policy::{Decisions, Event, ExitReason, Rivals, VmLimits, VmState, WakeSource};

/// Cases of the property; each runs up to 150 steps.
const CASES: u32 = 20_000;

/// Ticks at one instant before we call it a livelock.
const MAX_TICKS_AT_ONCE: usize = 8;

/// Gaps are capped at this many of the limits' shortest period (each period costs a tick
/// or two: a 1 ns period would otherwise cost a tick per ns).
const MAX_PERIODS_PER_GAP: u64 = 64;

/// A region built the way a guest that knows the ABI would lay it out, then damaged:
/// a header for `slots` slots (the mapping `delta` bytes longer or shorter than it needs),
/// guest halves written under their seqcount, some seqs overwritten raw (odd: mid-update),
/// and random byte runs written anywhere, header included.
fn shaped_image(
    slots: u32,
    delta: i64,
    features: u64,
    halves: &[(GuestHalf, Option<u32>)],
    damage: &[(prop::sample::Index, Vec<u8>)],
) -> Vec<u8> {
    let len = usize::try_from(abi::region_bytes(slots) as i64 + delta).unwrap_or(0);
    let Ok(mut r) = OwnedRegion::zeroed(len) else {
        return vec![0; len];
    };
    // May not fit: then the header stays zero and validation refuses the region.
    let _ = r.region_mut().init_header(slots, features);
    for (i, (half, _)) in halves.iter().enumerate() {
        let _ = r.region().write_guest(i as u32, half);
    }
    let mut bytes = r.region().to_bytes();
    for (i, (_, seq)) in halves.iter().enumerate() {
        let off = abi::HEADER_SIZE + i * abi::SLOT_SIZE;
        if let (Some(seq), Some(word)) = (seq, bytes.get_mut(off..off + 4)) {
            word.copy_from_slice(&seq.to_le_bytes());
        }
    }
    for (at, run) in damage {
        let off = at.index(bytes.len().max(1));
        for (b, v) in bytes.iter_mut().skip(off).zip(run) {
            *b = *v;
        }
    }
    bytes
}

fn arb_image() -> impl Strategy<Value = Vec<u8>> {
    let anything = prop::collection::vec(any::<u8>(), 0..3_000);
    let halves = prop::collection::vec((arb_half(), prop::option::weighted(0.2, any::<u32>())), 8);
    let damage = prop::collection::vec(
        (
            any::<prop::sample::Index>(),
            prop::collection::vec(any::<u8>(), 1..24),
        ),
        0..4,
    );
    let shaped = (1u32..=8, -300i64..=300, any::<u64>(), halves, damage).prop_map(
        |(slots, delta, features, halves, damage)| {
            shaped_image(slots, delta, features, &halves, &damage)
        },
    );
    prop_oneof![1 => anything, 4 => shaped]
}

/// What happens next: the daemon reads a slot, a host event, or the guest writes.
#[derive(Clone, Debug)]
enum Step {
    /// A seqcount read of this slot's guest half, fed to the policy.
    Read(u32),
    /// A host event (switch, wakeup, KVM exit, interrupt, timer, overload hint).
    Host(Event),
    /// The guest publishes a whole half under its seqcount (a well-formed writer).
    Publish(u32, GuestHalf),
    /// The guest writes raw bytes anywhere in the region (header, host halves, mid-half).
    Poke(prop::sample::Index, Vec<u8>),
}

/// Slot / vCPU indices: mostly the VM's, sometimes just past them, sometimes anything.
fn arb_index() -> impl Strategy<Value = u32> {
    prop_oneof![8 => 0u32..8, 1 => 8u32..12, 1 => any::<u32>()]
}

fn arb_step() -> impl Strategy<Value = Step> {
    let host = prop_oneof![
        arb_index().prop_map(|vcpu| Event::Running { vcpu }),
        arb_index().prop_map(|vcpu| Event::Preempted {
            vcpu,
            rivals: Rivals::Host
        }),
        arb_index().prop_map(|vcpu| Event::Blocked {
            vcpu,
            rivals: Rivals::Host
        }),
        arb_index().prop_map(|vcpu| Event::Woken {
            vcpu,
            source: WakeSource::Io,
            cpu_idle: false,
            rivals: Rivals::Host,
        }),
        arb_index().prop_map(|vcpu| Event::InterruptTargeted { vcpu }),
        arb_index().prop_map(|vcpu| Event::KvmExit {
            vcpu,
            reason: ExitReason::Hlt,
        }),
        Just(Event::Tick),
        any::<bool>().prop_map(|overloaded| Event::OverloadHint { overloaded }),
    ];
    prop_oneof![
        6 => arb_index().prop_map(Step::Read),
        4 => host.prop_map(Step::Host),
        2 => (arb_index(), arb_half()).prop_map(|(v, h)| Step::Publish(v, h)),
        1 => (
            any::<prop::sample::Index>(),
            prop::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(at, bytes)| Step::Poke(at, bytes)),
    ]
}

/// Gaps between steps: mostly short, sometimes zero, sometimes long.
fn arb_gap() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..=200_000,
        3 => 0u64..=20_000_000,
        1 => Just(0u64),
        1 => 0u64..=2_000_000_000,
    ]
}

/// Feeds the steps to a `VmState` for `nr` vCPUs reading `region`, ticking at every deadline.
fn serve(
    region: &mut OwnedRegion,
    limits: &VmLimits,
    nr: u32,
    steps: &[(u64, Step)],
) -> Result<(), TestCaseError> {
    let mut vm = VmState::new(limits.clone(), nr).expect("arb_limits are valid");
    let mut out = Decisions::with_capacity(nr as usize);
    let mut charged = Charged {
        all: 0,
        cs: vec![0; nr as usize],
    };
    let period = limits
        .max_boost_ns
        .min(limits.throttle_ns)
        .min(limits.proactive_boost_ns)
        .min(limits.cs_window_ns);
    let max_gap = period.saturating_mul(MAX_PERIODS_PER_GAP);

    let mut deliver = |vm: &mut VmState, at: u64, ev: &Event| -> Result<(), TestCaseError> {
        charged.add(vm, at.saturating_sub(vm.now()));
        vm.handle(at, ev, &mut out);
        for d in out.iter() {
            prop_assert!(d.vcpu < nr, "decision for vCPU {} of {}", d.vcpu, nr);
            check_params(limits, d)?;
        }
        Ok(())
    };

    let mut now = 0u64;
    for (gap, step) in steps {
        let t = now.saturating_add((*gap).min(max_gap));
        let mut same = (0usize, u64::MAX);
        while let Some(d) = vm.next_deadline().filter(|&d| d <= t) {
            let at = d.max(vm.now());
            same = if at == same.1 {
                (same.0 + 1, at)
            } else {
                (1, at)
            };
            prop_assert!(same.0 <= MAX_TICKS_AT_ONCE, "deadline livelock at {at}");
            deliver(&mut vm, at, &Event::Tick)?;
        }
        match step {
            Step::Read(slot) => {
                let (guest, consistent) = match region.region().read_guest(*slot) {
                    Ok(g) => (g, true),
                    Err(_) => (GuestHalf::default(), false),
                };
                let ev = Event::GuestUpdate {
                    vcpu: *slot,
                    guest,
                    consistent,
                };
                deliver(&mut vm, t, &ev)?;
            }
            Step::Host(ev) => deliver(&mut vm, t, ev)?,
            Step::Publish(slot, half) => {
                let _ = region.region().write_guest(*slot, half);
            }
            Step::Poke(at, run) => {
                let mut bytes = region.region().to_bytes();
                let off = at.index(bytes.len());
                for (b, v) in bytes.iter_mut().skip(off).zip(run) {
                    *b = *v;
                }
                region
                    .region()
                    .load_bytes(&bytes)
                    .expect("same length as the region");
            }
        }
        now = t;
    }
    check_budgets(limits, nr, vm.now(), &charged)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn hostile_region_contents_never_panic_nor_act_outside_the_vms_limits(
        image in arb_image(),
        limits in arb_limits(),
        nr in 1u32..=8,
        steps in prop::collection::vec((arb_gap(), arb_step()), 0..150),
    ) {
        let Ok(mut region) = OwnedRegion::from_bytes(&image) else {
            // Shorter than a header: refused before any read.
            prop_assert!(image.len() < abi::HEADER_SIZE);
            return Ok(());
        };
        let validated = region.region().validate();
        let snapshot = OwnedRegion::from_bytes(&region.region().to_bytes())
            .expect("a region's own bytes make a region");
        prop_assert_eq!(snapshot.region().validate(), validated.clone());
        let Ok(validated) = validated else {
            // The daemon does not serve a VM whose header fails.
            return Ok(());
        };
        prop_assert!(validated.layout.slot_count <= region.region().layout().slot_count);
        region.region_mut().adopt(&validated);

        serve(&mut region, &limits, nr, &steps)?;
    }
}
