/* SPDX-License-Identifier: Apache-2.0 */
#include "attention.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ATTN_WARPS 4
/* Positions per lane group whose K/V loads are issued before first use: 2 gave
 * 13-38% of copy bandwidth (too few bytes in flight per SM); 4 doubles them.
 * 8 (tried, H200) helped one column at 32k by 10% and cost 2-16 columns
 * 12-28%: the 8B shape lost a resident block per SM. */
#define ATTN_U 4
/* Blocks of the column kernel resident per SM, for launches of many blocks
 * (MANY): the compiler otherwise gives the 8B shape 168 registers a thread,
 * 3 blocks (12 warps, 12% occupancy: ncu, 32k, one column: 19% of DRAM
 * bandwidth), and the 512 blocks of one 32k column then take 1.3 waves. 4
 * fits 128 registers (40 bytes spilled): H200, back to back, one column at
 * 32k 114 -> 83 us, two 210 -> 148, 16 at 4k 175 -> 150; 5 spilled 312
 * bytes and was slower than 3. A launch that fits one wave anyway only pays
 * the spills (1B, batch 1: ctx 512 1.026 -> 1.042 ms a step, 4k 1.114 ->
 * 1.139), so it keeps the compiler's choice, as do 8 heads per KV head (GM
 * 8: Llama 70B's shape), which would spill ~700 bytes. Registers do not
 * change the arithmetic: the bits are the same either way. */
#define ATTN_MIN_BLOCKS(HD, GM) ((GM) <= 4 ? 4 : 1)
#define ATTN_MANY_BLOCKS 384 /* 3 blocks on each of the H200's 132 SMs, rounded down */
#define LOG2E 1.4426950408889634f

static __host__ __device__ int gmax_of(int g)
{
	return g <= 1 ? 1 : g <= 2 ? 2 : g <= 4 ? 4 : 8;
}

/* More than 8 heads per KV head (MQA-like models): each KV head is served by
 * nsub = ceil(G / 8) blocks ("virtual heads", grid y = n_kv_heads x nsub),
 * each attending 8 of its heads over the same K/V. Block y's KV head, first
 * head and head count. */
struct vhead {
	int kh, hb, g;
};

static __device__ __forceinline__ struct vhead vhead_of(const struct kn_cu_attn_args &a, int y, int gm)
{
	const int G = a.n_heads / a.n_kv_heads, nsub = (G + gm - 1) / gm, j = y % nsub;
	const struct vhead v = { y / nsub, (y / nsub) * G + j * gm, min(gm, G - j * gm) };
	return v;
}

static __host__ __device__ int nsub_of(int n_heads, int n_kv_heads)
{
	const int g = n_heads / n_kv_heads;
	return g <= 8 ? 1 : (g + 7) / 8;
}

/* Partials layout: [n][n_kv_heads x nsub][splits][GM] x {acc[HD], m, l}. */
static __host__ __device__ size_t part_stride(int hd)
{
	return (size_t)hd + 2;
}

/* Partials of one (column, KV head): splits x GM x {acc[hd], m, l}. Merge the
 * first k into out (heads hb .. hb+G-1) in split order 0..k-1: one
 * formula for the merge kernel and the column kernel's last block. Loads go
 * out MERGE_U splits at a time (a split per load round trip made the last
 * block's merge of 16 splits cost ~10 us). */
#define MERGE_U 16
template <int GM>
static __device__ __forceinline__ void merge_splits(const struct kn_cu_attn_args &a, const float *part,
						    int c, int hb, int G, int k, int e0, int estep, int hd)
{
	const size_t ss = GM * part_stride(hd);
	for (int e = e0; e < G * hd; e += estep) {
		const int g = e / hd, d = e % hd;
		const float *pg = part + g * part_stride(hd);
		float M = -INFINITY;
		for (int s0 = 0; s0 < k; s0 += MERGE_U) {
			float m[MERGE_U];
#pragma unroll
			for (int u = 0; u < MERGE_U; u++)
				m[u] = s0 + u < k ? kn_ld_cg(pg + (s0 + u) * ss + hd) : -INFINITY;
#pragma unroll
			for (int u = 0; u < MERGE_U; u++)
				M = fmaxf(M, m[u]);
		}
		float L = 0.f, A = 0.f;
		for (int s0 = 0; s0 < k; s0 += MERGE_U) {
			float m[MERGE_U], l[MERGE_U], v[MERGE_U];
#pragma unroll
			for (int u = 0; u < MERGE_U; u++) {
				const bool on = s0 + u < k;
				m[u] = on ? kn_ld_cg(pg + (s0 + u) * ss + hd) : M;
				l[u] = on ? kn_ld_cg(pg + (s0 + u) * ss + hd + 1) : 0.f;
				v[u] = on ? kn_ld_cg(pg + (s0 + u) * ss + d) : 0.f;
			}
#pragma unroll
			for (int u = 0; u < MERGE_U; u++) {
				if (s0 + u >= k)
					break;
				const float w = exp2f(m[u] - M);
				L += l[u] * w;
				A += v[u] * w;
			}
		}
		a.out[(size_t)c * a.n_heads * hd + (size_t)(hb + g) * hd + d] = A / L;
	}
}

/* The tile kernel's pieces are folded in piece order, one formula for the
 * merge kernel and for a warp that takes all of its rows' pieces itself
 * (kn_cu_attn_args.serial): (M, L, A) <- (max(M, m), L wa + l wb, A wa +
 * v wb), wa = 2^(M - max), wb = 2^(m - max), from (-inf, 0, 0); out = A / L.
 * The products and sums are spelled as intrinsics so the compiler cannot
 * contract them differently in the two places. */
static __device__ __forceinline__ void fold_weights(float &M, float m, float &wa, float &wb)
{
	const float mx = fmaxf(M, m);
	wa = exp2f(M - mx);
	wb = exp2f(m - mx);
	M = mx;
}

static __device__ __forceinline__ float fold_add(float A, float wa, float v, float wb)
{
	return __fmaf_rn(A, wa, __fmul_rn(v, wb));
}

/* merge_splits() for the tile kernel's pieces: the k pieces of (column c, KV
 * head) folded in order 0..k-1 (loads MERGE_U pieces at a time) */
template <int GM>
static __device__ __forceinline__ void merge_fold(const struct kn_cu_attn_args &a, const float *part, int c, int hb,
						  int G, int k, int e0, int estep, int hd)
{
	const size_t ss = GM * part_stride(hd);
	for (int e = e0; e < G * hd; e += estep) {
		const int g = e / hd, d = e % hd;
		const float *pg = part + g * part_stride(hd);
		float M = -INFINITY, L = 0.f, A = 0.f;
		for (int s0 = 0; s0 < k; s0 += MERGE_U) {
			float m[MERGE_U], l[MERGE_U], v[MERGE_U];
#pragma unroll
			for (int u = 0; u < MERGE_U; u++) {
				const bool on = s0 + u < k;
				m[u] = on ? kn_ld_cg(pg + (s0 + u) * ss + hd) : 0.f;
				l[u] = on ? kn_ld_cg(pg + (s0 + u) * ss + hd + 1) : 0.f;
				v[u] = on ? kn_ld_cg(pg + (s0 + u) * ss + d) : 0.f;
			}
#pragma unroll
			for (int u = 0; u < MERGE_U; u++) {
				if (s0 + u >= k)
					break;
				float wa, wb;
				fold_weights(M, m[u], wa, wb);
				L = fold_add(L, wa, l[u], wb);
				A = fold_add(A, wa, v[u], wb);
			}
		}
		a.out[(size_t)c * a.n_heads * hd + (size_t)(hb + g) * hd + d] = A / L;
	}
}

/* Column kernel split for a column of len positions in a plan of n columns.
 * Plans of 1-2 columns: ~16 pieces of 32 or 64 positions up to 1,024
 * positions (8B, ctx 512, batch 1: 4 pieces of 128 per KV head took 16.5
 * us a layer, latency-bound), KN_CU_ATTN_SPLIT above; wider plans fill the
 * GPU with their columns and keep KN_CU_ATTN_SPLIT (smaller pieces made
 * batch 8-16 slower). A function of the column's own length and the plan
 * width: batch-invariant within a plan. */
#define COL_PIECES_MAX 64
static __host__ __device__ __forceinline__ int col_split(int len, int n)
{
	if (n > 2)
		return KN_CU_ATTN_SPLIT;
	if (len <= 16 * 64)
		return len <= 16 * 32 ? 32 : 64;
	/* past 8,192 positions at most COL_PIECES_MAX pieces, each longer: 256
	 * pieces of a 32k column left the last block a 256-way merge */
	const int s = ((len + COL_PIECES_MAX - 1) / COL_PIECES_MAX + 15) / 16 * 16;
	return s > KN_CU_ATTN_SPLIT ? s : KN_CU_ATTN_SPLIT;
}

/*
 * The column kernel's last block merging a column's k <= COL_PIECES_MAX
 * splits: the arithmetic of merge_splits() (the max, then per split in order
 * w = exp2f(m - M), L += l * w, A += v * w, out = A / L), so the bits are
 * the same, with its loads out together: each split's m and l read once by
 * the block (merge_splits() read them for every element, two passes of
 * MERGE_U round trips each: 32 round trips per thread at 8B's 4 heads x 128
 * and 64 splits), the weights computed once per head, then every thread's
 * elements for MERGE_LOADS / elements splits at a time. @p w, @p lw: shared
 * [COL_PIECES_MAX][GM]; @p L: shared [GM].
 */
