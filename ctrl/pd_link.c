/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ctrld's PD traffic over the node's dataplane rings (ctrl_pd_link.h). The
 * dataplane guarantees exactly-once, in-order delivery per stream and says
 * when a send failed (peer restarted or unreachable); this file only moves
 * buffers: ours out on our send lane (dp.tx.N) and back on its dp.txc.N, the
 * dataplane's in on dp.rx.ctl / dp.rx.kv and back to its pools.
 */
#include <errno.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctrl_pd_link.h"
#include "dp_crc32c.h"
#include "dp_ipc.h"
#include "dp_tx_lane.h"
#include "shm_mb.h"
#include "shm_pool.h"
#include "shm_region.h"
#include "shm_ring.h"
#include "wk_kvpage.h"
#include "kvf_clock.h"

#define PD_STREAM_CTL 0
#define PD_POOL_SMALL "ctrld.pds"
#define PD_POOL_LARGE "ctrld.pdl"
#define PD_SMALL_BYTES (64 * 1024)

struct ctrl_pd_link {
	struct ctrl_pd_link_opts o;
	struct shm_region *reg;
	struct shm_ring *rx_ctl, *rx_kv;
	struct dp_tx_lane lane; /* our send lane (dp_ipc.h), taken in turns under tx_mu */
	int lane_open;
	pthread_mutex_t tx_mu;
	pthread_mutex_t txc_mu; /* one thread at a time reads the lane's completions */
	struct shm_pool *ps, *pl;          /* ours: sends */
	struct shm_pool *rxs, *rxl;        /* the dataplane's: what it received */
	struct dp_rx_mem mem;              /* where received segments lie (rx_bytes(), the poller's) */
	struct ctrl_pd_link_stats st;
	char refusal[256];
	struct shm_mb_kvrooms *rooms; /* decode, stages taking their own pages: the rooms they may land */
	struct dp_rxroute *route;     /* the dataplane's receive routes */
};

void ctrl_pd_link_opts_init(struct ctrl_pd_link_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->n_small = 256;
	o->n_large = 16;
	o->large_bytes = 4u << 20;
	o->wait_s = 20.0;
}

static struct shm_ring *ring_wait(struct shm_region *r, const char *name, double wait_s)
{
	double t0 = kvf_mono_s();

	for (;;) {
		struct shm_ring *q = shm_ring_lookup(r, name);

		if (q != NULL || kvf_mono_s() - t0 > wait_s)
			return q;
		usleep(20000);
	}
}

static struct shm_pool *pool_get(struct shm_region *r, const char *name, uint32_t n, size_t sz)
{
	struct shm_pool *p = shm_pool_create(r, name, n, sz);

	if (p == NULL && errno == EEXIST)
		p = shm_pool_lookup(r, name); /* ctrld restarted: its pools are still there */
	return p;
}

/* Our buffers hold a message and its payload CRCs behind it (dp_ipc.h,
 * DP_TX_CRCS) at any stride of 1 KiB or more: frames of 1,146 B and up. */
static size_t with_crcs(size_t bytes)
{
	return (size_t)dp_ipc_tx_crcs_room((uint32_t)bytes, 1024);
}

struct ctrl_pd_link *ctrl_pd_link_open(const struct ctrl_pd_link_opts *o, char *err, size_t errlen)
{
	struct ctrl_pd_link *l;
	char rerr[256];

