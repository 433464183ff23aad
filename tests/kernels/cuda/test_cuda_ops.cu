/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Each CUDA operator against a CPU reference in double precision, over
 * several sizes, on fresh random inputs; outputs are poisoned (NaN) before
 * each run so an unwritten element fails. Tolerance: relative L2 error
 * ||out - ref|| / ||ref||: 1e-2 where X is rounded to bf16 (wide linear),
 * 1e-3 where only the stored K/V are, 1e-4 for the f32-grade linear paths,
 * 1e-5 for f32 elementwise operators.
 * Exits 77 when no CUDA device is present.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "attention.cuh"
#include "gemv.cuh"
#include "gemm.cuh"
#include "gemm_wg.cuh"
#include "qkv_rope.cuh"
#include "rmsnorm.cuh"
#include "sample.cuh"
#include "swiglu.cuh"
#include "kn_stage_impl.h"

static int g_fail;
static uint64_t g_rng = 0x1234567ull;

#define CHECK_CUDA(call)                                                                     \
	do {                                                                                 \
		cudaError_t e_ = (call);                                                     \
		if (e_ != cudaSuccess) {                                                     \
			fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
				cudaGetErrorString(e_));                                     \
			exit(1);                                                             \
		}                                                                            \
	} while (0)

static float frand(void)
{
	g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f;
}

