/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-worker's hops (see worker_hop.h).
 *
 * The dataplane side follows dataplane/ipc/dp_ipc.h, a header-only
 * shared-memory ABI (ring names, descriptor conventions): the worker links
 * nothing of the dataplane. Invariants:
 *  - A buffer handed to the dataplane (on our send lane) stays untouched until
 *    its completion comes back on the lane's completion ring (the dataplane
 *    may retransmit from it): wk_out_quiesce() waits for that before the
 *    worker rewrites a buffer.
 *  - dp.rx hands out buffers of the dataplane's receive pools; wk_in_done()
 *    returns each exactly once, after the step that read it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "dp_ipc.h"
#include "dp_tx_lane.h"
#include "kvf_log.h"
#include "shm_pool.h"
#include "worker_hop.h"

/* Sends over the dataplane outstanding at once: one per group in flight,
 * and groups are far fewer than this. */
#define WK_DP_PENDING 256

struct wk_in {
	struct shm_ring *q;
	int dp;
	struct shm_pool *small, *large;
};

struct wk_out {
	struct shm_region *r;
	struct shm_ring *q;       /* next ring, or our dataplane send lane's */
	struct dp_tx_lane lane;   /* dataplane hop only */
	struct shm_ring *txc;     /* our lane's completions (dataplane hop only) */
	uint16_t peer, stream;
	int dp;
	uint64_t pending[WK_DP_PENDING]; /* offsets awaiting completion; 0 = free entry */
	unsigned n_pending;
	unsigned failed;
	char why[160];
};

static void sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

struct shm_ring *wk_ring_open(struct shm_region *r, const char *name, char *err, size_t errlen)
{
	/* Up to 2 s for a ring another process is initialising right now. */
	for (int tries = 0; tries < 2000; tries++) {
		struct shm_ring *q = shm_ring_lookup(r, name);

		if (q != NULL)
			return q;
		if (errno == ENOENT) {
			q = shm_ring_create(r, name, WK_RING_COUNT, sizeof(struct shm_desc), 0);
			if (q != NULL)
				return q;
			if (errno != EEXIST)
				break;
		} else if (errno != EPROTO) {
			break;
		}
		sleep_ms(1);
	}
	snprintf(err, errlen, "shm_ring_create/lookup(%s, %u x %zu bytes) failed: %s: make the "
		 "region larger, or check that every process of this node uses the same region",
		 name, WK_RING_COUNT, sizeof(struct shm_desc), strerror(errno));
	return NULL;
}

struct wk_in *wk_in_open(struct shm_region *r, const char *spec, char *err, size_t errlen)
{
	struct wk_in *in = calloc(1, sizeof(*in));

