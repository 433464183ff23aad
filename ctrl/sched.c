/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The scheduler core: inbox, admission, launches, result application
 * (tokens and finishes toward the clients: sched_emit.c).
 *
 * A sequence lives in a slot (its block-table row on every stage). Its state:
 *   toks[0 .. n_toks)  prompt then generated tokens
 *   n_fed              positions whose K/V the stages hold
 * Prefill while n_fed < n_prompt; decode after, with n_fed == n_toks - 1 (the
 * newest token is the next input). A round sends columns at positions
 * n_fed .. n_fed + k - 1; n_fed advances only when the round's result is
 * applied, and the slot's in-flight mark is what stops a second round from
 * being packed meanwhile. Break that and the stages see a position twice or
 * a token that is not yet known.
 *
 * Blocks: worst case per request is ceil((n_prompt + max_tokens - 1) / 16)
 * (the last generated token is never fed; drafts never reach past
 * max_tokens). Admission keeps sum(worst case of live) <= pool size, so the
 * lazy growth in ensure_blocks() cannot find the pool empty. Blocks return
 * to the pool only when the sequence is not in flight: a stage may still
 * write a block of an in-flight round.
 *
 * Ops for a slot (ZERO_SLOT on reuse, ROLLBACK after rejected drafts,
 * SET_BLOCK for new rows) go into the micro-batch that carries the slot's
 * next columns, ahead of them; chains keep submission order, so every stage
 * sees the same table at the same step.
 *
 * Replays (sched_replay.c): a sequence the chain lost leaves its slot and
 * waits on rp_head with n_prompt = its prompt + generated tokens; admission
 * takes those before the FIFO, and it prefills them all in a fresh slot.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrl_sched.h"
#include "sched_int.h"
#include "shm_blkpool.h"
#include "kvf_clock.h"

static int32_t min32(int32_t a, int32_t b)
{
	return a < b ? a : b;
}

const char *ctrl_finish_name(enum ctrl_finish f)
{
	switch (f) {
	case CTRL_FINISH_LENGTH: return "length";
	case CTRL_FINISH_STOP: return "stop";
	case CTRL_FINISH_CANCELLED: return "cancelled";
	case CTRL_FINISH_ERROR: return "error";
	default: return "none";
	}
}

void ctrl_request_init(struct ctrl_request *r)
{
	memset(r, 0, sizeof(*r));
	r->max_tokens = 16;
	r->top_p = 1.0f;
}

void ctrl_sched_opts_init(struct ctrl_sched_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->n_groups = 0;
	o->mb_cols = 32;
	o->max_queue = 65536;
	o->spec = 1;
	o->spec_depth = 8;
	o->spec_c_full = 8;
	o->spec_c_half = 32;
	o->spec_ngram_min = 2;
	o->spec_ngram_max = 4;
	o->spec_window = 4096;
	o->replay_max = 2;
	o->replay_timeout_ms = 30000;
	o->pipeline_held = 1;
}

static int32_t worst_blocks(int32_t n_prompt, int32_t max_tokens)
{
	/* the last token generated is never fed; a prompt-only request (max_tokens 0) feeds its prompt */
	int32_t pos = n_prompt + (max_tokens > 0 ? max_tokens - 1 : 0);

	return (pos + KN_PAGE_BLK - 1) / KN_PAGE_BLK;
}

/* ---- request lifetime ---- */

void sched_req_free(struct sched_req *r)
{
	if (r == NULL)
		return;
	free(r->why);
	free(r->doom);
	free(r->toks);
	free(r);
}

void sched_queue_push(struct sched_req **head, struct sched_req **tail, struct sched_req *r)
{
	r->next = NULL;
	if (*tail != NULL)
		(*tail)->next = r;
	else
		*head = r;
	*tail = r;
}

void sched_queue_unlink(struct sched_req **head, struct sched_req **tail, struct sched_req *prev,
			struct sched_req *r)
{
	if (prev != NULL)
		prev->next = r->next;
	else
		*head = r->next;
	if (*tail == r)
		*tail = prev;
	r->next = NULL;
}

/* ---- inbox (any thread) ---- */

