/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Packing a micro-batch: which sequences ride in the next launch and with
 * which columns and ops (ctrl/SCHED.md "Packing", "One launch for every
 * decode", "A time budget for prompts beside decodes"). Decode spans go
 * first from a rotating cursor (with prompt-lookup drafts on greedy
 * requests), prompt chunks fill the rest from their own cursor; a slot's
 * ZERO_SLOT, ROLLBACK and SET_BLOCK ops ride with its columns.
 */
#include <errno.h>
#include <string.h>

#include "ctrl_sched.h"
#include "sched_int.h"
#include "shm_blkpool.h"

static int32_t min32(int32_t a, int32_t b)
{
	return a < b ? a : b;
}

/*
 * Prompt lookup: the continuation of the most recent earlier occurrence of
 * the longest suffix n-gram of t[0..n). @return the draft length (0..dmax).
 */
static int32_t prompt_lookup(const struct ctrl_sched *s, const int32_t *t, int32_t n, int32_t dmax,
			     int32_t *out)
{
	int32_t lo = n > s->o.spec_window ? n - s->o.spec_window : 0;

	for (int32_t ng = min32(s->o.spec_ngram_max, n - 1); ng >= s->o.spec_ngram_min; ng--) {
		const int32_t *suf = t + n - ng;

		for (int32_t i = n - ng - 1; i >= lo; i--) {
			int32_t len;

			if (t[i] != suf[0] || memcmp(t + i, suf, sizeof(int32_t) * (size_t)ng) != 0)
				continue;
			len = min32(dmax, n - (i + ng));
			memcpy(out, t + i + ng, sizeof(int32_t) * (size_t)len);
			return len;
		}
	}
	return 0;
}

/* Emit the slot's pending ops and grow its row to cover @p pos_max. */
static int slot_prepare(struct ctrl_sched *s, struct sched_group *g, int32_t i, int32_t pos_max)
{
	struct sched_slot *sl = &s->slots[i];
	int32_t need = pos_max / KN_PAGE_BLK + 1;

	/* a kv_remote prompt's row can be long: it waits for a launch with room */
	if (g->n_ops + 2 + (need > sl->n_blk ? need : sl->n_blk) - sl->n_set > s->ops_cap)
		return -ENOSPC;
	if (sl->fresh) {
		g->ops[g->n_ops++] = (struct kn_op){ .type = KN_OP_ZERO_SLOT, .slot = i };
		sl->fresh = 0;
	}
	if (sl->rollback_to >= 0) {
		g->ops[g->n_ops++] = (struct kn_op){
			.type = KN_OP_ROLLBACK, .slot = i, .idx = 0, .val = sl->rollback_to };
		sl->rollback_to = -1;
	}
	if (need > sl->n_blk) {
		int rc = sched_blk_alloc(s, need - sl->n_blk, sl->blk + sl->n_blk);

		if (rc < 0)
			return rc; /* cannot happen while admission holds its invariant */
		sl->n_blk = need;
	}
	/* blocks taken earlier (a kv_remote prompt's) get their row entries
	 * with the slot's first columns too */
	for (; sl->n_set < sl->n_blk; sl->n_set++)
		g->ops[g->n_ops++] = (struct kn_op){
			.type = KN_OP_SET_BLOCK, .slot = i, .idx = sl->n_set, .val = sl->blk[sl->n_set] };
	return 0;
}

static void fill_col(struct kn_column *c, const struct sched_req *r, int32_t slot, int32_t pos,
		     int32_t tok, uint32_t flags)
{
	c->token = tok;
	c->pos = pos;
	c->slot = slot;
	c->flags = flags;
	if (flags & KN_COL_NEED_LOGIT)
		c->flags |= ((uint32_t)r->n_logprobs << KN_COL_TOPK_SHIFT) & KN_COL_TOPK_MASK;
	c->temperature = r->temperature;
	c->top_p = r->top_p;
	c->top_k = r->top_k;
	c->seed = r->seed;
}

static void note_wait(struct ctrl_sched *s, struct sched_slot *sl)
{
	uint64_t w = s->launch_no - sl->ready_at;

	if (w > s->st.max_ready_wait)
		s->st.max_ready_wait = w;
}

/* Pack decode spans from the rotating cursor into at most @p budget columns. */
static void pack_decode(struct ctrl_sched *s, struct sched_group *g, int32_t budget)
{
	int32_t gate = 0, last = -1;

	if (s->o.spec)
		gate = s->n_live <= s->o.spec_c_full ? s->o.spec_depth
		       : s->n_live <= s->o.spec_c_half ? min32(s->o.spec_depth, 4) : 0;
	for (int32_t k = 0; k < s->n_slots && g->n_cols < budget; k++) {
		int32_t i = s->dcur + k < s->n_slots ? s->dcur + k : s->dcur + k - s->n_slots;
		struct sched_slot *sl = &s->slots[i];
		struct sched_req *r = sl->r;
		struct kn_column *c;
		int32_t d = 0, dmax, pos;

		if (r == NULL || sl->inflight || sl->kv_wait || sl->n_fed < r->n_prompt)
			continue;
		pos = sl->n_fed;
		c = &g->cols[g->n_cols];
		dmax = min32(gate, min32(r->max_tokens - r->n_gen - 1, budget - g->n_cols - 1));
		if (dmax > 0 && r->temperature <= 0.0f) {
			s->st.lookup_tries++;
			d = prompt_lookup(s, r->toks, sl->n_toks, dmax, s->draft);
			if (d > 0)
				s->st.lookup_hits++;
		}
		if (slot_prepare(s, g, i, pos + d) < 0)
			continue;
		fill_col(c, r, i, pos, r->toks[pos], KN_COL_NEED_LOGIT);
		for (int32_t j = 0; j < d; j++)
			fill_col(c + 1 + j, r, i, pos + 1 + j, s->draft[j], KN_COL_NEED_LOGIT);
		g->ent[g->n_ent++] = (struct sched_ent){
			.slot = i, .col = g->n_cols, .n = 1 + d, .kind = ENT_DECODE, .draft = d };
		g->n_cols += 1 + d;
		if (d > 0) {
			s->st.spec_rounds++;
			s->st.spec_drafted += (uint64_t)d;
		}
		sl->inflight = 1;
		note_wait(s, sl);
		last = i;
	}
	if (last >= 0)
		s->dcur = last + 1 == s->n_slots ? 0 : last + 1;
}

/*
 * May slot @p sl's prompt take another chunk now? Not while waiting for
 * remote KV or once every position was packed; with a round in flight only
 * on a chain of several stages, and only prompt chunks (decodes need the
 * result first): stage k computes chunk j + 1 while stage k + 1 computes
 * chunk j. Each stage takes its rounds in order, so chunk j's KV is in every
 * stage before chunk j + 1 reads it there. A lone long prompt on two stages
 * then takes about (1 + 1/chunks) / 2 of its serial time.
 */
static int prefill_packable(const struct ctrl_sched *s, const struct sched_slot *sl)
{
	const struct sched_req *r = sl->r;

	if (r == NULL || sl->kv_wait || sl->pf_wait || sl->n_sent >= r->n_prompt)
		return 0;
	return sl->inflight == 0 || (s->o.prefill_pipeline && s->ci.n_stages > 1 && !sl->cancelled && sl->lost == NULL
				     && (s->o.pipeline_held || !r->hold_kv));
}

/* Pack prefill chunks from the prefill cursor up to @p width columns. */
static void pack_prefill(struct ctrl_sched *s, struct sched_group *g, int32_t width)
{
	int32_t last = -1;

	for (int32_t k = 0; k < s->n_slots && g->n_cols < width; k++) {
		int32_t i = s->pcur + k < s->n_slots ? s->pcur + k : s->pcur + k - s->n_slots;
		struct sched_slot *sl = &s->slots[i];
		struct sched_req *r = sl->r;
		int32_t n, pos;
		int lastchunk;

		if (!prefill_packable(s, sl))
			continue;
		pos = sl->n_sent;
		n = min32(r->n_prompt - pos, width - g->n_cols);
		if (r->hold_kv && s->o.hold_chunk > 0) {
			/* chunks end on multiples of whole blocks, also after one the width cut */
			int32_t hc = s->o.hold_chunk >= KN_PAGE_BLK ? s->o.hold_chunk / KN_PAGE_BLK * KN_PAGE_BLK
								    : KN_PAGE_BLK;

			if (s->o.hold_taper && r->n_prompt - pos > hc) {
				/* as wide as the launch allows up to the block edge
				 * that leaves at most hc for the last chunk */
				int32_t cut = (r->n_prompt - hc + KN_PAGE_BLK - 1) / KN_PAGE_BLK * KN_PAGE_BLK;

				if (pos + n < cut)
					cut = (pos + n) / KN_PAGE_BLK * KN_PAGE_BLK;
				if (cut > pos)
					n = cut - pos;
			} else if (!s->o.hold_taper) {
				n = min32(n, (pos / hc + 1) * hc - pos);
			}
		}
		lastchunk = pos + n == r->n_prompt;
		if (slot_prepare(s, g, i, pos + n - 1) < 0)
			continue;
		for (int32_t j = 0; j < n; j++) {
			struct kn_column *c = &g->cols[g->n_cols + j];

			fill_col(c, r, i, pos + j, r->toks[pos + j], lastchunk && j == n - 1 ? KN_COL_NEED_LOGIT : 0u);
			if (pos + j + 1 < r->plp_end && pos + j + 1 >= r->plp_next) {
				/* prompt logprobs: the next prompt token, scored */
				fill_col(c, r, i, pos + j, r->toks[pos + j], KN_COL_NEED_LOGIT | KN_COL_FORCE);
				c->seed = (uint32_t)r->toks[pos + j + 1];
			}
		}
		g->ent[g->n_ent++] = (struct sched_ent){
			.slot = i, .col = g->n_cols, .n = n,
			.kind = lastchunk ? ENT_PREFILL_LAST : ENT_PREFILL, .draft = 0 };
		g->n_cols += n;
		s->st.prefill_cols += (uint64_t)n;
		sl->n_sent = pos + n;
		if (sl->inflight > 0)
			s->st.prefill_pipelined++;
		sl->inflight++;
		note_wait(s, sl);
		last = i;
	}
	if (last >= 0)
		s->pcur = last + 1 == s->n_slots ? 0 : last + 1;
}

/* Is there a sequence in prefill that is not in flight? */
static int prefill_ready(const struct ctrl_sched *s)
{
	for (int32_t k = 0; k < s->n_slots; k++) {
		int32_t i = s->pcur + k < s->n_slots ? s->pcur + k : s->pcur + k - s->n_slots;
		const struct sched_slot *sl = &s->slots[i];

		if (prefill_packable(s, sl))
			return 1;
	}
	return 0;
}

/*
 * One stage (one_launch_decode): while a group with decodes is in flight or
 * waiting for the transport, nothing else launches; prompt chunks ride in
 * the decodes' launch (up to mb_cols), and a prefill-only group goes only
 * when no sequence decodes. On a GPU any launch reads every weight, so a
 * second launch costs about a whole step whatever it carries: two groups
 * of decodes made every sequence advance every other step (H200, 1B, 8
 * clients: 2.5 ms per token against a 1.26 ms step), and a prefill-only
 * group queued between two decode launches added its own step to every
 * sequence's time per token (1B, 256 clients: 4.4 ms against a 3.6 ms
 * mixed step). The price is the host round trip between two launches.
 */
static int one_stage_decodes_pending(const struct ctrl_sched *s)
{
	if (!s->one_launch || s->ci.n_stages != 1)
		return 0;
	for (int32_t k = 0; k < s->n_groups; k++) {
		const struct sched_group *g = &s->groups[k];

		if (g->has_decode && (g->state == GROUP_INFLIGHT || g->state == GROUP_PENDING))
			return 1;
	}
	return 0;
}

/* Does any sequence decode (in flight or not)? */
static int any_decoding(const struct ctrl_sched *s)
{
	for (int32_t i = 0; i < s->n_slots; i++) {
		const struct sched_slot *sl = &s->slots[i];

		if (sl->r != NULL && !sl->kv_wait && sl->n_fed >= sl->r->n_prompt)
			return 1;
	}
	return 0;
}

/* Pack group @p g from every ready sequence. @return columns packed. */
int32_t sched_group_pack(struct ctrl_sched *s, struct sched_group *g)
{
	int32_t reserve = s->mb_cols / 4 > 1 ? s->mb_cols / 4 : 1;
	int pf;

	g->n_cols = g->n_ops = g->n_ent = 0;
	g->has_decode = 0;
	if (one_stage_decodes_pending(s))
		return 0;
	pf = prefill_ready(s);
	pack_decode(s, g, pf ? s->mb_cols - reserve : s->mb_cols);
	g->has_decode = g->n_ent > 0;
	if (pf) {
		/* The wide prefill plan only while nothing decodes: a prefill-only
		 * group between two decode groups stretches every decode's next
		 * round by its step (with pipelined prompts such groups are
		 * common: the decodes are in flight, the prompt's next chunk is
		 * ready). */
		int32_t width = g->n_cols > 0 || any_decoding(s) ? s->mb_cols : s->pf_cols;

		if (g->n_cols > 0 && s->one_launch) {
			int32_t w = sched_fit_width(&s->fit, s->o.step_budget, g->n_cols, width,
						    s->mb_cols / 16 > 8 ? s->mb_cols / 16 : 8);

			if (w < width) {
				width = w;
				s->st.prefill_capped++;
			}
		}
		pack_prefill(s, g, width);
	}
	return g->n_cols;
}
