/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file ctrl_sched.h
 * The scheduler: KV-aware admission and micro-batched continuous batching
 * over a stage chain (ctrl_chain.h), with prompt-lookup speculative decoding,
 * and a dispatcher over several independent replicas.
 *
 * Invariants (tests/ctrl pins each one):
 *  - One round in flight per sequence: a per-slot in-flight mark; a sequence
 *    is packed again only after its previous round's tokens were applied.
 *    Groups do not pin sequences: a launching group packs from every ready
 *    sequence, scanning from a rotating cursor.
 *  - Deadlock-free admission: a request is admitted only when the block pool
 *    carries its worst case (prompt + max_tokens positions) on top of the
 *    worst case of every admitted sequence, so a lazily grown block table
 *    never finds the pool empty. Waiting requests are admitted FIFO. A
 *    request that could never fit is rejected at once, naming the pool size.
 *  - In-band control: SET_BLOCK, ZERO_SLOT and ROLLBACK ops travel in the
 *    micro-batch whose columns need them, ahead of those columns.
 *  - Speculation never changes output: drafts are verified greedily and only
 *    the prefix the model itself would have produced is emitted.
 *  - Progress bound: a ready sequence is packed within n_live launches of
 *    becoming ready (each launch packs the first ready sequence at or after
 *    the cursor and moves the cursor past it); a waiting request is admitted
 *    as soon as the requests ahead of it are admitted and enough admitted
 *    sequences finished, which each does within its max_tokens rounds.
 *  - A replay changes no token: a request the chain lost (its micro-batch
 *    or its column failed, or the chain stopped being ready while it was
 *    live) goes back to the head of the queue as a request whose prompt is
 *    its prompt plus every token it generated, with what is left of its
 *    max_tokens and the same sampling settings; draws are keyed by (seed,
 *    position), so its continuation is the one an undisturbed run produces.
 *    Its client sees a pause, never a token twice. It is replayed at most
 *    replay_max times and waits at most replay_timeout_ms for a chain that
 *    is not ready; then it ends with the chain's error, naming the stage
 *    and the setting to raise.
 *
 * Threading: one thread (the scheduler thread) calls ctrl_sched_poll() in a
 * loop and destroys the scheduler; ctrl_sched_submit(), ctrl_sched_cancel()
 * and ctrl_sched_stats() may be called from any thread. Token callbacks run on
 * the scheduler thread, inside ctrl_sched_poll(); they may call submit and
 * cancel.
 */
#ifndef CTRL_SCHED_H
#define CTRL_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "ctrl_chain.h"

