/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of the tokenizer on a hand-written tokenizer.json
 * (tests/kernels/data/tok_tiny): 256 byte tokens, a few merges whose ranks
 * disagree with their position in a word, merges that split a 4-byte emoji
 * across two tokens, special and non-special added tokens, NFC.
 * The data folder comes in TOK_DATA (set by meson).
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kn_tok.h"

static char g_dir[1024];

/* Path of a data file; four rotating buffers, so one call may take two. */
static const char *data(const char *name)
{
	static char path[4][1200];
	static unsigned k;
	char *p = path[k++ % 4];

	snprintf(p, sizeof(path[0]), "%s/%s", g_dir, name);
	return p;
}

static struct kn_tok *open_tiny(void)
{
	char err[512];
	struct kn_tok *t = kn_tok_open(data("tok_tiny"), err, sizeof(err));

	if (!t)
		fail_msg("kn_tok_open: %s", err);
	return t;
}

static int32_t id_of(const struct kn_tok *t, const char *spelling)
{
	int32_t id = kn_tok_token_to_id(t, spelling);

	if (id < 0)
		fail_msg("token %s missing from the test vocabulary", spelling);
	return id;
}

/* Encode and return the ids in a fixed array; *n receives the count. */
static void enc(const struct kn_tok *t, const char *s, unsigned flags, int32_t *out,
		size_t cap, size_t *n)
{
	int32_t *ids = NULL;

	assert_int_equal(kn_tok_encode(t, s, strlen(s), flags, &ids, n), 0);
	assert_true(*n <= cap);
	if (*n)
		memcpy(out, ids, *n * sizeof(*ids));
	free(ids);
}

static void roundtrip(const struct kn_tok *t, const char *s, const char *want)
{
	int32_t *ids = NULL;
	size_t n, len;
	char *back = NULL;

	assert_int_equal(kn_tok_encode(t, s, strlen(s), KN_TOK_SPECIAL, &ids, &n), 0);
	assert_int_equal(kn_tok_decode(t, ids, n, 0, &back, &len), 0);
	assert_int_equal(len, strlen(want));
	assert_string_equal(back, want);
	free(back);
	free(ids);
}

static void merges_apply_lowest_rank_first_wherever_they_sit(void **state)
{
	struct kn_tok *t = open_tiny();
	int32_t ids[16];
	size_t n;

	(void)state;
	/* h e l l o: "h e" (rank 0) and "l l" (rank 1) merge before "l o"
	 * (rank 5) could take the second l; then he+ll, hell+o. */
	enc(t, "hello", 0, ids, 16, &n);
	assert_int_equal(n, 1);
	assert_int_equal(ids[0], id_of(t, "hello"));
	/* "llo": "l l" outranks "l o", so the o stays alone. */
	enc(t, "llo", 0, ids, 16, &n);
	assert_int_equal(n, 2);
	assert_int_equal(ids[0], id_of(t, "ll"));
	assert_int_equal(ids[1], id_of(t, "o"));
	/* the pre-tokenizer keeps the space with the word: " w" is one token */
	enc(t, "hello w", 0, ids, 16, &n);
	assert_int_equal(n, 2);
	assert_int_equal(ids[1], id_of(t, "\xC4\xA0w")); /* "Ġw" */
	kn_tok_close(t);
}

static void any_utf8_text_round_trips_through_byte_tokens(void **state)
{
	struct kn_tok *t = open_tiny();
	int32_t ids[64];
	size_t n;

	(void)state;
	/* Bytes the merges never touch come out one token per byte. */
	enc(t, "\x01\x7f\xCE\xA9\xE4\xB8\xAD", 0, ids, 64, &n);
	assert_int_equal(n, 7);
	roundtrip(t, "\x01\x7f \xCE\xA9\xE4\xB8\xAD\t\r\n  \xF0\x9F\x98\x80 x",
		  "\x01\x7f \xCE\xA9\xE4\xB8\xAD\t\r\n  \xF0\x9F\x98\x80 x");
	roundtrip(t, "", "");
	kn_tok_close(t);
}

