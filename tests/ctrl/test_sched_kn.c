/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The scheduler over the in-process chain of CPU stage engines, on the tiny
 * model generated into a temporary directory: every request's tokens equal
 * its solo run on one whole-model stage, bit for bit, for 1-3 stages, with
 * and without speculation, threaded and inline, and behind two replicas.
 * Usage: test_ctrl_sched_kn PATH-TO-kvferry-mkmodel
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "kn_model.h"
#include "ctrl_pd_xfer.h"
#include "kn_stage.h"
#include "kvf_clock.h"
#include "sched_harness.h"
#include "sched_int.h"

enum { N = 14 };

static const char *g_mkmodel;
static char g_dir[] = "/tmp/kvferry-sched-kn-XXXXXX";
static struct kn_model *g_model;
static int32_t g_prompt[N][48], g_len[N], g_max[N];
static float g_temp[N];
static struct rec g_ref[N];
/* The solo run's logits of every generated token: the logprob reference. */
enum { MAXGEN = 40, MAXV = 512 };
static float g_lg[N][MAXGEN][MAXV];

static int32_t vocab(void)
{
	return kn_model_config(g_model)->vocab_size;
}

/* One CPU stage of the whole model, one slot of 8 blocks, its row set. */
static struct kn_stage *whole_stage(void)
{
	struct kn_stage_opts so;
	struct kn_stage *st;
	struct kn_op ops[8];
	char err[256];

	kn_stage_opts_init(&so);
	so.n_slots = 1;
	so.max_blocks_per_slot = 8;
	so.n_blocks = 8;
	st = kn_stage_create(g_model, KN_BACKEND_CPU, &so, err, sizeof(err));
	if (st == NULL)
		fail_msg("kn_stage_create: %s", err);
	for (int b = 0; b < 8; b++)
		ops[b] = (struct kn_op){ .type = KN_OP_SET_BLOCK, .slot = 0, .idx = b, .val = b };
	assert_int_equal(kn_stage_apply_ops(st, ops, 8), 0);
	return st;
}

/* Solo reference: one stage holding the whole model, one slot, prompt then one token per step. */
static void solo_run(int i)
{
	struct kn_stage *st = whole_stage();
	struct kn_column cols[64];
	int32_t toks[64];
	static float lg[64 * MAXV];
	int32_t n = g_len[i], pos = 0, last = -1;
	struct rec *r = &g_ref[i];

	memset(r, 0, sizeof(*r));
	while (r->n < g_max[i]) {
		int32_t k = 0;
		struct kn_step step;

		if (pos < n) {
			for (; pos < n; pos++, k++)
				cols[k] = (struct kn_column){ .token = g_prompt[i][pos], .pos = pos, .slot = 0,
							      .top_p = 1.0f, .temperature = g_temp[i],
							      .seed = (uint32_t)i };
		} else {
			cols[k++] = (struct kn_column){ .token = last, .pos = pos++, .slot = 0,
							.top_p = 1.0f, .temperature = g_temp[i],
							.seed = (uint32_t)i };
		}
		cols[k - 1].flags = KN_COL_NEED_LOGIT;
		memset(&step, 0, sizeof(step));
		step.n_cols = k;
		step.cols = cols;
		step.tokens_out = toks;
		step.logits_out = lg;
		if (kn_stage_step(st, &step) != 0)
			fail_msg("kn_stage_step: %s", kn_stage_error(st));
		last = toks[k - 1];
		memcpy(g_lg[i][r->n], lg + (size_t)(k - 1) * (size_t)vocab(), sizeof(float) * (size_t)vocab());
		r->toks[r->n++] = last;
	}
	r->finish = CTRL_FINISH_LENGTH;
	kn_stage_destroy(st);
}

static int setup(void **state)
{
	char cmd[512], err[256];

	(void)state;
	if (g_mkmodel == NULL || access(g_mkmodel, X_OK) != 0 || mkdtemp(g_dir) == NULL)
		return -1;
	snprintf(cmd, sizeof(cmd), "%s --out %s --preset tiny >/dev/null", g_mkmodel, g_dir);
	if (system(cmd) != 0)
		return -1;
	g_model = kn_model_open(g_dir, err, sizeof(err));
	if (g_model == NULL) {
		fprintf(stderr, "kn_model_open(%s): %s\n", g_dir, err);
		return -1;
	}
	if (vocab() > MAXV)
		return -1;
	for (int i = 0; i < N; i++) {
		uint32_t x = 77u + (uint32_t)i * 7919u;

		g_len[i] = 3 + (i * 7) % 40;
		g_max[i] = 10 + (i * 5) % 30;
		g_temp[i] = i % 6 == 5 ? 0.9f : 0.0f;
		for (int32_t p = 0; p < g_len[i]; p++) {
			x = x * 1103515245u + 12345u;
			g_prompt[i][p] = p >= 5 && (x >> 16) % 3 == 0 ? g_prompt[i][p - 5]
				       : (int32_t)((x >> 16) % (uint32_t)vocab());
		}
		solo_run(i);
	}
	return 0;
}

static int teardown(void **state)
{
	char cmd[512];

	(void)state;
	kn_model_close(g_model);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
	return system(cmd) == 0 ? 0 : -1;
}

/* A chain of @p stages; @p ends NULL: an even split, else those layer ends. */
static struct ctrl_chain *kn_chain_ends(int32_t stages, int threaded, const int32_t *ends, char *err,
					size_t errlen)
{
	struct ctrl_kn_chain_opts ko;

	ctrl_kn_chain_opts_init(&ko);
	ko.n_stages = stages;
	if (ends != NULL)
		memcpy(ko.layer_ends, ends, sizeof(int32_t) * (size_t)stages);
	ko.threaded = threaded;
	ko.stage.n_slots = 8;
	ko.stage.n_blocks = 24;
	ko.stage.max_blocks_per_slot = 8;
	ko.stage.plan_widths[0] = 8;
	ko.stage.plan_widths[1] = 32;
	ko.stage.n_plans = 2;
	ko.stage.n_threads = 1;
	return ctrl_kn_chain_create(g_model, &ko, err, errlen);
}

/* A chain of @p stages with @p slots rows and a pool of @p blocks. */
static struct ctrl_chain *kn_chain_pool(int32_t stages, int threaded, int32_t slots, int32_t blocks)
{
	struct ctrl_kn_chain_opts ko;
	struct ctrl_chain *c;
	char err[256];

	ctrl_kn_chain_opts_init(&ko);
	ko.n_stages = stages;
	ko.threaded = threaded;
	ko.stage.n_slots = slots;
	ko.stage.n_blocks = blocks;
	ko.stage.max_blocks_per_slot = 8;
	ko.stage.plan_widths[0] = 8;
	ko.stage.plan_widths[1] = 32;
	ko.stage.n_plans = 2;
	ko.stage.n_threads = 1;
	c = ctrl_kn_chain_create(g_model, &ko, err, sizeof(err));
	if (c == NULL)
		fail_msg("ctrl_kn_chain_create: %s", err);
	return c;
}

static struct ctrl_chain *kn_chain(int32_t stages, int threaded)
{
	return kn_chain_pool(stages, threaded, 8, 24); /* fewer than 14 requests' worst case: some wait */
}

/* Request @p i of the set, as its solo run made it. */
static void request_of(struct ctrl_request *rq, int i)
{
	ctrl_request_init(rq);
	rq->prompt = g_prompt[i];
	rq->n_prompt = g_len[i];
	rq->max_tokens = g_max[i];
	rq->temperature = g_temp[i];
	rq->seed = (uint32_t)i;
}

static void check_all(struct rec *got)
{
	for (int i = 0; i < N; i++) {
		if (got[i].finish != CTRL_FINISH_LENGTH)
			fail_msg("request %d ended %s: %s", i, ctrl_finish_name(got[i].finish), got[i].msg);
		assert_int_equal(got[i].n, g_ref[i].n);
		assert_memory_equal(got[i].toks, g_ref[i].toks, sizeof(int32_t) * (size_t)g_ref[i].n);
	}
}

/* A scheduler on @p c as the set's tests take it (chunks pipelined, 8
 * columns, speculation at any load when @p spec, the prefix cache when
 * @p prefix). */
static struct ctrl_sched *set_sched(struct ctrl_chain *c, int spec, int prefix)
{
	struct ctrl_sched_opts o;
	struct ctrl_sched *s;
	char err[256];

	ctrl_sched_opts_init(&o);
	o.spec = spec;
	o.prefix_cache = prefix;
	o.prefill_pipeline = 1;
	o.mb_cols = 8;
	o.spec_c_full = 64;
	o.spec_ngram_min = 1;
	s = ctrl_sched_create(c, &o, err, sizeof(err));
	if (s == NULL)
		fail_msg("ctrl_sched_create: %s", err);
	return s;
}

/* The whole set through @p s at once, to the end: each its solo tokens. */
static void run_set(struct ctrl_sched *s, struct rec *got)
{
	memset(got, 0, sizeof(*got) * N);
	for (int i = 0; i < N; i++)
		assert_true(submit_rec(s, &got[i], g_prompt[i], g_len[i], g_max[i], g_temp[i], (uint32_t)i) > 0);
	for (long k = 0; k < 10000000 && !ctrl_sched_drained(s); k++)
		assert_true(ctrl_sched_poll(s) >= 0);
	assert_true(ctrl_sched_drained(s));
	check_all(got);
}

static void every_request_equals_its_solo_run_on_one_to_three_stages_with_and_without_speculation(void **state)
{
	static struct rec got[N];

	(void)state;
	for (int spec = 0; spec <= 1; spec++)
		for (int32_t p = 1; p <= 3; p++) {
			struct ctrl_chain *c = kn_chain(p, p != 2);
			struct ctrl_sched *s = set_sched(c, spec, 0);
			struct ctrl_sched_stats st;

			run_set(s, got);
			ctrl_sched_stats(s, &st);
			printf("spec=%d stages=%d: launches %llu, occupancy %.2f, spec rounds %llu, "
			       "accepted %llu/%llu, lookup hits %llu/%llu, blocks in use %d, prompt chunks "
			       "pipelined %llu\n", spec, p,
			       (unsigned long long)st.launches, st.occupancy, (unsigned long long)st.spec_rounds,
			       (unsigned long long)st.spec_accepted, (unsigned long long)st.spec_drafted,
			       (unsigned long long)st.lookup_hits, (unsigned long long)st.lookup_tries,
			       st.blocks_in_use, (unsigned long long)st.prefill_pipelined);
			if (spec)
				assert_true(st.spec_rounds > 0);
			/* on several stages a prompt's next chunk leaves before the
			 * last came back, and the tokens are still the solo run's */
			if (p > 1)
				assert_true(st.prefill_pipelined > 0);
			else
				assert_int_equal(st.prefill_pipelined, 0);
			assert_int_equal(st.blocks_in_use, 0);
			ctrl_sched_destroy(s);
			ctrl_chain_destroy(c);
		}
}

/* [sched] prefix_cache: the set twice on one scheduler, so the second
 * time every prompt of 17 tokens or more finds its whole blocks cached:
 * every request still equals its solo run (greedy and seeded), the cache
 * saved prompt positions from computing, and the pool (24 blocks, fewer
 * than the set's worst case) gave cached blocks back when it ran dry.
 * Drained, no block is in use and the idle cached ones are counted apart. */
static void a_cached_prefix_gives_every_request_its_solo_tokens_and_spares_its_positions(void **state)
{
	static struct rec got[N];
	int32_t saved = 0;

	(void)state;
	for (int i = 0; i < N; i++)
		if (g_len[i] > KN_PAGE_BLK)
			saved += (g_len[i] - 1) / KN_PAGE_BLK * KN_PAGE_BLK;
	for (int32_t p = 1; p <= 3; p++) {
		struct ctrl_chain *c = kn_chain(p, p != 2);
		struct ctrl_sched *s = set_sched(c, 1, 1);
		struct ctrl_sched_stats st;
		uint64_t cols[2] = {0, 0}, hits[2] = {0, 0};

		for (int wave = 0; wave < 2; wave++) {
			run_set(s, got);
			ctrl_sched_stats(s, &st);
			cols[wave] = st.prefill_cols - (wave ? cols[0] : 0);
			hits[wave] = st.prefix_hit_tokens - (wave ? hits[0] : 0);
			assert_int_equal(st.blocks_in_use, 0);
			assert_int_equal(st.prefix_flushes, 0);
		}
		printf("stages=%d: prompt columns %llu then %llu, positions from the cache %llu then %llu (at most %d), "
		       "%d blocks cached at the end\n", p, (unsigned long long)cols[0], (unsigned long long)cols[1],
		       (unsigned long long)hits[0], (unsigned long long)hits[1], saved, st.blocks_cached);
		assert_true(hits[1] > 0 && hits[1] <= (uint64_t)saved);
		assert_true(cols[1] + hits[1] <= cols[0]);
		assert_true(st.blocks_cached > 0);
		ctrl_sched_destroy(s);
		ctrl_chain_destroy(c);
	}
}

/* Prompts that share their first two blocks, the first one alone until its
 * first token, the others while it decodes: they take its blocks (named as
 * its prefill filled them) and answer as they do with no cache. */
