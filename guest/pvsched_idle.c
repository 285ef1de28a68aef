// SPDX-License-Identifier: GPL-2.0
/*
 * pvsched: a cpuidle driver that polls for a wakeup before it halts.
 *
 * Halting a vCPU hands its host CPU back; the wakeup then waits until the
 * host runs the vCPU thread again. Polling a little first avoids that wait
 * when the wakeup comes soon, at the price of CPU time the host could have
 * used. Modes (parameter "idle"):
 *
 *   hinted    pvsched's: poll, then halt, as haltpoll adapts it, but only
 *             while the host says it is not overloaded and has measured
 *             what a wake-up costs here, up to a cap derived from that
 *             cost (HINT_POLL_FACTOR x the host's wake -> running p99), and
 *             within the CPU budget the host grants (a token bucket).
 *             The HALT state carries the host's p50/p99 as its exit
 *             latency and target residency (sysfs); the governor cannot
 *             pick it directly (menu, on this kernel, only polls when a
 *             timer is due sooner than HALT's residency, which message
 *             passing never has), so the one usable state decides.
 *   haltpoll  one state: poll up to a per-CPU limit that adapts like the
 *             upstream haltpoll governor with its defaults, then halt.
 *   fixed     one state: poll idle_poll_us, then halt.
 *   auto      hinted if the host offers idle hints, else no driver.
 *   off       no driver.
 *
 * The enter callbacks run with interrupts off and in RCU idle (6.1:
 * cpuidle_enter_state() calls them between ct_idle_enter() and
 * ct_idle_exit(), and enables interrupts after they return). They may
 * return with interrupts on: polling enables them like poll_idle() does,
 * halting is "sti; hlt" like default_idle(). No locks are taken and
 * nothing sleeps.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bitops.h>
#include <linux/cpu.h>
#include <linux/cpuhotplug.h>
#include <linux/cpuidle.h>
#include <linux/debugfs.h>
#include <linux/irqflags.h>
#include <linux/minmax.h>
#include <linux/moduleparam.h>
#include <linux/percpu.h>
#include <linux/sched/clock.h>
#include <linux/sched/idle.h>
#include <linux/seq_file.h>
#include <linux/smp.h>
#include <linux/string.h>

#include "pvsched_drv.h"

/* Loops between clock reads while polling, as drivers/cpuidle/poll_state.c. */
#define PVSCHED_POLL_RELAX_COUNT	200
/* Upper bound of idle_poll_us and idle_max_poll_us. */
#define PVSCHED_POLL_MAX_US		1000
/* How often a CPU looks at its host half for new hints. */
#define PVSCHED_HINT_REFRESH_NS		(10 * NSEC_PER_MSEC)
/*
 * hinted: a poll is worth at most this many times the host's p99 wake-up
 * latency; the host sees only its scheduler's part of a halt's cost (not the
 * exit, the entry, the interrupt delivery), hence more than 1.
 */
#define HINT_POLL_FACTOR		4
/*
 * hinted: loops between clock reads. Fewer than poll_idle()'s 200: under
 * TCG 200 loops take tens of microseconds, and the budget is charged for
 * every poll's overshoot.
 */
#define HINT_POLL_RELAX_COUNT		10
/* hinted: the poll budget's bucket holds this long a window's worth. */
#define HINT_BUDGET_WINDOW_NS		(100 * NSEC_PER_MSEC)

/*
 * drivers/cpuidle/governors/haltpoll.c with its default parameters:
 * guest_halt_poll_ns, _grow, _grow_start, _shrink, _allow_shrink.
 */
#define HALTPOLL_POLL_NS		200000U
#define HALTPOLL_GROW			2U
#define HALTPOLL_GROW_START		50000U
#define HALTPOLL_SHRINK			2U
#define HALTPOLL_ALLOW_SHRINK		true

enum pvsched_idle_mode {
	PVSCHED_IDLE_AUTO,
	PVSCHED_IDLE_OFF,
	PVSCHED_IDLE_HALTPOLL,
	PVSCHED_IDLE_FIXED,
	PVSCHED_IDLE_HINTED,
};

