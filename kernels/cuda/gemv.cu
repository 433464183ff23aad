/* SPDX-License-Identifier: Apache-2.0 */
#include "gemv.cuh"

#include <stdlib.h>
#include <string.h>

/* ---- tensor-core kernel (the default) ---- */

#define MMA_WARPS 8
#define MMA_ROWS 16 /* one m16n8k16 tile of W rows per block */
#define MMA_U 4     /* 32-wide k chunks per warp in flight: 4 x 2 x 16 B per lane */

/* D += A B for one m16n8k16 bf16 tile, f32 accumulate. */
static __device__ __forceinline__ void mma_bf16(float *d, uint32_t a0, uint32_t a1, uint32_t a2,
						uint32_t a3, uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Split two f32 into bf16 hi (round to nearest) and the bf16 of the
 * remainder: hi + lo carries ~16 significant bits, so X W^T computed as
 * W hi + W lo on bf16 tensor cores is within ~1e-5 of the f32 product. */
static __device__ __forceinline__ void split2(float a, float b, uint32_t &hi, uint32_t &lo)
{
	const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
	const float2 hf = __bfloat1622float2(h);
	const __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
	hi = *reinterpret_cast<const uint32_t *>(&h);
	lo = *reinterpret_cast<const uint32_t *>(&l);
}

/*
 * grid (ceil(out / (16 MT))), block 256 (8 warps). Lane (g = lane / 4, t = lane % 4)
 * loads 8 consecutive k of W rows g and g+8 of each of the MT m16 tiles (16 B each) and the same 8 k of
 * X column g (+8 per n-tile). The k order inside an mma is free as long as A
 * and B agree, so those 8 k feed two m16n8k16 steps: elements 0-3 as the
 * fragment's k {2t, 2t+1, 2t+8, 2t+9}, elements 4-7 as the next step's.
 * Warp w sweeps 32-k chunks (U at a time, contiguous per warp); the 8 warps
 * are summed in order through shared memory. Every sum's order depends on
 * `in` alone and a column's products never meet another column's, so a
 * column's bits are the same at every n <= 16.
 */
template <int NT, int MT>
static __global__ void __launch_bounds__(MMA_WARPS * 32)
gemv_mma_kernel(const kn_bf16 *__restrict__ w, const float *x, float *__restrict__ y,
		int n, int in, int out)
{
	constexpr int ROWS = MMA_ROWS * MT;
	__shared__ float red[MMA_WARPS][ROWS][8 * NT + 1];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
	const int row0 = blockIdx.x * ROWS;
	const kn_bf16 *w0[MT], *w1[MT];
#pragma unroll
	for (int m = 0; m < MT; m++) {
		w0[m] = w + (size_t)min(row0 + m * MMA_ROWS + g, out - 1) * in;
		w1[m] = w + (size_t)min(row0 + m * MMA_ROWS + g + 8, out - 1) * in;
	}
	const float *xc[NT];
	bool xon[NT];
#pragma unroll
	for (int j = 0; j < NT; j++) {
		xon[j] = j * 8 + g < n;
		xc[j] = x + (size_t)(xon[j] ? j * 8 + g : 0) * in;
	}
	float acc[MT][NT][4];
#pragma unroll
	for (int m = 0; m < MT; m++)
#pragma unroll
		for (int j = 0; j < NT; j++)
			acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.f;
	bool waited = false;

	for (int kb = warp * MMA_U * 32; kb < in; kb += MMA_WARPS * MMA_U * 32) {
		uint4 wa[MMA_U][MT], wb[MMA_U][MT];
#pragma unroll
		for (int u = 0; u < MMA_U; u++) {
			const int k = kb + u * 32 + t * 8;
			const bool ok = k < in;
#pragma unroll
			for (int m = 0; m < MT; m++) {
				wa[u][m] = ok ? kn_ld_stream(w0[m] + k) : make_uint4(0, 0, 0, 0);
				wb[u][m] = ok ? kn_ld_stream(w1[m] + k) : make_uint4(0, 0, 0, 0);
			}
		}
		/* The weights never change: the first chunk's loads are issued
		 * before waiting for the kernel that writes X. */
		if (!waited) {
			kn_pdl_wait();
			kn_pdl_trigger();
			waited = true;
		}
		float4 xv[MMA_U][NT][2];
#pragma unroll
		for (int u = 0; u < MMA_U; u++) {
			const int k = kb + u * 32 + t * 8;
#pragma unroll
			for (int j = 0; j < NT; j++) {
				if (xon[j] && k < in) {
					xv[u][j][0] = kn_ld_f4(xc[j] + k);
					xv[u][j][1] = kn_ld_f4(xc[j] + k + 4);
				} else {
					xv[u][j][0] = xv[u][j][1] = make_float4(0.f, 0.f, 0.f, 0.f);
				}
			}
		}
#pragma unroll
		for (int u = 0; u < MMA_U; u++) {
#pragma unroll
			for (int j = 0; j < NT; j++) {
				uint32_t h0, l0, h1, l1, h2, l2, h3, l3;
				split2(xv[u][j][0].x, xv[u][j][0].y, h0, l0);
				split2(xv[u][j][0].z, xv[u][j][0].w, h1, l1);
				split2(xv[u][j][1].x, xv[u][j][1].y, h2, l2);
				split2(xv[u][j][1].z, xv[u][j][1].w, h3, l3);
#pragma unroll
				for (int m = 0; m < MT; m++) {
					const uint4 A = wa[u][m], B = wb[u][m];
					mma_bf16(acc[m][j], A.x, B.x, A.y, B.y, h0, h1);
					mma_bf16(acc[m][j], A.x, B.x, A.y, B.y, l0, l1);
					mma_bf16(acc[m][j], A.z, B.z, A.w, B.w, h2, h3);
					mma_bf16(acc[m][j], A.z, B.z, A.w, B.w, l2, l3);
				}
			}
		}
	}
	if (!waited) {
		kn_pdl_wait();
		kn_pdl_trigger();
	}
	/* C fragment: acc[j][0..1] = rows g, cols j*8 + 2t, +1; [2..3] = row g+8. */
#pragma unroll
	for (int m = 0; m < MT; m++)
#pragma unroll
		for (int j = 0; j < NT; j++) {
			const int r = m * MMA_ROWS + g;
			red[warp][r][j * 8 + 2 * t] = acc[m][j][0];
			red[warp][r][j * 8 + 2 * t + 1] = acc[m][j][1];
			red[warp][r + 8][j * 8 + 2 * t] = acc[m][j][2];
			red[warp][r + 8][j * 8 + 2 * t + 1] = acc[m][j][3];
		}
	__syncthreads();
	for (int e = threadIdx.x; e < ROWS * 8 * NT; e += MMA_WARPS * 32) {
		const int r = e % ROWS, c = e / ROWS;
		if (c >= n || row0 + r >= out)
			continue;
		float v = 0.f;
#pragma unroll
		for (int k = 0; k < MMA_WARPS; k++)
			v += red[k][r][c];
		y[(size_t)c * out + row0 + r] = v;
	}
}

/* ---- any width with the tensor-core kernel's bits (kn_cuda_gemm_mma) ---- */

#define DET_BM 128             /* W rows per block */
#define DET_BN 128             /* X columns per block */
#define DET_BK 64              /* k per stage: half a warp chunk of gemv_mma_kernel (MMA_U x 32) */
#define DET_STR (DET_BK + 32)  /* bf16 per row in shared memory: 192 B, no bank conflicts */
#define DET_STAGES 3
#define DET_STAGE ((DET_BM + 2 * DET_BN) * DET_STR * 2) /* bytes: W, X hi, X lo */

static __device__ __forceinline__ void cp16(void *smem, const void *g, bool ok)
{
	const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(g), "r"(ok ? 16 : 0)
		     : "memory");
}

