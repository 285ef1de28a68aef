//! File-backed regions: the file QEMU maps with `memory-backend-file` and
//! exposes to the guest as ivshmem-plain BAR2.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use memmap2::MmapRaw;

use crate::layout::region_bytes;
use crate::{AbiError, Region};

/// Smallest region file: one page.
pub const MIN_FILE_SIZE: u64 = 4096;

/// Size of the region file for `slot_count` vCPUs: a power of two, as a PCI
/// BAR must be, and at least one page.
pub fn bar_size(slot_count: u32) -> u64 {
    region_bytes(slot_count)
        .next_power_of_two()
        .max(MIN_FILE_SIZE)
}

#[derive(Debug, thiserror::Error)]
pub enum RegionFileError {
    #[error("{path}: {source}")]
    Abi { path: PathBuf, source: AbiError },
    #[error("{path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
    #[error("{path}: not a regular file")]
    NotRegular { path: PathBuf },
    #[error("{path}: {len} bytes, too large to map")]
    TooLarge { path: PathBuf, len: u64 },
    #[error("{path}: mode {mode:o} is world-writable; refusing (chmod o-w)")]
    WorldWritable { path: PathBuf, mode: u32 },
}

/// A shared region file mapped read-write.
pub struct RegionFile {
    path: PathBuf,
    // Keeps the mapping alive; `region` points into it.
    _map: MmapRaw,
    region: Region,
}

impl std::fmt::Debug for RegionFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionFile")
            .field("path", &self.path)
            .field("len", &self.region.len())
            .finish()
    }
}

impl RegionFile {
    /// Creates `path` with `mode` (or opens it if it exists and is not
    /// world-writable), grows it to [`bar_size`]`(slot_count)` if smaller, and
    /// maps it. The header is not written: see [`Region::init_header`].
    pub fn create(path: &Path, slot_count: u32, mode: u32) -> Result<Self, RegionFileError> {
        let io_err = |op, source| RegionFileError::Io {
            path: path.to_path_buf(),
            op,
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| io_err("open", e))?;
        check_file(path, &file)?;
        let want = bar_size(slot_count);
        let len = file.metadata().map_err(|e| io_err("stat", e))?.len();
        if len < want {
            file.set_len(want).map_err(|e| io_err("resize", e))?;
        }
        Self::map(path, file)
    }

    /// Opens and maps an existing region file (no validation of its contents:
    /// see [`Region::validate`]).
    pub fn open(path: &Path) -> Result<Self, RegionFileError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| RegionFileError::Io {
                path: path.to_path_buf(),
                op: "open",
                source: e,
            })?;
        check_file(path, &file)?;
        Self::map(path, file)
    }

    fn map(path: &Path, file: File) -> Result<Self, RegionFileError> {
        let len = file
            .metadata()
            .map_err(|e| RegionFileError::Io {
                path: path.to_path_buf(),
                op: "stat",
                source: e,
            })?
            .len();
        let len_usize = usize::try_from(len).map_err(|_| RegionFileError::TooLarge {
            path: path.to_path_buf(),
            len,
        })?;
        let map = MmapRaw::map_raw(&file).map_err(|e| RegionFileError::Io {
            path: path.to_path_buf(),
            op: "mmap",
            source: e,
        })?;
        let base = NonNull::new(map.as_mut_ptr()).ok_or_else(|| RegionFileError::Io {
            path: path.to_path_buf(),
            op: "mmap",
            source: io::Error::other("null mapping"),
        })?;
        // SAFETY: `map` is a shared read-write mapping of `len_usize` bytes,
        // page aligned, kept alive in the returned struct for as long as the
        // Region that points into it.
        let region = unsafe { Region::from_raw(base, len_usize.min(map.len())) }.map_err(|e| {
            RegionFileError::Abi {
                path: path.to_path_buf(),
                source: e,
            }
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            _map: map,
            region,
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
}

fn check_file(path: &Path, file: &File) -> Result<(), RegionFileError> {
    let meta = file.metadata().map_err(|e| RegionFileError::Io {
        path: path.to_path_buf(),
        op: "stat",
        source: e,
    })?;
    if !meta.file_type().is_file() {
        return Err(RegionFileError::NotRegular {
            path: path.to_path_buf(),
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o002 != 0 {
        return Err(RegionFileError::WorldWritable {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// A region in private, heap-allocated memory: tests and the simulator.
pub struct OwnedRegion {
    _buf: Vec<Line>,
    region: Region,
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

impl OwnedRegion {
    /// A zeroed region of `len` bytes, rounded up to a cache line.
    pub fn zeroed(len: usize) -> Result<Self, AbiError> {
        let lines = len.div_ceil(64).max(1);
        let mut buf = vec![Line([0; 64]); lines];
        let base = NonNull::new(buf.as_mut_ptr().cast::<u8>()).ok_or(AbiError::Misaligned)?;
        // SAFETY: `buf` is a live, 64-byte aligned allocation of lines*64
        // bytes, owned by the returned struct and never reallocated.
        let region = unsafe { Region::from_raw(base, lines * 64) }?;
        Ok(Self { _buf: buf, region })
    }

    /// A region holding a copy of `bytes` (a test vector).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, AbiError> {
        let owned = Self::zeroed(bytes.len())?;
        let mut padded = bytes.to_vec();
        padded.resize(owned.region.len(), 0);
        owned.region.load_bytes(&padded)?;
        Ok(owned)
    }

    pub fn region(&self) -> &Region {
        &self.region
    }

    pub fn region_mut(&mut self) -> &mut Region {
        &mut self.region
    }
}
