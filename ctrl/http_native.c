/* SPDX-License-Identifier: Apache-2.0 */
/*
 * SGLang's native generation endpoint, POST /generate: what SGLang's router
 * (its mini load balancer and sgl-router) sends to both nodes of a
 * prefill/decode pair, and what SGLang's own tools and docs use. A request
 * names its prompt as "text" (encoded, BOS as /v1/completions does) or
 * "input_ids", its sampling in a "sampling_params" object (max_new_tokens,
 * default 128; temperature, top_p, top_k, stop, ignore_eos, sampling_seed),
 * and may carry stream, return_logprob, top_logprobs_num,
 * return_text_in_logprobs, rid and the bootstrap fields. The answer (each
 * streamed event too, with the text and ids so far) is
 *   {"text", "output_ids", "meta_info": {"id", "finish_reason",
 *    "prompt_tokens", "completion_tokens", "cached_tokens", ...}}
 * with finish_reason null until the end, then {"type": "length", "length":
 * N}, {"type": "stop", "matched": <token id or stop string>} or {"type":
 * "abort", "message"}.
 *
 * As on the OpenAI routes, a parameter that would change what is generated
 * and that kvferry does not implement is refused by name at any value but
 * its default, and an unknown sampling parameter is refused (as SGLang's
 * SamplingParams does): nothing is silently ignored. One prompt per
 * request: a batch (text as a list) is refused, naming the fix.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_int.h"
#include "kvf_config.h"

/* Fields kvferry accepts only at their default (the value that asks for nothing). */
static const struct http_fixed g_top_fixed[] = {
	{"input_embeds", HTTP_NEUTRAL_EMPTY, "null"},
	{"image_data", HTTP_NEUTRAL_EMPTY, "null"},
	{"audio_data", HTTP_NEUTRAL_EMPTY, "null"},
	{"video_data", HTTP_NEUTRAL_EMPTY, "null"},
	{"lora_path", HTTP_NEUTRAL_EMPTY, "null"},
	{"session_params", HTTP_NEUTRAL_EMPTY, "null"},
	{"custom_logit_processor", HTTP_NEUTRAL_EMPTY, "null"},
	{"token_ids_logprob", HTTP_NEUTRAL_EMPTY, "null"},
	{"return_hidden_states", HTTP_NEUTRAL_FALSE, "false"},
};

static const struct http_fixed g_sp_fixed[] = {
	{"n", HTTP_NEUTRAL_ONE, "1"},
	{"min_new_tokens", HTTP_NEUTRAL_ZERO, "0"},
	{"min_p", HTTP_NEUTRAL_ZERO, "0"},
	{"frequency_penalty", HTTP_NEUTRAL_ZERO, "0"},
	{"presence_penalty", HTTP_NEUTRAL_ZERO, "0"},
	{"repetition_penalty", HTTP_NEUTRAL_ONE, "1"},
	{"spaces_between_special_tokens", HTTP_NEUTRAL_TRUE, "true"},
	{"json_schema", HTTP_NEUTRAL_EMPTY, "null"},
	{"regex", HTTP_NEUTRAL_EMPTY, "null"},
	{"ebnf", HTTP_NEUTRAL_EMPTY, "null"},
	{"structural_tag", HTTP_NEUTRAL_EMPTY, "null"},
	{"logit_bias", HTTP_NEUTRAL_EMPTY, "{}"},
	{"custom_params", HTTP_NEUTRAL_EMPTY, "null"},
};

/* Sampling parameters read below, or that change nothing generated. */
static const char *const g_sp_read[] = {
	"max_new_tokens", "temperature", "top_p", "top_k", "stop", "ignore_eos", "sampling_seed", "seed",
	"stream_interval", "stop_token_ids", "skip_special_tokens", "no_stop_trim",
};

static int known_sp(const char *key)
{
	for (size_t i = 0; i < sizeof(g_sp_read) / sizeof(g_sp_read[0]); i++)
		if (!strcmp(key, g_sp_read[i]))
			return 1;
	for (size_t i = 0; i < sizeof(g_sp_fixed) / sizeof(g_sp_fixed[0]); i++)
		if (!strcmp(key, g_sp_fixed[i].key))
			return 1;
	return 0;
}

