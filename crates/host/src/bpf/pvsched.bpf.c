// SPDX-License-Identifier: GPL-2.0
/*
 * pvsched host event sources.
 *
 * Turns scheduler and KVM tracepoints into a low-rate stream of vCPU state
 * changes for pvschedd. Everything is filtered here, in the kernel: only
 * threads the daemon registered in `tracked` (vCPU threads) or processes in
 * `vmm_tgid` (VMMs) produce records, and only state changes are reported.
 * See README.md next to this file for the record format and what fires where.
 *
 * Programs:
 *   tp_btf/sched_switch        SWITCH_OUT (runnable or blocked), SWITCH_IN;
 *                              preemptions by the daemon itself hidden
 *   tp_btf/sched_waking        WAKING, with who woke it (vCPU / VMM / IRQ)
 *   tp_btf/{irq_handler,softirq,hrtimer_expire}_{entry,exit}
 *                              per-CPU IRQ-context depth, for sched_waking
 *   tp/kvm/kvm_exit            KVM_EXIT, HLT and PAUSE only      (KVM only)
 *   raw_tp/kvm_vcpu_wakeup     KVM_WAKEUP, halt duration         (KVM only)
 *   raw_tp/kvm_apic_accept_irq KVM_IRQ, interrupt for a vCPU     (KVM only)
 *   raw_tp (no target)         pvs_kvm_exit_test: the kvm_exit filter, driven
 *                              by BPF_PROG_TEST_RUN in tests; never attached
 *
 * The KVM programs are optional: the loader retries without them if they
 * fail to load, and attaches each on its own.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "intf.h"

char LICENSE[] SEC("license") = "GPL";

/*
 * Tunables, set by the loader before load (mirrored by BpfOptions in
 * events.rs). The verifier sees them as constants and removes dead paths.
 */

/* Emit SWITCH_IN when a tracked thread gets a CPU (SWITCH_OUT is always on). */
const volatile bool emit_switch_in = true;
/* Emit WAKING when a tracked thread is woken. */
const volatile bool emit_waking = true;
/* Emit KVM_EXIT for HLT exits of tracked threads. */
const volatile bool emit_hlt_exits = true;
/* Emit KVM_EXIT for PAUSE exits (pause-loop exiting: can be frequent). */
const volatile bool emit_pause_exits = true;
/* Emit KVM_WAKEUP (halt durations, for halt-poll tuning). */
const volatile bool emit_kvm_wakeup = true;
/* Emit KVM_IRQ for interrupts accepted by a vCPU of a registered VMM. */
const volatile bool emit_kvm_irq = true;
/* The irq/softirq/hrtimer entry-exit programs are attached: wakeups done in
 * those contexts are flagged PVS_F_WAKER_IRQ instead of being blamed on the
 * interrupted task. */
const volatile bool track_irq_context = true;
/* Honour the daemon's `lazy` bits (enum pvs_lazy). Off: every record may
 * wake the daemon (the ring buffer's own rule: only when it has caught up). */
const volatile bool lazy_wakeup = true;

/*
 * Not read by any program: puts the intf.h types into the object's BTF so
 * that libbpf-cargo generates them in the Rust skeleton, where tests check
 * the hand-written decoder in events.rs against them.
 */
const volatile struct pvs_intf_types {
	struct pvs_event event;
	struct pvs_vcpu vcpu;
	enum pvs_lazy lazy;
	enum pvs_event_kind kind;
	enum pvs_event_flag flag;
	enum pvs_stat stat;
} pvs_intf_types = {};

/*
 * A wakeup of a tracked thread whose CPU (the one it last ran on, where the
 * scheduler places a wakee whose CPU is idle) runs its idle task is queued
 * without waking the daemon, whatever its lazy bits say: the thread gets
 * that CPU at once, so a boost would change nothing, while the daemon's own
 * wakeup (FIFO, above the vCPU) would take a CPU first and cost an IPI.
 * Needs lazy_wakeup.
 */
