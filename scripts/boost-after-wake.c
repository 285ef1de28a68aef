// SPDX-License-Identifier: Apache-2.0
/*
 * boost-after-wake: how soon does a thread that shares a CPU with two CPU
 * hogs run after it is woken, when it is boosted (or not) around the wakeup?
 * It measures what pvschedd's actuator relies on: a boost that lands after
 * the wakeup (a reaction to it, as a proactive wake boost is) versus one in
 * force before it.
 *
 * Two hogs and the target are pinned to CPU 0; the controller (SCHED_FIFO 10)
 * runs on CPU 1. Each round, every 2 ms: wake the target through a futex,
 * spin DELAY µs (the daemon's reaction), apply the mode's boost, wait until
 * the target runs (it spins 100 µs, like a vCPU with work), unboost it.
 *
 * Modes:
 *   none          no boost at all
 *   fair-after    nice -20 and a 100 µs EEVDF slice, DELAY after the wakeup
 *   rt-after      SCHED_RR 2, DELAY after the wakeup
 *   fair-before   nice -20 and the slice, 300 µs before the wakeup
 *   fair-always   nice -20 and the slice for the whole run
 *   fair-twice    nice -19, then nice -20, both with the slice, DELAY after
 *   rt-then-fair  SCHED_RR 1, then at once nice -20 and the slice, DELAY after
 *
 * Usage: boost-after-wake MODE [ROUNDS] [DELAY_US]   (root: nice -20, RT)
 * Prints the wakeup -> running delay: p50, p90, p99, max in µs.
 * Build: cc -O2 -pthread -o boost-after-wake boost-after-wake.c
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct sched_attr_v0 {
	uint32_t size, policy;
	uint64_t flags;
	int32_t nice;
	uint32_t priority;
	uint64_t runtime, deadline, period;
};

enum mode {
	NONE, FAIR_AFTER, RT_AFTER, FAIR_BEFORE, FAIR_ALWAYS, FAIR_TWICE, RT_THEN_FAIR,
};
static const char *const mode_names[] = {
	"none", "fair-after", "rt-after", "fair-before", "fair-always",
	"fair-twice", "rt-then-fair",
};

static volatile int go;
static volatile pid_t target_tid;
static volatile uint64_t ran_at;

static uint64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec;
}

static void spin_ns(uint64_t ns)
{
	uint64_t t = now_ns();

	while (now_ns() - t < ns)
		;
}

static void pin(int cpu)
{
	cpu_set_t s;

	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	if (sched_setaffinity(0, sizeof(s), &s))
		perror("sched_setaffinity");
}

static void set_attr(pid_t tid, uint32_t policy, int nice, uint32_t prio,
		     uint64_t slice_ns)
{
	struct sched_attr_v0 a = {
		.size = sizeof(a), .policy = policy, .nice = nice,
		.priority = prio, .runtime = slice_ns,
	};

	if (syscall(SYS_sched_setattr, tid, &a, 0))
		perror("sched_setattr");
}

static void fair_boost(pid_t tid)
{
	set_attr(tid, SCHED_OTHER, -20, 0, 100000);
}

static void unboost(pid_t tid)
{
	set_attr(tid, SCHED_OTHER, 0, 0, 0);
}

static void *hog(void *arg)
{
	(void)arg;
	pin(0);
	for (;;)
		;
	return NULL;
}

static void *target(void *arg)
{
	(void)arg;
	pin(0);
	target_tid = syscall(SYS_gettid);
	for (;;) {
		while (!go)
			syscall(SYS_futex, &go, FUTEX_WAIT, 0, NULL, NULL, 0);
		ran_at = now_ns();
		go = 0;
		spin_ns(100000);
	}
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	int rounds = argc > 2 ? atoi(argv[2]) : 2000;
	uint64_t delay_ns = (argc > 3 ? atoi(argv[3]) : 40) * 1000ull;
	enum mode mode = NONE;
	pthread_t th;
	uint64_t *lat;
	int i;

	if (argc < 2)
		goto usage;
	for (i = 0; i <= RT_THEN_FAIR; i++)
		if (!strcmp(argv[1], mode_names[i]))
			break;
	if (i > RT_THEN_FAIR || rounds < 100)
		goto usage;
	mode = i;
	lat = calloc(rounds, sizeof(*lat));
	if (!lat)
		return 1;
	pthread_create(&th, NULL, hog, NULL);
	pthread_create(&th, NULL, hog, NULL);
	pthread_create(&th, NULL, target, NULL);
	pin(1);
	set_attr(0, SCHED_FIFO, 0, 10, 0);
	usleep(100000);
	if (mode == FAIR_ALWAYS)
		fair_boost(target_tid);
	for (i = 0; i < rounds; i++) {
		uint64_t woke;

		usleep(2000);
		if (mode == FAIR_BEFORE) {
			fair_boost(target_tid);
			usleep(300);
		}
		woke = now_ns();
		go = 1;
		syscall(SYS_futex, &go, FUTEX_WAKE, 1, NULL, NULL, 0);
		spin_ns(delay_ns);
		if (mode == FAIR_AFTER) {
			fair_boost(target_tid);
		} else if (mode == RT_AFTER) {
			set_attr(target_tid, SCHED_RR, 0, 2, 0);
		} else if (mode == FAIR_TWICE) {
			set_attr(target_tid, SCHED_OTHER, -19, 0, 100000);
			fair_boost(target_tid);
		} else if (mode == RT_THEN_FAIR) {
			set_attr(target_tid, SCHED_RR, 0, 1, 0);
			fair_boost(target_tid);
		}
		while (go)
			;
		lat[i] = ran_at - woke;
		usleep(150);
		if (mode != NONE && mode != FAIR_ALWAYS)
			unboost(target_tid);
	}
	qsort(lat, rounds, sizeof(*lat), cmp_u64);
	printf("%s: %d wakeups, delay %llu us; wakeup -> running p50 %llu p90 %llu p99 %llu max %llu us\n",
	       mode_names[mode], rounds, (unsigned long long)delay_ns / 1000,
	       (unsigned long long)lat[rounds / 2] / 1000,
	       (unsigned long long)lat[rounds * 9 / 10] / 1000,
	       (unsigned long long)lat[rounds * 99 / 100] / 1000,
	       (unsigned long long)lat[rounds - 1] / 1000);
	return 0;
usage:
	fprintf(stderr, "usage: %s none|fair-after|rt-after|fair-before|fair-always|fair-twice|rt-then-fair [ROUNDS] [DELAY_US]\n",
		argv[0]);
	return 2;
}