static uint16_t f2bf(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float bf2f(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

template <class T> static T *dev(const std::vector<T> &h)
{
	T *d;
	CHECK_CUDA(cudaMalloc((void **)&d, h.size() * sizeof(T) + 16));
	CHECK_CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
	return d;
}

template <class T> static std::vector<T> host(const T *d, size_t n)
{
	std::vector<T> h(n);
	CHECK_CUDA(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
	return h;
}

static void expect_close(const char *what, const float *out, const double *ref, size_t n, double tol)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		if (!isfinite(out[i])) {
			printf("FAIL %s: element %zu is %g (unwritten or overflow)\n", what, i, out[i]);
			g_fail++;
			return;
		}
		num += (out[i] - ref[i]) * (out[i] - ref[i]);
		den += ref[i] * ref[i];
	}
	double rel = sqrt(num / (den > 0 ? den : 1));
	printf("%s %s: rel err %.3g (tol %.0e)\n", rel <= tol ? "ok  " : "FAIL", what, rel, tol);
	if (!(rel <= tol))
		g_fail++;
}

static void rand_bf16(std::vector<uint16_t> &v, float scale)
{
	for (auto &x : v)
		x = f2bf(frand() * scale);
}

/* W [out][in] bf16 and X [n][in] f32, random in [-1, 1) */
static void rand_product(std::vector<uint16_t> &w, std::vector<float> &x, int in, int out, int n)
{
	w.resize((size_t)in * out);
	x.resize((size_t)n * in);
	rand_bf16(w, 1.f);
	for (auto &v : x)
		v = frand();
}

/* Y = X W^T in double, X rounded to bf16 first when @p round_x */
static std::vector<double> ref_product(const std::vector<uint16_t> &w, const std::vector<float> &x, int n, int in,
				       int out, bool round_x)
{
	std::vector<double> ref((size_t)n * out);
	for (int c = 0; c < n; c++)
		for (int o = 0; o < out; o++) {
			double sum = 0;
			for (int k = 0; k < in; k++) {
				const float xv = x[(size_t)c * in + k];
				sum += (double)bf2f(w[(size_t)o * in + k]) * (round_x ? bf2f(f2bf(xv)) : xv);
			}
			ref[(size_t)c * out + o] = sum;
		}
	return ref;
}

/* Both skinny kernels and the cuBLAS path (X rounded, and X split into
 * hi + lo) vs a double reference on f32 X that is not bf16-representable;
 * a column's bits equal across narrow widths for each skinny kernel. */
static void skinny_and_wide_products_match_a_double_reference(cublasHandle_t h)
{
	const int shapes[][2] = { { 64, 48 }, { 200, 37 }, { 512, 1408 }, { 2048, 3072 }, { 4096, 1000 } };
	const int widths[] = { 1, 3, 8, 9, 16, 32, 96 };
	for (auto &sh : shapes) {
		const int in = sh[0], out = sh[1];
		std::vector<uint16_t> w((size_t)in * out);
		std::vector<float> x((size_t)96 * in);
		rand_bf16(w, 1.f);
		for (auto &v : x)
			v = frand();
		uint16_t *dw = dev(w), *dxb;
		float *dx = dev(x), *dy;
		CHECK_CUDA(cudaMalloc((void **)&dy, (size_t)96 * out * 4));
		CHECK_CUDA(cudaMalloc((void **)&dxb, (size_t)2 * 96 * in * 2));
		std::vector<float> col0[2];
		for (int n : widths) {
			std::vector<double> ref((size_t)n * out);
			for (int c = 0; c < n; c++)
				for (int o = 0; o < out; o++) {
					double s = 0;
					for (int k = 0; k < in; k++)
						s += (double)bf2f(w[(size_t)o * in + k]) * x[(size_t)c * in + k];
					ref[(size_t)c * out + o] = s;
				}
			const bool narrow = n <= KN_CU_GEMV_MAX_N;
			for (int v = 0; v < 2; v++) {
				char err[256] = "", what[128];
				CHECK_CUDA(cudaMemset(dy, 0xff, (size_t)96 * out * 4));
				if (narrow) {
					cudaError_t e = v ? kn_cuda_gemv_ffma((kn_bf16 *)dw, dx, dy, n, in, out, 0)
							  : kn_cuda_gemv_mma((kn_bf16 *)dw, dx, dy, n, in, out, 0);
					if (e != cudaSuccess)
						snprintf(err, sizeof(err), "%s", cudaGetErrorString(e));
				} else {
					kn_cuda_linear(h, (kn_bf16 *)dw, dx, (kn_bf16 *)dxb, dy, n, in, out, v, -1, 0, err,
						       sizeof(err));
				}
				CHECK_CUDA(cudaDeviceSynchronize());
				snprintf(what, sizeof(what), "linear in=%d out=%d n=%d (%s)", in, out, n,
					 narrow ? (v ? "gemv ffma" : "gemv mma") : (v ? "cuBLAS, X split" : "cuBLAS, X rounded"));
				if (err[0]) {
					printf("FAIL %s: %s\n", what, err);
					g_fail++;
					continue;
				}
				std::vector<float> y = host(dy, (size_t)n * out);
				/* X rounded to bf16 costs ~2^-9 relative per term */
				expect_close(what, y.data(), ref.data(), y.size(), !narrow && !v ? 1e-2 : 1e-4);
				if (narrow) {
					if (col0[v].empty())
						col0[v].assign(y.begin(), y.begin() + out);
					else if (memcmp(col0[v].data(), y.data(), (size_t)out * 4)) {
						printf("FAIL %s: column 0 bits differ from n=1\n", what);
						g_fail++;
					}
				}
			}
		}
		cudaFree(dw);
		cudaFree(dx);
		cudaFree(dxb);
		cudaFree(dy);
	}
}

/* The wide tensor-core kernel gives every column the bits the narrow one
 * (kn_cuda_gemv_mma) gives it alone, at every width: in a multiple of 1024
 * and not (the last warp chunks short or empty), out not a multiple of 64,
 * each column checked against its own n = 1 run; and it is within the
 * f32-grade bound of a double reference. */
static void the_wide_tensor_core_kernel_gives_each_column_its_narrow_bits_at_every_width(void)
{
	const int shapes[][2] = { { 4096, 96 }, { 1000, 200 }, { 2056, 1000 }, { 64, 37 } };
	const int widths[] = { 1, 2, 8, 16, 17, 64, 65, 256, 300 };
	const int N = 300;
	for (auto &sh : shapes) {
		const int in = sh[0], out = sh[1];
		std::vector<uint16_t> w;
		std::vector<float> x;
		rand_product(w, x, in, out, N);
		uint16_t *dw = dev(w), *dxb;
		float *dx = dev(x), *dy, *dpart;
		CHECK_CUDA(cudaMalloc((void **)&dy, (size_t)N * out * 4));
		CHECK_CUDA(cudaMalloc((void **)&dpart, (size_t)8 * N * out * 4));
		CHECK_CUDA(cudaMalloc((void **)&dxb, (size_t)2 * N * in * 2));
		/* each column alone through the narrow kernel */
		std::vector<float> solo((size_t)N * out);
		for (int c = 0; c < N; c++) {
			CHECK_CUDA(kn_cuda_gemv_mma((kn_bf16 *)dw, dx + (size_t)c * in, dy, 1, in, out, 0));
			CHECK_CUDA(cudaMemcpy(solo.data() + (size_t)c * out, dy, (size_t)out * 4, cudaMemcpyDeviceToHost));
		}
		int bad = 0;
		for (int n : widths)
		for (int parts = 0; parts < 2; parts++) { /* each warp sequence in blocks of its own, or not */
			CHECK_CUDA(cudaMemset(dy, 0xff, (size_t)N * out * 4));
			cudaError_t e = kn_cuda_gemm_mma((kn_bf16 *)dw, dx, (kn_bf16 *)dxb, dy, n, in, out,
							 parts ? dpart : NULL, (size_t)8 * N * out, 0);
			CHECK_CUDA(cudaDeviceSynchronize());
			if (e != cudaSuccess) {
				printf("FAIL kn_cuda_gemm_mma(n=%d, in=%d, out=%d): %s\n", n, in, out, cudaGetErrorString(e));
				g_fail++;
				continue;
			}
			std::vector<float> y = host(dy, (size_t)n * out);
			for (int c = 0; c < n; c++)
				if (memcmp(y.data() + (size_t)c * out, solo.data() + (size_t)c * out, (size_t)out * 4)) {
					if (bad++ < 3)
						printf("FAIL wide tensor-core kernel%s, in=%d out=%d n=%d: column %d differs "
						       "from its narrow bits\n", parts ? " (in parts)" : "", in, out, n, c);
				}
			if (n == N && parts) {
				const std::vector<double> ref = ref_product(w, x, n, in, out, false);
				char what[128];
				snprintf(what, sizeof(what), "wide tensor-core kernel in=%d out=%d n=%d", in, out, n);
				expect_close(what, y.data(), ref.data(), y.size(), 1e-4);
			}
		}
		printf("%s wide tensor-core kernel, in=%d out=%d: every column of widths 1..300 equals its narrow bits, whole and in parts\n",
		       bad ? "FAIL" : "ok  ", in, out);
		g_fail += bad != 0;
		cudaFree(dw);
		cudaFree(dx);
		cudaFree(dxb);
		cudaFree(dpart);
		cudaFree(dy);
	}
}

/* The warpgroup kernel (gemm_wg.cuh): every column of every width, whole or
 * in segment parts, and each forced instruction width, equals that column
 * computed alone; and the product is X rounded to bf16 times W, summed in
 * f32 (against a double reference of exactly that). */
static void the_warpgroup_kernel_gives_each_column_the_same_bits_at_every_width(void)
{
	if (!kn_cuda_one_family_ok(0)) {
		printf("skip warpgroup kernel: not a Hopper GPU\n");
		return;
	}
	/* 2048 x 4096: rows enough that 128-256 columns take 64-column tiles;
	 * 1032 x 4200: four rows an input or more, one chain over all of `in`
	 * (256-column tiles above 256 columns), `in` not a multiple of 64 */
	const int shapes[][2] = { { 4096, 96 },	 { 1000, 200 },	  { 2056, 1000 }, { 64, 37 },
				  { 14336, 130 }, { 2048, 4096 }, { 1032, 4200 } };
	const int widths[] = { 1, 2, 7, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 192, 256, 300 };
	const int N = 300;
	for (auto &sh : shapes) {
		const int in = sh[0], out = sh[1];
		std::vector<uint16_t> w;
		std::vector<float> x;
		rand_product(w, x, in, out, N);
		/* room for segments of 64 k or more */
		const size_t part_floats = (size_t)(in / 64 + 1) * N * out;
		uint16_t *dw = dev(w), *dxb;
		float *dx = dev(x), *dy, *dpart;
		CHECK_CUDA(cudaMalloc((void **)&dy, (size_t)N * out * 4));
		CHECK_CUDA(cudaMalloc((void **)&dpart, part_floats * 4));
		CHECK_CUDA(cudaMalloc((void **)&dxb, (size_t)N * in * 2));
		std::vector<float> solo((size_t)N * out);
		for (int c = 0; c < N; c++) {
			CHECK_CUDA(kn_cuda_gemm_wg((kn_bf16 *)dw, dx + (size_t)c * in, (kn_bf16 *)dxb, dy, 1, in, out, NULL, 0, 0));
			CHECK_CUDA(cudaMemcpy(solo.data() + (size_t)c * out, dy, (size_t)out * 4, cudaMemcpyDeviceToHost));
		}
		int bad = 0, runs = 0;
		auto compare = [&](int n, const char *how) {
			std::vector<float> y = host(dy, (size_t)n * out);
			runs++;
			for (int c = 0; c < n; c++)
				if (memcmp(y.data() + (size_t)c * out, solo.data() + (size_t)c * out, (size_t)out * 4)) {
					if (bad++ < 3)
						printf("FAIL warpgroup kernel (%s), in=%d out=%d n=%d: column %d differs from "
						       "its bits alone\n", how, in, out, n, c);
				}
			return y;
		};
		/* parts 2: in parts, X handed over rounded where the kernel takes it so */
		for (int n : widths)
			for (int parts = 0; parts < 3; parts++) {
				CHECK_CUDA(cudaMemset(dy, 0xff, (size_t)N * out * 4));
				cudaError_t e;
				if (parts == 2 && kn_cuda_gemm_wg_takes_bf16(n, in, out)) {
					CHECK_CUDA(kn_cuda_round_bf16(dx, (kn_bf16 *)dxb, NULL, (size_t)n * in, 0));
					e = kn_cuda_gemm_wg_bf16((kn_bf16 *)dw, (kn_bf16 *)dxb, dy, n, in, out, dpart,
								 part_floats, 0);
				} else {
					e = kn_cuda_gemm_wg((kn_bf16 *)dw, dx, (kn_bf16 *)dxb, dy, n, in, out,
							    parts ? dpart : NULL, part_floats, 0);
				}
				CHECK_CUDA(cudaDeviceSynchronize());
				if (e != cudaSuccess) {
					printf("FAIL kn_cuda_gemm_wg(n=%d, in=%d, out=%d): %s\n", n, in, out, cudaGetErrorString(e));
					g_fail++;
					continue;
				}
				std::vector<float> y = compare(n, parts == 0   ? "whole"
								  : parts == 1 ? "in parts"
									       : "in parts, X handed over rounded");
				if (n == N && parts) {
					const std::vector<double> ref = ref_product(w, x, n, in, out, true);
					char what[128];
					snprintf(what, sizeof(what), "warpgroup kernel in=%d out=%d n=%d vs bf16(X) W in double",
						 in, out, n);
					expect_close(what, y.data(), ref.data(), y.size(), 1e-5);
				}
			}
		for (int way = 0; way < 19; way++)
			for (int n : { 5, 40, 129, N }) {
				CHECK_CUDA(cudaMemset(dy, 0xff, (size_t)N * out * 4));
				const cudaError_t e = kn_cuda_gemm_wg_forced((kn_bf16 *)dw, dx, (kn_bf16 *)dxb, dy, n, in,
									     out, way == 1 || way >= 4 ? dpart : NULL,
									     part_floats, way, 0);
				/* 256-column tiles keep no segment total: layers of one chain only */
				if (e == cudaErrorNotSupported && (way == 13 || way == 14) && kn_cuda_gemm_wg_seg(in, out) < in)
					continue;
				CHECK_CUDA(e);
				CHECK_CUDA(cudaDeviceSynchronize());
				char how[32];
				snprintf(how, sizeof(how), "forced way %d", way);
				compare(n, how);
			}
		printf("%s warpgroup kernel, in=%d out=%d: every column of %d runs (widths 1..300, whole, in parts, X handed "
		       "over rounded, three instruction widths, the TMA kernel's six tiles, persistent or not, in CTA pairs sharing X or W, 256-column tiles where one chain, mma.sync a segment a warp with W as either operand) equals its bits alone\n", bad ? "FAIL" : "ok  ", in, out, runs);

		g_fail += bad != 0;
		cudaFree(dw);
		cudaFree(dx);
		cudaFree(dxb);
		cudaFree(dpart);
		cudaFree(dy);
	}
}

static void add_rmsnorm_matches_reference(void)
{
	for (int hidden : { 64, 512, 4096 }) {
		const int n = 5;
		std::vector<float> r((size_t)n * hidden), d((size_t)n * hidden), w(hidden);
		for (auto &v : r) v = frand() * 3;
		for (auto &v : d) v = frand();
		for (auto &v : w) v = 1 + frand() * .2f;
		float *dr = dev(r), *dd = dev(d), *dw = dev(w);
		float *dout;
		CHECK_CUDA(cudaMalloc((void **)&dout, (size_t)n * hidden * 4));
		CHECK_CUDA(cudaMemset(dout, 0xff, (size_t)n * hidden * 4));
		CHECK_CUDA(kn_cuda_add_rmsnorm(dr, dd, 0, dw, 1e-5f, n, hidden, dout, 0));
		std::vector<float> of = host(dout, (size_t)n * hidden);
		std::vector<float> rr = host(dr, (size_t)n * hidden);
		std::vector<double> ref(of.size()), rref(of.size());
		for (int i = 0; i < n; i++) {
			double ss = 0;
			for (int j = 0; j < hidden; j++) {
				double v = (double)r[(size_t)i * hidden + j] + d[(size_t)i * hidden + j];
				rref[(size_t)i * hidden + j] = v;
				ss += v * v;
			}
			double inv = 1 / sqrt(ss / hidden + 1e-5);
			for (int j = 0; j < hidden; j++)
				ref[(size_t)i * hidden + j] = rref[(size_t)i * hidden + j] * inv * w[j];
		}
		char what[64];
		snprintf(what, sizeof(what), "add_rmsnorm hidden=%d (residual)", hidden);
		expect_close(what, rr.data(), rref.data(), rr.size(), 1e-6);
		snprintf(what, sizeof(what), "add_rmsnorm hidden=%d (normed)", hidden);
		expect_close(what, of.data(), ref.data(), of.size(), 1e-5);
		cudaFree(dr); cudaFree(dd); cudaFree(dw); cudaFree(dout);
	}
}

static void swiglu_matches_reference(void)
{
	const int n = 3, inter = 1408;
	std::vector<float> gu((size_t)n * 2 * inter);
	for (auto &v : gu) v = frand() * 4;
	float *dg = dev(gu);
	float *dout;
	CHECK_CUDA(cudaMalloc((void **)&dout, (size_t)n * inter * 4));
	CHECK_CUDA(cudaMemset(dout, 0xff, (size_t)n * inter * 4));
	CHECK_CUDA(kn_cuda_swiglu(dg, 0, n, inter, dout, 0));
	std::vector<float> of = host(dout, (size_t)n * inter);
	std::vector<double> ref(of.size());
	for (int r = 0; r < n; r++)
		for (int i = 0; i < inter; i++) {
			double g = gu[(size_t)r * 2 * inter + i], u = gu[(size_t)r * 2 * inter + inter + i];
			ref[(size_t)r * inter + i] = g / (1 + exp(-g)) * u;
		}
	expect_close("swiglu", of.data(), ref.data(), of.size(), 1e-5);
	cudaFree(dg); cudaFree(dout);
}

/* qkv_rope's arguments for n columns of one layer (no bias, no q/k norm) */
static struct kn_cu_qkv_args qkv_args(float *qkv, const float *inv_freq, const struct kn_column *cols,
				      const int32_t *table, kn_bf16 *kc, kn_bf16 *vc, int n, int nh, int nkv, int hd,
				      int bps)
{
	struct kn_cu_qkv_args qa = {};
	qa.qkv = qkv;
	qa.inv_freq = inv_freq;
	qa.cols = cols;
	qa.table = table;
	qa.k_cache = kc;
	qa.v_cache = vc;
	qa.n = n;
	qa.n_heads = nh;
	qa.n_kv_heads = nkv;
	qa.head_dim = hd;
	qa.max_bps = bps;
	qa.eps = 1e-6f;
	return qa;
}

/* The one family's products in segment parts may leave their sums to the
 * kernel that reads them (kn_cuda_gemm_wg_defer()): the residual add, SwiGLU
 * and qkv_rope must then give the bits they give after the fold kernel. */
static void consumers_of_deferred_sums_give_the_folded_bits(void)
{
	if (!kn_cuda_one_family_ok(0)) {
		printf("skip deferred sums: not a Hopper GPU\n");
		return;
	}
	const int in = 4096, nh = 4, nkv = 2, hd = 64, qkv_dim = (nh + 2 * nkv) * hd, inter = 384, hidden = 256;
	const int bps = 4, N = 48;
	int bad = 0, deferred = 0, runs = 0;
	std::vector<uint16_t> w;
	std::vector<float> x, resid((size_t)N * hidden), nw(hidden), inv(hd / 2);
	rand_product(w, x, in, 2 * inter > qkv_dim ? 2 * inter : qkv_dim, N);
	for (auto &v : resid) v = frand();
	for (auto &v : nw) v = 1 + frand() * .2f;
	for (int i = 0; i < hd / 2; i++) inv[i] = powf(10000.f, -2.f * i / hd);
	std::vector<struct kn_column> cols(N);
	std::vector<int32_t> tab(bps);
	for (int c = 0; c < N; c++) cols[c] = kn_column{ 0, c, 0, 0, 0.f, 1.f, 0, 0 };
	for (int b = 0; b < bps; b++) tab[b] = b;
	uint16_t *dw = dev(w), *dxb;
	float *dx = dev(x), *dnw = dev(nw), *dinv = dev(inv), *dy, *dpart, *dr[2], *dout[2], *dq[2];
	struct kn_column *dcols = dev(cols);
	int32_t *dtab = dev(tab);
	kn_bf16 *kc[2], *vc[2];
	const size_t part_floats = (size_t)(in / 64 + 1) * N * (2 * inter > qkv_dim ? 2 * inter : qkv_dim);
	const size_t kv_e = (size_t)bps * nkv * KN_PAGE_BLK * hd;
	CHECK_CUDA(cudaMalloc((void **)&dy, (size_t)N * 2 * inter * 4 + (size_t)N * qkv_dim * 4));
	CHECK_CUDA(cudaMalloc((void **)&dpart, part_floats * 4));
	CHECK_CUDA(cudaMalloc((void **)&dxb, (size_t)N * in * 2));
	for (int k = 0; k < 2; k++) {
		CHECK_CUDA(cudaMalloc((void **)&dr[k], (size_t)N * hidden * 4));
		CHECK_CUDA(cudaMalloc((void **)&dout[k], (size_t)N * (inter > hidden ? inter : hidden) * 4));
		CHECK_CUDA(cudaMalloc((void **)&dq[k], (size_t)N * qkv_dim * 4));
		CHECK_CUDA(cudaMalloc((void **)&kc[k], kv_e * 2));
		CHECK_CUDA(cudaMalloc((void **)&vc[k], kv_e * 2));
	}
	auto same = [&](const char *what, int n, const void *a, const void *b, size_t bytes) {
		std::vector<uint8_t> ha(bytes), hb(bytes);
		CHECK_CUDA(cudaMemcpy(ha.data(), a, bytes, cudaMemcpyDeviceToHost));
		CHECK_CUDA(cudaMemcpy(hb.data(), b, bytes, cudaMemcpyDeviceToHost));
		runs++;
		if (memcmp(ha.data(), hb.data(), bytes) && bad++ < 4)
			printf("FAIL deferred sums, n=%d: %s differs from its bits after the fold kernel\n", n, what);
	};
	for (int n : { 1, 8, 32, N }) {
		/* the product folded (k 0) or left in segments (k 1), then its consumer */
		for (int k = 0; k < 2; k++) {
			int segs = 0;
			/* the residual add and the norm, from an out = hidden product */
			if (k == 0)
				CHECK_CUDA(kn_cuda_gemm_wg((kn_bf16 *)dw, dx, (kn_bf16 *)dxb, dy, n, in, hidden, dpart, part_floats, 0));
			else
				CHECK_CUDA(kn_cuda_gemm_wg_defer((kn_bf16 *)dw, dx, (kn_bf16 *)dxb, dy, n, in, hidden, dpart,
								 part_floats, &segs, 0));
			deferred += k == 1 && segs > 0;
			CHECK_CUDA(cudaMemcpy(dr[k], resid.data(), (size_t)N * hidden * 4, cudaMemcpyHostToDevice));
			CHECK_CUDA(kn_cuda_add_rmsnorm(dr[k], segs ? dpart : dy, segs, dnw, 1e-5f, n, hidden, dout[k], 0));
		}
		same("the residual", n, dr[0], dr[1], (size_t)n * hidden * 4);
		same("the normed rows", n, dout[0], dout[1], (size_t)n * hidden * 4);
		for (int k = 0; k < 2; k++) {
			int segs = 0;
			if (k == 0)
				CHECK_CUDA(kn_cuda_gemm_wg((kn_bf16 *)dw, dx, (kn_bf16 *)dxb, dy, n, in, 2 * inter, dpart, part_floats, 0));
			else
				CHECK_CUDA(kn_cuda_gemm_wg_defer((kn_bf16 *)dw, dx, (kn_bf16 *)dxb, dy, n, in, 2 * inter, dpart,
								 part_floats, &segs, 0));
			CHECK_CUDA(kn_cuda_swiglu(segs ? dpart : dy, segs, n, inter, dout[k], 0));
		}
		same("SwiGLU", n, dout[0], dout[1], (size_t)n * inter * 4);
		for (int k = 0; k < 2; k++) {
			int segs = 0;
			if (k == 0)
				CHECK_CUDA(kn_cuda_gemm_wg((kn_bf16 *)dw, dx, (kn_bf16 *)dxb, dq[k], n, in, qkv_dim, dpart, part_floats, 0));
			else
				CHECK_CUDA(kn_cuda_gemm_wg_defer((kn_bf16 *)dw, dx, (kn_bf16 *)dxb, dq[k], n, in, qkv_dim, dpart,
								 part_floats, &segs, 0));
			CHECK_CUDA(cudaMemset(kc[k], 0, kv_e * 2));
			CHECK_CUDA(cudaMemset(vc[k], 0, kv_e * 2));
			struct kn_cu_qkv_args qa = qkv_args(dq[k], dinv, dcols, dtab, kc[k], vc[k], n, nh, nkv, hd, bps);
			qa.qkv_parts = segs ? dpart : NULL;
			qa.qkv_segs = segs;
			CHECK_CUDA(kn_cuda_qkv_rope(&qa, 0));
		}
		CHECK_CUDA(cudaDeviceSynchronize());
		/* q as attention reads it (its columns' first nh hd floats), K and V as written */
		for (int c = 0; c < n; c++)
			same("qkv_rope's q", n, dq[0] + (size_t)c * qkv_dim, dq[1] + (size_t)c * qkv_dim, (size_t)nh * hd * 4);
		same("qkv_rope's K", n, kc[0], kc[1], kv_e * 2);
		same("qkv_rope's V", n, vc[0], vc[1], kv_e * 2);
	}
	/* the narrow plans run in segment parts: they must have been left to the consumers */
	if (deferred < 3 && bad++ < 4)
		printf("FAIL deferred sums: only %d of 4 widths left their sums to the consumers (1, 8 and 32 should)\n",
		       deferred);
	printf("%s deferred sums: the residual add, SwiGLU and qkv_rope give the folded bits in %d checks at widths 1, 8, "
	       "32, %d (%d widths deferred)\n", bad ? "FAIL" : "ok  ", runs, N, deferred);
	g_fail += bad != 0;
	cudaFree(dw); cudaFree(dxb); cudaFree(dx); cudaFree(dnw); cudaFree(dinv); cudaFree(dy); cudaFree(dpart);
	cudaFree(dcols); cudaFree(dtab);
	for (int k = 0; k < 2; k++) {
		cudaFree(dr[k]); cudaFree(dout[k]); cudaFree(dq[k]); cudaFree(kc[k]); cudaFree(vc[k]);
	}
}

/* Wide plans take the norm's and SwiGLU's output in bf16 straight into
 * cuBLAS: those bits must be the f32 outputs rounded to nearest, so the
 * fused producers change nothing but the traffic. */
static void bf16_producers_equal_their_f32_outputs_rounded(void)
{
	const int n = 7, hidden = 2048, inter = 1408;
	std::vector<float> r((size_t)n * hidden), d((size_t)n * hidden), w(hidden);
	for (auto &v : r) v = frand() * 3;
	for (auto &v : d) v = frand();
	for (auto &v : w) v = 1 + frand() * .2f;
	float *dr1 = dev(r), *dr2 = dev(r), *dd = dev(d), *dw = dev(w), *of;
	uint16_t *ob;
	CHECK_CUDA(cudaMalloc((void **)&of, (size_t)n * inter * 2 * 4));
	CHECK_CUDA(cudaMalloc((void **)&ob, (size_t)n * inter * 2 * 2));
	CHECK_CUDA(cudaMemset(ob, 0xff, (size_t)n * inter * 2 * 2));
	CHECK_CUDA(kn_cuda_add_rmsnorm(dr1, dd, 0, dw, 1e-5f, n, hidden, of, 0));
	CHECK_CUDA(kn_cuda_add_rmsnorm_bf16(dr2, dd, 0, dw, 1e-5f, n, hidden, (kn_bf16 *)ob, 0));
	std::vector<float> f = host(of, (size_t)n * hidden);
	std::vector<uint16_t> b = host(ob, (size_t)n * hidden);
	std::vector<float> r1 = host(dr1, (size_t)n * hidden), r2 = host(dr2, (size_t)n * hidden);
	size_t bad = 0;
	for (size_t i = 0; i < f.size(); i++)
		bad += b[i] != f2bf(f[i]) || memcmp(&r1[i], &r2[i], 4) != 0;
	printf("%s add_rmsnorm_bf16 = add_rmsnorm rounded: %zu of %zu differ\n", bad ? "FAIL" : "ok  ", bad,
	       f.size());
	g_fail += bad != 0;

	std::vector<float> gu((size_t)n * 2 * inter);
	for (auto &v : gu) v = frand() * 4;
	float *dg = dev(gu);
	CHECK_CUDA(cudaMemset(ob, 0xff, (size_t)n * inter * 2));
	CHECK_CUDA(kn_cuda_swiglu(dg, 0, n, inter, of, 0));
	CHECK_CUDA(kn_cuda_swiglu_bf16(dg, 0, n, inter, (kn_bf16 *)ob, 0));
	f = host(of, (size_t)n * inter);
	b = host(ob, (size_t)n * inter);
	bad = 0;
	for (size_t i = 0; i < f.size(); i++)
		bad += b[i] != f2bf(f[i]);
	printf("%s swiglu_bf16 = swiglu rounded: %zu of %zu differ\n", bad ? "FAIL" : "ok  ", bad, f.size());
	g_fail += bad != 0;
	cudaFree(dr1); cudaFree(dr2); cudaFree(dd); cudaFree(dw); cudaFree(of); cudaFree(ob); cudaFree(dg);
}

/*
 * qkv_rope then attention over a prefilled paged cache, vs a double
 * reference of RoPE + causal softmax attention, for several head shapes and
 * contexts crossing the split size.
 */
static void paged_attention_matches_reference(void)
{
	/* last: a long context, checked at its last column only (the reference is
	 * quadratic): a 1-column plan splits it into at most 64 pieces, of 128
	 * positions or more past 1,024 (merged by the last block to finish) */
	struct { int nh, nkv, hd, ctx, qk_norm, bias, last; } cases[] = {
		{ 4, 2, 16, 37, 0, 0, 0 }, { 8, 4, 64, 300, 1, 1, 0 }, { 32, 8, 128, 1000, 0, 0, 0 },
		{ 14, 2, 64, 129, 0, 1, 0 }, { 16, 16, 32, 17, 1, 0, 0 }, { 8, 1, 256, 260, 0, 0, 0 },
		/* head sizes between the powers of two (the column kernel of the next
		 * one, lanes past the head idle), and more than 8 heads per KV head
		 * (several blocks per KV head, 8 heads each) */
		{ 8, 2, 48, 200, 0, 0, 0 }, { 10, 10, 80, 300, 1, 1, 0 }, { 12, 2, 96, 150, 0, 1, 0 }, { 4, 2, 160, 90, 1, 0, 0 },
		{ 32, 2, 64, 260, 0, 0, 0 }, { 12, 1, 240, 70, 0, 0, 0 }, { 8, 2, 64, 20000, 0, 0, 1 },
		{ 32, 8, 128, 3000, 0, 0, 1 }, { 8, 8, 256, 1500, 0, 1, 1 }, { 16, 2, 128, 2100, 0, 0, 1 },
		/* prompt runs of 64 columns at the smaller heads, and 8 heads a KV head */
		{ 4, 2, 16, 150, 0, 0, 0 }, { 16, 4, 32, 200, 1, 0, 0 }, { 32, 4, 128, 330, 0, 0, 0 },
	};
	for (auto &cs : cases) {
		const int nh = cs.nh, nkv = cs.nkv, hd = cs.hd, ctx = cs.ctx;
		const int qkv_dim = (nh + 2 * nkv) * hd;
		const int bps = (ctx + 15) / 16, nb = bps + 3;
		/* every position of one slot in one step: exercises the causal mask */
		const int n = ctx;
		std::vector<float> qkv((size_t)n * qkv_dim), bias(qkv_dim), qn(hd), kn(hd), inv(hd / 2);
		for (auto &v : qkv) v = frand();
		for (auto &v : bias) v = frand() * .1f;
		for (auto &v : qn) v = 1 + frand() * .2f;
		for (auto &v : kn) v = 1 + frand() * .2f;
		for (int i = 0; i < hd / 2; i++)
			inv[i] = 1.f / powf(10000.f, 2.f * i / hd);
		std::vector<int32_t> table(bps);
		for (int b = 0; b < bps; b++)
			table[b] = (b * 5 + 2) % nb; /* scattered, distinct while bps < nb */
		for (int b = 0; b < bps; b++)
			for (int b2 = 0; b2 < b; b2++)
				if (table[b] == table[b2])
					table[b] = -1;
		bool ok = true;
		for (int b = 0; b < bps; b++)
			ok &= table[b] >= 0;
		if (!ok)
			for (int b = 0; b < bps; b++)
				table[b] = bps - 1 - b;
		std::vector<struct kn_column> cols(n);
		for (int c = 0; c < n; c++) {
			memset(&cols[c], 0, sizeof(cols[c]));
			cols[c].pos = c;
			cols[c].slot = 0;
		}
		/* the same columns as two slots over the same pages (so the same
		 * reference), three of slot 1 in the middle: the runs of 64 columns
		 * around them are no runs, the others are */
		std::vector<int32_t> table2(table);
		table2.insert(table2.end(), table.begin(), table.end());
		std::vector<struct kn_column> cols2(cols);
		for (int c = n / 2; c < n / 2 + 3 && c < n; c++)
			cols2[c].slot = 1;
		float *dqkv = dev(qkv), *dbias = dev(bias), *dqn = dev(qn), *dkn = dev(kn), *dinv = dev(inv);
		int32_t *dtab = dev(table), *dtab2 = dev(table2);
		struct kn_column *dcols = dev(cols), *dcols2 = dev(cols2);
		kn_bf16 *kc, *vc;
		float *part, *out;
		const size_t kv_e = (size_t)nb * nkv * 16 * hd;
		CHECK_CUDA(cudaMalloc((void **)&kc, kv_e * 2));
		CHECK_CUDA(cudaMalloc((void **)&vc, kv_e * 2));
		CHECK_CUDA(cudaMalloc((void **)&out, (size_t)n * nh * hd * 4));
		CHECK_CUDA(cudaMemset(out, 0xff, (size_t)n * nh * hd * 4));
		/* the tile kernel at the smallest split it is given here (64) needs the most */
		CHECK_CUDA(cudaMalloc((void **)&part, kn_cuda_attn_workspace(cs.last ? 1 : n, nh, nkv, hd, ctx, 64)));
		unsigned *cnt;
		CHECK_CUDA(cudaMalloc((void **)&cnt, (size_t)kn_cuda_attn_counters(n, nh, nkv) * sizeof(unsigned)));
		CHECK_CUDA(cudaMemset(cnt, 0, (size_t)kn_cuda_attn_counters(n, nh, nkv) * sizeof(unsigned)));
		struct kn_cu_qkv_args qa = qkv_args(dqkv, dinv, dcols, dtab, kc, vc, n, nh, nkv, hd, bps);
		qa.bias = cs.bias ? dbias : NULL;
		qa.q_norm = cs.qk_norm ? dqn : NULL;
		qa.k_norm = cs.qk_norm ? dkn : NULL;
		CHECK_CUDA(kn_cuda_qkv_rope(&qa, 0));
		/* kernel 0: column; 1: tile exact; 2: tile bf16 q/P; 3: the same in
		 * 64-key steps (steps64). sub >= 0: that
		 * column alone. runs 1: prompt runs of rc columns on the run kernel;
		 * 2: the same over the two-slot columns; 3: the two-slot columns, no
		 * runs; from: the columns from that one on; fold: the runs in the
		 * tile kernel's pieces (one family); split: its pieces */
		auto attend = [&](int kernel, int sub, int runs = 0, int from = 0, int rc = 64, int fold = 0,
				  int split = 64) {
			struct kn_cu_attn_args aa = {};
			const int c0 = sub >= 0 ? sub : from;
			aa.q = dqkv + (size_t)c0 * qkv_dim;
			aa.q_stride = qkv_dim;
			aa.k_cache = kc;
			aa.v_cache = vc;
			aa.table = runs >= 2 ? dtab2 : dtab;
			aa.cols = (runs >= 2 ? dcols2 : dcols) + c0;
			aa.runs = runs == 1 || runs == 2 ? rc : 0;
			aa.out = out;
			aa.part = part;
			aa.counters = cnt;
			aa.n = sub >= 0 ? 1 : n - from;
			aa.n_heads = nh;
			aa.n_kv_heads = nkv;
			aa.head_dim = hd;
			aa.max_bps = bps;
			aa.max_ctx = ctx;
			aa.scale = 1.f / sqrtf((float)hd);
			aa.kernel = kernel ? KN_CU_ATTN_TILE : KN_CU_ATTN_COLUMN;
			aa.exact = kernel == 1;
			aa.steps64 = kernel == 3;
			aa.split = split;
			aa.run_fold = fold;
			CHECK_CUDA(cudaMemset(out, 0xff, (size_t)n * nh * hd * 4));
			CHECK_CUDA(kn_cuda_attention(&aa, 0));
			return host(out, (size_t)aa.n * nh * hd);
		};
		std::vector<float> of = cs.last ? std::vector<float>() : attend(0, -1);
		const bool tile_ok = kn_cuda_attn_tile_ok(hd) && nh / nkv <= 8 && !cs.last;
		std::vector<float> ot = tile_ok ? attend(1, -1) : of, ob = tile_ok ? attend(2, -1) : of,
				   o64 = tile_ok ? attend(3, -1) : of;
		/* a column's tile bits alone = among its prompt's other columns (on
		 * plans of more than 256 columns a warp of a prompt's columns folds
		 * its own pieces, where alone the merge kernel folds them) = among
		 * another slot's columns (their warps one piece each, merged) */
		int solo_diff = 0, mixed_diff = 0;
		if (tile_ok) {
			for (int sub : { n - 1, n / 3, n / 2 + 5 < n ? n / 2 + 5 : 0 }) {
				std::vector<float> o1 = attend(1, sub), o2 = attend(2, sub), o3 = attend(3, sub);
				solo_diff += memcmp(o1.data(), &ot[(size_t)sub * nh * hd], o1.size() * 4) != 0;
				solo_diff += memcmp(o2.data(), &ob[(size_t)sub * nh * hd], o2.size() * 4) != 0;
				solo_diff += memcmp(o3.data(), &o64[(size_t)sub * nh * hd], o3.size() * 4) != 0;
			}
			std::vector<float> m1 = attend(1, -1, 3), m2 = attend(2, -1, 3), m3 = attend(3, -1, 3);
			for (int c = 0; c < n; c++) {
				const size_t at = (size_t)c * nh * hd;
				mixed_diff += memcmp(&m1[at], &ot[at], (size_t)nh * hd * 4) != 0;
				mixed_diff += memcmp(&m2[at], &ob[at], (size_t)nh * hd * 4) != 0;
				mixed_diff += memcmp(&m3[at], &o64[at], (size_t)nh * hd * 4) != 0;
			}
		}

		/* reference: bias, norm, rope in double; K/V rounded to bf16 as stored */
		std::vector<double> x((size_t)n * qkv_dim);
		for (int c = 0; c < n; c++)
			for (int h = 0; h < nh + 2 * nkv; h++) {
				double *v = &x[(size_t)c * qkv_dim + h * hd];
				for (int i = 0; i < hd; i++)
					v[i] = qkv[(size_t)c * qkv_dim + h * hd + i] + (cs.bias ? bias[h * hd + i] : 0);
				if (cs.qk_norm && h < nh + nkv) {
					double ss = 0;
					for (int i = 0; i < hd; i++)
						ss += v[i] * v[i];
					double r = 1 / sqrt(ss / hd + 1e-6);
					for (int i = 0; i < hd; i++)
						v[i] *= r * (h < nh ? qn[i] : kn[i]);
				}
				if (h < nh + nkv)
					for (int i = 0; i < hd / 2; i++) {
						double a = (double)(float)((float)c * inv[i]);
						double x0 = v[i], x1 = v[i + hd / 2];
						v[i] = x0 * cos(a) - x1 * sin(a);
						v[i + hd / 2] = x1 * cos(a) + x0 * sin(a);
					}
				if (h >= nh)
					for (int i = 0; i < hd; i++)
						v[i] = bf2f(f2bf((float)v[i]));
			}
		std::vector<double> ref((size_t)n * nh * hd);
		const int G = nh / nkv;
		for (int c = cs.last ? n - 1 : 0; c < n; c++)
			for (int h = 0; h < nh; h++) {
				const double *q = &x[(size_t)c * qkv_dim + h * hd];
				const int kh = h / G;
				std::vector<double> sc(c + 1);
				double mx = -1e300;
				for (int p = 0; p <= c; p++) {
					const double *k = &x[(size_t)p * qkv_dim + (nh + kh) * hd];
					double d = 0;
					for (int i = 0; i < hd; i++)
						d += q[i] * k[i];
					sc[p] = d / sqrt((double)hd);
					mx = fmax(mx, sc[p]);
				}
				double z = 0;
				for (int p = 0; p <= c; p++)
					z += (sc[p] = exp(sc[p] - mx));
				for (int i = 0; i < hd; i++) {
					double a = 0;
					for (int p = 0; p <= c; p++)
						a += sc[p] * x[(size_t)p * qkv_dim + (nh + nkv + kh) * hd + i];
					ref[((size_t)c * nh + h) * hd + i] = a / z;
				}
			}
		char what[128];
		snprintf(what, sizeof(what), "qkv_rope+attention heads=%d kv=%d hd=%d ctx=%d qknorm=%d bias=%d",
			 nh, nkv, hd, ctx, cs.qk_norm, cs.bias);
		/* f32 output; only K/V are rounded (as the reference does) */
		if (!cs.last) /* a long one: its last column alone, below */
			expect_close(what, of.data(), ref.data(), of.size(), 1e-3);
		{
			/* the last column alone: a 1-column plan splits into 32/64-position
			 * pieces merged by the last one to finish; twice (counters reset) */
			char w2[160];
			const size_t row = (size_t)(n - 1) * nh * hd;
			std::vector<float> o1 = attend(0, n - 1), o2 = attend(0, n - 1);
			snprintf(w2, sizeof(w2), "%s column kernel, 1-column plan", what);
			expect_close(w2, o1.data(), &ref[row], o1.size(), 1e-3);
			if (memcmp(o1.data(), o2.data(), o1.size() * 4)) {
				printf("FAIL %s: a second launch gives other bits (split counters not left at zero)\n", w2);
				g_fail++;
			}
		}
		if (tile_ok) {
			char w2[160];
			/* exact: q and P carried as hi + lo, f32-grade (~1e-5 expected) */
			snprintf(w2, sizeof(w2), "%s tile exact", what);
			expect_close(w2, ot.data(), ref.data(), ot.size(), 1e-4);
			/* bf16 q and P: ~2^-9 relative per operand (~3e-3 expected) */
			snprintf(w2, sizeof(w2), "%s tile bf16", what);
			expect_close(w2, ob.data(), ref.data(), ob.size(), 2e-2);
			snprintf(w2, sizeof(w2), "%s tile bf16, 64-key steps", what);
			expect_close(w2, o64.data(), ref.data(), o64.size(), 2e-2);
			printf("%s a_tile_column_has_the_same_bits_alone_and_among_its_prompt hd=%d ctx=%d (%s): %d of 9 differ\n",
			       solo_diff ? "FAIL" : "ok  ", hd, ctx, n > 256 ? "the prompt's warps fold their own pieces" : "merged",
			       solo_diff);
			printf("%s a_tile_column_has_the_same_bits_among_another_slots_columns hd=%d ctx=%d: %d of %d differ\n",
			       mixed_diff ? "FAIL" : "ok  ", hd, ctx, mixed_diff, 3 * n);
			g_fail += solo_diff != 0 || mixed_diff != 0;
		}
		for (int rc : { 64, 128 }) {
			if (!tile_ok || n < rc)
				continue;
			/* prompt runs of rc columns on the run kernel (bf16 q/P): every
			 * run, some runs among columns of another slot, runs starting
			 * off a multiple of rc; twice each (a tile kernel or merge left
			 * writing over a run would show in the second) */
			char w2[256];
			const int from = 37;
			std::vector<float> r1 = attend(2, -1, 1, 0, rc), r1b = attend(2, -1, 1, 0, rc),
					   r2 = attend(2, -1, 2, 0, rc), r3 = attend(2, -1, 1, from, rc);
			snprintf(w2, sizeof(w2), "%s run kernel (runs of %d)", what, rc);
			expect_close(w2, r1.data(), ref.data(), r1.size(), 2e-2);
			snprintf(w2, sizeof(w2), "%s run kernel (runs of %d), among another slot's columns", what, rc);
			expect_close(w2, r2.data(), ref.data(), r2.size(), 2e-2);
			snprintf(w2, sizeof(w2), "%s run kernel (runs of %d), from position %d", what, rc, from);
			expect_close(w2, r3.data(), &ref[(size_t)from * nh * hd], r3.size(), 2e-2);
			const bool same = !memcmp(r1.data(), r1b.data(), r1.size() * 4);
			const bool served = memcmp(r1.data(), ob.data(), r1.size() * 4) != 0;
			printf("%s the_run_kernel_serves_prompt_runs_with_the_same_bits_every_launch hd=%d ctx=%d runs=%d%s%s\n",
			       same && served ? "ok  " : "FAIL", hd, ctx, rc, same ? "" : ": a second launch gives other bits",
			       served ? "" : ": the tile kernel's bits (no run served)");
			g_fail += !(same && served);
			/* one family: runs folded in the tile kernel's pieces give the
			 * tile kernel's bits (64-key steps), column for column, in
			 * every case above, and at pieces of 128 (two tiles a piece) */
			std::vector<float> o128 = attend(3, -1, 0, 0, rc, 0, 128);
			int fdiff = 0;
			for (int k = 0; k < 5; k++) {
				const std::vector<float> f = attend(3, -1, k == 1 || k == 4 ? 2 : 1, k == 2 ? from : 0, rc, 1,
								    k >= 3 ? 128 : 64),
							 &want = k >= 3 ? o128 : o64;
				const size_t at = k == 2 ? (size_t)from * nh * hd : 0;
				fdiff += memcmp(f.data(), &want[at], f.size() * 4) != 0;
			}
			printf("%s a_run_folded_in_pieces_has_the_tile_kernels_bits hd=%d ctx=%d runs=%d: %d of 5 launches differ\n",
			       fdiff ? "FAIL" : "ok  ", hd, ctx, rc, fdiff);
			g_fail += fdiff != 0;
		}
		cudaFree(dqkv); cudaFree(dbias); cudaFree(dqn); cudaFree(dkn); cudaFree(dinv);
		cudaFree(dtab2); cudaFree(dcols2);
		cudaFree(dtab); cudaFree(dcols); cudaFree(kc); cudaFree(vc); cudaFree(out); cudaFree(part); cudaFree(cnt);
	}
}

static void argmax_picks_the_lowest_id_among_ties(void)
{
	const int vocab = 50001, n = 4;
	std::vector<float> l((size_t)n * vocab);
	for (auto &v : l) v = frand();
	l[(size_t)0 * vocab + 777] = 5;
	l[(size_t)0 * vocab + 40000] = 5;
	l[(size_t)1 * vocab + vocab - 1] = 7;
	l[(size_t)2 * vocab + 0] = 9;
	std::vector<struct kn_column> cols(n);
	memset(cols.data(), 0, n * sizeof(cols[0]));
	for (int c = 0; c < n; c++)
		cols[c].flags = KN_COL_NEED_LOGIT;
	cols[3].flags = 0;
	float *dl = dev(l);
	struct kn_column *dc = dev(cols);
	int32_t *dt;
	CHECK_CUDA(cudaMalloc((void **)&dt, n * 4));
	CHECK_CUDA(kn_cuda_argmax(dl, vocab, dc, n, dt, 0));
	std::vector<int32_t> t = host(dt, n);
	const int want[] = { 777, vocab - 1, 0, -1 };
	for (int c = 0; c < n; c++)
		if (t[c] != want[c]) {
			printf("FAIL argmax column %d: got %d, want %d\n", c, t[c], want[c]);
			g_fail++;
		}
	printf("ok   argmax ties/last id/first id/no-logit column checked\n");
	cudaFree(dl); cudaFree(dc); cudaFree(dt);
}


/* One launch of the device sampler against kn_sample_column() on the same
 * rows: tokens and top ids identical, logprobs within 1e-5. */
static int sampler_round(const std::vector<float> &l, int vocab, std::vector<struct kn_column> &cols, int n_top,
			 const char *what, int pieces)
{
	const int n = (int)cols.size();
	float *dl = dev(l);
	struct kn_column *dc = dev(cols);
	std::vector<int32_t> nt(1, n_top);
	int32_t *dnt = dev(nt), *dt, *dids;
	float *dlp, *dlps;
	CHECK_CUDA(cudaMalloc((void **)&dt, n * 4));
	CHECK_CUDA(cudaMalloc((void **)&dlp, n * 4));
	CHECK_CUDA(cudaMalloc((void **)&dids, (size_t)n * KN_CU_MAX_TOP * 4));
	CHECK_CUDA(cudaMalloc((void **)&dlps, (size_t)n * KN_CU_MAX_TOP * 4));
	struct kn_cu_sample_args a = {};
	a.logits = dl;
	a.vocab = vocab;
	a.cols = dc;
	a.n = n;
	a.n_top = dnt;
	a.tokens = dt;
	a.tok_lp = dlp;
	a.top_ids = dids;
	a.top_lps = dlps;
	void *ws = NULL;
	CHECK_CUDA(kn_cuda_sample(&a, 0));
	CHECK_CUDA(cudaDeviceSynchronize());
	std::vector<int32_t> t = host(dt, n), ids = host(dids, (size_t)n * KN_CU_MAX_TOP);
	std::vector<float> lp = host(dlp, n), lps = host(dlps, (size_t)n * KN_CU_MAX_TOP);
	int bad = 0;
	if (pieces) {
		/* each row's greedy passes in blocks of their own (launches of at
		 * most 32 rows, as the engine's narrow plans), each twice (the
		 * counters must be back at zero): the same bits as one block a row */
		CHECK_CUDA(cudaMalloc(&ws, kn_cuda_sample_scratch_bytes(32)));
		CHECK_CUDA(cudaMemset(ws, 0, kn_cuda_sample_scratch_bytes(32)));
		for (int c0 = 0; c0 < n; c0 += 32) {
			struct kn_cu_sample_args b = a;
			b.logits = dl + (size_t)c0 * vocab;
			b.cols = dc + c0;
			b.n = n - c0 < 32 ? n - c0 : 32;
			b.tokens = dt + c0;
			b.tok_lp = dlp + c0;
			b.top_ids = dids + (size_t)c0 * KN_CU_MAX_TOP;
			b.top_lps = dlps + (size_t)c0 * KN_CU_MAX_TOP;
			b.scratch = ws;
			CHECK_CUDA(kn_cuda_sample(&b, 0));
			CHECK_CUDA(kn_cuda_sample(&b, 0));
		}
		CHECK_CUDA(cudaDeviceSynchronize());
		std::vector<int32_t> t2 = host(dt, n), ids2 = host(dids, (size_t)n * KN_CU_MAX_TOP);
		std::vector<float> lp2 = host(dlp, n), lps2 = host(dlps, (size_t)n * KN_CU_MAX_TOP);
		for (int c = 0; c < n; c++) {
			int same = t2[c] == t[c] && memcmp(&lp2[c], &lp[c], 4) == 0;
			for (int i = 0; i < n_top && same; i++)
				same = ids2[(size_t)c * KN_CU_MAX_TOP + i] == ids[(size_t)c * KN_CU_MAX_TOP + i] &&
				       memcmp(&lps2[(size_t)c * KN_CU_MAX_TOP + i], &lps[(size_t)c * KN_CU_MAX_TOP + i], 4) == 0;
			if (!same) {
				if (bad < 5)
					printf("FAIL sampler (%s) column %d in pieces: token %d logprob %a, one block %d %a\n",
					       what, c, t2[c], (double)lp2[c], t[c], (double)lp[c]);
				bad++;
			}
		}
		t = t2; ids = ids2; lp = lp2; lps = lps2;
	}
	std::vector<uint64_t> scratch((size_t)vocab + 8);
	std::vector<int32_t> hid(n_top > 0 ? n_top : 1);
	std::vector<float> hlps(n_top > 0 ? n_top : 1);
	int drawn = 0;
	double lp_err = 0;
	for (int c = 0; c < n; c++) {
		if (!(cols[c].flags & KN_COL_NEED_LOGIT)) {
			if (t[c] != -1) {
				printf("FAIL sampler (%s) column %d without NEED_LOGIT: token %d, want -1\n", what, c, t[c]);
				bad++;
			}
			continue;
		}
		float hlp = 0;
		int32_t ht = kn_sample_column(&l[(size_t)c * vocab], vocab, &cols[c], n_top, &hlp, hid.data(),
					      hlps.data(), scratch.data());
		drawn += cols[c].temperature > 0;
		/* (a scored token of logit -inf has logprob -inf on both) */
		double e = hlp == lp[c] ? 0.0 : fabs((double)hlp - lp[c]) / (1.0 > fabs(hlp) ? 1.0 : fabs(hlp));
		lp_err = e > lp_err ? e : lp_err;
		if (ht != t[c] || !(e <= 1e-5)) {
			if (bad < 5)
				printf("FAIL sampler (%s) column %d (T %g, top_k %d, top_p %g, seed %u): device token %d "
				       "logprob %g, host %d %g\n", what, c, (double)cols[c].temperature, cols[c].top_k,
				       (double)cols[c].top_p, cols[c].seed, t[c], (double)lp[c], ht, (double)hlp);
			bad++;
			continue;
		}
		for (int i = 0; i < n_top; i++) {
			const float dv = lps[(size_t)c * KN_CU_MAX_TOP + i];
			const double te = hlps[i] == dv ? 0.0 /* equal, -inf included */
					  : fabs((double)hlps[i] - dv) / (1.0 > fabs(hlps[i]) ? 1.0 : fabs(hlps[i]));
			if (hid[i] != ids[(size_t)c * KN_CU_MAX_TOP + i] || (hid[i] >= 0 && !(te <= 1e-5))) {
				if (bad < 5)
					printf("FAIL sampler (%s) column %d top %d: device id %d lp %g, host %d %g\n", what, c,
					       i, ids[(size_t)c * KN_CU_MAX_TOP + i], (double)dv, hid[i], (double)hlps[i]);
				bad++;
				break;
			}
		}
	}
	printf("%s  sampler %-28s vocab %6d%s, %3d columns (%3d drawn), top %2d: %d mismatches, logprob err %.1e\n",
	       bad ? "FAIL" : "ok  ", what, vocab, pieces ? " in pieces" : "", n, drawn, n_top, bad, lp_err);
	cudaFree(ws);
	cudaFree(dl); cudaFree(dc); cudaFree(dnt); cudaFree(dt); cudaFree(dlp); cudaFree(dids); cudaFree(dlps);
	return bad;
}

static void device_sampler_draws_the_host_samplers_tokens(void)
{
	static const float temps[] = { 0.f, 0.3f, 0.7f, 1.f, 1.5f };
	static const int topks[] = { 0, 1, 2, 5, 50, 1000 };
	static const float topps[] = { 1.f, 0.95f, 0.9f, 0.5f, 0.1f };
	for (int vocab : { 5003, 50021, 128256 }) {
		for (int kind = 0; kind < 5; kind++) {
			const int n = kind == 0 ? 150 : 40;
			std::vector<float> l((size_t)n * vocab);
			const char *what = "";
			for (int c = 0; c < n; c++) {
				float *r = &l[(size_t)c * vocab];
				const float scale = 1.f + (float)(c % 7) * 2.f;
				for (int i = 0; i < vocab; i++) {
					float v = frand() * scale;
					switch (kind) {
					case 0: what = "random"; break;
					case 1: what = "ties (few values)"; v = (float)((int)(frand() * 4.f)); break;
					case 2: what = "all equal"; v = 0.25f; break;
					case 3: what = "-inf and huge"; v = (i % 3 == 0) ? -INFINITY : v * 1e37f; break;
					default: what = "one peak, rest -inf"; v = i == (c * 977) % vocab ? 3.f : -INFINITY;
					}
					r[i] = v;
				}
			}
			std::vector<struct kn_column> cols(n);
			for (int c = 0; c < n; c++) {
				memset(&cols[c], 0, sizeof(cols[c]));
				cols[c].flags = c % 17 == 16 ? 0 : KN_COL_NEED_LOGIT;
				cols[c].slot = c;
				cols[c].pos = 3 * c + kind;
				cols[c].temperature = temps[c % 5];
				cols[c].top_k = topks[(c / 5) % 6];
				cols[c].top_p = topps[(c / 3) % 5];
				cols[c].seed = 1000u + 7u * (unsigned)c;
				if (c % 11 == 10) { /* a scored prompt token: the given one, drawn or not */
					cols[c].flags |= KN_COL_FORCE;
					cols[c].seed = (unsigned)((c * 7919) % vocab);
				}
			}
			for (int n_top : { 0, 5, 20 })
				for (int pieces = 0; pieces < (vocab >= 16384 ? 2 : 1); pieces++)
					g_fail += sampler_round(l, vocab, cols, n_top, what, pieces) != 0;
		}
	}
}

extern "C" int kn_cuda_test_ops_main(void)
{
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		printf("no CUDA device: skipped\n");
		return 77;
	}
	cublasHandle_t h;
	if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
		printf("cublasCreate failed\n");
		return 1;
	}
	/* KVFERRY_OPS_ONLY=WORD: only the tests whose name holds WORD (a kernel's
	 * short round on a leased GPU) */
	const char *only = getenv("KVFERRY_OPS_ONLY");
	int ran = 0;
