//! Behaviour of the engine through its public API, one rule per test (Arrange-Act-Assert).

use pvsched_abi as abi;
use pvsched_abi::GuestHalf;
use pvsched_policy::{
    AllowedPolicies, Decision, Decisions, Event, EventKind, ExitReason, HostPolicy, LimitsError,
    Reason, RunStatus, SchedParams, VmLimits, VmState, WakeSource,
};

const MS: u64 = 1_000_000;

/// The limits these rule tests use: defaults with the priorities spelled out, so the rules
/// are tested apart from the default band.
fn base() -> VmLimits {
    VmLimits {
        boost_priority: 8,
        max_rt_priority: 10,
        deadline_priority: 8,
        ..VmLimits::default()
    }
}

fn vm(limits: VmLimits, n: u32) -> VmState {
    VmState::new(limits, n).expect("valid limits")
}

fn step(vm: &mut VmState, now: u64, ev: Event) -> Vec<Decision> {
    let mut out = Decisions::new();
    vm.handle(now, &ev, &mut out);
    out.to_vec()
}

fn half(seq: u32) -> GuestHalf {
    GuestHalf {
        seq,
        flags: abi::GF_ACTIVE,
        ..Default::default()
    }
}

fn cs(seq: u32, flags: u32) -> GuestHalf {
    GuestHalf {
        cs_flags: flags,
        ..half(seq)
    }
}

fn task(seq: u32, policy: u32, prio: u32, nice: i32) -> GuestHalf {
    GuestHalf {
        policy,
        rt_priority: prio,
        nice,
        ..half(seq)
    }
}

fn idle(seq: u32) -> GuestHalf {
    GuestHalf {
        flags: abi::GF_ACTIVE | abi::GF_IDLE,
        ..half(seq)
    }
}

fn upd(vcpu: u32, guest: GuestHalf) -> Event {
    Event::GuestUpdate {
        vcpu,
        guest,
        consistent: true,
    }
}

fn rt(policy: HostPolicy, prio: u8) -> SchedParams {
    SchedParams {
        policy,
        rt_priority: prio,
        nice: 0,
    }
}

fn cfs(policy: HostPolicy, nice: i8) -> SchedParams {
    SchedParams {
        policy,
        rt_priority: 0,
        nice,
    }
}

fn pending(policy: u32, prio: u64) -> u64 {
    abi::PENDING_VALID | ((policy as u64) << abi::PENDING_POLICY_SHIFT) | prio
}

fn target(vm: &VmState, vcpu: u32) -> (SchedParams, Reason) {
    let t = vm.target(vcpu).expect("vcpu exists");
    (t.params, t.reason)
}

/// Delivers Ticks at every deadline up to `until` (inclusive), collecting decisions.
fn tick_until(vm: &mut VmState, until: u64) -> Vec<(u64, Decision)> {
    let mut all = Vec::new();
    while let Some(d) = vm.next_deadline() {
        if d > until {
            break;
        }
        let at = d.max(vm.now());
        for dec in step(vm, at, Event::Tick) {
            all.push((at, dec));
        }
    }
    all
}

// ---- 1. critical sections ----

#[test]
fn critical_section_boosts_to_boost_policy_and_priority() {
    let mut vm = vm(base(), 2);

    let out = step(&mut vm, 10, upd(1, cs(2, abi::CS_HARDIRQ)));

    assert_eq!(out.len(), 1);
    assert_eq!(out[0].vcpu, 1);
    assert_eq!(out[0].params, rt(HostPolicy::Rr, 8));
    assert_eq!(out[0].reason, Reason::CriticalSection(abi::CS_HARDIRQ));
    assert!(!out[0].throttled && !out[0].in_debt);
}

#[test]
fn critical_section_is_ignored_when_not_honored() {
    let limits = VmLimits {
        honor_critical_sections: false,
        ..base()
    };
    let mut vm = vm(limits, 1);

    let out = step(&mut vm, 10, upd(0, cs(2, abi::CS_ALL)));

    assert!(out.is_empty());
    assert_eq!(target(&vm, 0), (SchedParams::NORMAL, Reason::None));
}

#[test]
fn boost_priority_is_capped_by_max_rt_priority() {
    let limits = VmLimits {
        boost_priority: 50,
        max_rt_priority: 5,
        ..base()
    };
    let mut vm = vm(limits, 1);

    let out = step(&mut vm, 10, upd(0, cs(2, abi::CS_NMI)));

    assert_eq!(out[0].params, rt(HostPolicy::Rr, 5));
}

#[test]
fn boost_uses_the_other_rt_class_when_boost_policy_is_not_allowed() {
    let limits = VmLimits {
        allowed: AllowedPolicies {
            rr: false,
            ..AllowedPolicies::default()
        },
        ..base()
    };
    let mut vm = vm(limits, 1);

    let out = step(&mut vm, 10, upd(0, cs(2, abi::CS_LOCK)));

    assert_eq!(out[0].params, rt(HostPolicy::Fifo, 8));
}

