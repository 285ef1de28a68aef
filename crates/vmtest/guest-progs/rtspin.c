// SPDX-License-Identifier: Apache-2.0
/*
 * rtspin: pin to a CPU, take a scheduling policy, then spin (or sleep-loop)
 * for a while. A guest-side workload for pvsched tests.
 *
 *   rtspin [-c CPU] [-p PRIO] [-P fifo|rr|other|batch|idle] [-n NICE]
 *          [-t SECONDS] [-s SLEEP_US]
 *
 * -s 0 (default) spins; -s N runs N microseconds, then sleeps N, in a loop.
 * Prints "rtspin: ready pid=<pid> cpu=<cpu>" once the policy is in force.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "spin.h"

static void usage(void)
{
	fprintf(stderr, "usage: rtspin [-c CPU] [-p PRIO] [-P fifo|rr|other|batch|idle] [-n NICE] [-t SECONDS] [-s SLEEP_US]\n");
	exit(2);
}

static int parse_policy(const char *s)
{
	if (!strcmp(s, "fifo"))
		return SCHED_FIFO;
	if (!strcmp(s, "rr"))
		return SCHED_RR;
	if (!strcmp(s, "other"))
		return SCHED_OTHER;
	if (!strcmp(s, "batch"))
		return SCHED_BATCH;
	if (!strcmp(s, "idle"))
		return SCHED_IDLE;
	usage();
	return -1;
}

int main(int argc, char **argv)
{
	int cpu = -1, prio = 0, policy = -1, nice_val = 0, set_nice = 0, opt;
	double secs = 5, sleep_us = 0, end, t;
	struct sched_param sp;

	while ((opt = getopt(argc, argv, "c:p:P:n:t:s:")) != -1) {
		switch (opt) {
		case 'c':
			cpu = atoi(optarg);
			break;
		case 'p':
			prio = atoi(optarg);
			break;
		case 'P':
			policy = parse_policy(optarg);
			break;
		case 'n':
			nice_val = atoi(optarg);
			set_nice = 1;
			break;
		case 't':
			secs = atof(optarg);
			break;
		case 's':
			sleep_us = atof(optarg);
			break;
		default:
			usage();
		}
	}
	if (policy < 0)
		policy = prio > 0 ? SCHED_FIFO : SCHED_OTHER;

	if (cpu >= 0) {
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set)) {
			perror("rtspin: sched_setaffinity");
			return 1;
		}
	}
	if (set_nice && setpriority(PRIO_PROCESS, 0, nice_val)) {
		perror("rtspin: setpriority");
		return 1;
	}
	memset(&sp, 0, sizeof(sp));
	sp.sched_priority = (policy == SCHED_FIFO || policy == SCHED_RR) ? prio : 0;
	if (sched_setscheduler(0, policy, &sp)) {
		perror("rtspin: sched_setscheduler");
		return 1;
	}
	printf("rtspin: ready pid=%d cpu=%d\n", getpid(), sched_getcpu());
	fflush(stdout);

	end = now() + secs;
	while ((t = now()) < end) {
		if (sleep_us > 0) {
			long ns = (long)(sleep_us * 1e3);
			struct timespec ts = {
				.tv_sec = ns / 1000000000L,
				.tv_nsec = ns % 1000000000L,
			};

			spin_until(t + sleep_us / 1e6);
			while (nanosleep(&ts, &ts) && errno == EINTR)
				;
		} else {
			spin_until(end);
		}
	}
	return 0;
}
