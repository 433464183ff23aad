/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-worker's KV messages (SHM_MB_KV, shm_mb.h): ctrld asks one stage
 * for its page format, or to copy pages of its pool out to / in from a
 * buffer of the region, or several in one message (a batch of them) (a KV page message of the dataplane, ctrl/pd_link.c
 * frames it). The stage copies straight between its pool and that buffer:
 * no copy of its own (the CUDA engine's DMA reads and writes the pinned
 * region). Every step before the message finishes first, so an export sees
 * what they wrote and an import lands before anything after it runs.
 *
 * Two ways in. In band, on the input ring in order with the micro-batches,
 * through every stage and back on the return hop. A tensor-parallel stage
 * takes them only so: the leader hands each on to its followers, as every
 * message, each rank copies its own KV heads' share of the pages
 * (kn_stage.h: the pages' format is the stage's whatever its tp_size), and
 * the leader answers once they all have. On the side (proto 4,
 * a ring input only): ctrld puts the message on <in>.kv and the stage
 * answers in the message itself, handed back on <in>.kvr; the stage takes
 * it at once, ahead of the micro-batches queued on its input and beside
 * the steps in flight.
 * A prefill node's pages of a finished chunk then leave while the prompt's
 * later chunks wait their turn; in band they waited behind every chunk
 * already sent. ctrld sends on the side only what may run out of order:
 * the pages of chunks that came back from every stage, and imports into
 * blocks no step uses until they landed.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "dp_ipc.h"
#include "kn_stage.h"
#include "shm_ring.h"
#include "shm_mb.h"
#include "shm_region.h"
#include "worker_hop.h"
#include "worker_int.h"
#include "wk_tp_area.h"

/* Most words one KV message carries after its record (ctrld frames at most
 * WK_KVPAGE_MAX_BLOCKS blocks a page message, and batches a few). */
#define WK_KV_MAX_BLOCKS WK_TP_KV_WORDS

/* @return a buffer of the region [off, off+len) (its error in @p err), or NULL. */
static void *kv_buf(struct worker *w, uint64_t off, uint64_t len, char *err, size_t errlen)
{
	if (len > shm_region_size(w->reg) || off > shm_region_size(w->reg) - len) {
		snprintf(err, errlen, "stage %d (%s): KV buffer [%llu, +%llu) lies outside region %s (%zu bytes): "
			 "pages move only between ctrld and stages on its node", w->idx, w->o.role,
			 (unsigned long long)off, (unsigned long long)len, w->o.region, shm_region_size(w->reg));
		return NULL;
	}
	return shm_ptr(w->reg, off);
}

/* One buffer's pages out of or into the pool. @return 0 or -errno with @p err filled. */
static int kv_one(struct worker *w, int import, const int32_t *blocks, int32_t n, uint64_t off, uint64_t len,
		  const struct kn_kv_format *f, char *err, size_t errlen)
{
	void *buf = kv_buf(w, off, len, err, errlen);
	int rc;

	if (buf == NULL)
		return -EFAULT;
	rc = import ? kn_stage_kv_import(w->st, blocks, n, buf, (size_t)len, f)
		    : kn_stage_kv_export(w->st, blocks, n, buf, (size_t)len);
	if (rc < 0)
		wk_fmt(err, errlen, "stage %d (%s, layers %d..%d): KV %s of %d blocks: %s", w->idx, w->o.role,
		       w->info.layer_start, w->info.layer_end, import ? "import" : "export", n, kn_stage_error(w->st));
	return rc;
}

/* A vector op: every copy record checked against the words, and every copy
 * as the stage checks it, first; then each buffer in turn (a device error
 * ends it, naming the copy). */
