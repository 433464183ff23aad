/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The dataplane daemon's life: the region's rings and pools, the port, the
 * poll loop (dp.c) until the stop flag, then everything released in
 * reverse order (dp.h dp_run()).
 */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include "dp.h"
#include "dp_ipc.h"
#include "kvf_log.h"
#include "port.h"
#include "shm_live.h"
#include "shm_pool.h"
#include "shm_region.h"
#include "shm_ring.h"

#include "dp_int.h"

static struct shm_ring *ring_get(struct shm_region *r, const char *name, unsigned count,
				 unsigned flags)
{
	struct shm_ring *q = shm_ring_create(r, name, count, sizeof(struct shm_desc), flags);
	if (!q && errno == EEXIST)
		q = shm_ring_lookup(r, name);
	if (!q)
		kvf_log(KVF_LOG_ERR, NULL, "shm_ring_create(%s, %u) failed: %s: make the region larger "
			"(--region-size)", name, count, strerror(errno));
	return q;
}

static struct shm_pool *pool_get(struct shm_region *r, const char *name, uint32_t n, size_t sz)
{
	struct shm_pool *p = shm_pool_create(r, name, n, sz);
	if (!p && errno == EEXIST)
		p = shm_pool_lookup(r, name);
	if (!p)
		kvf_log(KVF_LOG_ERR, NULL, "shm_pool_create(%s, %u x %zu) failed: %s: make the region larger "
			"(--region-size) or the pools smaller", name, n, sz, strerror(errno));
	return p;
}

static unsigned pow2_at_least(unsigned x)
{
	unsigned p = 1;
	while (p < x)
		p <<= 1;
	return p;
}

/* " reason=count" for each reason that counted, into @p b (cut to @p n). */
void dp_fmt_drops(char *b, size_t n, const uint64_t drops[DP_DROP_MAX_])
{
	size_t at = 0;

	b[0] = '\0';
	for (unsigned k = 1; k < DP_DROP_MAX_ && at < n; k++)
		if (drops[k])
			at += (size_t)snprintf(b + at, n - at, " %s=%llu", dp_drop_reason_name(k),
					       (unsigned long long)drops[k]);
}

/* A raw area of the region that outlives us: made zeroed, or found as a
 * predecessor left it. @return it, or NULL (logged). */
static void *kept_area(struct dp *d, const char *name, size_t size)
{
	uint64_t off;
	int r = shm_region_add_area(d->reg, name, size, 64, SHM_AREA_RAW, &off);

	if (r && r != -EEXIST) {
		kvf_log(KVF_LOG_ERR, NULL, "shm_region_add_area(%s) failed: %s: make the region larger (--region-size)",
			name, strerror(-r));
		return NULL;
	}
	if (r == 0)
		memset(shm_ptr(d->reg, off), 0, size);
	return shm_ptr(d->reg, off);
}

