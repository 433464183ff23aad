/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Prefill on one node, decode on another, over two kvferry-dataplane
 * processes (pd_dataplane.sh starts them): the decode node's manifests and
 * the prefill node's statuses travel as control messages, the KV pages as
 * page messages from the prefill chain's export into the decode chain's
 * reserved blocks. 64 concurrent requests of mixed lengths (greedy and
 * seeded) must give the tokens the same requests give on one node, and
 * every block of both schedulers must be back afterwards.
 *   test_pd_dataplane MODEL_DIR REGION_P NODE_P REGION_D NODE_D [URL MODEL_NAME]
 * With URL the prefill node is a kvferry-ctrld (role = prefill, its
 * dataplane on REGION_P) and each prompt goes to its /v1/completions with
 * bootstrap_room, as a router would send it; without, this process plays
 * the prefill node too.
 * KVF_PD_DECODE_EVERY_MS=N polls the decode link only every N ms, so page
 * messages pile up and land in bursts larger than one import batch (the
 * run fails if no burst did).
 * Prints one summary line; exits 0, 1 on a mismatch or a hang, 77 when a
 * region is absent.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>

#include "ctrl_chain.h"
#include "ctrl_pd_link.h"
#include "ctrl_pd_xfer.h"
#include "ctrl_sched.h"
#include "kn_model.h"

enum { NREQ = 64, MAXP = 180, MAXT = 40 };

struct out {
	int32_t toks[MAXT + 1];
	int32_t n;
	int done;
	enum ctrl_finish finish;
	char msg[320];
};

static int32_t g_prompt[NREQ][MAXP], g_len[NREQ], g_max[NREQ];
static float g_temp[NREQ];
static struct out g_ref[NREQ], g_got[NREQ], g_pre[NREQ];
static uint32_t g_node_p, g_node_d;

