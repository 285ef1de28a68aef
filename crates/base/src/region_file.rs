//! File-backed regions: the file QEMU maps with `memory-backend-file` and
//! exposes to the guest as ivshmem-plain BAR2.
//!
//! The file belongs to the VMM's user, who can replace, link, grow or
//! truncate it; the mapping is the daemon's. So a region file is mapped at
//! exactly [`bar_size`] of the VM's vCPU count, only if it is a regular
//! file with one link and that size, or a power of two up to
//! [`MAX_FILE_SIZE`] (libvirt sizes shared memory in MiB): never grown,
//! zeroed or mapped beyond [`bar_size`]; and the mapping is guarded
//! ([`crate::sigbus`]): if the owner truncates the file, the faulting access
//! reads zeros instead of killing the process, and [`RegionFile::truncated`]
//! says so.
//!
//! Here rather than in pvsched-abi, beside the SIGBUS guard it uses, so that
//! the ABI crate (and the pure policy and simulator on it) stay free of OS
//! glue.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use memmap2::{MmapOptions, MmapRaw};
use pvsched_abi::{bar_size, AbiError, Region, MAX_SLOTS};

use crate::sigbus::{Guard, SigbusError};

/// Largest region file accepted (only its first [`bar_size`] bytes are
/// mapped): libvirt's `<shmem>` sizes come in MiB, and no VMM needs more.
pub const MAX_FILE_SIZE: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum RegionFileError {
    #[error("{path}: {source}")]
    Abi { path: PathBuf, source: AbiError },
    #[error("{path}: {slot_count} slots: need 1..={max}")]
    BadSlotCount {
        path: PathBuf,
        slot_count: u32,
        max: u32,
    },
    #[error("{path}: {source}")]
    Guard { path: PathBuf, source: SigbusError },
    #[error("{path}: {links} hard links: refusing (it may be another file's name)")]
    HardLinks { path: PathBuf, links: u64 },
    #[error("{path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
    #[error("{path}: not a regular file")]
    NotRegular { path: PathBuf },
    #[error("{path}: truncated while mapped: the mapping now holds zero pages")]
    Truncated { path: PathBuf },
    #[error("{path}: mode {mode:o} is world-writable; refusing (chmod o-w)")]
    WorldWritable { path: PathBuf, mode: u32 },
    #[error("{path}: {len} bytes, want {want} for the VM's vCPUs (or a power of two above it, up to 64 MiB); refusing")]
    WrongSize { path: PathBuf, len: u64, want: u64 },
}

/// A shared region file mapped read-write, exactly [`bar_size`] bytes.
pub struct RegionFile {
    path: PathBuf,
    /// Kept open for [`RegionFile::check_intact`]'s `fstat`.
    file: File,
    /// The file's size when opened (>= the mapping's).
    file_len: u64,
    region: Region,
    // Field order is drop order: the range is unguarded before it is
    // unmapped.
    guard: Guard,
    // Keeps the mapping alive; `region` points into it.
    _map: MmapRaw,
}

impl std::fmt::Debug for RegionFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionFile")
            .field("path", &self.path)
            .field("len", &self.region.len())
            .finish()
    }
}

/// `O_NOFOLLOW`: a symlink planted under the region's name is not followed.
/// `O_NONBLOCK`: a FIFO under that name does not block the open (it is then
/// refused as not a regular file). `O_CLOEXEC`: no child inherits it.
const OPEN_FLAGS: i32 = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;