static int setup_shm(struct dp *d)
{
	const struct dp_opts *o = d->o;
	char err[256] = "";
	int r;
	if (o->region_size) {
		struct shm_region_opts ro;
		shm_region_opts_init(&ro);
		ro.name = o->region;
		ro.size = o->region_size;
		d->reg = shm_region_create(&ro, err, sizeof(err));
	} else {
		d->reg = shm_region_attach(o->region, err, sizeof(err));
	}
	if (!d->reg) {
		kvf_log(KVF_LOG_ERR, NULL, "dataplane: region '%s': %s", o->region, err);
		return -errno;
	}
	unsigned bufs = o->rx_small_n + o->rx_large_n;
	for (unsigned i = 0; i < DP_TX_LANES; i++) {
		char name[32];
		snprintf(name, sizeof(name), DP_RING_TX_LANE, i);
		if ((d->r_txl[i] = ring_get(d->reg, name, 1024, 0)) == NULL)
			return -ENOSPC;
		/* a lane's requests are taken while this has room for them all */
		snprintf(name, sizeof(name), DP_RING_TXC_LANE, i);
		if ((d->r_txcl[i] = ring_get(d->reg, name, 1024, 0)) == NULL)
			return -ENOSPC;
	}
	d->r_rx = ring_get(d->reg, DP_RING_RX, pow2_at_least(2 * bufs), 0);
	d->r_ev = ring_get(d->reg, DP_RING_EV, 256, 0);
	d->r_rx_kv = ring_get(d->reg, DP_RING_RX_KV, pow2_at_least(2 * bufs), 0);
	d->r_rx_ctl = ring_get(d->reg, DP_RING_RX_CTL, pow2_at_least(2 * bufs), 0);
	d->p_small = pool_get(d->reg, DP_POOL_RX_SMALL, o->rx_small_n, o->rx_small_size);
	d->p_large = pool_get(d->reg, DP_POOL_RX_LARGE, o->rx_large_n, o->rx_large_size);
	if (!d->r_rx || !d->r_ev || !d->r_rx_kv || !d->r_rx_ctl || !d->p_small || !d->p_large)
		return -ENOSPC;
	uint64_t off;
	size_t have = 0;
	r = shm_region_add_area(d->reg, DP_AREA_STATS, sizeof(struct dp_stats_shm), 64, SHM_AREA_RAW, &off);
	if (r == -EEXIST && (shm_region_find_area(d->reg, DP_AREA_STATS, &off, &have) != 0
			     || have < sizeof(struct dp_stats_shm))) {
		kvf_log(KVF_LOG_ERR, NULL, "region '%s' holds the stats of an older dataplane (%zu B, %zu wanted): "
			"create the region anew (region_size)", o->region, have, sizeof(struct dp_stats_shm));
		return -EEXIST;
	}
	if (r && r != -EEXIST) {
		kvf_log(KVF_LOG_ERR, NULL, "shm_region_add_area(%s) failed: %s", DP_AREA_STATS, strerror(-r));
		return r;
	}
	d->stats = shm_ptr(d->reg, off);
	memset(d->stats, 0, sizeof(*d->stats));
	d->stats->magic = DP_STATS_MAGIC;
	d->stats->version = DP_STATS_VERSION;
	d->stats->self_node = o->node;
	/* published before any frame is received into region buffers: a
	 * consumer that read a predecessor's segments sees the change
	 * (dp_ipc_rx_seglist_current()) */
	__atomic_store_n(&d->stats->epoch, d->base_epoch, __ATOMIC_RELEASE);
	/* the consumers' declarations (dp_ipc.h) survive a restart on the region */
	if ((d->decl = kept_area(d, DP_AREA_RXSEG, sizeof(*d->decl))) == NULL)
		return -ENOSPC;
	d->decl->version = DP_RXSEG_VERSION;
	d->decl->in_place = 0;
	__atomic_store_n(&d->decl->magic, DP_RXSEG_MAGIC, __ATOMIC_RELEASE);
	/* the rings' owners too (dp.c forgets the dead) */
	if ((d->own = kept_area(d, DP_AREA_RXOWN, sizeof(*d->own))) == NULL)
		return -ENOSPC;
	/* our packet memory, named once the port is up (dp_run()) */
	if ((d->pk = kept_area(d, DP_AREA_PKTMEM, sizeof(*d->pk))) == NULL)
		return -ENOSPC;
	__atomic_store_n(&d->pk->epoch, 0, __ATOMIC_RELEASE);
	d->pk->pid = 0;
	d->pk->version = DP_PKTMEM_VERSION;
	__atomic_store_n(&d->pk->magic, DP_PKTMEM_MAGIC, __ATOMIC_RELEASE);
	d->own->version = DP_RXOWN_VERSION;
	__atomic_store_n(&d->own->magic, DP_RXOWN_MAGIC, __ATOMIC_RELEASE);
	/* the send lanes: a restart on the region keeps the live senders' claims
	 * (scan_lanes() in dp.c frees those of the dead on its first pass) */
	if ((d->txl = kept_area(d, DP_AREA_TXLANES, sizeof(*d->txl))) == NULL)
		return -ENOSPC;
	d->txl->version = DP_TXL_VERSION;
	d->txl->n = DP_TX_LANES;
	/* where frames carry payload CRCs, the senders may give them (dp_ipc.h) */
	d->txl->crc_stride = d->pcrc ? o->frame_size - DP_FRAME_HLEN : 0u;
	__atomic_store_n(&d->txl->magic, DP_TXL_MAGIC, __ATOMIC_RELEASE);
	if (dp_route_init(d) < 0)
		return -ENOSPC;
	d->live_slot = shm_live_register(d->reg, "dataplane");
	return 0;
}

