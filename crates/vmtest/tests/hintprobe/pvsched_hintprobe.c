// SPDX-License-Identifier: GPL-2.0
/*
 * pvsched_hintprobe: another guest module using pvsched's exported hints, for
 * the guest module's tests. At load it prints, on the CPU insmod runs on:
 *   pvsched_hintprobe: cpu=<n> preempted=<cpu0>,<cpu1>,<cpu2>,<cpu -1> overloaded=<0|1>
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/smp.h>

#include "pvsched_hints.h"

static int __init pvsched_hintprobe_init(void)
{
	int cpu = get_cpu();

	pr_info("cpu=%d preempted=%d,%d,%d,%d overloaded=%d\n", cpu,
		pvsched_vcpu_preempted(0), pvsched_vcpu_preempted(1),
		pvsched_vcpu_preempted(2), pvsched_vcpu_preempted(-1),
		pvsched_host_overloaded());
	put_cpu();
	return 0;
}
module_init(pvsched_hintprobe_init);

static void __exit pvsched_hintprobe_exit(void)
{
}
module_exit(pvsched_hintprobe_exit);

MODULE_DESCRIPTION("pvsched test: a consumer of the exported host hints");
MODULE_LICENSE("GPL");
