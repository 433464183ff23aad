/* SPDX-License-Identifier: Apache-2.0 */
#include "rmsnorm.cuh"

/* 1,024 threads: a decode row (hidden 2,048-8,192) is one or two float4s per
 * thread, one load round trip; at 256 threads the 8B row took 4 serial
 * round trips, 5.7 us a call in isolation (ncu, batch 1). */
#define RMS_THREADS 1024

static __device__ __forceinline__ void store4(float *o, int i, float4 v)
{
	reinterpret_cast<float4 *>(o)[i] = v;
}

/* bf16 output: the rounding gemm.cuh's split pass applied to the f32 value,
 * element by element, so the bits are the same as norm-then-split. */
static __device__ __forceinline__ void store4(kn_bf16 *o, int i, float4 v)
{
	__nv_bfloat162 *p = reinterpret_cast<__nv_bfloat162 *>(o) + 2 * i;
	p[0] = __floats2bfloat162_rn(v.x, v.y);
	p[1] = __floats2bfloat162_rn(v.z, v.w);
}

/* grid (n), block RMS_THREADS; each thread reads its strided share of the row
 * again for the scale (L1/L2), the norm weight's first float4 is loaded
 * before waiting for the kernel ahead (weights never change). */
template <typename T>
static __global__ void __launch_bounds__(RMS_THREADS)
add_rmsnorm_kernel(float *resid, const float *delta, int dsegs, const float *w, float eps, int hidden,
		   T *out)
{
	const int n4 = hidden / 4;
	const float4 *w4 = reinterpret_cast<const float4 *>(w);
	const float4 g0 = w && (int)threadIdx.x < n4 ? w4[threadIdx.x] : make_float4(0.f, 0.f, 0.f, 0.f);
	kn_pdl_wait();
	kn_pdl_trigger();
	__shared__ float red[RMS_THREADS / 32];
	const size_t base = (size_t)blockIdx.x * hidden;
	float4 *r4 = reinterpret_cast<float4 *>(resid + base);
	const size_t count = (size_t)gridDim.x * hidden; /* a segment's floats, where delta is in segments */
	float ss = 0.f;
	for (int i = threadIdx.x; i < n4; i += RMS_THREADS) {
		float4 v = r4[i];
		if (delta) {
			kn_add_to(v, kn_parts_ld<float4>(delta, dsegs, count, base + 4 * (size_t)i));
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
	T *o = out + base;
	for (int i = threadIdx.x; i < n4; i += RMS_THREADS) {
		const float4 v = r4[i], g = i == (int)threadIdx.x ? g0 : w4[i];
		store4(o, i, make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w));
	}
}

cudaError_t kn_cuda_add_rmsnorm(float *resid, const float *delta, int delta_segs, const float *w, float eps,
				int n, int hidden, float *out, cudaStream_t st)
{
	if (hidden % 4)
		return cudaErrorInvalidValue;
	return kn_launch(add_rmsnorm_kernel<float>, dim3(n), dim3(RMS_THREADS), 0, st, resid, delta,
			 delta_segs, w, eps, hidden, out);
}

cudaError_t kn_cuda_add_rmsnorm_bf16(float *resid, const float *delta, int delta_segs, const float *w, float eps,
				     int n, int hidden, kn_bf16 *out, cudaStream_t st)
{
	if (hidden % 4 || !out)
		return cudaErrorInvalidValue;
	return kn_launch(add_rmsnorm_kernel<kn_bf16>, dim3(n), dim3(RMS_THREADS), 0, st, resid, delta,
			 delta_segs, w, eps, hidden, out);
}
