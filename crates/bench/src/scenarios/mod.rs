//! The scenarios, each on the one harness: its run, what it keeps
//! (raw.json) and its report.

pub mod locks;
pub mod msgpass;
pub mod rogue;
pub mod standard;