static void prompts_sharing_a_prefix_take_a_running_prompts_blocks_and_answer_as_without_the_cache(void **state)
{
	enum { K = 4, LEN = 44, SHARED = 32, MAX = 10 };
	static int32_t pr[K][LEN];
	struct rec want[K], got[K];
	struct ctrl_sched_stats st;

	(void)state;
	for (int k = 0; k < K; k++)
		for (int32_t j = 0; j < LEN; j++)
			pr[k][j] = j < SHARED ? g_prompt[13][j % g_len[13]] ^ (j & 3) : (int32_t)((7 * j + 13 * k) % vocab());
	for (int cache = 0; cache <= 1; cache++) {
		struct ctrl_chain *c = kn_chain(2, 1);
		struct ctrl_sched *s = set_sched(c, 1, cache);
		struct rec *r = cache ? got : want;

		memset(r, 0, sizeof(struct rec) * K);
		assert_true(submit_rec(s, &r[0], pr[0], LEN, MAX, 0.0f, 1) > 0);
		for (long n = 0; n < 1000000 && r[0].n == 0; n++)
			assert_true(ctrl_sched_poll(s) >= 0);
		for (int k = 1; k < K; k++)
			assert_true(submit_rec(s, &r[k], pr[k], LEN, MAX, k == 3 ? 0.9f : 0.0f, (uint32_t)k) > 0);
		for (long n = 0; n < 10000000 && !ctrl_sched_drained(s); n++)
			assert_true(ctrl_sched_poll(s) >= 0);
		ctrl_sched_stats(s, &st);
		if (cache)
			assert_int_equal(st.prefix_hit_tokens, (K - 1) * SHARED);
		else
			assert_int_equal(st.prefix_hit_tokens, 0);
		ctrl_sched_destroy(s);
		ctrl_chain_destroy(c);
	}
	for (int k = 0; k < K; k++) {
		assert_int_equal(got[k].finish, CTRL_FINISH_LENGTH);
		assert_int_equal(got[k].n, want[k].n);
		assert_memory_equal(got[k].toks, want[k].toks, sizeof(int32_t) * (size_t)want[k].n);
	}
}

static void two_replicas_of_different_depth_give_every_request_its_solo_tokens(void **state)
{
	static struct rec got[N];
	struct ctrl_chain *c[2];
	struct ctrl_sched *s[2];
	struct ctrl_dispatch *d;
	int per[2] = { 0 };

	(void)state;
	for (int k = 0; k < 2; k++) {
		struct ctrl_sched_opts o;
		char err[256];

		ctrl_sched_opts_init(&o);
		o.id_tag = (uint8_t)k;
		o.mb_cols = 8;
		c[k] = kn_chain(k + 2, 1);
		s[k] = ctrl_sched_create(c[k], &o, err, sizeof(err));
		if (s[k] == NULL)
			fail_msg("ctrl_sched_create: %s", err);
	}
	d = ctrl_dispatch_create(s, 2);
	assert_non_null(d);
	memset(got, 0, sizeof(got));
	for (int i = 0; i < N; i++) {
		struct ctrl_request rq;

		request_of(&rq, i);
		rq.cb = rec_cb;
		rq.cb_arg = &got[i];
		got[i].id = ctrl_dispatch_submit(d, &rq);
		assert_true(got[i].id > 0);
		per[got[i].id & 0xff]++;
	}
	for (long k = 0; k < 10000000 && !ctrl_dispatch_drained(d); k++)
		assert_true(ctrl_dispatch_poll(d) >= 0);
	check_all(got);
	assert_true(per[0] > 0 && per[1] > 0);
	ctrl_dispatch_destroy(d);
	for (int k = 0; k < 2; k++) {
		ctrl_sched_destroy(s[k]);
		ctrl_chain_destroy(c[k]);
	}
}

/* What one request's token events carried, logprobs included. */
struct lprec {
	int32_t n, k, done;
	enum ctrl_finish finish;
	int32_t toks[MAXGEN];
	float lp[MAXGEN];
	int32_t n_top[MAXGEN];
	int32_t top[MAXGEN][CTRL_CHAIN_MAX_LOGPROBS];
	float top_lp[MAXGEN][CTRL_CHAIN_MAX_LOGPROBS];
};

static void lprec_cb(void *arg, const struct ctrl_event *ev)
{
	struct lprec *r = arg;

	if (ev->finish != CTRL_FINISH_NONE) {
		r->done++;
		r->finish = ev->finish;
		return;
	}
	if (r->n >= MAXGEN)
		return;
	r->toks[r->n] = ev->token;
	r->lp[r->n] = ev->logprob;
	r->n_top[r->n] = ev->n_top;
	for (int32_t t = 0; t < ev->n_top && t < CTRL_CHAIN_MAX_LOGPROBS; t++) {
		r->top[r->n][t] = ev->top_ids[t];
		r->top_lp[r->n][t] = ev->top_logprobs[t];
	}
	r->n++;
}

static void top_logprobs_equal_the_log_softmax_of_the_solo_logits_best_first_with_each_requests_k(void **state)
{
	static const int32_t ks[4] = { 0, 1, 5, CTRL_CHAIN_MAX_LOGPROBS };
	static struct lprec got[N];
	struct ctrl_chain *c = kn_chain(2, 1);
	struct ctrl_sched_opts o;
	struct ctrl_sched *s;
	char err[256];
	double worst = 0.0;
	int32_t v = vocab();

	(void)state;
	ctrl_sched_opts_init(&o);
	o.mb_cols = 8;
	o.spec_c_full = 64;
	o.spec_ngram_min = 1;
	s = ctrl_sched_create(c, &o, err, sizeof(err));
	if (s == NULL)
		fail_msg("ctrl_sched_create: %s", err);
	memset(got, 0, sizeof(got));
	for (int i = 0; i < N; i++) {
		struct ctrl_request rq;

		ctrl_request_init(&rq);
		rq.prompt = g_prompt[i];
		rq.n_prompt = g_len[i];
		rq.max_tokens = g_max[i];
		rq.temperature = g_temp[i];
		rq.seed = (uint32_t)i;
		rq.n_logprobs = ks[i % 4];
		rq.cb = lprec_cb;
		rq.cb_arg = &got[i];
		got[i].k = rq.n_logprobs;
		assert_true(ctrl_sched_submit(s, &rq) > 0);
	}
	for (long k = 0; k < 10000000 && !ctrl_sched_drained(s); k++)
		assert_true(ctrl_sched_poll(s) >= 0);
	assert_true(ctrl_sched_drained(s));
	for (int i = 0; i < N; i++) {
		assert_int_equal(got[i].finish, CTRL_FINISH_LENGTH);
		assert_int_equal(got[i].n, g_ref[i].n);
		for (int32_t j = 0; j < got[i].n; j++) {
			const float *lg = g_lg[i][j];
			double mx = lg[0], sum = 0.0, lse;
			uint8_t taken[MAXV] = { 0 };

			assert_int_equal(got[i].toks[j], g_ref[i].toks[j]);
			for (int32_t t = 1; t < v; t++)
				mx = lg[t] > mx ? lg[t] : mx;
			for (int32_t t = 0; t < v; t++)
				sum += exp((double)lg[t] - mx);
			lse = mx + log(sum);
			if (fabs(got[i].lp[j] - ((double)lg[got[i].toks[j]] - lse)) > worst)
				worst = fabs(got[i].lp[j] - ((double)lg[got[i].toks[j]] - lse));
			assert_int_equal(got[i].n_top[j], got[i].k);
			for (int32_t t = 0; t < got[i].n_top[j]; t++) {
				int32_t best = -1;

				/* the reference rank t: highest logit not yet taken, lowest id on ties */
				for (int32_t u = 0; u < v; u++)
					if (!taken[u] && (best < 0 || lg[u] > lg[best]))
						best = u;
				taken[best] = 1;
				assert_int_equal(got[i].top[j][t], best);
				if (fabs(got[i].top_lp[j][t] - ((double)lg[best] - lse)) > worst)
					worst = fabs(got[i].top_lp[j][t] - ((double)lg[best] - lse));
				if (t > 0)
					assert_true(got[i].top_lp[j][t] <= got[i].top_lp[j][t - 1]);
			}
			/* greedy: the chosen token is the most likely one */
			if (g_temp[i] == 0.0f && got[i].n_top[j] > 0)
				assert_int_equal(got[i].top[j][0], got[i].toks[j]);
		}
	}
	printf("worst |logprob - log_softmax(solo logits)| = %.3g\n", worst);
	assert_true(worst < 1e-4);
	ctrl_sched_destroy(s);
	ctrl_chain_destroy(c);
}

/* What a prompt_logprobs request heard: its prompt's positions, then its tokens. */
struct plprec {
	int32_t k, from;          /* top logprobs asked; the first position scored */
	int32_t n_p, pos[48], tok[48], n_top[48], top[48][CTRL_CHAIN_MAX_LOGPROBS];
	float lp[48];
	int32_t n, toks[MAXGEN];
	int late;                 /* a prompt event after a generated token */
	int done;
	enum ctrl_finish finish;
};

static void plprec_cb(void *arg, const struct ctrl_event *ev)
{
	struct plprec *r = arg;

	if (ev->finish != CTRL_FINISH_NONE) {
		r->done++;
		r->finish = ev->finish;
	} else if (ev->prompt_pos > 0) {
		r->late |= r->n > 0;
		if (r->n_p < 48) {
			r->pos[r->n_p] = ev->prompt_pos;
			r->tok[r->n_p] = ev->token;
			r->lp[r->n_p] = ev->logprob;
			r->n_top[r->n_p] = ev->n_top;
			for (int32_t t = 0; t < ev->n_top && t < CTRL_CHAIN_MAX_LOGPROBS; t++)
				r->top[r->n_p][t] = ev->top_ids[t];
		}
		r->n_p++;
	} else if (r->n < MAXGEN) {
		r->toks[r->n++] = ev->token;
	}
}

/* Request @p i's prompt logits at every position, from one whole-model step. */
static void prompt_logits(int i, float *lg)
{
	struct kn_stage *st = whole_stage();
	struct kn_column cols[48];
	int32_t toks[48];
	struct kn_step step;

	for (int32_t p = 0; p < g_len[i]; p++)
		cols[p] = (struct kn_column){ .token = g_prompt[i][p], .pos = p, .slot = 0, .top_p = 1.0f,
					      .flags = KN_COL_NEED_LOGIT };
	memset(&step, 0, sizeof(step));
	step.n_cols = g_len[i];
	step.cols = cols;
	step.tokens_out = toks;
	step.logits_out = lg;
	if (kn_stage_step(st, &step) != 0)
		fail_msg("kn_stage_step: %s", kn_stage_error(st));
	kn_stage_destroy(st);
}

/* The set with prompt logprobs (each from its own first position, its own
 * k, some with max_tokens 0), beside the same requests without: @return
 * the worst distance from the log-softmax of the whole-prompt logits, and
 * check each scored position's token, order and ranking, and that the
 * generated tokens are the solo run's. */
static double prompt_set(struct ctrl_sched *s, struct plprec *got, struct rec *plain)
{
	static const int32_t ks[4] = { 1, 0, 5, CTRL_CHAIN_MAX_LOGPROBS };
	static float lg[48 * MAXV];
	int32_t v = vocab();
	double worst = 0.0;

	memset(got, 0, sizeof(*got) * N);
	memset(plain, 0, sizeof(*plain) * N);
	for (int i = 0; i < N; i++) {
		struct ctrl_request rq;

		request_of(&rq, i);
		rq.n_logprobs = ks[i % 4];
		rq.prompt_logprobs = 1 + i % 3;
		rq.max_tokens = i % 5 == 0 ? 0 : g_max[i];
		rq.cb = plprec_cb;
		rq.cb_arg = &got[i];
		got[i].k = rq.n_logprobs;
		got[i].from = rq.prompt_logprobs;
		assert_true(ctrl_sched_submit(s, &rq) > 0);
		assert_true(submit_rec(s, &plain[i], g_prompt[i], g_len[i], g_max[i], g_temp[i], (uint32_t)i) > 0);
	}
	for (long k = 0; k < 10000000 && !ctrl_sched_drained(s); k++)
		assert_true(ctrl_sched_poll(s) >= 0);
	assert_true(ctrl_sched_drained(s));
	check_all(plain);
	for (int i = 0; i < N; i++) {
		struct plprec *r = &got[i];
		int32_t want = g_len[i] > r->from ? g_len[i] - r->from : 0;

		prompt_logits(i, lg);
		assert_int_equal(r->done, 1);
		assert_int_equal(r->finish, CTRL_FINISH_LENGTH);
		assert_false(r->late);
		assert_int_equal(r->n_p, want);
		if (i % 5 == 0) {
			assert_int_equal(r->n, 0);
		} else {
			assert_int_equal(r->n, g_ref[i].n);
			assert_memory_equal(r->toks, g_ref[i].toks, sizeof(int32_t) * (size_t)r->n);
		}
		for (int32_t j = 0; j < r->n_p; j++) {
			int32_t p = r->from + j;
			const float *row = lg + (size_t)(p - 1) * (size_t)v;
			double mx = row[0], sum = 0.0, lse;
			uint8_t taken[MAXV] = { 0 };

			assert_int_equal(r->pos[j], p);
			assert_int_equal(r->tok[j], g_prompt[i][p]);
			for (int32_t t = 1; t < v; t++)
				mx = row[t] > mx ? row[t] : mx;
			for (int32_t t = 0; t < v; t++)
				sum += exp((double)row[t] - mx);
			lse = mx + log(sum);
			if (fabs(r->lp[j] - ((double)row[g_prompt[i][p]] - lse)) > worst)
				worst = fabs(r->lp[j] - ((double)row[g_prompt[i][p]] - lse));
			assert_int_equal(r->n_top[j], r->k);
			for (int32_t t = 0; t < r->n_top[j]; t++) {
				int32_t best = -1;

				for (int32_t u = 0; u < v; u++)
					if (!taken[u] && (best < 0 || row[u] > row[best]))
						best = u;
				taken[best] = 1;
				assert_int_equal(r->top[j][t], best);
			}
		}
	}
	return worst;
}

