// SPDX-License-Identifier: GPL-2.0
/*
 * pvsched: per-CPU state, its publication into the shared slot, and the
 * tracepoint probes that keep it current.
 *
 * Every probe runs on the CPU whose state it changes, does a few stores and
 * returns: no locks, no allocation, no sleeping. Interrupts are off while the
 * private state is changed and copied into the slot, so a hardirq cannot nest
 * inside a publish; an NMI that finds an update in progress leaves the slot
 * alone and the next publish carries its news.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/interrupt.h>
#include <linux/io.h>
#include <linux/compiler.h>
#include <linux/irqflags.h>
#include <linux/kernel.h>
#include <linux/percpu.h>
#include <linux/sched.h>
#include <linux/sched/clock.h>
#include <linux/smp.h>
#include <linux/string.h>
#include <linux/tracepoint.h>

#include <trace/events/irq.h>
#include <trace/events/lock.h>
#include <trace/events/sched.h>
#ifdef CONFIG_X86
#include <asm/hardirq.h>
#include <asm/irq_regs.h>
#include <asm/irq_vectors.h>
#include <asm/ptrace.h>
#include <asm/trace/irq_vectors.h>
#include <trace/events/nmi.h>
#endif

#include "pvsched_drv.h"

DEFINE_PER_CPU(struct pvsched_cpu, pvsched_cpu);

static u64 pvsched_nmi_count(void)
{
#ifdef CONFIG_X86
	return this_cpu_read(irq_stat.__nmi_count);
#else
	return 0;
#endif
}

/* The flags and cs_flags words the slot should show for @pc. */
static __always_inline void pvsched_words(const struct pvsched_cpu *pc,
					  u32 *flags, u32 *cs)
{
	*flags = 0;
	*cs = 0;
	if (pc->active) {
		*flags = PVSCHED_GF_ACTIVE | pc->flags;
		if (pc->hardirq_depth)
			*cs |= PVSCHED_CS_HARDIRQ;
		if (pc->softirq_depth)
			*cs |= PVSCHED_CS_SOFTIRQ;
		if (pvsched_lockhold_shows(pc))
			*cs |= PVSCHED_CS_LOCK;
	}
}

/*
 * Copy the private state of this CPU into its slot (seqcount writer), given
 * the flags and cs_flags words pvsched_words() made of it.
 */
static void pvsched_write(struct pvsched_cpu *pc, u32 flags, u32 cs)
{
	struct pvsched_guest_half *g = &pc->slot->guest;

	WRITE_ONCE(g->seq, pc->seq + 1);
	smp_wmb();	/* odd seq before the fields */
	WRITE_ONCE(g->flags, flags);
	WRITE_ONCE(g->cs_flags, cs);
	WRITE_ONCE(g->policy, pc->policy);
	WRITE_ONCE(g->rt_priority, pc->rt_priority);
	WRITE_ONCE(g->nice, pc->nice);
	WRITE_ONCE(g->update_ns, local_clock());
	WRITE_ONCE(g->hardirq_count, pc->hardirq_count);
	WRITE_ONCE(g->softirq_count, pc->softirq_count);
	WRITE_ONCE(g->nmi_count, pvsched_nmi_count());
	WRITE_ONCE(g->switch_count, pc->switch_count);
	WRITE_ONCE(g->rt_switch_count, pc->rt_switch_count);
	WRITE_ONCE(g->boost_req_count, pc->boost_req_count);
	WRITE_ONCE(g->lock_holder, pc->lock_holder);
	WRITE_ONCE(g->lock_flags, pc->lock_flags);
	WRITE_ONCE(g->lock_contended_count, pc->lock_contended_count);
	WRITE_ONCE(g->lock_preempted_count, pc->lock_preempted_count);
	WRITE_ONCE(g->lock_named_contended_count, pc->lock_named_contended_count);
	WRITE_ONCE(g->lock_named_preempted_count, pc->lock_named_preempted_count);
	smp_wmb();	/* fields before the even seq */
	pc->seq += 2;
	WRITE_ONCE(g->seq, pc->seq);
	pc->shown_flags = flags;
	pc->shown_cs = cs;
	pc->shown_policy = pc->policy;
	pc->shown_rt_priority = pc->rt_priority;
	pc->shown_nice = pc->nice;
	pc->shown_lock_holder = pc->lock_holder;
	pc->shown_lock_flags = pc->lock_flags;
}

