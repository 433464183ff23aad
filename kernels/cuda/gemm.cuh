/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file gemm.cuh
 * A linear layer Y = X W^T for a whole plan: the skinny kernel (gemv.cuh)
 * for plans of at most KN_CU_GEMV_MAX_N columns, cuBLAS (bf16 in, f32 out,
 * f32 accumulate) above. cuBLAS is bitwise reproducible for a fixed shape on
 * one GPU model (its documented guarantee, atomics off by default), and the
 * plan width fixes the shape, so batch composition cannot change the bits.
 */
#ifndef KN_CU_GEMM_CUH
#define KN_CU_GEMM_CUH
#include <cublas_v2.h>
#include <stddef.h>

#include "cu_common.cuh"

/**
 * Y[c][o] = sum_k X[c][k] W[o][k], c < n.
 * @param blas  handle bound to the stream that runs the step
 * @param w     [out][in] bf16
 * @param x     [n][in] bf16
 * @param y     [n][out] f32
 * @param err   receives the failing call on error
 * @return 0, or -1 with @p err naming the failing call and its status.
 */
int kn_cuda_linear(cublasHandle_t blas, const kn_bf16 *w, const kn_bf16 *x, float *y, int n,
		   int in, int out, cudaStream_t st, char *err, size_t errlen);
#endif
