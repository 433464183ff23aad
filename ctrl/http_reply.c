/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The HTTP layer's floor: the clock, the latency histograms' bounds and
 * their observe call, and the replies every endpoint queues (text, JSON,
 * OpenAI error objects). The router (http.c) and the handlers
 * (http_openai.c, http_gen.c, http_stats.c) call down into it, and it calls
 * nothing above it, so no two files of the layer call each other.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "ctrl_config.h"
#include "http_int.h"

double http_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/*
 * Bucket bounds, in seconds. One table per histogram, at most HTTP_HIST_MAX
 * bounds; /metrics and /stats show them as they are here.
 *  - inter-token: the floor is one pipeline step, ~1.5 ms on the H200 (1B,
 *    64 clients; sched.c's measurement), a mean of 0.23-0.52 ms for the CPU
 *    test model (3 stages, 2 cores: tests/ctrl/ctrld_metrics.sh); tokens of
 *    one accepted draft arrive together and land in the first bucket. Above
 *    100 ms a client sees the stream stutter.
 *  - time to first token and end to end: prefill of a long prompt under load
 *    takes seconds, and a request of max_tokens 4096 at 20 ms a token runs
 *    80 s, so both reach into minutes, with the fine steps where an
 *    interactive request lives (10 ms .. 1 s).
 *  - queue: an idle server admits at its next poll (a mean of 0.07-0.19 ms
 *    in the same test, tokenizing included); a full KV pool holds requests
 *    for as long as the running ones take.
 */
static const double g_le_ttft[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25,
				   0.5, 0.75, 1, 2.5, 5, 10, 20, 40, 80};
static const double g_le_itl[] = {0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
				  0.05, 0.075, 0.1, 0.2, 0.5, 1, 2.5};
static const double g_le_e2e[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 60,
				  120, 300, 600};
