/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Rings: rte_ring placed in region memory with rte_ring_init(), driven with
 * the inline *_elem calls, so no EAL is ever initialised.
 *
 * Sleep/wake invariant (a Dekker pair across processes):
 *   consumer: W1 waiters += 1 (seq_cst RMW) ; then re-reads the ring tail;
 *             sleeps on wake_seq only if the ring is still empty.
 *   producer: publishes the tail (release, inside rte_ring) ; F1 full fence ;
 *             then reads waiters and, if non-zero, bumps wake_seq and wakes.
 * W1 and F1 order each side's store before its load, so at least one side
 * sees the other: either the consumer finds the element or the producer
 * finds the waiter.
 *
 * Asymmetric fences: a full fence per burst on the producer drains its
 * store buffer, which across cores costs a cache-line round trip per burst
 * (bench_ring, 2 processes, 16-byte elements: 2.1-3.0x raw rte_ring with
 * the fence). So when the kernel offers membarrier(GLOBAL_EXPEDITED), each
 * process registers once, F1 becomes a compiler barrier, and the consumer,
 * after W1 and before re-reading the ring, calls membarrier(), which runs a
 * full barrier on every CPU running a registered process (~0.4 us here, on
 * the sleep path only). A producer that read waiters before the IPI had its
 * tail store flushed by it (the consumer's re-check sees the element); one
 * that reads after it sees W1. A process whose registration fails keeps the
 * real fence. The wake_seq snapshot is taken before W1, so a bump
 * that lands between the re-check and the futex call makes FUTEX_WAIT
 * return at once (EAGAIN) instead of sleeping through it.
 * Cost: F1 is one fence per enqueue burst on the producer; the wake syscall
 * happens only while a consumer sleeps.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <rte_ring.h>
#include <rte_ring_elem.h>

#include "ring_abi.h"
#include "shm_ring.h"

/* Spin this many empty checks before sleeping: ~1-2 µs, shorter than a
 * futex round trip, so a consumer that is fed steadily never sleeps. */
#define WAIT_SPINS 256

int shm_ring_asym_;
static int g_asym_checked;

/* Register this process for expedited global membarriers (once). */
static void asym_init(void)
{
	if (__atomic_exchange_n(&g_asym_checked, 1, __ATOMIC_ACQ_REL))
		return;
	if (getenv("KVFERRY_RING_FENCE") == NULL &&
	    syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0)
		__atomic_store_n(&shm_ring_asym_, 1, __ATOMIC_RELEASE);
}

static long futex(_Atomic uint32_t *uaddr, int op, uint32_t val, const struct timespec *ts)
{
	return syscall(SYS_futex, (uint32_t *)uaddr, op, val, ts, NULL, 0);
}

static struct shm_ring *wrap(void *area)
{
	struct shm_ring *q;

	asym_init();
	q = malloc(sizeof(*q));
	if (q == NULL) {
		errno = ENOMEM;
		return NULL;
	}
	struct shm_ring_meta *meta = area;

	q->meta = meta;
	q->r = (struct rte_ring *)((char *)area + SHM_RING_META_BYTES);
	q->waiters = &meta->waiters;
	q->wake_seq = &meta->wake_seq;
	q->esize = meta->esize;
	q->count = meta->count;
	return q;
}

struct shm_ring *shm_ring_create(struct shm_region *reg, const char *name, unsigned count,
				 unsigned esize, unsigned flags)
{
	struct shm_ring_meta *meta;
	unsigned rflags = RING_F_EXACT_SZ;
	ssize_t rsz;
	uint64_t off;
	int rc;

	if (count == 0 || count > (1u << 28) || esize == 0 || esize % 4 != 0 ||
	    (flags & ~(SHM_RING_MP | SHM_RING_MC)) != 0) {
		errno = EINVAL;
		return NULL;
	}
	/* RING_F_EXACT_SZ gives exactly `count` usable slots in a power-of-two
	 * array of at least count + 1 elements. */
	rsz = rte_ring_get_memsize_elem(esize, rte_align32pow2(count + 1));
	if (rsz < 0) {
		errno = EINVAL;
		return NULL;
	}
	rc = shm_region_add_area(reg, name, SHM_RING_META_BYTES + (size_t)rsz, 128, SHM_AREA_RING,
				 &off);
	if (rc < 0) {
		errno = -rc;
		return NULL;
	}
	meta = shm_ptr(reg, off);
	memset(meta, 0, SHM_RING_META_BYTES);
	/* Shared ends use the RTS (relaxed tail sync) mode: with more processes
	 * than cores, the default MP/MC mode spins on a preempted peer's tail
	 * update; RTS lets the others finish (measured in test_pool: 4 processes
	 * on 2 cores, default mode did not finish 800k get/put in 60 s). */
	rflags |= (flags & SHM_RING_MP) ? RING_F_MP_RTS_ENQ : RING_F_SP_ENQ;
	rflags |= (flags & SHM_RING_MC) ? RING_F_MC_RTS_DEQ : RING_F_SC_DEQ;
	rc = rte_ring_init((struct rte_ring *)((char *)meta + SHM_RING_META_BYTES), name, count,
			   rflags);
	if (rc < 0) {
		errno = -rc;
		return NULL;
	}
	meta->esize = esize;
	meta->count = count;
	meta->flags = flags;
	meta->layout = SHM_RING_LAYOUT;
	/* R3: publish the ring; pairs with A3 in shm_ring_lookup(). */
	__atomic_store_n(&meta->magic, SHM_RING_MAGIC, __ATOMIC_RELEASE);
	return wrap(meta);
}

struct shm_ring *shm_ring_lookup(struct shm_region *reg, const char *name)
{
	struct shm_ring_meta *meta;
	uint64_t off;

	if (shm_region_find_area(reg, name, &off, NULL) < 0) {
		errno = ENOENT;
		return NULL;
	}
	meta = shm_ptr(reg, off);
	/* A3 */
	if (__atomic_load_n(&meta->magic, __ATOMIC_ACQUIRE) != SHM_RING_MAGIC ||
	    meta->layout != SHM_RING_LAYOUT) {
		errno = EPROTO;
		return NULL;
	}
	return wrap(meta);
}

void shm_ring_close(struct shm_ring *q)
{
	free(q);
}

void shm_ring_wake_(struct shm_ring *q)
{
	atomic_fetch_add_explicit(q->wake_seq, 1, memory_order_release);
	futex(q->wake_seq, FUTEX_WAKE, INT_MAX, NULL);
}

int shm_ring_wait(struct shm_ring *q, int64_t timeout_ns)
{
	struct timespec ts, *tsp = NULL;
	uint32_t seq;
	long rc;

	for (int i = 0; i < WAIT_SPINS; i++) {
		if (rte_ring_count(q->r) > 0)
			return 0;
		rte_pause();
	}
	if (timeout_ns == 0)
		return -ETIMEDOUT;
	if (timeout_ns > 0) {
		ts.tv_sec = timeout_ns / 1000000000;
		ts.tv_nsec = timeout_ns % 1000000000;
		tsp = &ts;
	}
	seq = atomic_load_explicit(q->wake_seq, memory_order_acquire);
	/* W1 */
	atomic_fetch_add_explicit(q->waiters, 1, memory_order_seq_cst);
	/* The producers' half of F1 when they skip their fence; harmless when
	 * they keep it (the call then orders nothing they rely on). */
	syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0);
	if (rte_ring_count(q->r) > 0) {
		atomic_fetch_sub_explicit(q->waiters, 1, memory_order_relaxed);
		return 0;
	}
	rc = futex(q->wake_seq, FUTEX_WAIT, seq, tsp);
	atomic_fetch_sub_explicit(q->waiters, 1, memory_order_relaxed);
	if (rte_ring_count(q->r) > 0)
		return 0;
	if (rc != 0 && errno == ETIMEDOUT)
		return -ETIMEDOUT;
	if (rc != 0 && errno == EINTR)
		return -EINTR;
	/* Woken (or seq moved) but another consumer took the element. */
	return timeout_ns < 0 ? shm_ring_wait(q, timeout_ns) : -ETIMEDOUT;
}

