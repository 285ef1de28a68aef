//! Choosing the accelerator: KVM where it runs a stock guest, TCG otherwise,
//! and always a reason to print.

use std::path::Path;

use pvsched_vmtest::Accel;

use crate::error::BenchError;

/// What `--accel` asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccelChoice {
    Auto,
    Tcg,
    Kvm,
}

impl std::str::FromStr for AccelChoice {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        match s {
            "auto" => Ok(Self::Auto),
            "tcg" => Ok(Self::Tcg),
            "kvm" => Ok(Self::Kvm),
            _ => Err(BenchError::Unknown {
                what: "accelerator",
                given: s.to_string(),
                choices: "auto, tcg, kvm",
            }),
        }
    }
}

/// The first decision, before any boot: TCG with a reason, or "try KVM"
/// (a boot with KVM is the probe; if it fails the caller falls back to TCG
/// when the choice was `auto`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub accel: Accel,
    pub reason: String,
}

/// Facts about /dev/kvm, gathered apart from the decision (for tests).
#[derive(Clone, Debug)]
pub struct KvmFacts {
    /// Opening /dev/kvm read-write: Ok or the error.
    pub open: Result<(), String>,
    /// Loaded KVM modules (kvm_intel, kvm_amd, kvm_pvm...).
    pub modules: Vec<String>,
}

impl Default for KvmFacts {
    fn default() -> Self {
        KvmFacts {
            open: Ok(()),
            modules: Vec::new(),
        }
    }
}

impl KvmFacts {
    pub fn probe() -> KvmFacts {
        let open = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .map(|_| ())
            .map_err(|e| e.to_string());
        let modules = ["kvm_intel", "kvm_amd", "kvm_pvm"]
            .iter()
            .filter(|m| Path::new("/sys/module").join(m).exists())
            .map(|m| m.to_string())
            .collect();
        KvmFacts { open, modules }
    }
}

pub fn decide(choice: AccelChoice, facts: &KvmFacts) -> Decision {
    match choice {
        AccelChoice::Tcg => Decision {
            accel: Accel::Tcg,
            reason: "TCG, as asked (--accel tcg)".into(),
        },
        AccelChoice::Kvm => Decision {
            accel: Accel::Kvm,
            reason: "KVM, as asked (--accel kvm)".into(),
        },
        AccelChoice::Auto => {
            if let Err(e) = &facts.open {
                return Decision {
                    accel: Accel::Tcg,
                    reason: format!("TCG: /dev/kvm is not usable ({e})"),
                };
            }
            if facts.modules.iter().any(|m| m == "kvm_pvm") {
                return Decision {
                    accel: Accel::Tcg,
                    reason: "TCG: /dev/kvm is provided by kvm_pvm, which runs only PVM-aware \
                             guest kernels; a stock guest kernel aborts with -cpu host (\"failed \
                             to set MSR 0x10a\") or crawls through KVM's emulator with other CPU \
                             models. Under TCG, QEMU's main loop delivers the guest's timers, so \
                             it is on the guest's latency path too"
                        .into(),
                };
            }
            Decision {
                accel: Accel::Kvm,
                reason: format!(
                    "KVM: /dev/kvm opens ({}); probing it with the guest's boot",
                    if facts.modules.is_empty() {
                        "module unknown".to_string()
                    } else {
                        facts.modules.join(", ")
                    }
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_without_dev_kvm_chooses_tcg_and_says_why() {
        let facts = KvmFacts {
            open: Err("No such file or directory".into()),
            modules: vec![],
        };
        let d = decide(AccelChoice::Auto, &facts);
        assert_eq!(d.accel, Accel::Tcg);
        assert!(d.reason.contains("No such file"));
    }

    #[test]
    fn auto_on_kvm_pvm_chooses_tcg_and_names_it() {
        let facts = KvmFacts {
            open: Ok(()),
            modules: vec!["kvm_pvm".into()],
        };
        let d = decide(AccelChoice::Auto, &facts);
        assert_eq!(d.accel, Accel::Tcg);
        assert!(d.reason.contains("kvm_pvm"));
    }

    #[test]
    fn auto_with_real_kvm_probes_kvm() {
        let facts = KvmFacts {
            open: Ok(()),
            modules: vec!["kvm_intel".into()],
        };
        assert_eq!(decide(AccelChoice::Auto, &facts).accel, Accel::Kvm);
    }

    #[test]
    fn explicit_choices_are_obeyed() {
        let facts = KvmFacts::default();
        assert_eq!(decide(AccelChoice::Tcg, &facts).accel, Accel::Tcg);
        assert_eq!(decide(AccelChoice::Kvm, &facts).accel, Accel::Kvm);
    }
}
