/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: tokenizer.json and tokenizer_config.json as
 * kn_tok_open_buf() reads them (vocab, added tokens, merges, normalizer,
 * pre-tokenizer regexes, BOS/EOS, the chat template's family, integers too
 * big for jansson), then a tokenizer that opened used once: an encode with
 * special tokens, its decode and stream, a chat rendered.
 *
 * Input: tokenizer.json, then optionally a NUL byte and tokenizer_config.json
 * (neither file may hold a raw NUL, so the first one splits them).
 *
 * Beyond the sanitizers: a refusal sets errno and says why; an encode of an
 * opened tokenizer returns ids that decode.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kn_tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char g_text[] = "Hello, world!<|im_start|>user\n d\xc3\xa9j\xc3\xa0 vu 123 <think>\xf0\x9f\x98\x80"
			     "<|endoftext|> \r\n\t x";

static void use(const struct kn_tok *t)
{
	static const struct kn_chat_msg msgs[] = {
		{ .role = "system", .content = "Be brief." },
		{ .role = "user", .content = "Hi <|im_end|>" },
		{ .role = "assistant", .content = "Hello." },
		{ .role = "user", .content = "" },
	};
	int32_t *ids = NULL, eos[4];
	size_t n = 0, len;
	char *text = NULL, buf[64];
	struct kn_tok_stream *st;
	int rc;

	rc = kn_tok_encode(t, g_text, sizeof(g_text) - 1, KN_TOK_SPECIAL | KN_TOK_ADD_BOS, &ids, &n);
	if (rc == 0) {
		if (kn_tok_decode(t, ids, n, 0, &text, &len))
			abort();
		free(text);
		st = kn_tok_stream_new(t, KN_TOK_SKIP_SPECIAL);
		for (size_t i = 0; st && i < n; i++)
			(void)kn_tok_stream_push(st, ids[i], buf, sizeof(buf));
		(void)kn_tok_stream_flush(st, buf, sizeof(buf));
		kn_tok_stream_free(st);
	}
	free(ids);
	(void)kn_tok_eos_ids(t, eos, 4);
	(void)kn_tok_token_to_id(t, "<|im_end|>");
	text = NULL;
	if (kn_tok_apply_chat(t, msgs, 4, 1, &text) == 0 && !text)
		abort();
	free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *json = (const char *)data, *cfg = memchr(data, 0, size);
	size_t json_len = cfg ? (size_t)(cfg - json) : size;
	char err[512] = "";
	struct kn_tok *t;

	if (cfg)
		cfg++;
	errno = 0;
	t = kn_tok_open_buf(json, json_len, cfg, cfg ? size - json_len - 1 : 0, err, sizeof(err));
	if (!t) {
		if (!errno || !err[0])
			abort();
		return 0;
	}
	use(t);
	kn_tok_close(t);
	return 0;
}
