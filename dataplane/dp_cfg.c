/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-dataplane's configuration table ([dp] in kvferry.conf,
 * KVFERRY_DP_* variables, flags) over the floor's engine, and its reading
 * into struct dp_opts (dp.h). The values that need more than a type and a
 * range (peers, the impairment, pools, the address) go through the parsers
 * of dp_opts.c, and a bad one names its key and where it came from.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp.h"
#include "kvf_cfg.h"

struct dp_settings {
	int64_t node_id;
	char port[CFG_STRLEN], peers[CFG_STRLEN], ip[CFG_STRLEN], region[CFG_STRLEN];
	int64_t udp_port, region_size_mib, frame_size, idle_mode;
	char impair[CFG_STRLEN], rx_small[CFG_STRLEN], rx_large[CFG_STRLEN];
	int64_t max_msgs, window, mbufs;
	int tx_copy;
	int64_t rx_in_place;
	int64_t payload_crc;
	char eal[CFG_STRLEN];
};

#define OFF(f) offsetof(struct dp_settings, f)

static const char *const idle_names[] = { "poll", "sleep", NULL };
static const char *const pcrc_names[] = { "auto", "yes", "no", NULL };
static const char *const rxip_names[] = { "auto", "yes", "no", NULL }; /* DP_RXIP_* */

static const struct cfg_key keys[] = {
	{ "node_id", "dp", CFG_INT, OFF(node_id), "0", 0, DP_MAX_PEERS - 1, "KVFERRY_DP_NODE_ID", "--node-id",
	  NULL, NULL, "this node's id on the wire" },
	{ "port", "dp", CFG_STRING, OFF(port), "", 0, 0, "KVFERRY_DP_PORT", "--port", NULL, NULL,
	  "the NIC: a vdev (net_memif0,role=server,socket=/run/kvferry/x.sock: a file socket, "
	  "socket-abstract=no unless given; a net_memif client is a zero-copy one unless it says "
	  "zero-copy=no: the server's driver writes into its mbufs, one copy a byte end to end; "
	  "net_af_packet0,iface=veth0) or a PCI address bound to vfio-pci; required" },
	{ "peers", "dp", CFG_STRING, OFF(peers), "", 0, 0, "KVFERRY_DP_PEERS", "--peers", NULL, NULL,
	  "the other nodes, space-separated ID=[MAC,]IP[,PORT] (--peer adds one at a time); a MAC is "
	  "learned from hellos if omitted" },
	{ "ip", "dp", CFG_STRING, OFF(ip), "", 0, 0, "KVFERRY_DP_IP", "--ip", NULL, NULL,
	  "our IPv4 address (source of our frames)" },
	{ "udp_port", "dp", CFG_INT, OFF(udp_port), "47474", 1, 65535, "KVFERRY_DP_UDP_PORT", "--udp-port", NULL,
	  NULL, "our UDP port" },
	{ "region", "dp", CFG_STRING, OFF(region), "", 0, 0, "KVFERRY_DP_REGION", "--region", NULL, NULL,
	  "the node's shm region; required" },
	{ "region_size", "dp", CFG_INT, OFF(region_size_mib), "0", 0, 1 << 20, "KVFERRY_DP_REGION_SIZE",
	  "--region-size", NULL, NULL, "MiB: create the region (replacing a stale one) with this size; 0: "
	  "attach to an existing one" },
	{ "frame_size", "dp", CFG_INT, OFF(frame_size), "9000", 256, DP_FRAME_MAX, "KVFERRY_DP_FRAME_SIZE",
	  "--frame-size", NULL, NULL, "largest frame on the wire, bytes: at most a NIC's MTU + 14 (9000 for jumbo "
	  "frames); a net_memif link is shared memory with no MTU: up to 65535, with the port's bsize as large "
	  "(61440 moves 2 MiB KV pages 1.4x as fast as 9000 on 2 vCPUs, dataplane/BENCH.md)" },
	{ "idle_mode", "dp", CFG_ENUM, OFF(idle_mode), "poll", 0, 1, "KVFERRY_DP_IDLE_MODE", "--idle-mode",
	  idle_names, NULL, "busy-poll, or an adaptive back-off sleep when idle" },
	{ "impair", "dp", CFG_STRING, OFF(impair), "", 0, 0, "KVFERRY_DP_IMPAIR", "--impair", NULL, NULL,
	  "test-only receive impairment loss=P,dup=P,reorder=P,corrupt=P[,seed=N][,outage=S]; with it, "
	  "SIGUSR1 drops every received frame until SIGUSR2, or for S seconds" },
	{ "rx_small", "dp", CFG_STRING, OFF(rx_small), "256:65536", 0, 0, "KVFERRY_DP_RX_SMALL", "--rx-small",
	  NULL, NULL, "reassembly pool for small messages, N:BYTES" },
	{ "rx_large", "dp", CFG_STRING, OFF(rx_large), "32:4194304", 0, 0, "KVFERRY_DP_RX_LARGE", "--rx-large",
	  NULL, NULL, "reassembly pool for large messages, N:BYTES (the largest message)" },
	{ "max_msgs", "dp", CFG_INT, OFF(max_msgs), "64", 1, 65536, "KVFERRY_DP_MAX_MSGS", "--max-msgs", NULL,
	  NULL, "messages in flight per stream (a power of two)" },
	{ "window", "dp", CFG_INT, OFF(window), "4096", 512, 65536, "KVFERRY_DP_WINDOW", "--window", NULL, NULL,
	  "frames in flight per stream (a power of two)" },
	{ "mbufs", "dp", CFG_INT, OFF(mbufs), "8191", 511, 1 << 22, "KVFERRY_DP_MBUFS", "--mbufs", NULL, NULL,
	  "mbufs per pool" },
	{ "tx_copy", "dp", CFG_BOOL, OFF(tx_copy), "no", 0, 1, "KVFERRY_DP_TX_COPY", "--tx-copy", NULL, NULL,
	  "copy payload into mbufs instead of attaching region memory" },
	{ "rx_in_place", "dp", CFG_ENUM, OFF(rx_in_place), "auto", 0, 2, "KVFERRY_DP_RX_IN_PLACE", "--rx-in-place",
	  rxip_names, NULL, "receive into mbufs in the region (mbufs x ~10 KiB of it at 9000 B frames, hugepages) and "
	  "hand a message to a ring whose consumer declared it reads segment lists as the list of its frames, with no "
	  "reassembly copy; other rings get whole messages as before. auto: in place where the region is on "
	  "hugepages and those buffers take at most a quarter of it, else reassembled (the start log says why); yes: "
	  "in place or refuse to start" },
	{ "payload_crc", "dp", CFG_ENUM, OFF(payload_crc), "auto", 0, 2, "KVFERRY_DP_PAYLOAD_CRC", "--payload-crc",
	  pcrc_names, NULL, "CRC32C over each data frame's payload, sent and checked (the header's is always on); "
	  "auto: yes, except over net_memif (shared memory in one host, where nothing can damage a frame: one read "
	  "of every byte less at each end) unless --impair corrupts frames; both ends of a link must agree" },
	{ "eal", "dp", CFG_STRING, OFF(eal), "", 0, 0, "KVFERRY_DP_EAL", "--eal", NULL, NULL,
	  "extra EAL arguments, space-separated (empty: -l 0). Over net_memif (and net_af_packet with qpairs=N) each "
	  "lcore of -l gets a queue pair: the main lcore runs the loop and queue 0, each other one sends the frames "
	  "of its share of the streams on its own queue, so the driver's copy of different streams runs on different "
	  "cores (-l 0,2,3: two), and computes their payload CRCs when payload_crc is on. Both ends of a memif link need the same count (a server uses the pairs both have; "
	  "a client with more is refused by its server), and each pair's ring holds 1024 mbufs: raise mbufs with them" },
};