	if (o == NULL || o->region == NULL || o->n_small < 1 || o->n_large < 1
	    || o->large_bytes < sizeof(struct dp_kvpage_hdr) + 4096) {
		snprintf(err, errlen, "ctrl_pd_link_open: no region, or pools of no use");
		errno = EINVAL;
		return NULL;
	}
	l = calloc(1, sizeof(*l));
	if (l == NULL) {
		snprintf(err, errlen, "ctrl_pd_link_open: out of memory");
		return NULL;
	}
	l->o = *o;
	pthread_mutex_init(&l->tx_mu, NULL);
	pthread_mutex_init(&l->txc_mu, NULL);
	l->reg = o->reg != NULL ? o->reg : shm_region_attach(o->region, rerr, sizeof(rerr));
	if (l->reg == NULL) {
		snprintf(err, errlen, "attaching the dataplane's region %s: %s (start kvferry-dataplane first)",
			 o->region, rerr);
		goto fail;
	}
	l->rx_ctl = ring_wait(l->reg, DP_RING_RX_CTL, o->wait_s);
	l->rx_kv = ring_wait(l->reg, DP_RING_RX_KV, o->wait_s);
	for (int i = 0; i < 250 && (l->rxs == NULL || l->rxl == NULL); i++) {
		/* the dataplane creates its pools right after its rings */
		l->rxs = shm_pool_lookup(l->reg, DP_POOL_RX_SMALL);
		l->rxl = shm_pool_lookup(l->reg, DP_POOL_RX_LARGE);
		if (l->rxs == NULL || l->rxl == NULL)
			usleep(20000);
	}
	if (!l->rx_ctl || !l->rx_kv || !l->rxs || !l->rxl) {
		snprintf(err, errlen, "region %s has no dataplane rings and pools (%s, %s, %s): is "
			 "kvferry-dataplane running on it?", o->region, DP_RING_RX_CTL, DP_RING_RX_KV,
			 DP_POOL_RX_SMALL);
		errno = ENOENT;
		goto fail;
	}
	/* our own send lane: its ring is single-producer, so this process's
	 * senders (the shipper, the PD loop) take turns (tx_mu) */
	for (int i = 0;; i++) {
		int rc = dp_tx_lane_open(l->reg, &l->lane, err, errlen);

		if (rc == 0)
			break;
		if (rc != -ENOENT || i >= 250) { /* the lanes come last in the dataplane's set-up */
			errno = -rc;
			goto fail;
		}
		usleep(20000);
	}
	l->lane_open = 1;
	/* a page message must fit the receiving dataplane's large buffers: the
	 * peer's are not known here, this node's (same configuration) stand in */
	if (l->o.large_bytes > shm_pool_bufsize(l->rxl))
		l->o.large_bytes = shm_pool_bufsize(l->rxl);
	l->ps = pool_get(l->reg, PD_POOL_SMALL, o->n_small, with_crcs(PD_SMALL_BYTES));
	l->pl = pool_get(l->reg, PD_POOL_LARGE, o->n_large, with_crcs(l->o.large_bytes));
	if (l->ps == NULL || l->pl == NULL) {
		snprintf(err, errlen, "region %s has no room for ctrld's PD buffers (%u x 64 KiB, %u x %zu B): "
			 "give the dataplane a larger region", o->region, o->n_small, o->n_large, l->o.large_bytes);
		errno = ENOSPC;
		goto fail;
	}
	return l;
fail:
	ctrl_pd_link_close(l);
	return NULL;
}

void ctrl_pd_link_close(struct ctrl_pd_link *l)
{
	if (l == NULL)
		return;
	shm_pool_close(l->ps);
	shm_pool_close(l->pl);
	shm_pool_close(l->rxs);
	shm_pool_close(l->rxl);
	if (l->lane_open)
		dp_tx_lane_close(&l->lane);
	pthread_mutex_destroy(&l->tx_mu);
	pthread_mutex_destroy(&l->txc_mu);
	shm_ring_close(l->rx_ctl);
	shm_ring_close(l->rx_kv);
	dp_ipc_rx_mem_fini(&l->mem);
	if (l->reg != NULL && l->o.reg == NULL)
		shm_region_detach(l->reg);
	free(l);
}

/*
 * The payload CRCs of our message in buffer @p idx of @p p, behind it, where
 * the dataplane sends payload CRCs (a NIC or af_packet: not over memif), so
 * that its lcore reads none of the bytes for them (dp_ipc.h, DP_TX_CRCS).
 * A control message's were just copied in (in this core's cache); a page
 * message's were just written by its stage's export (a worker's, a core of
 * the same host's; a GPU's copy for CUDA stages). A buffer too small for
 * the dataplane's stride (a pool an older ctrld made) goes without.
 * @return the request's flags.
 */
static uint16_t give_crcs(struct ctrl_pd_link *l, struct shm_pool *p, uint32_t idx, uint32_t len)
{
	uint32_t stride = dp_ipc_tx_crc_stride(l->lane.t);

	if (stride == 0 || dp_ipc_tx_crcs_room(len, stride) > shm_pool_bufsize(p))
		return 0;
	dp_ipc_tx_crcs_fill(shm_pool_buf(p, idx), len, stride, 0, UINT32_MAX);
	return DP_TX_CRCS;
}

/* Hand buffer @p idx of @p p to the dataplane (request @p flags: give_crcs()).
 * @return 0, or -EAGAIN (its ring is full: the buffer stays ours). */
static int enqueue(struct ctrl_pd_link *l, struct shm_pool *p, uint32_t idx, uint32_t len, uint16_t type,
		   uint32_t node, uint16_t stream, uint16_t flags)
{
	struct shm_desc d = { .off = shm_pool_buf_off(p, idx), .len = len, .type = type, .flags = flags,
			      .aux = DP_AUX(node, stream) };
	unsigned n;

	pthread_mutex_lock(&l->tx_mu);
	n = shm_ring_enqueue_burst(l->lane.q, &d, 1);
	pthread_mutex_unlock(&l->tx_mu);
	return n == 1 ? 0 : -EAGAIN;
}

int ctrl_pd_link_send_ctl(struct ctrl_pd_link *l, uint32_t node, const uint8_t *msg, size_t len)
{
	uint32_t idx;
	int rc;

	if (len == 0 || len > PD_SMALL_BYTES)
		return -EMSGSIZE;
	if (shm_pool_get(l->ps, &idx) != 0)
		return -EAGAIN;
	memcpy(shm_pool_buf(l->ps, idx), msg, len);
	rc = enqueue(l, l->ps, idx, (uint32_t)len, DP_MT_CONTROL, node, PD_STREAM_CTL,
		     give_crcs(l, l->ps, idx, (uint32_t)len));
	if (rc == 0)
		l->st.ctl_sent++;
	else
		shm_pool_put(l->ps, idx);
	return rc;
}

