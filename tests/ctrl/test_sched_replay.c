/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Replays (ctrl/sched_replay.c) on the fake chain behind a wrapper that dies
 * as the worker chain does: from a chosen submission on, every group in
 * flight fails naming stage 1, the chain is not ready (ctrl_chain_ready())
 * and a launch fails at once, until it comes back some polls later, or
 * never. The fake chain's tokens hash each slot's whole history, so a
 * replay that fed a wrong token, a wrong position or lost one shows up as
 * different output. Each test compares against the same requests on a
 * chain that does not die.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "sched_harness.h"
#include "sched_int.h"

#define N_REQ 12
#define MAX_TOK 30
#define WHY "stage 1 (stage1, pid 4242, layers 1..2) died"

/* The dying chain. */
struct dying_chain {
	struct ctrl_chain base;
	struct ctrl_chain *inner;
	int64_t die_at[4];          /* submissions after which the chain dies (-1: unused) */
	int n_die, next_die;
	long up_after;              /* polls a death lasts; < 0: it never comes back */
	int down;
	long polls_down;
	int64_t n_submits;
	int64_t submits_down;       /* launches tried while it was down */
	int deaths;
	uint8_t inflight[64], doomed[64];
	uint8_t refused[64];        /* launched while down: fails at the next poll */
	int32_t refused_cols[64];
	int64_t die_on_return;      /* >= 0: die at the poll that returns a result after this many
	                               submissions (its sequences are then between two rounds) */
	int between;                /* results that poll returned intact */
	int64_t n_launched;         /* every submission taken while up */
};

static int dc_info(struct ctrl_chain *c, struct ctrl_chain_info *i)
{
	return ctrl_chain_info(((struct dying_chain *)c)->inner, i);
}

static int dc_submit(struct ctrl_chain *c, uint32_t g, const struct kn_column *cols, int32_t n,
		     const struct kn_op *ops, int32_t n_ops)
{
	struct dying_chain *dc = (struct dying_chain *)c;
	int rc;

	if (dc->down) {
		/* as the worker chain: taken, and failed at the next poll */
		dc->submits_down++;
		dc->refused[g] = 1;
		dc->refused_cols[g] = n;
		return 0;
	}
	rc = ctrl_chain_submit(dc->inner, g, cols, n, ops, n_ops);
	if (rc != 0)
		return rc;
	dc->inflight[g] = 1;
	dc->n_launched++;
	if (dc->next_die < dc->n_die && dc->n_submits++ == dc->die_at[dc->next_die]) {
		/* every group in flight, this one included, fails */
		dc->next_die++;
		dc->deaths++;
		dc->down = 1;
		dc->polls_down = 0;
		memcpy(dc->doomed, dc->inflight, sizeof(dc->doomed));
	}
	return 0;
}

static int dc_poll(struct ctrl_chain *c, struct ctrl_chain_result *o, int max)
{
	struct dying_chain *dc = (struct dying_chain *)c;
	int n = ctrl_chain_poll(dc->inner, o, max), doomed = 0;

	for (int i = 0; i < n; i++) {
		dc->inflight[o[i].group] = 0;
		if (!dc->doomed[o[i].group])
			continue;
		dc->doomed[o[i].group] = 0;
		o[i].status = -EPIPE;
		o[i].col_status = NULL;
		o[i].n_failed_cols = 0;
		snprintf(o[i].err, sizeof(o[i].err), "%s", WHY);
	}
	for (int g = 0; g < 64; g++) {
		doomed |= dc->doomed[g];
		if (dc->refused[g] && n < max) {
			dc->refused[g] = 0;
			o[n] = (struct ctrl_chain_result){ .group = (uint32_t)g, .status = -EPIPE,
							   .n_cols = dc->refused_cols[g] };
			snprintf(o[n].err, sizeof(o[n].err), "the stage chain is re-forming after: %s", WHY);
			n++;
		}
	}
	if (dc->down && !doomed && dc->up_after >= 0 && ++dc->polls_down > dc->up_after)
		dc->down = 0;
	if (!dc->down && dc->die_on_return >= 0 && dc->n_launched >= dc->die_on_return && n > 0) {
		/* these results arrive intact; the groups still out fail */
		dc->die_on_return = -1;
		dc->deaths++;
		dc->down = 1;
		dc->polls_down = 0;
		dc->between = n;
		memcpy(dc->doomed, dc->inflight, sizeof(dc->doomed));
	}
	return n;
}

