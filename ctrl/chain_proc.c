/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stage chain to kvferry-worker processes (see ctrl_proc_chain.h).
 *
 * Invariants:
 *  - Epochs: every message carries the chain's epoch; a stage death bumps
 *    it, so whatever the old epoch left in rings (data for groups already
 *    failed, results that come back late) is dropped by workers and here.
 *  - One message per group in flight, in buffer g of ctrld's output area:
 *    group g's buffer is rewritten only after its result came back (or, after
 *    a death, after the re-formed chain answered a JOIN, which every stage
 *    reads after everything queued ahead of it).
 *  - The KV block count is fixed at the first setup: a re-formed chain must
 *    hold exactly that many blocks on every stage, since the scheduler has
 *    handed out ids up to it.
 *  - Slots whose KV may be missing on some stage (touched before a death)
 *    are tainted. A tainted slot's columns are left out of the message and
 *    reported as failed columns (col_status -EPIPE), so the healthy columns
 *    sharing the micro-batch are computed and their requests go on; all ops
 *    still travel (block tables stay identical on every stage). A group
 *    whose every column is tainted travels as OPS_ONLY with an error.
 *    ZERO_SLOT, delivered, cures.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chain_proc_int.h"
#include "kvf_log.h"
#include "ctrl_proc_chain.h"
#include "dp_ipc.h"
#include "shm_mb.h"
#include "shm_pool.h"
#include "shm_region.h"
#include "shm_ring.h"

static_assert(sizeof(struct kn_column) == SHM_MB_COL_BYTES, "column record size");
static_assert(sizeof(struct kn_op) == SHM_MB_OP_BYTES, "op record size");

void pc_fmt(char *b, size_t n, const char *f, ...)
{
	va_list ap;

	va_start(ap, f);
	vsnprintf(b, n, f, ap); /* cut to the fixed error field on purpose */
	va_end(ap);
}

void ctrl_proc_chain_opts_init(struct ctrl_proc_chain_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->first_ring = "serve.s0.in";
	o->return_ring = "serve.ret";
	o->prefix = "serve";
	o->n_stages = 2;
	kn_stage_opts_init(&o->stage);
	o->max_groups = 32;
	o->join_timeout_ms = 60000;
	o->group_timeout_ms = 30000;
	o->stale_ms = 2000;
}

int ctrl_proc_chain_layers(int32_t n_layers, int32_t n, int32_t *ends, char *err, size_t errlen)
{
	return ctrl_chain_layers(n_layers, n, ends, err, errlen);
}

static struct shm_ring *ring_open(struct shm_region *r, const char *name)
{
	for (int tries = 0; tries < 2000; tries++) {
		struct shm_ring *q = shm_ring_lookup(r, name);

		if (q != NULL)
			return q;
		if (errno == ENOENT) {
			q = shm_ring_create(r, name, PC_RING_COUNT, sizeof(struct shm_desc), 0);
			if (q != NULL || errno != EEXIST)
				return q;
		} else if (errno != EPROTO) {
			return NULL;
		}
		pc_sleep_us(1000);
	}
	return NULL;
}

void pc_log(struct proc_chain *c, int pri, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	if (c->log == stderr) {
		kvf_vlog(pri, NULL, fmt, ap); /* ctrld's stderr: a priority under the journal */
	} else {
		vfprintf(c->log, fmt, ap);
		fputc('\n', c->log);
	}
	va_end(ap);
}

void pc_push_done(struct proc_chain *c, uint32_t gi)
{
	c->done[(c->done_head + c->done_n) % c->o.max_groups] = gi;
	c->done_n++;
	c->g[gi].done = 1;
	c->t_last = kvf_mono_ns();
}

/* ---- receiving ---- */

static int recv_desc(struct proc_chain *c, struct shm_desc *d)
{
	struct shm_pool *p;
	int64_t idx;

	for (;;) {
		if (shm_ring_dequeue_burst(c->ret, d, 1) != 1)
			return 0;
		if (c->rx_small == NULL)
			return 1;
		/* ours now, from whom the dataplane passed it to (us, or a
		 * ctrld before us that died): reclaimed by the dataplane if
		 * ctrld dies holding it; one that fails went back to the pool
		 * after that one died, and is not ours to read (dp_ipc.h) */
		p = dp_ipc_rx_pool_is_small(d->len, shm_pool_bufsize(c->rx_small)) ? c->rx_small : c->rx_large;
		idx = shm_pool_idx_of(p, d->off);
		if (idx < 0 || shm_pool_pass(p, (uint32_t)idx, DP_AUX_HOLDER(d->aux), (int32_t)getpid()) == 0)
			return 1;
	}
}

