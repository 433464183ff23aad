/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Scheduler benchmark (suite perf; prints, never asserts time):
 *  1. scheduler CPU time per launched micro-batch with 192 live slots, the
 *     fake chain's own time measured and subtracted;
 *  2. simulated pipeline occupancy against the ideal for p = 2, 4, 8 stages
 *     and several group counts (fake chain, virtual time, equal stage costs);
 *  3. bytes held per queued and per live request.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrl_chain.h"
#include "ctrl_sched.h"
#include "sched_int.h"

static uint64_t ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- a timing chain: forwards, and sums the time spent inside the chain ---- */

struct timed_chain {
	struct ctrl_chain base;
	struct ctrl_chain *inner;
	uint64_t in_chain_ns;
};

static int tc_info(struct ctrl_chain *c, struct ctrl_chain_info *i)
{
	return ctrl_chain_info(((struct timed_chain *)c)->inner, i);
}

static int tc_submit(struct ctrl_chain *c, uint32_t g, const struct kn_column *cols, int32_t n,
		     const struct kn_op *ops, int32_t n_ops)
{
	struct timed_chain *t = (struct timed_chain *)c;
	uint64_t t0 = ns(CLOCK_MONOTONIC);
	int rc = ctrl_chain_submit(t->inner, g, cols, n, ops, n_ops);

	t->in_chain_ns += ns(CLOCK_MONOTONIC) - t0;
	return rc;
}

static int tc_poll(struct ctrl_chain *c, struct ctrl_chain_result *o, int max)
{
	struct timed_chain *t = (struct timed_chain *)c;
	uint64_t t0 = ns(CLOCK_MONOTONIC);
	int rc = ctrl_chain_poll(t->inner, o, max);

	t->in_chain_ns += ns(CLOCK_MONOTONIC) - t0;
	return rc;
}

static int tc_stats(struct ctrl_chain *c, struct ctrl_chain_stats *st)
{
	return ctrl_chain_stats(((struct timed_chain *)c)->inner, st);
}

static void tc_destroy(struct ctrl_chain *c)
{
	ctrl_chain_destroy(((struct timed_chain *)c)->inner);
	free(c);
}

static const struct ctrl_chain_vtbl tc_vtbl = {
	.name = "timed", .info = tc_info, .submit = tc_submit, .poll = tc_poll,
	.stats = tc_stats, .destroy = tc_destroy,
};

/* ---- a client that replaces every finished request with a new one ---- */

struct client {
	struct ctrl_sched *s;
	int32_t prompt[256];
	int32_t n_prompt, max_tokens;
	int refill;
	uint64_t done;
};

static void client_cb(void *arg, const struct ctrl_event *ev);

static void client_submit(struct client *c, uint32_t k)
{
	struct ctrl_request rq;

	ctrl_request_init(&rq);
	for (int32_t i = 0; i < c->n_prompt; i++)
		c->prompt[i] = (int32_t)((k * 31u + (uint32_t)i * 7u) % 64u);
	rq.prompt = c->prompt;
	rq.n_prompt = c->n_prompt;
	rq.max_tokens = c->max_tokens;
	rq.cb = client_cb;
	rq.cb_arg = c;
	if (ctrl_sched_submit(c->s, &rq) < 0)
		fprintf(stderr, "bench: ctrl_sched_submit failed\n");
}

static void client_cb(void *arg, const struct ctrl_event *ev)
{
	struct client *c = arg;

	if (ev->finish == CTRL_FINISH_NONE)
		return;
	c->done++;
	if (c->refill)
		client_submit(c, (uint32_t)c->done);
}

static struct ctrl_chain *fake_link(int32_t p, int32_t slots, int32_t blocks, int32_t mbps, uint64_t link_ns)
{
	struct ctrl_fake_chain_opts fo;

	ctrl_fake_chain_opts_init(&fo);
	fo.n_stages = p;
	fo.n_slots = slots;
	fo.n_blocks = blocks;
	fo.max_blocks_per_slot = mbps;
	fo.max_groups = 32;
	fo.link_ns = link_ns;
	return ctrl_fake_chain_create(&fo);
}

static struct ctrl_chain *fake(int32_t p, int32_t slots, int32_t blocks, int32_t mbps)
{
	return fake_link(p, slots, blocks, mbps, 0);
}

