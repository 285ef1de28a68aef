//! The kvm module's halt-polling parameters (`/sys/module/kvm/parameters`):
//! the one place that reads and writes them.

use std::io;
use std::path::Path;

/// Where the kvm module keeps them.
pub const DEFAULT_DIR: &str = "/sys/module/kvm/parameters";

/// `halt_poll_ns`, `halt_poll_ns_grow`, `halt_poll_ns_grow_start`,
/// `halt_poll_ns_shrink`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HaltPoll {
    pub halt_poll_ns: u64,
    pub grow: u64,
    pub grow_start_ns: u64,
    pub shrink: u64,
}

/// Reads them; `Ok(None)` when the kvm module is not loaded.
pub fn read_halt_poll() -> io::Result<Option<HaltPoll>> {
    read_halt_poll_from(Path::new(DEFAULT_DIR))
}

/// Reads them from `dir` (the module's parameter directory); `Ok(None)` when
/// it does not exist.
pub fn read_halt_poll_from(dir: &Path) -> io::Result<Option<HaltPoll>> {
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

/// Writes all four (root: the files are 0644 root). `Err(NotFound)` when the kvm
/// module is not loaded.
pub fn write_halt_poll(p: &HaltPoll) -> io::Result<()> {
    write_halt_poll_to(Path::new(DEFAULT_DIR), p)
}

/// Writes them into `dir`. Some hosts export them read-only (mode 0444):
/// the error then names the file and says so.
pub fn write_halt_poll_to(dir: &Path, p: &HaltPoll) -> io::Result<()> {
    if !dir.exists() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: the kvm module is not loaded", dir.display()),
        ));
    }
    // KVM reads them at each halt and clamps the adaptive window to the cap,
    // so the order of the writes does not matter.
    let fields = [
        ("halt_poll_ns", p.halt_poll_ns),
        ("halt_poll_ns_grow", p.grow),
        ("halt_poll_ns_shrink", p.shrink),
        ("halt_poll_ns_grow_start", p.grow_start_ns),
    ];
    let write = |name: &str, v: u64| -> io::Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, format!("{v}\n")).map_err(|e| {
            let hint = match e.kind() {
                io::ErrorKind::PermissionDenied => {
                    " (the kernel exports it read-only, or this is not root)"
                }
                _ => "",
            };
            let at = path.display();
            io::Error::new(e.kind(), format!("writing {v} to {at}: {e}{hint}"))
        })
    };
    for (n, v) in fields {
        write(n, v)?;
    }
    Ok(())
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

    #[test]
    fn written_parameters_read_back_and_a_missing_module_is_an_error() {
        let dir = std::env::temp_dir().join(format!("pvsched-kvm-write-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = HaltPoll {
            halt_poll_ns: 160_000,
            grow: 2,
            grow_start_ns: 10_000,
            shrink: 2,
        };

        write_halt_poll_to(&dir, &p).unwrap();

        assert_eq!(read_halt_poll_from(&dir).unwrap(), Some(p));
        let e = write_halt_poll_to(&dir.join("absent"), &p).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
