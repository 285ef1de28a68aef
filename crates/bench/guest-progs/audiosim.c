// SPDX-License-Identifier: Apache-2.0
/*
 * audiosim: an audio-like periodic real-time task that counts glitches.
 *
 *   audiosim [-d SECONDS] [-p PERIOD_US] [-b BUFFER_US] [-w WORK_US]
 *            [-r FIFO_PRIO] [-c CPU]
 *
 * Every PERIOD_US (default 2902 us: 128 frames at 44.1 kHz) the task wakes up
 * on an absolute CLOCK_MONOTONIC deadline, "renders" a buffer (WORK_US of its
 * own CPU time, default 300 us) and must be done before the buffer that plays
 * meanwhile runs out: BUFFER_US after the period's start (default: one
 * period). A period finished later than that is a glitch (an audible
 * underrun); periods that passed entirely while the task was late are counted
 * as glitches too, and the task resynchronises to the next period as an
 * audio driver would after an xrun.
 *
 * Runs SCHED_FIFO at FIFO_PRIO (default 8) with memory locked and prints one
 * line of JSON:
 *   {"periods":N,"glitches":G,"skipped":S,"period_us":P,"buffer_us":B,
 *    "work_us":W,"late_avg_us":A,"late_p99_us":Q,"late_max_us":M}
 * where "late" is the completion time after the period's start, minus the
 * work itself (i.e. the scheduling delay the task suffered).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_BUCKETS 200000 /* us; later ones land in the last bucket */

static uint32_t hist[MAX_BUCKETS + 1];

static int64_t ts_ns(const struct timespec *t)
{
	return (int64_t)t->tv_sec * 1000000000LL + t->tv_nsec;
}

static int64_t now_ns(clockid_t clk)
{
	struct timespec t;

	clock_gettime(clk, &t);
	return ts_ns(&t);
}

static void ns_ts(int64_t ns, struct timespec *t)
{
	t->tv_sec = ns / 1000000000LL;
	t->tv_nsec = ns % 1000000000LL;
}

static volatile uint64_t sink;

/* WORK_US of this thread's CPU time: preemption does not count as work. */
static void render(int64_t work_ns)
{
	int64_t start = now_ns(CLOCK_THREAD_CPUTIME_ID);
	uint64_t x = sink + 1;

	while (now_ns(CLOCK_THREAD_CPUTIME_ID) - start < work_ns) {
		for (int i = 0; i < 200; i++)
			x = x * 6364136223846793005ULL + 1442695040888963407ULL;
	}
	sink = x;
}

static void usage(void)
{
	fprintf(stderr, "usage: audiosim [-d SECONDS] [-p PERIOD_US] [-b BUFFER_US] [-w WORK_US] [-r FIFO_PRIO] [-c CPU]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	double secs = 10;
	long period_us = 2902, buffer_us = -1, work_us = 300;
	int prio = 8, cpu = -1, opt;

	while ((opt = getopt(argc, argv, "d:p:b:w:r:c:")) != -1) {
		switch (opt) {
		case 'd': secs = atof(optarg); break;
		case 'p': period_us = atol(optarg); break;
		case 'b': buffer_us = atol(optarg); break;
		case 'w': work_us = atol(optarg); break;
		case 'r': prio = atoi(optarg); break;
		case 'c': cpu = atoi(optarg); break;
		default: usage();
		}
	}
	if (buffer_us < 0)
		buffer_us = period_us;
	if (period_us <= 0 || secs <= 0 || work_us < 0 || work_us >= buffer_us)
		usage();

	if (cpu >= 0) {
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set))
			fprintf(stderr, "audiosim: sched_setaffinity(%d): %s\n", cpu, strerror(errno));
	}
	if (mlockall(MCL_CURRENT | MCL_FUTURE))
		fprintf(stderr, "audiosim: mlockall: %s\n", strerror(errno));
	if (prio > 0) {
		struct sched_param sp = { .sched_priority = prio };

		if (sched_setscheduler(0, SCHED_FIFO, &sp)) {
			fprintf(stderr, "audiosim: SCHED_FIFO %d: %s\n", prio, strerror(errno));
			return 1;
		}
	}

	const int64_t period = period_us * 1000LL, buffer = buffer_us * 1000LL;
	const int64_t work = work_us * 1000LL;
	const int64_t start = now_ns(CLOCK_MONOTONIC) + period;
	const int64_t end = start + (int64_t)(secs * 1e9);
	int64_t next = start, late_sum = 0, late_max = 0;
	uint64_t periods = 0, glitches = 0, skipped = 0;
	struct timespec t;

	while (next < end) {
		ns_ts(next, &t);
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR)
			;
		render(work);
		int64_t done = now_ns(CLOCK_MONOTONIC);
		int64_t late = done - next - work;

		if (late < 0)
			late = 0;
		periods++;
		late_sum += late;
		if (late > late_max)
			late_max = late;
		int64_t us = late / 1000;
		hist[us > MAX_BUCKETS ? MAX_BUCKETS : us]++;
		if (done > next + buffer)
			glitches++;
		next += period;
		/* Periods that went by entirely: underruns, then resync. */
		while (next + buffer < done) {
			skipped++;
			glitches++;
			next += period;
		}
	}

	uint64_t want = periods - periods / 100, acc = 0;
	long p99 = 0;

	for (long i = 0; i <= MAX_BUCKETS; i++) {
		acc += hist[i];
		if (acc >= want && acc > 0) {
			p99 = i;
			break;
		}
	}
	printf("{\"periods\":%llu,\"glitches\":%llu,\"skipped\":%llu,\"period_us\":%ld,"
	       "\"buffer_us\":%ld,\"work_us\":%ld,\"late_avg_us\":%.1f,\"late_p99_us\":%ld,"
	       "\"late_max_us\":%lld}\n",
	       (unsigned long long)periods, (unsigned long long)glitches,
	       (unsigned long long)skipped, period_us, buffer_us, work_us,
	       periods ? late_sum / 1000.0 / periods : 0.0, p99, (long long)(late_max / 1000));
	return 0;
}
