/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA stage engine: layers [start, end) of a model in device memory,
 * bf16 weights, f32 residual stream and accumulation, a paged bf16 KV pool.
 *
 * Invariants (what breaks if one is violated):
 *  - Every plan runs at its fixed width W: columns n_cols..W-1 are padding
 *    (slot -1) and every kernel computes each column independently in an
 *    order fixed by the shapes, so a column's bits never depend on its batch
 *    (kn_stage.h bitwise determinism). Changing a kernel so that a column's
 *    reduction depends on n or on its index breaks the batched-vs-solo test.
 *  - A plan's whole step (all layers, the sampler) is one CUDA graph,
 *    captured at the plan's first step and replayed; everything it touches
 *    lives at fixed device addresses. Re-sizing the pool moves the pool, so
 *    set_pool drops every graph.
 *  - Steps are submitted without waiting (kn_stage_step_submit): each in-
 *    flight step owns one ring slot of pinned host buffers (its columns in,
 *    its tokens out) and an event; everything else a step touches on the
 *    device is reused by the next step only after it in stream order. A
 *    step whose host buffers are pageable, or that needs logit rows on the
 *    host, completes inside submit (the shared bounce buffers and logits
 *    would otherwise be overwritten by the next step).
 *  - The device block table mirrors base.table by replaying the applied ops
 *    (table.cuh) on the stream ahead of the next step, so a step in flight
 *    never sees a later step's table and no step uploads the whole table.
 *  - Nothing vocab-sized crosses PCIe: the sampler (sample.cuh) leaves the
 *    token, its logprob and the top logprobs on the device, and one copy of
 *    8 to 168 bytes per column brings them back.
 *  - Device memory = weights + KV pool + workspace (reported by info); the
 *    host keeps no copy of the weights (they are uploaded from the loader's
 *    mapping, through a bounded staging buffer when they need conversion).
 */
#include "engine_int.cuh"

void cu_seterr(struct cu_stage *s, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->base.err, sizeof(s->base.err), fmt, ap);
	va_end(ap);
}

int cu_dalloc(struct cu_stage *s, void **p, size_t bytes, const char *what)
{
	*p = NULL;
	if (s->n_dptr >= (int)(sizeof(s->dptr) / sizeof(s->dptr[0]))) {
		cu_seterr(s, "cudaMalloc(%s): allocation table full", what);
		return -ENOMEM;
	}
	cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
	if (e != cudaSuccess) {
		size_t fr = 0, tot = 0;
		cudaGetLastError();
		cudaMemGetInfo(&fr, &tot);
		cu_seterr(s, "cudaMalloc(%s, %zu bytes) failed: %s (device has %zu of %zu bytes free); use fewer layers per stage, fewer KV blocks or a smaller plan",
		       what, bytes, cudaGetErrorString(e), fr, tot);
		*p = NULL;
		return -ENOMEM;
	}
	s->dptr[s->n_dptr++] = *p;
	/* cudaMemset runs on the legacy stream, which the step stream (non-
	 * blocking) does not wait for: without the synchronize, a 12 GB KV
	 * pool was still being zeroed under the first steps after a join,
	 * wiping their KV (H200, two CUDA worker stages: the first request
	 * after start answered "!!!!!!!!!!!!", the next ones right) */
	e = cudaMemset(*p, 0, bytes ? bytes : 16);
	if (e == cudaSuccess)
		e = cudaDeviceSynchronize();
	if (e != cudaSuccess) {
		cu_seterr(s, "cudaMemset(%s, %zu) failed: %s", what, bytes, cudaGetErrorString(e));
		return -EIO;
	}
	return 0;
}

void cu_dfree(struct cu_stage *s, void *p)
{
	for (int i = 0; i < s->n_dptr; i++)
		if (s->dptr[i] == p) {
			cudaFree(p);
			s->dptr[i] = s->dptr[--s->n_dptr];
			return;
		}
}

/* Whether the step's hidden buffer @p p (k: 0 in, 1 out) is page-locked. A
 * worker hands the same region buffers step after step, so the answer for
 * the last pointer seen is kept; a pageable buffer taken for pinned would
 * still copy correctly (synchronously), only the reverse costs a bounce. */
static int is_pinned(struct cu_stage *s, int k, const void *p)
{
	if (p && p == s->pin_seen[k])
		return s->pin_known[k];
	cudaPointerAttributes pa;
	int pinned = cudaPointerGetAttributes(&pa, p) == cudaSuccess && pa.type == cudaMemoryTypeHost;
	cudaGetLastError();
	s->pin_seen[k] = p;
	s->pin_known[k] = pinned;
	return pinned;
}

/* A step's host side once its event fired: tokens, logprobs, hidden rows
 * out of the slot (and, for host_rows, the logit rows and the host sampler
 * for more than KN_CU_MAX_TOP logprobs). */