#define MERGE_LOADS 64
template <int HD, int GM>
static __device__ __forceinline__ void merge_last(const struct kn_cu_attn_args &a, const float *part, int c, int hb,
						  int G, int k, int hd, float (*w)[GM], float (*lw)[GM], float *L)
{
	constexpr int NT = ATTN_WARPS * 32, EPT = (GM * HD + NT - 1) / NT;
	constexpr int UM = MERGE_LOADS / EPT > 0 ? MERGE_LOADS / EPT : 1;
	const size_t ss = GM * part_stride(hd);

#pragma unroll 4
	for (int t = threadIdx.x; t < k * G; t += NT) {
		const int s = t / G, g = t % G;
		const float *pg = part + s * ss + g * part_stride(hd);
		w[s][g] = kn_ld_cg(pg + hd);
		lw[s][g] = kn_ld_cg(pg + hd + 1);
	}
	__syncthreads();
	if ((int)threadIdx.x < G) {
		const int g = threadIdx.x;
		float M = -INFINITY, l = 0.f;
		for (int s = 0; s < k; s++)
			M = fmaxf(M, w[s][g]);
		for (int s = 0; s < k; s++) {
			const float ws = exp2f(w[s][g] - M);
			l += lw[s][g] * ws;
			w[s][g] = ws;
		}
		L[g] = l;
	}
	__syncthreads();
	float A[EPT];
#pragma unroll
	for (int j = 0; j < EPT; j++)
		A[j] = 0.f;
	for (int s0 = 0; s0 < k; s0 += UM) {
		float v[EPT][UM];
#pragma unroll
		for (int j = 0; j < EPT; j++) {
			const int e = threadIdx.x + j * NT, g = e / hd, d = e % hd;
#pragma unroll
			for (int u = 0; u < UM; u++)
				v[j][u] = e < G * hd && s0 + u < k ? kn_ld_cg(part + (s0 + u) * ss + g * part_stride(hd) + d)
								   : 0.f;
		}
#pragma unroll
		for (int j = 0; j < EPT; j++) {
			const int g = (threadIdx.x + j * NT) / hd;
#pragma unroll
			for (int u = 0; u < UM; u++)
				if (s0 + u < k && g < G)
					A[j] += v[j][u] * w[s0 + u][g];
		}
	}
#pragma unroll
	for (int j = 0; j < EPT; j++) {
		const int e = threadIdx.x + j * NT, g = e / hd, d = e % hd;
		if (e < G * hd)
			a.out[(size_t)c * a.n_heads * hd + (size_t)(hb + g) * hd + d] = A[j] / L[g];
	}
}

/* A column of @p len positions in at most @p pieces pieces of its own
 * (split = -pieces): multiples of 16 positions, at least 64. */
static __host__ __device__ __forceinline__ int own_split(int len, int pieces)
{
	const int s = ((len + pieces - 1) / pieces + KN_PAGE_BLK - 1) / KN_PAGE_BLK * KN_PAGE_BLK;
	return s < 64 ? 64 : s;
}

/* Splits of the longest column (the grid's x), for any plan width. */
static __host__ __device__ __forceinline__ int col_splits_max(int max_ctx)
{
	const int k = (max_ctx + KN_CU_ATTN_SPLIT - 1) / KN_CU_ATTN_SPLIT;
	return k > 16 ? k : 16;
}

/*
 * Each of GM values summed over the LP lanes of a lane group (LP a power of
 * two, groups aligned), every lane of the group left with all GM sums, the
 * same bits in each. While a lane holds more than one value, an exchange
 * halves them: the lane keeps one half, its partner the other, and each
 * adds what the other sends (GM / 2 shuffles, not GM); once one is left the
 * usual butterfly; then each sum is read from a lane that holds it. 8B's
 * shape (GM 4, LP 16): 9 shuffles and 5 adds a position, not 16 and 16.
 */
template <int C, int O> struct halve_sum {
	static __device__ __forceinline__ void run(float *x, int lane)
	{
		if constexpr (O > 0) {
			if constexpr (C > 1) {
				const bool hi = lane & O;
#pragma unroll
				for (int j = 0; j < C / 2; j++) {
					const float send = hi ? x[j] : x[j + C / 2];
					const float keep = hi ? x[j + C / 2] : x[j];
					x[j] = keep + __shfl_xor_sync(0xffffffffu, send, O);
				}
				halve_sum<C / 2, O / 2>::run(x, lane);
			} else {
				x[0] += __shfl_xor_sync(0xffffffffu, x[0], O);
				halve_sum<1, O / 2>::run(x, lane);
			}
		}
	}
};

/* Does this launch serve a column of @p len positions (kn_cu_attn_args.len_lo / len_hi)? */
static __device__ __forceinline__ bool len_in(const struct kn_cu_attn_args &a, int len)
{
	return len >= a.len_lo && (a.len_hi == 0 || len < a.len_hi);
}

/* Keys a tile of the run kernel's loop. A run is kn_cu_attn_args.runs (64
 * or 128) columns; a block of runs / 16 warps serves one. */
#define RUN_KEYS 64

/* 2^x, flushing subnormal results to 0 (one MUFU.EX2): the run kernel's
 * softmax, whose terms are at most 1 */
static __device__ __forceinline__ float ex2_ftz(float x)
{
	float y;
	asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
	return y;
}

/* The max / the sum of a row's value over the four lanes of an mma quad
 * (lanes 4g .. 4g + 3 hold row g's columns). */
