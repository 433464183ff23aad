/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TX queues served by the EAL's worker lcores (port.h, dp_port_txq_*).
 *
 * A memif driver copies every payload byte into its shared ring inside
 * rte_eth_tx_burst(), on the lcore that calls it: with one lcore the
 * sender's copy and its protocol work share one core, and that core bounds
 * a stream of 2 MiB pages (dataplane/BENCH.md, eighth round). Given more
 * lcores (the EAL's -l), the port gets one queue pair per lcore: the main
 * lcore keeps queue 0 (control frames, and data while no other queue is
 * usable), and each worker lcore owns queue q >= 1, taking the frames the
 * main lcore built for it from a single-producer, single-consumer rte_ring
 * and calling rte_eth_tx_burst() on its own queue, so the copies of
 * different streams run on different cores. A stream always uses the same
 * queue (dp.c): its frames stay in order, which the receiver's fast
 * retransmit (dupthresh) needs.
 *
 * Where frames carry a payload CRC ([dp] payload_crc), the main lcore leaves
 * it out of the frames it hands a worker, and the worker fills it in just
 * before its driver's copy (fill_crcs()): the main lcore then reads no
 * payload byte, and each byte is read from memory once on the sender. A
 * frame whose CRC its producer gave (dp_ipc.h, DP_TX_CRCS) comes with it in
 * its header, marked (dp_txq_mark_crc()), and is read by neither.
 *
 * A queue's frames are already counted sent: one the driver keeps refusing
 * for TXQ_STALL_NS is dropped here (DP_DROP_TXFULL) and resent by the
 * reliability layer's timer. While the port is stopped and started again
 * (a memif client reconnecting, dp_port_watch()) the workers are paused
 * and drop what they hold.
 *
 * Threading: dp_port_txq_send() and pause/resume from the main lcore only;
 * each queue's ring has that one producer and its worker as the one consumer.
 */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_pause.h>
#include <rte_ring.h>

#include "dp_wire.h"
#include "kvf_log.h"
#include "port.h"

#define TXQ_BURST 32
#define TXQ_SPIN 256              /* empty polls (each a yield) before a worker sleeps (idle mode sleep) */
/* A frame the driver refuses this long is dropped: the peer reads nothing
 * (the retransmission timer's ceiling; a peer descheduled for less keeps
 * its frames, dropping them after 10 ms cost 0.7 resends a byte on a
 * loaded 2-vCPU machine). */
#define TXQ_STALL_NS 200000000ull

static uint64_t mono_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void futex_wait(uint32_t *w, uint32_t v, long ns)
{
	struct timespec t = {ns / 1000000000l, ns % 1000000000l};

	syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, v, &t, NULL, 0);
}

