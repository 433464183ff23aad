/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Receive routes (dp_ipc.h): a stream's KV page messages to the process that
 * owns the stream (a worker whose stage owns the layers), on the ring it
 * named, instead of DP_RING_RX_KV. The route table is an area of the region
 * the consumers write; this file reads it for the poll loop (dp.c) with a
 * per-stream cache of the looked-up rings, and drops the routes of dead
 * consumers, draining what their rings still held back into the pools.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>

#include "dp_int.h"
#include "kvf_log.h"

int dp_route_init(struct dp *d)
{
	uint64_t off;
	int r = shm_region_add_area(d->reg, DP_AREA_RXROUTE, sizeof(*d->route), 64, SHM_AREA_RAW, &off);

	if (r && r != -EEXIST) {
		kvf_log(KVF_LOG_ERR, NULL, "shm_region_add_area(%s) failed: %s: make the region larger (--region-size)",
			DP_AREA_RXROUTE, strerror(-r));
		return r;
	}
	d->route = shm_ptr(d->reg, off);
	if (r == 0) { /* kept across a restart on the region: the routes of live consumers stay */
		memset(d->route, 0, sizeof(*d->route));
		d->route->version = DP_RXROUTE_VERSION;
		__atomic_store_n(&d->route->magic, DP_RXROUTE_MAGIC, __ATOMIC_RELEASE);
	}
	return 0;
}

static void cache_drop(struct dp_route_cache *c)
{
	shm_ring_close(c->r);
	shm_ring_close(c->wake);
	memset(c, 0, sizeof(*c));
}

void dp_route_close(struct dp *d)
{
	for (unsigned s = 0; s < DP_MAX_STREAMS; s++)
		cache_drop(&d->rt[s]);
}

/* Give every message still on a dead consumer's ring back to its pool: a
 * buffer passed to a consumer only while that one still holds it (a
 * reclaim of its buffers may have come first, and the buffer be another
 * message's now). Every consumer that passed the ring on is dead: the
 * route goes only when its pid is. */
static void drain(struct dp *d, struct shm_ring *r)
{
	struct shm_desc m[BURST];
	unsigned n;
	uint32_t back = 0;

	while ((n = shm_ring_dequeue_burst(r, m, BURST)) > 0)
		for (unsigned i = 0; i < n; i++) {
			struct shm_pool *p = dp_rx_pool(d, &m[i]);
			int64_t idx = shm_pool_idx_of(p, m[i].off);
			int32_t h = DP_AUX_HOLDER(m[i].aux);

			if (idx >= 0 && (h == 0 ? shm_pool_put(p, (uint32_t)idx)
					 : shm_pool_pass(p, (uint32_t)idx, h, 0)) == 0)
				back++;
		}
	if (back > 0)
		kvf_log(KVF_LOG_WARNING, NULL, "dataplane %u: %u KV page message%s left on a dead consumer's ring "
			"back in the pool", d->o->node, back, back == 1 ? "" : "s");
}

struct shm_ring *dp_route_ring(struct dp *d, uint16_t stream, struct shm_ring **wake, int *segs, int32_t *pidp)
{
	struct dp_rxroute_ent *e;
	struct dp_route_cache *c;
	char ring[sizeof(e->ring) + 1], wk[sizeof(e->wake) + 1];
	int32_t pid;
	uint32_t g;

	int sg;

	*wake = NULL;
	if (segs != NULL)
		*segs = 0;
	if (pidp != NULL)
		*pidp = 0;
	if (d->route == NULL || stream >= DP_MAX_STREAMS)
		return NULL;
	e = &d->route->ent[stream];
	c = &d->rt[stream];
	pid = __atomic_load_n(&e->pid, __ATOMIC_ACQUIRE);
	if (pid <= 0) {
		if (c->r != NULL)
			cache_drop(c);
		return NULL;
	}
	g = __atomic_load_n(&e->gen, __ATOMIC_ACQUIRE);
	if (c->r != NULL && c->pid == pid && c->gen == g) {
		*wake = c->wake;
		if (segs != NULL)
			*segs = c->segs;
		if (pidp != NULL)
			*pidp = pid;
		return c->r;
	}
	if (g & 1u)
		return NULL; /* being written: this message goes the usual way */
	memcpy(ring, e->ring, sizeof(e->ring));
	memcpy(wk, e->wake, sizeof(e->wake));
	ring[sizeof(e->ring)] = wk[sizeof(e->wake)] = 0;
	sg = (int)((__atomic_load_n(&d->route->segs, __ATOMIC_RELAXED) >> stream) & 1u);
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	if (__atomic_load_n(&e->gen, __ATOMIC_RELAXED) != g)
		return NULL;
	cache_drop(c);
	c->r = shm_ring_lookup(d->reg, ring);
	if (c->r != NULL && shm_ring_capacity(c->r) < shm_pool_count(d->p_small) + shm_pool_count(d->p_large)) {
		kvf_log(KVF_LOG_ERR, NULL, "dataplane %u: stream %u's route names ring %s of %u slots, fewer than the "
			"receive pools' %u buffers: not used (its KV pages go to %s)", d->o->node, stream, ring,
			shm_ring_capacity(c->r), shm_pool_count(d->p_small) + shm_pool_count(d->p_large), DP_RING_RX_KV);
		shm_ring_close(c->r);
		c->r = NULL;
	}
	if (c->r == NULL)
		return NULL;
	c->wake = wk[0] ? shm_ring_lookup(d->reg, wk) : NULL;
	c->pid = pid;
	c->gen = g;
	c->segs = sg;
	kvf_log(KVF_LOG_INFO, NULL, "dataplane %u: stream %u's KV pages now go to pid %d on ring %s%s", d->o->node,
		stream, (int)pid, ring, sg && d->in_place ? " (as segment lists where received in place)" : "");
	*wake = c->wake;
	if (segs != NULL)
		*segs = sg;
	if (pidp != NULL)
		*pidp = pid;
	return c->r;
}

/* Drop stream @p s's route to @p pid (dead), draining its ring. */
static void drop(struct dp *d, unsigned s, int32_t pid)
{
	struct dp_rxroute_ent *e = &d->route->ent[s];
	struct shm_ring *w, *r = dp_route_ring(d, (uint16_t)s, &w, NULL, NULL); /* its ring, before the route goes */

	if (!__atomic_compare_exchange_n(&e->pid, &pid, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
		return; /* a successor routed it meanwhile */
	kvf_log(KVF_LOG_WARNING, NULL, "dataplane %u: stream %u's consumer pid %d died: its KV pages go to %s "
		"until a successor routes them", d->o->node, s, (int)pid, DP_RING_RX_KV);
	if (r != NULL)
		drain(d, r); /* a successor consumes it too: the ring takes several (dp_ipc.h) */
	cache_drop(&d->rt[s]);
}

void dp_route_scan(struct dp *d)
{
	for (unsigned s = 0; d->route != NULL && s < DP_MAX_STREAMS; s++) {
		int32_t pid = __atomic_load_n(&d->route->ent[s].pid, __ATOMIC_ACQUIRE);

		if (pid > 0 && kill(pid, 0) < 0 && errno == ESRCH)
			drop(d, s, pid);
	}
}

void dp_route_forget(struct dp *d, int32_t pid)
{
	for (unsigned s = 0; d->route != NULL && pid > 0 && s < DP_MAX_STREAMS; s++)
		if (__atomic_load_n(&d->route->ent[s].pid, __ATOMIC_ACQUIRE) == pid)
			drop(d, s, pid);
}
