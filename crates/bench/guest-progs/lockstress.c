// SPDX-License-Identifier: Apache-2.0
/*
 * lockstress: threads hammering kernel sleeping locks, counting operations,
 * for the lock-holder scenario (eCS-like workloads: rwsem and mutex
 * contention whose holder is a known task on a known CPU).
 *
 *   lockstress [-d SECONDS] [-t THREADS] [-w WORKLOAD] [-D DIR]
 *
 * Workloads (-w, default files):
 * - files: every thread creates a file (open O_CREAT|O_EXCL) in ONE shared
 *   directory DIR (default /tmp/lockstress, made and emptied here; /tmp is a
 *   tmpfs in the bench's guest), closes and unlinks it. Creating and
 *   unlinking both take the directory's i_rwsem for writing: the threads
 *   queue on one rwsem whose owner is a running (or, on an overcommitted
 *   host, preempted) vCPU, and spin on it while its owner looks on-CPU.
 *   One operation = create + close + unlink.
 * - mmap: the threads of this one process map 16 KiB of anonymous memory,
 *   touch each page (page faults: mmap_lock for reading) and unmap it
 *   (mmap_lock for writing): every thread's mmap/munmap excludes every
 *   other's faults. One operation = mmap + 4 faults + munmap.
 * - rename (the bench's default): every thread renames its own file from
 *   DIR/a to DIR/b and back: the rename mutex and both directories' rwsems.
 * - rename-own: the control without a shared lock: every thread renames
 *   its own file within its own directory DIR/t<id> and back.
 * - web: an application, a web server under a load generator. BusyBox's
 *   httpd (run here, serving DIR on 127.0.0.1:WEB_PORT) forks a process per
 *   connection, as a prefork server does; every thread is a client that
 *   connects, asks for a 4 KiB page over HTTP/1.0 and reads the answer to
 *   its end. The kernel's locks are the application's: fork and exit (the
 *   parent's mmap_lock, the binary's i_mmap_rwsem shared by every process),
 *   the listening socket's accept queue, the file's lookups. One operation
 *   = one request answered 200.
 *
 * THREADS defaults to 2 per online CPU. The threads start together and run
 * SECONDS (default 10); every second the main thread samples the operations
 * done so far. Prints one line of JSON:
 * {"workload":"files","threads":4,"cpus":2,"ops":N,"ops_per_s":X,
 *  "elapsed_s":S,"per_s":[...],"thread_ops_min":A,"thread_ops_max":B}
 * where ops counts the operations finished by the end of the measurement
 * (sampled at the deadline, not after the threads stop), per_s the
 * operations finished in each whole second, and the thread minimum and
 * maximum show how evenly the threads got the lock.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 256
#define MAX_SECONDS 3600
#define MMAP_PAGES 4
/* The write workload: 4 KiB writes into 64 slots of one 256 KiB file. */
#define WRITE_BYTES 4096
#define WRITE_SLOTS 64
/* The web workload: the server's port and the page it serves. */
#define WEB_PORT 18080
#define WEB_PAGE_BYTES 4096

enum workload { W_FILES, W_RENAME, W_WRITE, W_MMAP, W_RENAME_OWN, W_WEB };

/* One counter per thread, each on its own cache line. */
struct counter {
	_Atomic uint64_t ops;
	char pad[64 - sizeof(uint64_t)];
} __attribute__((aligned(64)));

static const char *const names[] = { "files", "rename", "write", "mmap", "rename-own", "web" };
static struct counter counts[MAX_THREADS];
static _Atomic int stop;
static enum workload work = W_FILES;
static const char *dir = "/tmp/lockstress";
static pthread_barrier_t start;
static long page;

static int64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void sleep_until(int64_t ns)
{
	struct timespec t = { .tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR)
		;
}

static uint64_t total(int n)
{
	uint64_t s = 0;

	for (int i = 0; i < n; i++)
		s += atomic_load_explicit(&counts[i].ops, memory_order_relaxed);
	return s;
}

