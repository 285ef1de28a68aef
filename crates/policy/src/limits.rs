//! Per-VM admin configuration: what the policy may ever do to that VM's vCPU threads.
//!
//! Everything the guest says is clamped against these limits; nothing outside them is
//! ever applied (docs/DESIGN.md, "Trust boundaries").

use pvsched_abi as abi;

/// Most vCPUs one [`crate::VmState`] tracks: the ABI's slot limit.
pub const MAX_VCPUS: u32 = abi::MAX_SLOTS;

/// Host scheduling policy of a vCPU thread. Never `SCHED_DEADLINE`: a guest cannot be
/// trusted with an admission-controlled reservation, so guest deadline tasks map to FIFO.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostPolicy {
    /// `SCHED_OTHER` (CFS/EEVDF, weighted by nice).
    Other,
    /// `SCHED_BATCH`.
    Batch,
    /// `SCHED_IDLE`.
    Idle,
    /// `SCHED_FIFO`.
    Fifo,
    /// `SCHED_RR`.
    Rr,
}

impl HostPolicy {
    /// All policies, in declaration order (handy for exhaustive tests and config parsers).
    pub const ALL: [HostPolicy; 5] = [
        HostPolicy::Other,
        HostPolicy::Batch,
        HostPolicy::Idle,
        HostPolicy::Fifo,
        HostPolicy::Rr,
    ];

    /// The Linux UAPI number (`SCHED_*`), as `sched_setattr` and `host_half.policy` want it.
    pub const fn uapi(self) -> u32 {
        match self {
            HostPolicy::Other => abi::HOST_POLICY_OTHER,
            HostPolicy::Batch => abi::HOST_POLICY_BATCH,
            HostPolicy::Idle => abi::HOST_POLICY_IDLE,
            HostPolicy::Fifo => abi::HOST_POLICY_FIFO,
            HostPolicy::Rr => abi::HOST_POLICY_RR,
        }
    }

    /// Inverse of [`HostPolicy::uapi`]; `None` for numbers this policy never uses
    /// (including `SCHED_DEADLINE` = 6).
    pub const fn from_uapi(policy: u32) -> Option<HostPolicy> {
        match policy {
            abi::HOST_POLICY_OTHER => Some(HostPolicy::Other),
            abi::HOST_POLICY_BATCH => Some(HostPolicy::Batch),
            abi::HOST_POLICY_IDLE => Some(HostPolicy::Idle),
            abi::HOST_POLICY_FIFO => Some(HostPolicy::Fifo),
            abi::HOST_POLICY_RR => Some(HostPolicy::Rr),
            _ => None,
        }
    }

    /// True for the real-time classes (FIFO, RR): the ones that count as "boosted".
    pub const fn is_rt(self) -> bool {
        matches!(self, HostPolicy::Fifo | HostPolicy::Rr)
    }

    /// Short lower-case name, as used in config files and metrics ("other", "fifo", ...).
    pub const fn name(self) -> &'static str {
        match self {
            HostPolicy::Other => "other",
            HostPolicy::Batch => "batch",
            HostPolicy::Idle => "idle",
            HostPolicy::Fifo => "fifo",
            HostPolicy::Rr => "rr",
        }
    }
}

impl TryFrom<u32> for HostPolicy {
    type Error = u32;

    /// Fails with the unknown number itself.
    fn try_from(policy: u32) -> Result<Self, u32> {
        HostPolicy::from_uapi(policy).ok_or(policy)
    }
}

impl core::fmt::Display for HostPolicy {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which host policies the policy engine may apply to this VM's vCPU threads.
///
/// Default: everything except `idle`. `SCHED_IDLE` is off by default because an IDLE
/// vCPU thread can starve behind any host load while the guest still believes it runs
/// (a guest lock taken there would stall the other vCPUs); a guest IDLE task then maps
/// to `Other` at `nice_max` instead. `other` must stay allowed: it is the fallback of
/// every unboosted or throttled vCPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllowedPolicies {
    pub other: bool,
    pub batch: bool,
    pub idle: bool,
    pub fifo: bool,
    pub rr: bool,
}

impl AllowedPolicies {
    /// Every policy allowed.
    pub const ALL: AllowedPolicies = AllowedPolicies {
        other: true,
        batch: true,
        idle: true,
        fifo: true,
        rr: true,
    };

