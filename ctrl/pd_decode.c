/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The decode end of a disaggregated request (ctrl_pd_xfer.h): room, manifest,
 * status and page streams around one kv_remote scheduler request.
 *
 * A request's record lives from submit to its finish event. The room is the
 * rooms table's (ctrl_pd.h keeps its promises: monotonic states, Failed
 * wins, forgotten rooms stay forgotten); the record adds what the table does
 * not know: which scheduler request the room feeds, how many page streams
 * are still out, and whether the scheduler was told. Records are few (one
 * per request in flight) and found by a linear walk.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrl_pd_xfer.h"
#include "kvf_clock.h"

struct pd_dreq {
	struct pd_dreq *next;
	uint64_t room, id;
	uint32_t node, n_ranks;
	int32_t streams_left;
	uint64_t bytes_landed;
	uint64_t t_page0, t_page1; /* CLOCK_MONOTONIC of its first and last page message */
	uint64_t t_sub, t_manifest, t_status; /* CLOCK_MONOTONIC: submitted, manifest out, Success */
	struct pd_stream {
		uint32_t blocks;   /* blocks its messages brought */
		uint8_t last, landed;
	} *landed;                 /* [n_streams] */
	uint32_t n_blocks;         /* the manifest's */
	int told;                  /* the scheduler heard ready or failed */
	uint64_t t_ok;             /* when the room succeeded with streams still out (tick's clock) */
	uint64_t t_open;           /* the caller's clock at submit */
	uint64_t peer_epoch;       /* the prefill node's dataplane's epoch as the room opened (0: not known yet) */
	int32_t *blocks;           /* the manifest's blocks (the request's reserved pages), NULL before */
	uint32_t retries;          /* fresh rooms it ran in after its room was lost */
	uint64_t t_lost;           /* a page message could not land (this node's stages were down):
	                              never told ready; the scheduler replays it here (kv_lost),
	                              or it fails PD_LOST_WAIT_NS later (tick's clock) */
	char lost_why[160];
	int ok_seen;
	int first_out;             /* first_early: the scheduler emitted the first token at Success */
	int have_lp;               /* the first token's logprobs came with a status */
	float first_lp;
	int32_t n_top;
	int32_t top_ids[CTRL_PD_MAX_TOP];
	float top_lps[CTRL_PD_MAX_TOP];
	ctrl_token_cb cb;
	void *cb_arg;
	struct ctrl_pd_decode *d;
};

const char *const ctrl_pd_phase_names[CTRL_PD_PHASES] = { "manifest", "first_page", "last_page", "status",
							   "ready" };

/* Rooms given up lately (their aborts sent), to send again once this node's
 * dataplane is back: one sent while it was dead went nowhere, and the
 * prefill node would hold the room's KV until its hold timeout. */
#define PD_GONE_KEEP 4096
#define PD_GONE_NS 30000000000ull

struct pd_gone {
	uint64_t room, t;
	uint32_t node, n_ranks;
};

struct ctrl_pd_decode {
	struct ctrl_pd_decode_opts o;
	struct pd_dreq *reqs;
	struct ctrl_pd_decode_stats st;
	uint64_t now;              /* the caller's clock, as of its last submit or tick */
	struct pd_gone gone[PD_GONE_KEEP]; /* a ring */
	uint32_t n_gone;
};

struct ctrl_pd_decode *ctrl_pd_decode_create(const struct ctrl_pd_decode_opts *o)
{
	struct ctrl_pd_decode *d;

	if (o == NULL || o->sched == NULL || o->rooms == NULL || o->send == NULL || o->n_streams < 1) {
		errno = EINVAL;
		return NULL;
	}
	d = calloc(1, sizeof(*d));
	if (d == NULL)
		return NULL;
	d->o = *o;
	if (d->o.landing_ns == 0)
		d->o.landing_ns = 30ull * 1000000000ull;
	return d;
}

static struct pd_dreq *by_room(struct ctrl_pd_decode *d, uint64_t room)
{
	for (struct pd_dreq *q = d->reqs; q != NULL; q = q->next)
		if (q->room == room)
			return q;
	return NULL;
}

