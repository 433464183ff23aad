/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Chat prompts of the template families kvferry serves, written out in C
 * instead of running the Jinja template: the families are few and fixed, and
 * a template engine would be the largest part of the tokenizer.
 *
 * The family and its variants are read off the template text once, when the
 * tokenizer opens (kn_tok.c, load_config) or when an operator replaces the
 * template (kn_tok_set_chat_template, ctrld's --chat-template):
 *
 *   ChatML    "<|im_start|>"           each message <|im_start|>ROLE\nCONTENT<|im_end|>\n,
 *                                      any role, content as is
 *     default system prompt            a template text run or string literal holding a
 *                                      whole "<|im_start|>system\n...<|im_end|>" (Qwen 2, 2.5)
 *     tool turns "<tool_response>"     (Qwen 2.5, 3) tool results go in a user turn, runs of
 *                                      them share it; the template drops other roles: we refuse
 *     reasoning "</think>"             (Qwen 3) <think> split off assistant turns after the
 *                                      last user query
 *     "enable_thinking"                (Qwen 3) false: the answer opens with an empty
 *                                      <think>\n\n</think>\n\n (KN_CHAT_NO_THINKING)
 *     "<tools>" and "<tool_call>"      (Qwen 2.5, 3) `tools` listed in the system turn, each
 *                                      through tojson (json.dumps' format: add_py_json()),
 *                                      an assistant turn's tool calls as <tool_call> JSON
 *   Llama 3   "<|start_header_id|>"    BOS, <|start_header_id|>ROLE<|end_header_id|>\n\n,
 *                                      content | trim (Python's str.strip()), <|eot_id|>
 *     no "add_generation_prompt"       (3.0 as first released) the assistant header always
 *     "Cutting Knowledge Date"         (3.1+) a dated system block always opens; tool and
 *                                      ipython results are written as JSON strings (tojson)
 *     "strftime_now"                   (3.2) the block is dated today, not 26 Jul 2024
 *     "Environment: ipython"           (3.1+) `tools` go into the first user message (each
 *                                      tojson(indent=4)), a tool call is {"name", "parameters"}
 *
 * Invariant: kn_tok_apply_chat() returns what Hugging Face transformers'
 * apply_chat_template renders with the model's template for the same
 * messages, byte for byte — with one exception: where a Qwen 2.5/3 template
 * would silently drop a message of a role it does not know, we refuse the
 * conversation (-EINVAL), so a client's instruction never disappears
 * unseen. Break the invariant and the model is prompted in a format it was
 * not trained on: nothing fails, answers just get worse. It is checked string
 * for string against python3-jinja2 by tests/kernels/chat_reference.py over
 * the templates of tests/kernels/data/chat/ and of every models/ directory.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <unistr.h>

#include "kn_err.h"
#include "kn_tok_int.h"

/* ---- text helpers ------------------------------------------------------ */

/* Python's str.isspace(): what Jinja's trim filter (str.strip()) removes. */
static int py_space(ucs4_t c)
{
	return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
	       c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
	       c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Append s with Python whitespace stripped from both ends ({{ x | trim }}). */
static int add_trimmed(struct kn_tok_buf *b, const char *s)
{
	const uint8_t *p = (const uint8_t *)s, *e = p + strlen(s);
	ucs4_t c;

	while (p < e) {
		int l = u8_mbtouc(&c, p, (size_t)(e - p));

		if (l <= 0 || !py_space(c))
			break;
		p += l;
	}
	while (e > p) {
		const uint8_t *q = u8_prev(&c, e, p);

		if (!q || !py_space(c))
			break;
		e = q;
	}
	return kn_tok_buf_add(b, p, (size_t)(e - p));
}

/* Append s[0..n) with leading (which & 1) and/or trailing (which & 2)
 * newlines removed: Python's lstrip/rstrip/strip('\n'). */
static int add_strip_nl(struct kn_tok_buf *b, const char *s, size_t n, int which)
{
	while ((which & 1) && n && *s == '\n') {
		s++;
		n--;
	}
	while ((which & 2) && n && s[n - 1] == '\n')
		n--;
	return kn_tok_buf_add(b, s, n);
}

/* Append s as a JSON string the way transformers' tojson filter writes it
 * (Python's json.dumps, ensure_ascii=False: only '"', '\\' and controls are
 * escaped, the latter as \n or \u001f, lower-case hex). */
static int add_json_string(struct kn_tok_buf *b, const char *s)
{
	int rc = kn_tok_buf_add(b, "\"", 1);

	for (const char *run = s;; s++) {
		unsigned char c = (unsigned char)*s;
		const char *e = NULL;
		char u[8];

		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		rc |= kn_tok_buf_add(b, run, (size_t)(s - run));
		if (!c)
			break;
		switch (c) {
		case '"': e = "\\\""; break;
		case '\\': e = "\\\\"; break;
		case '\n': e = "\\n"; break;
		case '\r': e = "\\r"; break;
		case '\t': e = "\\t"; break;
		case '\b': e = "\\b"; break;
		case '\f': e = "\\f"; break;
		default:
			snprintf(u, sizeof(u), "\\u%04x", c);
			e = u;
		}
		rc |= kn_tok_buf_str(b, e);
		run = s + 1;
	}
	return rc | kn_tok_buf_add(b, "\"", 1);
}

/* A float as Python's repr() writes it (json.dumps uses it): the shortest
 * digits that read back to the same double, fixed notation from 1e-4 up to
 * 1e16 (with ".0" when whole), else d.ddde+XX. */
static int add_py_float(struct kn_tok_buf *b, double x)
{
	char e[40], d[24], out[64];
	int p = 1, exp, nd = 0, o = 0;

	for (; p <= 17; p++) {
		snprintf(e, sizeof(e), "%.*e", p - 1, x);
		if (strtod(e, NULL) == x)
			break;
	}
	/* e: [-]D[.DDD]e[+-]XX */
	for (const char *c = e; *c && *c != 'e'; c++)
		if (*c >= '0' && *c <= '9')
			d[nd++] = *c;
	d[nd] = 0;
	exp = atoi(strchr(e, 'e') + 1);
	if (signbit(x))
		out[o++] = '-';
	if (exp >= -4 && exp < 16) {
		if (exp < 0) {
			o += snprintf(out + o, sizeof(out) - (size_t)o, "0.");
			for (int k = -1; k > exp; k--)
				out[o++] = '0';
			o += snprintf(out + o, sizeof(out) - (size_t)o, "%s", d);
		} else {
			for (int k = 0; k <= exp; k++)
				out[o++] = k < nd ? d[k] : '0';
			out[o++] = '.';
			if (nd > exp + 1)
				o += snprintf(out + o, sizeof(out) - (size_t)o, "%s", d + exp + 1);
			else
				out[o++] = '0';
		}
	} else {
		out[o++] = d[0];
		if (nd > 1)
			o += snprintf(out + o, sizeof(out) - (size_t)o, ".%s", d + 1);
		o += snprintf(out + o, sizeof(out) - (size_t)o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
	}
	return kn_tok_buf_add(b, out, (size_t)o);
}

/* Before item @p i of a container at @p depth: json.dumps' separator, and
 * with an indent a newline and the item's indentation. */
static int py_item(struct kn_tok_buf *b, size_t i, int indent, int depth)
{
	int rc = i ? kn_tok_buf_str(b, indent ? "," : ", ") : 0;

	if (indent) {
		rc |= kn_tok_buf_add(b, "\n", 1);
		for (int k = 0; k < indent * depth; k++)
			rc |= kn_tok_buf_add(b, " ", 1);
	}
	return rc;
}

/* A JSON value as transformers' tojson writes it: json.dumps with
 * ensure_ascii=False and the default separators ", " and ": " (with
 * @p indent, tojson(indent=N): "," and a newline, N spaces a level), keys
 * in their order. */
static int add_py_json_in(struct kn_tok_buf *b, const json_t *v, int indent, int depth)
{
	const char *key;
	json_t *x;
	size_t i = 0;
	int rc = 0;
	char num[32];

	switch (json_typeof(v)) {
	case JSON_OBJECT:
		rc |= kn_tok_buf_add(b, "{", 1);
		json_object_foreach((json_t *)v, key, x) {
			rc |= py_item(b, i++, indent, depth + 1);
			rc |= add_json_string(b, key);
			rc |= kn_tok_buf_add(b, ": ", 2);
			rc |= add_py_json_in(b, x, indent, depth + 1);
		}
		if (i)
			rc |= py_item(b, 0, indent, depth);
		return rc | kn_tok_buf_add(b, "}", 1);
	case JSON_ARRAY:
		rc |= kn_tok_buf_add(b, "[", 1);
		json_array_foreach(v, i, x) {
			rc |= py_item(b, i, indent, depth + 1);
			rc |= add_py_json_in(b, x, indent, depth + 1);
		}
		if (json_array_size(v))
			rc |= py_item(b, 0, indent, depth);
		return rc | kn_tok_buf_add(b, "]", 1);
	case JSON_STRING:
		return add_json_string(b, json_string_value(v));
	case JSON_INTEGER:
		snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
		return kn_tok_buf_str(b, num);
	case JSON_REAL:
		return add_py_float(b, json_real_value(v));
	case JSON_TRUE:
		return kn_tok_buf_str(b, "true");
	case JSON_FALSE:
		return kn_tok_buf_str(b, "false");
	default:
		return kn_tok_buf_str(b, "null");
	}
}

static int add_py_json(struct kn_tok_buf *b, const json_t *v)
{
	return add_py_json_in(b, v, 0, 0);
}

static const char *last_strstr(const char *h, const char *n)
{
	const char *r = NULL, *p;

	for (p = strstr(h, n); p; p = strstr(p + 1, n))
		r = p;
	return r;
}

static int starts_ends(const char *s, const char *pre, const char *suf)
{
	size_t n = strlen(s), a = strlen(pre), b = strlen(suf);

	return n >= a && n >= b && strncmp(s, pre, a) == 0 && strcmp(s + n - b, suf) == 0;
}

/* ---- ChatML (Qwen) ----------------------------------------------------- */

static int chatml_turn(struct kn_tok_buf *b, const char *role, const char *content)
{
	int rc = kn_tok_buf_str(b, "<|im_start|>");

	rc |= kn_tok_buf_str(b, role);
	rc |= kn_tok_buf_add(b, "\n", 1);
	rc |= kn_tok_buf_str(b, content);
	rc |= kn_tok_buf_str(b, "<|im_end|>\n");
	return rc;
}

/* An assistant turn's tool calls as Qwen 2.5 (each after a newline) or
 * Qwen 3 (a newline between them, and before the first after content)
 * write them; the arguments through tojson. 0, -ENOMEM or -EBADMSG. */
static int chatml_calls(const struct kn_tok *t, struct kn_tok_buf *b, const struct kn_chat_msg *m, int content)
{
	int rc = 0;

	for (size_t k = 0; k < m->n_calls; k++) {
		json_t *a = json_loads(m->calls[k].arguments ? m->calls[k].arguments : "", JSON_DECODE_ANY, NULL);

		if (!a || !m->calls[k].name) {
			json_decref(a);
			return -EBADMSG;
		}
		if (!t->chat_think || k > 0 || content)
			rc |= kn_tok_buf_add(b, "\n", 1);
		rc |= kn_tok_buf_str(b, "<tool_call>\n{\"name\": \"");
		rc |= kn_tok_buf_str(b, m->calls[k].name);
		rc |= kn_tok_buf_str(b, "\", \"arguments\": ");
		rc |= add_py_json(b, a);
		rc |= kn_tok_buf_str(b, "}\n</tool_call>");
		json_decref(a);
	}
	return rc ? -ENOMEM : 0;
}

/* Qwen3: an assistant turn's reasoning sits between <think> and </think>;
 * Qwen 2.5 and 3: its tool calls follow its content. 0, -ENOMEM, -EBADMSG. */
static int chatml_assistant(const struct kn_tok *t, struct kn_tok_buf *b, const struct kn_chat_msg *m,
			    int after_query, int last)
{
	const char *c = m->content, *content = c, *end = strstr(c, "</think>");
	const char *r = "", *re = r;
	int rc = 0;

	if (!t->chat_think && m->n_calls) {
		rc |= kn_tok_buf_str(b, "<|im_start|>assistant");
		if (*c) {
			rc |= kn_tok_buf_add(b, "\n", 1);
			rc |= kn_tok_buf_str(b, c);
		}
		if (rc)
			return -ENOMEM;
		if ((rc = chatml_calls(t, b, m, 0)))
			return rc;
		return kn_tok_buf_str(b, "<|im_end|>\n") ? -ENOMEM : 0;
	}
	if (!t->chat_think)
		return chatml_turn(b, "assistant", c) ? -ENOMEM : 0;
	if (end) {
		const char *tail = last_strstr(c, "</think>") + strlen("</think>");
		const char *open;

		content = tail;
		while (*content == '\n')
			content++;
		/* reasoning = before the first </think>, after the last <think> */
		r = c;
		re = end;
		while (re > r && re[-1] == '\n')
			re--;
		for (open = strstr(r, "<think>"); open && open < re; open = strstr(open + 1, "<think>"))
			r = open + strlen("<think>");
		while (r < re && *r == '\n')
			r++;
	}
	rc |= kn_tok_buf_str(b, "<|im_start|>assistant\n");
	if (after_query && (last || re > r)) {
		rc |= kn_tok_buf_str(b, "<think>\n");
		rc |= add_strip_nl(b, r, (size_t)(re - r), 3);
		rc |= kn_tok_buf_str(b, "\n</think>\n\n");
		rc |= add_strip_nl(b, content, strlen(content), 1);
	} else {
		rc |= kn_tok_buf_str(b, content);
	}
	if (rc)
		return -ENOMEM;
	if ((rc = chatml_calls(t, b, m, *content != 0)))
		return rc;
	return kn_tok_buf_str(b, "<|im_end|>\n") ? -ENOMEM : 0;
}

/* Qwen 2.5 and 3: the system turn that lists the tools. */
static int chatml_tools(const struct kn_tok *t, struct kn_tok_buf *b, const struct kn_chat_msg *m, size_t n,
			const json_t *tools)
{
	const char *sys = n && strcmp(m[0].role, "system") == 0 ? m[0].content : NULL;
	size_t i;
	json_t *x;
	int rc = kn_tok_buf_str(b, "<|im_start|>system\n");

	if (t->chat_think) { /* Qwen 3: no default system prompt */
		if (sys) {
			rc |= kn_tok_buf_str(b, sys);
			rc |= kn_tok_buf_str(b, "\n\n");
		}
	} else {
		rc |= kn_tok_buf_str(b, sys ? sys : t->chat_system ? t->chat_system : "");
		rc |= kn_tok_buf_str(b, "\n\n");
	}
	rc |= kn_tok_buf_str(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
			     "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
	json_array_foreach(tools, i, x) {
		rc |= kn_tok_buf_add(b, "\n", 1);
		rc |= add_py_json(b, x);
	}
	rc |= kn_tok_buf_str(b, "\n</tools>\n\nFor each function call, return a json object with function name and "
			     "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
			     "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
	return rc;
}

static int render_chatml(const struct kn_tok *t, const struct kn_chat_msg *m, size_t n,
			 unsigned flags, const json_t *tools, struct kn_tok_buf *b)
{
	int gen = (flags & KN_CHAT_GEN) != 0;
	size_t last_query = n ? n - 1 : 0;
	int rc = 0, e;

	for (size_t i = n; i-- > 0;)
		if (strcmp(m[i].role, "user") == 0 &&
		    !starts_ends(m[i].content, "<tool_response>", "</tool_response>")) {
			last_query = i;
			break;
		}
	if (tools && json_array_size(tools))
		rc |= chatml_tools(t, b, m, n, tools);
	else if (n && strcmp(m[0].role, "system") == 0)
		rc |= chatml_turn(b, "system", m[0].content);
	else if (t->chat_system)
		rc |= chatml_turn(b, "system", t->chat_system);
	for (size_t i = 0; i < n; i++) {
		const char *role = m[i].role;

		if (i == 0 && strcmp(role, "system") == 0)
			continue;
		if (strcmp(role, "assistant") == 0) {
			if ((e = chatml_assistant(t, b, &m[i], i > last_query, i + 1 == n)) == -EBADMSG)
				return e;
			rc |= e;
		} else if (t->chat_tools && strcmp(role, "tool") == 0) {
			if (i == 0 || strcmp(m[i - 1].role, "tool") != 0)
				rc |= kn_tok_buf_str(b, "<|im_start|>user");
			rc |= kn_tok_buf_str(b, "\n<tool_response>\n");
			rc |= kn_tok_buf_str(b, m[i].content);
			rc |= kn_tok_buf_str(b, "\n</tool_response>");
			if (i + 1 == n || strcmp(m[i + 1].role, "tool") != 0)
				rc |= kn_tok_buf_str(b, "<|im_end|>\n");
		} else if (t->chat_tools && strcmp(role, "user") && strcmp(role, "system")) {
			return -EINVAL; /* the template would drop it without a word */
		} else {
			rc |= chatml_turn(b, role, m[i].content);
		}
	}
	if (gen)
		rc |= kn_tok_buf_str(b, "<|im_start|>assistant\n");
	if (gen && t->chat_think_switch && (flags & KN_CHAT_NO_THINKING)) /* Qwen 3's enable_thinking false */
		rc |= kn_tok_buf_str(b, "<think>\n\n</think>\n\n");
	return rc ? -ENOMEM : 0;
}

/* ---- Llama 3 ----------------------------------------------------------- */

static int llama3_header(struct kn_tok_buf *b, const char *role)
{
	int rc = kn_tok_buf_str(b, "<|start_header_id|>");

	rc |= kn_tok_buf_str(b, role);
	rc |= kn_tok_buf_str(b, "<|end_header_id|>\n\n");
	return rc;
}

/* "Today Date: 01 Dec 2026" as strftime_now("%d %b %Y") writes it: local
 * time, C-locale month names (neither Python nor we set LC_TIME). */
static int add_today(struct kn_tok_buf *b)
{
	time_t now = time(NULL);
	struct tm tm;
	char d[64];

	if (!localtime_r(&now, &tm) || !strftime(d, sizeof(d), "%d %b %Y", &tm))
		return kn_tok_buf_str(b, "26 Jul 2024");
	return kn_tok_buf_str(b, d);
}

/* Llama 3.1+: an assistant turn's one tool call, {"name": ..., "parameters": ...}. */
static int llama3_call(struct kn_tok_buf *b, const struct kn_chat_call *c)
{
	json_t *a = json_loads(c->arguments ? c->arguments : "", JSON_DECODE_ANY, NULL);
	int rc;

	if (!a || !c->name) {
		json_decref(a);
		return -EBADMSG;
	}
	rc = llama3_header(b, "assistant");
	rc |= kn_tok_buf_str(b, "{\"name\": \"");
	rc |= kn_tok_buf_str(b, c->name);
	rc |= kn_tok_buf_str(b, "\", \"parameters\": ");
	rc |= add_py_json(b, a);
	rc |= kn_tok_buf_str(b, "}<|eot_id|>");
	json_decref(a);
	return rc ? -ENOMEM : 0;
}

/* Llama 3.1+: the tools go into the first message after the system one
 * (tools_in_user_message, the templates' default), each tojson(indent=4). */
static int llama3_tools(struct kn_tok_buf *b, const struct kn_chat_msg *first, const json_t *tools)
{
	size_t i;
	json_t *x;
	int rc = llama3_header(b, "user");

	rc |= kn_tok_buf_str(b, "Given the following functions, please respond with a JSON for a function call with its "
			     "proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": "
			     "function name, \"parameters\": dictionary of argument name and its value}.Do not use "
			     "variables.\n\n");
	json_array_foreach(tools, i, x) {
		rc |= add_py_json_in(b, x, 4, 0);
		rc |= kn_tok_buf_str(b, "\n\n");
	}
	rc |= add_trimmed(b, first->content);
	return rc | kn_tok_buf_str(b, "<|eot_id|>");
}

static int render_llama3(const struct kn_tok *t, const struct kn_chat_msg *m, size_t n,
			 int gen, const json_t *tools, struct kn_tok_buf *b)
{
	size_t first = 0;
	int rc = 0, e;

	if (t->bos_text)
		rc |= kn_tok_buf_str(b, t->bos_text);
	if (t->chat_dated) {
		/* Llama 3.1+ always opens with a dated system block: 3.1 and 3.3
		 * date it with the template's default, 3.2 with today. */
		rc |= llama3_header(b, "system");
		if (tools)
			rc |= kn_tok_buf_str(b, "Environment: ipython\n");
		rc |= kn_tok_buf_str(b, "Cutting Knowledge Date: December 2023\nToday Date: ");
		rc |= t->chat_today ? add_today(b) : kn_tok_buf_str(b, "26 Jul 2024");
		rc |= kn_tok_buf_str(b, "\n\n");
		if (n && strcmp(m[0].role, "system") == 0) {
			rc |= add_trimmed(b, m[0].content);
			first = 1;
		}
		rc |= kn_tok_buf_str(b, "<|eot_id|>");
	}
	if (tools) {
		if (first >= n)
			return -EINVAL; /* the template raises: no first user message to put them in */
		rc |= llama3_tools(b, &m[first++], tools);
	}
	for (size_t i = first; i < n; i++) {
		const char *role = m[i].role;

		if (m[i].n_calls) {
			if (m[i].n_calls != 1)
				return -EINVAL; /* "This model only supports single tool-calls at once!" */
			if ((e = llama3_call(b, &m[i].calls[0])))
				return e;
			continue;
		}
		if (t->chat_dated && (strcmp(role, "tool") == 0 || strcmp(role, "ipython") == 0)) {
			/* the template's `content is iterable` holds for a string:
			 * tool results go through tojson, quoted and untrimmed */
			rc |= llama3_header(b, "ipython");
			rc |= add_json_string(b, m[i].content);
		} else {
			rc |= llama3_header(b, role);
			rc |= add_trimmed(b, m[i].content);
		}
		rc |= kn_tok_buf_str(b, "<|eot_id|>");
	}
	if (gen || t->chat_gen_always)
		rc |= llama3_header(b, "assistant");
	return rc ? -ENOMEM : 0;
}

int kn_tok_apply_chat(const struct kn_tok *t, const struct kn_chat_msg *msgs,
		      size_t n, int add_generation_prompt, char **out)
{
	return kn_tok_apply_chat_flags(t, msgs, n, add_generation_prompt ? KN_CHAT_GEN : 0, out);
}

int kn_tok_apply_chat_flags(const struct kn_tok *t, const struct kn_chat_msg *msgs, size_t n, unsigned flags,
			    char **out)
{
	return kn_tok_apply_chat_tools(t, msgs, n, NULL, flags, out);
}

int kn_tok_chat_has_tools(const struct kn_tok *t)
{
	return t && t->chat_tool_defs;
}

int kn_tok_chat_tool_style(const struct kn_tok *t)
{
	return !kn_tok_chat_has_tools(t) ? 0 : t->chat == KN_CHAT_LLAMA3 ? 2 : 1;
}

int kn_tok_apply_chat_tools(const struct kn_tok *t, const struct kn_chat_msg *msgs, size_t n,
			    const char *tools_json, unsigned flags, char **out)
{
	struct kn_tok_buf b = { 0 };
	json_t *tools = NULL;
	int rc, calls = 0;

	if (!t || (!msgs && n) || !out)
		return -EINVAL;
	*out = NULL;
	for (size_t i = 0; i < n; i++) {
		if (!msgs[i].role || !msgs[i].content || (msgs[i].n_calls && !msgs[i].calls))
			return -EINVAL;
		calls |= msgs[i].n_calls > 0;
	}
	if (tools_json) {
		tools = json_loads(tools_json, 0, NULL);
		if (!json_is_array(tools)) {
			json_decref(tools);
			return -EBADMSG;
		}
	}
	if ((calls || json_array_size(tools)) && !kn_tok_chat_has_tools(t)) {
		json_decref(tools);
		return -ENOTSUP; /* tools on a template kvferry does not render them for */
	}
	if (kn_tok_buf_add(&b, "", 0)) {
		json_decref(tools);
		return -ENOMEM;
	}
	switch (t->chat) {
	case KN_CHAT_CHATML:
		rc = render_chatml(t, msgs, n, flags, tools, &b);
		break;
	case KN_CHAT_LLAMA3:
		/* (an empty list is "not none" to the Llama templates) */
		rc = render_llama3(t, msgs, n, (flags & KN_CHAT_GEN) != 0, t->chat_tool_defs ? tools : NULL, &b);
		break;
	default:
		rc = -ENOTSUP;
		break;
	}
	json_decref(tools);
	if (rc) {
		free(b.p);
		return rc;
	}
	*out = b.p;
	return 0;
}

/* ---- reading the template ---------------------------------------------- */

/* Set t->chat_system when p[0..n) — one run of template text, or one
 * decoded string literal — holds a whole "<|im_start|>system\n" TEXT
 * "<|im_end|>": a system turn the template writes by itself. A turn split
 * over pieces ('<|im_start|>system\n' + messages[0].content + ...) is the
 * caller's. Returns 0 or -ENOMEM. */
static int system_turn_in(struct kn_tok *t, const char *p, size_t n)
{
	static const char open[] = "<|im_start|>system\n", close[] = "<|im_end|>";
	const char *a = n ? memmem(p, n, open, sizeof(open) - 1) : NULL, *e;

	if (!a || t->chat_system)
		return 0;
	a += sizeof(open) - 1;
	e = memmem(a, n - (size_t)(a - p), close, sizeof(close) - 1);
	if (!e)
		return 0;
	t->chat_system = strndup(a, (size_t)(e - a));
	return t->chat_system ? 0 : -ENOMEM;
}

/* Find the default system prompt of a ChatML template (Qwen2, Qwen2.5, or
 * a hand-written one), whether it is spelled as template text with a real
 * newline or as a string literal with "\n": walk the template as Jinja's
 * lexer does — text, {# comments #}, {{ }} and {% %} tags, and quoted
 * literals inside tags, unescaped as Python does the common escapes. */
static int find_default_system(struct kn_tok *t, const char *s)
{
	struct kn_tok_buf lit = { 0 };
	const char *p = s;
	int rc = 0;

	while (*p && !rc) {
		const char *q = p;
		char closer;

		while (*q && !(q[0] == '{' && (q[1] == '{' || q[1] == '%' || q[1] == '#')))
			q++;
		rc = system_turn_in(t, p, (size_t)(q - p));
		if (!*q)
			break;
		if (q[1] == '#') {
			const char *e = strstr(q + 2, "#}");

			p = e ? e + 2 : q + strlen(q);
			continue;
		}
		closer = q[1] == '{' ? '}' : '%';
		for (p = q + 2; *p && !rc && !(p[0] == closer && p[1] == '}'); p++) {
			char quote = *p;

			if (quote != '\'' && quote != '"')
				continue;
			lit.n = 0;
			for (p++; *p && *p != quote && !rc; p++) {
				char c = *p;

				if (c == '\\' && p[1]) {
					c = *++p;
					if (c == 'n')
						c = '\n';
					else if (c == 't')
						c = '\t';
					else if (c == 'r')
						c = '\r';
					else if (c != '\\' && c != '\'' && c != '"')
						rc |= kn_tok_buf_add(&lit, "\\", 1);
				}
				rc |= kn_tok_buf_add(&lit, &c, 1);
			}
			if (!rc)
				rc = system_turn_in(t, lit.p, lit.n);
			if (!*p)
				break;
		}
		if (*p)
			p += 2;
	}
	free(lit.p);
	return rc ? -ENOMEM : 0;
}

/* The start of a template for a message: at most 48 bytes, whole UTF-8
 * characters, newlines and tabs shown as \n and \t. */
static void excerpt(const char *tmpl, char *out, size_t cap)
{
	size_t k = 0, i = 0, n = strlen(tmpl);

	while (i < n && i < 48 && k + 8 < cap) {
		int l = u8_mblen((const uint8_t *)tmpl + i, n - i);

		if (l <= 0)
			l = 1;
		if (tmpl[i] == '\n' || tmpl[i] == '\t') {
			out[k++] = '\\';
			out[k++] = tmpl[i] == '\n' ? 'n' : 't';
		} else {
			memcpy(out + k, tmpl + i, (size_t)l);
			k += (size_t)l;
		}
		i += (size_t)l;
	}
	if (i < n && k + 4 < cap) {
		memcpy(out + k, "...", 3);
		k += 3;
	}
	out[k] = '\0';
}

int kn_tok_chat_detect(struct kn_tok *t, const char *tmpl, const char *origin)
{
	char ex[200];

	free(t->chat_system);
	t->chat_system = NULL;
	t->chat = KN_CHAT_NONE;
	t->chat_think = t->chat_think_switch = t->chat_tool_defs = t->chat_tools = 0;
	t->chat_gen_always = t->chat_dated = t->chat_today = 0;
	t->eot_id = -1;
	t->chat_err[0] = '\0';
	if (!tmpl) {
		snprintf(t->chat_err, sizeof(t->chat_err), "%s: no chat template, so this model "
			 "has no chat format (use plain completion)", origin);
		return 0;
	}
	if (strstr(tmpl, "<|im_start|>")) {
		t->chat = KN_CHAT_CHATML;
		t->chat_think = strstr(tmpl, "</think>") != NULL;
		t->chat_think_switch = t->chat_think && strstr(tmpl, "enable_thinking") != NULL;
		t->chat_tool_defs = strstr(tmpl, "<tool_response>") && strstr(tmpl, "<tools>") && strstr(tmpl, "<tool_call>");
		t->chat_tools = strstr(tmpl, "<tool_response>") != NULL;
		t->eot_id = kn_tok_token_to_id(t, "<|im_end|>");
		return find_default_system(t, tmpl);
	}
	if (strstr(tmpl, "<|start_header_id|>")) {
		t->chat = KN_CHAT_LLAMA3;
		/* Llama 3.0's template as first released has no add_generation_prompt
		 * test: it always ends with the assistant header. */
		t->chat_gen_always = strstr(tmpl, "add_generation_prompt") == NULL;
		t->chat_dated = strstr(tmpl, "Cutting Knowledge Date") != NULL;
		/* 3.1+: tools in the first user message, calls as {"name", "parameters"} JSON */
		t->chat_tool_defs = t->chat_dated && strstr(tmpl, "Environment: ipython")
				    && strstr(tmpl, "\"parameters\": ") && strstr(tmpl, "tools_in_user_message");
		t->chat_today = t->chat_dated && strstr(tmpl, "strftime_now") != NULL;
		t->eot_id = kn_tok_token_to_id(t, "<|eot_id|>");
		return 0;
	}
	t->chat = KN_CHAT_UNKNOWN;
	excerpt(tmpl, ex, sizeof(ex));
	snprintf(t->chat_err, sizeof(t->chat_err), "the chat template of %s (\"%s\") is of an "
		 "unknown family: neither ChatML (<|im_start|>) nor Llama 3 (<|start_header_id|>), "
		 "the two kvferry renders", origin, ex);
	return 0;
}

int kn_tok_set_chat_template(struct kn_tok *t, const char *tmpl, const char *origin)
{
	if (!t)
		return -EINVAL;
	return kn_tok_chat_detect(t, tmpl, origin ? origin : "the chat template given");
}

int kn_tok_load_chat_template(struct kn_tok *t, const char *path, char *err, size_t errlen)
{
	struct kn_tok_buf b = { 0 };
	const char *tmpl, *s;
	json_t *j = NULL;
	char chunk[65536];
	size_t got;
	FILE *f;
	int rc = 0;

	if (!t || !path)
		return -EINVAL;
	f = fopen(path, "rb");
	if (!f) {
		rc = -errno;
		kn_seterr(err, errlen, "fopen(%s) failed: %s; a chat template file holds a Jinja "
			  "template (or JSON with a \"chat_template\" key)", path, strerror(-rc));
		return rc;
	}
	while (!rc && (got = fread(chunk, 1, sizeof(chunk), f)) > 0)
		rc = kn_tok_buf_add(&b, chunk, got);
	if (!rc && ferror(f)) {
		rc = -EIO;
		kn_seterr(err, errlen, "fread(%s) failed", path);
	}
	fclose(f);
	if (rc == -ENOMEM)
		kn_seterr(err, errlen, "out of memory reading %s", path);
	if (rc)
		goto out;
	tmpl = b.p ? b.p : "";
	if (strlen(tmpl) != b.n || u8_check((const uint8_t *)tmpl, b.n) != NULL) {
		kn_seterr(err, errlen, "%s is not UTF-8 text, so not a chat template", path);
		rc = -EINVAL;
		goto out;
	}
	/* A Jinja template opens with text or {{ {% {#, never with {"; a file
	 * that does is a tokenizer_config.json-like object. */
	for (s = tmpl; *s == ' ' || *s == '\t' || *s == '\n' || *s == '\r'; s++)
		;
	if (s[0] == '{') {
		const char *q = s + 1;

		while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')
			q++;
		if (*q == '"' || *q == '}') {
			json_error_t je;
			const json_t *ct;

			j = json_loadb(b.p, b.n, 0, &je);
			ct = json_object_get(j, "chat_template");
			if (!json_is_string(ct)) {
				kn_seterr(err, errlen, "%s is JSON without a \"chat_template\" string%s%s",
					  path, j ? "" : ": ", j ? "" : je.text);
				rc = -EINVAL;
				goto out;
			}
			tmpl = json_string_value(ct);
		}
	}
	rc = kn_tok_set_chat_template(t, tmpl, path);
	if (rc == -ENOMEM)
		kn_seterr(err, errlen, "out of memory reading %s", path);
out:
	json_decref(j);
	free(b.p);
	return rc;
}
