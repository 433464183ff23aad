/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file kn_stage.h
 * A stage engine: one layer range [start, end) of a model, with its own paged
 * KV pool, stepping micro-batches of columns exactly as the scheduler packs
 * them. The same API is implemented by the CPU reference engine and the CUDA
 * engine (chosen by enum kn_backend at creation).
 *
 * Invariants (tests pin each one):
 *  - Bitwise determinism: a column computes the same bits whatever else
 *    shares its micro-batch, wherever it sits in it, and however the model is
 *    split into stages. Steps run under plans of fixed width (columns padded
 *    to the smallest plan >= n_cols); no reduction order depends on batch
 *    composition.
 *  - Paged KV: block b of layer l holds KN_PAGE_BLK positions. A column at
 *    position p of slot s writes its K/V to block table[s][p / KN_PAGE_BLK],
 *    offset p % KN_PAGE_BLK, for this stage's layers only. All columns' K/V
 *    of a step are written before any attention of that step, so a prefill
 *    chunk attends causally within itself. A column attends to positions
 *    0..pos of its slot.
 *  - Block tables change only through kn_stage_apply_ops(), in the order the
 *    scheduler sent the ops, so every stage's layout is identical.
 *
 * Threading: one thread drives a stage (create, apply_ops, step, submit,
 * wait, destroy);
 * the engine may use its own worker threads inside a step. Different stages
 * may be driven from different threads.
 */
#ifndef KN_STAGE_H
#define KN_STAGE_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "kn_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Positions per KV block. */
#define KN_PAGE_BLK 16
/** Most plans a stage may carry. */
#define KN_MAX_PLANS 8
/** Most steps in flight between kn_stage_step_submit() and kn_stage_step_wait(). */
#define KN_STEP_DEPTH 4

enum kn_backend {
	KN_BACKEND_CPU = 0,
	KN_BACKEND_CUDA = 1,
};

/* ---- in-band ops (a wire ABI: fixed width, 16 bytes) ---- */

enum kn_op_type {
	KN_OP_SET_BLOCK = 1, /**< table[slot][idx] = val (a block id, or -1 to clear) */
	KN_OP_ZERO_SLOT = 2, /**< clear slot's table row and any per-slot state */
	KN_OP_ROLLBACK = 3,  /**< slot's state rolls back to before position val
	                          (no-op for pure attention: K/V past it is simply
	                          overwritten; needed for recurrent layers) */
};

struct kn_op {
	uint32_t type;  /**< enum kn_op_type */
	int32_t slot;
	int32_t idx;
	int32_t val;
};
static_assert(sizeof(struct kn_op) == 16, "kn_op is a 16-byte wire record");

/* ---- a column (a wire ABI: fixed width, 32 bytes) ---- */

/** Column flags. */
#define KN_COL_NEED_LOGIT 0x1u /**< last stage: produce a token for this column */
/** With NEED_LOGIT: the column's token is not drawn but given, in `seed` (a
 *  token id below the vocabulary; sampling settings are ignored): the engine
 *  reports that token and its logprob, as a scored prompt position does
 *  (prompt logprobs: the next prompt token given the ones before). */
#define KN_COL_FORCE 0x2u
/** Bits 8..15 of flags: top logprobs the column's request wants (0..255).
 *  Engines ignore them (kn_step.n_logprobs is per step); a stage chain sets
 *  a step's n_logprobs to the most any of its columns asks for. */
#define KN_COL_TOPK_SHIFT 8
#define KN_COL_TOPK_MASK 0xff00u
/** @return the top-logprob count a column's flags ask for. */
#define KN_COL_TOPK(flags) ((int32_t)(((flags) & KN_COL_TOPK_MASK) >> KN_COL_TOPK_SHIFT))

struct kn_column {
	int32_t token;       /**< first stage: token id (< vocab); ignored elsewhere */
	int32_t pos;         /**< position in its sequence, 0-based */
	int32_t slot;        /**< block-table row */
	uint32_t flags;      /**< KN_COL_* */
	float temperature;   /**< 0 = greedy (argmax, lowest id wins ties) */
	float top_p;         /**< 1 = off */
	int32_t top_k;       /**< 0 = off */
	uint32_t seed;       /**< sampling draws from a stream keyed by (seed, pos) */
};
static_assert(sizeof(struct kn_column) == 32, "kn_column is a 32-byte wire record");

/* ---- creating a stage ---- */

