/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private to kvferry-worker: the worker's state and what its files share.
 * worker.c (the main loop, signals, the region, the report),
 * worker_join.c (JOIN and POOL), worker_kv.c (KV page copies for
 * prefill/decode disaggregation), worker_step.c (the step path: take a
 * micro-batch, finish the oldest, forward it).
 *
 * Threading: one thread (the main loop) runs every function.
 */
#ifndef KN_WORKER_INT_H
#define KN_WORKER_INT_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <time.h>

#include "dp_ipc.h"
#include "kn_model.h"
#include "kn_stage.h"
#include "shm_mb.h"
#include "shm_region.h"
#include "shm_ring.h"
#include "worker_cfg.h"
#include "worker_hop.h"
#include "wk_tp_area.h"
#include "kvf_clock.h"
#include "kvf_log.h"

/* Most micro-batches a worker holds between submit and send. */
#define WK_MAX_DEPTH KN_STEP_DEPTH

/* A micro-batch between its submit and its send. */
struct wk_job {
	struct shm_desc d;         /* its input, released once the step has read it */
	struct shm_mb_hdr *oh;     /* its output buffer */
	struct kn_step st;
	int stepped;               /* a step was submitted for it */
	int32_t nc;
	int32_t n_decode;          /* sequences decoding in it (with a trace only) */
	uint64_t t0;
	char what[128];
};

/* The stage's own KV receive route (worker_kvrx.c), when ctrld asked for it. */
struct wk_kvrx {
	struct shm_ring *q, *kvl;   /* <in>.rx (the dataplane's deliveries), <in>.kvl (reports to ctrld) */
	struct shm_ring *ctl;       /* ctrld's control ring, to wake its poller */
	struct shm_pool *rxs, *rxl; /* the dataplane's receive pools */
	struct shm_mb_kvrooms *rooms;
	struct dp_rxroute *route;
	const struct dp_stats_shm *dpst; /* the dataplane's epoch: a list read in place is still its */
	struct dp_rx_mem mem;       /* where lists' segments lie (the region, the dataplane's packet memory) */
	struct kn_seg *segv;        /* a list's segments, read where they lie (segcap of them) */
	uint32_t segcap;
	uint32_t stream;
	uint64_t taken, refused, in_place;
	uint64_t stale;             /* messages a dead predecessor on the ring was handed, skipped */
};

/* Tensor parallelism inside the stage (worker_tp.c, wk_tp_area.h). */
struct wk_tp {
	int32_t size, rank;              /* 1, 0: none */
	char base[64];                   /* the stage's input ring: the group's names start with it */
	struct wk_tp_area *a;            /* the group's area (the leader makes it at its first join) */
	float *slots;                    /* its partial-sum slots */
	struct shm_ring *fq[WK_TP_MAX];  /* the leader: each follower's ring */
	struct shm_ring *kq[WK_TP_MAX];  /* the leader: each follower's KV job ring (<in>.tp.k<r>) */
	struct shm_ring *kin;            /* a follower: its KV job ring */
	int kv_failed;                   /* the leader: a job it could not hand on (its end fails) */
	uint64_t seq;                    /* reduces since the last join (every rank in step) */
	uint64_t fwd;                    /* the leader: messages handed on */
	uint64_t base_done[WK_TP_MAX];   /* the leader: a follower's done count less fwd */
	int32_t pid[WK_TP_MAX], live[WK_TP_MAX]; /* the leader: its followers, for the liveness check ... */
	uint64_t epoch[WK_TP_MAX];       /* ... and their registrations' epochs (a restart in place) */
	uint64_t next_check_ns;
	uint64_t joined_gen;             /* a follower: the join generation it last answered ... */
	uint64_t leader_epoch;           /* ... and the leader's liveness registration then (0: none yet) */
	int broken;                      /* a rank failed to keep up: the group starts again */
	char err[SHM_MB_ERRLEN];         /* why the group's area could not be had */
};

