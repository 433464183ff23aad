/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Layout of a ring area: a 128-byte meta block (identity on the first cache
 * line, the consumer's wait words on the second, so the producer's reads of
 * `waiters` never share a line with the identity fields), then the rte_ring
 * (its own producer and consumer heads sit on separate cache lines).
 */
#ifndef SHM_RING_ABI_H
#define SHM_RING_ABI_H

#include <assert.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define SHM_RING_MAGIC 0x474e4952u /* "RING" */
#define SHM_RING_LAYOUT 1u
#define SHM_RING_META_BYTES 128u

struct shm_ring_meta {
	uint32_t magic;
	uint32_t layout;
	uint32_t esize;
	uint32_t count;       /* usable capacity (RING_F_EXACT_SZ) */
	uint32_t flags;
	uint32_t reserved[11];
	/* second cache line: the sleep/wake words */
	_Atomic uint32_t waiters;  /* consumers inside shm_ring_wait() */
	_Atomic uint32_t wake_seq; /* futex word: bumped by a producer that saw waiters */
	uint32_t reserved2[14];
};
static_assert(sizeof(struct shm_ring_meta) == SHM_RING_META_BYTES, "ring meta is 128 bytes");
static_assert(offsetof(struct shm_ring_meta, esize) == 8, "esize at 8");
static_assert(offsetof(struct shm_ring_meta, count) == 12, "count at 12");
static_assert(offsetof(struct shm_ring_meta, waiters) == 64, "waiters on its own line");
static_assert(offsetof(struct shm_ring_meta, wake_seq) == 68, "wake_seq beside waiters");

#endif /* SHM_RING_ABI_H */
