/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stage chain to kvferry-worker processes over shm rings on one node,
 * on the tiny generated model: the scheduler's output through 2 and 3
 * worker processes equals each request's solo run token for token; the KV
 * pool is negotiated to one count on every stage; a worker holding another
 * model is refused at join naming both; without replays a worker killed
 * mid-request ends its requests with an error within a bound, and the chain
 * re-forms under an idle scheduler's polls alone and serves again once the
 * worker is restarted; with replays those requests run again once it is,
 * and each still equals its solo run.
 * Usage: test_serve_chain PATH-TO-kvferry-worker PATH-TO-kvferry-mkmodel
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctrl_proc_chain.h"
#include "kn_model.h"
#include "kn_stage.h"
#include "sched_harness.h"
#include "shm_pool.h"
#include "shm_region.h"
#include "shm_ring.h"

enum { N = 10, MAXW = 4 };

static const char *g_worker, *g_mkmodel;
static char g_dir[] = "/tmp/kvferry-serve-XXXXXX";
static char g_model[300], g_other[300], g_region[32];
static struct kn_model *g_m;
static struct shm_region *g_reg;
static int32_t g_prompt[N][40], g_len[N], g_max[N];
static float g_temp[N];
static struct rec g_ref[N];
static pid_t g_pids[MAXW];

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The solo run: one whole-model stage, one slot, prompt then one token per step. */
static void solo(int i)
{
	struct kn_stage_opts so;
	struct kn_stage *st;
	struct kn_op ops[4];
	struct kn_column cols[48];
	int32_t toks[48], pos = 0, last = -1;
	char err[256];

	kn_stage_opts_init(&so);
	so.n_slots = 1;
	so.n_blocks = 4;
	so.max_blocks_per_slot = 4;
	so.n_threads = 1;
	st = kn_stage_create(g_m, KN_BACKEND_CPU, &so, err, sizeof(err));
	if (st == NULL)
		fail_msg("kn_stage_create: %s", err);
	for (int b = 0; b < 4; b++)
		ops[b] = (struct kn_op){ .type = KN_OP_SET_BLOCK, .slot = 0, .idx = b, .val = b };
	assert_int_equal(kn_stage_apply_ops(st, ops, 4), 0);
	memset(&g_ref[i], 0, sizeof(g_ref[i]));
	while (g_ref[i].n < g_max[i]) {
		struct kn_step step = { 0 };
		int32_t k = 0;

		do {
			cols[k] = (struct kn_column){ .token = pos < g_len[i] ? g_prompt[i][pos] : last, .pos = pos,
						      .temperature = g_temp[i], .top_p = 1.0f, .seed = (uint32_t)i };
			k++;
			pos++;
		} while (pos < g_len[i]);
		cols[k - 1].flags = KN_COL_NEED_LOGIT;
		step.n_cols = k;
		step.cols = cols;
		step.tokens_out = toks;
		if (kn_stage_step(st, &step) != 0)
			fail_msg("kn_stage_step: %s", kn_stage_error(st));
		last = toks[k - 1];
		g_ref[i].toks[g_ref[i].n++] = last;
	}
	kn_stage_destroy(st);
}

