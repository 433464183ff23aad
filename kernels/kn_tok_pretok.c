/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Steps 2 and 3 of encoding: the normalizer and the pre-tokenizer, read from
 * tokenizer.json at open (kn_tok_load_normalizer, kn_tok_add_pretok) and
 * applied to each segment between added tokens (kn_tok_pretokenize): the
 * segment is NFC-normalised when the file says so, then each pre-tokenizer
 * regex in file order cuts every piece the previous one left. Pieces are
 * (offset, length) pairs into the normalised segment, never copies; each is
 * a pre-token that the BPE step (kn_tok_encode.c) merges on its own.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <uninorm.h>

#include "kn_err.h"
#include "kn_tok_int.h"

/* ---- reading the file -------------------------------------------------- */

static int compile_re(const char *pat, size_t n, uint32_t extra, pcre2_code **re,
		      char *err, size_t errlen)
{
	int ec;
	PCRE2_SIZE eo;

	*re = pcre2_compile((PCRE2_SPTR)pat, n, PCRE2_UTF | PCRE2_UCP | extra, &ec, &eo, NULL);
	if (!*re) {
		PCRE2_UCHAR msg[160];

		pcre2_get_error_message(ec, msg, sizeof(msg));
		kn_seterr(err, errlen, "pcre2_compile(\"%.*s\") failed at offset %zu: %s; "
		       "the pre-tokenizer regex uses syntax PCRE2 does not accept",
		       (int)n, pat, (size_t)eo, (char *)msg);
		return -EINVAL;
	}
	/* JIT is an optimisation: without it (e.g. no executable memory) the
	 * interpreter gives the same matches. */
	(void)pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE);
	return 0;
}

