//! Scheduling parameters of a thread: `sched_setattr` / `sched_getattr` on a
//! thread id, policy names, and the calling thread's own RT policy.

use std::io;

use serde::{Deserialize, Serialize};

/// `struct sched_attr`, first version (48 bytes): what every kernel since 3.14 takes.
#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}

const SCHED_ATTR_SIZE_VER0: u32 = 48;

/// Linux UAPI policy numbers (also the guest's, in the region ABI).
pub const SCHED_OTHER: u32 = 0;
pub const SCHED_FIFO: u32 = 1;
pub const SCHED_RR: u32 = 2;
pub const SCHED_BATCH: u32 = 3;
pub const SCHED_IDLE: u32 = 5;
pub const SCHED_DEADLINE: u32 = 6;
/// Reset-on-fork: children of a boosted thread never inherit the boost.
pub const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

/// Lower-case name of a Linux scheduling policy number.
pub fn policy_name(policy: u32) -> &'static str {
    match policy {
        SCHED_OTHER => "other",
        SCHED_FIFO => "fifo",
        SCHED_RR => "rr",
        SCHED_BATCH => "batch",
        SCHED_IDLE => "idle",
        SCHED_DEADLINE => "deadline",
        _ => "unknown",
    }
}

/// Whether a policy number is a real-time one.
pub fn is_rt_policy(policy: u32) -> bool {
    matches!(policy, SCHED_FIFO | SCHED_RR | SCHED_DEADLINE)
}

/// Scheduling parameters as the kernel reports them, including policies
/// pvsched never applies (deadline), so that originals restore faithfully.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadParams {
    pub policy: u32,
    pub priority: u32,
    pub nice: i32,
    #[serde(default)]
    pub flags: u64,
    #[serde(default)]
    pub runtime: u64,
    #[serde(default)]
    pub deadline: u64,
    #[serde(default)]
    pub period: u64,
}

impl ThreadParams {
    /// SCHED_OTHER at `nice`, no flags.
    pub const fn other(nice: i32) -> Self {
        Self {
            policy: SCHED_OTHER,
            priority: 0,
            nice,
            flags: 0,
            runtime: 0,
            deadline: 0,
            period: 0,
        }
    }

    /// SCHED_OTHER at `nice` asking for an EEVDF slice of `slice_ns`: Linux >= 6.12
    /// keeps it as the task's own slice (clamped to 0.1..=100 ms), and a waking task
    /// with a shorter slice than the running one preempts it; older kernels ignore it.
    pub const fn fair_with_slice(nice: i32, slice_ns: u64) -> Self {
        Self {
            runtime: slice_ns,
            ..Self::other(nice)
        }
    }

    /// An RT policy (`SCHED_FIFO` or `SCHED_RR`) at `priority`, no flags.
    pub const fn rt(policy: u32, priority: u32) -> Self {
        Self {
            policy,
            priority,
            ..Self::other(0)
        }
    }

    /// SCHED_RR at `priority`, no flags.
    pub const fn rr(priority: u32) -> Self {
        Self::rt(SCHED_RR, priority)
    }

    /// SCHED_FIFO at `priority`, no flags.
    pub const fn fifo(priority: u32) -> Self {
        Self::rt(SCHED_FIFO, priority)
    }

    /// The same parameters with reset-on-fork set.
    pub const fn reset_on_fork(self) -> Self {
        Self {
            flags: self.flags | SCHED_FLAG_RESET_ON_FORK,
            ..self
        }
    }

    pub fn is_rt(&self) -> bool {
        is_rt_policy(self.policy)
    }

    /// SCHED_OTHER at nice 0: what a VMM's threads start with.
    pub fn is_normal(&self) -> bool {
        self.policy == SCHED_OTHER && self.nice == 0
    }

    /// Same policy, priority and nice (what pvsched decides; flags aside).
    pub fn same_class(&self, other: &ThreadParams) -> bool {
        self.policy == other.policy && self.priority == other.priority && self.nice == other.nice
    }

    pub fn policy_name(&self) -> &'static str {
        policy_name(self.policy)
    }

    /// The same setting as far as the kernel keeps one: policy, priority,
    /// nice and flags, and the reservation for SCHED_DEADLINE only (for the
    /// fair classes `sched_getattr` reports the current slice as `runtime`,
    /// which is not what was set).
    pub fn same_setting(&self, other: &ThreadParams) -> bool {
        let reservation = self.policy != SCHED_DEADLINE
            || (self.runtime, self.deadline, self.period)
                == (other.runtime, other.deadline, other.period);
        self.same_class(other) && self.flags == other.flags && reservation
    }
}

impl std::fmt::Display for ThreadParams {
    /// `rr/2`, `other/nice 5`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_rt() {
            write!(f, "{}/{}", self.policy_name(), self.priority)
        } else {
            write!(f, "{}/nice {}", self.policy_name(), self.nice)
        }
    }
}

/// Whether the running kernel keeps a fair-class thread's slice request
/// (`sched_attr.sched_runtime` on SCHED_OTHER: Linux >= 6.12). Older kernels
/// accept and ignore it.
pub fn fair_slices_supported() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(['.', '-']);
    let mut next = || {
        parts
            .next()
            .and_then(|p| p.parse::<u32>().ok())
            .unwrap_or(0)
    };
    (next(), next()) >= (6, 12)
}

