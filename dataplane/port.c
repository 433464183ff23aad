/* SPDX-License-Identifier: Apache-2.0 */
/*
 * EAL and port setup: one port, one RX and one TX queue (over memif and
 * net_af_packet one pair per EAL lcore, the others' TX served by
 * port_txq.c), three mbuf pools
 * (RX frames; small TX header mbufs; data-less mbufs that carry region
 * payload as external buffers), and the region registered as external
 * memory so a NIC can DMA payload straight from it. Received in place, the
 * RX frames' data buffers are a region area too (pinned external buffers),
 * so the EAL comes up first, then the region, then the port.
 *
 * Invariant: every mbuf handed to the PMD is accounted for by these pools,
 * which are sized at start; the ext-buffer refcount (16 bits) can never
 * overflow because fewer than 65535 mbufs exist in the ext pool.
 */
/* rte_dev_dma_map() is still experimental in DPDK 22.11. */
#define ALLOW_EXPERIMENTAL_API 1
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <rte_bus.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_log.h>
#include <rte_mbuf.h>
#include <rte_memory.h>

#include "dp.h"
#include "kvf_log.h"
#include "port.h"

#define RX_DESC 1024
#define TX_DESC 1024
#define POOL_CACHE 256

static void ext_free_noop(void *addr, void *opaque)
{
	/* Region memory outlives every mbuf: nothing to free. */
	(void)addr;
	(void)opaque;
}

/* DPDK's own log under journald: its default stream (22.11) writes each
 * message to stderr with no priority, which the journal files at 6, and
 * again to syslog, so every EAL error showed up twice, once as info.
 * Through kvf_log() instead it is one line on stderr at its own priority
 * (rte_log levels are syslog's plus one: RTE_LOG_ERR = 4 is syslog's 3).
 * In a terminal DPDK's stream stays as it is. */
static ssize_t eal_log_write(void *cookie, const char *buf, size_t size)
{
	int lvl = rte_log_cur_msg_loglevel();

	(void)cookie;
	kvf_log(lvl >= (int)RTE_LOG_EMERG && lvl <= (int)RTE_LOG_DEBUG ? lvl - 1 : KVF_LOG_INFO, NULL, "%.*s", (int)size,
		buf);
	return (ssize_t)size;
}

static void eal_log_to_journal(void)
{
	static FILE *f;

	if (f != NULL || !kvf_log_journal())
		return;
	f = fopencookie(NULL, "w", (cookie_io_functions_t){ .write = eal_log_write });
	if (f != NULL)
		rte_openlog_stream(f); /* before rte_eal_init(): its own default stream then stays unused */
}

/* net_af_packet frames pass the kernel interface: its MTU, not the PMD's
 * (which reports 1518 and has no setter), bounds them. */
static void check_iface_mtu(const char *spec, uint32_t frame_size)
{
	const char *i = strstr(spec, "iface=");
	char ifname[64], path[128];
	if (!i || sscanf(i + 6, "%63[^,]", ifname) != 1)
		return;
	snprintf(path, sizeof(path), "/sys/class/net/%s/mtu", ifname);
	FILE *f = fopen(path, "r");
	unsigned mtu = 0;
	if (!f)
		return;
	if (fscanf(f, "%u", &mtu) == 1 && mtu + RTE_ETHER_HDR_LEN < frame_size)
		kvf_log(KVF_LOG_ERR, NULL, "dataplane: %s has MTU %u, below the %u-byte frames (--frame-size): "
			"frames will be dropped; raise it (ip link set %s mtu %u)", ifname, mtu,
			frame_size, ifname, frame_size - RTE_ETHER_HDR_LEN);
	fclose(f);
}

/* A frame larger than a memif buffer (bsize, 2048 unless given) spans
 * several descriptors: a copy and a descriptor more per piece, and DPDK
 * 22.11's net_memif leaves a stale "next" flag on a reused descriptor that
 * can merge two frames after the ring wraps (fixed upstream in 2026). */
