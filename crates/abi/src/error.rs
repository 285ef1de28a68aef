//! Errors of the ABI layer.

/// Why a region cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AbiError {
    #[error("bad header size {found} (need >= 128, a multiple of 64)")]
    BadHeaderSize { found: u16 },
    #[error("bad magic {found:#018x} (not a pvsched region)")]
    BadMagic { found: u64 },
    #[error("bad slot count {found} (1..={max})")]
    BadSlotCount { found: u32, max: u32 },
    #[error("bad slot size {found} (need >= 256, a multiple of 64)")]
    BadSlotSize { found: u16 },
    #[error("mapping is not 64-byte aligned")]
    Misaligned,
    #[error("{slot_count} slots need {needed} bytes, the mapping has {len}")]
    SlotsBeyondMapping {
        slot_count: u32,
        needed: u64,
        len: usize,
    },
    #[error("region of {len} bytes is too small for a header")]
    TooSmall { len: usize },
    #[error("unsupported ABI major {found} (supported {supported})")]
    UnsupportedMajor { found: u16, supported: u16 },
}
