/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One numerics family for the linear layers on Hopper's warpgroup MMA
 * (gemm_wg.cuh has the contract). The order of a column's sum, fixed by
 * `in` alone:
 *   - X rounded to bf16 (round to nearest even), W bf16, products summed in
 *     f32 by the tensor cores 16 k at a time (one wgmma k16 step), steps in
 *     increasing k into one accumulator per segment of the layer's
 *     wg_seg_of(in, out) k: all of `in` for layers of at least four rows
 *     an input (gate_up, the LM head), WG_SEG for the others;
 *   - the segments' sums added from 0 in segment order.
 * Which block computes which segment (all of a tile's segments in its
 * registers, or one segment each and a second kernel adding them) and how
 * wide the instruction is (N = 8..128 columns, 64 W rows a warpgroup) is
 * chosen per launch for speed; the order above does not change with it, so
 * neither do the bits (test_cuda_ops checks every width against width 1).
 *
 * Block: one to three warpgroups (wg_cfg). W streams through shared stages
 * of WG_BK k by cp.async, 128-byte swizzled as wgmma's descriptors read
 * it. Narrow plans (n <= 32) keep X resident in shared memory, WG_SEG k at
 * a time, rounded from f32 as it is loaded (no rounding pass); wider ones
 * stream X, rounded beforehand (kn_cuda_round_bf16()), beside W. Plans of
 * more than 32 columns run gemm_wgt_kernel instead: tensor copies (TMA)
 * from a producer warpgroup, one or two consumer warpgroups, mbarriers, the
 * same order and bits; above 256 columns in CTA pairs that share X's copies,
 * and down-shaped layers at 193-256 columns in pairs that share W's.
 * gemm_wgs_kernel gives the same sums on mma.sync, a segment a warp (plans
 * of at most 8 columns, where KVFERRY_WG_SKINNY asks for it).
 */
#include "gemm_wg.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.cuh"
#include "wgmma.cuh"

#define WG_BK 64       /* k per stage: one 128-byte row per operand row */
#define WG_SEG 512     /* k per segment of the sum */
#define WG_XRES_MAX 32 /* widest plan whose X stays resident */
#define WG_SMEM_MAX (227 * 1024)

/*
 * k per segment of a layer's sum: the shape alone fixes it (and the knob
 * below, read once a process), so every kernel and plan width sums a column
 * alike. Layers of at least four rows an input (gate_up, the LM head) take
 * all of `in` in one chain: their rows alone give narrow plans blocks
 * enough (8B gate_up 224 tiles of 128 rows, the LM head 1,002), and wide
 * plans then need no second accumulator, which lets their tiles be 256
 * columns. Narrower layers (qkv, o, down) keep WG_SEG: narrow plans run
 * their few row tiles in segment parts. H100, .dc/run7.sh (twenty-third
 * session), bench_cuda --gemm 2048, us, segments everywhere -> one chain:
 * 8B gate_up 725 -> 675, 1B LM head 1,701 -> 1,572 (cuBLAS 660 / 1,555);
 * decode steps within 3% either way at 1-256 columns (.dc/run5.sh).
 * KVFERRY_WG_ONE_CHAIN=0 (read once a process) gives every layer WG_SEG
 * again, for measuring: other bits, the same family. =2 gives every layer
 * one chain (measuring what wide plans gain and narrow plans lose).
 */
static int wg_one_chain = 1;

/*
 * k per segment of down-shaped layers (at least two inputs a row: the
 * 8B's down, 14,336 k, and the 1B's, 8,192). Their wide plans run tiles
 * too few to fill the GPU, so in segment parts, whose sums (4 bytes a
 * column, row and segment, written and read again) grow with the segments:
 * at 128 columns the 8B's 28 segments of 512 k wrote half as many bytes
 * as the weights, and without parts its 128 tiles each read as much X as
 * W from L2 (86.9 us against cuBLAS's 65.4, H100, .dc/run14.sh). Longer
 * segments cut both; narrow plans still get blocks enough. KVFERRY_WG_SEG_DOWN
 * (512, 1024, 2048 or 4096; read once a process): other bits, the same
 * family (every width alike).
 */
static int wg_seg_down = WG_SEG;

static int wg_seg_of(int in, int out)
{
	if ((wg_one_chain == 1 && (long)out >= 4L * in) || wg_one_chain == 2)
		return (in + WG_SEG - 1) / WG_SEG * WG_SEG;
	if (wg_one_chain == 1 && (long)in >= 2L * out && in > wg_seg_down)
		return wg_seg_down;
	return WG_SEG;
}

/* the segments of a layer's sum */
static int wg_nseg(int in, int out)
{
	const int sl = wg_seg_of(in, out);
	return (in + sl - 1) / sl;
}

/*
 * WGS warpgroups a block: MSPLIT, each takes 64 W rows of the block's
 * BM = 64 WGS and all BN columns; else (WGS = 2) both take the same 64 rows
 * and BN columns each. Narrow plans (XRES: two warpgroups a block, or one,
 * wg_narrow_wgs) wait for each stage's products (memory-bound: the tensor
 * pipe idles anyway); wider ones (two, or three above 128 columns) keep one
 * group of products in flight while the next is issued (PIPE), loads DIST
 * stages ahead.
 */
template <int BN_, bool MSPLIT_, bool XRES_, int WGS_> struct wg_cfg {
	static constexpr int BN = BN_, WGS = WGS_;
	static constexpr bool MSPLIT = MSPLIT_, XRES = XRES_, TMA = false;
	static constexpr int THREADS = WGS * 128;
	static constexpr int BM = MSPLIT ? 64 * WGS : 64;      /* W rows a block */
	static constexpr int BNB = MSPLIT ? BN : WGS * BN;     /* columns a block */
	static constexpr int W_BYTES = BM * 128;
	static constexpr int X_BYTES = XRES ? 0 : BNB * 128;
	static constexpr int STAGE = W_BYTES + X_BYTES;
	static constexpr int XRES_BYTES = XRES ? BNB * 128 * (WG_SEG / WG_BK) : 0;
	static constexpr int STAGES = (6 * STAGE + XRES_BYTES + 1024 <= WG_SMEM_MAX) ? 6 : 5;
	static constexpr int PIPE = XRES ? 0 : 1;
	static constexpr int DIST = STAGES - 1 - PIPE;
	static constexpr int SMEM = STAGE * STAGES + XRES_BYTES + 1024; /* + alignment */
};

/* helpers the compute_90 PTX pass (no wgmma: the kernel traps) leaves unused */
#define WG_DEV static __device__ __forceinline__ __attribute__((unused))

WG_DEV uint32_t smem_u32(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}

/* Descriptor of a K-major bf16 tile with 128-byte swizzle: rows of 128
 * bytes, 8-row groups 1,024 bytes apart (the tile 1,024-aligned). */
WG_DEV uint64_t desc_sw128(uint32_t addr)
{
	return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
	       ((uint64_t)1 << 62);
}

/* byte offset of 16-byte chunk c of row r in a 128-byte swizzled tile */
WG_DEV int sw128(int r, int c)
{
	return r * 128 + ((c ^ (r & 7)) << 4);
}

WG_DEV void cp16(void *dst, const void *src, bool ok)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src),
		     "r"(ok ? 16 : 0)
		     : "memory");
}

