/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reliability state machine (see dp_reliab.h for the protocol).
 *
 * Transmit invariants:
 *   snd_una <= snd_nxt <= snd_una + window        (sequence space, mod 2^32)
 *   messages m_head <= m_seg <= m_tail <= m_head + max_msgs
 *   every frame in [snd_una, snd_nxt) belongs to a message in [m_head, m_seg],
 *   and frames of one message have consecutive sequence numbers.
 *   A frame in the window is on the resend deque iff F_INQ is set (so it is
 *   queued once); entries below snd_una are stale and skipped. New frames go
 *   out only while the deque is empty, so snd_nxt is fixed while entries wait
 *   and they are distinct sequences within one window: capacity `window`.
 * Breaking the first lets a frame table slot be reused while still
 * unacknowledged (silent loss); breaking the last double-sends.
 *
 * Receive invariants:
 *   bit (s & (window-1)) of `have` is set iff frame s in [rcv_nxt, rcv_nxt+window)
 *   arrived; bits below rcv_nxt are clear.
 *   slot (id & (max_msgs-1)) is valid iff message id in [msg_next, msg_next+max_msgs)
 *   has a buffer; a valid slot is delivered exactly once, when frags == frag_count
 *   and id == msg_next.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dp_reliab.h"

#define F_SENT 0x1u   /* transmitted at least once */
#define F_SACKED 0x2u /* receiver has it beyond a hole */
#define F_INQ 0x4u    /* on the resend deque */
#define F_RESENT 0x8u /* sent more than once */
#define F_CSUM 0x10u  /* csum holds the payload's CRC32C */
#define RACK_SCAN 1024u /* frames one ACK's loss detection looks at */

static inline int seq_lt(uint32_t a, uint32_t b)
{
	return (int32_t)(a - b) < 0;
}

static inline int is_pow2(uint32_t x)
{
	return x && !(x & (x - 1));
}

void dp_rel_opts_init(struct dp_rel_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->window = 4096;
	o->max_msgs = 64;
	o->frame_payload = 9000 - DP_FRAME_HLEN;
	o->init_credit = 8;
	o->dupthresh = 3;
	o->max_timeouts = 16; /* 0.2 ms doubling to 200 ms: ~1.4 s without progress */
	/* The RTO follows the measured RTT (srtt + 4 rttvar), so a dataplane
	 * descheduled for ~0.5 ms on the shared 2-vCPU CI machine raises it by
	 * itself. The floor only guards against a too-small variance: with the
	 * old 1 ms floor every tail loss cost >= 1 ms, and 2 MiB messages under
	 * 1% loss ran at 0.31 of the loss-free rate. */
	o->rto_init_ns = 5000000;
	o->rto_min_ns = 200000;
	o->rto_max_ns = 200000000;
}

int dp_rel_opts_check(const struct dp_rel_opts *o)
{
	if (!o || !is_pow2(o->window) || o->window < 512 || o->window > 65536)
		return -EINVAL;
	if (!is_pow2(o->max_msgs) || o->max_msgs > 65536)
		return -EINVAL;
	if (o->frame_payload < 1 || o->frame_payload > DP_FRAME_MAX - DP_FRAME_HLEN)
		return -EINVAL;
	if (o->init_credit < 1 || o->dupthresh < 1 || o->max_timeouts < 1)
		return -EINVAL;
	if (o->rto_min_ns == 0 || o->rto_min_ns > o->rto_max_ns)
		return -EINVAL;
	return 0;
}

/* ---------------------------------------------------------------- transmit */

struct tx_msg {
	uint64_t off;
	uint64_t cookie;
	uint64_t msg_id;
	uint32_t len;
	uint32_t frag_count;
	uint32_t first_seq;
	uint8_t type;
	const uint32_t *csums; /* the producer's payload CRC of each frame (dp_rel_tx_give_csums()), or NULL */
};

struct tx_frame {
	uint64_t sent_ns;
	uint64_t msg;      /* message counter (index into msgs with mask) */
	uint32_t frag_idx;
	uint32_t flags;
	uint32_t csum;     /* with F_CSUM */
};

