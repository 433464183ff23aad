/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private to the chains that keep per-group result buffers (chain_kn.c,
 * chain_proc.c): a group's output as it waits to be polled, and its fill of
 * a ctrl_chain_result (chain.c). Each chain embeds one per group; the
 * buffers live until the chain is destroyed, so a polled result's pointers
 * stay valid until the group is submitted again (ctrl_chain.h's contract).
 */
#ifndef CTRL_CHAIN_OUT_H
#define CTRL_CHAIN_OUT_H

#include <stdint.h>

#include "ctrl_chain.h"

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

#endif /* CTRL_CHAIN_OUT_H */
