/* SPDX-License-Identifier: GPL-2.0 */
/*
 * pvsched guest driver: state shared by its source files.
 */
#ifndef PVSCHED_DRV_H
#define PVSCHED_DRV_H

#include <linux/pci.h>
#include <linux/atomic.h>
#include <linux/percpu.h>
#include <linux/sched.h>
#include <linux/types.h>

#include "pvsched_abi.h"

/*
 * Features this module implements. PVSCHED_F_LOCK_HOLD reads a lock call's
 * first argument through ftrace, which x86-64 passes with the arguments;
 * PVSCHED_F_EXT_NOTICE yields from that hook by an x86 KVM hypercall.
 */
#if defined(CONFIG_X86_64) && defined(CONFIG_DYNAMIC_FTRACE_WITH_ARGS)
#define PVSCHED_SUPPORTED_FEATURES	PVSCHED_F_ALL
#else
#define PVSCHED_SUPPORTED_FEATURES	(PVSCHED_F_ALL & ~PVSCHED_F_LOCK_HOLD & \
					 ~PVSCHED_F_EXT_NOTICE)
#endif

/* Nested sleeping locks a task is followed in (F_LOCK_HOLD). */
#define PVSCHED_HELD_MAX	8

/*
 * Private state of one CPU. Only that CPU writes it, with interrupts off, so
 * only an NMI can interrupt an update; @busy tells it to keep its hands off
 * the slot (the next publish carries whatever it would have written).
 *
 * The slot is a copy of this state as of its last publish: pvsched_publish()
 * writes it with the seqcount protocol of pvsched_abi.h, whenever an update
 * changes a field the host acts on (flags, cs_flags, policy, rt_priority,
 * nice, lock_holder, lock_flags); the counters go along then.
 */
