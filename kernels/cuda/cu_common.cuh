/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file cu_common.cuh
 * Types and helpers shared by the CUDA operators (private to kernels/cuda/).
 *
 * Every operator's host entry point returns the cudaError_t of its launch
 * (cudaGetLastError() right after it), so the engine can name the failing
 * operator; none of them synchronises.
 */
#ifndef KN_CU_COMMON_CUH
#define KN_CU_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kn_stage.h"

typedef __nv_bfloat16 kn_bf16;

/* A padding column (plan slots beyond n_cols) carries slot -1: kernels skip
 * its K/V write and attention, and produce zeros for it. */
#define KN_CU_PAD_SLOT (-1)

/** Warp-wide sum in a fixed butterfly order (deterministic). */
static __device__ __forceinline__ float kn_warp_sum(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

static __device__ __forceinline__ float kn_warp_max(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/** Unpack 8 bf16 held in a 16-byte vector to f32. */
static __device__ __forceinline__ void kn_bf16x8_to_f32(const uint4 v, float *f)
{
	const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v);
#pragma unroll
	for (int i = 0; i < 4; i++) {
		float2 t = __bfloat1622float2(h[i]);
		f[2 * i] = t.x;
		f[2 * i + 1] = t.y;
	}
}

/** Read-only 16-byte load that bypasses L1 allocation for streamed data. */
static __device__ __forceinline__ uint4 kn_ld_stream(const void *p)
{
	uint4 r;
	asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
		     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
	return r;
}

#endif /* KN_CU_COMMON_CUH */
