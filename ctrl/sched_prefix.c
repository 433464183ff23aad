/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Prefix caching ([sched] prefix_cache): the KV blocks of a finished
 * sequence's prompt stay in the pool's place, named by what they hold, and a
 * later prompt that starts with the same tokens points its block-table row
 * at them and computes only the rest.
 *
 * The stages read KV only through their rows (KN_OP_SET_BLOCK; ZERO_SLOT
 * clears a row, never a block; ROLLBACK writes nothing for attention), so
 * two rows may point at one block, and a sequence writes only at its own
 * positions, which start past the blocks it shares. The scheduler owns the
 * block ids, so all of it is here:
 *
 *  - a block is named by a chain hash: block j of a prompt by (block j - 1's
 *    name, its 16 tokens); its tokens are kept too and compared on a hit;
 *  - a prompt's blocks are named as its prefill fills them (each whole
 *    block below n_fed, sched_prefix_fed()), so a prompt that comes while
 *    the first still runs finds them too; a lost micro-batch forgets every
 *    name (below), so no block whose KV may be wrong keeps one;
 *  - a prompt takes at most (n_prompt - 1) / 16 blocks: its last position
 *    is always computed, for its first token's logits;
 *  - the pool counts a block's holders (shm_blkpool_ref()): the cache
 *    holds one reference on each block it names, every row reading it
 *    another; a named block only the cache holds is idle: it waits in an
 *    LRU list and goes back to the pool first when the pool runs dry
 *    (sched_blk_alloc()), so admission's worst-case reservation (every live
 *    sequence's own blocks, a shared one counted by each) holds unchanged;
 *  - everything is forgotten (sched_prefix_flush()) when the chain may have
 *    lost KV: its KV generation changed (a worker re-joined), or a
 *    micro-batch was lost;
 *  - a prefill node's hold_kv prompts take and name blocks as any prompt
 *    does: the blocks they take are final, so they are told at admission
 *    (a kv_progress event) and may ship at once; the blocks they hold past
 *    their end go back through sched_prefix_unref() when released
 *    (sched_kv.c). A decode node's kv_remote requests neither take nor
 *    name blocks: their prompt's KV comes from another node.
 *
 * On the CPU engine a prompt's KV has the same bits however it was chunked
 * (kernels/NOTES.md), so a request answers token for token as it would
 * without the cache (test_sched_kn pins it).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ctrl_sched.h"
#include "kvf_mix.h"
#include "sched_int.h"
#include "shm_blkpool.h"

/* The name of a block holding @p t[0 .. KN_PAGE_BLK) after a block named
 * @p parent (0: the prompt's first). Never 0 (0: not cached). */
static uint64_t block_name(uint64_t parent, const int32_t *t)
{
	uint64_t h = kvf_mix64(parent + KVF_MIX_GOLDEN);

	for (int k = 0; k < KN_PAGE_BLK; k++)
		h = kvf_mix64(h ^ (uint32_t)t[k]);
	return h ? h : 1;
}

int sched_prefix_init(struct ctrl_sched *s)
{
	struct sched_prefix *p = &s->pfx;
	size_t n = (size_t)s->n_blocks;

	memset(p, 0, sizeof(*p));
	p->lru_head = p->lru_tail = -1;
	if (!s->o.prefix_cache)
		return 0;
	for (p->n_buckets = 16; p->n_buckets < n; p->n_buckets *= 2)
		;
	p->name = calloc(n, sizeof(*p->name));
	p->prev = malloc(n * sizeof(*p->prev));
	p->next = malloc(n * sizeof(*p->next));
	p->hnext = malloc(n * sizeof(*p->hnext));
	p->toks = malloc(n * KN_PAGE_BLK * sizeof(*p->toks));
	p->bucket = malloc(p->n_buckets * sizeof(*p->bucket));
	if (!p->name || !p->prev || !p->next || !p->hnext || !p->toks || !p->bucket) {
		sched_prefix_fini(s);
		return -ENOMEM;
	}
	for (size_t i = 0; i < p->n_buckets; i++)
		p->bucket[i] = -1;
	p->lru_head = p->lru_tail = -1;
	p->gen = ctrl_chain_kv_generation(s->chain);
	p->on = 1;
	return 0;
}

void sched_prefix_fini(struct ctrl_sched *s)
{
	struct sched_prefix *p = &s->pfx;

	free(p->name);
	free(p->prev);
	free(p->next);
	free(p->hnext);
	free(p->toks);
	free(p->bucket);
	memset(p, 0, sizeof(*p));
	p->lru_head = p->lru_tail = -1;
}

static void lru_unlink(struct sched_prefix *p, int32_t b)
{
	if (p->prev[b] >= 0)
		p->next[p->prev[b]] = p->next[b];
	else
		p->lru_head = p->next[b];
	if (p->next[b] >= 0)
		p->prev[p->next[b]] = p->prev[b];
	else
		p->lru_tail = p->prev[b];
	p->n_idle--;
}

