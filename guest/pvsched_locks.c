// SPDX-License-Identifier: GPL-2.0
/*
 * pvsched: lock waits (PVSCHED_F_LOCK_WAIT), and the host's per-vCPU hints
 * put to use.
 *
 * The lock:contention_begin/end tracepoints (probes in pvsched_probes.c) say
 * which lock a task on this CPU waits for. A mutex, and an rwsem held for
 * writing, name their holder in their owner word: when it runs on another
 * vCPU, this CPU's slot names that vCPU, so that a host which preempted it
 * knows someone waits. Other locks do not record their holder: the slot says
 * "another vCPU" (PVSCHED_LOCK_ANY), but only while the host says one is
 * preempted (such contentions are frequent and mostly short; the host can
 * help only then). README.md, "Lock waits", has the whole table.
 *
 * The other way: a mutex's optimistic spin on a holder whose vCPU the host
 * says is preempted is ended at once, and the host's "preempted" and
 * "overloaded" are exported for other guest modules.
 *
 * The lock_* entry points run inside an update of this CPU's state
 * (interrupts off, the state busy: pvsched_probes.c); probes are never
 * called from hardirq or NMI context for these events.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/compiler.h>
#include <linux/cpumask.h>
#include <linux/io.h>
#include <linux/kvm_para.h>
#include <asm/processor.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/percpu.h>
#include <linux/preempt.h>
#include <linux/rcupdate.h>
#include <linux/rwsem.h>
#include <linux/sched.h>
#include <linux/smp.h>

#include <trace/events/lock.h>

#include "pvsched_drv.h"
#include "pvsched_hints.h"

/*
 * Flag bits in the owner words of the 6.1 lock implementations, private to
 * kernel/locking/mutex.c (MUTEX_FLAGS: waiters, handoff, pickup) and
 * kernel/locking/rwsem.c (RWSEM_READER_OWNED, RWSEM_NONSPINNABLE); the rest
 * of the word is the owner's task_struct pointer.
 */
#define PVSCHED_MUTEX_FLAGS		0x07UL
#define PVSCHED_RWSEM_READER_OWNED	0x01UL
#define PVSCHED_RWSEM_OWNER_FLAGS	0x03UL

/* Set while the region is mapped and its geometry valid (exported hints). */
static bool pvsched_hints_live;

/*
 * KVM with steal time: the kernel's vcpu_is_preempted() reads the flag KVM
 * sets in a vCPU's steal-time record whenever it schedules that vCPU out
 * while it runs, and clears when it runs again: the hypervisor's answer at
 * this instant. The host half says what pvschedd last wrote, which on the
 * sched_ext backend can be a scan (50 ms) old. Read once per binding (a
 * CPUID, a VM exit, each time).
 */
static bool pvsched_kvm_steal;

/* The host half of slot @index says its vCPU is runnable but not running. */
static bool pvsched_slot_preempted(u32 index)
{
	return (READ_ONCE(pvsched_region.features) & PVSCHED_F_HOST_HALF) &&
	       READ_ONCE(pvsched_slot(index)->host.status) ==
	       PVSCHED_HS_PREEMPTED;
}

/* Another vCPU with an active slot that the host says is preempted, or -1. */
static int pvsched_preempted_sibling(unsigned int self)
{
	unsigned int cpu;

	for_each_online_cpu(cpu) {
		if (cpu >= pvsched_region.slot_count)
			break;
		if (cpu != self &&
		    READ_ONCE(per_cpu_ptr(&pvsched_cpu, cpu)->active) &&
		    pvsched_slot_preempted(cpu))
			return cpu;
	}
	return -1;
}

enum pvsched_owner {
	PVSCHED_OWNER_UNKNOWN,		/* the lock does not say */
	PVSCHED_OWNER_FREE,		/* nobody: just released */
	PVSCHED_OWNER_TASK,
};

/*
 * What the lock word says of the holder of @lock, contended with the
 * LCB_F_* @lcb. Only mutexes (LCB_F_MUTEX, with or without LCB_F_SPIN) and
 * rwsems (LCB_F_READ or LCB_F_WRITE alone) keep it; spinlocks, rwlocks
 * (LCB_F_SPIN), percpu rwsems (LCB_F_PERCPU), rtmutexes (LCB_F_RT) and
 * semaphores (no flag) do not. On PREEMPT_RT, mutexes and rwsems are
 * rtmutex-based and contend with LCB_F_RT.
 */
