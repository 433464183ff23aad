/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ceilings measured in the same run as the benchmarks that compare with
 * them (BENCHMARKS.md: absolute figures drift +-20% between runs, ratios
 * hold): device copy bandwidth, cuBLAS bf16 GEMM rate, and paged attention
 * alone. Timings are CUDA events around each call after warm-up; the median
 * is reported.
 */
#include <cublas_v2.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"
#include "fill.cuh"
#include "gemm.cuh"
#include "gemm_wg.cuh"
#include "gemv.cuh"
#include "kn_cuda.h"

#define PCK(call)                                                                            \
	do {                                                                                 \
		cudaError_t e_ = (call);                                                     \
		if (e_ != cudaSuccess) {                                                     \
			snprintf(err, errlen, "%s failed: %s", #call, cudaGetErrorString(e_)); \
			rc = -EIO;                                                           \
			goto out;                                                            \
		}                                                                            \
	} while (0)

static int cmp_f(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

static float median(float *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_f);
	return v[n / 2];
}

/* A CUDA call's failure as the probes report it. @return 0 or -EIO. */
static int ck(cudaError_t e, const char *what, char *err, size_t errlen)
{
	if (e == cudaSuccess)
		return 0;
	snprintf(err, errlen, "%s failed: %s", what, cudaGetErrorString(e));
	return -EIO;
}

/* Every probe's timing: @p call (0, or -EIO with @p err filled) 3 times
 * unmeasured, then @p iters times, each between two events on the default
 * stream. @return 0 with the median in *@p ms_median, or -EIO / -ENOMEM. */
template <typename F>
static int median_ms(int iters, double *ms_median, char *err, size_t errlen, F call)
{
	cudaEvent_t e0 = NULL, e1 = NULL;
	float *ms = (float *)calloc((size_t)iters, sizeof(float));
	int rc = 0;

	if (!ms) {
		snprintf(err, errlen, "out of memory for %d timings", iters);
		return -ENOMEM;
	}
	PCK(cudaEventCreate(&e0));
	PCK(cudaEventCreate(&e1));
	for (int i = -3; i < iters; i++) {
		PCK(cudaEventRecord(e0));
		if ((rc = call()) < 0)
			goto out;
		PCK(cudaEventRecord(e1));
		PCK(cudaEventSynchronize(e1));
		if (i >= 0)
			PCK(cudaEventElapsedTime(&ms[i], e0, e1));
	}
	*ms_median = median(ms, iters);
out:
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	free(ms);
	return rc;
}

extern "C" int kn_cuda_probe_copy_bw(int device, size_t bytes, int iters, double *bytes_per_s,
				     char *err, size_t errlen)
{
	void *a = NULL, *b = NULL;
	double med;
	int rc = 0;
	PCK(cudaSetDevice(device));
	PCK(cudaMalloc(&a, bytes));
	PCK(cudaMalloc(&b, bytes));
	PCK(cudaMemset(a, 1, bytes));
	rc = median_ms(iters, &med, err, errlen, [&]() {
		return ck(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync", err, errlen);
	});
	if (rc == 0)
		*bytes_per_s = 2.0 * (double)bytes / (med * 1e-3);
out:
	cudaFree(a);
	cudaFree(b);
	return rc;
}

extern "C" int kn_cuda_probe_gemm(int device, int m, int n, int k, int iters, double *flop_per_s,
				  char *err, size_t errlen)
{
	kn_bf16 *a = NULL, *b = NULL, *c = NULL;
	void *ws = NULL;
	cublasHandle_t h = NULL;
	const float one = 1.f, zero = 0.f;
	double med;
	int rc = 0;
	PCK(cudaSetDevice(device));
	PCK(cudaMalloc((void **)&a, (size_t)m * k * 2));
	PCK(cudaMalloc((void **)&b, (size_t)k * n * 2));
	PCK(cudaMalloc((void **)&c, (size_t)m * n * 2));
	PCK(cudaMalloc(&ws, (size_t)32 << 20));
	PCK(kn_cuda_fill_bf16(a, (size_t)m * k, 1, 1.f, 0));
	PCK(kn_cuda_fill_bf16(b, (size_t)k * n, 2, 1.f, 0));
	if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS ||
	    cublasSetWorkspace(h, ws, (size_t)32 << 20) != CUBLAS_STATUS_SUCCESS) {
		snprintf(err, errlen, "cublasCreate/cublasSetWorkspace failed");
		rc = -EIO;
		goto out;
	}
	rc = median_ms(iters, &med, err, errlen, [&]() {
		cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a, CUDA_R_16BF, k,
						 b, CUDA_R_16BF, k, &zero, c, CUDA_R_16BF, m,
						 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
		if (st == CUBLAS_STATUS_SUCCESS)
			return 0;
		snprintf(err, errlen, "cublasGemmEx(%d, %d, %d): %s", m, n, k, cublasGetStatusString(st));
		return -EIO;
	});
	if (rc == 0)
		*flop_per_s = 2.0 * m * n * (double)k / (med * 1e-3);
out:
	if (h)
		cublasDestroy(h);
	cudaFree(a);
	cudaFree(b);
	cudaFree(c);
	cudaFree(ws);
	return rc;
}

extern "C" int kn_cuda_probe_linear(int device, int n, int in, int out, int kind, int iters, double *sec_per_call,
				    char *err, size_t errlen)
{
	kn_bf16 *w = NULL, *xb = NULL;
	float *x = NULL, *y = NULL, *part = NULL;
	void *ws = NULL;
	cublasHandle_t h = NULL;
	double med;
	size_t wg_part = 0;
	int rc = 0;
	PCK(cudaSetDevice(device));
	PCK(cudaMalloc((void **)&w, (size_t)out * in * 2));
	PCK(cudaMalloc((void **)&x, (size_t)n * in * 4));
	PCK(cudaMalloc((void **)&xb, (size_t)2 * n * in * 2));
	PCK(cudaMalloc((void **)&y, (size_t)n * out * 4));
	wg_part = kn_cuda_gemm_wg_part_floats(n, in, out);
	PCK(cudaMalloc((void **)&part, ((size_t)8 * n * out > wg_part ? (size_t)8 * n * out : wg_part) * 4));
	PCK(cudaMalloc(&ws, (size_t)32 << 20));
	PCK(kn_cuda_fill_bf16(w, (size_t)out * in, 1, 1.f, 0));
	PCK(kn_cuda_fill_f32(x, (size_t)n * in, 2, 0.f, 1.f, 0));
	if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS ||
	    cublasSetWorkspace(h, ws, (size_t)32 << 20) != CUBLAS_STATUS_SUCCESS) {
		snprintf(err, errlen, "cublasCreate/cublasSetWorkspace failed");
		rc = -EIO;
		goto out;
	}
	rc = median_ms(iters, &med, err, errlen, [&]() {
		if (kind == 2)
			return ck(kn_cuda_gemm_mma(w, x, xb, y, n, in, out, part, (size_t)8 * n * out, 0), "kn_cuda_gemm_mma",
				  err, errlen);
		if (kind == 3)
			return ck(kn_cuda_gemm_wg(w, x, xb, y, n, in, out, part, wg_part, 0), "kn_cuda_gemm_wg", err,
				  errlen);
		return kn_cuda_linear(h, w, x, xb, y, n, in, out, kind, -1, 0, err, errlen) ? -EIO : 0;
	});
	if (rc == 0)
		*sec_per_call = med * 1e-3;
out:
	if (h)
		cublasDestroy(h);
	cudaFree(w);
	cudaFree(x);
	cudaFree(xb);
	cudaFree(y);
	cudaFree(part);
	cudaFree(ws);
	return rc;
}

