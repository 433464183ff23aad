/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private: the scheduler's state, shared by sched.c (requests, admission,
 * results, the poll loop), sched_pack.c (packing), sched_budget.c (the
 * step budget), sched_kv.c (the PD handoff), sched_replay.c (requests the
 * chain lost, run again), sched_stats.c (counters) and the scheduler's
 * tests and bench.
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
	int32_t n_prompt;         /* positions to prefill: the prompt, and after a replay the
	                             tokens it generated before too (toks[0 .. n_prompt)) */
	int32_t max_tokens;
	int32_t n_gen;
	int32_t need;             /* worst-case blocks */
	int32_t cap;              /* toks capacity: n_prompt while queued, + max_tokens once live */
	float temperature;
	float top_p;
	int32_t top_k;
	uint32_t seed;
	int32_t n_logprobs;
	uint8_t hold_kv, kv_remote;
	int32_t plp_end;          /* prompt_logprobs: the prompt's length (positions plp_next ..
	                             plp_end-1 are scored), 0 without; kept across replays */
	int32_t plp_next;         /* the next prompt position to report (a replay reports none twice) */
	uint64_t pf_from;         /* ctrl_request.prefill_from (0 for hold_kv and kv_remote requests) */
	uint64_t t_admitted_ns;   /* kvf_mono_ns() at admission, 0 while queued (ctrl_event's) */
	int32_t n_cached;         /* prompt positions its last admission took from the prefix cache */
	uint64_t t_wait_ns;       /* when it last began to wait in a queue (replay_timeout) */
	int32_t n_replays;        /* times the chain lost it and it was put back */
	char *why;                /* after a replay: how the chain lost it (NULL before) */
	char *doom;               /* kv_remote: its prompt's KV failed while it was still in the
	                             inbox (ctrl_sched_kv_failed()): it ends with this when taken */
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
	int32_t n_set;            /* of those, blocks the stages' rows already point at */
	int32_t rollback_to;      /* pending ROLLBACK position, -1 none */
	int32_t *blk;             /* [max_blocks_per_slot] */
	uint64_t ready_at;        /* launch count when it last became ready */
	int32_t n_sent;           /* prompt positions packed into rounds (>= n_fed while prefilling) */
	uint16_t inflight;        /* its rounds in flight: one, or several prompt chunks (pipelined) */
	uint8_t fresh;            /* the row needs ZERO_SLOT before its first columns */
	uint8_t cancelled;        /* end after the in-flight rounds return */
	uint8_t kv_wait;          /* kv_remote: waiting for its prompt's KV (not packed) */
	uint8_t kv_first;         /* kv_remote: its first token went out before its pages (ctrl_sched_kv_first) */
	uint8_t pf_wait;          /* waiting for request pf_from's prompt to be computed (not packed) */
	int32_t pfx_done;         /* prefix cache: leading blocks named (or taken) so far */
	uint64_t pfx_name;        /* ... and the last one's name (sched_prefix.c) */
	char *lost;               /* a round failed with rounds still in flight: lost (this why) once they return */
};

/* A message to the scheduler about a request's KV (sched_kv.c). */
enum sched_kv_kind { SCHED_KV_READY = 0, SCHED_KV_FAILED = 1, SCHED_KV_RELEASE = 2, SCHED_KV_LOCAL = 3,
		     SCHED_KV_FIRST = 4 };

struct sched_kvmsg {
	struct sched_kvmsg *next;
	int kind;                 /* enum sched_kv_kind */
	uint64_t id;
	int32_t token;
	float logprob;
	int32_t n_top;
	int32_t top_ids[CTRL_CHAIN_MAX_LOGPROBS];
	float top_lps[CTRL_CHAIN_MAX_LOGPROBS];
	char why[256];
};

/* Blocks a finished hold_kv request keeps. */
struct sched_held {
	struct sched_held *next;
	uint64_t id;
	int32_t n;
	int32_t blk[];
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
	char msg[512];
	int32_t *kv;               /* a copy of ev.kv_blocks of a token-less event (the slot's may change) */
};

/* Top logprobs of one column of a result, as a token event carries them. */
struct col_top {
	int32_t n;
	const int32_t *ids;
	const float *lps;
};

/* sched_emit.c, for the scheduler's files: deliver an event (deferred inside a poll),
 * end the sequence in a slot, append a generated token (1: it ended). */
void sched_emit(struct ctrl_sched *s, ctrl_token_cb cb, void *arg, const struct ctrl_event *ev);
/* Deliver the events sched_emit() held during a poll, in order (sched_emit.c). */
void sched_flush(struct ctrl_sched *s);
/* The top logprobs of column @p col of @p res that request @p r asked for. */
struct col_top sched_col_top(const struct ctrl_chain_result *res, const struct sched_req *r, int32_t col);
/* Free a request record (NULL: nothing). */
void sched_req_free(struct sched_req *r);
/* End request @p id, waiting in the queue or the replay queue, as @p why
 * (@p msg: the error's text); with @p msg, one still in the inbox is marked
 * to end so once taken. @return 1 if it was found. Scheduler thread. */
