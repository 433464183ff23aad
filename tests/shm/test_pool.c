/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "shm_pool.h"
#include "fallback_region.h"
#include "shm_region.h"

static char g_name[SHM_NAME_MAX];

static int setup(void **state)
{
	*state = test_fallback_region(g_name, 16u << 20);
	return *state ? 0 : -1;
}

static int teardown(void **state)
{
	shm_region_detach(*state);
	shm_region_unlink(g_name);
	return 0;
}

static void an_exhausted_pool_says_so_and_recovers_when_buffers_return(void **state)
{
	struct shm_pool *p = shm_pool_create(*state, "ex", 8, 1000);
	uint32_t idx[8], extra;

	assert_non_null(p);
	assert_int_equal(shm_pool_bufsize(p), 1024); /* rounded to 64 */
	for (int i = 0; i < 8; i++) {
		assert_int_equal(shm_pool_get(p, &idx[i]), 0);
		for (int j = 0; j < i; j++)
			assert_int_not_equal(idx[i], idx[j]);
		assert_int_equal(shm_pool_idx_of(p, shm_pool_buf_off(p, idx[i]) + 5), idx[i]);
	}
	assert_int_equal(shm_pool_available(p), 0);
	assert_int_equal(shm_pool_get(p, &extra), -ENOBUFS);
	assert_int_equal(shm_pool_put(p, idx[3]), 0);
	assert_int_equal(shm_pool_get(p, &extra), 0);
	assert_int_equal(extra, idx[3]);
	for (int i = 0; i < 8; i++)
		assert_int_equal(shm_pool_put(p, idx[i]), 0);
	assert_int_equal(shm_pool_available(p), 8);
	shm_pool_close(p);
}

static void the_holder_of_a_buffer_reads_as_its_pid_and_as_free_once_put(void **state)
{
	struct shm_pool *p = shm_pool_create(*state, "ho", 2, 64);
	uint32_t idx;

	assert_non_null(p);
	assert_int_equal(shm_pool_get(p, &idx), 0);
	assert_int_equal(shm_pool_holder(p, idx), (int32_t)getpid());
	assert_int_equal(shm_pool_holder(p, 2), -EINVAL);
	assert_int_equal(shm_pool_put(p, idx), 0);
	assert_int_equal(shm_pool_holder(p, idx), 0);
	shm_pool_close(p);
}

static void a_double_release_is_refused_and_the_buffer_is_not_handed_out_twice(void **state)
{
	struct shm_pool *p = shm_pool_create(*state, "dbl", 4, 64);
	uint32_t a, b, c, d, e;

	assert_non_null(p);
	assert_int_equal(shm_pool_get(p, &a), 0);
	assert_int_equal(shm_pool_put(p, a), 0);
	assert_int_equal(shm_pool_put(p, a), -EALREADY);
	assert_int_equal(shm_pool_put(p, 99), -EINVAL);
	assert_int_equal(shm_pool_available(p), 4);
	assert_int_equal(shm_pool_get(p, &a), 0);
	assert_int_equal(shm_pool_get(p, &b), 0);
	assert_int_equal(shm_pool_get(p, &c), 0);
	assert_int_equal(shm_pool_get(p, &d), 0);
	assert_int_equal(shm_pool_get(p, &e), -ENOBUFS);
	assert_true(a != b && a != c && a != d && b != c && b != d && c != d);
	assert_int_equal(shm_pool_idx_of(p, 0), -EINVAL);
	shm_pool_close(p);
}

/* Several processes get and put concurrently; each marks the buffer it
 * holds with its pid and checks nobody else wrote it while held. */
