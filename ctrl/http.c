/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The HTTP server: libmicrohttpd with an internal polling thread pool and
 * suspend/resume. A connection waiting on tokens is suspended (it costs no
 * polling) and resumed by the backend callback when a token is queued.
 *
 * libmicrohttpd does not watch a suspended socket, so a client that hangs
 * up while its request waits would go unnoticed until the next token. A
 * ticker thread therefore resumes every suspended connection every
 * HTTP_TICK_MS; the connection then peeks at its socket (recv MSG_PEEK
 * returns 0 once the peer closed) and cancels its request if the client is
 * gone. 250 ms bounds how long a dead client keeps its KV blocks. The same
 * tick enforces request_timeout (http_conn.c).
 *
 * Probes: GET /livez answers 200 while this process serves HTTP at all (a
 * liveness probe: restarting ctrld would not bring a dead worker back);
 * GET /readyz and GET /health (what existing users poll) answer 200 only
 * when requests can be served: 503 while draining, or while the backend
 * says it cannot serve (a stage of its chain down), naming what is down.
 *
 * Framing: libmicrohttpd takes the first of several Content-Length headers
 * and lets Transfer-Encoding win over Content-Length. Behind a proxy that
 * reads them the other way a request could hide another in its body
 * (request smuggling), so a request with two Content-Lengths that disagree,
 * or with both headers, is refused (400) and its connection closed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ctrl_config.h"
#include "http_int.h"

#define HTTP_TICK_MS 250
/* Connections MHD accepts beyond max_connections, so the ones beyond are
 * answered 503 rather than left in the backlog (http_conn.c). */
#define HTTP_CONN_SPARE 64

void ctrl_http_opts_init(struct ctrl_http_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->address = "127.0.0.1";
	o->port = 8000;
	o->threads = 4;
	o->body_limit = 1 << 20;
	o->model_name = "kvferry";
	o->max_context = 4096;
	o->max_tokens_default = 256;
	o->connection_timeout_s = 30;
	o->request_timeout_s = 60;
	o->max_connections = 1024;
}

static json_t *model_json(const struct ctrl_http *h)
{
	return json_pack("{s:s, s:s, s:I, s:s, s:s, s:i}", "id", h->model, "object", "model", "created",
			 (json_int_t)h->started, "owned_by", "kvferry", "root", h->model, "max_model_len",
			 h->max_context);
}

static enum MHD_Result serve_models(struct ctrl_http *h, struct MHD_Connection *c)
{
	return http_json(h, c, MHD_HTTP_OK, json_pack("{s:s, s:[o]}", "object", "list", "data", model_json(h)));
}

/* GET /v1/models/{id} (MHD has unescaped the path: "org%2Fname" is "org/name"). */
static enum MHD_Result serve_model(struct ctrl_http *h, struct MHD_Connection *c, const char *id)
{
	if (strcmp(id, h->model))
		return http_error(h, c, MHD_HTTP_NOT_FOUND, "invalid_request_error", "model", "model_not_found",
				  "The model '%s' does not exist; this server serves '%s' (GET /v1/models)", id,
				  h->model);
	return http_json(h, c, MHD_HTTP_OK, model_json(h));
}

int ctrl_http_ready(struct ctrl_http *h, char *why, size_t whylen)
{
	char buf[512];

	buf[0] = 0;
	if (atomic_load(&h->draining))
		snprintf(buf, sizeof(buf), "kvferry-ctrld is draining (ctrlctl drain, or SIGTERM) and admits no new requests");
	else if (h->be.ready && !h->be.ready(h->be.ready_ctx, buf, sizeof(buf)) && !buf[0])
		snprintf(buf, sizeof(buf), "the backend cannot serve");
	if (why && whylen)
		snprintf(why, whylen, "%s", buf);
	return !buf[0];
}

/* /livez: the process answers. /readyz and /health: it can serve requests. */
static enum MHD_Result serve_probe(struct ctrl_http *h, struct MHD_Connection *c, int live)
{
	char why[512];

	if (live)
		return http_json(h, c, MHD_HTTP_OK, json_pack("{s:s}", "status", "alive"));
	if (ctrl_http_ready(h, why, sizeof(why)))
		return http_json(h, c, MHD_HTTP_OK, json_pack("{s:s}", "status", "ok"));
	return http_json(h, c, MHD_HTTP_SERVICE_UNAVAILABLE,
			 json_pack("{s:s, s:s}", "status", atomic_load(&h->draining) ? "draining" : "unavailable",
				   "reason", why));
}

