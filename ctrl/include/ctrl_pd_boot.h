/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file ctrl_pd_boot.h
 * PD bootstrap: the prefill side's registry of its ranks and the routes a
 * decode node (or an external router) reads it through, the same routes
 * and fields as SGLang's disaggregation bootstrap server so its tooling
 * carries over:
 *
 *  - `PUT /route` with a JSON body registers one prefill rank: its parallel
 *    position (tp/dp/pp size and rank; cp optional, default 1/0), the
 *    address its KV pages leave from (`rank_ip`, `rank_port`), `page_size`
 *    and `kv_cache_dtype`; kvferry adds the layer range and head layout
 *    (`num_layers`, `layer_start`, `layer_end`, `num_kv_heads`, `head_dim`),
 *    optional for other senders. 200 "OK"; 400 naming a missing or bad
 *    field, or a size that differs from the ranks already registered.
 *  - `GET /route` with every selector -1 answers the parallel info (both
 *    spellings SGLang has used: `attn_tp_size`/`dp_size`/`pp_size`/... and
 *    `prefill_attn_tp_size`/`prefill_tp_size`/`prefill_dp_size`/
 *    `prefill_pp_size`), 503 until every rank (dp x cp x tp x pp) has
 *    registered. With concrete selectors it answers that rank's
 *    `{rank_ip, rank_port}` (503 while not all are in, 404 if unknown).
 *    Selectors: `prefill_dp_rank`, `prefill_cp_rank`, `target_tp_rank`,
 *    `target_pp_rank`, or the older `engine_rank` (the tp rank),
 *    `target_dp_group` and optional `target_pp_rank`. 400 when one is
 *    missing or not an integer.
 *  - `GET /health` answers 200 "OK". Any other route is 404, another method
 *    on /route 405.
 *
 * Threading: every call may come from any thread (one mutex).
 */
#ifndef CTRL_PD_BOOT_H
#define CTRL_PD_BOOT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Most ranks one registry holds (dp x cp x tp x pp). */
#define CTRL_PD_MAX_RANKS 256

/** What every rank of a prefill deployment shares. */
struct ctrl_pd_info {
	int32_t tp_size, cp_size, dp_size, pp_size;
	int32_t page_size;         /**< positions per KV page (kvferry: KN_PAGE_BLK) */
	char kv_dtype[16];         /**< "bfloat16", "float32", or what the sender said */
	int32_t n_layers;          /**< model layers; 0 = not said (another sender) */
	int32_t n_kv_heads, head_dim; /**< 0 = not said */
	/* kvferry's own, in the parallel info (kvferry_dataplane_node, kvferry_api_port):
	 * how a kvferry decode node reaches this prefill node without more set-up */
	int32_t dataplane_node;    /**< the node id of its kvferry-dataplane; -1 = not said */
	int32_t api_port;          /**< its OpenAI API's TCP port; 0 = not said */
};

/** One registered rank. */
struct ctrl_pd_rank {
	int32_t dp, cp, tp, pp;
	char ip[64];
	int32_t port;
	int32_t layer_start, layer_end; /**< -1 = not said */
};

struct ctrl_pd_boot;

/** @return an empty registry, or NULL (ENOMEM). */
struct ctrl_pd_boot *ctrl_pd_boot_create(void);

/** NULL is a no-op. */
void ctrl_pd_boot_destroy(struct ctrl_pd_boot *b);

/**
 * Register (or re-register: same position, new address) one rank.
 * @return 0, -EINVAL (a rank outside its size, a size or page layout that
 *         differs from the ranks already in: @p err names both values),
 *         -ENOSPC (CTRL_PD_MAX_RANKS positions taken).
 */
int ctrl_pd_boot_register(struct ctrl_pd_boot *b, const struct ctrl_pd_info *info,
			  const struct ctrl_pd_rank *rank, char *err, size_t errlen);

