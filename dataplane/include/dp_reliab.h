/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file dp_reliab.h
 * Per-(peer, stream) reliable, ordered, exactly-once message delivery: the
 * pure state machine, no DPDK and no I/O, so it is unit-tested over a
 * simulated lossy link. The caller (the poll loop) moves frames; this code
 * decides which frames to send, what an ACK says, and when a message is
 * complete.
 *
 * Transmit side: messages are segmented into frames of at most
 * opts.frame_payload bytes; each frame gets the next 32-bit sequence number
 * of the stream. A frame stays in the window until a cumulative ACK passes
 * it; SACKed frames are not resent; a hole with >= dupthresh SACKed frames
 * above it is resent at once (fast retransmit); the retransmission timeout
 * (RFC 6298 estimator on ACK-echoed timestamps, exponential back-off)
 * resends the oldest unacknowledged frame, whose ACK then drives fast
 * retransmit of the rest. A message completes when the cumulative ACK passes
 * its last frame; completions are reported in submission order.
 *
 * Receive side: a bitmap over [rcv_nxt, rcv_nxt + window) suppresses
 * duplicates; a frame's payload is placed straight at its offset in the
 * message's buffer (allocated on the first frame of that message seen), and
 * whole messages are delivered in msg_id order.
 *
 * Flow control: the receiver grants credit in messages (ACK msg_limit); the
 * sender never starts a message at or beyond the limit, and never has more
 * than opts.window frames or opts.max_msgs messages outstanding. All memory
 * is allocated at create time: a peer that stops ACKing cannot grow it.
 *
 * Trust: frame headers are CRC-checked before they reach this code; the
 * receiver trusts that one sequence number maps to one fragment.
 *
 * Threading: one handle is used by one thread at a time.
 */
#ifndef DP_RELIAB_H
#define DP_RELIAB_H

#include <stdint.h>

#include "dp_wire.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Tunables, shared by both directions. */
struct dp_rel_opts {
	uint32_t window;        /**< frames in flight per stream: power of two, 512..65536 */
	uint32_t max_msgs;      /**< messages outstanding per stream: power of two, 1..65536 */
	uint32_t frame_payload; /**< payload bytes per frame, 1..DP_FRAME_MAX - DP_FRAME_HLEN */
	uint32_t init_credit;   /**< messages the sender may start before the first ACK */
	uint32_t dupthresh;     /**< SACKed frames above a hole that make it lost */
	uint32_t max_timeouts;  /**< consecutive timeouts without progress, each followed by an
	                             ACK echoing a frame sent after it (the peer answers), before
	                             giving up */
	uint64_t rto_init_ns;   /**< RTO before the first RTT sample */
	uint64_t rto_min_ns;    /**< RTO floor */
	uint64_t rto_max_ns;    /**< RTO ceiling (back-off stops here) */
};

/**
 * Defaults: window 4096, max_msgs 64, frame_payload 8912 (a 9000-byte
 * frame), init_credit 8, dupthresh 3, max_timeouts 16, RTO 5 ms initial,
 * 200 µs floor, 200 ms ceiling.
 */
void dp_rel_opts_init(struct dp_rel_opts *o);

/** @return 0 if @p o is usable, else -EINVAL. */
int dp_rel_opts_check(const struct dp_rel_opts *o);

/** A frame the transmit side wants sent. */
struct dp_rel_frame {
	uint64_t msg_id;
	uint64_t payload_off; /**< where this fragment's bytes are (caller's address space) */
	uint32_t seq;
	uint32_t msg_len;
	uint32_t frag_off;
	uint32_t frag_idx;
	uint32_t frag_count;
	uint16_t payload_len;
	uint8_t type;
	uint8_t retx;         /**< 1: this frame was sent before */
	uint8_t have_csum;    /**< 1: csum holds the payload's CRC32C (dp_rel_tx_note_csum()) */
	uint32_t csum;
};

/** A message completed or failed (transmit side) or delivered (receive side). */
struct dp_rel_msg {
	uint64_t msg_id;
	uint64_t off;     /**< buffer offset (sender's payload, or receiver's reassembly buffer) */
	uint64_t cookie;  /**< transmit side: the submitter's cookie */
	uint32_t len;
	uint8_t type;
	int status;       /**< 0, or -errno (transmit side failures) */
};

/** Called once per finished message. */
typedef void (*dp_rel_msg_fn)(void *ctx, const struct dp_rel_msg *m);

