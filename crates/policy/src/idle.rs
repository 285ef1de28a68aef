//! Idle transitions of a vCPU, measured from the scheduler events the policy already gets,
//! and the halt-polling advisor that prices them.
//!
//! A vCPU thread that blocks has halted; the wakeup that follows ends the halt
//! (*halt → wake*), and its next switch-in ends the wakeup (*wake → running*). Both go into
//! [`DurationHistogram`]s, which keep per bucket a count and a sum so that the cost of
//! polling (time spent spinning instead of halting) can be computed from them exactly for
//! bucket-aligned windows.
//!
//! The advisor models a fixed polling window `W` (what `halt_poll_ns` caps and what a
//! guest's haltpoll spins): a halt shorter than `W` is caught by polling (the vCPU never
//! leaves the CPU, the wakeup costs nothing), and every halt costs `min(d, W)` of CPU.
//! KVM's adaptive window (grow/shrink) stays at or below the cap, so the figures are what
//! the cap allows at most.

/// Sub-buckets per power of two.
const SUB: u32 = 4;
/// Smallest bucket: durations below 1 µs share bucket 0.
const MIN_NS: u64 = 1_000;
/// Powers of two covered above `MIN_NS` (1 µs .. ~ 17 min); longer ones go to the last.
const OCTAVES: u32 = 30;
/// Number of buckets.
pub const BUCKETS: usize = (OCTAVES * SUB + 1) as usize;

/// Durations, in buckets a quarter of a power of two wide from 1 µs up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DurationHistogram {
    counts: Vec<u64>,
    sums_ns: Vec<u64>,
}

impl Default for DurationHistogram {
    fn default() -> Self {
        DurationHistogram {
            counts: vec![0; BUCKETS],
            sums_ns: vec![0; BUCKETS],
        }
    }
}

/// The bucket of `ns`: 0 below 1 µs; then `1 + SUB * octave + quarter`.
pub fn bucket_of(ns: u64) -> usize {
    if ns < MIN_NS {
        return 0;
    }
    let octave = 63 - (ns / MIN_NS).leading_zeros(); // floor(log2(ns / 1 µs))
    if octave >= OCTAVES {
        return BUCKETS - 1;
    }
    // The quarter of the octave [base, 2 base) that holds ns.
    let base = MIN_NS << octave;
    let quarter = ((ns - base) * u64::from(SUB) / base) as u32;
    (1 + octave * SUB + quarter) as usize
}

/// The upper bound (exclusive) of bucket `b`, ns; `u64::MAX` for the last.
pub fn bucket_upper_ns(b: usize) -> u64 {
    if b == 0 {
        return MIN_NS;
    }
    if b >= BUCKETS - 1 {
        return u64::MAX;
    }
    let i = b as u32 - 1;
    let (octave, quarter) = (i / SUB, i % SUB);
    let base = MIN_NS << octave;
    base + base * u64::from(quarter + 1) / u64::from(SUB)
}

impl DurationHistogram {
    pub fn record(&mut self, ns: u64) {
        let b = bucket_of(ns);
        self.counts[b] += 1;
        self.sums_ns[b] = self.sums_ns[b].saturating_add(ns);
    }

    pub fn merge(&mut self, other: &DurationHistogram) {
        for b in 0..BUCKETS {
            self.counts[b] += other.counts[b];
            self.sums_ns[b] = self.sums_ns[b].saturating_add(other.sums_ns[b]);
        }
    }

    /// Bucket `b`'s (count, sum ns); (0, 0) past the last.
    pub fn bucket(&self, b: usize) -> (u64, u64) {
        match (self.counts.get(b), self.sums_ns.get(b)) {
            (Some(&c), Some(&s)) => (c, s),
            _ => (0, 0),
        }
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn sum_ns(&self) -> u64 {
        self.sums_ns.iter().fold(0u64, |a, &s| a.saturating_add(s))
    }

    /// Non-empty buckets as (upper bound ns, count, sum ns), in order.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        (0..BUCKETS)
            .filter(|&b| self.counts[b] > 0)
            .map(|b| (bucket_upper_ns(b), self.counts[b], self.sums_ns[b]))
    }

    /// The upper bound of the bucket holding quantile `q` (0..=1), ns; 0 if empty.
    pub fn quantile_upper_ns(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let target = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for b in 0..BUCKETS {
            seen += self.counts[b];
            if seen >= target {
                return bucket_upper_ns(b);
            }
        }
        bucket_upper_ns(BUCKETS - 1)
    }

