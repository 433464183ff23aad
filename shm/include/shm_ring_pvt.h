/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Inline fast path of shm_ring.h: do not include directly.
 *
 * Inline because the ring calls are the hot path between processes: out of
 * line, the call plus a runtime element size cost 1.2-1.6x raw rte_ring in
 * the same-core benchmark (bench_ring) even with the wake check removed.
 * The wake protocol (W1/F1) is described in shm/ring.c.
 */
#ifndef SHM_RING_PVT_H
#define SHM_RING_PVT_H

#ifndef SHM_RING_H
#error "include shm_ring.h, not shm_ring_pvt.h"
#endif

#include <stdatomic.h>

#include <rte_ring.h>
#include <rte_ring_elem.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The process-local handle (not shared memory). */
struct shm_ring {
	struct rte_ring *r;
	_Atomic uint32_t *waiters;   /* consumers asleep in shm_ring_wait() */
	_Atomic uint32_t *wake_seq;  /* futex word */
	void *meta;
	unsigned esize;
	unsigned count;
};

/* 1 when this process is registered for membarrier(GLOBAL_EXPEDITED): a
 * sleeping consumer then forces the barrier onto producers, and the
 * producer's F1 is a compiler barrier only (see shm/ring.c). */
extern int shm_ring_asym_;

static inline unsigned shm_ring_enqueue_burst(struct shm_ring *q, const void *objs, unsigned n)
{
	unsigned done = rte_ring_enqueue_burst_elem(q->r, objs, q->esize, n, NULL);

	if (done > 0) {
		/* F1: order the tail store (release, inside rte_ring) before
		 * reading waiters; pairs with W1 in shm_ring_wait(). */
		if (shm_ring_asym_)
			atomic_signal_fence(memory_order_seq_cst);
		else
			atomic_thread_fence(memory_order_seq_cst);
		if (atomic_load_explicit(q->waiters, memory_order_relaxed) != 0)
			shm_ring_wake_(q);
	}
	return done;
}

static inline unsigned shm_ring_dequeue_burst(struct shm_ring *q, void *objs, unsigned n)
{
	return rte_ring_dequeue_burst_elem(q->r, objs, q->esize, n, NULL);
}

#ifdef __cplusplus
}
#endif
#endif /* SHM_RING_PVT_H */
