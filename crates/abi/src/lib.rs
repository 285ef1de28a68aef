//! pvsched-abi: the Rust side of `abi/pvsched_abi.h`, the region a KVM guest
//! and pvschedd share.
//!
//! - [`layout`]: `#[repr(C)]` mirrors and constants (checked against the C
//!   header by `tests/c_layout.rs`).
//! - [`Region`]: atomic, seqcount-protected access to mapped memory;
//!   [`Region::validate`] turns any bytes into a usable view or a typed error.
//! - [`RegionFile`]: the file QEMU shares with the guest, mapped at exactly
//!   [`bar_size`] of the VM's vCPUs and guarded against truncation by its
//!   owner; [`OwnedRegion`]: heap memory for tests and the simulator.

mod error;
mod file;
pub mod layout;
mod region;

pub use error::AbiError;
pub use file::{bar_size, OwnedRegion, RegionFile, RegionFileError, MAX_FILE_SIZE, MIN_FILE_SIZE};
pub use layout::*;
pub use region::{Layout, ReadError, Region, Validated};
