// SPDX-License-Identifier: GPL-2.0
/*
 * pvsched: /dev/pvsched (explicit boost requests) and debugfs status.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cpumask.h>
#include <linux/debugfs.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/seq_file.h>

#include "pvsched.h"
#include "pvsched_drv.h"

static long pvsched_ioctl(struct file *file, unsigned int cmd,
			  unsigned long arg)
{
	if (cmd != PVSCHED_IOC_BOOST)
		return -ENOTTY;
	if (arg > 1)
		return -EINVAL;
	return pvsched_boost(arg);
}

/* Closing the file (also at exit) ends a boost request its closer holds. */
static int pvsched_release(struct inode *inode, struct file *file)
{
	pvsched_boost(false);
	return 0;
}

static const struct file_operations pvsched_fops = {
	.owner		= THIS_MODULE,
	.open		= nonseekable_open,
	.release	= pvsched_release,
	.unlocked_ioctl	= pvsched_ioctl,
	.compat_ioctl	= pvsched_ioctl,	/* the argument is a value */
	.llseek		= no_llseek,
};

static struct miscdevice pvsched_miscdev = {
	.minor	= MISC_DYNAMIC_MINOR,
	.name	= "pvsched",
	.fops	= &pvsched_fops,
	.mode	= 0600,
};

static bool pvsched_misc_registered;

int pvsched_misc_register(void)
{
	int ret = misc_register(&pvsched_miscdev);

	pvsched_misc_registered = !ret;
	return ret;
}

void pvsched_misc_deregister(void)
{
	if (pvsched_misc_registered)
		misc_deregister(&pvsched_miscdev);
	pvsched_misc_registered = false;
}

static const char *const pvsched_host_status[] = {
	[PVSCHED_HS_UNKNOWN]	= "unknown",
	[PVSCHED_HS_RUNNING]	= "running",
	[PVSCHED_HS_PREEMPTED]	= "preempted",
	[PVSCHED_HS_HALTED]	= "halted",
};

static void pvsched_show_host(struct seq_file *m, const struct pvsched_slot *s)
{
	struct pvsched_host_half h;

	if (!pvsched_read_host(s, &h)) {
		seq_puts(m, " host=inconsistent");
		return;
	}
	if (h.status < ARRAY_SIZE(pvsched_host_status))
		seq_printf(m, " host_status=%s", pvsched_host_status[h.status]);
	else
		seq_printf(m, " host_status=%u", h.status);
	seq_printf(m, " boosted=%d throttled=%d overloaded=%d in_debt=%d",
		   !!(h.flags & PVSCHED_HF_BOOSTED),
		   !!(h.flags & PVSCHED_HF_THROTTLED),
		   !!(h.flags & PVSCHED_HF_OVERLOADED),
		   !!(h.flags & PVSCHED_HF_IN_DEBT));
	seq_printf(m, " host_policy=%u host_prio=%u host_nice=%d",
		   h.policy, h.rt_priority, h.nice);
	seq_printf(m, " boosts=%llu throttles=%llu preempts=%llu boosted_ns=%llu host_update_ns=%llu",
		   h.boost_count, h.throttle_count, h.preempt_count,
		   h.boosted_ns, h.update_ns);
}

