/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Multi-process ring stress: forked producers and consumers over one region
 * (on hugepages when they can be reserved), every descriptor checked:
 *  - SPSC: 10^7 descriptors in random bursts, each arriving exactly once and
 *    in order with its payload fields intact;
 *  - sleep/wake: a consumer that always sleeps when the ring is empty never
 *    strands a descriptor (no lost wake-up);
 *  - MPMC: 2 producers x 2 consumers sharing one ring, 10^7 descriptors,
 *    each seen exactly once (a shared bitmap catches duplicates and gaps).
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hugepages.h"
#include "shm_region.h"
#include "shm_ring.h"

#define SPSC_N 10000000ull
#define MPMC_PER_PRODUCER 5000000ull

static char g_name[SHM_NAME_MAX];

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return x;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static struct shm_region *attach(void)
{
	char err[256];
	struct shm_region *a = shm_region_attach(g_name, err, sizeof(err));

	if (a == NULL) {
		fprintf(stderr, "attach: %s\n", err);
		_exit(10);
	}
	return a;
}

static int spsc_producer(void)
{
	struct shm_ring *q = shm_ring_lookup(attach(), "spsc");
	struct shm_desc d[32];
	uint64_t next = 0, rnd = 1;

	while (next < SPSC_N) {
		unsigned n = (unsigned)(mix(rnd++) % 32) + 1, done;

		if (n > SPSC_N - next)
			n = (unsigned)(SPSC_N - next);
		for (unsigned i = 0; i < n; i++) {
			d[i].seq = next + i;
			d[i].off = mix(next + i);
			d[i].len = (uint32_t)(next + i);
			d[i].type = (uint16_t)((next + i) & 0xffff);
			d[i].flags = 0x5a5a;
			d[i].aux = ~(next + i);
		}
		done = 0;
		while (done < n) {
			unsigned k = shm_ring_enqueue_burst(q, d + done, n - done);

			if (k == 0)
				sched_yield();
			done += k;
		}
		next += n;
	}
	return 0;
}

static int spsc_consumer(void)
{
	struct shm_ring *q = shm_ring_lookup(attach(), "spsc");
	struct shm_desc d[32];
	uint64_t expect = 0;

	while (expect < SPSC_N) {
		unsigned n = shm_ring_dequeue_burst(q, d, 32);

		if (n == 0) {
			shm_ring_wait(q, 1000000);
			continue;
		}
		for (unsigned i = 0; i < n; i++, expect++) {
			if (d[i].seq != expect || d[i].off != mix(expect) ||
			    d[i].len != (uint32_t)expect || d[i].type != (uint16_t)(expect & 0xffff) ||
			    d[i].flags != 0x5a5a || d[i].aux != ~expect) {
				fprintf(stderr, "spsc: descriptor %llu arrived as seq %llu (or damaged)\n",
					(unsigned long long)expect, (unsigned long long)d[i].seq);
				return 1;
			}
		}
	}
	return shm_ring_count(q) == 0 ? 0 : 2;
}

static int mpmc_producer(int id)
{
	struct shm_ring *q = shm_ring_lookup(attach(), "mpmc");

	for (uint64_t i = 0; i < MPMC_PER_PRODUCER;) {
		struct shm_desc d[8];
		unsigned n = 8, k;

		for (unsigned j = 0; j < n; j++) {
			d[j].seq = (uint64_t)id * MPMC_PER_PRODUCER + i + j;
			d[j].aux = mix(d[j].seq);
		}
		k = shm_ring_enqueue_burst(q, d, n);
		if (k < n) {
			/* keep order simple: re-send the tail next round */
			sched_yield();
		}
		i += k;
	}
	return 0;
}

static int mpmc_consumer(_Atomic uint64_t *bitmap, _Atomic uint64_t *seen, uint64_t total)
{
	struct shm_ring *q = shm_ring_lookup(attach(), "mpmc");

	while (atomic_load(seen) < total) {
		struct shm_desc d[8];
		unsigned n = shm_ring_dequeue_burst(q, d, 8);

		if (n == 0) {
			sched_yield();
			continue;
		}
		for (unsigned j = 0; j < n; j++) {
			uint64_t s = d[j].seq, bit = 1ull << (s % 64);

			if (s >= total || d[j].aux != mix(s)) {
				fprintf(stderr, "mpmc: damaged descriptor seq %llu\n", (unsigned long long)s);
				return 1;
			}
			if (atomic_fetch_or(&bitmap[s / 64], bit) & bit) {
				fprintf(stderr, "mpmc: descriptor %llu delivered twice\n",
					(unsigned long long)s);
				return 2;
			}
		}
		atomic_fetch_add(seen, n);
	}
	return 0;
}

/* Sleep/wake: the consumer sleeps with no timeout whenever the ring is
 * empty; the producer sends small bursts with pauses of random length, so
 * many enqueues race the consumer falling asleep. A lost wake-up leaves the
 * consumer asleep forever: alarm() turns that into a failure, not a hang. */
