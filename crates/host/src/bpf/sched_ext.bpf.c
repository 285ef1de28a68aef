// SPDX-License-Identifier: GPL-2.0
/*
 * pvsched's sched_ext scheduler: the host's fair class, aware of vCPUs.
 *
 * Every task of the fair class (SCHED_NORMAL/BATCH/IDLE; the RT and
 * deadline classes stay above it) is scheduled here by weighted virtual
 * time, as the sched-ext project's scx_simple does: a task charged for the
 * time it ran over its weight, a sleeper credited at most one slice, a woken
 * task preempting a running one whose vtime is ahead of its own by more than
 * wakeup_preempt_ns. Each CPU has its own queue ordered by vtime, and takes
 * from another CPU's only when that one's oldest task is more than a slice
 * of vtime behind its own (or it has none): fair within a slice, and a task
 * stays on its CPU (one shared queue moved each task to whichever CPU came
 * next, so a process's threads ran on every CPU at once and each of its
 * unmaps sent TLB shootdowns to them all). On top of that,
 * two mechanisms the daemon's policy drives through `scx_grants`
 * (docs/DESIGN.md, "The sched_ext backend"):
 *
 *  - a boosted vCPU thread (grant.boost > 0) goes ahead of every unboosted
 *    task: on its CPU at once, preempting a weaker task, or on the shared
 *    boost queue that every CPU takes from first;
 *  - within the policy's budget (grant.kboost, the record's
 *    kboost_allowed_ns), the program boosts a vCPU itself at an enqueue
 *    when the slot, read when the vCPU last stopped, showed guest RT work,
 *    when it wakes from a halt shortly after such work
 *    (grant.halt_window_ns), and as the policy allows (grant.kflags) when
 *    it was preempted in a critical section or wakes onto a busy CPU: the
 *    decision is taken at the enqueue, with no round trip through the
 *    daemon; a long burst of such boosts is demoted to priority 1, and a
 *    longer one throttled, by the policy's own rules
 *    (grant.demote_after_ns, max_boost_ns, throttle_ns);
 *  - at a slice end, a vCPU whose guest is in a critical section (the
 *    slot's cs_flags, read here while the vCPU thread is the current task;
 *    CS_LOCK, a sleeping lock held, only with lock holders honoured),
 *    or that another vCPU of its VM waits on (a lock wait its guest
 *    published naming this vCPU as the holder, grant.lock_peers), keeps
 *    its CPU for one extension of extension_ns, within the total the
 *    daemon allows it (the record's ext_allowed_ns). Its vtime is charged
 *    for it like for any time it ran, so the fair queue takes it back
 *    later. A timer reads its slot again while it runs and ends it at a
 *    lock-free point; one that runs out with a lock still held goes on
 *    for a short tail, read finer, to find one (extension_tail_ns). Where
 *    its guest accepts PVSCHED_F_EXT_NOTICE, the slot shows the extension
 *    (written at each entry to the guest) and the guest ends it itself:
 *    it yields at its next point out of its locks, and the yield's
 *    hypercall kicks it off the CPU there (pvs_guest_yield);
 *  - at a boosted enqueue that would preempt a vCPU whose guest shows a
 *    sleeping lock held (CS_LOCK, as of its last tick, or read at once when
 *    the enqueue runs on its own thread: its guest woke the task, often by
 *    releasing one of the locks it holds), the holder runs one extension
 *    first, from the same allowance, and the boosted task runs next there.
 *
 * The policy (budgets, throttles, demotion, fairness debt) stays in the
 * daemon: this program only acts within what a grant says.
 */
/* Always the minimal header: scx_min.h declares the kernel structs. */
#include "vmlinux_min.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "scx_min.h"
#include "intf.h"
#include "pvsched_abi.h"

char LICENSE[] SEC("license") = "GPL";

#define BPF_STRUCT_OPS(name, args...) SEC("struct_ops/" #name) BPF_PROG(name, ##args)
#define BPF_STRUCT_OPS_SLEEPABLE(name, args...) \
	SEC("struct_ops.s/" #name) BPF_PROG(name, ##args)

/*
 * Tunables, set by the loader before load (SchedExtOptions in
 * backend/sched_ext.rs, from the daemon config's [sched_ext] keys).
 */

/* The time slice every task gets, ns. */
const volatile u64 slice_ns = 5000000;
/* The extension a vCPU in a critical section gets at a slice end, ns (one
 * per slice); 0: none. */
const volatile u64 extension_ns = 4000000;
/* A woken unboosted task whose vtime is this much (ns at nice 0) below that
 * of the unboosted task running on its CPU preempts it; 0: never. */
const volatile u64 wakeup_preempt_ns = 0;
/* The PVSCHED_CS_* flags that earn an extension. */
const volatile u32 extension_cs = PVSCHED_CS_ALL;
/*
 * While a vCPU runs an extension, its slot is read again every this many
 * ns (a timer on its CPU), and the extension ends at the first read that
 * finds its guest out of what earned it: the vCPU is preempted at a
 * lock-free point, as eCS's guest yields at the end of its critical
 * section, instead of at the extension's end inside the next one; and it
 * is charged for what it ran. 0: no poll, every extension runs its length.
 */
const volatile u64 extension_poll_ns = 250000;
/*
 * A vCPU whose guest still shows a sleeping lock held (CS_LOCK) when its
 * extension runs out goes on for at most this much more, its slot read
 * every extension_tail_poll_ns, and is preempted at the first read that
 * finds it out of its locks, or at the tail's end: a holder taking lock
 * after lock is rarely out of them at a 250 µs poll, and is out for tens
 * of µs between two. Within the same allowance; needs the poll. 0: none.
 */
const volatile u64 extension_tail_ns = 1000000;
const volatile u64 extension_tail_poll_ns = 50000;
/*
 * pvschedd's event thread (0: none). It runs in this class, not in the RT
 * one: dispatched at once on its CPU, ahead of every boost it grants and
 * preempting them (a boosted vCPU never delays its own unboost), as its
 * SCHED_FIFO does on the rt backend. As an RT thread below the host's own
 * RT work it was pushed to the other CPU at every preemption by that work,
 * an IPI each (46 a second beside a 1 ms RR cyclictest in the host VM).
 */
const volatile u32 daemon_tid = 0;
/*
 * 1: a vCPU thread that wakes while another vCPU of its VM (its process)
 * runs on the CPU it would queue on goes to a CPU that runs none of them,
 * where it may run. Two vCPUs of a VM on one CPU take turns, and a lock
 * holder among them waits off its CPU while its waiter runs; this program
 * keeps a task on its CPU, so such a pairing lasted (BENCHMARKS.md, LH15).
 * 0 by default: LH16 showed no gain beyond the spread of its repeats.
 */
const volatile u32 spread_vm_vcpus = 0;

/* The boost of the CPU running the daemon's event thread: above any the
 * policy grants (RT priorities 1..99). */
#define DAEMON_BOOST 100

/* Read by the daemon through the skeleton. */
struct pvs_scx_totals totals;
struct pvs_scx_exit exit_info;

/* The highest vtime of a task that started running: a woken sleeper is
 * placed no further back than one slice behind it. */
static u64 vtime_now;

/* Thread id -> grant. Written by the daemon. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct pvs_scx_grant);
} scx_grants SEC(".maps");

/* What this program did for each vCPU thread, at its grant's record: the
 * daemon zeroes a record before it hands it out and reads the records
 * through a mapping of the array. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct pvs_scx_vcpu);
} scx_vcpus SEC(".maps");

/* Every task: its run time when it last started running, so that a
 * stop charges the time it ran since (a slice resumed after an RT
 * preemption, or refilled by the kernel while the task ran alone, is not
 * what it ran). */
struct pvs_task_run {
	u64 exec_at_run;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct pvs_task_run);
} task_run SEC(".maps");

/* Per CPU: the boost of the task running there, 0 for none. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024); /* possible CPUs, set by the loader */
	__type(key, u32);
	__type(value, u32);
} cpu_boost SEC(".maps");

/* Per CPU: the fair-class task running there, for wakeup preemption. */
struct pvs_cpu_run {
	u64 vtime;	/* its vtime when it started running */
	u64 start;	/* when it started */
	u32 weight;
	u32 running;	/* 0: none (idle, or a higher class runs) */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024); /* possible CPUs, set by the loader */
	__type(key, u32);
	__type(value, struct pvs_cpu_run);
} cpu_run SEC(".maps");

/*
 * Per CPU: the vCPU thread of a VM whose lock holders are honoured running
 * there, and whether its guest showed a sleeping lock held (CS_LOCK) when
 * its slot was last read: at each of its ticks, or at an enqueue that runs
 * on its own thread. What a boosted enqueue asks before it preempts it.
 */
struct pvs_cpu_holder {
	u32 tid;	/* 0: no such vCPU runs there */
	u32 lock;
	u32 vm;		/* the process (VMM) of the vCPU running there; 0: none */
	u32 cut;	/* what this program did to take the CPU from it (enum pvs_scx_cut) */
	u32 pad;
	/* Its slice left when this program took the CPU from it for a grant
	 * or for the daemon's event thread (preempt_checked_there, pvs_enqueue). */
	u64 slice_left;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024); /* possible CPUs, set by the loader */
	__type(key, u32);
	__type(value, struct pvs_cpu_holder);
} cpu_holder SEC(".maps");