static void release_desc(struct proc_chain *c, const struct shm_desc *d)
{
	struct shm_pool *p;
	int64_t idx;

	if (c->rx_small == NULL)
		return;
	p = dp_ipc_rx_pool_is_small(d->len, shm_pool_bufsize(c->rx_small)) ? c->rx_small : c->rx_large;
	idx = shm_pool_idx_of(p, d->off);
	if (idx >= 0)
		shm_pool_put(p, (uint32_t)idx);
}

static void on_result(struct proc_chain *c, struct shm_mb_hdr *h, size_t len)
{
	struct pc_grp *g;

	if (h->epoch != c->epoch || h->group >= (uint32_t)c->o.max_groups)
		return;
	g = &c->g[h->group];
	if (!g->busy || g->done || g->seq != h->seq)
		return; /* a result for a group already failed */
	if (shm_mb_check(h, len, c->max_cols, c->max_ops) < 0 || h->n_cols != g->n_sent) {
		g->out.status = -EPROTO;
		pc_fmt(g->out.err, sizeof(g->out.err), "a malformed result came back for group %u (%d columns, %zu bytes)",
		       h->group, h->n_cols, len);
	} else {
		const int32_t *t = shm_mb_payload(h);
		const float *lp = (const float *)(t + h->n_cols);

		g->out.status = h->status;
		if (h->status < 0 || g->out.n_failed == 0) {
			memcpy(g->out.err, h->err,
			       sizeof(g->out.err) < sizeof(h->err) ? sizeof(g->out.err) : sizeof(h->err));
			g->out.err[sizeof(g->out.err) - 1] = '\0';
		}
		int32_t k = h->version >= 2 && h->status == 0 ? h->n_logprobs : 0;

		/* Back to the submitted order; left-out columns keep -1. */
		for (int32_t j = 0; j < h->n_cols; j++) {
			g->out.tokens[g->sent[j]] = t[j];
			g->out.lps[g->sent[j]] = lp[j];
		}
		g->out.n_top = k;
		if (k > 0) {
			const int32_t *ti = shm_mb_top_ids(h);
			const float *tl = shm_mb_top_logprobs(h);

			for (int32_t j = 0; j < h->n_cols; j++) {
				memcpy(g->out.top_ids + (size_t)g->sent[j] * (size_t)k, ti + (size_t)j * (size_t)k,
				       sizeof(int32_t) * (size_t)k);
				memcpy(g->out.top_lps + (size_t)g->sent[j] * (size_t)k, tl + (size_t)j * (size_t)k,
				       sizeof(float) * (size_t)k);
			}
		}
		g->out.step_ns = 0;
		for (int32_t k = 0; k < c->o.n_stages; k++) {
			c->sst[k].steps++;
			c->sst[k].cols += (uint64_t)h->n_cols;
			c->sst[k].busy_ns += (uint64_t)h->busy_us[k] * 1000u;
			if ((uint64_t)h->busy_us[k] * 1000u > g->out.step_ns)
				g->out.step_ns = (uint64_t)h->busy_us[k] * 1000u;
		}
	}
	pc_push_done(c, h->group);
}

/* Drain the return hop. @return 1 if a setup message came back ok, <0 refused, 0 otherwise. */
int pc_drain(struct proc_chain *c, char *err, size_t errlen)
{
	struct shm_desc d;
	int setup = 0;

	while (recv_desc(c, &d)) {
		struct shm_mb_hdr *h = shm_ptr(c->reg, d.off);

		if (d.off + d.len > shm_region_size(c->reg) || d.len < sizeof(*h) || h->magic != SHM_MB_MAGIC
		    || !shm_mb_version_ok(h->version) || h->total_len > d.len) {
			pc_log(c, KVF_LOG_ERR, "chain: dropping a message of %u bytes (magic %08x, version %u; "
			       "ctrld speaks versions %u..%u)", d.len, d.len >= 8 ? h->magic : 0,
				d.len >= 8 ? h->version : 0, SHM_MB_VERSION_MIN, SHM_MB_VERSION);
		} else if (h->kind == SHM_MB_RESULT) {
			on_result(c, h, d.len);
		} else if (h->kind == SHM_MB_KV) {
			pc_kv_reply(c, h, d.len);
		} else if (h->kind == SHM_MB_JOIN || h->kind == SHM_MB_POOL) {
			int rc = pc_setup_reply(c, h, err, errlen);

			if (rc != 0)
				setup = rc;
		}
		release_desc(c, &d);
		if (setup != 0)
			break;
	}
	return setup;
}

