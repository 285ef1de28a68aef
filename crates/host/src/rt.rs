//! The event thread's own scheduling: SCHED_FIFO above every boost it
//! applies (a boosted vCPU must never delay its own unboost), memory locked.

use crate::sched::{self, ThreadParams};

pub fn make_event_thread_rt(priority: u8, mlock: bool) -> std::io::Result<()> {
    if mlock {
        // SAFETY: mlockall takes flags only.
        if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    let params = ThreadParams {
        policy: libc::SCHED_FIFO as u32,
        priority: u32::from(priority),
        nice: 0,
        flags: 0x01, // reset on fork
        runtime: 0,
        deadline: 0,
        period: 0,
    };
    sched::set_params(0, &params)
}
