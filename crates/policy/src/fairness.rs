//! Fairness budgets: integer token buckets with a throttle latch.
//!
//! A VM's boosted time is bounded by two kinds of bucket (see the crate docs for which
//! boosts each one charges):
//!
//! * the **boost budget**, one per VM: every boosted, non-halted vCPU-ns, whatever the
//!   reason, `demoted_charge` times over while the vCPU is demoted; `boost_share_permille`
//!   of each vCPU's time, banked over `fairness_window_ns` (default 300 ms per vCPU per 1 s
//!   window);
//! * the **critical-section budget**, one per vCPU: the boosted, non-halted ns whose reason is
//!   a critical section; `cs_budget_ns` per `cs_window_ns` (default 2 ms per 4 ms).
//!
//! Each bucket is three integers, in *units* chosen per bucket so that no rate needs a
//! division: it earns `earn` units per elapsed ns, every charged vCPU spends `cost` units per
//! ns, and it holds at most `capacity` units (one window's budget: unused budget is banked for
//! one window at most). Earnings repay an overdraft first (1:1), then refill the tokens.
//!
//! **The latch.** The bucket latches at the first instant it is empty while it is being
//! drained (or overdrawn: the caller reacted late); from then on the caller refuses boosts of
//! its class. It clears at the first instant the debt is repaid, the debt being `resume`
//! units (by default the whole capacity) plus any overdraft: a VM that spent its window's
//! budget earns that much back, 1:1 at the window's rate, before it is boosted again. With
//! `resume` = capacity a VM that asks all the time gets exactly its budget per window (a
//! bucket of budget `B` per window `W` at 100 % demand: `W` boosted, `W` not, for
//! `B = W / 2`); a smaller `resume` gives the same share in shorter turns (the tokens are the
//! same, only the latch clears sooner), so that a VM that overdrew in one burst is refused for
//! a fraction of a window, not a whole one. Either way the hysteresis keeps the latch from
//! flapping. A bucket of capacity 0 is latched for good.
//!
//! Between two events the number of charged vCPUs is constant, so the rates are constant and
//! one step computes the exact result at any `dt`: no clock, no rounding (all `u128`,
//! saturating).

/// The rates of one bucket, in its units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetParams {
    /// Units earned per elapsed ns.
    pub earn: u128,
    /// Units spent per charged vCPU-ns.
    pub cost: u128,
    /// Most units banked: one window's budget.
    pub capacity: u128,
    /// Units a latched bucket earns back before the latch clears, 1..=`capacity` (0 only
    /// with a capacity of 0).
    pub resume: u128,
}

impl BudgetParams {
    /// A share of `nr_vcpus` vCPUs' time, in permille (0..=1000), banked over `window_ns`.
    /// Units: milli-ns (1 vCPU-ns = 1000 units), so earn = `S x N`, capacity = `S x N x W`.
    pub const fn share(share_permille: u32, nr_vcpus: u32, window_ns: u64) -> BudgetParams {
        let earn = share_permille as u128 * nr_vcpus as u128;
        let capacity = earn.saturating_mul(window_ns as u128);
        BudgetParams {
            earn,
            cost: 1000,
            capacity,
            resume: capacity,
        }
    }

    /// `budget_ns` of each of `nr_vcpus` vCPUs per `window_ns` (budget <= window).
    /// Units: 1 vCPU-ns = `W` units, so earn = `B x N`, capacity = `B x N x W`.
    pub const fn window(budget_ns: u64, nr_vcpus: u32, window_ns: u64) -> BudgetParams {
        let earn = (budget_ns as u128).saturating_mul(nr_vcpus as u128);
        let capacity = earn.saturating_mul(window_ns as u128);
        BudgetParams {
            earn,
            cost: window_ns as u128,
            capacity,
            resume: capacity,
        }
    }

