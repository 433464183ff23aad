/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fake stage chain: a FIFO pipeline model with per-stage step costs and a
 * stand-in "model" whose output depends on each slot's whole history.
 *
 * Timing: stage s starts a micro-batch when both the previous stage has
 * finished it and stage s has finished the previous micro-batch; it is busy
 * for stage_ns[s] + col_ns * n_cols (n_cols padded to the narrowest of
 * plan_widths that holds it, when those are given). Completion times are computed at submit
 * (the pipeline is FIFO, so they are exact). With virtual_time each poll jumps
 * the clock to the earliest pending completion: the scheduler then costs zero
 * simulated time, which isolates what its policy (group count, packing) does
 * to occupancy.
 *
 * Model: hash[slot][pos] = mix(hash[slot][pos - 1], token). A column's token
 * is a function of hash[slot][pos], so a wrong token fed anywhere earlier, a
 * skipped position or a rollback that was not honoured changes the output.
 *
 * Checks (what a stage engine would refuse, plus scheduler invariants the
 * engine cannot see): ops in range; every column's block set and still owned
 * by its slot (a block reassigned to another slot and then used by its old
 * owner means the scheduler freed a live block); a slot's columns write
 * exactly its next position in submission order (pos == n_valid): a second
 * round of a slot in flight is taken only where it continues the first (a
 * pipelined prompt's next chunk; a decode sent twice writes a position again
 * and is refused).
 *
 * Lost slots (lose_at, lose_slots): what a stage restart does to the slots
 * whose KV it held. From that submission on, each column of a lost slot
 * fails alone (col_status -EPIPE, no K/V written, token -1) while the other
 * columns of its micro-batch are computed; a ZERO_SLOT of the slot cures it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrl_chain.h"
#include "kvf_clock.h"
#include "kvf_mix.h"

struct fake_group {
	int busy;
	uint64_t t_done;
	uint64_t step_ns;          /* the slowest stage's cost */
	int32_t n_cols;
	int32_t n_failed;
	int status;
	char err[CTRL_CHAIN_ERRLEN];
};

struct fake_chain {
	struct ctrl_chain base;
	struct ctrl_fake_chain_opts o;
	int32_t ctx;               /* positions per slot */
	uint64_t now;              /* virtual clock */
	uint64_t t_first, t_last;
	int started;
	uint64_t stage_free[CTRL_CHAIN_MAX_STAGES];
	struct ctrl_chain_stage_stats st[CTRL_CHAIN_MAX_STAGES];
	int64_t n_submits;
	int32_t *table;            /* [n_slots][max_blocks_per_slot] */
	int32_t *owner;            /* [n_blocks] slot whose row set it last, -1 */
	int32_t *n_valid;          /* [n_slots] */
	int32_t *slot_group;       /* [n_slots] group in flight, -1 */
	uint8_t *lost;             /* [n_slots] KV lost: columns fail until ZERO_SLOT */
	uint64_t *hash;            /* [n_slots][ctx] */
	struct fake_group *g;      /* [max_groups] */
	int32_t *g_slots;          /* [max_groups][max_cols] */
	int32_t *tokens;           /* [max_groups][max_cols] */
	float *lps;                /* [max_groups][max_cols] */
	int32_t *cst;              /* [max_groups][max_cols] column status */
	int32_t plan_used[8];       /* steps run in each plan */
};

/* splitmix64's step: the golden increment, then its finalizer */
static uint64_t mix64(uint64_t x)
{
	return kvf_mix64(x + KVF_MIX_GOLDEN);
}

void ctrl_fake_chain_opts_init(struct ctrl_fake_chain_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->n_stages = 2;
	for (int i = 0; i < CTRL_CHAIN_MAX_STAGES; i++)
		o->stage_ns[i] = 100000;
	o->col_ns = 0;
	o->virtual_time = 1;
	o->n_slots = 64;
	o->n_blocks = 1024;
	o->max_blocks_per_slot = 64;
	o->max_cols = 64;
	o->max_groups = 32;
	o->vocab_size = 64;
	o->fail_submit = -1;
	o->lose_at = -1;
}

static int fake_info(struct ctrl_chain *c, struct ctrl_chain_info *info)
{
	struct fake_chain *f = (struct fake_chain *)c;

	memset(info, 0, sizeof(*info));
	info->n_stages = f->o.n_stages;
	info->n_slots = f->o.n_slots;
	info->n_blocks = f->o.n_blocks;
	info->max_blocks_per_slot = f->o.max_blocks_per_slot;
	info->max_cols = f->o.max_cols;
	info->max_groups = f->o.max_groups;
	info->max_position = f->ctx;
	info->vocab_size = f->o.vocab_size;
	return 0;
}

