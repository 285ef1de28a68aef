// SPDX-License-Identifier: Apache-2.0
/*
 * prodcons: a producer and a consumer on two CPUs passing messages through a
 * bounded queue under one lock, the shape of the published Java reader/writer
 * queue workload (an ArrayBlockingQueue: one lock, a not-empty and a not-full
 * condition).
 *
 *   prodcons [-d SECONDS] [-q CAPACITY] [-a CPU_PRODUCER] [-b CPU_CONSUMER]
 *            [-w WORK_NS]
 *
 * The producer (pinned to CPU_PRODUCER, default 0) stamps each message with
 * the time, pushes it and signals not-empty, one message at a time (batching
 * would hide the wakeups), then works WORK_NS (default 0) on its CPU before
 * the next one, as a writer making its messages would; it waits on not-full
 * while the ring (CAPACITY entries, default 64) is full. With enough work per
 * message the consumer keeps up and the queue is mostly empty; with none the
 * producer fills it and the consumer drains it in batches. The consumer
 * (pinned to CPU_CONSUMER, default
 * 1) pops one message at a time and waits on not-empty while the queue is
 * empty, so every time it drains the queue its CPU may go idle and the next
 * message is a vCPU wakeup: the case guest halt polling is about.
 *
 * Runs SECONDS (default 5). Prints one line of JSON:
 * {"messages":N,"msgs_per_s":X,"latency_p50_us":A,"latency_p99_us":B,
 *  "latency_max_us":C,"consumer_waits":N,"producer_waits":N,"elapsed_s":S}
 * where latency is enqueue -> dequeue (percentiles are bucket upper bounds,
 * within 1/32 of the value) and the waits count the times the consumer found
 * the queue empty and the producer found it full.
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

/* Log-linear latency histogram: 32 buckets per power of two of ns. */
#define SUB_BITS 5
#define SUB (1 << SUB_BITS)
#define BUCKETS ((64 - SUB_BITS + 1) * SUB)

struct msg {
	int64_t enq_ns;
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t not_empty, not_full;
	struct msg *ring;
	long cap, head, len;
	int done;
} q = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.not_empty = PTHREAD_COND_INITIALIZER,
	.not_full = PTHREAD_COND_INITIALIZER,
};

static int cpu_p = 0, cpu_c = 1;
static long work_ns;
static pthread_barrier_t start;
static int64_t end_ns;
static uint64_t hist[BUCKETS];
static uint64_t consumed, consumer_waits, producer_waits;
static int64_t first_ns, last_ns, max_lat_ns;

static int64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int bucket_of(uint64_t v)
{
	int e;

	if (v < SUB)
		return (int)v;
	e = 63 - __builtin_clzll(v);
	return (e - SUB_BITS + 1) * SUB + (int)((v >> (e - SUB_BITS)) & (SUB - 1));
}

/* Exclusive upper bound of bucket b, ns. */
static uint64_t bucket_upper(int b)
{
	int e, sub;

	if (b < SUB)
		return (uint64_t)b + 1;
	e = b / SUB + SUB_BITS - 1;
	sub = b % SUB;
	return ((uint64_t)(SUB + sub + 1)) << (e - SUB_BITS);
}

static double percentile_us(uint64_t n, double p)
{
	uint64_t rank = (uint64_t)((double)(n - 1) * p) + 1, seen = 0;

	for (int b = 0; b < BUCKETS; b++) {
		seen += hist[b];
		if (seen >= rank)
			return (double)bucket_upper(b) / 1000.0;
	}
	return 0;
}

static void pin(int cpu, const char *who)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set))
		fprintf(stderr, "prodcons: %s: affinity %d failed\n", who, cpu);
}