const volatile bool quiet_idle_wakeups = true;

/*
 * With quiet_idle_wakeups: a wakeup is also quiet when any CPU runs its idle
 * task (idle_cpus > 0), not only the thread's last one: the fair class's
 * wakeup placement (select_idle_sibling) finds an idle CPU of the last CPU's
 * LLC, and a boost would make the thread preempt whatever runs on its
 * runqueue in place instead. Only for a thread allowed on every CPU (a
 * pinned vCPU cannot move to the idle one). Right on a host with one LLC; on
 * one with several, placement may leave a wakee on a busy LLC while another
 * idles (switch it off there).
 */
const volatile bool quiet_any_idle_wakeups = true;
/* Online CPUs at load, set by the loader (the affinity check above). */
const volatile u32 nr_cpus = 1;

/*
 * Flag a tracked thread's preemption, halt and wakeup PVS_F_NO_RIVAL when no
 * CPU runs a task from outside its VM: each runs its idle task, the daemon
 * or a thread of the same process. The policy then starts no speculative
 * boost: it would only reorder the VM's own threads, and the RT class's push
 * and pull would stack two of its vCPUs on one CPU while another idles. And
 * PVS_F_NO_HOST_RIVAL when every such task is a thread of a VM the daemon
 * serves (vmm_tgid): those get the same boosts (peer_vms_are_rivals). Each CPU
 * keeps the process it runs, and whether it is a served VM's, in its line of
 * cpu_lines (stores only when that changes); the check reads every possible
 * CPU's line (bpf_loop), stopping at the first rival that is no served VM's.
 */
const volatile bool find_rivals = true;
/* Possible CPUs (the cpu_lines map's size), set by the loader. */
const volatile u32 nr_cpu_ids = 1;

/* How many CPUs run their idle task: changed only when a line's idle flips. */
s64 idle_cpus;

/*
 * The daemon's own process (set by the loader). A tracked thread that the
 * daemon preempts is not reported: the daemon was woken by an event of that
 * thread, and reporting the preemption it caused would wake it again, and
 * again (feedback loop; measured: 1.4 M events for 10 k sleeps). If the CPU
 * then goes to a third task instead of back to the thread, the preemption
 * is reported then. 0: off.
 */
const volatile u32 self_tgid = 0;

/* Thread id -> {vm, vcpu}: the vCPU threads. Filled by the daemon. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096); /* resized by the loader */
	__type(key, u32);
	__type(value, struct pvs_vcpu);
} tracked SEC(".maps");

/* VMM process id (tgid) -> vm. Filled by the daemon. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256); /* resized by the loader */
	__type(key, u32);
	__type(value, u32);
} vmm_tgid SEC(".maps");

/* Slot (pvs_vcpu.lazy_slot) -> enum pvs_lazy bits. The daemon mmaps it
 * and writes a slot whenever its view of that vCPU changes: no syscall.
 * u64 values: array elements are 8-byte aligned, so the mmap holds one
 * u64 per slot whatever the value type; saying so keeps both sides equal. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 4096); /* resized by the loader, = tracked */
	__type(key, u32);
	__type(value, u64);
} lazy SEC(".maps");

/* vCPU (struct pvs_vcpu_key) -> its lazy_slot, as in `tracked`. Filled by
 * the daemon beside `tracked`: KVM_IRQ finds its target's lazy bits here. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096); /* resized by the loader, = tracked */
	__type(key, struct pvs_vcpu_key);
	__type(value, u32);
} vcpu_slots SEC(".maps");

/* CPU -> whether it runs its idle task (quiet_idle_wakeups) and whose task
 * it runs (find_rivals). Written by that CPU only, at sched_switch, when it
 * changes; read by other CPUs. One cache line per CPU, so no two CPUs write
 * the same line. */
