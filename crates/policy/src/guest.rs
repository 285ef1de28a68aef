//! Sanitizing the untrusted guest half into what the policy is allowed to look at.
//!
//! The guest can write any bit pattern into its half. [`GuestView::from_half`] maps every
//! possible pattern to a value inside the ABI's ranges, counting each field it had to
//! clamp or ignore; the rest of the engine only ever sees a `GuestView`.

use pvsched_abi as abi;

/// A guest scheduling class, as `PVSCHED_POLICY_*` numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GuestPolicy {
    Normal,
    Fifo,
    Rr,
    Batch,
    Idle,
    Deadline,
}

impl GuestPolicy {
    /// Known policy numbers; `None` for anything else.
    pub const fn from_abi(policy: u32) -> Option<GuestPolicy> {
        match policy {
            abi::POLICY_NORMAL => Some(GuestPolicy::Normal),
            abi::POLICY_FIFO => Some(GuestPolicy::Fifo),
            abi::POLICY_RR => Some(GuestPolicy::Rr),
            abi::POLICY_BATCH => Some(GuestPolicy::Batch),
            abi::POLICY_IDLE => Some(GuestPolicy::Idle),
            abi::POLICY_DEADLINE => Some(GuestPolicy::Deadline),
            _ => None,
        }
    }

    /// The `PVSCHED_POLICY_*` number.
    pub const fn abi(self) -> u32 {
        match self {
            GuestPolicy::Normal => abi::POLICY_NORMAL,
            GuestPolicy::Fifo => abi::POLICY_FIFO,
            GuestPolicy::Rr => abi::POLICY_RR,
            GuestPolicy::Batch => abi::POLICY_BATCH,
            GuestPolicy::Idle => abi::POLICY_IDLE,
            GuestPolicy::Deadline => abi::POLICY_DEADLINE,
        }
    }

    /// FIFO or RR: the classes that carry an RT priority.
    pub const fn is_rt(self) -> bool {
        matches!(self, GuestPolicy::Fifo | GuestPolicy::Rr)
    }
}

/// A valid pending-task hint: an urgent task waiting to run on the vCPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PendingHint {
    /// FIFO, RR or Deadline (hints for CFS classes carry no urgency and are dropped).
    pub policy: GuestPolicy,
    /// 1..=99 for FIFO/RR, 0 for Deadline.
    pub rt_priority: u8,
}

/// Whose lock a task on the vCPU waits for (`F_LOCK_WAIT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LockHolder {
    /// No lock wait published.
    #[default]
    None,
    /// The holder runs on this vCPU (an index the VM may not have: the policy checks).
    Vcpu(u32),
    /// The holder is unknown (spinlock, rwlock, reader-owned rwsem): another vCPU.
    Any,
}

impl LockHolder {
    /// `PVSCHED_LOCK_*` -> holder; `None` (and `true`: clamped) for a value no ABI
    /// defines.
    const fn from_abi(word: u32) -> (LockHolder, bool) {
        match word {
            abi::LOCK_NONE => (LockHolder::None, false),
            abi::LOCK_ANY => (LockHolder::Any, false),
            w if w <= abi::MAX_SLOTS => (LockHolder::Vcpu(w - 1), false),
            _ => (LockHolder::None, true),
        }
    }
}

