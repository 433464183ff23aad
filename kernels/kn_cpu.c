/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CPU reference engine: f32 compute over the mmapped weights as stored
 * (bf16/f16 rows are widened per 4-row tile inside the matmul, never kept as
 * an f32 copy, so resident memory stays weights + KV + a small workspace).
 *
 * Invariants:
 *  - Every column's math is independent of the others: matmuls reduce each
 *    output element in one fixed order (kn_cpu_mm.h), attention runs per
 *    (column, head) on one thread, norms per column. Hence a column's bits do
 *    not depend on its batch mates, its place in the batch, the thread count
 *    or the stage split. Plans exist for the CUDA engine; here a step
 *    computes only its n_cols columns (padding would change nothing).
 *  - All columns' K/V are written before any column attends, so a prefill
 *    chunk attends causally within itself.
 *  - The KV pool is f32: [layer][block][KN_PAGE_BLK][n_kv_heads * head_dim]
 *    for K and for V.
 *  - o and down, the layers whose outputs tensor parallelism sums over
 *    ranks, reduce each output over 8 equal blocks of K added pairwise
 *    (kn_mm.kblocks) where K splits so (a multiple of 8 x KN_LANES); a rank
 *    of T computes its 8/T blocks' subtree, and the ranks' partials added
 *    pairwise in rank order (kn_stage_opts.tp_reduce) are the whole tree:
 *    a TP run's bits equal the unsharded stage's, for T = 1, 2, 4, 8.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kn_err.h"
#include "kn_cpu_mm.h"
#include "kn_pool.h"
#include "kn_stage_impl.h"

/* LM-head columns per pass: bounds the logits workspace (16 x vocab floats,
 * 8 MiB for a 128k vocab) while still reading the head weights once per 16. */
#define LM_CHUNK 16

struct cpu_layer {
	const struct kn_tensor *in_norm, *post_norm, *q, *k, *v, *o, *gate, *up, *down;
	const struct kn_tensor *qb, *kb, *vb, *qn, *kn;
	float *kc, *vc; /* [n_blocks][KN_PAGE_BLK][KVD] */
};

struct cpu_stage {
	struct kn_stage base;
	struct kn_pool *pool;
	int32_t nl;
	struct cpu_layer *L;
	const struct kn_tensor *embed, *norm, *head;
	float *inv_freq;
	int32_t H, Hp, QD, QDp, KVD, KVDp, I, Ip, V, hd, nh, nkv, ctx; /* QD, KVD, I, nh, nkv: this rank's */
	int32_t tp, rank;   /* tensor parallelism: ranks, and which this stage is */
	int32_t ob, db;     /* K blocks of o and down (kn_mm.kblocks): 8 / tp, or 0 */
	float *part;        /* tp > 1: [W][Hp] a rank's partial sum of o or down */
	/* workspace, each [W][stride] */
	float *x, *xn, *q, *k, *v, *att, *g, *u;
	float *logits;      /* [LM_CHUNK][V] */
	float *wbuf;        /* per thread [4][Kmax] */
	float *scores;      /* per thread [ctx] */
	float *sscratch;    /* [2 * V] sampling */
	float *normw;       /* [Kmax] converted norm weights */
	int32_t kmax;
	size_t weight_bytes, kv_bytes, ws_bytes;
};

static struct cpu_stage *cs(struct kn_stage *s)
{
	return (struct cpu_stage *)s;
}

/* ------------------------------------------------------------ parallel ops */

struct mm_job {
	struct cpu_stage *c;
	struct kn_mm mm[3];
	int n_mm;
};

static void mm_worker(void *arg, int tid, int n)
{
	struct mm_job *j = arg;
	float *wbuf = j->c->wbuf + (size_t)tid * 4 * (size_t)j->c->kmax;
	for (int i = 0; i < j->n_mm; i++) {
		int32_t N = j->mm[i].N;
		/* Split on 4-row boundaries so tiles stay whole. */
		int32_t groups = (N + 3) / 4;
		int32_t g0 = (int32_t)((int64_t)groups * tid / n), g1 = (int32_t)((int64_t)groups * (tid + 1) / n);
		int32_t o0 = g0 * 4, o1 = g1 * 4 < N ? g1 * 4 : N;
		if (o0 < o1)
			kn_mm_rows(&j->mm[i], o0, o1, wbuf);
	}
}

