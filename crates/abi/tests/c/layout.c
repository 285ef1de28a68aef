// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * Every field of every struct in pvsched_abi.h with its offset and size, and
 * every constant, as the C compiler sees them. Read by tests/c_layout.rs.
 */
#include <stddef.h>
#include <stdint.h>
#include "pvsched_abi.h"

struct pvsched_c_field {
	const char *name;
	uint64_t offset;
	uint64_t size;
};

struct pvsched_c_const {
	const char *name;
	uint64_t value;
};

#define FIELD(type, member) \
	{ #type "." #member, offsetof(struct type, member), \
	  sizeof(((struct type *)0)->member) }
#define SIZE(type) { #type, 0, sizeof(struct type) }

const struct pvsched_c_field pvsched_c_fields[] = {
	SIZE(pvsched_header),
	FIELD(pvsched_header, magic),
	FIELD(pvsched_header, abi_major),
	FIELD(pvsched_header, abi_minor),
	FIELD(pvsched_header, header_size),
	FIELD(pvsched_header, slot_size),
	FIELD(pvsched_header, slot_count),
	FIELD(pvsched_header, doorbell),
	FIELD(pvsched_header, host_features),
	FIELD(pvsched_header, generation),
	FIELD(pvsched_header, host_reserved),
	FIELD(pvsched_header, guest_features),
	FIELD(pvsched_header, guest_generation),
	FIELD(pvsched_header, guest_abi_minor),
	FIELD(pvsched_header, guest_nr_cpus),
	FIELD(pvsched_header, guest_reserved),
	SIZE(pvsched_guest_half),
	FIELD(pvsched_guest_half, seq),
	FIELD(pvsched_guest_half, flags),
	FIELD(pvsched_guest_half, cs_flags),
	FIELD(pvsched_guest_half, policy),
	FIELD(pvsched_guest_half, rt_priority),
	FIELD(pvsched_guest_half, nice),
	FIELD(pvsched_guest_half, update_ns),
	FIELD(pvsched_guest_half, hardirq_count),
	FIELD(pvsched_guest_half, softirq_count),
	FIELD(pvsched_guest_half, nmi_count),
	FIELD(pvsched_guest_half, switch_count),
	FIELD(pvsched_guest_half, guest_pending),
	FIELD(pvsched_guest_half, boost_req_count),
	FIELD(pvsched_guest_half, lock_holder),
	FIELD(pvsched_guest_half, lock_flags),
	FIELD(pvsched_guest_half, lock_contended_count),
	FIELD(pvsched_guest_half, lock_preempted_count),
	FIELD(pvsched_guest_half, guest_reserved),
	SIZE(pvsched_host_half),
	FIELD(pvsched_host_half, seq),
	FIELD(pvsched_host_half, status),
	FIELD(pvsched_host_half, flags),
	FIELD(pvsched_host_half, policy),
	FIELD(pvsched_host_half, rt_priority),
	FIELD(pvsched_host_half, nice),
	FIELD(pvsched_host_half, update_ns),
	FIELD(pvsched_host_half, boost_count),
	FIELD(pvsched_host_half, throttle_count),
	FIELD(pvsched_host_half, preempt_count),
	FIELD(pvsched_host_half, boosted_ns),
	FIELD(pvsched_host_half, wake_p50_ns),
	FIELD(pvsched_host_half, wake_p99_ns),
	FIELD(pvsched_host_half, poll_budget_permille),
	FIELD(pvsched_host_half, host_reserved1),
	FIELD(pvsched_host_half, host_reserved),
	SIZE(pvsched_slot),
	FIELD(pvsched_slot, guest),
	FIELD(pvsched_slot, host),
};
const uint64_t pvsched_c_field_count =
	sizeof(pvsched_c_fields) / sizeof(pvsched_c_fields[0]);

#define CONST(name) { #name, (uint64_t)(name) }

const struct pvsched_c_const pvsched_c_consts[] = {
	CONST(PVSCHED_MAGIC), CONST(PVSCHED_ABI_MAJOR), CONST(PVSCHED_ABI_MINOR),
	CONST(PVSCHED_CACHELINE), CONST(PVSCHED_HEADER_SIZE),
	CONST(PVSCHED_SLOT_SIZE), CONST(PVSCHED_MAX_SLOTS),
	CONST(PVSCHED_READ_RETRIES),
	CONST(PVSCHED_F_HOST_HALF), CONST(PVSCHED_F_PENDING_HINT),
	CONST(PVSCHED_F_BOOST_REQUEST), CONST(PVSCHED_F_IDLE_HINTS),
	CONST(PVSCHED_F_DOORBELL), CONST(PVSCHED_F_LOCK_WAIT), CONST(PVSCHED_F_ALL),
	CONST(PVSCHED_LOCK_NONE), CONST(PVSCHED_LOCK_ANY), CONST(PVSCHED_LOCK_F_SPIN),
	CONST(PVSCHED_LOCK_F_READ), CONST(PVSCHED_LOCK_F_WRITE),
	CONST(PVSCHED_LOCK_F_MUTEX), CONST(PVSCHED_LOCK_F_SLEEP), CONST(PVSCHED_LOCK_F_ALL),
	CONST(PVSCHED_IVSHMEM_DOORBELL_REG),
	CONST(PVSCHED_GF_ACTIVE), CONST(PVSCHED_GF_IDLE),
	CONST(PVSCHED_GF_BOOST_REQ), CONST(PVSCHED_GF_ALL),
	CONST(PVSCHED_CS_NMI), CONST(PVSCHED_CS_HARDIRQ),
	CONST(PVSCHED_CS_SOFTIRQ), CONST(PVSCHED_CS_PREEMPT_OFF),
	CONST(PVSCHED_CS_LOCK), CONST(PVSCHED_CS_ALL),
	CONST(PVSCHED_POLICY_NORMAL), CONST(PVSCHED_POLICY_FIFO),
	CONST(PVSCHED_POLICY_RR), CONST(PVSCHED_POLICY_BATCH),
	CONST(PVSCHED_POLICY_IDLE), CONST(PVSCHED_POLICY_DEADLINE),
	CONST(PVSCHED_PENDING_VALID), CONST(PVSCHED_PENDING_PRIO_MASK),
	CONST(PVSCHED_PENDING_POLICY_SHIFT), CONST(PVSCHED_PENDING_POLICY_MASK),
	CONST(PVSCHED_PENDING_RESERVED),
	CONST(PVSCHED_HS_UNKNOWN), CONST(PVSCHED_HS_RUNNING),
	CONST(PVSCHED_HS_PREEMPTED), CONST(PVSCHED_HS_HALTED),
	CONST(PVSCHED_HF_BOOSTED), CONST(PVSCHED_HF_THROTTLED),
	CONST(PVSCHED_HF_OVERLOADED), CONST(PVSCHED_HF_IN_DEBT),
	CONST(PVSCHED_HOST_POLICY_OTHER), CONST(PVSCHED_HOST_POLICY_FIFO),
	CONST(PVSCHED_HOST_POLICY_RR), CONST(PVSCHED_HOST_POLICY_BATCH),
	CONST(PVSCHED_HOST_POLICY_IDLE),
	CONST(PVSCHED_REGION_BYTES(3)),
};
const uint64_t pvsched_c_const_count =
	sizeof(pvsched_c_consts) / sizeof(pvsched_c_consts[0]);
