/* SPDX-License-Identifier: GPL-2.0 */
/*
 * pvsched host event sources: the interface between the BPF programs
 * (pvsched.bpf.c) and the daemon (crates/host/src/events.rs).
 *
 * This is the ONE definition of the ring-buffer record and of the map
 * values. The Rust side decodes records by offset; the offsets below are
 * asserted here with _Static_assert and on the Rust side against the types
 * that libbpf-cargo generates from this header (tests in events.rs), so a
 * change here that is not mirrored in Rust fails the build or the tests.
 *
 * Rules: fixed-width fields only, explicit padding, no 64-bit enumerators
 * (clang < 16 emits them wrongly into BTF), little-endian host order.
 */
#ifndef __PVSCHED_INTF_H
#define __PVSCHED_INTF_H

/* Event kinds (struct pvs_event.kind). 0 is never emitted. */
enum pvs_event_kind {
	PVS_EV_SWITCH_OUT = 1,	 /* tracked thread left a CPU */
	PVS_EV_SWITCH_IN = 2,	 /* tracked thread got a CPU */
	PVS_EV_WAKING = 3,	 /* tracked thread is being woken */
	PVS_EV_KVM_EXIT = 4,	 /* HLT or PAUSE exit of a tracked vCPU thread */
	PVS_EV_KVM_WAKEUP = 5,	 /* kvm_vcpu_wakeup: end of a halt */
	PVS_EV_KVM_IRQ = 6,	 /* interrupt accepted by a vCPU's local APIC */
	PVS_EV_KIND_MAX = 6,
};

/* Bits of struct pvs_event.flags; their meaning depends on the kind. */
enum pvs_event_flag {
	/* SWITCH_OUT: prev was still TASK_RUNNING (preempted), else it blocked */
	PVS_F_RUNNABLE = 1u << 0,
	/* WAKING: the waker is a tracked thread of the same VM (IPI) */
	PVS_F_WAKER_VCPU = 1u << 1,
	/* WAKING: the waker is another thread of the woken thread's process */
	PVS_F_WAKER_SAME_VMM = 1u << 2,
	/* WAKING: woken from hard-IRQ, NMI or softirq context (timer, device);
	 * the "current" task is then unrelated, waker flags are not set */
	PVS_F_WAKER_IRQ = 1u << 3,
	/* KVM_EXIT: the exit was a HLT */
	PVS_F_EXIT_HLT = 1u << 4,
	/* KVM_EXIT: the exit was a PAUSE (pause-loop exiting) */
	PVS_F_EXIT_PAUSE = 1u << 5,
	/* KVM_EXIT: isa of the exit reason: VMX if set, SVM if clear */
	PVS_F_ISA_VMX = 1u << 6,
	/* KVM_WAKEUP: the vCPU slept ("waited"); clear: halt-polling caught it */
	PVS_F_WAITED = 1u << 7,
	/* KVM_WAKEUP: the halt-poll window was valid for this halt */
	PVS_F_POLL_VALID = 1u << 8,
	/* Any kind: submitted without a wakeup (a lazy class of the vCPU, or
	 * an idle-CPU wakeup): the daemon reads it late, so its latency is no
	 * reaction time. Set by the program at submission, not guessed later. */
	PVS_F_QUIET = 1u << 9,
	/* WAKING: the CPU the thread last ran on runs its idle task, so the
	 * thread gets a CPU at once without any boost (see quiet_idle_wakeups) */
	PVS_F_CPU_IDLE = 1u << 10,
	/* SWITCH_OUT, WAKING and KVM_IRQ: no CPU ran a task from outside the
	 * thread's VM (each ran its idle task, the daemon or a thread of the
	 * same process): the VM competes only with itself, so a boost would
	 * only reorder its own threads (see find_rivals in pvsched.bpf.c) */
	PVS_F_NO_RIVAL = 1u << 11,
	/* SWITCH_OUT, WAKING and KVM_IRQ: no CPU ran a task from outside
	 * every VM the daemon serves (vmm_tgid): any rival is another served
	 * VM's thread. Set whenever PVS_F_NO_RIVAL is. */
	PVS_F_NO_HOST_RIVAL = 1u << 12,
	PVS_F_ALL = (1u << 13) - 1,
};

