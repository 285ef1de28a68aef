//! Scenario files: the host, its load, the VMs and their workloads, the modes to compare.
//! TOML, parsed strictly (unknown keys are errors); the shipped ones live in
//! `crates/sim/scenarios/` and are built in, so `--scenario NAME` works from anywhere.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::costs::{Costs, HaltPoll};
use crate::error::SimError;
use crate::guest::GuestIdle;

/// Shipped scenarios, by name.
pub const BUILT_IN: &[(&str, &str)] = &[
    ("busy-host", include_str!("../scenarios/busy-host.toml")),
    ("hostvm-busy", include_str!("../scenarios/hostvm-busy.toml")),
    ("idle-host", include_str!("../scenarios/idle-host.toml")),
    ("rogue-guest", include_str!("../scenarios/rogue-guest.toml")),
    ("lock-holder", include_str!("../scenarios/lock-holder.toml")),
    (
        "message-passing",
        include_str!("../scenarios/message-passing.toml"),
    ),
    ("fleet", include_str!("../scenarios/fleet.toml")),
];

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Simulated seconds per mode, after the warm-up.
    pub duration_s: f64,
    #[serde(default = "default_warmup")]
    pub warmup_s: f64,
    /// `kvm` or `tcg`.
    pub costs: String,
    /// Fields of the cost set to override.
    #[serde(default)]
    pub cost_overrides: CostOverrides,
    /// Modes compared, in order: vanilla, static-rt, pvsched, pvsched-doorbell (the guest
    /// rings when a boost's reason clears), pvsched-locks (that, and the guest publishes
    /// its lock waits: ABI 1.3's `F_LOCK_WAIT`, lock-holder extensions).
    pub modes: Vec<String>,
    /// The guest's idle driver [default: `fixed` if `guest_halt_poll_ns` > 0, else `halt`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_idle: Option<GuestIdle>,
    /// Runs of the whole scenario varying one setting (message-passing: halt polling, the
    /// guest idle driver, host load).
    #[serde(default)]
    pub variants: Vec<Variant>,
    pub host: HostSpec,
    #[serde(default)]
    pub vms: Vec<VmSpec>,
    #[serde(default)]
    pub pvsched: PvschedSpec,
}

fn default_warmup() -> f64 {
    1.0
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostOverrides {
    pub guest_slowdown: Option<f64>,
    pub exit_entry_ns: Option<u64>,
    pub host_switch_ns: Option<u64>,
    pub idle_wakeup_ns: Option<u64>,
    pub idle_exit_before_switch: Option<bool>,
    pub timer_latency_ns: Option<u64>,
    pub guest_switch_ns: Option<u64>,
    pub guest_irq_ns: Option<u64>,
    pub timer_via_main_loop: Option<bool>,
    pub main_loop_work_ns: Option<u64>,
    pub halt_poll: Option<HaltPoll>,
    pub guest_halt_poll_ns: Option<u64>,
    pub daemon_reaction_ns: Option<u64>,
    pub daemon_recheck_ns: Option<u64>,
}

impl CostOverrides {
    pub fn apply(&self, c: &mut Costs) {
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f { c.$f = v; } )* };
        }
        set!(
            guest_slowdown,
            exit_entry_ns,
            host_switch_ns,
            idle_wakeup_ns,
            idle_exit_before_switch,
            timer_latency_ns,
            guest_switch_ns,
            guest_irq_ns,
            timer_via_main_loop,
            main_loop_work_ns,
            halt_poll,
            guest_halt_poll_ns,
            daemon_reaction_ns,
            daemon_recheck_ns
        );
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    pub name: String,
    #[serde(default)]
    pub cost_overrides: CostOverrides,
    /// VMs (by name) left out of this variant's runs (a baseline without the rogue).
    #[serde(default)]
    pub drop_vms: Vec<String>,
    /// The guest's idle driver in this variant's runs [default: the scenario's].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_idle: Option<GuestIdle>,
    /// Host tasks added to `[host] tasks` in this variant's runs (an overloaded host).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_tasks: Vec<HostTaskSpec>,
    /// The VMs' `idle_poll_budget_permille` in this variant's runs [default: the
    /// scenario's `[pvsched]` one, else pvschedd's].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_poll_budget_permille: Option<u32>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    pub cpus: u32,
    /// The fair class: `eevdf` (Linux >= 6.6; this project's machines run 6.18) or `cfs`
    /// (Linux 6.1, Debian 12's kernel).
    #[serde(default)]
    pub fair: crate::host::FairModel,
    #[serde(default)]
    pub tasks: Vec<HostTaskSpec>,
}

