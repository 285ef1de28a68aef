//! Tests that run inside the host VM: the same test binary, the same test,
//! run there instead of here.
//!
//! A test written with [`crate::kvm_test!`] runs its body when the process is
//! inside a host VM; outside, it runs itself (`current_exe --exact NAME`) in
//! the process's shared host VM and passes or fails with it. The host VM's
//! own failures are retried on a fresh one and printed, a test whose KVM guest
//! was lost to the emulation ([`crate::guest_lost`]) runs again; a failure of
//! the test is never retried.

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use pvsched_vmtest::IN_HOST_VM_ENV;

use crate::error::{Error, Result};
use crate::guest_lost::GUEST_LOST_MARKER;
use crate::vm::{HostVm, HostVmConfig};

/// Host VMs booted per test at most (the first and the retries).
pub const ATTEMPTS: usize = 3;

/// Whether this process runs inside a host VM.
pub fn in_host_vm() -> bool {
    std::env::var_os(IN_HOST_VM_ENV).is_some()
}

struct Shared {
    vm: Option<HostVm>,
    /// Host VM failures seen by this process (printed with each test that met one).
    failures: usize,
}

static SHARED: OnceLock<Mutex<Shared>> = OnceLock::new();

fn shared() -> MutexGuard<'static, Shared> {
    SHARED
        .get_or_init(|| {
            Mutex::new(Shared {
                vm: None,
                failures: 0,
            })
        })
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// `cfg`, sharing the checkout into the host VM when it lies under a place
/// the host VM covers with a tmpfs (a clone in `mktemp -d`, as CI may make):
/// there the root share cannot show it, and the test binary would be missing.
fn with_checkout(cfg: &HostVmConfig) -> HostVmConfig {
    let root = pvsched_vmtest::workspace_root();
    let hidden = crate::initramfs::TMPFS.iter().any(|t| root.starts_with(t));
    let mut cfg = cfg.clone();
    if hidden && cfg.exchange.is_none() {
        cfg.exchange = Some(root);
    }
    cfg
}

