/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kn_tok_encode(): steps 1 and 4 of the pipeline (kn_tok.c has all four).
 * Added tokens are cut out of the raw text, leftmost then longest; each
 * segment between them goes through the normalizer and pre-tokenizer
 * (kn_tok_pretok.c); each pre-token's bytes are BPE-merged here, lowest rank
 * first with ties to the leftmost pair, through a heap of candidate pairs.
 * BPE results are cached per call, keyed by the pre-token's bytes: the cache
 * belongs to the call (struct enc_ctx), never to struct kn_tok, so
 * concurrent encodes share nothing writable.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <unistr.h>

#include "kn_tok_int.h"

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
	m = kn_tok_merge_find(t, s->sym[i], s->sym[j]);
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

	if (t->ignore_merges && (id = kn_tok_bytes_lookup(t, w, n)) >= 0)
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
		m = kn_tok_merge_find(t, s->sym[i], s->sym[j]);
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
	struct kn_tok_pre pre;    /* the segment being encoded, split */
};

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
	h = kn_tok_hash_bytes(w, n);
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
	int rc;

	if (n == 0)
		return 0;
	rc = kn_tok_pretokenize(c->t, &c->pre, s, n);
	if (rc)
		return rc;
	for (size_t k = 0; k < c->pre.np; k++) {
		rc = encode_word(c, c->pre.seg.p + c->pre.pieces[2 * k], c->pre.pieces[2 * k + 1]);
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
	if (kn_tok_pre_init(&c.pre))
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
	kn_tok_pre_free(&c.pre);
	free(c.scratch.sym);
	free(c.scratch.prev);
	free(c.scratch.next);
	free(c.scratch.heap);
	free(c.cache.e);
	free(c.cache.keys.p);
	free(c.cache.ids.v);
	if (rc) {
		free(out.v);
		return rc;
	}
	*ids = out.v;
	*n = out.n;
	return 0;
}
