// SPDX-License-Identifier: GPL-2.0
/*
 * pvsched guest driver: sleeping locks held (PVSCHED_F_LOCK_HOLD).
 *
 * A stock kernel has no tracepoint at a lock acquisition (only lockdep's,
 * which distribution kernels leave out), so the holder of a mutex or rwsem
 * was known to the host only once someone waited for it, usually after the
 * host had preempted it. Here ftrace hooks the entries of the blocking lock
 * calls (mutex_lock*, down_read*, down_write*) and of their unlocks: each
 * CPU keeps the locks its running task took, innermost last, and the slot
 * shows PVSCHED_CS_LOCK while one is held, so that the host can keep the
 * vCPU on its CPU at the slice end that would have preempted the holder.
 *
 * What it does not see: a trylock's acquisition (the hook sees the call,
 * not its result; its unlock matches nothing and is ignored), spinlocks and
 * rwlocks (held with preemption off, too short and too frequent for a hook
 * of their own). A lock call that fails (killed, interrupted) stays listed
 * until the task next runs in user mode, when a timer tick finds it there:
 * no kernel lock is held across a return to user space.
 *
 * A task that blocks holding locks keeps them in a small table keyed by the
 * task, taken back when it runs again on any CPU. The scheduler orders the
 * two: a task switched in elsewhere was switched out here first.
 *
 * The hooks are registered the first time a host offers the feature and
 * stay until the driver lets go of its device: a rebind that drops the
 * feature leaves them idle instead of patching the lock functions' text
 * again (text patching while the guest runs is what live-locked a TCG guest
 * at a rebind, benchmarks/LOG.md, "A guest hung by its own rebind").
 */
#include <linux/atomic.h>
#include <linux/ftrace.h>
#include <linux/hash.h>
#include <linux/jiffies.h>
#include <linux/kernel.h>
#include <linux/kernel_stat.h>
#include <linux/kvm_para.h>
#include <linux/log2.h>
#include <linux/sched.h>
#include <linux/string.h>

#include "pvsched_drv.h"

/* Tasks in the table: read at every context switch (pvsched_drv.h). */
atomic_t pvsched_saved_count = ATOMIC_INIT(0);

#if defined(CONFIG_X86_64) && defined(CONFIG_DYNAMIC_FTRACE_WITH_ARGS)

/* The lock word: the first argument of every hooked call. */
static __always_inline void *pvsched_lock_arg(struct ftrace_regs *fregs)
{
	return (void *)fregs->regs.di;
}

/* Blocking calls that take a sleeping lock, and the calls that release it. */
static const char *const pvsched_take_fns[] = {
	"mutex_lock", "mutex_lock_interruptible", "mutex_lock_killable",
	"mutex_lock_io", "down_read", "down_read_interruptible",
	"down_read_killable", "down_write", "down_write_killable",
};

static const char *const pvsched_release_fns[] = {
	"mutex_unlock", "up_read", "up_write",
};

#define PVSCHED_NR_TAKE		ARRAY_SIZE(pvsched_take_fns)
#define PVSCHED_NR_RELEASE	ARRAY_SIZE(pvsched_release_fns)

static bool pvsched_hooked[PVSCHED_NR_TAKE + PVSCHED_NR_RELEASE];
/* The ops' filters are set once and kept until the driver lets go. */
static bool pvsched_filtered;

/*
 * Tasks switched out holding locks. Open addressing over a short probe
 * sequence: a task that finds no free entry loses its locks (the slot
 * shows less than it could, never more). PVSCHED_SAVED_GONE marks an entry
 * taken back, free again for a save but not the end of a probe sequence.
 */
#define PVSCHED_SAVED_SIZE	256
#define PVSCHED_SAVED_PROBES	8
#define PVSCHED_SAVED_GONE	((struct task_struct *)1UL)

struct pvsched_saved {
	struct task_struct *task;
	u32 count;
	void *held[PVSCHED_HELD_MAX];
};

static struct pvsched_saved pvsched_saved[PVSCHED_SAVED_SIZE];
static atomic64_t pvsched_save_failed = ATOMIC64_INIT(0);
static bool pvsched_lockhold_registered;

static __always_inline unsigned int pvsched_saved_hash(struct task_struct *p)
{
	return hash_ptr(p, ilog2(PVSCHED_SAVED_SIZE));
}