struct pvs_cpu_line {
	u64 idle;
	/* find_rivals: the tgid of the task it runs; 0 for its idle task and
	 * the daemon (neither is anyone's rival) */
	u32 owner;
	/* whether owner was a served VM's process (vmm_tgid) when it took the
	 * CPU, or when one of its tracked threads last switched in here: a VM
	 * registered while its process holds this CPU counts as a host task
	 * until then (boosts allowed: the old rule) */
	u32 owner_served;
	u64 pad[6];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024); /* resized by the loader: possible CPUs */
	__type(key, u32);
	__type(value, struct pvs_cpu_line);
} cpu_lines SEC(".maps");

/* The one ring buffer to user space (struct pvs_event records). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024); /* resized by the loader */
} events SEC(".maps");

/* Per-CPU counters, enum pvs_stat. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PVS_STAT_NR);
	__type(key, u32);
	__type(value, u64);
} stats SEC(".maps");

/*
 * Kernel types, only the fields read, as CO-RE flavours: libbpf relocates
 * each access against the running kernel's BTF, whatever vmlinux.h says.
 */
struct task_struct___pvs {
	int pid;
	int tgid;
	unsigned int __state; /* >= 5.14 */
	unsigned int cpu; /* >= 5.16, SMP */
	int nr_cpus_allowed;
} __attribute__((preserve_access_index));

struct task_struct___pvs_old {
	long state; /* < 5.14 */
} __attribute__((preserve_access_index));

/* tracefs record of kvm:kvm_exit (arch/x86/kvm/trace.h) */
struct trace_event_raw_kvm_exit___pvs {
	unsigned int exit_reason;
	u32 isa;
} __attribute__((preserve_access_index));

/*
 * Per-CPU state. irq_depth: how deep this CPU is in hard-IRQ handlers,
 * softirqs and hrtimer callbacks (entry/exit programs below); a wakeup done
 * there is not the current task's doing. None of these regions can
 * schedule, so sched_switch resets it: a missed exit heals at once.
 * hidden_tid: the tracked thread the daemon preempted on this CPU, and
 * hidden_seq its switch_seq then: if it has been switched in since (pulled
 * to another CPU while the daemon ran here), that preemption is over;
 * hidden_tgid its process (find_rivals).
 */
struct pvs_cpu_state {
	u32 irq_depth;
	u32 hidden_tid;
	u32 hidden_seq;
	u32 hidden_tgid;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct pvs_cpu_state);
} cpu_state SEC(".maps");

static __always_inline void stat_inc(u32 idx)
{
	u64 *v = bpf_map_lookup_elem(&stats, &idx);

	if (v)
		(*v)++;
}

static __always_inline struct pvs_event *reserve(u32 kind)
{
	struct pvs_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		stat_inc(PVS_STAT_DROPPED);
		return NULL;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->kind = kind;
	e->flags = 0;
	e->cpu = bpf_get_smp_processor_id();
	e->arg = 0;
	return e;
}

static __always_inline void submit(struct pvs_event *e)
{
	/* Lazy records of other vCPUs may be waiting unread: the ring buffer's
	 * own rule (wake only a consumer that has caught up) would not wake. */
	bpf_ringbuf_submit(e, lazy_wakeup ? BPF_RB_FORCE_WAKEUP : 0);
	stat_inc(PVS_STAT_EMITTED);
}

/* Submits e without a wakeup, flagged so: the daemon reads it late. */
static __always_inline void submit_quiet(struct pvs_event *e)
{
	e->flags |= PVS_F_QUIET;
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	stat_inc(PVS_STAT_EMITTED);
	stat_inc(PVS_STAT_LAZY);
}

/* Submits e, without a wakeup if the daemon marked class (enum pvs_lazy)
 * lazy for vCPU v, or marked PVS_LAZY_NO_RIVAL (PVS_LAZY_NO_HOST_RIVAL) and
 * e says no rival (none but served VMs). */
