/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stage-chain dispatcher: every public ctrl_chain_* call goes through the
 * implementation's vtable. Kept out of line so the scheduler never depends on
 * which chain it drives.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chain_int.h"
#include "ctrl_chain.h"

int ctrl_chain_info(struct ctrl_chain *c, struct ctrl_chain_info *info)
{
	return c->vt->info(c, info);
}

int ctrl_chain_submit(struct ctrl_chain *c, uint32_t group, const struct kn_column *cols,
		      int32_t n_cols, const struct kn_op *ops, int32_t n_ops)
{
	return c->vt->submit(c, group, cols, n_cols, ops, n_ops);
}

int ctrl_chain_poll(struct ctrl_chain *c, struct ctrl_chain_result *out, int max)
{
	if (max > 0)
		memset(out, 0, sizeof(*out) * (size_t)max);
	return c->vt->poll(c, out, max);
}

int ctrl_chain_ready(struct ctrl_chain *c, char *why, size_t whylen)
{
	if (why != NULL && whylen > 0)
		why[0] = '\0';
	return c->vt->ready != NULL ? c->vt->ready(c, why, whylen) : 1;
}

int ctrl_chain_stats(struct ctrl_chain *c, struct ctrl_chain_stats *st)
{
	if (c->vt->stats == NULL)
		return -ENOTSUP;
	return c->vt->stats(c, st);
}

int ctrl_chain_kv_format(struct ctrl_chain *c, int32_t stage, struct kn_kv_format *f)
{
	return c->vt->kv_format != NULL ? c->vt->kv_format(c, stage, f) : -ENOTSUP;
}

int ctrl_chain_kv_export(struct ctrl_chain *c, int32_t stage, const int32_t *blocks, int32_t n, void *dst,
			 size_t len)
{
	return c->vt->kv_export != NULL ? c->vt->kv_export(c, stage, blocks, n, dst, len) : -ENOTSUP;
}

int ctrl_chain_kv_import(struct ctrl_chain *c, int32_t stage, const int32_t *blocks, int32_t n,
			 const void *src, size_t len, const struct kn_kv_format *f)
{
	return c->vt->kv_import != NULL ? c->vt->kv_import(c, stage, blocks, n, src, len, f) : -ENOTSUP;
}

int ctrl_chain_kv_hold(struct ctrl_chain *c, int32_t stage, int hold)
{
	return c->vt->kv_hold != NULL ? c->vt->kv_hold(c, stage, hold) : 0;
}

int ctrl_chain_kv_copies(struct ctrl_chain *c, int32_t stage, int import, const struct ctrl_kv_copy *v, int32_t n,
			 const struct kn_kv_format *f)
{
	int rc = 0;

	if (n < 0 || (n > 0 && v == NULL) || (import && f == NULL))
		return -EINVAL;
	if (n == 0)
		return 0;
	if (c->vt->kv_copies != NULL)
		return c->vt->kv_copies(c, stage, import, v, n, f);
	ctrl_chain_kv_hold(c, stage, 1);
	for (int32_t i = 0; i < n && rc == 0; i++)
		rc = import ? ctrl_chain_kv_import(c, stage, v[i].blocks, v[i].n, v[i].buf, v[i].len, f)
			    : ctrl_chain_kv_export(c, stage, v[i].blocks, v[i].n, v[i].buf, v[i].len);
	ctrl_chain_kv_hold(c, stage, 0);
	return rc;
}

int ctrl_chain_kv_rxroute(struct ctrl_chain *c, int32_t stage, uint32_t stream)
{
	return c->vt->kv_rxroute != NULL ? c->vt->kv_rxroute(c, stage, stream) : -ENOTSUP;
}

uint64_t ctrl_chain_kv_generation(struct ctrl_chain *c)
{
	return c->vt->kv_generation != NULL ? c->vt->kv_generation(c) : 0;
}

int ctrl_chain_kv_landed(struct ctrl_chain *c, int32_t stage, struct ctrl_kv_landing *out, int max)
{
	return c->vt->kv_landed != NULL ? c->vt->kv_landed(c, stage, out, max) : 0;
}