static const char *const pvsched_idle_modes[] = {
	[PVSCHED_IDLE_AUTO]	= "auto",
	[PVSCHED_IDLE_OFF]	= "off",
	[PVSCHED_IDLE_HALTPOLL]	= "haltpoll",
	[PVSCHED_IDLE_FIXED]	= "fixed",
	[PVSCHED_IDLE_HINTED]	= "hinted",
};

static int idle_mode = PVSCHED_IDLE_AUTO;

static int pvsched_idle_mode_set(const char *val, const struct kernel_param *kp)
{
	int i = sysfs_match_string(pvsched_idle_modes, val);

	if (i < 0)
		return -EINVAL;
	*(int *)kp->arg = i;
	/*
	 * A write through sysfs (the module is live, not being loaded): switch
	 * now. Reloading the module instead would re-patch every tracepoint
	 * call site, which QEMU 7.2's multi-threaded TCG mishandles under IPI
	 * load (guest/README.md).
	 */
	if (THIS_MODULE->state == MODULE_STATE_LIVE)
		pvsched_idle_restart();
	return 0;
}

static int pvsched_idle_mode_get(char *buf, const struct kernel_param *kp)
{
	return scnprintf(buf, PAGE_SIZE, "%s\n",
			 pvsched_idle_modes[*(int *)kp->arg]);
}

static const struct kernel_param_ops pvsched_idle_mode_ops = {
	.set	= pvsched_idle_mode_set,
	.get	= pvsched_idle_mode_get,
};
module_param_cb(idle, &pvsched_idle_mode_ops, &idle_mode, 0644);
MODULE_PARM_DESC(idle,
		 "cpuidle driver: auto (hinted if the host offers idle hints, else none), off, haltpoll, fixed, hinted; writable: switches at once");

static unsigned int idle_poll_us;

static int pvsched_poll_us_set(const char *val, const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 0, PVSCHED_POLL_MAX_US);
}

static const struct kernel_param_ops pvsched_poll_us_ops = {
	.set	= pvsched_poll_us_set,
	.get	= param_get_uint,
};
module_param_cb(idle_poll_us, &pvsched_poll_us_ops, &idle_poll_us, 0644);
MODULE_PARM_DESC(idle_poll_us,
		 "idle=fixed: poll this long (us, 0..1000) before halting; 0 = halt at once; a write applies at the next write of idle");

static unsigned int idle_budget_permille = 50;

static int pvsched_budget_set(const char *val, const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 0, 1000);
}

static const struct kernel_param_ops pvsched_budget_ops = {
	.set	= pvsched_budget_set,
	.get	= param_get_uint,
};
module_param_cb(idle_budget_permille, &pvsched_budget_ops,
		&idle_budget_permille, 0444);
MODULE_PARM_DESC(idle_budget_permille,
		 "idle=hinted: share of a core (permille, 0..1000) a CPU may spend polling when the host grants none");

static unsigned int idle_max_poll_us = 200;

static int pvsched_max_poll_us_set(const char *val,
				   const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 1, PVSCHED_POLL_MAX_US);
}

static const struct kernel_param_ops pvsched_max_poll_us_ops = {
	.set	= pvsched_max_poll_us_set,
	.get	= param_get_uint,
};
module_param_cb(idle_max_poll_us, &pvsched_max_poll_us_ops, &idle_max_poll_us,
		0444);
MODULE_PARM_DESC(idle_max_poll_us,
		 "idle=hinted: upper bound (us, 1..1000) of a poll and of the hinted halt latency and residency");

/*
 * Per-CPU state of the driver. Only the owning CPU writes it while the
 * driver is registered (counters are plain: no atomics on the owner);
 * debugfs reads it from anywhere.
 */