static enum pvsched_owner pvsched_lock_owner(void *lock, unsigned int lcb,
					     struct task_struct **task)
{
#ifndef CONFIG_PREEMPT_RT
	unsigned long word;

	if (lcb & LCB_F_MUTEX) {
		/* The owner word is the lock: NULL means it is free. */
		word = atomic_long_read(&((struct mutex *)lock)->owner);
		*task = (struct task_struct *)(word & ~PVSCHED_MUTEX_FLAGS);
		return *task ? PVSCHED_OWNER_TASK : PVSCHED_OWNER_FREE;
	}
	if ((lcb & (LCB_F_READ | LCB_F_WRITE)) &&
	    !(lcb & (LCB_F_SPIN | LCB_F_PERCPU | LCB_F_RT))) {
		word = atomic_long_read(&((struct rw_semaphore *)lock)->owner);
		/* Reader-owned: the word names the last reader, maybe gone. */
		if (word & PVSCHED_RWSEM_READER_OWNED)
			return PVSCHED_OWNER_UNKNOWN;
		*task = (struct task_struct *)(word & ~PVSCHED_RWSEM_OWNER_FLAGS);
		/*
		 * The count, not this word, says whether the rwsem is held; a
		 * writer writes its name just after taking it: NULL is
		 * "unknown", not "free".
		 */
		return *task ? PVSCHED_OWNER_TASK : PVSCHED_OWNER_UNKNOWN;
	}
#endif
	return PVSCHED_OWNER_UNKNOWN;
}

/*
 * Who holds @lock, as the slot would show it: *@target is the holder's slot
 * index + 1, PVSCHED_LOCK_ANY (holder unknown, and another vCPU is
 * preempted) or PVSCHED_LOCK_NONE (nothing to ask of the host: the holder
 * sleeps or waits for a guest CPU, runs on a CPU without a slot, or is
 * unknown and no other vCPU is preempted). *@preempted is the index of the
 * slot whose host half says PREEMPTED (the holder's; for an unknown holder
 * any other active one), -1 if none: what the slot and the doorbell act on.
 * *@count_preempted is whether the wait counts as one on a preempted holder
 * (lock_preempted_count): for a named holder under KVM with steal time,
 * KVM's own flag, else the same as *@preempted. Returns false when there is
 * no contention to count: the lock is free, or held on this CPU.
 */
static bool pvsched_lock_holder(void *lock, unsigned int lcb, u32 *target,
				int *preempted, bool *count_preempted)
{
	unsigned int self = smp_processor_id();
	struct task_struct *owner = NULL;
	unsigned int cpu;

	*target = PVSCHED_LOCK_NONE;
	*preempted = -1;
	*count_preempted = false;
	switch (pvsched_lock_owner(lock, lcb, &owner)) {
	case PVSCHED_OWNER_FREE:
		return false;
	case PVSCHED_OWNER_UNKNOWN:
		*preempted = pvsched_preempted_sibling(self);
		if (*preempted >= 0)
			*target = PVSCHED_LOCK_ANY;
		*count_preempted = *preempted >= 0;
		return true;
	case PVSCHED_OWNER_TASK:
		break;
	}
	if (owner == current)
		return false;
	/*
	 * @owner held the lock when its word was read, so it had not exited.
	 * A task_struct is freed only after an RCU grace period
	 * (release_task() -> put_task_struct_rcu_user() -> call_rcu()), and
	 * the tracepoint calls this probe with preemption off, which 6.1's
	 * RCU counts as a read-side critical section: *@owner stays valid
	 * until the probe returns, as in mutex_spin_on_owner(). No
	 * rcu_read_lock(): its unlock may take RCU's locks, and this runs
	 * inside lock slow paths.
	 */
	if (!READ_ONCE(owner->on_cpu))
		return true;
	cpu = task_cpu(owner);
	if (cpu == self)
		return false;
	if (cpu >= pvsched_region.slot_count)
		return true;
	*target = cpu + 1;
	if (pvsched_slot_preempted(cpu))
		*preempted = cpu;
	*count_preempted = READ_ONCE(pvsched_kvm_steal) ?
			   vcpu_is_preempted(cpu) : *preempted >= 0;
	return true;
}