static void check_memif_bsize(const char *spec, uint32_t frame_size)
{
	const char *b = strstr(spec, "bsize=");
	unsigned long bsize = b ? strtoul(b + 6, NULL, 0) : 2048;

	if (strncmp(spec, "net_memif", 9) == 0 && bsize < frame_size)
		kvf_log(KVF_LOG_WARNING, NULL, "dataplane: memif buffers of %lu B (bsize) are smaller than the %u-byte "
			"frames (--frame-size): each frame spans several descriptors, slower and open to a net_memif "
			"bug that merges frames; give the port bsize=%u", bsize, frame_size,
			(frame_size + 1023) / 1024 * 1024 > 65535 ? 65535 : (frame_size + 1023) / 1024 * 1024);
}

/*
 * A memif server's control socket left by a dataplane that was killed: DPDK
 * refuses to bind it again ("Address already in use") and the restarted
 * dataplane would never come up. Remove it when nothing listens there
 * (connect refused); a live server keeps it.
 */
static void memif_stale_socket(const char *spec)
{
	const char *at = strstr(spec, "socket=");
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	size_t n;
	int fd;

	if (at == NULL || strstr(spec, "role=client") != NULL)
		return;
	at += strlen("socket=");
	n = strcspn(at, ",");
	if (n == 0 || n >= sizeof(sa.sun_path))
		return;
	memcpy(sa.sun_path, at, n);
	if (stat(sa.sun_path, &st) != 0 || !S_ISSOCK(st.st_mode))
		return;
	fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	if (fd < 0)
		return;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno == ECONNREFUSED && unlink(sa.sun_path) == 0)
		kvf_log(KVF_LOG_WARNING, NULL, "dataplane: removed the stale memif socket %s (its server is gone)",
			sa.sun_path);
	close(fd);
}

static int keep_one_fd(const struct rte_memseg_list *msl, const struct rte_memseg *ms, void *arg)
{
	int fd = rte_memseg_get_fd_thread_unsafe(ms);

	(void)msl;
	(void)arg;
	if (fd >= 0 && dp_guard_keep_fd(fd) == -ENOSPC)
		kvf_log(KVF_LOG_WARNING, NULL, "dataplane: more EAL segment files than memif_guard.c keeps: a "
			"zero-copy memif client may not reconnect after its server restarts");
	return 0;
}

/* A zero-copy memif client lends the EAL's segment files by the EAL's own
 * fds, which its driver closes (memif_guard.c): keep every one open. Called
 * before each start, once every pool is made. */
static void keep_memseg_fds(struct dp_port *p)
{
	if (p->memif_zc)
		rte_memseg_walk(keep_one_fd, NULL);
}

/* RX mbufs hold a whole frame when the PMD cannot scatter (af_packet);
 * memif chains as needed. Received in place, a frame must be one segment:
 * this room holds any frame up to frame_size. */
static uint32_t rx_room(uint32_t frame_size)
{
	uint32_t room = frame_size + 1024 + RTE_PKTMBUF_HEADROOM; /* af_packet wants its frame slot to fit */

	return room > UINT16_MAX ? UINT16_MAX : room;
}

size_t dp_port_rx_area_bytes(uint32_t frame_size, uint32_t n_mbufs, size_t page)
{
	size_t elt = RTE_ALIGN_CEIL(rx_room(frame_size), RTE_CACHE_LINE_SIZE), per_page = page / elt;

	if (per_page == 0)
		return 0;
	return (n_mbufs + per_page - 1) / per_page * page;
}

