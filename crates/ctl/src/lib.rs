//! pvschedctl internals: rendering of status, idle reports and recordings.

pub mod idle;
pub mod table;
pub mod trace;