struct pvsched_idle_cpu {
	u64 polls;		/* polls started */
	u64 poll_hits;		/* woken while polling */
	u64 poll_timeouts;	/* limit reached, then halted */
	u64 poll_ns;		/* time spent polling */
	u64 halts;		/* halt entries, whatever led to them */
	u64 overload_halts;	/* POLL chosen, halted: host overloaded */
	u64 unhinted_halts;	/* POLL chosen, halted: no hint (yet) */
	u64 budget_halts;	/* would have polled, halted: budget spent */
	u64 limit_ns;		/* current poll limit */
	u64 cap_ns;		/* hinted: the limit's upper bound */
	s64 tokens_ns;		/* hinted: poll time left in the budget (< 0: owed) */
	u64 tokens_at;		/* local_clock() the tokens were counted to */
	u32 budget_permille;	/* hinted: budget in force */
	u64 refresh_due;	/* local_clock() of the next hint refresh */
	u32 wake_p50_ns;	/* last hint applied */
	u32 wake_p99_ns;
	bool overloaded;
	bool hinted;		/* a measured hint is in force */
	/* This CPU's slot, read in hinted mode only; NULL: none. */
	const struct pvsched_slot *slot;
};

static DEFINE_PER_CPU(struct pvsched_idle_cpu, pvsched_idle_cpu);

/* Driver-wide state; written under the bind mutex of pvsched_main.c. */
static struct {
	int mode;			/* in force; requested until registered */
	bool registered;
	/* Enter callbacks may read host halves (hinted, hints accepted). */
	bool live;
	int cpuhp_state;
	struct cpuidle_device __percpu *devs;
} pvsched_idle_ctl = {
	.mode = PVSCHED_IDLE_AUTO,
};

/*
 * Bit 0: a CPU is writing the shared state table (the readers take no lock).
 * A bit lock that is only ever tried: nothing spins in the idle path.
 */
static unsigned long pvsched_idle_table_busy;

#define PVSCHED_STATE_POLL	0
#define PVSCHED_STATE_HALT	1

/*
 * Halt as drivers/cpuidle/cpuidle-haltpoll.c's default_enter_idle() does:
 * called with interrupts off, clears the polling flag (a remote wakeup then
 * sends an IPI) and halts with interrupts enabled atomically ("sti; hlt",
 * the exported paravirt op behind default_idle()). Returns with them on.
 */
static void pvsched_idle_halt(struct pvsched_idle_cpu *ic)
{
	ic->halts++;
	if (current_clr_polling_and_test()) {
		local_irq_enable();
		return;
	}
	raw_safe_halt();
}

/*
 * Poll as drivers/cpuidle/poll_state.c does: interrupts on, the polling flag
 * set (a remote wakeup then needs no IPI), need_resched() and cpu_relax(),
 * the clock read every PVSCHED_POLL_RELAX_COUNT loops. Called with
 * interrupts off. Returns true if woken, with interrupts on; false after
 * @limit_ns, with interrupts off and the polling flag still set, for
 * pvsched_idle_halt() to clear.
 */
static bool pvsched_idle_poll(struct pvsched_idle_cpu *ic, u64 limit_ns,
			      unsigned int relax_count)
{
	u64 start = local_clock();
	unsigned int loops = 0;
	bool woken = true;

	local_irq_enable();
	if (!current_set_polling_and_test()) {
		while (!need_resched()) {
			cpu_relax();
			if (loops++ < relax_count)
				continue;
			loops = 0;
			if (local_clock() - start > limit_ns) {
				woken = false;
				break;
			}
		}
	}
	ic->polls++;
	ic->poll_ns += local_clock() - start;
	if (woken) {
		ic->poll_hits++;
		current_clr_polling();
	} else {
		ic->poll_timeouts++;
		local_irq_disable();
	}
	return woken;
}

/* ---------------------------------------------------------------- haltpoll */

/*
 * adjust_poll_limit() of the haltpoll governor, its defaults built in, with
 * @cap_ns in the place of guest_halt_poll_ns (haltpoll: 200 us).
 */