static void lru_append(struct sched_prefix *p, int32_t b)
{
	p->prev[b] = p->lru_tail;
	p->next[b] = -1;
	if (p->lru_tail >= 0)
		p->next[p->lru_tail] = b;
	else
		p->lru_head = b;
	p->lru_tail = b;
	p->n_idle++;
}

static int32_t *bucket_of(struct sched_prefix *p, uint64_t name)
{
	return &p->bucket[name & (p->n_buckets - 1)];
}

/* The cached block named @p name holding tokens @p t, or -1. */
static int32_t lookup(struct sched_prefix *p, uint64_t name, const int32_t *t)
{
	for (int32_t b = *bucket_of(p, name); b >= 0; b = p->hnext[b])
		if (p->name[b] == name && !memcmp(p->toks + (size_t)b * KN_PAGE_BLK, t, sizeof(int32_t) * KN_PAGE_BLK))
			return b;
	return -1;
}

static void insert(struct sched_prefix *p, int32_t b, uint64_t name, const int32_t *t)
{
	int32_t *head = bucket_of(p, name);

	p->name[b] = name;
	memcpy(p->toks + (size_t)b * KN_PAGE_BLK, t, sizeof(int32_t) * KN_PAGE_BLK);
	p->hnext[b] = *head;
	*head = b;
	p->n_named++;
}

/* Block @p b forgets its name (the cache's reference stays: the caller drops it). */
static void unname(struct sched_prefix *p, int32_t b)
{
	int32_t *pp = bucket_of(p, p->name[b]);

	while (*pp >= 0 && *pp != b)
		pp = &p->hnext[*pp];
	if (*pp == b)
		*pp = p->hnext[b];
	p->name[b] = 0;
	p->n_named--;
}

/* Named block @p b forgotten: idle, back to the pool; else to the pool
 * with its last reader. */
static void forget(struct ctrl_sched *s, int32_t b)
{
	struct sched_prefix *p = &s->pfx;

	if (shm_blkpool_refcount(s->pool, b) == 1)
		lru_unlink(p, b);
	unname(p, b);
	shm_blkpool_unref(s->pool, b);
}

void sched_prefix_flush(struct ctrl_sched *s)
{
	struct sched_prefix *p = &s->pfx;

	if (!p->on)
		return;
	p->gen = ctrl_chain_kv_generation(s->chain);
	if (p->n_named == 0)
		return;
	for (int32_t b = 0; b < s->n_blocks && p->n_named > 0; b++)
		if (p->name[b])
			forget(s, b);
	s->st.prefix_flushes++;
}

/* The chain may have lost its KV since the cache was filled: forget it. */
static void check_gen(struct ctrl_sched *s)
{
	if (s->pfx.gen != ctrl_chain_kv_generation(s->chain))
		sched_prefix_flush(s);
}

int sched_blk_alloc(struct ctrl_sched *s, int32_t n, int32_t *out)
{
	struct sched_prefix *p = &s->pfx;
	int32_t short_by = n - shm_blkpool_available(s->pool);

	while (p->on && short_by-- > 0 && p->lru_head >= 0)
		forget(s, p->lru_head); /* the least recently used first */
	return shm_blkpool_alloc(s->pool, n, out);
}

int32_t sched_prefix_take(struct ctrl_sched *s, int32_t i)
{
	struct sched_prefix *p = &s->pfx;
	struct sched_slot *sl = &s->slots[i];
	const struct sched_req *r = sl->r;
	int32_t most, c = 0;
	uint64_t name = 0;

	sl->pfx_done = 0;
	sl->pfx_name = 0;
	sl->r->n_cached = 0;
	if (!p->on || r->kv_remote)
		return 0;
	check_gen(s);
	most = (r->n_prompt - 1) / KN_PAGE_BLK;
	if (r->plp_end > 0 && most > (r->plp_next - 1) / KN_PAGE_BLK)
		most = (r->plp_next - 1) / KN_PAGE_BLK; /* positions still to score are computed */
	if (most > s->mbps)
		most = s->mbps;
	for (; c < most; c++) {
		const int32_t *t = r->toks + (size_t)c * KN_PAGE_BLK;
		uint64_t n = block_name(name, t);
		int32_t b;

		if ((b = lookup(p, n, t)) < 0)
			break;
		if (shm_blkpool_refcount(s->pool, b) == 1)
			lru_unlink(p, b); /* idle no more */
		shm_blkpool_ref(s->pool, b);
		sl->blk[c] = b;
		name = n;
	}
	sl->n_blk = c;
	sl->n_fed = sl->n_sent = c * KN_PAGE_BLK;
	sl->pfx_done = c;
	sl->pfx_name = name;
	sl->r->n_cached = c * KN_PAGE_BLK;
	s->st.prefix_hit_tokens += (uint64_t)c * KN_PAGE_BLK;
	return c;
}