static void pvsched_held_save(struct pvsched_cpu *pc, struct task_struct *p)
{
	unsigned int h = pvsched_saved_hash(p), i;

	for (i = 0; i < PVSCHED_SAVED_PROBES; i++) {
		struct pvsched_saved *e =
			&pvsched_saved[(h + i) % PVSCHED_SAVED_SIZE];
		struct task_struct *old = READ_ONCE(e->task);

		if (old != NULL && old != PVSCHED_SAVED_GONE)
			continue;
		if (cmpxchg(&e->task, old, p) != old)
			continue;
		e->count = pc->held_count;
		memcpy(e->held, pc->held, sizeof(e->held));
		atomic_inc(&pvsched_saved_count);
		return;
	}
	atomic64_inc(&pvsched_save_failed);
}

static void pvsched_held_restore(struct pvsched_cpu *pc, struct task_struct *p)
{
	unsigned int h = pvsched_saved_hash(p), i;

	for (i = 0; i < PVSCHED_SAVED_PROBES; i++) {
		struct pvsched_saved *e =
			&pvsched_saved[(h + i) % PVSCHED_SAVED_SIZE];
		struct task_struct *t = READ_ONCE(e->task);

		if (!t)
			return;
		if (t != p)
			continue;
		pc->held_count = min_t(u32, e->count, PVSCHED_HELD_MAX);
		memcpy(pc->held, e->held, sizeof(pc->held));
		/* Copied before the entry is free for another save. */
		smp_store_release(&e->task, PVSCHED_SAVED_GONE);
		atomic_dec(&pvsched_saved_count);
		return;
	}
}

static void pvsched_saved_clear(void)
{
	memset(pvsched_saved, 0, sizeof(pvsched_saved));
	atomic_set(&pvsched_saved_count, 0);
}

/* Whether the bound region accepted the feature (the hooks may stay idle). */
static __always_inline bool pvsched_lockhold_on(void)
{
	return READ_ONCE(pvsched_region.features) & PVSCHED_F_LOCK_HOLD;
}

/*
 * How often a CPU looks at its steal time again, and the share of that time
 * stolen from it that means its host contends it (1/16: a host with a CPU
 * for each vCPU steals well below it, an overcommitted one far above).
 */
#define PVSCHED_HOLD_LOOK_EVERY		(HZ / 20)
#define PVSCHED_HOLD_STEAL_SHARE	16

/*
 * Whether the host contends this vCPU: the time stolen from it since its
 * last look (KVM's steal time, accounted at each tick) was at least
 * 1/PVSCHED_HOLD_STEAL_SHARE of that time; looked at again once
 * PVSCHED_HOLD_LOOK_EVERY has passed, at the next take. Only a contended
 * vCPU can be preempted holding a lock, and listing every take costs the
 * lock calls even when nothing preempts (BENCHMARKS.md, LH21): so the take
 * hook lists a lock only while this holds. Without KVM's steal time the
 * guest cannot tell: it always holds. Preemption is off (the ftrace
 * callback's recursion guard).
 */
static bool notrace pvsched_host_contends(void)
{
	struct pvsched_cpu *pc = this_cpu_ptr(&pvsched_cpu);
	unsigned long now = jiffies;
	u64 steal, since;

	if (!pvsched_kvm_steal_known())
		return true;
	if (pc->hold_looked &&
	    time_before(now, pc->hold_looked + PVSCHED_HOLD_LOOK_EVERY))
		return pc->hold_contended;
	steal = kcpustat_this_cpu->cpustat[CPUTIME_STEAL];
	since = jiffies_to_nsecs(now - pc->hold_looked);
	/* The first look has nothing to compare with: contended until the next. */
	pc->hold_contended = !pc->hold_looked ||
			     (steal - pc->hold_steal) * PVSCHED_HOLD_STEAL_SHARE >= since;
	pc->hold_steal = steal;
	pc->hold_looked = now;
	return pc->hold_contended;
}

/*
 * PVSCHED_F_EXT_NOTICE: while the host runs this vCPU on an extension it
 * granted (the slot's ext_notice), a take with no sleeping lock held is a
 * point between two of them: hand the CPU back there, once per extension,
 * so that the host preempts the vCPU out of its locks, as eCS's guest
 * yields at the end of its critical section. An unlock's hook runs before
 * the lock is released, so it is the next take that is out of them. A
 * notice the host left stale costs one hypercall. Inside an update of @pc
 * (interrupts off, the slot served).
 */
