/* SPDX-License-Identifier: Apache-2.0 */
/* Private to the worker chain: chain_proc.c (create, results, the vtable),
 * chain_proc_join.c (the JOIN / POOL protocol), chain_proc_live.c
 * (liveness, going down, re-forming), chain_proc_view.c (what ctrlctl
 * shows of it). */
#ifndef CTRL_CHAIN_PROC_INT_H
#define CTRL_CHAIN_PROC_INT_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "chain_int.h"
#include "ctrl_chain.h"
#include "ctrl_proc_chain.h"
#include "shm_mb.h"
#include "shm_pool.h"
#include "shm_region.h"
#include "shm_ring.h"
#include "kvf_clock.h"

#define PC_RING_COUNT 256u   /* as kvferry-worker's rings */
#define PC_LIVE_EVERY_NS 50000000ull
#define PC_REJOIN_NS 3000000000ull
#define PC_REJOIN_FIRST_NS 100000000ull  /* the first retry after a refusal */
#define PC_REJOIN_FORCE_NS 10000000000ull
#define PC_RESEND_NS 5000000000ull
#define PC_REGION_EVERY_NS 1000000000ull /* whether the region was re-created: a stat() or three */

enum pc_state {
	PC_UP = 0,
	PC_JOINING = 1, /* JOIN sent, waiting for it to come back */
	PC_POOLING = 2, /* POOL sent */
};

struct pc_grp {
	int busy, done;
	uint64_t seq, t_submit;
	int32_t n_sent;      /* columns in the message (tainted ones left out) */
	int32_t *sent;       /* [max_cols] original index of each sent column */
	struct chain_out out; /* out.step_ns: the slowest stage's busy time (the workers' busy_us) */
};

struct proc_chain {
	struct ctrl_chain base;
	struct ctrl_proc_chain_opts o;
	FILE *log;
	const struct kn_model *m;
	uint64_t fp;
	int32_t n_layers;
	struct shm_region *reg;
	int created;
	struct shm_region *lent;  /* the region ctrl_proc_chain_region() handed out (PD): never unmapped */
	uint64_t last_region_ns;  /* when the region was last checked for a re-creation */
	int dp_slot;              /* the node's kvferry-dataplane in the liveness table, -1: none seen */
	int32_t dp_pid;
	struct shm_ring *first, *ret, *ev;
	struct shm_pool *rx_small, *rx_large;
	uint64_t out_off;
	size_t buf_bytes;
	int32_t n_bufs, max_cols, max_ops, setup_flip;
	struct ctrl_chain_info info;
	int32_t ends[CTRL_CHAIN_MAX_STAGES];
	struct shm_mb_stage st[SHM_MB_MAX_STAGES];
	int stage_up[SHM_MB_MAX_STAGES];
	uint64_t live_epoch[SHM_MB_MAX_STAGES]; /* each stage's liveness registration when the chain came up
						 * (0: not on this node): a worker that started again under
						 * the same pid (execv) registers anew */
	enum pc_state state;
	uint16_t wire_version; /* micro-batches go out in the oldest version a stage speaks */
	uint64_t epoch, seq, setup_sent_ns, last_live_ns;
	uint64_t rejoin_wait_ns; /* after a refused re-forming: the wait before the next JOIN (backs off) */
	int setup_ok;        /* the synchronous setup finished */
	int32_t n_blocks;    /* fixed at the first setup */
	uint8_t *touched, *tainted;
	struct pc_grp *g;
	uint32_t *done;
	int32_t done_head, done_n;
	uint64_t t_first, t_last;
	struct ctrl_chain_stage_stats sst[CTRL_CHAIN_MAX_STAGES];
	char down_why[CTRL_CHAIN_ERRLEN];
	uint64_t down_ns;    /* when the chain last went down */
	/* KV pages (chain_proc_kv.c): mu guards the chain's state against a
	 * KV call on another thread; kv_mu keeps one KV message in flight */
	pthread_mutex_t mu, kv_mu;
	uint64_t kv_seq;     /* the KV message waited for, 0: none */
	int kv_done, kv_status;
	struct shm_mb_kv kv_ans;
	char kv_err[CTRL_CHAIN_ERRLEN];
	struct kn_kv_format fmt[CTRL_CHAIN_MAX_STAGES];
	uint64_t fmt_epoch[CTRL_CHAIN_MAX_STAGES]; /* the epoch fmt[k] was asked in */
	/* each stage's KV side rings (<in>.kv, <in>.kvr) and its input ring
	 * (woken after a side send), looked up once an epoch; q NULL: in band */
	struct pc_kv_side {
		struct shm_ring *q, *r, *in;
		struct shm_ring *kvl;   /* its landing reports, once it takes its own pages */
		uint64_t epoch;
		const struct shm_region *reg;
	} side[CTRL_CHAIN_MAX_STAGES];
	struct shm_ring *kv_side_r; /* the side ring the message in flight is answered on, NULL: in band */
};