static void pvsched_haltpoll_adjust(struct pvsched_idle_cpu *ic, u64 block_ns,
				    u64 cap_ns)
{
	u64 val;

	if (block_ns > ic->limit_ns && block_ns <= cap_ns) {
		val = ic->limit_ns * HALTPOLL_GROW;
		if (val < HALTPOLL_GROW_START)
			val = HALTPOLL_GROW_START;
		if (val > cap_ns)
			val = cap_ns;
		WRITE_ONCE(ic->limit_ns, val);
	} else if (block_ns > cap_ns && HALTPOLL_ALLOW_SHRINK) {
		WRITE_ONCE(ic->limit_ns, ic->limit_ns / HALTPOLL_SHRINK);
	}
}

/*
 * The haltpoll governor's two states in one: it polls while the last poll
 * was woken or the last idle period was a halt, halts after a poll ran out
 * (here: right away, as the governor's next pick would) or while the limit
 * is 0, and adapts the limit after each halt to how long the halt lasted.
 */
static int pvsched_enter_haltpoll(struct cpuidle_device *dev,
				  struct cpuidle_driver *drv, int index)
{
	struct pvsched_idle_cpu *ic = this_cpu_ptr(&pvsched_idle_cpu);
	u64 start;

	if (ic->limit_ns && pvsched_idle_poll(ic, ic->limit_ns,
						  PVSCHED_POLL_RELAX_COUNT))
		return index;
	start = local_clock();
	pvsched_idle_halt(ic);
	pvsched_haltpoll_adjust(ic, local_clock() - start, HALTPOLL_POLL_NS);
	return index;
}

/* ------------------------------------------------------------------ fixed */

static int pvsched_enter_fixed(struct cpuidle_device *dev,
			       struct cpuidle_driver *drv, int index)
{
	struct pvsched_idle_cpu *ic = this_cpu_ptr(&pvsched_idle_cpu);

	if (ic->limit_ns && pvsched_idle_poll(ic, ic->limit_ns,
						  PVSCHED_POLL_RELAX_COUNT))
		return index;
	pvsched_idle_halt(ic);
	return index;
}

/* ----------------------------------------------------------------- hinted */

/*
 * The kernel keeps one state table for all CPUs (no per-CPU tables without
 * CONFIG_CPU_IDLE_MULTIPLE_DRIVERS): it carries the hint last applied by any
 * CPU. Writers that would wait skip (the next refresh comes); the order of
 * the stores keeps exit latency <= target residency for readers.
 */
static void pvsched_idle_set_table(struct cpuidle_driver *drv, s64 exit_ns,
				   s64 target_ns)
{
	struct cpuidle_state *halt = &drv->states[PVSCHED_STATE_HALT];

	if (test_and_set_bit_lock(0, &pvsched_idle_table_busy))
		return;
	if (target_ns < READ_ONCE(halt->exit_latency_ns))
		WRITE_ONCE(halt->exit_latency_ns, exit_ns);
	WRITE_ONCE(halt->target_residency_ns, target_ns);
	WRITE_ONCE(halt->exit_latency_ns, exit_ns);
	clear_bit_unlock(0, &pvsched_idle_table_busy);
}

static void pvsched_idle_apply(struct pvsched_idle_cpu *ic,
			       struct cpuidle_driver *drv,
			       u32 flags, u32 p50, u32 p99, u32 budget)
{
	s64 max_ns = (s64)idle_max_poll_us * NSEC_PER_USEC;
	s64 exit_ns = NSEC_PER_USEC, target_ns = NSEC_PER_USEC;
	const struct cpuidle_state *halt = &drv->states[PVSCHED_STATE_HALT];

	WRITE_ONCE(ic->wake_p50_ns, p50);
	WRITE_ONCE(ic->wake_p99_ns, p99);
	WRITE_ONCE(ic->overloaded, !!(flags & PVSCHED_HF_OVERLOADED));
	WRITE_ONCE(ic->budget_permille, budget ? budget : idle_budget_permille);
	/* 0 = not measured yet: no polling. */
	ic->hinted = p50 && p99;
	if (ic->hinted) {
		target_ns = clamp_t(s64, p99, NSEC_PER_USEC, max_ns);
		exit_ns = min_t(s64, clamp_t(s64, p50, NSEC_PER_USEC, max_ns),
				target_ns);
	}
	WRITE_ONCE(ic->cap_ns, ic->hinted ?
		   clamp_t(u64, (u64)p99 * HINT_POLL_FACTOR, NSEC_PER_USEC, max_ns) :
		   0);
	if (ic->limit_ns > ic->cap_ns)
		WRITE_ONCE(ic->limit_ns, ic->cap_ns);
	if (READ_ONCE(halt->exit_latency_ns) != exit_ns ||
	    READ_ONCE(halt->target_residency_ns) != target_ns)
		pvsched_idle_set_table(drv, exit_ns, target_ns);
}