#define WAKE_N 300000ull

static int wake_producer(void)
{
	struct shm_ring *q = shm_ring_lookup(attach(), "wake");
	uint64_t next = 0, rnd = 7;

	while (next < WAKE_N) {
		struct shm_desc d = {.seq = next};

		if (shm_ring_enqueue_burst(q, &d, 1) == 1)
			next++;
		switch (mix(rnd++) % 8) {
		case 0:
			usleep(1 + (unsigned)(mix(rnd) % 50));
			break;
		case 1:
			sched_yield();
			break;
		default:
			break;
		}
	}
	return 0;
}

static int wake_consumer(void)
{
	struct shm_ring *q = shm_ring_lookup(attach(), "wake");
	uint64_t expect = 0;

	alarm(120);
	while (expect < WAKE_N) {
		struct shm_desc d;

		if (shm_ring_dequeue_burst(q, &d, 1) == 0) {
			shm_ring_wait(q, -1);
			continue;
		}
		if (d.seq != expect++) {
			fprintf(stderr, "wake: got %llu, expected %llu\n", (unsigned long long)d.seq,
				(unsigned long long)(expect - 1));
			return 1;
		}
	}
	return 0;
}

static int wait_all(pid_t *pids, int n)
{
	int bad = 0;

	for (int i = 0; i < n; i++) {
		int st;

		waitpid(pids[i], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			fprintf(stderr, "child %d failed (status 0x%x)\n", (int)pids[i], st);
			bad++;
		}
	}
	return bad;
}

int main(int argc, char **argv)
{
	struct shm_region_opts o;
	struct shm_region *r;
	const uint64_t total = 2 * MPMC_PER_PRODUCER;
	_Atomic uint64_t *bitmap, *seen;
	char err[512];
	uint64_t off;
	pid_t pids[4];
	int huge = test_hugepages_ensure(8, argv) == 0, bad = 0;
	double t0;

	(void)argc;
	snprintf(g_name, sizeof(g_name), "t-stress-%d", (int)getpid());
	shm_region_opts_init(&o);
	o.name = g_name;
	o.size = 8u << 20;
	o.force_fallback = !huge;
	r = shm_region_create(&o, err, sizeof(err));
	if (r == NULL) {
		fprintf(stderr, "region: %s\n", err);
		return 1;
	}
	printf("region on %s\n", shm_region_is_huge(r) ? "2 MiB hugepages" : "ordinary shared memory (no hugepages here)");
	if (!shm_ring_create(r, "spsc", 4096, sizeof(struct shm_desc), 0) ||
	    !shm_ring_create(r, "mpmc", 4096, sizeof(struct shm_desc), SHM_RING_MP | SHM_RING_MC) ||
	    !shm_ring_create(r, "wake", 64, sizeof(struct shm_desc), 0) ||
	    shm_region_add_area(r, "bitmap", total / 8 + 64, 64, SHM_AREA_RAW, &off) != 0)
		return 1;
	bitmap = shm_ptr(r, off);
	seen = bitmap + total / 64;

	t0 = now_s();
	if ((pids[0] = fork()) == 0)
		_exit(spsc_producer());
	if ((pids[1] = fork()) == 0)
		_exit(spsc_consumer());
	bad += wait_all(pids, 2);
	printf("spsc: %llu descriptors, each once and in order: %s (%.2f s)\n",
	       (unsigned long long)SPSC_N, bad ? "FAILED" : "ok", now_s() - t0);

	t0 = now_s();
	for (int i = 0; i < 2; i++)
		if ((pids[i] = fork()) == 0)
			_exit(mpmc_producer(i));
	for (int i = 2; i < 4; i++)
		if ((pids[i] = fork()) == 0)
			_exit(mpmc_consumer(bitmap, seen, total));
	bad += wait_all(pids, 4);
	for (uint64_t i = 0; i < total / 64; i++)
		if (atomic_load(&bitmap[i]) != ~0ull) {
			fprintf(stderr, "mpmc: descriptors missing in word %llu\n", (unsigned long long)i);
			bad++;
			break;
		}
	printf("mpmc: %llu descriptors from 2 producers to 2 consumers, each exactly once: %s (%.2f s)\n",
	       (unsigned long long)total, bad ? "FAILED" : "ok", now_s() - t0);
	t0 = now_s();
	if ((pids[0] = fork()) == 0)
		_exit(wake_consumer());
	if ((pids[1] = fork()) == 0)
		_exit(wake_producer());
	bad += wait_all(pids, 2);
	printf("sleep/wake: %llu descriptors to a consumer that sleeps with no timeout, none "
	       "stranded: %s (%.2f s)\n", (unsigned long long)WAKE_N, bad ? "FAILED" : "ok",
	       now_s() - t0);
	shm_region_detach(r);
	shm_region_unlink(g_name);
	return bad ? 1 : 0;
}
