/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private: the scheduler's state, shared by sched.c and its unit tests
 * (which include sched.c to reach statics).
 */
#ifndef CTRL_SCHED_INT_H
#define CTRL_SCHED_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ctrl_sched.h"

struct shm_blkpool;

/* A request, queued or live. One allocation plus its token buffer. */
struct sched_req {
	struct sched_req *next;   /* inbox / FIFO link */
	uint64_t id;
	int32_t n_prompt;
	int32_t max_tokens;
	int32_t n_gen;
	int32_t need;             /* worst-case blocks */
	int32_t cap;              /* toks capacity: n_prompt while queued, + max_tokens once live */
	float temperature;
	float top_p;
	int32_t top_k;
	uint32_t seed;
	int32_t n_logprobs;
	ctrl_token_cb cb;
	void *cb_arg;
	int32_t *toks;            /* prompt, then generated tokens */
	int32_t n_stop;
	int32_t stop[];
};

/* A block-table row and the sequence in it. */
struct sched_slot {
	struct sched_req *r;      /* NULL: free */
	int32_t n_fed;            /* positions the stages hold */
	int32_t n_toks;           /* tokens known (prompt + generated) */
	int32_t n_blk;            /* blocks held: blk[0 .. n_blk) */
	int32_t rollback_to;      /* pending ROLLBACK position, -1 none */
	int32_t *blk;             /* [max_blocks_per_slot] */
	uint64_t ready_at;        /* launch count when it last became ready */
	uint8_t inflight;         /* one round in flight per sequence */
	uint8_t fresh;            /* the row needs ZERO_SLOT before its first columns */
	uint8_t cancelled;        /* end after the in-flight round returns */
};

enum sched_ent_kind {
	ENT_PREFILL = 0,          /* a prompt chunk, no logit */
	ENT_PREFILL_LAST = 1,     /* the prompt's last chunk: its last column yields token 1 */
	ENT_DECODE = 2,           /* the newest token + draft tokens, every column a logit */
};

/* One sequence's columns within a micro-batch. */
struct sched_ent {
	int32_t slot;
	int32_t col;              /* first column */
	int16_t n;                /* columns */
	uint8_t kind;             /* enum sched_ent_kind */
	uint8_t draft;            /* drafted tokens (ENT_DECODE) */
};

enum sched_group_state {
	GROUP_IDLE = 0,
	GROUP_PENDING = 1,        /* built, the transport said -EBUSY: resubmit before anything else */
	GROUP_INFLIGHT = 2,
};

struct sched_group {
	int state;                /* enum sched_group_state */
	int32_t n_cols, n_ops, n_ent;
	int has_decode;           /* packed with decode columns */
	uint64_t t_launch;
	struct kn_column *cols;   /* [width] kept for draft verification */
	struct kn_op *ops;        /* [ops_cap] */
	struct sched_ent *ent;    /* [width] */
};

/* An event held until the poll's launches are out (a copy: the result buffers
 * it points into are reused by the next round). */
struct sched_pend {
	ctrl_token_cb cb;
	void *cb_arg;
	struct ctrl_event ev;
	int32_t top_ids[CTRL_CHAIN_MAX_LOGPROBS];
	float top_lps[CTRL_CHAIN_MAX_LOGPROBS];
	char msg[320];
};

/* The step model (sched_budget.c): each plan's measured step time, and
 * decayed sums of a least-squares fit of step time against columns,
 * t = a + b n, for plans not measured yet (or a chain without plans). */
struct sched_fit {
	double w, sn, snn, st, snt;
	double a, b;              /* ns, ns per column, valid with fitted */
	int fitted;
	uint64_t samples;
	int32_t n_plans;          /* 0: the chain's widths are not known */
	int32_t plan[CTRL_SCHED_MAX_PLANS];
	double plan_ns[CTRL_SCHED_MAX_PLANS];   /* moving average of its step times */
	uint32_t plan_n[CTRL_SCHED_MAX_PLANS];  /* steps measured */
	uint8_t plan_seen[CTRL_SCHED_MAX_PLANS]; /* its first step (a graph capture) went by */
};

/* Take the plan widths (ascending); widths out of order are dropped. */
void sched_fit_plans(struct sched_fit *f, const int32_t *plans, int32_t n);
void sched_fit_add(struct sched_fit *f, int32_t n_cols, uint64_t step_ns);
/* Most columns a launch with @p n_dec decode columns may have so that its
 * predicted time stays within @p budget times theirs alone (at least
 * n_dec + @p floor_cols, at most @p max_cols): @p max_cols when no cap
 * applies (budget <= 1, nothing measured, a step whose cost is flat). */
int32_t sched_fit_width(const struct sched_fit *f, double budget, int32_t n_dec, int32_t max_cols,
			int32_t floor_cols);

struct ctrl_sched {
	struct ctrl_chain *chain;
	struct ctrl_chain_info ci;
	struct ctrl_sched_opts o;
	int32_t n_slots, n_blocks, n_groups, mb_cols, pf_cols, mbps, ctx;
	int one_launch;               /* ctrl_sched_opts.one_launch_decode */
	/* Events of one poll, delivered after its launches (emit() / flush()) */
	struct sched_pend *pend;
	int32_t n_pend, cap_pend;
	int defer;
	struct shm_blkpool *pool;
	struct sched_slot *slots;
	int32_t *blk_mem;
	int32_t *free_slots;
	int32_t n_free_slots;
	struct sched_group *groups;
	struct ctrl_chain_result *res;
	int32_t *draft;
	int32_t dcur, pcur;       /* rotating cursors: decode, prefill */
	int32_t n_inflight;
	struct sched_req *q_head, *q_tail;  /* FIFO of admitted-to-wait requests */
	int32_t n_queued;
	int32_t n_live;
	int32_t reserved;         /* sum of worst-case blocks of live sequences */
	uint64_t launch_no;
	size_t queued_bytes, live_bytes;
	uint64_t rt_ns, rt_n;
	struct sched_fit fit;     /* step time against columns (one stage, one launch) */

	/* inbox: any thread */
	pthread_mutex_t lock;
	struct sched_req *in_head, *in_tail;
	uint64_t *cancels;
	size_t n_cancel, cap_cancel;
	atomic_uint_fast64_t next_seq;
	atomic_int_fast64_t load;   /* worst-case blocks of waiting + live requests */
	atomic_int pending;         /* submitted, not yet admitted or ended */

	struct ctrl_sched_stats st; /* scheduler thread */
	pthread_mutex_t st_lock;
	struct ctrl_sched_stats pub;
};

#endif /* CTRL_SCHED_INT_H */
