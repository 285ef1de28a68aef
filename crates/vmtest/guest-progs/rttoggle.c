// SPDX-License-Identifier: Apache-2.0
/*
 * rttoggle: on one CPU, alternate between SCHED_FIFO PRIO and SCHED_OTHER,
 * spinning PHASE_MS in each, for COUNT cycles. After each policy change it
 * sleeps 100 us so that the guest switches away and back, and pvsched.ko
 * publishes the new policy at that sched_switch.
 *
 *   rttoggle CPU PRIO PHASE_MS COUNT
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "spin.h"

int main(int argc, char **argv)
{
	struct sched_param rt = { 0 }, other = { 0 };
	cpu_set_t set;
	int cpu, count, i;
	double phase;

	if (argc != 5) {
		fprintf(stderr, "usage: rttoggle CPU PRIO PHASE_MS COUNT\n");
		return 2;
	}
	cpu = atoi(argv[1]);
	rt.sched_priority = atoi(argv[2]);
	phase = atof(argv[3]) / 1000.0;
	count = atoi(argv[4]);
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set)) {
		perror("sched_setaffinity");
		return 1;
	}
	printf("rttoggle: ready pid=%d\n", getpid());
	fflush(stdout);
	for (i = 0; i < count; i++) {
		if (sched_setscheduler(0, SCHED_FIFO, &rt)) {
			perror("sched_setscheduler fifo");
			return 1;
		}
		usleep(100);
		spin(phase);
		if (sched_setscheduler(0, SCHED_OTHER, &other)) {
			perror("sched_setscheduler other");
			return 1;
		}
		usleep(100);
		spin(phase);
	}
	return 0;
}