static void invalid_utf8_input_is_refused(void **state)
{
	struct kn_tok *t = open_tiny();
	int32_t *ids = (int32_t *)1;
	size_t n = 7;

	(void)state;
	assert_int_equal(kn_tok_encode(t, "a\xC3(", 3, 0, &ids, &n), -EILSEQ);
	assert_null(ids);
	assert_int_equal(n, 0);
	kn_tok_close(t);
}

static void decoding_broken_bytes_gives_replacement_characters(void **state)
{
	struct kn_tok *t = open_tiny();
	int32_t ids[3];
	char *out;
	size_t len;

	(void)state;
	/* a lone lead byte of a 4-byte sequence, then 'a' */
	ids[0] = id_of(t, "\xC3\xB0"); /* "ð" spells byte 0xF0 */
	ids[1] = id_of(t, "a");
	assert_int_equal(kn_tok_decode(t, ids, 2, 0, &out, &len), 0);
	assert_string_equal(out, "\xEF\xBF\xBD" "a");
	free(out);
	ids[0] = kn_tok_vocab_size(t);
	assert_int_equal(kn_tok_decode(t, ids, 1, 0, &out, &len), -ERANGE);
	kn_tok_close(t);
}

static void added_tokens_match_longest_first_and_specials_only_when_asked(void **state)
{
	struct kn_tok *t = open_tiny();
	int32_t ids[32];
	size_t n;

	(void)state;
	enc(t, "<|im_start|>hello", KN_TOK_SPECIAL, ids, 32, &n);
	assert_int_equal(n, 2);
	assert_int_equal(ids[0], id_of(t, "<|im_start|>"));
	assert_int_equal(ids[1], id_of(t, "hello"));
	assert_true(kn_tok_is_special(t, ids[0]));
	/* Without KN_TOK_SPECIAL the special token is text; the non-special
	 * "<|im" still matches (longest allowed added token). */
	enc(t, "<|im_start|>", 0, ids, 32, &n);
	assert_int_equal(ids[0], id_of(t, "<|im"));
	assert_true(n > 2);
	for (size_t i = 0; i < n; i++)
		assert_int_not_equal(ids[i], id_of(t, "<|im_start|>"));
	/* Non-special added tokens match in any mode. */
	enc(t, "a<think>b", 0, ids, 32, &n);
	assert_int_equal(n, 3);
	assert_int_equal(ids[1], id_of(t, "<think>"));
	roundtrip(t, "x<|im_start|>y<|im_end|><|im", "x<|im_start|>y<|im_end|><|im");
	kn_tok_close(t);
}

static void skip_special_drops_special_tokens_only(void **state)
{
	struct kn_tok *t = open_tiny();
	int32_t *ids;
	size_t n, len;
	char *out;
	const char *s = "<|im_start|>hi<think><|im_end|>";

	(void)state;
	assert_int_equal(kn_tok_encode(t, s, strlen(s), KN_TOK_SPECIAL, &ids, &n), 0);
	assert_int_equal(kn_tok_decode(t, ids, n, KN_TOK_SKIP_SPECIAL, &out, &len), 0);
	assert_string_equal(out, "hi<think>");
	free(out);
	free(ids);
	kn_tok_close(t);
}

static void nfc_makes_decomposed_and_composed_text_encode_alike(void **state)
{
	struct kn_tok *t = open_tiny();
	int32_t a[16], b[16];
	size_t na, nb;

	(void)state;
	enc(t, "caf\x65\xCC\x81", 0, a, 16, &na); /* e + U+0301 */
	enc(t, "caf\xC3\xA9", 0, b, 16, &nb);     /* U+00E9 */
	assert_int_equal(na, nb);
	assert_memory_equal(a, b, na * sizeof(*a));
	roundtrip(t, "caf\x65\xCC\x81", "caf\xC3\xA9");
	kn_tok_close(t);
}

