/* SPDX-License-Identifier: Apache-2.0 */
#include "gemm.cuh"

#include <stdio.h>

#include "gemv.cuh"

int kn_cuda_linear(cublasHandle_t blas, const kn_bf16 *w, const kn_bf16 *x, float *y, int n,
		   int in, int out, cudaStream_t st, char *err, size_t errlen)
{
	if (n <= KN_CU_GEMV_MAX_N) {
		cudaError_t e = kn_cuda_gemv(w, x, y, n, in, out, st);
		if (e != cudaSuccess) {
			snprintf(err, errlen, "kn_cuda_gemv(n=%d, in=%d, out=%d): %s", n, in, out,
				 cudaGetErrorString(e));
			return -1;
		}
		return 0;
	}
	/* Column-major view: C[out][n] = op(W)[out][in] * X[in][n], with W seen
	 * as [in][out] (lda = in) transposed and X as [in][n] (ldb = in). */
	const float one = 1.f, zero = 0.f;
	cublasStatus_t s = cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w,
					CUDA_R_16BF, in, x, CUDA_R_16BF, in, &zero, y, CUDA_R_32F, out,
					CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	if (s != CUBLAS_STATUS_SUCCESS) {
		snprintf(err, errlen, "cublasGemmEx(m=%d, n=%d, k=%d, bf16->f32): %s", out, n, in,
			 cublasGetStatusString(s));
		return -1;
	}
	return 0;
}
