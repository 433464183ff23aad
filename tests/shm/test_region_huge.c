/* SPDX-License-Identifier: Apache-2.0 */
/* The hugepage path: skipped (77) where hugepages cannot be reserved. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "hugepages.h"
#include "shm_region.h"
#include "shm_ring.h"

static char g_name[SHM_NAME_MAX];

static void a_region_lands_on_hugepages_when_they_are_reserved(void **state)
{
	struct shm_region_opts o;
	struct shm_region *r;
	struct shm_ring *q;
	char err[512];
	pid_t pid;
	int st;

	(void)state;
	shm_region_opts_init(&o);
	o.name = g_name;
	o.size = 3u << 20;
	o.allow_fallback = 0;
	r = shm_region_create(&o, err, sizeof(err));
	assert_non_null(r);
	assert_int_equal(shm_region_is_huge(r), 1);
	assert_int_equal(shm_region_page_size(r), 2u << 20);
	assert_int_equal(shm_region_size(r) % (2u << 20), 0);
	q = shm_ring_create(r, "q", 64, 32, 0);
	assert_non_null(q);

	pid = fork();
	if (pid == 0) {
		struct shm_region *a = shm_region_attach(g_name, err, sizeof(err));
		struct shm_ring *c = a ? shm_ring_lookup(a, "q") : NULL;
		struct shm_desc d = {.off = 4096, .len = 7, .type = 3, .seq = 42};

		_exit(c && shm_region_is_huge(a) && shm_ring_enqueue_burst(c, &d, 1) == 1 ? 0 : 1);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	{
		struct shm_desc d;

		assert_int_equal(shm_ring_dequeue_burst(q, &d, 1), 1);
		assert_int_equal(d.seq, 42);
		assert_int_equal(d.len, 7);
	}
	shm_ring_close(q);
	shm_region_detach(r);
	assert_int_equal(shm_region_unlink(g_name), 0);
}

/* A restarted creator that finds no hugepages free falls back to ordinary
 * shared memory: its predecessor's file on hugetlbfs must go, or every
 * attacher would still find that one first (the fault drill's
 * hugepages-full: the restarted dataplane was never reached). */
static void a_region_that_falls_back_replaces_its_predecessor_on_hugepages(void **state)
{
	struct shm_region_opts o;
	struct shm_region *r, *old, *r2, *a;
	char err[512];

	(void)state;
	shm_region_opts_init(&o);
	o.name = g_name;
	o.size = 3u << 20;
	o.allow_fallback = 0;
	r = shm_region_create(&o, err, sizeof(err));
	assert_non_null(r);
	assert_int_equal(shm_region_is_huge(r), 1);
	old = shm_region_attach(g_name, err, sizeof(err));
	assert_non_null(old);
	o.allow_fallback = 1;
	o.force_fallback = 1; /* as when none are free */
	o.quiet = 1;
	r2 = shm_region_create(&o, err, sizeof(err));
	assert_non_null(r2);
	assert_int_equal(shm_region_is_huge(r2), 0);
	assert_int_equal(shm_region_replaced(old), 1);
	a = shm_region_attach(g_name, err, sizeof(err));
	assert_non_null(a);
	assert_int_equal(shm_region_is_huge(a), 0);
	assert_int_equal(shm_region_epoch(a), shm_region_epoch(r2));
	assert_int_equal(shm_region_replaced(a), 0);
	/* and the other way round: on hugepages again, the fallback file goes */
	shm_region_detach(a);
	o.force_fallback = 0;
	a = shm_region_create(&o, err, sizeof(err));
	assert_non_null(a);
	assert_int_equal(shm_region_is_huge(a), 1);
	assert_int_equal(shm_region_replaced(r2), 1);
	assert_int_equal(shm_region_unlink(g_name), 0);
	assert_int_equal(shm_region_unlink(g_name), -ENOENT);
	shm_region_detach(a);
	shm_region_detach(r2);
	shm_region_detach(old);
	shm_region_detach(r);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_region_lands_on_hugepages_when_they_are_reserved),
		cmocka_unit_test(a_region_that_falls_back_replaces_its_predecessor_on_hugepages),
	};

	(void)argc;
	if (test_hugepages_ensure(4, argv) != 0) {
		fprintf(stderr, "no 2 MiB hugepages can be reserved here (needs root and "
			"/sys/kernel/mm/hugepages): skipped\n");
		return 77;
	}
	snprintf(g_name, sizeof(g_name), "t-huge-%d", (int)getpid());
	return cmocka_run_group_tests(tests, NULL, NULL);
}