static int any_ready(struct shm_ring *const *q, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (q[i] != NULL && rte_ring_count(q[i]->r) > 0)
			return 1;
	return 0;
}

/* The same Dekker pair as shm_ring_wait(), once per ring: W1 on each, one
 * membarrier, the re-check of all, then one futex_waitv on every wake_seq
 * (Linux >= 5.16). Where the call is missing the wait is on the first ring
 * only, for at most 1 ms, so the others are polled at that rate. */
int shm_ring_wait_any(struct shm_ring *const *q, unsigned n, int64_t timeout_ns)
{
	struct futex_waitv fw[SHM_RING_WAIT_MAX];
	struct timespec ts, *tsp = NULL;
	unsigned m = 0;
	long rc;

	if (n > SHM_RING_WAIT_MAX)
		return -EINVAL;
	for (int i = 0; i < WAIT_SPINS; i++) {
		if (any_ready(q, n))
			return 0;
		rte_pause();
	}
	if (timeout_ns == 0)
		return -ETIMEDOUT;
	if (timeout_ns > 0) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += timeout_ns / 1000000000;
		ts.tv_nsec += timeout_ns % 1000000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		tsp = &ts;
	}
	for (unsigned i = 0; i < n; i++) {
		if (q[i] == NULL)
			continue;
		fw[m] = (struct futex_waitv){ .val = atomic_load_explicit(q[i]->wake_seq, memory_order_acquire),
					      .uaddr = (uintptr_t)q[i]->wake_seq, .flags = FUTEX_32 };
		atomic_fetch_add_explicit(q[i]->waiters, 1, memory_order_seq_cst); /* W1 */
		m++;
	}
	syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0);
	if (any_ready(q, n)) {
		rc = 0;
	} else {
		rc = syscall(SYS_futex_waitv, fw, m, 0, tsp, CLOCK_MONOTONIC);
		if (rc < 0 && errno == ENOSYS && m > 0) {
			struct timespec ms = { 0, 1000000 };

			rc = futex((_Atomic uint32_t *)(uintptr_t)fw[0].uaddr, FUTEX_WAIT, (uint32_t)fw[0].val,
				   timeout_ns > 0 && timeout_ns < 1000000 ? &(struct timespec){ 0, timeout_ns } : &ms);
			if (rc != 0 && errno == ETIMEDOUT && (timeout_ns < 0 || timeout_ns > 1000000))
				errno = EAGAIN; /* polled: not the caller's timeout yet */
		}
	}
	for (unsigned i = 0; i < n; i++)
		if (q[i] != NULL)
			atomic_fetch_sub_explicit(q[i]->waiters, 1, memory_order_relaxed);
	if (any_ready(q, n))
		return 0;
	if (rc < 0 && errno == ETIMEDOUT)
		return -ETIMEDOUT;
	if (rc < 0 && errno == EINTR)
		return -EINTR;
	return -EAGAIN; /* woken, and another consumer took it, or polled */
}

unsigned shm_ring_count(const struct shm_ring *q)
{
	return rte_ring_count(q->r);
}

unsigned shm_ring_free_count(const struct shm_ring *q)
{
	return rte_ring_free_count(q->r);
}

unsigned shm_ring_capacity(const struct shm_ring *q)
{
	return rte_ring_get_capacity(q->r);
}

unsigned shm_ring_esize(const struct shm_ring *q)
{
	return q->esize;
}

unsigned shm_ring_reset(struct shm_ring *q)
{
	unsigned n = rte_ring_count(q->r);

	rte_ring_reset(q->r);
	atomic_store_explicit(q->waiters, 0, memory_order_relaxed);
	atomic_fetch_add_explicit(q->wake_seq, 1, memory_order_release);
	return n;
}