static void processes_sharing_a_pool_never_hold_the_same_buffer(void **state)
{
	struct shm_pool *p = shm_pool_create(*state, "mp", 16, 64);
	pid_t pids[4];
	int bad = 0;

	assert_non_null(p);
	for (int k = 0; k < 4; k++) {
		pids[k] = fork();
		if (pids[k] == 0) {
			char err[256];
			struct shm_region *a = shm_region_attach(g_name, err, sizeof(err));
			struct shm_pool *c = shm_pool_lookup(a, "mp");
			int me = getpid();

			for (int i = 0; i < 200000; i++) {
				uint32_t idx;
				_Atomic int *mark;
				int expect = 0;

				if (shm_pool_get(c, &idx) != 0)
					continue;
				mark = shm_pool_buf(c, idx);
				if (!atomic_compare_exchange_strong(mark, &expect, me))
					_exit(2); /* someone else holds it too */
				atomic_store(mark, 0);
				if (shm_pool_put(c, idx) != 0)
					_exit(3);
			}
			_exit(0);
		}
	}
	for (int k = 0; k < 4; k++) {
		int st;

		waitpid(pids[k], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			fprintf(stderr, "child %d exited with status 0x%x\n", (int)pids[k], st);
			bad++;
		}
	}
	assert_int_equal(bad, 0);
	assert_int_equal(shm_pool_available(p), 16);
	shm_pool_close(p);
}

/* A worker computing from a receive buffer is SIGKILLed: what it took (a
 * buffer the dataplane handed it) and what it got itself go back with
 * reclaim(); a live holder's buffer does not. */
static void what_a_killed_holder_held_goes_back_and_a_live_holders_stays(void **state)
{
	struct shm_pool *p = shm_pool_create(*state, "reclaim", 6, 64);
	uint32_t handed, mine, spare;
	int up[2], st;
	pid_t pid;
	char c;

	assert_non_null(p);
	assert_int_equal(shm_pool_get(p, &handed), 0); /* the dataplane fills it, hands it over */
	assert_int_equal(shm_pool_get(p, &mine), 0);   /* the dataplane's own, still filling */
	assert_int_equal(pipe(up), 0);
	pid = fork();
	if (pid == 0) {
		char err[256];
		struct shm_region *a = shm_region_attach(g_name, err, sizeof(err));
		struct shm_pool *q = a ? shm_pool_lookup(a, "reclaim") : NULL;
		uint32_t own;

		if (q == NULL || shm_pool_take(q, handed) != 0 || shm_pool_get(q, &own) != 0
		    || write(up[1], "x", 1) != 1)
			_exit(1);
		pause(); /* computing, when the kill comes */
		_exit(0);
	}
	assert_int_equal(read(up[0], &c, 1), 1);
	assert_int_equal(shm_pool_available(p), 3);
	kill(pid, SIGKILL);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_int_equal(shm_pool_reclaim(p, pid), 2); /* the one it took, the one it got */
	assert_int_equal(shm_pool_available(p), 5);     /* ours (mine) stays held */
	assert_int_equal(shm_pool_reclaim(p, pid), 0); /* once */
	assert_int_equal(shm_pool_take(p, handed), -EALREADY); /* it is free again */
	assert_int_equal(shm_pool_put(p, mine), 0);
	assert_int_equal(shm_pool_put(p, mine), -EALREADY);
	for (int i = 0; i < 6; i++)
		assert_int_equal(shm_pool_get(p, &spare), 0);
	assert_int_equal(shm_pool_get(p, &spare), -ENOBUFS);
	close(up[0]);
	close(up[1]);
	shm_pool_close(p);
}

/* A producer passes a buffer to its consumer's pid before the consumer can
 * dequeue it: a consumer killed between its dequeue and its take leaves the
 * buffer to the reclaim of its pid; a successor on the same ring takes only
 * a buffer still held by the pid it was passed to. */