    /// What a polling window of `window_ns` (a bucket bound, or 0) would have done over
    /// these halts: those it catches, and the CPU it spins. Halts in buckets below the
    /// window count as caught; for the rest, the window is spent in full.
    pub fn price(&self, window_ns: u64) -> PollPrice {
        let (mut caught, mut spin) = (0u64, 0u64);
        for b in 0..BUCKETS {
            if self.counts[b] == 0 {
                continue;
            }
            if bucket_upper_ns(b) <= window_ns {
                caught += self.counts[b];
                spin = spin.saturating_add(self.sums_ns[b]);
            } else {
                spin = spin.saturating_add(self.counts[b].saturating_mul(window_ns));
            }
        }
        PollPrice {
            window_ns,
            halts: self.count(),
            caught,
            spin_ns: spin,
        }
    }
}

/// The outcome of one polling window over a recorded set of halts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollPrice {
    pub window_ns: u64,
    pub halts: u64,
    /// Halts shorter than the window: the wakeup found the vCPU still polling.
    pub caught: u64,
    /// CPU time spent polling.
    pub spin_ns: u64,
}

impl PollPrice {
    /// Fraction of halts caught, 0..=1 (0 with no halts).
    pub fn hit_rate(&self) -> f64 {
        if self.halts == 0 {
            0.0
        } else {
            self.caught as f64 / self.halts as f64
        }
    }

    /// CPU spent polling as a share of one core over `elapsed_ns`.
    pub fn cpu_share(&self, elapsed_ns: u64) -> f64 {
        if elapsed_ns == 0 {
            0.0
        } else {
            self.spin_ns as f64 / elapsed_ns as f64
        }
    }
}

/// The advisor: the polling window that catches the most halts while spinning at most
/// `budget_permille` of a core over `elapsed_ns` (the time the halts were recorded over),
/// and, among windows catching as many, the shortest (so that all-long halts get no
/// polling at all). Candidates are 0 and the bucket bounds up to `max_window_ns`.
pub fn advise(
    halts: &DurationHistogram,
    elapsed_ns: u64,
    budget_permille: u32,
    max_window_ns: u64,
) -> PollPrice {
    let budget_ns = (u128::from(elapsed_ns) * u128::from(budget_permille) / 1000) as u64;
    let mut best = halts.price(0);
    for b in 0..BUCKETS - 1 {
        let w = bucket_upper_ns(b);
        if w > max_window_ns {
            break;
        }
        let p = halts.price(w);
        if p.spin_ns <= budget_ns && p.caught > best.caught {
            best = p;
        }
    }
    best
}

/// The window the guest's idle hints summarise: wake → running latencies of the last
/// second or so. A window closes once it is this long and holds `HINT_MIN_WAKES`
/// wakeups, or once it is `HINT_MAX_WINDOWS` times this long with any, so that a
/// vCPU that rarely halts still gets a hint and a busy one gets a fresh one each second.
pub const HINT_WINDOW_NS: u64 = 1_000_000_000;
pub const HINT_MIN_WAKES: u64 = 20;
pub const HINT_MAX_WINDOWS: u64 = 10;

/// What the host tells a guest idle driver about waking this vCPU (ABI minor 1,
/// `F_IDLE_HINTS`): the wake → running latency of the last closed window; 0 = none yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WakeHint {
    pub p50_ns: u32,
    pub p99_ns: u32,
}

/// Per vCPU: the two distributions, recorded from the thread's blocks, wakeups and
/// switch-ins, and the hint of the latest window of wakeups.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdleMeter {
    pub halt_to_wake: DurationHistogram,
    pub wake_to_run: DurationHistogram,
    /// Halts KVM's halt polling caught (the thread never blocked), of those in
    /// `halt_to_wake`; 0 where KVM does not report halts (TCG).
    pub polled: u64,
    /// KVM reports this vCPU's halts (`kvm_vcpu_wakeup`): they, not the thread's
    /// blocks and wakeups, give the halt lengths.
    kvm_halts: bool,
    halted_at: Option<u64>,
    woken_at: Option<u64>,
    since: Option<u64>,
    window: DurationHistogram,
    window_start: Option<u64>,
    hint: WakeHint,
}

impl IdleMeter {
    /// The wake → running latency of the latest closed window.
    pub fn hint(&self) -> WakeHint {
        self.hint
    }

