/* SPDX-License-Identifier: Apache-2.0 */
/*
 * KV page messages, the worker-to-worker half of prefill/decode
 * disaggregation: a sequence prefilled on one stage, packed into messages
 * (one block each) and imported into other blocks of another stage, decodes
 * with the same logit bits; truncated, lying, foreign-layout and
 * out-of-pool messages are refused by name and write no page.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kn_model.h"
#include "kn_stage.h"
#include "kn_testutil.h"
#include "wk_kvpage.h"

/* The io over a stage, as the worker builds it (kept in a static: the calls below read it at once). */
static const struct wk_kv_io *io(struct kn_stage *s)
{
	static struct wk_kv_io v[2];
	static int k;

	k ^= 1;
	v[k] = wk_kv_io_stage(s);
	return &v[k];
}

#define PROMPT 21 /* two pages */
#define NDEC 6
#define BPS 3

struct fixture {
	struct kt_model t;
};

static int setup(void **state)
{
	return kt_fixture_setup(state, sizeof(struct fixture), "--preset tiny --arch llama --layers 4 --seed 9");
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	kt_model_close(&f->t);
	free(f);
	return 0;
}

static void point_slot(struct kn_stage *st, int32_t slot, const int32_t *blocks)
{
	assert_int_equal(kt_point_slot(&st, 1, slot, blocks, BPS), 0);
}

static int32_t run(struct fixture *f, struct kn_stage *st, const int32_t *toks, int32_t n, int32_t pos0,
		   int32_t slot, float *logits)
{
	int32_t tok = kt_run(&f->t, &st, 1, toks, n, pos0, slot, logits);

	assert_true(tok >= 0);
	return tok;
}

static void pages_sent_as_messages_decode_the_same_bits(void **state)
{
	struct fixture *f = *state;
	struct kn_stage *a[1], *b[1];
	const int32_t ba[BPS] = { 3, 7, 9 }, bb[BPS] = { 10, 2, 5 };
	const int32_t used = (PROMPT + KN_PAGE_BLK - 1) / KN_PAGE_BLK;
	int32_t prompt[PROMPT], ta, tb;
	float *la = malloc((size_t)f->t.vocab * 4), *lb = malloc((size_t)f->t.vocab * 4);
	struct kn_kv_format fm;
	char err[512];

	assert_int_equal(kt_cpu_chain(&f->t, 1, 12, 2, BPS, a), 0);
	assert_int_equal(kt_cpu_chain(&f->t, 1, 12, 2, BPS, b), 0);
	point_slot(a[0], 0, ba);
	point_slot(b[0], 1, bb);
	for (int i = 0; i < PROMPT; i++)
		prompt[i] = (int32_t)((i * 53 + 7) % f->t.vocab);
	ta = run(f, a[0], prompt, PROMPT, 0, 0, la);
	kn_stage_kv_format(a[0], &fm);
	/* one message a block, as a prefill rank sends them while it computes */
	for (int32_t i = 0; i < used; i++) {
		size_t cap = wk_kvpage_size(fm.block_bytes, 1);
		uint8_t *msg = malloc(cap);
		const uint32_t dst = (uint32_t)bb[i];
		struct wk_kvpage_info info;
		int64_t n = wk_kvpage_pack(io(a[0]), 77, 5, (uint32_t)i, i == used - 1, &ba[i], &dst, 1, msg, cap, err,
					   sizeof(err));

		assert_int_equal(n, (int64_t)cap);
		assert_int_equal(wk_kvpage_import(io(b[0]), msg, (size_t)n, &info, err, sizeof(err)), 0);
		assert_true(info.room == 77);
		assert_int_equal(info.session, 5);
		assert_int_equal(info.first_index, i);
		assert_int_equal(info.n_blocks, 1);
		assert_int_equal(info.last, i == used - 1);
		free(msg);
	}
	tb = ta;
	for (int i = 0; i < NDEC; i++) {
		int32_t na = run(f, a[0], &ta, 1, PROMPT + i, 0, la);
		int32_t nb = run(f, b[0], &tb, 1, PROMPT + i, 1, lb);

		assert_int_equal(na, nb);
		assert_memory_equal(la, lb, (size_t)f->t.vocab * 4);
		ta = na;
		tb = nb;
	}
	free(la);
	free(lb);
	kn_stage_destroy(a[0]);
	kn_stage_destroy(b[0]);
}

/* Block @p blk of @p s, exported. */
static void *block_of(struct kn_stage *s, int32_t blk, size_t bytes)
{
	void *p = malloc(bytes);

	assert_int_equal(kn_stage_kv_export(s, &blk, 1, p, bytes), 0);
	return p;
}

