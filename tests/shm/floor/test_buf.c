/* SPDX-License-Identifier: Apache-2.0 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kvf_buf.h"

static void pieces_added_read_back_as_one_string_past_the_first_capacity(void **state)
{
	struct kvf_buf b = { 0 };
	char want[5000];
	size_t n = 0;

	(void)state;
	for (int i = 0; n + 10 < sizeof(want); i++) {
		char piece[8];
		size_t k = (size_t)(i % 7) + 1;

		for (size_t j = 0; j < k; j++)
			piece[j] = (char)('a' + (i + (int)j) % 26);
		memcpy(want + n, piece, k);
		n += k;
		assert_int_equal(kvf_buf_add(&b, piece, k), 0);
		assert_int_equal(b.len, n);
		assert_true(b.cap > b.len);
		assert_int_equal(b.p[b.len], '\0');
	}
	assert_memory_equal(b.p, want, n);
	assert_int_equal(kvf_buf_str(&b, "end"), 0);
	assert_int_equal(b.len, n + 3);
	assert_string_equal(b.p + n, "end");
	kvf_buf_free(&b);
}

static void bytes_with_nuls_are_kept_and_an_empty_add_gives_an_empty_string(void **state)
{
	struct kvf_buf b = { 0 };

	(void)state;
	assert_null(b.p);
	assert_int_equal(kvf_buf_add(&b, "", 0), 0);
	assert_non_null(b.p);
	assert_string_equal(b.p, "");
	assert_int_equal(kvf_buf_add(&b, "a\0b", 3), 0);
	assert_int_equal(b.len, 3);
	assert_memory_equal(b.p, "a\0b", 4);
	kvf_buf_free(&b);
	assert_null(b.p);
	assert_int_equal(b.len, 0);
	assert_int_equal(b.cap, 0);
	kvf_buf_free(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(pieces_added_read_back_as_one_string_past_the_first_capacity),
		cmocka_unit_test(bytes_with_nuls_are_kept_and_an_empty_add_gives_an_empty_string),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
