/* SPDX-License-Identifier: Apache-2.0 */
#include "swiglu.cuh"

/* grid (ceil(inter/2/256), n), block 256: two elements per thread. */
static __global__ void swiglu_kernel(const float *gu, int inter, float *out)
{
	const int r = blockIdx.y;
	const int i = 2 * (blockIdx.x * blockDim.x + threadIdx.x);
	if (i >= inter)
		return;
	const float2 g = *reinterpret_cast<const float2 *>(gu + (size_t)r * 2 * inter + i);
	const float2 u = *reinterpret_cast<const float2 *>(gu + (size_t)r * 2 * inter + inter + i);
	const float a = g.x / (1.f + expf(-g.x)) * u.x;
	const float b = g.y / (1.f + expf(-g.y)) * u.y;
	*reinterpret_cast<float2 *>(out + (size_t)r * inter + i) = make_float2(a, b);
}

cudaError_t kn_cuda_swiglu(const float *gu, int n, int inter, float *out, cudaStream_t st)
{
	if (inter % 2)
		return cudaErrorInvalidValue;
	dim3 grid((inter / 2 + 255) / 256, n);
	swiglu_kernel<<<grid, 256, 0, st>>>(gu, inter, out);
	return cudaGetLastError();
}