static struct kn_mm mk(const struct kn_tensor *w, const struct kn_tensor *b, const float *x, int32_t ldx,
		       float *y, int32_t ldy, int32_t n, int accumulate)
{
	return (struct kn_mm){ .w = w, .bias = b, .x = x, .y = y, .ldx = ldx, .ldy = ldy, .n = n,
			       .K = (int32_t)w->shape[1], .N = (int32_t)w->shape[0], .accumulate = accumulate };
}

/* This rank's rows [rank * N, +N) of @p w (q, k, v, gate, up: heads or MLP columns). */
static struct kn_mm mk_rows(const struct cpu_stage *c, const struct kn_tensor *w, const struct kn_tensor *b,
			    const float *x, int32_t ldx, float *y, int32_t ldy, int32_t n, int32_t N)
{
	struct kn_mm mm = mk(w, b, x, ldx, y, ldy, n, 0);

	mm.N = N;
	mm.row0 = c->rank * N;
	return mm;
}

/* This rank's columns [rank * K, +K) of @p w (o, down), reduced over
 * @p kblocks blocks; into c->part with tp > 1, else added to @p y. */
static struct kn_mm mk_cols(const struct cpu_stage *c, const struct kn_tensor *w, const float *x, int32_t ldx,
			    float *y, int32_t ldy, int32_t n, int32_t K, int32_t kblocks)
{
	struct kn_mm mm = mk(w, NULL, x, ldx, c->tp > 1 ? c->part : y, ldy, n, c->tp == 1);

	mm.ldw = mm.K;
	mm.K = K;
	mm.koff = c->rank * K;
	mm.kblocks = kblocks;
	return mm;
}

/* tp > 1: every rank's partial (c->part) summed, then added to the residual. */
static int tp_add(struct cpu_stage *c, int32_t n)
{
	int rc;

	if (c->tp == 1)
		return 0;
	rc = c->base.opts.tp_reduce(c->base.opts.tp_arg, c->part, n, c->Hp, c->H);
	if (rc < 0) {
		kn_stage_seterr(&c->base, "tensor-parallel reduce (rank %d of %d) failed: %s", c->rank, c->tp,
				strerror(-rc));
		return rc;
	}
	for (int32_t j = 0; j < n; j++)
		for (int32_t i = 0; i < c->H; i++)
			c->x[(size_t)j * c->Hp + i] += c->part[(size_t)j * c->Hp + i];
	return 0;
}

static void run_mm(struct cpu_stage *c, struct kn_mm *mm, int n_mm)
{
	struct mm_job j = { .c = c, .n_mm = n_mm };
	memcpy(j.mm, mm, (size_t)n_mm * sizeof(*mm));
	kn_pool_run(c->pool, mm_worker, &j);
}

/* y = x * rsqrt(mean(x^2) + eps) * w, as transformers' RMSNorm computes it. */
static void rmsnorm(const float *x, const float *w, float *y, int32_t n, float eps)
{
	float ss = 0;
	for (int32_t i = 0; i < n; i++)
		ss += x[i] * x[i];
	float r = 1.0f / sqrtf(ss / (float)n + eps);
	for (int32_t i = 0; i < n; i++)
		y[i] = w[i] * (x[i] * r);
}

static void norm_cols(struct cpu_stage *c, const struct kn_tensor *w, const float *x, float *y,
		      int32_t n, int32_t dim, int32_t ld)
{
	kn_row_to_f32(w->data, w->dtype, dim, c->normw);
	for (int32_t j = 0; j < n; j++)
		rmsnorm(x + (size_t)j * (size_t)ld, c->normw, y + (size_t)j * (size_t)ld, dim, c->base.cfg->rms_eps);
}

static void rope(float *v, const struct cpu_stage *c, int32_t pos)
{
	int32_t half = c->hd / 2;
	for (int32_t i = 0; i < half; i++) {
		float a = (float)pos * c->inv_freq[i];
		float co = cosf(a), si = sinf(a);
		float x0 = v[i], x1 = v[i + half];
		v[i] = x0 * co - x1 * si;
		v[i + half] = x1 * co + x0 * si;
	}
}

struct attn_job {
	struct cpu_stage *c;
	const struct kn_column *cols;
	int32_t n;
	struct cpu_layer *L;
};