/*
 * Receive in place: the RX mbufs' data buffers as a region area (found
 * again after a restart on the same region), the per-message bookkeeping,
 * and the mbuf budget of messages in place (dp.c). rx_in_place = yes
 * refuses the start where that cannot be; auto (the default) receives
 * reassembled instead and says why, and takes the area only where it is at
 * most a quarter of the region (the node's ctrld and workers add theirs
 * after it). @return 0 (in place: d->in_place set and @p area, @p len the
 * receive buffers' area, NULL and 0 for a zero-copy memif client's;
 * reassembled: d->in_place 0, the reason logged) or -errno.
 */
static int setup_in_place(struct dp *d, void **area, size_t *len)
{
	const struct dp_opts *o = d->o;
	int strict = o->rx_in_place == DP_RXIP_YES;
	uint32_t fp = o->frame_size - DP_FRAME_HLEN;
	uint32_t max_segs = (o->rx_large_size + fp - 1) / fp;
	size_t page = shm_region_page_size(d->reg), need = dp_port_rx_area_bytes(o->frame_size, o->n_mbufs, page);
	/* what the messages in place must leave: the RX ring (a NIC fills it
	 * ahead), the TX ring when frames are copied into these mbufs, the
	 * mempool cache (1.5 x its size at most), the reorder hold, two bursts */
	uint32_t keep = d->port.n_queues * (d->port.n_rx_desc + (d->port.multiseg ? 0 : d->port.n_tx_desc)) + 384 +
			HOLD_MAX + 2 * BURST;
	/* each worker lcore's TX queue: its mempool cache and the frames it may hold (port_txq.c) */
	keep += (d->port.n_queues - 1u) * (384 + DP_TXQ_RING + BURST);
	uint64_t off = 0;
	size_t have = 0;
	char why[320];
	int r = -EINVAL;

	*area = NULL;
	*len = 0;
	if (need == 0 && !d->port.memif_zc) {
		snprintf(why, sizeof(why), "it needs the region '%s' on hugepages (its pages are %zu B, smaller than "
			 "one receive buffer): reserve hugepages", o->region, page);
		goto refuse;
	}
	if (dp_ipc_rx_seglist_size(max_segs) > o->rx_small_size) {
		snprintf(why, sizeof(why), "the segment list of a %u-byte message (rx_large) takes %zu B, more than an "
			 "rx_small buffer (%u B): raise rx_small's size or lower rx_large's", o->rx_large_size,
			 dp_ipc_rx_seglist_size(max_segs), o->rx_small_size);
		goto refuse;
	}
	if (o->n_mbufs <= keep + max_segs) {
		snprintf(why, sizeof(why), "mbufs %u leave no room for a message in place (the driver keeps %u, the "
			 "largest message takes %u): raise mbufs above %u", o->n_mbufs, keep, max_segs, keep + max_segs);
		goto refuse;
	}
	if (!strict && !d->port.memif_zc && shm_region_find_area(d->reg, DP_AREA_RX_MBUFS, NULL, NULL) != 0 &&
	    need > shm_region_size(d->reg) / 4) {
		snprintf(why, sizeof(why), "%u receive buffers take %zu MiB, more than a quarter of region '%s' (%zu "
			 "MiB): make the region larger (--region-size) or lower mbufs", o->n_mbufs, need >> 20,
			 o->region, shm_region_size(d->reg) >> 20);
		goto refuse;
	}
	/* a zero-copy memif client's driver takes only the EAL's memory: its
	 * mbufs stay there and the consumers map it (dp_port_rx_file()) */
	r = d->port.memif_zc ? 0 : shm_region_add_area(d->reg, DP_AREA_RX_MBUFS, need, page, SHM_AREA_RAW, &off);
	if (r == -EEXIST)
		shm_region_find_area(d->reg, DP_AREA_RX_MBUFS, &off, &have);
	if ((r && r != -EEXIST) || (r == -EEXIST && have < need)) {
		snprintf(why, sizeof(why), "no room for %u receive buffers (%zu B, area %s) in region '%s'%s: make the "
			 "region larger (--region-size) or lower mbufs", o->n_mbufs, need, DP_AREA_RX_MBUFS, o->region,
			 r == -EEXIST ? " (a smaller one is there)" : "");
		r = r ? (r == -EEXIST ? -ENOSPC : r) : -ENOSPC;
		goto refuse;
	}
	d->ip_max_segs = max_segs;
	d->ip = calloc(o->rx_small_n, sizeof(*d->ip));
	d->ip_mb = calloc((size_t)o->rx_small_n * max_segs, sizeof(*d->ip_mb));
	d->ip_out = calloc(o->rx_small_n, sizeof(*d->ip_out));
	if (!d->ip || !d->ip_mb || !d->ip_out) {
		kvf_log(KVF_LOG_ERR, NULL, "dataplane: rx_in_place: out of memory for %u segment lists", o->rx_small_n);
		return -ENOMEM; /* dp_run() frees them */
	}
	d->mb_budget = o->n_mbufs - keep;
	d->in_place = 1;
	*area = d->port.memif_zc ? NULL : shm_ptr(d->reg, off);
	*len = d->port.memif_zc ? 0 : need;
	return 0;
refuse:
	if (strict) {
		kvf_log(KVF_LOG_ERR, NULL, "dataplane: rx_in_place: %s, or set rx_in_place = no (or auto)", why);
		return r;
	}
	kvf_log(KVF_LOG_INFO, NULL, "dataplane: receiving reassembled (rx_in_place = auto): %s to receive in place",
		why);
	return 0;
}