/* The regex ByteLevel uses when use_regex is true (GPT-2's split pattern). */
static const char gpt2_re[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

int kn_tok_add_pretok(struct kn_tok *t, const json_t *pt, int first, char *err, size_t errlen)
{
	const char *type = json_string_value(json_object_get(pt, "type"));
	struct kn_tok_pretok *p;

	if (!type) {
		kn_seterr(err, errlen, "tokenizer.json: a pre_tokenizer has no \"type\"");
		return -EINVAL;
	}
	if (strcmp(type, "Sequence") == 0) {
		const json_t *arr = json_object_get(pt, "pretokenizers");
		size_t i;
		json_t *v;
		int rc;

		json_array_foreach(arr, i, v) {
			rc = kn_tok_add_pretok(t, v, first && i == 0, err, errlen);
			if (rc)
				return rc;
		}
		return 0;
	}
	p = realloc(t->pretok, (t->n_pretok + 1) * sizeof(*p));
	if (!p)
		return -ENOMEM;
	t->pretok = p;
	p = &t->pretok[t->n_pretok];
	memset(p, 0, sizeof(*p));
	if (strcmp(type, "ByteLevel") == 0) {
		if (json_is_true(json_object_get(pt, "add_prefix_space"))) {
			if (!first) {
				kn_seterr(err, errlen, "tokenizer.json: ByteLevel with add_prefix_space "
				       "is supported only as the first pre-tokenizer");
				return -EINVAL;
			}
			t->add_prefix_space = 1;
		}
		/* use_regex defaults to true in tokenizers. */
		if (json_is_false(json_object_get(pt, "use_regex")))
			return 0;
		p->beh = KN_SPLIT_ISOLATED;
		if (compile_re(gpt2_re, PCRE2_ZERO_TERMINATED, 0, &p->re, err, errlen))
			return -EINVAL;
		t->n_pretok++;
		return 0;
	}
	if (strcmp(type, "Split") == 0) {
		const json_t *pat = json_object_get(pt, "pattern");
		const char *beh = json_string_value(json_object_get(pt, "behavior"));
		const json_t *re = json_object_get(pat, "Regex");
		const json_t *lit = json_object_get(pat, "String");
		static const char *const names[] = {
			"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous",
		};
		size_t k;

		for (k = 0; beh && k < 5; k++)
			if (strcmp(beh, names[k]) == 0)
				break;
		if (!beh || k == 5) {
			kn_seterr(err, errlen, "tokenizer.json: Split behavior \"%s\" is unknown; "
			       "expected Isolated, Removed, MergedWithPrevious, MergedWithNext "
			       "or Contiguous", beh ? beh : "(missing)");
			return -EINVAL;
		}
		p->beh = (enum kn_tok_split_beh)k;
		p->invert = json_is_true(json_object_get(pt, "invert"));
		if (json_is_string(re)) {
			if (compile_re(json_string_value(re), json_string_length(re), 0,
				       &p->re, err, errlen))
				return -EINVAL;
		} else if (json_is_string(lit)) {
			if (compile_re(json_string_value(lit), json_string_length(lit),
				       PCRE2_LITERAL, &p->re, err, errlen))
				return -EINVAL;
		} else {
			kn_seterr(err, errlen, "tokenizer.json: Split pattern is neither "
			       "{\"Regex\": ...} nor {\"String\": ...}");
			return -EINVAL;
		}
		t->n_pretok++;
		return 0;
	}
	kn_seterr(err, errlen, "tokenizer.json: pre_tokenizer type \"%s\" is not supported "
	       "(supported: Sequence, Split, ByteLevel)", type);
	return -EINVAL;
}

int kn_tok_load_normalizer(struct kn_tok *t, const json_t *n, char *err, size_t errlen)
{
	const char *type;

	if (!n || json_is_null(n))
		return 0;
	type = json_string_value(json_object_get(n, "type"));
	if (type && strcmp(type, "NFC") == 0) {
		t->nfc = 1;
		return 0;
	}
	if (type && strcmp(type, "Sequence") == 0) {
		const json_t *arr = json_object_get(n, "normalizers");
		size_t i;
		json_t *v;

		json_array_foreach(arr, i, v) {
			int rc = kn_tok_load_normalizer(t, v, err, errlen);

			if (rc)
				return rc;
		}
		return 0;
	}
	kn_seterr(err, errlen, "tokenizer.json: normalizer type \"%s\" is not supported "
	       "(supported: null, NFC)", type ? type : "(missing)");
	return -EINVAL;
}

/* ---- splitting --------------------------------------------------------- */

int kn_tok_pre_init(struct kn_tok_pre *c)
{
	memset(c, 0, sizeof(*c));
	c->md = pcre2_match_data_create(1, NULL);
	return c->md ? 0 : -ENOMEM;
}

void kn_tok_pre_free(struct kn_tok_pre *c)
{
	pcre2_match_data_free(c->md);
	free(c->seg.p);
	free(c->pieces);
	free(c->pieces2);
}

static int piece_add(uint32_t **v, size_t *n, size_t *cap, size_t off, size_t len)
{
	if (len == 0)
		return 0;
	if (*n + 1 > *cap) {
		size_t c = *cap ? *cap * 2 : 256;
		uint32_t *p = realloc(*v, c * 2 * sizeof(uint32_t));

		if (!p)
			return -ENOMEM;
		*v = p;
		*cap = c;
	}
	(*v)[2 * *n] = (uint32_t)off;
	(*v)[2 * *n + 1] = (uint32_t)len;
	(*n)++;
	return 0;
}

/* Merged/Contiguous: emit the pending piece (if one is pending) and start
 * the next one at @p off, @p len. @return 0 or -ENOMEM. */
static int pend_restart(struct kn_tok_pre *c, size_t *n2, size_t *pend_off, size_t *pend_len, int *pend_match,
			size_t off, size_t len, int match)
{
	if (*pend_match >= 0 && piece_add(&c->pieces2, n2, &c->pcap2, *pend_off, *pend_len))
		return -ENOMEM;
	*pend_off = off;
	*pend_len = len;
	*pend_match = match;
	return 0;
}

/* Split every piece by one Split rule, the way tokenizers' split() does:
 * matches and the gaps between them, roles swapped by invert, then joined
 * according to the behaviour. */
static int split_pieces(struct kn_tok_pre *c, const struct kn_tok_pretok *p)
{
	size_t n2 = 0;

	for (size_t k = 0; k < c->np; k++) {
		size_t base = c->pieces[2 * k], len = c->pieces[2 * k + 1];
		const char *s = c->seg.p + base;
		size_t pos = 0, last = 0;
		/* pending: a piece being built for Merged/Contiguous */
		size_t pend_off = 0, pend_len = 0;
		int pend_match = -1;

		for (;;) {
			size_t ms, me;
			int rc = pos <= len ? pcre2_match(p->re, (PCRE2_SPTR)s, len, pos,
							 PCRE2_NO_UTF_CHECK, c->md, NULL) : -1;

			if (rc == PCRE2_ERROR_NOMATCH || rc == -1) {
				ms = me = len;
			} else if (rc < 0) {
				return -EINVAL;
			} else {
				PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);

				ms = ov[0];
				me = ov[1];
				if (me == ms) {
					/* An empty match splits nothing; step one character. */
					pos = ms + 1;
					while (pos < len && ((unsigned char)s[pos] & 0xC0) == 0x80)
						pos++;
					if (pos <= len)
						continue;
					ms = me = len;
				}
			}
			/* Two parts: gap [last, ms) and match [ms, me). */
			for (int part = 0; part < 2; part++) {
				size_t a = part == 0 ? last : ms, b = part == 0 ? ms : me;
				int is_match = (part == 1) != p->invert;

				if (b <= a)
					continue;
				switch (p->beh) {
				case KN_SPLIT_ISOLATED:
					if (piece_add(&c->pieces2, &n2, &c->pcap2, base + a, b - a))
						return -ENOMEM;
					break;
				case KN_SPLIT_REMOVED:
					if (!is_match &&
					    piece_add(&c->pieces2, &n2, &c->pcap2, base + a, b - a))
						return -ENOMEM;
					break;
				case KN_SPLIT_MERGED_PREV:
					if (is_match && pend_match == 0) {
						pend_len += b - a;
						pend_match = 1;
						break;
					}
					if (pend_restart(c, &n2, &pend_off, &pend_len, &pend_match, base + a, b - a, is_match))
						return -ENOMEM;
					break;
				case KN_SPLIT_MERGED_NEXT:
					if (pend_match == 1) {
						pend_len += b - a;
						pend_match = is_match;
						if (!is_match) {
							if (piece_add(&c->pieces2, &n2, &c->pcap2,
								      pend_off, pend_len))
								return -ENOMEM;
							pend_match = -1;
						}
						break;
					}
					if (is_match) {
						pend_off = base + a;
						pend_len = b - a;
						pend_match = 1;
					} else if (piece_add(&c->pieces2, &n2, &c->pcap2, base + a, b - a)) {
						return -ENOMEM;
					}
					break;
				case KN_SPLIT_CONTIGUOUS:
					if (is_match && pend_match == 1) {
						pend_len += b - a;
						break;
					}
					if (pend_restart(c, &n2, &pend_off, &pend_len, &pend_match, base + a, b - a, is_match))
						return -ENOMEM;
					break;
				}
			}
			if (me >= len)
				break;
			last = pos = me;
		}
		if (pend_match >= 0 && piece_add(&c->pieces2, &n2, &c->pcap2, pend_off, pend_len))
			return -ENOMEM;
	}
	{
		uint32_t *tp = c->pieces;
		size_t tc = c->pcap;

		c->pieces = c->pieces2;
		c->pcap = c->pcap2;
		c->pieces2 = tp;
		c->pcap2 = tc;
		c->np = n2;
	}
	return 0;
}