    /// No boosting at all: only the CFS classes.
    pub const NO_RT: AllowedPolicies = AllowedPolicies {
        other: true,
        batch: true,
        idle: false,
        fifo: false,
        rr: false,
    };

    /// Whether `policy` may be applied.
    pub const fn allows(&self, policy: HostPolicy) -> bool {
        match policy {
            HostPolicy::Other => self.other,
            HostPolicy::Batch => self.batch,
            HostPolicy::Idle => self.idle,
            HostPolicy::Fifo => self.fifo,
            HostPolicy::Rr => self.rr,
        }
    }
}

impl Default for AllowedPolicies {
    fn default() -> Self {
        AllowedPolicies {
            other: true,
            batch: true,
            idle: false,
            fifo: true,
            rr: true,
        }
    }
}

/// Per-VM limits and tunables. Every field has a default ([`VmLimits::default`]) and
/// can be changed at run time ([`crate::VmState::set_limits`]).
///
/// Durations are nanoseconds of the host clock the caller passes as `now`.
#[derive(Clone, Debug, PartialEq)]
pub struct VmLimits {
    /// Host policies that may be applied. Default: all but `idle`.
    pub allowed: AllowedPolicies,
    /// Policy of a boost that has no priority of its own (critical section, explicit
    /// request, proactive). `Fifo` or `Rr`. Default `Rr`: several boosted vCPUs of one VM
    /// sharing a CPU take turns instead of one starving the other.
    pub boost_policy: HostPolicy,
    /// Priority of such a boost, 1..=99, capped at `max_rt_priority`. Default 2.
    pub boost_priority: u8,
    /// Cap on every RT priority applied, 1..=99. Default 4. vCPU boosts live in a band of
    /// RT priorities above every CFS task (what a boost is for: not waiting behind host
    /// hogs) and below the host's own real-time work (audio servers, cyclictest, IRQ
    /// threads, which run at 5 and above), so that boosting a guest never delays the host's
    /// RT tasks. Guest RT priorities map 1:1 up to the cap, so their order among the vCPUs
    /// survives as far as the band allows.
    pub max_rt_priority: u8,
    /// Host FIFO priority for a guest `SCHED_DEADLINE` task, 1..=99, capped at
    /// `max_rt_priority`. Default 4 (the top of the band).
    pub deadline_priority: u8,
    /// Lowest nice a guest's nice may translate to, -20..=19. Default 0: a guest may lower
    /// its own weight, never raise it above a plain host task.
    pub nice_min: i8,
    /// Highest nice a guest's nice may translate to, -20..=19, >= `nice_min`. Default 19.
    pub nice_max: i8,
    /// Boost while the guest is in a kernel critical section. Default true.
    pub honor_critical_sections: bool,
    /// Translate guest RT / deadline tasks into host RT. Default true.
    pub honor_guest_rt: bool,
    /// Boost on an explicit guest boost request (`GF_BOOST_REQ`). Default true.
    pub honor_boost_request: bool,
    /// Boost for a valid pending-task hint naming an RT task. Default true.
    pub honor_pending_hint: bool,
    /// Boost proactively when the host wakes the vCPU thread. Default true.
    pub proactive_wake: bool,
    /// Boost proactively when an interrupt is targeted at the vCPU. Default true.
    pub proactive_irq: bool,
    /// Keep a vCPU boosted while it halts, if it ran guest RT work (an RT or deadline task,
    /// a boost request, an RT pending hint) within the last `halt_boost_ns`: the wakeup of
    /// that work then preempts CFS hogs at once, before any reaction of the host. A halted
    /// vCPU uses no CPU, so this costs the host nothing until it runs; the guest speaking for
    /// itself after the wakeup ends it (its RT task takes over, or nothing urgent runs).
    /// It starts when the guest goes idle (about to halt) or the vCPU halts, and keeps the
    /// class and priority of the RT boost it follows. Default true. Guests that run no RT
    /// work never get it.
    pub proactive_halt: bool,
    /// Start the speculative boosts (critical sections and the proactive reasons) only
    /// while something outside the VM competes for the host's CPUs, or while the VM runs
    /// guest RT work (seen on any vCPU within `halt_boost_ns`): the host's last report of
    /// the vCPU (preempted, halted, woken) saw a CPU running a task that is not idle, not
    /// pvschedd and not a thread of the VM's own process. A VM that has the host to itself
    /// gains nothing from RT boosts of its vCPUs over its own threads unless it runs RT
    /// work, and pays for them: the kernel's RT push and pull then stack two of its vCPUs
    /// on one CPU while another idles (measured: both vCPUs of a lone 2-vCPU VM on one CPU
    /// 27 % of the time against under 1 % with those boosts off). The guest's own reasons
    /// (RT tasks, boost requests, pending hints) are not affected; lock-holder extensions
    /// are, for the same reason (an extension is a boost over the VM's own threads then).
    /// The RT-work exemption is per VM: the standard benchmark's idle host lost its audio
    /// task's periods without it (BENCHMARKS.md, "Rivals": 529 glitches against vanilla's
    /// 16), and still 40 against 5 with a per-vCPU exemption (the siblings that take the
    /// RT task's timers and wake it lost their boosts). Default true.
    pub boost_only_against_rivals: bool,
    /// With `boost_only_against_rivals`: whether threads of other VMs pvschedd serves are
    /// rivals for the speculative boosts (critical sections, the proactive reasons). Off:
    /// only a task that is no served VM's (a host task, an unserved VM) is. Served VMs get
    /// the same boosts, so between them a boost only changes which VM runs first, and pays
    /// pvschedd's work for it: two overcommitted lock-heavy VMs ran at 0.80-0.86x of
    /// vanilla with them and 0.97-1.09x without (BENCHMARKS.md, "Peer VMs are no rivals";
    /// the simulator, which charges the daemon nothing, has them gaining 1.15-1.21x under
    /// KVM costs). Against host hogs the same boosts won a message-passing VM 1.3-1.5x. A
    /// VM that ran guest RT work is spared the rule as before, and lock-holder extensions
    /// count other VMs as rivals whatever this says (they are repaid). Default false.
    pub peer_vms_are_rivals: bool,
    /// Start the speculative boosts (critical sections and the proactive reasons) only
    /// while the VM runs guest RT work (seen on any vCPU within `halt_boost_ns`), rivals
    /// or not. A VM without RT work runs for throughput, and RT boosts of its vCPUs cost
    /// it throughput on a host it shares: two overcommitted lock-heavy VMs ran at
    /// 0.85-0.86x of vanilla with the speculative boosts and 1.02-1.05x with none, the
    /// critical-section boosts most of the difference (BENCHMARKS.md, "What the
    /// speculative boosts cost VMs without RT work"). The guest's own reasons and
    /// lock-holder extensions are not affected. Default false.
    pub speculative_boosts_need_rt_work: bool,
    /// How recent guest RT work must be for a halt boost, and how long a halt boost lasts.
    /// Default 100 ms.
    pub halt_boost_ns: u64,
    /// How long a proactive boost lasts unless the guest confirms (or denies) it. Default
    /// 1 ms: long enough for the guest to run its handler and publish why.
    pub proactive_boost_ns: u64,
    /// Longest boost of one vCPU before it is throttled. Counted as boosted time on a CPU
    /// not yet matched by as much unboosted or halted time, so brief unboosts do not
    /// restart the clock (time waiting for a CPU counts neither way).
    /// Default 50 ms: far above any interrupt handler or audio period, short enough that a
    /// spinning guest RT task costs the host at most 50 ms of latency per
    /// `max_boost + throttle`.
    pub max_boost_ns: u64,
    /// A burst longer than this *demotes* the vCPU: its boosts run at the bottom of the RT
    /// range (priority 1), so a fresh boost of another vCPU, of this VM or of any other,
    /// preempts it at once instead of waiting for the throttle (FIFO threads of equal
    /// priority never preempt each other). The demotion lasts until the burst is repaid by
    /// as much halted or unasked-for time; time held back by the throttle or the budget does
    /// not repay it. Default 4 ms, about one host tick: the extension eCS grants a critical
    /// section.
    pub demote_after_ns: u64,
    /// A demoted vCPU's boosted time is charged this many times to the VM's boost budget,
    /// 1..=16. Default 3: a guest that keeps a vCPU boosted for long stretches gets a third
    /// of the budget of one whose boosts are short wakeups, which are never demoted. With the
    /// 300 permille share that is the 100 ms per vCPU per second a guest spinning RT on
    /// every vCPU (demoted nearly all the time) got at 200 permille and a charge of 2, where
    /// its neighbour and the host kept their p99 (BENCHMARKS.md, "The boost budget").
    pub demoted_charge: u32,
    /// How long after the last consistent read of a vCPU's guest half an inconsistent read
    /// (seq odd or changing through every retry: the vCPU was preempted mid-update) keeps the
    /// last view. Past it the guest asks for nothing. Default 2 ms.
    pub inconsistent_grace_ns: u64,
    /// How long a throttled vCPU stays unboosted. Default 50 ms (so a guest that is always
    /// asking is boosted at most half the time).
    pub throttle_ns: u64,
    /// The VM's boost budget: the share of its vCPU time (elapsed time x nr_vcpus) that may be
    /// boosted, whatever the reason, in permille, 0..=1000. Default 300: 300 ms per vCPU per
    /// 1 s window, which a demoted vCPU spends `demoted_charge` [3] times as fast. Measured
    /// (BENCHMARKS.md, "The boost budget"): a well-behaved TCG guest running cyclictest at
    /// 500 µs on a loaded host is boosted 23-24 % of its vCPU time in short boosts, and at
    /// 200 it latched in 2 of 5 sessions (guest p99 5-7 ms in those); at 300 with a charge
    /// of 2 none collapsed but a guest spinning RT on every vCPU cost its neighbour 1.54x
    /// and the host 1.39x in p99; at 300 with a charge of 3 the guest kept 0.10x of
    /// vanilla's p99 and the spinning guest's neighbour 1.11x, the host 0.90x. Enforced
    /// ([`crate::fairness`]): once the VM has spent its banked budget, no vCPU of it is
    /// boosted until `budget_resume_permille` of the window's budget is earned back. 0
    /// refuses every boost.
    pub boost_share_permille: u32,
    /// Share of a core each vCPU may spend polling in the guest's idle driver, permille
    /// (0..=1000), told to the guest with the idle hints (`F_IDLE_HINTS`). Default 50
    /// (5 %), the advisor's default budget. 0 tells the guest nothing (its own default applies).
    pub idle_poll_budget_permille: u32,
    /// Window of the boost budget: the bucket holds at most `share x window x nr_vcpus`
    /// (unused budget is banked for one window), and a VM that ran it dry waits until
    /// `budget_resume_permille` of it is earned back. Default 1 s.
    pub fairness_window_ns: u64,
    /// How much of a window's boost budget a VM that ran it dry earns back before it is
    /// boosted again, permille, 1..=1000. Default 1000 (the whole window). The share is the
    /// same at any value (the tokens do not change, only when the latch clears); a smaller
    /// one refuses in shorter, more frequent turns. Measured (BENCHMARKS.md, "The boost
    /// budget's latch"): at 100 a TCG guest whose demand is above its budget was refused as
    /// much (34 turns of 100 ms instead of 3 of 1 s), and a guest spinning RT, refused in
    /// short turns, cost its neighbour 1.66x in p99 (1.04-1.09x in 3 of 4 runs at 1000).
    pub budget_resume_permille: u32,
    /// The part of the window's boost budget, permille (0..=1000), kept for the guest's own
    /// RT work (its RT or deadline task, a boost request, a pending RT wakeup, and halt
    /// boosts, which follow RT work): speculative boosts (a critical section, a wakeup, an
    /// interrupt, a lock holder) are refused while the budget left is below it. So a busy
    /// spell of speculative boosts cannot latch the budget of a guest whose RT work is within
    /// its share: traced (BENCHMARKS.md, "The budget latch"), the latch came from such spells
    /// (under KVM critical sections were 55 % of the boosted time) and refused the guest's
    /// RT work for a whole window. Default 500. 0: no reserve (the budget as before).
    pub speculative_reserve_permille: u32,
    /// Nice of the VM's unboosted vCPUs while its boost budget is latched (`max` with their
    /// normal nice), -20..=19. Default 0: the latch refuses boosts and no more. The boost
    /// budget needs no repayment on top of its refusals (its tokens are earned back with
    /// time, not with time at a lower weight), and a guest whose legitimate demand is above
    /// its budget must not end below vanilla: measured on KVM in the host VM (BENCHMARKS.md,
    /// "pvsched on KVM"), where the emulated SVM makes a guest's timer work cost 25-45 % of
    /// a vCPU, at 5 the latched guest's p99 was 3-8x vanilla's and it got 0.82x of its
    /// fair-class entitlement (vanilla 0.87x); at 0 about vanilla's p99, 0.94x.
    pub latch_nice: i8,
    /// Nice of the VM's unboosted vCPUs while it repays lock-holder extensions (`max`
    /// with their normal nice), -20..=19. Default 5 (about a third of the CFS weight of
    /// nice 0): each ns there repays `w(nice)/w(debt_nice) - 1` ns (`crate::locks`).
    pub debt_nice: i8,
    /// Each vCPU's critical-section budget: boosted time whose reason is a critical section,
    /// per `cs_window_ns`, > 0 and <= `cs_window_ns`. Default 2 ms: a vCPU preempted in a
    /// critical section gets about one host tick to leave it (eCS), at most ~4 ms in a row,
    /// then no critical-section boost until its 2 ms are earned back. Legitimate critical
    /// sections last microseconds (the boost lasts until the next read, <= ~0.5 ms).
    pub cs_budget_ns: u64,
    /// Window of the critical-section budget, 1..=[`MAX_CS_WINDOW_NS`]. Default 4 ms: the
    /// budget is repaid 1:1 (2 ms boosted, 2 ms not), as pvsched v3's critical-section debt.
    pub cs_window_ns: u64,
    /// Extend lock holders (`F_LOCK_WAIT`): when a vCPU that another vCPU's guest waits on
    /// (the holder of the lock it waits for, or any vCPU for a waiter whose holder is
    /// unknown) is preempted, boost it for `lock_extension_ns`, charge the time it runs to
    /// the VM's lock debt, and repay the debt at `debt_nice`. Default false: measured on
    /// this project's TCG machine it won no throughput and, on by default, cost the
    /// latency benchmark a collapsed repeat at 500 µs (BENCHMARKS.md, "Lock holders").
    pub honor_lock_holders: bool,
    /// Longest extension of a preempted lock holder, > 0. Default 1 ms, about one host tick
    /// (what eCS grants). It ends earlier when no waiter names the vCPU any more or it halts.
    pub lock_extension_ns: u64,
    /// Lock debt (on-CPU extension time not yet repaid) at which further extensions are
    /// refused until it is repaid below, > 0. Default 10 ms.
    pub lock_debt_max_ns: u64,
    /// Lock debt at which the VM starts repaying (its vCPUs at `debt_nice`), <=
    /// `lock_debt_max_ns`; once started, repayment lasts until the debt is 0. Below it the
    /// debt waits for more: each start and end of a repayment is a nice change of every
    /// vCPU and a daemon wakeup. Repaying from the first ns, two overcommitted lock VMs
    /// woke pvschedd's timer 1000-1200 times a second, in 4 ms turns 660-700
    /// (BENCHMARKS.md, "Repaying lock debt in turns"). A smaller debt is repaid all the
    /// same once it has waited `locks::DEBT_WAIT_NS` (100 ms). 0: from the first ns.
    /// Default 4 ms.
    pub lock_repay_from_ns: u64,
    /// Also extend a vCPU a wait names as the holder while it runs (not only once it is
    /// preempted): the boost keeps the host's fair class from preempting it. Default false.
    pub lock_extend_running: bool,
}

