/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-tok: the tokenizer on the command line, JSON lines in and out, for
 * debugging and for the reference comparisons in tests/.
 *
 *   kvferry-tok encode --model DIR [--no-special] [--bos] [--time]
 *       in:  "text" or {"text": "..."}      out: {"ids": [..]}
 *   kvferry-tok decode --model DIR [--skip-special]
 *       in:  [ids] or {"ids": [..]}        out: {"text": "..."}
 *   kvferry-tok chat --model DIR [--gen] [--no-thinking] [--chat-template FILE|none]
 *       in:  [{"role": .., "content": ..}]  out: {"prompt": "...", "ids": [..]}
 *            or {"messages": [..], "tools": [..]}, assistant turns with
 *            "tool_calls": [{"function": {"name": .., "arguments": ..}}]
 *
 * --tokenizer FILE [--config FILE] replace --model. --chat-template replaces
 * the model's template as kvferry-ctrld's does. A line that fails gives
 * {"error": "..."} and the exit status is 1 at the end.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "kn_tok.h"
#include "kvf_config.h"

static void usage(void)
{
	fprintf(stderr,
		"usage: kvferry-tok encode|decode|chat (--model DIR | --tokenizer FILE "
		"[--config FILE])\n"
		"       [--no-special] [--bos] [--skip-special] [--gen] [--no-thinking] [--chat-template FILE|none]\n"
		"       [--time]\n"
		"JSON lines on stdin, one JSON object per line on stdout.\n");
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void put_ids(FILE *f, const int32_t *ids, size_t n)
{
	fputc('[', f);
	for (size_t i = 0; i < n; i++)
		fprintf(f, i ? ",%d" : "%d", ids[i]);
	fputc(']', f);
}

static void put_string(FILE *f, const char *key, const char *s, size_t n)
{
	json_t *o = json_object();
	char *d;

	json_object_set_new(o, key, json_stringn(s, n));
	d = json_dumps(o, JSON_COMPACT);
	fputs(d ? d : "{\"error\":\"json_dumps failed\"}", f);
	free(d);
	json_decref(o);
}

static void put_error(const char *what, int rc)
{
	printf("{\"error\":\"%s: %s\"}\n", what, strerror(-rc));
}

int main(int argc, char **argv)
{
	const char *model = NULL, *tjson = NULL, *tcfg = NULL, *chat_tmpl = NULL, *cmd;
	unsigned eflags = KN_TOK_SPECIAL, dflags = 0;
	int gen = 0, no_think = 0, timing = 0, failed = 0;
	char err[512];
	struct kn_tok *tok;
	char *line = NULL;
	size_t cap = 0, bytes = 0;
	ssize_t len;
	double spent = 0;

	if (argc >= 2 && !strcmp(argv[1], "--version")) {
		printf("kvferry-tok %s\n", KVF_VERSION);
		return 0;
	}
	if (argc < 2) {
		usage();
		return 2;
	}
	cmd = argv[1];
	for (int i = 2; i < argc; i++) {
		if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
			model = argv[++i];
		else if (strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc)
			tjson = argv[++i];
		else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
			tcfg = argv[++i];
		else if (strcmp(argv[i], "--chat-template") == 0 && i + 1 < argc)
			chat_tmpl = argv[++i];
		else if (strcmp(argv[i], "--no-special") == 0)
			eflags &= ~KN_TOK_SPECIAL;
		else if (strcmp(argv[i], "--bos") == 0)
			eflags |= KN_TOK_ADD_BOS;
		else if (strcmp(argv[i], "--skip-special") == 0)
			dflags |= KN_TOK_SKIP_SPECIAL;
		else if (strcmp(argv[i], "--gen") == 0)
			gen = 1;
		else if (strcmp(argv[i], "--no-thinking") == 0)
			no_think = 1;
		else if (strcmp(argv[i], "--time") == 0)
			timing = 1;
		else {
			usage();
			return 2;
		}
	}
	if ((!model && !tjson) || (strcmp(cmd, "encode") && strcmp(cmd, "decode") &&
				   strcmp(cmd, "chat"))) {
		usage();
		return 2;
	}
	tok = model ? kn_tok_open(model, err, sizeof(err)) :
		      kn_tok_open_file(tjson, tcfg, err, sizeof(err));
	if (!tok) {
		fprintf(stderr, "kvferry-tok: %s\n", err);
		return 1;
	}
	if (chat_tmpl && (strcmp(chat_tmpl, "none") == 0 ?
			  kn_tok_set_chat_template(tok, NULL, "--chat-template none") :
			  kn_tok_load_chat_template(tok, chat_tmpl, err, sizeof(err)))) {
		fprintf(stderr, "kvferry-tok: --chat-template %s: %s\n", chat_tmpl,
			strcmp(chat_tmpl, "none") == 0 ? "out of memory" : err);
		kn_tok_close(tok);
		return 1;
	}
	while ((len = getline(&line, &cap, stdin)) >= 0) {
		json_error_t je;
		json_t *j;

		while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = '\0';
		if (len == 0)
			continue;
		j = json_loadb(line, (size_t)len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
		if (!j) {
			printf("{\"error\":\"bad JSON line\"}\n");
			failed = 1;
			continue;
		}
		if (strcmp(cmd, "encode") == 0) {
			const json_t *s = json_is_object(j) ? json_object_get(j, "text") : j;
			int32_t *ids;
			size_t n;
			double t0;
			int rc;

			if (!json_is_string(s)) {
				printf("{\"error\":\"expected a string or {\\\"text\\\": ...}\"}\n");
				failed = 1;
				json_decref(j);
				continue;
			}
			t0 = now();
			rc = kn_tok_encode(tok, json_string_value(s), json_string_length(s),
					   eflags, &ids, &n);
			spent += now() - t0;
			bytes += json_string_length(s);
			if (rc) {
				put_error("kn_tok_encode", rc);
				failed = 1;
			} else {
				fputs("{\"ids\":", stdout);
				put_ids(stdout, ids, n);
				fputs("}\n", stdout);
				free(ids);
			}
		} else if (strcmp(cmd, "decode") == 0) {
			const json_t *a = json_is_object(j) ? json_object_get(j, "ids") : j;
			size_t n = json_array_size(a);
			int32_t *ids = malloc((n + 1) * sizeof(*ids));
			char *text;
			size_t tl;
			int rc;

			for (size_t i = 0; ids && i < n; i++)
				ids[i] = (int32_t)json_integer_value(json_array_get(a, i));
			rc = ids ? kn_tok_decode(tok, ids, n, dflags, &text, &tl) : -ENOMEM;
			if (rc) {
				put_error("kn_tok_decode", rc);
				failed = 1;
			} else {
				put_string(stdout, "text", text, tl);
				fputc('\n', stdout);
				free(text);
			}
			free(ids);
		} else {
			/* [messages], or {"messages": [...], "tools": [...]} with the
			 * assistant turns' "tool_calls" ([{"function": {"name",
			 * "arguments": object or JSON text}}]) */
			const json_t *msgs = json_is_object(j) ? json_object_get(j, "messages") : j;
			json_t *tl = json_is_object(j) ? json_object_get(j, "tools") : NULL;
			size_t n = json_array_size(msgs);
			struct kn_chat_msg *m = calloc(n + 1, sizeof(*m));
			struct kn_chat_call *calls = NULL;
			char **args = NULL, *tools = tl ? json_dumps(tl, 0) : NULL, *prompt = NULL;
			size_t n_args = 0, n_all = 0;
			int32_t *ids = NULL;
			size_t nid = 0;
			int rc;

			for (size_t i = 0; i < n; i++)
				n_all += json_array_size(json_object_get(json_array_get(msgs, i), "tool_calls"));
			calls = calloc(n_all + 1, sizeof(*calls));
			args = calloc(n_all + 1, sizeof(*args));
			for (size_t i = 0; m && calls && args && i < n; i++) {
				const json_t *mi = json_array_get(msgs, i), *tc = json_object_get(mi, "tool_calls"), *c;
				size_t k;

				m[i].role = json_string_value(json_object_get(mi, "role"));
				m[i].content = json_string_value(json_object_get(mi, "content"));
				if (!m[i].content && json_array_size(tc))
					m[i].content = "";
				m[i].calls = calls + n_args;
				json_array_foreach(tc, k, c) {
					const json_t *f = json_object_get(c, "function"), *a = json_object_get(f, "arguments");

					calls[n_args].name = json_string_value(json_object_get(f, "name"));
					args[n_args] = json_is_string(a) ? strdup(json_string_value(a)) : json_dumps(a, JSON_ENCODE_ANY);
					calls[n_args].arguments = args[n_args];
					n_args++;
					m[i].n_calls++;
				}
			}
			rc = m && calls && args ? kn_tok_apply_chat_tools(tok, m, n, tools, (gen ? KN_CHAT_GEN : 0u) |
									  (no_think ? KN_CHAT_NO_THINKING : 0u), &prompt)
						: -ENOMEM;
			if (rc == -ENOTSUP && (n_args || json_array_size(tl))) {
				static const char why[] = "tools are not rendered for this chat template";

				put_string(stdout, "error", why, sizeof(why) - 1);
				fputc('\n', stdout);
				failed = 1;
			} else if (rc == -ENOTSUP) {
				put_string(stdout, "error", kn_tok_chat_error(tok), strlen(kn_tok_chat_error(tok)));
				fputc('\n', stdout);
				failed = 1;
			} else if (rc) {
				put_error("kn_tok_apply_chat", rc);
				failed = 1;
			} else if ((rc = kn_tok_encode(tok, prompt, strlen(prompt), KN_TOK_SPECIAL,
						       &ids, &nid))) {
				put_error("kn_tok_encode", rc);
				failed = 1;
			} else {
				json_t *o = json_object();
				char *d;

				json_object_set_new(o, "prompt", json_string(prompt));
				d = json_dumps(o, JSON_COMPACT);
				/* splice "ids" in before the closing brace */
				if (d) {
					d[strlen(d) - 1] = '\0';
					fputs(d, stdout);
					fputs(",\"ids\":", stdout);
					put_ids(stdout, ids, nid);
					fputs("}\n", stdout);
				}
				free(d);
				json_decref(o);
			}
			free(ids);
			free(prompt);
			free(m);
			for (size_t k = 0; args && k < n_args; k++)
				free(args[k]);
			free(args);
			free(calls);
			free(tools);
		}
		json_decref(j);
	}
	if (timing && strcmp(cmd, "encode") == 0)
		fprintf(stderr, "kvferry-tok: encoded %zu bytes in %.3f s: %.2f MB/s\n",
			bytes, spent, spent > 0 ? (double)bytes / spent / 1e6 : 0.0);
	free(line);
	kn_tok_close(tok);
	return failed;
}
