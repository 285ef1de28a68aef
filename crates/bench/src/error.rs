//! The bench's errors: each says what was being done and carries the
//! underlying error, so that one line on stderr (or in the report's Notes)
//! is enough to act on.

use std::io;

use pvsched_base::qmp::QmpError;
use pvsched_control::ControlError;
use pvsched_report::ReportError;

use pvsched_report::stats::ParseError;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Talking to pvschedd over its control socket failed.
    #[error("{what}: {source}")]
    Control { what: String, source: ControlError },

    /// pvschedd misbehaved: exited, refused, or did not serve the VM.
    #[error("{0}")]
    Daemon(String),

    /// A guest operation of the harness failed (image, boot, command).
    /// Boxed: the harness's errors carry console and stderr tails.
    #[error("{what}: {source}")]
    Guest {
        what: String,
        source: Box<pvsched_vmtest::Error>,
    },

    /// The guest module did not load (its output).
    #[error("the guest module did not load, so the pvsched mode cannot work: {output}")]
    GuestModule { output: String },

    /// A cyclictest histogram could not be read.
    #[error("{what}: {source}")]
    Histogram { what: String, source: ParseError },

    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },

    #[error("{what}: {source}")]
    Json {
        what: String,
        source: serde_json::Error,
    },

    /// A tool or file the run needs is not there.
    #[error("{what} not found: {hint}")]
    Missing { what: String, hint: String },

    /// No vCPU thread of QEMU was found (neither over QMP nor by name).
    #[error("found no vCPU threads in QEMU (pid {pid})")]
    NoVcpuThreads { pid: u32 },

    /// A tool's output is not what the bench expects.
    #[error("{what}: {msg}")]
    Parse { what: String, msg: String },

    /// The pvsched mode cannot run (no binaries, no region, an earlier failure).
    #[error("{0}")]
    PvschedUnavailable(String),

    #[error("{what}: {source}")]
    Qmp { what: String, source: QmpError },

    /// A plot could not be drawn or written, or has no font.
    #[error(transparent)]
    Report(#[from] ReportError),

    /// `sched_setattr` / `sched_getattr` on a host thread failed.
    #[error("{what}: {source}")]
    Sched { what: String, source: io::Error },

    /// A `--pvschedd-config` file that is not TOML.
    #[error("{what}: {source}")]
    Toml {
        what: String,
        source: toml::de::Error,
    },

    /// A host tool ran but failed (cc, gzip, cyclictest, stress-ng...).
    #[error("{what}: {detail}")]
    Tool { what: String, detail: String },

    /// A name on the command line (or in raw.json) that is not one of the choices.
    #[error("unknown {what} {given:?} ({choices})")]
    Unknown {
        what: &'static str,
        given: String,
        choices: &'static str,
    },

    /// Options that do not make a run, or a `--pvschedd-config` the bench refuses.
    #[error("{0}")]
    Usage(String),
}

pub type Result<T> = std::result::Result<T, BenchError>;

/// `map_err` helper: an [`io::Error`] while doing `what`.
pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> BenchError {
    let what = what.into();
    move |source| BenchError::Io { what, source }
}

/// `map_err` helper: a [`pvsched_vmtest::Error`] while doing `what`.
pub(crate) fn guest(what: impl Into<String>) -> impl FnOnce(pvsched_vmtest::Error) -> BenchError {
    let what = what.into();
    move |source| BenchError::Guest {
        what,
        source: Box::new(source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_what_was_being_done_and_the_cause() {
        let e = io("creating /x")(io::Error::from(io::ErrorKind::PermissionDenied));

        assert!(e.to_string().starts_with("creating /x: "), "{e}");
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn errors_can_travel_to_clap_and_between_threads() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<BenchError>();
    }

    #[test]
    fn a_report_error_converts_with_question_mark_and_keeps_its_message() {
        fn plot() -> std::result::Result<(), ReportError> {
            Err(ReportError::Plot {
                what: "/out/a.png".into(),
                msg: "disk full".into(),
            })
        }
        fn bench() -> Result<()> {
            plot()?;
            Ok(())
        }

        let e = bench().unwrap_err();

        assert!(matches!(e, BenchError::Report(_)), "{e:?}");
        assert_eq!(e.to_string(), "/out/a.png: disk full");
    }

    #[test]
    fn a_guest_error_keeps_its_source() {
        let e = guest("insmod")(pvsched_vmtest::Error::Other("no module".into()));

        assert_eq!(e.to_string(), "insmod: no module");
        assert!(std::error::Error::source(&e).is_some());
    }
}
