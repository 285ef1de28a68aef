//! The guest module's own cost, a phase of the standard scenario:
//! `perf bench sched pipe` (both tasks pinned to one vCPU: two context
//! switches and two wakeups per operation, the probes' hot path) in a guest
//! with pvsched.ko loaded and bound, against the same guest without it.
//!
//! How "with" and "without" are made: one extra guest, booted after the main
//! sessions (the main guest powered off first, so that nothing competes with
//! it; no stress-ng, no pvschedd), with a region file the bench initialises
//! itself (vmtest's `RegionSetup::Fresh`: `pvsched_base::region_file::RegionFile`, as
//! pvschedd does, every feature offered), and `insmod` / `rmmod` between the
//! runs. One guest rather than two booted alternately: the two variants then
//! differ by the module only, not by where QEMU's memory or the guest's page
//! cache happened to land. Loading and unloading re-patches tracepoint
//! sites, on which QEMU 7.2's multi-threaded TCG now and then hangs the
//! guest (guest/README.md, "Tests"), so under TCG this guest runs QEMU with
//! single-threaded TCG (`-accel tcg,thread=single`, through a wrapper
//! script, as `crates/vmtest/tests/guest_module.rs` does). Without pvschedd
//! the host halves stay zero: what is measured is the guest module alone.
//!
//! The clock (`--modcost-clock`): under TCG by default the guest's own
//! time under QEMU's `-icount shift=0,sleep=off`, in which the guest clock
//! advances exactly 1 ns per guest instruction, so perf's µs/op is thousands
//! of guest instructions per operation. On the host clock two 2 s runs of the
//! same variant differed by up to 15 % (TCG translation, the host's other
//! work, this machine's own hypervisor), which hid a 2 % target under 9 + 9
//! runs; instruction counts repeat within a few tenths of a percent. What it
//! measures is the module's path length, not its cache misses or the cost of
//! its stores to a page the host also reads. QEMU 7.2 with icount hangs
//! bringing up a second vCPU, so this guest has one (both tasks on vCPU 0).
//! KVM has no icount: there the host clock is used.
//!
//! Order: rotated per repeat (without, with; with, without; ...), so that a
//! slow drift of the host favours neither. After every load or unload a short
//! warm-up run (not counted) lets TCG translate the re-patched code again.
//!
//! `model`: what the phase keeps (raw.json); `run`: the phase; `summary`:
//! the overhead over the runs; `markdown`: its part of report.md.

pub mod markdown;
pub mod model;
pub mod run;
pub mod summary;

#[cfg(test)]
mod tests;
