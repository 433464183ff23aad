/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Chat prompts of the two template families kvferry serves, written out in C
 * instead of running the Jinja template: the families are few and fixed, and
 * a template engine would be the largest part of the tokenizer. The family is
 * chosen at open from the chat_template text (kn_tok.c, load_config); the
 * output must equal what transformers' apply_chat_template renders for the
 * same messages, tested in tests/kernels/test_tok.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kn_tok_int.h"

static int is_ws(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Append s[0..n) with leading/trailing characters equal to only removed
 * (which: 1 leading, 2 trailing, 3 both); only 0 means any whitespace. */
static int add_stripped(struct kn_tok_buf *b, const char *s, size_t n, int which, char only)
{
	while ((which & 1) && n && (only ? *s == only : is_ws(*s))) {
		s++;
		n--;
	}
	while ((which & 2) && n && (only ? s[n - 1] == only : is_ws(s[n - 1])))
		n--;
	return kn_tok_buf_add(b, s, n);
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

/* Qwen3: an assistant turn's reasoning sits between <think> and </think>. */
static int chatml_assistant(const struct kn_tok *t, struct kn_tok_buf *b, const char *c,
			    int after_query, int last)
{
	const char *content = c, *end = strstr(c, "</think>");
	const char *r = "", *re = r;
	int rc = 0;

	if (t->chat_think && end) {
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
	if (t->chat_think && after_query && (last || re > r)) {
		rc |= kn_tok_buf_str(b, "<think>\n");
		rc |= add_stripped(b, r, (size_t)(re - r), 3, '\n');
		rc |= kn_tok_buf_str(b, "\n</think>\n\n");
		rc |= add_stripped(b, content, strlen(content), 1, '\n');
	} else {
		rc |= kn_tok_buf_str(b, content);
	}
	rc |= kn_tok_buf_str(b, "<|im_end|>\n");
	return rc;
}

static int render_chatml(const struct kn_tok *t, const struct kn_chat_msg *m, size_t n,
			 int gen, struct kn_tok_buf *b)
{
	size_t last_query = n ? n - 1 : 0;
	int rc = 0;

	for (size_t i = n; i-- > 0;)
		if (strcmp(m[i].role, "user") == 0 &&
		    !starts_ends(m[i].content, "<tool_response>", "</tool_response>")) {
			last_query = i;
			break;
		}
	if (n && strcmp(m[0].role, "system") == 0) {
		rc |= kn_tok_buf_str(b, "<|im_start|>system\n");
		rc |= kn_tok_buf_str(b, m[0].content);
		rc |= kn_tok_buf_str(b, "<|im_end|>\n");
	} else if (t->chat_system) {
		rc |= kn_tok_buf_str(b, "<|im_start|>system\n");
		rc |= kn_tok_buf_str(b, t->chat_system);
		rc |= kn_tok_buf_str(b, "<|im_end|>\n");
	}
	for (size_t i = 0; i < n; i++) {
		const char *role = m[i].role;

		if (strcmp(role, "user") == 0 || (strcmp(role, "system") == 0 && i > 0)) {
			rc |= kn_tok_buf_str(b, "<|im_start|>");
			rc |= kn_tok_buf_str(b, role);
			rc |= kn_tok_buf_str(b, "\n");
			rc |= kn_tok_buf_str(b, m[i].content);
			rc |= kn_tok_buf_str(b, "<|im_end|>\n");
		} else if (strcmp(role, "assistant") == 0) {
			rc |= chatml_assistant(t, b, m[i].content, i > last_query, i + 1 == n);
		} else if (strcmp(role, "tool") == 0) {
			if (i == 0 || strcmp(m[i - 1].role, "tool") != 0)
				rc |= kn_tok_buf_str(b, "<|im_start|>user");
			rc |= kn_tok_buf_str(b, "\n<tool_response>\n");
			rc |= kn_tok_buf_str(b, m[i].content);
			rc |= kn_tok_buf_str(b, "\n</tool_response>");
			if (i + 1 == n || strcmp(m[i + 1].role, "tool") != 0)
				rc |= kn_tok_buf_str(b, "<|im_end|>\n");
		} else if (strcmp(role, "system") != 0) {
			return -EINVAL;
		}
	}
	if (gen)
		rc |= kn_tok_buf_str(b, "<|im_start|>assistant\n");
	return rc ? -ENOMEM : 0;
}

static int llama3_turn(struct kn_tok_buf *b, const char *role, const char *content)
{
	int rc = 0;

	rc |= kn_tok_buf_str(b, "<|start_header_id|>");
	rc |= kn_tok_buf_str(b, role);
	rc |= kn_tok_buf_str(b, "<|end_header_id|>\n\n");
	rc |= add_stripped(b, content, strlen(content), 3, 0);
	rc |= kn_tok_buf_str(b, "<|eot_id|>");
	return rc;
}

static int render_llama3(const struct kn_tok *t, const struct kn_chat_msg *m, size_t n,
			 int gen, struct kn_tok_buf *b)
{
	size_t first = 0;
	int rc = 0;

	if (t->bos_text)
		rc |= kn_tok_buf_str(b, t->bos_text);
	if (t->chat_dated) {
		/* Llama 3.1+ always opens with a dated system block; the template's
		 * default date is the one written here. */
		const char *sys = "";

		if (n && strcmp(m[0].role, "system") == 0) {
			sys = m[0].content;
			first = 1;
		}
		rc |= kn_tok_buf_str(b, "<|start_header_id|>system<|end_header_id|>\n\n"
				     "Cutting Knowledge Date: December 2023\n"
				     "Today Date: 26 Jul 2024\n\n");
		rc |= add_stripped(b, sys, strlen(sys), 3, 0);
		rc |= kn_tok_buf_str(b, "<|eot_id|>");
	}
	for (size_t i = first; i < n; i++) {
		const char *role = m[i].role;

		if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
		    strcmp(role, "ipython") && strcmp(role, "tool"))
			return -EINVAL;
		rc |= llama3_turn(b, strcmp(role, "tool") == 0 && t->chat_dated ? "ipython" : role,
				  m[i].content);
	}
	if (gen || t->chat_gen_always)
		rc |= kn_tok_buf_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
	return rc ? -ENOMEM : 0;
}

int kn_tok_apply_chat(const struct kn_tok *t, const struct kn_chat_msg *msgs,
		      size_t n, int add_generation_prompt, char **out)
{
	struct kn_tok_buf b = { 0 };
	int rc;

	if (!t || (!msgs && n) || !out)
		return -EINVAL;
	*out = NULL;
	for (size_t i = 0; i < n; i++)
		if (!msgs[i].role || !msgs[i].content)
			return -EINVAL;
	if (kn_tok_buf_add(&b, "", 0))
		return -ENOMEM;
	switch (t->chat) {
	case KN_CHAT_CHATML:
		rc = render_chatml(t, msgs, n, add_generation_prompt, &b);
		break;
	case KN_CHAT_LLAMA3:
		rc = render_llama3(t, msgs, n, add_generation_prompt, &b);
		break;
	default:
		rc = -ENOTSUP;
		break;
	}
	if (rc) {
		free(b.p);
		return rc;
	}
	*out = b.p;
	return 0;
}
