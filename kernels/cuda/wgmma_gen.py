#!/usr/bin/env python3
# Writes wgmma.cuh: one wrapper per instruction width N the linear-layer
# kernel uses (gemm_wg.cu). Each wgmma form lists its N/2 accumulator
# registers as separate asm operands, which the preprocessor cannot count out.
#   python3 kernels/cuda/wgmma_gen.py > kernels/cuda/wgmma.cuh
WIDTHS = (8, 16, 32, 64, 128, 192, 256)

print("""/* SPDX-License-Identifier: Apache-2.0 */
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
""")
for n in WIDTHS:
    r = n // 2
    regs = ", ".join(f"%{i}" for i in range(r))
    ops = ", ".join(f'"+f"(d[{i}])' for i in range(r))
    print(f"""template <> struct wg_mma_n<{n}> {{
	static __device__ __forceinline__ void run(float *d, uint64_t a, uint64_t b, int acc)
	{{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
		asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{r + 2}, 0;\\n"
			     "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{regs}}}, %{r}, %{r + 1}, p, 1, 1, 0, 0;\\n}}\\n"
			     : {ops}
			     : "l"(a), "l"(b), "r"(acc));
#else
		(void)d, (void)a, (void)b, (void)acc;
#endif
	}}
}};
""")
print("#endif /* KN_CU_WGMMA_CUH */")