static void a_buffer_passed_to_a_consumer_that_dies_before_taking_it_goes_back_and_no_successor_takes_it_twice(
	void **state)
{
	struct shm_pool *p = shm_pool_create(*state, "pass", 4, 64);
	int32_t me = (int32_t)getpid();
	uint32_t a, b, got[3];
	int st;
	pid_t dead = fork();

	if (dead == 0)
		_exit(0);
	assert_int_equal(waitpid(dead, &st, 0), dead);
	assert_non_null(p);
	assert_int_equal(shm_pool_get(p, &a), 0);
	assert_int_equal(shm_pool_get(p, &b), 0);
	/* passed to the consumer, who died before taking either */
	assert_int_equal(shm_pool_pass(p, a, 0, dead), 0);
	assert_int_equal(shm_pool_pass(p, b, me, dead), 0);
	assert_int_equal(shm_pool_holder(p, a), dead);
	/* a successor took b over from the dead pid before the reclaim... */
	assert_int_equal(shm_pool_pass(p, b, dead, me), 0);
	/* ...so the reclaim gives back only a */
	assert_int_equal(shm_pool_reclaim(p, dead), 1);
	assert_int_equal(shm_pool_holder(p, a), 0);
	assert_int_equal(shm_pool_holder(p, b), me);
	/* a, reclaimed, then handed out again: no one takes it as passed to the dead pid */
	assert_int_equal(shm_pool_pass(p, a, dead, me), -EALREADY);
	for (int i = 0; i < 3; i++) /* every free one, a among them */
		assert_int_equal(shm_pool_get(p, &got[i]), 0);
	assert_int_equal(shm_pool_holder(p, a), me);
	assert_int_equal(shm_pool_pass(p, a, dead, me), -ESRCH);
	/* a conditional put (to 0) frees only what the named pid holds */
	assert_int_equal(shm_pool_pass(p, a, dead, 0), -ESRCH);
	for (int i = 0; i < 3; i++)
		assert_int_equal(shm_pool_pass(p, got[i], me, 0), 0);
	assert_int_equal(shm_pool_pass(p, b, 0, 0), 0);
	assert_int_equal(shm_pool_available(p), 4);
	assert_int_equal(shm_pool_pass(p, 4, 0, me), -EINVAL);
	assert_int_equal(shm_pool_pass(p, 0, 0, -1), -EINVAL);
	shm_pool_close(p);
}

static void wedged(int sig)
{
	(void)sig;
	static const char m[] = "the pool is wedged: a get or put did not return within 20 s of a kill\n";
	(void)!write(2, m, sizeof(m) - 1);
	_exit(1);
}

/* Crash safety: a process that uses the pool only for get, take and put is
 * SIGKILLed at a random point 200 times, most often inside one of those
 * calls. After each kill the owner reclaims what the dead pid held, and then
 * every buffer must be there: all n handed out once each, the next get
 * refused, none lost and nothing wedged (a free list that a dead process
 * left half-updated would stall or lose buffers here). */
static void a_process_killed_at_random_points_200_times_leaves_every_buffer_to_reclaim(void **state)
{
	enum { N = 64, KILLS = 200 };
	struct shm_pool *p = shm_pool_create(*state, "kills", N, 64);
	unsigned seed = (unsigned)getpid();
	uint32_t reclaimed = 0;

	assert_non_null(p);
	signal(SIGALRM, wedged);
	for (int k = 0; k < KILLS; k++) {
		uint32_t got[N], idx;
		int up[2], st, n = 0;
		pid_t pid;
		char c;

		assert_int_equal(pipe(up), 0);
		pid = fork();
		if (pid == 0) {
			char err[256];
			struct shm_region *a = shm_region_attach(g_name, err, sizeof(err));
			struct shm_pool *q = a ? shm_pool_lookup(a, "kills") : NULL;
			uint32_t held[8];
			unsigned r = (unsigned)getpid(), h = 0;

			if (q == NULL || write(up[1], "x", 1) != 1)
				_exit(1);
			for (;;) { /* hold up to 8, give back in random order */
				r = r * 1103515245u + 12345u;
				if (h < 8 && (r >> 16) % 3 != 0 && shm_pool_get(q, &held[h]) == 0) {
					h++;
				} else if (h > 0) {
					unsigned j = (r >> 8) % h;
					(void)shm_pool_take(q, held[j]);
					(void)shm_pool_put(q, held[j]);
					held[j] = held[--h];
				}
			}
		}
		assert_true(pid > 0);
		assert_int_equal(read(up[0], &c, 1), 1);
		close(up[0]);
		close(up[1]);
		usleep((useconds_t)(rand_r(&seed) % 400));
		kill(pid, SIGKILL);
		assert_int_equal(waitpid(pid, &st, 0), pid);
		alarm(20);
		reclaimed += shm_pool_reclaim(p, pid);
		while (n < N && shm_pool_get(p, &idx) == 0)
			got[n++] = idx;
		if (n != N)
			fail_msg("kill %d: %d of %d buffers could be got after the reclaim (%u available)", k, n, N,
				 shm_pool_available(p));
		assert_int_equal(shm_pool_get(p, &idx), -ENOBUFS);
		for (int i = 0; i < n; i++)
			assert_int_equal(shm_pool_put(p, got[i]), 0);
		assert_int_equal(shm_pool_available(p), N);
		alarm(0);
	}
	signal(SIGALRM, SIG_DFL);
	assert_true(reclaimed > 0); /* the kills did land while buffers were held */
	shm_pool_close(p);
}

