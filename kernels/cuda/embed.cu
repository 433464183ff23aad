/* SPDX-License-Identifier: Apache-2.0 */
#include "embed.cuh"

/* grid (n), block 256: one row per block, 8 bf16 per thread per step. */
static __global__ void embed_kernel(const kn_bf16 *table, const struct kn_column *cols,
				    int hidden, float *out)
{
	kn_pdl_wait();
	kn_pdl_trigger();
	const int c = blockIdx.x;
	const int tok = cols[c].slot == KN_CU_PAD_SLOT ? 0 : cols[c].token;
	const kn_bf16 *row = table + (size_t)tok * hidden;
	float *o = out + (size_t)c * hidden;
	for (int i = threadIdx.x * 8; i < hidden; i += blockDim.x * 8) {
		float f[8];
		kn_bf16x8_to_f32(*reinterpret_cast<const uint4 *>(row + i), f);
		*reinterpret_cast<float4 *>(o + i) = make_float4(f[0], f[1], f[2], f[3]);
		*reinterpret_cast<float4 *>(o + i + 4) = make_float4(f[4], f[5], f[6], f[7]);
	}
}

cudaError_t kn_cuda_embed(const kn_bf16 *table, const struct kn_column *cols, int n,
			  int hidden, float *out, cudaStream_t st)
{
	if (hidden % 8)
		return cudaErrorInvalidValue;
	return kn_launch(embed_kernel, dim3(n), dim3(256), 0, st, table, cols, hidden, out);
}
