/* SPDX-License-Identifier: Apache-2.0 */
#include "sample.cuh"

#include <math.h>

#include "kn_sample_core.h"

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

/* ---- the full sampler: kn_sample_core.h's rule, one block per column ---- */

#define SM_T 1024
#define SM_W (SM_T / 32)

struct sm_shared {
	unsigned long long w[256]; /* a digit's weight (count or mass) */
	unsigned c[256];           /* a digit's element count */
	unsigned long long red[SM_W];
	double redd[SM_W];
	unsigned long long bc[3];
	uint64_t top[KN_CU_MAX_TOP];
	unsigned n_top;
	int last;
	/* a row's pieces, when one block makes them all */
	unsigned long long pkb[KN_CU_SAMPLE_PIECES];
	double psum[KN_CU_SAMPLE_PIECES];
	float pmx[KN_CU_SAMPLE_PIECES];
};

/* Pieces of a row of @p vocab logits: about 8,192 each. */
static __host__ __device__ inline int sample_pieces(int vocab)
{
	const int p = vocab / 8192;
	return p < 1 ? 1 : p > KN_CU_SAMPLE_PIECES ? KN_CU_SAMPLE_PIECES : p;
}

/* kn_cu_sample_args.scratch, a record per row (its place fixed whatever the
 * launch's row count): the row's arrival counter, then per piece the
 * piece's largest key, its sum of exp(logit - its largest logit) and that
 * logit. */
struct sample_row {
	unsigned long long count; /* only the low 32 bits: the counter */
	unsigned long long kb[KN_CU_SAMPLE_PIECES];
	double sum[KN_CU_SAMPLE_PIECES];
	float mx[KN_CU_SAMPLE_PIECES];
};

size_t kn_cuda_sample_scratch_bytes(int rows)
{
	return (size_t)rows * sizeof(struct sample_row);
}

template <bool MAX> static __device__ __forceinline__ unsigned long long warp_red_u64(unsigned long long v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) {
		const unsigned long long u = __shfl_xor_sync(0xffffffffu, v, o);
		v = MAX ? (u > v ? u : v) : v + u;
	}
	return v;
}

/* Block-wide max (MAX) or sum of a u64; every thread gets the result. */
template <bool MAX> static __device__ unsigned long long block_red_u64(struct sm_shared *sh, unsigned long long v)
{
	const int t = threadIdx.x;
	v = warp_red_u64<MAX>(v);
	if ((t & 31) == 0)
		sh->red[t >> 5] = v;
	__syncthreads();
	if (t < 32) {
		v = warp_red_u64<MAX>(sh->red[t]);
		if (t == 0)
			sh->bc[0] = v;
	}
	__syncthreads();
	v = sh->bc[0];
	__syncthreads();
	return v;
}

static __device__ double block_sum_f64(struct sm_shared *sh, double v)
{
	const int t = threadIdx.x;
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	if ((t & 31) == 0)
		sh->redd[t >> 5] = v;
	__syncthreads();
	if (t < 32) {
		v = sh->redd[t];
#pragma unroll
		for (int o = 16; o > 0; o >>= 1)
			v += __shfl_xor_sync(0xffffffffu, v, o);
		if (t == 0)
			sh->redd[0] = v;
	}
	__syncthreads();
	v = sh->redd[0];
	__syncthreads();
	return v;
}

/*
 * The element e of largest key (among keys >= klo) whose inclusive prefix
 * weight, in key order, reaches @p need; weight = 1 per element (mass 0:
 * the top-k cut) or kn_sc_weight (mass 1). Radix select over the 64-bit key,
 * a byte a pass from the top, stopping once the chosen digit holds one
 * element. Lanes with the same digit add their weight once (warp-aggregated)
 * so a crowded digit does not serialise on one shared-memory atomic.
 * @return e's key (0 if none: need exceeds the total); *cum = its prefix weight.
 */
