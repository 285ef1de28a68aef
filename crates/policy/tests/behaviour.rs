//! Behaviour of the engine through its public API, one rule per test (Arrange-Act-Assert).

use pvsched_abi as abi;
use pvsched_abi::GuestHalf;
use pvsched_policy::{
    AllowedPolicies, Decision, Decisions, Event, EventKind, ExitReason, HostPolicy, LimitsError,
    Reason, Rivals, RunStatus, SchedParams, VmLimits, VmState, WakeSource,
};

const MS: u64 = 1_000_000;

/// The limits these rule tests use: defaults with the priorities spelled out, so the rules
/// are tested apart from the default band; no demotion of long bursts and a boost budget of
/// half the vCPU time (each tested on its own), so that max_boost's 50/50 cycle stands alone.
fn base() -> VmLimits {
    VmLimits {
        boost_priority: 8,
        max_rt_priority: 10,
        deadline_priority: 8,
        demote_after_ns: u64::MAX,
        boost_share_permille: 500,
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

/// The host preempted vCPU `vcpu` (with rivals outside the VM: what the host reports
/// unless it sees none).
fn was_preempted(vcpu: u32) -> Event {
    Event::Preempted {
        vcpu,
        rivals: Rivals::Host,
    }
}

/// vCPU `vcpu` halted (with rivals, as [`was_preempted`]).
fn halted(vcpu: u32) -> Event {
    Event::Blocked {
        vcpu,
        rivals: Rivals::Host,
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
    tick_until_then(vm, until, |_| None)
}

/// Like [`tick_until`] on a loaded host: a vCPU runs at once when boosted and is preempted
/// by host work when unboosted, and the policy hears of each switch.
fn tick_until_loaded(vm: &mut VmState, until: u64) -> Vec<(u64, Decision)> {
    tick_until_then(vm, until, |dec| {
        let vcpu = dec.vcpu;
        Some(if dec.params.is_rt() {
            Event::Running { vcpu }
        } else {
            was_preempted(vcpu)
        })
    })
}

/// Ticks at every deadline up to `until`; after each decision, `then` may name an event
/// that follows it at once.
fn tick_until_then(
    vm: &mut VmState,
    until: u64,
    mut then: impl FnMut(&Decision) -> Option<Event>,
) -> Vec<(u64, Decision)> {
    let mut all = Vec::new();
    while let Some(d) = vm.next_deadline() {
        if d > until {
            break;
        }
        let at = d.max(vm.now());
        for dec in step(vm, at, Event::Tick) {
            let next = then(&dec);
            all.push((at, dec));
            if let Some(ev) = next {
                for more in step(vm, at, ev) {
                    all.push((at, more));
                }
            }
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

    let out = step(&mut vm, 10, upd(0, cs(2, abi::CS_HARDIRQ)));

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

    let out = step(&mut vm, 10, upd(0, cs(2, abi::CS_SOFTIRQ)));

    assert_eq!(out[0].params, rt(HostPolicy::Fifo, 8));
}

#[test]
fn no_boost_when_no_rt_class_is_allowed() {
    let limits = VmLimits {
        allowed: AllowedPolicies::NO_RT,
        ..base()
    };
    let mut vm = vm(limits, 1);

    let out = step(&mut vm, 10, upd(0, cs(2, abi::CS_SOFTIRQ)));
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
fn decisions_say_whether_the_vm_ran_rt_work_and_a_boost_is_decided_anew_when_that_ends() {
    let mut vm = vm(
        VmLimits {
            max_boost_ns: u64::MAX / 4,
            ..base()
        },
        1,
    );

    let rt_task = step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    // Idle after RT work: a halt boost, for halt_boost_ns (100 ms) from now.
    let halting = step(&mut vm, 20, upd(0, idle(4)));
    let within = step(&mut vm, 10 + 100 * MS, Event::Tick);
    let after = step(&mut vm, 11 + 100 * MS, Event::Tick);

    assert!(rt_task[0].rt_work);
    assert_eq!(halting[0].reason, Reason::ProactiveHalt);
    assert!(halting[0].rt_work);
    assert!(within.is_empty(), "{within:?}");
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(
        (after[0].reason, after[0].params),
        (Reason::ProactiveHalt, halting[0].params),
        "the same boost, decided anew"
    );
    assert!(!after[0].rt_work);
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
            cpu_idle: false,
            rivals: Rivals::Host,
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
fn a_wakeup_onto_an_idle_host_cpu_starts_no_proactive_boost() {
    let mut vm = vm(base(), 1);

    let out = step(
        &mut vm,
        100,
        Event::Woken {
            vcpu: 0,
            source: WakeSource::Timer,
            cpu_idle: true,
            rivals: Rivals::Host,
        },
    );

    assert!(out.is_empty(), "{out:?}");
    assert_eq!(vm.next_deadline(), None);
}

// ---- speculative boosts need a rival outside the VM ----

/// The rule-test limits with `boost_only_against_rivals` spelled out (the default).
fn rivals_only() -> VmLimits {
    VmLimits {
        boost_only_against_rivals: true,
        ..base()
    }
}

#[test]
fn a_vcpu_preempted_in_a_critical_section_with_no_rival_outside_its_vm_is_not_boosted() {
    // Arrange: vCPU 0 in an interrupt handler.
    let mut vm = vm(rivals_only(), 2);
    step(&mut vm, 5, Event::Running { vcpu: 0 });
    step(&mut vm, 10, upd(0, cs(2, abi::CS_HARDIRQ)));

    // Act: preempted while only the VM's own threads (or nothing) run.
    let alone = step(
        &mut vm,
        20,
        Event::Preempted {
            vcpu: 0,
            rivals: Rivals::None,
        },
    );
    step(&mut vm, 30, Event::Running { vcpu: 0 });
    // ... and again with a host task on some CPU.
    let contended = step(&mut vm, 40, was_preempted(0));

    // Assert
    assert!(alone.iter().all(|d| !d.params.is_rt()), "{alone:?}");
    assert_eq!(target(&vm, 0).1, Reason::CriticalSection(abi::CS_HARDIRQ));
    assert!(contended[0].params.is_rt(), "{contended:?}");
}

/// The host woke vCPU `vcpu` on a busy CPU, seeing rivals outside the VM or not.
fn woken_busy(vcpu: u32, rivals: Rivals) -> Event {
    Event::Woken {
        vcpu,
        source: WakeSource::Timer,
        cpu_idle: false,
        rivals,
    }
}

#[test]
fn with_no_rival_a_vm_without_recent_rt_work_gets_no_proactive_boost() {
    // Arrange: a guest that speaks but runs no RT work.
    let mut vm = vm(rivals_only(), 2);
    step(&mut vm, 10, upd(0, task(2, abi::POLICY_NORMAL, 0, 0)));

    // Act: vCPU 1 woken and interrupted with nothing from outside the VM running.
    let wake = step(&mut vm, 20, woken_busy(1, Rivals::None));
    let irq = step(&mut vm, 30, Event::InterruptTargeted { vcpu: 1 });
    // ... then woken with a rival.
    let contended = step(&mut vm, 40, woken_busy(1, Rivals::Host));

    // Assert
    assert!(wake.is_empty(), "{wake:?}");
    assert!(irq.is_empty(), "{irq:?}");
    assert_eq!(contended[0].reason, Reason::ProactiveWake, "{contended:?}");
}

#[test]
fn with_no_rival_a_vm_that_ran_guest_rt_work_recently_keeps_its_speculative_boosts() {
    // Arrange: vCPU 0 runs a guest RT task, and the host last saw no rival.
    let mut vm = vm(rivals_only(), 2);
    step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    step(&mut vm, 20, Event::Running { vcpu: 0 });
    step(
        &mut vm,
        30,
        Event::Preempted {
            vcpu: 0,
            rivals: Rivals::None,
        },
    );

    // Act: vCPU 0 goes idle (halt boost due), then runs a CFS task; its sibling, which ran
    // no RT work itself, is woken within halt_boost_ns of that work, and again long after.
    let halt = step(&mut vm, 40, upd(0, idle(4)));
    step(&mut vm, 50, upd(0, task(6, abi::POLICY_NORMAL, 0, 0)));
    let soon = step(&mut vm, 60, woken_busy(1, Rivals::None));
    step(&mut vm, 70, upd(1, task(2, abi::POLICY_NORMAL, 0, 0)));
    let late_at = 10 + base().halt_boost_ns + MS;
    tick_until(&mut vm, late_at);
    let late = step(&mut vm, late_at, woken_busy(1, Rivals::None));

    // Assert
    assert_eq!(halt[0].reason, Reason::ProactiveHalt, "{halt:?}");
    assert!(halt[0].params.is_rt(), "{halt:?}");
    assert_eq!(soon[0].reason, Reason::ProactiveWake, "{soon:?}");
    assert!(late.is_empty(), "{late:?}");
    assert_eq!(target(&vm, 1), (SchedParams::NORMAL, Reason::None));
}

#[test]
fn speculative_boosts_ignore_rivals_when_boost_only_against_rivals_is_off() {
    let limits = VmLimits {
        boost_only_against_rivals: false,
        ..base()
    };
    let mut vm = vm(limits, 2);
    step(&mut vm, 5, Event::Running { vcpu: 0 });
    step(&mut vm, 10, upd(0, cs(2, abi::CS_HARDIRQ)));

    let preempted = step(
        &mut vm,
        20,
        Event::Preempted {
            vcpu: 0,
            rivals: Rivals::None,
        },
    );
    let wake = step(
        &mut vm,
        30,
        Event::Woken {
            vcpu: 1,
            source: WakeSource::Timer,
            cpu_idle: false,
            rivals: Rivals::None,
        },
    );

    assert_eq!(
        preempted[0].reason,
        Reason::CriticalSection(abi::CS_HARDIRQ)
    );
    assert_eq!(wake[0].reason, Reason::ProactiveWake);
}

#[test]
fn with_speculative_boosts_needing_rt_work_only_a_vm_that_ran_it_gets_them_even_with_rivals() {
    // Arrange: two VMs, both preempted and woken with rivals outside them; one runs only
    // CFS tasks, the other a guest RT task on vCPU 1.
    let limits = VmLimits {
        speculative_boosts_need_rt_work: true,
        ..rivals_only()
    };
    let mut batch = vm(limits.clone(), 2);
    let mut rt = vm(limits, 2);
    for vm in [&mut batch, &mut rt] {
        step(vm, 5, Event::Running { vcpu: 0 });
        step(vm, 10, upd(0, cs(2, abi::CS_HARDIRQ)));
    }
    step(&mut batch, 15, upd(1, task(2, abi::POLICY_NORMAL, 0, 0)));
    step(&mut rt, 15, upd(1, task(2, abi::POLICY_FIFO, 5, 0)));

    // Act: vCPU 0 preempted in its interrupt handler; its sibling woken on a busy CPU,
    // then an interrupt for it.
    let batch_cs = step(&mut batch, 20, was_preempted(0));
    let batch_wake = step(&mut batch, 30, woken_busy(1, Rivals::Host));
    let batch_irq = step(&mut batch, 40, Event::InterruptTargeted { vcpu: 1 });
    let rt_cs = step(&mut rt, 20, was_preempted(0));

    // Assert: none for the VM without RT work; the critical section for the other.
    assert!(batch_cs.iter().all(|d| !d.params.is_rt()), "{batch_cs:?}");
    assert!(
        batch_wake.iter().all(|d| !d.params.is_rt()),
        "{batch_wake:?}"
    );
    assert!(batch_irq.iter().all(|d| !d.params.is_rt()), "{batch_irq:?}");
    assert_eq!(target(&batch, 0), (SchedParams::NORMAL, Reason::None));
    assert_eq!(
        rt_cs[0].reason,
        Reason::CriticalSection(abi::CS_HARDIRQ),
        "{rt_cs:?}"
    );
    assert!(rt_cs[0].params.is_rt(), "{rt_cs:?}");
}

#[test]
fn with_only_other_served_vms_as_rivals_a_vm_without_rt_work_gets_no_speculative_boost_unless_they_count(
) {
    // Arrange: two copies of a VM that runs no RT work, with vCPU 0 in an interrupt
    // handler; the second counts other served VMs as rivals.
    let counted = VmLimits {
        peer_vms_are_rivals: true,
        ..rivals_only()
    };
    let mut vms = [vm(rivals_only(), 2), vm(counted, 2)];
    for vm in &mut vms {
        step(vm, 5, Event::Running { vcpu: 0 });
        step(vm, 10, upd(0, cs(2, abi::CS_HARDIRQ)));
        step(vm, 15, upd(1, task(2, abi::POLICY_NORMAL, 0, 0)));
    }
    let preempted_by_peer = Event::Preempted {
        vcpu: 0,
        rivals: Rivals::PeerVms,
    };

    // Act: vCPU 0 preempted and vCPU 1 woken while only another served VM's threads run;
    // then vCPU 1 woken again with a host task running.
    let [ref mut plain, ref mut peers_count] = vms;
    let cs_plain = step(plain, 20, preempted_by_peer);
    let wake_plain = step(plain, 30, woken_busy(1, Rivals::PeerVms));
    let host_plain = step(plain, 40, woken_busy(1, Rivals::Host));
    let cs_counted = step(peers_count, 20, preempted_by_peer);
    let wake_counted = step(peers_count, 30, woken_busy(1, Rivals::PeerVms));

    // Assert: by default only the host task starts a boost; counted, the peer does.
    assert!(cs_plain.iter().all(|d| !d.params.is_rt()), "{cs_plain:?}");
    assert!(wake_plain.is_empty(), "{wake_plain:?}");
    assert_eq!(
        host_plain[0].reason,
        Reason::ProactiveWake,
        "{host_plain:?}"
    );
    assert_eq!(
        cs_counted[0].reason,
        Reason::CriticalSection(abi::CS_HARDIRQ),
        "{cs_counted:?}"
    );
    assert_eq!(
        wake_counted[0].reason,
        Reason::ProactiveWake,
        "{wake_counted:?}"
    );
}

#[test]
fn with_only_other_served_vms_as_rivals_a_vm_that_ran_rt_work_keeps_its_speculative_boosts() {
    // Arrange: vCPU 1 runs a guest RT task; vCPU 0 is in an interrupt handler.
    let mut vm = vm(rivals_only(), 2);
    step(&mut vm, 5, Event::Running { vcpu: 0 });
    step(&mut vm, 10, upd(0, cs(2, abi::CS_HARDIRQ)));
    step(&mut vm, 15, upd(1, task(2, abi::POLICY_FIFO, 5, 0)));

    // Act: vCPU 0 preempted while only another served VM's threads run.
    let out = step(
        &mut vm,
        20,
        Event::Preempted {
            vcpu: 0,
            rivals: Rivals::PeerVms,
        },
    );

    // Assert
    assert_eq!(
        out[0].reason,
        Reason::CriticalSection(abi::CS_HARDIRQ),
        "{out:?}"
    );
}

#[test]
fn a_boost_started_with_rivals_is_kept_when_they_leave() {
    let mut vm = vm(rivals_only(), 1);
    step(&mut vm, 5, Event::Running { vcpu: 0 });
    step(&mut vm, 10, upd(0, cs(2, abi::CS_HARDIRQ)));
    let boosted = step(&mut vm, 20, was_preempted(0));

    let later = step(
        &mut vm,
        30,
        Event::Preempted {
            vcpu: 0,
            rivals: Rivals::None,
        },
    );

    assert!(boosted[0].params.is_rt());
    assert!(later.is_empty(), "{later:?}");
    assert_eq!(target(&vm, 0).1, Reason::CriticalSection(abi::CS_HARDIRQ));
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

    let a = step(&mut vm, 100, halted(0));
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
    let a = step(&mut blocked, 100, halted(0));
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
fn rt_work_that_ran_between_two_idle_reads_earns_a_halt_boost_through_the_rt_switch_count() {
    // Arrange: every read finds the guest idle (under KVM the RT task runs between the
    // host's reads); only the second one shows the RT switch count moved.
    let counted = |seq, n| GuestHalf {
        rt_switch_count: n,
        ..idle(seq)
    };
    let mut moved = vm(base(), 1);
    let mut still = vm(base(), 1);
    step(&mut moved, 10, upd(0, counted(2, 7)));
    step(&mut still, 10, upd(0, counted(2, 7)));

    // Act
    step(&mut moved, 20, upd(0, counted(4, 9)));
    step(&mut still, 20, upd(0, counted(4, 7)));
    step(&mut moved, 100, halted(0));
    step(&mut still, 100, halted(0));

    // Assert: boosted across the halt, from the idle read on.
    let (params, reason) = target(&moved, 0);
    assert!(
        params.is_rt() && reason == Reason::ProactiveHalt,
        "{reason:?}"
    );
    assert!(!target(&still, 0).0.is_rt());
}

#[test]
fn a_guest_going_idle_after_rt_work_keeps_a_boost_until_it_halts_instead_of_an_unboost() {
    // Arrange
    let mut vm = vm(base(), 1);
    let rt = step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    assert!(rt[0].params.is_rt());

    // Act: the slot says idle (about to halt), then the halt.
    let idle_read = step(&mut vm, 20, upd(0, idle(4)));
    let halt = step(&mut vm, 30, halted(0));

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
    seen.extend(step(&mut vm, 30, halted(0)));
    seen.extend(step(
        &mut vm,
        1_000_000,
        Event::Woken {
            vcpu: 0,
            source: WakeSource::Timer,
            cpu_idle: false,
            rivals: Rivals::Host,
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
    let halt = step(&mut vm, 12 + limits.halt_boost_ns, halted(0));

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

    let out = step(&mut vm, 100, halted(0));

    assert!(out.is_empty() || !out[0].params.is_rt());
}

#[test]
fn halt_boost_ends_when_the_woken_guest_runs_nothing_urgent() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    step(&mut vm, 20, upd(0, idle(4)));
    step(&mut vm, 30, halted(0));

    let out = step(&mut vm, 40, upd(0, task(6, abi::POLICY_NORMAL, 0, 0)));

    assert_eq!(out[0].params, SchedParams::NORMAL);
}

#[test]
fn halted_time_does_not_count_toward_max_boost() {
    let limits = base();
    let mut vm = vm(limits.clone(), 1);
    step(&mut vm, 0, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    step(&mut vm, 10 * MS, halted(0));

    // Halted (halt-boosted) for 80 ms: past max_boost in wall time, yet no throttle.
    let out = step(&mut vm, 90 * MS, Event::Tick);

    assert!(out.is_empty());
    assert!(target(&vm, 0).0.is_rt());
}

#[test]
fn a_boosted_vcpu_waiting_for_a_cpu_is_neither_throttled_demoted_nor_charged() {
    let limits = VmLimits::default();
    let mut vm = vm(limits.clone(), 1);
    step(&mut vm, 0, upd(0, task(2, abi::POLICY_FIFO, 99, 0)));
    step(&mut vm, 0, was_preempted(0));

    // Waits 100 ms behind an equal RT priority (a rogue VM's spinning vCPU): past
    // max_boost and demote_after in wall time.
    let waiting = tick_until(&mut vm, 100 * MS);
    let charged_waiting = vm.vcpu_stats(0).unwrap().boosted_ns;
    let ran = step(&mut vm, 100 * MS, Event::Running { vcpu: 0 });
    let on_cpu = tick_until(&mut vm, 100 * MS + limits.demote_after_ns);

    assert!(waiting.is_empty() && ran.is_empty());
    assert_eq!(charged_waiting, 0);
    assert_eq!(vm.vm_stats().throttles_total, 0);
    // Its own CPU time still counts: demoted after demote_after on a CPU.
    assert_eq!(on_cpu.len(), 1);
    assert_eq!(on_cpu[0].0, 100 * MS + limits.demote_after_ns);
    assert_eq!(on_cpu[0].1.params.rt_priority, 1);
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
            cpu_idle: false,
            rivals: Rivals::Host,
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

// ---- 6. fairness budgets ----

fn debt_limits() -> VmLimits {
    VmLimits {
        latch_nice: 5,
        boost_share_permille: 250,
        fairness_window_ns: 10 * MS,
        budget_resume_permille: 1000,
        max_boost_ns: 10_000 * MS,
        ..base()
    }
}

fn fifo(seq: u32) -> GuestHalf {
    task(seq, abi::POLICY_FIFO, 5, 0)
}

/// Boosted time per vCPU in `decisions` (one vCPU-time list per vCPU, never halted), each
/// boost running from its decision to the next non-RT one or `until`; and the longest one.
fn boosted_time(
    first: &[(u64, Decision)],
    later: &[(u64, Decision)],
    nr: usize,
    until: u64,
) -> (u64, u64) {
    let mut since: Vec<Option<u64>> = vec![None; nr];
    let (mut total, mut longest) = (0, 0);
    for (at, d) in first.iter().chain(later) {
        let s = &mut since[d.vcpu as usize];
        match (d.params.is_rt(), *s) {
            (true, None) => *s = Some(*at),
            (false, Some(b)) => {
                total += at - b;
                longest = longest.max(at - b);
                *s = None;
            }
            _ => {}
        }
    }
    for b in since.into_iter().flatten() {
        total += until - b;
        longest = longest.max(until - b);
    }
    (total, longest)
}

#[test]
fn spending_the_boost_budget_ends_every_boost_and_puts_the_vm_in_debt() {
    // 2 vCPUs x 25 % = 0.5 vCPU-ns earned per ns; the bucket holds 0.5 x 10 ms = 5 ms.
    let mut vm = vm(debt_limits(), 2);
    step(&mut vm, 0, upd(0, fifo(2)));
    // One vCPU boosted: spend 1, earn 0.5 per ns; 5 ms of tokens last 10 ms.
    let latch_at = vm.next_deadline();

    let at_latch = step(&mut vm, 10 * MS, Event::Tick);

    assert_eq!(latch_at, Some(10 * MS));
    assert!(vm.in_debt());
    assert_eq!(at_latch.len(), 2);
    assert_eq!(at_latch[0].vcpu, 0);
    assert_eq!(at_latch[0].params, cfs(HostPolicy::Other, 5));
    assert_eq!(at_latch[0].reason, Reason::OverBudget);
    assert!(at_latch[0].throttled && at_latch[0].in_debt);
    assert_eq!(at_latch[1].params, cfs(HostPolicy::Other, 5));
    assert_eq!(at_latch[1].reason, Reason::Debt);
    assert_eq!(
        vm.vm_stats().debt_ns,
        5 * MS,
        "the whole window's budget is owed"
    );
    assert_eq!(vm.vm_stats().budget_ns, 0);
}

#[test]
fn a_vm_in_debt_is_refused_new_boosts_until_the_whole_budget_is_earned_back() {
    let mut vm = vm(debt_limits(), 2);
    step(&mut vm, 0, upd(0, fifo(2)));
    step(&mut vm, 10 * MS, Event::Tick);

    let asked = step(&mut vm, 15 * MS, upd(1, fifo(2)));
    let debt_halfway = vm.vm_stats().debt_ns;
    let repaid_at = vm.next_deadline();
    let before = step(&mut vm, 20 * MS - 1, Event::Tick);
    let repaid = step(&mut vm, 20 * MS, Event::Tick);

    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].reason, Reason::OverBudget);
    assert!(!asked[0].params.is_rt());
    assert_eq!(debt_halfway, 5 * MS / 2, "repaid 1:1 at 0.5 vCPU-ns per ns");
    assert_eq!(repaid_at, Some(20 * MS));
    assert!(before.is_empty());
    assert!(!vm.in_debt());
    assert_eq!(repaid.len(), 2);
    assert!(repaid.iter().all(|d| d.params == rt(HostPolicy::Fifo, 5)));
    assert_eq!(vm.vm_stats().over_budget_total, 2);
    assert_eq!(vm.vm_stats().budget_latches, 1);
    assert_eq!(vm.vm_stats().budget_latched_ns, 10 * MS);
}

#[test]
fn a_vm_that_ran_its_budget_dry_is_boosted_again_once_resume_permille_of_it_is_earned_back() {
    // 5 ms bucket, earned at 0.5 vCPU-ns per ns; a tenth of it (0.5 ms) takes 1 ms.
    let limits = VmLimits {
        budget_resume_permille: 100,
        ..debt_limits()
    };
    let mut vm = vm(limits, 2);
    step(&mut vm, 0, upd(0, fifo(2)));
    step(&mut vm, 10 * MS, Event::Tick);

    let debt = vm.vm_stats().debt_ns;
    let resume_at = vm.next_deadline();
    let resumed = step(&mut vm, 11 * MS, Event::Tick);
    // Boosted again on the 0.5 ms earned: spent at a net 0.5 per ns, it lasts 1 ms.
    let next_latch = vm.next_deadline();

    assert_eq!(debt, MS / 2);
    assert_eq!(resume_at, Some(11 * MS));
    assert!(!vm.in_debt());
    assert_eq!(resumed.len(), 2);
    assert!(resumed[0].params.is_rt());
    assert_eq!(next_latch, Some(12 * MS));
}

#[test]
fn a_latched_boost_budget_refuses_every_reason() {
    let mut vm = vm(debt_limits(), 2);
    step(&mut vm, 0, upd(0, fifo(2)));
    step(&mut vm, 10 * MS, Event::Tick);

    let cs_asked = step(&mut vm, 11 * MS, upd(1, cs(2, abi::CS_HARDIRQ)));
    let woken = step(
        &mut vm,
        12 * MS,
        Event::Woken {
            vcpu: 1,
            source: WakeSource::Io,
            cpu_idle: false,
            rivals: Rivals::Host,
        },
    );

    assert_eq!(cs_asked[0].reason, Reason::OverBudget);
    assert!(woken.is_empty(), "still refused: no new decision");
    assert!(!vm.target(1).unwrap().params.is_rt());
}

#[test]
fn by_default_a_latched_vm_is_refused_boosts_and_keeps_its_weight() {
    let limits = VmLimits {
        latch_nice: VmLimits::default().latch_nice,
        ..debt_limits()
    };
    let mut vm = vm(limits, 2);
    step(&mut vm, 0, upd(0, fifo(2)));

    let at_latch = step(&mut vm, 10 * MS, Event::Tick);

    assert!(vm.in_debt());
    assert_eq!(at_latch[0].params, cfs(HostPolicy::Other, 0));
    assert_eq!(at_latch[0].reason, Reason::OverBudget);
    assert!(
        at_latch.iter().all(|d| d.params.nice == 0),
        "no vCPU below nice 0: {at_latch:?}"
    );
}

#[test]
fn debt_nice_never_lowers_a_higher_guest_nice() {
    let mut vm = vm(debt_limits(), 2);
    step(&mut vm, 0, upd(1, task(2, abi::POLICY_NORMAL, 0, 12)));
    step(&mut vm, 0, upd(0, fifo(2)));

    let out = step(&mut vm, 10 * MS, Event::Tick);

    assert!(vm.in_debt());
    assert_eq!(out.len(), 1, "only the vCPU that lost its boost");
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
    step(&mut vm, 0, halted(0));
    assert!(target(&vm, 0).0.is_rt(), "halt-boosted");

    step(&mut vm, MS / 2, Event::Tick);

    assert_eq!(vm.vm_stats().boosted_vcpus, 0);
    assert_eq!(vm.vm_stats().boosted_ns_total, 0);
}

#[test]
fn a_guest_claiming_an_rt_task_on_every_vcpu_forever_gets_at_most_its_budget() {
    // An admin gave this VM 200 ms per vCPU per second; max_boost alone (50 ms on, 50 ms
    // off) would let it have 500.
    let limits = VmLimits {
        boost_share_permille: 200,
        demoted_charge: 1,
        ..VmLimits::default()
    };
    let budget_per_window = 2 * 200 * MS;
    let mut vm = vm(limits, 2);
    let mut first = step(&mut vm, 0, upd(0, fifo(2)));
    first.extend(step(&mut vm, 0, upd(1, fifo(2))));
    let first: Vec<_> = first.into_iter().map(|d| (0, d)).collect();

    let later = tick_until(&mut vm, 10_000 * MS);
    let (boosted, _) = boosted_time(&first, &later, 2, 10_000 * MS);

    assert!(
        boosted <= 10 * budget_per_window + budget_per_window,
        "boosted {} ms in 10 s",
        boosted / MS
    );
    assert!(boosted >= 9 * budget_per_window, "it still gets its share");
    assert_eq!(boosted, vm.vm_stats().boosted_ns_total);
}

#[test]
fn a_guest_claiming_a_critical_section_forever_is_boosted_about_one_tick_at_a_time() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 0, was_preempted(0));
    let first: Vec<_> = step(&mut vm, 0, upd(0, cs(2, abi::CS_HARDIRQ)))
        .into_iter()
        .map(|d| (0, d))
        .collect();
    step(&mut vm, 0, Event::Running { vcpu: 0 });

    let later = tick_until_loaded(&mut vm, 1_000 * MS);
    let (boosted, longest) = boosted_time(&first, &later, 1, 1_000 * MS);

    // 2 ms of budget drained at a net 0.5 ns per ns: 4 ms boosted, then 4 ms to earn the
    // 2 ms back (max_boost alone: 50 ms boosted at a time).
    assert_eq!(longest, 4 * MS);
    assert_eq!(boosted, 500 * MS);
    assert!(later
        .iter()
        .any(|(_, d)| d.reason == Reason::OverBudget && d.throttled));
    assert_eq!(vm.vm_stats().cs_boosted_ns_total, 500 * MS);
}

#[test]
fn boosted_time_is_split_by_the_reason_in_force_and_sums_to_the_total() {
    let mut vm = vm(base(), 2);
    // vCPU 0: 3 ms in a critical section (boosted once preempted in it), then 2 ms of a
    // guest FIFO task, then nothing. vCPU 1: a guest FIFO task from 1 ms, blocked (halted:
    // not charged) from 4 ms.
    step(&mut vm, 0, was_preempted(0));
    step(&mut vm, 0, upd(0, cs(2, abi::CS_HARDIRQ)));
    step(&mut vm, 0, Event::Running { vcpu: 0 });
    step(&mut vm, MS, was_preempted(1));
    step(&mut vm, MS, upd(1, task(2, abi::POLICY_FIFO, 5, 0)));
    step(&mut vm, MS, Event::Running { vcpu: 1 });
    step(&mut vm, 3 * MS, upd(0, task(4, abi::POLICY_FIFO, 5, 0)));
    step(&mut vm, 4 * MS, halted(1));
    step(&mut vm, 5 * MS, upd(0, half(6)));
    step(&mut vm, 7 * MS, Event::Tick);

    let s = vm.vm_stats();
    let guest_rt = Reason::GuestRt {
        policy: 0,
        priority: 0,
    };
    assert_eq!(
        s.boosted_ns_by_reason[Reason::CriticalSection(0).index()],
        3 * MS
    );
    assert_eq!(s.boosted_ns_by_reason[guest_rt.index()], 2 * MS + 3 * MS);
    assert_eq!(
        s.boosted_ns_by_reason.iter().sum::<u64>(),
        s.boosted_ns_total
    );
    assert_eq!(
        vm.vcpu_stats(1).unwrap().boosted_ns_by_reason[guest_rt.index()],
        3 * MS
    );
}

#[test]
fn a_spent_critical_section_budget_leaves_the_guests_other_reasons_standing() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 0, was_preempted(0));
    let mut h = cs(2, abi::CS_SOFTIRQ);
    h.policy = abi::POLICY_FIFO;
    h.rt_priority = 3;
    let start = step(&mut vm, 0, upd(0, h));
    step(&mut vm, 0, Event::Running { vcpu: 0 });

    let at_latch = step(&mut vm, 4 * MS, Event::Tick);

    assert_eq!(start[0].reason, Reason::CriticalSection(abi::CS_SOFTIRQ));
    assert_eq!(at_latch[0].params, rt(HostPolicy::Fifo, 3));
    assert_eq!(
        at_latch[0].reason,
        Reason::GuestRt {
            policy: abi::POLICY_FIFO,
            priority: 3
        }
    );
    assert!(vm.vcpu_stats(0).unwrap().cs_latched);
    assert!(!vm.in_debt());
}

#[test]
fn a_critical_section_boost_comes_back_once_its_budget_is_earned_back() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 0, was_preempted(0));
    step(&mut vm, 0, upd(0, cs(2, abi::CS_HARDIRQ)));
    step(&mut vm, 0, Event::Running { vcpu: 0 });
    step(&mut vm, 4 * MS, Event::Tick);
    // Unboosted, it loses its CPU to host work.
    step(&mut vm, 4 * MS, was_preempted(0));

    let owed = vm.vcpu_stats(0).unwrap();
    let back_at = vm.next_deadline();
    let back = step(&mut vm, 8 * MS, Event::Tick);

    assert_eq!(
        (owed.cs_latched, owed.cs_debt_ns, owed.cs_budget_ns),
        (true, 2 * MS, 0)
    );
    assert_eq!(back_at, Some(8 * MS));
    assert_eq!(back[0].reason, Reason::CriticalSection(abi::CS_HARDIRQ));
    let s = vm.vcpu_stats(0).unwrap();
    assert_eq!((s.cs_latched, s.cs_budget_ns), (false, 2 * MS));
}

#[test]
fn critical_section_budgets_are_per_vcpu() {
    let mut vm = vm(base(), 2);
    step(&mut vm, 0, was_preempted(0));
    step(&mut vm, 0, upd(0, cs(2, abi::CS_HARDIRQ)));
    step(&mut vm, 0, Event::Running { vcpu: 0 });
    step(&mut vm, 4 * MS, Event::Tick);

    step(&mut vm, 5 * MS, was_preempted(1));
    let other = step(&mut vm, 5 * MS, upd(1, cs(2, abi::CS_HARDIRQ)));

    assert!(vm.vcpu_stats(0).unwrap().cs_latched);
    assert_eq!(other[0].reason, Reason::CriticalSection(abi::CS_HARDIRQ));
    assert_eq!(vm.vm_stats().cs_latched_vcpus, 1);
}

/// One vCPU's 10 ms audio-like period from `t0`: woken, RT work for 500 us (5 %), idle and
/// halted; preempted in an interrupt handler for 400 us in between, as on a loaded host.
fn audio_period(vm: &mut VmState, vcpu: u32, t0: u64, seq: &mut u32) -> Vec<(u64, Decision)> {
    let us = 1_000;
    let mut next = || {
        *seq += 2;
        *seq
    };
    let mut events = vec![
        (
            t0,
            Event::Woken {
                vcpu,
                source: WakeSource::Timer,
                cpu_idle: false,
                rivals: Rivals::Host,
            },
        ),
        (t0 + 5 * us, Event::Running { vcpu }),
        (
            t0 + 10 * us,
            upd(vcpu, task(next(), abi::POLICY_FIFO, 50, 0)),
        ),
        (t0 + 510 * us, upd(vcpu, idle(next()))),
        (t0 + 520 * us, halted(vcpu)),
        (t0 + 3_000 * us, Event::Running { vcpu }),
        (t0 + 3_100 * us, upd(vcpu, cs(next(), abi::CS_HARDIRQ))),
        (t0 + 3_150 * us, was_preempted(vcpu)),
        (t0 + 3_550 * us, Event::Running { vcpu }),
        (t0 + 3_600 * us, upd(vcpu, idle(next()))),
        (t0 + 3_610 * us, halted(vcpu)),
    ];
    let mut out = Vec::new();
    for (at, ev) in events.drain(..) {
        out.extend(tick_until(vm, at));
        out.extend(step(vm, at, ev).into_iter().map(|d| (at, d)));
    }
    out
}

#[test]
fn a_well_behaved_guest_at_five_percent_duty_is_never_refused() {
    let mut vm = vm(VmLimits::default(), 2);
    let mut seqs = [0u32; 2];
    let mut all = Vec::new();

    for period in 0..1_000u64 {
        for vcpu in 0..2 {
            let t0 = period * 10 * MS + u64::from(vcpu) * 5 * MS;
            all.extend(audio_period(&mut vm, vcpu, t0, &mut seqs[vcpu as usize]));
        }
    }

    let rt_work = all
        .iter()
        .filter(|(_, d)| matches!(d.reason, Reason::GuestRt { .. }))
        .count();
    assert!(all.iter().all(|(_, d)| d.reason != Reason::OverBudget));
    assert!(all.iter().all(|(_, d)| !d.throttled && !d.in_debt));
    assert!(rt_work >= 2_000, "{rt_work} RT boosts in 2000 periods");
    let s = vm.vm_stats();
    assert_eq!((s.over_budget_total, s.throttles_total), (0, 0));
    assert!(
        s.cs_boosted_ns_total > 0,
        "the interrupt handlers were boosted"
    );
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
    let b = step(&mut vm, 20, was_preempted(0));
    let c = step(&mut vm, 30, Event::OverloadHint { overloaded: true });

    assert!(a.is_empty() && b.is_empty() && c.is_empty());
}

// ---- robustness, stats, host half ----

#[test]
fn out_of_range_vcpu_is_ignored_and_counted() {
    let mut vm = vm(base(), 2);

    let out = step(&mut vm, 10, upd(7, cs(2, abi::CS_HARDIRQ)));
    let out2 = step(
        &mut vm,
        20,
        Event::Woken {
            vcpu: u32::MAX,
            source: WakeSource::Unknown,
            cpu_idle: false,
            rivals: Rivals::Host,
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
    step(&mut vm, 1_000, upd(0, fifo(2)));

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
    step(&mut vm, 5, was_preempted(0));
    step(&mut vm, 6, Event::OverloadHint { overloaded: true });
    step(&mut vm, 10, Event::Running { vcpu: 0 });
    step(&mut vm, 20, was_preempted(0));

    let h = vm.host_half(0, 100);

    assert_eq!(h.seq, 0);
    assert_eq!(h.status, abi::HS_PREEMPTED);
    assert_eq!(h.flags, abi::HF_BOOSTED | abi::HF_OVERLOADED);
    assert_eq!(h.policy, abi::HOST_POLICY_RR);
    assert_eq!(h.rt_priority, 8);
    assert_eq!(h.update_ns, 100);
    assert_eq!(h.boost_count, 1);
    assert_eq!(h.preempt_count, 2);
    // Boosted from the preemption at 5 (running, the critical section asked for nothing);
    // charged only while on a CPU, 10 to 20.
    assert_eq!(h.boosted_ns, 10);
}

#[test]
fn critical_section_of_a_running_vcpu_starts_no_boost_until_it_is_preempted() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 0, Event::Running { vcpu: 0 });

    let while_running = step(&mut vm, 10, upd(0, cs(2, abi::CS_HARDIRQ)));
    let on_preemption = step(&mut vm, 20, was_preempted(0));
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
    step(&mut vm, 51 * MS, halted(0));

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

#[test]
fn a_burst_longer_than_demote_after_runs_at_the_bottom_of_the_rt_range() {
    let limits = VmLimits::default();
    let mut vm = vm(limits.clone(), 1);

    let first = step(&mut vm, 0, upd(0, task(2, abi::POLICY_FIFO, 99, 0)));
    let later = tick_until(&mut vm, limits.demote_after_ns);

    assert_eq!(first[0].params.rt_priority, limits.max_rt_priority);
    let (at, demoted) = later
        .iter()
        .find(|(_, d)| d.params.is_rt())
        .expect("a decision at demote_after");
    assert_eq!(*at, limits.demote_after_ns);
    assert_eq!(demoted.params.rt_priority, 1);
    assert!(matches!(demoted.reason, Reason::GuestRt { .. }));
}

#[test]
fn a_burst_shorter_than_demote_after_keeps_its_priority() {
    let limits = VmLimits::default();
    let mut vm = vm(limits.clone(), 1);
    step(&mut vm, 0, upd(0, task(2, abi::POLICY_FIFO, 99, 0)));

    let ended = step(&mut vm, 3 * MS, upd(0, task(4, abi::POLICY_NORMAL, 0, 0)));
    let again = step(&mut vm, 10 * MS, upd(0, task(6, abi::POLICY_FIFO, 99, 0)));

    assert!(!ended[0].params.is_rt());
    assert_eq!(again[0].params.rt_priority, limits.max_rt_priority);
}

#[test]
fn a_guest_that_always_asks_stays_demoted_through_the_throttle() {
    let limits = VmLimits::default();
    let mut vm = vm(limits.clone(), 1);
    step(&mut vm, 0, upd(0, task(2, abi::POLICY_FIFO, 99, 0)));

    // Boosted to max_boost, throttled, boosted again at the throttle's end.
    let later = tick_until(&mut vm, limits.max_boost_ns + limits.throttle_ns);

    let (at, throttled) = later
        .iter()
        .find(|(_, d)| !d.params.is_rt())
        .expect("a throttle");
    assert!(throttled.throttled);
    let (again_at, again) = later
        .iter()
        .find(|(t, d)| t > at && d.params.is_rt())
        .expect("a boost after the throttle");
    assert_eq!(*again_at, at + limits.throttle_ns);
    assert_eq!(again.params.rt_priority, 1, "{later:?}");
}

#[test]
fn a_demoted_vcpu_regains_its_priority_once_idle_time_has_repaid_its_burst() {
    let limits = VmLimits::default();
    let mut vm = vm(limits.clone(), 1);
    step(&mut vm, 0, upd(0, task(2, abi::POLICY_FIFO, 99, 0)));
    let long = 2 * limits.demote_after_ns;
    step(&mut vm, long, upd(0, task(4, abi::POLICY_NORMAL, 0, 0)));

    // Not yet repaid: half the burst's length without a boost.
    let early = step(
        &mut vm,
        long + long / 2,
        upd(0, task(6, abi::POLICY_FIFO, 99, 0)),
    );
    step(
        &mut vm,
        long + long / 2 + 1,
        upd(0, task(8, abi::POLICY_NORMAL, 0, 0)),
    );
    // Repaid: as long without a boost as the burst lasted.
    let repaid_at = long + long / 2 + 1 + long;
    let repaid = step(
        &mut vm,
        repaid_at,
        upd(0, task(10, abi::POLICY_FIFO, 99, 0)),
    );

    assert_eq!(early[0].params.rt_priority, 1);
    assert_eq!(repaid[0].params.rt_priority, limits.max_rt_priority);
}

#[test]
fn halted_time_repays_a_demotion() {
    let limits = VmLimits::default();
    let mut vm = vm(limits.clone(), 1);
    step(&mut vm, 0, upd(0, task(2, abi::POLICY_FIFO, 99, 0)));
    let long = 2 * limits.demote_after_ns;
    tick_until(&mut vm, long);
    assert_eq!(target(&vm, 0).0.rt_priority, 1);

    // Halted (and halt-boosted) as long as the burst lasted, then woken to RT work.
    step(&mut vm, long, halted(0));
    step(&mut vm, 2 * long, Event::Running { vcpu: 0 });
    let out = step(&mut vm, 2 * long, upd(0, task(4, abi::POLICY_FIFO, 99, 0)));

    assert_eq!(
        target(&vm, 0).0.rt_priority,
        limits.max_rt_priority,
        "{out:?}"
    );
}

#[test]
fn a_demoted_vcpus_boosted_time_is_charged_demoted_charge_times() {
    let limits = VmLimits {
        boost_share_permille: 500,
        max_boost_ns: 100 * MS,
        ..VmLimits::default()
    };
    let mut vm = vm(limits.clone(), 1);
    step(&mut vm, 0, upd(0, task(2, abi::POLICY_FIFO, 99, 0)));

    tick_until(&mut vm, 50 * MS);
    step(&mut vm, 50 * MS, Event::Tick);

    // From a full bucket of 500 ms: 25 ms earned, 4 ms charged once, 46 ms twice.
    let spent = 4 * MS + limits.demoted_charge as u64 * 46 * MS;
    assert_eq!(vm.vm_stats().budget_ns, 500 * MS + 25 * MS - spent);
    assert_eq!(vm.vm_stats().boosted_ns_total, 50 * MS);
    assert_eq!(vm.vm_stats().demoted_ns_total, 46 * MS);
}

#[test]
fn by_default_a_guest_spinning_rt_on_every_vcpu_gets_its_share_divided_by_demoted_charge() {
    let limits = VmLimits::default();
    let mut vm = vm(limits.clone(), 2);
    let first: Vec<_> = [0, 1]
        .iter()
        .flat_map(|&v| step(&mut vm, 0, upd(v, task(2, abi::POLICY_FIFO, 99, 0))))
        .map(|d| (0, d))
        .collect();

    let later = tick_until(&mut vm, 10_000 * MS);
    let (boosted, _) = boosted_time(&first, &later, 2, 10_000 * MS);

    // Demoted from the first burst on, so each boosted ns costs `demoted_charge`: 10
    // windows of 2 x share, plus the one window banked at the start, over the charge
    // (and the first `demote_after` of each vCPU at full rate).
    let per_window = 2 * u64::from(limits.boost_share_permille) * MS;
    let charge = u64::from(limits.demoted_charge);
    let most = 11 * per_window / charge + 2 * limits.demote_after_ns;
    let least = 9 * per_window / charge;
    assert!(boosted <= most, "boosted {} ms", boosted / MS);
    assert!(boosted >= least, "boosted {} ms", boosted / MS);
}

// ---- lock holders: extensions and the lock debt ----

/// vCPU `waiter`'s half publishing a wait for a lock held on vCPU `holder`.
fn waits_for(seq: u32, holder: u32) -> GuestHalf {
    GuestHalf {
        lock_holder: holder + 1,
        lock_flags: abi::LOCK_F_WRITE,
        ..half(seq)
    }
}

fn waits_for_any(seq: u32) -> GuestHalf {
    GuestHalf {
        lock_holder: abi::LOCK_ANY,
        lock_flags: abi::LOCK_F_SPIN,
        ..half(seq)
    }
}

/// The rule-test limits with lock holders honoured (off by default), repaying from the
/// first ns of debt.
fn locks() -> VmLimits {
    VmLimits {
        honor_lock_holders: true,
        lock_repay_from_ns: 0,
        ..base()
    }
}

/// Two vCPUs, both running; vCPU 0's guest waits for a lock vCPU 1 holds.
fn holder_and_waiter(limits: VmLimits) -> VmState {
    let mut vm = vm(limits, 2);
    step(&mut vm, 0, Event::Running { vcpu: 0 });
    step(&mut vm, 0, Event::Running { vcpu: 1 });
    step(&mut vm, 0, upd(1, half(2)));
    step(&mut vm, MS, upd(0, waits_for(2, 1)));
    vm
}

#[test]
fn a_preempted_lock_holder_is_extended_for_lock_extension_ns() {
    let mut vm = holder_and_waiter(locks());

    let at_preemption = step(&mut vm, 2 * MS, was_preempted(1));
    let after = tick_until(&mut vm, 10 * MS);

    assert_eq!(at_preemption.len(), 1);
    assert_eq!(at_preemption[0].vcpu, 1);
    assert_eq!(at_preemption[0].params, rt(HostPolicy::Rr, 8));
    assert_eq!(at_preemption[0].reason, Reason::LockHolder);
    // It ended at 2 ms + lock_extension_ns (1 ms).
    let end = after.iter().find(|(_, d)| d.vcpu == 1 && !d.params.is_rt());
    assert_eq!(end.map(|(t, _)| *t), Some(3 * MS));
    // The wait named the holder before the host preempted it.
    let s = vm.vm_stats();
    assert_eq!((s.lock_extensions, s.lock_extensions_at_preemption), (1, 1));
}

#[test]
fn a_holder_preempted_with_no_rival_outside_its_vm_is_not_extended() {
    let mut vm = holder_and_waiter(VmLimits {
        boost_only_against_rivals: true,
        ..locks()
    });

    let alone = step(
        &mut vm,
        2 * MS,
        Event::Preempted {
            vcpu: 1,
            rivals: Rivals::None,
        },
    );

    assert!(alone.is_empty(), "{alone:?}");
    assert_eq!(vm.vm_stats().lock_extensions, 0);
}

#[test]
fn a_holder_preempted_by_another_served_vm_is_extended() {
    // Lock extensions are repaid, so another served VM is a rival for them even when it is
    // none for the speculative boosts (peer_vms_are_rivals off, the default).
    let mut vm = holder_and_waiter(VmLimits {
        boost_only_against_rivals: true,
        peer_vms_are_rivals: false,
        ..locks()
    });

    let by_peer = step(
        &mut vm,
        2 * MS,
        Event::Preempted {
            vcpu: 1,
            rivals: Rivals::PeerVms,
        },
    );

    assert_eq!(by_peer.len(), 1, "{by_peer:?}");
    assert_eq!(by_peer[0].reason, Reason::LockHolder);
    assert_eq!(vm.vm_stats().lock_extensions, 1);
}

#[test]
fn a_running_or_unwaited_vcpu_is_not_extended() {
    let mut vm = holder_and_waiter(locks());

    // vCPU 0 (the waiter, named by nobody) is preempted: nothing.
    let waiter_preempted = step(&mut vm, 2 * MS, was_preempted(0));
    // The holder runs: nothing either.
    let holder_runs = step(&mut vm, 2 * MS, Event::Running { vcpu: 1 });

    assert!(waiter_preempted.iter().all(|d| !d.params.is_rt()));
    assert!(holder_runs.is_empty());
    assert_eq!(vm.vm_stats().lock_extensions, 0);
}

#[test]
fn the_extension_ends_when_no_waiter_names_the_holder_any_more() {
    let mut vm = holder_and_waiter(locks());
    step(&mut vm, 2 * MS, was_preempted(1));

    let released = step(&mut vm, 2 * MS + 200_000, upd(0, half(4)));

    assert_eq!(released.len(), 1);
    assert_eq!(released[0].vcpu, 1);
    assert!(!released[0].params.is_rt());
}

#[test]
fn a_waiter_read_after_the_holders_preemption_extends_it() {
    let mut vm = vm(locks(), 2);
    step(&mut vm, 0, Event::Running { vcpu: 0 });
    step(&mut vm, 0, was_preempted(1));

    let read = step(&mut vm, MS, upd(0, waits_for(2, 1)));

    let holder: Vec<_> = read.iter().filter(|d| d.vcpu == 1).collect();
    assert_eq!(holder.len(), 1);
    assert_eq!(holder[0].reason, Reason::LockHolder);
    // Nobody waited when the host preempted it: only a reaction could serve this one.
    let s = vm.vm_stats();
    assert_eq!((s.lock_extensions, s.lock_extensions_at_preemption), (1, 0));
}

#[test]
fn a_new_wait_with_the_holder_unknown_extends_the_siblings_preempted_then_only() {
    let mut vm = vm(locks(), 3);
    for vcpu in 0..3 {
        step(&mut vm, 0, Event::Running { vcpu });
    }
    step(&mut vm, 0, was_preempted(1));
    step(&mut vm, 0, was_preempted(0));

    // vCPU 0 (itself preempted a moment ago, now back) publishes a wait, holder unknown.
    step(&mut vm, MS, Event::Running { vcpu: 0 });
    let read = step(&mut vm, MS, upd(0, waits_for_any(2)));
    // Later preemptions are not extended for the same wait.
    let later = step(&mut vm, 2 * MS, was_preempted(2));
    let reread = step(&mut vm, 2 * MS, upd(0, waits_for_any(2)));

    let extended: Vec<_> = read.iter().map(|d| (d.vcpu, d.reason)).collect();
    assert_eq!(extended, vec![(1, Reason::LockHolder)]);
    assert!(later.iter().chain(reread.iter()).all(|d| !d.params.is_rt()));
    assert_eq!(target(&vm, 0).1, Reason::None);
}

#[test]
fn a_wait_naming_itself_or_a_vcpu_the_vm_lacks_is_ignored() {
    let mut vm = vm(locks(), 2);
    step(&mut vm, 0, was_preempted(1));

    let own = step(&mut vm, MS, upd(1, waits_for(2, 1)));
    let beyond = step(&mut vm, MS, upd(0, waits_for(2, 7)));

    assert!(own.iter().chain(beyond.iter()).all(|d| !d.params.is_rt()));
    assert_eq!(vm.vm_stats().lock_extensions, 0);
}

#[test]
fn extension_time_on_a_cpu_is_lock_debt_repaid_at_debt_nice() {
    let mut vm = holder_and_waiter(locks());
    step(&mut vm, 2 * MS, was_preempted(1));
    // Back on a CPU 0.1 ms later; the extension ends at 3 ms: 0.9 ms of debt.
    step(&mut vm, 2 * MS + 100_000, Event::Running { vcpu: 1 });
    let ended = tick_until(&mut vm, 3 * MS);
    let s = vm.vm_stats();

    // At 3 ms the extension ends into the debt: both vCPUs run at debt_nice (5) and repay
    // 1024/335 - 1 = 2.056 ns per ns each: 900,000 / (2 x 2.056) = 218,872 ns.
    let at_end: Vec<_> = ended
        .iter()
        .map(|(t, d)| (*t, d.vcpu, d.params, d.reason))
        .collect();
    assert_eq!(
        at_end,
        vec![
            (3 * MS, 0, cfs(HostPolicy::Other, 5), Reason::LockDebt),
            (3 * MS, 1, cfs(HostPolicy::Other, 5), Reason::LockDebt),
        ]
    );
    assert_eq!((s.lock_extended_ns, s.lock_debt_ns), (900_000, 900_000));
    assert_eq!(s.lock_preemptions_avoided, 1);
    assert_eq!(vm.next_deadline(), Some(3 * MS + 218_872));
    let repaid = tick_until(&mut vm, 4 * MS);

    let back: Vec<_> = repaid.iter().map(|(t, d)| (*t, d.vcpu, d.params)).collect();
    assert_eq!(
        back,
        vec![
            (3 * MS + 218_872, 0, cfs(HostPolicy::Other, 0)),
            (3 * MS + 218_872, 1, cfs(HostPolicy::Other, 0))
        ]
    );
    let s = vm.vm_stats();
    assert_eq!((s.lock_debt_ns, s.lock_repaid_ns), (0, 900_000));
}

#[test]
fn only_vcpus_on_a_cpu_repay_the_lock_debt() {
    let mut vm = holder_and_waiter(locks());
    step(&mut vm, 2 * MS, was_preempted(1));
    step(&mut vm, 2 * MS, Event::Running { vcpu: 1 });
    tick_until(&mut vm, 3 * MS);
    // vCPU 0 halts, vCPU 1 waits for a CPU: nobody repays.
    step(&mut vm, 3 * MS, halted(0));
    step(&mut vm, 3 * MS, was_preempted(1));

    step(&mut vm, 13 * MS, Event::Tick);

    assert_eq!(vm.vm_stats().lock_debt_ns, MS);
    assert_eq!(
        target(&vm, 1),
        (cfs(HostPolicy::Other, 5), Reason::LockDebt)
    );
}

#[test]
fn lock_debt_below_lock_repay_from_waits_and_is_repaid_in_one_turn_once_it_reaches_it() {
    // Arrange: repayment from 1.5 ms of debt.
    let mut vm = holder_and_waiter(VmLimits {
        lock_repay_from_ns: 1_500_000,
        ..locks()
    });

    // Act: a first extension of 0.9 ms on a CPU (preempted at 2 ms, back at 2.1 ms, ended
    // at 3 ms), then a second one of 0.9 ms (preempted at 5 ms, back at 5.1, ended at 6).
    step(&mut vm, 2 * MS, was_preempted(1));
    step(&mut vm, 2 * MS + 100_000, Event::Running { vcpu: 1 });
    let first = tick_until(&mut vm, 5 * MS);
    let owed_after_first = vm.vm_stats().lock_debt_ns;
    step(&mut vm, 5 * MS, was_preempted(1));
    step(&mut vm, 5 * MS + 100_000, Event::Running { vcpu: 1 });
    let second = tick_until(&mut vm, 10 * MS);

    // Assert: no repayment after the first (0.9 ms < 1.5 ms: the debt waits); after the
    // second, 1.8 ms repaid in one turn at debt_nice by both vCPUs (1.8 ms / (2 x 2.056)
    // = 437,744 ns), then nice 0 again.
    assert!(
        first.iter().all(|(_, d)| d.reason != Reason::LockDebt),
        "{first:?}"
    );
    assert_eq!(owed_after_first, 900_000);
    let debt: Vec<_> = second
        .iter()
        .map(|(t, d)| (*t, d.vcpu, d.params.nice))
        .collect();
    assert_eq!(
        debt,
        vec![
            (6 * MS, 0, 5),
            (6 * MS, 1, 5),
            (6 * MS + 437_744, 0, 0),
            (6 * MS + 437_744, 1, 0),
        ]
    );
    let s = vm.vm_stats();
    assert_eq!((s.lock_debt_ns, s.lock_repaid_ns), (0, 1_800_000));
}

#[test]
fn extensions_are_refused_while_the_lock_debt_is_at_its_cap() {
    let limits = VmLimits {
        lock_debt_max_ns: MS / 2,
        ..locks()
    };
    let mut vm = holder_and_waiter(limits);
    step(&mut vm, 2 * MS, was_preempted(1));
    step(&mut vm, 2 * MS, Event::Running { vcpu: 1 });
    tick_until(&mut vm, 3 * MS);
    step(&mut vm, 3 * MS, halted(0));

    let again = step(&mut vm, 3 * MS, was_preempted(1));

    assert!(again.iter().all(|d| !d.params.is_rt()));
    let s = vm.vm_stats();
    assert_eq!((s.lock_extensions, s.lock_extensions_refused), (1, 1));
}

#[test]
fn lock_holders_are_not_extended_when_not_honored() {
    let limits = VmLimits {
        honor_lock_holders: false,
        ..base()
    };
    let mut vm = holder_and_waiter(limits);

    let preempted = step(&mut vm, 2 * MS, was_preempted(1));

    assert!(preempted.iter().all(|d| !d.params.is_rt()));
    assert!(!vm.reads_waiters_on(&was_preempted(1)));
}

#[test]
fn where_the_host_scheduler_decides_it_extends_lock_holders_and_the_policy_does_not() {
    let mut vm = holder_and_waiter(locks());
    vm.set_kernel_decides_rt(true);

    let preempted = step(&mut vm, 2 * MS, was_preempted(1));

    assert!(preempted.iter().all(|d| !d.params.is_rt()), "{preempted:?}");
    assert!(!vm.reads_waiters_on(&was_preempted(1)));
    assert_eq!(vm.vm_stats().lock_extensions, 0);
}

#[test]
fn the_guests_lock_counters_are_summed_over_its_vcpus() {
    let mut vm = vm(base(), 2);
    let counted = |seq, c, p| GuestHalf {
        lock_contended_count: c,
        lock_preempted_count: p,
        ..half(seq)
    };

    step(&mut vm, 0, upd(0, counted(2, 10, 3)));
    step(&mut vm, 0, upd(1, counted(2, 5, 1)));

    let s = vm.vm_stats();
    assert_eq!((s.lock_contentions, s.lock_holder_preempted), (15, 4));
}

#[test]
fn with_lock_extend_running_a_running_holder_is_extended_before_any_preemption() {
    let limits = VmLimits {
        lock_extend_running: true,
        ..locks()
    };
    let mut vm = vm(limits, 2);
    step(&mut vm, 0, Event::Running { vcpu: 0 });
    step(&mut vm, 0, Event::Running { vcpu: 1 });

    let read = step(&mut vm, MS, upd(0, waits_for(2, 1)));
    let any = step(&mut vm, MS, upd(0, waits_for_any(4)));

    let extended: Vec<_> = read.iter().map(|d| (d.vcpu, d.reason)).collect();
    assert_eq!(extended, vec![(1, Reason::LockHolder)]);
    // It cut no preemption short; a wait with the holder unknown extends no running vCPU.
    assert_eq!(vm.vm_stats().lock_preemptions_avoided, 0);
    assert!(any.iter().all(|d| d.vcpu != 1 || !d.params.is_rt()));
}

/// One vCPU proactively boosted at a wakeup at 0 and running since, in a VM of 2.5 ms boost
/// budget (250 permille of one vCPU over 10 ms) with `reserve` permille kept for RT work; and
/// the decisions at the wakeup.
fn woken_and_running(reserve: u32) -> (VmState, Vec<Decision>) {
    let limits = VmLimits {
        proactive_wake: true,
        proactive_boost_ns: 100 * MS,
        speculative_boosts_need_rt_work: false,
        boost_only_against_rivals: false,
        speculative_reserve_permille: reserve,
        ..debt_limits()
    };
    let mut vm = vm(limits, 1);
    let woken = step(
        &mut vm,
        0,
        Event::Woken {
            vcpu: 0,
            source: WakeSource::Io,
            cpu_idle: false,
            rivals: Rivals::Host,
        },
    );
    step(&mut vm, 0, Event::Running { vcpu: 0 });
    (vm, woken)
}

#[test]
fn speculative_boosts_stop_at_the_budget_reserve_and_leave_it_to_the_guests_rt_work() {
    // A boosted vCPU on a CPU drains the bucket at a net 0.75 vCPU-ns per ns: the reserve
    // (half of it) is reached at 1.67 ms.
    let (mut vm, woken) = woken_and_running(500);
    let at_reserve = step(&mut vm, 2 * MS, Event::Tick);
    let rt_work = step(&mut vm, 3 * MS, upd(0, fifo(2)));

    assert_eq!(woken[0].reason, Reason::ProactiveWake);
    assert!(woken[0].params.is_rt());
    assert_eq!(at_reserve[0].reason, Reason::OverBudget);
    assert!(!at_reserve[0].params.is_rt());
    assert!(!vm.in_debt(), "the reserve is no latch");
    assert_eq!(
        rt_work[0].reason,
        Reason::GuestRt {
            policy: abi::POLICY_FIFO,
            priority: 5
        }
    );
    assert!(
        rt_work[0].params.is_rt(),
        "the guest's RT work draws on the reserve"
    );
}

#[test]
fn without_a_reserve_speculative_boosts_spend_the_whole_budget() {
    let (mut vm, _) = woken_and_running(0);
    let at_half = step(&mut vm, 2 * MS, Event::Tick);

    assert!(at_half.is_empty(), "still boosted: {at_half:?}");
    assert!(vm.target(0).unwrap().params.is_rt());
}

#[test]
fn a_kernel_grant_offers_the_budget_left_split_over_the_vcpus_at_the_boost_priority() {
    let vm = vm(base(), 2);

    let g = vm.kernel_grant(1, 0);

    // A full bucket: half the vCPU time of a 1 s window, 2 vCPUs.
    let budget = vm.vm_stats().budget_ns;
    assert_eq!(g.priority, 8);
    assert_eq!(g.allowance_ns, budget / 2);
    assert_eq!(g.halt_window_ns, base().halt_boost_ns);
    assert_eq!(
        vm.kernel_grant(2, 0),
        pvsched_policy::KernelGrant::default(),
        "no such vCPU"
    );
}

#[test]
fn kernel_boosts_spend_the_budget_and_a_spent_budget_takes_the_kernel_grant_away() {
    // Arrange
    let mut vm = vm(base(), 1);
    let budget = vm.vm_stats().budget_ns;

    // Act: the scheduler reports part of it, then more than is left.
    vm.charge_kernel_boost(10 * MS, 0, budget / 2, 0, 0);
    let half = vm.kernel_grant(0, 10 * MS);
    vm.charge_kernel_boost(20 * MS, 0, budget, 0, 0);
    let spent = vm.kernel_grant(0, 20 * MS);

    // Assert
    assert!(half.priority > 0 && half.allowance_ns < budget / 2 + 10 * MS);
    assert_eq!((spent.priority, spent.allowance_ns), (0, 0));
    let s = vm.vm_stats();
    assert!(s.in_debt && s.budget_latches == 1, "{s:?}");
    assert_eq!(s.kernel_boosted_ns_total, budget + budget / 2);
}

#[test]
fn the_kernel_grant_carries_the_burst_rules_and_demoted_kernel_boosts_cost_more() {
    // Arrange: two VMs alike; one's boosts ran demoted.
    let limits = base();
    let (mut plain, mut demoted) = (vm(limits.clone(), 1), vm(limits.clone(), 1));
    let budget = plain.vm_stats().budget_ns;

    // Act: the same boosted time, all of it demoted in the second VM.
    plain.charge_kernel_boost(10 * MS, 0, budget / 10, 0, 0);
    demoted.charge_kernel_boost(10 * MS, 0, budget / 10, 0, budget / 10);
    let g = plain.kernel_grant(0, 10 * MS);

    // Assert: the policy's own burst rules, and the demoted charge on the budget.
    assert_eq!(
        (g.demote_after_ns, g.max_boost_ns, g.throttle_ns),
        (
            limits.demote_after_ns,
            limits.max_boost_ns,
            limits.throttle_ns
        )
    );
    let left = |v: &VmState| v.kernel_grant(0, 10 * MS).allowance_ns;
    let spent = |v: &VmState| budget - left(v);
    let ratio = spent(&demoted) as f64 / spent(&plain) as f64;
    assert!(
        (ratio - f64::from(limits.demoted_charge)).abs() < 0.2,
        "demoted spent {} vs {} (charge {})",
        spent(&demoted),
        spent(&plain),
        limits.demoted_charge
    );
}

#[test]
fn a_latch_from_kernel_boosts_ends_the_daemons_own_boosts_at_the_next_event() {
    let mut vm = vm(base(), 1);
    let rt = step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    assert!(rt[0].params.is_rt());
    let budget = vm.vm_stats().budget_ns;

    vm.charge_kernel_boost(20, 0, 2 * budget, 0, 0);
    let out = step(&mut vm, 30, Event::Tick);

    assert!(out.iter().any(|d| !d.params.is_rt()), "{out:?}");
}

#[test]
fn no_kernel_boosts_where_guest_rt_is_not_honoured_or_no_rt_class_is_allowed() {
    let quiet = vm(
        VmLimits {
            honor_guest_rt: false,
            ..base()
        },
        1,
    );
    assert_eq!(quiet.kernel_grant(0, 0).priority, 0);
    assert_eq!(quiet.kernel_grant(0, 0).allowance_ns, 0);
}

#[test]
fn where_the_kernel_decides_rt_work_the_policy_leaves_guest_rt_and_halt_boosts_to_it() {
    // Arrange
    let mut vm = vm(base(), 1);
    vm.set_kernel_decides_rt(true);

    // Act
    let rt = step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));
    step(&mut vm, 20, upd(0, idle(4)));
    step(&mut vm, 30, halted(0));
    let halted_target = target(&vm, 0);
    let pending = step(
        &mut vm,
        40,
        upd(
            0,
            GuestHalf {
                guest_pending: pending(abi::POLICY_FIFO, 7),
                ..idle(6)
            },
        ),
    );

    // Assert: no boost of its own for the RT task nor the halt; a pending hint (raised by
    // another vCPU while this one waits) is still the policy's.
    assert!(rt.iter().all(|d| !d.params.is_rt()), "{rt:?}");
    assert!(!halted_target.0.is_rt(), "{halted_target:?}");
    assert_eq!(pending[0].reason, Reason::PendingHint);
}

#[test]
fn when_the_kernel_stops_deciding_the_policy_boosts_the_guests_rt_work_again() {
    let mut vm = vm(base(), 1);
    vm.set_kernel_decides_rt(true);
    step(&mut vm, 10, upd(0, task(2, abi::POLICY_FIFO, 5, 0)));

    vm.set_kernel_decides_rt(false);
    let out = step(&mut vm, 20, Event::Tick);

    assert!(out[0].params.is_rt(), "{out:?}");
}

#[test]
fn a_kernel_grant_allows_the_speculative_reasons_only_above_the_budgets_reserve() {
    // Arrange: rivals seen (a host task preempted the vCPU), a full budget.
    let mut vm = vm(base(), 1);
    step(&mut vm, 10, was_preempted(0));
    let full = vm.kernel_grant(0, 10);
    let budget = vm.vm_stats().budget_ns;

    // Act: the scheduler spends past the reserve (half the bucket by default).
    vm.charge_kernel_boost(20, 0, budget * 6 / 10, 0, 0);
    let low = vm.kernel_grant(0, 20);

    // Assert: RT work still has the rest; the guesses do not.
    assert!(full.critical_sections && full.wakeups, "{full:?}");
    assert!(
        low.priority > 0 && !low.critical_sections && !low.wakeups,
        "{low:?}"
    );
}

#[test]
fn kernel_critical_section_time_spends_the_vcpus_critical_section_budget() {
    let mut vm = vm(base(), 1);
    step(&mut vm, 10, was_preempted(0));
    let cs_budget = vm.vcpu_stats(0).unwrap().cs_budget_ns;

    vm.charge_kernel_boost(20, 0, cs_budget + 1, cs_budget + 1, 0);

    assert!(vm.vcpu_stats(0).unwrap().cs_latched);
    assert!(!vm.kernel_grant(0, 20).critical_sections);
}

#[test]
fn where_the_kernel_decides_the_policy_leaves_critical_sections_and_wakeups_to_it() {
    let mut vm = vm(base(), 1);
    vm.set_kernel_decides_rt(true);

    let preempted_in_cs = {
        step(&mut vm, 10, upd(0, cs(2, abi::CS_HARDIRQ)));
        step(&mut vm, 20, was_preempted(0))
    };
    let woken = step(
        &mut vm,
        30,
        Event::Woken {
            vcpu: 0,
            source: WakeSource::Unknown,
            cpu_idle: false,
            rivals: Rivals::Host,
        },
    );

    assert!(
        preempted_in_cs.iter().all(|d| !d.params.is_rt()),
        "{preempted_in_cs:?}"
    );
    assert!(woken.iter().all(|d| !d.params.is_rt()), "{woken:?}");
}
