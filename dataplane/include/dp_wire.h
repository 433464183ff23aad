/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file dp_wire.h
 * The kvferry frame: Ethernet II + IPv4 (no options) + UDP + a fixed 80-byte
 * kvferry header + payload. Ordinary switches, RSS (on the UDP 4-tuple) and
 * IP routing handle it like any other UDP datagram. dataplane/WIRE.md is the
 * prose version of this header; the static_asserts below pin every offset.
 *
 * Byte order: Ethernet/IP/UDP fields are big-endian as usual; the kvferry
 * header and ACK body are little-endian (every host we build for is), which
 * the static_assert on __BYTE_ORDER__ enforces at compile time.
 *
 * Integrity: hdr_csum is CRC32C over header bytes [0, 76) and is always
 * checked; payload_csum is CRC32C of the payload, checked when the sender
 * set DP_WF_PCSUM (the UDP checksum is left 0, as IPv4 allows, because the
 * memif/af_packet vdevs offload nothing and CRC32C runs at ~3x the speed of a
 * software ones-complement sum on the machines we measured).
 *
 * Threading: every function here is pure and reentrant.
 */
#ifndef DP_WIRE_H
#define DP_WIRE_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "dp_ipc.h" /* enum dp_drop_reason: the stats area counts drops by reason */

#ifdef __cplusplus
extern "C" {
#endif

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
	      "the kvferry header is little-endian on the wire; add byte swaps for this host");

#define DP_WIRE_MAGIC 0x5246564bu /**< "KVFR" as bytes on the wire */
#define DP_WIRE_VERSION 1u
#define DP_WIRE_UDP_PORT 47474u   /**< default UDP port */

#define DP_ETH_HLEN 14u
#define DP_IP4_HLEN 20u
#define DP_UDP_HLEN 8u
#define DP_KVF_HLEN 80u
/** Offset of the kvferry header in a frame (Ethernet + IPv4 + UDP). */
#define DP_KVF_OFF (DP_ETH_HLEN + DP_IP4_HLEN + DP_UDP_HLEN)
/** Bytes before the payload. */
#define DP_FRAME_HLEN (DP_KVF_OFF + DP_KVF_HLEN)
/** memif and mbuf packet lengths are 16-bit: a frame is at most this long. */
#define DP_FRAME_MAX 65535u
/** Largest message: 4 GiB - 1 (msg_len is 32-bit). */
#define DP_MSG_MAX UINT32_MAX


/** Header flags. */
#define DP_WF_PCSUM 0x0001u /**< payload_csum is valid */
#define DP_WF_RETX 0x0002u  /**< a retransmission (informational) */
#define DP_WF_REPLY 0x0004u /**< hello: a reply, do not answer it */

