//! pvschedd's inputs: host events of vCPU threads, slot reads, its recheck and the
//! decisions it schedules ([`crate::daemon`] holds the policy state).

use pvsched_policy::Event;

use super::{Ev, Sim};
use crate::host::ThreadState;

impl Sim {
    /// Feeds the daemon a host event of vCPU `v`, reading its guest half first when the
    /// daemon would (preempted, halted, woken).
    pub(super) fn feed(&mut self, vm: u32, v: u32, ev: Event, read_slot: bool) {
        let Some(d) = self.daemon.as_mut() else {
            return;
        };
        let now = self.now;
        let half = read_slot.then(|| self.vms[vm as usize].guest_half(v, now));
        d.handle(vm, now, half.map(|h| (v, h)), Some(ev));
        self.daemon_after(vm);
    }

    pub(super) fn daemon_tick(&mut self, vm: u32) {
        let now = self.now;
        let Some(d) = self.daemon.as_mut() else {
            return;
        };
        if !d.tick_due(vm, now) {
            return;
        }
        // The recheck: boosted vCPUs on a CPU are re-read.
        let reads: Vec<u32> = d.boosted_vcpus(vm).collect();
        for v in reads {
            let tid = self.vms[vm as usize].vcpus[v as usize].tid;
            if matches!(self.host.state(tid), ThreadState::Running(_)) {
                let half = self.vms[vm as usize].guest_half(v, now);
                if let Some(d) = self.daemon.as_mut() {
                    d.handle(vm, now, Some((v, half)), None);
                }
            }
        }
        if let Some(d) = self.daemon.as_mut() {
            d.handle(vm, now, None, Some(Event::Tick));
        }
        self.daemon_after(vm);
    }

    /// Schedules the daemon's decisions and its next wakeup for `vm`.
    pub(super) fn daemon_after(&mut self, vm: u32) {
        let now = self.now;
        let Some(d) = self.daemon.as_mut() else {
            return;
        };
        let (applies, tick) = d.drain(vm, now);
        for (at, vcpu, class) in applies {
            self.push(at, Ev::Apply { vm, vcpu, class });
        }
        if let Some(t) = tick {
            self.push(t, Ev::DaemonTick { vm });
        }
    }
}
