// SPDX-License-Identifier: Apache-2.0
/*
 * boostreq: ask pvsched for an explicit boost (PVSCHED_IOC_BOOST), hold it
 * while spinning, then let it go in one of the documented ways.
 *
 *   boostreq [-c CPU] [-p FIFO_PRIO] [-t HOLD_SECONDS] [-a AFTER_SECONDS]
 *            [-r ioctl|close|exit|sleep]
 *
 * -p runs it at SCHED_FIFO: no normal task can preempt it and end the request
 * early (the request ends whenever the task leaves the CPU).
 *
 * -r ioctl  release with PVSCHED_IOC_BOOST 0, then spin AFTER seconds more
 * -r close  close the fd, then spin AFTER seconds more
 * -r sleep  sleep AFTER seconds (leaving the CPU ends the request), then exit
 * -r exit   exit with the request held (default)
 * Prints nothing while it holds the request (console output may sleep, which
 * would end it), then "boostreq: done cpu=<cpu> release=<how>".
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "pvsched.h"
#include "spin.h"

int main(int argc, char **argv)
{
	const char *release = "exit";
	double hold = 2, after = 1;
	int cpu = -1, prio = 0, fd, opt;

	while ((opt = getopt(argc, argv, "c:p:t:a:r:")) != -1) {
		switch (opt) {
		case 'c':
			cpu = atoi(optarg);
			break;
		case 'p':
			prio = atoi(optarg);
			break;
		case 't':
			hold = atof(optarg);
			break;
		case 'a':
			after = atof(optarg);
			break;
		case 'r':
			release = optarg;
			break;
		default:
			fprintf(stderr, "usage: boostreq [-c CPU] [-p PRIO] [-t HOLD] [-a AFTER] [-r ioctl|close|exit|sleep]\n");
			return 2;
		}
	}
	if (cpu >= 0) {
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set)) {
			perror("boostreq: sched_setaffinity");
			return 1;
		}
	}
	if (prio > 0) {
		struct sched_param sp = { .sched_priority = prio };

		if (sched_setscheduler(0, SCHED_FIFO, &sp)) {
			perror("boostreq: sched_setscheduler");
			return 1;
		}
	}
	fd = open(PVSCHED_DEVICE_PATH, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		perror("boostreq: open " PVSCHED_DEVICE_PATH);
		return 1;
	}
	if (ioctl(fd, PVSCHED_IOC_BOOST, 1UL)) {
		perror("boostreq: PVSCHED_IOC_BOOST 1");
		return 1;
	}
	/* No stdio here: a write to the console could sleep and end the grant. */
	spin(hold);

	if (!strcmp(release, "ioctl")) {
		if (ioctl(fd, PVSCHED_IOC_BOOST, 0UL)) {
			perror("boostreq: PVSCHED_IOC_BOOST 0");
			return 1;
		}
		spin(after);
	} else if (!strcmp(release, "close")) {
		close(fd);
		spin(after);
	} else if (!strcmp(release, "sleep")) {
		usleep((useconds_t)(after * 1e6));
	}
	printf("boostreq: done cpu=%d release=%s\n", sched_getcpu(), release);
	return 0;
}
