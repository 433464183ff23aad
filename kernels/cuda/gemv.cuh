/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file gemv.cuh
 * Skinny matrix product for narrow plans (n <= KN_CU_GEMV_MAX_N columns):
 * Y = X W^T with W (bf16) streamed once from HBM and X kept in f32. cuBLAS
 * reaches 1.87 TB/s at M=1, N=K=4096 on the H200 (44% of copy bandwidth,
 * BENCHMARKS.md), too low for the batch-1 goal, hence these kernels.
 *
 * X stays f32 because it is tiny next to W (read from L1/L2): rounding it to
 * bf16 put ~0.7% relative error on the logits of the small preset against
 * the f32 CPU engine, enough to flip near-tied greedy choices after 8 steps.
 *
 * Two kernels: tensor cores (mma.sync m16n8k16, X split into bf16 hi + lo,
 * two products, f32 accumulate; ~2e-6 of the f32 result) for 2..16 columns,
 * CUDA cores (FFMA, f32 products) for one column, where it streams W faster
 * (kn_cuda_gemv_kind() has the figures). KVFERRY_CUDA_GEMV=ffma|mma forces
 * one kernel for every n, to measure against.
 *
 * Each output element is reduced in an order fixed by `in` alone, never by n
 * or by a neighbour column: within a plan width a column's bits never depend
 * on its batch; widths 2..16 (one kernel) also agree with each other, and
 * width 1 (the other kernel) agrees with them to ~2e-6, not bit for bit.
 */
#ifndef KN_CU_GEMV_CUH
#define KN_CU_GEMV_CUH
#include "cu_common.cuh"

#define KN_CU_GEMV_MAX_N 16

enum { KN_CU_GEMV_MMA = 0, KN_CU_GEMV_FFMA = 1 };

/**
 * Y[c][o] = sum_k X[c][k] * W[o][k] for c < n, o < out, in f32, with the
 * kernel chosen by kn_cuda_gemv_kind().
 * @param w  [out][in] bf16 (Hugging Face layout), 16-byte aligned rows
 * @param x  [n][in] f32, 16-byte aligned rows
 * @param y  [n][out] f32
 * @return the launch's cudaError_t; cudaErrorInvalidValue when n is out of
 *         1..KN_CU_GEMV_MAX_N or in is not a multiple of 8.
 */
cudaError_t kn_cuda_gemv(const kn_bf16 *w, const float *x, float *y, int n, int in, int out,
			 cudaStream_t st);

/** kn_cuda_gemv() on tensor cores (X as bf16 hi + lo). Same contract. */
cudaError_t kn_cuda_gemv_mma(const kn_bf16 *w, const float *x, float *y, int n, int in, int out,
			     cudaStream_t st);

/** kn_cuda_gemv() on CUDA cores (f32 FMA). Same contract. */
cudaError_t kn_cuda_gemv_ffma(const kn_bf16 *w, const float *x, float *y, int n, int in, int out,
			      cudaStream_t st);

/**
 * Y = X W^T for any number of columns @p n from X already split into bf16
 * hi and lo (@p xh, @p xl: [n][in] each, as kn_cuda_gemm_mma() splits it):
 * each column's bits those kn_cuda_gemv_mma() gives it (the same fragments,
 * mma order and sums), W and X tiles shared in shared memory by 128 rows
 * and 128 columns. @p in a multiple of 8. A product of fewer tiles than
 * the device has SMs runs each of the 8 warp sequences in blocks of its
 * own when @p part (@p part_floats, at least 8 n out) can hold their sums,
 * then adds them in warp order: the same bits.
 * @return the first failing launch's cudaError_t.
 */
cudaError_t kn_cuda_gemm_mma_split(const kn_bf16 *w, const kn_bf16 *xh, const kn_bf16 *xl, float *y, int n, int in,
				   int out, float *part, size_t part_floats, cudaStream_t st);

/** @return the floats @p part must hold for every product that runs in parts
 *  on this device (0: the kernel cannot run); sets the kernel up, so call it
 *  before capturing a graph that runs it. */
size_t kn_cuda_gemm_mma_parts(void);

/** @return the kernel kn_cuda_gemv() runs for @p n columns: KN_CU_GEMV_FFMA for
 *  n = 1, KN_CU_GEMV_MMA above, unless KVFERRY_CUDA_GEMV (read once) forces one. */
int kn_cuda_gemv_kind(int n);
#endif
