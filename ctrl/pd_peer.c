/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The decode side's reads of a prefill node's bootstrap routes (libcurl)
 * and the page-layout contract check (ctrl_pd_boot.h).
 */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrl_pd_boot.h"

/* Answers past this are not a route's: refused. */
#define PEER_BODY_MAX 65536

struct body {
	char buf[PEER_BODY_MAX + 1];
	size_t len;
	int over;
};

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
	struct body *b = arg;
	size_t k = size * n;

	if (b->len + k > PEER_BODY_MAX) {
		b->over = 1;
		return 0; /* aborts the transfer */
	}
	memcpy(b->buf + b->len, p, k);
	b->len += k;
	b->buf[b->len] = '\0';
	return k;
}

/* GET http://ADDR/PATH. @return the HTTP status (> 0), or -EHOSTUNREACH /
 * -EPROTO / -ENOMEM with @p err filled. */
static long get(const char *addr, const char *path, double timeout_s, struct body *b, char *err, size_t errlen)
{
	char url[512];
	CURL *c;
	CURLcode rc;
	long status = 0;

	if (snprintf(url, sizeof(url), "http://%s%s", addr, path) >= (int)sizeof(url)) {
		snprintf(err, errlen, "bootstrap address '%s' is too long", addr);
		return -EPROTO;
	}
	c = curl_easy_init();
	if (c == NULL) {
		snprintf(err, errlen, "curl_easy_init failed (out of memory)");
		return -ENOMEM;
	}
	b->len = 0;
	b->over = 0;
	b->buf[0] = '\0';
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000.0));
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_PROXY, "");
	rc = curl_easy_perform(c);
	if (rc == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_cleanup(c);
	if (rc != CURLE_OK) {
		if (b->over) {
			snprintf(err, errlen, "%s answered more than %d bytes: not a bootstrap server", url, PEER_BODY_MAX);
			return -EPROTO;
		}
		snprintf(err, errlen, "%s: %s (is the prefill node up, and is this its [pd] bootstrap_port?)", url,
			 curl_easy_strerror(rc));
		return -EHOSTUNREACH;
	}
	return status;
}

static int json_i32(json_t *o, const char *key, const char *alt, int32_t *v)
{
	json_t *j = json_object_get(o, key);

	if (j == NULL && alt != NULL)
		j = json_object_get(o, alt);
	if (!json_is_integer(j))
		return -1;
	*v = (int32_t)json_integer_value(j);
	return 0;
}

int ctrl_pd_fetch_info(const char *addr, double timeout_s, struct ctrl_pd_info *out, char *err, size_t errlen)
{
	struct body *b = malloc(sizeof(*b));
	json_t *o = NULL, *dt;
	long st;
	int rc = -EPROTO;

	if (b == NULL) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	st = get(addr, "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1",
		 timeout_s, b, err, errlen);
	if (st < 0) {
		rc = (int)st;
		goto out;
	}
	if (st == 503) {
		snprintf(err, errlen, "prefill node %s: not every rank has registered yet (%.200s)", addr, b->buf);
		rc = -EAGAIN;
		goto out;
	}
	if (st != 200) {
		snprintf(err, errlen, "prefill node %s answered GET /route with %ld: %.200s", addr, st, b->buf);
		goto out;
	}
	o = json_loads(b->buf, 0, NULL);
	memset(out, 0, sizeof(*out));
	out->cp_size = 1;
	out->dataplane_node = -1;
	if (!json_is_object(o) || json_i32(o, "attn_tp_size", "prefill_attn_tp_size", &out->tp_size)
	    || json_i32(o, "dp_size", "prefill_dp_size", &out->dp_size)
	    || json_i32(o, "pp_size", "prefill_pp_size", &out->pp_size)) {
		snprintf(err, errlen, "prefill node %s: GET /route answered no parallel info: %.200s", addr, b->buf);
		goto out;
	}
	json_i32(o, "attn_cp_size", NULL, &out->cp_size);
	json_i32(o, "page_size", NULL, &out->page_size);
	json_i32(o, "num_layers", NULL, &out->n_layers);
	json_i32(o, "num_kv_heads", NULL, &out->n_kv_heads);
	json_i32(o, "head_dim", NULL, &out->head_dim);
	json_i32(o, "kvferry_dataplane_node", NULL, &out->dataplane_node);
	json_i32(o, "kvferry_api_port", NULL, &out->api_port);
	dt = json_object_get(o, "kv_cache_dtype");
	snprintf(out->kv_dtype, sizeof(out->kv_dtype), "%s", json_is_string(dt) ? json_string_value(dt) : "");
	rc = 0;
out:
	json_decref(o);
	free(b);
	return rc;
}

