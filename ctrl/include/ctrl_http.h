/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file ctrl_http.h
 * The OpenAI-compatible HTTP API of kvferry-ctrld (libmicrohttpd):
 * POST /v1/completions, POST /v1/chat/completions (JSON or SSE streaming),
 * SGLang's native POST /generate (with /health_generate, /flush_cache,
 * GET /get_model_info and /get_server_info: what its router and tools use),
 * GET /v1/models, GET /v1/models/{id}, POST /tokenize, POST /detokenize,
 * GET /health and /readyz (readiness), GET /livez (liveness),
 * GET /stats (JSON; ?format=html or /dashboard for a live page),
 * GET /metrics (Prometheus text). ctrl/API.md documents each route.
 *
 * The server tokenizes and renders chat prompts itself (kn_tok) and hands
 * token ids to a backend through struct ctrl_http_backend; tokens come back
 * through the request's callback on the backend's thread, are queued under
 * a per-request lock and the connection is resumed (MHD_resume_connection):
 * the backend thread never waits on a client.
 *
 * Invariants:
 *  - Every request that reached the backend ends exactly once there: it
 *    finishes, or it is cancelled when its client disconnects or a stop
 *    string ends it early.
 *  - A request's memory lives until both its connection and its backend
 *    request are over (two references).
 *
 * Threading: ctrl_http_start()/ctrl_http_stop() from one thread; the other
 * functions from any thread. Backend callbacks may come from any one thread.
 */
#ifndef CTRL_HTTP_H
#define CTRL_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "ctrl_sched.h"
#include "kn_tok.h"