/* ---- the region's rings, pools and buffers ---- */

int pc_open_shm(struct proc_chain *c, char *err, size_t errlen)
{
	const struct ctrl_proc_chain_opts *o = &c->o;
	char name[SHM_NAME_MAX];
	int rc;

	snprintf(name, sizeof(name), "%s.ctrl.out", o->prefix);

	c->first = ring_open(c->reg, o->first_ring);
	if (o->return_ring != NULL) {
		c->ret = ring_open(c->reg, o->return_ring);
	} else {
		uint64_t off;

		c->ret = shm_ring_lookup(c->reg, DP_RING_RX);
		c->rx_small = shm_pool_lookup(c->reg, DP_POOL_RX_SMALL);
		c->rx_large = shm_pool_lookup(c->reg, DP_POOL_RX_LARGE);
		if (c->rx_small == NULL || c->rx_large == NULL) {
			snprintf(err, errlen, "ctrl_proc_chain_create: no dataplane pools %s/%s in region %s: start "
				 "kvferry-dataplane on it first", DP_POOL_RX_SMALL, DP_POOL_RX_LARGE, o->region);
			return -ENOENT;
		}
		/* the ring's consumer: the dataplane passes its buffers to ctrld */
		if (shm_region_find_area(c->reg, DP_AREA_RXOWN, &off, NULL) == 0)
			dp_ipc_rx_own(shm_ptr(c->reg, off), DP_RX_RING_MBATCH, (int32_t)getpid(), 0);
	}
	if (c->first == NULL || c->ret == NULL) {
		rc = errno != 0 ? -errno : -ENOENT;
		snprintf(err, errlen, "ctrl_proc_chain_create: rings %s / %s in region %s: %s", o->first_ring,
			 o->return_ring != NULL ? o->return_ring : DP_RING_RX, o->region, strerror(-rc));
		return rc;
	}
	c->ev = shm_ring_lookup(c->reg, DP_RING_EV); /* only where a dataplane runs */
	rc = shm_region_add_area(c->reg, name, c->buf_bytes * (size_t)c->n_bufs, 64, SHM_AREA_RAW, &c->out_off);
	if (rc == -EEXIST) {
		size_t have = 0;

		shm_region_find_area(c->reg, name, &c->out_off, &have);
		rc = have >= c->buf_bytes * (size_t)c->n_bufs ? 0 : -ENOSPC;
	}
	if (rc < 0)
		snprintf(err, errlen, "shm_region_add_area(%s, %zu bytes) in region %s failed: %s: make the "
			 "region larger", name, c->buf_bytes * (size_t)c->n_bufs, o->region, strerror(-rc));
	return rc;
}

void pc_close_shm(struct proc_chain *c)
{
	shm_ring_close(c->first);
	shm_ring_close(c->ret);
	shm_ring_close(c->ev);
	shm_pool_close(c->rx_small);
	shm_pool_close(c->rx_large);
	pc_kv_side_close(c);
	c->first = c->ret = c->ev = NULL;
	c->rx_small = c->rx_large = NULL;
}

/* ---- the vtable ---- */

static int pc_info(struct ctrl_chain *cc, struct ctrl_chain_info *info)
{
	*info = ((struct proc_chain *)cc)->info;
	return 0;
}

static void fail_local(struct proc_chain *c, uint32_t gi, const char *why)
{
	struct pc_grp *g = &c->g[gi];

	g->out.status = -EPIPE;
	pc_fmt(g->out.err, sizeof(g->out.err), "%s", why);
	for (int32_t i = 0; i < g->out.n_cols; i++)
		g->out.tokens[i] = -1;
	pc_push_done(c, gi);
}

