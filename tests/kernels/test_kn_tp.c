/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tensor parallelism on the CPU engine: a stage's layers sharded over T
 * ranks (threads here, each its own kn_stage, their partial sums added
 * through a reduce that adds them pairwise in rank order) compute the very
 * logits and tokens of the unsharded stage, bit for bit, for T = 2 and 4,
 * prompt and decode, Llama and Qwen2 (q/k/v biases) and Qwen3 (q/k norms)
 * shapes; and shapes that cannot split are refused with the reason.
 * A stage's KV pages are the same bytes whatever its tp_size: T ranks
 * exporting into one buffer write the unsharded stage's pages, and those
 * pages imported into the ranks of any tp_size (whole or in pieces, as
 * received in place) decode as the stage that computed them.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kn_model.h"
#include "kn_stage.h"
#include "kn_testutil.h"
#include "kt_tp.h"

#define PROMPT 20
#define NGEN 6
#define BPS 2 /* PROMPT + NGEN <= 2 * KN_PAGE_BLK */
#define MAXT 4 /* <= KT_TP_MAX */

struct tp_rank {
	struct kt_tp_rank k; /* first: the tp_arg (kt_tp.h) */
	struct kn_stage *st;
	const struct kt_model *t;
	float *logits; /* [1 + NGEN][vocab] */
	int32_t toks[1 + NGEN];
	int rc;
	/* run_pages(): the stage's pages out of (import 0) or into (1) this buffer */
	int import, pieces;
	uint8_t *page;
	size_t page_len;
};

static struct kn_stage *stage(const struct kt_model *t, int T, int rank, struct tp_rank *arg, char *err,
			      size_t errlen)
{
	struct kn_stage_opts o;
	struct kn_stage *s;

	kn_stage_opts_init(&o);
	o.n_blocks = BPS;
	o.n_slots = 1;
	o.max_blocks_per_slot = BPS;
	o.n_threads = 1;
	o.tp_size = T;
	o.tp_rank = rank;
	o.tp_reduce = T > 1 ? kt_tp_reduce : NULL;
	o.tp_arg = arg;
	s = kn_stage_create(t->m, KN_BACKEND_CPU, &o, err, errlen);
	if (s != NULL) {
		const int32_t blocks[BPS] = { 0, 1 };

		assert_int_equal(kt_point_slot(&s, 1, 0, blocks, BPS), 0);
	}
	return s;
}

/* A prompt, then NGEN greedy steps: each step's logits and token. */
static void *run(void *arg)
{
	struct tp_rank *r = arg;
	int32_t prompt[PROMPT];

	for (int32_t p = 0; p < PROMPT; p++)
		prompt[p] = (int32_t)((p * 37 + 11) % r->t->vocab);
	r->toks[0] = kt_run(r->t, &r->st, 1, prompt, PROMPT, 0, 0, r->logits);
	for (int k = 1; k <= NGEN && r->toks[k - 1] >= 0; k++)
		r->toks[k] = kt_run(r->t, &r->st, 1, &r->toks[k - 1], 1, PROMPT + k - 1, 0,
				    r->logits + (size_t)k * r->t->vocab);
	r->rc = r->toks[NGEN] >= 0 ? 0 : -1;
	return NULL;
}

static const int32_t g_blocks[BPS] = { 0, 1 };

/* import 0: the prompt, then its pages out to r->page. import 1: the pages
 * in from r->page (in pieces of 4100 bytes (rows span two) when r->pieces), then NGEN
 * decode steps from r->toks[0]. */
static void *run_pages(void *arg)
{
	struct tp_rank *r = arg;
	struct kn_kv_format f;
	int32_t prompt[PROMPT];

	r->rc = -1;
	kn_stage_kv_format(r->st, &f);
	if (r->page_len != (size_t)BPS * f.block_bytes)
		return NULL;
	if (!r->import) {
		for (int32_t p = 0; p < PROMPT; p++)
			prompt[p] = (int32_t)((p * 37 + 11) % r->t->vocab);
		r->toks[0] = kt_run(r->t, &r->st, 1, prompt, PROMPT, 0, 0, r->logits);
		if (r->toks[0] >= 0 && kn_stage_kv_export(r->st, g_blocks, BPS, r->page, r->page_len) == 0)
			r->rc = 0;
		return NULL;
	}
	if (r->pieces) {
		struct kn_seg segs[64];
		int32_t n = 0;

		for (size_t at = 0; at < r->page_len && n < 64; at += 4100)
			segs[n++] = (struct kn_seg){ r->page + at, r->page_len - at < 4100 ? r->page_len - at : 4100 };
		if (kn_stage_kv_import_segs(r->st, g_blocks, BPS, segs, n, 0, r->page_len, &f) < 0)
			return NULL;
	} else if (kn_stage_kv_import(r->st, g_blocks, BPS, r->page, r->page_len, &f) < 0) {
		return NULL;
	}
	for (int k = 1; k <= NGEN && r->toks[k - 1] >= 0; k++)
		r->toks[k] = kt_run(r->t, &r->st, 1, &r->toks[k - 1], 1, PROMPT + k - 1, 0,
				    r->logits + (size_t)k * r->t->vocab);
	r->rc = r->toks[NGEN] >= 0 ? 0 : -1;
	return NULL;
}

