/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * pvsched guest user-space interface: /dev/pvsched.
 *
 * PVSCHED_IOC_BOOST asks the host to boost the vCPU the calling task runs on.
 * The argument is a value, not a pointer:
 *   1  grant: sets PVSCHED_GF_BOOST_REQ in the slot of the caller's CPU.
 *   0  release.
 * A grant lasts while the calling task keeps running on that CPU. It ends when
 * the task calls PVSCHED_IOC_BOOST with 0, closes the file, exits, or leaves
 * the CPU for any reason (sleeps, is preempted, migrates). A task that wants
 * the boost again after it ran again asks again.
 *
 * Errors: EOPNOTSUPP the host did not offer PVSCHED_F_BOOST_REQUEST,
 *         ENXIO      the caller's CPU has no slot or the region is gone,
 *         EINVAL     argument other than 0 or 1.
 */
#ifndef _UAPI_PVSCHED_H
#define _UAPI_PVSCHED_H

#include <linux/ioctl.h>

#define PVSCHED_DEVICE_PATH	"/dev/pvsched"

#define PVSCHED_IOC_MAGIC	0xF5
#define PVSCHED_IOC_BOOST	_IO(PVSCHED_IOC_MAGIC, 0x01)

#endif /* _UAPI_PVSCHED_H */