/*
 * Per CPU: the poll of the extension running there (extension_poll_ns):
 * its timer, pinned to the CPU, and the vCPU thread it is for (0: none;
 * cleared when that thread stops, so a timer that fires after it finds
 * nothing to do).
 */
struct pvs_ext_poll {
	struct bpf_timer timer;
	u32 tid;
	u32 pad;
	u64 tail_until;	/* the tail running here ends then */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024); /* possible CPUs, set by the loader */
	__type(key, u32);
	__type(value, struct pvs_ext_poll);
} ext_poll SEC(".maps");

/* Possible CPUs (cpu_boost's size), set by the loader. */
const volatile u32 nr_cpu_ids = 1;

/* The CPUs this program has a fair queue for (the maps' bound). */
#define PVS_MAX_CPUS 1024

/* CPU cpu's own fair queue. */
static __always_inline u64 fair_dsq(u32 cpu)
{
	return PVS_SCX_DSQ_FAIR + cpu;
}

/* The vtime of the task first in CPU cpu's fair queue; false if it is empty. */
static __always_inline bool fair_head(u32 cpu, u64 *vtime)
{
	struct bpf_iter_scx_dsq it;
	struct task_struct *p;
	bool found = false;

	if (!bpf_iter_scx_dsq_new(&it, fair_dsq(cpu), 0)) {
		p = bpf_iter_scx_dsq_next(&it);
		if (p) {
			*vtime = p->scx.dsq_vtime;
			found = true;
		}
	}
	bpf_iter_scx_dsq_destroy(&it);
	return found;
}

static __always_inline bool vtime_before(u64 a, u64 b)
{
	return (s64)(a - b) < 0;
}

static __always_inline struct pvs_scx_grant *grant_of(struct task_struct *p)
{
	u32 tid = p->pid;

	return bpf_map_lookup_elem(&scx_grants, &tid);
}

static __always_inline struct pvs_scx_vcpu *vcpu_of(struct task_struct *p)
{
	struct pvs_scx_grant *g = grant_of(p);

	return g ? bpf_map_lookup_elem(&scx_vcpus, &g->record) : NULL;
}

/* An allowance of a record, which the daemon stores through its mapping
 * while this program runs: loaded once, as the daemon stored it. */
static __always_inline u64 allowance(const u64 *field)
{
	return *(const volatile u64 *)field;
}

static __always_inline u32 boost_on(s32 cpu)
{
	u32 key = cpu;
	u32 *b = bpf_map_lookup_elem(&cpu_boost, &key);

	return b ? *b : 0;
}

static __always_inline void set_boost_on(s32 cpu, u32 boost)
{
	u32 key = cpu;
	u32 *b = bpf_map_lookup_elem(&cpu_boost, &key);

	if (b)
		*b = boost;
}

static __always_inline struct pvs_cpu_run *cpu_run_of(s32 cpu)
{
	u32 key = cpu;

	return bpf_map_lookup_elem(&cpu_run, &key);
}

static __always_inline struct pvs_cpu_holder *cpu_holder_of(s32 cpu)
{
	u32 key = cpu;

	return bpf_map_lookup_elem(&cpu_holder, &key);
}

/* This program is taking CPU cpu from the task running there, for `cut`
 * (enum pvs_scx_cut): noted for the count of holders preempted. */
static __always_inline void note_cut(s32 cpu, u32 cut)
{
	struct pvs_cpu_holder *h = cpu_holder_of(cpu);

	if (h)
		h->cut = cut;
}

/*
 * A woken task placed in the vtime queue: if the unboosted task running on
 * its CPU is ahead of it by more than wakeup_preempt_ns of vtime (its own
 * as of now, the time it ran so far included), that CPU picks again, as the
 * fair class's wakeup preemption does; without it a waking sleeper waited
 * for the running task's whole slice.
 */
static __always_inline void preempt_on_wakeup(struct task_struct *p, u64 vtime)
{
	s32 cpu = scx_bpf_task_cpu(p);
	struct pvs_cpu_run *c = cpu_run_of(cpu);
	u64 now = bpf_ktime_get_ns(), curr;

	if (!wakeup_preempt_ns || !c || !c->running || boost_on(cpu))
		return;
	curr = c->vtime;
	if (now > c->start)
		curr += (now - c->start) * 100 / (c->weight ? c->weight : 100);
	if (vtime_before(vtime + wakeup_preempt_ns, curr)) {
		note_cut(cpu, PVS_SCX_CUT_WAKEUP);
		scx_bpf_kick_cpu(cpu, SCX_KICK_PREEMPT);
		__sync_fetch_and_add(&totals.wakeup_preempts, 1);
	}
}

/* A vCPU thread is queued now, boosted or not: its delay to running is
 * measured from here (the first mark counts until it runs). */
static __always_inline void mark_queued(struct task_struct *p, bool boosted)
{
	struct pvs_scx_vcpu *v = vcpu_of(p);

	if (v && !v->queued_at) {
		v->queued_at = bpf_ktime_get_ns();
		v->queued_boosted = boosted;
	}
}

/* floor(log2(ns)), 0 for 0 and 1, capped at the last bucket. */
static __always_inline u32 log2_bucket(u64 ns)
{
	u32 b = 0;

	if (ns >> 32) { b += 32; ns >>= 32; }
	if (ns >> 16) { b += 16; ns >>= 16; }
	if (ns >> 8) { b += 8; ns >>= 8; }
	if (ns >> 4) { b += 4; ns >>= 4; }
	if (ns >> 2) { b += 2; ns >>= 2; }
	if (ns >> 1) b += 1;
	return b < PVS_SCX_LAT_BUCKETS ? b : PVS_SCX_LAT_BUCKETS - 1;
}

/* The slot's cs_flags, read while its vCPU thread is the current task;
 * false when the read faulted. */
static __always_inline bool slot_cs_flags(struct pvs_scx_grant *g, u32 *cs)
{
	return !bpf_probe_read_user(cs, sizeof(*cs),
				    (void *)(g->slot_addr +
					     PVSCHED_OFFSETOF(struct pvsched_slot,
							      guest.cs_flags)));
}

/* A lock held that earns an extension (CS_LOCK, with lock holders honoured). */
static __always_inline bool cs_lock_held(struct pvs_scx_grant *g, u32 cs)
{
	return g->lock_peers && (cs & extension_cs & PVSCHED_CS_LOCK);
}

/*
 * Whether another vCPU of the current vCPU's VM publishes a lock wait
 * naming it as the holder (a mutex or a write-held rwsem: the guest names
 * the holder; a spinning wait's holder is unknown and not counted). The
 * other slots are in the same mapping, read while this vCPU's thread is the
 * current task; a slot that faults is skipped. A wait read torn (the guest
 * was writing) can only cost an extension the allowance bounds.
 */
static __always_inline bool waited_on(struct pvs_scx_grant *g,
				      struct pvs_scx_vcpu *v)
{
	u64 base = g->slot_addr - (u64)g->vcpu_index * g->slot_stride;
	u32 j, holder, peers = g->lock_peers;

	if (peers > PVS_SCX_MAX_LOCK_PEERS)
		peers = PVS_SCX_MAX_LOCK_PEERS;
	for (j = 0; j < PVS_SCX_MAX_LOCK_PEERS; j++) {
		if (j >= peers)
			break;
		if (j == g->vcpu_index)
			continue;
		if (bpf_probe_read_user(&holder, sizeof(holder),
					(void *)(base + (u64)j * g->slot_stride +
						 PVSCHED_OFFSETOF(struct pvsched_slot,
								  guest.lock_holder)))) {
			v->slot_read_failed++;
			continue;
		}
		/* lock_holder is the holder's slot index + 1. */
		if (holder == g->vcpu_index + 1)
			return true;
	}
	return false;
}

/*
 * Whether a vCPU whose slot shows `cs` earns an extension: a critical
 * section of extension_cs, or a lock held (CS_LOCK, or another vCPU's
 * published wait naming it: *lock says which).
 */
static __always_inline bool earns_extension(struct pvs_scx_grant *g,
					    struct pvs_scx_vcpu *v, u32 cs,
					    bool *lock)
{
	*lock = cs_lock_held(g, cs);
	if (*lock || (cs & extension_cs & ~PVSCHED_CS_LOCK))
		return true;
	*lock = g->lock_peers && g->slot_stride && waited_on(g, v);
	return *lock;
}

/*
 * The extension vCPU record v runs, if any, ends now: charged to its
 * total for what it ran, at most extension_ns (a grant reserved that much).
 */
static __always_inline void close_extension(struct pvs_scx_vcpu *v)
{
	u64 now = bpf_ktime_get_ns(), ran, most = extension_ns;

	if (!v->ext_in_slice)
		return;
	if (v->ext_in_tail)
		most += extension_tail_ns;
	ran = now > v->ext_at ? now - v->ext_at : 0;
	if (ran > most)
		ran = most;
	v->ext_ns += ran;
	if (v->ext_is_lock)
		v->ext_lock_ns += ran;
	v->ext_in_slice = 0;
	v->ext_is_lock = 0;
	v->ext_in_tail = 0;
}

/*
 * One extension for vCPU record v if its allowance has room for a whole
 * one (counted refused otherwise): one per slice, counted for a lock holder
 * (`lock`) and at a boosted preemption (`at_preempt`) apart, charged when
 * it ends (close_extension). The caller sets the slice.
 */
