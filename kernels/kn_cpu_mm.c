/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Batched matrix-vector kernels of the CPU engine. Each weight row is read
 * once per step and applied to every column of the micro-batch: decode at
 * batch 32 reads the weights once instead of 32 times, which is where batch
 * throughput comes from.
 *
 * Register blocking: 4 weight rows x 2 columns = 8 accumulators of 8 lanes
 * (AVX2 has 16 ymm registers: 8 acc + 4 w + 1 x fit). A column left over
 * runs 4 x 1 with the very same per-element operation sequence, so results
 * are bitwise equal whichever block a column lands in.
 */
#include <string.h>

#include "kn_cpu_mm.h"
#include "kn_stage_impl.h"

#if defined(__FMA__)
#include <immintrin.h>
#endif

typedef float v8 __attribute__((vector_size(32)));
typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

static inline v8 ld8(const float *p)
{
	v8 v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static inline v8 fma8(v8 a, v8 b, v8 c)
{
#if defined(__FMA__)
	return (v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
	return a * b + c;
#endif
}

static inline float hsum8(v8 a)
{
	float s0 = (a[0] + a[4]) + (a[2] + a[6]);
	float s1 = (a[1] + a[5]) + (a[3] + a[7]);
	return s0 + s1;
}

void kn_row_to_f32(const void *src, enum kn_dtype dt, int32_t k, float *dst)
{
	int32_t i = 0, kp = kn_pad(k);
	if (dt == KN_DT_F32) {
		memcpy(dst, src, (size_t)k * sizeof(float));
		i = k;
	} else if (dt == KN_DT_BF16) {
		const uint16_t *s = src;
		for (; i + 8 <= k; i += 8) {
			u16x8 h;
			memcpy(&h, s + i, sizeof(h));
			u32x8 w = __builtin_convertvector(h, u32x8) << 16;
			memcpy(dst + i, &w, sizeof(w));
		}
		for (; i < k; i++)
			dst[i] = kn_bf16_to_f32(s[i]);
	} else {
		const uint16_t *s = src;
#if defined(__F16C__)
		for (; i + 8 <= k; i += 8) {
			__m128i h;
			memcpy(&h, s + i, sizeof(h));
			__m256 f = _mm256_cvtph_ps(h);
			memcpy(dst + i, &f, sizeof(f));
		}
#endif
		for (; i < k; i++)
			dst[i] = kn_f16_to_f32(s[i]);
	}
	for (; i < kp; i++)
		dst[i] = 0.0f;
}

float kn_dot(const float *a, const float *b, int32_t kp)
{
	v8 acc = { 0 };
	for (int32_t k = 0; k < kp; k += 8)
		acc = fma8(ld8(a + k), ld8(b + k), acc);
	return hsum8(acc);
}

void kn_axpy(float a, const float *x, float *y, int32_t kp)
{
	v8 av = { a, a, a, a, a, a, a, a };
	for (int32_t k = 0; k < kp; k += 8) {
		v8 r = fma8(av, ld8(x + k), ld8(y + k));
		memcpy(y + k, &r, sizeof(r));
	}
}

static inline void store(const struct kn_mm *mm, int32_t j, int32_t o, int32_t i, float v, const float *bias)
{
	float *y = mm->y + (size_t)j * (size_t)mm->ldy + o + i;
	if (bias)
		v += bias[i];
	*y = mm->accumulate ? *y + v : v;
}

void kn_mm_rows(const struct kn_mm *mm, int32_t o0, int32_t o1, float *wbuf)
{
	const int32_t kp = kn_pad(mm->K);
	const size_t esz = mm->w->dtype == KN_DT_F32 ? 4 : 2;
	const uint8_t *wbase = mm->w->data;
	float bias_f[4];

	for (int32_t o = o0; o < o1; o += 4) {
		int32_t r = o1 - o < 4 ? o1 - o : 4;
		const float *w[4];
		for (int32_t i = 0; i < 4; i++) {
			int32_t row = o + (i < r ? i : 0);
			float *dst = wbuf + (size_t)i * (size_t)kp;
			if (i >= r) {
				w[i] = w[0];
				continue;
			}
			kn_row_to_f32(wbase + (size_t)row * (size_t)mm->K * esz, mm->w->dtype, mm->K, dst);
			w[i] = dst;
		}
		const float *bias = NULL;
		if (mm->bias) {
			for (int32_t i = 0; i < r; i++) {
				float tmp[KN_LANES];
				size_t bs = mm->bias->dtype == KN_DT_F32 ? 4 : 2;
				kn_row_to_f32((const uint8_t *)mm->bias->data + (size_t)(o + i) * bs, mm->bias->dtype, 1, tmp);
				bias_f[i] = tmp[0];
			}
			bias = bias_f;
		}
		int32_t j = 0;
		for (; j + 2 <= mm->n; j += 2) {
			const float *x0 = mm->x + (size_t)j * (size_t)mm->ldx, *x1 = x0 + mm->ldx;
			v8 a00 = { 0 }, a01 = { 0 }, a10 = { 0 }, a11 = { 0 };
			v8 a20 = { 0 }, a21 = { 0 }, a30 = { 0 }, a31 = { 0 };
			for (int32_t k = 0; k < kp; k += 8) {
				v8 xa = ld8(x0 + k), xb = ld8(x1 + k);
				v8 w0 = ld8(w[0] + k), w1 = ld8(w[1] + k), w2 = ld8(w[2] + k), w3 = ld8(w[3] + k);
				a00 = fma8(w0, xa, a00);
				a01 = fma8(w0, xb, a01);
				a10 = fma8(w1, xa, a10);
				a11 = fma8(w1, xb, a11);
				a20 = fma8(w2, xa, a20);
				a21 = fma8(w2, xb, a21);
				a30 = fma8(w3, xa, a30);
				a31 = fma8(w3, xb, a31);
			}
			float s[4][2] = { { hsum8(a00), hsum8(a01) }, { hsum8(a10), hsum8(a11) },
					  { hsum8(a20), hsum8(a21) }, { hsum8(a30), hsum8(a31) } };
			for (int32_t i = 0; i < r; i++) {
				store(mm, j, o, i, s[i][0], bias);
				store(mm, j + 1, o, i, s[i][1], bias);
			}
		}
		for (; j < mm->n; j++) {
			const float *x0 = mm->x + (size_t)j * (size_t)mm->ldx;
			v8 a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };
			for (int32_t k = 0; k < kp; k += 8) {
				v8 xa = ld8(x0 + k);
				a0 = fma8(ld8(w[0] + k), xa, a0);
				a1 = fma8(ld8(w[1] + k), xa, a1);
				a2 = fma8(ld8(w[2] + k), xa, a2);
				a3 = fma8(ld8(w[3] + k), xa, a3);
			}
			float s[4] = { hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3) };
			for (int32_t i = 0; i < r; i++)
				store(mm, j, o, i, s[i], bias);
		}
	}
}
