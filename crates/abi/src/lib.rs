//! pvsched-abi: the Rust side of `abi/pvsched_abi.h`.

mod layout;

pub use layout::*;