static __always_inline bool grant_extension(struct pvs_scx_vcpu *v, bool lock,
					    bool at_preempt)
{
	if (v->ext_ns + extension_ns > allowance(&v->ext_allowed_ns)) {
		v->ext_refused++;
		__sync_fetch_and_add(&totals.ext_refused, 1);
		return false;
	}
	v->ext_count++;
	v->ext_in_slice = extension_ns;
	v->ext_at = bpf_ktime_get_ns();
	v->ext_is_lock = lock;
	__sync_fetch_and_add(&totals.extensions, 1);
	if (lock) {
		v->ext_lock_count++;
		__sync_fetch_and_add(&totals.ext_lock, 1);
	}
	if (at_preempt) {
		v->ext_at_preempt_count++;
		__sync_fetch_and_add(&totals.ext_at_preempt, 1);
	}
	return true;
}

/*
 * An extension's poll, on this CPU for its vCPU thread `tid` (the current
 * task, or the one running here), the first read extension_poll_ns from
 * now. Restarting an armed timer moves it.
 */
static __always_inline void start_ext_poll(u32 tid)
{
	u32 key = bpf_get_smp_processor_id();
	struct pvs_ext_poll *e;

	if (!extension_poll_ns)
		return;
	e = bpf_map_lookup_elem(&ext_poll, &key);
	if (!e)
		return;
	e->tid = tid;
	if (bpf_timer_start(&e->timer, extension_poll_ns, BPF_F_TIMER_CPU_PIN))
		__sync_fetch_and_add(&totals.ext_poll_errors, 1);
}

/*
 * The poll's timer fired on its CPU: if the vCPU it is for still runs
 * its extension here (the current task: its VMM's memory is the one
 * mapped, so its slot can be read), read the slot again; while the guest
 * is still in what earned the extension, read it again later; once it is
 * out, end the extension now (the kick takes the CPU back at once; the
 * stop charges what it ran). In a tail, read finer, and end it at its
 * end whatever the slot shows (its slice end). Not the current task: it
 * stopped, or a higher class took its CPU; the extension runs its course.
 */
static int ext_poll_fired(void *map, int *key, struct pvs_ext_poll *e)
{
	u32 tid = (u32)bpf_get_current_pid_tgid(), cs = 0;
	s32 cpu = bpf_get_smp_processor_id();
	struct pvs_scx_grant *g;
	struct pvs_scx_vcpu *v;
	bool lock;

	if (!e->tid || e->tid != tid || *key != cpu)
		return 0;
	g = bpf_map_lookup_elem(&scx_grants, &tid);
	v = g ? bpf_map_lookup_elem(&scx_vcpus, &g->record) : NULL;
	if (!g || !v || !g->slot_addr || !v->ext_in_slice) {
		e->tid = 0;
		return 0;
	}
	if (!slot_cs_flags(g, &cs)) {
		v->slot_read_failed++;
		__sync_fetch_and_add(&totals.slot_read_failed, 1);
		e->tid = 0;
		return 0;
	}
	__sync_fetch_and_add(&totals.ext_polls, 1);
	if (earns_extension(g, v, cs, &lock)) {
		if (v->ext_in_tail && bpf_ktime_get_ns() >= e->tail_until) {
			/* The tail ran out: its slice ends here. */
			e->tid = 0;
			v->slice_ended = 1;
			scx_bpf_kick_cpu(cpu, SCX_KICK_PREEMPT);
			return 0;
		}
		if (bpf_timer_start(&e->timer,
				    v->ext_in_tail ? extension_tail_poll_ns :
						     extension_poll_ns,
				    BPF_F_TIMER_CPU_PIN))
			__sync_fetch_and_add(&totals.ext_poll_errors, 1);
		return 0;
	}
	e->tid = 0;
	if (v->ext_in_tail) {
		v->ext_tails_ended_early++;
		__sync_fetch_and_add(&totals.ext_tails_ended_early, 1);
	} else {
		v->ext_ended_early++;
		__sync_fetch_and_add(&totals.ext_ended_early, 1);
	}
	note_cut(cpu, PVS_SCX_CUT_POLL);
	scx_bpf_kick_cpu(cpu, SCX_KICK_PREEMPT);
	return 0;
}

/*
 * The extension vCPU record v runs on this CPU (its thread `tid`, the
 * current task) ran out while its guest still shows a lock held (`cs`):
 * one tail, if its allowance has room for the extension and the tail
 * whole and this CPU polls that extension. The caller sets the slice.
 */
static __always_inline bool grant_tail(struct pvs_scx_grant *g,
				       struct pvs_scx_vcpu *v, u32 tid, u32 cs)
{
	u32 key = bpf_get_smp_processor_id();
	struct pvs_ext_poll *e;

	if (!extension_tail_ns || !extension_tail_poll_ns || v->ext_in_tail ||
	    !cs_lock_held(g, cs) ||
	    v->ext_ns + extension_ns + extension_tail_ns > allowance(&v->ext_allowed_ns))
		return false;
	e = bpf_map_lookup_elem(&ext_poll, &key);
	if (!e || e->tid != tid)
		return false;
	v->ext_in_tail = 1;
	v->ext_tails++;
	__sync_fetch_and_add(&totals.ext_tails, 1);
	e->tail_until = bpf_ktime_get_ns() + extension_tail_ns;
	if (bpf_timer_start(&e->timer, extension_tail_poll_ns, BPF_F_TIMER_CPU_PIN))
		__sync_fetch_and_add(&totals.ext_poll_errors, 1);
	return true;
}

/*
 * The record of the lock-handling vCPU running on `cpu`, unless that is
 * thread `except`; NULL for none, or without extensions. Its lock flag is
 * the one kept for the CPU (as of that vCPU's last stop or tick).
 */
static __always_inline struct pvs_cpu_holder *lock_vcpu_on(s32 cpu, u32 except)
{
	struct pvs_cpu_holder *h = cpu_holder_of(cpu);

	if (!extension_ns || !h || !h->tid || h->tid == except)
		return NULL;
	return h;
}

/*
 * The lock holder running on `cpu`: the tid of the vCPU thread there whose
 * guest shows a sleeping lock held (lock holders honoured), its grant in
 * *hg; 0 for none, or for `except` itself. The flag is as of that vCPU's
 * last stop or tick, or read now when this runs on its own thread (its
 * guest woke the task, often by releasing a lock it may not be the last
 * of).
 */
static __always_inline u32 holder_on(s32 cpu, u32 except,
				     struct pvs_scx_grant **hg)
{
	struct pvs_cpu_holder *h = lock_vcpu_on(cpu, except);
	struct pvs_scx_grant *g;
	u32 tid, cs;

	if (!h)
		return 0;
	tid = h->tid;
	g = bpf_map_lookup_elem(&scx_grants, &tid);
	if (!g || !g->lock_peers)
		return 0;
	if (cpu == bpf_get_smp_processor_id() &&
	    (u32)bpf_get_current_pid_tgid() == tid && g->slot_addr &&
	    slot_cs_flags(g, &cs))
		h->lock = cs_lock_held(g, cs);
	if (!h->lock)
		return 0;
	*hg = g;
	return tid;
}

/*
 * Extension at the preemption: a boosted task (p: a boosted vCPU, or the
 * daemon's event thread) would preempt the vCPU running on `cpu` while
 * that vCPU's guest shows a sleeping lock held. The holder keeps its CPU
 * for one extension instead, within the allowance and charged like one
 * granted at a slice end (its vtime pays for the time it runs), or for
 * what is left of the extension it already runs; p runs next on that CPU.
 * Returns whether the preemption is deferred.
 */
static __always_inline bool holder_keeps_cpu(struct task_struct *p, s32 cpu)
{
	struct pvs_scx_grant *hg = NULL;
	struct pvs_scx_vcpu *hv;
	struct task_struct *holder;
	bool granted;
	u32 tid;

	tid = holder_on(cpu, p->pid, &hg);
	if (!tid || !hg)
		return false;
	hv = bpf_map_lookup_elem(&scx_vcpus, &hg->record);
	if (!hv)
		return false;
	/* Extended already: its slice is that extension's rest. */
	if (hv->ext_in_slice)
		return true;
	holder = bpf_task_from_pid(tid);
	if (!holder)
		return false;
	granted = grant_extension(hv, true, true);
	/* At most one extension from now, whatever its slice had left. */
	if (granted && holder->scx.slice > extension_ns)
		holder->scx.slice = extension_ns;
	bpf_task_release(holder);
	/* Polled only from its own CPU (the timer is pinned where it starts). */
	if (granted && cpu == bpf_get_smp_processor_id())
		start_ext_poll(tid);
	return granted;
}

/*
 * Whether a vCPU of a lock-handling VM runs on `cpu` (other than thread
 * `except`) whose slot cannot be read now: only the current task's address
 * space is mapped, so a vCPU on another CPU has only the flag kept for it,
 * as of its last tick or stop (a tick, 4 ms, out of date at worst). A
 * preemption of it is then left to that CPU (preempt_checked_there).
 */
static __always_inline bool holder_unread_on(s32 cpu, u32 except)
{
	struct pvs_cpu_holder *h = lock_vcpu_on(cpu, except);

	return h && !(cpu == bpf_get_smp_processor_id() &&
		      (u32)bpf_get_current_pid_tgid() == h->tid);
}