#[test]
fn no_boost_when_no_rt_class_is_allowed() {
    let limits = VmLimits {
        allowed: AllowedPolicies::NO_RT,
        ..base()
    };
    let mut vm = vm(limits, 1);

    let out = step(&mut vm, 10, upd(0, cs(2, abi::CS_LOCK)));
    let out2 = step(&mut vm, 20, upd(0, task(4, abi::POLICY_FIFO, 50, 0)));

    assert!(out.is_empty() && out2.is_empty());
    assert!(!vm.target(0).unwrap().params.is_rt());
}

// ---- 2. guest task translation ----

#[test]
fn guest_fifo_task_translates_one_to_one() {
    let mut vm = vm(base(), 1);

    let out = step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 3, 0)));

    assert_eq!(out[0].params, rt(HostPolicy::Fifo, 3));
    assert_eq!(
        out[0].reason,
        Reason::GuestRt {
            policy: abi::POLICY_FIFO,
            priority: 3
        }
    );
}

#[test]
fn guest_rt_priority_is_capped_at_max_rt_priority() {
    let mut vm = vm(base(), 1);

    let out = step(&mut vm, 10, upd(0, task(2, abi::POLICY_RR, 99, 0)));

    assert_eq!(out[0].params, rt(HostPolicy::Rr, 10));
}

#[test]
fn guest_rr_task_falls_back_to_fifo_when_rr_is_not_allowed() {
    let limits = VmLimits {
        allowed: AllowedPolicies {
            rr: false,
            ..AllowedPolicies::default()
        },
        ..base()
    };
    let mut vm = vm(limits, 1);

    let out = step(&mut vm, 10, upd(0, task(2, abi::POLICY_RR, 4, 0)));

    assert_eq!(out[0].params, rt(HostPolicy::Fifo, 4));
}

#[test]
fn guest_rt_task_is_ignored_when_guest_rt_not_honored() {
    let limits = VmLimits {
        honor_guest_rt: false,
        ..base()
    };
    let mut vm = vm(limits, 1);

    let out = step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 4, 0)));

    assert!(out.is_empty());
}

#[test]
fn guest_normal_nice_is_clamped_into_the_nice_range() {
    let mut vm = vm(base(), 1);

    let raised = step(&mut vm, 10, upd(0, task(2, abi::POLICY_NORMAL, 0, -10)));
    let lowered = step(&mut vm, 20, upd(0, task(4, abi::POLICY_NORMAL, 0, 7)));

    assert!(raised.is_empty(), "nice -10 clamps to nice_min 0 = plain");
    assert_eq!(lowered[0].params, cfs(HostPolicy::Other, 7));
    assert_eq!(lowered[0].reason, Reason::GuestNice);
}

#[test]
fn guest_batch_task_maps_to_host_batch_when_allowed() {
    let mut vm = vm(base(), 1);

    let out = step(&mut vm, 10, upd(0, task(2, abi::POLICY_BATCH, 0, 3)));

    assert_eq!(out[0].params, cfs(HostPolicy::Batch, 3));
    assert_eq!(out[0].reason, Reason::GuestNice);
}

#[test]
fn guest_batch_task_maps_to_other_when_batch_is_not_allowed() {
    let limits = VmLimits {
        allowed: AllowedPolicies {
            batch: false,
            ..AllowedPolicies::default()
        },
        ..base()
    };
    let mut vm = vm(limits, 1);

    let out = step(&mut vm, 10, upd(0, task(2, abi::POLICY_BATCH, 0, 3)));

    assert_eq!(out[0].params, cfs(HostPolicy::Other, 3));
}

#[test]
fn guest_idle_task_maps_to_other_at_nice_max_by_default() {
    let mut vm = vm(base(), 1);

    let out = step(&mut vm, 10, upd(0, task(2, abi::POLICY_IDLE, 0, 0)));

    assert_eq!(out[0].params, cfs(HostPolicy::Other, 19));
}

#[test]
fn guest_idle_task_maps_to_host_idle_when_allowed() {
    let limits = VmLimits {
        allowed: AllowedPolicies::ALL,
        ..base()
    };
    let mut vm = vm(limits, 1);

    let out = step(&mut vm, 10, upd(0, task(2, abi::POLICY_IDLE, 0, 0)));

    assert_eq!(out[0].params.policy, HostPolicy::Idle);
}

#[test]
fn guest_deadline_task_maps_to_fifo_at_deadline_priority() {
    let limits = VmLimits {
        deadline_priority: 9,
        ..base()
    };
    let mut vm = vm(limits, 1);

    let out = step(&mut vm, 10, upd(0, task(2, abi::POLICY_DEADLINE, 0, 0)));

    assert_eq!(out[0].params, rt(HostPolicy::Fifo, 9));
    assert_eq!(out[0].reason, Reason::GuestDeadline);
}

#[test]
fn unknown_guest_policy_is_treated_as_normal_and_counted() {
    let mut vm = vm(base(), 1);

    let out = step(&mut vm, 10, upd(0, task(2, 77, 50, 4)));

    assert_eq!(out[0].params, cfs(HostPolicy::Other, 4));
    assert_eq!(
        vm.vm_stats().clamped_inputs_total,
        2,
        "policy and rt_priority"
    );
    assert_eq!(vm.vcpu_stats(0).unwrap().clamped_inputs, 2);
}

