//! The guest module's debugfs status (`/sys/kernel/debug/pvsched/status`),
//! read by the tests: one line per CPU, `cpu<N> key=value ...`.

/// The status file's path in the guest.
pub const GUEST_STATUS_PATH: &str = "/sys/kernel/debug/pvsched/status";

/// Field `key` of CPU `cpu`'s line of `status`; None when the line or the
/// field is missing or not a number.
pub fn status_field(status: &str, cpu: u32, key: &str) -> Option<u64> {
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("cpu{cpu} ")))?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpus_field_is_found_on_its_own_line_only() {
        let status = "device=0000:00:03.0 abi=1.6\ncpu0 held_takes=7 held=0\ncpu1 held_takes=9\n";

        assert_eq!(status_field(status, 0, "held_takes"), Some(7));
        assert_eq!(status_field(status, 1, "held_takes"), Some(9));
        assert_eq!(status_field(status, 1, "held"), None);
        assert_eq!(status_field(status, 2, "held_takes"), None);
    }
}