static int read_sampling(struct ctrl_http *h, json_t *sp, struct http_gen_req *q, struct http_verr *e)
{
	const char *key;
	json_t *v;
	int64_t iv;

	if (sp == NULL || json_is_null(sp))
		return 0;
	if (!json_is_object(sp))
		return http_verr_set(e, 400, "sampling_params", "invalid_type",
				     "'sampling_params' must be an object like {\"max_new_tokens\": 64, \"temperature\": 0}");
	json_object_foreach(sp, key, v) {
		if (!known_sp(key))
			return http_verr_set(e, 400, key, "unsupported_parameter",
					     "sampling_params has an unknown parameter '%s' (kvferry reads max_new_tokens, "
					     "temperature, top_p, top_k, stop, stop_token_ids, ignore_eos, skip_special_tokens, "
					     "no_stop_trim, sampling_seed)", key);
	}
	if (http_check_fixed(sp, g_sp_fixed, sizeof(g_sp_fixed) / sizeof(g_sp_fixed[0]), "sampling_params ", e))
		return -1;
	if (http_opt_int(sp, "max_new_tokens", 0, INT32_MAX, &q->max_tokens, e) < 0
	    || http_opt_num(sp, "temperature", 0, 2, &q->temperature, e) < 0
	    || http_opt_num(sp, "top_p", 0, 1, &q->top_p, e) < 0 || http_opt_int(sp, "top_k", -1, INT32_MAX, &q->top_k, e) < 0
	    || http_opt_bool(sp, "ignore_eos", &q->ignore_eos, e) < 0 || http_read_stop_ids(h, sp, q, e)
	    || http_opt_bool(sp, "skip_special_tokens", &q->skip_special, e) < 0
	    || http_opt_bool(sp, "no_stop_trim", &q->keep_stop, e) < 0)
		return -1;
	q->no_tokens = json_is_integer(json_object_get(sp, "max_new_tokens")) && q->max_tokens == 0;
	if (q->top_p <= 0)
		return http_verr_set(e, 400, "top_p", "invalid_value", "'top_p' must be greater than 0 (1 = off)");
	if (http_opt_int(sp, "sampling_seed", INT64_MIN, INT64_MAX, &iv, e) == 0)
		q->seed = (uint64_t)iv;
	else if (e->status)
		return -1;
	else if (http_opt_int(sp, "seed", INT64_MIN, INT64_MAX, &iv, e) == 0)
		q->seed = (uint64_t)iv;
	else if (e->status)
		return -1;
	return http_read_stops(sp, q, e);
}

int http_read_native(struct ctrl_http *h, json_t *req, struct http_gen_req *q, struct http_verr *e)
{
	json_t *text = json_object_get(req, "text"), *ids = json_object_get(req, "input_ids"), *v;
	int has_text = text != NULL && !json_is_null(text), has_ids = ids != NULL && !json_is_null(ids);
	int64_t top = 0;

	if (has_text && has_ids)
		return http_verr_set(e, 400, "input_ids", "invalid_value", "send either 'text' or 'input_ids', not both");
	if (!has_text && !has_ids)
		return http_verr_set(e, 400, "text", "missing_required_parameter",
				     "you must provide the prompt as 'text' or 'input_ids'");
	if ((has_text && json_is_array(text))
	    || (has_ids && json_is_array(ids) && json_array_size(ids) > 0 && json_is_array(json_array_get(ids, 0))))
		return http_verr_set(e, 400, has_text ? "text" : "input_ids", "unsupported_value",
				     "a batch of prompts is not supported: send one request per prompt (a string in "
				     "'text', or one array of token ids in 'input_ids')");
	if (has_text && !json_is_string(text))
		return http_verr_set(e, 400, "text", "invalid_type", "'text' must be a string");
	if (http_check_fixed(req, g_top_fixed, sizeof(g_top_fixed) / sizeof(g_top_fixed[0]), "", e)
	    || http_opt_bool(req, "stream", &q->stream, e) < 0 || http_opt_bool(req, "return_logprob", &q->lp_report, e) < 0
	    || http_opt_bool(req, "return_text_in_logprobs", &q->lp_text, e) < 0
	    || http_opt_int(req, "top_logprobs_num", 0, HTTP_MAX_LOGPROBS, &top, e) < 0
	    || http_opt_int(req, "logprob_start_len", -1, INT32_MAX, &q->lp_start, e) < 0)
		return -1;
	v = json_object_get(req, "rid");
	if (v != NULL && !json_is_null(v) && (!json_is_string(v) || json_string_length(v) == 0
					       || json_string_length(v) > 40))
		return http_verr_set(e, 400, "rid", "invalid_value", "'rid' must be a string of 1 to 40 characters");
	q->rid = json_string_value(v);
	q->lp_on = 1; /* the output ids are the logprob entries' tokens */
	q->lp_top = q->lp_report ? (int32_t)top : 0;
	if (read_sampling(h, json_object_get(req, "sampling_params"), q, e) || http_read_bootstrap(req, q, e))
		return -1;
	/* the prompt's logprobs from logprob_start_len on (with return_logprob, as SGLang's) */
	if (!q->lp_report)
		q->lp_start = -1;
	q->prompt_lp = q->lp_start >= 0;
	if (http_pd_prompt_only(q, "max_new_tokens", "logprob_start_len", e))
		return -1;
	q->prompt_param = has_text ? "text" : "input_ids";
	return http_prompt_ids(h, has_text ? text : ids, q->prompt_param, 1, &q->ids, &q->n_ids, e);
}