static __device__ uint64_t block_select(struct sm_shared *sh, const float *row, int vocab, int mass,
					float mx, float temp, uint64_t need, uint64_t klo,
					uint64_t *cum)
{
	const int t = threadIdx.x, lane = t & 31;
	uint64_t prefix = 0, mask = 0, above = 0;
	for (int shift = 56; shift >= 0; shift -= 8) {
		for (int i = t; i < 256; i += SM_T) {
			sh->w[i] = 0;
			sh->c[i] = 0;
		}
		__syncthreads();
		for (int base = 0; base < vocab; base += SM_T) {
			const int i = base + t;
			float l = 0.f;
			uint64_t k = 0;
			bool in = false;
			if (i < vocab) {
				l = row[i];
				k = kn_sc_key(l, i);
				in = k >= klo && (k & mask) == prefix;
			}
			const unsigned d = (unsigned)(k >> shift) & 255u;
			const unsigned long long w = in ? (mass ? kn_sc_weight(l, mx, temp) : 1ull) : 0ull;
			unsigned act = __ballot_sync(0xffffffffu, in);
			while (act) {
				const int leader = __ffs(act) - 1;
				const unsigned dl = __shfl_sync(0xffffffffu, d, leader);
				const bool mine = in && d == dl;
				const unsigned peers = __ballot_sync(0xffffffffu, mine);
				const unsigned long long ws = warp_red_u64<false>(mine ? w : 0ull);
				if (lane == leader) {
					atomicAdd(&sh->w[dl], ws);
					atomicAdd(&sh->c[dl], (unsigned)__popc(peers));
				}
				act &= ~peers;
			}
		}
		__syncthreads();
		if (t == 0) {
			int d = 255;
			for (; d > 0; d--) {
				if (above + sh->w[d] >= need)
					break;
				above += sh->w[d];
			}
			sh->bc[0] = (unsigned long long)d;
			sh->bc[1] = above;
			sh->bc[2] = sh->c[d];
		}
		__syncthreads();
		const uint64_t d = sh->bc[0];
		above = sh->bc[1];
		const unsigned long long cnt = sh->bc[2];
		__syncthreads();
		prefix |= d << shift;
		mask |= 255ull << shift;
		if (cnt <= 1)
			break;
	}
	uint64_t best = 0;
	for (int i = t; i < vocab; i += SM_T) {
		const uint64_t k = kn_sc_key(row[i], i);
		if (k >= klo && (k & mask) == prefix && k > best)
			best = k;
	}
	best = block_red_u64<true>(sh, best);
	if (best) {
		const float l = row[kn_sc_key_id(best)];
		*cum = above + (mass ? kn_sc_weight(l, mx, temp) : 1ull);
	} else {
		*cum = above;
	}
	return best;
}

/* Piece q of P of @p row: its largest key, that key's logit (-inf for
 * none) and the sum of exp(logit - that logit) in double; block-wide, the
 * same bits whichever block makes it. */
static __device__ void sample_piece(struct sm_shared *sh, const float *row, int vocab, int q, int P,
				    unsigned long long *kbo, float *mpo, double *sumo)
{
	const int t = threadIdx.x;
	const int per = (vocab + P - 1) / P, lo = q * per, hi = lo + per < vocab ? lo + per : vocab;
	uint64_t kb = 0;
	for (int i = lo + t; i < hi; i += SM_T) {
		const uint64_t k = kn_sc_key(row[i], i);
		kb = k > kb ? k : kb;
	}
	kb = block_red_u64<true>(sh, kb);
	const float mp = kb ? row[kn_sc_key_id(kb)] : -INFINITY;
	double sum = 0;
	if (mp != -INFINITY)
		for (int i = lo + t; i < hi; i += SM_T)
			sum += exp((double)(row[i] - mp));
	*kbo = kb;
	*mpo = mp;
	*sumo = block_sum_f64(sh, sum);
}

/* grid (n, 1 or pieces), block SM_T: one column each. Its greedy passes
 * (the largest key, the logprob's sum) go over sample_pieces(vocab) pieces
 * of the row, made by one block each (gridDim.y: the last of a row to
 * finish goes on) or all by the one block; the pieces are added in order
 * either way, so a row's bits do not depend on the launch. Padding and
 * columns without NEED_LOGIT write token -1 and stop. */
