/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The HTTP layer's floor: the byte buffer, the clock, and the replies every
 * endpoint queues (text, JSON, OpenAI error objects). The router (http.c) and
 * the handlers (http_openai.c, http_stats.c) call down into it, and it calls
 * nothing above it, so no two files of the layer call each other.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http_int.h"

int sbuf_add(struct sbuf *b, const void *data, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		char *p;
		while (cap < b->len + n + 1)
			cap *= 2;
		p = realloc(b->p, cap);
		if (!p)
			return -ENOMEM;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, data, n);
	b->len += n;
	b->p[b->len] = 0;
	return 0;
}

void sbuf_free(struct sbuf *b)
{
	free(b->p);
	b->p = NULL;
	b->len = b->cap = 0;
}

double http_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static enum MHD_Result queue(struct ctrl_http *h, struct MHD_Connection *c, unsigned status,
			     struct MHD_Response *r)
{
	enum MHD_Result ret;

	if (!r)
		return MHD_NO;
	if (status >= 500)
		atomic_fetch_add(&h->n_5xx, 1);
	else if (status >= 400)
		atomic_fetch_add(&h->n_4xx, 1);
	ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
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

enum MHD_Result http_json(struct ctrl_http *h, struct MHD_Connection *c, unsigned status, json_t *j)
{
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	enum MHD_Result ret;

	json_decref(j);
	if (!s)
		return MHD_NO;
	ret = http_text(h, c, status, "application/json", s, strlen(s));
	free(s);
	return ret;
}

enum MHD_Result http_error(struct ctrl_http *h, struct MHD_Connection *c, unsigned status,
			   const char *type, const char *param, const char *code, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	json_t *j;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	j = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", msg, "type", type, "param",
		      param ? json_string(param) : json_null(), "code",
		      code ? json_string(code) : json_null());
	return http_json(h, c, status, j);
}
