// SPDX-License-Identifier: Apache-2.0
/*
 * pipepong: cross-CPU wakeups for the idle driver's tests.
 *
 *   pipepong [-a CPU_A] [-b CPU_B] [-t SECONDS] [-n ROUNDS]
 *
 * A process on CPU_A (default 0) writes a byte into a pipe; its child on
 * CPU_B (default 1), blocked in read(2), wakes up and writes it back through
 * a second pipe. Each side sleeps in the kernel while the other works, so
 * every message wakes an idle CPU. Stops after SECONDS (default 5) or ROUNDS
 * round trips (default 0: no bound), whichever comes first, and prints
 * "pipepong: rounds=<n> cpus=<a>,<b>".
 */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spin.h"

static void usage(void)
{
	fprintf(stderr, "usage: pipepong [-a CPU_A] [-b CPU_B] [-t SECONDS] [-n ROUNDS]\n");
	exit(2);
}

static void pin(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set)) {
		perror("pipepong: sched_setaffinity");
		exit(1);
	}
}

int main(int argc, char **argv)
{
	int cpu_a = 0, cpu_b = 1, opt, ping[2], pong[2];
	double secs = 5, end;
	unsigned long max = 0, rounds = 0;
	pid_t child;
	char c = 'x';

	while ((opt = getopt(argc, argv, "a:b:t:n:")) != -1) {
		switch (opt) {
		case 'a':
			cpu_a = atoi(optarg);
			break;
		case 'b':
			cpu_b = atoi(optarg);
			break;
		case 't':
			secs = atof(optarg);
			break;
		case 'n':
			max = strtoul(optarg, NULL, 0);
			break;
		default:
			usage();
		}
	}
	if (pipe(ping) || pipe(pong)) {
		perror("pipepong: pipe");
		return 1;
	}
	child = fork();
	if (child < 0) {
		perror("pipepong: fork");
		return 1;
	}
	if (child == 0) {
		pin(cpu_b);
		close(ping[1]);
		close(pong[0]);
		/* Echo until the parent closes its end. */
		while (read(ping[0], &c, 1) == 1)
			if (write(pong[1], &c, 1) != 1)
				break;
		return 0;
	}
	pin(cpu_a);
	close(ping[0]);
	close(pong[1]);
	/* The clock only every 64 rounds: under TCG it may be an emulated HPET. */
	end = now() + secs;
	while (!max || rounds < max) {
		if (write(ping[1], &c, 1) != 1 || read(pong[0], &c, 1) != 1) {
			perror("pipepong: round trip");
			kill(child, SIGKILL);
			return 1;
		}
		rounds++;
		if (!(rounds % 64) && now() >= end)
			break;
	}
	close(ping[1]);
	waitpid(child, NULL, 0);
	printf("pipepong: rounds=%lu cpus=%d,%d\n", rounds, cpu_a, cpu_b);
	return 0;
}