/*
 * lm-eval's likelihoods: each prompt position's logprob of the prompt's
 * own next token is the log-softmax of the logits one whole-model step
 * gives there, whatever the chunking (32-column prefill launches, chunks
 * pipelined on two stages), the neighbours in a micro-batch and the prefix
 * cache; the positions come in order before the first token, the generated
 * tokens stay the solo run's, and max_tokens 0 ends after the prompt. With
 * the cache the set runs twice: the plain requests take cached blocks the
 * second time, the scored ones are computed again, to the same bits.
 */
static void prompt_logprobs_are_the_log_softmax_of_the_prompt_logits_in_any_chunking_batching_and_cache(void **state)
{
	static struct plprec got[2][N];
	static struct rec plain[N];
	struct ctrl_chain *c = kn_chain(2, 1);
	struct ctrl_sched *s = set_sched(c, 1, 1);
	struct ctrl_sched_stats st;
	double worst[2];

	(void)state;
	for (int run = 0; run < 2; run++)
		worst[run] = prompt_set(s, got[run], plain);
	ctrl_sched_stats(s, &st);
	printf("worst |prompt logprob - log_softmax(whole-prompt logits)| = %.3g, %.3g; %llu positions from the "
	       "cache\n", worst[0], worst[1], (unsigned long long)st.prefix_hit_tokens);
	assert_true(worst[0] < 1e-4 && worst[1] < 1e-4);
	assert_true(st.prefix_hit_tokens > 0);
	for (int i = 0; i < N; i++)
		assert_memory_equal(got[0][i].lp, got[1][i].lp, sizeof(float) * (size_t)(got[0][i].n_p < 48 ? got[0][i].n_p : 48));
	ctrl_sched_destroy(s);
	ctrl_chain_destroy(c);
}

/*
 * The n choices of one request (ctrl_request.prefill_from): the later ones
 * wait for the first one's prompt and read its whole blocks, computing only
 * their last partial block, so the set's prompts are computed once, and
 * every choice (same seed: the same draws) answers as its solo run. When
 * the first choice is cancelled mid-prompt the others compute theirs.
 */
static void the_choices_of_a_request_compute_its_prompt_once_and_each_answers_as_alone(void **state)
{
	enum { K = 4 };
	static struct rec got[N][K];
	struct ctrl_chain *c = kn_chain_pool(2, 1, N * K, N * K * 6); /* every choice admitted at once */
	struct ctrl_sched *s = set_sched(c, 1, 0);
	struct ctrl_sched_stats st;
	uint64_t shared = 0, cols = 0;

	(void)state;
	memset(got, 0, sizeof(got));
	for (int i = 0; i < N; i++) {
		for (int k = 0; k < K; k++) {
			struct ctrl_request rq;

			request_of(&rq, i);
			rq.cb = rec_cb;
			rq.cb_arg = &got[i][k];
			rq.prefill_from = k ? (uint64_t)got[i][0].id : 0;
			got[i][k].id = ctrl_sched_submit(s, &rq);
			assert_true(got[i][k].id > 0);
		}
		shared += (uint64_t)(K - 1) * (uint64_t)((g_len[i] - 1) / KN_PAGE_BLK * KN_PAGE_BLK);
		cols += (uint64_t)K * (uint64_t)g_len[i];
	}
	for (long k = 0; k < 10000000 && !ctrl_sched_drained(s); k++)
		assert_true(ctrl_sched_poll(s) >= 0);
	assert_true(ctrl_sched_drained(s));
	for (int i = 0; i < N; i++)
		for (int k = 0; k < K; k++) {
			assert_int_equal(got[i][k].finish, CTRL_FINISH_LENGTH);
			assert_int_equal(got[i][k].n, g_ref[i].n);
			assert_memory_equal(got[i][k].toks, g_ref[i].toks, sizeof(int32_t) * (size_t)g_ref[i].n);
		}
	ctrl_sched_stats(s, &st);
	printf("%d requests x %d choices: %llu prompt positions read from the first choice's blocks (want %llu), "
	       "%llu computed of %llu\n", N, K, (unsigned long long)st.prefill_shared_tokens,
	       (unsigned long long)shared, (unsigned long long)st.prefill_cols, (unsigned long long)cols);
	assert_int_equal(st.prefill_shared_tokens, shared);
	assert_int_equal(st.prefill_cols, cols - shared);
	assert_int_equal(st.blocks_in_use, 0);

	/* the first choice cancelled with its prompt's first chunk out: the
	 * others compute their own prompt, and answer as alone */
	memset(got, 0, sizeof(got));
	for (int k = 0; k < K; k++) {
		struct ctrl_request rq;

		request_of(&rq, 4); /* 31 positions: two launches of the prompt */
		rq.cb = rec_cb;
		rq.cb_arg = &got[0][k];
		rq.prefill_from = k ? (uint64_t)got[0][0].id : 0;
		got[0][k].id = ctrl_sched_submit(s, &rq);
	}
	assert_true(ctrl_sched_poll(s) >= 0);
	assert_int_equal(s->n_pf_wait, K - 1);
	assert_int_equal(ctrl_sched_cancel(s, (uint64_t)got[0][0].id), 0);
	for (long k = 0; k < 10000000 && !ctrl_sched_drained(s); k++)
		assert_true(ctrl_sched_poll(s) >= 0);
	assert_int_equal(got[0][0].finish, CTRL_FINISH_CANCELLED);
	for (int k = 1; k < K; k++) {
		assert_int_equal(got[0][k].finish, CTRL_FINISH_LENGTH);
		assert_int_equal(got[0][k].n, g_ref[4].n);
		assert_memory_equal(got[0][k].toks, g_ref[4].toks, sizeof(int32_t) * (size_t)g_ref[4].n);
	}
	assert_int_equal(s->n_pf_wait, 0);
	ctrl_sched_stats(s, &st);
	assert_int_equal(st.blocks_in_use, 0);
	ctrl_sched_destroy(s);
	ctrl_chain_destroy(c);
}

static void uneven_layer_ranges_give_every_request_its_solo_tokens_and_ranges_that_do_not_tile_are_refused(void **state)
{
	/* the tiny model has 3 layers: 0-2,2-3 is not the even split of 2 stages (0-1,1-3 is) */
	static const int32_t tilings[3][3] = { { 2, 3 }, { 1, 3 }, { 1, 2, 3 } };
	static const int32_t n_st[3] = { 2, 2, 3 };
	static const int32_t short_of[2] = { 1, 2 }, empty[2] = { 2, 2 };
	static struct rec got[N];
	struct ctrl_chain *c;
	char err[256];

	(void)state;
	assert_int_equal(kn_model_config(g_model)->n_layers, 3);
	for (int t = 0; t < 3; t++) {
		struct ctrl_sched_opts o;
		struct ctrl_sched *s;
		struct ctrl_chain_stats cs;

		c = kn_chain_ends(n_st[t], 1, tilings[t], err, sizeof(err));
		if (c == NULL)
			fail_msg("ctrl_kn_chain_create: %s", err);
		ctrl_sched_opts_init(&o);
		o.mb_cols = 8;
		s = ctrl_sched_create(c, &o, err, sizeof(err));
		if (s == NULL)
			fail_msg("ctrl_sched_create: %s", err);
		memset(got, 0, sizeof(got));
		for (int i = 0; i < N; i++)
			assert_true(submit_rec(s, &got[i], g_prompt[i], g_len[i], g_max[i], g_temp[i], (uint32_t)i) > 0);
		for (long k = 0; k < 10000000 && !ctrl_sched_drained(s); k++)
			assert_true(ctrl_sched_poll(s) >= 0);
		check_all(got);
		assert_int_equal(ctrl_chain_stats(c, &cs), 0);
		assert_int_equal(cs.n_stages, n_st[t]);
		ctrl_sched_destroy(s);
		ctrl_chain_destroy(c);
	}
	c = kn_chain_ends(2, 1, short_of, err, sizeof(err));
	assert_null(c);
	assert_int_equal(errno, EINVAL);
	assert_non_null(strstr(err, "must end at 3"));
	c = kn_chain_ends(2, 1, empty, err, sizeof(err));
	assert_null(c);
	assert_int_equal(errno, EINVAL);
	assert_non_null(strstr(err, "not after its start"));
}

/* ---- prefill/decode handoff: pages computed by one chain, decoded by another ---- */

/* One request's prefill-node side: its first token and its pages, per stage. */
struct pd_req {
	struct rec rec;            /* the prefill side's events (one token) */
	float lp;
	int32_t blocks[8], n_blocks, positions;
	void *pages[CTRL_CHAIN_MAX_STAGES];
	size_t len[CTRL_CHAIN_MAX_STAGES];
	struct kn_kv_format fmt[CTRL_CHAIN_MAX_STAGES];
	struct ctrl_sched *psched;
	struct ctrl_chain *pchain;
	int export_rc;
	int32_t held_seen;         /* kv_held_blocks when its finish came */
	int32_t progress[8], n_progress; /* kv_progress: blocks final so far */
	int progress_bad;          /* a progress event that was not a growing prefix */
	/* the decode side */
	struct rec got;
	struct ctrl_sched *dsched;
	struct ctrl_chain *dchain;
	int32_t n_stages;
	int reserved;              /* kv_reserved events seen */
	int32_t rsv[8];            /* the blocks the decode side reserved */
	int import_rc;
	int deliver;               /* 0: leave it waiting (the test ends it) */
	int lost;                  /* kv_lost events seen */
};

static void pd_prefill_cb(void *arg, const struct ctrl_event *ev)
{
	struct pd_req *q = arg;

	if (ev->kv_progress) {
		/* whole blocks, more each time, at most the prompt's */
		q->progress_bad |= ev->n_kv_blocks <= q->n_progress || ev->n_kv_blocks > 8 ||
				   ev->kv_positions < ev->n_kv_blocks * KN_PAGE_BLK ||
				   memcmp(q->progress, ev->kv_blocks, sizeof(int32_t) * (size_t)q->n_progress) != 0;
		if (ev->n_kv_blocks <= 8) {
			memcpy(q->progress, ev->kv_blocks, sizeof(int32_t) * (size_t)ev->n_kv_blocks);
			q->n_progress = ev->n_kv_blocks;
		}
		return;
	}
	if (ev->finish == CTRL_FINISH_NONE)
		q->lp = ev->logprob;
	else if (ev->n_kv_blocks > 0 && ev->n_kv_blocks <= 8) {
		/* what a prefill node does: read the pages out, then give the blocks back */
		memcpy(q->blocks, ev->kv_blocks, sizeof(int32_t) * (size_t)ev->n_kv_blocks);
		q->n_blocks = ev->n_kv_blocks;
		q->positions = ev->kv_positions;
		for (int32_t k = 0; k < q->n_stages && q->export_rc == 0; k++) {
			q->export_rc = ctrl_chain_kv_format(q->pchain, k, &q->fmt[k]);
			q->len[k] = q->fmt[k].block_bytes * (size_t)q->n_blocks;
			q->pages[k] = malloc(q->len[k]);
			if (q->export_rc == 0)
				q->export_rc = q->pages[k] == NULL ? -ENOMEM
					       : ctrl_chain_kv_export(q->pchain, k, q->blocks, q->n_blocks, q->pages[k],
								      q->len[k]);
		}
		if (q->export_rc == 0)
			q->export_rc = ctrl_sched_kv_release(q->psched, ev->id);
	}
	rec_cb(&q->rec, ev);
}

/* The decode side: on kv_reserved write the pages where the scheduler
 * wants them and say so; tokens and the finish go to got. */
static void pd_decode_cb(void *arg, const struct ctrl_event *ev)
{
	struct pd_req *q = arg;

	if (ev->kv_lost) {
		q->lost++;
		return;
	}
	if (!ev->kv_reserved) {
		rec_cb(&q->got, ev);
		return;
	}
	q->reserved++;
	if (ev->n_kv_blocks != q->n_blocks || ev->kv_positions != q->positions) {
		q->import_rc = -ERANGE;
		return;
	}
	memcpy(q->rsv, ev->kv_blocks, sizeof(int32_t) * (size_t)ev->n_kv_blocks);
	if (!q->deliver)
		return;
	for (int32_t k = 0; k < q->n_stages && q->import_rc == 0; k++)
		q->import_rc = ctrl_chain_kv_import(q->dchain, k, ev->kv_blocks, ev->n_kv_blocks, q->pages[k],
						    q->len[k], &q->fmt[k]);
	if (q->import_rc == 0)
		q->import_rc = ctrl_sched_kv_ready(q->dsched, ev->id, q->rec.toks[0], q->lp, 0, NULL, NULL);
}

enum pd_pipe { PD_PIPE_NONE, PD_PIPE_ALL, PD_PIPE_NOT_HELD };

static struct ctrl_sched *pd_sched_pipe(struct ctrl_chain *c, int spec, enum pd_pipe pipe, int prefix)
{
	struct ctrl_sched_opts o;
	struct ctrl_sched *s;
	char err[256];

	ctrl_sched_opts_init(&o);
	o.prefill_pipeline = pipe != PD_PIPE_NONE;
	o.pipeline_held = pipe == PD_PIPE_ALL;
	o.spec = spec;
	o.mb_cols = 8;
	o.hold_chunk = 20; /* held prompts in chunks of one block (20 rounds down to 16) */
	o.prefix_cache = prefix;
	s = ctrl_sched_create(c, &o, err, sizeof(err));
	if (s == NULL)
		fail_msg("ctrl_sched_create: %s", err);
	return s;
}