WG_DEV void cp_commit(void)
{
	asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N> WG_DEV void cp_wait(void)
{
	asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

WG_DEV void wg_fence_operands(float *d, int n)
{
#pragma unroll
	for (int i = 0; i < n; i++)
		asm volatile("" : "+f"(d[i])::"memory");
}

/* a warpgroup's m64nBN sums, its 64 rows from @p row0 and BN columns from
 * @p col0, into dst[column][row] (rows past @p out, columns past @p n left) */
template <int BN> WG_DEV void wg_store(const float *tot, float *dst, int row0, int col0, int n, int out)
{
	const int warp = (threadIdx.x & 127) >> 5, lane = threadIdx.x & 31;
	const int rb = row0 + warp * 16 + (lane >> 2), cb = col0 + 2 * (lane & 3);
#pragma unroll
	for (int e = 0; e < BN / 2; e++) {
		const int r = rb + 8 * ((e >> 1) & 1), c = cb + 8 * (e >> 2) + (e & 1);
		if (r < out && c < n)
			dst[(size_t)c * out + r] = tot[e];
	}
}

/*
 * grid (ceil(n / BNB), ceil(out / BM), parts ? segments : 1), block THREADS,
 * dynamic shared memory wg_cfg::SMEM. With parts, block z sums segment z
 * into part + z n out; else each block sums all of its tile's segments.
 */
template <int BN, bool MSPLIT, bool XRES, int WGS>
static __global__ void __launch_bounds__(WGS * 128, 1)
gemm_wg_kernel(const kn_bf16 *__restrict__ w, const float *x, const kn_bf16 *xb, float *y, float *part, int n,
	       int in, int out, int seg)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
	using C = wg_cfg<BN, MSPLIT, XRES, WGS>;
	constexpr int S = C::STAGES, D = C::DIST, T = C::THREADS;
	extern __shared__ unsigned char wg_smem_raw[];
	unsigned char *sm = (unsigned char *)(((uintptr_t)wg_smem_raw + 1023) & ~(uintptr_t)1023);
	unsigned char *xres = sm + S * C::STAGE;
	const int tid = threadIdx.x, wg = tid >> 7;
	const int row0 = blockIdx.y * C::BM, col0 = blockIdx.x * C::BNB;
	const int nseg = (in + seg - 1) / seg;
	const bool parts = gridDim.z > 1;
	const int s0 = parts ? blockIdx.z : 0, s1 = parts ? blockIdx.z + 1 : nseg;
	const int kbeg = s0 * seg, kend = min(s1 * seg, in);
	const int nch = (kend - kbeg + WG_BK - 1) / WG_BK;

	auto load_w = [&](int i) {
		const int k0 = kbeg + i * WG_BK;
		unsigned char *dst = sm + (i % S) * C::STAGE;
#pragma unroll
		for (int u = tid; u < C::BM * 8; u += T) {
			const int r = u >> 3, c = u & 7, gr = row0 + r, gk = k0 + c * 8;
			const bool ok = gr < out && gk < in;
			cp16(dst + sw128(r, c), w + (ok ? (size_t)gr * in + gk : 0), ok);
		}
	};
	auto load_x = [&](int i) {
		const int k0 = kbeg + i * WG_BK;
		unsigned char *dst = sm + (i % S) * C::STAGE + C::W_BYTES;
#pragma unroll
		for (int u = tid; u < C::BNB * 8; u += T) {
			const int r = u >> 3, c = u & 7, gc = col0 + r, gk = k0 + c * 8;
			const bool ok = gc < n && gk < in;
			cp16(dst + sw128(r, c), xb + (ok ? (size_t)gc * in + gk : 0), ok);
		}
	};
	/* WG_SEG k of X from @p k0 (a window: a segment's start, or every
	 * WG_SEG k of a longer one), rounded to bf16, as WG_SEG / WG_BK swizzled
	 * tiles: a thread's loads go out 8 at a time before the first is used */
	auto load_xres = [&](int k0) {
		constexpr int U = C::BNB * (WG_SEG / 8) / T, V = U < 8 ? U : 8;
#pragma unroll
		for (int v0 = 0; v0 < U; v0 += V) {
			float4 a[V], b[V];
#pragma unroll
			for (int v = 0; v < V; v++) {
				const int u = tid + (v0 + v) * T;
				const int r = u / (WG_SEG / 8), kk = (u % (WG_SEG / 8)) * 8, gc = col0 + r, gk = k0 + kk;
				a[v] = b[v] = make_float4(0.f, 0.f, 0.f, 0.f);
				if (gc < n && gk < in) {
					a[v] = kn_ld_f4(x + (size_t)gc * in + gk);
					b[v] = kn_ld_f4(x + (size_t)gc * in + gk + 4);
				}
			}
#pragma unroll
			for (int v = 0; v < V; v++) {
				const int u = tid + (v0 + v) * T;
				const int r = u / (WG_SEG / 8), kk = (u % (WG_SEG / 8)) * 8;
				__nv_bfloat162 h[4] = { __floats2bfloat162_rn(a[v].x, a[v].y),
							__floats2bfloat162_rn(a[v].z, a[v].w),
							__floats2bfloat162_rn(b[v].x, b[v].y),
							__floats2bfloat162_rn(b[v].z, b[v].w) };
				*reinterpret_cast<uint4 *>(xres + (kk / WG_BK) * (C::BNB * 128) +
							   sw128(r, (kk % WG_BK) / 8)) = *reinterpret_cast<const uint4 *>(h);
			}
		}
	};

	float acc[BN / 2], tot[BN / 2];
#pragma unroll
	for (int i = 0; i < BN / 2; i++)
		acc[i] = tot[i] = 0.f;

	/* the weights' first stages go out before waiting for X's producer */
#pragma unroll
	for (int i = 0; i < D; i++)
		if (i < nch)
			load_w(i);
	kn_pdl_wait();
	kn_pdl_trigger();
#pragma unroll
	for (int i = 0; i < D; i++) {
		if (!XRES && i < nch)
			load_x(i);
		cp_commit();
	}

	const uint32_t wg_w = MSPLIT ? wg * 64 * 128 : 0, wg_x = MSPLIT ? 0 : wg * BN * 128;
	/* chunk i's place in its segment, counted (kbeg starts a segment), not
	 * k0 % seg: a division by the runtime seg a chunk cost the TMA kernel,
	 * which counts the same way, up to 40% (H100, bench_cuda --gemm 2048,
	 * us, divided -> counted: 8B down 592 -> 431, o 181 -> 133, gate_up 778
	 * -> 675; 2,048-token prefill 8B 78.4 -> 67.7 ms) */
	const int segc = seg / WG_BK;
	int sc = 0;
	for (int i = 0; i < nch; i++) {
		const int k0 = kbeg + i * WG_BK;
		const bool first = sc == 0, last = i == nch - 1 || sc == segc - 1;
		sc = sc + 1 == segc ? 0 : sc + 1;
		cp_wait<D - 1>(); /* chunk i's group */
		if (XRES && k0 % WG_SEG == 0) {
			__syncthreads(); /* every warpgroup is done with the last window of X */
			load_xres(k0);
		}
		asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
		/* chunk i landed for all; the stage D chunks on was read by products
		 * that every warpgroup has waited for (PIPE groups back) */
		__syncthreads();
		if (i + D < nch) {
			load_w(i + D);
			if (!XRES)
				load_x(i + D);
		}
		cp_commit();

		const unsigned char *st = sm + (i % S) * C::STAGE;
		const uint32_t a0 = smem_u32(st) + wg_w;
		const uint32_t b0 = (XRES ? smem_u32(xres) + ((k0 % WG_SEG) / WG_BK) * (C::BNB * 128)
					  : smem_u32(st + C::W_BYTES)) + wg_x;
		if (C::PIPE == 0)
			wg_fence_operands(acc, BN / 2);
		asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
		for (int j = 0; j < WG_BK / 16; j++)
			wg_mma_n<BN>::run(acc, desc_sw128(a0 + 32 * j), desc_sw128(b0 + 32 * j), first && j == 0 ? 0 : 1);
		asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
		if (last || C::PIPE == 0) {
			asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
			wg_fence_operands(acc, BN / 2);
			if (last)
#pragma unroll
				for (int e = 0; e < BN / 2; e++)
					tot[e] += acc[e];
		} else {
			asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
		}
	}
	cp_wait<0>();

	wg_store<BN>(tot, parts ? part + (size_t)blockIdx.z * n * out : y, row0 + (MSPLIT ? wg * 64 : 0),
		     col0 + (MSPLIT ? 0 : wg * BN), n, out);
#else
	(void)w, (void)x, (void)xb, (void)y, (void)part, (void)n, (void)in, (void)out, (void)seg;
	__trap();
#endif
}

/*
 * The kernel on TMA: the same order and bits as gemm_wg_kernel, laid out as
 * Hopper wants a GEMM fed. Warpgroup 0 is the producer: one thread issues a
 * stage's two tensor copies (W's BM rows, X's BN columns, 64 k each,
 * 128-byte swizzled by the copy engine as the wgmma descriptors read them)
 * and the stage's full barrier counts their bytes; it gives its registers
 * to the consumers (setmaxnreg). Warpgroups 1..CONS each own 64 W rows by
 * BN columns: m64nBN products, one group kept in flight, and a stage goes
 * back to the producer through its empty barrier once all have read it. No
 * block barrier in the loop, no thread computing addresses. BN 192 keeps a
 * running sum and the total (96 + 96 registers) per thread: the widest tile
 * whose segment fold still fits in registers. BN 256 keeps only the sum
 * (128 registers): layers of one segment (wg_seg_of()).
 */
template <int BN_, int CONS_, int CL_ = 1, bool CW_ = false> struct wgt_cfg {
	static constexpr int BN = BN_, CONS = CONS_, CL = CL_, WGS = CONS_ + 1, THREADS = 128 * WGS, BM = 64 * CONS, BNB = BN_;
	/* CW: the cluster's CTAs take adjacent column tiles of one row tile and
	 * share W's stage; else adjacent row tiles sharing X's */
	static constexpr bool CW = CW_;
	/* X columns / W rows of a stage this CTA copies (for the whole cluster) */
	static constexpr int XH = CW_ ? BN_ : BN_ / CL_, WH = CW_ ? BM / CL_ : BM;
	static constexpr bool MSPLIT = true, XRES = false, TMA = true;
	static constexpr int W_BYTES = BM * 128, X_BYTES = BN * 128, STAGE = W_BYTES + X_BYTES;
	static constexpr int STAGES = (WG_SMEM_MAX - 2048) / STAGE > 8 ? 8 : (WG_SMEM_MAX - 2048) / STAGE;
	static constexpr int SMEM = STAGE * STAGES + 1024 + 256; /* + alignment, barriers */
	static_assert(STAGES >= 2, "a consumer holds one stage while it waits for the next");
};

WG_DEV void mbar_init(uint64_t *b, int count)
{
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}

WG_DEV void mbar_expect_tx(uint64_t *b, uint32_t bytes)
{
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}

WG_DEV void mbar_arrive(uint64_t *b)
{
	asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}

/* until the phase of parity @p parity has completed */
WG_DEV void mbar_wait(uint64_t *b, uint32_t parity)
{
	uint32_t done = 0;
	do {
		asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
			     "selp.u32 %0, 1, 0, p;\n}\n"
			     : "=r"(done)
			     : "r"(smem_u32(b)), "r"(parity)
			     : "memory");
	} while (!done);
}

/* box (k0, r0) of the 2-D tensor map @p tm into @p dst, counted on @p bar */
WG_DEV void tma_load(void *dst, const CUtensorMap *tm, uint64_t *bar, int k0, int r0)
{
	asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], "
		     "[%2];" ::"r"(smem_u32(dst)),
		     "l"((uint64_t)tm), "r"(smem_u32(bar)), "r"(k0), "r"(r0)
		     : "memory");
}

