/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The OpenAI-compatible endpoints: request validation, prompt encoding,
 * the request lifecycle between a connection and the backend, stop
 * strings, and the JSON and SSE bodies.
 *
 * Token ids arrive on the backend thread (on_event) and are only queued
 * there; decoding, stop-string matching and JSON building run on the
 * connection's MHD thread (gen_pump), so a slow client or a long decode
 * never holds up the scheduler.
 *
 * Stop strings: the text is cut where the first stop string starts and the
 * backend request is cancelled. While streaming, a tail of the text that
 * could still grow into a stop string (it equals a stop string's prefix) is
 * held back, so no part of a stop string is ever sent.
 *
 * Logprobs: each token event carries the chosen token's logprob and the
 * request's top alternatives (the scheduler asks the chain for them per
 * column). They are kept per token with the byte offset where the token's
 * text starts, so a streamed chunk carries exactly the tokens whose text
 * starts in it, and tokens past a stop-string cut are not reported.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "http_int.h"

#define MAX_STOPS 16

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
	free(g->backend_err);
	free(g->fail_msg);
	kn_tok_stream_free(g->ds);
	sbuf_free(&g->text);
	sbuf_free(&g->out);
	pthread_mutex_destroy(&g->mu);
	free(g);
	atomic_fetch_sub(&h->active, 1);
}

void gen_unref(struct gen *g)
{
	if (atomic_fetch_sub(&g->refs, 1) == 1)
		gen_free(g);
}

/* Backend thread: queue the event and wake the connection. */
static void on_event(void *arg, const struct ctrl_event *ev)
{
	struct gen *g = arg;
	struct http_ev e = {.token = ev->token, .logprob = ev->logprob, .n_generated = ev->n_generated,
			    .finish = (int32_t)ev->finish};

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
	if (ev->finish == CTRL_FINISH_NONE)
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
	if (ev->finish != CTRL_FINISH_NONE)
		gen_unref(g);
}

static void gen_cancel(struct gen *g)
{
	int send;

	pthread_mutex_lock(&g->mu);
	send = !g->backend_done && !g->cancel_sent;
	g->cancel_sent = 1;
	pthread_mutex_unlock(&g->mu);
	if (send)
		g->h->be.cancel(g->h->be.ctx, g->id);
}

void gen_connection_closed(struct gen *g)
{
	int gone_early;

	pthread_mutex_lock(&g->mu);
	g->conn_gone = 1;
	g->suspended = 0;
	gone_early = !g->backend_done && !g->cancel_sent;
	pthread_mutex_unlock(&g->mu);
	if (gone_early) {
		atomic_fetch_add(&g->h->client_cancels, 1);
		gen_cancel(g);
	}
	gen_unref(g);
}

/* Cut the text at the first stop string that starts at or after @from. */
static int match_stop(struct gen *g, size_t from)
{
	size_t best = SIZE_MAX;

	for (int i = 0; i < g->n_stops; i++) {
		const char *m = memmem(g->text.p + from, g->text.len - from, g->stops[i], strlen(g->stops[i]));
		if (m && (size_t)(m - g->text.p) < best)
			best = (size_t)(m - g->text.p);
	}
	if (best == SIZE_MAX)
		return 0;
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
	sbuf_add(&g->text, s, n);
	if (!g->n_stops || g->done)
		return;
	from = old >= g->max_stop ? old - (g->max_stop - 1) : 0;
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
	x->logprob = e->logprob;
	x->off = g->text.len;
	x->n_top = e->n_top < g->lp_top ? e->n_top : g->lp_top;
	memcpy(x->top_ids, e->top_ids, sizeof(int32_t) * (size_t)x->n_top);
	memcpy(x->top_lps, e->top_lps, sizeof(float) * (size_t)x->n_top);
}

/* Connection thread: take queued events, decode them, apply stop strings. */
static void gen_pump(struct gen *g)
{
	struct http_ev *q;
	size_t n;
	char *berr;
	char buf[512];

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
		case CTRL_FINISH_STOP: g->finish = "stop"; break;
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
}

