/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-worker: one pipeline stage in its own process. It maps the node's
 * region, opens the model, and turns each micro-batch message (shm_mb.h)
 * from its input hop into one stage step whose output goes to its output
 * hop, forwarding the in-band ops with it so the next stage applies the same
 * ops in the same order.
 *
 * Life of a worker:
 *  1. attach the region (a region of another ABI version is refused, naming
 *     both), claim a liveness slot (role = --role), open the model;
 *  2. JOIN (from ctrld, through every stage before it): check the chain
 *     protocol and the model fingerprint, load the assigned layer range
 *     (progress in the log), report what the KV pool can hold;
 *  3. POOL: size the KV pool to the negotiated block count;
 *  4. micro-batches of the joined epoch: apply ops, step, forward.
 *
 * Invariants:
 *  - Ops are applied for every message of the joined epoch, even when an
 *    earlier stage failed its step: every stage validates ops identically, so
 *    block tables stay the same on every stage whatever failed.
 *  - Messages of another epoch are dropped unread: after a restart, or while
 *    the chain re-forms, what sat in the rings belongs to groups ctrld has
 *    already failed.
 *  - Output for group g goes to buffer g of this worker's output area; ctrld
 *    keeps one micro-batch per group in flight, so buffer g is free again
 *    when group g comes back (over the dataplane, once its send completed).
 *  - Up to `depth` micro-batches are in flight at once (the CUDA engine runs
 *    step k+1 queued behind step k, so the GPU never idles while the host
 *    forwards k); they are forwarded strictly in arrival order, ops-only
 *    messages included, so the next stage applies the ops in the order this
 *    one did. An input buffer is released only after its step read it.
 *    Setup messages wait until every micro-batch before them is out.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kn_model.h"
#include "kn_stage.h"
#include "kvf_config.h"
#include "shm_live.h"
#include "shm_mb.h"
#include "shm_region.h"
#include "worker_cfg.h"
#include "worker_hop.h"
#if KVF_HAVE_CUDA
#include "kn_cuda.h"
#endif

static_assert(sizeof(struct kn_column) == SHM_MB_COL_BYTES, "column record size");
static_assert(sizeof(struct kn_op) == SHM_MB_OP_BYTES, "op record size");

static volatile sig_atomic_t g_stop, g_report;


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
	ino_t region_ino;
	uint64_t last_stat_ns;
	int pinned;                /* the region is cudaHostRegister'ed */
};

static void on_signal(int sig)
{
	if (sig == SIGUSR1)
		g_report = 1;
	else
		g_stop = 1;
}


static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Messages are cut to their buffer on purpose (the wire's error field is
 * fixed): vsnprintf keeps that intent out of -Wformat-truncation. */
__attribute__((format(printf, 3, 4))) static void fmt(char *b, size_t n, const char *f, ...)
{
	va_list ap;

	va_start(ap, f);
	vsnprintf(b, n, f, ap);
	va_end(ap);
}

#define LOG(w, ...)                                                                        \
	do {                                                                               \
		fprintf(stderr, "kvferry-worker[%s]: ", (w)->o.role);                     \
		fprintf(stderr, __VA_ARGS__);                                              \
		fputc('\n', stderr);                                                       \
	} while (0)

static int same_shape(const struct shm_mb_setup *a, const struct shm_mb_setup *b, int32_t idx)
{
	return a->stage[idx].layer_start == b->stage[idx].layer_start
	       && a->stage[idx].layer_end == b->stage[idx].layer_end && a->n_slots == b->n_slots
	       && a->max_blocks_per_slot == b->max_blocks_per_slot && a->n_plans == b->n_plans
	       && memcmp(a->plan_widths, b->plan_widths, sizeof(a->plan_widths)) == 0
	       && memcmp(a->plan_widths_hi, b->plan_widths_hi, sizeof(a->plan_widths_hi)) == 0
	       && a->n_threads == b->n_threads && a->n_blocks == b->n_blocks
	       && a->kv_budget_bytes == b->kv_budget_bytes;
}