/**
 * Every environment variable the CUDA engine reads at kn_stage_create()
 * (kernels/cuda: measuring knobs and overrides of the options below). A
 * daemon that refuses KVFERRY_ names it does not know passes these through
 * to its stages (ctrld's configuration table); the test
 * cuda_engine_knobs_are_the_names_the_engine_reads holds the list equal to
 * the names in kernels/cuda.
 */
#define KN_CUDA_ENV_KNOBS                                                                                          \
	"KVFERRY_CUDA_PDL", "KVFERRY_CUDA_LINEAR", "KVFERRY_CUDA_WIDE_X", "KVFERRY_CUDA_WIDE", "KVFERRY_CUDA_GEMV",  \
		"KVFERRY_CUDA_ATTN", "KVFERRY_CUDA_ATTN_RUNS", "KVFERRY_CUDA_ATTN_EXACT", "KVFERRY_CUDA_ATTN_CPW",  \
		"KVFERRY_CUDA_ATTN_TILE_FROM", "KVFERRY_CUDA_FAMILY_SPLIT", "KVFERRY_CUDA_NARROW_SPLIT",            \
		"KVFERRY_CUDA_WIDE_SPLIT", "KVFERRY_CUDA_NARROW_OWN", "KVFERRY_CUDA_LOGIT_ROWS",                  \
		"KVFERRY_CUDA_SAMPLE_PIECES", "KVFERRY_CUDA_KV_GATHER", "KVFERRY_CUDA_CTX_BUCKETS", "KVFERRY_CUDA_TP", \
		"KVFERRY_CUDA_DEFER", "KVFERRY_CUDA_ATTN_STEPS"

struct kn_stage_opts {
	int32_t layer_start;          /**< first layer held (the first stage embeds) */
	int32_t layer_end;            /**< one past the last (the last stage has norm + LM head) */
	int32_t n_blocks;             /**< KV pool blocks; -1 = as many as the budget holds */
	size_t kv_budget_bytes;       /**< with n_blocks -1: CPU bytes for the pool */
	float kv_mem_fraction;        /**< with n_blocks -1, CUDA: fraction of free device memory */
	int32_t n_slots;              /**< block-table rows (concurrent sequences) */
	int32_t max_blocks_per_slot;  /**< row length: context limit = this * KN_PAGE_BLK */
	int32_t plan_widths[KN_MAX_PLANS]; /**< ascending fixed widths */
	int32_t n_plans;
	int32_t n_threads;            /**< CPU engine threads (0 = online cores) */
	int32_t device;               /**< CUDA device ordinal */
	/* CUDA engine kernel choices (ignored by the CPU engine). Each has an
	 * environment override read at kn_stage_create(), for measurement. */
	int32_t cuda_gemv;            /**< skinny GEMM (plans <= 16 columns): 0 = FFMA at 1 column,
	                                   tensor cores at 2..16; 1 = FFMA always; 2 = tensor cores
	                                   always (pins one kernel family across widths 1..16).
	                                   KVFERRY_CUDA_GEMV=auto|ffma|mma overrides */
	int32_t cuda_wide_x;          /**< plans > 16 columns: 0 = X rounded to bf16 for cuBLAS;
	                                   1 = X as bf16 hi + lo (f32-grade, twice the tensor work).
	                                   KVFERRY_CUDA_WIDE_X=bf16|split overrides */
	int32_t cuda_attn;            /**< attention: 0 = tensor-core tile kernel on plans > 16
	                                   columns, column kernel (CUDA cores) on narrower ones;
	                                   1 = column kernel everywhere; 2 = tile kernel everywhere
	                                   (head_dim 256 always runs the column kernel).
	                                   KVFERRY_CUDA_ATTN=auto|column|tile overrides */
	int32_t cuda_batch_invariant; /**< 1 = one numerics family at every plan width: every linear
	                                   on the warpgroup-MMA kernel, attention on the tile kernel
	                                   in fixed pieces, so a column's bits do not depend on its
	                                   neighbours (Hopper only: refused elsewhere; cuda_gemv,
	                                   cuda_wide_x and cuda_attn then do not apply).
	                                   KVFERRY_CUDA_LINEAR=wg turns it on too */
	int32_t kv_own_stream;        /**< CUDA: kn_stage_kv_export/import on a stream of their own,
	                                   beside a step in flight (a worker's KV side ring, whose
	                                   copies touch no block of a step in flight); 0: on the
	                                   steps' stream, behind them (callers between two steps) */
	/* Tensor parallelism: the stage holds rank tp_rank's share of every
	 * layer, Megatron-style: heads and KV heads (q, k, v rows, o columns)
	 * and the MLP's intermediate columns (gate, up rows, down columns)
	 * split tp_size ways; norms, embedding and LM head whole. After o and
	 * after down each rank has a partial sum, and tp_reduce must leave in
	 * it the sum of every rank's, added pairwise in rank order
	 * ((r0 + r1) + (r2 + r3)) + ... (on the CPU engine the order that
	 * gives the bits of the whole layer: kn_cpu.c).
	 * The CUDA engine sums on the device with NCCL's all-reduce when it
	 * can: every rank on a GPU of its own, libnccl.so.2 found, and
	 * tp_share given (rank 0's NCCL id handed to the others); else through
	 * tp_reduce on host rows, step by step without CUDA graphs (ranks
	 * sharing one GPU; slow, for tests). KVFERRY_CUDA_TP=host or nccl
	 * forces one (nccl: refused where it cannot run). */
	int32_t tp_size;              /**< 1, 2, 4 or 8 (0: 1) */
	int32_t tp_rank;              /**< 0..tp_size-1 */
	/** Sum the ranks' partials: @p buf holds @p n rows of @p ld floats, of
	 *  which the first @p dim count. @return 0 or -errno (the step fails). */
	int (*tp_reduce)(void *arg, float *buf, int32_t n, int32_t ld, int32_t dim);
	/** Rank 0's @p len bytes at @p buf become every rank's (a broadcast,
	 *  called by every rank at stage creation). @return 0 or -errno. */
	int (*tp_share)(void *arg, void *buf, size_t len);
	void *tp_arg;
	const char *cuda_module;      /**< the CUDA backend's module (kvferry-cuda.so): NULL or ""
	                                   to look beside the program, in the build tree it runs
	                                   from, then in the installed module folder; the first
	                                   kn_stage_create() of the process that needs it loads it */
};

