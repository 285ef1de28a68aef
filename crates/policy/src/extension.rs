//! How much slice-end extension time a vCPU may take on the sched_ext
//! backend. The scheduler grants an extension itself, at the slice end,
//! when the guest's slot shows a critical section, but only while its own
//! running total stays within the allowance the daemon last wrote; the
//! daemon raises that allowance from this rule at every scan. A guest that
//! claims a critical section all the time gets at most `share_permille` of
//! its vCPU's time, plus a burst, as extensions.

/// pvschedd's default scan interval on the sched_ext backend
/// (`daemon.scx_scan_interval_us`): each scan charges what the scheduler spent and
/// renews its allowances.
pub const DEFAULT_SCX_SCAN_INTERVAL_NS: u64 = 200_000_000;

/// The default share of a vCPU's time its extensions may take, permille, plus the
/// burst of [`extension_burst_ns`] (`daemon.scx_extension_share_permille`).
pub const DEFAULT_SCX_EXTENSION_SHARE_PERMILLE: u32 = 50;

/// The burst an allowance may stand above what is used: two extensions, and
/// the share of one scan interval. The allowance is raised only at a scan,
/// so without the interval's share a vCPU would get no more than the burst
/// per scan: with a 200 ms scan and a 4 ms extension, a holder allowed half
/// its time would get 8 ms of every 200.
pub fn extension_burst_ns(extension_ns: u64, share_permille: u64, scan_interval_ns: u64) -> u64 {
    extension_ns
        .saturating_mul(2)
        .saturating_add(scan_interval_ns.saturating_mul(share_permille) / 1000)
}

/// One vCPU's extension allowance: a token bucket over the scheduler's
/// running total of extension time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtensionAllowance {
    /// The allowance last handed out (a total, comparable with `used`).
    allowed_ns: u64,
    /// When it was (0: never).
    at_ns: u64,
}

impl ExtensionAllowance {
    /// The allowance at `now`, given `used_ns` (the scheduler's total so
    /// far): the last one grown by `share_permille` of the time since, and
    /// never more than `burst_ns` above what is used (time not used for
    /// extensions is not saved up beyond the burst).
    pub fn next(&mut self, now: u64, used_ns: u64, share_permille: u64, burst_ns: u64) -> u64 {
        let grown = if self.at_ns == 0 {
            burst_ns
        } else {
            let elapsed = now.saturating_sub(self.at_ns);
            self.allowed_ns
                .saturating_add(elapsed.saturating_mul(share_permille) / 1000)
        };
        self.allowed_ns = grown.min(used_ns.saturating_add(burst_ns));
        self.at_ns = now;
        self.allowed_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn starts_with_the_burst() {
        let mut a = ExtensionAllowance::default();
        assert_eq!(a.next(1_000, 0, 50, 8_000_000), 8_000_000);
    }

    #[test]
    fn idle_time_is_not_saved_beyond_the_burst() {
        let mut a = ExtensionAllowance::default();
        a.next(1, 0, 50, 8_000_000);
        // Ten seconds without an extension: still only the burst.
        assert_eq!(a.next(10_000_000_001, 0, 50, 8_000_000), 8_000_000);
    }

    #[test]
    fn the_burst_covers_a_scan_intervals_share() {
        // 4 ms extensions, half the time, a 200 ms scan: 8 ms + 100 ms.
        assert_eq!(extension_burst_ns(4_000_000, 500, 200_000_000), 108_000_000);
        assert_eq!(extension_burst_ns(4_000_000, 0, 200_000_000), 8_000_000);
    }

    #[test]
    fn a_greedy_holder_gets_its_share_however_long_the_scan() {
        // The scheduler's rule at every extension: used + ext <= allowed. A
        // holder asking all the time, over 10 s, at a 50 ms and a 200 ms scan.
        for interval in [50_000_000u64, 200_000_000] {
            let (ext, share) = (4_000_000u64, 500u64);
            let burst = extension_burst_ns(ext, share, interval);
            let mut a = ExtensionAllowance::default();
            let mut used = 0u64;
            let mut now = 1u64;
            while now < 10_000_000_000 {
                let allowed = a.next(now, used, share, burst);
                while used + ext <= allowed {
                    used += ext;
                }
                now += interval;
            }
            // At least its share less one scan's worth, at most share + burst.
            assert!(used >= 5_000_000_000 - interval, "{interval}: {used}");
            assert!(used <= 5_000_000_000 + burst, "{interval}: {used}");
        }
    }

    proptest! {
        /// A vCPU that takes every extension it is allowed (the scheduler's
        /// rule: used + extension <= allowed) ends with at most its share of
        /// the elapsed time plus the burst.
        #[test]
        fn a_greedy_vcpu_gets_its_share_and_the_burst(
            steps in proptest::collection::vec(1u64..50_000_000, 1..200),
            share in 0u64..=1000,
        ) {
            let (ext, burst) = (4_000_000u64, 8_000_000u64);
            let mut a = ExtensionAllowance::default();
            let (mut now, mut used) = (1u64, 0u64);
            a.next(now, used, share, burst);
            let start = now;
            for dt in steps {
                now += dt;
                let allowed = a.next(now, used, share, burst);
                while used + ext <= allowed {
                    used += ext;
                }
                prop_assert!(used <= burst + (now - start) * share / 1000 + ext);
            }
        }
    }
}