/* 0: suspended; 1: events arrived meanwhile (pump again); -1: shutting down. */
static int gen_suspend(struct gen *g)
{
	int rc = 0;

	pthread_mutex_lock(&g->mu);
	if (g->qn || g->backend_err)
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

static int peer_closed(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	char b;
	ssize_t n;

	if (!ci)
		return 0;
	n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* ---- response bodies ---- */

/* A token as text: its bytes when they are whole UTF-8, else "bytes:\\xNN..."
 * (a token may hold part of a character), as OpenAI writes them. */
static json_t *tok_str(const struct gen *g, int32_t id)
{
	size_t len = 0;
	const char *b = kn_tok_token_bytes(g->h->tok, id, &len);
	json_t *j;
	char esc[6 * 64 + 8];
	size_t n;

	if (!b)
		return json_string("");
	if ((j = json_stringn(b, len)))
		return j;
	n = (size_t)snprintf(esc, sizeof(esc), "bytes:");
	for (size_t i = 0; i < len && n + 5 < sizeof(esc); i++)
		n += (size_t)snprintf(esc + n, sizeof(esc) - n, "\\x%02x", (unsigned char)b[i]);
	return json_string(esc);
}

static json_t *tok_bytes(const struct gen *g, int32_t id)
{
	size_t len = 0;
	const char *b = kn_tok_token_bytes(g->h->tok, id, &len);
	json_t *a = json_array();

	for (size_t i = 0; b && i < len; i++)
		json_array_append_new(a, json_integer((unsigned char)b[i]));
	return a;
}

/* Entries that may be reported: all of them, less those past a stop-string cut. */
static size_t lp_valid(const struct gen *g)
{
	size_t n = g->lp_n;

	if (g->cut)
		while (n > 0 && g->lp[n - 1].off >= g->text.len)
			n--;
	return n;
}

/* The logprobs object of entries [a, b), in the endpoint's format. */
static json_t *logprobs_json(const struct gen *g, size_t a, size_t b)
{
	if (g->kind == GEN_CHAT) {
		json_t *content = json_array();

		for (size_t i = a; i < b; i++) {
			const struct lp_ent *x = &g->lp[i];
			json_t *top = json_array();

			for (int32_t t = 0; t < x->n_top; t++)
				json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token",
					tok_str(g, x->top_ids[t]), "logprob", (double)x->top_lps[t], "bytes",
					tok_bytes(g, x->top_ids[t])));
			json_array_append_new(content, json_pack("{s:o, s:f, s:o, s:o}", "token",
				tok_str(g, x->token), "logprob", (double)x->logprob, "bytes", tok_bytes(g, x->token),
				"top_logprobs", top));
		}
		return json_pack("{s:o}", "content", content);
	} else {
		json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();

		for (size_t i = a; i < b; i++) {
			const struct lp_ent *x = &g->lp[i];
			json_t *top = json_object();

			json_array_append_new(tokens, tok_str(g, x->token));
			json_array_append_new(lps, json_real((double)x->logprob));
			for (int32_t t = 0; t < x->n_top; t++) {
				json_t *k = tok_str(g, x->top_ids[t]);

				/* two tokens of the same text: the likelier one stays */
				if (!json_object_get(top, json_string_value(k)))
					json_object_set_new(top, json_string_value(k), json_real((double)x->top_lps[t]));
				json_decref(k);
			}
			json_array_append_new(tops, top);
			json_array_append_new(offs, json_integer((json_int_t)x->off));
		}
		return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
				 "top_logprobs", tops, "text_offset", offs);
	}
}

static json_t *usage_json(const struct gen *g)
{
	return json_pack("{s:i, s:i, s:i}", "prompt_tokens", g->n_prompt, "completion_tokens", g->n_gen,
			 "total_tokens", g->n_prompt + g->n_gen);
}

static json_t *chunk_json(struct gen *g, const char *text, size_t len, const char *finish, int role,
			  json_t *lp)
{
	json_t *choice;

	if (!lp)
		lp = json_null();

	if (g->kind == GEN_CHAT) {
		json_t *delta = json_object();
		if (role)
			json_object_set_new(delta, "role", json_string("assistant"));
		if (text)
			json_object_set_new(delta, "content", json_stringn(text, len));
		choice = json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "delta", delta, "logprobs", lp,
				   "finish_reason", finish ? json_string(finish) : json_null());
	} else {
		choice = json_pack("{s:i, s:s%, s:o, s:o}", "index", 0, "text", text ? text : "",
				   text ? len : 0, "logprobs", lp, "finish_reason",
				   finish ? json_string(finish) : json_null());
	}
	return json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", g->rid, "object",
			 g->kind == GEN_CHAT ? "chat.completion.chunk" : "text_completion", "created",
			 (json_int_t)g->created, "model", g->h->model, "choices", choice);
}