static void *consumer(void *arg)
{
	(void)arg;
	pin(cpu_c, "consumer");
	pthread_barrier_wait(&start);
	for (;;) {
		struct msg m;
		int64_t t, lat;

		pthread_mutex_lock(&q.lock);
		while (q.len == 0 && !q.done) {
			consumer_waits++;
			pthread_cond_wait(&q.not_empty, &q.lock);
		}
		if (q.len == 0) {
			pthread_mutex_unlock(&q.lock);
			break;
		}
		m = q.ring[q.head];
		q.head = (q.head + 1) % q.cap;
		q.len--;
		pthread_cond_signal(&q.not_full);
		pthread_mutex_unlock(&q.lock);

		t = now_ns();
		lat = t - m.enq_ns;
		if (lat < 0)
			lat = 0;
		hist[bucket_of((uint64_t)lat)]++;
		if (lat > max_lat_ns)
			max_lat_ns = lat;
		consumed++;
		last_ns = t;
	}
	return NULL;
}

static void usage(void)
{
	fprintf(stderr, "usage: prodcons [-d SECONDS] [-q CAPACITY] [-a CPU_PRODUCER] [-b CPU_CONSUMER] [-w WORK_NS]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	double secs = 5;
	int opt;
	pthread_t tc;

	q.cap = 64;
	while ((opt = getopt(argc, argv, "d:q:a:b:w:")) != -1) {
		switch (opt) {
		case 'd': secs = atof(optarg); break;
		case 'q': q.cap = atol(optarg); break;
		case 'a': cpu_p = atoi(optarg); break;
		case 'b': cpu_c = atoi(optarg); break;
		case 'w': work_ns = atol(optarg); break;
		default: usage();
		}
	}
	if (secs <= 0 || q.cap <= 0 || work_ns < 0)
		usage();
	if (mlockall(MCL_CURRENT | MCL_FUTURE))
		fprintf(stderr, "prodcons: mlockall: %s\n", strerror(errno));
	q.ring = calloc((size_t)q.cap, sizeof(*q.ring));
	if (!q.ring) {
		perror("prodcons: calloc");
		return 1;
	}
	if (pthread_barrier_init(&start, NULL, 2)) {
		perror("prodcons: pthread_barrier_init");
		return 1;
	}
	if (pthread_create(&tc, NULL, consumer, NULL)) {
		perror("prodcons: pthread_create");
		return 1;
	}
	pin(cpu_p, "producer");
	pthread_barrier_wait(&start);
	first_ns = now_ns();
	end_ns = first_ns + (int64_t)(secs * 1e9);

	while (now_ns() < end_ns) {
		pthread_mutex_lock(&q.lock);
		while (q.len == q.cap) {
			producer_waits++;
			pthread_cond_wait(&q.not_full, &q.lock);
		}
		q.ring[(q.head + q.len) % q.cap].enq_ns = now_ns();
		q.len++;
		/* One signal per message: the consumer may be asleep for each. */
		pthread_cond_signal(&q.not_empty);
		pthread_mutex_unlock(&q.lock);
		if (work_ns) {
			/* Busy, not asleep: the producer's CPU does not go idle. */
			const int64_t until = now_ns() + work_ns;

			while (now_ns() < until)
				;
		}
	}
	pthread_mutex_lock(&q.lock);
	q.done = 1;
	pthread_cond_broadcast(&q.not_empty);
	pthread_mutex_unlock(&q.lock);
	pthread_join(tc, NULL);

	if (consumed == 0) {
		printf("{\"messages\":0}\n");
		return 1;
	}
	double elapsed = (double)(last_ns - first_ns) / 1e9;

	printf("{\"messages\":%llu,\"msgs_per_s\":%.1f,\"latency_p50_us\":%.2f,\"latency_p99_us\":%.2f,"
	       "\"latency_max_us\":%.1f,\"consumer_waits\":%llu,\"producer_waits\":%llu,\"elapsed_s\":%.3f}\n",
	       (unsigned long long)consumed, elapsed > 0 ? (double)consumed / elapsed : 0.0,
	       percentile_us(consumed, 0.50), percentile_us(consumed, 0.99),
	       (double)max_lat_ns / 1000.0, (unsigned long long)consumer_waits,
	       (unsigned long long)producer_waits, elapsed);
	return 0;
}