static int dc_ready(struct ctrl_chain *c, char *why, size_t len)
{
	struct dying_chain *dc = (struct dying_chain *)c;

	if (dc->down)
		snprintf(why, len, "%s", WHY);
	return !dc->down;
}

static int dc_stats(struct ctrl_chain *c, struct ctrl_chain_stats *st)
{
	return ctrl_chain_stats(((struct dying_chain *)c)->inner, st);
}

static void dc_destroy(struct ctrl_chain *c)
{
	struct dying_chain *dc = (struct dying_chain *)c;

	ctrl_chain_destroy(dc->inner);
	free(dc);
}

static const struct ctrl_chain_vtbl dying_vtbl = {
	.name = "dying",
	.info = dc_info,
	.submit = dc_submit,
	.poll = dc_poll,
	.stats = dc_stats,
	.destroy = dc_destroy,
	.ready = dc_ready,
};

/* A 2-stage fake chain of 16 slots that dies after each of @p die_at[0 .. n). */
static struct dying_chain *dying(const int64_t *die_at, int n, long up_after)
{
	struct ctrl_fake_chain_opts fo;
	struct dying_chain *dc = calloc(1, sizeof(*dc));

	assert_non_null(dc);
	ctrl_fake_chain_opts_init(&fo);
	fo.n_stages = 2;
	fo.n_slots = 16;
	fo.max_groups = 64;
	dc->inner = ctrl_fake_chain_create(&fo);
	assert_non_null(dc->inner);
	dc->base.vt = &dying_vtbl;
	for (int i = 0; i < n; i++)
		dc->die_at[i] = die_at[i];
	dc->n_die = n;
	dc->up_after = up_after;
	dc->die_on_return = -1;
	return dc;
}

static struct ctrl_sched *sched_on(struct dying_chain *dc, int32_t replay_max, uint64_t timeout_ms)
{
	struct ctrl_sched_opts o;
	struct ctrl_sched *s;
	char err[256];

	ctrl_sched_opts_init(&o);
	o.mb_cols = 8;
	o.replay_max = replay_max;
	o.replay_timeout_ms = timeout_ms;
	s = ctrl_sched_create(&dc->base, &o, err, sizeof(err));
	if (s == NULL)
		fail_msg("ctrl_sched_create: %s", err);
	return s;
}

/* Request i: its prompt, and whether it samples (odd i: seeded, temperature 0.8). */
static int32_t prompt_of(int i, int32_t *p)
{
	uint32_t x = 977u * (uint32_t)(i + 1);
	int32_t n = 10 + i;

	for (int32_t k = 0; k < n; k++) {
		x = x * 1103515245u + 12345u;
		p[k] = k >= 5 && (x >> 16) % 3 == 0 ? p[k - 5] : (int32_t)((x >> 16) % 64u);
	}
	return n;
}

/* Submit requests @p from .. @p to - 1. */
static void submit_range(struct ctrl_sched *s, struct rec *r, int from, int to)
{
	int32_t p[64];

	for (int i = from; i < to; i++) {
		int32_t np = prompt_of(i, p);

		memset(&r[i], 0, sizeof(r[i]));
		assert_true(submit_rec(s, &r[i], p, np, MAX_TOK, i % 2 ? 0.8f : 0.0f, (uint32_t)(1000 + i)) > 0);
	}
}

