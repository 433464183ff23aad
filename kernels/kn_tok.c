/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Byte-level BPE tokenizer (tokenizer.json), loading, encoding and decoding.
 *
 * Pipeline of kn_tok_encode(), in the order Hugging Face tokenizers applies it:
 *   1. added tokens are cut out of the raw text, leftmost then longest first
 *      (special ones only with KN_TOK_SPECIAL);
 *   2. each remaining segment is normalised (NFC when the file says so);
 *   3. the pre-tokenizer regexes (PCRE2, UTF + UCP) split it into pre-tokens;
 *   4. each pre-token's bytes are BPE-merged, lowest merge rank first, ties to
 *      the leftmost pair.
 *
 * Invariants:
 *   - Everything is kept as raw bytes: the GPT-2 byte-to-character mapping is
 *     undone once at load, so a token's bytes_* entry is exactly what it
 *     decodes to and BPE runs on the UTF-8 of the text. Breaking this makes
 *     decode(encode(s)) != s.
 *   - The struct is never written after kn_tok_open(): the per-pre-token BPE
 *     cache lives in each encode call, so concurrent encodes need no lock.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <unistr.h>
#include <uninorm.h>

#include "kn_err.h"
#include "kn_tok_int.h"

#define EMPTY_KEY UINT64_MAX


int kn_tok_buf_add(struct kn_tok_buf *b, const void *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 64;
		char *p;

		while (cap < b->n + n + 1)
			cap *= 2;
		p = realloc(b->p, cap);
		if (!p)
			return -ENOMEM;
		b->p = p;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = '\0';
	return 0;
}

int kn_tok_buf_str(struct kn_tok_buf *b, const char *s)
{
	return kn_tok_buf_add(b, s, strlen(s));
}

/* ---- hashing ---------------------------------------------------------- */

static uint64_t hash_bytes(const void *p, size_t n)
{
	const unsigned char *s = p;
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < n; i++) {
		h ^= s[i];
		h *= 1099511628211ull;
	}
	return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

static size_t table_size(size_t n)
{
	size_t s = 16;

	while (s < n * 2)
		s <<= 1;
	return s;
}

/* Find @p key in a map of ids keyed by (off, len) into the pool. Returns the
 * slot: holding id + 1 when found, 0 when the key is absent. */
static size_t map_slot(const struct kn_tok *t, const uint32_t *map, size_t mask,
		       const uint32_t *off, const uint32_t *len,
		       const char *key, size_t n)
{
	size_t i = hash_bytes(key, n) & mask;

	for (;;) {
		uint32_t v = map[i];

		if (v == 0)
			return i;
		if (len[v - 1] == n && memcmp(t->pool + off[v - 1], key, n) == 0)
			return i;
		i = (i + 1) & mask;
	}
}

static int32_t bytes_lookup(const struct kn_tok *t, const char *s, size_t n)
{
	size_t i = map_slot(t, t->bytes_map, t->bytes_mask, t->bytes_off,
			    t->bytes_len, s, n);

	return (int32_t)t->bytes_map[i] - 1;
}

int32_t kn_tok_token_to_id(const struct kn_tok *t, const char *token)
{
	size_t i;

	if (!t || !token)
		return -1;
	i = map_slot(t, t->spell_map, t->spell_mask, t->spell_off, t->spell_len,
		     token, strlen(token));
	return (int32_t)t->spell_map[i] - 1;
}

static const struct kn_tok_merge *merge_find(const struct kn_tok *t, int32_t a, int32_t b)
{
	uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	size_t i = hash_u64(key) & t->merge_mask;

	for (;;) {
		const struct kn_tok_merge *m = &t->merges[i];

		if (m->key == key)
			return m;
		if (m->key == EMPTY_KEY)
			return NULL;
		i = (i + 1) & t->merge_mask;
	}
}

/* ---- the GPT-2 byte mapping ------------------------------------------- */

/* Byte b is spelled as code point byte_cp(b): printable Latin-1 bytes stand
 * for themselves, the other 68 take 256, 257, ... in byte order. */
static void byte_map(uint32_t cp_of[256], int16_t byte_of[324])
{
	uint32_t next = 256;

	for (int i = 0; i < 324; i++)
		byte_of[i] = -1;
	for (int b = 0; b < 256; b++) {
		int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
			   (b >= 0xAE && b <= 0xFF);
		cp_of[b] = keep ? (uint32_t)b : next++;
		byte_of[cp_of[b]] = (int16_t)b;
	}
}

/* Undo the byte mapping of a spelling. Hugging Face's ByteLevel decoder keeps
 * a token's UTF-8 as is when any of its characters is outside the map; so do
 * we. Writes at most n bytes to out; returns the count. */
static size_t unmap_bytes(const int16_t byte_of[324], const char *s, size_t n, char *out)
{
	size_t k = 0, i = 0;

	while (i < n) {
		ucs4_t cp;
		int l = u8_mbtouc(&cp, (const uint8_t *)s + i, n - i);

		if (cp >= 324 || byte_of[cp] < 0 || l <= 0) {
			memcpy(out, s, n);
			return n;
		}
		out[k++] = (char)byte_of[cp];
		i += (size_t)l;
	}
	return k;
}

/* ---- loading ----------------------------------------------------------- */

