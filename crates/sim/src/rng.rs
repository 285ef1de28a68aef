//! The simulator's one source of randomness: SplitMix64, seeded per run, so the same seed
//! gives the same run on every machine and every build (no dependency whose stream may
//! change between versions).

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponentially distributed with mean `mean` (ns), at least 1.
    pub fn exp(&mut self, mean: u64) -> u64 {
        let u = 1.0 - self.unit();
        ((-u.ln()) * mean as f64).max(1.0) as u64
    }

    /// An independent stream for a component (so adding one does not shift the others).
    pub fn fork(&mut self, salt: u64) -> Rng {
        Rng(self.next_u64() ^ salt.wrapping_mul(0xd6e8_feb8_6659_fd93))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_bounds_hold() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..1000 {
            let x = a.below(10);
            assert_eq!(x, b.below(10));
            assert!(x < 10);
            let u = a.unit();
            assert_eq!(u, b.unit());
            assert!((0.0..1.0).contains(&u));
        }
    }

    #[test]
    fn exp_has_roughly_its_mean() {
        let mut r = Rng::new(1);
        let n = 100_000;
        let sum: u64 = (0..n).map(|_| r.exp(1000)).sum();
        let mean = sum as f64 / n as f64;
        assert!((950.0..1050.0).contains(&mean), "{mean}");
    }
}
