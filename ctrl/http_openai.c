/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The OpenAI-compatible endpoints: the generate / tokenize / detokenize
 * handlers. The requests are read and checked in http_req.c, the request's
 * life is in http_gen.c, its bodies in http_body.c.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "http_int.h"
#include "kvf_mix.h"

static struct gen *gen_new(struct ctrl_http *h, struct MHD_Connection *c, enum gen_kind kind, double t_start)
{
	struct gen *g = calloc(1, sizeof(*g));

	if (!g)
		return NULL;
	pthread_mutex_init(&g->mu, NULL);
	atomic_init(&g->refs, 1);
	g->h = h;
	g->conn = c;
	g->kind = kind;
	g->t_start = t_start;
	g->stop_hit = -1;
	g->stop_token = -1;
	atomic_fetch_add(&h->active, 1);
	return g;
}

/* Choice @p i of the lead @p g. */
static struct gen *choice(struct gen *g, int i)
{
	return i ? g->kids[i - 1] : g;
}

/* Prompt logprobs: an entry per prompt token, not yet scored, whose text
 * (@p echo) starts where the echoed prompt's decoding puts it. */
static int prompt_entries(struct gen *g, const int32_t *ids, int echo, unsigned flags, struct http_verr *e)
{
	struct kn_tok_stream *ds = echo ? kn_tok_stream_new(g->h->tok, flags) : NULL;
	size_t off = 0;
	char buf[512];

	g->plp = calloc((size_t)g->n_prompt, sizeof(*g->plp));
	if (g->plp == NULL || (echo && ds == NULL)) {
		kn_tok_stream_free(ds);
		return http_verr_set(e, 500, NULL, NULL, "out of memory for the prompt's logprobs");
	}
	for (int32_t i = 0; i < g->n_prompt; i++) {
		ssize_t w;

		g->plp[i].token = ids[i];
		g->plp[i].none = 1;
		g->plp[i].off = off < g->text_base ? off : g->text_base;
		if (ds != NULL && (w = kn_tok_stream_push(ds, ids[i], buf, sizeof(buf))) > 0)
			off += (size_t)w;
	}
	kn_tok_stream_free(ds);
	g->plp_missing = g->n_prompt - 1 - g->plp_start; /* the first reported has none */
	return 0;
}

/* The request's settings into choice @p g, of prompt @p p (0: q->ids, else
 * q->more[p - 1]); a choice past the first copies the lead's stop strings. */
static int gen_setup(struct gen *g, const struct http_gen_req *q, int p, struct http_verr *e)
{
	unsigned flags = q->skip_special ? KN_TOK_SKIP_SPECIAL : 0; /* the text's decoding */

	g->stream = q->stream;
	g->include_usage = q->include_usage;
	g->lp_on = q->lp_on;
	g->lp_top = q->lp_top;
	g->lp_report = q->lp_report;
	g->lp_text = q->lp_text;
	g->max_stop = q->max_stop;
	g->n_prompt = (int32_t)(p ? q->more[p - 1].n_ids : q->n_ids);
	g->max_tokens = (int32_t)(p ? q->more[p - 1].max_tokens : q->max_tokens);
	g->created = (int64_t)time(NULL);
	if (g->lead && g->lead->n_stops) {
		const struct gen *l = g->lead;

		g->stops = calloc((size_t)l->n_stops, sizeof(*g->stops));
		for (int i = 0; g->stops && i < l->n_stops; i++, g->n_stops++)
			if (!(g->stops[i] = strdup(l->stops[i])))
				break;
		if (g->n_stops < l->n_stops)
			return http_verr_set(e, 500, NULL, NULL, "out of memory copying the stop strings");
	}
	g->keep_stop = q->keep_stop;
	g->tool_parse = q->tool_parse;
	g->ds = kn_tok_stream_new(g->h->tok, flags);
	if (!g->ds)
		return http_verr_set(e, 500, NULL, NULL, "kn_tok_stream_new failed: %s", strerror(errno));
	if (q->echo) {
		/* the prompt as its tokens read (a string prompt reads back as sent) */
		char *txt = NULL;
		size_t len = 0;
		int rc = kn_tok_decode(g->h->tok, p ? q->more[p - 1].ids : q->ids, p ? q->more[p - 1].n_ids : q->n_ids,
				       flags, &txt, &len);

		if (rc || kvf_buf_add(&g->text, txt, len)) {
			free(txt);
			return http_verr_set(e, 500, NULL, NULL, "the prompt's text for echo: %s", strerror(rc ? -rc : ENOMEM));
		}
		free(txt);
		g->text_base = len;
	}
	g->plp_start = q->lp_start > 0 ? (int32_t)q->lp_start : 0;
	if (q->prompt_lp && g->index % q->n != 0) {
		/* the prompt's first choice scores it for all n */
		int32_t first = g->index - g->index % (int32_t)q->n;

		g->plp_src = choice(g->lead, first);
		return 0;
	}
	if (q->prompt_lp && prompt_entries(g, p ? q->more[p - 1].ids : q->ids, q->echo, flags, e))
		return -1;
	return 0;
}