int dp_port_init(struct dp_port *p, const char *prog, uint16_t node, const char *spec,
		 const char *extra, int force_copy)
{
	char *argv[64];
	int argc = 0;
	char prefix[32], vdev[512], *extra_dup = NULL;
	memset(p, 0, sizeof(*p));
	p->rx_file_fd = -1;
	if (spec == NULL || prog == NULL)
		return -EINVAL;
	snprintf(prefix, sizeof(prefix), "--file-prefix=kvfdp%u", node);
	argv[argc++] = (char *)prog;
	/* no files of its own (--in-memory), except beside --no-huge (a machine
	 * with no hugepages), which DPDK refuses with it; there net_memif needs
	 * the multi-process channel that --no-shconf would close, so the EAL
	 * keeps its runtime files under the node's file prefix */
	if (extra == NULL || strstr(extra, "--no-huge") == NULL)
		argv[argc++] = (char *)"--in-memory";
	argv[argc++] = prefix;
	argv[argc++] = (char *)"--log-level=lib.eal:warning";
	int is_vdev = strncmp(spec, "net_", 4) == 0;
	if (is_vdev && strncmp(spec, "net_memif", 9) == 0 && strstr(spec, "socket-abstract=") == NULL) {
		/* DPDK's memif control socket is abstract by default: any local
		 * user could connect to it. A file socket takes its directory's
		 * permissions (the runtime directory, 0700). */
		snprintf(vdev, sizeof(vdev), "--vdev=%s,socket-abstract=no", spec);
		memif_stale_socket(spec);
		argv[argc++] = (char *)"--no-pci";
		argv[argc++] = vdev;
	} else if (is_vdev) {
		snprintf(vdev, sizeof(vdev), "--vdev=%s", spec);
		argv[argc++] = (char *)"--no-pci";
		argv[argc++] = vdev;
	} else {
		snprintf(vdev, sizeof(vdev), "--allow=%s", spec);
		argv[argc++] = vdev;
	}
	p->memif_zc = dp_memif_zc(spec);
	if (p->memif_zc && (extra == NULL || strstr(extra, "--single-file-segments") == NULL))
		argv[argc++] = (char *)"--single-file-segments"; /* one fd per segment list (dp_memif_zc()) */
	if (extra && *extra) {
		extra_dup = strdup(extra);
		for (char *t = strtok(extra_dup, " "); t && argc < 62; t = strtok(NULL, " "))
			argv[argc++] = t;
	} else {
		argv[argc++] = (char *)"-l";
		argv[argc++] = (char *)"0";
	}
	argv[argc] = NULL;
	eal_log_to_journal();
	if (rte_eal_init(argc, argv) < 0) {
		kvf_log(KVF_LOG_ERR, NULL, "rte_eal_init(%s) failed: %s: reserve hugepages (echo 512 > "
			"/proc/sys/vm/nr_hugepages) and check the port spec", spec,
			rte_strerror(rte_errno));
		free(extra_dup);
		return -ENODEV;
	}
	p->eal_up = 1;

	uint16_t pid = RTE_MAX_ETHPORTS;
	uint16_t i;
	RTE_ETH_FOREACH_DEV(i) {
		pid = i;
		break;
	}
	if (pid == RTE_MAX_ETHPORTS) {
		kvf_log(KVF_LOG_ERR, NULL, "no DPDK port for '%s': bind the NIC to vfio-pci or give a vdev spec",
			spec);
		free(extra_dup);
		return -ENODEV;
	}
	p->port = pid;
	free(extra_dup);
	struct rte_eth_dev_info info;
	int r = rte_eth_dev_info_get(pid, &info);
	if (r) {
		kvf_log(KVF_LOG_ERR, NULL, "rte_eth_dev_info_get(%u) failed: %s", pid, rte_strerror(-r));
		return r;
	}
	p->multiseg = !force_copy && !p->memif_zc && (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS);
	/* Over memif, a queue pair per EAL lcore (port_txq.c); over
	 * net_af_packet as many as its qpairs (a socket each, the kernel
	 * spreading what arrives by flow hash, and the source port carries the
	 * stream). A NIC would need RSS by stream, which is not set up. */
	p->n_queues = 1;
	int afp = strncmp(spec, "net_af_packet", 13) == 0;
	if (strncmp(spec, "net_memif", 9) == 0 || afp) {
		unsigned nq = RTE_MIN(rte_lcore_count(), (unsigned)DP_MAX_QUEUES);
		const char *qp = afp ? strstr(spec, "qpairs=") : NULL;
		unsigned qpairs = qp != NULL ? (unsigned)strtoul(qp + 7, NULL, 10) : 1;

		if (afp && nq > qpairs) {
			if (nq > 1)
				kvf_log(KVF_LOG_WARNING, NULL, "dataplane: %u EAL lcores but net_af_packet has qpairs=%u: "
					"the lcores past it send nothing; give the port qpairs=%u", nq, qpairs, nq);
			nq = qpairs ? qpairs : 1;
		}
		if (info.max_rx_queues && nq > info.max_rx_queues)
			nq = info.max_rx_queues;
		if (info.max_tx_queues && nq > info.max_tx_queues)
			nq = info.max_tx_queues;
		p->n_queues = (uint16_t)(nq ? nq : 1);
		p->queues_own = afp;
	}
	p->n_rx_desc = RX_DESC; /* what dp_port_start() asks for (the driver may lower it) */
	p->n_tx_desc = TX_DESC;
	return 0;
}