static int finish(struct cu_stage *s, struct cu_slot *sl)
{
	struct kn_step *stp = &sl->st;
	const int n = stp->n_cols;
	CK(cudaEventSynchronize(sl->ev));
	if (!s->base.last) {
		if (sl->bounce_out)
			memcpy(stp->hidden_out, s->h_hidden, (size_t)n * s->hidden * 4);
		return 0;
	}
	struct out_layout o = out_layout(sl->h_out, sl->W);
	const int nt = stp->n_logprobs;
	for (int j = 0; j < n; j++) {
		stp->tokens_out[j] = o.tok[j];
		if (stp->token_logprob_out)
			stp->token_logprob_out[j] = o.lp[j];
		if (nt > 0 && nt <= KN_CU_MAX_TOP)
			for (int i = 0; i < nt; i++) {
				stp->top_ids_out[(size_t)j * nt + i] = o.ids[(size_t)j * KN_CU_MAX_TOP + i];
				stp->top_logprobs_out[(size_t)j * nt + i] = o.lps[(size_t)j * KN_CU_MAX_TOP + i];
			}
	}
	if (!sl->host_rows)
		return 0;
	for (int j = 0; j < n; j++) {
		const struct kn_column *c = &stp->cols[j];
		if (!(c->flags & KN_COL_NEED_LOGIT))
			continue;
		float *row = stp->logits_out ? stp->logits_out + (size_t)j * s->vocab : s->h_row;
		CK(cudaMemcpy(row, s->logits + (size_t)j * s->vocab, (size_t)s->vocab * 4, cudaMemcpyDeviceToHost));
		if (nt > KN_CU_MAX_TOP)
			kn_sample_column(row, s->vocab, c, nt, NULL, stp->top_ids_out + (size_t)j * nt,
					 stp->top_logprobs_out + (size_t)j * nt, s->scratch);
	}
	return 0;
}

/* Replay the ops applied since the last submit on the stream (table.cuh). */
static int push_ops(struct cu_stage *s, struct cu_slot *sl)
{
	const int n = s->p_ops_n;
	if (n == 0)
		return 0;
	if (sl->h_ops_cap < n) {
		cudaFreeHost(sl->h_ops);
		sl->h_ops = NULL;
		sl->h_ops_cap = 0;
		CK(cudaHostAlloc((void **)&sl->h_ops, (size_t)n * sizeof(struct kn_op), cudaHostAllocDefault));
		sl->h_ops_cap = n;
	}
	if (s->d_ops_cap < n) {
		/* steps in flight may still read the old buffer */
		CK(cudaStreamSynchronize(s->st));
		cu_dfree(s, s->d_ops);
		s->d_ops = NULL;
		s->d_ops_cap = 0;
		int cap = n < 1024 ? 1024 : n, rc;
		if ((rc = cu_dalloc(s, (void **)&s->d_ops, (size_t)cap * sizeof(struct kn_op), "ops")))
			return rc;
		s->d_ops_cap = cap;
	}
	memcpy(sl->h_ops, s->p_ops, (size_t)n * sizeof(struct kn_op));
	CK(cudaMemcpyAsync(s->d_ops, sl->h_ops, (size_t)n * sizeof(struct kn_op), cudaMemcpyHostToDevice, s->st));
	CK(kn_cuda_apply_ops(s->d_table, s->base.opts.max_blocks_per_slot, s->d_ops, n, s->st));
	s->p_ops_n = 0;
	return 0;
}

static int cu_submit(struct kn_stage *b, struct kn_step *stp)
{
	struct cu_stage *s = (struct cu_stage *)b;
	const int n = stp->n_cols, H = s->hidden;
	int pi = 0, rc;
	CK(cudaSetDevice(s->dev));
	while (s->plans[pi].width < n)
		pi++;
	struct plan *p = &s->plans[pi];
	const int W = p->width;
	struct cu_slot *sl = &s->ring[(s->r_head + s->r_n) % KN_STEP_DEPTH];
	const int host_rows = s->base.last && (stp->logits_out || stp->n_logprobs > KN_CU_MAX_TOP);
	const int n_top = host_rows ? 0 : stp->n_logprobs;
	const int pin_in = s->base.first || is_pinned(s, 0, stp->hidden_in);
	const int pin_out = s->base.last || is_pinned(s, 1, stp->hidden_out);
	memset(&sl->h_in[0], 0, sizeof(sl->h_in[0]));
	*(int32_t *)&sl->h_in[0] = n_top;
	memcpy(sl->h_in + 1, stp->cols, (size_t)n * sizeof(struct kn_column));
	for (int j = n; j < W; j++) {
		memset(&sl->h_in[1 + j], 0, sizeof(sl->h_in[0]));
		sl->h_in[1 + j].slot = KN_CU_PAD_SLOT;
	}
	if ((rc = push_ops(s, sl)))
		return rc;
	CK(cudaMemcpyAsync(s->d_in, sl->h_in, (size_t)(W + 1) * sizeof(struct kn_column), cudaMemcpyHostToDevice,
			   s->st));
	if (!s->base.first) {
		if (pin_in) {
			CK(cudaMemcpyAsync(s->resid, stp->hidden_in, (size_t)n * H * 4, cudaMemcpyHostToDevice, s->st));
		} else {
			/* pageable rows go through the shared bounce buffer: no overlap */
			CK(cudaStreamSynchronize(s->st));
			memcpy(s->h_hidden, stp->hidden_in, (size_t)n * H * 4);
			CK(cudaMemcpyAsync(s->resid, s->h_hidden, (size_t)n * H * 4, cudaMemcpyHostToDevice, s->st));
		}
	}
	int ctx = 1;
	for (int j = 0; j < n; j++)
		ctx = stp->cols[j].pos + 1 > ctx ? stp->cols[j].pos + 1 : ctx;
	const int bk = cu_ctx_bucket(s, ctx);
	/* a wide plan whose columns want few tokens (prompt chunks): the LM head
	 * on their rows alone */
	int packed = s->base.last && s->logit_rows && !host_rows && W > CU_LOGIT_K;
	for (int j = 0, want = 0; j < n && packed; j++)
		if (stp->cols[j].flags & KN_COL_NEED_LOGIT)
			packed = ++want <= CU_LOGIT_K;
	if (s->tp_host) {
		/* the ranks sum on the host, waiting for the device: no graph */
		if ((rc = cu_enqueue(s, W, cu_bucket_ctx(s, bk), packed)))
			return rc;
	} else {
		cudaGraphExec_t *ex = packed ? &p->exec_k[bk] : &p->exec[bk];
		if (!*ex && (rc = cu_capture(s, p, bk, packed)))
			return rc;
		CK(cudaGraphLaunch(*ex, s->st));
	}
	if (s->base.last)
		CK(cudaMemcpyAsync(sl->h_out, s->d_out, out_bytes(W, n_top), cudaMemcpyDeviceToHost, s->st));
	else
		CK(cudaMemcpyAsync(pin_out ? (void *)stp->hidden_out : (void *)s->h_hidden, s->resid, (size_t)n * H * 4,
				   cudaMemcpyDeviceToHost, s->st));
	CK(cudaEventRecord(sl->ev, s->st));
	sl->st = *stp;
	sl->W = W;
	sl->n_top = n_top;
	sl->host_rows = host_rows;
	sl->bounce_out = !pin_out;
	sl->done = 0;
	s->r_n++;
	if (host_rows || !pin_in || !pin_out) {
		sl->rc = finish(s, sl);
		sl->done = 1;
	}
	return 0;
}