static __global__ void __launch_bounds__(SM_T) sample_kernel(struct kn_cu_sample_args a)
{
	kn_pdl_wait();
	kn_pdl_trigger();
	__shared__ struct sm_shared sh;
	const int r = blockIdx.x, t = threadIdx.x, vocab = a.vocab;
	const int c = a.out_col ? a.out_col[r] : r; /* where row r's outputs go */
	if (c < 0)
		return;
	const struct kn_column col = a.cols[r];
	const int P = sample_pieces(vocab), pc = (int)blockIdx.y;
	if (col.slot == KN_CU_PAD_SLOT || !(col.flags & KN_COL_NEED_LOGIT)) {
		if (t == 0 && pc == 0) {
			a.tokens[c] = -1;
			a.tok_lp[c] = 0.f;
		}
		return;
	}
	const float *row = a.logits + (size_t)r * vocab;
	/* logprobs of the model's distribution (temperature 1), sum in double
	 * as the host does (the order differs: within 1e-7 of the host's) */
	unsigned long long kb;
	float mp;
	double sum;
	/* volatile: the pieces of other blocks are read past L1 */
	const volatile unsigned long long *pkb = sh.pkb;
	const volatile double *psum = sh.psum;
	const volatile float *pmx = sh.pmx;
	if (gridDim.y > 1) {
		struct sample_row *sr = (struct sample_row *)a.scratch + r;
		unsigned *count = (unsigned *)&sr->count;
		sample_piece(&sh, row, vocab, pc, P, &kb, &mp, &sum);
		if (t == 0) {
			sr->kb[pc] = kb;
			sr->mx[pc] = mp;
			sr->sum[pc] = sum;
			__threadfence();
			sh.last = atomicAdd(count, 1u) == (unsigned)P - 1;
		}
		__syncthreads();
		if (!sh.last)
			return; /* the row's last block to finish goes on */
		if (t == 0) {
			__threadfence();
			*count = 0; /* for the next launch */
		}
		pkb = sr->kb;
		psum = sr->sum;
		pmx = sr->mx;
	} else {
		for (int q = 0; q < P; q++) {
			sample_piece(&sh, row, vocab, q, P, &kb, &mp, &sum);
			if (t == 0) {
				sh.pkb[q] = kb;
				sh.pmx[q] = mp;
				sh.psum[q] = sum;
			}
		}
	}
	if (P > 1) {
		/* the pieces in order: the largest key, the sums rescaled to it */
		if (t == 0) {
			unsigned long long k = 0;
			for (int q = 0; q < P; q++) {
				const unsigned long long kq = pkb[q];
				k = kq > k ? kq : k;
			}
			const double m = (double)row[kn_sc_key_id(k)];
			double s = 0;
			for (int q = 0; q < P; q++) {
				const double sq = psum[q];
				if (sq > 0)
					s += sq * exp((double)pmx[q] - m);
			}
			sh.bc[0] = k;
			sh.redd[0] = s;
		}
		__syncthreads();
		kb = sh.bc[0];
		sum = sh.redd[0];
		__syncthreads();
	}
	const int best = kn_sc_key_id(kb);
	const float mx = row[best];
	int tok = best;
	if ((col.flags & KN_COL_FORCE) && col.seed < (uint32_t)vocab) {
		tok = (int)col.seed; /* a given token: scored, not drawn */
	} else if (col.temperature > 0.f) {
		const float temp = col.temperature;
		uint64_t klo = 0, cum, s = 0;
		if (col.top_k > 0 && col.top_k < vocab)
			klo = block_select(&sh, row, vocab, 0, mx, temp, (uint64_t)col.top_k, 0, &cum);
		for (int i = t; i < vocab; i += SM_T) {
			const float l = row[i];
			if (kn_sc_key(l, i) >= klo)
				s += kn_sc_weight(l, mx, temp);
		}
		s = block_red_u64<false>(&sh, s);
		if (col.top_p > 0.f && col.top_p < 1.f) {
			klo = block_select(&sh, row, vocab, 1, mx, temp, kn_sc_top_p_mass(col.top_p, s), klo, &cum);
			s = cum;
		}
		const uint64_t kt = block_select(&sh, row, vocab, 1, mx, temp,
						 kn_sc_target(col.seed, col.pos, s) + 1, klo, &cum);
		if (kt)
			tok = kn_sc_key_id(kt);
	}
	const double lse = (double)mx + log(sum);
	if (t == 0) {
		a.tokens[c] = tok;
		a.tok_lp[c] = (float)((double)row[tok] - lse);
	}
	int nt = *a.n_top;
	nt = nt < KN_CU_MAX_TOP ? nt : KN_CU_MAX_TOP;
	nt = nt < vocab ? nt : vocab;
	if (nt <= 0)
		return;
	uint64_t cum;
	const uint64_t kn = block_select(&sh, row, vocab, 0, mx, 1.f, (uint64_t)nt, 0, &cum);
	if (t == 0)
		sh.n_top = 0;
	__syncthreads();
	for (int i = t; i < vocab; i += SM_T) {
		const uint64_t k = kn_sc_key(row[i], i);
		if (k >= kn) {
			const unsigned j = atomicAdd(&sh.n_top, 1u);
			if (j < KN_CU_MAX_TOP)
				sh.top[j] = k;
		}
	}
	__syncthreads();
	if (t == 0) {
		const int m = sh.n_top < (unsigned)nt ? (int)sh.n_top : nt;
		for (int i = 1; i < m; i++) /* insertion sort, descending: m <= 20 */
			for (int j = i; j > 0 && sh.top[j] > sh.top[j - 1]; j--) {
				const uint64_t x = sh.top[j];
				sh.top[j] = sh.top[j - 1];
				sh.top[j - 1] = x;
			}
		int32_t *ids = a.top_ids + (size_t)c * KN_CU_MAX_TOP;
		float *lps = a.top_lps + (size_t)c * KN_CU_MAX_TOP;
		for (int i = 0; i < KN_CU_MAX_TOP; i++) {
			const int id = i < m ? kn_sc_key_id(sh.top[i]) : -1;
			ids[i] = id;
			lps[i] = i < m ? (float)((double)row[id] - lse) : -INFINITY;
		}
	}
}

