/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the PD bootstrap routes as a router or a decode node
 * calls them (ctrl_pd_boot_handle(): PUT /route bodies, GET /route query
 * selectors, /health), one registry across a sequence of requests, so a
 * GET meets whatever earlier PUTs registered.
 *
 * Input: requests separated by a line "--". Each is "METHOD PATH\n", then
 * the query "k=v&k=v" on one line (values as they arrive, no decoding),
 * then the body (the rest).
 *
 * Beyond the sanitizers: every answer has a status among 200 400 404 405
 * 503 and a body; a 200 to GET /route is a JSON object (the parallel info,
 * or a rank's rank_ip and rank_port); a registered rank count never passes
 * the expected one; GET /route with all -1 selectors is 503 exactly while
 * not every expected rank has registered; each PUT and GET is counted once.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctrl_pd_boot.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_PARAMS 16

struct query {
	char *k[MAX_PARAMS], *v[MAX_PARAMS];
	int n;
};

static const char *lookup(void *arg, const char *key)
{
	const struct query *q = arg;

	for (int i = 0; i < q->n; i++)
		if (strcmp(q->k[i], key) == 0)
			return q->v[i];
	return NULL;
}

/* Split "k=v&k=v" in place (a key without '=' has an empty value). */
static void parse_query(char *s, struct query *q)
{
	q->n = 0;
	for (char *p = s; p != NULL && *p && q->n < MAX_PARAMS;) {
		char *amp = strchr(p, '&'), *eq;

		if (amp != NULL)
			*amp = 0;
		eq = strchr(p, '=');
		if (eq != NULL)
			*eq = 0;
		q->k[q->n] = p;
		q->v[q->n++] = eq != NULL ? eq + 1 : p + strlen(p);
		p = amp != NULL ? amp + 1 : NULL;
	}
}

/* One request, NUL-terminated in place: @return 0, or -1 when an answer breaks a rule. */
static int one(struct ctrl_pd_boot *b, char *req, size_t len)
{
	char *nl = memchr(req, '\n', len), *sp, *qline, *body, *qend;
	const char *method, *path;
	struct ctrl_pd_boot_stats before, after;
	struct ctrl_pd_reply r;
	struct query q;
	int all_minus = 0, is_get, is_put;

	if (nl == NULL)
		return 0;
	*nl = 0;
	sp = strchr(req, ' ');
	if (sp == NULL)
		return 0;
	*sp = 0;
	method = req;
	path = sp + 1;
	qline = nl + 1;
	qend = memchr(qline, '\n', len - (size_t)(qline - req));
	if (qend != NULL) {
		*qend = 0;
		body = qend + 1;
	} else {
		body = qline + strlen(qline);
	}
	parse_query(qline, &q);
	is_get = strcmp(method, "GET") == 0 && strcmp(path, "/route") == 0;
	is_put = strcmp(method, "PUT") == 0 && strcmp(path, "/route") == 0;
	if (is_get) {
		static const char *const sel[] = { "prefill_dp_rank", "prefill_cp_rank", "target_tp_rank",
						   "target_pp_rank" };

		all_minus = lookup(&q, "engine_rank") == NULL && lookup(&q, "target_dp_group") == NULL;
		for (int k = 0; k < 4 && all_minus; k++)
			all_minus = lookup(&q, sel[k]) != NULL && strcmp(lookup(&q, sel[k]), "-1") == 0;
	}
	ctrl_pd_boot_stats(b, &before);
	if (ctrl_pd_boot_handle(b, method, path, lookup, &q, body, strlen(body), &r) != 0)
		return -1;
	ctrl_pd_boot_stats(b, &after);
	if (r.body == NULL)
		return -1;
	if (r.status != 200 && r.status != 400 && r.status != 404 && r.status != 405 && r.status != 503)
		goto bad;
	if (after.expected > 0 && after.registered > after.expected)
		goto bad;
	if (is_put && after.puts + after.puts_refused != before.puts + before.puts_refused + 1)
		goto bad;
	if (is_get && after.gets != before.gets + 1)
		goto bad;
	if (is_get && r.status == 200) {
		json_t *j = json_loads(r.body, 0, NULL);
		int ok = json_is_object(j);

		json_decref(j);
		if (!ok)
			goto bad;
	}
	if (all_minus && (r.status == 503) != !(after.expected > 0 && after.registered == after.expected))
		goto bad;
	free(r.body);
	return 0;
bad:
	free(r.body);
	return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ctrl_pd_boot *b = ctrl_pd_boot_create();
	char *buf = malloc(size + 1), *p, *end;

	if (b == NULL || buf == NULL) {
		free(buf);
		ctrl_pd_boot_destroy(b);
		return 0;
	}
	memcpy(buf, data, size);
	buf[size] = 0;
	end = buf + strlen(buf); /* a NUL ends the input: the server sees C strings */
	for (p = buf; p < end;) {
		char *sep = strstr(p, "\n--\n");
		size_t n = sep != NULL ? (size_t)(sep - p) : (size_t)(end - p);

		p[n] = 0;
		if (one(b, p, n) < 0)
			abort();
		p += n + (sep != NULL ? 4 : 0);
	}
	free(buf);
	ctrl_pd_boot_destroy(b);
	return 0;
}
