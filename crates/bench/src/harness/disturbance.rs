//! Measurements others disturbed: a run measures again while processes
//! outside the bench take more than this share of the machine.

/// Share of the machine taken by others above which a repeat is flagged.
pub const DISTURBED: f64 = 0.10;
