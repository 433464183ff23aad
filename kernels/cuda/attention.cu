/* SPDX-License-Identifier: Apache-2.0 */
#include "attention.cuh"

#include <math.h>

#define ATTN_WARPS 4
/* Positions per lane group whose K/V loads are issued before first use: 2 gave
 * 13-38% of copy bandwidth (too few bytes in flight per SM); 4 doubles them. */
#define ATTN_U 4
#define LOG2E 1.4426950408889634f

static __host__ __device__ int gmax_of(int g)
{
	return g <= 1 ? 1 : g <= 2 ? 2 : g <= 4 ? 4 : 8;
}

/* Partials layout: [n][n_kv_heads][splits][GM] x {acc[HD], m, l}. */
static __host__ __device__ size_t part_stride(int hd)
{
	return (size_t)hd + 2;
}

/*
 * grid (splits, n_kv_heads, n), block 128. A group of LP = HD/8 lanes owns one
 * position at a time (16 bytes of K and of V per lane); a warp covers PPW
 * positions per step, ATTN_U steps' loads are issued before use. Each group
 * keeps an online softmax per head; the block merges its groups in a fixed
 * order at the end.
 */
template <int HD, int GM>
static __global__ void __launch_bounds__(ATTN_WARPS * 32)
attn_split_kernel(const struct kn_cu_attn_args a, int splits)
{
	constexpr int LP = HD / 8, PPW = 32 / LP, NGRP = ATTN_WARPS * PPW;
	__shared__ float sm_acc[NGRP][GM][HD];
	__shared__ float sm_m[NGRP][GM], sm_l[NGRP][GM];

	const int s = blockIdx.x, kh = blockIdx.y, c = blockIdx.z;
	const struct kn_column col = a.cols[c];
	if (col.slot == KN_CU_PAD_SLOT)
		return;
	const int len = col.pos + 1, start = s * KN_CU_ATTN_SPLIT;
	if (start >= len)
		return;
	const int end = min(start + KN_CU_ATTN_SPLIT, len);
	const int G = a.n_heads / a.n_kv_heads;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int grp = lane / LP, sub = lane % LP;
	const int gg = warp * PPW + grp;

	float qf[GM][8];
#pragma unroll
	for (int g = 0; g < GM; g++) {
#pragma unroll
		for (int i = 0; i < 8; i++)
			qf[g][i] = g < G ? a.q[(size_t)c * a.q_stride + (kh * G + g) * HD + sub * 8 + i] *
					   a.scale * LOG2E : 0.f;
	}
	float m[GM], l[GM], acc[GM][8];
#pragma unroll
	for (int g = 0; g < GM; g++) {
		m[g] = -INFINITY;
		l[g] = 0.f;
#pragma unroll
		for (int i = 0; i < 8; i++)
			acc[g][i] = 0.f;
	}
	const int32_t *trow = a.table + (size_t)col.slot * a.max_bps;
	const size_t head_off = (size_t)kh * KN_PAGE_BLK * HD + sub * 8;
	const size_t blk_stride = (size_t)a.n_kv_heads * KN_PAGE_BLK * HD;

	for (int base = start + warp * PPW; base < end; base += ATTN_U * NGRP) {
		uint4 kv[ATTN_U][2];
		bool ok[ATTN_U];
#pragma unroll
		for (int u = 0; u < ATTN_U; u++) {
			const int p = base + u * NGRP + grp;
			const int32_t blk = p < end ? trow[p / KN_PAGE_BLK] : -1;
			ok[u] = blk >= 0;
			if (ok[u]) {
				const size_t o = blk * blk_stride + head_off + (size_t)(p % KN_PAGE_BLK) * HD;
				kv[u][0] = kn_ld_stream(a.k_cache + o);
				kv[u][1] = kn_ld_stream(a.v_cache + o);
			} else {
				kv[u][0] = kv[u][1] = make_uint4(0, 0, 0, 0);
			}
		}
#pragma unroll
		for (int u = 0; u < ATTN_U; u++) {
			float kf[8], vf[8];
			kn_bf16x8_to_f32(kv[u][0], kf);
			kn_bf16x8_to_f32(kv[u][1], vf);
#pragma unroll
			for (int g = 0; g < GM; g++) {
				float d = 0.f;
#pragma unroll
				for (int i = 0; i < 8; i++)
					d += qf[g][i] * kf[i];
#pragma unroll
				for (int o = LP / 2; o > 0; o >>= 1)
					d += __shfl_xor_sync(0xffffffffu, d, o);
				if (ok[u] && g < G) {
					const float mn = fmaxf(m[g], d);
					const float corr = exp2f(m[g] - mn), pe = exp2f(d - mn);
					l[g] = l[g] * corr + pe;
#pragma unroll
					for (int i = 0; i < 8; i++)
						acc[g][i] = acc[g][i] * corr + pe * vf[i];
					m[g] = mn;
				}
			}
		}
	}
#pragma unroll
	for (int g = 0; g < GM; g++) {
#pragma unroll
		for (int i = 0; i < 8; i++)
			sm_acc[gg][g][sub * 8 + i] = acc[g][i];
		if (sub == 0) {
			sm_m[gg][g] = m[g];
			sm_l[gg][g] = l[g];
		}
	}
	__syncthreads();
	float *part = a.part + (((size_t)c * a.n_kv_heads + kh) * splits + s) * GM * part_stride(HD);
	for (int e = threadIdx.x; e < GM * HD; e += ATTN_WARPS * 32) {
		const int g = e / HD, d = e % HD;
		if (g >= G)
			continue;
		float M = -INFINITY;
		for (int j = 0; j < NGRP; j++)
			M = fmaxf(M, sm_m[j][g]);
		float L = 0.f, A = 0.f;
		for (int j = 0; j < NGRP; j++) {
			const float w = sm_m[j][g] == -INFINITY ? 0.f : exp2f(sm_m[j][g] - M);
			L += sm_l[j][g] * w;
			A += sm_acc[j][g][d] * w;
		}
		float *pg = part + g * part_stride(HD);
		pg[d] = A;
		if (d == 0) {
			pg[HD] = M;
			pg[HD + 1] = L;
		}
	}
}