static void notrace pvsched_yield_if_extended(struct pvsched_cpu *pc)
{
	u32 notice;

	if (pc->held_count ||
	    !(READ_ONCE(pvsched_region.features) & PVSCHED_F_EXT_NOTICE))
		return;
	notice = READ_ONCE(pc->slot->host.ext_notice);
	if (!notice || notice == pc->yielded_notice)
		return;
	pc->yielded_notice = notice;
	pc->held_yields++;
	kvm_hypercall2(KVM_HC_SCHED_YIELD, PVSCHED_YIELD_TO_NONE,
		       PVSCHED_YIELD_TAG);
}

static void notrace pvsched_on_take(unsigned long ip, unsigned long parent_ip,
				    struct ftrace_ops *op,
				    struct ftrace_regs *fregs)
{
	struct pvsched_cpu *pc;
	unsigned long irqfl;

	if (!pvsched_lockhold_on())
		return;
	if (!pvsched_host_contends()) {
		this_cpu_inc(pvsched_cpu.held_uncontended);
		return;
	}
	pc = pvsched_update_begin(&irqfl);
	if (!pc)
		return;
	pvsched_yield_if_extended(pc);
	pc->held_takes++;
	if (pc->held_count < PVSCHED_HELD_MAX)
		pc->held[pc->held_count++] = pvsched_lock_arg(fregs);
	else
		pc->held_dropped++;
	pvsched_update_end_lock(pc, irqfl);
}

static void notrace pvsched_on_release(unsigned long ip,
				       unsigned long parent_ip,
				       struct ftrace_ops *op,
				       struct ftrace_regs *fregs)
{
	void *lock = pvsched_lock_arg(fregs);
	struct pvsched_cpu *pc;
	unsigned long irqfl;
	u32 i;

	/*
	 * Most unlocks are of locks never seen taken here (trylocks); none is
	 * listed while the feature is not accepted.
	 */
	if (likely(!this_cpu_read(pvsched_cpu.held_count)))
		return;
	pc = pvsched_update_begin(&irqfl);
	if (!pc)
		return;
	for (i = pc->held_count; i--;) {
		if (pc->held[i] != lock)
			continue;
		memmove(&pc->held[i], &pc->held[i + 1],
			(pc->held_count - i - 1) * sizeof(pc->held[0]));
		pc->held_count--;
		pc->held_releases++;
		pvsched_update_end_lock(pc, irqfl);
		return;
	}
	pc->held_unmatched++;
	pvsched_update_end_lock(pc, irqfl);
}

/* RECURSION: the ftrace core guards the callbacks against re-entry. */
static struct ftrace_ops pvsched_take_ops = {
	.func = pvsched_on_take,
	.flags = FTRACE_OPS_FL_RECURSION,
};

static struct ftrace_ops pvsched_release_ops = {
	.func = pvsched_on_release,
	.flags = FTRACE_OPS_FL_RECURSION,
};

/* Filter @ops to the functions of @fns that this kernel can trace. */
static unsigned int pvsched_filter(struct ftrace_ops *ops,
				   const char *const *fns, unsigned int n,
				   bool *hooked)
{
	unsigned int i, found = 0;
	char name[32];

	for (i = 0; i < n; i++) {
		strscpy(name, fns[i], sizeof(name));
		hooked[i] = !ftrace_set_filter(ops, name, strlen(name), 0);
		found += hooked[i];
	}
	return found;
}

/*
 * ftrace_free_filter() frees an ops' filter hashes but leaves the pointers,
 * which the next ftrace_set_filter() would copy from: put them back to
 * "none yet", as a never-filtered static ops has them.
 */
static void pvsched_unfilter(struct ftrace_ops *ops)
{
	ftrace_free_filter(ops);
	ops->func_hash->filter_hash = NULL;
	ops->func_hash->notrace_hash = NULL;
}

static void pvsched_unfilter_all(void)
{
	pvsched_unfilter(&pvsched_take_ops);
	pvsched_unfilter(&pvsched_release_ops);
	memset(pvsched_hooked, 0, sizeof(pvsched_hooked));
	pvsched_filtered = false;
}