static void out_cb(void *arg, const struct ctrl_event *ev)
{
	struct out *o = arg;

	if (ev->kv_reserved)
		return;
	if (ev->finish == CTRL_FINISH_NONE) {
		if (o->n <= MAXT)
			o->toks[o->n] = ev->token;
		o->n++;
		return;
	}
	o->done = 1;
	o->finish = ev->finish;
	if (ev->message != NULL)
		snprintf(o->msg, sizeof(o->msg), "%s", ev->message);
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static struct ctrl_chain *chain(const struct kn_model *m, int32_t stages)
{
	struct ctrl_kn_chain_opts ko;
	char err[256];
	struct ctrl_chain *c;

	ctrl_kn_chain_opts_init(&ko);
	ko.n_stages = stages;
	ko.threaded = stages > 1;
	ko.stage.n_slots = 32;
	ko.stage.n_blocks = 160;
	ko.stage.max_blocks_per_slot = 16;
	ko.stage.plan_widths[0] = 8;
	ko.stage.plan_widths[1] = 64;
	ko.stage.n_plans = 2;
	ko.stage.n_threads = 1;
	c = ctrl_kn_chain_create(m, &ko, err, sizeof(err));
	if (c == NULL) {
		fprintf(stderr, "ctrl_kn_chain_create: %s\n", err);
		exit(1);
	}
	return c;
}

static struct ctrl_sched *sched(struct ctrl_chain *c)
{
	struct ctrl_sched_opts o;
	char err[256];
	struct ctrl_sched *s;

	ctrl_sched_opts_init(&o);
	o.mb_cols = 16;
	s = ctrl_sched_create(c, &o, err, sizeof(err));
	if (s == NULL) {
		fprintf(stderr, "ctrl_sched_create: %s\n", err);
		exit(1);
	}
	return s;
}

static void request(struct ctrl_request *rq, int i, struct out *o)
{
	ctrl_request_init(rq);
	rq->prompt = g_prompt[i];
	rq->n_prompt = g_len[i];
	rq->max_tokens = g_max[i];
	rq->temperature = g_temp[i];
	rq->seed = 1000u + (uint32_t)i;
	rq->cb = out_cb;
	rq->cb_arg = o;
}

/* ---- the two nodes' wiring ---- */

struct node {
	struct ctrl_pd_link *link;
	struct ctrl_chain *chain;
	int32_t stages;
	struct ctrl_pd_decode *dec;
	struct ctrl_pd_prefill *pre;
};

static int send_p(void *arg, uint32_t node, const uint8_t *m, size_t len)
{
	struct node *n = arg;

	return ctrl_pd_link_send_ctl(n->link, node, m, len);
}

static int ship_p(void *arg, uint32_t node, uint64_t room, uint32_t session, const int32_t *src, const uint32_t *dst,
		  int32_t from, int32_t to, int last, char *err, size_t errlen)
{
	struct node *n = arg;

	return ctrl_pd_link_ship(n->link, n->chain, n->stages, node, room, session, src, dst, from, to, last, err,
				 errlen);
}

static void ctl_p(void *arg, uint32_t node, const uint8_t *m, size_t len)
{
	struct node *n = arg;

	ctrl_pd_prefill_on_control(n->pre, node, m, len);
}

static void ctl_d(void *arg, uint32_t node, const uint8_t *m, size_t len)
{
	struct node *n = arg;

	(void)node;
	ctrl_pd_decode_on_control(n->dec, m, len);
}

static int expects_d(void *arg, uint64_t room, uint32_t session)
{
	struct node *n = arg;

	return ctrl_pd_decode_expects(n->dec, room, session);
}

static void pages_d(void *arg, uint64_t room, uint32_t session, int32_t stream, int last, uint32_t n_blocks,
		    uint64_t bytes)
{
	struct node *n = arg;

	ctrl_pd_decode_on_pages(n->dec, room, session, stream, last, n_blocks, bytes);
}

/* ---- the prefill node as a kvferry-ctrld: prompts to its API, as a router sends them ---- */

struct poster {
	const char *url, *model;
	int failed;
	char why[1024];
};

static size_t sink(char *p, size_t size, size_t n, void *arg)
{
	(void)p;
	(void)arg;
	return size * n;
}

static void *post_all(void *arg)
{
	struct poster *ps = arg;
	CURL *c = curl_easy_init();
	char url[512];

	snprintf(url, sizeof(url), "%s/v1/completions", ps->url);
	for (int i = 0; c != NULL && i < NREQ && !ps->failed; i++) {
		json_t *ids = json_array(), *body;
		char *txt;
		long code = 0;
		CURLcode rc;
		struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");

		for (int32_t k = 0; k < g_len[i]; k++)
			json_array_append_new(ids, json_integer(g_prompt[i][k]));
		body = json_pack("{s:s, s:o, s:i, s:f, s:I, s:b, s:I, s:s, s:i}", "model", ps->model, "prompt", ids,
				 "max_tokens", 1, "temperature", (double)g_temp[i], "seed", (json_int_t)(1000 + i),
				 "ignore_eos", 1, "bootstrap_room", (json_int_t)(5000 + i), "bootstrap_host",
				 "10.9.0.1", "bootstrap_port", 8998);
		txt = json_dumps(body, JSON_COMPACT);
		curl_easy_setopt(c, CURLOPT_URL, url);
		curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, txt);
		curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
		curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
		rc = curl_easy_perform(c);
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
		if (rc != CURLE_OK || code != 200) {
			snprintf(ps->why, sizeof(ps->why), "POST %s for request %d: %s, HTTP %ld", url, i,
				 curl_easy_strerror(rc), code);
			ps->failed = 1;
		}
		curl_slist_free_all(hd);
		free(txt);
		json_decref(body);
	}
	curl_easy_cleanup(c);
	return NULL;
}