static __always_inline void submit_for(struct pvs_event *e, const struct pvs_vcpu *v, u32 class)
{
	u32 slot = v->lazy_slot;
	u64 *bits, b;

	if (lazy_wakeup) {
		bits = bpf_map_lookup_elem(&lazy, &slot);
		b = bits ? *(volatile u64 *)bits : 0;
		if ((b & class) || ((b & PVS_LAZY_NO_RIVAL) && (e->flags & PVS_F_NO_RIVAL)) ||
		    ((b & PVS_LAZY_NO_HOST_RIVAL) && (e->flags & PVS_F_NO_HOST_RIVAL))) {
			submit_quiet(e);
			return;
		}
	}
	submit(e);
}

static __always_inline struct pvs_cpu_state *this_cpu_state(void)
{
	u32 zero = 0;

	return bpf_map_lookup_elem(&cpu_state, &zero);
}

/* True inside a hard-IRQ handler, softirq or hrtimer callback. */
static __always_inline bool in_irq_context(void)
{
	struct pvs_cpu_state *c = this_cpu_state();

	return c && c->irq_depth > 0;
}

static __always_inline void irq_depth_add(int delta)
{
	struct pvs_cpu_state *c = this_cpu_state();

	if (!c)
		return;
	if (delta > 0)
		c->irq_depth += 1;
	else if (c->irq_depth > 0)
		c->irq_depth -= 1;
}

static __always_inline unsigned int task_state(struct task_struct___pvs *t)
{
	if (bpf_core_field_exists(t->__state))
		return BPF_CORE_READ(t, __state);
	return (unsigned int)BPF_CORE_READ((struct task_struct___pvs_old *)t, state);
}

struct rival_search {
	u32 tgid;
	bool found;
	bool found_host;
};

static long rival_on_cpu(u32 cpu, void *ctx)
{
	struct rival_search *s = ctx;
	struct pvs_cpu_line *l = bpf_map_lookup_elem(&cpu_lines, &cpu);
	u32 owner;

	if (!l)
		return 1;
	owner = *(volatile u32 *)&l->owner;
	if (owner && owner != s->tgid) {
		s->found = true;
		if (!*(volatile u32 *)&l->owner_served) {
			s->found_host = true;
			return 1; /* stop */
		}
	}
	return 0;
}

/* PVS_F_NO_RIVAL | PVS_F_NO_HOST_RIVAL if no CPU runs a task from outside
 * process tgid, PVS_F_NO_HOST_RIVAL if only served VMs' (find_rivals). */
static __always_inline u32 rival_flag(u32 tgid)
{
	struct rival_search s = { .tgid = tgid };

	if (!find_rivals)
		return 0;
	bpf_loop(nr_cpu_ids, rival_on_cpu, &s, 0);
	if (s.found_host)
		return 0;
	return s.found ? PVS_F_NO_HOST_RIVAL : PVS_F_NO_RIVAL | PVS_F_NO_HOST_RIVAL;
}