static void attn_worker(void *arg, int tid, int nt)
{
	struct attn_job *j = arg;
	struct cpu_stage *c = j->c;
	float *sc = c->scores + (size_t)tid * (size_t)c->ctx;
	int32_t total = j->n * c->nh, group = c->nh / c->nkv;
	int32_t hdp = kn_pad(c->hd);
	float scale = 1.0f / sqrtf((float)c->hd);
	float qv[hdp], kv[hdp], acc[hdp];

	for (int32_t t = (int32_t)((int64_t)total * tid / nt); t < (int32_t)((int64_t)total * (tid + 1) / nt); t++) {
		int32_t col = t / c->nh, h = t % c->nh, kh = h / group;
		const struct kn_column *cl = &j->cols[col];
		memset(qv, 0, sizeof(qv));
		memset(kv, 0, sizeof(kv));
		memset(acc, 0, sizeof(acc));
		memcpy(qv, c->q + (size_t)col * (size_t)c->QDp + (size_t)h * (size_t)c->hd, (size_t)c->hd * sizeof(float));
		float mx = -INFINITY;
		for (int32_t p = 0; p <= cl->pos; p++) {
			int32_t blk = kn_stage_block(&c->base, cl->slot, p);
			const float *kp = j->L->kc + ((size_t)blk * KN_PAGE_BLK + (size_t)(p % KN_PAGE_BLK)) * (size_t)c->KVD
					  + (size_t)kh * (size_t)c->hd;
			memcpy(kv, kp, (size_t)c->hd * sizeof(float));
			sc[p] = kn_dot(qv, kv, hdp) * scale;
			if (sc[p] > mx)
				mx = sc[p];
		}
		float sum = 0;
		for (int32_t p = 0; p <= cl->pos; p++) {
			sc[p] = expf(sc[p] - mx);
			sum += sc[p];
		}
		for (int32_t p = 0; p <= cl->pos; p++) {
			int32_t blk = kn_stage_block(&c->base, cl->slot, p);
			const float *vp = j->L->vc + ((size_t)blk * KN_PAGE_BLK + (size_t)(p % KN_PAGE_BLK)) * (size_t)c->KVD
					  + (size_t)kh * (size_t)c->hd;
			memcpy(kv, vp, (size_t)c->hd * sizeof(float));
			kn_axpy(sc[p] / sum, kv, acc, hdp);
		}
		memcpy(c->att + (size_t)col * (size_t)c->QDp + (size_t)h * (size_t)c->hd, acc, (size_t)c->hd * sizeof(float));
	}
}

/* ------------------------------------------------------------------- step */

static int check_finite(struct cpu_stage *c, const float *x, int32_t n, int32_t dim, int32_t ld, const char *where,
			int32_t layer)
{
	for (int32_t j = 0; j < n; j++)
		for (int32_t i = 0; i < dim; i++)
			if (!isfinite(x[(size_t)j * (size_t)ld + (size_t)i])) {
				kn_stage_seterr(&c->base, "non-finite value %g in column %d, element %d, %s %d: the model's weights hold NaN/Inf (check model.layers.%d.* in %s)",
						(double)x[(size_t)j * (size_t)ld + (size_t)i], j, i, where, layer, layer,
						kn_model_dir(c->base.model));
				return -EINVAL;
			}
	return 0;
}