/* Completions: our buffers back; a failed send is counted (the rooms it
 * belonged to fail by their timeout or the peer's loss). */
static int drain_txc(struct ctrl_pd_link *l)
{
	struct shm_desc d[32];
	unsigned n;
	int moved = 0;

	if (!l->lane_open || pthread_mutex_trylock(&l->txc_mu) != 0)
		return 0; /* another thread is at it */
	while ((n = shm_ring_dequeue_burst(l->lane.c, d, 32)) > 0) {
		for (unsigned i = 0; i < n; i++) {
			int kv = d[i].type == DP_MT_KVPAGE;
			struct shm_pool *p = kv ? l->pl : l->ps;

			shm_pool_put(p, (uint32_t)shm_pool_idx_of(p, d[i].off));
			if (d[i].flags & DP_TXC_FAILED) {
				l->st.kv_failed += kv;
				l->st.ctl_failed += !kv;
			}
		}
		moved = 1;
	}
	pthread_mutex_unlock(&l->txc_mu);
	return moved;
}

/* ---- a chain stage as a page io, in batches ---- */

/* Page messages packed or landed per batch: one ctrl_chain_kv_copies(). */
#define PD_BATCH 16

/*
 * A page io (wk_kv_io) that only notes what a pack or an import asks of
 * the stage: the batch then goes to it in one ctrl_chain_kv_copies(), so
 * worker processes get one chain message for it, not one each (each waits
 * for the stage's running steps), and stages inside ctrld are held once.
 */
struct batch_io {
	struct ctrl_chain *c;
	int32_t stage;
	struct kn_kv_format mine;    /* the stage's format, read once */
	struct kn_kv_format theirs;  /* an import batch's format (one per batch) */
	int import;                  /* an import batch (ctrl_pd_link_poll), else an export one */
	struct ctrl_kv_copy v[PD_BATCH];
	int32_t (*ids)[WK_KVPAGE_MAX_BLOCKS]; /* an import batch's block ids (struct imports) */
	int32_t n;
	int rc;
	char err[96];
};

static int bi_format(void *arg, struct kn_kv_format *f)
{
	struct batch_io *x = arg;

	*f = x->mine;
	return 0;
}

static int bi_note(struct batch_io *x, const int32_t *blocks, int32_t n, void *buf, size_t len)
{
	if (x->n == PD_BATCH) {
		snprintf(x->err, sizeof(x->err), "the batch of stage %d is full", (int)x->stage);
		return x->rc = -EAGAIN;
	}
	x->v[x->n++] = (struct ctrl_kv_copy){ .blocks = blocks, .n = n, .buf = buf, .len = len };
	return 0;
}

static int bi_export(void *arg, const int32_t *blocks, int32_t n, void *dst, size_t len)
{
	return bi_note(arg, blocks, n, dst, len);
}

static int bi_import(void *arg, const int32_t *blocks, int32_t n, const void *src, size_t len,
		     const struct kn_kv_format *f)
{
	struct batch_io *x = arg;
	const struct kn_kv_format *t = &x->theirs;

	if (x->n == PD_BATCH)
		return bi_note(x, blocks, n, (void *)src, len); /* full: says so */
	if (x->n > 0 && (f->dtype != t->dtype || f->layer_start != t->layer_start || f->layer_end != t->layer_end
			 || f->n_kv_heads != t->n_kv_heads || f->head_dim != t->head_dim
			 || f->block_bytes != t->block_bytes)) {
		snprintf(x->err, sizeof(x->err), "the batch of stage %d holds pages of another format", (int)x->stage);
		return x->rc = -EAGAIN;
	}
	x->theirs = *f;
	/* the copy's block ids: wk_kvpage_import() reads them onto its stack */
	return bi_note(x, memcpy(x->ids[x->n], blocks, sizeof(int32_t) * (size_t)n), n, (void *)src, len);
}

static const char *bi_error(void *arg)
{
	struct batch_io *x = arg;

	return x->err;
}

static struct wk_kv_io batch_io(struct batch_io *x)
{
	return (struct wk_kv_io){ .format = bi_format, .export_pages = bi_export, .import_pages = bi_import,
				  .error = bi_error, .arg = x };
}

/* The batch to its stage. @return 0 or -errno (@p x->err says). */
static int bi_flush(struct batch_io *x)
{
	int rc = ctrl_chain_kv_copies(x->c, x->stage, x->import, x->v, x->n, x->import ? &x->theirs : NULL);

	if (rc < 0)
		snprintf(x->err, sizeof(x->err), "stage %d of the chain: %s", (int)x->stage, strerror(-rc));
	x->n = 0;
	return rc;
}

