/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file dp_ipc.h
 * How other processes talk to kvferry-dataplane: named rings of shm_desc and
 * buffer pools in the node's region, and the per-peer counters it publishes.
 * This is a shared-memory ABI: names, descriptor conventions and the stats
 * layout change only with DP_STATS_VERSION.
 *
 * Rings (all of struct shm_desc, created by the dataplane):
 *  - DP_RING_TX_LANE "dp.tx.N" (N < DP_TX_LANES) send requests, one
 *      producer each: a process claims a free lane in DP_AREA_TXLANES
 *      (dp_ipc_tx_claim()) and sends on that lane's ring alone, so a
 *      producer killed inside an enqueue leaves its own lane half-updated
 *      and no other (one multi-producer ring wedged every sender of the
 *      node: rte_ring's tail never caught up with the dead producer's head
 *      move). Requests of one lane keep their order.
 *      off/len = payload in the region (must stay untouched until completion),
 *      type = DP_MT_MBATCH | DP_MT_KVPAGE | DP_MT_CONTROL, seq = caller's cookie,
 *      aux = DP_AUX(peer node, stream), flags = 0 or DP_TX_CRCS (the
 *      message's payload CRCs follow it: "payload CRCs from the producer").
 *  - DP_RING_TXC_LANE "dp.txc.N" the completions of lane N's requests, to
 *      the process that holds the lane: the request echoed, flags = 0
 *      (delivered and acknowledged) or DP_TXC_FAILED with the positive errno
 *      in the low byte (ECONNRESET: peer restarted; ETIMEDOUT: peer
 *      unreachable; EINVAL: bad request). The dataplane takes a lane's
 *      requests only while its completion ring has room for every one in
 *      flight, so it never waits on a slow or dead consumer.
 *    When a lane's process dies, the dataplane sends what the lane holds,
 *    waits for the completions of all of it, then empties both rings, gives
 *    back every buffer the dead process held in any pool of the region
 *    (shm_pools_reclaim()) and frees the lane.
 *  - DP_RING_RX  "dp.rx"  receive notifications, one consumer: off/len = the
 *      whole message in a buffer of pool DP_POOL_RX_SMALL or DP_POOL_RX_LARGE
 *      (dp_ipc_rx_in_small() tells which); the consumer gives it back
 *      with shm_pool_put() when done. seq = msg_id, type, aux = DP_AUX(peer, stream).
 *      flags = DP_RX_SEGMENTS: received in place (below): off is a segment
 *      list in DP_POOL_RX_SMALL, len the message's length; the same one put
 *      gives back the list and every frame it names.
 *  - DP_RING_RX_KV ("dp.rx.kv") and DP_RING_RX_CTL ("dp.rx.ctl"): the same,
 *    for DP_MT_KVPAGE and DP_MT_CONTROL messages, so the process that owns
 *    each stream (the decode worker, ctrld) is its only consumer.
 *  - DP_RING_EV  "dp.ev"  events for ctrld: type = enum dp_event,
 *      aux = DP_AUX(peer, 0), seq = the peer's new epoch, len = messages failed
 *      (DP_EV_PEER_PROC_DEAD: the pid that died).
 *
 *
 * Receive in place ([dp] rx_in_place = yes): the dataplane's receive mbufs
 * lie in the region (area DP_AREA_RX_MBUFS), so a message can be handed over
 * as the list of its frames' payloads where the driver put them, with no
 * reassembly copy. Only a ring whose consumer declared that it reads
 * segment lists (dp_ipc_rx_declare() in DP_AREA_RXSEG) gets them; the others
 * keep whole messages in one buffer. A consumer reads the segments
 * (dp_ipc_rx_seglist(), dp_ipc_rx_seg()) or copies them into a buffer of its
 * own (dp_ipc_rx_gather(): that copy is the consumer's, not the
 * dataplane's), then puts the list back into DP_POOL_RX_SMALL; the dataplane
 * frees the frames once it sees the list free (the consumer's put, or
 * shm_pool_reclaim() after the consumer died). The segments' bytes belong to
 * the dataplane that delivered them: a successor started on the same region
 * makes its receive buffers anew, so a consumer that cannot rule out a
 * dataplane restart checks dp_ipc_rx_seglist_current() after reading.
 * A zero-copy net_memif client cannot have its receive mbufs in the region
 * (its driver takes only the EAL's own memory): its segments lie in that
 * memory, which it names in DP_AREA_PKTMEM, and a consumer maps it read-only
 * (struct dp_rx_mem does, at the first such segment it reads).
 *
 * Threading: as for shm rings and pools; the stats block has one writer (the
 * dataplane) and is read with relaxed loads (counters may be mutually skewed
 * by one poll iteration).
 */
#ifndef DP_IPC_H
#define DP_IPC_H

#include <assert.h>
#include <endian.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/** Message types: the wire header's `type`, and what a client puts in a send
 *  descriptor's type (dp_wire.h frames them). */
enum dp_msg_type {
	DP_MT_MBATCH = 1,  /**< micro-batch: column metadata + rows/token ids + in-band ops */
	DP_MT_KVPAGE = 2,  /**< KV page write: room, destination block ids, layer range, data */
	DP_MT_CONTROL = 3, /**< control message between ctrld instances */
	DP_MT_ACK = 4,     /**< cumulative + selective ACK and credit; body dp_wire_ack */
	DP_MT_HELLO = 5,   /**< hello / keepalive: announces node id, epoch, MAC, IP, port */
	DP_MT_MAX_ = 6,
};

/** Why a frame was refused: also the drop-counter index (dp_stats). */
enum dp_drop_reason {
	DP_DROP_NONE = 0,
	DP_DROP_SHORT,       /**< shorter than the headers it claims */
	DP_DROP_NOT_IP4UDP,  /**< not IPv4/UDP, IP options, fragments, or lengths inconsistent */
	DP_DROP_PORT,        /**< UDP destination port is not ours */
	DP_DROP_MAGIC,       /**< magic or version differ */
	DP_DROP_HDR_CSUM,    /**< header CRC mismatch */
	DP_DROP_BAD_FIELD,   /**< type, fragment or length fields inconsistent */
	DP_DROP_PAYLOAD_CSUM,/**< payload CRC mismatch */
	DP_DROP_NOT_FOR_US,  /**< dst_node is another node */
	DP_DROP_UNKNOWN_PEER,/**< src_node not in the peer table */
	DP_DROP_STALE_EPOCH, /**< frame from a previous incarnation of either end */
	DP_DROP_DUP,         /**< already received */
	DP_DROP_WINDOW,      /**< beyond the receive window or the granted credit */
	DP_DROP_NOBUF,       /**< no reassembly buffer free */
	DP_DROP_IMPAIR,      /**< dropped by the test-only impairment option */
	DP_DROP_TXFULL,      /**< our transmit queue refused the frame */
	DP_DROP_MAX_,
};

#ifdef __cplusplus
extern "C" {
#endif

#define DP_RING_TX_LANE "dp.tx.%u"   /* printf format: the lane */
#define DP_RING_TXC_LANE "dp.txc.%u" /* the lane's completions */
#define DP_AREA_TXLANES "dp.txl"    /* struct dp_tx_lanes */
#define DP_TX_LANES 32u             /* processes (or threads) that may send at once */
#define DP_RING_RX "dp.rx"
#define DP_RING_EV "dp.ev"
/* Each stream to the process that owns it: KV pages (DP_MT_KVPAGE) arrive on
 * their own ring (the workers'), control messages (DP_MT_CONTROL) on theirs
 * (ctrld's); micro-batches keep dp.rx. */
#define DP_RING_RX_KV "dp.rx.kv"
#define DP_RING_RX_CTL "dp.rx.ctl"
#define DP_POOL_RX_SMALL "dp.rxs"
#define DP_POOL_RX_LARGE "dp.rxl"
#define DP_AREA_STATS "dp.stats"

#define DP_MAX_PEERS 64u   /**< node ids are 0..DP_MAX_PEERS-1 */
#define DP_MAX_STREAMS 16u /**< stream ids per peer are 0..DP_MAX_STREAMS-1 */

/** Pack a peer node id and a stream id into shm_desc.aux. */
#define DP_AUX(peer, stream) (((uint64_t)(peer) << 16) | (uint64_t)(uint16_t)(stream))
#define DP_AUX_PEER(aux) ((uint16_t)((aux) >> 16))
#define DP_AUX_STREAM(aux) ((uint16_t)(aux))
/* A received message: the pid its buffer was passed to (shm_pool_pass())
 * before the enqueue, its ring's owner or route's consumer (below), 0 where
 * the dataplane kept it. */
#define DP_AUX_HOLDER(aux) ((int32_t)(uint32_t)((aux) >> 32))

#define DP_TXC_FAILED 0x100u

/** Silence after which an up peer is reported (DP_EV_PEER_SILENT): 2 keepalives of 300 ms, the
 *  last 0.3 s of it probed (a dataplane descheduled for less is not reported). */
#define DP_PEER_SILENT_MS 600u

/** Events on DP_RING_EV. */
enum dp_event {
	DP_EV_PEER_UP = 1,      /**< first hello from a peer */
	DP_EV_PEER_RESTART = 2, /**< the peer came back with a new epoch; len = messages failed */
	DP_EV_PEER_DEAD = 3,    /**< the session was given up (the peer answers but nothing moves, or it
	                             was silent for 10 s); len = messages failed */
	DP_EV_PEER_SILENT = 4,  /**< nothing (not even a hello) heard from an up peer for DP_PEER_SILENT_MS:
	                             its process or link is gone; messages in flight are kept and resent
	                             if it comes back (DP_EV_PEER_UP again, or RESTART with a new epoch) */
	DP_EV_PEER_PROC_DEAD = 5, /**< a process of the peer's node died (a pid of its region's liveness
	                               table, as its dataplane saw it): len = that pid. The link is fine;
	                               ctrld takes it as the loss of the stage whose worker had that pid */
};

#define DP_STATS_MAGIC 0x53545044u /* "DPTS" */
#define DP_STATS_VERSION 3u /* 2: the link state after up (heard_ago_ms .. streams), the copy counters; 3: crc_given_bytes */

/** Counters for one peer (monotonic, except the link's state: rtt_ns, epoch, up and what follows up). */
struct dp_peer_stats {
	uint64_t tx_frames;
	uint64_t tx_bytes;
	uint64_t rx_frames;
	uint64_t rx_bytes;
	uint64_t retransmits;
	uint64_t timeouts;
	uint64_t msgs_sent;      /**< acknowledged */
	uint64_t msgs_failed;    /**< reported failed to the sender */
	uint64_t msgs_received;  /**< delivered to the consumer */
	uint64_t restarts;       /**< epoch changes seen */
	uint64_t rtt_ns;         /**< smoothed RTT of the busiest stream */
	uint64_t epoch;          /**< the peer's current epoch */
	uint64_t drops[DP_DROP_MAX_];
	uint32_t node;
	uint32_t up;             /**< 1 once a hello arrived; 0 again while silent or dead */
	uint64_t heard_ago_ms;   /**< since the last frame from it, as of the last housekeeping pass */
	uint64_t credit;         /**< messages it still lets us send: the least over our streams to it */
	uint64_t rto_ns;         /**< retransmission timeout of the busiest stream */
	uint32_t silent;         /**< 1 from DP_EV_PEER_SILENT until it is heard again */
	uint32_t streams;        /**< streams open to it */
};

/** The DP_AREA_STATS area. */
struct dp_stats_shm {
	uint32_t magic;
	uint32_t version;
	uint32_t n_peers;        /**< entries in use */
	uint32_t self_node;
	uint64_t epoch;          /**< this dataplane's base epoch */
	uint64_t hugepage_bytes; /**< DPDK + region memory this dataplane sized at start */
	uint64_t drops_unknown[DP_DROP_MAX_]; /**< drops not attributable to a peer */
	struct dp_peer_stats peer[DP_MAX_PEERS];
	/* Where the payload's bytes are copied (all monotonic, all peers): what
	 * the dataplane's own code copies and reads, and what its port's driver
	 * copies per byte (known from the driver: 1 for net_memif in copy mode
	 * and net_af_packet, which copy between mbufs and their shared rings —
	 * the kernel's copies behind net_af_packet are not counted; 0 for a
	 * NIC, whose DMA reads and writes the buffers). */
	uint64_t payload_tx_bytes; /**< payload handed to the driver (first sends and resends) */
	uint64_t payload_rx_bytes; /**< payload placed in receive buffers (accepted frames) */
	uint64_t copy_tx_bytes;    /**< of payload_tx, copied by the dataplane into frame buffers */
	uint64_t copy_rx_bytes;    /**< of payload_rx, copied by the dataplane into the region */
	uint64_t crc_read_bytes;   /**< read by a CRC pass of its own (not fused with a copy; with
	                                worker lcores, theirs too, each just before its driver's copy) */
	uint32_t pmd_tx_copies;    /**< copies per payload byte the driver makes sending */
	uint32_t pmd_rx_copies;    /**< ... and receiving */
	uint64_t crc_given_bytes;  /**< payload of messages sent with their producer's CRCs (DP_TX_CRCS):
	                                no pass of the dataplane's own read it */
};
static_assert(offsetof(struct dp_stats_shm, epoch) == 16, "epoch at 16");
static_assert(offsetof(struct dp_stats_shm, drops_unknown) == 32, "drops_unknown at 32");
static_assert(offsetof(struct dp_stats_shm, peer) == 32 + 8 * DP_DROP_MAX_, "peer table");
static_assert(offsetof(struct dp_stats_shm, payload_tx_bytes)
	      == offsetof(struct dp_stats_shm, peer) + DP_MAX_PEERS * sizeof(struct dp_peer_stats), "copy counters");
static_assert(sizeof(struct dp_peer_stats) == 8 * (12 + DP_DROP_MAX_) + 8 + 8 * 3 + 8, "peer stats size");

/**
 * @return 1 if a received message of @p len bytes sits in DP_POOL_RX_SMALL,
 *         given that pool's buffer size @p small_bufsize; 0 for DP_POOL_RX_LARGE.
 *         For a whole message only (flags without DP_RX_SEGMENTS): see
 *         dp_ipc_rx_in_small().
 */
static inline int dp_ipc_rx_pool_is_small(uint32_t len, size_t small_bufsize)
{
	return len <= small_bufsize;
}

/** Receive descriptor flag: received in place, off is a struct dp_rx_seglist. */
#define DP_RX_SEGMENTS 0x1u

/**
 * @return 1 if the buffer of a received message (descriptor @p len and
 *         @p flags) is in DP_POOL_RX_SMALL, 0 for DP_POOL_RX_LARGE: a segment
 *         list always is.
 */
static inline int dp_ipc_rx_in_small(uint32_t len, uint16_t flags, size_t small_bufsize)
{
	return (flags & DP_RX_SEGMENTS) || len <= small_bufsize;
}

/* ------------------------------------------------ send lanes */

#define DP_TXL_MAGIC 0x4c585444u /* "DTXL" */
#define DP_TXL_VERSION 2u /* 2: completions on the lane's own ring */

/**
 * The DP_AREA_TXLANES area, made by the dataplane with every lane's ring.
 * pid[i] is 0 for a free lane, else the process sending on "dp.tx.i" and
 * reading "dp.txc.i": it claims a lane by CAS 0 -> its pid and gives it up
 * with pid -> DP_TXL_CLOSING on a clean close; the dataplane frees a closing
 * lane (-> 0) once nothing of it is in flight, and the lanes of dead pids
 * likewise (see above), so a lane's next holder never sees a completion of
 * its last. One thread at a time sends on a lane, and one reads
 * its completions (the rings are single-producer, single-consumer).
 */
#define DP_TXL_CLOSING (-1)

struct dp_tx_lanes {
	uint32_t magic;
	uint32_t version;
	uint32_t n;        /**< lanes (DP_TX_LANES) */
	uint32_t crc_stride; /**< payload bytes a data frame carries where the dataplane sends payload CRCs
	                          (a producer may give them: DP_TX_CRCS), 0 where it sends none */
	int32_t pid[DP_TX_LANES];
};
static_assert(sizeof(struct dp_tx_lanes) == 16 + 4 * DP_TX_LANES, "dp_tx_lanes layout");

/**
 * Claim a free lane of @p t for process @p pid.
 * @return the lane, or -1: not a lanes area (a dataplane of another version),
 *         or every lane taken (-2).
 */
static inline int dp_ipc_tx_claim(struct dp_tx_lanes *t, int32_t pid)
{
	if (__atomic_load_n(&t->magic, __ATOMIC_ACQUIRE) != DP_TXL_MAGIC || t->version != DP_TXL_VERSION
	    || t->n > DP_TX_LANES)
		return -1;
	for (uint32_t i = 0; i < t->n; i++) {
		int32_t free_ = 0;

		if (__atomic_compare_exchange_n(&t->pid[i], &free_, pid, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
			return (int)i;
	}
	return -2;
}

/** Give up lane @p lane that @p pid claimed (a clean close; what it sent is
 *  still sent, and the dataplane frees the lane once nothing is in flight). */
static inline void dp_ipc_tx_release(struct dp_tx_lanes *t, int lane, int32_t pid)
{
	if (lane >= 0 && (uint32_t)lane < DP_TX_LANES)
		__atomic_compare_exchange_n(&t->pid[lane], &pid, DP_TXL_CLOSING, 0, __ATOMIC_RELEASE,
					    __ATOMIC_RELAXED);
}

/* ------------------------------------------------ payload CRCs from the producer */

/*
 * Where the dataplane sends a CRC32C of each data frame's payload ([dp]
 * payload_crc: on over a NIC or af_packet, off over net_memif), it reads
 * every byte of a message for it just before the driver (or the NIC) takes
 * it: a pass of its own on the link's one lcore. A producer that writes the
 * message can compute the same CRCs where it writes the bytes, while they
 * are in its cache (dp_crc32c.h, dp_ipc_tx_crcs_fill()), and hand them
 * over behind the message: the request's flags say DP_TX_CRCS, and struct
 * dp_tx_crcs lies at off + dp_ipc_tx_crcs_off(len), with crc[i] the CRC32C
 * of bytes [i * stride, min((i + 1) * stride, len)) of the message. stride
 * must be the dataplane's crc_stride (struct dp_tx_lanes): a trailer of
 * another stride (the dataplane restarted with another frame size), a bad
 * magic or count, or one past the region's end is ignored and the
 * dataplane computes the CRCs itself, as for a request without the flag.
 * The trailer stays untouched until the completion, as the message does. A
 * wrong CRC is the producer's bug: the receiver drops the frame as damaged
 * on every resend, so the message fails once its peer is given up.
 */
#define DP_TX_CRCS 0x1u            /**< send request flag: the payload CRCs follow the message */
#define DP_TX_CRCS_MAGIC 0x53435243u /* "CRCS" */

struct dp_tx_crcs {
	uint32_t magic;    /**< DP_TX_CRCS_MAGIC, written last */
	uint32_t stride;   /**< payload bytes per frame: the dataplane's crc_stride */
	uint32_t n;        /**< frames: dp_ipc_tx_crcs_count(len, stride) */
	uint32_t reserved;
	uint32_t crc[];
};
static_assert(sizeof(struct dp_tx_crcs) == 16, "dp_tx_crcs header is 16 bytes");

/** @return where a message of @p len bytes keeps its trailer, from its start. */
static inline uint64_t dp_ipc_tx_crcs_off(uint32_t len)
{
	return ((uint64_t)len + 7u) & ~7ull;
}

/** @return the frames of a message of @p len bytes at @p stride (one for an empty one). */
static inline uint32_t dp_ipc_tx_crcs_count(uint32_t len, uint32_t stride)
{
	return len ? (uint32_t)(((uint64_t)len + stride - 1) / stride) : 1u;
}

/** @return the bytes a buffer needs past a @p len-byte message's start to hold it and its trailer. */
static inline uint64_t dp_ipc_tx_crcs_room(uint32_t len, uint32_t stride)
{
	return dp_ipc_tx_crcs_off(len) + sizeof(struct dp_tx_crcs) +
	       4ull * (stride ? dp_ipc_tx_crcs_count(len, stride) : 0);
}

/** @return the stride the dataplane of lanes area @p t takes CRCs at, 0: compute none. */
static inline uint32_t dp_ipc_tx_crc_stride(const struct dp_tx_lanes *t)
{
	return t ? __atomic_load_n(&t->crc_stride, __ATOMIC_ACQUIRE) : 0;
}

/* ------------------------------------------------ receive in place */

#define DP_AREA_RX_MBUFS "dp.rxmb" /* the receive mbufs' data buffers (the dataplane's alone) */
#define DP_AREA_RXSEG "dp.rxseg"   /* struct dp_rxseg_decl */
#define DP_RXSEG_MAGIC 0x47455344u /* "DSEG" */
#define DP_RXSEG_VERSION 1u

/** The receive rings, as indices of struct dp_rxseg_decl. */
enum dp_rx_ring {
	DP_RX_RING_MBATCH = 0, /**< DP_RING_RX */
	DP_RX_RING_KV = 1,     /**< DP_RING_RX_KV */
	DP_RX_RING_CTL = 2,    /**< DP_RING_RX_CTL */
	DP_RX_RINGS = 3,
};

/** @return the receive ring of messages of type @p type. */
static inline enum dp_rx_ring dp_ipc_rx_ring_of(unsigned type)
{
	return type == DP_MT_KVPAGE ? DP_RX_RING_KV : type == DP_MT_CONTROL ? DP_RX_RING_CTL : DP_RX_RING_MBATCH;
}

/**
 * The DP_AREA_RXSEG area, made by the dataplane. Each receive ring's
 * consumer writes only its own word of pid[]: its pid while it reads
 * segment lists from that ring, 0 when it stops; the dataplane reads them
 * when a message starts and clears the word of a pid that died.
 * in_place is the dataplane's: 1 while it receives in place.
 */
struct dp_rxseg_decl {
	uint32_t magic;
	uint32_t version;
	uint32_t in_place;
	uint32_t reserved;
	int32_t pid[4];  /**< by enum dp_rx_ring; [3] unused */
};
static_assert(sizeof(struct dp_rxseg_decl) == 32, "dp_rxseg_decl is a 32-byte ABI record");
static_assert(offsetof(struct dp_rxseg_decl, pid) == 16, "pid at 16");

/**
 * Say that process @p pid reads segment lists from @p ring (0: it no longer
 * does; messages already on the ring stay as they were delivered).
 * @p area is the DP_AREA_RXSEG area. @return 0, or -1 (not such an area).
 */
static inline int dp_ipc_rx_declare(struct dp_rxseg_decl *area, enum dp_rx_ring ring, int32_t pid)
{
	if (area->magic != DP_RXSEG_MAGIC || area->version != DP_RXSEG_VERSION || (unsigned)ring >= DP_RX_RINGS)
		return -1;
	__atomic_store_n(&area->pid[ring], pid, __ATOMIC_RELEASE);
	return 0;
}

/* ------------------------------------------------ receive ring owners */

/*
 * Each receive ring's consumer (ctrld's chain and PD link, a worker whose
 * stage's input comes over the dataplane, a test client) names itself in
 * this area (dp_ipc_rx_own()). The dataplane then passes each message's
 * buffer to that pid before the enqueue and says so in the descriptor
 * (DP_AUX_HOLDER(aux)), as it does for a receive route (below); the
 * consumer takes it with shm_pool_pass(pool, idx, DP_AUX_HOLDER(aux),
 * getpid()) and skips a message whose pass fails: its buffer went back to
 * the pool after the pid it was passed to died, and may be another
 * message's by now. A consumer killed between its dequeue and its take so
 * leaves a buffer held by its dead pid, which the dataplane reclaims once
 * it sees the death (forgetting the name first: nothing more is passed to
 * it). A ring nobody named keeps its buffers under the dataplane's pid (0
 * in the descriptor), and shm_pool_pass() from 0 takes them as before.
 */
#define DP_AREA_RXOWN "dp.rxown"   /* struct dp_rxown */
#define DP_RXOWN_MAGIC 0x4e574f52u /* "ROWN" */
#define DP_RXOWN_VERSION 1u

struct dp_rxown {
	uint32_t magic;
	uint32_t version;
	int32_t pid[4];    /**< by enum dp_rx_ring: the ring's consumer, 0: none; [3] unused */
	uint64_t reserved;
};
static_assert(sizeof(struct dp_rxown) == 32, "dp_rxown is a 32-byte ABI record");

/**
 * Say that process @p pid consumes receive ring @p ring; with @p pid 0,
 * that process @p was stops (the name is cleared only while it is still
 * @p was: a successor's stays). @p area is the DP_AREA_RXOWN area.
 * @return 0, or -1 (not such an area).
 */
static inline int dp_ipc_rx_own(struct dp_rxown *area, enum dp_rx_ring ring, int32_t pid, int32_t was)
{
	if (area->magic != DP_RXOWN_MAGIC || area->version != DP_RXOWN_VERSION || (unsigned)ring >= DP_RX_RINGS)
		return -1;
	if (pid == 0)
		__atomic_compare_exchange_n(&area->pid[ring], &was, 0, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
	else
		__atomic_store_n(&area->pid[ring], pid, __ATOMIC_RELEASE);
	return 0;
}

/* ------------------------------------------------ receive routes */

/*
 * A stream's messages to the process that owns them. A consumer that owns
 * one stream (a worker process whose stage owns the layers the stream's KV
 * pages carry) names its own ring for it here; the dataplane then delivers
 * that stream's KV page messages (DP_MT_KVPAGE) whole (never in place) on
 * that ring and wakes the named ring's sleeper, instead of DP_RING_RX_KV.
 * Its ring must hold every buffer of both receive pools (an enqueue cannot
 * fail) and take several consumers (SHM_RING_MC: the dataplane drains a
 * dead consumer's ring back into its pools). A route whose pid died is
 * dropped by the dataplane; a message it could not route goes to
 * DP_RING_RX_KV as before.
 *
 * The dataplane passes each message's buffer to the route's pid before it
 * enqueues it, and says so in the descriptor (DP_AUX_HOLDER(aux)); the
 * consumer takes it with shm_pool_pass(pool, idx, DP_AUX_HOLDER(aux),
 * getpid()) rather than shm_pool_take(), and skips a message that fails
 * (its buffer was reclaimed from a dead predecessor on the same ring and
 * may be another message's now). So a consumer killed between a dequeue
 * and its take leaks nothing: the buffer is held by its dead pid.
 *
 * A node sends stage k's pages (its chain's k-th layer range) on stream
 * DP_STREAM_KV_STAGE + k, so each stage's pages are one stream end to end.
 */
#define DP_AREA_RXROUTE "dp.rxroute" /* struct dp_rxroute */
#define DP_RXROUTE_MAGIC 0x54554f52u /* "ROUT" */
#define DP_RXROUTE_VERSION 1u
#define DP_STREAM_KV_STAGE 2u        /* stage k's KV pages: stream DP_STREAM_KV_STAGE + k */

/** One stream's route: written by its consumer (gen odd while it writes). */
struct dp_rxroute_ent {
	int32_t pid;      /**< the consumer; 0: no route */
	uint32_t gen;     /**< bumped twice per write: odd while the names change */
	char ring[32];    /**< its receive ring (SHM_NAME_MAX) */
	char wake[32];    /**< the ring it sleeps on, woken after each message ("": none) */
};
static_assert(sizeof(struct dp_rxroute_ent) == 72, "dp_rxroute_ent is a 72-byte ABI record");

struct dp_rxroute {
	uint32_t magic;
	uint32_t version;
	uint64_t segs;    /**< bit s: stream s's consumer reads segment lists (DP_RX_SEGMENTS) */
	struct dp_rxroute_ent ent[DP_MAX_STREAMS];
};

/**
 * Route stream @p stream's KV page messages to ring @p ring of process
 * @p pid (0: withdraw the route), waking ring @p wake's sleeper after each.
 * @p segs: the consumer reads segment lists, so a dataplane receiving in
 * place (rx_in_place) may hand it messages as the list of their frames
 * (DP_RX_SEGMENTS) rather than reassembled; it does so only while the
 * route's fallback, DP_RING_RX_KV, reads them too (dp_ipc_rx_declare()).
 * @p area is the DP_AREA_RXROUTE area. @return 0, or -1 (not such an area,
 * or a name too long).
 */
static inline int dp_ipc_rx_route(struct dp_rxroute *area, unsigned stream, const char *ring, const char *wake,
				  int32_t pid, int segs)
{
	struct dp_rxroute_ent *e;
	uint32_t g;

	if (area->magic != DP_RXROUTE_MAGIC || area->version != DP_RXROUTE_VERSION || stream >= DP_MAX_STREAMS
	    || strlen(ring) >= sizeof(e->ring) || strlen(wake) >= sizeof(e->wake))
		return -1;
	e = &area->ent[stream];
	__atomic_store_n(&e->pid, 0, __ATOMIC_SEQ_CST);
	g = __atomic_load_n(&e->gen, __ATOMIC_RELAXED);
	__atomic_store_n(&e->gen, g | 1u, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	memset(e->ring, 0, sizeof(e->ring));
	memset(e->wake, 0, sizeof(e->wake));
	memcpy(e->ring, ring, strlen(ring));
	memcpy(e->wake, wake, strlen(wake));
	if (segs && pid > 0)
		__atomic_fetch_or(&area->segs, 1ull << stream, __ATOMIC_RELAXED);
	else
		__atomic_fetch_and(&area->segs, ~(1ull << stream), __ATOMIC_RELAXED);
	__atomic_store_n(&e->gen, (g | 1u) + 1u, __ATOMIC_RELEASE);
	__atomic_store_n(&e->pid, pid, __ATOMIC_RELEASE);
	return 0;
}

/** One segment: @p len bytes at offset @p off of area @p area. */
struct dp_rx_seg {
	uint64_t off;
	uint32_t len;
	uint32_t area; /**< DP_RX_AREA_REGION or DP_RX_AREA_PKTMEM */
};
static_assert(sizeof(struct dp_rx_seg) == 16, "dp_rx_seg is a 16-byte ABI record");

#define DP_RX_AREA_REGION 0u /* the node's region */
#define DP_RX_AREA_PKTMEM 1u /* the dataplane's packet memory (DP_AREA_PKTMEM) */

#define DP_RX_SEGLIST_MAGIC 0x4c474553u /* "SEGL" */
#define DP_RX_SEGLIST_VERSION 1u

/** A message received in place: its segments in order, one per frame. */
struct dp_rx_seglist {
	uint32_t magic;
	uint16_t version;
	uint16_t reserved;
	uint32_t n_segs;
	uint32_t msg_len;  /**< the sum of the segments' lengths */
	uint64_t epoch;    /**< the delivering dataplane's (dp_stats_shm.epoch) */
	struct dp_rx_seg seg[];
};
static_assert(sizeof(struct dp_rx_seglist) == 24, "dp_rx_seglist header is 24 bytes");

#define DP_AREA_PKTMEM "dp.pktmem" /* struct dp_pktmem */
#define DP_PKTMEM_MAGIC 0x4d4b5044u /* "DPKM" */
#define DP_PKTMEM_VERSION 1u

/**
 * The DP_AREA_PKTMEM area: where a dataplane whose receive mbufs are not in
 * the region (a zero-copy memif client) receives in place. Its memory is
 * the file it holds open as @p fd (a memfd or a hugetlbfs file), which a
 * process of the same user opens as /proc/<pid>/fd/<fd>; a DP_RX_AREA_PKTMEM
 * segment's offset is an offset in that file, below @p len. @p pid is 0
 * while no dataplane receives there; @p epoch is the publishing dataplane's
 * (dp_stats_shm.epoch), written last (release).
 */
struct dp_pktmem {
	uint32_t magic;
	uint32_t version;
	int32_t pid;
	int32_t fd;
	uint64_t len;
	uint64_t epoch;
};
static_assert(sizeof(struct dp_pktmem) == 32, "dp_pktmem is a 32-byte ABI record");

/**
 * Where a consumer reads segments: the region, and the dataplane's packet
 * memory, mapped read-only the first time a segment lies there and again
 * when another dataplane publishes it (a restart). Zeroed, then
 * dp_ipc_rx_mem_init(); dp_ipc_rx_mem_fini() unmaps.
 */
struct dp_rx_mem {
	const void *base;             /**< the region, mapped here */
	size_t size;
	const struct dp_pktmem *pk;   /**< its DP_AREA_PKTMEM area, or NULL */
	const void *pk_base;          /**< the packet memory mapped here, or NULL */
	size_t pk_size;
	uint64_t pk_epoch;            /**< the dataplane's whose memory is mapped */
	unsigned maps;                /**< times it was mapped (once per dataplane that delivered there) */
};

/** @p pk: the region's DP_AREA_PKTMEM area (NULL where there is none). */
static inline void dp_ipc_rx_mem_init(struct dp_rx_mem *m, const void *base, size_t size, const struct dp_pktmem *pk)
{
	memset(m, 0, sizeof(*m));
	m->base = base;
	m->size = size;
	m->pk = pk != NULL && pk->magic == DP_PKTMEM_MAGIC && pk->version == DP_PKTMEM_VERSION ? pk : NULL;
}

static inline void dp_ipc_rx_mem_unmap(struct dp_rx_mem *m)
{
	if (m->pk_base != NULL)
		munmap((void *)(uintptr_t)m->pk_base, m->pk_size);
	m->pk_base = NULL;
	m->pk_size = 0;
	m->pk_epoch = 0;
}

static inline void dp_ipc_rx_mem_fini(struct dp_rx_mem *m)
{
	dp_ipc_rx_mem_unmap(m);
	m->maps = 0;
}

/**
 * Map the packet memory of the dataplane that delivered a list of @p epoch
 * (once per dataplane). @return 0, or -1 (none published for that epoch, or
 * it could not be opened: its dataplane is gone; the list is not readable).
 */
static inline int dp_ipc_rx_mem_map(struct dp_rx_mem *m, uint64_t epoch)
{
	char path[64];
	void *p;
	int fd;

	if (m->pk_base != NULL && m->pk_epoch == epoch)
		return 0;
	if (m->pk == NULL || __atomic_load_n(&m->pk->epoch, __ATOMIC_ACQUIRE) != epoch || m->pk->pid <= 0
	    || m->pk->len == 0)
		return -1;
	dp_ipc_rx_mem_unmap(m);
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)m->pk->pid, (int)m->pk->fd);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return -1;
	/* no reservation: a hugetlbfs file's holes past the mbufs are never read */
	p = mmap(NULL, (size_t)m->pk->len, PROT_READ, MAP_SHARED | MAP_NORESERVE, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return -1;
	m->pk_base = p;
	m->pk_size = (size_t)m->pk->len;
	m->pk_epoch = epoch;
	m->maps++;
	return 0;
}

/** @return the bytes a list of @p n segments takes. */
static inline size_t dp_ipc_rx_seglist_size(uint32_t n)
{
	return sizeof(struct dp_rx_seglist) + (size_t)n * sizeof(struct dp_rx_seg);
}

/**
 * The segment list of a received descriptor (@p off, @p len, flags with
 * DP_RX_SEGMENTS) in the region of @p m, checked: magic and version, a list
 * that fits a @p small_bufsize buffer, every segment inside its area (the
 * packet memory mapped here if a segment lies there), lengths that add up
 * to @p len.
 * @return the list, or NULL (not a valid list: give the buffer back and
 *         count the message lost).
 */
static inline const struct dp_rx_seglist *dp_ipc_rx_seglist(struct dp_rx_mem *m, uint64_t off, uint32_t len,
							   size_t small_bufsize)
{
	const struct dp_rx_seglist *sl;
	uint64_t sum = 0;

	if (off > m->size || m->size - off < small_bufsize || small_bufsize < sizeof(*sl))
		return NULL;
	sl = (const struct dp_rx_seglist *)((const char *)m->base + off);
	if (sl->magic != DP_RX_SEGLIST_MAGIC || sl->version != DP_RX_SEGLIST_VERSION || sl->msg_len != len
	    || sl->n_segs > (small_bufsize - sizeof(*sl)) / sizeof(sl->seg[0]))
		return NULL;
	for (uint32_t i = 0; i < sl->n_segs; i++) {
		size_t size = m->size;

		if (sl->seg[i].area == DP_RX_AREA_PKTMEM) {
			if (dp_ipc_rx_mem_map(m, sl->epoch) < 0)
				return NULL;
			size = m->pk_size;
		} else if (sl->seg[i].area != DP_RX_AREA_REGION) {
			return NULL;
		}
		if (sl->seg[i].off > size || size - sl->seg[i].off < sl->seg[i].len)
			return NULL;
		sum += sl->seg[i].len;
	}
	return sum == len ? sl : NULL;
}

/** @return segment @p i of @p sl (i < n_segs, a list dp_ipc_rx_seglist() checked); its length in *@p len. */
static inline const void *dp_ipc_rx_seg(const struct dp_rx_mem *m, const struct dp_rx_seglist *sl, uint32_t i,
					uint32_t *len)
{
	*len = sl->seg[i].len;
	return (const char *)(sl->seg[i].area == DP_RX_AREA_PKTMEM ? m->pk_base : m->base) + sl->seg[i].off;
}

/**
 * Copy the message of @p sl into @p dst (@p cap bytes): for a consumer that
 * needs it in one buffer. That copy is the consumer's to count.
 * @return the bytes copied (msg_len), or -1 if @p cap is too small.
 */
static inline int64_t dp_ipc_rx_gather(const struct dp_rx_mem *m, const struct dp_rx_seglist *sl, void *dst,
				       size_t cap)
{
	char *o = (char *)dst;

	if (sl->msg_len > cap)
		return -1;
	for (uint32_t i = 0; i < sl->n_segs; i++) {
		uint32_t n;
		const void *p = dp_ipc_rx_seg(m, sl, i, &n);

		memcpy(o, p, n);
		o += n;
	}
	return (int64_t)sl->msg_len;
}

struct dp_stats_shm;

/**
 * After reading @p sl's segments: were they still the delivering
 * dataplane's? A dataplane started again on the region publishes its new
 * epoch in @p st before it receives into the buffers again.
 * @return 1 if what was read is the message, 0 if it may have been overwritten.
 */
static inline int dp_ipc_rx_seglist_current(const struct dp_stats_shm *st, const struct dp_rx_seglist *sl);

static inline int dp_ipc_rx_seglist_current(const struct dp_stats_shm *st, const struct dp_rx_seglist *sl)
{
	/* the segments' loads before the epoch's: pairs with the release store
	 * of a successor's epoch, made before it receives into the buffers */
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	return __atomic_load_n(&st->epoch, __ATOMIC_RELAXED) == sl->epoch;
}

/*
 * The body of a DP_MT_KVPAGE message (worker to worker: the dataplane only
 * carries it): a prefill rank's KV pages for one room, written into the
 * destination blocks the decode node's manifest named. After this header:
 * uint32_t dst_blocks[n_blocks], then n_blocks * block_bytes bytes of pages
 * in the sending stage's format (per block, for each layer of the range in
 * order, K then V, each [n_kv_heads][16 positions][head_dim] of dtype).
 * Integers little-endian; the receiver checks every field and the length
 * before it reads a page.
 */
#define DP_KVPAGE_MAGIC 0x4750564bu /* "KVPG" little-endian */
#define DP_KVPAGE_VERSION 1u
#define DP_KVPAGE_F32 1u   /* the pool stores f32 (the CPU engine) */
#define DP_KVPAGE_BF16 3u  /* bf16 (the CUDA engine) */
#define DP_KVPAGE_LAST 1u  /* flags: the rank's last message for this room */

struct dp_kvpage_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t dtype;          /**< DP_KVPAGE_F32 or DP_KVPAGE_BF16 */
	uint64_t room;
	uint32_t session;        /**< the decode node's registration the manifest came with */
	uint32_t flags;          /**< DP_KVPAGE_LAST */
	int32_t layer_start, layer_end;
	uint32_t n_kv_heads, head_dim;
	uint32_t first_index;    /**< the first block's index in the room's manifest */
	uint32_t n_blocks;       /**< blocks in this message, >= 1 */
	uint64_t block_bytes;    /**< one block, every layer of the range, K and V */
};
static_assert(sizeof(struct dp_kvpage_hdr) == 56, "dp_kvpage_hdr is a 56-byte wire record");

/** A KV page header's fields in host order (what dp_kvpage_hdr_put/get move). */
struct dp_kvpage_fields {
	uint32_t dtype, flags, session, first_index, n_blocks, n_kv_heads, head_dim;
	int32_t layer_start, layer_end;
	uint64_t room, block_bytes;
};

/** Write the header of @p f (magic and version added) at @p buf (56 bytes, any alignment). */
static inline void dp_kvpage_hdr_put(void *buf, const struct dp_kvpage_fields *f)
{
	struct dp_kvpage_hdr h;

	memset(&h, 0, sizeof(h));
	h.magic = htole32(DP_KVPAGE_MAGIC);
	h.version = htole16((uint16_t)DP_KVPAGE_VERSION);
	h.dtype = htole16((uint16_t)f->dtype);
	h.room = htole64(f->room);
	h.session = htole32(f->session);
	h.flags = htole32(f->flags);
	h.layer_start = (int32_t)htole32((uint32_t)f->layer_start);
	h.layer_end = (int32_t)htole32((uint32_t)f->layer_end);
	h.n_kv_heads = htole32(f->n_kv_heads);
	h.head_dim = htole32(f->head_dim);
	h.first_index = htole32(f->first_index);
	h.n_blocks = htole32(f->n_blocks);
	h.block_bytes = htole64(f->block_bytes);
	memcpy(buf, &h, sizeof(h));
}

/**
 * Read the header at @p buf of a @p len-byte message into @p f.
 * @return 0, -1 (shorter than the header), -2 (another magic or version).
 *         The caller checks the fields against its own layout and the length.
 */
static inline int dp_kvpage_hdr_get(const void *buf, size_t len, struct dp_kvpage_fields *f)
{
	struct dp_kvpage_hdr h;

	if (len < sizeof(h))
		return -1;
	memcpy(&h, buf, sizeof(h));
	if (le32toh(h.magic) != DP_KVPAGE_MAGIC || le16toh(h.version) != DP_KVPAGE_VERSION)
		return -2;
	f->dtype = le16toh(h.dtype);
	f->room = le64toh(h.room);
	f->session = le32toh(h.session);
	f->flags = le32toh(h.flags);
	f->layer_start = (int32_t)le32toh((uint32_t)h.layer_start);
	f->layer_end = (int32_t)le32toh((uint32_t)h.layer_end);
	f->n_kv_heads = le32toh(h.n_kv_heads);
	f->head_dim = le32toh(h.head_dim);
	f->first_index = le32toh(h.first_index);
	f->n_blocks = le32toh(h.n_blocks);
	f->block_bytes = le64toh(h.block_bytes);
	return 0;
}

#ifdef __cplusplus
}
#endif
#endif /* DP_IPC_H */