/*
 * @target names the holder's vCPU (a slot index + 1): the lock records its
 * owner, which runs on another vCPU. Such a wait counts in the named
 * counters (lock_named_*_count), where preempted means that vCPU was.
 */
static bool pvsched_lock_named(u32 target)
{
	return target != PVSCHED_LOCK_NONE && target != PVSCHED_LOCK_ANY;
}

/* A spinlock or rwlock: the kind of lock that nests inside another's wait. */
static bool pvsched_lock_spins(unsigned int lcb)
{
	return (lcb & LCB_F_SPIN) && !(lcb & LCB_F_MUTEX);
}

static u32 pvsched_lock_kind(unsigned int lcb)
{
	u32 kind = 0;

	if (lcb & LCB_F_SPIN)
		kind |= PVSCHED_LOCK_F_SPIN;
	if (lcb & LCB_F_READ)
		kind |= PVSCHED_LOCK_F_READ;
	if (lcb & LCB_F_WRITE)
		kind |= PVSCHED_LOCK_F_WRITE;
	if (lcb & LCB_F_MUTEX)
		kind |= PVSCHED_LOCK_F_MUTEX;
	return kind;
}

/* The lock_holder and lock_flags words the slot should show. */
static void pvsched_lock_show(struct pvsched_cpu *pc)
{
	if (pc->lock_task && pc->lock_target != PVSCHED_LOCK_NONE) {
		pc->lock_holder = pc->lock_target;
		pc->lock_flags = pc->lock_kind |
				 (pc->lock_sleeping ? PVSCHED_LOCK_F_SLEEP : 0);
	} else {
		pc->lock_holder = PVSCHED_LOCK_NONE;
		pc->lock_flags = 0;
	}
}

/* Forget the wait in progress (it ended, or its CPU stops serving). */
static void pvsched_lock_clear(struct pvsched_cpu *pc)
{
	pc->lock_task = NULL;
	pc->lock_addr = NULL;
	pc->lock_target = PVSCHED_LOCK_NONE;
	pc->lock_sleeping = false;
	pvsched_lock_show(pc);
}

/*
 * A mutex spinner stops at once, as if the scheduler wanted the CPU (what
 * resched_curr() does for the local CPU): mutex_can_spin_on_owner() and
 * mutex_spin_on_owner() give up on need_resched(), mutex_optimistic_spin()
 * then calls schedule_preempt_disabled() and __mutex_lock_common() queues
 * the task to sleep. A spurious need_resched costs one pass through
 * schedule(), which clears it.
 */
static void pvsched_stop_spin(struct pvsched_cpu *pc)
{
	set_tsk_need_resched(current);
	set_preempt_need_resched();
	pc->lock_spins_stopped++;
}

/*
 * lock:contention_begin: current waits for @lock (LCB_F_* @lcb). Returns
 * the slot index + 1 to ring the host for once the slot shows the wait
 * (pvsched_lock_ring()), 0 for none.
 */