static __always_inline void emit_switch(u32 kind, u32 tid, struct pvs_vcpu *v, u32 flags,
					u32 other_tid)
{
	struct pvs_event *e = reserve(kind);

	if (!e)
		return;
	e->tid = tid;
	e->vm = v->vm;
	e->vcpu = v->vcpu;
	e->flags = flags;
	e->arg = other_tid;
	if (kind == PVS_EV_SWITCH_IN)
		submit_for(e, v, PVS_LAZY_SWITCH_IN);
	else
		submit_for(e, v, (flags & PVS_F_RUNNABLE) ? PVS_LAZY_PREEMPTED : PVS_LAZY_BLOCKED);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(pvs_sched_switch, bool preempt, struct task_struct___pvs *prev,
	     struct task_struct___pvs *next)
{
	u32 prev_tid = prev->pid, next_tid = next->pid;
	struct pvs_cpu_state *c = this_cpu_state();
	u32 hidden = 0;
	bool runnable;
	struct pvs_vcpu *v, *v_next = bpf_map_lookup_elem(&tracked, &next_tid);

	if (c) {
		c->irq_depth = 0; /* nothing schedules inside IRQ context */
		hidden = c->hidden_tid;
	}
	if ((quiet_idle_wakeups && lazy_wakeup) || find_rivals) {
		u32 cpu = bpf_get_smp_processor_id();
		struct pvs_cpu_line *l = bpf_map_lookup_elem(&cpu_lines, &cpu);
		u64 idle = next_tid == 0; /* the idle task is pid 0 on every CPU */
		u32 owner = (u32)next->tgid;

		if (idle || (self_tgid && owner == self_tgid))
			owner = 0;
		if (l && quiet_idle_wakeups && lazy_wakeup && l->idle != idle) {
			*(volatile u64 *)&l->idle = idle;
			__sync_fetch_and_add(&idle_cpus, idle ? 1 : -1);
		}
		/* A tracked thread's process is served: its switch-in also
		 * mends a line written before its VM was registered. */
		if (l && find_rivals &&
		    (l->owner != owner || (!l->owner_served && v_next))) {
			u32 served = owner && bpf_map_lookup_elem(&vmm_tgid, &owner);

			*(volatile u32 *)&l->owner = owner;
			if (l->owner_served != served)
				*(volatile u32 *)&l->owner_served = served;
		}
	}

	v = bpf_map_lookup_elem(&tracked, &prev_tid);
	if (v) {
		/* preempted, or woken between set_current_state() and
		 * schedule(): it stays on the runqueue */
		runnable = preempt || task_state(prev) == 0 /* TASK_RUNNING */;
		if (runnable && self_tgid && (u32)next->tgid == self_tgid && c) {
			c->hidden_tid = prev_tid; /* the daemon's doing: see self_tgid */
			c->hidden_seq = v->switch_seq;
			c->hidden_tgid = prev->tgid;
		} else
			emit_switch(PVS_EV_SWITCH_OUT, prev_tid, v,
				    (runnable ? PVS_F_RUNNABLE : 0) | rival_flag(prev->tgid),
				    next_tid);
	}

	if (hidden && c && (u32)prev->tgid == self_tgid) {
		/* the daemon leaves the CPU it took from a tracked thread */
		c->hidden_tid = 0;
		if (next_tid == hidden)
			return 0; /* back to it: nothing happened */
		v = bpf_map_lookup_elem(&tracked, &hidden);
		/* someone else runs: now it is a real preemption, unless the
		 * thread ran elsewhere meanwhile (its switch-in was reported) */
		if (v && v->switch_seq == c->hidden_seq)
			emit_switch(PVS_EV_SWITCH_OUT, hidden, v,
				    PVS_F_RUNNABLE | rival_flag(c->hidden_tgid), next_tid);
	}

	v = v_next;
	if (!v)
		return 0;
	v->switch_seq++; /* one CPU at a time switches a thread in */
	if (emit_switch_in)
		emit_switch(PVS_EV_SWITCH_IN, next_tid, v, 0, prev_tid);
	return 0;
}

SEC("tp_btf/sched_waking")
int BPF_PROG(pvs_sched_waking, struct task_struct___pvs *p)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 waker_tid = (u32)id, waker_tgid = id >> 32;
	u32 tid = p->pid;
	struct pvs_vcpu *v, *w;
	struct pvs_event *e;

	if (!emit_waking)
		return 0;
	v = bpf_map_lookup_elem(&tracked, &tid);
	/* p == current: it never left the CPU, not a state change */
	if (!v || tid == waker_tid)
		return 0;

	e = reserve(PVS_EV_WAKING);
	if (!e)
		return 0;
	e->tid = tid;
	e->vm = v->vm;
	e->vcpu = v->vcpu;
	e->arg = waker_tid;
	/* task_cpu(p), as the tracefs record's target_cpu: the CPU it last ran
	 * on (select_task_rq() runs after this tracepoint) */
	if (bpf_core_field_exists(p->cpu))
		e->cpu = p->cpu;
	if (track_irq_context && in_irq_context()) {
		e->flags = PVS_F_WAKER_IRQ;
	} else {
		w = bpf_map_lookup_elem(&tracked, &waker_tid);
		if (w && w->vm == v->vm)
			e->flags = PVS_F_WAKER_VCPU;
		else if (waker_tgid == (u32)p->tgid)
			e->flags = PVS_F_WAKER_SAME_VMM;
	}
	e->flags |= rival_flag(p->tgid);
	if (quiet_idle_wakeups && lazy_wakeup) {
		u32 cpu = e->cpu;
		struct pvs_cpu_line *l = bpf_map_lookup_elem(&cpu_lines, &cpu);

		if ((l && *(volatile u64 *)&l->idle) ||
		    (quiet_any_idle_wakeups && *(volatile s64 *)&idle_cpus > 0 &&
		     (u32)p->nr_cpus_allowed >= nr_cpus)) {
			e->flags |= PVS_F_CPU_IDLE;
			submit_quiet(e);
			return 0;
		}
	}
	submit_for(e, v, PVS_LAZY_WAKING);
	return 0;
}

