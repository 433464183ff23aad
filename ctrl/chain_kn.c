/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The in-process stage chain: n kn_ stage engines over consecutive layer
 * ranges of one model (an even split, or any tiling the caller gives), in
 * this process. Threaded, each stage has its own
 * thread and a FIFO of group ids, so p stages work on p different
 * micro-batches at once; otherwise submit() runs every stage inline.
 *
 * Per-group buffers: columns, ops, two hidden-state buffers (stage i reads
 * hid[i % 2] and writes hid[(i + 1) % 2]), and the group's output
 * (chain_int.h): tokens, logprobs and the top logprobs ([n_cols][k], k the
 * most any column's KN_COL_TOPK asks for). A group is
 * at one stage at a time (one micro-batch per group in flight), so stages
 * never share a buffer at the same moment; the queue mutexes order the
 * hand-offs.
 *
 * Every stage applies every group's ops, even after an earlier stage failed
 * the group's step: all stages validate ops identically, so their block
 * tables stay identical whatever failed.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chain_int.h"
#include "ctrl_chain.h"
#include "kvf_clock.h"

struct kn_grp {
	int busy;
	int32_t n_ops, ops_cap;
	struct kn_column *cols;
	struct kn_op *ops;
	float *hid[2];
	_Atomic uint64_t step_ns;  /* the slowest stage's step time (out.step_ns once polled) */
	struct chain_out out;      /* out.n_top: k of the last step; no column fails alone */
};

struct kn_chain;

struct kn_stg {
	struct kn_chain *c;
	int idx;
	struct kn_stage *st;
	struct kn_stage_info info;
	pthread_t th;
	int started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint32_t *q;               /* ring of group ids [max_groups] */
	int32_t q_head, q_n;
	int stop;
	_Atomic uint64_t steps, cols, busy_ns;
	pthread_mutex_t step_mu;   /* held over a step, a page export or an import (recursive: kv_hold) */
	_Atomic int kv_want;       /* page calls waiting for step_mu: the stage lets them in first */
};

struct kn_chain {
	struct ctrl_chain base;
	struct ctrl_kn_chain_opts o;
	const struct kn_model *m;
	int32_t n_stages, max_cols, hidden;
	struct ctrl_chain_info info;
	struct kn_grp *g;
	struct kn_stg *stg;
	pthread_mutex_t done_mu;
	uint32_t *done;            /* ring [max_groups] */
	int32_t done_head, done_n;
	uint64_t t_first, t_last;
	int started;
};

void ctrl_kn_chain_opts_init(struct ctrl_kn_chain_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->n_stages = 1;
	kn_stage_opts_init(&o->stage);
	o->backend = KN_BACKEND_CPU;
	o->threaded = 1;
	o->max_groups = 32;
}

/* Run stage @p k of group @p gi (on the stage's thread, or inline). */
static void stage_run(struct kn_chain *c, int32_t k, uint32_t gi)
{
	struct kn_stg *s = &c->stg[k];
	struct kn_grp *g = &c->g[gi];
	uint64_t t0 = kvf_mono_ns();
	int rc = kn_stage_apply_ops(s->st, g->ops, (size_t)g->n_ops);

	if (rc < 0 && g->out.status == 0) {
		g->out.status = rc;
		snprintf(g->out.err, sizeof(g->out.err), "stage %d (layers %d..%d): kn_stage_apply_ops: %s", k,
			 s->info.layer_start, s->info.layer_end, kn_stage_error(s->st));
	}
	if (g->out.status == 0) {
		int32_t k_top = 0;

		for (int32_t i = 0; s->info.last && i < g->out.n_cols; i++)
			if ((g->cols[i].flags & KN_COL_NEED_LOGIT) && KN_COL_TOPK(g->cols[i].flags) > k_top)
				k_top = KN_COL_TOPK(g->cols[i].flags);
		if (k_top > CTRL_CHAIN_MAX_LOGPROBS)
			k_top = CTRL_CHAIN_MAX_LOGPROBS;
		g->out.n_top = k_top;

		struct kn_step st = {
			.n_cols = g->out.n_cols,
			.cols = g->cols,
			.hidden_in = s->info.first ? NULL : g->hid[k % 2],
			.hidden_out = s->info.last ? NULL : g->hid[(k + 1) % 2],
			.tokens_out = s->info.last ? g->out.tokens : NULL,
			.token_logprob_out = s->info.last ? g->out.lps : NULL,
			.n_logprobs = k_top,
			.top_ids_out = k_top > 0 ? g->out.top_ids : NULL,
			.top_logprobs_out = k_top > 0 ? g->out.top_lps : NULL,
		};

		rc = kn_stage_step(s->st, &st);
		if (rc < 0) {
			g->out.status = rc;
			snprintf(g->out.err, sizeof(g->out.err), "stage %d (layers %d..%d): kn_stage_step: %s", k,
				 s->info.layer_start, s->info.layer_end, kn_stage_error(s->st));
		}
	}
	atomic_fetch_add_explicit(&s->steps, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&s->cols, (uint64_t)g->out.n_cols, memory_order_relaxed);
	t0 = kvf_mono_ns() - t0;
	atomic_fetch_add_explicit(&s->busy_ns, t0, memory_order_relaxed);
	if (t0 > atomic_load_explicit(&g->step_ns, memory_order_relaxed))
		atomic_store_explicit(&g->step_ns, t0, memory_order_relaxed);
}

static void push(pthread_mutex_t *mu, pthread_cond_t *cv, uint32_t *ring, int32_t *head, int32_t *n,
		 int32_t cap, uint32_t gi)
{
	pthread_mutex_lock(mu);
	ring[(*head + *n) % cap] = gi;
	(*n)++;
	if (cv != NULL)
		pthread_cond_signal(cv);
	pthread_mutex_unlock(mu);
}

static void finish_group(struct kn_chain *c, uint32_t gi)
{
	pthread_mutex_lock(&c->done_mu);
	c->t_last = kvf_mono_ns();
	c->done[(c->done_head + c->done_n) % c->o.max_groups] = gi;
	c->done_n++;
	pthread_mutex_unlock(&c->done_mu);
}

static void *stage_thread(void *arg)
{
	struct kn_stg *s = arg;
	struct kn_chain *c = s->c;

	for (;;) {
		uint32_t gi;

		pthread_mutex_lock(&s->mu);
		while (s->q_n == 0 && !s->stop)
			pthread_cond_wait(&s->cv, &s->mu);
		if (s->q_n == 0) {
			pthread_mutex_unlock(&s->mu);
			return NULL;
		}
		gi = s->q[s->q_head];
		s->q_head = (s->q_head + 1) % c->o.max_groups;
		s->q_n--;
		pthread_mutex_unlock(&s->mu);
		/* a mutex is not fair: a stage with groups queued back to back
		 * would take step_mu again at once and keep a page export out
		 * until the prompts were done (measured: a prefill node's pages
		 * left only after its last chunk, not chunk by chunk) */
		while (atomic_load_explicit(&s->kv_want, memory_order_acquire) > 0)
			sched_yield();
		pthread_mutex_lock(&s->step_mu);
		stage_run(c, s->idx, gi);
		pthread_mutex_unlock(&s->step_mu);
		if (s->idx + 1 < c->n_stages) {
			struct kn_stg *nx = &c->stg[s->idx + 1];

			push(&nx->mu, &nx->cv, nx->q, &nx->q_head, &nx->q_n, c->o.max_groups, gi);
		} else {
			finish_group(c, gi);
		}
	}
}

static int kc_info(struct ctrl_chain *cc, struct ctrl_chain_info *info)
{
	*info = ((struct kn_chain *)cc)->info;
	return 0;
}

static int kc_submit(struct ctrl_chain *cc, uint32_t group, const struct kn_column *cols,
		     int32_t n_cols, const struct kn_op *ops, int32_t n_ops)
{
	struct kn_chain *c = (struct kn_chain *)cc;
	struct kn_grp *g;

	if (group >= (uint32_t)c->o.max_groups || c->g[group].busy || n_cols < 1
	    || n_cols > c->max_cols || n_ops < 0)
		return -EINVAL;
	g = &c->g[group];
	if (n_ops > g->ops_cap) {
		struct kn_op *p = realloc(g->ops, sizeof(*p) * (size_t)n_ops);

		if (p == NULL)
			return -ENOMEM;
		g->ops = p;
		g->ops_cap = n_ops;
	}
	memcpy(g->cols, cols, sizeof(*cols) * (size_t)n_cols);
	if (n_ops > 0)
		memcpy(g->ops, ops, sizeof(*ops) * (size_t)n_ops);
	chain_out_start(&g->out, n_cols);
	g->n_ops = n_ops;
	atomic_store_explicit(&g->step_ns, 0, memory_order_relaxed);
	g->busy = 1;
	if (!c->started) {
		c->started = 1;
		c->t_first = kvf_mono_ns();
	}
	if (c->o.threaded) {
		struct kn_stg *s0 = &c->stg[0];

		push(&s0->mu, &s0->cv, s0->q, &s0->q_head, &s0->q_n, c->o.max_groups, group);
	} else {
		for (int32_t k = 0; k < c->n_stages; k++) {
			pthread_mutex_lock(&c->stg[k].step_mu);
			stage_run(c, k, group);
			pthread_mutex_unlock(&c->stg[k].step_mu);
		}
		finish_group(c, group);
	}
	return 0;
}

static int kc_poll(struct ctrl_chain *cc, struct ctrl_chain_result *out, int max)
{
	struct kn_chain *c = (struct kn_chain *)cc;
	int n = 0;

	pthread_mutex_lock(&c->done_mu);
	while (n < max && c->done_n > 0) {
		uint32_t gi = c->done[c->done_head];
		struct kn_grp *g = &c->g[gi];
		struct ctrl_chain_result *r = &out[n++];

		c->done_head = (c->done_head + 1) % c->o.max_groups;
		c->done_n--;
		g->busy = 0;
		g->out.step_ns = atomic_load_explicit(&g->step_ns, memory_order_relaxed);
		chain_out_fill(&g->out, gi, r);
	}
	pthread_mutex_unlock(&c->done_mu);
	return n;
}

/* ---- KV pages out and in (between two of the stage's steps) ---- */

static int kc_kv_format(struct ctrl_chain *cc, int32_t stage, struct kn_kv_format *f)
{
	struct kn_chain *c = (struct kn_chain *)cc;

	if (stage < 0 || stage >= c->n_stages)
		return -EINVAL;
	return kn_stage_kv_format(c->stg[stage].st, f);
}

static int kc_kv_export(struct ctrl_chain *cc, int32_t stage, const int32_t *blocks, int32_t n, void *dst,
			size_t len)
{
	struct kn_chain *c = (struct kn_chain *)cc;
	int rc;

	if (stage < 0 || stage >= c->n_stages)
		return -EINVAL;
	atomic_fetch_add_explicit(&c->stg[stage].kv_want, 1, memory_order_acq_rel);
	pthread_mutex_lock(&c->stg[stage].step_mu);
	rc = kn_stage_kv_export(c->stg[stage].st, blocks, n, dst, len);
	pthread_mutex_unlock(&c->stg[stage].step_mu);
	atomic_fetch_sub_explicit(&c->stg[stage].kv_want, 1, memory_order_acq_rel);
	return rc;
}

static int kc_kv_import(struct ctrl_chain *cc, int32_t stage, const int32_t *blocks, int32_t n,
			const void *src, size_t len, const struct kn_kv_format *f)
{
	struct kn_chain *c = (struct kn_chain *)cc;
	int rc;

	if (stage < 0 || stage >= c->n_stages)
		return -EINVAL;
	atomic_fetch_add_explicit(&c->stg[stage].kv_want, 1, memory_order_acq_rel);
	pthread_mutex_lock(&c->stg[stage].step_mu);
	rc = kn_stage_kv_import(c->stg[stage].st, blocks, n, src, len, f);
	pthread_mutex_unlock(&c->stg[stage].step_mu);
	atomic_fetch_sub_explicit(&c->stg[stage].kv_want, 1, memory_order_acq_rel);
	return rc;
}

/* The holder's page calls then take step_mu again (it is recursive). */
static int kc_kv_hold(struct ctrl_chain *cc, int32_t stage, int hold)
{
	struct kn_chain *c = (struct kn_chain *)cc;

	if (stage < 0 || stage >= c->n_stages)
		return -EINVAL;
	if (hold) {
		atomic_fetch_add_explicit(&c->stg[stage].kv_want, 1, memory_order_acq_rel);
		pthread_mutex_lock(&c->stg[stage].step_mu);
		atomic_fetch_sub_explicit(&c->stg[stage].kv_want, 1, memory_order_acq_rel);
	} else {
		pthread_mutex_unlock(&c->stg[stage].step_mu);
	}
	return 0;
}

static int kc_stats(struct ctrl_chain *cc, struct ctrl_chain_stats *st)
{
	struct kn_chain *c = (struct kn_chain *)cc;

	memset(st, 0, sizeof(*st));
	st->n_stages = c->n_stages;
	pthread_mutex_lock(&c->done_mu);
	st->elapsed_ns = c->started && c->t_last > c->t_first ? c->t_last - c->t_first : 0;
	pthread_mutex_unlock(&c->done_mu);
	for (int32_t k = 0; k < c->n_stages; k++) {
		st->stage[k].steps = atomic_load_explicit(&c->stg[k].steps, memory_order_relaxed);
		st->stage[k].cols = atomic_load_explicit(&c->stg[k].cols, memory_order_relaxed);
		st->stage[k].busy_ns = atomic_load_explicit(&c->stg[k].busy_ns, memory_order_relaxed);
	}
	return 0;
}

static void kc_destroy(struct ctrl_chain *cc)
{
	struct kn_chain *c = (struct kn_chain *)cc;

	if (c->stg != NULL) {
		for (int32_t k = 0; k < c->n_stages; k++) {
			struct kn_stg *s = &c->stg[k];

			if (s->started) {
				pthread_mutex_lock(&s->mu);
				s->stop = 1;
				pthread_cond_signal(&s->cv);
				pthread_mutex_unlock(&s->mu);
				pthread_join(s->th, NULL);
			}
		}
		for (int32_t k = 0; k < c->n_stages; k++) {
			struct kn_stg *s = &c->stg[k];

			kn_stage_destroy(s->st);
			free(s->q);
			pthread_cond_destroy(&s->cv);
			pthread_mutex_destroy(&s->mu);
			pthread_mutex_destroy(&s->step_mu);
		}
	}
	if (c->g != NULL)
		for (int32_t i = 0; i < c->o.max_groups; i++) {
			struct kn_grp *g = &c->g[i];

			free(g->cols);
			free(g->ops);
			free(g->hid[0]);
			free(g->hid[1]);
			chain_out_free(&g->out);
		}
	pthread_mutex_destroy(&c->done_mu);
	free(c->done);
	free(c->g);
	free(c->stg);
	free(c);
}

static const struct ctrl_chain_vtbl kn_chain_vtbl = {
	.name = "kn-inprocess",
	.info = kc_info,
	.submit = kc_submit,
	.poll = kc_poll,
	.stats = kc_stats,
	.destroy = kc_destroy,
	.kv_format = kc_kv_format,
	.kv_export = kc_kv_export,
	.kv_import = kc_kv_import,
	.kv_hold = kc_kv_hold,
};

struct ctrl_chain *ctrl_kn_chain_create(const struct kn_model *m, const struct ctrl_kn_chain_opts *o,
					char *err, size_t errlen)
{
	const struct kn_model_config *cfg;
	struct kn_chain *c;
	int32_t n_layers, ends[CTRL_CHAIN_MAX_STAGES];
	char msg[192];
	pthread_mutexattr_t ma;
	int e = ENOMEM;

	if (m == NULL || o == NULL || o->max_groups < 1) {
		snprintf(err, errlen, "ctrl_kn_chain_create: a model and options with max_groups >= 1 are required");
		errno = EINVAL;
		return NULL;
	}
	cfg = kn_model_config(m);
	n_layers = cfg->n_layers;
	memcpy(ends, o->layer_ends, sizeof(ends));
	if (ctrl_chain_layers(n_layers, o->n_stages, ends, msg, sizeof(msg)) < 0) {
		snprintf(err, errlen, "ctrl_kn_chain_create: %s", msg);
		errno = EINVAL;
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		goto fail_nomem;
	c->base.vt = &kn_chain_vtbl;
	c->o = *o;
	c->m = m;
	c->n_stages = o->n_stages;
	if (pthread_mutex_init(&c->done_mu, NULL) != 0) {
		free(c);
		goto fail_nomem;
	}
	c->stg = calloc((size_t)c->n_stages, sizeof(*c->stg));
	c->g = calloc((size_t)o->max_groups, sizeof(*c->g));
	c->done = calloc((size_t)o->max_groups, sizeof(*c->done));
	if (c->stg == NULL || c->g == NULL || c->done == NULL)
		goto fail_chain_nomem;
	/* Stages first, so a failure names the stage before any thread starts. */
	for (int32_t k = 0; k < c->n_stages; k++) {
		struct kn_stg *s = &c->stg[k];
		struct kn_stage_opts so = o->stage;

		s->c = c;
		s->idx = k;
		so.layer_start = k == 0 ? 0 : ends[k - 1];
		so.layer_end = ends[k];
		pthread_mutex_init(&s->mu, NULL);
		pthread_cond_init(&s->cv, NULL);
		pthread_mutexattr_init(&ma);
		pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
		pthread_mutex_init(&s->step_mu, &ma);
		pthread_mutexattr_destroy(&ma);
		s->q = calloc((size_t)o->max_groups, sizeof(*s->q));
		if (s->q == NULL)
			goto fail_chain_nomem;
		s->st = kn_stage_create(m, o->backend, &so, err, errlen);
		if (s->st == NULL) {
			e = errno;
			goto fail_chain;
		}
		kn_stage_info(s->st, &s->info);
	}
	c->hidden = c->stg[0].info.hidden_size;
	c->max_cols = chain_widest_plan(&o->stage);
	chain_info_init(&c->info, cfg, &o->stage, c->n_stages, o->max_groups);
	c->info.n_blocks = c->stg[0].info.n_blocks;
	for (int32_t k = 1; k < c->n_stages; k++)
		if (c->stg[k].info.n_blocks < c->info.n_blocks)
			c->info.n_blocks = c->stg[k].info.n_blocks;
	for (int32_t i = 0; i < o->max_groups; i++) {
		struct kn_grp *g = &c->g[i];
		size_t hb = sizeof(float) * (size_t)c->max_cols * (size_t)c->hidden;

		g->cols = malloc(sizeof(*g->cols) * (size_t)c->max_cols);
		g->ops_cap = 4 * c->max_cols + 16;
		g->ops = malloc(sizeof(*g->ops) * (size_t)g->ops_cap);
		g->hid[0] = malloc(hb);
		g->hid[1] = malloc(hb);
		if (chain_out_alloc(&g->out, c->max_cols) < 0 || g->cols == NULL || g->ops == NULL
		    || g->hid[0] == NULL || g->hid[1] == NULL)
			goto fail_chain_nomem;
	}
	if (o->threaded) {
		for (int32_t k = 0; k < c->n_stages; k++) {
			struct kn_stg *s = &c->stg[k];
			int rc = pthread_create(&s->th, NULL, stage_thread, s);

			if (rc != 0) {
				snprintf(err, errlen, "ctrl_kn_chain_create: pthread_create for stage %d failed: %s",
					 k, strerror(rc));
				e = rc;
				goto fail_chain;
			}
			s->started = 1;
			char name[16];
			snprintf(name, sizeof(name), "cpu-stage%d", (int)(k % 1000));
			pthread_setname_np(s->th, name);
		}
	}
	return &c->base;

fail_chain_nomem:
	snprintf(err, errlen, "ctrl_kn_chain_create: out of memory for %d stages, %d groups",
		 c->n_stages, o->max_groups);
	e = ENOMEM;
fail_chain:
	kc_destroy(&c->base);
	errno = e;
	return NULL;
fail_nomem:
	snprintf(err, errlen, "ctrl_kn_chain_create: out of memory");
	errno = ENOMEM;
	return NULL;
}
