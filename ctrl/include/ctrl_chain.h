/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file ctrl_chain.h
 * The stage chain: what the scheduler talks to. A chain takes a micro-batch
 * for group g (its columns and the in-band ops that must be applied before
 * them) and, later, hands back group g's result: one token per column that
 * asked for a logit, or an error for the whole group (a dead worker, a
 * refused step), or an error for some columns only (their slot's KV cache
 * was lost on a stage that restarted: the other columns of the micro-batch
 * are computed as usual). How the micro-batch reaches the stages is the
 * implementation's business: an in-process chain of kn_ stage engines, a
 * fake chain with programmable latency for tests, and (with the serving
 * slice) the shm/dataplane chain to worker processes.
 *
 * Contract every implementation keeps (the scheduler relies on each):
 *  - Order: micro-batches pass every stage in submission order, so the ops
 *    of a later submission are applied after the steps of an earlier one.
 *  - One micro-batch per group in flight: a group id is submitted again only
 *    after its result was polled. The chain may keep per-group buffers.
 *  - submit() never blocks on stage work; poll() never blocks at all.
 *  - A result's tokens/logprobs stay valid until the group is submitted
 *    again or the chain is destroyed.
 *  - A column that fails alone (col_status < 0) writes nothing a later
 *    column of another slot reads; its slot must get ZERO_SLOT before it is
 *    used again (the scheduler ends the sequence, and a reused slot always
 *    starts with ZERO_SLOT).
 *
 * The vtable is public so that other modules' chains (the shm chain) can
 * implement it: embed `struct ctrl_chain` as the first member and point
 * `vt` at a static vtable.
 *
 * Threading: one thread (the scheduler's) calls every function of a chain.
 */
#ifndef CTRL_CHAIN_H
#define CTRL_CHAIN_H

#include <stddef.h>
#include <stdint.h>

#include "kn_stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Most stages a chain reports on. */
#define CTRL_CHAIN_MAX_STAGES 16
/** Most top logprobs a column may ask for (KN_COL_TOPK); OpenAI's limit. */
#define CTRL_CHAIN_MAX_LOGPROBS 20
/** Length of a result's error message buffer. */
#define CTRL_CHAIN_ERRLEN 192

/** What a chain can carry; the scheduler sizes itself from this. */
struct ctrl_chain_info {
	int32_t n_stages;
	int32_t n_slots;             /**< block-table rows every stage holds */
	int32_t n_blocks;            /**< KV blocks every stage holds (the least of them) */
	int32_t max_blocks_per_slot; /**< row length: context = this * KN_PAGE_BLK */
	int32_t max_cols;            /**< widest plan: most columns in one micro-batch */
	int32_t max_groups;          /**< group ids 0 .. max_groups-1 are accepted */
	int32_t max_position;        /**< model context limit (positions) */
	int32_t vocab_size;
};

/** One completed group. */
struct ctrl_chain_result {
	uint32_t group;
	int status;                  /**< 0, or -errno: the group failed, see err */
	int32_t n_cols;              /**< as submitted */
	const int32_t *tokens;       /**< [n_cols], -1 where no logit was asked */
	const float *logprobs;       /**< [n_cols] logprob of each token, or NULL */
	char err[CTRL_CHAIN_ERRLEN]; /**< with status < 0, or a column failed: what failed and where */
	const int32_t *col_status;   /**< with status 0: [n_cols] 0, or -errno where that column
	                                  alone failed (its token is -1); NULL: every column ok */
	int32_t n_failed_cols;       /**< columns with col_status < 0 */
	int32_t n_logprobs;          /**< top logprobs per column (the most any column's
	                                  KN_COL_TOPK asked for), 0: none */
	const int32_t *top_ids;      /**< [n_cols][n_logprobs] best first (logprob descending,
	                                  then id ascending); rows of columns without a logit
	                                  are undefined */
	const float *top_logprobs;   /**< [n_cols][n_logprobs] log-softmax of the model's logits */
	uint64_t step_ns;            /**< the slowest stage's step time for this group (what a
	                                  worker measured on its device), 0: not known */
};

/** Counters of one stage, cumulative since the chain was created. */
struct ctrl_chain_stage_stats {
	uint64_t steps;
	uint64_t cols;
	uint64_t busy_ns;            /**< time spent stepping (simulated for the fake chain) */
};

/** Counters of a chain. */
struct ctrl_chain_stats {
	int32_t n_stages;
	uint64_t elapsed_ns;         /**< from the first submit to the last completion */
	struct ctrl_chain_stage_stats stage[CTRL_CHAIN_MAX_STAGES];
};

struct ctrl_chain;

/** One buffer of ctrl_chain_kv_copies(): @p n blocks out to or in from @p buf. */
struct ctrl_kv_copy {
	const int32_t *blocks;
	int32_t n;
	void *buf;
	size_t len;
};

/** What a stage that takes its own KV pages (ctrl_chain_kv_rxroute()) says of one page message. */
struct ctrl_kv_landing {
	uint64_t room;
	uint32_t session, n_blocks;
	uint64_t bytes;
	int last;                    /**< the stream's last message for the room */
	int refused;                 /**< not imported (the stage's log says why) */
	int in_place;                /**< imported from its frames where the dataplane received them */
};

/** A chain implementation's entry points. */
struct ctrl_chain_vtbl {
	const char *name;
	int (*info)(struct ctrl_chain *c, struct ctrl_chain_info *info);
	int (*submit)(struct ctrl_chain *c, uint32_t group, const struct kn_column *cols,
		      int32_t n_cols, const struct kn_op *ops, int32_t n_ops);
	int (*poll)(struct ctrl_chain *c, struct ctrl_chain_result *out, int max);
	int (*stats)(struct ctrl_chain *c, struct ctrl_chain_stats *st);
	void (*destroy)(struct ctrl_chain *c);
	/* optional: a stage's KV pages out and in (PD); NULL: -ENOTSUP */
	int (*kv_format)(struct ctrl_chain *c, int32_t stage, struct kn_kv_format *f);
	int (*kv_export)(struct ctrl_chain *c, int32_t stage, const int32_t *blocks, int32_t n, void *dst,
			 size_t len);
	int (*kv_import)(struct ctrl_chain *c, int32_t stage, const int32_t *blocks, int32_t n, const void *src,
			 size_t len, const struct kn_kv_format *f);
	/* optional: keep a stage between two steps across several page calls
	 * (ctrl_chain_kv_hold()); NULL: each call waits on its own */
	int (*kv_hold)(struct ctrl_chain *c, int32_t stage, int hold);
	/* optional: several exports or imports of one stage at once
	 * (ctrl_chain_kv_copies()); NULL: one call each, the stage held */
	int (*kv_copies)(struct ctrl_chain *c, int32_t stage, int import, const struct ctrl_kv_copy *v, int32_t n,
			 const struct kn_kv_format *f);
	/* optional: stage @p stage takes dataplane stream @p stream's KV pages
	 * itself (ctrl_chain_kv_rxroute()), and what it says of them
	 * (ctrl_chain_kv_landed()); NULL: -ENOTSUP / none */
	int (*kv_rxroute)(struct ctrl_chain *c, int32_t stage, uint32_t stream);
	int (*kv_landed)(struct ctrl_chain *c, int32_t stage, struct ctrl_kv_landing *out, int max);
	/* optional: the chain's KV generation (ctrl_chain_kv_generation()); NULL: 0, never changes */
	uint64_t (*kv_generation)(struct ctrl_chain *c);
	/* optional: can the chain compute now (ctrl_chain_ready())? NULL: always */
	int (*ready)(struct ctrl_chain *c, char *why, size_t whylen);
};

/** Embed as the first member of an implementation's struct. */
struct ctrl_chain {
	const struct ctrl_chain_vtbl *vt;
};

/**
 * Describe what @p c carries.
 * @return 0, or -errno from the implementation.
 */
int ctrl_chain_info(struct ctrl_chain *c, struct ctrl_chain_info *info);

/**
 * Send one micro-batch for @p group down the chain. @p ops are applied by
 * every stage, in order, before the step over @p cols. Buffers are copied;
 * the caller may reuse them on return. Never blocks on stage work.
 * @param n_cols 1 .. info.max_cols
 * @return 0, -EINVAL (group out of range or still in flight, n_cols out of
 *         range), -EBUSY (the transport cannot take it now: retry later),
 *         -EPIPE (the chain is dead).
 */
int ctrl_chain_submit(struct ctrl_chain *c, uint32_t group, const struct kn_column *cols,
		      int32_t n_cols, const struct kn_op *ops, int32_t n_ops);

/**
 * Collect completed groups without blocking. @p out[0 .. max) is zeroed
 * first, so a field an implementation does not know stays 0 / NULL.
 * @param out receives up to @p max results
 * @return the number of results (0 if none is ready), or -errno.
 */
int ctrl_chain_poll(struct ctrl_chain *c, struct ctrl_chain_result *out, int max);

/**
 * Can the chain compute now? A chain that re-forms after a failure (worker
 * processes: a stage died and every stage must answer again) is not ready
 * until it has; what it had in flight already failed, the KV its stages
 * held may be gone, and a micro-batch submitted meanwhile fails. The
 * scheduler holds its requests while a chain is not ready instead
 * (ctrl_sched_opts.replay_max).
 * @param why receives what took the chain down when it is not ready
 *            ("stage 1 (stage1, pid 4031, layers 1..2) died"); may be NULL
 * @return 1 ready (a chain without the notion always is), 0 not ready.
 */
int ctrl_chain_ready(struct ctrl_chain *c, char *why, size_t whylen);

/** Fill @p st with the chain's counters. @return 0 or -errno. */
int ctrl_chain_stats(struct ctrl_chain *c, struct ctrl_chain_stats *st);

/** Destroy a chain (any implementation); NULL is a no-op. */
void ctrl_chain_destroy(struct ctrl_chain *c);

/*
 * A stage's KV pages out and in, for prefill/decode disaggregation: the
 * prefill node exports a finished prompt's blocks (the scheduler holds them,
 * ctrl_request.hold_kv) and the decode node imports them into the blocks its
 * scheduler reserved (ctrl_request.kv_remote); kn_stage.h has the format.
 * Safe from any thread: each runs between two of the stage's steps.
 * @return 0, -ENOTSUP (a chain that cannot: the fake one, worker processes,
 *         whose workers move pages through the dataplane themselves),
 *         -EINVAL (stage out of range, or kn_stage_kv_export/import refused:
 *         @p err names why), -EIO.
 */
int ctrl_chain_kv_format(struct ctrl_chain *c, int32_t stage, struct kn_kv_format *f);
int ctrl_chain_kv_export(struct ctrl_chain *c, int32_t stage, const int32_t *blocks, int32_t n, void *dst,
			 size_t len);
int ctrl_chain_kv_import(struct ctrl_chain *c, int32_t stage, const int32_t *blocks, int32_t n,
			 const void *src, size_t len, const struct kn_kv_format *f);

/**
 * Hold @p stage between two of its steps (@p hold 1) until released (@p
 * hold 0), so that several page exports or imports in a row wait for its
 * running step once, not once each: a prefill node ships a chunk's pages as
 * several messages while the stage computes the next chunk. The calls in
 * between are made by the holding thread. Hold briefly: the stage computes
 * nothing meanwhile.
 * @return 0 (also for a chain that has no such wait), -EINVAL.
 */
int ctrl_chain_kv_hold(struct ctrl_chain *c, int32_t stage, int hold);

/**
 * Several page exports (@p import 0) or imports (1, every buffer in format
 * @p f) of @p stage in one go: @p v[0..n) in order. Worker processes get
 * them in one chain message (one wait for the stage's running steps, one
 * round trip); stages inside ctrld are held once for all of them.
 * @return 0, or the first failure's -errno (the copies before it done).
 */
int ctrl_chain_kv_copies(struct ctrl_chain *c, int32_t stage, int import, const struct ctrl_kv_copy *v, int32_t n,
			 const struct kn_kv_format *f);

/**
 * Have stage @p stage take dataplane stream @p stream's KV page messages
 * itself (a decode node whose stages run in worker processes on the
 * dataplane's region: SHM_MB_KV_RXROUTE): it imports those of rooms open in
 * the rooms area (ctrl_pd_link_room_gate()) and says so
 * (ctrl_chain_kv_landed()). @return 0, or -ENOTSUP (stages inside ctrld,
 * or a worker or region that cannot), or the call's error.
 */
int ctrl_chain_kv_rxroute(struct ctrl_chain *c, int32_t stage, uint32_t stream);

/**
 * The chain's KV generation: it changes whenever the stages' KV pools may
 * have been lost (worker processes: each time the chain re-forms, for a
 * stage that re-joined may be a new process with an empty pool). KV
 * computed under one generation is gone once it changed. Stages inside
 * ctrld keep their pools: 0, always.
 */
uint64_t ctrl_chain_kv_generation(struct ctrl_chain *c);

/** Up to @p max reports of page messages stage @p stage took itself. @return how many (0: none). */
int ctrl_chain_kv_landed(struct ctrl_chain *c, int32_t stage, struct ctrl_kv_landing *out, int max);

/**
 * Layer ranges of a chain's stages: explicit @p ends (validated to tile
 * [0, n_layers) exactly: stage k holds [ends[k-1], ends[k]), stage 0 from 0)
 * or, when ends[0] == 0, an even split of @p n_layers in @p n.
 * @param ends    in: explicit ends or zeros; out: the ends used
 * @return 0, or -EINVAL with @p err naming the gap, overlap or overrun.
 */
int ctrl_chain_layers(int32_t n_layers, int32_t n, int32_t *ends, char *err, size_t errlen);

/* ---- the fake chain (tests, simulation) ---- */

/** Options of the fake chain. */
struct ctrl_fake_chain_opts {
	int32_t n_stages;            /**< 1 .. CTRL_CHAIN_MAX_STAGES */
	uint64_t stage_ns[CTRL_CHAIN_MAX_STAGES]; /**< fixed cost of one step per stage */
	uint64_t col_ns;             /**< extra cost per column, every stage */
	int32_t plan_widths[8];      /**< n_plans > 0: a step costs as if it had the columns of
	                                  the narrowest of these that holds it (a GPU's padding) */
	int32_t n_plans;
	uint64_t plan_first_ns;      /**< with plans: the first plan_first_steps steps in each
	                                  cost this much more (a CUDA graph captured at first use,
	                                  then a host stall) */
	int32_t plan_first_steps;    /**< 0 means 1 */
	uint64_t link_ns;            /**< transport latency each way between the
	                                  scheduler and the chain's ends (what makes
	                                  n_stages groups leave bubbles) */
	int virtual_time;            /**< 1: a simulated clock that jumps to the next
	                                  completion on each poll (deterministic, no
	                                  sleeping); 0: CLOCK_MONOTONIC */
	int32_t n_slots;
	int32_t n_blocks;
	int32_t max_blocks_per_slot;
	int32_t max_cols;
	int32_t max_groups;
	int32_t vocab_size;
	int64_t fail_submit;         /**< 0-based index of a submission whose group
	                                  fails as if a stage died (-1 = never) */
	int64_t lose_at;             /**< 0-based index of the submission from which
	                                  lose_slots have lost their KV cache, as after a
	                                  stage restart (-1 = never): each of their columns
	                                  fails alone (col_status -EPIPE) until a ZERO_SLOT
	                                  of the slot arrives */
	int32_t lose_slots[8];
	int32_t n_lose_slots;
};

/** Defaults: 2 stages of 100 µs, virtual time, 64 slots, 1024 blocks, 64 per slot, 64 cols, 32 groups, vocab 64. */
void ctrl_fake_chain_opts_init(struct ctrl_fake_chain_opts *o);

/**
 * Create the fake chain. It models a FIFO pipeline of stages with the given
 * step costs, and produces tokens like a model would: each column's token is
 * a function of everything its slot holds at positions 0..pos (a hash chain
 * over the fed tokens), so a wrong token, position, block or rollback shows
 * up as different output. It also checks what a stage engine checks (every
 * block up to pos set, slot and block ids in range) plus that columns of a
 * slot follow its written positions and that no block is used by a slot that
 * no longer owns it; a violation fails the group with a message.
 *
 * Greedy output, produced over a small vocabulary, is mostly "previous
 * token + 1" with history-dependent jumps, so prompt lookup finds drafts that
 * are sometimes wrong — what speculative-decoding tests need.
 * @return the chain, or NULL with errno EINVAL (bad options) or ENOMEM.
 */
struct ctrl_chain *ctrl_fake_chain_create(const struct ctrl_fake_chain_opts *o);

/* ---- the in-process chain of kn_ stage engines ---- */

/** Options of the in-process kn chain. */
struct ctrl_kn_chain_opts {
	int32_t n_stages;            /**< stages: the model's layers split in this many ranges */
	int32_t layer_ends[CTRL_CHAIN_MAX_STAGES]; /**< all 0: an even split; else stage k holds
	                                  layers [layer_ends[k-1], layer_ends[k]) (stage 0 from 0),
	                                  ranges that must tile the model (ctrl_chain_layers()) */
	struct kn_stage_opts stage;  /**< template for every stage (layer range is overwritten) */
	enum kn_backend backend;
	int threaded;                /**< 1: one thread per stage so stages overlap; 0: submit steps inline */
	int32_t max_groups;
};

/** Defaults: 1 stage, even split, kn_stage_opts_init() template, CPU backend, threaded, 32 groups. */
void ctrl_kn_chain_opts_init(struct ctrl_kn_chain_opts *o);

/**
 * Create a chain of @p o->n_stages kn_ stage engines over @p m in this process.
 * The model must outlive the chain.
 * @return the chain, or NULL with errno set (EINVAL bad options or layer
 *         ranges that do not tile the model, ENOMEM, or
 *         the errno of kn_stage_create()) and @p err filled.
 */
struct ctrl_chain *ctrl_kn_chain_create(const struct kn_model *m, const struct ctrl_kn_chain_opts *o,
					char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* CTRL_CHAIN_H */