/* The k of gemv_mma_kernel in the order one output element sums them
 * there: warp w's chunks of 128 (w*128, then every 1024 on) into its own
 * accumulator, the 8 accumulators then added in warp order. Half-chunk
 * @p i of that sequence starts at *k0 and is warp *w's; @return false
 * past the end. With @p slice >= 0, warp @p slice's half-chunks only. */
static __device__ __forceinline__ bool det_sub(int i, int in, int *k0, int *w, int slice)
{
	int c = i >> 1;

	if (slice >= 0) { /* one warp's sequence only (kn_cuda_gemm_mma_split's parts) */
		const int first = slice * MMA_U * 32 + c * MMA_WARPS * MMA_U * 32;

		*k0 = first + (i & 1) * DET_BK;
		*w = slice;
		return first < in;
	}

	for (int ww = 0; ww < MMA_WARPS; ww++) {
		const int first = ww * MMA_U * 32, step = MMA_WARPS * MMA_U * 32;
		const int n = first < in ? (in - first + step - 1) / step : 0;

		if (c < n) {
			*k0 = first + c * step + (i & 1) * DET_BK;
			*w = ww;
			return true;
		}
		c -= n;
	}
	return false;
}

/* One stage: W rows [row0, +128) and X hi, lo columns [col0, +128), k [k0, +64), zero past the ends. */
static __device__ __forceinline__ void det_load(kn_bf16 *st, const kn_bf16 *w, const kn_bf16 *xh, const kn_bf16 *xl,
						int row0, int col0, int k0, int n, int in, int out)
{
	kn_bf16 *hs = st + DET_BM * DET_STR, *ls = hs + DET_BN * DET_STR;

	for (int e = threadIdx.x; e < DET_BM * DET_BK / 8; e += blockDim.x) {
		const int r = e / (DET_BK / 8), k = (e % (DET_BK / 8)) * 8;
		const bool ok = row0 + r < out && k0 + k < in;

		cp16(st + r * DET_STR + k, w + (ok ? (size_t)(row0 + r) * in + k0 + k : 0), ok);
	}
	for (int e = threadIdx.x; e < DET_BN * DET_BK / 8; e += blockDim.x) {
		const int c = e / (DET_BK / 8), k = (e % (DET_BK / 8)) * 8;
		const bool ok = col0 + c < n && k0 + k < in;
		const size_t at = ok ? (size_t)(col0 + c) * in + k0 + k : 0;

		cp16(hs + c * DET_STR + k, xh + at, ok);
		cp16(ls + c * DET_STR + k, xl + at, ok);
	}
}