static int layer_forward(struct cpu_stage *c, struct cpu_layer *L, const struct kn_column *cols, int32_t n)
{
	struct kn_mm mm[3];
	const struct kn_model_config *cfg = c->base.cfg;
	int rc;

	norm_cols(c, L->in_norm, c->x, c->xn, n, c->H, c->Hp);
	mm[0] = mk_rows(c, L->q, L->qb, c->xn, c->Hp, c->q, c->QDp, n, c->QD);
	mm[1] = mk_rows(c, L->k, L->kb, c->xn, c->Hp, c->k, c->KVDp, n, c->KVD);
	mm[2] = mk_rows(c, L->v, L->vb, c->xn, c->Hp, c->v, c->KVDp, n, c->KVD);
	run_mm(c, mm, 3);

	float qn[c->hd], kn[c->hd];
	if (cfg->qk_norm) {
		kn_row_to_f32(L->qn->data, L->qn->dtype, c->hd, c->normw);
		memcpy(qn, c->normw, sizeof(qn));
		kn_row_to_f32(L->kn->data, L->kn->dtype, c->hd, c->normw);
		memcpy(kn, c->normw, sizeof(kn));
	}
	for (int32_t j = 0; j < n; j++) {
		float *q = c->q + (size_t)j * (size_t)c->QDp, *k = c->k + (size_t)j * (size_t)c->KVDp;
		for (int32_t h = 0; h < c->nh; h++) {
			if (cfg->qk_norm)
				rmsnorm(q + h * c->hd, qn, q + h * c->hd, c->hd, cfg->rms_eps);
			rope(q + h * c->hd, c, cols[j].pos);
		}
		for (int32_t h = 0; h < c->nkv; h++) {
			if (cfg->qk_norm)
				rmsnorm(k + h * c->hd, kn, k + h * c->hd, c->hd, cfg->rms_eps);
			rope(k + h * c->hd, c, cols[j].pos);
		}
		/* Write K/V of every column before anyone attends. */
		int32_t blk = kn_stage_block(&c->base, cols[j].slot, cols[j].pos);
		size_t off = ((size_t)blk * KN_PAGE_BLK + (size_t)(cols[j].pos % KN_PAGE_BLK)) * (size_t)c->KVD;
		memcpy(L->kc + off, k, (size_t)c->KVD * sizeof(float));
		memcpy(L->vc + off, c->v + (size_t)j * (size_t)c->KVDp, (size_t)c->KVD * sizeof(float));
	}
	struct attn_job aj = { .c = c, .cols = cols, .n = n, .L = L };
	kn_pool_run(c->pool, attn_worker, &aj);

	mm[0] = mk_cols(c, L->o, c->att, c->QDp, c->x, c->Hp, n, c->QD, c->ob);
	run_mm(c, mm, 1);
	if ((rc = tp_add(c, n)) < 0)
		return rc;

	norm_cols(c, L->post_norm, c->x, c->xn, n, c->H, c->Hp);
	mm[0] = mk_rows(c, L->gate, NULL, c->xn, c->Hp, c->g, c->Ip, n, c->I);
	mm[1] = mk_rows(c, L->up, NULL, c->xn, c->Hp, c->u, c->Ip, n, c->I);
	run_mm(c, mm, 2);
	for (int32_t j = 0; j < n; j++) {
		float *g = c->g + (size_t)j * (size_t)c->Ip, *u = c->u + (size_t)j * (size_t)c->Ip;
		for (int32_t i = 0; i < c->I; i++)
			g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
	}
	mm[0] = mk_cols(c, L->down, c->g, c->Ip, c->x, c->Hp, n, c->I, c->db);
	run_mm(c, mm, 1);
	return tp_add(c, n);
}

static int cpu_step(struct kn_stage *s, struct kn_step *st)
{
	struct cpu_stage *c = cs(s);
	int32_t n = st->n_cols;
	const struct kn_column *cols = st->cols;
	int rc;

	if (s->first) {
		size_t esz = c->embed->dtype == KN_DT_F32 ? 4 : 2;
		for (int32_t j = 0; j < n; j++)
			kn_row_to_f32((const uint8_t *)c->embed->data + (size_t)cols[j].token * (size_t)c->H * esz,
				      c->embed->dtype, c->H, c->x + (size_t)j * (size_t)c->Hp);
	} else {
		for (int32_t j = 0; j < n; j++)
			memcpy(c->x + (size_t)j * (size_t)c->Hp, st->hidden_in + (size_t)j * (size_t)c->H,
			       (size_t)c->H * sizeof(float));
	}
	for (int32_t l = 0; l < c->nl; l++) {
		if ((rc = layer_forward(c, &c->L[l], cols, n)) < 0)
			return rc;
		rc = check_finite(c, c->x, n, c->H, c->Hp, "after layer", s->opts.layer_start + l);
		if (rc)
			return rc;
	}
	if (!s->last) {
		for (int32_t j = 0; j < n; j++)
			memcpy(st->hidden_out + (size_t)j * (size_t)c->H, c->x + (size_t)j * (size_t)c->Hp,
			       (size_t)c->H * sizeof(float));
		return 0;
	}
	/* Final norm + LM head for the columns that want a token, LM_CHUNK at a time. */
	int32_t idx[LM_CHUNK];
	for (int32_t j = 0; j < n; j++)
		st->tokens_out[j] = -1;
	for (int32_t j0 = 0; j0 < n;) {
		int32_t m = 0;
		for (; j0 < n && m < LM_CHUNK; j0++)
			if (cols[j0].flags & KN_COL_NEED_LOGIT)
				idx[m++] = j0;
		if (!m)
			break;
		kn_row_to_f32(c->norm->data, c->norm->dtype, c->H, c->normw);
		for (int32_t i = 0; i < m; i++)
			rmsnorm(c->x + (size_t)idx[i] * (size_t)c->Hp, c->normw, c->xn + (size_t)i * (size_t)c->Hp, c->H,
				s->cfg->rms_eps);
		struct kn_mm mm = mk(c->head, NULL, c->xn, c->Hp, c->logits, c->V, m, 0);
		run_mm(c, &mm, 1);
		for (int32_t i = 0; i < m; i++) {
			int32_t j = idx[i];
			const float *lg = c->logits + (size_t)i * (size_t)c->V;
			rc = check_finite(c, lg, 1, c->V, c->V, "logits after layer", s->opts.layer_end - 1);
			if (rc)
				return rc;
			if (st->logits_out)
				memcpy(st->logits_out + (size_t)j * (size_t)c->V, lg, (size_t)c->V * sizeof(float));
			st->tokens_out[j] = kn_sample_column(
				lg, c->V, &cols[j], st->n_logprobs,
				st->token_logprob_out ? &st->token_logprob_out[j] : NULL,
				st->n_logprobs ? st->top_ids_out + (size_t)j * (size_t)st->n_logprobs : NULL,
				st->n_logprobs ? st->top_logprobs_out + (size_t)j * (size_t)st->n_logprobs : NULL,
				c->sscratch);
		}
	}
	return 0;
}