static const char *const sections[] = { "dp", NULL };
/* ctrld's and the worker's sections of the same file ([worker.K]: kvferry-worker@K's own) */
static const char *const foreign[] = { "http", "model", "engine", "sched", "ctrl", "pd", "worker",
				       "worker.", NULL };

static const struct cfg_table table = {
	.program = "kvferry-dataplane",
	.keys = keys,
	.n_keys = sizeof(keys) / sizeof(keys[0]),
	.sections = sections,
	.foreign_sections = foreign,
	.env_prefix = "KVFERRY_DP_",
	.env_skip = NULL,
	.settings_size = sizeof(struct dp_settings),
};

static int parse_pool(const char *s, uint32_t *n, uint32_t *size)
{
	unsigned a, b;
	char tail;

	if (sscanf(s, "%u:%u%c", &a, &b, &tail) != 2 || a == 0 || b == 0)
		return -EINVAL;
	*n = a;
	*size = b;
	return 0;
}

static int pow2(int64_t v)
{
	return v > 0 && (v & (v - 1)) == 0;
}

/* @p key's integer value is not a power of two: say so and from where. */
static int refuse_pow2(const struct cfg *c, const char *key, int64_t v, char *err, size_t errlen)
{
	const char *origin = "?";

	cfg_source(c, key, &origin);
	snprintf(err, errlen, "%s: value '%lld' for '%s' is not a power of two", origin, (long long)v, key);
	return -EINVAL;
}

/* @p key's value was refused by a parser: say which and from where. */
static int refuse(const struct cfg *c, const char *key, const char *value, const char *want, char *err,
		  size_t errlen)
{
	const char *origin = "?";

	cfg_source(c, key, &origin);
	snprintf(err, errlen, "%s: invalid value '%s' for '%s': expected %s", origin, value, key, want);
	return -EINVAL;
}

/*
 * Fill @p o from the file (--config PATH, else KVFERRY_CONFIG, else
 * /etc/kvferry/kvferry.conf when it exists), KVFERRY_DP_* and flags
 * (--peer may repeat: each adds to peers). @p o's strings point into
 * @p *cfgp (cfg_free() it after the last use).
 * @return 0; 1 after --help / --print-config / --check; < 0 with @p err.
 */
