/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Test harness for the scheduler: per-request recorders, a driver loop with
 * a bound, and a recording chain that wraps another chain and logs every
 * submission (columns and ops) so tests can check packing.
 */
#ifndef TESTS_CTRL_SCHED_HARNESS_H
#define TESTS_CTRL_SCHED_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrl_chain.h"
#include "ctrl_sched.h"

#define REC_MAX 512

/* What one request produced. */
struct rec {
	int64_t id;
	int32_t toks[REC_MAX];
	int32_t n;
	int done;                  /* finish events seen */
	enum ctrl_finish finish;
	int32_t stop_token;
	char msg[320];
	/* optional: cancel from inside the callback after this many tokens */
	int32_t cancel_after;
	struct ctrl_sched *sched;
};

static inline void rec_cb(void *arg, const struct ctrl_event *ev)
{
	struct rec *r = arg;

	if (ev->finish == CTRL_FINISH_NONE) {
		if (r->n < REC_MAX)
			r->toks[r->n] = ev->token;
		r->n++;
		if (r->cancel_after > 0 && r->n == r->cancel_after && r->sched != NULL)
			ctrl_sched_cancel(r->sched, ev->id);
		return;
	}
	r->done++;
	r->finish = ev->finish;
	r->stop_token = ev->token;
	if (ev->message != NULL)
		snprintf(r->msg, sizeof(r->msg), "%s", ev->message);
}

static inline int64_t submit_rec(struct ctrl_sched *s, struct rec *r, const int32_t *prompt,
				 int32_t n_prompt, int32_t max_tokens, float temperature, uint32_t seed)
{
	struct ctrl_request rq;

	ctrl_request_init(&rq);
	rq.prompt = prompt;
	rq.n_prompt = n_prompt;
	rq.max_tokens = max_tokens;
	rq.temperature = temperature;
	rq.seed = seed;
	rq.cb = rec_cb;
	rq.cb_arg = r;
	r->id = ctrl_sched_submit(s, &rq);
	return r->id;
}

/* Poll until drained; @return polls used, or -1 past @p max_polls (a hang). */
static inline long drive(struct ctrl_sched *s, long max_polls)
{
	for (long k = 0; k < max_polls; k++) {
		if (ctrl_sched_poll(s) < 0)
			return -2;
		if (ctrl_sched_drained(s))
			return k + 1;
	}
	return -1;
}

/* ---- a recording chain: forwards to an inner chain, logs submissions ---- */

#define LOG_MAX 8192

struct logged_mb {
	int32_t n_cols;
	int32_t n_logit;            /* columns with NEED_LOGIT */
	int32_t n_ops;
	int32_t slots[64];          /* distinct slots, first 64 */
	int32_t n_slots;
	int32_t has_slot_cols;      /* columns of rec_chain.watch_slot */
	int32_t n_late;             /* columns at positions >= rec_chain.late_pos */
	int32_t late_out;           /* launches with late columns in flight at this submit */
};

struct rec_chain {
	struct ctrl_chain base;
	struct ctrl_chain *inner;
	struct logged_mb *log;
	int32_t n_log;
	int32_t watch_slot;
	int32_t late_pos;           /* a column this far into its sequence counts as late */
	uint8_t late_group[256];    /* in flight, with late columns, by group */
};

static inline int rc_info(struct ctrl_chain *c, struct ctrl_chain_info *i)
{
	return ctrl_chain_info(((struct rec_chain *)c)->inner, i);
}

static inline int rc_submit(struct ctrl_chain *c, uint32_t g, const struct kn_column *cols,
			    int32_t n, const struct kn_op *ops, int32_t n_ops)
{
	struct rec_chain *rc = (struct rec_chain *)c;
	int32_t late = 0;
	int r;

	for (int32_t i = 0; i < n; i++)
		late += cols[i].pos >= rc->late_pos;
	if (rc->n_log < LOG_MAX) {
		struct logged_mb *m = &rc->log[rc->n_log++];

		memset(m, 0, sizeof(*m));
		m->n_cols = n;
		m->n_ops = n_ops;
		m->n_late = late;
		for (int32_t k = 0; k < 256; k++)
			m->late_out += rc->late_group[k];
		for (int32_t i = 0; i < n; i++) {
			int seen = 0;

			m->n_logit += (cols[i].flags & KN_COL_NEED_LOGIT) != 0;
			m->has_slot_cols += cols[i].slot == rc->watch_slot;
			for (int32_t k = 0; k < m->n_slots; k++)
				seen |= m->slots[k] == cols[i].slot;
			if (!seen && m->n_slots < 64)
				m->slots[m->n_slots++] = cols[i].slot;
		}
	}
	r = ctrl_chain_submit(rc->inner, g, cols, n, ops, n_ops);
	if (r == 0 && g < 256)
		rc->late_group[g] = late > 0;
	return r;
}

static inline int rc_poll(struct ctrl_chain *c, struct ctrl_chain_result *o, int max)
{
	struct rec_chain *rc = (struct rec_chain *)c;
	int n = ctrl_chain_poll(rc->inner, o, max);

	for (int i = 0; i < n; i++)
		if (o[i].group < 256)
			rc->late_group[o[i].group] = 0;
	return n;
}

static inline int rc_stats(struct ctrl_chain *c, struct ctrl_chain_stats *st)
{
	return ctrl_chain_stats(((struct rec_chain *)c)->inner, st);
}

static inline void rc_destroy(struct ctrl_chain *c)
{
	struct rec_chain *rc = (struct rec_chain *)c;

	ctrl_chain_destroy(rc->inner);
	free(rc->log);
	free(rc);
}

static const struct ctrl_chain_vtbl rec_chain_vtbl = {
	.name = "recording",
	.info = rc_info,
	.submit = rc_submit,
	.poll = rc_poll,
	.stats = rc_stats,
	.destroy = rc_destroy,
};

static inline struct rec_chain *rec_chain_wrap(struct ctrl_chain *inner)
{
	struct rec_chain *rc = calloc(1, sizeof(*rc));

	rc->base.vt = &rec_chain_vtbl;
	rc->inner = inner;
	rc->log = calloc(LOG_MAX, sizeof(*rc->log));
	rc->watch_slot = -1;
	rc->late_pos = INT32_MAX;
	return rc;
}

#endif /* TESTS_CTRL_SCHED_HARNESS_H */