/* the same box into the same offset of every CTA of the cluster in @p mask,
 * counted on each one's barrier at @p bar's offset */
WG_DEV void tma_load_mc(void *dst, const CUtensorMap *tm, uint64_t *bar, int k0, int r0, uint16_t mask)
{
	asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
		     "[%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_u32(dst)),
		     "l"((uint64_t)tm), "r"(smem_u32(bar)), "r"(k0), "r"(r0), "h"(mask)
		     : "memory");
}

/* arrive on the barrier at @p b's offset in cluster CTA @p cta (release at
 * CTA scope, as for a local arrive: what it orders is this warpgroup's
 * finished reads of the stage) */
WG_DEV void mbar_arrive_cta(uint64_t *b, uint32_t cta)
{
	asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
		     "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smem_u32(b)),
		     "r"(cta)
		     : "memory");
}

WG_DEV void cluster_sync(void)
{
	asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

WG_DEV uint32_t cluster_rank(void)
{
	uint32_t r;
	asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
	return r;
}

/* One unit of a TMA kernel's work: a tile of BM rows by BN columns and the
 * k of one segment (products in parts) or of all (else). Units are numbered
 * column tiles first, then segments, then row tiles: the blocks that run
 * together share W's rows. */
struct wgt_unit {
	int row0, col0, seg, kbeg, nch;
};

WG_DEV wgt_unit wgt_unit_of(int u, int nct, int nsp, int bm, int bn, int in, int seg, int nseg, int cl = 1,
			    int rank = 0, bool cw = false)
{
	/* cw: a unit is CL adjacent column tiles of one row tile (nct counts
	 * those groups), the CTA of rank r taking the group's r-th */
	const int g = u % nct, r = u / nct, sg = r % nsp;
	const int ct = cw ? g * cl + rank : g, rt = cw ? r / nsp : (r / nsp) * cl + rank;
	const int s0 = nsp > 1 ? sg : 0, s1 = nsp > 1 ? sg + 1 : nseg;
	const int kbeg = s0 * seg, kend = min(s1 * seg, in);
	return wgt_unit{ rt * bm, ct * bn, sg, kbeg, (kend - kbeg + WG_BK - 1) / WG_BK };
}

/*
 * grid: any number of blocks up to the units (persistent: block b takes
 * units b, b + grid, ...; the producer's copies run on from one unit into
 * the next while the consumers store the last one's sums). With parts
 * (@p part not NULL) a unit sums one segment into part + seg n out.
 */
template <int BN, int CONS, int CL, bool CW>
static __global__ void __launch_bounds__(128 * (CONS + 1), 1)
gemm_wgt_kernel(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx, float *y, float *part,
		int n, int in, int out, int seg)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
	using C = wgt_cfg<BN, CONS, CL, CW>;
	constexpr int S = C::STAGES;
	extern __shared__ unsigned char wg_smem_raw[];
	unsigned char *sm = (unsigned char *)(((uintptr_t)wg_smem_raw + 1023) & ~(uintptr_t)1023);
	uint64_t *full = (uint64_t *)(sm + S * C::STAGE), *empty = full + S;
	const int tid = threadIdx.x, wg = tid >> 7;
	const int nseg = (in + seg - 1) / seg, nsp = part ? nseg : 1, segc = seg / WG_BK;
	/* units of CL row tiles, or with CW of CL column tiles (the cluster's
	 * CTAs take one each, in step); nct: column tiles, or their groups */
	const int rtiles = (out + C::BM - 1) / C::BM, ctiles = (n + BN - 1) / BN;
	const int nct = CW ? (ctiles + CL - 1) / CL : ctiles, units = nct * (CW ? rtiles : (rtiles + CL - 1) / CL) * nsp;
	const int rank = CL > 1 ? (int)cluster_rank() : 0, first = blockIdx.x / CL, step = gridDim.x / CL;

	if (tid == 0) {
		for (int s = 0; s < S; s++) {
			mbar_init(&full[s], 1);
			mbar_init(&empty[s], CONS * CL); /* every consumer of the cluster reads the X (W) it copies */
		}
		asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
	}
	if (CL > 1)
		cluster_sync();
	else
		__syncthreads();
	/* X's share of a stage: all of it, or this CTA's part, copied into every
	 * CTA of the cluster; with CW the same for W's rows, and X its own */
	auto load_x = [&](int s, int k0, int col0) {
		unsigned char *dst = sm + s * C::STAGE + C::W_BYTES + (CW ? 0 : rank * C::XH * 128);
		if (CL > 1 && !CW)
			tma_load_mc(dst, &tx, &full[s], k0, col0 + rank * C::XH, (uint16_t)((1 << CL) - 1));
		else
			tma_load(dst, &tx, &full[s], k0, col0);
	};
	auto load_w = [&](int s, int k0, int row0) {
		unsigned char *dst = sm + s * C::STAGE + (CW ? rank * C::WH * 128 : 0);
		if (CW)
			tma_load_mc(dst, &tw, &full[s], k0, row0 + rank * C::WH, (uint16_t)((1 << CL) - 1));
		else
			tma_load(dst, &tw, &full[s], k0, row0);
	};

	if (wg == 0) {
		if (CONS > 1)
			asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
		if (tid == 0) {
			/* the weights' first stages go out before waiting for X's producer */
			int pre = 0;
			for (int u = first; u < units && pre < S; u += step) {
				const wgt_unit t = wgt_unit_of(u, nct, nsp, C::BM, BN, in, seg, nseg, CL, rank, CW);
				for (int i = 0; i < t.nch && pre < S; i++, pre++) {
					mbar_expect_tx(&full[pre], C::STAGE);
					load_w(pre, t.kbeg + i * WG_BK, t.row0);
				}
			}
			kn_pdl_wait();
			kn_pdl_trigger();
			int it = 0; /* this block's chunks so far: stage it % S, phase it / S */
			for (int u = first; u < units; u += step) {
				const wgt_unit t = wgt_unit_of(u, nct, nsp, C::BM, BN, in, seg, nseg, CL, rank, CW);
				for (int i = 0; i < t.nch; i++, it++) {
					const int s = it % S, k0 = t.kbeg + i * WG_BK;
					if (it >= pre) {
						/* with CL > 1 also every peer's consumers are done with
						 * stage s: this CTA's copy of X (W) goes into theirs too */
						mbar_wait(&empty[s], ((it / S) - 1) & 1);
						mbar_expect_tx(&full[s], C::STAGE);
						load_w(s, k0, t.row0);
					}
					load_x(s, k0, t.col0);
				}
			}
		} else {
			kn_pdl_wait();
		}
		__syncwarp();
		if (CL > 1)
			cluster_sync(); /* a peer may still copy into this CTA, or arrive on its barriers */
		return;
	}

	if (CONS > 1)
		asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
	const int c = wg - 1;
	/* the arriving threads: lane 0 of warp r of the warpgroup on CTA r's barrier */
	const bool signal = (tid & 127) % 32 == 0 && (tid & 127) / 32 < CL;
	auto release = [&](int st) {
		if (CL > 1)
			mbar_arrive_cta(&empty[st], (uint32_t)((tid & 127) / 32));
		else
			mbar_arrive(&empty[st]);
	};
	/* 256-column tiles run only layers of one segment (the launch refuses
	 * others): the total is 0 + the one chain, added at the store */
	constexpr bool TOT = BN <= 192;
	float acc[BN / 2], tot[TOT ? BN / 2 : 1];
	bool waited = false;
	int it = 0;
	for (int u = first; u < units; u += step) {
		const wgt_unit t = wgt_unit_of(u, nct, nsp, C::BM, BN, in, seg, nseg, CL, rank, CW);
#pragma unroll
		for (int e = 0; e < BN / 2; e++)
			acc[e] = 0.f;
		if constexpr (TOT)
#pragma unroll
			for (int e = 0; e < BN / 2; e++)
				tot[e] = 0.f;
		int held = -1; /* a stage whose products are issued, not yet waited for */
		int sc = 0;    /* chunk i's place in its segment (a unit starts one; see gemm_wg_kernel) */
		for (int i = 0; i < t.nch; i++, it++) {
			const int s = it % S;
			const bool first = sc == 0, last = i == t.nch - 1 || sc == segc - 1;
			sc = sc + 1 == segc ? 0 : sc + 1;
			mbar_wait(&full[s], (it / S) & 1);
			const uint32_t a0 = smem_u32(sm + s * C::STAGE) + c * 64 * 128;
			const uint32_t b0 = smem_u32(sm + s * C::STAGE + C::W_BYTES);
			asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
			for (int j = 0; j < WG_BK / 16; j++)
				wg_mma_n<BN>::run(acc, desc_sw128(a0 + 32 * j), desc_sw128(b0 + 32 * j),
						  first && j == 0 ? 0 : 1);
			asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
			if (last) {
				asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
				wg_fence_operands(acc, BN / 2);
				if constexpr (TOT)
#pragma unroll
					for (int e = 0; e < BN / 2; e++)
						tot[e] += acc[e];
				if (signal) {
					if (held >= 0)
						release(held);
					release(s);
				}
				held = -1;
			} else {
				asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
				if (signal && held >= 0)
					release(held);
				held = s;
			}
		}
		if (!waited) {
			kn_pdl_wait();
			waited = true;
		}
		if constexpr (!TOT) /* 0 + the chain: as a segment total, -0 becomes +0 */
#pragma unroll
			for (int e = 0; e < BN / 2; e++)
				acc[e] = 0.f + acc[e];
		wg_store<BN>(TOT ? tot : acc, part ? part + (size_t)t.seg * n * out : y, t.row0 + c * 64, t.col0, n, out);
	}
	if (!waited)
		kn_pdl_wait();
	if (CL > 1)
		cluster_sync();
#else
	(void)tw, (void)tx, (void)y, (void)part, (void)n, (void)in, (void)out, (void)seg;
	__trap();
#endif
}

