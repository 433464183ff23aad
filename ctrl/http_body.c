/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The bodies of the OpenAI endpoints: completion and chat JSON, SSE chunks,
 * logprob objects, usage, and the streaming reader MHD calls. Built from
 * what gen_pump (http_gen.c) gathered; called by the endpoints
 * (http_openai.c).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "http_int.h"

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
	kvf_buf_add(&g->out, "data: ", 6);
	kvf_buf_str(&g->out, s);
	kvf_buf_add(&g->out, "\n\n", 2);
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

static void stream_end(struct gen *g)
{
	kvf_buf_add(&g->out, "data: [DONE]\n\n", 14);
	g->final_sent = 1;
	note_done(g);
}

static void stream_error(struct gen *g)
{
	sse(g, json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message",
			 g->fail_msg ? g->fail_msg : "generation failed", "type", "server_error",
			 "param", "code", "generation_failed"));
}

/* /generate's events: each one the whole answer so far (SGLang's), the
 * last with its finish_reason. */
static void native_build(struct gen *g)
{
	size_t upto = g->done ? g->text.len : g->text.len - held_back(g), valid = lp_valid(g), lp_upto = g->lp_sent;

	while (lp_upto < valid && (g->done || g->lp[lp_upto].off < upto))
		lp_upto++;
	if (!g->failed && !g->done && (upto > g->emitted || lp_upto > g->lp_sent)) {
		sse(g, http_native_json(g, upto, lp_upto, 0));
		g->emitted = upto;
		g->lp_sent = lp_upto;
	}
	if (!g->done || g->final_sent)
		return;
	if (g->failed)
		stream_error(g);
	else
		sse(g, http_native_json(g, g->text.len, valid, 1));
	stream_end(g);
}

/* Append to g->out the SSE events that are now due. */
static void stream_build(struct gen *g)
{
	size_t upto, lp_upto = g->lp_sent;

	if (g->kind == GEN_NATIVE) {
		native_build(g);
		return;
	}
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
		stream_error(g);
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
	stream_end(g);
}

ssize_t gen_stream_read(void *cls, uint64_t pos, char *buf, size_t max)
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
		if (http_peer_closed(g->conn))
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
	if (g->kind == GEN_NATIVE)
		return http_json(h, c, MHD_HTTP_OK, http_native_json(g, g->text.len, lp_valid(g), 1));
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
		if (http_peer_closed(c))
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