/* The request's framing headers, gathered over all of them (MHD's lookup
 * returns the first of a repeated header only). */
struct framing {
	int n_cl;
	const char *cl, *cl2;        /* the first Content-Length, and one that disagrees */
	const char *te;
};

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
	struct framing *f = cls;

	(void)kind;
	if (!key)
		return MHD_YES;
	if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
		if (f->n_cl++ == 0)
			f->cl = value ? value : "";
		else if (!f->cl2 && strcmp(f->cl, value ? value : ""))
			f->cl2 = value ? value : "";
	} else if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
		f->te = value ? value : "";
	}
	return MHD_YES;
}

/* Refuse a request whose body two readers could frame differently (see the
 * top of the file). @return MHD_YES/MHD_NO when it was answered, -1 when it is fine. */
static int refuse_framing(struct ctrl_http *h, struct MHD_Connection *c)
{
	struct framing f = {0};

	MHD_get_connection_values(c, MHD_HEADER_KIND, framing_header, &f);
	if (f.cl2)
		return http_error_close(h, c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", NULL,
					"invalid_content_length",
					"the request has Content-Length headers that disagree (%.40s and %.40s): refused, "
					"as a proxy in front could read its body differently (request smuggling); send one",
					f.cl, f.cl2);
	if (f.te && f.n_cl)
		return http_error_close(h, c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", NULL,
					"invalid_content_length",
					"the request has both Content-Length and Transfer-Encoding: refused, as a proxy "
					"in front could read its body differently (request smuggling); send one");
	if (f.te && strcasecmp(f.te, "chunked"))
		return http_error_close(h, c, MHD_HTTP_NOT_IMPLEMENTED, "invalid_request_error", NULL,
					"unsupported_transfer_encoding",
					"Transfer-Encoding '%.40s' is not supported: send the body with Content-Length, or "
					"chunked", f.te);
	return -1;
}

static enum MHD_Result route_post(struct ctrl_http *h, struct MHD_Connection *c, struct conn_state *cs,
				  const char *url)
{
	json_t *req;
	struct http_verr e;
	enum MHD_Result ret;
	int gen_route = !strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions");

	if (!gen_route && strcmp(url, "/tokenize") && strcmp(url, "/detokenize"))
		return http_error(h, c, MHD_HTTP_NOT_FOUND, "invalid_request_error", NULL, "not_found",
				  "no route POST %s (see GET /v1/models, POST /v1/completions, POST /v1/chat/completions)", url);
	if (gen_route && atomic_load(&h->draining))
		return http_error(h, c, MHD_HTTP_SERVICE_UNAVAILABLE, "service_unavailable", NULL,
				  "draining", "kvferry-ctrld is draining and admits no new requests; retry on another replica or after `ctrlctl resume`");
	req = http_read_body(cs->body.p, cs->body.len, &e);
	if (!req)
		return http_verr_send(h, c, &e);
	if (!strcmp(url, "/v1/completions"))
		ret = http_generate(h, c, cs, GEN_COMPLETION, req);
	else if (!strcmp(url, "/v1/chat/completions"))
		ret = http_generate(h, c, cs, GEN_CHAT, req);
	else if (!strcmp(url, "/tokenize"))
		ret = http_tokenize(h, c, req);
	else
		ret = http_detokenize(h, c, req);
	json_decref(req);
	return ret;
}

/* The routes monitoring polls (the dashboard each second, Prometheus each
 * scrape): counted apart, so requests_total counts clients' requests. */