static void streaming_never_emits_half_an_emoji(void **state)
{
	struct kn_tok *t = open_tiny();
	struct kn_tok_stream *st = kn_tok_stream_new(t, 0);
	const char *s = "a\xF0\x9F\x98\x80" "b";
	int32_t *ids;
	size_t n;
	char buf[64];
	char acc[64];
	size_t acc_n = 0;

	(void)state;
	assert_non_null(st);
	assert_int_equal(kn_tok_encode(t, s, strlen(s), 0, &ids, &n), 0);
	/* the emoji is two tokens, F0 9F and 98 80 */
	assert_int_equal(n, 4);
	assert_int_equal(ids[1], id_of(t, "\xC3\xB0\xC5\x81"));
	for (size_t i = 0; i < n; i++) {
		ssize_t k = kn_tok_stream_push(st, ids[i], buf, sizeof(buf));

		assert_true(k >= 0);
		if (i == 1)
			assert_int_equal(k, 0); /* half an emoji: held back */
		if (i == 2) {
			assert_int_equal(k, 4);
			assert_memory_equal(buf, "\xF0\x9F\x98\x80", 4);
		}
		memcpy(acc + acc_n, buf, (size_t)k);
		acc_n += (size_t)k;
	}
	assert_int_equal(kn_tok_stream_flush(st, buf, sizeof(buf)), 0);
	assert_int_equal(acc_n, strlen(s));
	assert_memory_equal(acc, s, acc_n);

	/* byte by byte: nothing until the fourth byte */
	{
		static const char *const bytes[] = { "\xC3\xB0", "\xC5\x81", "\xC4\xBA", "\xC4\xA2" };

		for (int i = 0; i < 4; i++) {
			ssize_t k = kn_tok_stream_push(st, id_of(t, bytes[i]), buf, sizeof(buf));

			assert_int_equal(k, i < 3 ? 0 : 4);
		}
		assert_memory_equal(buf, "\xF0\x9F\x98\x80", 4);
	}
	/* a character cut off by the end of the stream becomes U+FFFD at flush */
	assert_int_equal(kn_tok_stream_push(st, ids[1], buf, sizeof(buf)), 0);
	assert_int_equal(kn_tok_stream_flush(st, buf, sizeof(buf)), 3);
	assert_memory_equal(buf, "\xEF\xBF\xBD", 3);
	/* a buffer too small consumes nothing */
	assert_int_equal(kn_tok_stream_push(st, id_of(t, "hello"), buf, 2), -ENOBUFS);
	assert_int_equal(kn_tok_stream_push(st, id_of(t, "hello"), buf, 5), 5);
	free(ids);
	kn_tok_stream_free(st);
	kn_tok_close(t);
}

static void chatml_renders_default_system_and_generation_prompt(void **state)
{
	struct kn_tok *t = open_tiny();
	struct kn_chat_msg m[] = { { .role = "user", .content = "hi" }, { .role = "assistant", .content = "hello" },
				   { .role = "user", .content = "bye" } };
	struct kn_chat_msg sys[] = { { .role = "system", .content = "Be brief." }, { .role = "user", .content = "hi" } };
	char *out;
	int32_t eos[4];

	(void)state;
	assert_int_equal(kn_tok_chat_family(t), KN_CHAT_CHATML);
	assert_int_equal(kn_tok_apply_chat(t, m, 3, 1, &out), 0);
	assert_string_equal(out, "<|im_start|>system\nYou are a tiny test model.<|im_end|>\n"
			    "<|im_start|>user\nhi<|im_end|>\n"
			    "<|im_start|>assistant\nhello<|im_end|>\n"
			    "<|im_start|>user\nbye<|im_end|>\n"
			    "<|im_start|>assistant\n");
	free(out);
	assert_int_equal(kn_tok_apply_chat(t, sys, 2, 0, &out), 0);
	assert_string_equal(out, "<|im_start|>system\nBe brief.<|im_end|>\n"
			    "<|im_start|>user\nhi<|im_end|>\n");
	free(out);
	assert_int_equal(kn_tok_eos_ids(t, eos, 4), 1);
	assert_int_equal(eos[0], id_of(t, "<|im_end|>"));
	kn_tok_close(t);
}

