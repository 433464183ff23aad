/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The OpenAI endpoints' requests, read and checked: the body's JSON, a
 * completion or chat request turned into what the scheduler is asked for
 * (sampling, stop strings, logprobs, the encoded prompt, what the KV pool
 * can carry), and the tokenize / detokenize answers. Nothing here touches
 * a connection: the handlers (http_openai.c) send what comes back, and the
 * fuzz target drives it with bodies alone.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http_int.h"

#define MAX_STOPS 16

int http_verr_set(struct http_verr *e, unsigned status, const char *param, const char *code, const char *fmt, ...)
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

/* 1 when absent or null, 0 when read, -1 on a type or range error. */
int http_opt_int(json_t *req, const char *key, int64_t lo, int64_t hi, int64_t *out, struct http_verr *e)
{
	json_t *v = json_object_get(req, key);

	if (!v || json_is_null(v))
		return 1;
	if (!json_is_integer(v))
		return http_verr_set(e, 400, key, "invalid_type", "'%s' must be an integer", key);
	if (json_integer_value(v) < lo || json_integer_value(v) > hi)
		return http_verr_set(e, 400, key, "invalid_value", "'%s' is %lld; it must be between %lld and %lld", key,
			   (long long)json_integer_value(v), (long long)lo, (long long)hi);
	*out = json_integer_value(v);
	return 0;
}

int http_opt_num(json_t *req, const char *key, double lo, double hi, double *out, struct http_verr *e)
{
	json_t *v = json_object_get(req, key);

	if (!v || json_is_null(v))
		return 1;
	if (!json_is_number(v))
		return http_verr_set(e, 400, key, "invalid_type", "'%s' must be a number", key);
	if (json_number_value(v) < lo || json_number_value(v) > hi)
		return http_verr_set(e, 400, key, "invalid_value", "'%s' is %g; it must be between %g and %g", key,
			   json_number_value(v), lo, hi);
	*out = json_number_value(v);
	return 0;
}

int http_opt_bool(json_t *req, const char *key, int *out, struct http_verr *e)
{
	json_t *v = json_object_get(req, key);

	if (!v || json_is_null(v))
		return 1;
	if (!json_is_boolean(v))
		return http_verr_set(e, 400, key, "invalid_type", "'%s' must be true or false", key);
	*out = json_is_true(v);
	return 0;
}

static int check_model(struct ctrl_http *h, json_t *req, int required, struct http_verr *e)
{
	json_t *m = json_object_get(req, "model");

	if (!m || json_is_null(m))
		return required ? http_verr_set(e, 400, "model", "missing_required_parameter",
				      "you must provide a model parameter (this server serves '%s')", h->model)
				: 0;
	if (!json_is_string(m))
		return http_verr_set(e, 400, "model", "invalid_type", "'model' must be a string");
	if (strcmp(json_string_value(m), h->model))
		return http_verr_set(e, 404, "model", "model_not_found",
			   "The model '%s' does not exist; this server serves '%s' (GET /v1/models)",
			   json_string_value(m), h->model);
	return 0;
}

/*
 * Parameters of OpenAI's API (and vLLM's) that kvferry does not implement.
 * Each is accepted at its default, which asks for nothing, and refused with
 * 400 unsupported_parameter naming it at any other value: a client must
 * never believe a penalty, a bias, a tool or a format was applied when it was
 * not. (Penalties and logit_bias would be cheap in the CPU sampler, but the
 * CUDA backend samples on the device, kernels/cuda/sample.cu, and both must
 * draw the same token: they stay refused until both have them.) vLLM's
 * extensions that change the answer are read (read_extras(), chat_flags())
 * or listed here. Fields not listed and not read elsewhere are ignored
 * (user, metadata, store, priority...): none of them changes what is
 * generated.
 */
static const struct http_fixed g_unsupported[] = {
	{"logit_bias", HTTP_NEUTRAL_EMPTY, "{}"},
	{"presence_penalty", HTTP_NEUTRAL_ZERO, "0"},
	{"frequency_penalty", HTTP_NEUTRAL_ZERO, "0"},
	{"best_of", HTTP_NEUTRAL_ONE, "1"},
	{"suffix", HTTP_NEUTRAL_EMPTY, "\"\""},
	{"response_format", HTTP_NEUTRAL_TEXT_FORMAT, "{\"type\": \"text\"}"},
	{"tools", HTTP_NEUTRAL_EMPTY, "[]"},
	{"tool_choice", HTTP_NEUTRAL_NONE_AUTO, "\"none\" or \"auto\""},
	{"functions", HTTP_NEUTRAL_EMPTY, "[]"},
	{"function_call", HTTP_NEUTRAL_NONE_AUTO, "\"none\" or \"auto\""},
	{"modalities", HTTP_NEUTRAL_TEXT_ONLY, "[\"text\"]"},
	{"audio", HTTP_NEUTRAL_NULL, "null"},
	/* vLLM's sampling extensions */
	{"repetition_penalty", HTTP_NEUTRAL_ONE, "1"},
	{"length_penalty", HTTP_NEUTRAL_ONE, "1"},
	{"allowed_token_ids", HTTP_NEUTRAL_EMPTY, "null"},
	{"bad_words", HTTP_NEUTRAL_EMPTY, "[]"},
	{"logits_processors", HTTP_NEUTRAL_EMPTY, "null"},
	{"return_tokens_as_token_ids", HTTP_NEUTRAL_FALSE, "false"},
	{"prompt_logprobs", HTTP_NEUTRAL_NULL, "null"},
	{"structured_outputs", HTTP_NEUTRAL_EMPTY, "null"},
	{"continue_final_message", HTTP_NEUTRAL_FALSE, "false"},
	{"add_generation_prompt", HTTP_NEUTRAL_TRUE, "true"},
	{"chat_template", HTTP_NEUTRAL_EMPTY, "null"},
	{"documents", HTTP_NEUTRAL_EMPTY, "null"},
	{"min_p", HTTP_NEUTRAL_ZERO, "0"},
	{"min_tokens", HTTP_NEUTRAL_ZERO, "0"},
	{"use_beam_search", HTTP_NEUTRAL_FALSE, "false"},
	{"guided_json", HTTP_NEUTRAL_NULL, "null"},
	{"guided_regex", HTTP_NEUTRAL_NULL, "null"},
	{"guided_choice", HTTP_NEUTRAL_NULL, "null"},
	{"guided_grammar", HTTP_NEUTRAL_NULL, "null"},
	/* last: /v1/completions reads it (read_gen()), chat does not */
	{"echo", HTTP_NEUTRAL_FALSE, "false"},
};

