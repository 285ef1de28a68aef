//! pvschedd internals, one responsibility a module: configuration,
//! discovery, the ivshmem server, the served VMs, event sources, the event
//! loop, the actuator, the state file, metrics and the control socket. The decisions themselves
//! come from `pvsched-policy`; this crate is the mechanism around it.

pub mod actuator;
pub mod backend;
pub mod config;
pub mod control;
pub mod discovery;
pub mod doorbell;
pub mod error;
pub mod event_loop;
pub mod events;
pub mod feed;
pub mod found;
pub mod idle_report;
pub mod ivshmem_server;
pub mod kvm_apply;
pub mod managed;
pub mod metrics;
pub mod signals;
pub mod state_keeper;
pub mod statefile;
pub mod vm;
pub mod vm_table;
