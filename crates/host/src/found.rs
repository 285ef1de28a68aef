//! A VM as discovery finds it: its name, region file and threads. Shared by
//! the discovery thread, which finds them, and the served VM, which opens
//! them.

use std::path::PathBuf;

use pvsched_base::vcpu_names::Accel;

/// A VM found by the discovery thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub name: String,
    /// Index of its `[[vm]]` entry; `None` for an auto-discovered VM.
    pub cfg_index: Option<usize>,
    pub region: PathBuf,
    pub region_mode: u32,
    /// The region is pvschedd's ivshmem server's: opened, never created (a
    /// VM the server ended meanwhile has had its region removed).
    pub region_from_server: bool,
    pub threads: VmThreads,
}

/// A running VM as the host sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmThreads {
    /// The VMM process.
    pub tgid: i32,
    /// (vCPU index, thread id), sorted by index, indices 0..n without gaps.
    pub vcpus: Vec<(u32, i32)>,
    /// Other VMM threads on the guest's latency path (under TCG, QEMU's main
    /// loop delivers guest timers).
    pub latency_path: Vec<i32>,
    pub accel: Accel,
}
