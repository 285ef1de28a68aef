//! pvschedctl internals: rendering of status and of recordings.

pub mod table;
pub mod trace;
