/* SPDX-License-Identifier: Apache-2.0 */
/*
 * PD bootstrap registry and its routes (ctrl_pd_boot.h). The routes answer
 * what SGLang's bootstrap server answers, field for field, so a router or a
 * decode node that speaks it can read a kvferry prefill node.
 */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrl_pd_boot.h"

struct ctrl_pd_boot {
	pthread_mutex_t mu;
	int have_info;
	struct ctrl_pd_info info;
	struct ctrl_pd_rank ranks[CTRL_PD_MAX_RANKS];
	int32_t n_ranks;
	struct ctrl_pd_boot_stats st;
};

struct ctrl_pd_boot *ctrl_pd_boot_create(void)
{
	struct ctrl_pd_boot *b = calloc(1, sizeof(*b));

	if (b == NULL)
		return NULL;
	pthread_mutex_init(&b->mu, NULL);
	return b;
}

void ctrl_pd_boot_destroy(struct ctrl_pd_boot *b)
{
	if (b == NULL)
		return;
	pthread_mutex_destroy(&b->mu);
	free(b);
}

static int64_t expected_of(const struct ctrl_pd_info *i)
{
	return (int64_t)i->tp_size * i->cp_size * i->dp_size * i->pp_size;
}

/* A field of @p a that differs from @p b: its name and both values in @p err. */
static int same_info(const struct ctrl_pd_info *a, const struct ctrl_pd_info *b, char *err, size_t errlen)
{
	static const struct {
		const char *name;
		size_t off;
	} f[] = {
		{ "attn_tp_size", offsetof(struct ctrl_pd_info, tp_size) },
		{ "attn_cp_size", offsetof(struct ctrl_pd_info, cp_size) },
		{ "dp_size", offsetof(struct ctrl_pd_info, dp_size) },
		{ "pp_size", offsetof(struct ctrl_pd_info, pp_size) },
		{ "page_size", offsetof(struct ctrl_pd_info, page_size) },
		{ "num_layers", offsetof(struct ctrl_pd_info, n_layers) },
		{ "num_kv_heads", offsetof(struct ctrl_pd_info, n_kv_heads) },
		{ "head_dim", offsetof(struct ctrl_pd_info, head_dim) },
	};

	for (size_t k = 0; k < sizeof(f) / sizeof(f[0]); k++) {
		int32_t va = *(const int32_t *)((const char *)a + f[k].off);
		int32_t vb = *(const int32_t *)((const char *)b + f[k].off);

		if (va != vb) {
			snprintf(err, errlen, "%s %d differs from the %d the ranks already registered have: "
				 "every rank of one prefill deployment must agree", f[k].name, (int)va, (int)vb);
			return 0;
		}
	}
	if (strcmp(a->kv_dtype, b->kv_dtype) != 0) {
		snprintf(err, errlen, "kv_cache_dtype '%s' differs from the '%s' the ranks already registered "
			 "have: every rank of one prefill deployment must agree", a->kv_dtype, b->kv_dtype);
		return 0;
	}
	return 1;
}

int ctrl_pd_boot_register(struct ctrl_pd_boot *b, const struct ctrl_pd_info *info,
			  const struct ctrl_pd_rank *rank, char *err, size_t errlen)
{
	const struct ctrl_pd_rank *r = rank;
	int rc = 0;

	if (info->tp_size < 1 || info->cp_size < 1 || info->dp_size < 1 || info->pp_size < 1
	    || expected_of(info) > CTRL_PD_MAX_RANKS) {
		snprintf(err, errlen, "parallel sizes tp %d x cp %d x dp %d x pp %d: each must be >= 1 and "
			 "their product at most %d", (int)info->tp_size, (int)info->cp_size, (int)info->dp_size,
			 (int)info->pp_size, CTRL_PD_MAX_RANKS);
		return -EINVAL;
	}
	if (r->tp < 0 || r->tp >= info->tp_size || r->cp < 0 || r->cp >= info->cp_size || r->dp < 0
	    || r->dp >= info->dp_size || r->pp < 0 || r->pp >= info->pp_size) {
		snprintf(err, errlen, "rank tp %d / cp %d / dp %d / pp %d lies outside its sizes %d / %d / %d / %d",
			 (int)r->tp, (int)r->cp, (int)r->dp, (int)r->pp, (int)info->tp_size, (int)info->cp_size,
			 (int)info->dp_size, (int)info->pp_size);
		return -EINVAL;
	}
	if (info->page_size < 1) {
		snprintf(err, errlen, "page_size %d: must be >= 1", (int)info->page_size);
		return -EINVAL;
	}
	if (r->ip[0] == '\0' || r->port < 0 || r->port > 65535) {
		snprintf(err, errlen, "rank address '%s' port %d: an address and a port 0..65535 are required",
			 r->ip, (int)r->port);
		return -EINVAL;
	}
	pthread_mutex_lock(&b->mu);
	if (b->have_info && !same_info(info, &b->info, err, errlen)) {
		rc = -EINVAL;
		goto out;
	}
	for (int32_t k = 0; k < b->n_ranks; k++) {
		struct ctrl_pd_rank *o = &b->ranks[k];

		if (o->dp == r->dp && o->cp == r->cp && o->tp == r->tp && o->pp == r->pp) {
			*o = *r; /* a rank that restarted: its new address */
			goto out;
		}
	}
	if (b->n_ranks == CTRL_PD_MAX_RANKS) {
		snprintf(err, errlen, "%d ranks registered already (the most a registry holds)", CTRL_PD_MAX_RANKS);
		rc = -ENOSPC;
		goto out;
	}
	b->ranks[b->n_ranks++] = *r;
	if (!b->have_info) {
		b->info = *info;
		b->have_info = 1;
	}
out:
	pthread_mutex_unlock(&b->mu);
	return rc;
}