static int is_neutral(json_t *v, enum http_neutral ok)
{
	const char *str = json_string_value(v);

	switch (ok) {
	case HTTP_NEUTRAL_NULL: return 0;
	case HTTP_NEUTRAL_ZERO: return json_is_number(v) && json_number_value(v) == 0.0;
	case HTTP_NEUTRAL_ONE: return json_is_number(v) && json_number_value(v) == 1.0;
	case HTTP_NEUTRAL_MINUS_ONE: return json_is_integer(v) && json_integer_value(v) == -1;
	case HTTP_NEUTRAL_FALSE: return json_is_false(v);
	case HTTP_NEUTRAL_TRUE: return json_is_true(v);
	case HTTP_NEUTRAL_EMPTY:
		return (json_is_string(v) && !json_string_length(v)) || (json_is_array(v) && !json_array_size(v))
		       || (json_is_object(v) && !json_object_size(v));
	case HTTP_NEUTRAL_NONE_AUTO: return str && (!strcmp(str, "none") || !strcmp(str, "auto"));
	case HTTP_NEUTRAL_TEXT_FORMAT:
		str = json_string_value(json_object_get(v, "type"));
		return json_is_object(v) && json_object_size(v) == 1 && str && !strcmp(str, "text");
	case HTTP_NEUTRAL_TEXT_ONLY:
		str = json_string_value(json_array_get(v, 0));
		return json_is_array(v) && json_array_size(v) == 1 && str && !strcmp(str, "text");
	}
	return 0;
}

int http_check_fixed(json_t *obj, const struct http_fixed *t, size_t n, const char *where, struct http_verr *e)
{
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_object_get(obj, t[i].key);

		if (!v || json_is_null(v) || is_neutral(v, t[i].ok))
			continue;
		return http_verr_set(e, 400, t[i].key, "unsupported_parameter",
				     "%s'%s' is not supported by kvferry: only %s (its default) is accepted; remove it, "
				     "or send the default", where, t[i].key, t[i].want);
	}
	return 0;
}

static int check_unsupported(enum gen_kind kind, json_t *req, struct http_verr *e)
{
	for (size_t i = 0; i < sizeof(g_unsupported) / sizeof(g_unsupported[0]); i++) {
		const char *k = g_unsupported[i].key;

		/* completions read echo, chat reads tools (http_tools.c) */
		if ((kind == GEN_COMPLETION && !strcmp(k, "echo"))
		    || (kind == GEN_CHAT && (!strcmp(k, "tools") || !strcmp(k, "tool_choice"))))
			continue;
		if (http_check_fixed(req, &g_unsupported[i], 1, "", e))
			return -1;
	}
	return 0;
}

/* Gather the text of a message's content: a string, or an array of parts. */
static int message_text(json_t *content, struct kvf_buf *out, struct http_verr *e)
{
	size_t i;
	json_t *part;

	if (json_is_string(content))
		return kvf_buf_add(out, json_string_value(content), json_string_length(content)) ? -1 : 0;
	if (json_is_null(content))
		return kvf_buf_add(out, "", 0) ? -1 : 0;
	if (!json_is_array(content))
		return http_verr_set(e, 400, "messages", "invalid_type", "a message's 'content' must be a string or an array of text parts");
	kvf_buf_add(out, "", 0);
	json_array_foreach(content, i, part) {
		json_t *t = json_object_get(part, "text");
		const char *type = json_string_value(json_object_get(part, "type"));
		if (!type || strcmp(type, "text") || !json_is_string(t))
			return http_verr_set(e, 400, "messages", "invalid_value",
				   "only text content parts are supported ({\"type\":\"text\",\"text\":...})");
		kvf_buf_add(out, json_string_value(t), json_string_length(t));
	}
	return 0;
}

/* http_prompt_ids(), its messages naming the prompt @p where ("prompt[2]"
 * in a list of prompts). */