static void sse(struct gen *g, json_t *j)
{
	char *s = json_dumps(j, JSON_COMPACT);

	json_decref(j);
	if (!s)
		return;
	sbuf_add(&g->out, "data: ", 6);
	sbuf_add(&g->out, s, strlen(s));
	sbuf_add(&g->out, "\n\n", 2);
	free(s);
}

/* Bytes at the end of the text that might grow into a stop string. */
static size_t held_back(const struct gen *g)
{
	size_t held = 0;

	for (int i = 0; i < g->n_stops; i++) {
		size_t sl = strlen(g->stops[i]);
		size_t k = sl - 1 < g->text.len ? sl - 1 : g->text.len;
		for (; k > held; k--) {
			if (!memcmp(g->text.p + g->text.len - k, g->stops[i], k)) {
				held = k;
				break;
			}
		}
	}
	return held;
}

static void note_done(struct gen *g)
{
	atomic_fetch_add(&g->h->prompt_tokens, (uint64_t)g->n_prompt);
	atomic_fetch_add(&g->h->completion_tokens, (uint64_t)g->n_gen);
}

/* Append to g->out the SSE events that are now due. */
static void stream_build(struct gen *g)
{
	size_t upto, lp_upto = g->lp_sent;

	if (g->kind == GEN_CHAT && !g->role_sent) {
		sse(g, chunk_json(g, "", 0, NULL, 1, NULL));
		g->role_sent = 1;
	}
	upto = g->done ? g->text.len : g->text.len - held_back(g);
	/* A chunk carries the tokens whose text starts in it (all that are left
	 * once the answer is complete). */
	if (g->lp_on) {
		size_t valid = lp_valid(g);

		while (lp_upto < valid && (g->done || g->lp[lp_upto].off < upto))
			lp_upto++;
	}
	if (!g->failed && upto > g->emitted) {
		sse(g, chunk_json(g, g->text.p + g->emitted, upto - g->emitted, NULL, 0,
				  g->lp_on ? logprobs_json(g, g->lp_sent, lp_upto) : NULL));
		g->emitted = upto;
		g->lp_sent = lp_upto;
	}
	if (!g->done || g->final_sent)
		return;
	if (g->failed) {
		sse(g, json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message",
				 g->fail_msg ? g->fail_msg : "generation failed", "type", "server_error",
				 "param", "code", "generation_failed"));
	} else {
		/* tokens with no text of their own left: on the last chunk */
		sse(g, chunk_json(g, NULL, 0, g->finish, 0,
				  g->lp_on && lp_upto > g->lp_sent ? logprobs_json(g, g->lp_sent, lp_upto) : NULL));
		g->lp_sent = lp_upto;
		if (g->include_usage) {
			json_t *u = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", g->rid, "object",
					      g->kind == GEN_CHAT ? "chat.completion.chunk" : "text_completion",
					      "created", (json_int_t)g->created, "model", g->h->model,
					      "choices", "usage", usage_json(g));
			sse(g, u);
		}
	}
	sbuf_add(&g->out, "data: [DONE]\n\n", 14);
	g->final_sent = 1;
	note_done(g);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct gen *g = cls;

	(void)pos;
	for (;;) {
		if (g->out_off < g->out.len) {
			size_t n = g->out.len - g->out_off;
			if (n > max)
				n = max;
			memcpy(buf, g->out.p + g->out_off, n);
			g->out_off += n;
			return (ssize_t)n;
		}
		g->out.len = 0;
		g->out_off = 0;
		if (g->final_sent)
			return MHD_CONTENT_READER_END_OF_STREAM;
		gen_pump(g);
		stream_build(g);
		if (g->out.len)
			continue;
		if (peer_closed(g->conn))
			return MHD_CONTENT_READER_END_WITH_ERROR;
		switch (gen_suspend(g)) {
		case 1: continue;
		case -1: return MHD_CONTENT_READER_END_WITH_ERROR;
		default: return 0;
		}
	}
}

static enum MHD_Result respond_final(struct ctrl_http *h, struct MHD_Connection *c, struct gen *g)
{
	json_t *choice, *j, *lp;

