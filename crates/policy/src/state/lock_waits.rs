//! Lock waits the guests publish and the lock-holder extensions they earn.

use super::*;

impl VmState {
    /// The lock wait vCPU `i`'s view publishes, as the policy counts it: only from a guest
    /// that speaks, and naming a vCPU the VM has other than `i` itself.
    pub(super) fn lock_wait_of(&self, i: usize, view: &GuestView) -> LockHolder {
        match view.lock_holder {
            _ if !view.speaks() => LockHolder::None,
            LockHolder::Vcpu(h) if h as usize >= self.vcpus.len() || h as usize == i => {
                LockHolder::None
            }
            w => w,
        }
    }

    /// Whether another vCPU's lock wait names vCPU `h`: as the holder, or with the holder
    /// unknown.
    pub(super) fn wanted_by_waiters(&self, h: usize) -> bool {
        let Some(v) = self.vcpus.get(h) else {
            return false;
        };
        let own_any = u32::from(self.lock_wait_of(h, &v.guest) == LockHolder::Any);
        self.lock_named.get(h).is_some_and(|&n| n > 0) || self.lock_any > own_any
    }

    /// vCPU `i`'s view went from `old` to its current one: recount who is waited on, end
    /// extensions no wait names any more (at this event's evaluation), and extend the
    /// preempted holders the new wait names.
    pub(super) fn lock_wait_changed(&mut self, i: usize, old: &GuestView, now: u64) {
        let before = self.lock_wait_of(i, old);
        let view = &self.vcpus[i].guest;
        self.lock_guest |= view.lock_holder != LockHolder::None || view.lock_contended > 0;
        let after = self.lock_wait_of(i, view);
        if before != after {
            match before {
                LockHolder::Vcpu(h) => {
                    self.lock_named[h as usize] -= 1;
                    self.extra_eval.push(h as usize);
                }
                LockHolder::Any => {
                    self.lock_any -= 1;
                    for (h, v) in self.vcpus.iter().enumerate() {
                        if v.lock_ext.is_some() {
                            self.extra_eval.push(h);
                        }
                    }
                }
                LockHolder::None => {}
            }
            match after {
                LockHolder::Vcpu(h) => self.lock_named[h as usize] += 1,
                LockHolder::Any => self.lock_any += 1,
                LockHolder::None => {}
            }
        }
        match after {
            // Also for a wait read again: its holder may have been preempted since.
            LockHolder::Vcpu(h) => {
                self.try_extend(h as usize, now);
            }
            // A new wait with the holder unknown extends the siblings preempted now, once:
            // the guest publishes one only when it saw a sibling preempted, and in an
            // overcommitted VM some sibling nearly always is (the simulator: the holder's
            // vCPU was among them in 4.5 % of such waits), so later preemptions are not
            // extended for it.
            LockHolder::Any if before != after => {
                for h in (0..self.vcpus.len()).filter(|&h| h != i) {
                    self.try_extend(h, now);
                }
            }
            LockHolder::Any | LockHolder::None => {}
        }
    }

    /// Extends vCPU `h` if it is preempted, waited on, not extended already, and the VM's
    /// lock debt is below its cap (else the refusal is counted). Returns whether it did.
    pub(super) fn try_extend(&mut self, h: usize, now: u64) -> bool {
        // Where the host scheduler decides, it extends a holder at the preemption itself
        // (it reads the waiters' slots at the holder's slice end): no boost after the fact.
        if !self.limits.honor_lock_holders || self.kernel_rt || !self.wanted_by_waiters(h) {
            return false;
        }
        // A running holder a wait names is extended too with `lock_extend_running`: its
        // boost keeps the host from preempting it (eCS's extension) instead of taking a
        // CPU back after the preemption.
        let running_ok = self.limits.lock_extend_running && self.lock_waited_on(h as u32);
        let vm_rt = recent(&self.limits, self.last_rt, now);
        let v = &mut self.vcpus[h];
        // With nothing from outside the VM on the host, an extension only preempts
        // another of the VM's own threads (measured: the lone lock VM at 0.85x of vanilla
        // with extensions, 0.98x without).
        if !rivals_allow_extension(&self.limits, v, vm_rt) {
            return false;
        }
        let preempted = v.status == RunStatus::Preempted;
        let running = v.status == RunStatus::Running && running_ok;
        if !(preempted || running) || v.lock_ext.is_some() {
            return false;
        }
        if self.locks.debt_ns() >= self.limits.lock_debt_max_ns {
            self.locks.refused += 1;
            return false;
        }
        v.lock_ext = Some(Extension {
            until: now.saturating_add(self.limits.lock_extension_ns),
            // A running holder's extension cuts no preemption short.
            ran: running,
        });
        self.locks.extensions += 1;
        self.extra_eval.push(h);
        true
    }
}