static int cu_wait(struct kn_stage *b)
{
	struct cu_stage *s = (struct cu_stage *)b;
	struct cu_slot *sl = &s->ring[s->r_head];
	int rc = sl->done ? sl->rc : finish(s, sl);
	s->r_head = (s->r_head + 1) % KN_STEP_DEPTH;
	s->r_n--;
	return rc;
}

static int cu_ready(struct kn_stage *b)
{
	struct cu_stage *s = (struct cu_stage *)b;
	struct cu_slot *sl = &s->ring[s->r_head];
	if (sl->done)
		return 1;
	cudaError_t e = cudaEventQuery(sl->ev);
	if (e == cudaErrorNotReady)
		return 0;
	if (e != cudaSuccess)
		cudaGetLastError(); /* the wait reports it */
	return 1;
}

/* ---- vtable ---- */

static void cu_destroy(struct kn_stage *b)
{
	struct cu_stage *s = (struct cu_stage *)b;
	if (!s)
		return;
	cudaSetDevice(s->dev);
	if (s->st)
		cudaStreamSynchronize(s->st);
	cu_drop_graphs(s);
	cu_tp_fini(s);
	if (s->blas)
		cublasDestroy(s->blas);
	if (s->st)
		cudaStreamDestroy(s->st);
	if (s->kvst)
		cudaStreamDestroy(s->kvst);
	for (int i = 0; i < KN_STEP_DEPTH; i++) {
		cudaFreeHost(s->ring[i].h_in);
		cudaFreeHost(s->ring[i].h_out);
		cudaFreeHost(s->ring[i].h_ops);
		if (s->ring[i].ev)
			cudaEventDestroy(s->ring[i].ev);
	}
	free(s->p_ops);
	cudaFreeHost(s->h_hidden);
	cudaFreeHost(s->h_row);
	cudaFreeHost(s->pcs);
	free(s->scratch);
	while (s->n_dptr > 0)
		cudaFree(s->dptr[--s->n_dptr]);
	free(s->L);
	kn_stage_base_fini(&s->base);
	free(s);
}

static int cu_info(const struct kn_stage *b, struct kn_stage_info *info)
{
	const struct cu_stage *s = (const struct cu_stage *)b;
	info->weight_bytes = s->weight_bytes;
	info->kv_bytes = s->kv_bytes;
	info->workspace_bytes = s->ws_bytes;
	info->tp_transport = cu_tp_transport(s);
	info->tp_why = s->tp_why;
	return 0;
}

static int cu_set_pool(struct kn_stage *b, int32_t n_blocks)
{
	struct cu_stage *s = (struct cu_stage *)b;
	CK(cudaSetDevice(s->dev));
	CK(cudaStreamSynchronize(s->st));
	cu_drop_graphs(s);
	cu_dfree(s, s->kv);
	s->kv = NULL;
	s->kv_bytes = 0;
	int rc = cu_alloc_pool(s, n_blocks);
	if (rc) {
		/* keep a usable stage: restore the previous size if it still fits */
		if (s->base.n_blocks > 0 && cu_alloc_pool(s, s->base.n_blocks) == 0)
			return -ENOMEM;
		s->base.n_blocks = 0;
		return -ENOMEM;
	}
	CK(cudaMemset(s->d_table, 0xff, (size_t)s->base.opts.n_slots * s->base.opts.max_blocks_per_slot * 4));
	CK(cudaDeviceSynchronize()); /* the legacy stream's memset before the step stream's ops (cu_dalloc) */
	s->p_ops_n = 0; /* ops of the old pool: the table starts empty */
	return 0;
}

/* Keep the applied ops for the next submit, which replays them on the
 * device ahead of its step (table.cuh). */