/* Hand one packed page message to the dataplane, waiting while its lane is full. */
static int send_page(struct ctrl_pd_link *l, uint32_t idx, uint32_t len, uint32_t node, uint16_t stream, char *err,
		     size_t errlen)
{
	double t0 = kvf_mono_s();
	uint64_t w0 = 0;
	uint16_t flags = give_crcs(l, l->pl, idx, len);

	while (enqueue(l, l->pl, idx, len, DP_MT_KVPAGE, node, stream, flags) == -EAGAIN) {
		if (w0 == 0)
			w0 = kvf_mono_ns();
		if (kvf_mono_s() - t0 > l->o.wait_s) {
			shm_pool_put(l->pl, idx);
			snprintf(err, errlen, "the dataplane's send ring stayed full");
			return -ETIMEDOUT;
		}
		drain_txc(l);
		usleep(50);
	}
	if (w0 != 0)
		l->st.lane_wait_ns += kvf_mono_ns() - w0;
	l->st.kv_sent++;
	l->st.kv_bytes_sent += len;
	return 0;
}

int ctrl_pd_link_ship(struct ctrl_pd_link *l, struct ctrl_chain *chain, int32_t n_stages, uint32_t node,
		      uint64_t room, uint32_t session, const int32_t *src, const uint32_t *dst, int32_t from,
		      int32_t to, int last, char *err, size_t errlen)
{
	for (int32_t k = 0; k < n_stages; k++) {
		struct batch_io x = { .c = chain, .stage = k };
		struct wk_kv_io io = batch_io(&x);
		int32_t per, done = from;
		uint32_t lens[PD_BATCH];
		int rc = ctrl_chain_kv_format(chain, k, &x.mine);

		if (rc < 0) {
			snprintf(err, errlen, "stage %d cannot export pages: %s", (int)k, strerror(-rc));
			return rc;
		}
		per = (int32_t)((l->o.large_bytes - sizeof(struct dp_kvpage_hdr)) / (4 + x.mine.block_bytes));
		if (per > WK_KVPAGE_MAX_BLOCKS)
			per = WK_KVPAGE_MAX_BLOCKS;
		if (per < 1) {
			snprintf(err, errlen, "one KV block of stage %d is %zu bytes; page buffers hold %zu", (int)k,
				 x.mine.block_bytes, l->o.large_bytes);
			return -EMSGSIZE;
		}
		while (done < to) {
			uint32_t idx[PD_BATCH];
			int32_t nb = 0, want = (to - done + per - 1) / per, at = done;
			double t0 = kvf_mono_s();
			uint64_t t_ex;

			/* the buffers first (waiting for the first one only), then
			 * the batch's exports in one go: each export on its own
			 * would wait for the stage's running step */
			if (want > PD_BATCH)
				want = PD_BATCH;
			while (shm_pool_get(l->pl, &idx[0]) != 0) {
				drain_txc(l);
				if (kvf_mono_s() - t0 > l->o.wait_s) {
					snprintf(err, errlen, "no page buffer came back from the dataplane in %.0f s",
						 l->o.wait_s);
					return -ETIMEDOUT;
				}
				usleep(50);
			}
			l->st.buf_wait_ns += (uint64_t)((kvf_mono_s() - t0) * 1e9);
			for (nb = 1; nb < want && shm_pool_get(l->pl, &idx[nb]) == 0; nb++)
				;
			for (int32_t b = 0; b < nb && rc == 0; b++) {
				int32_t m = to - at < per ? to - at : per;
				int64_t len = wk_kvpage_pack(&io, room, session, (uint32_t)at, last && at + m == to, src + at,
							     dst + at, m, shm_pool_buf(l->pl, idx[b]), l->o.large_bytes, err,
							     errlen);

				rc = len < 0 ? (int)len : 0;
				lens[b] = (uint32_t)(len < 0 ? 0 : len);
				at += m;
			}
			t_ex = kvf_mono_ns();
			if (rc == 0 && (rc = bi_flush(&x)) < 0)
				snprintf(err, errlen, "exporting room %llu's pages: %s", (unsigned long long)room, x.err);
			l->st.export_ns += kvf_mono_ns() - t_ex;
			if (rc < 0) {
				for (int32_t j = 0; j < nb; j++)
					shm_pool_put(l->pl, idx[j]);
				return rc;
			}
			for (int32_t b = 0; b < nb; b++) {
				/* each stage's pages are a stream of their own, which the
				 * decode node's dataplane may route to that stage's owner */
				rc = send_page(l, idx[b], lens[b], node, (uint16_t)(DP_STREAM_KV_STAGE + k), err, errlen);
				if (rc < 0) {
					for (int32_t j = b + 1; j < nb; j++)
						shm_pool_put(l->pl, idx[j]);
					return rc;
				}
			}
			done = at;
		}
	}
	return 0;
}

/* One put gives a received message back: its buffer, or its segment list and with it every frame. */
static void rx_put(struct ctrl_pd_link *l, const struct shm_desc *d)
{
	struct shm_pool *p = dp_ipc_rx_in_small(d->len, d->flags, shm_pool_bufsize(l->rxs)) ? l->rxs : l->rxl;

	shm_pool_put(p, (uint32_t)shm_pool_idx_of(p, d->off));
}