static struct ctrl_sched *pd_sched(struct ctrl_chain *c, int spec)
{
	return pd_sched_pipe(c, spec, PD_PIPE_NONE, 0);
}

static void drive_until_drained(struct ctrl_sched *s)
{
	for (long k = 0; k < 10000000 && !ctrl_sched_drained(s); k++)
		assert_true(ctrl_sched_poll(s) >= 0);
	assert_true(ctrl_sched_drained(s));
}

/* A prefill node ships a chunk's pages as several messages, a decode node
 * lands a burst of them: each export or import alone would wait for the
 * stage's running step, so the shipper holds the stage once for them all
 * (ctrl_chain_kv_hold). While held the stage computes nothing; the holder's
 * own page calls still run; on release the request completes as solo. */
static void a_held_stage_computes_nothing_until_released_while_its_holder_exports_its_pages(void **state)
{
	struct ctrl_chain *c = kn_chain(2, 1);
	struct ctrl_sched_opts o;
	struct ctrl_sched *s;
	struct kn_kv_format f;
	struct rec got = { 0 };
	char err[256];
	int32_t blk = 0;
	void *page;
	double t0;

	(void)state;
	ctrl_sched_opts_init(&o);
	o.mb_cols = 8;
	s = ctrl_sched_create(c, &o, err, sizeof(err));
	if (s == NULL)
		fail_msg("ctrl_sched_create: %s", err);
	assert_int_equal(ctrl_chain_kv_hold(c, 2, 1), -EINVAL);
	assert_int_equal(ctrl_chain_kv_hold(c, 1, 1), 0);
	assert_true(submit_rec(s, &got, g_prompt[0], g_len[0], g_max[0], g_temp[0], 0) > 0);
	for (t0 = kvf_mono_s(); kvf_mono_s() - t0 < 0.2;)
		assert_true(ctrl_sched_poll(s) >= 0);
	assert_int_equal(got.n, 0); /* stage 1 held: no token */
	assert_int_equal(ctrl_chain_kv_format(c, 1, &f), 0);
	page = malloc(f.block_bytes);
	assert_non_null(page);
	assert_int_equal(ctrl_chain_kv_export(c, 1, &blk, 1, page, f.block_bytes), 0);
	free(page);
	assert_int_equal(ctrl_chain_kv_hold(c, 1, 0), 0);
	drive_until_drained(s);
	assert_int_equal(got.finish, CTRL_FINISH_LENGTH);
	assert_int_equal(got.n, g_ref[0].n);
	assert_memory_equal(got.toks, g_ref[0].toks, sizeof(int32_t) * (size_t)g_ref[0].n);
	ctrl_sched_destroy(s);
	ctrl_chain_destroy(c);
}

/* Prefill every request on a chain of @p stages with hold_kv, read its
 * pages out, give the blocks back; @p q gets everything. @return the
 * prompt chunks launched while an earlier one of theirs was in flight. */
static uint64_t pd_prefill_pipe(struct pd_req *q, int32_t stages, enum pd_pipe pipe)
{
	struct ctrl_chain *pc = kn_chain(stages, 1);
	struct ctrl_sched *ps = pd_sched_pipe(pc, 0, pipe, 0);
	struct ctrl_sched_stats st;
	int n_progress = 0;

	for (int i = 0; i < N; i++) {
		struct ctrl_request rq;

		memset(&q[i], 0, sizeof(q[i]));
		request_of(&rq, i);
		rq.max_tokens = 1;
		rq.hold_kv = 1;
		rq.cb = pd_prefill_cb;
		rq.cb_arg = &q[i];
		q[i].n_stages = stages;
		q[i].psched = ps;
		q[i].pchain = pc;
		q[i].rec.id = ctrl_sched_submit(ps, &rq);
		assert_true(q[i].rec.id > 0);
	}
	drive_until_drained(ps);
	for (int i = 0; i < N; i++) {
		assert_int_equal(q[i].rec.finish, CTRL_FINISH_LENGTH);
		assert_int_equal(q[i].rec.n, 1);
		assert_int_equal(q[i].rec.toks[0], g_ref[i].toks[0]); /* the first token is the solo run's */
		assert_int_equal(q[i].positions, g_len[i]);
		assert_int_equal(q[i].n_blocks, (g_len[i] - 1) / KN_PAGE_BLK + 1);
		assert_int_equal(q[i].export_rc, 0);
		/* progress came as a prefix of the final block list, short of its last block,
		 * one block per chunk (hold_chunk): every block but the last before the finish */
		assert_false(q[i].progress_bad);
		assert_int_equal(q[i].n_progress, q[i].n_blocks - 1);
		assert_memory_equal(q[i].progress, q[i].blocks, sizeof(int32_t) * (size_t)q[i].n_progress);
		n_progress += q[i].n_progress > 0;
	}
	assert_true(n_progress > 0); /* prompts of several chunks told of their whole blocks */
	/* the releases land at the next poll; one more for a request whose blocks went back is stale */
	assert_int_equal(ctrl_sched_kv_release(ps, (uint64_t)q[0].rec.id), 0);
	assert_true(ctrl_sched_poll(ps) >= 0);
	ctrl_sched_stats(ps, &st);
	assert_int_equal(st.kv_held_blocks, 0);
	assert_int_equal(st.blocks_in_use, 0);
	assert_int_equal(st.kv_stale, 1);
	ctrl_sched_destroy(ps);
	ctrl_chain_destroy(pc);
	return st.prefill_pipelined;
}

static void pd_prefill_all(struct pd_req *q, int32_t stages)
{
	pd_prefill_pipe(q, stages, PD_PIPE_NONE);
}


static int64_t pd_submit_remote(struct pd_req *q, int i)
{
	struct ctrl_request rq;

	request_of(&rq, i);
	rq.kv_remote = 1;
	rq.cb = pd_decode_cb;
	rq.cb_arg = q;
	q->got.id = ctrl_sched_submit(q->dsched, &rq);
	return q->got.id;
}

static void pd_free(struct pd_req *q)
{
	for (int i = 0; i < N; i++)
		for (int32_t k = 0; k < q[i].n_stages; k++)
			free(q[i].pages[k]);
}

/* Where page copies queue behind the steps already sent (worker
 * processes), a held prompt keeps one chunk in flight so each chunk's
 * pages can leave before the next chunk's step; other prompts still
 * pipeline. Either way the first tokens and the progress are the solo
 * run's (pd_prefill_pipe checks them). */
static void a_held_prompt_pipelines_its_chunks_only_where_page_copies_need_not_wait_for_them(void **state)
{
	static struct pd_req q[N];

	(void)state;
	assert_true(pd_prefill_pipe(q, 2, PD_PIPE_ALL) > 0);
	pd_free(q);
	assert_int_equal(pd_prefill_pipe(q, 2, PD_PIPE_NOT_HELD), 0);
	pd_free(q);
}

static void a_decode_node_continues_from_pages_another_chain_computed_token_for_token(void **state)
{
	static struct pd_req q[N];

	(void)state;
	for (int32_t stages = 1; stages <= 2; stages++) {
		struct ctrl_chain *dc = kn_chain(stages, stages == 2);
		struct ctrl_sched *ds = pd_sched(dc, 1); /* speculation on the decode side too */
		struct ctrl_sched_stats st;

		pd_prefill_all(q, stages);
		for (int i = 0; i < N; i++) {
			q[i].dsched = ds;
			q[i].dchain = dc;
			q[i].deliver = 1;
			assert_true(pd_submit_remote(&q[i], i) > 0);
		}
		drive_until_drained(ds);
		for (int i = 0; i < N; i++) {
			assert_int_equal(q[i].reserved, 1);
			assert_int_equal(q[i].import_rc, 0);
			if (q[i].got.finish != CTRL_FINISH_LENGTH)
				fail_msg("request %d ended %s: %s", i, ctrl_finish_name(q[i].got.finish), q[i].got.msg);
			/* the co-located run's tokens, the first one (the prefill node's) included */
			assert_int_equal(q[i].got.n, g_ref[i].n);
			assert_memory_equal(q[i].got.toks, g_ref[i].toks, sizeof(int32_t) * (size_t)g_ref[i].n);
		}
		ctrl_sched_stats(ds, &st);
		printf("stages=%d: %llu requests decoded from imported pages, %llu launches, prefill columns %llu\n",
		       stages, (unsigned long long)st.kv_imported, (unsigned long long)st.launches,
		       (unsigned long long)st.prefill_cols);
		assert_int_equal(st.kv_imported, N);
		assert_int_equal(st.prefill_cols, 0); /* nothing recomputed the prompts */
		assert_int_equal(st.kv_waiting, 0);
		assert_int_equal(st.blocks_in_use, 0);
		ctrl_sched_destroy(ds);
		ctrl_chain_destroy(dc);
		pd_free(q);
	}
}

/* A prefill node's prefix cache: the set prefilled twice with hold_kv on
 * one scheduler, pages read out and released as a prefill node does. The
 * second time each prompt takes the whole blocks the first named (told at
 * admission, so they may ship at once), computes only the rest, and ships
 * the first time's whole blocks byte for byte; a decode node continues
 * from its pages with the co-located tokens. Released, no block is in use
 * and the named ones idle in the cache. */
static void a_prefill_nodes_cached_prefix_ships_the_same_pages_and_the_decode_node_answers_co_located(void **state)
{
	static struct pd_req q[2][N];
	struct ctrl_chain *pc = kn_chain(2, 1), *dc = kn_chain(2, 1);
	struct ctrl_sched *ds = pd_sched(dc, 0), *ps = pd_sched_pipe(pc, 0, PD_PIPE_NONE, 1);
	struct ctrl_sched_stats st;
	uint64_t hits[2] = {0, 0}, cols[2] = {0, 0};
	int32_t saved = 0;

	(void)state;
	for (int i = 0; i < N; i++)
		saved += (g_len[i] - 1) / KN_PAGE_BLK * KN_PAGE_BLK;
	for (int wave = 0; wave < 2; wave++) {
		for (int i = 0; i < N; i++) {
			struct ctrl_request rq;

			memset(&q[wave][i], 0, sizeof(q[wave][i]));
			request_of(&rq, i);
			rq.max_tokens = 1;
			rq.hold_kv = 1;
			rq.cb = pd_prefill_cb;
			rq.cb_arg = &q[wave][i];
			q[wave][i].n_stages = 2;
			q[wave][i].psched = ps;
			q[wave][i].pchain = pc;
			q[wave][i].rec.id = ctrl_sched_submit(ps, &rq);
			assert_true(q[wave][i].rec.id > 0);
		}
		drive_until_drained(ps);
		assert_true(ctrl_sched_poll(ps) >= 0); /* the releases */
		ctrl_sched_stats(ps, &st);
		hits[wave] = st.prefix_hit_tokens - (wave ? hits[0] : 0);
		cols[wave] = st.prefill_cols - (wave ? cols[0] : 0);
		assert_int_equal(st.kv_held_blocks, 0);
		assert_int_equal(st.blocks_in_use, 0);
		assert_true(st.blocks_cached > 0);
	}
	printf("held prompts twice: prompt columns %llu then %llu, positions from the cache %llu then %llu (at most %d)\n",
	       (unsigned long long)cols[0], (unsigned long long)cols[1], (unsigned long long)hits[0],
	       (unsigned long long)hits[1], saved);
	assert_true(hits[1] > 0 && hits[1] <= (uint64_t)saved);
	assert_int_equal(cols[0] - cols[1], hits[1] - hits[0]); /* what the cache gave was not computed */
	for (int i = 0; i < N; i++) {
		struct pd_req *a = &q[0][i], *b = &q[1][i];

		assert_int_equal(b->rec.finish, CTRL_FINISH_LENGTH);
		assert_int_equal(b->rec.toks[0], g_ref[i].toks[0]);
		assert_int_equal(b->export_rc, 0);
		assert_int_equal(b->n_blocks, a->n_blocks);
		assert_int_equal(b->positions, a->positions);
		assert_false(b->progress_bad);
		assert_int_equal(b->n_progress, b->n_blocks - 1);
		for (int32_t k = 0; k < 2; k++) /* whole blocks; the last one's unused positions may differ */
			assert_memory_equal(a->pages[k], b->pages[k], b->fmt[k].block_bytes * (size_t)(b->n_blocks - 1));
		b->dsched = ds;
		b->dchain = dc;
		b->deliver = 1;
		assert_true(pd_submit_remote(b, i) > 0);
	}
	drive_until_drained(ds);
	for (int i = 0; i < N; i++) {
		assert_int_equal(q[1][i].import_rc, 0);
		assert_int_equal(q[1][i].got.finish, CTRL_FINISH_LENGTH);
		assert_int_equal(q[1][i].got.n, g_ref[i].n);
		assert_memory_equal(q[1][i].got.toks, g_ref[i].toks, sizeof(int32_t) * (size_t)g_ref[i].n);
	}
	pd_free(q[0]);
	pd_free(q[1]);
	ctrl_sched_destroy(ds);
	ctrl_sched_destroy(ps);
	ctrl_chain_destroy(dc);
	ctrl_chain_destroy(pc);
}

/* Request @p i, waiting for its pages on @p ds: they land in its reserved
 * blocks of @p dc, its first token follows, and it decodes its solo tokens. */