/* grid (n, n_heads), block HD: merge the column's splits in order 0..k-1. */
template <int HD, int GM>
static __global__ void attn_merge_kernel(const struct kn_cu_attn_args a, int splits)
{
	const int c = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
	const struct kn_column col = a.cols[c];
	float *o = a.out + (size_t)c * a.n_heads * HD + (size_t)h * HD + d;
	if (col.slot == KN_CU_PAD_SLOT) {
		*o = 0.f;
		return;
	}
	const int G = a.n_heads / a.n_kv_heads, kh = h / G, g = h % G;
	const int k = (col.pos + KN_CU_ATTN_SPLIT) / KN_CU_ATTN_SPLIT;
	const float *part = a.part + ((size_t)c * a.n_kv_heads + kh) * splits * GM * part_stride(HD) +
			    g * part_stride(HD);
	const size_t ss = GM * part_stride(HD);
	float M = -INFINITY;
	for (int s = 0; s < k; s++)
		M = fmaxf(M, part[s * ss + HD]);
	float L = 0.f, A = 0.f;
	for (int s = 0; s < k; s++) {
		const float w = exp2f(part[s * ss + HD] - M);
		L += part[s * ss + HD + 1] * w;
		A += part[s * ss + d] * w;
	}
	*o = A / L;
}

static int splits_of(int max_ctx)
{
	return (max_ctx + KN_CU_ATTN_SPLIT - 1) / KN_CU_ATTN_SPLIT;
}

size_t kn_cuda_attn_workspace(int n, int n_heads, int n_kv_heads, int head_dim, int max_ctx)
{
	const int gm = gmax_of(n_heads / n_kv_heads);
	return (size_t)n * n_kv_heads * splits_of(max_ctx) * gm * part_stride(head_dim) * sizeof(float);
}

template <int HD, int GM>
static cudaError_t launch(const struct kn_cu_attn_args *a, cudaStream_t st)
{
	const int splits = splits_of(a->max_ctx);
	dim3 g1(splits, a->n_kv_heads, a->n);
	attn_split_kernel<HD, GM><<<g1, ATTN_WARPS * 32, 0, st>>>(*a, splits);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return e;
	dim3 g2(a->n, a->n_heads);
	attn_merge_kernel<HD, GM><<<g2, HD, 0, st>>>(*a, splits);
	return cudaGetLastError();
}

template <int HD>
static cudaError_t launch_hd(const struct kn_cu_attn_args *a, cudaStream_t st)
{
	switch (gmax_of(a->n_heads / a->n_kv_heads)) {
	case 1: return launch<HD, 1>(a, st);
	case 2: return launch<HD, 2>(a, st);
	case 4: return launch<HD, 4>(a, st);
	default: return launch<HD, 8>(a, st);
	}
}

cudaError_t kn_cuda_attention(const struct kn_cu_attn_args *a, cudaStream_t st)
{
	if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads || a->n_heads / a->n_kv_heads > 8)
		return cudaErrorInvalidValue;
	switch (a->head_dim) {
	case 16: return launch_hd<16>(a, st);
	case 32: return launch_hd<32>(a, st);
	case 64: return launch_hd<64>(a, st);
	case 128: return launch_hd<128>(a, st);
	case 256: return launch_hd<256>(a, st);
	default: return cudaErrorInvalidValue;
	}
}