int sched_end_waiting(struct ctrl_sched *s, uint64_t id, enum ctrl_finish why, const char *msg);
/* Tell kv_remote request @p r's owner, now (events held go first), that no
 * page may land in its blocks any more (a kv_lost event): it is computed
 * here from now on (kv_remote cleared). sched_kv.c. */
void sched_kv_lost(struct ctrl_sched *s, struct sched_req *r);
/* Request @p id waiting in the queue or the replay queue, or NULL. Scheduler thread. */
struct sched_req *sched_find_waiting(struct ctrl_sched *s, uint64_t id);
void sched_slot_finish(struct ctrl_sched *s, int32_t i, enum ctrl_finish why, int32_t token, const char *msg);
int sched_slot_emit(struct ctrl_sched *s, int32_t i, int32_t tok, float lp, struct col_top top);
/* The scored prompt positions (KN_COL_FORCE columns) among @p n columns
 * from @p col of @p res, packed as @p cols: an event each, in order.
 * @return 1 if the round was lost (a stage did not score the given token). */
int sched_slot_prompt_lp(struct ctrl_sched *s, int32_t i, const struct ctrl_chain_result *res,
			 const struct kn_column *cols, int32_t col, int32_t n);

/* Heap a waiting request holds (cap: n_prompt while it first waits; a
 * replayed request keeps its whole token buffer). */
static inline size_t sched_req_queued_bytes(const struct sched_req *r)
{
	return sizeof(*r) + sizeof(int32_t) * (size_t)(r->cap + r->n_stop);
}

/* sched.c: replay, or end with an error, every sequence of group @p g (@p why: the chain's message). */
void sched_group_fail(struct ctrl_sched *s, struct sched_group *g, const char *why);
/* sched.c: take the sequence out of slot @p i without a word to its client
 * (its blocks and slot go back): @return its request. */
struct sched_req *sched_slot_release(struct ctrl_sched *s, int32_t i);
int sched_round_lost(struct ctrl_sched *s, int32_t i, const char *msg);
/* sched_slot.lost when its message could not be copied (never freed) */
extern char sched_lost_nomem[];
/* sched.c: tell the client and drop a request that is in no slot or queue. */
void sched_req_finish(struct ctrl_sched *s, struct sched_req *r, enum ctrl_finish why, int32_t token,
		      const char *msg);
/* sched.c: append @p r to the queue @p head .. @p tail. */
void sched_queue_push(struct sched_req **head, struct sched_req **tail, struct sched_req *r);
/* sched.c: unlink @p r from the queue @p head .. @p tail (@p prev before it, or NULL). */
void sched_queue_unlink(struct sched_req **head, struct sched_req **tail, struct sched_req *prev,
			struct sched_req *r);

/* sched_replay.c: move @p from's waiting requests (lost ones first, then
 * the FIFO) to @p to's queues, in order, but for PD requests and any @p to
 * could never carry; both polled by the calling thread. @return how many. */
int32_t sched_move_waiting(struct ctrl_sched *from, struct ctrl_sched *to);
/* sched_replay.c: requests the chain lost. */
/* The chain lost the sequence in slot @p i (@p msg: how); replay it or end it. */
void sched_slot_lost(struct ctrl_sched *s, int32_t i, const char *msg);
/* Before admitting and launching: @return 1 when the chain is not ready and
 * nothing may be admitted or launched (live sequences not in flight are put
 * back, waits past replay_timeout end), 0 to go on. */
int sched_replay_hold(struct ctrl_sched *s);

/* sched_stats.c: publish the counters ctrl_sched_stats() reads. */
void sched_publish(struct ctrl_sched *s);

/* sched_pack.c: pack group @p g from every ready sequence; @return its columns. */
int32_t sched_group_pack(struct ctrl_sched *s, struct sched_group *g);

/* sched_kv.c: the prefill/decode handoff. */
int sched_kv_drain(struct ctrl_sched *s);               /* apply the kv messages; 1 if any */
int sched_kv_reserve(struct ctrl_sched *s, int32_t i);  /* at admission of a kv_remote request */
void sched_kv_progress(struct ctrl_sched *s, int32_t i); /* a hold_kv prompt filled more blocks */
/* at a hold_kv request's end: its blocks, now held (NULL: out of memory) */
const struct sched_held *sched_kv_hold(struct ctrl_sched *s, int32_t i);
void sched_kv_destroy(struct ctrl_sched *s);

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
	double plan_ns[CTRL_SCHED_MAX_PLANS];   /* the least of its recent step times */
	double plan_recent[CTRL_SCHED_MAX_PLANS][8]; /* its last steps (SCHED_PLAN_WINDOW), a ring */
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

