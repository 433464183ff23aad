/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file ctrl_pd_link.h
 * ctrld's PD traffic on the node's dataplane (dp_ipc.h): control messages
 * (DP_MT_CONTROL on stream 0: manifests, statuses, aborts) and, when ctrld
 * runs the stages itself (the in-process chain), KV page messages
 * (DP_MT_KVPAGE on stream 1, wk_kvpage.h format) read out of and written
 * into that chain.
 *
 * Sends copy into buffers of two pools of ours in the region ("ctrld.pds",
 * "ctrld.pdl") that come back with their completions; received messages
 * are handed on and their buffers returned to the dataplane's pools in the
 * same poll. A page message is imported only after the caller's `expects`
 * says its room still waits for it, so a late message for a forgotten room
 * (whose blocks may belong to another request by now) writes nothing.
 *
 * Threading: one thread polls and sends.
 */
#ifndef CTRL_PD_LINK_H
#define CTRL_PD_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "ctrl_chain.h"

struct shm_region;

#ifdef __cplusplus
extern "C" {
#endif

struct ctrl_pd_link_opts {
	const char *region;        /**< the region kvferry-dataplane created */
	/** that region already mapped (the workers' chain's: their page copies
	 *  need buffers in its mapping), kept at close; NULL: attach region */
	struct shm_region *reg;
	uint32_t n_small;          /**< control buffers (default 256 of 64 KiB) */
	uint32_t n_large;          /**< page buffers (default 16) ... */
	size_t large_bytes;        /**< ... of this size (default 4 MiB) */
	double wait_s;             /**< for the dataplane's rings at open, and for a free page buffer (default 20) */
};

void ctrl_pd_link_opts_init(struct ctrl_pd_link_opts *o);

struct ctrl_pd_link;

/** @return the link, or NULL with errno and @p err (region or rings missing, pools that do not fit). */
struct ctrl_pd_link *ctrl_pd_link_open(const struct ctrl_pd_link_opts *o, char *err, size_t errlen);
void ctrl_pd_link_close(struct ctrl_pd_link *l);

/** Send control message @p msg to node @p node. @return 0, -EMSGSIZE, -EAGAIN (no buffer or ring room). */
int ctrl_pd_link_send_ctl(struct ctrl_pd_link *l, uint32_t node, const uint8_t *msg, size_t len);

/**
 * Ship blocks @p src[from..to) of every stage of @p chain into node
 * @p node's blocks @p dst[from..to) for @p room: per stage, as many page
 * messages as the buffers need, the last flagged when @p last. Waits
 * (draining completions) for a free buffer up to wait_s. @return 0, or
 * -errno with @p err.
 */
int ctrl_pd_link_ship(struct ctrl_pd_link *l, struct ctrl_chain *chain, int32_t n_stages, uint32_t node,
		      uint64_t room, uint32_t session, const int32_t *src, const uint32_t *dst, int32_t from,
		      int32_t to, int last, char *err, size_t errlen);

/** Sleep until a control message is in or @p timeout_ns passes (an idle poller's wait). */
void ctrl_pd_link_wait(struct ctrl_pd_link *l, int64_t timeout_ns);

/** What a poll hands on. */
struct ctrl_pd_link_handlers {
	void (*control)(void *arg, uint32_t node, const uint8_t *msg, size_t len);
	/** may a page message for (room, session) land? */
	int (*expects)(void *arg, uint64_t room, uint32_t session);
	/** @p n_blocks of stage @p stream's pages of @p room are in (@p last: its last message) */
	void (*pages)(void *arg, uint64_t room, uint32_t session, int32_t stream, int last, uint32_t n_blocks,
		      uint64_t bytes);
	/** optional: a page message for a waiting room was refused (another layout...): @p why */
	void (*refused)(void *arg, uint64_t room, uint32_t session, const char *why);
	/** optional: a page message for a waiting room could not land because this node's
	 *  stages are down (ctrl_chain_ready() false): not the room's fault, but it can no
	 *  longer land whole here; the scheduler replays its request here (kv_lost) */
	void (*lost)(void *arg, uint64_t room, uint32_t session, const char *why);
	void *arg;
	struct ctrl_chain *chain;  /**< where page messages land; NULL: they are refused */
	int32_t n_stages;
};

struct ctrl_pd_link_stats {
	uint64_t ctl_sent, ctl_received, ctl_failed;
	uint64_t kv_sent, kv_bytes_sent, kv_received, kv_bytes_received, kv_failed;
	uint64_t kv_refused;       /**< malformed, another layout, or for a room that no longer waits */
	uint64_t kv_lost_down;     /**< not landed: this node's stages were down (handlers.lost) */
	uint64_t rx_gathered_bytes; /**< received in place and copied by ctrld into one buffer (its copy) */
	/* where a page's time goes (ns): its stage copying it out (ship) or in
	 * (poll), and a ship waiting for a free page buffer or lane slot */
	uint64_t export_ns, import_ns, buf_wait_ns, lane_wait_ns;
	uint64_t kv_burst_max;     /**< most page messages one poll took off the ring */
	uint64_t kv_landed_by_stages; /**< page messages the stages took from the dataplane themselves */
	uint64_t kv_landed_in_place;  /**< ... of them read from their frames where received (rx_in_place) */
	uint64_t rooms_gate_full;  /**< rooms that found no slot in the rooms area (their pages refused) */
	uint64_t rooms_gate_stuck; /**< closes that stopped waiting on a stage still importing (dead, or 5 s) */
	uint64_t rx_stale;         /**< messages a ctrld before this one was handed and died holding: skipped */
};

/**
 * Decode, stages in worker processes: make the rooms area of the region
 * (SHM_MB_KVROOMS_AREA) so that stages may take their own pages
 * (ctrl_chain_kv_rxroute()); from then on the poll also takes what they
 * landed (ctrl_chain_kv_landed()). @return 0, -ENOTSUP (the dataplane
 * routes no stream), or -errno.
 */
int ctrl_pd_link_rooms_open(struct ctrl_pd_link *l);

/**
 * Open (@p open 1) or close a room in the rooms area: the stages land a
 * room's pages only while it is open. Close returns once no stage is
 * importing a page of it (shm_mb.h), so the room's blocks may then go to
 * another request. No rooms area: nothing to do. @return 0, or -ENOSPC (no
 * free slot: the room's pages will be refused).
 */
int ctrl_pd_link_room_gate(struct ctrl_pd_link *l, uint64_t room, uint32_t session, int open);

/** The pid stream @p stream's KV pages are routed to (dp_ipc.h receive routes), 0: none. */
int32_t ctrl_pd_link_route_pid(const struct ctrl_pd_link *l, uint32_t stream);

/** Take completions and received messages. @return 1 if anything moved, 0 if not. */
int ctrl_pd_link_poll(struct ctrl_pd_link *l, const struct ctrl_pd_link_handlers *h);

void ctrl_pd_link_stats(const struct ctrl_pd_link *l, struct ctrl_pd_link_stats *st);

/** The region the link maps (the dataplane's). */
struct shm_region *ctrl_pd_link_region(const struct ctrl_pd_link *l);

/** This node's id on the dataplane (its stats area says), or -1. */
int32_t ctrl_pd_link_self_node(const struct ctrl_pd_link *l);

/**
 * What this node's dataplane knows of peer @p node (a dataplane node id):
 * its epoch (0: never heard) and, while it is reported silent, how long it
 * has not been heard (ms; 0 while heard). @return 0, or -ENOENT (no such
 * peer, or no dataplane statistics in the region).
 */
int ctrl_pd_link_peer(const struct ctrl_pd_link *l, uint32_t node, uint64_t *epoch, uint64_t *silent_ms);

/** The last page message refused, and why ("" if none). */
const char *ctrl_pd_link_last_refusal(const struct ctrl_pd_link *l);

#ifdef __cplusplus
}
#endif
#endif /* CTRL_PD_LINK_H */