/* --------------------------------------------------------------- lifetime */

static void free_pool(struct cpu_stage *c)
{
	for (int32_t l = 0; l < c->nl; l++) {
		free(c->L[l].kc);
		free(c->L[l].vc);
		c->L[l].kc = c->L[l].vc = NULL;
	}
}

/* Allocate a pool of @p n_blocks; the old one is freed only on success, so
 * a failed resize leaves the stage as it was. */
static int alloc_pool(struct cpu_stage *c, int32_t n_blocks)
{
	size_t per = (size_t)n_blocks * KN_PAGE_BLK * (size_t)c->KVD;
	float **nk = calloc((size_t)c->nl * 2, sizeof(float *));
	if (!nk)
		return -ENOMEM;
	for (int32_t l = 0; l < 2 * c->nl; l++) {
		/* calloc: unwritten K/V reads as zeros, never as garbage. */
		nk[l] = calloc(per, sizeof(float));
		if (!nk[l]) {
			for (int32_t i = 0; i < l; i++)
				free(nk[i]);
			free(nk);
			return -ENOMEM;
		}
	}
	free_pool(c);
	for (int32_t l = 0; l < c->nl; l++) {
		c->L[l].kc = nk[2 * l];
		c->L[l].vc = nk[2 * l + 1];
	}
	free(nk);
	c->kv_bytes = 2 * per * sizeof(float) * (size_t)c->nl;
	c->base.n_blocks = n_blocks;
	return 0;
}

static int cpu_set_pool(struct kn_stage *s, int32_t n_blocks)
{
	struct cpu_stage *c = cs(s);
	int rc = alloc_pool(c, n_blocks);
	if (rc)
		kn_stage_seterr(s, "kn_stage_set_pool(%d): out of memory for %zu bytes of KV", n_blocks,
				2 * (size_t)n_blocks * KN_PAGE_BLK * (size_t)c->KVD * sizeof(float) * (size_t)c->nl);
	return rc;
}

static int cpu_info(const struct kn_stage *s, struct kn_stage_info *info)
{
	const struct cpu_stage *c = (const struct cpu_stage *)s;
	info->weight_bytes = c->weight_bytes;
	info->kv_bytes = c->kv_bytes;
	info->workspace_bytes = c->ws_bytes;
	return 0;
}

static void cpu_destroy(struct kn_stage *s)
{
	struct cpu_stage *c = cs(s);
	if (c->L)
		free_pool(c);
	kn_pool_destroy(c->pool);
	free(c->L);
	free(c->inv_freq);
	free(c->x);
	free(c->xn);
	free(c->q);
	free(c->k);
	free(c->v);
	free(c->att);
	free(c->g);
	free(c->u);
	free(c->part);
	free(c->logits);
	free(c->wbuf);
	free(c->scores);
	free(c->sscratch);
	free(c->normw);
	kn_stage_base_fini(s);
	free(c);
}

/* One page of one layer between the pool's [pos][head][d] rows and the
 * kn_kv_format's [head][pos][d]: to `out` when set, else from `in`. The
 * format holds every KV head of the stage; a rank of a tensor-parallel
 * stage moves its own heads' rows, [rank * nkv, +nkv), and leaves the
 * others' bytes to their ranks. */
