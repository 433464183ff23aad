/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The kn_stage API: option and input checks shared by every backend, the host
 * block table, and dispatch through the backend vtable (kn_stage_impl.h).
 * It sits above the backends (kn_cpu.c, and cuda/engine.cu in the module
 * kvferry-cuda.so that kn_cuda_load.c opens), which build on the base in
 * kn_stage_base.c: no backend calls back into this file.
 * Doing the checks here, once, is what makes "a bad step is refused the same
 * way on CPU and CUDA" hold.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kn_err.h"
#include "kn_cuda_module.h"
#include "kn_stage_impl.h"

struct kn_stage *kn_stage_create(const struct kn_model *m, enum kn_backend be,
				 const struct kn_stage_opts *o, char *err, size_t errlen)
{
	struct kn_stage_opts d;
	if (!o) {
		kn_stage_opts_init(&d);
		o = &d;
	}
	if (!m) {
		kn_seterr(err, errlen, "kn_stage_create: no model");
		errno = EINVAL;
		return NULL;
	}
	const struct kn_model_config *c = kn_model_config(m);
	int32_t end = o->layer_end < 0 ? c->n_layers : o->layer_end;
	if (o->layer_start < 0 || o->layer_start >= end || end > c->n_layers) {
		kn_seterr(err, errlen, "kn_stage_create: layer range [%d, %d) is not inside the model's %d layers",
		     o->layer_start, end, c->n_layers);
		errno = EINVAL;
		return NULL;
	}
	if (o->n_slots < 1 || o->max_blocks_per_slot < 1 || o->n_plans < 1 || o->n_plans > KN_MAX_PLANS
	    || (o->n_blocks < 1 && o->n_blocks != -1)) {
		kn_seterr(err, errlen, "kn_stage_create: need n_slots >= 1 (got %d), max_blocks_per_slot >= 1 (got %d), 1..%d plans (got %d), n_blocks >= 1 or -1 (got %d)",
		     o->n_slots, o->max_blocks_per_slot, KN_MAX_PLANS, o->n_plans, o->n_blocks);
		errno = EINVAL;
		return NULL;
	}
	for (int i = 0; i < o->n_plans; i++)
		if (o->plan_widths[i] < 1 || (i && o->plan_widths[i] <= o->plan_widths[i - 1])) {
			kn_seterr(err, errlen, "kn_stage_create: plan widths must be >= 1 and strictly ascending (plan %d is %d)",
			     i, o->plan_widths[i]);
			errno = EINVAL;
			return NULL;
		}
	switch (be) {
	case KN_BACKEND_CPU:
		return kn_cpu_stage_create(m, o, err, errlen);
	case KN_BACKEND_CUDA: {
		/* the engine is a module of its own (kn_cuda_load.c) */
		const struct kn_cuda_module *cm = kn_cuda_module_get(o->cuda_module, err, errlen);
		return cm ? cm->stage_create(m, o, err, errlen) : NULL;
	}
	}
	kn_seterr(err, errlen, "kn_stage_create: unknown backend %d", (int)be);
	errno = EINVAL;
	return NULL;
}

void kn_stage_destroy(struct kn_stage *s)
{
	if (s)
		s->vt->destroy(s);
}

int kn_stage_info(const struct kn_stage *s, struct kn_stage_info *info)
{
	memset(info, 0, sizeof(*info));
	info->layer_start = s->opts.layer_start;
	info->layer_end = s->opts.layer_end;
	info->first = s->first;
	info->last = s->last;
	info->n_blocks = s->n_blocks;
	info->n_slots = s->opts.n_slots;
	info->max_blocks_per_slot = s->opts.max_blocks_per_slot;
	info->hidden_size = s->cfg->hidden_size;
	info->vocab_size = s->cfg->vocab_size;
	info->tp_size = s->opts.tp_size > 1 ? s->opts.tp_size : 1;
	info->tp_transport = info->tp_size > 1 ? "cpu" : ""; /* the CUDA engine's info says its own */
	info->tp_why = "";
	return s->vt->info ? s->vt->info(s, info) : 0;
}

int kn_stage_set_pool(struct kn_stage *s, int32_t n_blocks)
{
	if (n_blocks < 1) {
		kn_stage_seterr(s, "kn_stage_set_pool(%d): the pool needs at least one block", n_blocks);
		return -EINVAL;
	}
	if (s->n_inflight > 0) {
		kn_stage_seterr(s, "kn_stage_set_pool(%d): %d steps in flight: wait for them first", n_blocks,
				s->n_inflight);
		return -EBUSY;
	}
	int rc = s->vt->set_pool(s, n_blocks);
	if (rc)
		return rc;
	s->n_blocks = n_blocks;
	memset(s->table, 0xff, (size_t)s->opts.n_slots * (size_t)s->opts.max_blocks_per_slot * sizeof(*s->table));
	return 0;
}