int ctrl_pd_fetch_rank(const char *addr, int32_t dp, int32_t cp, int32_t tp, int32_t pp, double timeout_s,
		       struct ctrl_pd_rank *out, char *err, size_t errlen)
{
	struct body *b = malloc(sizeof(*b));
	char path[160];
	json_t *o = NULL, *ip;
	long st;
	int rc = -EPROTO;

	if (b == NULL) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	snprintf(path, sizeof(path), "/route?prefill_dp_rank=%d&prefill_cp_rank=%d&target_tp_rank=%d&target_pp_rank=%d",
		 (int)dp, (int)cp, (int)tp, (int)pp);
	st = get(addr, path, timeout_s, b, err, errlen);
	if (st < 0) {
		rc = (int)st;
		goto out;
	}
	if (st == 404 || st == 503) {
		snprintf(err, errlen, "prefill node %s: %s rank dp %d cp %d tp %d pp %d (%.200s)", addr,
			 st == 404 ? "no" : "not yet every", (int)dp, (int)cp, (int)tp, (int)pp, b->buf);
		rc = st == 404 ? -ENOENT : -EAGAIN;
		goto out;
	}
	o = st == 200 ? json_loads(b->buf, 0, NULL) : NULL;
	ip = json_object_get(o, "rank_ip");
	memset(out, 0, sizeof(*out));
	if (!json_is_string(ip) || json_i32(o, "rank_port", NULL, &out->port)) {
		snprintf(err, errlen, "prefill node %s answered GET %s with %ld: %.200s", addr, path, st, b->buf);
		goto out;
	}
	snprintf(out->ip, sizeof(out->ip), "%s", json_string_value(ip));
	out->dp = dp;
	out->cp = cp;
	out->tp = tp;
	out->pp = pp;
	out->layer_start = out->layer_end = -1;
	json_i32(o, "layer_start", NULL, &out->layer_start);
	json_i32(o, "layer_end", NULL, &out->layer_end);
	rc = 0;
out:
	json_decref(o);
	free(b);
	return rc;
}

int ctrl_pd_health(const char *addr, double timeout_s, char *err, size_t errlen)
{
	struct body *b = malloc(sizeof(*b));
	long st;

	if (b == NULL) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	st = get(addr, "/health", timeout_s, b, err, errlen);
	if (st > 0 && st != 200)
		snprintf(err, errlen, "prefill node %s: GET /health answered %ld", addr, st);
	free(b);
	return st == 200 ? 0 : st < 0 ? (int)st : -EPROTO;
}

int ctrl_pd_check_contract(const struct ctrl_pd_info *remote, const struct ctrl_pd_info *local,
			   const char *addr, char *err, size_t errlen)
{
	static const struct {
		const char *name, *fix;
		size_t off;
	} f[] = {
		{ "page_size", "both nodes page the KV cache the same way (kvferry: 16 positions)",
		  offsetof(struct ctrl_pd_info, page_size) },
		{ "num_layers", "serve the same model on both nodes", offsetof(struct ctrl_pd_info, n_layers) },
		{ "num_kv_heads", "serve the same model on both nodes", offsetof(struct ctrl_pd_info, n_kv_heads) },
		{ "head_dim", "serve the same model on both nodes", offsetof(struct ctrl_pd_info, head_dim) },
	};

	for (size_t k = 0; k < sizeof(f) / sizeof(f[0]); k++) {
		int32_t r = *(const int32_t *)((const char *)remote + f[k].off);
		int32_t l = *(const int32_t *)((const char *)local + f[k].off);

		if (r != 0 && r != l) {
			snprintf(err, errlen, "%s mismatch: prefill node %s has %s=%d, this decode node has %s=%d: %s",
				 f[k].name, addr, f[k].name, (int)r, f[k].name, (int)l, f[k].fix);
			return -EINVAL;
		}
	}
	if (remote->kv_dtype[0] && strcmp(remote->kv_dtype, "auto") != 0 && strcmp(remote->kv_dtype, local->kv_dtype) != 0) {
		snprintf(err, errlen, "KV cache dtype mismatch: prefill node %s has kv_cache_dtype=%s, this decode node "
			 "has kv_cache_dtype=%s: run both with the same backend and model dtype", addr, remote->kv_dtype,
			 local->kv_dtype);
		return -EINVAL;
	}
	return 0;
}
