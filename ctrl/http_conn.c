/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Connections: how many are open, how long one may take to deliver its
 * request, and what a connection beyond the limit is answered.
 *
 * libmicrohttpd 0.9.75 closes a connection that sent and received nothing
 * for MHD_OPTION_CONNECTION_TIMEOUT (connection_timeout: an idle keep-alive
 * connection, a Content-Length larger than the body), but a client that
 * trickles a byte every few seconds is never idle, and it has no deadline
 * for a whole request. Each connection therefore has a record (its MHD
 * socket context, from MHD_CONNECTION_NOTIFY_STARTED to _CLOSED): when its
 * current request began to arrive (the connection opened, or its previous
 * answer ended) and whether the request is still arriving. The ticker
 * (http.c, every 250 ms) shuts down the socket of one still arriving after
 * request_timeout; MHD reads the end of the stream at its next poll and
 * closes the connection (there is no way to queue an answer from outside
 * the connection's thread).
 *
 * Invariant: shutdown() is only called on the fd of a record still in the
 * list, under conn_mu; MHD makes the CLOSED notification, which unlinks the
 * record under conn_mu, before it closes the fd. So the fd shut down is
 * always the connection's, never a number the kernel has since handed to
 * another socket. Break that order and a slow client's deadline could cut
 * an unrelated connection.
 *
 * The limit: at its own connection limit MHD stops accepting (the next
 * connections wait unanswered in the listen backlog), so MHD is given
 * max_connections + HTTP_CONN_SPARE, and a request that arrives while more
 * than max_connections are open is answered 503 too_many_connections and its
 * connection closed: a clean refusal a client or balancer can act on, which
 * sheds connections back to the limit.
 */
#include <stdlib.h>
#include <sys/socket.h>

#include "http_int.h"

struct http_conn {
	struct http_conn *next, *prev;
	int fd;
	int arriving;                /* its current request has not fully arrived */
	int shut;                    /* the deadline shut it down */
	double t_begin;              /* http_now() when that request began to arrive */
};

static struct http_conn *conn_of(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci != NULL ? ci->socket_context : NULL;
}

void http_conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
		      enum MHD_ConnectionNotificationCode code)
{
	struct ctrl_http *h = cls;
	struct http_conn *k = *socket_context;

	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);

		atomic_fetch_add(&h->n_conns, 1);
		k = calloc(1, sizeof(*k));
		if (k == NULL || ci == NULL) {
			free(k); /* out of memory: the connection goes without a deadline */
			*socket_context = NULL;
			return;
		}
		k->fd = ci->connect_fd;
		k->arriving = 1;
		k->t_begin = http_now();
		pthread_mutex_lock(&h->conn_mu);
		k->next = h->conns;
		if (h->conns != NULL)
			h->conns->prev = k;
		h->conns = k;
		pthread_mutex_unlock(&h->conn_mu);
		*socket_context = k;
		return;
	}
	atomic_fetch_sub(&h->n_conns, 1);
	if (k == NULL)
		return;
	pthread_mutex_lock(&h->conn_mu);
	if (k->prev != NULL)
		k->prev->next = k->next;
	else
		h->conns = k->next;
	if (k->next != NULL)
		k->next->prev = k->prev;
	pthread_mutex_unlock(&h->conn_mu);
	free(k);
	*socket_context = NULL;
}

void http_conn_arrived(struct ctrl_http *h, struct MHD_Connection *c)
{
	struct http_conn *k = conn_of(c);

	if (k == NULL)
		return;
	pthread_mutex_lock(&h->conn_mu);
	k->arriving = 0;
	pthread_mutex_unlock(&h->conn_mu);
}

void http_conn_answered(struct ctrl_http *h, struct MHD_Connection *c)
{
	struct http_conn *k = conn_of(c);

	if (k == NULL)
		return;
	pthread_mutex_lock(&h->conn_mu);
	k->arriving = 1;
	k->t_begin = http_now();
	pthread_mutex_unlock(&h->conn_mu);
}

int http_conn_over_limit(struct ctrl_http *h)
{
	return h->max_connections > 0 && atomic_load(&h->n_conns) > h->max_connections;
}

void http_conn_sweep(struct ctrl_http *h)
{
	double now = http_now();

	if (h->request_timeout_s <= 0)
		return;
	pthread_mutex_lock(&h->conn_mu);
	for (struct http_conn *k = h->conns; k != NULL; k = k->next) {
		if (!k->arriving || k->shut || now - k->t_begin <= h->request_timeout_s)
			continue;
		k->shut = 1;
		shutdown(k->fd, SHUT_RDWR);
		atomic_fetch_add(&h->n_slow_closed, 1);
	}
	pthread_mutex_unlock(&h->conn_mu);
}