static int prompt_ids_at(struct ctrl_http *h, json_t *p, const char *param, const char *where, int add_special,
			 int32_t **ids, size_t *n, struct http_verr *e)
{
	int rc;

	*ids = NULL;
	*n = 0;
	if (!p || json_is_null(p))
		return http_verr_set(e, 400, param, "missing_required_parameter", "you must provide a prompt");
	if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
		p = json_array_get(p, 0);
	if (json_is_string(p)) {
		rc = kn_tok_encode(h->tok, json_string_value(p), json_string_length(p), add_special ? KN_TOK_ADD_BOS : 0,
				   ids, n);
		if (rc)
			return http_verr_set(e, 400, param, "invalid_value", "cannot tokenize '%s': %s", where, strerror(-rc));
		return 0;
	}
	if (json_is_array(p)) {
		size_t i;
		json_t *v;
		int32_t vocab = kn_tok_vocab_size(h->tok);

		json_array_foreach(p, i, v) {
			if (!json_is_integer(v))
				return http_verr_set(e, 400, param, "invalid_type",
						     "'%s' must be a string, an array of token ids, or (/v1/completions) "
						     "a list of those", param);
			if (json_integer_value(v) < 0 || json_integer_value(v) >= vocab)
				return http_verr_set(e, 400, param, "invalid_value",
						     "token id %lld at %s[%zu] is outside the vocabulary (0..%d)",
						     (long long)json_integer_value(v), where, i, vocab - 1);
		}
		*ids = malloc((json_array_size(p) + 1) * sizeof(int32_t));
		if (!*ids)
			return http_verr_set(e, 500, NULL, NULL, "out of memory");
		json_array_foreach(p, i, v)
			(*ids)[i] = (int32_t)json_integer_value(v);
		*n = json_array_size(p);
		return 0;
	}
	return http_verr_set(e, 400, param, "invalid_type", "'%s' must be a string or an array of token ids", param);
}

int http_prompt_ids(struct ctrl_http *h, json_t *p, const char *param, int add_special, int32_t **ids, size_t *n,
		    struct http_verr *e)
{
	return prompt_ids_at(h, p, param, param, add_special, ids, n, e);
}

/* An assistant message's tool_calls ([{"id", "type": "function", "function":
 * {"name", "arguments": JSON text}}], as OpenAI's API writes them) into
 * @p cm's calls; each arguments' text is kept in @p args (malloc'd). */
static int message_calls(json_t *m, size_t i, struct kn_chat_msg *cm, struct kn_chat_call *out, char **args,
			 struct http_verr *e)
{
	json_t *tc = json_object_get(m, "tool_calls"), *c;
	size_t k;

	if (!tc || json_is_null(tc))
		return 0;
	if (!json_is_array(tc))
		return http_verr_set(e, 400, "messages", "invalid_type", "messages[%zu].tool_calls must be an array", i);
	json_array_foreach(tc, k, c) {
		json_t *f = json_object_get(c, "function"), *a = json_object_get(f, "arguments"), *parsed;
		const char *name = json_string_value(json_object_get(f, "name"));

		if (!name || !a)
			return http_verr_set(e, 400, "messages", "invalid_value",
					     "messages[%zu].tool_calls[%zu] needs function.name and function.arguments", i, k);
		/* arguments are JSON text (OpenAI's); an object is taken too */
		parsed = json_is_string(a) ? json_loads(json_string_value(a), JSON_DECODE_ANY, NULL) : json_incref(a);
		if (!parsed)
			return http_verr_set(e, 400, "messages", "invalid_value",
					     "messages[%zu].tool_calls[%zu].function.arguments is not JSON", i, k);
		args[k] = json_dumps(parsed, JSON_ENCODE_ANY | JSON_COMPACT);
		json_decref(parsed);
		if (!args[k])
			return http_verr_set(e, 500, NULL, NULL, "out of memory");
		out[k] = (struct kn_chat_call){ .name = name, .arguments = args[k] };
		cm->n_calls++;
	}
	return 0;
}

/* chat_template_kwargs (vLLM's and SGLang's): the template variables a
 * request sets. The templates are rendered in C (kn_tok_chat.c), which
 * reads enable_thinking (Qwen 3's); any other is refused by name rather
 * than ignored. @return 0 with *flags for kn_tok_apply_chat_flags(), or -1. */
static int chat_flags(json_t *req, unsigned *flags, struct http_verr *e)
{
	json_t *kw = json_object_get(req, "chat_template_kwargs"), *v;
	const char *key;

	*flags = KN_CHAT_GEN;
	if (!kw || json_is_null(kw))
		return 0;
	if (!json_is_object(kw))
		return http_verr_set(e, 400, "chat_template_kwargs", "invalid_type",
				     "'chat_template_kwargs' must be an object like {\"enable_thinking\": false}");
	json_object_foreach(kw, key, v) {
		if (strcmp(key, "enable_thinking"))
			return http_verr_set(e, 400, "chat_template_kwargs", "unsupported_parameter",
					     "chat_template_kwargs '%s' is not supported: kvferry renders the chat template "
					     "in C and reads only enable_thinking; remove it", key);
		if (!json_is_boolean(v))
			return http_verr_set(e, 400, "chat_template_kwargs", "invalid_type",
					     "chat_template_kwargs 'enable_thinking' must be true or false");
		if (json_is_false(v))
			*flags |= KN_CHAT_NO_THINKING;
	}
	return 0;
}

