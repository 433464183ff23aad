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

/* splitmix64's finalizer: a bijection of 64-bit words. */
static uint64_t mix64(uint64_t x)
{
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

enum MHD_Result http_generate(struct ctrl_http *h, struct MHD_Connection *c, struct conn_state *cs,
			      enum gen_kind kind, json_t *req)
{
	struct http_verr e;
	struct http_gen_req q;
	struct gen *g;
	struct ctrl_request r;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	int64_t id;

	memset(&e, 0, sizeof(e));
	g = calloc(1, sizeof(*g));
	if (!g)
		return MHD_NO;
	pthread_mutex_init(&g->mu, NULL);
	atomic_init(&g->refs, 1);
	g->h = h;
	g->conn = c;
	g->kind = kind;
	g->t_start = http_now(); /* arrival: validation, templating and tokenizing count in its latency */
	atomic_fetch_add(&h->active, 1);

	if (http_read_gen(h, kind, req, &q, &e))
		goto reject;
	g->stream = q.stream;
	g->include_usage = q.include_usage;
	g->lp_on = q.lp_on;
	g->lp_top = q.lp_top;
	g->lp_report = q.lp_report;
	g->lp_text = q.lp_text;
	g->stop_hit = -1;
	g->stop_token = -1;
	g->stops = q.stops; /* the request owns them from here */
	g->n_stops = q.n_stops;
	g->max_stop = q.max_stop;
	ids = q.ids;
	n_ids = q.n_ids;
	g->ds = kn_tok_stream_new(h->tok, KN_TOK_SKIP_SPECIAL);
	if (!g->ds) {
		http_verr_set(&e, 500, NULL, NULL, "kn_tok_stream_new failed: %s", strerror(errno));
		goto reject;
	}
	g->n_prompt = (int32_t)n_ids;
	g->max_tokens = (int32_t)q.max_tokens;
	g->created = (int64_t)time(NULL);
	/* Not from the seed: two requests of one seed in one second would
	 * share it. A bijection of a per-server counter never repeats within
	 * the server's life; the random salt keeps two servers' apart. */
	if (kind == GEN_NATIVE && q.rid != NULL) {
		snprintf(g->rid, sizeof(g->rid), "%s", q.rid); /* the client's (SGLang's rid) */
	} else {
		uint64_t x = mix64(h->id_salt + atomic_fetch_add(&h->ids, 1));

		if (kind == GEN_NATIVE) /* 32 hex digits, as SGLang's ids */
			snprintf(g->rid, sizeof(g->rid), "%016llx%016llx", (unsigned long long)x,
				 (unsigned long long)mix64(x ^ h->id_salt));
		else
			snprintf(g->rid, sizeof(g->rid), "%s-%016llx", kind == GEN_CHAT ? "chatcmpl" : "cmpl",
				 (unsigned long long)x);
	}

	memset(&r, 0, sizeof(r));
	r.prompt = ids;
	r.n_prompt = (int32_t)n_ids;
	r.max_tokens = (int32_t)q.max_tokens;
	r.stop_ids = q.ignore_eos ? NULL : h->stop_ids;
	r.n_stop = q.ignore_eos ? 0 : h->n_stop;
	r.temperature = (float)q.temperature;
	r.top_p = (float)q.top_p;
	r.top_k = q.top_k < 0 ? 0 : (int32_t)q.top_k;
	r.seed = (uint32_t)(q.seed ^ (q.seed >> 32));
	r.n_logprobs = g->lp_top;
	r.cb = gen_on_event;
	r.cb_arg = g;
	/* The backend's reference exists before it can call back. */
	atomic_fetch_add(&g->refs, 1);
	if (q.room >= 0 && h->be.submit_pd != NULL) {
		struct ctrl_http_pd pd = { .room = (uint64_t)q.room, .port = (int32_t)q.bport, .host = q.bhost,
					   .session = (uint32_t)q.psession };

		id = h->be.submit_pd(h->be.ctx, &r, &pd);
	} else {
		id = h->be.submit(h->be.ctx, &r);
	}
	free(ids);
	ids = NULL;
	if (id <= 0) {
		atomic_fetch_sub(&g->refs, 1);
		if (id == -EAGAIN)
			http_verr_set(&e, 503, NULL, "queue_full",
			    "the request queue is full (max_queue); retry later or raise max_queue");
		else if (id == -ENETDOWN)
			http_verr_set(&e, 503, NULL, "no_prefill_node",
			    "no prefill node is healthy (every [pd] prefill node missed its heartbeats, or its "
			    "kvferry-dataplane has not been heard for 10 s); retry later, or check the prefill nodes "
			    "(ctrlctl bootstrap, /stats backend.pd)");
		else if (id == -EHOSTUNREACH)
			http_verr_set(&e, 400, "bootstrap_host", "unknown_prefill_node",
			    "bootstrap_host '%s' (bootstrap_port %lld) is not one of this decode node's prefill "
			    "nodes: add its host:bootstrap_port to [pd] prefill (ctrlctl bootstrap lists them)",
			    q.bhost ? q.bhost : "", (long long)q.bport);
		else if (id == -ESHUTDOWN)
			http_verr_set(&e, 503, NULL, "pd_released",
			    "this decode node released its prefill registrations (ctrlctl pd release): "
			    "ctrlctl pd restore serves again");
		else
			http_verr_set(&e, id == -EINVAL ? 400 : 500, NULL, NULL, "the scheduler refused the request: %s",
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