int64_t ctrl_sched_submit(struct ctrl_sched *s, const struct ctrl_request *rq)
{
	struct sched_req *r;
	uint64_t seq, id;

	if (rq == NULL || rq->prompt == NULL || rq->n_prompt < 1 || rq->max_tokens < 0
	    || (rq->max_tokens == 0 && rq->kv_remote)
	    || rq->cb == NULL || rq->n_stop < 0 || (rq->n_stop > 0 && rq->stop_ids == NULL)
	    || rq->n_logprobs < 0 || rq->n_logprobs > CTRL_CHAIN_MAX_LOGPROBS || (rq->hold_kv && rq->kv_remote)
	    || rq->prompt_logprobs < 0 || (rq->prompt_logprobs && (rq->hold_kv || rq->kv_remote)))
		return -EINVAL;
	if (atomic_fetch_add_explicit(&s->pending, 1, memory_order_relaxed) >= s->o.max_queue) {
		atomic_fetch_sub_explicit(&s->pending, 1, memory_order_relaxed);
		return -EAGAIN;
	}
	r = malloc(sizeof(*r) + sizeof(int32_t) * (size_t)rq->n_stop);
	if (r == NULL)
		goto fail;
	r->toks = malloc(sizeof(int32_t) * (size_t)rq->n_prompt);
	if (r->toks == NULL)
		goto fail_req;
	memcpy(r->toks, rq->prompt, sizeof(int32_t) * (size_t)rq->n_prompt);
	if (rq->n_stop > 0)
		memcpy(r->stop, rq->stop_ids, sizeof(int32_t) * (size_t)rq->n_stop);
	r->next = NULL;
	r->n_prompt = rq->n_prompt;
	r->max_tokens = rq->max_tokens;
	r->n_stop = rq->n_stop;
	r->n_gen = 0;
	r->cap = rq->n_prompt;
	r->temperature = rq->temperature;
	r->top_p = rq->top_p;
	r->top_k = rq->top_k;
	r->seed = rq->seed;
	r->n_logprobs = rq->n_logprobs;
	r->hold_kv = rq->hold_kv != 0;
	r->kv_remote = rq->kv_remote != 0;
	r->plp_end = rq->prompt_logprobs > 0 && rq->prompt_logprobs < rq->n_prompt ? rq->n_prompt : 0;
	r->plp_next = r->plp_end > 0 ? rq->prompt_logprobs : 0;
	r->pf_from = rq->hold_kv || rq->kv_remote ? 0 : rq->prefill_from;
	r->t_admitted_ns = 0;
	r->t_wait_ns = 0;
	r->n_replays = 0;
	r->why = NULL;
	r->doom = NULL;
	r->cb = rq->cb;
	r->cb_arg = rq->cb_arg;
	r->need = worst_blocks(rq->n_prompt, rq->max_tokens);
	seq = atomic_fetch_add_explicit(&s->next_seq, 1, memory_order_relaxed);
	r->id = (seq << 8) | s->o.id_tag;
	atomic_fetch_add_explicit(&s->load, r->need, memory_order_relaxed);

	id = r->id; /* once r is in the inbox the scheduler thread may free it */
	pthread_mutex_lock(&s->lock);
	if (s->in_tail != NULL)
		s->in_tail->next = r;
	else
		s->in_head = r;
	s->in_tail = r;
	pthread_mutex_unlock(&s->lock);
	return (int64_t)id;

fail_req:
	free(r);
fail:
	atomic_fetch_sub_explicit(&s->pending, 1, memory_order_relaxed);
	return -ENOMEM;
}

int ctrl_sched_cancel(struct ctrl_sched *s, uint64_t id)
{
	int rc = 0;

	pthread_mutex_lock(&s->lock);
	if (s->n_cancel == s->cap_cancel) {
		size_t cap = s->cap_cancel ? s->cap_cancel * 2 : 16;
		uint64_t *p = realloc(s->cancels, sizeof(*p) * cap);

		if (p == NULL) {
			rc = -ENOMEM;
			goto out;
		}
		s->cancels = p;
		s->cap_cancel = cap;
	}
	s->cancels[s->n_cancel++] = id;
out:
	pthread_mutex_unlock(&s->lock);
	return rc;
}

/*
 * Could a request of @p n_prompt + @p max_tokens positions ever be admitted?
 * Only if its worst case fits the whole pool and a sequence's block-table row
 * (its context). @return 1 and the refusal in @p msg when it never could, 0
 * when it could. Reads what create() fixed: any thread.
 */
