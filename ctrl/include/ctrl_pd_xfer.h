/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file ctrl_pd_xfer.h
 * The two ends of a disaggregated request, over any transport.
 *
 * Decode side (ctrl_pd_decode): a client's request opens its room, goes to
 * the scheduler as kv_remote, and once its pages are reserved the page
 * manifest goes to each prefill rank. Each rank's status (ctrl_pd_msg.h)
 * reports into the room; each of the node's page streams (one per stage of
 * the decode chain) says when its pages are in. The request decodes when
 * the room succeeded *and* every stream landed, in whichever order they
 * come; a failed or expired room, or a lost node, ends it with the room's
 * reason. A request that ends first (cancel, client gone) tells its ranks
 * (abort) and forgets its room: nothing late brings it back.
 *
 * Prefill side (ctrl_pd_prefill): the forwarded request runs its prompt
 * (max_tokens 1, hold_kv); the manifest may come before or after. With
 * both in hand the pages are shipped (the ship callback: export, frame,
 * send) to the manifest's blocks as they become final — a chunk's whole
 * blocks while the rest of the prompt runs, the remainder at the finish —
 * then the status with the first token goes back, and the blocks are
 * given back. A manifest whose block count is not
 * the prompt's, a request that failed, or an abort ends it with a failed
 * status (abort: with an acknowledgement). An aborted room is remembered (the
 * last 1,024): its prompt, if it arrives after the abort, is refused rather
 * than prefilled for nobody; KV whose manifest never comes is given back
 * after hold_ns (ctrl_pd_prefill_tick).
 *
 * What is not here: the route lookup and registration (ctrl_pd_boot.h,
 * pd_peer.c) and the transport (dataplane rings or anything else: the
 * callbacks). The first token's logprob and top logprobs travel in the
 * status (version 2).
 *
 * Threading: without a lock in its options, each object is driven by one
 * thread, the one that polls its scheduler (token callbacks run there too).
 * With one, the scheduler's callbacks take it, and every other call must be
 * made holding it (a daemon's HTTP threads, its dataplane poller).
 */
#ifndef CTRL_PD_XFER_H
#define CTRL_PD_XFER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ctrl_pd.h"
#include "ctrl_pd_msg.h"
#include "ctrl_sched.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Send one control message to @p node. @return 0 or -errno (the room then fails). */
typedef int (*ctrl_pd_send_fn)(void *arg, uint32_t node, const uint8_t *msg, size_t len);

/* ---- decode side ---- */

/** A landed room's phases, in ctrl_pd_decode_stats.phase_ns. */
enum { CTRL_PD_PH_MANIFEST, CTRL_PD_PH_PAGE0, CTRL_PD_PH_PAGE1, CTRL_PD_PH_STATUS, CTRL_PD_PH_READY,
       CTRL_PD_PHASES };
/** The phases' names ("manifest", "first_page", "last_page", "status", "ready"). */
extern const char *const ctrl_pd_phase_names[CTRL_PD_PHASES];

struct ctrl_pd_decode_opts {
	struct ctrl_sched *sched;
	struct ctrl_rooms *rooms;
	uint32_t session;          /**< this node's registration with its prefill nodes */
	int32_t n_streams;         /**< page streams a room's pages arrive on (the decode chain's stages) */
	ctrl_pd_send_fn send;
	void *send_arg;
	pthread_mutex_t *lock;     /**< NULL: one thread drives everything */
	/** a room whose ranks all reported fails if its pages are not all in this long after (0: 30 s) */
	uint64_t landing_ns;
	/** 1: a room a prefill rank reports failed (a failed status: its chain failed the prompt
	 *  or the pages) computes its prompt on this node instead of failing its client
	 *  (ctrl_pd_decode_compute_here()); 0: the room fails (issue #13's plain rule) */
	int compute_here;
	/** 1: a room's first token goes to its client as soon as the room succeeds (every rank
	 *  reported, one with the first token), its last pages still landing
	 *  (ctrl_sched_kv_first()); 0: with ready, once every page stream landed */
	int first_early;
	/** optional: a prefill node's name for messages (its address); NULL: its number */
	const char *(*node_name)(void *arg, uint32_t node);
	void *node_arg;
	/**
	 * optional: what this node's dataplane knows of prefill node @p node's
	 * dataplane: its epoch (0: never heard) and, while it is silent, for
	 * how long (ms; 0: heard). @return 0, or < 0 (not known: nothing
	 * follows from it). A room whose prefill node's dataplane changed its
	 * epoch (it restarted) since the room opened, or has been silent for
	 * the dataplane's give-up bound, fails at once: its messages were lost
	 * with that dataplane's session. Without it such a room waited for
	 * the waiting timeout (300 s).
	 */
	int (*peer_state)(void *arg, uint32_t node, uint64_t *epoch, uint64_t *silent_ms);
	void *peer_arg;
	/**
	 * optional: a room lost with a dataplane's session (the prefill node's
	 * dataplane restarted: a new epoch; or this node's, see
	 * ctrl_pd_decode_retry_all) runs again in a fresh room, up to
	 * max_retries times, instead of failing: the caller sends the prompt
	 * again under @p new_room (its own fresh id) to the same node; this end
	 * re-opens the room and, once the request's pages are reserved, sends
	 * the manifest again. @return 0, or < 0 (not this caller's to send
	 * again, e.g. a router drove the room): the room fails.
	 */
	int (*retry)(void *arg, uint32_t node, uint64_t old_room, uint64_t *new_room);
	void *retry_arg;
	uint32_t max_retries;
	/**
	 * optional: a room's pages may land from now on (@p open 1: its
	 * manifest is about to go out), or no longer (0: the room is given up
	 * or forgotten; return only once none is landing, for its blocks may go
	 * to another request next). For stages that take their own pages
	 * (ctrl_pd_link_room_gate()). @return 0, or < 0 on open (the room
	 * fails, naming why).
	 */
	int (*gate)(void *arg, uint64_t room, uint32_t session, int open);
	void *gate_arg;
};

/** The silence after which a prefill node's dataplane is taken as gone with
 * the room's messages: the dataplane's own give-up (PEER_GONE_NS). */
#define CTRL_PD_PEER_GONE_MS 10000u

/** Counters. */
struct ctrl_pd_decode_stats {
	uint64_t rooms_opened, rooms_ok, rooms_failed, aborts_sent, manifests_sent, stale_pages;
	/* rooms failed because their prefill node's dataplane restarted or went silent (of rooms_failed) */
	uint64_t rooms_lost_dataplane;
	/* rooms lost with a dataplane's session whose request ran again in a fresh room */
	uint64_t rooms_retried;
	/* requests whose stages here went down (their KV with them): they ran again
	 * here from their prompts, their rooms given up (kv_lost) */
	uint64_t replayed_here;
	/* rooms with a page message that could not land (this node's stages were down) */
	uint64_t pages_lost;
	/* requests whose prefill node failed to prefill them, computed here instead */
	uint64_t computed_here;
	/* the pages of rooms that landed whole, each room timed from its first
	 * page message to its last (rooms of one message have no span) */
	uint64_t xfer_rooms, xfer_bytes, xfer_ns;
	/* where a landed room's time went: sums over phase_rooms rooms of the
	 * time from its submission to its manifest going out, its first and
	 * last page message, the status that made it Success, and its request
	 * told ready (CLOCK_MONOTONIC) */
	uint64_t phase_rooms;
	uint64_t phase_ns[CTRL_PD_PHASES];
	struct ctrl_pd_msg_stats msg;
};

struct ctrl_pd_decode;

/** @return the object, or NULL with errno EINVAL (no scheduler, rooms or send; n_streams < 1), ENOMEM. */
struct ctrl_pd_decode *ctrl_pd_decode_create(const struct ctrl_pd_decode_opts *o);
void ctrl_pd_decode_destroy(struct ctrl_pd_decode *d);

/**
 * Serve @p rq (its callback gets every token, the prefill node's first
 * included, then the finish) with its prompt prefilled by @p n_ranks ranks
 * of prefill node @p node, in room @p room.
 * @return the scheduler's request id, or -errno: -EEXIST (room in use),
 *         -ENOSPC (rooms table full), the scheduler's refusal.
 */
int64_t ctrl_pd_decode_submit(struct ctrl_pd_decode *d, const struct ctrl_request *rq, uint64_t room, uint32_t node,
			      uint32_t n_ranks, uint64_t now_ns);

/** A control message from a prefill node (a status or an abort acknowledgement). */
void ctrl_pd_decode_on_control(struct ctrl_pd_decode *d, const uint8_t *buf, size_t len);

/**
 * A page message of stream @p stream of room @p room (@p n_blocks blocks,
 * @p bytes long) is in place (@p last: the stream's last). A stream has
 * landed once its last message came and it brought the manifest's block
 * count. A room this node forgot, another session, or a stream out of
 * range is counted and ignored.
 */
void ctrl_pd_decode_on_pages(struct ctrl_pd_decode *d, uint64_t room, uint32_t session, int32_t stream, int last,
			     uint32_t n_blocks, uint64_t bytes);

/** Fail @p room's request with @p why (e.g. its prompt could not be sent to the prefill node). */
void ctrl_pd_decode_fail(struct ctrl_pd_decode *d, uint64_t room, const char *why);
/**
 * A page message of @p room could not land: this node's stages were down
 * (@p why). Its request is never told ready (a page is missing): the
 * scheduler replays it here as a local one (its kv_lost event), or it fails
 * a few seconds later naming @p why.
 */
void ctrl_pd_decode_pages_lost(struct ctrl_pd_decode *d, uint64_t room, const char *why);
/**
 * This node's dataplane is back after a restart, or prefill node @p node's
 * (its index in [pd] prefill; CTRL_PD_ALL_NODES: every one) is heard again after a
 * silence: send again the aborts of the rooms given up there in the last
 * 30 s (one sent meanwhile went nowhere, and the prefill node would hold
 * that room's KV until its hold timeout). A prefill node ignores an abort
 * of a room it no longer has. @return the messages sent.
 */
#define CTRL_PD_ALL_NODES UINT32_MAX
int ctrl_pd_decode_resend_aborts(struct ctrl_pd_decode *d, uint32_t node);
/**
 * @p room's prefill node could not prefill it (its chain failed: it answered
 * an error, @p why) before any of it landed: its request computes its prompt
 * on this node instead (ctrl_sched_kv_local()), with the same tokens, rather
 * than failing its client; the room is given up. @return 0, or -1 (not
 * possible: the room is gone, landed or failed; the caller fails it).
 */
int ctrl_pd_decode_compute_here(struct ctrl_pd_decode *d, uint64_t room, const char *why);

/** Fail every room whose request was not told yet (their messages were lost). @return how many. */
int ctrl_pd_decode_fail_all(struct ctrl_pd_decode *d, const char *why);

/**
 * This node's dataplane restarted: every room not landed yet runs again in
 * a fresh room (opts.retry) where it may, else fails with @p why.
 * @return the rooms failed.
 */
int ctrl_pd_decode_retry_all(struct ctrl_pd_decode *d, const char *why);

/**
 * May page messages for @p room land now? 1 while its request waits for
 * them (manifest sent, not yet told ready or failed, this session); 0 for a
 * room that ended or was forgotten, whose blocks may be another request's.
 */
int ctrl_pd_decode_expects(const struct ctrl_pd_decode *d, uint64_t room, uint32_t session);

/** Expire rooms past their timeout and settle rooms that a lost node failed (call every loop). */
void ctrl_pd_decode_tick(struct ctrl_pd_decode *d, uint64_t now_ns);

void ctrl_pd_decode_stats(const struct ctrl_pd_decode *d, struct ctrl_pd_decode_stats *st);

/**
 * Register under @p session from now on (ctrlctl pd restore): page and
 * status messages of the old session are ignored. @return 0, or -EBUSY
 * while any request holds a room.
 */
int ctrl_pd_decode_set_session(struct ctrl_pd_decode *d, uint32_t session);

/** One of the decode end's rooms, for views. */
struct ctrl_pd_room_view {
	uint64_t room, id;         /**< the room and its scheduler request */
	uint32_t node;             /**< prefill node (index) */
	enum ctrl_room_state state;
	double age_s;              /**< since the room opened (the caller's clock) */
	int32_t streams_left;      /**< page streams not landed yet */
	uint64_t bytes_landed;     /**< page message bytes imported so far */
	int told;                  /**< the scheduler was told ready or failed */
};

/** Call @p fn for every room a request still holds. */
void ctrl_pd_decode_rooms(const struct ctrl_pd_decode *d, void (*fn)(void *arg, const struct ctrl_pd_room_view *v),
			  void *arg);

/* ---- prefill side ---- */

/**
 * Ship part of a room's pages: blocks @p src[from..to) of this node's chain
 * into the decode node's blocks @p dst[from..to), every stage; with
 * @p last, each stage's last message is flagged (the room's pages are all
 * sent). A room's ranges come in order, each once. @return 0, or -errno
 * with @p err saying why.
 */
typedef int (*ctrl_pd_ship_fn)(void *arg, uint32_t node, uint64_t room, uint32_t session, const int32_t *src,
			       const uint32_t *dst, int32_t from, int32_t to, int last, char *err, size_t errlen);

struct ctrl_pd_prefill_opts {
	struct ctrl_sched *sched;
	uint32_t rank;             /**< this node's rank in its rooms */
	ctrl_pd_send_fn send;
	void *send_arg;
	ctrl_pd_ship_fn ship;
	void *ship_arg;
	pthread_mutex_t *lock;     /**< NULL: one thread drives everything */
	uint64_t hold_ns;          /**< a prompt's KV waits this long for its manifest (0: 300 s) */
	/** 1: a room whose halves are in is shipped by ctrl_pd_prefill_tick, with
	 *  the lock released while its pages move (the scheduler's thread, whose
	 *  finish callback completes a room, never waits on a transfer); the
	 *  thread that ticks must be the one that passes control messages in */
	int defer_ship;
	/** optional: the chain's KV generation (ctrl_chain_kv_generation()): a room
	 *  whose prompt's KV was computed under another one (its stages re-formed
	 *  since, their pools maybe empty) sends no more pages and a failed status
	 *  (the decode node then computes the prompt itself) */
	uint64_t (*kv_gen)(void *arg);
	void *kv_gen_arg;
};

struct ctrl_pd_prefill_stats {
	uint64_t rooms_done, rooms_failed, aborts, pages_shipped, malformed;
	/* rooms reported Success: sums of their prompt's time from submission
	 * to its finish (the prefill), and from the finish to the status going
	 * out (the last pages' export and send) */
	uint64_t timed_rooms, prefill_ns, tail_ns;
	uint64_t expired;          /**< rooms whose manifest never came: their KV given back */
	uint64_t refused_aborted;  /**< prompts for a room the decode node had already given up */
	uint64_t kv_gone;          /**< rooms failed: their KV's stages re-formed before it all went */
	uint64_t orphaned;         /**< rooms given up: the decode node that forwarded them restarted */
};

struct ctrl_pd_prefill;

struct ctrl_pd_prefill *ctrl_pd_prefill_create(const struct ctrl_pd_prefill_opts *o);
void ctrl_pd_prefill_destroy(struct ctrl_pd_prefill *p);

/**
 * Prefill @p rq's prompt for room @p room of decode node @p node (what the
 * decode node forwarded; max_tokens and hold_kv are set here). The
 * request's callback gets the first token and the finish.
 * @return the scheduler's request id, or -errno (-EEXIST: a request for the room runs).
 */
int64_t ctrl_pd_prefill_submit(struct ctrl_pd_prefill *p, const struct ctrl_request *rq, uint64_t room, uint32_t node);
/**
 * The same, the forward saying the decode node's session (kvferry_session;
 * 0: not said): once that decode node speaks with another session (it
 * restarted), the room is given up if its manifest has not come, and a
 * later forward of the old session is refused (-ECANCELED).
 */
int64_t ctrl_pd_prefill_submit_from(struct ctrl_pd_prefill *p, const struct ctrl_request *rq, uint64_t room,
				    uint32_t node, uint32_t session);

/** A control message from decode node @p node (a manifest or an abort); malformed ones are counted. */
void ctrl_pd_prefill_on_control(struct ctrl_pd_prefill *p, uint32_t node, const uint8_t *buf, size_t len);

/**
 * Ship the rooms that are ready (defer_ship) and give back the KV of rooms
 * whose manifest did not come within hold_ns (the decode node is gone or
 * gave up); call every loop.
 */
void ctrl_pd_prefill_tick(struct ctrl_pd_prefill *p, uint64_t now_ns);

void ctrl_pd_prefill_stats(const struct ctrl_pd_prefill *p, struct ctrl_pd_prefill_stats *st);

/**
 * This node's dataplane restarted: end every room whose manifest came over
 * the lost session (its pages and status went down with it) — a prompt
 * still running is cancelled, held KV goes back to the scheduler at once
 * rather than after hold_ns. No status is sent: the decode node sees the
 * new epoch itself and runs the request again in a fresh room (a failed
 * status could beat that news and fail a request that would have lived).
 * A room whose manifest has not come is kept: it may come over the new
 * session, or the old room's abort will. @p why is for logs. @return the
 * rooms ended.
 */
int ctrl_pd_prefill_fail_all(struct ctrl_pd_prefill *p, const char *why);

/** One of the prefill end's rooms, for views. */
struct ctrl_pd_prefill_view {
	uint64_t room;
	int64_t id;                /**< its scheduler request, 0 if the prompt has not come */
	uint32_t node;             /**< the decode node (dataplane id) */
	int have_manifest, prefilled;
	int32_t blocks;            /**< KV blocks held for it */
};

void ctrl_pd_prefill_rooms(const struct ctrl_pd_prefill *p,
			   void (*fn)(void *arg, const struct ctrl_pd_prefill_view *v), void *arg);

#ifdef __cplusplus
}
#endif
#endif /* CTRL_PD_XFER_H */
