/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Minimal stand-in for a bpftool-generated vmlinux.h: only what
 * pvsched.bpf.c and libbpf's bpf_helpers.h / bpf_tracing.h /
 * bpf_core_read.h need. build.rs copies it to $OUT_DIR/vmlinux/vmlinux.h
 * unless PVSCHED_VMLINUX_H asks for a generated one (see README.md).
 *
 * Kernel structs are NOT declared here: pvsched.bpf.c declares the few
 * fields it reads as `___pvs` flavours with preserve_access_index, so the
 * program is identical whichever vmlinux.h is used and libbpf relocates
 * every field access against the running kernel's BTF (CO-RE).
 * The values below are kernel UAPI (include/uapi/linux/bpf.h): stable.
 */
#ifndef __VMLINUX_H__
#define __VMLINUX_H__

typedef signed char __s8;
typedef unsigned char __u8;
typedef short __s16;
typedef unsigned short __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long __s64;
typedef unsigned long long __u64;

typedef __s8 s8;
typedef __u8 u8;
typedef __s16 s16;
typedef __u16 u16;
typedef __s32 s32;
typedef __u32 u32;
typedef __s64 s64;
typedef __u64 u64;

typedef __u16 __be16;
typedef __u32 __be32;
typedef __u64 __be64;
typedef __u32 __wsum;

typedef _Bool bool;
enum { false = 0, true = 1 };

typedef int pid_t;

enum bpf_map_type {
	BPF_MAP_TYPE_UNSPEC = 0,
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_RINGBUF = 27,
	BPF_MAP_TYPE_TASK_STORAGE = 29,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
	BPF_F_LOCK = 4,
};

enum {
	BPF_F_NO_PREALLOC = 1,
	BPF_F_MMAPABLE = 1024,
};

enum {
	BPF_LOCAL_STORAGE_GET_F_CREATE = 1,
};

enum {
	BPF_RB_NO_WAKEUP = 1,
	BPF_RB_FORCE_WAKEUP = 2,
};

#endif /* __VMLINUX_H__ */