/* Encode the prompt of a completion or chat request (or of /tokenize). */
static int encode_prompt(struct ctrl_http *h, json_t *req, enum gen_kind kind, int add_special,
			 int32_t **ids, size_t *n, struct http_verr *e)
{
	int rc;

	*ids = NULL;
	*n = 0;
	if (kind != GEN_CHAT) {
		return http_prompt_ids(h, json_object_get(req, "prompt"), "prompt", add_special, ids, n, e);
	} else {
		json_t *msgs = json_object_get(req, "messages"), *m, *tools = json_object_get(req, "tools");
		struct kn_chat_msg *cm;
		struct kvf_buf *texts;
		struct kn_chat_call *calls = NULL;
		char **args = NULL, *tools_json = NULL;
		size_t i, cnt, n_calls = 0, n_all;
		char *prompt = NULL;
		unsigned flags;
		int ret = 0;

		if (!msgs || json_is_null(msgs))
			return http_verr_set(e, 400, "messages", "missing_required_parameter", "you must provide messages");
		if (!json_is_array(msgs) || !json_array_size(msgs))
			return http_verr_set(e, 400, "messages", "invalid_type", "'messages' must be a non-empty array");
		cnt = json_array_size(msgs);
		json_array_foreach(msgs, i, m)
			n_calls += json_array_size(json_object_get(m, "tool_calls"));
		n_all = n_calls;
		cm = calloc(cnt, sizeof(*cm));
		texts = calloc(cnt, sizeof(*texts));
		calls = calloc(n_all + 1, sizeof(*calls));
		args = calloc(n_all + 1, sizeof(*args));
		if (json_is_array(tools)) /* (an empty list too: the Llama templates tell it from none) */
			tools_json = json_dumps(tools, JSON_COMPACT);
		if (!cm || !texts || !calls || !args || (json_is_array(tools) && !tools_json)) {
			ret = http_verr_set(e, 500, NULL, NULL, "out of memory");
			goto chat_out;
		}
		n_calls = 0;
		json_array_foreach(msgs, i, m) {
			const char *role = json_string_value(json_object_get(m, "role"));
			if (!json_is_object(m) || !role) {
				ret = http_verr_set(e, 400, "messages", "invalid_value", "messages[%zu] needs a string 'role'", i);
				goto chat_out;
			}
			if (message_text(json_object_get(m, "content"), &texts[i], e)) {
				ret = -1;
				goto chat_out;
			}
			cm[i].role = role;
			cm[i].content = texts[i].p ? texts[i].p : "";
			cm[i].calls = calls + n_calls;
			if (message_calls(m, i, &cm[i], calls + n_calls, args + n_calls, e)) {
				ret = -1;
				goto chat_out;
			}
			n_calls += cm[i].n_calls;
		}
		rc = chat_flags(req, &flags, e);
		if (rc) {
			ret = -1;
			goto chat_out;
		}
		rc = kn_tok_apply_chat_tools(h->tok, cm, cnt, tools_json, flags, &prompt);
		if (rc == -ENOTSUP && (n_calls || tools_json)) {
			ret = http_verr_set(e, 400, "messages", "unsupported_value",
				  "this model's chat template does not render tool calls in a form kvferry knows (it "
				  "renders them for the Qwen 2.5 and 3 and Llama 3.1+ templates)");
		} else if (rc == -EINVAL && (n_calls || tools_json)) {
			ret = http_verr_set(e, 400, "messages", "invalid_value",
				  "the chat template (Llama 3.1+'s) takes one tool call per assistant message, and puts the "
				  "tools in the first message after the system one, which must be there");
		} else if (rc == -EBADMSG) {
			ret = http_verr_set(e, 400, "tools", "invalid_value", "the tools or a tool call's arguments are not JSON");
		} else if (rc == -ENOTSUP) {
			ret = http_verr_set(e, 400, "messages", "chat_template_unsupported",
				  "this model has no usable chat template (%s); use /v1/completions",
				  kn_tok_chat_error(h->tok));
		} else if (rc == -EINVAL) {
			ret = http_verr_set(e, 400, "messages", "invalid_value",
				  "the chat template does not know a role used in messages (roles: system, user, assistant)");
		} else if (rc) {
			ret = http_verr_set(e, 500, NULL, NULL, "rendering the chat template failed: %s", strerror(-rc));
		} else {
			rc = kn_tok_encode(h->tok, prompt, strlen(prompt), KN_TOK_SPECIAL, ids, n);
			if (rc)
				ret = http_verr_set(e, 400, "messages", "invalid_value", "cannot tokenize the messages: %s",
					  strerror(-rc));
		}
	chat_out:
		free(prompt);
		for (i = 0; texts && i < cnt; i++)
			kvf_buf_free(&texts[i]);
		for (i = 0; args && i < n_all; i++)
			free(args[i]);
		free(args);
		free(calls);
		free(tools_json);
		free(texts);
		free(cm);
		return ret;
	}
}

/*
 * Can the backend ever carry the prompt and *max_tokens? Checked before the
 * request is submitted (and before a stream's 200), so a request the KV pool
 * could never hold is a 400 with the scheduler's own words rather than a
 * 500, or an error event after a 200. One that did not ask for a max_tokens
 * gets at most what fits. A PD request (bootstrap_room) is prefilled here:
 * only its prompt and first token must fit. @return 0, or -1 with @p e set.
 */
static int admissible(struct ctrl_http *h, int32_t n_prompt, int64_t *max_tokens, int asked, int pd,
		      enum gen_kind kind, struct http_verr *e)
{
	char why[320];
	int32_t want = pd ? 1 : (int32_t)*max_tokens, most;