static void land_and_decode(struct ctrl_sched *ds, struct ctrl_chain *dc, struct pd_req *q, int i)
{
	assert_int_equal(q[i].import_rc, 0);
	assert_int_equal(ctrl_chain_kv_import(dc, 0, q[i].rsv, q[i].n_blocks, q[i].pages[0], q[i].len[0],
					      &q[i].fmt[0]), 0);
	assert_int_equal(ctrl_sched_kv_ready(ds, (uint64_t)q[i].got.id, q[i].rec.toks[0], q[i].lp, 0, NULL, NULL), 0);
	drive_until_drained(ds);
	assert_int_equal(q[i].got.finish, CTRL_FINISH_LENGTH);
	assert_memory_equal(q[i].got.toks, g_ref[i].toks, sizeof(int32_t) * (size_t)g_ref[i].n);
}

/* Three remote requests on @p ds (prompts prefilled on a one-stage chain),
 * polled until each has its blocks reserved and waits for its pages. */
static void three_waiting(struct ctrl_sched *ds, struct ctrl_chain *dc, struct pd_req *q)
{
	pd_prefill_all(q, 1);
	for (int i = 0; i < 3; i++) {
		q[i].dsched = ds;
		q[i].dchain = dc;
		assert_true(pd_submit_remote(&q[i], i) > 0);
	}
	for (int k = 0; k < 100 && (q[0].reserved == 0 || q[1].reserved == 0 || q[2].reserved == 0); k++)
		assert_true(ctrl_sched_poll(ds) >= 0);
}

static void a_remote_request_that_ends_while_waiting_gives_its_blocks_back_and_a_late_ready_is_ignored(void **state)
{
	static struct pd_req q[N];
	struct ctrl_chain *dc = kn_chain(1, 0);
	struct ctrl_sched *ds = pd_sched(dc, 0);
	struct ctrl_sched_stats st;

	(void)state;
	three_waiting(ds, dc, q);
	ctrl_sched_stats(ds, &st);
	assert_int_equal(st.kv_waiting, 3);
	/* waiting requests are never packed: nothing computes their prompts */
	for (int k = 0; k < 50; k++)
		assert_true(ctrl_sched_poll(ds) >= 0);
	ctrl_sched_stats(ds, &st);
	assert_int_equal(st.launches, 0);
	assert_true(st.blocks_in_use > 0);
	/* one fails, one is cancelled, one gets its pages late */
	assert_int_equal(ctrl_sched_kv_failed(ds, (uint64_t)q[0].got.id, "prefill node 10.0.0.1:8998 was lost"), 0);
	assert_int_equal(ctrl_sched_cancel(ds, (uint64_t)q[1].got.id), 0);
	for (int k = 0; k < 10; k++)
		assert_true(ctrl_sched_poll(ds) >= 0);
	assert_int_equal(q[0].got.finish, CTRL_FINISH_ERROR);
	assert_non_null(strstr(q[0].got.msg, "10.0.0.1:8998 was lost"));
	assert_int_equal(q[0].got.n, 0);
	assert_int_equal(q[1].got.finish, CTRL_FINISH_CANCELLED);
	/* late: the request ended, its blocks went back; the ready changes nothing */
	assert_int_equal(ctrl_sched_kv_ready(ds, (uint64_t)q[0].got.id, 1, 0.0f, 0, NULL, NULL), 0);
	assert_int_equal(ctrl_sched_kv_ready(ds, (uint64_t)q[0].got.id, -1, 0.0f, 0, NULL, NULL), -EINVAL);
	for (int k = 0; k < 10; k++)
		assert_true(ctrl_sched_poll(ds) >= 0);
	ctrl_sched_stats(ds, &st);
	assert_int_equal(st.kv_stale, 1);
	assert_int_equal(st.kv_waiting, 1);
	assert_int_equal(q[0].got.done, 1);
	/* the third one still lands and decodes its solo tokens */
	land_and_decode(ds, dc, q, 2);
	ctrl_sched_stats(ds, &st);
	assert_int_equal(st.blocks_in_use, 0);
	assert_int_equal(st.kv_waiting, 0);
	ctrl_sched_destroy(ds);
	ctrl_chain_destroy(dc);
	pd_free(q);
}

/*
 * The first token need not wait for the last page: ctrl_sched_kv_first()
 * emits it while the request still waits (nothing decodes, nothing is
 * launched), and the ready that follows emits nothing more, so the client
 * gets the co-located tokens, each once. A second first token is stale; a
 * failure after the first token ends the request with the error, its
 * blocks back.
 */
static void a_remote_requests_first_token_goes_out_before_its_pages_and_ready_does_not_send_it_again(void **state)
{
	static struct pd_req q[N];
	struct ctrl_chain *dc = kn_chain(1, 0);
	struct ctrl_sched *ds = pd_sched(dc, 0);
	struct ctrl_sched_stats st;

	(void)state;
	three_waiting(ds, dc, q);
	for (int i = 0; i < 3; i++)
		assert_int_equal(ctrl_sched_kv_first(ds, (uint64_t)q[i].got.id, q[i].rec.toks[0], q[i].lp, 0, NULL, NULL),
				 0);
	assert_int_equal(ctrl_sched_kv_first(ds, (uint64_t)q[2].got.id, q[2].rec.toks[0], q[2].lp, 0, NULL, NULL), 0);
	assert_int_equal(ctrl_sched_kv_first(ds, (uint64_t)q[0].got.id, -1, 0.0f, 0, NULL, NULL), -EINVAL);
	for (int k = 0; k < 50; k++)
		assert_true(ctrl_sched_poll(ds) >= 0);
	/* each client has its first token, the co-located one, and nothing ran */
	ctrl_sched_stats(ds, &st);
	assert_int_equal(st.launches, 0);
	assert_int_equal(st.kv_waiting, 3);
	assert_int_equal(st.kv_stale, 1); /* q[2]'s second first token */
	for (int i = 0; i < 3; i++) {
		assert_int_equal(q[i].got.n, 1);
		assert_int_equal(q[i].got.toks[0], g_ref[i].toks[0]);
		assert_int_equal(q[i].got.done, 0);
	}
	/* a failure after it: the error, the first token already out */
	assert_int_equal(ctrl_sched_kv_failed(ds, (uint64_t)q[1].got.id, "its pages did not land in 30 s"), 0);
	for (int k = 0; k < 10; k++)
		assert_true(ctrl_sched_poll(ds) >= 0);
	assert_int_equal(q[1].got.finish, CTRL_FINISH_ERROR);
	assert_int_equal(q[1].got.n, 1);
	/* the pages land: the rest of the co-located tokens, the first not again */
	for (int i = 0; i < 3; i += 2) {
		assert_int_equal(ctrl_chain_kv_import(dc, 0, q[i].rsv, q[i].n_blocks, q[i].pages[0], q[i].len[0],
						      &q[i].fmt[0]), 0);
		assert_int_equal(ctrl_sched_kv_ready(ds, (uint64_t)q[i].got.id, q[i].rec.toks[0], q[i].lp, 0, NULL, NULL),
				 0);
	}
	drive_until_drained(ds);
	for (int i = 0; i < 3; i += 2) {
		assert_int_equal(q[i].got.finish, CTRL_FINISH_LENGTH);
		assert_int_equal(q[i].got.n, g_ref[i].n);
		assert_memory_equal(q[i].got.toks, g_ref[i].toks, sizeof(int32_t) * (size_t)g_ref[i].n);
	}
	ctrl_sched_stats(ds, &st);
	assert_int_equal(st.kv_imported, 2);
	assert_int_equal(st.kv_waiting, 0);
	assert_int_equal(st.blocks_in_use, 0);
	ctrl_sched_destroy(ds);
	ctrl_chain_destroy(dc);
	pd_free(q);
}

/*
 * A room may fail before the decode scheduler admitted its request (the
 * prefill node died as it was forwarded): the request ends at once with the
 * error where it waits, in the queue or not yet taken from the inbox; before,
 * the failure was dropped as stale and the request, once admitted, waited for
 * pages no one would send until its client gave up (the PD fault drill's
 * prefill-kill found one hung).
 */
/* A decode scheduler of one slot on @p dc (one request admitted, the rest
 * wait in the queue) for requests q[0 .. n), their prompts prefilled on a
 * @p stages-stage chain (their pages ready to deliver). */
static struct ctrl_sched *one_slot_decode(struct ctrl_chain *dc, struct pd_req *q, int32_t stages, int n)
{
	struct ctrl_sched_opts o;
	struct ctrl_sched *ds;
	char err[256];

	ctrl_sched_opts_init(&o);
	o.n_slots = 1;
	ds = ctrl_sched_create(dc, &o, err, sizeof(err));
	assert_non_null(ds);
	pd_prefill_all(q, stages);
	for (int i = 0; i < n; i++) {
		q[i].dsched = ds;
		q[i].dchain = dc;
	}
	return ds;
}

static void a_remote_request_failed_before_admission_ends_at_once_with_the_error(void **state)
{
	static struct pd_req q[N];
	struct ctrl_chain *dc = kn_chain(1, 0);
	struct ctrl_sched *ds = one_slot_decode(dc, q, 1, 3);
	struct ctrl_sched_stats st;

	(void)state;
	/* 0 is admitted and waits for its pages; 1 waits in the queue */
	assert_true(pd_submit_remote(&q[0], 0) > 0);
	assert_true(pd_submit_remote(&q[1], 1) > 0);
	for (int k = 0; k < 20; k++)
		assert_true(ctrl_sched_poll(ds) >= 0);
	assert_int_equal(q[0].reserved, 1);
	assert_int_equal(q[1].reserved, 0);
	assert_int_equal(ctrl_sched_kv_failed(ds, (uint64_t)q[1].got.id, "prefill node 10.0.0.1:8998 lost"), 0);
	/* 2 fails before the scheduler ever polled it */
	assert_true(pd_submit_remote(&q[2], 2) > 0);
	assert_int_equal(ctrl_sched_kv_failed(ds, (uint64_t)q[2].got.id, "forwarding the prompt failed"), 0);
	for (int k = 0; k < 10; k++)
		assert_true(ctrl_sched_poll(ds) >= 0);
	assert_int_equal(q[1].got.finish, CTRL_FINISH_ERROR);
	assert_non_null(strstr(q[1].got.msg, "10.0.0.1:8998 lost"));
	assert_int_equal(q[2].got.finish, CTRL_FINISH_ERROR);
	assert_non_null(strstr(q[2].got.msg, "forwarding the prompt failed"));
	assert_int_equal(q[1].reserved + q[2].reserved, 0); /* never admitted, no blocks taken */
	ctrl_sched_stats(ds, &st);
	assert_int_equal(st.kv_stale, 0);
	assert_int_equal(st.kv_waiting, 1);
	/* 0 still lands and decodes its solo tokens */
	land_and_decode(ds, dc, q, 0);
	ctrl_sched_stats(ds, &st);
	assert_int_equal(st.blocks_in_use, 0);
	ctrl_sched_destroy(ds);
	ctrl_chain_destroy(dc);
	pd_free(q);
}

/*
 * A decode node whose prefill node could not prefill a prompt (its chain
 * failed it) computes the prompt itself (ctrl_sched_kv_local()): its owner
 * hears kv_lost once (no page may land any more), and the request streams
 * the co-located tokens, whether it was admitted and waiting for its pages
 * (prefilled into the blocks it reserved) or still queued (admitted as a
 * local request). One that is gone is stale.
 */
static void a_remote_request_told_to_compute_here_streams_the_co_located_tokens(void **state)
{
	static struct pd_req q[N];
	struct ctrl_chain *dc = kn_chain(2, 1);
	struct ctrl_sched *ds = one_slot_decode(dc, q, 2, 2);
	struct ctrl_sched_stats st;

	(void)state;
	for (int i = 0; i < 2; i++) /* one admitted, the other waits in the queue */
		assert_true(pd_submit_remote(&q[i], i) > 0);
	for (int k = 0; k < 20; k++)
		assert_true(ctrl_sched_poll(ds) >= 0);
	assert_int_equal(q[0].reserved, 1);
	assert_int_equal(q[1].reserved, 0);
	assert_int_equal(ctrl_sched_kv_local(ds, (uint64_t)q[0].got.id), 0);
	assert_int_equal(ctrl_sched_kv_local(ds, (uint64_t)q[1].got.id), 0);
	drive_until_drained(ds);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(q[i].lost, 1);
		if (q[i].got.finish != CTRL_FINISH_LENGTH)
			fail_msg("request %d ended %s: %s", i, ctrl_finish_name(q[i].got.finish), q[i].got.msg);
		assert_int_equal(q[i].got.n, g_ref[i].n);
		assert_memory_equal(q[i].got.toks, g_ref[i].toks, sizeof(int32_t) * (size_t)g_ref[i].n);
	}
	assert_int_equal(q[1].reserved, 0); /* admitted as a local request: no reservation event */
	ctrl_sched_stats(ds, &st);
	assert_int_equal(st.kv_replayed_here, 2);
	assert_int_equal(st.kv_waiting, 0);
	assert_int_equal(st.blocks_in_use, 0);
	assert_true(st.prefill_cols > 0); /* the prompts were computed here */
	/* gone: stale */
	assert_int_equal(ctrl_sched_kv_local(ds, (uint64_t)q[0].got.id), 0);
	assert_true(ctrl_sched_poll(ds) >= 0);
	ctrl_sched_stats(ds, &st);
	assert_int_equal(st.kv_stale, 1);
	ctrl_sched_destroy(ds);
	ctrl_chain_destroy(dc);
	pd_free(q);
}

