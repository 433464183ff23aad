/* SPDX-License-Identifier: Apache-2.0 */
#include "gemv.cuh"

#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)
#define GEMV_R 4 /* rows per block: each X load serves 4 rows */

/*
 * grid (ceil(out / R)), block 256. The block sweeps `in` for R rows; U chunk
 * loads per row are issued before their use so 16*R*U bytes per thread are in
 * flight (R=4, U=2: 128 B/thread, ~32 KB per block).
 */
template <int NC, int U>
static __global__ void __launch_bounds__(GEMV_THREADS)
gemv_kernel(const kn_bf16 *__restrict__ w, const kn_bf16 *__restrict__ x, float *__restrict__ y,
	    int n, int in, int out)
{
	__shared__ float red[GEMV_WARPS][GEMV_R][NC];
	const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
	const int row0 = blockIdx.x * GEMV_R;
	const kn_bf16 *wr[GEMV_R];
#pragma unroll
	for (int r = 0; r < GEMV_R; r++)
		wr[r] = w + (size_t)min(row0 + r, out - 1) * in;
	float acc[GEMV_R][NC];
#pragma unroll
	for (int r = 0; r < GEMV_R; r++)
#pragma unroll
		for (int c = 0; c < NC; c++)
			acc[r][c] = 0.f;

	for (int k0 = t * 8; k0 < in; k0 += GEMV_THREADS * 8 * U) {
		uint4 wv[U][GEMV_R];
#pragma unroll
		for (int u = 0; u < U; u++) {
			const int k = k0 + u * GEMV_THREADS * 8;
#pragma unroll
			for (int r = 0; r < GEMV_R; r++)
				wv[u][r] = k < in ? kn_ld_stream(wr[r] + k) : make_uint4(0, 0, 0, 0);
		}
#pragma unroll
		for (int u = 0; u < U; u++) {
			const int k = k0 + u * GEMV_THREADS * 8;
			if (k >= in)
				break;
			float wf[GEMV_R][8];
#pragma unroll
			for (int r = 0; r < GEMV_R; r++)
				kn_bf16x8_to_f32(wv[u][r], wf[r]);
#pragma unroll
			for (int c = 0; c < NC; c++) {
				if (c >= n)
					break;
				float xf[8];
				kn_bf16x8_to_f32(__ldg(reinterpret_cast<const uint4 *>(x + (size_t)c * in + k)), xf);
#pragma unroll
				for (int r = 0; r < GEMV_R; r++) {
					float a = acc[r][c];
#pragma unroll
					for (int i = 0; i < 8; i++)
						a = fmaf(wf[r][i], xf[i], a);
					acc[r][c] = a;
				}
			}
		}
	}
#pragma unroll
	for (int r = 0; r < GEMV_R; r++)
#pragma unroll
		for (int c = 0; c < NC; c++) {
			const float v = kn_warp_sum(acc[r][c]);
			if (lane == 0)
				red[warp][r][c] = v;
		}
	__syncthreads();
	for (int e = t; e < GEMV_R * NC; e += GEMV_THREADS) {
		const int r = e / NC, c = e % NC;
		if (c >= n || row0 + r >= out)
			continue;
		float v = 0.f;
#pragma unroll
		for (int j = 0; j < GEMV_WARPS; j++)
			v += red[j][r][c];
		y[(size_t)c * out + row0 + r] = v;
	}
}

template <int NC, int U>
static cudaError_t launch(const kn_bf16 *w, const kn_bf16 *x, float *y, int n, int in, int out,
			  cudaStream_t st)
{
	gemv_kernel<NC, U><<<(out + GEMV_R - 1) / GEMV_R, GEMV_THREADS, 0, st>>>(w, x, y, n, in, out);
	return cudaGetLastError();
}

cudaError_t kn_cuda_gemv(const kn_bf16 *w, const kn_bf16 *x, float *y, int n, int in, int out,
			 cudaStream_t st)
{
	if (n < 1 || n > KN_CU_GEMV_MAX_N || in % 8 || out < 1)
		return cudaErrorInvalidValue;
	if (n <= 1)
		return launch<1, 4>(w, x, y, n, in, out, st);
	if (n <= 2)
		return launch<2, 4>(w, x, y, n, in, out, st);
	if (n <= 4)
		return launch<4, 2>(w, x, y, n, in, out, st);
	if (n <= 8)
		return launch<8, 2>(w, x, y, n, in, out, st);
	return launch<16, 1>(w, x, y, n, in, out, st);
}