/* Reload a file whose integers overflow jansson's json_int_t (Llama 3's
 * tokenizer_config.json has model_max_length = 1e30 spelled as an integer)
 * with each over-long integer turned into a real by appending ".0". */
static json_t *load_json_bigint(const char *path, json_error_t *je)
{
	struct kn_tok_buf b = { 0 };
	FILE *f = fopen(path, "rb");
	char *src = NULL;
	size_t n = 0;
	int in_str = 0;
	json_t *j = NULL;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0) {
		long sz = ftell(f);

		if (sz > 0 && fseek(f, 0, SEEK_SET) == 0 && (src = malloc((size_t)sz)))
			n = fread(src, 1, (size_t)sz, f);
	}
	fclose(f);
	for (size_t i = 0; src && i < n; i++) {
		size_t k = i;

		if (in_str) {
			if (src[i] == '\\')
				k = i + 1;
			else if (src[i] == '"')
				in_str = 0;
			if (kn_tok_buf_add(&b, src + i, k - i + 1))
				goto out;
			i = k;
			continue;
		}
		if (src[i] == '"')
			in_str = 1;
		while (k < n && ((src[k] >= '0' && src[k] <= '9') || (k == i && src[k] == '-')))
			k++;
		if (k - i > 18 && (k == n || (src[k] != '.' && src[k] != 'e' && src[k] != 'E'))) {
			if (kn_tok_buf_add(&b, src + i, k - i) || kn_tok_buf_add(&b, ".0", 2))
				goto out;
			i = k - 1;
			continue;
		}
		if (kn_tok_buf_add(&b, src + i, 1))
			goto out;
	}
	if (b.p)
		j = json_loadb(b.p, b.n, JSON_DECODE_ANY, je);
out:
	free(src);
	free(b.p);
	return j;
}

static json_t *load_json(const char *path, int *eno, char *err, size_t errlen)
{
	json_error_t je;
	json_t *j = json_load_file(path, JSON_DECODE_ANY, &je);

	if (!j && strstr(je.text, "too big integer"))
		j = load_json_bigint(path, &je);
	if (!j) {
		if (je.position == 0 && je.line == -1) {
			*eno = ENOENT;
			kn_seterr(err, errlen, "json_load_file(%s) failed: %s; check the path "
			       "(a model directory needs tokenizer.json)", path, je.text);
		} else {
			*eno = EINVAL;
			kn_seterr(err, errlen, "json_load_file(%s) failed at line %d column %d: %s; "
			       "the file is not valid JSON", path, je.line, je.column, je.text);
		}
	}
	return j;
}

/* Token text from a tokenizer_config.json field: "str" or {"content": "str"}. */
static const char *token_text(const json_t *v)
{
	if (json_is_object(v))
		v = json_object_get(v, "content");
	return json_is_string(v) ? json_string_value(v) : NULL;
}

static int pool_add(struct kn_tok *t, size_t *cap, const char *s, size_t n, uint32_t *off)
{
	if (t->pool_len + n > *cap) {
		size_t c = *cap ? *cap : 1 << 20;
		char *p;

		while (c < t->pool_len + n)
			c *= 2;
		p = realloc(t->pool, c);
		if (!p)
			return -ENOMEM;
		t->pool = p;
		*cap = c;
	}
	memcpy(t->pool + t->pool_len, s, n);
	*off = (uint32_t)t->pool_len;
	t->pool_len += n;
	return 0;
}

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

static int add_pretok(struct kn_tok *t, const json_t *pt, int first, char *err, size_t errlen)
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
			rc = add_pretok(t, v, first && i == 0, err, errlen);
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

static int load_normalizer(struct kn_tok *t, const json_t *n, char *err, size_t errlen)
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
			int rc = load_normalizer(t, v, err, errlen);

			if (rc)
				return rc;
		}
		return 0;
	}
	kn_seterr(err, errlen, "tokenizer.json: normalizer type \"%s\" is not supported "
	       "(supported: null, NFC)", type ? type : "(missing)");
	return -EINVAL;
}

static int build_maps(struct kn_tok *t, size_t n_vocab_ids, const int32_t *vocab_ids)
{
	t->spell_mask = table_size((size_t)t->n_ids) - 1;
	t->spell_map = calloc(t->spell_mask + 1, sizeof(uint32_t));
	t->bytes_mask = table_size(n_vocab_ids) - 1;
	t->bytes_map = calloc(t->bytes_mask + 1, sizeof(uint32_t));
	if (!t->spell_map || !t->bytes_map)
		return -ENOMEM;
	/* Added tokens first: tokenizers resolves a spelling to the added id. */
	for (size_t i = 0; i < t->n_added; i++) {
		int32_t id = t->added[i].id;
		size_t s = map_slot(t, t->spell_map, t->spell_mask, t->spell_off,
				    t->spell_len, t->pool + t->spell_off[id], t->spell_len[id]);

		if (!t->spell_map[s])
			t->spell_map[s] = (uint32_t)id + 1;
	}
	for (size_t i = 0; i < n_vocab_ids; i++) {
		int32_t id = vocab_ids[i];
		size_t s = map_slot(t, t->spell_map, t->spell_mask, t->spell_off,
				    t->spell_len, t->pool + t->spell_off[id], t->spell_len[id]);

		if (!t->spell_map[s])
			t->spell_map[s] = (uint32_t)id + 1;
		s = map_slot(t, t->bytes_map, t->bytes_mask, t->bytes_off, t->bytes_len,
			     t->pool + t->bytes_off[id], t->bytes_len[id]);
		if (!t->bytes_map[s])
			t->bytes_map[s] = (uint32_t)id + 1;
	}
	return 0;
}