/* The response id: not from the seed, since two requests of one seed in one
 * second would share it. A bijection of a per-server counter never repeats
 * within the server's life; the random salt keeps two servers' apart. */
static void gen_rid(struct gen *g, const struct http_gen_req *q)
{
	struct ctrl_http *h = g->h;
	uint64_t x;

	if (g->kind == GEN_NATIVE && q->rid != NULL) {
		snprintf(g->rid, sizeof(g->rid), "%s", q->rid); /* the client's (SGLang's rid) */
		return;
	}
	x = kvf_mix64(h->id_salt + atomic_fetch_add(&h->ids, 1));
	if (g->kind == GEN_NATIVE) /* 32 hex digits, as SGLang's ids */
		snprintf(g->rid, sizeof(g->rid), "%016llx%016llx", (unsigned long long)x,
			 (unsigned long long)kvf_mix64(x ^ h->id_salt));
	else
		snprintf(g->rid, sizeof(g->rid), "%s-%016llx", g->kind == GEN_CHAT ? "chatcmpl" : "cmpl",
			 (unsigned long long)x);
}

/* The scheduler's refusal @p id (< 0) as the client's error. */
static void submit_error(struct http_verr *e, int64_t id, const struct http_gen_req *q)
{
	if (id == -EAGAIN)
		http_verr_set(e, 503, NULL, "queue_full",
		    "the request queue is full (max_queue%s); retry later or raise max_queue",
		    q->n > 1 ? ": each of the n choices takes a place in it" : "");
	else if (id == -ENETDOWN)
		http_verr_set(e, 503, NULL, "no_prefill_node",
		    "no prefill node is healthy (every [pd] prefill node missed its heartbeats, or its "
		    "kvferry-dataplane has not been heard for 10 s); retry later, or check the prefill nodes "
		    "(ctrlctl bootstrap, /stats backend.pd)");
	else if (id == -EHOSTUNREACH)
		http_verr_set(e, 400, "bootstrap_host", "unknown_prefill_node",
		    "bootstrap_host '%s' (bootstrap_port %lld) is not one of this decode node's prefill "
		    "nodes: add its host:bootstrap_port to [pd] prefill (ctrlctl bootstrap lists them)",
		    q->bhost ? q->bhost : "", (long long)q->bport);
	else if (id == -ESHUTDOWN)
		http_verr_set(e, 503, NULL, "pd_released",
		    "this decode node released its prefill registrations (ctrlctl pd release): "
		    "ctrlctl pd restore serves again");
	else
		http_verr_set(e, id == -EINVAL ? 400 : 500, NULL, NULL, "the scheduler refused the request: %s",
		    strerror((int)-id));
	if (e->status == 503)
		e->type = "service_unavailable";
}

/* Hand choice @p g to the backend. @return 0, or -1 with @p e filled. */
static int gen_submit(struct gen *g, struct ctrl_request *r, const struct http_gen_req *q, struct http_verr *e)
{
	struct ctrl_http *h = g->h;
	int64_t id;

	r->cb_arg = g;
	/* The backend's reference exists before it can call back. */
	atomic_fetch_add(&g->refs, 1);
	if (q->room >= 0 && h->be.submit_pd != NULL) {
		struct ctrl_http_pd pd = { .room = (uint64_t)q->room, .port = (int32_t)q->bport, .host = q->bhost,
					   .session = (uint32_t)q->psession };

		id = h->be.submit_pd(h->be.ctx, r, &pd);
	} else {
		id = h->be.submit(h->be.ctx, r);
	}
	if (id <= 0) {
		atomic_fetch_sub(&g->refs, 1);
		submit_error(e, id, q);
		return -1;
	}
	g->id = (uint64_t)id;
	pthread_mutex_lock(&h->mu);
	g->next = h->gens;
	if (h->gens)
		h->gens->prev = g;
	h->gens = g;
	pthread_mutex_unlock(&h->mu);
	return 0;
}

/* Choice @p i's draw key: choice 0 keeps the request's seed (n = 1 answers
 * as before), the others a bijection of (seed, i), so a seeded request with
 * n > 1 repeats exactly and its choices differ. */
static uint32_t choice_seed(uint64_t seed, int i)
{
	uint64_t s = i ? kvf_mix64(seed ^ kvf_mix64((uint64_t)i)) : seed;

	return (uint32_t)(s ^ (s >> 32));
}

enum MHD_Result http_generate(struct ctrl_http *h, struct MHD_Connection *c, struct conn_state *cs,
			      enum gen_kind kind, json_t *req)
{
	struct http_verr e;
	struct http_gen_req q;
	struct gen *g;
	struct ctrl_request r;
	int32_t *stops = NULL;
	int n_sub = 0, total;

	memset(&e, 0, sizeof(e));
	/* arrival: validation, templating and tokenizing count in its latency */
	g = gen_new(h, c, kind, http_now());
	if (!g)
		return MHD_NO;

