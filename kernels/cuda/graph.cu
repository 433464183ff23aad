/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A plan's step as enqueued into a CUDA graph (every layer, the norm, the
 * LM head and the sampler at the plan's fixed width), and its capture
 * (engine_int.cuh; the invariants are in engine.cu).
 */
#include "engine_int.cuh"

/* ---- the step, as enqueued into a graph ---- */

#define CKL(call, what)                                                                       \
	do {                                                                                  \
		cudaError_t e_ = (call);                                                      \
		if (e_ != cudaSuccess) {                                                      \
			cu_seterr(s, "%s (layer %d, plan width %d) failed: %s", what, l, W,       \
			       cudaGetErrorString(e_));                                       \
			return -EIO;                                                          \
		}                                                                             \
	} while (0)

/* y = X W^T. With @p segs, the one family's product may leave its segment
 * sums in s->wg_part for the consumer to add (*segs of them; 0: y written). */
static int linear(struct cu_stage *s, const kn_bf16 *w, const float *x, float *y, int n, int in,
		  int out, int *segs = NULL)
{
	char e[256];
	if (segs)
		*segs = 0;
	if (s->linear_wg) {
		cudaError_t ce = segs ? kn_cuda_gemm_wg_defer(w, x, s->xb, y, n, in, out, s->wg_part, s->wg_part_floats,
							      segs, s->st)
				      : kn_cuda_gemm_wg(w, x, s->xb, y, n, in, out, s->wg_part, s->wg_part_floats, s->st);
		if (ce != cudaSuccess) {
			cu_seterr(s, "kn_cuda_gemm_wg(n=%d, in=%d, out=%d): %s", n, in, out, cudaGetErrorString(ce));
			return -EIO;
		}
		return 0;
	}
	if (n > KN_CU_GEMV_MAX_N && s->wide_mma) {
		cudaError_t ce = kn_cuda_gemm_mma(w, x, s->xb, y, n, in, out, s->mma_part, s->mma_part_floats, s->st);
		if (ce != cudaSuccess) {
			cu_seterr(s, "kn_cuda_gemm_mma(n=%d, in=%d, out=%d): %s", n, in, out, cudaGetErrorString(ce));
			return -EIO;
		}
		return 0;
	}
	if (kn_cuda_linear(s->blas, w, x, s->xb, y, n, in, out, s->wide_split, s->gemv_kind, s->st, e,
			   sizeof(e))) {
		cu_seterr(s, "%s", e);
		return -EIO;
	}
	return 0;
}

/* y = bf16 X (s->xb, written by its producer) W^T: cuBLAS, or the one
 * family's kernel where kn_cuda_gemm_wg_takes_bf16() */
static int linear_bf16(struct cu_stage *s, const kn_bf16 *w, float *y, int n, int in, int out, int *segs = NULL)
{
	char e[256];
	if (segs)
		*segs = 0;
	if (s->linear_wg) {
		cudaError_t ce = segs ? kn_cuda_gemm_wg_bf16_defer(w, s->xb, y, n, in, out, s->wg_part,
								   s->wg_part_floats, segs, s->st)
				      : kn_cuda_gemm_wg_bf16(w, s->xb, y, n, in, out, s->wg_part, s->wg_part_floats, s->st);
		if (ce != cudaSuccess) {
			cu_seterr(s, "kn_cuda_gemm_wg_bf16(n=%d, in=%d, out=%d): %s", n, in, out, cudaGetErrorString(ce));
			return -EIO;
		}
		return 0;
	}
	if (kn_cuda_linear_bf16(s->blas, w, s->xb, y, n, in, out, e, sizeof(e))) {
		cu_seterr(s, "%s", e);
		return -EIO;
	}
	return 0;
}

/* Whether the producer of a linear layer's input writes it as bf16 (no f32
 * write, no rounding pass; the same bits): wide plans with X rounded for
 * cuBLAS, and the one family's kernels that take X rounded beforehand. */