static int cu_apply_ops(struct kn_stage *b, const struct kn_op *ops, size_t n)
{
	struct cu_stage *s = (struct cu_stage *)b;
	if (s->p_ops_n + n > (size_t)s->p_ops_cap) {
		size_t cap = (size_t)s->p_ops_cap * 2 > s->p_ops_n + n ? (size_t)s->p_ops_cap * 2 : s->p_ops_n + n + 256;
		struct kn_op *np = (struct kn_op *)realloc(s->p_ops, cap * sizeof(*np));
		if (!np) {
			cu_seterr(s, "cu_apply_ops: out of memory for %zu pending ops", cap);
			return -ENOMEM;
		}
		s->p_ops = np;
		s->p_ops_cap = (int)cap;
	}
	memcpy(s->p_ops + s->p_ops_n, ops, n * sizeof(*ops));
	s->p_ops_n += (int)n;
	return 0;
}

/* The device's address of pinned host pointer @p p (its mapping, or the
 * pointer itself where the device reads host pointers), or NULL. */
static const uint8_t *dev_alias(const void *p)
{
	cudaPointerAttributes pa;

	if (cudaPointerGetAttributes(&pa, p) != cudaSuccess || pa.type != cudaMemoryTypeHost
	    || pa.devicePointer == NULL) {
		cudaGetLastError();
		return NULL;
	}
	return (const uint8_t *)pa.devicePointer;
}

/* The piece table (gather.cuh), allocated on first use. */
static int cu_pieces(struct cu_stage *s)
{
	if (s->pcs == NULL) {
		CK(cudaHostAlloc((void **)&s->pcs, CU_GATHER_TABLE * sizeof(*s->pcs), cudaHostAllocMapped));
		CK(cudaHostGetDevicePointer((void **)&s->pcs_dev, s->pcs, 0));
	}
	return 0;
}

/* KV pages to or from the host (kn_kv_format: per block, per layer, K then V
 * pages of [nkv][KN_PAGE_BLK][hd] bf16, which is how the pool stores a
 * block): one 2-D copy per block and K/V, the layers as its rows, done on
 * return. With kv_own_stream (a worker's KV side ring) on a stream of its
 * own, beside a step in flight, not behind it (the caller moves only blocks
 * no step in flight writes or reads: a finished chunk's pages out, reserved
 * blocks in); else on the steps' stream.
 * One call per block. The copy engines run them beside the steps' kernels:
 * out by the gather kernel (gather.cuh) through the device's mapping of
 * the pinned region was 11% faster alone (H200, 2 MiB: 32.8 against 29.6
 * GB/s) but slower in pd-bench (a 2048-token prompt's pages copied out in
 * 19 ms against 14: its blocks wait for the SMs the prefill holds). */
static int cu_kv_move(struct kn_stage *b, const int32_t *blocks, int32_t n, void *out, const void *in)
{
	struct cu_stage *s = (struct cu_stage *)b;
	cudaStream_t kst = s->kvst ? s->kvst : s->st;
	const size_t page = (size_t)s->nkv * KN_PAGE_BLK * s->hd * 2;               /* bytes */
	const size_t lay = (size_t)2 * s->base.n_blocks * s->nkv * KN_PAGE_BLK * s->hd * 2; /* bytes */
	/* the format's page holds every rank's heads: this rank's are its share at rank * page */
	const size_t fpage = page * (size_t)s->tp;
	for (int32_t i = 0; i < n; i++)
		for (int kv = 0; kv < 2; kv++) {
			char *dev = (char *)s->kv + (size_t)kv * lay / 2 + (size_t)blocks[i] * page;
			const size_t host = ((size_t)i * s->nl * 2 + kv) * fpage + (size_t)s->rank * page;
			/* pitches past 2^31 (pools over 2 GB a layer) go layer by layer */
			const int rows = lay < ((size_t)1 << 31) ? s->nl : 1;
			cudaError_t e = cudaSuccess;
			for (int l = 0; l < s->nl && e == cudaSuccess; l += rows) {
				char *d = dev + (size_t)l * lay;
				const size_t h = host + (size_t)l * 2 * fpage;
				e = out ? cudaMemcpy2DAsync((char *)out + h, 2 * fpage, d, lay, page, (size_t)rows,
							    cudaMemcpyDeviceToHost, kst)
					: cudaMemcpy2DAsync(d, lay, (const char *)in + h, 2 * fpage, page, (size_t)rows,
							    cudaMemcpyHostToDevice, kst);
			}
			if (e != cudaSuccess) {
				cudaGetLastError();
				cu_seterr(s, "cudaMemcpy2DAsync(KV block %d %s) failed: %s", blocks[i], out ? "out" : "in",
				       cudaGetErrorString(e));
				return -EIO;
			}
		}
	CK(cudaStreamSynchronize(kst));
	return 0;
}

static int cu_kv_export(struct kn_stage *b, const int32_t *blocks, int32_t n, void *dst)
{
	return cu_kv_move(b, blocks, n, dst, NULL);
}

static int cu_kv_import(struct kn_stage *b, const int32_t *blocks, int32_t n, const void *src)
{
	return cu_kv_move(b, blocks, n, NULL, src);
}

/* KV pages in from pieces (a page message received in place: each frame's
 * payload in the pinned region where the driver left it), no gather on
 * the host. By default one kernel reads every piece where it lies
 * (gather.cuh), up to a table of pieces at a time; where the device has no
 * address for the pieces (KVFERRY_CUDA_KV_GATHER=0 forces it), one DMA per
 * piece, up to PIECES at a time in one cudaMemcpyBatchAsync (H200: a
 * 2048-token prompt's lone TTFT 1.73-1.80 x co-located this way, against
 * 1.18-1.20 x with the message reassembled on the host and one DMA). */