static int monitor_route(const char *method, const char *url)
{
	return (!strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD)) &&
	       (!strcmp(url, "/stats") || !strcmp(url, "/dashboard") || !strcmp(url, "/metrics") ||
		!strcmp(url, "/health") || !strcmp(url, "/livez") || !strcmp(url, "/readyz"));
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version, const char *upload,
				  size_t *upload_size, void **con_cls)
{
	struct ctrl_http *h = cls;
	struct conn_state *cs = *con_cls;
	int post = !strcmp(method, MHD_HTTP_METHOD_POST), rc;

	(void)version;
	if (!cs) {
		const char *cl;

		cs = calloc(1, sizeof(*cs));
		if (!cs)
			return MHD_NO;
		*con_cls = cs;
		atomic_fetch_add(monitor_route(method, url) ? &h->n_monitor : &h->n_req, 1);
		/* Answered now, before any body is read (MHD then discards it
		 * and closes): the framing, the limit, the size. */
		rc = refuse_framing(h, c);
		if (rc < 0 && http_conn_over_limit(h) && strcmp(url, "/livez")) {
			atomic_fetch_add(&h->n_conn_refused, 1);
			rc = http_error_close(h, c, MHD_HTTP_SERVICE_UNAVAILABLE, "service_unavailable", NULL,
					      "too_many_connections",
					      "kvferry-ctrld has more than max_connections (%d) connections open; retry "
					      "later, reuse a connection, or raise max_connections", h->max_connections);
		}
		cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
		if (rc < 0 && cl && strtoull(cl, NULL, 10) > h->body_limit)
			rc = http_error(h, c, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", NULL,
					"request_too_large", "request body of %s bytes exceeds request_body_limit (%zu bytes); raise request_body_limit in kvferry.conf",
					cl, h->body_limit);
		if (rc < 0)
			return MHD_YES; /* the body, if any, comes next */
		cs->first_done = 1;
		http_conn_arrived(h, c);
		return (enum MHD_Result)rc;
	}
	if (cs->gen)
		return http_generate_resume(h, c, cs);
	if (*upload_size) {
		if (!cs->too_big && cs->body.len + *upload_size > h->body_limit) {
			cs->too_big = 1;
			kvf_buf_free(&cs->body);
		}
		if (!cs->too_big && kvf_buf_add(&cs->body, upload, *upload_size))
			return MHD_NO;
		*upload_size = 0;
		return MHD_YES;
	}
	if (cs->first_done)
		return MHD_YES;
	cs->first_done = 1;
	http_conn_arrived(h, c);
	if (cs->too_big)
		return http_error(h, c, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", NULL,
				  "request_too_large", "request body exceeds request_body_limit (%zu bytes); raise request_body_limit in kvferry.conf",
				  h->body_limit);
	if ((rc = http_native_route(h, c, cs, method, url)) >= 0)
		return (enum MHD_Result)rc;
	if (!strcmp(method, MHD_HTTP_METHOD_OPTIONS) && h->cors[0])
		return http_preflight(h, c, url);
	if (post)
		return route_post(h, c, cs, url);
	if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
		return http_error(h, c, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", NULL,
				  "method_not_allowed", "method %s is not allowed on %s", method, url);
	if (!strcmp(url, "/v1/models"))
		return serve_models(h, c);
	if (!strncmp(url, "/v1/models/", 11))
		return serve_model(h, c, url + 11);
	if (!strcmp(url, "/health") || !strcmp(url, "/readyz") || !strcmp(url, "/livez"))
		return serve_probe(h, c, !strcmp(url, "/livez"));
	if (!strcmp(url, "/stats")) {
		const char *f = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "format");
		return http_stats(h, c, f && !strcmp(f, "html"));
	}
	if (!strcmp(url, "/dashboard"))
		return http_stats(h, c, 1);
	if (!strcmp(url, "/metrics"))
		return http_metrics(h, c);
	if (!strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions") ||
	    !strcmp(url, "/tokenize") || !strcmp(url, "/detokenize"))
		return http_error(h, c, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", NULL,
				  "method_not_allowed", "%s takes POST, not %s", url, method);
	return http_error(h, c, MHD_HTTP_NOT_FOUND, "invalid_request_error", NULL, "not_found",
			  "no route GET %s", url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	struct ctrl_http *h = cls;
	struct conn_state *cs = *con_cls;

	(void)toe;
	http_conn_answered(h, c); /* a next request on this connection: its deadline runs */
	if (!cs)
		return;
	if (cs->gen)
		gen_connection_closed(cs->gen);
	kvf_buf_free(&cs->body);
	free(cs);
	*con_cls = NULL;
}

/* Resume every suspended connection that still has a client, so each one
 * runs its handler again (to send queued tokens or notice a closed socket). */
static void resume_all(struct ctrl_http *h)
{
	pthread_mutex_lock(&h->mu);
	for (struct gen *g = h->gens; g; g = g->next) {
		pthread_mutex_lock(&g->mu);
		if (g->suspended && !g->conn_gone) {
			g->suspended = 0;
			MHD_resume_connection(g->conn);
		}
		pthread_mutex_unlock(&g->mu);
	}
	pthread_mutex_unlock(&h->mu);
}

/* Every HTTP_TICK_MS, resume suspended connections so each looks at its socket. */
static void *ticker(void *arg)
{
	struct ctrl_http *h = arg;
	struct timespec ts;

	pthread_mutex_lock(&h->tick_mu);
	while (!atomic_load(&h->stopping)) {
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += HTTP_TICK_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&h->tick_cv, &h->tick_mu, &ts);
		resume_all(h);
		http_conn_sweep(h);
	}
	pthread_mutex_unlock(&h->tick_mu);
	return NULL;
}