static int merge_insert(struct kn_tok *t, int32_t a, int32_t b, int32_t rank, int32_t id)
{
	uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	size_t i = hash_u64(key) & t->merge_mask;

	while (t->merges[i].key != EMPTY_KEY) {
		if (t->merges[i].key == key)
			return 0; /* a repeated merge keeps its first (lowest) rank */
		i = (i + 1) & t->merge_mask;
	}
	t->merges[i].key = key;
	t->merges[i].rank = rank;
	t->merges[i].id = id;
	return 0;
}

static int load_merges(struct kn_tok *t, const json_t *merges, const int16_t byte_of[324],
		       char *err, size_t errlen)
{
	size_t n = json_array_size(merges), i;
	json_t *v;
	char *buf = NULL;
	size_t bufcap = 0;
	int rc = 0;

	t->merge_mask = table_size(n) - 1;
	t->merges = malloc((t->merge_mask + 1) * sizeof(*t->merges));
	if (!t->merges)
		return -ENOMEM;
	for (i = 0; i <= t->merge_mask; i++)
		t->merges[i].key = EMPTY_KEY;
	json_array_foreach(merges, i, v) {
		const char *l, *r;
		size_t ll, rl, lb, rb;
		int32_t a, b, m;

		/* Two spellings: "left right" (older files) or ["left", "right"]. */
		if (json_is_string(v)) {
			const char *s = json_string_value(v), *sp = strchr(s, ' ');

			if (!sp)
				goto bad;
			l = s;
			ll = (size_t)(sp - s);
			r = sp + 1;
			rl = strlen(r);
		} else if (json_is_array(v) && json_array_size(v) == 2 &&
			   json_is_string(json_array_get(v, 0)) &&
			   json_is_string(json_array_get(v, 1))) {
			l = json_string_value(json_array_get(v, 0));
			ll = json_string_length(json_array_get(v, 0));
			r = json_string_value(json_array_get(v, 1));
			rl = json_string_length(json_array_get(v, 1));
		} else {
			goto bad;
		}
		if (ll + rl > bufcap) {
			char *p = realloc(buf, (ll + rl) * 2);

			if (!p) {
				rc = -ENOMEM;
				goto out;
			}
			buf = p;
			bufcap = (ll + rl) * 2;
		}
		lb = unmap_bytes(byte_of, l, ll, buf);
		a = bytes_lookup(t, buf, lb);
		rb = unmap_bytes(byte_of, r, rl, buf + lb);
		b = bytes_lookup(t, buf + lb, rb);
		m = bytes_lookup(t, buf, lb + rb);
		if (a < 0 || b < 0 || m < 0) {
			kn_seterr(err, errlen, "tokenizer.json: merge %zu (\"%.*s\" + \"%.*s\") "
			       "names a token missing from model.vocab; the file is damaged",
			       i, (int)ll, l, (int)rl, r);
			rc = -EINVAL;
			goto out;
		}
		merge_insert(t, a, b, (int32_t)i, m);
	}
	goto out;
bad:
	kn_seterr(err, errlen, "tokenizer.json: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", i);
	rc = -EINVAL;
out:
	free(buf);
	return rc;
}

static int index_added(struct kn_tok *t)
{
	size_t k = 0;

	t->added_order = malloc((t->n_added + 1) * sizeof(uint32_t));
	if (!t->added_order)
		return -ENOMEM;
	for (size_t i = 0; i < t->n_added; i++)
		if (t->added[i].len > 0)
			t->added_order[k++] = (uint32_t)i;
	/* Insertion sort by (first byte, longest first): qsort has no context
	 * argument in C17 and the lists are a few hundred tokens long. */
	for (size_t i = 1; i < k; i++) {
		uint32_t v = t->added_order[i];
		size_t j = i;

		while (j > 0) {
			const struct kn_tok_added *x = &t->added[t->added_order[j - 1]];
			const struct kn_tok_added *y = &t->added[v];
			unsigned char fx = (unsigned char)x->content[0];
			unsigned char fy = (unsigned char)y->content[0];

			if (fx < fy || (fx == fy && x->len >= y->len))
				break;
			t->added_order[j] = t->added_order[j - 1];
			j--;
		}
		t->added_order[j] = v;
	}
	memset(t->added_start, 0, sizeof(t->added_start));
	for (size_t i = 0; i < k; i++)
		t->added_start[(unsigned char)t->added[t->added_order[i]].content[0] + 1]++;
	for (int b = 0; b < 256; b++)
		t->added_start[b + 1] += t->added_start[b];
	return 0;
}