#[test]
fn explicit_boost_request_boosts_when_honored() {
    let mut vm = vm(base(), 1);
    let mut h = half(2);
    h.flags |= abi::GF_BOOST_REQ;

    let out = step(&mut vm, 10, upd(0, h));

    assert_eq!(out[0].params, rt(HostPolicy::Rr, 8));
    assert_eq!(out[0].reason, Reason::BoostRequest);
}

#[test]
fn explicit_boost_request_is_ignored_when_not_honored() {
    let limits = VmLimits {
        honor_boost_request: false,
        ..base()
    };
    let mut vm = vm(limits, 1);
    let mut h = half(2);
    h.flags |= abi::GF_BOOST_REQ;

    assert!(step(&mut vm, 10, upd(0, h)).is_empty());
}

#[test]
fn idle_guest_cpu_task_fields_and_boost_request_are_ignored() {
    let mut vm = vm(base(), 1);
    let mut h = task(2, abi::POLICY_FIFO, 5, 10);
    h.flags |= abi::GF_IDLE | abi::GF_BOOST_REQ;

    let out = step(&mut vm, 10, upd(0, h));

    assert!(out.is_empty());
}

#[test]
fn valid_pending_hint_boosts_at_the_hinted_priority_capped() {
    let mut vm = vm(base(), 1);
    let mut h = half(2);
    h.guest_pending = pending(abi::POLICY_FIFO, 6);

    let out = step(&mut vm, 10, upd(0, h));
    h.guest_pending = pending(abi::POLICY_RR, 60);
    let out2 = step(&mut vm, 20, upd(0, GuestHalf { seq: 4, ..h }));

    assert_eq!(out[0].params, rt(HostPolicy::Fifo, 6));
    assert_eq!(out[0].reason, Reason::PendingHint);
    assert_eq!(out2[0].params, rt(HostPolicy::Rr, 10));
}

#[test]
fn pending_hint_with_reserved_bits_is_ignored_and_counted() {
    let mut vm = vm(base(), 1);
    let mut h = half(2);
    h.guest_pending = pending(abi::POLICY_FIFO, 6) | (1 << 33);

    let out = step(&mut vm, 10, upd(0, h));

    assert!(out.is_empty());
    assert_eq!(vm.vm_stats().clamped_inputs_total, 1);
}

#[test]
fn pending_hint_is_ignored_when_not_honored() {
    let limits = VmLimits {
        honor_pending_hint: false,
        ..base()
    };
    let mut vm = vm(limits, 1);
    let mut h = half(2);
    h.guest_pending = pending(abi::POLICY_FIFO, 6);

    assert!(step(&mut vm, 10, upd(0, h)).is_empty());
}

#[test]
fn strongest_reason_is_the_highest_priority() {
    let mut vm = vm(base(), 1);
    let mut h = task(2, abi::POLICY_FIFO, 9, 0);
    h.cs_flags = abi::CS_SOFTIRQ; // boost at RR 8

    let out = step(&mut vm, 10, upd(0, h));

    assert_eq!(out[0].params, rt(HostPolicy::Fifo, 9));
    assert!(matches!(out[0].reason, Reason::GuestRt { .. }));
}

#[test]
fn equal_priority_tie_goes_to_the_critical_section() {
    let mut vm = vm(base(), 1);
    let mut h = task(2, abi::POLICY_FIFO, 8, 0);
    h.cs_flags = abi::CS_SOFTIRQ;
    h.flags |= abi::GF_BOOST_REQ;
    h.guest_pending = pending(abi::POLICY_FIFO, 8);

    let out = step(&mut vm, 10, upd(0, h));

    assert_eq!(out[0].reason, Reason::CriticalSection(abi::CS_SOFTIRQ));
    assert_eq!(out[0].params, rt(HostPolicy::Rr, 8));
}

// ---- 3. proactive boosts ----

#[test]
fn proactive_wake_boosts_until_a_tick_at_its_deadline() {
    let mut vm = vm(base(), 1);

    let out = step(
        &mut vm,
        100,
        Event::Woken {
            vcpu: 0,
            source: WakeSource::Timer,
        },
    );
    let early = step(&mut vm, 100 + MS - 1, Event::Tick);
    let deadline = vm.next_deadline();
    let late = step(&mut vm, 100 + MS, Event::Tick);

    assert_eq!(out[0].params, rt(HostPolicy::Rr, 8));
    assert_eq!(out[0].reason, Reason::ProactiveWake);
    assert!(early.is_empty());
    assert_eq!(deadline, Some(100 + MS));
    assert_eq!(late[0].params, SchedParams::NORMAL);
    assert_eq!(late[0].reason, Reason::None);
}

#[test]
fn proactive_irq_boosts_when_an_interrupt_is_targeted() {
    let mut vm = vm(base(), 1);

    let out = step(&mut vm, 100, Event::InterruptTargeted { vcpu: 0 });

    assert_eq!(out[0].reason, Reason::ProactiveIrq);
    assert!(out[0].params.is_rt());
}

