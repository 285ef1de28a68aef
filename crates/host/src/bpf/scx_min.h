/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What sched_ext.bpf.c needs of the kernel's sched_ext: the ops table, the
 * task fields it reads and writes, the exit info, the constants and the
 * kfuncs. Declared here instead of a full vmlinux.h, as vmlinux_min.h does
 * for the event programs:
 *
 * - structs carry preserve_access_index: libbpf relocates every field access
 *   against the running kernel's BTF (CO-RE), so the layout below only
 *   names fields, it does not fix offsets;
 * - struct sched_ext_ops lists only the members the scheduler sets: libbpf
 *   matches a struct_ops map's members to the kernel's by name;
 * - the constants are the kernel's enum values (kernel/sched/ext_internal.h,
 *   identical from 6.12 to 7.3); `bpf_core_enum_value` would only rename them;
 * - the kfuncs use the names of Linux >= 6.13 (scx_bpf_dsq_insert, ...);
 *   on an older kernel the program fails to load and pvschedd falls back to
 *   the rt backend, saying why.
 */
#ifndef __PVSCHED_SCX_MIN_H
#define __PVSCHED_SCX_MIN_H

struct cpumask;
struct scx_init_task_args;

struct sched_ext_entity {
	u32 flags;
	u32 weight;
	u64 slice;
	u64 dsq_vtime;
} __attribute__((preserve_access_index));

/* sched_ext_entity.flags: the task is runnable (enum scx_ent_flags). */
#define SCX_TASK_QUEUED		(1 << 0)

/* The fair class's accounting, which the kernel keeps for sched_ext tasks
 * too (update_curr_scx, before ops.stopping). */
struct sched_entity {
	u64 sum_exec_runtime;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	int nr_cpus_allowed;
	struct sched_entity se;
	struct sched_ext_entity scx;
} __attribute__((preserve_access_index));

enum scx_exit_kind {
	SCX_EXIT_NONE = 0,
};

struct scx_exit_info {
	enum scx_exit_kind kind;
	s64 exit_code;
	const char *reason;
	char *msg;
} __attribute__((preserve_access_index));

struct sched_ext_ops {
	s32 (*select_cpu)(struct task_struct *p, s32 prev_cpu, u64 wake_flags);
	void (*enqueue)(struct task_struct *p, u64 enq_flags);
	void (*dispatch)(s32 cpu, struct task_struct *prev);
	void (*tick)(struct task_struct *p);
	void (*running)(struct task_struct *p);
	void (*stopping)(struct task_struct *p, bool runnable);
	void (*enable)(struct task_struct *p);
	s32 (*init)(void);
	void (*exit)(struct scx_exit_info *ei);
	u64 flags;
	u32 timeout_ms;
	char name[128];
};

/* Built-in dispatch queues and flags. */
#define SCX_DSQ_FLAG_BUILTIN	(1ULL << 63)
#define SCX_DSQ_LOCAL		(SCX_DSQ_FLAG_BUILTIN | 2)
#define SCX_DSQ_LOCAL_ON	(SCX_DSQ_FLAG_BUILTIN | (1ULL << 62))
#define SCX_ENQ_WAKEUP		(1ULL << 0)
#define SCX_ENQ_PREEMPT		(1ULL << 32)
#define SCX_KICK_IDLE		(1ULL << 0)
#define SCX_KICK_PREEMPT	(1ULL << 1)
#define SCX_SLICE_DFL		20000000ULL

/* Open-coded iteration over a dispatch queue (BPF_PROG_TYPE_SYSCALL too). */
struct bpf_iter_scx_dsq {
	u64 __opaque[6];
} __attribute__((aligned(8)));

void bpf_rcu_read_lock(void) __ksym;
void bpf_rcu_read_unlock(void) __ksym;
int bpf_iter_scx_dsq_new(struct bpf_iter_scx_dsq *it, u64 dsq_id, u64 flags) __ksym;
struct task_struct *bpf_iter_scx_dsq_next(struct bpf_iter_scx_dsq *it) __ksym;
void bpf_iter_scx_dsq_destroy(struct bpf_iter_scx_dsq *it) __ksym;
bool scx_bpf_dsq_move(struct bpf_iter_scx_dsq *it__iter, struct task_struct *p,
		      u64 dsq_id, u64 enq_flags) __ksym;

s32 scx_bpf_create_dsq(u64 dsq_id, s32 node) __ksym;
s32 scx_bpf_select_cpu_dfl(struct task_struct *p, s32 prev_cpu, u64 wake_flags,
			   bool *is_idle) __ksym;
void scx_bpf_dsq_insert(struct task_struct *p, u64 dsq_id, u64 slice,
			u64 enq_flags) __ksym;
void scx_bpf_dsq_insert_vtime(struct task_struct *p, u64 dsq_id, u64 slice,
			      u64 vtime, u64 enq_flags) __ksym;
bool scx_bpf_dsq_move_to_local(u64 dsq_id) __ksym;
s32 scx_bpf_dsq_nr_queued(u64 dsq_id) __ksym;
void scx_bpf_kick_cpu(s32 cpu, u64 flags) __ksym;
s32 scx_bpf_task_cpu(const struct task_struct *p) __ksym;
s32 scx_bpf_pick_idle_cpu(const struct cpumask *cpus_allowed, u64 flags) __ksym;
/* Open-coded numeric iteration: a loop over CPUs the verifier checks once. */
struct bpf_iter_num {
	u64 __opaque[1];
} __attribute__((aligned(8)));

int bpf_iter_num_new(struct bpf_iter_num *it, int start, int end) __ksym;
int *bpf_iter_num_next(struct bpf_iter_num *it) __ksym;
void bpf_iter_num_destroy(struct bpf_iter_num *it) __ksym;
struct task_struct *bpf_task_from_pid(s32 pid) __ksym;
void bpf_task_release(struct task_struct *p) __ksym;

/* A BPF timer (include/uapi/linux/bpf.h), for the extension's poll. */
struct bpf_timer {
	u64 __opaque[2];
} __attribute__((aligned(8)));

#define CLOCK_MONOTONIC		1
/* bpf_timer_start: fire on the CPU that started it (Linux >= 6.7). */
#define BPF_F_TIMER_CPU_PIN	(1ULL << 1)

#endif /* __PVSCHED_SCX_MIN_H */