static void load_config(struct kn_tok *t, const json_t *cfg)
{
	const char *bos = token_text(json_object_get(cfg, "bos_token"));
	const char *eos = token_text(json_object_get(cfg, "eos_token"));
	const json_t *ct = json_object_get(cfg, "chat_template");
	const char *tmpl = NULL;

	t->bos_id = bos ? kn_tok_token_to_id(t, bos) : -1;
	if (t->bos_id >= 0)
		t->bos_text = strdup(bos);
	t->eos_id = eos ? kn_tok_token_to_id(t, eos) : -1;
	if (json_is_string(ct)) {
		tmpl = json_string_value(ct);
	} else if (json_is_array(ct)) {
		size_t i;
		json_t *v;

		json_array_foreach(ct, i, v) {
			const char *name = json_string_value(json_object_get(v, "name"));

			if (name && strcmp(name, "default") == 0)
				tmpl = json_string_value(json_object_get(v, "template"));
		}
	}
	if (!tmpl) {
		snprintf(t->chat_err, sizeof(t->chat_err), "tokenizer_config.json has no "
			 "chat_template; this model has no chat format (use plain completion)");
		return;
	}
	if (strstr(tmpl, "<|im_start|>")) {
		const char *s = strstr(tmpl, "<|im_start|>system\\n");

		t->chat = KN_CHAT_CHATML;
		t->chat_think = strstr(tmpl, "</think>") != NULL;
		t->eot_id = kn_tok_token_to_id(t, "<|im_end|>");
		/* A template that writes a fixed system block when the caller gives
		 * none (Qwen2, Qwen2.5) spells it as one literal; find it. */
		for (; s; s = strstr(s + 1, "<|im_start|>system\\n")) {
			const char *b = s + strlen("<|im_start|>system\\n");
			const char *e = strstr(b, "<|im_end|>");
			struct kn_tok_buf sys = { 0 };

			if (!e || *b == '\'' || *b == '"' || memchr(b, '\'', (size_t)(e - b)) ||
			    memchr(b, '{', (size_t)(e - b)))
				continue;
			for (const char *c = b; c < e; c++) {
				if (c[0] == '\\' && c + 1 < e && c[1] == 'n') {
					kn_tok_buf_add(&sys, "\n", 1);
					c++;
				} else {
					kn_tok_buf_add(&sys, c, 1);
				}
			}
			t->chat_system = sys.p;
			break;
		}
	} else if (strstr(tmpl, "<|start_header_id|>")) {
		t->chat = KN_CHAT_LLAMA3;
		/* Llama 3.0's template has no add_generation_prompt test: it always
		 * ends with the assistant header. */
		t->chat_gen_always = strstr(tmpl, "add_generation_prompt") == NULL;
		t->chat_dated = strstr(tmpl, "Cutting Knowledge Date") != NULL;
		t->eot_id = kn_tok_token_to_id(t, "<|eot_id|>");
	} else {
		snprintf(t->chat_err, sizeof(t->chat_err), "chat_template in "
			 "tokenizer_config.json is of an unknown family (neither ChatML "
			 "<|im_start|> nor Llama 3 <|start_header_id|>); render the prompt "
			 "yourself and encode it with special tokens");
	}
}

static int load_added(struct kn_tok *t, const json_t *arr, char *err, size_t errlen)
{
	size_t i;
	json_t *v;

	t->n_added = json_array_size(arr);
	t->added = calloc(t->n_added + 1, sizeof(*t->added));
	if (!t->added)
		return -ENOMEM;
	json_array_foreach(arr, i, v) {
		json_int_t id = json_integer_value(json_object_get(v, "id"));
		const json_t *c = json_object_get(v, "content");

		if (!json_is_string(c) || !json_is_integer(json_object_get(v, "id")) ||
		    id < 0 || id > INT32_MAX - 1) {
			kn_seterr(err, errlen, "tokenizer.json: added_tokens[%zu] lacks a string "
			       "\"content\" or a valid \"id\"", i);
			return -EINVAL;
		}
		t->added[i].id = (int32_t)id;
		t->added[i].len = (uint32_t)json_string_length(c);
		t->added[i].special = json_is_true(json_object_get(v, "special"));
		t->added[i].lstrip = json_is_true(json_object_get(v, "lstrip"));
		t->added[i].rstrip = json_is_true(json_object_get(v, "rstrip"));
		if (id + 1 > t->n_ids)
			t->n_ids = (int32_t)id + 1;
	}
	return 0;
}

/* Record the spelling and the raw bytes of one id in the pool. */
static int set_token(struct kn_tok *t, size_t *pool_cap, int32_t id, const char *s,
		     const int16_t byte_of[324], char **tmp, size_t *tmpcap)
{
	size_t sl = strlen(s), bl;

	if (sl + 4 > *tmpcap) {
		char *p = realloc(*tmp, sl + 4);

		if (!p)
			return -ENOMEM;
		*tmp = p;
		*tmpcap = sl + 4;
	}
	bl = unmap_bytes(byte_of, s, sl, *tmp);
	if (pool_add(t, pool_cap, s, sl, &t->spell_off[id]) ||
	    pool_add(t, pool_cap, *tmp, bl, &t->bytes_off[id]))
		return -ENOMEM;
	t->spell_len[id] = (uint32_t)sl;
	t->bytes_len[id] = (uint32_t)bl;
	t->present[id] = 1;
	if (bl > t->max_token_bytes)
		t->max_token_bytes = bl;
	return 0;
}

