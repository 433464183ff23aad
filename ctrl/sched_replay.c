/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Requests the chain lost, run again (ctrl_sched.h "A replay changes no
 * token", ctrl/SCHED.md "Replays").
 *
 * A sequence is lost when its micro-batch fails (a stage died: the worker
 * chain fails every group in flight), when one of its columns fails (its
 * slot's KV went with a restarted stage), or when the chain stops being
 * ready while it is live (its KV on the stages cannot be trusted after the
 * chain re-forms). It then leaves its slot, its blocks back in the pool and
 * its reservation released, and waits on rp_head as a request whose prompt
 * is toks[0 .. n_prompt + n_gen): its prompt and every token it generated,
 * streamed or not. max_tokens and n_gen stay (n_generated in its events
 * goes on counting; what is left to generate is max_tokens - n_gen), and so
 * do its stop ids, sampling settings and n_logprobs. Prefilling that prompt
 * in a fresh slot ends with the column an undisturbed run would have fed
 * next, at the same position; its token is drawn with the same (seed,
 * position) key (kn_sample_core.h: the draw keeps no state to resume), and
 * the bits are the same however the columns are batched or chunked
 * (DESIGN.md "Bitwise determinism"). So the client sees a pause: no token
 * twice, none missing. The worst case, prompt + max_tokens, is what it was,
 * so re-admission needs exactly the reservation it gave back; replayed
 * requests are admitted before the FIFO, which they had left already.
 *
 * While the chain is not ready (ctrl_chain_ready()) nothing is admitted or
 * launched: a launch would fail at once and spend a replay. A request that
 * waits for it longer than replay_timeout ends with the chain's error,
 * naming the stage and the setting; one lost again after replay_max replays
 * ends likewise. A decode node's kv_remote request is replayed as a local
 * one: its KV came from a prefill node, but this node's chain computes the
 * same bits from its prompt and the tokens it streamed (a kv_lost event
 * first tells its owner that its reserved blocks go back). Not replayed:
 * a prefill node's hold_kv requests (their KV goes to another node),
 * cancelled ones, and any with replay_max 0, which end at once with the
 * chain's error as they did before replays.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "ctrl_sched.h"
#include "sched_int.h"
#include "kvf_clock.h"

#define WHY_LEN 320

static int replayable(const struct ctrl_sched *s, const struct sched_slot *sl)
{
	const struct sched_req *r = sl->r;

	return s->o.replay_max > 0 && !sl->cancelled && !r->hold_kv;
}

void sched_slot_lost(struct ctrl_sched *s, int32_t i, const char *msg)
{
	struct sched_slot *sl = &s->slots[i];
	struct sched_req *r = sl->r;
	char full[480];
	int32_t n_toks;

	/* the chain lost KV: no cached block is trusted */
	sched_prefix_flush(s);
	if (s->o.replay_max > 0 && sl->cancelled) {
		sched_slot_finish(s, i, CTRL_FINISH_CANCELLED, -1, NULL); /* its client went away */
		return;
	}
	if (!replayable(s, sl)) {
		sched_slot_finish(s, i, CTRL_FINISH_ERROR, -1, msg);
		return;
	}
	if (r->n_replays >= s->o.replay_max) {
		snprintf(full, sizeof(full), "%s; it was replayed %d time%s already (replay_max %d): raise [sched] "
			 "replay_max to replay it more", msg, r->n_replays, r->n_replays == 1 ? "" : "s",
			 s->o.replay_max);
		s->st.replay_failures++;
		sched_slot_finish(s, i, CTRL_FINISH_ERROR, -1, full);
		return;
	}
	if (r->why == NULL && (r->why = malloc(WHY_LEN)) == NULL) {
		sched_slot_finish(s, i, CTRL_FINISH_ERROR, -1, msg);
		return;
	}
	snprintf(r->why, WHY_LEN, "%s", msg);
	if (r->kv_remote) {
		/* its owner (the decode end) forgets the room before the blocks
		 * go back: no page lands in them once another request has them.
		 * So now, not held for the poll's end (sched_emit()) */
		sched_kv_lost(s, r);
	}
	n_toks = sl->n_toks; /* prompt + generated: the replay's prompt */
	sched_slot_release(s, i);
	r->n_prompt = n_toks;
	r->n_replays++;
	r->t_wait_ns = kvf_mono_ns();
	sched_queue_push(&s->rp_head, &s->rp_tail, r);
	s->n_replaying++;
	s->queued_bytes += sched_req_queued_bytes(r);
	atomic_fetch_add_explicit(&s->pending, 1, memory_order_relaxed);
	s->st.replayed++;
}

/* End every request of queue @p head that has waited @p lim ns for the chain. */
static void expire(struct ctrl_sched *s, struct sched_req **head, struct sched_req **tail, int32_t *n,
		   uint64_t now, uint64_t lim)
{
	struct sched_req *r, *prev = NULL, *next;

	for (r = *head; r != NULL; r = next) {
		uint64_t t0 = r->t_wait_ns > s->down_since ? r->t_wait_ns : s->down_since;
		char msg[480];

		next = r->next;
		/* t0 may be later than @p now: a sequence lost in this very hold
		 * stamped its wait after the caller read the clock */
		if (t0 >= now || now - t0 < lim) {
			prev = r;
			continue;
		}
		sched_queue_unlink(head, tail, prev, r);
		(*n)--;
		s->queued_bytes -= sched_req_queued_bytes(r);
		atomic_fetch_sub_explicit(&s->pending, 1, memory_order_relaxed);
		if (r->why != NULL)
			snprintf(msg, sizeof(msg), "%s; the chain did not re-form within replay_timeout %g s "
				 "(replayed %d of replay_max %d times): restart the stage's worker or raise "
				 "[sched] replay_timeout", r->why, (double)s->o.replay_timeout_ms / 1e3,
				 r->n_replays, s->o.replay_max);
		else
			snprintf(msg, sizeof(msg), "the stage chain is re-forming after: %s; it did not re-form "
				 "within replay_timeout %g s of this request's arrival: restart the stage's worker or "
				 "raise [sched] replay_timeout", s->down_why, (double)s->o.replay_timeout_ms / 1e3);
		s->st.replay_failures++;
		sched_req_finish(s, r, CTRL_FINISH_ERROR, -1, msg);
	}
}

int sched_replay_hold(struct ctrl_sched *s)
{
	char why[CTRL_CHAIN_ERRLEN], msg[320];
	uint64_t now;

	if (s->o.replay_max <= 0)
		return 0;
	if (ctrl_chain_ready(s->chain, why, sizeof(why))) {
		s->down_since = 0;
		return 0;
	}
	now = kvf_mono_ns();
	if (s->down_since == 0) {
		s->down_since = now;
		snprintf(s->down_why, sizeof(s->down_why), "%s", why[0] ? why : "the stage chain is not ready");
	}
	/* A group the transport held back never left: its sequences wait too. */
	for (int32_t k = 0; k < s->n_groups; k++)
		if (s->groups[k].state == GROUP_PENDING)
			sched_group_fail(s, &s->groups[k], s->down_why);
	/* Live sequences between two rounds: their KV went with the stage. */
	snprintf(msg, sizeof(msg), "the stage chain went down while this request waited for its next "
		 "micro-batch: %s", s->down_why);
	for (int32_t i = 0; i < s->n_slots; i++)
		if (s->slots[i].r != NULL && !s->slots[i].inflight)
			sched_slot_lost(s, i, msg);
	expire(s, &s->rp_head, &s->rp_tail, &s->n_replaying, now, s->o.replay_timeout_ms * 1000000ull);
	expire(s, &s->q_head, &s->q_tail, &s->n_queued, now, s->o.replay_timeout_ms * 1000000ull);
	return 1;
}

/* Move the requests of queue @p head of @p from that @p to can carry. */
static int32_t move_queue(struct ctrl_sched *from, struct ctrl_sched *to, struct sched_req **head,
			  struct sched_req **tail, int32_t *n, struct sched_req **thead, struct sched_req **ttail,
			  int32_t *tn)
{
	struct sched_req *r, *prev = NULL, *next;
	int32_t moved = 0;

	for (r = *head; r != NULL; r = next) {
		size_t b = sched_req_queued_bytes(r);

		next = r->next;
		/* PD requests keep their node's reservations; one the other
		 * pool could never carry stays (it ends where it is) */
		if (r->hold_kv || r->kv_remote || r->need > to->n_blocks || r->n_prompt + r->max_tokens - r->n_gen > to->ctx) {
			prev = r;
			continue;
		}
		sched_queue_unlink(head, tail, prev, r);
		(*n)--;
		from->queued_bytes -= b;
		atomic_fetch_sub_explicit(&from->pending, 1, memory_order_relaxed);
		atomic_fetch_sub_explicit(&from->load, r->need, memory_order_relaxed); /* added at submit, */
		atomic_fetch_add_explicit(&to->load, r->need, memory_order_relaxed);   /* taken at its end */
		sched_queue_push(thead, ttail, r);
		(*tn)++;
		to->queued_bytes += b;
		atomic_fetch_add_explicit(&to->pending, 1, memory_order_relaxed);
		moved++;
	}
	return moved;
}

int32_t sched_move_waiting(struct ctrl_sched *from, struct ctrl_sched *to)
{
	int32_t n = move_queue(from, to, &from->rp_head, &from->rp_tail, &from->n_replaying, &to->rp_head,
			       &to->rp_tail, &to->n_replaying);

	n += move_queue(from, to, &from->q_head, &from->q_tail, &from->n_queued, &to->q_head, &to->q_tail,
			&to->n_queued);
	from->st.moved_out += (uint64_t)n;
	return n;
}