/* Build (or keep) the stage for assignment @p s. @return 0 or -errno with @p err. */
static int load_stage(struct worker *w, const struct shm_mb_setup *s, int32_t idx, char *err,
		      size_t errlen)
{
	const struct shm_mb_stage *a = &s->stage[idx];
	const struct kn_model_config *cfg = kn_model_config(w->m);
	struct kn_stage_opts so;
	int32_t n_t;
	uint64_t t_bytes;
	uint64_t t0;

	if (w->st != NULL && w->idx == idx && same_shape(&w->cur, s, idx))
		return 0; /* a re-join after another stage restarted: keep the weights */
	kn_stage_destroy(w->st);
	w->st = NULL;
	if (a->layer_start < 0 || a->layer_end > cfg->n_layers || a->layer_start >= a->layer_end) {
		snprintf(err, errlen, "layers %d..%d do not fit this worker's %d-layer model %s",
			 a->layer_start, a->layer_end, cfg->n_layers, w->o.model);
		return -EINVAL;
	}
	kn_stage_opts_init(&so);
	so.layer_start = a->layer_start;
	so.layer_end = a->layer_end;
	so.n_blocks = s->n_blocks > 0 ? s->n_blocks : -1;
	so.kv_budget_bytes = w->o.kv_bytes > 0 ? w->o.kv_bytes : (size_t)s->kv_budget_bytes;
	if (s->kv_mem_fraction > 0.0f)
		so.kv_mem_fraction = s->kv_mem_fraction;
	so.n_slots = s->n_slots;
	so.max_blocks_per_slot = s->max_blocks_per_slot;
	so.n_plans = s->n_plans;
	for (int32_t p = 0; p < s->n_plans && p < KN_MAX_PLANS && p < SHM_MB_MAX_PLANS; p++)
		so.plan_widths[p] = shm_mb_setup_plan(s, p);
	so.n_threads = w->o.threads > 0 ? w->o.threads : s->n_threads;
	so.device = w->o.device;
	so.cuda_gemv = w->o.cuda_gemv;
	so.cuda_wide_x = w->o.cuda_wide_x;
	so.cuda_attn = w->o.cuda_attn;
	kn_model_range_tensors(w->m, a->layer_start, a->layer_end, &n_t, &t_bytes);
	LOG(w, "loading stage %d: layers %d..%d of %d%s%s: %d tensors, %.1f MiB from %s (%s backend)",
	    idx, a->layer_start, a->layer_end, cfg->n_layers, a->layer_start == 0 ? " + embedding" : "",
	    a->layer_end == cfg->n_layers ? " + norm and LM head" : "", n_t, t_bytes / 1048576.0,
	    w->o.model, w->o.backend == KN_BACKEND_CUDA ? "cuda" : "cpu");
	t0 = mono_ns();
	w->st = kn_stage_create(w->m, w->o.backend, &so, err, errlen);
	if (w->st == NULL)
		return -errno;
	kn_stage_info(w->st, &w->info);
	w->capacity = w->info.n_blocks;
	{
		double ms = (double)(mono_ns() - t0) / 1e6;

		LOG(w, "loaded stage %d in %.0f ms (%.0f MiB/s): resident weights %.1f MiB, KV pool %d blocks "
		    "(%.1f MiB), workspace %.1f MiB", idx, ms, ms > 0 ? t_bytes / 1048576.0 / (ms / 1e3) : 0.0,
		    w->info.weight_bytes / 1048576.0, w->info.n_blocks, w->info.kv_bytes / 1048576.0,
		    w->info.workspace_bytes / 1048576.0);
	}
	w->cur = *s;
	w->idx = idx;
	return 0;
}

/* Make sure the output area holds max_groups + 2 buffers of the largest message. */
static int ensure_out_area(struct worker *w, const struct shm_mb_setup *s, char *err, size_t errlen)
{
	int32_t hidden = kn_model_config(w->m)->hidden_size;
	size_t need = shm_mb_size(SHM_MB_HIDDEN, s->max_cols, s->max_ops, hidden);
	size_t setup = shm_mb_size(SHM_MB_JOIN, 0, 0, 0);
	size_t res = shm_mb_result_size(s->max_cols, s->max_ops, SHM_MB_MAX_LOGPROBS);
	char name[SHM_NAME_MAX + 16];
	uint64_t off;
	size_t have;
	int32_t n = s->max_groups + 2;
	int rc;

	need = need > setup ? need : setup;
	need = shm_mb_align(need > res ? need : res);
	if (w->out_off != 0 && w->buf_bytes >= need && w->n_bufs >= n)
		return 0;
	snprintf(name, sizeof(name), "serve.%s.out", w->o.role);
	rc = shm_region_add_area(w->reg, name, need * (size_t)n, 64, SHM_AREA_RAW, &off);
	if (rc == -EEXIST) {
		/* A restarted worker (or a re-join) finds its predecessor's area. */
		if (shm_region_find_area(w->reg, name, &off, &have) < 0 || have < need * (size_t)n) {
			fmt(err, errlen, "area %s exists with %zu bytes, %zu needed (%d buffers of %zu): "
				 "recreate the region (restart the node's dataplane or ctrld) or use another --role",
				 name, have, need * (size_t)n, n, need);
			return -ENOSPC;
		}
	} else if (rc < 0) {
		snprintf(err, errlen, "shm_region_add_area(%s, %zu bytes) failed: %s: make the region larger",
			 name, need * (size_t)n, strerror(-rc));
		return rc;
	}
	w->out_off = off;
	w->buf_bytes = need;
	w->n_bufs = n;
	w->max_groups = s->max_groups;
	return 0;
}

