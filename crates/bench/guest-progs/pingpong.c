// SPDX-License-Identifier: Apache-2.0
/*
 * pingpong: message-passing round trips between two threads on two CPUs.
 *
 *   pingpong [-n ROUND_TRIPS] [-d MAX_SECONDS] [-a CPU_A] [-b CPU_B]
 *            [-r FIFO_PRIO] [-g GAP_US]
 *
 * Thread A (pinned to CPU_A, default 0) writes a byte into a pipe, thread B
 * (pinned to CPU_B, default 1) blocked in read(2) wakes up and writes it back
 * through a second pipe; A times the round trip. Each side sleeps in the
 * kernel between messages, so on a VM every message is a vCPU wakeup (an IPI,
 * a halt exit): the case halt polling is about. A pauses GAP_US (default
 * 200 us) between round trips so that the receiving vCPU goes idle.
 *
 * GAP_US 0 sends the next message as soon as the reply is in: a pure
 * message-passing loop, whose rate is bound by the wakeups.
 *
 * Stops after ROUND_TRIPS (default 5000; 0: no bound) or MAX_SECONDS
 * (default 5), whichever comes first. FIFO_PRIO 0 (default) keeps
 * SCHED_OTHER. Prints one line of JSON:
 * {"round_trips":N,"avg_us":A,"p50_us":M,"p99_us":Q,"max_us":X,
 *  "elapsed_s":S,"round_trips_per_s":R} (R = N / S, gaps included).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static int ping[2], pong[2];
static int cpu_a = 0, cpu_b = 1, prio = 0;

static int64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void setup_thread(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set))
		fprintf(stderr, "pingpong: affinity %d failed\n", cpu);
	if (prio > 0) {
		struct sched_param sp = { .sched_priority = prio };

		if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp))
			fprintf(stderr, "pingpong: SCHED_FIFO %d failed\n", prio);
	}
}

static void *echo(void *arg)
{
	char c;

	(void)arg;
	setup_thread(cpu_b);
	for (;;) {
		ssize_t n = read(ping[0], &c, 1);

		if (n <= 0)
			break;
		if (write(pong[1], &c, 1) != 1)
			break;
	}
	return NULL;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x > y) - (x < y);
}

static void usage(void)
{
	fprintf(stderr, "usage: pingpong [-n ROUND_TRIPS (0: no bound)] [-d MAX_SECONDS] [-a CPU_A] [-b CPU_B] [-r FIFO_PRIO] [-g GAP_US]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	long n = 5000, gap_us = 200;
	double secs = 5;
	int opt;

	while ((opt = getopt(argc, argv, "n:d:a:b:r:g:")) != -1) {
		switch (opt) {
		case 'n': n = atol(optarg); break;
		case 'd': secs = atof(optarg); break;
		case 'a': cpu_a = atoi(optarg); break;
		case 'b': cpu_b = atoi(optarg); break;
		case 'r': prio = atoi(optarg); break;
		case 'g': gap_us = atol(optarg); break;
		default: usage();
		}
	}
	if (n < 0 || secs <= 0 || gap_us < 0)
		usage();
	if (mlockall(MCL_CURRENT | MCL_FUTURE))
		fprintf(stderr, "pingpong: mlockall: %s\n", strerror(errno));
	if (pipe(ping) || pipe(pong)) {
		perror("pingpong: pipe");
		return 1;
	}
	/* Grown as needed: a time-bounded run at gap 0 has no known count. */
	size_t cap = n > 0 && n < 65536 ? (size_t)n : 65536;
	int64_t *rt = malloc(cap * sizeof(*rt));

	if (!rt) {
		perror("pingpong: malloc");
		return 1;
	}
	pthread_t tb;

	if (pthread_create(&tb, NULL, echo, NULL)) {
		perror("pingpong: pthread_create");
		return 1;
	}
	setup_thread(cpu_a);

	const int64_t start = now_ns(), end = start + (int64_t)(secs * 1e9);
	const struct timespec gap = { .tv_sec = gap_us / 1000000, .tv_nsec = (gap_us % 1000000) * 1000 };
	long done = 0;
	char c = 'x';

	while ((n == 0 || done < n) && now_ns() < end) {
		int64_t t0 = now_ns();

		if (write(ping[1], &c, 1) != 1 || read(pong[0], &c, 1) != 1) {
			perror("pingpong: pipe i/o");
			return 1;
		}
		if ((size_t)done == cap) {
			int64_t *more = realloc(rt, 2 * cap * sizeof(*rt));

			if (!more) {
				perror("pingpong: realloc");
				return 1;
			}
			rt = more;
			cap *= 2;
		}
		rt[done++] = now_ns() - t0;
		if (gap_us)
			nanosleep(&gap, NULL);
	}
	const double elapsed = (double)(now_ns() - start) / 1e9;

	close(ping[1]);
	pthread_join(tb, NULL);

	if (done == 0) {
		printf("{\"round_trips\":0}\n");
		return 1;
	}
	double sum = 0;

	for (long i = 0; i < done; i++)
		sum += rt[i];
	qsort(rt, (size_t)done, sizeof(*rt), cmp_i64);
	long i50 = (done - 1) / 2, i99 = (long)((done - 1) * 0.99);

	printf("{\"round_trips\":%ld,\"avg_us\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f,\"max_us\":%.1f,"
	       "\"elapsed_s\":%.3f,\"round_trips_per_s\":%.1f}\n",
	       done, sum / done / 1000.0, rt[i50] / 1000.0, rt[i99] / 1000.0, rt[done - 1] / 1000.0,
	       elapsed, elapsed > 0 ? done / elapsed : 0.0);
	return 0;
}
