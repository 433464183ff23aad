/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: a streamed answer's life after its request was read:
 * the backend's token events queued (gen_on_event), taken by the
 * connection's pump at arbitrary points (gen_pump: streaming decode, stop
 * strings cut, logprob entries) and turned into SSE chunks (stream_build:
 * the tail that may grow into a stop string held back, logprobs per chunk,
 * the finish, usage, [DONE]), with models/ferry's tokenizer.
 *
 * Input: byte 0: bit 0 chat (else completion), bits 1-2 the finish
 * (length, stop, cancelled, error); then a request body (http_read_body,
 * http_read_gen: stops, logprobs, stream_options), a NUL byte, and the
 * events: 3 bytes each, a token id (16 bits, modulo the vocabulary) and a
 * control byte (bit 0: pump after it, bit 1: build the chunks after it,
 * bits 2-6: top logprobs it carries).
 *
 * Beyond the sanitizers it checks what a streaming client reads: every
 * event is a JSON object (or the final [DONE]), the answer ends once every
 * event was queued, the streamed text is the answer's text, holds no stop
 * string, and is the tokens' decode cut exactly before the first stop
 * string (the whole decode when none came).
 *
 * The pump and the builder are static: the target includes http_gen.c and
 * http_body.c (as unit tests may); the library's copies are never linked.
 */
#include <stdint.h>

#include "http_body.c"
#include "http_gen.c"

static struct ctrl_http g_h;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int cancel(void *ctx, uint64_t id)
{
	(void)ctx;
	(void)id;
	return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char path[4096], err[512];

	(void)argc;
	(void)argv;
	snprintf(path, sizeof(path), "%s/models/ferry", KVF_SOURCE_ROOT);
	g_h.tok = kn_tok_open(path, err, sizeof(err));
	if (!g_h.tok) {
		fprintf(stderr, "fuzz_http_stream: %s\n", err);
		exit(1);
	}
	g_h.model = "kvferry-fuzz";
	g_h.max_context = 1024;
	g_h.max_tokens_default = 256;
	g_h.be.cancel = cancel;
	pthread_mutex_init(&g_h.mu, NULL);
	return 0;
}

/* What the client reads: the SSE bytes built so far. */
static void take(struct gen *g, struct kvf_buf *wire)
{
	if (kvf_buf_add(wire, g->out.p ? g->out.p : "", g->out.len))
		abort();
	g->out.len = 0;
	g->out_off = 0;
}

/* The text of the SSE events in @p wire (aborts on a malformed one). */
static void streamed_text(const struct kvf_buf *wire, enum gen_kind kind, struct kvf_buf *text)
{
	const char *p = wire->p ? wire->p : "", *end = p + wire->len;
	int done = 0;

	kvf_buf_add(text, "", 0);
	while (p < end) {
		const char *e = strstr(p, "\n\n");
		json_t *j, *c, *t;

		if (done || !e || strncmp(p, "data: ", 6))
			abort();
		if (e - p == 12 && !strncmp(p + 6, "[DONE]", 6)) {
			done = 1;
		} else {
			/* a token of byte 0 is text too: "\u0000" is valid JSON */
			j = json_loadb(p + 6, (size_t)(e - p - 6), JSON_ALLOW_NUL, NULL);
			if (!json_is_object(j))
				abort();
			c = json_array_get(json_object_get(j, "choices"), 0);
			t = kind == GEN_CHAT ? json_object_get(json_object_get(c, "delta"), "content")
					     : json_object_get(c, "text");
			if (json_is_string(t))
				kvf_buf_add(text, json_string_value(t), json_string_length(t));
			json_decref(j);
		}
		p = e + 2;
	}
	if (!done)
		abort();
}

