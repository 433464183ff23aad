/* SPDX-License-Identifier: Apache-2.0 */
#include "table.cuh"

#define TB_THREADS 256

/* grid (1), block 256: ops one after another (a later op may undo an
 * earlier one on the same slot), a row clear spread over the block. */
static __global__ void __launch_bounds__(TB_THREADS)
apply_ops_kernel(int32_t *table, int max_bps, const struct kn_op *ops, int n)
{
	for (int i = 0; i < n; i++) {
		const struct kn_op op = ops[i];
		int32_t *row = table + (size_t)op.slot * max_bps;
		if (op.type == KN_OP_SET_BLOCK) {
			if (threadIdx.x == 0)
				row[op.idx] = op.val;
		} else if (op.type == KN_OP_ZERO_SLOT) {
			for (int j = threadIdx.x; j < max_bps; j += TB_THREADS)
				row[j] = -1;
		}
		__syncthreads();
	}
}

cudaError_t kn_cuda_apply_ops(int32_t *table, int max_bps, const struct kn_op *ops, int n, cudaStream_t st)
{
	if (n <= 0)
		return cudaSuccess;
	apply_ops_kernel<<<1, TB_THREADS, 0, st>>>(table, max_bps, ops, n);
	return cudaGetLastError();
}
