/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file ctrl_pd.h
 * PD rooms: the decode side's record of one request handed from prefill
 * nodes to this decode node (DESIGN.md "PD rooms"). A room moves
 *
 *   Bootstrapping -> Bootstrapped -> WaitingForInput -> Success | Failed
 *
 * and the table keeps these promises (tests pin each one):
 *  - a room succeeds only when every expected prefill rank has reported
 *    (its KV pages written) and one of the reports carried a valid first
 *    token; every rank reporting without one fails it;
 *  - only ctrl_room_open() creates a room: a message for a room that was
 *    forgotten (or never opened) is refused, never brings it back;
 *  - losing a prefill node fails exactly its unfinished rooms;
 *  - a room still unfinished past the timeout fails with a message that
 *    names the setting to raise.
 * Reports may arrive before the room is waiting (a fast prefill node); they
 * are kept, and the room succeeds as it starts waiting.
 *
 * Threading: a table is driven by one thread (the daemon's control loop).
 */
#ifndef CTRL_PD_H
#define CTRL_PD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Most prefill ranks (TP ranks) one room waits for. */
#define CTRL_ROOM_MAX_RANKS 64

enum ctrl_room_state {
	CTRL_ROOM_BOOTSTRAPPING = 0, /**< opened; looking up the prefill node */
	CTRL_ROOM_BOOTSTRAPPED = 1,  /**< prefill node known, pages reserved */
	CTRL_ROOM_WAITING = 2,       /**< waiting for the prefill ranks' reports */
	CTRL_ROOM_SUCCESS = 3,       /**< terminal: pages in place, first token known */
	CTRL_ROOM_FAILED = 4,        /**< terminal: see ctrl_room_get()'s reason */
};

struct ctrl_rooms;

struct ctrl_rooms_opts {
	uint32_t capacity;        /**< most rooms at once (default 4096) */
	uint64_t timeout_ns;      /**< open -> finished limit (default 30 s) */
	const char *timeout_knob; /**< the setting an expired room's message names */
	int32_t vocab_size;       /**< first tokens must be 0..vocab_size-1 */
};

/** Defaults: 4,096 rooms, 30 s, knob "pd_room_timeout", vocab_size 0 (set it). */
void ctrl_rooms_opts_init(struct ctrl_rooms_opts *o);

/**
 * @return a table, or NULL with errno EINVAL (capacity 0, vocab_size < 1,
 *         timeout 0) or ENOMEM.
 */
struct ctrl_rooms *ctrl_rooms_create(const struct ctrl_rooms_opts *o);

/** Free the table (NULL is a no-op). */
void ctrl_rooms_destroy(struct ctrl_rooms *r);

/**
 * Open room @p id (Bootstrapping) for a request whose prefill runs on
 * @p node with @p n_ranks ranks.
 * @return 0, -EEXIST (id in use), -ENOSPC (capacity rooms open; forget
 *         finished ones), -EINVAL (n_ranks outside 1..CTRL_ROOM_MAX_RANKS).
 */
int ctrl_room_open(struct ctrl_rooms *r, uint64_t id, uint32_t node, uint32_t n_ranks, uint64_t now_ns);

/** Bootstrapping -> Bootstrapped. @return 0, -ENOENT (no such room), -EINVAL (other state). */
int ctrl_room_bootstrapped(struct ctrl_rooms *r, uint64_t id);

/**
 * Bootstrapped -> WaitingForInput; straight on to Success or Failed when the
 * reports are already all in.
 * @return 0, -ENOENT, -EINVAL (other state).
 */
int ctrl_room_waiting(struct ctrl_rooms *r, uint64_t id);

/**
 * ctrl_room_waiting(), and the timeout now counts from @p now_ns (the
 * manifest went out) instead of the open: a request that queued for
 * admission is not charged for it.
 */
int ctrl_room_waiting_since(struct ctrl_rooms *r, uint64_t id, uint64_t now_ns);

/**
 * Prefill rank @p rank has written its pages; @p first_token is the first
 * token when this rank carries it, else -1. A rank's second report is
 * ignored; so is any report to a finished room.
 * @return 0, -ENOENT (never opened, or forgotten), -EINVAL (rank outside
 *         0..n_ranks-1).
 */
int ctrl_room_report(struct ctrl_rooms *r, uint64_t id, uint32_t rank, int32_t first_token);

/** Fail an unfinished room with @p why (copied). @return 0, -ENOENT, -EALREADY (finished). */
int ctrl_room_fail(struct ctrl_rooms *r, uint64_t id, const char *why);

/** Fail every unfinished room whose prefill runs on @p node. @return how many. */
int ctrl_rooms_node_lost(struct ctrl_rooms *r, uint32_t node);

/** Fail every unfinished room opened more than the timeout before @p now_ns. @return how many. */
int ctrl_rooms_expire(struct ctrl_rooms *r, uint64_t now_ns);

/**
 * Read room @p id. Any out pointer may be NULL.
 * @param first_token  Success: the first token; else -1
 * @param why          Failed: the reason (valid until the room is forgotten); else ""
 * @return 0, -ENOENT.
 */
int ctrl_room_get(const struct ctrl_rooms *r, uint64_t id, enum ctrl_room_state *state,
		  int32_t *first_token, const char **why);

/** Drop room @p id; later messages for it get -ENOENT. @return 0, -ENOENT. */
int ctrl_room_forget(struct ctrl_rooms *r, uint64_t id);

/** "Bootstrapping", "Bootstrapped", "WaitingForInput", "Success", "Failed". */
const char *ctrl_room_state_name(enum ctrl_room_state s);

/** @return the rooms held (open or finished, not forgotten). */
uint32_t ctrl_rooms_count(const struct ctrl_rooms *r);

/* ---- prefill peers: the decode side's list of prefill nodes ---- */

/*
 * The prefill nodes a decode node may use ([pd] prefill), each a node index
 * for the rooms table. The heartbeat reads each node's /health every
 * interval (clamped to >= 2 s); after max_failures misses in a row (clamped
 * to >= 1) the node is lost: exactly its unfinished rooms fail, and it is
 * not picked until a probe answers again (its route is then read afresh).
 * Addresses are compared whole: 10.0.0.1:80 and 10.0.0.1:8080 are two nodes.
 */

/** Most prefill nodes one decode node uses. */
#define CTRL_PD_MAX_PEERS 64

/** A health probe: 0 when @p addr answered, else < 0 with @p err filled. */
typedef int (*ctrl_pd_probe_fn)(void *arg, const char *addr, double timeout_s, char *err, size_t errlen);

struct ctrl_pd_peers_opts {
	double interval_s;     /**< between two probes of a node (default 5; < 2 means 2) */
	int32_t max_failures;  /**< misses in a row that lose a node (default 2; < 1 means 1) */
	double timeout_s;      /**< of one probe (default 5) */
	ctrl_pd_probe_fn probe;
	void *probe_arg;
};

/** Defaults; probe stays NULL (set it: ctrl_pd_health in the daemon). */
void ctrl_pd_peers_opts_init(struct ctrl_pd_peers_opts *o);

struct ctrl_pd_peers;

/**
 * @p list: "host:port, host:port, ..." ([v6]:port allowed).
 * @return the table (every node healthy until a probe says otherwise), or
 *         NULL with @p err naming the entry (no port, a port outside
 *         1..65535, a duplicate, more than CTRL_PD_MAX_PEERS, no probe).
 */
struct ctrl_pd_peers *ctrl_pd_peers_create(const char *list, const struct ctrl_pd_peers_opts *o, char *err,
					   size_t errlen);

void ctrl_pd_peers_destroy(struct ctrl_pd_peers *p);

int32_t ctrl_pd_peers_count(const struct ctrl_pd_peers *p);

/** The address of node @p node, or NULL. */
const char *ctrl_pd_peer_addr(const struct ctrl_pd_peers *p, int32_t node);

/**
 * The node a router's bootstrap_host (and bootstrap_port, when > 0) names:
 * the entry whose host is written the same way, else the first whose host
 * resolves to an address @p host resolves to ("localhost" names
 * 127.0.0.1:8998). May resolve names (getaddrinfo): call it with no lock
 * held. Reads only what never changes after create. @return the node, or -1.
 */
int32_t ctrl_pd_peers_find_host(const struct ctrl_pd_peers *p, const char *host, int32_t port);

/** Node state for views: healthy (1/0), misses in a row, rooms in flight. @return 0 or -ENOENT. */
int ctrl_pd_peer_state(const struct ctrl_pd_peers *p, int32_t node, int *healthy, int32_t *failures,
		       int32_t *rooms);

/**
 * Probe every node whose interval has passed at @p now_s; a node that
 * reaches max_failures is lost and its unfinished rooms in @p rooms (may be
 * NULL) fail. @return how many nodes were lost by this call.
 */
int ctrl_pd_peers_tick(struct ctrl_pd_peers *p, double now_s, struct ctrl_rooms *rooms);

/**
 * Node @p node could not be reached (a prompt's connection was refused or
 * reset: its process is gone): lost now, as if it had missed max_failures
 * heartbeats, and its unfinished rooms in @p rooms (may be NULL) fail; the
 * heartbeats bring it back once it answers. @p why is kept as its last
 * error. @return 1 if it was healthy until now, 0, or -ENOENT.
 */
int ctrl_pd_peers_unreachable(struct ctrl_pd_peers *p, int32_t node, const char *why, struct ctrl_rooms *rooms);

/** The healthy node with the fewest rooms in flight (lowest index on ties),
 *  its dataplane not gone, or -1. */
int32_t ctrl_pd_peers_pick(const struct ctrl_pd_peers *p);

/**
 * @p node's kvferry-dataplane has been silent past the rooms' give-up bound
 * (@p gone 1: every room there fails, so it gets no new one: a request
 * forwarded there would make it prefill, hold KV for a manifest that
 * cannot come, and fail) or is heard again (0). Its heartbeats may still
 * answer (its HTTP server is up). @return the previous value, or -ENOENT.
 */
int ctrl_pd_peers_dataplane_gone(struct ctrl_pd_peers *p, int32_t node, int gone);

/** A room on @p node opened (+1) or ended (-1). @return 0 or -ENOENT. */
int ctrl_pd_peer_rooms(struct ctrl_pd_peers *p, int32_t node, int delta);

#ifdef __cplusplus
}
#endif
#endif /* CTRL_PD_H */