static int never_fits(const struct ctrl_sched *s, int32_t n_prompt, int32_t max_tokens, char *msg, size_t len)
{
	int64_t pos = (int64_t)n_prompt + max_tokens;
	int64_t need = (pos - 1 + KN_PAGE_BLK - 1) / KN_PAGE_BLK;

	if (need > s->n_blocks) {
		snprintf(msg, len,
			 "request needs %lld KV blocks (prompt %d + max_tokens %d at %d positions per block) but "
			 "the pool holds %d blocks: lower max_tokens or give the workers a larger KV pool",
			 (long long)need, n_prompt, max_tokens, KN_PAGE_BLK, s->n_blocks);
		return 1;
	}
	if (pos > s->ctx) {
		snprintf(msg, len,
			 "request needs %lld positions (prompt %d + max_tokens %d) but a sequence holds at most "
			 "%d: lower max_tokens or raise max_blocks_per_slot",
			 (long long)pos, n_prompt, max_tokens, s->ctx);
		return 1;
	}
	return 0;
}

int32_t ctrl_sched_admissible(const struct ctrl_sched *s, int32_t n_prompt, int32_t max_tokens, char *err,
			      size_t errlen)
{
	/* worst_blocks() <= n_blocks  <=>  n_prompt + max_tokens - 1 <= n_blocks * KN_PAGE_BLK */
	int64_t by_pool = (int64_t)s->n_blocks * KN_PAGE_BLK + 1 - n_prompt;
	int64_t by_ctx = (int64_t)s->ctx - n_prompt;
	int64_t most = by_pool < by_ctx ? by_pool : by_ctx;

	if (most < 0)
		most = 0;
	if (most > INT32_MAX)
		most = INT32_MAX;
	if (err != NULL && errlen > 0) {
		err[0] = 0;
		never_fits(s, n_prompt, max_tokens > 0 ? max_tokens : 1, err, errlen);
	}
	return (int32_t)most;
}

/* End request @p id as @p why (@p msg) if it waits in the queue @p head: @return 1 if it did. */
static int end_queued(struct ctrl_sched *s, struct sched_req **head, struct sched_req **tail, int32_t *n,
		      uint64_t id, enum ctrl_finish why, const char *msg)
{
	for (struct sched_req *r = *head, *prev = NULL; r != NULL; prev = r, r = r->next) {
		if (r->id != id)
			continue;
		sched_queue_unlink(head, tail, prev, r);
		(*n)--;
		s->queued_bytes -= sched_req_queued_bytes(r);
		atomic_fetch_sub_explicit(&s->pending, 1, memory_order_relaxed);
		sched_req_finish(s, r, why, -1, msg);
		return 1;
	}
	return 0;
}

struct sched_req *sched_find_waiting(struct ctrl_sched *s, uint64_t id)
{
	for (struct sched_req *r = s->q_head; r != NULL; r = r->next)
		if (r->id == id)
			return r;
	for (struct sched_req *r = s->rp_head; r != NULL; r = r->next)
		if (r->id == id)
			return r;
	return NULL;
}

int sched_end_waiting(struct ctrl_sched *s, uint64_t id, enum ctrl_finish why, const char *msg)
{
	int found = end_queued(s, &s->q_head, &s->q_tail, &s->n_queued, id, why, msg)
		    || end_queued(s, &s->rp_head, &s->rp_tail, &s->n_replaying, id, why, msg);

	if (found || msg == NULL)
		return found;
	/* not taken from the inbox yet (submitted since drain_inbox() ran):
	 * marked, it ends when it is */
	pthread_mutex_lock(&s->lock);
	for (struct sched_req *r = s->in_head; r != NULL && !found; r = r->next)
		if (r->id == id && r->doom == NULL && (r->doom = strdup(msg)) != NULL)
			found = 1;
	pthread_mutex_unlock(&s->lock);
	return found;
}