void sched_prefix_fed(struct ctrl_sched *s, int32_t i)
{
	struct sched_prefix *p = &s->pfx;
	struct sched_slot *sl = &s->slots[i];
	const struct sched_req *r = sl->r;
	int32_t whole;

	if (!p->on || r->kv_remote)
		return;
	check_gen(s);
	whole = (sl->n_fed < r->n_prompt ? sl->n_fed : r->n_prompt) / KN_PAGE_BLK;
	if (whole > sl->n_blk)
		whole = sl->n_blk;
	for (; sl->pfx_done < whole; sl->pfx_done++) {
		const int32_t *t = r->toks + (size_t)sl->pfx_done * KN_PAGE_BLK;
		int32_t b = sl->blk[sl->pfx_done];

		sl->pfx_name = block_name(sl->pfx_name, t);
		if (!p->name[b] && lookup(p, sl->pfx_name, t) < 0) {
			insert(p, b, sl->pfx_name, t); /* the cache's reference */
			shm_blkpool_ref(s->pool, b);
		}
	}
}

void sched_prefix_unref(struct ctrl_sched *s, const int32_t *blk, int32_t n)
{
	struct sched_prefix *p = &s->pfx;

	if (!p->on) {
		shm_blkpool_release(s->pool, blk, n);
		return;
	}
	check_gen(s);
	/* one reference each; a named block left to the cache alone idles */
	for (int32_t j = 0; j < n; j++)
		if (shm_blkpool_unref(s->pool, blk[j]) == 1 && p->name[blk[j]])
			lru_append(p, blk[j]);
}

void sched_prefix_release(struct ctrl_sched *s, int32_t i)
{
	sched_prefix_unref(s, s->slots[i].blk, s->slots[i].n_blk);
}

/* ---- the n choices of one request: a prompt computed once ---- */

/* Slot @p i takes the whole blocks of slot @p j's computed prompt that hold
 * its own prompt's tokens (never its last position: computed for its logits). */
static void sibling_share(struct ctrl_sched *s, int32_t i, int32_t j)
{
	struct sched_slot *sl = &s->slots[i], *lead = &s->slots[j];
	const struct sched_req *r = sl->r;
	int32_t most = (r->n_prompt - 1) / KN_PAGE_BLK, c = 0;

	if (most > lead->n_fed / KN_PAGE_BLK)
		most = lead->n_fed / KN_PAGE_BLK;
	if (most > lead->n_blk)
		most = lead->n_blk;
	while (c < most && !memcmp(r->toks + (size_t)c * KN_PAGE_BLK, lead->r->toks + (size_t)c * KN_PAGE_BLK,
				   sizeof(int32_t) * KN_PAGE_BLK))
		c++;
	for (int32_t k = 0; k < c; k++) {
		shm_blkpool_ref(s->pool, lead->blk[k]);
		sl->blk[k] = lead->blk[k];
	}
	sl->n_blk = c;
	sl->n_fed = sl->n_sent = c * KN_PAGE_BLK;
	s->st.prefill_shared_tokens += (uint64_t)c * KN_PAGE_BLK;
}

/* The live slot of request @p id, or -1. */
static int32_t slot_of(const struct ctrl_sched *s, uint64_t id)
{
	for (int32_t j = 0; j < s->n_slots; j++)
		if (s->slots[j].r != NULL && s->slots[j].r->id == id)
			return j;
	return -1;
}

void sched_sibling_admit(struct ctrl_sched *s, int32_t i)
{
	struct sched_slot *sl = &s->slots[i];
	int32_t j;

	sl->pf_wait = 0;
	if (sl->r->pf_from == 0 || sl->n_blk > 0 || sl->r->n_replays > 0 || (j = slot_of(s, sl->r->pf_from)) < 0)
		return; /* (the prefix cache's blocks, a replay, or a lead that ended: computed here) */
	if (s->slots[j].n_fed >= s->slots[j].r->n_prompt) {
		sibling_share(s, i, j);
		return;
	}
	sl->pf_wait = 1;
	s->n_pf_wait++;
}

void sched_sibling_done(struct ctrl_sched *s, int32_t i, int share)
{
	uint64_t id = s->slots[i].r->id;

	for (int32_t k = 0; k < s->n_slots && s->n_pf_wait > 0; k++) {
		struct sched_slot *sl = &s->slots[k];

		if (!sl->pf_wait || sl->r->pf_from != id)
			continue;
		sl->pf_wait = 0;
		s->n_pf_wait--;
		if (share)
			sibling_share(s, k, i);
		sl->ready_at = s->launch_no;
	}
}
