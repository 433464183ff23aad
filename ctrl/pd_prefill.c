/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The prefill end of a disaggregated request (ctrl_pd_xfer.h). A record per
 * room holds what has arrived of the two halves — the request's first token
 * and held blocks, and the decode node's manifest — and ships when both are
 * in. A manifest may come before the forwarded request does: its record
 * then waits for the request (the decode node's waiting timeout bounds it).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrl_pd_xfer.h"
#include "kvf_clock.h"

struct pd_preq {
	struct pd_preq *next;
	uint64_t room;
	int64_t id;                /* the scheduler's, 0 until submitted */
	uint32_t node, session;    /* the decode node, and its registration (from the manifest) */
	uint32_t *dst;             /* the manifest's blocks */
	uint32_t n_dst;
	int have_manifest;
	int32_t *src;              /* the blocks the finished request holds */
	int32_t n_src;
	int finished;              /* the request ended (src set when it holds its KV) */
	int aborted;               /* the decode node gave the room up: drop at the finish */
	int ready;                 /* defer_ship: both halves in, tick ships it */
	uint64_t t_held;           /* when the finished request's KV began to wait for its manifest */
	int32_t first_token;
	float first_lp;            /* its logprob and the top logprobs at its position */
	int32_t n_top;
	int32_t top_ids[CTRL_PD_MAX_TOP];
	float top_lps[CTRL_PD_MAX_TOP];
	char why[256];             /* the request failed: why */
	ctrl_token_cb cb;
	void *cb_arg;
	struct ctrl_pd_prefill *p;
};

#define PD_ABORTED_KEEP 1024

struct ctrl_pd_prefill {
	struct ctrl_pd_prefill_opts o;
	struct pd_preq *reqs;
	struct ctrl_pd_prefill_stats st;
	uint64_t aborted[PD_ABORTED_KEEP]; /* rooms given up, a ring */
	uint32_t n_aborted;
};

static int was_aborted(const struct ctrl_pd_prefill *p, uint64_t room)
{
	uint32_t n = p->n_aborted < PD_ABORTED_KEEP ? p->n_aborted : PD_ABORTED_KEEP;

	for (uint32_t i = 0; i < n; i++)
		if (p->aborted[i] == room)
			return 1;
	return 0;
}

struct ctrl_pd_prefill *ctrl_pd_prefill_create(const struct ctrl_pd_prefill_opts *o)
{
	struct ctrl_pd_prefill *p;

	if (o == NULL || o->sched == NULL || o->send == NULL || o->ship == NULL) {
		errno = EINVAL;
		return NULL;
	}
	p = calloc(1, sizeof(*p));
	if (p == NULL)
		return NULL;
	p->o = *o;
	if (p->o.hold_ns == 0)
		p->o.hold_ns = 300ull * 1000000000ull;
	return p;
}

static struct pd_preq *by_room(struct ctrl_pd_prefill *p, uint64_t room)
{
	for (struct pd_preq *q = p->reqs; q != NULL; q = q->next)
		if (q->room == room)
			return q;
	return NULL;
}

static struct pd_preq *new_req(struct ctrl_pd_prefill *p, uint64_t room, uint32_t node)
{
	struct pd_preq *q = calloc(1, sizeof(*q));

	if (q == NULL)
		return NULL;
	q->room = room;
	q->node = node;
	q->first_token = -1;
	q->p = p;
	q->next = p->reqs;
	p->reqs = q;
	return q;
}

/* Drop the record; blocks still held go back to the scheduler. */
static void drop(struct ctrl_pd_prefill *p, struct pd_preq *q)
{
	if (q->src != NULL && q->id > 0)
		ctrl_sched_kv_release(p->o.sched, (uint64_t)q->id);
	for (struct pd_preq **pp = &p->reqs; *pp != NULL; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	free(q->dst);
	free(q->src);
	free(q);
}

static void send_status(struct ctrl_pd_prefill *p, struct pd_preq *q, int failed, const char *text)
{
	uint8_t buf[CTRL_PD_MSG_HDR + 32 + CTRL_PD_MAX_TEXT + 8 * CTRL_PD_MAX_TOP];
	int len = ctrl_pd_encode_status_top(buf, sizeof(buf), q->room, q->session, p->o.rank, failed,
					    failed ? -1 : q->first_token, 0, text, failed ? 0.0f : q->first_lp,
					    failed ? 0 : (uint32_t)q->n_top, q->top_ids, q->top_lps);

	if (len > 0)
		p->o.send(p->o.send_arg, q->node, buf, (size_t)len);
	if (failed)
		p->st.rooms_failed++;
	else
		p->st.rooms_done++;
}

/* Both halves in: ship the pages and report, or report why not. With
 * defer_ship the record is only marked: ctrl_pd_prefill_tick ships it. */
static void try_ship(struct ctrl_pd_prefill *p, struct pd_preq *q)
{
	char err[256] = "";
	int rc;

	if (!q->have_manifest || !q->finished)
		return;
	if (p->o.defer_ship && q->src != NULL && q->n_dst == (uint32_t)q->n_src) {
		q->ready = 1;
		return;
	}
	if (q->src == NULL) {
		send_status(p, q, 1, q->why[0] ? q->why : "the prefill request ended without its KV");
	} else if (q->n_dst != (uint32_t)q->n_src) {
		snprintf(err, sizeof(err), "the manifest names %u blocks; the prompt's KV is %d blocks", q->n_dst,
			 (int)q->n_src);
		send_status(p, q, 1, err);
	} else if ((rc = p->o.ship(p->o.ship_arg, q->node, q->room, q->session, q->src, q->dst, q->n_src, err,
				   sizeof(err))) < 0) {
		send_status(p, q, 1, err[0] ? err : strerror(-rc));
	} else {
		p->st.pages_shipped += (uint64_t)q->n_src;
		send_status(p, q, 0, NULL);
	}
	drop(p, q);
}

static void on_event_locked(struct pd_preq *q, const struct ctrl_event *ev);

static void on_event(void *arg, const struct ctrl_event *ev)
{
	struct pd_preq *q = arg;
	pthread_mutex_t *lock = q->p->o.lock;

	if (lock != NULL)
		pthread_mutex_lock(lock);
	on_event_locked(q, ev);
	if (lock != NULL)
		pthread_mutex_unlock(lock);
}

static void on_event_locked(struct pd_preq *q, const struct ctrl_event *ev)
{
	struct ctrl_pd_prefill *p = q->p;

	if (ev->finish == CTRL_FINISH_NONE) {
		q->first_token = ev->token;
		q->first_lp = ev->logprob;
		q->n_top = ev->n_top > CTRL_PD_MAX_TOP ? CTRL_PD_MAX_TOP : ev->n_top;
		for (int32_t i = 0; i < q->n_top && ev->top_ids != NULL; i++) {
			q->top_ids[i] = ev->top_ids[i];
			q->top_lps[i] = ev->top_logprobs[i];
		}
		q->cb(q->cb_arg, ev);
		return;
	}
	q->finished = 1;
	q->t_held = kvf_mono_ns();
	if (ev->n_kv_blocks > 0) {
		q->src = malloc(sizeof(int32_t) * (size_t)ev->n_kv_blocks);
		if (q->src != NULL) {
			memcpy(q->src, ev->kv_blocks, sizeof(int32_t) * (size_t)ev->n_kv_blocks);
			q->n_src = ev->n_kv_blocks;
		} else {
			ctrl_sched_kv_release(p->o.sched, ev->id);
			snprintf(q->why, sizeof(q->why), "out of memory keeping the prompt's block list");
		}
	} else {
		snprintf(q->why, sizeof(q->why), "the prefill request ended (%s)%s%s", ctrl_finish_name(ev->finish),
			 ev->message != NULL ? ": " : "", ev->message != NULL ? ev->message : "");
	}
	q->cb(q->cb_arg, ev);
	if (q->aborted)
		drop(p, q);
	else
		try_ship(p, q);
}

int64_t ctrl_pd_prefill_submit(struct ctrl_pd_prefill *p, const struct ctrl_request *rq, uint64_t room, uint32_t node)
{
	struct pd_preq *q = by_room(p, room);
	struct ctrl_request mine;
	int64_t id;

	if (rq == NULL || rq->cb == NULL)
		return -EINVAL;
	if (q != NULL && q->id != 0)
		return -EEXIST;
	if (q == NULL && was_aborted(p, room)) {
		p->st.refused_aborted++;
		return -ECANCELED; /* the decode node gave this room up before its prompt came */
	}
	if (q == NULL && (q = new_req(p, room, node)) == NULL)
		return -ENOMEM;
	q->cb = rq->cb;
	q->cb_arg = rq->cb_arg;
	mine = *rq;
	mine.max_tokens = 1;
	mine.hold_kv = 1;
	mine.kv_remote = 0;
	mine.cb = on_event;
	mine.cb_arg = q;
	id = ctrl_sched_submit(p->o.sched, &mine);
	if (id < 0) {
		q->cb = NULL;
		if (!q->have_manifest)
			drop(p, q);
		return id;
	}
	q->id = id;
	return id;
}

void ctrl_pd_prefill_on_control(struct ctrl_pd_prefill *p, uint32_t node, const uint8_t *buf, size_t len)
{
	struct ctrl_pd_msg m;
	struct pd_preq *q;

	if (ctrl_pd_msg_parse(buf, len, &m, NULL, 0) < 0) {
		p->st.malformed++;
		return;
	}
	q = by_room(p, m.room);
	if (m.kind == CTRL_PD_ABORT) {
		uint8_t ack[CTRL_PD_MSG_HDR + 16];
		int n = ctrl_pd_encode_abort_ack(ack, sizeof(ack), m.room, m.session, p->o.rank);

		p->st.aborts++;
		p->aborted[p->n_aborted++ % PD_ABORTED_KEEP] = m.room;
		if (q != NULL && !q->finished && q->id > 0) {
			/* still running: its finish event drops the record */
			q->aborted = 1;
			ctrl_sched_cancel(p->o.sched, (uint64_t)q->id);
		} else if (q != NULL) {
			drop(p, q);
		}
		if (n > 0)
			p->o.send(p->o.send_arg, node, ack, (size_t)n);
		return;
	}
	if (m.kind != CTRL_PD_MANIFEST) {
		p->st.malformed++;
		return;
	}
	if (q == NULL && (q = new_req(p, m.room, node)) == NULL)
		return; /* out of memory: the decode node's waiting timeout ends the room */
	if (q->have_manifest) {
		p->st.malformed++; /* a second manifest for the room: the first stands */
		return;
	}
	q->dst = malloc(sizeof(uint32_t) * (m.n_blocks ? m.n_blocks : 1));
	if (q->dst == NULL)
		return;
	for (uint32_t i = 0; i < m.n_blocks; i++)
		q->dst[i] = ctrl_pd_msg_block(&m, i);
	q->n_dst = m.n_blocks;
	q->session = m.session;
	q->node = node;
	q->have_manifest = 1;
	try_ship(p, q);
}

/* Ship one ready record with the lock released (the pages move while the
 * scheduler goes on). Only the caller's thread ships, aborts and expires
 * records, so @p q outlives the unlocked part; other threads may add or
 * drop others meanwhile. */
static void ship_unlocked(struct ctrl_pd_prefill *p, struct pd_preq *q)
{
	char err[256] = "";
	int rc;

	q->ready = 0;
	if (p->o.lock != NULL)
		pthread_mutex_unlock(p->o.lock);
	rc = p->o.ship(p->o.ship_arg, q->node, q->room, q->session, q->src, q->dst, q->n_src, err, sizeof(err));
	if (p->o.lock != NULL)
		pthread_mutex_lock(p->o.lock);
	if (rc < 0) {
		send_status(p, q, 1, err[0] ? err : strerror(-rc));
	} else {
		p->st.pages_shipped += (uint64_t)q->n_src;
		send_status(p, q, 0, NULL);
	}
	drop(p, q);
}

void ctrl_pd_prefill_tick(struct ctrl_pd_prefill *p, uint64_t now_ns)
{
	struct pd_preq *q, *next;

	for (int more = 1; more;) {
		more = 0;
		for (q = p->reqs; q != NULL; q = q->next)
			if (q->ready) {
				ship_unlocked(p, q);
				more = 1; /* the list may have changed meanwhile: walk it again */
				break;
			}
	}
	for (q = p->reqs; q != NULL; q = next) {
		next = q->next;
		/* a room that finished while a ship had the lock released may be
		 * newer than now_ns */
		if (q->finished && !q->have_manifest && now_ns > q->t_held && now_ns - q->t_held > p->o.hold_ns) {
			p->st.expired++;
			drop(p, q); /* gives the held blocks back */
		}
	}
}

void ctrl_pd_prefill_stats(const struct ctrl_pd_prefill *p, struct ctrl_pd_prefill_stats *st)
{
	*st = p->st;
}

void ctrl_pd_prefill_rooms(const struct ctrl_pd_prefill *p,
			   void (*fn)(void *arg, const struct ctrl_pd_prefill_view *v), void *arg)
{
	for (const struct pd_preq *q = p->reqs; q != NULL; q = q->next) {
		struct ctrl_pd_prefill_view v = { .room = q->room, .id = q->id, .node = q->node,
						  .have_manifest = q->have_manifest, .prefilled = q->finished,
						  .blocks = q->n_src };

		fn(arg, &v);
	}
}

void ctrl_pd_prefill_destroy(struct ctrl_pd_prefill *p)
{
	if (p == NULL)
		return;
	while (p->reqs != NULL) {
		struct pd_preq *q = p->reqs;

		p->reqs = q->next;
		free(q->dst);
		free(q->src);
		free(q);
	}
	free(p);
}
