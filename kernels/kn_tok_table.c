/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tokenizer's lookup tables, built once by kn_tok_open_file() and probed
 * by every encode: spelling -> id (every id, added tokens winning), raw bytes
 * -> id (model vocab only) and the merge table (left id, right id) -> rank,
 * merged id. All three are open addressing with linear probing, at most half
 * full (table_size), so a probe for an absent key always meets an empty slot;
 * a full table would make the lookup of a missing key loop forever.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kn_tok_int.h"

#define EMPTY_KEY UINT64_MAX

/* ---- hashing ---------------------------------------------------------- */

uint64_t kn_tok_hash_bytes(const void *p, size_t n)
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
	size_t i = kn_tok_hash_bytes(key, n) & mask;

	for (;;) {
		uint32_t v = map[i];

		if (v == 0)
			return i;
		if (len[v - 1] == n && memcmp(t->pool + off[v - 1], key, n) == 0)
			return i;
		i = (i + 1) & mask;
	}
}

int32_t kn_tok_bytes_lookup(const struct kn_tok *t, const char *s, size_t n)
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

const struct kn_tok_merge *kn_tok_merge_find(const struct kn_tok *t, int32_t a, int32_t b)
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

/* ---- building ---------------------------------------------------------- */

int kn_tok_build_maps(struct kn_tok *t, size_t n_vocab_ids, const int32_t *vocab_ids)
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

int kn_tok_merges_alloc(struct kn_tok *t, size_t n)
{
	t->merge_mask = table_size(n) - 1;
	t->merges = malloc((t->merge_mask + 1) * sizeof(*t->merges));
	if (!t->merges)
		return -ENOMEM;
	for (size_t i = 0; i <= t->merge_mask; i++)
		t->merges[i].key = EMPTY_KEY;
	return 0;
}

int kn_tok_merge_insert(struct kn_tok *t, int32_t a, int32_t b, int32_t rank, int32_t id)
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
