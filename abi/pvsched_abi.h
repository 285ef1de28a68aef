/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * pvsched shared-region ABI, version 1.8.
 *
 * The ONE definition of the memory a KVM guest and its host share for
 * cooperative vCPU scheduling. Guest kernel module, host daemon (through
 * crates/abi, whose Rust structs and constants bindgen generates from this
 * file at build time) and test vectors all follow it.
 *
 * Region layout (little endian, x86-64 first):
 *
 *   offset 0                 struct pvsched_header        (PVSCHED_HEADER_SIZE)
 *   offset header_size       struct pvsched_slot [slot_count], slot_size each
 *
 * Ownership: every 64-byte cache line has exactly one writer.
 *   header line 0        host   (magic, versions, sizes, features offered)
 *   header line 1        guest  (features accepted, generation bound to)
 *   slot guest half      the guest CPU that owns the slot (seqcount-protected)
 *   slot guest_pending   any guest CPU, one atomic 64-bit word (see below)
 *   slot host half       the host daemon (seqcount-protected)
 *
 * Seqcount protocol (both halves): the writer makes seq odd, issues a write
 * barrier, writes the fields, issues a write barrier, makes seq even again.
 * A reader reads seq, a read barrier, the fields, a read barrier, seq again,
 * and keeps the copy only if both reads are equal and even. Readers retry a
 * bounded number of times (PVSCHED_READ_RETRIES); a half that never reads
 * consistently is treated as "no request".
 *
 * Everything the guest writes is untrusted input to the host: the host clamps
 * it against its own configuration and never takes a size, pointer, thread id
 * or path from it.
 */
#ifndef PVSCHED_ABI_H
#define PVSCHED_ABI_H

#ifdef __KERNEL__
#include <linux/types.h>
#include <linux/build_bug.h>
#define PVSCHED_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#define PVSCHED_OFFSETOF(type, member) offsetof(type, member)
#elif defined(__bpf__)
/* A BPF program: the fixed-width types come from its vmlinux.h. */
#define PVSCHED_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#define PVSCHED_OFFSETOF(type, member) __builtin_offsetof(type, member)
#else
#include <stddef.h>
#include <stdint.h>
typedef uint16_t __u16;
typedef uint32_t __u32;
typedef int32_t __s32;
typedef uint64_t __u64;
#define PVSCHED_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#define PVSCHED_OFFSETOF(type, member) offsetof(type, member)
#endif

/* "PVSCHED\0" read as a little-endian 64-bit word. */
#define PVSCHED_MAGIC		0x0044454843535650ULL
#define PVSCHED_ABI_MAJOR	1
#define PVSCHED_ABI_MINOR	8

#define PVSCHED_CACHELINE	64
#define PVSCHED_HEADER_SIZE	128
#define PVSCHED_SLOT_SIZE	256
/* Upper bound a reader accepts, whatever the header says. */
#define PVSCHED_MAX_SLOTS	4096
/* Bounded retries of a seqcount read before giving up. */
#define PVSCHED_READ_RETRIES	16

/*
 * Feature bits. The host offers (header.host_features), the guest accepts a
 * subset (header.guest_features). Unknown bits are ignored by both sides.
 */
/* Host writes the host half of every slot (status, applied params). */
#define PVSCHED_F_HOST_HALF	(1ULL << 0)
/* Guest publishes a pending-task hint in slot.guest_pending. */
#define PVSCHED_F_PENDING_HINT	(1ULL << 1)
/* Guest honours explicit boost requests from its user space. */
#define PVSCHED_F_BOOST_REQUEST	(1ULL << 2)
/*
 * Since minor 1: the host half carries idle hints (wake_p50_ns, wake_p99_ns,
 * poll_budget_permille; PVSCHED_HF_OVERLOADED is in every minor) for a guest
 * idle driver.
 */
#define PVSCHED_F_IDLE_HINTS	(1ULL << 3)
/*
 * Since minor 2: the host listens on an ivshmem-doorbell vector. A guest
 * whose device has the Doorbell register (BAR0 offset 12) writes
 * header.doorbell there when it publishes that the reason for a boost in
 * force is gone (host half PVSCHED_HF_BOOSTED, no RT task, no critical
 * section, not idle), at most once per host-half update: the host unboosts
 * at once instead of finding out on a timer.
 */
