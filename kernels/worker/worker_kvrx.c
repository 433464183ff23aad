/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A decode node's KV pages straight from the dataplane to the stage that
 * owns their layers (SHM_MB_KV_RXROUTE, shm_mb.h; receive routes,
 * dp_ipc.h). ctrld asks once: the stage makes its receive ring (<in>.rx)
 * and landing ring (<in>.kvl) and routes its layers' stream there. Then,
 * for each page message the dataplane delivers, the stage checks the
 * message's room is open in ctrld's rooms area, imports its pages into the
 * blocks the message names (the decode node's manifest, which the prefill
 * node echoes), gives the buffer back to the dataplane's pool, and tells
 * ctrld on <in>.kvl. ctrld never touches these messages: no round trip per
 * batch, and the stream's owner is the process that consumes it.
 *
 * The room check and ctrld's closing of a room are ordered by the busy
 * word (shm_mb.h): a page of a room ctrld closed never lands in blocks
 * another request may have by then.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dp_ipc.h"
#include "shm_pool.h"
#include "shm_region.h"
#include "shm_ring.h"
#include "wk_kvpage.h"
#include "worker_int.h"
#include "wk_tp_area.h"

#define KVL_SLOTS 4096u

static unsigned pow2_at_least(unsigned n)
{
	unsigned p = 1;

	while (p < n)
		p <<= 1;
	return p;
}

/* A ring of ours that a predecessor of this worker may have made already. */
static struct shm_ring *ring_get(struct shm_region *r, const char *name, unsigned count, unsigned flags)
{
	struct shm_ring *q = shm_ring_create(r, name, count, sizeof(struct shm_desc), flags);

	if (q == NULL && errno == EEXIST)
		q = shm_ring_lookup(r, name);
	return q;
}

int wk_kvrx_route(struct worker *w, uint32_t stream, char *err, size_t errlen)
{
	struct wk_kvrx *x = &w->rx;
	const char *in = w->o.in + 5;
	char rxn[SHM_NAME_MAX], kvln[SHM_NAME_MAX];
	uint64_t off_route, off_rooms, off_st;
	size_t sz;
	unsigned need;

	if (w->kvq == NULL || strlen(in) + 5 > SHM_NAME_MAX) {
		snprintf(err, errlen, "stage %d (%s): no KV side rings (input %s): pages stay with ctrld", w->idx,
			 w->o.role, w->o.in);
		return -ENOTSUP;
	}
	if (shm_region_find_area(w->reg, DP_AREA_RXROUTE, &off_route, &sz) < 0 || sz < sizeof(struct dp_rxroute)
	    || shm_region_find_area(w->reg, SHM_MB_KVROOMS_AREA, &off_rooms, &sz) < 0
	    || sz < sizeof(struct shm_mb_kvrooms)) {
		snprintf(err, errlen, "stage %d (%s): region %s has no receive routes (%s) or rooms (%s): its "
			 "dataplane predates them", w->idx, w->o.role, w->o.region, DP_AREA_RXROUTE, SHM_MB_KVROOMS_AREA);
		return -ENOTSUP;
	}
	if (x->q == NULL) {
		x->rxs = shm_pool_lookup(w->reg, DP_POOL_RX_SMALL);
		x->rxl = shm_pool_lookup(w->reg, DP_POOL_RX_LARGE);
		if (x->rxs == NULL || x->rxl == NULL) {
			snprintf(err, errlen, "stage %d (%s): the dataplane's receive pools are not in region %s", w->idx,
				 w->o.role, w->o.region);
			goto fail;
		}
		need = shm_pool_count(x->rxs) + shm_pool_count(x->rxl);
		snprintf(rxn, sizeof(rxn), "%s.rx", in);
		snprintf(kvln, sizeof(kvln), "%s.kvl", in);
		/* every pool buffer fits (the dataplane's enqueue cannot fail);
		 * several consumers: the dataplane drains it if we die */
		x->q = ring_get(w->reg, rxn, pow2_at_least(need + 1), SHM_RING_MC);
		x->kvl = ring_get(w->reg, kvln, KVL_SLOTS, 0);
		x->ctl = shm_ring_lookup(w->reg, DP_RING_RX_CTL);
		if (x->q == NULL || x->kvl == NULL || shm_ring_capacity(x->q) < need) {
			snprintf(err, errlen, "stage %d (%s): rings %s / %s in region %s: %s", w->idx, w->o.role, rxn,
				 kvln, w->o.region, x->q != NULL && x->kvl != NULL ? "too small" : strerror(errno));
			goto fail;
		}
	}
	x->rooms = shm_ptr(w->reg, off_rooms);
	x->route = shm_ptr(w->reg, off_route);
	x->stream = stream;
	/* a dataplane receiving in place may hand us a message as the list of
	 * its frames when the stage reads pages where they lie (no gather) */
	x->dpst = NULL;
	/* a tensor-parallel stage's followers read the message whole, at its
	 * offset in the region: no lists of frames (worker_tp.c) */
	if (w->o.kv_rx_pieces && w->tp.size <= 1 && kn_stage_kv_imports_segs(w->st)
	    && shm_region_find_area(w->reg, DP_AREA_STATS, &off_st, &sz) == 0
	    && sz >= sizeof(struct dp_stats_shm)) {
		uint32_t cap = (uint32_t)((shm_pool_bufsize(x->rxs) - sizeof(struct dp_rx_seglist))
					  / sizeof(struct dp_rx_seg));

		if (x->segcap < cap) {
			struct kn_seg *v = realloc(x->segv, cap * sizeof(*v));

			if (v != NULL) {
				x->segv = v;
				x->segcap = cap;
			}
		}
		if (x->segcap >= cap) {
			uint64_t off_pk;
			size_t sz_pk;

			x->dpst = shm_ptr(w->reg, off_st);
			dp_ipc_rx_mem_fini(&x->mem);
			dp_ipc_rx_mem_init(&x->mem, shm_region_base(w->reg), shm_region_size(w->reg),
					   shm_region_find_area(w->reg, DP_AREA_PKTMEM, &off_pk, &sz_pk) == 0
					   && sz_pk >= sizeof(struct dp_pktmem) ? shm_ptr(w->reg, off_pk) : NULL);
		}
	}
	__atomic_store_n(&x->rooms->busy[w->idx].pid, (int32_t)getpid(), __ATOMIC_RELAXED);
	snprintf(rxn, sizeof(rxn), "%s.rx", in);
	if (dp_ipc_rx_route(x->route, stream, rxn, in, (int32_t)getpid(), x->dpst != NULL) < 0) {
		snprintf(err, errlen, "stage %d (%s): stream %u cannot be routed (receive routes of another version?)",
			 w->idx, w->o.role, stream);
		goto fail;
	}
	WK_INFO(w, "KV pages of stream %u (layers %d..%d) now come straight from the dataplane on %s", stream,
		w->info.layer_start, w->info.layer_end, rxn);
	return 0;
fail:
	wk_kvrx_close(w);
	return -EIO;
}

