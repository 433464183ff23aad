/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../shm/region_abi.h"
#include "fallback_region.h"
#include "shm_region.h"

static char g_name[SHM_NAME_MAX];

static struct shm_region *fallback_region(size_t size)
{
	return test_fallback_region(g_name, size);
}

static void a_fallback_region_is_found_by_name_from_another_process(void **state)
{
	struct shm_region *r = fallback_region(1 << 20);
	uint64_t off;
	pid_t pid;
	int st;

	(void)state;
	assert_non_null(r);
	assert_int_equal(shm_region_is_huge(r), 0);
	assert_int_equal(shm_region_add_area(r, "buf", 4096, 64, SHM_AREA_RAW, &off), 0);
	strcpy(shm_ptr(r, off), "written by the creator");

	pid = fork();
	if (pid == 0) {
		char err[256];
		struct shm_region *a = shm_region_attach(g_name, err, sizeof(err));
		uint64_t o2;
		size_t sz;
		int ok = a && shm_region_find_area(a, "buf", &o2, &sz) == 0 && o2 == off &&
			 sz == 4096 && strcmp(shm_ptr(a, o2), "written by the creator") == 0 &&
			 shm_region_epoch(a) == shm_region_epoch(r);
		if (ok)
			strcpy(shm_ptr(a, o2), "answered by the attacher");
		_exit(ok ? 0 : 1);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	assert_string_equal(shm_ptr(r, off), "answered by the attacher");
	shm_region_detach(r);
	assert_int_equal(shm_region_unlink(g_name), 0);
}

static void attaching_a_region_of_another_abi_version_names_both_versions(void **state)
{
	struct shm_region *r = fallback_region(1 << 16);
	struct shm_region_hdr *h;
	char err[512];

	(void)state;
	assert_non_null(r);
	h = shm_region_base(r);
	h->abi_version = 99;
	assert_null(shm_region_attach(g_name, err, sizeof(err)));
	assert_int_equal(errno, EPROTO);
	assert_non_null(strstr(err, "ABI version 99"));
	assert_non_null(strstr(err, "ABI version 1"));
	h->abi_version = SHM_ABI_VERSION;
	h->magic = 0x1234;
	assert_null(shm_region_attach(g_name, err, sizeof(err)));
	assert_int_equal(errno, EPROTO);
	assert_non_null(strstr(err, "magic 0x0000000000001234"));
	shm_region_detach(r);
	shm_region_unlink(g_name);
}

static void attaching_a_missing_region_says_which_and_what_to_do(void **state)
{
	char err[512];

	(void)state;
	assert_null(shm_region_attach("no-such-region-here", err, sizeof(err)));
	assert_int_equal(errno, ENOENT);
	assert_non_null(strstr(err, "no-such-region-here"));
	assert_null(shm_region_attach("../etc", err, sizeof(err)));
	assert_int_equal(errno, EINVAL);
}

static void areas_are_unique_aligned_and_bounded(void **state)
{
	struct shm_region *r = fallback_region(1 << 16);
	uint64_t a, b, again;
	int rc;

	(void)state;
	assert_non_null(r);
	assert_int_equal(shm_region_add_area(r, "a", 100, 64, SHM_AREA_RAW, &a), 0);
	assert_int_equal(shm_region_add_area(r, "b", 100, 4096, SHM_AREA_RAW, &b), 0);
	assert_true(b % 4096 == 0 && b >= a + 100);
	assert_int_equal(shm_region_add_area(r, "a", 100, 64, SHM_AREA_RAW, &again), -EEXIST);
	assert_int_equal(again, a);
	assert_int_equal(shm_region_add_area(r, "huge", 1 << 20, 64, SHM_AREA_RAW, NULL), -ENOSPC);
	assert_int_equal(shm_region_add_area(r, "x", 10, 48, SHM_AREA_RAW, NULL), -EINVAL);
	assert_int_equal(shm_region_add_area(r, "bad/name", 10, 64, SHM_AREA_RAW, NULL), -EINVAL);
	/* the table is bounded too */
	for (int i = 0;; i++) {
		char n[16];

		snprintf(n, sizeof(n), "t%d", i);
		rc = shm_region_add_area(r, n, 64, 64, SHM_AREA_RAW, NULL);
		if (rc != 0)
			break;
		assert_true(i < SHM_MAX_AREAS);
	}
	assert_int_equal(rc, -ENOSPC);
	assert_int_equal(shm_region_find_area(r, "nope", NULL, NULL), -ENOENT);
	shm_region_detach(r);
	shm_region_unlink(g_name);
}

/* The areas are listed in the order they were added, with kind and offset;
 * past the last, -ENOENT. */
static void areas_are_listed_in_order_with_their_kind_and_offset(void **state)
{
	struct shm_region *r = fallback_region(1 << 16);
	enum shm_area_kind k;
	char name[SHM_AREA_NAME_MAX];
	uint64_t a, b, off;

	(void)state;
	assert_non_null(r);
	assert_int_equal(shm_region_add_area(r, "first", 100, 64, SHM_AREA_RAW, &a), 0);
	assert_int_equal(shm_region_add_area(r, "a-name-of-thirty-one-characters", 64, 64, SHM_AREA_POOL, &b), 0);
	assert_int_equal(shm_region_area_at(r, 0, name, &k, &off), 0);
	assert_string_equal(name, "first");
	assert_int_equal(k, SHM_AREA_RAW);
	assert_int_equal(off, a);
	assert_int_equal(shm_region_area_at(r, 1, name, &k, &off), 0);
	assert_string_equal(name, "a-name-of-thirty-one-characters");
	assert_int_equal(k, SHM_AREA_POOL);
	assert_int_equal(off, b);
	assert_int_equal(shm_region_area_at(r, 2, name, &k, &off), -ENOENT);
	shm_region_detach(r);
	shm_region_unlink(g_name);
}

static void lock_wedged(int sig)
{
	(void)sig;
	static const char m[] = "add_area waited 10 s on a table lock whose holder is dead\n";
	(void)!write(2, m, sizeof(m) - 1);
	_exit(1);
}

/* A process killed inside add_area holds the table lock: the next one to
 * add an area takes it over instead of waiting for ever (a restarted ctrld
 * creating its pools hung at start behind its killed predecessor). */
static void a_table_lock_whose_holder_died_is_taken_over(void **state)
{
	struct shm_region *r = fallback_region(1 << 16);
	struct shm_region_hdr *h;
	int st;
	pid_t pid;

	(void)state;
	assert_non_null(r);
	h = shm_region_base(r);
	pid = fork();
	if (pid == 0) {
		uint32_t free_ = 0;

		/* what hdr_lock() does, then death before the unlock */
		if (!atomic_compare_exchange_strong(&h->lock, &free_, (uint32_t)getpid()))
			_exit(1);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	assert_int_equal(atomic_load(&h->lock), (uint32_t)pid);
	signal(SIGALRM, lock_wedged);
	alarm(10);
	assert_int_equal(shm_region_add_area(r, "after", 64, 64, SHM_AREA_RAW, NULL), 0);
	alarm(0);
	signal(SIGALRM, SIG_DFL);
	assert_int_equal(atomic_load(&h->lock), 0);
	shm_region_detach(r);
	shm_region_unlink(g_name);
}

/* A process attaching while the region is being (re)created sees the old
 * region, the new one, or none — never a half-written header. */
static void an_attacher_never_sees_a_region_half_created(void **state)
{
	pid_t pid;
	int st;

	(void)state;
	pid = fork();
	if (pid == 0) {
		for (int i = 0; i < 20000; i++) {
			char err[512];
			struct shm_region *a = shm_region_attach(g_name, err, sizeof(err));

			if (a != NULL)
				shm_region_detach(a);
			else if (errno != ENOENT) {
				fprintf(stderr, "attach %d: %s\n", i, err);
				_exit(1);
			}
		}
		_exit(0);
	}
	for (int i = 0; i < 300; i++) {
		struct shm_region *r = fallback_region(1 << 20);

		assert_non_null(r);
		shm_region_detach(r);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	shm_region_unlink(g_name);
}

/* Its creator restarted (a kvferry-dataplane after a crash): whoever still
 * maps the old one can tell, and the new one's own handle is not replaced. */
static void a_region_created_again_under_its_name_is_seen_replaced_by_its_old_attachers(void **state)
{
	struct shm_region *r = fallback_region(1 << 16), *a, *r2;
	char err[256];

	(void)state;
	assert_non_null(r);
	a = shm_region_attach(g_name, err, sizeof(err));
	assert_non_null(a);
	assert_int_equal(shm_region_replaced(r), 0);
	assert_int_equal(shm_region_replaced(a), 0);
	r2 = fallback_region(1 << 16);
	assert_non_null(r2);
	assert_int_equal(shm_region_replaced(r), 1);
	assert_int_equal(shm_region_replaced(a), 1);
	assert_int_equal(shm_region_replaced(r2), 0);
	/* gone from its name (its creator shutting down): nothing to attach to instead */
	assert_int_equal(shm_region_unlink(g_name), 0);
	assert_int_equal(shm_region_replaced(a), 0);
	assert_int_equal(shm_region_replaced(r2), 0);
	shm_region_detach(a);
	shm_region_detach(r);
	shm_region_detach(r2);
}

static void a_region_refuses_a_bad_name_or_zero_size(void **state)
{
	struct shm_region_opts o;
	char err[256];

	(void)state;
	shm_region_opts_init(&o);
	o.name = "has space";
	o.size = 4096;
	assert_null(shm_region_create(&o, err, sizeof(err)));
	assert_int_equal(errno, EINVAL);
	assert_non_null(strstr(err, "has space"));
	o.name = "ok";
	o.size = 0;
	assert_null(shm_region_create(&o, err, sizeof(err)));
	assert_int_equal(errno, EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_fallback_region_is_found_by_name_from_another_process),
		cmocka_unit_test(attaching_a_region_of_another_abi_version_names_both_versions),
		cmocka_unit_test(attaching_a_missing_region_says_which_and_what_to_do),
		cmocka_unit_test(areas_are_unique_aligned_and_bounded),
		cmocka_unit_test(areas_are_listed_in_order_with_their_kind_and_offset),
		cmocka_unit_test(a_table_lock_whose_holder_died_is_taken_over),
		cmocka_unit_test(an_attacher_never_sees_a_region_half_created),
		cmocka_unit_test(a_region_created_again_under_its_name_is_seen_replaced_by_its_old_attachers),
		cmocka_unit_test(a_region_refuses_a_bad_name_or_zero_size),
	};

	snprintf(g_name, sizeof(g_name), "t-region-%d", (int)getpid());
	return cmocka_run_group_tests(tests, NULL, NULL);
}