/** The kvferry header, at DP_KVF_OFF in every frame. */
struct dp_wire_hdr {
	uint32_t magic;        /**< DP_WIRE_MAGIC */
	uint8_t version;       /**< DP_WIRE_VERSION */
	uint8_t type;          /**< enum dp_msg_type */
	uint16_t flags;        /**< DP_WF_* */
	uint16_t src_node;     /**< sender's node id */
	uint16_t dst_node;     /**< receiver's node id */
	uint16_t stream;       /**< stream id within the (src, dst) pair */
	uint16_t payload_len;  /**< payload bytes in this frame */
	uint64_t src_epoch;    /**< sender's session epoch (changes when it restarts) */
	uint64_t dst_epoch;    /**< the receiver's epoch as the sender knows it; 0 in a first hello */
	uint64_t msg_id;       /**< message id within (peer, stream), from 1 per session */
	uint32_t seq;          /**< frame sequence within (peer, stream), from 0 per session */
	uint32_t msg_len;      /**< whole message length in bytes */
	uint32_t frag_off;     /**< byte offset of this payload in the message */
	uint32_t frag_idx;     /**< fragment index, < frag_count */
	uint32_t frag_count;   /**< fragments in the message (>= 1) */
	uint32_t reserved;     /**< 0 */
	uint64_t tsval;        /**< sender timestamp (ns), echoed by the ACK for RTT */
	uint32_t payload_csum; /**< CRC32C of the payload when DP_WF_PCSUM */
	uint32_t hdr_csum;     /**< CRC32C of bytes [0, 76) of this header */
};
static_assert(sizeof(struct dp_wire_hdr) == DP_KVF_HLEN, "kvferry header is 80 bytes");
static_assert(offsetof(struct dp_wire_hdr, magic) == 0, "magic at 0");
static_assert(offsetof(struct dp_wire_hdr, version) == 4, "version at 4");
static_assert(offsetof(struct dp_wire_hdr, type) == 5, "type at 5");
static_assert(offsetof(struct dp_wire_hdr, flags) == 6, "flags at 6");
static_assert(offsetof(struct dp_wire_hdr, src_node) == 8, "src_node at 8");
static_assert(offsetof(struct dp_wire_hdr, dst_node) == 10, "dst_node at 10");
static_assert(offsetof(struct dp_wire_hdr, stream) == 12, "stream at 12");
static_assert(offsetof(struct dp_wire_hdr, payload_len) == 14, "payload_len at 14");
static_assert(offsetof(struct dp_wire_hdr, src_epoch) == 16, "src_epoch at 16");
static_assert(offsetof(struct dp_wire_hdr, dst_epoch) == 24, "dst_epoch at 24");
static_assert(offsetof(struct dp_wire_hdr, msg_id) == 32, "msg_id at 32");
static_assert(offsetof(struct dp_wire_hdr, seq) == 40, "seq at 40");
static_assert(offsetof(struct dp_wire_hdr, msg_len) == 44, "msg_len at 44");
static_assert(offsetof(struct dp_wire_hdr, frag_off) == 48, "frag_off at 48");
static_assert(offsetof(struct dp_wire_hdr, frag_idx) == 52, "frag_idx at 52");
static_assert(offsetof(struct dp_wire_hdr, frag_count) == 56, "frag_count at 56");
static_assert(offsetof(struct dp_wire_hdr, reserved) == 60, "reserved at 60");
static_assert(offsetof(struct dp_wire_hdr, tsval) == 64, "tsval at 64");
static_assert(offsetof(struct dp_wire_hdr, payload_csum) == 72, "payload_csum at 72");
static_assert(offsetof(struct dp_wire_hdr, hdr_csum) == 76, "hdr_csum at 76");

/** SACK bitmap words in an ACK: bit i of word w acknowledges frame cum_seq + 1 + 64w + i. */
#define DP_SACK_WORDS 4u
#define DP_SACK_BITS (64u * DP_SACK_WORDS)

/** Body of a DP_MT_ACK frame (the header's stream names the acknowledged stream). */
struct dp_wire_ack {
	uint32_t cum_seq;   /**< every frame with seq < cum_seq arrived */
	uint32_t reserved;  /**< 0 */
	uint64_t msg_limit; /**< credit: the sender may start messages with msg_id < msg_limit */
	uint64_t ts_echo;   /**< tsval of the newest frame accepted (sender's clock) */
	uint64_t sack[DP_SACK_WORDS];
};
static_assert(sizeof(struct dp_wire_ack) == 56, "ACK body is 56 bytes");
static_assert(offsetof(struct dp_wire_ack, cum_seq) == 0, "cum_seq at 0");
static_assert(offsetof(struct dp_wire_ack, msg_limit) == 8, "msg_limit at 8");
static_assert(offsetof(struct dp_wire_ack, ts_echo) == 16, "ts_echo at 16");
static_assert(offsetof(struct dp_wire_ack, sack) == 24, "sack at 24");

/**
 * The UDP source port of a frame (WIRE.md): a hello's is the node's @p port,
 * every other frame's carries its stream, 0xC000 | (stream & 0x3FFF), so
 * RSS spreads a node pair's streams over a NIC's queues and keeps each
 * stream on one (dataplane/SCALING.md). Receivers match the destination port only.
 */
static inline uint16_t dp_wire_sport(uint16_t port, const struct dp_wire_hdr *h)
{
	return h->type == DP_MT_HELLO ? port : (uint16_t)(0xC000u | (h->stream & 0x3FFFu));
}

