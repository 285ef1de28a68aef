//! A minimal writer of the `newc` cpio format the kernel unpacks as an
//! initramfs: directories, regular files and symlinks, owned by root,
//! timestamps zero (so the same inputs give the same bytes).

use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Entry {
    Dir,
    File { data: Vec<u8>, mode: u32 },
    Symlink { target: String },
}

/// Files of an initramfs, by absolute guest path.
#[derive(Clone, Debug, Default)]
pub struct Archive {
    entries: BTreeMap<String, Entry>,
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;

fn normalize(path: &str) -> String {
    let trimmed = path.trim_matches('/');
    trimmed.to_string()
}

impl Archive {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `path` and its parents as directories.
    pub fn dir(&mut self, path: &str) {
        let path = normalize(path);
        let mut cur = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if !cur.is_empty() {
                cur.push('/');
            }
            cur.push_str(part);
            self.entries.entry(cur.clone()).or_insert(Entry::Dir);
        }
    }

    fn parent(&mut self, path: &str) {
        if let Some((dir, _)) = path.rsplit_once('/') {
            self.dir(dir);
        }
    }

    /// Adds a regular file (replacing an earlier entry at `path`).
    pub fn file(&mut self, path: &str, data: Vec<u8>, mode: u32) {
        let path = normalize(path);
        self.parent(&path);
        self.entries.insert(path, Entry::File { data, mode });
    }

    /// Adds a symlink, unless something is at `path` already.
    pub fn symlink(&mut self, path: &str, target: &str) {
        let path = normalize(path);
        self.parent(&path);
        self.entries.entry(path).or_insert(Entry::Symlink {
            target: target.to_string(),
        });
    }

    pub fn contains(&self, path: &str) -> bool {
        self.entries.contains_key(&normalize(path))
    }

    /// The archive as bytes (uncompressed newc, trailer included).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (ino, (name, entry)) in (1u32..).zip(self.entries.iter()) {
            let (mode, data): (u32, &[u8]) = match entry {
                Entry::Dir => (S_IFDIR | 0o755, &[]),
                Entry::File { data, mode } => (S_IFREG | (mode & 0o7777), data),
                Entry::Symlink { target } => (S_IFLNK | 0o777, target.as_bytes()),
            };
            let nlink = if matches!(entry, Entry::Dir) { 2 } else { 1 };
            write_entry(&mut out, ino, mode, nlink, name, data);
        }
        write_entry(&mut out, 0, 0, 1, "TRAILER!!!", &[]);
        out
    }
}

fn pad4(out: &mut Vec<u8>) {
    while out.len() % 4 != 0 {
        out.push(0);
    }
}

fn write_entry(out: &mut Vec<u8>, ino: u32, mode: u32, nlink: u32, name: &str, data: &[u8]) {
    let fields = [
        ino,
        mode,
        0, // uid
        0, // gid
        nlink,
        0, // mtime
        data.len() as u32,
        0, // devmajor
        0, // devminor
        0, // rdevmajor
        0, // rdevminor
        name.len() as u32 + 1,
        0, // check
    ];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08x}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    pad4(out);
    out.extend_from_slice(data);
    pad4(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_layout() {
        let mut a = Archive::new();
        a.file("/bin/x", b"abc".to_vec(), 0o755);
        a.symlink("/bin/y", "x");
        let bytes = a.to_bytes();
        // "bin" dir first (sorted), then bin/x, bin/y, trailer.
        assert_eq!(&bytes[..6], b"070701");
        assert_eq!(bytes.len() % 4, 0);
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("bin/x\0"));
        assert!(text.contains("TRAILER!!!\0"));
        // Mode of bin/x: regular, 0755.
        let at = text.find("bin/x\0").unwrap();
        let header = &text[at - 110..at];
        assert_eq!(&header[14..22], "000081ed");
        assert_eq!(&header[54..62], "00000003");
    }

    #[test]
    fn parents_are_added_and_symlink_does_not_replace() {
        let mut a = Archive::new();
        a.file("/a/b/c", vec![], 0o644);
        a.symlink("/a/b/c", "elsewhere");
        assert!(a.contains("/a"));
        assert!(a.contains("a/b"));
        assert_eq!(
            a.entries.get("a/b/c"),
            Some(&Entry::File {
                data: vec![],
                mode: 0o644
            })
        );
    }
}
