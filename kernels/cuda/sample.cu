/* SPDX-License-Identifier: Apache-2.0 */
#include "sample.cuh"

#include <math.h>

#define AM_THREADS 1024
#define AM_WARPS (AM_THREADS / 32)

static __device__ __forceinline__ void better(float &bv, int &bi, float ov, int oi)
{
	if (ov > bv || (ov == bv && oi < bi)) {
		bv = ov;
		bi = oi;
	}
}

/* grid (n), block 1024: strided scan, warp butterfly, then warps in order. */
static __global__ void __launch_bounds__(AM_THREADS)
argmax_kernel(const float *logits, int vocab, const struct kn_column *cols, int32_t *tokens)
{
	kn_pdl_wait();
	kn_pdl_trigger();
	__shared__ float shv[AM_WARPS];
	__shared__ int shi[AM_WARPS];
	const int c = blockIdx.x, t = threadIdx.x;
	const struct kn_column col = cols[c];
	if (col.slot == KN_CU_PAD_SLOT || !(col.flags & KN_COL_NEED_LOGIT)) {
		if (t == 0)
			tokens[c] = -1;
		return;
	}
	const float4 *l4 = reinterpret_cast<const float4 *>(logits + (size_t)c * vocab);
	float bv = -INFINITY;
	int bi = vocab;
	const int n4 = vocab % 4 ? 0 : vocab / 4; /* rows are 16-byte aligned only then */
	for (int i = t; i < n4; i += AM_THREADS) {
		const float4 v = l4[i];
		better(bv, bi, v.x, 4 * i);
		better(bv, bi, v.y, 4 * i + 1);
		better(bv, bi, v.z, 4 * i + 2);
		better(bv, bi, v.w, 4 * i + 3);
	}
	for (int i = 4 * n4 + t; i < vocab; i += AM_THREADS)
		better(bv, bi, logits[(size_t)c * vocab + i], i);
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) {
		const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
		const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
		better(bv, bi, ov, oi);
	}
	if ((t & 31) == 0) {
		shv[t >> 5] = bv;
		shi[t >> 5] = bi;
	}
	__syncthreads();
	if (t == 0) {
		bv = shv[0];
		bi = shi[0];
		for (int i = 1; i < AM_WARPS; i++)
			better(bv, bi, shv[i], shi[i]);
		tokens[c] = bi >= vocab ? 0 : bi;
	}
}

cudaError_t kn_cuda_argmax(const float *logits, int vocab, const struct kn_column *cols, int n,
			   int32_t *tokens, cudaStream_t st)
{
	return kn_launch(argmax_kernel, dim3(n), dim3(AM_THREADS), 0, st, logits, vocab, cols, tokens);
}
