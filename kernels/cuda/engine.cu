/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA stage engine: layers [start, end) of a model in device memory,
 * bf16 weights, f32 residual stream and accumulation, a paged bf16 KV pool.
 *
 * Invariants (what breaks if one is violated):
 *  - Every plan runs at its fixed width W: columns n_cols..W-1 are padding
 *    (slot -1) and every kernel computes each column independently in an
 *    order fixed by the shapes, so a column's bits never depend on its batch
 *    (kn_stage.h bitwise determinism). Changing a kernel so that a column's
 *    reduction depends on n or on its index breaks the batched-vs-solo test.
 *  - A plan's whole step (all layers, the sampler) is one CUDA graph,
 *    captured at the plan's first step and replayed; everything it touches
 *    lives at fixed device addresses. Re-sizing the pool moves the pool, so
 *    set_pool drops every graph.
 *  - Steps are submitted without waiting (kn_stage_step_submit): each in-
 *    flight step owns one ring slot of pinned host buffers (its columns in,
 *    its tokens out) and an event; everything else a step touches on the
 *    device is reused by the next step only after it in stream order. A
 *    step whose host buffers are pageable, or that needs logit rows on the
 *    host, completes inside submit (the shared bounce buffers and logits
 *    would otherwise be overwritten by the next step).
 *  - The device block table mirrors base.table by replaying the applied ops
 *    (table.cuh) on the stream ahead of the next step, so a step in flight
 *    never sees a later step's table and no step uploads the whole table.
 *  - Nothing vocab-sized crosses PCIe: the sampler (sample.cuh) leaves the
 *    token, its logprob and the top logprobs on the device, and one copy of
 *    8 to 168 bytes per column brings them back.
 *  - Device memory = weights + KV pool + workspace (reported by info); the
 *    host keeps no copy of the weights (they are uploaded from the loader's
 *    mapping, through a bounded staging buffer when they need conversion).
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"
#include "embed.cuh"
#include "fill.cuh"
#include "gemm.cuh"
#include "gemv.cuh"
#include "kn_cuda.h"
#include "kn_stage_impl.h"
#include "qkv_rope.cuh"
#include "rmsnorm.cuh"
#include "sample.cuh"
#include "swiglu.cuh"
#include "table.cuh"

/* Widest plan whose graph uses programmatic dependent launch (capture()). */
#define KN_CU_PDL_MAX_W 256
/* cuBLAS workspace: set explicitly so graph capture never allocates. */
#define BLAS_WS_BYTES ((size_t)32 << 20)
/* Conversion staging for non-bf16 weights (f32/f16 files). */
#define STAGE_BYTES ((size_t)64 << 20)

struct layer_w {
	kn_bf16 *wqkv;  /* [q_dim + 2 kv_dim][hidden] */
	kn_bf16 *wo;    /* [hidden][q_dim] */
	kn_bf16 *wgu;   /* [2 inter][hidden]: gate rows, then up rows */
	kn_bf16 *wd;    /* [hidden][inter] */
	float *ln1, *ln2; /* [hidden] */
	float *bqkv;    /* [qkv_dim] or NULL */
	float *qn, *kn; /* [head_dim] or NULL */
};

struct plan {
	int32_t width;
	cudaGraphExec_t exec; /* NULL until the plan's first step */
};

/* One in-flight step's host side (pinned) and its completion event. */
struct cu_slot {
	struct kn_column *h_in;   /* [1 + wmax]: [0] = params (n_top), then the columns */
	int32_t *h_out;           /* the sampler's outputs for plan width W (out_layout) */
	struct kn_op *h_ops;      /* ops replayed ahead of this step */
	int h_ops_cap;
	cudaEvent_t ev;
	struct kn_step st;        /* the caller's step: its buffers stay valid until the wait */
	int W, n_top, host_rows, bounce_out, done, rc;
};

struct cu_stage {
	struct kn_stage base; /* first member: kn_stage_impl.h */
	struct kn_model_config cfg_copy;
	int nl, hidden, inter, vocab, hd, nh, nkv, q_dim, kv_dim, qkv_dim, max_ctx, wmax;
	int dev;
	cudaStream_t st;
	cublasHandle_t blas;
	void *blas_ws;
	struct layer_w *L;
	kn_bf16 *embed, *lm_head;
	int lm_head_owned;
	float *fnorm, *inv_freq;
	size_t weight_bytes, ws_bytes, kv_bytes, blk_bytes;
	kn_bf16 *kv;          /* [nl][2][n_blocks][nkv][KN_PAGE_BLK][hd] */
	int32_t *d_table;     /* [n_slots][max_bps] */
	struct kn_column *d_in, *d_cols;   /* [1 + wmax] step params + columns; d_cols = d_in + 1 */
	int32_t *d_out;                    /* sampler outputs, out_layout() of the plan width */
	struct kn_op *d_ops;               /* ops replayed by table.cuh, [d_ops_cap] */
	int d_ops_cap;
	struct kn_op *p_ops;               /* applied since the last submit, [p_ops_n] */
	int p_ops_n, p_ops_cap;
	struct cu_slot ring[KN_STEP_DEPTH];
	int r_head, r_n;
	float *h_hidden;                   /* [wmax][hidden] pinned staging */
	float *h_row;                      /* [vocab] pinned, rows sampled on the host */
	const void *pin_seen[2];           /* hidden_in / hidden_out of the last step ... */
	int pin_known[2];                  /* ... and whether it was page-locked */
	void *scratch;                     /* kn_sample_column() scratch */
	float *resid, *delta, *qkv, *gu, *logits, *attn_ws;
	unsigned *attn_cnt;    /* [wmax][n_kv_heads] attention split counters, kept at zero */
	float *x, *att, *act;  /* linear-layer inputs, f32 (gemm.cuh rounds them for wide plans) */
	kn_bf16 *xb;           /* [2][wmax][max(hidden, q_dim, inter)] bf16 X for cuBLAS (wmax > 16) */
	int wide_split;        /* opts.cuda_wide_x (or KVFERRY_CUDA_WIDE_X=split): wide plans add X's rounding remainder */
	int gemv_kind;         /* opts.cuda_gemv (or KVFERRY_CUDA_GEMV): -1 auto, else KN_CU_GEMV_* */
	int attn_tile;         /* opts.cuda_attn (or KVFERRY_CUDA_ATTN): 0 auto (tile on wide plans), 1 column, 2 tile */
	struct plan plans[KN_MAX_PLANS];
	int n_plans;
	/* allocations to free, in order of acquisition */
	void *dptr[4096];
	int n_dptr;
};

static void seterr(struct cu_stage *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void seterr(struct cu_stage *s, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->base.err, sizeof(s->base.err), fmt, ap);
	va_end(ap);
}

/* Check a CUDA runtime call; on failure name it and return -EIO. */
#define CK(call)                                                                             \
	do {                                                                                 \
		cudaError_t e_ = (call);                                                     \
		if (e_ != cudaSuccess) {                                                     \
			seterr(s, "%s failed: %s (%s)", #call, cudaGetErrorString(e_),      \
			       cudaGetErrorName(e_));                                        \
			return -EIO;                                                         \
		}                                                                            \
	} while (0)

