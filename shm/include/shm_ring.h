/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file shm_ring.h
 * Lock-free rings of fixed-size descriptors inside a region: DPDK's rte_ring
 * laid out in region memory (rte_ring_init on it; the enqueue/dequeue calls
 * are inline and need no EAL), plus a wait word beside it so a consumer that
 * is not a poll loop can sleep (futex) and be woken by the producer only when
 * it sleeps.
 *
 * Prefer one SPSC ring per producer/consumer pair (a dead process can wedge
 * only its own rings); SHM_RING_MP / SHM_RING_MC only where several
 * processes must share one ring.
 *
 * Threading: per ring, as many concurrent producers/consumers as its flags
 * allow (SPSC: one of each). Any number of threads may read counts.
 */
#ifndef SHM_RING_H
#define SHM_RING_H

#include <stddef.h>
#include <stdint.h>

#include "shm_region.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The standard descriptor: what moves between processes (32 bytes). */
struct shm_desc {
	uint64_t off;    /**< payload offset in the region */
	uint32_t len;    /**< payload bytes */
	uint16_t type;   /**< message type (module-defined) */
	uint16_t flags;
	uint64_t seq;    /**< sequence number (module-defined) */
	uint64_t aux;    /**< module-defined: peer/stream, group id, status... */
};
_Static_assert(sizeof(struct shm_desc) == 32, "shm_desc is a 32-byte ABI record");

/* Ring flags */
#define SHM_RING_MP 0x1u  /**< several producers */
#define SHM_RING_MC 0x2u  /**< several consumers */

struct shm_ring;

/**
 * Create a ring named @p name in region @p r.
 * @param count  capacity in elements (rounded up to a power of two; usable count - 1... see
 *               shm_ring_capacity())
 * @param esize  element size in bytes: a multiple of 4 (16 and 32 are typical)
 * @return a process-local handle, or NULL with errno EINVAL, EEXIST, ENOSPC, ENOMEM.
 */
struct shm_ring *shm_ring_create(struct shm_region *r, const char *name, unsigned count,
				 unsigned esize, unsigned flags);

/**
 * Find a ring another process created.
 * @return the handle, or NULL with errno ENOENT or EPROTO (not a ring / layout version).
 */
struct shm_ring *shm_ring_lookup(struct shm_region *r, const char *name);

/** Free the process-local handle (the ring stays in the region). */
void shm_ring_close(struct shm_ring *q);

/*
 * The fast path is inline (shm_ring_pvt.h, included below; never include it
 * directly):
 *
 * unsigned shm_ring_enqueue_burst(struct shm_ring *q, const void *objs, unsigned n);
 *   Enqueue up to @p n elements (objs holds n * esize bytes); wakes a
 *   sleeping consumer. @return the number enqueued (0..n).
 *
 * unsigned shm_ring_dequeue_burst(struct shm_ring *q, void *objs, unsigned n);
 *   Dequeue up to @p n elements into @p objs. @return the number dequeued.
 */

/**
 * Sleep until the ring is non-empty or @p timeout_ns passes (< 0: forever).
 * Spins briefly first. @return 0 (non-empty), -ETIMEDOUT, -EINTR.
 */
int shm_ring_wait(struct shm_ring *q, int64_t timeout_ns);

/** The most rings shm_ring_wait_any() watches. */
#define SHM_RING_WAIT_MAX 8

/**
 * Sleep until any of @p n rings (NULL entries are skipped; at most
 * SHM_RING_WAIT_MAX) is non-empty or @p timeout_ns passes (< 0: no bound):
 * for a consumer fed by several producers, none of which knows the others'
 * rings. Spins briefly first. Each ring's producers wake it as they would
 * a shm_ring_wait() on that ring.
 * @return 0 (one is non-empty), -ETIMEDOUT, -EINTR, -EAGAIN (woken with
 *         nothing left to take: call again), -EINVAL (too many rings).
 */
int shm_ring_wait_any(struct shm_ring *const *q, unsigned n, int64_t timeout_ns);

/** @return elements in the ring now. */
unsigned shm_ring_count(const struct shm_ring *q);
/** @return free space now. */
unsigned shm_ring_free_count(const struct shm_ring *q);
/** @return usable capacity. */
unsigned shm_ring_capacity(const struct shm_ring *q);
/** @return the element size. */
unsigned shm_ring_esize(const struct shm_ring *q);

/**
 * Empty the ring and clear its wait state, discarding whatever was in flight
 * (the region's owner does this after the ring's producer or consumer died:
 * descriptors in it are lost, so their owner must treat them as failed).
 * Only safe while no live process uses the ring.
 * @return the number of elements discarded.
 */
unsigned shm_ring_reset(struct shm_ring *q);

/** Wake sleeping consumers (the slow half of the producer's wake check). */
void shm_ring_wake_(struct shm_ring *q);

#ifdef __cplusplus
}
#endif

#include "shm_ring_pvt.h"

#endif /* SHM_RING_H */