static int submit_locked(struct ctrl_chain *cc, uint32_t group, const struct kn_column *cols, int32_t n_cols,
			 const struct kn_op *ops, int32_t n_ops)
{
	struct proc_chain *c = (struct proc_chain *)cc;
	struct pc_grp *g;
	struct shm_mb_hdr *h;
	struct shm_desc d;
	int32_t bad_slot = -1, n_sent = 0;

	if (group >= (uint32_t)c->o.max_groups || c->g[group].busy || n_cols < 1 || n_cols > c->max_cols
	    || n_ops < 0 || n_ops > c->max_ops)
		return -EINVAL;
	for (int32_t i = 0; i < n_cols; i++)
		if (cols[i].slot < 0 || cols[i].slot >= c->info.n_slots)
			return -EINVAL;
	for (int32_t i = 0; i < n_ops; i++)
		if (ops[i].slot < 0 || ops[i].slot >= c->info.n_slots)
			return -EINVAL;
	if (c->state == PC_UP && shm_ring_free_count(c->first) == 0)
		return -EBUSY;
	g = &c->g[group];
	g->busy = 1;
	g->done = 0;
	chain_out_start(&g->out, n_cols);
	g->n_sent = n_cols;
	g->seq = ++c->seq;
	g->t_submit = kvf_mono_ns();
	if (c->t_first == 0)
		c->t_first = g->t_submit;
	for (int32_t i = 0; i < n_ops; i++)
		c->touched[ops[i].slot] = 1;
	for (int32_t i = 0; i < n_cols; i++)
		c->touched[cols[i].slot] = 1;
	if (c->state != PC_UP) {
		char why[CTRL_CHAIN_ERRLEN];

		pc_fmt(why, sizeof(why), "the stage chain is re-forming after: %s", c->down_why);
		fail_local(c, group, why);
		return 0;
	}
	for (int32_t i = 0; i < n_ops; i++)
		if (ops[i].type == KN_OP_ZERO_SLOT)
			c->tainted[ops[i].slot] = 0;
	h = pc_buf_at(c, (int32_t)group);
	for (int32_t i = 0; i < n_cols; i++) {
		g->out.tokens[i] = -1;
		g->out.lps[i] = 0.0f;
		g->out.cst[i] = 0;
		if (!c->tainted[cols[i].slot]) {
			g->sent[n_sent] = i;
			memcpy((struct kn_column *)shm_mb_cols(h) + n_sent++, &cols[i], sizeof(*cols));
			continue;
		}
		g->out.cst[i] = -EPIPE;
		if (g->out.n_failed++ == 0) {
			bad_slot = cols[i].slot;
			pc_fmt(g->out.err, sizeof(g->out.err), "slot %d lost its KV cache when the chain re-formed after: %s",
			       bad_slot, c->down_why);
		}
	}
	memset(h, 0, sizeof(*h));
	h->magic = SHM_MB_MAGIC;
	h->version = c->wire_version;
	h->kind = SHM_MB_TOKENS;
	h->epoch = c->epoch;
	h->seq = g->seq;
	h->group = group;
	h->stage = 0;
	h->n_stages = c->o.n_stages;
	if (n_sent == 0) {
		/* Every column is tainted: the ops alone travel, the group fails. */
		memcpy(shm_mb_cols(h), cols, sizeof(*cols) * (size_t)n_cols);
		for (int32_t i = 0; i < n_cols; i++)
			g->sent[i] = i;
		n_sent = n_cols;
		g->out.n_failed = 0;
		h->flags = SHM_MB_F_OPS_ONLY;
		h->status = -EPIPE;
		pc_fmt(h->err, sizeof(h->err), "slot %d lost its KV cache when the chain re-formed after: %s",
		       bad_slot, c->down_why);
	}
	g->n_sent = n_sent;
	h->n_cols = n_sent;
	h->n_ops = n_ops;
	if (n_ops > 0)
		memcpy(shm_mb_ops(h), ops, sizeof(*ops) * (size_t)n_ops);
	h->total_len = (uint32_t)shm_mb_size(SHM_MB_TOKENS, n_sent, n_ops, 0);
	d = (struct shm_desc){ .off = shm_off(c->reg, h), .len = h->total_len, .type = SHM_MB_TOKENS,
			       .seq = h->seq, .aux = group };
	if (shm_ring_enqueue_burst(c->first, &d, 1) != 1) {
		g->busy = 0; /* checked free above: only a foreign producer could fill it */
		return -EBUSY;
	}
	return 0;
}