/* Move new requests to the FIFO (or reject them) and apply cancellations. */
static int drain_inbox(struct ctrl_sched *s)
{
	struct sched_req *head, *r;
	uint64_t *cancels;
	size_t n_cancel;
	int busy = 0;

	pthread_mutex_lock(&s->lock);
	head = s->in_head;
	s->in_head = s->in_tail = NULL;
	cancels = s->cancels;
	n_cancel = s->n_cancel;
	s->cancels = NULL;
	s->n_cancel = s->cap_cancel = 0;
	pthread_mutex_unlock(&s->lock);

	while ((r = head) != NULL) {
		char msg[256];

		head = r->next;
		r->next = NULL;
		busy = 1;
		s->st.submitted++;
		if (r->doom != NULL) { /* its prompt's KV failed before it got here */
			atomic_fetch_sub_explicit(&s->pending, 1, memory_order_relaxed);
			sched_req_finish(s, r, CTRL_FINISH_ERROR, -1, r->doom);
			continue;
		}
		if (never_fits(s, r->n_prompt, r->max_tokens, msg, sizeof(msg))) {
			/* (the HTTP layer refuses these before they come: ctrl_sched_admissible()) */
			s->st.rejected++;
			atomic_fetch_sub_explicit(&s->pending, 1, memory_order_relaxed);
			sched_req_finish(s, r, CTRL_FINISH_ERROR, -1, msg);
			continue;
		}
		sched_queue_push(&s->q_head, &s->q_tail, r);
		s->n_queued++;
		s->queued_bytes += sched_req_queued_bytes(r);
		r->t_wait_ns = kvf_mono_ns();
	}

	for (size_t k = 0; k < n_cancel; k++) {
		uint64_t id = cancels[k];
		int found = sched_end_waiting(s, id, CTRL_FINISH_CANCELLED, NULL);

		busy = 1;
		for (int32_t i = 0; !found && i < s->n_slots; i++) {
			struct sched_slot *sl = &s->slots[i];

			if (sl->r == NULL || sl->r->id != id)
				continue;
			found = 1;
			if (sl->inflight)
				sl->cancelled = 1; /* ends when its round returns */
			else
				sched_slot_finish(s, i, CTRL_FINISH_CANCELLED, -1, NULL);
		}
	}
	free(cancels);
	return busy;
}

/* ---- admission ---- */

static int admit(struct ctrl_sched *s)
{
	int busy = 0;

	/* Requests the chain lost first: they were admitted before any that waits. */
	while ((s->rp_head != NULL || s->q_head != NULL) && s->n_free_slots > 0) {
		int replay = s->rp_head != NULL;
		struct sched_req *r = replay ? s->rp_head : s->q_head;
		struct sched_slot *sl;
		int32_t *toks;
		int32_t i;

		if (s->reserved + r->need > s->n_blocks)
			break; /* FIFO: nobody overtakes the head */
		if (replay) {
			sched_queue_unlink(&s->rp_head, &s->rp_tail, NULL, r);
			s->n_replaying--;
		} else {
			sched_queue_unlink(&s->q_head, &s->q_tail, NULL, r);
			s->n_queued--;
		}
		s->queued_bytes -= sched_req_queued_bytes(r);
		atomic_fetch_sub_explicit(&s->pending, 1, memory_order_relaxed);
		busy = 1;
		/* (a replayed request's n_prompt holds its n_gen tokens: the same size) */
		toks = realloc(r->toks, sizeof(int32_t) * (size_t)(r->n_prompt + r->max_tokens - r->n_gen));
		if (toks == NULL) {
			sched_req_finish(s, r, CTRL_FINISH_ERROR, -1,
				   "realloc of the token buffer failed at admission: the scheduler is out of memory");
			continue;
		}
		r->toks = toks;
		r->cap = r->n_prompt + r->max_tokens - r->n_gen;
		i = s->free_slots[--s->n_free_slots];
		sl = &s->slots[i];
		sl->r = r;
		sl->n_fed = sl->n_sent = 0;
		sl->n_toks = r->n_prompt;
		sl->n_blk = 0;
		sl->n_set = 0;
		sl->inflight = 0;
		sl->cancelled = 0;
		sl->kv_wait = 0;
		sl->rollback_to = -1;
		sl->ready_at = s->launch_no;
		/* a cached prefix: its blocks, and prefill starts past them; a
		 * prefill node may ship those at once */
		if (sched_prefix_take(s, i) > 0 && r->hold_kv)
			sched_kv_progress(s, i);
		sched_sibling_admit(s, i); /* else another choice's computed prompt, or wait for it */
		s->reserved += r->need;
		s->n_live++;
		s->live_bytes += sizeof(*r) + sizeof(int32_t) * (size_t)(r->cap + r->n_stop);
		if (r->n_replays == 0) {
			s->st.admitted++;
			r->t_admitted_ns = kvf_mono_ns(); /* the request's queue time ends (HTTP's histogram) */
		}
		if (r->kv_remote)
			sched_kv_reserve(s, i);
	}
	return busy;
}

/* ---- launches ---- */

/* Replay, or end with an error, every sequence of group @p g (a failed group). */
void sched_group_fail(struct ctrl_sched *s, struct sched_group *g, const char *why)
{
	char msg[320];

	snprintf(msg, sizeof(msg), "the stage chain failed this request's micro-batch (group %d): %s",
		 (int)(g - s->groups), why);
	for (int32_t e = 0; e < g->n_ent; e++)
		sched_round_lost(s, g->ent[e].slot, msg);
	g->n_ent = 0;
	g->state = GROUP_IDLE;
}

