// SPDX-License-Identifier: GPL-2.0
/*
 * pvsched: cooperative vCPU scheduling, guest side.
 *
 * Binds to an ivshmem-plain device (1af4:1110) whose BAR2 holds a pvsched
 * region (abi/pvsched_abi.h), tells the host through it what each vCPU runs
 * (task policy and priority, interrupt activity, explicit boost requests)
 * and shows what the host did about it in debugfs.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cpuhotplug.h>
#include <linux/io.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/workqueue.h>

#include "pvsched_drv.h"

#define PVSCHED_BAR			2
/* ivshmem's registers (Doorbell at PVSCHED_IVSHMEM_DOORBELL_REG). */
#define PVSCHED_REGS_BAR		0
#define PVSCHED_PCI_DEVICE_IVSHMEM		0x1110

static ulong features = PVSCHED_SUPPORTED_FEATURES;
module_param(features, ulong, 0444);
MODULE_PARM_DESC(features,
		 "PVSCHED_F_* bits the module may accept (default 0xff on x86-64: all it supports)");
/* The text above says what the default is. */
#if defined(CONFIG_X86_64) && defined(CONFIG_DYNAMIC_FTRACE_WITH_ARGS)
static_assert(PVSCHED_SUPPORTED_FEATURES == 0xff);
#endif

struct pvsched_region pvsched_region;

/* Serializes bind and unbind. */
static DEFINE_MUTEX(pvsched_mutex);

/*
 * Check the host line of the header. On a bad region print ONE line saying
 * why and return -ENODEV (the driver core adds nothing for it); nothing has
 * been written then.
 */
static int pvsched_validate(struct pci_dev *pdev,
			    const struct pvsched_header *h, u64 bar_len)
{
	u64 need;

	if (h->magic != PVSCHED_MAGIC) {
		dev_err(&pdev->dev,
			"refusing region: bad magic 0x%016llx (expected 0x%016llx)\n",
			(unsigned long long)h->magic, PVSCHED_MAGIC);
		return -ENODEV;
	}
	if (h->abi_major != PVSCHED_ABI_MAJOR) {
		dev_err(&pdev->dev,
			"refusing region: unsupported ABI major %u (supported %u)\n",
			h->abi_major, PVSCHED_ABI_MAJOR);
		return -ENODEV;
	}
	need = h->header_size + (u64)h->slot_count * h->slot_size;
	if (h->header_size < PVSCHED_HEADER_SIZE ||
	    h->slot_size < PVSCHED_SLOT_SIZE ||
	    h->header_size % PVSCHED_CACHELINE ||
	    h->slot_size % PVSCHED_CACHELINE ||
	    !h->slot_count || h->slot_count > PVSCHED_MAX_SLOTS ||
	    need > bar_len) {
		dev_err(&pdev->dev,
			"refusing region: bad geometry: header_size %u slot_size %u slot_count %u in a %llu-byte BAR2\n",
			h->header_size, h->slot_size, h->slot_count, bar_len);
		return -ENODEV;
	}
	return 0;
}

/*
 * Clear the guest half of a slot no CPU serves now (left over from an earlier
 * binding, or a CPU gone offline). Only called while no CPU is active.
 */
static void pvsched_clear_slot(struct pvsched_slot *s)
{
	struct pvsched_guest_half *g = &s->guest;
	u32 seq = READ_ONCE(g->seq);

	if (READ_ONCE(g->guest_pending))
		WRITE_ONCE(g->guest_pending, 0);
	if (!(seq & 1) && !READ_ONCE(g->flags) && !READ_ONCE(g->cs_flags) &&
	    !READ_ONCE(g->lock_holder) && !READ_ONCE(g->lock_flags))
		return;
	seq |= 1;
	WRITE_ONCE(g->seq, seq);
	smp_wmb();	/* odd seq before the fields */
	WRITE_ONCE(g->flags, 0);
	WRITE_ONCE(g->cs_flags, 0);
	WRITE_ONCE(g->lock_holder, PVSCHED_LOCK_NONE);
	WRITE_ONCE(g->lock_flags, 0);
	smp_wmb();	/* fields before the even seq */
	WRITE_ONCE(g->seq, seq + 1);
}

static void pvsched_clear_slots(void)
{
	u32 i;

	for (i = 0; i < pvsched_region.slot_count; i++)
		pvsched_clear_slot(pvsched_slot(i));
}