static int dalloc(struct cu_stage *s, void **p, size_t bytes, const char *what)
{
	*p = NULL;
	if (s->n_dptr >= (int)(sizeof(s->dptr) / sizeof(s->dptr[0]))) {
		seterr(s, "cudaMalloc(%s): allocation table full", what);
		return -ENOMEM;
	}
	cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
	if (e != cudaSuccess) {
		size_t fr = 0, tot = 0;
		cudaGetLastError();
		cudaMemGetInfo(&fr, &tot);
		seterr(s, "cudaMalloc(%s, %zu bytes) failed: %s (device has %zu of %zu bytes free); use fewer layers per stage, fewer KV blocks or a smaller plan",
		       what, bytes, cudaGetErrorString(e), fr, tot);
		*p = NULL;
		return -ENOMEM;
	}
	s->dptr[s->n_dptr++] = *p;
	e = cudaMemset(*p, 0, bytes ? bytes : 16);
	if (e != cudaSuccess) {
		seterr(s, "cudaMemset(%s, %zu) failed: %s", what, bytes, cudaGetErrorString(e));
		return -EIO;
	}
	return 0;
}

static void dfree(struct cu_stage *s, void *p)
{
	for (int i = 0; i < s->n_dptr; i++)
		if (s->dptr[i] == p) {
			cudaFree(p);
			s->dptr[i] = s->dptr[--s->n_dptr];
			return;
		}
}

/* ---- weights ---- */

/* Upload @p t (any dtype, @p rows x @p cols) as bf16 to @p dst. */
static int upload_bf16(struct cu_stage *s, kn_bf16 *dst, const struct kn_tensor *t, int64_t rows,
		       int64_t cols)
{
	const size_t n = (size_t)rows * (size_t)cols;
	size_t have = 1;
	for (int i = 0; i < t->n_dims; i++)
		have *= (size_t)t->shape[i];
	if (have != n) {
		seterr(s, "tensor %s has %zu elements, the config implies %lld x %lld", t->name, have,
		       (long long)rows, (long long)cols);
		return -EINVAL;
	}
	if (t->dtype == KN_DT_BF16) {
		CK(cudaMemcpy(dst, t->data, n * 2, cudaMemcpyHostToDevice));
		return 0;
	}
	uint16_t *buf = (uint16_t *)malloc(STAGE_BYTES);
	if (!buf) {
		seterr(s, "malloc(%zu) for weight conversion staging failed", STAGE_BYTES);
		return -ENOMEM;
	}
	const size_t chunk = STAGE_BYTES / 2;
	for (size_t o = 0; o < n; o += chunk) {
		size_t m = n - o < chunk ? n - o : chunk;
		for (size_t i = 0; i < m; i++) {
			float f = t->dtype == KN_DT_F32 ? ((const float *)t->data)[o + i]
							: kn_f16_to_f32(((const uint16_t *)t->data)[o + i]);
			buf[i] = kn_f32_to_bf16(f);
		}
		cudaError_t e = cudaMemcpy(dst + o, buf, m * 2, cudaMemcpyHostToDevice);
		if (e != cudaSuccess) {
			free(buf);
			seterr(s, "cudaMemcpy(%s, %zu bytes) failed: %s", t->name, m * 2, cudaGetErrorString(e));
			return -EIO;
		}
	}
	free(buf);
	return 0;
}