/*
 * One ring-buffer record, 40 bytes, every kind the same size.
 *
 *   kind          tid          vm, vcpu          cpu               arg
 *   SWITCH_OUT    prev         tracked[prev]     CPU it left       next tid
 *   SWITCH_IN     next         tracked[next]     CPU it got        prev tid
 *   WAKING        woken        tracked[woken]    target CPU        waker tid
 *   KVM_EXIT      vCPU thread  tracked[tid]      CPU               raw exit reason
 *   KVM_WAKEUP    vCPU thread  tracked[tid]      CPU               halt ns
 *   KVM_IRQ       sender       vmm_tgid[tgid]    CPU               vector
 *                              vcpu = apicid
 */
struct pvs_event {
	__u64 ts_ns;	/* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u32 kind;	/* enum pvs_event_kind */
	__u32 flags;	/* enum pvs_event_flag */
	__u32 tid;
	__u32 vm;
	__u32 vcpu;
	__u32 cpu;
	__u64 arg;
};

#define PVS_EVENT_SIZE 40

/*
 * Value of the `tracked` hash map, keyed by thread id (u32). lazy_slot
 * indexes the `lazy` array: that vCPU's enum pvs_lazy bits.
 */
struct pvs_vcpu {
	__u32 vm;
	__u32 vcpu;
	__u32 lazy_slot;
	/* Switch-ins so far, counted by the programs (the daemon writes 0):
	 * tells a preemption by the daemon that was followed by a run on
	 * another CPU from one that was not. */
	__u32 switch_seq;
};

/*
 * Key of the `vcpu_slots` hash map (value: u32, the vCPU's lazy_slot, as
 * in `tracked`): the cell of a vCPU known by its index, not its thread,
 * as KVM_IRQ's target is (the sender runs the program).
 */
struct pvs_vcpu_key {
	__u32 vm;
	__u32 vcpu;
};

/*
 * Bits of a `lazy` array element (u64 per tracked vCPU, written by the
 * daemon through an mmap, read by the programs): records of a class whose
 * bit is set are queued without waking the daemon, which reads them at its
 * next wakeup (another record, its timer). The daemon sets them for what
 * cannot change its decision now, e.g. every record of a boosted vCPU it
 * already re-reads on a timer. 0 (the initial value): every record wakes it.
 */
enum pvs_lazy {
	PVS_LAZY_SWITCH_IN = 1u << 0,	/* SWITCH_IN */
	PVS_LAZY_PREEMPTED = 1u << 1,	/* SWITCH_OUT, runnable */
	PVS_LAZY_BLOCKED = 1u << 2,	/* SWITCH_OUT, blocked */
	PVS_LAZY_WAKING = 1u << 3,	/* WAKING */
	PVS_LAZY_KVM_EXIT = 1u << 4,	/* KVM_EXIT (HLT and PAUSE) */
	PVS_LAZY_KVM_WAKEUP = 1u << 5,	/* KVM_WAKEUP */
	PVS_LAZY_NO_RIVAL = 1u << 6,	/* SWITCH_OUT runnable, WAKING and
					 * KVM_IRQ flagged PVS_F_NO_RIVAL */
	PVS_LAZY_NO_HOST_RIVAL = 1u << 7, /* ... flagged PVS_F_NO_HOST_RIVAL */
	PVS_LAZY_KVM_IRQ = 1u << 8,	/* KVM_IRQ: read in the target vCPU's
					 * cell (`vcpu_slots`), not the sender's */
	PVS_LAZY_ALL = (1u << 9) - 1,
};

/* Index of the per-CPU `stats` array (u64 per CPU). */
enum pvs_stat {
	PVS_STAT_DROPPED = 0,	/* ring buffer full: event lost */
	PVS_STAT_EMITTED = 1,	/* events submitted */
	PVS_STAT_LAZY = 2,	/* of those, submitted without a wakeup */
	PVS_STAT_NR = 3,
};

/* kvm_exit reasons we keep (arch/x86/include/uapi/asm/{vmx,svm}.h). */
#define PVS_KVM_ISA_VMX 1
#define PVS_KVM_ISA_SVM 2
#define PVS_VMX_EXIT_HLT 12
#define PVS_VMX_EXIT_PAUSE 40
#define PVS_SVM_EXIT_PAUSE 0x077
#define PVS_SVM_EXIT_HLT 0x078