static void pvsched_write_guest_line(u64 feat, u64 generation, u32 nr_cpus)
{
	struct pvsched_header *h = pvsched_header();
	unsigned int i;

	if (!generation) {
		/* Unbind: the host sees "no guest" first. */
		WRITE_ONCE(h->guest_generation, 0);
		smp_wmb();	/* unbound before the rest changes */
	}
	WRITE_ONCE(h->guest_features, feat);
	WRITE_ONCE(h->guest_abi_minor, PVSCHED_ABI_MINOR);
	WRITE_ONCE(h->guest_nr_cpus, nr_cpus);
	for (i = 0; i < ARRAY_SIZE(h->guest_reserved); i++)
		WRITE_ONCE(h->guest_reserved[i], 0);
	if (generation) {
		smp_wmb();	/* features and slots before "bound" */
		WRITE_ONCE(h->guest_generation, generation);
	}
}

/*
 * The idle driver again, in the mode the "idle" parameter says now (written
 * at run time through sysfs): no tracepoint is touched, only the cpuidle
 * driver is unregistered and registered.
 */
void pvsched_idle_restart(void)
{
	struct pvsched_region *r = &pvsched_region;

	mutex_lock(&pvsched_mutex);
	if (r->bound) {
		pvsched_idle_stop();
		pvsched_idle_start(r->pdev);
	}
	mutex_unlock(&pvsched_mutex);
}

/*
 * Everything bind set up, in reverse; leaves every slot inactive. With
 * @keep_probes (a rebind to a new generation follows) the tracepoint probes
 * stay registered, idle on inactive slots, so that a rebind patches no kernel
 * text unless the probe set changes (pvsched_probes_update()).
 */
static void pvsched_unbind(bool keep_probes)
{
	struct pvsched_region *r = &pvsched_region;
	unsigned int cpu;

	/* No other module may read the region once this returns. */
	pvsched_hints_stop();
	/* No CPU may be in the idle driver reading slots once this returns. */
	pvsched_idle_stop();
	pvsched_debugfs_remove();
	pvsched_misc_deregister();
	/* Each online CPU marks its own slot inactive. */
	if (r->cpuhp_state > 0)
		cpuhp_remove_state(r->cpuhp_state);
	r->cpuhp_state = 0;
	if (keep_probes)
		pvsched_probes_quiesce();
	else
		pvsched_probes_unregister();
	/* No probe touches a slot now: tidy offline CPUs' and pending hints. */
	pvsched_clear_slots();
	pvsched_write_guest_line(0, 0, num_possible_cpus());
	WRITE_ONCE(r->features, 0);
	for_each_possible_cpu(cpu)
		per_cpu_ptr(&pvsched_cpu, cpu)->slot = NULL;
}

static int pvsched_bind(struct pci_dev *pdev, const struct pvsched_header *h)
{
	struct pvsched_region *r = &pvsched_region;
	unsigned int cpu, nr_cpus = num_possible_cpus();
	int ret;

	r->header_size = h->header_size;
	r->slot_size = h->slot_size;
	r->slot_count = h->slot_count;
	r->generation = h->generation;
	r->host_features = h->host_features;
	r->features = h->host_features & PVSCHED_SUPPORTED_FEATURES & features;
	/* Ringing needs the device's registers (ivshmem-doorbell has them). */
	if (!r->regs)
		r->features &= ~PVSCHED_F_DOORBELL;
	r->doorbell = h->doorbell;

	for_each_possible_cpu(cpu) {
		struct pvsched_cpu *pc = per_cpu_ptr(&pvsched_cpu, cpu);

		memset(pc, 0, sizeof(*pc));
		if (cpu < r->slot_count)
			pc->slot = pvsched_slot(cpu);
	}
	if (nr_cpu_ids > r->slot_count)
		dev_warn(&pdev->dev,
			 "region has %u slots for %u CPUs: CPUs %u and above are not served\n",
			 r->slot_count, nr_cpu_ids, r->slot_count);

	pvsched_clear_slots();

	ret = pvsched_probes_update(r->features);
	if (ret)
		goto fail;
	/* After sched_switch's probe: a task switched out is followed. */
	if (pvsched_lockhold_update(r->features)) {
		dev_warn(&pdev->dev,
			 "cannot hook the lock calls: no lock holder published\n");
		r->features &= ~PVSCHED_F_LOCK_HOLD;
	}
	/* The yield at a lock-free point is a KVM hypercall, after a hooked take. */
	if (!(r->features & PVSCHED_F_LOCK_HOLD) || !pvsched_on_kvm())
		r->features &= ~PVSCHED_F_EXT_NOTICE;
	ret = cpuhp_setup_state(CPUHP_AP_ONLINE_DYN, "pvsched:online",
				pvsched_cpu_online, pvsched_cpu_offline);
	if (ret < 0)
		goto fail;
	r->cpuhp_state = ret;

	if (r->features & PVSCHED_F_BOOST_REQUEST) {
		ret = pvsched_misc_register();
		if (ret) {
			dev_warn(&pdev->dev,
				 "cannot register /dev/pvsched (%d): no boost requests\n",
				 ret);
			WRITE_ONCE(r->features,
				   r->features & ~PVSCHED_F_BOOST_REQUEST);
		}
	}
	pvsched_debugfs_create();

	pvsched_write_guest_line(r->features, r->generation, nr_cpus);
	pvsched_hints_start();
	dev_info(&pdev->dev,
		 "bound: ABI %u.%u, generation %llu, %u slots for %u CPUs, features 0x%llx of 0x%llx offered\n",
		 PVSCHED_ABI_MAJOR, h->abi_minor, r->generation, r->slot_count,
		 nr_cpus, r->features, r->host_features);
	pvsched_idle_start(pdev);
	return 0;

fail:
	pvsched_unbind(false);
	return ret;
}

