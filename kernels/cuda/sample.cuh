/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file sample.cuh
 * Greedy token choice on the device: argmax of each column's f32 logit row,
 * lowest id on ties, the same rule as kn_sample_column() on the host.
 *
 * Columns with temperature > 0 are sampled on the host by the shared
 * kn_sample_column() from their copied logit row, so top-k, top-p and the
 * (seed, pos)-keyed draw are the same bits on the CPU and CUDA engines; the
 * kernel still writes their argmax, which the engine overwrites.
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
#endif