static int cu_kv_import_segs(struct kn_stage *b, const int32_t *blocks, int32_t n, struct kn_seg_cursor *cur)
{
	enum { PIECES = 512 };
	struct cu_stage *s = (struct cu_stage *)b;
	cudaStream_t kst = s->kvst ? s->kvst : s->st;
	const size_t page = (size_t)s->nkv * KN_PAGE_BLK * s->hd * 2;               /* bytes */
	const size_t lay = (size_t)2 * s->base.n_blocks * s->nkv * KN_PAGE_BLK * s->hd * 2; /* bytes */
	void *dst[PIECES];
	const void *src[PIECES];
	size_t len[PIECES];
	ptrdiff_t delta = 0;
	int np = 0, gather = 0;

	if (s->kv_gather && cur->i < cur->n) {
		/* the whole region is pinned as one: the first and last pieces
		 * have the same device offset, every piece between them too */
		const uint8_t *a = dev_alias(cur->seg[cur->i].p), *z = dev_alias(cur->seg[cur->n - 1].p);

		delta = a ? a - (const uint8_t *)cur->seg[cur->i].p : 0;
		gather = a != NULL && z != NULL && z - (const uint8_t *)cur->seg[cur->n - 1].p == delta;
		if (gather && cu_pieces(s) < 0)
			return -EIO;
	}
	auto flush = [&]() -> int {
		if (np == 0)
			return 0;
		if (gather) {
			/* the kernel reads the table where it lies: wait before it is refilled */
			CK(kn_cuda_gather(s->pcs_dev, np, kst));
			CK(cudaStreamSynchronize(kst));
			np = 0;
			return 0;
		}
#if CUDART_VERSION >= 13000
		struct cudaMemcpyAttributes at;
		size_t first = 0;
		memset(&at, 0, sizeof(at));
		at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
		CK(cudaMemcpyBatchAsync(dst, src, len, (size_t)np, &at, &first, 1, kst));
#else
		for (int k = 0; k < np; k++)
			CK(cudaMemcpyAsync(dst[k], src[k], len[k], cudaMemcpyHostToDevice, kst));
#endif
		np = 0;
		return 0;
	};
	for (int32_t i = 0; i < n; i++)
		for (int l = 0; l < s->nl; l++)
			for (int kv = 0; kv < 2; kv++) {
				char *d = (char *)s->kv + (size_t)kv * lay / 2 + (size_t)l * lay + (size_t)blocks[i] * page;
				size_t left = page;
				/* a rank reads its heads' share of the format's page */
				kn_seg_read(cur, NULL, (size_t)s->rank * page);
				while (left > 0 && cur->i < cur->n) {
					const void *p;
					size_t k = kn_seg_next(cur, left, &p);
					if (k > 0) {
						if (np == (gather ? CU_GATHER_TABLE : PIECES) && flush())
							return -EIO;
						if (gather) {
							s->pcs[np++] = (struct cu_piece){ (const uint8_t *)p + delta,
											  (uint8_t *)d, k };
						} else {
							dst[np] = d;
							src[np] = p;
							len[np++] = k;
						}
					}
					d += k;
					left -= k;
				}
				kn_seg_read(cur, NULL, (size_t)(s->tp - 1 - s->rank) * page);
			}
	if (flush())
		return -EIO;
	CK(cudaStreamSynchronize(kst));
	return 0;
}

static const struct kn_stage_vtbl cu_vtbl = {
	"cuda", kn_cuda_stage_create, cu_destroy, cu_info, cu_set_pool, cu_apply_ops, NULL, cu_submit, cu_wait,
	cu_ready, NULL, KN_DT_BF16, cu_kv_export, cu_kv_import, cu_kv_import_segs,
};

static void errfill(char *err, size_t errlen, const char *msg)
{
	if (err && errlen)
		snprintf(err, errlen, "%s", msg);
}

/** A measuring knob that is on unless set to "0". */
static int env_on(const char *name)
{
	const char *v = getenv(name);
	return v == NULL || strcmp(v, "0") != 0;
}

/** A piece length from @p name: 16..2048 in steps of 16, else @p dflt. */
static int env_split(const char *name, int dflt)
{
	const char *v = getenv(name);
	const int n = v ? atoi(v) : 0;
	return n >= 16 && n <= 2048 && n % 16 == 0 ? n : dflt;
}

/*
 * A measuring knob that names a choice: the index of its value in @p words,
 * or @p unset when the variable is not set; -1 (and @p err filled) when it
 * names none of them. Such values used to fall back to the default in
 * silence, and a measurement ran other kernels than it said.
 */
static int env_word(const char *name, const char *const *words, int unset, char *err, size_t errlen)
{
	const char *v = getenv(name);
	char list[160] = "";
	size_t at = 0;

	if (v == NULL)
		return unset;
	for (int i = 0; words[i] != NULL; i++) {
		if (strcmp(v, words[i]) == 0)
			return i;
		at += (size_t)snprintf(list + at, at < sizeof(list) ? sizeof(list) - at : 0, "%s%s",
				       i ? ", " : "", words[i]);
	}
	snprintf(err, errlen, "kn_stage_create(cuda): %s=%s names no choice; give one of %s, or unset it", name, v,
		 list);
	return -1;
}

