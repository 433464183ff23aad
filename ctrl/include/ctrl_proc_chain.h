/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file ctrl_proc_chain.h
 * The stage chain to kvferry-worker processes: micro-batch messages
 * (shm_mb.h) go from ctrld to stage 0 through a shm ring of this node, from
 * stage to stage through the next stage's ring (same node) or the dataplane
 * (another node), and the last stage's results come back to ctrld through a
 * return ring (same node) or the dataplane's receive ring.
 *
 * Setting up (in ctrl_proc_chain_create(), before any token flows):
 *  - layer ranges: even split by layers or given explicitly; validated to
 *    tile the model exactly, and printed;
 *  - JOIN travels the chain: every worker checks the chain protocol and the
 *    model fingerprint (a mismatch is refused with a message naming both
 *    sides), loads its range and reports how many KV blocks it can hold;
 *  - POOL travels the chain with the least of those counts: every stage
 *    holds the same block count, since ctrld hands out block ids that every
 *    stage indexes.
 *
 * Failure: a stage that dies (its liveness slot says DEAD, the dataplane
 * reports its node dead or restarted, or a group overstays the group
 * timeout) fails every group in flight with status < 0 and a message naming
 * the stage. The chain then re-forms by itself (JOIN + POOL again, as soon
 * as a restarted worker answers); until it has, ctrl_chain_ready() says
 * so, naming the stage, and submitted groups fail at once. Sequences that
 * had KV on the lost stage fail when next submitted (their KV is gone); a
 * slot is whole again once the scheduler zeroes it for a new sequence (the
 * scheduler replays such sequences in fresh slots: ctrl_sched.h).
 *
 * Threading: as every chain, one thread calls every function.
 */
#ifndef CTRL_PROC_CHAIN_H
#define CTRL_PROC_CHAIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ctrl_chain.h"
#include "kn_model.h"
#include "kn_stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Options of the worker-process chain. */
struct ctrl_proc_chain_opts {
	const char *region;           /**< this node's region (required) */
	size_t region_bytes;          /**< > 0: create the region (no dataplane on this
	                                   node creates it); 0: attach */
	const char *first_ring;       /**< ring of stage 0 on this node ("serve.s0.in") */
	const char *return_ring;      /**< results ring on this node ("serve.ret"), or
	                                   NULL: results come through the dataplane (dp.rx) */
	const char *prefix;           /**< the chain's own names in the region: its output area
	                                   PREFIX.ctrl.out, its stage rings PREFIX.sK.in ("serve");
	                                   a second pipeline on one region takes another */
	int32_t n_stages;             /**< 1 .. CTRL_CHAIN_MAX_STAGES */
	int32_t layer_ends[CTRL_CHAIN_MAX_STAGES]; /**< all > 0: explicit ranges
	                                   [end(i-1), end(i)); all 0: even split */
	struct kn_stage_opts stage;   /**< n_slots, max_blocks_per_slot, plans, n_threads,
	                                   n_blocks (-1: negotiate from what workers hold),
	                                   kv_budget_bytes, kv_mem_fraction */
	int32_t max_groups;
	uint64_t join_timeout_ms;     /**< how long create() waits for every worker */
	uint64_t group_timeout_ms;    /**< a group in flight longer than this fails the chain */
	uint64_t stale_ms;            /**< liveness: a heartbeat older than this is SLOW (not dead) */
	FILE *log;                    /**< the stage table and chain events (NULL: stderr) */
};

/** Defaults: 2 stages, even split, "serve.s0.in" → "serve.ret", 32 groups, 60 s join, 30 s groups. */
void ctrl_proc_chain_opts_init(struct ctrl_proc_chain_opts *o);

/**
 * Compute layer ranges: explicit @p ends (validated to tile [0, n_layers)
 * exactly) or, when ends[0] == 0, an even split of @p n_layers in @p n.
 * @param ends    in: explicit ends or zeros; out: the ends used
 * @return 0, or -EINVAL with @p err naming the gap, overlap or overrun.
 */
int ctrl_proc_chain_layers(int32_t n_layers, int32_t n, int32_t *ends, char *err, size_t errlen);