static struct shm_mb_hdr *out_buf(struct worker *w, int32_t i)
{
	return shm_ptr(w->reg, w->out_off + (uint64_t)i * w->buf_bytes);
}

static void send_msg(struct worker *w, struct shm_mb_hdr *oh)
{
	if (wk_out_send(w->out, shm_off(w->reg, oh), oh->total_len, oh->kind, oh->seq, &g_stop) < 0)
		LOG(w, "stopping with message %llu of group %u unsent", (unsigned long long)oh->seq, oh->group);
}

static void report_fail(struct shm_mb_hdr *h, int rc, const char *fmt, const char *what)
{
	if (h->status == 0) {
		h->status = rc;
		snprintf(h->err, sizeof(h->err), fmt, what);
	}
}

/* JOIN and POOL: fill our entry of the stage table and forward. */
static void handle_setup(struct worker *w, struct shm_mb_hdr *h, size_t len)
{
	struct shm_mb_setup *s;
	struct shm_mb_stage *me;
	struct shm_mb_hdr *oh;
	int32_t idx = h->stage;
	char err[SHM_MB_ERRLEN] = "";
	int rc = 0;

	if (len < shm_mb_size(SHM_MB_JOIN, 0, 0, 0) || h->n_cols != 0 || h->n_ops != 0) {
		LOG(w, "dropping a malformed setup message (%zu bytes)", len);
		return;
	}
	s = shm_mb_payload(h);
	if (idx < 0 || idx >= s->n_stages || s->n_stages > SHM_MB_MAX_STAGES || s->max_groups < 1
	    || s->max_cols < 1 || s->max_ops < 0) {
		LOG(w, "dropping a setup message for stage %d of %d", idx, s->n_stages);
		return;
	}
	me = &s->stage[idx];
	if (h->kind == SHM_MB_JOIN) {
		me->proto = SHM_MB_PROTO;
		me->mb_version = SHM_MB_VERSION;
		me->pid = (int32_t)getpid();
		me->node = w->o.node;
		me->live_slot = w->live;
		me->fingerprint = w->fp;
		snprintf(me->role, sizeof(me->role), "%s", w->o.role);
		snprintf(me->backend, sizeof(me->backend), "%s",
			 w->o.backend == KN_BACKEND_CUDA ? "cuda" : "cpu");
		if (s->proto != SHM_MB_PROTO) {
			snprintf(err, sizeof(err), "ctrld speaks chain protocol %u, worker %s speaks %u: run the "
				 "same kvferry version on every node", s->proto, w->o.role, SHM_MB_PROTO);
			rc = -EPROTO;
		} else if (s->fingerprint != w->fp) {
			fmt(err, sizeof(err), "holds %s (fingerprint %016" PRIx64 "), not fingerprint %016" PRIx64,
			    w->o.model, w->fp, s->fingerprint);
			rc = -EPROTO;
		} else {
			uint64_t t0 = mono_ns();

			rc = load_stage(w, s, idx, err, sizeof(err));
			if (rc == 0)
				rc = ensure_out_area(w, s, err, sizeof(err));
			me->load_ns = mono_ns() - t0;
		}
		if (rc == 0) {
			me->n_blocks = w->capacity;
			me->hidden = w->info.hidden_size;
			me->weight_bytes = w->info.weight_bytes;
			me->kv_bytes = w->info.kv_bytes;
			w->idx = idx;
			w->n_stages = s->n_stages;
			w->max_cols = s->max_cols;
			w->max_ops = s->max_ops;
			w->epoch = h->epoch;
			w->joined = 1;
			LOG(w, "joined as stage %d of %d (epoch %llu): layers %d..%d, can hold %d KV blocks",
			    idx, s->n_stages, (unsigned long long)h->epoch, me->layer_start, me->layer_end,
			    me->n_blocks);
		}
	} else if (!w->joined || h->epoch != w->epoch || w->st == NULL) {
		snprintf(err, sizeof(err), "worker %s got a pool message of epoch %llu before joining it",
			 w->o.role, (unsigned long long)h->epoch);
		rc = -EPROTO;
	} else {
		rc = kn_stage_set_pool(w->st, s->n_blocks);
		if (rc < 0)
			snprintf(err, sizeof(err), "kn_stage_set_pool(%d blocks) on %s failed: %s", s->n_blocks,
				 w->o.role, strerror(-rc));
		kn_stage_info(w->st, &w->info);
		me->n_blocks = w->info.n_blocks;
		me->kv_bytes = w->info.kv_bytes;
		if (rc == 0)
			LOG(w, "KV pool set to %d blocks (%.1f MiB), as every stage", w->info.n_blocks,
			    w->info.kv_bytes / 1048576.0);
	}
	me->status = rc;
	snprintf(me->err, sizeof(me->err), "%s", err);
	if (rc < 0) {
		LOG(w, "refused %s: %s", h->kind == SHM_MB_JOIN ? "join" : "pool", err);
		report_fail(h, rc, "%s", err);
	}
	if (w->out_off == 0) {
		/* Refused before having an area: the full-size one, so a later
		 * join of this role finds it big enough. */
		if (ensure_out_area(w, s, err, sizeof(err)) < 0) {
			LOG(w, "cannot answer the setup message: %s", err);
			return;
		}
	}
	w->setup_flip ^= 1;
	oh = out_buf(w, w->n_bufs - 2 + w->setup_flip);
	memcpy(oh, h, h->total_len);
	oh->stage = idx + 1;
	send_msg(w, oh);
}