/*
 * grid (ceil(out / 128), ceil(n / 128)), block 256 (8 warps of 64 rows x 32
 * columns), three stages of shared memory, X split into bf16 hi and lo
 * beforehand (the same rounding as split2()). Every output element gets the
 * very operations gemv_mma_kernel gives it, in its order: the same 16-k
 * fragments (lane (g, t) holding k 8t..8t+7 of a 32-k step), the same hi
 * then lo mma pairs, one accumulator per warp-chunk sequence of that
 * kernel (det_sub) and their sum from 0 in warp order. So a column's bits
 * equal those of the narrow plans' tensor-core kernel at any width: a
 * plan's numerics no longer depend on its width.
 */
static __global__ void __launch_bounds__(256, 1)
gemm_mma_kernel(const kn_bf16 *__restrict__ w, const kn_bf16 *xh, const kn_bf16 *xl, float *__restrict__ y, int n,
		int in, int out, float *__restrict__ part)
{
	extern __shared__ __align__(16) kn_bf16 det_smem[];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
	const int wm = (warp & 1) * 64, wn = (warp >> 1) * 32;
	const int row0 = blockIdx.x * DET_BM, col0 = blockIdx.y * DET_BN, slice = part ? (int)blockIdx.z : -1;
	constexpr int SE = DET_STAGE / 2; /* elements per stage */
	float acc[4][4][4], v[4][4][4];
	int k0, cw, done_w = 0;

	kn_pdl_wait();
	kn_pdl_trigger();
#pragma unroll
	for (int m = 0; m < 4; m++)
#pragma unroll
		for (int j = 0; j < 4; j++)
#pragma unroll
			for (int q = 0; q < 4; q++)
				acc[m][j][q] = v[m][j][q] = 0.f;
	/* the first two stages in flight (an empty group where there is none) */
	for (int p = 0; p < DET_STAGES - 1; p++) {
		int pk, pw;
		if (det_sub(p, in, &pk, &pw, slice))
			det_load(det_smem + p * SE, w, xh, xl, row0, col0, pk, n, in, out);
		asm volatile("cp.async.commit_group;" ::: "memory");
	}
	for (int i = 0; det_sub(i, in, &k0, &cw, slice); i++) {
		int pk, pw, nk, nw;
		if (det_sub(i + DET_STAGES - 1, in, &pk, &pw, slice))
			det_load(det_smem + ((i + DET_STAGES - 1) % DET_STAGES) * SE, w, xh, xl, row0, col0, pk, n, in,
				 out);
		asm volatile("cp.async.commit_group;" ::: "memory");
		asm volatile("cp.async.wait_group %0;" ::"n"(DET_STAGES - 1) : "memory");
		__syncthreads();
		const kn_bf16 *ws = det_smem + (i % DET_STAGES) * SE, *hs = ws + DET_BM * DET_STR,
			      *ls = hs + DET_BN * DET_STR;
#pragma unroll
		for (int u = 0; u < DET_BK / 32; u++) {
			const int k = u * 32 + t * 8;
			uint4 A[4], B[4];
#pragma unroll
			for (int m = 0; m < 4; m++) {
				A[m] = *(const uint4 *)(ws + (wm + m * 16 + g) * DET_STR + k);
				B[m] = *(const uint4 *)(ws + (wm + m * 16 + g + 8) * DET_STR + k);
			}
#pragma unroll
			for (int j = 0; j < 4; j++) {
				const uint4 H = *(const uint4 *)(hs + (wn + j * 8 + g) * DET_STR + k);
				const uint4 L = *(const uint4 *)(ls + (wn + j * 8 + g) * DET_STR + k);
#pragma unroll
				for (int m = 0; m < 4; m++) {
					mma_bf16(acc[m][j], A[m].x, B[m].x, A[m].y, B[m].y, H.x, H.y);
					mma_bf16(acc[m][j], A[m].x, B[m].x, A[m].y, B[m].y, L.x, L.y);
					mma_bf16(acc[m][j], A[m].z, B[m].z, A[m].w, B[m].w, H.z, H.w);
					mma_bf16(acc[m][j], A[m].z, B[m].z, A[m].w, B[m].w, L.z, L.w);
				}
			}
		}
		/* the last half-chunk of warp cw's sequence: its sum joins the
		 * total, and so does every empty sequence before the next one */
		const bool more = det_sub(i + 1, in, &nk, &nw, slice);
		if (slice < 0 && (!more || nw != cw)) {
			for (const int upto = more ? nw : MMA_WARPS; done_w < upto; done_w++)
#pragma unroll
				for (int m = 0; m < 4; m++)
#pragma unroll
					for (int j = 0; j < 4; j++)
#pragma unroll
						for (int q = 0; q < 4; q++) {
							v[m][j][q] += done_w == cw ? acc[m][j][q] : 0.f;
							acc[m][j][q] = done_w == cw ? 0.f : acc[m][j][q];
						}
		}
		__syncthreads(); /* this stage is refilled two half-chunks on */
	}
	asm volatile("cp.async.wait_group 0;" ::: "memory");
	if (slice >= 0) { /* this warp sequence's sum, for det_sum_kernel */
		y = part + (size_t)slice * n * out;
#pragma unroll
		for (int m = 0; m < 4; m++)
#pragma unroll
			for (int j = 0; j < 4; j++)
#pragma unroll
				for (int q = 0; q < 4; q++)
					v[m][j][q] = acc[m][j][q];
	}
	/* C fragment: [0..1] row g, columns 2t, 2t+1; [2..3] row g+8 */
#pragma unroll
	for (int m = 0; m < 4; m++)
#pragma unroll
		for (int j = 0; j < 4; j++)
#pragma unroll
			for (int q = 0; q < 4; q++) {
				const int r = row0 + wm + m * 16 + g + (q >> 1) * 8, c = col0 + wn + j * 8 + 2 * t + (q & 1);
				if (r < out && c < n)
					y[(size_t)c * out + r] = v[m][j][q];
			}
}