/*
 * The family on mma.sync at 1-8 columns (KVFERRY_WG_SKINNY): the same
 * order as the warpgroup kernels, so the same bits (an m16n8k16 product is a
 * wgmma k16 step to the bit: test_cuda_ops checks every width against each
 * column alone), with no second kernel. A warp takes one segment of 16 W
 * rows and 8 columns: its k16 steps in increasing k into one accumulator.
 * The weights stream through a ring of WGS_STAGES 64-k chunks of the warp's
 * own in shared memory by cp.async, read back by ldmatrix in the fragments'
 * own layout (kept in registers instead, two blocks an SM fit and the weight
 * stream reached half of HBM's). The block's warps cover its rows' segments
 * (ru row units each), leave the sums in shared memory, and the block adds
 * them in segment order. WB (KVFERRY_WGS_WB=1): W as the instruction's B
 * operand and X as its A, a warp 8 rows: the same bits again. Not the
 * default: on an H100 either tied the warpgroup kernels at 8B batch 1 and
 * lost on the 1B and at 8 columns (each warp loads its own X;
 * kernels/cuda/NOTES.md).
 *
 * grid (ceil(out / (R ru)), ceil(n / 8)) with R = 16 (8 with WB), block 32
 * x warps, dynamic shared memory wgs_shape(). KVFERRY_WGS_WARPS asking for
 * more than fits runs the warpgroup kernels instead.
 */
#define WGS_STAGES 4 /* 8 (a warp's whole segment in flight) measured slower */

WG_DEV void wgs_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

WG_DEV void wgs_ldsm_x4(uint32_t *r, uint32_t addr)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(addr)
		     : "memory");
}

WG_DEV void wgs_ldsm_x2(uint32_t *r, uint32_t addr)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr) : "memory");
}

/* X, written by the kernel before: a coherent load, after kn_pdl_wait() */
WG_DEV float2 wgs_ld_f2(const float *p)
{
	float2 r;
	asm volatile("ld.global.v2.f32 {%0,%1}, [%2];" : "=f"(r.x), "=f"(r.y) : "l"(p));
	return r;
}

WG_DEV uint32_t wgs_bf2(float a, float b)
{
	const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
	return *reinterpret_cast<const uint32_t *>(&h);
}

template <bool WB>
static __global__ void __launch_bounds__(512)
gemm_wgs_kernel(const kn_bf16 *__restrict__ w, const float *x, float *__restrict__ y, int n, int in, int out, int ru,
		int sl)
{
	extern __shared__ __align__(128) unsigned char wgs_smem_raw[];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
	const int g = lane >> 2, t = lane & 3;
	constexpr int R = WB ? 8 : 16, CH = R * WG_BK * 2; /* a unit's rows, a chunk's bytes */
	const int nseg = (in + sl - 1) / sl, rows = ru * R;
	const int row0 = blockIdx.x * rows, col0 = blockIdx.y * 8;
	/* [warp][stage] chunks (R rows of 128 bytes, 16-byte pieces swizzled by
	 * row), then the sums [segment][rows][8 columns] */
	unsigned char *ring = wgs_smem_raw + (size_t)warp * WGS_STAGES * CH;
	float *sums = reinterpret_cast<float *>(wgs_smem_raw + (size_t)warps * WGS_STAGES * CH);
	const bool xon = col0 + g < n;
	const float *xc = x + (size_t)(xon ? col0 + g : 0) * in;
	/* ldmatrix: lane l gives row (l / 8 % 2) 8 + l % 8 of matrix l / 8, its
	 * k half l / 16: matrices 0..3 = a0..a3; WB (W as the B operand, 8 rows):
	 * row l % 8, k half l / 8 % 2, matrices 0, 1 = b0, b1 */
	const int lrow = WB ? (lane & 7) : ((lane >> 3) & 1) * 8 + (lane & 7), lhalf = WB ? (lane >> 3) & 1 : lane >> 4;
	bool waited = false;

	for (int u = warp; u < nseg * ru; u += warps) {
		const int seg = u / ru, rr = u % ru;
		const int kb = seg * sl, ke = min(kb + sl, in), nch = (ke - kb + WG_BK - 1) / WG_BK;
		const int rbase = row0 + rr * R;
		/* chunk i into stage i % WGS_STAGES: lane l copies pieces l + 32 j */
		auto issue = [&](int i) {
			unsigned char *st = ring + (i % WGS_STAGES) * CH;
#pragma unroll
			for (int j = 0; j < R / 4; j++) {
				const int q = lane + 32 * j, r = q >> 3, c = q & 7, k = kb + i * WG_BK + c * 8;
				const bool ok = k < ke;
				cp16(st + r * 128 + ((c ^ (r & 7)) << 4),
				     w + (ok ? (size_t)min(rbase + r, out - 1) * in + k : 0), ok);
			}
		};
		float acc[4] = { 0.f, 0.f, 0.f, 0.f };
#pragma unroll
		for (int i = 0; i < WGS_STAGES - 1; i++) {
			if (i < nch)
				issue(i);
			cp_commit();
		}
		/* the weights never change: their first chunks go out before
		 * waiting for the kernel that writes X */
		if (!waited) {
			kn_pdl_wait();
			kn_pdl_trigger();
			waited = true;
		}
		for (int i = 0; i < nch; i++) {
			if (i + WGS_STAGES - 1 < nch)
				issue(i + WGS_STAGES - 1);
			cp_commit();
			uint32_t b[4][2];
#pragma unroll
			for (int j = 0; j < 4; j++) {
				const int k = kb + i * WG_BK + 16 * j + 2 * t;
				const float2 v0 = xon && k < ke ? wgs_ld_f2(xc + k) : make_float2(0.f, 0.f);
				const float2 v1 = xon && k + 8 < ke ? wgs_ld_f2(xc + k + 8) : make_float2(0.f, 0.f);
				b[j][0] = wgs_bf2(v0.x, v0.y), b[j][1] = wgs_bf2(v1.x, v1.y);
			}
			cp_wait<WGS_STAGES - 1>(); /* chunk i */
			__syncwarp();
			const uint32_t st = smem_u32(ring + (i % WGS_STAGES) * CH);
#pragma unroll
			for (int j = 0; j < 4; j++) {
				if (kb + i * WG_BK + 16 * j >= ke)
					break;
				const int c = 2 * j + lhalf;
				const uint32_t at = st + lrow * 128 + ((c ^ (lrow & 7)) << 4);
				if (WB) { /* X as the A operand (its rows g + 8 zero) */
					uint32_t wb[2];
					const uint32_t xa[4] = { b[j][0], 0u, b[j][1], 0u };
					wgs_ldsm_x2(wb, at);
					wgs_mma(acc, xa, wb[0], wb[1]);
				} else {
					uint32_t a[4];
					wgs_ldsm_x4(a, at);
					wgs_mma(acc, a, b[j][0], b[j][1]);
				}
			}
			__syncwarp(); /* the stage is read: issue() may fill it again */
		}
		cp_wait<0>();
		/* C fragment: [0..1] row g, columns 2t, 2t + 1; [2..3] row g + 8 (WB:
		 * X's column g, W's rows 2t, 2t + 1; [2..3] nothing) */
		float *d = sums + ((size_t)seg * rows + rr * R) * 8;
		if (WB) {
			d[(2 * t) * 8 + g] = acc[0];
			d[(2 * t + 1) * 8 + g] = acc[1];
		} else {
			d[g * 8 + 2 * t] = acc[0];
			d[g * 8 + 2 * t + 1] = acc[1];
			d[(g + 8) * 8 + 2 * t] = acc[2];
			d[(g + 8) * 8 + 2 * t + 1] = acc[3];
		}
	}
	if (!waited) {
		kn_pdl_wait();
		kn_pdl_trigger();
	}
	__syncthreads();
	for (int e = threadIdx.x; e < rows * 8; e += blockDim.x) {
		const int r = e % rows, c = e / rows;
		if (row0 + r >= out || col0 + c >= n)
			continue;
		float v = 0.f;
		for (int s = 0; s < nseg; s++)
			v += sums[((size_t)s * rows + r) * 8 + c];
		y[(size_t)(col0 + c) * out + row0 + r] = v;
	}
}

/* y = the segments' sums added from 0 in segment order, as one block adds them */
static __global__ void __launch_bounds__(256) wg_fold_kernel(const float *part, float *__restrict__ y, size_t count,
							     int nseg)
{
	kn_pdl_wait();
	kn_pdl_trigger();
	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < count; e += (size_t)gridDim.x * blockDim.x) {
		float v = 0.f;
		for (int s = 0; s < nseg; s++)
			v += part[(size_t)s * count + e];
		y[e] = v;
	}
}

static int wg_sms = -1;

/* Launch choices (not the bits), read once: KVFERRY_WG_NARROW_WGS (1, 2 or 4
 * warpgroups a block for plans of at most WG_XRES_MAX columns; default:
 * wg_pick()'s rule),
 * KVFERRY_WG_PARTS (1, the default: wg_parts_for()'s rule; 0: parts
 * whenever there are fewer tiles than two waves). For measuring; what was
 * measured is in kernels/cuda/NOTES.md. */
