/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ring benchmark: producer and consumer in two processes on two cores, over
 * one region. For 16- and 64-byte elements and bursts 1, 8, 32 it prints ns
 * per element for raw rte_ring (the *_elem calls on the same ring memory)
 * beside the kvferry ring API (which adds the producer's wake check), and the
 * ratio; then a one-element ping-pong round trip, and the wake-up latency of
 * a consumer sleeping in shm_ring_wait(). Prints; never asserts time.
 *   KVFERRY_BENCH_N   elements per run (default 5x10^6)
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <rte_ring.h>
#include <rte_ring_elem.h>

#include "../../shm/ring_abi.h"
#include "hugepages.h"
#include "shm_region.h"
#include "shm_ring.h"

static char g_name[SHM_NAME_MAX];
static uint64_t g_n = 5000000ull;

struct shared {
	_Atomic int go;
	_Atomic int ready;
	double elapsed_s;
	double lat_ns[2048];
	int n_lat;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void pin(int cpu)
{
	cpu_set_t s;
	int n = (int)sysconf(_SC_NPROCESSORS_ONLN);

	CPU_ZERO(&s);
	CPU_SET(cpu % (n > 0 ? n : 1), &s);
	sched_setaffinity(0, sizeof(s), &s);
}

static struct rte_ring *raw_of(struct shm_region *r, const char *name)
{
	uint64_t off;

	if (shm_region_find_area(r, name, &off, NULL) != 0)
		return NULL;
	return (struct rte_ring *)((char *)shm_ptr(r, off) + SHM_RING_META_BYTES);
}

/* mode 0 = raw rte_ring, 1 = kvferry API */
static void producer(struct shm_region *r, const char *ring, int mode, unsigned esize,
		     unsigned burst, struct shared *sh)
{
	struct shm_ring *q = shm_ring_lookup(r, ring);
	struct rte_ring *raw = raw_of(r, ring);
	uint8_t buf[64 * 32];
	uint64_t sent = 0;

	memset(buf, 0xab, sizeof(buf));
	pin(0);
	atomic_fetch_add(&sh->ready, 1);
	while (!atomic_load(&sh->go))
		;
	while (sent < g_n) {
		unsigned n = burst;

		if (n > g_n - sent)
			n = (unsigned)(g_n - sent);
		sent += mode ? shm_ring_enqueue_burst(q, buf, n)
			     : rte_ring_enqueue_burst_elem(raw, buf, esize, n, NULL);
	}
}

static void consumer(struct shm_region *r, const char *ring, int mode, unsigned esize,
		     unsigned burst, struct shared *sh)
{
	struct shm_ring *q = shm_ring_lookup(r, ring);
	struct rte_ring *raw = raw_of(r, ring);
	uint8_t buf[64 * 32];
	uint64_t got = 0, t0;

	pin(1);
	atomic_fetch_add(&sh->ready, 1);
	while (!atomic_load(&sh->go))
		;
	t0 = now_ns();
	while (got < g_n)
		got += mode ? shm_ring_dequeue_burst(q, buf, burst)
			    : rte_ring_dequeue_burst_elem(raw, buf, esize, burst, NULL);
	sh->elapsed_s = (double)(now_ns() - t0) * 1e-9;
}

static double run_stream(struct shm_region *r, struct shared *sh, int mode, unsigned esize,
			 unsigned burst)
{
	char name[32];
	pid_t p, c;

	snprintf(name, sizeof(name), "s%d-%u-%u-%d", mode, esize, burst, rand());
	if (shm_ring_create(r, name, 1024, esize, 0) == NULL)
		return -1;
	atomic_store(&sh->go, 0);
	atomic_store(&sh->ready, 0);
	if ((c = fork()) == 0) {
		consumer(r, name, mode, esize, burst, sh);
		_exit(0);
	}
	if ((p = fork()) == 0) {
		producer(r, name, mode, esize, burst, sh);
		_exit(0);
	}
	while (atomic_load(&sh->ready) < 2)
		usleep(100);
	atomic_store(&sh->go, 1);
	waitpid(p, NULL, 0);
	waitpid(c, NULL, 0);
	return sh->elapsed_s * 1e9 / (double)g_n;
}

/* One-element ping-pong: mode 0 raw, 1 kvferry. Returns mean round trip ns. */
static double run_pingpong(struct shm_region *r, struct shared *sh, int mode, int iters)
{
	char a[32], b[32];
	pid_t pid;
	uint64_t t0;
	struct shm_ring *qa, *qb;
	struct rte_ring *ra, *rb;
	uint8_t e[16] = {0};

	snprintf(a, sizeof(a), "pa%d-%d", mode, rand());
	snprintf(b, sizeof(b), "pb%d-%d", mode, rand());
	qa = shm_ring_create(r, a, 64, 16, 0);
	qb = shm_ring_create(r, b, 64, 16, 0);
	if (!qa || !qb)
		return -1;
	ra = raw_of(r, a);
	rb = raw_of(r, b);
	atomic_store(&sh->ready, 0);
	if ((pid = fork()) == 0) {
		pin(1);
		atomic_store(&sh->ready, 1);
		for (int i = 0; i < iters; i++) {
			if (mode) {
				while (shm_ring_dequeue_burst(qa, e, 1) == 0)
					;
				shm_ring_enqueue_burst(qb, e, 1);
			} else {
				while (rte_ring_dequeue_burst_elem(ra, e, 16, 1, NULL) == 0)
					;
				rte_ring_enqueue_burst_elem(rb, e, 16, 1, NULL);
			}
		}
		_exit(0);
	}
	pin(0);
	while (!atomic_load(&sh->ready))
		;
	t0 = now_ns();
	for (int i = 0; i < iters; i++) {
		if (mode) {
			shm_ring_enqueue_burst(qa, e, 1);
			while (shm_ring_dequeue_burst(qb, e, 1) == 0)
				;
		} else {
			rte_ring_enqueue_burst_elem(ra, e, 16, 1, NULL);
			while (rte_ring_dequeue_burst_elem(rb, e, 16, 1, NULL) == 0)
				;
		}
	}
	t0 = now_ns() - t0;
	waitpid(pid, NULL, 0);
	return (double)t0 / iters;
}

/* One process, one core: enqueue a burst then dequeue it, for raw rte_ring
 * and the kvferry API. This isolates the API's own cost (the producer's
 * fence and waiter check) from cross-core scheduling noise, which on a
 * shared 2-vCPU machine can swamp the two-process figures. */
static double run_samecore(struct shm_region *r, int mode, unsigned esize, unsigned burst)
{
	char name[32];
	struct shm_ring *q;
	struct rte_ring *raw;
	uint8_t buf[64 * 32];
	uint64_t t0, n = g_n;

	snprintf(name, sizeof(name), "c%d-%u-%u-%d", mode, esize, burst, rand());
	q = shm_ring_create(r, name, 1024, esize, 0);
	if (q == NULL)
		return -1;
	raw = raw_of(r, name);
	memset(buf, 0x5a, sizeof(buf));
	t0 = now_ns();
	for (uint64_t done = 0; done < n; done += burst) {
		if (mode) {
			shm_ring_enqueue_burst(q, buf, burst);
			shm_ring_dequeue_burst(q, buf, burst);
		} else {
			rte_ring_enqueue_burst_elem(raw, buf, esize, burst, NULL);
			rte_ring_dequeue_burst_elem(raw, buf, esize, burst, NULL);
		}
	}
	shm_ring_close(q);
	return (double)(now_ns() - t0) / (double)n;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* A consumer sleeping in shm_ring_wait(); the producer sends a timestamp
 * every 2 ms; the consumer records wake time minus send time. */
static void run_wakeup(struct shm_region *r, struct shared *sh, int count, double *p50,
		       double *p99)
{
	struct shm_ring *q = shm_ring_create(r, "wake", 64, 16, 0);
	pid_t pid;

	sh->n_lat = 0;
	atomic_store(&sh->ready, 0);
	if ((pid = fork()) == 0) {
		uint64_t e[2];

		pin(1);
		atomic_store(&sh->ready, 1);
		for (int i = 0; i < count; i++) {
			while (shm_ring_dequeue_burst(q, e, 1) == 0)
				shm_ring_wait(q, -1);
			sh->lat_ns[sh->n_lat++] = (double)(now_ns() - e[0]);
		}
		_exit(0);
	}
	pin(0);
	while (!atomic_load(&sh->ready))
		;
	for (int i = 0; i < count; i++) {
		uint64_t e[2];

		usleep(2000); /* long enough for the consumer to fall asleep */
		e[0] = now_ns();
		e[1] = 0;
		shm_ring_enqueue_burst(q, e, 1);
	}
	waitpid(pid, NULL, 0);
	qsort(sh->lat_ns, (size_t)sh->n_lat, sizeof(double), cmp_d);
	*p50 = sh->lat_ns[sh->n_lat / 2] / 1000.0;
	*p99 = sh->lat_ns[sh->n_lat * 99 / 100] / 1000.0;
}

int main(int argc, char **argv)
{
	static const unsigned esizes[] = {16, 64}, bursts[] = {1, 8, 32};
	struct shm_region_opts o;
	struct shm_region *r;
	struct shared *sh;
	char err[512];
	uint64_t off;
	const char *env = getenv("KVFERRY_BENCH_N");
	double p50, p99, rt_raw, rt_kvf;
	int huge;

	(void)argc;
	if (env)
		g_n = strtoull(env, NULL, 10);
	huge = test_hugepages_ensure(16, argv) == 0;
	snprintf(g_name, sizeof(g_name), "bench-ring-%d", (int)getpid());
	shm_region_opts_init(&o);
	o.name = g_name;
	o.size = 64u << 20;
	o.force_fallback = !huge;
	r = shm_region_create(&o, err, sizeof(err));
	if (r == NULL || shm_region_add_area(r, "res", sizeof(*sh), 64, SHM_AREA_RAW, &off) != 0) {
		fprintf(stderr, "bench_ring: %s\n", err);
		return 1;
	}
	sh = shm_ptr(r, off);
	printf("ring benchmark: 2 processes pinned to cpus 0 and 1, %llu elements per run, "
	       "region on %s, consumer polling\n", (unsigned long long)g_n,
	       huge ? "2 MiB hugepages" : "ordinary shared memory");
	printf("%-6s %-6s %14s %14s %8s\n", "esize", "burst", "rte_ring ns/el", "kvferry ns/el",
	       "ratio");
	for (unsigned i = 0; i < 2; i++)
		for (unsigned j = 0; j < 3; j++) {
			/* raw, kvferry, raw, kvferry, ...: best of three each,
			 * interleaved, against drift and neighbours' load */
			double raw = 1e30, kvf = 1e30;

			for (int k = 0; k < 3; k++) {
				double a = run_stream(r, sh, 0, esizes[i], bursts[j]);
				double b = run_stream(r, sh, 1, esizes[i], bursts[j]);

				raw = a < raw ? a : raw;
				kvf = b < kvf ? b : kvf;
			}
			printf("%-6u %-6u %14.2f %14.2f %7.2fx\n", esizes[i], bursts[j], raw, kvf,
			       kvf / raw);
		}
	printf("same core, enqueue a burst then dequeue it (the API's own cost):\n");
	printf("%-6s %-6s %14s %14s %8s\n", "esize", "burst", "rte_ring ns/el", "kvferry ns/el",
	       "ratio");
	for (unsigned i = 0; i < 2; i++)
		for (unsigned j = 0; j < 3; j++) {
			double raw = 1e30, kvf = 1e30;

			for (int k = 0; k < 3; k++) {
				double a = run_samecore(r, 0, esizes[i], bursts[j]);
				double b = run_samecore(r, 1, esizes[i], bursts[j]);

				raw = a < raw ? a : raw;
				kvf = b < kvf ? b : kvf;
			}
			printf("%-6u %-6u %14.2f %14.2f %7.2fx\n", esizes[i], bursts[j], raw, kvf,
			       kvf / raw);
		}
	rt_raw = run_pingpong(r, sh, 0, 200000);
	rt_kvf = run_pingpong(r, sh, 1, 200000);
	printf("ping-pong round trip, 1 element: rte_ring %.0f ns, kvferry %.0f ns (%.2fx)\n",
	       rt_raw, rt_kvf, rt_kvf / rt_raw);
	run_wakeup(r, sh, 500, &p50, &p99);
	printf("sleeping consumer woken by the producer: p50 %.1f us, p99 %.1f us (goal <= 20 us)\n",
	       p50, p99);
	shm_region_detach(r);
	shm_region_unlink(g_name);
	return 0;
}