static bool det_sized;
static int det_sms;

/* The kernel's shared memory and the device's SM count, once (before any
 * graph capture, from kn_cuda_gemm_mma_parts()). */
static cudaError_t det_prepare(void)
{
	if (det_sized)
		return cudaSuccess;
	cudaError_t e = cudaFuncSetAttribute(gemm_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
					     DET_STAGES * DET_STAGE);
	if (e == cudaSuccess && cudaDeviceGetAttribute(&det_sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess)
		det_sms = 0;
	det_sized = e == cudaSuccess;
	return e;
}

size_t kn_cuda_gemm_mma_parts(void)
{
	return det_prepare() == cudaSuccess ? (size_t)MMA_WARPS * det_sms * DET_BM * DET_BN : 0;
}

/* y = the 8 warp sequences' sums added from 0 in warp order, as gemv_mma_kernel adds them. */
static __global__ void __launch_bounds__(256) det_sum_kernel(const float *part, float *__restrict__ y, size_t count)
{
	kn_pdl_wait();
	kn_pdl_trigger();
	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < count; e += (size_t)gridDim.x * blockDim.x) {
		float v = 0.f;
#pragma unroll
		for (int k = 0; k < MMA_WARPS; k++)
			v += part[(size_t)k * count + e];
		y[e] = v;
	}
}