/* Name the file the RX mbufs lie in for the consumers (DP_AREA_PKTMEM):
 * received in place by a zero-copy memif client. @return 0 or -errno. */
static int publish_pktmem(struct dp *d)
{
	void *base;
	size_t len;
	int fd, r = dp_port_rx_file(&d->port, &base, &len, &fd);

	if (r && d->o->rx_in_place == DP_RXIP_YES) {
		kvf_log(KVF_LOG_ERR, NULL, "dataplane: rx_in_place on a zero-copy memif client needs its receive mbufs in "
			"one file-backed segment list of the EAL (%s): set rx_in_place = no or drop zero-copy=yes",
			strerror(-r));
		return r;
	}
	if (r) {
		kvf_log(KVF_LOG_INFO, NULL, "dataplane: receiving reassembled (rx_in_place = auto): a zero-copy memif "
			"client's receive mbufs are not in one file-backed segment list of the EAL (%s)", strerror(-r));
		d->in_place = 0;
		return 0;
	}
	d->pk_base = base;
	d->pk->pid = (int32_t)getpid();
	d->pk->fd = fd;
	d->pk->len = len;
	__atomic_store_n(&d->pk->epoch, d->base_epoch, __ATOMIC_RELEASE);
	return 0;
}

/*
 * The port is open: drop the capabilities the unit lends for opening it
 * (CAP_NET_RAW, CAP_NET_ADMIN: af_packet's sockets, a NIC's set-up). Kept,
 * they made this process one that its own user's ctrld and workers may not
 * open /proc/PID/fd of (a target's permitted set must lie within the
 * reader's), and a zero-copy memif client's packet memory is mapped that
 * way (dp_ipc.h, struct dp_rx_mem): under the packaged units its consumers
 * could not read what it received in place. The main thread's, which
 * /proc/PID answers for; the EAL's own threads keep theirs. Two system
 * calls: libcap would be a dependency for them alone. Root keeps its
 * capabilities (its readers are root too).
 */
static void drop_caps(void)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	struct __user_cap_data_struct c[_LINUX_CAPABILITY_U32S_3];

	if (geteuid() == 0 || syscall(SYS_capget, &h, c) != 0 || (c[0].permitted | c[1].permitted) == 0)
		return;
	prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
	memset(c, 0, sizeof(c));
	if (syscall(SYS_capset, &h, c) != 0)
		kvf_log(KVF_LOG_WARNING, NULL, "dataplane: dropping its capabilities once the port was open failed: %s "
			"(consumers of its own user cannot map a zero-copy memif client's packet memory)", strerror(errno));
	else
		kvf_log(KVF_LOG_INFO, NULL, "dataplane: capabilities dropped, the port being open");
}

