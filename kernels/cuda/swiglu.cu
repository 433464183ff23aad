/* SPDX-License-Identifier: Apache-2.0 */
#include "swiglu.cuh"

static __device__ __forceinline__ void store2(float *o, float a, float b)
{
	*reinterpret_cast<float2 *>(o) = make_float2(a, b);
}

static __device__ __forceinline__ void store2(kn_bf16 *o, float a, float b)
{
	*reinterpret_cast<__nv_bfloat162 *>(o) = __floats2bfloat162_rn(a, b);
}

/* grid (ceil(inter/2/256), n), block 256: two elements per thread. gu in
 * segs segment sums where segs > 0 (kn_parts_ld<float2>()). */
template <typename T>
static __global__ void swiglu_kernel(const float *gu, int segs, int inter, T *out)
{
	kn_pdl_wait();
	kn_pdl_trigger();
	const int r = blockIdx.y;
	const int i = 2 * (blockIdx.x * blockDim.x + threadIdx.x);
	if (i >= inter)
		return;
	const size_t count = (size_t)gridDim.y * 2 * inter;
	const float2 g = kn_parts_ld<float2>(gu, segs, count, (size_t)r * 2 * inter + i);
	const float2 u = kn_parts_ld<float2>(gu, segs, count, (size_t)r * 2 * inter + inter + i);
	const float a = g.x / (1.f + expf(-g.x)) * u.x;
	const float b = g.y / (1.f + expf(-g.y)) * u.y;
	store2(out + (size_t)r * inter + i, a, b);
}

cudaError_t kn_cuda_swiglu(const float *gu, int gu_segs, int n, int inter, float *out, cudaStream_t st)
{
	if (inter % 2)
		return cudaErrorInvalidValue;
	dim3 grid((inter / 2 + 255) / 256, n);
	return kn_launch(swiglu_kernel<float>, grid, dim3(256), 0, st, gu, gu_segs, inter, out);
}

cudaError_t kn_cuda_swiglu_bf16(const float *gu, int gu_segs, int n, int inter, kn_bf16 *out, cudaStream_t st)
{
	if (inter % 2)
		return cudaErrorInvalidValue;
	dim3 grid((inter / 2 + 255) / 256, n);
	return kn_launch(swiglu_kernel<kn_bf16>, grid, dim3(256), 0, st, gu, gu_segs, inter, out);
}