/* The slice thread `tid` has left now; 0 if it is gone. */
static __always_inline u64 slice_of(u32 tid)
{
	struct task_struct *t = bpf_task_from_pid(tid);
	u64 slice;

	if (!t)
		return 0;
	slice = t->scx.slice;
	bpf_task_release(t);
	return slice;
}

/*
 * Take `cpu`, for `cut`, from the lock-handling vCPU running there whose
 * slot cannot be read here (holder_unread_on): the task meant to preempt it
 * waits in the boost queue (the caller put it there) and that CPU picks
 * again. Its dispatch reads the slot (holder_kept_at_dispatch): a guest in
 * its lock keeps the CPU for one extension, polled to its first lock-free
 * point; any other vCPU is preempted there and then.
 */
static __always_inline void preempt_checked_there(s32 cpu, u32 cut)
{
	struct pvs_cpu_holder *h = cpu_holder_of(cpu);

	if (h && (cut == PVS_SCX_CUT_GRANT || cut == PVS_SCX_CUT_DAEMON))
		h->slice_left = slice_of(h->tid);
	note_cut(cpu, cut);
	scx_bpf_kick_cpu(cpu, SCX_KICK_PREEMPT);
	__sync_fetch_and_add(&totals.preempts_checked, 1);
}

/*
 * pvschedd's event thread takes `cpu`, decided where the vCPU running
 * there, if one of a lock-handling VM, is the current task (its slot was
 * read: holder_keeps_cpu). Noted, with the slice that vCPU had left: if it
 * stops in its lock, it runs that right after the daemon (vcpu_stopping).
 */
static __always_inline void note_daemon_cut(s32 cpu)
{
	struct pvs_cpu_holder *h = lock_vcpu_on(cpu, 0);

	note_cut(cpu, PVS_SCX_CUT_DAEMON);
	if (!h)
		return;
	h->slice_left = cpu == bpf_get_smp_processor_id() &&
			(u32)bpf_get_current_pid_tgid() == h->tid ?
			slice_of(h->tid) : 0;
}

/*
 * A vCPU stopping in its lock before its slice end on this CPU: if the
 * daemon's event thread took the CPU from it, the slice it had left (at
 * most a slice), else 0.
 */
static __always_inline u64 slice_left_to_daemon(void)
{
	struct pvs_cpu_holder *h = cpu_holder_of(bpf_get_smp_processor_id());
	u64 left;

	if (!h || h->cut != PVS_SCX_CUT_DAEMON)
		return 0;
	left = h->slice_left;
	h->slice_left = 0;
	return left < slice_ns ? left : slice_ns;
}

/*
 * The first CPU after `cpu`, in CPU order and wrapping around, that runs
 * no vCPU of process `vm`; `cpu` itself when every other CPU does.
 */
static __always_inline s32 first_cpu_without(s32 cpu, u32 vm)
{
	u32 n = nr_cpu_ids < PVS_MAX_CPUS ? nr_cpu_ids : PVS_MAX_CPUS;
	struct bpf_iter_num it;
	s32 found = cpu;
	int *i;

	bpf_iter_num_new(&it, 1, n);
	while ((i = bpf_iter_num_next(&it))) {
		u32 other = ((u32)cpu + *i) % n;
		struct pvs_cpu_holder *o = cpu_holder_of(other);

		if (!o || o->vm == vm)
			continue;
		found = other;
		break;
	}
	bpf_iter_num_destroy(&it);
	return found;
}

/*
 * A woken vCPU thread with no idle CPU to go to: if another vCPU of its VM
 * runs on `cpu`, a CPU where none does (first_cpu_without), else `cpu`.
 * Only for a thread that may run on every CPU: a pinned one keeps its
 * pinning's placement (and no cpumask is read here).
 */
static __always_inline s32 away_from_siblings(struct task_struct *p, s32 cpu)
{
	struct pvs_cpu_holder *h = cpu_holder_of(cpu);
	s32 found;

	if (!h || h->vm != (u32)p->tgid || (u32)p->nr_cpus_allowed < nr_cpu_ids)
		return cpu;
	found = first_cpu_without(cpu, p->tgid);
	if (found != cpu)
		__sync_fetch_and_add(&totals.vcpus_spread, 1);
	return found;
}

/*
 * The daemon's event thread woken with no idle CPU, onto a CPU that runs a
 * vCPU of a lock-handling VM: the waker's CPU instead. The daemon preempts
 * where it wakes (pvs_enqueue), unless a holder runs there, and the lock
 * flag of a vCPU on another CPU is as of its last tick or stop: wakeups
 * onto holders whose flag was out of date were most of the holders'
 * preemptions before their slice end (BENCHMARKS.md, LH33: 533 of 578).
 * On the waker's CPU the current task's address space is mapped, so
 * holder_on reads its guest's flag now: a vCPU out of its critical section
 * is preempted, a holder keeps its CPU for an extension polled to its first
 * lock-free point (holder_keeps_cpu) and the daemon runs next. Only if the
 * daemon may run on every CPU (no cpumask is read here).
 */
static __always_inline s32 daemon_where_flag_is_read(struct task_struct *p,
						     s32 cpu)
{
	s32 here = bpf_get_smp_processor_id();

	if (cpu == here || (u32)p->nr_cpus_allowed < nr_cpu_ids ||
	    !lock_vcpu_on(cpu, p->pid))
		return cpu;
	__sync_fetch_and_add(&totals.daemon_moved, 1);
	return here;
}

s32 BPF_STRUCT_OPS(pvs_select_cpu, struct task_struct *p, s32 prev_cpu,
		   u64 wake_flags)
{
	struct pvs_scx_grant *g = grant_of(p);
	bool is_idle = false;
	s32 cpu;

	cpu = scx_bpf_select_cpu_dfl(p, prev_cpu, wake_flags, &is_idle);
	if (!is_idle && g && spread_vm_vcpus)
		cpu = away_from_siblings(p, cpu);
	if (!is_idle && daemon_tid && p->pid == daemon_tid)
		cpu = daemon_where_flag_is_read(p, cpu);
	if (is_idle) {
		/* An idle CPU: nothing to go ahead of, no boost decided. */
		scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, slice_ns, 0);
		if (g) {
			struct pvs_scx_vcpu *v = vcpu_of(p);

			if (v) {
				v->enq_boost = 0;
				v->enq_kreason = PVS_SCX_KR_NONE;
				v->wake_boost = 0;
				v->cs_preempted = 0;
			}
			mark_queued(p, false);
		}
	}
	return cpu;
}

/*
 * A boosted task: on the CPU it is enqueued on at once, preempting the task
 * there when that one is weaker (unless that one is a lock holder, which
 * keeps its CPU for an extension first); else on the boost queue, with a
 * CPU that runs an unboosted task told to pick again.
 */
static __always_inline void enqueue_boosted(struct task_struct *p, u32 boost,
					    u64 slice, u64 enq_flags)
{
	struct pvs_scx_vcpu *v = vcpu_of(p);
	s32 cpu = scx_bpf_task_cpu(p);
	u32 i;

	if (boost_on(cpu) < boost) {
		if (holder_unread_on(cpu, p->pid)) {
			scx_bpf_dsq_insert(p, PVS_SCX_DSQ_BOOST, slice, enq_flags);
			preempt_checked_there(cpu, PVS_SCX_CUT_BOOST);
			__sync_fetch_and_add(&totals.boost_preempts, 1);
			if (v)
				__sync_fetch_and_add(&v->boost_preempts, 1);
			return;
		}
		if (holder_keeps_cpu(p, cpu)) {
			scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, slice, enq_flags);
			return;
		}
		note_cut(cpu, PVS_SCX_CUT_BOOST);
		scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, slice,
				   enq_flags | SCX_ENQ_PREEMPT);
		__sync_fetch_and_add(&totals.boost_preempts, 1);
		if (v)
			__sync_fetch_and_add(&v->boost_preempts, 1);
		return;
	}
	scx_bpf_dsq_insert(p, PVS_SCX_DSQ_BOOST, slice, enq_flags);
	__sync_fetch_and_add(&totals.boost_queued, 1);
	if (v)
		__sync_fetch_and_add(&v->boost_queued, 1);
	for (i = 0; i < nr_cpu_ids && i < 1024; i++) {
		if (boost_on(i) < boost) {
			note_cut(i, PVS_SCX_CUT_KICK);
			scx_bpf_kick_cpu(i, SCX_KICK_PREEMPT);
			break;
		}
	}
}

/* Whether a boost still holds at an enqueue (enum pvs_scx_boost_kind). */
static __always_inline bool boost_holds(struct task_struct *p,
					struct pvs_scx_grant *g)
{
	struct pvs_scx_vcpu *v;

	if (g->boost_kind == PVS_SCX_BOOST_PROACTIVE || !g->slot_addr)
		return true;
	v = vcpu_of(p);
	if (!v || v->guest_reason)
		return true;
	__sync_fetch_and_add(&v->boost_dropped, 1);
	return false;
}

/*
 * Why the program boosts the vCPU itself at this enqueue (enum
 * pvs_scx_kreason), NONE for not: guest RT work shown when it last stopped,
 * or a wakeup from a halt within the window of such work; as the policy
 * allows, a preemption in a critical section, or a wakeup onto a busy CPU
 * (an enqueue after select_cpu found no idle one). Only while its own
 * boosted time is within the allowance the daemon gives from the budget.
 */
