/* SPDX-License-Identifier: Apache-2.0 */
/** @file embed.cuh Embedding gather: bf16 table rows to the f32 residual stream. */
#ifndef KN_CU_EMBED_CUH
#define KN_CU_EMBED_CUH
#include "cu_common.cuh"

/**
 * out[c][:] = f32(table[cols[c].token][:]) for c < n (padding columns, slot
 * -1, gather row 0 so every row is defined).
 * @param table  [vocab][hidden] bf16
 * @param cols   [n] device columns
 * @param out    [n][hidden] f32
 * @return the launch's cudaError_t.
 */
cudaError_t kn_cuda_embed(const kn_bf16 *table, const struct kn_column *cols, int n,
			  int hidden, float *out, cudaStream_t st);
#endif