struct dp_rel_tx {
	struct dp_rel_opts o;
	struct tx_msg *msgs;
	struct tx_frame *frames;
	uint32_t *rq;       /* resend deque of sequence numbers, capacity window */
	uint32_t rq_head, rq_len;
	uint64_t m_head, m_seg, m_tail;
	uint32_t seg_frag;  /* next fragment of message m_seg */
	uint32_t snd_una, snd_nxt;
	uint64_t next_msg_id;
	uint64_t peer_limit;
	uint64_t srtt, rttvar, rto;
	uint32_t stalls;    /* consecutive timeouts without progress while the peer answered */
	uint8_t answered;   /* since the last timeout, an ACK echoed a frame sent after it */
	uint64_t expired_ns; /* when the last timeout fired */
	struct dp_rel_tx_stats st;
};

static void tx_reset(struct dp_rel_tx *tx)
{
	tx->rq_head = tx->rq_len = 0;
	tx->m_head = tx->m_seg = tx->m_tail = 0;
	tx->seg_frag = 0;
	tx->snd_una = tx->snd_nxt = 0;
	tx->next_msg_id = 1;
	tx->peer_limit = 1 + (uint64_t)tx->o.init_credit;
	tx->srtt = tx->rttvar = 0;
	tx->rto = tx->o.rto_init_ns;
	tx->stalls = 0;
	tx->answered = 0;
	tx->expired_ns = 0;
	memset(tx->frames, 0, sizeof(*tx->frames) * tx->o.window);
}

struct dp_rel_tx *dp_rel_tx_create(const struct dp_rel_opts *o)
{
	if (dp_rel_opts_check(o)) {
		errno = EINVAL;
		return NULL;
	}
	struct dp_rel_tx *tx = calloc(1, sizeof(*tx));
	if (!tx)
		goto fail;
	tx->o = *o;
	tx->msgs = calloc(o->max_msgs, sizeof(*tx->msgs));
	if (!tx->msgs)
		goto fail_tx;
	tx->frames = calloc(o->window, sizeof(*tx->frames));
	if (!tx->frames)
		goto fail_msgs;
	tx->rq = calloc(o->window, sizeof(*tx->rq));
	if (!tx->rq)
		goto fail_frames;
	tx_reset(tx);
	return tx;

fail_frames:
	free(tx->frames);
fail_msgs:
	free(tx->msgs);
fail_tx:
	free(tx);
fail:
	errno = ENOMEM;
	return NULL;
}

void dp_rel_tx_destroy(struct dp_rel_tx *tx)
{
	if (!tx)
		return;
	free(tx->rq);
	free(tx->frames);
	free(tx->msgs);
	free(tx);
}

uint64_t dp_rel_tx_next_id(const struct dp_rel_tx *tx)
{
	return tx->next_msg_id;
}

int dp_rel_tx_submit(struct dp_rel_tx *tx, uint64_t off, uint32_t len, uint8_t type,
		     uint64_t cookie)
{
	if (tx->m_tail - tx->m_head >= tx->o.max_msgs)
		return -ENOSPC;
	struct tx_msg *m = &tx->msgs[tx->m_tail & (tx->o.max_msgs - 1)];
	uint64_t nf = len ? ((uint64_t)len + tx->o.frame_payload - 1) / tx->o.frame_payload : 1;
	if (nf > UINT32_MAX / 2)
		return -EINVAL;
	m->off = off;
	m->len = len;
	m->type = type;
	m->cookie = cookie;
	m->msg_id = tx->next_msg_id++;
	m->frag_count = (uint32_t)nf;
	m->first_seq = 0;
	m->csums = NULL;
	tx->m_tail++;
	return 0;
}

void dp_rel_tx_give_csums(struct dp_rel_tx *tx, const uint32_t *csums)
{
	if (tx->m_tail != tx->m_head)
		tx->msgs[(tx->m_tail - 1) & (tx->o.max_msgs - 1)].csums = csums;
}

static inline struct tx_frame *fr(struct dp_rel_tx *tx, uint32_t seq)
{
	return &tx->frames[seq & (tx->o.window - 1)];
}

static void rq_push_back(struct dp_rel_tx *tx, uint32_t seq)
{
	tx->rq[(tx->rq_head + tx->rq_len) & (tx->o.window - 1)] = seq;
	tx->rq_len++;
	fr(tx, seq)->flags |= F_INQ;
}

static void rq_push_front(struct dp_rel_tx *tx, uint32_t seq)
{
	tx->rq_head = (tx->rq_head - 1) & (tx->o.window - 1);
	tx->rq[tx->rq_head] = seq;
	tx->rq_len++;
	fr(tx, seq)->flags |= F_INQ;
}