#[test]
fn halt_without_recent_guest_rt_work_is_not_boosted() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 10, upd(0, task(2, abi::POLICY_NORMAL, 0, 0)));

    let a = step(&mut vm, 100, Event::Blocked { vcpu: 0 });
    let b = step(
        &mut vm,
        200,
        Event::KvmExit {
            vcpu: 0,
            reason: ExitReason::Hlt,
        },
    );

    assert!(a.is_empty() && b.is_empty());
}

#[test]
fn halt_after_recent_guest_rt_work_keeps_the_vcpu_boosted_on_block_and_on_hlt_exit() {
    // Arrange: RT work, then the guest halts without a slot read in between.
    let mut blocked = vm(base(), 1);
    let mut hlt = vm(base(), 1);
    for vm in [&mut blocked, &mut hlt] {
        step(vm, 10, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    }

    // Act
    let a = step(&mut blocked, 100, Event::Blocked { vcpu: 0 });
    let b = step(
        &mut hlt,
        100,
        Event::KvmExit {
            vcpu: 0,
            reason: ExitReason::Hlt,
        },
    );

    // Assert
    assert_eq!(a[0].reason, Reason::ProactiveHalt);
    assert_eq!(b[0].reason, Reason::ProactiveHalt);
}

#[test]
fn a_guest_going_idle_after_rt_work_keeps_a_boost_until_it_halts_instead_of_an_unboost() {
    // Arrange
    let mut vm = vm(base(), 1);
    let rt = step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    assert!(rt[0].params.is_rt());

    // Act: the slot says idle (about to halt), then the halt.
    let idle_read = step(&mut vm, 20, upd(0, idle(4)));
    let halt = step(&mut vm, 30, Event::Blocked { vcpu: 0 });

    // Assert: boosted throughout, as a halt boost; no unboost in between.
    assert!(idle_read.iter().all(|d| d.params.is_rt()), "{idle_read:?}");
    assert_eq!(idle_read[0].reason, Reason::ProactiveHalt);
    assert!(halt.iter().all(|d| d.params.is_rt()), "{halt:?}");
}

#[test]
fn the_cycle_rt_work_idle_halt_rt_work_keeps_the_same_thread_parameters() {
    // Arrange: RT work at priority 9 (above the boost priority, 8, within the cap, 10).
    let mut vm = vm(base(), 1);
    let rt = step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 9, 0)));
    let boosted = rt[0].params;
    assert!(boosted.is_rt() && boosted.rt_priority == 9, "{rt:?}");

    // Act: idle, halt, woken, the same RT work again.
    let mut seen = Vec::new();
    seen.extend(step(&mut vm, 20, upd(0, idle(4))));
    seen.extend(step(&mut vm, 30, Event::Blocked { vcpu: 0 }));
    seen.extend(step(
        &mut vm,
        1_000_000,
        Event::Woken {
            vcpu: 0,
            source: WakeSource::Timer,
        },
    ));
    seen.extend(step(
        &mut vm,
        1_000_010,
        upd(0, task(6, abi::POLICY_FIFO, 9, 0)),
    ));

    // Assert: reasons change, the parameters never do.
    assert!(seen.iter().all(|d| d.params == boosted), "{seen:?}");
}

#[test]
fn halt_boost_is_not_given_once_the_rt_work_is_older_than_halt_boost_ns() {
    // Arrange
    let limits = base();
    let mut vm = vm(limits.clone(), 1);
    step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));

    // Act: idle and halted only after the window.
    let idle_read = step(&mut vm, 11 + limits.halt_boost_ns, upd(0, idle(4)));
    let halt = step(
        &mut vm,
        12 + limits.halt_boost_ns,
        Event::Blocked { vcpu: 0 },
    );

    // Assert
    assert!(!idle_read[0].params.is_rt(), "{idle_read:?}");
    assert!(halt.is_empty(), "{halt:?}");
}

#[test]
fn halt_boost_can_be_switched_off() {
    let limits = VmLimits {
        proactive_halt: false,
        ..base()
    };
    let mut vm = vm(limits, 1);
    step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));

    let out = step(&mut vm, 100, Event::Blocked { vcpu: 0 });

    assert!(out.is_empty() || !out[0].params.is_rt());
}

#[test]
fn halt_boost_ends_when_the_woken_guest_runs_nothing_urgent() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    step(&mut vm, 20, upd(0, idle(4)));
    step(&mut vm, 30, Event::Blocked { vcpu: 0 });

    let out = step(&mut vm, 40, upd(0, task(6, abi::POLICY_NORMAL, 0, 0)));

    assert_eq!(out[0].params, SchedParams::NORMAL);
}

