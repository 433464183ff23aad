/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file shm_pool.h
 * A pool of fixed-size buffers inside a region (micro-batch buffers, KV page
 * staging), shared by several processes. A state word per buffer is the
 * whole pool: FREE, or the pid that holds the buffer.
 *
 * Invariants: get() flips one FREE state to the caller's pid, put() flips a
 * held one to FREE, each in one compare-and-swap, so a buffer is never
 * handed out twice, a double release is refused, exhaustion is a return
 * value, and a process killed at any point leaves every buffer free or held
 * by its pid (crash-safe: there is no list to leave half-updated). A process
 * a buffer was handed to (a descriptor on a ring) says so with take();
 * whoever sees a holder die gives what it held back with reclaim().
 *
 * Threading: any number of threads and processes may get/put concurrently.
 */
#ifndef SHM_POOL_H
#define SHM_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "shm_region.h"

#ifdef __cplusplus
extern "C" {
#endif

struct shm_pool;

/**
 * Create a pool of @p n buffers of @p bufsize bytes (rounded up to 64) in @p r.
 * @return the handle, or NULL with errno EINVAL, EEXIST, ENOSPC, ENOMEM.
 */
struct shm_pool *shm_pool_create(struct shm_region *r, const char *name, uint32_t n,
				 size_t bufsize);

/** Find a pool another process created. @return handle or NULL (ENOENT, EPROTO). */
struct shm_pool *shm_pool_lookup(struct shm_region *r, const char *name);

/** Free the process-local handle. */
void shm_pool_close(struct shm_pool *p);

/**
 * Take a free buffer.
 * @param idx receives its index
 * @return 0, or -ENOBUFS (pool exhausted).
 */
int shm_pool_get(struct shm_pool *p, uint32_t *idx);

/**
 * Return a buffer.
 * @return 0, -EINVAL (index out of range), -EALREADY (already free: double release refused).
 */
int shm_pool_put(struct shm_pool *p, uint32_t idx);

/**
 * Say that this process holds buffer @p idx now (it was handed to it, e.g.
 * by a receive descriptor), so that reclaim() gives it back if this process
 * dies before it puts it.
 * @return 0, -EINVAL (index out of range), -EALREADY (it is free).
 */
int shm_pool_take(struct shm_pool *p, uint32_t idx);

/**
 * Hand buffer @p idx from holder @p from (a pid; 0: whoever holds it) to
 * holder @p to (a pid; 0: back to the pool, a put that happens only while
 * @p from holds it). A producer passes a buffer to the process that will
 * consume it before it enqueues it, and the consumer passes it on to
 * itself from that pid when it dequeues it: a consumer killed between its
 * dequeue and its take then leaves a buffer held by a dead pid, which
 * shm_pool_reclaim() gives back, and a successor consuming the same ring
 * takes only a buffer still held by the pid it was passed to (a reclaimed
 * one may be in use again).
 * @return 0, -EINVAL (index out of range, or a negative pid), -EALREADY
 * (it is free), -ESRCH (another than @p from holds it).
 */
int shm_pool_pass(struct shm_pool *p, uint32_t idx, int32_t from, int32_t to);

/**
 * Give back every buffer process @p pid holds: call it once @p pid is known
 * dead (its liveness slot, shm_live.h), never for a live one.
 * @return the number of buffers returned.
 */
uint32_t shm_pool_reclaim(struct shm_pool *p, int32_t pid);

/**
 * shm_pool_reclaim() for @p pid in every pool of region @p r: what a dead
 * process held anywhere goes back. Only once nothing can still read those
 * buffers for it (the dataplane calls it when the dead process's sends have
 * all completed).
 * @return the buffers given back.
 */
uint32_t shm_pools_reclaim(struct shm_region *r, int32_t pid);

/**
 * Who holds buffer @p idx now, by one relaxed load: for a process that
 * handed buffers out and waits for them to come back (the dataplane's
 * receive-in-place messages, whose frames it frees once the consumer's put
 * or a reclaim made the buffer free).
 * @return the holder's pid, 0 (free), or -EINVAL (index out of range).
 */
int32_t shm_pool_holder(const struct shm_pool *p, uint32_t idx);

/** @return the buffer's offset in the region. */
uint64_t shm_pool_buf_off(const struct shm_pool *p, uint32_t idx);
/** @return the buffer's address in this process. */
void *shm_pool_buf(const struct shm_pool *p, uint32_t idx);
/** @return the buffer index holding region offset @p off, or -EINVAL. */
int64_t shm_pool_idx_of(const struct shm_pool *p, uint64_t off);
/** @return buffer size. */
size_t shm_pool_bufsize(const struct shm_pool *p);
/** @return number of buffers. */
uint32_t shm_pool_count(const struct shm_pool *p);
/** @return free buffers now (a count of the state words: O(n)). */
uint32_t shm_pool_available(const struct shm_pool *p);

#ifdef __cplusplus
}
#endif
#endif /* SHM_POOL_H */
