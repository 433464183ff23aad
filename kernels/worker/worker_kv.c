/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-worker's KV messages (SHM_MB_KV, shm_mb.h): ctrld asks one stage
 * for its page format, or to copy pages of its pool out to / in from a
 * buffer of the region (a KV page message of the dataplane, ctrl/pd_link.c
 * frames it). The stage copies straight between its pool and that buffer:
 * no copy of its own (the CUDA engine's DMA reads and writes the pinned
 * region). Every step before the message finishes first, so an export sees
 * what they wrote and an import lands before anything after it runs.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kn_stage.h"
#include "shm_mb.h"
#include "shm_region.h"
#include "worker_hop.h"
#include "worker_int.h"

/* Most blocks one KV message names (ctrld frames at most WK_KVPAGE_MAX_BLOCKS). */
#define WK_KV_MAX_BLOCKS 4096

/* Do what @p k asks of this stage. @return 0 or -errno with @p err filled. */
static int kv_act(struct worker *w, struct shm_mb_kv *k, char *err, size_t errlen)
{
	const int32_t *blocks = (const int32_t *)(k + 1);
	struct kn_kv_format f;
	void *buf;
	int rc;

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
	if (k->op != SHM_MB_KV_EXPORT && k->op != SHM_MB_KV_IMPORT) {
		snprintf(err, errlen, "stage %d (%s): unknown KV operation %u", w->idx, w->o.role, k->op);
		return -EINVAL;
	}
	if (k->buf_len > shm_region_size(w->reg) || k->buf_off > shm_region_size(w->reg) - k->buf_len) {
		snprintf(err, errlen, "stage %d (%s): KV buffer [%llu, +%llu) lies outside region %s (%zu bytes): "
			 "pages move only between ctrld and stages on its node", w->idx, w->o.role,
			 (unsigned long long)k->buf_off, (unsigned long long)k->buf_len, w->o.region,
			 shm_region_size(w->reg));
		return -EFAULT;
	}
	buf = shm_ptr(w->reg, k->buf_off);
	if (k->op == SHM_MB_KV_EXPORT) {
		rc = kn_stage_kv_export(w->st, blocks, k->n_blocks, buf, (size_t)k->buf_len);
	} else {
		f = (struct kn_kv_format){ .dtype = k->dtype, .layer_start = k->layer_start, .layer_end = k->layer_end,
					   .n_kv_heads = k->n_kv_heads, .head_dim = k->head_dim,
					   .block_bytes = (size_t)k->block_bytes };
		rc = kn_stage_kv_import(w->st, blocks, k->n_blocks, buf, (size_t)k->buf_len, &f);
	}
	if (rc < 0)
		wk_fmt(err, errlen, "stage %d (%s, layers %d..%d): KV %s of %d blocks: %s", w->idx, w->o.role,
		       w->info.layer_start, w->info.layer_end, k->op == SHM_MB_KV_EXPORT ? "export" : "import",
		       k->n_blocks, kn_stage_error(w->st));
	return rc;
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
		int rc = kv_act(w, k, err, sizeof(err));

		if (rc < 0) {
			oh->status = rc;
			memcpy(oh->err, err, sizeof(oh->err));
			WK_ERR(w, "%s", err);
		}
	}
	oh->stage = w->idx + 1;
	wk_send_msg(w, oh);
}