/** Transmit-side counters. */
struct dp_rel_tx_stats {
	uint64_t frames;      /**< frames handed out, first sends and resends */
	uint64_t retransmits; /**< resends (fast + timeout) */
	uint64_t timeouts;    /**< RTO expiries */
	uint64_t srtt_ns;     /**< smoothed RTT (0 until the first sample) */
	uint64_t rto_ns;      /**< current RTO */
	uint64_t credit;      /**< messages the receiver still accepts beyond those submitted */
};

struct dp_rel_tx;

/**
 * Create a transmit state machine.
 * @return the handle, or NULL with errno EINVAL (bad opts) or ENOMEM.
 */
struct dp_rel_tx *dp_rel_tx_create(const struct dp_rel_opts *o);

/** Destroy; NULL is a no-op. Outstanding messages are dropped silently: call dp_rel_tx_fail_all() first. */
void dp_rel_tx_destroy(struct dp_rel_tx *tx);

/**
 * Queue a message of @p len bytes at @p off.
 * @param cookie returned with the completion
 * @return 0, -ENOSPC (max_msgs outstanding: retry after completions), -EINVAL (len too large
 *         for the fragment count to fit 32 bits).
 */
int dp_rel_tx_submit(struct dp_rel_tx *tx, uint64_t off, uint32_t len, uint8_t type,
		     uint64_t cookie);

/**
 * The payload CRC32C of each frame of the message the last dp_rel_tx_submit()
 * queued, as its producer computed them (dp_ipc.h, DP_TX_CRCS): frame i's
 * at @p csums[i], frames cut at frame_payload. Its frames then come out of
 * dp_rel_tx_burst() with have_csum, and the array is read as they do, so it
 * must stay as it is until the message completes.
 */
void dp_rel_tx_give_csums(struct dp_rel_tx *tx, const uint32_t *csums);

/** @return the msg_id the next dp_rel_tx_submit() will give its message
 *  (ids count up by one per message from 0). */
uint64_t dp_rel_tx_next_id(const struct dp_rel_tx *tx);

/**
 * Hand out up to @p max frames to send now: queued resends first, then new
 * frames while the window and the peer's credit allow. Each frame is stamped
 * as sent at @p now.
 * @return the number of frames written to @p f.
 */
unsigned dp_rel_tx_burst(struct dp_rel_tx *tx, uint64_t now, struct dp_rel_frame *f, unsigned max);

/**
 * Give back frames from the last dp_rel_tx_burst() that could not be
 * transmitted (TX queue full): they go first, in order, next time, and do
 * not count as retransmissions.
 */
void dp_rel_tx_unsent(struct dp_rel_tx *tx, const struct dp_rel_frame *f, unsigned n);

/**
 * Remember the CRC32C of frame @p seq's payload, so that a frame handed out
 * again (the TX queue refused it, or it is resent) comes back with it
 * (have_csum) and its payload is not read again. A frame's payload never
 * changes while it is in the window. @p seq must be one burst() handed out
 * and not yet acknowledged; otherwise nothing happens.
 */
void dp_rel_tx_note_csum(struct dp_rel_tx *tx, uint32_t seq, uint32_t csum);

/**
 * Apply an ACK: slide the window, record SACKs, take the credit, sample the
 * RTT, queue fast retransmits, and report every message now complete.
 * @return the number of messages completed, or -EINVAL (ACK beyond what was sent: ignored).
 */
int dp_rel_tx_on_ack(struct dp_rel_tx *tx, const struct dp_wire_ack *ack, uint64_t now,
		     dp_rel_msg_fn done, void *ctx);

/**
 * Run the retransmission timer.
 * @return 0, or -ETIMEDOUT when max_timeouts consecutive expiries passed
 *         without progress while the peer kept answering with ACKs that
 *         moved nothing (each echoing a frame sent since the expiry before:
 *         the two ends disagree, the caller should end the session).
 *         Expiries with no such ACK in between (a silent peer)
 *         resend at the backed-off RTO and never give up: telling a silent
 *         peer is the caller's liveness watch.
 */
int dp_rel_tx_timer(struct dp_rel_tx *tx, uint64_t now);

/**
 * Report every outstanding message as failed with @p status (in order) and
 * reset to a fresh session (seq 0, msg_id 1, credit init_credit).
 * @return the number of messages failed.
 */
