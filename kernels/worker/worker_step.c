/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-worker's step path: take a micro-batch (apply its ops, submit its
 * step), then finish the oldest one (wait for its step, fill in the result
 * or the hidden rows, forward it), up to `depth` in flight and strictly in
 * arrival order (the invariants are in worker.c's file comment).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kn_stage.h"
#include "shm_mb.h"
#include "shm_region.h"
#include "worker_hop.h"
#include "worker_int.h"

void wk_send_msg(struct worker *w, struct shm_mb_hdr *oh)
{
	if (w->tp.rank > 0)
		return; /* a follower of its stage's leader sends nothing (worker_tp.c) */
	if (wk_out_send(w->out, shm_off(w->reg, oh), oh->total_len, oh->kind, oh->seq, &g_stop) < 0)
		WK_WARN(w, "stopping with message %llu of group %u unsent", (unsigned long long)oh->seq, oh->group);
}

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

/* Send the oldest micro-batch once its step (if any) is done: the wait
 * blocks only when the caller found the FIFO full. */
void wk_finish_head(struct worker *w)
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
	t1 = kvf_mono_ns();
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
	wk_send_msg(w, oh);
	w->j_head = (w->j_head + 1) % WK_MAX_DEPTH;
	w->j_n--;
	t2 = kvf_mono_ns();
	w->host_ns += t2 - t1;
}

void wk_drain(struct worker *w)
{
	while (w->j_n > 0)
		wk_finish_head(w);
}

/* @return 1 if the oldest micro-batch can be sent without waiting. */
int wk_head_ready(struct worker *w)
{
	const struct wk_job *j = &w->jobs[w->j_head];

	return w->j_n > 0 && (!j->stepped || kn_stage_step_ready(w->st));
}

/* A micro-batch: apply ops, submit its step, queue it for forwarding (see
 * worker.c's file comment). @return 1 if queued (the job now owns @p d), 0 if
 * dropped (the caller releases @p d). */
int wk_handle_batch(struct worker *w, struct shm_mb_hdr *h, size_t len, const struct shm_desc *d)
{
	int last = w->idx == w->n_stages - 1;
	int32_t hidden = w->info.hidden_size, nc = h->n_cols, no = h->n_ops;
	struct shm_mb_hdr *oh;
	struct wk_job *j;
	enum shm_mb_kind okind = last ? SHM_MB_RESULT : SHM_MB_HIDDEN;
	uint64_t t0 = kvf_mono_ns();
	int rc;

	if (!w->joined || h->epoch != w->epoch) {
		w->dropped++;
		return 0; /* a group ctrld already failed (see invariants) */
	}
	if (shm_mb_check(h, len, w->max_cols, w->max_ops) < 0 || h->group >= (uint32_t)w->max_groups
	    || h->stage != w->idx || nc < 1) {
		WK_ERR(w, "dropping a malformed micro-batch (group %u, stage %d, %d columns, %d ops, %zu bytes): "
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
	oh = wk_out_buf(w, (int32_t)h->group);
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
			wk_fmt(oh->err, sizeof(oh->err), "%s: got a %s message of %d floats per row, expected %s",
			       j->what, h->kind == SHM_MB_HIDDEN ? "hidden" : "token", h->hidden,
			       w->info.first ? "token ids" : "hidden rows");
		} else {
			uint64_t ts = kvf_mono_ns();

			rc = kn_stage_step_submit(w->st, &j->st);
			/* a synchronous engine (cpu) computes inside submit: not host overhead */
			if (w->o.backend != KN_BACKEND_CUDA)
				t0 += kvf_mono_ns() - ts;
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
	w->host_ns += kvf_mono_ns() - t0;
	return 1;
}