/*
 * Look at this CPU's host half at most every PVSCHED_HINT_REFRESH_NS. The
 * region is read only while pvsched_idle_ctl.live: pvsched_idle_stop() clears
 * it, then waits until every CPU has left the enter callbacks, before the
 * region is unmapped. Without a region, a slot or the feature, the hint is
 * "none": POLL then halts.
 */
static void pvsched_idle_refresh(struct pvsched_idle_cpu *ic,
				 struct cpuidle_driver *drv)
{
	struct pvsched_host_half h = {};
	u64 now = local_clock();

	if (now < ic->refresh_due)
		return;
	ic->refresh_due = now + PVSCHED_HINT_REFRESH_NS;
	if (READ_ONCE(pvsched_idle_ctl.live) && ic->slot &&
	    !pvsched_read_host(ic->slot, &h))
		return;	/* never consistent: keep the last hint */
	pvsched_idle_apply(ic, drv, h.flags, h.wake_p50_ns, h.wake_p99_ns,
			   min_t(u32, h.poll_budget_permille, 1000));
}

/*
 * The budget as a token bucket: budget_permille of the time since the last
 * count, up to HINT_BUDGET_WINDOW_NS' worth. Polling spends it, caught
 * wakeups included: their time was CPU the host could have used.
 */
static u64 pvsched_idle_tokens(struct pvsched_idle_cpu *ic, u64 now)
{
	s64 full = HINT_BUDGET_WINDOW_NS / 1000 * ic->budget_permille;

	if (now > ic->tokens_at)
		ic->tokens_ns += (now - ic->tokens_at) / 1000 * ic->budget_permille;
	ic->tokens_at = now;
	if (ic->tokens_ns > full)
		ic->tokens_ns = full;
	return ic->tokens_ns > 0 ? ic->tokens_ns : 0;
}

static int pvsched_enter_hinted(struct cpuidle_device *dev,
				struct cpuidle_driver *drv, int index)
{
	struct pvsched_idle_cpu *ic = this_cpu_ptr(&pvsched_idle_cpu);
	u64 start, window, spent;

	pvsched_idle_refresh(ic, drv);
	if (ic->overloaded || !ic->hinted) {
		/* Polling would keep a contended host CPU from others. */
		if (ic->overloaded)
			ic->overload_halts++;
		else
			ic->unhinted_halts++;
		pvsched_idle_halt(ic);
		return PVSCHED_STATE_HALT;
	}
	start = local_clock();
	/*
	 * A whole window or none: a poll cut short by the budget mostly times
	 * out, and would spend the budget for nothing.
	 */
	window = ic->limit_ns;
	if (window > pvsched_idle_tokens(ic, start))
		window = 0;
	if (window) {
		bool woken = pvsched_idle_poll(ic, window,
					       HINT_POLL_RELAX_COUNT);

		/* All of it, overshoot included: a poll ends between clock reads. */
		spent = local_clock() - start;
		ic->tokens_ns -= spent;
		if (woken)
			return index;
	} else if (ic->limit_ns) {
		ic->budget_halts++;
	}
	pvsched_idle_halt(ic);
	/* The whole idle period: had the poll lasted that long, it had caught it. */
	pvsched_haltpoll_adjust(ic, local_clock() - start, ic->cap_ns);
	return PVSCHED_STATE_HALT;
}