	if (g->failed)
		return http_error(h, c, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL,
				  "generation_failed", "%s", g->fail_msg ? g->fail_msg : "generation failed");
	note_done(g);
	lp = g->lp_on ? logprobs_json(g, 0, lp_valid(g)) : json_null();
	if (g->kind == GEN_CHAT)
		choice = json_pack("{s:i, s:{s:s, s:s%}, s:o, s:s}", "index", 0, "message", "role",
				   "assistant", "content", g->text.p ? g->text.p : "", g->text.len,
				   "logprobs", lp, "finish_reason", g->finish);
	else
		choice = json_pack("{s:i, s:s%, s:o, s:s}", "index", 0, "text",
				   g->text.p ? g->text.p : "", g->text.len, "logprobs", lp, "finish_reason",
				   g->finish);
	j = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", g->rid, "object",
		      g->kind == GEN_CHAT ? "chat.completion" : "text_completion", "created",
		      (json_int_t)g->created, "model", h->model, "choices", choice, "usage", usage_json(g));
	return http_json(h, c, MHD_HTTP_OK, j);
}

enum MHD_Result http_generate_resume(struct ctrl_http *h, struct MHD_Connection *c, struct conn_state *cs)
{
	struct gen *g = cs->gen;

	for (;;) {
		gen_pump(g);
		if (g->done)
			return respond_final(h, c, g);
		if (peer_closed(c))
			return MHD_NO;
		switch (gen_suspend(g)) {
		case 1: continue;
		case -1:
			return http_error(h, c, MHD_HTTP_SERVICE_UNAVAILABLE, "service_unavailable", NULL,
					  "shutting_down", "kvferry-ctrld is shutting down");
		default: return MHD_YES;
		}
	}
}

/* ---- request validation ---- */

struct verr {
	unsigned status;
	const char *type, *param, *code;
	char msg[768];
};

