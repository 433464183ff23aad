/* SPDX-License-Identifier: Apache-2.0 */
#include "fill.cuh"

static __device__ __forceinline__ float hash_u(uint64_t seed, uint64_t i)
{
	uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	z ^= z >> 31;
	return (float)(z >> 40) * (1.0f / 16777216.0f);
}

static __global__ void fill_bf16_kernel(kn_bf16 *dst, size_t n, uint64_t seed, float scale)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		dst[i] = __float2bfloat16(scale * (2.f * hash_u(seed, i) - 1.f));
}

static __global__ void fill_f32_kernel(float *dst, size_t n, uint64_t seed, float base, float scale)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		dst[i] = base + scale * (2.f * hash_u(seed, i) - 1.f);
}

cudaError_t kn_cuda_fill_bf16(kn_bf16 *dst, size_t count, uint64_t seed, float scale,
			      cudaStream_t st)
{
	fill_bf16_kernel<<<4096, 256, 0, st>>>(dst, count, seed, scale);
	return cudaGetLastError();
}

cudaError_t kn_cuda_fill_f32(float *dst, size_t count, uint64_t seed, float base, float scale,
			     cudaStream_t st)
{
	fill_f32_kernel<<<1024, 256, 0, st>>>(dst, count, seed, base, scale);
	return cudaGetLastError();
}