static struct kn_stage *create(const struct kn_model *m, const struct kn_model_config *rcfg,
			       uint64_t seed, const struct kn_stage_opts *o, char *err, size_t errlen)
{
	struct cu_stage *s = (struct cu_stage *)calloc(1, sizeof(*s));
	int rc = -ENOMEM;
	if (!s) {
		errfill(err, errlen, "kn_stage_create(cuda): out of memory");
		errno = ENOMEM;
		return NULL;
	}
	if (m) {
		rc = kn_stage_base_init(&s->base, &cu_vtbl, m, o, err, errlen);
		if (rc) {
			free(s);
			errno = -rc;
			return NULL;
		}
	} else {
		/* Random weights: the same base fields kn_stage_base_init() sets. */
		s->cfg_copy = *rcfg;
		s->base.vt = &cu_vtbl;
		s->base.cfg = &s->cfg_copy;
		s->base.opts = *o;
		if (s->base.opts.layer_end < 0)
			s->base.opts.layer_end = rcfg->n_layers;
		s->base.first = s->base.opts.layer_start == 0;
		s->base.last = s->base.opts.layer_end == rcfg->n_layers;
		s->base.max_plan = o->plan_widths[o->n_plans - 1];
		size_t tn = (size_t)o->n_slots * o->max_blocks_per_slot;
		s->base.table = (int32_t *)malloc(tn * 4);
		if (!s->base.table) {
			free(s);
			errfill(err, errlen, "kn_stage_create(cuda): out of memory for the block table");
			errno = ENOMEM;
			return NULL;
		}
		memset(s->base.table, 0xff, tn * 4);
	}
	const struct kn_model_config *c = s->base.cfg;
	const struct kn_stage_opts *op = &s->base.opts;
	s->dev = op->device;
	s->nl = op->layer_end - op->layer_start;
	s->hidden = c->hidden_size;
	s->inter = c->intermediate_size;
	s->vocab = c->vocab_size;
	s->hd = c->head_dim;
	s->nh = c->n_heads;
	s->nkv = c->n_kv_heads;
	s->tp = op->tp_size > 1 ? op->tp_size : 1;
	s->rank = s->tp > 1 ? op->tp_rank : 0;
	if (s->tp > 1) {
		/* this rank's share of the heads and the MLP columns (tp.cu) */
		const char *why = (s->tp & (s->tp - 1)) || s->tp > 8 ? "tp_size must be 1, 2, 4 or 8"
				  : s->rank < 0 || s->rank >= s->tp ? "tp_rank must be below tp_size"
				  : s->nh % s->tp || s->nkv % s->tp ? "the heads and KV heads must split evenly over the ranks"
				  : s->inter % (8 * s->tp) ? "the MLP's intermediate size must split into multiples of 8"
				  : NULL;
		if (why != NULL) {
			snprintf(s->base.err, sizeof(s->base.err),
				 "kn_stage_create(cuda): tp_size %d, rank %d with %d heads, %d KV heads, intermediate %d: "
				 "%s; run this model with fewer ranks (tp_size 1 always works)", s->tp, s->rank, s->nh,
				 s->nkv, s->inter, why);
			rc = -EINVAL;
			goto fail;
		}
		s->nh /= s->tp;
		s->nkv /= s->tp;
		s->inter /= s->tp;
	}
	s->q_dim = s->nh * s->hd;
	s->kv_dim = s->nkv * s->hd;
	s->qkv_dim = s->q_dim + 2 * s->kv_dim;
	s->max_ctx = op->max_blocks_per_slot * KN_PAGE_BLK;
	if (c->max_position > 0 && c->max_position < s->max_ctx)
		s->max_ctx = c->max_position;
	s->wmax = s->base.max_plan;
	{
		/* Wide plans round X to bf16 by default (as transformers does);
		 * "split" adds the remainder's product: f32-grade X at twice the
		 * tensor work (for validation against f32 references). */
		static const char *const wide_x[] = { "bf16", "split", NULL }, *const gemv[] = { "auto", "ffma", "mma", NULL },
					 *const attn[] = { "auto", "column", "tile", NULL },
					 *const wide[] = { "cublas", "mma", NULL }, *const linear[] = { "default", "wg", NULL },
					 *const runs[] = { "0", "64", "128", NULL }, *const exact[] = { "0", "1", "auto", NULL },
					 *const steps[] = { "16", "64", NULL },
					 *const defer[] = { "none", "qkv_gate_up", "all", "auto", NULL };
		const int wx = env_word("KVFERRY_CUDA_WIDE_X", wide_x, op->cuda_wide_x == 1, s->base.err, sizeof(s->base.err));
		const int gk = env_word("KVFERRY_CUDA_GEMV", gemv, op->cuda_gemv, s->base.err, sizeof(s->base.err));
		const int at = env_word("KVFERRY_CUDA_ATTN", attn, op->cuda_attn, s->base.err, sizeof(s->base.err));
		/* mma: the wide linears with the narrow kernel's bits (gemv.cuh);
		 * for measuring its cost, not yet the default (kernels/cuda/NOTES.md) */
		const int wk = env_word("KVFERRY_CUDA_WIDE", wide, 0, s->base.err, sizeof(s->base.err));
		/* wg: one numerics family: every linear layer on the warpgroup
		 * kernel, X rounded to bf16 at every width (gemm_wg.cuh), attention
		 * on the tile kernel in fixed pieces; Hopper only (checked below) */
		const int lk = env_word("KVFERRY_CUDA_LINEAR", linear, 0, s->base.err, sizeof(s->base.err));
		/* the run kernel's runs: 64 columns (default), 128 or none (0) */
		const int rn = env_word("KVFERRY_CUDA_ATTN_RUNS", runs, 1, s->base.err, sizeof(s->base.err));
		const int ax = env_word("KVFERRY_CUDA_ATTN_EXACT", exact, 2, s->base.err, sizeof(s->base.err));
		/* the tile kernel's bf16 launches in softmax steps of 64 keys (the
		 * default), and the family's prompt runs on the run kernel in its
		 * pieces; 16: 16-key pages and no runs in the family, for measuring
		 * (H100, kernels/cuda/NOTES.md, twenty-fifth session: the family's
		 * 2,048-token prefill 8B 67.5 -> 63.4 ms, 1B 13.0 -> 11.6) */
		const int sk = env_word("KVFERRY_CUDA_ATTN_STEPS", steps, 1, s->base.err, sizeof(s->base.err));
		/* the family's segment sums to their consumers: qkv's, gate_up's,
		 * and o's and down's where a row of them is small (auto, the
		 * default), every product's, qkv's and gate_up's only, or none
		 * (graph.cu defer_od()) */
		const int df = env_word("KVFERRY_CUDA_DEFER", defer, CU_DEFER_AUTO, s->base.err, sizeof(s->base.err));
		if (wx < 0 || gk < 0 || at < 0 || wk < 0 || lk < 0 || rn < 0 || ax < 0 || df < 0 || sk < 0) {
			rc = -EINVAL;
			goto fail;
		}
		s->wide_split = wx == 1;
		s->gemv_kind = gk == 1 ? KN_CU_GEMV_FFMA : gk == 2 ? KN_CU_GEMV_MMA : -1;
		s->attn_tile = at;
		s->wide_mma = wk == 1;
		s->linear_wg = op->cuda_batch_invariant || lk == 1;
		s->defer = df;
		s->family_split = env_split("KVFERRY_CUDA_FAMILY_SPLIT", CU_FAMILY_SPLIT);
		s->narrow_split = env_split("KVFERRY_CUDA_NARROW_SPLIT", 0);
		s->wide_split_len = env_split("KVFERRY_CUDA_WIDE_SPLIT", 0);
		s->logit_rows = env_on("KVFERRY_CUDA_LOGIT_ROWS");
		s->attn_runs = rn == 0 ? 0 : rn == 2 ? 128 : 64;
		s->sample_pieces = env_on("KVFERRY_CUDA_SAMPLE_PIECES");
		s->narrow_own = env_on("KVFERRY_CUDA_NARROW_OWN");
		s->attn_exact = ax == 2 ? -1 : ax;
		s->attn_steps64 = sk == 1;
		s->kv_gather = env_on("KVFERRY_CUDA_KV_GATHER");
		s->ctx_buckets = env_on("KVFERRY_CUDA_CTX_BUCKETS");
		if (!kn_cuda_attn_tile_ok(c->head_dim) || (c->n_kv_heads > 0 && c->n_heads / c->n_kv_heads > 8))
			s->attn_tile = 1; /* the column kernel serves the other shapes */
		else if (s->linear_wg)
			s->attn_tile = 2; /* one family: the tile kernel at every width (cu_attn_split()) */
	}
	s->n_plans = op->n_plans;
	for (int i = 0; i < s->n_plans; i++)
		s->plans[i].width = op->plan_widths[i];
	s->blk_bytes = (size_t)s->nl * 2 * s->nkv * KN_PAGE_BLK * s->hd * 2;

	if (s->hidden % 8 || s->inter % 8 || s->q_dim % 8 ||
	    s->hd % 16 || s->hd < 16 || s->hd > 256 || s->nkv < 1 || s->nh % s->nkv) {
		snprintf(s->base.err, sizeof(s->base.err),
			 "kn_stage_create(cuda): unsupported shape (hidden %d, intermediate %d and heads x head_dim %d must be multiples of 8; head_dim %d must be a multiple of 16 up to 256; %d heads must be a multiple of the %d KV heads); use the cpu backend",
			 s->hidden, s->inter, s->q_dim, s->hd, s->nh, s->nkv);
		rc = -EINVAL;
		goto fail;
	}
	int ndev;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev <= s->dev) {
		cudaGetLastError();
		snprintf(s->base.err, sizeof(s->base.err),
			 "kn_stage_create(cuda): no CUDA device %d (cudaGetDeviceCount found none usable); use the cpu backend or fix the driver",
			 s->dev);
		rc = -ENODEV;
		goto fail;
	}
	if (cudaSetDevice(s->dev) != cudaSuccess || cudaStreamCreateWithFlags(&s->st, cudaStreamNonBlocking) != cudaSuccess
	    || (o->kv_own_stream && cudaStreamCreateWithFlags(&s->kvst, cudaStreamNonBlocking) != cudaSuccess)) {
		snprintf(s->base.err, sizeof(s->base.err), "kn_stage_create(cuda): cudaSetDevice/cudaStreamCreate(%d) failed: %s",
			 s->dev, cudaGetErrorString(cudaGetLastError()));
		rc = -EIO;
		goto fail;
	}
	if (s->linear_wg && (!kn_cuda_one_family_ok(s->dev) || s->attn_tile != 2)) {
		snprintf(s->base.err, sizeof(s->base.err),
			 "kn_stage_create(cuda): cuda_batch_invariant (one numerics family) needs a Hopper GPU (device %d "
			 "%s) and a shape the attention tile kernel serves (head_dim 16, 32, 64 or 128: this one %d; at most "
			 "8 heads per KV head: %d); set cuda_batch_invariant = no (and unset KVFERRY_CUDA_LINEAR)", s->dev,
			 kn_cuda_one_family_ok(s->dev) ? "is one" : "is not", s->hd, s->nh / s->nkv);
		rc = -EINVAL;
		goto fail;
	}
	if (cublasCreate(&s->blas) != CUBLAS_STATUS_SUCCESS) {
		s->blas = NULL;
		snprintf(s->base.err, sizeof(s->base.err), "kn_stage_create(cuda): cublasCreate failed");
		rc = -EIO;
		goto fail;
	}
	if ((rc = cu_dalloc(s, (void **)&s->inv_freq, (size_t)s->hd / 2 * 4, "inv_freq")))
		goto fail;
	{
		float *f = (float *)malloc((size_t)s->hd / 2 * 4);
		if (!f) {
			rc = -ENOMEM;
			goto fail;
		}
		kn_rope_inv_freq(c, f);
		cudaError_t e = cudaMemcpy(s->inv_freq, f, (size_t)s->hd / 2 * 4, cudaMemcpyHostToDevice);
		free(f);
		if (e != cudaSuccess) {
			cu_seterr(s, "cudaMemcpy(inv_freq) failed: %s", cudaGetErrorString(e));
			rc = -EIO;
			goto fail;
		}
	}
	if ((rc = cu_load_weights(s, m == NULL, seed)) || (rc = cu_alloc_workspace(s)))
		goto fail;
	if (cublasSetStream(s->blas, s->st) != CUBLAS_STATUS_SUCCESS ||
	    cublasSetWorkspace(s->blas, s->blas_ws, BLAS_WS_BYTES) != CUBLAS_STATUS_SUCCESS ||
	    cublasSetMathMode(s->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
		cu_seterr(s, "cublasSetStream/cublasSetWorkspace(%zu) failed", BLAS_WS_BYTES);
		rc = -EIO;
		goto fail;
	}
	if ((rc = cu_tp_init(s)))
		goto fail;
	{
		int32_t nb = op->n_blocks;
		if (nb < 0) {
			size_t fr = 0, tot = 0;
			if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
				cu_seterr(s, "cudaMemGetInfo failed");
				rc = -EIO;
				goto fail;
			}
			float frac = op->kv_mem_fraction;
			if (!(frac > 0.f && frac <= 1.f)) {
				cu_seterr(s, "kn_stage_create(cuda): kv_mem_fraction %g is not in (0, 1]", (double)frac);
				rc = -EINVAL;
				goto fail;
			}
			size_t want = (size_t)((double)fr * frac) / s->blk_bytes;
			nb = want > INT32_MAX ? INT32_MAX : (int32_t)want;
			if (nb < 1) {
				cu_seterr(s, "kn_stage_create(cuda): %g of the %zu free device bytes holds no KV block of %zu bytes; raise kv_mem_fraction or hold fewer layers",
				       (double)frac, fr, s->blk_bytes);
				rc = -ENOMEM;
				goto fail;
			}
		}
		if ((rc = cu_alloc_pool(s, nb)))
			goto fail;
		s->base.n_blocks = nb;
	}
	return &s->base;