static bool x_bf16(const struct cu_stage *s, int W, int in, int out)
{
	if (s->linear_wg)
		return kn_cuda_gemm_wg_takes_bf16(W, in, out) != 0;
	return W > KN_CU_GEMV_MAX_N && !s->wide_split && !s->wide_mma;
}

/* Residual add (delta in @p dsegs segment sums where dsegs > 0) + RMSNorm,
 * then the linear layer that reads the normed rows (in bf16 where
 * x_bf16()), its output maybe left in segments (@p segs, linear()). */
static int norm_linear(struct cu_stage *s, int W, const float *delta, int dsegs, const float *nw,
		       const kn_bf16 *w, float *y, int out, int l, int *segs = NULL)
{
	const int H = s->hidden;
	const float eps = s->base.cfg->rms_eps;
	if (x_bf16(s, W, H, out)) {
		CKL(kn_cuda_add_rmsnorm_bf16(s->resid, delta, dsegs, nw, eps, W, H, s->xb, s->st),
		    "kn_cuda_add_rmsnorm_bf16");
		return linear_bf16(s, w, y, W, H, out, segs);
	}
	CKL(kn_cuda_add_rmsnorm(s->resid, delta, dsegs, nw, eps, W, H, s->x, s->st), "kn_cuda_add_rmsnorm");
	return linear(s, w, s->x, y, W, H, out, segs);
}

/* A row of segment sums the residual add may read itself (CU_DEFER_AUTO): 128 KB,
 * the 1B's down (hidden 2,048, 16 segments) and the 8B's o (4,096, 8). The
 * 8B's down (28 segments, 458 KB a row through one SM) is faster through
 * the fold kernel. H100, one family, ms a step at 1 / 8 / 32 columns
 * (kernels/cuda/NOTES.md, nineteenth session): this rule 8B 6.283 / 6.783
 * / 7.868, 1B 1.299 / 1.376 / 1.634; o and down always left to the
 * residual add 6.418 / 6.902 / 7.911, 1.309 / 1.387 / 1.651; never
 * 6.321 / 6.805 / 7.914, 1.312 / 1.394 / 1.681. */
#define CU_DEFER_ROW_FLOATS 32768

/* Whether the product of @p in inputs that the residual add reads (o,
 * down) leaves its segment sums to it: a row of them is a segment's row
 * (hidden floats) for each of the product's segments. */
static bool defer_od(const struct cu_stage *s, int in)
{
	if (s->defer == CU_DEFER_AUTO)
		return kn_cuda_gemm_wg_part_floats(1, in, s->hidden) <= CU_DEFER_ROW_FLOATS;
	return s->defer == CU_DEFER_ALL;
}

/* where a linear layer's output is, for its consumer: its segment sums in
 * s->wg_part, or @p y itself */
static const float *out_of(const struct cu_stage *s, const float *y, int segs)
{
	return segs ? s->wg_part : y;
}

/* The sampler over the logits' first @p n rows (columns @p cols), its
 * outputs at @p o (row r's at index out_col[r] when @p out_col). */
static cudaError_t sample(struct cu_stage *s, const struct kn_column *cols, int n, struct out_layout o,
			  const int32_t *out_col)
{
	struct kn_cu_sample_args sa = {};
	sa.logits = s->logits;
	sa.vocab = s->vocab;
	sa.cols = cols;
	sa.n = n;
	sa.n_top = (const int32_t *)s->d_in;
	sa.tokens = o.tok;
	sa.tok_lp = o.lp;
	sa.top_ids = o.ids;
	sa.top_lps = o.lps;
	sa.out_col = out_col;
	sa.scratch = s->sample_ws;
	return kn_cuda_sample(&sa, s->st);
}

