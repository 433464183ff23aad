/* SPDX-License-Identifier: Apache-2.0 */
/** @file rmsnorm.cuh Residual add fused with RMSNorm. */
#ifndef KN_CU_RMSNORM_CUH
#define KN_CU_RMSNORM_CUH
#include "cu_common.cuh"

/**
 * For each row r < n: resid[r] += delta[r] (if delta); then, if out is not
 * NULL, out[r] = w * resid[r] / sqrt(mean(resid[r]^2) + eps), in f32
 * (the next linear layer's input; gemm.cuh decides its rounding).
 * The sum of squares is reduced in a fixed order (one block per row), so a
 * row's bits never depend on the other rows.
 * @param resid  [n][hidden] f32, updated in place
 * @param delta  [n][hidden] f32 or NULL
 * @param delta_segs  0, or delta as that many segment sums of a linear
 *               layer, [delta_segs][n][hidden] (kn_parts_ld(): the bits
 *               of their fold)
 * @param w      [hidden] f32 norm weight (ignored when out is NULL)
 * @param out    [n][hidden] f32 or NULL (add only)
 * @return the launch's cudaError_t.
 */
cudaError_t kn_cuda_add_rmsnorm(float *resid, const float *delta, int delta_segs, const float *w, float eps,
				int n, int hidden, float *out, cudaStream_t st);

/**
 * kn_cuda_add_rmsnorm() with the normed rows rounded to bf16 (round to
 * nearest, each element as gemm.cuh rounds an f32 X for cuBLAS, so the bits
 * equal norm-then-round): wide plans feed cuBLAS from it with no extra pass.
 * @param out  [n][hidden] bf16, not NULL
 * @return the launch's cudaError_t.
 */
cudaError_t kn_cuda_add_rmsnorm_bf16(float *resid, const float *delta, int delta_segs, const float *w, float eps,
				     int n, int hidden, kn_bf16 *out, cudaStream_t st);
#endif