/* Send the oldest micro-batch once its step (if any) is done: the wait
 * blocks only when the caller found the FIFO full. */
/* Sequences decoding in a micro-batch (for the trace): a slot's columns are
 * adjacent; a decode (and a verify span) wants a token at every column, a
 * prompt chunk at its last one at most. */
static int32_t decode_runs(const void *colsv, int32_t nc)
{
	const struct kn_column *cols = colsv;
	int32_t n = 0;

	for (int32_t i = 0; i < nc;) {
		int32_t k = i, all = 1;

		for (; k < nc && cols[k].slot == cols[i].slot; k++)
			all &= (cols[k].flags & KN_COL_NEED_LOGIT) != 0;
		n += all;
		i = k;
	}
	return n;
}

static void finish_head(struct worker *w)
{
	struct wk_job *j = &w->jobs[w->j_head];
	struct shm_mb_hdr *oh = j->oh;
	int last = w->idx == w->n_stages - 1, rc;
	int32_t nc = j->nc;
	uint64_t t1, t2;

	if (j->stepped) {
		rc = kn_stage_step_wait(w->st);
		if (rc < 0 && oh->status == 0) {
			oh->status = rc;
			snprintf(oh->err, sizeof(oh->err), "%s: kn_stage_step: %s", j->what, kn_stage_error(w->st));
		}
	}
	t1 = mono_ns();
	if (oh->status != 0) {
		oh->hidden = 0; /* no rows: later stages skip the step */
		oh->n_logprobs = 0;
		if (last) {
			int32_t *toks = shm_mb_payload(oh);

			for (int32_t i = 0; i < nc; i++) {
				toks[i] = -1;
				((float *)(toks + nc))[i] = 0.0f;
			}
		}
	}
	oh->total_len = (uint32_t)(last ? shm_mb_result_size(nc, oh->n_ops, oh->n_logprobs)
					: shm_mb_size((enum shm_mb_kind)oh->kind, nc, oh->n_ops, oh->hidden));
	{
		/* busy: from when the device could start this step (its submit, or
		 * the previous step's end if it queued behind one) to its end */
		uint64_t from = j->t0 > w->last_done_ns ? j->t0 : w->last_done_ns, dt = t1 - from;

		if (w->idx < SHM_MB_MAX_STAGES)
			oh->busy_us[w->idx] += (uint32_t)(dt / 1000);
		w->steps++;
		w->cols += (uint64_t)nc;
		w->busy_ns += dt;
		w->last_done_ns = t1;
		if (w->trace != NULL)
			fprintf(w->trace, "%llu %llu %d %d\n", (unsigned long long)j->t0, (unsigned long long)t1, (int)nc,
				(int)j->n_decode);
	}
	wk_in_done(w->in, &j->d);
	send_msg(w, oh);
	w->j_head = (w->j_head + 1) % WK_MAX_DEPTH;
	w->j_n--;
	t2 = mono_ns();
	w->host_ns += t2 - t1;
}

