/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Clock and busy-wait shared by the guest test programs (not a program
 * itself: vmtest compiles only the .c files here, and hashes this one into
 * the image's cache key).
 */
#ifndef PVSCHED_GUEST_SPIN_H
#define PVSCHED_GUEST_SPIN_H

#include <time.h>

static inline double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * Busy-wait until @end. The clock is read only every few thousand iterations:
 * under TCG a guest without a stable TSC reads the HPET, an emulated device,
 * and a tight clock_gettime() loop would slow the whole VM down.
 */
static inline void spin_until(double end)
{
	volatile unsigned long n;

	do {
		for (n = 0; n < 20000; n++)
			;
	} while (now() < end);
}

static inline void spin(double secs)
{
	spin_until(now() + secs);
}

#endif