#define PVSCHED_F_DOORBELL	(1ULL << 4)
/*
 * Since minor 3: the guest publishes lock waits (guest half lock_holder,
 * lock_flags and the lock counters): a task on this vCPU waits for a lock
 * whose holder runs on another vCPU, named when the guest kernel records the
 * owner (mutex, rwsem held for writing), else "some other vCPU" (spinlocks,
 * rwlocks, rwsems held for reading). The host may then run the holder's vCPU
 * for a bounded extension when it is preempted, charged to the VM.
 */
#define PVSCHED_F_LOCK_WAIT	(1ULL << 5)
/*
 * Since minor 6: the guest publishes PVSCHED_CS_LOCK while the task running
 * on the vCPU holds a sleeping lock (a mutex, an rwsem for reading or
 * writing) that it took with a blocking call, seen at the call's entry, so
 * that the host can keep a holder on its CPU before anyone waits for it. A
 * host offers it where it acts on it (lock holders honoured).
 */
#define PVSCHED_F_LOCK_HOLD	(1ULL << 6)
/*
 * Since minor 8, with PVSCHED_F_LOCK_HOLD: the host's scheduler keeps the
 * host half's ext_notice current while the vCPU runs (an extension's number
 * while the vCPU runs on an extension the host granted for what its slot
 * showed, 0 otherwise, as of the vCPU's last entry to the guest). A guest
 * that accepts it hands the CPU back at its first point out of its sleeping
 * locks during such an extension, once per number: a KVM_HC_SCHED_YIELD
 * hypercall to PVSCHED_YIELD_TO_NONE with PVSCHED_YIELD_TAG as its second
 * argument, which KVM itself ignores and the host's scheduler takes as the
 * extension's end. The holder is then preempted between two locks, as eCS's
 * guest yields at the end of its critical section, instead of inside the
 * next lock when the extension runs out. Only on KVM.
 */
#define PVSCHED_F_EXT_NOTICE	(1ULL << 7)
#define PVSCHED_F_ALL		(PVSCHED_F_HOST_HALF | PVSCHED_F_PENDING_HINT | \
				 PVSCHED_F_BOOST_REQUEST | PVSCHED_F_IDLE_HINTS | \
				 PVSCHED_F_DOORBELL | PVSCHED_F_LOCK_WAIT | \
				 PVSCHED_F_LOCK_HOLD | PVSCHED_F_EXT_NOTICE)

/*
 * PVSCHED_F_EXT_NOTICE's yield: KVM_HC_SCHED_YIELD's first argument, an
 * APIC ID no vCPU has (x2APIC's broadcast; KVM yields to nobody), and its
 * second ("PVSCHED\0", unused by KVM), which tells the host it is this.
 */
#define PVSCHED_YIELD_TO_NONE	0xffffffffULL
#define PVSCHED_YIELD_TAG	0x0044454843535650ULL	/* PVSCHED_MAGIC */

/* ivshmem's Doorbell register: BAR0 offset, value = peer ID << 16 | vector. */
#define PVSCHED_IVSHMEM_DOORBELL_REG	12

/* struct pvsched_guest_half.flags */
/* A guest CPU serves this slot; clear = nothing to act on. */
#define PVSCHED_GF_ACTIVE	(1U << 0)
/* The CPU runs its idle task (heading into halt). */
#define PVSCHED_GF_IDLE		(1U << 1)
/* The running task asked for a boost explicitly. */
#define PVSCHED_GF_BOOST_REQ	(1U << 2)
#define PVSCHED_GF_ALL		(PVSCHED_GF_ACTIVE | PVSCHED_GF_IDLE | \
				 PVSCHED_GF_BOOST_REQ)

/*
 * struct pvsched_guest_half.cs_flags: kernel critical sections in progress.
 * Bits 0 and 3 are reserved (never set; a host ignores them): until minor 4
 * they were named CS_NMI and CS_PREEMPT_OFF, which no guest set, as a
 * module on a stock kernel cannot observe them (no NMI entry/exit
 * tracepoint, no preempt-toggle tracepoints in a distribution kernel).
 * Bit 4 was a CS_LOCK no guest set until minor 4, reserved in minor 5, and
 * is CS_LOCK again since minor 6, set only where F_LOCK_HOLD was accepted.
 */
