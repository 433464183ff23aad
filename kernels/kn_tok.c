/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Byte-level BPE tokenizer (tokenizer.json): opening and closing it, and its
 * accessors. kn_tok_open_file() reads tokenizer.json (model checks, vocab,
 * added tokens, merges) and tokenizer_config.json (BOS/EOS, chat family) into
 * struct kn_tok (kn_tok_int.h). The rest of the tokenizer:
 *   kn_tok_table.c   spelling/bytes -> id maps and the merge table
 *   kn_tok_pretok.c  normalizer and pre-tokenizer (read here, run at encode)
 *   kn_tok_encode.c  added tokens and BPE: kn_tok_encode()
 *   kn_tok_decode.c  kn_tok_decode() and the streaming decoder
 *   kn_tok_chat.c    chat templates: the family read off the template text,
 *                    prompts rendered by it
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
 *   - The struct is never written after kn_tok_open() (and the
 *     kn_tok_set_chat_template() that may follow it before the tokenizer is
 *     shared): the per-pre-token BPE cache lives in each encode call, so
 *     concurrent encodes need no lock.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <unistr.h>

#include "kn_err.h"
#include "kn_tok_int.h"

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

/* Parse text whose integers overflow jansson's json_int_t (Llama 3's
 * tokenizer_config.json has model_max_length = 1e30 spelled as an integer)
 * with each over-long integer turned into a real by appending ".0". */
static json_t *loadb_bigint(const char *src, size_t n, json_error_t *je)
{
	struct kn_tok_buf b = { 0 };
	int in_str = 0;
	json_t *j = NULL;

	for (size_t i = 0; src && i < n; i++) {
		size_t k = i;

		if (in_str) {
			if (src[i] == '\\' && i + 1 < n) /* an escape: its next byte too (none at the end) */
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
	free(b.p);
	return j;
}

/* loadb_bigint() on a file's bytes. */
static json_t *load_json_bigint(const char *path, json_error_t *je)
{
	FILE *f = fopen(path, "rb");
	char *src = NULL;
	size_t n = 0;
	json_t *j;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0) {
		long sz = ftell(f);

		if (sz > 0 && fseek(f, 0, SEEK_SET) == 0 && (src = malloc((size_t)sz)))
			n = fread(src, 1, (size_t)sz, f);
	}
	fclose(f);
	j = loadb_bigint(src, n, je);
	free(src);
	return j;
}

/* The message of a JSON text that did not parse. */
static void json_fail(const char *name, const json_error_t *je, int *eno, char *err, size_t errlen)
{
	*eno = EINVAL;
	kn_seterr(err, errlen, "json_load_file(%s) failed at line %d column %d: %s; "
	       "the file is not valid JSON", name, je->line, je->column, je->text);
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
			json_fail(path, &je, eno, err, errlen);
		}
	}
	return j;
}