static __always_inline u32 kernel_boost(struct pvs_scx_grant *g,
					struct pvs_scx_vcpu *v, u64 enq_flags)
{
	bool wakeup = enq_flags & SCX_ENQ_WAKEUP;
	u64 now = bpf_ktime_get_ns();

	/* A halt repays the burst (time queued for a CPU counts neither way). */
	if (wakeup && v->halted_at) {
		u64 halted = now > v->halted_at ? now - v->halted_at : 0;

		v->kburst_ns = v->kburst_ns > halted ? v->kburst_ns - halted : 0;
		v->halted_at = 0;
	}
	if (!g->kboost || v->kboost_ns >= allowance(&v->kboost_allowed_ns))
		return PVS_SCX_KR_NONE;
	if (v->kthrottled_until && now < v->kthrottled_until)
		return PVS_SCX_KR_NONE;
	if (g->max_boost_ns && v->kburst_ns > g->max_boost_ns) {
		v->kthrottled_until = now + g->throttle_ns;
		v->kburst_ns = 0;
		v->kthrottles++;
		__sync_fetch_and_add(&totals.kthrottles, 1);
		return PVS_SCX_KR_NONE;
	}
	if (v->guest_rt || (wakeup && v->wake_boost))
		return PVS_SCX_KR_RT;
	if (!wakeup && v->cs_preempted && (g->kflags & PVS_SCX_K_CS))
		return PVS_SCX_KR_CS;
	if (wakeup && (g->kflags & PVS_SCX_K_WAKE) && g->wake_boost_ns)
		return PVS_SCX_KR_WAKE;
	return PVS_SCX_KR_NONE;
}

/*
 * A vCPU preempted in its lock for the daemon's event thread, which runs
 * briefly, before its slice end (vcpu_stopping): it runs next on this CPU
 * for the `slice` it had left, charged as ever, as a task the fair class
 * preempts for a waking one keeps its place. By vtime it would wait behind
 * the other tasks of the CPU, the other VM's vCPU, and every waiter of its
 * lock with it.
 */
static __always_inline void resume_after_daemon(struct task_struct *p,
						struct pvs_scx_vcpu *v,
						u64 slice, u64 enq_flags)
{
	v->wake_boost = 0;
	v->cs_preempted = 0;
	v->enq_boost = 0;
	v->enq_kreason = PVS_SCX_KR_NONE;
	mark_queued(p, false);
	scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, slice, enq_flags);
	v->holder_resumed++;
	__sync_fetch_and_add(&totals.holders_resumed, 1);
}

void BPF_STRUCT_OPS(pvs_enqueue, struct task_struct *p, u64 enq_flags)
{
	struct pvs_scx_grant *g = grant_of(p);
	struct pvs_scx_vcpu *v = g ? vcpu_of(p) : NULL;
	u64 vtime = p->scx.dsq_vtime, slice = slice_ns, resume;
	u32 boost = 0, kprio, why;

	__sync_fetch_and_add(&totals.enqueues, 1);
	if (daemon_tid && p->pid == daemon_tid) {
		/* Woken: at once, unless a lock holder runs here (then after
		 * one extension). After a whole slice: behind what waits here. */
		u64 preempt = enq_flags & SCX_ENQ_WAKEUP ? SCX_ENQ_PREEMPT : 0;
		s32 cpu = scx_bpf_task_cpu(p);

		if (preempt && holder_unread_on(cpu, p->pid)) {
			scx_bpf_dsq_insert(p, PVS_SCX_DSQ_BOOST, slice_ns, enq_flags);
			preempt_checked_there(cpu, PVS_SCX_CUT_DAEMON);
			return;
		}
		if (preempt && holder_keeps_cpu(p, cpu))
			preempt = 0;
		if (preempt)
			note_daemon_cut(cpu);

		scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, slice_ns, enq_flags | preempt);
		return;
	}
	if (g && v) {
		resume = v->resume_slice;
		v->resume_slice = 0;
		if (g->boost && boost_holds(p, g))
			boost = g->boost;
		/* Before the program's own boost: resuming costs no budget. */
		if (!boost && resume && !(enq_flags & SCX_ENQ_WAKEUP)) {
			resume_after_daemon(p, v, resume, enq_flags);
			return;
		}
		why = kernel_boost(g, v, enq_flags);
		v->wake_boost = 0;
		v->cs_preempted = 0;
		/* A long burst boosts at the bottom only (grant.demote_after_ns). */
		kprio = g->demote_after_ns && v->kburst_ns > g->demote_after_ns ? 1 : g->kboost;
		v->enq_demoted = kprio < g->kboost;
		/* The daemon's grant, when as strong, is the one charged. */
		if (why != PVS_SCX_KR_NONE && kprio > boost) {
			boost = kprio;
			v->kboosts++;
			__sync_fetch_and_add(&totals.kboosts, 1);
			/* A wakeup's boost lasts one short slice: then the
			 * vCPU is queued again by what its slot says. */
			if (why == PVS_SCX_KR_WAKE)
				slice = g->wake_boost_ns;
		} else {
			why = PVS_SCX_KR_NONE;
		}
		v->enq_kreason = why;
		v->enq_boost = boost;
	}
	if (boost) {
		mark_queued(p, true);
		enqueue_boosted(p, boost, slice, enq_flags);
		return;
	}
	if (g)
		mark_queued(p, false);
	if (vtime_before(vtime, vtime_now - slice_ns))
		vtime = vtime_now - slice_ns;
	scx_bpf_dsq_insert_vtime(p, fair_dsq(scx_bpf_task_cpu(p)), slice_ns, vtime,
				 enq_flags);
	if (enq_flags & SCX_ENQ_WAKEUP)
		preempt_on_wakeup(p, vtime);
}

/* The vtime of `prev`, whose slice just ended here and which may run on,
 * as of now: stopping charges the time it ran only after the dispatch. */
static __always_inline u64 vtime_so_far(struct task_struct *prev)
{
	struct pvs_task_run *r = bpf_task_storage_get(&task_run, prev, 0, 0);
	u64 exec = prev->se.sum_exec_runtime, vtime = prev->scx.dsq_vtime;
	u32 weight = prev->scx.weight;

	if (r && exec > r->exec_at_run)
		vtime += (exec - r->exec_at_run) * 100 / (weight ? weight : 100);
	return vtime;
}

/*
 * Whether a task waits to take this CPU from p, the current task, at its
 * slice end: a boost or a task on the CPU's local queue, or a fair task
 * pvs_dispatch would run before it (this CPU's queue's head ahead of it in
 * vtime, or another CPU's head more than a slice ahead, which it pulls).
 * If none does, the dispatch keeps p running on a fresh slice: an
 * extension there would change nothing but spend the allowance and poll.
 */
static __always_inline bool cpu_wanted(s32 cpu, struct task_struct *p)
{
	u64 vt = vtime_so_far(p), head = 0;
	struct bpf_iter_num it;
	bool wanted = false;
	int *i;

	if (scx_bpf_dsq_nr_queued(PVS_SCX_DSQ_BOOST) > 0 ||
	    scx_bpf_dsq_nr_queued(SCX_DSQ_LOCAL) > 0)
		return true;
	if (fair_head(cpu, &head) && !vtime_before(vt, head))
		return true;
	bpf_iter_num_new(&it, 0, nr_cpu_ids < PVS_MAX_CPUS ? nr_cpu_ids : PVS_MAX_CPUS);
	while ((i = bpf_iter_num_next(&it))) {
		if (*i != cpu && fair_head(*i, &head) && vtime_before(head + slice_ns, vt)) {
			wanted = true;
			break;
		}
	}
	bpf_iter_num_destroy(&it);
	return wanted;
}

/*
 * The dispatch after this program took the CPU from `prev`, a vCPU of a
 * lock-handling VM, before its slice end (a kick: preempt_checked_there,
 * the boost queue's, a woken task's), on its own CPU, where its slot is
 * read now: a guest in its lock keeps the CPU for one extension, as at
 * holder_keeps_cpu, if a task waits for the CPU and the allowance has room;
 * for a grant's preemption, without room, the rest of its slice; in an
 * extension already, the rest of it (run out, with no tick yet: a tail if
 * one is due). Not after its slice, an extension or a tail ran out, nor at
 * its poll's end: pvs_tick and the poll decided those.
 */
static __always_inline bool holder_kept_at_dispatch(s32 cpu,
						     struct task_struct *prev)
{
	struct pvs_cpu_holder *h = cpu_holder_of(cpu);
	struct pvs_scx_grant *g;
	struct pvs_scx_vcpu *v;
	u64 slice;
	u32 cs = 0;