struct kn_tok *kn_tok_open_file(const char *json_path, const char *config_path,
				char *err, size_t errlen)
{
	struct kn_tok *t = NULL;
	json_t *root = NULL, *cfg = NULL;
	json_t *model, *vocab, *added;
	const char *type, *key;
	json_t *val;
	uint32_t cp_of[256];
	int16_t byte_of[324];
	int32_t *vocab_ids = NULL;
	size_t n_vocab = 0, pool_cap = 0, i;
	char *tmp = NULL;
	size_t tmpcap = 0;
	int eno = EINVAL, rc;

	kn_seterr(err, errlen, "no error");
	if (!json_path) {
		kn_seterr(err, errlen, "kn_tok_open_file(NULL) : a path is required");
		errno = EINVAL;
		return NULL;
	}
	root = load_json(json_path, &eno, err, errlen);
	if (!root)
		goto fail;
	if (config_path) {
		cfg = load_json(config_path, &eno, err, errlen);
		if (!cfg)
			goto fail;
	}
	eno = EINVAL;
	model = json_object_get(root, "model");
	type = json_string_value(json_object_get(model, "type"));
	vocab = json_object_get(model, "vocab");
	if (!json_is_object(model)) {
		kn_seterr(err, errlen, "%s: no \"model\" object; is this a tokenizers "
		       "tokenizer.json?", json_path);
		goto fail;
	}
	if (type && strcmp(type, "BPE") != 0) {
		kn_seterr(err, errlen, "%s: model type \"%s\" is not supported; only byte-level "
		       "\"BPE\" tokenizers are", json_path, type);
		goto fail;
	}
	if (!json_is_object(vocab) || !json_is_array(json_object_get(model, "merges"))) {
		kn_seterr(err, errlen, "%s: model has no \"vocab\" object or no \"merges\" "
		       "array; is this a BPE tokenizer.json?", json_path);
		goto fail;
	}
	{
		const json_t *c = json_object_get(model, "continuing_subword_prefix");
		const json_t *s = json_object_get(model, "end_of_word_suffix");

		if ((json_is_string(c) && json_string_length(c)) ||
		    (json_is_string(s) && json_string_length(s))) {
			kn_seterr(err, errlen, "%s: continuing_subword_prefix / end_of_word_suffix "
			       "are not supported (byte-level BPE does not use them)", json_path);
			goto fail;
		}
	}
	t = calloc(1, sizeof(*t));
	if (!t)
		goto nomem;
	t->bos_id = t->eos_id = t->eot_id = -1;
	t->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
	t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
	byte_map(cp_of, byte_of);

	added = json_object_get(root, "added_tokens");
	rc = load_added(t, added, err, errlen);
	if (rc == -ENOMEM)
		goto nomem;
	if (rc)
		goto fail;
	n_vocab = json_object_size(vocab);
	vocab_ids = malloc((n_vocab + 1) * sizeof(*vocab_ids));
	if (!vocab_ids)
		goto nomem;
	i = 0;
	json_object_foreach(vocab, key, val) {
		json_int_t id = json_integer_value(val);

		if (!json_is_integer(val) || id < 0 || id > INT32_MAX - 1) {
			kn_seterr(err, errlen, "%s: vocab entry \"%s\" has no valid id", json_path, key);
			goto fail;
		}
		vocab_ids[i++] = (int32_t)id;
		if (id + 1 > t->n_ids)
			t->n_ids = (int32_t)id + 1;
	}
	t->spell_off = calloc((size_t)t->n_ids, sizeof(uint32_t));
	t->spell_len = calloc((size_t)t->n_ids, sizeof(uint32_t));
	t->bytes_off = calloc((size_t)t->n_ids, sizeof(uint32_t));
	t->bytes_len = calloc((size_t)t->n_ids, sizeof(uint32_t));
	t->present = calloc((size_t)t->n_ids, 1);
	t->special = calloc((size_t)t->n_ids, 1);
	if (!t->spell_off || !t->spell_len || !t->bytes_off || !t->bytes_len ||
	    !t->present || !t->special)
		goto nomem;

	/* Spelling and raw bytes of every id: vocab first, then added tokens,
	 * which win when both name the same id (as in tokenizers' id_to_token). */
	i = 0;
	json_object_foreach(vocab, key, val) {
		if (set_token(t, &pool_cap, vocab_ids[i++], key, byte_of, &tmp, &tmpcap))
			goto nomem;
	}
	for (i = 0; i < t->n_added; i++) {
		const char *s = json_string_value(json_object_get(json_array_get(added, i),
								  "content"));

		if (set_token(t, &pool_cap, t->added[i].id, s, byte_of, &tmp, &tmpcap))
			goto nomem;
		t->special[t->added[i].id] = t->added[i].special;
	}
	for (i = 0; i < t->n_added; i++) {
		t->added[i].content = t->pool + t->spell_off[t->added[i].id];
		t->added[i].len = t->spell_len[t->added[i].id];
	}
	if (build_maps(t, n_vocab, vocab_ids))
		goto nomem;
	for (int b = 0; b < 256; b++) {
		char c = (char)b;

		t->byte_id[b] = bytes_lookup(t, &c, 1);
		if (t->byte_id[b] < 0 && t->byte_fallback) {
			char name[8];

			snprintf(name, sizeof(name), "<0x%02X>", b);
			t->byte_id[b] = kn_tok_token_to_id(t, name);
		}
	}
	rc = load_merges(t, json_object_get(model, "merges"), byte_of, err, errlen);
	if (rc == -ENOMEM)
		goto nomem;
	if (rc)
		goto fail;
	rc = load_normalizer(t, json_object_get(root, "normalizer"), err, errlen);
	if (rc)
		goto fail_rc;
	{
		const json_t *pt = json_object_get(root, "pre_tokenizer");

		if (pt && !json_is_null(pt)) {
			rc = add_pretok(t, pt, 1, err, errlen);
			if (rc)
				goto fail_rc;
		}
	}
	if (index_added(t))
		goto nomem;
	t->chat = KN_CHAT_NONE;
	snprintf(t->chat_err, sizeof(t->chat_err), "no tokenizer_config.json was given, "
		 "so there is no chat template");
	if (cfg)
		load_config(t, cfg);
	if (t->chat != KN_CHAT_NONE)
		t->chat_err[0] = '\0';
	free(tmp);
	free(vocab_ids);
	json_decref(cfg);
	json_decref(root);
	return t;

fail_rc:
	if (rc == -ENOMEM)
		goto nomem;
	goto fail;
nomem:
	eno = ENOMEM;
	kn_seterr(err, errlen, "out of memory loading %s", json_path);
fail:
	free(tmp);
	free(vocab_ids);
	kn_tok_close(t);
	json_decref(cfg);
	json_decref(root);
	errno = eno;
	return NULL;
}