#define OPS_RUN(call) do { if (!only || strstr(#call, only)) { call; ran++; } } while (0)
	OPS_RUN(skinny_and_wide_products_match_a_double_reference(h));
	OPS_RUN(the_wide_tensor_core_kernel_gives_each_column_its_narrow_bits_at_every_width());
	OPS_RUN(the_warpgroup_kernel_gives_each_column_the_same_bits_at_every_width());
	OPS_RUN(consumers_of_deferred_sums_give_the_folded_bits());
	OPS_RUN(add_rmsnorm_matches_reference());
	OPS_RUN(swiglu_matches_reference());
	OPS_RUN(bf16_producers_equal_their_f32_outputs_rounded());
	OPS_RUN(paged_attention_matches_reference());
	OPS_RUN(argmax_picks_the_lowest_id_among_ties());
	OPS_RUN(device_sampler_draws_the_host_samplers_tokens());
#undef OPS_RUN
	if (ran == 0) { /* a misspelt word must not look like a pass */
		printf("FAIL KVFERRY_OPS_ONLY=%s names no test (a word of a test's name: attention, sampler, ...)\n", only);
		g_fail++;
	}
	cublasDestroy(h);
	CHECK_CUDA(cudaDeviceSynchronize());
	printf("%s: %d failure(s)\n", g_fail ? "FAILED" : "PASSED", g_fail);
	return g_fail ? 1 : 0;
}