cudaError_t kn_cuda_gemm_mma_split(const kn_bf16 *w, const kn_bf16 *xh, const kn_bf16 *xl, float *y, int n, int in,
				   int out, float *part, size_t part_floats, cudaStream_t st)
{
	const dim3 grid((out + DET_BM - 1) / DET_BM, (n + DET_BN - 1) / DET_BN);
	cudaError_t pe;

	if (n < 1 || in % 8 || in < 8 || out < 1)
		return cudaErrorInvalidValue;
	if ((pe = det_prepare()) != cudaSuccess)
		return pe;
	/* fewer blocks than SMs: each warp sequence in blocks of its own, then their sum */
	if (part != NULL && (int)(grid.x * grid.y) < det_sms && part_floats >= (size_t)MMA_WARPS * n * out) {
		const size_t count = (size_t)n * out;
		cudaError_t e = kn_launch(gemm_mma_kernel, dim3(grid.x, grid.y, MMA_WARPS), dim3(256),
					  (size_t)DET_STAGES * DET_STAGE, st, w, xh, xl, y, n, in, out, part);
		const int blocks = (int)((count + 255) / 256 < 2048 ? (count + 255) / 256 : 2048);

		return e != cudaSuccess ? e : kn_launch(det_sum_kernel, dim3(blocks), dim3(256), 0, st,
							(const float *)part, y, count);
	}
	return kn_launch(gemm_mma_kernel, grid, dim3(256), (size_t)DET_STAGES * DET_STAGE, st, w, xh, xl, y, n, in, out,
			 (float *)NULL);
}

/* ---- CUDA-core kernel (KVFERRY_CUDA_GEMV=ffma; the first version) ---- */

#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)
#define GEMV_R 4 /* rows per block: each X load serves 4 rows (8 at in <= 2,048) */

/*
 * grid (ceil(out / R)), block 256. The block sweeps `in` for R rows; U chunk
 * loads per row are issued before their use so 16*R*U bytes per thread are in
 * flight (R=4, U=2: 128 B/thread, ~32 KB per block).
 */
