/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file kn_sample_core.h
 * Private: the arithmetic of token sampling, written once for the host
 * (kn_sample.c) and the device (cuda/sample.cu), so a draw is the same token
 * on every backend for the same logits.
 *
 * Why integers: a sampler that sums exp() in floating point gets a sum that
 * depends on the order of the additions, and the host walks a sorted list
 * while the device reduces in a tree. Here every weight is an integer, so
 * every sum is exact whatever the order, and each weight is computed by the
 * same IEEE operations on both sides (fmaf, one rounded multiply, exact
 * scalings): same bits in, same bits out.
 *
 * The rule (kn_stage.h, temperature > 0):
 *  - Order: logit descending, then id ascending. Key K(i) is a 64-bit
 *    integer that sorts the same way (ordered float bits above, the inverted
 *    id below; NaN sorts last, -0 equals +0). Keys are distinct.
 *  - Weight: q(i) = floor(2^40 * 2^(x * log2 e)) with x = (l_i - l_max) / T,
 *    from a degree-9 polynomial for 2^f on [0, 1);
 *    q = 2^40 for the best token, 0 below ~2^-40 of it (never drawn).
 *  - top_k > 0: only the top_k first keys. top_p in (0, 1): then only the
 *    shortest prefix whose weight reaches floor(top_p * S) (at least 1).
 *  - Draw: r = splitmix64(seed << 32 ^ pos); target = (r * S) >> 64, the
 *    token is the first (in key order) whose inclusive prefix weight exceeds
 *    target. S is the weight the filters kept.
 */
#ifndef KN_SAMPLE_CORE_H
#define KN_SAMPLE_CORE_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define KN_SC_FN static __host__ __device__ __forceinline__
#else
#define KN_SC_FN static inline
#endif

/** Weight of the best token: 2^40. */
#define KN_SC_ONE (1ull << 40)

KN_SC_FN uint32_t kn_sc_f2u(float f)
{
#ifdef __CUDA_ARCH__
	return __float_as_uint(f);
#else
	union { float f; uint32_t u; } v = { .f = f };
	return v.u;
#endif
}

/** Order key of (logit, id): larger key = earlier in the sampling order. */
KN_SC_FN uint64_t kn_sc_key(float l, int32_t id)
{
	uint32_t u = kn_sc_f2u(l);

	if (l != l)
		u = 0; /* NaN: below everything (-inf maps to 0x007fffff) */
	else if (l == 0.0f)
		u = 0x80000000u; /* -0 == +0, as the host's argmax compares them */
	else
		u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
	return ((uint64_t)u << 32) | (uint64_t)(0xffffffffu - (uint32_t)id);
}

/** @return the id a key was made from. */
KN_SC_FN int32_t kn_sc_key_id(uint64_t k)
{
	return (int32_t)(0xffffffffu - (uint32_t)k);
}

KN_SC_FN float kn_sc_fma(float a, float b, float c)
{
#ifdef __CUDA_ARCH__
	return __fmaf_rn(a, b, c);
#else
	return fmaf(a, b, c);
#endif
}

/**
 * Scaled logit x = (l - mx) / t (0 for the best token itself, so an infinite
 * maximum still weighs 1), then its integer weight (see the file comment).
 */
KN_SC_FN uint64_t kn_sc_weight(float l, float mx, float t)
{
	float x, y, fl, f, p;
	int32_t n, sh;
	uint64_t m;

	if (l == mx)
		return KN_SC_ONE;
#ifdef __CUDA_ARCH__
	x = __fdiv_rn(__fsub_rn(l, mx), t);
	y = __fmul_rn(x, 1.44269504088896341f);
#else
	x = (l - mx) / t;
	y = x * 1.44269504088896341f;
#endif
	if (!(y > -41.0f))
		return 0; /* NaN, -inf, or below 2^-41 */
	if (y > 0.0f)
		y = 0.0f; /* a logit above mx cannot happen; keep the weight bounded */
	fl = floorf(y);
	f = y - fl; /* exact: |y| < 2^23 */
	n = (int32_t)fl;
	/* 2^f = e^(f ln 2), Taylor to degree 9 (ln2^k / k!), Horner by fused
	 * multiply-adds: relative error < 2e-8 on [0, 1), increasing in f. */
	p = 1.01780860e-07f;
	p = kn_sc_fma(p, f, 1.32154868e-06f);
	p = kn_sc_fma(p, f, 1.52527338e-05f);
	p = kn_sc_fma(p, f, 1.54035304e-04f);
	p = kn_sc_fma(p, f, 1.33335581e-03f);
	p = kn_sc_fma(p, f, 9.61812911e-03f);
	p = kn_sc_fma(p, f, 5.55041087e-02f);
	p = kn_sc_fma(p, f, 2.40226507e-01f);
	p = kn_sc_fma(p, f, 6.93147181e-01f);
	p = kn_sc_fma(p, f, 1.0f);
	/* p in [1, 2): 24 bits of it as an integer (p * 2^23 is exact), then
	 * scaled by 2^(n + 17) so that p = 1, n = 0 gives 2^40. */
	m = (uint64_t)(p * 8388608.0f);
	sh = n + 17;
	return sh >= 0 ? m << sh : m >> -sh;
}

KN_SC_FN uint64_t kn_sc_splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/** The draw's target in [0, @p total): (r * total) >> 64 for r keyed by (seed, pos). */
KN_SC_FN uint64_t kn_sc_target(uint32_t seed, int32_t pos, uint64_t total)
{
	uint64_t r = kn_sc_splitmix64(((uint64_t)seed << 32) ^ (uint32_t)pos);
#ifdef __CUDA_ARCH__
	return __umul64hi(r, total);
#else
	__extension__ typedef unsigned __int128 u128;

	return (uint64_t)(((u128)r * total) >> 64);
#endif
}

/** The top_p cut: the prefix weight to reach, floor(top_p * S), within 1..S. */
KN_SC_FN uint64_t kn_sc_top_p_mass(float top_p, uint64_t total)
{
	double t = (double)top_p * (double)total;
	uint64_t m = t >= (double)total ? total : (uint64_t)t;

	return m < 1 ? 1 : m;
}

#endif /* KN_SAMPLE_CORE_H */