/* A token as logprob text (return_text_in_logprobs), else null. */
static json_t *lp_text(const struct gen *g, int32_t id)
{
	size_t len = 0;
	const char *b;
	json_t *s;

	if (!g->lp_text || (b = kn_tok_token_bytes(g->h->tok, id, &len)) == NULL)
		return json_null();
	s = json_stringn(b, len); /* NULL: part of a character */
	return s != NULL ? s : json_null();
}

/* One token's [logprob, id, text] (logprob null for the prompt's first)
 * and its alternatives (null when none were asked, or for the first). */
static void lp_entry(const struct gen *g, const struct lp_ent *x, json_t *toks, json_t *tops)
{
	json_t *t;

	json_array_append_new(toks, json_pack("[o, i, o]", x->none ? json_null() : json_real((double)x->logprob),
					      x->token, lp_text(g, x->token)));
	if (g->lp_top == 0 || x->none) {
		json_array_append_new(tops, json_null());
		return;
	}
	t = json_array();
	for (int32_t k = 0; k < x->n_top; k++)
		json_array_append_new(t, json_pack("[f, i, o]", (double)x->top_lps[k], x->top_ids[k],
						   lp_text(g, x->top_ids[k])));
	json_array_append_new(tops, t);
}

static json_t *finish_json(const struct gen *g)
{
	if (g->finish == NULL)
		return json_null();
	if (!strcmp(g->finish, "length"))
		return json_pack("{s:s, s:i}", "type", "length", "length", g->max_tokens);
	if (!strcmp(g->finish, "stop"))
		return json_pack("{s:s, s:o}", "type", "stop", "matched",
				 g->stop_hit >= 0 ? json_string(g->stops[g->stop_hit])
				 : g->stop_token >= 0 ? json_integer(g->stop_token) : json_null());
	return json_pack("{s:s, s:s}", "type", "abort", "message",
			 g->fail_msg != NULL ? g->fail_msg : "the request was cancelled");
}

json_t *http_native_json(const struct gen *g, size_t upto, size_t lp_upto, int final)
{
	json_t *ids = json_array(), *meta;

	for (size_t i = 0; i < lp_upto; i++)
		json_array_append_new(ids, json_integer(g->lp[i].token));
	/* the stop token ends the output ids as in SGLang's (its text is not shown) */
	if (final && g->stop_token >= 0 && g->stop_hit < 0)
		json_array_append_new(ids, json_integer(g->stop_token));
	meta = json_pack("{s:s, s:o, s:i, s:i, s:i}", "id", g->rid, "finish_reason",
			 final ? finish_json(g) : json_null(), "prompt_tokens", g->n_prompt, "completion_tokens",
			 final ? g->n_gen : (int)lp_upto, "cached_tokens", g->n_cached);
	if (final)
		json_object_set_new(meta, "e2e_latency", json_real(http_now() - g->t_start));
	if (g->lp_report) {
		json_t *in = json_array(), *in_tops = json_array(), *out = json_array(), *tops = json_array();

		/* the prompt's from logprob_start_len on, as far as they are
		 * scored (without it: empty, so a router that joins the prefill
		 * node's with the decode node's still can) */
		for (int32_t i = g->plp_start; g->plp != NULL && i < g->n_prompt; i++) {
			if (i > g->plp_start && g->plp[i].none)
				break; /* (the first is always none, as SGLang's) */
			lp_entry(g, &g->plp[i], in, in_tops);
		}
		for (size_t i = 0; i < lp_upto; i++)
			lp_entry(g, &g->lp[i], out, tops);
		json_object_set_new(meta, "input_token_logprobs", in);
		json_object_set_new(meta, "output_token_logprobs", out);
		json_object_set_new(meta, "input_top_logprobs", in_tops);
		json_object_set_new(meta, "output_top_logprobs", tops);
	}
	return json_pack("{s:s%, s:o, s:o}", "text", g->text.p != NULL ? g->text.p : "", upto, "output_ids", ids,
			 "meta_info", meta);
}