/*
 * IRQ-context bookkeeping for sched_waking. Covers device IRQ handlers,
 * softirqs run on IRQ exit, and every hrtimer callback (the LAPIC timer of
 * a KVM guest, nanosleep/ppoll timeouts of a VMM). x86 system vectors that
 * wake tasks outside these (posted-interrupt wakeup) are not covered.
 */
SEC("tp_btf/irq_handler_entry")
int BPF_PROG(pvs_irq_entry)
{
	irq_depth_add(1);
	return 0;
}

SEC("tp_btf/irq_handler_exit")
int BPF_PROG(pvs_irq_exit)
{
	irq_depth_add(-1);
	return 0;
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(pvs_softirq_entry)
{
	irq_depth_add(1);
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(pvs_softirq_exit)
{
	irq_depth_add(-1);
	return 0;
}

SEC("tp_btf/hrtimer_expire_entry")
int BPF_PROG(pvs_hrtimer_entry)
{
	irq_depth_add(1);
	return 0;
}

SEC("tp_btf/hrtimer_expire_exit")
int BPF_PROG(pvs_hrtimer_exit)
{
	irq_depth_add(-1);
	return 0;
}

/* Shared by the tracepoint program and its test twin. */
static __always_inline int handle_kvm_exit(u32 reason, u32 isa)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	u32 flags;
	struct pvs_vcpu *v;
	struct pvs_event *e;

	/* cheapest test first: kvm_exit fires on every exit of every VM */
	if (isa == PVS_KVM_ISA_VMX) {
		u32 basic = reason & 0xffff;

		if (basic == PVS_VMX_EXIT_HLT)
			flags = PVS_F_EXIT_HLT | PVS_F_ISA_VMX;
		else if (basic == PVS_VMX_EXIT_PAUSE)
			flags = PVS_F_EXIT_PAUSE | PVS_F_ISA_VMX;
		else
			return 0;
	} else if (isa == PVS_KVM_ISA_SVM) {
		if (reason == PVS_SVM_EXIT_HLT)
			flags = PVS_F_EXIT_HLT;
		else if (reason == PVS_SVM_EXIT_PAUSE)
			flags = PVS_F_EXIT_PAUSE;
		else
			return 0;
	} else {
		return 0;
	}
	if ((flags & PVS_F_EXIT_HLT) && !emit_hlt_exits)
		return 0;
	if ((flags & PVS_F_EXIT_PAUSE) && !emit_pause_exits)
		return 0;

	v = bpf_map_lookup_elem(&tracked, &tid);
	if (!v)
		return 0;
	e = reserve(PVS_EV_KVM_EXIT);
	if (!e)
		return 0;
	e->tid = tid;
	e->vm = v->vm;
	e->vcpu = v->vcpu;
	e->flags = flags;
	e->arg = reason;
	submit_for(e, v, PVS_LAZY_KVM_EXIT);
	return 0;
}

SEC("tp/kvm/kvm_exit")
int pvs_kvm_exit(struct trace_event_raw_kvm_exit___pvs *ctx)
{
	return handle_kvm_exit(ctx->exit_reason, ctx->isa);
}

/* Test twin of pvs_kvm_exit: args (exit_reason, isa) via BPF_PROG_TEST_RUN. */
SEC("raw_tp")
int BPF_PROG(pvs_kvm_exit_test, u32 exit_reason, u32 isa)
{
	return handle_kvm_exit(exit_reason, isa);
}

/* TP_PROTO(__u64 ns, bool waited, bool valid), in the vCPU thread. */
SEC("raw_tp/kvm_vcpu_wakeup")
int BPF_PROG(pvs_kvm_vcpu_wakeup, u64 ns, bool waited, bool valid)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	struct pvs_vcpu *v;
	struct pvs_event *e;

	if (!emit_kvm_wakeup)
		return 0;
	v = bpf_map_lookup_elem(&tracked, &tid);
	if (!v)
		return 0;
	e = reserve(PVS_EV_KVM_WAKEUP);
	if (!e)
		return 0;
	e->tid = tid;
	e->vm = v->vm;
	e->vcpu = v->vcpu;
	e->arg = ns;
	e->flags = (waited ? PVS_F_WAITED : 0) | (valid ? PVS_F_POLL_VALID : 0);
	submit_for(e, v, PVS_LAZY_KVM_WAKEUP);
	return 0;
}

