/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The dataplane's options: defaults, and the parsers for a peer
 * ("ID=IP[,MAC]") and for the test-only impairment spec. Pure: no DPDK, no
 * shared memory.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp.h"

int dp_memif_zc(const char *spec)
{
	return spec != NULL && strncmp(spec, "net_memif", 9) == 0 && strstr(spec, "zero-copy=yes") != NULL
	       && strstr(spec, "role=server") == NULL;
}

const char *dp_port_spec(const char *spec, char *buf, size_t len)
{
	int client = spec != NULL && strncmp(spec, "net_memif", 9) == 0 && strstr(spec, "role=server") == NULL;

	if (!client || strstr(spec, "zero-copy=") != NULL
	    || snprintf(buf, len, "%s,zero-copy=yes", spec) >= (int)len)
		return spec;
	return buf;
}

void dp_opts_init(struct dp_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->frame_size = 9000;
	o->self.port = DP_WIRE_UDP_PORT;
	o->idle = DP_IDLE_POLL;
	o->rx_small_n = 256;
	o->rx_small_size = 64 * 1024;
	o->rx_large_n = 32;
	o->rx_large_size = 4 * 1024 * 1024;
	o->n_mbufs = 8191;
	dp_rel_opts_init(&o->rel);
}

static int parse_mac(const char *s, uint8_t mac[6])
{
	unsigned v[6];
	if (sscanf(s, "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6)
		return -EINVAL;
	for (int i = 0; i < 6; i++)
		mac[i] = (uint8_t)v[i];
	return 0;
}

static int parse_ip(const char *s, uint32_t *ip)
{
	unsigned a, b, c, e;
	if (sscanf(s, "%u.%u.%u.%u", &a, &b, &c, &e) != 4 || a > 255 || b > 255 || c > 255 || e > 255)
		return -EINVAL;
	*ip = (a << 24) | (b << 16) | (c << 8) | e;
	return 0;
}

int dp_peer_parse(const char *s, struct dp_peer_cfg *p)
{
	char buf[128];
	unsigned id;
	if (strlen(s) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, s);
	char *eq = strchr(buf, '=');
	if (!eq || sscanf(buf, "%u", &id) != 1 || id >= DP_MAX_PEERS)
		return -EINVAL;
	memset(p, 0, sizeof(*p));
	p->node = (uint16_t)id;
	memset(p->addr.mac, 0xff, 6);
	p->addr.port = DP_WIRE_UDP_PORT;
	char *save = NULL;
	int field = 0;
	for (char *t = strtok_r(eq + 1, ",", &save); t; t = strtok_r(NULL, ",", &save), field++) {
		if (strchr(t, ':')) {
			if (parse_mac(t, p->addr.mac))
				return -EINVAL;
		} else if (strchr(t, '.')) {
			if (parse_ip(t, &p->addr.ip))
				return -EINVAL;
		} else {
			unsigned port;
			if (sscanf(t, "%u", &port) != 1 || port == 0 || port > 65535)
				return -EINVAL;
			p->addr.port = (uint16_t)port;
		}
	}
	return p->addr.ip ? 0 : -EINVAL;
}

int dp_impair_parse(const char *s, struct dp_impair *imp)
{
	char buf[256];
	if (strlen(s) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, s);
	memset(imp, 0, sizeof(*imp));
	imp->seed = 1;
	char *save = NULL;
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		double v;
		char key[32];
		/* !(v >= 0): a NaN ("loss=nan") is no probability either */
		if (sscanf(t, "%31[a-z]=%lf", key, &v) != 2 || !(v >= 0))
			return -EINVAL;
		if (!strcmp(key, "loss"))
			imp->loss = v;
		else if (!strcmp(key, "dup"))
			imp->dup = v;
		else if (!strcmp(key, "reorder"))
			imp->reorder = v;
		else if (!strcmp(key, "corrupt"))
			imp->corrupt = v;
		else if (!strcmp(key, "seed") && v < 0x1p64) /* past 2^64 the conversion is undefined */
			imp->seed = (uint64_t)v;
		else if (!strcmp(key, "outage") && v <= 3600)
			imp->outage_s = v;
		else
			return -EINVAL;
		if (strcmp(key, "seed") && strcmp(key, "outage") && v > 1)
			return -EINVAL;
	}
	return 0;
}
