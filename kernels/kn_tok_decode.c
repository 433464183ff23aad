/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Decoding: ids back to text, whole (kn_tok_decode) or one id at a time
 * (kn_tok_stream_*). A token's bytes are its exact raw bytes (the byte map
 * is undone at open), so decoding is concatenation; the only work is UTF-8
 * repair: bytes that do not form UTF-8 become U+FFFD, one per maximal invalid
 * subpart, as Rust's from_utf8_lossy does. The stream holds
 * back at most 3 bytes of a character split across tokens until it completes.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kn_tok_int.h"

/* Length of the valid UTF-8 sequence at s (1..4), 0 if s[0..n) is a valid
 * but incomplete prefix, or -k when the first k bytes are a maximal invalid
 * subpart (to be replaced by one U+FFFD, as Unicode and Rust recommend). */
static int utf8_step(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	int need;
	unsigned char lo = 0x80, hi = 0xBF;

	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF) {
		need = 1;
	} else if (c >= 0xE0 && c <= 0xEF) {
		need = 2;
		if (c == 0xE0)
			lo = 0xA0;
		else if (c == 0xED)
			hi = 0x9F;
	} else if (c >= 0xF0 && c <= 0xF4) {
		need = 3;
		if (c == 0xF0)
			lo = 0x90;
		else if (c == 0xF4)
			hi = 0x8F;
	} else {
		return -1;
	}
	for (int k = 1; k <= need; k++) {
		if ((size_t)k >= n)
			return 0;
		if (s[k] < lo || s[k] > hi)
			return -k;
		lo = 0x80;
		hi = 0xBF;
	}
	return need + 1;
}

/* Copy in[0..n) to out replacing invalid bytes by U+FFFD. When !final an
 * incomplete character at the end is left out; *used says how much of in was
 * consumed. out needs 3 * n bytes. Returns bytes written. */
static size_t utf8_clean(const char *in, size_t n, int final, char *out, size_t *used)
{
	const unsigned char *s = (const unsigned char *)in;
	size_t i = 0, k = 0;

	while (i < n) {
		int r = utf8_step(s + i, n - i);

		if (r > 0) {
			memcpy(out + k, s + i, (size_t)r);
			k += (size_t)r;
			i += (size_t)r;
			continue;
		}
		if (r == 0 && !final)
			break;
		memcpy(out + k, "\xEF\xBF\xBD", 3);
		k += 3;
		i += r == 0 ? n - i : (size_t)-r;
	}
	*used = i;
	return k;
}

const char *kn_tok_token_bytes(const struct kn_tok *t, int32_t id, size_t *len)
{
	if (!t || id < 0 || id >= t->n_ids || !t->present[id])
		return NULL;
	if (len)
		*len = t->bytes_len[id];
	return t->pool + t->bytes_off[id];
}

int kn_tok_decode(const struct kn_tok *t, const int32_t *ids, size_t n,
		  unsigned flags, char **out, size_t *len)
{
	struct kn_tok_buf raw = { 0 };
	char *res;
	size_t used, k;

	if (!t || (!ids && n) || !out)
		return -EINVAL;
	*out = NULL;
	if (kn_tok_buf_add(&raw, "", 0))
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];

		if (id < 0 || id >= t->n_ids || !t->present[id]) {
			free(raw.p);
			return -ERANGE;
		}
		if ((flags & KN_TOK_SKIP_SPECIAL) && t->special[id])
			continue;
		if (kn_tok_buf_add(&raw, t->pool + t->bytes_off[id], t->bytes_len[id])) {
			free(raw.p);
			return -ENOMEM;
		}
	}
	res = malloc(raw.n * 3 + 1);
	if (!res) {
		free(raw.p);
		return -ENOMEM;
	}
	k = utf8_clean(raw.p, raw.n, 1, res, &used);
	res[k] = '\0';
	free(raw.p);
	*out = res;
	if (len)
		*len = k;
	return 0;
}

/* ---- streaming --------------------------------------------------------- */

struct kn_tok_stream {
	const struct kn_tok *t;
	unsigned flags;
	char held[4];
	size_t n_held;
	struct kn_tok_buf work;
};

struct kn_tok_stream *kn_tok_stream_new(const struct kn_tok *t, unsigned flags)
{
	struct kn_tok_stream *st;

	if (!t) {
		errno = EINVAL;
		return NULL;
	}
	st = calloc(1, sizeof(*st));
	if (!st) {
		errno = ENOMEM;
		return NULL;
	}
	st->t = t;
	st->flags = flags;
	return st;
}

ssize_t kn_tok_stream_push(struct kn_tok_stream *st, int32_t id, char *buf, size_t cap)
{
	const struct kn_tok *t;
	size_t bl, used, k, worst;
	char *tmp;

	if (!st || (!buf && cap))
		return -EINVAL;
	t = st->t;
	if (id < 0 || id >= t->n_ids || !t->present[id])
		return -ERANGE;
	if ((st->flags & KN_TOK_SKIP_SPECIAL) && t->special[id])
		return 0;
	bl = t->bytes_len[id];
	/* Output never exceeds the input, except that each invalid byte may
	 * grow to a 3-byte U+FFFD. */
	st->work.n = 0;
	if (kn_tok_buf_add(&st->work, st->held, st->n_held) ||
	    kn_tok_buf_add(&st->work, t->pool + t->bytes_off[id], bl))
		return -ENOMEM;
	worst = st->work.n * 3;
	tmp = malloc(worst + 1);
	if (!tmp)
		return -ENOMEM;
	k = utf8_clean(st->work.p, st->work.n, 0, tmp, &used);
	if (k > cap) {
		free(tmp);
		return -ENOBUFS;
	}
	memcpy(buf, tmp, k);
	free(tmp);
	st->n_held = st->work.n - used;
	memcpy(st->held, st->work.p + used, st->n_held);
	return (ssize_t)k;
}

ssize_t kn_tok_stream_flush(struct kn_tok_stream *st, char *buf, size_t cap)
{
	if (!st || (!buf && cap))
		return -EINVAL;
	if (st->n_held == 0)
		return 0;
	if (cap < 3)
		return -ENOBUFS;
	memcpy(buf, "\xEF\xBF\xBD", 3);
	st->n_held = 0;
	return 3;
}

void kn_tok_stream_free(struct kn_tok_stream *st)
{
	if (!st)
		return;
	free(st->work.p);
	free(st);
}
