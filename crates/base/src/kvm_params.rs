//! The kvm module's halt-polling parameters (`/sys/module/kvm/parameters`):
//! the one place that reads them (and, later, writes them).

use std::io;
use std::path::Path;

const DIR: &str = "/sys/module/kvm/parameters";

/// `halt_poll_ns`, `halt_poll_ns_grow`, `halt_poll_ns_grow_start`,
/// `halt_poll_ns_shrink`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HaltPoll {
    pub halt_poll_ns: u64,
    pub grow: u64,
    pub grow_start_ns: u64,
    pub shrink: u64,
}

/// Reads them; `Ok(None)` when the kvm module is not loaded.
pub fn read_halt_poll() -> io::Result<Option<HaltPoll>> {
    read_halt_poll_from(Path::new(DIR))
}

fn read_halt_poll_from(dir: &Path) -> io::Result<Option<HaltPoll>> {
    if !dir.exists() {
        return Ok(None);
    }
    let read = |name: &str| -> io::Result<u64> {
        let path = dir.join(name);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        text.trim().parse().map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {text:?}: {e}", path.display()),
            )
        })
    };
    Ok(Some(HaltPoll {
        halt_poll_ns: read("halt_poll_ns")?,
        grow: read("halt_poll_ns_grow")?,
        grow_start_ns: read("halt_poll_ns_grow_start")?,
        shrink: read("halt_poll_ns_shrink")?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_read_and_a_bad_one_is_named() {
        let dir = std::env::temp_dir().join(format!("pvsched-kvm-params-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (n, v) in [
            ("halt_poll_ns", "200000\n"),
            ("halt_poll_ns_grow", "2\n"),
            ("halt_poll_ns_grow_start", "10000\n"),
            ("halt_poll_ns_shrink", "0\n"),
        ] {
            std::fs::write(dir.join(n), v).unwrap();
        }

        let p = read_halt_poll_from(&dir).unwrap().unwrap();
        assert_eq!(
            p,
            HaltPoll {
                halt_poll_ns: 200_000,
                grow: 2,
                grow_start_ns: 10_000,
                shrink: 0
            }
        );

        std::fs::write(dir.join("halt_poll_ns_grow"), "two\n").unwrap();
        let e = read_halt_poll_from(&dir).unwrap_err().to_string();
        assert!(e.contains("halt_poll_ns_grow"), "{e}");

        assert!(read_halt_poll_from(&dir.join("absent")).unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
