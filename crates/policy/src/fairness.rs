//! Eventual fairness: the VM's boost budget as an integer token bucket.
//!
//! Units are *milli-nanoseconds* of vCPU time (1 boosted vCPU-ns = 1000 units), so that a
//! share in permille needs no division:
//!
//! * the bucket earns `S x N` units per elapsed ns (`S` = `boost_share_permille`,
//!   `N` = number of vCPUs);
//! * every boosted, non-halted vCPU spends 1000 units per ns;
//! * the bucket holds at most `C = S x N x W` units (`W` = `fairness_window_ns`): unused
//!   share is banked for one window at most;
//! * spending beyond the tokens becomes debt; earnings repay debt first (1:1), then refill
//!   the bucket.
//!
//! Between two events the number of boosted vCPUs is constant, so the rates are constant
//! and one step computes the exact result at any `dt`: no clock, no rounding (all `u128`,
//! saturating).

/// The three numbers the bucket depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetParams {
    /// Boostable share of vCPU time, permille (0..=1000).
    pub share_permille: u32,
    /// vCPUs of the VM.
    pub nr_vcpus: u32,
    /// Banking window, ns.
    pub window_ns: u64,
}

impl BudgetParams {
    /// `S x N`: units earned per elapsed ns.
    pub const fn earn_rate(&self) -> u128 {
        self.share_permille as u128 * self.nr_vcpus as u128
    }

    /// `S x N x W`: the bucket's capacity, units.
    pub const fn capacity(&self) -> u128 {
        self.earn_rate() * self.window_ns as u128
    }
}

/// Units per boosted vCPU-ns.
pub const UNITS_PER_NS: u128 = 1000;

/// Tokens banked and debt owed, in units (see the module docs). At most one of them is
/// non-zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    tokens: u128,
    debt: u128,
}

impl Budget {
    /// A full bucket: a VM starts with one window of boost banked.
    pub const fn full(p: &BudgetParams) -> Budget {
        Budget {
            tokens: p.capacity(),
            debt: 0,
        }
    }

    /// A bucket with explicit contents (tests, state restore).
    pub const fn from_units(tokens: u128, debt: u128) -> Budget {
        if debt > 0 {
            Budget { tokens: 0, debt }
        } else {
            Budget { tokens, debt: 0 }
        }
    }

    /// `dt` ns passed with `boosted` vCPUs charged the whole time.
    pub fn advance(&mut self, p: &BudgetParams, dt: u64, boosted: u32) {
        if dt == 0 {
            return;
        }
        let earn = p.earn_rate().saturating_mul(dt as u128);
        let spend = UNITS_PER_NS
            .saturating_mul(boosted as u128)
            .saturating_mul(dt as u128);
        if earn >= spend {
            let net = earn - spend;
            let repaid = net.min(self.debt);
            self.debt -= repaid;
            self.tokens = self.tokens.saturating_add(net - repaid).min(p.capacity());
        } else {
            let net = spend - earn;
            let taken = net.min(self.tokens);
            self.tokens -= taken;
            self.debt = self.debt.saturating_add(net - taken);
        }
    }

    /// New limits: keep the debt, cap the tokens at the new capacity.
    pub fn rescale(&mut self, p: &BudgetParams) {
        self.tokens = self.tokens.min(p.capacity());
    }

    /// Whether the VM owes boosted time.
    pub const fn in_debt(&self) -> bool {
        self.debt > 0
    }

    /// Banked tokens, units.
    pub const fn tokens(&self) -> u128 {
        self.tokens
    }

    /// Debt, units.
    pub const fn debt(&self) -> u128 {
        self.debt
    }

    /// Debt in boosted vCPU-ns, rounded up (so "in debt" never reads as 0 ns).
    pub fn debt_ns(&self) -> u64 {
        u64::try_from(self.debt.div_ceil(UNITS_PER_NS)).unwrap_or(u64::MAX)
    }

    /// Banked tokens in boosted vCPU-ns, rounded down.
    pub fn tokens_ns(&self) -> u64 {
        u64::try_from(self.tokens / UNITS_PER_NS).unwrap_or(u64::MAX)
    }

