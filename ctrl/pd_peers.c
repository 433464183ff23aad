/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The decode side's prefill nodes: parsing [pd] prefill, the heartbeat, the
 * pick (ctrl_pd.h "prefill peers"). The table is driven by one thread.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "ctrl_pd.h"
#include "kvf_log.h"

struct peer {
	char addr[128];
	int healthy;
	int dp_gone;            /* its dataplane silent past the rooms' give-up: no new rooms */
	int32_t failures, rooms;
	double next_probe;   /* 0: at the first tick */
	char last_err[256];
};

struct ctrl_pd_peers {
	struct ctrl_pd_peers_opts o;
	struct peer peer[CTRL_PD_MAX_PEERS];
	int32_t n;
};

void ctrl_pd_peers_opts_init(struct ctrl_pd_peers_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->interval_s = 5.0;
	o->max_failures = 2;
	o->timeout_s = 5.0;
}

/* "host:port" or "[v6]:port" with a port 1..65535. @return 0 or -EINVAL. */
static int check_addr(const char *a, char *err, size_t errlen)
{
	const char *colon = strrchr(a, ':');
	char *end;
	long port;

	if (colon == NULL || colon == a || (a[0] == '[' && colon[-1] != ']')) {
		snprintf(err, errlen, "[pd] prefill entry '%s' is not host:port (write e.g. 10.0.0.2:8998, the "
			 "prefill node's bootstrap_port)", a);
		return -EINVAL;
	}
	port = strtol(colon + 1, &end, 10);
	if (*end || end == colon + 1 || port < 1 || port > 65535) {
		snprintf(err, errlen, "[pd] prefill entry '%s': the port must be 1..65535", a);
		return -EINVAL;
	}
	return 0;
}

struct ctrl_pd_peers *ctrl_pd_peers_create(const char *list, const struct ctrl_pd_peers_opts *o, char *err,
					   size_t errlen)
{
	struct ctrl_pd_peers *p;
	char *buf, *save = NULL, *tok;

	if (o == NULL || o->probe == NULL || list == NULL) {
		snprintf(err, errlen, "ctrl_pd_peers_create: a list and a health probe are required");
		errno = EINVAL;
		return NULL;
	}
	p = calloc(1, sizeof(*p));
	buf = strdup(list);
	if (p == NULL || buf == NULL) {
		snprintf(err, errlen, "out of memory");
		free(p);
		free(buf);
		errno = ENOMEM;
		return NULL;
	}
	p->o = *o;
	if (p->o.interval_s < 2.0)
		p->o.interval_s = 2.0;
	if (p->o.max_failures < 1)
		p->o.max_failures = 1;
	for (tok = strtok_r(buf, ", \t", &save); tok != NULL; tok = strtok_r(NULL, ", \t", &save)) {
		if (check_addr(tok, err, errlen))
			goto bad;
		if (strlen(tok) >= sizeof(p->peer[0].addr)) {
			snprintf(err, errlen, "[pd] prefill entry '%.40s...' is longer than %zu bytes", tok,
				 sizeof(p->peer[0].addr) - 1);
			goto bad;
		}
		for (int32_t k = 0; k < p->n; k++)
			if (strcmp(p->peer[k].addr, tok) == 0) {
				snprintf(err, errlen, "[pd] prefill lists '%s' twice", tok);
				goto bad;
			}
		if (p->n == CTRL_PD_MAX_PEERS) {
			snprintf(err, errlen, "[pd] prefill lists more than %d nodes", CTRL_PD_MAX_PEERS);
			goto bad;
		}
		snprintf(p->peer[p->n].addr, sizeof(p->peer[0].addr), "%s", tok);
		p->peer[p->n].healthy = 1;
		p->n++;
	}
	free(buf);
	return p;
bad:
	free(buf);
	free(p);
	errno = EINVAL;
	return NULL;
}

void ctrl_pd_peers_destroy(struct ctrl_pd_peers *p)
{
	free(p);
}

int32_t ctrl_pd_peers_count(const struct ctrl_pd_peers *p)
{
	return p->n;
}

const char *ctrl_pd_peer_addr(const struct ctrl_pd_peers *p, int32_t node)
{
	return node >= 0 && node < p->n ? p->peer[node].addr : NULL;
}

int ctrl_pd_peer_state(const struct ctrl_pd_peers *p, int32_t node, int *healthy, int32_t *failures,
		       int32_t *rooms)
{
	const struct peer *e;

	if (node < 0 || node >= p->n)
		return -ENOENT;
	e = &p->peer[node];
	if (healthy)
		*healthy = e->healthy;
	if (failures)
		*failures = e->failures;
	if (rooms)
		*rooms = e->rooms;
	return 0;
}