/* Publish the private state of this CPU, whether it changed or not. */
static void pvsched_publish(struct pvsched_cpu *pc)
{
	u32 flags, cs;

	pvsched_words(pc, &flags, &cs);
	pvsched_write(pc, flags, cs);
}

/*
 * Publish the private state of this CPU if a field the host acts on changed
 * since the last publish; the counters and update_ns go along then, and are
 * left as they are otherwise (a context switch between two tasks of the same
 * class changes nothing the host reads: it costs no store to the slot).
 * Returns whether it published.
 */
/* Whether every field the host acts on but cs_flags is as the slot shows. */
static __always_inline bool pvsched_shown_but_cs(const struct pvsched_cpu *pc,
						 u32 flags)
{
	return flags == pc->shown_flags &&
	       pc->policy == pc->shown_policy &&
	       pc->rt_priority == pc->shown_rt_priority &&
	       pc->nice == pc->shown_nice &&
	       pc->lock_holder == pc->shown_lock_holder &&
	       pc->lock_flags == pc->shown_lock_flags;
}

static __always_inline bool pvsched_publish_changed(struct pvsched_cpu *pc)
{
	u32 flags, cs;

	pvsched_words(pc, &flags, &cs);
	if (cs == pc->shown_cs && pvsched_shown_but_cs(pc, flags))
		return false;
	pvsched_write(pc, flags, cs);
	return true;
}

/*
 * Start an update of this CPU's state: interrupts off, NMIs told to keep out.
 * Returns NULL, with interrupts restored, when the CPU serves no slot.
 */
static __always_inline struct pvsched_cpu *pvsched_begin(unsigned long *irqfl)
{
	struct pvsched_cpu *pc;

	local_irq_save(*irqfl);
	pc = this_cpu_ptr(&pvsched_cpu);
	if (!pc->active) {
		local_irq_restore(*irqfl);
		return NULL;
	}
	WRITE_ONCE(pc->busy, true);
	barrier();
	return pc;
}

/*
 * PVSCHED_F_DOORBELL: just published that this CPU has no reason for a boost
 * (no RT or deadline task, no critical section, no boost request, not idle,
 * no pending hint) while the host half says it is boosted: ring the host, so
 * that it unboosts now instead of at its next timer. At most once per
 * host-half update (its seq), so a host that keeps the boost is rung once.
 * Idle is left out: the host keeps some boosts across a halt on purpose.
 */
static __always_inline void pvsched_doorbell(struct pvsched_cpu *pc)
{
	const struct pvsched_host_half *host = &pc->slot->host;
	u32 seq;

	if (!(READ_ONCE(pvsched_region.features) & PVSCHED_F_DOORBELL))
		return;
	if (pc->flags || pc->hardirq_depth || pc->softirq_depth ||
	    pc->rt_priority || pc->policy == PVSCHED_POLICY_DEADLINE ||
	    pvsched_lockhold_shows(pc))
		return;
	if (!(READ_ONCE(host->flags) & PVSCHED_HF_BOOSTED))
		return;
	seq = READ_ONCE(host->seq);
	if (seq == pc->rung_host_seq ||
	    READ_ONCE(pc->slot->guest.guest_pending))
		return;
	pc->rung_host_seq = seq;
	pc->doorbell_rings++;
	writel(pvsched_region.doorbell,
	       pvsched_region.regs + PVSCHED_IVSHMEM_DOORBELL_REG);
}

/* End an update without publishing it. */
static __always_inline void pvsched_release(struct pvsched_cpu *pc,
					    unsigned long irqfl)
{
	barrier();
	WRITE_ONCE(pc->busy, false);
	local_irq_restore(irqfl);
}

/* End an update: publish it if the host would see a difference. */
static __always_inline void pvsched_end(struct pvsched_cpu *pc,
					unsigned long irqfl)
{
	if (pvsched_publish_changed(pc))
		pvsched_doorbell(pc);
	pvsched_release(pc, irqfl);
}

struct pvsched_cpu *pvsched_update_begin(unsigned long *irqfl)
{
	return pvsched_begin(irqfl);
}

/*
 * End an update of the lock-call hooks. When only CS_LOCK moved, the slot's
 * cs_flags word is stored alone, without a seqcount round: a task taking an
 * uncontended mutex would otherwise publish twice per lock (a pipe round
 * trip, two), and the bit means the same read in or out of a consistent
 * copy (pvsched_abi.h). Anything else changed: the usual publish.
 */