void wk_kvrx_close(struct worker *w)
{
	struct wk_kvrx *x = &w->rx;

	if (x->route != NULL)
		dp_ipc_rx_route(x->route, x->stream, "", "", 0, 0);
	if (x->taken > 0 || x->stale > 0)
		WK_INFO(w, "KV page messages taken from the dataplane: %llu (%llu read in place, from their frames), "
			"%llu refused, %llu skipped (handed to a dead predecessor)", (unsigned long long)x->taken,
			(unsigned long long)x->in_place, (unsigned long long)x->refused, (unsigned long long)x->stale);
	shm_ring_close(x->q);
	shm_ring_close(x->kvl);
	shm_ring_close(x->ctl);
	shm_pool_close(x->rxs);
	shm_pool_close(x->rxl);
	free(x->segv);
	dp_ipc_rx_mem_fini(&x->mem);
	memset(x, 0, sizeof(*x));
}

/* Is @p room (@p session) open in ctrld's rooms? */
static int room_open(const struct shm_mb_kvrooms *r, uint64_t room, uint32_t session)
{
	for (uint32_t i = 0; i < SHM_MB_KVROOMS_SLOTS; i++)
		if (__atomic_load_n(&r->slot[i].open, __ATOMIC_SEQ_CST) && r->slot[i].room == room
		    && r->slot[i].session == session)
			return 1;
	return 0;
}