static void drain(struct worker *w)
{
	while (w->j_n > 0)
		finish_head(w);
}

/* @return 1 if the oldest micro-batch can be sent without waiting. */
static int head_ready(struct worker *w)
{
	const struct wk_job *j = &w->jobs[w->j_head];

	return w->j_n > 0 && (!j->stepped || kn_stage_step_ready(w->st));
}

/* A micro-batch: apply ops, submit its step, queue it for forwarding (see
 * the file comment). @return 1 if queued (the job now owns @p d), 0 if
 * dropped (the caller releases @p d). */
static int handle_batch(struct worker *w, struct shm_mb_hdr *h, size_t len, const struct shm_desc *d)
{
	int last = w->idx == w->n_stages - 1;
	int32_t hidden = w->info.hidden_size, nc = h->n_cols, no = h->n_ops;
	struct shm_mb_hdr *oh;
	struct wk_job *j;
	enum shm_mb_kind okind = last ? SHM_MB_RESULT : SHM_MB_HIDDEN;
	uint64_t t0 = mono_ns();
	int rc;

	if (!w->joined || h->epoch != w->epoch) {
		w->dropped++;
		return 0; /* a group ctrld already failed (see invariants) */
	}
	if (shm_mb_check(h, len, w->max_cols, w->max_ops) < 0 || h->group >= (uint32_t)w->max_groups
	    || h->stage != w->idx || nc < 1) {
		LOG(w, "dropping a malformed micro-batch (group %u, stage %d, %d columns, %d ops, %zu bytes): "
		    "ctrld fails the group at its deadline", h->group, h->stage, nc, no, len);
		return 0;
	}
	if (w->j_n == 0 && w->last_done_ns > 0 && t0 > w->last_done_ns) {
		uint64_t gap = t0 - w->last_done_ns;

		*(gap <= 1000000u ? &w->idle_ns : &w->idle_long_ns) += gap;
	}
	j = &w->jobs[(w->j_head + w->j_n) % WK_MAX_DEPTH];
	memset(j, 0, sizeof(*j));
	j->d = *d;
	j->nc = nc;
	j->t0 = t0;
	oh = out_buf(w, (int32_t)h->group);
	j->oh = oh;
	wk_out_quiesce(w->out, shm_off(w->reg, oh), &g_stop);
	memcpy(oh, h, sizeof(*oh));
	oh->kind = (uint16_t)okind;
	oh->stage = w->idx + 1;
	oh->hidden = last ? 0 : hidden;
	oh->n_logprobs = 0;
	/* Top logprobs: as many as the most demanding column asks for, only in
	 * a version that has room for them (a reply keeps the sender's version). */
	for (int32_t i = 0; last && h->version >= 2 && i < nc; i++) {
		const struct kn_column *col = (const struct kn_column *)shm_mb_cols(h) + i;

		if ((col->flags & KN_COL_NEED_LOGIT) && KN_COL_TOPK(col->flags) > oh->n_logprobs)
			oh->n_logprobs = KN_COL_TOPK(col->flags);
	}
	if (oh->n_logprobs > SHM_MB_MAX_LOGPROBS)
		oh->n_logprobs = SHM_MB_MAX_LOGPROBS;
	memcpy(shm_mb_cols(oh), shm_mb_cols(h), (size_t)nc * SHM_MB_COL_BYTES);
	if (w->trace != NULL)
		j->n_decode = decode_runs(shm_mb_cols(h), nc);
	memcpy(shm_mb_ops(oh), shm_mb_ops(h), (size_t)no * SHM_MB_OP_BYTES);
	snprintf(j->what, sizeof(j->what), "stage %d (%s, layers %d..%d, pid %d)", w->idx, w->o.role,
		 w->info.layer_start, w->info.layer_end, (int)getpid());
	rc = kn_stage_apply_ops(w->st, shm_mb_ops(h), (size_t)no);
	if (rc < 0 && oh->status == 0) {
		oh->status = rc;
		snprintf(oh->err, sizeof(oh->err), "%s: kn_stage_apply_ops: %s", j->what, kn_stage_error(w->st));
	}
	if (oh->status == 0 && !(h->flags & SHM_MB_F_OPS_ONLY)) {
		int32_t *toks = shm_mb_payload(oh);

		/* the output's columns are the input's: the step reads them from
		 * the output buffer, which stays put until the send */
		j->st = (struct kn_step){
			.n_cols = nc,
			.cols = shm_mb_cols(oh),
			.hidden_in = w->info.first ? NULL : shm_mb_payload(h),
			.hidden_out = last ? NULL : shm_mb_payload(oh),
			.tokens_out = last ? toks : NULL,
			.token_logprob_out = last ? (float *)(toks + nc) : NULL,
			.n_logprobs = oh->n_logprobs,
			.top_ids_out = oh->n_logprobs > 0 ? shm_mb_top_ids(oh) : NULL,
			.top_logprobs_out = oh->n_logprobs > 0 ? shm_mb_top_logprobs(oh) : NULL,
		};

		if ((!w->info.first && (h->kind != SHM_MB_HIDDEN || h->hidden != hidden))
		    || (w->info.first && h->kind != SHM_MB_TOKENS)) {
			oh->status = -EPROTO;
			fmt(oh->err, sizeof(oh->err), "%s: got a %s message of %d floats per row, expected %s",
			    j->what, h->kind == SHM_MB_HIDDEN ? "hidden" : "token", h->hidden,
			    w->info.first ? "token ids" : "hidden rows");
		} else {
			uint64_t ts = mono_ns();

			rc = kn_stage_step_submit(w->st, &j->st);
			/* a synchronous engine (cpu) computes inside submit: not host overhead */
			if (w->o.backend != KN_BACKEND_CUDA)
				t0 += mono_ns() - ts;
			if (rc < 0) {
				oh->status = rc;
				snprintf(oh->err, sizeof(oh->err), "%s: kn_stage_step: %s", j->what,
					 kn_stage_error(w->st));
			} else {
				j->stepped = 1;
			}
		}
	}
	w->j_n++;
	w->host_ns += mono_ns() - t0;
	return 1;
}