static int kv_many(struct worker *w, const struct shm_mb_kv *k, const struct kn_kv_format *f, char *err,
		   size_t errlen)
{
	const int32_t *words = (const int32_t *)(k + 1), *blocks;
	int64_t used;
	int rc;

	if (k->n_copies < 1 || (int64_t)k->n_copies * SHM_MB_KV_COPY_WORDS > k->n_blocks) {
		snprintf(err, errlen, "stage %d (%s): a KV message of %u copies in %d words", w->idx, w->o.role,
			 k->n_copies, k->n_blocks);
		return -EINVAL;
	}
	used = (int64_t)k->n_copies * SHM_MB_KV_COPY_WORDS;
	for (uint32_t i = 0; i < k->n_copies; i++) {
		struct shm_mb_kv_copy c;

		memcpy(&c, words + (size_t)i * SHM_MB_KV_COPY_WORDS, sizeof(c));
		if (c.n_blocks < 0 || c.n_blocks > k->n_blocks - used) {
			snprintf(err, errlen, "stage %d (%s): KV copy %u names %d blocks; the message has %lld left",
				 w->idx, w->o.role, i, c.n_blocks, (long long)(k->n_blocks - used));
			return -EINVAL;
		}
		used += c.n_blocks;
	}
	if (used != k->n_blocks) {
		snprintf(err, errlen, "stage %d (%s): a KV message of %d words uses %lld", w->idx, w->o.role,
			 k->n_blocks, (long long)used);
		return -EINVAL;
	}
	/* every copy as the stage would check it (buffer, blocks, length,
	 * format) before the first moves: a bad one leaves the pool as it was */
	blocks = words + (size_t)k->n_copies * SHM_MB_KV_COPY_WORDS;
	for (uint32_t i = 0; i < k->n_copies; i++) {
		struct shm_mb_kv_copy c;

		memcpy(&c, words + (size_t)i * SHM_MB_KV_COPY_WORDS, sizeof(c));
		if (kv_buf(w, c.buf_off, c.buf_len, err, errlen) == NULL)
			return -EFAULT;
		if (kn_stage_kv_check(w->st, blocks, c.n_blocks, (size_t)c.buf_len,
				      k->op == SHM_MB_KV_IMPORT_V ? f : NULL) < 0) {
			wk_fmt(err, errlen, "stage %d (%s, layers %d..%d): KV copy %u of %u, %d blocks: %s", w->idx,
			       w->o.role, w->info.layer_start, w->info.layer_end, i, k->n_copies, c.n_blocks,
			       kn_stage_error(w->st));
			return -EINVAL;
		}
		blocks += c.n_blocks;
	}
	blocks = words + (size_t)k->n_copies * SHM_MB_KV_COPY_WORDS;
	for (uint32_t i = 0; i < k->n_copies; i++) {
		struct shm_mb_kv_copy c;

		memcpy(&c, words + (size_t)i * SHM_MB_KV_COPY_WORDS, sizeof(c));
		rc = kv_one(w, k->op == SHM_MB_KV_IMPORT_V, blocks, c.n_blocks, c.buf_off, c.buf_len, f, err, errlen);
		if (rc < 0)
			return rc;
		blocks += c.n_blocks;
	}
	return 0;
}