/* The messages just dequeued are ctrld's, from whom the dataplane passed
 * them to (this ctrld, or one before it that died): reclaimed by the
 * dataplane if it dies holding them. One whose pass fails went back to the
 * pool after that one died and is not ours to read (dp_ipc.h): left out.
 * @return the messages left in @p d. */
static unsigned rx_take(struct ctrl_pd_link *l, struct shm_desc *d, unsigned n)
{
	unsigned k = 0;

	for (unsigned i = 0; i < n; i++) {
		struct shm_pool *p = dp_ipc_rx_in_small(d[i].len, d[i].flags, shm_pool_bufsize(l->rxs)) ? l->rxs : l->rxl;
		int64_t idx = shm_pool_idx_of(p, d[i].off);

		if (idx >= 0 && shm_pool_pass(p, (uint32_t)idx, DP_AUX_HOLDER(d[i].aux), (int32_t)getpid()) < 0) {
			l->st.rx_stale++;
			continue;
		}
		d[k++] = d[i];
	}
	return k;
}

/*
 * A received message's bytes in one buffer: where the dataplane put a whole
 * message, or, received in place (a segment list, dp_ipc.h), gathered
 * (ctrld's copy, counted in rx_gathered_bytes: wk_kvpage_import() reads one
 * buffer) and checked to be still the delivering dataplane's. The gather
 * goes into one of the link's own large buffers, which lie in the region:
 * stages in worker processes copy KV pages only from there (in ctrld's heap
 * every such page was refused as outside the region and its room failed);
 * *@p held names it for rx_gathered_put(). With @p held NULL (a control
 * message, read here), when none is free, or the message is larger: into
 * @p scratch (in-process stages read pages there too).
 * @return the bytes, or NULL (the list is not valid, or its dataplane was
 *         replaced while it was read: the message is refused).
 */
static const void *rx_bytes(struct ctrl_pd_link *l, const struct shm_desc *d, uint8_t **scratch, size_t *cap,
			    uint32_t *held)
{
	const void *base = shm_region_base(l->reg);
	const struct dp_rx_seglist *sl;
	const struct dp_stats_shm *st;
	uint8_t *dst;
	uint64_t off;
	size_t size, room;
	uint32_t idx;

	if (held != NULL)
		*held = UINT32_MAX;
	if (!(d->flags & DP_RX_SEGMENTS))
		return shm_ptr(l->reg, d->off);
	if (l->mem.base != base) {
		uint64_t pk;
		size_t pk_size;

		dp_ipc_rx_mem_fini(&l->mem);
		dp_ipc_rx_mem_init(&l->mem, base, shm_region_size(l->reg),
				   shm_region_find_area(l->reg, DP_AREA_PKTMEM, &pk, &pk_size) == 0
				   && pk_size >= sizeof(struct dp_pktmem) ? shm_ptr(l->reg, pk) : NULL);
	}
	sl = dp_ipc_rx_seglist(&l->mem, d->off, d->len, shm_pool_bufsize(l->rxs));
	if (sl == NULL || shm_region_find_area(l->reg, DP_AREA_STATS, &off, &size) < 0 || size < sizeof(*st))
		return NULL;
	if (held != NULL && d->len <= shm_pool_bufsize(l->pl) && shm_pool_get(l->pl, &idx) == 0) {
		*held = idx;
		dst = shm_ptr(l->reg, shm_pool_buf_off(l->pl, idx));
		room = shm_pool_bufsize(l->pl);
	} else {
		if (*cap < d->len) {
			uint8_t *b = realloc(*scratch, d->len);

			if (b == NULL)
				return NULL;
			*scratch = b;
			*cap = d->len;
		}
		dst = *scratch;
		room = *cap;
	}
	st = shm_ptr(l->reg, off);
	if (dp_ipc_rx_gather(&l->mem, sl, dst, room) < 0 || !dp_ipc_rx_seglist_current(st, sl)) {
		if (held != NULL && *held != UINT32_MAX) {
			shm_pool_put(l->pl, *held);
			*held = UINT32_MAX;
		}
		return NULL;
	}
	l->st.rx_gathered_bytes += d->len;
	return dst;
}

/* The link's buffer a gather used (rx_bytes), back to its pool. */
static void rx_gathered_put(struct ctrl_pd_link *l, uint32_t held)
{
	if (held != UINT32_MAX)
		shm_pool_put(l->pl, held);
}

/* A page message in the import batch: what lands once the batch did, and
 * its buffers, given back after it. */
struct landing {
	uint64_t room;
	uint32_t session, n_blocks;
	int last;
	size_t len;
	struct shm_desc d; /* the received message */
	uint32_t held;     /* the link's buffer it was gathered into, or UINT32_MAX */
};

/* Received page messages waiting to land, one stage's at a time (a prefill
 * node sends a range's pages stage by stage). */