/* @return 1 if a queued micro-batch now owns @p d, else 0 (release it). */
static int handle(struct worker *w, const struct shm_desc *d)
{
	struct shm_mb_hdr *h;

	if (d->off + d->len > shm_region_size(w->reg) || d->len < sizeof(struct shm_mb_hdr)) {
		LOG(w, "dropping a descriptor outside the region (offset %llu, %u bytes)",
		    (unsigned long long)d->off, d->len);
		return 0;
	}
	h = shm_ptr(w->reg, d->off);
	if (h->magic != SHM_MB_MAGIC || !shm_mb_version_ok(h->version)) {
		/* magic, version, status and err sit at frozen offsets: say so in
		 * the message itself when it can still travel on. */
		LOG(w, "refusing a micro-batch message of version %u (magic %08x): this worker speaks "
		    "versions %u..%u: run the same kvferry version on every node", h->version, h->magic,
		    SHM_MB_VERSION_MIN, SHM_MB_VERSION);
		return 0;
	}
	if (h->total_len > d->len) {
		LOG(w, "dropping a truncated message (%u of %u bytes)", d->len, h->total_len);
		return 0;
	}
	switch (h->kind) {
	case SHM_MB_JOIN:
	case SHM_MB_POOL:
		drain(w); /* the pool may move: nothing may be in flight */
		handle_setup(w, h, d->len);
		return 0;
	case SHM_MB_TOKENS:
	case SHM_MB_HIDDEN:
		return handle_batch(w, h, d->len, d);
	default:
		LOG(w, "dropping a message of kind %u", h->kind);
		return 0;
	}
}

/* The region file now on disk is not the one we mapped: its owner
 * re-created it, and nothing will ever arrive on our old mapping. */
static int region_replaced(struct worker *w)
{
	struct stat now;
	uint64_t t = mono_ns();

	if (t - w->last_stat_ns < 1000000000ull)
		return 0;
	w->last_stat_ns = t;
	if (stat(shm_region_path(w->reg), &now) != 0)
		return 0; /* unlinked while its owner shuts down: SIGTERM follows */
	return now.st_ino != w->region_ino;
}

/* What the worker holds now (SIGUSR1, and at exit): memory and queues, so a
 * test or an operator can tell a leak from a working set. */
