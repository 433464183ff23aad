/* SPDX-License-Identifier: Apache-2.0 */
/* The hugepage path: skipped (77) where hugepages cannot be reserved. */
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

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_region_lands_on_hugepages_when_they_are_reserved),
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