static int files_op(int id, uint64_t seq)
{
	char name[256];
	int fd;

	/* A few names per thread, reused: unique names would pile up negative
	 * dentries in the directory and slow every lookup down over the run. */
	snprintf(name, sizeof(name), "%s/t%d-%llu", dir, id, (unsigned long long)(seq % 4));
	fd = open(name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
	if (fd < 0) {
		fprintf(stderr, "lockstress: open %s: %s\n", name, strerror(errno));
		return -1;
	}
	close(fd);
	if (unlink(name)) {
		fprintf(stderr, "lockstress: unlink %s: %s\n", name, strerror(errno));
		return -1;
	}
	return 0;
}

/*
 * The file thread @id renames: in directory a/ (rename), or in its own
 * directory t<id>/ (rename-own).
 */
static int rename_setup(int id)
{
	char name[256];
	int fd;

	if (work == W_RENAME_OWN) {
		snprintf(name, sizeof(name), "%s/t%d", dir, id);
		mkdir(name, 0700);
		snprintf(name, sizeof(name), "%s/t%d/a", dir, id);
	} else {
		snprintf(name, sizeof(name), "%s/a", dir);
		mkdir(name, 0700);
		snprintf(name, sizeof(name), "%s/b", dir);
		mkdir(name, 0700);
		snprintf(name, sizeof(name), "%s/a/t%d", dir, id);
	}
	fd = open(name, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	if (fd < 0) {
		fprintf(stderr, "lockstress: open %s: %s\n", name, strerror(errno));
		return -1;
	}
	close(fd);
	return 0;
}

static int rename_op(int id)
{
	char a[256], b[256];

	if (work == W_RENAME_OWN) {
		/* One directory per thread: no lock another thread takes. */
		snprintf(a, sizeof(a), "%s/t%d/a", dir, id);
		snprintf(b, sizeof(b), "%s/t%d/b", dir, id);
	} else {
		snprintf(a, sizeof(a), "%s/a/t%d", dir, id);
		snprintf(b, sizeof(b), "%s/b/t%d", dir, id);
	}
	if (rename(a, b) || rename(b, a)) {
		fprintf(stderr, "lockstress: rename t%d: %s\n", id, strerror(errno));
		return -1;
	}
	return 0;
}

static int write_fd = -1;
static char write_buf[WRITE_BYTES];

static int write_op(int id, uint64_t seq)
{
	off_t off = (off_t)(((uint64_t)id * 7 + seq) % WRITE_SLOTS) * WRITE_BYTES;
	ssize_t n = pwrite(write_fd, write_buf, sizeof(write_buf), off);

	if (n != (ssize_t)sizeof(write_buf)) {
		fprintf(stderr, "lockstress: pwrite: %s\n", n < 0 ? strerror(errno) : "short");
		return -1;
	}
	return 0;
}

static int mmap_op(void)
{
	size_t len = (size_t)page * MMAP_PAGES;
	volatile char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		fprintf(stderr, "lockstress: mmap: %s\n", strerror(errno));
		return -1;
	}
	for (int i = 0; i < MMAP_PAGES; i++)
		p[(size_t)i * (size_t)page] = (char)i;
	if (munmap((void *)p, len)) {
		fprintf(stderr, "lockstress: munmap: %s\n", strerror(errno));
		return -1;
	}
	return 0;
}

static pid_t web_server = -1;

static int web_connect(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(WEB_PORT) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		close(fd);
		return -1;
	}
	return fd;
}

/* The loopback interface up (a minimal guest boots with it down). */
static int loopback_up(void)
{
	struct ifreq ifr;
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	int rc = -1;

	if (fd < 0)
		return -1;
	memset(&ifr, 0, sizeof(ifr));
	strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
	if (!ioctl(fd, SIOCGIFFLAGS, &ifr)) {
		ifr.ifr_flags |= IFF_UP;
		rc = ioctl(fd, SIOCSIFFLAGS, &ifr);
	}
	close(fd);
	return rc;
}

