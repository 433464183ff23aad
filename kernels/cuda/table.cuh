/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file table.cuh
 * The device block table follows the host's by replaying the same in-band
 * ops on the stream, ahead of the step that needs them: a step submitted
 * while an earlier one still runs never sees a table the host changed after
 * it (stream order), and a step never waits for a whole-table upload.
 */
#ifndef KN_CU_TABLE_CUH
#define KN_CU_TABLE_CUH
#include "cu_common.cuh"

/**
 * Apply @p n ops, in order, to table [n_slots][max_bps] (int32 block ids, -1
 * unset): SET_BLOCK writes one entry, ZERO_SLOT clears a row, ROLLBACK does
 * nothing (pure attention). The ops were validated on the host
 * (kn_stage_apply_ops), so none is out of range.
 * @param ops  [n] device copy of the ops
 * @return the launch's cudaError_t (none when n is 0).
 */
cudaError_t kn_cuda_apply_ops(int32_t *table, int max_bps, const struct kn_op *ops, int n, cudaStream_t st);
#endif