static int pc_submit(struct ctrl_chain *cc, uint32_t group, const struct kn_column *cols, int32_t n_cols,
		     const struct kn_op *ops, int32_t n_ops)
{
	struct proc_chain *c = (struct proc_chain *)cc;
	int rc;

	pthread_mutex_lock(&c->mu);
	rc = submit_locked(cc, group, cols, n_cols, ops, n_ops);
	pthread_mutex_unlock(&c->mu);
	return rc;
}

static int poll_locked(struct ctrl_chain *cc, struct ctrl_chain_result *out, int max)
{
	struct proc_chain *c = (struct proc_chain *)cc;
	uint64_t now = kvf_mono_ns();
	int n = 0;

	if (c->state == PC_UP) {
		char err[CTRL_CHAIN_ERRLEN];

		pc_drain(c, err, sizeof(err));
	} else {
		pc_rejoin_step(c, now);
	}
	pc_check_live(c, now);
	while (n < max && c->done_n > 0) {
		uint32_t gi = c->done[c->done_head];
		struct pc_grp *g = &c->g[gi];
		struct ctrl_chain_result *r = &out[n++];

		c->done_head = (c->done_head + 1) % c->o.max_groups;
		c->done_n--;
		g->busy = 0;
		g->done = 0;
		chain_out_fill(&g->out, gi, r);
	}
	return n;
}

static int pc_poll(struct ctrl_chain *cc, struct ctrl_chain_result *out, int max)
{
	struct proc_chain *c = (struct proc_chain *)cc;
	int n;

	pthread_mutex_lock(&c->mu);
	n = poll_locked(cc, out, max);
	pthread_mutex_unlock(&c->mu);
	return n;
}

static int pc_stats(struct ctrl_chain *cc, struct ctrl_chain_stats *st)
{
	struct proc_chain *c = (struct proc_chain *)cc;

	memset(st, 0, sizeof(*st));
	st->n_stages = c->o.n_stages;
	st->elapsed_ns = c->t_first != 0 && c->t_last > c->t_first ? c->t_last - c->t_first : 0;
	for (int32_t k = 0; k < c->o.n_stages; k++)
		st->stage[k] = c->sst[k];
	return 0;
}

static void pc_destroy(struct ctrl_chain *cc)
{
	struct proc_chain *c = (struct proc_chain *)cc;

	if (c->g != NULL)
		for (int32_t i = 0; i < c->o.max_groups; i++) {
			chain_out_free(&c->g[i].out);
			free(c->g[i].sent);
		}
	free(c->g);
	free(c->done);
	free(c->touched);
	free(c->tainted);
	pthread_mutex_destroy(&c->mu);
	pthread_mutex_destroy(&c->kv_mu);
	pc_close_shm(c);
	if (c->reg != NULL) {
		if (c->created)
			shm_region_unlink(c->o.region);
		shm_region_detach(c->reg);
	}
	free(c);
}

const struct ctrl_chain_vtbl ctrl_proc_chain_vtbl = {
	.name = "worker-processes",
	.info = pc_info,
	.submit = pc_submit,
	.poll = pc_poll,
	.stats = pc_stats,
	.destroy = pc_destroy,
	.kv_format = pc_kv_format,
	.kv_export = pc_kv_export,
	.kv_import = pc_kv_import,
	.kv_copies = pc_kv_copies,
	.kv_rxroute = pc_kv_rxroute,
	.kv_landed = pc_kv_landed,
	.kv_generation = pc_kv_generation,
	.ready = pc_ready,
};