/* load_json() on bytes in memory, named @p name in messages. */
static json_t *load_json_buf(const char *src, size_t n, const char *name, int *eno, char *err,
			     size_t errlen)
{
	json_error_t je;
	json_t *j = json_loadb(src, n, JSON_DECODE_ANY, &je);

	if (!j && strstr(je.text, "too big integer"))
		j = loadb_bigint(src, n, &je);
	if (!j)
		json_fail(name, &je, eno, err, errlen);
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
	/* the first add allocates even when it adds nothing (an empty token):
	 * the pool is never NULL for an offset to be added to */
	if (t->pool_len + n > *cap || !t->pool) {
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

static int load_merges(struct kn_tok *t, const json_t *merges, const int16_t byte_of[324],
		       char *err, size_t errlen)
{
	size_t n = json_array_size(merges), i;
	json_t *v;
	char *buf = NULL;
	size_t bufcap = 0;
	int rc = 0;

	if (kn_tok_merges_alloc(t, n))
		return -ENOMEM;
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
		a = kn_tok_bytes_lookup(t, buf, lb);
		rb = unmap_bytes(byte_of, r, rl, buf + lb);
		b = kn_tok_bytes_lookup(t, buf + lb, rb);
		m = kn_tok_bytes_lookup(t, buf, lb + rb);
		if (a < 0 || b < 0 || m < 0) {
			kn_seterr(err, errlen, "tokenizer.json: merge %zu (\"%.*s\" + \"%.*s\") "
			       "names a token missing from model.vocab; the file is damaged",
			       i, (int)ll, l, (int)rl, r);
			rc = -EINVAL;
			goto out;
		}
		kn_tok_merge_insert(t, a, b, (int32_t)i, m);
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

/* BOS/EOS and the chat template of tokenizer_config.json (read from
 * @p path); the template's family is kn_tok_chat.c's to tell. Returns 0 or
 * -ENOMEM. */
static int load_config(struct kn_tok *t, const json_t *cfg, const char *path)
{
	const char *bos = token_text(json_object_get(cfg, "bos_token"));
	const char *eos = token_text(json_object_get(cfg, "eos_token"));
	const json_t *ct = json_object_get(cfg, "chat_template");
	const char *tmpl = NULL;

	t->bos_id = bos ? kn_tok_token_to_id(t, bos) : -1;
	if (t->bos_id >= 0 && !(t->bos_text = strdup(bos)))
		return -ENOMEM;
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
		kn_tok_chat_detect(t, NULL, path);
		snprintf(t->chat_err, sizeof(t->chat_err), "%s has no chat_template; this model has "
			 "no chat format (use plain completion)", path);
		return 0;
	}
	return kn_tok_chat_detect(t, tmpl, path);
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

/* The tokenizer of a parsed tokenizer.json (@p root) and tokenizer_config.json
 * (@p cfg, or NULL), each named by its path in messages; takes both
 * references. NULL with errno set on failure, as kn_tok_open(). */
static struct kn_tok *tok_from_json(json_t *root, json_t *cfg, const char *json_path,
				    const char *config_path, char *err, size_t errlen)
{
	struct kn_tok *t = NULL;
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
	/* Ids index tables of n_ids entries: a tokenizer whose ids are far
	 * sparser than its tokens (one id near 2^31 asked for 38 GB; found by
	 * fuzz_tok_load) is refused, not allocated for. Real ones are dense,
	 * added tokens at most a few hundred past the vocabulary. */
	if ((size_t)t->n_ids > 4 * (n_vocab + t->n_added) + 65536) {
		kn_seterr(err, errlen, "%s: token id %d is far beyond the %zu tokens it defines: ids must be "
			  "(nearly) dense, 0 to about the token count", json_path, t->n_ids - 1, n_vocab + t->n_added);
		goto fail;
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
	if (kn_tok_build_maps(t, n_vocab, vocab_ids))
		goto nomem;
	for (int b = 0; b < 256; b++) {
		char c = (char)b;

		t->byte_id[b] = kn_tok_bytes_lookup(t, &c, 1);
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
	rc = kn_tok_load_normalizer(t, json_object_get(root, "normalizer"), err, errlen);
	if (rc)
		goto fail_rc;
	{
		const json_t *pt = json_object_get(root, "pre_tokenizer");

		if (pt && !json_is_null(pt)) {
			rc = kn_tok_add_pretok(t, pt, 1, err, errlen);
			if (rc)
				goto fail_rc;
		}
	}
	if (index_added(t))
		goto nomem;
	t->chat = KN_CHAT_NONE;
	snprintf(t->chat_err, sizeof(t->chat_err), "no tokenizer_config.json was given, "
		 "so there is no chat template");
	if (cfg && load_config(t, cfg, config_path))
		goto nomem;
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

/* tok_from_json() once both texts are parsed: @p root NULL, or @p cfg NULL
 * though one was asked for (@p want_cfg), is a load that failed with
 * errno @p eno and its message already in @p err. Takes both references. */
static struct kn_tok *open_parsed(json_t *root, json_t *cfg, int want_cfg, int eno, const char *json_name,
				  const char *config_name, char *err, size_t errlen)
{
	if (!root || (want_cfg && !cfg)) {
		json_decref(root);
		errno = eno;
		return NULL;
	}
	return tok_from_json(root, cfg, json_name, config_name, err, errlen);
}

struct kn_tok *kn_tok_open_file(const char *json_path, const char *config_path,
				char *err, size_t errlen)
{
	json_t *root, *cfg;
	int eno = EINVAL;

	kn_seterr(err, errlen, "no error");
	if (!json_path) {
		kn_seterr(err, errlen, "kn_tok_open_file(NULL) : a path is required");
		errno = EINVAL;
		return NULL;
	}
	root = load_json(json_path, &eno, err, errlen);
	cfg = root && config_path ? load_json(config_path, &eno, err, errlen) : NULL;
	return open_parsed(root, cfg, config_path != NULL, eno, json_path, config_path, err, errlen);
}

struct kn_tok *kn_tok_open_buf(const char *json, size_t len, const char *config, size_t config_len,
			       char *err, size_t errlen)
{
	json_t *root, *cfg;
	int eno = EINVAL;

	kn_seterr(err, errlen, "no error");
	if (!json) {
		kn_seterr(err, errlen, "kn_tok_open_buf(NULL): the text of a tokenizer.json is required");
		errno = EINVAL;
		return NULL;
	}
	root = load_json_buf(json, len, "tokenizer.json", &eno, err, errlen);
	cfg = root && config ? load_json_buf(config, config_len, "tokenizer_config.json", &eno, err, errlen) : NULL;
	return open_parsed(root, cfg, config != NULL, eno, "tokenizer.json", config ? "tokenizer_config.json" : NULL,
			   err, errlen);
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
	/* Recent transformers save the template beside the config, in
	 * chat_template.jinja, and read it in preference to the config's. */
	if (t && asprintf(&cp, "%s/chat_template.jinja", model_dir) >= 0) {
		int rc = access(cp, F_OK) == 0 ? kn_tok_load_chat_template(t, cp, err, errlen) : 0;

		free(cp);
		if (rc) {
			kn_tok_close(t);
			t = NULL;
			eno = -rc;
		}
	}
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
