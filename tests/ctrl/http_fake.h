/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The HTTP tests' fake backend and client, shared by test_http.c and
 * test_http_native.c: a backend that echoes the prompt back one token at a
 * time on its own thread (as the scheduler calls back on its thread), the
 * server on an ephemeral loopback port, requests through libcurl. Each test
 * program includes it once and sets g_tok before its group runs.
 */
#ifndef KVF_TEST_HTTP_FAKE_H
#define KVF_TEST_HTTP_FAKE_H

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "ctrl_http.h"

/* ---- the fake backend ---- */

struct fake_req {
	uint64_t id;
	int32_t *prompt;
	int32_t n_prompt, max_tokens, emitted;
	int32_t plp_next, n_top;  /* prompt_logprobs: the next position to score; top logprobs asked */
	int32_t stop_ids[80];     /* the request's stop ids: the fake stops at any of them */
	int32_t n_stop_ids;
	ctrl_token_cb cb;
	void *arg;
	atomic_int cancel;
	uint64_t t_admitted_ns;  /* the fake admits at submit */
	struct fake_req *next;
};

struct fake {
	pthread_mutex_t mu;
	struct fake_req *reqs;
	uint64_t next_id;
	pthread_t th;
	atomic_int quit;
	atomic_int token_us;     /* delay between tokens */
	atomic_int eos_after;    /* emit the stop token after this many (-1 never) */
	atomic_int fail_after;   /* fail after this many (-1 never) */
	atomic_int refuse;       /* submit returns -EAGAIN */
	atomic_int refuse_from;  /* > 0: so does every submit once this many were taken */
	atomic_int down;         /* the ready callback says stage 1 is down */
	atomic_int pool;         /* > 0: positions (prompt + max_tokens) the fake's pool holds */
	atomic_int submits, cancels, live;
	atomic_int plp_asked;    /* submits that asked for prompt logprobs */
	int32_t say[512];        /* n_say > 0: requests answer these tokens, then the stop token */
	atomic_int n_say;
	int32_t eos;
};

static struct fake g_fake;
static struct ctrl_http *g_http;
static struct kn_tok *g_tok;
static const char *g_tok_dir;  /* its directory (argv[1]) */
static char g_base[64];

/* The server's context limit: the tiny tokenizer spends a token per byte or so. */
#define CTX 1024