/* The prefix cache's books (sched_prefix.c), per block of the pool. */
struct sched_prefix {
	int on;
	uint64_t *name;           /* [n_blocks] a cached block's name; 0: none */
	int32_t *prev, *next;     /* [n_blocks] the LRU list of idle cached blocks (the
	                             cache's the only reference) */
	int32_t *hnext;           /* [n_blocks] the name table's chains */
	int32_t *toks;            /* [n_blocks][KN_PAGE_BLK] a cached block's tokens */
	int32_t *bucket;          /* [n_buckets] first block of each chain, -1 none */
	size_t n_buckets;         /* a power of two */
	int32_t lru_head, lru_tail; /* least recently used first */
	int32_t n_idle, n_named;
	uint64_t gen;             /* the chain's KV generation the cache was filled under */
};

struct ctrl_sched {
	struct ctrl_chain *chain;
	struct ctrl_chain_info ci;
	struct ctrl_sched_opts o;
	int32_t n_slots, n_blocks, n_groups, mb_cols, pf_cols, mbps, ctx;
	int one_launch;               /* ctrl_sched_opts.one_launch_decode */
	int32_t ops_cap;              /* ops one micro-batch holds */
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
	struct sched_held *held;  /* hold_kv requests that ended, newest first */
	int32_t n_held_blocks;
	int32_t dcur, pcur;       /* rotating cursors: decode, prefill */
	int32_t n_inflight;
	struct sched_req *q_head, *q_tail;  /* FIFO of admitted-to-wait requests */
	int32_t n_queued;
	struct sched_req *rp_head, *rp_tail; /* requests the chain lost, admitted before q_head */
	int32_t n_replaying;
	uint64_t down_since;      /* replay on: when the chain was first seen not ready, 0 ready */
	char down_why[CTRL_CHAIN_ERRLEN];
	int32_t n_live;
	int32_t n_pf_wait;        /* live slots waiting for another's prompt (pf_wait) */
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
	struct sched_kvmsg *kv_head, *kv_tail;
	atomic_int kv_any;          /* a kv message was posted since the last drain */
	atomic_uint_fast64_t next_seq;
	atomic_int_fast64_t load;   /* worst-case blocks of waiting + live requests */
	atomic_int pending;         /* submitted, not yet admitted or ended */
	atomic_int flush_pfx;       /* ctrl_sched_flush_prefix() asked: the next poll forgets the cache */

	struct sched_prefix pfx;    /* [sched] prefix_cache (sched_prefix.c) */

	struct ctrl_sched_stats st; /* scheduler thread */
	pthread_mutex_t st_lock;
	struct ctrl_sched_stats pub;
};

/* sched_prefix.c: the prefix cache (see there). init: 0 or -ENOMEM
 * (nothing to do unless o.prefix_cache). take: at admission, slot @p i's
 * cached prompt blocks (its row and n_fed start past them); @return how
 * many. fed: its prefill advanced: name its newly whole prompt blocks.
 * release: at a slot's end, instead of giving its blocks back; unref: the
 * same for @p n blocks held elsewhere (a prefill node's held KV). flush:
 * forget every cached block.
 * sched_blk_alloc(): shm_blkpool_alloc(), idle cached blocks evicted first
 * when the pool runs dry. */
int sched_prefix_init(struct ctrl_sched *s);
void sched_prefix_fini(struct ctrl_sched *s);
int32_t sched_prefix_take(struct ctrl_sched *s, int32_t i);
void sched_prefix_fed(struct ctrl_sched *s, int32_t i);
void sched_prefix_release(struct ctrl_sched *s, int32_t i);
void sched_prefix_unref(struct ctrl_sched *s, const int32_t *blk, int32_t n);
void sched_prefix_flush(struct ctrl_sched *s);
int sched_blk_alloc(struct ctrl_sched *s, int32_t n, int32_t *out);
/* sched_prefix.c: the n choices of one request (ctrl_request.prefill_from).
 * admit: slot @p i was just admitted: share its lead's computed prompt
 * blocks now, or wait for them (pf_wait), or compute alone. done: slot
 * @p i's prompt is computed (@p share), or slot @p i is leaving (not
 * @p share): the slots waiting for it share its blocks, or compute alone. */
void sched_sibling_admit(struct ctrl_sched *s, int32_t i);
void sched_sibling_done(struct ctrl_sched *s, int32_t i, int share);

#endif /* CTRL_SCHED_INT_H */
