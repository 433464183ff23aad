/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-worker's side of the join protocol: a JOIN checks the chain
 * protocol and the model fingerprint, loads the assigned layer range and
 * reports what the KV pool can hold; a POOL sizes the pool to the block
 * count every stage holds. Either fills this stage's entry of the table
 * and forwards the message (see worker.c for the life of a worker).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kn_model.h"
#include "kn_stage.h"
#include "shm_mb.h"
#include "shm_region.h"
#include "worker_int.h"

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

/* A stage's weights coming in (kn_model_read_range()). */
struct load_progress {
	struct worker *w;
	int32_t idx;
	uint64_t t0, last_ns;      /* read started, last line (ns) */
	int tenth;                 /* tenths read at the last line */
};

/* A line at each new tenth of the read but at most one a second, and one
 * every 10 s while a tenth takes longer (a slow disk): a read done within
 * a second (a small model, a warm page cache) prints none. SIGTERM stops
 * the read (a large stage from a slow disk takes minutes). @return g_stop. */
static int load_progress(void *arg, uint64_t done, uint64_t total)
{
	struct load_progress *lp = arg;
	uint64_t now = kvf_mono_ns();
	int tenth = (int)(done * 10 / (total > 0 ? total : 1));
	double s = (double)(now - lp->t0) / 1e9;

	if (g_stop || done >= total || now - lp->last_ns < 1000000000ull
	    || (tenth == lp->tenth && now - lp->last_ns < 10000000000ull))
		return g_stop;
	lp->last_ns = now;
	lp->tenth = tenth;
	WK_INFO(lp->w, "reading stage %d's weights: %d%% (%.1f of %.1f MiB) in %.1f s, %.0f MiB/s", lp->idx,
		(int)(done * 100 / total), done / 1048576.0, total / 1048576.0, s, done / 1048576.0 / s);
	return 0;
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
	so.kv_own_stream = 1; /* the KV side ring's copies run beside the steps (worker_kv.c) */
	so.cuda_gemv = w->o.cuda_gemv;
	so.cuda_wide_x = w->o.cuda_wide_x;
	so.cuda_attn = w->o.cuda_attn;
	so.cuda_batch_invariant = w->o.cuda_batch_invariant;
	so.cuda_module = w->o.cuda_module;
	so.tp_size = w->tp.size;
	so.tp_rank = w->tp.rank;
	so.tp_reduce = w->tp.size > 1 ? wk_tp_reduce : NULL;
	so.tp_share = w->tp.size > 1 ? wk_tp_share : NULL;
	so.tp_arg = w;
	kn_model_range_tensors(w->m, a->layer_start, a->layer_end, &n_t, &t_bytes);
	WK_INFO(w, "loading stage %d: layers %d..%d of %d%s%s: %d tensors, %.1f MiB from %s (%s backend)",
	        idx, a->layer_start, a->layer_end, cfg->n_layers, a->layer_start == 0 ? " + embedding" : "",
	        a->layer_end == cfg->n_layers ? " + norm and LM head" : "", n_t, t_bytes / 1048576.0,
	        w->o.model, w->o.backend == KN_BACKEND_CUDA ? "cuda" : "cpu");
	t0 = kvf_mono_ns();
	w->st = kn_stage_create(w->m, w->o.backend, &so, err, errlen);
	if (w->st == NULL)
		return -errno;
	if (w->o.backend == KN_BACKEND_CPU) {
		/* The CPU engine computes over the mapping: creating it reads no
		 * weight (the load was timed as an mmap, "0 ms (110516 MiB/s)"),
		 * and the first steps paid the disk reads. Read them now, so the
		 * time below is that of the weights coming into memory. The CUDA
		 * engine's create uploads them, which reads them already. */
		struct load_progress lp = { .w = w, .idx = idx, .t0 = kvf_mono_ns() };
		int rc;

		lp.last_ns = lp.t0;
		rc = kn_model_read_range(w->m, a->layer_start, a->layer_end, load_progress, &lp, err, errlen);
		if (rc < 0) {
			kn_stage_destroy(w->st);
			w->st = NULL;
			return rc;
		}
	}
	kn_stage_info(w->st, &w->info);
	w->capacity = w->info.n_blocks;
	/* The load: from the create to the stage's last weight byte read
	 * through the mapping (cpu) or uploaded (cuda), and the range's tensor
	 * bytes over that time: the disk's rate from a cold page cache, about
	 * one core's memory bandwidth from a warm one. Measured on the 2-core
	 * dev VM: 91 MiB at 1.1-5.8 GiB/s warm (two workers loading at once
	 * the low end), 2.2 GiB in 0.54 s warm and 1.05 s cold; timing the
	 * create alone had given 190-300 GiB/s for the same 91 MiB. */
	{
		double ms = (double)(kvf_mono_ns() - t0) / 1e6;

		WK_INFO(w, "loaded stage %d in %.0f ms (%.0f MiB/s): resident weights %.1f MiB, KV pool %d blocks "
		        "(%.1f MiB), workspace %.1f MiB", idx, ms, ms > 0 ? t_bytes / 1048576.0 / (ms / 1e3) : 0.0,
		        w->info.weight_bytes / 1048576.0, w->info.n_blocks, w->info.kv_bytes / 1048576.0,
		        w->info.workspace_bytes / 1048576.0);
		if (w->info.tp_size > 1)
			WK_INFO(w, "tensor parallelism: rank %d of %d, its share of the heads and MLP columns; the ranks sum "
				"their partials by %s%s%s", (int)w->tp.rank, (int)w->info.tp_size,
				!strcmp(w->info.tp_transport, "nccl") ? "NCCL's all-reduce on the device"
				: !strcmp(w->info.tp_transport, "host") ? "the region, on the host, each step without CUDA "
									  "graphs (slow; not NCCL: "
				: "the region", w->info.tp_why,
				!strcmp(w->info.tp_transport, "host") ? ")" : "");
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
			wk_fmt(err, errlen, "area %s exists with %zu bytes, %zu needed (%d buffers of %zu): "
				    "recreate the region (restart the node's dataplane or ctrld) or use another --role",
				    name, have, need * (size_t)n, n, need);
			return -ENOSPC;
		}
	} else if (rc < 0) {
		/* the answer's field holds SHM_MB_ERRLEN bytes: short, the settings first */
		wk_fmt(err, errlen, "area %s of %zu B does not fit: %s: raise [dp] region_size (or [engine] "
		       "worker_region_size)", name, need * (size_t)n, strerror(-rc));
		return rc;
	}
	w->out_off = off;
	w->buf_bytes = need;
	w->n_bufs = n;
	w->max_groups = s->max_groups;
	return 0;
}