#ifdef __cplusplus
extern "C" {
#endif

/** ctrl_sched_poll() did work (launched, applied results, admitted, finished). */
#define CTRL_SCHED_BUSY 1
/** ctrl_sched_poll() found nothing to do (groups may still be in flight). */
#define CTRL_SCHED_IDLE 0

/** Why a request ended. */
enum ctrl_finish {
	CTRL_FINISH_NONE = 0,      /**< not finished: the event carries a token */
	CTRL_FINISH_LENGTH = 1,    /**< max_tokens reached */
	CTRL_FINISH_STOP = 2,      /**< a stop token was produced (event.token) */
	CTRL_FINISH_CANCELLED = 3, /**< ctrl_sched_cancel() */
	CTRL_FINISH_ERROR = 4,     /**< rejected, or its group failed: event.message */
};

/** @return "length", "stop", "cancelled", "error" or "none". */
const char *ctrl_finish_name(enum ctrl_finish f);

/** What a token callback receives. */
struct ctrl_event {
	uint64_t id;
	enum ctrl_finish finish;
	int32_t token;             /**< NONE: the new token (or, with prompt_pos, the prompt's
	                                token there); STOP: the stop token; else -1 */
	int32_t prompt_pos;        /**< > 0: not a generated token but prompt token prompt_pos
	                                scored (ctrl_request.prompt_logprobs): logprob and the top
	                                alternatives are the model's at that position; 0 otherwise */
	float logprob;             /**< logprob of token (0 where unknown) */
	int32_t n_generated;       /**< tokens emitted so far, this one included */
	const char *message;       /**< ERROR: why; else NULL */
	int32_t n_top;             /**< NONE: entries in top_ids / top_logprobs (the request's
	                                n_logprobs, fewer only if the chain gave fewer) */
	const int32_t *top_ids;    /**< [n_top] most likely tokens, best first; valid during the callback */
	const float *top_logprobs; /**< [n_top] their logprobs */
	int kv_reserved;           /**< 1: no token: a kv_remote request's prompt blocks are
	                                reserved (kv_blocks); the KV may be written into them */
	int kv_progress;           /**< 1: no token: a hold_kv request's prompt chunk came back
	                                from every stage; kv_blocks[0 .. n_kv_blocks) are
	                                whole and final (kv_positions = positions computed), so
	                                they may be read out while the rest of the prompt runs */
	int kv_lost;               /**< 1: no token: a kv_remote request's stages went down (their
	                                KV with them): it runs again here, its prompt and the
	                                tokens it streamed computed by this node's chain, as any
	                                replayed request; its reserved blocks went back, so no page
	                                may be written into them any more */
	const int32_t *kv_blocks;  /**< kv_reserved, kv_progress, or a hold_kv request's finish: the blocks
	                                holding positions 0 .. kv_positions-1, in order (valid
	                                during the callback) */
	int32_t n_kv_blocks;
	int32_t kv_positions;      /**< positions whose KV those blocks hold (or will) */
	uint64_t t_admitted_ns;    /**< when the scheduler admitted the request (kvf_mono_ns(),
	                                CLOCK_MONOTONIC): the end of its queue time; 0 if it
	                                never was (rejected or cancelled while waiting) */
	int32_t cached_tokens;     /**< prompt positions its (last) admission took from the
	                                prefix cache instead of computing them */
};

/**
 * A per-request callback: once per generated token (finish NONE), then once
 * with the finish reason. The last call is always the finish event; after it
 * the request's id is dead. Runs on the scheduler thread.
 */
typedef void (*ctrl_token_cb)(void *arg, const struct ctrl_event *ev);

/** A request. Buffers are copied by ctrl_sched_submit(). */
struct ctrl_request {
	const int32_t *prompt;     /**< token ids */
	int32_t n_prompt;          /**< >= 1 */
	int32_t max_tokens;        /**< >= 1; 0: the prompt is computed and the request ends
	                                (length) with no token, as a prompt_logprobs request that
	                                only scores its prompt does (not with kv_remote) */
	const int32_t *stop_ids;   /**< ending tokens (e.g. the model's EOS ids) */
	int32_t n_stop;
	float temperature;         /**< 0 = greedy */
	float top_p;               /**< 1 = off */
	int32_t top_k;             /**< 0 = off */
	uint32_t seed;
	ctrl_token_cb cb;          /**< required */
	void *cb_arg;
	int32_t n_logprobs;        /**< top logprobs per generated token, 0 .. CTRL_CHAIN_MAX_LOGPROBS */
	int hold_kv;               /**< a prefill node's request: when it ends with length or
	                                stop its prompt's KV blocks stay held (the finish event
	                                lists them) until ctrl_sched_kv_release() */
	int32_t prompt_logprobs;   /**< k >= 1: before its first token, an event per prompt
	                                position p in k .. n_prompt-1 (event.prompt_pos = p, in
	                                order) with the logprob of prompt token p given the tokens
	                                before it and n_logprobs alternatives (what lm-eval's
	                                likelihood tasks ask: echo with logprobs, k = 1). Those
	                                positions are computed here (no prefix-cache blocks over
	                                them); not with hold_kv or kv_remote. 0: none */
	uint64_t prefill_from;     /**< 0, or the id of an earlier request of this scheduler with
	                                the same prompt (the n choices of one API request): once
	                                that one's prompt is computed this one reads its whole
	                                prompt blocks instead of computing them again (its last
	                                partial block and first token it computes itself); if that
	                                one ends first, or never ran here, this one computes its
	                                prompt. Ignored for hold_kv and kv_remote requests */
	int kv_remote;             /**< a decode node's request: its prompt's KV comes from
	                                elsewhere. Once admitted, the prompt's blocks are
	                                reserved (a kv_reserved event lists them) and nothing
	                                computes the prompt; ctrl_sched_kv_ready() brings the
	                                first token and decoding starts at position n_prompt */
};

/** Fill @p r with defaults: greedy, top_p 1, no stops, max_tokens 16. */
void ctrl_request_init(struct ctrl_request *r);

#define CTRL_SCHED_MAX_PLANS 8

/** Scheduler options. */
struct ctrl_sched_opts {
	int32_t n_groups;          /**< micro-batches in flight: max(n_stages + 1, this) */
	int32_t force_groups;      /**< > 0: exactly this many, below the floor too (tests and
	                                benches that show what too few groups cost) */
	int32_t mb_cols;           /**< columns of a micro-batch with decode work (mb_k) */
	int one_launch_decode;     /**< one stage: every decode rides in one launch, prompt
	                                chunks with it, and nothing else launches while it is out
	                                (for engines whose step costs nearly the same at any
	                                width: the GPU). 0 = groups take whatever is ready */
	double step_budget;        /**< with one_launch_decode: prompt positions beside decodes
	                                are capped so that a launch's predicted step time stays
	                                within this many times its decodes' own (the model is fit
	                                to the step times the chain reports); <= 1 = no cap */
	int32_t plans[CTRL_SCHED_MAX_PLANS]; /**< the widths the chain pads a launch to,
	                                ascending (the step budget measures each); n_plans 0:
	                                not known, a straight-line model of the widths is used */
	int32_t n_plans;
	int32_t prefill_cols;      /**< columns of a prefill-only launch (the wide plan);
	                                0 = the chain's max_cols */
	int prefill_pipeline;      /**< 1: with several stages a prompt's next chunk may launch
	                                while earlier ones are in flight (0, the default: one) */
	int pipeline_held;         /**< with prefill_pipeline, a hold_kv prompt's chunks too (1,
	                                the default); 0 where page copies queue behind the steps
	                                already sent (worker processes): a held prompt then has one
	                                chunk in flight, so each chunk's pages leave before the
	                                next chunk's step instead of after the whole prompt */
	int32_t hold_chunk;        /**< > 0: a hold_kv prompt advances at most this many
	                                positions per launch (rounded down to whole blocks, at
	                                least one), so its kv_progress comes chunk by chunk */
	int hold_taper;            /**< with hold_chunk: only the last chunk that small; the ones
	                                before take what the launch's width allows while they leave
	                                hold_chunk positions for the end */
	int32_t n_blocks;          /**< 0 = the chain's; else at most that */
	int32_t n_slots;           /**< 0 = the chain's; else at most that */
	int32_t max_queue;         /**< waiting requests beyond this are refused (-EAGAIN) */
	int spec;                  /**< prompt-lookup speculative decoding on greedy requests */
	int32_t spec_depth;        /**< most drafted tokens per verify span */
	int32_t spec_c_full;       /**< full depth while live sequences <= this */
	int32_t spec_c_half;       /**< min(depth, 4) while live <= this; off above */
	int32_t spec_ngram_min;    /**< shortest suffix n-gram that may produce a draft */
	int32_t spec_ngram_max;    /**< longest suffix n-gram tried first */
	int32_t spec_window;       /**< lookup searches the last this many tokens */
	uint8_t id_tag;            /**< low 8 bits of every request id (replica index) */
	int32_t replay_max;        /**< a request whose micro-batch the chain failed (a stage
	                                died) is replayed from its prompt plus the tokens it
	                                generated, at most this many times, then ends with the
	                                chain's error; 0: it ends at once (no replay) */
	uint64_t replay_timeout_ms; /**< with replay_max > 0: how long a request may wait for a
	                                chain that is not ready (ctrl_chain_ready()) before it
	                                ends with the chain's error */
	int prefix_cache;          /**< keep finished prompts' KV blocks for later prompts that
	                                start with the same tokens (ctrl/sched_prefix.c) */
};

/**
 * Fill @p o with defaults: 0 extra groups (so n_stages + 1), mb_cols 32, wide
 * plan = chain max, spec on with depth 8, c_full 8, c_half 32, n-grams 2..4,
 * window 4096, queue 65536, replay_max 2, replay_timeout 30 s.
 */
void ctrl_sched_opts_init(struct ctrl_sched_opts *o);

/** One stage as the scheduler sees it. */
struct ctrl_sched_stage_stats {
	uint64_t steps;
	uint64_t cols;
	double mean_step_us;       /**< busy time per step */
	double busy_frac;          /**< busy time / chain elapsed time */
};

/** Scheduler counters; a consistent snapshot as of the last poll that did work. */
struct ctrl_sched_stats {
	int32_t n_stages;
	int32_t n_groups;
	struct ctrl_sched_stage_stats stage[CTRL_CHAIN_MAX_STAGES];
	double occupancy;          /**< fraction of stage-ticks busy: sum busy / (stages * elapsed) */
	double ideal_occupancy;    /**< launches / (launches + stages - 1): what a perfect
	                                pipeline of equal steps reaches with as many launches */
	double mean_round_trip_us; /**< submit to result, per group round */
	uint64_t launches;
	uint64_t launched_cols;
	uint64_t prefill_cols;
	uint64_t submitted;
	uint64_t admitted;
	uint64_t rejected;
	uint64_t finished;         /**< every finish, whatever the reason */
	uint64_t cancelled;
	uint64_t errors;           /**< finished with CTRL_FINISH_ERROR, rejections included */
	uint64_t tokens;           /**< tokens emitted */
	int32_t queued;
	int32_t live;
	int32_t blocks_total;
	int32_t blocks_in_use;
	int32_t blocks_reserved;   /**< worst case of every admitted sequence */
	int32_t blocks_cached;     /**< prefix cache: idle blocks kept for later prompts (not counted
	                                in blocks_in_use; given back first when the pool runs dry) */
	uint64_t prefix_hit_tokens; /**< prompt positions taken from the prefix cache, not computed */
	uint64_t prefill_shared_tokens; /**< prompt positions read from an earlier request's blocks
	                                (ctrl_request.prefill_from: the n choices of one request) */
	uint64_t prefix_flushes;   /**< times the prefix cache was emptied (the chain lost KV) */
	uint64_t spec_rounds;      /**< verify spans launched */
	uint64_t spec_drafted;
	uint64_t spec_accepted;
	double spec_acceptance;    /**< accepted / drafted */
	uint64_t lookup_tries;
	uint64_t lookup_hits;      /**< prompt lookups that found a draft */
	uint64_t max_ready_wait;   /**< most launches a ready sequence waited to be packed */
	uint64_t prefill_capped;   /**< launches whose prompt positions the step budget cut */
	uint64_t prefill_pipelined; /**< prompt chunks launched while an earlier chunk of theirs was in flight */
	int32_t kv_held_blocks;    /**< blocks hold_kv requests keep */
	int32_t kv_waiting;        /**< kv_remote requests waiting for their KV */
	uint64_t kv_imported;      /**< kv_remote requests that started decoding */
	uint64_t kv_stale;         /**< kv_ready / failed / release for no such request */
	uint64_t kv_replayed_here; /**< kv_remote requests replayed as local ones (kv_lost) */
	uint64_t replayed;         /**< requests put back to run again after the chain lost
	                                them (each replay counts) */
	uint64_t replay_failures;  /**< requests that ended with the chain's error although
	                                replay was on: past replay_max, or past replay_timeout */
	uint64_t moved_out;        /**< waiting requests handed to another replica while this
	                                one's chain was down (ctrl_dispatch_poll) */
	int32_t replaying;         /**< requests waiting to run again now */
	double step_fixed_us;      /**< the step model: fixed time of a launch (0: no fit) */
	double step_col_us;        /**< the step model: time per column */
	int32_t n_plans;           /**< the step model's plans (ctrl_sched_opts.plans) */
	int32_t plan_width[CTRL_SCHED_MAX_PLANS];
	double plan_step_us[CTRL_SCHED_MAX_PLANS];  /**< moving average of the plan's step time */
	uint64_t plan_steps[CTRL_SCHED_MAX_PLANS];  /**< steps measured in it */
	size_t queued_bytes;       /**< heap held by waiting requests */
	size_t live_bytes;         /**< heap held by live sequences (tokens, block rows) */
};

struct ctrl_sched;

/*
 * Prefill/decode handoff. The three calls below may come from any thread;
 * the scheduler applies them at its next poll, in order. Each names a
 * request by its id; one that has ended (or never held KV) is ignored and
 * counted (ctrl_sched_stats.kv_stale).
 */

/**
 * A kv_remote request's prompt KV is in its reserved blocks: emit
 * @p first_token (with @p logprob and @p n_top top logprobs: they came
 * from the prefill node) and decode from there.
 * @return 0, -EINVAL (token < 0, n_top out of range), -ENOMEM.
 */
int ctrl_sched_kv_ready(struct ctrl_sched *s, uint64_t id, int32_t first_token, float logprob, int32_t n_top,
			const int32_t *top_ids, const float *top_logprobs);

/**
 * A kv_remote request's first token is known (the prefill node reported
 * it) before its pages have all landed: emit it now, so the client's time
 * to first token does not wait for the last page; decoding still starts
 * only with ctrl_sched_kv_ready(), which then emits nothing more (its
 * token is this one). The request may end here (a stop token, max_tokens
 * 1): its blocks go back as for any request that ends while waiting. A
 * failure after it ends the request with the error, the first token sent.
 * @return as ctrl_sched_kv_ready().
 */
int ctrl_sched_kv_first(struct ctrl_sched *s, uint64_t id, int32_t first_token, float logprob, int32_t n_top,
			const int32_t *top_ids, const float *top_logprobs);

/**
 * A kv_remote request waiting for its prompt's KV computes it here instead
 * (its room failed on the prefill node's side, not for want of this node):
 * a kv_lost event tells its owner first (no page may land in its blocks any
 * more), then this node's chain prefills its prompt in the blocks it
 * reserved (or, still queued, it is admitted as a local request).
 * Thread-safe (applied at the next poll). @return 0 or -ENOMEM.
 */
int ctrl_sched_kv_local(struct ctrl_sched *s, uint64_t id);

/** A kv_remote request's KV will not come: end it with an error saying @p why. @return 0, -ENOMEM. */
int ctrl_sched_kv_failed(struct ctrl_sched *s, uint64_t id, const char *why);

/** Give back the blocks a hold_kv request kept. @return 0, -ENOMEM. */
int ctrl_sched_kv_release(struct ctrl_sched *s, uint64_t id);

/**
 * Create a scheduler over @p chain (borrowed: it must outlive the scheduler).
 * @param err receives a message on failure
 * @return the scheduler, or NULL with errno EINVAL (options the chain cannot
 *         carry, e.g. more groups than it accepts), ENOMEM.
 */
struct ctrl_sched *ctrl_sched_create(struct ctrl_chain *chain, const struct ctrl_sched_opts *o,
				     char *err, size_t errlen);

/**
 * Destroy the scheduler. Requests still queued or live end without a
 * callback; groups in flight are abandoned (destroy the chain after).
 * Call from the scheduler thread; NULL is a no-op.
 */
void ctrl_sched_destroy(struct ctrl_sched *s);

/**
 * The most max_tokens a request of @p n_prompt prompt tokens could ever be
 * admitted with: its worst case (prompt + max_tokens positions) within the
 * whole block pool and within a sequence's positions (a slot's block-table
 * row, the model's context). A caller refuses a request above it at once,
 * before it answers anything, instead of submitting one that would end with
 * an error at the next poll. Thread-safe: it reads what ctrl_sched_create()
 * fixed, no lock.
 * @param max_tokens  what the request asks for
 * @param err         when @p max_tokens is above the result: the message the
 *                    scheduler would end the request with ("request needs 251
 *                    KV blocks ... but the pool holds 128 blocks: ..."); else
 *                    "". May be NULL.
 * @return that many max_tokens, 0 when even the prompt does not fit.
 */
int32_t ctrl_sched_admissible(const struct ctrl_sched *s, int32_t n_prompt, int32_t max_tokens, char *err,
			      size_t errlen);

/**
 * Queue a request. Thread-safe; cheap (one copy, one lock). A request that can
 * never fit (more blocks than the pool, longer than a slot's context) ends on
 * the next poll with CTRL_FINISH_ERROR and a message naming the pool
 * (ctrl_sched_admissible() says so before submitting).
 * @return the request id (> 0), or -EINVAL (no prompt, max_tokens < 1, no
 *         callback, n_logprobs out of range), -EAGAIN (max_queue requests already waiting), -ENOMEM.
 */
int64_t ctrl_sched_submit(struct ctrl_sched *s, const struct ctrl_request *r);

/**
 * Cancel a request (its client went away). Thread-safe. It ends with
 * CTRL_FINISH_CANCELLED after its in-flight round, if any, returned; its
 * blocks are freed then. Cancelling an id that already ended is harmless.
 * @return 0, -ENOMEM.
 */
int ctrl_sched_cancel(struct ctrl_sched *s, uint64_t id);

/**
 * Do one round of scheduler work without blocking: take new requests and
 * cancellations, collect finished groups and apply their tokens (callbacks
 * run here), admit waiting requests, launch every free group that has work.
 * @return CTRL_SCHED_BUSY, CTRL_SCHED_IDLE, or -errno when the chain failed
 *         as a whole (the requests involved have already been ended).
 */
int ctrl_sched_poll(struct ctrl_sched *s);

/** @return 1 when nothing is queued, live or in flight. Scheduler thread. */
int ctrl_sched_drained(struct ctrl_sched *s);

/**
 * Forget the prefix cache (SGLang's /flush_cache) at the next poll: idle
 * cached blocks go back to the pool; blocks running sequences read stay
 * theirs. Thread-safe. @return 0, or -ENOTSUP when prefix_cache is off.
 */
int ctrl_sched_flush_prefix(struct ctrl_sched *s);

/**
 * A snapshot of the counters as of the last poll that did work. Thread-safe.
 * @return 0.
 */
int ctrl_sched_stats(struct ctrl_sched *s, struct ctrl_sched_stats *st);

/**
 * Current load: worst-case blocks of live and waiting requests over the pool
 * size. Thread-safe (one atomic read); the dispatcher balances on it.
 */
double ctrl_sched_load(struct ctrl_sched *s);

/* ---- replicas ---- */

/** Most replicas a dispatcher holds (ids carry the index in 8 bits). */
#define CTRL_DISPATCH_MAX 64

struct ctrl_dispatch;

/**
 * A dispatcher over @p n independent schedulers (borrowed), each driving its
 * own pipeline. Replica i must have been created with id_tag = i.
 * @return the dispatcher, or NULL with errno EINVAL (n out of 1..CTRL_DISPATCH_MAX,
 *         a replica's id_tag not its index), ENOMEM.
 */
struct ctrl_dispatch *ctrl_dispatch_create(struct ctrl_sched *const *replicas, int n);

/** Destroy the dispatcher (not the replicas); NULL is a no-op. */
void ctrl_dispatch_destroy(struct ctrl_dispatch *d);

/**
 * Send @p r to the least-loaded replica (ctrl_sched_load(); ties go round
 * robin) among those whose pool could ever carry it (all of them when none
 * can: the request then ends with the scheduler's error). Thread-safe.
 * @return as ctrl_sched_submit().
 */
int64_t ctrl_dispatch_submit(struct ctrl_dispatch *d, const struct ctrl_request *r);

/**
 * ctrl_sched_admissible() over the replicas: the most any of them could
 * admit (the largest pool), and that replica's refusal in @p err.
 * Thread-safe, no lock.
 */
int32_t ctrl_dispatch_admissible(const struct ctrl_dispatch *d, int32_t n_prompt, int32_t max_tokens, char *err,
				 size_t errlen);

/** ctrl_sched_flush_prefix() on every replica. Thread-safe. @return 0, or -ENOTSUP (no replica caches). */
int ctrl_dispatch_flush_prefix(struct ctrl_dispatch *d);

/** Cancel by id (routed by its tag). Thread-safe. @return 0, -EINVAL (bad tag), -ENOMEM. */
int ctrl_dispatch_cancel(struct ctrl_dispatch *d, uint64_t id);

/**
 * Poll every replica once (one scheduler thread drives them all; a daemon may
 * instead give each replica its own thread and poll them directly).
 * @return CTRL_SCHED_BUSY if any replica was busy, CTRL_SCHED_IDLE, or the
 *         first -errno.
 */
int ctrl_dispatch_poll(struct ctrl_dispatch *d);

/** @return 1 when every replica is drained. */
int ctrl_dispatch_drained(struct ctrl_dispatch *d);

/** @return the replica count. */
int ctrl_dispatch_count(const struct ctrl_dispatch *d);

/** @return replica @p i (for its stats), or NULL. */
struct ctrl_sched *ctrl_dispatch_replica(struct ctrl_dispatch *d, int i);

/* ---- admin commands ---- */

struct ctrl_admin;

/** What the schedulers' admin commands read: the daemon keeps it alive. */
struct ctrl_sched_view {
	struct ctrl_sched *const *scheds; /**< [n] one per replica */
	struct ctrl_chain *const *chains; /**< [n] their chains */
	int n;
	const int32_t *ends;              /**< each stage's end layer */
};

/**
 * Register /sched/stages and /sched/pool on @p a, reading @p v (kept by the
 * caller until the admin server stops).
 * @return 0, or ctrl_admin_register()'s error.
 */
int ctrl_sched_admin_register(struct ctrl_admin *a, const struct ctrl_sched_view *v);

#ifdef __cplusplus
}
#endif
#endif /* CTRL_SCHED_H */