void pvsched_update_end_lock(struct pvsched_cpu *pc, unsigned long irqfl)
{
	u32 flags, cs;

	pvsched_words(pc, &flags, &cs);
	if ((cs ^ pc->shown_cs) == PVSCHED_CS_LOCK &&
	    pvsched_shown_but_cs(pc, flags)) {
		WRITE_ONCE(pc->slot->guest.cs_flags, cs);
		pc->shown_cs = cs;
		pvsched_release(pc, irqfl);
		return;
	}
	pvsched_end(pc, irqfl);
}

static u32 pvsched_task_policy(const struct task_struct *p)
{
	switch (p->policy) {
	case SCHED_FIFO:
		return PVSCHED_POLICY_FIFO;
	case SCHED_RR:
		return PVSCHED_POLICY_RR;
	case SCHED_BATCH:
		return PVSCHED_POLICY_BATCH;
	case SCHED_IDLE:
		return PVSCHED_POLICY_IDLE;
	case SCHED_DEADLINE:
		return PVSCHED_POLICY_DEADLINE;
	default:
		return PVSCHED_POLICY_NORMAL;
	}
}

/* RT priority a pending hint compares: FIFO/RR priority, 0 for the rest. */
static u32 pvsched_task_urgency(const struct task_struct *p)
{
	if (p->policy == SCHED_FIFO || p->policy == SCHED_RR)
		return min_t(u32, p->rt_priority, 99);
	return 0;
}

/*
 * Record what @p (the task running on this CPU) is. Called at every context
 * switch, and again from interrupt, softirq, NMI and ioctl probes: a policy
 * change of the running task (sched_setscheduler() has no tracepoint) thus
 * shows within a tick instead of at its next context switch.
 */
static __always_inline void pvsched_set_task(struct pvsched_cpu *pc,
					     struct task_struct *p)
{
	pc->policy = pvsched_task_policy(p);
	pc->rt_priority = pvsched_task_urgency(p);
	pc->nice = task_nice(p);
	if (is_idle_task(p))
		pc->flags |= PVSCHED_GF_IDLE;
	else
		pc->flags &= ~PVSCHED_GF_IDLE;
}

/*
 * The owner of a slot drops a pending hint its next task satisfies. It reads
 * the word only after a waker said it raised one (hint_raised, in its own
 * per-CPU state), and for as long as a hint stays: under QEMU's TCG every
 * page a probe touches after a context switch costs a software TLB refill,
 * and the shared page is not otherwise touched on a switch.
 */
static __always_inline void pvsched_pending_switch(struct pvsched_cpu *pc,
						   struct task_struct *next)
{
	u64 *word = &pc->slot->guest.guest_pending;
	u64 old;

	if (likely(!READ_ONCE(pc->hint_raised)))
		return;
	WRITE_ONCE(pc->hint_raised, false);
	/* Cleared before the word is read: pairs with the waker's cmpxchg. */
	smp_mb();
	old = READ_ONCE(*word);
	if (!old)
		return;
	if (!is_idle_task(next) && (old & PVSCHED_PENDING_VALID) &&
	    !(old & PVSCHED_PENDING_RESERVED) &&
	    pvsched_task_urgency(next) < (old & PVSCHED_PENDING_PRIO_MASK)) {
		WRITE_ONCE(pc->hint_raised, true);	/* still pending */
		return;
	}
	/* A waker may have raised it meanwhile: then keep the new hint. */
	if (cmpxchg64(word, old, 0) == old)
		pc->hints_cleared++;
	else
		WRITE_ONCE(pc->hint_raised, true);
}

/*
 * The common switch, between two tasks of one class: no boost request to end,
 * no lock wait to end, no idle task on either side, no handler depth to heal,
 * no pending hint to look at, and @next shows what the slot shows. The full
 * update would change nothing but the switch counter and publish nothing. The
 * scheduler calls this tracepoint with interrupts off, so no probe of this
 * CPU interleaves.
 */