static void futex_wake(uint32_t *w)
{
	syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void drop_all(struct dp_txq *t, struct rte_mbuf **m, unsigned from, unsigned n)
{
	unsigned k = n - from;

	rte_pktmbuf_free_bulk(m + from, k);
	while ((n = rte_ring_sc_dequeue_burst(t->r, (void **)m, TXQ_BURST, NULL)) > 0) {
		rte_pktmbuf_free_bulk(m, n);
		k += n;
	}
	__atomic_fetch_add(&t->dropped, k, __ATOMIC_RELAXED);
}

/*
 * The payload CRC of each frame just taken, into its header. Computed here,
 * right before rte_eth_tx_burst() copies the same bytes, the CRC's read
 * brings them into this core's cache and the driver's copy reads them from
 * there: the sender reads each byte from memory once, on this core, and the
 * main lcore reads no payload at all. @return the payload bytes read.
 */
static uint64_t fill_crcs(struct rte_mbuf **m, unsigned n)
{
	uint64_t read = 0;

	for (unsigned i = 0; i < n; i++) {
		uint32_t c = 0;
		uint32_t skip = DP_FRAME_HLEN; /* the headers, all in the first segment */

		if (m[i]->hash.usr == DP_TXQ_CRC_DONE)
			continue;
		for (struct rte_mbuf *s = m[i]; s != NULL; s = s->next) {
			uint32_t len = s->data_len;

			if (skip >= len) {
				skip -= len;
				continue;
			}
			c = dp_crc32c(c, rte_pktmbuf_mtod_offset(s, const uint8_t *, skip), len - skip);
			read += len - skip;
			skip = 0;
		}
		dp_wire_set_payload_csum(rte_pktmbuf_mtod(m[i], uint8_t *), c);
	}
	return read;
}

static int txq_main(void *arg)
{
	struct dp_txq *t = arg;
	struct rte_mbuf *m[TXQ_BURST];
	unsigned n = 0, off = 0, empty = 0;
	uint64_t stalled_since = 0;

	while (__atomic_load_n(&t->run, __ATOMIC_ACQUIRE)) {
		if (__atomic_load_n(&t->pause, __ATOMIC_ACQUIRE)) {
			drop_all(t, m, off, n);
			n = off = 0;
			__atomic_store_n(&t->paused, 1, __ATOMIC_RELEASE);
			while (__atomic_load_n(&t->pause, __ATOMIC_ACQUIRE) && __atomic_load_n(&t->run, __ATOMIC_ACQUIRE))
				usleep(1000);
			__atomic_store_n(&t->paused, 0, __ATOMIC_RELEASE);
			continue;
		}
		if (off == n) {
			n = rte_ring_sc_dequeue_burst(t->r, (void **)m, TXQ_BURST, NULL);
			off = 0;
			if (n && t->fill_crc)
				__atomic_fetch_add(&t->crc_bytes, fill_crcs(m, n), __ATOMIC_RELAXED);
		}
		if (n == 0) {
			if (!t->sleepy) {
				rte_pause();
				continue;
			}
			if (++empty < TXQ_SPIN) {
				sched_yield(); /* the peer or a client may share this core */
				continue;
			}
			/* sleep until the main lcore enqueues (it wakes a sleeper) */
			__atomic_store_n(&t->sleeping, 1, __ATOMIC_SEQ_CST);
			if (rte_ring_count(t->r) == 0)
				futex_wait(&t->sleeping, 1, 100000000l);
			__atomic_store_n(&t->sleeping, 0, __ATOMIC_RELEASE);
			empty = 0;
			continue;
		}
		empty = 0;
		uint64_t bytes = 0;

		for (unsigned i = off; i < n; i++)
			bytes += m[i]->pkt_len;
		/* summed before: the driver frees what it took */
		unsigned sent = dp_port_tx_burst(t->port, t->queue, m + off, (uint16_t)(n - off));
		for (unsigned i = off + sent; i < n; i++)
			bytes -= m[i]->pkt_len;
		__atomic_fetch_add(&t->sent_bytes, bytes, __ATOMIC_RELAXED);
		__atomic_fetch_add(&t->sent_frames, sent, __ATOMIC_RELAXED);
		off += sent;
		if (sent) {
			stalled_since = 0;
		} else if (stalled_since == 0) {
			stalled_since = mono_ns();
		} else if (mono_ns() - stalled_since > TXQ_STALL_NS) {
			/* the peer reads nothing: let the retransmission timer resend */
			rte_pktmbuf_free_bulk(m + off, n - off);
			__atomic_fetch_add(&t->dropped, n - off, __ATOMIC_RELAXED);
			n = off = 0;
			stalled_since = 0;
		} else if (t->sleepy) {
			sched_yield(); /* the peer must run to make room */
		} else {
			rte_pause();
		}
	}
	drop_all(t, m, off, n);
	return 0;
}

int dp_port_txq_start(struct dp_port *p, int sleepy, int fill_crc)
{
	unsigned lcore = rte_get_main_lcore();

	for (unsigned q = 1; q < p->n_queues; q++) {
		struct dp_txq *t = &p->txq[q];
		char name[RTE_RING_NAMESIZE];

		/* wrap: the main lcore need not be the lowest (--main-lcore) */
		lcore = rte_get_next_lcore(lcore, 1, 1);
		if (lcore >= RTE_MAX_LCORE) {
			kvf_log(KVF_LOG_ERR, NULL, "dataplane: no worker lcore left for TX queue %u of %u: give the "
				"EAL one lcore per queue pair (-l)", q, p->n_queues);
			return -ENODEV;
		}
		snprintf(name, sizeof(name), "dptxq%u_%u", p->port, q);
		t->r = rte_ring_create(name, DP_TXQ_RING, rte_socket_id(), RING_F_SP_ENQ | RING_F_SC_DEQ);
		if (t->r == NULL) {
			kvf_log(KVF_LOG_ERR, NULL, "dataplane: rte_ring_create(%s) failed: %s", name,
				rte_strerror(rte_errno));
			return -ENOMEM;
		}
		t->port = p->port;
		t->queue = (uint16_t)q;
		t->lcore = lcore;
		t->sleepy = sleepy;
		t->fill_crc = fill_crc;
		t->run = 1;
		int r = rte_eal_remote_launch(txq_main, t, lcore);
		if (r) {
			kvf_log(KVF_LOG_ERR, NULL, "dataplane: lcore %u would not start TX queue %u: %s", lcore, q,
				rte_strerror(-r));
			t->run = 0;
			return r;
		}
		t->launched = 1;
	}
	return 0;
}

unsigned dp_port_txq_send(struct dp_port *p, unsigned q, struct rte_mbuf **m, unsigned n)
{
	struct dp_txq *t = &p->txq[q];
	unsigned k = rte_ring_sp_enqueue_burst(t->r, (void *const *)m, n, NULL);
	uint32_t one = 1;

	if (k && __atomic_compare_exchange_n(&t->sleeping, &one, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
		futex_wake(&t->sleeping);
	return k;
}

void dp_port_txq_pause(struct dp_port *p, int on)
{
	for (unsigned q = 1; q < p->n_queues; q++)
		if (p->txq[q].launched)
			__atomic_store_n(&p->txq[q].pause, on, __ATOMIC_RELEASE);
	for (unsigned q = 1; q < p->n_queues; q++) {
		struct dp_txq *t = &p->txq[q];
		uint32_t one = 1;

		if (!t->launched)
			continue;
		if (__atomic_compare_exchange_n(&t->sleeping, &one, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
			futex_wake(&t->sleeping);
		/* the worker drops what it holds and says so: no tx_burst runs past here */
		while (on && !__atomic_load_n(&t->paused, __ATOMIC_ACQUIRE))
			usleep(100);
	}
}

void dp_port_txq_totals(const struct dp_port *p, struct dp_txq_totals *t)
{
	memset(t, 0, sizeof(*t));
	for (unsigned q = 1; q < p->n_queues; q++) {
		t->frames += __atomic_load_n(&p->txq[q].sent_frames, __ATOMIC_RELAXED);
		t->bytes += __atomic_load_n(&p->txq[q].sent_bytes, __ATOMIC_RELAXED);
		t->dropped += __atomic_load_n(&p->txq[q].dropped, __ATOMIC_RELAXED);
		t->crc_bytes += __atomic_load_n(&p->txq[q].crc_bytes, __ATOMIC_RELAXED);
	}
}

void dp_port_txq_stop(struct dp_port *p)
{
	for (unsigned q = 1; q < p->n_queues; q++) {
		struct dp_txq *t = &p->txq[q];

		if (t->launched) {
			uint32_t one = 1;

			__atomic_store_n(&t->run, 0, __ATOMIC_RELEASE);
			if (__atomic_compare_exchange_n(&t->sleeping, &one, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
				futex_wake(&t->sleeping);
			rte_eal_wait_lcore(t->lcore);
			t->launched = 0;
		}
		rte_ring_free(t->r);
		t->r = NULL;
	}
}
