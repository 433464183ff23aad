/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file kn_stage_impl.h
 * Private: how a backend (CPU reference engine, CUDA engine) plugs into the
 * kn_stage API without the dispatcher knowing its internals.
 *
 * A backend's stage struct embeds `struct kn_stage` as its FIRST member and
 * points `base.vt` at its vtable. The public functions in kn_stage.c do
 * everything that must be identical across backends before calling in:
 *
 *  - kn_stage_create() checks the options (layer range, slots, plans) and
 *    calls the backend's create (kn_cpu_stage_create / kn_cuda_stage_create).
 *    The backend calls kn_stage_base_init() (kn_stage_base.c, below both the
 *    dispatcher and the backends) first, which copies the options,
 *    sorts nothing (plans must already ascend) and allocates the host block
 *    table (every entry -1).
 *  - kn_stage_apply_ops() validates and applies each op to the host block
 *    table `base.table` in order, stopping at the first bad op, then calls
 *    vt->apply_ops with the prefix that was applied (the CUDA engine mirrors
 *    the table to the device there; the CPU engine reads base.table directly).
 *  - kn_stage_step() validates every column (n_cols within the widest plan,
 *    token < vocab on the first stage, slot in range, position within the
 *    model context and the slot's table, every block 0..pos/KN_PAGE_BLK set)
 *    and the buffers, so vt->step only sees well-formed steps. A failed
 *    validation writes nothing.
 *  - kn_stage_set_pool() checks n_blocks >= 1, calls vt->set_pool, and on
 *    success clears the host table and sets base.n_blocks.
 *  - kn_stage_destroy() calls vt->destroy, which must call
 *    kn_stage_base_fini() and free its struct.
 *
 * Errors: a backend writes its message with kn_stage_seterr(); vt->error may
 * be NULL (then base.err is returned).
 *
 * Sampling (kn_sample.c) is shared: a backend that produces f32 logit rows on
 * the host calls kn_sample_column() so greedy ties, top-k/top-p and the
 * (seed, pos)-keyed draw are the same bits on every backend.
 */
#ifndef KN_STAGE_IMPL_H
#define KN_STAGE_IMPL_H

#include <stdarg.h>
#include <string.h>

#include "kn_model.h"
#include "kn_stage.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kn_stage;

/** A backend's entry points. All take the embedded base pointer. */
struct kn_seg_cursor;

struct kn_stage_vtbl {
	const char *name; /**< "cpu", "cuda" */
	/** Build a stage; NULL + errno and @p err filled on failure. */
	struct kn_stage *(*create)(const struct kn_model *m, const struct kn_stage_opts *o,
				   char *err, size_t errlen);
	/** Free everything, including base (via kn_stage_base_fini) and the struct. */
	void (*destroy)(struct kn_stage *s);
	/** Fill @p info; base fields are pre-filled by kn_stage_info(). @return 0. */
	int (*info)(const struct kn_stage *s, struct kn_stage_info *info);
	/** Re-size the KV pool; @return 0 or -ENOMEM (pool unchanged). */
	int (*set_pool)(struct kn_stage *s, int32_t n_blocks);
	/** Mirror ops already applied to base.table (may be NULL). @return 0 or -errno. */
	int (*apply_ops)(struct kn_stage *s, const struct kn_op *ops, size_t n);
	/** Run a validated step to completion (NULL when submit is set). @return 0 or -errno with kn_stage_seterr(). */
	int (*step)(struct kn_stage *s, struct kn_step *st);
	/** Asynchronous backends: start a validated step (at most KN_STEP_DEPTH in flight,
	 *  kn_stage.c counts); @return 0 (queued) or -errno (nothing queued). */
	int (*submit)(struct kn_stage *s, struct kn_step *st);
	/** Finish the oldest submitted step; @return its result. */
	int (*wait)(struct kn_stage *s);
	/** @return 1 if the oldest submitted step has finished (wait will not block). */
	int (*ready)(struct kn_stage *s);
	/** Last error message; NULL means base.err is used. */
	const char *(*error)(const struct kn_stage *s);
	/** The pool's element type: KN_DT_F32 or KN_DT_BF16. */
	int32_t kv_dtype;
	/** Validated blocks out to @p dst in the kn_kv_format layout. @return 0 or -errno. */
	int (*kv_export)(struct kn_stage *s, const int32_t *blocks, int32_t n, void *dst);
	/** Validated blocks in from @p src, already in this pool's type. @return 0 or -errno. */
	int (*kv_import)(struct kn_stage *s, const int32_t *blocks, int32_t n, const void *src);
	/** The same from pieces (@p c at the pages' first byte, every byte there);
	 *  NULL: kn_stage.c gathers them and calls kv_import. @return 0 or -errno. */
	int (*kv_import_segs)(struct kn_stage *s, const int32_t *blocks, int32_t n, struct kn_seg_cursor *c);
};

/** A read position in a list of pieces (kn_stage_kv_import_segs()). */
struct kn_seg_cursor {
	const struct kn_seg *seg;
	int32_t n, i;  /**< pieces, and the one being read */
	size_t at;     /**< bytes of seg[i] already read */
};

/** The next contiguous piece, at most @p max bytes, in *@p p; the cursor
 *  moves past it. @return its length (0 at a piece's end: call again;
 *  c->i == c->n once every piece is read). */
static inline size_t kn_seg_next(struct kn_seg_cursor *c, size_t max, const void **p)
{
	size_t k = c->seg[c->i].len - c->at;

	if (k > max)
		k = max;
	*p = (const char *)c->seg[c->i].p + c->at;
	c->at += k;
	if (c->at == c->seg[c->i].len) {
		c->i++;
		c->at = 0;
	}
	return k;
}

/** Copy the next @p len bytes to @p dst (NULL: pass over them); the caller
 *  knows they are there. */
static inline void kn_seg_read(struct kn_seg_cursor *c, void *dst, size_t len)
{
	char *o = (char *)dst;

	while (len > 0 && c->i < c->n) {
		const void *p;
		size_t k = kn_seg_next(c, len, &p);

		if (o != NULL) {
			memcpy(o, p, k);
			o += k;
		}
		len -= k;
	}
}

/** State every backend shares; embed as the first member. */
struct kn_stage {
	const struct kn_stage_vtbl *vt;
	const struct kn_model *model;
	const struct kn_model_config *cfg;
	struct kn_stage_opts opts;   /**< as given, validated */
	int first, last;             /**< holds the embedding / the LM head */
	int32_t n_blocks;            /**< current KV pool size */
	int32_t max_plan;            /**< widest plan */
	int32_t *table;              /**< [n_slots][max_blocks_per_slot], -1 = unset */
	int32_t n_inflight;          /**< submitted steps not yet waited for */
	int32_t q_head;              /**< synchronous backends: results of steps run at submit */
	int q_rc[KN_STEP_DEPTH];
	char err[512];
};

/**
 * Initialise @p s (already zeroed by the caller) for @p m and @p o.
 * @return 0, or -ENOMEM (err filled).
 */
int kn_stage_base_init(struct kn_stage *s, const struct kn_stage_vtbl *vt,
		       const struct kn_model *m, const struct kn_stage_opts *o,
		       char *err, size_t errlen);

/** Release what kn_stage_base_init() allocated. */
void kn_stage_base_fini(struct kn_stage *s);

/** printf into s->err. */
void kn_stage_seterr(struct kn_stage *s, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/** @return the block id of slot @p slot at position @p pos (validated steps only). */
static inline int32_t kn_stage_block(const struct kn_stage *s, int32_t slot, int32_t pos)
{
	return s->table[(size_t)slot * (size_t)s->opts.max_blocks_per_slot
			+ (size_t)(pos / KN_PAGE_BLK)];
}

/** The CPU reference engine (kn_cpu.c). */
struct kn_stage *kn_cpu_stage_create(const struct kn_model *m, const struct kn_stage_opts *o,
				     char *err, size_t errlen);

/** The CUDA engine (kernels/cuda/), in the module kvferry-cuda.so or linked into the CUDA tests. */
struct kn_stage *kn_cuda_stage_create(const struct kn_model *m, const struct kn_stage_opts *o,
				      char *err, size_t errlen);

/**
 * Choose the token for one column from its f32 logit row and fill the
 * requested logprobs. Greedy when c->temperature <= 0 (argmax, lowest id on
 * ties); otherwise softmax(logits / T) in the integer weights of
 * kn_sample_core.h, top-k then top-p filtered, one draw from a counter-based
 * RNG keyed by (c->seed, c->pos) — independent of what else was in the
 * batch, and the same token the CUDA engine's device sampler draws. A
 * KN_COL_FORCE column's token is c->seed, its logprob reported.
 * @param logits     [vocab] f32 row (not modified)
 * @param vocab      row length
 * @param c          the column (sampling parameters)
 * @param n_logprobs number of top logprobs wanted (0 = none)
 * @param tok_lp     out, may be NULL: logprob of the chosen token
 * @param top_ids    out [n_logprobs], may be NULL when n_logprobs is 0
 * @param top_lps    out [n_logprobs]
 * @param scratch    caller scratch of at least 8 * vocab bytes, 8-byte aligned
 * @return the token id.
 */
int32_t kn_sample_column(const float *logits, int32_t vocab, const struct kn_column *c,
			 int32_t n_logprobs, float *tok_lp, int32_t *top_ids, float *top_lps,
			 void *scratch);

/** bf16 → f32 (exact). */
static inline float kn_bf16_to_f32(uint16_t h)
{
	union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
	return v.f;
}

/** f32 → bf16, round to nearest even (NaN stays NaN). */
static inline uint16_t kn_f32_to_bf16(float f)
{
	union { uint32_t u; float f; } v = { .f = f };
	if ((v.u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((v.u >> 16) | 0x40u);
	return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/** f16 → f32 (exact, handles subnormals, inf, NaN). */
float kn_f16_to_f32(uint16_t h);

/**
 * RoPE inverse frequencies for @p cfg, with Llama-3 scaling applied when
 * cfg->rope_factor > 0. Shared so every backend rotates by the same angles.
 * @param inv_freq out [head_dim / 2]
 */
void kn_rope_inv_freq(const struct kn_model_config *cfg, float *inv_freq);

#ifdef __cplusplus
}
#endif
#endif /* KN_STAGE_IMPL_H */