_Static_assert(sizeof(struct pvs_event) == PVS_EVENT_SIZE, "pvs_event size");
_Static_assert(__builtin_offsetof(struct pvs_event, kind) == 8, "kind");
_Static_assert(__builtin_offsetof(struct pvs_event, flags) == 12, "flags");
_Static_assert(__builtin_offsetof(struct pvs_event, tid) == 16, "tid");
_Static_assert(__builtin_offsetof(struct pvs_event, vm) == 20, "vm");
_Static_assert(__builtin_offsetof(struct pvs_event, vcpu) == 24, "vcpu");
_Static_assert(__builtin_offsetof(struct pvs_event, cpu) == 28, "cpu");
_Static_assert(__builtin_offsetof(struct pvs_event, arg) == 32, "arg");
_Static_assert(sizeof(struct pvs_vcpu) == 16, "pvs_vcpu size");

/*
 * The sched_ext backend (sched_ext.bpf.c).
 *
 * Value of the `scx_grants` hash map, keyed by thread id (u32): what the
 * daemon's policy grants a vCPU thread. Written only by the daemon, whole.
 */
struct pvs_scx_grant {
	/* Address of the vCPU's slot (struct pvsched_slot) in its VMM's
	 * address space; 0: unknown, no extension. Read with
	 * bpf_probe_read_user while the vCPU thread is the current task. */
	__u64 slot_addr;
	/* 0: not boosted; else the policy's RT priority for it (1..99):
	 * dispatched ahead of unboosted tasks, preempting on wakeup. */
	__u32 boost;
	/* enum pvs_scx_boost_kind: what keeps the boost at an enqueue. */
	__u32 boost_kind;
	/*
	 * Boosts the program decides itself, within the policy's budget:
	 * at an enqueue, a vCPU whose slot showed guest RT work (an RT or
	 * deadline task, a boost request) when it last stopped, one woken
	 * from a halt within halt_window_ns of guest RT work seen, and, as
	 * kflags allow, one preempted in a critical section or one woken onto
	 * a busy CPU (for wake_boost_ns), is boosted at kboost (0: none) while
	 * its total (pvs_scx_vcpu.kboost_ns) stays below
	 * pvs_scx_vcpu.kboost_allowed_ns, which the daemon raises from the
	 * VM's boost budget at each scan.
	 */
	__u32 kboost;
	__u32 kflags;		/* enum pvs_scx_kflags */
	__u64 halt_window_ns;
	__u64 wake_boost_ns;
	/*
	 * The policy's rules for a long burst, applied by the program to its
	 * own boosts (the policy's max_boost_ns, demote_after_ns, throttle_ns):
	 * boosted time not yet matched by as much halted or unboosted time
	 * (pvs_scx_vcpu.kburst_ns) beyond demote_after_ns boosts at priority 1
	 * only, so that a fresh boost of any other vCPU preempts it, and is
	 * counted apart (kboost_demoted_ns, charged more by the daemon);
	 * beyond max_boost_ns the vCPU gets no boost of the program's for
	 * throttle_ns. 0: no such rule.
	 */
	__u64 demote_after_ns;
	__u64 max_boost_ns;
	__u64 throttle_ns;
	/*
	 * Lock holders (the VM's honor_lock_holders): this vCPU's index in its
	 * VM, the VM's slots to look at (0: no lock-holder extension) and the
	 * slot stride. At a slice end the program reads the other vCPUs'
	 * slots, in the same mapping as this one's (slot_addr + (j - index) x
	 * stride), for a published lock wait naming this vCPU as the holder:
	 * such a vCPU is extended as one in a critical section is.
	 */
	__u32 vcpu_index;
	__u32 lock_peers;
	__u32 slot_stride;
	/* This thread's record in scx_vcpus, an array the daemon reads
	 * through a mapping (no syscall per vCPU per scan). */
	__u32 record;
};

/* Slots a lock-holder check reads at most (grant.lock_peers beyond it are
 * not looked at). */
#define PVS_SCX_MAX_LOCK_PEERS 64

/* struct pvs_scx_grant.kflags: the policy's speculative reasons the
 * program may act on (each refused below the budget's reserve). */
enum pvs_scx_kflags {
	PVS_SCX_K_CS = 1u << 0,		/* preempted in a critical section */
	PVS_SCX_K_WAKE = 1u << 1,	/* woken onto a busy CPU */
};

