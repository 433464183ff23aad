/* SPDX-License-Identifier: Apache-2.0 */
/* Private: EAL + port setup for dp.c (see port.c). */
#ifndef DP_PORT_H
#define DP_PORT_H

#include <stddef.h>
#include <stdint.h>

#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_ring.h>

#define DP_MAX_QUEUES 8 /* queue pairs of a port: one per lcore, at most */
/* Frames a TX queue's worker may be behind: ~0.2 ms of its copy (512,
 * ~1.7 ms, made the RTT jump). The receive budget leaves them (dp_run.c). */
#define DP_TXQ_RING 64

/* A frame whose payload CRC is already in its header (its producer's:
 * DP_TX_CRCS), or that needs none: a worker lcore leaves it as it is
 * (port_txq.c, fill_crcs()). The mark lives in the head mbuf's hash.usr,
 * which nothing reads on TX. */
#define DP_TXQ_CRC_DONE 0x43524344u /* "DCRC" */
static inline void dp_txq_mark_crc(struct rte_mbuf *m, int done)
{
	m->hash.usr = done ? DP_TXQ_CRC_DONE : 0;
}

/* A TX queue served by a worker lcore (port_txq.c). */
struct dp_txq {
	struct rte_ring *r;           /* frames from the main lcore (single producer, single consumer) */
	uint16_t port, queue;
	unsigned lcore;
	int launched, sleepy;
	int fill_crc;                 /* its data frames' payload CRCs are left to it ([dp] payload_crc) */
	int run, pause, paused;       /* the main lcore's requests, the worker's answer */
	uint32_t sleeping;            /* futex word: 1 while the worker sleeps on an empty ring */
	uint64_t dropped;             /* frames it dropped (refused too long, or paused) */
	uint64_t sent_frames, sent_bytes; /* handed to the driver (frame bytes, headers included) */
	uint64_t crc_bytes;           /* payload it read for the CRCs it filled in */
};

struct dp_port {
	uint16_t port;
	uint16_t n_queues;            /* queue pairs: 1, or one per EAL lcore over memif or net_af_packet (port_txq.c) */
	int queues_own;               /* the pairs are this end's alone (net_af_packet: a socket each), usable
	                                 whatever the peer has; over memif only those both ends have are connected */
	struct dp_txq txq[DP_MAX_QUEUES]; /* [1, n_queues): the worker lcores' */
	uint8_t mac[6];
	int eal_up, started;
	int multiseg;                 /* PMD takes header + ext-buffer chains */
	int reconnects;               /* net_memif client: the PMD never reconnects by itself */
	int memif_zc;                 /* net_memif client with zero-copy=yes (dp_memif_zc()) */
	int extmem;                   /* the region is registered with the EAL as external memory */
	int rx_file_fd;               /* ours, of the file the RX mbufs lie in (dp_port_rx_file()), or -1 */
	uint64_t down_since;          /* ns (caller's clock) the link was first seen down; 0: up */
	char oper_path[96];           /* net_af_packet: /sys/class/net/IFACE/operstate (its PMD's link never changes) */
	struct rte_mempool *rx_pool;  /* RX frames; also TX frames in copy mode */
	int rx_in_region;             /* rx_pool's data buffers are region memory (receive in place) */
	uint16_t n_rx_desc, n_tx_desc;
	struct rte_mempool *hdr_pool; /* TX headers */
	struct rte_mempool *ext_pool; /* data-less mbufs for region payload */
	struct rte_mbuf_ext_shared_info shinfo;
	uint64_t mbuf_bytes;
	void *region_base;
	size_t region_len, region_page, dma_mapped;
	rte_iova_t *region_iova;
};

/** EAL init (its own --file-prefix, --in-memory; --single-file-segments for a
 *  zero-copy memif client) and the port found (@p force_copy, or a zero-copy
 *  memif client: never header + ext-buffer chains). @return 0 or -errno. */
int dp_port_init(struct dp_port *p, const char *prog, uint16_t node, const char *spec,
		 const char *extra, int force_copy);

/**
 * The mbuf pools, then the port configured and started. With @p rx_area
 * (receive in place: @p rx_area_len bytes of the region, registered by
 * dp_port_register_region() first) the RX mbufs' data buffers lie there.
 * @return 0 or -errno.
 */
int dp_port_start(struct dp_port *p, const char *spec, uint16_t node, uint32_t frame_size, uint32_t n_mbufs,
		  void *rx_area, size_t rx_area_len);