/* Writes the page, starts httpd on it and waits until it accepts. */
static int web_setup(void)
{
	char name[256], port[32], page_buf[WEB_PAGE_BYTES];
	int fd;

	if (loopback_up())
		fprintf(stderr, "lockstress: bringing lo up: %s\n", strerror(errno));

	snprintf(name, sizeof(name), "%s/index.html", dir);
	fd = open(name, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
	memset(page_buf, 'x', sizeof(page_buf));
	if (fd < 0 || write(fd, page_buf, sizeof(page_buf)) != (ssize_t)sizeof(page_buf)) {
		fprintf(stderr, "lockstress: writing %s: %s\n", name, strerror(errno));
		return -1;
	}
	close(fd);
	snprintf(port, sizeof(port), "127.0.0.1:%d", WEB_PORT);
	web_server = fork();
	if (web_server < 0) {
		perror("lockstress: fork");
		return -1;
	}
	if (web_server == 0) {
		execlp("busybox", "busybox", "httpd", "-f", "-p", port, "-h", dir, (char *)NULL);
		perror("lockstress: exec busybox httpd");
		_exit(127);
	}
	for (int i = 0; i < 500; i++) {
		fd = web_connect();
		if (fd >= 0) {
			close(fd);
			return 0;
		}
		usleep(10000);
	}
	fprintf(stderr, "lockstress: httpd does not accept on %s\n", port);
	return -1;
}

static void web_teardown(void)
{
	if (web_server <= 0)
		return;
	kill(web_server, SIGTERM);
	waitpid(web_server, NULL, 0);
}

static int web_op(void)
{
	static const char req[] = "GET /index.html HTTP/1.0\r\nHost: localhost\r\n\r\n";
	char buf[8192];
	size_t got = 0;
	ssize_t n;
	int fd = web_connect();

	if (fd < 0) {
		fprintf(stderr, "lockstress: connect: %s\n", strerror(errno));
		return -1;
	}
	if (write(fd, req, sizeof(req) - 1) != (ssize_t)(sizeof(req) - 1)) {
		fprintf(stderr, "lockstress: request: %s\n", strerror(errno));
		close(fd);
		return -1;
	}
	while ((n = read(fd, buf + (got < 64 ? got : 64), sizeof(buf) - 64)) > 0)
		got += (size_t)n;
	close(fd);
	buf[got < 64 ? got : 63] = '\0';
	if (n < 0 || got < WEB_PAGE_BYTES || strncmp(buf, "HTTP/1.", 7) || !strstr(buf, " 200")) {
		fprintf(stderr, "lockstress: bad answer (%zu bytes): %.40s\n", got, buf);
		return -1;
	}
	return 0;
}

static void *worker(void *arg)
{
	int id = (int)(intptr_t)arg;
	uint64_t seq = 0;

	pthread_barrier_wait(&start);
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		int rc;

		switch (work) {
		case W_FILES: rc = files_op(id, seq); break;
		case W_RENAME:
		case W_RENAME_OWN: rc = rename_op(id); break;
		case W_WRITE: rc = write_op(id, seq); break;
		case W_WEB: rc = web_op(); break;
		default: rc = mmap_op(); break;
		}

		if (rc) {
			atomic_store(&stop, 1);
			return (void *)1;
		}
		seq++;
		atomic_store_explicit(&counts[id].ops, seq, memory_order_relaxed);
	}
	return NULL;
}