int kn_stage_apply_ops(struct kn_stage *s, const struct kn_op *ops, size_t n)
{
	size_t i;
	int rc = 0;
	size_t row = (size_t)s->opts.max_blocks_per_slot;

	for (i = 0; i < n; i++) {
		const struct kn_op *op = &ops[i];
		if (op->slot < 0 || op->slot >= s->opts.n_slots) {
			kn_stage_seterr(s, "op %zu (type %u): slot %d is outside 0..%d", i, op->type, op->slot, s->opts.n_slots - 1);
			rc = -EINVAL;
			break;
		}
		int32_t *t = s->table + (size_t)op->slot * row;
		if (op->type == KN_OP_SET_BLOCK) {
			if (op->idx < 0 || op->idx >= s->opts.max_blocks_per_slot) {
				kn_stage_seterr(s, "op %zu SET_BLOCK: index %d is outside the slot's table row 0..%d", i, op->idx,
						s->opts.max_blocks_per_slot - 1);
				rc = -EINVAL;
				break;
			}
			if (op->val < -1 || op->val >= s->n_blocks) {
				kn_stage_seterr(s, "op %zu SET_BLOCK: block %d is outside the pool 0..%d (or -1 to clear)", i,
						op->val, s->n_blocks - 1);
				rc = -EINVAL;
				break;
			}
			t[op->idx] = op->val;
		} else if (op->type == KN_OP_ZERO_SLOT) {
			memset(t, 0xff, row * sizeof(*t));
		} else if (op->type == KN_OP_ROLLBACK) {
			if (op->val < 0) {
				kn_stage_seterr(s, "op %zu ROLLBACK: position %d is negative", i, op->val);
				rc = -EINVAL;
				break;
			}
			/* Pure attention: K/V past val is overwritten by the next step. */
		} else {
			kn_stage_seterr(s, "op %zu: unknown op type %u", i, op->type);
			rc = -EINVAL;
			break;
		}
	}
	if (s->vt->apply_ops && i > 0) {
		int r2 = s->vt->apply_ops(s, ops, i);
		if (!rc)
			rc = r2;
	}
	return rc;
}

static int check_step(struct kn_stage *s, struct kn_step *st)
{
	const struct kn_model_config *c = s->cfg;
	int32_t ctx = s->opts.max_blocks_per_slot * KN_PAGE_BLK;

	if (!st || st->n_cols < 1 || st->n_cols > s->max_plan || !st->cols) {
		kn_stage_seterr(s, "kn_stage_step: n_cols %d is outside 1..%d (the widest plan)", st ? st->n_cols : -1,
				s->max_plan);
		return -EINVAL;
	}
	if ((!s->first && !st->hidden_in) || (!s->last && !st->hidden_out) || (s->last && !st->tokens_out)
	    || st->n_logprobs < 0 || (st->n_logprobs > 0 && (!st->top_ids_out || !st->top_logprobs_out))) {
		kn_stage_seterr(s, "kn_stage_step: missing buffer (a non-first stage needs hidden_in, a non-last one hidden_out, the last tokens_out, logprobs need top_ids_out and top_logprobs_out)");
		return -EINVAL;
	}
	for (int32_t j = 0; j < st->n_cols; j++) {
		const struct kn_column *col = &st->cols[j];
		if (s->first && (col->token < 0 || col->token >= c->vocab_size)) {
			kn_stage_seterr(s, "column %d: token id %d is outside the vocabulary 0..%d", j, col->token,
					c->vocab_size - 1);
			return -EINVAL;
		}
		if (col->slot < 0 || col->slot >= s->opts.n_slots) {
			kn_stage_seterr(s, "column %d: slot %d is outside 0..%d", j, col->slot, s->opts.n_slots - 1);
			return -EINVAL;
		}
		if (col->pos < 0 || col->pos >= ctx || col->pos >= c->max_position) {
			kn_stage_seterr(s, "column %d: position %d is beyond the block table (%d positions per slot) or the model context (%d)",
					j, col->pos, ctx, c->max_position);
			return -EINVAL;
		}
		const int32_t *row = s->table + (size_t)col->slot * (size_t)s->opts.max_blocks_per_slot;
		for (int32_t b = 0; b <= col->pos / KN_PAGE_BLK; b++)
			if (row[b] < 0) {
				kn_stage_seterr(s, "column %d: slot %d position %d needs block index %d, which is not set (send SET_BLOCK first)",
						j, col->slot, col->pos, b);
				return -EINVAL;
			}
	}
	return 0;
}