static void llama3_renders_bos_headers_and_trimmed_content(void **state)
{
	char err[256];
	struct kn_tok *t = kn_tok_open_file(data("tok_tiny/tokenizer.json"),
					    data("tok_tiny_llama3_config.json"), err, sizeof(err));
	struct kn_chat_msg m[] = { { .role = "system", .content = " Be brief.\n" }, { .role = "user", .content = "hi" } };
	char *out;
	int32_t *ids;
	size_t n;

	(void)state;
	assert_non_null(t);
	assert_int_equal(kn_tok_chat_family(t), KN_CHAT_LLAMA3);
	assert_int_equal(kn_tok_apply_chat(t, m, 2, 1, &out), 0);
	assert_string_equal(out, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
			    "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi"
			    "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
	assert_int_equal(kn_tok_encode(t, out, strlen(out), KN_TOK_SPECIAL, &ids, &n), 0);
	assert_int_equal(ids[0], kn_tok_bos_id(t));
	assert_int_equal(ids[0], id_of(t, "<|begin_of_text|>"));
	free(ids);
	/* KN_TOK_ADD_BOS prepends it to plain text */
	assert_int_equal(kn_tok_encode(t, "hello", 5, KN_TOK_ADD_BOS, &ids, &n), 0);
	assert_int_equal(n, 2);
	assert_int_equal(ids[1], id_of(t, "hello"));
	assert_int_equal(ids[0], kn_tok_bos_id(t));
	free(ids);
	free(out);
	kn_tok_close(t);
}

static void an_unknown_chat_template_is_refused_by_name(void **state)
{
	char err[256];
	struct kn_tok *t = kn_tok_open_file(data("tok_tiny/tokenizer.json"),
					    data("tok_unknown_template_config.json"), err, sizeof(err));
	struct kn_chat_msg m[] = { { .role = "user", .content = "hi" } };
	char *out = (char *)1;

	(void)state;
	assert_non_null(t);
	assert_int_equal(kn_tok_apply_chat(t, m, 1, 1, &out), -ENOTSUP);
	assert_null(out);
	assert_int_equal(kn_tok_chat_family(t), KN_CHAT_UNKNOWN);
	assert_non_null(strstr(kn_tok_chat_error(t), "unknown family"));
	assert_non_null(strstr(kn_tok_chat_error(t), "<|im_start|>"));
	/* the message names the file and shows the template's start */
	assert_non_null(strstr(kn_tok_chat_error(t), "tok_unknown_template_config.json"));
	assert_non_null(strstr(kn_tok_chat_error(t), "[INST]"));
	kn_tok_close(t);
	/* no config at all: no chat either */
	t = kn_tok_open_file(data("tok_tiny/tokenizer.json"), NULL, err, sizeof(err));
	assert_non_null(t);
	assert_int_equal(kn_tok_apply_chat(t, m, 1, 1, &out), -ENOTSUP);
	kn_tok_close(t);
}

/* An operator's template (ctrld's --chat-template) replaces the model's:
 * the family, the default system prompt and the end-of-turn id follow the
 * new one; a file that cannot be read changes nothing. */
static void a_chat_template_file_replaces_the_models_template(void **state)
{
	char err[512];
	struct kn_tok *t = kn_tok_open_file(data("tok_tiny/tokenizer.json"),
					    data("tok_tiny_llama3_config.json"), err, sizeof(err));
	struct kn_chat_msg m[] = { { .role = "user", .content = "hi" } };
	int32_t eos[4];
	char *out;

	(void)state;
	assert_non_null(t);
	assert_int_equal(kn_tok_chat_family(t), KN_CHAT_LLAMA3);
	assert_int_equal(kn_tok_eos_ids(t, eos, 4), 1);
	assert_int_equal(eos[0], id_of(t, "<|eot_id|>"));

	/* a Jinja file */
	assert_int_equal(kn_tok_load_chat_template(t, data("chat/chatml_text.jinja"), err, sizeof(err)), 0);
	assert_int_equal(kn_tok_chat_family(t), KN_CHAT_CHATML);
	assert_int_equal(kn_tok_eos_ids(t, eos, 4), 2);
	assert_int_equal(eos[1], id_of(t, "<|im_end|>"));
	assert_int_equal(kn_tok_apply_chat(t, m, 1, 1, &out), 0);
	assert_string_equal(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
	free(out);

	/* a tokenizer_config.json: its chat_template, default system prompt included */
	assert_int_equal(kn_tok_load_chat_template(t, data("tok_tiny/tokenizer_config.json"), err,
						   sizeof(err)), 0);
	assert_int_equal(kn_tok_apply_chat(t, m, 1, 0, &out), 0);
	assert_string_equal(out, "<|im_start|>system\nYou are a tiny test model.<|im_end|>\n"
			    "<|im_start|>user\nhi<|im_end|>\n");
	free(out);

	/* a file that is not there: named, and the template in use stays */
	assert_int_equal(kn_tok_load_chat_template(t, data("no-such.jinja"), err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "no-such.jinja"));
	assert_int_equal(kn_tok_chat_family(t), KN_CHAT_CHATML);
	/* JSON without a chat_template is refused */
	assert_int_equal(kn_tok_load_chat_template(t, data("tok_tiny/tokenizer.json"), err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "chat_template"));

	/* a template of an unknown family loads, and is reported by its file */
	assert_int_equal(kn_tok_load_chat_template(t, data("tok_unknown_template_config.json"), err,
						   sizeof(err)), 0);
	assert_int_equal(kn_tok_chat_family(t), KN_CHAT_UNKNOWN);
	assert_int_equal(kn_tok_apply_chat(t, m, 1, 1, &out), -ENOTSUP);
	assert_non_null(strstr(kn_tok_chat_error(t), "tok_unknown_template_config.json"));
	assert_int_equal(kn_tok_eos_ids(t, eos, 4), 1);

	/* none: chat refused, as for a model without a template */
	assert_int_equal(kn_tok_set_chat_template(t, NULL, "--chat-template none"), 0);
	assert_int_equal(kn_tok_chat_family(t), KN_CHAT_NONE);
	assert_int_equal(kn_tok_apply_chat(t, m, 1, 1, &out), -ENOTSUP);
	assert_non_null(strstr(kn_tok_chat_error(t), "--chat-template none"));
	kn_tok_close(t);
}

/* A chat_template.jinja beside tokenizer_config.json wins over the
 * config's chat_template, as transformers reads them. */
static void a_chat_template_jinja_file_in_the_model_directory_wins(void **state)
{
	char dir[] = "/tmp/kvf-tok-jinja-XXXXXX";
	char cmd[4096], err[512];
	struct kn_tok *t;

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(cmd, sizeof(cmd), "cp %s %s/tokenizer.json && cp %s %s/tokenizer_config.json",
		 data("tok_tiny/tokenizer.json"), dir, data("tok_tiny_llama3_config.json"), dir);
	assert_int_equal(system(cmd), 0);
	t = kn_tok_open(dir, err, sizeof(err));
	assert_non_null(t);
	assert_int_equal(kn_tok_chat_family(t), KN_CHAT_LLAMA3);
	kn_tok_close(t);
	snprintf(cmd, sizeof(cmd), "cp %s %s/chat_template.jinja", data("chat/chatml.jinja"), dir);
	assert_int_equal(system(cmd), 0);
	t = kn_tok_open(dir, err, sizeof(err));
	assert_non_null(t);
	assert_int_equal(kn_tok_chat_family(t), KN_CHAT_CHATML);
	kn_tok_close(t);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
}

/* The template's own rules, where they differ from writing every message as
 * it comes (the reference comparison, chat_reference.py, covers the rest). */
static void roles_follow_what_the_template_does_with_them(void **state)
{
	char err[512];
	struct kn_tok *t = open_tiny();
	struct kn_chat_msg dev[] = { { .role = "developer", .content = "x" }, { .role = "user", .content = "hi" } };
	struct kn_chat_msg tool[] = { { .role = "user", .content = "hi" }, { .role = "tool", .content = "a \"b\"\n" } };
	char *out;

	(void)state;
	/* plain ChatML writes any role */
	assert_int_equal(kn_tok_apply_chat(t, dev, 2, 0, &out), 0);
	assert_non_null(strstr(out, "<|im_start|>developer\nx<|im_end|>\n"));
	free(out);
	/* Qwen 2.5 would drop it: refused instead */
	assert_int_equal(kn_tok_load_chat_template(t, data("chat/qwen25.jinja"), err, sizeof(err)), 0);
	assert_int_equal(kn_tok_apply_chat(t, dev, 2, 0, &out), -EINVAL);
	assert_int_equal(kn_tok_apply_chat(t, tool, 2, 0, &out), 0);
	assert_non_null(strstr(out, "<|im_start|>user\n<tool_response>\na \"b\"\n\n</tool_response><|im_end|>\n"));
	free(out);
	/* Llama 3.1 writes a tool result as a JSON string in an ipython turn */
	assert_int_equal(kn_tok_load_chat_template(t, data("chat/llama31.jinja"), err, sizeof(err)), 0);
	assert_int_equal(kn_tok_apply_chat(t, tool, 2, 0, &out), 0);
	assert_non_null(strstr(out, "<|start_header_id|>ipython<|end_header_id|>\n\n\"a \\\"b\\\"\\n\"<|eot_id|>"));
	free(out);
	kn_tok_close(t);
}

static void bad_tokenizer_files_fail_with_a_message_naming_the_problem(void **state)
{
	char err[512];

	(void)state;
	assert_null(kn_tok_open(data("no-such-model"), err, sizeof(err)));
	assert_int_equal(errno, ENOENT);
	assert_non_null(strstr(err, "no-such-model/tokenizer.json"));

	assert_null(kn_tok_open_file(data("tok_malformed.json"), NULL, err, sizeof(err)));
	assert_int_equal(errno, EINVAL);
	assert_non_null(strstr(err, "tok_malformed.json"));
	assert_non_null(strstr(err, "line"));

	assert_null(kn_tok_open_file(data("tok_unigram.json"), NULL, err, sizeof(err)));
	assert_int_equal(errno, EINVAL);
	assert_non_null(strstr(err, "Unigram"));

	assert_null(kn_tok_open_file(data("tok_tiny/tokenizer.json"), data("tok_malformed.json"),
				     err, sizeof(err)));
	assert_int_equal(errno, EINVAL);
}

/* Found by tests/fuzz/fuzz_tok_load.c: the rewrite of integers too big for
 * jansson read one byte past the file when it ended in a string's
 * backslash (the sanitizer pass of scripts/test catches a read past the end). */
static void a_file_cut_after_a_backslash_past_a_big_integer_is_refused_not_overread(void **state)
{
	static const char text[] = "{\"a\": 12345678901234567890123, \"b\": \"\\";
	char path[] = "/tmp/kvf-tok-XXXXXX", err[512];
	int fd = mkstemp(path);

	(void)state;
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, sizeof(text) - 1), (ssize_t)sizeof(text) - 1);
	close(fd);
	assert_null(kn_tok_open_file(path, NULL, err, sizeof(err)));
	assert_int_equal(errno, EINVAL);
	assert_non_null(strstr(err, "not valid JSON"));
	assert_null(kn_tok_open_buf(text, sizeof(text) - 1, NULL, 0, err, sizeof(err)));
	assert_int_equal(errno, EINVAL);
	unlink(path);
}