	if (http_read_gen(h, kind, req, &q, &e)) {
		gen_unref(g);
		return http_verr_send(h, c, &e);
	}
	total = (int)q.n * (1 + q.n_more);
	g->per_prompt = (int32_t)q.n;
	g->stops = q.stops; /* the lead's from here */
	g->n_stops = q.n_stops;
	q.stops = NULL;
	q.n_stops = 0;
	if (gen_setup(g, &q, 0, &e))
		goto reject;
	gen_rid(g, &q);
	if (total > 1) {
		g->kids = calloc((size_t)total - 1, sizeof(*g->kids));
		if (!g->kids) {
			http_verr_set(&e, 500, NULL, NULL, "out of memory for %d choices", total);
			goto reject;
		}
		for (; g->n_kids < total - 1; g->n_kids++) {
			struct gen *k = gen_new(h, c, kind, g->t_start);

			if (!k) {
				http_verr_set(&e, 500, NULL, NULL, "out of memory for %d choices", total);
				goto reject;
			}
			g->kids[g->n_kids] = k;
			k->index = g->n_kids + 1;
			k->lead = g;
			atomic_fetch_add(&g->refs, 1); /* the choice's on the lead */
			memcpy(k->rid, g->rid, sizeof(k->rid));
			k->created = g->created;
			if (gen_setup(k, &q, (g->n_kids + 1) / (int)q.n, &e)) {
				g->n_kids++;
				goto reject;
			}
		}
	}

	memset(&r, 0, sizeof(r));
	r.stop_ids = q.ignore_eos ? NULL : h->stop_ids;
	r.n_stop = q.ignore_eos ? 0 : h->n_stop;
	if (q.n_stop_ids > 0) {
		/* the model's end tokens (unless ignore_eos), then the request's */
		stops = malloc(sizeof(int32_t) * (size_t)(r.n_stop + q.n_stop_ids));
		if (!stops) {
			http_verr_set(&e, 500, NULL, NULL, "out of memory for the stop token ids");
			goto reject;
		}
		memcpy(stops, h->stop_ids, sizeof(int32_t) * (size_t)r.n_stop);
		memcpy(stops + r.n_stop, q.stop_ids, sizeof(int32_t) * (size_t)q.n_stop_ids);
		r.stop_ids = stops;
		r.n_stop += q.n_stop_ids;
	}
	r.temperature = (float)q.temperature;
	r.top_p = (float)q.top_p;
	r.top_k = q.top_k < 0 ? 0 : (int32_t)q.top_k;
	r.n_logprobs = g->lp_top;
	r.cb = gen_on_event;
	for (; n_sub < total; n_sub++) {
		int p = n_sub / (int)q.n;

		/* the first position scored (the one after the first reported),
		 * by each prompt's first choice */
		r.prompt_logprobs = q.prompt_lp && n_sub % q.n == 0 ? (int32_t)(q.lp_start > 0 ? q.lp_start : 0) + 1 : 0;

		r.prompt = p ? q.more[p - 1].ids : q.ids;
		r.n_prompt = (int32_t)(p ? q.more[p - 1].n_ids : q.n_ids);
		r.max_tokens = (int32_t)(p ? q.more[p - 1].max_tokens : q.max_tokens);
		r.seed = choice_seed(q.seed, n_sub);
		/* the prompt's later choices read its first one's computed prompt */
		r.prefill_from = n_sub % q.n ? choice(g, n_sub - n_sub % (int)q.n)->id : 0;
		if (gen_submit(choice(g, n_sub), &r, &q, &e))
			goto reject;
	}
	http_gen_req_free(&q);
	free(stops);
	cs->gen = g;
	if (kind == GEN_CHAT)
		atomic_fetch_add(&h->n_chat, 1);
	else if (kind == GEN_NATIVE)
		atomic_fetch_add(&h->n_generate, 1);
	else
		atomic_fetch_add(&h->n_completions, 1);

	if (g->stream) {
		struct MHD_Response *resp;
		atomic_fetch_add(&h->n_streams, 1);
		resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, gen_stream_read, g, NULL);
		if (!resp)
			return MHD_NO;
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
		http_cors(h, c, resp);
		{
			enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
			MHD_destroy_response(resp);
			return ret;
		}
	}
	return http_generate_resume(h, c, cs);

reject:
	http_gen_req_free(&q);
	free(stops);
	/* the choices already submitted end (their finish events drop the
	 * backend's references), then the connection's references go */
	gen_abandon(g, n_sub);
	return http_verr_send(h, c, &e);
}

enum MHD_Result http_tokenize(struct ctrl_http *h, struct MHD_Connection *c, json_t *req)
{
	struct http_verr e;
	json_t *j;

	atomic_fetch_add(&h->tokenize_calls, 1);
	if (http_read_tokenize(h, req, &j, &e))
		return http_verr_send(h, c, &e);
	return http_json(h, c, MHD_HTTP_OK, j);
}

enum MHD_Result http_detokenize(struct ctrl_http *h, struct MHD_Connection *c, json_t *req)
{
	struct http_verr e;
	json_t *j;
	int rc = http_read_detokenize(h, req, &j, &e);

	if (rc == -ENOMEM)
		return MHD_NO;
	if (rc)
		return http_verr_send(h, c, &e);
	return http_json(h, c, MHD_HTTP_OK, j);
}