static void fill_frame(struct dp_rel_tx *tx, uint32_t seq, struct dp_rel_frame *f)
{
	struct tx_frame *t = fr(tx, seq);
	const struct tx_msg *m = &tx->msgs[t->msg & (tx->o.max_msgs - 1)];
	uint64_t foff = (uint64_t)t->frag_idx * tx->o.frame_payload;
	uint64_t plen = m->len - foff;
	if (plen > tx->o.frame_payload)
		plen = tx->o.frame_payload;
	f->msg_id = m->msg_id;
	f->payload_off = m->off + foff;
	f->seq = seq;
	f->msg_len = m->len;
	f->frag_off = (uint32_t)foff;
	f->frag_idx = t->frag_idx;
	f->frag_count = m->frag_count;
	f->payload_len = (uint16_t)plen;
	f->type = m->type;
	f->retx = (t->flags & F_SENT) ? 1 : 0;
	f->have_csum = (t->flags & F_CSUM) ? 1 : 0;
	f->csum = t->csum;
	if (!f->have_csum && m->csums) {
		f->have_csum = 1;
		f->csum = m->csums[t->frag_idx];
	}
}

void dp_rel_tx_note_csum(struct dp_rel_tx *tx, uint32_t seq, uint32_t csum)
{
	if (seq_lt(seq, tx->snd_una) || !seq_lt(seq, tx->snd_nxt))
		return;
	struct tx_frame *t = fr(tx, seq);
	t->csum = csum;
	t->flags |= F_CSUM;
}

unsigned dp_rel_tx_burst(struct dp_rel_tx *tx, uint64_t now, struct dp_rel_frame *f, unsigned max)
{
	unsigned n = 0;
	while (n < max && tx->rq_len) {
		uint32_t seq = tx->rq[tx->rq_head];
		tx->rq_head = (tx->rq_head + 1) & (tx->o.window - 1);
		tx->rq_len--;
		if (seq_lt(seq, tx->snd_una))
			continue; /* acknowledged while it waited; its slot may be reused */
		struct tx_frame *t = fr(tx, seq);
		t->flags &= ~F_INQ;
		if (t->flags & F_SACKED)
			continue;
		fill_frame(tx, seq, &f[n]);
		if (f[n].retx) {
			tx->st.retransmits++;
			t->flags |= F_RESENT;
		}
		t->flags |= F_SENT;
		t->sent_ns = now;
		n++;
	}
	/* New frames only once every resend went out: keeps the receiver's view
	 * in order when the TX queue was full (no spurious fast retransmits). */
	while (n < max && !tx->rq_len && tx->snd_nxt - tx->snd_una < tx->o.window &&
	       tx->m_seg != tx->m_tail) {
		struct tx_msg *m = &tx->msgs[tx->m_seg & (tx->o.max_msgs - 1)];
		if (m->msg_id >= tx->peer_limit)
			break; /* no credit */
		if (tx->seg_frag == 0)
			m->first_seq = tx->snd_nxt;
		uint32_t seq = tx->snd_nxt++;
		struct tx_frame *t = fr(tx, seq);
		t->msg = tx->m_seg;
		t->frag_idx = tx->seg_frag;
		t->flags = 0;
		fill_frame(tx, seq, &f[n]);
		t->flags = F_SENT;
		t->sent_ns = now;
		n++;
		if (++tx->seg_frag == m->frag_count) {
			tx->seg_frag = 0;
			tx->m_seg++;
		}
	}
	tx->st.frames += n;
	return n;
}

void dp_rel_tx_unsent(struct dp_rel_tx *tx, const struct dp_rel_frame *f, unsigned n)
{
	for (unsigned i = n; i-- > 0;) {
		struct tx_frame *t = fr(tx, f[i].seq);
		if (seq_lt(f[i].seq, tx->snd_una) || (t->flags & F_INQ))
			continue;
		if (!f[i].retx)
			t->flags &= ~F_SENT;
		else
			tx->st.retransmits--;
		tx->st.frames--;
		rq_push_front(tx, f[i].seq);
	}
}

