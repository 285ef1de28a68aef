/* SPDX-License-Identifier: GPL-2.0 */
/*
 * pvsched: what the host says about the vCPUs, for other guest modules
 * (EXPORT_SYMBOL_GPL; kerneldoc in pvsched_locks.c). Both answer false while
 * pvsched is not bound to a region, or the host does not write host halves.
 */
#ifndef PVSCHED_HINTS_H
#define PVSCHED_HINTS_H

#include <linux/types.h>

bool pvsched_vcpu_preempted(int cpu);
bool pvsched_host_overloaded(void);

#endif /* PVSCHED_HINTS_H */