#[test]
fn halted_time_does_not_count_toward_max_boost() {
    let limits = base();
    let mut vm = vm(limits.clone(), 1);
    step(&mut vm, 0, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    step(&mut vm, 10 * MS, Event::Blocked { vcpu: 0 });

    // Halted (halt-boosted) for 80 ms: past max_boost in wall time, yet no throttle.
    let out = step(&mut vm, 90 * MS, Event::Tick);

    assert!(out.is_empty());
    assert!(target(&vm, 0).0.is_rt());
}

#[test]
fn proactive_boosts_can_be_switched_off() {
    let limits = VmLimits {
        proactive_wake: false,
        proactive_irq: false,
        ..base()
    };
    let mut vm = vm(limits, 1);

    let a = step(
        &mut vm,
        100,
        Event::Woken {
            vcpu: 0,
            source: WakeSource::Io,
        },
    );
    let b = step(&mut vm, 200, Event::InterruptTargeted { vcpu: 0 });

    assert!(a.is_empty() && b.is_empty());
    assert_eq!(vm.next_deadline(), None);
}

#[test]
fn proactive_boost_ends_when_the_guest_writes_without_a_reason() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 10, upd(0, half(2)));
    step(&mut vm, 100, Event::InterruptTargeted { vcpu: 0 });

    let out = step(&mut vm, 200, upd(0, half(4)));

    assert_eq!(out[0].params, SchedParams::NORMAL);
}

#[test]
fn proactive_boost_survives_a_reread_of_the_stale_guest_half() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 10, upd(0, half(2)));
    step(&mut vm, 100, Event::InterruptTargeted { vcpu: 0 });

    let out = step(&mut vm, 200, upd(0, half(2)));

    assert!(out.is_empty());
    assert_eq!(vm.target(0).unwrap().reason, Reason::ProactiveIrq);
}

#[test]
fn guest_reason_takes_over_from_a_proactive_boost() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 100, Event::InterruptTargeted { vcpu: 0 });

    let confirm = step(&mut vm, 200, upd(0, cs(2, abi::CS_HARDIRQ)));
    let done = step(&mut vm, 300, upd(0, half(4)));

    assert_eq!(confirm[0].reason, Reason::CriticalSection(abi::CS_HARDIRQ));
    assert_eq!(
        done[0].params,
        SchedParams::NORMAL,
        "no proactive left over"
    );
}

// ---- 4. unboost ----

#[test]
fn guest_update_without_reasons_unboosts() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 10, upd(0, cs(2, abi::CS_HARDIRQ)));

    let out = step(&mut vm, 20, upd(0, half(4)));

    assert_eq!(out[0].params, SchedParams::NORMAL);
    assert_eq!(out[0].reason, Reason::None);
}

#[test]
fn clearing_gf_active_drops_every_guest_reason() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    let mut h = task(4, abi::POLICY_FIFO, 5, 0);
    h.flags = abi::GF_BOOST_REQ;
    h.cs_flags = abi::CS_ALL;

    let out = step(&mut vm, 20, upd(0, h));

    assert_eq!(out[0].params, SchedParams::NORMAL);
}

#[test]
fn inconsistent_read_soon_after_a_consistent_one_keeps_the_last_view() {
    // A vCPU preempted in the middle of its update leaves seq odd: no news, not "no request".
    let mut vm = vm(base(), 1);
    step(&mut vm, 10, upd(0, cs(2, abi::CS_HARDIRQ)));
    let grace = base().inconsistent_grace_ns;

    let out = step(
        &mut vm,
        10 + grace,
        Event::GuestUpdate {
            vcpu: 0,
            guest: cs(5, 0),
            consistent: false,
        },
    );

    assert!(out.is_empty());
    assert!(target(&vm, 0).0.is_rt());
}

#[test]
fn inconsistent_read_past_the_grace_is_treated_as_no_request() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 10, upd(0, cs(2, abi::CS_HARDIRQ)));
    let grace = base().inconsistent_grace_ns;

    let out = step(
        &mut vm,
        11 + grace,
        Event::GuestUpdate {
            vcpu: 0,
            guest: cs(4, abi::CS_HARDIRQ),
            consistent: false,
        },
    );

    assert_eq!(out[0].params, SchedParams::NORMAL);
}

#[test]
fn inconsistent_read_with_no_consistent_one_before_is_no_request() {
    let mut vm = vm(base(), 1);

    let out = step(
        &mut vm,
        10,
        Event::GuestUpdate {
            vcpu: 0,
            guest: cs(4, abi::CS_HARDIRQ),
            consistent: false,
        },
    );

    assert!(out.is_empty());
    assert_eq!(target(&vm, 0).0, SchedParams::NORMAL);
}

// ---- 5. throttling ----