/* Read a whole file into memory (malloc'd; *n its size). */
static char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	char *b;
	long sz;

	assert_non_null(f);
	assert_int_equal(fseek(f, 0, SEEK_END), 0);
	sz = ftell(f);
	assert_true(sz > 0);
	rewind(f);
	b = malloc((size_t)sz);
	assert_non_null(b);
	assert_int_equal(fread(b, 1, (size_t)sz, f), (size_t)sz);
	fclose(f);
	*n = (size_t)sz;
	return b;
}

/* Found by tests/fuzz/fuzz_tok_load.c: one added token with an id near 1e9
 * made the loader allocate tables of a billion entries. Such a file is
 * refused with a message naming the id and the token count; an id just past
 * the vocabulary still loads. */
static void an_added_token_id_far_past_the_vocabulary_is_refused_naming_it(void **state)
{
	static const char anchor[] = "\"added_tokens\": [";
	size_t jn;
	char *json = slurp(data("tok_tiny/tokenizer.json"), &jn), err[512];
	const char *at = strstr(json, anchor);

	(void)state;
	assert_non_null(at);
	for (int sparse = 0; sparse < 2; sparse++) {
		const size_t head = (size_t)(at - json) + strlen(anchor);
		char *text = malloc(jn + 256);
		assert_non_null(text);
		const int n = snprintf(text, 256 + head, "%.*s{\"id\": %d, \"content\": \"<|far|>\", \"single_word\": false, "
				       "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}, ",
				       (int)head, json, sparse ? 934560235 : 300);
		memcpy(text + n, json + head, jn - head);
		struct kn_tok *t = kn_tok_open_buf(text, (size_t)n + jn - head, NULL, 0, err, sizeof(err));
		if (sparse) {
			assert_null(t);
			assert_int_equal(errno, EINVAL);
			assert_non_null(strstr(err, "token id 934560235"));
			assert_non_null(strstr(err, "dense"));
		} else {
			assert_non_null(t);
			assert_true(kn_tok_vocab_size(t) >= 301);
			kn_tok_close(t);
		}
		free(text);
	}
	free(json);
}