static int bad(struct verr *e, unsigned status, const char *param, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

static int bad(struct verr *e, unsigned status, const char *param, const char *code, const char *fmt, ...)
{
	va_list ap;

	e->status = status;
	e->type = status >= 500 ? "server_error" : "invalid_request_error";
	e->param = param;
	e->code = code;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
	return -1;
}

static enum MHD_Result send_verr(struct ctrl_http *h, struct MHD_Connection *c, const struct verr *e)
{
	return http_error(h, c, e->status, e->type, e->param, e->code, "%s", e->msg);
}

/* 1 when absent or null, 0 when read, -1 on a type or range error. */
static int opt_int(json_t *req, const char *key, int64_t lo, int64_t hi, int64_t *out, struct verr *e)
{
	json_t *v = json_object_get(req, key);

	if (!v || json_is_null(v))
		return 1;
	if (!json_is_integer(v))
		return bad(e, 400, key, "invalid_type", "'%s' must be an integer", key);
	if (json_integer_value(v) < lo || json_integer_value(v) > hi)
		return bad(e, 400, key, "invalid_value", "'%s' is %lld; it must be between %lld and %lld", key,
			   (long long)json_integer_value(v), (long long)lo, (long long)hi);
	*out = json_integer_value(v);
	return 0;
}

static int opt_num(json_t *req, const char *key, double lo, double hi, double *out, struct verr *e)
{
	json_t *v = json_object_get(req, key);

	if (!v || json_is_null(v))
		return 1;
	if (!json_is_number(v))
		return bad(e, 400, key, "invalid_type", "'%s' must be a number", key);
	if (json_number_value(v) < lo || json_number_value(v) > hi)
		return bad(e, 400, key, "invalid_value", "'%s' is %g; it must be between %g and %g", key,
			   json_number_value(v), lo, hi);
	*out = json_number_value(v);
	return 0;
}

static int opt_bool(json_t *req, const char *key, int *out, struct verr *e)
{
	json_t *v = json_object_get(req, key);

	if (!v || json_is_null(v))
		return 1;
	if (!json_is_boolean(v))
		return bad(e, 400, key, "invalid_type", "'%s' must be true or false", key);
	*out = json_is_true(v);
	return 0;
}

static int check_model(struct ctrl_http *h, json_t *req, int required, struct verr *e)
{
	json_t *m = json_object_get(req, "model");

	if (!m || json_is_null(m))
		return required ? bad(e, 400, "model", "missing_required_parameter",
				      "you must provide a model parameter (this server serves '%s')", h->model)
				: 0;
	if (!json_is_string(m))
		return bad(e, 400, "model", "invalid_type", "'model' must be a string");
	if (strcmp(json_string_value(m), h->model))
		return bad(e, 404, "model", "model_not_found",
			   "The model '%s' does not exist; this server serves '%s' (GET /v1/models)",
			   json_string_value(m), h->model);
	return 0;
}

/* Gather the text of a message's content: a string, or an array of parts. */
static int message_text(json_t *content, struct sbuf *out, struct verr *e)
{
	size_t i;
	json_t *part;

	if (json_is_string(content))
		return sbuf_add(out, json_string_value(content), json_string_length(content)) ? -1 : 0;
	if (json_is_null(content))
		return sbuf_add(out, "", 0) ? -1 : 0;
	if (!json_is_array(content))
		return bad(e, 400, "messages", "invalid_type", "a message's 'content' must be a string or an array of text parts");
	sbuf_add(out, "", 0);
	json_array_foreach(content, i, part) {
		json_t *t = json_object_get(part, "text");
		const char *type = json_string_value(json_object_get(part, "type"));
		if (!type || strcmp(type, "text") || !json_is_string(t))
			return bad(e, 400, "messages", "invalid_value",
				   "only text content parts are supported ({\"type\":\"text\",\"text\":...})");
		sbuf_add(out, json_string_value(t), json_string_length(t));
	}
	return 0;
}

/* Encode the prompt of a completion or chat request (or of /tokenize). */
static int encode_prompt(struct ctrl_http *h, json_t *req, enum gen_kind kind, int add_special,
			 int32_t **ids, size_t *n, struct verr *e)
{
	int rc;

	*ids = NULL;
	*n = 0;
	if (kind == GEN_COMPLETION) {
		json_t *p = json_object_get(req, "prompt");
		if (!p || json_is_null(p))
			return bad(e, 400, "prompt", "missing_required_parameter", "you must provide a prompt");
		if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
			p = json_array_get(p, 0);
		if (json_is_string(p)) {
			rc = kn_tok_encode(h->tok, json_string_value(p), json_string_length(p),
					   add_special ? KN_TOK_ADD_BOS : 0, ids, n);
			if (rc)
				return bad(e, 400, "prompt", "invalid_value", "cannot tokenize the prompt: %s",
					   strerror(-rc));
			return 0;
		}
		if (json_is_array(p)) {
			size_t i;
			json_t *v;
			int32_t vocab = kn_tok_vocab_size(h->tok);
			json_array_foreach(p, i, v) {
				if (!json_is_integer(v))
					return bad(e, 400, "prompt", "invalid_type",
						   "batched prompts are not supported: send a string, or one array of token ids, per request");
				if (json_integer_value(v) < 0 || json_integer_value(v) >= vocab)
					return bad(e, 400, "prompt", "invalid_value",
						   "token id %lld at prompt[%zu] is outside the vocabulary (0..%d)",
						   (long long)json_integer_value(v), i, vocab - 1);
			}
			*ids = malloc((json_array_size(p) + 1) * sizeof(int32_t));
			if (!*ids)
				return bad(e, 500, NULL, NULL, "out of memory");
			json_array_foreach(p, i, v)
				(*ids)[i] = (int32_t)json_integer_value(v);
			*n = json_array_size(p);
			return 0;
		}
		return bad(e, 400, "prompt", "invalid_type", "'prompt' must be a string or an array of token ids");
	} else {
		json_t *msgs = json_object_get(req, "messages"), *m;
		struct kn_chat_msg *cm;
		struct sbuf *texts;
		size_t i, cnt;
		char *prompt = NULL;
		int ret = 0;

		if (!msgs || json_is_null(msgs))
			return bad(e, 400, "messages", "missing_required_parameter", "you must provide messages");
		if (!json_is_array(msgs) || !json_array_size(msgs))
			return bad(e, 400, "messages", "invalid_type", "'messages' must be a non-empty array");
		cnt = json_array_size(msgs);
		cm = calloc(cnt, sizeof(*cm));
		texts = calloc(cnt, sizeof(*texts));
		if (!cm || !texts) {
			free(cm);
			free(texts);
			return bad(e, 500, NULL, NULL, "out of memory");
		}
		json_array_foreach(msgs, i, m) {
			const char *role = json_string_value(json_object_get(m, "role"));
			if (!json_is_object(m) || !role) {
				ret = bad(e, 400, "messages", "invalid_value", "messages[%zu] needs a string 'role'", i);
				goto chat_out;
			}
			if (message_text(json_object_get(m, "content"), &texts[i], e)) {
				ret = -1;
				goto chat_out;
			}
			cm[i].role = role;
			cm[i].content = texts[i].p ? texts[i].p : "";
		}
		rc = kn_tok_apply_chat(h->tok, cm, cnt, 1, &prompt);
		if (rc == -ENOTSUP) {
			ret = bad(e, 400, "messages", "chat_template_unsupported",
				  "this model has no usable chat template (%s); use /v1/completions",
				  kn_tok_chat_error(h->tok));
		} else if (rc == -EINVAL) {
			ret = bad(e, 400, "messages", "invalid_value",
				  "the chat template does not know a role used in messages (roles: system, user, assistant)");
		} else if (rc) {
			ret = bad(e, 500, NULL, NULL, "rendering the chat template failed: %s", strerror(-rc));
		} else {
			rc = kn_tok_encode(h->tok, prompt, strlen(prompt), KN_TOK_SPECIAL, ids, n);
			if (rc)
				ret = bad(e, 400, "messages", "invalid_value", "cannot tokenize the messages: %s",
					  strerror(-rc));
		}
	chat_out:
		free(prompt);
		for (i = 0; i < cnt; i++)
			sbuf_free(&texts[i]);
		free(texts);
		free(cm);
		return ret;
	}
}

static int read_stops(json_t *req, struct gen *g, struct verr *e)
{
	json_t *s = json_object_get(req, "stop"), *v;
	size_t i;

	if (!s || json_is_null(s))
		return 0;
	if (json_is_string(s)) {
		if (!json_string_length(s))
			return 0;
		g->stops = calloc(1, sizeof(char *));
		if (!g->stops || !(g->stops[0] = strdup(json_string_value(s))))
			return bad(e, 500, NULL, NULL, "out of memory");
		g->n_stops = 1;
	} else if (json_is_array(s)) {
		if (json_array_size(s) > MAX_STOPS)
			return bad(e, 400, "stop", "invalid_value", "at most %d stop strings are accepted", MAX_STOPS);
		g->stops = calloc(json_array_size(s) + 1, sizeof(char *));
		if (!g->stops)
			return bad(e, 500, NULL, NULL, "out of memory");
		json_array_foreach(s, i, v) {
			if (!json_is_string(v))
				return bad(e, 400, "stop", "invalid_type", "'stop' must be a string or an array of strings");
			if (!json_string_length(v))
				continue;
			if (!(g->stops[g->n_stops] = strdup(json_string_value(v))))
				return bad(e, 500, NULL, NULL, "out of memory");
			g->n_stops++;
		}
	} else {
		return bad(e, 400, "stop", "invalid_type", "'stop' must be a string or an array of strings");
	}
	for (int k = 0; k < g->n_stops; k++)
		if (strlen(g->stops[k]) > g->max_stop)
			g->max_stop = strlen(g->stops[k]);
	return 0;
}

enum MHD_Result http_generate(struct ctrl_http *h, struct MHD_Connection *c, struct conn_state *cs,
			      enum gen_kind kind, json_t *req)
{
	struct verr e;
	struct gen *g;
	struct ctrl_request r;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	int64_t iv, id;
	double temperature = 1.0, top_p = 1.0;
	int64_t top_k = 0, n = 1, max_tokens = 0;
	uint64_t seed;
	json_t *so, *lp;
	int stream = 0, ignore_eos = 0;

	memset(&e, 0, sizeof(e));
	g = calloc(1, sizeof(*g));
	if (!g)
		return MHD_NO;
	pthread_mutex_init(&g->mu, NULL);
	atomic_init(&g->refs, 1);
	g->h = h;
	g->conn = c;
	g->kind = kind;
	atomic_fetch_add(&h->active, 1);

	if (check_model(h, req, 1, &e))
		goto reject;
	if (opt_int(req, "n", 1, 128, &n, &e) < 0)
		goto reject;
	if (n != 1) {
		bad(&e, 400, "n", "unsupported_value",
		    "n=%lld is not supported: kvferry returns one choice per request (n=1); send %lld requests instead",
		    (long long)n, (long long)n);
		goto reject;
	}
	if (opt_bool(req, "stream", &stream, &e) < 0)
		goto reject;
	g->stream = stream;
	so = json_object_get(req, "stream_options");
	if (so && !json_is_null(so)) {
		if (!json_is_object(so) || opt_bool(so, "include_usage", &g->include_usage, &e) < 0) {
			bad(&e, 400, "stream_options", "invalid_type",
			    "'stream_options' must be an object like {\"include_usage\": true}");
			goto reject;
		}
	}
	/* ignore_eos (as vLLM and SGLang accept it): generate max_tokens
	 * whatever the model says, for benchmarks of a fixed output length */
	if (opt_bool(req, "ignore_eos", &ignore_eos, &e) < 0)
		goto reject;
	if (opt_int(req, "max_tokens", 1, INT32_MAX, &max_tokens, &e) < 0)
		goto reject;
	if (kind == GEN_CHAT && !max_tokens &&
	    opt_int(req, "max_completion_tokens", 1, INT32_MAX, &max_tokens, &e) < 0)
		goto reject;
	if (opt_num(req, "temperature", 0, 2, &temperature, &e) < 0 ||
	    opt_num(req, "top_p", 0, 1, &top_p, &e) < 0 ||
	    opt_int(req, "top_k", -1, INT32_MAX, &top_k, &e) < 0)
		goto reject;
	if (top_p <= 0) {
		bad(&e, 400, "top_p", "invalid_value", "'top_p' must be greater than 0 (1 = off)");
		goto reject;
	}
	seed = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ atomic_fetch_add(&h->seq, 1) * 0xbf58476d1ce4e5b9ull;
	if (opt_int(req, "seed", INT64_MIN, INT64_MAX, &iv, &e) < 0)
		goto reject;
	else if (json_is_integer(json_object_get(req, "seed")))
		seed = (uint64_t)iv;
	lp = json_object_get(req, "logprobs");
	if (kind == GEN_COMPLETION) {
		/* legacy: logprobs N = the chosen token's logprob and N alternatives */
		if (!json_is_false(lp) && opt_int(req, "logprobs", 0, HTTP_MAX_LOGPROBS, &iv, &e) < 0)
			goto reject;
		if (lp && json_is_integer(lp)) {
			g->lp_on = 1;
			g->lp_top = (int32_t)iv;
		}
	} else {
		int on = 0;

		if (opt_bool(req, "logprobs", &on, &e) < 0)
			goto reject;
		iv = 0;
		if (opt_int(req, "top_logprobs", 0, HTTP_MAX_LOGPROBS, &iv, &e) < 0)
			goto reject;
		if (!on && json_is_integer(json_object_get(req, "top_logprobs"))) {
			bad(&e, 400, "top_logprobs", "invalid_value",
			    "'top_logprobs' needs \"logprobs\": true");
			goto reject;
		}
		g->lp_on = on;
		g->lp_top = on ? (int32_t)iv : 0;
	}
	if (read_stops(req, g, &e))
		goto reject;
	if (encode_prompt(h, req, kind, 1, &ids, &n_ids, &e))
		goto reject;
	if (!n_ids) {
		bad(&e, 400, kind == GEN_CHAT ? "messages" : "prompt", "invalid_value", "the prompt is empty");
		goto reject;
	}
	if ((int64_t)n_ids >= h->max_context) {
		bad(&e, 400, kind == GEN_CHAT ? "messages" : "prompt", "context_length_exceeded",
		    "This model's maximum context length is %d tokens. However, your prompt has %zu tokens; shorten it",
		    h->max_context, n_ids);
		goto reject;
	}
	if (max_tokens && (int64_t)n_ids + max_tokens > h->max_context) {
		bad(&e, 400, "max_tokens", "context_length_exceeded",
		    "This model's maximum context length is %d tokens. However, you requested %lld tokens (%zu in the prompt, %lld for the completion). Reduce the prompt or max_tokens",
		    h->max_context, (long long)n_ids + max_tokens, n_ids, (long long)max_tokens);
		goto reject;
	}
	if (!max_tokens) {
		max_tokens = h->max_context - (int64_t)n_ids;
		if (max_tokens > h->max_tokens_default)
			max_tokens = h->max_tokens_default;
	}
	g->ds = kn_tok_stream_new(h->tok, KN_TOK_SKIP_SPECIAL);
	if (!g->ds) {
		bad(&e, 500, NULL, NULL, "kn_tok_stream_new failed: %s", strerror(errno));
		goto reject;
	}
	g->n_prompt = (int32_t)n_ids;
	g->max_tokens = (int32_t)max_tokens;
	g->created = (int64_t)time(NULL);
	g->t_start = http_now();
	snprintf(g->rid, sizeof(g->rid), "%s-%016llx", kind == GEN_CHAT ? "chatcmpl" : "cmpl",
		 (unsigned long long)(seed ^ (uint64_t)g->created));

	memset(&r, 0, sizeof(r));
	r.prompt = ids;
	r.n_prompt = (int32_t)n_ids;
	r.max_tokens = (int32_t)max_tokens;
	r.stop_ids = ignore_eos ? NULL : h->stop_ids;
	r.n_stop = ignore_eos ? 0 : h->n_stop;
	r.temperature = (float)temperature;
	r.top_p = (float)top_p;
	r.top_k = top_k < 0 ? 0 : (int32_t)top_k;
	r.seed = (uint32_t)(seed ^ (seed >> 32));
	r.n_logprobs = g->lp_top;
	r.cb = on_event;
	r.cb_arg = g;
	/* The backend's reference exists before it can call back. */
	atomic_fetch_add(&g->refs, 1);
	id = h->be.submit(h->be.ctx, &r);
	free(ids);
	ids = NULL;
	if (id <= 0) {
		atomic_fetch_sub(&g->refs, 1);
		if (id == -EAGAIN)
			bad(&e, 503, NULL, "queue_full",
			    "the request queue is full (max_queue); retry later or raise max_queue");
		else
			bad(&e, id == -EINVAL ? 400 : 500, NULL, NULL, "the scheduler refused the request: %s",
			    strerror((int)-id));
		if (e.status == 503)
			e.type = "service_unavailable";
		goto reject;
	}
	g->id = (uint64_t)id;
	pthread_mutex_lock(&h->mu);
	g->next = h->gens;
	if (h->gens)
		h->gens->prev = g;
	h->gens = g;
	pthread_mutex_unlock(&h->mu);
	cs->gen = g;
	if (kind == GEN_CHAT)
		atomic_fetch_add(&h->n_chat, 1);
	else
		atomic_fetch_add(&h->n_completions, 1);

	if (g->stream) {
		struct MHD_Response *resp;
		atomic_fetch_add(&h->n_streams, 1);
		resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, g, NULL);
		if (!resp)
			return MHD_NO;
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
		{
			enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
			MHD_destroy_response(resp);
			return ret;
		}
	}
	return http_generate_resume(h, c, cs);

reject:
	free(ids);
	gen_unref(g);
	return send_verr(h, c, &e);
}

