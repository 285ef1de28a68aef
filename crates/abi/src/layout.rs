//! The structs and `#define`s of `abi/pvsched_abi.h`, generated from the
//! header at build time (bindgen, see `build.rs`): `struct pvsched_header`
//! is [`Header`], `struct pvsched_guest_half` [`GuestHalf`], and so on;
//! `PVSCHED_GF_IDLE` is [`GF_IDLE`]. The header documents every field and
//! constant. Nothing here is copied by hand.
//!
//! Plain data: these are the copies a reader takes, and the byte images test
//! vectors hold. Live access to a mapped region goes through [`crate::Region`].

/// bindgen's output for the header.
#[allow(
    clippy::all,
    dead_code,
    missing_docs,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals
)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/pvsched_abi.rs"));
}

pub use generated::*;

/// The Doorbell register value that rings vector `vector` of peer `peer`
/// (`PVSCHED_IVSHMEM_DOORBELL_REG`: `peer ID << 16 | vector`).
pub const fn doorbell_value(peer: u16, vector: u16) -> u32 {
    (peer as u32) << 16 | vector as u32
}

/// Bytes a region needs for `slots` slots (before rounding to a BAR size):
/// `PVSCHED_REGION_BYTES(slots)`.
pub const fn region_bytes(slots: u32) -> u64 {
    HEADER_SIZE as u64 + slots as u64 * SLOT_SIZE as u64
}

const _: () = assert!(core::mem::size_of::<Header>() == HEADER_SIZE);
const _: () = assert!(core::mem::size_of::<GuestHalf>() == 2 * CACHELINE);
const _: () = assert!(core::mem::size_of::<HostHalf>() == 2 * CACHELINE);
const _: () = assert!(core::mem::size_of::<Slot>() == SLOT_SIZE);
