//! The standard report's eventual fairness: what share of the machine the
//! VM got per mode, against vanilla and its fair-class entitlement, beside
//! the host load's. `analysis`: the figures, from the run's results;
//! `markdown`: the tables and the sentences that read them.

pub mod analysis;
pub mod markdown;

#[cfg(test)]
mod tests;