/* ---- the two PD ends (ctrl_pd_xfer.h) over an in-memory transport ---- */

enum { XQ = 256 };

struct xmsg {
	uint32_t node;
	size_t len;
	uint8_t b[1024];
};

/* A page message in flight: one stage's pages for one room. */
struct xpage {
	uint64_t room;
	uint32_t session;
	int32_t stage, n;
	int last;
	uint32_t dst[8];
	void *data;
	size_t len;
	struct kn_kv_format fmt;
};

struct xnet {
	struct xmsg to_p[XQ], to_d[XQ];
	int n_p, n_d;
	struct xpage pages[XQ];
	int n_pages;
	struct ctrl_chain *pchain, *dchain;
	int32_t stages;
	int pages_first;           /* deliver page messages before statuses */
	int drop_pages;            /* lose them instead (what a dead link would do) */
	int ranges, partial;       /* ship calls, and those before a room's prompt was done */
};

static int x_push(struct xmsg *q, int *n, uint32_t node, const uint8_t *m, size_t len)
{
	if (*n >= XQ || len > sizeof(q[0].b))
		return -ENOSPC;
	q[*n].node = node;
	q[*n].len = len;
	memcpy(q[*n].b, m, len);
	(*n)++;
	return 0;
}

static int x_send_to_p(void *arg, uint32_t node, const uint8_t *m, size_t len)
{
	struct xnet *x = arg;

	(void)node;
	return x_push(x->to_p, &x->n_p, 7 /* the decode node, as the prefill node knows it */, m, len);
}

static int x_send_to_d(void *arg, uint32_t node, const uint8_t *m, size_t len)
{
	struct xnet *x = arg;

	assert_int_equal(node, 7);
	return x_push(x->to_d, &x->n_d, 0, m, len);
}

/* The prefill node's ship: read each stage's pages out of its chain. */
static int x_ship(void *arg, uint32_t node, uint64_t room, uint32_t session, const int32_t *src, const uint32_t *dst,
		  int32_t from, int32_t to, int last, char *err, size_t errlen)
{
	struct xnet *x = arg;
	int32_t n = to - from;

	(void)node;
	src += from;
	dst += from;
	x->ranges++;
	x->partial += !last;
	for (int32_t k = 0; k < x->stages; k++) {
		struct xpage *pg = &x->pages[x->n_pages++];
		int rc;

		pg->room = room;
		pg->session = session;
		pg->stage = k;
		pg->n = n;
		pg->last = last;
		memcpy(pg->dst, dst, sizeof(uint32_t) * (size_t)n);
		rc = ctrl_chain_kv_format(x->pchain, k, &pg->fmt);
		pg->len = pg->fmt.block_bytes * (size_t)n;
		pg->data = malloc(pg->len);
		if (rc == 0)
			rc = ctrl_chain_kv_export(x->pchain, k, src, n, pg->data, pg->len);
		if (rc < 0) {
			snprintf(err, errlen, "export of stage %d failed: %d", k, rc);
			return rc;
		}
	}
	return 0;
}

/* Deliver what is in flight; the decode node imports page messages into its chain. */
static int x_deliver(struct xnet *x, struct ctrl_pd_prefill *pp, struct ctrl_pd_decode *pd)
{
	int moved = x->n_p + x->n_d + x->n_pages;

	ctrl_pd_prefill_tick(pp, 0); /* ships what defer_ship left ready (time 0 expires nothing) */
	for (int i = 0; i < x->n_p; i++)
		ctrl_pd_prefill_on_control(pp, x->to_p[i].node, x->to_p[i].b, x->to_p[i].len);
	x->n_p = 0;
	for (int pass = 0; pass < 2; pass++) {
		if ((pass == 0) == (x->pages_first != 0)) {
			for (int i = 0; i < x->n_pages; i++) {
				struct xpage *pg = &x->pages[i];
				int32_t blk[8];

				for (int32_t b = 0; b < pg->n; b++)
					blk[b] = (int32_t)pg->dst[b];
				if (!x->drop_pages) {
					assert_int_equal(ctrl_chain_kv_import(x->dchain, pg->stage, blk, pg->n, pg->data,
									      pg->len, &pg->fmt), 0);
					ctrl_pd_decode_on_pages(pd, pg->room, pg->session, pg->stage, pg->last,
								(uint32_t)pg->n, 4096);
				}
				free(pg->data);
			}
			x->n_pages = 0;
		} else {
			for (int i = 0; i < x->n_d; i++)
				ctrl_pd_decode_on_control(pd, x->to_d[i].b, x->to_d[i].len);
			x->n_d = 0;
		}
	}
	return moved;
}

struct x_pair {
	struct xnet net;
	struct ctrl_chain *pc, *dc;
	struct ctrl_sched *ps, *ds;
	struct ctrl_rooms *rooms;
	struct ctrl_pd_decode *pd;
	struct ctrl_pd_prefill *pp;
};

/* x_pair_init's prefill end ships from its tick (as kvferry-ctrld's does), not in the finish callback */
static int g_defer_ship;

/* x_pair_init's decode end asks this of its prefill node's dataplane (when g_peer_known) */
static int g_peer_known;
static uint64_t g_peer_epoch, g_peer_silent_ms;

static int x_peer_state(void *arg, uint32_t node, uint64_t *epoch, uint64_t *silent_ms)
{
	(void)arg;
	(void)node;
	*epoch = g_peer_epoch;
	*silent_ms = g_peer_silent_ms;
	return 0;
}

/* x_pair_init's decode end runs a lost room again through this (when
 * g_retry): the prompt of request g_retry_req goes to the prefill end again
 * under room old + 1000, as kvferry-ctrld's forward would send it. */
static int g_retry, g_retry_req;
static int g_compute_here; /* x_pair_init: ctrl_pd_decode_opts.compute_here */
static struct ctrl_pd_prefill *g_retry_pp;
static struct rec g_retry_pre;

static int x_retry(void *arg, uint32_t node, uint64_t old_room, uint64_t *new_room)
{
	struct ctrl_request rq;

	(void)arg;
	(void)node;
	*new_room = old_room + 1000;
	request_of(&rq, g_retry_req);
	rq.cb = rec_cb;
	rq.cb_arg = &g_retry_pre;
	return ctrl_pd_prefill_submit(g_retry_pp, &rq, *new_room, 7) > 0 ? 0 : -1;
}

/* x_pair_init's prefill end reads its chain's KV generation here */
static uint64_t g_kv_gen;

static uint64_t x_kv_gen(void *arg)
{
	(void)arg;
	return g_kv_gen;
}

static void x_pair_init(struct x_pair *x, int32_t stages, uint64_t timeout_ns)
{
	struct ctrl_rooms_opts ro;
	struct ctrl_pd_decode_opts dopt = { 0 };
	struct ctrl_pd_prefill_opts popt = { 0 };

	memset(x, 0, sizeof(*x));
	x->pc = kn_chain(stages, 1);
	x->dc = kn_chain(stages, stages == 1 ? 0 : 1);
	x->ps = pd_sched(x->pc, 0);
	x->ds = pd_sched(x->dc, 1);
	x->net.pchain = x->pc;
	x->net.dchain = x->dc;
	x->net.stages = stages;
	ctrl_rooms_opts_init(&ro);
	ro.vocab_size = vocab();
	if (timeout_ns)
		ro.timeout_ns = timeout_ns;
	x->rooms = ctrl_rooms_create(&ro);
	assert_non_null(x->rooms);
	dopt.sched = x->ds;
	dopt.rooms = x->rooms;
	dopt.session = 42;
	dopt.n_streams = stages;
	dopt.send = x_send_to_p;
	dopt.send_arg = &x->net;
	if (g_peer_known)
		dopt.peer_state = x_peer_state;
	if (g_retry) {
		dopt.retry = x_retry;
		dopt.max_retries = 1;
	}
	dopt.compute_here = g_compute_here;
	x->pd = ctrl_pd_decode_create(&dopt);
	popt.sched = x->ps;
	popt.rank = 0;
	popt.send = x_send_to_d;
	popt.send_arg = &x->net;
	popt.ship = x_ship;
	popt.ship_arg = &x->net;
	popt.defer_ship = g_defer_ship;
	popt.kv_gen = x_kv_gen;
	x->pp = ctrl_pd_prefill_create(&popt);
	assert_non_null(x->pd);
	assert_non_null(x->pp);
}

static void x_pair_free(struct x_pair *x)
{
	ctrl_sched_destroy(x->ds);
	ctrl_sched_destroy(x->ps);
	ctrl_pd_decode_destroy(x->pd);
	ctrl_pd_prefill_destroy(x->pp);
	ctrl_rooms_destroy(x->rooms);
	ctrl_chain_destroy(x->pc);
	ctrl_chain_destroy(x->dc);
}

/* Poll both nodes and the wire until both schedulers are drained. */
static void x_run(struct x_pair *x)
{
	for (long k = 0; k < 10000000; k++) {
		int busy = ctrl_sched_poll(x->ps) | ctrl_sched_poll(x->ds);

		busy |= x_deliver(&x->net, x->pp, x->pd);
		ctrl_pd_decode_tick(x->pd, 0);
		if (!busy && ctrl_sched_drained(x->ps) && ctrl_sched_drained(x->ds))
			return;
	}
	fail_msg("the two nodes did not drain");
}

static void a_request_served_disaggregated_streams_the_co_located_tokens_in_either_arrival_order(void **state)
{
	static struct rec got[N], pre[N];

	(void)state;
	for (int32_t v = 0; v < 6; v++) {
			int32_t stages = 1 + v % 2, pages_first = v / 2 % 2;
			struct x_pair x;
			struct ctrl_sched_stats sp, sd;
			struct ctrl_pd_decode_stats dst;
			struct ctrl_pd_prefill_stats pst;

			g_defer_ship = v >= 4; /* the last two: shipped from the prefill end's tick */
			x_pair_init(&x, stages, 0);
			g_defer_ship = 0;
			x.net.pages_first = pages_first;
			memset(got, 0, sizeof(got));
			memset(pre, 0, sizeof(pre));
			for (int i = 0; i < N; i++) {
				struct ctrl_request rq;

				request_of(&rq, i);
				rq.cb = rec_cb;
				rq.cb_arg = &got[i];
				assert_true(ctrl_pd_decode_submit(x.pd, &rq, 1000u + (uint64_t)i, 0, 1, 0) > 0);
			}
			/* half the prompts reach the prefill node after their manifest */
			for (int i = 0; i < N; i += 2) {
				struct ctrl_request rq;

				request_of(&rq, i);
				rq.cb = rec_cb;
				rq.cb_arg = &pre[i];
				assert_true(ctrl_pd_prefill_submit(x.pp, &rq, 1000u + (uint64_t)i, 7) > 0);
			}
			for (int k = 0; k < 200; k++) {
				ctrl_sched_poll(x.ds);
				x_deliver(&x.net, x.pp, x.pd);
			}
			for (int i = 1; i < N; i += 2) {
				struct ctrl_request rq;

				request_of(&rq, i);
				rq.cb = rec_cb;
				rq.cb_arg = &pre[i];
				assert_true(ctrl_pd_prefill_submit(x.pp, &rq, 1000u + (uint64_t)i, 7) > 0);
			}
			x_run(&x);
			for (int i = 0; i < N; i++) {
				if (got[i].finish != CTRL_FINISH_LENGTH)
					fail_msg("request %d ended %s: %s", i, ctrl_finish_name(got[i].finish), got[i].msg);
				assert_int_equal(got[i].n, g_ref[i].n);
				assert_memory_equal(got[i].toks, g_ref[i].toks, sizeof(int32_t) * (size_t)g_ref[i].n);
				assert_int_equal(pre[i].n, 1); /* the prefill node produced the first token */
				assert_int_equal(pre[i].toks[0], g_ref[i].toks[0]);
			}
			ctrl_sched_poll(x.ps); /* the last releases */
			ctrl_sched_stats(x.ps, &sp);
			ctrl_sched_stats(x.ds, &sd);
			ctrl_pd_decode_stats(x.pd, &dst);
			ctrl_pd_prefill_stats(x.pp, &pst);
			printf("stages=%d pages %s%s: rooms ok %llu, manifests %llu, pages shipped %llu in %d ranges (%d "
			       "while the prompt ran), decode prefill columns %llu\n", stages,
			       pages_first ? "before statuses" : "after statuses", v >= 4 ? ", shipped from the tick" : "",
			       (unsigned long long)dst.rooms_ok, (unsigned long long)dst.manifests_sent,
			       (unsigned long long)pst.pages_shipped, x.net.ranges, x.net.partial,
			       (unsigned long long)sd.prefill_cols);
			/* prompts of several chunks ship their whole blocks as each chunk comes back */
			assert_true(x.net.partial > 0);
			assert_int_equal(dst.rooms_ok, N);
			assert_int_equal(pst.rooms_done, N);
			assert_int_equal(sd.prefill_cols, 0);
			assert_int_equal(sp.blocks_in_use, 0);
			assert_int_equal(sd.blocks_in_use, 0);
			assert_int_equal(ctrl_rooms_count(x.rooms), 0); /* every room forgotten */
			x_pair_free(&x);
		}
}