#ifdef __cplusplus
extern "C" {
#endif

/** What the HTTP layer generates with. */
/** A request's PD bootstrap fields (SGLang's: how a router drives a prefill/decode pair). */
struct ctrl_http_pd {
	uint64_t room;               /**< bootstrap_room */
	const char *host;            /**< bootstrap_host, or NULL */
	int32_t port;                /**< bootstrap_port, 0 if absent */
	uint32_t session;            /**< kvferry_session: the forwarding decode node's session, 0 if absent */
};

struct ctrl_http_backend {
	/**
	 * Start a request (ctrl_sched_submit() semantics: buffers copied; the
	 * callback runs once per token and once at the end).
	 * @return an id > 0, or -EAGAIN (queue full: 503), -ENETDOWN (PD: no
	 *         healthy prefill node: 503), -ESHUTDOWN (PD: the decode node
	 *         released its registrations: 503), -EINVAL, -ENOMEM.
	 */
	int64_t (*submit)(void *ctx, const struct ctrl_request *r);
	/** Cancel request @p id (its finish event still comes). @return 0 or -errno. */
	int (*cancel)(void *ctx, uint64_t id);
	/** Backend counters for /stats and /metrics: a new JSON object, or NULL. */
	json_t *(*stats)(void *ctx);
	void *ctx;
	/**
	 * Optional: start a request that carries bootstrap_room (submit's
	 * semantics; also -EHOSTUNREACH: bootstrap_host names no prefill node
	 * this decode node knows, 400). NULL: such a request is served like
	 * any other.
	 */
	int64_t (*submit_pd)(void *ctx, const struct ctrl_request *r, const struct ctrl_http_pd *pd);
	/*
	 * The two below have contexts of their own: a backend that wraps
	 * another (ctrl_pd_serve_backend()) replaces ctx and keeps them.
	 */
	/**
	 * Optional: can the backend serve now (GET /health, /readyz, /stats
	 * "ready")? Called on an HTTP thread at every probe: it answers from
	 * what the backend already knows, never waiting on the backend's
	 * threads. NULL: always ready.
	 * @param why  when not ready: what is down, for the 503's "reason"
	 * @return 1 ready, 0 not.
	 */
	int (*ready)(void *ready_ctx, char *why, size_t whylen);
	void *ready_ctx;
	/**
	 * Optional: the most max_tokens a prompt of @p n_prompt tokens could
	 * ever be admitted with (ctrl_sched_admissible()'s contract: @p err
	 * gets the refusal when @p max_tokens is above it). A request asking
	 * for more is answered 400 before anything is streamed; a request that
	 * does not say gets at most that many. Called on an HTTP thread:
	 * cheap, never blocks. NULL: every request is submitted.
	 */
	int32_t (*admissible)(void *admit_ctx, int32_t n_prompt, int32_t max_tokens, char *err, size_t errlen);
	void *admit_ctx;
	/**
	 * Optional: this node's dataplane as /stats "dataplane" (and so
	 * /metrics kvferry_dataplane_*): a new JSON object, or NULL when the
	 * node has none. Called on an HTTP thread; reads shared counters only.
	 */
	json_t *(*node_stats)(void *node_ctx);
	void *node_ctx;
	/**
	 * Optional: forget the prefix cache (POST /flush_cache). Called on an
	 * HTTP thread; never blocks. @return 0, or -ENOTSUP (none is kept).
	 * NULL: none is kept.
	 */
	int (*flush)(void *flush_ctx);
	void *flush_ctx;
};

/** Server options. */
struct ctrl_http_opts {
	const char *address;         /**< IPv4 or IPv6 literal */
	uint16_t port;               /**< 0: an ephemeral port (ctrl_http_port() tells) */
	int32_t threads;             /**< MHD worker threads */
	size_t body_limit;           /**< bytes; larger bodies get 413 */
	const char *model_name;      /**< the only model this server serves */
	int32_t max_context;         /**< prompt + max_tokens limit */
	int32_t max_tokens_default;  /**< when a request does not say */
	const struct kn_tok *tok;    /**< borrowed; must outlive the server */
	const int32_t *stop_ids;     /**< ids that end generation (EOS); copied */
	int32_t n_stop;
	int32_t connection_timeout_s; /**< a connection that sends and receives nothing this
	                                   long is closed (MHD_OPTION_CONNECTION_TIMEOUT); 0: never */
	double request_timeout_s;    /**< a connection's request (headers and body) must arrive
	                                   within this long of its opening or its previous answer's
	                                   end, however it trickles; 0: no deadline */
	/* what SGLang's GET /get_model_info and /get_server_info tell */
	const char *model_path;      /**< the model's directory; NULL: the model's name */
	const char *pd_mode;         /**< "prefill" or "decode" (disaggregation_mode); NULL: "null" */
	int32_t bootstrap_port;      /**< the PD bootstrap server's port; 0: none (or later, ctrl_http_set_bootstrap_port()) */
	int32_t pp_size;             /**< pipeline stages; 0: 1 */
	int32_t max_connections;     /**< requests on connections beyond this many open get 503
	                                   too_many_connections and the connection is closed; 0: no
	                                   such limit (libmicrohttpd's own, FD_SETSIZE - 4) */
	const char *cors_origins;    /**< browser origins allowed (CORS): NULL or "" none, "*" any,
	                                   or exact origins separated by commas; checked by
	                                   ctrl_config_cors_check() */
};

/**
 * Fill @p o with defaults: 127.0.0.1:8000, 4 threads, 1 MiB bodies, context
 * 4096, 256 tokens, connections idle 30 s closed, a request's 60 s deadline,
 * 1024 connections.
 */
void ctrl_http_opts_init(struct ctrl_http_opts *o);

struct ctrl_http;

/**
 * Start serving.
 * @param o    options (strings copied)
 * @param be   the backend (copied; its ctx must outlive the server)
 * @param err  receives a message naming the failing call and its address on failure
 * @return the server, or NULL with errno EINVAL (bad address or options),
 *         EADDRINUSE/EACCES (cannot listen), ENOMEM.
 */
struct ctrl_http *ctrl_http_start(const struct ctrl_http_opts *o, const struct ctrl_http_backend *be,
				  char *err, size_t errlen);

/**
 * Stop serving: close the listener and every connection; requests still at
 * the backend are cancelled and their finish events awaited, so the backend
 * must still be running (polled) until this returns. NULL is a no-op.
 */
void ctrl_http_stop(struct ctrl_http *h);

/** @return the TCP port listened on. */
uint16_t ctrl_http_port(const struct ctrl_http *h);

/**
 * Drain (1): new generation requests get 503 and /health says "draining";
 * requests in flight continue. Resume (0). Thread-safe.
 */
void ctrl_http_set_draining(struct ctrl_http *h, int draining);

/** The PD bootstrap server's port, once it listens (GET /get_server_info says it). Any thread. */
void ctrl_http_set_bootstrap_port(struct ctrl_http *h, int32_t port);

/**
 * Readiness, as GET /readyz and /health answer it: not draining, and the
 * backend's ready callback (if any) says it can serve. Thread-safe.
 * @param why  when not ready: why (may be NULL)
 * @return 1 ready, 0 not.
 */
int ctrl_http_ready(struct ctrl_http *h, char *why, size_t whylen);

/** @return 1 while draining. */
int ctrl_http_draining(const struct ctrl_http *h);

/** @return generation requests not yet over (connection or backend side). */
int ctrl_http_active(const struct ctrl_http *h);

/** Cancel every request in flight at the backend (drain timeout). @return how many. */
int ctrl_http_cancel_all(struct ctrl_http *h);

/**
 * The requests in flight: [{"id","backend_id","endpoint","stream",
 * "prompt_tokens","generated","age_s"}]. @return a new reference or NULL.
 */
json_t *ctrl_http_requests_json(struct ctrl_http *h);

/**
 * Everything /stats serves: {"model","uptime_s","draining","http":{...},
 * "latency":{<histogram>: {"le","buckets","count","sum"}},"backend":{...}}.
 * @return a new reference or NULL.
 */
json_t *ctrl_http_stats_json(struct ctrl_http *h);

/**
 * Render a stats object as Prometheus text: every number becomes a
 * kvferry_* sample in base units (ctrl/API.md "Metrics"); arrays of objects
 * become a label per element; an object shaped {"le","buckets","count","sum"}
 * a histogram. Every family has HELP and TYPE. Thread-safe (no state).
 * @return a malloc'd string, or NULL with errno ENOMEM.
 */
char *ctrl_http_prometheus(const json_t *stats);

/* ---- the scheduler as a backend (http_backend.c) ---- */

/**
 * Fill @p be with an adapter over the dispatcher @p d (borrowed: it must
 * outlive the server): submit and cancel go to ctrl_dispatch_*, stats to
 * ctrl_http_sched_stats_json(), admissible to ctrl_dispatch_admissible().
 * ready is left NULL: the daemon, which owns the chains, sets it.
 */
void ctrl_http_backend_sched(struct ctrl_http_backend *be, struct ctrl_dispatch *d);

/**
 * The scheduler counters of every replica: {"replicas":[{...,"stages":
 * [{"steps","cols","mean_step_us","busy_frac"}]}], "live","queued",...}.
 * Counter keys end in _total. Thread-safe.
 * @return a new reference, or NULL (ENOMEM).
 */
json_t *ctrl_http_sched_stats_json(struct ctrl_dispatch *d);

struct ctrl_admin;

/** Register /http/requests (`ctrlctl requests`) on @p a, reading @p h. @return 0 or ctrl_admin_register()'s error. */
int ctrl_http_admin_register(struct ctrl_admin *a, struct ctrl_http *h);

#ifdef __cplusplus
}
#endif
#endif /* CTRL_HTTP_H */