struct pvsched_cpu {
	struct pvsched_slot *slot;	/* NULL: this CPU has no slot */
	bool active;			/* the CPU serves its slot */
	bool busy;			/* an update is in progress */
	u32 seq;			/* last even seq written */
	u32 flags;			/* PVSCHED_GF_* but ACTIVE */
	u32 policy;
	u32 rt_priority;
	s32 nice;
	u32 hardirq_depth;
	u32 softirq_depth;
	u64 hardirq_count;
	u64 softirq_count;
	u64 switch_count;
	u64 rt_switch_count;		/* switches to an RT or deadline task */
	u64 boost_req_count;
	u64 hints_raised;		/* pending hints set in other slots */
	u64 hints_cleared;		/* pending hints this CPU satisfied */
	/*
	 * A waker set this slot's guest_pending (other CPUs write it, after
	 * the word): the owner looks at the word only while this is set.
	 */
	bool hint_raised;
	/* Task holding an explicit boost request; only ever the running one. */
	struct task_struct *boost_task;
	/*
	 * What the slot says now, of the fields the host acts on (written by
	 * each publish): an update that changes none of them is not published.
	 */
	u32 shown_flags;		/* PVSCHED_GF_*, ACTIVE included */
	u32 shown_cs;
	u32 shown_policy;
	u32 shown_rt_priority;
	s32 shown_nice;
	/* PVSCHED_F_DOORBELL: host-half seq this CPU last rang for, and rings. */
	u32 rung_host_seq;
	u64 doorbell_rings;
	/*
	 * PVSCHED_F_LOCK_WAIT (pvsched_locks.c): the lock wait in progress on
	 * this CPU. @lock_task waits for @lock_addr (NULL: no wait); the slot
	 * shows @lock_holder/@lock_flags (PVSCHED_LOCK_NONE/0: nothing to
	 * show). @lock_last_task/@lock_last_addr: the wait a context switch
	 * last ended here, so that it is not counted again when it resumes.
	 */
	struct task_struct *lock_task;
	void *lock_addr;
	struct task_struct *lock_last_task;
	void *lock_last_addr;
	u32 lock_kind;			/* PVSCHED_LOCK_F_* but SLEEP */
	u32 lock_target;		/* holder to show while it waits */
	bool lock_sleeping;		/* the waiter blocked, the CPU idles */
	bool lock_preempted_seen;	/* this wait is in lock_preempted_count */
	bool lock_named_seen;		/* ... in lock_named_contended_count */
	bool lock_named_preempted_seen;	/* ... in lock_named_preempted_count */
	u32 lock_holder;
	u32 lock_flags;
	u32 shown_lock_holder;
	u32 shown_lock_flags;
	u64 lock_contended_count;
	u64 lock_preempted_count;
	u64 lock_named_contended_count;
	u64 lock_named_preempted_count;
	/* Seen in debugfs only. */
	u64 lock_spins_stopped;		/* mutex spins ended: holder preempted */
	u64 lock_requests;		/* waits whose holder the slot showed */
	u64 lock_doorbell_rings;
	/* Slot index + 1 and its host-half seq this CPU last rang for. */
	u32 lock_rung_slot;
	u32 lock_rung_seq;
	/*
	 * PVSCHED_F_LOCK_HOLD (pvsched_lockhold.c): the sleeping locks the
	 * running task took by a blocking call, innermost last; a context
	 * switch saves them with the task and gives the next task its own.
	 */
	void *held[PVSCHED_HELD_MAX];
	u32 held_count;
	/* Seen in debugfs only. */
	u64 held_takes;			/* lock calls seen */
	u64 held_releases;		/* unlocks that matched a lock call */
	u64 held_unmatched;		/* unlocks of a lock not seen taken */
	u64 held_dropped;		/* takes beyond PVSCHED_HELD_MAX */
	u64 held_user_resets;		/* ticks in user mode that found some */
	u64 held_uncontended;		/* takes not listed: no host contention */
	/*
	 * PVSCHED_F_EXT_NOTICE: the host's extension number this CPU last
	 * yielded for (at most one yield each), and the yields.
	 */
	u32 yielded_notice;
	u64 held_yields;
	/*
	 * Whether the host contends this vCPU (pvsched_host_contends()): its
	 * steal time at the last look, that look's jiffies (0: none yet), and
	 * the answer then.
	 */
	u64 hold_steal;
	unsigned long hold_looked;
	bool hold_contended;
};

DECLARE_PER_CPU(struct pvsched_cpu, pvsched_cpu);

/* The bound region. One at most; written only under the driver's mutex. */
struct pvsched_region {
	struct pci_dev *pdev;		/* device whose BAR2 we hold */
	bool bound;			/* slots in use, probes registered */
	resource_size_t bar_start;
	resource_size_t bar_len;
	void *base;			/* memremap()ed BAR2, write-back */
	u64 map_len;
	u32 header_size;
	u32 slot_size;
	u32 slot_count;
	u64 generation;
	u64 host_features;
	u64 features;			/* accepted: offered & supported */
	int cpuhp_state;
	unsigned int nr_tracepoints;	/* probes registered */
	u64 probe_changes;		/* (un)registrations since load */
	/* BAR0 (ivshmem registers), NULL if unusable: no doorbell. */
	void __iomem *regs;
	u32 doorbell;			/* header.doorbell: what rings the host */
};

extern struct pvsched_region pvsched_region;

static inline struct pvsched_header *pvsched_header(void)
{
	return pvsched_region.base;
}

static inline struct pvsched_slot *pvsched_slot(u32 index)
{
	return pvsched_region.base + pvsched_region.header_size +
	       (size_t)index * pvsched_region.slot_size;
}

/* pvsched_probes.c */
int pvsched_probes_update(u64 features);
void pvsched_probes_unregister(void);
void pvsched_probes_quiesce(void);
int pvsched_cpu_online(unsigned int cpu);
int pvsched_cpu_offline(unsigned int cpu);
int pvsched_boost(bool on);
bool pvsched_read_guest(const struct pvsched_slot *slot,
			struct pvsched_guest_half *out);