    /// In how many ns [`Budget::in_debt`] flips if `boosted` vCPUs stay charged: the first
    /// instant the debt is fully repaid (`ceil(debt / net)`), or the first instant spending
    /// exceeds the tokens (`floor(tokens / -net) + 1`). `None` when it never flips at this
    /// rate. Always >= 1.
    pub fn next_flip_ns(&self, p: &BudgetParams, boosted: u32) -> Option<u64> {
        let earn = p.earn_rate();
        let spend = UNITS_PER_NS.saturating_mul(boosted as u128);
        let ns = if self.debt > 0 && earn > spend {
            self.debt.div_ceil(earn - spend)
        } else if self.debt == 0 && spend > earn {
            self.tokens / (spend - earn) + 1
        } else {
            return None;
        };
        Some(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: BudgetParams = BudgetParams {
        share_permille: 500,
        nr_vcpus: 2,
        window_ns: 1_000,
    };

    #[test]
    fn capacity_is_share_times_vcpus_times_window() {
        assert_eq!(P.capacity(), 500 * 2 * 1_000);
        assert_eq!(Budget::full(&P).tokens_ns(), 1_000);
    }

    #[test]
    fn boosting_within_the_share_costs_nothing() {
        let mut b = Budget::full(&P);
        b.advance(&P, 1_000_000, 1); // 1 of 2 vCPUs boosted = exactly the 50 % share
        assert_eq!(b, Budget::full(&P));
    }

    #[test]
    fn boosting_beyond_the_share_drains_tokens_then_builds_debt() {
        let mut b = Budget::full(&P);
        // 2 boosted: spend 2000/ns, earn 1000/ns, net -1000/ns = -1 vCPU-ns per ns.
        b.advance(&P, 600, 2);
        assert_eq!((b.tokens_ns(), b.debt_ns()), (400, 0));
        b.advance(&P, 600, 2);
        assert_eq!((b.tokens_ns(), b.debt_ns()), (0, 200));
        assert!(b.in_debt());
    }

    #[test]
    fn debt_is_repaid_one_to_one_before_tokens_refill() {
        let mut b = Budget::from_units(0, 300 * UNITS_PER_NS);
        // Nobody boosted: earn 1000 units/ns = 1 vCPU-ns per ns.
        b.advance(&P, 200, 0);
        assert_eq!((b.tokens_ns(), b.debt_ns()), (0, 100));
        b.advance(&P, 250, 0);
        assert_eq!((b.tokens_ns(), b.debt_ns()), (150, 0));
        assert!(!b.in_debt());
    }

    #[test]
    fn tokens_never_exceed_one_window() {
        let mut b = Budget::from_units(0, 0);
        b.advance(&P, u64::MAX, 0);
        assert_eq!(b.tokens(), P.capacity());
    }

    #[test]
    fn next_flip_is_the_first_instant_debt_is_repaid() {
        let b = Budget::from_units(0, 1001);
        // net +1000 units/ns with nobody boosted: 1001 units take 2 ns.
        assert_eq!(b.next_flip_ns(&P, 0), Some(2));
        let mut after = b;
        after.advance(&P, 1, 0);
        assert!(after.in_debt());
        after.advance(&P, 1, 0);
        assert!(!after.in_debt());
    }

    #[test]
    fn next_flip_is_the_first_instant_debt_appears() {
        let b = Budget::from_units(2000, 0);
        // net -1000 units/ns: 2000 tokens last exactly 2 ns, debt appears at 3.
        assert_eq!(b.next_flip_ns(&P, 2), Some(3));
        let mut at2 = b;
        at2.advance(&P, 2, 2);
        assert!(!at2.in_debt());
        let mut at3 = b;
        at3.advance(&P, 3, 2);
        assert!(at3.in_debt());
    }

    #[test]
    fn no_flip_when_rates_balance() {
        assert_eq!(Budget::from_units(5, 0).next_flip_ns(&P, 1), None);
        assert_eq!(Budget::from_units(0, 5).next_flip_ns(&P, 1), None);
        assert_eq!(Budget::from_units(5, 0).next_flip_ns(&P, 0), None);
    }

    #[test]
    fn zero_share_never_repays() {
        let p = BudgetParams {
            share_permille: 0,
            ..P
        };
        let mut b = Budget::full(&p);
        b.advance(&p, 10, 1);
        assert_eq!(b.debt_ns(), 10);
        assert_eq!(b.next_flip_ns(&p, 0), None);
    }

    #[test]
    fn rescale_keeps_debt_and_caps_tokens() {
        let small = BudgetParams { window_ns: 10, ..P };
        let mut b = Budget::full(&P);
        b.rescale(&small);
        assert_eq!(b.tokens(), small.capacity());
        let mut d = Budget::from_units(0, 7);
        d.rescale(&small);
        assert_eq!(d.debt(), 7);
    }

    #[test]
    fn huge_intervals_saturate_instead_of_overflowing() {
        let p = BudgetParams {
            share_permille: 0,
            nr_vcpus: crate::MAX_VCPUS,
            window_ns: u64::MAX,
        };
        let mut b = Budget::from_units(0, u128::MAX - 1);
        b.advance(&p, u64::MAX, crate::MAX_VCPUS);
        assert_eq!(b.debt(), u128::MAX);
        assert_eq!(b.debt_ns(), u64::MAX);
    }
}