/// A host thread's scheduling class as a scenario names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyName {
    #[default]
    Normal,
    Fifo,
    Rr,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "kebab-case")]
pub enum HostTaskSpec {
    /// Always runnable (stress-ng --cpu, --vm).
    Hog {
        #[serde(default = "one")]
        count: u32,
        #[serde(default)]
        nice: i8,
    },
    /// Runs then sleeps, each exponentially distributed (stress-ng --fork, --iomix).
    Bursty {
        #[serde(default = "one")]
        count: u32,
        run_us: u64,
        sleep_us: u64,
    },
    /// Time the machine itself loses on every CPU: a pinned thread above every priority
    /// running `run_us` every `every_us` (both exponential). Models a test machine that is
    /// itself a VM (steal time, its hypervisor's interrupts): the floor of its measured
    /// latencies.
    Steal { run_us: u64, every_us: u64 },
    /// cyclictest threads, thread k pinned to CPU k mod cpus (`-a`): their wakeup latency is
    /// the host's latency figure.
    Periodic {
        #[serde(default = "one")]
        count: u32,
        interval_us: u64,
        #[serde(default = "five")]
        work_us: u64,
        #[serde(default)]
        policy: PolicyName,
        #[serde(default)]
        prio: u8,
    },
}

fn one() -> u32 {
    1
}
fn five() -> u64 {
    5
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSpec {
    pub name: String,
    #[serde(default = "one")]
    pub count: u32,
    pub vcpus: u32,
    #[serde(default)]
    pub tasks: Vec<GuestTaskSpec>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LockKind {
    /// A sleeping lock (mutex, rwsem writer): waiters block, the holder hands over.
    #[default]
    Mutex,
    /// A spinlock: waiters spin on their vCPU (FIFO hand-over, as a ticket/queued lock).
    Spin,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "kebab-case")]
pub enum GuestTaskSpec {
    /// cyclictest in the guest, one thread per vCPU: the guest's latency figure.
    Periodic {
        interval_us: u64,
        #[serde(default = "five")]
        work_us: u64,
        #[serde(default)]
        policy: PolicyName,
        #[serde(default)]
        prio: u8,
    },
    /// An audio-like task on vCPU 0: `work_us` per `period_us`, a glitch when a period's
    /// work ends after the next period starts.
    Audio {
        period_us: u64,
        work_us: u64,
        #[serde(default)]
        policy: PolicyName,
        #[serde(default)]
        prio: u8,
    },
    /// An always-runnable task per vCPU (`policy = "fifo"`: the rogue's rtspin).
    Hog {
        #[serde(default)]
        policy: PolicyName,
        #[serde(default)]
        prio: u8,
    },
    /// Threads per vCPU taking one of `locks` locks in turn: `outside_us` of work, then the
    /// lock for `hold_us`.
    Lock {
        #[serde(default = "one")]
        threads_per_vcpu: u32,
        #[serde(default = "one")]
        locks: u32,
        #[serde(default)]
        lock_kind: LockKind,
        outside_us: u64,
        hold_us: u64,
        /// Spinlocks: a waiter halts after spinning this long and the releaser kicks it
        /// (paravirt qspinlock); 0 spins without limit.
        #[serde(default)]
        spin_limit_us: u64,
    },
    /// Two tasks on vCPUs 0 and 1 passing a message back and forth (each wakes the other
    /// through an IPI when on another vCPU), `work_us` per message; the starter waits an
    /// exponentially distributed `gap_us` (mean) before each round trip (0: closed loop).
    PingPong {
        work_us: u64,
        #[serde(default)]
        gap_us: u64,
    },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PvschedSpec {
    /// SCHED_RR priority of every vCPU thread in the static-rt mode.
    pub static_rt_priority: u8,
    /// Boost the VMM's main loop with the VM's strongest boost (pvschedd's
    /// `boost_latency_path`).
    pub boost_latency_path: bool,
    /// VmLimits overrides (the names of pvschedd's `[defaults]` keys).
    pub boost_share_permille: Option<u32>,
    pub demoted_charge: Option<u32>,
    pub demote_after_ns: Option<u64>,
    pub max_boost_ns: Option<u64>,
    pub throttle_ns: Option<u64>,
    pub cs_budget_ns: Option<u64>,
    pub cs_window_ns: Option<u64>,
    /// The poll budget told to the hinted idle driver (0: none, the module's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_poll_budget_permille: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boost_only_against_rivals: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_vms_are_rivals: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative_boosts_need_rt_work: Option<bool>,
}

impl Default for PvschedSpec {
    fn default() -> PvschedSpec {
        PvschedSpec {
            static_rt_priority: 8,
            boost_latency_path: true,
            boost_share_permille: None,
            demoted_charge: None,
            demote_after_ns: None,
            max_boost_ns: None,
            throttle_ns: None,
            cs_budget_ns: None,
            cs_window_ns: None,
            idle_poll_budget_permille: None,
            boost_only_against_rivals: None,
            peer_vms_are_rivals: None,
            speculative_boosts_need_rt_work: None,
        }
    }
}

impl PvschedSpec {
    pub fn limits(&self) -> Result<pvsched_policy::VmLimits, SimError> {
        let mut l = pvsched_policy::VmLimits::default();
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f { l.$f = v; } )* };
        }
        set!(
            boost_share_permille,
            demoted_charge,
            demote_after_ns,
            max_boost_ns,
            throttle_ns,
            cs_budget_ns,
            cs_window_ns,
            idle_poll_budget_permille,
            boost_only_against_rivals,
            peer_vms_are_rivals,
            speculative_boosts_need_rt_work
        );
        l.validate().map_err(|e| SimError::Scenario {
            what: "[pvsched]".into(),
            msg: e.to_string(),
        })?;
        Ok(l)
    }
}

