/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The bootstrap routes on their own port (ctrl_pd_boot.h), libmicrohttpd
 * with one internal thread: the routes are small and rare (a decode node
 * reads each prefill address once, then its /health every few seconds).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ctrl_admin.h"
#include "ctrl_pd_boot.h"
#include "kvf_buf.h"

/* A PUT body past this is refused: a rank's registration is a few hundred bytes. */
#define BOOT_BODY_MAX 65536

struct ctrl_pd_boot_server {
	struct ctrl_pd_boot *b;
	struct MHD_Daemon *d;
	int port;
	char address[64];
};

struct boot_conn {
	struct kvf_buf body;
	int too_big;
};

static const char *query_get(void *arg, const char *key)
{
	return MHD_lookup_connection_value((struct MHD_Connection *)arg, MHD_GET_ARGUMENT_KIND, key);
}

static enum MHD_Result send_reply(struct MHD_Connection *c, int status, const char *type, const char *text)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
	enum MHD_Result ok;

	if (r == NULL)
		return MHD_NO;
	MHD_add_response_header(r, "Content-Type", type);
	ok = MHD_queue_response(c, (unsigned)status, r);
	MHD_destroy_response(r);
	return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
				  const char *version, const char *upload, size_t *upload_size, void **ctx)
{
	struct ctrl_pd_boot_server *s = cls;
	struct boot_conn *bc = *ctx;
	struct ctrl_pd_reply rep;
	enum MHD_Result ok;

	(void)version;
	if (bc == NULL) {
		bc = calloc(1, sizeof(*bc));
		if (bc == NULL)
			return MHD_NO;
		*ctx = bc;
		return MHD_YES;
	}
	if (*upload_size > 0) {
		if (bc->too_big || bc->body.len + *upload_size > BOOT_BODY_MAX
		    || kvf_buf_add(&bc->body, upload, *upload_size) < 0)
			bc->too_big = 1;
		*upload_size = 0;
		return MHD_YES;
	}
	if (bc->too_big)
		return send_reply(c, 413, "text/plain", "request body over 64 KiB: a rank registration is a small JSON object");
	ctrl_pd_boot_handle(s->b, method, url, query_get, c, bc->body.p, bc->body.len, &rep);
	ok = send_reply(c, rep.status, rep.content_type != NULL ? rep.content_type : "text/plain",
			rep.body != NULL ? rep.body : "out of memory");
	free(rep.body);
	return ok;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **ctx, enum MHD_RequestTerminationCode toe)
{
	struct boot_conn *bc = *ctx;

	(void)cls;
	(void)c;
	(void)toe;
	if (bc != NULL) {
		kvf_buf_free(&bc->body);
		free(bc);
		*ctx = NULL;
	}
}

struct ctrl_pd_boot_server *ctrl_pd_boot_serve(struct ctrl_pd_boot *b, const char *address, int port,
					       char *err, size_t errlen)
{
	struct ctrl_pd_boot_server *s;
	struct sockaddr_storage ss;
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
	const union MHD_DaemonInfo *di;

	memset(&ss, 0, sizeof(ss));
	if (port < 0 || port > 65535) {
		snprintf(err, errlen, "bootstrap_port %d is outside 0..65535", port);
		return NULL;
	}
	if (inet_pton(AF_INET, address, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
		((struct sockaddr_in *)&ss)->sin_family = AF_INET;
		((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port);
	} else if (inet_pton(AF_INET6, address, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1) {
		((struct sockaddr_in6 *)&ss)->sin6_family = AF_INET6;
		((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)port);
		flags |= MHD_USE_IPv6;
	} else {
		snprintf(err, errlen, "bootstrap address '%s' is not an IPv4 or IPv6 address (set listen_address)",
			 address);
		return NULL;
	}
	s = calloc(1, sizeof(*s));
	if (s == NULL) {
		snprintf(err, errlen, "out of memory starting the bootstrap server");
		return NULL;
	}
	s->b = b;
	snprintf(s->address, sizeof(s->address), "%s", address);
	s->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
				(struct sockaddr *)&ss, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
				MHD_OPTION_CONNECTION_TIMEOUT, 30u, MHD_OPTION_END);
	if (s->d == NULL) {
		snprintf(err, errlen, "the bootstrap server could not listen on %s port %d: %s (another server on "
			 "that port? set [pd] bootstrap_port)", address, port, strerror(errno ? errno : EADDRINUSE));
		free(s);
		return NULL;
	}
	di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
	s->port = di != NULL ? di->port : port;
	return s;
}

int ctrl_pd_boot_server_port(const struct ctrl_pd_boot_server *s)
{
	return s->port;
}

void ctrl_pd_boot_server_stop(struct ctrl_pd_boot_server *s)
{
	if (s == NULL)
		return;
	MHD_stop_daemon(s->d);
	free(s);
}

/* `ctrlctl bootstrap`: the role; on a prefill node the routes' port, ranks and counters. */
static const char *const roles[] = { "both", "prefill", "decode" };

struct boot_view {
	const struct ctrl_pd_boot_server *s;
	int role;
};

static int cmd_bootstrap(void *arg, const char *cmd, json_t *params, json_t **data, char *err, size_t errlen)
{
	const struct boot_view *v = arg;
	struct ctrl_pd_boot_stats st;

	(void)cmd;
	(void)params;
	(void)err;
	(void)errlen;
	if (v->s == NULL) {
		*data = json_pack("{s:s, s:s}", "role", roles[v->role], "bootstrap",
				  "not served: [pd] role = prefill serves it");
		return *data ? 0 : -ENOMEM;
	}
	ctrl_pd_boot_stats(v->s->b, &st);
	*data = json_pack("{s:s, s:s, s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:I}", "role", roles[v->role],
			  "address", v->s->address, "port", v->s->port, "ranks_registered", st.registered,
			  "ranks_expected", st.expected, "puts", (json_int_t)st.puts, "puts_refused",
			  (json_int_t)st.puts_refused, "gets", (json_int_t)st.gets, "gets_not_ready",
			  (json_int_t)st.gets_not_ready, "gets_not_found", (json_int_t)st.gets_not_found, "gets_bad",
			  (json_int_t)st.gets_bad);
	return *data ? 0 : -ENOMEM;
}

int ctrl_pd_boot_admin_register(struct ctrl_admin *a, const struct ctrl_pd_boot_server *s, int role)
{
	static struct boot_view views[3][2]; /* (role, served): one daemon a process */
	struct boot_view *v = &views[role >= 0 && role < 3 ? role : 0][s != NULL];

	v->s = s;
	v->role = role >= 0 && role < 3 ? role : 0;
	return ctrl_admin_register(a, "/pd/bootstrap",
				   "PD role; with role = prefill the bootstrap routes' port, ranks and counters",
				   cmd_bootstrap, v);
}