static void unlink_req(struct ctrl_pd_decode *d, struct pd_dreq *q)
{
	for (struct pd_dreq **pp = &d->reqs; *pp != NULL; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	free(q->landed);
	free(q->blocks);
	free(q);
}

/* End @p q's request in the scheduler with @p why, naming its room and node. */
static void tell_failed(struct ctrl_pd_decode *d, struct pd_dreq *q, const char *why)
{
	char msg[320], num[16];
	const char *name = d->o.node_name != NULL ? d->o.node_name(d->o.node_arg, q->node) : NULL;

	snprintf(num, sizeof(num), "%u", q->node);
	snprintf(msg, sizeof(msg), "room %llu (prefill node %s): %s", (unsigned long long)q->room, name != NULL ? name : num,
		 why);
	if (ctrl_sched_kv_failed(d->o.sched, q->id, msg) == 0) {
		q->told = 1;
		d->st.rooms_failed++;
	}
}

/* Tell the scheduler what the room came to, once: ready when it succeeded
 * and every stream landed, failed when it failed. */
static void settle(struct ctrl_pd_decode *d, struct pd_dreq *q)
{
	enum ctrl_room_state rs;
	int32_t first = -1;
	const char *why = NULL;

	if (q->told || ctrl_room_get(d->o.rooms, q->room, &rs, &first, &why) < 0)
		return;
	if (rs == CTRL_ROOM_FAILED) {
		tell_failed(d, q, why);
	} else if (rs == CTRL_ROOM_SUCCESS && q->t_status == 0) {
		q->t_status = kvf_mono_ns();
	}
	/* the first token need not wait for the last pages: out now */
	if (rs == CTRL_ROOM_SUCCESS && d->o.first_early && !q->first_out && q->t_lost == 0
	    && ctrl_sched_kv_first(d->o.sched, q->id, first, q->first_lp, q->n_top, q->top_ids, q->top_lps) == 0)
		q->first_out = 1;
	if (rs == CTRL_ROOM_SUCCESS && q->streams_left == 0 && q->t_lost == 0) {
		if (ctrl_sched_kv_ready(d->o.sched, q->id, first, q->first_lp, q->n_top, q->top_ids, q->top_lps) == 0)
			q->told = 1;
		d->st.rooms_ok += q->told;
		if (q->told && q->t_manifest != 0 && q->t_page0 != 0) {
			const uint64_t at[CTRL_PD_PHASES] = { q->t_manifest, q->t_page0, q->t_page1, q->t_status,
							      kvf_mono_ns() };

			d->st.phase_rooms++;
			for (int k = 0; k < CTRL_PD_PHASES; k++)
				d->st.phase_ns[k] += at[k] > q->t_sub ? at[k] - q->t_sub : 0;
		}
		if (q->told && q->t_page1 > q->t_page0) {
			d->st.xfer_rooms++;
			d->st.xfer_bytes += q->bytes_landed;
			d->st.xfer_ns += q->t_page1 - q->t_page0;
		}
	}
}

/* The room's pages may land (@p open) or no longer may (see ctrl_pd_decode_opts.gate). */
static int gate(struct ctrl_pd_decode *d, uint64_t room, int open)
{
	return d->o.gate != NULL ? d->o.gate(d->o.gate_arg, room, d->o.session, open) : 0;
}

/* Forget a room: no late page, status or admission brings it back. */
static void forget(struct ctrl_pd_decode *d, uint64_t room)
{
	gate(d, room, 0);
	ctrl_room_forget(d->o.rooms, room);
}

static void send_all(struct ctrl_pd_decode *d, struct pd_dreq *q, int abort, const int32_t *blocks, int32_t n)
{
	uint8_t small[CTRL_PD_MSG_HDR + 16 + CTRL_PD_MAX_TEXT];
	size_t cap = abort ? sizeof(small) : ctrl_pd_manifest_size((uint32_t)n);
	uint8_t *buf = abort ? small : malloc(cap);
	uint32_t *dst = abort ? NULL : malloc(sizeof(uint32_t) * (size_t)n);

	if (buf == NULL || (!abort && dst == NULL)) {
		ctrl_room_fail(d->o.rooms, q->room, "out of memory building the page manifest");
		goto out;
	}
	for (int32_t i = 0; !abort && i < n; i++)
		dst[i] = (uint32_t)blocks[i];
	if (!abort && gate(d, q->room, 1) < 0) {
		ctrl_room_fail(d->o.rooms, q->room, "no free slot in the rooms area the stages land pages by "
			       "(more rooms in flight than it holds)");
		goto out;
	}
	for (uint32_t r = 0; r < q->n_ranks; r++) {
		int len = abort ? ctrl_pd_encode_abort(buf, cap, q->room, d->o.session, r, "the request ended")
				: ctrl_pd_encode_manifest(buf, cap, q->room, d->o.session, r, 0, dst, (uint32_t)n);
		char why[160];

		if (len < 0 || d->o.send(d->o.send_arg, q->node, buf, (size_t)len) < 0) {
			snprintf(why, sizeof(why), "could not send the %s to prefill rank %u", abort ? "abort" : "manifest",
				 r);
			if (!abort)
				ctrl_room_fail(d->o.rooms, q->room, why);
			break;
		}
		if (abort)
			d->st.aborts_sent++;
		else
			d->st.manifests_sent++;
	}
	if (abort)
		d->gone[d->n_gone++ % PD_GONE_KEEP] = (struct pd_gone){ .room = q->room, .t = kvf_mono_ns(),
								       .node = q->node, .n_ranks = q->n_ranks };
out:
	if (!abort)
		free(buf);
	free(dst);
}

/* The scheduler's events for a disaggregated request. */
static void on_event_locked(struct pd_dreq *q, const struct ctrl_event *ev);

static void on_event(void *arg, const struct ctrl_event *ev)
{
	struct pd_dreq *q = arg;
	pthread_mutex_t *lock = q->d->o.lock;

	/* Token events take the lock too, though they touch no room state:
	 * on the H200 (1B, ship_chunk 256, pd-bench's mixed load, A/B in one
	 * run, twice) passing them by the lock made the decode node slower —
	 * ITL p50 4.1-4.2 -> 5.2-5.4 ms, 1335-1408 -> 1092-1121 tok/s, the
	 * long prompts' TTFT 310 -> 410 ms. Not understood yet (the poller's
	 * page imports then meet decode steps at every step's edge?). */
	if (lock != NULL)
		pthread_mutex_lock(lock);
	on_event_locked(q, ev);
	if (lock != NULL)
		pthread_mutex_unlock(lock);
}

static void on_event_locked(struct pd_dreq *q, const struct ctrl_event *ev)
{
	struct ctrl_pd_decode *d = q->d;
	enum ctrl_room_state rs;

	if (ev->kv_reserved) {
		/* the pages are ours: every rank learns where to write them (a
		 * room that failed meanwhile, e.g. its node was lost, sends none) */
		if (ctrl_room_get(d->o.rooms, q->room, &rs, NULL, NULL) == 0 && rs == CTRL_ROOM_BOOTSTRAPPING) {
			ctrl_room_bootstrapped(d->o.rooms, q->room);
			q->n_blocks = (uint32_t)ev->n_kv_blocks;
			free(q->blocks); /* kept: a fresh room (retry) sends the same manifest */
			q->blocks = malloc(sizeof(int32_t) * (size_t)(ev->n_kv_blocks > 0 ? ev->n_kv_blocks : 1));
			if (q->blocks != NULL && ev->n_kv_blocks > 0)
				memcpy(q->blocks, ev->kv_blocks, sizeof(int32_t) * (size_t)ev->n_kv_blocks);
			q->t_manifest = kvf_mono_ns();
			send_all(d, q, 0, ev->kv_blocks, ev->n_kv_blocks);
			if (ctrl_room_get(d->o.rooms, q->room, &rs, NULL, NULL) == 0 && rs == CTRL_ROOM_BOOTSTRAPPED)
				ctrl_room_waiting_since(d->o.rooms, q->room, d->now); /* the waiting timeout starts */
		}
		settle(d, q);
		return;
	}
	if (ev->kv_lost) {
		/* this node's stages went down under it: it runs again here from
		 * its prompt (the scheduler's replay), its reserved blocks went
		 * back. The room is given up (its ranks told, where it can still
		 * land) and forgotten: no late page or status reaches those
		 * blocks, which another request may have now */
		if (ctrl_room_get(d->o.rooms, q->room, &rs, NULL, NULL) == 0 && rs != CTRL_ROOM_SUCCESS)
			send_all(d, q, 1, NULL, 0);
		forget(d, q->room);
		q->told = 1;
		free(q->blocks);
		q->blocks = NULL;
		q->n_blocks = 0;
		d->st.replayed_here++;
		return;
	}
	if (ev->finish != CTRL_FINISH_NONE) {
		/* ended without its pages (cancelled, failed, expired): the ranks
		 * free their side; the room is forgotten either way, so nothing
		 * late revives it */
		if (ctrl_room_get(d->o.rooms, q->room, &rs, NULL, NULL) == 0 && rs != CTRL_ROOM_SUCCESS) {
			send_all(d, q, 1, NULL, 0);
			ctrl_room_fail(d->o.rooms, q->room, "the request ended first");
		}
		forget(d, q->room);
		q->cb(q->cb_arg, ev);
		unlink_req(d, q);
		return;
	}
	q->cb(q->cb_arg, ev);
}

int64_t ctrl_pd_decode_submit(struct ctrl_pd_decode *d, const struct ctrl_request *rq, uint64_t room, uint32_t node,
			      uint32_t n_ranks, uint64_t now_ns)
{
	struct ctrl_request mine;
	struct pd_dreq *q;
	int64_t id;
	int rc;

	if (rq == NULL || rq->cb == NULL)
		return -EINVAL;
	q = calloc(1, sizeof(*q));
	if (q == NULL || (q->landed = calloc((size_t)d->o.n_streams, sizeof(*q->landed))) == NULL) {
		free(q);
		return -ENOMEM;
	}
	d->now = now_ns;
	rc = ctrl_room_open(d->o.rooms, room, node, n_ranks, now_ns);
	if (rc < 0) {
		free(q->landed);
		free(q);
		return rc;
	}
	q->room = room;
	q->node = node;
	q->t_open = now_ns;
	if (d->o.peer_state != NULL) {
		uint64_t silent_ms;

		if (d->o.peer_state(d->o.peer_arg, node, &q->peer_epoch, &silent_ms) < 0)
			q->peer_epoch = 0;
	}
	q->t_sub = kvf_mono_ns();
	q->n_ranks = n_ranks;
	q->streams_left = d->o.n_streams;
	q->cb = rq->cb;
	q->cb_arg = rq->cb_arg;
	q->d = d;
	mine = *rq;
	mine.kv_remote = 1;
	mine.hold_kv = 0;
	mine.cb = on_event;
	mine.cb_arg = q;
	q->next = d->reqs;
	d->reqs = q;
	id = ctrl_sched_submit(d->o.sched, &mine);
	if (id < 0) {
		ctrl_room_forget(d->o.rooms, room);
		unlink_req(d, q);
		return id;
	}
	q->id = (uint64_t)id;
	d->st.rooms_opened++;
	return id;
}

void ctrl_pd_decode_on_control(struct ctrl_pd_decode *d, const uint8_t *buf, size_t len)
{
	struct ctrl_pd_msg m;
	struct pd_dreq *q;

	int parsed = ctrl_pd_msg_parse(buf, len, &m, NULL, 0) == 0;

	if (parsed && m.kind == CTRL_PD_ABORT_ACK)
		return; /* the rank freed its side: nothing of ours waits for it */
	if (parsed && m.kind == CTRL_PD_STATUS && m.failed && m.session == d->o.session
	    && (q = by_room(d, m.room)) != NULL && d->o.compute_here) {
		/* the prefill rank could not do it (its chain failed the prompt,
		 * or the pages): this node computes the prompt instead, with the
		 * same tokens, rather than failing the client */
		char why[200];

		snprintf(why, sizeof(why), "prefill rank %u failed the room: %.*s", m.rank, (int)m.text_len, m.text);
		if (ctrl_pd_decode_compute_here(d, m.room, why) == 0) {
			d->st.msg.applied++;
			return;
		}
	}
	ctrl_pd_status_apply(d->o.rooms, d->o.session, buf, len, &d->st.msg); /* counts what it refuses */
	/* applied, or a status that failed its room (a rank it does not expect) */
	if (parsed && m.session == d->o.session && (q = by_room(d, m.room)) != NULL) {
		if (m.kind == CTRL_PD_STATUS && !m.failed && m.first_token >= 0 && !q->have_lp) {
			/* the first valid token wins, as in the room: its logprobs with it */
			q->have_lp = 1;
			q->first_lp = m.first_logprob;
			q->n_top = (int32_t)m.n_top;
			for (uint32_t i = 0; i < m.n_top; i++)
				ctrl_pd_msg_top(&m, i, &q->top_ids[i], &q->top_lps[i]);
		}
		settle(d, q);
	}
}

void ctrl_pd_decode_on_pages(struct ctrl_pd_decode *d, uint64_t room, uint32_t session, int32_t stream, int last,
			     uint32_t n_blocks, uint64_t bytes)
{
	struct pd_dreq *q = by_room(d, room);

	if (q == NULL || session != d->o.session || stream < 0 || stream >= d->o.n_streams || q->told) {
		d->st.stale_pages++;
		return;
	}
	q->bytes_landed += bytes;
	q->t_page1 = kvf_mono_ns();
	if (q->t_page0 == 0)
		q->t_page0 = q->t_page1;
	q->landed[stream].blocks += n_blocks;
	q->landed[stream].last |= last != 0;
	if (q->landed[stream].last && q->landed[stream].blocks >= q->n_blocks && !q->landed[stream].landed) {
		q->landed[stream].landed = 1;
		q->streams_left--;
	}
	settle(d, q);
}

/* End @p q's request with @p why whatever its room says (a room whose ranks
 * all reported can still miss its pages). */
static void fail_req(struct ctrl_pd_decode *d, struct pd_dreq *q, const char *why)
{
	enum ctrl_room_state rs;

	if (q->told)
		return;
	ctrl_room_fail(d->o.rooms, q->room, why);
	if (ctrl_room_get(d->o.rooms, q->room, &rs, NULL, NULL) == 0 && rs == CTRL_ROOM_FAILED) {
		settle(d, q);
		return;
	}
	tell_failed(d, q, why); /* Success already: the statuses came, the pages will not */
}

/* How long a request whose pages could not land waits for the scheduler's
 * replay (kv_lost) before it fails: the stages' fall reaches the scheduler
 * within a poll; this bounds the case where they re-formed before it looked. */
#define PD_LOST_WAIT_NS 5000000000ull

void ctrl_pd_decode_pages_lost(struct ctrl_pd_decode *d, uint64_t room, const char *why)
{
	struct pd_dreq *q = by_room(d, room);

	if (q == NULL || q->told || q->t_lost != 0)
		return;
	q->t_lost = d->now != 0 ? d->now : 1;
	snprintf(q->lost_why, sizeof(q->lost_why), "%s", why != NULL ? why : "");
	d->st.pages_lost++;
}

int ctrl_pd_decode_compute_here(struct ctrl_pd_decode *d, uint64_t room, const char *why)
{
	struct pd_dreq *q = by_room(d, room);
	enum ctrl_room_state rs;

	if (q == NULL || q->told || q->t_lost != 0 || ctrl_room_get(d->o.rooms, q->room, &rs, NULL, NULL) < 0
	    || rs == CTRL_ROOM_SUCCESS || rs == CTRL_ROOM_FAILED || ctrl_sched_kv_local(d->o.sched, q->id) < 0)
		return -1;
	/* never told ready from now on: the scheduler's kv_lost forgets the room */
	q->t_lost = d->now != 0 ? d->now : 1;
	snprintf(q->lost_why, sizeof(q->lost_why), "%s", why != NULL ? why : "");
	d->st.computed_here++;
	return 0;
}

void ctrl_pd_decode_fail(struct ctrl_pd_decode *d, uint64_t room, const char *why)
{
	struct pd_dreq *q = by_room(d, room);

	if (q != NULL)
		fail_req(d, q, why);
}

int ctrl_pd_decode_fail_all(struct ctrl_pd_decode *d, const char *why)
{
	int n = 0;

	for (struct pd_dreq *q = d->reqs; q != NULL; q = q->next)
		if (!q->told) {
			fail_req(d, q, why); /* tells the scheduler: the record goes at its finish event */
			n++;
		}
	return n;
}

static int retry_room(struct ctrl_pd_decode *d, struct pd_dreq *q);

int ctrl_pd_decode_retry_all(struct ctrl_pd_decode *d, const char *why)
{
	int n = 0;

	for (struct pd_dreq *q = d->reqs; q != NULL; q = q->next)
		if (!q->told && retry_room(d, q) < 0) {
			fail_req(d, q, why);
			n++;
		}
	return n;
}

int ctrl_pd_decode_expects(const struct ctrl_pd_decode *d, uint64_t room, uint32_t session)
{
	enum ctrl_room_state rs;

	for (const struct pd_dreq *q = d->reqs; q != NULL; q = q->next)
		if (q->room == room)
			return session == d->o.session && !q->told
			       && ctrl_room_get(d->o.rooms, room, &rs, NULL, NULL) == 0
			       && (rs == CTRL_ROOM_WAITING || rs == CTRL_ROOM_SUCCESS);
	return 0;
}

/*
 * @p q's room was lost with a dataplane's session: run the request again in
 * a fresh room of the same node (opts.retry sends the prompt; the manifest
 * goes again once the pages are reserved, now if they are), so its client,
 * which has seen nothing of it yet, sees no error. The old room is given up
 * (its ranks told, where the message can still reach them) and forgotten:
 * nothing late of it lands. @return 0, or -1 (no retry: the caller fails it).
 */
static int retry_room(struct ctrl_pd_decode *d, struct pd_dreq *q)
{
	uint64_t old = q->room, nr = 0, silent_ms = 0;
	enum ctrl_room_state rs;

	if (q->told || d->o.retry == NULL || q->retries >= d->o.max_retries
	    || ctrl_room_get(d->o.rooms, old, &rs, NULL, NULL) < 0 || rs == CTRL_ROOM_FAILED)
		return -1;
	if (d->o.retry(d->o.retry_arg, q->node, old, &nr) < 0)
		return -1;
	send_all(d, q, 1, NULL, 0); /* the old room's abort: its ranks free their side */
	forget(d, old);
	if (ctrl_room_open(d->o.rooms, nr, q->node, q->n_ranks, d->now) < 0) {
		/* the prompt went under nr, but nothing here waits for it: the
		 * prefill node's hold timeout gives its KV back */
		q->room = nr;
		return -1;
	}
	q->room = nr;
	q->retries++;
	d->st.rooms_retried++;
	q->streams_left = d->o.n_streams;
	memset(q->landed, 0, sizeof(*q->landed) * (size_t)d->o.n_streams);
	q->bytes_landed = 0;
	q->t_page0 = q->t_page1 = q->t_status = q->t_manifest = 0;
	q->ok_seen = q->have_lp = 0;
	q->peer_epoch = 0;
	if (d->o.peer_state != NULL && d->o.peer_state(d->o.peer_arg, q->node, &q->peer_epoch, &silent_ms) < 0)
		q->peer_epoch = 0;
	if (q->blocks != NULL) {
		ctrl_room_bootstrapped(d->o.rooms, nr);
		q->t_manifest = kvf_mono_ns();
		send_all(d, q, 0, q->blocks, (int32_t)q->n_blocks);
		if (ctrl_room_get(d->o.rooms, nr, &rs, NULL, NULL) == 0 && rs == CTRL_ROOM_BOOTSTRAPPED)
			ctrl_room_waiting_since(d->o.rooms, nr, d->now);
	}
	return 0;
}

/* Was @p q's room lost with its prefill node's dataplane session (that
 * dataplane restarted, or has been silent past its give-up)? Then fail it
 * now, naming which: its manifest, pages or status may be gone with the
 * session, and it would otherwise wait for the waiting timeout. */
static void check_peer(struct ctrl_pd_decode *d, struct pd_dreq *q)
{
	uint64_t epoch = 0, silent_ms = 0;
	char why[200];

	if (q->told || d->o.peer_state == NULL || d->o.peer_state(d->o.peer_arg, q->node, &epoch, &silent_ms) < 0)
		return;
	if (q->peer_epoch == 0) {
		q->peer_epoch = epoch; /* first heard since the room opened: its session */
		return;
	}
	if (epoch != 0 && epoch != q->peer_epoch && retry_room(d, q) == 0)
		return; /* that dataplane is back: the request runs again in a fresh room */
	if (epoch != 0 && epoch != q->peer_epoch)
		snprintf(why, sizeof(why), "its kvferry-dataplane restarted while the room was in flight: the room's "
			 "messages were lost with that session (send the request again)");
	else if (silent_ms >= CTRL_PD_PEER_GONE_MS)
		snprintf(why, sizeof(why), "its kvferry-dataplane has not been heard for %.1f s: the room's messages "
			 "are lost (check that node's dataplane and link, then send the request again)",
			 (double)silent_ms / 1e3);
	else
		return;
	fail_req(d, q, why);
	d->st.rooms_lost_dataplane += q->told;
}

void ctrl_pd_decode_tick(struct ctrl_pd_decode *d, uint64_t now_ns)
{
	enum ctrl_room_state rs;

	d->now = now_ns;
	ctrl_rooms_expire(d->o.rooms, now_ns);
	for (struct pd_dreq *q = d->reqs; q != NULL; q = q->next) {
		check_peer(d, q);
		if (!q->told && q->t_lost != 0 && now_ns > q->t_lost && now_ns - q->t_lost > PD_LOST_WAIT_NS) {
			char why[sizeof(q->lost_why) + 120];

			snprintf(why, sizeof(why), "a page message could not land (this node's stages were down: %s) and "
				 "the request was not run again here", q->lost_why);
			fail_req(d, q, why);
		}
		settle(d, q);
		if (q->told || ctrl_room_get(d->o.rooms, q->room, &rs, NULL, NULL) < 0 || rs != CTRL_ROOM_SUCCESS)
			continue;
		/* every rank reported but a page stream is still out */
		if (!q->ok_seen) {
			q->ok_seen = 1;
			q->t_ok = now_ns;
		} else if (now_ns > q->t_ok && now_ns - q->t_ok > d->o.landing_ns) {
			char why[160];

			snprintf(why, sizeof(why), "every prefill rank reported, but %d of its page streams did not land "
				 "within %.1f s", (int)q->streams_left, (double)d->o.landing_ns / 1e9);
			fail_req(d, q, why);
		}
	}
}

int ctrl_pd_decode_resend_aborts(struct ctrl_pd_decode *d, uint32_t node)
{
	uint8_t buf[CTRL_PD_MSG_HDR + 16 + CTRL_PD_MAX_TEXT];
	uint64_t now = kvf_mono_ns();
	uint32_t n = d->n_gone < PD_GONE_KEEP ? d->n_gone : PD_GONE_KEEP;
	int sent = 0;

	for (uint32_t i = 0; i < n; i++) {
		const struct pd_gone *g = &d->gone[i];

		if (now < g->t || now - g->t > PD_GONE_NS || (node != CTRL_PD_ALL_NODES && g->node != node))
			continue;
		for (uint32_t r = 0; r < g->n_ranks; r++) {
			int len = ctrl_pd_encode_abort(buf, sizeof(buf), g->room, d->o.session, r, "the request ended");

			if (len >= 0 && d->o.send(d->o.send_arg, g->node, buf, (size_t)len) == 0)
				sent++;
		}
	}
	d->st.aborts_sent += (uint64_t)sent;
	return sent;
}

void ctrl_pd_decode_stats(const struct ctrl_pd_decode *d, struct ctrl_pd_decode_stats *st)
{
	*st = d->st;
}

void ctrl_pd_decode_rooms(const struct ctrl_pd_decode *d, void (*fn)(void *arg, const struct ctrl_pd_room_view *v),
			  void *arg)
{
	for (const struct pd_dreq *q = d->reqs; q != NULL; q = q->next) {
		struct ctrl_pd_room_view v = { .room = q->room, .id = q->id, .node = q->node, .streams_left = q->streams_left,
					       .bytes_landed = q->bytes_landed,
					       .told = q->told, .state = CTRL_ROOM_BOOTSTRAPPING,
					       .age_s = d->now > q->t_open ? (double)(d->now - q->t_open) / 1e9 : 0.0 };

		ctrl_room_get(d->o.rooms, q->room, &v.state, NULL, NULL);
		fn(arg, &v);
	}
}

void ctrl_pd_decode_destroy(struct ctrl_pd_decode *d)
{
	if (d == NULL)
		return;
	while (d->reqs != NULL)
		unlink_req(d, d->reqs);
	free(d);
}

int ctrl_pd_decode_set_session(struct ctrl_pd_decode *d, uint32_t session)
{
	if (d->reqs != NULL)
		return -EBUSY;
	d->o.session = session;
	return 0;
}