int dp_run(const struct dp_opts *o, volatile sig_atomic_t *stop)
{
	if (o->node >= DP_MAX_PEERS || !o->port || !o->region || o->frame_size < DP_FRAME_HLEN + 64 ||
	    o->frame_size > DP_FRAME_MAX) {
		kvf_log(KVF_LOG_ERR, NULL, "dataplane: bad options: need --node-id < %u, --port, --region, "
			"--frame-size in [%u, %u]", DP_MAX_PEERS, DP_FRAME_HLEN + 64, DP_FRAME_MAX);
		return -EINVAL;
	}
	struct dp_opts eff = *o;
	char port_spec[1024];
	eff.port = dp_port_spec(o->port, port_spec, sizeof(port_spec));
	eff.rel.frame_payload = o->frame_size - DP_FRAME_HLEN;
	if (dp_rel_opts_check(&eff.rel)) {
		kvf_log(KVF_LOG_ERR, NULL, "dataplane: bad reliability options (window, max-msgs)");
		return -EINVAL;
	}
	struct dp *d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->o = &eff;
	d->live_slot = -1;
	d->link_up = -1;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	/* Wall-clock ns: a restarted process always has a larger epoch. */
	d->base_epoch = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	d->rng = eff.impair.seed ? eff.impair.seed : 1;

	/* The EAL first: with no hugepages free it fails at once (0.1 s), before
	 * the region is made again. The other way round a start that was bound to
	 * fail first replaced the region its node's workers and ctrld had mapped
	 * (with one on ordinary memory: they re-attached to it for nothing) and
	 * took 0.2 to 2 s (the fault drill's hugepages-full). */
	void *rx_area = NULL;
	size_t rx_area_len = 0;
	int memif = !strncmp(eff.port, "net_memif", 9);
	d->pcrc = eff.payload_crc == DP_PCRC_YES
		  || (eff.payload_crc == DP_PCRC_AUTO && !(memif && eff.impair.corrupt <= 0));
	int r = dp_port_init(&d->port, "kvferry-dataplane", eff.node, eff.port, eff.eal_args, eff.tx_copy);
	if (r)
		goto out;
	r = setup_shm(d);
	if (r)
		goto out;
	r = dp_port_register_region(&d->port, shm_region_base(d->reg), shm_region_size(d->reg),
				    shm_region_page_size(d->reg));
	if (r)
		goto out;
	if (eff.rx_in_place != DP_RXIP_NO && (r = setup_in_place(d, &rx_area, &rx_area_len)) != 0)
		goto out;
	r = dp_port_start(&d->port, eff.port, eff.node, eff.frame_size, eff.n_mbufs, rx_area, rx_area_len);
	if (r)
		goto out;
	if (d->in_place && d->port.memif_zc && (r = publish_pktmem(d)) != 0)
		goto out;
	if (d->port.n_queues > 1 && (r = dp_port_txq_start(&d->port, eff.idle == DP_IDLE_SLEEP, d->pcrc)) != 0)
		goto out;
	d->link_q = d->port.queues_own ? d->port.n_queues : 1;
	if (d->in_place)
		__atomic_store_n(&d->decl->in_place, 1u, __ATOMIC_RELEASE);
	d->tsc_hz = rte_get_tsc_hz();
	d->self = eff.self;
	memcpy(d->self.mac, d->port.mac, 6);
	for (unsigned i = 0; i < eff.n_peers; i++) {
		const struct dp_peer_cfg *c = &eff.peers[i];
		struct peer *p = &d->peers[c->node];
		p->configured = 1;
		p->node = c->node;
		p->addr = c->addr;
		p->local_epoch = d->base_epoch;
		p->stats = &d->stats->peer[d->stats->n_peers++];
		p->stats->node = c->node;
	}
	uint64_t pools = (uint64_t)eff.rx_small_n * eff.rx_small_size +
			 (uint64_t)eff.rx_large_n * eff.rx_large_size;
	uint64_t windows = (uint64_t)eff.n_peers * DP_MAX_STREAMS *
			   (eff.rel.window * 32ull + eff.rel.max_msgs * 80ull);
	d->stats->hugepage_bytes = d->port.mbuf_bytes + shm_region_size(d->reg);
	/* the driver's own copies per payload byte (dp_ipc.h) */
	if (!strncmp(eff.port, "net_memif", 9) || !strncmp(eff.port, "net_af_packet", 13)) {
		int zc = strstr(eff.port, "zero-copy=yes") != NULL;
		d->stats->pmd_tx_copies = zc ? 0 : 1;
		d->stats->pmd_rx_copies = zc ? 0 : 1;
	}
	kvf_log(KVF_LOG_INFO, NULL,
		"dataplane %u: port %u (%s) mac %02x:%02x:%02x:%02x:%02x:%02x, frame %u B, tx %s, rx %s, "
		"payload CRC %s, idle %s, %u queue pair%s%s, epoch %llu\n"
		"  memory: mbuf pools %.1f MiB (DPDK %s), region '%s' %.1f MiB (%s, reassembly "
		"pools %.1f MiB), per-stream windows at most %.1f MiB (heap); fixed at start",
		eff.node, d->port.port, eff.port, d->self.mac[0], d->self.mac[1], d->self.mac[2],
		d->self.mac[3], d->self.mac[4], d->self.mac[5], eff.frame_size,
		d->port.multiseg ? "zero-copy (ext buffers)"
		: d->port.memif_zc ? "copy (a zero-copy memif client sends from EAL memory only)" : "copy",
		d->in_place && d->pk_base ? "in place (the mbufs the memif server wrote, consumers map them) where the consumer reads segments"
		: d->in_place ? "in place (region mbufs) where the consumer reads segments"
		: d->port.memif_zc ? "reassembled by copy from the mbufs the memif server wrote" : "reassembled by copy",
		d->pcrc ? "on" : eff.payload_crc == DP_PCRC_NO ? "off" : "off (memif: shared memory)",
		eff.idle ? "sleep" : "poll", d->port.n_queues, d->port.n_queues == 1 ? "" : "s",
		d->port.n_queues > 1 && d->port.queues_own ? " (streams spread over the worker lcores' TX queues)"
		: d->port.n_queues > 1 ? " (streams spread over the worker lcores' TX queues once the peer has as many)" : "",
		(unsigned long long)d->base_epoch, d->port.mbuf_bytes / 1048576.0,
		rte_eal_has_hugepages() ? "hugepages" : "heap: --no-huge", eff.region,
		shm_region_size(d->reg) / 1048576.0,
		shm_region_is_huge(d->reg) ? "hugepages" : "NOT hugepages", pools / 1048576.0,
		windows / 1048576.0);

	uint64_t next_tick = 0, next_winupd = 0, next_link = 0;
	unsigned idle_spins = 0;
	uint64_t sleep_ns = 1000;
	/* The default 50 µs timer slack turned every 1 µs back-off sleep into
	 * ~60 µs, which the peer saw as RTT. */
	drop_caps();
	if (eff.idle == DP_IDLE_SLEEP && prctl(PR_SET_TIMERSLACK, 1000ul, 0, 0, 0))
		kvf_log(KVF_LOG_WARNING, NULL, "dataplane: prctl(PR_SET_TIMERSLACK, 1000) failed: %s (sleeps "
			"will overshoot)", strerror(errno));
	while (!*stop) {
		uint64_t now = now_ns(d);
		unsigned work = dp_poll_once(d, now);
		if (now >= next_tick) {
			dp_timers(d, now, &next_winupd);
			next_tick = now + TICK_NS;
		}
		if (now >= next_link) {
			dp_link(d, dp_port_watch(&d->port, now));
			next_link = now + 100000000ull;
		}
		if (eff.idle == DP_IDLE_SLEEP) {
			if (work) {
				idle_spins = 0;
				sleep_ns = 1000;
			} else if (++idle_spins > 64) {
				if (d->in_flight) {
					/* Traffic flows (an ACK or the next frames are
					 * due): stay hot, but let the peer or a client
					 * sharing this core run. Sleeping here made the
					 * back-off part of every RTT. */
					sched_yield();
				} else {
					/* Adaptive back-off: 1 µs doubling to 200 µs,
					 * reset on work. */
					struct timespec t = {0, (long)sleep_ns};
					nanosleep(&t, NULL);
					if (sleep_ns < 200000)
						sleep_ns *= 2;
				}
			}
		}
	}
	kvf_log(KVF_LOG_INFO, NULL, "dataplane %u: stopping", eff.node);
	for (unsigned i = 0; i < d->stats->n_peers; i++) {
		const struct dp_peer_stats *ps = &d->stats->peer[i];
		char drops[DP_DROP_MAX_ * 32];

		dp_fmt_drops(drops, sizeof(drops), ps->drops);
		kvf_log(KVF_LOG_INFO, NULL, "  peer %u: tx %llu frames %llu B, rx %llu frames %llu B, retransmits %llu, "
			"timeouts %llu, sent %llu, failed %llu, received %llu, restarts %llu, rtt %llu ns\n   drops:%s",
			ps->node, (unsigned long long)ps->tx_frames, (unsigned long long)ps->tx_bytes,
			(unsigned long long)ps->rx_frames, (unsigned long long)ps->rx_bytes,
			(unsigned long long)ps->retransmits, (unsigned long long)ps->timeouts,
			(unsigned long long)ps->msgs_sent, (unsigned long long)ps->msgs_failed,
			(unsigned long long)ps->msgs_received, (unsigned long long)ps->restarts,
			(unsigned long long)ps->rtt_ns, drops);
	}
	{
		char drops[DP_DROP_MAX_ * 32];

		dp_fmt_drops(drops, sizeof(drops), d->stats->drops_unknown);
		kvf_log(KVF_LOG_INFO, NULL, "  unattributed drops:%s", drops);
	}
	if (d->port.n_queues > 1) {
		struct dp_txq_totals t;

		dp_port_txq_totals(&d->port, &t);
		kvf_log(KVF_LOG_INFO, NULL, "  queue pairs: %u in use of %u; the worker lcores' TX queues sent %llu frames "
			"(%llu B), dropped %llu, read %llu payload bytes for CRCs", d->link_q, d->port.n_queues,
			(unsigned long long)t.frames, (unsigned long long)t.bytes, (unsigned long long)t.dropped,
			(unsigned long long)t.crc_bytes);
	}
	if (d->pcrc)
		kvf_log(KVF_LOG_INFO, NULL, "  payload CRCs: %llu B of payload read for them by passes of its own, %llu B "
			"sent with the senders' own (DP_TX_CRCS)", (unsigned long long)d->stats->crc_read_bytes,
			(unsigned long long)d->stats->crc_given_bytes);
	if (d->in_place) {
		dp_ip_reap(d);
		kvf_log(KVF_LOG_INFO, NULL, "  received in place: %u messages still with their consumers, %u of %u mbufs "
			"reserved; %llu reassembled while the consumers held them all", d->n_ip_out, d->mb_reserved,
			d->mb_budget, (unsigned long long)d->ip_copied);
	}
	r = 0;
out:
	for (unsigned i = 0; i < DP_MAX_PEERS; i++)
		for (unsigned j = 0; j < DP_MAX_STREAMS; j++) {
			struct stream *s = d->peers[i].st[j];
			if (!s)
				continue;
			d->cur_stream = s;
			dp_rel_tx_destroy(s->tx);
			dp_rel_rx_destroy(s->rx);
			free(s->lane_of);
			free(s);
		}
	for (unsigned i = 0; i < d->n_hold; i++)
		rte_pktmbuf_free(d->hold[i]);
	for (uint32_t i = 0; d->in_place && i < d->n_ip_out; i++)
		dp_ip_free(d, d->ip_out[i]); /* their consumers may still read them: the region outlives us */
	if (d->decl)
		__atomic_store_n(&d->decl->in_place, 0u, __ATOMIC_RELEASE);
	if (d->pk) /* a consumer's mapping keeps the memory; no new one is made */
		__atomic_store_n(&d->pk->pid, 0, __ATOMIC_RELEASE);
	dp_port_fini(&d->port);
	free(d->ip);
	free(d->ip_mb);
	free(d->ip_out);
	if (d->live_slot >= 0)
		shm_live_release(d->reg, d->live_slot);
	for (unsigned i = 0; i < DP_TX_LANES; i++) {
		shm_ring_close(d->r_txl[i]);
		shm_ring_close(d->r_txcl[i]);
	}
	shm_ring_close(d->r_rx);
	shm_ring_close(d->r_ev);
	shm_ring_close(d->r_rx_kv);
	shm_ring_close(d->r_rx_ctl);
	dp_route_close(d);
	shm_pool_close(d->p_small);
	shm_pool_close(d->p_large);
	shm_region_detach(d->reg);
	free(d);
	return r;
}