struct imports {
	struct batch_io x;
	struct landing land[PD_BATCH];
	int32_t ids[PD_BATCH][WK_KVPAGE_MAX_BLOCKS]; /* x.ids: each copy's block ids */
};

static void refuse(struct ctrl_pd_link *l, const struct ctrl_pd_link_handlers *h, uint64_t room, uint32_t session)
{
	char why[CTRL_CHAIN_ERRLEN];

	if (h->lost != NULL && h->chain != NULL && !ctrl_chain_ready(h->chain, why, sizeof(why))) {
		/* the stages went down under the import (or its format
		 * question): the request runs again here, not failed */
		l->st.kv_lost_down++;
		h->lost(h->arg, room, session, l->refusal);
		return;
	}
	l->st.kv_refused++;
	if (h->refused != NULL) /* the room cannot land: it fails now, not at its timeout */
		h->refused(h->arg, room, session, l->refusal);
}

/* The batch into its stage, then each of its rooms told (or failed: the
 * stage refused the batch), then their buffers back. */
static void land(struct ctrl_pd_link *l, const struct ctrl_pd_link_handlers *h, struct imports *im)
{
	int32_t n = im->x.n;
	int rc;

	uint64_t t0 = kvf_mono_ns();

	if (n == 0)
		return;
	rc = bi_flush(&im->x);
	l->st.import_ns += kvf_mono_ns() - t0;
	if (rc < 0)
		snprintf(l->refusal, sizeof(l->refusal), "importing %d page messages: %s", (int)n, im->x.err);
	for (int32_t i = 0; i < n; i++) {
		struct landing *g = &im->land[i];

		if (rc == 0) {
			l->st.kv_received++;
			l->st.kv_bytes_received += g->len;
			h->pages(h->arg, g->room, g->session, im->x.stage, g->last, g->n_blocks, g->len);
		} else {
			refuse(l, h, g->room, g->session);
		}
		rx_gathered_put(l, g->held);
		rx_put(l, &g->d);
	}
}

/*
 * One received page message: noted in the import batch of the stage whose
 * layers it carries (the batch lands first when it is full or another
 * stage's). @return 1 noted (its buffers are the batch's now), 0 refused
 * (the caller gives them back).
 */
static int take_pages(struct ctrl_pd_link *l, const struct ctrl_pd_link_handlers *h, struct imports *im,
		      const struct shm_desc *d, const void *buf, uint32_t held)
{
	struct dp_kvpage_fields f;
	struct wk_kvpage_info info;
	struct wk_kv_io io = batch_io(&im->x);
	char err[256];

	if (dp_kvpage_hdr_get(buf, d->len, &f) < 0 || h->chain == NULL) {
		snprintf(l->refusal, sizeof(l->refusal), "%s", h->chain == NULL ? "no chain takes KV pages here"
			 : "a KV page message with no valid header");
		l->st.kv_refused++;
		return 0;
	}
	if (h->expects == NULL || !h->expects(h->arg, f.room, f.session)) {
		snprintf(l->refusal, sizeof(l->refusal), "KV pages for room %llu (session %u), which no longer waits",
			 (unsigned long long)f.room, f.session);
		l->st.kv_refused++;
		return 0;
	}
	for (int32_t k = 0; k < h->n_stages; k++) {
		struct kn_kv_format mine;
		int rc;

		if (ctrl_chain_kv_format(h->chain, k, &mine) < 0 || mine.layer_start != f.layer_start)
			continue;
		if (im->x.n > 0 && (im->x.stage != k || im->x.c != h->chain))
			land(l, h, im);
		im->x.c = h->chain;
		im->x.stage = k;
		im->x.mine = mine;
		im->x.import = 1;
		im->x.ids = im->ids;
		for (int again = 1;; again = 0) {
			im->x.rc = 0;
			rc = wk_kvpage_import(&io, buf, d->len, &info, err, sizeof(err));
			if (rc == 0 || im->x.rc != -EAGAIN || !again)
				break;
			land(l, h, im); /* full, or pages of another format: the batch lands first */
		}
		if (rc < 0) {
			snprintf(l->refusal, sizeof(l->refusal), "%s", err);
			refuse(l, h, f.room, f.session);
			return 0;
		}
		im->land[im->x.n - 1] = (struct landing){ .room = info.room, .session = info.session,
							  .n_blocks = info.n_blocks, .last = info.last, .len = d->len,
							  .d = *d, .held = held };
		return 1;
	}
	snprintf(l->refusal, sizeof(l->refusal), "KV pages of layers [%d,%d): no stage here starts at layer %d: "
		 "split the model into the same stages on both nodes", (int)f.layer_start, (int)f.layer_end,
		 (int)f.layer_start);
	refuse(l, h, f.room, f.session);
	return 0;
}

/* What the stages that take their own pages (ctrl_chain_kv_rxroute()) say
 * they landed: the rooms hear it as from pages ctrld landed. @return 1 if any. */