u32 pvsched_lock_begin(struct pvsched_cpu *pc, void *lock, unsigned int lcb)
{
	struct task_struct *curr = current;
	bool fresh = false, counted;
	bool count_preempted;
	int preempted;
	u32 target;

	if (pc->lock_task && (pc->lock_task != curr || pc->lock_addr != lock)) {
		/*
		 * Another wait is in progress here: this one is inside it (a
		 * sleeping lock's wait_lock, qrwlock's internal spinlock), or
		 * the idle task's while the waiter sleeps. Count it; the slot
		 * keeps showing the outer wait. A sleeping lock cannot nest
		 * in the same task's wait: that wait is stale (its task
		 * migrated, got the lock elsewhere and came back).
		 */
		if (pc->lock_task != curr || pvsched_lock_spins(lcb)) {
			if (pvsched_lock_holder(lock, lcb, &target, &preempted,
						&count_preempted)) {
				pc->lock_contended_count++;
				if (count_preempted)
					pc->lock_preempted_count++;
				if (pvsched_lock_named(target)) {
					pc->lock_named_contended_count++;
					if (count_preempted)
						pc->lock_named_preempted_count++;
				}
			}
			return 0;
		}
		pvsched_lock_clear(pc);
	}

	counted = pvsched_lock_holder(lock, lcb, &target, &preempted,
				      &count_preempted);
	if (!pc->lock_task) {
		if (!counted)
			return 0;
		pc->lock_task = curr;
		pc->lock_addr = lock;
		pc->lock_sleeping = false;
		pc->lock_target = PVSCHED_LOCK_NONE;
		if (pc->lock_last_task == curr && pc->lock_last_addr == lock) {
			/* Resumed after a switch to another task: counted. */
			pc->lock_last_task = NULL;
		} else {
			fresh = true;
			pc->lock_preempted_seen = false;
			pc->lock_named_seen = false;
			pc->lock_named_preempted_seen = false;
			pc->lock_contended_count++;
		}
	}
	/* Again for the same wait (a mutex: spin, then sleep): a new look. */
	pc->lock_kind = pvsched_lock_kind(lcb);
	if (count_preempted && !pc->lock_preempted_seen) {
		pc->lock_preempted_seen = true;
		pc->lock_preempted_count++;
	}
	/* A wait counts as named from its first look that names the holder. */
	if (pvsched_lock_named(target)) {
		if (!pc->lock_named_seen) {
			pc->lock_named_seen = true;
			pc->lock_named_contended_count++;
		}
		if (count_preempted && !pc->lock_named_preempted_seen) {
			pc->lock_named_preempted_seen = true;
			pc->lock_named_preempted_count++;
		}
	}
	if (target != PVSCHED_LOCK_NONE && target != pc->lock_target)
		pc->lock_requests++;
	pc->lock_target = target;
	pvsched_lock_show(pc);

	/*
	 * Only the spin before queueing: when the first waiter spins again
	 * after a wakeup, mutex_optimistic_spin() would make it TASK_RUNNING
	 * on the way out, and the wait loop would call schedule() again and
	 * again instead of sleeping.
	 */
	if (fresh && lcb == (LCB_F_MUTEX | LCB_F_SPIN) && preempted >= 0)
		pvsched_stop_spin(pc);

	return target != PVSCHED_LOCK_NONE && preempted >= 0 ? preempted + 1 : 0;
}

/* lock:contention_end: current got @lock or gave up. */
void pvsched_lock_end(struct pvsched_cpu *pc, void *lock)
{
	if (pc->lock_task == current && pc->lock_addr == lock)
		pvsched_lock_clear(pc);
	else if (pc->lock_last_task == current && pc->lock_last_addr == lock)
		pc->lock_last_task = NULL;
}

/*
 * sched_switch to @next while a wait is in progress: it lasts while its task
 * runs here, and while this CPU idles after it blocked; any other task ends
 * it. A waiter that migrated leaves the wait shown until this CPU runs
 * another task (or the waiter starts another wait here).
 */
void pvsched_lock_switch(struct pvsched_cpu *pc, struct task_struct *next)
{
	if (!pc->lock_task)
		return;
	if (next == pc->lock_task) {
		pc->lock_sleeping = false;
	} else if (is_idle_task(next)) {
		pc->lock_sleeping = true;
	} else {
		pc->lock_last_task = pc->lock_task;
		pc->lock_last_addr = pc->lock_addr;
		pvsched_lock_clear(pc);
		return;
	}
	pvsched_lock_show(pc);
}

/* No wait in progress (binding, CPU hotplug). The counters stay. */
void pvsched_lock_reset(struct pvsched_cpu *pc)
{
	pc->lock_last_task = NULL;
	pc->lock_last_addr = NULL;
	pvsched_lock_clear(pc);
}

/*
 * PVSCHED_F_DOORBELL: the slot just showed a wait for the vCPU of slot
 * @ring - 1 (or any other one, and that one is preempted): ring, so that the
 * host acts now. At most once per host-half update of that slot (its seq).
 */
void pvsched_lock_ring(struct pvsched_cpu *pc, u32 ring)
{
	u32 seq;

	if (!ring || !(READ_ONCE(pvsched_region.features) & PVSCHED_F_DOORBELL))
		return;
	seq = READ_ONCE(pvsched_slot(ring - 1)->host.seq);
	if (ring == pc->lock_rung_slot && seq == pc->lock_rung_seq)
		return;
	pc->lock_rung_slot = ring;
	pc->lock_rung_seq = seq;
	pc->lock_doorbell_rings++;
	writel(pvsched_region.doorbell,
	       pvsched_region.regs + PVSCHED_IVSHMEM_DOORBELL_REG);
}

