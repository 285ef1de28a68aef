//! A KVM guest lost to the emulation, told from a result.
//!
//! KVM guests inside the host VM run on emulated SVM, and now and then one is
//! reset or stops answering with no message (README, "Emulation faults"); the
//! bench measures such a session again on a new guest. A [`crate::kvm_test!`]
//! does the same: a guest operation that fails, on a guest that then no
//! longer runs `true`, or whose reply stopped mid-way (the output came, the
//! end line did not: the guest stalled for longer than the command's whole
//! timeout), ends the test with [`GUEST_LOST_MARKER`] in its panic, and
//! [`crate::run_test`] runs the test again (at most
//! [`crate::inside::ATTEMPTS`] times, each said). A guest that answered, and
//! answers `true` after, is a result: the test fails as usual, never retried.
//! A stall pvsched caused would come back in every attempt, and fail the test.

use std::fmt::Display;
use std::time::Duration;

use pvsched_vmtest::Vm;

/// In a test's output: the test ended because its KVM guest was lost.
pub const GUEST_LOST_MARKER: &str = "__PVSCHED_KVM_GUEST_LOST__";

/// Tries of `true` after a failed operation before the guest counts as lost
/// (a loaded guest in the host VM can be slow to answer).
const ALIVE_TRIES: usize = 2;
const ALIVE_TIMEOUT: Duration = Duration::from_secs(45);

/// `r`'s value; on an error, panics with the marker when `vm` stalled or no
/// longer answers (lost guest), or with `what` and the error when it does.
pub fn guest_answers<T>(vm: &Vm, r: pvsched_vmtest::Result<T>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) if e.is_stall() => lost(format!("{what}: its reply stalled: {e}")),
        Err(e) if !alive(vm) => lost(format!("{what}: {e}")),
        Err(e) => panic!("{what}: {e}"),
    }
}

/// Ends the test as lost to the emulation: `why` says what failed.
pub fn lost(why: impl Display) -> ! {
    panic!("{GUEST_LOST_MARKER} the KVM guest stopped answering: {why}")
}

fn alive(vm: &Vm) -> bool {
    vm.answers(ALIVE_TRIES, ALIVE_TIMEOUT)
}
