/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file gemm_wg.cuh
 * A linear layer Y = X W^T on Hopper's warpgroup MMA (wgmma, sm_90a) whose
 * bits for a column depend on that column, W and `in` alone: never on the
 * plan width, the column's neighbours or its index (the order is in
 * gemm_wg.cu). X is rounded to bf16, as cuBLAS's default wide path and
 * transformers' bf16 path round it; W bf16; f32 accumulate and output.
 * `KVFERRY_CUDA_LINEAR=wg` puts every linear layer of the engine on it.
 */
#ifndef KN_CU_GEMM_WG_CUH
#define KN_CU_GEMM_WG_CUH
#include <stddef.h>

#include "cu_common.cuh"
#include "kn_cuda.h"

/**
 * Y[c][o] = sum_k bf16(X[c][k]) W[o][k] for c < n, o < out.
 * @param w     [out][in] bf16, 16-byte aligned rows
 * @param x     [n][in] f32, 16-byte aligned rows
 * @param xb    bf16 scratch of n*in elements (used above 32 columns)
 * @param y     [n][out] f32
 * @param part  scratch for products of few tiles, which then run one
 *              segment of `in` a block and add the segments in a second
 *              kernel (the same bits; layers of at least four rows an
 *              input have one segment and never do); NULL or too small:
 *              one pass
 * @param part_floats  floats @p part holds
 * @return the first failing launch's cudaError_t; cudaErrorInvalidValue
 *         when @p in is not a positive multiple of 8.
 */
cudaError_t kn_cuda_gemm_wg(const kn_bf16 *w, const float *x, kn_bf16 *xb, float *y, int n, int in, int out,
			    float *part, size_t part_floats, cudaStream_t st);

/** Whether kn_cuda_gemm_wg() runs n columns of this shape on a kernel that
 *  takes X rounded beforehand: then its producer may write X as bf16 and
 *  call kn_cuda_gemm_wg_bf16() (the same bits, no rounding pass). */
int kn_cuda_gemm_wg_takes_bf16(int n, int in, int out);

/** kn_cuda_gemm_wg() with X already rounded to bf16 in @p xb ([n][in]);
 *  cudaErrorInvalidValue where kn_cuda_gemm_wg_takes_bf16() says no. */
cudaError_t kn_cuda_gemm_wg_bf16(const kn_bf16 *w, const kn_bf16 *xb, float *y, int n, int in, int out, float *part,
				 size_t part_floats, cudaStream_t st);

/**
 * kn_cuda_gemm_wg() / kn_cuda_gemm_wg_bf16() that leave a product run in
 * segment parts for its consumer to add: *nseg = its segments, their sums
 * [nseg][n][out] in @p part (kn_parts_ld() adds them in order, the bits of
 * the fold kernel they replace: one kernel launch less a layer); *nseg = 0
 * where it ran in one pass and wrote @p y.
 */
cudaError_t kn_cuda_gemm_wg_defer(const kn_bf16 *w, const float *x, kn_bf16 *xb, float *y, int n, int in, int out,
				  float *part, size_t part_floats, int *nseg, cudaStream_t st);
cudaError_t kn_cuda_gemm_wg_bf16_defer(const kn_bf16 *w, const kn_bf16 *xb, float *y, int n, int in, int out,
				       float *part, size_t part_floats, int *nseg, cudaStream_t st);

/** kn_cuda_gemm_wg() with its kernel forced, for tests: @p way 0 = X resident,
 *  32-column instructions; 1 = X streamed, 8-column instructions; 2 = X
 *  streamed, 2 x 128 columns a block; 3..8 = the TMA kernel (tensor copies,
 *  a producer warpgroup, persistent blocks) on tiles of 128 rows by 192,
 *  128, 64 (a block for each unit of work) and 8 columns, and 64 rows by 128
 *  and 16 (ways 3, 4, 5, 7, 6, 8); 9, 10 = 128 and 192 columns in CTA pairs
 *  sharing X (cudaErrorNotSupported without the driver's tensor maps);
 *  11, 12 = mma.sync, a segment a warp (KVFERRY_WG_SKINNY's kernel of
 *  plans of at most 8 columns), W as the A / as the B operand; 13, 14 =
 *  256 columns alone and in CTA pairs (layers of one chain, at least four
 *  rows an input; cudaErrorNotSupported on others); 15, 16 = 64 and 128
 *  columns in CTA pairs along columns sharing W (KVFERRY_WG_WPAIRS); 17,
 *  18 = the same on tiles of 64 rows (one consumer).
 *  Every way gives the same bits. */
cudaError_t kn_cuda_gemm_wg_forced(const kn_bf16 *w, const float *x, kn_bf16 *xb, float *y, int n, int in, int out,
				   float *part, size_t part_floats, int way, cudaStream_t st);

/** @return the k of a segment of this layer's sum: all of `in` rounded up to
 *  512 for layers of at least four rows an input, else 512 (512 for every
 *  layer under KVFERRY_WG_ONE_CHAIN=0). */
int kn_cuda_gemm_wg_seg(int in, int out);

/** @return the floats kn_cuda_gemm_wg() needs in @p part to run this product
 *  in segment parts (0: it runs in one pass). */
size_t kn_cuda_gemm_wg_part_floats(int n, int in, int out);

/** Sets the kernels' shared memory sizes (call before capturing a graph that
 *  runs them). @return cudaSuccess, or the failing call's error. */
cudaError_t kn_cuda_gemm_wg_prepare(void);

#endif