static __always_inline bool pvsched_switch_unchanged(const struct pvsched_cpu *pc,
						     const struct task_struct *next)
{
	return pc->active && !pc->flags && !pc->boost_task && !pc->lock_task &&
	       !pc->hardirq_depth && !pc->softirq_depth && !pc->held_count &&
	       !pvsched_lockhold_saved() &&
	       !READ_ONCE(pc->hint_raised) && !is_idle_task(next) &&
	       pc->policy == pc->shown_policy &&
	       pc->rt_priority == pc->shown_rt_priority &&
	       pc->nice == pc->shown_nice &&
	       pvsched_task_policy(next) == pc->shown_policy &&
	       pvsched_task_urgency(next) == pc->shown_rt_priority &&
	       task_nice(next) == pc->shown_nice;
}

/* After pvsched_set_task() for the next task: count a switch to RT work. */
static __always_inline void pvsched_count_rt_switch(struct pvsched_cpu *pc)
{
	if (pc->rt_priority || pc->policy == PVSCHED_POLICY_DEADLINE)
		pc->rt_switch_count++;
}

static void pvsched_probe_sched_switch(void *data, bool preempt,
				       struct task_struct *prev,
				       struct task_struct *next,
				       unsigned int prev_state)
{
	struct pvsched_cpu *pc = this_cpu_ptr(&pvsched_cpu);
	unsigned long irqfl;

	if (likely(pvsched_switch_unchanged(pc, next))) {
		pc->switch_count++;
		pvsched_count_rt_switch(pc);
		return;
	}
	pc = pvsched_begin(&irqfl);
	if (!pc)
		return;
	/* A boost request lasts while its task runs: prev is leaving. */
	pc->boost_task = NULL;
	pc->flags &= ~PVSCHED_GF_BOOST_REQ;
	pvsched_set_task(pc, next);
	pc->switch_count++;
	pvsched_count_rt_switch(pc);
	/*
	 * No hardirq or softirq handler runs across a context switch. Resetting
	 * the depths heals a pairing the registration order could not keep.
	 */
	pc->hardirq_depth = 0;
	pc->softirq_depth = 0;
	pvsched_pending_switch(pc, next);
	pvsched_lock_switch(pc, next);
	pvsched_lockhold_switch(pc, prev, prev_state, next);
	pvsched_end(pc, irqfl);
}

/*
 * A real-time task woken onto another CPU: tell the host that CPU has urgent
 * work, in case it is preempted on the host and cannot say so itself.
 */
static void pvsched_probe_sched_wakeup(void *data, struct task_struct *p)
{
	struct pvsched_cpu *pc;
	u32 prio = pvsched_task_urgency(p);
	u64 word, old, cur;
	int cpu;

	if (!prio)
		return;
	cpu = task_cpu(p);
	if (cpu == raw_smp_processor_id())
		return;
	pc = per_cpu_ptr(&pvsched_cpu, cpu);
	if (!READ_ONCE(pc->active))
		return;
	word = PVSCHED_PENDING_VALID | prio |
	       ((u64)pvsched_task_policy(p) << PVSCHED_PENDING_POLICY_SHIFT);
	old = READ_ONCE(pc->slot->guest.guest_pending);
	for (;;) {
		if ((old & PVSCHED_PENDING_VALID) &&
		    !(old & PVSCHED_PENDING_RESERVED) &&
		    (old & PVSCHED_PENDING_PRIO_MASK) >= prio)
			return;
		cur = cmpxchg64(&pc->slot->guest.guest_pending, old, word);
		if (cur == old) {
			/* After the word (cmpxchg: a full barrier): the owner looks. */
			WRITE_ONCE(pc->hint_raised, true);
			/* Interrupts are off: only this CPU touches its counter. */
			this_cpu_inc(pvsched_cpu.hints_raised);
			return;
		}
		old = cur;
	}
}

/* @timer: the local timer's tick, which may find the task in user mode. */
static void pvsched_hardirq_enter(bool timer)
{
	struct pvsched_cpu *pc;
	unsigned long irqfl;

	pc = pvsched_begin(&irqfl);
	if (!pc)
		return;
	if (timer && pc->held_count) {
		struct pt_regs *regs = get_irq_regs();

		if (regs && user_mode(regs))
			pvsched_lockhold_user_tick(pc);
	}
	pc->hardirq_depth++;
	pc->hardirq_count++;
	pvsched_set_task(pc, current);
	pvsched_end(pc, irqfl);
}

static void pvsched_hardirq_exit(void)
{
	struct pvsched_cpu *pc;
	unsigned long irqfl;

	pc = pvsched_begin(&irqfl);
	if (!pc)
		return;
	if (pc->hardirq_depth)
		pc->hardirq_depth--;
	pvsched_set_task(pc, current);
	pvsched_end(pc, irqfl);
}