#define PVSCHED_CS_HARDIRQ	(1U << 1)
#define PVSCHED_CS_SOFTIRQ	(1U << 2)
/*
 * F_LOCK_HOLD: the running task holds a sleeping lock it took by a blocking
 * call (not one it waits for; not a trylock's, not a spinlock). The one
 * exception to the seqcount: when only this bit changes, the guest stores
 * cs_flags alone, with no seq round (it flips at every lock and unlock); it
 * means the same whether a reader's copy has it or not.
 */
#define PVSCHED_CS_LOCK		(1U << 4)
#define PVSCHED_CS_ALL		(PVSCHED_CS_HARDIRQ | PVSCHED_CS_SOFTIRQ | \
				 PVSCHED_CS_LOCK)

/*
 * struct pvsched_guest_half.lock_holder (PVSCHED_F_LOCK_WAIT): whose lock a
 * task on this vCPU waits for. A waiter writes only its own vCPU's slot.
 */
#define PVSCHED_LOCK_NONE	0U		/* no wait published */
/* 1..PVSCHED_MAX_SLOTS: slot index + 1 of the holder's vCPU. */
#define PVSCHED_LOCK_ANY	0xffffffffU	/* holder unknown: another vCPU */

/* struct pvsched_guest_half.lock_flags: the kind of lock waited for. */
#define PVSCHED_LOCK_F_SPIN	(1U << 0)	/* the waiter spins (on a CPU) */
#define PVSCHED_LOCK_F_READ	(1U << 1)	/* waits to read */
#define PVSCHED_LOCK_F_WRITE	(1U << 2)	/* waits to write */
#define PVSCHED_LOCK_F_MUTEX	(1U << 3)	/* a mutex */
#define PVSCHED_LOCK_F_SLEEP	(1U << 4)	/* the waiter sleeps, the vCPU idles */
#define PVSCHED_LOCK_F_ALL	(PVSCHED_LOCK_F_SPIN | PVSCHED_LOCK_F_READ | \
				 PVSCHED_LOCK_F_WRITE | PVSCHED_LOCK_F_MUTEX | \
				 PVSCHED_LOCK_F_SLEEP)

/* Guest scheduling policies, as the Linux UAPI numbers them. */
#define PVSCHED_POLICY_NORMAL	0
#define PVSCHED_POLICY_FIFO	1
#define PVSCHED_POLICY_RR	2
#define PVSCHED_POLICY_BATCH	3
#define PVSCHED_POLICY_IDLE	5
#define PVSCHED_POLICY_DEADLINE	6

/*
 * slot.guest_pending: the most urgent task waiting to run on this vCPU, written
 * by whichever guest CPU woke it (the target may be preempted on the host and
 * unable to publish anything itself). One 64-bit word, written and read
 * atomically as a whole, outside the seqcount; the owning CPU clears it when it
 * switches to a task at least that urgent. Zero = no hint.
 *   bits  0..7   RT priority (1..99)
 *   bits  8..15  policy (PVSCHED_POLICY_*)
 *   bits 16..62  reserved, zero; a word with any of them set is ignored
 *   bit  63      valid
 */
#define PVSCHED_PENDING_VALID		(1ULL << 63)
#define PVSCHED_PENDING_PRIO_MASK	0xffULL
#define PVSCHED_PENDING_POLICY_SHIFT	8
#define PVSCHED_PENDING_POLICY_MASK	(0xffULL << PVSCHED_PENDING_POLICY_SHIFT)
#define PVSCHED_PENDING_RESERVED	(~(PVSCHED_PENDING_VALID | \
					   PVSCHED_PENDING_PRIO_MASK | \
					   PVSCHED_PENDING_POLICY_MASK))

/* struct pvsched_host_half.status: what the host last saw the vCPU thread do. */
#define PVSCHED_HS_UNKNOWN	0
#define PVSCHED_HS_RUNNING	1
#define PVSCHED_HS_PREEMPTED	2	/* runnable, not running */
#define PVSCHED_HS_HALTED	3	/* blocked: the guest halted */

/* struct pvsched_host_half.flags */
#define PVSCHED_HF_BOOSTED	(1U << 0)	/* RT policy in force */
#define PVSCHED_HF_THROTTLED	(1U << 1)	/* boost refused: budget spent */
#define PVSCHED_HF_OVERLOADED	(1U << 2)	/* host CPUs are contended */
#define PVSCHED_HF_IN_DEBT	(1U << 3)	/* repaying boosted time */