static void a_tokenizer_read_from_memory_is_the_one_read_from_its_files(void **state)
{
	size_t jn, cn, na, nb;
	char *json = slurp(data("tok_tiny/tokenizer.json"), &jn), *cfg = slurp(data("tok_tiny_llama3_config.json"), &cn);
	char err[512], *a, *b;
	struct kn_tok *f = kn_tok_open_file(data("tok_tiny/tokenizer.json"), data("tok_tiny_llama3_config.json"), err,
					    sizeof(err));
	struct kn_tok *m = kn_tok_open_buf(json, jn, cfg, cn, err, sizeof(err));
	struct kn_chat_msg msg[] = { { .role = "user", .content = "hi there" } };
	int32_t *ia, *ib;

	(void)state;
	assert_non_null(f);
	assert_non_null(m);
	assert_int_equal(kn_tok_vocab_size(m), kn_tok_vocab_size(f));
	assert_int_equal(kn_tok_bos_id(m), kn_tok_bos_id(f));
	assert_int_equal(kn_tok_chat_family(m), KN_CHAT_LLAMA3);
	assert_int_equal(kn_tok_apply_chat(f, msg, 1, 1, &a), 0);
	assert_int_equal(kn_tok_apply_chat(m, msg, 1, 1, &b), 0);
	assert_string_equal(a, b);
	assert_int_equal(kn_tok_encode(f, a, strlen(a), KN_TOK_SPECIAL, &ia, &na), 0);
	assert_int_equal(kn_tok_encode(m, b, strlen(b), KN_TOK_SPECIAL, &ib, &nb), 0);
	assert_int_equal(na, nb);
	assert_memory_equal(ia, ib, na * sizeof(*ia));
	/* without a config there is no template, and a bad text names the buffer */
	kn_tok_close(m);
	m = kn_tok_open_buf(json, jn, NULL, 0, err, sizeof(err));
	assert_non_null(m);
	assert_int_equal(kn_tok_chat_family(m), KN_CHAT_NONE);
	assert_null(kn_tok_open_buf(json, jn / 2, NULL, 0, err, sizeof(err)));
	assert_int_equal(errno, EINVAL);
	assert_non_null(strstr(err, "tokenizer.json"));
	free(a);
	free(b);
	free(ia);
	free(ib);
	kn_tok_close(m);
	kn_tok_close(f);
	free(json);
	free(cfg);
}