	if (!extension_ns || !prev || !h || h->tid != (u32)prev->pid ||
	    h->cut == PVS_SCX_CUT_OTHER || prev->scx.slice ||
	    !(prev->scx.flags & SCX_TASK_QUEUED) ||
	    (u32)bpf_get_current_pid_tgid() != (u32)prev->pid)
		return false;
	g = grant_of(prev);
	v = g ? vcpu_of(prev) : NULL;
	/* An extension's poll, or its guest's yield, ended it: let it go. */
	if (!g || !v || !g->lock_peers || !g->slot_addr || v->slice_ended ||
	    (v->ext_in_slice &&
	     (h->cut == PVS_SCX_CUT_POLL || h->cut == PVS_SCX_CUT_YIELD)))
		return false;
	if (!slot_cs_flags(g, &cs)) {
		v->slot_read_failed++;
		__sync_fetch_and_add(&totals.slot_read_failed, 1);
		return false;
	}
	h->lock = cs_lock_held(g, cs);
	if (!h->lock || !cpu_wanted(cpu, prev))
		return false;
	if (v->ext_in_slice) {
		/* Extended already: the rest of that extension, or of its
		 * tail, still polled; run out before a tick saw it: what that
		 * tick does, a tail if one is due, else the extension's end. */
		u64 now = bpf_ktime_get_ns(), end = v->ext_at + extension_ns;
		u32 key = cpu;
		struct pvs_ext_poll *e = v->ext_in_tail ?
			bpf_map_lookup_elem(&ext_poll, &key) : NULL;

		if (e)
			end = e->tail_until;
		if (now < end) {
			slice = end - now;
		} else if (grant_tail(g, v, prev->pid, cs)) {
			slice = extension_tail_ns;
		} else {
			v->slice_ended = 1;
			return false;
		}
	} else if (grant_extension(v, true, true)) {
		slice = extension_ns;
		start_ext_poll(prev->pid);
	} else if (h->cut == PVS_SCX_CUT_GRANT && h->slice_left) {
		/* A grant's queued vCPU runs at the holder's slice end, as it
		 * did by the flag kept for the CPU: the rest of its slice. */
		slice = h->slice_left < slice_ns ? h->slice_left : slice_ns;
		h->slice_left = 0;
	} else {
		/* A grant's holder with no slice left is at its slice end. */
		if (h->cut == PVS_SCX_CUT_GRANT)
			v->slice_ended = 1;
		return false;
	}
	prev->scx.slice = slice;
	__sync_fetch_and_add(&totals.holders_kept_at_dispatch, 1);
	return true;
}

/*
 * The boost queue first; then this CPU's own: the task that just ran here,
 * if it may run on, or the oldest of its fair queue, whichever is older;
 * unless another CPU's oldest is more than a slice of vtime older still
 * (or this CPU has nothing): then that one is taken.
 */
void BPF_STRUCT_OPS(pvs_dispatch, s32 cpu, struct task_struct *prev)
{
	u64 own = 0, vt = 0, oldest = 0;
	bool have_own, have_other = false, keep = false;
	struct bpf_iter_num it;
	u32 from = 0;
	int *i;

	if (holder_kept_at_dispatch(cpu, prev))
		return;
	if (scx_bpf_dsq_move_to_local(PVS_SCX_DSQ_BOOST))
		return;
	have_own = fair_head(cpu, &own);
	if (prev && (prev->scx.flags & SCX_TASK_QUEUED)) {
		vt = vtime_so_far(prev);
		if (!have_own || vtime_before(vt, own)) {
			own = vt;
			have_own = true;
			keep = true;
		}
	}
	bpf_iter_num_new(&it, 0, nr_cpu_ids < PVS_MAX_CPUS ? nr_cpu_ids : PVS_MAX_CPUS);
	while ((i = bpf_iter_num_next(&it))) {
		u32 other = *i;

		if (other == (u32)cpu || !fair_head(other, &vt))
			continue;
		if (!have_other || vtime_before(vt, oldest)) {
			oldest = vt;
			from = other;
			have_other = true;
		}
	}
	bpf_iter_num_destroy(&it);
	if (have_other && (!have_own || vtime_before(oldest + slice_ns, own))) {
		if (scx_bpf_dsq_move_to_local(fair_dsq(from))) {
			__sync_fetch_and_add(&totals.fair_pulls, 1);
			return;
		}
	}
	if (keep) {
		/* It runs on for another slice; it is charged at its stop. Its
		 * extension, if any, is over: the next slice end may grant one. */
		struct pvs_scx_vcpu *pv = vcpu_of(prev);

		if (pv) {
			close_extension(pv);
			/* A stop in the new slice is not at its end. */
			pv->slice_ended = 0;
		}
		prev->scx.slice = slice_ns;
		return;
	}
	if (have_own && scx_bpf_dsq_move_to_local(fair_dsq(cpu)))
		return;
	/* Its own queue held only tasks that may not run here. */
	if (have_other && scx_bpf_dsq_move_to_local(fair_dsq(from)))
		__sync_fetch_and_add(&totals.fair_pulls, 1);
}

/* A vCPU that stopped in its lock runs again: how long it waited, by how
 * it stopped (pvs_scx_vcpu.holder_preempted_ns_*). */
static __always_inline void holder_back(struct pvs_scx_vcpu *v, u64 now)
{
	u64 waited;

	if (!v->holder_stopped_at)
		return;
	waited = now > v->holder_stopped_at ? now - v->holder_stopped_at : 0;
	v->holder_stopped_at = 0;
	if (v->holder_stop_kind == 0)
		v->holder_preempted_ns_extended += waited;
	else if (v->holder_stop_kind == 1)
		v->holder_preempted_ns_unextended += waited;
	else
		v->holder_preempted_ns_early += waited;
}