	if (!h->be.admissible)
		return 0;
	most = h->be.admissible(h->be.admit_ctx, n_prompt, want, why, sizeof(why));
	if (most >= want)
		return 0;
	if (most >= 1 && !asked && !pd) {
		*max_tokens = most;
		return 0;
	}
	if (most < 1) /* the prompt itself does not fit: say so for one token */
		h->be.admissible(h->be.admit_ctx, n_prompt, 1, why, sizeof(why));
	return http_verr_set(e, 400, most >= 1 ? (kind == GEN_NATIVE ? "max_new_tokens" : "max_tokens")
				 : kind == GEN_CHAT ? "messages" : kind == GEN_NATIVE ? "text" : "prompt",
		   "context_length_exceeded", "%s", why[0] ? why : "the KV pool cannot hold this request");
}

int http_read_stops(json_t *req, struct http_gen_req *q, struct http_verr *e)
{
	json_t *s = json_object_get(req, "stop"), *v;
	size_t i;

	if (!s || json_is_null(s))
		return 0;
	if (json_is_string(s)) {
		if (!json_string_length(s))
			return 0;
		q->stops = calloc(1, sizeof(char *));
		if (!q->stops || !(q->stops[0] = strdup(json_string_value(s))))
			return http_verr_set(e, 500, NULL, NULL, "out of memory");
		q->n_stops = 1;
	} else if (json_is_array(s)) {
		if (json_array_size(s) > MAX_STOPS)
			return http_verr_set(e, 400, "stop", "invalid_value", "at most %d stop strings are accepted", MAX_STOPS);
		q->stops = calloc(json_array_size(s) + 1, sizeof(char *));
		if (!q->stops)
			return http_verr_set(e, 500, NULL, NULL, "out of memory");
		json_array_foreach(s, i, v) {
			if (!json_is_string(v))
				return http_verr_set(e, 400, "stop", "invalid_type", "'stop' must be a string or an array of strings");
			if (!json_string_length(v))
				continue;
			if (!(q->stops[q->n_stops] = strdup(json_string_value(v))))
				return http_verr_set(e, 500, NULL, NULL, "out of memory");
			q->n_stops++;
		}
	} else {
		return http_verr_set(e, 400, "stop", "invalid_type", "'stop' must be a string or an array of strings");
	}
	for (int k = 0; k < q->n_stops; k++)
		if (strlen(q->stops[k]) > q->max_stop)
			q->max_stop = strlen(q->stops[k]);
	return 0;
}

json_t *http_read_body(const char *body, size_t len, struct http_verr *e)
{
	json_error_t je;
	json_t *req = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &je);

	if (!req || !json_is_object(req)) {
		http_verr_set(e, 400, NULL, "invalid_json", "the request body is not a JSON object (%s at line %d column %d)",
		    req ? "expected an object" : je.text, je.line, je.column);
		json_decref(req);
		return NULL;
	}
	return req;
}

void http_gen_req_free(struct http_gen_req *q)
{
	for (int i = 0; i < q->n_stops; i++)
		free(q->stops[i]);
	free(q->stops);
	free(q->stop_ids);
	q->stop_ids = NULL;
	q->n_stop_ids = 0;
	free(q->ids);
	for (int i = 0; i < q->n_more; i++)
		free(q->more[i].ids);
	free(q->more);
	q->stops = NULL;
	q->n_stops = 0;
	q->ids = NULL;
	q->more = NULL;
	q->n_more = 0;
}

int http_pd_prompt_only(const struct http_gen_req *q, const char *mt, const char *lp, struct http_verr *e)
{
	if (q->room < 0)
		return 0;
	if (q->no_tokens)
		return http_verr_set(e, 400, mt, "unsupported_value",
				     "'%s' 0 with bootstrap_room: a room carries a prompt's KV to a decode node to "
				     "generate from; a request that generates nothing needs none: send it without "
				     "bootstrap_room", mt);
	if (q->prompt_lp)
		return http_verr_set(e, 400, lp, "unsupported_value",
				     "prompt logprobs ('%s') with bootstrap_room: a disaggregated request's prompt is "
				     "computed on the prefill node, which reports none; send it without bootstrap_room", lp);
	return 0;
}

int http_read_bootstrap(json_t *req, struct http_gen_req *q, struct http_verr *e)
{
	json_t *so = json_object_get(req, "bootstrap_host");

	/* SGLang's PD bootstrap fields: a router names the room (and the
	 * prefill node's bootstrap server) both nodes of a pair use */
	if (http_opt_int(req, "bootstrap_room", 0, INT64_MAX, &q->room, e) < 0
	    || http_opt_int(req, "bootstrap_port", 0, 65535, &q->bport, e) < 0
	    /* a kvferry decode node's forward names its session: a prefill node
	     * drops the rooms of a session its decode node replaced */
	    || http_opt_int(req, "kvferry_session", 0, UINT32_MAX, &q->psession, e) < 0)
		return -1;
	if (so != NULL && !json_is_null(so) && !json_is_string(so))
		return http_verr_set(e, 400, "bootstrap_host", "invalid_type",
				     "'bootstrap_host' must be a string (the prefill node's host)");
	q->bhost = json_string_value(so);
	return 0;
}