#[test]
fn a_brief_unboost_does_not_restart_the_max_boost_clock() {
    // Boosted 40 ms, unboosted 1 ms, boosted again: the burst is 39 ms, so the throttle
    // comes 11 ms into the second boost, not 50.
    let limits = base();
    let mut vm = vm(limits.clone(), 1);
    let ms = 1_000_000;
    step(&mut vm, 0, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    step(&mut vm, 40 * ms, upd(0, task(4, abi::POLICY_NORMAL, 0, 0)));
    step(&mut vm, 41 * ms, upd(0, task(6, abi::POLICY_FIFO, 5, 0)));

    let deadline = vm.next_deadline();
    let out = step(&mut vm, 52 * ms, Event::Tick);

    assert_eq!(deadline, Some(52 * ms));
    assert_eq!(out[0].reason, Reason::Throttled);
}

#[test]
fn unboosted_time_drains_the_burst_one_to_one() {
    let limits = base();
    let mut vm = vm(limits.clone(), 1);
    let ms = 1_000_000;
    step(&mut vm, 0, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    step(&mut vm, 40 * ms, upd(0, task(4, abi::POLICY_NORMAL, 0, 0)));
    step(&mut vm, 80 * ms, upd(0, task(6, abi::POLICY_FIFO, 5, 0)));

    // 40 ms boosted, 40 ms not: the next boost gets the full 50 ms again.
    assert_eq!(vm.next_deadline(), Some(130 * ms));
}

#[test]
fn tick_at_max_boost_throttles_a_continuous_boost() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 1_000, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));

    let before = step(&mut vm, 1_000 + 50 * MS - 1, Event::Tick);
    let at = step(&mut vm, 1_000 + 50 * MS, Event::Tick);

    assert!(before.is_empty());
    assert_eq!(at[0].params, SchedParams::NORMAL);
    assert_eq!(at[0].reason, Reason::Throttled);
    assert!(at[0].throttled);
    assert_eq!(vm.vm_stats().throttles_total, 1);
}

#[test]
fn next_deadline_reports_the_throttle_instant_while_boosted() {
    let mut vm = vm(base(), 1);

    step(&mut vm, 1_000, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));

    assert_eq!(vm.next_deadline(), Some(1_000 + 50 * MS));
}

#[test]
fn changing_boost_reasons_does_not_restart_the_boost_clock() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 0, upd(0, cs(2, abi::CS_HARDIRQ)));

    step(&mut vm, 30 * MS, upd(0, task(4, abi::POLICY_FIFO, 9, 0)));

    assert_eq!(vm.next_deadline(), Some(50 * MS));
}

#[test]
fn throttle_lasts_throttle_ns_then_a_present_reason_reboosts_with_a_new_clock() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 0, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    step(&mut vm, 50 * MS, Event::Tick);

    let during = step(&mut vm, 99 * MS, upd(0, task(4, abi::POLICY_FIFO, 6, 0)));
    let deadline = vm.next_deadline();
    let after = step(&mut vm, 100 * MS, Event::Tick);

    assert!(during.is_empty(), "throttled: new requests refused");
    assert_eq!(deadline, Some(100 * MS));
    assert_eq!(after[0].params, rt(HostPolicy::Fifo, 6));
    assert_eq!(vm.next_deadline(), Some(150 * MS));
}

#[test]
fn throttled_vcpu_keeps_its_guest_nice() {
    let mut vm = vm(base(), 1);
    let mut h = task(2, abi::POLICY_NORMAL, 0, 4);
    h.flags |= abi::GF_BOOST_REQ;
    step(&mut vm, 0, upd(0, h));

    let out = step(&mut vm, 50 * MS, Event::Tick);

    assert_eq!(out[0].params, cfs(HostPolicy::Other, 4));
    assert_eq!(out[0].reason, Reason::Throttled);
}

#[test]
fn guest_rt_task_spinning_for_5s_is_never_boosted_longer_than_max_boost() {
    let mut vm = vm(base(), 1);
    let start = step(&mut vm, 0, upd(0, task(2, abi::POLICY_FIFO, 50, 0)));

    let later = tick_until(&mut vm, 5_000 * MS);

    let mut boosted_since = Some(0u64);
    let mut boosted_total = 0;
    let mut longest = 0;
    assert!(start[0].params.is_rt());
    for (at, d) in later {
        match (d.params.is_rt(), boosted_since) {
            (true, None) => boosted_since = Some(at),
            (false, Some(s)) => {
                longest = longest.max(at - s);
                boosted_total += at - s;
                boosted_since = None;
            }
            _ => {}
        }
    }
    assert_eq!(longest, 50 * MS);
    // 50 ms on, 50 ms off: half of 5 s.
    assert_eq!(boosted_total, 2_500 * MS);
}

// ---- 6. eventual fairness ----

fn debt_limits() -> VmLimits {
    VmLimits {
        boost_share_permille: 250,
        fairness_window_ns: 10 * MS,
        max_boost_ns: 10_000 * MS,
        ..base()
    }
}

#[test]
fn boosting_beyond_the_share_puts_unboosted_vcpus_at_debt_nice() {
    // 2 vCPUs x 25 % = 0.5 vCPU-ns earned per ns; the bucket holds 0.5 x 10 ms = 5 ms.
    let mut vm = vm(debt_limits(), 2);
    step(&mut vm, 0, upd(0, cs(2, abi::CS_LOCK)));
    // One vCPU boosted: spend 1, earn 0.5 per ns; 5 ms of tokens last 10 ms.
    let debt_start = vm.next_deadline();

    let at_start = step(&mut vm, 10 * MS + 1, Event::Tick);

    assert_eq!(debt_start, Some(10 * MS + 1));
    assert!(vm.in_debt());
    assert_eq!(at_start.len(), 1, "only the unboosted vCPU changes");
    assert_eq!(at_start[0].vcpu, 1);
    assert_eq!(at_start[0].params, cfs(HostPolicy::Other, 5));
    assert_eq!(at_start[0].reason, Reason::Debt);
    assert!(at_start[0].in_debt);
}