/**
 * Attach to the workers of a chain and set it up (see the file comment).
 * Blocks until every worker joined or join_timeout_ms passed. @p m (the
 * model ctrld serves) gives the fingerprint workers must match; it must
 * outlive the chain.
 * @return the chain, or NULL with errno set (EINVAL bad options or layer
 *         ranges, ENOENT no such region, EPROTO a worker refused: protocol,
 *         ABI or model mismatch, ETIMEDOUT a worker did not answer, ENOMEM)
 *         and @p err filled.
 */
struct ctrl_chain *ctrl_proc_chain_create(const struct kn_model *m, const struct ctrl_proc_chain_opts *o,
					  char *err, size_t errlen);

/** One stage as the chain sees it (for `ctrlctl stages`). */
struct ctrl_proc_stage {
	int32_t layer_start, layer_end;
	int32_t pid, node, n_blocks;
	char role[24];
	char backend[8];
	int up;                       /**< 1 while the stage answers */
	uint64_t weight_bytes, kv_bytes, load_ns;
	/* Loading, for `ctrlctl status`: what the range reads from the model
	 * files (the tensors kvferry-worker loads for it), and where it stands. */
	int32_t n_tensors;            /**< tensors of its layer range (+ embedding, norm, head) */
	uint64_t tensor_bytes;        /**< their bytes in the model files */
	const char *state;            /**< "ready"; while the chain re-forms: "down" (its worker
	                                   died: a restarted one loads the range, then answers),
	                                   "rejoining" (kept its weights, waits in the join),
	                                   "pooling" (every stage joined, the pool is being set) */
	uint64_t state_ms;            /**< time since the chain went down (0 when ready) */
	/* Tensor parallelism: the stage's worker processes (its ranks, rank 0
	 * the one above), as their group's area says (wk_tp_area.h). */
	int32_t tp_size;              /**< 1: one process */
	int32_t tp_pids[8];           /**< by rank; 0: not answered yet */
};

/**
 * Describe stage @p i of a chain made by ctrl_proc_chain_create().
 * @return 0, -EINVAL (not a worker-process chain, or i out of range).
 */
int ctrl_proc_chain_stage(struct ctrl_chain *c, int32_t i, struct ctrl_proc_stage *out);

/** Most rings and pools ctrl_proc_chain_shm() reports. */
#define CTRL_PROC_SHM_MAX 64

/** One ring or buffer pool of ctrld's region. */
struct ctrl_proc_shm_obj {
	char name[32];
	uint32_t used;     /**< ring: entries queued; pool: buffers handed out */
	uint32_t capacity; /**< ring: usable slots; pool: buffers */
};

/** What ctrld's region holds now: every serving ring and dataplane pool in it. */
struct ctrl_proc_shm {
	int32_t n_rings, n_pools;
	struct ctrl_proc_shm_obj ring[CTRL_PROC_SHM_MAX];
	struct ctrl_proc_shm_obj pool[CTRL_PROC_SHM_MAX];
	uint32_t ring_entries;   /**< sum of ring[].used */
	uint32_t pool_buffers;   /**< sum of pool[].capacity */
	uint32_t pool_available; /**< sum of pool[].capacity - pool[].used */
	int32_t groups_busy;     /**< groups submitted whose result was not yet polled */
	int32_t tainted_slots;   /**< slots that lost their KV when the chain re-formed */
};

/**
 * Count what sits in the rings and pools of ctrld's region: the stage input
 * rings ("serve.sK.in"), the return ring, and where a dataplane runs on the
 * region its rings (dp.tx.N / dp.txc.N send lanes, dp.rx, dp.ev) and receive pools. At rest
 * (no request in flight) every ring is empty and every pool buffer is back:
 * a leak test asserts exactly that. Rings and pools are read through the
 * region (lock-free counters), so any thread may call it; the group and slot
 * counts are a snapshot racing the polling thread by at most one poll.
 * @return 0, -EINVAL (not a worker-process chain).
 */
int ctrl_proc_chain_shm(struct ctrl_chain *c, struct ctrl_proc_shm *out);

struct shm_region;

/**
 * The region the chain's workers map (KV page buffers must lie in this
 * mapping of it: ctrl_pd_link_opts.reg). @return it, or NULL when @p c is
 * not a worker-process chain.
 */
struct shm_region *ctrl_proc_chain_region(struct ctrl_chain *c);

#ifdef __cplusplus
}
#endif
#endif /* CTRL_PROC_CHAIN_H */