/* Maps the slots of a validated header and binds to them. */
static int pvsched_map_and_bind(struct pci_dev *pdev,
				const struct pvsched_header *h)
{
	struct pvsched_region *r = &pvsched_region;
	int ret;

	r->map_len = h->header_size + (u64)h->slot_count * h->slot_size;
	r->base = memremap(r->bar_start, r->map_len, MEMREMAP_WB);
	if (!r->base)
		return -ENOMEM;
	ret = pvsched_bind(pdev, h);
	if (ret) {
		memunmap(r->base);
		r->base = NULL;
		return ret;
	}
	r->bound = true;
	return 0;
}

static void pvsched_unbind_and_unmap(bool keep_probes)
{
	struct pvsched_region *r = &pvsched_region;

	if (!r->bound)
		return;
	pvsched_unbind(keep_probes);
	memunmap(r->base);
	r->base = NULL;
	r->bound = false;
}

/*
 * The host may reinitialize the region while the guest is bound (pvschedd
 * restarted): a new generation, slots and guest line zeroed. Look once a
 * second and bind again to the new generation. A header caught in the middle
 * of a reinitialization (magic not yet written back) is left for the next look.
 */
static void pvsched_watch_fn(struct work_struct *work);
static DECLARE_DELAYED_WORK(pvsched_watch, pvsched_watch_fn);

static void pvsched_watch_fn(struct work_struct *work)
{
	struct pvsched_region *r = &pvsched_region;
	struct pvsched_header *hdr;
	struct pvsched_header h;

	mutex_lock(&pvsched_mutex);
	if (!r->bound)
		goto out;
	hdr = pvsched_header();
	memcpy(&h, hdr, sizeof(h));
	if (h.magic != PVSCHED_MAGIC)
		goto again;
	if (h.generation != r->generation) {
		dev_info(&r->pdev->dev,
			 "host reinitialized the region (generation %llu -> %llu): binding again\n",
			 r->generation, h.generation);
		pvsched_unbind_and_unmap(true);
		if (pvsched_validate(r->pdev, &h, r->bar_len) ||
		    pvsched_map_and_bind(r->pdev, &h)) {
			/* Stays unbound until reloaded, with no probe left. */
			pvsched_probes_unregister();
			goto out;
		}
	} else if (READ_ONCE(hdr->guest_generation) != r->generation) {
		/* Someone cleared our line: say again that we are here. */
		pvsched_write_guest_line(r->features, r->generation,
					 num_possible_cpus());
	}
again:
	schedule_delayed_work(&pvsched_watch, HZ);
out:
	mutex_unlock(&pvsched_mutex);
}

/*
 * Map the register BAR for the doorbell, if the device has one we can have;
 * without it the module works as before, on the host's timer.
 */
static void pvsched_map_regs(struct pci_dev *pdev)
{
	struct pvsched_region *r = &pvsched_region;

	r->regs = NULL;
	if (!(pci_resource_flags(pdev, PVSCHED_REGS_BAR) & IORESOURCE_MEM) ||
	    pci_resource_len(pdev, PVSCHED_REGS_BAR) <
	    PVSCHED_IVSHMEM_DOORBELL_REG + sizeof(u32))
		return;
	if (pci_request_region(pdev, PVSCHED_REGS_BAR, KBUILD_MODNAME))
		return;
	r->regs = pci_iomap(pdev, PVSCHED_REGS_BAR,
			    PVSCHED_IVSHMEM_DOORBELL_REG + sizeof(u32));
	if (!r->regs)
		pci_release_region(pdev, PVSCHED_REGS_BAR);
}