/*
 * A buffer for a setup answer when the output area cannot be had: two
 * setup-sized buffers in an area of their own ("serve.ROLE.refuse", a few
 * KiB), used in turn. @return NULL (the reason in @p err) if even that
 * does not fit.
 */
static struct shm_mb_hdr *refusal_buf(struct worker *w, const struct shm_mb_hdr *h, char *err, size_t errlen)
{
	size_t one = shm_mb_align(shm_mb_size(SHM_MB_JOIN, 0, 0, 0));
	char name[SHM_NAME_MAX + 16];
	uint64_t off;
	size_t have;
	int rc;

	if (h->total_len > one) {
		snprintf(err, errlen, "a setup message of %u bytes, more than the %zu of a setup answer", h->total_len,
			 one);
		return NULL;
	}
	snprintf(name, sizeof(name), "serve.%s.refuse", w->o.role);
	rc = shm_region_add_area(w->reg, name, 2 * one, 64, SHM_AREA_RAW, &off);
	if (rc == -EEXIST && shm_region_find_area(w->reg, name, &off, &have) == 0 && have >= 2 * one)
		rc = 0;
	if (rc < 0) {
		snprintf(err, errlen, "shm_region_add_area(%s, %zu bytes) failed: %s", name, 2 * one, strerror(-rc));
		return NULL;
	}
	w->setup_flip ^= 1;
	return shm_ptr(w->reg, off + (uint64_t)w->setup_flip * one);
}

