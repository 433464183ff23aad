/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file kn_pool.h
 * Private: a fixed pthread pool for the CPU engine. kn_pool_run() calls
 * fn(arg, tid, n) on every thread (the caller is tid 0) and returns when all
 * have finished. Work is split by the callee by tid, so which thread computes
 * an output element never changes its bits (each element is reduced by one
 * thread in a fixed order).
 *
 * Threading: one thread calls kn_pool_run() at a time.
 */
#ifndef KN_POOL_H
#define KN_POOL_H

struct kn_pool;

typedef void (*kn_pool_fn)(void *arg, int tid, int n);

/** @return a pool of @p n threads (n - 1 workers + the caller), or NULL + errno. */
struct kn_pool *kn_pool_create(int n);

/** @return the pool's thread count (>= 1). */
int kn_pool_size(const struct kn_pool *p);

/** Run @p fn on every thread and wait for all. */
void kn_pool_run(struct kn_pool *p, kn_pool_fn fn, void *arg);

/** Stop and join the workers; NULL is a no-op. */
void kn_pool_destroy(struct kn_pool *p);

#endif /* KN_POOL_H */