bool pvsched_read_host(const struct pvsched_slot *slot,
		       struct pvsched_host_half *out);
const char *pvsched_tracepoint_name(unsigned int i, bool *registered);

/*
 * pvsched_idle.c: the cpuidle driver (x86: it halts with the paravirt
 * "sti; hlt"). Start after binding, stop before the region is unmapped.
 */
void pvsched_idle_restart(void);
#if defined(CONFIG_X86) && defined(CONFIG_CPU_IDLE)
void pvsched_idle_start(struct pci_dev *pdev);
void pvsched_idle_stop(void);
#else
static inline void pvsched_idle_start(struct pci_dev *pdev) { }
static inline void pvsched_idle_stop(void) { }
#endif

/*
 * pvsched_locks.c: lock waits (PVSCHED_F_LOCK_WAIT) and the host's
 * preempted/overloaded hints. The lock_* calls run inside an update of
 * @pc's state (pvsched_probes.c: interrupts off, @pc busy); the probe
 * publishes after them, then rings for the slot pvsched_lock_begin()
 * returned (index + 1; 0: do not ring).
 */
u32 pvsched_lock_begin(struct pvsched_cpu *pc, void *lock, unsigned int lcb);
void pvsched_lock_end(struct pvsched_cpu *pc, void *lock);
void pvsched_lock_switch(struct pvsched_cpu *pc, struct task_struct *next);
void pvsched_lock_reset(struct pvsched_cpu *pc);
void pvsched_lock_ring(struct pvsched_cpu *pc, u32 ring);
void pvsched_hints_start(void);
const char *pvsched_holder_preempted_source(void);
/* The guest runs on KVM. */
bool pvsched_on_kvm(void);
/* KVM offers steal time to this guest (read at each binding). */
bool pvsched_kvm_steal_known(void);
void pvsched_hints_stop(void);

/*
 * pvsched_probes.c, for the ftrace callbacks of pvsched_lockhold.c: an
 * update of this CPU's state (NULL: the CPU serves no slot), and its end,
 * which publishes what changed (CS_LOCK alone: one store).
 */
struct pvsched_cpu *pvsched_update_begin(unsigned long *irqfl);
void pvsched_update_end_lock(struct pvsched_cpu *pc, unsigned long irqfl);

/*
 * pvsched_lockhold.c: sleeping locks held (PVSCHED_F_LOCK_HOLD). The
 * _switch, _reset and _user_tick calls run inside an update of @pc's state.
 */
int pvsched_lockhold_update(u64 features);
void pvsched_lockhold_release(void);
void pvsched_lockhold_switch(struct pvsched_cpu *pc, struct task_struct *prev,
			     unsigned int prev_state, struct task_struct *next);
void pvsched_lockhold_reset(struct pvsched_cpu *pc);
void pvsched_lockhold_user_tick(struct pvsched_cpu *pc);
const char *pvsched_lockhold_function(unsigned int i, bool *hooked);
extern atomic_t pvsched_saved_count;

/* Tasks switched out holding locks, waiting in the table for their turn. */
static inline unsigned int pvsched_lockhold_saved(void)
{
	return atomic_read(&pvsched_saved_count);
}
u64 pvsched_lockhold_save_failures(void);

/*
 * Whether the slot shows PVSCHED_CS_LOCK: the task holds a lock it took by
 * a blocking call, other than the one it waits for now (a lock call is seen
 * at its entry, before the lock is taken).
 */
static inline bool pvsched_lockhold_shows(const struct pvsched_cpu *pc)
{
	u32 n = pc->held_count;

	if (n && pc->lock_task && pc->held[n - 1] == pc->lock_addr)
		n--;
	return n;
}

/* pvsched_user.c */
int pvsched_misc_register(void);
void pvsched_misc_deregister(void);
void pvsched_debugfs_create(void);
void pvsched_debugfs_remove(void);

#endif /* PVSCHED_DRV_H */
