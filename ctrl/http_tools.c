/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tool calling on /v1/chat/completions, as vLLM's and SGLang's parsers
 * have it: the request's `tools` go into the prompt through the chat
 * template (kn_tok_apply_chat_tools(): Qwen 2.5/3, Llama 3.1+), and what
 * the model answers is read back in the template family's form
 * (kn_tok_chat_tool_style()):
 *   1 (hermes / qwen25): each <tool_call>{"name": ..., "arguments": {...}}
 *     </tool_call> is a call; the text before the first one is `content`
 *     (null when empty);
 *   2 (llama3_json): an answer that is one or more {"name": ...,
 *     "parameters": {...}} objects (separated by ";") is calls, no content.
 * Each call is an entry of the message's `tool_calls` (its arguments as a
 * JSON string) and the finish reason is "tool_calls". An answer whose calls
 * are not JSON of that shape is returned as text, whole, as those parsers do.
 *
 * Streaming: the text up to a <tool_call> streams as content (a tail that
 * could still grow into "<tool_call>" is held back, as a stop string's is;
 * a Llama answer is held while it may be a call: it starts with "{"); the
 * calls go out whole, in one chunk, once the answer is complete.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_int.h"
#include "kvf_mix.h"

#define TC_OPEN "<tool_call>"
#define TC_CLOSE "</tool_call>"

int http_read_tools(struct ctrl_http *h, json_t *req, struct http_gen_req *q, struct http_verr *e)
{
	json_t *tools = json_object_get(req, "tools"), *choice = json_object_get(req, "tool_choice"), *t;
	const char *cs = json_string_value(choice);
	size_t i;

	if (choice && !json_is_null(choice) && (!cs || (strcmp(cs, "none") && strcmp(cs, "auto"))))
		return http_verr_set(e, 400, "tool_choice", "unsupported_value",
				     "'tool_choice' may be \"auto\" or \"none\": forcing a call (\"required\", or a named "
				     "function) needs constrained decoding, which kvferry does not do");
	if (!tools || json_is_null(tools) || (json_is_array(tools) && json_array_size(tools) == 0))
		return 0;
	if (!json_is_array(tools))
		return http_verr_set(e, 400, "tools", "invalid_type", "'tools' must be an array of function tools");
	json_array_foreach(tools, i, t) {
		json_t *f = json_object_get(t, "function");
		const char *type = json_string_value(json_object_get(t, "type"));

		if (!json_is_object(t) || !type || strcmp(type, "function") || !json_is_object(f)
		    || !json_is_string(json_object_get(f, "name")) || json_string_length(json_object_get(f, "name")) == 0)
			return http_verr_set(e, 400, "tools", "invalid_value",
					     "tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\": ..., "
					     "\"parameters\": {...}}}", i);
	}
	if (!kn_tok_chat_has_tools(h->tok))
		return http_verr_set(e, 400, "tools", "unsupported_value",
				     "this model's chat template does not render tools in a form kvferry knows (it "
				     "renders them for the Qwen 2.5 and 3 and Llama 3.1+ templates): remove 'tools'");
	q->tool_parse = !cs || strcmp(cs, "none") != 0 ? kn_tok_chat_tool_style(h->tok) : 0;
	return 0;
}

size_t http_tool_hold(const struct gen *g, size_t upto)
{
	const char *at;
	size_t from = g->text_base, n;

	if (!g->tool_parse || !g->text.p)
		return upto;
	if (g->tool_parse == 2) { /* held while it may be a call: blank so far, or "{..." */
		const char *c = g->text.p + from, *e = g->text.p + g->text.len;

		while (c < e && (*c == ' ' || *c == '\n' || *c == '\t' || *c == '\r'))
			c++;
		return (c == e && !g->done) || (c < e && *c == '{') ? from : upto;
	}
	/* the text already sent holds no "<tool_call>" (nothing goes past one):
	 * look only from where one could still start, not from the top each chunk */
	if (g->emitted >= from + strlen(TC_OPEN) && g->emitted <= g->text.len)
		from = g->emitted - (strlen(TC_OPEN) - 1);
	at = memmem(g->text.p + from, g->text.len - from, TC_OPEN, strlen(TC_OPEN));
	if (at)
		return (size_t)(at - g->text.p) < upto ? (size_t)(at - g->text.p) : upto;
	if (g->done)
		return upto;
	/* a tail that may still grow into "<tool_call>" */
	for (n = strlen(TC_OPEN) - 1; n > 0; n--)
		if (g->text.len - from >= n && !memcmp(g->text.p + g->text.len - n, TC_OPEN, n))
			break;
	return g->text.len - n < upto ? g->text.len - n : upto;
}