/* What a dead process held in every pool of the region goes back in one
 * call (the dataplane's, once the dead sender's sends all completed). */
static void what_a_dead_process_held_in_any_pool_of_the_region_goes_back_at_once(void **state)
{
	struct shm_pool *a = shm_pool_create(*state, "all.a", 4, 64), *b = shm_pool_create(*state, "all.b", 4, 64);
	uint32_t mine;
	int up[2], st;
	pid_t pid;
	char c;

	assert_non_null(a);
	assert_non_null(b);
	assert_int_equal(shm_pool_get(a, &mine), 0); /* ours stays held */
	assert_int_equal(pipe(up), 0);
	pid = fork();
	if (pid == 0) {
		char err[256];
		struct shm_region *r = shm_region_attach(g_name, err, sizeof(err));
		struct shm_pool *x = r ? shm_pool_lookup(r, "all.a") : NULL, *y = r ? shm_pool_lookup(r, "all.b") : NULL;
		uint32_t i;

		if (x == NULL || y == NULL || shm_pool_get(x, &i) || shm_pool_get(y, &i) || shm_pool_get(y, &i)
		    || write(up[1], "x", 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	assert_int_equal(read(up[0], &c, 1), 1);
	kill(pid, SIGKILL);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_int_equal(shm_pool_available(a), 2);
	assert_int_equal(shm_pool_available(b), 2);
	assert_int_equal(shm_pools_reclaim(*state, pid), 3);
	assert_int_equal(shm_pool_available(a), 3);
	assert_int_equal(shm_pool_available(b), 4);
	assert_int_equal(shm_pools_reclaim(*state, pid), 0);
	assert_int_equal(shm_pool_put(a, mine), 0);
	close(up[0]);
	close(up[1]);
	shm_pool_close(a);
	shm_pool_close(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(an_exhausted_pool_says_so_and_recovers_when_buffers_return),
		cmocka_unit_test(the_holder_of_a_buffer_reads_as_its_pid_and_as_free_once_put),
		cmocka_unit_test(a_double_release_is_refused_and_the_buffer_is_not_handed_out_twice),
		cmocka_unit_test(processes_sharing_a_pool_never_hold_the_same_buffer),
		cmocka_unit_test(what_a_killed_holder_held_goes_back_and_a_live_holders_stays),
		cmocka_unit_test(a_buffer_passed_to_a_consumer_that_dies_before_taking_it_goes_back_and_no_successor_takes_it_twice),
		cmocka_unit_test(a_process_killed_at_random_points_200_times_leaves_every_buffer_to_reclaim),
		cmocka_unit_test(what_a_dead_process_held_in_any_pool_of_the_region_goes_back_at_once),
	};

	snprintf(g_name, sizeof(g_name), "t-pool-%d", (int)getpid());
	return cmocka_run_group_tests(tests, setup, teardown);
}