static int setup(void **state)
{
	char cmd[1024], err[256];
	struct shm_region_opts ro;

	(void)state;
	if (access(g_worker, X_OK) != 0 || access(g_mkmodel, X_OK) != 0 || mkdtemp(g_dir) == NULL)
		return -1;
	snprintf(g_model, sizeof(g_model), "%s/tiny", g_dir);
	snprintf(g_other, sizeof(g_other), "%s/other", g_dir);
	snprintf(cmd, sizeof(cmd), "%s --out %s --preset tiny >/dev/null && %s --out %s --preset tiny --seed 7 "
		 ">/dev/null", g_mkmodel, g_model, g_mkmodel, g_other);
	if (system(cmd) != 0)
		return -1;
	g_m = kn_model_open(g_model, err, sizeof(err));
	if (g_m == NULL) {
		fprintf(stderr, "kn_model_open(%s): %s\n", g_model, err);
		return -1;
	}
	for (int i = 0; i < N; i++) {
		uint32_t x = 101u + (uint32_t)i * 7919u;

		g_len[i] = 2 + (i * 11) % 36;
		g_max[i] = 6 + (i * 7) % 24;
		g_temp[i] = i % 4 == 3 ? 0.8f : 0.0f;
		for (int32_t p = 0; p < g_len[i]; p++) {
			x = x * 1103515245u + 12345u;
			g_prompt[i][p] = (int32_t)((x >> 16) % (uint32_t)kn_model_config(g_m)->vocab_size);
		}
		solo(i);
	}
	snprintf(g_region, sizeof(g_region), "kvfserve%d", (int)getpid());
	shm_region_opts_init(&ro);
	ro.name = g_region;
	ro.size = 48u << 20;
	ro.quiet = 1;
	g_reg = shm_region_create(&ro, err, sizeof(err));
	if (g_reg == NULL) {
		fprintf(stderr, "shm_region_create(%s): %s\n", g_region, err);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	char cmd[512];

	(void)state;
	kn_model_close(g_m);
	shm_region_detach(g_reg);
	shm_region_unlink(g_region);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
	return system(cmd) == 0 ? 0 : -1;
}

/* Start the worker of stage k of n (rings serve.s<k>.in → next / serve.ret). */
static pid_t start_worker(int k, int n, const char *model, const char *kv_mib)
{
	char in[64], out[64], role[32];
	pid_t pid;

	snprintf(in, sizeof(in), "ring:serve.s%d.in", k);
	if (k == n - 1)
		snprintf(out, sizeof(out), "ring:serve.ret");
	else
		snprintf(out, sizeof(out), "ring:serve.s%d.in", k + 1);
	snprintf(role, sizeof(role), "stage%d", k);
	pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM); /* a failed test leaves no worker behind */
		execl(g_worker, g_worker, "--region", g_region, "--model", model, "--in", in, "--out", out,
		      "--role", role, "--threads", "1", "--kv-mib", kv_mib, "--wait", "10", (char *)NULL);
		_exit(127);
	}
	assert_true(pid > 0);
	return pid;
}