static void rtt_sample(struct dp_rel_tx *tx, uint64_t r)
{
	/* RFC 6298 with alpha 1/8, beta 1/4. */
	if (tx->srtt == 0) {
		tx->srtt = r;
		tx->rttvar = r / 2;
	} else {
		uint64_t d = r > tx->srtt ? r - tx->srtt : tx->srtt - r;
		tx->rttvar = (3 * tx->rttvar + d) / 4;
		tx->srtt = (7 * tx->srtt + r) / 8;
	}
	uint64_t rto = tx->srtt + 4 * tx->rttvar;
	if (rto < tx->o.rto_min_ns)
		rto = tx->o.rto_min_ns;
	if (rto > tx->o.rto_max_ns)
		rto = tx->o.rto_max_ns;
	tx->rto = rto;
}

static int complete_msgs(struct dp_rel_tx *tx, dp_rel_msg_fn done, void *ctx)
{
	int n = 0;
	while (tx->m_head != tx->m_seg) {
		struct tx_msg *m = &tx->msgs[tx->m_head & (tx->o.max_msgs - 1)];
		uint32_t end = m->first_seq + m->frag_count;
		if (seq_lt(tx->snd_una, end))
			break;
		struct dp_rel_msg d = {.msg_id = m->msg_id, .off = m->off, .cookie = m->cookie,
				       .len = m->len, .type = m->type, .status = 0};
		tx->m_head++;
		if (done)
			done(ctx, &d);
		n++;
	}
	return n;
}

/* The send time RACK keeps after a frame an ACK newly covers: the frame's
 * if newer, but a resent frame's only when the ACK was triggered by a frame
 * sent no earlier than the resend (RFC 8985, 6.2): else its original may be
 * what arrived, and the resend's later time would mark every frame sent
 * before it lost. Without this rule one spurious timeout under a deep queue
 * set off a dozen spurious resends (memif to a zero-copy client, loss-free,
 * 2 vCPUs: 82 timeouts, 1,083 frames resent, every one a duplicate). */
static uint64_t rack_newer(const struct tx_frame *t, uint64_t rack_ts, uint64_t ts_echo)
{
	if (t->sent_ns <= rack_ts || ((t->flags & F_RESENT) && ts_echo < t->sent_ns))
		return rack_ts;
	return t->sent_ns;
}

int dp_rel_tx_on_ack(struct dp_rel_tx *tx, const struct dp_wire_ack *ack, uint64_t now,
		     dp_rel_msg_fn done, void *ctx)
{
	uint32_t cum = ack->cum_seq;
	/* Even an ACK that cannot be applied says the peer is there (a session
	 * whose ends disagree answers like this, and only giving up mends it),
	 * if it echoes a frame sent since the last timeout: an old ACK let out
	 * late during an outage (the fault drill's link-down: dataplane 2 heard
	 * a frame from node 1 every second or two) proves nothing, and counting
	 * it gave up the session three times over a 5 s outage. */
	if (ack->ts_echo && ack->ts_echo >= tx->expired_ns)
		tx->answered = 1;
	if (seq_lt(tx->snd_nxt, cum))
		return -EINVAL;
	int progress = 0, credit_only = 0;
	uint64_t rack_ts = 0; /* newest send time among frames this ACK newly covers */
	if (seq_lt(tx->snd_una, cum)) {
		for (uint32_t s = tx->snd_una; s != cum; s++) {
			struct tx_frame *t = fr(tx, s);
			if ((t->flags & (F_SENT | F_SACKED)) == F_SENT)
				rack_ts = rack_newer(t, rack_ts, ack->ts_echo);
			t->flags = 0; /* a deque entry for s is now stale: burst skips it */
		}
		tx->snd_una = cum;
		progress = 1;
	}
	int have_high = 0;
	uint32_t high = 0;
	for (unsigned w = 0; w < DP_SACK_WORDS; w++) {
		uint64_t bits = ack->sack[w];
		while (bits) {
			unsigned b = (unsigned)__builtin_ctzll(bits);
			bits &= bits - 1;
			uint32_t s = cum + 1 + 64 * w + b;
			if (!seq_lt(s, tx->snd_nxt))
				break;
			if (seq_lt(s, tx->snd_una))
				continue; /* a late ACK: this slot may hold a newer frame now */
			struct tx_frame *t = fr(tx, s);
			if (!(t->flags & F_SACKED)) {
				t->flags |= F_SACKED;
				progress = 1;
				rack_ts = rack_newer(t, rack_ts, ack->ts_echo);
			}
			high = s;
			have_high = 1;
		}
	}
	if (ack->msg_limit > tx->peer_limit) {
		tx->peer_limit = ack->msg_limit;
		credit_only = !progress;
	}
	if (progress || credit_only)
		tx->stalls = 0;
	if (progress && ack->ts_echo && ack->ts_echo <= now)
		rtt_sample(tx, now - ack->ts_echo);
	if (have_high || rack_ts) {
		/* Loss detection, two rules:
		 *  - fast retransmit: a hole with dupthresh SACKed frames above it;
		 *  - time order (RACK, RFC 8985, simplified): a frame sent more
		 *    than a quarter RTT before one this ACK newly covers. This
		 *    catches runs of lost frames with nothing SACKed above them
		 *    (a message refused whole for want of a reassembly buffer):
		 *    once the RTO's single resend is acknowledged, the rest of
		 *    the run goes at once instead of one frame per RTO.
		 * A lost frame is resent at once; one already resent goes again
		 * only once its resend is a smoothed RTT old (its SACK could not
		 * have come back sooner). Gating the first resend by max(srtt,
		 * RTO floor) as well left every hole waiting ~1 ms, i.e. for the
		 * RTO. The scan stops at RACK_SCAN frames to bound the work per ACK. */
		uint64_t gap = tx->srtt ? tx->srtt : tx->o.rto_min_ns;
		uint64_t reo = tx->srtt / 4;
		uint32_t scanned = 0;
		for (uint32_t s = tx->snd_una; seq_lt(s, tx->snd_nxt) && scanned < RACK_SCAN;
		     s++, scanned++) {
			struct tx_frame *t = fr(tx, s);
			int by_sack = have_high && seq_lt(s, high) && high - s >= tx->o.dupthresh;
			int by_time = (t->flags & F_SENT) && t->sent_ns + reo < rack_ts;
			if (!by_sack && !by_time) {
				if (!seq_lt(s, high) || !have_high)
					break; /* later frames were sent later still */
				continue;
			}
			if (t->flags & (F_SACKED | F_INQ))
				continue;
			if ((t->flags & F_RESENT) && now - t->sent_ns < gap)
				continue;
			rq_push_back(tx, s);
		}
	}
	return complete_msgs(tx, done, ctx);
}