/* Found by tests/fuzz/fuzz_tok_load.c: an empty spelling first in the vocab
 * left the string pool NULL and an offset was added to it (undefined). */
static void a_vocab_holding_an_empty_token_loads_and_decodes_it_to_nothing(void **state)
{
	static const char json[] = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\": 0, \"a\": 1}, \"merges\": []}}";
	int32_t ids[] = { 0, 1, 0 };
	char err[512], *out;
	size_t len;
	struct kn_tok *t = kn_tok_open_buf(json, sizeof(json) - 1, NULL, 0, err, sizeof(err));

	(void)state;
	assert_non_null(t);
	assert_int_equal(kn_tok_decode(t, ids, 3, 0, &out, &len), 0);
	assert_string_equal(out, "a");
	free(out);
	kn_tok_close(t);
}

struct thr {
	const struct kn_tok *t;
	const char *s;
	int32_t *want;
	size_t n_want;
	int ok;
};

static void *encode_many(void *arg)
{
	struct thr *a = arg;

	a->ok = 1;
	for (int i = 0; i < 200; i++) {
		int32_t *ids;
		size_t n;

		if (kn_tok_encode(a->t, a->s, strlen(a->s), KN_TOK_SPECIAL, &ids, &n) ||
		    n != a->n_want || memcmp(ids, a->want, n * sizeof(*ids)) != 0)
			a->ok = 0;
		free(ids);
	}
	return NULL;
}

