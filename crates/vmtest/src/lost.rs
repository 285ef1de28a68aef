//! A guest lost to the emulation, told from a result.
//!
//! Now and then a guest under QEMU's TCG stops answering with no message from
//! its kernel: a command's reply stops mid-line and XON does not restart it
//! (CI saw it once in `e2e_daemon`, 50 s of silence; README, "Lost guests").
//! Such a failure says nothing about pvsched. [`rerun_if_guest_lost`] runs a
//! test body again on a fresh guest when it happened, at most [`ATTEMPTS`]
//! times, each said; a guest that still answers, or whose kernel reported a
//! fault (pvsched's module may be in it), is a result and fails the test. A
//! stall pvsched caused would come back in the next attempt, and fail it.
//!
//! So that the next such stall can be explained, a reply that never ended
//! carries [`stall_report`]: QEMU's run state, each vCPU's instruction
//! pointer and interrupt flag, each local APIC and the interrupt
//! controllers. Guests boot with `nokaslr`, so an address is named from the
//! kernel's `System.map` where that is real (Debian's is a stub: read
//! `/proc/kallsyms` in any guest of the same kernel).

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::time::Duration;

use crate::error::Error;
use crate::vm::Vm;

/// A `#[test]` run again on a fresh guest when the emulation lost its guest
/// ([`rerun_if_guest_lost`]). The test file defines
/// `fn replace_lost_guest(panic_text: &str) -> Option<String>`: it boots its
/// shared guest again (or lets the next run boot its own) and says why, when
/// [`guest_lost`] or [`stalled_without_fault`] says the guest was lost.
#[macro_export]
macro_rules! guest_test {
    ($(#[$meta:meta])* fn $name:ident() $body:block) => {
        $(#[$meta])*
        #[test]
        fn $name() {
            $crate::rerun_if_guest_lost(stringify!($name), || $body, replace_lost_guest);
        }
    };
}

/// Runs of a test body [`rerun_if_guest_lost`] makes at most.
pub const ATTEMPTS: usize = 2;

/// In a [`Error::CommandTimeout`]'s console text when the reply never ended.
pub const NO_END_MARKER: &str = "[no end marker;";

/// Tries of `true`, and the bound on each, before a guest counts as gone.
const ALIVE_TRIES: usize = 2;
const ALIVE_TIMEOUT: Duration = Duration::from_secs(30);

/// Lines of the kernel log that say its kernel saw a fault: such a guest is a
/// result (the fault may be pvsched's), never retried.
const KERNEL_FAULTS: &[&str] = &["Call Trace", "Kernel panic", "BUG:", "Oops"];

impl Error {
    /// Whether this is a reply that stopped mid-way: a timeout the guest did
    /// not report itself (it kills a command at its timeout and says so).
    pub fn is_stall(&self) -> bool {
        matches!(
            self,
            Error::CommandTimeout {
                answered: false,
                ..
            }
        )
    }
}

impl Vm {
    /// Whether the guest runs `true` within `timeout`, in one of `tries`.
    pub fn answers(&self, tries: usize, timeout: Duration) -> bool {
        (0..tries).any(|_| matches!(self.exec("true", timeout), Ok((0, _))))
    }
}

/// Why `vm` counts as lost to the emulation after a test panicked with
/// `message`, or `None` when the failure is a result: its kernel reported a
/// fault, or it stopped mid-reply / no longer answers without one.
pub fn guest_lost(vm: &Vm, message: &str) -> Option<String> {
    if reports_fault(&vm.kernel_log()) {
        return None;
    }
    if message.contains(NO_END_MARKER) {
        return Some("a reply stopped mid-way".into());
    }
    if !vm.answers(ALIVE_TRIES, ALIVE_TIMEOUT) {
        return Some("it no longer runs `true`".into());
    }
    None
}

/// Whether a test's panic text is a reply that stopped mid-way whose quoted
/// kernel log shows no fault: for a test whose guest is gone with the test
/// (it booted its own), where [`guest_lost`] has no guest to ask.
pub fn stalled_without_fault(panic_text: &str) -> bool {
    panic_text.contains(NO_END_MARKER) && !reports_fault(panic_text)
}

/// Whether kernel log text shows a fault ([`KERNEL_FAULTS`]).
fn reports_fault(log: &str) -> bool {
    KERNEL_FAULTS.iter().any(|f| log.contains(f))
}

/// Runs `body`; when it panics, asks `replace_lost` (given the panic's text)
/// whether its guest was lost, in which case `replace_lost` has booted a
/// fresh one and `body` runs again, at most [`ATTEMPTS`] times in all. Any
/// other panic, and the last attempt's, goes on unwinding.
pub fn rerun_if_guest_lost(
    test: &str,
    mut body: impl FnMut(),
    mut replace_lost: impl FnMut(&str) -> Option<String>,
) {
    for attempt in 1..=ATTEMPTS {
        let payload = match panic::catch_unwind(AssertUnwindSafe(&mut body)) {
            Ok(()) => {
                if attempt > 1 {
                    eprintln!("pvsched-vmtest: {test} passed in attempt {attempt} of {ATTEMPTS}");
                }
                return;
            }
            Err(payload) => payload,
        };
        if attempt < ATTEMPTS {
            if let Some(why) = replace_lost(&panic_text(&*payload)) {
                eprintln!(
                    "pvsched-vmtest: {test}: attempt {attempt} of {ATTEMPTS} lost its guest \
                     ({why}): running it again on a fresh guest"
                );
                continue;
            }
        }
        panic::resume_unwind(payload);
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// QEMU's run state, each vCPU's instruction pointer (named where the guest
/// kernel's `System.map` names it) and interrupt flag, each local APIC and
/// the interrupt controllers; what QEMU did not answer is said.
pub fn stall_report(vm: &Vm) -> String {
    let ask = |request: &str| {
        vm.qmp(request)
            .map(|r| qmp_return(&r))
            .unwrap_or_else(|e| format!("no answer: {e}"))
    };
    let hmp = |command: &str| {
        ask(&serde_json::json!({
            "execute": "human-monitor-command",
            "arguments": {"command-line": command},
        })
        .to_string())
    };
    let status = ask(r#"{"execute":"query-status"}"#);
    let registers = hmp("info registers -a");
    let map =
        fs::read_to_string(Path::new("/boot").join(format!("System.map-{}", vm.kernel_release())))
            .unwrap_or_default();
    let symbols = text_symbols(&map);
    let mut report = format!("QEMU status: {status}\n");
    for (rip, flags) in instruction_pointers(&registers) {
        let name = if symbols.is_empty() {
            String::new() // Debian's System.map is a stub: /proc/kallsyms of a nokaslr guest
        } else {
            name_of(&symbols, rip)
        };
        let interrupts = if flags & IF_FLAG != 0 { "on" } else { "off" };
        report += &format!("vCPU RIP {rip:#x} {name} RFL {flags:#x} (interrupts {interrupts})\n");
    }
    // Whether an interrupt is pending, in service or armed (a halted guest
    // with interrupts on that no interrupt wakes, timer and serial alike).
    for cpu in 0..vm.guest_cpus() {
        report += &format!(
            "info lapic {cpu}:\n{}\n",
            hmp(&format!("info lapic {cpu}")).trim_end()
        );
    }
    report += &format!("info pic:\n{}\n", hmp("info pic").trim_end());
    // A vCPU QEMU stopped on (KVM's "internal error", its suberror and the
    // instruction bytes) is said on QEMU's stderr only.
    if status.contains("internal-error") || status.contains("guest-panicked") {
        let stderr = fs::read_to_string(vm.dir().join("qemu.stderr")).unwrap_or_default();
        report += &format!("QEMU stderr:\n{}\n", tail_lines(&stderr, 40));
    }
    report
}

/// The last `n` lines of `text`.
fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The `return` member of a QMP reply, as text (HMP's output is a string).
fn qmp_return(reply: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(reply) {
        Ok(v) => match &v["return"] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => reply.to_string(),
            other => other.to_string(),
        },
        Err(_) => reply.to_string(),
    }
}

/// RFLAGS' interrupt flag.
const IF_FLAG: u64 = 0x200;

/// `RIP=<hex>` and the `RFL=<hex>` after it of each CPU in `info registers
/// -a` output, in CPU order.
fn instruction_pointers(registers: &str) -> Vec<(u64, u64)> {
    let hex = |w: &str, key: &str| {
        w.strip_prefix(key)
            .and_then(|h| u64::from_str_radix(h, 16).ok())
    };
    let mut found = Vec::new();
    let mut words = registers.split_whitespace();
    while let Some(w) = words.next() {
        if let Some(rip) = hex(w, "RIP=") {
            let flags = words.next().and_then(|f| hex(f, "RFL=")).unwrap_or(0);
            found.push((rip, flags));
        }
    }
    found
}

/// Text symbols of a `System.map`, sorted by address.
fn text_symbols(map: &str) -> Vec<(u64, &str)> {
    let mut symbols: Vec<(u64, &str)> = map
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let addr = u64::from_str_radix(f.next()?, 16).ok()?;
            let kind = f.next()?;
            let name = f.next()?;
            matches!(kind, "t" | "T").then_some((addr, name))
        })
        .collect();
    symbols.sort_unstable();
    symbols
}

/// `symbol+0xoff` for a kernel text address; modules (pvsched.ko among them)
/// live above the kernel's image, where `System.map` says nothing.
fn name_of(symbols: &[(u64, &str)], addr: u64) -> String {
    const MODULES_START: u64 = 0xffff_ffff_c000_0000;
    if addr >= MODULES_START {
        return "(in a module)".into();
    }
    match symbols.partition_point(|&(a, _)| a <= addr) {
        0 => "(not in the kernel's text)".into(),
        i => {
            let (start, name) = symbols[i - 1];
            format!("{name}+{:#x}", addr - start)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_is_a_timeout_the_guest_did_not_report() {
        let timeout = |answered| Error::CommandTimeout {
            vm: "v".into(),
            command: "c".into(),
            timeout: Duration::from_secs(1),
            answered,
            console: String::new(),
        };
        assert!(timeout(false).is_stall());
        assert!(!timeout(true).is_stall());
        assert!(!Error::Other("x".into()).is_stall());
    }

    #[test]
    fn instruction_pointers_are_named_from_the_system_map() {
        let map = "ffffffff81000000 T _text\n\
                   ffffffff81001000 t default_idle\n\
                   ffffffff81002000 D some_data\n\
                   ffffffff81003000 T do_idle\n";
        let symbols = text_symbols(map);
        let registers = "CPU#0\nRAX=0 RBX=1\nRIP=ffffffff81001010 RFL=00000246\n\
                         CPU#1\nRIP=ffffffffc0123456 RFL=00000002\n";
        let rips = instruction_pointers(registers);
        assert_eq!(
            rips,
            vec![(0xffffffff81001010, 0x246), (0xffffffffc0123456, 0x2)]
        );
        assert_eq!(name_of(&symbols, rips[0].0), "default_idle+0x10");
        assert_eq!(name_of(&symbols, 0xffffffff81002500), "default_idle+0x1500");
        assert_eq!(name_of(&symbols, rips[1].0), "(in a module)");
        assert_eq!(name_of(&symbols, 0x1000), "(not in the kernel's text)");
    }

    #[test]
    fn a_stall_counts_as_lost_only_without_a_kernel_fault_in_its_text() {
        let stall =
            format!("out\n{NO_END_MARKER} 3 console kicks so far]\nkernel log tail:\n[ 1.0] ok");
        assert!(stalled_without_fault(&stall));
        assert!(!stalled_without_fault(&format!(
            "{stall}\n[ 2.0] Call Trace:"
        )));
        assert!(!stalled_without_fault("assertion failed: 3 == 4"));
    }

    #[test]
    fn a_panic_that_is_not_a_lost_guest_unwinds_at_once() {
        let mut runs = 0;
        let result = panic::catch_unwind(AssertUnwindSafe(|| {
            rerun_if_guest_lost(
                "t",
                || {
                    runs += 1;
                    panic!("a result");
                },
                |_| None,
            )
        }));
        assert!(result.is_err());
        assert_eq!(runs, 1);
    }

    #[test]
    fn a_lost_guest_runs_the_body_again_at_most_attempts_times() {
        let (mut runs, mut asked) = (0, Vec::new());
        let result = panic::catch_unwind(AssertUnwindSafe(|| {
            rerun_if_guest_lost(
                "t",
                || {
                    runs += 1;
                    panic!("stalled {NO_END_MARKER} 3 kicks]");
                },
                |text| {
                    asked.push(text.to_string());
                    Some("a reply stopped mid-way".into())
                },
            )
        }));
        assert!(result.is_err());
        assert_eq!(runs, ATTEMPTS);
        assert_eq!(asked.len(), ATTEMPTS - 1);
        assert!(asked[0].contains(NO_END_MARKER));

        let mut runs = 0;
        rerun_if_guest_lost(
            "t",
            || {
                runs += 1;
                assert!(runs > 1, "first attempt lost");
            },
            |_| Some("lost".into()),
        );
        assert_eq!(runs, 2);
    }
}