/* POST /generate (@p body NULL: the connection's), or the one-token request of /health_generate. */
static int native_generate(struct ctrl_http *h, struct MHD_Connection *c, struct conn_state *cs, json_t *body)
{
	struct http_verr e;
	json_t *req = body;
	enum MHD_Result ret;

	if (atomic_load(&h->draining))
		return http_error(h, c, MHD_HTTP_SERVICE_UNAVAILABLE, "service_unavailable", NULL, "draining",
				  "kvferry-ctrld is draining and admits no new requests; retry on another replica or "
				  "after `ctrlctl resume`");
	memset(&e, 0, sizeof(e));
	if (req == NULL && (req = http_read_body(cs->body.p, cs->body.len, &e)) == NULL)
		return http_verr_send(h, c, &e);
	ret = http_generate(h, c, cs, GEN_NATIVE, req);
	json_decref(req);
	return ret;
}

/* SGLang's GET /get_server_info: the fields of its server arguments that
 * describe this node (a router reads disaggregation_mode and the bootstrap
 * port), and what it is. */
static json_t *server_info(const struct ctrl_http *h)
{
	return json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:s, s:i, s:i, s:i, s:i, s:b, s:b}", "version",
			 KVF_VERSION, "server", "kvferry-ctrld", "model_path", h->model_path, "tokenizer_path",
			 h->model_path, "served_model_name", h->model, "port", (int)h->port, "context_length",
			 h->max_context, "disaggregation_mode", h->pd_mode, "disaggregation_bootstrap_port",
			 atomic_load(&h->bootstrap_port), "tp_size", 1, "dp_size", 1, "pp_size", h->pp_size, "skip_tokenizer_init", 0,
			 "stream_output", 0);
}

int http_native_route(struct ctrl_http *h, struct MHD_Connection *c, struct conn_state *cs, const char *method,
		      const char *url)
{
	int get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
	int post = !strcmp(method, MHD_HTTP_METHOD_POST);
	char why[512];

	if (!strcmp(url, "/generate")) {
		if (!post)
			return http_error(h, c, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", NULL,
					  "method_not_allowed", "/generate takes POST, not %s", method);
		return native_generate(h, c, cs, NULL);
	}
	if (!strcmp(url, "/health_generate")) {
		/* a one-token generation through the whole path (on a decode
		 * node: a prefill node, the pages, the decode): 200 when it
		 * answered, else the error (503 when the node cannot serve) */
		if (!get && !post)
			return http_error(h, c, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", NULL,
					  "method_not_allowed", "/health_generate takes GET or POST, not %s", method);
		if (!ctrl_http_ready(h, why, sizeof(why)))
			return http_json(h, c, MHD_HTTP_SERVICE_UNAVAILABLE,
					 json_pack("{s:s, s:s}", "status", "unavailable", "reason", why));
		return native_generate(h, c, cs, json_pack("{s:s, s:{s:i, s:i}}", "text", "ok", "sampling_params",
							   "max_new_tokens", 1, "temperature", 0));
	}
	if (!strcmp(url, "/flush_cache")) {
		if (!get && !post)
			return http_error(h, c, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", NULL,
					  "method_not_allowed", "/flush_cache takes POST or GET, not %s", method);
		if (h->be.flush != NULL && h->be.flush(h->be.flush_ctx) == 0)
			return http_json(h, c, MHD_HTTP_OK,
					 json_pack("{s:b, s:s}", "flushed", 1, "message",
						   "the prefix cache is forgotten at each scheduler's next poll: its idle "
						   "blocks go back to the pool, those running requests read stay theirs"));
		return http_json(h, c, MHD_HTTP_OK,
				 json_pack("{s:b, s:s}", "flushed", 1, "message",
					   "kvferry keeps no KV cache between requests here ([sched] prefix_cache is off): "
					   "there is nothing to flush"));
	}
	if (!strcmp(url, "/get_model_info") || !strcmp(url, "/get_server_info")) {
		if (!get)
			return http_error(h, c, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", NULL,
					  "method_not_allowed", "%s takes GET, not %s", url, method);
		if (!strcmp(url, "/get_server_info"))
			return http_json(h, c, MHD_HTTP_OK, server_info(h));
		return http_json(h, c, MHD_HTTP_OK,
				 json_pack("{s:s, s:s, s:b, s:n, s:s, s:b, s:b}", "model_path", h->model_path,
					   "tokenizer_path", h->model_path, "is_generation", 1,
					   "preferred_sampling_params", "weight_version", "default",
					   "has_image_understanding", 0, "has_audio_understanding", 0));
	}
	return -1;
}