/// Largest `demoted_charge`.
pub const MAX_DEMOTED_CHARGE: u32 = 16;

/// Longest `cs_window_ns` (1 h): bounds the critical-section bucket's units (`budget x window`)
/// so that its arithmetic stays exact in `u128`.
pub const MAX_CS_WINDOW_NS: u64 = 3_600_000_000_000;

impl Default for VmLimits {
    fn default() -> Self {
        VmLimits {
            allowed: AllowedPolicies::default(),
            boost_policy: HostPolicy::Rr,
            boost_priority: 2,
            max_rt_priority: 4,
            deadline_priority: 4,
            nice_min: 0,
            nice_max: 19,
            honor_critical_sections: true,
            honor_guest_rt: true,
            honor_boost_request: true,
            honor_pending_hint: true,
            proactive_wake: true,
            proactive_irq: true,
            proactive_halt: true,
            boost_only_against_rivals: true,
            peer_vms_are_rivals: false,
            speculative_boosts_need_rt_work: false,
            halt_boost_ns: 100_000_000,
            proactive_boost_ns: 1_000_000,
            max_boost_ns: 50_000_000,
            demote_after_ns: 4_000_000,
            demoted_charge: 3,
            inconsistent_grace_ns: 2_000_000,
            throttle_ns: 50_000_000,
            boost_share_permille: 300,
            idle_poll_budget_permille: 50,
            fairness_window_ns: 1_000_000_000,
            budget_resume_permille: 1000,
            speculative_reserve_permille: 500,
            latch_nice: 0,
            debt_nice: 5,
            cs_budget_ns: 2_000_000,
            cs_window_ns: 4_000_000,
            honor_lock_holders: false,
            lock_extension_ns: 1_000_000,
            lock_debt_max_ns: 10_000_000,
            lock_repay_from_ns: 4_000_000,
            lock_extend_running: false,
        }
    }
}