static void bad_messages_are_refused_by_name_and_write_no_page(void **state)
{
	struct fixture *f = *state;
	struct kn_stage *a[1], *b[1], *two[2];
	const int32_t src[2] = { 1, 2 };
	const uint32_t dst[2] = { 4, 99 };
	struct kn_kv_format fm;
	struct wk_kvpage_info info;
	char err[512];
	uint8_t *msg, *x;
	size_t cap;
	void *before, *after;
	int64_t n;

	assert_int_equal(kt_cpu_chain(&f->t, 1, 12, 2, BPS, a), 0);
	assert_int_equal(kt_cpu_chain(&f->t, 1, 12, 2, BPS, b), 0);
	assert_int_equal(kt_cpu_chain(&f->t, 2, 12, 2, BPS, two), 0);
	kn_stage_kv_format(a[0], &fm);
	cap = wk_kvpage_size(fm.block_bytes, 2);
	msg = malloc(cap);
	x = malloc(cap + 1);
	/* fill a's blocks so a write would show */
	{
		int32_t p[PROMPT];
		float *lg = malloc((size_t)f->t.vocab * 4);
		const int32_t blk[BPS] = { 1, 2, 3 };

		for (int i = 0; i < PROMPT; i++)
			p[i] = (int32_t)(i + 3);
		point_slot(a[0], 0, blk);
		run(f, a[0], p, PROMPT, 0, 0, lg);
		free(lg);
	}
	before = block_of(b[0], 4, fm.block_bytes);
	/* a destination outside the pool: refused, block 4 (entry 0) untouched */
	n = wk_kvpage_pack(io(a[0]), 9, 1, 0, 1, src, dst, 2, msg, cap, err, sizeof(err));
	assert_int_equal(n, (int64_t)cap);
	assert_int_equal(wk_kvpage_import(io(b[0]), msg, (size_t)n, &info, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "99"));
	after = block_of(b[0], 4, fm.block_bytes);
	assert_memory_equal(before, after, fm.block_bytes);
	free(after);
	/* every truncation and a one-byte extension */
	for (size_t k = 0; k < (size_t)n; k += (size_t)n / 97 + 1)
		assert_int_equal(wk_kvpage_import(io(b[0]), msg, k, &info, err, sizeof(err)), -EBADMSG);
	memcpy(x, msg, (size_t)n);
	x[n] = 0;
	assert_int_equal(wk_kvpage_import(io(b[0]), x, (size_t)n + 1, &info, err, sizeof(err)), -EBADMSG);
	/* lying fields */
	memcpy(x, msg, (size_t)n);
	x[0] ^= 1;
	assert_int_equal(wk_kvpage_import(io(b[0]), x, (size_t)n, &info, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "magic"));
	memcpy(x, msg, (size_t)n);
	x[offsetof(struct dp_kvpage_hdr, dtype)] = 2;
	assert_int_equal(wk_kvpage_import(io(b[0]), x, (size_t)n, &info, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "dtype 2"));
	memcpy(x, msg, (size_t)n);
	x[offsetof(struct dp_kvpage_hdr, block_bytes)] ^= 4;
	assert_int_equal(wk_kvpage_import(io(b[0]), x, (size_t)n, &info, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "bytes a block"));
	memcpy(x, msg, (size_t)n);
	x[offsetof(struct dp_kvpage_hdr, n_blocks)] = 3;
	assert_int_equal(wk_kvpage_import(io(b[0]), x, (size_t)n, &info, err, sizeof(err)), -EBADMSG);
	/* pages of the whole model into the first half's stage */
	{
		const uint32_t ok[2] = { 4, 5 };

		n = wk_kvpage_pack(io(a[0]), 9, 1, 0, 1, src, ok, 2, msg, cap, err, sizeof(err));
		assert_int_equal(wk_kvpage_import(io(two[0]), msg, (size_t)n, &info, err, sizeof(err)), -EINVAL);
		assert_non_null(strstr(err, "layers [0,4)"));
		assert_non_null(strstr(err, "for a stage of layers [0,2)"));
		/* and the good one lands */
		assert_int_equal(wk_kvpage_import(io(b[0]), msg, (size_t)n, &info, err, sizeof(err)), 0);
		after = block_of(b[0], 4, fm.block_bytes);
		void *want = block_of(a[0], 1, fm.block_bytes);
		assert_memory_equal(after, want, fm.block_bytes);
		free(after);
		free(want);
	}
	/* packing: no blocks, a short buffer, a source outside the pool */
	assert_int_equal(wk_kvpage_pack(io(a[0]), 9, 1, 0, 1, src, dst, 0, msg, cap, err, sizeof(err)), -EINVAL);
	assert_int_equal(wk_kvpage_pack(io(a[0]), 9, 1, 0, 1, src, dst, 2, msg, cap - 1, err, sizeof(err)), -ENOSPC);
	{
		const int32_t bad[1] = { 40 };

		assert_int_equal(wk_kvpage_pack(io(a[0]), 9, 1, 0, 1, bad, dst, 1, msg, cap, err, sizeof(err)), -EINVAL);
		assert_non_null(strstr(err, "block 40"));
	}
	free(before);
	free(msg);
	free(x);
	kn_stage_destroy(a[0]);
	kn_stage_destroy(b[0]);
	kn_stage_destroy(two[0]);
	kn_stage_destroy(two[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(pages_sent_as_messages_decode_the_same_bits),
		cmocka_unit_test(bad_messages_are_refused_by_name_and_write_no_page),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
