/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file attention.cuh
 * Paged attention, one query column at a time, with GQA: the heads sharing a
 * KV head are served by one pass over its K/V. Long contexts are split into
 * KN_CU_ATTN_SPLIT-position pieces processed by separate blocks (split-K,
 * "flash-decoding"), then merged; the number of pieces depends only on the
 * column's own position, so a column's bits never depend on its batch.
 */
#ifndef KN_CU_ATTENTION_CUH
#define KN_CU_ATTENTION_CUH
#include "cu_common.cuh"

/** Positions per split. 128: a 4k-context column gives 32 x n_kv_heads blocks. */
#define KN_CU_ATTN_SPLIT 128

struct kn_cu_attn_args {
	const float *q;          /**< [n][q_stride] f32, head h at h*head_dim, rotated */
	int q_stride;
	const kn_bf16 *k_cache;  /**< [n_blocks][n_kv_heads][KN_PAGE_BLK][head_dim] */
	const kn_bf16 *v_cache;
	const int32_t *table;    /**< [n_slots][max_bps] */
	const struct kn_column *cols; /**< [n]; a column attends to 0..pos of its slot */
	float *out;              /**< [n][n_heads*head_dim] f32 */
	float *part;             /**< workspace, kn_cuda_attn_workspace() bytes */
	int n, n_heads, n_kv_heads, head_dim, max_bps;
	int max_ctx;             /**< largest pos + 1 any column may have */
	float scale;             /**< 1/sqrt(head_dim) */
};

/** @return workspace bytes for @p n columns (partials of every split). */
size_t kn_cuda_attn_workspace(int n, int n_heads, int n_kv_heads, int head_dim, int max_ctx);

/**
 * Attend every column of @p a. Padding columns (slot -1) produce zeros.
 * @return the launch's cudaError_t; cudaErrorInvalidValue for a head_dim
 *         outside {16, 32, 64, 128, 256} or more than 8 heads per KV head.
 */
cudaError_t kn_cuda_attention(const struct kn_cu_attn_args *a, cudaStream_t st);
#endif