char sched_lost_nomem[] = "the stage chain failed this request's micro-batch";

/* A round of slot @p i failed (@p msg): its sequence is lost once no other
 * round of it is in flight (a pipelined prompt's later chunks still run in
 * the stages and write its rows: the slot may not be reused before they
 * return). @return 1 if the slot was ended now. */
int sched_round_lost(struct ctrl_sched *s, int32_t i, const char *msg)
{
	struct sched_slot *sl = &s->slots[i];

	if (sl->inflight > 0)
		sl->inflight--;
	if (sl->r == NULL)
		return 0;
	if (sl->inflight > 0) {
		if (sl->lost == NULL && (sl->lost = strdup(msg)) == NULL)
			sl->lost = sched_lost_nomem; /* out of memory: still never before the last round */
		return 0;
	}
	if (sl->lost != NULL) {
		char why[480];

		snprintf(why, sizeof(why), "%s", sl->lost);
		sched_slot_lost(s, i, why);
	} else {
		sched_slot_lost(s, i, msg);
	}
	return 1;
}

/* Submit the group's built micro-batch. @return 1 sent, 0 retry later, <0 failed. */
static int group_submit(struct ctrl_sched *s, struct sched_group *g)
{
	int rc = ctrl_chain_submit(s->chain, (uint32_t)(g - s->groups), g->cols, g->n_cols, g->ops,
				   g->n_ops);

	if (rc == -EBUSY) {
		g->state = GROUP_PENDING;
		return 0;
	}
	if (rc < 0) {
		char why[128];

		snprintf(why, sizeof(why), "ctrl_chain_submit(%s, %d columns) failed: %s",
			 s->chain->vt->name, g->n_cols, strerror(-rc));
		sched_group_fail(s, g, why);
		return rc;
	}
	g->state = GROUP_INFLIGHT;
	g->t_launch = kvf_mono_ns();
	s->n_inflight++;
	s->launch_no++;
	s->st.launches++;
	s->st.launched_cols += (uint64_t)g->n_cols;
	return 1;
}

/* ---- results ---- */

/* Did any column of @p en fail alone? */
static int ent_failed(const int32_t *col_status, const struct sched_ent *en)
{
	for (int32_t j = 0; j < en->n; j++)
		if (col_status[en->col + j] < 0)
			return 1;
	return 0;
}

