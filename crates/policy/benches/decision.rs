//! Cost of one `VmState::handle` call: the daemon pays it on every event.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use pvsched_abi as abi;
use pvsched_policy::{Decisions, Event, VmLimits, VmState};

const NR_VCPUS: u32 = 4;

fn update(cs_flags: u32, seq: u32) -> Event {
    Event::GuestUpdate {
        vcpu: 1,
        guest: abi::GuestHalf {
            seq,
            flags: abi::GF_ACTIVE,
            cs_flags,
            ..Default::default()
        },
        consistent: true,
    }
}

fn bench_handle(c: &mut Criterion) {
    let on = update(abi::CS_HARDIRQ, 2);
    let off = update(0, 4);

    c.bench_function("guest_update_boost_flip", |b| {
        let mut vm = VmState::new(VmLimits::default(), NR_VCPUS).expect("valid");
        let mut out = Decisions::with_capacity(NR_VCPUS as usize);
        let mut now = 0u64;
        let mut flip = false;
        b.iter(|| {
            // 1 us apart: never reaches max_boost, so every call is a boost or an unboost.
            now += 1_000;
            flip = !flip;
            let ev = if flip { &on } else { &off };
            vm.handle(black_box(now), black_box(ev), &mut out);
            black_box(out.len())
        });
    });

    c.bench_function("tick", |b| {
        let mut vm = VmState::new(VmLimits::default(), NR_VCPUS).expect("valid");
        let mut out = Decisions::with_capacity(NR_VCPUS as usize);
        let mut now = 0u64;
        vm.handle(now, &on, &mut out);
        b.iter(|| {
            now += 1_000;
            vm.handle(black_box(now), black_box(&Event::Tick), &mut out);
            black_box(out.len())
        });
    });
}

criterion_group!(benches, bench_handle);
criterion_main!(benches);
