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

#include <utility>

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

/*
 * Programmatic dependent launch (sm_90). The decode step is a chain of
 * small kernels; with the launch attribute set, the next kernel of the
 * stream is launched once every block of the current one has called
 * kn_pdl_trigger(), so its launch and its independent prologue (the skinny
 * GEMM's first weight loads) overlap the current kernel. Rules for every
 * kernel launched through kn_launch(): every thread calls kn_pdl_wait()
 * before it reads anything an earlier kernel wrote, writes anything, or
 * returns (the wait returns once the previous grid has completed and its
 * writes are visible, so by induction every earlier kernel has too); and
 * kn_pdl_trigger() comes only after that wait, so at most two grids
 * overlap (a grid then never runs beside one two launches back, whose
 * reads it could race). The skinny path once read stale X under this scheme
 * (HF check rel err 0.9): X came through __ldg, which the compiler may hoist
 * above the wait; kn_ld_f4() below fixed it. Triggering at each kernel's
 * top (deeper chains) was only tried while that bug was present. Both
 * instructions are no-ops without the attribute.
 */
static __device__ __forceinline__ void kn_pdl_wait(void)
{
	asm volatile("griddepcontrol.wait;" ::: "memory");
}

static __device__ __forceinline__ void kn_pdl_trigger(void)
{
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/**
 * Whether kn_launch() sets the attribute: 1 unless KVFERRY_CUDA_PDL=0 (read
 * once) or kn_cuda_pdl_suspend(1) is in force on this thread.
 */
int kn_cuda_pdl(void);

/** @param off 1: launches from this thread go without the attribute; 0: back to kn_cuda_pdl()'s default. */
void kn_cuda_pdl_suspend(int off);

/**
 * A launch config for @p grid x @p block with @p smem bytes on @p st: the
 * cluster dimension @p cluster along x when above 1, then the
 * programmatic-serialization attribute when kn_cuda_pdl() (and @p pdl).
 * @p at holds the attributes (two).
 */
static inline cudaLaunchConfig_t kn_launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t st,
						  unsigned cluster, int pdl, cudaLaunchAttribute at[2])
{
	cudaLaunchConfig_t cfg = {};
	cfg.gridDim = grid;
	cfg.blockDim = block;
	cfg.dynamicSmemBytes = smem;
	cfg.stream = st;
	cfg.attrs = at;
	if (cluster > 1) {
		at[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
		at[cfg.numAttrs].val.clusterDim.x = cluster;
		at[cfg.numAttrs].val.clusterDim.y = 1;
		at[cfg.numAttrs].val.clusterDim.z = 1;
		cfg.numAttrs++;
	}
	if (pdl && kn_cuda_pdl()) {
		at[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
		at[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
		cfg.numAttrs++;
	}
	return cfg;
}

/**
 * Launch @p k on @p st in clusters of @p cluster CTAs along x (1: none),
 * with the programmatic-serialization attribute (when kn_cuda_pdl()); the
 * kernel must follow the kn_pdl_wait() rule above.
 * @return the launch's error, else cudaGetLastError().
 */
template <typename... P, typename... A>
static inline cudaError_t kn_launch_cl(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
				       unsigned cluster, A &&...args)
{
	cudaLaunchAttribute at[2];
	const cudaLaunchConfig_t cfg = kn_launch_config(grid, block, smem, st, cluster, 1, at);
	const cudaError_t e = cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...);
	return e != cudaSuccess ? e : cudaGetLastError();
}

/** kn_launch_cl() without clusters. */
template <typename... P, typename... A>
static inline cudaError_t kn_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem,
				    cudaStream_t st, A &&...args)
{
	return kn_launch_cl(k, grid, block, smem, st, 1, std::forward<A>(args)...);
}

/**
 * 16-byte load of data an earlier kernel wrote (a linear layer's X), kept
 * after kn_pdl_wait(): __ldg and const __restrict__ loads are non-coherent
 * loads the compiler treats as invariant and may hoist above the wait (the
 * skinny path read X before its producer finished: HF check rel err 0.9).
 */
static __device__ __forceinline__ float4 kn_ld_f4(const float *p)
{
	float4 r;
	asm volatile("ld.global.v4.f32 {%0,%1,%2,%3}, [%4];"
		     : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(p) : "memory");
	return r;
}

/** A load of data another block of the same kernel wrote (after a fence and
 *  a counter): served from L2, never a stale L1 line. */
static __device__ __forceinline__ float kn_ld_cg(const float *p)
{
	float r;
	asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(r) : "l"(p) : "memory");
	return r;
}

/* v += d, element by element */
static __device__ __forceinline__ void kn_add_to(float &v, float d)
{
	v += d;
}

static __device__ __forceinline__ void kn_add_to(float2 &v, float2 d)
{
	v.x += d.x;
	v.y += d.y;
}

static __device__ __forceinline__ void kn_add_to(float4 &v, float4 d)
{
	v.x += d.x;
	v.y += d.y;
	v.z += d.z;
	v.w += d.w;
}

/**
 * Element @p e of a linear layer's output left as @p nseg segment sums
 * [nseg][count] at @p p (gemm_wg.cuh, kn_cuda_gemm_wg_defer()), as V:
 * float, or two / four consecutive elements (8- / 16-byte aligned). The
 * sums are added from 0 in segment order, as the fold kernel it replaces
 * adds them, so the bits are the same. nseg 0: @p p is the output itself.
 */
template <typename V>
static __device__ __forceinline__ V kn_parts_ld(const float *p, int nseg, size_t count, size_t e)
{
	if (nseg == 0)
		return *reinterpret_cast<const V *>(p + e);
	V v = {};
	for (int s = 0; s < nseg; s++)
		kn_add_to(v, *reinterpret_cast<const V *>(p + (size_t)s * count + e));
	return v;
}

#endif /* KN_CU_COMMON_CUH */