struct kn_tok *kn_tok_open(const char *model_dir, char *err, size_t errlen)
{
	char *jp = NULL, *cp = NULL;
	struct kn_tok *t;
	FILE *f;
	int eno;

	if (!model_dir) {
		kn_seterr(err, errlen, "kn_tok_open(NULL): a model directory is required");
		errno = EINVAL;
		return NULL;
	}
	if (asprintf(&jp, "%s/tokenizer.json", model_dir) < 0)
		jp = NULL;
	if (asprintf(&cp, "%s/tokenizer_config.json", model_dir) < 0)
		cp = NULL;
	if (!jp || !cp) {
		free(jp);
		free(cp);
		errno = ENOMEM;
		return NULL;
	}
	f = fopen(cp, "r");
	if (f)
		fclose(f);
	t = kn_tok_open_file(jp, f ? cp : NULL, err, errlen);
	eno = errno;
	free(jp);
	free(cp);
	errno = eno;
	return t;
}

void kn_tok_close(struct kn_tok *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < t->n_pretok; i++)
		pcre2_code_free(t->pretok[i].re);
	free(t->pretok);
	free(t->chat_system);
	free(t->bos_text);
	free(t->added_order);
	free(t->added);
	free(t->merges);
	free(t->bytes_map);
	free(t->spell_map);
	free(t->special);
	free(t->present);
	free(t->bytes_len);
	free(t->bytes_off);
	free(t->spell_len);
	free(t->spell_off);
	free(t->pool);
	free(t);
}

/* ---- encoding ---------------------------------------------------------- */

struct ids {
	int32_t *v;
	size_t n, cap;
};

static int ids_push(struct ids *a, int32_t id)
{
	if (a->n == a->cap) {
		size_t c = a->cap ? a->cap * 2 : 64;
		int32_t *p = realloc(a->v, c * sizeof(*p));

		if (!p)
			return -ENOMEM;
		a->v = p;
		a->cap = c;
	}
	a->v[a->n++] = id;
	return 0;
}

/* Per-call cache of BPE results, keyed by pre-token bytes. */
struct cache_ent {
	uint64_t h;
	uint32_t key_off, key_len; /* into keys */
	uint32_t ids_off, ids_n;   /* into ids */
};

struct cache {
	struct cache_ent *e;
	size_t mask, used;
	struct kn_tok_buf keys;
	struct ids ids;
};

/* Longest pre-token worth caching: long runs (whitespace, digits) rarely
 * repeat and would bloat the cache. */
#define CACHE_MAX_KEY 64

static struct cache_ent *cache_find(struct cache *c, const char *s, size_t n, uint64_t h)
{
	size_t i = h & c->mask;

	for (;;) {
		struct cache_ent *e = &c->e[i];

		if (e->key_len == 0)
			return e;
		if (e->h == h && e->key_len == n && memcmp(c->keys.p + e->key_off, s, n) == 0)
			return e;
		i = (i + 1) & c->mask;
	}
}

static int cache_grow(struct cache *c)
{
	size_t nm = c->e ? (c->mask + 1) * 2 : 1024;
	struct cache_ent *ne = calloc(nm, sizeof(*ne));

	if (!ne)
		return -ENOMEM;
	for (size_t i = 0; c->e && i <= c->mask; i++) {
		struct cache_ent *o = &c->e[i];
		size_t j;

		if (!o->key_len)
			continue;
		j = o->h & (nm - 1);
		while (ne[j].key_len)
			j = (j + 1) & (nm - 1);
		ne[j] = *o;
	}
	free(c->e);
	c->e = ne;
	c->mask = nm - 1;
	return 0;
}

struct heap_ent {
	int32_t rank;
	uint32_t pos;
};

static int heap_less(const struct heap_ent *a, const struct heap_ent *b)
{
	return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct heap_ent *h, size_t *n, struct heap_ent e)
{
	size_t i = (*n)++;

	while (i > 0) {
		size_t p = (i - 1) / 2;

		if (!heap_less(&e, &h[p]))
			break;
		h[i] = h[p];
		i = p;
	}
	h[i] = e;
}

static struct heap_ent heap_pop(struct heap_ent *h, size_t *n)
{
	struct heap_ent top = h[0], last = h[--(*n)];
	size_t i = 0;

