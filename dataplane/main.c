/* SPDX-License-Identifier: Apache-2.0 */
/* kvferry-dataplane: flags → dp_opts, signals → stop flag, dp_run(). */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp.h"

static volatile sig_atomic_t g_stop, g_outage;

static void on_signal(int sig)
{
	(void)sig;
	g_stop = 1;
}

/* Test-only (with --impair): SIGUSR1 starts an outage, SIGUSR2 ends it. */
static void on_outage(int sig)
{
	g_outage = sig == SIGUSR1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvferry-dataplane --node-id N --port SPEC --region NAME [options]\n"
		"  --node-id N            this node's id (0..63)\n"
		"  --port SPEC            a vdev (net_memif0,role=server,socket=/run/x.sock;\n"
		"                         net_af_packet0,iface=veth0) or a PCI address bound to vfio-pci\n"
		"  --peer ID=[MAC,]IP[,PORT]  a peer (repeat); MAC is learned from hellos if omitted\n"
		"  --ip A.B.C.D           our IPv4 address (source of our frames)\n"
		"  --udp-port P           our UDP port (default 47474)\n"
		"  --region NAME          the node's shm region\n"
		"  --region-size MIB      create the region (replacing a stale one) with this size\n"
		"  --frame-size B         largest frame (default 9000; <= 65535)\n"
		"  --idle-mode poll|sleep busy-poll (default) or adaptive back-off sleep\n"
		"  --impair loss=P,dup=P,reorder=P,corrupt=P[,seed=N]   test-only receive impairment;\n"
		"                         with it, SIGUSR1 drops every received frame until SIGUSR2\n"
		"  --rx-small N:BYTES     reassembly pool for small messages (default 256:65536)\n"
		"  --rx-large N:BYTES     reassembly pool for large messages (default 32:4194304)\n"
		"  --max-msgs N           messages in flight per stream (power of two, default 64)\n"
		"  --window N             frames in flight per stream (power of two, default 4096)\n"
		"  --mbufs N              mbufs per pool (default 8191)\n"
		"  --tx-copy              copy payload into mbufs instead of attaching region memory\n"
		"  --eal 'ARGS'           extra EAL arguments (default '-l 0')\n");
}

static int parse_pool(const char *s, uint32_t *n, uint32_t *size)
{
	unsigned a, b;
	if (sscanf(s, "%u:%u", &a, &b) != 2 || a == 0 || b == 0)
		return -EINVAL;
	*n = a;
	*size = b;
	return 0;
}

int main(int argc, char **argv)
{
	struct dp_opts o;
	/* Logs go to files under the serving scripts: line-buffer them so
	 * "peer up" shows when it happens, not at exit. DPDK logs to stdout. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	setvbuf(stderr, NULL, _IOLBF, 0);
	dp_opts_init(&o);
	int impair_given = 0;
	static const struct option lo[] = {
		{"node-id", required_argument, 0, 'n'}, {"port", required_argument, 0, 'p'},
		{"peer", required_argument, 0, 'P'},    {"ip", required_argument, 0, 'i'},
		{"udp-port", required_argument, 0, 'u'}, {"region", required_argument, 0, 'r'},
		{"region-size", required_argument, 0, 'R'}, {"frame-size", required_argument, 0, 'f'},
		{"idle-mode", required_argument, 0, 'I'}, {"impair", required_argument, 0, 'x'},
		{"rx-small", required_argument, 0, 's'}, {"rx-large", required_argument, 0, 'l'},
		{"max-msgs", required_argument, 0, 'm'}, {"window", required_argument, 0, 'w'},
		{"mbufs", required_argument, 0, 'b'},   {"tx-copy", no_argument, 0, 'c'},
		{"eal", required_argument, 0, 'e'},     {"help", no_argument, 0, 'h'},
		{0, 0, 0, 0}};
	int c;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		int bad = 0;
		switch (c) {
		case 'n': o.node = (uint16_t)strtoul(optarg, NULL, 0); break;
		case 'p': o.port = optarg; break;
		case 'P':
			if (o.n_peers >= 64 || dp_peer_parse(optarg, &o.peers[o.n_peers++]))
				bad = 1;
			break;
		case 'i': {
			unsigned a, b2, c2, d;
			if (sscanf(optarg, "%u.%u.%u.%u", &a, &b2, &c2, &d) != 4)
				bad = 1;
			o.self.ip = (a << 24) | (b2 << 16) | (c2 << 8) | d;
			break;
		}
		case 'u': o.self.port = (uint16_t)strtoul(optarg, NULL, 0); break;
		case 'r': o.region = optarg; break;
		case 'R': o.region_size = (size_t)strtoull(optarg, NULL, 0) << 20; break;
		case 'f': o.frame_size = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'I':
			if (!strcmp(optarg, "poll"))
				o.idle = DP_IDLE_POLL;
			else if (!strcmp(optarg, "sleep"))
				o.idle = DP_IDLE_SLEEP;
			else
				bad = 1;
			break;
		case 'x':
			bad = dp_impair_parse(optarg, &o.impair) != 0;
			impair_given = 1;
			break;
		case 's': bad = parse_pool(optarg, &o.rx_small_n, &o.rx_small_size) != 0; break;
		case 'l': bad = parse_pool(optarg, &o.rx_large_n, &o.rx_large_size) != 0; break;
		case 'm': o.rel.max_msgs = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'w': o.rel.window = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'b': o.n_mbufs = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'c': o.tx_copy = 1; break;
		case 'e': o.eal_args = optarg; break;
		case 'h': usage(stdout); return 0;
		default: bad = 1;
		}
		if (bad) {
			fprintf(stderr, "kvferry-dataplane: bad value for option (%s)\n",
				optarg ? optarg : "?");
			usage(stderr);
			return 2;
		}
	}
	if (!o.port || !o.region) {
		usage(stderr);
		return 2;
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	if (impair_given) {
		sa.sa_handler = on_outage;
		sigaction(SIGUSR1, &sa, NULL);
		sigaction(SIGUSR2, &sa, NULL);
		o.outage = &g_outage;
	}
	int r = dp_run(&o, &g_stop);
	return r ? 1 : 0;
}