static void apply_result(struct ctrl_sched *s, const struct ctrl_chain_result *res)
{
	struct sched_group *g;

	if (res->group >= (uint32_t)s->n_groups || s->groups[res->group].state != GROUP_INFLIGHT)
		return; /* not ours: a chain bug; nothing to apply */
	g = &s->groups[res->group];
	s->n_inflight--;
	s->rt_ns += kvf_mono_ns() - g->t_launch;
	s->rt_n++;
	if (res->status == 0 && res->step_ns > 0 && s->one_launch)
		sched_fit_add(&s->fit, g->n_cols, res->step_ns);
	if (res->status < 0 || res->n_cols != g->n_cols) {
		sched_group_fail(s, g, res->status < 0 ? res->err : "result has a different column count");
		return;
	}
	for (int32_t e = 0; e < g->n_ent; e++) {
		const struct sched_ent *en = &g->ent[e];
		struct sched_slot *sl = &s->slots[en->slot];
		const int32_t *out = res->tokens + en->col;
		const float *lp = res->logprobs != NULL ? res->logprobs + en->col : NULL;
		int32_t a = 0, old;

		if (sl->r == NULL) {
			if (sl->inflight > 0)
				sl->inflight--; /* (cannot happen: a slot with rounds out is never freed) */
			continue;
		}
		sl->ready_at = s->launch_no;
		if (sl->lost != NULL) {
			/* an earlier round of this prompt failed: this one's columns
			 * built on it; the sequence is lost once the last returns */
			sched_round_lost(s, en->slot, sl->lost);
			continue;
		}
		if (sl->cancelled) {
			if (--sl->inflight == 0)
				sched_slot_finish(s, en->slot, CTRL_FINISH_CANCELLED, -1, NULL);
			continue;
		}
		if (res->col_status != NULL && ent_failed(res->col_status, en)) {
			char msg[320];

			/* Its KV is gone on some stage: no later round could be
			 * right, so it starts again elsewhere (or ends). The
			 * slot's next owner starts with ZERO_SLOT. */
			snprintf(msg, sizeof(msg), "the stage chain lost this request's KV cache (group %d): %s",
				 (int)(g - s->groups), res->err);
			sched_round_lost(s, en->slot, msg);
			continue;
		}
		if (en->kind != ENT_DECODE && g->cols[en->col].pos != sl->n_fed) {
			/* a prompt's chunks return in the order they left (each
			 * stage takes its rounds in order): anything else would
			 * count positions the stages do not hold */
			sched_round_lost(s, en->slot, "a prompt chunk came back out of order: its KV cannot be trusted");
			continue;
		}
		sl->inflight--;
		switch (en->kind) {
		case ENT_PREFILL:
			if (sl->r->plp_end > 0 && sched_slot_prompt_lp(s, en->slot, res, g->cols, en->col, en->n))
				break;
			old = sl->n_fed;
			sl->n_fed += en->n;
			if (sl->r->hold_kv && sl->n_fed / KN_PAGE_BLK > old / KN_PAGE_BLK)
				sched_kv_progress(s, en->slot);
			sched_prefix_fed(s, en->slot);
			break;
		case ENT_PREFILL_LAST:
			if (sl->r->plp_end > 0 && sched_slot_prompt_lp(s, en->slot, res, g->cols, en->col, en->n))
				break;
			sl->n_fed += en->n;
			sched_prefix_fed(s, en->slot);
			if (s->n_pf_wait > 0) /* the other choices of its request read its prompt's blocks */
				sched_sibling_done(s, en->slot, 1);
			if (sl->r->max_tokens == 0) /* the prompt alone was asked for */
				sched_slot_finish(s, en->slot, CTRL_FINISH_LENGTH, -1, NULL);
			else
				sched_slot_emit(s, en->slot, out[en->n - 1], lp != NULL ? lp[en->n - 1] : 0.0f,
						sched_col_top(res, sl->r, en->col + en->n - 1));
			break;
		case ENT_DECODE:
			while (a < en->draft && out[a] == g->cols[en->col + 1 + a].token)
				a++;
			old = sl->n_fed;
			sl->n_fed = old + 1 + a;
			s->st.spec_accepted += (uint64_t)a;
			for (int32_t j = 0; j <= a; j++)
				if (sched_slot_emit(s, en->slot, out[j], lp != NULL ? lp[j] : 0.0f,
					      sched_col_top(res, sl->r, en->col + j)))
					goto next;
			if (a < en->draft)
				sl->rollback_to = old + 1 + a;
			break;
		}
next:;
	}
	g->n_ent = 0;
	g->state = GROUP_IDLE;
}

/* ---- the poll loop ---- */

static int poll_body(struct ctrl_sched *s);

int ctrl_sched_poll(struct ctrl_sched *s)
{
	int rc;

	s->defer = 1;
	rc = poll_body(s);
	s->defer = 0;
	sched_flush(s);
	return rc;
}

static int poll_body(struct ctrl_sched *s)
{
	int busy = 0, n, rc = 0;

	if (atomic_exchange(&s->flush_pfx, 0)) {
		sched_prefix_flush(s);
		busy = 1; /* (the counters the flush changed are published) */
	}
	busy |= drain_inbox(s);
	busy |= sched_kv_drain(s);
	if (s->n_inflight > 0) {
		n = ctrl_chain_poll(s->chain, s->res, s->n_groups);
		if (n < 0) {
			char why[128];

			snprintf(why, sizeof(why), "ctrl_chain_poll(%s) failed: %s", s->chain->vt->name,
				 strerror(-n));
			for (int32_t k = 0; k < s->n_groups; k++)
				if (s->groups[k].state == GROUP_INFLIGHT) {
					s->n_inflight--;
					sched_group_fail(s, &s->groups[k], why);
				}
			sched_publish(s);
			return n;
		}
		for (int k = 0; k < n; k++)
			apply_result(s, &s->res[k]);
		busy |= n > 0;
	} else {
		/* Nothing in flight: still tick the chain (no result wanted), so a
		 * chain that watches its stages (worker processes) notices a death
		 * and re-forms while the scheduler idles, not at the next request. */
		ctrl_chain_poll(s->chain, s->res, 0);
	}
	if (sched_replay_hold(s)) {
		/* the chain re-forms: requests wait (and end past replay_timeout) */
		sched_publish(s);
		return busy ? CTRL_SCHED_BUSY : CTRL_SCHED_IDLE;
	}
	busy |= admit(s);
	for (int32_t k = 0; k < s->n_groups; k++) {
		struct sched_group *g = &s->groups[k];
		int sent;

		if (g->state == GROUP_INFLIGHT)
			continue;
		if (g->state == GROUP_IDLE && sched_group_pack(s, g) == 0)
			break;
		sent = group_submit(s, g);
		if (sent == 0)
			break; /* transport full: keep order, retry this group first */
		busy = 1;
		if (sent < 0 && rc == 0)
			rc = sent;
	}
	if (busy)
		sched_publish(s);
	return rc < 0 ? rc : busy ? CTRL_SCHED_BUSY : CTRL_SCHED_IDLE;
}