/* Host scheduling policies in host_half.policy (Linux UAPI numbers). */
#define PVSCHED_HOST_POLICY_OTHER	0
#define PVSCHED_HOST_POLICY_FIFO	1
#define PVSCHED_HOST_POLICY_RR		2
#define PVSCHED_HOST_POLICY_BATCH	3
#define PVSCHED_HOST_POLICY_IDLE	5

struct pvsched_header {
	/* Cache line 0: written by the host only. */
	__u64 magic;		/* PVSCHED_MAGIC */
	__u16 abi_major;	/* PVSCHED_ABI_MAJOR; other majors are refused */
	__u16 abi_minor;	/* newer minors only add feature bits */
	__u16 header_size;	/* offset of slot 0, >= PVSCHED_HEADER_SIZE */
	__u16 slot_size;	/* stride of slots, >= PVSCHED_SLOT_SIZE */
	__u32 slot_count;	/* slots present, one per vCPU */
	__u32 doorbell;		/* PVSCHED_F_DOORBELL: value to ring the host
				 * with (peer ID << 16 | vector); else zero */
	__u64 host_features;	/* PVSCHED_F_* offered */
	__u64 generation;	/* bumped each time the host (re)initializes */
	__u64 host_reserved[3];

	/* Cache line 1: written by the guest only. */
	__u64 guest_features;	/* PVSCHED_F_* accepted, subset of offered */
	__u64 guest_generation;	/* generation bound to; 0 = no guest bound */
	__u32 guest_abi_minor;	/* minor the guest was built for */
	__u32 guest_nr_cpus;	/* CPUs the guest has (may exceed slot_count) */
	__u64 guest_reserved[5];
};

struct pvsched_guest_half {
	/* Cache line 0 of the slot: written by the owning guest CPU. */
	__u32 seq;		/* odd while the guest writes */
	__u32 flags;		/* PVSCHED_GF_* */
	__u32 cs_flags;		/* PVSCHED_CS_* */
	__u32 policy;		/* running task's PVSCHED_POLICY_* */
	__u32 rt_priority;	/* running task's RT priority, 0 if not RT */
	__s32 nice;		/* running task's nice, -20..19 */
	/*
	 * The guest publishes when one of the fields above changes; update_ns
	 * and the counters below are as of that publish (a context switch
	 * between two tasks of the same class leaves the slot untouched).
	 */
	__u64 update_ns;	/* guest clock of the last publish */
	__u64 hardirq_count;	/* hardirq entries */
	__u64 softirq_count;	/* softirq entries */
	__u64 nmi_count;	/* NMIs */
	__u64 switch_count;	/* context switches */

	/* Cache line 1 of the slot. */
	__u64 guest_pending;	/* see PVSCHED_PENDING_*; atomic, no seqcount */
	__u64 boost_req_count;	/* explicit boost requests granted */
	/*
	 * Since minor 3, PVSCHED_F_LOCK_WAIT (zero otherwise), under seq: the
	 * lock wait in progress on this vCPU (PVSCHED_LOCK_*), and counters as
	 * of the last publish: lock contentions seen, and of those, the ones
	 * whose holder's vCPU (for PVSCHED_LOCK_ANY: another vCPU of the
	 * guest) was preempted at the time: for a named holder, as KVM's
	 * steal-time flag says where the guest has it (since minor 6), else
	 * as the host half shows (PVSCHED_HS_PREEMPTED).
	 */
	__u32 lock_holder;
	__u32 lock_flags;
	__u64 lock_contended_count;
	__u64 lock_preempted_count;
	/*
	 * Since minor 4 (zero otherwise): context switches to an RT or
	 * deadline task, as of the last publish. The fields above show the
	 * present only; a host that reads the slot while the guest idles
	 * between two short RT runs sees from this that RT work ran.
	 */
	__u64 rt_switch_count;
	/*
	 * Since minor 7, PVSCHED_F_LOCK_WAIT (zero otherwise), as of the last
	 * publish: of the contentions above, those whose lock names its holder
	 * (a mutex's, a write-held rwsem's owner) running on another vCPU, and
	 * of those, the ones whose holder's vCPU was preempted, judged as
	 * lock_preempted_count judges a named holder. The totals also count
	 * waits whose holder is unknown (spinlocks, read-held rwsems) as
	 * preempted whenever the host half shows any other vCPU preempted;
	 * these count only a holder's preemption.
	 */
	__u64 lock_named_contended_count;
	__u64 lock_named_preempted_count;
};