static int ready_locked(const struct ctrl_pd_boot *b)
{
	return b->have_info && b->n_ranks >= expected_of(&b->info);
}

int ctrl_pd_boot_ready(struct ctrl_pd_boot *b)
{
	int r;

	pthread_mutex_lock(&b->mu);
	r = ready_locked(b);
	pthread_mutex_unlock(&b->mu);
	return r;
}

void ctrl_pd_boot_stats(struct ctrl_pd_boot *b, struct ctrl_pd_boot_stats *st)
{
	pthread_mutex_lock(&b->mu);
	*st = b->st;
	st->registered = b->n_ranks;
	st->expected = b->have_info ? (int32_t)expected_of(&b->info) : 0;
	pthread_mutex_unlock(&b->mu);
}

/* ---- routes ---- */

static void reply_text(struct ctrl_pd_reply *out, int status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void reply_text(struct ctrl_pd_reply *out, int status, const char *fmt, ...)
{
	va_list ap;
	char buf[512];

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	out->status = status;
	out->content_type = "text/plain; charset=utf-8";
	out->body = strdup(buf);
	if (out->body == NULL)
		out->status = 500;
}

static void reply_json(struct ctrl_pd_reply *out, json_t *j)
{
	out->status = 200;
	out->content_type = "application/json";
	out->body = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
	if (out->body == NULL)
		out->status = 500;
	json_decref(j);
}

/* An integer field: a JSON integer, or a string of one (some senders quote
 * ports). @return 1 found and valid, 0 absent, -1 present but not one. */
static int get_int(json_t *o, const char *key, int32_t *v)
{
	json_t *j = json_object_get(o, key);
	long long x;
	char *end;

	if (j == NULL || json_is_null(j))
		return 0;
	if (json_is_integer(j)) {
		x = json_integer_value(j);
	} else if (json_is_string(j)) {
		errno = 0;
		x = strtoll(json_string_value(j), &end, 10);
		if (errno || end == json_string_value(j) || *end)
			return -1;
	} else {
		return -1;
	}
	if (x < INT32_MIN || x > INT32_MAX)
		return -1;
	*v = (int32_t)x;
	return 1;
}

static void route_put(struct ctrl_pd_boot *b, const char *body, size_t len, struct ctrl_pd_reply *out)
{
	static const char *const required[] = { "attn_tp_size", "attn_tp_rank", "attn_dp_size", "attn_dp_rank",
						"pp_size", "pp_rank", "rank_port", "page_size" };
	struct ctrl_pd_info info = { .cp_size = 1, .dataplane_node = -1 };
	struct ctrl_pd_rank r = { .layer_start = -1, .layer_end = -1 };
	int32_t *dst[] = { &info.tp_size, &r.tp, &info.dp_size, &r.dp, &info.pp_size, &r.pp, &r.port,
			   &info.page_size };
	int32_t sys_dp_size = 1, sys_dp_rank = 0;
	json_error_t je;
	json_t *o = json_loadb(body != NULL ? body : "", len, 0, &je), *ip, *dt;
	char err[320];
	int rc;

	if (!json_is_object(o)) {
		reply_text(out, 400, "PUT /route: the body is not a JSON object (%s at byte %d)", je.text,
			   je.position);
		goto refused;
	}
	for (size_t k = 0; k < sizeof(required) / sizeof(required[0]); k++) {
		rc = get_int(o, required[k], dst[k]);
		if (rc <= 0) {
			reply_text(out, 400, "PUT /route: '%s' is %s (an integer is required)", required[k],
				   rc == 0 ? "missing" : "not an integer");
			goto refused;
		}
	}
	/* optional: context parallelism, system dp, kvferry's layout */
	if (get_int(o, "attn_cp_size", &info.cp_size) < 0 || get_int(o, "attn_cp_rank", &r.cp) < 0
	    || get_int(o, "system_dp_size", &sys_dp_size) < 0 || get_int(o, "system_dp_rank", &sys_dp_rank) < 0
	    || get_int(o, "num_layers", &info.n_layers) < 0 || get_int(o, "layer_start", &r.layer_start) < 0
	    || get_int(o, "layer_end", &r.layer_end) < 0 || get_int(o, "num_kv_heads", &info.n_kv_heads) < 0
	    || get_int(o, "head_dim", &info.head_dim) < 0) {
		reply_text(out, 400, "PUT /route: an optional field (attn_cp_*, system_dp_*, num_layers, "
			   "layer_start, layer_end, num_kv_heads, head_dim) is not an integer");
		goto refused;
	}
	if (sys_dp_size > 1) { /* SGLang: the system dp group replaces attention dp */
		info.dp_size = sys_dp_size;
		r.dp = sys_dp_rank;
	}
	ip = json_object_get(o, "rank_ip");
	if (!json_is_string(ip) || json_string_length(ip) == 0 || json_string_length(ip) >= sizeof(r.ip)) {
		reply_text(out, 400, "PUT /route: 'rank_ip' is %s (an address string of at most %zu bytes)",
			   ip == NULL ? "missing" : "not a usable address", sizeof(r.ip) - 1);
		goto refused;
	}
	snprintf(r.ip, sizeof(r.ip), "%s", json_string_value(ip));
	dt = json_object_get(o, "kv_cache_dtype");
	if (dt != NULL && !json_is_null(dt) && (!json_is_string(dt) || json_string_length(dt) >= sizeof(info.kv_dtype))) {
		reply_text(out, 400, "PUT /route: 'kv_cache_dtype' is not a short string");
		goto refused;
	}
	snprintf(info.kv_dtype, sizeof(info.kv_dtype), "%s", json_is_string(dt) ? json_string_value(dt) : "auto");
	rc = ctrl_pd_boot_register(b, &info, &r, err, sizeof(err));
	if (rc < 0) {
		reply_text(out, 400, "PUT /route: %s", err);
		goto refused;
	}
	json_decref(o);
	pthread_mutex_lock(&b->mu);
	b->st.puts++;
	pthread_mutex_unlock(&b->mu);
	reply_text(out, 200, "OK");
	return;
refused:
	json_decref(o);
	pthread_mutex_lock(&b->mu);
	b->st.puts_refused++;
	pthread_mutex_unlock(&b->mu);
}

/* A selector: 1 and *v set, 0 absent, -1 not an integer. */
static int selector(ctrl_pd_query_fn q, void *arg, const char *key, int32_t *v)
{
	const char *s = q != NULL ? q(arg, key) : NULL;
	char *end;
	long x;

	if (s == NULL || *s == '\0')
		return 0;
	errno = 0;
	x = strtol(s, &end, 10);
	if (errno || *end || x < -1 || x > INT32_MAX)
		return -1;
	*v = (int32_t)x;
	return 1;
}

static json_t *info_json(const struct ctrl_pd_info *i)
{
	/* both spellings SGLang has used, and kvferry's layout */
	json_t *j = json_pack("{si si si si si si si si si ss sb si si si}", "attn_tp_size", i->tp_size,
			      "attn_cp_size", i->cp_size, "dp_size", i->dp_size, "pp_size", i->pp_size,
			      "prefill_attn_tp_size", i->tp_size, "prefill_tp_size", i->tp_size, "prefill_dp_size",
			      i->dp_size, "prefill_pp_size", i->pp_size, "page_size", i->page_size, "kv_cache_dtype",
			      i->kv_dtype, "follow_bootstrap_room", 1, "num_layers", i->n_layers, "num_kv_heads",
			      i->n_kv_heads, "head_dim", i->head_dim);

	if (j != NULL && i->dataplane_node >= 0)
		json_object_set_new(j, "kvferry_dataplane_node", json_integer(i->dataplane_node));
	if (j != NULL && i->api_port > 0)
		json_object_set_new(j, "kvferry_api_port", json_integer(i->api_port));
	return j;
}

static void route_get(struct ctrl_pd_boot *b, ctrl_pd_query_fn q, void *arg, struct ctrl_pd_reply *out)
{
	int32_t dp = -1, cp = -1, tp = -1, pp = -1;
	const char *missing = NULL;
	int older = q != NULL && (q(arg, "engine_rank") != NULL || q(arg, "target_dp_group") != NULL);
	int r[4], bad = 0;

	if (older) {
		r[0] = selector(q, arg, "target_dp_group", &dp);
		r[1] = selector(q, arg, "engine_rank", &tp);
		r[2] = selector(q, arg, "target_pp_rank", &pp);
		missing = r[0] == 0 ? "target_dp_group" : r[1] == 0 ? "engine_rank" : NULL;
		bad = r[0] < 0 || r[1] < 0 || r[2] < 0;
		if (!missing && !bad) {
			cp = dp == -1 && tp == -1 ? -1 : 0;
			if (r[2] == 0) /* the oldest form has no pp selector */
				pp = cp;
		}
	} else {
		static const char *const keys[] = { "prefill_dp_rank", "prefill_cp_rank", "target_tp_rank",
						    "target_pp_rank" };
		int32_t *v[] = { &dp, &cp, &tp, &pp };

		for (int k = 0; k < 4; k++) {
			r[k] = selector(q, arg, keys[k], v[k]);
			if (r[k] == 0 && missing == NULL)
				missing = keys[k];
			bad |= r[k] < 0;
		}
	}
	pthread_mutex_lock(&b->mu);
	b->st.gets++;
	if (missing != NULL || bad) {
		b->st.gets_bad++;
		pthread_mutex_unlock(&b->mu);
		if (missing != NULL)
			reply_text(out, 400, "Missing inputs for bootstrap server: '%s' (GET /route?prefill_dp_rank="
				   "&prefill_cp_rank=&target_tp_rank=&target_pp_rank=, -1 for the parallel info)",
				   missing);
		else
			reply_text(out, 400, "GET /route: a selector is not an integer >= -1");
		return;
	}
	if (!ready_locked(b)) {
		int32_t n = b->n_ranks, want = b->have_info ? (int32_t)expected_of(&b->info) : 0;

		b->st.gets_not_ready++;
		pthread_mutex_unlock(&b->mu);
		reply_text(out, 503, "Prefill server not fully registered yet (%d of %d workers registered).", n,
			   want);
		return;
	}
	if (dp == -1 && cp == -1 && tp == -1 && pp == -1) {
		json_t *j = info_json(&b->info);

		pthread_mutex_unlock(&b->mu);
		reply_json(out, j);
		return;
	}
	for (int32_t k = 0; k < b->n_ranks; k++) {
		const struct ctrl_pd_rank *x = &b->ranks[k];

		if (x->dp == dp && x->cp == cp && x->tp == tp && x->pp == pp) {
			json_t *j = json_pack("{ss si si si}", "rank_ip", x->ip, "rank_port", x->port, "layer_start",
					      x->layer_start, "layer_end", x->layer_end);

			pthread_mutex_unlock(&b->mu);
			reply_json(out, j);
			return;
		}
	}
	b->st.gets_not_found++;
	pthread_mutex_unlock(&b->mu);
	reply_text(out, 404, "Bootstrap info not found for dp_rank=%d cp_rank=%d tp_rank=%d pp_rank=%d", (int)dp,
		   (int)cp, (int)tp, (int)pp);
}

int ctrl_pd_boot_handle(struct ctrl_pd_boot *b, const char *method, const char *path,
			ctrl_pd_query_fn query, void *arg, const char *body, size_t body_len,
			struct ctrl_pd_reply *out)
{
	memset(out, 0, sizeof(*out));
	if (strcmp(path, "/health") == 0) {
		if (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0)
			reply_text(out, 200, "OK");
		else
			reply_text(out, 405, "Method not allowed: /health answers GET");
		return 0;
	}
	if (strcmp(path, "/route") != 0) {
		reply_text(out, 404, "no route %s on the bootstrap server (it answers /route and /health)", path);
		return 0;
	}
	if (strcmp(method, "PUT") == 0)
		route_put(b, body, body_len, out);
	else if (strcmp(method, "GET") == 0)
		route_get(b, query, arg, out);
	else
		reply_text(out, 405, "Method not allowed: /route answers GET and PUT");
	return 0;
}
