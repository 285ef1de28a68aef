//! Program statistics and test runs: the kernel's per-program run counts
//! and times, and BPF_PROG_TEST_RUN of the KVM programs (their tracepoints
//! only fire where KVM runs a guest).

use std::os::fd::{AsRawFd, OwnedFd};

use serde::Serialize;

use super::BpfSource;
use crate::events::EventSourceError;

/// Program fds kept for BPF_PROG_TEST_RUN (selftest only).
pub(crate) struct TestProgs {
    pub(crate) kvm_exit: OwnedFd,
    pub(crate) kvm_vcpu_wakeup: Option<OwnedFd>,
    pub(crate) kvm_apic_accept_irq: Option<OwnedFd>,
}

/// Run count and run time of one program, from the kernel's BPF stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProgStats {
    pub name: &'static str,
    /// Runs counted while stats were enabled.
    pub run_cnt: u64,
    /// Total run time in ns while stats were enabled.
    pub run_time_ns: u64,
}

/// Turns on the kernel's per-program run-time accounting (BPF_ENABLE_STATS)
/// for as long as the returned descriptor is open. Costs two clock reads
/// per program run; off by default.
pub fn enable_run_time_stats() -> Result<OwnedFd, EventSourceError> {
    // SAFETY: BPF_ENABLE_STATS takes no pointers; it returns a new fd or an error.
    let fd = unsafe {
        libbpf_rs::libbpf_sys::bpf_enable_stats(libbpf_rs::libbpf_sys::BPF_STATS_RUN_TIME)
    };
    if fd < 0 {
        return Err(EventSourceError::Io {
            what: "BPF_ENABLE_STATS".into(),
            source: std::io::Error::from_raw_os_error(-fd),
        });
    }
    // SAFETY: fd is a new descriptor (checked >= 0 above), owned by nobody else.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

impl BpfSource {
    /// Per-program run counts and times (zero unless stats are enabled, see
    /// [`enable_run_time_stats`]).
    pub fn prog_stats(&self) -> Vec<ProgStats> {
        self.prog_fds
            .iter()
            .map(|(name, fd)| {
                let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
                let mut len = std::mem::size_of_val(&info) as u32;
                // SAFETY: info and len are ours; the kernel writes at most len bytes.
                let r = unsafe {
                    libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(
                        fd.as_raw_fd(),
                        &mut info,
                        &mut len,
                    )
                };
                if r != 0 {
                    return ProgStats {
                        name,
                        ..Default::default()
                    };
                }
                ProgStats {
                    name,
                    run_cnt: info.run_cnt,
                    run_time_ns: info.run_time_ns,
                }
            })
            .collect()
    }

    /// BPF_PROG_TEST_RUN of a raw_tp program with `args` as its arguments
    /// (raw_tp test runs take no repeat count: loop to measure).
    fn test_run(fd: &OwnedFd, args: &[u64]) -> Result<(), EventSourceError> {
        let mut ctx: Vec<u8> = args.iter().flat_map(|a| a.to_ne_bytes()).collect();
        let mut opts = libbpf_rs::libbpf_sys::bpf_test_run_opts {
            sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_test_run_opts>() as _,
            ctx_in: ctx.as_mut_ptr().cast(),
            ctx_size_in: ctx.len() as u32,
            ..Default::default()
        };
        // SAFETY: opts points at ctx bytes of ours that outlive the call.
        let r = unsafe { libbpf_rs::libbpf_sys::bpf_prog_test_run_opts(fd.as_raw_fd(), &mut opts) };
        if r != 0 {
            return Err(EventSourceError::Io {
                what: "BPF_PROG_TEST_RUN".into(),
                source: std::io::Error::from_raw_os_error(-r),
            });
        }
        Ok(())
    }

    /// Test only: runs the kvm_exit filter in the kernel, in the calling
    /// thread, as if the tracepoint fired with `(exit_reason, isa)`.
    #[doc(hidden)]
    pub fn selftest_kvm_exit(&self, exit_reason: u32, isa: u32) -> Result<(), EventSourceError> {
        let t = self
            .test_progs
            .as_ref()
            .ok_or_else(|| EventSourceError::Invalid("selftest off".into()))?;
        Self::test_run(&t.kvm_exit, &[exit_reason as u64, isa as u64])
    }

    /// Test only: runs the attached kvm_vcpu_wakeup program in the calling
    /// thread with the tracepoint's arguments.
    #[doc(hidden)]
    pub fn selftest_kvm_vcpu_wakeup(
        &self,
        ns: u64,
        waited: bool,
        valid: bool,
    ) -> Result<(), EventSourceError> {
        let t = self
            .test_progs
            .as_ref()
            .and_then(|t| t.kvm_vcpu_wakeup.as_ref());
        let t = t.ok_or_else(|| {
            EventSourceError::Invalid("selftest off or KVM programs not loaded".into())
        })?;
        Self::test_run(t, &[ns, waited as u64, valid as u64])
    }

    /// Test only: runs the attached kvm_apic_accept_irq program in the
    /// calling thread with the tracepoint's arguments.
    #[doc(hidden)]
    pub fn selftest_kvm_apic_accept_irq(
        &self,
        apicid: u32,
        dm: u16,
        tm: u16,
        vec: u8,
    ) -> Result<(), EventSourceError> {
        let t = self
            .test_progs
            .as_ref()
            .and_then(|t| t.kvm_apic_accept_irq.as_ref());
        let t = t.ok_or_else(|| {
            EventSourceError::Invalid("selftest off or KVM programs not loaded".into())
        })?;
        Self::test_run(t, &[apicid as u64, dm as u64, tm as u64, vec as u64])
    }
}