/// A [`VmLimits`] field (or the vCPU count) out of its range. Each variant names the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    #[error("allowed.other must be true: SCHED_OTHER is the fallback of every unboosted vCPU")]
    AllowedOther,
    #[error("boost_policy must be fifo or rr, not {0}")]
    BoostPolicy(HostPolicy),
    #[error("boost_priority must be 1..=99, not {0}")]
    BoostPriority(u8),
    #[error("boost_share_permille must be 0..=1000, not {0}")]
    BoostSharePermille(u32),
    #[error("idle_poll_budget_permille must be 0..=1000, not {0}")]
    IdlePollBudgetPermille(u32),
    #[error("cs_budget_ns must be > 0 (to refuse critical-section boosts, clear honor_critical_sections)")]
    CsBudgetNs,
    #[error("cs_budget_ns ({budget}) must be <= cs_window_ns ({window})")]
    CsBudgetOverWindow { budget: u64, window: u64 },
    #[error("cs_window_ns must be 1..={MAX_CS_WINDOW_NS}, not {0}")]
    CsWindowNs(u64),
    #[error("deadline_priority must be 1..=99, not {0}")]
    DeadlinePriority(u8),
    #[error("debt_nice must be -20..=19, not {0}")]
    DebtNice(i8),
    #[error("latch_nice must be -20..=19, not {0}")]
    LatchNice(i8),
    #[error("demote_after_ns must be > 0")]
    DemoteAfterNs,
    #[error("demoted_charge must be 1..=16, not {0}")]
    DemotedCharge(u32),
    #[error("budget_resume_permille must be 1..=1000, not {0}")]
    BudgetResumePermille(u32),
    #[error("speculative_reserve_permille must be 0..=1000, not {0}")]
    SpeculativeReservePermille(u32),
    #[error("fairness_window_ns must be > 0")]
    FairnessWindowNs,
    #[error("halt_boost_ns must be > 0")]
    HaltBoostNs,
    #[error("lock_debt_max_ns must be > 0 (to refuse extensions, clear honor_lock_holders)")]
    LockDebtMaxNs,
    #[error("lock_extension_ns must be > 0")]
    LockExtensionNs,
    #[error("lock_repay_from_ns must be <= lock_debt_max_ns ({max}), not {from}")]
    LockRepayFromNs { from: u64, max: u64 },
    #[error("max_boost_ns must be > 0")]
    MaxBoostNs,
    #[error("max_rt_priority must be 1..=99, not {0}")]
    MaxRtPriority(u8),
    #[error("nice_max must be -20..=19, not {0}")]
    NiceMax(i8),
    #[error("nice_min must be -20..=19, not {0}")]
    NiceMin(i8),
    #[error("nice_min ({min}) must be <= nice_max ({max})")]
    NiceRange { min: i8, max: i8 },
    #[error("nr_vcpus must be 1..={MAX_VCPUS}, not {0}")]
    NrVcpus(u32),
    #[error("proactive_boost_ns must be > 0")]
    ProactiveBoostNs,
    #[error("throttle_ns must be > 0")]
    ThrottleNs,
}