pub const MODES: &[&str] = &[
    "vanilla",
    "static-rt",
    "pvsched",
    "pvsched-doorbell",
    "pvsched-locks",
    "pvsched-scx",
];

impl Scenario {
    /// A built-in name or a path to a TOML file.
    pub fn load(name_or_path: &str) -> Result<Scenario, SimError> {
        if let Some((_, text)) = BUILT_IN.iter().find(|(n, _)| *n == name_or_path) {
            return Scenario::parse(text, name_or_path);
        }
        let path = Path::new(name_or_path);
        let text = std::fs::read_to_string(path).map_err(|source| SimError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Scenario::parse(&text, name_or_path)
    }

    pub fn parse(text: &str, what: &str) -> Result<Scenario, SimError> {
        let s: Scenario = toml::from_str(text).map_err(|e| SimError::Scenario {
            what: what.into(),
            msg: e.to_string(),
        })?;
        s.check(what)?;
        Ok(s)
    }

    fn check(&self, what: &str) -> Result<(), SimError> {
        let bad = |msg: String| SimError::Scenario {
            what: what.into(),
            msg,
        };
        if !(self.duration_s > 0.0 && self.duration_s <= 3600.0) {
            return Err(bad(format!(
                "duration_s must be in (0, 3600], not {}",
                self.duration_s
            )));
        }
        if !(self.warmup_s >= 0.0 && self.warmup_s <= 600.0) {
            return Err(bad(format!(
                "warmup_s must be in [0, 600], not {}",
                self.warmup_s
            )));
        }
        if Costs::by_name(&self.costs).is_none() {
            return Err(bad(format!(
                "costs must be kvm, kvm-hostvm or tcg, not {:?}",
                self.costs
            )));
        }
        if self.modes.is_empty() {
            return Err(bad("modes is empty".into()));
        }
        for m in &self.modes {
            if !MODES.contains(&m.as_str()) {
                return Err(bad(format!(
                    "unknown mode {m:?} (known: {})",
                    MODES.join(", ")
                )));
            }
        }
        if self.host.cpus == 0 || self.host.cpus > 64 {
            return Err(bad(format!(
                "host.cpus must be 1..=64, not {}",
                self.host.cpus
            )));
        }
        let variant_tasks = self.variants.iter().flat_map(|v| v.host_tasks.iter());
        for t in self.host.tasks.iter().chain(variant_tasks) {
            if let HostTaskSpec::Periodic {
                interval_us,
                policy,
                prio,
                ..
            } = t
            {
                if *interval_us == 0 {
                    return Err(bad("a host periodic task needs interval_us > 0".into()));
                }
                check_prio(*policy, *prio).map_err(bad)?;
            }
        }
        let runs: Vec<Option<&Variant>> = if self.variants.is_empty() {
            vec![None]
        } else {
            self.variants.iter().map(Some).collect()
        };
        for v in runs {
            let idle = self.guest_idle_for(v);
            let window = self.costs_for(v).guest_halt_poll_ns;
            let which = v.map_or(String::new(), |v| format!("variant {}: ", v.name));
            if idle == GuestIdle::Fixed && window == 0 {
                return Err(bad(format!(
                    "{which}guest_idle = \"fixed\" needs guest_halt_poll_ns > 0 (its window)"
                )));
            }
            if idle != GuestIdle::Fixed && window > 0 {
                return Err(bad(format!(
                    "{which}guest_halt_poll_ns is the window of guest_idle = \"fixed\", not of {:?}",
                    idle.name()
                )));
            }
        }
        for vm in &self.vms {
            if vm.vcpus == 0 || vm.vcpus > 64 {
                return Err(bad(format!("vm {}: vcpus must be 1..=64", vm.name)));
            }
            for t in &vm.tasks {
                match t {
                    GuestTaskSpec::Periodic {
                        interval_us,
                        policy,
                        prio,
                        ..
                    } => {
                        if *interval_us == 0 {
                            return Err(bad(format!("vm {}: interval_us must be > 0", vm.name)));
                        }
                        check_prio(*policy, *prio).map_err(bad)?;
                    }
                    GuestTaskSpec::Audio {
                        period_us,
                        work_us,
                        policy,
                        prio,
                    } => {
                        if *period_us == 0 || work_us >= period_us {
                            return Err(bad(format!(
                                "vm {}: audio needs 0 < work_us < period_us",
                                vm.name
                            )));
                        }
                        check_prio(*policy, *prio).map_err(bad)?;
                    }
                    GuestTaskSpec::Hog { policy, prio } => {
                        check_prio(*policy, *prio).map_err(bad)?
                    }
                    GuestTaskSpec::Lock { locks, hold_us, .. } => {
                        if *locks == 0 || *hold_us == 0 {
                            return Err(bad(format!(
                                "vm {}: locks and hold_us must be > 0",
                                vm.name
                            )));
                        }
                    }
                    GuestTaskSpec::PingPong { .. } => {
                        if vm.vcpus < 2 {
                            return Err(bad(format!("vm {}: ping-pong needs 2 vCPUs", vm.name)));
                        }
                    }
                }
            }
        }
        self.pvsched.limits()?;
        for v in &self.variants {
            self.limits_for(Some(v))?;
        }
        Ok(())
    }

    /// The VMs' limits in `variant`'s runs (or the scenario's own when `None`).
    pub fn limits_for(
        &self,
        variant: Option<&Variant>,
    ) -> Result<pvsched_policy::VmLimits, SimError> {
        let mut l = self.pvsched.limits()?;
        if let Some(v) = variant {
            if let Some(b) = v.idle_poll_budget_permille {
                l.idle_poll_budget_permille = b;
                l.validate().map_err(|e| SimError::Scenario {
                    what: format!("variant {}", v.name),
                    msg: e.to_string(),
                })?;
            }
        }
        Ok(l)
    }

    /// The guest idle driver of `variant` (or the scenario's own when `None`).
    pub fn guest_idle_for(&self, variant: Option<&Variant>) -> GuestIdle {
        match variant.and_then(|v| v.guest_idle).or(self.guest_idle) {
            Some(g) => g,
            // Before `guest_idle` existed, a window alone meant a fixed poll.
            None if self.costs_for(variant).guest_halt_poll_ns > 0 => GuestIdle::Fixed,
            None => GuestIdle::Halt,
        }
    }

    /// Whether the scenario chooses a guest idle driver anywhere (its report then has the
    /// idle tables).
    pub fn sets_guest_idle(&self) -> bool {
        self.guest_idle.is_some() || self.variants.iter().any(|v| v.guest_idle.is_some())
    }

    /// The host tasks of `variant`'s runs: the scenario's, then the variant's own.
    pub fn host_tasks_for<'a>(
        &'a self,
        variant: Option<&'a Variant>,
    ) -> impl Iterator<Item = &'a HostTaskSpec> {
        self.host
            .tasks
            .iter()
            .chain(variant.into_iter().flat_map(|v| v.host_tasks.iter()))
    }

    /// The cost set of `variant` (or the scenario's own when `None`).
    pub fn costs_for(&self, variant: Option<&Variant>) -> Costs {
        let mut c = Costs::by_name(&self.costs).unwrap_or_else(Costs::tcg);
        self.cost_overrides.apply(&mut c);
        if let Some(v) = variant {
            v.cost_overrides.apply(&mut c);
        }
        c
    }
}

