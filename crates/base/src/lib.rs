//! OS glue shared by pvsched's programs. Each piece has one home here:
//! the clock, scheduling parameters, thread identity, vCPU thread names and
//! the QMP client. Mechanism only: nothing here decides anything.

pub mod clock;
pub mod qmp;
pub mod sched;
pub mod thread;
pub mod vcpu_names;