static int fake_apply_ops(struct fake_chain *f, const struct kn_op *ops, int32_t n, char *err)
{
	int32_t mb = f->o.max_blocks_per_slot;

	for (int32_t i = 0; i < n; i++) {
		const struct kn_op *op = &ops[i];

		if (op->slot < 0 || op->slot >= f->o.n_slots)
			goto bad;
		switch (op->type) {
		case KN_OP_SET_BLOCK:
			if (op->idx < 0 || op->idx >= mb || op->val < -1 || op->val >= f->o.n_blocks)
				goto bad;
			f->table[(size_t)op->slot * (size_t)mb + (size_t)op->idx] = op->val;
			if (op->val >= 0)
				f->owner[op->val] = op->slot;
			break;
		case KN_OP_ZERO_SLOT:
			for (int32_t j = 0; j < mb; j++)
				f->table[(size_t)op->slot * (size_t)mb + (size_t)j] = -1;
			f->n_valid[op->slot] = 0;
			f->lost[op->slot] = 0;
			break;
		case KN_OP_ROLLBACK:
			if (op->val < 0)
				goto bad;
			if (f->n_valid[op->slot] > op->val)
				f->n_valid[op->slot] = op->val;
			break;
		default:
			goto bad;
		}
		continue;
bad:
		snprintf(err, CTRL_CHAIN_ERRLEN, "fake chain: op %d (type %u slot %d idx %d val %d) is invalid",
			 (int)i, op->type, op->slot, op->idx, op->val);
		return -EINVAL;
	}
	return 0;
}

/* Step the stand-in model over the columns; fills tokens/logprobs and the
 * column status (columns of lost slots fail alone). */
static int fake_step(struct fake_chain *f, uint32_t group, const struct kn_column *cols,
		     int32_t n, int32_t *tok, float *lp, int32_t *cst, int32_t *n_failed, char *err)
{
	int32_t mb = f->o.max_blocks_per_slot;

	*n_failed = 0;
	for (int32_t i = 0; i < n; i++) {
		const struct kn_column *c = &cols[i];
		int32_t blk;
		uint64_t h;

		cst[i] = 0;
		if (c->slot >= 0 && c->slot < f->o.n_slots && f->lost[c->slot]) {
			cst[i] = -EPIPE;
			f->g_slots[(size_t)group * (size_t)f->o.max_cols + (size_t)i] = -1;
			tok[i] = -1;
			lp[i] = 0.0f;
			if ((*n_failed)++ == 0)
				snprintf(err, CTRL_CHAIN_ERRLEN, "fake chain: slot %d lost its KV cache (stage "
					 "restart injected at submission %" PRId64 ")", c->slot, f->o.lose_at);
			continue;
		}
		if (c->slot < 0 || c->slot >= f->o.n_slots || c->pos < 0 || c->pos >= f->ctx
		    || c->token < 0 || c->token >= f->o.vocab_size) {
			snprintf(err, CTRL_CHAIN_ERRLEN, "fake chain: column %d (slot %d pos %d token %d) out of range",
				 (int)i, c->slot, c->pos, c->token);
			return -EINVAL;
		}
		/* (a slot may be in several groups in flight: a pipelined
		 * prompt's next chunk; the position check below still refuses
		 * any round that does not continue the one before it) */
		blk = f->table[(size_t)c->slot * (size_t)mb + (size_t)(c->pos / KN_PAGE_BLK)];
		if (blk < 0 || f->owner[blk] != c->slot) {
			snprintf(err, CTRL_CHAIN_ERRLEN,
				 "fake chain: column %d slot %d pos %d: block %d %s", (int)i, c->slot, c->pos,
				 blk, blk < 0 ? "unset" : "now belongs to another slot");
			return -EINVAL;
		}
		if (c->pos != f->n_valid[c->slot]) {
			snprintf(err, CTRL_CHAIN_ERRLEN,
				 "fake chain: column %d slot %d writes pos %d but the slot holds %d positions",
				 (int)i, c->slot, c->pos, f->n_valid[c->slot]);
			return -EINVAL;
		}
		f->slot_group[c->slot] = (int32_t)group;
		f->g_slots[(size_t)group * (size_t)f->o.max_cols + (size_t)i] = c->slot;
		h = mix64((c->pos > 0 ? f->hash[(size_t)c->slot * (size_t)f->ctx + (size_t)(c->pos - 1)] : 0x5eedull)
			  ^ (uint64_t)(uint32_t)c->token);
		f->hash[(size_t)c->slot * (size_t)f->ctx + (size_t)c->pos] = h;
		f->n_valid[c->slot] = c->pos + 1;
		tok[i] = -1;
		lp[i] = 0.0f;
		if (!(c->flags & KN_COL_NEED_LOGIT))
			continue;
		if (c->flags & KN_COL_FORCE)
			tok[i] = (int32_t)(c->seed % (uint32_t)f->o.vocab_size); /* a scored prompt token */
		else if (c->temperature > 0.0f)
			tok[i] = (int32_t)(mix64(h ^ c->seed) % (uint64_t)f->o.vocab_size);
		else if (((h >> 20) & 15u) == 0)
			tok[i] = (int32_t)((h >> 32) % (uint64_t)f->o.vocab_size);
		else
			tok[i] = (c->token + 1) % f->o.vocab_size;
		lp[i] = -(float)(h % 1000u) / 1000.0f;
	}
	return 0;
}

