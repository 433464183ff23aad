/* SPDX-License-Identifier: Apache-2.0 */
#include "qkv_rope.cuh"

/* grid (n, n_heads + 2 * n_kv_heads), block head_dim / 2 (rounded up to a
 * warp): thread t owns the rotate-half pair (t, t + head_dim/2). */
static __global__ void qkv_rope_kernel(const struct kn_cu_qkv_args a)
{
	kn_pdl_wait();
	kn_pdl_trigger();
	__shared__ float red[16];
	const int c = blockIdx.x, h = blockIdx.y, t = threadIdx.x;
	const int hd = a.head_dim, half = hd / 2;
	const int qkv_dim = (a.n_heads + 2 * a.n_kv_heads) * hd;
	const int kind = h < a.n_heads ? 0 : (h < a.n_heads + a.n_kv_heads ? 1 : 2);
	const int off = h * hd;
	float *x = a.qkv + (size_t)c * qkv_dim + off;
	const struct kn_column col = a.cols[c];
	const bool active = t < half;
	float x0 = 0.f, x1 = 0.f;
	if (active) {
		x0 = x[t];
		x1 = x[t + half];
		if (a.bias) {
			x0 += a.bias[off + t];
			x1 += a.bias[off + t + half];
		}
	}
	const float *nw = kind == 0 ? a.q_norm : (kind == 1 ? a.k_norm : nullptr);
	if (nw) { /* uniform branch: whole block */
		float ss = kn_warp_sum(x0 * x0 + x1 * x1);
		if ((t & 31) == 0)
			red[t >> 5] = ss;
		__syncthreads();
		float tot = 0.f;
		for (int i = 0; i < (int)((blockDim.x + 31) / 32); i++)
			tot += red[i];
		const float inv = rsqrtf(tot / (float)hd + a.eps);
		if (active) {
			x0 = x0 * inv * nw[t];
			x1 = x1 * inv * nw[t + half];
		}
	}
	if (!active)
		return;
	if (kind < 2) {
		float s, co;
		sincosf((float)col.pos * a.inv_freq[t], &s, &co);
		const float r0 = x0 * co - x1 * s;
		const float r1 = x1 * co + x0 * s;
		x0 = r0;
		x1 = r1;
	}
	if (kind == 0) {
		x[t] = x0;
		x[t + half] = x1;
		return;
	}
	if (col.slot == KN_CU_PAD_SLOT)
		return;
	const int32_t blk = a.table[(size_t)col.slot * a.max_bps + col.pos / KN_PAGE_BLK];
	if (blk < 0)
		return;
	const int kvh = h - a.n_heads - (kind == 2 ? a.n_kv_heads : 0);
	kn_bf16 *dst = (kind == 1 ? a.k_cache : a.v_cache) +
		(((size_t)blk * a.n_kv_heads + kvh) * KN_PAGE_BLK + col.pos % KN_PAGE_BLK) * hd;
	dst[t] = __float2bfloat16(x0);
	dst[t + half] = __float2bfloat16(x1);
}

cudaError_t kn_cuda_qkv_rope(const struct kn_cu_qkv_args *a, cudaStream_t st)
{
	if (a->head_dim % 2 || a->head_dim < 2 || a->head_dim > 512)
		return cudaErrorInvalidValue;
	const int threads = ((a->head_dim / 2 + 31) / 32) * 32;
	dim3 grid(a->n, a->n_heads + 2 * a->n_kv_heads);
	return kn_launch(qkv_rope_kernel, grid, dim3(threads), 0, st, *a);
}
