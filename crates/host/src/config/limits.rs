//! The limits of a VM as the configuration gives them (`[defaults]`,
//! `[vm.limits]`) and as `pvschedctl set` changes them at run time: one key
//! list, one parser, and the same checks for both.

use pvsched_policy::{AllowedPolicies, HostPolicy, VmLimits};
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Host policies a VM may be given, as config names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PolicyList(pub Vec<String>);

macro_rules! limits_config {
    ($( $(#[$doc:meta])* $field:ident : $ty:ty ),* $(,)?) => {
        /// Overrides of [`VmLimits`]: every key optional, named as the field.
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct LimitsConfig {
            /// Host policies that may be applied: any of other, batch, idle, fifo, rr.
            pub allowed: Option<PolicyList>,
            /// fifo or rr.
            pub boost_policy: Option<String>,
            $( $(#[$doc])* pub $field: Option<$ty>, )*
        }

        impl LimitsConfig {
            /// `base` with these overrides applied; `prefix` names the table
            /// in errors.
            pub fn apply(&self, base: &VmLimits, prefix: &str) -> Result<VmLimits, ConfigError> {
                let mut l = base.clone();
                if let Some(list) = &self.allowed {
                    l.allowed = parse_allowed(list, &format!("{prefix}allowed"))?;
                }
                if let Some(p) = &self.boost_policy {
                    l.boost_policy = parse_policy(p, &format!("{prefix}boost_policy"))?;
                }
                $( if let Some(v) = self.$field { l.$field = v; } )*
                l.validate().map_err(|e| {
                    let msg = e.to_string();
                    let key = msg.split_whitespace().next().unwrap_or("").trim_end_matches(':');
                    ConfigError::Invalid { path: String::new(), key: format!("{prefix}{key}"), msg }
                })?;
                Ok(l)
            }

            /// Every key `pvschedctl set` accepts.
            pub const KEYS: &'static [&'static str] = &["allowed", "boost_policy", $( stringify!($field) ),*];
        }
    };
}

limits_config! {
    boost_priority: u8,
    max_rt_priority: u8,
    deadline_priority: u8,
    nice_min: i8,
    nice_max: i8,
    honor_critical_sections: bool,
    honor_guest_rt: bool,
    honor_boost_request: bool,
    honor_pending_hint: bool,
    proactive_wake: bool,
    proactive_irq: bool,
    proactive_halt: bool,
    boost_only_against_rivals: bool,
    peer_vms_are_rivals: bool,
    speculative_boosts_need_rt_work: bool,
    halt_boost_ns: u64,
    proactive_boost_ns: u64,
    max_boost_ns: u64,
    demote_after_ns: u64,
    demoted_charge: u32,
    inconsistent_grace_ns: u64,
    throttle_ns: u64,
    boost_share_permille: u32,
    idle_poll_budget_permille: u32,
    fairness_window_ns: u64,
    budget_resume_permille: u32,
    speculative_reserve_permille: u32,
    latch_nice: i8,
    debt_nice: i8,
    cs_budget_ns: u64,
    cs_window_ns: u64,
    honor_lock_holders: bool,
    lock_extension_ns: u64,
    lock_debt_max_ns: u64,
    lock_repay_from_ns: u64,
    lock_extend_running: bool,
}

fn parse_policy(name: &str, key: &str) -> Result<HostPolicy, ConfigError> {
    HostPolicy::ALL
        .into_iter()
        .find(|p| p.name() == name)
        .ok_or_else(|| ConfigError::Invalid {
            path: String::new(),
            key: key.into(),
            msg: format!("unknown policy {name:?} (other, batch, idle, fifo, rr)"),
        })
}

fn parse_allowed(list: &PolicyList, key: &str) -> Result<AllowedPolicies, ConfigError> {
    let mut a = AllowedPolicies::NO_RT;
    a.batch = false;
    for name in &list.0 {
        match parse_policy(name, key)? {
            HostPolicy::Other => a.other = true,
            HostPolicy::Batch => a.batch = true,
            HostPolicy::Idle => a.idle = true,
            HostPolicy::Fifo => a.fifo = true,
            HostPolicy::Rr => a.rr = true,
        }
    }
    Ok(a)
}

/// The rule that keeps the daemon above every boost it applies (a boosted
/// vCPU must never delay its own unboost or throttle): every boost is
/// capped at `max_rt_priority`, which must stay below `daemon.priority`.
/// Checked for the configuration file and for every run-time change alike.
pub fn check_band(limits: &VmLimits, daemon_priority: u8, prefix: &str) -> Result<(), ConfigError> {
    if limits.max_rt_priority >= daemon_priority {
        return Err(ConfigError::Invalid {
            path: String::new(),
            key: format!("{prefix}max_rt_priority"),
            msg: format!(
                "{} must be below daemon.priority ({daemon_priority})",
                limits.max_rt_priority
            ),
        });
    }
    Ok(())
}

/// Parses one run-time tunable (`pvschedctl set KEY VALUE`) onto `base`
/// and checks the result by the same rules as the configuration file: the
/// limits' own (positive, ordered) and the priority band below the daemon's
/// `daemon_priority`.
pub fn set_limit(
    base: &VmLimits,
    key: &str,
    value: &str,
    daemon_priority: u8,
) -> Result<VmLimits, ConfigError> {
    if !LimitsConfig::KEYS.contains(&key) {
        return Err(ConfigError::Invalid {
            path: "set".into(),
            key: key.into(),
            msg: format!("unknown key; one of {}", LimitsConfig::KEYS.join(", ")),
        });
    }
    // Values are TOML: 8, true, "rr", ["other", "rr"]; a bare word is a string.
    let doc = format!("{key} = {value}");
    let parsed: Result<LimitsConfig, _> =
        toml::from_str(&doc).or_else(|_| toml::from_str(&format!("{key} = {value:?}")));
    let overrides = parsed.map_err(|e| ConfigError::Invalid {
        path: "set".into(),
        key: key.into(),
        msg: e.message().to_string(),
    })?;
    let as_set = |e| match e {
        ConfigError::Invalid { key, msg, .. } => ConfigError::Invalid {
            path: "set".into(),
            key,
            msg,
        },
        other => other,
    };
    let limits = overrides.apply(base, "").map_err(as_set)?;
    check_band(&limits, daemon_priority, "").map_err(as_set)?;
    Ok(limits)
}

#[cfg(test)]
mod tests {
    use pvsched_policy::{HostPolicy, VmLimits};

    use super::*;

    #[test]
    fn set_parses_values_as_toml_and_validates_them() {
        let base = VmLimits::default();

        assert_eq!(
            set_limit(&base, "boost_priority", "9", 5)
                .unwrap()
                .boost_priority,
            9
        );
        assert_eq!(
            set_limit(&base, "boost_policy", "fifo", 5)
                .unwrap()
                .boost_policy,
            HostPolicy::Fifo
        );
        assert!(
            !set_limit(&base, "proactive_wake", "false", 5)
                .unwrap()
                .proactive_wake
        );
        assert!(set_limit(&base, "boost_priority", "0", 5).is_err());
        assert!(set_limit(&base, "nope", "1", 5)
            .unwrap_err()
            .to_string()
            .contains("unknown key"));
    }

    #[test]
    fn set_refuses_a_cap_at_or_above_the_daemons_priority() {
        let base = VmLimits::default();

        let err = set_limit(&base, "max_rt_priority", "50", 5).unwrap_err();

        assert!(err.to_string().contains("below daemon.priority"), "{err}");
        assert!(set_limit(&base, "max_rt_priority", "5", 5).is_err());
        assert_eq!(
            set_limit(&base, "max_rt_priority", "4", 5)
                .unwrap()
                .max_rt_priority,
            4
        );
    }
}
