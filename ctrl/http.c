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
 * gone. 250 ms bounds how long a dead client keeps its KV blocks.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "http_int.h"

#define HTTP_TICK_MS 250

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
}

static enum MHD_Result serve_models(struct ctrl_http *h, struct MHD_Connection *c)
{
	json_t *j = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:s, s:i}]}", "object", "list", "data",
			      "id", h->model, "object", "model", "created", (json_int_t)h->started,
			      "owned_by", "kvferry", "root", h->model, "max_model_len", h->max_context);
	return http_json(h, c, MHD_HTTP_OK, j);
}

static enum MHD_Result serve_health(struct ctrl_http *h, struct MHD_Connection *c)
{
	int dr = atomic_load(&h->draining);

	return http_json(h, c, dr ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK,
			 json_pack("{s:s}", "status", dr ? "draining" : "ok"));
}

static enum MHD_Result route_post(struct ctrl_http *h, struct MHD_Connection *c, struct conn_state *cs,
				  const char *url)
{
	json_t *req;
	json_error_t je;
	enum MHD_Result ret;
	int gen_route = !strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions");

	if (!gen_route && strcmp(url, "/tokenize") && strcmp(url, "/detokenize"))
		return http_error(h, c, MHD_HTTP_NOT_FOUND, "invalid_request_error", NULL, "not_found",
				  "no route POST %s (see GET /v1/models, POST /v1/completions, POST /v1/chat/completions)", url);
	if (gen_route && atomic_load(&h->draining))
		return http_error(h, c, MHD_HTTP_SERVICE_UNAVAILABLE, "service_unavailable", NULL,
				  "draining", "kvferry-ctrld is draining and admits no new requests; retry on another replica or after `ctrlctl resume`");
	req = json_loadb(cs->body.p ? cs->body.p : "", cs->body.len, JSON_REJECT_DUPLICATES, &je);
	if (!req || !json_is_object(req)) {
		json_decref(req);
		return http_error(h, c, MHD_HTTP_BAD_REQUEST, "invalid_request_error", NULL, "invalid_json",
				  "the request body is not a JSON object (%s at line %d column %d)",
				  req ? "expected an object" : je.text, je.line, je.column);
	}
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
	       (!strcmp(url, "/stats") || !strcmp(url, "/dashboard") || !strcmp(url, "/metrics"));
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version, const char *upload,
				  size_t *upload_size, void **con_cls)
{
	struct ctrl_http *h = cls;
	struct conn_state *cs = *con_cls;
	int post = !strcmp(method, MHD_HTTP_METHOD_POST);

	(void)version;
	if (!cs) {
		const char *cl;
		cs = calloc(1, sizeof(*cs));
		if (!cs)
			return MHD_NO;
		*con_cls = cs;
		atomic_fetch_add(monitor_route(method, url) ? &h->n_monitor : &h->n_req, 1);
		cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
		if (cl && strtoull(cl, NULL, 10) > h->body_limit) {
			cs->first_done = 1;
			return http_error(h, c, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", NULL,
					  "request_too_large", "request body of %s bytes exceeds request_body_limit (%zu bytes); raise request_body_limit in kvferry.conf",
					  cl, h->body_limit);
		}
		return MHD_YES;
	}
	if (cs->gen)
		return http_generate_resume(h, c, cs);
	if (*upload_size) {
		if (!cs->too_big && cs->body.len + *upload_size > h->body_limit) {
			cs->too_big = 1;
			sbuf_free(&cs->body);
		}
		if (!cs->too_big && sbuf_add(&cs->body, upload, *upload_size))
			return MHD_NO;
		*upload_size = 0;
		return MHD_YES;
	}
	if (cs->first_done)
		return MHD_YES;
	cs->first_done = 1;
	if (cs->too_big)
		return http_error(h, c, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", NULL,
				  "request_too_large", "request body exceeds request_body_limit (%zu bytes); raise request_body_limit in kvferry.conf",
				  h->body_limit);
	if (post)
		return route_post(h, c, cs, url);
	if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
		return http_error(h, c, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", NULL,
				  "method_not_allowed", "method %s is not allowed on %s", method, url);
	if (!strcmp(url, "/v1/models"))
		return serve_models(h, c);
	if (!strcmp(url, "/health"))
		return serve_health(h, c);
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
	struct conn_state *cs = *con_cls;

	(void)cls;
	(void)c;
	(void)toe;
	if (!cs)
		return;
	if (cs->gen)
		gen_connection_closed(cs->gen);
	sbuf_free(&cs->body);
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
	}
	pthread_mutex_unlock(&h->tick_mu);
	return NULL;
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
	int e;

	memset(&ss, 0, sizeof(ss));
	if (!o || !be || !be->submit || !be->cancel || !o->tok || !o->model_name || o->threads < 1 ||
	    o->max_context < 2) {
		snprintf(err, errlen, "ctrl_http_start: missing backend, tokenizer or model name, or bad threads/context");
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
	h = calloc(1, sizeof(*h));
	if (!h)
		goto nomem;
	h->be = *be;
	h->address = strdup(o->address);
	h->model = strdup(o->model_name);
	h->stop_ids = calloc((size_t)o->n_stop + 1, sizeof(int32_t));
	if (!h->address || !h->model || !h->stop_ids)
		goto fail_free;
	if (o->n_stop)
		memcpy(h->stop_ids, o->stop_ids, (size_t)o->n_stop * sizeof(int32_t));
	h->n_stop = o->n_stop;
	h->threads = o->threads;
	h->max_context = o->max_context;
	h->max_tokens_default = o->max_tokens_default;
	h->body_limit = o->body_limit;
	h->tok = o->tok;
	h->started = (int64_t)time(NULL);
	h->t0 = http_now();
	pthread_mutex_init(&h->mu, NULL);
	pthread_mutex_init(&h->tick_mu, NULL);
	pthread_cond_init(&h->tick_cv, NULL);
	h->d = MHD_start_daemon(flags, o->port, NULL, NULL, on_request, h,
				MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
				MHD_OPTION_THREAD_POOL_SIZE, (unsigned)o->threads,
				MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
				MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
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
	pthread_cond_destroy(&h->tick_cv);
	pthread_mutex_destroy(&h->tick_mu);
	pthread_mutex_destroy(&h->mu);
	free(h->stop_ids);
	free(h->model);
	free(h->address);
	free(h);
	errno = e;
	return NULL;
fail_free:
	free(h->stop_ids);
	free(h->model);
	free(h->address);
	free(h);
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
	pthread_cond_destroy(&h->tick_cv);
	pthread_mutex_destroy(&h->tick_mu);
	pthread_mutex_destroy(&h->mu);
	free(h->stop_ids);
	free(h->model);
	free(h->address);
	free(h);
}

uint16_t ctrl_http_port(const struct ctrl_http *h)
{
	return h->port;
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
