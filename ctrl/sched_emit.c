/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The scheduler's side toward the clients: a generated token appended and
 * handed to its request's callback (stop ids, max_tokens), a request
 * finished (its slot and blocks freed, or kept for a hold_kv request), and
 * the events of a poll held until its launches are out (sched_flush()).
 * Runs on the scheduler's thread, inside ctrl_sched_poll().
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrl_sched.h"
#include "sched_int.h"
#include "shm_blkpool.h"

/*
 * Hand an event to its request's callback, or, inside a poll, keep a copy for
 * sched_flush(), which runs once the poll's launches are out: measured on the H200
 * (1B, 64 clients) the callbacks of one round (a mutex, a queue push and an
 * MHD resume each) held the next launch back by ~0.3 ms, a fifth of a step.
 * Events keep their order, one request's finish after its tokens.
 */
void sched_emit(struct ctrl_sched *s, ctrl_token_cb cb, void *arg, const struct ctrl_event *ev)
{
	struct sched_pend *p;

	if (!s->defer)
		goto now;
	if (s->n_pend == s->cap_pend) {
		int32_t cap = s->cap_pend ? s->cap_pend * 2 : 64;
		struct sched_pend *np = realloc(s->pend, sizeof(*np) * (size_t)cap);

		if (np == NULL) {
			/* out of memory: deliver what is held, then this one, in order */
			for (int32_t i = 0; i < s->n_pend; i++)
				s->pend[i].cb(s->pend[i].cb_arg, &s->pend[i].ev);
			s->n_pend = 0;
			goto now;
		}
		s->pend = np;
		s->cap_pend = cap;
	}
	p = &s->pend[s->n_pend++];
	p->cb = cb;
	p->cb_arg = arg;
	p->ev = *ev;
	if (ev->n_top > 0 && ev->top_ids != NULL && ev->top_logprobs != NULL) {
		int32_t n = ev->n_top < CTRL_CHAIN_MAX_LOGPROBS ? ev->n_top : CTRL_CHAIN_MAX_LOGPROBS;

		memcpy(p->top_ids, ev->top_ids, sizeof(int32_t) * (size_t)n);
		memcpy(p->top_lps, ev->top_logprobs, sizeof(float) * (size_t)n);
		p->ev.n_top = n;
	}
	if (ev->message != NULL)
		snprintf(p->msg, sizeof(p->msg), "%s", ev->message);
	p->kv = NULL;
	if ((ev->kv_progress || ev->kv_reserved) && ev->n_kv_blocks > 0) {
		p->kv = malloc(sizeof(int32_t) * (size_t)ev->n_kv_blocks);
		if (p->kv == NULL) { /* out of memory: deliver it now, its blocks still right */
			s->n_pend--;
			goto now;
		}
		memcpy(p->kv, ev->kv_blocks, sizeof(int32_t) * (size_t)ev->n_kv_blocks);
		p->ev.kv_blocks = p->kv;
	}
	return;
now:
	cb(arg, ev);
}

void sched_flush(struct ctrl_sched *s)
{
	for (int32_t i = 0; i < s->n_pend; i++) {
		struct sched_pend *p = &s->pend[i];

		p->ev.top_ids = p->ev.n_top > 0 ? p->top_ids : NULL;
		p->ev.top_logprobs = p->ev.n_top > 0 ? p->top_lps : NULL;
		p->ev.message = p->ev.message != NULL ? p->msg : NULL;
		p->cb(p->cb_arg, &p->ev);
		free(p->kv);
	}
	s->n_pend = 0;
}

/* Tell the client and drop a request that is not in a slot; @p h: the
 * blocks it keeps (hold_kv), holding @p kv_pos positions. */
static void req_finish_kv(struct ctrl_sched *s, struct sched_req *r, enum ctrl_finish why, int32_t token,
			  const char *msg, const struct sched_held *h, int32_t kv_pos)
{
	struct ctrl_event ev = {
		.id = r->id, .finish = why, .token = token, .logprob = 0.0f,
		.n_generated = r->n_gen, .message = msg,
		.kv_blocks = h != NULL ? h->blk : NULL, .n_kv_blocks = h != NULL ? h->n : 0,
		.kv_positions = h != NULL ? kv_pos : 0, .t_admitted_ns = r->t_admitted_ns,
		.cached_tokens = r->n_cached,
	};

	s->st.finished++;
	if (why == CTRL_FINISH_CANCELLED)
		s->st.cancelled++;
	if (why == CTRL_FINISH_ERROR)
		s->st.errors++;
	atomic_fetch_sub_explicit(&s->load, r->need, memory_order_relaxed);
	sched_emit(s, r->cb, r->cb_arg, &ev);
	sched_req_free(r);
}

void sched_req_finish(struct ctrl_sched *s, struct sched_req *r, enum ctrl_finish why, int32_t token,
		      const char *msg)
{
	req_finish_kv(s, r, why, token, msg, NULL, 0);
}

/* Free slot @p i (its blocks go back unless @p kept: a hold_kv request's;
 * those the prefix cache names stay with it: sched_prefix.c). */
static struct sched_req *slot_free(struct ctrl_sched *s, int32_t i, int kept)
{
	struct sched_slot *sl = &s->slots[i];
	struct sched_req *r = sl->r;