static void usage(void)
{
	fprintf(stderr, "usage: lockstress [-d SECONDS] [-t THREADS] [-w files|rename|rename-own|write|mmap|web] [-D DIR]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	static uint64_t per_s[MAX_SECONDS];
	static pthread_t tids[MAX_THREADS];
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	int threads = 0, opt, failed = 0, nsec = 0;
	double secs = 10;
	uint64_t prev = 0, ops, tmin = UINT64_MAX, tmax = 0;
	int64_t t0, end, t_end;

	while ((opt = getopt(argc, argv, "d:t:w:D:")) != -1) {
		switch (opt) {
		case 'd': secs = atof(optarg); break;
		case 't': threads = atoi(optarg); break;
		case 'w':
			if (!strcmp(optarg, "files"))
				work = W_FILES;
			else if (!strcmp(optarg, "rename"))
				work = W_RENAME;
			else if (!strcmp(optarg, "rename-own"))
				work = W_RENAME_OWN;
			else if (!strcmp(optarg, "write"))
				work = W_WRITE;
			else if (!strcmp(optarg, "mmap"))
				work = W_MMAP;
			else if (!strcmp(optarg, "web"))
				work = W_WEB;
			else
				usage();
			break;
		case 'D': dir = optarg; break;
		default: usage();
		}
	}
	if (cpus < 1)
		cpus = 1;
	if (threads == 0)
		threads = (int)(2 * cpus);
	if (secs <= 0 || secs > MAX_SECONDS || threads < 1 || threads > MAX_THREADS)
		usage();
	page = sysconf(_SC_PAGESIZE);
	if (page <= 0)
		page = 4096;
	if (work != W_MMAP) {
		char cmd[512];

		if (mkdir(dir, 0700) && errno != EEXIST) {
			fprintf(stderr, "lockstress: mkdir %s: %s\n", dir, strerror(errno));
			return 1;
		}
		/* Leftovers of an interrupted run would make O_EXCL fail. */
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'/* 2>/dev/null", dir);
		if (system(cmd) == -1)
			fprintf(stderr, "lockstress: cleaning %s failed\n", dir);
	}
	if (work == W_RENAME || work == W_RENAME_OWN) {
		for (int i = 0; i < threads; i++)
			if (rename_setup(i))
				return 1;
	}
	if (work == W_WRITE) {
		char name[256];

		snprintf(name, sizeof(name), "%s/shared", dir);
		write_fd = open(name, O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
		if (write_fd < 0) {
			fprintf(stderr, "lockstress: open %s: %s\n", name, strerror(errno));
			return 1;
		}
		memset(write_buf, 'x', sizeof(write_buf));
	}
	if (work == W_WEB && web_setup()) {
		web_teardown();
		return 1;
	}
	if (pthread_barrier_init(&start, NULL, (unsigned)threads + 1)) {
		perror("lockstress: pthread_barrier_init");
		return 1;
	}
	for (int i = 0; i < threads; i++) {
		if (pthread_create(&tids[i], NULL, worker, (void *)(intptr_t)i)) {
			perror("lockstress: pthread_create");
			return 1;
		}
	}
	pthread_barrier_wait(&start);
	t0 = now_ns();
	end = t0 + (int64_t)(secs * 1e9);
	for (int64_t next = t0 + 1000000000LL; next <= end; next += 1000000000LL) {
		uint64_t s;

		sleep_until(next);
		s = total(threads);
		per_s[nsec++] = s - prev;
		prev = s;
		if (atomic_load(&stop))
			break;
	}
	sleep_until(end);
	ops = total(threads);
	t_end = now_ns();
	atomic_store(&stop, 1);
	for (int i = 0; i < threads; i++) {
		void *r;

		pthread_join(tids[i], &r);
		failed |= r != NULL;
	}
	for (int i = 0; i < threads; i++) {
		uint64_t n = atomic_load(&counts[i].ops);

		if (n < tmin)
			tmin = n;
		if (n > tmax)
			tmax = n;
	}
	if (work == W_WRITE)
		close(write_fd);
	if (work == W_WEB)
		web_teardown();
	if (work != W_MMAP) {
		char cmd[512];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		if (system(cmd) == -1)
			fprintf(stderr, "lockstress: removing %s failed\n", dir);
	}

	double elapsed = (double)(t_end - t0) / 1e9;

	printf("{\"workload\":\"%s\",\"threads\":%d,\"cpus\":%ld,\"ops\":%llu,\"ops_per_s\":%.1f,"
	       "\"elapsed_s\":%.3f,\"per_s\":[",
	       names[work], threads, cpus, (unsigned long long)ops,
	       elapsed > 0 ? (double)ops / elapsed : 0.0, elapsed);
	for (int i = 0; i < nsec; i++)
		printf("%s%llu", i ? "," : "", (unsigned long long)per_s[i]);
	printf("],\"thread_ops_min\":%llu,\"thread_ops_max\":%llu,\"failed\":%s}\n",
	       (unsigned long long)tmin, (unsigned long long)tmax, failed ? "true" : "false");
	return failed;
}
