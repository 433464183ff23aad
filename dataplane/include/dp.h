/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file dp.h
 * The dataplane engine behind kvferry-dataplane: one port (a NIC bound to a
 * DPDK driver or a vdev such as net_memif / net_af_packet — the same code
 * path), a peer table, per-(peer, stream) reliability, and the shm rings of
 * dp_ipc.h. One thread runs dp_run(); it owns the port and the rings' consumer
 * ends.
 */
#ifndef DP_H
#define DP_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "dp_reliab.h"
#include "dp_wire.h"

#ifdef __cplusplus
extern "C" {
#endif

/** How the poll loop waits when there is nothing to do. */
enum dp_idle_mode {
	DP_IDLE_POLL = 0,  /**< busy-poll a dedicated core (production) */
	DP_IDLE_SLEEP = 1, /**< shares cores: yields while a message is in flight, else
			      adaptive back-off sleep (1 µs doubling to 200 µs) */
};

/** Test-only receive impairment (probabilities 0..1). */
struct dp_impair {
	double loss, dup, reorder, corrupt;
	uint64_t seed;
	double outage_s; /**< > 0: an outage SIGUSR1 starts ends by itself after this many seconds of
	                      the dataplane's own clock (a test's script may be starved longer) */
};

/** [dp] payload_crc. AUTO: on, except over net_memif (shared memory inside
 *  one host: nothing on the way can damage a frame, as over the kernel's
 *  loopback, which skips TCP's checksum too) without a test impairment that
 *  corrupts frames. The header's CRC is always on. */
enum { DP_PCRC_AUTO = 0, DP_PCRC_YES = 1, DP_PCRC_NO = 2 };
/** [dp] rx_in_place. AUTO: in place where the region is on hugepages and
 *  the receive buffers take at most a quarter of it, else reassembled (the
 *  start log says why); YES: in place or refuse to start; NO: reassembled. */
enum { DP_RXIP_AUTO = 0, DP_RXIP_YES = 1, DP_RXIP_NO = 2 };

/** A configured peer. */
struct dp_peer_cfg {
	uint16_t node;
	struct dp_wire_addr addr; /**< MAC all-ones: learned from the peer's frames */
};

/** Everything dp_run() needs; fill with dp_opts_init() then override. */
struct dp_opts {
	uint16_t node;              /**< our node id, < DP_MAX_PEERS */
	const char *port;           /**< a --vdev spec ("net_memif0,role=server,...") or a PCI address */
	const char *region;         /**< region name */
	size_t region_size;         /**< > 0: create the region with this many bytes (replacing) */
	struct dp_wire_addr self;   /**< our IP and UDP port (MAC comes from the port) */
	uint32_t frame_size;        /**< largest frame on the wire, bytes (<= DP_FRAME_MAX) */
	enum dp_idle_mode idle;
	struct dp_impair impair;
	uint32_t rx_small_n, rx_small_size; /**< reassembly pool for messages <= rx_small_size */
	uint32_t rx_large_n, rx_large_size; /**< reassembly pool for larger messages (max message) */
	uint32_t n_mbufs;           /**< mbufs per pool */
	int tx_copy;                /**< 1: copy payload into mbufs instead of attaching it */
	int rx_in_place;            /**< DP_RXIP_*: RX mbufs in the region; messages to rings whose
				         consumer declared it go out as segment lists (dp_ipc.h) */
	int payload_crc;            /**< DP_PCRC_*: CRC32C over every data frame's payload */
	struct dp_rel_opts rel;
	struct dp_peer_cfg peers[64];
	unsigned n_peers;
	const char *eal_args;       /**< extra EAL arguments, space-separated (may be NULL) */
	/** Test-only: while *outage is non-zero every received frame is dropped
	 *  (a link outage). NULL: never. */
	volatile sig_atomic_t *outage;
};

/** Defaults: frame 9000, idle poll, rx pools 256 x 64 KiB and 32 x 4 MiB, 8192 mbufs. */
void dp_opts_init(struct dp_opts *o);

struct cfg;

/**
 * Fill @p o from kvferry.conf's [dp] section (--config PATH, else
 * KVFERRY_CONFIG, else /etc/kvferry/kvferry.conf when present), KVFERRY_DP_*
 * variables and flags (--peer may repeat), through the floor's table engine
 * (kvf_cfg.h). @p o's strings point into @p *cfg: cfg_free() it after the
 * last use. @p impair_given is set when an impairment was configured.
 * @return 0; 1 when --help, --print-config or --check was served; < 0 with
 *         @p err naming the key, the value, its origin and what is allowed.
 */
int dp_cfg_load(int argc, char **argv, struct dp_opts *o, struct cfg **cfg, int *impair_given, char *err,
		size_t errlen);

/**
 * @return 1 if @p spec is a net_memif client in zero-copy mode (zero-copy=yes):
 * the server's driver copies straight into this node's mbufs and takes its
 * frames from them, so the client copies nothing. net_memif shares with the
 * server only the EAL's own memory segments, each by its file descriptor, and
 * takes every descriptor's buffer from the first of them (DPDK 22.11's
 * memif_region_init_zc() and its "FIXME: get region index"): so the port's
 * mbufs must all be EAL memory in one file per segment list, the region's
 * pages cannot be frames (no external buffers on send: the payload is copied
 * into an mbuf; no receive in place), and the region must not be registered
 * as external memory, which has no file descriptor (rte_memseg_get_fd()
 * answers ENOTSUP for it) and keeps the link from ever coming up.
 */
int dp_memif_zc(const char *spec);

/**
 * The port spec as the dataplane opens it: a net_memif client (role=client,
 * memif's default) that names no zero-copy= is a zero-copy one
 * (",zero-copy=yes" appended into @p buf): the server's driver copies
 * straight into its mbufs, where its consumers read them in place, one copy
 * a byte end to end against two (dataplane/BENCH.md); zero-copy=no keeps the
 * copy mode. Any other spec is @p spec itself.
 */
const char *dp_port_spec(const char *spec, char *buf, size_t len);

/**
 * Parse "id=[mac,]a.b.c.d[,port]" into @p p.
 * @return 0 or -EINVAL.
 */
int dp_peer_parse(const char *s, struct dp_peer_cfg *p);

/**
 * Parse "loss=0.05,dup=0.01,reorder=0.01,corrupt=0.01[,seed=N]".
 * @return 0 or -EINVAL.
 */
int dp_impair_parse(const char *s, struct dp_impair *imp);

/**
 * Initialise the EAL and the port, create the rings and pools, then poll
 * until *@p stop becomes non-zero. Prints its memory budget at start.
 * @return 0 after a clean stop, or -errno with the reason printed to stderr.
 */
int dp_run(const struct dp_opts *o, volatile sig_atomic_t *stop);

#ifdef __cplusplus
}
#endif
#endif /* DP_H */
