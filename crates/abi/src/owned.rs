//! Regions in private, heap-allocated memory, and the size of a region's
//! file (its PCI BAR). The file itself, mapped, is OS glue:
//! `pvsched_base::region_file`.

use core::ptr::NonNull;

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