/* Free what ctrl_http_start() sets up before the daemon starts: the locks
 * and the copies of the options. */
static void http_free(struct ctrl_http *h)
{
	pthread_cond_destroy(&h->tick_cv);
	pthread_mutex_destroy(&h->tick_mu);
	pthread_mutex_destroy(&h->conn_mu);
	pthread_mutex_destroy(&h->mu);
	free(h->stop_ids);
	free(h->model);
	free(h->model_path);
	free(h->pd_mode);
	free(h->address);
	free(h->cors);
	free(h);
}

struct ctrl_http *ctrl_http_start(const struct ctrl_http_opts *o, const struct ctrl_http_backend *be,
				  char *err, size_t errlen)
{
	struct ctrl_http *h;
	struct sockaddr_storage ss;
	socklen_t sl;
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_AUTO |
			 MHD_USE_ERROR_LOG;
	const union MHD_DaemonInfo *di;
	unsigned mhd_limit;
	int e;

	memset(&ss, 0, sizeof(ss));
	if (!o || !be || !be->submit || !be->cancel || !o->tok || !o->model_name || o->threads < 1 ||
	    o->max_context < 2 || o->max_connections < 0 || o->connection_timeout_s < 0 ||
	    o->request_timeout_s < 0) {
		snprintf(err, errlen, "ctrl_http_start: missing backend, tokenizer or model name, or bad "
			 "threads/context/connection limits");
		errno = EINVAL;
		return NULL;
	}
	if (ctrl_config_cors_check(o->cors_origins, err, errlen)) {
		errno = EINVAL;
		return NULL;
	}
	if (inet_pton(AF_INET, o->address, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
		struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
		s4->sin_family = AF_INET;
		s4->sin_port = htons(o->port);
		sl = sizeof(*s4);
	} else if (inet_pton(AF_INET6, o->address, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons(o->port);
		sl = sizeof(*s6);
		flags |= MHD_USE_IPv6;
	} else {
		snprintf(err, errlen, "listen_address '%s' is not an IPv4 or IPv6 address (write e.g. 127.0.0.1 or ::1)",
			 o->address);
		errno = EINVAL;
		return NULL;
	}
	(void)sl;
	/* max_connections 0 (no 503): MHD's own default, FD_SETSIZE - 4. Each
	 * of MHD's threads takes an equal share of its limit. */
	mhd_limit = o->max_connections > 0 ? (unsigned)o->max_connections + HTTP_CONN_SPARE : FD_SETSIZE - 4;
	if (mhd_limit < 4u * (unsigned)o->threads)
		mhd_limit = 4u * (unsigned)o->threads;
	h = calloc(1, sizeof(*h));
	if (!h)
		goto nomem;
	pthread_mutex_init(&h->mu, NULL);
	pthread_mutex_init(&h->conn_mu, NULL);
	pthread_mutex_init(&h->tick_mu, NULL);
	pthread_cond_init(&h->tick_cv, NULL);
	h->be = *be;
	h->address = strdup(o->address);
	h->model = strdup(o->model_name);
	h->model_path = strdup(o->model_path ? o->model_path : o->model_name);
	h->pd_mode = strdup(o->pd_mode ? o->pd_mode : "null");
	h->cors = strdup(o->cors_origins ? o->cors_origins : "");
	atomic_init(&h->bootstrap_port, o->bootstrap_port);
	h->pp_size = o->pp_size > 0 ? o->pp_size : 1;
	h->stop_ids = calloc((size_t)o->n_stop + 1, sizeof(int32_t));
	if (!h->address || !h->model || !h->model_path || !h->pd_mode || !h->cors || !h->stop_ids) {
		http_free(h);
		goto nomem;
	}
	if (o->n_stop)
		memcpy(h->stop_ids, o->stop_ids, (size_t)o->n_stop * sizeof(int32_t));
	h->n_stop = o->n_stop;
	h->threads = o->threads;
	h->max_context = o->max_context;
	h->max_tokens_default = o->max_tokens_default;
	h->body_limit = o->body_limit;
	h->tok = o->tok;
	h->max_connections = o->max_connections;
	h->request_timeout_s = o->request_timeout_s;
	h->started = (int64_t)time(NULL);
	h->t0 = http_now();
	if (getrandom(&h->id_salt, sizeof(h->id_salt), GRND_NONBLOCK) != (ssize_t)sizeof(h->id_salt))
		h->id_salt = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
	h->d = MHD_start_daemon(flags, o->port, NULL, NULL, on_request, h,
				MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
				MHD_OPTION_THREAD_POOL_SIZE, (unsigned)o->threads,
				MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
				MHD_OPTION_NOTIFY_CONNECTION, http_conn_notify, h,
				MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->connection_timeout_s,
				MHD_OPTION_CONNECTION_LIMIT, mhd_limit,
				MHD_OPTION_END);
	if (!h->d) {
		e = errno ? errno : EADDRINUSE;
		snprintf(err, errlen, "MHD_start_daemon(%s port %u) failed: %s (is another server on that port? set port/listen_address)",
			 o->address, o->port, strerror(e));
		goto fail_sync;
	}
	di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
	h->port = di ? di->port : o->port;
	if (pthread_create(&h->ticker, NULL, ticker, h)) {
		e = ENOMEM;
		snprintf(err, errlen, "pthread_create(http ticker) failed");
		MHD_stop_daemon(h->d);
		goto fail_sync;
	}
	pthread_setname_np(h->ticker, "http-ticker"); /* the names top -H and profiles show */
	h->ticker_started = 1;
	return h;
fail_sync:
	http_free(h);
	errno = e;
	return NULL;
nomem:
	snprintf(err, errlen, "ctrl_http_start: out of memory");
	errno = ENOMEM;
	return NULL;
}

int ctrl_http_cancel_all(struct ctrl_http *h)
{
	int n = 0;

	pthread_mutex_lock(&h->mu);
	for (struct gen *g = h->gens; g; g = g->next) {
		int send;
		pthread_mutex_lock(&g->mu);
		send = !g->backend_done && !g->cancel_sent && g->id;
		if (send)
			g->cancel_sent = 1;
		pthread_mutex_unlock(&g->mu);
		if (send) {
			h->be.cancel(h->be.ctx, g->id);
			n++;
		}
	}
	pthread_mutex_unlock(&h->mu);
	return n;
}

void ctrl_http_stop(struct ctrl_http *h)
{
	if (!h)
		return;
	/* No connection suspends once stopping is set (it is checked under
	 * each request's lock), and every one suspended now is resumed, so
	 * MHD_stop_daemon finds none suspended. */
	atomic_store(&h->stopping, 1);
	pthread_mutex_lock(&h->tick_mu);
	pthread_cond_signal(&h->tick_cv);
	pthread_mutex_unlock(&h->tick_mu);
	if (h->ticker_started)
		pthread_join(h->ticker, NULL);
	ctrl_http_cancel_all(h);
	resume_all(h);
	MHD_stop_daemon(h->d);
	/* Requests whose backend side is still open keep h alive through
	 * their reference; the caller stops the backend only after this, so
	 * wait until they are gone. */
	while (atomic_load(&h->active) > 0) {
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	http_free(h);
}

uint16_t ctrl_http_port(const struct ctrl_http *h)
{
	return h->port;
}

void ctrl_http_set_bootstrap_port(struct ctrl_http *h, int32_t port)
{
	atomic_store(&h->bootstrap_port, port);
}

void ctrl_http_set_draining(struct ctrl_http *h, int draining)
{
	atomic_store(&h->draining, draining ? 1 : 0);
}

int ctrl_http_draining(const struct ctrl_http *h)
{
	return atomic_load(&((struct ctrl_http *)h)->draining);
}

int ctrl_http_active(const struct ctrl_http *h)
{
	return atomic_load(&((struct ctrl_http *)h)->active);
}

json_t *ctrl_http_requests_json(struct ctrl_http *h)
{
	json_t *a = json_array();
	double now = http_now();

	if (!a)
		return NULL;
	pthread_mutex_lock(&h->mu);
	for (struct gen *g = h->gens; g; g = g->next) {
		int32_t seen;
		pthread_mutex_lock(&g->mu);
		seen = g->n_seen;
		pthread_mutex_unlock(&g->mu);
		json_array_append_new(a, json_pack("{s:s, s:I, s:s, s:b, s:i, s:i, s:i, s:f}", "id", g->rid,
						   "backend_id", (json_int_t)g->id, "endpoint",
						   g->kind == GEN_CHAT ? "chat" : "completions", "stream",
						   g->stream, "prompt_tokens", g->n_prompt, "max_tokens",
						   g->max_tokens, "generated", seen, "age_s", now - g->t_start));
	}
	pthread_mutex_unlock(&h->mu);
	return a;
}
