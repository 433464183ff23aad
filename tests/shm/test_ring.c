/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <rte_ring.h>

#include "../../shm/ring_abi.h"
#include "shm_live.h"
#include "fallback_region.h"
#include "shm_region.h"
#include "shm_ring.h"

static char g_name[SHM_NAME_MAX];

static int setup(void **state)
{
	*state = test_fallback_region(g_name, 8u << 20);
	return *state ? 0 : -1;
}

static int teardown(void **state)
{
	shm_region_detach(*state);
	shm_region_unlink(g_name);
	return 0;
}

static void a_ring_holds_exactly_its_capacity_and_reports_full_and_empty(void **state)
{
	struct shm_ring *q = shm_ring_create(*state, "cap", 100, 32, 0);
	struct shm_desc d[128];

	assert_non_null(q);
	assert_int_equal(shm_ring_capacity(q), 100);
	memset(d, 0, sizeof(d));
	for (int i = 0; i < 128; i++)
		d[i].seq = (uint64_t)i;
	/* A burst larger than the free space enqueues what fits. */
	assert_int_equal(shm_ring_enqueue_burst(q, d, 128), 100);
	assert_int_equal(shm_ring_free_count(q), 0);
	assert_int_equal(shm_ring_enqueue_burst(q, d, 1), 0);
	assert_int_equal(shm_ring_count(q), 100);
	memset(d, 0xff, sizeof(d));
	assert_int_equal(shm_ring_dequeue_burst(q, d, 128), 100);
	for (int i = 0; i < 100; i++)
		assert_int_equal(d[i].seq, (uint64_t)i);
	assert_int_equal(shm_ring_dequeue_burst(q, d, 1), 0);
	shm_ring_close(q);
}

static void indices_wrap_past_two_to_the_32_without_losing_order(void **state)
{
	struct shm_ring *q = shm_ring_create(*state, "wrap", 64, 16, 0);
	struct rte_ring *r;
	uint64_t e[2], next = 0, got = 0;

	assert_non_null(q);
	/* Park the 32-bit head/tail words just below the wrap point. */
	{
		uint64_t off;

		assert_int_equal(shm_region_find_area(*state, "wrap", &off, NULL), 0);
		r = (struct rte_ring *)((char *)shm_ptr(*state, off) + SHM_RING_META_BYTES);
	}
	r->prod.head = r->prod.tail = r->cons.head = r->cons.tail = UINT32_MAX - 100;
	for (int round = 0; round < 20; round++) {
		for (int i = 0; i < 37; i++) {
			e[0] = next++;
			e[1] = ~e[0];
			assert_int_equal(shm_ring_enqueue_burst(q, e, 1), 1);
		}
		while (shm_ring_dequeue_burst(q, e, 1) == 1) {
			assert_int_equal(e[0], got);
			assert_int_equal(e[1], ~got);
			got++;
		}
	}
	assert_int_equal(got, next);
	assert_true(r->prod.tail < 1000); /* it did wrap */
	shm_ring_close(q);
}

static void a_ring_rejects_bad_parameters_and_duplicate_names(void **state)
{
	struct shm_ring *q = shm_ring_create(*state, "dup", 16, 16, 0);

	assert_non_null(q);
	assert_null(shm_ring_create(*state, "dup", 16, 16, 0));
	assert_int_equal(errno, EEXIST);
	assert_null(shm_ring_create(*state, "odd", 16, 6, 0));
	assert_int_equal(errno, EINVAL);
	assert_null(shm_ring_create(*state, "zero", 0, 16, 0));
	assert_int_equal(errno, EINVAL);
	assert_null(shm_ring_lookup(*state, "missing"));
	assert_int_equal(errno, ENOENT);
	shm_ring_close(q);
}