static void pvsched_probe_irq_entry(void *data, int irq,
				    struct irqaction *action)
{
	pvsched_hardirq_enter(false);
}

static void pvsched_probe_irq_exit(void *data, int irq,
				   struct irqaction *action, int ret)
{
	pvsched_hardirq_exit();
}

static void pvsched_probe_vector_entry(void *data, int vector)
{
#ifdef CONFIG_X86
	pvsched_hardirq_enter(vector == LOCAL_TIMER_VECTOR);
#else
	pvsched_hardirq_enter(false);
#endif
}

static void pvsched_probe_vector_exit(void *data, int vector)
{
	pvsched_hardirq_exit();
}

static void pvsched_probe_softirq_entry(void *data, unsigned int vec_nr)
{
	struct pvsched_cpu *pc;
	unsigned long irqfl;

	pc = pvsched_begin(&irqfl);
	if (!pc)
		return;
	pc->softirq_depth++;
	pc->softirq_count++;
	pvsched_set_task(pc, current);
	pvsched_end(pc, irqfl);
}

static void pvsched_probe_softirq_exit(void *data, unsigned int vec_nr)
{
	struct pvsched_cpu *pc;
	unsigned long irqfl;

	pc = pvsched_begin(&irqfl);
	if (!pc)
		return;
	if (pc->softirq_depth)
		pc->softirq_depth--;
	pvsched_set_task(pc, current);
	pvsched_end(pc, irqfl);
}

/*
 * lock:contention_begin/end (PVSCHED_F_LOCK_WAIT): a task on this CPU waits
 * for a lock; pvsched_locks.c decides what the slot shows of it. Contentions
 * of hardirq and NMI handlers are left out: they are short, and they would
 * interleave with the wait of the task they interrupted.
 */
static void pvsched_probe_contention_begin(void *data, void *lock,
					   unsigned int flags)
{
	struct pvsched_cpu *pc;
	unsigned long irqfl;
	u32 ring;

	if (in_nmi() || in_hardirq())
		return;
	pc = pvsched_begin(&irqfl);
	if (!pc)
		return;
	ring = pvsched_lock_begin(pc, lock, flags);
	if (pvsched_publish_changed(pc))
		pvsched_doorbell(pc);
	/* After the publish: the host finds the wait when it looks. */
	pvsched_lock_ring(pc, ring);
	pvsched_release(pc, irqfl);
}

static void pvsched_probe_contention_end(void *data, void *lock, int ret)
{
	struct pvsched_cpu *pc = this_cpu_ptr(&pvsched_cpu);
	unsigned long irqfl;

	if (in_nmi() || in_hardirq())
		return;
	/*
	 * Most contentions end with nothing recorded for them. No hardirq
	 * changes these, and preemption is off: no switch either.
	 */
	if (likely(READ_ONCE(pc->lock_task) != current &&
		   READ_ONCE(pc->lock_last_task) != current))
		return;
	pc = pvsched_begin(&irqfl);
	if (!pc)
		return;
	pvsched_lock_end(pc, lock);
	pvsched_end(pc, irqfl);
}

/*
 * nmi:nmi_handler fires after each NMI handler ran; there is no NMI entry or
 * exit tracepoint, so no NMI critical section is published (the ABI's former
 * CS_NMI bit is reserved since minor 5). Publish the NMI count,
 * unless the NMI interrupted an update of this CPU's state.
 */
static void pvsched_probe_nmi(void *data, void *handler, s64 delta_ns,
			      int handled)
{
	struct pvsched_cpu *pc = this_cpu_ptr(&pvsched_cpu);

	if (!READ_ONCE(pc->active) || READ_ONCE(pc->busy))
		return;
	WRITE_ONCE(pc->busy, true);
	barrier();
	pvsched_set_task(pc, current);
	pvsched_publish(pc);
	barrier();
	WRITE_ONCE(pc->busy, false);
}

/*
 * Tracepoints are found by name (the module needs no exported tracepoint
 * symbols) and registered through void pointers. Exits come before entries:
 * a handler running while the probes are registered then shows up as an exit
 * without an entry, which the depth counters ignore, never as an entry that
 * no exit ends. The same for lock contentions: a wait in progress at that
 * moment ends unseen, none stays shown.
 */
