/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The sampler a user meets through temperature, top_k, top_p and seed
 * (kn_sample_column(), the rule of kernels/kn_sample_core.h that the CUDA
 * engine's device sampler shares; tests/kernels/cuda/test_cuda_ops checks
 * the device draws the same tokens): draws follow the softmax, the filters
 * cut where the API says, and a (seed, position) pair always draws the same.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kn_stage_impl.h"

#define V 6

static uint64_t g_scratch[V + 8];

static int32_t draw(const float *l, float t, int32_t top_k, float top_p, uint32_t seed, int32_t pos)
{
	struct kn_column c;

	memset(&c, 0, sizeof(c));
	c.flags = KN_COL_NEED_LOGIT;
	c.temperature = t;
	c.top_k = top_k;
	c.top_p = top_p;
	c.seed = seed;
	c.pos = pos;
	return kn_sample_column(l, V, &c, 0, NULL, NULL, NULL, g_scratch);
}

/* probabilities 0.4, 0.3, 0.15, 0.1, 0.05, 0 */
static void probs_logits(float *l)
{
	const double p[V] = { 0.4, 0.3, 0.15, 0.1, 0.05, 0 };

	for (int i = 0; i < V; i++)
		l[i] = p[i] > 0 ? (float)log(p[i]) : -INFINITY;
}

static void draws_at_temperature_one_follow_the_softmax(void **state)
{
	const double want[V] = { 0.4, 0.3, 0.15, 0.1, 0.05, 0 };
	float l[V];
	int n[V] = { 0 };
	const int N = 20000;

	(void)state;
	probs_logits(l);
	for (int i = 0; i < N; i++)
		n[draw(l, 1.0f, 0, 1.0f, 7u + (uint32_t)i, 3)]++;
	for (int i = 0; i < V; i++) {
		printf("token %d: %.4f (softmax %.2f)\n", i, (double)n[i] / N, want[i]);
		assert_true(fabs((double)n[i] / N - want[i]) < 0.015);
	}
	assert_int_equal(n[5], 0); /* -inf is never drawn */
}

static void top_k_and_top_p_keep_only_the_head_of_the_distribution(void **state)
{
	float l[V];
	int seen[V] = { 0 };

	(void)state;
	probs_logits(l);
	for (uint32_t s = 0; s < 3000; s++) {
		assert_int_equal(draw(l, 1.5f, 1, 1.0f, s, 0), 0);    /* top_k 1: greedy */
		assert_true(draw(l, 1.0f, 2, 1.0f, s, 0) <= 1);       /* top_k 2 */
		assert_int_equal(draw(l, 1.0f, 0, 0.35f, s, 0), 0);  /* 0.4 alone reaches 0.35 */
		seen[draw(l, 1.0f, 0, 0.6f, s, 0)]++;                 /* 0.4 + 0.3 reach 0.6 */
	}
	assert_true(seen[0] > 0 && seen[1] > 0);
	for (int i = 2; i < V; i++)
		assert_int_equal(seen[i], 0);
}

static void a_seed_and_position_always_draw_the_same_token(void **state)
{
	float l[V];
	int differ = 0;

	(void)state;
	for (int i = 0; i < V; i++)
		l[i] = 0.5f; /* all equal: every draw is a coin among six */
	for (uint32_t s = 0; s < 200; s++) {
		int32_t a = draw(l, 0.8f, 0, 1.0f, s, 11);

		assert_int_equal(a, draw(l, 0.8f, 0, 1.0f, s, 11));
		differ += a != draw(l, 0.8f, 0, 1.0f, s, 12);
	}
	assert_true(differ > 100); /* another position is another draw */
}

static void greedy_takes_the_lowest_id_among_equal_best_logits(void **state)
{
	float l[V] = { 1.0f, 3.0f, -2.0f, 3.0f, 0.0f, -0.0f };

	(void)state;
	assert_int_equal(draw(l, 0.0f, 0, 1.0f, 1, 0), 1);
	l[1] = 0.0f;
	l[3] = -1.0f;
	l[0] = -0.0f; /* -0 and +0 are one value: the lowest id wins */
	assert_int_equal(draw(l, 0.0f, 0, 1.0f, 1, 0), 0);
}

/* A scored prompt token (KN_COL_FORCE): the given token whatever the
 * sampling settings, its logprob log(p), and the same bits as its entry
 * among the top logprobs (lm-eval compares the two to call a prompt greedy). */
static void a_forced_column_reports_the_given_token_and_its_logprob(void **state)
{
	const double p[V] = { 0.4, 0.3, 0.15, 0.1, 0.05, 0 };
	float l[V], lp, top_lp[2];
	int32_t top_id[2];
	struct kn_column c;

	(void)state;
	probs_logits(l);
	for (uint32_t tok = 0; tok < V; tok++) {
		for (int hot = 0; hot < 2; hot++) {
			memset(&c, 0, sizeof(c));
			c.flags = KN_COL_NEED_LOGIT | KN_COL_FORCE;
			c.seed = tok;
			c.temperature = hot ? 1.5f : 0.0f;
			c.top_k = hot;
			c.pos = 9;
			assert_int_equal(kn_sample_column(l, V, &c, 2, &lp, top_id, top_lp, g_scratch), (int32_t)tok);
			if (p[tok] > 0)
				assert_true(fabs((double)lp - log(p[tok])) < 1e-6);
			else
				assert_true(isinf(lp) && lp < 0);
			assert_int_equal(top_id[0], 0);
			assert_int_equal(top_id[1], 1);
			if (tok < 2)
				assert_memory_equal(&lp, &top_lp[tok], sizeof(lp));
		}
	}
	/* a token id past the vocabulary is not taken: the column is drawn as usual */
	c.seed = V + 3;
	c.temperature = 0.0f;
	assert_int_equal(kn_sample_column(l, V, &c, 0, &lp, NULL, NULL, g_scratch), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(draws_at_temperature_one_follow_the_softmax),
		cmocka_unit_test(top_k_and_top_p_keep_only_the_head_of_the_distribution),
		cmocka_unit_test(a_seed_and_position_always_draw_the_same_token),
		cmocka_unit_test(greedy_takes_the_lowest_id_among_equal_best_logits),
		cmocka_unit_test(a_forced_column_reports_the_given_token_and_its_logprob),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