struct worker {
	struct wk_opts o;
	struct shm_region *reg;
	int live;
	struct kn_model *m;
	uint64_t fp;
	struct kn_stage *st;
	struct kn_stage_info info;
	int32_t capacity;          /* KV blocks the budget holds (info.n_blocks follows set_pool) */
	struct shm_mb_setup cur;   /* the setup the stage was built from */
	int32_t idx, n_stages;
	uint64_t epoch;
	int joined;
	/* output area: buffers [0, max_groups) for groups, two for setup messages */
	uint64_t out_off;
	size_t buf_bytes;
	int32_t n_bufs, max_groups, max_cols, max_ops, setup_flip;
	struct wk_in *in;
	struct wk_out *out;
	struct shm_ring *kvq, *kvr; /* the KV side rings (worker_kv.c), NULL: KV in band only */
	struct wk_kvrx rx;         /* KV pages straight from the dataplane (worker_kvrx.c) */
	uint64_t steps, cols, busy_ns, dropped;
	uint64_t host_ns;          /* CPU time spent preparing and finishing steps (not waiting,
	                              and on the cpu backend not computing) */
	uint64_t last_done_ns;     /* when the previous step finished: busy time excludes queueing */
	uint64_t idle_ns;          /* device idle between a step's end and the next message, gaps <= 1 ms
	                              (the round trip through ctrld) ... */
	uint64_t idle_long_ns;     /* ... and longer gaps (nothing to run) */
	FILE *trace;               /* [worker] trace: "taken done cols" per step, ns (CLOCK_MONOTONIC) */
	struct cfg *cfg;           /* the configuration w.o points into */
	struct wk_job jobs[WK_MAX_DEPTH];
	int32_t j_head, j_n, depth;
	uint64_t last_stat_ns;
	int pinned;                /* the region is cudaHostRegister'ed */
	struct wk_tp tp;           /* tensor parallelism (worker_tp.c) */
};

/* SIGTERM / SIGINT: the main loop stops; a send waiting on a full hop gives up. */
extern volatile sig_atomic_t g_stop;

/* One line of this worker's log, "kvferry-worker[ROLE]: ...", at a syslog
 * priority (kvf_log.h: <3>/<4>/<6> under journald, plain elsewhere).
 * WK_ERR: this worker cannot do what was asked (a refusal, a failed call, a
 * dropped message whose work is lost); WK_WARN: degraded but going on;
 * WK_INFO: progress. */
__attribute__((format(printf, 3, 4))) void wk_log(const struct worker *w, int pri, const char *fmt, ...);
#define WK_ERR(w, ...) wk_log((w), KVF_LOG_ERR, __VA_ARGS__)
#define WK_WARN(w, ...) wk_log((w), KVF_LOG_WARNING, __VA_ARGS__)
#define WK_INFO(w, ...) wk_log((w), KVF_LOG_INFO, __VA_ARGS__)

/* Buffer @p i of the output area: [0, max_groups) groups, then two for setup messages. */
static inline struct shm_mb_hdr *wk_out_buf(struct worker *w, int32_t i)
{
	return shm_ptr(w->reg, w->out_off + (uint64_t)i * w->buf_bytes);
}

/* worker.c */

/* snprintf into a fixed field, cut to it on purpose (worker.c says why). */
__attribute__((format(printf, 3, 4))) void wk_fmt(char *b, size_t n, const char *f, ...);

/* worker_join.c */

/* JOIN and POOL: fill our entry of the stage table and forward. Nothing may
 * be in flight (the pool may move): the caller drains first. */
void wk_handle_setup(struct worker *w, struct shm_mb_hdr *h, size_t len);

/* worker_kv.c */

/* A KV message (SHM_MB_KV): act on it if it targets this stage, forward it.
 * Nothing may be in flight: the caller drains first. */
void wk_handle_kv(struct worker *w, struct shm_mb_hdr *h, size_t len);
/* worker_kvrx.c: take stream @p stream's KV pages from the dataplane
 * (SHM_MB_KV_RXROUTE; @return 0 or -errno with @p err filled), the poll that
 * imports one of them (@return 1 if it took one), and the close. */
int wk_kvrx_route(struct worker *w, uint32_t stream, char *err, size_t errlen);
int wk_kvrx_poll(struct worker *w);
void wk_kvrx_close(struct worker *w);

/* Make the KV side rings of a ring input (<in>.kv / <in>.kvr); a worker
 * fed by the dataplane has none. @return 0, or -errno with @p err filled. */
int wk_kv_side_open(struct worker *w, char *err, size_t errlen);
/* Take a KV message waiting on the side ring (beside the steps in flight)
 * and answer it. @return 1 if one was taken, 0 if none waits. */
