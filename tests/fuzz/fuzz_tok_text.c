/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: encode and decode with real tokenizers, models/ferry's
 * (byte-level BPE, no normalizer) and tests/kernels/data/tok_tiny's (NFC,
 * a Split regex, added tokens that overlap).
 *
 * Input: byte 0 picks the tokenizer (bit 0), the encode flags (bits 1-2:
 * KN_TOK_SPECIAL, KN_TOK_ADD_BOS) and the decode flags (bit 3:
 * KN_TOK_SKIP_SPECIAL); the rest is the text, and also, read as 16-bit
 * little-endian words, a sequence of ids.
 *
 * Beyond the sanitizers it checks what a client sees: every id encode
 * returns is in the vocabulary; with no normalizer, decode(encode(text)) is
 * the text; the streaming decoder (one id at a time, then flushed, into a
 * buffer of the size kn_tok.h promises is enough) writes exactly the text
 * kn_tok_decode() gives for the same ids, for the encoded text and for
 * arbitrary ids.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kn_tok.h"

static struct kn_tok *g_tok[2];
static int g_plain[2]; /* no normalizer: decode(encode(s)) == s */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	static const char *const dirs[2] = {"models/ferry", "tests/kernels/data/tok_tiny"};
	char path[4096], err[512];

	(void)argc;
	(void)argv;
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "%s/%s", KVF_SOURCE_ROOT, dirs[i]);
		g_tok[i] = kn_tok_open(path, err, sizeof(err));
		if (!g_tok[i]) {
			fprintf(stderr, "fuzz_tok_text: %s\n", err);
			exit(1);
		}
	}
	g_plain[0] = 1;
	return 0;
}

/* The stream's text for ids[0..n) equals kn_tok_decode()'s. */
static void stream_equals_decode(const struct kn_tok *t, const int32_t *ids, size_t n, unsigned flags)
{
	size_t cap = kn_tok_max_token_bytes(t) + 8, len = 0, want_len;
	struct kn_tok_stream *st = kn_tok_stream_new(t, flags);
	char *out = malloc(n * (cap + 8) + 16), *want;
	ssize_t w;

	if (!st || !out)
		abort();
	for (size_t i = 0; i < n; i++) {
		w = kn_tok_stream_push(st, ids[i], out + len, cap);
		if (w < 0)
			abort();
		len += (size_t)w;
	}
	w = kn_tok_stream_flush(st, out + len, 4);
	if (w < 0)
		abort();
	len += (size_t)w;
	if (kn_tok_decode(t, ids, n, flags, &want, &want_len))
		abort();
	if (want_len != len || memcmp(want, out, len))
		abort();
	free(want);
	free(out);
	kn_tok_stream_free(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct kn_tok *t;
	unsigned enc = 0, dec;
	const char *text;
	int32_t *ids = NULL, vocab;
	size_t n = 0, len, m;
	char *back = NULL;
	int rc, which;

	if (size < 1)
		return 0;
	which = data[0] & 1;
	t = g_tok[which];
	vocab = kn_tok_vocab_size(t);
	enc |= data[0] & 2 ? KN_TOK_SPECIAL : 0;
	enc |= data[0] & 4 ? KN_TOK_ADD_BOS : 0;
	dec = data[0] & 8 ? KN_TOK_SKIP_SPECIAL : 0;
	text = (const char *)data + 1;
	len = size - 1;

	rc = kn_tok_encode(t, text, len, enc, &ids, &n);
	if (rc && rc != -EILSEQ && rc != -EINVAL)
		abort();
	if (rc == 0) {
		for (size_t i = 0; i < n; i++)
			if (!kn_tok_token_bytes(t, ids[i], NULL))
				abort();
		if (kn_tok_decode(t, ids, n, 0, &back, &m))
			abort();
		/* the BOS, when added, is text of its own */
		if (g_plain[which] && kn_tok_bos_id(t) < 0 && (m != len || memcmp(back, text, len)))
			abort();
		free(back);
		stream_equals_decode(t, ids, n, dec);
	}
	free(ids);

	/* arbitrary ids: the bytes as 16-bit words, modulo the vocabulary;
	 * ids no token has (a gap in the vocabulary) are left out */
	ids = malloc((len / 2 + 1) * sizeof(*ids));
	if (!ids)
		return 0;
	m = 0;
	for (size_t i = 0; i + 1 < len; i += 2) {
		uint32_t w = (uint32_t)(uint8_t)text[i] | (uint32_t)(uint8_t)text[i + 1] << 8;

		ids[m] = (int32_t)(w % (uint32_t)vocab);
		if (kn_tok_token_bytes(t, ids[m], NULL))
			m++;
	}
	stream_equals_decode(t, ids, m, dec);
	free(ids);
	return 0;
}
