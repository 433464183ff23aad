/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a worker's stage load reads (kn_model_read_range(), the worker's
 * load_stage on the CPU backend): every byte the stage's tensors hold,
 * with progress that ends at the total kn_model_range_tensors() announced;
 * and a model file cut short after it was opened fails the load with the
 * tensor and the file named, where touching the mapping would have killed
 * the worker with SIGBUS in the middle of a step.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kn_model.h"
#include "kn_testutil.h"

struct progress {
	uint64_t last, total;
	int calls, backwards;
};

static int on_progress(void *arg, uint64_t done, uint64_t total)
{
	struct progress *p = arg;

	p->backwards += done < p->last;
	p->last = done;
	p->total = total;
	p->calls++;
	return 0;
}

/* a daemon told to stop mid-load */
static int stop_at_first(void *arg, uint64_t done, uint64_t total)
{
	(void)done;
	(void)total;
	return ++*(int *)arg >= 1;
}

static void a_stage_load_reads_every_byte_its_tensors_hold(void **state)
{
	struct kt_model t;
	char err[512] = "";
	(void)state;

	assert_int_equal(kt_model_open(&t, "--preset tiny --arch llama --layers 4 --seed 3"), 0);
	/* each stage range of a 2-stage split, and the whole model */
	int32_t ranges[][2] = { { 0, 2 }, { 2, 4 }, { 0, 4 } };
	for (size_t i = 0; i < sizeof(ranges) / sizeof(ranges[0]); i++) {
		struct progress p = { 0 };
		int32_t n;
		uint64_t bytes;

		kn_model_range_tensors(t.m, ranges[i][0], ranges[i][1], &n, &bytes);
		assert_true(n > 0 && bytes > 0);
		assert_int_equal(kn_model_read_range(t.m, ranges[i][0], ranges[i][1], on_progress, &p, err,
						     sizeof(err)), 0);
		assert_true(p.calls >= n); /* one call per tensor at least (tiny tensors: one chunk each) */
		assert_int_equal(p.backwards, 0);
		assert_int_equal(p.last, bytes);
		assert_int_equal(p.total, bytes);
	}
	/* no progress callback is fine */
	assert_int_equal(kn_model_read_range(t.m, 0, 4, NULL, NULL, err, sizeof(err)), 0);
	kt_model_close(&t);
}

static void a_load_told_to_stop_stops_at_the_next_chunk(void **state)
{
	struct kt_model t;
	char err[512] = "";
	int calls = 0;
	(void)state;

	assert_int_equal(kt_model_open(&t, "--preset tiny --arch llama --layers 4 --seed 3"), 0);
	assert_int_equal(kn_model_read_range(t.m, 0, 4, stop_at_first, &calls, err, sizeof(err)), -ECANCELED);
	assert_int_equal(calls, 1);
	assert_non_null(strstr(err, "stopped by the caller"));
	kt_model_close(&t);
}

static void a_model_file_cut_short_fails_the_load_naming_the_tensor_not_sigbus(void **state)
{
	struct kt_model t;
	char err[512] = "", path[256];
	(void)state;

	assert_int_equal(kt_model_open(&t, "--preset tiny --arch llama --layers 4 --seed 3"), 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", t.dir);
	/* a page of the header left: every tensor's bytes now lie past the end */
	assert_int_equal(truncate(path, 4096), 0);
	int rc = kn_model_read_range(t.m, 0, 4, NULL, NULL, err, sizeof(err));
	assert_int_equal(rc, -EFAULT);
	assert_non_null(strstr(err, "reading tensor model."));
	assert_non_null(strstr(err, path));
	assert_non_null(strstr(err, "shrank"));
	kt_model_close(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_stage_load_reads_every_byte_its_tensors_hold),
		cmocka_unit_test(a_load_told_to_stop_stops_at_the_next_chunk),
		cmocka_unit_test(a_model_file_cut_short_fails_the_load_naming_the_tensor_not_sigbus),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