/* What cut a running vCPU's slice short (pvs_scx_vcpu.holder_preempted_early_by). */
enum pvs_scx_cut {
	PVS_SCX_CUT_OTHER = 0,		/* none of the program's: a higher class, the kernel */
	PVS_SCX_CUT_BOOST = 1,		/* a boosted enqueue preempted it */
	PVS_SCX_CUT_KICK = 2,		/* the boost queue's kick */
	PVS_SCX_CUT_DAEMON = 3,		/* pvschedd's event thread woke there */
	PVS_SCX_CUT_GRANT = 4,		/* a boost granted to a queued vCPU (pvs_boost_queued) */
	PVS_SCX_CUT_POLL = 5,		/* the extension's poll ended its extension */
	PVS_SCX_CUT_WAKEUP = 6,		/* a woken task's wakeup preemption */
	PVS_SCX_CUT_YIELD = 7,		/* its guest yielded out of its locks during an extension */
	PVS_SCX_CUT_COUNT = 8,
};

/* Why the program boosted a vCPU itself (pvs_scx_vcpu.enq_kreason). */
enum pvs_scx_kreason {
	PVS_SCX_KR_NONE = 0,
	PVS_SCX_KR_RT = 1,		/* guest RT work, or a halt after it */
	PVS_SCX_KR_CS = 2,		/* preempted in a critical section */
	PVS_SCX_KR_WAKE = 3,		/* woken onto a busy CPU */
};

/*
 * struct pvs_scx_grant.boost_kind. A boost for something the guest says
 * (its RT task, a critical section, a boost request, a pending RT wakeup)
 * holds at an enqueue only while the slot, read when the vCPU last stopped,
 * still says so: the daemon no longer re-reads boosted vCPUs on a timer on
 * this backend. A proactive boost (halt, wakeup, interrupt) holds until the
 * daemon ends it.
 */
enum pvs_scx_boost_kind {
	PVS_SCX_BOOST_GUEST = 0,
	PVS_SCX_BOOST_PROACTIVE = 1,
};

/* An element of the `scx_vcpus` array, at its grant's `record`: written
 * by the program, except the two allowances at its end, which only the
 * daemon writes (through its mapping: no syscall per vCPU per scan; the
 * daemon zeroes the whole record before a grant names it). */