    /// The same rates with a latch that clears once `resume_permille` (1..=1000) of the
    /// capacity is earned back (rounded up, at least one unit).
    pub const fn resuming_at(self, resume_permille: u32) -> BudgetParams {
        let permille = if resume_permille == 0 {
            1
        } else if resume_permille > 1000 {
            1000
        } else {
            resume_permille
        };
        let resume = self
            .capacity
            .saturating_mul(permille as u128)
            .div_ceil(1000);
        BudgetParams { resume, ..self }
    }

    /// `units` as vCPU-ns, rounded down.
    fn floor_ns(&self, units: u128) -> u64 {
        let ns = units.checked_div(self.cost).unwrap_or(0);
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    /// `units` as vCPU-ns, rounded up (so a debt never reads as 0 ns).
    fn ceil_ns(&self, units: u128) -> u64 {
        let ns = if self.cost == 0 {
            0
        } else {
            units.div_ceil(self.cost)
        };
        u64::try_from(ns).unwrap_or(u64::MAX)
    }
}

/// `a x b`, saturating; one widening multiply when `a` fits in 64 bits (every rate of valid
/// limits does), which keeps the per-event cost down.
fn mul(a: u128, b: u64) -> u128 {
    match u64::try_from(a) {
        Ok(a) => u128::from(a) * u128::from(b),
        Err(_) => a.saturating_mul(u128::from(b)),
    }
}

/// Tokens banked, overdraft owed and the latch, in units (see the module docs). At most one
/// of tokens and overdraft is non-zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    tokens: u128,
    overdraft: u128,
    latched: bool,
}

impl Budget {
    /// A full bucket: a VM starts with one window's budget banked (latched if that is 0).
    pub const fn full(p: &BudgetParams) -> Budget {
        Budget {
            tokens: p.capacity,
            overdraft: 0,
            latched: p.capacity == 0,
        }
    }

    /// A bucket with explicit contents (tests, state restore). An overdraft implies the latch.
    pub const fn from_units(tokens: u128, overdraft: u128, latched: bool) -> Budget {
        if overdraft > 0 {
            Budget {
                tokens: 0,
                overdraft,
                latched: true,
            }
        } else {
            Budget {
                tokens,
                overdraft: 0,
                latched,
            }
        }
    }

    /// `dt` ns passed with `charged` vCPUs charged the whole time; then the latch is updated.
    /// With `dt == 0` only the latch is: an empty bucket that starts being drained latches at
    /// once.
    #[inline]
    pub fn advance(&mut self, p: &BudgetParams, dt: u64, charged: u32) {
        if charged == 0 && !self.latched && self.tokens == p.capacity {
            // Full and not drained (most vCPUs, most of the time): nothing can change.
            return;
        }
        let earn_rate = p.earn;
        let spend_rate = mul(p.cost, u64::from(charged));
        if dt > 0 {
            let earn = mul(earn_rate, dt);
            let spend = mul(spend_rate, dt);
            if earn >= spend {
                let net = earn - spend;
                let repaid = net.min(self.overdraft);
                self.overdraft -= repaid;
                self.tokens = self.tokens.saturating_add(net - repaid).min(p.capacity);
            } else {
                let net = spend - earn;
                let taken = net.min(self.tokens);
                self.tokens -= taken;
                self.overdraft = self.overdraft.saturating_add(net - taken);
            }
        }
        if self.overdraft > 0 || (self.tokens == 0 && spend_rate > earn_rate) || p.capacity == 0 {
            self.latched = true;
        } else if self.latched && self.tokens >= p.resume {
            self.latched = false;
        }
    }

    /// `ns` vCPU-ns spent at once, outside the rates (boosts another decider took, reported
    /// after the fact): from the tokens, then as overdraft; then the latch is updated.
    pub fn spend(&mut self, p: &BudgetParams, ns: u64) {
        let units = mul(p.cost, ns);
        let taken = units.min(self.tokens);
        self.tokens -= taken;
        self.overdraft = self.overdraft.saturating_add(units - taken);
        if self.overdraft > 0 || (self.tokens == 0 && units > 0) || p.capacity == 0 {
            self.latched = true;
        }
    }