    /// When the first event was measured (the start of the observation), if any.
    pub fn since(&self) -> Option<u64> {
        self.since
    }

    /// The thread blocked (the guest halted) at `now`.
    pub fn blocked(&mut self, now: u64) {
        self.since.get_or_insert(now);
        self.halted_at = Some(now);
        self.woken_at = None;
    }

    /// The thread is being woken at `now`.
    pub fn woken(&mut self, now: u64) {
        self.since.get_or_insert(now);
        if let Some(h) = self.halted_at.take() {
            if !self.kvm_halts {
                self.halt_to_wake.record(now.saturating_sub(h));
            }
            self.woken_at = Some(now);
        }
    }

    /// KVM reports a halt of `halt_ns` ending by `now`. Under KVM a halt starts with
    /// halt polling: the thread blocks only after it, and a wakeup during it is never
    /// seen by the scheduler. So once KVM reports halts, they give the halt lengths
    /// (every halt, from the guest's HLT) and the thread's block -> wake spans do not
    /// (but for the one halt that ends before KVM's first report, counted twice).
    pub fn kvm_halt(&mut self, now: u64, halt_ns: u64, polled: bool) {
        self.since.get_or_insert(now.saturating_sub(halt_ns));
        self.kvm_halts = true;
        self.halt_to_wake.record(halt_ns);
        if polled {
            self.polled += 1;
        }
    }

    /// The thread was switched in at `now`.
    pub fn running(&mut self, now: u64) {
        self.since.get_or_insert(now);
        if let Some(w) = self.woken_at.take() {
            let d = now.saturating_sub(w);
            self.wake_to_run.record(d);
            self.window.record(d);
            self.close_window(now);
        }
        self.halted_at = None;
    }