static void kv_page(const struct cpu_stage *c, float *pool, float *out, const float *in)
{
	for (int32_t h = 0; h < c->nkv; h++)
		for (int32_t p = 0; p < KN_PAGE_BLK; p++) {
			float *a = pool + (size_t)p * c->KVD + (size_t)h * c->hd;
			const size_t o = ((size_t)(c->rank * c->nkv + h) * KN_PAGE_BLK + p) * c->hd;
			if (out)
				memcpy(out + o, a, (size_t)c->hd * sizeof(float));
			else
				memcpy(a, in + o, (size_t)c->hd * sizeof(float));
		}
}

/* Floats of one layer's K (or V) page in the kn_kv_format: every rank's heads. */
static size_t fmt_page(const struct cpu_stage *c)
{
	return (size_t)KN_PAGE_BLK * c->KVD * c->tp;
}

static void kv_move(struct cpu_stage *c, const int32_t *blocks, int32_t n, float *out, const float *in)
{
	const size_t page = (size_t)KN_PAGE_BLK * c->KVD, fpage = fmt_page(c);
	for (int32_t i = 0; i < n; i++)
		for (int32_t l = 0; l < c->nl; l++) {
			const size_t o = ((size_t)i * c->nl + l) * 2 * fpage;
			kv_page(c, c->L[l].kc + (size_t)blocks[i] * page, out ? out + o : NULL, in ? in + o : NULL);
			kv_page(c, c->L[l].vc + (size_t)blocks[i] * page, out ? out + o + fpage : NULL,
				in ? in + o + fpage : NULL);
		}
}

static int cpu_kv_export(struct kn_stage *s, const int32_t *blocks, int32_t n, void *dst)
{
	kv_move((struct cpu_stage *)s, blocks, n, dst, NULL);
	return 0;
}

static int cpu_kv_import(struct kn_stage *s, const int32_t *blocks, int32_t n, const void *src)
{
	kv_move((struct cpu_stage *)s, blocks, n, NULL, src);
	return 0;
}

/* The same, the pages read from pieces row by row, each row straight into
 * the pool (a row may span two pieces); a rank skips the other ranks' heads. */
static int cpu_kv_import_segs(struct kn_stage *s, const int32_t *blocks, int32_t n, struct kn_seg_cursor *cur)
{
	struct cpu_stage *c = (struct cpu_stage *)s;
	const size_t page = (size_t)KN_PAGE_BLK * c->KVD, mine = page * sizeof(float);
	const size_t before = (size_t)c->rank * mine, after = (size_t)(c->tp - 1 - c->rank) * mine;

	for (int32_t i = 0; i < n; i++)
		for (int32_t l = 0; l < c->nl; l++)
			for (int kv = 0; kv < 2; kv++) {
				float *pool = (kv ? c->L[l].vc : c->L[l].kc) + (size_t)blocks[i] * page;

				kn_seg_read(cur, NULL, before);
				for (int32_t h = 0; h < c->nkv; h++)
					for (int32_t p = 0; p < KN_PAGE_BLK; p++)
						kn_seg_read(cur, pool + (size_t)p * c->KVD + (size_t)h * c->hd,
							    (size_t)c->hd * sizeof(float));
				kn_seg_read(cur, NULL, after);
			}
	return 0;
}

static const struct kn_stage_vtbl cpu_vtbl = {
	.name = "cpu",
	.create = kn_cpu_stage_create,
	.destroy = cpu_destroy,
	.info = cpu_info,
	.set_pool = cpu_set_pool,
	.apply_ops = NULL,
	.step = cpu_step,
	.error = NULL,
	.kv_dtype = KN_DT_F32,
	.kv_export = cpu_kv_export,
	.kv_import = cpu_kv_import,
	.kv_import_segs = cpu_kv_import_segs,
};

static const struct kn_tensor *lt(const struct kn_model *m, int32_t l, const char *suffix, size_t *bytes)
{
	char name[128];
	snprintf(name, sizeof(name), "model.layers.%d.%s", l, suffix);
	const struct kn_tensor *t = kn_model_tensor(m, name);
	if (t)
		*bytes += t->nbytes;
	return t;
}


static float *ws(struct cpu_stage *c, size_t n, int *fail)
{
	float *p = calloc(n ? n : 1, sizeof(float));
	if (!p)
		*fail = 1;
	c->ws_bytes += n * sizeof(float);
	return p;
}