/* Most words after one KV message's record (a page message carries at most
 * 256 blocks; a batch of them, with its copy records, more: the worker's
 * bound, WK_KV_MAX_BLOCKS) */
#define PC_KV_MAX_BLOCKS 8192

/* The chain's vtable: a ctrl_chain is a worker chain when it points here. */
extern const struct ctrl_chain_vtbl ctrl_proc_chain_vtbl;

static inline void pc_sleep_us(long us)
{
	struct timespec ts = { .tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000L };

	nanosleep(&ts, NULL);
}

/* Buffer @p i of ctrld's output area: [0, max_groups) groups, then two for
 * setup messages and one for KV messages. */
static inline struct shm_mb_hdr *pc_buf_at(struct proc_chain *c, int32_t i)
{
	return shm_ptr(c->reg, c->out_off + (uint64_t)i * c->buf_bytes);
}

/* chain_proc.c */

/* snprintf into a fixed error field, cut to it on purpose. */
__attribute__((format(printf, 3, 4))) void pc_fmt(char *b, size_t n, const char *f, ...);
/* One line of the chain's log at syslog priority @p pri (kvf_log.h's rule
 * when the log is stderr; a test's file gets the plain line). */
__attribute__((format(printf, 3, 4))) void pc_log(struct proc_chain *c, int pri, const char *fmt, ...);
/* Queue group @p gi's result for the next poll. */
void pc_push_done(struct proc_chain *c, uint32_t gi);
/* Drain the return hop. @return 1 if a setup message came back ok, <0 refused, 0 otherwise. */
int pc_drain(struct proc_chain *c, char *err, size_t errlen);

/* Open the rings, pools and output buffers of c->reg (the region attached).
 * @return 0, or -errno with @p err naming what is missing. */
int pc_open_shm(struct proc_chain *c, char *err, size_t errlen);
/* Close the handles pc_open_shm() opened (not the region). */
void pc_close_shm(struct proc_chain *c);

/* chain_proc_kv.c */

/* The return hop brought a KV message back. */
void pc_kv_reply(struct proc_chain *c, const struct shm_mb_hdr *h, size_t len);
/* The vtable's KV calls (ctrl_chain.h). */
int pc_kv_format(struct ctrl_chain *cc, int32_t stage, struct kn_kv_format *f);
int pc_kv_export(struct ctrl_chain *cc, int32_t stage, const int32_t *blocks, int32_t n, void *dst, size_t len);
int pc_kv_import(struct ctrl_chain *cc, int32_t stage, const int32_t *blocks, int32_t n, const void *src,
		 size_t len, const struct kn_kv_format *f);
/* Forget every stage's KV side rings (the region goes, or is re-attached). */
void pc_kv_side_close(struct proc_chain *c);
int pc_kv_copies(struct ctrl_chain *cc, int32_t stage, int import, const struct ctrl_kv_copy *v, int32_t n,
		 const struct kn_kv_format *f);
int pc_kv_rxroute(struct ctrl_chain *cc, int32_t stage, uint32_t stream);
int pc_kv_landed(struct ctrl_chain *cc, int32_t stage, struct ctrl_kv_landing *out, int max);
uint64_t pc_kv_generation(struct ctrl_chain *cc);

/* chain_proc_join.c */

/* Send a JOIN or POOL down the chain. @return 0, or -EBUSY when the first ring is full. */
int pc_send_setup(struct proc_chain *c, enum shm_mb_kind kind);
/* Log the stage table (each stage's role, node, pid, layers, backend, KV blocks, status). */
void pc_print_table(struct proc_chain *c, const char *what);
/* A setup message came back. @return 1 done (ok), 0 ignored, -errno refused (@p err says why). */
int pc_setup_reply(struct proc_chain *c, struct shm_mb_hdr *h, char *err, size_t errlen);
/* Run one setup round synchronously (create()). @return 0 or -errno with @p err. */
int pc_setup_sync(struct proc_chain *c, enum shm_mb_kind kind, char *err, size_t errlen);

/* chain_proc_live.c: each stage's liveness registration, noted as the chain comes up */
void pc_note_live(struct proc_chain *c);

/* chain_proc_live.c */

/* After the region is attached: look for this node's dataplane in its liveness table. */
void pc_region_seen(struct proc_chain *c);
/* Every PC_LIVE_EVERY_NS: a stage's heartbeat, this node's dataplane's, the
 * dataplane's peer events, the group timeout, and whether the region was
 * re-created (re-attached then); a death takes the chain down (fails the
 * groups in flight). */
void pc_check_live(struct proc_chain *c, uint64_t now);
/* Re-forming after a death: resend JOIN when it got lost, then POOL. */
void pc_rejoin_step(struct proc_chain *c, uint64_t now);
/* The vtable's ready(): 1 while the chain is up; 0 while it re-forms, with
 * what took it down in @p why. */
int pc_ready(struct ctrl_chain *cc, char *why, size_t whylen);

#endif /* CTRL_CHAIN_PROC_INT_H */