int dp_cfg_load(int argc, char **argv, struct dp_opts *o, struct cfg **cfgp, int *impair_given, char *err,
		size_t errlen)
{
	static const char *const skip[] = { "--peer", NULL };
	const struct dp_settings *s;
	char peers[CFG_STRLEN] = "", *save = NULL, *tok, buf[CFG_STRLEN];
	size_t pl = 0;
	struct cfg *c;
	int check, rc;

	*cfgp = NULL;
	*impair_given = 0;
	/* --peer repeats: each one adds to the peers key */
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--peer") || !strncmp(argv[i], "--peer=", 7)) {
			const char *v = argv[i][6] == '=' ? argv[i] + 7 : i + 1 < argc ? argv[++i] : NULL;
			int n = v != NULL ? snprintf(peers + pl, sizeof(peers) - pl, "%s%s", pl ? " " : "", v) : -1;

			if (n < 0 || (size_t)n >= sizeof(peers) - pl) {
				snprintf(err, errlen, v == NULL ? "option --peer needs ID=[MAC,]IP[,PORT]"
								: "--peer: the peer list is longer than %zu bytes",
					 sizeof(peers) - 1);
				return -EINVAL;
			}
			pl += (size_t)n;
		}
	}
	check = cfg_load_daemon(&table, "usage: kvferry-dataplane --node-id N --port SPEC --region NAME [options]\n"
				"  --peer ID=[MAC,]IP[,PORT] one peer (repeat; adds to peers)", argc, argv, skip, &c, err,
				errlen);
	if (check < 0 || c == NULL)
		return check;
	rc = pl ? cfg_set(c, "peers", peers, CFG_SRC_FLAG, "--peer", err, errlen) : 0;
	if (rc)
		goto fail;
	s = cfg_settings(c);
	rc = -EINVAL;
	if (!s->port[0] || !s->region[0]) {
		const char *k = s->port[0] ? "region" : "port";

		snprintf(err, errlen, "%s is not set: give --%s, KVFERRY_DP_%s or [dp] %s", k, k,
			 s->port[0] ? "REGION" : "PORT", k);
		goto fail;
	}
	dp_opts_init(o);
	o->node = (uint16_t)s->node_id;
	o->port = s->port;
	o->region = s->region;
	o->region_size = (size_t)s->region_size_mib << 20;
	o->self.port = (uint16_t)s->udp_port;
	o->frame_size = (uint32_t)s->frame_size;
	o->idle = s->idle_mode ? DP_IDLE_SLEEP : DP_IDLE_POLL;
	o->rel.max_msgs = (uint32_t)s->max_msgs;
	o->rel.window = (uint32_t)s->window;
	o->n_mbufs = (uint32_t)s->mbufs;
	o->tx_copy = s->tx_copy;
	o->rx_in_place = (int)s->rx_in_place;
	o->payload_crc = (int)s->payload_crc;
	o->eal_args = s->eal[0] ? s->eal : NULL;
	if (!pow2(s->max_msgs) || !pow2(s->window)) {
		rc = pow2(s->max_msgs) ? refuse_pow2(c, "window", s->window, err, errlen)
				       : refuse_pow2(c, "max_msgs", s->max_msgs, err, errlen);
		goto fail;
	}
	if (s->ip[0]) {
		unsigned a, b, cc, d;
		char tail;

		if (sscanf(s->ip, "%u.%u.%u.%u%c", &a, &b, &cc, &d, &tail) != 4 || a > 255 || b > 255 || cc > 255
		    || d > 255) {
			rc = refuse(c, "ip", s->ip, "an IPv4 address A.B.C.D", err, errlen);
			goto fail;
		}
		o->self.ip = (a << 24) | (b << 16) | (cc << 8) | d;
	}
	if (parse_pool(s->rx_small, &o->rx_small_n, &o->rx_small_size)) {
		rc = refuse(c, "rx_small", s->rx_small, "N:BYTES with both above 0", err, errlen);
		goto fail;
	}
	if (parse_pool(s->rx_large, &o->rx_large_n, &o->rx_large_size)) {
		rc = refuse(c, "rx_large", s->rx_large, "N:BYTES with both above 0", err, errlen);
		goto fail;
	}
	if (s->impair[0]) {
		if (dp_impair_parse(s->impair, &o->impair)) {
			rc = refuse(c, "impair", s->impair, "loss=P,dup=P,reorder=P,corrupt=P[,seed=N][,outage=S]", err, errlen);
			goto fail;
		}
		*impair_given = 1;
	}
	snprintf(buf, sizeof(buf), "%s", s->peers);
	for (tok = strtok_r(buf, " \t", &save); tok != NULL; tok = strtok_r(NULL, " \t", &save)) {
		if (o->n_peers >= sizeof(o->peers) / sizeof(o->peers[0])
		    || dp_peer_parse(tok, &o->peers[o->n_peers])) {
			rc = refuse(c, "peers", tok, o->n_peers >= 64 ? "at most 64 peers" : "ID=[MAC,]IP[,PORT] with ID < 64",
				    err, errlen);
			goto fail;
		}
		o->n_peers++;
	}
	*cfgp = c;
	if (check) {
		printf("configuration OK\n");
		return 1;
	}
	return 0;
fail:
	cfg_free(c);
	return rc;
}