/* Only reached through pvsched_enter_hinted() (CPUIDLE_FLAG_UNUSABLE). */
static int pvsched_enter_hinted_halt(struct cpuidle_device *dev,
				     struct cpuidle_driver *drv, int index)
{
	struct pvsched_idle_cpu *ic = this_cpu_ptr(&pvsched_idle_cpu);

	pvsched_idle_halt(ic);
	return index;
}

/* ----------------------------------------------------------- registration */

/*
 * No .owner: the core would pin the module while devices are registered,
 * and they are unregistered only when the module unbinds, at rmmod.
 */
static struct cpuidle_driver pvsched_idle_driver = {
	.name	= KBUILD_MODNAME,
};

static void pvsched_idle_state(struct cpuidle_state *s, const char *name,
			       const char *desc,
			       int (*enter)(struct cpuidle_device *,
					    struct cpuidle_driver *, int))
{
	strscpy(s->name, name, sizeof(s->name));
	strscpy(s->desc, desc, sizeof(s->desc));
	s->exit_latency_ns = NSEC_PER_USEC;
	s->target_residency_ns = NSEC_PER_USEC;
	s->power_usage = -1;
	s->enter = enter;
}

/* The state table of @mode; times in ns only (the core keeps them). */
static void pvsched_idle_states(struct cpuidle_driver *drv, int mode)
{
	memset(drv->states, 0, sizeof(drv->states));
	drv->safe_state_index = 0;
	switch (mode) {
	case PVSCHED_IDLE_HALTPOLL:
		pvsched_idle_state(&drv->states[0], "HALTPOLL",
				   "adaptive poll, then halt",
				   pvsched_enter_haltpoll);
		drv->state_count = 1;
		break;
	case PVSCHED_IDLE_FIXED:
		pvsched_idle_state(&drv->states[0], "FIXED",
				   "poll idle_poll_us then halt",
				   pvsched_enter_fixed);
		drv->state_count = 1;
		break;
	default:
		/*
		 * Not CPUIDLE_FLAG_POLLING: it mostly halts, and the governor
		 * then stops the tick for long idles as for any halt.
		 */
		pvsched_idle_state(&drv->states[PVSCHED_STATE_POLL], "HINTED",
				   "poll as hinted, then halt",
				   pvsched_enter_hinted);
		drv->states[PVSCHED_STATE_POLL].exit_latency_ns = 0;
		drv->states[PVSCHED_STATE_POLL].target_residency_ns = 0;
		pvsched_idle_state(&drv->states[PVSCHED_STATE_HALT], "HALT",
				   "halt (host wake p50/p99)",
				   pvsched_enter_hinted_halt);
		drv->states[PVSCHED_STATE_HALT].flags = CPUIDLE_FLAG_UNUSABLE;
		drv->state_count = 2;
		break;
	}
}

static int pvsched_idle_cpu_online(unsigned int cpu)
{
	struct cpuidle_device *dev = per_cpu_ptr(pvsched_idle_ctl.devs, cpu);

	if (dev->registered)
		return 0;
	dev->cpu = cpu;
	return cpuidle_register_device(dev) ? -EIO : 0;
}

static int pvsched_idle_cpu_offline(unsigned int cpu)
{
	struct cpuidle_device *dev = per_cpu_ptr(pvsched_idle_ctl.devs, cpu);

	if (dev->registered)
		cpuidle_unregister_device(dev);
	return 0;
}

static void pvsched_idle_reset_cpus(int mode)
{
	const struct pvsched_region *r = &pvsched_region;
	unsigned int cpu;

	for_each_possible_cpu(cpu) {
		struct pvsched_idle_cpu *ic = per_cpu_ptr(&pvsched_idle_cpu, cpu);

		memset(ic, 0, sizeof(*ic));
		if (mode == PVSCHED_IDLE_FIXED)
			ic->limit_ns = (u64)idle_poll_us * NSEC_PER_USEC;
		/* haltpoll, hinted: 0, as haltpoll_enable_device() starts */
		if (cpu < r->slot_count)
			ic->slot = pvsched_slot(cpu);
	}
}

