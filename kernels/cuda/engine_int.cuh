/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA stage engine's private parts, shared by its files: the stage
 * (struct cu_stage), its error and allocation helpers, and what each file
 * offers the others. engine.cu holds the step path and the vtable
 * (its invariants are written there), weights.cu the weights, pool and
 * workspace, graph.cu the step as enqueued into a graph and its capture.
 */
#ifndef KN_CUDA_ENGINE_INT_CUH
#define KN_CUDA_ENGINE_INT_CUH

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
#include "gather.cuh"
#include "gemm.cuh"
#include "gemm_wg.cuh"
#include "gemv.cuh"
#include "kn_cuda.h"
#include "kn_stage_impl.h"
#include "qkv_rope.cuh"
#include "rmsnorm.cuh"
#include "sample.cuh"
#include "swiglu.cuh"
#include "table.cuh"

/* Widest plan whose graph uses programmatic dependent launch (cu_capture()). */
#define KN_CU_PDL_MAX_W 256
/* cuBLAS workspace: set explicitly so graph capture never allocates. */
#define BLAS_WS_BYTES ((size_t)32 << 20)
/* Conversion staging for non-bf16 weights (f32/f16 files). */
#define STAGE_BYTES ((size_t)64 << 20)
/* Pieces per launch of the KV gather (gather.cuh): a 2 MiB page message is ~240 frames */
#define CU_GATHER_TABLE 4096

struct layer_w {
	kn_bf16 *wqkv;  /* [q_dim + 2 kv_dim][hidden] */
	kn_bf16 *wo;    /* [hidden][q_dim] */
	kn_bf16 *wgu;   /* [2 inter][hidden]: gate rows, then up rows */
	kn_bf16 *wd;    /* [hidden][inter] */
	float *ln1, *ln2; /* [hidden] */
	float *bqkv;    /* [qkv_dim] or NULL */
	float *qn, *kn; /* [head_dim] or NULL */
};

/* A plan's graphs are captured per context bucket: the attention grids are
 * sized for the longest context a step's columns have, rounded up to a power
 * of two from CU_CTX_MIN (at most the stage's max_ctx), not for the stage's
 * max_ctx (the model's, e.g. 131072, unless [model] max_context is set),
 * whose grid launched thousands of blocks past every column. */
#define CU_CTX_MIN 1024
#define CU_CTX_BUCKETS 16
/* Plans wider than CU_LOGIT_K have a second graph per bucket whose final
 * norm's output is packed to the CU_LOGIT_K rows of the columns that want a
 * token, so the LM head and the sampler run on those alone (a prompt chunk
 * wants one token, not one a position): taken when at most CU_LOGIT_K
 * columns of the step want one and no logit rows go to the host. */
