/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Buffer pools: [meta | state words | buffers], one area. The state word of
 * each buffer is the pool: FREE (0), or the pid of the process holding it.
 * Every operation is one compare-and-swap on one word, so a process killed
 * at any instruction leaves each buffer either free or held by its pid,
 * never half-moved (reclaim() then gives back what the pid held):
 *   get: from a shared cursor, the first state that CASes FREE→pid;
 *   take: CAS state holder→pid (the process a descriptor handed the buffer
 *        to says it holds it now);
 *   put: CAS state holder→FREE (FREE already is a double release: refused);
 *   reclaim: CAS state dead pid→FREE.
 * Layout 2 kept a free list in an MPMC rte_ring beside the states: get was
 * dequeue-then-CAS and put CAS-then-enqueue, and a process killed between
 * the two lost the buffer (seven of 64 after one random kill in the kill
 * test); one killed inside the ring's head/tail update stalled the ring for
 * every process. A get now scans at most n words (a few hundred for the
 * dataplane's pools; the cursor makes the first word tried usually free).
 */
#include <errno.h>
#include <unistd.h>
#include <assert.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "shm_pool.h"

#define SHM_POOL_MAGIC 0x4c4f4f50u /* "POOL" */
#define SHM_POOL_LAYOUT 3u

enum { BUF_FREE = 0 };

struct shm_pool_meta {
	uint32_t magic;
	uint32_t layout;
	uint32_t n;
	uint32_t reserved0;
	uint64_t bufsize;
	uint64_t states_off;  /* from meta */
	_Atomic uint32_t cursor; /* where the next get starts looking */
	uint32_t reserved1;
	uint64_t bufs_off;    /* from the region base */
	uint8_t reserved[24];
};
static_assert(sizeof(struct shm_pool_meta) == 72, "pool meta layout");
static_assert(offsetof(struct shm_pool_meta, bufsize) == 16, "bufsize at 16");
static_assert(offsetof(struct shm_pool_meta, bufs_off) == 40, "bufs_off at 40");

struct shm_pool {
	struct shm_pool_meta *meta;
	_Atomic uint32_t *states;
	char *bufs;
	uint64_t bufs_off;
	size_t bufsize;
	uint32_t n;
};

static struct shm_pool *wrap(struct shm_region *reg, struct shm_pool_meta *meta)
{
	struct shm_pool *p = malloc(sizeof(*p));

	if (p == NULL) {
		errno = ENOMEM;
		return NULL;
	}
	p->meta = meta;
	p->states = (_Atomic uint32_t *)((char *)meta + meta->states_off);
	p->bufs_off = meta->bufs_off;
	p->bufs = shm_ptr(reg, meta->bufs_off);
	p->bufsize = meta->bufsize;
	p->n = meta->n;
	return p;
}

static size_t up(size_t x, size_t a)
{
	return (x + a - 1) / a * a;
}

struct shm_pool *shm_pool_create(struct shm_region *reg, const char *name, uint32_t n,
				 size_t bufsize)
{
	struct shm_pool_meta *meta;
	size_t states_off, bufs_rel, total;
	uint64_t off;
	int rc;

	if (n == 0 || n > (1u << 26) || bufsize == 0) {
		errno = EINVAL;
		return NULL;
	}
	bufsize = up(bufsize, 64);
	states_off = up(sizeof(*meta), 64);
	/* Buffers start on a 4 KiB boundary so DMA engines see aligned pages. */
	bufs_rel = up(states_off + sizeof(uint32_t) * n, 4096);
	total = bufs_rel + bufsize * n;
	rc = shm_region_add_area(reg, name, total, 4096, SHM_AREA_POOL, &off);
	if (rc < 0) {
		errno = -rc;
		return NULL;
	}
	meta = shm_ptr(reg, off);
	memset(meta, 0, sizeof(*meta));
	meta->n = n;
	meta->bufsize = bufsize;
	meta->states_off = states_off;
	meta->bufs_off = off + bufs_rel;
	memset((char *)meta + states_off, 0, sizeof(uint32_t) * n); /* every buffer FREE */
	meta->layout = SHM_POOL_LAYOUT;
	/* R4: publish; pairs with A4 in shm_pool_lookup(). */
	__atomic_store_n(&meta->magic, SHM_POOL_MAGIC, __ATOMIC_RELEASE);
	return wrap(reg, meta);
}

struct shm_pool *shm_pool_lookup(struct shm_region *reg, const char *name)
{
	struct shm_pool_meta *meta;
	uint64_t off;

	if (shm_region_find_area(reg, name, &off, NULL) < 0) {
		errno = ENOENT;
		return NULL;
	}
	meta = shm_ptr(reg, off);
	/* A4 */
	if (__atomic_load_n(&meta->magic, __ATOMIC_ACQUIRE) != SHM_POOL_MAGIC ||
	    meta->layout != SHM_POOL_LAYOUT) {
		errno = EPROTO;
		return NULL;
	}
	return wrap(reg, meta);
}

void shm_pool_close(struct shm_pool *p)
{
	free(p);
}

int shm_pool_get(struct shm_pool *p, uint32_t *idx)
{
	uint32_t start = atomic_load_explicit(&p->meta->cursor, memory_order_relaxed) % p->n;
	uint32_t me = (uint32_t)getpid();

	for (uint32_t j = 0, i = start; j < p->n; j++, i = i + 1 == p->n ? 0 : i + 1) {
		uint32_t expect = BUF_FREE;

		if (atomic_load_explicit(&p->states[i], memory_order_relaxed) != BUF_FREE)
			continue;
		/* acquire: pairs with put's release, so the last holder's writes are seen */
		if (atomic_compare_exchange_strong_explicit(&p->states[i], &expect, me, memory_order_acquire,
							    memory_order_relaxed)) {
			atomic_store_explicit(&p->meta->cursor, i + 1, memory_order_relaxed);
			*idx = i;
			return 0;
		}
	}
	return -ENOBUFS;
}

/* CAS state @p idx from a holder (any, or only @p only when it is not 0) to
 * @p to. @return 0, -EALREADY (it is free), -ESRCH (another holds it). */
static int swap_holder(struct shm_pool *p, uint32_t idx, uint32_t only, uint32_t to, memory_order mo)
{
	uint32_t s = atomic_load_explicit(&p->states[idx], memory_order_relaxed);

	for (;;) {
		if (s == BUF_FREE)
			return -EALREADY;
		if (only != 0 && s != only)
			return -ESRCH;
		if (atomic_compare_exchange_weak_explicit(&p->states[idx], &s, to, mo, memory_order_relaxed))
			return 0;
	}
}

int shm_pool_put(struct shm_pool *p, uint32_t idx)
{
	int rc;

	if (idx >= p->n)
		return -EINVAL;
	rc = swap_holder(p, idx, 0, BUF_FREE, memory_order_release);
	return rc < 0 ? rc : 0;
}

int shm_pool_take(struct shm_pool *p, uint32_t idx)
{
	if (idx >= p->n)
		return -EINVAL;
	return swap_holder(p, idx, 0, (uint32_t)getpid(), memory_order_acquire);
}

int shm_pool_pass(struct shm_pool *p, uint32_t idx, int32_t from, int32_t to)
{
	if (idx >= p->n || to < 0 || from < 0)
		return -EINVAL;
	/* acq_rel: the new holder sees the old one's writes, and hands its own on */
	return swap_holder(p, idx, (uint32_t)from, (uint32_t)to, memory_order_acq_rel);
}

uint32_t shm_pool_reclaim(struct shm_pool *p, int32_t pid)
{
	uint32_t n = 0;

	if (pid <= 1)
		return 0; /* 1: a layout-1 holder, or init: never taken for dead */
	for (uint32_t i = 0; i < p->n; i++)
		if (atomic_load_explicit(&p->states[i], memory_order_relaxed) == (uint32_t)pid
		    && swap_holder(p, i, (uint32_t)pid, BUF_FREE, memory_order_release) == 0)
			n++;
	return n;
}

uint32_t shm_pools_reclaim(struct shm_region *r, int32_t pid)
{
	char name[SHM_AREA_NAME_MAX];
	enum shm_area_kind kind;
	uint32_t n = 0;

	for (uint32_t i = 0; shm_region_area_at(r, i, name, &kind, NULL) == 0; i++) {
		struct shm_pool *p;

		if (kind != SHM_AREA_POOL || (p = shm_pool_lookup(r, name)) == NULL)
			continue;
		n += shm_pool_reclaim(p, pid);
		shm_pool_close(p);
	}
	return n;
}

int32_t shm_pool_holder(const struct shm_pool *p, uint32_t idx)
{
	if (idx >= p->n)
		return -EINVAL;
	return (int32_t)atomic_load_explicit(&p->states[idx], memory_order_acquire);
}

uint64_t shm_pool_buf_off(const struct shm_pool *p, uint32_t idx)
{
	return p->bufs_off + (uint64_t)idx * p->bufsize;
}

void *shm_pool_buf(const struct shm_pool *p, uint32_t idx)
{
	return p->bufs + (size_t)idx * p->bufsize;
}

int64_t shm_pool_idx_of(const struct shm_pool *p, uint64_t off)
{
	if (off < p->bufs_off || off >= p->bufs_off + (uint64_t)p->n * p->bufsize)
		return -EINVAL;
	return (int64_t)((off - p->bufs_off) / p->bufsize);
}

size_t shm_pool_bufsize(const struct shm_pool *p)
{
	return p->bufsize;
}

uint32_t shm_pool_count(const struct shm_pool *p)
{
	return p->n;
}

uint32_t shm_pool_available(const struct shm_pool *p)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < p->n; i++)
		n += atomic_load_explicit(&p->states[i], memory_order_relaxed) == BUF_FREE;
	return n;
}