struct pvsched_tp {
	const char *name;
	void *probe;
	u64 needs;			/* feature the probe serves, 0: always */
	struct tracepoint *tp;
	bool registered;
};

#define PVSCHED_TP(_name, _probe, _needs) \
	{ .name = _name, .probe = (void *)(_probe), .needs = (_needs) }

#define PVSCHED_TP_VECTOR_EXIT(_v) \
	PVSCHED_TP(#_v "_exit", pvsched_probe_vector_exit, 0)
#define PVSCHED_TP_VECTOR_ENTRY(_v) \
	PVSCHED_TP(#_v "_entry", pvsched_probe_vector_entry, 0)

static struct pvsched_tp pvsched_tps[] = {
	PVSCHED_TP("irq_handler_exit", pvsched_probe_irq_exit, 0),
	PVSCHED_TP("softirq_exit", pvsched_probe_softirq_exit, 0),
	PVSCHED_TP("contention_end", pvsched_probe_contention_end,
		   PVSCHED_F_LOCK_WAIT),
#ifdef CONFIG_X86
	PVSCHED_TP_VECTOR_EXIT(local_timer),
	PVSCHED_TP_VECTOR_EXIT(reschedule),
	PVSCHED_TP_VECTOR_EXIT(call_function),
	PVSCHED_TP_VECTOR_EXIT(call_function_single),
	PVSCHED_TP_VECTOR_EXIT(irq_work),
	PVSCHED_TP_VECTOR_EXIT(x86_platform_ipi),
	PVSCHED_TP_VECTOR_EXIT(spurious_apic),
	PVSCHED_TP_VECTOR_EXIT(error_apic),
	PVSCHED_TP_VECTOR_EXIT(thermal_apic),
	PVSCHED_TP_VECTOR_EXIT(threshold_apic),
	PVSCHED_TP_VECTOR_EXIT(deferred_error_apic),
#endif
	PVSCHED_TP("irq_handler_entry", pvsched_probe_irq_entry, 0),
	PVSCHED_TP("softirq_entry", pvsched_probe_softirq_entry, 0),
	PVSCHED_TP("contention_begin", pvsched_probe_contention_begin,
		   PVSCHED_F_LOCK_WAIT),
#ifdef CONFIG_X86
	PVSCHED_TP_VECTOR_ENTRY(local_timer),
	PVSCHED_TP_VECTOR_ENTRY(reschedule),
	PVSCHED_TP_VECTOR_ENTRY(call_function),
	PVSCHED_TP_VECTOR_ENTRY(call_function_single),
	PVSCHED_TP_VECTOR_ENTRY(irq_work),
	PVSCHED_TP_VECTOR_ENTRY(x86_platform_ipi),
	PVSCHED_TP_VECTOR_ENTRY(spurious_apic),
	PVSCHED_TP_VECTOR_ENTRY(error_apic),
	PVSCHED_TP_VECTOR_ENTRY(thermal_apic),
	PVSCHED_TP_VECTOR_ENTRY(threshold_apic),
	PVSCHED_TP_VECTOR_ENTRY(deferred_error_apic),
	PVSCHED_TP("nmi_handler", pvsched_probe_nmi, 0),
#endif
	PVSCHED_TP("sched_switch", pvsched_probe_sched_switch, 0),
	PVSCHED_TP("sched_wakeup", pvsched_probe_sched_wakeup,
		   PVSCHED_F_PENDING_HINT),
	PVSCHED_TP("sched_wakeup_new", pvsched_probe_sched_wakeup,
		   PVSCHED_F_PENDING_HINT),
};

/*
 * The probes go through void pointers; have the compiler check each one
 * against the tracepoint prototype of the kernel this module is built for.
 * Never called, and dropped by the compiler.
 */
static void __maybe_unused pvsched_check_probe_types(void)
{
	register_trace_sched_switch(pvsched_probe_sched_switch, NULL);
	register_trace_sched_wakeup(pvsched_probe_sched_wakeup, NULL);
	register_trace_sched_wakeup_new(pvsched_probe_sched_wakeup, NULL);
	register_trace_irq_handler_entry(pvsched_probe_irq_entry, NULL);
	register_trace_irq_handler_exit(pvsched_probe_irq_exit, NULL);
	register_trace_softirq_entry(pvsched_probe_softirq_entry, NULL);
	register_trace_softirq_exit(pvsched_probe_softirq_exit, NULL);
	register_trace_contention_begin(pvsched_probe_contention_begin, NULL);
	register_trace_contention_end(pvsched_probe_contention_end, NULL);
#ifdef CONFIG_X86
	register_trace_local_timer_entry(pvsched_probe_vector_entry, NULL);
	register_trace_local_timer_exit(pvsched_probe_vector_exit, NULL);
	register_trace_nmi_handler(pvsched_probe_nmi, NULL);
#endif
}

static void pvsched_find_tp(struct tracepoint *tp, void *priv)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(pvsched_tps); i++)
		if (!pvsched_tps[i].tp && !strcmp(tp->name, pvsched_tps[i].name))
			pvsched_tps[i].tp = tp;
}

