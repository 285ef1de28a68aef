//! Reading small /proc files on paths that run every round.
//!
//! A /proc file reports size 0, so `std::fs::read_to_string` sizes its
//! buffer by probing: a 32-byte read, then doubling, eight reads for a 1.4
//! KiB `/proc/<pid>/status`, after an `fstat` for the size hint. Here the buffer
//! starts at a page, which holds every file read this way: an open, one read
//! and the read that finds the end. Each syscall counts on an emulated host,
//! where pvschedd's discovery round read a few such files every second.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// A page: more than any /proc file read through [`read_to_string`].
const INITIAL_CAPACITY: usize = 4096;

/// The whole of the file at `path` (a longer one is read whole too).
pub fn read_to_string(path: impl AsRef<Path>) -> io::Result<String> {
    let mut text = String::with_capacity(INITIAL_CAPACITY);
    File::open(path)?.read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_proc_file_whole() {
        let status = read_to_string("/proc/self/status").unwrap();
        assert!(status.starts_with("Name:"), "{status}");
        assert!(status.contains("\nTgid:"), "{status}");
        assert!(status.ends_with('\n'), "{status}");
    }

    #[test]
    fn reads_a_file_longer_than_its_first_buffer_whole() {
        let dir = std::env::temp_dir().join(format!("pvsched-procfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("long");
        let text: String = (0..3 * INITIAL_CAPACITY)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        std::fs::write(&path, &text).unwrap();
        assert_eq!(read_to_string(&path).unwrap(), text);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_file_is_not_found() {
        let e = read_to_string("/proc/0/status").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
