/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Test and bench client of kvferry-dataplane that uses only the shm rings
 * and pools of dp_ipc.h, as a worker or ctrld would.
 *   send: message k (k = 0..count-1) goes to stream k % streams, its size and
 *         bytes derived from (seed, k); completions must come back in order
 *         per stream.
 *   recv: expects exactly those messages, in order per stream, byte-identical.
 *         It declares that it reads segment lists (dp_ipc.h), so a dataplane
 *         that receives in place hands it messages as the frames where the
 *         driver put them, which it compares where they lie: no copy
 *         (--whole: it does not declare, and gets whole messages).
 *         --die-holding N: take N messages, keep them and SIGKILL itself
 *         (what a dead consumer leaves, for the dataplane to reclaim).
 *         --hold: keep every message it takes (a consumer that stalls
 *         holding what it was given), and once it has them all, say so
 *         and wait for SIGTERM before it gives them back.
 *         --route: KV pages of its streams on a ring of its own (a receive
 *         route, dp_ipc.h, as a decode worker makes), each buffer taken
 *         from the pid the dataplane passed it to (without --route, it
 *         names itself its ring's owner, and the same holds). --die-dequeued
 *         N: SIGKILL itself once it dequeued N messages, before it took any
 *         (the window the pass closes). --replaced (with --die-dequeued,
 *         without --route): not in the liveness table, and it names its
 *         parent the ring's owner just before it dies, as a consumer
 *         started again at once replaces a dead one before the dataplane
 *         saw the death.
 * Prints one summary line; exits 0 on success, 1 on failure, 77 if the
 * region is absent.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dp_crc32c.h"
#include "dp_ipc.h"
#include "dp_tx_lane.h"
#include "shm_live.h"
#include "shm_pool.h"
#include "shm_region.h"
#include "shm_ring.h"

static volatile sig_atomic_t g_stop;
static void on_sig(int s)
{
	(void)s;
	g_stop = 1;
}

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

struct cfg {
	const char *region;
	int send, recv, verify, until_stop;
	unsigned peer, streams, inflight;
	uint64_t count, seed;
	uint32_t fixed; /* 0: skewed random sizes */
	unsigned type;  /* DP_MT_MBATCH (default), DP_MT_KVPAGE or DP_MT_CONTROL: picks the rings */
	double timeout_s;
	int whole;      /* recv: do not declare that it reads segment lists */
	unsigned die_holding; /* recv: SIGKILL itself holding this many messages */
	int hold;             /* recv: give nothing back until SIGTERM */
	int route;            /* recv --type kv: its streams routed to a ring of its own */
	unsigned die_dequeued; /* recv --route: SIGKILL itself once it dequeued this many, before taking them */
	int replaced;          /* with die_dequeued: a live successor owns the ring when it dies */
	const char *pools;    /* send: the name of its buffer pools (NAME.s, NAME.l) */
	int check;            /* 'L': the send lanes, 'P': the pools (below) */
	int drain;            /* send: on SIGTERM, wait for what is in flight to complete */
	int crcs;             /* send: give the dataplane each frame's payload CRC (DP_TX_CRCS) */
	uint32_t crcs_stride; /* send: ... at this stride, not the dataplane's (a stale one: refused) */
	int crcs_nomagic;     /* send: ... behind a trailer whose magic is wrong (refused) */
};

static uint32_t msg_size(const struct cfg *c, uint64_t k)
{
	if (c->fixed)
		return c->fixed;
	uint64_t r = mix(c->seed ^ (k * 0x100000001b3ull));
	uint64_t u = r % 1000, v = r >> 20;
	/* skewed to small: 90% up to 4 KiB, 9.7% up to 256 KiB, 0.3% up to 4 MiB */
	if (u < 900)
		return (uint32_t)(v % 4096) + 1;
	if (u < 997)
		return (uint32_t)(v % (256 * 1024)) + 1;
	return (uint32_t)(v % (4 * 1024 * 1024)) + 1;
}

static void fill(const struct cfg *c, uint64_t k, uint8_t *p, uint32_t len)
{
	uint64_t x = mix(c->seed * 31 + k);
	uint32_t i = 0;
	for (; i + 8 <= len; i += 8) {
		x = mix(x);
		memcpy(p + i, &x, 8);
	}
	x = mix(x);
	for (; i < len; i++)
		p[i] = (uint8_t)(x >> (8 * (i & 7)));
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* @p writes: this sender fills its buffers (verified messages), so a pool
 * of smaller buffers another sender made would be overrun. */
static struct shm_pool *pool_get(struct shm_region *r, const char *name, uint32_t n, size_t sz, int writes)
{
	struct shm_pool *p = shm_pool_create(r, name, n, sz);
	if (!p && errno == EEXIST)
		p = shm_pool_lookup(r, name);
	if (!p)
		fprintf(stderr, "shm_pool_create(%s, %u x %zu) failed: %s\n", name, n, sz,
			strerror(errno));
	if (p && writes && shm_pool_bufsize(p) < sz) {
		/* made by an earlier sender for smaller messages (--fixed): ours would overrun them */
		fprintf(stderr, "pool %s holds buffers of %zu B, not %zu: give this sender other --pools\n", name,
			shm_pool_bufsize(p), sz);
		shm_pool_close(p);
		return NULL;
	}
	return p;
}

static void drain_events(struct shm_ring *ev, uint64_t *failed_reported, uint64_t *restarts,
			 uint64_t ok)
{
	struct shm_desc e[8];
	unsigned n;
	while ((n = shm_ring_dequeue_burst(ev, e, 8)))
		for (unsigned i = 0; i < n; i++) {
			printf("event type %u peer %u epoch %llu failed %u ok_so_far %llu\n", e[i].type,
			       DP_AUX_PEER(e[i].aux), (unsigned long long)e[i].seq, e[i].len,
			       (unsigned long long)ok);
			fflush(stdout);
			if (e[i].type == DP_EV_PEER_RESTART || e[i].type == DP_EV_PEER_DEAD) {
				*failed_reported += e[i].len;
				(*restarts)++;
			}
		}
}

static struct shm_ring *ring_wait(struct shm_region *r, const char *name)
{
	/* The dataplane creates its rings after the region: wait up to 20 s. */
	for (int i = 0; i < 200; i++) {
		struct shm_ring *q = shm_ring_lookup(r, name);
		if (q)
			return q;
		usleep(100000);
	}
	return NULL;
}

/* The receive ring of a message type (dp_ipc.h). */
static const char *rx_name(unsigned type)
{
	return type == DP_MT_KVPAGE ? DP_RING_RX_KV : type == DP_MT_CONTROL ? DP_RING_RX_CTL : DP_RING_RX;
}

/* This node's dataplane's copy counters (its stats area: dp_ipc.h). */
struct copies {
	double copy_tx, copy_rx, crc, drv_tx, drv_rx;
};

static int read_copies(struct shm_region *r, struct copies *k)
{
	uint64_t off;
	size_t size;
	const struct dp_stats_shm *st;
	uint64_t rx_frames_bytes = 0;

	memset(k, 0, sizeof(*k));
	if (shm_region_find_area(r, DP_AREA_STATS, &off, &size) < 0 || size < sizeof(*st))
		return -1;
	st = shm_ptr(r, off);
	if (st->magic != DP_STATS_MAGIC || st->version != DP_STATS_VERSION)
		return -1;
	for (uint32_t i = 0; i < st->n_peers && i < DP_MAX_PEERS; i++)
		rx_frames_bytes += st->peer[i].rx_bytes;
	k->copy_tx = (double)st->copy_tx_bytes;
	k->copy_rx = (double)st->copy_rx_bytes;
	k->crc = (double)st->crc_read_bytes;
	k->drv_tx = (double)st->pmd_tx_copies * (double)st->payload_tx_bytes;
	k->drv_rx = (double)st->pmd_rx_copies * (double)rx_frames_bytes;
	return 0;
}

/* What the dataplane copied and read since @p k0, per payload byte the
 * client moved, for dp-bench's copies column. */
static void print_copies(const char *who, struct shm_region *r, const struct copies *k0, uint64_t bytes)
{
	struct copies k;

	if (!bytes || read_copies(r, &k) < 0)
		return;
	double b = (double)bytes;
	printf("copies %s: per payload byte: dataplane copy tx %.3f rx %.3f, CRC pass %.3f, driver tx %.3f rx %.3f\n",
	       who, (k.copy_tx - k0->copy_tx) / b, (k.copy_rx - k0->copy_rx) / b, (k.crc - k0->crc) / b,
	       (k.drv_tx - k0->drv_tx) / b, (k.drv_rx - k0->drv_rx) / b);
}

/* A sender's cookies carry its pid above SEQ_MASK: its lane's completion
 * ring must never hand it one of another sender's (a killed predecessor's
 * on the same lane, say). */
#define SEQ_MASK ((1ull << 40) - 1)

static int do_send(const struct cfg *c, struct shm_region *r)
{
	const uint64_t tag = (uint64_t)getpid() << 40;
	struct shm_ring *ev = ring_wait(r, DP_RING_EV);
	char ns[64], nl[64];
	snprintf(ns, sizeof(ns), "%s.s", c->pools);
	snprintf(nl, sizeof(nl), "%s.l", c->pools);
	struct dp_tx_lane lane = {.lane = -1};
	char err[256] = "";
	/* the lanes area comes last in the dataplane's set-up: up to 20 s more */
	for (int i = 0; ev && i < 200; i++) {
		if (dp_tx_lane_open(r, &lane, err, sizeof(err)) != -ENOENT)
			break;
		usleep(100000);
	}
	/* --crcs: the payload CRC of each frame, computed here where the
	 * message is written, behind it (dp_ipc.h, DP_TX_CRCS); none where the
	 * dataplane sends no payload CRC (stride 0) */
	uint32_t stride = c->crcs_stride ? c->crcs_stride : c->crcs ? dp_ipc_tx_crc_stride(lane.t) : 0;
	size_t small = 64 * 1024;
	/* messages of a fixed size need no buffers larger than that */
	size_t large = c->fixed ? (c->fixed > small ? c->fixed : small) : 4 * 1024 * 1024;
	struct shm_pool *ps = pool_get(r, ns, 256, dp_ipc_tx_crcs_room((uint32_t)small, stride), c->verify || stride);
	struct shm_pool *pl = pool_get(r, nl, 24, dp_ipc_tx_crcs_room((uint32_t)large, stride), c->verify || stride);
	/* the length each buffer's trailer holds the CRCs of, + 1 (0: none), where
	 * nothing writes the payload (--no-verify: the bytes never change) */
	uint32_t n_small = ps ? shm_pool_count(ps) : 0, *crcs_for = calloc(n_small + (pl ? shm_pool_count(pl) : 0) + 1,
									     sizeof(uint32_t));
	uint64_t crc_msgs = 0;
	struct shm_ring *tx = lane.q, *txc = lane.c;
	if (!tx || !txc || !ev || !ps || !pl || !crcs_for) {
		fprintf(stderr, "send: rings/pools missing in region %s %s\n", c->region, err);
		free(crcs_for);
		return 1;
	}
	uint64_t *next_done = calloc(c->streams, sizeof(uint64_t));
	for (unsigned s = 0; s < c->streams; s++)
		next_done[s] = s;
	uint64_t k = 0, ok = 0, failed = 0, bytes = 0, out = 0, failed_rep = 0, restarts = 0;
	int bad = 0;
	struct copies k0;
	read_copies(r, &k0);
	double t0 = now_s(), last_progress = t0;
	while (!g_stop || (c->drain && out > 0)) {
		int work = 0;
		while (!g_stop && (c->until_stop || k < c->count) && out < c->inflight) {
			uint32_t len = msg_size(c, k);
			struct shm_pool *p = len <= 64 * 1024 ? ps : pl;
			uint32_t idx;
			if (shm_pool_get(p, &idx))
				break;
			uint8_t *buf = shm_pool_buf(p, idx);
			uint32_t *cf = &crcs_for[(p == ps ? 0 : n_small) + idx];
			if (c->verify)
				fill(c, k, buf, len);
			if (stride && (c->verify || *cf != len + 1)) {
				dp_ipc_tx_crcs_fill(buf, len, stride, 0, UINT32_MAX);
				if (c->crcs_nomagic) /* a trailer some other writer left */
					((struct dp_tx_crcs *)(buf + dp_ipc_tx_crcs_off(len)))->magic = 0;
				*cf = len + 1;
			}
			struct shm_desc d = {.off = shm_pool_buf_off(p, idx), .len = len,
					     .type = (uint16_t)c->type, .seq = k | tag,
					     .flags = (uint16_t)(stride ? DP_TX_CRCS : 0),
					     .aux = DP_AUX(c->peer, k % c->streams)};
			if (shm_ring_enqueue_burst(tx, &d, 1) != 1) {
				shm_pool_put(p, idx);
				break;
			}
			crc_msgs += stride != 0;
			k++;
			out++;
			work = 1;
		}
		struct shm_desc d[32];
		unsigned n = shm_ring_dequeue_burst(txc, d, 32);
		for (unsigned i = 0; i < n; i++) {
			struct shm_pool *p = d[i].len <= 64 * 1024 ? ps : pl;
			shm_pool_put(p, (uint32_t)shm_pool_idx_of(p, d[i].off));
			if ((d[i].seq & ~SEQ_MASK) != tag) {
				fprintf(stderr, "send: the completion of another sender's message (pid %llu) on my lane\n",
					(unsigned long long)(d[i].seq >> 40));
				bad = 1;
				continue;
			}
			d[i].seq &= SEQ_MASK;
			unsigned s = DP_AUX_STREAM(d[i].aux);
			if (d[i].flags & DP_TXC_FAILED) {
				failed++;
			} else {
				ok++;
				bytes += d[i].len;
			}
			/* completions (ok or failed) come back in submission order per stream */
			if (s >= c->streams || d[i].seq != next_done[s]) {
				fprintf(stderr, "send: completion of message %llu on stream %u, expected %llu\n",
					(unsigned long long)d[i].seq, s, (unsigned long long)next_done[s]);
				bad = 1;
			} else {
				next_done[s] += c->streams;
			}
			out--;
			work = 1;
		}
		drain_events(ev, &failed_rep, &restarts, ok);
		double t = now_s();
		if (work)
			last_progress = t;
		if (!c->until_stop && k == c->count && out == 0)
			break;
		if (t - last_progress > c->timeout_s) {
			fprintf(stderr, "send: no progress for %.0f s (sent %llu, outstanding %llu)\n",
				c->timeout_s, (unsigned long long)k, (unsigned long long)out);
			bad = 1;
			break;
		}
		if (!work)
			usleep(20);
	}
	double dt = now_s() - t0;
	drain_events(ev, &failed_rep, &restarts, ok);
	printf("send: %llu ok, %llu failed (events reported %llu failed, %llu restarts), %llu bytes, "
	       "%.3f s, %.3f GB/s, %.0f msg/s\n",
	       (unsigned long long)ok, (unsigned long long)failed, (unsigned long long)failed_rep,
	       (unsigned long long)restarts, (unsigned long long)bytes, dt, bytes / dt / 1e9, ok / dt);
	print_copies("send", r, &k0, bytes);
	if (c->crcs)
		printf("send: %llu of %llu messages with their payload CRCs (stride %u)\n", (unsigned long long)crc_msgs,
		       (unsigned long long)k, stride);
	free(crcs_for);
	if (!c->until_stop && failed)
		bad = 1;
	if (c->until_stop && failed != failed_rep) {
		fprintf(stderr, "send: %llu completions failed but events reported %llu\n",
			(unsigned long long)failed, (unsigned long long)failed_rep);
		bad = 1;
	}
	free(next_done);
	return bad;
}

/* Compare message @p k (@p want bytes, generated into @p scratch) with the
 * descriptor's bytes where they lie. @return 0 if identical, 1 if they
 * differ, -1 if a segment list is not valid. */
static int compare(const struct cfg *c, struct shm_region *r, struct dp_rx_mem *mem, const struct shm_desc *d,
		   size_t small, uint64_t k, uint8_t *scratch, uint32_t want)
{
	fill(c, k, scratch, want);
	if (!(d->flags & DP_RX_SEGMENTS))
		return memcmp(scratch, shm_ptr(r, d->off), want) != 0;
	const struct dp_rx_seglist *sl = dp_ipc_rx_seglist(mem, d->off, d->len, small);
	if (sl == NULL)
		return -1;
	size_t at = 0;
	for (uint32_t i = 0; i < sl->n_segs; i++) {
		uint32_t n;
		const void *p = dp_ipc_rx_seg(mem, sl, i, &n);

		if (memcmp(scratch + at, p, n))
			return 1;
		at += n;
	}
	return 0;
}

static int do_recv(const struct cfg *c, struct shm_region *r)
{
	struct shm_ring *rx = ring_wait(r, rx_name(c->type));
	usleep(100000); /* pools follow the rings */
	struct shm_pool *ps = shm_pool_lookup(r, DP_POOL_RX_SMALL);
	struct shm_pool *pl = shm_pool_lookup(r, DP_POOL_RX_LARGE);
	if (!rx || !ps || !pl) {
		fprintf(stderr, "recv: rings/pools missing in region %s\n", c->region);
		return 1;
	}
	struct dp_rxroute *route = NULL;
	char rname[32];
	if (c->route) {
		/* its own ring, holding every receive buffer, several consumers
		 * (the dataplane drains it if this one dies); then each stream */
		uint64_t ro;
		snprintf(rname, sizeof(rname), "dpc.rt.%d", (int)getpid());
		shm_ring_close(rx);
		rx = shm_ring_create(r, rname, shm_pool_count(ps) + shm_pool_count(pl) + 1, sizeof(struct shm_desc),
				     SHM_RING_MC);
		if (rx == NULL || shm_region_find_area(r, DP_AREA_RXROUTE, &ro, NULL) < 0) {
			fprintf(stderr, "recv: no ring %s or no route area in region %s\n", rname, c->region);
			return 1;
		}
		route = shm_ptr(r, ro);
	}
	uint64_t *next = calloc(c->streams, sizeof(uint64_t));
	for (unsigned s = 0; s < c->streams; s++)
		next[s] = s;
	uint8_t *scratch = malloc(4 * 1024 * 1024);
	struct held {
		struct shm_pool *pool;
		uint32_t idx;
	} *held = c->hold ? calloc(c->count, sizeof(*held)) : NULL;
	uint64_t n_held = 0;
	if (c->hold && held == NULL) {
		free(scratch);
		free(next);
		return 1;
	}
	uint64_t got = 0, bytes = 0, in_place = 0, lists_bad = 0;
	int bad = 0;
	struct copies k0;
	struct dp_rxseg_decl *decl = NULL;
	uint64_t off;
	size_t small = shm_pool_bufsize(ps);
	enum dp_rx_ring ring = dp_ipc_rx_ring_of(c->type);
	/* in the liveness table, so that what it holds when it dies goes back */
	int live = c->replaced ? -1 : shm_live_register(r, "dp_client");
	if (c->die_holding || c->die_dequeued)
		usleep(200000); /* the dataplane reads the table every 50 ms: let it see this pid alive */
	for (unsigned s = 0; route != NULL && s < c->streams; s++)
		if (dp_ipc_rx_route(route, s, rname, "", (int32_t)getpid(), !c->whole) < 0) {
			fprintf(stderr, "recv: cannot route stream %u to %s\n", s, rname);
			return 1;
		}
	/* the ring's consumer: the dataplane passes each buffer to this pid */
	struct dp_rxown *own = NULL;
	if (route == NULL && shm_region_find_area(r, DP_AREA_RXOWN, &off, NULL) == 0) {
		own = shm_ptr(r, off);
		dp_ipc_rx_own(own, ring, (int32_t)getpid(), 0);
	}
	if (!c->whole && shm_region_find_area(r, DP_AREA_RXSEG, &off, NULL) == 0) {
		decl = shm_ptr(r, off);
		if (dp_ipc_rx_declare(decl, ring, (int32_t)getpid()) < 0)
			decl = NULL;
	}
	/* segments may lie in the dataplane's packet memory (a zero-copy memif client) */
	struct dp_rx_mem mem;
	size_t pk_size;
	dp_ipc_rx_mem_init(&mem, shm_region_base(r), shm_region_size(r),
			   shm_region_find_area(r, DP_AREA_PKTMEM, &off, &pk_size) == 0 && pk_size >= sizeof(struct dp_pktmem)
			   ? shm_ptr(r, off) : NULL);
	read_copies(r, &k0);
	/* the counters are read: a script may start the sender now */
	printf("recv: ready\n");
	fflush(stdout);
	double t0 = 0, last = now_s();
	while (!g_stop && (c->until_stop || got < c->count)) {
		struct shm_desc d[32];
		unsigned n = shm_ring_dequeue_burst(rx, d, 32);
		if (c->die_dequeued && got + n >= c->die_dequeued) {
			printf("recv: dequeued %llu messages, killing myself before taking them (pid %d)\n",
			       (unsigned long long)(got + n), (int)getpid());
			fflush(stdout);
			if (c->replaced && own != NULL)
				dp_ipc_rx_own(own, ring, (int32_t)getppid(), 0);
			kill(getpid(), SIGKILL);
		}
		for (unsigned i = 0; i < n; i++) {
			struct shm_pool *pool = dp_ipc_rx_in_small(d[i].len, d[i].flags, small) ? ps : pl;
			int64_t idx = shm_pool_idx_of(pool, d[i].off);
			if (idx >= 0 && shm_pool_pass(pool, (uint32_t)idx, DP_AUX_HOLDER(d[i].aux), (int32_t)getpid()) < 0
			    && DP_AUX_HOLDER(d[i].aux) != 0) {
				fprintf(stderr, "recv: a message's buffer was not held by pid %d, whom it was passed to\n",
					(int)DP_AUX_HOLDER(d[i].aux));
				bad = 1;
			}
		}
		if (c->die_holding && got + n >= c->die_holding) {
			printf("recv: holding %llu messages, killing myself (pid %d)\n",
			       (unsigned long long)(got + n), (int)getpid());
			fflush(stdout);
			kill(getpid(), SIGKILL);
		}
		for (unsigned i = 0; i < n; i++) {
			if (!t0)
				t0 = now_s();
			unsigned s = DP_AUX_STREAM(d[i].aux);
			in_place += (d[i].flags & DP_RX_SEGMENTS) != 0;
			if ((d[i].flags & DP_RX_SEGMENTS) && (c->whole || decl == NULL)) {
				fprintf(stderr, "recv: a segment list on a ring whose consumer never declared it reads them\n");
				bad = 1;
			}
			if ((d[i].flags & DP_RX_SEGMENTS) && (!c->verify || c->until_stop)
			    && dp_ipc_rx_seglist(&mem, d[i].off, d[i].len, small) == NULL)
				lists_bad++; /* unread, a list is still checked: where it lies is mapped */
			if (c->verify && !c->until_stop) {
				uint64_t k = s < c->streams ? next[s] : UINT64_MAX;
				uint32_t want = k < c->count ? msg_size(c, k) : 0;
				if (DP_AUX_PEER(d[i].aux) != c->peer || k >= c->count || d[i].len != want) {
					fprintf(stderr, "recv: stream %u: got %u bytes, expected message %llu "
						"of %u bytes\n", s, d[i].len, (unsigned long long)k, want);
					bad = 1;
				} else {
					int rc = compare(c, r, &mem, &d[i], small, k, scratch, want);
					if (rc) {
						fprintf(stderr, "recv: message %llu %s\n", (unsigned long long)k,
							rc < 0 ? "came with a segment list that is not valid" : "differs");
						bad = 1;
					}
					next[s] += c->streams;
				}
			}
			/* one put gives back a whole message, segment list or buffer */
			struct shm_pool *pool = dp_ipc_rx_in_small(d[i].len, d[i].flags, small) ? ps : pl;
			if (c->hold && n_held < c->count)
				held[n_held++] = (struct held){ pool, (uint32_t)shm_pool_idx_of(pool, d[i].off) };
			else
				shm_pool_put(pool, (uint32_t)shm_pool_idx_of(pool, d[i].off));
			got++;
			bytes += d[i].len;
		}
		if (n) {
			last = now_s();
		} else {
			if (now_s() - last > c->timeout_s) {
				fprintf(stderr, "recv: nothing for %.0f s after %llu messages\n",
					c->timeout_s, (unsigned long long)got);
				bad = 1;
				break;
			}
			shm_ring_wait(rx, 1000000);
		}
		if (bad && !c->until_stop)
			break;
	}
	double dt = now_s() - t0;
	if (c->hold) {
		printf("recv: holding %llu messages (%llu received in place) until SIGTERM\n",
		       (unsigned long long)n_held, (unsigned long long)in_place);
		fflush(stdout);
		while (!g_stop)
			usleep(10000);
		for (uint64_t i = 0; i < n_held; i++)
			shm_pool_put(held[i].pool, held[i].idx);
		free(held);
	}
	if (decl != NULL)
		dp_ipc_rx_declare(decl, ring, 0);
	for (unsigned s = 0; route != NULL && s < c->streams; s++)
		dp_ipc_rx_route(route, s, "", "", 0, 0);
	if (own != NULL)
		dp_ipc_rx_own(own, ring, 0, (int32_t)getpid());
	if (live >= 0)
		shm_live_release(r, live);
	printf("recv: %llu messages, %llu bytes, %.3f s, %.3f GB/s, %.0f msg/s%s\n",
	       (unsigned long long)got, (unsigned long long)bytes, dt, bytes / dt / 1e9, got / dt,
	       c->verify ? ", verified in order and byte-identical" : "");
	printf("recv: %llu of %llu messages received in place (segment lists read where they lie)\n",
	       (unsigned long long)in_place, (unsigned long long)got);
	if (mem.maps)
		printf("recv: the dataplane's packet memory mapped %u times; %llu unverified segment lists not valid\n",
		       mem.maps, (unsigned long long)lists_bad);
	print_copies("recv", r, &k0, bytes);
	dp_ipc_rx_mem_fini(&mem);
	free(scratch);
	free(next);
	return bad || (!c->until_stop && got != c->count);
}

/* --check-lanes: which send lanes are held, and whether by live processes
 * (exit 1 if a dead process still holds one). --check-pools: every buffer
 * of the pools NAME.s / NAME.l (--pools NAME; or --pools A,B,...: those
 * pools) must be free (exit 1 if not), those dead senders held included:
 * the dataplane gives them back when it frees their lanes. */
static int do_check(const struct cfg *c, struct shm_region *r)
{
	int bad = 0;
	if (c->check == 'L') {
		uint64_t off;
		if (shm_region_find_area(r, DP_AREA_TXLANES, &off, NULL) < 0) {
			fprintf(stderr, "no send lanes in region %s\n", c->region);
			return 1;
		}
		const struct dp_tx_lanes *t = shm_ptr(r, off);
		unsigned held = 0, dead = 0;
		for (unsigned i = 0; i < DP_TX_LANES; i++) {
			int32_t pid = __atomic_load_n(&t->pid[i], __ATOMIC_ACQUIRE);
			if (pid <= 0)
				continue;
			held++;
			if (kill(pid, 0) < 0 && errno == ESRCH) {
				printf("lanes: lane %u held by dead pid %d\n", i, (int)pid);
				dead++;
			}
		}
		printf("lanes: %u of %u held, %u by dead processes\n", held, DP_TX_LANES, dead);
		return dead != 0;
	}
	char list[256];
	const char *names[8];
	int n_names = 0;
	snprintf(list, sizeof(list), "%s", c->pools);
	if (strchr(list, ',')) {
		char *save = NULL;
		for (char *t = strtok_r(list, ",", &save); t && n_names < 8; t = strtok_r(NULL, ",", &save))
			names[n_names++] = t;
	}
	for (int k = 0; k < (n_names ? n_names : 2); k++) {
		char name[64];
		if (n_names)
			snprintf(name, sizeof(name), "%s", names[k]);
		else
			snprintf(name, sizeof(name), "%s.%c", c->pools, k ? 'l' : 's');
		struct shm_pool *p = shm_pool_lookup(r, name);
		if (!p) {
			fprintf(stderr, "no pool %s in region %s\n", name, c->region);
			return 1;
		}
		uint32_t dead = 0;
		for (uint32_t i = 0; i < shm_pool_count(p); i++) {
			int32_t h = shm_pool_holder(p, i);
			dead += h > 1 && kill(h, 0) < 0 && errno == ESRCH;
		}
		printf("pools: %s: %u of %u free, %u held by dead processes\n", name, shm_pool_available(p),
		       shm_pool_count(p), dead);
		bad |= shm_pool_available(p) != shm_pool_count(p);
		shm_pool_close(p);
	}
	return bad;
}

int main(int argc, char **argv)
{
	struct cfg c = {.streams = 1, .count = 1000, .seed = 1, .verify = 1, .inflight = 64,
			.timeout_s = 30, .type = DP_MT_MBATCH, .pools = "cli"};
	static const struct option lo[] = {
		{"region", 1, 0, 'r'}, {"send", 0, 0, 'S'}, {"recv", 0, 0, 'R'}, {"peer", 1, 0, 'p'},
		{"streams", 1, 0, 's'}, {"count", 1, 0, 'n'}, {"seed", 1, 0, 'x'},
		{"fixed", 1, 0, 'f'}, {"no-verify", 0, 0, 'V'}, {"inflight", 1, 0, 'i'},
		{"until-stop", 0, 0, 'U'}, {"timeout", 1, 0, 't'}, {"type", 1, 0, 'T'}, {"whole", 0, 0, 'W'},
		{"die-holding", 1, 0, 'D'}, {"pools", 1, 0, 'P'}, {"check-lanes", 0, 0, 'L'},
		{"check-pools", 0, 0, 'Q'}, {"drain", 0, 0, 'd'}, {"route", 0, 0, 'o'},
		{"die-dequeued", 1, 0, 'e'}, {"replaced", 0, 0, 'y'}, {"hold", 0, 0, 'h'}, {"crcs", 0, 0, 'C'}, {"crcs-stride", 1, 0, 'Z'},
		{"crcs-nomagic", 0, 0, 'M'},
		{0, 0, 0, 0}};
	int o;
	while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (o) {
		case 'r': c.region = optarg; break;
		case 'S': c.send = 1; break;
		case 'R': c.recv = 1; break;
		case 'p': c.peer = (unsigned)atoi(optarg); break;
		case 's': c.streams = (unsigned)atoi(optarg); break;
		case 'n': c.count = strtoull(optarg, NULL, 0); break;
		case 'x': c.seed = strtoull(optarg, NULL, 0); break;
		case 'f': c.fixed = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'V': c.verify = 0; break;
		case 'i': c.inflight = (unsigned)atoi(optarg); break;
		case 'U': c.until_stop = 1; break;
		case 't': c.timeout_s = atof(optarg); break;
		case 'W': c.whole = 1; break;
		case 'D': c.die_holding = (unsigned)atoi(optarg); break;
		case 'P': c.pools = optarg; break;
		case 'L': c.check = 'L'; break;
		case 'Q': c.check = 'P'; break;
		case 'd': c.drain = 1; break;
		case 'o': c.route = 1; break;
		case 'e': c.die_dequeued = (unsigned)atoi(optarg); break;
		case 'y': c.replaced = 1; break;
		case 'h': c.hold = 1; break;
		case 'C': c.crcs = 1; break;
		case 'M': c.crcs = 1; c.crcs_nomagic = 1; break;
		case 'Z': c.crcs = 1; c.crcs_stride = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'T':
			c.type = !strcmp(optarg, "kv") ? DP_MT_KVPAGE : !strcmp(optarg, "ctl") ? DP_MT_CONTROL
				 : !strcmp(optarg, "mbatch") ? DP_MT_MBATCH : 0;
			if (!c.type)
				return 2;
			break;
		default: return 2;
		}
	}
	if (!c.region || (!c.check && c.send == c.recv) || !c.streams || c.streams > DP_MAX_STREAMS
	    || (c.route && (!c.recv || c.type != DP_MT_KVPAGE)) || (c.die_dequeued && !c.recv)
	    || (c.replaced && (!c.die_dequeued || c.route)) || (c.hold && (!c.recv || c.until_stop))
	    || (c.crcs && !c.send)) {
		fprintf(stderr, "usage: dp_client --region R (--send|--recv) --peer N [--streams S] "
			"[--count N] [--seed X] [--fixed BYTES] [--no-verify] [--inflight K] "
			"[--until-stop] [--timeout S] [--type mbatch|kv|ctl] [--whole] [--die-holding N] [--hold] [--pools NAME] [--drain] [--crcs | --crcs-stride B | --crcs-nomagic]\n"
			"       [--route] (with --recv --type kv) [--die-dequeued N [--replaced]] (with --recv)\n"
			"       dp_client --region R (--check-lanes | --check-pools [--pools NAME])\n");
		return 2;
	}
	signal(SIGTERM, on_sig);
	signal(SIGINT, on_sig);
	char err[256];
	struct shm_region *r = NULL;
	for (int i = 0; i < 100 && !r; i++) { /* the dataplane may still be creating it */
		r = shm_region_attach(c.region, err, sizeof(err));
		if (!r)
			usleep(100000);
	}
	if (!r) {
		fprintf(stderr, "dp_client: %s\n", err);
		return 77;
	}
	int rc = c.check ? do_check(&c, r) : c.send ? do_send(&c, r) : do_recv(&c, r);
	shm_region_detach(r);
	return rc;
}
