/* SPDX-License-Identifier: Apache-2.0 */
#include "rmsnorm.cuh"

#define RMS_THREADS 256

/* grid (n), block RMS_THREADS; each thread keeps its strided share of the row
 * in registers between the add and the scale (hidden <= 8192 * 4 = 32768). */
static __global__ void __launch_bounds__(RMS_THREADS)
add_rmsnorm_kernel(float *resid, const float *delta, const float *w, float eps, int hidden,
		   float *out)
{
	__shared__ float red[RMS_THREADS / 32];
	const size_t base = (size_t)blockIdx.x * hidden;
	float4 *r4 = reinterpret_cast<float4 *>(resid + base);
	const float4 *d4 = delta ? reinterpret_cast<const float4 *>(delta + base) : nullptr;
	const int n4 = hidden / 4;
	float ss = 0.f;
	for (int i = threadIdx.x; i < n4; i += RMS_THREADS) {
		float4 v = r4[i];
		if (d4) {
			float4 d = d4[i];
			v.x += d.x; v.y += d.y; v.z += d.z; v.w += d.w;
			r4[i] = v;
		}
		ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
	}
	if (!out)
		return;
	ss = kn_warp_sum(ss);
	if ((threadIdx.x & 31) == 0)
		red[threadIdx.x >> 5] = ss;
	__syncthreads();
	float tot = 0.f;
#pragma unroll
	for (int i = 0; i < RMS_THREADS / 32; i++)
		tot += red[i];
	const float inv = rsqrtf(tot / (float)hidden + eps);
	const float4 *w4 = reinterpret_cast<const float4 *>(w);
	float4 *o4 = reinterpret_cast<float4 *>(out + base);
	for (int i = threadIdx.x; i < n4; i += RMS_THREADS) {
		float4 v = r4[i], g = w4[i];
		o4[i] = make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
	}
}

cudaError_t kn_cuda_add_rmsnorm(float *resid, const float *delta, const float *w, float eps,
				int n, int hidden, float *out, cudaStream_t st)
{
	if (hidden % 4)
		return cudaErrorInvalidValue;
	add_rmsnorm_kernel<<<n, RMS_THREADS, 0, st>>>(resid, delta, w, eps, hidden, out);
	return cudaGetLastError();
}
