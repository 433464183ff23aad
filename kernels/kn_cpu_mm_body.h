/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CPU engine's batched matrix-vector kernels, written once and compiled
 * once per instruction set: kn_cpu_mm.c includes this file once for each ISA
 * it dispatches between (see the run-time dispatch note there), with
 *   KN_MM_ISA  the name suffix of this copy (baseline, avx2), and
 *   KN_MM_FMA  1 where this copy may use FMA and F16C (the caller wraps the
 *              include in #pragma GCC target("avx2,fma,f16c")), else 0.
 * Deliberately no include guard; nothing else includes it.
 *
 * Register blocking: 4 weight rows x 2 columns = 8 accumulators of 8 lanes
 * (AVX2 has 16 ymm registers: 8 acc + 4 w + 1 x fit). A column left over
 * runs 4 x 1 with the very same per-element operation sequence, so results
 * are bitwise equal whichever block a column lands in.
 */
#if !defined(KN_MM_ISA) || !defined(KN_MM_FMA)
#error "kn_cpu_mm_body.h is included by kn_cpu_mm.c only, once per ISA"
#endif

#define KN_MM_CAT_(a, b) a##_##b
#define KN_MM_CAT(a, b) KN_MM_CAT_(a, b)
#define KN_MM_FN(name) KN_MM_CAT(name, KN_MM_ISA)

/* An unaligned load of 8 floats (v8u: 4-byte aligned, may alias float). */
#define KN_MM_LD8(p) (*(const v8u *)(const void *)(p))

/* a * b + c. The FMA copy rounds once, the baseline twice: the two copies
 * differ in the last bit, each is deterministic on its own (kn_cpu_mm.c).
 * Macros, not functions: GCC warns of an ABI change (-Wpsabi) for every
 * function taking or returning a 32-byte vector by value in the baseline
 * copy. */
#if KN_MM_FMA
#define KN_MM_FMA8(a, b, c) ((v8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#else
#define KN_MM_FMA8(a, b, c) ((a) * (b) + (c))
#endif

/* By pointer, for the same reason as KN_MM_FMA8. */
static inline float KN_MM_FN(hsum8)(const v8 *v)
{
	const v8 a = *v;
	float s0 = (a[0] + a[4]) + (a[2] + a[6]);
	float s1 = (a[1] + a[5]) + (a[3] + a[7]);
	return s0 + s1;
}

static void KN_MM_FN(row_to_f32)(const void *src, enum kn_dtype dt, int32_t k, float *dst)
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
#if KN_MM_FMA
		/* f16 -> f32 is exact: F16C and kn_f16_to_f32 give the same bits. */
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

static float KN_MM_FN(dot)(const float *a, const float *b, int32_t kp)
{
	v8 acc = { 0 };
	for (int32_t k = 0; k < kp; k += 8)
		acc = KN_MM_FMA8(KN_MM_LD8(a + k), KN_MM_LD8(b + k), acc);
	return KN_MM_FN(hsum8)(&acc);
}

static void KN_MM_FN(axpy)(float a, const float *x, float *y, int32_t kp)
{
	v8 av = { a, a, a, a, a, a, a, a };
	for (int32_t k = 0; k < kp; k += 8) {
		v8 r = KN_MM_FMA8(av, KN_MM_LD8(x + k), KN_MM_LD8(y + k));
		memcpy(y + k, &r, sizeof(r));
	}
}

static void KN_MM_FN(mm_rows)(const struct kn_mm *mm, int32_t o0, int32_t o1, float *wbuf)
{
	const int32_t kp = kn_pad(mm->K), ldw = mm->ldw > 0 ? mm->ldw : mm->K;
	const int32_t nb = mm->kblocks > 0 ? mm->kblocks : 1, kb = mm->kblocks > 0 ? mm->K / mm->kblocks : kp;
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
			KN_MM_FN(row_to_f32)(wbase + ((size_t)(mm->row0 + row) * (size_t)ldw + (size_t)mm->koff) * esz,
					     mm->w->dtype, mm->K, dst);
			w[i] = dst;
		}
		const float *bias = NULL;
		if (mm->bias) {
			for (int32_t i = 0; i < r; i++) {
				float tmp[KN_LANES];
				size_t bs = mm->bias->dtype == KN_DT_F32 ? 4 : 2;
				KN_MM_FN(row_to_f32)((const uint8_t *)mm->bias->data + (size_t)(mm->row0 + o + i) * bs,
						     mm->bias->dtype, 1, tmp);
				bias_f[i] = tmp[0];
			}
			bias = bias_f;
		}
		int32_t j = 0;
		for (; j + 2 <= mm->n; j += 2) {
			const float *x0 = mm->x + (size_t)j * (size_t)mm->ldx, *x1 = x0 + mm->ldx;
			float s[KN_MM_MAX_KBLOCKS][4][2];
			for (int32_t b = 0; b < nb; b++) {
				v8 a00 = { 0 }, a01 = { 0 }, a10 = { 0 }, a11 = { 0 };
				v8 a20 = { 0 }, a21 = { 0 }, a30 = { 0 }, a31 = { 0 };
				for (int32_t k = b * kb; k < (b + 1) * kb; k += 8) {
					v8 xa = KN_MM_LD8(x0 + k), xb = KN_MM_LD8(x1 + k);
					v8 w0 = KN_MM_LD8(w[0] + k), w1 = KN_MM_LD8(w[1] + k);
					v8 w2 = KN_MM_LD8(w[2] + k), w3 = KN_MM_LD8(w[3] + k);
					a00 = KN_MM_FMA8(w0, xa, a00);
					a01 = KN_MM_FMA8(w0, xb, a01);
					a10 = KN_MM_FMA8(w1, xa, a10);
					a11 = KN_MM_FMA8(w1, xb, a11);
					a20 = KN_MM_FMA8(w2, xa, a20);
					a21 = KN_MM_FMA8(w2, xb, a21);
					a30 = KN_MM_FMA8(w3, xa, a30);
					a31 = KN_MM_FMA8(w3, xb, a31);
			}
			s[b][0][0] = KN_MM_FN(hsum8)(&a00);
			s[b][0][1] = KN_MM_FN(hsum8)(&a01);
			s[b][1][0] = KN_MM_FN(hsum8)(&a10);
			s[b][1][1] = KN_MM_FN(hsum8)(&a11);
			s[b][2][0] = KN_MM_FN(hsum8)(&a20);
			s[b][2][1] = KN_MM_FN(hsum8)(&a21);
			s[b][3][0] = KN_MM_FN(hsum8)(&a30);
			s[b][3][1] = KN_MM_FN(hsum8)(&a31);
			}
			for (int32_t step = 1; step < nb; step *= 2) /* the blocks' sums, pairwise */
				for (int32_t b = 0; b + step < nb; b += 2 * step)
					for (int32_t i = 0; i < 4; i++) {
						s[b][i][0] += s[b + step][i][0];
						s[b][i][1] += s[b + step][i][1];
					}
			for (int32_t i = 0; i < r; i++) {
				store(mm, j, o, i, s[0][i][0], bias);
				store(mm, j + 1, o, i, s[0][i][1], bias);
			}
		}
		for (; j < mm->n; j++) {
			const float *x0 = mm->x + (size_t)j * (size_t)mm->ldx;
			float s[KN_MM_MAX_KBLOCKS][4];
			for (int32_t b = 0; b < nb; b++) {
				v8 a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };
				for (int32_t k = b * kb; k < (b + 1) * kb; k += 8) {
					v8 xa = KN_MM_LD8(x0 + k);
					a0 = KN_MM_FMA8(KN_MM_LD8(w[0] + k), xa, a0);
					a1 = KN_MM_FMA8(KN_MM_LD8(w[1] + k), xa, a1);
					a2 = KN_MM_FMA8(KN_MM_LD8(w[2] + k), xa, a2);
					a3 = KN_MM_FMA8(KN_MM_LD8(w[3] + k), xa, a3);
			}
			s[b][0] = KN_MM_FN(hsum8)(&a0);
			s[b][1] = KN_MM_FN(hsum8)(&a1);
			s[b][2] = KN_MM_FN(hsum8)(&a2);
			s[b][3] = KN_MM_FN(hsum8)(&a3);
			}
			for (int32_t step = 1; step < nb; step *= 2)
				for (int32_t b = 0; b + step < nb; b += 2 * step)
					for (int32_t i = 0; i < 4; i++)
						s[b][i] += s[b + step][i];
			for (int32_t i = 0; i < r; i++)
				store(mm, j, o, i, s[0][i], bias);
		}
	}
}

#undef KN_MM_FMA8
#undef KN_MM_LD8
#undef KN_MM_FN
#undef KN_MM_CAT
#undef KN_MM_CAT_
