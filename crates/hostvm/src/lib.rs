//! pvsched-hostvm: a KVM (and sched_ext) host in a VM.
//!
//! This machine's own KVM cannot run a stock guest (`docs/DESIGN.md`, "Test
//! machines"), but a stock Debian 13 backports cloud kernel boots here under
//! TCG (`-cpu max` exposes SVM), and KVM inside it runs real guests. The host
//! VM runs this machine's own userland: its root file system is this
//! machine's, shared read-only over virtiofs, with tmpfs where a running
//! system writes, so pvschedd, QEMU, the guest image and the tests are the
//! very files built here. One folder may be shared read-write (results).
//!
//! - [`packages`]: the kernel and QEMU `scripts/fetch-hostvm.sh` fetched;
//! - [`initramfs`]: the init that loads KVM and serves commands in a chroot;
//! - [`virtiofsd`]: the file system servers;
//! - [`vm`]: [`HostVm`], failures of the host VM told from results, retries;
//! - [`inside`]: tests that run themselves inside the host VM ([`kvm_test!`]);
//! - [`guest_lost`]: a KVM guest lost to the emulation, told from a result.

pub mod error;
pub mod guest_lost;
pub mod initramfs;
pub mod inside;
pub mod packages;
pub mod virtiofsd;
pub mod vm;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use error::{Error, Result};
pub use guest_lost::{guest_answers, GUEST_LOST_MARKER};
pub use inside::{in_host_vm, run_test, shell_quote};
pub use packages::{HostKernel, HostQemu, Packages};
pub use vm::{default_cpus, default_guest_cpus, with_retries, HostVm, HostVmConfig, Retried};

/// How long a [`kvm_test!`] may run inside the host VM: a few times the
/// slowest one's CI time (about a minute), so that a host VM that hangs
/// mid-test is told in minutes.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(300);

/// The harness's own folder: `$CARGO_TARGET_DIR/pvsched-hostvm`, else
/// `<repo>/target/pvsched-hostvm` (beside vmtest's image cache).
pub fn work_dir() -> PathBuf {
    pvsched_vmtest::cache_root().with_file_name("pvsched-hostvm")
}

static SERIAL: AtomicU64 = AtomicU64::new(0);

pub(crate) fn next_serial() -> u64 {
    SERIAL.fetch_add(1, Ordering::Relaxed)
}