struct ctrl_chain *ctrl_proc_chain_create(const struct kn_model *m, const struct ctrl_proc_chain_opts *o,
					  char *err, size_t errlen)
{
	const struct kn_model_config *cfg;
	struct proc_chain *c;
	int e = ENOMEM, rc;
	size_t bytes;

	if (m == NULL || o == NULL || o->region == NULL || o->first_ring == NULL || o->prefix == NULL || o->max_groups < 1
	    || o->stage.n_plans < 1 || o->stage.n_plans > SHM_MB_MAX_PLANS || o->stage.n_slots < 1) {
		snprintf(err, errlen, "ctrl_proc_chain_create: a model, a region, a first ring, a prefix, max_groups >= 1, "
			 "n_slots >= 1 and 1..%d plans are required", SHM_MB_MAX_PLANS);
		errno = EINVAL;
		return NULL;
	}
	cfg = kn_model_config(m);
	c = calloc(1, sizeof(*c));
	if (c == NULL) {
		snprintf(err, errlen, "ctrl_proc_chain_create: out of memory");
		errno = ENOMEM;
		return NULL;
	}
	c->base.vt = &ctrl_proc_chain_vtbl;
	c->o = *o;
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_init(&c->kv_mu, NULL);
	c->log = o->log != NULL ? o->log : stderr;
	c->m = m;
	c->fp = kn_model_fingerprint(m);
	c->n_layers = cfg->n_layers;
	/* Unique per chain: a stale message of an earlier ctrld is never ours. */
	c->epoch = kvf_mono_ns() | 1u;
	memcpy(c->ends, o->layer_ends, sizeof(c->ends));
	rc = ctrl_proc_chain_layers(cfg->n_layers, o->n_stages, c->ends, err, errlen);
	if (rc < 0) {
		e = -rc;
		goto fail;
	}
	fprintf(c->log, "chain: layer ranges%s:", o->layer_ends[0] ? "" : " (even split)");
	for (int32_t k = 0; k < o->n_stages; k++)
		fprintf(c->log, " stage %d = %d..%d", k, k == 0 ? 0 : c->ends[k - 1], c->ends[k]);
	fprintf(c->log, "\n");
	c->max_cols = chain_widest_plan(&o->stage);
	c->max_ops = 4 * c->max_cols + 16; /* the scheduler's bound per micro-batch */
	if (o->region_bytes > 0) {
		struct shm_region_opts ro;

		shm_region_opts_init(&ro);
		ro.name = o->region;
		ro.size = o->region_bytes;
		c->reg = shm_region_create(&ro, err, errlen);
		c->created = c->reg != NULL;
	} else {
		c->reg = shm_region_attach(o->region, err, errlen);
	}
	if (c->reg == NULL) {
		e = errno;
		goto fail;
	}
	bytes = shm_mb_size(SHM_MB_TOKENS, c->max_cols, c->max_ops, 0);
	if (bytes < shm_mb_size(SHM_MB_JOIN, 0, 0, 0))
		bytes = shm_mb_size(SHM_MB_JOIN, 0, 0, 0);
	c->buf_bytes = shm_mb_align(bytes);
	c->n_bufs = o->max_groups + 3;
	rc = pc_open_shm(c, err, errlen);
	if (rc < 0) {
		e = -rc;
		goto fail;
	}
	pc_region_seen(c);
	chain_info_init(&c->info, cfg, &o->stage, o->n_stages, o->max_groups);
	c->g = calloc((size_t)o->max_groups, sizeof(*c->g));
	c->done = calloc((size_t)o->max_groups, sizeof(*c->done));
	c->touched = calloc((size_t)o->stage.n_slots, 1);
	c->tainted = calloc((size_t)o->stage.n_slots, 1);
	if (c->g == NULL || c->done == NULL || c->touched == NULL || c->tainted == NULL)
		goto fail_nomem;
	for (int32_t i = 0; i < o->max_groups; i++) {
		c->g[i].sent = calloc((size_t)c->max_cols, sizeof(int32_t));
		if (chain_out_alloc(&c->g[i].out, c->max_cols) < 0 || c->g[i].sent == NULL)
			goto fail_nomem;
	}
	/* Drop whatever a previous ctrld left in the return ring: we own it. */
	{
		struct shm_desc d;

		while (recv_desc(c, &d))
			release_desc(c, &d);
	}
	rc = pc_setup_sync(c, SHM_MB_JOIN, err, errlen);
	if (rc == 0) {
		pc_print_table(c, "joined");
		fprintf(c->log, "chain: KV pool %d blocks of %d positions on every stage (the least any stage "
			"holds)\n", c->n_blocks, KN_PAGE_BLK);
		rc = pc_setup_sync(c, SHM_MB_POOL, err, errlen);
	}
	if (rc < 0) {
		if (rc != -ETIMEDOUT)
			pc_print_table(c, "refused");
		e = -rc;
		goto fail;
	}
	c->info.n_blocks = c->n_blocks;
	for (int32_t k = 0; k < o->n_stages; k++)
		c->stage_up[k] = 1;
	c->state = PC_UP;
	pc_note_live(c);
	c->setup_ok = 1;
	fflush(c->log);
	return &c->base;

fail_nomem:
	snprintf(err, errlen, "ctrl_proc_chain_create: out of memory for %d groups", o->max_groups);
	e = ENOMEM;
fail:
	pc_destroy(&c->base);
	errno = e;
	return NULL;
}