/**
 * The file the RX mbufs' memory lies in, for consumers that read frames in
 * place outside the region (a zero-copy memif client, whose EAL memory is
 * one file per segment list under --single-file-segments): its start as
 * mapped here in *@p base, the bytes that cover every mbuf in *@p len, our
 * descriptor of it in *@p fd. @return 0, or -ENOTSUP (the pool spans
 * several segment lists or its memory has no file).
 */
int dp_port_rx_file(struct dp_port *p, void **base, size_t *len, int *fd);
/** Keep @p fd open whatever close() the process's libraries call on it (memif_guard.c).
 *  @return 0, -EBADF or -ENOSPC. */
int dp_guard_keep_fd(int fd);
/** Around every RX/TX burst, on any lcore: a driver's teardown in the EAL's interrupt
 *  thread waits for the bursts in flight before it unmaps their memory (memif_guard.c). */
void dp_guard_burst_enter(void);
void dp_guard_burst_leave(void);

/** rte_eth_rx_burst() / rte_eth_tx_burst() on queue @p q, inside the burst gate. */
static inline uint16_t dp_port_rx_burst(uint16_t port, uint16_t q, struct rte_mbuf **m, uint16_t n)
{
	dp_guard_burst_enter();
	uint16_t k = rte_eth_rx_burst(port, q, m, n);
	dp_guard_burst_leave();
	return k;
}

static inline uint16_t dp_port_tx_burst(uint16_t port, uint16_t q, struct rte_mbuf **m, uint16_t n)
{
	dp_guard_burst_enter();
	uint16_t k = rte_eth_tx_burst(port, q, m, n);
	dp_guard_burst_leave();
	return k;
}

/** @return the region bytes @p n_mbufs in-place RX buffers for @p frame_size take on pages of @p page (0: none fit a page). */
size_t dp_port_rx_area_bytes(uint32_t frame_size, uint32_t n_mbufs, size_t page);

/** Register the region as external memory (and DMA-map it for a real device);
 *  for a zero-copy memif client only its IOVAs are noted (dp_memif_zc()). @return 0 or -errno. */
int dp_port_register_region(struct dp_port *p, void *base, size_t len, size_t page);

/**
 * Watch the link (call every ~100 ms): a net_memif client whose link has been
 * down for a second is stopped and started again, which reconnects it. The
 * PMD connects once, at start: a server that was not listening yet, a
 * handshake that failed, or a server that restarted left the link down for
 * good. A net_af_packet port's link is its interface's operstate (the PMD
 * reports it up whatever the interface does).
 * @param now_ns a monotonic clock in ns
 * @return 1 if the link is up.
 */
int dp_port_watch(struct dp_port *p, uint64_t now_ns);

/**
 * Start a worker lcore on each TX queue q >= 1 (port_txq.c). @p sleepy: a
 * worker with nothing to send sleeps until dp_port_txq_send() wakes it
 * (idle mode sleep), else it polls. @p fill_crc: the frames handed to the
 * workers carry DP_WF_PCSUM without their payload CRC, which each worker
 * computes just before its driver copies the payload (the CRC's read brings
 * the bytes into the cache the copy then reads). @return 0 or -errno.
 */
int dp_port_txq_start(struct dp_port *p, int sleepy, int fill_crc);

/** Hand @p n frames to queue @p q's worker (q >= 1). @return how many it took; the rest are the caller's. */
unsigned dp_port_txq_send(struct dp_port *p, unsigned q, struct rte_mbuf **m, unsigned n);

/** Pause (@p on) the workers, each dropping what it holds, or let them go on. */
void dp_port_txq_pause(struct dp_port *p, int on);

/** What the workers did so far, all queues summed. */
struct dp_txq_totals {
	uint64_t frames, bytes; /* handed to the driver (frame bytes, headers included) */
	uint64_t dropped;       /* refused too long, or paused */
	uint64_t crc_bytes;     /* payload read for the CRCs they filled in */
};
void dp_port_txq_totals(const struct dp_port *p, struct dp_txq_totals *t);

/** Stop the workers and free their rings. */
void dp_port_txq_stop(struct dp_port *p);

/** Stop the port, unregister memory, clean up the EAL. */
void dp_port_fini(struct dp_port *p);

/** IOVA of a region address. */
static inline rte_iova_t dp_port_iova(const struct dp_port *p, const void *va)
{
	size_t off = (size_t)((const char *)va - (const char *)p->region_base);
	return p->region_iova[off / p->region_page] + off % p->region_page;
}

#endif
