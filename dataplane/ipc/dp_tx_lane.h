/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file dp_tx_lane.h
 * A sender's own lane to kvferry-dataplane (dp_ipc.h, "send lanes"): claim
 * a free lane of the region's DP_AREA_TXLANES and open its ring. Needs the
 * shm library; dp_ipc.h alone does not.
 *
 * Threading: one thread at a time sends on a lane; a process with several
 * sending threads serializes them or opens a lane per thread.
 */
#ifndef DP_TX_LANE_H
#define DP_TX_LANE_H

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dp_ipc.h"
#include "shm_region.h"
#include "shm_ring.h"

struct dp_tx_lane {
	struct shm_ring *q;      /**< the lane's ring: enqueue send requests here */
	struct shm_ring *c;      /**< its completions: dequeue them here */
	struct dp_tx_lanes *t;
	int lane;                /**< -1: none */
	int32_t pid;
};

/**
 * Claim a lane of region @p r's dataplane for this process and open its ring.
 * @return 0, or -ENOENT (no dataplane lanes in @p r: not started yet, or of
 *         another version), -EBUSY (every lane taken), with @p err saying so.
 */
static inline int dp_tx_lane_open(struct shm_region *r, struct dp_tx_lane *l, char *err, size_t errlen)
{
	char name[32];
	uint64_t off;
	int rc;

	memset(l, 0, sizeof(*l));
	l->lane = -1;
	if (shm_region_find_area(r, DP_AREA_TXLANES, &off, NULL) < 0) {
		snprintf(err, errlen, "region %s has no dataplane send lanes (%s): start kvferry-dataplane "
			 "on this region first", shm_region_path(r), DP_AREA_TXLANES);
		return -ENOENT;
	}
	l->t = shm_ptr(r, off);
	l->pid = (int32_t)getpid();
	rc = dp_ipc_tx_claim(l->t, l->pid);
	if (rc < 0) {
		snprintf(err, errlen, rc == -1 ? "region %s: the dataplane's send lanes are of another version: "
			 "restart kvferry-dataplane from this package" : "region %s: all %u dataplane send lanes "
			 "are taken by live processes", shm_region_path(r), DP_TX_LANES);
		return rc == -1 ? -ENOENT : -EBUSY;
	}
	l->lane = rc;
	snprintf(name, sizeof(name), DP_RING_TX_LANE, (unsigned)rc);
	l->q = shm_ring_lookup(r, name);
	if (l->q != NULL) {
		snprintf(name, sizeof(name), DP_RING_TXC_LANE, (unsigned)rc);
		l->c = shm_ring_lookup(r, name);
	}
	if (l->q == NULL || l->c == NULL) {
		snprintf(err, errlen, "region %s: lane ring %s: %s", shm_region_path(r), name, strerror(errno));
		shm_ring_close(l->q);
		l->q = NULL;
		dp_ipc_tx_release(l->t, l->lane, l->pid);
		l->lane = -1;
		return -ENOENT;
	}
	return 0;
}

/** Give the lane back (what was enqueued on it is still sent) and close its rings. */
static inline void dp_tx_lane_close(struct dp_tx_lane *l)
{
	if (l->q != NULL)
		shm_ring_close(l->q);
	if (l->c != NULL)
		shm_ring_close(l->c);
	l->c = NULL;
	if (l->t != NULL && l->lane >= 0)
		dp_ipc_tx_release(l->t, l->lane, l->pid);
	l->q = NULL;
	l->lane = -1;
}

#endif /* DP_TX_LANE_H */
