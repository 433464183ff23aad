/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file qkv_rope.cuh
 * Everything between the fused QKV projection and attention, in one launch:
 * q/k/v bias (Qwen2), per-head q/k RMSNorm (Qwen3), RoPE (with Llama-3
 * frequency scaling baked into inv_freq), and the K/V write into the paged
 * pool. Fused because each is a few FLOPs per element and a separate launch
 * per layer each would add 4 graph nodes per layer (~1 us each on the H200).
 */
#ifndef KN_CU_QKV_ROPE_CUH
#define KN_CU_QKV_ROPE_CUH
#include "cu_common.cuh"

/** Shapes and pointers of one layer's QKV post-processing. */
struct kn_cu_qkv_args {
	float *qkv;             /**< [n][qkv_dim] f32: q | k | v; q and k rotated in place */
	const float *qkv_parts; /**< NULL, or the projection as qkv_segs segment sums
	                             [qkv_segs][n][qkv_dim] (kn_parts_ld()): read from
	                             there, q written to qkv */
	int qkv_segs;
	const float *bias;      /**< [qkv_dim] or NULL */
	const float *q_norm;    /**< [head_dim] or NULL */
	const float *k_norm;    /**< [head_dim] or NULL */
	const float *inv_freq;  /**< [head_dim/2] */
	const struct kn_column *cols; /**< [n] */
	const int32_t *table;   /**< [n_slots][max_bps] block ids */
	kn_bf16 *k_cache;       /**< this layer: [n_blocks][n_kv_heads][KN_PAGE_BLK][head_dim] */
	kn_bf16 *v_cache;       /**< same layout */
	int n, n_heads, n_kv_heads, head_dim, max_bps;
	float eps;
};

/**
 * Run bias, q/k norm, RoPE and the paged K/V write for @p a->n columns.
 * Padding columns (slot -1) and columns whose block is unset write no K/V.
 * @return the launch's cudaError_t (cudaErrorInvalidValue if head_dim is odd,
 *         below 2 or above 512).
 */
cudaError_t kn_cuda_qkv_rope(const struct kn_cu_qkv_args *a, cudaStream_t st);
#endif