void pvsched_probes_unregister(void)
{
	unsigned int i = ARRAY_SIZE(pvsched_tps);
	bool any = false;

	while (i--) {
		struct pvsched_tp *t = &pvsched_tps[i];

		if (!t->registered)
			continue;
		WARN_ON_ONCE(tracepoint_probe_unregister(t->tp, t->probe, NULL));
		t->registered = false;
		pvsched_region.probe_changes++;
		any = true;
	}
	if (any)
		tracepoint_synchronize_unregister();
	pvsched_region.nr_tracepoints = 0;
}

/*
 * Every slot is inactive (each CPU cleared its own): wait until no probe
 * that looked before that is still running, without unregistering any.
 */
void pvsched_probes_quiesce(void)
{
	tracepoint_synchronize_unregister();
}

static bool pvsched_tp_wanted(const struct pvsched_tp *t, u64 features)
{
	return t->tp && (!t->needs || (features & t->needs));
}

/*
 * Make the registered probes those @features calls for, touching only the
 * ones that change. Registering or unregistering a probe patches kernel
 * text (the tracepoint's static call), and the patching synchronizes every
 * CPU with IPIs whose own handlers are among the patched sites (the vector
 * tracepoints): under multi-threaded TCG that live-locked a guest rebinding
 * after its host changed the offered features (benchmarks/LOG.md, "A guest
 * hung by its own rebind"). A rebind that keeps the probe set, the usual
 * case, patches nothing.
 */
int pvsched_probes_update(u64 features)
{
	unsigned int i;
	bool any = false;
	int ret;

	if (!pvsched_region.nr_tracepoints) {
		for (i = 0; i < ARRAY_SIZE(pvsched_tps); i++)
			pvsched_tps[i].tp = NULL;
		for_each_kernel_tracepoint(pvsched_find_tp, NULL);
	}
	for (i = 0; i < ARRAY_SIZE(pvsched_tps); i++) {
		if (!strcmp(pvsched_tps[i].name, "sched_switch") &&
		    !pvsched_tps[i].tp) {
			pr_err("tracepoint sched_switch not found\n");
			ret = -ENOENT;
			goto fail;
		}
	}
	/* Those no longer wanted first, exits after entries (reverse order). */
	i = ARRAY_SIZE(pvsched_tps);
	while (i--) {
		struct pvsched_tp *t = &pvsched_tps[i];

		if (!t->registered || pvsched_tp_wanted(t, features))
			continue;
		WARN_ON_ONCE(tracepoint_probe_unregister(t->tp, t->probe, NULL));
		t->registered = false;
		pvsched_region.nr_tracepoints--;
		pvsched_region.probe_changes++;
		any = true;
	}
	if (any)
		tracepoint_synchronize_unregister();
	for (i = 0; i < ARRAY_SIZE(pvsched_tps); i++) {
		struct pvsched_tp *t = &pvsched_tps[i];

		if (t->registered || !pvsched_tp_wanted(t, features))
			continue;
		ret = tracepoint_probe_register(t->tp, t->probe, NULL);
		if (ret) {
			pr_err("cannot register a probe on %s: %d\n", t->name,
			       ret);
			goto fail;
		}
		t->registered = true;
		pvsched_region.nr_tracepoints++;
		pvsched_region.probe_changes++;
	}
	return 0;
fail:
	pvsched_probes_unregister();
	return ret;
}

const char *pvsched_tracepoint_name(unsigned int i, bool *registered)
{
	if (i >= ARRAY_SIZE(pvsched_tps))
		return NULL;
	*registered = pvsched_tps[i].registered;
	return pvsched_tps[i].name;
}

