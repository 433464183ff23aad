/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A generation request between its connection and the backend: the request
 * object and its reference count, the events the backend queues
 * (gen_on_event, on the scheduler thread: queue only), and the pump that
 * turns them into text, stop-string cuts and logprob entries on the
 * connection's MHD thread (gen_pump), so a slow client or a long decode
 * never holds up the scheduler.
 *
 * Stop strings: the text is cut where the first stop string starts and the
 * backend request is cancelled. While streaming, a tail of the text that
 * could still grow into a stop string (it equals a stop string's prefix) is
 * held back (http_body.c), so no part of a stop string is ever sent.
 *
 * Logprobs: each token event carries the chosen token's logprob and the
 * request's top alternatives. They are kept per token with the byte offset
 * where the token's text starts, so a streamed chunk carries exactly the
 * tokens whose text starts in it, and tokens past a stop-string cut are not
 * reported.
 *
 * Latency: the backend thread stamps each event as it queues it (one
 * clock_gettime, ~20 ns through the vDSO: the only cost on the scheduler's
 * thread); the pump, on the connection's thread, turns the stamps into
 * histogram observations (http_reply.c): time to first token and queue time
 * once per request, inter-token latency once per token after the first,
 * end-to-end latency once per request answered (not failed, not abandoned
 * by its client). All are measured from the request's arrival (g->t_start).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "http_int.h"

/* ---- the request object ---- */

static void gen_free(struct gen *g)
{
	struct ctrl_http *h = g->h;

	pthread_mutex_lock(&h->mu);
	if (g->prev)
		g->prev->next = g->next;
	else if (h->gens == g)
		h->gens = g->next;
	if (g->next)
		g->next->prev = g->prev;
	pthread_mutex_unlock(&h->mu);
	for (int i = 0; i < g->n_stops; i++)
		free(g->stops[i]);
	free(g->stops);
	free(g->q);
	free(g->lp);
	free(g->plp);
	free(g->backend_err);
	free(g->fail_msg);
	kn_tok_stream_free(g->ds);
	kvf_buf_free(&g->text);
	kvf_buf_free(&g->out);
	free(g->kids); /* their connection references went when the connection closed */
	pthread_mutex_destroy(&g->mu);
	if (g->lead)
		gen_unref(g->lead);
	free(g);
	atomic_fetch_sub(&h->active, 1);
}

void gen_unref(struct gen *g)
{
	if (atomic_fetch_sub(&g->refs, 1) == 1)
		gen_free(g);
}

/* Backend thread: queue the event and wake the connection. */
void gen_on_event(void *arg, const struct ctrl_event *ev)
{
	struct gen *g = arg;
	struct http_ev e = {.t = http_now(), .t_admitted_ns = ev->t_admitted_ns, .token = ev->token,
			    .logprob = ev->logprob, .n_generated = ev->n_generated, .finish = (int32_t)ev->finish,
			    .prompt_pos = ev->prompt_pos, .cached = ev->cached_tokens};

	if (ev->finish == CTRL_FINISH_NONE && ev->n_top > 0 && ev->top_ids && ev->top_logprobs) {
		e.n_top = ev->n_top < HTTP_MAX_LOGPROBS ? ev->n_top : HTTP_MAX_LOGPROBS;
		memcpy(e.top_ids, ev->top_ids, sizeof(int32_t) * (size_t)e.n_top);
		memcpy(e.top_lps, ev->top_logprobs, sizeof(float) * (size_t)e.n_top);
	}

	pthread_mutex_lock(&g->mu);
	if (g->qn == g->qcap) {
		size_t cap = g->qcap ? g->qcap * 2 : 16;
		struct http_ev *q = realloc(g->q, cap * sizeof(*q));
		if (q) {
			g->q = q;
			g->qcap = cap;
		}
	}
	if (g->qn < g->qcap) {
		g->q[g->qn++] = e;
	} else if (ev->finish == CTRL_FINISH_NONE) {
		/* Out of memory: end the request rather than lose a token. */
		g->cancel_sent = 1;
		g->h->be.cancel(g->h->be.ctx, g->id);
	}
	if (ev->finish == CTRL_FINISH_NONE && ev->prompt_pos == 0)
		g->n_seen++;
	if (ev->finish == CTRL_FINISH_ERROR && ev->message && !g->backend_err)
		g->backend_err = strdup(ev->message);
	if (ev->finish != CTRL_FINISH_NONE) {
		g->backend_done = 1;
		if (g->qn == g->qcap) {
			/* Could not queue the finish: mark it so the connection ends. */
			if (!g->backend_err)
				g->backend_err = strdup("out of memory queueing the finish event");
		}
	}
	if (g->suspended && !g->conn_gone) {
		g->suspended = 0;
		MHD_resume_connection(g->conn);
	}
	pthread_mutex_unlock(&g->mu);
	if (g->lead) {
		/* a choice past the first: the lead's connection is the one that
		 * waits (gen_suspend() looks at this queue under the lead's lock
		 * after taking it, so the wake-up cannot be missed) */
		struct gen *l = g->lead;

		pthread_mutex_lock(&l->mu);
		if (l->suspended && !l->conn_gone) {
			l->suspended = 0;
			MHD_resume_connection(l->conn);
		}
		pthread_mutex_unlock(&l->mu);
	}
	if (ev->finish != CTRL_FINISH_NONE)
		gen_unref(g);
}

void gen_cancel(struct gen *g)
{
	int send;

	pthread_mutex_lock(&g->mu);
	send = !g->backend_done && !g->cancel_sent;
	g->cancel_sent = 1;
	pthread_mutex_unlock(&g->mu);
	if (send)
		g->h->be.cancel(g->h->be.ctx, g->id);
}

/* The connection is gone: @return 1 when the choice had not finished (it is
 * cancelled). */
static int choice_closed(struct gen *g)
{
	int gone_early;

	pthread_mutex_lock(&g->mu);
	g->conn_gone = 1;
	g->suspended = 0;
	gone_early = !g->backend_done && !g->cancel_sent;
	pthread_mutex_unlock(&g->mu);
	if (gone_early)
		gen_cancel(g);
	return gone_early;
}

void gen_connection_closed(struct gen *g)
{
	int gone_early = choice_closed(g);

	for (int i = 0; i < g->n_kids; i++) {
		gone_early |= choice_closed(g->kids[i]);
		gen_unref(g->kids[i]);
	}
	g->n_kids = 0;
	if (gone_early)
		atomic_fetch_add(&g->h->client_cancels, 1);
	gen_unref(g);
}

void gen_abandon(struct gen *g, int n_submitted)
{
	for (int i = 0; i <= g->n_kids; i++) {
		struct gen *k = i ? g->kids[i - 1] : g;

		if (i < n_submitted)
			gen_cancel(k);
		pthread_mutex_lock(&k->mu);
		k->conn_gone = 1;
		pthread_mutex_unlock(&k->mu);
	}
	for (int i = 0; i < g->n_kids; i++)
		gen_unref(g->kids[i]);
	g->n_kids = 0;
	gen_unref(g);
}

/* Cut the text at the first stop string that starts at or after @from. */
static int match_stop(struct gen *g, size_t from)
{
	size_t best = SIZE_MAX;
	int hit = -1;

	for (int i = 0; i < g->n_stops; i++) {
		const char *m = memmem(g->text.p + from, g->text.len - from, g->stops[i], strlen(g->stops[i]));
		if (m && (size_t)(m - g->text.p) < best) {
			best = (size_t)(m - g->text.p);
			hit = i;
		}
	}
	if (best == SIZE_MAX)
		return 0;
	g->stop_hit = hit;
	if (g->keep_stop) /* include_stop_str_in_output: the text ends with it */
		best += strlen(g->stops[hit]);
	g->text.len = best;
	g->text.p[best] = 0;
	g->cut = 1;
	return 1;
}

static void append_text(struct gen *g, const char *s, size_t n)
{
	size_t old = g->text.len, from;

	if (!n)
		return;
	kvf_buf_add(&g->text, s, n);
	if (!g->n_stops || g->done)
		return;
	from = old >= g->max_stop ? old - (g->max_stop - 1) : 0;
	if (from < g->text_base) /* stop strings are looked for in the generated text only */
		from = g->text_base;
	if (match_stop(g, from)) {
		g->done = 1;
		g->finish = "stop";
		gen_cancel(g);
	}
}

/* Keep a token's logprobs; its text starts at the current end of the output. */
static void lp_add(struct gen *g, const struct http_ev *e)
{
	struct lp_ent *x;

	if (g->lp_n == g->lp_cap) {
		size_t cap = g->lp_cap ? g->lp_cap * 2 : 16;
		struct lp_ent *p = realloc(g->lp, cap * sizeof(*p));

		if (!p)
			return; /* out of memory: the token goes unreported, the text does not */
		g->lp = p;
		g->lp_cap = cap;
	}
	x = &g->lp[g->lp_n++];
	x->token = e->token;
	x->none = 0;
	x->logprob = e->logprob;
	x->off = g->text.len;
	x->n_top = e->n_top < g->lp_top ? e->n_top : g->lp_top;
	memcpy(x->top_ids, e->top_ids, sizeof(int32_t) * (size_t)x->n_top);
	memcpy(x->top_lps, e->top_lps, sizeof(float) * (size_t)x->n_top);
}

/* A prompt token's logprobs (prompt_pos > 0), into its entry. */
static void plp_fill(struct gen *g, const struct http_ev *e)
{
	struct lp_ent *x;

	if (g->plp == NULL || e->prompt_pos >= g->n_prompt || !g->plp[e->prompt_pos].none)
		return;
	x = &g->plp[e->prompt_pos];
	x->none = 0;
	x->logprob = e->logprob;
	x->n_top = e->n_top < g->lp_top ? e->n_top : g->lp_top;
	memcpy(x->top_ids, e->top_ids, sizeof(int32_t) * (size_t)x->n_top);
	memcpy(x->top_lps, e->top_lps, sizeof(float) * (size_t)x->n_top);
	g->plp_missing--;
}

/* Latency of one event, as the pump takes it (see the top of the file). */
static void note_latency(struct gen *g, const struct http_ev *e)
{
	if (e->t_admitted_ns && !g->queue_noted) {
		http_hist_observe(g->h, HTTP_HIST_QUEUE, (double)e->t_admitted_ns * 1e-9 - g->t_start);
		g->queue_noted = 1;
	}
	if (e->finish != CTRL_FINISH_NONE || e->prompt_pos > 0)
		return;
	if (g->n_gen == 0)
		http_hist_observe(g->h, HTTP_HIST_TTFT, e->t - g->t_start);
	else
		http_hist_observe(g->h, HTTP_HIST_ITL, e->t - g->t_last);
	g->t_last = e->t;
}

/* Connection thread: take queued events, decode them, apply stop strings. */
void gen_pump(struct gen *g)
{
	struct http_ev *q;
	size_t n;
	char *berr;
	char buf[512];
	double t_end = 0;

	pthread_mutex_lock(&g->mu);
	q = g->q;
	n = g->qn;
	g->q = NULL;
	g->qn = g->qcap = 0;
	berr = g->backend_err;
	g->backend_err = NULL;
	pthread_mutex_unlock(&g->mu);
	for (size_t i = 0; i < n && !g->done; i++) {
		const struct http_ev *e = &q[i];
		ssize_t w;

		g->n_cached = e->cached; /* the last admission's (a replay admits again) */
		note_latency(g, e);
		t_end = e->t;
		if (e->finish == CTRL_FINISH_NONE && e->prompt_pos > 0) {
			plp_fill(g, e);
			continue;
		}
		if (e->finish == CTRL_FINISH_NONE) {
			g->n_gen++;
			if (g->lp_on)
				lp_add(g, e);
			w = kn_tok_stream_push(g->ds, e->token, buf, sizeof(buf));
			if (w > 0)
				append_text(g, buf, (size_t)w);
			continue;
		}
		if (e->n_generated > g->n_gen)
			g->n_gen = e->n_generated;
		w = kn_tok_stream_flush(g->ds, buf, sizeof(buf));
		if (w > 0)
			append_text(g, buf, (size_t)w);
		if (g->done)
			break;
		g->done = 1;
		switch (e->finish) {
		case CTRL_FINISH_LENGTH: g->finish = "length"; break;
		case CTRL_FINISH_STOP:
			g->finish = "stop";
			g->stop_token = e->token;
			break;
		case CTRL_FINISH_CANCELLED: g->finish = "abort"; break;
		default:
			g->failed = 1;
			g->finish = "error";
			break;
		}
	}
	if (berr && !g->done) {
		/* The finish event itself could not be queued. */
		g->done = 1;
		g->failed = 1;
		g->finish = "error";
	}
	if (berr && !g->fail_msg)
		g->fail_msg = berr;
	else
		free(berr);
	free(q);
	if (g->done && !g->failed && !g->e2e_noted) {
		/* the answer is complete at the event that completed it (a finish,
		 * or the token that brought a stop string) */
		http_hist_observe(g->h, HTTP_HIST_E2E, (t_end > 0 ? t_end : http_now()) - g->t_start);
		g->e2e_noted = 1;
	}
}

void gen_pump_all(struct gen *g)
{
	gen_pump(g);
	for (int i = 0; i < g->n_kids; i++)
		gen_pump(g->kids[i]);
}

int gen_all_done(const struct gen *g)
{
	for (int i = 0; i < g->n_kids; i++)
		if (!g->kids[i]->done)
			return 0;
	return g->done;
}

/* Events queued on a choice past the first (taken under the lead's lock:
 * see gen_on_event()). */
static int kids_pending(struct gen *g)
{
	int any = 0;

	for (int i = 0; i < g->n_kids && !any; i++) {
		struct gen *k = g->kids[i];

		pthread_mutex_lock(&k->mu);
		any = k->qn || k->backend_err;
		pthread_mutex_unlock(&k->mu);
	}
	return any;
}

/* 0: suspended; 1: events arrived meanwhile (pump again); -1: shutting down. */
int gen_suspend(struct gen *g)
{
	int rc = 0;

	pthread_mutex_lock(&g->mu);
	if (g->qn || g->backend_err || kids_pending(g))
		rc = 1;
	else if (atomic_load(&g->h->stopping))
		rc = -1;
	else {
		g->suspended = 1;
		MHD_suspend_connection(g->conn);
	}
	pthread_mutex_unlock(&g->mu);
	return rc;
}

int http_peer_closed(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	char b;
	ssize_t n;

	if (!ci)
		return 0;
	n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}