static int wg_narrow_wgs = 0, wg_parts_policy = 1;

/* KVFERRY_WG_TMA: 0 keeps plans above 128 columns on gemm_wg_kernel; 8..192
 * forces that tile width of gemm_wgt_kernel (256: on layers of one chain,
 * 192 on the others); default (-1): the TMA
 * kernel, its width chosen by wg_pick(). Also off when the driver has no
 * cuTensorMapEncodeTiled. */
static int wg_tma = -1;

/* KVFERRY_WG_CONS=1|2 forces the TMA kernel's consumer warpgroups a block
 * (default: wg_pick()'s rule); KVFERRY_WG_TMA_FROM=N (at least 1): the
 * narrowest plan on the TMA kernel (default: wg_pick()'s rule; at 48-128
 * columns it beat the cp.async kernel on every layer of the 1B and 8B
 * shapes, .devcarry/run12.sh); KVFERRY_WG_PERSIST=0: a block for each unit
 * of the TMA kernel's work (default: at most one block an SM, each taking
 * units in turn). For measuring. */
static int wg_cons = 0, wg_tma_from = 0, wg_persist = 1;

/* The TMA kernel's 128- and 192-column tiles (two consumers) in CTA pairs
 * on adjacent row tiles, each CTA copying half of X's stage into both (TMA
 * multicast): X's reads from L2 halved. Above 256 columns, where the
 * kernel was bound by L2 (ncu, H100, 8B gate_up at 2,048 columns: L2 83%
 * busy, SMs 67%; cuBLAS 65% / 88%). H100, .devcarry/run10.sh, us, alone /
 * in pairs: 8B gate_up at 2,048 columns 963 -> 782 (cuBLAS 646), 8B down
 * 517 -> 417 (356), 1B LM head 2,034 -> 1,774 (1,541); at 256 columns
 * none won (8B gate_up 127 -> 132). KVFERRY_WG_CLUSTER=1 never, 2 at every
 * width the tiles allow. (Clusters of four, X's reads quartered, lost:
 * 8B prefill 73.6 -> 80.4 ms, kernels/cuda/NOTES.md.) */
static int wg_cluster = 0;

/* KVFERRY_WG_WAVES: above 256 columns the TMA kernel's tile width (128 or
 * 192) priced by its waves over the SMs, not only by the columns it wastes
 * (wg_pick()); 1, the default; 0: columns only. For measuring. */
static int wg_waves = 1;

/* KVFERRY_WG_256=0: layers of one chain keep the 128- and 192-column tiles
 * above 256 columns (default: 256 columns in CTA pairs, wg_pick()). For
 * measuring; KVFERRY_WG_TMA=256 asks for them wherever the layer allows
 * (else 192). */
static int wg_256 = 1;

/* CTA pairs along columns that share W's stage (each copies half its rows
 * into both), so W leaves L2 once per pair of column tiles: for plans of
 * 65-256 columns whose 64- or 128-column tiles come two or more to a row
 * tile. By default only where that measured faster: layers of at least two
 * inputs a row (down) at an even number of column tiles, four or more.
 * H100 (.dc/run10.sh, twenty-third session, us, single -> pairs): 8B down
 * at 256 columns 95.4 -> 84.7 (cuBLAS 74); but at 192 76.4 -> 82.9, 8B o at
 * 256 29.4 -> 33.4, qkv 36.3 -> 38.4. KVFERRY_WG_WPAIRS=1 pairs every plan
 * it can, tiles of one consumer too (not measured yet), =0 none (for
 * measuring; the same bits: forced ways 15 to 18). */
static int wg_wpairs = -1;

/* KVFERRY_WG_XB16=0: kn_cuda_gemm_wg_takes_bf16() answers no, so the
 * engine's producers write f32 and X is rounded in a pass of its own (H200,
 * 8B decode at batch 64 and 256: 7.97 / 16.06 ms with the pass, 7.77 /
 * 15.60 without). For measuring. */
static int wg_xb16 = 1;
/* KVFERRY_WG_SKINNY: the widest plan on gemm_wgs_kernel (1..8; default 0,
 * none: on an H100 it tied the warpgroup kernels at 8B batch 1 and lost
 * elsewhere, kernels/cuda/NOTES.md); KVFERRY_WGS_WARPS: its warps a block;
 * KVFERRY_WGS_WB=1: W as the B operand. For measuring: the bits do not
 * change. */
static int wgs_max = 0, wgs_warps = 0, wgs_wb = 0;

/*
 * gemm_wgs_kernel's launch for a product of this shape: a block's warps,
 * one for each segment of its rows, at most 8; products of fewer than 4
 * segments take ru row units a block so that 4 warps or more share it.
 * @return its shared memory (each warp's ring, the block's sums).
 */
static size_t wgs_shape(int in, int out, int *warps, int *ru, bool wb = false)
{
	const int nseg = wg_nseg(in, out), r = wb ? 8 : 16;
	*ru = nseg < 4 ? (4 + nseg - 1) / nseg : 1;
	*warps = wgs_warps ? wgs_warps : nseg * *ru < 8 ? nseg * *ru : 8;
	return (size_t)*warps * WGS_STAGES * r * WG_BK * 2 + (size_t)nseg * *ru * r * 8 * 4;
}

/* whether gemm_wgs_kernel runs n columns of a product of this shape */
static bool wgs_takes(int n, int in, int out)
{
	int warps, ru;
	return n <= wgs_max && wgs_shape(in, out, &warps, &ru) <= WG_SMEM_MAX;
}

static PFN_cuTensorMapEncodeTiled_v12000 wg_encode;

static void wg_read_env(void)
{
	const char *e = getenv("KVFERRY_WG_NARROW_WGS");
	wg_narrow_wgs = e && !strcmp(e, "1") ? 1 : e && !strcmp(e, "2") ? 2 : e && !strcmp(e, "4") ? 4 : 0;
	e = getenv("KVFERRY_WG_PARTS");
	wg_parts_policy = e && !strcmp(e, "0") ? 0 : 1;
	e = getenv("KVFERRY_WG_TMA");
	wg_tma = e && !strcmp(e, "0")     ? 0
		 : e && !strcmp(e, "8")   ? 8
		 : e && !strcmp(e, "16")  ? 16
		 : e && !strcmp(e, "32")  ? 32
		 : e && !strcmp(e, "64")  ? 64
		 : e && !strcmp(e, "128") ? 128
		 : e && !strcmp(e, "192") ? 192
		 : e && !strcmp(e, "256") ? 256
					  : -1;
	e = getenv("KVFERRY_WG_PERSIST");
	wg_persist = !(e && !strcmp(e, "0"));
	e = getenv("KVFERRY_WG_CONS");
	wg_cons = e && !strcmp(e, "1") ? 1 : e && !strcmp(e, "2") ? 2 : 0;
	e = getenv("KVFERRY_WG_CLUSTER");
	wg_cluster = e && !strcmp(e, "2") ? 2 : e && !strcmp(e, "1") ? 1 : 0;
	e = getenv("KVFERRY_WG_XB16");
	wg_xb16 = !(e && !strcmp(e, "0"));
	e = getenv("KVFERRY_WG_SKINNY");
	wgs_max = e && atoi(e) >= 0 && atoi(e) <= 8 && *e >= '0' && *e <= '9' ? atoi(e) : 0;
	e = getenv("KVFERRY_WGS_WARPS");
	wgs_warps = e && atoi(e) >= 1 && atoi(e) <= 16 ? atoi(e) : 0;
	e = getenv("KVFERRY_WGS_WB");
	wgs_wb = e && !strcmp(e, "1");
	e = getenv("KVFERRY_WG_WAVES");
	wg_waves = !(e && !strcmp(e, "0"));
	e = getenv("KVFERRY_WG_ONE_CHAIN");
	wg_one_chain = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "2") ? 2 : 1;
	e = getenv("KVFERRY_WG_WPAIRS");
	wg_wpairs = e && !strcmp(e, "1") ? 1 : e && !strcmp(e, "0") ? 0 : -1;
	e = getenv("KVFERRY_WG_256");
	wg_256 = !(e && !strcmp(e, "0"));
	e = getenv("KVFERRY_WG_SEG_DOWN");
	wg_seg_down = e && (!strcmp(e, "1024") || !strcmp(e, "2048") || !strcmp(e, "4096")) ? atoi(e) : WG_SEG;
	e = getenv("KVFERRY_WG_TMA_FROM");
	wg_tma_from = e && atoi(e) > 0 ? atoi(e) : 0;
	void *fn = NULL;
	cudaDriverEntryPointQueryResult q;
	if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
	    q != cudaDriverEntryPointSuccess || !fn)
		wg_tma = 0;
	wg_encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
}

/* plans of at most WG_XRES_MAX columns: X resident, WGS warpgroups a block */
template <int WGS, class F> static cudaError_t wg_pick_narrow(int n, F &&f)
{
	return n <= 8 ? f(wg_cfg<8, true, true, WGS>()) : n <= 16 ? f(wg_cfg<16, true, true, WGS>())
								 : f(wg_cfg<32, true, true, WGS>());
}

/* The kernel kn_cuda_gemm_wg() runs n columns with, handed to @p f as a
 * wg_cfg value: the one place that choice is made (launches and the sizing
 * of parts both ask it). Above 128 columns three warpgroups share each
 * 128-column X stage over 192 W rows: 79 FLOP a byte loaded from L2,
 * against 64 for 128 x 128 (H200, .devcarry/run10.sh: 8B gate_up at 2,048
 * columns 1,716 -> 1,348 us); at 65-128 columns its fewer tiles lost (8B
 * gate_up 120 -> 157 us). */