template <int NC, int U, int R>
static __global__ void __launch_bounds__(GEMV_THREADS, 2)
gemv_ffma_kernel(const kn_bf16 *__restrict__ w, const float *x, float *__restrict__ y,
		 int n, int in, int out)
{
	__shared__ float red[GEMV_WARPS][R][NC];
	const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
	const int row0 = blockIdx.x * R;
	const kn_bf16 *wr[R];
#pragma unroll
	for (int r = 0; r < R; r++)
		wr[r] = w + (size_t)min(row0 + r, out - 1) * in;
	float acc[R][NC];
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int c = 0; c < NC; c++)
			acc[r][c] = 0.f;
	bool waited = false;

	for (int k0 = t * 8; k0 < in; k0 += GEMV_THREADS * 8 * U) {
		uint4 wv[U][R];
#pragma unroll
		for (int u = 0; u < U; u++) {
			const int k = k0 + u * GEMV_THREADS * 8;
#pragma unroll
			for (int r = 0; r < R; r++)
				wv[u][r] = k < in ? kn_ld_stream(wr[r] + k) : make_uint4(0, 0, 0, 0);
		}
		/* first weight loads in flight before waiting for X's producer */
		if (!waited) {
			kn_pdl_wait();
			kn_pdl_trigger();
			waited = true;
		}
#pragma unroll
		for (int u = 0; u < U; u++) {
			const int k = k0 + u * GEMV_THREADS * 8;
			if (k >= in)
				break;
#pragma unroll
			for (int c = 0; c < NC; c++) {
				if (c >= n)
					break;
				const float *xp = x + (size_t)c * in + k;
				const float4 xa = kn_ld_f4(xp), xb = kn_ld_f4(xp + 4);
				const float xf[8] = { xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w };
#pragma unroll
				for (int r = 0; r < R; r++) {
					float wf[8];
					kn_bf16x8_to_f32(wv[u][r], wf);
					float a = acc[r][c];
#pragma unroll
					for (int i = 0; i < 8; i++)
						a = fmaf(wf[i], xf[i], a);
					acc[r][c] = a;
				}
			}
		}
	}
	if (!waited) {
		kn_pdl_wait();
		kn_pdl_trigger();
	}
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int c = 0; c < NC; c++) {
			const float v = kn_warp_sum(acc[r][c]);
			if (lane == 0)
				red[warp][r][c] = v;
		}
	__syncthreads();
	for (int e = t; e < R * NC; e += GEMV_THREADS) {
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

template <int NC, int U, int R = GEMV_R>
static cudaError_t launch_ffma(const kn_bf16 *w, const float *x, float *y, int n, int in, int out,
			       cudaStream_t st)
{
	return kn_launch(gemv_ffma_kernel<NC, U, R>, dim3((out + R - 1) / R), dim3(GEMV_THREADS), 0,
			 st, w, x, y, n, in, out);
}

cudaError_t kn_cuda_gemv_ffma(const kn_bf16 *w, const float *x, float *y, int n, int in, int out,
			      cudaStream_t st)
{
	if (n < 1 || n > KN_CU_GEMV_MAX_N || in % 8 || out < 1)
		return cudaErrorInvalidValue;
	/* in <= 2,048 (the 1B shape): one 16-byte chunk per row per thread, so
	 * 8 rows a block keep 8 loads in flight per thread, as 4 rows at in =
	 * 4,096 do (8B gate/up: 3.9 TB/s; 1B at 4 rows: 2.6). Same sum order. */
	if (n <= 1)
		return in <= GEMV_THREADS * 8 ? launch_ffma<1, 1, 8>(w, x, y, n, in, out, st)
					      : launch_ffma<1, 4>(w, x, y, n, in, out, st);
	if (n <= 2)
		return launch_ffma<2, 4>(w, x, y, n, in, out, st);
	if (n <= 4)
		return launch_ffma<4, 2>(w, x, y, n, in, out, st);
	if (n <= 8)
		return launch_ffma<8, 2>(w, x, y, n, in, out, st);
	return launch_ffma<16, 1>(w, x, y, n, in, out, st);
}

cudaError_t kn_cuda_gemv_mma(const kn_bf16 *w, const float *x, float *y, int n, int in, int out,
			     cudaStream_t st)
{
	if (n < 1 || n > KN_CU_GEMV_MAX_N || in % 8 || out < 1)
		return cudaErrorInvalidValue;
	/* Above 4 columns a block takes 32 rows (two m16 tiles sharing each X
	 * fragment): every block reads all of X (n * in * 4 bytes), at n = 16
	 * twice the bytes of its 16 weight rows. Same sums, same bits. */
	const int blocks16 = (out + MMA_ROWS - 1) / MMA_ROWS, blocks32 = (out + 2 * MMA_ROWS - 1) / (2 * MMA_ROWS);
	if (n <= 4)
		return kn_launch(gemv_mma_kernel<1, 1>, dim3(blocks16), dim3(MMA_WARPS * 32), 0, st, w, x, y, n,
				 in, out);
	if (n <= 8)
		return kn_launch(gemv_mma_kernel<1, 2>, dim3(blocks32), dim3(MMA_WARPS * 32), 0, st, w, x, y, n,
				 in, out);
	return kn_launch(gemv_mma_kernel<2, 2>, dim3(blocks32), dim3(MMA_WARPS * 32), 0, st, w, x, y, n, in,
			 out);
}

static thread_local int pdl_suspended;

void kn_cuda_pdl_suspend(int off)
{
	pdl_suspended = off;
}

int kn_cuda_pdl(void)
{
	static int on = -1;
	if (on < 0) {
		const char *e = getenv("KVFERRY_CUDA_PDL");
		on = !(e && !strcmp(e, "0"));
	}
	return on && !pdl_suspended;
}

int kn_cuda_gemv_kind(int n)
{
	static int forced = -2;
	if (forced == -2) {
		const char *e = getenv("KVFERRY_CUDA_GEMV");
		forced = !e ? -1 : !strcmp(e, "ffma") ? KN_CU_GEMV_FFMA : !strcmp(e, "mma") ? KN_CU_GEMV_MMA : -1;
	}
	if (forced >= 0)
		return forced;
	/* Measured on the H200 (decode step, ctx 512): at n = 1 the FFMA kernel
	 * reaches 74% (8B) / 47% (1B) of the roofline against the mma kernel's
	 * 50% / 40%; at n = 8 the mma kernel takes 7.1 ms against 9.6 (8B) and
	 * at n = 16 7.8 ms against 19.0. */
	return n == 1 ? KN_CU_GEMV_FFMA : KN_CU_GEMV_MMA;
}

cudaError_t kn_cuda_gemv(const kn_bf16 *w, const float *x, float *y, int n, int in, int out,
			 cudaStream_t st)
{
	return kn_cuda_gemv_kind(n) == KN_CU_GEMV_FFMA ? kn_cuda_gemv_ffma(w, x, y, n, in, out, st)
						       : kn_cuda_gemv_mma(w, x, y, n, in, out, st);
}