void BPF_STRUCT_OPS(pvs_running, struct task_struct *p)
{
	struct pvs_scx_grant *g = grant_of(p);
	struct pvs_cpu_run *c = NULL;
	struct pvs_task_run *r;
	struct pvs_scx_vcpu *v;

	r = bpf_task_storage_get(&task_run, p, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (r)
		r->exec_at_run = p->se.sum_exec_runtime;
	/* Kept only for wakeup preemption (a constant: off, the verifier
	 * drops this). */
	if (wakeup_preempt_ns)
		c = cpu_run_of(bpf_get_smp_processor_id());
	if (c) {
		c->vtime = p->scx.dsq_vtime;
		c->start = bpf_ktime_get_ns();
		c->weight = p->scx.weight;
		c->running = 1;
	}

	if (vtime_before(vtime_now, p->scx.dsq_vtime))
		vtime_now = p->scx.dsq_vtime;
	v = g ? vcpu_of(p) : NULL;
	{
		struct pvs_cpu_holder *h = cpu_holder_of(bpf_get_smp_processor_id());

		/* Its lock flag as it stopped (a preempted holder holds it
		 * still), until its first tick reads the slot. */
		if (h) {
			h->tid = g && g->lock_peers ? p->pid : 0;
			h->lock = h->tid && v ? v->lock_at_stop : 0;
			h->vm = g ? p->tgid : 0;
			h->cut = PVS_SCX_CUT_OTHER;
			h->slice_left = 0;
		}
	}
	if (daemon_tid && p->pid == daemon_tid)
		set_boost_on(bpf_get_smp_processor_id(), DAEMON_BOOST);
	else
		set_boost_on(bpf_get_smp_processor_id(), v ? v->enq_boost : 0);
	if (g) {
		if (v) {
			v->run_boosted = v->enq_boost != 0;
			v->run_kreason = v->enq_kreason;
			v->run_demoted = v->enq_kreason != PVS_SCX_KR_NONE && v->enq_demoted;
			v->run_start = bpf_ktime_get_ns();
			close_extension(v);
			holder_back(v, v->run_start);
			if (v->queued_at) {
				u32 b = log2_bucket(bpf_ktime_get_ns() - v->queued_at);

				if (v->queued_boosted)
					__sync_fetch_and_add(&totals.queued_to_run_boosted[b], 1);
				else
					__sync_fetch_and_add(&totals.queued_to_run_other[b], 1);
				v->queued_at = 0;
			}
		}
	}
}

/*
 * Whether the guest half of the slot at `slot` shows a reason of the guest's
 * own to boost its vCPU: an RT or deadline task, a critical section, a boost
 * request, or an RT task waiting to run; SLOT_LOCK besides, for the count of
 * holder preemptions. Read while the vCPU thread is the current task (its
 * VMM's memory); < 0 when the read faulted.
 */
_Static_assert(PVSCHED_OFFSETOF(struct pvsched_slot, guest.flags) == 4, "flags");
_Static_assert(PVSCHED_OFFSETOF(struct pvsched_slot, guest.cs_flags) == 8, "cs_flags");
_Static_assert(PVSCHED_OFFSETOF(struct pvsched_slot, guest.policy) == 12, "policy");

#define SLOT_RT		1	/* guest RT work now */
#define SLOT_CS		2	/* a critical section */
#define SLOT_PENDING	4	/* an RT wakeup pending (the daemon's to act on) */
#define SLOT_LOCK	8	/* a sleeping lock held (CS_LOCK), whatever else */

static __always_inline int slot_guest_reason(u64 slot, u64 *rt_switches)
{
	struct {
		u32 seq, flags, cs_flags, policy;
	} g;
	u64 pending = 0;
	int bits = 0;

	if (bpf_probe_read_user(&g, sizeof(g), (void *)slot) ||
	    bpf_probe_read_user(&pending, sizeof(pending),
				(void *)(slot + PVSCHED_OFFSETOF(struct pvsched_slot,
								 guest.guest_pending))) ||
	    bpf_probe_read_user(rt_switches, sizeof(*rt_switches),
				(void *)(slot + PVSCHED_OFFSETOF(struct pvsched_slot,
								 guest.rt_switch_count))))
		return -1;
	if (pending & PVSCHED_PENDING_VALID)
		bits |= SLOT_PENDING;
	if (!(g.flags & PVSCHED_GF_ACTIVE) || (g.flags & PVSCHED_GF_IDLE))
		return bits;
	if ((g.flags & PVSCHED_GF_BOOST_REQ) || g.policy == PVSCHED_POLICY_FIFO ||
	    g.policy == PVSCHED_POLICY_RR || g.policy == PVSCHED_POLICY_DEADLINE)
		bits |= SLOT_RT;
	if (g.cs_flags & PVSCHED_CS_ALL)
		bits |= SLOT_CS;
	if (g.cs_flags & PVSCHED_CS_LOCK)
		bits |= SLOT_LOCK;
	return bits;
}

/*
 * A vCPU preempted while its guest showed a lock held, counted by how
 * (pvs_scx_vcpu): at its slice end with or without an extension in that
 * slice, or before its slice end.
 */
static __always_inline void count_holder_preempted(struct pvs_scx_vcpu *v,
						   bool slice_ended,
						   bool extended)
{
	if (!slice_ended) {
		struct pvs_cpu_holder *h = cpu_holder_of(bpf_get_smp_processor_id());
		u32 cut = h ? h->cut : PVS_SCX_CUT_OTHER;

		v->holder_preempted_early++;
		__sync_fetch_and_add(&totals.holder_preempted_early, 1);
		if (cut < PVS_SCX_CUT_COUNT)
			v->holder_preempted_early_by[cut]++;
	} else if (extended) {
		v->holder_preempted_extended++;
		__sync_fetch_and_add(&totals.holder_preempted_extended, 1);
	} else {
		v->holder_preempted_unextended++;
		__sync_fetch_and_add(&totals.holder_preempted_unextended, 1);
	}
}

/*
 * The vCPU thread stops (the current task still): read its slot for what
 * the next enqueue decides, account a run of its own boost (to the burst
 * too; a run unboosted repays the burst, and so does a halt, at the wakeup).
 */
static __always_inline void vcpu_stopping(struct task_struct *p,
					  struct pvs_scx_vcpu *v, bool runnable,
					  bool boosted, bool slice_ended,
					  bool extended)
{
	struct pvs_scx_grant *g = grant_of(p);
	u64 now = bpf_ktime_get_ns(), rt_switches = 0;
	u64 ran = now > v->run_start ? now - v->run_start : 0;
	int reason;

	if (v->run_kreason != PVS_SCX_KR_NONE) {
		v->kboost_ns += ran;
		v->kburst_ns += ran;
		if (v->run_kreason == PVS_SCX_KR_CS)
			v->kboost_cs_ns += ran;
		if (v->run_demoted)
			v->kboost_demoted_ns += ran;
	} else if (!boosted) {
		/* An unboosted run repays the burst. */
		v->kburst_ns = v->kburst_ns > ran ? v->kburst_ns - ran : 0;
	}
	if (!runnable)
		v->halted_at = now;
	v->run_kreason = PVS_SCX_KR_NONE;
	v->run_demoted = 0;
	v->resume_slice = 0;
	if (!g || !g->slot_addr)
		return;
	reason = slot_guest_reason(g->slot_addr, &rt_switches);
	if (reason < 0) {
		v->slot_read_failed++;
		__sync_fetch_and_add(&totals.slot_read_failed, 1);
		/* A failed read keeps a daemon boost and starts none here. */
		v->guest_reason = 1;
		v->guest_rt = 0;
		v->wake_boost = 0;
		v->cs_preempted = 0;
		v->lock_at_stop = 0;
		return;
	}
	v->lock_at_stop = runnable && (reason & SLOT_LOCK) &&
			  cs_lock_held(g, PVSCHED_CS_LOCK);
	v->holder_stopped_at = 0;
	if (v->lock_at_stop) {
		count_holder_preempted(v, slice_ended, extended);
		v->holder_stopped_at = now;
		v->holder_stop_kind = !slice_ended ? 2 : extended ? 0 : 1;
	}
	if (v->lock_at_stop && !slice_ended)
		v->resume_slice = slice_left_to_daemon();
	reason &= ~SLOT_LOCK;
	v->guest_reason = reason != 0;
	v->guest_rt = (reason & SLOT_RT) != 0;
	v->cs_preempted = runnable && (reason & SLOT_CS);
	/* RT work shown now, or run since the last look (its count moved). */
	if (v->guest_rt || rt_switches != v->rt_switches) {
		v->last_rt_ns = now;
		v->rt_switches = rt_switches;
	}
	v->wake_boost = !runnable && g->halt_window_ns && v->last_rt_ns &&
			now - v->last_rt_ns <= g->halt_window_ns;
}

void BPF_STRUCT_OPS(pvs_stopping, struct task_struct *p, bool runnable)
{
	struct pvs_task_run *r = bpf_task_storage_get(&task_run, p, 0, 0);
	struct pvs_cpu_run *c = NULL;
	u64 exec = p->se.sum_exec_runtime, used;
	struct pvs_scx_vcpu *v = vcpu_of(p);
	u32 weight = p->scx.weight;
	bool boosted = false;

	if (r) {
		used = exec > r->exec_at_run ? exec - r->exec_at_run : 0;
		r->exec_at_run = exec;
	} else {
		/* No record of its start (the scheduler attached while it ran):
		 * what the slice says. */
		u64 left = p->scx.slice;

		used = left < slice_ns ? slice_ns - left : 0;
	}
	if (v) {
		bool extended = v->ext_in_slice != 0, ended = v->slice_ended;

		close_extension(v);
		v->slice_ended = 0;
		boosted = v->run_boosted;
		v->run_boosted = 0;
		vcpu_stopping(p, v, runnable, boosted, ended, extended);
	}
	/*
	 * Time run boosted is paid from the boost budget, as the RT class's
	 * is on the rt backend, not again in vtime: a vCPU whose boost ends
	 * is not put behind every task for what the budget already charged.
	 */
	if (!boosted)
		p->scx.dsq_vtime += used * 100 / (weight ? weight : 100);
	set_boost_on(bpf_get_smp_processor_id(), 0);
	{
		u32 key = bpf_get_smp_processor_id();
		struct pvs_cpu_holder *h = cpu_holder_of(key);
		/* Only a vCPU's extension is polled: its poll, if pending,
		 * finds nothing to do. */
		struct pvs_ext_poll *e = v ? bpf_map_lookup_elem(&ext_poll, &key) : NULL;

		if (h) {
			h->tid = 0;
			h->vm = 0;
		}
		if (e)
			e->tid = 0;
	}
	if (wakeup_preempt_ns)
		c = cpu_run_of(bpf_get_smp_processor_id());
	if (c)
		c->running = 0;
}

/*
 * At a tick whose slice accounting left the current task nothing: a vCPU
 * whose guest is in a critical section, or holds a lock another of its
 * vCPUs waits for, gets one extension, if its allowance has room. The
 * kernel reschedules after this callback when the slice is still 0.
 */
void BPF_STRUCT_OPS(pvs_tick, struct task_struct *p)
{
	struct pvs_scx_grant *g;
	struct pvs_scx_vcpu *v;
	struct pvs_cpu_holder *h;
	bool lock = false, tracked;
	u32 cs = 0;

	if (!extension_ns)
		return;
	/* A holder running here has its lock flag noted at every tick (for
	 * holder_keeps_cpu); any other task only at its slice end. */
	h = cpu_holder_of(bpf_get_smp_processor_id());
	tracked = h && h->tid == (u32)p->pid;
	if (p->scx.slice && !tracked)
		return;
	g = grant_of(p);
	if (!g || !g->slot_addr)
		return;
	v = vcpu_of(p);
	if (!v)
		return;
	/* Used up: the stop that follows is its slice end, unless extended. */
	if (!p->scx.slice)
		v->slice_ended = 1;
	if (!slot_cs_flags(g, &cs)) {
		v->slot_read_failed++;
		__sync_fetch_and_add(&totals.slot_read_failed, 1);
		return;
	}
	if (tracked)
		h->lock = cs_lock_held(g, cs);
	/*
	 * An extension ran out with a lock still held: its tail, if due and a
	 * task waits for the CPU (else the dispatch keeps the vCPU running).
	 * The slice bounds it if its poll fails: the next tick ends it.
	 */
	if (!p->scx.slice && v->ext_in_slice && cs_lock_held(g, cs)) {
		if (!cpu_wanted(bpf_get_smp_processor_id(), p)) {
			__sync_fetch_and_add(&totals.slice_ends_uncontended, 1);
			return;
		}
		if (grant_tail(g, v, p->pid, cs)) {
			p->scx.slice = extension_tail_ns;
			v->slice_ended = 0;
			return;
		}
	}
	if (p->scx.slice || v->ext_in_slice)
		return;
	/*
	 * A lock holder: its guest marks it (CS_LOCK, which the daemon offers,
	 * and honours, only with lock holders honoured: grant.lock_peers), or
	 * another of its vCPUs names it waiting.
	 */
	if (!earns_extension(g, v, cs, &lock))
		return;
	/* Nothing waits for the CPU: the dispatch keeps the vCPU running. It
	 * is asked last: it walks every CPU's queue. */
	if (!cpu_wanted(bpf_get_smp_processor_id(), p)) {
		__sync_fetch_and_add(&totals.slice_ends_uncontended, 1);
		return;
	}
	if (grant_extension(v, lock, false)) {
		p->scx.slice = extension_ns;
		v->slice_ended = 0;
		start_ext_poll(p->pid);
	}
}

/*
 * A boost granted to a vCPU thread that waits in the vtime queue (it was
 * preempted or woke before the grant): the grant would only count at its
 * next enqueue, after its turn by vtime, while the interrupt that caused
 * the boost waits with it. The daemon runs this right after the grant: the
 * thread is moved ahead, preempting a weaker task on its CPU or joining
 * the boost queue. A lock-handling VM's vCPU on that CPU, whose slot cannot
 * be read on the daemon's thread, is left to its own CPU, which reads it
 * (preempt_checked_there): a holder in its lock is not preempted; the
 * thread runs at the end of the holder's extension, or of its slice. At
 * most 4096 queued tasks are looked at.
 */
SEC("syscall")
int pvs_boost_queued(struct pvs_scx_boost_queued *ctx)
{
	struct bpf_iter_scx_dsq it;
	struct task_struct *p;
	struct pvs_scx_grant *g;
	u32 tid = ctx->tid, n = 0;
	bool moved = false;

	s32 on = -1;

	/* The thread's CPU now, to look in that CPU's fair queue only. */
	p = bpf_task_from_pid(tid);
	if (p) {
		on = scx_bpf_task_cpu(p);
		bpf_task_release(p);
	}
	if (on < 0 || on >= PVS_MAX_CPUS) {
		ctx->moved = 0;
		return 0;
	}
	/* The iterator walks the queue under RCU. */
	bpf_rcu_read_lock();
	if (bpf_iter_scx_dsq_new(&it, fair_dsq(on), 0)) {
		bpf_iter_scx_dsq_destroy(&it);
		bpf_rcu_read_unlock();
		ctx->moved = 0;
		return 0;
	}
	while ((p = bpf_iter_scx_dsq_next(&it))) {
		if (++n > 4096)
			break;
		if ((u32)p->pid != tid)
			continue;
		g = bpf_map_lookup_elem(&scx_grants, &tid);
		if (!g || !g->boost)
			break;
		{
			s32 cpu = scx_bpf_task_cpu(p);

			struct pvs_scx_vcpu *v = vcpu_of(p);

			if (boost_on(cpu) < g->boost && lock_vcpu_on(cpu, tid)) {
				/* A lock-handling vCPU there: its CPU reads its
				 * slot before it is preempted. */
				moved = scx_bpf_dsq_move(&it, p, PVS_SCX_DSQ_BOOST, 0);
				if (moved)
					preempt_checked_there(cpu, PVS_SCX_CUT_GRANT);
			} else if (boost_on(cpu) < g->boost) {
				note_cut(cpu, PVS_SCX_CUT_GRANT);
				moved = scx_bpf_dsq_move(&it, p, SCX_DSQ_LOCAL_ON | cpu,
							 SCX_ENQ_PREEMPT);
			}
			else
				moved = scx_bpf_dsq_move(&it, p, PVS_SCX_DSQ_BOOST, 0);
			if (moved && v) {
				/* Its wait so far counts as a boosted one's. */
				if (v->queued_at)
					v->queued_boosted = 1;
				v->enq_boost = g->boost;
				v->enq_kreason = PVS_SCX_KR_NONE;
			}
		}
		break;
	}
	bpf_iter_scx_dsq_destroy(&it);
	bpf_rcu_read_unlock();
	if (moved)
		__sync_fetch_and_add(&totals.boost_moved, 1);
	ctx->moved = moved;
	return 0;
}

/* KVM_HC_SCHED_YIELD, include/uapi/linux/kvm_para.h. */
#define PVS_KVM_HC_SCHED_YIELD 11

/*
 * PVSCHED_F_EXT_NOTICE, the host's side: at each entry of a vCPU thread
 * into its guest, the slot's ext_notice is brought up to date: the number
 * of the extension the vCPU runs on now (31 bits, never 0), or 0. Written
 * here because the guest reads the word only while it runs, every run
 * starts with an entry, and here the vCPU thread is the current task (its
 * VMM's memory is the one mapped): a struct_ops program cannot write user
 * memory. Only for VMs whose lock holders are honoured. notice_shown is the
 * value written + 1; 0 (a record just handed out): not written yet.
 */
SEC("tp_btf/kvm_entry")
int BPF_PROG(pvs_notice_extension)
{
	u32 tid = (u32)bpf_get_current_pid_tgid(), want;
	struct pvs_scx_grant *g;
	struct pvs_scx_vcpu *v;

	g = bpf_map_lookup_elem(&scx_grants, &tid);
	if (!g || !g->lock_peers || !g->slot_addr)
		return 0;
	v = bpf_map_lookup_elem(&scx_vcpus, &g->record);
	if (!v)
		return 0;
	want = 0;
	if (v->ext_in_slice) {
		want = (u32)v->ext_count & 0x7fffffff;
		if (!want)
			want = 1;
	}
	if (v->notice_shown == want + 1)
		return 0;
	if (bpf_probe_write_user((void *)(g->slot_addr +
					  PVSCHED_OFFSETOF(struct pvsched_slot,
							   host.ext_notice)),
				 &want, sizeof(want))) {
		v->notice_write_failed++;
		__sync_fetch_and_add(&totals.notice_write_failed, 1);
		return 0;
	}
	v->notice_shown = want + 1;
	__sync_fetch_and_add(&totals.notice_writes, 1);
	return 0;
}

/*
 * PVSCHED_F_EXT_NOTICE, the guest's side seen: its vCPU made a yield to
 * nobody with pvsched's tag, which its module makes at a point out of its
 * sleeping locks while its slot shows an extension. The extension ends
 * here, as at a poll that finds the guest out of them: the kick takes the
 * CPU back before the vCPU enters the guest again, between two locks; its
 * stop charges what it ran. The current task is the vCPU thread.
 */
SEC("tp_btf/kvm_hypercall")
int BPF_PROG(pvs_guest_yield, unsigned long nr, unsigned long a0,
	     unsigned long a1, unsigned long a2, unsigned long a3)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	u32 key = bpf_get_smp_processor_id();
	struct pvs_scx_grant *g;
	struct pvs_scx_vcpu *v;
	struct pvs_ext_poll *e;

	if (nr != PVS_KVM_HC_SCHED_YIELD || a0 != PVSCHED_YIELD_TO_NONE ||
	    a1 != PVSCHED_YIELD_TAG)
		return 0;
	g = bpf_map_lookup_elem(&scx_grants, &tid);
	v = g ? bpf_map_lookup_elem(&scx_vcpus, &g->record) : NULL;
	if (!g || !v || !g->lock_peers)
		return 0;
	if (!v->ext_in_slice) {
		__sync_fetch_and_add(&totals.yields_unextended, 1);
		return 0;
	}
	/* Its poll has nothing left to end. */
	e = bpf_map_lookup_elem(&ext_poll, &key);
	if (e && e->tid == tid)
		e->tid = 0;
	v->ext_yielded++;
	__sync_fetch_and_add(&totals.ext_yielded, 1);
	note_cut(key, PVS_SCX_CUT_YIELD);
	scx_bpf_kick_cpu(key, SCX_KICK_PREEMPT);
	return 0;
}