/*
 * TP_PROTO(__u32 apicid, __u16 dm, __u16 tm, __u8 vec). "apicid" is the
 * target's KVM vcpu_id, which QEMU sets to the APIC ID; we report it as the
 * vCPU index (true for contiguous topologies, see README). The record has
 * no VM: the VM is the one whose VMM process (tgid) is current, which holds
 * for IPIs (sent by a vCPU thread) and for irqfd/MSI injection by VMM
 * threads (I/O threads, vhost workers >= 6.4), not for hard-IRQ injection.
 */
SEC("raw_tp/kvm_apic_accept_irq")
int BPF_PROG(pvs_kvm_apic_accept_irq, u32 apicid, u16 dm, u16 tm, u8 vec)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = (u32)id, tgid = id >> 32;
	struct pvs_vcpu target = {};
	struct pvs_vcpu_key key;
	struct pvs_event *e;
	struct pvs_vcpu *v;
	u32 *vm, *slot;
	u32 vm_id;

	if (!emit_kvm_irq)
		return 0;
	v = bpf_map_lookup_elem(&tracked, &tid);
	if (v) {
		/*
		 * Injected in the target's own thread (its timers, self-IPIs):
		 * the target runs, nothing to decide.
		 */
		if (v->vcpu == apicid)
			return 0;
		vm_id = v->vm;
	} else {
		vm = bpf_map_lookup_elem(&vmm_tgid, &tgid);
		if (!vm)
			return 0;
		vm_id = *vm;
	}
	e = reserve(PVS_EV_KVM_IRQ);
	if (!e)
		return 0;
	e->tid = tid;
	e->vm = vm_id;
	e->vcpu = apicid;
	e->arg = vec;
	/* The target's lazy bits decide (an IPI storm between a VM's own
	 * vCPUs woke the daemon for each, to boost nothing). The sender and
	 * the target share the process: its rivals are the target's, looked
	 * for only when there are bits to read. */
	key.vm = vm_id;
	key.vcpu = apicid;
	slot = bpf_map_lookup_elem(&vcpu_slots, &key);
	if (slot) {
		e->flags = rival_flag(tgid);
		target.lazy_slot = *slot;
		submit_for(e, &target, PVS_LAZY_KVM_IRQ);
	} else {
		submit(e);
	}
	return 0;
}
