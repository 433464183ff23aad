/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file gemm.cuh
 * A linear layer Y = X W^T for a whole plan, X in f32: the skinny kernels
 * (gemv.cuh) for plans of at most KN_CU_GEMV_MAX_N columns; above, X is
 * rounded to bf16 (or split into bf16 hi + lo, two products) and cuBLAS runs
 * bf16 in, f32 out, f32 accumulate. cuBLAS is bitwise reproducible for a
 * fixed shape on one GPU model (its documented guarantee, atomics off by
 * default), and the plan width fixes the shape, so batch composition cannot
 * change the bits.
 */
#ifndef KN_CU_GEMM_CUH
#define KN_CU_GEMM_CUH
#include <cublas_v2.h>
#include <stddef.h>

#include "cu_common.cuh"

/**
 * Y[c][o] = sum_k X[c][k] W[o][k], c < n.
 * @param blas   handle bound to the stream that runs the step
 * @param w      [out][in] bf16
 * @param x      [n][in] f32
 * @param xb     bf16 scratch for plans wider than KN_CU_GEMV_MAX_N:
 *               n*in elements, 2*n*in with @p split
 * @param y      [n][out] f32
 * @param split  wide plans: 0 rounds X to bf16 (one product); 1 adds the
 *               product of the rounding remainder (twice the tensor work,
 *               f32-grade X)
 * @param gemv   narrow plans: KN_CU_GEMV_MMA / KN_CU_GEMV_FFMA forces that
 *               skinny kernel; -1 takes kn_cuda_gemv_kind(n)
 * @param err    receives the failing call on error
 * @return 0, or -1 with @p err naming the failing call and its status.
 */
int kn_cuda_linear(cublasHandle_t blas, const kn_bf16 *w, const float *x, kn_bf16 *xb, float *y,
		   int n, int in, int out, int split, int gemv, cudaStream_t st, char *err,
		   size_t errlen);

/**
 * Y = X W^T at any plan width with each column's bits those of the narrow
 * plans' tensor-core kernel (gemv.cuh, kn_cuda_gemm_mma_split()): X split
 * into bf16 hi + lo in @p xb (2*n*in elements), then one tensor-core GEMM
 * whose sums follow that kernel's order. @p in a multiple of 8. @p part:
 * room for the warp sequences' sums of a small product (or NULL), see
 * kn_cuda_gemm_mma_split(). @return the first failing launch's cudaError_t.
 */
cudaError_t kn_cuda_gemm_mma(const kn_bf16 *w, const float *x, kn_bf16 *xb, float *y, int n, int in, int out,
			     float *part, size_t part_floats, cudaStream_t st);

/**
 * Y[c][o] = sum_k XB[c][k] W[o][k] by cuBLAS, X already in bf16 (produced
 * by kn_cuda_add_rmsnorm_bf16() or kn_cuda_swiglu_bf16()): the same product
 * as kn_cuda_linear() with split = 0 on a plan wider than
 * KN_CU_GEMV_MAX_N, less its rounding pass.
 * @param xb   [n][in] bf16
 * @param y    [n][out] f32
 * @param err  receives the failing call on error
 * @return 0, or -1 with @p err naming the failing call and its status.
 */
int kn_cuda_linear_bf16(cublasHandle_t blas, const kn_bf16 *w, const kn_bf16 *xb, float *y, int n,
			int in, int out, char *err, size_t errlen);
/**
 * hi = bf16(x) (round to nearest even), and lo = bf16(x - hi) when @p lo is
 * not NULL, over @p count floats (a multiple of 4; 16-byte aligned buffers).
 * @return the launch's cudaError_t.
 */
cudaError_t kn_cuda_round_bf16(const float *x, kn_bf16 *hi, kn_bf16 *lo, size_t count, cudaStream_t st);
#endif