void BPF_STRUCT_OPS(pvs_enable, struct task_struct *p)
{
	p->scx.dsq_vtime = vtime_now;
}

s32 BPF_STRUCT_OPS_SLEEPABLE(pvs_init)
{
	s32 err = scx_bpf_create_dsq(PVS_SCX_DSQ_BOOST, -1);
	u32 i;

	for (i = 0; !err && i < nr_cpu_ids && i < PVS_MAX_CPUS; i++)
		err = scx_bpf_create_dsq(fair_dsq(i), -1);
	for (i = 0; !err && extension_poll_ns && i < nr_cpu_ids && i < PVS_MAX_CPUS; i++) {
		u32 key = i;
		struct pvs_ext_poll *e = bpf_map_lookup_elem(&ext_poll, &key);

		if (!e)
			return -22; /* -EINVAL: the map is smaller than nr_cpu_ids */
		err = bpf_timer_init(&e->timer, &ext_poll, CLOCK_MONOTONIC);
		if (!err)
			err = bpf_timer_set_callback(&e->timer, ext_poll_fired);
	}
	return err;
}

void BPF_STRUCT_OPS(pvs_exit, struct scx_exit_info *ei)
{
	exit_info.kind = ei->kind;
	exit_info.exit_code = ei->exit_code;
	bpf_probe_read_kernel_str(exit_info.reason, sizeof(exit_info.reason),
				  ei->reason);
	bpf_probe_read_kernel_str(exit_info.msg, sizeof(exit_info.msg), ei->msg);
	exit_info.exited = 1;
}

SEC(".struct_ops.link")
struct sched_ext_ops pvsched_ops = {
	.select_cpu = (void *)pvs_select_cpu,
	.enqueue = (void *)pvs_enqueue,
	.dispatch = (void *)pvs_dispatch,
	.tick = (void *)pvs_tick,
	.running = (void *)pvs_running,
	.stopping = (void *)pvs_stopping,
	.enable = (void *)pvs_enable,
	.init = (void *)pvs_init,
	.exit = (void *)pvs_exit,
	.name = "pvsched",
};