static void report(struct worker *w, const char *when)
{
	char hops[160], line[256];
	long rss_kb = -1;
	FILE *f = fopen("/proc/self/status", "r");

	if (f != NULL) {
		while (fgets(line, sizeof(line), f) != NULL)
			if (sscanf(line, "VmRSS: %ld", &rss_kb) == 1)
				break;
		fclose(f);
	}
	wk_hop_report(w->in, w->out, hops, sizeof(hops));
	if (w->trace != NULL)
		fflush(w->trace);
	LOG(w, "report (%s): steps=%llu cols=%llu host_ns=%llu busy_ns=%llu idle_ns=%llu idle_long_ns=%llu "
	    "vmrss_kb=%ld host_us_per_step=%.1f busy_us_per_step=%.1f %s", when, (unsigned long long)w->steps,
	    (unsigned long long)w->cols, (unsigned long long)w->host_ns, (unsigned long long)w->busy_ns,
	    (unsigned long long)w->idle_ns, (unsigned long long)w->idle_long_ns, rss_kb,
	    w->steps ? (double)w->host_ns / 1e3 / (double)w->steps : 0.0,
	    w->steps ? (double)w->busy_ns / 1e3 / (double)w->steps : 0.0, hops);
}

/* --backend cuda: pin the whole region (cudaHostRegister) so hidden rows
 * move by copy-engine DMA straight from the hugepages the rings point into,
 * instead of through the engine's pinned bounce buffer (one extra host copy
 * of every row each step; kernels/cuda/NOTES.md). Registering costs once at
 * start, proportional to the region (page-table walk). @return 0 or -errno. */
static int pin_region(struct worker *w)
{
#if KVF_HAVE_CUDA
	char err[256];
	uint64_t t0 = mono_ns();
	int rc = kn_cuda_host_register(shm_region_base(w->reg), shm_region_size(w->reg), err, sizeof(err));

	if (rc < 0) {
		LOG(w, "kn_cuda_host_register(region %s, %zu bytes) failed: %s: check the CUDA driver "
		    "(nvidia-smi) and that the region fits the pinned-memory limit (ulimit -l)", w->o.region,
		    shm_region_size(w->reg), err);
		return rc;
	}
	w->pinned = 1;
	LOG(w, "pinned region %s for CUDA DMA: %.1f MiB (%s) in %.1f ms", w->o.region,
	    shm_region_size(w->reg) / 1048576.0, shm_region_is_huge(w->reg) ? "hugepages" : "4 KiB pages",
	    (double)(mono_ns() - t0) / 1e6);
	return 0;
#else
	/* kn_stage_create() refuses the cuda backend on this build with the
	 * rebuild hint; nothing to pin. */
	LOG(w, "region %s not pinned: this build has no CUDA engine (KVF_HAVE_CUDA=0)", w->o.region);
	return 0;
#endif
}

static void unpin_region(struct worker *w)
{
#if KVF_HAVE_CUDA
	if (w->pinned)
		kn_cuda_host_unregister(shm_region_base(w->reg));
#endif
	w->pinned = 0;
}

