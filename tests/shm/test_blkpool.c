/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "shm_blkpool.h"

static void allocation_is_all_or_nothing_and_exhaustion_is_a_return_value(void **state)
{
	struct shm_blkpool *p = shm_blkpool_create(10);
	int32_t ids[16];

	(void)state;
	assert_non_null(p);
	assert_int_equal(shm_blkpool_capacity(p), 10);
	assert_int_equal(shm_blkpool_alloc(p, 6, ids), 0);
	assert_int_equal(shm_blkpool_available(p), 4);
	assert_int_equal(shm_blkpool_alloc(p, 5, ids + 6), -ENOSPC);
	assert_int_equal(shm_blkpool_available(p), 4); /* nothing taken */
	assert_int_equal(shm_blkpool_alloc(p, 4, ids + 6), 0);
	for (int i = 0; i < 10; i++)
		for (int j = 0; j < i; j++)
			assert_int_not_equal(ids[i], ids[j]);
	assert_int_equal(shm_blkpool_alloc(p, 1, ids + 10), -ENOSPC);
	assert_int_equal(shm_blkpool_release(p, ids, 10), 0);
	assert_int_equal(shm_blkpool_available(p), 10);
	assert_int_equal(shm_blkpool_alloc(p, -1, ids), -EINVAL);
	shm_blkpool_destroy(p);
}

static void a_shared_block_returns_only_when_its_last_holder_lets_go(void **state)
{
	struct shm_blkpool *p = shm_blkpool_create(4);
	int32_t id, again;

	(void)state;
	assert_int_equal(shm_blkpool_alloc(p, 1, &id), 0);
	assert_int_equal(shm_blkpool_ref(p, id), 0);
	assert_int_equal(shm_blkpool_refcount(p, id), 2);
	assert_int_equal(shm_blkpool_unref(p, id), 1);
	assert_int_equal(shm_blkpool_available(p), 3);
	assert_int_equal(shm_blkpool_unref(p, id), 0);
	assert_int_equal(shm_blkpool_available(p), 4);
	/* a double release is refused and does not put the id on the stack twice */
	assert_int_equal(shm_blkpool_unref(p, id), -EALREADY);
	assert_int_equal(shm_blkpool_ref(p, id), -EALREADY);
	assert_int_equal(shm_blkpool_available(p), 4);
	assert_int_equal(shm_blkpool_unref(p, 4), -EINVAL);
	assert_int_equal(shm_blkpool_refcount(p, -1), -EINVAL);
	assert_int_equal(shm_blkpool_alloc(p, 1, &again), 0);
	assert_int_equal(again, id); /* LIFO: the block just freed comes back first */
	shm_blkpool_destroy(p);
}

static void a_pool_of_no_blocks_is_refused(void **state)
{
	(void)state;
	assert_null(shm_blkpool_create(0));
	assert_int_equal(errno, EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(allocation_is_all_or_nothing_and_exhaustion_is_a_return_value),
		cmocka_unit_test(a_shared_block_returns_only_when_its_last_holder_lets_go),
		cmocka_unit_test(a_pool_of_no_blocks_is_refused),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