int ctrl_pd_peers_tick(struct ctrl_pd_peers *p, double now_s, struct ctrl_rooms *rooms)
{
	int lost = 0;

	for (int32_t k = 0; k < p->n; k++) {
		struct peer *e = &p->peer[k];

		if (now_s < e->next_probe)
			continue;
		e->next_probe = now_s + p->o.interval_s;
		if (p->o.probe(p->o.probe_arg, e->addr, p->o.timeout_s, e->last_err, sizeof(e->last_err)) == 0) {
			e->failures = 0;
			e->healthy = 1;
			continue;
		}
		if (++e->failures < p->o.max_failures || !e->healthy)
			continue;
		e->healthy = 0;
		lost++;
		if (rooms != NULL)
			ctrl_rooms_node_lost(rooms, (uint32_t)k);
		kvf_log(KVF_LOG_ERR, "kvferry-ctrld", "prefill node %s lost after %d missed heartbeats (%s): its "
			"unfinished rooms failed", e->addr, (int)e->failures, e->last_err);
	}
	return lost;
}

int ctrl_pd_peers_unreachable(struct ctrl_pd_peers *p, int32_t node, const char *why, struct ctrl_rooms *rooms)
{
	struct peer *e;

	if (node < 0 || node >= p->n)
		return -ENOENT;
	e = &p->peer[node];
	snprintf(e->last_err, sizeof(e->last_err), "%s", why);
	if (e->failures < p->o.max_failures)
		e->failures = p->o.max_failures;
	if (!e->healthy)
		return 0;
	e->healthy = 0;
	if (rooms != NULL)
		ctrl_rooms_node_lost(rooms, (uint32_t)node);
	kvf_log(KVF_LOG_ERR, "kvferry-ctrld", "prefill node %s lost: %s: its unfinished rooms failed; it is "
		"picked again once it answers a heartbeat", e->addr, why);
	return 1;
}

int32_t ctrl_pd_peers_pick(const struct ctrl_pd_peers *p)
{
	int32_t best = -1;

	for (int32_t k = 0; k < p->n; k++)
		if (p->peer[k].healthy && !p->peer[k].dp_gone && (best < 0 || p->peer[k].rooms < p->peer[best].rooms))
			best = k;
	return best;
}

int ctrl_pd_peers_dataplane_gone(struct ctrl_pd_peers *p, int32_t node, int gone)
{
	int was;

	if (node < 0 || node >= p->n)
		return -ENOENT;
	was = p->peer[node].dp_gone;
	p->peer[node].dp_gone = gone != 0;
	return was;
}

int ctrl_pd_peer_rooms(struct ctrl_pd_peers *p, int32_t node, int delta)
{
	if (node < 0 || node >= p->n)
		return -ENOENT;
	p->peer[node].rooms += delta;
	if (p->peer[node].rooms < 0)
		p->peer[node].rooms = 0;
	return 0;
}

/* The addresses @p host (@p len bytes, "[v6]" brackets taken off) resolves to. @return how many, up to @p max. */
static int host_addrs(const char *host, size_t len, struct sockaddr_storage *out, int max)
{
	struct addrinfo hints, *res = NULL;
	char name[128];
	int n = 0;

	if (len >= 2 && host[0] == '[' && host[len - 1] == ']') {
		host++;
		len -= 2;
	}
	if (len == 0 || len >= sizeof(name))
		return 0;
	memcpy(name, host, len);
	name[len] = 0;
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	if (getaddrinfo(name, NULL, &hints, &res) != 0)
		return 0;
	for (const struct addrinfo *a = res; a != NULL && n < max; a = a->ai_next)
		if (a->ai_addrlen <= sizeof(out[0]))
			memcpy(&out[n++], a->ai_addr, a->ai_addrlen);
	freeaddrinfo(res);
	return n;
}

static int same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return 0;
	if (a->ss_family == AF_INET)
		return !memcmp(&((const struct sockaddr_in *)a)->sin_addr, &((const struct sockaddr_in *)b)->sin_addr,
			       sizeof(struct in_addr));
	if (a->ss_family == AF_INET6)
		return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
			       sizeof(struct in6_addr));
	return 0;
}

int32_t ctrl_pd_peers_find_host(const struct ctrl_pd_peers *p, const char *host, int32_t port)
{
	struct sockaddr_storage want[8], got[8];
	int n_want = -1;

	if (p == NULL || host == NULL || host[0] == 0)
		return -1;
	for (int pass = 0; pass < 2; pass++) {
		for (int32_t i = 0; i < p->n; i++) {
			const char *a = p->peer[i].addr, *colon = strrchr(a, ':');
			size_t hl = (size_t)(colon - a);

			if (port > 0 && atoi(colon + 1) != port)
				continue;
			if (pass == 0) {
				if (strlen(host) == hl && !strncmp(a, host, hl))
					return i;
				continue;
			}
			if (n_want < 0)
				n_want = host_addrs(host, strlen(host), want, 8);
			for (int k = 0, n_got = host_addrs(a, hl, got, 8); k < n_got; k++)
				for (int j = 0; j < n_want; j++)
					if (same_addr(&got[k], &want[j]))
						return i;
		}
	}
	return -1;
}
