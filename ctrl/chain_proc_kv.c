/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The worker chain's KV pages (ctrl_chain kv_format / kv_export /
 * kv_import / kv_copies): each call is one SHM_MB_KV message down the
 * chain, in order with the micro-batches, answered when it comes back on
 * the return hop; kv_copies puts a batch of buffers in one message (as many
 * as its words allow), so the stage drains its running steps once for them.
 * A stage whose worker made KV side rings (kernels/worker/worker_kv.c)
 * gets page copies on them instead: taken at once, ahead of the
 * micro-batches queued for it and beside its steps in flight, answered in
 * the message itself. What goes there may run out of order with the steps:
 * the pages a prefill node exports are final (their chunk came back from
 * every stage), and the blocks a decode node imports into are reserved and
 * untouched until the pages landed.
 * The pages never pass through ctrld: the target stage copies between its
 * pool and the caller's buffer, which must lie in the chain's region (a
 * dataplane page buffer: ctrl/pd_link.c), and the stage must run on this
 * node.
 *
 * Threading: the calls may come from any thread (the PD poller imports,
 * the scheduler's thread exports). One KV message is in flight at a time
 * (kv_mu); the chain's state is shared with submit and poll under mu; the
 * caller drains the return hop itself while it waits, so a scheduler thread
 * that is busy elsewhere cannot hold the answer back (the results it drains
 * for groups wait in the done queue for the next poll).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chain_proc_int.h"
#include "kvf_log.h"
#include "shm_mb.h"
#include "shm_region.h"
#include "shm_ring.h"

/* The return hop brought back our KV message: keep its answer. */
void pc_kv_reply(struct proc_chain *c, const struct shm_mb_hdr *h, size_t len)
{
	if (h->epoch != c->epoch || h->seq != c->kv_seq || c->kv_done || !shm_mb_kv_whole(h, len, PC_KV_MAX_BLOCKS))
		return; /* an answer to a call that already gave up */
	c->kv_status = h->status;
	memcpy(c->kv_err, h->err, sizeof(c->kv_err) < sizeof(h->err) ? sizeof(c->kv_err) : sizeof(h->err));
	c->kv_err[sizeof(c->kv_err) - 1] = '\0';
	memcpy(&c->kv_ans, h + 1, sizeof(c->kv_ans));
	c->kv_done = 1;
}

static void side_drop(struct pc_kv_side *s)
{
	shm_ring_close(s->q);
	shm_ring_close(s->r);
	shm_ring_close(s->in);
	shm_ring_close(s->kvl);
	s->q = s->r = s->in = s->kvl = NULL;
}

void pc_kv_side_close(struct proc_chain *c)
{
	for (int32_t k = 0; k < CTRL_CHAIN_MAX_STAGES; k++) {
		side_drop(&c->side[k]);
		c->side[k].epoch = 0;
	}
	c->kv_side_r = NULL; /* a call waiting on it gives up (kv_call) */
}

/* Stage @p stage's side rings, looked up once an epoch (a worker makes
 * them as it starts). @return the rings, or NULL: the message goes in
 * band. Called with mu held. */
static struct pc_kv_side *kv_side(struct proc_chain *c, int32_t stage)
{
	struct pc_kv_side *s = &c->side[stage];
	char in[SHM_NAME_MAX], name[SHM_NAME_MAX + 8];

	if (s->epoch != c->epoch || s->reg != c->reg) {
		side_drop(s);
		s->epoch = c->epoch;
		s->reg = c->reg;
		if (stage == 0)
			snprintf(in, sizeof(in), "%s", c->o.first_ring);
		else
			snprintf(in, sizeof(in), "%s.s%d.in", c->o.prefix, (int)stage);
		snprintf(name, sizeof(name), "%s.kv", in);
		s->q = shm_ring_lookup(c->reg, name);
		snprintf(name, sizeof(name), "%s.kvr", in);
		s->r = shm_ring_lookup(c->reg, name);
		s->in = shm_ring_lookup(c->reg, in);
		/* its landing reports, if it takes its own pages (a worker that
		 * outlived the chain's re-forming still does) */
		snprintf(name, sizeof(name), "%s.kvl", in);
		s->kvl = shm_ring_lookup(c->reg, name);
		if (s->q == NULL || s->r == NULL || s->in == NULL)
			side_drop(s);
	}
	return s->q != NULL ? s : NULL;
}

/* Put @p q (its blocks after it) in the KV buffer and on its way: the
 * stage's side ring, or else the first hop. @return 1 sent, 0 the ring is
 * full. Called with mu held. */
static int kv_send(struct proc_chain *c, int32_t stage, struct shm_mb_kv *q, const int32_t *blocks)
{
	struct shm_mb_hdr *h = pc_buf_at(c, c->o.max_groups + 2);
	struct pc_kv_side *s = kv_side(c, stage);
	struct shm_desc d;

	memset(h, 0, sizeof(*h));
	h->magic = SHM_MB_MAGIC;
	h->version = c->wire_version;
	h->kind = SHM_MB_KV;
	h->epoch = c->epoch;
	h->seq = ++c->seq;
	h->n_stages = c->o.n_stages;
	h->stage = s != NULL ? stage : 0; /* the hop it arrives at */
	h->total_len = (uint32_t)shm_mb_kv_size(q->n_blocks);
	q->target = stage;
	memcpy(h + 1, q, sizeof(*q));
	if (q->n_blocks > 0)
		memcpy((char *)(h + 1) + sizeof(*q), blocks, sizeof(int32_t) * (size_t)q->n_blocks);
	d = (struct shm_desc){ .off = shm_off(c->reg, h), .len = h->total_len, .type = SHM_MB_KV, .seq = h->seq };
	if (shm_ring_enqueue_burst(s != NULL ? s->q : c->first, &d, 1) != 1)
		return 0;
	if (s != NULL)
		shm_ring_wake_(s->in); /* a worker with nothing to do sleeps on its input ring */
	c->kv_side_r = s != NULL ? s->r : NULL;
	c->kv_seq = h->seq;
	c->kv_done = 0;
	return 1;
}

/* The side ring's answers: ours is the message itself, answered in place. */
static void kv_side_drain(struct proc_chain *c)
{
	struct shm_desc d[4];
	unsigned n;

	while ((n = shm_ring_dequeue_burst(c->kv_side_r, d, 4)) > 0)
		for (unsigned i = 0; i < n; i++)
			if (d[i].off + d[i].len <= shm_region_size(c->reg))
				pc_kv_reply(c, shm_ptr(c->reg, d[i].off), d[i].len);
}

static const char *kv_op_name(uint32_t op)
{
	return op == SHM_MB_KV_FORMAT ? "format" : op == SHM_MB_KV_RXROUTE ? "receive route"
	       : op == SHM_MB_KV_EXPORT || op == SHM_MB_KV_EXPORT_V ? "export" : "import";
}

/* Send @p q to stage @p stage and wait for the answer into @p q.
 * @return 0 or -errno (the stage's; -EPIPE: the chain went down;
 * -ETIMEDOUT). Called with kv_mu held. */
static int kv_call(struct proc_chain *c, int32_t stage, struct shm_mb_kv *q, const int32_t *blocks)
{
	uint64_t t0 = kvf_mono_ns(), limit = (uint64_t)c->o.group_timeout_ms * 1000000ull;
	uint32_t op = q->op;
	int sent = 0, rc = 1, polls = 0, side = 0; /* rc 1: waiting */
	char err[CTRL_CHAIN_ERRLEN];

	while (rc == 1) {
		pthread_mutex_lock(&c->mu);
		if (c->state != PC_UP) {
			rc = -EPIPE;
		} else if (!sent) {
			sent = kv_send(c, stage, q, blocks);
			side = c->kv_side_r != NULL;
		} else if (side && c->kv_side_r == NULL) {
			rc = -EPIPE; /* the region was re-attached under the call: its side rings are gone */
		} else {
			if (side) {
				kv_side_drain(c);
				if (!c->kv_done && ++polls % 50 == 0)
					shm_ring_wake_(c->side[stage].in); /* in case it went to sleep as we woke it */
			} else {
				pc_drain(c, err, sizeof(err));
			}
			pc_check_live(c, kvf_mono_ns()); /* a stage that died answers nothing */
			if (c->kv_done) {
				rc = c->kv_status;
				*q = c->kv_ans;
			}
		}
		if (rc == 1 && kvf_mono_ns() - t0 > limit)
			rc = -ETIMEDOUT;
		if (rc != 1)
			c->kv_seq = 0; /* a late answer is dropped */
		pthread_mutex_unlock(&c->mu);
		if (rc == 1)
			pc_sleep_us(sent ? 20 : 200);
	}
	if (rc < 0)
		pc_log(c, KVF_LOG_ERR, "chain: KV %s on stage %d failed: %s", kv_op_name(op), (int)stage,
		       rc == -EPIPE ? "the chain is down" : rc == -ETIMEDOUT ? "no answer within the group timeout"
			: c->kv_err);
	return rc;
}

/* Where stage @p stage may take pages: on this node, at offset *off of the region. */
static int kv_check(struct proc_chain *c, int32_t stage, const void *buf, size_t len, int32_t n, uint64_t *off)
{
	const char *base = shm_region_base(c->reg);

	if (stage < 0 || stage >= c->o.n_stages || n < 0 || n > PC_KV_MAX_BLOCKS
	    || shm_mb_kv_size(n) > c->buf_bytes)
		return -EINVAL;
	if (c->st[stage].node != c->st[0].node) {
		pc_log(c, KVF_LOG_ERR, "chain: KV pages of stage %d: it runs on node %d, ctrld on node %d: pages "
		       "move only to and from stages on ctrld's node", (int)stage, c->st[stage].node, c->st[0].node);
		return -EXDEV;
	}
	if (buf == NULL)
		return 0;
	if ((const char *)buf < base || len > shm_region_size(c->reg)
	    || (size_t)((const char *)buf - base) > shm_region_size(c->reg) - len) {
		pc_log(c, KVF_LOG_ERR, "chain: KV pages of stage %d: the buffer is outside region %s: the PD "
		       "dataplane region must be the workers' region", (int)stage, c->o.region);
		return -EFAULT;
	}
	*off = (uint64_t)((const char *)buf - base);
	return 0;
}

int pc_kv_format(struct ctrl_chain *cc, int32_t stage, struct kn_kv_format *f)
{
	struct proc_chain *c = (struct proc_chain *)cc;
	struct shm_mb_kv q = { .op = SHM_MB_KV_FORMAT };
	uint64_t off = 0;
	int rc = kv_check(c, stage, NULL, 0, 0, &off);

	if (rc < 0)
		return rc;
	pthread_mutex_lock(&c->kv_mu);
	if (c->fmt_epoch[stage] != c->epoch) {
		rc = kv_call(c, stage, &q, NULL);
		if (rc == 0 && (q.block_bytes == 0 || q.layer_end <= q.layer_start)) {
			/* no stage has such pages: an answer that is not the stage's
			 * (seen once after a restart of ctrld beside its workers: every
			 * export of that epoch then failed, "buffer of 0 bytes"); not
			 * kept, asked again at the next call */
			pc_log(c, KVF_LOG_WARNING, "chain: stage %d answered its KV page format with %llu-byte blocks "
			       "of layers %d..%d: ignored, asked again at the next page move", (int)stage,
			       (unsigned long long)q.block_bytes, (int)q.layer_start, (int)q.layer_end);
			rc = -EAGAIN;
		}
		if (rc == 0) {
			c->fmt[stage] = (struct kn_kv_format){ .dtype = q.dtype, .layer_start = q.layer_start,
							       .layer_end = q.layer_end, .n_kv_heads = q.n_kv_heads,
							       .head_dim = q.head_dim, .block_bytes = (size_t)q.block_bytes };
			c->fmt_epoch[stage] = c->epoch; /* a re-formed chain may have another backend */
		}
	}
	if (rc == 0)
		*f = c->fmt[stage];
	pthread_mutex_unlock(&c->kv_mu);
	return rc;
}

static void kv_set_format(struct shm_mb_kv *q, const struct kn_kv_format *f)
{
	q->dtype = f->dtype;
	q->layer_start = f->layer_start;
	q->layer_end = f->layer_end;
	q->n_kv_heads = f->n_kv_heads;
	q->head_dim = f->head_dim;
	q->block_bytes = f->block_bytes;
}

static int kv_copy(struct proc_chain *c, uint32_t op, int32_t stage, const int32_t *blocks, int32_t n,
		   const void *buf, size_t len, const struct kn_kv_format *f)
{
	struct shm_mb_kv q = { .op = op, .buf_len = len, .n_blocks = n };
	int rc = kv_check(c, stage, buf, len, n, &q.buf_off);

	if (rc < 0)
		return rc;
	if (f != NULL)
		kv_set_format(&q, f);
	pthread_mutex_lock(&c->kv_mu);
	rc = kv_call(c, stage, &q, blocks);
	pthread_mutex_unlock(&c->kv_mu);
	return rc;
}

int pc_kv_export(struct ctrl_chain *cc, int32_t stage, const int32_t *blocks, int32_t n, void *dst,
			size_t len)
{
	return kv_copy((struct proc_chain *)cc, SHM_MB_KV_EXPORT, stage, blocks, n, dst, len, NULL);
}

int pc_kv_import(struct ctrl_chain *cc, int32_t stage, const int32_t *blocks, int32_t n, const void *src,
			size_t len, const struct kn_kv_format *f)
{
	return kv_copy((struct proc_chain *)cc, SHM_MB_KV_IMPORT, stage, blocks, n, src, len, f);
}

int pc_kv_copies(struct ctrl_chain *cc, int32_t stage, int import, const struct ctrl_kv_copy *v, int32_t n,
		 const struct kn_kv_format *f)
{
	struct proc_chain *c = (struct proc_chain *)cc;
	int32_t *words = malloc(sizeof(int32_t) * PC_KV_MAX_BLOCKS);
	uint64_t off;
	int rc = 0;

	if (words == NULL)
		return -ENOMEM;
	/* as many copies a message as its words hold: records first, then blocks */
	for (int32_t i = 0; i < n && rc == 0;) {
		struct shm_mb_kv q = { .op = import ? SHM_MB_KV_IMPORT_V : SHM_MB_KV_EXPORT_V };
		int32_t k = 0, nw = 0, nb = 0;

		while (i + k < n && v[i + k].n >= 0
		       && (k + 1) * SHM_MB_KV_COPY_WORDS + nb + v[i + k].n <= PC_KV_MAX_BLOCKS
		       && shm_mb_kv_size((k + 1) * SHM_MB_KV_COPY_WORDS + nb + v[i + k].n) <= c->buf_bytes)
			nb += v[i + k++].n;
		if (k == 0) {
			rc = -EINVAL; /* one copy too large for a message, or negative */
			break;
		}
		for (int32_t j = 0; j < k && rc == 0; j++) {
			const struct ctrl_kv_copy *x = &v[i + j];
			struct shm_mb_kv_copy r = { .buf_len = x->len, .n_blocks = x->n };

			rc = kv_check(c, stage, x->buf, x->len, 0, &off);
			r.buf_off = off;
			memcpy(words + (size_t)j * SHM_MB_KV_COPY_WORDS, &r, sizeof(r));
		}
		nw = k * SHM_MB_KV_COPY_WORDS;
		for (int32_t j = 0; j < k && rc == 0; j++) {
			memcpy(words + nw, v[i + j].blocks, sizeof(int32_t) * (size_t)v[i + j].n);
			nw += v[i + j].n;
		}
		if (rc < 0)
			break;
		q.n_blocks = nw;
		q.n_copies = (uint32_t)k;
		if (f != NULL)
			kv_set_format(&q, f);
		pthread_mutex_lock(&c->kv_mu);
		rc = kv_call(c, stage, &q, words);
		pthread_mutex_unlock(&c->kv_mu);
		i += k;
	}
	free(words);
	return rc;
}

int pc_kv_rxroute(struct ctrl_chain *cc, int32_t stage, uint32_t stream)
{
	struct proc_chain *c = (struct proc_chain *)cc;
	struct shm_mb_kv q = { .op = SHM_MB_KV_RXROUTE, .buf_off = stream };
	char name[SHM_NAME_MAX + 8];
	struct pc_kv_side *s;
	uint64_t off = 0;
	int rc = kv_check(c, stage, NULL, 0, 0, &off);

	if (rc < 0)
		return rc;
	pthread_mutex_lock(&c->kv_mu);
	rc = kv_call(c, stage, &q, NULL);
	pthread_mutex_unlock(&c->kv_mu);
	if (rc < 0)
		return rc;
	/* its reports come on <in>.kvl, which the stage made as it answered */
	pthread_mutex_lock(&c->mu);
	s = kv_side(c, stage);
	if (s != NULL && s->kvl == NULL) {
		if (stage == 0)
			snprintf(name, sizeof(name), "%s.kvl", c->o.first_ring);
		else
			snprintf(name, sizeof(name), "%s.s%d.in.kvl", c->o.prefix, (int)stage);
		s->kvl = shm_ring_lookup(c->reg, name);
	}
	rc = s != NULL && s->kvl != NULL ? 0 : -ENOENT;
	pthread_mutex_unlock(&c->mu);
	return rc;
}

int pc_kv_landed(struct ctrl_chain *cc, int32_t stage, struct ctrl_kv_landing *out, int max)
{
	struct proc_chain *c = (struct proc_chain *)cc;
	struct shm_desc d[32];
	struct pc_kv_side *s;
	unsigned n = 0;

	if (stage < 0 || stage >= c->o.n_stages || max <= 0)
		return 0;
	pthread_mutex_lock(&c->mu);
	/* kv_side() looks the rings up again after the chain re-formed: a
	 * worker that outlived it reports on as before */
	if (c->state == PC_UP && (s = kv_side(c, stage)) != NULL && s->kvl != NULL)
		n = shm_ring_dequeue_burst(s->kvl, d, max < 32 ? (unsigned)max : 32u);
	pthread_mutex_unlock(&c->mu);
	for (unsigned i = 0; i < n; i++)
		out[i] = (struct ctrl_kv_landing){ .room = d[i].off, .session = (uint32_t)d[i].aux,
						   .n_blocks = (uint32_t)d[i].seq, .bytes = d[i].len,
						   .last = !!(d[i].flags & SHM_MB_KVL_LAST),
						   .refused = !!(d[i].flags & SHM_MB_KVL_REFUSED),
						   .in_place = !!(d[i].flags & SHM_MB_KVL_IN_PLACE) };
	return (int)n;
}

uint64_t pc_kv_generation(struct ctrl_chain *cc)
{
	struct proc_chain *c = (struct proc_chain *)cc;
	uint64_t e;

	pthread_mutex_lock(&c->mu);
	e = c->epoch;
	pthread_mutex_unlock(&c->mu);
	return e;
}
