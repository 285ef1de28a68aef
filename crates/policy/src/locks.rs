//! Lock-holder extensions and the lock debt they leave (eventual fairness).
//!
//! A vCPU that another vCPU's guest waits on (it holds the lock the waiter wants) and that
//! the host preempted is boosted for at most `lock_extension_ns`. The boost takes CPU time
//! outside the host's fair class, which never charges it to the thread's virtual runtime: a
//! VM extended often would get more than its share. So every ns an extension runs on a CPU
//! is *lock debt*, and the debt is repaid in the fair class itself: while it lasts, the
//! VM's unboosted vCPUs run at `debt_nice`, and each ns one of them runs there repays
//! `w(nice) / w(debt_nice) - 1` ns (CFS and EEVDF advance a task's virtual runtime by
//! `delta x w(0) / w(nice)`: running at the lower weight adds exactly the virtual runtime
//! the extension did not). Once the debt is repaid the vCPUs' virtual runtimes stand where
//! they would have without extensions: eventual fairness, enforced by the host's own
//! scheduler, not advised. A VM whose debt reaches `lock_debt_max_ns` gets no extension
//! until it has repaid below it.
//!
//! Integer arithmetic only, like [`crate::fairness`].

/// The kernel's CFS weight of each nice value, -20..=19 (`sched_prio_to_weight`).
const NICE_WEIGHT: [u32; 40] = [
    88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916, 9548, 7620, 6100, 4904,
    3906, 3121, 2501, 1991, 1586, 1277, 1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87,
    70, 56, 45, 36, 29, 23, 18, 15,
];

/// CFS weight of `nice` (clamped into -20..=19).
pub fn weight(nice: i8) -> u32 {
    NICE_WEIGHT[(i32::from(nice).clamp(-20, 19) + 20) as usize]
}

/// Lock debt repaid per ns a vCPU whose nice would be `base` runs at `repay` instead, in
/// permille: `1000 x (w(base) / w(repay) - 1)`, 0 when `repay` is not a lower weight.
pub fn repay_permille(base: i8, repay: i8) -> u64 {
    let (wb, wr) = (u64::from(weight(base)), u64::from(weight(repay)));
    if wr >= wb {
        return 0;
    }
    wb * 1000 / wr - 1000
}

/// Longest a lock debt below `lock_repay_from_ns` waits before it is repaid all the same:
/// eventual fairness must not depend on more extensions coming. A tenth of a second is
/// nothing against the CPU split over 10 s, and at most ten repayments a second.
pub const DEBT_WAIT_NS: u64 = 100_000_000;

/// A lock-holder extension in force on one vCPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extension {
    /// When it ends at the latest.
    pub until: u64,
    /// The vCPU has run since the extension began: the preemption was cut short.
    pub ran: bool,
}

/// The VM's lock debt and counters. Rates change only at events; [`LockLedger::advance`]
/// integrates them over the time in between.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockLedger {
    /// Extension time on a CPU not repaid yet, ns.
    debt_ns: u64,
    /// Repayment below one ns, in thousandths of a ns.
    frac: u64,
    /// Extension time on a CPU, ns, ever.
    extended_ns: u64,
    /// Debt repaid, ns, ever.
    repaid_ns: u64,
    /// vCPUs extended and on a CPU right now (each adds its time to the debt).
    charging: u32,
    /// Sum of the repayment rates (permille) of the vCPUs repaying right now.
    repaying_permille: u64,
    /// The VM repays: the debt reached `lock_repay_from_ns` (or waited
    /// [`DEBT_WAIT_NS`]) and is not cleared yet.
    owing: bool,
    /// How long the debt has waited below `lock_repay_from_ns`, ns.
    waited_ns: u64,
    /// Extensions granted.
    pub extensions: u64,
    /// Of them, those granted at the preemption itself: a wait already named
    /// the vCPU when the host preempted it. The others began with a wait
    /// published (or read) after the preemption: only a reaction can serve
    /// those, whatever the host's scheduler lets the daemon do.
    pub at_preemption: u64,
    /// Extensions refused: the debt had reached `lock_debt_max_ns`.
    pub refused: u64,
    /// Extensions whose vCPU ran before they ended (a preemption cut short).
    pub avoided: u64,
}

impl LockLedger {
    /// Integrates `dt` ns of the rates in force; repayment starts once the debt has
    /// reached `repay_from_ns` (0: at once) and lasts until it is cleared.
    pub(crate) fn advance(&mut self, dt: u64, repay_from_ns: u64) {
        let added = dt.saturating_mul(u64::from(self.charging));
        self.extended_ns = self.extended_ns.saturating_add(added);
        let owed = self.debt_ns.saturating_add(added);
        let repay_milli =
            u128::from(dt) * u128::from(self.repaying_permille) + u128::from(self.frac);
        let repay = u64::try_from(repay_milli / 1000).unwrap_or(u64::MAX);
        let left = owed.saturating_sub(repay);
        self.repaid_ns = self.repaid_ns.saturating_add(owed - left);
        self.debt_ns = left;
        self.frac = if left == 0 {
            0
        } else {
            (repay_milli % 1000) as u64
        };
        if left == 0 {
            self.owing = false;
            self.waited_ns = 0;
        } else if !self.owing {
            self.waited_ns = self.waited_ns.saturating_add(dt);
            if left >= repay_from_ns || self.waited_ns >= DEBT_WAIT_NS {
                self.owing = true;
                self.waited_ns = 0;
            }
        }
    }