static int fake_submit(struct ctrl_chain *c, uint32_t group, const struct kn_column *cols,
		       int32_t n_cols, const struct kn_op *ops, int32_t n_ops)
{
	struct fake_chain *f = (struct fake_chain *)c;
	struct fake_group *g;
	uint64_t t;
	int64_t idx;
	int32_t padded = n_cols;
	uint64_t first = 0;

	if (group >= (uint32_t)f->o.max_groups || f->g[group].busy || n_cols < 1
	    || n_cols > f->o.max_cols || n_ops < 0)
		return -EINVAL;
	g = &f->g[group];
	idx = f->n_submits++;
	g->busy = 1;
	g->n_cols = n_cols;
	g->err[0] = '\0';
	g->n_failed = 0;
	if (idx == f->o.lose_at)
		for (int32_t k = 0; k < f->o.n_lose_slots && k < 8; k++)
			if (f->o.lose_slots[k] >= 0 && f->o.lose_slots[k] < f->o.n_slots)
				f->lost[f->o.lose_slots[k]] = 1;
	g->status = fake_apply_ops(f, ops, n_ops, g->err);
	if (g->status == 0)
		g->status = fake_step(f, group, cols, n_cols,
				      &f->tokens[(size_t)group * (size_t)f->o.max_cols],
				      &f->lps[(size_t)group * (size_t)f->o.max_cols],
				      &f->cst[(size_t)group * (size_t)f->o.max_cols], &g->n_failed, g->err);
	if (g->status == 0 && idx == f->o.fail_submit) {
		g->status = -EPIPE;
		snprintf(g->err, sizeof(g->err), "fake chain: stage %d died (injected at submission %" PRId64 ")",
			 f->o.n_stages - 1, idx);
	}
	if (g->status != 0) {
		/* A failed group leaves no in-flight marks behind. */
		for (int32_t s = 0; s < f->o.n_slots; s++)
			if (f->slot_group[s] == (int32_t)group)
				f->slot_group[s] = -1;
	}
	t = f->o.virtual_time ? f->now : kvf_mono_ns();
	if (!f->started) {
		f->started = 1;
		f->t_first = t;
	}
	t += f->o.link_ns;
	g->step_ns = 0;
	for (int32_t k = 0; k < f->o.n_plans && k < 8; k++)
		if (f->o.plan_widths[k] >= n_cols) {
			padded = f->o.plan_widths[k];
			first = f->plan_used[k] < (f->o.plan_first_steps > 0 ? f->o.plan_first_steps : 1)
				? f->o.plan_first_ns : 0;
			f->plan_used[k]++;
			break;
		}
	for (int32_t s = 0; s < f->o.n_stages; s++) {
		uint64_t cost = f->o.stage_ns[s] + f->o.col_ns * (uint64_t)padded + first;
		uint64_t start = t > f->stage_free[s] ? t : f->stage_free[s];

		if (cost > g->step_ns)
			g->step_ns = cost;
		t = start + cost;
		f->stage_free[s] = t;
		f->st[s].steps++;
		f->st[s].cols += (uint64_t)n_cols;
		f->st[s].busy_ns += cost;
	}
	g->t_done = t + f->o.link_ns;
	return 0;
}