struct kn_stage *kn_cpu_stage_create(const struct kn_model *m, const struct kn_stage_opts *o, char *err,
				     size_t errlen)
{
	struct cpu_stage *c = calloc(1, sizeof(*c));
	int fail = 0, rc;
	if (!c) {
		kn_seterr(err, errlen, "kn_stage_create(cpu): out of memory");
		errno = ENOMEM;
		return NULL;
	}
	rc = kn_stage_base_init(&c->base, &cpu_vtbl, m, o, err, errlen);
	if (rc) {
		free(c);
		errno = -rc;
		return NULL;
	}
	struct kn_stage *s = &c->base;
	const struct kn_model_config *cfg = s->cfg;
	c->H = cfg->hidden_size;
	c->Hp = kn_pad(c->H);
	c->hd = cfg->head_dim;
	c->nh = cfg->n_heads;
	c->nkv = cfg->n_kv_heads;
	c->QD = c->nh * c->hd;
	c->QDp = kn_pad(c->QD);
	c->KVD = c->nkv * c->hd;
	c->KVDp = kn_pad(c->KVD);
	c->I = cfg->intermediate_size;
	c->Ip = kn_pad(c->I);
	c->tp = s->opts.tp_size > 1 ? s->opts.tp_size : 1;
	c->rank = c->tp > 1 ? s->opts.tp_rank : 0;
	/* o and down over 8 blocks of K where K allows it (any tp then gives
	 * the same bits; kn_cpu.c's header) */
	c->ob = c->QD % (KN_MM_MAX_KBLOCKS * KN_LANES) == 0 ? KN_MM_MAX_KBLOCKS : 0;
	c->db = c->I % (KN_MM_MAX_KBLOCKS * KN_LANES) == 0 ? KN_MM_MAX_KBLOCKS : 0;
	if (c->tp > 1) {
		const char *why = (c->tp & (c->tp - 1)) || c->tp > KN_MM_MAX_KBLOCKS ? "tp_size must be 1, 2, 4 or 8"
				  : c->rank < 0 || c->rank >= c->tp ? "tp_rank must be below tp_size"
				  : !s->opts.tp_reduce ? "tensor parallelism needs a reduce (kn_stage_opts.tp_reduce)"
				  : c->nh % c->tp || c->nkv % c->tp ? "the heads and KV heads must split evenly over the ranks"
				  : !c->ob || !c->db ? "q_dim and the MLP's intermediate size must be multiples of 128"
				  : NULL;

		if (why != NULL) {
			kn_seterr(err, errlen, "kn_stage_create(cpu): tp_size %d, rank %d with %d heads, %d KV heads, "
				  "q_dim %d, intermediate %d: %s; run this model with fewer ranks (tp_size 1 always works)",
				  s->opts.tp_size, s->opts.tp_rank, c->nh, c->nkv, c->QD, c->I, why);
			cpu_destroy(s);
			errno = EINVAL;
			return NULL;
		}
		c->ob = c->db = KN_MM_MAX_KBLOCKS / c->tp;
		c->nh /= c->tp;
		c->nkv /= c->tp;
		c->QD = c->nh * c->hd;
		c->QDp = kn_pad(c->QD);
		c->KVD = c->nkv * c->hd;
		c->KVDp = kn_pad(c->KVD);
		c->I /= c->tp;
		c->Ip = kn_pad(c->I);
	}
	c->V = cfg->vocab_size;
	c->ctx = s->opts.max_blocks_per_slot * KN_PAGE_BLK;
	c->kmax = c->Hp > c->Ip ? c->Hp : c->Ip;
	if (c->QDp > c->kmax)
		c->kmax = c->QDp;
	c->nl = s->opts.layer_end - s->opts.layer_start;
	c->L = calloc((size_t)c->nl, sizeof(*c->L));
	if (!c->L)
		goto nomem;
	for (int32_t i = 0; i < c->nl; i++) {
		int32_t l = s->opts.layer_start + i;
		struct cpu_layer *L = &c->L[i];
		L->in_norm = lt(m, l, "input_layernorm.weight", &c->weight_bytes);
		L->post_norm = lt(m, l, "post_attention_layernorm.weight", &c->weight_bytes);
		L->q = lt(m, l, "self_attn.q_proj.weight", &c->weight_bytes);
		L->k = lt(m, l, "self_attn.k_proj.weight", &c->weight_bytes);
		L->v = lt(m, l, "self_attn.v_proj.weight", &c->weight_bytes);
		L->o = lt(m, l, "self_attn.o_proj.weight", &c->weight_bytes);
		L->gate = lt(m, l, "mlp.gate_proj.weight", &c->weight_bytes);
		L->up = lt(m, l, "mlp.up_proj.weight", &c->weight_bytes);
		L->down = lt(m, l, "mlp.down_proj.weight", &c->weight_bytes);
		if (cfg->qkv_bias) {
			L->qb = lt(m, l, "self_attn.q_proj.bias", &c->weight_bytes);
			L->kb = lt(m, l, "self_attn.k_proj.bias", &c->weight_bytes);
			L->vb = lt(m, l, "self_attn.v_proj.bias", &c->weight_bytes);
		}
		if (cfg->qk_norm) {
			L->qn = lt(m, l, "self_attn.q_norm.weight", &c->weight_bytes);
			L->kn = lt(m, l, "self_attn.k_norm.weight", &c->weight_bytes);
		}
	}
	if (s->first) {
		c->embed = kn_model_tensor(m, "model.embed_tokens.weight");
		c->weight_bytes += c->embed->nbytes;
	}
	if (s->last) {
		c->norm = kn_model_tensor(m, "model.norm.weight");
		c->head = kn_model_tensor(m, "lm_head.weight");
		if (!c->head)
			c->head = kn_model_tensor(m, "model.embed_tokens.weight");
		c->weight_bytes += c->norm->nbytes + (c->head == c->embed ? 0 : c->head->nbytes);
	}

	int32_t nt = s->opts.n_threads > 0 ? s->opts.n_threads : (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
	if (nt < 1)
		nt = 1;
	size_t W = (size_t)s->max_plan;
	c->inv_freq = ws(c, (size_t)c->hd / 2, &fail);
	c->x = ws(c, W * (size_t)c->Hp, &fail);
	c->xn = ws(c, W * (size_t)c->Hp, &fail);
	c->q = ws(c, W * (size_t)c->QDp, &fail);
	c->k = ws(c, W * (size_t)c->KVDp, &fail);
	c->v = ws(c, W * (size_t)c->KVDp, &fail);
	c->att = ws(c, W * (size_t)c->QDp, &fail);
	c->g = ws(c, W * (size_t)c->Ip, &fail);
	c->u = ws(c, W * (size_t)c->Ip, &fail);
	c->part = c->tp > 1 ? ws(c, W * (size_t)c->Hp, &fail) : NULL;
	c->logits = s->last ? ws(c, (size_t)LM_CHUNK * (size_t)c->V, &fail) : NULL;
	c->wbuf = ws(c, (size_t)nt * 4 * (size_t)c->kmax, &fail);
	c->scores = ws(c, (size_t)nt * (size_t)c->ctx, &fail);
	c->sscratch = s->last ? ws(c, 2 * (size_t)c->V, &fail) : NULL;
	c->normw = ws(c, (size_t)c->kmax, &fail);
	if (fail)
		goto nomem;
	kn_rope_inv_freq(cfg, c->inv_freq);

	int32_t nb = s->opts.n_blocks;
	if (nb < 0) {
		size_t per_block = 2 * (size_t)KN_PAGE_BLK * (size_t)c->KVD * sizeof(float) * (size_t)c->nl;
		size_t b = s->opts.kv_budget_bytes / per_block;
		nb = b > INT32_MAX ? INT32_MAX : (int32_t)b;
		if (nb < 1) {
			kn_seterr(err, errlen, "kn_stage_create(cpu): kv_budget_bytes %zu holds no block (%zu bytes each for layers [%d, %d)); raise the budget",
				 s->opts.kv_budget_bytes, per_block, s->opts.layer_start, s->opts.layer_end);
			cpu_destroy(s);
			errno = EINVAL;
			return NULL;
		}
	}
	if (alloc_pool(c, nb))
		goto nomem;
	c->pool = kn_pool_create(nt);
	if (!c->pool)
		goto nomem;
	return s;
nomem:
	kn_seterr(err, errlen, "kn_stage_create(cpu): out of memory for layers [%d, %d) (workspace %zu bytes, %d KV blocks)",
		 s->opts.layer_start, s->opts.layer_end, c->ws_bytes, s->opts.n_blocks);
	cpu_destroy(s);
	errno = ENOMEM;
	return NULL;
}