int dp_rel_tx_timer(struct dp_rel_tx *tx, uint64_t now)
{
	if (tx->snd_una == tx->snd_nxt)
		return 0;
	/* The oldest frame still waiting sets the deadline. */
	uint64_t oldest = UINT64_MAX;
	for (uint32_t s = tx->snd_una; s != tx->snd_nxt; s++) {
		struct tx_frame *t = fr(tx, s);
		if ((t->flags & F_SENT) && !(t->flags & (F_SACKED | F_INQ))) {
			oldest = t->sent_ns;
			break;
		}
	}
	if (oldest == UINT64_MAX || now - oldest < tx->rto)
		return 0;
	tx->st.timeouts++;
	/* Resend only the oldest frame: its ACK carries the SACKs and the send
	 * times that let dp_rel_tx_on_ack() find the other losses. Resending
	 * every expired frame (go-back-N) tripled the frames resent under 1%
	 * loss on the shared CI machine, where a descheduled receiver makes
	 * RTOs fire with thousands of frames still queued in the memif ring. */
	for (uint32_t s = tx->snd_una; s != tx->snd_nxt; s++) {
		struct tx_frame *t = fr(tx, s);
		if ((t->flags & F_SENT) && !(t->flags & (F_SACKED | F_INQ))) {
			rq_push_back(tx, s);
			break;
		}
	}
	tx->rto = tx->rto * 2 > tx->o.rto_max_ns ? tx->o.rto_max_ns : tx->rto * 2;
	/* Only a timeout after which the peer still answered counts toward
	 * giving up: a silent peer (a link down, a process stopped or
	 * descheduled, a dead one) is the liveness watch's to report
	 * (DP_EV_PEER_SILENT), and the session is kept for it. Counting silent
	 * timeouts too ended the session of a peer that was only unreachable
	 * for ~1.4 s: after a 5 s link outage both ends came back with new
	 * epochs, and each end's RESTART took ctrld's chain down again (three
	 * chain falls, 24 replays of 8 requests in the fault drill). */
	if (tx->answered)
		tx->stalls++;
	tx->answered = 0;
	tx->expired_ns = now;
	if (tx->stalls > tx->o.max_timeouts)
		return -ETIMEDOUT;
	return 0;
}

