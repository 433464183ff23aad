/* SPDX-License-Identifier: Apache-2.0 */
/** @file fill.cuh Deterministic pseudo-random and constant fills (benchmark weights, poisoning). */
#ifndef KN_CU_FILL_CUH
#define KN_CU_FILL_CUH
#include "cu_common.cuh"

/**
 * dst[i] = bf16(scale * (2u - 1)) with u uniform [0,1) hashed from (seed, i):
 * the same (seed, count) gives the same bytes on any launch shape.
 * @return the launch's cudaError_t.
 */
cudaError_t kn_cuda_fill_bf16(kn_bf16 *dst, size_t count, uint64_t seed, float scale,
			      cudaStream_t st);

/** dst[i] = base + scale * (2u - 1), f32, same hashing. @return the launch's cudaError_t. */
cudaError_t kn_cuda_fill_f32(float *dst, size_t count, uint64_t seed, float base, float scale,
			     cudaStream_t st);
#endif