	if (in == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (strncmp(spec, "ring:", 5) == 0) {
		in->q = wk_ring_open(r, spec + 5, err, errlen);
	} else if (strcmp(spec, "dp") == 0) {
		in->dp = 1;
		uint64_t off;

		in->q = shm_ring_lookup(r, DP_RING_RX);
		in->small = shm_pool_lookup(r, DP_POOL_RX_SMALL);
		in->large = shm_pool_lookup(r, DP_POOL_RX_LARGE);
		/* the ring's consumer: the dataplane passes its buffers to us */
		if (in->q != NULL && shm_region_find_area(r, DP_AREA_RXOWN, &off, NULL) == 0)
			dp_ipc_rx_own(shm_ptr(r, off), DP_RX_RING_MBATCH, (int32_t)getpid(), 0);
		if (in->q == NULL || in->small == NULL || in->large == NULL)
			snprintf(err, errlen, "shm_ring_lookup(%s)/shm_pool_lookup(%s, %s) in region %s "
				 "failed: %s: start kvferry-dataplane on this region first",
				 DP_RING_RX, DP_POOL_RX_SMALL, DP_POOL_RX_LARGE, shm_region_path(r),
				 strerror(errno));
	} else {
		snprintf(err, errlen, "bad input hop \"%s\": use ring:NAME or dp", spec);
	}
	if (in->q == NULL || (in->dp && (in->small == NULL || in->large == NULL))) {
		wk_in_close(in);
		return NULL;
	}
	return in;
}

/* A receive buffer the dataplane handed over is ours now, from whom it
 * passed it to (this worker, or one before it on this ring that died): if
 * this worker dies before it puts it back, the dataplane reclaims it.
 * @return 0, or -1: it went back to the pool after that one died and is
 * not ours to read (dp_ipc.h, receive ring owners). */
static int take(struct wk_in *in, const struct shm_desc *d)
{
	struct shm_pool *p;
	int64_t idx;

	if (!in->dp)
		return 0;
	p = dp_ipc_rx_pool_is_small(d->len, shm_pool_bufsize(in->small)) ? in->small : in->large;
	idx = shm_pool_idx_of(p, d->off);
	if (idx >= 0 && shm_pool_pass(p, (uint32_t)idx, DP_AUX_HOLDER(d->aux), (int32_t)getpid()) < 0)
		return -1;
	return 0;
}

/* The next message that is ours, if one is there. @return 1 or 0. */
static int get_one(struct wk_in *in, struct shm_desc *d)
{
	while (shm_ring_dequeue_burst(in->q, d, 1) == 1)
		if (take(in, d) == 0)
			return 1;
	return 0;
}

int wk_in_get(struct wk_in *in, struct shm_desc *d, int64_t timeout_ns, struct shm_ring *const *also,
	      unsigned n_also)
{
	struct shm_ring *all[SHM_RING_WAIT_MAX] = { in->q };
	int rc;

	if (get_one(in, d))
		return 1;
	if (n_also == 0 || n_also >= SHM_RING_WAIT_MAX) {
		rc = shm_ring_wait(in->q, timeout_ns);
	} else {
		memcpy(all + 1, also, n_also * sizeof(*also));
		rc = shm_ring_wait_any(all, n_also + 1, timeout_ns);
	}
	if (rc == -EINTR)
		return rc;
	return get_one(in, d);
}

void wk_in_done(struct wk_in *in, const struct shm_desc *d)
{
	struct shm_pool *p;
	int64_t idx;

	if (!in->dp)
		return; /* ring messages live in the producer's own buffers */
	p = dp_ipc_rx_pool_is_small(d->len, shm_pool_bufsize(in->small)) ? in->small : in->large;
	idx = shm_pool_idx_of(p, d->off);
	if (idx >= 0)
		shm_pool_put(p, (uint32_t)idx);
}

void wk_in_close(struct wk_in *in)
{
	if (in == NULL)
		return;
	shm_ring_close(in->q);
	shm_pool_close(in->small);
	shm_pool_close(in->large);
	free(in);
}

struct wk_out *wk_out_open(struct shm_region *r, const char *spec, char *err, size_t errlen)
{
	struct wk_out *o = calloc(1, sizeof(*o));
	unsigned peer, stream = 0;

