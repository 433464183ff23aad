/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The dataplane daemon's private state, shared by its poll loop (dp.c) and
 * its set-up and teardown (dp_run.c): the node, its peers and their
 * streams. The invariants are written at the top of dp.c.
 */
#ifndef DP_INT_H
#define DP_INT_H

#include <stdint.h>

#include <rte_cycles.h>
#include <rte_mbuf.h>

#include "dp.h"
#include "dp_ipc.h"

_Static_assert(DP_TX_LANES <= 32, "struct dp's held_mask has a bit per send lane");
#include "port.h"
#include "shm_live.h"
#include "shm_pool.h"
#include "shm_region.h"
#include "shm_ring.h"

#define BURST 32
#define HOLD_MAX 64           /* frames the reorder impairment may hold back */
#define TICK_NS 100000ull     /* timer work every 100 µs */
/* The keepalive (heartbeat) to a known peer. A peer is reported silent
 * after DP_PEER_SILENT_MS, two of them; from one keepalive and a bit of
 * quiet on, it is probed every PROBE_NS (a hello asking for a reply), and the
 * verdict also needs PROBES_MIN probes unanswered, so a verdict is never made
 * on a gap of our own: a dataplane descheduled for seconds wakes, probes for
 * ~100 ms, and hears a live peer's reply. 100 ms keepalives with a 3 s bound
 * left a killed peer unnoticed until its retransmissions gave up (~1.4 s). */
#define HELLO_UP_NS 300000000ull
#define PROBE_NS 20000000ull
#define PROBES_MIN 5
/* Silent this long after the verdict, a peer's messages in flight are
 * failed (DP_EV_PEER_DEAD), so that their senders get their buffers back
 * from a peer that never returns; a shorter silence keeps them, resent once
 * it is heard again. */
#define PEER_GONE_NS 10000000000ull
#define LOOP_GAP_NS 200000000ull /* a gap in our own loop worth a log line */
#define HELLO_DOWN_NS 10000000ull  /* hello to a peer we have not heard */
#define WINUPD_NS 1000000ull  /* a changed window (credit) is advertised within 1 ms */
#define ACK_KEEP_NS 100000000ull /* an unchanged one is repeated every 100 ms */
#define LIVE_SCAN_NS 50000000ull /* this node's liveness table is read every 50 ms (as ctrld reads it) */
#define HOLDER_SCAN_NS 1000000000ull /* the receive pools' holders are checked every second */

struct stream {
	struct dp_rel_tx *tx;
	struct dp_rel_rx *rx;
	uint32_t partial;         /* rx messages holding a buffer, not yet delivered */
	uint8_t rx_seen;          /* a message arrived on this stream */
	uint8_t rx_small;         /* the last one fitted the small pool */
	uint8_t rx_in_place;      /* the last one was received in place */
	uint32_t rx_frags;        /* ... in this many frames */
	uint16_t id;
	uint64_t adv_limit;       /* highest msg_limit that went out */
	uint64_t adv_ns;          /* when the last ACK went out */
	uint8_t *lane_of;         /* [max_msgs]: the send lane of message id & (max_msgs - 1) */
};

/* A DP_POOL_RX_SMALL buffer as a segment list (receive in place, dp.c). */
enum { IP_NONE = 0, IP_ASSEMBLING = 1, IP_OUT = 2 };
struct ip_msg {
	uint32_t frags;           /* frames (and mbufs) reserved for it */
	uint32_t held;            /* mbufs it holds */
	uint8_t state;
};

struct peer {
	int configured;
	uint16_t node;
	struct dp_wire_addr addr;
	uint64_t remote_epoch;    /* 0: never heard */
	uint64_t local_epoch;     /* our epoch toward this peer */
	uint64_t next_hello;
	uint64_t last_stale_hello;
	uint64_t last_rx;         /* the last frame heard from it */
	int silent;               /* DP_EV_PEER_SILENT reported, nothing heard since */
	uint32_t probes;          /* probes sent in the current quiet, unanswered */
	uint64_t next_probe;      /* the next probe; once silent, the next look for PEER_GONE_NS */
	int gone;                 /* silent past PEER_GONE_NS: its session was ended */
	uint64_t silent_since;    /* when it was reported silent */
	int deaths_known;         /* its hello's death count was read since its epoch changed */
	uint32_t remote_deaths;   /* the count its last hello carried */
	struct stream *st[DP_MAX_STREAMS];
	struct dp_peer_stats *stats;
};

