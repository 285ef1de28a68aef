//! pvsched-sim: a seeded, deterministic discrete-event simulator of double scheduling.
//!
//! A host scheduler model ([`host`]) runs host threads, among them the vCPU threads and
//! VMM main loops of simulated VMs; each VM runs its own guest scheduler ([`guest`]) over
//! its vCPUs; the engine ([`engine`]) makes running threads do their work and measures
//! what the benchmark measures ([`results`]). In the pvsched modes the real
//! `pvsched-policy` engine decides the vCPU threads' classes, fed as the daemon feeds it
//! ([`daemon`]). Costs of exits, switches and wakeups come from a KVM or a TCG parameter
//! set ([`costs`]); scenarios are TOML ([`scenario`]). See README.md.

pub mod costs;
pub mod daemon;
pub mod engine;
pub mod error;
pub mod guest;
pub mod host;
pub mod report;
pub mod results;
pub mod rng;
pub mod scenario;

pub use error::SimError;
