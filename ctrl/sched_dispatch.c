/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Replicas: independent pipelines behind one dispatcher. A request goes to
 * the replica with the least worst-case block load (waiting + live, over its
 * pool), so a replica full of long requests stops receiving new ones before
 * its queue grows. Request ids carry the replica index in their low 8 bits
 * (each replica's id_tag), so cancel needs no lookup table. A request
 * goes only to a replica whose pool could ever carry it, when one can
 * (ctrl_sched_admissible()); the HTTP layer refuses one that none can.
 *
 * A replica whose chain is down (a worker died; ctrl_chain_ready()) gets no
 * new request while another serves, and at each poll its waiting requests
 * move to the least loaded replica that serves: the ones it lost run again
 * there at once (from their prompt and the tokens already streamed, token
 * for token: sched_replay.c) instead of waiting for its worker to return.
 * A moved request keeps its id, whose tag names the replica it came from:
 * a cancel therefore goes to every replica (each ignores an id it lacks).
 *
 * Threading: submit, admissible and cancel from any thread; poll, drained
 * from the one thread that polls (it owns every replica's queues).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "ctrl_sched.h"
#include "sched_int.h"

struct ctrl_dispatch {
	int n;
	atomic_uint rr;            /* tie-breaker */
	struct ctrl_sched *r[];
};

struct ctrl_dispatch *ctrl_dispatch_create(struct ctrl_sched *const *replicas, int n)
{
	struct ctrl_dispatch *d;

	if (replicas == NULL || n < 1 || n > CTRL_DISPATCH_MAX) {
		errno = EINVAL;
		return NULL;
	}
	for (int i = 0; i < n; i++) {
		if (replicas[i] == NULL || replicas[i]->o.id_tag != (uint8_t)i) {
			errno = EINVAL;
			return NULL;
		}
	}
	d = calloc(1, sizeof(*d) + sizeof(d->r[0]) * (size_t)n);
	if (d == NULL) {
		errno = ENOMEM;
		return NULL;
	}
	d->n = n;
	atomic_init(&d->rr, 0);
	for (int i = 0; i < n; i++)
		d->r[i] = replicas[i];
	return d;
}

void ctrl_dispatch_destroy(struct ctrl_dispatch *d)
{
	free(d);
}

int64_t ctrl_dispatch_submit(struct ctrl_dispatch *d, const struct ctrl_request *r)
{
	unsigned start = atomic_fetch_add_explicit(&d->rr, 1, memory_order_relaxed);
	int best = -1, fits_any = 0;
	double best_load = 0.0;

	/* another choice of a request: where the first one's prompt is computed */
	if (r != NULL && r->prefill_from != 0 && (int)(r->prefill_from & 0xffu) < d->n)
		return ctrl_sched_submit(d->r[r->prefill_from & 0xffu], r);

	/* Replicas whose pools differ (devices of different memory): only one
	 * that could ever carry the request is a candidate, if any can. */
	for (int i = 0; i < d->n && !fits_any; i++)
		fits_any = r != NULL && ctrl_sched_admissible(d->r[i], r->n_prompt, r->max_tokens, NULL, 0) >= r->max_tokens;
	/* a replica that serves first; all of them when none does (the
	 * request then waits for a chain to re-form, up to replay_timeout) */
	for (int ready = d->n > 1; ready >= 0 && best < 0; ready--)
		for (int k = 0; k < d->n; k++) {
			int i = (int)((start + (unsigned)k) % (unsigned)d->n);
			double l;

			if (fits_any && ctrl_sched_admissible(d->r[i], r->n_prompt, r->max_tokens, NULL, 0) < r->max_tokens)
				continue;
			if (ready && !ctrl_chain_ready(d->r[i]->chain, NULL, 0))
				continue;
			l = ctrl_sched_load(d->r[i]);
			if (best < 0 || l < best_load) {
				best = i;
				best_load = l;
			}
		}
	return ctrl_sched_submit(d->r[best], r);
}

int32_t ctrl_dispatch_admissible(const struct ctrl_dispatch *d, int32_t n_prompt, int32_t max_tokens, char *err,
				 size_t errlen)
{
	int32_t most = -1;
	int best = 0;

	for (int i = 0; i < d->n; i++) {
		int32_t m = ctrl_sched_admissible(d->r[i], n_prompt, max_tokens, NULL, 0);

		if (m > most) {
			most = m;
			best = i;
		}
	}
	/* the refusal the largest replica would give */
	return ctrl_sched_admissible(d->r[best], n_prompt, max_tokens, err, errlen);
}

int ctrl_dispatch_flush_prefix(struct ctrl_dispatch *d)
{
	int rc = -ENOTSUP;

	for (int i = 0; i < d->n; i++)
		if (ctrl_sched_flush_prefix(d->r[i]) == 0)
			rc = 0;
	return rc;
}

int ctrl_dispatch_cancel(struct ctrl_dispatch *d, uint64_t id)
{
	unsigned tag = (unsigned)(id & 0xffu);
	int rc;

	if (tag >= (unsigned)d->n)
		return -EINVAL;
	rc = ctrl_sched_cancel(d->r[tag], id);
	for (int i = 0; i < d->n && rc == 0; i++) /* it may have moved (see the top) */
		if (i != (int)tag)
			rc = ctrl_sched_cancel(d->r[i], id);
	return rc;
}

/* Hand the waiting requests of every replica whose chain is down to the
 * least loaded one that serves. @return how many moved. */
static int32_t move_off_down(struct ctrl_dispatch *d)
{
	int32_t moved = 0;

	for (int i = 0; i < d->n; i++) {
		struct ctrl_sched *from = d->r[i];
		int best = -1;
		double best_load = 0.0;

		if ((from->rp_head == NULL && from->q_head == NULL) || ctrl_chain_ready(from->chain, NULL, 0))
			continue;
		for (int k = 0; k < d->n; k++) {
			double l;

			if (k == i || !ctrl_chain_ready(d->r[k]->chain, NULL, 0))
				continue;
			l = ctrl_sched_load(d->r[k]);
			if (best < 0 || l < best_load) {
				best = k;
				best_load = l;
			}
		}
		if (best >= 0)
			moved += sched_move_waiting(from, d->r[best]);
	}
	return moved;
}

int ctrl_dispatch_poll(struct ctrl_dispatch *d)
{
	int busy = CTRL_SCHED_IDLE, err = 0;

	for (int i = 0; i < d->n; i++) {
		int rc = ctrl_sched_poll(d->r[i]);

		if (rc < 0 && err == 0)
			err = rc;
		if (rc == CTRL_SCHED_BUSY)
			busy = CTRL_SCHED_BUSY;
	}
	if (d->n > 1 && move_off_down(d) > 0)
		busy = CTRL_SCHED_BUSY;
	return err < 0 ? err : busy;
}

int ctrl_dispatch_drained(struct ctrl_dispatch *d)
{
	for (int i = 0; i < d->n; i++)
		if (!ctrl_sched_drained(d->r[i]))
			return 0;
	return 1;
}

int ctrl_dispatch_count(const struct ctrl_dispatch *d)
{
	return d->n;
}

struct ctrl_sched *ctrl_dispatch_replica(struct ctrl_dispatch *d, int i)
{
	return i >= 0 && i < d->n ? d->r[i] : NULL;
}