/* Upload a small vector tensor as f32. */
static int upload_f32(struct cu_stage *s, float *dst, const struct kn_tensor *t, int64_t n)
{
	size_t have = 1;
	for (int i = 0; i < t->n_dims; i++)
		have *= (size_t)t->shape[i];
	if (have != (size_t)n) {
		seterr(s, "tensor %s has %zu elements, expected %lld", t->name, have, (long long)n);
		return -EINVAL;
	}
	float *buf = (float *)malloc((size_t)n * sizeof(float));
	if (!buf) {
		seterr(s, "malloc(%lld floats) failed", (long long)n);
		return -ENOMEM;
	}
	for (int64_t i = 0; i < n; i++)
		buf[i] = t->dtype == KN_DT_F32   ? ((const float *)t->data)[i]
			 : t->dtype == KN_DT_BF16 ? kn_bf16_to_f32(((const uint16_t *)t->data)[i])
						  : kn_f16_to_f32(((const uint16_t *)t->data)[i]);
	cudaError_t e = cudaMemcpy(dst, buf, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
	free(buf);
	if (e != cudaSuccess) {
		seterr(s, "cudaMemcpy(%s) failed: %s", t->name, cudaGetErrorString(e));
		return -EIO;
	}
	return 0;
}

static const struct kn_tensor *need(struct cu_stage *s, const char *fmt, int l)
{
	char name[160];
	snprintf(name, sizeof(name), fmt, l);
	const struct kn_tensor *t = kn_model_tensor(s->base.model, name);
	if (!t)
		seterr(s, "kn_stage_create(cuda): tensor %s is missing from %s", name,
		       kn_model_dir(s->base.model));
	return t;
}

/* Seed of weight tensor `id` of layer l (l = -1: embedding/head/final norm). */
static uint64_t wseed(uint64_t seed, int l, int id)
{
	return seed * 1000003ull + (uint64_t)(l + 1) * 64ull + (uint64_t)id;
}

static int fill_or_load_mat(struct cu_stage *s, kn_bf16 *dst, int64_t rows, int64_t cols,
			    const char *fmt, int l, int rand, uint64_t seed, int id)
{
	if (rand) {
		/* U(-a, a) with a = 1/sqrt(cols): unit-variance activations stay O(1). */
		float a = 1.0f / sqrtf((float)cols) * 1.7320508f;
		CK(kn_cuda_fill_bf16(dst, (size_t)rows * cols, wseed(seed, l, id), a, s->st));
		return 0;
	}
	const struct kn_tensor *t = need(s, fmt, l);
	return t ? upload_bf16(s, dst, t, rows, cols) : -EINVAL;
}

static int fill_or_load_vec(struct cu_stage *s, float *dst, int64_t n, const char *fmt, int l,
			    int rand, uint64_t seed, int id, float base, float scale)
{
	if (rand) {
		CK(kn_cuda_fill_f32(dst, (size_t)n, wseed(seed, l, id), base, scale, s->st));
		return 0;
	}
	const struct kn_tensor *t = need(s, fmt, l);
	return t ? upload_f32(s, dst, t, n) : -EINVAL;
}

static int load_weights(struct cu_stage *s, int rand, uint64_t seed)
{
	const struct kn_model_config *c = s->base.cfg;
	const int H = s->hidden, I = s->inter;
	int rc;
	s->L = (struct layer_w *)calloc((size_t)s->nl, sizeof(*s->L));
	if (!s->L) {
		seterr(s, "calloc(%d layers) failed", s->nl);
		return -ENOMEM;
	}
	for (int i = 0; i < s->nl; i++) {
		const int l = s->base.opts.layer_start + i;
		struct layer_w *w = &s->L[i];
		const size_t qkv_e = (size_t)s->qkv_dim * H, o_e = (size_t)H * s->q_dim;
		const size_t gu_e = (size_t)2 * I * H, d_e = (size_t)H * I;
		if ((rc = dalloc(s, (void **)&w->wqkv, qkv_e * 2, "wqkv")) ||
		    (rc = dalloc(s, (void **)&w->wo, o_e * 2, "wo")) ||
		    (rc = dalloc(s, (void **)&w->wgu, gu_e * 2, "wgate_up")) ||
		    (rc = dalloc(s, (void **)&w->wd, d_e * 2, "wdown")) ||
		    (rc = dalloc(s, (void **)&w->ln1, H * 4, "ln1")) ||
		    (rc = dalloc(s, (void **)&w->ln2, H * 4, "ln2")))
			return rc;
		s->weight_bytes += (qkv_e + o_e + gu_e + d_e) * 2 + 2 * H * 4;
		if ((rc = fill_or_load_mat(s, w->wqkv, s->q_dim, H, "model.layers.%d.self_attn.q_proj.weight", l, rand, seed, 0)) ||
		    (rc = fill_or_load_mat(s, w->wqkv + (size_t)s->q_dim * H, s->kv_dim, H, "model.layers.%d.self_attn.k_proj.weight", l, rand, seed, 1)) ||
		    (rc = fill_or_load_mat(s, w->wqkv + (size_t)(s->q_dim + s->kv_dim) * H, s->kv_dim, H, "model.layers.%d.self_attn.v_proj.weight", l, rand, seed, 2)) ||
		    (rc = fill_or_load_mat(s, w->wo, H, s->q_dim, "model.layers.%d.self_attn.o_proj.weight", l, rand, seed, 3)) ||
		    (rc = fill_or_load_mat(s, w->wgu, I, H, "model.layers.%d.mlp.gate_proj.weight", l, rand, seed, 4)) ||
		    (rc = fill_or_load_mat(s, w->wgu + (size_t)I * H, I, H, "model.layers.%d.mlp.up_proj.weight", l, rand, seed, 5)) ||
		    (rc = fill_or_load_mat(s, w->wd, H, I, "model.layers.%d.mlp.down_proj.weight", l, rand, seed, 6)) ||
		    (rc = fill_or_load_vec(s, w->ln1, H, "model.layers.%d.input_layernorm.weight", l, rand, seed, 7, 1.f, 0.1f)) ||
		    (rc = fill_or_load_vec(s, w->ln2, H, "model.layers.%d.post_attention_layernorm.weight", l, rand, seed, 8, 1.f, 0.1f)))
			return rc;
		if (c->qkv_bias) {
			if ((rc = dalloc(s, (void **)&w->bqkv, (size_t)s->qkv_dim * 4, "bqkv")) ||
			    (rc = fill_or_load_vec(s, w->bqkv, s->q_dim, "model.layers.%d.self_attn.q_proj.bias", l, rand, seed, 9, 0.f, 0.1f)) ||
			    (rc = fill_or_load_vec(s, w->bqkv + s->q_dim, s->kv_dim, "model.layers.%d.self_attn.k_proj.bias", l, rand, seed, 10, 0.f, 0.1f)) ||
			    (rc = fill_or_load_vec(s, w->bqkv + s->q_dim + s->kv_dim, s->kv_dim, "model.layers.%d.self_attn.v_proj.bias", l, rand, seed, 11, 0.f, 0.1f)))
				return rc;
			s->weight_bytes += (size_t)s->qkv_dim * 4;
		}
		if (c->qk_norm) {
			if ((rc = dalloc(s, (void **)&w->qn, (size_t)s->hd * 4, "q_norm")) ||
			    (rc = dalloc(s, (void **)&w->kn, (size_t)s->hd * 4, "k_norm")) ||
			    (rc = fill_or_load_vec(s, w->qn, s->hd, "model.layers.%d.self_attn.q_norm.weight", l, rand, seed, 12, 1.f, 0.1f)) ||
			    (rc = fill_or_load_vec(s, w->kn, s->hd, "model.layers.%d.self_attn.k_norm.weight", l, rand, seed, 13, 1.f, 0.1f)))
				return rc;
			s->weight_bytes += (size_t)s->hd * 8;
		}
	}
	const size_t emb_e = (size_t)s->vocab * H;
	if (s->base.first) {
		if ((rc = dalloc(s, (void **)&s->embed, emb_e * 2, "embed_tokens")))
			return rc;
		s->weight_bytes += emb_e * 2;
		if (rand) {
			CK(kn_cuda_fill_bf16(s->embed, emb_e, wseed(seed, -1, 0), 1.0f, s->st));
		} else {
			const struct kn_tensor *t = need(s, "model.embed_tokens.weight%.0d", 0);
			if (!t || (rc = upload_bf16(s, s->embed, t, s->vocab, H)))
				return t ? rc : -EINVAL;
		}
	}
	if (s->base.last) {
		if ((rc = dalloc(s, (void **)&s->fnorm, H * 4, "norm")) ||
		    (rc = fill_or_load_vec(s, s->fnorm, H, "model.norm.weight%.0d", 0, rand, seed, 1, 1.f, 0.1f)))
			return rc;
		s->weight_bytes += H * 4;
		if (c->tie_embeddings && s->base.first) {
			s->lm_head = s->embed;
		} else {
			if ((rc = dalloc(s, (void **)&s->lm_head, emb_e * 2, "lm_head")))
				return rc;
			s->weight_bytes += emb_e * 2;
			const char *nm = c->tie_embeddings ? "model.embed_tokens.weight%.0d" : "lm_head.weight%.0d";
			if (rand && c->tie_embeddings)
				CK(kn_cuda_fill_bf16(s->lm_head, emb_e, wseed(seed, -1, 0), 1.0f, s->st));
			else if ((rc = fill_or_load_mat(s, s->lm_head, s->vocab, H, nm, 0, rand, seed, 2)))
				return rc;
		}
	}
	CK(cudaStreamSynchronize(s->st));
	return 0;
}

/* ---- pool, workspace ---- */

static int alloc_pool(struct cu_stage *s, int32_t n_blocks)
{
	s->kv_bytes = (size_t)n_blocks * s->blk_bytes;
	int rc = dalloc(s, (void **)&s->kv, s->kv_bytes, "KV pool");
	if (rc)
		s->kv_bytes = 0;
	return rc;
}

static int alloc_workspace(struct cu_stage *s)
{
	const size_t W = (size_t)s->wmax, H = (size_t)s->hidden;
	const size_t xin = H > (size_t)s->q_dim ? (H > (size_t)s->inter ? H : (size_t)s->inter)
						  : ((size_t)s->q_dim > (size_t)s->inter ? (size_t)s->q_dim : (size_t)s->inter);
	int rc;
	/* partials for the widest plan, by the split each plan width uses */
	size_t aws = kn_cuda_attn_workspace(s->wmax, s->nh, s->nkv, s->hd, s->max_ctx, 0);
	if (s->attn_tile != 1)
		for (int i = 0; i < s->n_plans; i++) {
			const int pw = s->plans[i].width;
			const size_t b = kn_cuda_attn_workspace(pw, s->nh, s->nkv, s->hd, s->max_ctx,
								kn_cuda_attn_tile_split(pw, s->max_ctx, s->nh, s->nkv));
			aws = b > aws ? b : aws;
		}
	struct {
		void **p;
		size_t b;
		const char *what;
	} a[] = {
		{ (void **)&s->resid, W * H * 4, "residual" },
		{ (void **)&s->delta, W * H * 4, "delta" },
		{ (void **)&s->qkv, W * s->qkv_dim * 4, "qkv" },
		{ (void **)&s->gu, W * 2 * s->inter * 4, "gate_up" },
		{ (void **)&s->x, W * H * 4, "normed" },
		{ (void **)&s->att, W * s->q_dim * 4, "attention out" },
		{ (void **)&s->act, W * s->inter * 4, "swiglu out" },
		{ (void **)&s->xb, W > KN_CU_GEMV_MAX_N ? 2 * W * xin * 2 : 16, "bf16 linear input" },
		{ (void **)&s->attn_ws, aws, "attention partials" },
		{ (void **)&s->attn_cnt, W * s->nkv * sizeof(unsigned), "attention split counters" },
		{ (void **)&s->d_in, (W + 1) * sizeof(struct kn_column), "columns" },
		{ (void **)&s->d_out, W * (2 + 2 * KN_CU_MAX_TOP) * 4, "sampler outputs" },
		{ (void **)&s->d_table, (size_t)s->base.opts.n_slots * s->base.opts.max_blocks_per_slot * 4, "block table" },
		{ &s->blas_ws, BLAS_WS_BYTES, "cuBLAS workspace" },
	};
	for (size_t i = 0; i < sizeof(a) / sizeof(a[0]); i++) {
		if ((rc = dalloc(s, a[i].p, a[i].b, a[i].what)))
			return rc;
		s->ws_bytes += a[i].b;
	}
	/* the attention column kernel's split counters start at zero; every
	 * launch leaves them so */
	CK(cudaMemset(s->attn_cnt, 0, W * s->nkv * sizeof(unsigned)));
	if (s->base.last) {
		if ((rc = dalloc(s, (void **)&s->logits, W * s->vocab * 4, "logits")))
			return rc;
		s->ws_bytes += W * s->vocab * 4;
	}
	CK(cudaMemset(s->d_table, 0xff, (size_t)s->base.opts.n_slots * s->base.opts.max_blocks_per_slot * 4));
	s->d_cols = s->d_in + 1;
	for (int i = 0; i < KN_STEP_DEPTH; i++) {
		struct cu_slot *sl = &s->ring[i];
		CK(cudaHostAlloc((void **)&sl->h_in, (W + 1) * sizeof(struct kn_column), cudaHostAllocDefault));
		CK(cudaHostAlloc((void **)&sl->h_out, W * (2 + 2 * KN_CU_MAX_TOP) * 4, cudaHostAllocDefault));
		CK(cudaEventCreateWithFlags(&sl->ev, cudaEventDisableTiming));
	}
	CK(cudaHostAlloc((void **)&s->h_hidden, W * H * 4, cudaHostAllocDefault));
	CK(cudaHostAlloc((void **)&s->h_row, (size_t)s->vocab * 4, cudaHostAllocDefault));
	s->scratch = malloc((size_t)s->vocab * 8 + 64);
	if (!s->scratch) {
		seterr(s, "malloc(sampling scratch) failed");
		return -ENOMEM;
	}
	return 0;
}

/* ---- the step, as enqueued into a graph ---- */

#define CKL(call, what)                                                                       \
	do {                                                                                  \
		cudaError_t e_ = (call);                                                      \
		if (e_ != cudaSuccess) {                                                      \
			seterr(s, "%s (layer %d, plan width %d) failed: %s", what, l, W,       \
			       cudaGetErrorString(e_));                                       \
			return -EIO;                                                          \
		}                                                                             \
	} while (0)

static int linear(struct cu_stage *s, const kn_bf16 *w, const float *x, float *y, int n, int in,
		  int out)
{
	char e[256];
	if (kn_cuda_linear(s->blas, w, x, s->xb, y, n, in, out, s->wide_split, s->gemv_kind, s->st, e,
			   sizeof(e))) {
		seterr(s, "%s", e);
		return -EIO;
	}
	return 0;
}

static int linear_bf16(struct cu_stage *s, const kn_bf16 *w, float *y, int n, int in, int out)
{
	char e[256];
	if (kn_cuda_linear_bf16(s->blas, w, s->xb, y, n, in, out, e, sizeof(e))) {
		seterr(s, "%s", e);
		return -EIO;
	}
	return 0;
}

/* Residual add + RMSNorm, then the linear layer that reads the normed rows:
 * wide plans with X rounded to bf16 take the norm's output in bf16 straight
 * into cuBLAS (no f32 write, no rounding pass; same bits). */
static int norm_linear(struct cu_stage *s, int W, const float *delta, const float *nw,
		       const kn_bf16 *w, float *y, int out, int l)
{
	const int H = s->hidden;
	const float eps = s->base.cfg->rms_eps;
	if (W > KN_CU_GEMV_MAX_N && !s->wide_split) {
		CKL(kn_cuda_add_rmsnorm_bf16(s->resid, delta, nw, eps, W, H, s->xb, s->st),
		    "kn_cuda_add_rmsnorm_bf16");
		return linear_bf16(s, w, y, W, H, out);
	}
	CKL(kn_cuda_add_rmsnorm(s->resid, delta, nw, eps, W, H, s->x, s->st), "kn_cuda_add_rmsnorm");
	return linear(s, w, s->x, y, W, H, out);
}

/* The sampler's outputs for a plan of width W, back to back so one copy
 * brings them home: tokens [W], logprobs [W], top ids [W][KN_CU_MAX_TOP],
 * top logprobs [W][KN_CU_MAX_TOP]. */
struct out_layout {
	int32_t *tok;
	float *lp;
	int32_t *ids;
	float *lps;
};

static struct out_layout out_layout(int32_t *base, int W)
{
	struct out_layout o;
	o.tok = base;
	o.lp = (float *)(base + W);
	o.ids = base + 2 * W;
	o.lps = (float *)(base + 2 * W + W * KN_CU_MAX_TOP);
	return o;
}

static size_t out_bytes(int W, int n_top)
{
	return (size_t)W * (n_top > 0 ? 2 + 2 * KN_CU_MAX_TOP : 2) * 4;
}

static int enqueue(struct cu_stage *s, int W)
{
	const struct kn_model_config *c = s->base.cfg;
	const int H = s->hidden;
	const size_t lay = (size_t)2 * s->base.n_blocks * s->nkv * KN_PAGE_BLK * s->hd;
	int l = -1, rc;
	if (s->base.first)
		CKL(kn_cuda_embed(s->embed, s->d_cols, W, H, s->resid, s->st), "kn_cuda_embed");
	const float *pending = NULL;
	for (int i = 0; i < s->nl; i++) {
		const struct layer_w *w = &s->L[i];
		l = s->base.opts.layer_start + i;
		if ((rc = norm_linear(s, W, pending, w->ln1, w->wqkv, s->qkv, s->qkv_dim, l)))
			return rc;
		kn_bf16 *kc = s->kv + (size_t)i * lay, *vc = kc + lay / 2;
		struct kn_cu_qkv_args qa = {};
		qa.qkv = s->qkv;
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
		aa.scale = 1.0f / sqrtf((float)s->hd);
		/* Tile kernel: exact (q, P as hi + lo) on narrow plans, so the decode
		 * path stays f32-grade; wide plans follow the X choice (bf16 q and P,
		 * as transformers' bf16 attention, unless cuda_wide_x asks f32-grade). */
		/* auto: tile on wide plans only. At <= 16 decode columns the column
		 * kernel measured equal or faster (8B batch 8, ctx 512: 6.7 vs 7.5 ms;
		 * batch 1, ctx 4096: 4.91 vs 4.97 ms): each warp serves its 16 / GM
		 * columns' slots one after another with one page in flight. */
		aa.kernel = s->attn_tile == 2 || (s->attn_tile == 0 && W > KN_CU_GEMV_MAX_N) ? KN_CU_ATTN_TILE
											  : KN_CU_ATTN_COLUMN;
		aa.exact = W <= KN_CU_GEMV_MAX_N || s->wide_split;
		aa.split = kn_cuda_attn_tile_split(W, s->max_ctx, s->nh, s->nkv);
		CKL(kn_cuda_attention(&aa, s->st), "kn_cuda_attention");
		if ((rc = linear(s, w->wo, s->att, s->delta, W, s->q_dim, H)))
			return rc;
		if ((rc = norm_linear(s, W, s->delta, w->ln2, w->wgu, s->gu, 2 * s->inter, l)))
			return rc;
		if (W > KN_CU_GEMV_MAX_N && !s->wide_split) {
			CKL(kn_cuda_swiglu_bf16(s->gu, W, s->inter, s->xb, s->st), "kn_cuda_swiglu_bf16");
			rc = linear_bf16(s, w->wd, s->delta, W, s->inter, H);
		} else {
			CKL(kn_cuda_swiglu(s->gu, W, s->inter, s->act, s->st), "kn_cuda_swiglu");
			rc = linear(s, w->wd, s->act, s->delta, W, s->inter, H);
		}
		if (rc)
			return rc;
		pending = s->delta;
	}
	if (s->base.last) {
		if ((rc = norm_linear(s, W, pending, s->fnorm, s->lm_head, s->logits, s->vocab, l)))
			return rc;
		struct kn_cu_sample_args sa = {};
		struct out_layout o = out_layout(s->d_out, W);
		sa.logits = s->logits;
		sa.vocab = s->vocab;
		sa.cols = s->d_cols;
		sa.n = W;
		sa.n_top = (const int32_t *)s->d_in;
		sa.tokens = o.tok;
		sa.tok_lp = o.lp;
		sa.top_ids = o.ids;
		sa.top_lps = o.lps;
		CKL(kn_cuda_sample(&sa, s->st), "kn_cuda_sample");
	} else if (pending) {
		CKL(kn_cuda_add_rmsnorm(s->resid, pending, NULL, 0.f, W, H, NULL, s->st), "kn_cuda_add_rmsnorm(add)");
	}
	return 0;
}

static void drop_graphs(struct cu_stage *s)
{
	for (int i = 0; i < s->n_plans; i++)
		if (s->plans[i].exec) {
			cudaGraphExecDestroy(s->plans[i].exec);
			s->plans[i].exec = NULL;
		}
}

static int capture(struct cu_stage *s, struct plan *p)
{
	cudaGraph_t g = NULL;
	CK(cudaStreamBeginCapture(s->st, cudaStreamCaptureModeThreadLocal));
	/* Programmatic dependent launch on decode-sized plans only: measured on
	 * the H200, 1B batch 1 1.240 -> 1.168 ms, 8B batch 64 6.64 -> 6.57,
	 * batch 256 12.88 -> 12.82; the 2048-column prefill of 1B 14.9 -> 15.8 ms
	 * slower with it, 8B equal. */
	kn_cuda_pdl_suspend(p->width > KN_CU_PDL_MAX_W);
	int rc = enqueue(s, p->width);
	kn_cuda_pdl_suspend(0);
	cudaError_t e = cudaStreamEndCapture(s->st, &g);
	if (rc) {
		if (g)
			cudaGraphDestroy(g);
		cudaGetLastError();
		return rc;
	}
	if (e != cudaSuccess) {
		seterr(s, "cudaStreamEndCapture(plan width %d) failed: %s", p->width, cudaGetErrorString(e));
		return -EIO;
	}
	e = cudaGraphInstantiate(&p->exec, g, 0);
	cudaGraphDestroy(g);
	if (e != cudaSuccess) {
		p->exec = NULL;
		seterr(s, "cudaGraphInstantiate(plan width %d) failed: %s", p->width, cudaGetErrorString(e));
		return -EIO;
	}
	return 0;
}

/* Whether the step's hidden buffer @p p (k: 0 in, 1 out) is page-locked. A
 * worker hands the same region buffers step after step, so the answer for
 * the last pointer seen is kept; a pageable buffer taken for pinned would
 * still copy correctly (synchronously), only the reverse costs a bounce. */
static int is_pinned(struct cu_stage *s, int k, const void *p)
{
	if (p && p == s->pin_seen[k])
		return s->pin_known[k];
	cudaPointerAttributes pa;
	int pinned = cudaPointerGetAttributes(&pa, p) == cudaSuccess && pa.type == cudaMemoryTypeHost;
	cudaGetLastError();
	s->pin_seen[k] = p;
	s->pin_known[k] = pinned;
	return pinned;
}

/* A step's host side once its event fired: tokens, logprobs, hidden rows
 * out of the slot (and, for host_rows, the logit rows and the host sampler
 * for more than KN_CU_MAX_TOP logprobs). */
static int finish(struct cu_stage *s, struct cu_slot *sl)
{
	struct kn_step *stp = &sl->st;
	const int n = stp->n_cols;
	CK(cudaEventSynchronize(sl->ev));
	if (!s->base.last) {
		if (sl->bounce_out)
			memcpy(stp->hidden_out, s->h_hidden, (size_t)n * s->hidden * 4);
		return 0;
	}
	struct out_layout o = out_layout(sl->h_out, sl->W);
	const int nt = stp->n_logprobs;
	for (int j = 0; j < n; j++) {
		stp->tokens_out[j] = o.tok[j];
		if (stp->token_logprob_out)
			stp->token_logprob_out[j] = o.lp[j];
		if (nt > 0 && nt <= KN_CU_MAX_TOP)
			for (int i = 0; i < nt; i++) {
				stp->top_ids_out[(size_t)j * nt + i] = o.ids[(size_t)j * KN_CU_MAX_TOP + i];
				stp->top_logprobs_out[(size_t)j * nt + i] = o.lps[(size_t)j * KN_CU_MAX_TOP + i];
			}
	}
	if (!sl->host_rows)
		return 0;
	for (int j = 0; j < n; j++) {
		const struct kn_column *c = &stp->cols[j];
		if (!(c->flags & KN_COL_NEED_LOGIT))
			continue;
		float *row = stp->logits_out ? stp->logits_out + (size_t)j * s->vocab : s->h_row;
		CK(cudaMemcpy(row, s->logits + (size_t)j * s->vocab, (size_t)s->vocab * 4, cudaMemcpyDeviceToHost));
		if (nt > KN_CU_MAX_TOP)
			kn_sample_column(row, s->vocab, c, nt, NULL, stp->top_ids_out + (size_t)j * nt,
					 stp->top_logprobs_out + (size_t)j * nt, s->scratch);
	}
	return 0;
}

/* Replay the ops applied since the last submit on the stream (table.cuh). */
static int push_ops(struct cu_stage *s, struct cu_slot *sl)
{
	const int n = s->p_ops_n;
	if (n == 0)
		return 0;
	if (sl->h_ops_cap < n) {
		cudaFreeHost(sl->h_ops);
		sl->h_ops = NULL;
		sl->h_ops_cap = 0;
		CK(cudaHostAlloc((void **)&sl->h_ops, (size_t)n * sizeof(struct kn_op), cudaHostAllocDefault));
		sl->h_ops_cap = n;
	}
	if (s->d_ops_cap < n) {
		/* steps in flight may still read the old buffer */
		CK(cudaStreamSynchronize(s->st));
		dfree(s, s->d_ops);
		s->d_ops = NULL;
		s->d_ops_cap = 0;
		int cap = n < 1024 ? 1024 : n, rc;
		if ((rc = dalloc(s, (void **)&s->d_ops, (size_t)cap * sizeof(struct kn_op), "ops")))
			return rc;
		s->d_ops_cap = cap;
	}
	memcpy(sl->h_ops, s->p_ops, (size_t)n * sizeof(struct kn_op));
	CK(cudaMemcpyAsync(s->d_ops, sl->h_ops, (size_t)n * sizeof(struct kn_op), cudaMemcpyHostToDevice, s->st));
	CK(kn_cuda_apply_ops(s->d_table, s->base.opts.max_blocks_per_slot, s->d_ops, n, s->st));
	s->p_ops_n = 0;
	return 0;
}

static int cu_submit(struct kn_stage *b, struct kn_step *stp)
{
	struct cu_stage *s = (struct cu_stage *)b;
	const int n = stp->n_cols, H = s->hidden;
	int pi = 0, rc;
	CK(cudaSetDevice(s->dev));
	while (s->plans[pi].width < n)
		pi++;
	struct plan *p = &s->plans[pi];
	const int W = p->width;
	struct cu_slot *sl = &s->ring[(s->r_head + s->r_n) % KN_STEP_DEPTH];
	const int host_rows = s->base.last && (stp->logits_out || stp->n_logprobs > KN_CU_MAX_TOP);
	const int n_top = host_rows ? 0 : stp->n_logprobs;
	const int pin_in = s->base.first || is_pinned(s, 0, stp->hidden_in);
	const int pin_out = s->base.last || is_pinned(s, 1, stp->hidden_out);
	memset(&sl->h_in[0], 0, sizeof(sl->h_in[0]));
	*(int32_t *)&sl->h_in[0] = n_top;
	memcpy(sl->h_in + 1, stp->cols, (size_t)n * sizeof(struct kn_column));
	for (int j = n; j < W; j++) {
		memset(&sl->h_in[1 + j], 0, sizeof(sl->h_in[0]));
		sl->h_in[1 + j].slot = KN_CU_PAD_SLOT;
	}
	if ((rc = push_ops(s, sl)))
		return rc;
	CK(cudaMemcpyAsync(s->d_in, sl->h_in, (size_t)(W + 1) * sizeof(struct kn_column), cudaMemcpyHostToDevice,
			   s->st));
	if (!s->base.first) {
		if (pin_in) {
			CK(cudaMemcpyAsync(s->resid, stp->hidden_in, (size_t)n * H * 4, cudaMemcpyHostToDevice, s->st));
		} else {
			/* pageable rows go through the shared bounce buffer: no overlap */
			CK(cudaStreamSynchronize(s->st));
			memcpy(s->h_hidden, stp->hidden_in, (size_t)n * H * 4);
			CK(cudaMemcpyAsync(s->resid, s->h_hidden, (size_t)n * H * 4, cudaMemcpyHostToDevice, s->st));
		}
	}
	if (!p->exec && (rc = capture(s, p)))
		return rc;
	CK(cudaGraphLaunch(p->exec, s->st));
	if (s->base.last)
		CK(cudaMemcpyAsync(sl->h_out, s->d_out, out_bytes(W, n_top), cudaMemcpyDeviceToHost, s->st));
	else
		CK(cudaMemcpyAsync(pin_out ? (void *)stp->hidden_out : (void *)s->h_hidden, s->resid, (size_t)n * H * 4,
				   cudaMemcpyDeviceToHost, s->st));
	CK(cudaEventRecord(sl->ev, s->st));
	sl->st = *stp;
	sl->W = W;
	sl->n_top = n_top;
	sl->host_rows = host_rows;
	sl->bounce_out = !pin_out;
	sl->done = 0;
	s->r_n++;
	if (host_rows || !pin_in || !pin_out) {
		sl->rc = finish(s, sl);
		sl->done = 1;
	}
	return 0;
}

static int cu_wait(struct kn_stage *b)
{
	struct cu_stage *s = (struct cu_stage *)b;
	struct cu_slot *sl = &s->ring[s->r_head];
	int rc = sl->done ? sl->rc : finish(s, sl);
	s->r_head = (s->r_head + 1) % KN_STEP_DEPTH;
	s->r_n--;
	return rc;
}

static int cu_ready(struct kn_stage *b)
{
	struct cu_stage *s = (struct cu_stage *)b;
	struct cu_slot *sl = &s->ring[s->r_head];
	if (sl->done)
		return 1;
	cudaError_t e = cudaEventQuery(sl->ev);
	if (e == cudaErrorNotReady)
		return 0;
	if (e != cudaSuccess)
		cudaGetLastError(); /* the wait reports it */
	return 1;
}

/* ---- vtable ---- */

static void cu_destroy(struct kn_stage *b)
{
	struct cu_stage *s = (struct cu_stage *)b;
	if (!s)
		return;
	cudaSetDevice(s->dev);
	if (s->st)
		cudaStreamSynchronize(s->st);
	drop_graphs(s);
	if (s->blas)
		cublasDestroy(s->blas);
	if (s->st)
		cudaStreamDestroy(s->st);
	for (int i = 0; i < KN_STEP_DEPTH; i++) {
		cudaFreeHost(s->ring[i].h_in);
		cudaFreeHost(s->ring[i].h_out);
		cudaFreeHost(s->ring[i].h_ops);
		if (s->ring[i].ev)
			cudaEventDestroy(s->ring[i].ev);
	}
	free(s->p_ops);
	cudaFreeHost(s->h_hidden);
	cudaFreeHost(s->h_row);
	free(s->scratch);
	while (s->n_dptr > 0)
		cudaFree(s->dptr[--s->n_dptr]);
	free(s->L);
	kn_stage_base_fini(&s->base);
	free(s);
}

static int cu_info(const struct kn_stage *b, struct kn_stage_info *info)
{
	const struct cu_stage *s = (const struct cu_stage *)b;
	info->weight_bytes = s->weight_bytes;
	info->kv_bytes = s->kv_bytes;
	info->workspace_bytes = s->ws_bytes;
	return 0;
}

static int cu_set_pool(struct kn_stage *b, int32_t n_blocks)
{
	struct cu_stage *s = (struct cu_stage *)b;
	CK(cudaSetDevice(s->dev));
	CK(cudaStreamSynchronize(s->st));
	drop_graphs(s);
	dfree(s, s->kv);
	s->kv = NULL;
	s->kv_bytes = 0;
	int rc = alloc_pool(s, n_blocks);
	if (rc) {
		/* keep a usable stage: restore the previous size if it still fits */
		if (s->base.n_blocks > 0 && alloc_pool(s, s->base.n_blocks) == 0)
			return -ENOMEM;
		s->base.n_blocks = 0;
		return -ENOMEM;
	}
	CK(cudaMemset(s->d_table, 0xff, (size_t)s->base.opts.n_slots * s->base.opts.max_blocks_per_slot * 4));
	s->p_ops_n = 0; /* ops of the old pool: the table starts empty */
	return 0;
}

/* Keep the applied ops for the next submit, which replays them on the
 * device ahead of its step (table.cuh). */
static int cu_apply_ops(struct kn_stage *b, const struct kn_op *ops, size_t n)
{
	struct cu_stage *s = (struct cu_stage *)b;
	if (s->p_ops_n + n > (size_t)s->p_ops_cap) {
		size_t cap = (size_t)s->p_ops_cap * 2 > s->p_ops_n + n ? (size_t)s->p_ops_cap * 2 : s->p_ops_n + n + 256;
		struct kn_op *np = (struct kn_op *)realloc(s->p_ops, cap * sizeof(*np));
		if (!np) {
			seterr(s, "cu_apply_ops: out of memory for %zu pending ops", cap);
			return -ENOMEM;
		}
		s->p_ops = np;
		s->p_ops_cap = (int)cap;
	}
	memcpy(s->p_ops + s->p_ops_n, ops, n * sizeof(*ops));
	s->p_ops_n += (int)n;
	return 0;
}

/* KV pages to or from the host (kn_kv_format: per block, per layer, K then V
 * pages of [nkv][KN_PAGE_BLK][hd] bf16, which is how the pool stores a
 * block): one 2-D copy per block and K/V, the layers as its rows. Pageable
 * host memory, one call per block: fine for moving a prompt's pages, not
 * tuned (a gather kernel into a pinned buffer would be one copy). */
static int cu_kv_move(struct kn_stage *b, const int32_t *blocks, int32_t n, void *out, const void *in)
{
	struct cu_stage *s = (struct cu_stage *)b;
	const size_t page = (size_t)s->nkv * KN_PAGE_BLK * s->hd * 2;               /* bytes */
	const size_t lay = (size_t)2 * s->base.n_blocks * s->nkv * KN_PAGE_BLK * s->hd * 2; /* bytes */
	for (int32_t i = 0; i < n; i++)
		for (int kv = 0; kv < 2; kv++) {
			char *dev = (char *)s->kv + (size_t)kv * lay / 2 + (size_t)blocks[i] * page;
			const size_t host = ((size_t)i * s->nl * 2 + kv) * page;
			/* pitches past 2^31 (pools over 2 GB a layer) go layer by layer */
			const int rows = lay < ((size_t)1 << 31) ? s->nl : 1;
			cudaError_t e = cudaSuccess;
			for (int l = 0; l < s->nl && e == cudaSuccess; l += rows) {
				char *d = dev + (size_t)l * lay;
				const size_t h = host + (size_t)l * 2 * page;
				e = out ? cudaMemcpy2DAsync((char *)out + h, 2 * page, d, lay, page, (size_t)rows,
							    cudaMemcpyDeviceToHost, s->st)
					: cudaMemcpy2DAsync(d, lay, (const char *)in + h, 2 * page, page, (size_t)rows,
							    cudaMemcpyHostToDevice, s->st);
			}
			if (e != cudaSuccess) {
				cudaGetLastError();
				seterr(s, "cudaMemcpy2DAsync(KV block %d %s) failed: %s", blocks[i], out ? "out" : "in",
				       cudaGetErrorString(e));
				return -EIO;
			}
		}
	CK(cudaStreamSynchronize(s->st));
	return 0;
}

static int cu_kv_export(struct kn_stage *b, const int32_t *blocks, int32_t n, void *dst)
{
	return cu_kv_move(b, blocks, n, dst, NULL);
}

static int cu_kv_import(struct kn_stage *b, const int32_t *blocks, int32_t n, const void *src)
{
	return cu_kv_move(b, blocks, n, NULL, src);
}

static const struct kn_stage_vtbl cu_vtbl = {
	"cuda", kn_cuda_stage_create, cu_destroy, cu_info, cu_set_pool, cu_apply_ops, NULL, cu_submit, cu_wait,
	cu_ready, NULL, KN_DT_BF16, cu_kv_export, cu_kv_import,
};

static void errfill(char *err, size_t errlen, const char *msg)
{
	if (err && errlen)
		snprintf(err, errlen, "%s", msg);
}

static struct kn_stage *create(const struct kn_model *m, const struct kn_model_config *rcfg,
			       uint64_t seed, const struct kn_stage_opts *o, char *err, size_t errlen)
{
	struct cu_stage *s = (struct cu_stage *)calloc(1, sizeof(*s));
	int rc = -ENOMEM;
	if (!s) {
		errfill(err, errlen, "kn_stage_create(cuda): out of memory");
		errno = ENOMEM;
		return NULL;
	}
	if (m) {
		rc = kn_stage_base_init(&s->base, &cu_vtbl, m, o, err, errlen);
		if (rc) {
			free(s);
			errno = -rc;
			return NULL;
		}
	} else {
		/* Random weights: the same base fields kn_stage_base_init() sets. */
		s->cfg_copy = *rcfg;
		s->base.vt = &cu_vtbl;
		s->base.cfg = &s->cfg_copy;
		s->base.opts = *o;
		if (s->base.opts.layer_end < 0)
			s->base.opts.layer_end = rcfg->n_layers;
		s->base.first = s->base.opts.layer_start == 0;
		s->base.last = s->base.opts.layer_end == rcfg->n_layers;
		s->base.max_plan = o->plan_widths[o->n_plans - 1];
		size_t tn = (size_t)o->n_slots * o->max_blocks_per_slot;
		s->base.table = (int32_t *)malloc(tn * 4);
		if (!s->base.table) {
			free(s);
			errfill(err, errlen, "kn_stage_create(cuda): out of memory for the block table");
			errno = ENOMEM;
			return NULL;
		}
		memset(s->base.table, 0xff, tn * 4);
	}
	const struct kn_model_config *c = s->base.cfg;
	const struct kn_stage_opts *op = &s->base.opts;
	s->dev = op->device;
	s->nl = op->layer_end - op->layer_start;
	s->hidden = c->hidden_size;
	s->inter = c->intermediate_size;
	s->vocab = c->vocab_size;
	s->hd = c->head_dim;
	s->nh = c->n_heads;
	s->nkv = c->n_kv_heads;
	s->q_dim = s->nh * s->hd;
	s->kv_dim = s->nkv * s->hd;
	s->qkv_dim = s->q_dim + 2 * s->kv_dim;
	s->max_ctx = op->max_blocks_per_slot * KN_PAGE_BLK;
	if (c->max_position > 0 && c->max_position < s->max_ctx)
		s->max_ctx = c->max_position;
	s->wmax = s->base.max_plan;
	{
		/* Wide plans round X to bf16 by default (as transformers does);
		 * "split" adds the remainder's product: f32-grade X at twice the
		 * tensor work (for validation against f32 references). */
		const char *wx = getenv("KVFERRY_CUDA_WIDE_X");
		s->wide_split = wx ? !strcmp(wx, "split") : op->cuda_wide_x == 1;
		const char *gk = getenv("KVFERRY_CUDA_GEMV");
		s->gemv_kind = op->cuda_gemv == 1 ? KN_CU_GEMV_FFMA : op->cuda_gemv == 2 ? KN_CU_GEMV_MMA : -1;
		if (gk)
			s->gemv_kind = !strcmp(gk, "ffma") ? KN_CU_GEMV_FFMA : !strcmp(gk, "mma") ? KN_CU_GEMV_MMA : -1;
		const char *at = getenv("KVFERRY_CUDA_ATTN");
		s->attn_tile = at ? (!strcmp(at, "tile") ? 2 : !strcmp(at, "column") ? 1 : 0) : op->cuda_attn;
		if (!kn_cuda_attn_tile_ok(c->head_dim))
			s->attn_tile = 1;
	}
	s->n_plans = op->n_plans;
	for (int i = 0; i < s->n_plans; i++)
		s->plans[i].width = op->plan_widths[i];
	s->blk_bytes = (size_t)s->nl * 2 * s->nkv * KN_PAGE_BLK * s->hd * 2;

	if (s->hidden % 8 || s->inter % 8 || s->q_dim % 8 ||
	    (s->hd != 16 && s->hd != 32 && s->hd != 64 && s->hd != 128 && s->hd != 256) || s->nkv < 1 ||
	    s->nh % s->nkv || s->nh / s->nkv > 8) {
		snprintf(s->base.err, sizeof(s->base.err),
			 "kn_stage_create(cuda): unsupported shape (hidden %d, intermediate %d and heads x head_dim %d must be multiples of 8; head_dim %d must be 16/32/64/128/256; %d heads over %d KV heads must group by at most 8); use the cpu backend",
			 s->hidden, s->inter, s->q_dim, s->hd, s->nh, s->nkv);
		rc = -EINVAL;
		goto fail;
	}
	int ndev;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev <= s->dev) {
		cudaGetLastError();
		snprintf(s->base.err, sizeof(s->base.err),
			 "kn_stage_create(cuda): no CUDA device %d (cudaGetDeviceCount found none usable); use the cpu backend or fix the driver",
			 s->dev);
		rc = -ENODEV;
		goto fail;
	}
	if (cudaSetDevice(s->dev) != cudaSuccess || cudaStreamCreateWithFlags(&s->st, cudaStreamNonBlocking) != cudaSuccess) {
		snprintf(s->base.err, sizeof(s->base.err), "kn_stage_create(cuda): cudaSetDevice/cudaStreamCreate(%d) failed: %s",
			 s->dev, cudaGetErrorString(cudaGetLastError()));
		rc = -EIO;
		goto fail;
	}
	if (cublasCreate(&s->blas) != CUBLAS_STATUS_SUCCESS) {
		s->blas = NULL;
		snprintf(s->base.err, sizeof(s->base.err), "kn_stage_create(cuda): cublasCreate failed");
		rc = -EIO;
		goto fail;
	}
	if ((rc = dalloc(s, (void **)&s->inv_freq, (size_t)s->hd / 2 * 4, "inv_freq")))
		goto fail;
	{
		float *f = (float *)malloc((size_t)s->hd / 2 * 4);
		if (!f) {
			rc = -ENOMEM;
			goto fail;
		}
		kn_rope_inv_freq(c, f);
		cudaError_t e = cudaMemcpy(s->inv_freq, f, (size_t)s->hd / 2 * 4, cudaMemcpyHostToDevice);
		free(f);
		if (e != cudaSuccess) {
			seterr(s, "cudaMemcpy(inv_freq) failed: %s", cudaGetErrorString(e));
			rc = -EIO;
			goto fail;
		}
	}
	if ((rc = load_weights(s, m == NULL, seed)) || (rc = alloc_workspace(s)))
		goto fail;
	if (cublasSetStream(s->blas, s->st) != CUBLAS_STATUS_SUCCESS ||
	    cublasSetWorkspace(s->blas, s->blas_ws, BLAS_WS_BYTES) != CUBLAS_STATUS_SUCCESS ||
	    cublasSetMathMode(s->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
		seterr(s, "cublasSetStream/cublasSetWorkspace(%zu) failed", BLAS_WS_BYTES);
		rc = -EIO;
		goto fail;
	}
	{
		int32_t nb = op->n_blocks;
		if (nb < 0) {
			size_t fr = 0, tot = 0;
			if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
				seterr(s, "cudaMemGetInfo failed");
				rc = -EIO;
				goto fail;
			}
			float frac = op->kv_mem_fraction;
			if (!(frac > 0.f && frac <= 1.f)) {
				seterr(s, "kn_stage_create(cuda): kv_mem_fraction %g is not in (0, 1]", (double)frac);
				rc = -EINVAL;
				goto fail;
			}
			size_t want = (size_t)((double)fr * frac) / s->blk_bytes;
			nb = want > INT32_MAX ? INT32_MAX : (int32_t)want;
			if (nb < 1) {
				seterr(s, "kn_stage_create(cuda): %g of the %zu free device bytes holds no KV block of %zu bytes; raise kv_mem_fraction or hold fewer layers",
				       (double)frac, fr, s->blk_bytes);
				rc = -ENOMEM;
				goto fail;
			}
		}
		if ((rc = alloc_pool(s, nb)))
			goto fail;
		s->base.n_blocks = nb;
	}
	return &s->base;
fail:
	errfill(err, errlen, s->base.err);
	errno = -rc;
	cu_destroy(&s->base);
	return NULL;
}

