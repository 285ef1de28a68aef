//! pvsched-abi: the Rust side of `abi/pvsched_abi.h`, the region a KVM guest
//! and pvschedd share.
//!
//! - [`layout`]: the header's structs and constants, generated from it by
//!   bindgen at build time (and compared with the C compiler's view of the
//!   header by `tests/c_layout.rs`).
//! - [`Region`]: atomic, seqcount-protected access to mapped memory;
//!   [`Region::validate`] turns any bytes into a usable view or a typed error.
//! - [`OwnedRegion`]: heap memory for tests and the simulator; [`bar_size`]:
//!   the size of a region's file (a PCI BAR) for a vCPU count. The file
//!   itself, mapped and guarded against truncation, is OS glue:
//!   `pvsched_base::region_file::RegionFile`.
//!
//! No OS glue here: the pure policy and the simulator depend on this crate.

mod error;
pub mod layout;
mod owned;
mod region;

pub use error::AbiError;
pub use layout::*;
pub use owned::{bar_size, OwnedRegion, MIN_FILE_SIZE};
pub use region::{Layout, ReadError, Region, Validated};