/** Fill @p o with defaults: whole model, 64 slots, 256 blocks/slot, plans {8, 64}, auto pool. */
void kn_stage_opts_init(struct kn_stage_opts *o);

struct kn_stage;

/**
 * Create a stage engine over layers [o->layer_start, o->layer_end) of @p m.
 * The model must outlive the stage.
 * @return the stage, or NULL with errno set (EINVAL bad range/options,
 *         ENOMEM, ENODEV backend unavailable, EIO device error) and @p err filled.
 */
struct kn_stage *kn_stage_create(const struct kn_model *m, enum kn_backend be,
				 const struct kn_stage_opts *o, char *err, size_t errlen);

/** Destroy a stage; NULL is a no-op. */
void kn_stage_destroy(struct kn_stage *s);

/**
 * The CUDA backend lives in a loadable module, kvferry-cuda.so (package
 * kvferry-cuda), so that no program of the kvferry package needs NVIDIA's
 * libraries: a node without a GPU runs every daemon. A program linked with
 * the engine itself (the CUDA tests and benchmarks) uses that copy.
 */
struct kn_cuda_info {
	char module[512];    /**< where the module was loaded from ("linked in" when static) */
	int devices;         /**< GPUs the CUDA runtime sees (0: none, or no driver) */
	int driver_version;  /**< cudaDriverGetVersion(): 13000 is CUDA 13.0; 0 without a driver */
	int runtime_version; /**< cudaRuntimeGetVersion() of the module's runtime */
};

/**
 * Load the CUDA backend's module (once per process; later calls answer from
 * the first) and describe it.
 * @param path  the module's file (kn_stage_opts.cuda_module), or NULL/"" to search
 * @param info  filled on success (may be NULL)
 * @return 0, or -ENODEV (not installed: @p err names where it looked and the
 *         package to install), -ENOENT (@p path does not exist), -ELIBBAD (it
 *         cannot be loaded, e.g. NVIDIA's runtime is missing, or it was built
 *         for another kvferry: @p err names both versions).
 * Thread-safe.
 */
int kn_cuda_open(const char *path, struct kn_cuda_info *info, char *err, size_t errlen);

/**
 * Pin @p len bytes at @p p for the CUDA engine's DMA (cudaHostRegister), or
 * undo it. Loads the module as kn_cuda_open() does.
 * @return 0, or a kn_cuda_open() error, or -EIO (@p err has CUDA's message).
 * Thread-safe.
 */