static int pvsched_status_show(struct seq_file *m, void *unused)
{
	const struct pvsched_region *r = &pvsched_region;
	unsigned int cpu, i;
	const char *name;
	bool on, first;

	seq_printf(m, "device=%s abi=%u.%u generation=%llu slots=%u cpus=%u features=0x%llx offered=0x%llx doorbell=%s\n",
		   pci_name(r->pdev), PVSCHED_ABI_MAJOR, PVSCHED_ABI_MINOR,
		   r->generation, r->slot_count, num_possible_cpus(),
		   r->features, r->host_features,
		   r->regs ? "registers" : "none");
	seq_puts(m, "tracepoints=");
	for (i = 0; (name = pvsched_tracepoint_name(i, &on)); i++)
		if (on)
			seq_printf(m, "%s%s", i ? "," : "", name);
	seq_putc(m, '\n');
	/* Each one patched kernel text: a rebind should cost none. */
	seq_printf(m, "probe_changes=%llu\n", r->probe_changes);
	/* PVSCHED_F_LOCK_HOLD: the lock calls ftrace hooks, and tasks saved. */
	seq_puts(m, "lock_calls=");
	for (i = 0, first = true; (name = pvsched_lockhold_function(i, &on)); i++) {
		if (!on)
			continue;
		seq_printf(m, "%s%s", first ? "" : ",", name);
		first = false;
	}
	seq_printf(m, "\nholder_preempted_by=%s lock_hold=%s held_saved=%u held_save_failures=%llu\n",
		   pvsched_holder_preempted_source(),
		   r->features & PVSCHED_F_LOCK_HOLD ? "on" : "off",
		   pvsched_lockhold_saved(),
		   pvsched_lockhold_save_failures());

	for_each_possible_cpu(cpu) {
		struct pvsched_guest_half g;
		const struct pvsched_slot *s;
		struct pvsched_cpu *pc;

		if (cpu >= r->slot_count) {
			seq_printf(m, "cpu%u slot=none\n", cpu);
			continue;
		}
		s = pvsched_slot(cpu);
		seq_printf(m, "cpu%u", cpu);
		if (pvsched_read_guest(s, &g))
			seq_printf(m, " flags=0x%x cs=0x%x policy=%u prio=%u nice=%d switches=%llu hardirqs=%llu softirqs=%llu nmis=%llu boost_reqs=%llu lock_holder=0x%x lock_flags=0x%x",
				   g.flags, g.cs_flags, g.policy, g.rt_priority,
				   g.nice, g.switch_count, g.hardirq_count,
				   g.softirq_count, g.nmi_count,
				   g.boost_req_count, g.lock_holder,
				   g.lock_flags);
		else
			seq_puts(m, " guest=inconsistent");
		pc = per_cpu_ptr(&pvsched_cpu, cpu);
		seq_printf(m, " pending=0x%llx hints_raised=%llu hints_cleared=%llu doorbell_rings=%llu",
			   (unsigned long long)READ_ONCE(s->guest.guest_pending),
			   READ_ONCE(pc->hints_raised),
			   READ_ONCE(pc->hints_cleared),
			   READ_ONCE(pc->doorbell_rings));
		seq_printf(m, " lock_contended=%llu lock_preempted=%llu lock_named_contended=%llu lock_named_preempted=%llu lock_spins_stopped=%llu lock_requests=%llu lock_doorbell_rings=%llu",
			   READ_ONCE(pc->lock_contended_count),
			   READ_ONCE(pc->lock_preempted_count),
			   READ_ONCE(pc->lock_named_contended_count),
			   READ_ONCE(pc->lock_named_preempted_count),
			   READ_ONCE(pc->lock_spins_stopped),
			   READ_ONCE(pc->lock_requests),
			   READ_ONCE(pc->lock_doorbell_rings));
		seq_printf(m, " held=%u held_takes=%llu held_releases=%llu held_unmatched=%llu held_dropped=%llu held_user_resets=%llu held_uncontended=%llu host_contends=%u held_yields=%llu",
			   READ_ONCE(pc->held_count),
			   READ_ONCE(pc->held_takes),
			   READ_ONCE(pc->held_releases),
			   READ_ONCE(pc->held_unmatched),
			   READ_ONCE(pc->held_dropped),
			   READ_ONCE(pc->held_user_resets),
			   READ_ONCE(pc->held_uncontended),
			   READ_ONCE(pc->hold_contended),
			   READ_ONCE(pc->held_yields));
		pvsched_show_host(m, s);
		seq_putc(m, '\n');
	}
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(pvsched_status);

static struct dentry *pvsched_debugfs_dir;

void pvsched_debugfs_create(void)
{
	pvsched_debugfs_dir = debugfs_create_dir(KBUILD_MODNAME, NULL);
	debugfs_create_file("status", 0444, pvsched_debugfs_dir, NULL,
			    &pvsched_status_fops);
}

void pvsched_debugfs_remove(void)
{
	debugfs_remove_recursive(pvsched_debugfs_dir);
	pvsched_debugfs_dir = NULL;
}