/// Quotes `s` for the host VM's `/bin/sh`.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs test `name` of this test binary inside the shared host VM (booted on
/// first use, by `cfg`); `Ok` with the test's output when it passed.
pub fn run_test(name: &str, cfg: &HostVmConfig, timeout: Duration) -> Result<String> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::Other(format!("this test binary's path: {e}")))?;
    let cmd = format!(
        "{} --exact {} --nocapture --test-threads=1 2>&1",
        shell_quote(&exe.display().to_string()),
        shell_quote(name)
    );
    let mut state = shared();
    // Inside, this machine's files are read-only: the guest image the test
    // boots must be in the cache before.
    if state.vm.is_none() {
        pvsched_vmtest::GuestImage::build(&pvsched_vmtest::ImageConfig::default())?;
    }
    let mut notes = Vec::new();
    for attempt in 1..=ATTEMPTS {
        if state.vm.is_none() {
            match HostVm::boot(&with_checkout(cfg)) {
                Ok(vm) => {
                    eprintln!(
                        "pvsched-hostvm: host VM up in {:.1} s ({} vCPUs, kernel {})",
                        vm.boot_time().as_secs_f64(),
                        vm.cpus(),
                        vm.packages().kernel.release
                    );
                    state.vm = Some(vm);
                }
                Err(e) if e.is_host_vm_failure() => {
                    state.failures += 1;
                    notes.push(format!("attempt {attempt}: {e}"));
                    eprintln!("pvsched-hostvm: {name}: attempt {attempt}: {e}");
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
        let Some(vm) = state.vm.as_ref() else {
            continue;
        };
        match vm.exec(&cmd, timeout) {
            Ok((0, out)) => {
                if !notes.is_empty() {
                    eprintln!(
                        "pvsched-hostvm: {name} passed after {} host VM failure(s) or lost guest(s):\n{}",
                        notes.len(),
                        notes.join("\n")
                    );
                }
                return Ok(out);
            }
            Ok((_, out)) if out.contains(GUEST_LOST_MARKER) => {
                // Its KVM guest was lost (the test's panic unwound and killed
                // it): the test runs again, on a fresh host VM (6 s cached).
                // Reusing the one that lost it lost the next guests too: in
                // one CI-like run all three attempts of a test, with
                // whatever the lost attempt left behind (its kvm module
                // parameters, the emulated SVM's state).
                state.vm = None;
                let (line, tail) = lost_report(&out);
                notes.push(format!("attempt {attempt}: guest lost: {line}{tail}"));
                eprintln!(
                    "pvsched-hostvm: {name}: attempt {attempt}: {line}; running it again{tail}"
                );
            }
            Ok((rc, out)) => {
                let trouble = vm.kernel_trouble();
                let mut msg = format!("{name} failed inside the host VM (exit {rc}):\n{out}");
                if !trouble.is_empty() {
                    msg.push_str(&format!(
                        "\nthe host VM's kernel said:\n{}",
                        trouble.join("\n")
                    ));
                }
                return Err(Error::TestFailed(msg));
            }
            Err(Error::Vm(pvsched_vmtest::Error::CommandTimeout { console, .. }))
                if console.contains(GUEST_LOST_MARKER) =>
            {
                // The test ended as lost, but its command did not return
                // (something it started kept the console; CI saw it after a
                // guest reset): run it again, on a fresh host VM, as any lost guest.
                state.vm = None;
                let (line, tail) = lost_report(&console);
                notes.push(format!(
                    "attempt {attempt}: guest lost, command stuck: {line}{tail}"
                ));
                eprintln!(
                    "pvsched-hostvm: {name}: attempt {attempt}: {line}; the command did not \
                     return: running it again on another host VM"
                );
            }
            Err(e) if e.is_host_vm_failure() => {
                state.vm = None;
                state.failures += 1;
                notes.push(format!("attempt {attempt}: {e}"));
                eprintln!(
                    "pvsched-hostvm: {name}: attempt {attempt}: {e}; booting another host VM"
                );
            }
            Err(e) => return Err(e),
        }
    }
    Err(Error::HostVmFailed {
        reason: format!("{ATTEMPTS} attempts at {name} met host VM failures or lost guests"),
        kernel_log: notes.join("\n"),
    })
}

/// Lines of a lost guest's report kept after the marker's line: the end of
/// its console and kernel log, which say how it died (a reset, a panic).
const LOST_TAIL_LINES: usize = 20;

/// A stall report's lines on QEMU's run state and each vCPU's instruction
/// pointer, kept wherever they are (as is what QEMU said on its stderr when
/// it stopped a vCPU on an error).
fn is_vcpu_state(line: &str) -> bool {
    let l = line.trim_start();
    l.starts_with("QEMU status:") || l.starts_with("vCPU RIP ")
}

/// An IOAPIC pin no device uses: `info pic` lists all 24 of them.
fn is_masked_ioapic_pin(line: &str) -> bool {
    let l = line.trim_start();
    l.starts_with("pin ") && l.contains(" masked ") && l.contains("vec=0 ")
}

/// The marker's line of a lost guest's test output, and the (indented) lines
/// before the panic's own notes that follow it: without them a note says
/// only "QEMU exited", as CI's did for three lost attempts in a row.
fn lost_report(out: &str) -> (&str, String) {
    let mut lines = out.lines().skip_while(|l| !l.contains(GUEST_LOST_MARKER));
    let line = lines.next().unwrap_or_default();
    let report: Vec<&str> = lines
        .take_while(|l| !l.starts_with("note: ") && !l.starts_with("stack backtrace:"))
        .filter(|l| !l.trim().is_empty() && !is_masked_ioapic_pin(l))
        .collect();
    // Where each vCPU was (wherever the stall report says it) and how the guest
    // ended (the console's and kernel log's last lines).
    let from = report.len().saturating_sub(LOST_TAIL_LINES);
    let mut in_stderr = false;
    let vcpus = report[..from].iter().filter(|l| {
        let l = l.trim_start();
        if l.starts_with("QEMU stderr:") {
            in_stderr = true;
        } else if l.starts_with("kernel log tail:") {
            in_stderr = false;
        }
        in_stderr || is_vcpu_state(l)
    });
    let kept = vcpus.chain(&report[from..]);
    let tail = kept.map(|l| format!("\n    {l}")).collect::<String>();
    (line, tail)
}

/// A test that runs inside the host VM (see the module docs):
///
/// ```ignore
/// pvsched_hostvm::kvm_test! {
///     /// A KVM guest's HLT exits reach the policy.
///     fn hlt_exits_start_halt_boosts() {
///         // runs inside the host VM, with /dev/kvm
///     }
/// }
/// ```
#[macro_export]
macro_rules! kvm_test {
    ($(#[$meta:meta])* fn $name:ident() $body:block) => {
        $(#[$meta])*
        #[test]
        fn $name() {
            if $crate::in_host_vm() {
                $body
            } else {
                match $crate::run_test(
                    stringify!($name),
                    &$crate::HostVmConfig::new("test"),
                    $crate::TEST_TIMEOUT,
                ) {
                    Ok(out) => println!("{out}"),
                    Err(e) => panic!("{e}"),
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_guest_report_keeps_the_vcpus_and_the_console_tail_before_the_panic_notes() {
        let out = format!(
            "running 1 test\npanicked at x.rs:1:\n{GUEST_LOST_MARKER} the KVM guest stopped \
             answering: VM v: QEMU exited (exit status: 0); stderr:\n\nconsole tail:\n\
             Kernel panic - not syncing: x\nkernel log tail:\n[ 1.0] y\n\
             note: run with `RUST_BACKTRACE=1`\nlater"
        );
        let (line, tail) = lost_report(&out);
        assert!(line.starts_with(GUEST_LOST_MARKER), "{line}");
        assert_eq!(
            tail,
            "\n    console tail:\n    Kernel panic - not syncing: x\n    kernel log tail:\n    [ 1.0] y"
        );
        let long: String = (0..50).map(|i| format!("l{i}\n")).collect();
        let (_, tail) = lost_report(&format!("{GUEST_LOST_MARKER}\n{long}"));
        assert_eq!(tail.lines().count(), LOST_TAIL_LINES + 1, "{tail}");
        assert!(tail.ends_with("l49"), "{tail}");

        // A stall report's vCPU lines are kept however long its APIC
        // state; the pins no device uses are not.
        let pins: String = (0..24)
            .map(|i| format!("  pin {i} 0x0000000000010000 dest=0 vec=0   active-hi edge  masked fixed  physical\n"))
            .collect();
        let (_, tail) = lost_report(&format!(
            "{GUEST_LOST_MARKER}\nQEMU status: running\nvCPU RIP 0xffffffffc0001234 (in a module) \
             RFL 0x46 (interrupts off)\n{pins}{long}"
        ));
        assert!(
            tail.starts_with("\n    QEMU status: running\n    vCPU RIP 0xffffffffc0001234"),
            "{tail}"
        );
        assert!(!tail.contains("pin "), "{tail}");
        assert_eq!(tail.lines().count(), LOST_TAIL_LINES + 3, "{tail}");
    }

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(shell_quote("a'b"), r"'a'\''b'");
        assert_eq!(shell_quote("/x/y"), "'/x/y'");
    }
}