int kn_tok_pretokenize(const struct kn_tok *t, struct kn_tok_pre *c, const char *s, size_t n)
{
	int ascii = 1;
	int rc;

	c->seg.n = 0;
	if (t->add_prefix_space && s[0] != ' ' && kn_tok_buf_add(&c->seg, " ", 1))
		return -ENOMEM;
	for (size_t i = 0; i < n && ascii; i++)
		ascii = (unsigned char)s[i] < 0x80;
	if (t->nfc && !ascii) {
		/* ASCII is its own NFC; only other text pays for normalisation. */
		size_t nl = 0;
		uint8_t *norm = u8_normalize(UNINORM_NFC, (const uint8_t *)s, n, NULL, &nl);

		if (!norm)
			return errno == ENOMEM ? -ENOMEM : -EILSEQ;
		rc = kn_tok_buf_add(&c->seg, norm, nl);
		free(norm);
	} else {
		rc = kn_tok_buf_add(&c->seg, s, n);
	}
	if (rc)
		return rc;
	c->np = 0;
	if (piece_add(&c->pieces, &c->np, &c->pcap, 0, c->seg.n))
		return -ENOMEM;
	for (size_t k = 0; k < t->n_pretok; k++) {
		rc = split_pieces(c, &t->pretok[k]);
		if (rc)
			return rc;
	}
	return 0;
}