int wk_kvrx_poll(struct worker *w)
{
	struct wk_kvrx *x = &w->rx;
	struct shm_mb_kvrooms *rm = x->rooms;
	struct dp_kvpage_fields f;
	struct wk_kvpage_info info;
	struct shm_desc d, rep;
	struct shm_pool *p;
	struct wk_kv_io io;
	char err[256] = "";
	const struct dp_rx_seglist *sl = NULL;
	uint8_t hb[sizeof(struct dp_kvpage_hdr)];
	const void *buf;
	uint32_t nseg = 0;
	int64_t idx;
	int ok = 0;

	/* a report's slot first: a page taken is always reported */
	if (x->q == NULL || shm_ring_free_count(x->kvl) == 0 || shm_ring_dequeue_burst(x->q, &d, 1) != 1)
		return 0;
	p = dp_ipc_rx_in_small(d.len, d.flags, shm_pool_bufsize(x->rxs)) ? x->rxs : x->rxl;
	idx = shm_pool_idx_of(p, d.off);
	/* ours now (the dataplane reclaims it if we die): passed from the pid
	 * the dataplane passed it to, ours or a dead predecessor's on this
	 * ring; one that fails was reclaimed from that one and may be another
	 * message's by now: not read, not given back, not reported */
	if (idx >= 0 && shm_pool_pass(p, (uint32_t)idx, DP_AUX_HOLDER(d.aux), (int32_t)getpid()) < 0) {
		x->stale++;
		WK_WARN(w, "stage %d: skipped a KV page message its dead predecessor on this ring was handed "
			"(its buffer went back to the pool)", w->idx);
		return 1;
	}
	x->taken++;
	memset(&f, 0, sizeof(f));
	if (idx >= 0 && (d.flags & DP_RX_SEGMENTS) && x->dpst != NULL)
		sl = dp_ipc_rx_seglist(&x->mem, d.off, d.len, shm_pool_bufsize(x->rxs));
	if (sl != NULL && sl->n_segs <= x->segcap) {
		/* received in place: the frames' payloads where they lie, the
		 * header read out of the first */
		size_t got = 0;

		nseg = sl->n_segs;
		for (uint32_t i = 0; i < nseg; i++) {
			uint32_t n;
			const void *q = dp_ipc_rx_seg(&x->mem, sl, i, &n);
			size_t k = got < sizeof(hb) ? (n < sizeof(hb) - got ? n : sizeof(hb) - got) : 0;

			x->segv[i] = (struct kn_seg){ q, n };
			memcpy(hb + got, q, k);
			got += k;
		}
	} else {
		sl = NULL;
	}
	if (idx < 0 || ((d.flags & DP_RX_SEGMENTS) ? sl == NULL : d.len > shm_pool_bufsize(p))) {
		snprintf(err, sizeof(err), "a KV page message at offset %llu (%u bytes) is no whole receive buffer "
			 "nor a valid list of one's segments", (unsigned long long)d.off, d.len);
	} else if (buf = sl != NULL ? (const void *)hb : shm_ptr(w->reg, d.off), dp_kvpage_hdr_get(buf, d.len, &f) < 0) {
		snprintf(err, sizeof(err), "a KV page message with no valid header (%u bytes)", d.len);
	} else {
		/* busy first, then the room: ctrld clears the room first, then reads busy (shm_mb.h) */
		__atomic_store_n(&rm->busy[w->idx].room, f.room, __ATOMIC_SEQ_CST);
		__atomic_store_n(&rm->busy[w->idx].on, 1u, __ATOMIC_SEQ_CST);
		if (!room_open(rm, f.room, f.session)) {
			snprintf(err, sizeof(err), "KV pages for room %llu (session %u), which is not open",
				 (unsigned long long)f.room, f.session);
		} else {
			/* tensor parallelism: each rank imports its heads' share of the
			 * pages, the followers from the same buffer (held until all did) */
			const uint64_t job = sl == NULL ? wk_tp_kv_begin(w, WK_TP_KV_PAGES_JOB, NULL, d.len, d.off) : 0;

			io = wk_kv_io_stage(w->st);
			ok = (sl != NULL ? wk_kvpage_import_segs(&io, x->segv, (int32_t)nseg, d.len, &info, err, sizeof(err))
					 : wk_kvpage_import(&io, buf, d.len, &info, err, sizeof(err))) == 0;
			if (job != 0 || w->tp.size > 1) {
				char ferr[256];

				if (wk_tp_kv_end(w, job, ferr, sizeof(ferr)) < 0 && ok) {
					ok = 0;
					snprintf(err, sizeof(err), "%s", ferr);
				}
			}
			if (ok && sl != NULL && !dp_ipc_rx_seglist_current(x->dpst, sl)) {
				/* its dataplane started again on the region meanwhile: the
				 * frames may have been overwritten as we read them */
				ok = 0;
				snprintf(err, sizeof(err), "KV pages for room %llu read in place while their dataplane "
					 "started again (they may be overwritten)", (unsigned long long)f.room);
			}
			x->in_place += ok && sl != NULL;
		}
		__atomic_store_n(&rm->busy[w->idx].on, 0u, __ATOMIC_RELEASE);
	}
	if (!ok) {
		x->refused++;
		WK_WARN(w, "stage %d: refused %s", w->idx, err);
	}
	rep = (struct shm_desc){ .off = f.room, .len = d.len, .type = (uint16_t)w->idx,
				 .flags = (uint16_t)((f.flags & DP_KVPAGE_LAST ? SHM_MB_KVL_LAST : 0)
						     | (ok ? 0 : SHM_MB_KVL_REFUSED)
						     | (ok && sl != NULL ? SHM_MB_KVL_IN_PLACE : 0)),
				 .seq = f.n_blocks, .aux = f.session };
	if (idx >= 0)
		shm_pool_put(p, (uint32_t)idx);
	shm_ring_enqueue_burst(x->kvl, &rep, 1); /* its slot was free, and only we enqueue */
	if (x->ctl != NULL)
		shm_ring_wake_(x->ctl); /* ctrld's PD poller sleeps on its control ring */
	return 1;
}