int wk_kv_side_poll(struct worker *w);
/* Do what the KV message @p k asks of this stage (this rank's share).
 * @return 0 or -errno with @p err filled. */
int wk_kv_act(struct worker *w, struct shm_mb_kv *k, char *err, size_t errlen);

/* worker_tp.c (every call a no-op with tp_size 1) */

/* The rank's set-up: the leader's rings to its followers. @return 0 or -errno with @p err. */
int wk_tp_init(struct worker *w, char *err, size_t errlen);
void wk_tp_close(struct worker *w);
/* The input ring spec this rank reads (a follower: its ring from the leader). */
const char *wk_tp_input(struct worker *w, char *buf, size_t n);
/* A join or pool message @p h, before it is handed on (the leader) or handled:
 * the group's area, the reduce counts from 0. @return 0 or -errno with @p err. */
int wk_tp_begin(struct worker *w, const struct shm_mb_hdr *h, char *err, size_t errlen);
/* The leader hands message @p d on to every follower. */
void wk_tp_forward(struct worker *w, const struct shm_desc *d);
/* A message handled: a follower counts it; the leader waits for every follower to have. */
void wk_tp_handled(struct worker *w);
/* A follower's answer to a join or pool message. */
void wk_tp_answer(struct worker *w, int rc, const char *err);
/* The leader: every follower's answer to the join or pool message handed on.
 * @return 0, or a follower's refusal / -ETIMEDOUT with @p err naming the rank. */
int wk_tp_answers(struct worker *w, char *err, size_t errlen);
/* A follower's share of a KV page copy done (@p rc, @p err): the leader
 * reads it once the follower's done count passed the message. */
void wk_tp_kv_note(struct worker *w, int rc, const char *err);
/* The leader, before it answers a KV page copy: every follower has copied
 * its share. @return 0, or a follower's error (@p err naming the rank) /
 * -EPIPE (the group broke). */
int wk_tp_kv_wait(struct worker *w, char *err, size_t errlen);
/* A KV job outside the input's order (the side ring's copies, the
 * dataplane's page messages): the leader hands it to its followers
 * (@p kind WK_TP_KV_MSG_JOB: the @p len bytes of KV message @p msg;
 * WK_TP_KV_PAGES_JOB: the page message of @p len bytes at region offset
 * @p off, which stays put until the end), does its own share, then waits
 * in wk_tp_kv_end() for theirs. @return the job (0: no followers, or the
 * group broke: the end then fails). */
uint64_t wk_tp_kv_begin(struct worker *w, uint32_t kind, const void *msg, uint32_t len, uint64_t off);
/* @return 0 once every follower did its share of @p job, else a follower's
 * error (named in @p err) or -EPIPE / -ETIMEDOUT (the group starts again). */
int wk_tp_kv_end(struct worker *w, uint64_t job, char *err, size_t errlen);
/* A follower: do the KV job its leader handed on, if one waits. @return 1 if one was done. */
int wk_tp_kv_poll(struct worker *w);
/* kn_stage_opts.tp_share (arg: the worker): rank 0's bytes to every rank, through the area. */
int wk_tp_share(void *arg, void *buf, size_t len);
/* kn_stage_opts.tp_reduce (arg: the worker). */
int wk_tp_reduce(void *arg, float *buf, int32_t n, int32_t ld, int32_t dim);
/* @return 1 when the group must start again (a rank gone, or one did not keep up). */
int wk_tp_gone(struct worker *w);

/* worker_step.c */

/* Send @p oh on the output hop (waits while the hop is full, until g_stop). */
void wk_send_msg(struct worker *w, struct shm_mb_hdr *oh);
/* A micro-batch: apply ops, submit its step, queue it. @return 1 if queued
 * (the job now owns @p d), 0 if dropped (the caller releases @p d). */
int wk_handle_batch(struct worker *w, struct shm_mb_hdr *h, size_t len, const struct shm_desc *d);
/* @return 1 if the oldest micro-batch can be sent without waiting. */
int wk_head_ready(struct worker *w);
/* Send the oldest micro-batch once its step (if any) is done. */
void wk_finish_head(struct worker *w);
/* Finish every micro-batch in flight. */
void wk_drain(struct worker *w);

#endif /* KN_WORKER_INT_H */