/* A /v1/completions prompt that is a list of prompts (strings or arrays of
 * token ids; one string alone is a prompt, as is an array of ids): the
 * first into q->ids, the others into q->more. @return 1 when it is no
 * list, 0 read, -1 refused. */
static int read_prompt_list(struct ctrl_http *h, json_t *req, struct http_gen_req *q, struct http_verr *e)
{
	json_t *p = json_object_get(req, "prompt"), *v;
	size_t i, n = json_array_size(p);

	if (!json_is_array(p) || n == 0 || json_is_integer(json_array_get(p, 0)) ||
	    (n == 1 && json_is_string(json_array_get(p, 0))))
		return 1;
	if ((int64_t)n * q->n > HTTP_MAX_CHOICES)
		return http_verr_set(e, 400, "prompt", "invalid_value",
			   "%zu prompts x n=%lld is %lld choices; a request may ask for at most %d: split the list",
			   n, (long long)q->n, (long long)n * q->n, HTTP_MAX_CHOICES);
	q->more = calloc(n - 1 ? n - 1 : 1, sizeof(*q->more));
	if (!q->more)
		return http_verr_set(e, 500, NULL, NULL, "out of memory");
	json_array_foreach(p, i, v) {
		char which[48];
		int32_t **ids = i ? &q->more[i - 1].ids : &q->ids;
		size_t *n_ids = i ? &q->more[i - 1].n_ids : &q->n_ids;

		snprintf(which, sizeof(which), "prompt[%zu]", i);
		if (!json_is_string(v) && !(json_is_array(v) && json_is_integer(json_array_get(v, 0))))
			return http_verr_set(e, 400, "prompt", "invalid_type",
				   "prompt[%zu] must be a string or an array of token ids (a list of prompts holds "
				   "only those)", i);
		if (i)
			q->n_more++;
		if (prompt_ids_at(h, v, "prompt", which, q->add_special, ids, n_ids, e))
			return -1;
	}
	return 0;
}

/* Most stop_token_ids a request may give. */
#define HTTP_MAX_STOP_IDS 64

int http_read_stop_ids(struct ctrl_http *h, json_t *obj, struct http_gen_req *q, struct http_verr *e)
{
	json_t *a = json_object_get(obj, "stop_token_ids"), *v;
	int32_t vocab = kn_tok_vocab_size(h->tok);
	size_t i;

	if (!a || json_is_null(a))
		return 0;
	if (!json_is_array(a) || json_array_size(a) > HTTP_MAX_STOP_IDS)
		return http_verr_set(e, 400, "stop_token_ids", "invalid_value",
				     "'stop_token_ids' must be an array of at most %d token ids", HTTP_MAX_STOP_IDS);
	q->stop_ids = malloc(sizeof(int32_t) * (json_array_size(a) + 1));
	if (!q->stop_ids)
		return http_verr_set(e, 500, NULL, NULL, "out of memory");
	json_array_foreach(a, i, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab)
			return http_verr_set(e, 400, "stop_token_ids", "invalid_value",
					     "stop_token_ids[%zu] is not a token id of this model (0..%d)", i, vocab - 1);
		q->stop_ids[q->n_stop_ids++] = (int32_t)json_integer_value(v);
	}
	return 0;
}

/* vLLM's output extensions both routes take (the OpenAI ones; /generate's
 * sampling_params name the last one no_stop_trim). */
static int read_extras(struct ctrl_http *h, enum gen_kind kind, json_t *req, struct http_gen_req *q,
		       struct http_verr *e)
{
	int add_special = kind == GEN_COMPLETION;

	if (http_read_stop_ids(h, req, q, e) || http_opt_bool(req, "skip_special_tokens", &q->skip_special, e) < 0
	    || http_opt_bool(req, "include_stop_str_in_output", &q->keep_stop, e) < 0
	    || http_opt_int(req, "truncate_prompt_tokens", 1, INT32_MAX, &q->truncate, e) < 0
	    || http_opt_bool(req, "add_special_tokens", &add_special, e) < 0)
		return -1;
	if (kind == GEN_CHAT && add_special)
		return http_verr_set(e, 400, "add_special_tokens", "unsupported_value",
				     "'add_special_tokens' true on chat: the chat template writes the special tokens "
				     "(BOS) itself, and another would go in front; remove it");
	q->add_special = add_special;
	return 0;
}

/* Keep the last q->truncate tokens of every prompt (truncate_prompt_tokens). */
static void truncate_prompts(struct http_gen_req *q)
{
	for (int i = 0; q->truncate > 0 && i <= q->n_more; i++) {
		int32_t *ids = i ? q->more[i - 1].ids : q->ids;
		size_t *n = i ? &q->more[i - 1].n_ids : &q->n_ids;

		if ((int64_t)*n > q->truncate) {
			memmove(ids, ids + (*n - (size_t)q->truncate), sizeof(int32_t) * (size_t)q->truncate);
			*n = (size_t)q->truncate;
		}
	}
}

/* http_read_gen() up to the encoded prompt, in the order its errors are
 * reported; leaves what it allocated in @p q either way. */
static int read_gen(struct ctrl_http *h, enum gen_kind kind, json_t *req, struct http_gen_req *q,
		    struct http_verr *e)
{
	int64_t iv;
	json_t *so, *lp;
	int rc;