	if (s->n_pf_wait > 0) {
		if (sl->pf_wait) {
			sl->pf_wait = 0;
			s->n_pf_wait--;
		}
		sched_sibling_done(s, i, 0); /* those waiting for its prompt compute their own */
	}
	if (!kept)
		sched_prefix_release(s, i);
	sl->n_blk = 0;
	sl->n_set = 0;
	if (sl->kv_wait)
		s->st.kv_waiting--;
	sl->kv_wait = 0;
	s->reserved -= r->need;
	s->n_live--;
	s->live_bytes -= sizeof(*r) + sizeof(int32_t) * (size_t)(r->cap + r->n_stop);
	sl->r = NULL;
	sl->fresh = 1;
	sl->cancelled = 0;
	sl->rollback_to = -1;
	if (sl->lost != sched_lost_nomem)
		free(sl->lost);
	sl->lost = NULL;
	s->free_slots[s->n_free_slots++] = i;
	return r;
}

struct sched_req *sched_slot_release(struct ctrl_sched *s, int32_t i)
{
	return slot_free(s, i, 0);
}

/* End the sequence in slot @p i: free its blocks and slot, then tell the client. */
void sched_slot_finish(struct ctrl_sched *s, int32_t i, enum ctrl_finish why, int32_t token,
			const char *msg)
{
	struct sched_slot *sl = &s->slots[i];
	const struct sched_held *h = NULL;
	int32_t kv_pos = sl->n_fed;
	struct sched_req *r;

	if (sl->r->hold_kv && (why == CTRL_FINISH_LENGTH || why == CTRL_FINISH_STOP))
		h = sched_kv_hold(s, i); /* NULL: out of memory, the blocks go back */
	r = slot_free(s, i, h != NULL);
	req_finish_kv(s, r, why, token, msg, h, kv_pos);
}

struct col_top sched_col_top(const struct ctrl_chain_result *res, const struct sched_req *r, int32_t col)
{
	struct col_top t = { 0, NULL, NULL };

	if (res->n_logprobs > 0 && r->n_logprobs > 0 && res->top_ids != NULL && res->top_logprobs != NULL) {
		t.n = r->n_logprobs < res->n_logprobs ? r->n_logprobs : res->n_logprobs;
		t.ids = res->top_ids + (size_t)col * (size_t)res->n_logprobs;
		t.lps = res->top_logprobs + (size_t)col * (size_t)res->n_logprobs;
	}
	return t;
}

/* Append a generated token; @return 1 if the sequence ended. */
int sched_slot_emit(struct ctrl_sched *s, int32_t i, int32_t tok, float lp, struct col_top top)
{
	struct sched_slot *sl = &s->slots[i];
	struct sched_req *r = sl->r;
	struct ctrl_event ev;

	r->toks[sl->n_toks++] = tok;
	r->n_gen++;
	s->st.tokens++;
	for (int32_t k = 0; k < r->n_stop; k++) {
		if (r->stop[k] == tok) {
			sched_slot_finish(s, i, CTRL_FINISH_STOP, tok, NULL);
			return 1;
		}
	}
	ev = (struct ctrl_event){
		.id = r->id, .finish = CTRL_FINISH_NONE, .token = tok, .logprob = lp,
		.n_generated = r->n_gen, .message = NULL,
		.n_top = top.n, .top_ids = top.ids, .top_logprobs = top.lps,
		.t_admitted_ns = r->t_admitted_ns, .cached_tokens = r->n_cached,
	};
	sched_emit(s, r->cb, r->cb_arg, &ev);
	if (r->n_gen >= r->max_tokens) {
		sched_slot_finish(s, i, CTRL_FINISH_LENGTH, -1, NULL);
		return 1;
	}
	return 0;
}

int sched_slot_prompt_lp(struct ctrl_sched *s, int32_t i, const struct ctrl_chain_result *res,
			 const struct kn_column *cols, int32_t col, int32_t n)
{
	struct sched_req *r = s->slots[i].r;

	for (int32_t j = col; j < col + n; j++) {
		int32_t p = cols[j].pos + 1;
		struct col_top top;
		struct ctrl_event ev;

		if (!(cols[j].flags & KN_COL_FORCE) || p < r->plp_next || p >= r->plp_end)
			continue;
		if (res->tokens[j] != r->toks[p]) {
			char msg[256];

			snprintf(msg, sizeof(msg), "the stage chain did not score prompt token %d at position %d (it "
				 "answered token %d): its workers predate prompt logprobs; update kvferry-worker on "
				 "every node", r->toks[p], p, res->tokens[j]);
			s->slots[i].inflight++; /* as any lost round (its later chunks may be out) */
			sched_round_lost(s, i, msg);
			return 1;
		}
		top = sched_col_top(res, r, j);
		ev = (struct ctrl_event){
			.id = r->id, .finish = CTRL_FINISH_NONE, .token = r->toks[p], .prompt_pos = p,
			.logprob = res->logprobs != NULL ? res->logprobs[j] : 0.0f, .n_generated = r->n_gen,
			.n_top = top.n, .top_ids = top.ids, .top_logprobs = top.lps, .t_admitted_ns = r->t_admitted_ns,
			.cached_tokens = r->n_cached,
		};
		sched_emit(s, r->cb, r->cb_arg, &ev);
		r->plp_next = p + 1;
	}
	return 0;
}