int wk_kv_act(struct worker *w, struct shm_mb_kv *k, char *err, size_t errlen)
{
	struct kn_kv_format f;

	if (w->tp.rank > 0 && (k->op == SHM_MB_KV_FORMAT || k->op == SHM_MB_KV_RXROUTE))
		return 0; /* the leader answers, and takes the stream */
	if (w->st == NULL) {
		snprintf(err, errlen, "stage %d (%s) has no engine", w->idx, w->o.role);
		return -EPROTO;
	}
	if (k->op == SHM_MB_KV_FORMAT) {
		kn_stage_kv_format(w->st, &f);
		k->dtype = f.dtype;
		k->layer_start = f.layer_start;
		k->layer_end = f.layer_end;
		k->n_kv_heads = f.n_kv_heads;
		k->head_dim = f.head_dim;
		k->block_bytes = f.block_bytes;
		return 0;
	}
	if (k->op == SHM_MB_KV_RXROUTE)
		return k->buf_off < DP_MAX_STREAMS ? wk_kvrx_route(w, (uint32_t)k->buf_off, err, errlen) : -EINVAL;
	f = (struct kn_kv_format){ .dtype = k->dtype, .layer_start = k->layer_start, .layer_end = k->layer_end,
				   .n_kv_heads = k->n_kv_heads, .head_dim = k->head_dim,
				   .block_bytes = (size_t)k->block_bytes };
	switch (k->op) {
	case SHM_MB_KV_EXPORT:
	case SHM_MB_KV_IMPORT:
		return kv_one(w, k->op == SHM_MB_KV_IMPORT, (const int32_t *)(k + 1), k->n_blocks, k->buf_off,
			      k->buf_len, &f, err, errlen);
	case SHM_MB_KV_EXPORT_V:
	case SHM_MB_KV_IMPORT_V:
		return kv_many(w, k, &f, err, errlen);
	default:
		snprintf(err, errlen, "stage %d (%s): unknown KV operation %u", w->idx, w->o.role, k->op);
		return -EINVAL;
	}
}

void wk_handle_kv(struct worker *w, struct shm_mb_hdr *h, size_t len)
{
	struct shm_mb_hdr *oh;
	struct shm_mb_kv *k;

	if (!w->joined || h->epoch != w->epoch) {
		w->dropped++;
		return; /* ctrld gave up on it (see worker.c's invariants) */
	}
	if (!shm_mb_kv_whole(h, len, WK_KV_MAX_BLOCKS) || h->stage != w->idx || h->total_len > w->buf_bytes) {
		WK_ERR(w, "dropping a malformed KV message (stage %d, %zu bytes): ctrld fails it at its deadline",
		       h->stage, len);
		return;
	}
	w->setup_flip ^= 1;
	oh = wk_out_buf(w, w->n_bufs - 2 + w->setup_flip);
	wk_out_quiesce(w->out, shm_off(w->reg, oh), &g_stop);
	memcpy(oh, h, h->total_len);
	k = (struct shm_mb_kv *)(oh + 1);
	if (oh->status == 0 && k->target == w->idx) {
		char err[SHM_MB_ERRLEN] = "";
		int rc = wk_kv_act(w, k, err, sizeof(err));

		/* tensor parallelism: each rank copies its heads' share of the
		 * pages; the leader answers once every follower has (a page
		 * leaves only whole), with the first refusal */
		wk_tp_kv_note(w, rc, err);
		if (rc == 0)
			rc = wk_tp_kv_wait(w, err, sizeof(err));
		else
			(void)wk_tp_kv_wait(w, (char[SHM_MB_ERRLEN]){ 0 }, SHM_MB_ERRLEN);
		if (rc < 0) {
			oh->status = rc;
			memcpy(oh->err, err, sizeof(oh->err));
			WK_ERR(w, "%s", err);
		}
	}
	oh->stage = w->idx + 1;
	wk_send_msg(w, oh);
}

int wk_kv_side_open(struct worker *w, char *err, size_t errlen)
{
	char name[SHM_NAME_MAX];
	const char *in = w->o.in + 5;

	if (strncmp(w->o.in, "ring:", 5) != 0 || w->tp.rank > 0)
		return 0; /* fed by the dataplane: pages move only on ctrld's node; a follower: its leader's */
	if (strlen(in) + 5 > sizeof(name)) {
		WK_WARN(w, "input ring %s: its name leaves no room for the KV side rings (%s.kvr): page copies "
			"go in band, behind queued micro-batches", in, in);
		return 0;
	}
	snprintf(name, sizeof(name), "%s.kv", in);
	w->kvq = wk_ring_open(w->reg, name, err, errlen);
	snprintf(name, sizeof(name), "%s.kvr", in);
	w->kvr = w->kvq != NULL ? wk_ring_open(w->reg, name, err, errlen) : NULL;
	if (w->kvr == NULL) {
		shm_ring_close(w->kvq);
		w->kvq = NULL;
		return -EIO;
	}
	if (w->tp.size > 1)
		WK_INFO(w, "KV page copies asked on %s.kv run beside the steps, each of the stage's %d ranks copying its "
			"share", in, (int)w->tp.size);
	return 0;
}