int main(int argc, char **argv)
{
	char err[256];
	struct ctrl_pd_link_opts lo;
	struct node p = { 0 }, d = { 0 };
	struct kn_model *m;
	struct ctrl_chain *rc;
	struct ctrl_sched *rs, *ps, *ds;
	struct ctrl_rooms *rooms;
	struct ctrl_rooms_opts ro;
	struct ctrl_pd_decode_opts dopt = { 0 };
	struct ctrl_pd_prefill_opts popt = { 0 };
	struct ctrl_pd_link_handlers hp = { 0 }, hd = { 0 };
	struct ctrl_pd_link_stats lsp, lsd;
	struct ctrl_sched_stats sp, sd;
	int bad = 0, done = 0;
	double t0, t_dec = 0;
	const char *every = getenv("KVF_PD_DECODE_EVERY_MS");
	double every_s = every != NULL ? atof(every) / 1e3 : 0;

	const char *url = argc == 8 ? argv[6] : NULL;
	struct poster poster = { 0 };
	pthread_t post_th;

	if (argc != 6 && argc != 8) {
		fprintf(stderr, "usage: %s MODEL_DIR REGION_P NODE_P REGION_D NODE_D [URL MODEL_NAME]\n", argv[0]);
		return 2;
	}
	g_node_p = (uint32_t)atoi(argv[3]);
	g_node_d = (uint32_t)atoi(argv[5]);
	if ((m = kn_model_open(argv[1], err, sizeof(err))) == NULL) {
		fprintf(stderr, "the model: %s\n", err);
		return 1;
	}
	for (int i = 0; i < NREQ; i++) {
		uint32_t x = 91u + (uint32_t)i * 2654435761u;

		g_len[i] = 3 + (int32_t)((uint32_t)(i * 37) % (MAXP - 3));
		g_max[i] = 8 + (i * 13) % (MAXT - 8);
		g_temp[i] = i % 4 == 3 ? 0.8f : 0.0f;
		for (int32_t k = 0; k < g_len[i]; k++) {
			x = x * 1103515245u + 12345u;
			g_prompt[i][k] = (int32_t)((x >> 16) % (uint32_t)kn_model_config(m)->vocab_size);
		}
	}
	/* the reference: every request on one node */
	rc = chain(m, 1);
	rs = sched(rc);
	for (int i = 0; i < NREQ; i++) {
		struct ctrl_request rq;

		request(&rq, i, &g_ref[i]);
		if (ctrl_sched_submit(rs, &rq) < 0)
			return 1;
	}
	while (!ctrl_sched_drained(rs))
		if (ctrl_sched_poll(rs) < 0)
			return 1;
	ctrl_sched_destroy(rs);
	ctrl_chain_destroy(rc);

	/* the two nodes: two stages each, the dataplane between them */
	ctrl_pd_link_opts_init(&lo);
	lo.n_large = 8;
	lo.region = argv[2];
	p.link = url != NULL ? NULL : ctrl_pd_link_open(&lo, err, sizeof(err));
	lo.region = argv[4];
	d.link = p.link != NULL || url != NULL ? ctrl_pd_link_open(&lo, err, sizeof(err)) : NULL;
	if ((p.link == NULL && url == NULL) || d.link == NULL) {
		int absent = errno == ENOENT;

		printf("%s: %s\n", absent ? "SKIP" : "FAIL", err);
		return absent ? 77 : 1;
	}
	p.stages = d.stages = 2;
	p.chain = url != NULL ? NULL : chain(m, 2);
	d.chain = chain(m, 2);
	ps = url != NULL ? NULL : sched(p.chain);
	ds = sched(d.chain);
	ctrl_rooms_opts_init(&ro);
	ro.vocab_size = kn_model_config(m)->vocab_size;
	rooms = ctrl_rooms_create(&ro);
	dopt = (struct ctrl_pd_decode_opts){ .sched = ds, .rooms = rooms, .session = 77, .n_streams = 2,
					     .send = send_p, .send_arg = &d };
	popt = (struct ctrl_pd_prefill_opts){ .sched = ps, .rank = 0, .send = send_p, .send_arg = &p,
					      .ship = ship_p, .ship_arg = &p };
	d.dec = ctrl_pd_decode_create(&dopt);
	p.pre = url != NULL ? NULL : ctrl_pd_prefill_create(&popt);
	if (rooms == NULL || d.dec == NULL || (p.pre == NULL && url == NULL))
		return 1;
	hp = (struct ctrl_pd_link_handlers){ .control = ctl_p, .arg = &p };
	hd = (struct ctrl_pd_link_handlers){ .control = ctl_d, .expects = expects_d, .pages = pages_d, .arg = &d,
					     .chain = d.chain, .n_stages = d.stages };
	for (int i = 0; i < NREQ; i++) {
		struct ctrl_request rq;

		request(&rq, i, &g_got[i]);
		if (ctrl_pd_decode_submit(d.dec, &rq, 5000u + (uint64_t)i, g_node_p, 1, 0) < 0)
			return 1;
		request(&rq, i, &g_pre[i]);
		if (url == NULL && ctrl_pd_prefill_submit(p.pre, &rq, 5000u + (uint64_t)i, g_node_d) < 0)
			return 1;
	}
	if (url != NULL) {
		poster.url = url;
		poster.model = argv[7];
		curl_global_init(CURL_GLOBAL_DEFAULT);
		if (pthread_create(&post_th, NULL, post_all, &poster) != 0)
			return 1;
	}
	t0 = now_s();
	while (done < NREQ) {
		int busy = (ps != NULL ? ctrl_sched_poll(ps) : 0) | ctrl_sched_poll(ds);

		busy |= p.link != NULL ? ctrl_pd_link_poll(p.link, &hp) : 0;
		if (every_s <= 0 || now_s() - t_dec >= every_s) {
			busy |= ctrl_pd_link_poll(d.link, &hd);
			t_dec = now_s();
		}
		if (poster.failed) {
			fprintf(stderr, "FAIL: %s\n", poster.why);
			return 1;
		}
		ctrl_pd_decode_tick(d.dec, 0);
		done = 0;
		for (int i = 0; i < NREQ; i++)
			done += g_got[i].done;
		if (now_s() - t0 > 60) {
			memset(&lsp, 0, sizeof(lsp)); /* the prefill node is a kvferry-ctrld: its link is not ours */
			if (p.link != NULL)
				ctrl_pd_link_stats(p.link, &lsp);
			ctrl_pd_link_stats(d.link, &lsd);
			ctrl_sched_stats(ds, &sd);
			fprintf(stderr, "FAIL: %d of %d requests done after 120 s; prefill link: %llu control sent "
				"(%llu failed), %llu page messages sent (%llu failed); decode link: %llu control "
				"sent (%llu failed), %llu received, %llu page messages received, %llu refused (%s); "
				"%d waiting for pages\n", done, NREQ, (unsigned long long)lsp.ctl_sent,
				(unsigned long long)lsp.ctl_failed, (unsigned long long)lsp.kv_sent,
				(unsigned long long)lsp.kv_failed, (unsigned long long)lsd.ctl_sent,
				(unsigned long long)lsd.ctl_failed, (unsigned long long)lsd.ctl_received,
				(unsigned long long)lsd.kv_received, (unsigned long long)lsd.kv_refused,
				ctrl_pd_link_last_refusal(d.link), sd.kv_waiting);
			return 1;
		}
		if (!busy)
			usleep(20);
	}
	if (url != NULL)
		pthread_join(post_th, NULL);
	for (int k = 0; k < 2000; k++) { /* the last releases and completions */
		if (ps != NULL)
			ctrl_sched_poll(ps);
		if (p.link != NULL)
			ctrl_pd_link_poll(p.link, &hp);
		ctrl_pd_link_poll(d.link, &hd);
	}
	for (int i = 0; i < NREQ; i++) {
		if (g_got[i].finish != CTRL_FINISH_LENGTH || g_got[i].n != g_ref[i].n
		    || memcmp(g_got[i].toks, g_ref[i].toks, sizeof(int32_t) * (size_t)g_ref[i].n) != 0) {
			fprintf(stderr, "FAIL: request %d (prompt %d, %d tokens, temperature %.1f): %s, %d tokens%s%s\n", i,
				g_len[i], g_max[i], (double)g_temp[i], ctrl_finish_name(g_got[i].finish), g_got[i].n,
				g_got[i].msg[0] ? ": " : "", g_got[i].msg);
			bad = 1;
		}
	}
	memset(&sp, 0, sizeof(sp));
	memset(&lsp, 0, sizeof(lsp));
	if (ps != NULL)
		ctrl_sched_stats(ps, &sp);
	ctrl_sched_stats(ds, &sd);
	if (p.link != NULL)
		ctrl_pd_link_stats(p.link, &lsp);
	ctrl_pd_link_stats(d.link, &lsd);
	printf("%s: %d requests prefilled on node %u%s and decoded on node %u over the dataplane in %.2f s: "
	       "%llu page messages (%.1f MB), %llu control messages each way, %llu refused; blocks in use "
	       "after: prefill %d, decode %d; prompt columns the decode node computed: %llu\n",
	       bad ? "FAIL" : "PASS", NREQ, g_node_p, url != NULL ? " (kvferry-ctrld)" : "", g_node_d, now_s() - t0, (unsigned long long)lsd.kv_received,
	       (double)lsd.kv_bytes_received / 1e6, (unsigned long long)lsd.ctl_received,
	       (unsigned long long)lsd.kv_refused, sp.blocks_in_use, sd.blocks_in_use,
	       (unsigned long long)sd.prefill_cols);
	if (every_s > 0) {
		printf("the decode link polled every %.0f ms: at most %llu page messages landed in one poll\n",
		       every_s * 1e3, (unsigned long long)lsd.kv_burst_max);
		if (lsd.kv_burst_max <= 16) {
			fprintf(stderr, "FAIL: no burst larger than one import batch (16) to test\n");
			bad = 1;
		}
	}
	if (sp.blocks_in_use != 0 || sd.blocks_in_use != 0 || sd.prefill_cols != 0 || lsd.kv_refused != 0
	    || lsp.kv_failed != 0 || lsp.ctl_failed != 0 || lsd.ctl_failed != 0) {
		fprintf(stderr, "FAIL: blocks left, prompts recomputed, or messages refused / failed (%s)\n",
			ctrl_pd_link_last_refusal(d.link));
		bad = 1;
	}
	ctrl_sched_destroy(ds);
	if (ps != NULL)
		ctrl_sched_destroy(ps);
	ctrl_pd_decode_destroy(d.dec);
	ctrl_pd_prefill_destroy(p.pre);
	ctrl_rooms_destroy(rooms);
	ctrl_chain_destroy(p.chain);
	ctrl_chain_destroy(d.chain);
	ctrl_pd_link_close(p.link);
	ctrl_pd_link_close(d.link);
	kn_model_close(m);
	if (url != NULL)
		curl_global_cleanup();
	return bad;
}