    /// Changes the rates: `charging` vCPUs extended on a CPU, repaying at `permille` in all.
    pub(crate) fn set_rates(&mut self, charging: u32, repaying_permille: u64) {
        self.charging = charging;
        self.repaying_permille = repaying_permille;
    }

    pub(crate) fn charging(&self) -> u32 {
        self.charging
    }

    pub(crate) fn repaying_permille(&self) -> u64 {
        self.repaying_permille
    }

    /// Whether the VM repays extension time: its debt reached the point where repayment
    /// starts, and is not cleared yet. (A smaller debt waits: each start and end of a
    /// repayment is a nice change of every vCPU.)
    pub fn in_debt(&self) -> bool {
        self.owing
    }

    /// Extension time not repaid yet, ns.
    pub fn debt_ns(&self) -> u64 {
        self.debt_ns
    }

    /// Extension time on a CPU, ns, ever.
    pub fn extended_ns(&self) -> u64 {
        self.extended_ns
    }

    /// Debt repaid, ns, ever.
    pub fn repaid_ns(&self) -> u64 {
        self.repaid_ns
    }

    /// In how many ns a debt waiting below `lock_repay_from_ns` starts to be repaid
    /// ([`DEBT_WAIT_NS`]); `None` when none waits.
    pub fn repay_starts_in_ns(&self) -> Option<u64> {
        (!self.owing && self.debt_ns > 0).then(|| DEBT_WAIT_NS.saturating_sub(self.waited_ns))
    }

    /// In how many ns the debt is repaid at the rates in force; `None` when it is not
    /// shrinking (or there is none).
    pub fn clears_in_ns(&self) -> Option<u64> {
        if !self.owing {
            return None;
        }
        let drain = self
            .repaying_permille
            .checked_sub(u64::from(self.charging) * 1000)
            .filter(|&d| d > 0)?;
        let owed_milli = u128::from(self.debt_ns) * 1000 - u128::from(self.frac);
        let dt = owed_milli.div_ceil(u128::from(drain));
        Some(u64::try_from(dt).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_the_kernels() {
        assert_eq!(weight(0), 1024);
        assert_eq!(weight(5), 335);
        assert_eq!(weight(-20), 88761);
        assert_eq!(weight(19), 15);
        assert_eq!(weight(100), 15);
    }

    #[test]
    fn nice_five_repays_about_twice_the_time_it_runs() {
        // 1024 / 335 = 3.0567: each ns at nice 5 adds 3.06 ns of virtual runtime.
        assert_eq!(repay_permille(0, 5), 2056);
        assert_eq!(repay_permille(5, 5), 0);
        assert_eq!(repay_permille(5, 0), 0);
    }

    #[test]
    fn extension_time_becomes_debt_and_repayment_clears_it() {
        let mut l = LockLedger::default();
        l.set_rates(1, 0);
        l.advance(1_000_000, 0);
        assert_eq!((l.debt_ns(), l.extended_ns()), (1_000_000, 1_000_000));
        // One vCPU repaying at nice 5: 1 ms / 2.056 = 486,382 ns (rounded up).
        l.set_rates(0, 2056);
        assert_eq!(l.clears_in_ns(), Some(486_382));
        l.advance(486_381, 0);
        assert!(l.in_debt());
        l.advance(1, 0);
        assert!(!l.in_debt());
        assert_eq!(l.repaid_ns(), 1_000_000);
        // Nothing more to repay: more time at the rate repays nothing.
        l.advance(1_000_000, 0);
        assert_eq!((l.debt_ns(), l.repaid_ns()), (0, 1_000_000));
        assert_eq!(l.clears_in_ns(), None);
    }

    #[test]
    fn repayment_starts_once_the_debt_reaches_repay_from_and_lasts_until_it_is_cleared() {
        let mut l = LockLedger::default();
        l.set_rates(1, 0);
        l.advance(600_000, 1_000_000);
        assert_eq!(l.debt_ns(), 600_000);
        assert!(!l.in_debt());
        assert_eq!(l.clears_in_ns(), None);
        l.advance(400_000, 1_000_000);
        assert!(l.in_debt());
        // Repaying, it owes until the debt is 0, below repay_from too.
        l.set_rates(0, 2000);
        l.advance(400_000, 1_000_000);
        assert_eq!(l.debt_ns(), 200_000);
        assert!(l.in_debt());
        assert_eq!(l.clears_in_ns(), Some(100_000));
        l.advance(100_000, 1_000_000);
        assert!(!l.in_debt());
        // A new debt below repay_from waits again, for DEBT_WAIT_NS at the most.
        l.set_rates(1, 0);
        l.advance(10_000, 1_000_000);
        assert!(!l.in_debt());
        l.set_rates(0, 0);
        assert_eq!(l.repay_starts_in_ns(), Some(DEBT_WAIT_NS - 10_000));
        l.advance(DEBT_WAIT_NS - 10_001, 1_000_000);
        assert!(!l.in_debt());
        l.advance(1, 1_000_000);
        assert!(l.in_debt());
        assert_eq!(l.repay_starts_in_ns(), None);
    }

    #[test]
    fn debt_that_grows_faster_than_it_is_repaid_has_no_clearing_time() {
        let mut l = LockLedger::default();
        l.set_rates(1, 0);
        l.advance(10, 0);
        l.set_rates(1, 900);
        assert_eq!(l.clears_in_ns(), None);
        l.advance(1000, 0);
        assert_eq!(l.debt_ns(), 10 + 1000 - 900);
    }
}