#[test]
fn debt_drains_as_budget_accrues_and_then_params_return_to_normal() {
    let mut vm = vm(debt_limits(), 2);
    step(&mut vm, 0, upd(0, cs(2, abi::CS_LOCK)));
    step(&mut vm, 10 * MS + 1, Event::Tick);

    // At 20 ms: 20 ms x 0.5 net spend - 5 ms of tokens = 5 ms of debt.
    let unboost = step(&mut vm, 20 * MS, upd(0, half(4)));
    let debt_ns = vm.vm_stats().debt_ns;
    let paid_at = vm.next_deadline();
    let paid = step(&mut vm, 30 * MS, Event::Tick);

    assert_eq!(unboost[0].params, cfs(HostPolicy::Other, 5));
    assert_eq!(debt_ns, 5 * MS);
    assert_eq!(paid_at, Some(30 * MS), "repaid 1:1 at 0.5 vCPU per ns");
    assert!(!vm.in_debt());
    assert_eq!(paid.len(), 2);
    assert!(paid
        .iter()
        .all(|d| d.params == SchedParams::NORMAL && d.reason == Reason::None));
}

#[test]
fn debt_nice_never_lowers_a_higher_guest_nice() {
    let mut vm = vm(debt_limits(), 2);
    step(&mut vm, 0, upd(1, task(2, abi::POLICY_NORMAL, 0, 12)));
    step(&mut vm, 0, upd(0, cs(2, abi::CS_LOCK)));

    let out = step(&mut vm, 10 * MS + 1, Event::Tick);

    assert!(vm.in_debt());
    assert!(out.is_empty());
    assert_eq!(
        target(&vm, 1),
        (cfs(HostPolicy::Other, 12), Reason::GuestNice)
    );
}

#[test]
fn halted_boosted_vcpu_is_not_charged() {
    let limits = VmLimits {
        proactive_halt: true,
        ..debt_limits()
    };
    let mut vm = vm(limits, 2);
    step(&mut vm, 0, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    step(&mut vm, 0, upd(0, idle(4)));
    step(&mut vm, 0, Event::Blocked { vcpu: 0 });
    assert!(target(&vm, 0).0.is_rt(), "halt-boosted");

    step(&mut vm, MS / 2, Event::Tick);

    assert_eq!(vm.vm_stats().boosted_vcpus, 0);
    assert_eq!(vm.vm_stats().boosted_ns_total, 0);
}

// ---- 7. decisions only on change ----

#[test]
fn repeating_the_same_guest_update_emits_nothing() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 10, upd(0, cs(2, abi::CS_HARDIRQ)));

    let out = step(&mut vm, 20, upd(0, cs(2, abi::CS_HARDIRQ)));

    assert!(out.is_empty());
}

#[test]
fn critical_section_flags_changing_under_the_same_params_emit_nothing() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 10, upd(0, cs(2, abi::CS_HARDIRQ)));

    let out = step(&mut vm, 20, upd(0, cs(4, abi::CS_SOFTIRQ)));

    assert!(out.is_empty());
    assert_eq!(target(&vm, 0).1, Reason::CriticalSection(abi::CS_SOFTIRQ));
    assert_eq!(vm.target(0).unwrap().since, 10);
}

#[test]
fn scheduler_events_without_consequences_emit_nothing() {
    let mut vm = vm(base(), 1);

    let a = step(&mut vm, 10, Event::Running { vcpu: 0 });
    let b = step(&mut vm, 20, Event::Preempted { vcpu: 0 });
    let c = step(&mut vm, 30, Event::OverloadHint { overloaded: true });

    assert!(a.is_empty() && b.is_empty() && c.is_empty());
}

// ---- robustness, stats, host half ----

#[test]
fn out_of_range_vcpu_is_ignored_and_counted() {
    let mut vm = vm(base(), 2);

    let out = step(&mut vm, 10, upd(7, cs(2, abi::CS_NMI)));
    let out2 = step(
        &mut vm,
        20,
        Event::Woken {
            vcpu: u32::MAX,
            source: WakeSource::Unknown,
        },
    );

    assert!(out.is_empty() && out2.is_empty());
    assert_eq!(vm.vm_stats().out_of_range_events, 2);
    assert!(vm.target(7).is_none());
    assert!(vm.vcpu_stats(7).is_none());
    assert_eq!(vm.host_half(7, 30), abi::HostHalf::default());
}

#[test]
fn time_going_backwards_is_handled_at_the_latest_now_and_counted() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 1_000, upd(0, cs(2, abi::CS_NMI)));

    step(&mut vm, 10, Event::Tick);

    assert_eq!(vm.now(), 1_000);
    assert_eq!(vm.vm_stats().time_regressions, 1);
    assert_eq!(vm.next_deadline(), Some(1_000 + 50 * MS));
}