template <class F> static cudaError_t wg_pick(int n, int in, int out, F &&f)
{
	int wgs = wg_narrow_wgs;
	if (wgs == 0) {
		/* four warpgroups (256 W rows a block: half the X loads per W byte)
		 * at 17-32 columns when their segment blocks still cover 3/4 of
		 * the SMs; two otherwise (H200, .devcarry/run5.sh: 8B decode at 32
		 * columns 9.27 -> 8.31 ms; 1B o and qkv, 32 and 48 blocks, lose) */
		const long blocks4 = (long)((out + 255) / 256) * wg_nseg(in, out);
		wgs = n > 16 && n <= 32 && blocks4 * 4 >= 3L * wg_sms ? 4 : 2;
	}
	/* the TMA kernel above 32 columns, and from 9 for the large layers,
	 * whose weight stream it keeps fuller than the X-resident kernel
	 * (H200, .devcarry/run14.sh, 32 columns, us: 8B gate_up 103.9 -> 88.4,
	 * 8B down 60.9 -> 56.2, 1B LM head 223.3 -> 175.1; the X-resident one
	 * kept the layers of at most 67 MB: 1B o 14.2 against 17.6). At 9-16
	 * columns on its 16-column tiles, each over cuBLAS's time in the same
	 * process (session 8 run 3): 8B gate_up 0.91 -> 0.84, 1B LM head 0.84 ->
	 * 0.77, 8B down 1.05 -> 1.02; at 1-8 columns it lost or tied on every
	 * layer but 8B qkv at 1 (1B o 1.36 -> 1.82). Every layer from 9 columns:
	 * the whole decode step was faster on an H100 than with the smaller
	 * layers X-resident (.dc/run7.sh, two rounds, ms, at 16 / 24 / 32
	 * columns: 1B 1.59 / 1.70 / 1.83 -> 1.55-1.58 / 1.65-1.68 / 1.75-1.78,
	 * 8B 7.08 / 7.70 / 8.21 -> 7.03-7.05 / 7.62-7.65 / 8.09). */
	const bool tma = wg_tma != 0 && (wg_tma_from ? n >= wg_tma_from : n > 8);
	if (n <= WG_XRES_MAX && !tma)
		return wgs == 4 ? wg_pick_narrow<4>(n, f) : wgs == 2 ? wg_pick_narrow<2>(n, f) : wg_pick_narrow<1>(n, f);
	if (!tma) {
		if (n <= 64)
			return f(wg_cfg<64, true, false, 2>());
		return n <= 128 ? f(wg_cfg<128, true, false, 2>()) : f(wg_cfg<128, true, false, 3>());
	}
	/* the TMA kernel: 192-column tiles (more FLOP per byte loaded) unless
	 * 128 or 64 wastes fewer columns; one consumer warpgroup a block (64 W
	 * rows, twice the tiles) when that turns a product of tiles for less
	 * than half the SMs, which would run in segment parts, into one wave
	 * that needs none (H200, .devcarry/run12.sh: 8B down at 256 columns 141
	 * -> 106 us, 8B qkv at 128 44 -> 39; where the tiles stay in parts or
	 * pass a wave, two consumers won: 1B down at 256 50 against 68, 8B qkv
	 * at 256 36 against 67) */
	const int w192 = (n + 191) / 192 * 192, w128 = (n + 127) / 128 * 128;
	int bn = wg_tma > 0 ? wg_tma
		 : n <= 8   ? 8
		 : n <= 16  ? 16
		 : n <= 32  ? 32
		 : n <= 64  ? 64
		 : w128 < w192 ? 128
			       : 192;
	/* wide plans: the width whose tiles take the fewest column-waves (the
	 * last wave of 192-column tiles may leave most SMs idle: the 1B's o at
	 * 2,048 columns is 176 tiles, two waves of which the second a third
	 * full), 128-column tiles priced 10% over for their lower intensity.
	 * H100, .dc/run4.sh (twenty-first session), us at 2,048 columns,
	 * columns only -> waves: 8B gate_up 799 -> 722, qkv 191 -> 170, down
	 * 428 -> 431, o 132 -> 133; 1B gate_up 246 -> 230, LM head 1,816 ->
	 * 1,679, down 140 -> 144; prefill of 2,048 tokens 8B 76.9 -> 73.6 ms,
	 * 1B 15.6 -> 15.3 */
	if (wg_tma < 0 && wg_waves && n > 256) {
		const long rows = (out + 127) / 128;
		auto cost = [&](int b) {
			const long tiles = rows * ((n + b - 1) / b);
			return (double)((tiles + wg_sms - 1) / wg_sms) * b * (b == 128 ? 1.1 : 1.0);
		};
		bn = cost(128) < cost(192) ? 128 : 192;
	}
	/* 64-column tiles where the wider ones would leave most SMs idle (or
	 * run in segment parts) and 64-column ones fill at most one wave: the
	 * 8B's down, o and qkv at 128-256 columns (H100, .dc/run5.sh, best of
	 * two rounds, us, the rule -> 64: down at 128 / 192 / 256 93.4 / 123.7
	 * / 104.6 -> 84.8 / 78.1 / 94.8, o at 192 / 256 37.4 / 37.0 -> 29.1 /
	 * 29.2, qkv at 128 37.5 -> 31.2). Layers of fewer than 4,096 rows lost
	 * or tied that way (1B down at 256 48.6 -> 53.5, qkv at 128 18.5 ->
	 * 21.1), wider plans were not measured. */
	if (wg_tma < 0 && n >= 128 && n <= 256 && out >= 4096) {
		const long rows = (out + 127) / 128;
		if (2 * rows * ((n + bn - 1) / bn) < wg_sms && rows * ((n + 63) / 64) <= wg_sms)
			bn = 64;
	}
	/* layers of one chain (wg_seg_of()) above 256 columns: 256-column
	 * tiles, which keep no segment total (H100, the twenty-first session's
	 * probe, us at 2,048 columns, 192 in segments / 256 in one chain: 8B
	 * gate_up 799 / 666, 1B LM head 1,816 / 1,548; cuBLAS 700 / 1,611).
	 * Not under KVFERRY_WG_ONE_CHAIN=0, which measures the old choice. */
	if ((wg_tma == 256 || (wg_tma < 0 && wg_256 && wg_one_chain && n > 256)) && wg_seg_of(in, out) >= in)
		return wg_cluster == 1 ? f(wgt_cfg<256, 2>()) : f(wgt_cfg<256, 2, 2>());
	if (bn == 256)
		bn = 192;
	const long tiles2 = (long)((out + 127) / 128) * ((n + bn - 1) / bn);
	const int cons = wg_cons ? wg_cons : 2 * tiles2 < wg_sms && 4 * tiles2 >= wg_sms ? 1 : 2;
	const int nct = (n + bn - 1) / bn;
	if (wg_wpairs != 0 && wg_tma < 0 && n > 64 && n <= 256 && (bn == 64 || bn == 128) && nct >= 2) {
		if (cons == 2 && (wg_wpairs == 1 || (in >= 2 * out && nct >= 4 && nct % 2 == 0)))
			return bn == 64 ? f(wgt_cfg<64, 2, 2, true>()) : f(wgt_cfg<128, 2, 2, true>());
		/* one consumer (64 W rows, each CTA of the pair copying 32): the
		 * 8B's down at 128 columns runs there, 86 us against cuBLAS's 63;
		 * not yet measured, so only under KVFERRY_WG_WPAIRS=1 */
		if (cons == 1 && wg_wpairs == 1)
			return bn == 64 ? f(wgt_cfg<64, 1, 2, true>()) : f(wgt_cfg<128, 1, 2, true>());
	}
	if ((wg_cluster == 2 || (wg_cluster == 0 && n > 256)) && cons == 2 && (bn == 128 || bn == 192))
		return bn == 128 ? f(wgt_cfg<128, 2, 2>()) : f(wgt_cfg<192, 2, 2>());
	switch (bn + cons) {
	case 8 + 1: return f(wgt_cfg<8, 1>());
	case 16 + 1: return f(wgt_cfg<16, 1>());
	case 32 + 1: return f(wgt_cfg<32, 1>());
	case 64 + 1: return f(wgt_cfg<64, 1>());
	case 128 + 1: return f(wgt_cfg<128, 1>());
	case 192 + 1: return f(wgt_cfg<192, 1>());
	case 8 + 2: return f(wgt_cfg<8, 2>());
	case 16 + 2: return f(wgt_cfg<16, 2>());
	case 32 + 2: return f(wgt_cfg<32, 2>());
	case 64 + 2: return f(wgt_cfg<64, 2>());
	case 128 + 2: return f(wgt_cfg<128, 2>());
	default: return f(wgt_cfg<192, 2>());
	}
}

/* Whether a product of this many tiles runs one segment a block. Narrow
 * plans always do (their sums are small; the blocks many and short, so the
 * last wave is short too); wider ones when the tiles cannot fill half the
 * GPU, or less than two waves of them when the sums, written and read
 * again (8 bytes a column, row and segment), cost at most a quarter of the
 * weight stream (2 bytes a row and k). H200, bench_cuda --gemm: 8B down at
 * 64 columns 77 us in parts against 169 in 32 tiles; 8B gate_up 102 us in
 * 224 tiles against 134 in parts. */