static int landed(struct ctrl_pd_link *l, const struct ctrl_pd_link_handlers *h)
{
	struct ctrl_kv_landing g[32];
	int any = 0, n;

	for (int32_t k = 0; k < h->n_stages; k++)
		while ((n = ctrl_chain_kv_landed(h->chain, k, g, 32)) > 0) {
			any = 1;
			for (int i = 0; i < n; i++) {
				if (g[i].refused) {
					snprintf(l->refusal, sizeof(l->refusal), "stage %d refused a KV page message of "
						 "room %llu (its worker's log says why)", (int)k,
						 (unsigned long long)g[i].room);
					refuse(l, h, g[i].room, g[i].session);
					continue;
				}
				l->st.kv_received++;
				l->st.kv_landed_by_stages++;
				l->st.kv_landed_in_place += g[i].in_place != 0;
				l->st.kv_bytes_received += g[i].bytes;
				h->pages(h->arg, g[i].room, g[i].session, k, g[i].last, g[i].n_blocks, g[i].bytes);
			}
		}
	return any;
}

int ctrl_pd_link_poll(struct ctrl_pd_link *l, const struct ctrl_pd_link_handlers *h)
{
	/* the gather buffer of messages received in place (one poller per thread) */
	static _Thread_local uint8_t *scratch;
	static _Thread_local size_t cap;
	static _Thread_local const struct shm_region *declared;
	static _Thread_local struct imports im;
	struct shm_desc d[32];
	unsigned n;
	int moved = drain_txc(l);
	uint64_t burst = 0;

	if (declared != l->reg) {
		/* ctrld reads segment lists on its two rings: a dataplane that
		 * receives in place hands it PD messages without copying them */
		uint64_t off;

		if (shm_region_find_area(l->reg, DP_AREA_RXSEG, &off, NULL) == 0) {
			dp_ipc_rx_declare(shm_ptr(l->reg, off), DP_RX_RING_CTL, (int32_t)getpid());
			dp_ipc_rx_declare(shm_ptr(l->reg, off), DP_RX_RING_KV, (int32_t)getpid());
		}
		/* and consumes them: the dataplane passes their buffers to ctrld */
		if (shm_region_find_area(l->reg, DP_AREA_RXOWN, &off, NULL) == 0) {
			dp_ipc_rx_own(shm_ptr(l->reg, off), DP_RX_RING_CTL, (int32_t)getpid(), 0);
			dp_ipc_rx_own(shm_ptr(l->reg, off), DP_RX_RING_KV, (int32_t)getpid(), 0);
		}
		declared = l->reg;
	}
	while ((n = shm_ring_dequeue_burst(l->rx_ctl, d, 32)) > 0) {
		n = rx_take(l, d, n);
		for (unsigned i = 0; i < n; i++) {
			const void *b = rx_bytes(l, &d[i], &scratch, &cap, NULL);

			l->st.ctl_received++;
			if (b != NULL && h->control != NULL)
				h->control(h->arg, DP_AUX_PEER(d[i].aux), b, d[i].len);
			rx_put(l, &d[i]);
		}
		moved = 1;
	}
	while ((n = shm_ring_dequeue_burst(l->rx_kv, d, 32)) > 0) {
		/* a burst's pages land in batches (land()): one chain call per
		 * batch, not per message */
		n = rx_take(l, d, n);
		burst += n;
		for (unsigned i = 0; i < n; i++) {
			uint32_t held;
			const void *b = rx_bytes(l, &d[i], &scratch, &cap, &held);

			if (b == NULL) {
				snprintf(l->refusal, sizeof(l->refusal), "a KV page message received in place whose "
					 "segment list is not valid or whose dataplane restarted while it was read");
				l->st.kv_refused++;
			} else if (take_pages(l, h, &im, &d[i], b, held)) {
				if (b == scratch)
					land(l, h, &im); /* the scratch buffer serves the next message */
				continue;
			}
			rx_gathered_put(l, held);
			rx_put(l, &d[i]);
		}
		land(l, h, &im);
		moved = 1;
	}
	if (burst > l->st.kv_burst_max)
		l->st.kv_burst_max = burst;
	if (l->rooms != NULL && h->chain != NULL && landed(l, h))
		moved = 1;
	return moved;
}

void ctrl_pd_link_wait(struct ctrl_pd_link *l, int64_t timeout_ns)
{
	shm_ring_wait(l->rx_ctl, timeout_ns);
}

void ctrl_pd_link_stats(const struct ctrl_pd_link *l, struct ctrl_pd_link_stats *st)
{
	*st = l->st;
}

struct shm_region *ctrl_pd_link_region(const struct ctrl_pd_link *l)
{
	return l != NULL ? l->reg : NULL;
}

int32_t ctrl_pd_link_self_node(const struct ctrl_pd_link *l)
{
	uint64_t off;
	size_t size;
	const struct dp_stats_shm *st;

	if (shm_region_find_area(l->reg, DP_AREA_STATS, &off, &size) < 0 || size < sizeof(*st))
		return -1;
	st = shm_ptr(l->reg, off);
	return st->magic == DP_STATS_MAGIC ? (int32_t)st->self_node : -1;
}