static void submit_all(struct ctrl_sched *s, struct rec *r, int n)
{
	submit_range(s, r, 0, n);
}

/* The requests on a chain that never dies: what every replayed one must equal. */
static void undisturbed(struct rec *ref)
{
	struct dying_chain *dc = dying(NULL, 0, 0);
	struct ctrl_sched *s = sched_on(dc, 2, 30000);

	submit_all(s, ref, N_REQ);
	assert_true(drive(s, 100000) > 0);
	for (int i = 0; i < N_REQ; i++) {
		assert_int_equal(ref[i].finish, CTRL_FINISH_LENGTH);
		assert_int_equal(ref[i].n, MAX_TOK);
	}
	ctrl_sched_destroy(s);
	ctrl_chain_destroy(&dc->base);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void a_request_whose_stage_died_runs_again_from_its_prompt_and_tokens_and_ends_as_if_undisturbed(
	void **state)
{
	static struct rec ref[N_REQ], got[N_REQ];
	const int64_t die_at[] = { 24 };
	struct dying_chain *dc;
	struct ctrl_sched *s;
	struct ctrl_sched_stats st;
	int32_t p[64];
	int n_back = 0;

	(void)state;
	undisturbed(ref);
	dc = dying(die_at, 1, 5);
	s = sched_on(dc, 2, 30000);
	submit_all(s, got, N_REQ);
	for (long k = 0; !dc->down || s->n_inflight > 0; k++) {
		assert_true(k < 100000);
		assert_true(ctrl_sched_poll(s) >= 0);
	}
	/* Every group in flight failed, and every live sequence waits to run
	 * again as prompt + what it generated. */
	assert_true(dc->down);
	assert_int_equal(s->n_live, 0);
	assert_int_equal(s->reserved, 0);
	for (struct sched_req *r = s->rp_head; r != NULL; r = r->next, n_back++) {
		int i = -1;

		for (int k = 0; k < N_REQ; k++)
			if ((uint64_t)got[k].id == r->id)
				i = k;
		assert_true(i >= 0);
		assert_int_equal(got[i].done, 0); /* its client was told nothing */
		assert_int_equal(r->n_replays, 1);
		assert_int_equal(r->n_gen, got[i].n);
		assert_int_equal(r->n_prompt, prompt_of(i, p) + got[i].n);
		assert_memory_equal(r->toks, p, sizeof(int32_t) * (size_t)prompt_of(i, p));
		assert_memory_equal(r->toks + prompt_of(i, p), got[i].toks, sizeof(int32_t) * (size_t)got[i].n);
		assert_int_equal(r->max_tokens - r->n_gen, MAX_TOK - got[i].n); /* what is left */
		assert_true(r->temperature == (i % 2 ? 0.8f : 0.0f));
		assert_int_equal(r->seed, 1000 + i);
		assert_non_null(strstr(r->why, WHY));
	}
	assert_true(n_back >= 1);
	ctrl_sched_stats(s, &st);
	assert_int_equal(st.replaying, n_back);
	assert_int_equal(st.blocks_in_use, 0);
	assert_true(drive(s, 100000) > 0);
	assert_int_equal(dc->submits_down, 0); /* nothing launched into a dead chain */
	for (int i = 0; i < N_REQ; i++) {
		assert_int_equal(got[i].done, 1);
		assert_int_equal(got[i].finish, CTRL_FINISH_LENGTH);
		assert_int_equal(got[i].n, MAX_TOK); /* no token twice, none missing */
		assert_memory_equal(got[i].toks, ref[i].toks, sizeof(int32_t) * MAX_TOK);
	}
	ctrl_sched_stats(s, &st);
	printf("a death at submission %lld: %d of %d requests replayed, every one equal to the undisturbed run\n",
	       (long long)die_at[0], n_back, N_REQ);
	assert_int_equal(st.replayed, (uint64_t)n_back);
	assert_int_equal(st.errors, 0);
	assert_int_equal(st.replaying, 0);
	assert_int_equal(st.blocks_in_use, 0);
	assert_int_equal(st.blocks_reserved, 0);
	assert_int_equal(st.admitted, N_REQ); /* a replay is not a second admission */
	ctrl_sched_destroy(s);
	ctrl_chain_destroy(&dc->base);
}

/* A prompt_logprobs request's record: its scored positions, then its tokens. */
struct plrec {
	int32_t n_p, pos[32];
	float lp[32];
	int32_t n, toks[MAX_TOK];
	int late, done;
	enum ctrl_finish finish;
};

static void plrec_cb(void *arg, const struct ctrl_event *ev)
{
	struct plrec *r = arg;

	if (ev->finish != CTRL_FINISH_NONE) {
		r->done++;
		r->finish = ev->finish;
	} else if (ev->prompt_pos > 0) {
		r->late |= r->n > 0;
		if (r->n_p < 32) {
			r->pos[r->n_p] = ev->prompt_pos;
			r->lp[r->n_p] = ev->logprob;
		}
		r->n_p++;
	} else if (r->n < MAX_TOK) {
		r->toks[r->n++] = ev->token;
	}
}

/* Six prompt_logprobs requests, prompts in 4-column chunks, through @p dc. */
static void prompt_lp_run(struct dying_chain *dc, struct plrec *got)
{
	struct ctrl_sched_opts o;
	struct ctrl_sched *s;
	char err[256];
	int32_t p[64];

	ctrl_sched_opts_init(&o);
	o.mb_cols = 8;
	o.prefill_cols = 4;
	o.replay_max = 3;
	o.replay_timeout_ms = 30000;
	s = ctrl_sched_create(&dc->base, &o, err, sizeof(err));
	if (s == NULL)
		fail_msg("ctrl_sched_create: %s", err);
	memset(got, 0, sizeof(*got) * 6);
	for (int i = 0; i < 6; i++) {
		struct ctrl_request rq;

		ctrl_request_init(&rq);
		rq.prompt = p;
		rq.n_prompt = prompt_of(i, p);
		rq.max_tokens = 5;
		rq.temperature = i % 2 ? 0.8f : 0.0f;
		rq.seed = (uint32_t)(1000 + i);
		rq.prompt_logprobs = 1;
		rq.cb = plrec_cb;
		rq.cb_arg = &got[i];
		assert_true(ctrl_sched_submit(s, &rq) > 0);
	}
	assert_true(drive(s, 100000) > 0);
	ctrl_sched_destroy(s);
}

/* A prompt whose logprobs were partly reported when its stage died: run
 * again, it reports each position once, in order, before its tokens, with
 * the values and tokens of the undisturbed run, whatever chunk it died in. */
static void a_replayed_prompt_reports_each_positions_logprob_once_as_undisturbed(void **state)
{
	static struct plrec ref[6], got[6];
	struct dying_chain *dc = dying(NULL, 0, 0);
	int32_t p[64];
	int replayed = 0;

	(void)state;
	prompt_lp_run(dc, ref);
	ctrl_chain_destroy(&dc->base);
	for (int64_t at = 0; at < 10; at++) {
		const int64_t die_at[] = { at };

		dc = dying(die_at, 1, 3);
		prompt_lp_run(dc, got);
		replayed += dc->deaths;
		for (int i = 0; i < 6; i++) {
			int32_t n = prompt_of(i, p);

			assert_int_equal(got[i].done, 1);
			assert_int_equal(got[i].finish, CTRL_FINISH_LENGTH);
			assert_false(got[i].late);
			assert_int_equal(got[i].n_p, n - 1);
			for (int32_t j = 0; j < n - 1; j++)
				assert_int_equal(got[i].pos[j], j + 1);
			assert_memory_equal(got[i].lp, ref[i].lp, sizeof(float) * (size_t)(n - 1));
			assert_int_equal(got[i].n, 5);
			assert_memory_equal(got[i].toks, ref[i].toks, sizeof(int32_t) * 5);
		}
		ctrl_chain_destroy(&dc->base);
	}
	printf("deaths at submissions 0..9 (%d): every scored position once, as undisturbed\n", replayed);
	assert_int_equal(replayed, 10);
}

static void a_request_lost_more_than_replay_max_times_fails_naming_the_stage_and_the_setting(void **state)
{
	static struct rec ref[N_REQ], got[N_REQ];
	const int64_t die_at[] = { 12, 40 };
	struct dying_chain *dc;
	struct ctrl_sched *s;
	struct ctrl_sched_stats st;
	int failed = 0;

	(void)state;
	undisturbed(ref);
	dc = dying(die_at, 2, 3);
	s = sched_on(dc, 1, 30000);
	/* The first half lives through both deaths, the second half only the second. */
	submit_range(s, got, 0, N_REQ / 2);
	for (long k = 0; dc->deaths < 1 || dc->down; k++) {
		assert_true(k < 100000);
		assert_true(ctrl_sched_poll(s) >= 0);
	}
	submit_range(s, got, N_REQ / 2, N_REQ);
	assert_true(drive(s, 100000) > 0);
	assert_int_equal(dc->deaths, 2);
	for (int i = 0; i < N_REQ; i++) {
		assert_int_equal(got[i].done, 1);
		if (got[i].finish == CTRL_FINISH_ERROR) {
			failed++;
			assert_true(i < N_REQ / 2);
			assert_non_null(strstr(got[i].msg, "the stage chain failed this request's micro-batch"));
			assert_non_null(strstr(got[i].msg, "stage 1"));
			assert_non_null(strstr(got[i].msg, "replayed 1 time already (replay_max 1)"));
			assert_non_null(strstr(got[i].msg, "raise [sched] replay_max"));
			/* what it streamed before it failed was right */
			assert_memory_equal(got[i].toks, ref[i].toks, sizeof(int32_t) * (size_t)got[i].n);
			continue;
		}
		assert_int_equal(got[i].finish, CTRL_FINISH_LENGTH);
		assert_memory_equal(got[i].toks, ref[i].toks, sizeof(int32_t) * MAX_TOK);
	}
	ctrl_sched_stats(s, &st);
	printf("two deaths, replay_max 1: %d of the %d requests lost twice failed, the other %d ended as if "
	       "undisturbed (%llu replays)\n", failed, N_REQ / 2, N_REQ - failed, (unsigned long long)st.replayed);
	assert_true(failed >= 1);
	assert_true(st.replayed > (uint64_t)N_REQ / 2); /* the second half was replayed too */
	assert_int_equal(st.replay_failures, (uint64_t)failed);
	assert_int_equal(st.errors, (uint64_t)failed);
	assert_int_equal(st.blocks_in_use, 0);
	ctrl_sched_destroy(s);
	ctrl_chain_destroy(&dc->base);
}

static void a_request_waiting_past_replay_timeout_for_the_chain_fails_naming_the_stage(void **state)
{
	static struct rec got[N_REQ + 2];
	const int64_t die_at[] = { 16 };
	struct dying_chain *dc;
	struct ctrl_sched *s;
	struct ctrl_sched_stats st;
	int32_t p[64];
	uint64_t t_down, t_end;
	int cancelled = -1;

	(void)state;
	dc = dying(die_at, 1, -1); /* its worker never comes back */
	s = sched_on(dc, 2, 100);
	submit_all(s, got, N_REQ);
	for (long k = 0; !dc->down || s->n_inflight > 0; k++) {
		assert_true(k < 100000);
		assert_true(ctrl_sched_poll(s) >= 0);
	}
	t_down = now_ns();
	/* requests that arrive while the chain is down wait for it too */
	memset(&got[N_REQ], 0, sizeof(got[0]) * 2);
	for (int i = 0; i < 2; i++)
		assert_true(submit_rec(s, &got[N_REQ + i], p, prompt_of(i, p), MAX_TOK, 0.0f, 0) > 0);
	assert_true(ctrl_sched_poll(s) >= 0);
	/* and one of those waiting to run again can still be cancelled */
	assert_non_null(s->rp_head);
	for (int i = 0; i < N_REQ; i++)
		if ((uint64_t)got[i].id == s->rp_head->id)
			cancelled = i;
	assert_true(cancelled >= 0);
	assert_int_equal(ctrl_sched_cancel(s, (uint64_t)got[cancelled].id), 0);
	while (!ctrl_sched_drained(s)) {
		struct timespec ts = { 0, 1000000 };

		assert_true(ctrl_sched_poll(s) >= 0);
		nanosleep(&ts, NULL);
		assert_true(now_ns() - t_down < 5000000000ull);
	}
	t_end = now_ns();
	printf("the chain never came back: every request ended %.0f ms after the death (replay_timeout 100 ms)\n",
	       (double)(t_end - t_down) / 1e6);
	assert_true(t_end - t_down >= 100000000ull);
	assert_int_equal(got[cancelled].finish, CTRL_FINISH_CANCELLED);
	for (int i = 0; i < N_REQ + 2; i++) {
		assert_int_equal(got[i].done, 1);
		if (i == cancelled || got[i].finish == CTRL_FINISH_LENGTH)
			continue; /* done before the death */
		assert_int_equal(got[i].finish, CTRL_FINISH_ERROR);
		assert_non_null(strstr(got[i].msg, WHY));
		assert_non_null(strstr(got[i].msg, "replay_timeout 0.1 s"));
		assert_non_null(strstr(got[i].msg, "raise [sched] replay_timeout"));
		if (i >= N_REQ)
			assert_non_null(strstr(got[i].msg, "re-forming"));
	}
	assert_int_equal(dc->submits_down, 0);
	ctrl_sched_stats(s, &st);
	assert_int_equal(st.live, 0);
	assert_int_equal(st.queued, 0);
	assert_int_equal(st.replaying, 0);
	assert_int_equal(st.blocks_in_use, 0);
	assert_int_equal(st.blocks_reserved, 0);
	ctrl_sched_destroy(s);
	ctrl_chain_destroy(&dc->base);
}

/* The chain falls at a poll that brought results back: their sequences sit
 * between two rounds (not in flight), so the scheduler's hold takes them as
 * lost, in the same call that expires the replay queue. They wait and run
 * again; before the fix the hold compared its clock, read before the loss,
 * with their later wait stamp, and failed them at once with "did not re-form
 * within replay_timeout" (the fault drill's dataplane and link faults). */
static void a_sequence_between_two_rounds_when_the_chain_falls_runs_again_and_is_not_expired(void **state)
{
	static struct rec ref[N_REQ], got[N_REQ];
	struct dying_chain *dc;
	struct ctrl_sched *s;
	struct ctrl_sched_stats st;

	(void)state;
	undisturbed(ref);
	dc = dying(NULL, 0, 5);
	dc->die_on_return = 24;
	s = sched_on(dc, 2, 30000);
	submit_all(s, got, N_REQ);
	assert_true(drive(s, 100000) > 0);
	assert_int_equal(dc->deaths, 1);
	assert_true(dc->between > 0);
	ctrl_sched_stats(s, &st);
	printf("the chain fell with %d group(s) just back: %llu requests replayed, %llu errors\n", dc->between,
	       (unsigned long long)st.replayed, (unsigned long long)st.errors);
	for (int i = 0; i < N_REQ; i++) {
		assert_int_equal(got[i].done, 1);
		if (got[i].finish != CTRL_FINISH_LENGTH)
			fail_msg("request %d failed: %s", i, got[i].msg);
		assert_int_equal(got[i].n, MAX_TOK);
		assert_memory_equal(got[i].toks, ref[i].toks, sizeof(int32_t) * MAX_TOK);
	}
	assert_true(st.replayed >= 1);
	assert_int_equal(st.errors, 0);
	assert_int_equal(st.replay_failures, 0);
	assert_int_equal(st.blocks_in_use, 0);
	assert_int_equal(st.blocks_reserved, 0);
	ctrl_sched_destroy(s);
	ctrl_chain_destroy(&dc->base);
}

static void with_replay_max_0_a_dead_stage_fails_its_requests_at_once(void **state)
{
	static struct rec ref[N_REQ], got[N_REQ];
	const int64_t die_at[] = { 16 };
	struct dying_chain *dc;
	struct ctrl_sched *s;
	struct ctrl_sched_stats st;
	int failed = 0;

	(void)state;
	undisturbed(ref);
	dc = dying(die_at, 1, -1);
	s = sched_on(dc, 0, 30000);
	submit_all(s, got, N_REQ);
	/* no waiting: the chain never comes back and yet every request ends */
	assert_true(drive(s, 100000) > 0);
	for (int i = 0; i < N_REQ; i++) {
		assert_int_equal(got[i].done, 1);
		if (got[i].finish == CTRL_FINISH_LENGTH) {
			assert_memory_equal(got[i].toks, ref[i].toks, sizeof(int32_t) * MAX_TOK);
			continue;
		}
		failed++;
		assert_int_equal(got[i].finish, CTRL_FINISH_ERROR);
		assert_non_null(strstr(got[i].msg, "stage 1"));
		assert_null(strstr(got[i].msg, "replay"));
	}
	ctrl_sched_stats(s, &st);
	assert_true(failed >= 1);
	assert_int_equal(st.replayed, 0);
	assert_int_equal(st.blocks_in_use, 0);
	ctrl_sched_destroy(s);
	ctrl_chain_destroy(&dc->base);
}

/* Two replicas; replica 0's chain dies after a few launches and never comes
 * back. Its waiting requests move to replica 1 (the dispatcher's poll) and
 * end as if undisturbed; new requests go to replica 1 only; replica 0's
 * load falls back to nothing, and a cancel finds a moved request. */
static void a_replica_whose_chain_died_hands_its_requests_to_one_that_serves_token_for_token(void **state)
{
	static struct rec ref[N_REQ], got[N_REQ];
	const int64_t die_at[] = { 6 };
	struct dying_chain *dc[2] = { dying(die_at, 1, -1), dying(NULL, 0, 0) };
	struct ctrl_sched *s[2];
	struct ctrl_dispatch *d;
	struct ctrl_sched_stats st0, st1;
	struct rec extra = { 0 };
	struct ctrl_request rq;
	int32_t p[64];
	long k;

	(void)state;
	undisturbed(ref);
	for (int i = 0; i < 2; i++) {
		struct ctrl_sched_opts o;
		char err[256];

		ctrl_sched_opts_init(&o);
		o.mb_cols = 8;
		o.replay_timeout_ms = 600000; /* the test must not pass by a timeout */
		o.id_tag = (uint8_t)i;
		s[i] = ctrl_sched_create(&dc[i]->base, &o, err, sizeof(err));
		if (s[i] == NULL)
			fail_msg("ctrl_sched_create: %s", err);
	}
	d = ctrl_dispatch_create(s, 2);
	assert_non_null(d);
	for (int i = 0; i < N_REQ; i++) {
		int32_t np = prompt_of(i, p);

		memset(&got[i], 0, sizeof(got[i]));
		ctrl_request_init(&rq);
		rq.prompt = p;
		rq.n_prompt = np;
		rq.max_tokens = MAX_TOK;
		rq.temperature = i % 2 ? 0.8f : 0.0f;
		rq.seed = (uint32_t)(1000 + i);
		rq.cb = rec_cb;
		rq.cb_arg = &got[i];
		got[i].id = ctrl_dispatch_submit(d, &rq);
		assert_true(got[i].id > 0);
	}
	for (k = 0; k < 200000 && !ctrl_dispatch_drained(d); k++) {
		assert_true(ctrl_dispatch_poll(d) >= 0);
		if (dc[0]->down && extra.id == 0) {
			/* a request arriving now goes to the replica that serves */
			ctrl_request_init(&rq);
			rq.prompt = p;
			rq.n_prompt = prompt_of(0, p);
			rq.max_tokens = MAX_TOK;
			rq.cb = rec_cb;
			rq.cb_arg = &extra;
			extra.id = ctrl_dispatch_submit(d, &rq);
			assert_int_equal(extra.id & 0xff, 1);
		}
	}
	assert_true(ctrl_dispatch_drained(d));
	assert_true(dc[0]->down);
	for (int i = 0; i < N_REQ; i++) {
		assert_int_equal(got[i].finish, CTRL_FINISH_LENGTH);
		assert_int_equal(got[i].n, MAX_TOK);
		assert_memory_equal(got[i].toks, ref[i].toks, sizeof(int32_t) * MAX_TOK);
	}
	assert_int_equal(extra.finish, CTRL_FINISH_LENGTH);
	assert_memory_equal(extra.toks, ref[0].toks, sizeof(int32_t) * MAX_TOK);
	ctrl_sched_stats(s[0], &st0);
	ctrl_sched_stats(s[1], &st1);
	printf("replica 0 died after 6 launches: %llu requests moved to replica 1, %llu replayed, every one equal "
	       "to the undisturbed run\n", (unsigned long long)st0.moved_out, (unsigned long long)st0.replayed);
	assert_true(st0.moved_out > 0);
	assert_int_equal(st0.errors + st1.errors, 0);
	assert_int_equal(st0.live + st0.queued + st0.replaying, 0);
	assert_true(ctrl_sched_load(s[0]) == 0.0 && ctrl_sched_load(s[1]) == 0.0);

	/* a cancel of a request that moved reaches it where it is now */
	memset(&got[0], 0, sizeof(got[0]));
	ctrl_request_init(&rq);
	rq.prompt = p;
	rq.n_prompt = prompt_of(0, p);
	rq.max_tokens = 1000;
	rq.cb = rec_cb;
	rq.cb_arg = &got[0];
	got[0].id = ctrl_sched_submit(s[0], &rq); /* queued where no chain serves */
	assert_true(got[0].id > 0);
	assert_true(ctrl_dispatch_poll(d) >= 0); /* moved */
	assert_int_equal(ctrl_dispatch_cancel(d, (uint64_t)got[0].id), 0);
	for (k = 0; k < 200000 && !ctrl_dispatch_drained(d); k++)
		assert_true(ctrl_dispatch_poll(d) >= 0);
	assert_int_equal(got[0].finish, CTRL_FINISH_CANCELLED);
	ctrl_dispatch_destroy(d);
	for (int i = 0; i < 2; i++) {
		ctrl_sched_destroy(s[i]);
		ctrl_chain_destroy(&dc[i]->base);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_request_whose_stage_died_runs_again_from_its_prompt_and_tokens_and_ends_as_if_undisturbed),
		cmocka_unit_test(a_replayed_prompt_reports_each_positions_logprob_once_as_undisturbed),
		cmocka_unit_test(a_request_lost_more_than_replay_max_times_fails_naming_the_stage_and_the_setting),
		cmocka_unit_test(a_request_waiting_past_replay_timeout_for_the_chain_fails_naming_the_stage),
		cmocka_unit_test(a_sequence_between_two_rounds_when_the_chain_falls_runs_again_and_is_not_expired),
		cmocka_unit_test(with_replay_max_0_a_dead_stage_fails_its_requests_at_once),
		cmocka_unit_test(a_replica_whose_chain_died_hands_its_requests_to_one_that_serves_token_for_token),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