const fn rt_prio_ok(p: u8) -> bool {
    p >= 1 && p <= 99
}

const fn nice_ok(n: i8) -> bool {
    n >= -20 && n <= 19
}

impl VmLimits {
    /// Checks every field against its documented range. Zero durations are refused because
    /// each would make the engine flap (a zero throttle re-boosts at once, a zero
    /// `max_boost` throttles every boost at once); to forbid boosting, clear
    /// `allowed.fifo` and `allowed.rr` instead.
    pub fn validate(&self) -> Result<(), LimitsError> {
        if !self.allowed.other {
            return Err(LimitsError::AllowedOther);
        }
        if !self.boost_policy.is_rt() {
            return Err(LimitsError::BoostPolicy(self.boost_policy));
        }
        if !rt_prio_ok(self.boost_priority) {
            return Err(LimitsError::BoostPriority(self.boost_priority));
        }
        if self.boost_share_permille > 1000 {
            return Err(LimitsError::BoostSharePermille(self.boost_share_permille));
        }
        if self.idle_poll_budget_permille > 1000 {
            return Err(LimitsError::IdlePollBudgetPermille(
                self.idle_poll_budget_permille,
            ));
        }
        if self.cs_budget_ns == 0 {
            return Err(LimitsError::CsBudgetNs);
        }
        if self.cs_window_ns == 0 || self.cs_window_ns > MAX_CS_WINDOW_NS {
            return Err(LimitsError::CsWindowNs(self.cs_window_ns));
        }
        if self.cs_budget_ns > self.cs_window_ns {
            return Err(LimitsError::CsBudgetOverWindow {
                budget: self.cs_budget_ns,
                window: self.cs_window_ns,
            });
        }
        if !rt_prio_ok(self.deadline_priority) {
            return Err(LimitsError::DeadlinePriority(self.deadline_priority));
        }
        if !nice_ok(self.latch_nice) {
            return Err(LimitsError::LatchNice(self.latch_nice));
        }
        if !nice_ok(self.debt_nice) {
            return Err(LimitsError::DebtNice(self.debt_nice));
        }
        if self.demote_after_ns == 0 {
            return Err(LimitsError::DemoteAfterNs);
        }
        if !(1..=MAX_DEMOTED_CHARGE).contains(&self.demoted_charge) {
            return Err(LimitsError::DemotedCharge(self.demoted_charge));
        }
        if !(1..=1000).contains(&self.budget_resume_permille) {
            return Err(LimitsError::BudgetResumePermille(
                self.budget_resume_permille,
            ));
        }
        if self.speculative_reserve_permille > 1000 {
            return Err(LimitsError::SpeculativeReservePermille(
                self.speculative_reserve_permille,
            ));
        }
        if self.fairness_window_ns == 0 {
            return Err(LimitsError::FairnessWindowNs);
        }
        if self.halt_boost_ns == 0 {
            return Err(LimitsError::HaltBoostNs);
        }
        if self.lock_debt_max_ns == 0 {
            return Err(LimitsError::LockDebtMaxNs);
        }
        if self.lock_extension_ns == 0 {
            return Err(LimitsError::LockExtensionNs);
        }
        if self.lock_repay_from_ns > self.lock_debt_max_ns {
            return Err(LimitsError::LockRepayFromNs {
                from: self.lock_repay_from_ns,
                max: self.lock_debt_max_ns,
            });
        }
        if self.max_boost_ns == 0 {
            return Err(LimitsError::MaxBoostNs);
        }
        if !rt_prio_ok(self.max_rt_priority) {
            return Err(LimitsError::MaxRtPriority(self.max_rt_priority));
        }
        if !nice_ok(self.nice_max) {
            return Err(LimitsError::NiceMax(self.nice_max));
        }
        if !nice_ok(self.nice_min) {
            return Err(LimitsError::NiceMin(self.nice_min));
        }
        if self.nice_min > self.nice_max {
            return Err(LimitsError::NiceRange {
                min: self.nice_min,
                max: self.nice_max,
            });
        }
        if self.proactive_boost_ns == 0 {
            return Err(LimitsError::ProactiveBoostNs);
        }
        if self.throttle_ns == 0 {
            return Err(LimitsError::ThrottleNs);
        }
        Ok(())
    }