/* T ranks (threads), each its own stage, running @p fn; @p r[0..T) set up here. */
static void ranks_run(const struct kt_model *t, int T, struct kt_tp_group *g, struct tp_rank *r, void *(*fn)(void *),
		      int import, int pieces, uint8_t *page, size_t page_len, const int32_t *toks)
{
	pthread_t th[MAXT];
	char err[512];

	g->T = T;
	assert_int_equal(pthread_barrier_init(&g->bar, NULL, (unsigned)T), 0);
	for (int k = 0; k < T; k++) {
		r[k] = (struct tp_rank){ .k = { .g = g, .rank = k, .sum_cap = (size_t)PROMPT * (t->hidden + 64) }, .t = t,
					 .import = import, .pieces = pieces, .page = page, .page_len = page_len };
		if (toks != NULL)
			r[k].toks[0] = toks[0];
		r[k].k.sum = calloc(r[k].k.sum_cap, sizeof(float));
		r[k].logits = calloc((size_t)(1 + NGEN) * t->vocab, sizeof(float));
		r[k].st = stage(t, T, k, &r[k], err, sizeof(err));
		if (r[k].st == NULL)
			fail_msg("rank %d of %d: %s", k, T, err);
	}
	for (int k = 0; k < T; k++)
		assert_int_equal(pthread_create(&th[k], NULL, fn, &r[k]), 0);
	for (int k = 0; k < T; k++)
		pthread_join(th[k], NULL);
	pthread_barrier_destroy(&g->bar);
}

static void ranks_done(int T, struct tp_rank *r)
{
	for (int k = 0; k < T; k++) {
		kn_stage_destroy(r[k].st);
		free(r[k].k.sum);
		free(r[k].logits);
	}
}

/* Pages out of T ranks equal the unsharded stage's; pages into T ranks,
 * whole or in pieces, decode as the stage that computed them did. */
static void pages_are_one_format_for_every_tp_size(void **state)
{
	struct kt_model t;
	struct tp_rank whole = { 0 }, one = { 0 };
	struct kn_kv_format f;
	char err[512];
	uint8_t *ref, *got;
	size_t len;

	(void)state;
	assert_int_equal(kt_model_open(&t, "--preset small --layers 2 --seed 9"), 0);
	whole.t = &t;
	whole.logits = calloc((size_t)(1 + NGEN) * t.vocab, sizeof(float));
	whole.st = stage(&t, 1, 0, NULL, err, sizeof(err));
	assert_non_null(whole.st);
	kn_stage_kv_format(whole.st, &f);
	len = (size_t)BPS * f.block_bytes;
	ref = malloc(len);
	got = malloc(len);
	assert_true(ref != NULL && got != NULL);
	whole.page = ref;
	whole.page_len = len;
	run_pages(&whole);
	assert_int_equal(whole.rc, 0);
	/* the reference decode: the same stage goes on from its own pool */
	for (int k = 1; k <= NGEN; k++)
		whole.toks[k] = kt_run(&t, &whole.st, 1, &whole.toks[k - 1], 1, PROMPT + k - 1, 0,
				       whole.logits + (size_t)k * t.vocab);
	assert_true(whole.toks[NGEN] >= 0);
	for (int T = 2; T <= MAXT; T *= 2) {
		struct kt_tp_group g;
		struct tp_rank r[MAXT];

		memset(got, 0xA5, len); /* bytes no rank writes would show */
		ranks_run(&t, T, &g, r, run_pages, 0, 0, got, len, NULL);
		for (int k = 0; k < T; k++) {
			assert_int_equal(r[k].rc, 0);
			kn_stage_kv_format(r[k].st, &f);
			assert_int_equal(f.block_bytes * BPS, len); /* the stage's format, not the rank's share */
		}
		if (memcmp(got, ref, len))
			fail_msg("tp %d: the ranks' pages differ from the unsharded stage's", T);
		ranks_done(T, r);
	}
	/* the unsharded stage's pages into 1, 2 and 4 ranks, whole and in pieces */
	for (int pieces = 0; pieces < 2; pieces++)
		for (int T = 1; T <= MAXT; T *= 2) {
			struct kt_tp_group g;
			struct tp_rank r[MAXT];

			if (T == 1) {
				one = (struct tp_rank){ .t = &t, .import = 1, .pieces = pieces, .page = ref, .page_len = len };
				one.toks[0] = whole.toks[0];
				one.logits = calloc((size_t)(1 + NGEN) * t.vocab, sizeof(float));
				one.st = stage(&t, 1, 0, NULL, err, sizeof(err));
				assert_non_null(one.st);
				run_pages(&one);
				r[0] = one;
			} else {
				ranks_run(&t, T, &g, r, run_pages, 1, pieces, ref, len, whole.toks);
			}
			for (int k = 0; k < T; k++) {
				if (r[k].rc != 0)
					fail_msg("pages imported into %d rank(s)%s: rank %d: %s", T, pieces ? " in pieces" : "", k,
						 kn_stage_error(r[k].st));
				assert_memory_equal(r[k].toks, whole.toks, sizeof(whole.toks));
				for (int s = 1; s <= NGEN; s++)
					if (memcmp(r[k].logits + (size_t)s * t.vocab, whole.logits + (size_t)s * t.vocab,
						   (size_t)t.vocab * sizeof(float)))
						fail_msg("pages imported into %d rank(s)%s: rank %d's decode step %d differs "
							 "from the stage that computed them", T, pieces ? " in pieces" : "", k, s);
			}
			ranks_done(T, r);
		}
	kn_stage_destroy(whole.st);
	free(whole.logits);
	free(ref);
	free(got);
	kt_model_close(&t);
}

