/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The prefill end of a disaggregated request (ctrl_pd_xfer.h). A record per
 * room holds what has arrived of the two halves — the request's KV and first
 * token, and the decode node's manifest — and ships as the KV becomes final:
 * each prompt chunk that comes back from every stage makes its whole blocks
 * final (the scheduler's kv_progress), and those leave at once while the
 * rest of the prompt runs; the finish ships what is left, each stage's last
 * message flagged, then the status. A manifest may come before the
 * forwarded request does: its record then waits for the request (the
 * decode node's waiting timeout bounds it).
 *
 * With defer_ship the pages move on the ticking thread with the lock
 * released; the scheduler's thread may meanwhile report progress (it only
 * writes src past the range being shipped) or the finish (a record being
 * shipped is never freed under the shipper: it is marked and freed after).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrl_pd_xfer.h"
#include "kvf_clock.h"
#include "kvf_log.h"

struct pd_preq {
	struct pd_preq *next;
	uint64_t room;
	int64_t id;                /* the scheduler's, 0 until submitted */
	uint32_t node, session;    /* the decode node, and its registration (from the manifest) */
	uint32_t fwd_session;      /* the forward's kvferry_session (0: not said) */
	uint32_t *dst;             /* the manifest's blocks */
	uint32_t n_dst;
	int have_manifest;
	int32_t *src;              /* [cap_src] the prompt's blocks, the first n_avail known */
	int32_t cap_src, n_avail;  /* n_avail: blocks whose KV is final */
	int32_t n_src;             /* the finish: blocks the request holds (0: none) */
	int32_t n_shipped;         /* blocks sent, every stage */
	int finished;              /* the request ended */
	int held;                  /* it holds its KV in the scheduler (release at drop) */
	int aborted;               /* the decode node gave the room up: drop at the finish */
	int reported;              /* the status went out (a failed one may precede the finish) */
	int ready;                 /* defer_ship: there is something to ship, tick ships it */
	int shipping, doomed;      /* tick ships it with the lock released; drop it after */
	uint64_t kv_gen;           /* the chain's KV generation its first final blocks came under (0: none yet) */
	uint64_t t_held;           /* when the finished request's KV began to wait for its manifest */
	uint64_t t_sub;            /* when its prompt was submitted (CLOCK_MONOTONIC) */
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
#define PD_SESSIONS 64          /* decode nodes whose session is tracked */
#define PD_OVER_KEEP 64         /* sessions seen replaced, a ring */

struct ctrl_pd_prefill {
	struct ctrl_pd_prefill_opts o;
	struct pd_preq *reqs;
	struct ctrl_pd_prefill_stats st;
	uint64_t aborted[PD_ABORTED_KEEP]; /* rooms given up, a ring */
	uint32_t n_aborted;
	struct { uint32_t node, session; } cur[PD_SESSIONS]; /* each decode node's session, as its messages say */
	uint32_t n_cur;
	uint32_t over[PD_OVER_KEEP]; /* sessions a decode node replaced (it restarted): a ring */
	uint32_t n_over;
};

static int session_over(const struct ctrl_pd_prefill *p, uint32_t session)
{
	uint32_t n = p->n_over < PD_OVER_KEEP ? p->n_over : PD_OVER_KEEP;

	for (uint32_t i = 0; session != 0 && i < n; i++)
		if (p->over[i] == session)
			return 1;
	return 0;
}

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

/* Drop the record; blocks still held go back to the scheduler. A record
 * being shipped is dropped by its shipper when it is done. */
static void drop(struct ctrl_pd_prefill *p, struct pd_preq *q)
{
	if (q->shipping) {
		q->doomed = 1;
		return;
	}
	if (q->held && q->id > 0)
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

	q->reported = 1;
	if (len > 0)
		p->o.send(p->o.send_arg, q->node, buf, (size_t)len);
	if (failed)
		p->st.rooms_failed++;
	else
		p->st.rooms_done++;
}

/* Send blocks [from, to) of every stage (each stage's last message
 * flagged when @p last); touches nothing of the record but its stable
 * arrays, so it may run with the lock released. */
static int ship_pages(struct ctrl_pd_prefill *p, const struct pd_preq *q, int32_t from, int32_t to, int last,
		      char *err, size_t errlen)
{
	if (last && from == to && to > 0)
		from = to - 1; /* every stage's last message must go: send the last block again */
	return p->o.ship(p->o.ship_arg, q->node, q->room, q->session, q->src, q->dst, from, to, last, err, errlen);
}

/* The chain's KV generation now (0: not known: nothing follows from it). */
static uint64_t kv_gen(const struct ctrl_pd_prefill *p)
{
	return p->o.kv_gen != NULL ? p->o.kv_gen(p->o.kv_gen_arg) : 0;
}

/* Is @p q's KV gone with the stages it was computed on (they re-formed:
 * a worker that re-joined may be a new process with an empty pool)? Then
 * its room fails: no page of it may go (it would be garbage) and the decode
 * node computes the prompt itself. @return 1 if it failed. */
static int kv_gone(struct ctrl_pd_prefill *p, struct pd_preq *q)
{
	if (q->kv_gen == 0 || kv_gen(p) == q->kv_gen)
		return 0;
	if (!q->reported) {
		send_status(p, q, 1, "the prefill node's stages re-formed after computing this prompt (a stage "
			    "restarted): its KV is gone");
		p->st.kv_gone++;
		kvf_log(KVF_LOG_WARNING, "kvferry-ctrld", "PD: room %llu: the stages re-formed after its prompt's KV "
			"was computed (a stage may have restarted with an empty pool): its pages stop and its room "
			"fails, so the decode node computes the prompt itself", (unsigned long long)q->room);
	}
	return 1;
}

/* What a ship came to (the lock held): the blocks counted, and the status
 * once the last range went, or a failed one at the first error. */
static void shipped(struct ctrl_pd_prefill *p, struct pd_preq *q, int rc, int32_t to, int last, const char *err)
{
	if (rc < 0) {
		if (!q->reported)
			send_status(p, q, 1, err[0] ? err : strerror(-rc));
		return;
	}
	if (kv_gone(p, q)) /* the stages re-formed while the pages moved: what went may be garbage */
		return;
	if (to > q->n_shipped) {
		p->st.pages_shipped += (uint64_t)(to - q->n_shipped);
		q->n_shipped = to;
	}
	if (last && !q->reported) {
		uint64_t now = kvf_mono_ns();

		send_status(p, q, 0, NULL);
		if (q->t_sub != 0 && q->t_held >= q->t_sub && now >= q->t_held) {
			p->st.timed_rooms++;
			p->st.prefill_ns += q->t_held - q->t_sub;
			p->st.tail_ns += now - q->t_held;
		}
	}
}

/* Something of the room may go: ship it, or report why it cannot; with
 * defer_ship only mark it for ctrl_pd_prefill_tick. A record whose request
 * ended and whose status went out is dropped. */
static void advance(struct ctrl_pd_prefill *p, struct pd_preq *q)
{
	char err[256] = "";

	if (!q->have_manifest || q->shipping)
		return;
	if (!q->reported && kv_gone(p, q)) {
		if (q->finished)
			drop(p, q);
		return;
	}
	if (!q->reported) {
		if (q->finished && q->n_src == 0) {
			send_status(p, q, 1, q->why[0] ? q->why : "the prefill request ended without its KV");
		} else if ((q->finished && q->n_dst != (uint32_t)q->n_src) || q->n_dst < (uint32_t)q->n_avail) {
			snprintf(err, sizeof(err), "the manifest names %u blocks; the prompt's KV is %d blocks", q->n_dst,
				 (int)(q->finished ? q->n_src : q->cap_src));
			send_status(p, q, 1, err);
		} else if ((q->n_avail > q->n_shipped || q->finished) && p->o.defer_ship) {
			q->ready = 1;
			return;
		} else if (q->n_avail > q->n_shipped || q->finished) {
			int32_t to = q->n_avail;

			shipped(p, q, ship_pages(p, q, q->n_shipped, to, q->finished, err, sizeof(err)), to, q->finished, err);
		}
	}
	if (q->finished && q->reported)
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

	if ((ev->kv_progress || ev->finish != CTRL_FINISH_NONE) && q->kv_gen == 0)
		q->kv_gen = kv_gen(p); /* this event's blocks came back from the stages as they are now */
	if (ev->kv_progress) {
		int32_t n = ev->n_kv_blocks < q->cap_src ? ev->n_kv_blocks : q->cap_src;

		if (n > q->n_avail) { /* only past what a shipper may be reading */
			memcpy(q->src + q->n_avail, ev->kv_blocks + q->n_avail, sizeof(int32_t) * (size_t)(n - q->n_avail));
			q->n_avail = n;
			advance(p, q);
		}
		return;
	}
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
	if (ev->n_kv_blocks > 0 && ev->n_kv_blocks <= q->cap_src) {
		q->held = 1;
		if (ev->n_kv_blocks > q->n_avail)
			memcpy(q->src + q->n_avail, ev->kv_blocks + q->n_avail,
			       sizeof(int32_t) * (size_t)(ev->n_kv_blocks - q->n_avail));
		q->n_src = q->n_avail = ev->n_kv_blocks;
	} else if (ev->n_kv_blocks > 0) {
		ctrl_sched_kv_release(p->o.sched, ev->id);
		snprintf(q->why, sizeof(q->why), "the request held %d KV blocks; its prompt needs %d", (int)ev->n_kv_blocks,
			 (int)q->cap_src);
	} else {
		snprintf(q->why, sizeof(q->why), "the prefill request ended (%s)%s%s", ctrl_finish_name(ev->finish),
			 ev->message != NULL ? ": " : "", ev->message != NULL ? ev->message : "");
	}
	q->cb(q->cb_arg, ev);
	if (q->aborted)
		drop(p, q);
	else
		advance(p, q);
}

int64_t ctrl_pd_prefill_submit(struct ctrl_pd_prefill *p, const struct ctrl_request *rq, uint64_t room, uint32_t node)
{
	return ctrl_pd_prefill_submit_from(p, rq, room, node, 0);
}

int64_t ctrl_pd_prefill_submit_from(struct ctrl_pd_prefill *p, const struct ctrl_request *rq, uint64_t room,
				    uint32_t node, uint32_t session)
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
	if (q == NULL && session_over(p, session)) {
		p->st.refused_aborted++;
		return -ECANCELED; /* a forward of a decode node that has restarted since */
	}
	if (q == NULL && (q = new_req(p, room, node)) == NULL)
		return -ENOMEM;
	q->fwd_session = session;
	if (q->src == NULL) {
		q->cap_src = rq->n_prompt > 0 ? (rq->n_prompt - 1) / KN_PAGE_BLK + 1 : 1;
		q->src = malloc(sizeof(int32_t) * (size_t)q->cap_src);
		if (q->src == NULL) {
			if (!q->have_manifest)
				drop(p, q);
			return -ENOMEM;
		}
	}
	q->cb = rq->cb;
	q->cb_arg = rq->cb_arg;
	q->t_sub = kvf_mono_ns();
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

/* End room @p q as its decode node's abort would. */
static void give_up(struct ctrl_pd_prefill *p, struct pd_preq *q)
{
	if (!q->finished && q->id > 0) {
		/* still running: its finish event drops the record */
		q->aborted = 1;
		ctrl_sched_cancel(p->o.sched, (uint64_t)q->id);
	} else {
		drop(p, q);
	}
}

/*
 * Decode node @p node speaks with session @p session. If it spoke with
 * another before, it restarted (or was released and restored): the rooms
 * its old session forwarded whose manifest has not come never get one (the
 * new ctrld does not know them), so their KV goes back now, not after
 * hold_ns, and a late forward of that session is refused.
 */
static void note_session(struct ctrl_pd_prefill *p, uint32_t node, uint32_t session)
{
	uint32_t i, old, n = 0;

	for (i = 0; i < p->n_cur && p->cur[i].node != node; i++)
		;
	if (i == p->n_cur) {
		if (p->n_cur < PD_SESSIONS) {
			p->cur[p->n_cur].node = node;
			p->cur[p->n_cur++].session = session;
		}
		return;
	}
	old = p->cur[i].session;
	if (old == session || session == 0)
		return;
	p->cur[i].session = session;
	p->over[p->n_over++ % PD_OVER_KEEP] = old;
	for (struct pd_preq *q = p->reqs, *nx; q != NULL; q = nx) {
		nx = q->next;
		if (!q->have_manifest && q->fwd_session == old && !q->aborted) {
			give_up(p, q);
			n++;
		}
	}
	p->st.orphaned += n;
	if (n > 0)
		kvf_log(KVF_LOG_WARNING, "kvferry-ctrld", "PD: decode node %u speaks with a new session (it restarted): "
			"%u room(s) its old session forwarded will get no manifest: their KV given back", node, n);
}

void ctrl_pd_prefill_on_control(struct ctrl_pd_prefill *p, uint32_t node, const uint8_t *buf, size_t len)
{
	struct ctrl_pd_msg m;
	struct pd_preq *q;

	if (ctrl_pd_msg_parse(buf, len, &m, NULL, 0) < 0) {
		p->st.malformed++;
		return;
	}
	note_session(p, node, m.session);
	q = by_room(p, m.room);
	if (m.kind == CTRL_PD_ABORT) {
		uint8_t ack[CTRL_PD_MSG_HDR + 16];
		int n = ctrl_pd_encode_abort_ack(ack, sizeof(ack), m.room, m.session, p->o.rank);

		p->st.aborts++;
		p->aborted[p->n_aborted++ % PD_ABORTED_KEEP] = m.room;
		if (q != NULL)
			give_up(p, q);
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
	advance(p, q);
}

/* Ship one ready record's range with the lock released (the pages move
 * while the scheduler goes on). Only the caller's thread ships, so nothing
 * else ships @p q meanwhile; a drop meanwhile only marks it (doomed). */
static void ship_unlocked(struct ctrl_pd_prefill *p, struct pd_preq *q)
{
	int32_t from = q->n_shipped, to = q->n_avail;
	int last = q->finished, rc;
	char err[256] = "";

	q->ready = 0;
	q->shipping = 1;
	if (p->o.lock != NULL)
		pthread_mutex_unlock(p->o.lock);
	rc = ship_pages(p, q, from, to, last, err, sizeof(err));
	if (p->o.lock != NULL)
		pthread_mutex_lock(p->o.lock);
	q->shipping = 0;
	shipped(p, q, rc, to, last, err);
	if (q->doomed)
		drop(p, q);
	else
		advance(p, q); /* more became final meanwhile, or the finish came */
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

int ctrl_pd_prefill_fail_all(struct ctrl_pd_prefill *p, const char *why)
{
	struct pd_preq *q, *next;
	int n = 0;

	(void)why; /* no status: see the header */
	for (q = p->reqs; q != NULL; q = next) {
		next = q->next;
		if (q->doomed || !q->have_manifest)
			continue; /* a room whose manifest has not come may still get it over the new session */
		n++;
		p->st.rooms_failed++;
		p->aborted[p->n_aborted++ % PD_ABORTED_KEEP] = q->room;
		if (!q->finished && q->id > 0) {
			q->aborted = 1; /* its finish event drops the record */
			ctrl_sched_cancel(p->o.sched, (uint64_t)q->id);
		} else {
			drop(p, q); /* held KV goes back (a record being shipped only marked) */
		}
	}
	return n;
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
						  .blocks = q->finished ? q->n_src : q->n_avail };

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