static __device__ __forceinline__ float quad_max(float x)
{
	x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
	return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

static __device__ __forceinline__ float quad_sum(float x)
{
	x += __shfl_xor_sync(0xffffffffu, x, 1);
	return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* Are the @p rc columns from @p c0 (a multiple of rc) one run: all in the
 * plan, one slot's, at consecutive positions? Called by every lane of a
 * warp (the answer is the warp's). */
static __device__ __forceinline__ bool run_uniform(const struct kn_cu_attn_args &a, int c0, int rc)
{
	const int lane = threadIdx.x & 31;
	bool ok = c0 + rc <= a.n;
	if (ok) {
		const int slot = a.cols[c0].slot, pos = a.cols[c0].pos;
		for (int i = lane; i < rc && ok; i += 32)
			ok = slot != KN_CU_PAD_SLOT && a.cols[c0 + i].slot == slot && a.cols[c0 + i].pos == pos + i;
	}
	return __all_sync(0xffffffffu, ok);
}

/* Does the tile kernel's warp of columns c0 .. c0 + cpw - 1 take every piece
 * itself (kn_cu_attn_args.serial = cpw): all in the plan, one slot's, at
 * consecutive positions? The same answer in every thread that asks. */
static __device__ __forceinline__ bool serial_warp(const struct kn_cu_attn_args &a, int c0, int cpw)
{
	if (cpw <= 0 || c0 + cpw > a.n)
		return false;
	const int slot = a.cols[c0].slot, pos = a.cols[c0].pos;
	bool ok = slot != KN_CU_PAD_SLOT;
	for (int i = 1; i < cpw && ok; i++)
		ok = a.cols[c0 + i].slot == slot && a.cols[c0 + i].pos == pos + i;
	return ok;
}

static constexpr int ilog2(int v)
{
	return v <= 1 ? 0 : 1 + ilog2(v / 2);
}

/* exchanges of group_sums() that halve the values a lane holds */
template <int GM, int LP> static constexpr int halving_steps()
{
	return ilog2(GM) < ilog2(LP) ? ilog2(GM) : ilog2(LP);
}

/* shuffles of group_sums(): by halving, or the plain butterfly per value */
template <int GM, int LP> static constexpr bool halving_pays()
{
	constexpr int k = halving_steps<GM, LP>();
	int sh = 0, c = GM;
	for (int i = 0; i < ilog2(LP); i++) {
		sh += c > 1 ? c / 2 : 1;
		c = c > 1 ? c / 2 : 1;
	}
	return k > 0 && sh + GM < GM * ilog2(LP);
}

template <int GM, int LP>
static __device__ __forceinline__ void group_sums(float (&x)[GM], int lane)
{
	if constexpr (!halving_pays<GM, LP>()) {
#pragma unroll
		for (int g = 0; g < GM; g++)
#pragma unroll
			for (int o = LP / 2; o > 0; o >>= 1)
				x[g] += __shfl_xor_sync(0xffffffffu, x[g], o);
	} else {
		halve_sum<GM, LP / 2>::run(x, lane);
		/* x[j] now holds head j + sum over the halving exchanges i (offset
		 * LP >> (i + 1), GM >> (i + 1) values kept) of that part if the
		 * lane's offset bit was set */
		constexpr int K = halving_steps<GM, LP>(), R = GM >> K;
		float y[GM];
#pragma unroll
		for (int g = 0; g < GM; g++) {
			int src = lane & ~(LP - 1);
#pragma unroll
			for (int i = 0; i < K; i++)
				if ((g - g % R) & (GM >> (i + 1)))
					src |= LP >> (i + 1);
			y[g] = __shfl_sync(0xffffffffu, x[g % R], src);
		}
#pragma unroll
		for (int g = 0; g < GM; g++)
			x[g] = y[g];
	}
}

/*
 * grid (col_splits_max, n_kv_heads, n), block 128. A group of LP = HD/8 lanes
 * owns one position at a time (16 bytes of K and of V per lane); a warp
 * covers PPW positions per step, ATTN_U steps' loads are issued before use.
 * Each group keeps an online softmax per head, rescaled once per ATTN_U
 * positions; the block merges its groups
 * in a fixed order and writes its partial. In plans of 1-2 columns the last
 * of the column's splits to finish (a.counters: one per column and KV head,
 * left at zero) merges them all in split order, with no second kernel;
 * wider plans run attn_merge_kernel.
 */
template <int HD, int GM, bool PAD, bool MANY>
static __global__ void __launch_bounds__(ATTN_WARPS * 32, MANY ? ATTN_MIN_BLOCKS(HD, GM) : 1)
attn_split_kernel(const struct kn_cu_attn_args a, int splits)
{
	kn_pdl_wait();
	kn_pdl_trigger();
	constexpr int LP = HD / 8, PPW = 32 / LP, NGRP = ATTN_WARPS * PPW;
	/* PAD: the head is hd < HD wide (a multiple of 16): lanes past it read
	 * nothing and add zeros */
	const int hd = PAD ? a.head_dim : HD;
	__shared__ float sm_acc[NGRP][GM][HD];
	__shared__ float sm_m[NGRP][GM], sm_l[NGRP][GM];
	__shared__ float sm_w[COL_PIECES_MAX][GM], sm_lw[COL_PIECES_MAX][GM], sm_L[GM]; /* merge_last() */
	__shared__ bool last;

	const int s = blockIdx.x, vh = blockIdx.y, c = blockIdx.z, nvh = gridDim.y;
	const struct kn_column col = a.cols[c];
	const struct vhead v = vhead_of(a, vh, GM);
	const int kh = v.kh, G = v.g;
	if (col.slot == KN_CU_PAD_SLOT) {
		if (s == 0 && a.len_lo == 0)
			for (int e = threadIdx.x; e < G * hd; e += ATTN_WARPS * 32)
				a.out[(size_t)c * a.n_heads * hd + (size_t)v.hb * hd + e] = 0.f;
		return;
	}
	if (!len_in(a, col.pos + 1))
		return; /* the other kernel's column (tile_from) */
	const int len = col.pos + 1, split = col_split(len, a.n), start = s * split;
	if (start >= len)
		return;
	const int end = min(start + split, len);
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int grp = lane / LP, sub = lane % LP;
	const int gg = warp * PPW + grp;
	const bool lane_on = !PAD || sub * 8 < hd;

	float qf[GM][8];
#pragma unroll
	for (int g = 0; g < GM; g++) {
#pragma unroll
		for (int i = 0; i < 8; i++)
			qf[g][i] = g < G && lane_on ? a.q[(size_t)c * a.q_stride + (v.hb + g) * hd + sub * 8 + i] *
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
	const size_t head_off = (size_t)kh * KN_PAGE_BLK * hd + sub * 8;
	const size_t blk_stride = (size_t)a.n_kv_heads * KN_PAGE_BLK * hd;

	for (int base = start + warp * PPW; base < end; base += ATTN_U * NGRP) {
		uint4 kv[ATTN_U][2];
		bool ok[ATTN_U];
#pragma unroll
		for (int u = 0; u < ATTN_U; u++) {
			const int p = base + u * NGRP + grp;
			const int32_t blk = p < end ? trow[p / KN_PAGE_BLK] : -1;
			ok[u] = blk >= 0;
			if (ok[u] && lane_on) {
				const size_t o = blk * blk_stride + head_off + (size_t)(p % KN_PAGE_BLK) * hd;
				kv[u][0] = kn_ld_stream(a.k_cache + o);
				kv[u][1] = kn_ld_stream(a.v_cache + o);
			} else {
				kv[u][0] = kv[u][1] = make_uint4(0, 0, 0, 0);
			}
		}
		/* the step's ATTN_U positions' scores first (independent chains),
		 * then one rescale per head and the positions added in order. Once
		 * a rescale and two exp2f per position and head, each waiting on
		 * the last: H200, back to back, 8B heads, 4k x 16 columns 148 ->
		 * 137 us, 4k x 64 571 -> 516, 32k x 1 83 -> 76, 32k x 2 147 ->
		 * 133; 8B decode at 32k batch 8 23.3 -> 21.4 ms */
		float d[ATTN_U][GM];
#pragma unroll
		for (int u = 0; u < ATTN_U; u++) {
			float kf[8];
			kn_bf16x8_to_f32(kv[u][0], kf);
#pragma unroll
			for (int g = 0; g < GM; g++) {
				float x = 0.f;
#pragma unroll
				for (int i = 0; i < 8; i++)
					x += qf[g][i] * kf[i];
				d[u][g] = x;
			}
			group_sums<GM, LP>(d[u], lane);
		}
		/* every head of GM, idle ones (g >= G) too: a test of g < G here
		 * splits the step into blocks the compiler cannot interleave (tried:
		 * the next run's probes 2-4% slower, 4k x 64 499 -> 520 us) */
#pragma unroll
		for (int g = 0; g < GM; g++) {
			float mn = m[g];
#pragma unroll
			for (int u = 0; u < ATTN_U; u++)
				if (ok[u])
					mn = fmaxf(mn, d[u][g]);
			/* equal: nothing new above the max (and -inf - -inf is NaN) */
			const float corr = mn == m[g] ? 1.f : exp2f(m[g] - mn);
			l[g] *= corr;
#pragma unroll
			for (int i = 0; i < 8; i++)
				acc[g][i] *= corr;
			m[g] = mn;
		}
#pragma unroll
		for (int u = 0; u < ATTN_U; u++) {
			float vf[8];
			kn_bf16x8_to_f32(kv[u][1], vf);
#pragma unroll
			for (int g = 0; g < GM; g++)
				if (ok[u] && g < G) {
					const float pe = exp2f(d[u][g] - m[g]);
					l[g] += pe;
#pragma unroll
					for (int i = 0; i < 8; i++)
						acc[g][i] += pe * vf[i];
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
	float *part = a.part + (((size_t)c * nvh + vh) * splits + s) * GM * part_stride(hd);
	for (int e = threadIdx.x; e < GM * hd; e += ATTN_WARPS * 32) {
		const int g = e / hd, d = e % hd;
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
		float *pg = part + g * part_stride(hd);
		pg[d] = A;
		if (d == 0) {
			pg[hd] = M;
			pg[hd + 1] = L;
		}
	}
	/* wider plans: attn_merge_kernel (faster there: 16 columns at ctx 4k,
	 * 156.6 us against 166.6 with the last block merging) */
	if (a.n > 2)
		return;
	const float *part0 = part - (size_t)s * GM * part_stride(hd);
	const int k = (len + split - 1) / split;
	if (k == 1) {
		__syncthreads();
		merge_splits<GM>(a, part0, c, v.hb, G, 1, threadIdx.x, ATTN_WARPS * 32, hd);
		return;
	}
	__threadfence();
	__syncthreads();
	unsigned *cnt = a.counters + (size_t)c * nvh + vh;
	if (threadIdx.x == 0)
		last = atomicAdd(cnt, 1u) == (unsigned)k - 1;
	__syncthreads();
	if (!last)
		return;
	__threadfence();
	/* merge_last() for more than 16 splits (1B, batch 1, ctx 4k: 1.120 ->
	 * 1.114 ms a step), merge_splits() below (ctx 512: 1.012 against 1.026) */
	if (k > 16 && k <= COL_PIECES_MAX) /* <= always, by col_split() */
		merge_last<HD, GM>(a, part0, c, v.hb, G, k, hd, sm_w, sm_lw, sm_L);
	else
		merge_splits<GM>(a, part0, c, v.hb, G, k, threadIdx.x, ATTN_WARPS * 32, hd);
	if (threadIdx.x == 0)
		*cnt = 0;
}

/* grid (ceil(n / cpb), n_kv_heads, ceil(GM * HD / 128)), block 128, one
 * output element per thread for each of the block's cpb columns: the second
 * pass, merging a column's splits (of `split` positions) in order 0..k-1,
 * the tile kernel's by merge_fold(), the column kernel's by merge_splits().
 * Wide plans take 16 columns a block: most of their columns are a run's or a
 * serial warp's, and a block a column that finds nothing to do cost 8B 82 us
 * a layer in a 2,048-token prefill (H100, 65,536 blocks). */
template <int HD, int GM, bool PAD>
static __global__ void attn_merge_kernel(const struct kn_cu_attn_args a, int splits, int split, int fold, int cpb)
{
	kn_pdl_wait();
	kn_pdl_trigger();
	const int hd = PAD ? a.head_dim : HD;
	const int vh = blockIdx.y;
	const struct vhead v = vhead_of(a, vh, GM);
	const int e = blockIdx.z * blockDim.x + threadIdx.x;
	/* lane i of every warp holds the slot and position of the block's
	 * column i (cpb <= 32, a multiple of a.serial): a serial warp's columns
	 * are then found by shuffles, not by loads a column */
	const int lane = threadIdx.x & 31, cb = blockIdx.x * cpb;
	int lslot = KN_CU_PAD_SLOT, lpos = -1;
	if (lane < cpb && cb + lane < a.n) {
		lslot = a.cols[cb + lane].slot;
		lpos = a.cols[cb + lane].pos;
	}
	int run0 = -1;
	bool in_run = false;
	for (int i = 0; i < cpb && cb + i < a.n; i++) {
		const int c = cb + i;
		if (a.runs) {
			if ((c & ~(a.runs - 1)) != run0) { /* every lane of the block asks the same */
				run0 = c & ~(a.runs - 1);
				in_run = run_uniform(a, run0, a.runs);
			}
			if (in_run)
				continue; /* the run kernel's */
		}
		if (a.serial) { /* serial_warp() of the warp holding column c */
			const int g0 = i - i % a.serial;
			const int s0 = __shfl_sync(0xffffffffu, lslot, g0), p0 = __shfl_sync(0xffffffffu, lpos, g0);
			const bool mine = lane >= g0 && lane < g0 + a.serial;
			if (__all_sync(0xffffffffu, !mine || (lslot == s0 && lpos == p0 + lane - g0)) &&
			    s0 != KN_CU_PAD_SLOT)
				continue; /* the tile kernel's warp folded it */
		}
		const struct kn_column col = a.cols[c];
		if (col.slot == KN_CU_PAD_SLOT) {
			if (e < v.g * hd && a.len_lo == 0)
				a.out[(size_t)c * a.n_heads * hd + (size_t)v.hb * hd + e] = 0.f;
			continue;
		}
		if (!len_in(a, col.pos + 1))
			continue;
		const float *part = a.part + ((size_t)c * gridDim.y + vh) * splits * GM * part_stride(hd);
		const int cs = split < 0 ? own_split(col.pos + 1, -split) : split;
		if (fold)
			merge_fold<GM>(a, part, c, v.hb, v.g, (col.pos + cs) / cs, e, GM * hd, hd);
		else
			merge_splits<GM>(a, part, c, v.hb, v.g, (col.pos + cs) / cs, e, GM * hd, hd);
	}
}

/* The grid's pieces (its z) for contexts up to @p max_ctx at @p split. */
static int splits_of(int max_ctx, int split)
{
	if (split < 0) { /* each column's own: at most -split pieces, each >= 64 positions */
		const int k = (max_ctx + 63) / 64;
		return k < -split ? k : -split;
	}
	return (max_ctx + split - 1) / split;
}

static size_t part_bytes(int n, int n_heads, int n_kv_heads, int head_dim, int splits)
{
	const int gm = gmax_of(n_heads / n_kv_heads);
	return (size_t)n * n_kv_heads * nsub_of(n_heads, n_kv_heads) * splits * gm * part_stride(head_dim) *
	       sizeof(float);
}

int kn_cuda_attn_counters(int n, int n_heads, int n_kv_heads)
{
	return n * n_kv_heads * nsub_of(n_heads, n_kv_heads);
}

size_t kn_cuda_attn_workspace(int n, int n_heads, int n_kv_heads, int head_dim, int max_ctx,
			      int split)
{
	const size_t tile = split != 0 ? part_bytes(n, n_heads, n_kv_heads, head_dim, splits_of(max_ctx, split)) : 0;
	const size_t col = part_bytes(n, n_heads, n_kv_heads, head_dim, col_splits_max(max_ctx));
	return tile > col ? tile : col;
}

int kn_cuda_attn_tile_split(int n, int max_ctx, int n_heads, int n_kv_heads)
{
	/* Measured (8B, H200): plans of 32 decode columns at ctx 512 with 256-position
	 * splits ran 128 warps of 64 serial pages and lost to the column kernel
	 * (7.5 vs 6.4 ms a step); aim at ~4096 warps over the longest context, in
	 * splits of 64..256 positions (512 for prefill-wide plans, below). */
	const int cpw = 16 / gmax_of(n_heads / n_kv_heads);
	const long wps = (long)((n + cpw - 1) / cpw) * n_kv_heads;
	/* plans of prompt chunks: pieces of 512 (H100, 2,048-token prefill,
	 * two rounds: 256 -> 512 1B 12.8 -> 12.3 ms, 8B 67.6 -> 66.5; 1,024
	 * level with 512, one piece of 2,048 slower) */
	if (n > 256)
		return 512;
	if (n <= 16) /* narrow: ~64 pieces at the longest context (4k: 15% -> 32k: 45% of copy bw alone) */
		return max_ctx / 64 < 64 ? 64 : (max_ctx / 64 + 15) / 16 * 16;
	const long pieces = (4096 + wps - 1) / wps;
	int s = (int)((max_ctx / pieces + 15) / 16 * 16);
	return s < 64 ? 64 : s > 256 ? 256 : s;
}

int kn_cuda_attn_own_split(int n, int head_dim, int n_heads, int n_kv_heads)
{
	/* Measured (H100, .devcarry/run9.sh, narrow plans of a stage of 32k
	 * positions against pieces of 64 / 128 / 256 positions at every
	 * context): the best piece grew with the context, about 32 pieces a
	 * column (512 positions: 64; 2,048: 64; 8,192: 256), and at one column
	 * more (8B, 16,384 positions: 256 = 64 pieces, 6.44 ms against 7.06
	 * in 32) */
	if (n > 16 || !kn_cuda_attn_tile_ok(head_dim) || n_heads / n_kv_heads > 8)
		return 0;
	return n == 1 ? -64 : -32;
}

int kn_cuda_attn_tile_ok(int head_dim)
{
	return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

/* ---- tensor-core tile kernel ---- */

static __device__ __forceinline__ void mma16816(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p)
{
	const unsigned s = (unsigned)__cvta_generic_to_shared(p);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

static __device__ __forceinline__ void ldsm_x4_t(uint32_t *r, const void *p)
{
	const unsigned s = (unsigned)__cvta_generic_to_shared(p);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

static __device__ __forceinline__ void cp_async16(void *smem, const void *g)
{
	const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(g));
}

static __device__ __forceinline__ void cp_commit(void)
{
	asm volatile("cp.async.commit_group;");
}

template <int N> static __device__ __forceinline__ void cp_wait(void)
{
	asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

/* (a, b) -> bf16 pair hi; lo = bf16 pair of the remainders. */
static __device__ __forceinline__ void split_pair(float a, float b, uint32_t &hi, uint32_t &lo)
{
	const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
	const float2 hf = __bfloat1622float2(h);
	const __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
	hi = *reinterpret_cast<const uint32_t *>(&h);
	lo = *reinterpret_cast<const uint32_t *>(&l);
}

/* Warps per block. In 16-key steps a warp holds two stages of a K and a V
 * page (128 * HD bytes: 32 KB a block at HD 128, under the static limit);
 * in 64-key steps (steps64) a step's K and V (256 * HD bytes, dynamic
 * shared memory: 64 KB a block at HD 64 and 128, tile_smem()). */
template <int HD> struct tile_cfg {
	static constexpr int WPB = HD >= 128 ? 2 : 4;
};

template <int HD> static constexpr size_t tile_smem(void)
{
	return (size_t)tile_cfg<HD>::WPB * 2 * RUN_KEYS * HD * sizeof(kn_bf16);
}

/*
 * One step of the tile kernels' online softmax, the unit of their
 * arithmetic (the tile kernel's pieces and the run kernel's tiles call the
 * same two functions, so a row's bits are the same in both): up to 64 keys
 * k0 .. k0 + 16 np - 1, staged in shared memory as np consecutive 16-key
 * pages (ks, vs; 64 keys are the run kernel's tile, the swizzle is the
 * page's), for a warp's 16 rows (lane: rows g and g + 8). A row keeps the
 * keys up to lim0 / lim1 (-1: none); the others score -inf. Steps start at
 * a piece's first position (a multiple of 64 where the pieces are).
 *
 * attn_scores(): S = q K^T into sc (keys past np pages -inf), the step's
 * max, the correction of (m, l, acc), and P = 2^(S - m) in sc, whose sum is
 * added to the lane's l. attn_pv(): acc += P V. The products and sums are
 * spelled as intrinsics so that inlining cannot contract them differently
 * in the two kernels.
 */
template <int HD, int QF>
static __device__ __forceinline__ void attn_scores(const uint4 *ks, int np, int k0, bool mask,
						   const uint32_t (&qa)[HD / 16][QF][4], int lim0, int lim1, float &m0,
						   float &m1, float &l0, float &l1, float (&acc)[HD / 8][4],
						   float (&sc)[RUN_KEYS / 8][4])
{
	constexpr int U = HD / 8, SWM = U < 8 ? U - 1 : 7, KS = HD / 16, NT = HD / 8, NK = RUN_KEYS / 8;
	const int lane = threadIdx.x & 31, t = lane & 3, mi = lane >> 3;
#pragma unroll
	for (int i = 0; i < NK; i++)
		sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
#pragma unroll
	for (int kb = 0; kb < RUN_KEYS / 16; kb++) {
		if (kb >= np) {
			sc[2 * kb][0] = sc[2 * kb][1] = sc[2 * kb][2] = sc[2 * kb][3] = -INFINITY;
			sc[2 * kb + 1][0] = sc[2 * kb + 1][1] = sc[2 * kb + 1][2] = sc[2 * kb + 1][3] = -INFINITY;
			continue;
		}
		/* ldmatrix row: matrix mi -> keys kb 16 + (mi / 2) 8.., hd half mi % 2 */
		const int key = kb * 16 + (mi >> 1) * 8 + (lane & 7);
#pragma unroll
		for (int j = 0; j < KS; j++) {
			uint32_t b[4];
			const int u = 2 * j + (mi & 1);
			ldsm_x4(b, &ks[key * U + (u ^ (key & SWM))]);
#pragma unroll
			for (int f = 0; f < QF; f++) {
				mma16816(sc[2 * kb], qa[j][f], b[0], b[1]);
				mma16816(sc[2 * kb + 1], qa[j][f], b[2], b[3]);
			}
		}
	}
	if (mask)
#pragma unroll
		for (int i = 0; i < NK; i++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				if (k0 + i * 8 + 2 * t + (e & 1) > (e < 2 ? lim0 : lim1))
					sc[i][e] = -INFINITY;
	float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
	for (int i = 0; i < NK; i++) {
		mx0 = fmaxf(mx0, fmaxf(sc[i][0], sc[i][1]));
		mx1 = fmaxf(mx1, fmaxf(sc[i][2], sc[i][3]));
	}
	mx0 = quad_max(mx0);
	mx1 = quad_max(mx1);
	const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
	/* a row with no key yet (all -inf) subtracts 0: P = 0, the correction
	 * 2^-inf = 0 scales nothing; a row with keys subtracts its max */
	const float b0 = mn0 == -INFINITY ? 0.f : mn0, b1 = mn1 == -INFINITY ? 0.f : mn1;
	const float cr0 = ex2_ftz(__fsub_rn(m0, b0)), cr1 = ex2_ftz(__fsub_rn(m1, b1));
	m0 = mn0;
	m1 = mn1;
	float s0 = 0.f, s1 = 0.f;
#pragma unroll
	for (int i = 0; i < NK; i++) {
		sc[i][0] = ex2_ftz(__fsub_rn(sc[i][0], b0));
		sc[i][1] = ex2_ftz(__fsub_rn(sc[i][1], b0));
		sc[i][2] = ex2_ftz(__fsub_rn(sc[i][2], b1));
		sc[i][3] = ex2_ftz(__fsub_rn(sc[i][3], b1));
		s0 = __fadd_rn(s0, __fadd_rn(sc[i][0], sc[i][1]));
		s1 = __fadd_rn(s1, __fadd_rn(sc[i][2], sc[i][3]));
	}
	l0 = __fmaf_rn(l0, cr0, s0);
	l1 = __fmaf_rn(l1, cr1, s1);
#pragma unroll
	for (int i = 0; i < NT; i++) {
		acc[i][0] = __fmul_rn(acc[i][0], cr0);
		acc[i][1] = __fmul_rn(acc[i][1], cr0);
		acc[i][2] = __fmul_rn(acc[i][2], cr1);
		acc[i][3] = __fmul_rn(acc[i][3], cr1);
	}
}

/* A piece's (m, l, acc) of a warp's rows folded into (M, L, A) where f0 /
 * f1 (the row has keys in the piece), as merge_fold() folds partials. A
 * (from the lane's own pointer) is lane-major words (AT float: element
 * i * 4 + e at A[(i * 4 + e) * 32]; the tile kernel's serial warps) or a
 * float4 a lane (AT float4: elements i * 4 .. i * 4 + 3 at A[i * 32], one
 * 16-byte load and store an i, the warp's 512 bytes without bank
 * conflicts; the run kernel). Where A lives changes nothing of what is
 * added to what (a float4 element of a row without keys in the piece is
 * stored back as it was read), so the two keep one set of bits. */
template <int NT, typename AT>
static __device__ __forceinline__ void fold_piece(bool f0, bool f1, float &M0, float &M1, float &L0, float &L1,
						  float m0, float m1, float l0, float l1, const float (&acc)[NT][4], AT *A)
{
	float wa0 = 0.f, wb0 = 0.f, wa1 = 0.f, wb1 = 0.f;
	if (f0) {
		fold_weights(M0, m0, wa0, wb0);
		L0 = fold_add(L0, wa0, l0, wb0);
	}
	if (f1) {
		fold_weights(M1, m1, wa1, wb1);
		L1 = fold_add(L1, wa1, l1, wb1);
	}
	if constexpr (sizeof(AT) == sizeof(float4)) {
		if (!f0 && !f1)
			return;
#pragma unroll
		for (int i = 0; i < NT; i++) {
			float4 v = A[i * 32];

			if (f0) {
				v.x = fold_add(v.x, wa0, acc[i][0], wb0);
				v.y = fold_add(v.y, wa0, acc[i][1], wb0);
			}
			if (f1) {
				v.z = fold_add(v.z, wa1, acc[i][2], wb1);
				v.w = fold_add(v.w, wa1, acc[i][3], wb1);
			}
			A[i * 32] = v;
		}
	} else {
#pragma unroll
		for (int i = 0; i < NT; i++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				if (e < 2 ? f0 : f1) {
					float &a = A[(i * 4 + e) * 32];
					a = fold_add(a, e < 2 ? wa0 : wa1, acc[i][e], e < 2 ? wb0 : wb1);
				}
	}
}

template <int HD, int QF>
static __device__ __forceinline__ void attn_pv(const uint4 *vs, int np, const float (&sc)[RUN_KEYS / 8][4],
					       float (&acc)[HD / 8][4])
{
	constexpr int U = HD / 8, SWM = U < 8 ? U - 1 : 7;
	const int lane = threadIdx.x & 31, mi = lane >> 3;
#pragma unroll
	for (int kb = 0; kb < RUN_KEYS / 16; kb++) {
		if (kb >= np)
			break;
		/* P of keys kb 16 .. as the A operand: a0 = keys 2t.. of row g,
		 * a1 = row g + 8, a2 / a3 keys 8 + 2t.. (hi, then lo where QF 2) */
		uint32_t pa[QF][4], lo[4];
		split_pair(sc[2 * kb][0], sc[2 * kb][1], pa[0][0], lo[0]);
		split_pair(sc[2 * kb][2], sc[2 * kb][3], pa[0][1], lo[1]);
		split_pair(sc[2 * kb + 1][0], sc[2 * kb + 1][1], pa[0][2], lo[2]);
		split_pair(sc[2 * kb + 1][2], sc[2 * kb + 1][3], pa[0][3], lo[3]);
		if (QF == 2)
#pragma unroll
			for (int e = 0; e < 4; e++)
				pa[QF - 1][e] = lo[e];
		/* matrix mi: keys kb 16 + (mi % 2) 8.., hd columns 16 i + (mi / 2) 8.. */
		const int key = kb * 16 + (mi & 1) * 8 + (lane & 7);
#pragma unroll
		for (int i = 0; i < HD / 16; i++) {
			uint32_t b[4];
			const int u = 2 * i + (mi >> 1);
			ldsm_x4_t(b, &vs[key * U + (u ^ (key & SWM))]);
#pragma unroll
			for (int f = 0; f < QF; f++) {
				mma16816(acc[2 * i], pa[f], b[0], b[1]);
				mma16816(acc[2 * i + 1], pa[f], b[2], b[3]);
			}
		}
	}
}

/*
 * grid (ceil(n / (WPB * CPW)), n_kv_heads, splits or 1: attn_tile_kernel()), block WPB warps, each warp
 * independent (no block barrier). Warp rows r = ci * GM + gi: column c0 + ci,
 * head kh * G + gi (gi >= G or ci >= CPW: idle row). CPW columns a warp:
 * 16 / GM, or 1 on plans of up to 64 columns (tile_cpw()); a row's arithmetic is its own
 * (mma rows do not mix, idle rows add nothing), so a column's bits do not
 * depend on CPW. Lane (g = lane / 4, t = lane % 4)
 * holds rows g and g + 8 in the mma fragment layouts. Per slot group: keys
 * [split start, min(split end, last position of the group + 1)) in 16-key
 * pages, or (S64) in steps of up to 64 keys from the piece's start
 * (attn_scores(), attn_pv(), the run kernel's arithmetic): S = Q K^T (K via
 * ldmatrix), online softmax per row (base-2, the scale folded into q), O +=
 * P V (V via ldmatrix.trans); the partial (O, m, l) of each row goes to the
 * same workspace layout as the column kernel's. S64 is taken for bf16 q
 * and P only (kn_cu_attn_args.steps64, the engine's default); the exact
 * (hi + lo) launches keep the 16-key pages.
 */
template <int HD, int GM, bool EXACT, int CPW, bool SERIAL, bool S64>
static __device__ __forceinline__ void attn_tile_piece(const struct kn_cu_attn_args &a, int splits, int s, bool serial)
{
	static_assert(CPW >= 1 && CPW * GM <= 16, "a warp's 16 rows hold CPW columns of GM heads");
	constexpr int WPB = tile_cfg<HD>::WPB, U = HD / 8;
	constexpr int SWM = U < 8 ? U - 1 : 7, KS = HD / 16, NT = HD / 8, QF = EXACT ? 2 : 1;
	extern __shared__ uint4 tsm[]; /* S64: [warp][K, V][RUN_KEYS * U], tile_smem() */
	/* else 16-key steps: two stages of a K and a V page a warp */
	__shared__ uint4 sm[S64 ? 1 : WPB][2][2][S64 ? 1 : KN_PAGE_BLK * U];
	/* a serial warp's folded A, lane-major: [warp][acc element][lane] */
	__shared__ float fsm[SERIAL ? WPB : 1][SERIAL ? NT * 4 : 1][32];

	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
	const int c0 = (blockIdx.x * WPB + warp) * CPW, kh = blockIdx.y;
	uint4 *const kbuf = tsm + (size_t)warp * 2 * RUN_KEYS * U, *const vbuf = kbuf + RUN_KEYS * U;
	/* split < 0 (one column a warp): the column's own pieces */
	int TS = a.split;
	if (TS < 0 && c0 < a.n)
		TS = own_split(a.cols[c0].pos + 1, -TS);
	const int kstart = s * TS;
	const int G = a.n_heads / a.n_kv_heads;
	int cslot[CPW], cpos[CPW];
#pragma unroll
	for (int ci = 0; ci < CPW; ci++) {
		const int c = c0 + ci;
		cslot[ci] = KN_CU_PAD_SLOT;
		cpos[ci] = -1;
		if (c < a.n) {
			const struct kn_column col = a.cols[c];
			if (col.slot != KN_CU_PAD_SLOT && col.pos >= kstart && len_in(a, col.pos + 1)) {
				cslot[ci] = col.slot;
				cpos[ci] = col.pos;
			}
		}
	}
	const int r0 = g, r1 = g + 8;
	const int ci0 = r0 / GM, gi0 = r0 % GM, ci1 = r1 / GM, gi1 = r1 % GM;
	const size_t blk_stride = (size_t)a.n_kv_heads * KN_PAGE_BLK * HD;
	const size_t head_off = (size_t)kh * KN_PAGE_BLK * HD;
	const float qs = a.scale * LOG2E;
	uint32_t done = 0;

	for (;;) {
		/* the next slot group: the first column not yet served, and every
		 * column of the same slot (uniform across the warp) */
		int slot = KN_CU_PAD_SLOT, hi = -1;
		uint32_t gm = 0;
#pragma unroll
		for (int ci = 0; ci < CPW; ci++) {
			if (cslot[ci] == KN_CU_PAD_SLOT || (done >> ci & 1u))
				continue;
			if (slot == KN_CU_PAD_SLOT)
				slot = cslot[ci];
			if (cslot[ci] == slot) {
				gm |= 1u << ci;
				hi = max(hi, cpos[ci]);
			}
		}
		if (slot == KN_CU_PAD_SLOT)
			break;
		done |= gm;
		bool on0 = false, on1 = false;
		int pos0 = -1, pos1 = -1, cc0 = 0, cc1 = 0;
#pragma unroll
		for (int ci = 0; ci < CPW; ci++) {
			if (ci == ci0) {
				on0 = (gm >> ci & 1u) && gi0 < G;
				pos0 = cpos[ci];
			}
			if (ci == ci1) {
				on1 = (gm >> ci & 1u) && gi1 < G;
				pos1 = cpos[ci];
			}
		}
		cc0 = c0 + ci0;
		cc1 = c0 + ci1;
		/* q fragments: a0 (row g, k 2t..), a1 (row g+8), a2 (row g, k 2t+8..), a3 (row g+8) */
		uint32_t qa[KS][QF][4];
		{
			const float *q0 = a.q + (size_t)cc0 * a.q_stride + (size_t)(kh * G + gi0) * HD;
			const float *q1 = a.q + (size_t)cc1 * a.q_stride + (size_t)(kh * G + gi1) * HD;
#pragma unroll
			for (int j = 0; j < KS; j++) {
#pragma unroll
				for (int h = 0; h < 2; h++) {
					const int d = j * 16 + 2 * t + 8 * h;
					float2 v0 = on0 ? *reinterpret_cast<const float2 *>(q0 + d) : make_float2(0.f, 0.f);
					float2 v1 = on1 ? *reinterpret_cast<const float2 *>(q1 + d) : make_float2(0.f, 0.f);
					uint32_t h0, l0, h1, l1;
					split_pair(v0.x * qs, v0.y * qs, h0, l0);
					split_pair(v1.x * qs, v1.y * qs, h1, l1);
					qa[j][0][2 * h] = h0;
					qa[j][0][2 * h + 1] = h1;
					if (EXACT) {
						qa[j][QF - 1][2 * h] = l0;
						qa[j][QF - 1][2 * h + 1] = l1;
					}
				}
			}
		}
		const int32_t *trow = a.table + (size_t)slot * a.max_bps;
		/* a serial warp's running fold of its rows' pieces (A in fsm) */
		float M0 = -INFINITY, M1 = -INFINITY, L0 = 0.f, L1 = 0.f;
		if (SERIAL && serial)
#pragma unroll
			for (int i = 0; i < NT * 4; i++)
				fsm[SERIAL ? warp : 0][i][lane] = 0.f;
		const int npieces = serial ? hi / TS + 1 : 1;
		for (int sp = 0; sp < npieces; sp++) {
			const int kst = serial ? sp * TS : kstart;
			float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
			float acc[NT][4];
#pragma unroll
			for (int i = 0; i < NT; i++)
				acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

			const int kend = min(kst + TS, hi + 1);
			if constexpr (S64) {
				/* K or V of the keys k0 .. k0 + 16 np - 1 (up to kend) into buf,
				 * page by page in the run kernel's layout; keys past kend and
				 * missing pages are zeroed (V there may be NaN bits, and P is
				 * 0 there, but 0 x NaN is NaN) */
				auto stage = [&](uint4 *buf, const kn_bf16 *cache, int k0, int np) {
					for (int pg = 0; pg < np; pg++) {
						const int kp = k0 + pg * KN_PAGE_BLK;
						const int32_t blk = trow[kp / KN_PAGE_BLK];
						const uint4 *src =
							reinterpret_cast<const uint4 *>(cache + blk * blk_stride + head_off);
						uint4 *dst = buf + pg * KN_PAGE_BLK * U;
#pragma unroll
						for (int i = lane; i < KN_PAGE_BLK * U; i += 32) {
							const int r = i / U, u = i % U, so = r * U + (u ^ (r & SWM));
							if (blk >= 0 && kp + r < kend)
								cp_async16(&dst[so], src + i);
							else
								dst[so] = make_uint4(0, 0, 0, 0);
						}
					}
					cp_commit();
				};
				auto pages = [&](int k0) {
					return min(RUN_KEYS / KN_PAGE_BLK, (kend - k0 + KN_PAGE_BLK - 1) / KN_PAGE_BLK);
				};
				const int lim0 = on0 ? min(pos0, kend - 1) : -1, lim1 = on1 ? min(pos1, kend - 1) : -1;
				/* steps of 64 keys from the piece's start: a step's V is staged
				 * while its scores are taken, the next step's K during P V */
				const int nst = (kend - kst + RUN_KEYS - 1) / RUN_KEYS;
				stage(kbuf, a.k_cache, kst, pages(kst));
				for (int st = 0; st < nst; st++) {
					const int k0 = kst + st * RUN_KEYS, np = pages(k0);
					stage(vbuf, a.v_cache, k0, np);
					cp_wait<1>(); /* this step's K */
					__syncwarp();
					float sc[RUN_KEYS / 8][4];
					attn_scores<HD, QF>(kbuf, np, k0, true, qa, lim0, lim1, m0, m1, l0, l1, acc,
							    sc);
					__syncwarp(); /* every lane has read K */
					if (st + 1 < nst) {
						stage(kbuf, a.k_cache, k0 + RUN_KEYS, pages(k0 + RUN_KEYS));
						cp_wait<1>(); /* this step's V */
					} else {
						cp_wait<0>();
					}
					__syncwarp();
					attn_pv<HD, QF>(vbuf, np, sc, acc);
					__syncwarp(); /* every lane has read V */
				}
			} else {
				const int nch = (kend - kst + KN_PAGE_BLK - 1) / KN_PAGE_BLK;
				auto issue = [&](int ch) {
					const int kp = kst + ch * KN_PAGE_BLK;
					const int32_t blk = trow[kp / KN_PAGE_BLK];
					uint4 *ks = sm[warp][ch & 1][0], *vs = sm[warp][ch & 1][1];
					const uint4 *kg = reinterpret_cast<const uint4 *>(a.k_cache + blk * blk_stride + head_off);
					const uint4 *vg = reinterpret_cast<const uint4 *>(a.v_cache + blk * blk_stride + head_off);
#pragma unroll
					for (int i = lane; i < KN_PAGE_BLK * U; i += 32) {
						const int r = i / U, u = i % U, so = r * U + (u ^ (r & SWM));
						if (blk >= 0) {
							cp_async16(&ks[so], kg + i);
							cp_async16(&vs[so], vg + i);
						} else {
							ks[so] = make_uint4(0, 0, 0, 0);
							vs[so] = make_uint4(0, 0, 0, 0);
						}
					}
					cp_commit();
				};
				issue(0);
				for (int ch = 0; ch < nch; ch++) {
					if (ch + 1 < nch) {
						issue(ch + 1);
						cp_wait<1>();
					} else {
						cp_wait<0>();
					}
					__syncwarp();
					const int kp0 = kst + ch * KN_PAGE_BLK;
					if (kend - kp0 < KN_PAGE_BLK) {
						/* V rows past the group's last position may never have been
						 * written (NaN bits): P is 0 there, but 0 x NaN is NaN. */
						uint4 *vw = sm[warp][ch & 1][1];
						const int valid = kend - kp0;
						for (int i = lane; i < (KN_PAGE_BLK - valid) * U; i += 32) {
							const int r = valid + i / U, u = i % U;
							vw[r * U + (u ^ (r & SWM))] = make_uint4(0, 0, 0, 0);
						}
						__syncwarp();
					}
					const uint4 *ks = sm[warp][ch & 1][0], *vs = sm[warp][ch & 1][1];
					float sc[2][4];
#pragma unroll
					for (int i = 0; i < 2; i++)
						sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
					{
						/* lane's ldmatrix row: matrix mi = lane / 8 -> keys (mi / 2) * 8.., hd half mi % 2 */
						const int mi = lane >> 3, key = (mi >> 1) * 8 + (lane & 7);
#pragma unroll
						for (int j = 0; j < KS; j++) {
							uint32_t b[4];
							const int u = 2 * j + (mi & 1);
							ldsm_x4(b, &ks[key * U + (u ^ (key & SWM))]);
#pragma unroll
							for (int f = 0; f < QF; f++) {
								mma16816(sc[0], qa[j][f], b[0], b[1]);
								mma16816(sc[1], qa[j][f], b[2], b[3]);
							}
						}
					}
					/* mask: row position, row activity */
#pragma unroll
					for (int i = 0; i < 2; i++)
#pragma unroll
						for (int e = 0; e < 4; e++) {
							const int key = kp0 + i * 8 + 2 * t + (e & 1);
							const bool ok = e < 2 ? (on0 && key <= pos0) : (on1 && key <= pos1);
							if (!ok)
								sc[i][e] = -INFINITY;
						}
					float mx0 = fmaxf(fmaxf(sc[0][0], sc[0][1]), fmaxf(sc[1][0], sc[1][1]));
					float mx1 = fmaxf(fmaxf(sc[0][2], sc[0][3]), fmaxf(sc[1][2], sc[1][3]));
					mx0 = quad_max(mx0);
					mx1 = quad_max(mx1);
					const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
					const float cr0 = mn0 == -INFINITY ? 1.f : exp2f(m0 - mn0);
					const float cr1 = mn1 == -INFINITY ? 1.f : exp2f(m1 - mn1);
					m0 = mn0;
					m1 = mn1;
					float p[2][4];
#pragma unroll
					for (int i = 0; i < 2; i++)
#pragma unroll
						for (int e = 0; e < 4; e++) {
							const float mn = e < 2 ? mn0 : mn1;
							p[i][e] = mn == -INFINITY ? 0.f : exp2f(sc[i][e] - mn);
						}
					l0 = l0 * cr0 + ((p[0][0] + p[0][1]) + (p[1][0] + p[1][1]));
					l1 = l1 * cr1 + ((p[0][2] + p[0][3]) + (p[1][2] + p[1][3]));
#pragma unroll
					for (int i = 0; i < NT; i++) {
						acc[i][0] *= cr0;
						acc[i][1] *= cr0;
						acc[i][2] *= cr1;
						acc[i][3] *= cr1;
					}
					/* P as the A operand: a0 = keys 2t.. of row g, a1 = row g+8, a2/a3 keys 8+2t.. */
					/* O += P V on the page: attn_pv()'s one-page step (P's
					 * rows 2 .. 7 past the page are never read) */
					float ps[RUN_KEYS / 8][4];
#pragma unroll
					for (int e = 0; e < 4; e++) {
						ps[0][e] = p[0][e];
						ps[1][e] = p[1][e];
					}
					attn_pv<HD, QF>(vs, 1, ps, acc);
					__syncwarp();
				}
			}
			l0 = quad_sum(l0);
			l1 = quad_sum(l1);
			if (SERIAL && serial) {
				/* rows with keys in this piece fold it, as merge_fold() does */
				fold_piece<NT>(on0 && pos0 >= kst, on1 && pos1 >= kst, M0, M1, L0, L1, m0, m1, l0, l1, acc,
					       &fsm[SERIAL ? warp : 0][0][lane]);
				continue;
			}
			float *pbase = a.part + (size_t)s * GM * part_stride(HD);
			const size_t cstride = (size_t)splits * GM * part_stride(HD);
			if (on0) {
				float *pg = pbase + ((size_t)cc0 * a.n_kv_heads + kh) * cstride + gi0 * part_stride(HD);
#pragma unroll
				for (int i = 0; i < NT; i++)
					*reinterpret_cast<float2 *>(pg + i * 8 + 2 * t) = make_float2(acc[i][0], acc[i][1]);
				if (t == 0) {
					pg[HD] = m0;
					pg[HD + 1] = l0;
				}
			}
			if (on1) {
				float *pg = pbase + ((size_t)cc1 * a.n_kv_heads + kh) * cstride + gi1 * part_stride(HD);
#pragma unroll
				for (int i = 0; i < NT; i++)
					*reinterpret_cast<float2 *>(pg + i * 8 + 2 * t) = make_float2(acc[i][2], acc[i][3]);
				if (t == 0) {
					pg[HD] = m1;
					pg[HD + 1] = l1;
				}
			}
		} /* pieces */
		if (SERIAL && serial) {
			float *o0 = a.out + (size_t)cc0 * a.n_heads * HD + (size_t)(kh * G + gi0) * HD;
			float *o1 = a.out + (size_t)cc1 * a.n_heads * HD + (size_t)(kh * G + gi1) * HD;
#pragma unroll
			for (int i = 0; i < NT; i++) {
				const float *A = &fsm[SERIAL ? warp : 0][i * 4][lane];
				if (on0)
					*reinterpret_cast<float2 *>(o0 + i * 8 + 2 * t) = make_float2(A[0] / L0, A[32] / L0);
				if (on1)
					*reinterpret_cast<float2 *>(o1 + i * 8 + 2 * t) =
						make_float2(A[64] / L1, A[96] / L1);
			}
		}
	}
}

/* The kernel: a block's warps, each over its pieces z, z + gridDim.z, ...
 * below splits (one each where the grid has every piece, a serial warp only
 * the first, where it folds them all). Serial launches (wide plans) take a
 * grid of one z: a prefill's warps are serial or the run kernel's, and the
 * blocks that find nothing to do cost their scheduling (64 KB of shared
 * memory a block in 64-key steps, three blocks an SM: the 8B's 2,048-token
 * prefill spent 66 us a layer on 32,768 blocks that all returned). */
template <int HD, int GM, bool EXACT, int CPW, bool SERIAL, bool S64>
static __global__ void __launch_bounds__(tile_cfg<HD>::WPB * 32)
attn_tile_kernel(const struct kn_cu_attn_args a, int splits)
{
	kn_pdl_wait();
	kn_pdl_trigger();
	const int c0 = (blockIdx.x * tile_cfg<HD>::WPB + (threadIdx.x >> 5)) * CPW;
	if (a.runs && run_uniform(a, c0 & ~(a.runs - 1), a.runs))
		return; /* the run kernel's: a warp's columns lie in one run's */
	/* a prompt chunk's warp on a wide plan takes every piece in the grid's
	 * first z and folds them itself (a.serial: the launch allows it) */
	const bool serial = SERIAL && serial_warp(a, c0, CPW);
	for (int s = blockIdx.z; s < (serial ? 1 : splits); s += gridDim.z)
		attn_tile_piece<HD, GM, EXACT, CPW, SERIAL, S64>(a, splits, s, serial);
}

/* ---- the run kernel: prompt chunks ---- */

/* Shared memory of the run kernel: two stages of a K and a V tile. */
template <int HD> static constexpr size_t run_smem(void)
{
	return (size_t)2 * 2 * RUN_KEYS * HD * sizeof(kn_bf16);
}

/* ... and where the run folds pieces, each warp's folded A (16 rows) */
template <int HD, int RC, bool FOLD> static constexpr size_t run_smem_all(void)
{
	return run_smem<HD>() + (FOLD ? (size_t)(RC / 16) * 16 * HD * sizeof(float) : 0);
}

/*
 * grid (ceil(n / RC), n_heads), block RC / 16 warps (RC: a run's columns,
 * 64 or 128). Block x serves columns c0 .. c0 + RC - 1 (the last run first:
 * the causal loop is longest there) for head y when they are one run
 * (run_uniform()), else nothing (the tile kernel serves them). Warp w owns
 * the 16 rows c0 + 16 w + (g, g + 8) in the mma fragment layouts. The block
 * loads keys 0 .. the run's last position in tiles of RUN_KEYS (four pages;
 * cp.async, two stages, the tile kernel's swizzle) once for its warps (128
 * columns a run: half the K/V reads of 64, in one block of 8 warps instead
 * of two of 4); a warp skips the tiles past its own
 * last row. Per tile: S = Q K^T (bf16 q with the scale folded in, base-2),
 * the causal mask where the tile reaches the warp's rows, the online
 * softmax, O += P V with P as bf16 (attn_scores(), attn_pv()); then O / l
 * to out. Keys past the run's last position are zero-filled, never loaded
 * (V there may be NaN bits).
 *
 * FOLD (one family, kn_cu_attn_args.run_fold with steps64): the tile
 * kernel's bits in 64-key steps. A tile is attn_scores() + attn_pv(); the
 * keys go in pieces of a.split positions (a multiple of 64: whole tiles),
 * each from (m, l, acc) = (-inf, 0, 0), and a row folds each piece that
 * holds keys of its own into (M, L, A) as the serial warps and the merge
 * kernel do (fold_piece(); A in shared memory, lane-major); out = A / L.
 * The tile kernel's steps are these tiles, so a column's bits do not
 * depend on which kernel served it. Without FOLD (the default kernels'
 * runs) the keys go in one causal pass and out = acc / l.
 */
/* one block an SM at least: ptxas then takes ~200 registers at head 128
 * (~175 without the bound), measured a little faster; three blocks an SM
 * (168 registers) changed nothing (kernels/cuda/NOTES.md) */
template <int HD, int RC, bool FOLD>
static __global__ void __launch_bounds__(RC * 2, 1) attn_run_kernel(const struct kn_cu_attn_args a)
{
	static_assert(RC == 64 || RC == 128, "a run is 64 or 128 columns");
	constexpr int THREADS = RC * 2; /* a warp a 16 rows */
	kn_pdl_wait();
	kn_pdl_trigger();
	constexpr int U = HD / 8, SWM = U < 8 ? U - 1 : 7, KS = HD / 16, NT = HD / 8, NK = RUN_KEYS / 8;
	extern __shared__ uint4 rsm[]; /* [stage][K, V][RUN_KEYS * U] */

	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
	const int c0 = (gridDim.x - 1 - blockIdx.x) * RC, h = blockIdx.y;
	if (!run_uniform(a, c0, RC))
		return; /* every warp of the block finds the same */
	const int G = a.n_heads / a.n_kv_heads, kh = h / G;
	const int slot = a.cols[c0].slot, p0 = a.cols[c0].pos, kmax = p0 + RC - 1;
	const int wp = p0 + warp * 16, pos0 = wp + g, pos1 = wp + g + 8;
	const int cc0 = c0 + warp * 16 + g, cc1 = cc0 + 8;
	const float qs = a.scale * LOG2E;

	/* q fragments: a0 (row g, k 2t..), a1 (row g+8), a2 (row g, k 2t+8..), a3 (row g+8) */
	uint32_t qa[KS][1][4];
	{
		const float *q0 = a.q + (size_t)cc0 * a.q_stride + (size_t)h * HD;
		const float *q1 = a.q + (size_t)cc1 * a.q_stride + (size_t)h * HD;
#pragma unroll
		for (int j = 0; j < KS; j++)
#pragma unroll
			for (int hh = 0; hh < 2; hh++) {
				const int d = j * 16 + 2 * t + 8 * hh;
				const float2 v0 = *reinterpret_cast<const float2 *>(q0 + d);
				const float2 v1 = *reinterpret_cast<const float2 *>(q1 + d);
				uint32_t lo;
				split_pair(v0.x * qs, v0.y * qs, qa[j][0][2 * hh], lo);
				split_pair(v1.x * qs, v1.y * qs, qa[j][0][2 * hh + 1], lo);
			}
	}
	float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
	float acc[NT][4];
#pragma unroll
	for (int i = 0; i < NT; i++)
		acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
	/* FOLD: the rows' running fold, A (fold_piece()'s float4 a lane) after
	 * the K/V stages */
	float M0 = -INFINITY, M1 = -INFINITY, L0 = 0.f, L1 = 0.f;
	float4 *const fa = reinterpret_cast<float4 *>(rsm + (size_t)2 * 2 * RUN_KEYS * U) + (size_t)warp * NT * 32 + lane;
	if (FOLD)
#pragma unroll
		for (int i = 0; i < NT; i++)
			fa[i * 32] = make_float4(0.f, 0.f, 0.f, 0.f);

	const int32_t *trow = a.table + (size_t)slot * a.max_bps;
	const size_t blk_stride = (size_t)a.n_kv_heads * KN_PAGE_BLK * HD;
	const size_t head_off = (size_t)kh * KN_PAGE_BLK * HD;
	/* thread x copies the 16-byte unit u0 of rows r0, r0 + RPI, ... of a
	 * tile: RPI is a multiple of the swizzle's period, so the unit's place
	 * is the same in each of its rows, and its addresses step by constants */
	constexpr int RPI = THREADS / U, NI = RPI < RUN_KEYS ? RUN_KEYS / RPI : 1; /* rows past a tile: idle */
	static_assert(THREADS % U == 0 && (RUN_KEYS % RPI == 0 || RPI % RUN_KEYS == 0) && RPI % (SWM + 1) == 0,
		      "a unit's swizzle per thread");
	const int u0 = threadIdx.x % U, r0 = threadIdx.x / U, so0 = r0 * U + (u0 ^ (r0 & SWM));
	const kn_bf16 *kbase = a.k_cache + head_off + u0 * 8, *vbase = a.v_cache + head_off + u0 * 8;
	auto issue = [&](int j) {
		uint4 *ks = rsm + (size_t)(j & 1) * 2 * RUN_KEYS * U + so0, *vs = ks + RUN_KEYS * U;
#pragma unroll
		for (int i = 0; i < NI && r0 + i * RPI < RUN_KEYS; i++) {
			const int kp = j * RUN_KEYS + r0 + i * RPI;
			const int32_t blk = kp <= kmax ? trow[kp / KN_PAGE_BLK] : -1;
			if (blk >= 0) {
				const size_t off = (size_t)blk * blk_stride + (size_t)(kp % KN_PAGE_BLK) * HD;
				cp_async16(ks + i * RPI * U, reinterpret_cast<const uint4 *>(kbase + off));
				cp_async16(vs + i * RPI * U, reinterpret_cast<const uint4 *>(vbase + off));
			} else {
				ks[i * RPI * U] = make_uint4(0, 0, 0, 0);
				vs[i * RPI * U] = make_uint4(0, 0, 0, 0);
			}
		}
		cp_commit();
	};
	const int ntiles = kmax / RUN_KEYS + 1;
	issue(0);
	for (int j = 0; j < ntiles; j++) {
		if (j + 1 < ntiles) {
			issue(j + 1);
			cp_wait<1>();
		} else {
			cp_wait<0>();
		}
		__syncthreads();
		const int k0 = j * RUN_KEYS;
		if (k0 <= wp + 15) {
			const uint4 *ks = rsm + (size_t)(j & 1) * 2 * RUN_KEYS * U, *vs = ks + RUN_KEYS * U;
			float sc[NK][4];
			/* the mask where the tile reaches past the warp's first row */
			attn_scores<HD, 1>(ks, RUN_KEYS / 16, k0, k0 + RUN_KEYS - 1 > wp, qa, pos0, pos1, m0, m1, l0, l1, acc,
					   sc);
			attn_pv<HD, 1>(vs, RUN_KEYS / 16, sc, acc);
			if (FOLD && ((k0 + RUN_KEYS) % a.split == 0 || k0 + RUN_KEYS > wp + 15)) {
				/* a piece ends (or the warp's keys do): rows with keys in
				 * it fold it, as the tile kernel's serial warps do */
				const int kst = k0 / a.split * a.split;
				l0 = quad_sum(l0);
				l1 = quad_sum(l1);
				fold_piece<NT>(pos0 >= kst, pos1 >= kst, M0, M1, L0, L1, m0, m1, l0, l1, acc, fa);
#pragma unroll
				for (int i = 0; i < NT; i++)
					acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
				m0 = m1 = -INFINITY;
				l0 = l1 = 0.f;
			}
		}
		__syncthreads(); /* the next issue refills this stage */
	}
	float *o0 = a.out + (size_t)cc0 * a.n_heads * HD + (size_t)h * HD;
	float *o1 = a.out + (size_t)cc1 * a.n_heads * HD + (size_t)h * HD;
	if (FOLD) {
#pragma unroll
		for (int i = 0; i < NT; i++) {
			const float4 A = fa[i * 32];

			*reinterpret_cast<float2 *>(o0 + i * 8 + 2 * t) = make_float2(A.x / L0, A.y / L0);
			*reinterpret_cast<float2 *>(o1 + i * 8 + 2 * t) = make_float2(A.z / L1, A.w / L1);
		}
		return;
	}
	l0 = quad_sum(l0);
	l1 = quad_sum(l1);
	const float i0 = 1.f / l0, i1 = 1.f / l1;
#pragma unroll
	for (int i = 0; i < NT; i++) {
		*reinterpret_cast<float2 *>(o0 + i * 8 + 2 * t) = make_float2(acc[i][0] * i0, acc[i][1] * i0);
		*reinterpret_cast<float2 *>(o1 + i * 8 + 2 * t) = make_float2(acc[i][2] * i1, acc[i][3] * i1);
	}
}

template <int HD, int RC, bool FOLD> static cudaError_t launch_runs_rc(const struct kn_cu_attn_args *a, cudaStream_t st)
{
	/* every launch (a graph captures it once): the attribute is the current device's */
	constexpr size_t smem = run_smem_all<HD, RC, FOLD>();
	const cudaError_t set = cudaFuncSetAttribute(attn_run_kernel<HD, RC, FOLD>,
						     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
	if (set != cudaSuccess)
		return set;
	return kn_launch(attn_run_kernel<HD, RC, FOLD>, dim3((a->n + RC - 1) / RC, a->n_heads), dim3(RC * 2), smem, st,
			 *a);
}

template <int HD> static cudaError_t launch_runs(const struct kn_cu_attn_args *a, cudaStream_t st)
{
	if (a->run_fold)
		return a->runs == 128 ? launch_runs_rc<HD, 128, true>(a, st) : launch_runs_rc<HD, 64, true>(a, st);
	return a->runs == 128 ? launch_runs_rc<HD, 128, false>(a, st) : launch_runs_rc<HD, 64, false>(a, st);
}

/* Columns a warp of the tile kernel serves at plan width @p n: 16 / GM
 * (each K/V page loaded once for a slot's columns: prefill chunks), or one
 * on plans of at most 64 columns, whose columns are mostly decodes of
 * their own slots: a warp took its columns' pages one after another, so 8
 * decode columns at ctx 512 kept 64 warps of the GPU busy (8B, 8 KV heads,
 * 4 pieces of 128). H200, one family, ms a step, 4 columns a warp -> 1: 8B
 * 32 columns 7.18 -> 6.41, 64 7.45 -> 7.10, 128 10.10 -> 10.08, 256 15.76
 * -> 15.87; 1B 32 1.92 -> 1.57, 64 1.92 -> 1.79 (the default kernels'
 * wide plans did not move, H100). KVFERRY_CUDA_ATTN_CPW=1 or 16 forces
 * one or the other (read once; for measuring). */
static int tile_cpw(int n, int gm)
{
	static int forced = -1; /* read once: 0 rule, 1 one column, 16 sixteen rows of columns */
	if (forced < 0) {
		const char *e = getenv("KVFERRY_CUDA_ATTN_CPW");
		forced = e && !strcmp(e, "1") ? 1 : e && !strcmp(e, "16") ? 16 : 0;
	}
	return forced == 1 || (forced == 0 && n <= 64) ? 1 : 16 / gm;
}

/* Launch the tile kernel; @return false when HD has no tile instance. */
template <int HD, int GM, int CPW>
static cudaError_t launch_tile_cpw(const struct kn_cu_attn_args *a, int splits, cudaStream_t st)
{
	constexpr int per_block = tile_cfg<HD>::WPB * CPW;
	const int gz = CPW > 1 && a->serial ? 1 : splits; /* attn_tile_kernel(): serial launches loop over z */
	const dim3 g1((a->n + per_block - 1) / per_block, a->n_kv_heads, gz), b1(tile_cfg<HD>::WPB * 32);
	auto go = [&](auto kernel) { return kn_launch(kernel, g1, b1, 0, st, *a, splits); };
	if (a->steps64 && !a->exact) {
		/* 64-key steps, bf16 q and P: dynamic shared memory past the static
		 * limit; every launch (a graph captures it once) sets the attribute,
		 * which is the current device's */
		constexpr size_t smem = tile_smem<HD>();
		auto go64 = [&](auto kernel) {
			const cudaError_t set =
				cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
			return set != cudaSuccess ? set : kn_launch(kernel, g1, b1, smem, st, *a, splits);
		};
		if constexpr (CPW > 1) {
			if (a->serial)
				return go64(attn_tile_kernel<HD, GM, false, CPW, true, true>);
		}
		return go64(attn_tile_kernel<HD, GM, false, CPW, false, true>);
	}
	if constexpr (CPW > 1) {
		if (a->serial)
			return a->exact ? go(attn_tile_kernel<HD, GM, true, CPW, true, false>)
					: go(attn_tile_kernel<HD, GM, false, CPW, true, false>);
	}
	return a->exact ? go(attn_tile_kernel<HD, GM, true, CPW, false, false>)
			: go(attn_tile_kernel<HD, GM, false, CPW, false, false>);
}

template <int HD, int GM>
static bool launch_tile(const struct kn_cu_attn_args *a, int splits, cudaStream_t st, cudaError_t *e)
{
	if constexpr (HD <= 128) {
		*e = tile_cpw(a->n, GM) == 1 || a->split < 0 ? launch_tile_cpw<HD, GM, 1>(a, splits, st)
					     : launch_tile_cpw<HD, GM, 16 / GM>(a, splits, st);
		return true;
	}
	return false;
}

template <int HD, int GM, bool PAD>
static cudaError_t launch(const struct kn_cu_attn_args *a, cudaStream_t st)
{
	const bool tile = a->kernel == KN_CU_ATTN_TILE;
	if (tile && (PAD || a->split == 0 || (a->split > 0 && a->split % KN_PAGE_BLK)))
		return cudaErrorInvalidValue;
	const int gctx = a->grid_ctx > 0 && a->grid_ctx < a->max_ctx ? a->grid_ctx : a->max_ctx;
	const int splits = tile ? splits_of(gctx, a->split) : col_splits_max(gctx);
	cudaError_t e = cudaSuccess;
	const int nvh = a->n_kv_heads * nsub_of(a->n_heads, a->n_kv_heads);
	if (tile && nvh != a->n_kv_heads)
		return cudaErrorInvalidValue;
	/* blocks with work: the grid's longest column's splits, every column */
	const int csplit = col_split(gctx, a->n);
	const bool many = (long)((gctx + csplit - 1) / csplit) * nvh * a->n > ATTN_MANY_BLOCKS;
	/* runs (the tile kernel's prompt chunks) where asked and possible */
	struct kn_cu_attn_args r = *a;
	const bool runs_ok = tile && (a->runs == 64 || a->runs == 128) && !a->exact && a->split > 0 && a->len_lo == 0 &&
			     a->len_hi == 0 && a->n >= a->runs &&
			     (!a->run_fold || (a->steps64 && a->split % RUN_KEYS == 0));
	r.runs = runs_ok ? a->runs : 0;
	/* wide plans: a warp of a prompt chunk's columns folds its own pieces */
	r.serial = tile && a->n > 256 && a->split > 0 && a->len_lo == 0 && a->len_hi == 0 && tile_cpw(a->n, GM) > 1
			   ? 16 / GM
			   : 0;
	const int cpb = a->n > 256 ? 16 : 1;
	const dim3 mg((a->n + cpb - 1) / cpb, nvh, (GM * a->head_dim + 127) / 128);
	if (!tile) {
		e = many ? kn_launch(attn_split_kernel<HD, GM, PAD, true>, dim3(splits, nvh, a->n), dim3(ATTN_WARPS * 32),
				     0, st, r, splits)
			 : kn_launch(attn_split_kernel<HD, GM, PAD, false>, dim3(splits, nvh, a->n), dim3(ATTN_WARPS * 32),
				     0, st, r, splits);
		if (e != cudaSuccess || a->n <= 2)
			return e;
		return kn_launch(attn_merge_kernel<HD, GM, PAD>, mg, dim3(128), 0, st, r, splits, KN_CU_ATTN_SPLIT, 0, cpb);
	}
	/* the runs first, then the tile kernel and the merge on the other columns */
	if constexpr (HD <= 128) {
		if (r.runs && (e = launch_runs<HD>(&r, st)) != cudaSuccess)
			return e;
	}
	if (!launch_tile<HD, GM>(&r, splits, st, &e))
		return cudaErrorInvalidValue;
	if (e != cudaSuccess)
		return e;
	return kn_launch(attn_merge_kernel<HD, GM, PAD>, mg, dim3(128), 0, st, r, splits, a->split, 1, cpb);
}

template <int HD, bool PAD = false>
static cudaError_t launch_hd(const struct kn_cu_attn_args *a, cudaStream_t st)
{
	switch (gmax_of(a->n_heads / a->n_kv_heads)) {
	case 1: return launch<HD, 1, PAD>(a, st);
	case 2: return launch<HD, 2, PAD>(a, st);
	case 4: return launch<HD, 4, PAD>(a, st);
	default: return launch<HD, 8, PAD>(a, st);
	}
}

int kn_cuda_attn_tile_from(int n, int head_dim, int G)
{
	/* Measured (H200, `.devcarry/run5.sh`): the decode step with the tile
	 * kernel against the column kernel for every column, ctx 512 / 4096 /
	 * 16384. 8B (head_dim 128): batch 1 tile faster from 4096 (4.67 vs 4.79
	 * ms; 512: equal); 4 from 16384 (8.35 vs 8.99; 4096: 5.94 vs 5.86); 8
	 * and 16 from 4096 (6.44 vs 7.06, 8.87 vs 10.17; 512: slower). 1B (64):
	 * batch 1-8 never (16384 b1: 1.49 vs 1.33); 16 from 4096 (2.39 vs 2.67).
	 * The thresholds sit between the measured contexts. */
	const char *e = getenv("KVFERRY_CUDA_ATTN_TILE_FROM"); /* read as a plan's graph is captured */
	const int env = e != NULL && *e ? atoi(e) : -1;

	if (n > 16 || !kn_cuda_attn_tile_ok(head_dim) || G > 8)
		return 0;
	if (env >= 0)
		return env;
	if (head_dim == 128)
		return n == 1 ? 2048 : n <= 4 ? 8192 : 2048;
	if (head_dim == 64)
		return n > 8 ? 2048 : 0;
	return 0;
}

cudaError_t kn_cuda_attention(const struct kn_cu_attn_args *in, cudaStream_t st)
{
	struct kn_cu_attn_args both[2];
	const struct kn_cu_attn_args *a = in;
	if (in->tile_from > 0 && in->kernel == KN_CU_ATTN_COLUMN) {
		/* long columns to the tile kernel, the others to the column kernel;
		 * no tile launch where no column of this launch's grid is long */
		const int gctx = in->grid_ctx > 0 && in->grid_ctx < in->max_ctx ? in->grid_ctx : in->max_ctx;
		both[0] = *in;
		both[0].tile_from = 0;
		if (gctx >= in->tile_from) {
			both[1] = both[0];
			both[1].kernel = KN_CU_ATTN_TILE;
			both[1].exact = 1;
			both[1].len_lo = in->tile_from;
			both[1].len_hi = 0;
			both[0].len_lo = 0;
			both[0].len_hi = in->tile_from;
			/* the column kernel's columns are all shorter: its grid too
			 * (a 16k grid of blocks that find nothing cost 8B 0.4-0.7 ms
			 * a step at batch 8-16) */
			both[0].grid_ctx = in->tile_from - 1;
			cudaError_t e = kn_cuda_attention(&both[1], st);
			if (e != cudaSuccess)
				return e;
		}
		return kn_cuda_attention(&both[0], st);
	}
	if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads
	    || (a->n_heads / a->n_kv_heads > 8 && a->kernel == KN_CU_ATTN_TILE))
		return cudaErrorInvalidValue;
	if (a->kernel == KN_CU_ATTN_COLUMN && a->n <= 2 && !a->counters)
		return cudaErrorInvalidValue;
	if (a->kernel == KN_CU_ATTN_TILE && !kn_cuda_attn_tile_ok(a->head_dim))
		return cudaErrorInvalidValue;
	switch (a->head_dim) {
	case 16: return launch_hd<16>(a, st);
	case 32: return launch_hd<32>(a, st);
	case 64: return launch_hd<64>(a, st);
	case 128: return launch_hd<128>(a, st);
	case 256: return a->kernel == KN_CU_ATTN_TILE ? cudaErrorInvalidValue : launch_hd<256>(a, st);
	default:
		/* another multiple of 16 (48, 80, 96 ...): the column kernel of the
		 * next power of two, its lanes past the head idle */
		if (a->head_dim % 16 || a->head_dim < 16 || a->head_dim > 256 || a->kernel == KN_CU_ATTN_TILE)
			return cudaErrorInvalidValue;
		return a->head_dim < 64 ? launch_hd<64, true>(a, st)
		       : a->head_dim < 128 ? launch_hd<128, true>(a, st) : launch_hd<256, true>(a, st);
	}
}