int cu_enqueue(struct cu_stage *s, int W, int gctx, int packed)
{
	const struct kn_model_config *c = s->base.cfg;
	const int H = s->hidden;
	const size_t lay = (size_t)2 * s->base.n_blocks * s->nkv * KN_PAGE_BLK * s->hd;
	int l = -1, rc;
	if (s->base.first)
		CKL(kn_cuda_embed(s->embed, s->d_cols, W, H, s->resid, s->st), "kn_cuda_embed");
	/* The one family's products in segment parts leave their sums to the
	 * kernel that reads them (qkv_rope, swiglu, the next residual add),
	 * which adds them as the fold kernel would: one launch less a product.
	 * Not where a tensor-parallel reduce reads the output first. o and down
	 * are read by the residual add, one block a row: theirs are left to it
	 * with CU_DEFER_ALL, or with CU_DEFER_AUTO where a row's sums are few
	 * (defer_od()). */
	const bool tp = cu_tp_reduces(s), qg = s->defer != CU_DEFER_NONE;
	const bool od_o = !tp && defer_od(s, s->q_dim), od_d = !tp && defer_od(s, s->inter);
	const float *pending = NULL;
	int pending_segs = 0, qsegs = 0, osegs = 0, gsegs = 0, dsegs = 0;
	for (int i = 0; i < s->nl; i++) {
		const struct layer_w *w = &s->L[i];
		l = s->base.opts.layer_start + i;
		if ((rc = norm_linear(s, W, pending, pending_segs, w->ln1, w->wqkv, s->qkv, s->qkv_dim, l,
				      qg ? &qsegs : NULL)))
			return rc;
		kn_bf16 *kc = s->kv + (size_t)i * lay, *vc = kc + lay / 2;
		struct kn_cu_qkv_args qa = {};
		qa.qkv = s->qkv;
		qa.qkv_parts = qsegs ? s->wg_part : NULL;
		qa.qkv_segs = qsegs;
		qa.bias = w->bqkv;
		qa.q_norm = w->qn;
		qa.k_norm = w->kn;
		qa.inv_freq = s->inv_freq;
		qa.cols = s->d_cols;
		qa.table = s->d_table;
		qa.k_cache = kc;
		qa.v_cache = vc;
		qa.n = W;
		qa.n_heads = s->nh;
		qa.n_kv_heads = s->nkv;
		qa.head_dim = s->hd;
		qa.max_bps = s->base.opts.max_blocks_per_slot;
		qa.eps = c->rms_eps;
		CKL(kn_cuda_qkv_rope(&qa, s->st), "kn_cuda_qkv_rope");
		struct kn_cu_attn_args aa = {};
		aa.q = s->qkv;
		aa.q_stride = s->qkv_dim;
		aa.k_cache = kc;
		aa.v_cache = vc;
		aa.table = s->d_table;
		aa.cols = s->d_cols;
		aa.out = s->att;
		aa.part = s->attn_ws;
		aa.counters = s->attn_cnt;
		aa.n = W;
		aa.n_heads = s->nh;
		aa.n_kv_heads = s->nkv;
		aa.head_dim = s->hd;
		aa.max_bps = s->base.opts.max_blocks_per_slot;
		aa.max_ctx = s->max_ctx;
		aa.grid_ctx = gctx;
		aa.scale = 1.0f / sqrtf((float)s->hd);
		/* Tile kernel: exact (q, P as hi + lo) on narrow plans, so the decode
		 * path stays f32-grade; wide plans follow the X choice (bf16 q and P,
		 * as transformers' bf16 attention, unless cuda_wide_x asks f32-grade). */
		/* auto: the tile kernel. On narrow plans one column a warp, each
		 * column in pieces of its own length (cu_attn_split() < 0), where
		 * the head allows it, else the column kernel. H100, stage of 32k
		 * positions, ms a step, column kernel -> own pieces: 8B batch 1
		 * ctx 2,048 6.65 -> 5.68, 8,192 6.71 -> 6.26 (pieces of 256); 1B
		 * batch 8 ctx 512 1.45 -> 1.39 (kernels/cuda/NOTES.md). With the
		 * pieces following the stage's longest context instead, a 512-position
		 * column of a 32k stage ran as one piece (1B batch 1 1.22 -> 1.50). */
		aa.split = cu_attn_split(s, W);
		aa.kernel = s->attn_tile == 2 || (s->attn_tile == 0 && (W > KN_CU_GEMV_MAX_N || aa.split < 0))
				    ? KN_CU_ATTN_TILE
				    : KN_CU_ATTN_COLUMN;
		/* q and P exact (hi + lo bf16) where the linears keep f32-grade X
		 * (narrow default plans, wide split / mma); bf16, as transformers'
		 * bf16 path and the wide default plans round them, elsewhere, one
		 * family included (at every width: H100, .dc/run4.sh, prefill of
		 * 2,048 tokens 8B 75.2 -> 71.9 ms, 1B 14.2 -> 13.5, decode batch 1
		 * 8B 6.28 -> 6.24, 1B 1.31 -> 1.29) */
		aa.exact = s->attn_exact >= 0 ? s->attn_exact
					    : !s->linear_wg && (W <= KN_CU_GEMV_MAX_N || s->wide_split || s->wide_mma);
		/* prompt chunks: each run of 64 columns of one slot on the run kernel,
		 * a block of the run's rows sharing each 64-key tile, in one causal
		 * pass for the default kernels; in one family only with 64-key steps
		 * (the default), in the tile kernel's pieces, folded as it folds them
		 * (the same bits as the tile kernel), and only on plans of more than
		 * 256 columns: on narrower ones every kernel of the launch checks
		 * each column against a run, which cost the family's decode step
		 * (H100, ncu, ctx 512: 8B at 64 columns 0.24 ms, 1B at 256 0.15) */
		aa.runs = s->linear_wg && W <= 256 ? 0 : s->attn_runs;
		aa.steps64 = s->attn_steps64;
		aa.run_fold = s->linear_wg;
		/* auto, narrow plans: each long column to the tile kernel (by its own
		 * length: kn_cuda_attn_tile_from()) */
		if (s->attn_tile == 0 && aa.kernel == KN_CU_ATTN_COLUMN)
			aa.tile_from = kn_cuda_attn_tile_from(W, s->hd, s->nh / s->nkv);
		CKL(kn_cuda_attention(&aa, s->st), "kn_cuda_attention");
		if ((rc = linear(s, w->wo, s->att, s->delta, W, s->q_dim, H, od_o ? &osegs : NULL)) ||
		    (rc = cu_tp_reduce(s, s->delta, W)))
			return rc;
		if ((rc = norm_linear(s, W, out_of(s, s->delta, osegs), osegs, w->ln2, w->wgu, s->gu, 2 * s->inter, l,
				      qg ? &gsegs : NULL)))
			return rc;
		const float *gu = out_of(s, s->gu, gsegs);
		if (x_bf16(s, W, s->inter, H)) {
			CKL(kn_cuda_swiglu_bf16(gu, gsegs, W, s->inter, s->xb, s->st), "kn_cuda_swiglu_bf16");
			rc = linear_bf16(s, w->wd, s->delta, W, s->inter, H, od_d ? &dsegs : NULL);
		} else {
			CKL(kn_cuda_swiglu(gu, gsegs, W, s->inter, s->act, s->st), "kn_cuda_swiglu");
			rc = linear(s, w->wd, s->act, s->delta, W, s->inter, H, od_d ? &dsegs : NULL);
		}
		if (rc || (rc = cu_tp_reduce(s, s->delta, W)))
			return rc;
		pending = out_of(s, s->delta, dsegs);
		pending_segs = dsegs;
	}
	if (s->base.last && packed) {
		/* the final norm on every column, then the rows of those that want
		 * a token packed: the LM head and the sampler on CU_LOGIT_K rows */
		struct out_layout o = out_layout(s->d_out, W);
		CKL(kn_cuda_add_rmsnorm(s->resid, pending, pending_segs, s->fnorm, c->rms_eps, W, H, s->x, s->st),
		    "kn_cuda_add_rmsnorm");
		CKL(kn_cuda_logit_rows(s->d_cols, W, s->x, H, CU_LOGIT_K, s->x_k, s->cols_k, s->out_col, o.tok, o.lp,
				       s->st),
		    "kn_cuda_logit_rows");
		if ((rc = linear(s, s->lm_head, s->x_k, s->logits, CU_LOGIT_K, H, s->vocab)))
			return rc;
		CKL(sample(s, s->cols_k, CU_LOGIT_K, o, s->out_col), "kn_cuda_sample");
	} else if (s->base.last) {
		if ((rc = norm_linear(s, W, pending, pending_segs, s->fnorm, s->lm_head, s->logits, s->vocab, l)))
			return rc;
		CKL(sample(s, s->d_cols, W, out_layout(s->d_out, W), NULL), "kn_cuda_sample");
	} else if (pending) {
		CKL(kn_cuda_add_rmsnorm(s->resid, pending, pending_segs, NULL, 0.f, W, H, NULL, s->st),
		    "kn_cuda_add_rmsnorm(add)");
	}
	return 0;
}