static void threads_encoding_at_once_get_the_same_ids(void **state)
{
	struct kn_tok *t = open_tiny();
	const char *s = "hello hello w <|im_start|> caf\xC3\xA9 \xF0\x9F\x98\x80 llo 123  \n";
	struct thr a[4];
	pthread_t th[4];
	int32_t *want;
	size_t n;

	(void)state;
	assert_int_equal(kn_tok_encode(t, s, strlen(s), KN_TOK_SPECIAL, &want, &n), 0);
	for (int i = 0; i < 4; i++) {
		a[i] = (struct thr){ t, s, want, n, 0 };
		assert_int_equal(pthread_create(&th[i], NULL, encode_many, &a[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		assert_true(a[i].ok);
	}
	free(want);
	kn_tok_close(t);
}

/* kvferry-mkmodel writes its own small byte-level tokenizer.json; the
 * tokenizer must load it and round-trip text through it. KVF_MKMODEL names
 * the binary (set by meson); without it the test is skipped. */
static void the_generated_models_tokenizer_loads_and_round_trips(void **state)
{
	const char *mk = getenv("KVF_MKMODEL");
	char dir[] = "/tmp/kvf-tok-mkmodel-XXXXXX";
	char cmd[2048], err[512];
	struct kn_tok *t;
	struct kn_chat_msg m[] = { { .role = "user", .content = "hi" } };
	char *prompt;

	(void)state;
	if (!mk || !*mk)
		skip();
	assert_non_null(mkdtemp(dir));
	snprintf(cmd, sizeof(cmd), "%s --out %s/m --preset tiny --arch qwen3 >/dev/null 2>&1", mk, dir);
	assert_int_equal(system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "%s/m", dir);
	t = kn_tok_open(cmd, err, sizeof(err));
	if (!t)
		fail_msg("kn_tok_open(%s): %s", cmd, err);
	roundtrip(t, "Hello world, \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80\t 12345 <|im_start|>x",
		  "Hello world, \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80\t 12345 <|im_start|>x");
	assert_int_equal(kn_tok_apply_chat(t, m, 1, 1, &prompt), 0);
	free(prompt);
	kn_tok_close(t);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
}

int main(void)
{
	const char *d = getenv("TOK_DATA");
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(merges_apply_lowest_rank_first_wherever_they_sit),
		cmocka_unit_test(any_utf8_text_round_trips_through_byte_tokens),
		cmocka_unit_test(invalid_utf8_input_is_refused),
		cmocka_unit_test(decoding_broken_bytes_gives_replacement_characters),
		cmocka_unit_test(added_tokens_match_longest_first_and_specials_only_when_asked),
		cmocka_unit_test(skip_special_drops_special_tokens_only),
		cmocka_unit_test(nfc_makes_decomposed_and_composed_text_encode_alike),
		cmocka_unit_test(streaming_never_emits_half_an_emoji),
		cmocka_unit_test(chatml_renders_default_system_and_generation_prompt),
		cmocka_unit_test(llama3_renders_bos_headers_and_trimmed_content),
		cmocka_unit_test(an_unknown_chat_template_is_refused_by_name),
		cmocka_unit_test(a_chat_template_file_replaces_the_models_template),
		cmocka_unit_test(a_chat_template_jinja_file_in_the_model_directory_wins),
		cmocka_unit_test(roles_follow_what_the_template_does_with_them),
		cmocka_unit_test(bad_tokenizer_files_fail_with_a_message_naming_the_problem),
		cmocka_unit_test(a_file_cut_after_a_backslash_past_a_big_integer_is_refused_not_overread),
		cmocka_unit_test(an_added_token_id_far_past_the_vocabulary_is_refused_naming_it),
		cmocka_unit_test(a_tokenizer_read_from_memory_is_the_one_read_from_its_files),
		cmocka_unit_test(a_vocab_holding_an_empty_token_loads_and_decodes_it_to_nothing),
		cmocka_unit_test(threads_encoding_at_once_get_the_same_ids),
		cmocka_unit_test(the_generated_models_tokenizer_loads_and_round_trips),
	};

	snprintf(g_dir, sizeof(g_dir), "%s", d ? d : "tests/kernels/data");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