	q->temperature = 1.0;
	q->top_p = 1.0;
	q->room = -1;
	q->lp_start = -1;
	q->skip_special = 1;
	q->add_special = 1;
	q->n = 1;
	q->seed = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ atomic_fetch_add(&h->seq, 1) * 0xbf58476d1ce4e5b9ull;
	if (kind == GEN_NATIVE)
		return http_read_native(h, req, q, e);
	if (check_model(h, req, 1, e) || check_unsupported(kind, req, e))
		return -1;
	if (http_opt_int(req, "n", 1, HTTP_MAX_CHOICES, &q->n, e) < 0)
		return -1;
	if (http_opt_bool(req, "stream", &q->stream, e) < 0)
		return -1;
	so = json_object_get(req, "stream_options");
	if (so && !json_is_null(so)) {
		if (!json_is_object(so) || http_opt_bool(so, "include_usage", &q->include_usage, e) < 0)
			return http_verr_set(e, 400, "stream_options", "invalid_type",
				   "'stream_options' must be an object like {\"include_usage\": true}");
	}
	/* ignore_eos (as vLLM and SGLang accept it): generate max_tokens
	 * whatever the model says, for benchmarks of a fixed output length */
	if (http_opt_bool(req, "ignore_eos", &q->ignore_eos, e) < 0)
		return -1;
	if (http_opt_int(req, "max_tokens", kind == GEN_COMPLETION ? 0 : 1, INT32_MAX, &q->max_tokens, e) < 0)
		return -1;
	q->no_tokens = json_is_integer(json_object_get(req, "max_tokens")) && q->max_tokens == 0;
	if (kind == GEN_CHAT && !q->max_tokens &&
	    http_opt_int(req, "max_completion_tokens", 1, INT32_MAX, &q->max_tokens, e) < 0)
		return -1;
	if (http_opt_num(req, "temperature", 0, 2, &q->temperature, e) < 0 ||
	    http_opt_num(req, "top_p", 0, 1, &q->top_p, e) < 0 ||
	    http_opt_int(req, "top_k", -1, INT32_MAX, &q->top_k, e) < 0)
		return -1;
	if (q->top_p <= 0)
		return http_verr_set(e, 400, "top_p", "invalid_value", "'top_p' must be greater than 0 (1 = off)");
	if (http_read_bootstrap(req, q, e))
		return -1;
	if (q->n > 1 && q->room >= 0)
		return http_verr_set(e, 400, "n", "unsupported_value",
			   "n=%lld with bootstrap_room: a room carries one sequence's KV; send %lld requests, "
			   "each with a bootstrap_room of its own", (long long)q->n, (long long)q->n);
	if (http_opt_int(req, "seed", INT64_MIN, INT64_MAX, &iv, e) < 0)
		return -1;
	else if (json_is_integer(json_object_get(req, "seed")))
		q->seed = (uint64_t)iv;
	lp = json_object_get(req, "logprobs");
	if (kind == GEN_COMPLETION) {
		/* legacy: logprobs N = the chosen token's logprob and N alternatives */
		if (!json_is_false(lp) && http_opt_int(req, "logprobs", 0, HTTP_MAX_LOGPROBS, &iv, e) < 0)
			return -1;
		if (lp && json_is_integer(lp)) {
			q->lp_on = 1;
			q->lp_top = (int32_t)iv;
		}
	} else {
		int on = 0;

		if (http_opt_bool(req, "logprobs", &on, e) < 0)
			return -1;
		iv = 0;
		if (http_opt_int(req, "top_logprobs", 0, HTTP_MAX_LOGPROBS, &iv, e) < 0)
			return -1;
		if (!on && json_is_integer(json_object_get(req, "top_logprobs")))
			return http_verr_set(e, 400, "top_logprobs", "invalid_value",
				   "'top_logprobs' needs \"logprobs\": true");
		q->lp_on = on;
		q->lp_top = on ? (int32_t)iv : 0;
	}
	if (http_read_stops(req, q, e) || read_extras(h, kind, req, q, e)
	    || (kind == GEN_CHAT && http_read_tools(h, req, q, e)))
		return -1;
	if (kind == GEN_COMPLETION && http_opt_bool(req, "echo", &q->echo, e) < 0)
		return -1;
	if (q->no_tokens && !q->echo)
		return http_verr_set(e, 400, "max_tokens", "invalid_value",
			   "'max_tokens' 0 generates nothing: it is accepted only with \"echo\": true (the prompt "
			   "returned, with \"logprobs\" its tokens' logprobs); ask for at least 1 token");
	/* echo with logprobs: the prompt tokens' logprobs too (lm-eval's likelihoods) */
	q->prompt_lp = q->echo && q->lp_on;
	if (http_pd_prompt_only(q, "max_tokens", "echo", e))
		return -1;
	if (kind == GEN_COMPLETION && (rc = read_prompt_list(h, req, q, e)) <= 0)
		return rc;
	return encode_prompt(h, req, kind, q->add_special, &q->ids, &q->n_ids, e);
}

/* One prompt of @p n_ids tokens against the context and the pool: fills
 * *max_tokens (asked, or what fits). @p which: "" or, in a list of prompts,
 * its place ("prompt[3]: "). */
