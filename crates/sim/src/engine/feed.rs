//! pvschedd's inputs: host events of vCPU threads, slot reads, its recheck and the
//! decisions it schedules ([`crate::daemon`] holds the policy state).

use pvsched_policy::Event;

use super::{Ev, Sim};
use pvsched_policy::serving::DEFAULT_DISCOVERY_INTERVAL_NS;

use crate::daemon::{overloaded, SCX_SCAN_INTERVAL_NS};
use crate::host::{Class, ScxGuestView, Tid};

impl Sim {
    /// Feeds the daemon a host event of vCPU `v` as pvschedd's `on_host_event` does: the
    /// guest halves it reads first ([`SlotReads`]: `v`'s when the event reads it, every
    /// other vCPU's where lock waits may name `v`), then the event. Reads cost nothing
    /// here: the daemon's own CPU time is not modelled.
    ///
    /// [`SlotReads`]: pvsched_policy::SlotReads
    pub(super) fn feed(&mut self, vm: u32, v: u32, ev: Event) {
        let Some(d) = self.daemon.as_mut() else {
            return;
        };
        let now = self.now;
        let g = &self.vms[vm as usize];
        let mut reads = std::mem::take(&mut self.reads);
        reads.clear();
        reads.extend(d.slot_reads(vm, v, &ev).map(|w| (w, g.guest_half(w, now))));
        d.handle(vm, now, &reads, Some(ev));
        self.reads = reads;
        self.daemon_after(vm);
    }

    /// The daemon's timer for `vm`; false if it was a stale one.
    pub(super) fn daemon_tick(&mut self, vm: u32) -> bool {
        let now = self.now;
        let Some(d) = self.daemon.as_mut() else {
            return false;
        };
        if !d.tick_due(vm, now) {
            return false;
        }
        // The recheck: the boosted vCPUs pvschedd re-reads (`serving::recheck_reads`).
        let nr = self.vms[vm as usize].vcpus.len() as u32;
        for v in 0..nr {
            if !self.daemon.as_ref().is_some_and(|d| d.recheck_reads(vm, v)) {
                continue;
            }
            let half = self.vms[vm as usize].guest_half(v, now);
            if let Some(d) = self.daemon.as_mut() {
                d.handle(vm, now, &[(v, half)], None);
            }
        }
        if let Some(d) = self.daemon.as_mut() {
            d.handle(vm, now, &[], Some(Event::Tick));
        }
        self.daemon_after(vm);
        true
    }

    /// pvschedd's discovery round: the host's CPU pressure decides the overload flag, which
    /// every VM's policy is told (pvschedd feeds it at each scan; it changes only here).
    pub(super) fn discovery_round(&mut self) {
        let now = self.now;
        let Some(share) = self.host.cpu_pressure_some(now) else {
            return;
        };
        self.cpu_pressure = Some(share);
        let ev = Event::OverloadHint {
            overloaded: overloaded(share),
        };
        for vm in 0..self.vms.len() as u32 {
            if let Some(d) = self.daemon.as_mut() {
                d.handle(vm, now, &[], Some(ev));
            }
            self.daemon_after(vm);
        }
        self.push(now + DEFAULT_DISCOVERY_INTERVAL_NS, Ev::Discovery);
    }

    /// Schedules the daemon's decisions and its next wakeup for `vm`.
    pub(super) fn daemon_after(&mut self, vm: u32) {
        let now = self.now;
        let Some(d) = self.daemon.as_mut() else {
            return;
        };
        let mut applies = std::mem::take(&mut self.applies);
        let tick = d.drain(vm, now, &mut applies);
        for &(at, vcpu, class, proactive) in &applies {
            self.push(
                at,
                Ev::Apply {
                    vm,
                    vcpu,
                    class,
                    proactive,
                },
            );
        }
        self.applies = applies;
        if let Some(t) = tick {
            self.push(t, Ev::DaemonTick { vm });
        }
    }
}

/// What the sched_ext scheduler reads of a guest half (`slot_guest_reason`'s fields).
pub(super) fn scx_view(g: &pvsched_abi::GuestHalf) -> ScxGuestView {
    use pvsched_abi as abi;
    ScxGuestView {
        idle: g.flags & abi::GF_ACTIVE == 0 || g.flags & abi::GF_IDLE != 0,
        rt: g.flags & abi::GF_BOOST_REQ != 0
            || matches!(
                g.policy,
                abi::POLICY_FIFO | abi::POLICY_RR | abi::POLICY_DEADLINE
            ),
        cs: g.cs_flags & abi::CS_ALL != 0,
        pending: g.guest_pending & abi::PENDING_VALID != 0,
        rt_switches: g.rt_switch_count,
    }
}

impl Sim {
    /// On the sched_ext backend, before any host call: the host's view of each running vCPU
    /// thread's guest is made current (only a running vCPU changes its guest half; the
    /// scheduler reads it when the thread stops and at a slice end).
    pub(super) fn scx_sync(&mut self) {
        if !self.scx {
            return;
        }
        let now = self.now;
        for cpu in 0..self.host.cpus() {
            let Some(t) = self.host.current(cpu) else {
                continue;
            };
            if let super::Owner::Vcpu { vm, vcpu } = self.threads[t as usize].owner {
                let view = scx_view(&self.vms[vm as usize].guest_half(vcpu, now));
                self.host.scx_set_view(t, view);
            }
        }
    }

    /// A daemon decision on the sched_ext backend, as pvschedd's `Managed::apply` makes it:
    /// an RT class is the boost of the thread's grant (`proactive` or a guest one); a fair
    /// class ends the boost and is the thread's own class.
    pub(super) fn scx_apply(&mut self, tid: Tid, class: Class, proactive: bool) {
        let now = self.now;
        self.scx_sync();
        match class.rt_prio() {
            Some(p) => self
                .host
                .scx_set_boost(now, tid, p, proactive, &mut self.sw),
            None => {
                self.host.scx_set_boost(now, tid, 0, false, &mut self.sw);
                if self.host.class(tid) != class {
                    self.host.set_class(now, tid, class, &mut self.sw);
                }
            }
        }
        self.flush();
    }

    /// pvschedd's scan on the sched_ext backend (`check_backend`, then the scan's slot reads
    /// and tick): per vCPU, the scheduler's own boosts since the last scan charged and its
    /// terms renewed; then every slot read, as pvschedd's scan reads them.
    pub(super) fn scx_scan(&mut self) {
        let now = self.now;
        let Some(d) = self.daemon.as_mut() else {
            return;
        };
        for (vm, g) in self.vms.iter().enumerate() {
            for (v, vc) in g.vcpus.iter().enumerate() {
                let done = self.host.scx_stats(vc.tid).unwrap_or_default();
                let allow = d.scx_scan(vm as u32, v as u32, now, done);
                self.host.scx_allow(vc.tid, allow);
            }
        }
        for vm in 0..self.vms.len() as u32 {
            let mut reads = std::mem::take(&mut self.reads);
            reads.clear();
            let g = &self.vms[vm as usize];
            reads.extend((0..g.vcpus.len() as u32).map(|v| (v, g.guest_half(v, now))));
            if let Some(d) = self.daemon.as_mut() {
                d.handle(vm, now, &reads, Some(Event::Tick));
            }
            self.reads = reads;
            self.daemon_after(vm);
        }
        self.push(now + SCX_SCAN_INTERVAL_NS, Ev::ScxScan);
    }
}
