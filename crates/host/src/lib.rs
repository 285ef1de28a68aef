//! pvschedd internals: configuration, discovery, region mapping, event
//! sources, actuator, metrics, control. The decisions themselves come from
//! `pvsched-policy`; this crate is the mechanism around it.

pub mod config;
pub mod control;
pub mod daemon;
pub mod discovery;
pub mod events;
pub mod metrics;
pub mod rt;
pub mod sched;
pub mod statefile;
pub mod vm;