    fn close_window(&mut self, now: u64) {
        let start = *self.window_start.get_or_insert(now);
        let age = now.saturating_sub(start);
        let n = self.window.count();
        let full = age >= HINT_WINDOW_NS && n >= HINT_MIN_WAKES;
        if !full && age < HINT_WINDOW_NS * HINT_MAX_WINDOWS {
            return;
        }
        let q = |q| u32::try_from(self.window.quantile_upper_ns(q)).unwrap_or(u32::MAX);
        self.hint = WakeHint {
            p50_ns: q(0.5),
            p99_ns: q(0.99),
        };
        self.window = DurationHistogram::default();
        self.window_start = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;
    const S: u64 = 1_000_000_000;

    fn of(durations: impl IntoIterator<Item = u64>) -> DurationHistogram {
        let mut h = DurationHistogram::default();
        for d in durations {
            h.record(d);
        }
        h
    }

    #[test]
    fn buckets_are_ordered_and_contain_their_values() {
        let mut last = 0;
        for b in 0..BUCKETS {
            let up = bucket_upper_ns(b);
            assert!(up > last, "bucket {b}");
            last = up;
        }
        for ns in [
            0,
            999,
            1_000,
            1_249,
            1_250,
            3_000,
            99_999,
            160_000,
            1_000_000_000,
        ] {
            let b = bucket_of(ns);
            assert!(ns < bucket_upper_ns(b), "{ns} in {b}");
            assert!(b == 0 || ns >= bucket_upper_ns(b - 1), "{ns} in {b}");
        }
    }

    #[test]
    fn all_short_halts_are_caught_by_a_window_just_long_enough_within_budget() {
        // 10 000 halts of 20 us in 1 s: catching them all spins 200 ms (20 % of a core).
        let h = of(std::iter::repeat_n(20 * US, 10_000));

        let a = advise(&h, S, 250, 500 * US);

        assert_eq!(a.caught, 10_000);
        assert!(a.window_ns > 20 * US && a.window_ns <= 25 * US, "{a:?}");
        assert!(a.cpu_share(S) <= 0.25);
        assert!((a.hit_rate() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn all_long_halts_get_no_polling() {
        let h = of(std::iter::repeat_n(5_000 * US, 100));

        let a = advise(&h, S, 50, 500 * US);

        assert_eq!((a.window_ns, a.caught, a.spin_ns), (0, 0, 0));
    }

    #[test]
    fn with_bimodal_halts_the_budget_decides() {
        // 1 000 short (10 us) and 1 000 long (2 ms) halts over 1 s.
        let h =
            of(std::iter::repeat_n(10 * US, 1_000).chain(std::iter::repeat_n(2_000 * US, 1_000)));

        // Catching the short ones with a ~12 us window spins 10 ms + 1 000 x 12.x us ~ 22 ms.
        let generous = advise(&h, S, 50, 500 * US);
        // 1 % of a core cannot pay for it: no polling.
        let tight = advise(&h, S, 10, 500 * US);

        assert_eq!(generous.caught, 1_000);
        assert!(generous.window_ns < 2_000 * US);
        assert!(generous.cpu_share(S) <= 0.05);
        assert_eq!(tight.caught, 0);
        assert_eq!(tight.window_ns, 0);
    }

    #[test]
    fn a_window_in_force_is_priced_the_same_way() {
        let h = of([5 * US, 50 * US, 500 * US]);

        let p = h.price(bucket_upper_ns(bucket_of(50 * US)));

        assert_eq!((p.halts, p.caught), (3, 2));
        assert_eq!(p.spin_ns, 55 * US + p.window_ns);
    }

    /// Halt at `t`, wake 10 us later, run `wake` ns after that; returns the next `t`.
    fn halt_wake_run(m: &mut IdleMeter, t: u64, wake: u64) -> u64 {
        m.blocked(t);
        m.woken(t + 10 * US);
        m.running(t + 10 * US + wake);
        t + 100 * US
    }

    #[test]
    fn the_hint_is_the_last_full_window_of_wakeups() {
        let mut m = IdleMeter::default();
        let mut t = 0;
        // 0.5 s of 20 us wakeups: the window is not a second old, no hint yet.
        while t < S / 2 {
            t = halt_wake_run(&mut m, t, 20 * US);
        }
        assert_eq!(m.hint(), WakeHint::default());
        // Past 1 s: the first window closes with every wakeup at 20 us.
        while t < S + S / 10 {
            t = halt_wake_run(&mut m, t, 20 * US);
        }
        let first = m.hint();
        assert_eq!(first.p50_ns, first.p99_ns);
        assert!(first.p50_ns > 20_000 && first.p50_ns <= 25_000, "{first:?}");
        // Then a second of 200 us wakeups replaces it.
        let until = t + S + S / 10;
        while t < until {
            t = halt_wake_run(&mut m, t, 200 * US);
        }
        let second = m.hint();
        assert!(
            second.p50_ns > 200_000 && second.p50_ns <= 250_000,
            "{second:?}"
        );
    }

    #[test]
    fn a_rarely_halting_vcpu_gets_a_hint_from_few_wakeups() {
        let mut m = IdleMeter::default();
        // Three wakeups of 50 us, 4 s apart: below HINT_MIN_WAKES, but old enough.
        for i in 0..4 {
            halt_wake_run(&mut m, i * 4 * S, 50 * US);
        }
        assert!(m.hint().p99_ns > 50_000, "{:?}", m.hint());
    }

    #[test]
    fn the_meter_measures_halt_to_wake_and_wake_to_running() {
        let mut m = IdleMeter::default();
        m.blocked(1_000);
        m.woken(31_000);
        m.running(36_000);
        // A preemption is not a halt: a switch-in without a wakeup records nothing.
        m.running(50_000);
        m.woken(60_000);

        assert_eq!(m.halt_to_wake.count(), 1);
        assert_eq!(m.halt_to_wake.sum_ns(), 30_000);
        assert_eq!(m.wake_to_run.count(), 1);
        assert_eq!(m.wake_to_run.sum_ns(), 5_000);
    }

    #[test]
    fn under_kvm_its_halt_reports_give_every_halt_polled_ones_included() {
        let mut m = IdleMeter::default();
        // A halt KVM's polling caught: no block, no wakeup; only KVM's report.
        m.kvm_halt(100_000, 40_000, true);
        // A halt that blocked after polling: the thread's block -> wake span (30 µs)
        // misses the polling before it; KVM's report (230 µs) does not.
        m.blocked(200_000);
        m.woken(230_000);
        m.running(235_000);
        m.kvm_halt(236_000, 230_000, false);

        assert_eq!(m.halt_to_wake.count(), 2);
        assert_eq!(m.halt_to_wake.sum_ns(), 270_000);
        assert_eq!(m.polled, 1);
        assert_eq!(m.wake_to_run.sum_ns(), 5_000);
        assert_eq!(m.since(), Some(60_000));
    }
}