static bool wg_parts_for(long tiles, int n, int in, int out)
{
	const int nseg = wg_nseg(in, out);
	if (nseg < 2)
		return false;
	if (wg_parts_policy == 0)
		return tiles < 2L * wg_sms;
	const double sums = 8.0 * nseg * n * out, weights = 2.0 * in * out;
	return n <= WG_XRES_MAX || tiles < wg_sms / 2 || (tiles < 2L * wg_sms && sums * 4 <= weights);
}

static bool wg_parts(int n, int in, int out)
{
	long tiles = 0;
	wg_pick(n, in, out, [&](auto c) {
		tiles = (long)((out + c.BM - 1) / c.BM) * ((n + c.BNB - 1) / c.BNB);
		return cudaSuccess;
	});
	return wg_parts_for(tiles, n, in, out);
}


template <int BN, bool MSPLIT, bool XRES, int WGS> static cudaError_t wg_set_smem(void)
{
	return cudaFuncSetAttribute(gemm_wg_kernel<BN, MSPLIT, XRES, WGS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				    wg_cfg<BN, MSPLIT, XRES, WGS>::SMEM);
}

/* blocks of the TMA kernel an SM holds at once (the narrow one-consumer
 * tiles fit two or three): a persistent grid fills every SM, none twice */
template <int BN, int CONS, int CL, bool CW = false> static int wgt_per_sm = 1;
/* CTA pairs (CL 2): the clusters the GPU holds at once (the persistent grid) */
template <int BN, int CONS, int CL, bool CW = false> static int wgt_clusters = 1;

template <int BN, int CONS, int CL = 1, bool CW = false> static cudaError_t wgt_set_smem(void)
{
	using C = wgt_cfg<BN, CONS, CL, CW>;
	const auto k = gemm_wgt_kernel<BN, CONS, CL, CW>;
	cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
	int nb = 0;
	if (e == cudaSuccess && (e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k, C::THREADS, C::SMEM)) == cudaSuccess)
		wgt_per_sm<BN, CONS, CL, CW> = nb > 0 ? nb : 1;
	if (e == cudaSuccess && CL > 1) {
		cudaLaunchAttribute at[2];
		const cudaLaunchConfig_t cfg = kn_launch_config(dim3(CL * 128), dim3(C::THREADS), C::SMEM, 0, CL, 0, at);
		int nc = 0;
		if ((e = cudaOccupancyMaxActiveClusters(&nc, k, &cfg)) == cudaSuccess)
			wgt_clusters<BN, CONS, CL, CW> = nc > 0 ? nc : 1;
	}
	return e;
}

int kn_cuda_gemm_wg_seg(int in, int out)
{
	return kn_cuda_gemm_wg_prepare() == cudaSuccess ? wg_seg_of(in, out) : WG_SEG;
}

extern "C" int kn_cuda_one_family_ok(int device)
{
	int major = 0;
	return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major == 9;
}

