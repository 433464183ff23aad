/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file kn_cpu_mm.h
 * Private: the CPU engine's batched matrix-vector kernels.
 *
 * Bitwise contract: every output element y[j][o] = dot(x[j], W[o]) is
 * reduced by one thread in one fixed order (8 lanes over k ascending, then a
 * fixed lane tree), whichever columns or rows share its register block. So a
 * column's result does not depend on the batch it rides in or the thread
 * split.
 */
#ifndef KN_CPU_MM_H
#define KN_CPU_MM_H

#include <stddef.h>
#include <stdint.h>

#include "kn_model.h"

/** Lane padding of every activation row and converted weight row (floats). */
#define KN_LANES 16

static inline int32_t kn_pad(int32_t n)
{
	return (n + KN_LANES - 1) / KN_LANES * KN_LANES;
}

/** One y = x W^T (+ bias) (+ y if accumulate) over n columns. */
struct kn_mm {
	const struct kn_tensor *w;    /**< [N][K] weight, f32/f16/bf16 */
	const struct kn_tensor *bias; /**< [N] or NULL */
	const float *x;               /**< [n][ldx], lanes K..pad(K) zero */
	float *y;                     /**< [n][ldy] */
	int32_t ldx, ldy, n, K, N;
	int accumulate;               /**< y += result (residual add) */
	/* a shard of @p w (tensor parallelism), all 0 for the whole tensor: */
	int32_t row0;                 /**< its first row (and bias element) */
	int32_t koff;                 /**< its first column: K columns from here ... */
	int32_t ldw;                  /**< ... of rows this long (0: K) */
	/** 0: each output reduced over K at once; B (2, 4, 8): over B equal
	 *  blocks of K (each a multiple of KN_LANES) alone, the B sums then
	 *  added pairwise ((s0 + s1) + (s2 + s3)) + ...: a shard of B/T blocks
	 *  sums to one subtree, so T shards added pairwise in order give the
	 *  bits of the whole. */
	int32_t kblocks;
};

/** The most blocks kn_mm.kblocks takes. */
#define KN_MM_MAX_KBLOCKS 8

/**
 * Compute rows [o0, o1) of @p mm. @p wbuf is thread scratch of 4 * pad(K)
 * floats (the converted weight rows: bf16 is widened per tile, never kept).
 */
void kn_mm_rows(const struct kn_mm *mm, int32_t o0, int32_t o1, float *wbuf);

/** Convert @p k elements of a row of dtype @p dt to f32, zero-padding to pad(k). */
void kn_row_to_f32(const void *src, enum kn_dtype dt, int32_t k, float *dst);

/** Fixed-order dot product of two pad(k)-long rows (k a multiple of KN_LANES). */
float kn_dot(const float *a, const float *b, int32_t kp);

/** y[0..kp) += a * x[0..kp). */
void kn_axpy(float a, const float *x, float *y, int32_t kp);

/**
 * The instruction set the kernels above run on in this process: "avx2"
 * (AVX2 + FMA + F16C) or "baseline", chosen at the first call from the CPU
 * and KVFERRY_CPU_ISA=baseline. Thread-safe; the choice never changes.
 * @return a static string
 */
const char *kn_cpu_isa(void);

#endif /* KN_CPU_MM_H */