/* A call id: "chatcmpl-tool-" and 16 hex digits, unique in the server's life. */
static json_t *call_id(struct ctrl_http *h)
{
	char id[48];
	const uint64_t x = kvf_mix64(h->id_salt ^ (atomic_fetch_add(&h->ids, 1) * KVF_MIX_GOLDEN));

	snprintf(id, sizeof(id), "chatcmpl-tool-%016llx", (unsigned long long)x);
	return json_string(id);
}

/* One call object ({"name": string, "arguments" or "parameters": any}) as
 * a tool_calls entry, or NULL. */
static json_t *call_entry(struct ctrl_http *h, json_t *c)
{
	json_t *name = json_object_get(c, "name"), *args = json_object_get(c, "arguments"), *e;
	char *a;

	if (!args)
		args = json_object_get(c, "parameters");
	if (!json_is_object(c) || !json_is_string(name) || !args || !(a = json_dumps(args, JSON_ENCODE_ANY)))
		return NULL;
	e = json_pack("{s:o, s:s, s:{s:O, s:s}}", "id", call_id(h), "type", "function", "function", "name", name,
		      "arguments", a);
	free(a);
	return e;
}

/* Llama 3.1+: the answer is {"name", "parameters"} objects, ";" between. */
static json_t *json_calls(struct gen *g, size_t *content_end)
{
	const char *p = g->text.p + g->text_base, *end = g->text.p + g->text.len;
	json_t *calls = json_array();

	*content_end = 0;
	for (;;) {
		json_error_t err;
		json_t *c, *entry;

		while (p < end && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ';'))
			p++;
		if (p == end)
			break;
		c = *p == '{' ? json_loadb(p, (size_t)(end - p), JSON_DISABLE_EOF_CHECK, &err) : NULL;
		entry = c ? call_entry(g->h, c) : NULL;
		json_decref(c);
		if (!entry) {
			json_decref(calls);
			return NULL;
		}
		json_array_append_new(calls, entry);
		p += err.position;
	}
	if (json_array_size(calls) == 0) {
		json_decref(calls);
		return NULL;
	}
	return calls;
}

json_t *http_tool_calls(struct gen *g, size_t *content_end)
{
	const char *p, *end = g->text.p + g->text.len;
	json_t *calls;

	if (!g->tool_parse || g->failed || !g->text.p)
		return NULL;
	if (g->tool_parse == 2)
		return json_calls(g, content_end);
	p = memmem(g->text.p + g->text_base, g->text.len - g->text_base, TC_OPEN, strlen(TC_OPEN));
	if (!p)
		return NULL;
	*content_end = (size_t)(p - g->text.p);
	calls = json_array();
	while (p) {
		const char *body = p + strlen(TC_OPEN), *close = memmem(body, (size_t)(end - body), TC_CLOSE, strlen(TC_CLOSE));
		const char *stop = close ? close : end;
		json_t *c = json_loadb(body, (size_t)(stop - body), JSON_DECODE_ANY, NULL), *entry;

		entry = c ? call_entry(g->h, c) : NULL;
		json_decref(c);
		if (!entry) {
			json_decref(calls);
			return NULL; /* not a call: the answer is text */
		}
		json_array_append_new(calls, entry);
		p = close ? memmem(close, (size_t)(end - close), TC_OPEN, strlen(TC_OPEN)) : NULL;
	}
	return calls;
}