struct pvs_scx_vcpu {
	/* Extension time run: each extension charged when it ends, for what
	 * it ran, at most extension_ns (its grant reserves extension_ns
	 * against the allowance). */
	__u64 ext_ns;
	__u64 ext_count;	/* extensions granted */
	__u64 ext_refused;	/* in a critical section at slice end, over its allowance */
	__u64 boost_preempts;	/* boosted enqueues that preempted a CPU's task */
	__u64 boost_queued;	/* boosted enqueues to the shared boost queue */
	__u64 ext_in_slice;	/* extension added to the slice running now */
	__u64 slot_read_failed;	/* slot reads that faulted */
	/* 1: the slot showed a guest reason to boost when the vCPU last
	 * stopped (see enum pvs_scx_boost_kind). */
	__u32 guest_reason;
	/* 1: of those, guest RT work (not only a critical section). */
	__u32 guest_rt;
	__u64 boost_dropped;	/* boosted enqueues the slot no longer backed */
	/* Private to the program: when the thread was last woken or queued
	 * (0: it runs), and whether as a boost. */
	__u64 queued_at;
	__u32 queued_boosted;
	/* The boost decided at the last enqueue (0: none), and why the
	 * program decided it (enum pvs_scx_kreason; NONE: the daemon's). */
	__u32 enq_boost;
	__u32 enq_kreason;
	/* Whether the run in progress is boosted, and why (as above). */
	__u32 run_boosted;
	__u32 run_kreason;
	/* 1: stopped halted within the window of guest RT work: the wakeup
	 * is boosted (grant.halt_window_ns). */
	__u32 wake_boost;
	/* 1: stopped preempted with the slot showing a critical section. */
	__u32 cs_preempted;
	/* Of ext_lock_count, extensions at a preemption: a boosted vCPU would
	 * have preempted this one while its guest showed a lock held, and
	 * waited for the extension instead. */
	__u32 ext_at_preempt_count;
	/* Private to the program: a tick found the running slice used up and
	 * extended it no further (the stop that follows is its slice end). */
	__u32 slice_ended;
	/* Private: stopped runnable showing a lock held (noted on its CPU
	 * again when it next runs, until its first tick reads the slot). */
	__u32 lock_at_stop;
	/* Stopped runnable (preempted) while its guest showed a sleeping lock
	 * held (CS_LOCK, lock holders honoured): at the slice end after an
	 * extension, at a slice end without one (none due, or refused), and
	 * before its slice end (a boosted vCPU, a kick, a higher class). The
	 * host's own count of holder preemptions, whoever waited. */
	__u64 holder_preempted_extended;
	__u64 holder_preempted_unextended;
	__u64 holder_preempted_early;
	__u64 run_start;	/* when the run in progress started */
	__u64 last_rt_ns;	/* when the slot last showed guest RT work */
	__u64 rt_switches;	/* the slot's rt_switch_count then */
	__u64 kboost_ns;	/* time run under the program's own boosts */
	__u64 kboost_cs_ns;	/* of it, for a critical section */
	__u64 kboosts;		/* enqueues the program boosted itself */
	__u64 kboost_demoted_ns;	/* of kboost_ns, run demoted */
	__u64 kburst_ns;	/* boosted time not yet matched (grant.max_boost_ns) */
	__u64 halted_at;	/* when it stopped halted; 0: it did not */
	__u64 kthrottled_until;	/* no boost of the program's before this */
	__u64 kthrottles;	/* times it was throttled */
	__u32 run_demoted;	/* the run in progress is boosted demoted */
	__u32 enq_demoted;	/* the boost decided at the last enqueue is */
	/* Of ext_count, extensions for a lock wait naming this vCPU (its own
	 * slot showed no critical section), and their time. */
	__u64 ext_lock_count;
	__u64 ext_lock_ns;
	/* Written by the daemon only, each an aligned 8-byte store. Extension
	 * time this vCPU may have had in total since it was registered: the
	 * daemon raises it as the VM's budget allows, the program compares its
	 * own total (ext_ns) against it. */
	__u64 ext_allowed_ns;
	/* Time the program's own boosts may have had in total (kboost_ns;
	 * see pvs_scx_grant.kboost). */
	__u64 kboost_allowed_ns;
	/* Private: when the extension running now started, and whether it is
	 * a lock holder's (its time counted in ext_lock_ns too). */
	__u64 ext_at;
	__u32 ext_is_lock;
	/* Private: the extension running now went on into its tail. */
	__u32 ext_in_tail;
	/* Extensions ended early at a poll that found the guest out of its
	 * critical section (sched_ext extension_poll_ns): preempted at a
	 * lock-free point instead of at the extension's end. */
	__u64 ext_ended_early;
	/* Of holder_preempted_early, by what took the CPU (enum
	 * pvs_scx_cut): the program's own preemptions, noted on the CPU when
	 * it decides them; OTHER, none of them (a higher class, the kernel). */
	__u64 holder_preempted_early_by[8];
	/* Extensions for a lock holder still in its lock when they ran out
	 * that went on for a tail (sched_ext extension_tail_ns), polled
	 * finer, and of those, the tails ended at a lock-free point. */
	__u64 ext_tails;
	__u64 ext_tails_ended_early;
	/* Private: stopped in its lock, before its slice end, for pvschedd's
	 * event thread: the slice it had left, which its next enqueue runs
	 * next on its CPU, right after the daemon (0: none). */
	__u64 resume_slice;
	/* Of holder_preempted_early_by[PVS_SCX_CUT_DAEMON], the holders that
	 * ran again right after the daemon, for the rest of their slice. */
	__u64 holder_resumed;
	/* Time from those stops in a lock to the vCPU's next run, by how
	 * they came, as holder_preempted_*: after an extension, at a slice
	 * end without one, before its slice end. The guests' count of waits
	 * that find their holder preempted follows this time more than the
	 * number of stops. */
	__u64 holder_preempted_ns_extended;
	__u64 holder_preempted_ns_unextended;
	__u64 holder_preempted_ns_early;
	/* Private: when it last stopped in its lock (0: it did not), and how
	 * (0 after an extension, 1 at a slice end without one, 2 before its
	 * slice end). */
	__u64 holder_stopped_at;
	__u64 holder_stop_kind;
	/* Extensions its guest ended by yielding at a point out of its locks
	 * (PVSCHED_F_EXT_NOTICE): preempted between two locks at once. */
	__u64 ext_yielded;
	/* Private: the ext_notice its slot shows, as this program last wrote
	 * it at an entry to the guest (0: none). */
	__u32 notice_shown;
	/* Entries to the guest whose write of ext_notice failed. */
	__u32 notice_write_failed;
};

/*
 * Queued-to-running delay of vCPU threads, the scheduling decision's own
 * latency on this backend: from the wakeup or enqueue at which the program
 * decides (boosted or not) to the vCPU running. Log2 buckets of ns: bucket
 * i counts delays in [2^i, 2^(i+1)) ns, bucket 0 also 0 and 1.
 */
