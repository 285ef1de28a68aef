//! Live access to a mapped shared region.
//!
//! Every access to the mapping is an atomic load or store of an aligned word:
//! the other side writes the same memory concurrently, so plain reads would be
//! data races. Multi-word halves are copied under their seqcount.

use core::mem::{offset_of, size_of};
use core::ptr::NonNull;
use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::layout::*;
use crate::AbiError;

/// Why a seqcount-protected read did not produce a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    #[error("slot {slot} never read consistently in {retries} tries")]
    Inconsistent { slot: u32, retries: u32 },
    #[error("slot {slot} is outside the region ({limit} slots)")]
    OutOfRange { slot: u32, limit: u32 },
}

/// Where the slots are, as the region's header (validated) or the compiled
/// constants say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub header_size: usize,
    pub slot_size: usize,
    /// Slots that may be accessed: never more than fit in the mapping.
    pub slot_count: u32,
}

/// A header that passed [`Region::validate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validated {
    pub header: Header,
    pub layout: Layout,
}

/// A view of a shared region: a pointer to mapped memory and its length.
///
/// The view never trusts the header for bounds: `layout.slot_count` is at most
/// what fits in the mapping.
#[derive(Debug)]
pub struct Region {
    base: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: all access to the memory behind `base` goes through atomics; the
// region is designed to be shared with another party (the guest) anyway.
unsafe impl Send for Region {}
// SAFETY: as for Send: no method hands out references to the shared memory.
unsafe impl Sync for Region {}

const GUEST_WORDS: usize = size_of::<GuestHalf>() / 8;
const HOST_WORDS: usize = size_of::<HostHalf>() / 8;
/// The host half's words under its seqcount: all but `ext_notice`'s, which
/// the host's scheduler writes alone (`F_EXT_NOTICE`).
const HOST_SEQ_WORDS: usize = offset_of!(HostHalf, ext_notice) / 8;
const _: () = assert!(HOST_SEQ_WORDS == HOST_WORDS - 1);
const HEADER_WORDS: usize = HEADER_SIZE / 8;
const HOST_LINE_WORDS: usize = CACHELINE / 8;

impl Region {
    /// Wraps `len` bytes of mapped memory at `base`.
    ///
    /// # Safety
    /// `base..base+len` must stay mapped, readable and writable for the life of
    /// the `Region`, and be accessed by others only as the ABI allows (any
    /// values, but no unmapping).
    pub unsafe fn from_raw(base: NonNull<u8>, len: usize) -> Result<Self, AbiError> {
        if (base.as_ptr() as usize) % CACHELINE != 0 {
            return Err(AbiError::Misaligned);
        }
        if len < HEADER_SIZE {
            return Err(AbiError::TooSmall { len });
        }
        let fit = (len - HEADER_SIZE) / SLOT_SIZE;
        Ok(Self {
            base,
            len,
            layout: Layout {
                header_size: HEADER_SIZE,
                slot_size: SLOT_SIZE,
                slot_count: fit.min(MAX_SLOTS as usize) as u32,
            },
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Uses the slot geometry of a validated header from now on.
    pub fn adopt(&mut self, validated: &Validated) {
        self.layout = validated.layout;
    }

    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset % 8 == 0 && offset + 8 <= self.len);
        // SAFETY: callers pass offsets inside the mapping (checked against the
        // layout, itself bounded by `len`), 8-byte aligned because the base is
        // cache-line aligned and every ABI word is naturally aligned.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset % 4 == 0 && offset + 4 <= self.len);
        // SAFETY: as in `u64_at`, for a 4-byte aligned word.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    fn load_words<const N: usize>(&self, offset: usize) -> [u64; N] {
        let mut words = [0u64; N];
        for (i, w) in words.iter_mut().enumerate() {
            *w = self.u64_at(offset + i * 8).load(Ordering::Relaxed);
        }
        words
    }

    /// Copies the header as it is now (any bytes: see [`Region::validate`]).
    pub fn header(&self) -> Header {
        let words: [u64; HEADER_WORDS] = self.load_words(0);
        // SAFETY: Header is repr(C), HEADER_SIZE bytes, integers only, no
        // padding: every bit pattern is a valid value.
        unsafe { core::mem::transmute::<[u64; HEADER_WORDS], Header>(words) }
    }

    /// Checks that the header describes a region this build can use.
    /// Any byte pattern yields either `Ok` or a typed error, never a panic.
    pub fn validate(&self) -> Result<Validated, AbiError> {
        let header = self.header();
        if header.magic != MAGIC {
            return Err(AbiError::BadMagic {
                found: header.magic,
            });
        }
        if header.abi_major != ABI_MAJOR {
            return Err(AbiError::UnsupportedMajor {
                found: header.abi_major,
                supported: ABI_MAJOR,
            });
        }
        let header_size = usize::from(header.header_size);
        if header_size < HEADER_SIZE || header_size % CACHELINE != 0 {
            return Err(AbiError::BadHeaderSize {
                found: header.header_size,
            });
        }
        let slot_size = usize::from(header.slot_size);
        if slot_size < SLOT_SIZE || slot_size % CACHELINE != 0 {
            return Err(AbiError::BadSlotSize {
                found: header.slot_size,
            });
        }
        if header.slot_count == 0 || header.slot_count > MAX_SLOTS {
            return Err(AbiError::BadSlotCount {
                found: header.slot_count,
                max: MAX_SLOTS,
            });
        }
        let needed = header_size as u64 + u64::from(header.slot_count) * slot_size as u64;
        if needed > self.len as u64 {
            return Err(AbiError::SlotsBeyondMapping {
                slot_count: header.slot_count,
                needed,
                len: self.len,
            });
        }
        Ok(Validated {
            header,
            layout: Layout {
                header_size,
                slot_size,
                slot_count: header.slot_count,
            },
        })
    }

    /// Writes the host line of the header (cache line 0) as given.
    /// Host-side only; the guest line is left alone.
    pub fn write_header(&self, header: &Header) {
        // SAFETY: Header is repr(C), HEADER_SIZE bytes of plain integers.
        let words = unsafe { core::mem::transmute::<Header, [u64; HEADER_WORDS]>(*header) };
        // The magic goes last so that a reader never sees a valid magic above
        // half-written sizes.
        self.u64_at(0).store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        for (i, w) in words.iter().enumerate().take(HOST_LINE_WORDS).skip(1) {
            self.u64_at(i * 8).store(*w, Ordering::Relaxed);
        }
        fence(Ordering::Release);
        self.u64_at(0).store(words[0], Ordering::Release);
    }

    /// Host-side (re)initialisation for `slot_count` vCPUs: zeroes every slot
    /// and the guest line, writes a fresh header and returns its generation,
    /// one more than a previous valid header's (1 for a new region).
    pub fn init_header(&mut self, slot_count: u32, host_features: u64) -> Result<u64, AbiError> {
        self.init_header_with_doorbell(slot_count, host_features, 0)
    }

    /// [`Region::init_header`], with the Doorbell register value that rings the host
    /// (`doorbell`, meaningful with [`crate::F_DOORBELL`] in `host_features`, else 0).
    pub fn init_header_with_doorbell(
        &mut self,
        slot_count: u32,
        host_features: u64,
        doorbell: u32,
    ) -> Result<u64, AbiError> {
        if slot_count == 0 || slot_count > MAX_SLOTS {
            return Err(AbiError::BadSlotCount {
                found: slot_count,
                max: MAX_SLOTS,
            });
        }
        let needed = region_bytes(slot_count);
        if needed > self.len as u64 {
            return Err(AbiError::SlotsBeyondMapping {
                slot_count,
                needed,
                len: self.len,
            });
        }
        let old = self.header();
        let generation = if old.magic == MAGIC {
            old.generation.wrapping_add(1).max(1)
        } else {
            1
        };
        // Invalidate first: a guest must not bind while slots are being wiped.
        self.u64_at(0).store(0, Ordering::Release);
        for off in (HOST_LINE_WORDS * 8..self.len).step_by(8) {
            self.u64_at(off).store(0, Ordering::Relaxed);
        }
        self.layout = Layout {
            header_size: HEADER_SIZE,
            slot_size: SLOT_SIZE,
            slot_count,
        };
        self.write_header(&Header {
            magic: MAGIC,
            abi_major: ABI_MAJOR,
            abi_minor: ABI_MINOR,
            header_size: HEADER_SIZE as u16,
            slot_size: SLOT_SIZE as u16,
            slot_count,
            doorbell: if host_features & crate::F_DOORBELL != 0 {
                doorbell
            } else {
                0
            },
            host_features,
            generation,
            ..Header::default()
        });
        Ok(generation)
    }

    fn slot_offset(&self, slot: u32) -> Result<usize, ReadError> {
        if slot >= self.layout.slot_count {
            return Err(ReadError::OutOfRange {
                slot,
                limit: self.layout.slot_count,
            });
        }
        Ok(self.layout.header_size + slot as usize * self.layout.slot_size)
    }

    /// Reads the first word of the `N`-word half at `offset` under its seqcount.
    fn read_half<const N: usize>(&self, slot: u32, offset: usize) -> Result<[u64; N], ReadError> {
        let seq = self.u32_at(offset);
        for _ in 0..READ_RETRIES {
            let before = seq.load(Ordering::Acquire);
            if before & 1 == 1 {
                core::hint::spin_loop();
                continue;
            }
            let words: [u64; N] = self.load_words(offset);
            fence(Ordering::Acquire);
            if seq.load(Ordering::Relaxed) == before {
                return Ok(words);
            }
        }
        Err(ReadError::Inconsistent {
            slot,
            retries: READ_RETRIES,
        })
    }

    /// Writes an `N`-word half at `offset` under its seqcount, `seq` excepted.
    fn write_half<const N: usize>(&self, offset: usize, words: &[u64; N]) {
        let seq = self.u32_at(offset);
        // Sole writer of this half: the current value is ours. Round an odd
        // value (a crashed writer) up so the half ends even.
        let start = seq.load(Ordering::Relaxed) | 1;
        seq.store(start, Ordering::Relaxed);
        fence(Ordering::Release);
        // Word 0 holds seq in its low half (little endian): write the upper
        // 32-bit field on its own.
        self.u32_at(offset + 4)
            .store((words[0] >> 32) as u32, Ordering::Relaxed);
        for (i, w) in words.iter().enumerate().skip(1) {
            self.u64_at(offset + i * 8).store(*w, Ordering::Relaxed);
        }
        seq.store(start.wrapping_add(1), Ordering::Release);
    }

    /// A consistent copy of a slot's guest half, or an error after
    /// [`READ_RETRIES`] tries. The copy is untrusted input.
    pub fn read_guest(&self, slot: u32) -> Result<GuestHalf, ReadError> {
        let offset = self.slot_offset(slot)?;
        let words: [u64; GUEST_WORDS] = self.read_half(slot, offset)?;
        // SAFETY: GuestHalf is repr(C), 128 bytes of plain integers: any bits are valid.
        Ok(unsafe { core::mem::transmute::<[u64; GUEST_WORDS], GuestHalf>(words) })
    }

    /// A consistent copy of a slot's host half.
    pub fn read_host(&self, slot: u32) -> Result<HostHalf, ReadError> {
        let offset = self.slot_offset(slot)? + offset_of!(Slot, host);
        let words: [u64; HOST_WORDS] = self.read_half(slot, offset)?;
        // SAFETY: HostHalf is repr(C), 128 bytes of plain integers.
        Ok(unsafe { core::mem::transmute::<[u64; HOST_WORDS], HostHalf>(words) })
    }

    /// Publishes a slot's host half (the `seq` field of `host` is ignored),
    /// all but its last word: `ext_notice` and `host_reserved2` belong to
    /// the host's scheduler, which writes them alone.
    pub fn write_host(&self, slot: u32, host: &HostHalf) -> Result<(), ReadError> {
        let offset = self.slot_offset(slot)? + offset_of!(Slot, host);
        // SAFETY: HostHalf is repr(C), 128 bytes of plain integers.
        let words = unsafe { core::mem::transmute::<HostHalf, [u64; HOST_WORDS]>(*host) };
        let mut under_seq = [0u64; HOST_SEQ_WORDS];
        under_seq.copy_from_slice(&words[..HOST_SEQ_WORDS]);
        self.write_half(offset, &under_seq);
        Ok(())
    }

    /// A slot's `ext_notice` (`F_EXT_NOTICE`), read alone, as the guest does.
    pub fn ext_notice(&self, slot: u32) -> Result<u32, ReadError> {
        let offset =
            self.slot_offset(slot)? + offset_of!(Slot, host) + offset_of!(HostHalf, ext_notice);
        Ok(self.u32_at(offset).load(Ordering::Acquire))
    }

    /// Publishes a slot's guest half as a guest would (test vectors, the
    /// simulator). `guest_pending` is written too, outside the seqcount.
    pub fn write_guest(&self, slot: u32, guest: &GuestHalf) -> Result<(), ReadError> {
        let offset = self.slot_offset(slot)?;
        // SAFETY: GuestHalf is repr(C), 128 bytes of plain integers.
        let words = unsafe { core::mem::transmute::<GuestHalf, [u64; GUEST_WORDS]>(*guest) };
        self.write_half(offset, &words);
        Ok(())
    }

    /// The pending-hint word of a slot (atomic, outside the seqcount).
    pub fn guest_pending(&self, slot: u32) -> Result<u64, ReadError> {
        let offset = self.slot_offset(slot)? + offset_of!(GuestHalf, guest_pending);
        Ok(self.u64_at(offset).load(Ordering::Acquire))
    }

    /// Raw bytes of the mapping, read word by word (for snapshots in tests).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        let whole = self.len / 8 * 8;
        for off in (0..whole).step_by(8) {
            out.extend_from_slice(&self.u64_at(off).load(Ordering::Relaxed).to_le_bytes());
        }
        out.resize(self.len, 0);
        out
    }

    /// Overwrites the mapping with `bytes` (test vectors): host-side tooling only.
    pub fn load_bytes(&self, bytes: &[u8]) -> Result<(), AbiError> {
        if bytes.len() != self.len || self.len % 8 != 0 {
            return Err(AbiError::TooSmall { len: bytes.len() });
        }
        for (i, chunk) in bytes.chunks_exact(8).enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            self.u64_at(i * 8)
                .store(u64::from_le_bytes(w), Ordering::Relaxed);
        }
        fence(Ordering::Release);
        Ok(())
    }
}