/* The region is bound: the exported hints may read it. */
/* KVM offers steal time (the features leaf; kvm_para_has_feature() is not exported). */
static bool pvsched_kvm_has_steal_time(void)
{
#if defined(CONFIG_X86) && defined(CONFIG_PARAVIRT_SPINLOCKS)
	u32 base = hypervisor_cpuid_base(KVM_SIGNATURE, 0);

	return base && (cpuid_eax(base | KVM_CPUID_FEATURES) &
			BIT(KVM_FEATURE_STEAL_TIME));
#else
	return false;
#endif
}

/* The guest runs on KVM (its CPUID signature), whose hypercalls it may make. */
bool pvsched_on_kvm(void)
{
#ifdef CONFIG_X86
	return hypervisor_cpuid_base(KVM_SIGNATURE, 0) != 0;
#else
	return false;
#endif
}

bool pvsched_kvm_steal_known(void)
{
	return READ_ONCE(pvsched_kvm_steal);
}

/* Whose answer a named holder's counted preemption is: "kvm" or "host". */
const char *pvsched_holder_preempted_source(void)
{
	return READ_ONCE(pvsched_kvm_steal) ? "kvm" : "host";
}

void pvsched_hints_start(void)
{
	WRITE_ONCE(pvsched_kvm_steal, pvsched_kvm_has_steal_time());
	/* Geometry and mapping before "live": pairs with the readers. */
	smp_store_release(&pvsched_hints_live, true);
}

/* Before the region is unmapped: no exported hint reads it afterwards. */
void pvsched_hints_stop(void)
{
	if (!READ_ONCE(pvsched_hints_live))
		return;
	WRITE_ONCE(pvsched_hints_live, false);
	/* Readers run with preemption off (RCU-sched read side). */
	synchronize_rcu();
}

/**
 * pvsched_vcpu_preempted() - whether the host says a vCPU is preempted
 * @cpu: a guest CPU number
 *
 * The pvsched host daemon writes, for each vCPU, what it last saw the vCPU's
 * thread do; "preempted" means runnable on the host but not running, so code
 * on @cpu (a lock holder, say) makes no progress. Unlike vcpu_is_preempted(),
 * which a module cannot change, this reads the host's answer. It is as old
 * as the host's last update of the slot (the daemon's timer, or sooner when
 * it is rung).
 *
 * Context: any, including NMI and with interrupts off. Does not sleep.
 * Return: true if pvsched is bound to a region whose host writes host halves,
 * @cpu has a slot and its host half says %PVSCHED_HS_PREEMPTED; else false.
 */
bool pvsched_vcpu_preempted(int cpu)
{
	bool ret = false;

	rcu_read_lock_sched_notrace();
	/* "live" before the geometry: pairs with pvsched_hints_start(). */
	if (smp_load_acquire(&pvsched_hints_live) && cpu >= 0 &&
	    cpu < pvsched_region.slot_count)
		ret = pvsched_slot_preempted(cpu);
	rcu_read_unlock_sched_notrace();
	return ret;
}
EXPORT_SYMBOL_GPL(pvsched_vcpu_preempted);

/**
 * pvsched_host_overloaded() - whether the host says its CPUs are contended
 *
 * %PVSCHED_HF_OVERLOADED in the host half of the calling CPU's slot: the
 * host has more runnable threads than CPUs, so CPU time this vCPU spends
 * (polling, spinning) is taken from others and a halt is likely to be woken
 * late.
 *
 * Context: any, including NMI and with interrupts off. Does not sleep.
 * Return: true if pvsched is bound to a region whose host writes host halves,
 * the calling CPU has a slot and its host half says overloaded; else false.
 */
bool pvsched_host_overloaded(void)
{
	unsigned int cpu;
	bool ret = false;

	rcu_read_lock_sched_notrace();
	cpu = smp_processor_id();
	/* "live" before the geometry: pairs with pvsched_hints_start(). */
	if (smp_load_acquire(&pvsched_hints_live) &&
	    (READ_ONCE(pvsched_region.features) & PVSCHED_F_HOST_HALF) &&
	    cpu < pvsched_region.slot_count)
		ret = READ_ONCE(pvsched_slot(cpu)->host.flags) &
		      PVSCHED_HF_OVERLOADED;
	rcu_read_unlock_sched_notrace();
	return ret;
}
EXPORT_SYMBOL_GPL(pvsched_host_overloaded);