static int64_t fake_submit(void *ctx, const struct ctrl_request *r)
{
	struct fake *f = ctx;
	struct fake_req *q;

	if (atomic_load(&f->refuse) ||
	    (atomic_load(&f->refuse_from) > 0 && atomic_load(&f->submits) >= atomic_load(&f->refuse_from)))
		return -EAGAIN;
	q = calloc(1, sizeof(*q));
	q->prompt = malloc((size_t)r->n_prompt * sizeof(int32_t));
	memcpy(q->prompt, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
	q->n_prompt = r->n_prompt;
	q->max_tokens = r->max_tokens;
	q->plp_next = r->prompt_logprobs > 0 ? r->prompt_logprobs : r->n_prompt;
	if (r->prompt_logprobs > 0)
		atomic_fetch_add(&f->plp_asked, 1);
	q->n_top = r->n_logprobs;
	for (int32_t k = 0; k < r->n_stop && k < 80; k++)
		q->stop_ids[q->n_stop_ids++] = r->stop_ids[k];
	q->cb = r->cb;
	q->arg = r->cb_arg;
	{
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		q->t_admitted_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	}
	pthread_mutex_lock(&f->mu);
	q->id = ++f->next_id;
	q->next = f->reqs;
	f->reqs = q;
	pthread_mutex_unlock(&f->mu);
	atomic_fetch_add(&f->submits, 1);
	atomic_fetch_add(&f->live, 1);
	return (int64_t)q->id;
}

static int fake_cancel(void *ctx, uint64_t id)
{
	struct fake *f = ctx;

	pthread_mutex_lock(&f->mu);
	for (struct fake_req *q = f->reqs; q; q = q->next)
		if (q->id == id)
			atomic_store(&q->cancel, 1);
	pthread_mutex_unlock(&f->mu);
	atomic_fetch_add(&f->cancels, 1);
	return 0;
}

static int fake_ready(void *ctx, char *why, size_t whylen)
{
	struct fake *f = ctx;

	if (!atomic_load(&f->down))
		return 1;
	snprintf(why, whylen, "replica 0 stage 1 (kvferry-worker pid 4242) down for 1.5 s");
	return 0;
}

/* As ctrl_sched_admissible() answers, for a pool of f->pool positions. */
static int32_t fake_admissible(void *ctx, int32_t n_prompt, int32_t max_tokens, char *err, size_t errlen)
{
	struct fake *f = ctx;
	int32_t pool = atomic_load(&f->pool), most = pool - n_prompt;

	if (pool <= 0)
		return INT32_MAX;
	if (most < 0)
		most = 0;
	err[0] = 0;
	if (max_tokens > most)
		snprintf(err, errlen, "request needs %d positions (prompt %d + max_tokens %d) but the pool holds %d",
			 n_prompt + max_tokens, n_prompt, max_tokens, pool);
	return most;
}

static json_t *fake_stats(void *ctx)
{
	struct fake *f = ctx;

	/* with the fields /metrics renames: a time in microseconds, a fraction, a
	 * pool's size ending in _total, rooms by (CamelCase) state */
	return json_pack("{s:i, s:[{s:i, s:i, s:[{s:i, s:i, s:f},{s:i, s:i, s:f}]}], s:{s:{s:i, s:i}}}", "live",
			 atomic_load(&f->live), "replicas", "n_stages", 2, "blocks_total", 64, "stages", "steps", 5,
			 "mean_step_us", 1500, "busy_frac", 0.25, "steps", 7, "mean_step_us", 250, "busy_frac", 0.5,
			 "pd", "rooms", "Bootstrapping", 1, "WaitingForInput", 4);
}

static void *fake_thread(void *arg)
{
	struct fake *f = arg;

	while (!atomic_load(&f->quit)) {
		struct fake_req *snap[256];
		int n = 0;

		pthread_mutex_lock(&f->mu);
		for (struct fake_req *q = f->reqs; q && n < 256; q = q->next)
			snap[n++] = q;
		pthread_mutex_unlock(&f->mu);
		for (int i = 0; i < n; i++) {
			struct fake_req *q = snap[i];
			struct ctrl_event ev = {.id = q->id, .finish = CTRL_FINISH_NONE, .token = -1, .n_generated = q->emitted,
						.t_admitted_ns = q->t_admitted_ns};
			int32_t top_ids[2];
			float top_lps[2];

			if (!atomic_load(&q->cancel) && q->plp_next < q->n_prompt) {
				/* a scored prompt position: logprob -p/8, its token and token 0 the top two */
				int32_t p = q->plp_next++;

				ev.prompt_pos = p;
				ev.token = q->prompt[p];
				ev.logprob = -(float)p / 8.0f;
				top_ids[0] = q->prompt[p];
				top_ids[1] = 0;
				top_lps[0] = ev.logprob;
				top_lps[1] = ev.logprob - 1.0f;
				ev.n_top = q->n_top < 2 ? q->n_top : 2;
				ev.top_ids = top_ids;
				ev.top_logprobs = top_lps;
				q->cb(q->arg, &ev);
				continue;
			}
			if (q->max_tokens == 0 && !atomic_load(&q->cancel)) {
				ev.finish = CTRL_FINISH_LENGTH; /* the prompt alone was asked for */
			} else if (atomic_load(&q->cancel)) {
				ev.finish = CTRL_FINISH_CANCELLED;
			} else if (atomic_load(&f->fail_after) >= 0 && q->emitted >= atomic_load(&f->fail_after)) {
				ev.finish = CTRL_FINISH_ERROR;
				ev.message = "stage 1 stopped answering";
			} else if ((atomic_load(&f->eos_after) >= 0 && q->emitted >= atomic_load(&f->eos_after))
				   || (atomic_load(&f->n_say) > 0 && q->emitted >= atomic_load(&f->n_say))) {
				ev.finish = CTRL_FINISH_STOP;
				ev.token = f->eos;
				ev.n_generated = q->emitted + 1;
			} else {
				ev.token = atomic_load(&f->n_say) > 0 ? f->say[q->emitted] : q->prompt[q->emitted % q->n_prompt];
				ev.logprob = -0.5f;
				ev.n_generated = ++q->emitted;
				for (int32_t k = 0; k < q->n_stop_ids; k++)
					if (q->stop_ids[k] == ev.token && ev.token != f->eos) {
						ev.finish = CTRL_FINISH_STOP; /* a request's stop token */
						break;
					}
			}
			q->cb(q->arg, &ev);
			if (ev.finish == CTRL_FINISH_NONE && q->emitted == q->max_tokens) {
				struct ctrl_event end = {.id = q->id, .finish = CTRL_FINISH_LENGTH, .token = -1, .n_generated = q->emitted,
							 .t_admitted_ns = q->t_admitted_ns};
				q->cb(q->arg, &end);
				ev.finish = CTRL_FINISH_LENGTH;
			}
			if (ev.finish != CTRL_FINISH_NONE) {
				pthread_mutex_lock(&f->mu);
				for (struct fake_req **pp = &f->reqs; *pp; pp = &(*pp)->next) {
					if (*pp == q) {
						*pp = q->next;
						break;
					}
				}
				pthread_mutex_unlock(&f->mu);
				free(q->prompt);
				free(q);
				atomic_fetch_sub(&f->live, 1);
			}
		}
		usleep((useconds_t)atomic_load(&f->token_us));
	}
	return NULL;
}

static void fake_reset(void)
{
	atomic_store(&g_fake.token_us, 200);
	atomic_store(&g_fake.eos_after, -1);
	atomic_store(&g_fake.fail_after, -1);
	atomic_store(&g_fake.refuse, 0);
	atomic_store(&g_fake.refuse_from, 0);
	atomic_store(&g_fake.down, 0);
	atomic_store(&g_fake.pool, 0);
	atomic_store(&g_fake.n_say, 0);
	ctrl_http_set_draining(g_http, 0);
}

/* Requests answer @p text (encoded with the server's tokenizer), then stop. */
static inline void fake_say(const char *text)
{
	int32_t *ids = NULL;
	size_t n = 0;

	assert_int_equal(kn_tok_encode(g_tok, text, strlen(text), 0, &ids, &n), 0);
	assert_true(n <= 512);
	memcpy(g_fake.say, ids, sizeof(int32_t) * n);
	atomic_store(&g_fake.n_say, (int)n);
	free(ids);
}

/* ---- HTTP client ---- */

struct resp {
	long status;
	char *body;
	size_t len;
	json_t *json;
};

static size_t on_data(char *p, size_t sz, size_t n, void *arg)
{
	struct resp *r = arg;

	r->body = realloc(r->body, r->len + sz * n + 1);
	memcpy(r->body + r->len, p, sz * n);
	r->len += sz * n;
	r->body[r->len] = 0;
	return sz * n;
}

static CURLcode request(const char *method, const char *path, const char *body, long timeout_ms,
			struct resp *r)
{
	CURL *c = curl_easy_init();
	struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
	char url[256];
	CURLcode rc;

	memset(r, 0, sizeof(*r));
	snprintf(url, sizeof(url), "%s%s", g_base, path);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
	if (body)
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms ? timeout_ms : 10000L);
	rc = curl_easy_perform(c);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
	curl_slist_free_all(hdr);
	curl_easy_cleanup(c);
	if (r->body && r->body[0] == '{')
		r->json = json_loads(r->body, 0, NULL);
	return rc;
}

