//! What the message-passing scenario switches between sessions: the
//! guest module's idle mode, the host's KVM halt polling, and pvschedd
//! (started per block) with its idle advice.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pvsched_base::kvm_params::{self, HaltPoll};
use pvsched_control::{ApplyTarget, Request, Response};
use pvsched_vmtest::Accel;
use serde_json::Value;

use super::model::*;
use super::session::Bench;
use crate::daemon::{Daemon, Locator, VM_NAME};
use crate::error::{guest, BenchError, Result};
use crate::guest_idle::*;
use crate::harness::journal::{first_line, Journaled};

impl Bench<'_> {
    /// The idle debugfs file now; None when the module has none.
    pub(super) fn idle_file(&self) -> Result<Option<IdleFile>> {
        let (rc, out) = self
            .vm
            .exec(&format!("cat {IDLE_FILE}"), Duration::from_secs(30))
            .map_err(guest("reading the idle debugfs file"))?;
        if rc != 0 {
            return Ok(None);
        }
        parse_idle(&out).map(Some)
    }

    /// Puts the idle driver in `case`'s mode: through the module's writable
    /// parameters when pvsched.ko is loaded (`idle` last: writing it switches
    /// the driver), else `insmod pvsched.ko PARAMS`; then checks the mode;
    /// returns the driver's header line (or why there is none, for `default`).
    /// No reload between cases: a reload re-patches every tracepoint call
    /// site, which QEMU 7.2's multi-threaded TCG mishandles now and then
    /// (guest/README.md).
    pub(super) fn load_module(&mut self, case: IdleCase, params: &str) -> Result<String> {
        let loaded = self
            .vm
            .exec("test -d /sys/module/pvsched", Duration::from_secs(30))
            .map_err(guest("looking for pvsched.ko"))?
            .0
            == 0;
        let (rc, out) = if loaded {
            let mut kvs: Vec<(&str, &str)> = params
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .collect();
            kvs.sort_by_key(|(k, _)| *k == "idle");
            let script = kvs
                .iter()
                .map(|(k, v)| format!("echo {v} > /sys/module/pvsched/parameters/{k}"))
                .collect::<Vec<_>>()
                .join(" && ");
            self.vm
                .exec(&script, Duration::from_secs(60))
                .map_err(guest(format!("switching pvsched.ko to {params}")))?
        } else {
            self.vm
                .insmod(params)
                .map_err(guest(format!("insmod pvsched.ko {params}")))?
        };
        // The kernel ignores parameters a module does not know, with a warning.
        let warnings = self
            .vm
            .exec(
                "dmesg | grep -i 'pvsched' | grep -i 'parameter' | tail -n 3",
                Duration::from_secs(30),
            )
            .map(|(_, o)| o.trim().to_string())
            .unwrap_or_default();
        if rc != 0 {
            return Err(BenchError::Tool {
                what: format!("insmod pvsched.ko {params}"),
                detail: format!("exit {rc}: {} {warnings}", out.trim()),
            });
        }
        let header = |f: &IdleFile| f.header_line.clone();
        match (case, self.idle_file()?) {
            // `idle=off` (default and the KVM polling cases): no driver registered.
            (_, None) if case.driver_mode() == "off" => Ok(format!(
                "no idle driver in pvsched.ko ({IDLE_FILE} absent): the kernel's default idle"
            )),
            (_, Some(f)) if case.driver_mode() == "off" && f.mode == "off" && !f.registered => {
                Ok(header(&f))
            }
            (_, Some(f)) if f.mode == case.driver_mode() && f.registered => Ok(header(&f)),
            (_, Some(f)) => Err(BenchError::Tool {
                what: format!("insmod pvsched.ko {params}"),
                detail: format!(
                    "the idle driver is not in mode {} and registered: {}",
                    case.driver_mode(),
                    header(&f)
                ),
            }),
            (_, None) => Err(BenchError::Tool {
                what: format!("insmod pvsched.ko {params}"),
                detail: format!(
                    "pvsched.ko has no idle driver ({IDLE_FILE} absent){}",
                    if warnings.is_empty() {
                        String::new()
                    } else {
                        format!("; dmesg: {}", warnings.replace('\n', " / "))
                    }
                ),
            }),
        }
    }

    /// pvschedd serving the VM: found over QMP, else by thread names.
    pub(super) fn start_daemon(&mut self) -> Result<Daemon> {
        let region = self
            .vm
            .region_path()
            .ok_or_else(|| BenchError::PvschedUnavailable("the VM has no region file".into()))?
            .to_path_buf();
        let n = self.vcpus.len();
        // The polling budget the hinted driver is granted: the run's budget,
        // unless --pvschedd-config sets one.
        let mut overlay = self.s.base.pvschedd_overlay.clone();
        if let toml::Value::Table(d) = overlay
            .entry("defaults")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        {
            d.entry("idle_poll_budget_permille")
                .or_insert(toml::Value::Integer(i64::from(self.s.budget_permille)));
        }
        let overlay = &overlay;
        let by_qmp = Locator::Qmp(self.vm.qmp_socket().to_path_buf());
        match Daemon::start(
            &self.bins,
            &self.run_dir,
            &region,
            &by_qmp,
            n,
            overlay,
            None,
        ) {
            Ok(d) => Ok(d),
            Err(e) => {
                self.note(format!(
                    "pvschedd did not serve the VM found over QMP; trying again with its QEMU \
                     pid (thread names): {}",
                    first_line(&e.to_string())
                ));
                let by_pid = Locator::Pid(self.vm.qemu_pid());
                Daemon::start(
                    &self.bins,
                    &self.run_dir,
                    &region,
                    &by_pid,
                    n,
                    overlay,
                    None,
                )
            }
        }
    }

    /// `pvschedctl idle --json --budget-permille B` for the VM, over the
    /// daemon's control socket.
    pub(super) fn idle_report(&self) -> Result<Value> {
        let socket = self.socket();
        let req = Request::Idle {
            vm: Some(VM_NAME.to_string()),
            budget_permille: self.s.budget_permille,
        };
        match pvsched_control::call(&socket, &req, CONTROL_TIMEOUT) {
            Ok(Response::Idle(r)) => serde_json::to_value(r).map_err(|source| BenchError::Json {
                what: "pvschedd idle report".into(),
                source,
            }),
            Ok(Response::Error { message }) => {
                Err(BenchError::Daemon(format!("pvschedd idle: {message}")))
            }
            Ok(other) => Err(BenchError::Daemon(format!(
                "pvschedd idle: unexpected reply {other:?}"
            ))),
            Err(source) => Err(BenchError::Control {
                what: "pvschedd idle".into(),
                source,
            }),
        }
    }

    /// Sets KVM's halt polling for `case` through pvschedd (`off`: a cap of
    /// 0; `advisor`: `idle --apply host`, the advisor's host-wide window);
    /// the parameters now in force, or why the case cannot run here.
    pub(super) fn set_kvm_polling(
        &mut self,
        case: IdleCase,
    ) -> std::result::Result<HaltPoll, String> {
        if self.accel != Accel::Kvm {
            return Err("it sets KVM's halt polling: the guest must run under KVM".into());
        }
        let before = match kvm_params::read_halt_poll() {
            Ok(Some(p)) => p,
            Ok(None) => return Err("the kvm module is not loaded".into()),
            Err(e) => return Err(format!("reading the kvm parameters: {e}")),
        };
        match case {
            IdleCase::KvmPollOff => {
                let off = HaltPoll {
                    halt_poll_ns: 0,
                    ..before
                };
                kvm_params::write_halt_poll_to(Path::new(kvm_params::DEFAULT_DIR), &off)
                    .map_err(|e| format!("setting halt_poll_ns to 0: {e}"))?;
                self.kvm_poll_before = Some(before);
                Ok(off)
            }
            _ => {
                let req = Request::IdleApply {
                    vm: None,
                    budget_permille: self.s.budget_permille,
                    target: ApplyTarget::Host,
                };
                match pvsched_control::call(&self.socket(), &req, CONTROL_TIMEOUT) {
                    Ok(Response::Idle(r)) => r
                        .applied
                        .map(|a| a.after)
                        .ok_or_else(|| "pvschedd applied nothing".to_string()),
                    Ok(Response::Error { message }) => Err(format!("pvschedd: {message}")),
                    Ok(other) => Err(format!("pvschedd: unexpected reply {other:?}")),
                    Err(e) => Err(format!("pvschedd: {e}")),
                }
            }
        }
    }

    /// Puts KVM's halt polling back as it was before [`Self::set_kvm_polling`].
    pub(super) fn restore_kvm_polling(&mut self) -> Result<()> {
        if let Some(before) = self.kvm_poll_before.take() {
            return kvm_params::write_halt_poll_to(Path::new(kvm_params::DEFAULT_DIR), &before)
                .map_err(|e| BenchError::Daemon(format!("writing the kvm parameters: {e}")));
        }
        let req = Request::IdleApply {
            vm: None,
            budget_permille: self.s.budget_permille,
            target: ApplyTarget::Restore,
        };
        match pvsched_control::call(&self.socket(), &req, CONTROL_TIMEOUT) {
            Ok(Response::Idle(_)) => Ok(()),
            Ok(other) => Err(BenchError::Daemon(format!("pvschedd restore: {other:?}"))),
            Err(source) => Err(BenchError::Control {
                what: "pvschedd idle --apply restore".into(),
                source,
            }),
        }
    }

    /// pvschedd's control socket (where daemon::config_toml_vms puts it).
    pub(super) fn socket(&self) -> PathBuf {
        self.run_dir.join("pvschedd.sock")
    }
}

/// Bound on one control-socket request to pvschedd.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