static void report_fail(struct shm_mb_hdr *h, int rc, const char *fmt, const char *what)
{
	if (h->status == 0) {
		h->status = rc;
		snprintf(h->err, sizeof(h->err), fmt, what);
	}
}

/* JOIN and POOL: fill our entry of the stage table and forward. */
void wk_handle_setup(struct worker *w, struct shm_mb_hdr *h, size_t len)
{
	struct shm_mb_setup *s;
	struct shm_mb_stage *me;
	struct shm_mb_hdr *oh;
	int32_t idx = h->stage;
	char err[SHM_MB_ERRLEN] = "";
	int rc = 0;

	if (len < shm_mb_size(SHM_MB_JOIN, 0, 0, 0) || h->n_cols != 0 || h->n_ops != 0) {
		WK_ERR(w, "dropping a malformed setup message (%zu bytes)", len);
		return;
	}
	s = shm_mb_payload(h);
	if (idx < 0 || idx >= s->n_stages || s->n_stages > SHM_MB_MAX_STAGES || s->max_groups < 1
	    || s->max_cols < 1 || s->max_ops < 0) {
		WK_ERR(w, "dropping a setup message for stage %d of %d", idx, s->n_stages);
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
			wk_fmt(err, sizeof(err), "holds %s (fingerprint %016" PRIx64 "), not fingerprint %016" PRIx64,
			       w->o.model, w->fp, s->fingerprint);
			rc = -EPROTO;
		} else {
			uint64_t t0 = kvf_mono_ns();

			rc = load_stage(w, s, idx, err, sizeof(err));
			if (rc == 0)
				rc = ensure_out_area(w, s, err, sizeof(err));
			me->load_ns = kvf_mono_ns() - t0;
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
			WK_INFO(w, "joined as stage %d of %d (epoch %llu): layers %d..%d, can hold %d KV blocks",
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
			WK_INFO(w, "KV pool set to %d blocks (%.1f MiB), as every stage", w->info.n_blocks,
			        w->info.kv_bytes / 1048576.0);
	}
	if (w->tp.size > 1 && w->tp.rank == 0 && rc == 0)
		rc = wk_tp_answers(w, err, sizeof(err)); /* the followers' answers, before the stage's goes on */
	me->status = rc;
	snprintf(me->err, sizeof(me->err), "%s", err);
	if (w->tp.rank > 0) {
		if (rc < 0)
			WK_ERR(w, "refused %s: %s", h->kind == SHM_MB_JOIN ? "join" : "pool", err);
		if (rc == 0 && w->out_off == 0 && ensure_out_area(w, s, err, sizeof(err)) < 0)
			rc = -ENOSPC;
		wk_tp_answer(w, rc, err); /* a follower answers in the group's area */
		return;
	}
	if (rc < 0) {
		WK_ERR(w, "refused %s: %s", h->kind == SHM_MB_JOIN ? "join" : "pool", err);
		report_fail(h, rc, "%s", err);
	}
	if (w->out_off == 0) {
		/* Refused before having an area: the full-size one, so a later
		 * join of this role finds it big enough. */
		if (ensure_out_area(w, s, err, sizeof(err)) < 0) {
			/* Not even that fits (the region is too small): answer
			 * from a small area, so that ctrld names the reason
			 * instead of waiting for a join that cannot come. */
			if (rc == 0) {
				me->status = -ENOSPC;
				snprintf(me->err, sizeof(me->err), "%s", err);
				report_fail(h, -ENOSPC, "%s", err);
			}
			if ((oh = refusal_buf(w, h, err, sizeof(err))) == NULL) {
				WK_ERR(w, "cannot answer the setup message: %s", err);
				return;
			}
			memcpy(oh, h, h->total_len);
			oh->stage = idx + 1;
			wk_send_msg(w, oh);
			return;
		}
	}
	w->setup_flip ^= 1;
	oh = wk_out_buf(w, w->n_bufs - 2 + w->setup_flip);
	memcpy(oh, h, h->total_len);
	oh->stage = idx + 1;
	wk_send_msg(w, oh);
}