/// The sanitized guest half of one vCPU slot: every field is in range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GuestView {
    /// The seqcount read succeeded. When false every other field is "nothing".
    pub consistent: bool,
    /// `GF_ACTIVE`: a guest CPU serves the slot. When false the guest asks for nothing.
    pub active: bool,
    /// `GF_IDLE`: the guest CPU runs its idle task; the task fields describe no task.
    pub idle: bool,
    /// `GF_BOOST_REQ`.
    pub boost_req: bool,
    /// Known `PVSCHED_CS_*` bits only.
    pub cs_flags: u32,
    /// Running task's class (unknown numbers read as `Normal`).
    pub policy: GuestPolicy,
    /// 1..=99 for FIFO/RR, else 0.
    pub rt_priority: u8,
    /// -20..=19.
    pub nice: i8,
    /// A valid pending hint naming an RT or deadline task.
    pub pending: Option<PendingHint>,
    /// The lock wait in progress (`F_LOCK_WAIT`).
    pub lock_holder: LockHolder,
    /// Known `PVSCHED_LOCK_F_*` bits only.
    pub lock_flags: u32,
    /// The guest's lock counters as of this copy (reported, never acted on).
    pub lock_contended: u64,
    pub lock_preempted: u64,
    /// Switches to an RT or deadline task as of this copy (minor 4; 0 from older guests).
    /// Compared between two views, it shows RT work that ran between them, which the
    /// task fields (the present only) miss when the guest idles again before a read.
    pub rt_switches: u64,
    /// The guest's sequence number of this copy (used to tell a fresh write from a re-read).
    pub seq: u32,
    /// How many fields had to be clamped or ignored to build this view.
    pub clamped: u32,
}

impl GuestView {
    /// The view of a half that never read consistently: no request at all.
    pub const fn inconsistent() -> GuestView {
        GuestView {
            consistent: false,
            active: false,
            idle: false,
            boost_req: false,
            cs_flags: 0,
            policy: GuestPolicy::Normal,
            rt_priority: 0,
            nice: 0,
            pending: None,
            lock_holder: LockHolder::None,
            lock_flags: 0,
            lock_contended: 0,
            lock_preempted: 0,
            rt_switches: 0,
            seq: 0,
            clamped: 0,
        }
    }

    /// Sanitizes a consistent copy of a guest half. Never panics. Counted as clamped (one
    /// per field): unknown flag bits, unknown cs bits, an unknown policy (read as NORMAL),
    /// an RT priority out of 1..=99 for an RT policy (clamped into it) or non-zero for a
    /// non-RT one (zeroed), a nice out of -20..=19 (clamped), a non-zero pending word that
    /// is not a valid RT/deadline hint (ignored), and an odd `seq` (a copy taken mid-write:
    /// the whole view becomes inconsistent).
    pub fn from_half(half: &abi::GuestHalf) -> GuestView {
        if half.seq & 1 != 0 {
            let mut v = GuestView::inconsistent();
            v.clamped = 1;
            return v;
        }
        let mut clamped = 0u32;
        if half.flags & !abi::GF_ALL != 0 {
            clamped += 1;
        }
        if half.cs_flags & !abi::CS_ALL != 0 {
            clamped += 1;
        }
        let policy = match GuestPolicy::from_abi(half.policy) {
            Some(p) => p,
            None => {
                clamped += 1;
                GuestPolicy::Normal
            }
        };
        let rt_priority = if policy.is_rt() {
            if (1..=99).contains(&half.rt_priority) {
                half.rt_priority as u8
            } else {
                clamped += 1;
                half.rt_priority.clamp(1, 99) as u8
            }
        } else {
            if half.rt_priority != 0 {
                clamped += 1;
            }
            0
        };
        let nice = if (-20..=19).contains(&half.nice) {
            half.nice as i8
        } else {
            clamped += 1;
            half.nice.clamp(-20, 19) as i8
        };
        let (pending, bad_pending) = sanitize_pending(half.guest_pending);
        if bad_pending {
            clamped += 1;
        }
        let (lock_holder, bad_holder) = LockHolder::from_abi(half.lock_holder);
        if bad_holder {
            clamped += 1;
        }
        if half.lock_flags & !abi::LOCK_F_ALL != 0 {
            clamped += 1;
        }
        GuestView {
            consistent: true,
            active: half.flags & abi::GF_ACTIVE != 0,
            idle: half.flags & abi::GF_IDLE != 0,
            boost_req: half.flags & abi::GF_BOOST_REQ != 0,
            cs_flags: half.cs_flags & abi::CS_ALL,
            policy,
            rt_priority,
            nice,
            pending,
            lock_holder,
            lock_flags: half.lock_flags & abi::LOCK_F_ALL,
            lock_contended: half.lock_contended_count,
            lock_preempted: half.lock_preempted_count,
            rt_switches: half.rt_switch_count,
            seq: half.seq,
            clamped,
        }
    }