enum MHD_Result http_tokenize(struct ctrl_http *h, struct MHD_Connection *c, json_t *req)
{
	struct verr e;
	int32_t *ids = NULL;
	size_t n = 0;
	int add_special = 1;
	enum gen_kind kind = json_object_get(req, "messages") ? GEN_CHAT : GEN_COMPLETION;
	json_t *toks, *j;

	atomic_fetch_add(&h->tokenize_calls, 1);
	memset(&e, 0, sizeof(e));
	if (check_model(h, req, 0, &e) || opt_bool(req, "add_special_tokens", &add_special, &e) < 0 ||
	    encode_prompt(h, req, kind, add_special, &ids, &n, &e)) {
		free(ids);
		return send_verr(h, c, &e);
	}
	toks = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(toks, json_integer(ids[i]));
	free(ids);
	j = json_pack("{s:i, s:i, s:o}", "count", (int)n, "max_model_len", h->max_context, "tokens", toks);
	return http_json(h, c, MHD_HTTP_OK, j);
}

enum MHD_Result http_detokenize(struct ctrl_http *h, struct MHD_Connection *c, json_t *req)
{
	struct verr e;
	json_t *t = json_object_get(req, "tokens"), *v;
	int32_t *ids;
	size_t i, len;
	char *text = NULL;
	int rc;
	enum MHD_Result ret;