unsigned dp_rel_tx_fail_all(struct dp_rel_tx *tx, int status, dp_rel_msg_fn done, void *ctx)
{
	unsigned n = 0;
	for (uint64_t i = tx->m_head; i != tx->m_tail; i++) {
		struct tx_msg *m = &tx->msgs[i & (tx->o.max_msgs - 1)];
		struct dp_rel_msg d = {.msg_id = m->msg_id, .off = m->off, .cookie = m->cookie,
				       .len = m->len, .type = m->type, .status = status};
		if (done)
			done(ctx, &d);
		n++;
	}
	tx_reset(tx);
	return n;
}

int dp_rel_tx_idle(const struct dp_rel_tx *tx)
{
	return tx->m_head == tx->m_tail;
}

uint32_t dp_rel_tx_outstanding(const struct dp_rel_tx *tx)
{
	return (uint32_t)(tx->m_tail - tx->m_head);
}

/* Messages the receiver still accepts beyond those submitted. */
static uint64_t credit_left(const struct dp_rel_tx *tx)
{
	return tx->peer_limit > tx->next_msg_id ? tx->peer_limit - tx->next_msg_id : 0;
}

void dp_rel_tx_get_stats(const struct dp_rel_tx *tx, struct dp_rel_tx_stats *s)
{
	*s = tx->st;
	s->srtt_ns = tx->srtt;
	s->rto_ns = tx->rto;
	s->credit = credit_left(tx);
}

void dp_rel_tx_stall_info(const struct dp_rel_tx *tx, struct dp_rel_tx_stall *st)
{
	*st = (struct dp_rel_tx_stall){ .unacked = tx->snd_nxt - tx->snd_una, .stalls = tx->stalls,
					.credit = credit_left(tx) };
	if (tx->snd_una == tx->snd_nxt)
		return;
	const struct tx_frame *t = &tx->frames[tx->snd_una & (tx->o.window - 1)];
	const struct tx_msg *m = &tx->msgs[t->msg & (tx->o.max_msgs - 1)];
	st->msg_id = m->msg_id;
	st->frag_idx = t->frag_idx;
	st->frag_count = m->frag_count;
}

/* ----------------------------------------------------------------- receive */

struct rx_slot {
	uint64_t msg_id;
	uint64_t off;
	uint32_t len;
	uint32_t frag_count;
	uint32_t frags;
	uint8_t type;
	uint8_t valid;
};

struct dp_rel_rx {
	struct dp_rel_opts o;
	struct dp_rel_rx_ops ops;
	void *ctx;
	uint64_t *have;     /* window bits */
	struct rx_slot *slots;
	uint32_t rcv_nxt;
	uint64_t msg_next;
	uint64_t ts_echo;
	int ack_owed;
};

struct dp_rel_rx *dp_rel_rx_create(const struct dp_rel_opts *o, const struct dp_rel_rx_ops *ops,
				   void *ctx)
{
	if (dp_rel_opts_check(o) || !ops || !ops->alloc || !ops->deliver) {
		errno = EINVAL;
		return NULL;
	}
	struct dp_rel_rx *rx = calloc(1, sizeof(*rx));
	if (!rx)
		goto fail;
	rx->o = *o;
	rx->ops = *ops;
	rx->ctx = ctx;
	rx->have = calloc(o->window / 64, sizeof(uint64_t));
	if (!rx->have)
		goto fail_rx;
	rx->slots = calloc(o->max_msgs, sizeof(*rx->slots));
	if (!rx->slots)
		goto fail_have;
	rx->msg_next = 1;
	return rx;

fail_have:
	free(rx->have);
fail_rx:
	free(rx);
fail:
	errno = ENOMEM;
	return NULL;
}

void dp_rel_rx_reset(struct dp_rel_rx *rx)
{
	for (uint32_t i = 0; i < rx->o.max_msgs; i++) {
		struct rx_slot *sl = &rx->slots[i];
		if (sl->valid && rx->ops.release)
			rx->ops.release(rx->ctx, sl->off, sl->len);
		sl->valid = 0;
	}
	memset(rx->have, 0, rx->o.window / 8);
	rx->rcv_nxt = 0;
	rx->msg_next = 1;
	rx->ts_echo = 0;
	rx->ack_owed = 0;
}

void dp_rel_rx_destroy(struct dp_rel_rx *rx)
{
	if (!rx)
		return;
	dp_rel_rx_reset(rx);
	free(rx->slots);
	free(rx->have);
	free(rx);
}