struct waiter {
	struct shm_ring *q;
	int rc;
	uint64_t woke_ns;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *wait_thread(void *arg)
{
	struct waiter *w = arg;

	w->rc = shm_ring_wait(w->q, 5000000000ll);
	w->woke_ns = now_ns();
	return NULL;
}

static void a_sleeping_consumer_is_woken_by_the_producer(void **state)
{
	struct shm_ring *q = shm_ring_create(*state, "sleep", 16, 32, 0);
	struct waiter w = {.q = q, .rc = 1};
	struct shm_desc d = {.seq = 7};
	struct shm_ring_meta *meta;
	pthread_t th;
	uint64_t off, sent;

	assert_non_null(q);
	assert_int_equal(shm_region_find_area(*state, "sleep", &off, NULL), 0);
	meta = shm_ptr(*state, off);
	assert_int_equal(pthread_create(&th, NULL, wait_thread, &w), 0);
	/* Wait until the consumer is really asleep. */
	while (atomic_load(&meta->waiters) == 0)
		usleep(100);
	usleep(20000);
	sent = now_ns();
	assert_int_equal(shm_ring_enqueue_burst(q, &d, 1), 1);
	pthread_join(th, NULL);
	assert_int_equal(w.rc, 0);
	/* Woken by the producer, not by the 5 s timeout. */
	assert_true(w.woke_ns - sent < 1000000000ull);
	assert_int_equal(atomic_load(&meta->waiters), 0);
	shm_ring_close(q);
}

static void a_wait_on_an_empty_ring_times_out(void **state)
{
	struct shm_ring *q = shm_ring_create(*state, "idle", 16, 32, 0);
	uint64_t t0 = now_ns();

	assert_non_null(q);
	assert_int_equal(shm_ring_wait(q, 20000000), -ETIMEDOUT);
	assert_true(now_ns() - t0 >= 15000000);
	assert_int_equal(shm_ring_wait(q, 0), -ETIMEDOUT);
	shm_ring_close(q);
}

struct any_waiter {
	struct shm_ring *q[3];
	int rc;
	uint64_t woke_ns;
};

static void *wait_any_thread(void *arg)
{
	struct any_waiter *w = arg;

	w->rc = shm_ring_wait_any(w->q, 3, 5000000000ll);
	w->woke_ns = now_ns();
	return NULL;
}

/* A worker sleeps on its input ring and its KV rings at once: a message on
 * the last of them wakes it (not the 5 s bound), the others are left
 * alone, and a wait on rings that stay empty times out. */
static void a_consumer_sleeping_on_several_rings_is_woken_by_any_of_them(void **state)
{
	struct shm_ring *a = shm_ring_create(*state, "any.a", 16, 32, 0);
	struct shm_ring *b = shm_ring_create(*state, "any.b", 16, 32, 0);
	struct any_waiter w = { .q = { a, NULL, b }, .rc = 1 };
	struct shm_desc d = { .seq = 9 }, got;
	struct shm_ring_meta *ma, *mb;
	pthread_t th;
	uint64_t off, sent, t0;

	assert_non_null(a);
	assert_non_null(b);
	assert_int_equal(shm_region_find_area(*state, "any.a", &off, NULL), 0);
	ma = shm_ptr(*state, off);
	assert_int_equal(shm_region_find_area(*state, "any.b", &off, NULL), 0);
	mb = shm_ptr(*state, off);
	assert_int_equal(pthread_create(&th, NULL, wait_any_thread, &w), 0);
	while (atomic_load(&mb->waiters) == 0)
		usleep(100);
	usleep(20000);
	assert_int_equal(atomic_load(&ma->waiters), 1);
	sent = now_ns();
	assert_int_equal(shm_ring_enqueue_burst(b, &d, 1), 1);
	pthread_join(th, NULL);
	assert_int_equal(w.rc, 0);
	assert_true(w.woke_ns - sent < 1000000000ull);
	assert_int_equal(atomic_load(&ma->waiters), 0);
	assert_int_equal(atomic_load(&mb->waiters), 0);
	/* the message is still on its ring, for its own reader */
	assert_int_equal(shm_ring_count(a), 0);
	assert_int_equal(shm_ring_dequeue_burst(b, &got, 1), 1);
	assert_int_equal(got.seq, 9);
	/* a message already there: no sleep at all */
	assert_int_equal(shm_ring_enqueue_burst(a, &d, 1), 1);
	assert_int_equal(shm_ring_wait_any(w.q, 3, -1), 0);
	assert_int_equal(shm_ring_dequeue_burst(a, &got, 1), 1);
	t0 = now_ns();
	assert_int_equal(shm_ring_wait_any(w.q, 3, 20000000), -ETIMEDOUT);
	assert_true(now_ns() - t0 >= 15000000);
	assert_int_equal(shm_ring_wait_any(w.q, 3, 0), -ETIMEDOUT);
	assert_int_equal(shm_ring_wait_any(w.q, SHM_RING_WAIT_MAX + 1, 0), -EINVAL);
	shm_ring_close(a);
	shm_ring_close(b);
}

/* A consumer killed mid-run: the owner sees it dead through its liveness
 * word, resets the ring (what was in flight is discarded and reported by
 * count), and a new consumer carries on with fresh traffic. */
static void a_ring_whose_consumer_died_is_reset_by_the_owner_and_reused(void **state)
{
	struct shm_region *reg = *state;
	struct shm_ring *q = shm_ring_create(reg, "kill", 1024, 32, 0);
	struct shm_desc d = {0};
	int slot = -1, st;
	pid_t pid;

	assert_non_null(q);
	pid = fork();
	if (pid == 0) {
		char err[256];
		struct shm_region *a = shm_region_attach(g_name, err, sizeof(err));
		struct shm_ring *c = shm_ring_lookup(a, "kill");
		int s = shm_live_register(a, "consumer");

		(void)s;
		for (;;) { /* a slow consumer: one descriptor per millisecond */
			struct shm_desc x;

			shm_live_beat(a, s);
			shm_ring_dequeue_burst(c, &x, 1);
			usleep(1000);
		}
	}
	while ((slot = shm_live_find(reg, "consumer")) < 0)
		usleep(1000);
	for (int i = 0; i < 500; i++) {
		d.seq = (uint64_t)i;
		while (shm_ring_enqueue_burst(q, &d, 1) != 1)
			usleep(100);
	}
	assert_int_equal(shm_live_check(reg, slot, 1000000000ull, NULL), SHM_LIVE_ALIVE);
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	assert_int_equal(shm_live_check(reg, slot, 1000000000ull, NULL), SHM_LIVE_DEAD);
	{
		unsigned left = shm_ring_count(q);

		assert_true(left > 0); /* the consumer was slow: descriptors were in flight */
		assert_int_equal(shm_ring_reset(q), left);
	}
	assert_int_equal(shm_ring_count(q), 0);
	d.seq = 1000;
	assert_int_equal(shm_ring_enqueue_burst(q, &d, 1), 1);
	assert_int_equal(shm_ring_dequeue_burst(q, &d, 1), 1);
	assert_int_equal(d.seq, 1000);
	shm_ring_close(q);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_ring_holds_exactly_its_capacity_and_reports_full_and_empty),
		cmocka_unit_test(indices_wrap_past_two_to_the_32_without_losing_order),
		cmocka_unit_test(a_ring_rejects_bad_parameters_and_duplicate_names),
		cmocka_unit_test(a_sleeping_consumer_is_woken_by_the_producer),
		cmocka_unit_test(a_wait_on_an_empty_ring_times_out),
		cmocka_unit_test(a_consumer_sleeping_on_several_rings_is_woken_by_any_of_them),
		cmocka_unit_test(a_ring_whose_consumer_died_is_reset_by_the_owner_and_reused),
	};

	snprintf(g_name, sizeof(g_name), "t-ring-%d", (int)getpid());
	return cmocka_run_group_tests(tests, setup, teardown);
}
