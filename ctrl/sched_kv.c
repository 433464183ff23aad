/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The scheduler's side of prefill/decode disaggregation: a prefill node's
 * request keeps its prompt's KV blocks when it ends (hold_kv) so they can be
 * read out and shipped; a decode node's request (kv_remote) gets blocks for
 * its prompt at admission, waits unpacked while another node fills them, and
 * decodes from position n_prompt once told the KV is in place
 * (ctrl_sched_kv_ready). Page movement itself is not here: the chain reads
 * and writes pages (ctrl_chain_kv_export/import) and the PD layer carries
 * them; the scheduler only owns which blocks, and when.
 *
 * Rules (tests/ctrl/test_sched_kn.c pins them on real CPU stages):
 *  - a kv_remote request's output is the co-located request's, token for
 *    token (greedy and seeded), once its pages are the prefill node's;
 *  - its blocks are reserved worst-case at admission like any request's;
 *    the prompt's row entries reach the stages with its first decode column;
 *  - a request that ends while waiting (cancel, failure) gives its blocks
 *    back at once; a later ready for it is ignored and counted;
 *  - held blocks count as reserved until released, so admission never
 *    hands them out.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrl_sched.h"
#include "sched_int.h"
#include "shm_blkpool.h"

static int kv_post(struct ctrl_sched *s, struct sched_kvmsg *m)
{
	m->next = NULL;
	pthread_mutex_lock(&s->lock);
	if (s->kv_tail != NULL)
		s->kv_tail->next = m;
	else
		s->kv_head = m;
	s->kv_tail = m;
	atomic_store_explicit(&s->kv_any, 1, memory_order_release);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* Post a ready or an early first token (@p kind) with its token's logprobs. */
static int kv_post_token(struct ctrl_sched *s, int kind, uint64_t id, int32_t first_token, float logprob,
			 int32_t n_top, const int32_t *top_ids, const float *top_logprobs)
{
	struct sched_kvmsg *m;

	if (first_token < 0 || n_top < 0 || n_top > CTRL_CHAIN_MAX_LOGPROBS
	    || (n_top > 0 && (top_ids == NULL || top_logprobs == NULL)))
		return -EINVAL;
	m = calloc(1, sizeof(*m));
	if (m == NULL)
		return -ENOMEM;
	m->kind = kind;
	m->id = id;
	m->token = first_token;
	m->logprob = logprob;
	m->n_top = n_top;
	if (n_top > 0) {
		memcpy(m->top_ids, top_ids, sizeof(int32_t) * (size_t)n_top);
		memcpy(m->top_lps, top_logprobs, sizeof(float) * (size_t)n_top);
	}
	return kv_post(s, m);
}

int ctrl_sched_kv_ready(struct ctrl_sched *s, uint64_t id, int32_t first_token, float logprob, int32_t n_top,
			const int32_t *top_ids, const float *top_logprobs)
{
	return kv_post_token(s, SCHED_KV_READY, id, first_token, logprob, n_top, top_ids, top_logprobs);
}

int ctrl_sched_kv_first(struct ctrl_sched *s, uint64_t id, int32_t first_token, float logprob, int32_t n_top,
			const int32_t *top_ids, const float *top_logprobs)
{
	return kv_post_token(s, SCHED_KV_FIRST, id, first_token, logprob, n_top, top_ids, top_logprobs);
}

/* Post a message of @p kind for request @p id (@p why: a failure's text). */
static int kv_post_kind(struct ctrl_sched *s, uint64_t id, int kind, const char *why)
{
	struct sched_kvmsg *m = calloc(1, sizeof(*m));

	if (m == NULL)
		return -ENOMEM;
	m->kind = kind;
	m->id = id;
	if (why != NULL)
		snprintf(m->why, sizeof(m->why), "%s", why);
	return kv_post(s, m);
}

int ctrl_sched_kv_failed(struct ctrl_sched *s, uint64_t id, const char *why)
{
	return kv_post_kind(s, id, SCHED_KV_FAILED, why != NULL ? why : "the prompt's KV did not arrive");
}

int ctrl_sched_kv_local(struct ctrl_sched *s, uint64_t id)
{
	return kv_post_kind(s, id, SCHED_KV_LOCAL, NULL);
}

void sched_kv_lost(struct ctrl_sched *s, struct sched_req *r)
{
	struct ctrl_event ev = { .id = r->id, .finish = CTRL_FINISH_NONE, .token = -1, .kv_lost = 1 };

	sched_flush(s);
	r->cb(r->cb_arg, &ev);
	r->kv_remote = 0;
	s->st.kv_replayed_here++;
}

int ctrl_sched_kv_release(struct ctrl_sched *s, uint64_t id)
{
	return kv_post_kind(s, id, SCHED_KV_RELEASE, NULL);
}

int sched_kv_reserve(struct ctrl_sched *s, int32_t i)
{
	struct sched_slot *sl = &s->slots[i];
	struct sched_req *r = sl->r;
	int32_t n = (r->n_prompt - 1) / KN_PAGE_BLK + 1;
	struct ctrl_event ev;
	int rc = sched_blk_alloc(s, n, sl->blk);

	if (rc < 0) { /* cannot happen: admission reserved r->need >= n */
		sched_slot_finish(s, i, CTRL_FINISH_ERROR, -1,
				  "the KV pool had no blocks for a remote prompt that admission reserved");
		return rc;
	}
	sl->n_blk = n;
	sl->n_set = 0;
	sl->kv_wait = 1;
	sl->kv_first = 0;
	s->st.kv_waiting++;
	sl->n_fed = sl->n_sent = 0;
	ev = (struct ctrl_event){
		.id = r->id, .finish = CTRL_FINISH_NONE, .token = -1, .kv_reserved = 1,
		.kv_blocks = sl->blk, .n_kv_blocks = n, .kv_positions = r->n_prompt,
	};
	sched_emit(s, r->cb, r->cb_arg, &ev);
	return 0;
}

/* A hold_kv prompt's chunk came back from every stage: its whole blocks
 * are final (nothing writes a prompt position twice), so a prefill node
 * may ship them while the rest of the prompt runs. */
void sched_kv_progress(struct ctrl_sched *s, int32_t i)
{
	struct sched_slot *sl = &s->slots[i];
	struct ctrl_event ev = {
		.id = sl->r->id, .finish = CTRL_FINISH_NONE, .token = -1, .kv_progress = 1,
		.kv_blocks = sl->blk, .n_kv_blocks = sl->n_fed / KN_PAGE_BLK, .kv_positions = sl->n_fed,
	};

	sched_emit(s, sl->r->cb, sl->r->cb_arg, &ev);
}

const struct sched_held *sched_kv_hold(struct ctrl_sched *s, int32_t i)
{
	struct sched_slot *sl = &s->slots[i];
	struct sched_held *h = malloc(sizeof(*h) + sizeof(int32_t) * (size_t)sl->n_blk);

	if (h == NULL)
		return NULL;
	h->id = sl->r->id;
	h->n = sl->n_blk;
	memcpy(h->blk, sl->blk, sizeof(int32_t) * (size_t)sl->n_blk);
	h->next = s->held;
	s->held = h;
	s->n_held_blocks += h->n;
	s->reserved += h->n; /* the caller takes the request's own reservation back */
	return h;
}

static int32_t slot_of(const struct ctrl_sched *s, uint64_t id)
{
	for (int32_t i = 0; i < s->n_slots; i++)
		if (s->slots[i].r != NULL && s->slots[i].r->id == id)
			return i;
	return -1;
}

static void apply(struct ctrl_sched *s, const struct sched_kvmsg *m)
{
	struct sched_held **pp;
	int32_t i;

	if (m->kind == SCHED_KV_RELEASE) {
		for (pp = &s->held; *pp != NULL; pp = &(*pp)->next)
			if ((*pp)->id == m->id) {
				struct sched_held *h = *pp;

				*pp = h->next;
				sched_prefix_unref(s, h->blk, h->n); /* those the cache names stay with it */
				s->n_held_blocks -= h->n;
				s->reserved -= h->n;
				free(h);
				return;
			}
		s->st.kv_stale++;
		return;
	}
	i = slot_of(s, m->id);
	if (m->kind == SCHED_KV_LOCAL) {
		struct sched_req *w = i >= 0 ? NULL : sched_find_waiting(s, m->id);

		if (i >= 0 && s->slots[i].kv_wait) {
			/* its reserved blocks stay: the prompt is prefilled into them,
			 * with the first token when that went out already (as a
			 * replay does: the next one computed is the second) */
			if (s->slots[i].kv_first)
				s->slots[i].r->n_prompt = s->slots[i].n_toks;
			sched_kv_lost(s, s->slots[i].r);
			s->slots[i].kv_wait = 0;
			s->st.kv_waiting--;
			s->slots[i].n_fed = s->slots[i].n_sent = 0;
			s->slots[i].ready_at = s->launch_no;
		} else if (w != NULL && w->kv_remote) {
			sched_kv_lost(s, w); /* admitted later as a local request */
		} else {
			s->st.kv_stale++;
		}
		return;
	}
	if (i < 0 && m->kind == SCHED_KV_FAILED && sched_end_waiting(s, m->id, CTRL_FINISH_ERROR, m->why))
		return; /* failed before admission: it ends where it waits, not when admitted (it would wait
			 * there for KV no one sends, until its client left) */
	if (i < 0 || !s->slots[i].kv_wait) {
		s->st.kv_stale++; /* ended meanwhile (its blocks went back), or not waiting */
		return;
	}
	if (m->kind == SCHED_KV_FAILED) {
		sched_slot_finish(s, i, CTRL_FINISH_ERROR, -1, m->why);
		return;
	}
	const struct col_top top = { .n = m->n_top < s->slots[i].r->n_logprobs ? m->n_top : s->slots[i].r->n_logprobs,
				     .ids = m->top_ids, .lps = m->top_lps };

	if (m->kind == SCHED_KV_FIRST) {
		/* out now; the pages are still landing (it may end with it) */
		if (s->slots[i].kv_first) {
			s->st.kv_stale++;
			return;
		}
		s->slots[i].kv_first = 1;
		sched_slot_emit(s, i, m->token, m->logprob, top);
		return;
	}
	s->slots[i].kv_wait = 0;
	s->st.kv_waiting--;
	s->slots[i].n_fed = s->slots[i].n_sent = s->slots[i].r->n_prompt;
	s->slots[i].ready_at = s->launch_no;
	s->st.kv_imported++;
	if (!s->slots[i].kv_first) /* else its token went out already */
		sched_slot_emit(s, i, m->token, m->logprob, top);
}

int sched_kv_drain(struct ctrl_sched *s)
{
	struct sched_kvmsg *m, *head;
	int busy = 0;

	if (!atomic_exchange_explicit(&s->kv_any, 0, memory_order_acquire))
		return 0; /* nothing posted since the last drain: no lock taken */
	pthread_mutex_lock(&s->lock);
	head = s->kv_head;
	s->kv_head = s->kv_tail = NULL;
	pthread_mutex_unlock(&s->lock);
	while ((m = head) != NULL) {
		head = m->next;
		apply(s, m);
		free(m);
		busy = 1;
	}
	return busy;
}

void sched_kv_destroy(struct ctrl_sched *s)
{
	while (s->kv_head != NULL) {
		struct sched_kvmsg *m = s->kv_head;

		s->kv_head = m->next;
		free(m);
	}
	while (s->held != NULL) {
		struct sched_held *h = s->held;

		s->held = h->next;
		free(h);
	}
}