#define PVS_SCX_LAT_BUCKETS 40

/* Program-wide counters (one global, atomic adds). */
struct pvs_scx_totals {
	__u64 enqueues;
	__u64 boost_preempts;
	__u64 boost_queued;
	__u64 extensions;
	__u64 ext_refused;
	__u64 slot_read_failed;
	__u64 boost_moved;	/* queued vCPUs moved ahead at a grant */
	__u64 kboosts;		/* enqueues the program boosted itself */
	__u64 wakeup_preempts;	/* woken tasks that preempted a later one */
	__u64 kthrottles;	/* vCPUs throttled for a long burst */
	__u64 ext_lock;		/* of extensions, for a lock holder */
	__u64 ext_at_preempt;	/* of ext_lock, at a preemption deferred */
	__u64 vcpus_spread;	/* woken vCPUs sent away from a sibling's CPU */
	__u64 daemon_moved;	/* daemon wakeups sent to the waker's CPU, away from a lock VM's vCPU */
	__u64 fair_pulls;	/* tasks a CPU took from another CPU's fair queue */
	/* vCPUs preempted showing a lock held (pvs_scx_vcpu's three counts). */
	__u64 holder_preempted_extended;
	__u64 holder_preempted_unextended;
	__u64 holder_preempted_early;
	__u64 ext_ended_early;	/* extensions ended at a lock-free point */
	__u64 ext_polls;	/* slot reads of the extension's poll */
	__u64 ext_poll_errors;	/* poll timers that failed to start */
	__u64 ext_tails;	/* extensions that went on for a tail */
	__u64 ext_tails_ended_early;	/* tails ended at a lock-free point */
	/* A vCPU's slice ends that earned an extension or a tail with nothing
	 * waiting for its CPU: none granted (the dispatch keeps it running). */
	__u64 slice_ends_uncontended;
	/* Preemptions of a lock-handling vCPU whose slot could not be read
	 * where they were decided, left to its CPU's dispatch; of those and
	 * the boost queue's and wakeups' kicks, the holders that dispatch
	 * found in their lock and kept for an extension. */
	__u64 preempts_checked;
	__u64 holders_kept_at_dispatch;
	/* Holders preempted in their lock for pvschedd's event thread that
	 * ran again right after it (pvs_scx_vcpu.holder_resumed). */
	__u64 holders_resumed;
	/* PVSCHED_F_EXT_NOTICE: extension notices written to slots (set or
	 * cleared) and writes that failed; extensions ended at the guest's
	 * yield, and yields that came with no extension running (late). */
	__u64 notice_writes;
	__u64 notice_write_failed;
	__u64 ext_yielded;
	__u64 yields_unextended;
	__u64 queued_to_run_boosted[PVS_SCX_LAT_BUCKETS];
	__u64 queued_to_run_other[PVS_SCX_LAT_BUCKETS];
};

/* Why the kernel ended the scheduler (its ops.exit), kept for the daemon. */
#define PVS_SCX_REASON_LEN 128
#define PVS_SCX_MSG_LEN 256
struct pvs_scx_exit {
	__u32 exited;		/* 1 once ops.exit ran */
	__s32 kind;		/* enum scx_exit_kind */
	__s64 exit_code;
	char reason[PVS_SCX_REASON_LEN];
	char msg[PVS_SCX_MSG_LEN];
};

/*
 * The context of pvs_boost_queued (BPF_PROG_TYPE_SYSCALL, run by the daemon
 * with BPF_PROG_TEST_RUN right after it grants a boost): a vCPU thread
 * already queued by vtime is moved to the boost queue, or onto its CPU at
 * once if that CPU runs a weaker task. `moved` is written back.
 */
struct pvs_scx_boost_queued {
	__u32 tid;
	__u32 moved;
};

/* The scheduler's own dispatch queues: the boost queue, shared; and from
 * PVS_SCX_DSQ_FAIR on, one fair queue per CPU (PVS_SCX_DSQ_FAIR + cpu). */
#define PVS_SCX_DSQ_BOOST 0
#define PVS_SCX_DSQ_FAIR 1

_Static_assert(sizeof(struct pvs_scx_grant) == 80, "pvs_scx_grant size");
_Static_assert(sizeof(struct pvs_scx_vcpu) == 448, "pvs_scx_vcpu size");

#endif /* __PVSCHED_INTF_H */