int ctrl_sched_flush_prefix(struct ctrl_sched *s)
{
	if (!s->o.prefix_cache)
		return -ENOTSUP;
	atomic_store(&s->flush_pfx, 1);
	return 0;
}

int ctrl_sched_drained(struct ctrl_sched *s)
{
	return atomic_load_explicit(&s->pending, memory_order_relaxed) == 0 && s->n_live == 0
	       && s->n_inflight == 0;
}

/* ---- create / destroy ---- */

/* Free what ctrl_sched_create() allocates (a part of it after a failure):
 * the groups' buffers, the slots, the block pool and @p s itself. */
static void sched_free(struct ctrl_sched *s)
{
	if (s->groups != NULL)
		for (int32_t k = 0; k < s->n_groups; k++) {
			free(s->groups[k].cols);
			free(s->groups[k].ops);
			free(s->groups[k].ent);
		}
	free(s->draft);
	free(s->res);
	free(s->groups);
	free(s->free_slots);
	free(s->blk_mem);
	free(s->slots);
	sched_prefix_fini(s);
	shm_blkpool_destroy(s->pool);
	free(s);
}

struct ctrl_sched *ctrl_sched_create(struct ctrl_chain *chain, const struct ctrl_sched_opts *o,
				     char *err, size_t errlen)
{
	struct ctrl_sched *s;
	int32_t width, ops_cap;
	int rc;

	if (chain == NULL || o == NULL) {
		snprintf(err, errlen, "ctrl_sched_create: chain and options are required");
		errno = EINVAL;
		return NULL;
	}
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		goto fail_nomem;
	s->chain = chain;
	s->o = *o;
	sched_fit_plans(&s->fit, o->plans, o->n_plans);
	rc = ctrl_chain_info(chain, &s->ci);
	if (rc < 0) {
		snprintf(err, errlen, "ctrl_chain_info(%s) failed: %s", chain->vt->name, strerror(-rc));
		errno = -rc;
		goto fail_sched;
	}
	s->n_slots = o->n_slots > 0 && o->n_slots < s->ci.n_slots ? o->n_slots : s->ci.n_slots;
	s->n_blocks = o->n_blocks > 0 && o->n_blocks < s->ci.n_blocks ? o->n_blocks : s->ci.n_blocks;
	s->mbps = s->ci.max_blocks_per_slot;
	s->ctx = s->mbps * KN_PAGE_BLK;
	if (s->ci.max_position > 0 && s->ci.max_position < s->ctx)
		s->ctx = s->ci.max_position;
	/* n_stages + 1 groups: with n_stages the pipe is full only if a result
	 * is relaunched instantly. With a 20 µs link each way and 100 µs steps
	 * (fake chain, bench_ctrl_sched) occupancy is 0.83 / 0.91 / 0.95 at
	 * p = 2 / 4 / 8 with p groups and 0.999 / 0.998 / 0.995 with p + 1. */
	s->n_groups = o->force_groups > 0 ? o->force_groups
		      : o->n_groups > s->ci.n_stages + 1 ? o->n_groups : s->ci.n_stages + 1;
	s->mb_cols = min32(o->mb_cols, s->ci.max_cols);
	s->one_launch = o->one_launch_decode;
	s->pf_cols = o->prefill_cols > 0 ? min32(o->prefill_cols, s->ci.max_cols) : s->ci.max_cols;
	if (s->n_groups > s->ci.max_groups || s->mb_cols < 2 || s->n_slots < 1 || s->n_blocks < 1
	    || o->max_queue < 1 || o->spec_ngram_min < 1 || o->spec_ngram_max < o->spec_ngram_min
	    || o->spec_depth < 0 || o->spec_window < 2) {
		snprintf(err, errlen,
			 "ctrl_sched_create: options out of range: groups %d (chain %s takes %d), mb_cols %d "
			 "(needs >= 2, chain max %d), n-grams %d..%d, depth %d, window %d, max_queue %d",
			 s->n_groups, chain->vt->name, s->ci.max_groups, s->mb_cols, s->ci.max_cols,
			 o->spec_ngram_min, o->spec_ngram_max, o->spec_depth, o->spec_window, o->max_queue);
		errno = EINVAL;
		goto fail_sched;
	}
	width = s->mb_cols > s->pf_cols ? s->mb_cols : s->pf_cols;
	/* Each packed sequence brings at least one column and at most ZERO +
	 * ROLLBACK + one SET_BLOCK per 16 columns plus one: 4 ops per column bounds it. */
	ops_cap = 4 * width + 16;
	if (ops_cap < s->ci.max_blocks_per_slot + 16)
		ops_cap = s->ci.max_blocks_per_slot + 16; /* one kv_remote row fits any launch */
	s->ops_cap = ops_cap;
	s->pool = shm_blkpool_create(s->n_blocks);
	if (s->pool == NULL)
		goto fail_nomem_sched;
	if (sched_prefix_init(s))
		goto fail_nomem_sched;
	s->slots = calloc((size_t)s->n_slots, sizeof(*s->slots));
	s->blk_mem = malloc(sizeof(int32_t) * (size_t)s->n_slots * (size_t)s->mbps);
	s->free_slots = malloc(sizeof(int32_t) * (size_t)s->n_slots);
	s->groups = calloc((size_t)s->n_groups, sizeof(*s->groups));
	s->res = calloc((size_t)s->n_groups, sizeof(*s->res));
	s->draft = malloc(sizeof(int32_t) * (size_t)(o->spec_depth + 1));
	if (s->slots == NULL || s->blk_mem == NULL || s->free_slots == NULL || s->groups == NULL
	    || s->res == NULL || s->draft == NULL)
		goto fail_nomem_sched;
	for (int32_t i = 0; i < s->n_slots; i++) {
		s->slots[i].blk = s->blk_mem + (size_t)i * (size_t)s->mbps;
		s->slots[i].fresh = 1;
		s->slots[i].rollback_to = -1;
		s->free_slots[i] = s->n_slots - 1 - i;
	}
	s->n_free_slots = s->n_slots;
	for (int32_t k = 0; k < s->n_groups; k++) {
		struct sched_group *g = &s->groups[k];

		g->cols = malloc(sizeof(*g->cols) * (size_t)width);
		g->ops = malloc(sizeof(*g->ops) * (size_t)ops_cap);
		g->ent = malloc(sizeof(*g->ent) * (size_t)width);
		if (g->cols == NULL || g->ops == NULL || g->ent == NULL)
			goto fail_nomem_sched;
	}
	atomic_init(&s->next_seq, 1);
	atomic_init(&s->load, 0);
	atomic_init(&s->pending, 0);
	atomic_init(&s->flush_pfx, 0);
	if (pthread_mutex_init(&s->lock, NULL) != 0)
		goto fail_nomem_sched;
	if (pthread_mutex_init(&s->st_lock, NULL) != 0)
		goto fail_lock;
	s->st.n_groups = s->n_groups;
	s->st.n_stages = s->ci.n_stages;
	s->st.blocks_total = s->n_blocks;
	s->pub = s->st;
	return s;

fail_lock:
	pthread_mutex_destroy(&s->lock);
fail_nomem_sched:
	snprintf(err, errlen, "ctrl_sched_create: out of memory for %d slots, %d groups, %d blocks",
		 s->n_slots, s->n_groups, s->n_blocks);
	errno = ENOMEM;
fail_sched:
	sched_free(s);
	return NULL;
fail_nomem:
	snprintf(err, errlen, "ctrl_sched_create: out of memory");
	errno = ENOMEM;
	return NULL;
}

void ctrl_sched_destroy(struct ctrl_sched *s)
{
	struct sched_req *r;

	if (s == NULL)
		return;
	while ((r = s->in_head) != NULL) {
		s->in_head = r->next;
		sched_req_free(r);
	}
	while ((r = s->q_head) != NULL) {
		s->q_head = r->next;
		sched_req_free(r);
	}
	while ((r = s->rp_head) != NULL) {
		s->rp_head = r->next;
		sched_req_free(r);
	}
	for (int32_t i = 0; i < s->n_slots; i++) {
		sched_req_free(s->slots[i].r);
		if (s->slots[i].lost != sched_lost_nomem)
			free(s->slots[i].lost);
	}
	free(s->cancels);
	sched_kv_destroy(s);
	free(s->pend);
	pthread_mutex_destroy(&s->st_lock);
	pthread_mutex_destroy(&s->lock);
	sched_free(s);
}
