//! The harness every scenario runs on: its settings and axes (loads,
//! modes, the rotation of cases), the start of a run (tools, folders, the
//! plan it prints), the guests, the journal of notes and errors, measuring
//! again what others disturbed, and writing and re-reading the files.

pub mod axes;
pub mod disturbance;
pub mod figures;
pub mod journal;
pub mod markdown;
pub mod meta;
pub mod output;
pub mod plan;
pub mod raw;
pub mod settings;
pub mod start;
pub mod vm;