int ctrl_pd_link_peer(const struct ctrl_pd_link *l, uint32_t node, uint64_t *epoch, uint64_t *silent_ms)
{
	const struct dp_stats_shm *st;
	uint64_t off;
	size_t size;

	if (l == NULL || shm_region_find_area(l->reg, DP_AREA_STATS, &off, &size) < 0 || size < sizeof(*st))
		return -ENOENT;
	st = shm_ptr(l->reg, off);
	if (st->magic != DP_STATS_MAGIC)
		return -ENOENT;
	for (uint32_t i = 0; i < st->n_peers && i < DP_MAX_PEERS; i++) {
		const struct dp_peer_stats *p = &st->peer[i];

		if (__atomic_load_n(&p->node, __ATOMIC_RELAXED) != node)
			continue;
		*epoch = __atomic_load_n(&p->epoch, __ATOMIC_RELAXED);
		*silent_ms = __atomic_load_n(&p->silent, __ATOMIC_RELAXED)
				     ? __atomic_load_n(&p->heard_ago_ms, __ATOMIC_RELAXED) : 0;
		return 0;
	}
	return -ENOENT;
}

const char *ctrl_pd_link_last_refusal(const struct ctrl_pd_link *l)
{
	return l->refusal;
}

int ctrl_pd_link_rooms_open(struct ctrl_pd_link *l)
{
	uint64_t off;
	size_t size;
	int rc;

	if (l->rooms != NULL)
		return 0;
	if (shm_region_find_area(l->reg, DP_AREA_RXROUTE, &off, &size) < 0 || size < sizeof(*l->route))
		return -ENOTSUP; /* a dataplane that routes no stream */
	l->route = shm_ptr(l->reg, off);
	rc = shm_region_add_area(l->reg, SHM_MB_KVROOMS_AREA, sizeof(*l->rooms), 64, SHM_AREA_RAW, &off);
	if (rc < 0 && rc != -EEXIST)
		return rc;
	if (rc == -EEXIST && (shm_region_find_area(l->reg, SHM_MB_KVROOMS_AREA, &off, &size) < 0
			      || size < sizeof(*l->rooms)))
		return -EPROTO;
	l->rooms = shm_ptr(l->reg, off);
	/* ours alone (a ctrld before us on this region left rooms its successor does not know) */
	for (uint32_t i = 0; i < SHM_MB_KVROOMS_SLOTS; i++)
		__atomic_store_n(&l->rooms->slot[i].open, 0u, __ATOMIC_SEQ_CST);
	l->rooms->n_slots = SHM_MB_KVROOMS_SLOTS;
	__atomic_store_n(&l->rooms->magic, SHM_MB_KVROOMS_MAGIC, __ATOMIC_RELEASE);
	return 0;
}

int32_t ctrl_pd_link_route_pid(const struct ctrl_pd_link *l, uint32_t stream)
{
	if (l->route == NULL || stream >= DP_MAX_STREAMS)
		return 0;
	return __atomic_load_n(&l->route->ent[stream].pid, __ATOMIC_ACQUIRE);
}

int ctrl_pd_link_room_gate(struct ctrl_pd_link *l, uint64_t room, uint32_t session, int open)
{
	struct shm_mb_kvrooms *r = l->rooms;
	uint64_t t0;

	if (r == NULL)
		return 0;
	if (open) {
		for (uint32_t i = 0; i < SHM_MB_KVROOMS_SLOTS; i++) {
			if (__atomic_load_n(&r->slot[i].open, __ATOMIC_RELAXED))
				continue;
			r->slot[i].room = room;
			r->slot[i].session = session;
			__atomic_store_n(&r->slot[i].open, 1u, __ATOMIC_SEQ_CST);
			return 0;
		}
		l->st.rooms_gate_full++;
		return -ENOSPC; /* its pages are refused by the stages: the room fails, named */
	}
	for (uint32_t i = 0; i < SHM_MB_KVROOMS_SLOTS; i++)
		if (__atomic_load_n(&r->slot[i].open, __ATOMIC_RELAXED) && r->slot[i].room == room)
			__atomic_store_n(&r->slot[i].open, 0u, __ATOMIC_SEQ_CST);
	/* a stage importing this room's page now finishes it before the room's
	 * blocks may go to another request (shm_mb.h); a dead one writes nothing */
	t0 = kvf_mono_ns();
	for (int k = 0; k < SHM_MB_MAX_STAGES; k++) {
		while (__atomic_load_n(&r->busy[k].on, __ATOMIC_SEQ_CST)
		       && __atomic_load_n(&r->busy[k].room, __ATOMIC_SEQ_CST) == room) {
			int32_t pid = __atomic_load_n(&r->busy[k].pid, __ATOMIC_RELAXED);

			if ((pid > 0 && kill(pid, 0) < 0 && errno == ESRCH) || kvf_mono_ns() - t0 > 5000000000ull) {
				l->st.rooms_gate_stuck++;
				break;
			}
			usleep(20);
		}
	}
	return 0;
}