int kn_stage_pin(void *p, size_t len, const char *cuda_module, char *err, size_t errlen);
/** @return 0, or -ENODEV when no module was loaded. Thread-safe. */
int kn_stage_unpin(void *p);

/** What a stage holds, for reporting and for pool negotiation. */
struct kn_stage_info {
	int32_t layer_start, layer_end;
	int first, last;              /**< holds the embedding / the LM head */
	int32_t n_blocks;             /**< KV pool blocks */
	int32_t n_slots;
	int32_t max_blocks_per_slot;
	int32_t hidden_size;
	int32_t vocab_size;
	size_t weight_bytes;          /**< resident weight bytes of this stage */
	size_t kv_bytes;              /**< KV pool bytes */
	size_t workspace_bytes;       /**< scratch */
	int32_t tp_size;              /**< tensor-parallel ranks of the stage (1: none) */
	const char *tp_transport;     /**< how the ranks sum: "cpu" (tp_reduce), "nccl", "host" (the
	                                   CUDA engine through tp_reduce), "" without ranks */
	const char *tp_why;           /**< "host": why not NCCL ("" otherwise) */
};

/** Fill @p info. @return 0. */
int kn_stage_info(const struct kn_stage *s, struct kn_stage_info *info);

/**
 * Re-size the KV pool to @p n_blocks (the negotiated count). Clears all slots.
 * @return 0, -EINVAL (n_blocks < 1), -EBUSY (steps in flight), -ENOMEM.
 */
int kn_stage_set_pool(struct kn_stage *s, int32_t n_blocks);

/**
 * Apply in-band ops in order.
 * @return 0, or -EINVAL (bad type, slot, index or block id; nothing after the
 *         bad op is applied; kn_stage_error() says which).
 */
int kn_stage_apply_ops(struct kn_stage *s, const struct kn_op *ops, size_t n);

/** One step's inputs and outputs. Buffers are the caller's. */
struct kn_step {
	int32_t n_cols;
	const struct kn_column *cols;  /**< [n_cols] */
	const float *hidden_in;        /**< non-first stage: [n_cols][hidden] f32 */
	float *hidden_out;             /**< non-last stage: [n_cols][hidden] f32 */
	int32_t *tokens_out;           /**< last stage: [n_cols], -1 where no logit was asked */
	float *logits_out;             /**< optional, last stage: [n_cols][vocab] f32 (rows
	                                    of columns without NEED_LOGIT are untouched) */
	int32_t n_logprobs;            /**< top-k logprobs per NEED_LOGIT column (0 = none) */
	float *token_logprob_out;      /**< optional [n_cols]: logprob of the chosen token */
	int32_t *top_ids_out;          /**< [n_cols][n_logprobs] */
	float *top_logprobs_out;       /**< [n_cols][n_logprobs] */
};

/**
 * Run one stage step over st->n_cols columns (1 <= n_cols <= widest plan)
 * and wait for it: kn_stage_step_submit() then kn_stage_step_wait().
 * @return 0, or -EINVAL (token >= vocab, position beyond the slot's table or
 *         the model's context, unset block, bad slot, n_cols out of range),
 *         -EBUSY (steps submitted and not waited for), -EIO (device error);
 *         kn_stage_error() names the column and value.
 *         A failed step writes no K/V.
 */
int kn_stage_step(struct kn_stage *s, struct kn_step *st);

/**
 * Start one step without waiting for it, so the host can prepare the next
 * while the device runs this one. Steps run in submission order, after the
 * ops applied before each was submitted (kn_stage_apply_ops() between two
 * submits is ordered between them). The caller keeps @p st and every buffer
 * it points to (columns, hidden rows, outputs) untouched until the matching
 * kn_stage_step_wait() returns. The CUDA engine overlaps steps when the
 * hidden buffers are pinned (kn_cuda_host_register()) and the step needs no
 * logits_out and at most 20 logprobs; otherwise, and on the CPU engine, the
 * step completes here and the wait only returns its result.
 * @return 0 (submitted), -EBUSY (KN_STEP_DEPTH steps in flight), or the
 *         errors of kn_stage_step() (nothing was submitted).
 */
int kn_stage_step_submit(struct kn_stage *s, struct kn_step *st);

/**
 * Wait for the oldest submitted step; its outputs are then in its buffers.
 * @return its result: 0, -EIO (device error), -EINVAL (no step in flight).
 */
int kn_stage_step_wait(struct kn_stage *s);

/** @return 1 if the oldest submitted step has finished (the wait will not block), else 0. */
int kn_stage_step_ready(struct kn_stage *s);