extern "C" int kn_cuda_probe_attention(int device, int n_cols, int ctx, int n_heads,
				       int n_kv_heads, int head_dim, int tile, int back_to_back, int iters,
				       double *bytes_per_s, double *sec_per_call, char *err,
				       size_t errlen)
{
	const int bps = (ctx + KN_PAGE_BLK - 1) / KN_PAGE_BLK;
	const int nb = n_cols * bps;
	const size_t kv_e = (size_t)nb * n_kv_heads * KN_PAGE_BLK * head_dim;
	/* back to back: `sets` copies of the K/V, together past 256 MB (the
	 * H200's L2 is 50 MB), each launch reading the next */
	const size_t set_bytes = kv_e * 2 * 2;
	const int sets = back_to_back ? (int)((((size_t)256 << 20) + set_bytes - 1) / set_bytes) : 1;
	const int launches = back_to_back ? (sets < 8 ? 8 : sets) : 1;
	kn_bf16 *kc = NULL, *vc = NULL;
	float *out = NULL;
	float *q = NULL, *part = NULL;
	unsigned *cnt = NULL;
	int32_t *table = NULL, *h_table = NULL;
	struct kn_column *cols = NULL, *h_cols = NULL;
	struct kn_cu_attn_args a;
	double med;
	int rc = 0;
	memset(&a, 0, sizeof(a));
	h_table = (int32_t *)malloc((size_t)nb * 4);
	h_cols = (struct kn_column *)calloc((size_t)n_cols, sizeof(*h_cols));
	if (!h_table || !h_cols) {
		snprintf(err, errlen, "out of memory for %d blocks", nb);
		rc = -ENOMEM;
		goto out;
	}
	/* Blocks in a scattered order (a stride coprime with nb), as a real
	 * pool is after churn. */
	for (int i = 0; i < nb; i++)
		h_table[i] = (int32_t)(((long long)i * 7919) % nb);
	if (nb % 7919 == 0)
		for (int i = 0; i < nb; i++)
			h_table[i] = i;
	for (int c = 0; c < n_cols; c++) {
		h_cols[c].slot = c;
		h_cols[c].pos = ctx - 1;
		h_cols[c].flags = KN_COL_NEED_LOGIT;
	}
	PCK(cudaSetDevice(device));
	PCK(cudaMalloc((void **)&kc, kv_e * 2 * sets));
	PCK(cudaMalloc((void **)&vc, kv_e * 2 * sets));
	PCK(cudaMalloc((void **)&q, (size_t)n_cols * n_heads * head_dim * 4));
	PCK(cudaMalloc((void **)&out, (size_t)n_cols * n_heads * head_dim * 4));
	PCK(cudaMalloc((void **)&part, kn_cuda_attn_workspace(n_cols, n_heads, n_kv_heads, head_dim, ctx,
								 tile ? kn_cuda_attn_tile_split(n_cols, ctx, n_heads, n_kv_heads)
								      : 0)));
	/* the column kernel's split counters start at zero */
	PCK(cudaMalloc((void **)&cnt, (size_t)n_cols * n_kv_heads * sizeof(unsigned)));
	PCK(cudaMemset(cnt, 0, (size_t)n_cols * n_kv_heads * sizeof(unsigned)));
	PCK(cudaMalloc((void **)&table, (size_t)nb * 4));
	PCK(cudaMalloc((void **)&cols, (size_t)n_cols * sizeof(*cols)));
	PCK(kn_cuda_fill_bf16(kc, kv_e * sets, 11, 1.f, 0));
	PCK(kn_cuda_fill_bf16(vc, kv_e * sets, 12, 1.f, 0));
	PCK(kn_cuda_fill_f32(q, (size_t)n_cols * n_heads * head_dim, 13, 0.f, 1.f, 0));
	PCK(cudaMemcpy(table, h_table, (size_t)nb * 4, cudaMemcpyHostToDevice));
	PCK(cudaMemcpy(cols, h_cols, (size_t)n_cols * sizeof(*cols), cudaMemcpyHostToDevice));
	a.q = q;
	a.q_stride = n_heads * head_dim;
	a.k_cache = kc;
	a.v_cache = vc;
	a.table = table;
	a.cols = cols;
	a.out = out;
	a.part = part;
	a.counters = cnt;
	a.n = n_cols;
	a.n_heads = n_heads;
	a.n_kv_heads = n_kv_heads;
	a.head_dim = head_dim;
	a.max_bps = bps;
	a.max_ctx = ctx;
	a.scale = 1.f / sqrtf((float)head_dim);
	a.kernel = tile ? KN_CU_ATTN_TILE : KN_CU_ATTN_COLUMN;
	a.exact = n_cols <= 16;
	a.split = kn_cuda_attn_tile_split(n_cols, ctx, n_heads, n_kv_heads);
	rc = median_ms(iters, &med, err, errlen, [&]() {
		for (int r = 0; r < launches; r++) {
			a.k_cache = kc + (size_t)(r % sets) * kv_e;
			a.v_cache = vc + (size_t)(r % sets) * kv_e;
			if (ck(kn_cuda_attention(&a, 0), "kn_cuda_attention", err, errlen) < 0)
				return -EIO;
		}
		return 0;
	});
	if (rc == 0) {
		*sec_per_call = med * 1e-3 / launches;
		*bytes_per_s = 2.0 * (double)n_cols * ctx * n_kv_heads * head_dim * 2 / *sec_per_call;
	}
out:
	cudaFree(kc);
	cudaFree(vc);
	cudaFree(q);
	cudaFree(out);
	cudaFree(part);
	cudaFree(cnt);
	cudaFree(table);
	cudaFree(cols);
	free(h_table);
	free(h_cols);
	return rc;
}
