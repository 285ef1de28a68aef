//! OS glue shared by pvsched's programs. Each piece has one home here:
//! the clock, scheduling parameters, thread identity, vCPU thread names,
//! the QMP client, the ivshmem-doorbell server protocol, another process's
//! descriptors (pidfd, pidfd_getfd), small /proc reads, the SIGBUS guard
//! of shared mappings, the region file mapped under that guard,
//! capabilities and the kvm module's halt-polling parameters.
//! Mechanism only: nothing here decides anything.

pub mod caps;
pub mod clock;
pub mod ivshmem;
pub mod kvm_params;
pub mod process_fds;
pub mod procfs;
pub mod qmp;
pub mod region_file;
pub mod sched;
pub mod sigbus;
pub mod thread;
pub mod vcpu_names;
