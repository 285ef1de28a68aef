//! pvsched-vmtest: boot a QEMU guest with the pvsched module and a shared
//! region, run commands in it, and read the region from the host.
//!
//! ```no_run
//! use std::time::Duration;
//! use pvsched_vmtest::{GuestImage, Vm, VmConfig};
//!
//! let image = GuestImage::build_default()?;          // cached under target/
//! let vm = Vm::boot(VmConfig::new(image).smp(2))?;    // fresh region, 2 slots
//! vm.insmod("")?;
//! let (rc, out) = vm.exec("cat /sys/kernel/debug/pvsched/status", Duration::from_secs(10))?;
//! let slot1 = vm.region().unwrap().read_guest(1)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Pieces:
//! - [`image`]: find the Debian cloud kernel and headers, build pvsched.ko and
//!   the guest programs of `guest-progs/`, pack a busybox initramfs; cached by
//!   content hash.
//! - [`vm`]: QEMU with `-accel tcg` (or KVM), an ivshmem-plain region, a QMP
//!   socket, and a command channel over the serial console.
//! - [`cpio`]: the initramfs writer.
//! - [`lost`]: a guest lost to the emulation told from a result; a test run
//!   again on a fresh guest when it was.

pub mod cpio;
mod error;
pub mod guest_status;
pub mod image;
pub mod lost;
mod spawn;
pub mod vm;

use std::time::{Duration, Instant};

pub use error::{Error, Result};
pub use image::{
    cache_root, default_binaries, find_cloud_kernel, workspace_root, GuestImage, ImageConfig,
    GUEST_MODULE_PATH, INSTALL_HINT, IN_HOST_VM_ENV, LOOP,
};
pub use lost::{guest_lost, rerun_if_guest_lost};
pub use spawn::spawn_tied;
pub use vm::{
    host_vm_guest_cpus, Accel, GuestProcess, RegionSetup, Vm, VmConfig, BASE_APPEND,
    HOST_VM_GUEST_CPUS_ENV, MAX_COMMAND_LEN, READY,
};

/// Polls `probe` every `interval` until it returns `Some` or `timeout` passes.
pub fn wait_until<T>(
    timeout: Duration,
    interval: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(interval);
    }
}