int wk_kv_side_poll(struct worker *w)
{
	/* the message as it was when taken: ctrld may give up on it at its
	 * deadline and reuse the buffer while a copy runs, so what is checked
	 * (the copy records, the block ids) is what is acted on */
	static _Thread_local union {
		struct shm_mb_hdr h;
		uint8_t b[sizeof(struct shm_mb_hdr) + sizeof(struct shm_mb_kv) + sizeof(int32_t) * WK_KV_MAX_BLOCKS];
	} snap;
	struct shm_desc d;
	struct shm_mb_hdr *h;
	size_t len;
	char err[SHM_MB_ERRLEN] = "";
	int rc;

	if (w->kvq == NULL || shm_ring_dequeue_burst(w->kvq, &d, 1) != 1)
		return 0;
	if (d.len < sizeof(struct shm_mb_hdr) || d.len > shm_region_size(w->reg)
	    || d.off > shm_region_size(w->reg) - d.len) {
		WK_ERR(w, "dropping a KV descriptor outside the region (offset %llu, %u bytes)",
		       (unsigned long long)d.off, d.len);
		return 1;
	}
	h = shm_ptr(w->reg, d.off);
	len = d.len < sizeof(snap) ? d.len : sizeof(snap);
	memcpy(&snap, h, len);
	if (!w->joined || snap.h.epoch != w->epoch) {
		w->dropped++;
		return 1; /* ctrld gave up on it */
	}
	if (snap.h.magic != SHM_MB_MAGIC || snap.h.kind != SHM_MB_KV || !shm_mb_kv_whole(&snap.h, len, WK_KV_MAX_BLOCKS)
	    || snap.h.stage != w->idx) {
		wk_fmt(err, sizeof(err), "stage %d (%s): a malformed KV message on the side ring (%u bytes, stage %d)",
		       w->idx, w->o.role, d.len, snap.h.stage);
		rc = -EBADMSG;
	} else {
		/* no drain: what ctrld sends here touches no block of a step in
		 * flight (the header says why), so the copy runs beside them
		 * (the CUDA engine moves pages on a stream of their own) */
		struct shm_mb_kv *k = (struct shm_mb_kv *)(&snap.h + 1);
		/* tensor parallelism: every rank copies its heads' share of the
		 * pages, the followers from the group's area (worker_tp.c) */
		const uint64_t job = k->op != SHM_MB_KV_FORMAT && k->op != SHM_MB_KV_RXROUTE
					     ? wk_tp_kv_begin(w, WK_TP_KV_MSG_JOB, &snap, (uint32_t)len, 0)
					     : 0;

		rc = wk_kv_act(w, k, err, sizeof(err));
		if (job != 0) {
			char ferr[SHM_MB_ERRLEN] = "";
			int frc = wk_tp_kv_end(w, job, ferr, sizeof(ferr));

			if (rc == 0 && frc < 0) {
				rc = frc;
				memcpy(err, ferr, sizeof(err));
			}
		}
	}
	if (rc < 0)
		WK_ERR(w, "%s", err);
	if (h->seq != snap.h.seq)
		return 1; /* ctrld gave up on it and reused the buffer meanwhile */
	if (rc == 0 && ((struct shm_mb_kv *)(&snap.h + 1))->op == SHM_MB_KV_FORMAT)
		memcpy(h + 1, &snap.h + 1, sizeof(struct shm_mb_kv)); /* the answer */
	h->status = rc < 0 ? rc : 0;
	if (rc < 0)
		memcpy(h->err, err, sizeof(h->err));
	if (shm_ring_enqueue_burst(w->kvr, &d, 1) != 1)
		WK_WARN(w, "the KV answer ring is full: ctrld reads no answers");
	return 1;
}