static int pvsched_idle_noop(void *unused)
{
	return 0;
}

/*
 * Run a work item on every online CPU: its idle task has then been switched
 * out, so the CPU has left our enter callbacks and cpuidle_enter_state()
 * (which still touches the device and the driver after the callback).
 */
static void pvsched_idle_flush_cpus(void)
{
	unsigned int cpu;

	cpus_read_lock();
	for_each_online_cpu(cpu)
		smp_call_on_cpu(cpu, pvsched_idle_noop, NULL, false);
	cpus_read_unlock();
}

/*
 * Unregister the driver, if registered, and wait until no CPU runs its code
 * or reads the region through it. Called under the bind mutex before the
 * region is unmapped (unbind, rmmod, shutdown, host re-initialization).
 */
void pvsched_idle_stop(void)
{
	WRITE_ONCE(pvsched_idle_ctl.live, false);
	if (!pvsched_idle_ctl.registered)
		return;
	if (pvsched_idle_ctl.cpuhp_state > 0)
		cpuhp_remove_state(pvsched_idle_ctl.cpuhp_state);
	pvsched_idle_ctl.cpuhp_state = 0;
	cpuidle_unregister_driver(&pvsched_idle_driver);
	pvsched_idle_flush_cpus();
	free_percpu(pvsched_idle_ctl.devs);
	pvsched_idle_ctl.devs = NULL;
	WRITE_ONCE(pvsched_idle_ctl.registered, false);
}

static int pvsched_idle_register(int mode, bool hints)
{
	struct cpuidle_driver *drv = &pvsched_idle_driver;
	int ret;

	pvsched_idle_reset_cpus(mode);
	pvsched_idle_states(drv, mode);
	ret = cpuidle_register_driver(drv);
	if (ret)
		return ret;
	pvsched_idle_ctl.devs = alloc_percpu(struct cpuidle_device);
	if (!pvsched_idle_ctl.devs) {
		ret = -ENOMEM;
		goto out_driver;
	}
	/* Before any CPU enters: hints are read from the first entry on. */
	WRITE_ONCE(pvsched_idle_ctl.live, mode == PVSCHED_IDLE_HINTED && hints);
	ret = cpuhp_setup_state(CPUHP_AP_ONLINE_DYN, "pvsched/idle:online",
				pvsched_idle_cpu_online,
				pvsched_idle_cpu_offline);
	if (ret < 0)
		goto out_devs;
	pvsched_idle_ctl.cpuhp_state = ret;
	return 0;

out_devs:
	WRITE_ONCE(pvsched_idle_ctl.live, false);
	/* A CPU may have entered through a device registered meanwhile. */
	pvsched_idle_flush_cpus();
	free_percpu(pvsched_idle_ctl.devs);
	pvsched_idle_ctl.devs = NULL;
out_driver:
	cpuidle_unregister_driver(drv);
	return ret;
}

static void pvsched_idle_debugfs_create(void);

/*
 * Register the idle driver the "idle" parameter asks for, once the region is
 * bound. Prints ONE line: the driver and its states, or why there is none;
 * the rest of the module works either way.
 */