    /// The view an event carries: `from_half` when the read was consistent, else
    /// [`GuestView::inconsistent`].
    pub fn from_read(half: &abi::GuestHalf, consistent: bool) -> GuestView {
        if consistent {
            GuestView::from_half(half)
        } else {
            GuestView::inconsistent()
        }
    }

    /// Whether the view shows RT work: an RT or deadline task running, a boost request, or
    /// a pending RT hint.
    pub fn shows_rt_work(&self) -> bool {
        self.speaks()
            && ((!self.idle
                && (self.policy.is_rt() || self.policy == GuestPolicy::Deadline || self.boost_req))
                || self.pending.is_some())
    }

    /// Whether the guest ran RT work between `earlier` and this view: its RT switch count
    /// moved (both views speaking). A guest can claim RT work this way as it can by
    /// publishing an RT task: it earns halt boosts, within the same budget.
    pub fn ran_rt_since(&self, earlier: &GuestView) -> bool {
        self.speaks() && earlier.speaks() && self.rt_switches != earlier.rt_switches
    }

    /// Whether the guest may ask for anything: consistent and active.
    pub const fn speaks(&self) -> bool {
        self.consistent && self.active
    }
}

impl Default for GuestView {
    fn default() -> Self {
        GuestView::inconsistent()
    }
}