/* The RX pool's data buffers in the region's @p area (@p len bytes at
 * @p base, which dp_port_register_region() covered): one extmem entry per
 * region page, so each is IOVA-contiguous whatever the IOVA mode. */
static struct rte_mempool *rx_pool_in_region(struct dp_port *p, const char *name, uint32_t n, uint32_t room,
					     int socket, void *base, size_t len)
{
	size_t page = p->region_page, elt = RTE_ALIGN_CEIL(room, RTE_CACHE_LINE_SIZE), n_ext = len / page;
	struct rte_pktmbuf_extmem *ext = calloc(n_ext ? n_ext : 1, sizeof(*ext));
	struct rte_mempool *mp = NULL;

	if (ext == NULL || page / elt == 0 || (size_t)n > n_ext * (page / elt)) {
		kvf_log(KVF_LOG_ERR, NULL, "dataplane: rx_in_place: %u receive buffers of %zu B do not fit %zu B of "
			"region pages of %zu B: put the region on hugepages or set rx_in_place = no", n, elt, len, page);
		free(ext);
		rte_errno = EINVAL;
		return NULL;
	}
	for (size_t i = 0; i < n_ext; i++) {
		ext[i].buf_ptr = (char *)base + i * page;
		ext[i].buf_iova = dp_port_iova(p, ext[i].buf_ptr);
		ext[i].buf_len = page / elt * elt;
		ext[i].elt_size = (uint16_t)elt;
	}
	mp = rte_pktmbuf_pool_create_extbuf(name, n, POOL_CACHE, 0, (uint16_t)room, socket, ext, (unsigned)n_ext);
	free(ext);
	return mp;
}

struct rx_file_scan {
	const struct rte_memseg_list *msl;
	const void *first;
	uintptr_t end;
	int mixed;
};

static void rx_file_chunk(struct rte_mempool *mp, void *opaque, struct rte_mempool_memhdr *memhdr, unsigned idx)
{
	struct rx_file_scan *s = opaque;
	const struct rte_memseg_list *msl = rte_mem_virt2memseg_list(memhdr->addr);
	uintptr_t end = (uintptr_t)memhdr->addr + memhdr->len;

	(void)mp;
	(void)idx;
	if (s->first == NULL) {
		s->first = memhdr->addr;
		s->msl = msl;
	} else if (msl != s->msl) {
		s->mixed = 1;
	}
	if (end > s->end)
		s->end = end;
}

int dp_port_rx_file(struct dp_port *p, void **base, size_t *len, int *fd)
{
	struct rx_file_scan s = {0};
	size_t off;

	if (p->rx_pool == NULL)
		return -ENOTSUP;
	rte_mempool_mem_iter(p->rx_pool, rx_file_chunk, &s);
	if (s.msl == NULL || s.mixed || s.msl->external)
		return -ENOTSUP;
	const struct rte_memseg *ms = rte_mem_virt2memseg(s.first, s.msl);
	int f = ms != NULL ? rte_memseg_get_fd(ms) : -1;
	/* one file for the list, at the list's offsets */
	if (f < 0 || rte_memseg_get_fd_offset(ms, &off) < 0
	    || off != (size_t)((const char *)ms->addr - (const char *)s.msl->base_va))
		return -ENOTSUP;
	/* our own descriptor: net_memif closes the one it lent its peer (the
	 * EAL's) when its link goes down */
	if (p->rx_file_fd < 0 && (p->rx_file_fd = fcntl(f, F_DUPFD_CLOEXEC, 0)) < 0)
		return -errno;
	*base = s.msl->base_va;
	*len = RTE_ALIGN_CEIL(s.end - (uintptr_t)s.msl->base_va, s.msl->page_sz);
	*fd = p->rx_file_fd;
	return 0;
}

