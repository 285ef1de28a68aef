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
use std::os::unix::fs::FileExt;
use std::path::Path;

/// A page: more than any /proc file read through [`read_to_string`].
const INITIAL_CAPACITY: usize = 4096;

/// The whole of the file at `path` (a longer one is read whole too).
pub fn read_to_string(path: impl AsRef<Path>) -> io::Result<String> {
    let mut text = String::with_capacity(INITIAL_CAPACITY);
    File::open(path)?.read_to_string(&mut text)?;
    Ok(text)
}

/// A /proc file kept open and read again from its start: one `pread` a
/// read instead of an open, two reads and a close. A /proc file of a
/// process keeps naming the process it was opened for: once that process
/// is gone (its pid possibly reused), a read fails with `ESRCH`.
#[derive(Debug)]
pub struct ProcFile {
    file: File,
}

impl ProcFile {
    pub fn open(path: impl AsRef<Path>) -> io::Result<Self> {
        Ok(Self {
            file: File::open(path)?,
        })
    }

    /// The file's text now, into `text` (cleared first). For the files
    /// this is used on, generated as one record at offset 0 (a process's
    /// `status` or `stat`, `/proc/pressure/*`), a read that does not fill
    /// the buffer has it all; a longer one is read on. (A file of many
    /// records, like `maps`, may return less than the buffer before its
    /// end: not for this.)
    pub fn read_into(&self, text: &mut String) -> io::Result<()> {
        let mut buf = std::mem::take(text).into_bytes();
        buf.clear();
        buf.resize(INITIAL_CAPACITY, 0);
        let mut len = 0;
        loop {
            let n = self.file.read_at(&mut buf[len..], len as u64)?;
            len += n;
            if n == 0 || len < buf.len() {
                break;
            }
            buf.resize(buf.len() * 2, 0);
        }
        buf.truncate(len);
        *text =
            String::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(())
    }
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

    /// A file of three buffers' length in a directory of its own (removed
    /// by the caller), and its text.
    fn long_file(name: &str) -> (std::path::PathBuf, std::path::PathBuf, String) {
        let dir = std::env::temp_dir().join(format!("pvsched-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("long");
        let text: String = (0..3 * INITIAL_CAPACITY)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        std::fs::write(&path, &text).unwrap();
        (dir, path, text)
    }

    #[test]
    fn reads_a_file_longer_than_its_first_buffer_whole() {
        let (dir, path, text) = long_file("procfs");
        assert_eq!(read_to_string(&path).unwrap(), text);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_kept_proc_file_reads_the_state_of_now_each_time() {
        let stat = ProcFile::open("/proc/self/stat").unwrap();
        let (mut before, mut after) = (String::new(), String::new());
        stat.read_into(&mut before).unwrap();
        // Field 10 (minflt) grows as this process touches new pages.
        let minflt = |t: &str| -> u64 {
            t[t.rfind(')').unwrap() + 1..]
                .split_whitespace()
                .nth(7)
                .unwrap()
                .parse()
                .unwrap()
        };
        let touched = vec![1u8; 64 << 20];
        stat.read_into(&mut after).unwrap();
        assert!(touched.iter().all(|b| *b == 1));
        assert!(minflt(&after) > minflt(&before), "{before}\n{after}");
        assert!(after.ends_with('\n'), "{after}");
    }

    #[test]
    fn a_kept_proc_file_of_an_ended_process_fails_to_read() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let status = ProcFile::open(format!("/proc/{}/status", child.id())).unwrap();
        let mut text = String::new();
        status.read_into(&mut text).unwrap();
        // (Its name may still be the test's: spawn can return before exec.)
        assert!(
            text.contains(&format!("\nPid:\t{}\n", child.id())),
            "{text}"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        let e = status.read_into(&mut text).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}");
    }

    #[test]
    fn a_kept_file_longer_than_its_first_buffer_is_read_whole() {
        let (dir, path, text) = long_file("procfile");
        let mut read = String::new();
        ProcFile::open(&path).unwrap().read_into(&mut read).unwrap();
        assert_eq!(read, text);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_file_is_not_found() {
        let e = read_to_string("/proc/0/status").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