static void ranks_give_the_unsharded_bits(const char *flags)
{
	struct kt_model t;
	struct tp_rank whole = { 0 };
	char err[512];

	assert_int_equal(kt_model_open(&t, flags), 0);
	whole.t = &t;
	whole.logits = calloc((size_t)(1 + NGEN) * t.vocab, sizeof(float));
	whole.st = stage(&t, 1, 0, NULL, err, sizeof(err));
	assert_non_null(whole.st);
	run(&whole);
	assert_int_equal(whole.rc, 0);
	for (int T = 2; T <= MAXT; T *= 2) {
		struct kt_tp_group g;
		struct tp_rank r[MAXT];

		ranks_run(&t, T, &g, r, run, 0, 0, NULL, 0, NULL);
		for (int k = 0; k < T; k++) {
			assert_int_equal(r[k].rc, 0);
			assert_memory_equal(r[k].toks, whole.toks, sizeof(whole.toks));
			for (int s = 0; s <= NGEN; s++)
				if (memcmp(r[k].logits + (size_t)s * t.vocab, whole.logits + (size_t)s * t.vocab,
					   (size_t)t.vocab * sizeof(float)))
					fail_msg("%s: tp %d rank %d: step %d's logits differ from the unsharded stage's", flags, T,
						 k, s);
		}
		ranks_done(T, r);
	}
	kn_stage_destroy(whole.st);
	free(whole.logits);
	kt_model_close(&t);
}

static void llama_ranks_give_the_unsharded_bits(void **state)
{
	(void)state;
	ranks_give_the_unsharded_bits("--preset small --layers 2 --seed 5");
}

static void qwen2_ranks_with_qkv_biases_give_the_unsharded_bits(void **state)
{
	(void)state;
	ranks_give_the_unsharded_bits("--preset small --arch qwen2 --layers 2 --seed 6");
}

static void qwen3_ranks_with_qk_norms_give_the_unsharded_bits(void **state)
{
	(void)state;
	ranks_give_the_unsharded_bits("--preset small --arch qwen3 --layers 2 --seed 7");
}

/* Shapes that do not split, and options that make no sense, name the problem and the way out. */
static void shapes_that_cannot_split_are_refused_with_the_reason(void **state)
{
	struct kt_model t;
	struct tp_rank r = { 0 };
	char err[512];

	(void)state;
	assert_int_equal(kt_model_open(&t, "--preset tiny --seed 3"), 0);
	assert_null(stage(&t, 2, 0, &r, err, sizeof(err))); /* q_dim 64 */
	assert_non_null(strstr(err, "multiples of 128"));
	assert_non_null(strstr(err, "tp_size 1 always works"));
	kt_model_close(&t);
	assert_int_equal(kt_model_open(&t, "--preset small --layers 1 --seed 3"), 0);
	assert_null(stage(&t, 3, 0, &r, err, sizeof(err)));
	assert_non_null(strstr(err, "tp_size must be 1, 2, 4 or 8"));
	assert_null(stage(&t, 8, 0, &r, err, sizeof(err))); /* 4 KV heads */
	assert_non_null(strstr(err, "split evenly"));
	assert_null(stage(&t, 2, 2, &r, err, sizeof(err)));
	assert_non_null(strstr(err, "tp_rank must be below tp_size"));
	struct kn_stage_opts o;
	kn_stage_opts_init(&o);
	o.tp_size = 2;
	assert_null(kn_stage_create(t.m, KN_BACKEND_CPU, &o, err, sizeof(err)));
	assert_non_null(strstr(err, "needs a reduce"));
	kt_model_close(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(llama_ranks_give_the_unsharded_bits),
		cmocka_unit_test(qwen2_ranks_with_qkv_biases_give_the_unsharded_bits),
		cmocka_unit_test(qwen3_ranks_with_qk_norms_give_the_unsharded_bits),
		cmocka_unit_test(shapes_that_cannot_split_are_refused_with_the_reason),
		cmocka_unit_test(pages_are_one_format_for_every_tp_size),
	};
	int rc = kt_need_mkmodel();

	return rc ? rc : cmocka_run_group_tests(tests, NULL, NULL);
}