static void check(struct gen *g, const struct kvf_buf *wire, const int32_t *ids, size_t n)
{
	struct kvf_buf text = {0};
	char *full;
	size_t full_len;

	streamed_text(wire, g->kind, &text);
	if (text.len != g->text.len || (text.len && memcmp(text.p, g->text.p, text.len)))
		abort();
	for (int i = 0; i < g->n_stops; i++)
		if (memmem(text.p, text.len, g->stops[i], strlen(g->stops[i])))
			abort();
	if (kn_tok_decode(g_h.tok, ids, n, KN_TOK_SKIP_SPECIAL, &full, &full_len))
		abort();
	if (text.len > full_len || memcmp(text.p, full, text.len))
		abort();
	if (!g->cut && text.len != full_len)
		abort();
	if (g->cut) {
		int at_stop = 0;

		for (int i = 0; i < g->n_stops; i++)
			at_stop |= !strncmp(full + text.len, g->stops[i], strlen(g->stops[i]));
		if (!at_stop)
			abort();
	}
	free(full);
	kvf_buf_free(&text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const enum ctrl_finish fin[4] = {CTRL_FINISH_LENGTH, CTRL_FINISH_STOP, CTRL_FINISH_CANCELLED,
						CTRL_FINISH_ERROR};
	const uint8_t *ev = size ? memchr(data, 0, size) : NULL;
	int32_t vocab = kn_tok_vocab_size(g_h.tok), *ids;
	struct http_verr e;
	struct http_gen_req q;
	struct kvf_buf wire = {0};
	struct ctrl_event ce;
	struct gen *g;
	size_t n_ev, n = 0;
	json_t *req;
	enum gen_kind kind;

	if (!ev)
		return 0;
	kind = data[0] & 1 ? GEN_CHAT : GEN_COMPLETION;
	req = http_read_body((const char *)data + 1, (size_t)(ev - data) - 1, &e);
	if (!req)
		return 0;
	if (http_read_gen(&g_h, kind, req, &q, &e)) {
		json_decref(req);
		return 0;
	}
	json_decref(req);
	ev++;
	n_ev = (size_t)(data + size - ev) / 3;
	ids = malloc((n_ev + 1) * sizeof(*ids));
	g = calloc(1, sizeof(*g));
	if (!ids || !g)
		abort();
	/* as http_generate() makes it, streaming */
	pthread_mutex_init(&g->mu, NULL);
	atomic_init(&g->refs, 2); /* the connection's and the backend's */
	atomic_fetch_add(&g_h.active, 1);
	g->h = &g_h;
	g->kind = kind;
	g->id = 1;
	g->stream = 1;
	g->include_usage = q.include_usage;
	g->lp_on = q.lp_on;
	g->lp_top = q.lp_top;
	g->stops = q.stops;
	g->n_stops = q.n_stops;
	g->max_stop = q.max_stop;
	g->n_prompt = (int32_t)q.n_ids;
	g->max_tokens = (int32_t)q.max_tokens;
	snprintf(g->rid, sizeof(g->rid), "cmpl-fuzz");
	free(q.ids);
	g->ds = kn_tok_stream_new(g_h.tok, KN_TOK_SKIP_SPECIAL);
	if (!g->ds)
		abort();

	for (size_t i = 0; i < n_ev; i++, ev += 3) {
		int32_t top[32];
		float lps[32];
		int n_top = ev[2] >> 2 & 31;

		ids[i] = (int32_t)(((uint32_t)ev[0] | (uint32_t)ev[1] << 8) % (uint32_t)vocab);
		if (!kn_tok_token_bytes(g_h.tok, ids[i], NULL))
			continue;
		for (int k = 0; k < n_top; k++) {
			top[k] = (ids[i] + k) % vocab;
			lps[k] = -0.25f * (float)k;
		}
		memset(&ce, 0, sizeof(ce));
		ce.id = 1;
		ce.token = ids[i];
		ce.logprob = -(float)ev[2] / 64.0f;
		ce.n_generated = (int32_t)++n;
		ce.n_top = n_top;
		ce.top_ids = top;
		ce.top_logprobs = lps;
		ids[n - 1] = ids[i];
		gen_on_event(g, &ce);
		if (ev[2] & 1)
			gen_pump(g);
		if (ev[2] & 2) {
			stream_build(g);
			take(g, &wire);
		}
	}
	memset(&ce, 0, sizeof(ce));
	ce.id = 1;
	ce.finish = fin[data[0] >> 1 & 3];
	ce.token = -1;
	ce.n_generated = (int32_t)n;
	ce.message = ce.finish == CTRL_FINISH_ERROR ? "the stage chain failed" : NULL;
	gen_on_event(g, &ce); /* drops the backend's reference */
	/* every event is queued: two rounds of the reader end the answer */
	for (int i = 0; i < 2 && !g->final_sent; i++) {
		gen_pump(g);
		stream_build(g);
		take(g, &wire);
	}
	if (!g->final_sent || !g->done)
		abort();
	if (!g->failed)
		check(g, &wire, ids, n);
	kvf_buf_free(&wire);
	free(ids);
	gen_unref(g);
	return 0;
}
