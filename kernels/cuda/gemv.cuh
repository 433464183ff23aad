/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file gemv.cuh
 * Skinny matrix product for narrow plans (n <= KN_CU_GEMV_MAX_N columns):
 * Y = X W^T with W streamed once from HBM. cuBLAS reaches 1.87 TB/s at
 * M=1, N=K=4096 on the H200 (44% of copy bandwidth, BENCHMARKS.md), too low
 * for the batch-1 goal, hence this kernel.
 *
 * Each output element is reduced in an order fixed by `in` alone (thread t
 * sums chunks t, t+256, ...; then a fixed warp butterfly; then warps 0..7 in
 * order), never by n: a column's bits are the same in every narrow plan.
 */
#ifndef KN_CU_GEMV_CUH
#define KN_CU_GEMV_CUH
#include "cu_common.cuh"

#define KN_CU_GEMV_MAX_N 16

/**
 * Y[c][o] = sum_k X[c][k] * W[o][k] for c < n, o < out, in f32.
 * @param w  [out][in] bf16 (Hugging Face layout), 16-byte aligned rows
 * @param x  [n][in] bf16
 * @param y  [n][out] f32
 * @return the launch's cudaError_t; cudaErrorInvalidValue when n is out of
 *         1..KN_CU_GEMV_MAX_N or in is not a multiple of 8.
 */
cudaError_t kn_cuda_gemv(const kn_bf16 *w, const kn_bf16 *x, float *y, int n, int in, int out,
			 cudaStream_t st);
#endif