void cu_drop_graphs(struct cu_stage *s)
{
	for (int i = 0; i < s->n_plans; i++)
		for (int b = 0; b < CU_CTX_BUCKETS; b++) {
			if (s->plans[i].exec[b]) {
				cudaGraphExecDestroy(s->plans[i].exec[b]);
				s->plans[i].exec[b] = NULL;
			}
			if (s->plans[i].exec_k[b]) {
				cudaGraphExecDestroy(s->plans[i].exec_k[b]);
				s->plans[i].exec_k[b] = NULL;
			}
		}
}

int cu_ctx_bucket(const struct cu_stage *s, int ctx)
{
	int b = 0;

	while (s->ctx_buckets && b + 1 < CU_CTX_BUCKETS && ((long)CU_CTX_MIN << b) < ctx
	       && ((long)CU_CTX_MIN << b) < s->max_ctx)
		b++;
	return s->ctx_buckets ? b : CU_CTX_BUCKETS - 1;
}

int cu_bucket_ctx(const struct cu_stage *s, int bucket)
{
	const long c = (long)CU_CTX_MIN << bucket;

	return !s->ctx_buckets || bucket == CU_CTX_BUCKETS - 1 || c >= s->max_ctx ? s->max_ctx : (int)c;
}

int cu_capture(struct cu_stage *s, struct plan *p, int bucket, int packed)
{
	cudaGraph_t g = NULL;
	CK(cudaStreamBeginCapture(s->st, cudaStreamCaptureModeThreadLocal));
	/* Programmatic dependent launch on decode-sized plans only: measured on
	 * the H200, 1B batch 1 1.240 -> 1.168 ms, 8B batch 64 6.64 -> 6.57,
	 * batch 256 12.88 -> 12.82; the 2048-column prefill of 1B 14.9 -> 15.8 ms
	 * slower with it, 8B equal. */
	kn_cuda_pdl_suspend(p->width > KN_CU_PDL_MAX_W);
	int rc = cu_enqueue(s, p->width, cu_bucket_ctx(s, bucket), packed);
	cudaGraphExec_t *ex = packed ? &p->exec_k[bucket] : &p->exec[bucket];
	kn_cuda_pdl_suspend(0);
	cudaError_t e = cudaStreamEndCapture(s->st, &g);
	if (rc) {
		if (g)
			cudaGraphDestroy(g);
		cudaGetLastError();
		return rc;
	}
	if (e != cudaSuccess) {
		cu_seterr(s, "cudaStreamEndCapture(plan width %d) failed: %s", p->width, cudaGetErrorString(e));
		return -EIO;
	}
	e = cudaGraphInstantiate(ex, g, 0);
	cudaGraphDestroy(g);
	if (e != cudaSuccess) {
		*ex = NULL;
		cu_seterr(s, "cudaGraphInstantiate(plan width %d) failed: %s", p->width, cudaGetErrorString(e));
		return -EIO;
	}
	return 0;
}