	if (o == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	o->r = r;
	if (strncmp(spec, "ring:", 5) == 0) {
		o->q = wk_ring_open(r, spec + 5, err, errlen);
	} else if (sscanf(spec, "peer:%u/%u", &peer, &stream) >= 1 && peer < DP_MAX_PEERS
		   && stream < DP_MAX_STREAMS) {
		o->dp = 1;
		o->peer = (uint16_t)peer;
		o->stream = (uint16_t)stream;
		/* a dataplane that just re-created its region adds its send lanes
		 * an instant after the region appears (a worker re-attaching to it
		 * got there first): wait a little for them */
		for (int tries = 0; dp_tx_lane_open(r, &o->lane, err, errlen) == -ENOENT && tries < 250; tries++)
			usleep(20000);
		if (o->lane.lane >= 0) {
			o->q = o->lane.q;
			o->txc = o->lane.c;
		}
	} else {
		snprintf(err, errlen, "bad output hop \"%s\": use ring:NAME or peer:NODE[/STREAM] "
			 "(node < %u, stream < %u)", spec, DP_MAX_PEERS, DP_MAX_STREAMS);
	}
	if (o->q == NULL || (o->dp && o->txc == NULL)) {
		wk_out_close(o);
		return NULL;
	}
	return o;
}

unsigned wk_out_poll(struct wk_out *o)
{
	struct shm_desc c[32];
	unsigned n, bad = 0;

	if (!o->dp)
		return 0;
	while ((n = shm_ring_dequeue_burst(o->txc, c, 32)) > 0)
		for (unsigned i = 0; i < n; i++) {
			for (unsigned k = 0; k < WK_DP_PENDING; k++)
				if (o->pending[k] == c[i].off + 1) {
					o->pending[k] = 0;
					o->n_pending--;
					break;
				}
			if (c[i].flags & DP_TXC_FAILED) {
				bad++;
				o->failed++;
				snprintf(o->why, sizeof(o->why), "the dataplane could not deliver to node %u: %s",
					 o->peer, strerror(c[i].flags & 0xff));
				/* ctrld fails the group (its peer event or deadline); say why here. */
				kvf_log(KVF_LOG_ERR, "kvferry-worker", "send of message %llu failed: %s",
					(unsigned long long)c[i].seq, o->why);
			}
		}
	return bad;
}

static int is_pending(const struct wk_out *o, uint64_t off)
{
	for (unsigned k = 0; k < WK_DP_PENDING && o->n_pending > 0; k++)
		if (o->pending[k] == off + 1)
			return 1;
	return 0;
}

void wk_out_quiesce(struct wk_out *o, uint64_t off, volatile const sig_atomic_t *stop)
{
	struct timespec ts = { 0, 20000 };

	if (!o->dp)
		return;
	wk_out_poll(o);
	while (is_pending(o, off) && !*stop) {
		nanosleep(&ts, NULL);
		wk_out_poll(o);
	}
}

int wk_out_send(struct wk_out *o, uint64_t off, uint32_t len, uint16_t kind, uint64_t seq,
		volatile const sig_atomic_t *stop)
{
	struct shm_desc d = { .off = off, .len = len, .type = kind, .seq = seq };

	if (o->dp) {
		d.type = DP_MT_MBATCH;
		d.aux = DP_AUX(o->peer, o->stream);
		while (o->n_pending >= WK_DP_PENDING && !*stop) {
			wk_out_poll(o);
			sleep_ms(1);
		}
		for (unsigned k = 0; k < WK_DP_PENDING; k++)
			if (o->pending[k] == 0) {
				o->pending[k] = off + 1;
				o->n_pending++;
				break;
			}
	}
	/* The next hop holds at most one message per group: a full ring means
	 * its consumer is slow (or being restarted), so wait rather than drop. */
	while (shm_ring_enqueue_burst(o->q, &d, 1) != 1) {
		if (*stop)
			return -EINTR;
		wk_out_poll(o);
		sleep_ms(1);
	}
	return 0;
}

int wk_out_is_dp(const struct wk_out *o)
{
	return o->dp;
}

void wk_out_close(struct wk_out *o)
{
	if (o == NULL)
		return;
	if (o->dp)
		dp_tx_lane_close(&o->lane); /* closes o->q and o->txc */
	else
		shm_ring_close(o->q);
	free(o);
}

void wk_hop_report(const struct wk_in *in, const struct wk_out *o, char *buf, size_t n)
{
	uint32_t bufs = 0, avail = 0;

	if (in->dp) {
		bufs = shm_pool_count(in->small) + shm_pool_count(in->large);
		avail = shm_pool_available(in->small) + shm_pool_available(in->large);
	}
	snprintf(buf, n, "in_queued=%u out_queued=%u pending_sends=%u rx_bufs=%u rx_free=%u",
		 shm_ring_count(in->q), shm_ring_count(o->q), o->n_pending, bufs, avail);
}