	for (;;) {
		size_t l = 2 * i + 1, m = l;

		if (l >= *n)
			break;
		if (l + 1 < *n && heap_less(&h[l + 1], &h[l]))
			m = l + 1;
		if (!heap_less(&h[m], &last))
			break;
		h[i] = h[m];
		i = m;
	}
	if (*n)
		h[i] = last;
	return top;
}

/* Scratch space of one BPE word, reused across words of a call. */
struct bpe_scratch {
	int32_t *sym;
	int32_t *prev, *next;
	struct heap_ent *heap;
	size_t cap;
};

static int scratch_fit(struct bpe_scratch *s, size_t n)
{
	if (n <= s->cap)
		return 0;
	free(s->sym);
	free(s->prev);
	free(s->next);
	free(s->heap);
	s->sym = malloc(n * sizeof(int32_t));
	s->prev = malloc(n * sizeof(int32_t));
	s->next = malloc(n * sizeof(int32_t));
	/* Stale entries stay queued: n - 1 initial pairs plus at most two new
	 * ones per merge (n - 1 merges) bound the heap by 3n. */
	s->heap = malloc(3 * n * sizeof(struct heap_ent));
	if (!s->sym || !s->prev || !s->next || !s->heap) {
		s->cap = 0;
		return -ENOMEM;
	}
	s->cap = n;
	return 0;
}

static void try_pair(const struct kn_tok *t, struct bpe_scratch *s, size_t *hn, int32_t i)
{
	const struct kn_tok_merge *m;
	int32_t j = s->next[i];

	if (j < 0)
		return;
	m = merge_find(t, s->sym[i], s->sym[j]);
	if (m)
		heap_push(s->heap, hn, (struct heap_ent){ m->rank, (uint32_t)i });
}

/* BPE one pre-token of raw bytes into ids; the merged symbol keeps the left
 * position, as tokenizers' word merge does, so ties break identically. */
static int bpe_word(const struct kn_tok *t, struct bpe_scratch *s, const char *w,
		    size_t n, struct ids *out)
{
	size_t hn = 0, k = 0;
	int32_t id;

	if (t->ignore_merges && (id = bytes_lookup(t, w, n)) >= 0)
		return ids_push(out, id);
	if (scratch_fit(s, n))
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		int32_t b = t->byte_id[(unsigned char)w[i]];

		/* A byte the vocab cannot spell is dropped, as tokenizers does for
		 * a BPE without unk_token. */
		if (b < 0)
			continue;
		s->sym[k] = b;
		s->prev[k] = (int32_t)k - 1;
		s->next[k] = (int32_t)k + 1;
		k++;
	}
	if (k == 0)
		return 0;
	s->next[k - 1] = -1;
	for (size_t i = 0; i + 1 < k; i++)
		try_pair(t, s, &hn, (int32_t)i);
	while (hn) {
		struct heap_ent e = heap_pop(s->heap, &hn);
		int32_t i = (int32_t)e.pos, j;
		const struct kn_tok_merge *m;

		if (s->sym[i] < 0 || (j = s->next[i]) < 0)
			continue;
		m = merge_find(t, s->sym[i], s->sym[j]);
		if (!m || m->rank != e.rank)
			continue; /* stale: one side merged since this was queued */
		s->sym[i] = m->id;
		s->sym[j] = -1;
		s->next[i] = s->next[j];
		if (s->next[j] >= 0)
			s->prev[s->next[j]] = i;
		if (s->prev[i] >= 0)
			try_pair(t, s, &hn, s->prev[i]);
		try_pair(t, s, &hn, i);
	}
	for (int32_t i = 0; i >= 0; i = s->next[i])
		if (ids_push(out, s->sym[i]))
			return -ENOMEM;
	return 0;
}

struct enc_ctx {
	const struct kn_tok *t;
	struct ids *out;
	struct bpe_scratch scratch;
	struct cache cache;
	pcre2_match_data *md;
	struct kn_tok_buf seg;    /* normalised segment */
	uint32_t *pieces, *pieces2; /* (off, len) pairs */
	size_t np, pcap, pcap2;
};

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

/* Split every piece by one Split rule, the way tokenizers' split() does:
 * matches and the gaps between them, roles swapped by invert, then joined
 * according to the behaviour. */
static int split_pieces(struct enc_ctx *c, const struct kn_tok_pretok *p)
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
					if (pend_match >= 0 &&
					    piece_add(&c->pieces2, &n2, &c->pcap2, pend_off, pend_len))
						return -ENOMEM;
					pend_off = base + a;
					pend_len = b - a;
					pend_match = is_match;
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
					if (pend_match >= 0 &&
					    piece_add(&c->pieces2, &n2, &c->pcap2, pend_off, pend_len))
						return -ENOMEM;
					pend_off = base + a;
					pend_len = b - a;
					pend_match = is_match;
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