struct dp {
	const struct dp_opts *o;
	uint64_t outage_t0;  /* test-only: when the running self-ending outage began (0: none) */
	struct dp_port port;
	struct shm_region *reg;
	struct shm_ring *r_rx, *r_ev;
	/* Send lanes (dp_ipc.h): one single-producer request ring per sending
	 * process, each with its own head-of-line request */
	struct dp_tx_lanes *txl;
	struct shm_ring *r_txl[DP_TX_LANES], *r_txcl[DP_TX_LANES]; /* requests, completions */
	uint32_t lane_out[DP_TX_LANES];    /* requests taken whose completion is not yet out */
	struct shm_desc held[DP_TX_LANES]; /* a send request waiting for window space */
	uint32_t held_mask;                /* bit l: held[l] is one (DP_TX_LANES <= 32) */
	unsigned lane_next;                /* the lane polled first next time (fairness) */
	int pcrc;                          /* our data frames carry a payload CRC, and we want one */
	int said_no_pcrc;                  /* a frame without one was refused (logged once) */
	int said_bad_crcs;                 /* a sender's payload CRCs were refused (logged once) */
	struct shm_ring *r_rx_kv, *r_rx_ctl; /* by message type (dp_ipc.h) */
	struct shm_pool *p_small, *p_large;
	struct dp_stats_shm *stats;
	int live_slot;
	/* Deaths of this node's processes (its liveness table), told to every
	 * peer in each hello: a stage's worker dying here was otherwise seen by
	 * the peer's ctrld only after its group timeout (30 s). */
	int32_t live_pid[SHM_LIVE_SLOTS]; /* the pid last seen alive in each slot, 0: none */
	uint32_t deaths;                  /* deaths seen since start */
	int32_t last_dead_pid;
	uint64_t next_live_scan;
	uint64_t next_holder_scan;  /* dead holders of receive buffers (dp.c, scan_holders) */
	uint64_t last_timers;             /* when dp_timers() last ran (a gap: we were off the CPU) */
	int link_up;                      /* the port's link at the last watch; -1 before the first */
	uint16_t link_q;                  /* queue pairs both ends of the link have (the peer's hello): 1..n_queues */
	struct dp_txq_totals txq_seen; /* the workers' totals, as last folded in */
	struct dp_wire_addr self;
	uint64_t base_epoch;
	struct peer peers[DP_MAX_PEERS];
	uint64_t tsc_hz;
	uint64_t rng;
	int in_flight;            /* last poll saw a message in flight either way */
	unsigned rx_streams;      /* streams that received a message (credit split) */
	struct rte_mbuf *hold[HOLD_MAX];
	unsigned n_hold;
	/* Receive in place (dp_ipc.h): the RX mbufs are region memory and a
	 * message to a ring whose consumer reads segment lists holds its frames'
	 * mbufs until its list (a small-pool buffer) is free again. */
	int in_place;
	struct dp_rxseg_decl *decl;   /* DP_AREA_RXSEG */
	struct dp_rxown *own;         /* DP_AREA_RXOWN */
	struct dp_pktmem *pk;         /* DP_AREA_PKTMEM */
	const char *pk_base;          /* RX mbufs outside the region (a zero-copy memif client): their file's start, else NULL */
	struct ip_msg *ip;            /* [rx_small_n], by small-pool index */
	struct rte_mbuf **ip_mb;      /* [rx_small_n][ip_max_segs] */
	uint32_t ip_max_segs;         /* frames of the largest message (rx_large) */
	uint32_t *ip_out;             /* small-pool indices delivered, not yet seen free */
	uint32_t n_ip_out;
	uint32_t mb_budget;           /* RX mbufs messages in place may reserve */
	uint32_t mb_reserved;
	uint64_t ip_copied;           /* messages for a reader of segments reassembled: the budget was held */
	/* Receive routes (dp_ipc.h, dp_route.c): a stream's KV pages to its owner's ring */
	struct dp_rxroute *route;     /* DP_AREA_RXROUTE */
	struct dp_route_cache {
		uint32_t gen;
		int32_t pid;
		int segs;  /* its consumer reads segment lists */
		struct shm_ring *r, *wake;
	} rt[DP_MAX_STREAMS];
	/* context for reliab callbacks */
	struct peer *cur_peer;
	struct stream *cur_stream;
	const struct dp_wire_hdr *cur_hdr; /* the frame being placed (rx_alloc) */
	uint64_t failed_now;
};

static inline uint64_t now_ns(const struct dp *d)
{
	/* TSC to ns without overflow for ~centuries at GHz rates */
	uint64_t t = rte_rdtsc();
	return (uint64_t)((__uint128_t)t * 1000000000u / d->tsc_hz);
}

static inline void cnt_add(uint64_t *c, uint64_t v)
{
	/* single writer: a relaxed store readers see whole */
	__atomic_store_n(c, *c + v, __ATOMIC_RELAXED);
}

/* Receive in place: give back the mbufs of every delivered message whose
 * segment list is free again (its consumer's put, or a reclaim). */
void dp_ip_reap(struct dp *d);
/** " reason=N" for each drop counted in @p drops (a stop or an error line). */
void dp_fmt_drops(char *b, size_t n, const uint64_t drops[DP_DROP_MAX_]);
/* Free what a message in place holds (small-pool index @p idx). */
void dp_ip_free(struct dp *d, uint32_t idx);

/* One turn of the loop: receive, take send requests, transmit, ACK. @return work done. */
unsigned dp_poll_once(struct dp *d, uint64_t now);
/* Timer work: retransmissions, hellos, window updates, dead peers. */
void dp_timers(struct dp *d, uint64_t now, uint64_t *next_winupd);
/* The port's link as dp_port_watch() saw it (1 up, 0 down): on going down,
 * every peer heard is reported silent at once. */
void dp_link(struct dp *d, int up);

/* The receive pool a delivered message's buffer (or segment list) is in. */
static inline struct shm_pool *dp_rx_pool(const struct dp *d, const struct shm_desc *m)
{
	return dp_ipc_rx_in_small(m->len, m->flags, shm_pool_bufsize(d->p_small)) ? d->p_small : d->p_large;
}

/* dp_route.c: the receive routes. The ring stream @p stream's KV pages
 * go to now (and the ring to wake after each, or NULL), or NULL: the usual
 * DP_RING_RX_KV; *segs (when not NULL): whether its consumer reads segment
 * lists; *pid (when not NULL): its consumer's pid. dp_route_scan() drops
 * the routes of dead consumers, dp_route_forget() those of @p pid, known
 * dead (before its buffers are reclaimed: no message is passed to it after). */
int dp_route_init(struct dp *d);
struct shm_ring *dp_route_ring(struct dp *d, uint16_t stream, struct shm_ring **wake, int *segs, int32_t *pid);
void dp_route_scan(struct dp *d);
void dp_route_forget(struct dp *d, int32_t pid);
void dp_route_close(struct dp *d);

#endif /* DP_INT_H */
