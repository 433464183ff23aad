/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Batched matrix-vector kernels of the CPU engine. Each weight row is read
 * once per step and applied to every column of the micro-batch: decode at
 * batch 32 reads the weights once instead of 32 times, which is where batch
 * throughput comes from. The kernels themselves are in kn_cpu_mm_body.h.
 *
 * Run-time dispatch. The package is built for the distribution's baseline
 * (-Dnative=false: x86-64, SSE2 only), so nothing here may depend on
 * -march. kn_cpu_mm_body.h is compiled twice: a baseline copy, and on x86 an
 * AVX2+FMA+F16C copy under #pragma GCC target; the first call picks the copy
 * the CPU runs (__builtin_cpu_supports), once per process. The AVX2 copy is
 * the code a -march=native build compiled before the dispatch existed, so
 * its results are bitwise what they were; the baseline copy rounds a * b + c
 * twice where FMA rounds once, so a CPU without FMA computes other (equally
 * deterministic) bits — mixing such a node with FMA nodes in one pipeline
 * breaks "batched x sharded equals solo" across them, never on one node.
 * Cost of the dispatch (one relaxed load and an indirect call per kernel
 * call): bench_kn_cpu, small preset bf16, medians of 4 runs on a 16-core
 * Xeon VM, -march=native before -> dispatched -Dnative=false: 8 threads
 * prefill 974 -> 1031 tok/s, decode b1 305 -> 333, b8 739 -> 745, b32
 * 856 -> 834; 2 threads 482 -> 470, 81 -> 81, 259 -> 257, 340 -> 340 —
 * inside the runs' own +-20% spread. kn_dot + kn_axpy at 64 lanes: 24.4 ->
 * 24.9 ns (best of 7, CI machine). The baseline copy runs at 0.4-0.65x.
 *
 * KVFERRY_CPU_ISA=baseline forces the baseline copy on any CPU (to test
 * it, or to rule the AVX2 copy out when diagnosing a node).
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kn_cpu_mm.h"
#include "kn_stage_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#define KN_MM_X86 1
#include <immintrin.h>
#else
#define KN_MM_X86 0
#endif

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));
typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

static inline void store(const struct kn_mm *mm, int32_t j, int32_t o, int32_t i, float v, const float *bias)
{
	float *y = mm->y + (size_t)j * (size_t)mm->ldy + o + i;
	if (bias)
		v += bias[i];
	*y = mm->accumulate ? *y + v : v;
}

#define KN_MM_ISA baseline
#define KN_MM_FMA 0
#include "kn_cpu_mm_body.h"
#undef KN_MM_FMA
#undef KN_MM_ISA

#if KN_MM_X86
/* clang (the fuzz build) spells the target region its own way. */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#define KN_MM_ISA avx2
#define KN_MM_FMA 1
#include "kn_cpu_mm_body.h"
#undef KN_MM_FMA
#undef KN_MM_ISA
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

/* One copy of the kernels. */
struct kn_mm_isa {
	const char *name;
	void (*row_to_f32)(const void *src, enum kn_dtype dt, int32_t k, float *dst);
	float (*dot)(const float *a, const float *b, int32_t kp);
	void (*axpy)(float a, const float *x, float *y, int32_t kp);
	void (*mm_rows)(const struct kn_mm *mm, int32_t o0, int32_t o1, float *wbuf);
};

static const struct kn_mm_isa isa_baseline = { "baseline", row_to_f32_baseline, dot_baseline, axpy_baseline,
					       mm_rows_baseline };
#if KN_MM_X86
static const struct kn_mm_isa isa_avx2 = { "avx2", row_to_f32_avx2, dot_avx2, axpy_avx2, mm_rows_avx2 };
#endif

/* The chosen copy. Written once per process by the first caller; a race
 * between two first callers stores the same pointer to static const data,
 * so relaxed order suffices. */
static _Atomic(const struct kn_mm_isa *) g_isa;

static const struct kn_mm_isa *isa_pick(void)
{
	const struct kn_mm_isa *p = &isa_baseline;
#if KN_MM_X86
	__builtin_cpu_init();
	const char *want = getenv("KVFERRY_CPU_ISA");
	int can = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#if !defined(__clang__)
	/* clang 14 has no "f16c" string here; no AVX2+FMA CPU lacks F16C. */
	can = can && __builtin_cpu_supports("f16c");
#endif
	if (can && !(want && !strcmp(want, "baseline")))
		p = &isa_avx2;
#endif
	atomic_store_explicit(&g_isa, p, memory_order_relaxed);
	return p;
}

static inline const struct kn_mm_isa *isa(void)
{
	const struct kn_mm_isa *p = atomic_load_explicit(&g_isa, memory_order_relaxed);
	return p ? p : isa_pick();
}

const char *kn_cpu_isa(void)
{
	return isa()->name;
}

void kn_row_to_f32(const void *src, enum kn_dtype dt, int32_t k, float *dst)
{
	isa()->row_to_f32(src, dt, k, dst);
}

float kn_dot(const float *a, const float *b, int32_t kp)
{
	return isa()->dot(a, b, kp);
}

void kn_axpy(float a, const float *x, float *y, int32_t kp)
{
	isa()->axpy(a, x, y, kp);
}

void kn_mm_rows(const struct kn_mm *mm, int32_t o0, int32_t o1, float *wbuf)
{
	isa()->mm_rows(mm, o0, o1, wbuf);
}
