//! Surviving the truncation of a shared file mapping.
//!
//! A file shared with another party (a VM's region file, owned by the VMM's
//! user) can be truncated by that party while we have it mapped: touching a
//! page past the new end of file then raises SIGBUS, whose default action
//! kills the whole process. Memory seals (`F_SEAL_SHRINK`) would prevent
//! the truncation, but only on a memfd, and QEMU maps a named file.
//!
//! So a mapping is *guarded* instead: [`Guard::register`] records its range
//! in a fixed, lock-free table and installs (once per process) a SIGBUS
//! handler. A fault inside a guarded range replaces the whole range with
//! private anonymous zero pages (`mmap(MAP_FIXED)`, one syscall: the kernel
//! swaps the mapping atomically, so other threads see the file or zeros,
//! never a hole), marks the range lost ([`Guard::lost`]) and returns: the
//! access is retried and reads zeros. Any other fault goes to the handler
//! that was installed before ours (Rust's stack-overflow reporter) or takes
//! the default action; a SIGBUS sent by a process takes the default action:
//! the process dies, as it would have without us.
//!
//! `mmap` is not on POSIX's list of async-signal-safe functions, but on
//! Linux glibc's `mmap` is a plain system call wrapper (no lock, no
//! allocation), which is all the handler needs. `signal-hook` refuses
//! SIGBUS handlers (it cannot make them safe for arbitrary code), hence
//! this small hand-written one.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// How many mappings can be guarded at once (a fixed table: the handler
/// cannot allocate).
pub const MAX_GUARDED: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum SigbusError {
    #[error("installing the SIGBUS handler: {0}")]
    Install(io::Error),
    #[error("no room to guard a mapping: {MAX_GUARDED} are already guarded")]
    TableFull,
}

/// One guarded range. `base` is 0 when free and [`CLAIMED`] while being
/// filled; the handler only trusts a `len` read between two equal loads of
/// a real `base`.
struct Entry {
    base: AtomicUsize,
    len: AtomicUsize,
    lost: AtomicBool,
}

const CLAIMED: usize = usize::MAX;

static TABLE: [Entry; MAX_GUARDED] = [const {
    Entry {
        base: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        lost: AtomicBool::new(false),
    }
}; MAX_GUARDED];

/// The signature of an `SA_SIGINFO` handler.
type SigInfoHandler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// The SIGBUS action in force before ours, to pass foreign faults to.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// A guarded shared mapping; dropping it stops the guarding (drop it before
/// unmapping the range).
#[derive(Debug)]
pub struct Guard {
    index: usize,
}

impl Guard {
    /// Guards `len` bytes at `base`: from now on a SIGBUS inside the range
    /// turns it into zero pages instead of killing the process.
    ///
    /// # Safety
    /// `base..base + len` must be a page-aligned, read-write mapping that the
    /// caller owns for the whole life of the returned guard (unmapped only
    /// after the guard is dropped), and whose contents may at any moment be
    /// replaced by private anonymous zero pages, readable and writable.
    pub unsafe fn register(base: *mut u8, len: usize) -> Result<Self, SigbusError> {
        install()?;
        for (index, e) in TABLE.iter().enumerate() {
            if e.base
                .compare_exchange(0, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                e.len.store(len, Ordering::Relaxed);
                e.lost.store(false, Ordering::Relaxed);
                // Publishes len and lost with the base.
                e.base.store(base as usize, Ordering::Release);
                return Ok(Self { index });
            }
        }
        Err(SigbusError::TableFull)
    }

    /// Whether a fault found the range's file truncated (or otherwise gone):
    /// the range now holds zero pages, not the file.
    pub fn lost(&self) -> bool {
        TABLE[self.index].lost.load(Ordering::Acquire)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        TABLE[self.index].base.store(0, Ordering::Release);
    }
}

/// Installs the handler once per process; later calls return the first
/// result.
fn install() -> Result<(), SigbusError> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let result = INSTALLED.get_or_init(|| {
        let last_errno = || io::Error::last_os_error().raw_os_error().unwrap_or(0);
        // SAFETY: an all-zero sigaction is a valid value (SIG_DFL, empty
        // mask, no flags).
        let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a null new action only reads the current one into
        // `previous`, which we own.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) } != 0 {
            return Err(last_errno());
        }
        // Set before ours is installed: the handler may run at once.
        let _ = PREVIOUS.set(previous);
        // SAFETY: as above.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_sigbus as SigInfoHandler as usize;
        // SA_ONSTACK: run on the thread's alternate stack where it has one
        // (Rust gives its threads one), as the handler we displace does.
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: initialises the mask of our own struct.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        // SAFETY: `action` is initialised: an SA_SIGINFO handler of the
        // matching signature, an empty mask.
        if unsafe { libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) } != 0 {
            return Err(last_errno());
        }
        Ok(())
    });
    result
        .as_ref()
        .map(|_| ())
        .map_err(|e| SigbusError::Install(io::Error::from_raw_os_error(*e)))
}

/// The guarded entry holding `addr`, if any. Async-signal-safe: atomic loads.
fn find(addr: usize) -> Option<(&'static Entry, usize, usize)> {
    TABLE.iter().find_map(|e| {
        let base = e.base.load(Ordering::Acquire);
        if base == 0 || base == CLAIMED {
            return None;
        }
        let len = e.len.load(Ordering::Relaxed);
        // The entry was not reused between the two loads of base.
        if e.base.load(Ordering::Acquire) != base {
            return None;
        }
        (addr >= base && addr - base < len).then_some((e, base, len))
    })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler;
    // si_addr is the faulting address when si_code > 0 (a fault).
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code <= 0 {
        // Sent by a process (kill, tgkill, sigqueue), not a fault.
        default_action(true);
        return;
    }
    if let Some((entry, base, len)) = find(addr) {
        // SAFETY: errno is thread-local; the interrupted code may be about
        // to read it, so it is restored below.
        let errno = unsafe { *libc::__errno_location() };
        // SAFETY: Guard::register's contract lets us replace the range with
        // zero pages; MAP_FIXED swaps it in one system call.
        let p = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
        if p != libc::MAP_FAILED {
            entry.lost.store(true, Ordering::Release);
            // Return: the access is retried on the zero pages.
            return;
        }
    }
    // A fault outside every guarded range: whoever handled SIGBUS before us
    // (Rust's stack-overflow reporter), else the default action.
    if let Some(prev) = PREVIOUS.get() {
        let h = prev.sa_sigaction;
        if h != libc::SIG_DFL && h != libc::SIG_IGN {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: an SA_SIGINFO handler has this signature; it gets
                // the kernel's arguments unchanged.
                let f: SigInfoHandler = unsafe { std::mem::transmute(h) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a plain handler takes the signal number only.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
                f(sig);
            }
            return;
        }
    }
    default_action(false);
}

/// Resets SIGBUS to its default action (death with a core dump). A fault
/// recurs when the handler returns and takes it; a `sent` signal would not,
/// so it is raised again (pending until the handler returns).
fn default_action(sent: bool) {
    // SAFETY: signal and raise are async-signal-safe and take plain values.
    unsafe {
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
        if sent {
            libc::raise(libc::SIGBUS);
        }
    }
}