static void a_lost_node_a_landing_without_a_first_token_and_garbage_each_end_only_their_own_request(void **state)
{
	static struct rec got[4], pre;
	const uint32_t node[4] = { 0, 0, 1, 2 };
	struct x_pair x;
	struct ctrl_request rq;
	struct ctrl_pd_decode_stats dst;
	struct ctrl_pd_prefill_stats pst;
	uint8_t buf[256];
	int len;

	(void)state;
	x_pair_init(&x, 1, 0);
	memset(got, 0, sizeof(got));
	memset(&pre, 0, sizeof(pre));
	/* rooms 1 and 2 on node 0 (it never runs them), 3 on node 1 (its status
	 * is forged below), 4 on node 2 (served) */
	for (int i = 0; i < 4; i++) {
		request_of(&rq, i);
		rq.cb = rec_cb;
		rq.cb_arg = &got[i];
		assert_true(ctrl_pd_decode_submit(x.pd, &rq, 1u + (uint64_t)i, node[i], 1, 0) > 0);
	}
	assert_int_equal(ctrl_pd_decode_submit(x.pd, &rq, 1, 0, 1, 0), -EEXIST);
	request_of(&rq, 3);
	rq.cb = rec_cb;
	rq.cb_arg = &pre;
	assert_true(ctrl_pd_prefill_submit(x.pp, &rq, 4, 7) > 0);
	for (int k = 0; k < 20; k++) {
		ctrl_sched_poll(x.ds);
		x_deliver(&x.net, x.pp, x.pd);
	}
	/* garbage and a truncated status are refused and change nothing */
	memset(buf, 0xa5, sizeof(buf));
	ctrl_pd_decode_on_control(x.pd, buf, 40);
	len = ctrl_pd_encode_status(buf, sizeof(buf), 2, 42, 0, 0, 5, 0, NULL);
	assert_true(len > 0);
	ctrl_pd_decode_on_control(x.pd, buf, (size_t)len - 3);
	ctrl_pd_prefill_on_control(x.pp, 7, buf, 17);
	/* room 3: its one rank lands without a first token */
	len = ctrl_pd_encode_status(buf, sizeof(buf), 3, 42, 0, 0, -1, 0, NULL);
	ctrl_pd_decode_on_control(x.pd, buf, (size_t)len);
	ctrl_pd_decode_on_pages(x.pd, 3, 42, 0, 1, 1, 4096);
	/* node 0 is lost: exactly its two unfinished rooms fail */
	assert_int_equal(ctrl_rooms_node_lost(x.rooms, 0), 2);
	ctrl_pd_decode_tick(x.pd, 0);
	x_run(&x);
	for (int i = 0; i < 4; i++)
		printf("room %d: %s, %d tokens%s%s\n", i + 1, ctrl_finish_name(got[i].finish), got[i].n,
		       got[i].msg[0] ? ": " : "", got[i].msg);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(got[i].finish, CTRL_FINISH_ERROR);
		assert_int_equal(got[i].n, 0);
	}
	assert_non_null(strstr(got[0].msg, "room 1"));
	assert_non_null(strstr(got[2].msg, "room 3"));
	assert_int_equal(got[3].finish, CTRL_FINISH_LENGTH);
	assert_memory_equal(got[3].toks, g_ref[3].toks, sizeof(int32_t) * (size_t)g_ref[3].n);
	ctrl_pd_decode_stats(x.pd, &dst);
	ctrl_pd_prefill_stats(x.pp, &pst);
	assert_int_equal(dst.msg.malformed, 2);
	assert_int_equal(pst.malformed, 1);
	assert_int_equal(dst.rooms_failed, 3);
	assert_int_equal(dst.rooms_ok, 1);
	/* the prefill side was told to free what it holds for the failed rooms */
	assert_int_equal(dst.aborts_sent, 3);
	assert_int_equal(pst.aborts, 3);
	assert_int_equal(ctrl_rooms_count(x.rooms), 0);
	/* a late status for a forgotten room brings nothing back */
	len = ctrl_pd_encode_status(buf, sizeof(buf), 1, 42, 0, 0, 5, 0, NULL);
	ctrl_pd_decode_on_control(x.pd, buf, (size_t)len);
	assert_int_equal(ctrl_rooms_count(x.rooms), 0);
	x_pair_free(&x);
}

/*
 * A prefill rank that reports a room failed (its chain failed the prompt or
 * the pages: a worker died there): with compute_here the decode node
 * computes the prompt itself and its client gets the co-located tokens; the
 * room is given up (the rank told). Without, the room fails by issue #13's
 * rule, naming the rank's reason.
 */
static void a_room_a_prefill_rank_failed_is_computed_here_with_the_co_located_tokens(void **state)
{
	for (int here = 0; here <= 1; here++) {
		static struct rec got;
		struct x_pair x;
		struct ctrl_request rq;
		struct ctrl_pd_decode_stats dst;
		uint8_t buf[256];
		int len;

		(void)state;
		g_compute_here = here;
		x_pair_init(&x, 2, 0);
		g_compute_here = 0;
		memset(&got, 0, sizeof(got));
		request_of(&rq, 5);
		rq.cb = rec_cb;
		rq.cb_arg = &got;
		assert_true(ctrl_pd_decode_submit(x.pd, &rq, 77, 0, 1, 0) > 0);
		for (int k = 0; k < 20; k++) /* admitted: its manifest goes out; no prefill runs it */
			ctrl_sched_poll(x.ds);
		len = ctrl_pd_encode_status(buf, sizeof(buf), 77, 42, 0, 1, -1, 0,
					    "the stage chain failed this request's micro-batch");
		assert_true(len > 0);
		ctrl_pd_decode_on_control(x.pd, buf, (size_t)len);
		x_run(&x);
		ctrl_pd_decode_stats(x.pd, &dst);
		if (here) {
			if (got.finish != CTRL_FINISH_LENGTH)
				fail_msg("ended %s: %s", ctrl_finish_name(got.finish), got.msg);
			assert_int_equal(got.n, g_ref[5].n);
			assert_memory_equal(got.toks, g_ref[5].toks, sizeof(int32_t) * (size_t)g_ref[5].n);
			assert_int_equal(dst.computed_here, 1);
			assert_int_equal(dst.replayed_here, 1); /* its kv_lost */
			assert_int_equal(dst.rooms_failed, 0);
			assert_int_equal(dst.aborts_sent, 1);
		} else {
			assert_int_equal(got.finish, CTRL_FINISH_ERROR);
			assert_non_null(strstr(got.msg, "micro-batch"));
			assert_int_equal(dst.computed_here, 0);
			assert_int_equal(dst.rooms_failed, 1);
		}
		assert_int_equal(ctrl_rooms_count(x.rooms), 0);
		x_pair_free(&x);
	}
}

static void a_room_whose_ranks_reported_but_whose_pages_never_land_fails_after_the_landing_time(void **state)
{
	static struct rec got, pre;
	struct x_pair x;
	struct ctrl_request rq;
	struct ctrl_pd_decode_stats dst;
	struct ctrl_sched_stats st;

	(void)state;
	x_pair_init(&x, 1, 0);
	x.net.drop_pages = 1;
	memset(&got, 0, sizeof(got));
	memset(&pre, 0, sizeof(pre));
	request_of(&rq, 1);
	rq.cb = rec_cb;
	rq.cb_arg = &got;
	assert_true(ctrl_pd_decode_submit(x.pd, &rq, 5, 0, 1, 0) > 0);
	rq.cb_arg = &pre;
	assert_true(ctrl_pd_prefill_submit(x.pp, &rq, 5, 7) > 0);
	for (int k = 0; k < 2000; k++) {
		ctrl_sched_poll(x.ps);
		ctrl_sched_poll(x.ds);
		x_deliver(&x.net, x.pp, x.pd);
		ctrl_pd_decode_tick(x.pd, 1000);
	}
	assert_int_equal(got.done, 0); /* the status came, the pages did not: it waits */
	ctrl_pd_decode_tick(x.pd, 1000 + 31ull * 1000000000ull);
	for (int k = 0; k < 20; k++)
		ctrl_sched_poll(x.ds);
	assert_int_equal(got.finish, CTRL_FINISH_ERROR);
	assert_non_null(strstr(got.msg, "page streams did not land"));
	ctrl_pd_decode_stats(x.pd, &dst);
	assert_int_equal(dst.rooms_failed, 1);
	ctrl_sched_stats(x.ds, &st);
	assert_int_equal(st.blocks_in_use, 0);
	x_pair_free(&x);
}

/* Poll a pair whose pages are dropped (its rooms wait) @p n times at @p now. */
static void x_spin(struct x_pair *x, int n, uint64_t now)
{
	for (int k = 0; k < n; k++) {
		ctrl_sched_poll(x->ps);
		ctrl_sched_poll(x->ds);
		x_deliver(&x->net, x->pp, x->pd);
		ctrl_pd_decode_tick(x->pd, now);
	}
}

static void a_room_fails_at_once_when_its_prefill_nodes_dataplane_restarts_or_stays_silent_past_its_give_up(void **state)
{
	static struct rec a, b, pre;
	struct x_pair x;
	struct ctrl_request rq;
	struct ctrl_pd_decode_stats dst;
	struct ctrl_sched_stats st;

	(void)state;
	g_peer_known = 1;
	g_peer_epoch = 1001;
	g_peer_silent_ms = 0;
	x_pair_init(&x, 1, 0);
	g_peer_known = 0;
	x.net.drop_pages = 1; /* the pages never come: only the peer's fate ends the rooms */
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	request_of(&rq, 1);
	rq.cb = rec_cb;
	rq.cb_arg = &a;
	assert_true(ctrl_pd_decode_submit(x.pd, &rq, 5, 0, 1, 0) > 0);
	rq.cb_arg = &pre;
	assert_true(ctrl_pd_prefill_submit(x.pp, &rq, 5, 7) > 0);
	/* silent, but not for the give-up bound; the same epoch: it waits */
	g_peer_silent_ms = CTRL_PD_PEER_GONE_MS - 1;
	x_spin(&x, 2000, 1000);
	assert_int_equal(a.done, 0);
	/* the prefill node's dataplane restarted: a new epoch */
	g_peer_silent_ms = 0;
	g_peer_epoch = 2002;
	x_spin(&x, 20, 1000);
	assert_int_equal(a.finish, CTRL_FINISH_ERROR);
	assert_non_null(strstr(a.msg, "kvferry-dataplane restarted while the room was in flight"));
	/* a room opened under the new epoch is not failed by the old news... */
	request_of(&rq, 2);
	rq.cb = rec_cb;
	rq.cb_arg = &b;
	assert_true(ctrl_pd_decode_submit(x.pd, &rq, 6, 0, 1, 0) > 0);
	x_spin(&x, 2000, 1000);
	assert_int_equal(b.done, 0);
	/* ...but by its dataplane's silence past the give-up */
	g_peer_silent_ms = CTRL_PD_PEER_GONE_MS;
	x_spin(&x, 20, 1000);
	assert_int_equal(b.finish, CTRL_FINISH_ERROR);
	assert_non_null(strstr(b.msg, "has not been heard for 10.0 s"));
	ctrl_pd_decode_stats(x.pd, &dst);
	assert_int_equal(dst.rooms_failed, 2);
	assert_int_equal(dst.rooms_lost_dataplane, 2);
	ctrl_sched_stats(x.ds, &st);
	assert_int_equal(st.blocks_in_use, 0);
	/* the prefill end, its dataplane restarted, keeps a prompt whose
	 * manifest has not come (it may come over the new session) */
	request_of(&rq, 3);
	rq.cb = rec_cb;
	rq.cb_arg = &pre;
	assert_true(ctrl_pd_prefill_submit(x.pp, &rq, 9, 7) > 0);
	x_spin(&x, 2000, 1000);
	ctrl_sched_stats(x.ps, &st);
	assert_true(st.blocks_in_use > 0);
	assert_int_equal(ctrl_pd_prefill_fail_all(x.pp, "restarted"), 0);
	x_spin(&x, 200, 1000);
	ctrl_sched_stats(x.ps, &st);
	assert_true(st.blocks_in_use > 0);
	x_pair_free(&x);
}

static void a_room_lost_with_its_prefill_dataplanes_session_runs_again_in_a_fresh_room_token_for_token(void **state)
{
	static struct rec got, pre;
	struct x_pair x;
	struct ctrl_request rq;
	struct ctrl_pd_decode_stats dst;
	struct ctrl_sched_stats st;
	const int i = 3;

	(void)state;
	g_peer_known = g_retry = 1;
	g_peer_epoch = 1001;
	g_peer_silent_ms = 0;
	x_pair_init(&x, 2, 0);
	g_peer_known = g_retry = 0;
	g_retry_pp = x.pp;
	g_retry_req = i;
	memset(&got, 0, sizeof(got));
	memset(&g_retry_pre, 0, sizeof(g_retry_pre));
	x.net.drop_pages = 1; /* the first room's pages are lost with the session */
	request_of(&rq, i);
	rq.cb = rec_cb;
	rq.cb_arg = &got;
	assert_true(ctrl_pd_decode_submit(x.pd, &rq, 5, 0, 1, 0) > 0);
	rq.cb_arg = &pre;
	assert_true(ctrl_pd_prefill_submit(x.pp, &rq, 5, 7) > 0);
	x_spin(&x, 2000, 1000);
	assert_int_equal(got.done, 0);
	/* the prefill node's dataplane is back with a new epoch: room 1005 */
	x.net.drop_pages = 0;
	g_peer_epoch = 2002;
	x_run(&x);
	if (got.finish != CTRL_FINISH_LENGTH)
		fail_msg("the request ended %s: %s", ctrl_finish_name(got.finish), got.msg);
	assert_int_equal(got.n, g_ref[i].n);
	assert_memory_equal(got.toks, g_ref[i].toks, sizeof(int32_t) * (size_t)g_ref[i].n);
	assert_int_equal(g_retry_pre.n, 1); /* the fresh room's prompt made the first token */
	ctrl_pd_decode_stats(x.pd, &dst);
	assert_int_equal(dst.rooms_retried, 1);
	assert_int_equal(dst.rooms_failed, 0);
	assert_int_equal(dst.rooms_ok, 1);
	assert_int_equal(dst.manifests_sent, 2);
	assert_int_equal(ctrl_rooms_count(x.rooms), 0);
	ctrl_sched_poll(x.ps);
	ctrl_sched_stats(x.ps, &st);
	assert_int_equal(st.blocks_in_use, 0);
	ctrl_sched_stats(x.ds, &st);
	assert_int_equal(st.blocks_in_use, 0);
	/* once retried, a second loss fails it (max_retries 1) */
	memset(&got, 0, sizeof(got));
	x.net.drop_pages = 1;
	request_of(&rq, i);
	rq.cb = rec_cb;
	rq.cb_arg = &got;
	assert_true(ctrl_pd_decode_submit(x.pd, &rq, 6, 0, 1, 0) > 0);
	x_spin(&x, 2000, 1000);
	g_peer_epoch = 3003;
	x_spin(&x, 2000, 1000);
	g_peer_epoch = 4004;
	x_spin(&x, 50, 1000);
	assert_int_equal(got.finish, CTRL_FINISH_ERROR);
	assert_non_null(strstr(got.msg, "kvferry-dataplane restarted while the room was in flight"));
	ctrl_pd_decode_stats(x.pd, &dst);
	assert_int_equal(dst.rooms_retried, 2);
	x_pair_free(&x);
}

