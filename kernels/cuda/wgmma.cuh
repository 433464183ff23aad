/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hopper warpgroup MMA wrappers (sm_90a), written by wgmma_gen.py: do not
 * edit by hand. wg_mma<N>(d, a, b, acc): D[64][N] (+)= A[64][16] B[16][N] in
 * f32 from bf16 operands that both lie K-major in shared memory, described by
 * the 64-bit descriptors a and b; acc = 0 overwrites D. Thread t of the
 * warpgroup holds d[i] = D[16 (t / 32) + (t % 32) / 4 + 8 ((i / 2) % 2)]
 *                         [8 (i / 4) + 2 (t % 4) + i % 2].
 */
#ifndef KN_CU_WGMMA_CUH
#define KN_CU_WGMMA_CUH
#include <stdint.h>

template <int N> struct wg_mma_n;

template <> struct wg_mma_n<8> {
	static __device__ __forceinline__ void run(float *d, uint64_t a, uint64_t b, int acc)
	{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
		asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
			     "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
			     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
			     : "l"(a), "l"(b), "r"(acc));
#else
		(void)d, (void)a, (void)b, (void)acc;
#endif
	}
};

template <> struct wg_mma_n<16> {
	static __device__ __forceinline__ void run(float *d, uint64_t a, uint64_t b, int acc)
	{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
		asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
			     "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
			     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
			     : "l"(a), "l"(b), "r"(acc));
#else
		(void)d, (void)a, (void)b, (void)acc;
#endif
	}
};

template <> struct wg_mma_n<32> {
	static __device__ __forceinline__ void run(float *d, uint64_t a, uint64_t b, int acc)
	{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
		asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
			     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
			     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
			     : "l"(a), "l"(b), "r"(acc));
#else
		(void)d, (void)a, (void)b, (void)acc;
#endif
	}
};

template <> struct wg_mma_n<64> {
	static __device__ __forceinline__ void run(float *d, uint64_t a, uint64_t b, int acc)
	{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
		asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
			     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
			     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
			     : "l"(a), "l"(b), "r"(acc));
#else
		(void)d, (void)a, (void)b, (void)acc;
#endif
	}
};

template <> struct wg_mma_n<128> {
	static __device__ __forceinline__ void run(float *d, uint64_t a, uint64_t b, int acc)
	{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
		asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
			     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
			     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
			     : "l"(a), "l"(b), "r"(acc));
#else
		(void)d, (void)a, (void)b, (void)acc;
#endif
	}
};

template <> struct wg_mma_n<192> {
	static __device__ __forceinline__ void run(float *d, uint64_t a, uint64_t b, int acc)
	{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
		asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
			     "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p, 1, 1, 0, 0;\n}\n"
			     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
			     : "l"(a), "l"(b), "r"(acc));
#else
		(void)d, (void)a, (void)b, (void)acc;
#endif
	}
};

#endif /* KN_CU_WGMMA_CUH */