    /// `nice` clamped into `nice_min..=nice_max`.
    pub(crate) fn clamp_nice(&self, nice: i8) -> i8 {
        nice.clamp(self.nice_min, self.nice_max)
    }

    /// The RT policy to use when `wanted` is asked for: `wanted` if allowed, else the other
    /// RT policy if allowed, else none (no boost possible).
    pub(crate) fn rt_policy(&self, wanted: HostPolicy) -> Option<HostPolicy> {
        let other = match wanted {
            HostPolicy::Fifo => HostPolicy::Rr,
            _ => HostPolicy::Fifo,
        };
        let first = if wanted.is_rt() { wanted } else { other };
        if self.allowed.allows(first) {
            Some(first)
        } else if self.allowed.allows(other) {
            Some(other)
        } else {
            None
        }
    }

    /// `prio` capped at `max_rt_priority` and raised to at least 1.
    pub(crate) fn cap_prio(&self, prio: u8) -> u8 {
        prio.clamp(1, self.max_rt_priority.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(VmLimits::default().validate(), Ok(()));
    }

    #[test]
    fn uapi_round_trips_for_every_policy() {
        for p in HostPolicy::ALL {
            assert_eq!(HostPolicy::from_uapi(p.uapi()), Some(p));
            assert_eq!(HostPolicy::try_from(p.uapi()), Ok(p));
        }
        assert_eq!(HostPolicy::from_uapi(6), None);
        assert_eq!(HostPolicy::try_from(u32::MAX), Err(u32::MAX));
    }

    #[test]
    fn validate_names_each_bad_field() {
        type Mutation = fn(&mut VmLimits);
        let cases: [(Mutation, LimitsError); 26] = [
            (|l| l.lock_debt_max_ns = 0, LimitsError::LockDebtMaxNs),
            (|l| l.lock_extension_ns = 0, LimitsError::LockExtensionNs),
            (
                |l| l.lock_repay_from_ns = 10_000_001,
                LimitsError::LockRepayFromNs {
                    from: 10_000_001,
                    max: 10_000_000,
                },
            ),
            (
                |l| l.idle_poll_budget_permille = 1001,
                LimitsError::IdlePollBudgetPermille(1001),
            ),
            (|l| l.allowed.other = false, LimitsError::AllowedOther),
            (
                |l| l.boost_policy = HostPolicy::Batch,
                LimitsError::BoostPolicy(HostPolicy::Batch),
            ),
            (|l| l.boost_priority = 0, LimitsError::BoostPriority(0)),
            (|l| l.boost_priority = 100, LimitsError::BoostPriority(100)),
            (
                |l| l.boost_share_permille = 1001,
                LimitsError::BoostSharePermille(1001),
            ),
            (|l| l.cs_budget_ns = 0, LimitsError::CsBudgetNs),
            (
                |l| l.cs_budget_ns = l.cs_window_ns + 1,
                LimitsError::CsBudgetOverWindow {
                    budget: 4_000_001,
                    window: 4_000_000,
                },
            ),
            (|l| l.cs_window_ns = 0, LimitsError::CsWindowNs(0)),
            (
                |l| {
                    l.cs_budget_ns = 1;
                    l.cs_window_ns = MAX_CS_WINDOW_NS + 1;
                },
                LimitsError::CsWindowNs(MAX_CS_WINDOW_NS + 1),
            ),
            (
                |l| l.deadline_priority = 0,
                LimitsError::DeadlinePriority(0),
            ),
            (|l| l.debt_nice = 20, LimitsError::DebtNice(20)),
            (|l| l.latch_nice = -21, LimitsError::LatchNice(-21)),
            (|l| l.fairness_window_ns = 0, LimitsError::FairnessWindowNs),
            (
                |l| l.budget_resume_permille = 0,
                LimitsError::BudgetResumePermille(0),
            ),
            (
                |l| l.budget_resume_permille = 1001,
                LimitsError::BudgetResumePermille(1001),
            ),
            (|l| l.max_boost_ns = 0, LimitsError::MaxBoostNs),
            (|l| l.max_rt_priority = 100, LimitsError::MaxRtPriority(100)),
            (|l| l.nice_max = 20, LimitsError::NiceMax(20)),
            (|l| l.nice_min = -21, LimitsError::NiceMin(-21)),
            (
                |l| {
                    l.nice_min = 5;
                    l.nice_max = 4;
                },
                LimitsError::NiceRange { min: 5, max: 4 },
            ),
            (|l| l.proactive_boost_ns = 0, LimitsError::ProactiveBoostNs),
            (|l| l.throttle_ns = 0, LimitsError::ThrottleNs),
        ];
        for (mutate, want) in cases {
            let mut limits = VmLimits::default();
            mutate(&mut limits);
            assert_eq!(limits.validate(), Err(want));
        }
    }

    #[test]
    fn rt_policy_falls_back_to_the_other_allowed_rt_class() {
        let mut limits = VmLimits::default();
        limits.allowed.rr = false;
        assert_eq!(limits.rt_policy(HostPolicy::Rr), Some(HostPolicy::Fifo));
        limits.allowed.fifo = false;
        assert_eq!(limits.rt_policy(HostPolicy::Rr), None);
        assert_eq!(limits.rt_policy(HostPolicy::Fifo), None);
    }

    #[test]
    fn cap_prio_keeps_priorities_in_one_to_max() {
        let limits = VmLimits {
            max_rt_priority: 10,
            ..VmLimits::default()
        };
        assert_eq!(limits.cap_prio(0), 1);
        assert_eq!(limits.cap_prio(5), 5);
        assert_eq!(limits.cap_prio(99), 10);
    }
}