cudaError_t kn_cuda_gemm_wg_prepare(void)
{
	if (wg_sms > 0)
		return cudaSuccess;
	cudaError_t e;
	int dev = 0, sms = 0;
	if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
	    (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
		return e;
	const cudaError_t r[] = {
		wg_set_smem<8, true, true, 1>(),    wg_set_smem<16, true, true, 1>(),   wg_set_smem<32, true, true, 1>(),
		wg_set_smem<8, true, true, 2>(),    wg_set_smem<16, true, true, 2>(),   wg_set_smem<32, true, true, 2>(),
		wg_set_smem<8, true, true, 4>(),    wg_set_smem<16, true, true, 4>(),   wg_set_smem<32, true, true, 4>(),
		wg_set_smem<8, true, false, 2>(),   wg_set_smem<64, true, false, 2>(),
		wg_set_smem<128, true, false, 2>(), wg_set_smem<128, false, false, 2>(), wg_set_smem<128, true, false, 3>(),
		wgt_set_smem<8, 1>(),   wgt_set_smem<16, 1>(),  wgt_set_smem<32, 1>(),
		wgt_set_smem<64, 1>(),  wgt_set_smem<128, 1>(), wgt_set_smem<192, 1>(),
		wgt_set_smem<8, 2>(),   wgt_set_smem<16, 2>(),  wgt_set_smem<32, 2>(),
		wgt_set_smem<64, 2>(),  wgt_set_smem<128, 2>(), wgt_set_smem<192, 2>(),
		wgt_set_smem<128, 2, 2>(), wgt_set_smem<192, 2, 2>(), wgt_set_smem<256, 2>(), wgt_set_smem<256, 2, 2>(),
		wgt_set_smem<64, 2, 2, true>(), wgt_set_smem<128, 2, 2, true>(),
		wgt_set_smem<64, 1, 2, true>(), wgt_set_smem<128, 1, 2, true>(),
		cudaFuncSetAttribute(gemm_wgs_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM_MAX),
		cudaFuncSetAttribute(gemm_wgs_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM_MAX),
	};
	for (cudaError_t v : r)
		if (v != cudaSuccess)
			return v;
	wg_read_env();
	wg_sms = sms;
	if (getenv("KVFERRY_WG_SHOW_CLUSTERS"))
		fprintf(stderr,
			"gemm_wg: %d SMs; CTA pairs the GPU holds at once: 128 columns %d, 192 columns %d, 256 "
			"columns %d\n",
			sms, wgt_clusters<128, 2, 2>, wgt_clusters<192, 2, 2>, wgt_clusters<256, 2, 2>);
	return cudaSuccess;
}

size_t kn_cuda_gemm_wg_part_floats(int n, int in, int out)
{
	if (kn_cuda_gemm_wg_prepare() != cudaSuccess || wgs_takes(n, in, out) || !wg_parts(n, in, out))
		return 0;
	return (size_t)wg_nseg(in, out) * n * out;
}

/* the second kernel of a product in segment parts: the segments added; or,
 * with @p defer (the _defer calls), the sums left to the product's consumer
 * and their count in *defer, no fold kernel */
static cudaError_t wg_fold(const float *sums, float *y, size_t count, int nseg, cudaStream_t st, int *defer)
{
	if (defer) {
		*defer = nseg;
		return cudaSuccess;
	}
	const int blocks = (int)((count + 255) / 256 < 2048 ? (count + 255) / 256 : 2048);
	return kn_launch(wg_fold_kernel, dim3(blocks), dim3(256), 0, st, sums, y, count, nseg);
}

template <int BN, bool MSPLIT, bool XRES, int WGS>
static cudaError_t wg_launch(const kn_bf16 *w, const float *x, const kn_bf16 *xb, float *y, int n, int in, int out,
			     float *part, size_t part_floats, cudaStream_t st, int *defer = NULL)
{
	using C = wg_cfg<BN, MSPLIT, XRES, WGS>;
	const int sl = wg_seg_of(in, out), nseg = (in + sl - 1) / sl;
	/* column tiles first: the blocks that run together share W's rows, which
	 * HBM then sends once (X, the smaller operand, stays in L2) */
	const dim3 grid((n + C::BNB - 1) / C::BNB, (out + C::BM - 1) / C::BM);
	const size_t count = (size_t)n * out;
	const bool parts = part != NULL && part_floats >= (size_t)nseg * count &&
			   wg_parts_for((long)grid.x * grid.y, n, in, out);
	cudaError_t e = kn_launch(gemm_wg_kernel<BN, MSPLIT, XRES, WGS>, dim3(grid.x, grid.y, parts ? nseg : 1),
				  dim3(C::THREADS), (size_t)C::SMEM, st, w, x, xb, y, part, n, in, out, sl);
	if (e != cudaSuccess || !parts)
		return e;
	return wg_fold(part, y, count, nseg, st, defer);
}

static cudaError_t wgs_launch(const kn_bf16 *w, const float *x, float *y, int n, int in, int out, cudaStream_t st,
			      bool wb = false)
{
	int warps, ru;
	const size_t smem = wgs_shape(in, out, &warps, &ru, wb);
	const int r = wb ? 8 : 16;
	if (smem > WG_SMEM_MAX)
		return cudaErrorInvalidValue;
	const dim3 grid((out + r * ru - 1) / (r * ru), (n + 7) / 8);
	return kn_launch(wb ? gemm_wgs_kernel<true> : gemm_wgs_kernel<false>, grid, dim3(32 * warps), smem, st, w, x, y,
			 n, in, out, ru, wg_seg_of(in, out));
}

/* a [rows][in] bf16 matrix as boxes of 64 k by @p box_rows rows, swizzled
 * as desc_sw128() reads them; rows past @p rows and k past @p in read 0 */
static cudaError_t wg_map(CUtensorMap *m, const kn_bf16 *p, int in, int rows, int box_rows)
{
	const cuuint64_t dims[2] = { (cuuint64_t)in, (cuuint64_t)rows }, strides[1] = { (cuuint64_t)in * 2 };
	const cuuint32_t box[2] = { WG_BK, (cuuint32_t)box_rows }, es[2] = { 1, 1 };
	const CUresult r = wg_encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)p, dims, strides, box, es,
				     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
				     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
	return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <int BN, int CONS, int CL = 1, bool CW = false>
static cudaError_t wgt_launch(const kn_bf16 *w, const kn_bf16 *xb, float *y, int n, int in, int out, float *part,
			      size_t part_floats, cudaStream_t st, int *defer = NULL, bool persist = true)
{
	using C = wgt_cfg<BN, CONS, CL, CW>;
	const auto k = gemm_wgt_kernel<BN, CONS, CL, CW>;
	const int sl = wg_seg_of(in, out), nseg = (in + sl - 1) / sl;
	if (BN > 192 && nseg > 1) /* no second accumulator: one chain only */
		return cudaErrorNotSupported;
	const long rt = (out + C::BM - 1) / C::BM, ct = (n + BN - 1) / BN, tiles = rt * ct;
	const size_t count = (size_t)n * out;
	const bool parts = part != NULL && part_floats >= (size_t)nseg * count && wg_parts_for(tiles, n, in, out);
	const long units = tiles * (parts ? nseg : 1);
	CUtensorMap tw, tx;
	cudaError_t e;
	if ((e = wg_map(&tw, w, in, out, C::WH)) != cudaSuccess || (e = wg_map(&tx, xb, in, n, C::XH)) != cudaSuccess)
		return e;
	if constexpr (CL > 1) {
		/* CL CTAs on adjacent row tiles, each copying its share of X's
		 * stage into all (CW: on adjacent column tiles, sharing W's);
		 * always persistent: a grid of what the GPU holds */
		const long pairs = (CW ? (ct + CL - 1) / CL * rt : ct * ((rt + CL - 1) / CL)) * (parts ? nseg : 1);
		const long nc = pairs < wgt_clusters<BN, CONS, CL, CW> ? pairs : wgt_clusters<BN, CONS, CL, CW>;
		e = kn_launch_cl(k, dim3((unsigned)(nc * CL)), dim3(C::THREADS), (size_t)C::SMEM, st, CL, tw, tx, y,
				 parts ? part : (float *)NULL, n, in, out, sl);
		if (e != cudaSuccess || !parts)
			return e;
		return wg_fold(part, y, count, nseg, st, defer);
	}
	const long most = (long)wg_sms * wgt_per_sm<BN, CONS, CL, CW>;
	const int grid = (int)(persist && wg_persist && units > most ? most : units);
	e = kn_launch(k, dim3(grid), dim3(C::THREADS), (size_t)C::SMEM, st, tw, tx, y, parts ? part : (float *)NULL, n,
		      in, out, sl);
	if (e != cudaSuccess || !parts)
		return e;
	return wg_fold(part, y, count, nseg, st, defer);
}

/* the product on the kernel wg_pick() chooses; X from @p x (f32, rounded
 * here) or, when @p x is NULL, already rounded in @p xb; @p defer: a
 * product in parts leaves its sums to its consumer (wg_fold()) */
static cudaError_t wg_run(const kn_bf16 *w, const float *x, kn_bf16 *xb, float *y, int n, int in, int out,
			  float *part, size_t part_floats, cudaStream_t st, int *defer = NULL)
{
	cudaError_t e;
	if (n < 1 || in % 8 || in < 8 || out < 1)
		return cudaErrorInvalidValue;
	if ((e = kn_cuda_gemm_wg_prepare()) != cudaSuccess)
		return e;
	if (x && wgs_takes(n, in, out))
		return wgs_launch(w, x, y, n, in, out, st, wgs_wb);
	return wg_pick(n, in, out, [&](auto c) {
		using C = decltype(c);
		/* X resident: rounded as it is loaded; else taken rounded */
		cudaError_t re;
		if (C::XRES && !x)
			return cudaErrorInvalidValue;
		if (!C::XRES && x && (re = kn_cuda_round_bf16(x, xb, NULL, (size_t)n * in, st)) != cudaSuccess)
			return re;
		if constexpr (C::TMA)
			return wgt_launch<C::BN, C::CONS, C::CL, C::CW>(w, xb, y, n, in, out, part, part_floats, st, defer);
		else
			return wg_launch<C::BN, C::MSPLIT, C::XRES, C::WGS>(w, C::XRES ? x : NULL, C::XRES ? NULL : xb, y,
									      n, in, out, part, part_floats, st, defer);
	});
}

cudaError_t kn_cuda_gemm_wg(const kn_bf16 *w, const float *x, kn_bf16 *xb, float *y, int n, int in, int out,
			    float *part, size_t part_floats, cudaStream_t st)
{
	return x ? wg_run(w, x, xb, y, n, in, out, part, part_floats, st) : cudaErrorInvalidValue;
}

/* wg_run() with a product in parts leaving its sums to the consumer */
static cudaError_t wg_run_defer(const kn_bf16 *w, const float *x, kn_bf16 *xb, float *y, int n, int in, int out,
				float *part, size_t part_floats, int *nseg, cudaStream_t st)
{
	if (!nseg)
		return cudaErrorInvalidValue;
	*nseg = 0;
	return wg_run(w, x, xb, y, n, in, out, part, part_floats, st, nseg);
}

cudaError_t kn_cuda_gemm_wg_defer(const kn_bf16 *w, const float *x, kn_bf16 *xb, float *y, int n, int in, int out,
				  float *part, size_t part_floats, int *nseg, cudaStream_t st)
{
	return x ? wg_run_defer(w, x, xb, y, n, in, out, part, part_floats, nseg, st) : cudaErrorInvalidValue;
}

int kn_cuda_gemm_wg_takes_bf16(int n, int in, int out)
{
	bool xres = true;
	if (kn_cuda_gemm_wg_prepare() != cudaSuccess || !wg_xb16 || wgs_takes(n, in, out))
		return 0;
	wg_pick(n, in, out, [&](auto c) {
		xres = decltype(c)::XRES;
		return cudaSuccess;
	});
	return !xres;
}

cudaError_t kn_cuda_gemm_wg_bf16(const kn_bf16 *w, const kn_bf16 *xb, float *y, int n, int in, int out, float *part,
				 size_t part_floats, cudaStream_t st)
{
	return wg_run(w, NULL, (kn_bf16 *)xb, y, n, in, out, part, part_floats, st);
}

cudaError_t kn_cuda_gemm_wg_bf16_defer(const kn_bf16 *w, const kn_bf16 *xb, float *y, int n, int in, int out,
				       float *part, size_t part_floats, int *nseg, cudaStream_t st)
{
	return wg_run_defer(w, NULL, (kn_bf16 *)xb, y, n, in, out, part, part_floats, nseg, st);
}

cudaError_t kn_cuda_gemm_wg_forced(const kn_bf16 *w, const float *x, kn_bf16 *xb, float *y, int n, int in, int out,
				   float *part, size_t part_floats, int way, cudaStream_t st)
{
	cudaError_t e;
	if (n < 1 || in % 8 || in < 8 || out < 1)
		return cudaErrorInvalidValue;
	if ((e = kn_cuda_gemm_wg_prepare()) != cudaSuccess)
		return e;
	if (way == 11 || way == 12) /* mma.sync, a segment a warp: W as the A / the B operand */
		return wgs_launch(w, x, y, n, in, out, st, way == 12);
	if (way != 0 && (e = kn_cuda_round_bf16(x, xb, NULL, (size_t)n * in, st)) != cudaSuccess)
		return e;
	switch (way) {
	case 0: /* X resident, 32-column instructions, two warpgroups a block */
		return wg_launch<32, true, true, 2>(w, x, NULL, y, n, in, out, part, part_floats, st);
	case 1: /* X streamed, 8-column instructions */
		return wg_launch<8, true, false, 2>(w, NULL, xb, y, n, in, out, part, part_floats, st);
	case 2: /* X streamed, two warpgroups side by side on 128 columns each */
		return wg_launch<128, false, false, 2>(w, NULL, xb, y, n, in, out, part, part_floats, st);
	}
	if (!wg_encode)
		return cudaErrorNotSupported;
	switch (way) {
	case 3: /* the TMA kernel, 192-column tiles */
		return wgt_launch<192, 2>(w, xb, y, n, in, out, part, part_floats, st);
	case 4: /* 128-column tiles */
		return wgt_launch<128, 2>(w, xb, y, n, in, out, part, part_floats, st);
	case 5: /* 64-column tiles, a block for each unit of work */
		return wgt_launch<64, 2>(w, xb, y, n, in, out, part, part_floats, st, NULL, false);
	case 6: /* 64 rows by 128 columns (one consumer) */
		return wgt_launch<128, 1>(w, xb, y, n, in, out, part, part_floats, st);
	case 7: /* 8-column tiles */
		return wgt_launch<8, 2>(w, xb, y, n, in, out, part, part_floats, st);
	case 8: /* 64 rows by 16 columns */
		return wgt_launch<16, 1>(w, xb, y, n, in, out, part, part_floats, st);
	case 9: /* 128-column tiles in CTA pairs sharing X */
		return wgt_launch<128, 2, 2>(w, xb, y, n, in, out, part, part_floats, st);
	case 10: /* 192-column tiles in CTA pairs sharing X */
		return wgt_launch<192, 2, 2>(w, xb, y, n, in, out, part, part_floats, st);
	case 13: /* 256-column tiles (layers of one chain) */
		return wgt_launch<256, 2>(w, xb, y, n, in, out, part, part_floats, st);
	case 14: /* 256-column tiles in CTA pairs */
		return wgt_launch<256, 2, 2>(w, xb, y, n, in, out, part, part_floats, st);
	case 15: /* 64-column tiles in CTA pairs sharing W */
		return wgt_launch<64, 2, 2, true>(w, xb, y, n, in, out, part, part_floats, st);
	case 16: /* 128-column tiles in CTA pairs sharing W */
		return wgt_launch<128, 2, 2, true>(w, xb, y, n, in, out, part, part_floats, st);
	case 17: /* 64 rows by 64 columns in CTA pairs sharing W (32 rows each) */
		return wgt_launch<64, 1, 2, true>(w, xb, y, n, in, out, part, part_floats, st);
	case 18: /* 64 rows by 128 columns in CTA pairs sharing W */
		return wgt_launch<128, 1, 2, true>(w, xb, y, n, in, out, part, part_floats, st);
	default:
		return cudaErrorInvalidValue;
	}
}