static __device__ __forceinline__ bool wants_logit(const struct kn_column &c)
{
	return c.slot != KN_CU_PAD_SLOT && (c.flags & KN_COL_NEED_LOGIT);
}

/* grid (K), block LR_T: block k finds the k-th column that wants a token
 * (each thread counts a contiguous run of columns, a scan over the
 * threads' counts places the k-th) and copies its row; block 0 also marks
 * every other column's outputs. */
#define LR_T 256
static __global__ void __launch_bounds__(LR_T)
logit_rows_kernel(const struct kn_column *cols, int W, const float *x, int H, float *x_k, struct kn_column *cols_k,
		  int32_t *out_col, int32_t *tokens, float *tok_lp)
{
	kn_pdl_wait();
	kn_pdl_trigger();
	__shared__ int cnt[LR_T];
	__shared__ int found;
	const int k = blockIdx.x, t = threadIdx.x, run = (W + LR_T - 1) / LR_T;
	const int j0 = t * run, j1 = min(j0 + run, W);
	int n = 0;
	for (int j = j0; j < j1; j++)
		n += wants_logit(cols[j]);
	cnt[t] = n;
	if (t == 0)
		found = -1;
	__syncthreads();
	for (int o = 1; o < LR_T; o <<= 1) { /* inclusive scan of the counts */
		const int v = t >= o ? cnt[t - o] : 0;
		__syncthreads();
		cnt[t] += v;
		__syncthreads();
	}
	const int before = cnt[t] - n; /* wanting columns ahead of this thread's run */
	if (k >= before && k < cnt[t]) {
		int seen = before;
		for (int j = j0; j < j1; j++)
			if (wants_logit(cols[j]) && seen++ == k) {
				found = j;
				break;
			}
	}
	__syncthreads();
	const int j = found;
	for (int e = t; e < H; e += LR_T)
		x_k[(size_t)k * H + e] = j >= 0 ? x[(size_t)j * H + e] : 0.f;
	if (t == 0) {
		struct kn_column pad = {};
		pad.slot = KN_CU_PAD_SLOT;
		cols_k[k] = j >= 0 ? cols[j] : pad;
		out_col[k] = j;
	}
	if (k == 0)
		for (int i = t; i < W; i += LR_T)
			if (!wants_logit(cols[i])) {
				tokens[i] = -1;
				tok_lp[i] = 0.f;
			}
}

cudaError_t kn_cuda_logit_rows(const struct kn_column *cols, int W, const float *x, int H, int K, float *x_k,
			       struct kn_column *cols_k, int32_t *out_col, int32_t *tokens, float *tok_lp,
			       cudaStream_t st)
{
	return kn_launch(logit_rows_kernel, dim3(K), dim3(LR_T), 0, st, cols, W, x, H, x_k, cols_k, out_col, tokens,
			 tok_lp);
}

cudaError_t kn_cuda_sample(const struct kn_cu_sample_args *a, cudaStream_t st)
{
	/* pieces in blocks of their own while the rows leave SMs idle (H100,
	 * 1B: batch 1 1.188 -> 1.151 ms a step, 8 1.394 -> 1.364; at 64 level,
	 * at 256 0.8% slower) */
	const int pieces = a->scratch != NULL && a->n <= 32 ? sample_pieces(a->vocab) : 1;
	return kn_launch(sample_kernel, dim3(a->n, pieces), dim3(SM_T), 0, st, *a);
}
