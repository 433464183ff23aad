/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file shm_live.h
 * Liveness words: each attached process owns one slot (pid, process start
 * time, epoch, heartbeat counter, role) in a region's liveness table, so any
 * other process can tell dead (pid gone or reused) from slow (alive, but the
 * heartbeat has not moved for longer than a deadline).
 *
 * Threading: a slot is written by its owner only; anyone may read.
 */
#ifndef SHM_LIVE_H
#define SHM_LIVE_H

#include <stdint.h>

#include "shm_region.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SHM_LIVE_SLOTS 64
#define SHM_ROLE_MAX 24

enum shm_live_state {
	SHM_LIVE_EMPTY = 0, /**< slot never used or released cleanly */
	SHM_LIVE_ALIVE = 1, /**< pid exists and heartbeat moved within the deadline */
	SHM_LIVE_SLOW = 2,  /**< pid exists, heartbeat stale */
	SHM_LIVE_DEAD = 3,  /**< pid gone, reused by another process, or a zombie */
};

/**
 * Claim a liveness slot in @p r for this process (the table is created on
 * first use).
 * @param role  short role name ("worker0", "dataplane")
 * @return the slot index (>= 0), or -ENOSPC (table full), -EINVAL.
 */
int shm_live_register(struct shm_region *r, const char *role);

/** Bump this process's heartbeat (cheap: one relaxed store + a clock read). */
void shm_live_beat(struct shm_region *r, int slot);

/** Release a slot on clean exit. */
void shm_live_release(struct shm_region *r, int slot);

/** What another process sees of a slot. */
struct shm_live_info {
	int32_t pid;
	uint64_t epoch;
	uint64_t beats;
	uint64_t last_beat_ns;  /**< CLOCK_MONOTONIC of the last beat */
	char role[SHM_ROLE_MAX];
};

/**
 * Classify slot @p slot.
 * @param stale_ns  heartbeat age above which a live pid counts as SLOW
 * @param info      optional: receives the slot's contents
 * @return enum shm_live_state, or -EINVAL.
 */
int shm_live_check(struct shm_region *r, int slot, uint64_t stale_ns, struct shm_live_info *info);

/** @return the slot of the first registered process with @p role, or -ENOENT. */
int shm_live_find(struct shm_region *r, const char *role);

/**
 * The slot of the first process with @p role that is alive now (a killed
 * one's slot stays behind, dead, until it is reused), its pid in @p pid.
 * @return the slot, or -ENOENT.
 */
int shm_live_find_alive(struct shm_region *r, const char *role, int32_t *pid);

/** @return 1 if the process @p pid that held @p slot is gone (dead, the slot released or taken by another). */
int shm_live_gone(struct shm_region *r, int slot, int32_t pid);

#ifdef __cplusplus
}
#endif
#endif /* SHM_LIVE_H */