int dp_port_start(struct dp_port *p, const char *spec, uint16_t node, uint32_t frame_size, uint32_t n_mbufs,
		  void *rx_area, size_t rx_area_len)
{
	uint16_t pid = p->port;
	struct rte_eth_dev_info info;
	int r = rte_eth_dev_info_get(pid, &info);
	if (r) {
		kvf_log(KVF_LOG_ERR, NULL, "rte_eth_dev_info_get(%u) failed: %s", pid, rte_strerror(-r));
		return r;
	}
	int socket = rte_eth_dev_socket_id(pid);
	if (socket < 0)
		socket = 0;

	uint32_t room = rx_room(frame_size);
	char name[32];
	snprintf(name, sizeof(name), "dprx%u", node);
	p->rx_in_region = rx_area != NULL;
	p->rx_pool = rx_area != NULL ? rx_pool_in_region(p, name, n_mbufs, room, socket, rx_area, rx_area_len)
				     : rte_pktmbuf_pool_create(name, n_mbufs, POOL_CACHE, 0, (uint16_t)room, socket);
	snprintf(name, sizeof(name), "dphdr%u", node);
	p->hdr_pool = rte_pktmbuf_pool_create(name, n_mbufs, POOL_CACHE, 0,
					      RTE_PKTMBUF_HEADROOM + 256, socket);
	snprintf(name, sizeof(name), "dpext%u", node);
	p->ext_pool = rte_pktmbuf_pool_create(name, n_mbufs < 65000 ? n_mbufs : 65000, POOL_CACHE, 0,
					      0, socket);
	if (!p->rx_pool || !p->hdr_pool || !p->ext_pool) {
		/* a zero-copy memif client's receive mbufs are the EAL's, not the
		 * region's: with the region sized for them, its EAL ran out */
		kvf_log(KVF_LOG_ERR, NULL, "rte_pktmbuf_pool_create(%u mbufs of %u bytes) failed: %s: reserve "
			"more hugepages (%llu MiB for these mbufs%s) or lower --mbufs, or run the EAL without them "
			"([dp] eal = --no-huge -m 1024)", n_mbufs, room, rte_strerror(rte_errno),
			(unsigned long long)(((uint64_t)n_mbufs * (rx_area != NULL ? RTE_PKTMBUF_HEADROOM + 512u : room + 512u)
					     + (1u << 20) - 1) >> 20),
			p->memif_zc ? ": a zero-copy memif client keeps its receive mbufs in the EAL's hugepages, not in "
			"its region" : "");
		return -ENOMEM;
	}
	/* received in place, the RX data buffers are the region's (counted there) */
	p->mbuf_bytes = (uint64_t)n_mbufs * ((rx_area != NULL ? 0 : room) + 128) +
			(uint64_t)n_mbufs * (RTE_PKTMBUF_HEADROOM + 256 + 128) + (uint64_t)n_mbufs * 128;

	struct rte_eth_conf conf;
	memset(&conf, 0, sizeof(conf));
	if (p->multiseg)
		conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
	if (info.rx_offload_capa & RTE_ETH_RX_OFFLOAD_SCATTER)
		conf.rxmode.offloads |= RTE_ETH_RX_OFFLOAD_SCATTER;
	/* The MTU the frames need, within what the device says it takes:
	 * net_memif and net_af_packet report a 1518-byte max_rx_pktlen yet pass
	 * jumbo frames (memif chains buffers; af_packet is bounded by its
	 * tpacket slots and the kernel interface's MTU), and asking for more
	 * made rte_eth_dev_configure() log "Frame size (9004) > device max
	 * frame size (1518)" and fail once. */
	uint32_t mtu = frame_size - RTE_ETHER_HDR_LEN;
	uint32_t overhead = RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN;
	if (info.max_mtu && mtu > info.max_mtu)
		mtu = info.max_mtu;
	if (info.max_rx_pktlen > overhead && mtu + overhead > info.max_rx_pktlen)
		mtu = info.max_rx_pktlen - overhead;
	if (mtu < RTE_ETHER_MIN_MTU)
		mtu = RTE_ETHER_MIN_MTU;
	conf.rxmode.mtu = mtu;
	uint16_t nq = p->n_queues;
	r = rte_eth_dev_configure(pid, nq, nq, &conf);
	if (r) {
		conf.rxmode.mtu = 0;
		r = rte_eth_dev_configure(pid, nq, nq, &conf);
	}
	if (r) {
		kvf_log(KVF_LOG_ERR, NULL, "rte_eth_dev_configure(port %u) failed: %s", pid, rte_strerror(-r));
		return r;
	}
	uint16_t nrx = RX_DESC, ntx = TX_DESC;
	rte_eth_dev_adjust_nb_rx_tx_desc(pid, &nrx, &ntx);
	p->n_rx_desc = nrx;
	p->n_tx_desc = ntx;
	r = 0;
	for (uint16_t q = 0; q < nq && !r; q++) {
		r = rte_eth_rx_queue_setup(pid, q, nrx, (unsigned)socket, NULL, p->rx_pool);
		if (!r)
			r = rte_eth_tx_queue_setup(pid, q, ntx, (unsigned)socket, NULL);
	}
	if (r) {
		kvf_log(KVF_LOG_ERR, NULL, "rte_eth_{rx,tx}_queue_setup(port %u, %u/%u desc) failed: %s", pid,
			nrx, ntx, rte_strerror(-r));
		return r;
	}
	check_memif_bsize(spec, frame_size);
	keep_memseg_fds(p);
	p->reconnects = strncmp(spec, "net_memif", 9) == 0 && strstr(spec, "role=client") != NULL;
	/* A memif client fails to start while its server is not listening yet
	 * (both started together): retry for up to 30 s instead of exiting. */
	for (int tries = 0;; tries++) {
		r = rte_eth_dev_start(pid);
		if (!r || !p->reconnects || tries >= 300)
			break;
		if (tries == 0)
			kvf_log(KVF_LOG_WARNING, NULL, "rte_eth_dev_start(port %u, %s) failed: %s: waiting up to 30 s "
				"for the memif server", pid, spec, rte_strerror(-r));
		usleep(100000);
	}
	if (r) {
		kvf_log(KVF_LOG_ERR, NULL, "rte_eth_dev_start(port %u) failed: %s", pid, rte_strerror(-r));
		return r;
	}
	p->started = 1;
	if (strncmp(spec, "net_af_packet", 13) == 0) {
		const char *i = strstr(spec, "iface=");
		char ifname[64];

		check_iface_mtu(spec, frame_size);
		if (i && sscanf(i + 6, "%63[^,]", ifname) == 1)
			snprintf(p->oper_path, sizeof(p->oper_path), "/sys/class/net/%s/operstate", ifname);
	}
	rte_eth_promiscuous_enable(pid); /* peers may address us before they learn our MAC */
	struct rte_ether_addr mac;
	rte_eth_macaddr_get(pid, &mac);
	memcpy(p->mac, mac.addr_bytes, 6);
	rte_mbuf_ext_refcnt_set(&p->shinfo, 1);
	p->shinfo.free_cb = ext_free_noop;
	p->shinfo.fcb_opaque = NULL;
	return 0;
}