static void pvsched_lockhold_unregister(void)
{
	if (!pvsched_lockhold_registered)
		return;
	/* Each waits until no callback of its runs any more. */
	WARN_ON_ONCE(unregister_ftrace_function(&pvsched_release_ops));
	WARN_ON_ONCE(unregister_ftrace_function(&pvsched_take_ops));
	pvsched_lockhold_registered = false;
	pvsched_region.probe_changes++;
	pvsched_saved_clear();
}

/* The driver lets go of its device: unhook, and free the filters. */
void pvsched_lockhold_release(void)
{
	pvsched_lockhold_unregister();
	if (pvsched_filtered)
		pvsched_unfilter_all();
}

/*
 * At a bind (every slot inactive, no probe in flight): forget the tasks
 * saved under the last binding, and hook the lock calls the first time
 * @features has PVSCHED_F_LOCK_HOLD. Hooks registered stay, idle while the
 * feature is not accepted.
 */
int pvsched_lockhold_update(u64 features)
{
	int ret;

	pvsched_saved_clear();
	if (!(features & PVSCHED_F_LOCK_HOLD) || pvsched_lockhold_registered)
		return 0;
	if (!pvsched_filtered) {
		pvsched_filtered = true;
		if (!pvsched_filter(&pvsched_take_ops, pvsched_take_fns,
				    PVSCHED_NR_TAKE, pvsched_hooked) ||
		    !pvsched_filter(&pvsched_release_ops, pvsched_release_fns,
				    PVSCHED_NR_RELEASE,
				    pvsched_hooked + PVSCHED_NR_TAKE)) {
			pr_err("no lock call can be traced: lock holders not published\n");
			ret = -ENOENT;
			goto fail;
		}
	}
	/* Releases first: a lock seen taken is then always seen released. */
	ret = register_ftrace_function(&pvsched_release_ops);
	if (ret)
		goto fail;
	ret = register_ftrace_function(&pvsched_take_ops);
	if (ret) {
		unregister_ftrace_function(&pvsched_release_ops);
		goto fail;
	}
	pvsched_lockhold_registered = true;
	pvsched_region.probe_changes++;
	return 0;
fail:
	pvsched_unfilter_all();
	return ret;
}

const char *pvsched_lockhold_function(unsigned int i, bool *hooked)
{
	if (i >= ARRAY_SIZE(pvsched_hooked))
		return NULL;
	*hooked = pvsched_lockhold_registered && pvsched_hooked[i];
	return i < PVSCHED_NR_TAKE ? pvsched_take_fns[i] :
				     pvsched_release_fns[i - PVSCHED_NR_TAKE];
}

u64 pvsched_lockhold_save_failures(void)
{
	return atomic64_read(&pvsched_save_failed);
}

void pvsched_lockhold_switch(struct pvsched_cpu *pc, struct task_struct *prev,
			     unsigned int prev_state, struct task_struct *next)
{
	if (pc->held_count) {
		/* A task that exits takes nothing with it. */
		if (!(prev_state & TASK_DEAD))
			pvsched_held_save(pc, prev);
		pc->held_count = 0;
	}
	if (pvsched_lockhold_saved())
		pvsched_held_restore(pc, next);
}

#else /* no ftrace with the arguments: PVSCHED_F_LOCK_HOLD is not offered */

int pvsched_lockhold_update(u64 features)
{
	return 0;
}

void pvsched_lockhold_release(void)
{
}

const char *pvsched_lockhold_function(unsigned int i, bool *hooked)
{
	return NULL;
}

u64 pvsched_lockhold_save_failures(void)
{
	return 0;
}

void pvsched_lockhold_switch(struct pvsched_cpu *pc, struct task_struct *prev,
			     unsigned int prev_state, struct task_struct *next)
{
	pc->held_count = 0;
}

#endif

void pvsched_lockhold_reset(struct pvsched_cpu *pc)
{
	pc->held_count = 0;
}

/* A timer tick in user mode: the running task holds no kernel lock. */
void pvsched_lockhold_user_tick(struct pvsched_cpu *pc)
{
	if (!pc->held_count)
		return;
	pc->held_count = 0;
	pc->held_user_resets++;
}
