/* SPDX-License-Identifier: Apache-2.0 */
#include "qkv_rope.cuh"

/* Threads a block: several heads of one column share a block (a block of 32
 * threads a head left the 1B's 256-column step with 12,288 blocks of one
 * warp each: 17 us a layer, latency-bound). */
#define QR_THREADS 256

/* grid (n, ceil(heads / hpb)), block hpb x tph: tph = head_dim / 2 rounded
 * up to a warp, hpb = QR_THREADS / tph heads a block (at least 1); thread t
 * of its head owns the rotate-half pair (t, t + head_dim/2). A head's norm
 * adds its warps' sums in order, as with a block a head: the same bits. */
static __global__ void __launch_bounds__(QR_THREADS) qkv_rope_kernel(const struct kn_cu_qkv_args a, int tph)
{
	kn_pdl_wait();
	kn_pdl_trigger();
	__shared__ float red[QR_THREADS / 32];
	const int hpb = blockDim.x / tph, wph = tph / 32;
	const int c = blockIdx.x, hl = threadIdx.x / tph, t = threadIdx.x % tph;
	const int h = blockIdx.y * hpb + hl;
	const int heads = a.n_heads + 2 * a.n_kv_heads;
	const int hd = a.head_dim, half = hd / 2;
	const int qkv_dim = heads * hd;
	const int kind = h < a.n_heads ? 0 : (h < a.n_heads + a.n_kv_heads ? 1 : 2);
	const int off = h * hd;
	float *x = a.qkv + (size_t)c * qkv_dim + off;
	const struct kn_column col = a.cols[c];
	const bool active = t < half && h < heads;
	float x0 = 0.f, x1 = 0.f;
	if (active && a.qkv_parts) {
		const size_t count = (size_t)a.n * qkv_dim, e = (size_t)c * qkv_dim + off + t;
		x0 = kn_parts_ld<float>(a.qkv_parts, a.qkv_segs, count, e);
		x1 = kn_parts_ld<float>(a.qkv_parts, a.qkv_segs, count, e + half);
	} else if (active) {
		x0 = x[t];
		x1 = x[t + half];
	}
	if (active && a.bias) {
		x0 += a.bias[off + t];
		x1 += a.bias[off + t + half];
	}
	const float *nw = kind == 0 ? a.q_norm : (kind == 1 ? a.k_norm : nullptr);
	if (a.q_norm != nullptr || a.k_norm != nullptr) { /* uniform: the whole block syncs */
		const float ss = kn_warp_sum(x0 * x0 + x1 * x1);
		if ((t & 31) == 0)
			red[threadIdx.x >> 5] = ss;
		__syncthreads();
		float tot = 0.f;
		for (int i = 0; i < wph; i++)
			tot += red[hl * wph + i];
		const float inv = rsqrtf(tot / (float)hd + a.eps);
		if (active && nw) {
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
	const int tph = ((a->head_dim / 2 + 31) / 32) * 32;
	const int hpb = tph < QR_THREADS ? QR_THREADS / tph : 1;
	const int heads = a->n_heads + 2 * a->n_kv_heads;
	dim3 grid(a->n, (heads + hpb - 1) / hpb);
	return kn_launch(qkv_rope_kernel, grid, dim3(hpb * tph), 0, st, *a, tph);
}