void ctrl_chain_destroy(struct ctrl_chain *c)
{
	if (c != NULL)
		c->vt->destroy(c);
}

int ctrl_chain_layers(int32_t n_layers, int32_t n, int32_t *ends, char *err, size_t errlen)
{
	if (n < 1 || n > CTRL_CHAIN_MAX_STAGES || n > n_layers) {
		snprintf(err, errlen, "%d stages for a %d-layer model: use 1..%d", n, n_layers,
			 n_layers < CTRL_CHAIN_MAX_STAGES ? n_layers : CTRL_CHAIN_MAX_STAGES);
		return -EINVAL;
	}
	if (ends[0] == 0) {
		for (int32_t k = 0; k < n; k++)
			ends[k] = (int32_t)((int64_t)n_layers * (k + 1) / n);
		return 0;
	}
	for (int32_t k = 0; k < n; k++) {
		int32_t start = k == 0 ? 0 : ends[k - 1];

		if (ends[k] <= start) {
			snprintf(err, errlen, "stage %d ends at layer %d, not after its start %d: ranges must "
				 "be consecutive and non-empty", k, ends[k], start);
			return -EINVAL;
		}
	}
	if (ends[n - 1] != n_layers) {
		snprintf(err, errlen, "the stages cover layers 0..%d but the model has %d layers: the last "
			 "range must end at %d", ends[n - 1], n_layers, n_layers);
		return -EINVAL;
	}
	return 0;
}

/* ---- the chains of kn_ stages (chain_int.h) ---- */

int32_t chain_widest_plan(const struct kn_stage_opts *so)
{
	int32_t w = 0;

	for (int32_t p = 0; p < so->n_plans; p++)
		if (so->plan_widths[p] > w)
			w = so->plan_widths[p];
	return w;
}

void chain_info_init(struct ctrl_chain_info *info, const struct kn_model_config *cfg,
		     const struct kn_stage_opts *so, int32_t n_stages, int32_t max_groups)
{
	info->n_stages = n_stages;
	info->n_slots = so->n_slots;
	info->max_blocks_per_slot = so->max_blocks_per_slot;
	info->max_cols = chain_widest_plan(so);
	info->max_groups = max_groups;
	info->max_position = cfg->max_position;
	info->vocab_size = cfg->vocab_size;
}

int chain_out_alloc(struct chain_out *o, int32_t max_cols)
{
	size_t n = (size_t)max_cols;

	o->tokens = calloc(n, sizeof(int32_t));
	o->lps = calloc(n, sizeof(float));
	o->cst = calloc(n, sizeof(int32_t));
	o->top_ids = calloc(n * CTRL_CHAIN_MAX_LOGPROBS, sizeof(int32_t));
	o->top_lps = calloc(n * CTRL_CHAIN_MAX_LOGPROBS, sizeof(float));
	if (o->tokens == NULL || o->lps == NULL || o->cst == NULL || o->top_ids == NULL || o->top_lps == NULL)
		return -ENOMEM;
	return 0;
}

void chain_out_free(struct chain_out *o)
{
	free(o->tokens);
	free(o->lps);
	free(o->cst);
	free(o->top_ids);
	free(o->top_lps);
}

void chain_out_start(struct chain_out *o, int32_t n_cols)
{
	o->status = 0;
	o->n_cols = n_cols;
	o->n_failed = 0;
	o->n_top = 0;
	o->step_ns = 0;
	o->err[0] = '\0';
}

void chain_out_fill(const struct chain_out *o, uint32_t group, struct ctrl_chain_result *r)
{
	int ok = o->status == 0;

	r->group = group;
	r->status = o->status;
	r->n_cols = o->n_cols;
	r->tokens = o->tokens;
	r->logprobs = o->lps;
	r->col_status = ok && o->n_failed > 0 ? o->cst : NULL;
	r->n_failed_cols = ok ? o->n_failed : 0;
	r->n_logprobs = ok ? o->n_top : 0;
	r->top_ids = o->top_ids;
	r->top_logprobs = o->top_lps;
	r->step_ns = ok ? o->step_ns : 0;
	memcpy(r->err, o->err, sizeof(r->err));
}