static int fit_prompt(struct ctrl_http *h, enum gen_kind kind, const struct http_gen_req *q, const char *what,
		      const char *which, size_t n_ids, int64_t asked, int64_t *max_tokens, struct http_verr *e)
{
	const char *mt = kind == GEN_NATIVE ? "max_new_tokens" : "max_tokens";
	int rc;

	*max_tokens = asked;
	if (!n_ids)
		return http_verr_set(e, 400, what, "invalid_value", "%sthe prompt is empty", which);
	if (q->lp_start >= 0 && (int64_t)n_ids <= q->lp_start)
		return http_verr_set(e, 400, "logprob_start_len", "invalid_value",
		    "%s'logprob_start_len' %lld is not a position of the prompt (%zu tokens): give 0 .. %zu",
		    which, (long long)q->lp_start, n_ids, n_ids - 1);
	if ((int64_t)n_ids >= h->max_context)
		return http_verr_set(e, 400, what, "context_length_exceeded",
		    "%sThis model's maximum context length is %d tokens. However, your prompt has %zu tokens; shorten it",
		    which, h->max_context, n_ids);
	if (q->no_tokens) {
		/* the prompt alone: the pool must hold it as it would with one token */
		*max_tokens = 1;
		rc = admissible(h, (int32_t)n_ids, max_tokens, 1, 0, kind, e);
		*max_tokens = 0;
		return rc;
	}
	if (asked && (int64_t)n_ids + asked > h->max_context)
		return http_verr_set(e, 400, mt, "context_length_exceeded",
		    "%sThis model's maximum context length is %d tokens. However, you requested %lld tokens (%zu in the prompt, %lld for the completion). Reduce the prompt or %s",
		    which, h->max_context, (long long)n_ids + asked, n_ids, (long long)asked, mt);
	if (!asked) {
		/* /generate: SGLang's default max_new_tokens, as its clients expect */
		int64_t dflt = kind == GEN_NATIVE ? HTTP_NATIVE_MAX_NEW_TOKENS : h->max_tokens_default;

		*max_tokens = h->max_context - (int64_t)n_ids;
		if (*max_tokens > dflt)
			*max_tokens = dflt;
	}
	return admissible(h, (int32_t)n_ids, max_tokens, asked != 0, q->room >= 0 && h->be.submit_pd != NULL, kind, e);
}

int http_read_gen(struct ctrl_http *h, enum gen_kind kind, json_t *req, struct http_gen_req *q,
		  struct http_verr *e)
{
	const char *what = kind == GEN_CHAT ? "messages" : "prompt";
	int64_t asked;

	memset(q, 0, sizeof(*q));
	memset(e, 0, sizeof(*e));
	if (read_gen(h, kind, req, q, e))
		goto fail;
	truncate_prompts(q);
	if (q->prompt_param != NULL)
		what = q->prompt_param;
	asked = q->max_tokens;
	if (fit_prompt(h, kind, q, what, q->n_more ? "prompt[0]: " : "", q->n_ids, asked, &q->max_tokens, e))
		goto fail;
	for (int i = 0; i < q->n_more; i++) {
		char which[48];

		snprintf(which, sizeof(which), "prompt[%d]: ", i + 1);
		if (fit_prompt(h, kind, q, what, which, q->more[i].n_ids, asked, &q->more[i].max_tokens, e))
			goto fail;
	}
	return 0;
fail:
	http_gen_req_free(q);
	return -1;
}

int http_read_tokenize(struct ctrl_http *h, json_t *req, json_t **reply, struct http_verr *e)
{
	int32_t *ids = NULL;
	size_t n = 0;
	int add_special = 1;
	enum gen_kind kind = json_object_get(req, "messages") ? GEN_CHAT : GEN_COMPLETION;
	json_t *toks;

	memset(e, 0, sizeof(*e));
	*reply = NULL;
	if (check_model(h, req, 0, e) || http_opt_bool(req, "add_special_tokens", &add_special, e) < 0 ||
	    encode_prompt(h, req, kind, add_special, &ids, &n, e)) {
		free(ids);
		return -1;
	}
	toks = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(toks, json_integer(ids[i]));
	free(ids);
	*reply = json_pack("{s:i, s:i, s:o}", "count", (int)n, "max_model_len", h->max_context, "tokens", toks);
	return 0;
}

int http_read_detokenize(struct ctrl_http *h, json_t *req, json_t **reply, struct http_verr *e)
{
	json_t *t = json_object_get(req, "tokens"), *v;
	int32_t *ids;
	size_t i, len;
	char *text = NULL;
	int rc;

	memset(e, 0, sizeof(*e));
	*reply = NULL;
	if (check_model(h, req, 0, e))
		return -1;
	if (!t || !json_is_array(t))
		return http_verr_set(e, 400, "tokens", t ? "invalid_type" : "missing_required_parameter",
			   "'tokens' must be an array of token ids");
	ids = malloc((json_array_size(t) + 1) * sizeof(int32_t));
	if (!ids)
		return -ENOMEM;
	json_array_foreach(t, i, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= kn_tok_vocab_size(h->tok)) {
			free(ids);
			return http_verr_set(e, 400, "tokens", "invalid_value", "tokens[%zu] is not a token id of this model (0..%d)",
				   i, kn_tok_vocab_size(h->tok) - 1);
		}
		ids[i] = (int32_t)json_integer_value(v);
	}
	rc = kn_tok_decode(h->tok, ids, json_array_size(t), 0, &text, &len);
	free(ids);
	if (rc)
		return http_verr_set(e, 400, "tokens", "invalid_value", "kn_tok_decode failed: %s", strerror(-rc));
	*reply = json_pack("{s:s%}", "prompt", text, len);
	free(text);
	return 0;
}
