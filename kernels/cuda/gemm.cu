/* SPDX-License-Identifier: Apache-2.0 */
#include "gemm.cuh"

#include <stdio.h>

#include "gemv.cuh"

/* grid-stride over [n*in / 4]: hi = bf16(x); lo = bf16(x - hi) when lo != NULL. */
static __global__ void split_kernel(const float4 *x, __nv_bfloat162 *__restrict__ hi,
				    __nv_bfloat162 *__restrict__ lo, size_t n4)
{
	kn_pdl_wait();
	kn_pdl_trigger();
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
	     i += (size_t)gridDim.x * blockDim.x) {
		const float4 v = x[i];
		const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
		hi[2 * i] = a;
		hi[2 * i + 1] = b;
		if (lo) {
			const float2 af = __bfloat1622float2(a), bf = __bfloat1622float2(b);
			lo[2 * i] = __floats2bfloat162_rn(v.x - af.x, v.y - af.y);
			lo[2 * i + 1] = __floats2bfloat162_rn(v.z - bf.x, v.w - bf.y);
		}
	}
}

cudaError_t kn_cuda_round_bf16(const float *x, kn_bf16 *hi, kn_bf16 *lo, size_t count, cudaStream_t st)
{
	const size_t n4 = count / 4;
	const int blocks = (int)((n4 + 255) / 256 < 4096 ? (n4 + 255) / 256 : 4096);

	if (count % 4)
		return cudaErrorInvalidValue;
	return kn_launch(split_kernel, dim3(blocks), dim3(256), 0, st, reinterpret_cast<const float4 *>(x),
			 reinterpret_cast<__nv_bfloat162 *>(hi), reinterpret_cast<__nv_bfloat162 *>(lo), n4);
}

cudaError_t kn_cuda_gemm_mma(const kn_bf16 *w, const float *x, kn_bf16 *xb, float *y, int n, int in, int out,
			     float *part, size_t part_floats, cudaStream_t st)
{
	if (n < 1 || in % 8 || in < 8 || out < 1)
		return cudaErrorInvalidValue;
	cudaError_t e = kn_cuda_round_bf16(x, xb, xb + (size_t)n * in, (size_t)n * in, st);
	return e != cudaSuccess ? e : kn_cuda_gemm_mma_split(w, xb, xb + (size_t)n * in, y, n, in, out, part, part_floats,
										  st);
}

int kn_cuda_linear_bf16(cublasHandle_t blas, const kn_bf16 *w, const kn_bf16 *xb, float *y, int n,
			int in, int out, char *err, size_t errlen)
{
	const float one = 1.f, zero = 0.f;
	cublasStatus_t s = cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w, CUDA_R_16BF,
					in, xb, CUDA_R_16BF, in, &zero, y, CUDA_R_32F, out,
					CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	if (s != CUBLAS_STATUS_SUCCESS) {
		snprintf(err, errlen, "cublasGemmEx(m=%d, n=%d, k=%d, bf16 X->f32): %s", out, n, in,
			 cublasGetStatusString(s));
		return -1;
	}
	return 0;
}

int kn_cuda_linear(cublasHandle_t blas, const kn_bf16 *w, const float *x, kn_bf16 *xb, float *y,
		   int n, int in, int out, int split, int gemv, cudaStream_t st, char *err,
		   size_t errlen)
{
	if (n <= KN_CU_GEMV_MAX_N) {
		const int kind = gemv >= 0 ? gemv : kn_cuda_gemv_kind(n);
		cudaError_t e = kind == KN_CU_GEMV_FFMA ? kn_cuda_gemv_ffma(w, x, y, n, in, out, st)
							: kn_cuda_gemv_mma(w, x, y, n, in, out, st);
		if (e != cudaSuccess) {
			snprintf(err, errlen, "kn_cuda_gemv(n=%d, in=%d, out=%d): %s", n, in, out,
				 cudaGetErrorString(e));
			return -1;
		}
		return 0;
	}
	kn_bf16 *lo = split ? xb + (size_t)n * in : NULL;
	cudaError_t e = kn_cuda_round_bf16(x, xb, lo, (size_t)n * in, st);
	if (e != cudaSuccess) {
		snprintf(err, errlen, "split_kernel(n=%d, in=%d): %s", n, in, cudaGetErrorString(e));
		return -1;
	}
	/* Column-major view: C[out][n] = op(W)[out][in] * X[in][n], with W seen
	 * as [in][out] (lda = in) transposed and X as [in][n] (ldb = in). */
	const float one = 1.f, zero = 0.f;
	for (int part = 0; part < (split ? 2 : 1); part++) {
		cublasStatus_t s = cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w,
						CUDA_R_16BF, in, part ? lo : xb, CUDA_R_16BF, in,
						part ? &one : &zero, y, CUDA_R_32F, out,
						CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
		if (s != CUBLAS_STATUS_SUCCESS) {
			snprintf(err, errlen, "cublasGemmEx(m=%d, n=%d, k=%d, bf16->f32%s): %s", out, n, in,
				 part ? ", remainder" : "", cublasGetStatusString(s));
			return -1;
		}
	}
	return 0;
}