unsigned dp_rel_tx_fail_all(struct dp_rel_tx *tx, int status, dp_rel_msg_fn done, void *ctx);

/** @return 1 if nothing is outstanding (queued or unacknowledged). */
int dp_rel_tx_idle(const struct dp_rel_tx *tx);

/** @return messages outstanding (queued or unacknowledged). */
uint32_t dp_rel_tx_outstanding(const struct dp_rel_tx *tx);

/** Copy out the counters. */
void dp_rel_tx_get_stats(const struct dp_rel_tx *tx, struct dp_rel_tx_stats *s);

/** Where a stream that gave up stood (for its log line). */
struct dp_rel_tx_stall {
	uint64_t msg_id;     /**< the message holding the oldest unacknowledged frame (0: none) */
	uint32_t frag_idx;   /**< that frame's fragment in it */
	uint32_t frag_count; /**< the message's fragments */
	uint32_t unacked;    /**< frames sent and not yet acknowledged, SACKed ones included */
	uint32_t stalls;     /**< timeouts in a row after which the peer answered, no progress */
	uint64_t credit;     /**< as in dp_rel_tx_stats */
};

/** Describe where @p tx stands: call before dp_rel_tx_fail_all() resets it. */
void dp_rel_tx_stall_info(const struct dp_rel_tx *tx, struct dp_rel_tx_stall *st);

/** Receive-side buffer management, supplied by the caller. */
struct dp_rel_rx_ops {
	/** Reserve a buffer for a @p len-byte message. @return 0 with *off set, or -ENOBUFS. */
	int (*alloc)(void *ctx, uint32_t len, uint8_t type, uint64_t *off);
	/** Give back a buffer of a message that will not be delivered (session reset). */
	void (*release)(void *ctx, uint64_t off, uint32_t len);
	/** A whole message, in order; the buffer now belongs to the consumer. */
	dp_rel_msg_fn deliver;
};

struct dp_rel_rx;

/**
 * Create a receive state machine.
 * @return the handle, or NULL with errno EINVAL (bad opts or ops) or ENOMEM.
 */
struct dp_rel_rx *dp_rel_rx_create(const struct dp_rel_opts *o, const struct dp_rel_rx_ops *ops,
				   void *ctx);

/** Destroy, releasing partly assembled buffers; NULL is a no-op. */
void dp_rel_rx_destroy(struct dp_rel_rx *rx);

/**
 * Decide what to do with a data frame.
 * @param dst_off receives where its payload must be copied (message buffer + frag_off)
 * @return 0 (copy the payload, check it, then call dp_rel_rx_commit()), or a
 *         positive enum dp_drop_reason: DP_DROP_DUP (already have it: the
 *         caller still owes an ACK), DP_DROP_WINDOW (beyond window or credit),
 *         DP_DROP_NOBUF (no buffer: the sender will retry), DP_DROP_BAD_FIELD
 *         (disagrees with earlier fragments of the message).
 */
int dp_rel_rx_place(struct dp_rel_rx *rx, const struct dp_wire_hdr *h, uint64_t *dst_off);

/**
 * Record a frame whose payload was placed intact; deliver every message that
 * is now complete and next in order.
 * @return the number of messages delivered.
 */
int dp_rel_rx_commit(struct dp_rel_rx *rx, const struct dp_wire_hdr *h);

/** Note that a frame arrived (new or duplicate) so an ACK is owed; @p tsval
 *  is echoed (0: nothing to echo, as for a duplicate, whose send time is a
 *  resend's and would make the sender sample too small an RTT). */
void dp_rel_rx_note(struct dp_rel_rx *rx, uint64_t tsval);

/** @return 1 if an ACK is owed. */
int dp_rel_rx_ack_pending(const struct dp_rel_rx *rx);

/**
 * Fill an ACK and clear the owed flag.
 * @param credit messages the receiver can take beyond those delivered (clamped to max_msgs)
 */
void dp_rel_rx_make_ack(struct dp_rel_rx *rx, uint32_t credit, struct dp_wire_ack *ack);

/** Drop partial messages (released through ops) and restart at seq 0, msg_id 1. */
void dp_rel_rx_reset(struct dp_rel_rx *rx);

/** @return the next msg_id to be delivered. */
uint64_t dp_rel_rx_next_msg(const struct dp_rel_rx *rx);

#ifdef __cplusplus
}
#endif
#endif /* DP_RELIAB_H */
