//! pvschedd's inputs: host events of vCPU threads, slot reads, its recheck and the
//! decisions it schedules ([`crate::daemon`] holds the policy state).

use pvsched_policy::Event;

use super::{Ev, Sim};
use pvsched_policy::serving::DEFAULT_DISCOVERY_INTERVAL_NS;

use crate::daemon::overloaded;

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
        for &(at, vcpu, class) in &applies {
            self.push(at, Ev::Apply { vm, vcpu, class });
        }
        self.applies = applies;
        if let Some(t) = tick {
            self.push(t, Ev::DaemonTick { vm });
        }
    }
}