int dp_port_register_region(struct dp_port *p, void *base, size_t len, size_t page)
{
	size_t n = len / page;
	rte_iova_t *iova = calloc(n, sizeof(*iova));
	if (!iova)
		return -ENOMEM;
	int va_mode = rte_eal_iova_mode() == RTE_IOVA_VA;
	for (size_t i = 0; i < n; i++) {
		void *va = (char *)base + i * page;
		iova[i] = va_mode ? (rte_iova_t)(uintptr_t)va : rte_mem_virt2phy(va);
	}
	p->region_base = base;
	p->region_len = len;
	p->region_page = page;
	p->region_iova = iova;
	if (p->memif_zc)
		return 0; /* an external segment list would keep its link down (dp_memif_zc()) */
	int r = rte_extmem_register(base, len, iova, (unsigned)n, page);
	if (r && rte_errno != EEXIST) {
		kvf_log(KVF_LOG_ERR, NULL, "rte_extmem_register(%p, %zu, %zu pages of %zu) failed: %s", base,
			len, n, page, rte_strerror(rte_errno));
		return -rte_errno;
	}
	p->extmem = 1;
	struct rte_eth_dev_info info;
	if (rte_eth_dev_info_get(p->port, &info) == 0 && info.device) {
		/* Only a real device behind an IOMMU needs the mapping; vdevs
		 * answer ENOTSUP, which is fine: they copy by virtual address. */
		for (size_t i = 0; i < n; i++) {
			r = rte_dev_dma_map(info.device, (char *)base + i * page, iova[i], page);
			if (r) {
				if (rte_errno != ENOTSUP && rte_errno != ENODEV)
					kvf_log(KVF_LOG_WARNING, NULL, "rte_dev_dma_map(page %zu) failed: %s (the NIC "
						"will copy instead)", i, rte_strerror(rte_errno));
				break;
			}
			p->dma_mapped = i + 1;
		}
	}
	return 0;
}

