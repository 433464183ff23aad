/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tensor parallelism on the CPU engine: a stage's layers sharded over T
 * ranks (threads here, each its own kn_stage, their partial sums added
 * through a reduce that adds them pairwise in rank order) compute the very
 * logits and tokens of the unsharded stage, bit for bit, for T = 2 and 4,
 * prompt and decode, Llama and Qwen2 (q/k/v biases) and Qwen3 (q/k norms)
 * shapes; and shapes that cannot split are refused with the reason.
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

#define PROMPT 20
#define NGEN 6
#define BPS 2 /* PROMPT + NGEN <= 2 * KN_PAGE_BLK */
#define MAXT 4

/* The ranks' meeting point: each hands its partial, each leaves with the sum. */
struct tp_group {
	int T;
	pthread_barrier_t bar;
	float *part[MAXT];
};

struct tp_rank {
	struct tp_group *g;
	int rank;
	struct kn_stage *st;
	const struct kt_model *t;
	float *sum; /* scratch: the sum, until every rank has read the partials */
	size_t sum_cap;
	float *logits; /* [1 + NGEN][vocab] */
	int32_t toks[1 + NGEN];
	int rc;
};

static int reduce(void *arg, float *buf, int32_t n, int32_t ld, int32_t dim)
{
	struct tp_rank *r = arg;
	struct tp_group *g = r->g;

	if ((size_t)n * ld > r->sum_cap)
		return -ENOMEM;
	g->part[r->rank] = buf;
	pthread_barrier_wait(&g->bar);
	for (int32_t j = 0; j < n; j++)
		for (int32_t i = 0; i < dim; i++) {
			float v[MAXT] = { 0 };

			for (int k = 0; k < g->T; k++)
				v[k] = g->part[k][(size_t)j * ld + i];
			for (int step = 1; step < g->T; step *= 2) /* pairwise, in rank order */
				for (int k = 0; k + step < g->T; k += 2 * step)
					v[k] += v[k + step];
			r->sum[(size_t)j * ld + i] = v[0];
		}
	pthread_barrier_wait(&g->bar); /* every rank has read every partial */
	for (int32_t j = 0; j < n; j++)
		memcpy(buf + (size_t)j * ld, r->sum + (size_t)j * ld, (size_t)dim * sizeof(float));
	return 0;
}

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
	o.tp_reduce = T > 1 ? reduce : NULL;
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
		struct tp_group g = { .T = T };
		struct tp_rank r[MAXT];
		pthread_t th[MAXT];

		assert_int_equal(pthread_barrier_init(&g.bar, NULL, (unsigned)T), 0);
		for (int k = 0; k < T; k++) {
			r[k] = (struct tp_rank){ .g = &g, .rank = k, .t = &t, .sum_cap = (size_t)PROMPT * (t.hidden + 64) };
			r[k].sum = calloc(r[k].sum_cap, sizeof(float));
			r[k].logits = calloc((size_t)(1 + NGEN) * t.vocab, sizeof(float));
			r[k].st = stage(&t, T, k, &r[k], err, sizeof(err));
			if (r[k].st == NULL)
				fail_msg("rank %d of %d: %s", k, T, err);
		}
		for (int k = 0; k < T; k++)
			assert_int_equal(pthread_create(&th[k], NULL, run, &r[k]), 0);
		for (int k = 0; k < T; k++)
			pthread_join(th[k], NULL);
		for (int k = 0; k < T; k++) {
			assert_int_equal(r[k].rc, 0);
			assert_memory_equal(r[k].toks, whole.toks, sizeof(whole.toks));
			for (int s = 0; s <= NGEN; s++)
				if (memcmp(r[k].logits + (size_t)s * t.vocab, whole.logits + (size_t)s * t.vocab,
					   (size_t)t.vocab * sizeof(float)))
					fail_msg("%s: tp %d rank %d: step %d's logits differ from the unsharded stage's", flags, T,
						 k, s);
			kn_stage_destroy(r[k].st);
			free(r[k].sum);
			free(r[k].logits);
		}
		pthread_barrier_destroy(&g.bar);
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
	};
	int rc = kt_need_mkmodel();

	return rc ? rc : cmocka_run_group_tests(tests, NULL, NULL);
}