/// Applies `params` to thread `tid` (0: the calling thread).
pub fn set_params(tid: i32, params: &ThreadParams) -> io::Result<()> {
    let attr = SchedAttr {
        size: SCHED_ATTR_SIZE_VER0,
        sched_policy: params.policy,
        sched_flags: params.flags,
        sched_nice: params.nice,
        sched_priority: params.priority,
        sched_runtime: params.runtime,
        sched_deadline: params.deadline,
        sched_period: params.period,
    };
    // SAFETY: `attr` is a valid, initialised sched_attr of the size it
    // declares, alive across the call; the kernel only reads it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            tid,
            &attr as *const SchedAttr,
            0u32,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reads thread `tid`'s scheduling parameters (0: the calling thread).
pub fn get_params(tid: i32) -> io::Result<ThreadParams> {
    let mut attr = SchedAttr::default();
    // SAFETY: the kernel writes at most `size` (48) bytes into `attr`, which is
    // 48 bytes, writable and alive across the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid,
            &mut attr as *mut SchedAttr,
            SCHED_ATTR_SIZE_VER0,
            0u32,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ThreadParams {
        policy: attr.sched_policy,
        priority: attr.sched_priority,
        nice: attr.sched_nice,
        flags: attr.sched_flags & SCHED_FLAG_RESET_ON_FORK,
        runtime: attr.sched_runtime,
        deadline: attr.sched_deadline,
        period: attr.sched_period,
    })
}

/// Sets `params` on `tid` and reads them back: an error if the kernel kept
/// something else.
pub fn set_params_verified(tid: i32, params: &ThreadParams) -> io::Result<()> {
    set_params(tid, params)?;
    let got = get_params(tid)?;
    let same = got.policy == params.policy
        && got.priority == params.priority
        && (params.is_rt() || got.nice == params.nice);
    if !same {
        return Err(io::Error::other(format!(
            "thread {tid}: asked for {params}, kernel reports {got}"
        )));
    }
    Ok(())
}

/// Makes the calling thread SCHED_FIFO at `priority` (reset on fork), and,
/// with `lock_memory`, locks the process's memory (no page fault on the
/// latency path).
pub fn make_current_thread_fifo(priority: u32, lock_memory: bool) -> io::Result<()> {
    if lock_memory {
        // SAFETY: mlockall takes flags only.
        if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    set_params(0, &ThreadParams::fifo(priority).reset_on_fork())
}

/// How many CPUs are online now (`sysconf(_SC_NPROCESSORS_ONLN)`): a thread
/// whose affinity allows at least this many may run on every CPU.
pub fn online_cpus() -> io::Result<u32> {
    // SAFETY: sysconf reads a system value and touches no memory of ours.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n < 1 {
        return Err(io::Error::last_os_error());
    }
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// Confines the calling thread (and what it later forks or execs) to `cpus`.
/// Async-signal-safe: usable between fork and exec.
pub fn set_own_affinity(cpus: &[u32]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>() as u32;
    for &cpu in cpus {
        if cpu >= max {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: cpu is below the set's capacity (checked above).
        unsafe { libc::CPU_SET(cpu as usize, &mut set) };
    }
    // SAFETY: pid 0 is the calling thread; set is a valid cpu_set_t of the given size.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPUs the calling thread may run on.
pub fn own_affinity() -> io::Result<Vec<u32>> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; set is a writable cpu_set_t of the given size.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: every index is below the set's capacity.
    Ok((0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .map(|c| c as u32)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_affinity_reads_back_what_was_set_in_a_thread() {
        let first = *own_affinity().unwrap().first().unwrap();
        let got = std::thread::spawn(move || {
            set_own_affinity(&[first]).unwrap();
            own_affinity().unwrap()
        })
        .join()
        .unwrap();

        assert_eq!(got, vec![first]);
        assert!(set_own_affinity(&[100_000]).is_err());
    }

    #[test]
    fn own_thread_params_read_back_what_was_set() {
        let tid = crate::thread::gettid();
        let before = get_params(tid).unwrap();
        let nicer = ThreadParams {
            nice: before.nice.max(1),
            ..before
        };

        set_params(tid, &nicer).unwrap();

        assert_eq!(get_params(tid).unwrap().nice, nicer.nice);
    }

    #[test]
    fn a_fair_slice_request_is_kept_and_cleared_by_plain_params() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(crate::thread::gettid()).unwrap();
            done_rx.recv().ok();
        });
        let tid = rx.recv().unwrap();
        let default_slice = get_params(tid).unwrap().runtime;

        set_params(tid, &ThreadParams::fair_with_slice(1, 250_000)).unwrap();
        let sliced = get_params(tid).unwrap();
        set_params(tid, &ThreadParams::other(1)).unwrap();
        let plain = get_params(tid).unwrap();
        done_tx.send(()).unwrap();
        t.join().unwrap();

        assert_eq!((sliced.policy, sliced.nice), (SCHED_OTHER, 1));
        if fair_slices_supported() {
            assert_eq!(sliced.runtime, 250_000);
            assert_eq!(plain.runtime, default_slice);
        }
    }

    #[test]
    fn params_display_names_policy_and_priority() {
        assert_eq!(ThreadParams::rr(8).to_string(), "rr/8");
        assert_eq!(ThreadParams::other(5).to_string(), "other/nice 5");
        assert_eq!(policy_name(6), "deadline");
        assert_eq!(policy_name(99), "unknown");
    }

    #[test]
    fn same_setting_ignores_the_fair_slice_but_not_flags() {
        let a = ThreadParams::other(0);
        let sliced = ThreadParams {
            runtime: 1_400_000,
            ..a
        };

        assert!(a.same_setting(&sliced));
        assert!(!a.same_setting(&a.reset_on_fork()));
    }

    #[test]
    fn same_class_ignores_flags() {
        let a = ThreadParams::rr(2);

        assert!(a.same_class(&a.reset_on_fork()));
        assert!(!a.same_class(&ThreadParams::rr(3)));
    }
}
