/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Buffer pools: [meta | state words | free ring | buffers], one area.
 * The free ring (MPMC rte_ring of uint32 indices) is the free list; the
 * per-buffer state word is the authority on ownership:
 *   get: dequeue idx, then CAS state FREE→HELD (a failure means the list
 *        and the states disagree: the index is dropped, never handed out);
 *   put: CAS state HELD→FREE (a failure is a double release: refused),
 *        then enqueue idx.
 * The ring has room for 2n indices: in RTS mode the consumer tail advances
 * only when the last concurrent dequeuer finishes, so slots freed by a get
 * can still count as used while the same index is put back. The spare room
 * makes a retry of put's enqueue rare; it always succeeds once the stalled
 * dequeuer finishes.
 */
#include <sched.h>
#include <errno.h>
#include <assert.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <rte_ring.h>
#include <rte_ring_elem.h>

#include "shm_pool.h"

#define SHM_POOL_MAGIC 0x4c4f4f50u /* "POOL" */
#define SHM_POOL_LAYOUT 1u

enum { BUF_FREE = 0, BUF_HELD = 1 };

struct shm_pool_meta {
	uint32_t magic;
	uint32_t layout;
	uint32_t n;
	uint32_t reserved0;
	uint64_t bufsize;
	uint64_t states_off;  /* from meta */
	uint64_t ring_off;    /* from meta */
	uint64_t bufs_off;    /* from the region base */
	uint8_t reserved[24];
};
static_assert(sizeof(struct shm_pool_meta) == 72, "pool meta layout");
static_assert(offsetof(struct shm_pool_meta, bufsize) == 16, "bufsize at 16");
static_assert(offsetof(struct shm_pool_meta, bufs_off) == 40, "bufs_off at 40");

struct shm_pool {
	struct shm_pool_meta *meta;
	_Atomic uint32_t *states;
	struct rte_ring *ring;
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
	p->ring = (struct rte_ring *)((char *)meta + meta->ring_off);
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
	size_t states_off, ring_off, bufs_rel, total;
	ssize_t rsz;
	uint64_t off;
	int rc;

	if (n == 0 || n > (1u << 26) || bufsize == 0) {
		errno = EINVAL;
		return NULL;
	}
	bufsize = up(bufsize, 64);
	rsz = rte_ring_get_memsize_elem(sizeof(uint32_t), rte_align32pow2(2 * n + 1));
	if (rsz < 0) {
		errno = EINVAL;
		return NULL;
	}
	states_off = up(sizeof(*meta), 64);
	ring_off = up(states_off + sizeof(uint32_t) * n, 128);
	/* Buffers start on a 4 KiB boundary so DMA engines see aligned pages. */
	bufs_rel = up(ring_off + (size_t)rsz, 4096);
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
	meta->ring_off = ring_off;
	meta->bufs_off = off + bufs_rel;
	memset((char *)meta + states_off, 0, sizeof(uint32_t) * n);
	/* RTS mode: see ring.c on preempted peers. */
	rc = rte_ring_init((struct rte_ring *)((char *)meta + ring_off), name, 2 * n,
			   RING_F_EXACT_SZ | RING_F_MP_RTS_ENQ | RING_F_MC_RTS_DEQ);
	if (rc < 0) {
		errno = -rc;
		return NULL;
	}
	for (uint32_t i = 0; i < n; i++)
		rte_ring_enqueue_elem((struct rte_ring *)((char *)meta + ring_off), &i,
				      sizeof(uint32_t));
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
	uint32_t i;

	for (;;) {
		uint32_t expect = BUF_FREE;

		if (rte_ring_dequeue_elem(p->ring, &i, sizeof(i)) != 0)
			return -ENOBUFS;
		if (i < p->n && atomic_compare_exchange_strong_explicit(
					&p->states[i], &expect, BUF_HELD, memory_order_acquire,
					memory_order_relaxed)) {
			*idx = i;
			return 0;
		}
		/* An index whose state was not FREE is never handed out. */
	}
}

int shm_pool_put(struct shm_pool *p, uint32_t idx)
{
	uint32_t expect = BUF_HELD;

	if (idx >= p->n)
		return -EINVAL;
	if (!atomic_compare_exchange_strong_explicit(&p->states[idx], &expect, BUF_FREE,
						     memory_order_release, memory_order_relaxed))
		return -EALREADY;
	while (rte_ring_enqueue_elem(p->ring, &idx, sizeof(idx)) != 0)
		sched_yield(); /* a preempted dequeuer holds the tail: see the top */
	return 0;
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
	return rte_ring_count(p->ring);
}
