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

/** @return the rooms held (open or finished, not forgotten). */
uint32_t ctrl_rooms_count(const struct ctrl_rooms *r);

#ifdef __cplusplus
}
#endif
#endif /* CTRL_PD_H */