static int fake_poll(struct ctrl_chain *c, struct ctrl_chain_result *out, int max)
{
	struct fake_chain *f = (struct fake_chain *)c;
	uint64_t now;
	int n = 0;

	if (f->o.virtual_time) {
		uint64_t tmin = UINT64_MAX;

		for (int32_t i = 0; i < f->o.max_groups; i++)
			if (f->g[i].busy && f->g[i].t_done < tmin)
				tmin = f->g[i].t_done;
		if (tmin == UINT64_MAX)
			return 0;
		if (tmin > f->now)
			f->now = tmin;
		now = f->now;
	} else {
		now = kvf_mono_ns();
	}
	while (n < max) {
		int32_t best = -1;

		for (int32_t i = 0; i < f->o.max_groups; i++)
			if (f->g[i].busy && f->g[i].t_done <= now
			    && (best < 0 || f->g[i].t_done < f->g[best].t_done))
				best = i;
		if (best < 0)
			break;
		struct fake_group *g = &f->g[best];
		struct ctrl_chain_result *r = &out[n++];

		g->busy = 0;
		if (g->t_done > f->t_last)
			f->t_last = g->t_done;
		r->group = (uint32_t)best;
		r->status = g->status;
		r->n_cols = g->n_cols;
		r->tokens = &f->tokens[(size_t)best * (size_t)f->o.max_cols];
		r->logprobs = &f->lps[(size_t)best * (size_t)f->o.max_cols];
		r->col_status = g->status == 0 && g->n_failed > 0
				? &f->cst[(size_t)best * (size_t)f->o.max_cols] : NULL;
		r->n_failed_cols = g->status == 0 ? g->n_failed : 0;
		r->step_ns = g->step_ns;
		memcpy(r->err, g->err, sizeof(r->err));
		if (g->status == 0)
			for (int32_t i = 0; i < g->n_cols; i++) {
				int32_t sl = f->g_slots[(size_t)best * (size_t)f->o.max_cols + (size_t)i];

				if (sl >= 0) /* -1: a lost slot's column, never marked */
					f->slot_group[sl] = -1;
			}
	}
	return n;
}

static int fake_stats(struct ctrl_chain *c, struct ctrl_chain_stats *st)
{
	struct fake_chain *f = (struct fake_chain *)c;

	memset(st, 0, sizeof(*st));
	st->n_stages = f->o.n_stages;
	st->elapsed_ns = f->started ? f->t_last - f->t_first : 0;
	memcpy(st->stage, f->st, sizeof(f->st));
	return 0;
}

static void fake_destroy(struct ctrl_chain *c)
{
	struct fake_chain *f = (struct fake_chain *)c;

	free(f->cst);
	free(f->lost);
	free(f->lps);
	free(f->tokens);
	free(f->g_slots);
	free(f->g);
	free(f->hash);
	free(f->slot_group);
	free(f->n_valid);
	free(f->owner);
	free(f->table);
	free(f);
}

static const struct ctrl_chain_vtbl fake_vtbl = {
	.name = "fake",
	.info = fake_info,
	.submit = fake_submit,
	.poll = fake_poll,
	.stats = fake_stats,
	.destroy = fake_destroy,
};

struct ctrl_chain *ctrl_fake_chain_create(const struct ctrl_fake_chain_opts *o)
{
	struct fake_chain *f;
	size_t ns, mg, mc;

	if (o == NULL || o->n_stages < 1 || o->n_stages > CTRL_CHAIN_MAX_STAGES || o->n_slots < 1
	    || o->n_blocks < 1 || o->max_blocks_per_slot < 1 || o->max_cols < 1
	    || o->max_groups < 1 || o->vocab_size < 2) {
		errno = EINVAL;
		return NULL;
	}
	f = calloc(1, sizeof(*f));
	if (f == NULL)
		goto fail;
	f->base.vt = &fake_vtbl;
	f->o = *o;
	f->ctx = o->max_blocks_per_slot * KN_PAGE_BLK;
	ns = (size_t)o->n_slots;
	mg = (size_t)o->max_groups;
	mc = (size_t)o->max_cols;
	f->table = malloc(sizeof(*f->table) * ns * (size_t)o->max_blocks_per_slot);
	f->owner = malloc(sizeof(*f->owner) * (size_t)o->n_blocks);
	f->n_valid = calloc(ns, sizeof(*f->n_valid));
	f->slot_group = malloc(sizeof(*f->slot_group) * ns);
	f->hash = calloc(ns * (size_t)f->ctx, sizeof(*f->hash));
	f->g = calloc(mg, sizeof(*f->g));
	f->g_slots = calloc(mg * mc, sizeof(*f->g_slots));
	f->tokens = calloc(mg * mc, sizeof(*f->tokens));
	f->lps = calloc(mg * mc, sizeof(*f->lps));
	f->cst = calloc(mg * mc, sizeof(*f->cst));
	f->lost = calloc(ns, sizeof(*f->lost));
	if (f->table == NULL || f->owner == NULL || f->n_valid == NULL || f->slot_group == NULL
	    || f->hash == NULL || f->g == NULL || f->g_slots == NULL || f->tokens == NULL
	    || f->lps == NULL || f->cst == NULL || f->lost == NULL)
		goto fail_arrays;
	memset(f->table, 0xff, sizeof(*f->table) * ns * (size_t)o->max_blocks_per_slot);
	memset(f->owner, 0xff, sizeof(*f->owner) * (size_t)o->n_blocks);
	memset(f->slot_group, 0xff, sizeof(*f->slot_group) * ns);
	return &f->base;

fail_arrays:
	fake_destroy(&f->base);
fail:
	errno = ENOMEM;
	return NULL;
}