fn check_prio(policy: PolicyName, prio: u8) -> Result<(), String> {
    match policy {
        PolicyName::Normal if prio != 0 => Err(format!("prio {prio} given to a normal task")),
        PolicyName::Fifo | PolicyName::Rr if !(1..=99).contains(&prio) => {
            Err(format!("an RT task needs prio 1..=99, not {prio}"))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_scenario_parses() {
        for (name, _) in BUILT_IN {
            Scenario::load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_with_the_reason() {
        let base = include_str!("../scenarios/idle-host.toml");
        let unknown = format!("{base}\nbogus = 1\n");
        let e = Scenario::parse(&unknown, "t").unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");

        let bad_mode = base.replace("\"vanilla\"", "\"fast\"");
        let e = Scenario::parse(&bad_mode, "t").unwrap_err().to_string();
        assert!(e.contains("unknown mode"), "{e}");
    }

    #[test]
    fn a_guest_poll_window_belongs_to_the_fixed_driver_only() {
        let base = include_str!("../scenarios/idle-host.toml");
        let with = |top: &str| base.replacen("\n[host]", &format!("\n{top}\n[host]"), 1);

        let e = Scenario::parse(&with("guest_idle = \"fixed\""), "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs guest_halt_poll_ns > 0"), "{e}");
        let e = Scenario::parse(
            &with("guest_idle = \"hinted\"\ncost_overrides = { guest_halt_poll_ns = 50000 }"),
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("window of guest_idle = \"fixed\""), "{e}");

        let old_style = Scenario::parse(
            &with("cost_overrides = { guest_halt_poll_ns = 50000 }"),
            "t",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(old_style.guest_idle_for(None), GuestIdle::Fixed);
        let plain = Scenario::parse(base, "t").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plain.guest_idle_for(None), GuestIdle::Halt);
    }

    #[test]
    fn the_idle_poll_budget_is_set_per_scenario_or_variant_and_checked() {
        let base = include_str!("../scenarios/idle-host.toml");
        let sc = Scenario::parse(
            &format!(
                "{base}\n[pvsched]\nidle_poll_budget_permille = 100\n\n[[variants]]\nname = \"a\"\n\n[[variants]]\nname = \"b\"\nidle_poll_budget_permille = 250\n"
            ),
            "t",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let budget = |v: Option<&Variant>| {
            sc.limits_for(v)
                .unwrap_or_else(|e| panic!("{e}"))
                .idle_poll_budget_permille
        };

        assert_eq!(budget(None), 100);
        assert_eq!(budget(sc.variants.first()), 100);
        assert_eq!(budget(sc.variants.get(1)), 250);
        let e = Scenario::parse(
            &format!("{base}\n[[variants]]\nname = \"c\"\nidle_poll_budget_permille = 1001\n"),
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("variant c") && e.contains("idle_poll_budget_permille"),
            "{e}"
        );
    }

    #[test]
    fn the_rivals_rule_follows_pvschedd_unless_a_scenario_sets_it() {
        let base = include_str!("../scenarios/idle-host.toml");
        let rule = |text: &str| {
            Scenario::parse(text, "t")
                .and_then(|sc| sc.limits_for(None))
                .unwrap_or_else(|e| panic!("{e}"))
                .boost_only_against_rivals
        };

        assert_eq!(
            rule(base),
            pvsched_policy::VmLimits::default().boost_only_against_rivals
        );
        assert!(!rule(&format!(
            "{base}\n[pvsched]\nboost_only_against_rivals = false\n"
        )));
        assert!(rule(&format!(
            "{base}\n[pvsched]\nboost_only_against_rivals = true\n"
        )));
    }

    #[test]
    fn the_peer_vm_and_rt_work_rules_follow_pvschedd_unless_a_scenario_sets_them() {
        let base = include_str!("../scenarios/lock-holder.toml");
        let limits = |text: &str| {
            Scenario::parse(text, "t")
                .and_then(|sc| sc.limits_for(None))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let defaults = pvsched_policy::VmLimits::default();

        let plain = limits(base);
        let set = limits(&format!(
            "{base}\n[pvsched]\npeer_vms_are_rivals = {}\nspeculative_boosts_need_rt_work = {}\n",
            !defaults.peer_vms_are_rivals, !defaults.speculative_boosts_need_rt_work
        ));

        assert_eq!(plain.peer_vms_are_rivals, defaults.peer_vms_are_rivals);
        assert_eq!(
            plain.speculative_boosts_need_rt_work,
            defaults.speculative_boosts_need_rt_work
        );
        assert_eq!(set.peer_vms_are_rivals, !defaults.peer_vms_are_rivals);
        assert_eq!(
            set.speculative_boosts_need_rt_work,
            !defaults.speculative_boosts_need_rt_work
        );
    }
}