    /// New rates: keep the debt and the latch, cap the tokens at the new capacity (a latch
    /// whose debt the new capacity no longer exceeds clears; a capacity of 0 latches).
    pub fn rescale(&mut self, p: &BudgetParams) {
        self.tokens = self.tokens.min(p.capacity);
        if p.capacity == 0 {
            self.latched = true;
        } else if self.latched && self.overdraft == 0 && self.tokens >= p.resume {
            self.latched = false;
        }
    }

    /// Whether boosts of this bucket's class are refused: the bucket ran dry and its debt is
    /// not repaid yet.
    pub const fn latched(&self) -> bool {
        self.latched
    }

    /// Banked tokens, units.
    pub const fn tokens(&self) -> u128 {
        self.tokens
    }

    /// Spending beyond the tokens, units (the caller reacted after the bucket ran dry).
    pub const fn overdraft(&self) -> u128 {
        self.overdraft
    }

    /// What must be earned before the latch clears, units: `resume` minus the tokens plus
    /// the overdraft while latched, else 0.
    pub fn debt(&self, p: &BudgetParams) -> u128 {
        if self.latched {
            p.resume
                .saturating_sub(self.tokens)
                .saturating_add(self.overdraft)
        } else {
            0
        }
    }

    /// Boosted vCPU-ns that may still be spent: the tokens, rounded down; 0 while latched.
    /// Whether fewer than `permille` of a full bucket's units are left (latched: none are).
    pub fn below(&self, p: &BudgetParams, permille: u32) -> bool {
        self.latched
            || self.tokens.saturating_mul(1000) < p.capacity.saturating_mul(u128::from(permille))
    }

    pub fn remaining_ns(&self, p: &BudgetParams) -> u64 {
        if self.latched {
            0
        } else {
            p.floor_ns(self.tokens)
        }
    }

    /// [`Budget::debt`] in vCPU-ns, rounded up.
    pub fn debt_ns(&self, p: &BudgetParams) -> u64 {
        p.ceil_ns(self.debt(p))
    }