extern "C" struct kn_stage *kn_cuda_stage_create(const struct kn_model *m, const struct kn_stage_opts *o,
						 char *err, size_t errlen)
{
	return create(m, NULL, 0, o, err, errlen);
}

extern "C" struct kn_stage *kn_cuda_stage_create_random(const struct kn_model_config *cfg, uint64_t seed,
							const struct kn_stage_opts *o, char *err,
							size_t errlen)
{
	struct kn_stage_opts d;
	if (!o) {
		kn_stage_opts_init(&d);
		o = &d;
	}
	int32_t end = o->layer_end < 0 ? cfg->n_layers : o->layer_end;
	if (o->layer_start < 0 || o->layer_start >= end || end > cfg->n_layers || o->n_plans < 1 ||
	    o->n_plans > KN_MAX_PLANS || o->n_slots < 1 || o->max_blocks_per_slot < 1) {
		errfill(err, errlen, "kn_cuda_stage_create_random: bad layer range, plans or slots");
		errno = EINVAL;
		return NULL;
	}
	return create(NULL, cfg, seed, o, err, errlen);
}

extern "C" int kn_cuda_device_count(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	return n;
}

extern "C" int kn_cuda_host_register(void *p, size_t len, char *err, size_t errlen)
{
	cudaError_t e = cudaHostRegister(p, len, cudaHostRegisterPortable);
	if (e != cudaSuccess) {
		if (err && errlen)
			snprintf(err, errlen, "cudaHostRegister(%p, %zu) failed: %s", p, len, cudaGetErrorString(e));
		return -EIO;
	}
	return 0;
}

extern "C" int kn_cuda_host_unregister(void *p)
{
	return cudaHostUnregister(p) == cudaSuccess ? 0 : -EIO;
}