void pvsched_idle_start(struct pci_dev *pdev)
{
	bool hints = pvsched_region.features & PVSCHED_F_IDLE_HINTS;
	const struct cpuidle_driver *other;
	int mode = idle_mode;
	int ret;

	WRITE_ONCE(pvsched_idle_ctl.mode, mode);
	/* No driver is registered now: counters start from zero. */
	pvsched_idle_reset_cpus(mode);
	pvsched_idle_debugfs_create();
	if (mode == PVSCHED_IDLE_AUTO) {
		if (!hints) {
			dev_info(&pdev->dev,
				 "idle driver: none: mode auto and the host does not offer idle hints\n");
			return;
		}
		mode = PVSCHED_IDLE_HINTED;
	}
	if (mode == PVSCHED_IDLE_OFF) {
		dev_info(&pdev->dev, "idle driver: none: mode off\n");
		return;
	}
	if (boot_option_idle_override != IDLE_NO_OVERRIDE) {
		dev_info(&pdev->dev,
			 "idle driver: not registered: idle= on the kernel command line\n");
		return;
	}
	ret = pvsched_idle_register(mode, hints);
	if (ret == -EBUSY) {
		other = cpuidle_get_driver();
		dev_info(&pdev->dev,
			 "idle driver: not registered: cpuidle driver %s is already registered\n",
			 other ? other->name : "(unknown)");
		return;
	}
	if (ret) {
		dev_info(&pdev->dev,
			 "idle driver: not registered: error %d%s\n", ret,
			 ret == -ENODEV ? " (cpuidle disabled)" : "");
		return;
	}
	WRITE_ONCE(pvsched_idle_ctl.mode, mode);
	WRITE_ONCE(pvsched_idle_ctl.registered, true);
	dev_info(&pdev->dev, "idle driver: mode %s, %d state%s%s\n",
		 pvsched_idle_modes[mode], pvsched_idle_driver.state_count,
		 pvsched_idle_driver.state_count == 1 ? "" : "s",
		 mode == PVSCHED_IDLE_HINTED && !hints ?
		 " (the host offers no hints: it halts)" : "");
}

/* ---------------------------------------------------------------- debugfs */

static int pvsched_idle_show(struct seq_file *m, void *unused)
{
	const struct cpuidle_driver *drv = cpuidle_get_driver();
	int mode = READ_ONCE(pvsched_idle_ctl.mode);
	bool hinted = mode == PVSCHED_IDLE_HINTED;
	unsigned int cpu;

	seq_printf(m, "mode=%s registered=%d driver=%s poll_max_us=%u fixed_poll_us=%u\n",
		   pvsched_idle_modes[mode], READ_ONCE(pvsched_idle_ctl.registered),
		   drv ? drv->name : "none", idle_max_poll_us, idle_poll_us);
	for_each_possible_cpu(cpu) {
		const struct pvsched_idle_cpu *ic =
			per_cpu_ptr(&pvsched_idle_cpu, cpu);

		seq_printf(m, "cpu%u polls=%llu poll_hits=%llu poll_timeouts=%llu poll_ns=%llu halts=%llu overload_halts=%llu unhinted_halts=%llu limit_ns=%llu wake_p50_ns=%u wake_p99_ns=%u overloaded=%d budget_halts=%llu cap_ns=%llu budget_permille=%u\n",
			   cpu, READ_ONCE(ic->polls), READ_ONCE(ic->poll_hits),
			   READ_ONCE(ic->poll_timeouts), READ_ONCE(ic->poll_ns),
			   READ_ONCE(ic->halts), READ_ONCE(ic->overload_halts),
			   READ_ONCE(ic->unhinted_halts),
			   READ_ONCE(ic->limit_ns),
			   hinted ? READ_ONCE(ic->wake_p50_ns) : 0,
			   hinted ? READ_ONCE(ic->wake_p99_ns) : 0,
			   hinted && READ_ONCE(ic->overloaded),
			   READ_ONCE(ic->budget_halts),
			   hinted ? READ_ONCE(ic->cap_ns) : 0,
			   hinted ? READ_ONCE(ic->budget_permille) : 0);
	}
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(pvsched_idle);

/* Beside "status", in the directory pvsched_debugfs_create() made; once. */
static void pvsched_idle_debugfs_create(void)
{
	struct dentry *dir = debugfs_lookup(KBUILD_MODNAME, NULL);
	struct dentry *file;

	if (IS_ERR_OR_NULL(dir))
		return;
	file = debugfs_lookup("idle", dir);
	if (file)
		dput(file);
	else
		debugfs_create_file("idle", 0444, dir, NULL, &pvsched_idle_fops);
	dput(dir);
}
