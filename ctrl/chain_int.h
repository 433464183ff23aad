/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private to the chains of kn_ stages, in this process or in worker
 * processes (chain_kn.c, chain_proc.c), the helpers in chain.c:
 *  - what such a chain carries (ctrl_chain_info), from the model and the
 *    stage options every stage is built from;
 *  - a group's output as it waits to be polled, and its fill of a
 *    ctrl_chain_result. Each chain embeds one per group; the buffers live
 *    until the chain is destroyed, so a polled result's pointers stay valid
 *    until the group is submitted again (ctrl_chain.h's contract).
 */
#ifndef CTRL_CHAIN_INT_H
#define CTRL_CHAIN_INT_H

#include <stdint.h>

#include "ctrl_chain.h"

/* The widest of @p so's plans: the most columns one micro-batch may have. */
int32_t chain_widest_plan(const struct kn_stage_opts *so);

/* Fill @p info for @p n_stages stages of the model @p cfg describes, each
 * built from @p so, taking group ids 0 .. @p max_groups - 1: everything but
 * n_blocks, which only the stages know. */
void chain_info_init(struct ctrl_chain_info *info, const struct kn_model_config *cfg,
		     const struct kn_stage_opts *so, int32_t n_stages, int32_t max_groups);

struct chain_out {
	int status;          /* 0, or -errno: the whole group failed (err says why) */
	int32_t n_cols;      /* as submitted */
	int32_t n_failed;    /* columns failed alone: cst[i] < 0 */
	int32_t n_top;       /* top logprobs per column in the result */
	uint64_t step_ns;    /* the slowest stage's step time, 0: not known */
	int32_t *tokens;     /* [max_cols] */
	float *lps;          /* [max_cols] */
	int32_t *cst;        /* [max_cols] per-column status, read when n_failed > 0 */
	int32_t *top_ids;    /* [max_cols][CTRL_CHAIN_MAX_LOGPROBS] room, [n_cols][n_top] used */
	float *top_lps;
	char err[CTRL_CHAIN_ERRLEN];
};

/* Allocate @p o's buffers for @p max_cols columns (zeroed). @return 0 or
 * -ENOMEM (what was allocated is left for chain_out_free()). */
int chain_out_alloc(struct chain_out *o, int32_t max_cols);

/* Free @p o's buffers; a zeroed or partly allocated one is fine. */
void chain_out_free(struct chain_out *o);

/* A new submission of @p n_cols columns: no status, no error, no top logprobs. */
void chain_out_start(struct chain_out *o, int32_t n_cols);

/* Fill @p r with group @p group's result: failed columns, top logprobs and
 * the step time only for a group that did not fail as a whole. */
void chain_out_fill(const struct chain_out *o, uint32_t group, struct ctrl_chain_result *r);

#endif /* CTRL_CHAIN_INT_H */