static const double g_le_queue[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
				    0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

#define HIST(id, nm, t) [id] = {nm, t, (int)(sizeof(t) / sizeof(t[0]))}
const struct http_hist_desc g_http_hist[HTTP_HIST_N] = {
	HIST(HTTP_HIST_TTFT, "time_to_first_token_seconds", g_le_ttft),
	HIST(HTTP_HIST_ITL, "inter_token_latency_seconds", g_le_itl),
	HIST(HTTP_HIST_E2E, "e2e_request_latency_seconds", g_le_e2e),
	HIST(HTTP_HIST_QUEUE, "request_queue_time_seconds", g_le_queue),
};
#undef HIST

_Static_assert(sizeof(g_le_ttft) / sizeof(double) <= HTTP_HIST_MAX, "too many TTFT buckets");
_Static_assert(sizeof(g_le_itl) / sizeof(double) <= HTTP_HIST_MAX, "too many inter-token buckets");
_Static_assert(sizeof(g_le_e2e) / sizeof(double) <= HTTP_HIST_MAX, "too many end-to-end buckets");
_Static_assert(sizeof(g_le_queue) / sizeof(double) <= HTTP_HIST_MAX, "too many queue buckets");

void http_hist_observe(struct ctrl_http *h, enum http_hist_id id, double seconds)
{
	const struct http_hist_desc *d = &g_http_hist[id];
	struct http_hist *hh = &h->hist[id];
	int i = 0;

	if (!(seconds > 0))
		seconds = 0; /* NaN (every stamp is CLOCK_MONOTONIC): the fastest bucket, not a wrapped sum */
	while (i < d->n_le && seconds > d->le[i])
		i++;
	atomic_fetch_add_explicit(&hh->n[i], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&hh->sum_ns, (uint_fast64_t)(seconds * 1e9 + 0.5), memory_order_relaxed);
}

static enum MHD_Result queue(struct ctrl_http *h, struct MHD_Connection *c, unsigned status,
			     struct MHD_Response *r)
{
	enum MHD_Result ret;

	if (!r)
		return MHD_NO;
	http_cors(h, c, r);
	if (status >= 500)
		atomic_fetch_add(&h->n_5xx, 1);
	else if (status >= 400)
		atomic_fetch_add(&h->n_4xx, 1);
	ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

/* What Access-Control-Allow-Origin says to @p origin: "*", the origin
 * itself (listed), or NULL (not allowed, or no CORS). */
static const char *cors_allow(const struct ctrl_http *h, const char *origin)
{
	const char *p = h->cors, *o;
	size_t k;

	while (*p == ' ')
		p++;
	if (!origin || !*p)
		return NULL;
	if (!strcmp(p, "*"))
		return "*";
	while (ctrl_config_list_next(&p, &o, &k))
		if (k == strlen(origin) && !strncasecmp(o, origin, k))
			return origin;
	return NULL;
}

void http_cors(struct ctrl_http *h, struct MHD_Connection *c, struct MHD_Response *r)
{
	const char *allow = cors_allow(h, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"));

	if (!allow)
		return;
	MHD_add_response_header(r, "Access-Control-Allow-Origin", allow);
	if (strcmp(allow, "*"))
		MHD_add_response_header(r, "Vary", "Origin");
}

enum MHD_Result http_preflight(struct ctrl_http *h, struct MHD_Connection *c, const char *url)
{
	const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
	const char *want = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
	struct MHD_Response *r;

	if (!origin)
		return http_error(h, c, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", NULL,
				  "method_not_allowed", "OPTIONS %s without an Origin header: OPTIONS answers only "
				  "a browser's CORS preflight", url);
	if (!cors_allow(h, origin))
		return http_error(h, c, MHD_HTTP_FORBIDDEN, "invalid_request_error", NULL, "origin_not_allowed",
				  "origin '%s' may not call this API from a browser: add it to cors_allow_origins "
				  "(kvferry.conf [http])", origin);
	r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
	MHD_add_response_header(r, "Access-Control-Allow-Headers", want && *want ? want : "Content-Type, Authorization");
	MHD_add_response_header(r, "Access-Control-Max-Age", "600");
	return queue(h, c, MHD_HTTP_NO_CONTENT, r);
}

enum MHD_Result http_text(struct ctrl_http *h, struct MHD_Connection *c, unsigned status,
			  const char *type, const char *body, size_t len)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);

	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	return queue(h, c, status, r);
}

static enum MHD_Result reply_json(struct ctrl_http *h, struct MHD_Connection *c, unsigned status, json_t *j,
				  int close)
{
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	struct MHD_Response *r;

	json_decref(j);
	if (!s)
		return MHD_NO;
	r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(s);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	if (close)
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
	return queue(h, c, status, r);
}

enum MHD_Result http_json(struct ctrl_http *h, struct MHD_Connection *c, unsigned status, json_t *j)
{
	return reply_json(h, c, status, j, 0);
}

static json_t *error_json(const char *type, const char *param, const char *code, const char *fmt, va_list ap)
{
	char msg[1024];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	return json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", msg, "type", type, "param",
			 param ? json_string(param) : json_null(), "code", code ? json_string(code) : json_null());
}

enum MHD_Result http_error(struct ctrl_http *h, struct MHD_Connection *c, unsigned status,
			   const char *type, const char *param, const char *code, const char *fmt, ...)
{
	va_list ap;
	json_t *j;

	va_start(ap, fmt);
	j = error_json(type, param, code, fmt, ap);
	va_end(ap);
	return reply_json(h, c, status, j, 0);
}

enum MHD_Result http_error_close(struct ctrl_http *h, struct MHD_Connection *c, unsigned status,
				 const char *type, const char *param, const char *code, const char *fmt, ...)
{
	va_list ap;
	json_t *j;

	va_start(ap, fmt);
	j = error_json(type, param, code, fmt, ap);
	va_end(ap);
	return reply_json(h, c, status, j, 1);
}

enum MHD_Result http_verr_send(struct ctrl_http *h, struct MHD_Connection *c, const struct http_verr *e)
{
	return http_error(h, c, e->status, e->type, e->param, e->code, "%s", e->msg);
}