/* SIGTERM a worker; @return its exit status (0: it shut down cleanly). */
static int stop_worker(pid_t pid)
{
	int st = 0;

	kill(pid, SIGTERM);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	for (int k = 0; k < MAXW; k++)
		if (g_pids[k] == pid)
			g_pids[k] = 0;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* After each test, pass or fail: no worker of it outlives it. */
static int reap_workers(void **state)
{
	(void)state;
	for (int k = 0; k < MAXW; k++)
		if (g_pids[k] > 0) {
			kill(g_pids[k], SIGKILL);
			waitpid(g_pids[k], NULL, 0);
			g_pids[k] = 0;
		}
	return 0;
}

static struct ctrl_chain *chain(int n, const int32_t *ends, char *err, size_t errlen)
{
	struct ctrl_proc_chain_opts o;

	ctrl_proc_chain_opts_init(&o);
	o.region = g_region;
	o.n_stages = n;
	if (ends != NULL)
		memcpy(o.layer_ends, ends, sizeof(int32_t) * (size_t)n);
	o.stage.n_slots = 8;
	o.stage.n_blocks = -1;
	o.stage.max_blocks_per_slot = 4;
	o.stage.plan_widths[0] = 8;
	o.stage.plan_widths[1] = 48;
	o.stage.n_plans = 2;
	o.stage.n_threads = 1;
	o.max_groups = 8;
	o.join_timeout_ms = 15000;
	o.group_timeout_ms = 5000;
	o.stale_ms = 1000;
	return ctrl_proc_chain_create(g_m, &o, err, errlen);
}

/* Two workers (4 MiB of KV each) and the chain over them. */
static struct ctrl_chain *two_stage_chain(void)
{
	struct ctrl_chain *c;
	char err[512];

	for (int k = 0; k < 2; k++)
		g_pids[k] = start_worker(k, 2, g_model, "4");
	c = chain(2, NULL, err, sizeof(err));
	if (c == NULL)
		fail_msg("ctrl_proc_chain_create: %s", err);
	return c;
}

/* @p replay_max: ctrl_sched_opts'; -1 its default. */
static struct ctrl_sched *sched(struct ctrl_chain *c, int32_t replay_max)
{
	struct ctrl_sched_opts o;
	struct ctrl_sched *s;
	char err[256];

	ctrl_sched_opts_init(&o);
	o.mb_cols = 8;
	if (replay_max >= 0)
		o.replay_max = replay_max;
	s = ctrl_sched_create(c, &o, err, sizeof(err));
	if (s == NULL)
		fail_msg("ctrl_sched_create: %s", err);
	return s;
}

/* Poll until drained or @p bound_ms; sleeps a little so workers get the CPU. */
static int drain(struct ctrl_sched *s, uint64_t bound_ms)
{
	uint64_t t0 = now_ns();
	struct timespec ts = { 0, 50000 };

	while (!ctrl_sched_drained(s)) {
		assert_true(ctrl_sched_poll(s) >= 0);
		if (now_ns() - t0 > bound_ms * 1000000ull)
			return -1;
		nanosleep(&ts, NULL);
	}
	return 0;
}

static void submit_all(struct ctrl_sched *s, struct rec *got)
{
	memset(got, 0, sizeof(*got) * N);
	for (int i = 0; i < N; i++)
		assert_true(submit_rec(s, &got[i], g_prompt[i], g_len[i], g_max[i], g_temp[i], (uint32_t)i) > 0);
}

static void check_all(const struct rec *got)
{
	for (int i = 0; i < N; i++) {
		if (got[i].finish != CTRL_FINISH_LENGTH)
			fail_msg("request %d ended %s: %s", i, ctrl_finish_name(got[i].finish), got[i].msg);
		assert_int_equal(got[i].n, g_ref[i].n);
		assert_memory_equal(got[i].toks, g_ref[i].toks, sizeof(int32_t) * (size_t)g_ref[i].n);
	}
}

static void run_equal(int n, const int32_t *ends)
{
	static struct rec got[N];
	struct ctrl_chain *c;
	struct ctrl_sched *s;
	char err[512];

	for (int k = 0; k < n; k++)
		g_pids[k] = start_worker(k, n, g_model, "4");
	c = chain(n, ends, err, sizeof(err));
	if (c == NULL)
		fail_msg("ctrl_proc_chain_create: %s", err);
	s = sched(c, -1);
	submit_all(s, got);
	assert_int_equal(drain(s, 60000), 0);
	check_all(got);
	ctrl_sched_destroy(s);
	ctrl_chain_destroy(c);
	for (int k = 0; k < n; k++)
		assert_int_equal(stop_worker(g_pids[k]), 0);
}

static void every_request_equals_its_solo_run_through_two_worker_processes(void **state)
{
	(void)state;
	run_equal(2, NULL);
}

static void every_request_equals_its_solo_run_through_three_workers_with_explicit_ranges(void **state)
{
	static const int32_t ends[3] = { 1, 2, 3 };

	(void)state;
	run_equal(3, ends);
}

static void layer_ranges_that_do_not_tile_the_model_are_refused_before_any_worker_is_asked(void **state)
{
	int32_t gap[2] = { 1, 2 }, back[2] = { 2, 1 }, even[3] = { 0, 0, 0 };
	char err[256];

	(void)state;
	assert_int_equal(ctrl_proc_chain_layers(3, 2, gap, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "must end at 3"));
	assert_int_equal(ctrl_proc_chain_layers(3, 2, back, err, sizeof(err)), -EINVAL);
	assert_int_equal(ctrl_proc_chain_layers(3, 4, even, err, sizeof(err)), -EINVAL);
	assert_int_equal(ctrl_proc_chain_layers(16, 3, even, err, sizeof(err)), 0);
	assert_int_equal(even[0], 5);
	assert_int_equal(even[1], 10);
	assert_int_equal(even[2], 16);
}

static void every_stage_holds_the_least_block_count_any_worker_can_hold(void **state)
{
	struct ctrl_chain *c;
	struct ctrl_chain_info ci;
	struct ctrl_proc_stage ps[2];
	int32_t small, big;
	char err[512];

	(void)state;
	/* Stage 1 gets a quarter of stage 0's budget: the chain must use its count. */
	g_pids[0] = start_worker(0, 2, g_model, "4");
	g_pids[1] = start_worker(1, 2, g_model, "1");
	c = chain(2, NULL, err, sizeof(err));
	if (c == NULL)
		fail_msg("ctrl_proc_chain_create: %s", err);
	ctrl_chain_info(c, &ci);
	assert_int_equal(ctrl_proc_chain_stage(c, 0, &ps[0]), 0);
	assert_int_equal(ctrl_proc_chain_stage(c, 1, &ps[1]), 0);
	assert_int_equal(ps[0].n_blocks, ci.n_blocks);
	assert_int_equal(ps[1].n_blocks, ci.n_blocks);
	small = ci.n_blocks;
	ctrl_chain_destroy(c);
	assert_int_equal(stop_worker(g_pids[1]), 0);
	g_pids[1] = start_worker(1, 2, g_model, "4");
	c = chain(2, NULL, err, sizeof(err));
	if (c == NULL)
		fail_msg("ctrl_proc_chain_create: %s", err);
	ctrl_chain_info(c, &ci);
	big = ci.n_blocks;
	ctrl_chain_destroy(c);
	for (int k = 0; k < 2; k++)
		assert_int_equal(stop_worker(g_pids[k]), 0);
	printf("negotiated %d blocks with a 1 MiB stage, %d with 4 MiB stages\n", small, big);
	assert_true(small > 0);
	assert_true(small < big);
}

static void a_worker_holding_another_model_is_refused_at_join_naming_both(void **state)
{
	struct ctrl_chain *c;
	char err[512], fp[32];

	(void)state;
	g_pids[0] = start_worker(0, 2, g_model, "4");
	g_pids[1] = start_worker(1, 2, g_other, "4");
	c = chain(2, NULL, err, sizeof(err));
	assert_null(c);
	assert_int_equal(errno, EPROTO);
	printf("refused: %s\n", err);
	snprintf(fp, sizeof(fp), "%016llx", (unsigned long long)kn_model_fingerprint(g_m));
	assert_non_null(strstr(err, "stage1"));
	assert_non_null(strstr(err, fp));
	assert_non_null(strstr(err, g_other));
	assert_non_null(strstr(err, g_model)); /* ctrld's side too */
	for (int k = 0; k < 2; k++)
		assert_int_equal(stop_worker(g_pids[k]), 0);
}

/* Two workers, every request submitted through a scheduler of @p replay_max;
 * once some tokens flowed, SIGKILL the stage-1 worker and reap it.
 * @return the scheduler (its chain in @p c), the tokens by then in @p tokens. */
static struct ctrl_sched *kill_stage1_mid_request(int32_t replay_max, struct rec *got, struct ctrl_chain **c,
						  long *tokens_out)
{
	struct ctrl_sched *s;
	long tokens;
	int st;

	*c = two_stage_chain();
	s = sched(*c, replay_max);
	submit_all(s, got);
	do {
		struct timespec ts = { 0, 50000 };

		tokens = 0;
		assert_true(ctrl_sched_poll(s) >= 0);
		for (int i = 0; i < N; i++)
			tokens += got[i].n;
		nanosleep(&ts, NULL);
	} while (tokens < 12);
	kill(g_pids[1], SIGKILL);
	waitpid(g_pids[1], &st, 0);
	*tokens_out = tokens;
	return s;
}

static void a_killed_worker_fails_its_requests_within_a_bound_and_the_chain_serves_after_restart(void **state)
{
	static struct rec got[N];
	struct ctrl_chain *c;
	struct ctrl_sched *s;
	struct ctrl_proc_stage ps;
	uint64_t t_kill, t_end;
	int errors = 0;
	long tokens;

	(void)state;
	s = kill_stage1_mid_request(0, got, &c, &tokens); /* the behaviour without replays */
	g_pids[1] = 0;
	t_kill = now_ns();
	assert_int_equal(drain(s, 10000), 0);
	t_end = now_ns();
	for (int i = 0; i < N; i++) {
		if (got[i].finish == CTRL_FINISH_ERROR) {
			errors++;
			assert_non_null(strstr(got[i].msg, "stage 1"));
		} else {
			/* finished before the kill: must still be the right tokens */
			assert_int_equal(got[i].finish, CTRL_FINISH_LENGTH);
			assert_memory_equal(got[i].toks, g_ref[i].toks, sizeof(int32_t) * (size_t)g_ref[i].n);
		}
	}
	printf("killed stage 1 after %ld tokens: %d requests ended with an error %.0f ms later\n", tokens,
	       errors, (double)(t_end - t_kill) / 1e6);
	assert_true(errors > 0);
	assert_true(t_end - t_kill < 3000000000ull);
	/* Restart the worker: the chain re-forms by itself, then serves. */
	g_pids[1] = start_worker(1, 2, g_model, "4");
	t_kill = now_ns();
	do {
		struct timespec ts = { 0, 1000000 };

		/* Only the idle scheduler's poll ticks the chain here: it must
		 * re-form before any traffic comes. */
		assert_true(ctrl_sched_poll(s) >= 0);
		assert_int_equal(ctrl_proc_chain_stage(c, 1, &ps), 0);
		nanosleep(&ts, NULL);
		if (now_ns() - t_kill > 20000000000ull)
			fail_msg("the chain did not re-form within 20 s of the restart");
	} while (!ps.up);
	assert_int_equal(ps.pid, g_pids[1]);
	submit_all(s, got);
	assert_int_equal(drain(s, 60000), 0);
	check_all(got);
	ctrl_sched_destroy(s);
	ctrl_chain_destroy(c);
	for (int k = 0; k < 2; k++)
		assert_int_equal(stop_worker(g_pids[k]), 0);
}

static void a_killed_workers_requests_run_again_once_it_is_restarted_and_equal_their_solo_runs(void **state)
{
	static struct rec got[N];
	struct ctrl_chain *c;
	struct ctrl_sched *s;
	struct ctrl_sched_stats st;
	uint64_t t_kill, t_end;
	long tokens;

	(void)state;
	s = kill_stage1_mid_request(2, got, &c, &tokens);
	t_kill = now_ns();
	/* about the time systemd takes to restart it (RestartSec=1 would be more) */
	while (now_ns() - t_kill < 300000000ull) {
		struct timespec ts = { 0, 1000000 };

		assert_true(ctrl_sched_poll(s) >= 0);
		nanosleep(&ts, NULL);
	}
	for (int i = 0; i < N; i++)
		if (got[i].done)
			assert_int_equal(got[i].finish, CTRL_FINISH_LENGTH); /* nothing failed meanwhile */
	g_pids[1] = start_worker(1, 2, g_model, "4");
	assert_int_equal(drain(s, 60000), 0);
	t_end = now_ns();
	check_all(got); /* every request: its solo tokens, each once */
	ctrl_sched_stats(s, &st);
	printf("killed stage 1 after %ld tokens, restarted it 0.3 s later: %llu requests replayed, all %d ended "
	       "as their solo runs %.0f ms after the kill\n", tokens, (unsigned long long)st.replayed, N,
	       (double)(t_end - t_kill) / 1e6);
	assert_true(st.replayed > 0);
	assert_int_equal(st.errors, 0);
	assert_int_equal(st.blocks_in_use, 0);
	ctrl_sched_destroy(s);
	ctrl_chain_destroy(c);
	for (int k = 0; k < 2; k++)
		assert_int_equal(stop_worker(g_pids[k]), 0);
}

/* Poll @p c until group @p g comes back (bounded). */
static void chain_wait(struct ctrl_chain *c, uint32_t g, struct ctrl_chain_result *r)
{
	uint64_t t0 = now_ns();

	for (;;) {
		struct timespec ts = { 0, 100000 };

		if (ctrl_chain_poll(c, r, 1) == 1) {
			assert_int_equal(r->group, g);
			return;
		}
		if (now_ns() - t0 > 10000000000ull)
			fail_msg("group %u did not come back within 10 s", g);
		nanosleep(&ts, NULL);
	}
}

static void after_a_restart_a_lost_slot_fails_alone_and_its_micro_batch_neighbour_is_computed(void **state)
{
	struct ctrl_chain *c;
	struct ctrl_chain_result r;
	struct ctrl_proc_stage ps;
	struct kn_column cols[48];
	struct kn_op ops[4];
	int32_t n;
	uint64_t t0;
	int st;

	(void)state;
	c = two_stage_chain();
	/* Slot 0 holds request 0's prompt before the restart. */
	ops[0] = (struct kn_op){ .type = KN_OP_ZERO_SLOT, .slot = 0 };
	ops[1] = (struct kn_op){ .type = KN_OP_SET_BLOCK, .slot = 0, .idx = 0, .val = 0 };
	for (n = 0; n < g_len[0]; n++)
		cols[n] = (struct kn_column){ .token = g_prompt[0][n], .pos = n, .slot = 0, .top_p = 1.0f };
	cols[n - 1].flags = KN_COL_NEED_LOGIT;
	assert_int_equal(ctrl_chain_submit(c, 0, cols, n, ops, 2), 0);
	chain_wait(c, 0, &r);
	assert_int_equal(r.status, 0);
	assert_int_equal(r.tokens[n - 1], g_ref[0].toks[0]);
	kill(g_pids[1], SIGKILL);
	waitpid(g_pids[1], &st, 0);
	g_pids[1] = start_worker(1, 2, g_model, "4");
	t0 = now_ns();
	do {
		struct timespec ts = { 0, 1000000 };

		assert_true(ctrl_chain_poll(c, &r, 0) >= 0);
		assert_int_equal(ctrl_proc_chain_stage(c, 1, &ps), 0);
		nanosleep(&ts, NULL);
		if (now_ns() - t0 > 20000000000ull)
			fail_msg("the chain did not re-form within 20 s of the restart");
	} while (!ps.up || ps.pid != g_pids[1]);
	/* One micro-batch: slot 0's next token (its KV is gone with stage 1)
	 * and a fresh slot 1 with request 1's whole prompt. */
	cols[0] = (struct kn_column){ .token = g_ref[0].toks[0], .pos = g_len[0], .slot = 0,
				      .flags = KN_COL_NEED_LOGIT, .top_p = 1.0f };
	ops[0] = (struct kn_op){ .type = KN_OP_ZERO_SLOT, .slot = 1 };
	ops[1] = (struct kn_op){ .type = KN_OP_SET_BLOCK, .slot = 1, .idx = 0, .val = 2 };
	for (n = 0; n < g_len[1]; n++)
		cols[1 + n] = (struct kn_column){ .token = g_prompt[1][n], .pos = n, .slot = 1, .top_p = 1.0f,
						  .seed = 1 };
	/* ... asking for 5 top logprobs, which the last worker adds to the result */
	cols[n].flags = KN_COL_NEED_LOGIT | (5u << KN_COL_TOPK_SHIFT);
	assert_int_equal(ctrl_chain_submit(c, 1, cols, 1 + n, ops, 2), 0);
	chain_wait(c, 1, &r);
	printf("mixed micro-batch after the restart: status %d, %d failed column(s): %s\n", r.status,
	       r.n_failed_cols, r.err);
	assert_int_equal(r.status, 0);
	assert_int_equal(r.n_cols, 1 + n);
	assert_non_null(r.col_status);
	assert_int_equal(r.n_failed_cols, 1);
	assert_int_equal(r.col_status[0], -EPIPE);
	assert_int_equal(r.tokens[0], -1);
	assert_non_null(strstr(r.err, "slot 0"));
	for (int32_t i = 1; i <= n; i++)
		assert_int_equal(r.col_status[i], 0);
	assert_int_equal(r.tokens[n], g_ref[1].toks[0]);
	assert_int_equal(r.n_logprobs, 5);
	assert_int_equal(r.top_ids[(size_t)n * 5], r.tokens[n]); /* greedy: the best is the token */
	assert_true(fabsf(r.top_logprobs[(size_t)n * 5] - r.logprobs[n]) < 1e-6f);
	for (int t = 1; t < 5; t++)
		assert_true(r.top_logprobs[(size_t)n * 5 + (size_t)t] <= r.top_logprobs[(size_t)n * 5 + (size_t)t - 1]);
	ctrl_chain_destroy(c);
	for (int k = 0; k < 2; k++)
		assert_int_equal(stop_worker(g_pids[k]), 0);
}

/*
 * ctrl_chain_kv_copies() over worker processes: a batch of page exports in
 * one chain message (more copies than one message holds: it is split) gives
 * the bytes each export alone gives; a batch of imports lands every copy
 * (the last one written to a block wins); a copy outside the region is
 * refused before anything is sent, and the chain still moves pages after.
 * Copies go on the stage's KV side ring, straight to it: stage 1's are
 * answered while stage 0 is stopped (in band they passed through it), and
 * garbage put there is dropped without harm.
 */
static void a_batch_of_page_copies_moves_the_bytes_each_copy_alone_moves(void **state)
{
	enum { NC = 1300 }; /* 1300 x (6 + 1) words: more than one message holds */
	static struct rec got[N];
	static struct ctrl_kv_copy v[NC];
	static int32_t ids[NC];
	struct ctrl_chain_info ci;
	struct kn_kv_format f;
	struct ctrl_chain *c;
	struct ctrl_sched *s;
	struct shm_pool *p;
	uint8_t *one, outside[64];
	uint64_t t0, took_ms;
	struct shm_ring *side;
	struct shm_desc bad[3];
	uint32_t idx;
	int rc;
	size_t nonzero = 0;

	(void)state;
	c = two_stage_chain();
	s = sched(c, -1);
	submit_all(s, got); /* the pools' blocks now hold KV */
	assert_int_equal(drain(s, 60000), 0);
	check_all(got);
	ctrl_chain_info(c, &ci);
	assert_int_equal(ctrl_chain_kv_format(c, 1, &f), 0);
	p = shm_pool_create(ctrl_proc_chain_region(c), "t.kvcopies", NC + 1, f.block_bytes);
	assert_non_null(p);
	for (int i = 0; i < NC; i++) {
		assert_int_equal(shm_pool_get(p, &idx), 0);
		ids[i] = i % ci.n_blocks;
		v[i] = (struct ctrl_kv_copy){ .blocks = &ids[i], .n = 1, .buf = shm_pool_buf(p, idx),
					      .len = f.block_bytes };
	}
	assert_int_equal(shm_pool_get(p, &idx), 0);
	one = shm_pool_buf(p, idx);
	assert_int_equal(ctrl_chain_kv_copies(c, 1, 0, v, NC, NULL), 0);
	for (int i = 0; i < ci.n_blocks; i++) {
		assert_int_equal(ctrl_chain_kv_export(c, 1, &ids[i], 1, one, f.block_bytes), 0);
		assert_memory_equal(one, v[i].buf, f.block_bytes);
		for (size_t b = 0; b < f.block_bytes; b++)
			nonzero += ((uint8_t *)v[i].buf)[b] != 0;
	}
	assert_true(nonzero > f.block_bytes); /* real KV, not empty blocks */
	assert_memory_equal(v[NC - 1].buf, v[(NC - 1) % ci.n_blocks].buf, f.block_bytes);

	/* in: copy i into block (i + 7) mod n; the last copy to a block wins */
	for (int i = 0; i < NC; i++)
		ids[i] = (i + 7) % ci.n_blocks;
	assert_int_equal(ctrl_chain_kv_copies(c, 1, 1, v, NC, &f), 0);
	for (int b = 0; b < ci.n_blocks; b++) {
		int last = -1;

		for (int i = 0; i < NC; i++)
			if (ids[i] == b)
				last = i;
		assert_int_equal(ctrl_chain_kv_export(c, 1, &b, 1, one, f.block_bytes), 0);
		assert_memory_equal(one, v[last].buf, f.block_bytes);
	}

	v[1].buf = outside; /* not in the region */
	assert_int_equal(ctrl_chain_kv_copies(c, 1, 0, v, 3, NULL), -EFAULT);
	assert_int_equal(ctrl_chain_kv_copies(c, 1, 0, v + 2, 3, NULL), 0);

	assert_int_equal(kill(g_pids[0], SIGSTOP), 0);
	t0 = now_ns();
	rc = ctrl_chain_kv_copies(c, 1, 0, v + 2, 16, NULL);
	took_ms = (now_ns() - t0) / 1000000;
	assert_int_equal(kill(g_pids[0], SIGCONT), 0);
	assert_int_equal(rc, 0);
	printf("16 page copies of stage 1 with stage 0 stopped: %llu ms\n", (unsigned long long)took_ms);
	assert_true(took_ms < 500); /* no waiting on stage 0 */

	/* garbage on the side ring (outside the region, shorter than a header,
	 * random bytes) is dropped: the worker lives and answers the next copy */
	side = shm_ring_lookup(ctrl_proc_chain_region(c), "serve.s1.in.kv");
	assert_non_null(side);
	for (size_t b = 0; b < f.block_bytes; b++)
		one[b] = (uint8_t)(b * 131u + 7u);
	bad[0] = (struct shm_desc){ .off = (uint64_t)1 << 40, .len = 4096 };
	bad[1] = (struct shm_desc){ .off = shm_off(ctrl_proc_chain_region(c), one), .len = 16 };
	bad[2] = (struct shm_desc){ .off = shm_off(ctrl_proc_chain_region(c), one), .len = (uint32_t)f.block_bytes };
	assert_int_equal(shm_ring_enqueue_burst(side, bad, 3), 3);
	shm_ring_close(side);
	assert_int_equal(ctrl_chain_kv_copies(c, 1, 0, v + 2, 4, NULL), 0);
	assert_int_equal(kill(g_pids[1], 0), 0);
	shm_pool_close(p);
	ctrl_sched_destroy(s);
	ctrl_chain_destroy(c);
	for (int k = 0; k < 2; k++)
		assert_int_equal(stop_worker(g_pids[k]), 0);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(layer_ranges_that_do_not_tile_the_model_are_refused_before_any_worker_is_asked, reap_workers),
		cmocka_unit_test_teardown(every_request_equals_its_solo_run_through_two_worker_processes, reap_workers),
		cmocka_unit_test_teardown(every_request_equals_its_solo_run_through_three_workers_with_explicit_ranges, reap_workers),
		cmocka_unit_test_teardown(every_stage_holds_the_least_block_count_any_worker_can_hold, reap_workers),
		cmocka_unit_test_teardown(a_worker_holding_another_model_is_refused_at_join_naming_both, reap_workers),
		cmocka_unit_test_teardown(a_killed_worker_fails_its_requests_within_a_bound_and_the_chain_serves_after_restart, reap_workers),
		cmocka_unit_test_teardown(after_a_restart_a_lost_slot_fails_alone_and_its_micro_batch_neighbour_is_computed, reap_workers),
		cmocka_unit_test_teardown(a_killed_workers_requests_run_again_once_it_is_restarted_and_equal_their_solo_runs, reap_workers),
		cmocka_unit_test_teardown(a_batch_of_page_copies_moves_the_bytes_each_copy_alone_moves, reap_workers),
	};

	if (argc < 3) {
		fprintf(stderr, "usage: %s PATH-TO-kvferry-worker PATH-TO-kvferry-mkmodel\n", argv[0]);
		return 2;
	}
	g_worker = argv[1];
	g_mkmodel = argv[2];
	return cmocka_run_group_tests(tests, setup, teardown);
}
