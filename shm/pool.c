/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Buffer pools: [meta | state words | free ring | buffers], one area.
 * The free ring (MPMC rte_ring of uint32 indices) is the free list; the
 * per-buffer state word is the authority on ownership: FREE (0), or the pid
 * of the process holding it (layout 2; layout 1 wrote 1 for any holder):
 *   get: dequeue idx, then CAS state FREE→pid (a failure means the list
 *        and the states disagree: the index is dropped, never handed out);
 *   take: CAS state holder→pid (the process a descriptor handed the buffer
 *        to says it holds it now);
 *   put: CAS state holder→FREE (FREE already is a double release: refused),
 *        then enqueue idx;
 *   reclaim: CAS state dead pid→FREE, then enqueue: what a killed process
 *        held goes back (before, a receive buffer a SIGKILLed worker was
 *        computing from was lost to the pool until the region was made
 *        again: the fault drill's remote-worker-kill, 1 of 144).
 * The ring has room for 2n indices: in RTS mode the consumer tail advances
 * only when the last concurrent dequeuer finishes, so slots freed by a get
 * can still count as used while the same index is put back. The spare room
 * makes a retry of put's enqueue rare; it always succeeds once the stalled
 * dequeuer finishes.
 */
#include <sched.h>
#include <errno.h>
#include <unistd.h>
#include <assert.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <rte_ring.h>
#include <rte_ring_elem.h>

#include "shm_pool.h"

#define SHM_POOL_MAGIC 0x4c4f4f50u /* "POOL" */
#define SHM_POOL_LAYOUT 2u

enum { BUF_FREE = 0 };

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
					&p->states[i], &expect, (uint32_t)getpid(), memory_order_acquire,
					memory_order_relaxed)) {
			*idx = i;
			return 0;
		}
		/* An index whose state was not FREE is never handed out. */
	}
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

static void requeue(struct shm_pool *p, uint32_t idx)
{
	while (rte_ring_enqueue_elem(p->ring, &idx, sizeof(idx)) != 0)
		sched_yield(); /* a preempted dequeuer holds the tail: see the top */
}

int shm_pool_put(struct shm_pool *p, uint32_t idx)
{
	int rc;

	if (idx >= p->n)
		return -EINVAL;
	rc = swap_holder(p, idx, 0, BUF_FREE, memory_order_release);
	if (rc < 0)
		return rc;
	requeue(p, idx);
	return 0;
}

int shm_pool_take(struct shm_pool *p, uint32_t idx)
{
	if (idx >= p->n)
		return -EINVAL;
	return swap_holder(p, idx, 0, (uint32_t)getpid(), memory_order_acquire);
}

uint32_t shm_pool_reclaim(struct shm_pool *p, int32_t pid)
{
	uint32_t n = 0;

	if (pid <= 1)
		return 0; /* 1: a layout-1 holder, or init: never taken for dead */
	for (uint32_t i = 0; i < p->n; i++)
		if (atomic_load_explicit(&p->states[i], memory_order_relaxed) == (uint32_t)pid
		    && swap_holder(p, i, (uint32_t)pid, BUF_FREE, memory_order_release) == 0) {
			requeue(p, i);
			n++;
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
	return rte_ring_count(p->ring);
}