/*
 * CPU hotplug callbacks (CPUHP_AP_ONLINE_DYN): they run on @cpu itself, also
 * for every online CPU when the region is bound and unbound.
 */
int pvsched_cpu_online(unsigned int cpu)
{
	struct pvsched_cpu *pc = per_cpu_ptr(&pvsched_cpu, cpu);
	unsigned long irqfl;

	if (!pc->slot)
		return 0;
	local_irq_save(irqfl);
	WRITE_ONCE(pc->busy, true);
	barrier();
	pc->seq = (READ_ONCE(pc->slot->guest.seq) + 1) & ~1U;
	pc->flags = 0;
	pc->hardirq_depth = 0;
	pc->softirq_depth = 0;
	pc->boost_task = NULL;
	pvsched_lock_reset(pc);
	pvsched_lockhold_reset(pc);
	pvsched_set_task(pc, current);
	WRITE_ONCE(pc->slot->guest.guest_pending, 0);
	WRITE_ONCE(pc->hint_raised, false);
	WRITE_ONCE(pc->active, true);
	pvsched_publish(pc);
	barrier();
	WRITE_ONCE(pc->busy, false);
	local_irq_restore(irqfl);
	return 0;
}

int pvsched_cpu_offline(unsigned int cpu)
{
	struct pvsched_cpu *pc = per_cpu_ptr(&pvsched_cpu, cpu);
	unsigned long irqfl;

	if (!pc->slot)
		return 0;
	local_irq_save(irqfl);
	WRITE_ONCE(pc->busy, true);
	barrier();
	WRITE_ONCE(pc->active, false);
	pc->flags = 0;
	pc->hardirq_depth = 0;
	pc->softirq_depth = 0;
	pc->boost_task = NULL;
	pvsched_lock_reset(pc);
	pvsched_lockhold_reset(pc);
	pvsched_publish(pc);
	WRITE_ONCE(pc->slot->guest.guest_pending, 0);
	barrier();
	WRITE_ONCE(pc->busy, false);
	local_irq_restore(irqfl);
	return 0;
}

/* PVSCHED_IOC_BOOST for the current task on its current CPU. */
int pvsched_boost(bool on)
{
	struct pvsched_cpu *pc;
	unsigned long irqfl;

	if (!(READ_ONCE(pvsched_region.features) & PVSCHED_F_BOOST_REQUEST))
		return -EOPNOTSUPP;
	pc = pvsched_begin(&irqfl);
	if (!pc)
		return -ENXIO;
	pvsched_set_task(pc, current);
	if (on) {
		if (pc->boost_task != current) {
			pc->boost_task = current;
			pc->flags |= PVSCHED_GF_BOOST_REQ;
			pc->boost_req_count++;
		}
	} else if (pc->boost_task == current) {
		pc->boost_task = NULL;
		pc->flags &= ~PVSCHED_GF_BOOST_REQ;
	}
	pvsched_end(pc, irqfl);
	return 0;
}

/* Seqcount readers with bounded retries, for debugfs. */
bool pvsched_read_guest(const struct pvsched_slot *slot,
			struct pvsched_guest_half *out)
{
	const struct pvsched_guest_half *g = &slot->guest;
	unsigned int i;
	u32 seq;

	for (i = 0; i < PVSCHED_READ_RETRIES; i++) {
		seq = READ_ONCE(g->seq);
		if (seq & 1) {
			cpu_relax();
			continue;
		}
		smp_rmb();	/* seq before the fields */
		memcpy(out, g, sizeof(*out));
		smp_rmb();	/* fields before seq again */
		if (READ_ONCE(g->seq) == seq) {
			out->seq = seq;
			return true;
		}
	}
	return false;
}

bool pvsched_read_host(const struct pvsched_slot *slot,
		       struct pvsched_host_half *out)
{
	const struct pvsched_host_half *h = &slot->host;
	unsigned int i;
	u32 seq;

	for (i = 0; i < PVSCHED_READ_RETRIES; i++) {
		seq = READ_ONCE(h->seq);
		if (seq & 1) {
			cpu_relax();
			continue;
		}
		smp_rmb();	/* seq before the fields */
		memcpy(out, h, sizeof(*out));
		smp_rmb();	/* fields before seq again */
		if (READ_ONCE(h->seq) == seq) {
			out->seq = seq;
			return true;
		}
	}
	return false;
}