	memset(&e, 0, sizeof(e));
	if (check_model(h, req, 0, &e))
		return send_verr(h, c, &e);
	if (!t || !json_is_array(t))
		return http_error(h, c, 400, "invalid_request_error", "tokens",
				  t ? "invalid_type" : "missing_required_parameter",
				  "'tokens' must be an array of token ids");
	ids = malloc((json_array_size(t) + 1) * sizeof(int32_t));
	if (!ids)
		return MHD_NO;
	json_array_foreach(t, i, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= kn_tok_vocab_size(h->tok)) {
			free(ids);
			return http_error(h, c, 400, "invalid_request_error", "tokens", "invalid_value",
					  "tokens[%zu] is not a token id of this model (0..%d)", i,
					  kn_tok_vocab_size(h->tok) - 1);
		}
		ids[i] = (int32_t)json_integer_value(v);
	}
	rc = kn_tok_decode(h->tok, ids, json_array_size(t), 0, &text, &len);
	free(ids);
	if (rc)
		return http_error(h, c, 400, "invalid_request_error", "tokens", "invalid_value",
				  "kn_tok_decode failed: %s", strerror(-rc));
	ret = http_json(h, c, MHD_HTTP_OK, json_pack("{s:s%}", "prompt", text, len));
	free(text);
	return ret;
}