/** @return 1 once every position of the registered sizes is in, else 0. */
int ctrl_pd_boot_ready(struct ctrl_pd_boot *b);

/** A route's answer: HTTP status, body (malloc'd; free it), content type. */
struct ctrl_pd_reply {
	int status;
	char *body;
	const char *content_type;
};

/** Looks a query parameter up: its value, or NULL when absent. */
typedef const char *(*ctrl_pd_query_fn)(void *arg, const char *key);

/**
 * Answer one request for @p method @p path (no query string in it) with the
 * query parameters behind @p query and the request body @p body (PUT).
 * @return 0 with @p out filled (its body may be NULL only if out of memory:
 *         status is then 500).
 */
int ctrl_pd_boot_handle(struct ctrl_pd_boot *b, const char *method, const char *path,
			ctrl_pd_query_fn query, void *arg, const char *body, size_t body_len,
			struct ctrl_pd_reply *out);

/** Counters for /metrics and ctrlctl. */
struct ctrl_pd_boot_stats {
	uint64_t puts, puts_refused, gets, gets_not_ready, gets_not_found, gets_bad;
	int32_t registered, expected;
};

void ctrl_pd_boot_stats(struct ctrl_pd_boot *b, struct ctrl_pd_boot_stats *st);

/* ---- the bootstrap HTTP server (libmicrohttpd), on its own port ---- */

struct ctrl_pd_boot_server;

/**
 * Serve @p b's routes on @p address : @p port (0 = a free port).
 * @return the server, or NULL with @p err naming the address and the fix.
 */
struct ctrl_pd_boot_server *ctrl_pd_boot_serve(struct ctrl_pd_boot *b, const char *address, int port,
					       char *err, size_t errlen);

/** The port it listens on. */
int ctrl_pd_boot_server_port(const struct ctrl_pd_boot_server *s);

/** Stop and free the server (NULL is a no-op); the registry stays. */
void ctrl_pd_boot_server_stop(struct ctrl_pd_boot_server *s);

struct ctrl_admin;

/**
 * Register /pd/bootstrap (`ctrlctl bootstrap`) on @p a: the role (0 both,
 * 1 prefill, 2 decode) and, when @p s serves the routes, its port, ranks
 * and counters. @return 0 or ctrl_admin_register()'s error.
 */
int ctrl_pd_boot_admin_register(struct ctrl_admin *a, const struct ctrl_pd_boot_server *s, int role);

/* ---- the decode side's lookups (libcurl) ---- */

/**
 * GET /route with every selector -1 from the prefill node's bootstrap
 * address @p addr ("host:port"), waiting at most @p timeout_s.
 * @return 0, -EAGAIN (503: not every rank registered yet), -EHOSTUNREACH
 *         (no answer within the timeout), -EPROTO (another status or a body
 *         that is not the parallel info); @p err says which.
 */
int ctrl_pd_fetch_info(const char *addr, double timeout_s, struct ctrl_pd_info *out, char *err,
		       size_t errlen);

/**
 * GET /route for one rank. @return 0, -ENOENT (404), -EAGAIN, -EHOSTUNREACH,
 * -EPROTO.
 */
int ctrl_pd_fetch_rank(const char *addr, int32_t dp, int32_t cp, int32_t tp, int32_t pp, double timeout_s,
		       struct ctrl_pd_rank *out, char *err, size_t errlen);

/** GET /health. @return 0 (200 "OK"), -EHOSTUNREACH, -EPROTO. */
int ctrl_pd_health(const char *addr, double timeout_s, char *err, size_t errlen);

/**
 * Can this node (@p local) take KV pages from a prefill deployment with
 * @p remote's layout? Page size, KV dtype, layer count and head layout must
 * match where @p remote says them.
 * @return 0, or -EINVAL with @p err naming the field and both values.
 */
int ctrl_pd_check_contract(const struct ctrl_pd_info *remote, const struct ctrl_pd_info *local,
			   const char *addr, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* CTRL_PD_BOOT_H */