#define CU_LOGIT_K 64
struct plan {
	int32_t width;
	cudaGraphExec_t exec[CU_CTX_BUCKETS];   /* NULL until the plan's first step in that bucket */
	cudaGraphExec_t exec_k[CU_CTX_BUCKETS]; /* the same, the LM head on the packed rows */
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

/* Which of the one family's products in segment parts leave their sums to
 * the kernels that read them (cu_stage.defer; the order of the words of
 * KVFERRY_CUDA_DEFER): none, qkv's and gate_up's only (o and down keep the
 * fold kernel), every one, or qkv's, gate_up's and o's and down's where a
 * row of them is small (the default, graph.cu defer_od()). */
enum cu_defer { CU_DEFER_NONE, CU_DEFER_QKV_GATE_UP, CU_DEFER_ALL, CU_DEFER_AUTO };

struct cu_stage {
	struct kn_stage base; /* first member: kn_stage_impl.h */
	struct kn_model_config cfg_copy;
	int nl, hidden, inter, vocab, hd, nh, nkv, q_dim, kv_dim, qkv_dim, max_ctx, wmax;
	int dev;
	cudaStream_t st;
	cudaStream_t kvst;    /* KV page moves (cu_kv_move): beside the steps, not behind them */
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
	float *x_k;            /* [CU_LOGIT_K][hidden]: the final norm's rows of the columns that want a token */
	struct kn_column *cols_k; /* [CU_LOGIT_K] their columns ... */
	int32_t *out_col;      /* [CU_LOGIT_K] ... and their indices (kn_cuda_logit_rows()) */
	void *sample_ws;       /* kn_cuda_sample_scratch_bytes(wmax): a row's greedy passes in pieces; NULL with
	                        * KVFERRY_CUDA_SAMPLE_PIECES=0 (one block a row, for measuring) */
	int sample_pieces;
	int wide_split_len;    /* KVFERRY_CUDA_WIDE_SPLIT=N: attention pieces of N positions on wide plans (measuring) */
	int logit_rows;        /* the packed-rows graphs in use (KVFERRY_CUDA_LOGIT_ROWS=0: every column's row, for
	                        * measuring) */
	kn_bf16 *xb;           /* [2][wmax][max(hidden, q_dim, inter)] bf16 X for cuBLAS (wmax > 16) */
	int wide_split;        /* opts.cuda_wide_x (or KVFERRY_CUDA_WIDE_X=split): wide plans add X's rounding remainder */
	int wide_mma;          /* KVFERRY_CUDA_WIDE=mma: wide linears by kn_cuda_gemm_mma (a column's bits as in narrow plans) */
	float *mma_part;       /* its warp sequences' sums for small products (kn_cuda_gemm_mma_parts() floats) */
	size_t mma_part_floats;
	int linear_wg;         /* KVFERRY_CUDA_LINEAR=wg: one family: every linear by kn_cuda_gemm_wg, attention by the
	                        * tile kernel, exact, in pieces of CU_FAMILY_SPLIT (bits independent of the plan width) */
	int defer;             /* which of its products in segment parts leave the sums to their consumers
	                        * (enum cu_defer; KVFERRY_CUDA_DEFER=auto|all|qkv_gate_up|none, for measuring: the
	                        * same bits) */
	int family_split;      /* its attention pieces: CU_FAMILY_SPLIT (KVFERRY_CUDA_FAMILY_SPLIT, a multiple of 16, for
	                        * measuring: other bits, the same at every width) */
	int attn_runs;         /* columns a run of the run kernel (prompt chunks): 64, 128 (KVFERRY_CUDA_ATTN_RUNS=128)
	                        * or 0 (=0: the tile kernel, for measuring); default kernels, and one family with
	                        * attn_steps64 (its runs then fold the family's pieces) */
	int attn_steps64;      /* kn_cu_attn_args.steps64 (and runs folded in one family on plans of more than 256
	                        * columns); KVFERRY_CUDA_ATTN_STEPS=16 turns it off, for measuring */
	int attn_exact;        /* KVFERRY_CUDA_ATTN_EXACT=1 / 0: the tile kernel exact (q, P hi + lo) / bf16 at every width
	                        * (measuring); -1 (unset): exact on narrow plans, in one family and with wide_split */
	int narrow_split;      /* KVFERRY_CUDA_NARROW_SPLIT=N (measuring): plans of <= 16 columns on the tile kernel's
	                        * pieces of N positions at every context, as one family's (0: its default choice) */
	int narrow_own;        /* plans of <= 16 columns on the tile kernel, each column in pieces of its own length
	                        * (kn_cuda_attn_own_split()); KVFERRY_CUDA_NARROW_OWN=0: the column kernel, long
	                        * columns to the tile kernel (kn_cuda_attn_tile_from()), as before (measuring) */
	float *wg_part;        /* its segment sums for products of few tiles */
	size_t wg_part_floats;
	int gemv_kind;         /* opts.cuda_gemv (or KVFERRY_CUDA_GEMV): -1 auto, else KN_CU_GEMV_* */
	int attn_tile;         /* opts.cuda_attn (or KVFERRY_CUDA_ATTN): 0 auto (tile on wide plans), 1 column, 2 tile */
	int kv_gather;         /* KV pages in pieces by one kernel (gather.cuh; KVFERRY_CUDA_KV_GATHER=0: a DMA each) */
	int ctx_buckets;       /* graphs per context bucket (KVFERRY_CUDA_CTX_BUCKETS=0: one, sized for max_ctx) */
	struct cu_piece *pcs;  /* [CU_GATHER_TABLE] its table, mapped pinned host memory (lazily) ... */
	struct cu_piece *pcs_dev; /* ... and the device's address of it */
	struct plan plans[KN_MAX_PLANS];
	int n_plans;
	/* tensor parallelism (tp.cu): nh, nkv, q_dim, kv_dim, qkv_dim, inter above are this rank's */
	int tp, rank;          /* ranks of the stage (1: none), and this one */
	void *nccl;            /* ncclComm_t: the ranks sum with NCCL's all-reduce, in the graphs */
	int tp_host;           /* ... or through tp_reduce on host rows, eagerly (no graphs) */
	float *h_red;          /* [wmax][hidden] pinned: the rows tp_reduce sums */
	char tp_why[300];      /* why not NCCL */
	/* allocations to free, in order of acquisition */
	void *dptr[4096];
	int n_dptr;
};

/* Name the failure in the stage's error buffer (kn_stage_error). */
void cu_seterr(struct cu_stage *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Check a CUDA runtime call; on failure name it and return -EIO. */
#define CK(call)                                                                             \
	do {                                                                                 \
		cudaError_t e_ = (call);                                                     \
		if (e_ != cudaSuccess) {                                                     \
			cu_seterr(s, "%s failed: %s (%s)", #call, cudaGetErrorString(e_),      \
			       cudaGetErrorName(e_));                                        \
			return -EIO;                                                         \
		}                                                                            \
	} while (0)

/* cudaMalloc + zero, recorded for cu_destroy; the error names @p what and the fix. */
int cu_dalloc(struct cu_stage *s, void **p, size_t bytes, const char *what);
/* Free one recorded allocation. */
void cu_dfree(struct cu_stage *s, void *p);

/* The sampler's outputs for a plan of width W, back to back so one copy
 * brings them home: tokens [W], logprobs [W], top ids [W][KN_CU_MAX_TOP],
 * top logprobs [W][KN_CU_MAX_TOP]. */
struct out_layout {
	int32_t *tok;
	float *lp;
	int32_t *ids;
	float *lps;
};

static inline struct out_layout out_layout(int32_t *base, int W)
{
	struct out_layout o;
	o.tok = base;
	o.lp = (float *)(base + W);
	o.ids = base + 2 * W;
	o.lps = (float *)(base + 2 * W + W * KN_CU_MAX_TOP);
	return o;
}

static inline size_t out_bytes(int W, int n_top)
{
	return (size_t)W * (n_top > 0 ? 2 + 2 * KN_CU_MAX_TOP : 2) * 4;
}

/* weights.cu: the layers' weights (or random ones), the KV pool, the workspace. */
int cu_load_weights(struct cu_stage *s, int rand, uint64_t seed);
int cu_alloc_pool(struct cu_stage *s, int32_t n_blocks);
int cu_alloc_workspace(struct cu_stage *s);

/* tp.cu: how the ranks sum (NCCL, or tp_reduce on host rows), their sum of
 * the partial @p d ([W][hidden] on the device) on the step's stream, the
 * transport's name for kn_stage_info, and its teardown. */
int cu_tp_init(struct cu_stage *s);
int cu_tp_reduce(struct cu_stage *s, float *d, int W);
/* whether cu_tp_reduce() reduces anything (ranks > 1, or NCCL) */
bool cu_tp_reduces(const struct cu_stage *s);
const char *cu_tp_transport(const struct cu_stage *s);
void cu_tp_fini(struct cu_stage *s);

/* graph.cu: a plan's graph, captured at its first step; dropped when the pool moves. */
int cu_capture(struct cu_stage *s, struct plan *p, int bucket, int packed);
/* The step at plan width W for contexts up to @p gctx, enqueued on the stream
 * (what a graph holds; run eagerly where the ranks sum on the host); with
 * @p packed the LM head and the sampler on the CU_LOGIT_K packed rows. */
int cu_enqueue(struct cu_stage *s, int W, int gctx, int packed);
/* The context bucket of a step whose columns reach @p ctx positions, and its longest context. */
int cu_ctx_bucket(const struct cu_stage *s, int ctx);
int cu_bucket_ctx(const struct cu_stage *s, int bucket);
void cu_drop_graphs(struct cu_stage *s);

/* Attention pieces for plan width W: the tile kernel's width-dependent
 * choice (kn_cuda_attn_tile_split()); on narrow plans each column's own
 * (kn_cuda_attn_own_split(), negative); or, in one family, CU_FAMILY_SPLIT
 * positions at every width, so a column's pieces and their merge are its own
 * whatever the plan. */
#define CU_FAMILY_SPLIT 128
static inline int cu_attn_split(const struct cu_stage *s, int W)
{
	if (s->linear_wg)
		return s->family_split;
	if (s->narrow_split && W <= KN_CU_GEMV_MAX_N)
		return s->narrow_split;
	if (s->wide_split_len && W > KN_CU_GEMV_MAX_N)
		return s->wide_split_len;
	const int own = s->narrow_own && s->attn_tile != 1 && W <= KN_CU_GEMV_MAX_N
				? kn_cuda_attn_own_split(W, s->hd, s->nh, s->nkv)
				: 0;
	return own ? own : kn_cuda_attn_tile_split(W, s->max_ctx, s->nh, s->nkv);
}
#endif /* KN_CUDA_ENGINE_INT_CUH */