#[test]
fn host_half_reports_status_flags_params_and_counters() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 0, Event::Running { vcpu: 0 });
    step(&mut vm, 0, upd(0, cs(2, abi::CS_HARDIRQ)));
    step(&mut vm, 5, Event::Preempted { vcpu: 0 });
    step(&mut vm, 6, Event::OverloadHint { overloaded: true });

    let h = vm.host_half(0, 100);

    assert_eq!(h.seq, 0);
    assert_eq!(h.status, abi::HS_PREEMPTED);
    assert_eq!(h.flags, abi::HF_BOOSTED | abi::HF_OVERLOADED);
    assert_eq!(h.policy, abi::HOST_POLICY_RR);
    assert_eq!(h.rt_priority, 8);
    assert_eq!(h.update_ns, 100);
    assert_eq!(h.boost_count, 1);
    assert_eq!(h.preempt_count, 1);
    // Boosted from the preemption at 5 (running, the critical section asked for nothing).
    assert_eq!(h.boosted_ns, 95);
}

#[test]
fn critical_section_of_a_running_vcpu_starts_no_boost_until_it_is_preempted() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 0, Event::Running { vcpu: 0 });

    let while_running = step(&mut vm, 10, upd(0, cs(2, abi::CS_HARDIRQ)));
    let on_preemption = step(&mut vm, 20, Event::Preempted { vcpu: 0 });
    let running_again = step(&mut vm, 30, Event::Running { vcpu: 0 });
    let flags_clear = step(&mut vm, 40, upd(0, cs(4, 0)));

    assert!(while_running.is_empty());
    assert_eq!(
        on_preemption[0].reason,
        Reason::CriticalSection(abi::CS_HARDIRQ)
    );
    assert!(
        running_again.is_empty(),
        "a boost it has is kept while the flags stay set"
    );
    assert_eq!(flags_clear[0].params, SchedParams::NORMAL);
}

#[test]
fn host_half_reports_throttled_and_halted() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 0, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    step(&mut vm, 50 * MS, Event::Tick);
    step(&mut vm, 51 * MS, Event::Blocked { vcpu: 0 });

    let h = vm.host_half(0, 52 * MS);

    assert_eq!(h.status, abi::HS_HALTED);
    assert_eq!(h.flags, abi::HF_THROTTLED);
    assert_eq!(h.throttle_count, 1);
    assert_eq!(h.boosted_ns, 50 * MS);
}

#[test]
fn vm_stats_count_events_by_kind() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 1, Event::Tick);
    step(&mut vm, 2, Event::Tick);
    step(&mut vm, 3, Event::Running { vcpu: 0 });

    let s = vm.vm_stats();

    assert_eq!(s.events_of(EventKind::Tick), 2);
    assert_eq!(s.events_of(EventKind::Running), 1);
    assert_eq!(s.events_of(EventKind::GuestUpdate), 0);
    assert_eq!(vm.vcpu_stats(0).unwrap().status, RunStatus::Running);
}

#[test]
fn new_limits_take_effect_at_the_next_event() {
    let mut vm = vm(base(), 2);
    step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 9, 0)));

    vm.set_limits(VmLimits {
        max_rt_priority: 3,
        ..base()
    })
    .unwrap();
    let deadline = vm.next_deadline();
    let out = step(&mut vm, 20, Event::Tick);

    assert_eq!(deadline, Some(10));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].params, rt(HostPolicy::Fifo, 3));
}

#[test]
fn invalid_limits_are_refused_and_the_old_ones_kept() {
    let mut vm = vm(base(), 1);

    let err = vm.set_limits(VmLimits {
        max_rt_priority: 0,
        ..base()
    });

    assert_eq!(err, Err(LimitsError::MaxRtPriority(0)));
    assert_eq!(vm.limits(), &base());
}

#[test]
fn vm_needs_between_one_and_max_vcpus() {
    assert_eq!(VmState::new(base(), 0).err(), Some(LimitsError::NrVcpus(0)));
    assert_eq!(
        VmState::new(base(), 4097).err(),
        Some(LimitsError::NrVcpus(4097))
    );
    assert!(VmState::new(base(), 4096).is_ok());
}

#[test]
fn nice_range_excluding_zero_applies_at_the_first_event() {
    let limits = VmLimits {
        nice_min: 2,
        nice_max: 10,
        ..base()
    };
    let mut vm = vm(limits, 2);

    let out = step(&mut vm, 0, Event::Tick);

    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|d| d.params == cfs(HostPolicy::Other, 2)));
}

#[test]
fn default_boosts_stay_in_a_band_below_host_rt_work_at_5() {
    let limits = VmLimits::default();
    let mut vm = vm(limits.clone(), 1);

    let out = step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 99, 0)));

    assert_eq!(out[0].params, rt(HostPolicy::Fifo, 4));
    assert!(limits.boost_priority <= limits.max_rt_priority && limits.max_rt_priority < 5);
}