int main(int argc, char **argv)
{
	struct worker w;
	struct sigaction sa;
	char err[512];
	const struct kn_model_config *cfg;
	uint64_t t0;
	int rc = 1, reexec = 0;

	memset(&w, 0, sizeof(w));
	w.idx = -1;
	rc = wk_load_opts(argc, argv, WK_MAX_DEPTH, &w.o, &w.cfg, err, sizeof(err));
	if (rc != 0) {
		cfg_free(w.cfg);
		if (rc > 0)
			return 0;
		fprintf(stderr, "kvferry-worker: %s\n", err);
		return 2;
	}
	rc = 1;
	w.depth = w.o.depth;
	if (w.o.trace[0]) {
		/* a diagnostic: each step's times, for lining the device up with a
		 * load generator's clock (scripts/gpu-serve-check TRACE=1) */
		w.trace = fopen(w.o.trace, "w");
		if (w.trace == NULL)
			fprintf(stderr, "kvferry-worker: trace %s: %s (no trace)\n", w.o.trace, strerror(errno));
	}
	/* 1 us timer slack: the futex sleep's wake-up is otherwise late by up to 50 us */
	prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGUSR1, &sa, NULL);
	/* Whoever creates the region (the dataplane, or ctrld on a node without
	 * one) may start after us: wait for it rather than fail. */
	t0 = mono_ns();
	while ((w.reg = shm_region_attach(w.o.region, err, sizeof(err))) == NULL && errno == ENOENT
	       && !g_stop && mono_ns() - t0 < (uint64_t)w.o.wait_s * 1000000000ull) {
		struct timespec ts = { 0, 100000000 };

		nanosleep(&ts, NULL);
	}
	if (w.reg == NULL) {
		fprintf(stderr, "kvferry-worker[%s]: shm_region_attach(%s) failed: %s\n", w.o.role, w.o.region, err);
		if (w.trace != NULL)
			fclose(w.trace);
		cfg_free(w.cfg);
		return 1;
	}
	{
		struct stat sb;

		if (stat(shm_region_path(w.reg), &sb) == 0)
			w.region_ino = sb.st_ino;
	}
	w.live = shm_live_register(w.reg, w.o.role);
	if (w.live < 0) {
		LOG(&w, "shm_live_register(%s, %s) failed: %s: too many processes on this region",
		    w.o.region, w.o.role, strerror(-w.live));
		goto out_region;
	}
	if (w.o.backend == KN_BACKEND_CUDA && pin_region(&w) < 0)
		goto out_live;
	t0 = mono_ns();
	w.m = kn_model_open(w.o.model, err, sizeof(err));
	if (w.m == NULL) {
		LOG(&w, "kn_model_open(%s) failed: %s", w.o.model, err);
		goto out_live;
	}
	cfg = kn_model_config(w.m);
	w.fp = kn_model_fingerprint(w.m);
	LOG(&w, "model %s: %s, %d layers, hidden %d, vocab %d, fingerprint %016" PRIx64 ", opened in %.0f ms",
	    w.o.model, kn_arch_name(cfg->arch), cfg->n_layers, cfg->hidden_size, cfg->vocab_size, w.fp,
	    (double)(mono_ns() - t0) / 1e6);
	w.in = wk_in_open(w.reg, w.o.in, err, sizeof(err));
	if (w.in == NULL) {
		LOG(&w, "input hop %s: %s", w.o.in, err);
		goto out_model;
	}
	w.out = wk_out_open(w.reg, w.o.out, err, sizeof(err));
	if (w.out == NULL) {
		LOG(&w, "output hop %s: %s", w.o.out, err);
		goto out_in;
	}
	LOG(&w, "ready: region %s (%s), in %s, out %s, pid %d, waiting for ctrld's join", w.o.region,
	    shm_region_is_huge(w.reg) ? "hugepages" : "not hugepages", w.o.in, w.o.out, (int)getpid());
	while (!g_stop) {
		struct shm_desc d;
		int got;

		shm_live_beat(w.reg, w.live);
		wk_out_poll(w.out);
		if (g_report) {
			g_report = 0;
			report(&w, "SIGUSR1");
		}
		/* 1. forward every finished micro-batch, oldest first */
		while (head_ready(&w))
			finish_head(&w);
		/* 2. take the next one while there is room: sleep in the ring's futex
		 * only when nothing is in flight (no spinning on a small machine; the
		 * 200 ms bound keeps the heartbeat fresh and SIGTERM prompt), else
		 * poll, so a message that arrives while the device runs is queued
		 * behind the running step at once */
		if (w.j_n < w.depth) {
			int spin = w.j_n > 0 || mono_ns() - w.last_done_ns < (uint64_t)w.o.spin_us * 1000u;

			got = wk_in_get(w.in, &d, spin ? 0 : 200 * 1000000ll);
			if (got > 0) {
				if (!handle(&w, &d))
					wk_in_done(w.in, &d);
				continue;
			}
			if (w.j_n == 0) {
				if (spin)
					continue;
				if (region_replaced(&w)) {
					LOG(&w, "region %s was re-created (its owner restarted): restarting to "
					    "attach the new one", w.o.region);
					reexec = 1;
					break;
				}
				continue;
			}
		}
		/* 3. full: wait for the oldest */
		if (w.j_n >= w.depth)
			finish_head(&w);
	}
	drain(&w);
	report(&w, "stopping");
	LOG(&w, "stopping: %llu steps, %llu columns, %.1f ms busy, %.1f us host CPU per step, %llu stale "
	    "messages dropped", (unsigned long long)w.steps, (unsigned long long)w.cols, (double)w.busy_ns / 1e6,
	    w.steps ? (double)w.host_ns / 1e3 / (double)w.steps : 0.0, (unsigned long long)w.dropped);
	rc = 0;
	wk_out_close(w.out);
out_in:
	wk_in_close(w.in);
out_model:
	kn_stage_destroy(w.st);
	kn_model_close(w.m);
	unpin_region(&w);
out_live:
	shm_live_release(w.reg, w.live);
out_region:
	shm_region_detach(w.reg);
	if (w.trace != NULL)
		fclose(w.trace);
	if (reexec) {
		execv("/proc/self/exe", argv);
		fprintf(stderr, "kvferry-worker[%s]: execv(/proc/self/exe) failed: %s\n", w.o.role, strerror(errno));
		rc = 1;
	}
	cfg_free(w.cfg);
	return rc;
}