static void bench_cpu_per_launch(int32_t mb_cols, int spec)
{
	struct timed_chain *tc = calloc(1, sizeof(*tc));
	struct ctrl_sched_opts o;
	struct ctrl_sched_stats st;
	struct client cl = { .n_prompt = 64, .max_tokens = 256, .refill = 1 };
	char err[256];
	uint64_t cpu0, cpu1, chain0, l0, l1;

	tc->base.vt = &tc_vtbl;
	tc->inner = fake(4, 192, 192 * 20, 32);
	ctrl_sched_opts_init(&o);
	o.mb_cols = mb_cols;
	o.spec = spec;
	o.spec_c_half = 256; /* keep speculation on at 192 live, to price the lookup */
	cl.s = ctrl_sched_create(&tc->base, &o, err, sizeof(err));
	if (cl.s == NULL) {
		fprintf(stderr, "bench: %s\n", err);
		exit(1);
	}
	for (uint32_t k = 0; k < 192; k++)
		client_submit(&cl, 1000 + k);
	/* Warm up until every slot is live and decoding. */
	for (int k = 0; k < 2000; k++)
		ctrl_sched_poll(cl.s);
	ctrl_sched_stats(cl.s, &st);
	l0 = st.launches;
	chain0 = tc->in_chain_ns;
	cpu0 = ns(CLOCK_THREAD_CPUTIME_ID);
	for (int k = 0; k < 40000; k++)
		ctrl_sched_poll(cl.s);
	cpu1 = ns(CLOCK_THREAD_CPUTIME_ID);
	ctrl_sched_stats(cl.s, &st);
	l1 = st.launches;
	printf("| %d | %s | %d | %llu | %.2f | %.2f | %.2f | %.1f |\n", mb_cols, spec ? "on" : "off", st.live,
	       (unsigned long long)(l1 - l0), (double)(cpu1 - cpu0) / 1000.0 / (double)(l1 - l0),
	       (double)(tc->in_chain_ns - chain0) / 1000.0 / (double)(l1 - l0),
	       ((double)(cpu1 - cpu0) - (double)(tc->in_chain_ns - chain0)) / 1000.0 / (double)(l1 - l0),
	       (double)st.launched_cols / (double)st.launches);
	ctrl_sched_destroy(cl.s);
	ctrl_chain_destroy(&tc->base);
}

static void bench_occupancy(int32_t p, int32_t groups, uint64_t link_ns)
{
	struct ctrl_chain *c = fake_link(p, 128, 128 * 20, 32, link_ns);
	struct ctrl_sched_opts o;
	struct ctrl_sched_stats st;
	struct client cl = { .n_prompt = 16, .max_tokens = 128, .refill = 0 };
	char err[256];

	ctrl_sched_opts_init(&o);
	o.mb_cols = 8;
	o.spec = 0;
	o.force_groups = groups;
	cl.s = ctrl_sched_create(c, &o, err, sizeof(err));
	if (cl.s == NULL) {
		fprintf(stderr, "bench: %s\n", err);
		exit(1);
	}
	for (uint32_t k = 0; k < 128; k++)
		client_submit(&cl, k);
	while (!ctrl_sched_drained(cl.s))
		ctrl_sched_poll(cl.s);
	ctrl_sched_stats(cl.s, &st);
	printf("| %d | %.0f | %d | %s | %.3f | %.3f | %.3f |\n", p, (double)link_ns / 1000.0, st.n_groups, groups == p + 1 ? "p+1" : groups == 1 ? "1" : groups == p ? "p" : "2p",
	       st.occupancy, st.ideal_occupancy, st.occupancy / st.ideal_occupancy);
	ctrl_sched_destroy(cl.s);
	ctrl_chain_destroy(c);
}

static void bench_memory(void)
{
	struct ctrl_chain *c = fake(2, 64, 64 * 20, 32);
	struct ctrl_sched_opts o;
	struct ctrl_sched_stats st;
	struct client cl = { .n_prompt = 64, .max_tokens = 256, .refill = 0 };
	char err[256];

	ctrl_sched_opts_init(&o);
	cl.s = ctrl_sched_create(c, &o, err, sizeof(err));
	if (cl.s == NULL) {
		fprintf(stderr, "bench: %s\n", err);
		exit(1);
	}
	for (uint32_t k = 0; k < 64 + 1000; k++)
		client_submit(&cl, k);
	ctrl_sched_poll(cl.s);
	ctrl_sched_stats(cl.s, &st);
	printf("\nmemory (prompt 64, max_tokens 256, 64 slots x 32 blocks/slot):\n");
	printf("  per queued request: %.0f bytes (%zu + 4 x (prompt + stop ids))\n",
	       (double)st.queued_bytes / (double)st.queued, sizeof(struct sched_req));
	printf("  per live request:   %.0f bytes (%zu + 4 x (prompt + max_tokens + stop ids))\n",
	       (double)st.live_bytes / (double)st.live, sizeof(struct sched_req));
	printf("  per slot, fixed:    %zu bytes (%zu + 4 x max_blocks_per_slot)\n",
	       sizeof(struct sched_slot) + 4u * 32u, sizeof(struct sched_slot));
	printf("  (queued %d, live %d)\n", st.queued, st.live);
	ctrl_sched_destroy(cl.s);
	ctrl_chain_destroy(c);
}

int main(void)
{
	printf("scheduler CPU per launched micro-batch, 192 live slots, 4-stage fake chain (virtual time):\n\n");
	printf("| mb_cols | spec | live | launches | total µs/launch | fake chain µs/launch | scheduler µs/launch | cols/launch |\n");
	printf("|---|---|---|---|---|---|---|---|\n");
	bench_cpu_per_launch(32, 0);
	bench_cpu_per_launch(64, 0);
	bench_cpu_per_launch(32, 1);
	printf("\nsimulated occupancy (fake chain, equal stage costs, 128 requests x 128 tokens, mb_cols 8):\n\n");
	printf("stage step 100 µs; link = scheduler <-> chain latency each way\n\n");
	printf("| p | link µs | groups | rule | occupancy | ideal | ratio |\n|---|---|---|---|---|---|---|\n");
	for (int32_t p = 2; p <= 8; p *= 2) {
		bench_occupancy(p, 1, 0);
		bench_occupancy(p, p, 0);
		bench_occupancy(p, p + 1, 0);
		bench_occupancy(p, p, 20000);
		bench_occupancy(p, p + 1, 20000);
		bench_occupancy(p, 2 * p, 20000);
	}
	bench_memory();
	return 0;
}