static inline int have_get(const struct dp_rel_rx *rx, uint32_t s)
{
	uint32_t i = s & (rx->o.window - 1);
	return (int)((rx->have[i / 64] >> (i % 64)) & 1);
}

static inline void have_set(struct dp_rel_rx *rx, uint32_t s, int v)
{
	uint32_t i = s & (rx->o.window - 1);
	if (v)
		rx->have[i / 64] |= 1ull << (i % 64);
	else
		rx->have[i / 64] &= ~(1ull << (i % 64));
}

int dp_rel_rx_place(struct dp_rel_rx *rx, const struct dp_wire_hdr *h, uint64_t *dst_off)
{
	uint32_t d = h->seq - rx->rcv_nxt;
	if (d >= 0x80000000u)
		return DP_DROP_DUP; /* below rcv_nxt */
	if (d >= rx->o.window)
		return DP_DROP_WINDOW;
	if (have_get(rx, h->seq))
		return DP_DROP_DUP;
	if (h->msg_id < rx->msg_next)
		return DP_DROP_DUP;
	if (h->msg_id - rx->msg_next >= rx->o.max_msgs)
		return DP_DROP_WINDOW;
	struct rx_slot *sl = &rx->slots[h->msg_id & (rx->o.max_msgs - 1)];
	if (!sl->valid) {
		uint64_t off;
		if (rx->ops.alloc(rx->ctx, h->msg_len, h->type, &off))
			return DP_DROP_NOBUF;
		sl->msg_id = h->msg_id;
		sl->off = off;
		sl->len = h->msg_len;
		sl->frag_count = h->frag_count;
		sl->frags = 0;
		sl->type = h->type;
		sl->valid = 1;
	} else if (sl->msg_id != h->msg_id || sl->len != h->msg_len ||
		   sl->frag_count != h->frag_count || sl->type != h->type) {
		return DP_DROP_BAD_FIELD;
	}
	*dst_off = sl->off + h->frag_off;
	return 0;
}

int dp_rel_rx_commit(struct dp_rel_rx *rx, const struct dp_wire_hdr *h)
{
	/* place() said yes and nothing ran in between: the frame is in window. */
	have_set(rx, h->seq, 1);
	while (have_get(rx, rx->rcv_nxt)) {
		have_set(rx, rx->rcv_nxt, 0);
		rx->rcv_nxt++;
	}
	struct rx_slot *sl = &rx->slots[h->msg_id & (rx->o.max_msgs - 1)];
	sl->frags++;
	int n = 0;
	for (;;) {
		sl = &rx->slots[rx->msg_next & (rx->o.max_msgs - 1)];
		if (!sl->valid || sl->msg_id != rx->msg_next || sl->frags != sl->frag_count)
			break;
		struct dp_rel_msg m = {.msg_id = sl->msg_id, .off = sl->off, .len = sl->len,
				       .type = sl->type, .status = 0};
		sl->valid = 0;
		rx->msg_next++;
		rx->ops.deliver(rx->ctx, &m);
		n++;
	}
	return n;
}

void dp_rel_rx_note(struct dp_rel_rx *rx, uint64_t tsval)
{
	/* Echo the newest timestamp since the last ACK, once: a periodic ACK
	 * repeating an old echo made the sender sample a huge RTT. */
	if (tsval > rx->ts_echo)
		rx->ts_echo = tsval;
	rx->ack_owed = 1;
}

int dp_rel_rx_ack_pending(const struct dp_rel_rx *rx)
{
	return rx->ack_owed;
}

void dp_rel_rx_make_ack(struct dp_rel_rx *rx, uint32_t credit, struct dp_wire_ack *ack)
{
	memset(ack, 0, sizeof(*ack));
	ack->cum_seq = rx->rcv_nxt;
	if (credit > rx->o.max_msgs)
		credit = rx->o.max_msgs;
	ack->msg_limit = rx->msg_next + credit;
	ack->ts_echo = rx->ts_echo;
	rx->ts_echo = 0;
	uint32_t nbits = DP_SACK_BITS < rx->o.window - 1 ? DP_SACK_BITS : rx->o.window - 1;
	for (uint32_t i = 0; i < nbits; i++)
		if (have_get(rx, rx->rcv_nxt + 1 + i))
			ack->sack[i / 64] |= 1ull << (i % 64);
	rx->ack_owed = 0;
}

uint64_t dp_rel_rx_next_msg(const struct dp_rel_rx *rx)
{
	return rx->msg_next;
}