struct pvsched_host_half {
	/* Cache lines 2 and 3 of the slot: written by the host only. */
	__u32 seq;		/* odd while the host writes */
	__u32 status;		/* PVSCHED_HS_* */
	__u32 flags;		/* PVSCHED_HF_* */
	__u32 policy;		/* PVSCHED_HOST_POLICY_* in force */
	__u32 rt_priority;	/* RT priority in force, 0 if not RT */
	__s32 nice;		/* nice in force */
	__u64 update_ns;	/* host CLOCK_MONOTONIC of the last update */
	__u64 boost_count;	/* boosts applied */
	__u64 throttle_count;	/* throttles applied */
	__u64 preempt_count;	/* times seen preempted while runnable */
	__u64 boosted_ns;	/* total time boosted */
	/*
	 * PVSCHED_F_IDLE_HINTS: how long this vCPU thread, once woken from a
	 * halt, waited for a host CPU (wake -> running), median and 99th
	 * percentile over the host's recent window; 0 = not measured yet.
	 * Zero without the feature.
	 */
	__u32 wake_p50_ns;
	__u32 wake_p99_ns;
	/*
	 * PVSCHED_F_IDLE_HINTS: the share of a core, in permille, this vCPU may
	 * spend polling in its idle driver; 0 = none given (the guest's own
	 * default applies).
	 */
	__u32 poll_budget_permille;
	__u32 host_reserved1;	/* zero */
	__u64 host_reserved[5];
	/*
	 * Since minor 8, PVSCHED_F_EXT_NOTICE (zero otherwise): the one word
	 * of the host half outside its seqcount, written alone by the host's
	 * scheduler (not the daemon, whose seqcount write stops before it) and
	 * read alone by the guest: the number of the extension the vCPU runs
	 * on now, 0 for none.
	 */
	__u32 ext_notice;
	__u32 host_reserved2;	/* zero */
};

struct pvsched_slot {
	struct pvsched_guest_half guest;
	struct pvsched_host_half host;
};

PVSCHED_STATIC_ASSERT(sizeof(struct pvsched_header) == PVSCHED_HEADER_SIZE,
		      "header size");
PVSCHED_STATIC_ASSERT(PVSCHED_OFFSETOF(struct pvsched_header, guest_features) ==
		      PVSCHED_CACHELINE, "guest line of the header");
PVSCHED_STATIC_ASSERT(sizeof(struct pvsched_guest_half) == 2 * PVSCHED_CACHELINE,
		      "guest half size");
PVSCHED_STATIC_ASSERT(PVSCHED_OFFSETOF(struct pvsched_guest_half, guest_pending) ==
		      PVSCHED_CACHELINE, "pending hint on its own line");
PVSCHED_STATIC_ASSERT(sizeof(struct pvsched_host_half) == 2 * PVSCHED_CACHELINE,
		      "host half size");
PVSCHED_STATIC_ASSERT(PVSCHED_OFFSETOF(struct pvsched_host_half, ext_notice) ==
		      2 * PVSCHED_CACHELINE - 8, "notice: the host half's last word");
PVSCHED_STATIC_ASSERT(PVSCHED_OFFSETOF(struct pvsched_slot, host) ==
		      2 * PVSCHED_CACHELINE, "host half on its own lines");
PVSCHED_STATIC_ASSERT(sizeof(struct pvsched_slot) == PVSCHED_SLOT_SIZE,
		      "slot size");
PVSCHED_STATIC_ASSERT(PVSCHED_HEADER_SIZE % PVSCHED_CACHELINE == 0,
		      "slots cache-line aligned");

/* Bytes a region needs for @slots slots (before rounding to a BAR size). */
#define PVSCHED_REGION_BYTES(slots) \
	(PVSCHED_HEADER_SIZE + (__u64)(slots) * PVSCHED_SLOT_SIZE)

#endif /* PVSCHED_ABI_H */