    /// In how many ns the latch flips if `charged` vCPUs stay charged: the first instant an
    /// unlatched bucket is empty (`ceil(tokens / net)`, 0 if it is empty already), or the
    /// first instant a latched one is repaid (`ceil(debt / net)`, at least 1). `None` when it
    /// never flips at this rate.
    pub fn next_flip_ns(&self, p: &BudgetParams, charged: u32) -> Option<u64> {
        let earn = p.earn;
        let spend = mul(p.cost, u64::from(charged));
        let ns = if !self.latched && spend > earn {
            self.tokens.div_ceil(spend - earn)
        } else if self.latched && p.capacity > 0 && earn > spend {
            self.debt(p).div_ceil(earn - spend).max(1)
        } else {
            return None;
        };
        Some(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 500 ns of budget per 1000 ns window, one vCPU.
    const P: BudgetParams = BudgetParams::window(500, 1, 1_000);

    /// Runs `b` for `until` ns with one vCPU asking all the time, boosted whenever the bucket
    /// is not latched, stepping at every flip (as a caller ticking at `next_deadline` does).
    /// Returns the boosted ns.
    fn always_asking(b: &mut Budget, p: &BudgetParams, until: u64) -> u64 {
        let (mut t, mut boosted) = (0u64, 0u64);
        while t < until {
            let charged = u32::from(!b.latched());
            let step = b
                .next_flip_ns(p, charged)
                .unwrap_or(u64::MAX)
                .min(until - t);
            b.advance(p, step, charged);
            boosted += step * u64::from(charged);
            t += step;
        }
        boosted
    }

    #[test]
    fn capacity_is_one_windows_budget_of_every_vcpu() {
        let two = BudgetParams::window(500, 2, 1_000);
        assert_eq!(Budget::full(&two).remaining_ns(&two), 1_000);
        let share = BudgetParams::share(500, 2, 1_000);
        assert_eq!(Budget::full(&share).remaining_ns(&share), 1_000);
    }

    #[test]
    fn a_vcpu_asking_all_the_time_gets_exactly_its_budget_per_window_over_ten_windows() {
        let mut b = Budget::full(&P);

        let boosted = always_asking(&mut b, &P, 10 * 1_000);

        // From a full bucket: 1000 boosted (the bank plus what it earns meanwhile), 1000
        // latched while the whole window's budget is earned back, and so on.
        assert_eq!(boosted, 10 * 500);
    }

    #[test]
    fn a_partial_resume_gives_the_same_share_in_shorter_turns() {
        // The latch clears once a tenth of the window's budget (50 of 500) is earned back.
        let p = P.resuming_at(100);
        let mut b = Budget::full(&p);

        let first_turn = always_asking(&mut b, &p, 1_000);
        let (latched, debt, refused_for) = (b.latched(), b.debt_ns(&p), b.next_flip_ns(&p, 0));
        let rest = always_asking(&mut b, &p, 9_000);

        // The bank (500) plus what it earns meanwhile, spent at a net 0.5 per ns: 1000
        // boosted; then refused for 100 ns (a tenth of the window), not 1000.
        assert_eq!(first_turn, 1_000);
        assert!(latched);
        assert_eq!(debt, 50);
        assert_eq!(refused_for, Some(100));
        // Then 100 on, 100 off: still half the time, the budget's share.
        assert_eq!(rest, 9_000 / 2);
    }

    #[test]
    fn resume_permille_is_clamped_into_its_range_and_rounds_up() {
        assert_eq!(P.resuming_at(0).resume, P.capacity / 1000);
        assert_eq!(P.resuming_at(1000).resume, P.capacity);
        assert_eq!(P.resuming_at(5000).resume, P.capacity);
        assert_eq!(P.resuming_at(333).resume, 166_500);
        let small = BudgetParams::window(1, 1, 3);
        assert_eq!(small.resuming_at(1).resume, 1);
    }

    #[test]
    fn the_share_form_gives_the_same_budget_as_the_window_form() {
        let p = BudgetParams::share(500, 1, 1_000);
        let mut b = Budget::full(&p);

        assert_eq!(always_asking(&mut b, &p, 10 * 1_000), 10 * 500);
    }

    #[test]
    fn boosting_within_the_rate_costs_nothing() {
        let two = BudgetParams::window(500, 2, 1_000);
        let mut b = Budget::full(&two);
        b.advance(&two, 1_000_000, 1); // 1 of 2 vCPUs boosted = exactly the rate
        assert_eq!(b, Budget::full(&two));
    }

    #[test]
    fn the_latch_sets_at_the_first_instant_the_bucket_is_empty() {
        let b = Budget::full(&P);
        // Spend 1000 units/ns, earn 500: 500_000 units last exactly 1000 ns.
        assert_eq!(b.next_flip_ns(&P, 1), Some(1_000));
        let mut before = b;
        before.advance(&P, 999, 1);
        assert!(!before.latched());
        assert_eq!(before.remaining_ns(&P), 0, "500 units left: under 1 ns");
        let mut at = b;
        at.advance(&P, 1_000, 1);
        assert!(at.latched());
        assert_eq!(at.debt_ns(&P), 500, "the whole window's budget is owed");
    }

    #[test]
    fn the_latch_clears_only_when_the_debt_is_repaid_one_to_one() {
        let mut b = Budget::full(&P);
        b.advance(&P, 1_000, 1);
        assert_eq!(
            b.next_flip_ns(&P, 0),
            Some(1_000),
            "500 ns owed at 0.5 ns per ns"
        );

        b.advance(&P, 600, 0);
        let halfway = (b.latched(), b.debt_ns(&P), b.remaining_ns(&P));
        b.advance(&P, 399, 0);
        let just_before = (b.latched(), b.debt_ns(&P));
        b.advance(&P, 1, 0);

        assert_eq!(
            halfway,
            (true, 200, 0),
            "tokens earned back do not count yet"
        );
        assert_eq!(just_before, (true, 1));
        assert!(!b.latched());
        assert_eq!(b.remaining_ns(&P), 500);
    }

    #[test]
    fn an_overdraft_latches_and_is_repaid_before_the_bucket_refills() {
        let mut b = Budget::full(&P);
        // The caller reacted 100 ns late: 50 ns of vCPU time overdrawn.
        b.advance(&P, 1_100, 1);
        assert!(b.latched());
        assert_eq!(b.overdraft(), 50 * 1_000);
        assert_eq!(b.debt_ns(&P), 550);

        b.advance(&P, 100, 0);
        assert_eq!((b.overdraft(), b.tokens()), (0, 0));
        assert_eq!(b.next_flip_ns(&P, 0), Some(1_000));
    }

    #[test]
    fn an_idle_vm_banks_at_most_one_window() {
        let mut b = Budget::from_units(0, 0, false);

        b.advance(&P, u64::MAX, 0);

        assert_eq!(b.tokens(), P.capacity);
        assert_eq!(b.remaining_ns(&P), 500);
    }

    #[test]
    fn an_empty_bucket_latches_as_soon_as_it_is_drained() {
        let mut b = Budget::from_units(0, 0, false);
        assert_eq!(b.next_flip_ns(&P, 1), Some(0));

        b.advance(&P, 0, 1);

        assert!(b.latched());
    }

    #[test]
    fn no_flip_when_rates_balance() {
        let two = BudgetParams::window(500, 2, 1_000);
        assert_eq!(Budget::full(&two).next_flip_ns(&two, 1), None);
        assert_eq!(Budget::full(&two).next_flip_ns(&two, 0), None);
        let latched = Budget::from_units(5, 0, true);
        assert_eq!(latched.next_flip_ns(&two, 1), None);
    }

    #[test]
    fn a_zero_budget_is_latched_for_good() {
        let p = BudgetParams::share(0, 2, 1_000);
        let mut b = Budget::full(&p);
        assert!(b.latched());

        b.advance(&p, u64::MAX, 0);

        assert!(b.latched());
        assert_eq!(b.next_flip_ns(&p, 0), None);
        assert_eq!(b.remaining_ns(&p), 0);
    }

    #[test]
    fn rescale_keeps_the_debt_and_caps_tokens() {
        let small = BudgetParams::window(5, 1, 1_000);
        let mut b = Budget::full(&P);
        b.rescale(&small);
        assert_eq!(b.tokens(), small.capacity);

        let mut owing = Budget::from_units(0, 7, true);
        owing.rescale(&small);
        assert_eq!(owing.overdraft(), 7);
        assert!(owing.latched());

        let mut nearly = Budget::from_units(small.capacity, 0, true);
        nearly.rescale(&small);
        assert!(
            !nearly.latched(),
            "nothing left to repay at the new capacity"
        );
    }

    #[test]
    fn huge_intervals_saturate_instead_of_overflowing() {
        let p = BudgetParams::share(0, crate::MAX_VCPUS, u64::MAX);
        let mut b = Budget::from_units(0, u128::MAX - 1, true);
        b.advance(&p, u64::MAX, crate::MAX_VCPUS);
        assert_eq!(b.overdraft(), u128::MAX);
        let big = BudgetParams::window(u64::MAX, crate::MAX_VCPUS, u64::MAX);
        assert_eq!(big.capacity, u128::MAX);
        assert_eq!(Budget::full(&big).debt_ns(&big), 0);
    }
}