/// Decodes `guest_pending`: `(hint, counted_as_clamped)`. Zero is "no hint"; a word with
/// reserved bits, without the valid bit, with an unknown policy, or with an RT priority
/// outside 1..=99 (non-zero for deadline and CFS classes) produces no hint and is counted.
/// Valid hints for CFS classes are dropped silently: they are legal but carry no urgency.
fn sanitize_pending(word: u64) -> (Option<PendingHint>, bool) {
    if word == 0 {
        return (None, false);
    }
    if word & abi::PENDING_VALID == 0 || word & abi::PENDING_RESERVED != 0 {
        return (None, true);
    }
    let prio = (word & abi::PENDING_PRIO_MASK) as u8;
    let policy_num = ((word & abi::PENDING_POLICY_MASK) >> abi::PENDING_POLICY_SHIFT) as u32;
    let Some(policy) = GuestPolicy::from_abi(policy_num) else {
        return (None, true);
    };
    if policy.is_rt() {
        if (1..=99).contains(&prio) {
            (
                Some(PendingHint {
                    policy,
                    rt_priority: prio,
                }),
                false,
            )
        } else {
            (None, true)
        }
    } else if prio != 0 {
        (None, true)
    } else if policy == GuestPolicy::Deadline {
        (
            Some(PendingHint {
                policy,
                rt_priority: 0,
            }),
            false,
        )
    } else {
        (None, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn half() -> abi::GuestHalf {
        abi::GuestHalf {
            flags: abi::GF_ACTIVE,
            ..Default::default()
        }
    }

    fn pending(policy: u32, prio: u64) -> u64 {
        abi::PENDING_VALID | ((policy as u64) << abi::PENDING_POLICY_SHIFT) | prio
    }

    #[test]
    fn clean_half_is_taken_as_is_with_nothing_clamped() {
        let mut h = half();
        h.policy = abi::POLICY_FIFO;
        h.rt_priority = 50;
        h.nice = -3;
        h.cs_flags = abi::CS_HARDIRQ;
        h.seq = 42;
        let v = GuestView::from_half(&h);
        assert!(v.speaks());
        assert_eq!(v.policy, GuestPolicy::Fifo);
        assert_eq!(v.rt_priority, 50);
        assert_eq!(v.nice, -3);
        assert_eq!(v.cs_flags, abi::CS_HARDIRQ);
        assert_eq!(v.clamped, 0);
    }

    #[test]
    fn unknown_policy_reads_as_normal_and_counts() {
        let mut h = half();
        h.policy = 4;
        let v = GuestView::from_half(&h);
        assert_eq!(v.policy, GuestPolicy::Normal);
        assert_eq!(v.clamped, 1);
    }

    #[test]
    fn rt_priority_out_of_range_is_clamped_and_counted() {
        let mut h = half();
        h.policy = abi::POLICY_RR;
        h.rt_priority = 1000;
        assert_eq!(GuestView::from_half(&h).rt_priority, 99);
        h.rt_priority = 0;
        let v = GuestView::from_half(&h);
        assert_eq!((v.rt_priority, v.clamped), (1, 1));
    }

    #[test]
    fn rt_priority_on_a_cfs_policy_is_zeroed_and_counted() {
        let mut h = half();
        h.rt_priority = 7;
        let v = GuestView::from_half(&h);
        assert_eq!((v.rt_priority, v.clamped), (0, 1));
    }

    #[test]
    fn nice_out_of_range_is_clamped_and_counted() {
        let mut h = half();
        h.nice = i32::MIN;
        let v = GuestView::from_half(&h);
        assert_eq!((v.nice, v.clamped), (-20, 1));
        h.nice = 20;
        assert_eq!(GuestView::from_half(&h).nice, 19);
    }

    #[test]
    fn unknown_flag_and_cs_bits_are_dropped_and_counted() {
        let mut h = half();
        h.flags |= 1 << 31;
        // Bit 3: CS_PREEMPT_OFF until ABI minor 4, reserved since (never set by a guest).
        h.cs_flags = abi::CS_SOFTIRQ | (1 << 20) | (1 << 3);
        let v = GuestView::from_half(&h);
        assert_eq!(v.cs_flags, abi::CS_SOFTIRQ);
        assert_eq!(v.clamped, 2);
    }

    #[test]
    fn odd_seq_makes_the_view_inconsistent() {
        let mut h = half();
        h.seq = 3;
        h.cs_flags = abi::CS_HARDIRQ;
        let v = GuestView::from_half(&h);
        assert!(!v.consistent);
        assert_eq!(v.cs_flags, 0);
        assert_eq!(v.clamped, 1);
    }

    #[test]
    fn valid_rt_pending_hint_is_decoded() {
        let mut h = half();
        h.guest_pending = pending(abi::POLICY_FIFO, 30);
        let v = GuestView::from_half(&h);
        assert_eq!(
            v.pending,
            Some(PendingHint {
                policy: GuestPolicy::Fifo,
                rt_priority: 30
            })
        );
        assert_eq!(v.clamped, 0);
    }

    #[test]
    fn pending_word_with_reserved_bits_is_ignored_and_counted() {
        let mut h = half();
        h.guest_pending = pending(abi::POLICY_FIFO, 30) | (1 << 40);
        let v = GuestView::from_half(&h);
        assert_eq!((v.pending, v.clamped), (None, 1));
    }

    #[test]
    fn pending_word_without_valid_bit_is_ignored_and_counted() {
        let mut h = half();
        h.guest_pending = pending(abi::POLICY_FIFO, 30) & !abi::PENDING_VALID;
        let v = GuestView::from_half(&h);
        assert_eq!((v.pending, v.clamped), (None, 1));
    }

    #[test]
    fn pending_rt_hint_with_priority_zero_is_ignored_and_counted() {
        let mut h = half();
        h.guest_pending = pending(abi::POLICY_RR, 0);
        let v = GuestView::from_half(&h);
        assert_eq!((v.pending, v.clamped), (None, 1));
    }

    #[test]
    fn pending_hint_for_a_cfs_task_is_dropped_silently() {
        let mut h = half();
        h.guest_pending = pending(abi::POLICY_NORMAL, 0);
        let v = GuestView::from_half(&h);
        assert_eq!((v.pending, v.clamped), (None, 0));
    }

    #[test]
    fn inconsistent_read_yields_no_request() {
        let mut h = half();
        h.cs_flags = abi::CS_ALL;
        let v = GuestView::from_read(&h, false);
        assert_eq!(v, GuestView::inconsistent());
        assert!(!v.speaks());
    }
}