int kn_stage_step_submit(struct kn_stage *s, struct kn_step *st)
{
	int rc;

	if (s->n_inflight >= KN_STEP_DEPTH) {
		kn_stage_seterr(s, "kn_stage_step_submit: %d steps already in flight (KN_STEP_DEPTH): wait for one first",
				s->n_inflight);
		return -EBUSY;
	}
	if ((rc = check_step(s, st)) < 0)
		return rc;
	if (s->vt->submit) {
		if ((rc = s->vt->submit(s, st)) < 0)
			return rc;
	} else {
		if ((rc = s->vt->step(s, st)) < 0)
			return rc;
		s->q_rc[(s->q_head + s->n_inflight) % KN_STEP_DEPTH] = 0;
	}
	s->n_inflight++;
	return 0;
}

int kn_stage_step_wait(struct kn_stage *s)
{
	int rc;

	if (s->n_inflight < 1) {
		kn_stage_seterr(s, "kn_stage_step_wait: no step in flight");
		return -EINVAL;
	}
	if (s->vt->wait) {
		rc = s->vt->wait(s);
	} else {
		rc = s->q_rc[s->q_head];
		s->q_head = (s->q_head + 1) % KN_STEP_DEPTH;
	}
	s->n_inflight--;
	return rc;
}

int kn_stage_step_ready(struct kn_stage *s)
{
	if (s->n_inflight < 1)
		return 0;
	return s->vt->ready ? s->vt->ready(s) : 1;
}

int kn_stage_step_inflight(const struct kn_stage *s)
{
	return s->n_inflight;
}

int kn_stage_step(struct kn_stage *s, struct kn_step *st)
{
	int rc;

	if (s->n_inflight > 0) {
		kn_stage_seterr(s, "kn_stage_step: %d submitted steps not waited for: call kn_stage_step_wait() first",
				s->n_inflight);
		return -EBUSY;
	}
	if ((rc = kn_stage_step_submit(s, st)) < 0)
		return rc;
	return kn_stage_step_wait(s);
}

int kn_stage_kv_format(const struct kn_stage *s, struct kn_kv_format *f)
{
	memset(f, 0, sizeof(*f));
	f->dtype = s->vt->kv_dtype;
	f->layer_start = s->opts.layer_start;
	f->layer_end = s->opts.layer_end;
	/* every KV head of the stage, also on a rank of a tensor-parallel
	 * stage, which moves its own heads' bytes of each page: pages travel
	 * between stages of any tp_size */
	f->n_kv_heads = s->cfg->n_kv_heads;
	f->head_dim = s->cfg->head_dim;
	f->block_bytes = (size_t)(f->layer_end - f->layer_start) * 2 * (size_t)f->n_kv_heads * KN_PAGE_BLK *
			 (size_t)f->head_dim * (f->dtype == KN_DT_F32 ? 4 : 2);
	return 0;
}

/* Block ids in the pool and a buffer long enough for n blocks of @p bytes. */
static int kv_check(struct kn_stage *s, const char *what, const int32_t *blocks, int32_t n, size_t len,
		    size_t bytes)
{
	if (n < 0 || (n > 0 && !blocks)) {
		kn_stage_seterr(s, "%s: %d blocks: need n >= 0 and a block list", what, n);
		return -EINVAL;
	}
	for (int32_t i = 0; i < n; i++)
		if (blocks[i] < 0 || blocks[i] >= s->n_blocks) {
			kn_stage_seterr(s, "%s: block %d (entry %d) is outside the pool 0..%d", what, blocks[i], i,
					s->n_blocks - 1);
			return -EINVAL;
		}
	if (len < (size_t)n * bytes) {
		kn_stage_seterr(s, "%s: buffer of %zu bytes is short of %d blocks x %zu bytes", what, len, n, bytes);
		return -EINVAL;
	}
	return 0;
}

int kn_stage_kv_check(struct kn_stage *s, const int32_t *blocks, int32_t n, size_t len,
		      const struct kn_kv_format *f)
{
	struct kn_kv_format me;

	kn_stage_kv_format(s, &me);
	if (f == NULL)
		return kv_check(s, "kn_stage_kv_export", blocks, n, len, me.block_bytes);
	if ((f->dtype != KN_DT_F32 && f->dtype != KN_DT_BF16) || f->layer_start != me.layer_start ||
	    f->layer_end != me.layer_end || f->n_kv_heads != me.n_kv_heads || f->head_dim != me.head_dim) {
		kn_stage_seterr(s,
				"kn_stage_kv_import: pages of layers [%d,%d), %d KV heads x head_dim %d, dtype %d do not fit this stage (layers [%d,%d), %d x %d, f32 or bf16); import into the stage that holds the same layers of the same model",
				f->layer_start, f->layer_end, f->n_kv_heads, f->head_dim, f->dtype, me.layer_start,
				me.layer_end, me.n_kv_heads, me.head_dim);
		return -EINVAL;
	}
	/* pages of the other dtype are converted: their bytes per block follow it */
	return kv_check(s, "kn_stage_kv_import", blocks, n, len,
			me.block_bytes / (me.dtype == KN_DT_F32 ? 4 : 2) * (f->dtype == KN_DT_F32 ? 4 : 2));
}