/** @return steps submitted and not yet waited for. */
int kn_stage_step_inflight(const struct kn_stage *s);

/* ---- KV pages out and in (moving a sequence's cache between stages) ---- */

/**
 * How a stage's KV pages travel: per block, for each of the stage's layers in
 * order, K then V, each [n_kv_heads][KN_PAGE_BLK][head_dim] elements of the
 * pool's own type (f32 on the CPU engine, bf16 on the CUDA engine). A
 * prefill node exports the blocks of a sequence; the decode node imports
 * them into blocks it chose, sets its table, and decodes as if it had run
 * the prefill itself.
 *
 * The format holds every KV head of the stage's layers, also for a rank of
 * a tensor-parallel stage (kn_stage_opts.tp_size > 1): a rank exports its
 * own heads' rows of each page and leaves the other bytes of the buffer as
 * they were, and imports only its own heads' rows. The T ranks of a stage
 * exporting into one buffer write the unsharded stage's pages, byte for
 * byte, and pages import into a stage of any tp_size.
 */
struct kn_kv_format {
	int32_t dtype;           /**< KN_DT_F32 or KN_DT_BF16 */
	int32_t layer_start, layer_end;
	int32_t n_kv_heads, head_dim;
	size_t block_bytes;      /**< one block, every layer, K and V */
};

/** Fill @p f with this stage's format. @return 0. */
int kn_stage_kv_format(const struct kn_stage *s, struct kn_kv_format *f);

/**
 * Copy blocks @p blocks[0..n) of the pool to @p dst, back to back in the
 * stage's format (n * block_bytes bytes).
 * @return 0, or -EINVAL (a block outside the pool, n < 0, @p len short;
 *         kn_stage_error() says which), -EIO (device error).
 */
int kn_stage_kv_export(struct kn_stage *s, const int32_t *blocks, int32_t n, void *dst, size_t len);

/**
 * Write n blocks in format @p f from @p src into blocks @p blocks[0..n) of the
 * pool. f32 and bf16 convert (bf16 to f32 exactly; f32 to bf16 rounded to
 * nearest even, as the CUDA engine stores its own K/V). The layer range, KV
 * heads and head_dim must be this stage's. Slot tables are untouched
 * (kn_stage_apply_ops() points a slot at the blocks).
 * @return 0, or -EINVAL (format mismatch, a block outside the pool, @p len
 *         short; kn_stage_error() names both sides), -ENOMEM, -EIO.
 */
int kn_stage_kv_import(struct kn_stage *s, const int32_t *blocks, int32_t n, const void *src, size_t len,
		       const struct kn_kv_format *f);

/** A piece of bytes, for kn_stage_kv_import_segs(). */
struct kn_seg {
	const void *p;
	size_t len;
};

/**
 * kn_stage_kv_import() from bytes in pieces, read where they lie: the pages
 * are the @p len bytes that start @p skip bytes into the concatenation of
 * @p segs[0..n_segs) (a message received in place: each frame's payload
 * where the network driver left it). A backend that reads pieces
 * (kn_stage_kv_imports_segs()) copies each byte once, straight into the
 * pool; the others, and pages of the other dtype, are gathered first.
 * @return as kn_stage_kv_import(); -EINVAL also when the pieces hold fewer
 *         than @p skip + @p len bytes.
 */
int kn_stage_kv_import_segs(struct kn_stage *s, const int32_t *blocks, int32_t n, const struct kn_seg *segs,
			    int32_t n_segs, size_t skip, size_t len, const struct kn_kv_format *f);

/** @return 1 if kn_stage_kv_import_segs() reads pages of the pool's own dtype where they lie (no gather copy). */
int kn_stage_kv_imports_segs(const struct kn_stage *s);

/**
 * What kn_stage_kv_export() (@p f NULL) or kn_stage_kv_import() (pages in
 * format @p f) would refuse of these arguments, without copying anything: a
 * caller with several copies to make checks them all first, so a bad one
 * leaves the pool as it was.
 * @return 0, or -EINVAL with kn_stage_error() saying why, as the copy would.
 */
int kn_stage_kv_check(struct kn_stage *s, const int32_t *blocks, int32_t n, size_t len,
		      const struct kn_kv_format *f);

/** @return the last error message of this stage ("" if none). */
const char *kn_stage_error(const struct kn_stage *s);

#ifdef __cplusplus
}
#endif
#endif /* KN_STAGE_H */
