/* SPDX-License-Identifier: Apache-2.0 */
/** @file swiglu.cuh SwiGLU activation: silu(gate) * up. */
#ifndef KN_CU_SWIGLU_CUH
#define KN_CU_SWIGLU_CUH
#include "cu_common.cuh"

/**
 * out[r][i] = silu(gu[r][i]) * gu[r][inter + i] in f32 for r < n, i < inter.
 * @param gu   [n][2*inter] f32 (gate rows first, then up: the fused projection)
 * @param gu_segs  0, or gu as that many segment sums of the projection,
 *             [gu_segs][n][2*inter] (kn_parts_ld(): the bits of their fold)
 * @param out  [n][inter] f32
 * @return the launch's cudaError_t.
 */
cudaError_t kn_cuda_swiglu(const float *gu, int gu_segs, int n, int inter, float *out, cudaStream_t st);

/**
 * kn_cuda_swiglu() with the result rounded to bf16 (round to nearest per
 * element: the same bits as the f32 result rounded by gemm.cuh), for wide
 * plans' down projection through kn_cuda_linear_bf16().
 * @param out  [n][inter] bf16
 * @return the launch's cudaError_t.
 */
cudaError_t kn_cuda_swiglu_bf16(const float *gu, int gu_segs, int n, int inter, kn_bf16 *out, cudaStream_t st);
#endif
