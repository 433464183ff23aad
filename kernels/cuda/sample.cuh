/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file sample.cuh
 * Token choice on the device, so nothing vocab-sized leaves it per step:
 * greedy argmax (lowest id on ties), temperature / top-k / top-p draws keyed
 * by (seed, pos), the chosen token's logprob and the top-N logprobs. The
 * rule and its arithmetic are kernels/kn_sample_core.h, shared with the
 * host's kn_sample_column(): the same logits give the same token on the CPU
 * and CUDA engines; logprobs agree to ~1e-7 (double sums, another order).
 */
#ifndef KN_CU_SAMPLE_CUH
#define KN_CU_SAMPLE_CUH
#include "cu_common.cuh"

/**
 * tokens[c] = argmax of logits[c] for each column with KN_COL_NEED_LOGIT;
 * -1 for the others and for padding. All-NaN rows give id 0.
 * @param logits  [n][vocab] f32
 * @return the launch's cudaError_t.
 */
cudaError_t kn_cuda_argmax(const float *logits, int vocab, const struct kn_column *cols, int n,
			   int32_t *tokens, cudaStream_t st);

/** Most top logprobs per column the device sampler computes (the API's limit). */
#define KN_CU_MAX_TOP 20

struct kn_cu_sample_args {
	const float *logits;            /**< [n][vocab] f32 */
	int vocab;
	const struct kn_column *cols;   /**< [n] */
	int n;
	const int32_t *n_top;           /**< device scalar: top logprobs wanted (0..KN_CU_MAX_TOP) */
	int32_t *tokens;                /**< [n] out; -1 for padding and columns without NEED_LOGIT */
	float *tok_lp;                  /**< [n] out: logprob of the chosen token */
	int32_t *top_ids;               /**< [n][KN_CU_MAX_TOP] out (first *n_top valid, -1 beyond vocab) */
	float *top_lps;                 /**< [n][KN_CU_MAX_TOP] out */
	const int32_t *out_col;         /**< NULL, or [n]: row c's outputs go to index out_col[c] of the four
	                                     outputs (kn_cuda_logit_rows()); rows of -1 write nothing */
	void *scratch;                  /**< NULL (one block a row), or kn_cuda_sample_scratch_bytes(n) zeroed
	                                     bytes: each row's first passes in pieces over several blocks */
};

/** Most blocks one row's first passes take (kn_cuda_sample()). */
#define KN_CU_SAMPLE_PIECES 32

/**
 * Bytes of kn_cu_sample_args.scratch for up to @p rows rows; the caller
 * zeroes them once (the kernel leaves its counters at zero).
 */
size_t kn_cuda_sample_scratch_bytes(int rows);

/**
 * The full sampler, one 1,024-thread block per column (kn_sample_core.h).
 * Cost: a few passes over each NEED_LOGIT column's row (greedy: two; a
 * top-p draw: about ten), nothing for the others. With @p a->scratch the
 * greedy passes (the argmax and the logprob's sum) run over pieces of the
 * row in blocks of their own, about 8,192 logits each (a 128k vocabulary:
 * 15), and the last block of a row to finish adds the pieces in order and
 * does the rest: a row's result depends on the vocabulary alone, not on
 * the rows beside it.
 * @return the launch's cudaError_t.
 */
cudaError_t kn_cuda_sample(const struct kn_cu_sample_args *a, cudaStream_t st);

/**
 * The rows the LM head needs, packed: of the @p W columns, those with
 * KN_COL_NEED_LOGIT (padding excluded), in order, the first @p K of them:
 * row k of @p x_k is the column's row of @p x ([W][H] f32), @p cols_k[k]
 * its column and @p out_col[k] its index; rows past the count get a
 * padding column, zeros and -1. Every other column of W gets token -1 and
 * logprob 0 in @p tokens / @p tok_lp (what kn_cuda_sample() writes for
 * them), so the sampler run over the K rows with out_col fills the outputs
 * of all W. The caller sees to it that at most K columns want a token.
 */
cudaError_t kn_cuda_logit_rows(const struct kn_column *cols, int W, const float *x, int H, int K, float *x_k,
			       struct kn_column *cols_k, int32_t *out_col, int32_t *tokens, float *tok_lp,
			       cudaStream_t st);
#endif