fail:
	errfill(err, errlen, s->base.err);
	errno = -rc;
	cu_destroy(&s->base);
	return NULL;
}

extern "C" struct kn_stage *kn_cuda_stage_create(const struct kn_model *m, const struct kn_stage_opts *o,
						 char *err, size_t errlen)
{
	return create(m, NULL, 0, o, err, errlen);
}

extern "C" struct kn_stage *kn_cuda_stage_create_random(const struct kn_model_config *cfg, uint64_t seed,
							const struct kn_stage_opts *o, char *err,
							size_t errlen)
{
	struct kn_stage_opts d;
	if (!o) {
		kn_stage_opts_init(&d);
		o = &d;
	}
	int32_t end = o->layer_end < 0 ? cfg->n_layers : o->layer_end;
	if (o->layer_start < 0 || o->layer_start >= end || end > cfg->n_layers || o->n_plans < 1 ||
	    o->n_plans > KN_MAX_PLANS || o->n_slots < 1 || o->max_blocks_per_slot < 1) {
		errfill(err, errlen, "kn_cuda_stage_create_random: bad layer range, plans or slots");
		errno = EINVAL;
		return NULL;
	}
	return create(NULL, cfg, seed, o, err, errlen);
}

extern "C" int kn_cuda_device_count(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	return n;
}

extern "C" int kn_cuda_host_register(void *p, size_t len, char *err, size_t errlen)
{
	cudaError_t e = cudaHostRegister(p, len, cudaHostRegisterPortable);
	if (e != cudaSuccess) {
		if (err && errlen)
			snprintf(err, errlen, "cudaHostRegister(%p, %zu) failed: %s", p, len, cudaGetErrorString(e));
		return -EIO;
	}
	return 0;
}

extern "C" int kn_cuda_host_unregister(void *p)
{
	return cudaHostUnregister(p) == cudaSuccess ? 0 : -EIO;
}