static void resp_free(struct resp *r)
{
	free(r->body);
	json_decref(r->json);
}

static json_t *post(const char *path, long want_status, const char *fmt, ...)
{
	char body[4096];
	struct resp r;
	va_list ap;
	json_t *j;

	va_start(ap, fmt);
	vsnprintf(body, sizeof(body), fmt, ap);
	va_end(ap);
	assert_int_equal(request("POST", path, body, 0, &r), CURLE_OK);
	if (r.status != want_status || !r.json)
		fprintf(stderr, "POST %s %s -> %ld %s\n", path, body, r.status, r.body ? r.body : "");
	assert_int_equal(r.status, want_status);
	assert_non_null(r.json);
	j = json_incref(r.json);
	resp_free(&r);
	return j;
}

static void wait_idle(void)
{
	for (int i = 0; i < 500 && (ctrl_http_active(g_http) || atomic_load(&g_fake.live)); i++)
		usleep(10000);
	assert_int_equal(ctrl_http_active(g_http), 0);
	assert_int_equal(atomic_load(&g_fake.live), 0);
}

static int http_fake_setup(void **state)
{
	struct ctrl_http_opts o;
	struct ctrl_http_backend be = {fake_submit, fake_cancel, fake_stats, &g_fake, NULL,
				       fake_ready, &g_fake, fake_admissible, &g_fake, NULL, NULL, NULL, NULL};
	char err[256];
	int32_t eos[4];

	(void)state;
	curl_global_init(CURL_GLOBAL_ALL);
	pthread_mutex_init(&g_fake.mu, NULL);
	kn_tok_eos_ids(g_tok, eos, 4);
	g_fake.eos = eos[0];
	pthread_create(&g_fake.th, NULL, fake_thread, &g_fake);
	ctrl_http_opts_init(&o);
	o.port = 0;
	o.threads = 2;
	o.body_limit = 64 * 1024;
	o.model_name = "tiny";
	o.max_context = CTX;
	o.max_tokens_default = 16;
	o.tok = g_tok;
	o.stop_ids = eos;
	o.n_stop = 1;
	g_http = ctrl_http_start(&o, &be, err, sizeof(err));
	if (!g_http)
		fprintf(stderr, "%s\n", err);
	assert_non_null(g_http);
	snprintf(g_base, sizeof(g_base), "http://127.0.0.1:%u", ctrl_http_port(g_http));
	fake_reset();
	return 0;
}

static int http_fake_teardown(void **state)
{
	(void)state;
	ctrl_http_stop(g_http);
	atomic_store(&g_fake.quit, 1);
	pthread_join(g_fake.th, NULL);
	curl_global_cleanup();
	return 0;
}

/* The program's main: argv[1] the tokenizer directory, then the group. */
static int http_fake_run(int argc, char **argv, const char *group, const struct CMUnitTest *tests, size_t n)
{
	char err[256];
	int rc;

	if (argc < 2) {
		fprintf(stderr, "usage: %s TOKENIZER_DIR\n", argv[0]);
		return 1;
	}
	g_tok_dir = argv[1];
	g_tok = kn_tok_open(argv[1], err, sizeof(err));
	if (!g_tok) {
		fprintf(stderr, "kn_tok_open(%s): %s\n", argv[1], err);
		return 1;
	}
	rc = _cmocka_run_group_tests(group, tests, n, http_fake_setup, http_fake_teardown);
	kn_tok_close(g_tok);
	return rc;
}

#endif