static void a_prefill_node_refuses_an_aborted_room_and_gives_back_kv_whose_manifest_never_comes(void **state)
{
	static struct rec pre[2];
	struct x_pair x;
	struct ctrl_request rq;
	struct ctrl_pd_prefill_stats pst;
	struct ctrl_sched_stats st;
	uint8_t buf[128];
	int len;
	struct timespec t;

	(void)state;
	x_pair_init(&x, 1, 0);
	memset(pre, 0, sizeof(pre));
	/* the decode node gave room 77 up before its prompt came */
	len = ctrl_pd_encode_abort(buf, sizeof(buf), 77, 42, 0, "the client went away");
	ctrl_pd_prefill_on_control(x.pp, 7, buf, (size_t)len);
	request_of(&rq, 0);
	rq.cb = rec_cb;
	rq.cb_arg = &pre[0];
	assert_int_equal(ctrl_pd_prefill_submit(x.pp, &rq, 77, 7), -ECANCELED);
	assert_int_equal(x.net.n_d, 1); /* the abort was acknowledged */
	/* room 88's manifest never comes: its KV is held, then given back */
	rq.cb_arg = &pre[1];
	assert_true(ctrl_pd_prefill_submit(x.pp, &rq, 88, 7) > 0);
	/* the chain's stages run on their own threads: wait by the clock (a
	 * loaded machine needs more polls), up to 20 s */
	clock_gettime(CLOCK_MONOTONIC, &t);
	for (struct timespec now = t; !pre[1].done && now.tv_sec - t.tv_sec < 20;
	     clock_gettime(CLOCK_MONOTONIC, &now))
		assert_true(ctrl_sched_poll(x.ps) >= 0);
	assert_int_equal(pre[1].finish, CTRL_FINISH_LENGTH);
	ctrl_sched_stats(x.ps, &st);
	assert_true(st.kv_held_blocks > 0);
	clock_gettime(CLOCK_MONOTONIC, &t);
	ctrl_pd_prefill_tick(x.pp, (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec);
	ctrl_pd_prefill_stats(x.pp, &pst);
	assert_int_equal(pst.expired, 0); /* not yet */
	ctrl_pd_prefill_tick(x.pp, (uint64_t)(t.tv_sec + 301) * 1000000000ull);
	ctrl_pd_prefill_stats(x.pp, &pst);
	assert_int_equal(pst.expired, 1);
	assert_int_equal(pst.refused_aborted, 1);
	assert_true(ctrl_sched_poll(x.ps) >= 0);
	ctrl_sched_stats(x.ps, &st);
	assert_int_equal(st.kv_held_blocks, 0);
	assert_int_equal(st.blocks_in_use, 0);
	x_pair_free(&x);
}

/*
 * A prefill node whose stages re-formed after computing a prompt (a worker
 * restarted: its pool may be empty) must not ship that prompt's pages: they
 * could be garbage. Its room fails instead, and the decode node computes the
 * prompt itself: the client still gets the co-located tokens.
 */
static void a_prefill_room_whose_stages_re_formed_after_its_kv_ships_nothing_and_is_computed_on_the_decode_node(
	void **state)
{
	static struct rec got, pre;
	struct x_pair x;
	struct ctrl_request rq;
	struct ctrl_pd_decode_stats dst;
	struct ctrl_pd_prefill_stats pst;
	struct timespec t;

	(void)state;
	g_compute_here = 1;
	g_kv_gen = 1;
	x_pair_init(&x, 2, 0);
	g_compute_here = 0;
	memset(&got, 0, sizeof(got));
	memset(&pre, 0, sizeof(pre));
	request_of(&rq, 3);
	rq.cb = rec_cb;
	rq.cb_arg = &got;
	assert_true(ctrl_pd_decode_submit(x.pd, &rq, 77, 0, 1, 0) > 0);
	rq.cb_arg = &pre;
	assert_true(ctrl_pd_prefill_submit(x.pp, &rq, 77, 7) > 0);
	/* the prompt computes on the prefill node (its manifest not delivered yet) */
	clock_gettime(CLOCK_MONOTONIC, &t);
	for (struct timespec now = t; !pre.done && now.tv_sec - t.tv_sec < 20; clock_gettime(CLOCK_MONOTONIC, &now))
		assert_true(ctrl_sched_poll(x.ps) >= 0);
	assert_true(pre.done);
	g_kv_gen = 2; /* then its stages re-form */
	x_run(&x);
	ctrl_pd_decode_stats(x.pd, &dst);
	ctrl_pd_prefill_stats(x.pp, &pst);
	if (got.finish != CTRL_FINISH_LENGTH)
		fail_msg("ended %s: %s", ctrl_finish_name(got.finish), got.msg);
	assert_int_equal(got.n, g_ref[3].n);
	assert_memory_equal(got.toks, g_ref[3].toks, sizeof(int32_t) * (size_t)g_ref[3].n);
	assert_int_equal(pst.kv_gone, 1);
	assert_int_equal(pst.pages_shipped, 0);
	assert_int_equal(x.net.ranges, 0);
	assert_int_equal(dst.computed_here, 1);
	assert_int_equal(dst.rooms_failed, 0);
	ctrl_sched_poll(x.ps);
	x_pair_free(&x);
	g_kv_gen = 0;
}

/*
 * A decode node that restarts forgets the rooms whose prompts it had
 * forwarded but whose manifests it had not sent: the prefill node, holding
 * their KV, learns it from the first message of the new session (every
 * message carries it) and gives that KV back at once, not after its hold
 * timeout; a late forward of the old session is refused.
 */
static void a_decode_nodes_new_session_gives_back_the_kv_its_old_session_left_waiting_for_a_manifest(void **state)
{
	static struct rec pre[2];
	uint8_t buf[256];
	uint32_t blk = 3;
	struct x_pair x;
	struct ctrl_request rq;
	struct ctrl_pd_prefill_stats pst;
	struct ctrl_sched_stats st;
	struct timespec t;
	int len;

	(void)state;
	x_pair_init(&x, 1, 0);
	memset(pre, 0, sizeof(pre));
	/* decode node 7 speaks with session 11 (an abort of a room never seen) */
	len = ctrl_pd_encode_abort(buf, sizeof(buf), 900, 11, 0, "the request ended");
	assert_true(len > 0);
	ctrl_pd_prefill_on_control(x.pp, 7, buf, (size_t)len);
	/* it forwarded two prompts, sent no manifest, and died */
	for (int i = 0; i < 2; i++) {
		request_of(&rq, i);
		rq.cb = rec_cb;
		rq.cb_arg = &pre[i];
		assert_true(ctrl_pd_prefill_submit_from(x.pp, &rq, 50u + (uint64_t)i, 7, 11) > 0);
	}
	clock_gettime(CLOCK_MONOTONIC, &t);
	for (struct timespec now = t; !(pre[0].done && pre[1].done) && now.tv_sec - t.tv_sec < 20;
	     clock_gettime(CLOCK_MONOTONIC, &now))
		assert_true(ctrl_sched_poll(x.ps) >= 0);
	ctrl_sched_stats(x.ps, &st);
	assert_true(st.kv_held_blocks > 0); /* their KV waits for manifests */
	/* a message of its new session (a manifest for a new room): the old rooms go */
	len = ctrl_pd_encode_manifest(buf, sizeof(buf), 60, 12, 0, 0, &blk, 1);
	assert_true(len > 0);
	ctrl_pd_prefill_on_control(x.pp, 7, buf, (size_t)len);
	assert_true(ctrl_sched_poll(x.ps) >= 0);
	ctrl_sched_stats(x.ps, &st);
	ctrl_pd_prefill_stats(x.pp, &pst);
	assert_int_equal(pst.orphaned, 2);
	assert_int_equal(st.kv_held_blocks, 0);
	/* a forward of the old session that comes late is refused */
	request_of(&rq, 2);
	rq.cb = rec_cb;
	rq.cb_arg = &pre[0];
	assert_int_equal(ctrl_pd_prefill_submit_from(x.pp, &rq, 52, 7, 11), -ECANCELED);
	/* another node's session, and the same session again, give up nothing */
	len = ctrl_pd_encode_manifest(buf, sizeof(buf), 61, 99, 0, 0, &blk, 1);
	ctrl_pd_prefill_on_control(x.pp, 8, buf, (size_t)len);
	ctrl_pd_prefill_on_control(x.pp, 7, buf, (size_t)ctrl_pd_encode_abort(buf, sizeof(buf), 902, 12, 0, "x"));
	ctrl_pd_prefill_stats(x.pp, &pst);
	assert_int_equal(pst.orphaned, 2);
	x_pair_free(&x);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(every_request_equals_its_solo_run_on_one_to_three_stages_with_and_without_speculation),
		cmocka_unit_test(a_cached_prefix_gives_every_request_its_solo_tokens_and_spares_its_positions),
		cmocka_unit_test(prompts_sharing_a_prefix_take_a_running_prompts_blocks_and_answer_as_without_the_cache),
		cmocka_unit_test(two_replicas_of_different_depth_give_every_request_its_solo_tokens),
		cmocka_unit_test(a_held_stage_computes_nothing_until_released_while_its_holder_exports_its_pages),
		cmocka_unit_test(a_held_prompt_pipelines_its_chunks_only_where_page_copies_need_not_wait_for_them),
		cmocka_unit_test(a_decode_nodes_new_session_gives_back_the_kv_its_old_session_left_waiting_for_a_manifest),
		cmocka_unit_test(uneven_layer_ranges_give_every_request_its_solo_tokens_and_ranges_that_do_not_tile_are_refused),
		cmocka_unit_test(top_logprobs_equal_the_log_softmax_of_the_solo_logits_best_first_with_each_requests_k),
		cmocka_unit_test(prompt_logprobs_are_the_log_softmax_of_the_prompt_logits_in_any_chunking_batching_and_cache),
		cmocka_unit_test(the_choices_of_a_request_compute_its_prompt_once_and_each_answers_as_alone),
		cmocka_unit_test(a_decode_node_continues_from_pages_another_chain_computed_token_for_token),
		cmocka_unit_test(a_prefill_nodes_cached_prefix_ships_the_same_pages_and_the_decode_node_answers_co_located),
		cmocka_unit_test(a_remote_request_that_ends_while_waiting_gives_its_blocks_back_and_a_late_ready_is_ignored),
		cmocka_unit_test(a_remote_requests_first_token_goes_out_before_its_pages_and_ready_does_not_send_it_again),
		cmocka_unit_test(a_remote_request_failed_before_admission_ends_at_once_with_the_error),
		cmocka_unit_test(a_remote_request_told_to_compute_here_streams_the_co_located_tokens),
		cmocka_unit_test(a_request_served_disaggregated_streams_the_co_located_tokens_in_either_arrival_order),
		cmocka_unit_test(a_lost_node_a_landing_without_a_first_token_and_garbage_each_end_only_their_own_request),
		cmocka_unit_test(a_prefill_node_refuses_an_aborted_room_and_gives_back_kv_whose_manifest_never_comes),
		cmocka_unit_test(a_room_a_prefill_rank_failed_is_computed_here_with_the_co_located_tokens),
		cmocka_unit_test(a_room_whose_ranks_reported_but_whose_pages_never_land_fails_after_the_landing_time),
		cmocka_unit_test(a_room_fails_at_once_when_its_prefill_nodes_dataplane_restarts_or_stays_silent_past_its_give_up),
		cmocka_unit_test(a_room_lost_with_its_prefill_dataplanes_session_runs_again_in_a_fresh_room_token_for_token),
		cmocka_unit_test(a_prefill_room_whose_stages_re_formed_after_its_kv_ships_nothing_and_is_computed_on_the_decode_node),
	};

	if (argc < 2) {
		fprintf(stderr, "usage: %s PATH-TO-kvferry-mkmodel\n", argv[0]);
		return 77;
	}
	g_mkmodel = argv[1];
	return cmocka_run_group_tests(tests, setup, teardown);
}
