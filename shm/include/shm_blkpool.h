/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file shm_blkpool.h
 * A process-local pool of KV block ids [0, capacity) with reference counts:
 * what the scheduler hands out and every stage indexes. Ids are small
 * integers, not memory; the memory lives in each stage's KV pool.
 *
 * Invariants: an id is either free (refcount 0, on the free stack) or held
 * (refcount >= 1, not on the stack); alloc never returns a held id;
 * exhaustion is a return value. available() + held ids == capacity.
 *
 * Threading: not thread-safe; one owner thread (the scheduler) uses it.
 */
#ifndef SHM_BLKPOOL_H
#define SHM_BLKPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct shm_blkpool;

/**
 * Create a pool of @p capacity ids, all free.
 * @return the pool, or NULL with errno EINVAL (capacity < 1 or > INT32_MAX) or ENOMEM.
 */
struct shm_blkpool *shm_blkpool_create(int32_t capacity);

/** Destroy a pool; NULL is a no-op. */
void shm_blkpool_destroy(struct shm_blkpool *p);

/** @return the number of ids in the pool. */
int32_t shm_blkpool_capacity(const struct shm_blkpool *p);

/** @return the number of free ids. */
int32_t shm_blkpool_available(const struct shm_blkpool *p);

/**
 * Take @p n ids, each with refcount 1, all or nothing.
 * @param out receives the ids
 * @return 0, -EINVAL (n < 0 or out NULL with n > 0), -ENOSPC (fewer than n free: nothing taken).
 */
int shm_blkpool_alloc(struct shm_blkpool *p, int32_t n, int32_t *out);

/**
 * Add a reference to a held id (sharing a block, e.g. a common prefix).
 * @return 0, -EINVAL (id out of range), -EALREADY (id is free: nothing to share).
 */
int shm_blkpool_ref(struct shm_blkpool *p, int32_t id);

/**
 * Drop a reference; the id returns to the free stack when its count reaches 0.
 * @return the remaining count (>= 0), -EINVAL (id out of range), -EALREADY
 *         (id already free: a double release, refused, pool unchanged).
 */
int shm_blkpool_unref(struct shm_blkpool *p, int32_t id);

/**
 * Release @p n ids (unref each), e.g. a finished sequence's table row.
 * Stops at the first bad id. @return 0, or the first error of shm_blkpool_unref().
 */
int shm_blkpool_release(struct shm_blkpool *p, const int32_t *ids, int32_t n);

/** @return the refcount of @p id (0 if free), or -EINVAL if out of range. */
int shm_blkpool_refcount(const struct shm_blkpool *p, int32_t id);

#ifdef __cplusplus
}
#endif
#endif /* SHM_BLKPOOL_H */
