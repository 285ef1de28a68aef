//! Clocks, in nanoseconds.

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one timespec into a valid, owned struct.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_MONOTONIC in ns: the clock of `bpf_ktime_get_ns()`, so a BPF
/// record's timestamp and this can be subtracted.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CPU time the calling thread has used, in ns.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_never_goes_back() {
        let a = monotonic_ns();
        let b = monotonic_ns();

        assert!(a > 0 && b >= a);
    }

    #[test]
    fn thread_cpu_time_grows_while_the_thread_works() {
        let before = thread_cpu_ns();
        let mut x = 0u64;
        while thread_cpu_ns() - before < 1_000_000 {
            x = std::hint::black_box(x.wrapping_add(1));
        }

        assert!(thread_cpu_ns() - before >= 1_000_000);
    }
}
