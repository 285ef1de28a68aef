// SPDX-License-Identifier: Apache-2.0
/*
 * lockpair: a lock holder on one CPU and a waiter on another, for the lock
 * wait tests of the guest module.
 *
 *   lockpair [-m mmap|seqfile] [-H HOLDER_CPU] [-W WAITER_CPU] [-t SECONDS]
 *            [-s MEGABYTES]
 *
 * mmap (default): the holder thread (pinned to HOLDER_CPU, default 1) flips
 * the protection of a populated MEGABYTES region (default 32, 4 KiB pages)
 * between read-only and read-write: each mprotect(2) holds the process's
 * mmap_lock (an rwsem) for writing while it rewrites every page table entry.
 * The waiter thread (pinned to WAITER_CPU, default 0) faults pages of another
 * small region in and drops them again (madvise MADV_DONTNEED): every fault
 * and madvise waits to read that mmap_lock while the holder runs.
 *
 * seqfile: both threads read /proc/kallsyms through one file description,
 * from the start to the end, over and over; a read(2) holds the file's
 * position mutex and the seq_file's mutex while it formats up to 1 MiB, so
 * each thread waits for a mutex the other holds while it runs.
 *
 * Prints "lockpair: ready mode=<mode>" once both threads run, and at the end
 * (after SECONDS, default 10) "lockpair: done holder_ops=<n> waiter_ops=<n>".
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "spin.h"

#define PAGE		4096UL
#define WAITER_PAGES	16UL
#define READ_CHUNK	(1UL << 20)

static int holder_cpu = 1, waiter_cpu;
static double secs = 10, end;
static size_t region_bytes = 32UL << 20;
static char *region, *small;
static int kallsyms = -1;
static volatile int started;
static unsigned long holder_ops, waiter_ops;

static void usage(void)
{
	fprintf(stderr, "usage: lockpair [-m mmap|seqfile] [-H HOLDER_CPU] [-W WAITER_CPU] [-t SECONDS] [-s MEGABYTES]\n");
	exit(2);
}

static void pin(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set)) {
		perror("lockpair: sched_setaffinity");
		exit(1);
	}
}

/* Whole file, start to end, in READ_CHUNK reads. */
static void read_kallsyms(char *buf)
{
	if (lseek(kallsyms, 0, SEEK_SET) < 0) {
		perror("lockpair: lseek");
		exit(1);
	}
	while (read(kallsyms, buf, READ_CHUNK) > 0)
		;
}

static void *holder(void *arg)
{
	char *buf = arg;

	pin(holder_cpu);
	__sync_fetch_and_add(&started, 1);
	while (now() < end) {
		if (buf) {
			read_kallsyms(buf);
		} else if (mprotect(region, region_bytes, PROT_READ) ||
			   mprotect(region, region_bytes, PROT_READ | PROT_WRITE)) {
			perror("lockpair: mprotect");
			exit(1);
		}
		holder_ops++;
	}
	return NULL;
}

static void *waiter(void *arg)
{
	char *buf = arg;
	unsigned long i;

	pin(waiter_cpu);
	__sync_fetch_and_add(&started, 1);
	while (now() < end) {
		if (buf) {
			read_kallsyms(buf);
		} else {
			for (i = 0; i < WAITER_PAGES; i++)
				small[i * PAGE] = 1;
			if (madvise(small, WAITER_PAGES * PAGE, MADV_DONTNEED)) {
				perror("lockpair: madvise");
				exit(1);
			}
		}
		waiter_ops++;
	}
	return NULL;
}

static char *anon(size_t bytes)
{
	char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		perror("lockpair: mmap");
		exit(1);
	}
	/* One page table entry per 4 KiB: every mprotect rewrites them all. */
	madvise(p, bytes, MADV_NOHUGEPAGE);
	return p;
}

static char *chunk(void)
{
	char *buf = malloc(READ_CHUNK);

	if (!buf) {
		perror("lockpair: malloc");
		exit(1);
	}
	return buf;
}

int main(int argc, char **argv)
{
	const char *mode = "mmap";
	char *hbuf = NULL, *wbuf = NULL;
	pthread_t th, tw;
	size_t i;
	int opt;

	while ((opt = getopt(argc, argv, "m:H:W:t:s:")) != -1) {
		switch (opt) {
		case 'm':
			mode = optarg;
			break;
		case 'H':
			holder_cpu = atoi(optarg);
			break;
		case 'W':
			waiter_cpu = atoi(optarg);
			break;
		case 't':
			secs = atof(optarg);
			break;
		case 's':
			region_bytes = strtoul(optarg, NULL, 10) << 20;
			break;
		default:
			usage();
		}
	}
	if (optind != argc || !region_bytes)
		usage();
	if (!strcmp(mode, "mmap")) {
		region = anon(region_bytes);
		for (i = 0; i < region_bytes; i += PAGE)
			region[i] = 1;
		small = anon(WAITER_PAGES * PAGE);
	} else if (!strcmp(mode, "seqfile")) {
		kallsyms = open("/proc/kallsyms", O_RDONLY);
		if (kallsyms < 0) {
			perror("lockpair: /proc/kallsyms");
			return 1;
		}
		hbuf = chunk();
		wbuf = chunk();
	} else {
		usage();
	}

	end = now() + secs;
	if (pthread_create(&th, NULL, holder, hbuf) ||
	    pthread_create(&tw, NULL, waiter, wbuf)) {
		fprintf(stderr, "lockpair: pthread_create failed\n");
		return 1;
	}
	while (started < 2)
		usleep(1000);
	printf("lockpair: ready mode=%s\n", mode);
	fflush(stdout);
	pthread_join(th, NULL);
	pthread_join(tw, NULL);
	printf("lockpair: done holder_ops=%lu waiter_ops=%lu\n", holder_ops,
	       waiter_ops);
	return 0;
}
