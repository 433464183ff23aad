/* SPDX-License-Identifier: Apache-2.0 */
/** @file gather.cuh Pieces of pinned host memory into device memory, by one kernel. */
#ifndef KN_CU_GATHER_CUH
#define KN_CU_GATHER_CUH
#include "cu_common.cuh"

/** One piece: @p len bytes from @p src (a device-visible alias of pinned host memory) to @p dst. */
struct cu_piece {
	const uint8_t *src;
	uint8_t *dst;
	uint64_t len;
};

/**
 * Copy every piece of @p pc (@p n of them; the table itself in memory the
 * device reads: mapped pinned host memory or device memory) in one launch:
 * a block per piece, each thread moving aligned 4-byte words of the
 * destination read from the source's two neighbouring words, whatever the
 * two addresses' alignments (a received frame's payload starts where its
 * headers end). The KV page messages received in place come as one piece
 * per frame (~9 KB): one DMA each cost more than the bytes (cu_kv_import_segs).
 * @return the launch's cudaError_t.
 */
cudaError_t kn_cuda_gather(const struct cu_piece *pc, int n, cudaStream_t st);
#endif