impl RegionFile {
    /// Creates `path` with `mode` and size [`bar_size`]`(slot_count)`, or
    /// opens it as [`RegionFile::open`] does if it exists; maps it. The slot
    /// count is checked before anything is created. The header is not
    /// written: see [`Region::init_header`].
    pub fn create(path: &Path, slot_count: u32, mode: u32) -> Result<Self, RegionFileError> {
        let want = checked_size(path, slot_count)?;
        let io_err = |op, source| RegionFileError::Io {
            path: path.to_path_buf(),
            op,
            source,
        };
        let created = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(OPEN_FLAGS)
            .open(path);
        let file = match created {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Self::open(path, slot_count);
            }
            Err(e) => return Err(io_err("create", e)),
        };
        // Ours, empty: only this file is ever grown.
        let made = file
            .set_len(want)
            .map_err(|e| io_err("resize", e))
            .and_then(|()| check_file(path, &file, want))
            .and_then(|len| Self::map(path, file, want, len));
        if made.is_err() {
            let _ = std::fs::remove_file(path);
        }
        made
    }

    /// Opens and maps an existing region file for `slot_count` vCPUs: it
    /// must be a regular file, not world-writable, with one link and
    /// [`bar_size`]`(slot_count)` bytes or a power of two above it up to
    /// [`MAX_FILE_SIZE`]; the first [`bar_size`] bytes are mapped. Its
    /// contents are not validated: see [`Region::validate`].
    pub fn open(path: &Path, slot_count: u32) -> Result<Self, RegionFileError> {
        let want = checked_size(path, slot_count)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(OPEN_FLAGS)
            .open(path)
            .map_err(|e| RegionFileError::Io {
                path: path.to_path_buf(),
                op: "open",
                source: e,
            })?;
        let len = check_file(path, &file, want)?;
        Self::map(path, file, want, len)
    }

    /// Maps a region handed over as an open file (the ivshmem server protocol
    /// passes its descriptor), for `slot_count` vCPUs, with the checks of
    /// [`RegionFile::open`] made on the file itself; `name` names it in
    /// errors.
    pub fn from_file(name: &Path, file: File, slot_count: u32) -> Result<Self, RegionFileError> {
        let want = checked_size(name, slot_count)?;
        let len = check_file(name, &file, want)?;
        Self::map(name, file, want, len)
    }

    /// Maps the first `want` bytes of `file` (checked to be `file_len` >=
    /// `want` long: if it shrinks later, the guard turns faults into zero
    /// pages).
    fn map(path: &Path, file: File, want: u64, file_len: u64) -> Result<Self, RegionFileError> {
        let io_err = |op, source| RegionFileError::Io {
            path: path.to_path_buf(),
            op,
            source,
        };
        // bar_size(MAX_SLOTS) is 2 MiB: it fits.
        let len = usize::try_from(want)
            .map_err(|_| io_err("mmap", io::Error::other("size does not fit in memory")))?;
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| io_err("mmap", e))?;
        let base = NonNull::new(map.as_mut_ptr())
            .ok_or_else(|| io_err("mmap", io::Error::other("null mapping")))?;
        // SAFETY: `map` is a shared read-write mapping of `len` bytes at
        // `base`, page aligned; it is dropped (unmapped) after the guard
        // (field order), and the region only ever accesses it through
        // atomics, so zero pages swapped in under it are fine.
        let guard =
            unsafe { Guard::register(base.as_ptr(), len) }.map_err(|e| RegionFileError::Guard {
                path: path.to_path_buf(),
                source: e,
            })?;
        // SAFETY: as above: the mapping lives as long as the returned struct,
        // which owns both.
        let region = unsafe { Region::from_raw(base, len) }.map_err(|e| RegionFileError::Abi {
            path: path.to_path_buf(),
            source: e,
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            file_len,
            region,
            guard,
            _map: map,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> usize {
        self.region.len()
    }

    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }

    pub fn region(&self) -> &Region {
        &self.region
    }

    pub fn region_mut(&mut self) -> &mut Region {
        &mut self.region
    }

    /// Whether an access found the file truncated under the mapping: the
    /// mapping then holds zero pages (no longer shared with the VM). No
    /// system call.
    pub fn truncated(&self) -> bool {
        self.guard.lost()
    }

    /// `fstat` of the open file: who owns it and with what mode, as opened
    /// (not as the path names it now).
    pub fn metadata(&self) -> io::Result<std::fs::Metadata> {
        self.file.metadata()
    }

    /// Whether no access has faulted past the file's end: not
    /// [`truncated`](Self::truncated). No system call.
    pub fn check_not_faulted(&self) -> Result<(), RegionFileError> {
        if self.truncated() {
            return Err(RegionFileError::Truncated {
                path: self.path.clone(),
            });
        }
        Ok(())
    }

    /// Whether the mapping still is the file, at its size:
    /// [`check_not_faulted`](Self::check_not_faulted), and `fstat` still
    /// finds the size it was mapped at (a truncation no access has hit
    /// yet). One system call.
    pub fn check_intact(&self) -> Result<(), RegionFileError> {
        self.check_not_faulted()?;
        let len = self
            .file
            .metadata()
            .map_err(|e| RegionFileError::Io {
                path: self.path.clone(),
                op: "stat",
                source: e,
            })?
            .len();
        let want = self.file_len;
        if len != want {
            return Err(RegionFileError::WrongSize {
                path: self.path.clone(),
                len,
                want,
            });
        }
        Ok(())
    }
}

/// [`bar_size`]`(slot_count)`, for a slot count the ABI allows.
fn checked_size(path: &Path, slot_count: u32) -> Result<u64, RegionFileError> {
    if slot_count == 0 || slot_count > MAX_SLOTS {
        return Err(RegionFileError::BadSlotCount {
            path: path.to_path_buf(),
            slot_count,
            max: MAX_SLOTS,
        });
    }
    Ok(bar_size(slot_count))
}

/// Refuses what must not be mapped: not a regular file, world-writable,
/// another name of some file (more than one link), or not `want` bytes or a
/// power of two above it up to [`MAX_FILE_SIZE`] (a huge sparse file is
/// refused before anything touches it). Returns the file's size.
fn check_file(path: &Path, file: &File, want: u64) -> Result<u64, RegionFileError> {
    let path = path.to_path_buf();
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(source) => {
            return Err(RegionFileError::Io {
                path,
                op: "stat",
                source,
            })
        }
    };
    if !meta.file_type().is_file() {
        return Err(RegionFileError::NotRegular { path });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o002 != 0 {
        return Err(RegionFileError::WorldWritable { path, mode });
    }
    if meta.nlink() != 1 {
        return Err(RegionFileError::HardLinks {
            path,
            links: meta.nlink(),
        });
    }
    let len = meta.len();
    if len != want && !(len > want && len <= MAX_FILE_SIZE && len.is_power_of_two()) {
        return Err(RegionFileError::WrongSize { path, len, want });
    }
    Ok(len)
}