/* After unbinding: no probe can ring any more. */
static void pvsched_unmap_regs(struct pci_dev *pdev)
{
	struct pvsched_region *r = &pvsched_region;

	if (!r->regs)
		return;
	pci_iounmap(pdev, r->regs);
	pci_release_region(pdev, PVSCHED_REGS_BAR);
	r->regs = NULL;
}

static int pvsched_pci_probe(struct pci_dev *pdev,
			     const struct pci_device_id *id)
{
	struct pvsched_region *r = &pvsched_region;
	struct pvsched_header h;
	void *base;
	int ret;

	mutex_lock(&pvsched_mutex);
	if (r->pdev) {
		dev_err(&pdev->dev,
			"refusing region: %s is already bound\n",
			pci_name(r->pdev));
		ret = -ENODEV;
		goto out_unlock;
	}

	ret = pci_enable_device_mem(pdev);
	if (ret)
		goto out_unlock;
	if (!(pci_resource_flags(pdev, PVSCHED_BAR) & IORESOURCE_MEM) ||
	    pci_resource_len(pdev, PVSCHED_BAR) < PVSCHED_HEADER_SIZE) {
		dev_err(&pdev->dev,
			"refusing region: BAR2 of %llu bytes cannot hold a header\n",
			(unsigned long long)pci_resource_len(pdev, PVSCHED_BAR));
		ret = -ENODEV;
		goto out_disable;
	}
	ret = pci_request_region(pdev, PVSCHED_BAR, KBUILD_MODNAME);
	if (ret)
		goto out_disable;
	r->bar_start = pci_resource_start(pdev, PVSCHED_BAR);
	r->bar_len = pci_resource_len(pdev, PVSCHED_BAR);

	/* Look at the header only: other ivshmem users may have a big BAR. */
	base = memremap(r->bar_start, PVSCHED_HEADER_SIZE, MEMREMAP_WB);
	if (!base) {
		ret = -ENOMEM;
		goto out_release;
	}
	/* One copy: bind to what was checked, whatever the host does now. */
	memcpy(&h, base, sizeof(h));
	memunmap(base);
	ret = pvsched_validate(pdev, &h, r->bar_len);
	if (ret)
		goto out_release;

	r->pdev = pdev;
	pvsched_map_regs(pdev);
	ret = pvsched_map_and_bind(pdev, &h);
	if (ret) {
		pvsched_unmap_regs(pdev);
		r->pdev = NULL;
		goto out_release;
	}
	schedule_delayed_work(&pvsched_watch, HZ);
	mutex_unlock(&pvsched_mutex);
	return 0;

out_release:
	pci_release_region(pdev, PVSCHED_BAR);
out_disable:
	pci_disable_device(pdev);
out_unlock:
	mutex_unlock(&pvsched_mutex);
	return ret;
}

static void pvsched_pci_remove(struct pci_dev *pdev)
{
	struct pvsched_region *r = &pvsched_region;

	if (r->pdev != pdev)
		return;
	cancel_delayed_work_sync(&pvsched_watch);
	mutex_lock(&pvsched_mutex);
	pvsched_unbind_and_unmap(false);
	/* Also after a failed rebind, which leaves the region unbound. */
	pvsched_probes_unregister();
	pvsched_lockhold_release();
	pvsched_unmap_regs(pdev);
	r->pdev = NULL;
	pci_release_region(pdev, PVSCHED_BAR);
	pci_disable_device(pdev);
	dev_info(&pdev->dev, "unbound: all slots inactive\n");
	mutex_unlock(&pvsched_mutex);
}

static const struct pci_device_id pvsched_pci_ids[] = {
	{ PCI_DEVICE(PCI_VENDOR_ID_REDHAT_QUMRANET, PVSCHED_PCI_DEVICE_IVSHMEM) },
	{ }
};
MODULE_DEVICE_TABLE(pci, pvsched_pci_ids);

static struct pci_driver pvsched_pci_driver = {
	.name		= KBUILD_MODNAME,
	.id_table	= pvsched_pci_ids,
	.probe		= pvsched_pci_probe,
	.remove		= pvsched_pci_remove,
	/* Reboot, kexec, power off: the host must not act on stale slots. */
	.shutdown	= pvsched_pci_remove,
};
module_pci_driver(pvsched_pci_driver);

MODULE_DESCRIPTION("pvsched: cooperative vCPU scheduling, guest side");
MODULE_AUTHOR("pvsched developers");
MODULE_LICENSE("GPL");