/* 1 unless the interface says it is down ("down", "lowerlayerdown", ...: what
 * `ip link set IFACE down` on either end of a veth leaves); unreadable: up. */
static int iface_up(const char *path)
{
	char st[32] = "";
	FILE *f = fopen(path, "r");

	if (f == NULL)
		return 1;
	if (fscanf(f, "%31s", st) != 1)
		st[0] = '\0';
	fclose(f);
	return strcmp(st, "up") == 0 || strcmp(st, "unknown") == 0 || st[0] == '\0';
}

int dp_port_watch(struct dp_port *p, uint64_t now_ns)
{
	struct rte_eth_link link;
	if (!p->started && !p->reconnects)
		return 0;
	if (p->started && p->oper_path[0])
		return iface_up(p->oper_path);
	if (p->started && rte_eth_link_get_nowait(p->port, &link) == 0 &&
	    link.link_status == RTE_ETH_LINK_UP) {
		p->down_since = 0;
		return 1;
	}
	if (!p->down_since) {
		p->down_since = now_ns;
		return 0;
	}
	if (!p->reconnects || now_ns - p->down_since < 1000000000ull)
		return 0;
	kvf_log(KVF_LOG_WARNING, NULL, "dataplane: memif link down for %.1f s: reconnecting (stop and start port %u)%s",
		(now_ns - p->down_since) / 1e9, p->port,
		p->n_queues > 1 ? "; a memif server with fewer queue pairs refuses this client's: give both "
				  "dataplanes the same number of EAL lcores (-l)" : "");
	dp_port_txq_pause(p, 1); /* no worker lcore sends while the port stops */
	if (p->started)
		rte_eth_dev_stop(p->port);
	keep_memseg_fds(p);
	p->started = rte_eth_dev_start(p->port) == 0;
	if (p->started) /* else the workers stay paused: a stopped port takes no burst */
		dp_port_txq_pause(p, 0);
	p->down_since = now_ns;
	return 0;
}

void dp_port_fini(struct dp_port *p)
{
	dp_port_txq_stop(p);
	if (p->started) {
		rte_eth_dev_stop(p->port);
		rte_eth_dev_close(p->port);
	}
	if (p->extmem)
		rte_extmem_unregister(p->region_base, p->region_len);
	free(p->region_iova);
	if (p->rx_file_fd > 0) /* 0: a port never initialised */
		close(p->rx_file_fd);
	if (p->eal_up)
		rte_eal_cleanup();
	memset(p, 0, sizeof(*p));
	p->rx_file_fd = -1;
}