/** Addressing of one end of a frame. */
struct dp_wire_addr {
	uint8_t mac[6];
	uint32_t ip;    /**< IPv4 address, host byte order */
	uint16_t port;  /**< UDP port, host byte order */
};


/** @return a short name for @p r ("hdr_csum", ...); "?" if out of range. */
const char *dp_drop_reason_name(unsigned r);

/**
 * CRC32C (Castagnoli), continuing from @p crc (start with 0).
 * @return the updated CRC. Pure; uses the SSE4.2 instruction where built for it.
 */
uint32_t dp_crc32c(uint32_t crc, const void *buf, size_t len);

/** A parsed frame: pointers into the caller's buffer plus a copy of the header. */
struct dp_wire_view {
	struct dp_wire_hdr h;     /**< the kvferry header (copied: the frame may be unaligned) */
	struct dp_wire_addr src;  /**< sender MAC, IP, UDP source port (dp_wire_sport()) */
	struct dp_wire_addr dst;  /**< our MAC, IP, UDP destination port */
	uint32_t payload_off;     /**< payload offset in the frame (DP_FRAME_HLEN) */
};

/**
 * Validate the headers of a frame and copy the kvferry header out.
 * Checks: lengths (Ethernet padding allowed), IPv4 without options or
 * fragmentation, UDP, @p port (0: any), magic/version, header CRC, a known
 * type, payload_len equal to what UDP carries, fragment fields consistent
 * (frag_idx < frag_count, frag_off + payload_len <= msg_len); for ACK and
 * hello, a contiguous body with a valid payload CRC (an ACK body at least
 * sizeof(struct dp_wire_ack)). A data payload's CRC is not checked here (it
 * may be scattered over segments; see dp_crc32c()).
 * @param frame  the frame bytes (at least @p hdr_len of them contiguous)
 * @param len    the whole frame length, including bytes not in @p frame
 * @param hdr_len contiguous bytes readable at @p frame (>= DP_FRAME_HLEN for a valid frame)
 * @param port   our UDP port, or 0 to accept any
 * @param out    receives the view on success
 * @return 0, or a positive enum dp_drop_reason.
 */
int dp_wire_parse(const void *frame, size_t len, size_t hdr_len, uint16_t port,
		  struct dp_wire_view *out);

/**
 * Write Ethernet + IPv4 + UDP + kvferry headers for a frame carrying
 * @p h->payload_len payload bytes; its UDP source port is
 * dp_wire_sport(@p src->port, @p h). Fills magic, version, hdr_csum (leaves
 * payload_csum as given: compute it first if DP_WF_PCSUM is set).
 * @param buf  at least DP_FRAME_HLEN bytes
 * @return DP_FRAME_HLEN, or -EINVAL (payload_len makes the frame exceed DP_FRAME_MAX).
 */
int dp_wire_build(void *buf, const struct dp_wire_addr *src, const struct dp_wire_addr *dst,
		  struct dp_wire_hdr *h);

/**
 * Put @p payload_csum into the kvferry header of frame @p buf (built by
 * dp_wire_build() with DP_WF_PCSUM, its payload CRC left for later: a worker
 * lcore computes it just before its driver copies the payload) and refresh
 * hdr_csum, which covers it.
 * @param buf  the frame's first DP_FRAME_HLEN bytes
 */
void dp_wire_set_payload_csum(void *buf, uint32_t payload_csum);

/**
 * Build a control frame (ACK, hello) whose body is copied in after the
 * headers and covered by the payload CRC, which the parser insists on for
 * these types.
 * @param buf  at least DP_FRAME_HLEN + @p body_len bytes
 * @return the frame length, or -EINVAL (too long).
 */
int dp_wire_build_ctl(void *buf, const struct dp_wire_addr *src, const struct dp_wire_addr *dst,
		      struct dp_wire_hdr *h, const void *body, uint16_t body_len);

/**
 * Read the ACK body of a parsed ACK frame.
 * @return 0, or DP_DROP_BAD_FIELD if the payload is too short.
 */
int dp_wire_ack_read(const void *frame, const struct dp_wire_view *v, struct dp_wire_ack *ack);

#ifdef __cplusplus
}
#endif
#endif /* DP_WIRE_H */