static int encode_word(struct enc_ctx *c, const char *w, size_t n)
{
	struct cache *ca = &c->cache;
	struct cache_ent *e;
	uint64_t h;
	size_t start;
	int rc;

	if (n > CACHE_MAX_KEY)
		return bpe_word(c->t, &c->scratch, w, n, c->out);
	if (ca->used * 2 >= ca->mask + (ca->e ? 1 : 0) && cache_grow(ca))
		return -ENOMEM;
	h = hash_bytes(w, n);
	e = cache_find(ca, w, n, h);
	if (e->key_len) {
		for (uint32_t i = 0; i < e->ids_n; i++)
			if (ids_push(c->out, ca->ids.v[e->ids_off + i]))
				return -ENOMEM;
		return 0;
	}
	start = c->out->n;
	rc = bpe_word(c->t, &c->scratch, w, n, c->out);
	if (rc)
		return rc;
	e->h = h;
	e->key_off = (uint32_t)ca->keys.n;
	e->key_len = (uint32_t)n;
	e->ids_off = (uint32_t)ca->ids.n;
	e->ids_n = (uint32_t)(c->out->n - start);
	if (kn_tok_buf_add(&ca->keys, w, n))
		return -ENOMEM;
	for (size_t i = start; i < c->out->n; i++)
		if (ids_push(&ca->ids, c->out->v[i]))
			return -ENOMEM;
	ca->used++;
	return 0;
}

static int encode_segment(struct enc_ctx *c, const char *s, size_t n)
{
	const struct kn_tok *t = c->t;
	int ascii = 1;
	int rc;

	if (n == 0)
		return 0;
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
	for (size_t k = 0; k < c->np; k++) {
		rc = encode_word(c, c->seg.p + c->pieces[2 * k], c->pieces[2 * k + 1]);
		if (rc)
			return rc;
	}
	return 0;
}

/* The longest added token allowed at text[i], or NULL. */
static const struct kn_tok_added *added_at(const struct kn_tok *t, const char *s,
					    size_t len, size_t i, unsigned flags)
{
	unsigned char b = (unsigned char)s[i];

	for (uint32_t k = t->added_start[b]; k < t->added_start[b + 1]; k++) {
		const struct kn_tok_added *a = &t->added[t->added_order[k]];

		if (a->special && !(flags & KN_TOK_SPECIAL))
			continue;
		if (a->len <= len - i && memcmp(s + i, a->content, a->len) == 0)
			return a;
	}
	return NULL;
}

static int is_space(unsigned char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

int kn_tok_encode(const struct kn_tok *t, const char *text, size_t len,
		  unsigned flags, int32_t **ids, size_t *n)
{
	struct ids out = { 0 };
	struct enc_ctx c = { .t = t, .out = &out };
	size_t seg = 0, i = 0;
	int rc = 0;

	if (!t || (!text && len) || !ids || !n)
		return -EINVAL;
	*ids = NULL;
	*n = 0;
	if (len && u8_check((const uint8_t *)text, len))
		return -EILSEQ;
	c.md = pcre2_match_data_create(1, NULL);
	if (!c.md)
		return -ENOMEM;
	if ((flags & KN_TOK_ADD_BOS) && t->bos_id >= 0 && (rc = ids_push(&out, t->bos_id)))
		goto out;
	while (i < len) {
		const struct kn_tok_added *a = t->added_start[(unsigned char)text[i]] !=
			t->added_start[(unsigned char)text[i] + 1] ?
			added_at(t, text, len, i, flags) : NULL;
		size_t end, next;

		if (!a) {
			i++;
			continue;
		}
		end = i;
		next = i + a->len;
		if (a->lstrip)
			while (end > seg && is_space((unsigned char)text[end - 1]))
				end--;
		if (a->rstrip)
			while (next < len && is_space((unsigned char)text[next]))
				next++;
		rc = encode_segment(&c, text + seg, end - seg);
		if (rc)
			goto out;
		rc = ids_push(&out, a->id);
		if (rc)
			goto out;
		seg = i = next;
	}
	rc = encode_segment(&c, text + seg, len - seg);
out:
	pcre2_match_data_free(c.md);
	free(c.scratch.sym);
	free(c.scratch.prev);
	free(c.scratch.next);
	free(c.scratch.heap);
	free(c.cache.e);
	free(c.cache.keys.p);
	free(c.cache.ids.v);
	free(c.seg.p);
	free(c.pieces);
	free(c.pieces2);
	if (rc) {
		free(out.v);
		return rc;
	}
	*ids = out.v;
	*n = out.n;
	return 0;
}

/* ---- decoding ---------------------------------------------------------- */

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

/* ---- accessors --------------------------------------------------------- */

int32_t kn_tok_vocab_size(const struct kn_tok *t)
{
	return t ? t->n_ids : 0;
}

size_t kn_tok_max_token_bytes(const struct kn_tok *t)
{
	return t ? t->max_token_bytes : 0;
}

int kn_tok_is_special(const struct kn_tok *t, int32_t id)
{
	return t && id >= 0 && id < t->n_ids && t->special[id];
}

int32_t kn_tok_bos_id(const struct kn_tok *t)
{
	return t ? t->bos_id : -1;
}

size_t kn_tok_eos_ids(const struct kn_tok *t, int32_t *out, size_t cap)
{
	size_t n = 0;

	if (!t)
		return 0;
	if (t->eos_id >= 0) {
		if (n < cap)
			out[n] = t->eos_id;
		n++;
	}
	if (t->eot_id >= 0 && t->eot_id != t->eos_id) {
		if (n < cap)
			out[n] = t->eot_id;
		n++;
	}
	return n;
}

enum kn_chat_family kn_tok_chat_family(const struct kn_tok *t)
{
	return t ? t->chat : KN_CHAT_NONE;
}

const char *kn_tok_chat_error(const struct kn_tok *t)
{
	return t ? t->chat_err : "no tokenizer";
}