int kn_stage_kv_export(struct kn_stage *s, const int32_t *blocks, int32_t n, void *dst, size_t len)
{
	int rc = kn_stage_kv_check(s, blocks, n, len, NULL);

	return rc ? rc : n ? s->vt->kv_export(s, blocks, n, dst) : 0;
}

int kn_stage_kv_import(struct kn_stage *s, const int32_t *blocks, int32_t n, const void *src, size_t len,
		       const struct kn_kv_format *f)
{
	struct kn_kv_format me;
	int rc;

	if (f == NULL) {
		kn_stage_seterr(s, "kn_stage_kv_import: no page format given");
		return -EINVAL;
	}
	rc = kn_stage_kv_check(s, blocks, n, len, f);
	kn_stage_kv_format(s, &me);
	const size_t esz = f->dtype == KN_DT_F32 ? 4 : 2;
	const size_t in_bytes = me.block_bytes / (me.dtype == KN_DT_F32 ? 4 : 2) * esz;
	if (rc || n == 0)
		return rc;
	if (f->dtype == me.dtype)
		return s->vt->kv_import(s, blocks, n, src);
	/* convert to the pool's type first */
	const size_t elems = (size_t)n * in_bytes / esz;
	void *tmp = malloc(elems * (me.dtype == KN_DT_F32 ? 4 : 2));
	if (!tmp) {
		kn_stage_seterr(s, "kn_stage_kv_import: out of memory converting %d blocks", n);
		return -ENOMEM;
	}
	if (me.dtype == KN_DT_F32)
		for (size_t i = 0; i < elems; i++)
			((float *)tmp)[i] = kn_bf16_to_f32(((const uint16_t *)src)[i]);
	else
		for (size_t i = 0; i < elems; i++)
			((uint16_t *)tmp)[i] = kn_f32_to_bf16(((const float *)src)[i]);
	rc = s->vt->kv_import(s, blocks, n, tmp);
	free(tmp);
	return rc;
}

int kn_stage_kv_imports_segs(const struct kn_stage *s)
{
	return s->vt->kv_import_segs != NULL;
}

int kn_stage_kv_import_segs(struct kn_stage *s, const int32_t *blocks, int32_t n, const struct kn_seg *segs,
			    int32_t n_segs, size_t skip, size_t len, const struct kn_kv_format *f)
{
	struct kn_seg_cursor c = { .seg = segs, .n = n_segs };
	struct kn_kv_format me;
	size_t have = 0;
	void *tmp;
	int rc;

	if (f == NULL) {
		kn_stage_seterr(s, "kn_stage_kv_import_segs: no page format given");
		return -EINVAL;
	}
	for (int32_t i = 0; i < n_segs; i++)
		have += segs[i].len;
	if (n_segs < 0 || have < skip || have - skip < len) {
		kn_stage_seterr(s, "kn_stage_kv_import_segs: %d pieces hold %zu bytes; the pages need %zu after the "
				"first %zu", (int)n_segs, have, len, skip);
		return -EINVAL;
	}
	rc = kn_stage_kv_check(s, blocks, n, len, f);
	if (rc || n == 0)
		return rc;
	kn_stage_kv_format(s, &me);
	kn_seg_read(&c, NULL, skip);
	if (f->dtype == me.dtype && s->vt->kv_import_segs != NULL)
		return s->vt->kv_import_segs(s, blocks, n, &c);
	/* a backend that wants one buffer, or pages to convert: gather them */
	tmp = malloc(len);
	if (tmp == NULL) {
		kn_stage_seterr(s, "kn_stage_kv_import_segs: out of memory gathering %zu bytes", len);
		return -ENOMEM;
	}
	kn_seg_read(&c, tmp, len);
	rc = kn_stage_kv_import(s, blocks, n, tmp, len, f);
	free(tmp);
	return rc;
}

const char *kn_stage_error(const struct kn_stage *s)
{
	if (s->vt && s->vt->error)
		return s->vt->error(s);
	return s->err;
}
