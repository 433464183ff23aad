/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA engine's memory: the stage's weights uploaded from the loader's
 * mapping (or filled at random for benchmarks), the paged KV pool and the
 * step workspace (engine_int.cuh).
 */
#include "engine_int.cuh"

/* ---- weights ---- */

/* Upload @p t (any dtype, @p rows x @p cols) as bf16 to @p dst. */
static int upload_bf16(struct cu_stage *s, kn_bf16 *dst, const struct kn_tensor *t, int64_t rows,
		       int64_t cols)
{
	const size_t n = (size_t)rows * (size_t)cols;
	size_t have = 1;
	for (int i = 0; i < t->n_dims; i++)
		have *= (size_t)t->shape[i];
	if (have != n) {
		cu_seterr(s, "tensor %s has %zu elements, the config implies %lld x %lld", t->name, have,
		       (long long)rows, (long long)cols);
		return -EINVAL;
	}
	if (t->dtype == KN_DT_BF16) {
		CK(cudaMemcpy(dst, t->data, n * 2, cudaMemcpyHostToDevice));
		return 0;
	}
	uint16_t *buf = (uint16_t *)malloc(STAGE_BYTES);
	if (!buf) {
		cu_seterr(s, "malloc(%zu) for weight conversion staging failed", STAGE_BYTES);
		return -ENOMEM;
	}
	const size_t chunk = STAGE_BYTES / 2;
	for (size_t o = 0; o < n; o += chunk) {
		size_t m = n - o < chunk ? n - o : chunk;
		for (size_t i = 0; i < m; i++) {
			float f = t->dtype == KN_DT_F32 ? ((const float *)t->data)[o + i]
							: kn_f16_to_f32(((const uint16_t *)t->data)[o + i]);
			buf[i] = kn_f32_to_bf16(f);
		}
		cudaError_t e = cudaMemcpy(dst + o, buf, m * 2, cudaMemcpyHostToDevice);
		if (e != cudaSuccess) {
			free(buf);
			cu_seterr(s, "cudaMemcpy(%s, %zu bytes) failed: %s", t->name, m * 2, cudaGetErrorString(e));
			return -EIO;
		}
	}
	free(buf);
	return 0;
}

/* Upload a small vector tensor as f32. */
static int upload_f32(struct cu_stage *s, float *dst, const struct kn_tensor *t, int64_t n)
{
	size_t have = 1;
	for (int i = 0; i < t->n_dims; i++)
		have *= (size_t)t->shape[i];
	if (have != (size_t)n) {
		cu_seterr(s, "tensor %s has %zu elements, expected %lld", t->name, have, (long long)n);
		return -EINVAL;
	}
	float *buf = (float *)malloc((size_t)n * sizeof(float));
	if (!buf) {
		cu_seterr(s, "malloc(%lld floats) failed", (long long)n);
		return -ENOMEM;
	}
	for (int64_t i = 0; i < n; i++)
		buf[i] = t->dtype == KN_DT_F32   ? ((const float *)t->data)[i]
			 : t->dtype == KN_DT_BF16 ? kn_bf16_to_f32(((const uint16_t *)t->data)[i])
						  : kn_f16_to_f32(((const uint16_t *)t->data)[i]);
	cudaError_t e = cudaMemcpy(dst, buf, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
	free(buf);
	if (e != cudaSuccess) {
		cu_seterr(s, "cudaMemcpy(%s) failed: %s", t->name, cudaGetErrorString(e));
		return -EIO;
	}
	return 0;
}

static const struct kn_tensor *need(struct cu_stage *s, const char *fmt, int l)
{
	char name[160];
	snprintf(name, sizeof(name), fmt, l);
	const struct kn_tensor *t = kn_model_tensor(s->base.model, name);
	if (!t)
		cu_seterr(s, "kn_stage_create(cuda): tensor %s is missing from %s", name,
		       kn_model_dir(s->base.model));
	return t;
}

/* Seed of weight tensor `id` of layer l (l = -1: embedding/head/final norm). */
static uint64_t wseed(uint64_t seed, int l, int id)
{
	return seed * 1000003ull + (uint64_t)(l + 1) * 64ull + (uint64_t)id;
}

static int fill_or_load_mat(struct cu_stage *s, kn_bf16 *dst, int64_t rows, int64_t cols,
			    const char *fmt, int l, int rand, uint64_t seed, int id)
{
	if (rand) {
		/* U(-a, a) with a = 1/sqrt(cols): unit-variance activations stay O(1). */
		float a = 1.0f / sqrtf((float)cols) * 1.7320508f;
		CK(kn_cuda_fill_bf16(dst, (size_t)rows * cols, wseed(seed, l, id), a, s->st));
		return 0;
	}
	const struct kn_tensor *t = need(s, fmt, l);
	return t ? upload_bf16(s, dst, t, rows, cols) : -EINVAL;
}

/*
 * Rows [r0, r0 + nr) x columns [c0, c0 + nc) of the R x C matrix a tensor
 * (or its random fill) holds, to @p dst (nr x nc): a tensor-parallel rank's
 * share (q, k, v, gate, up: rows; o, down: columns). The whole matrix when
 * the stage has no ranks.
 */
static int fill_or_load_part(struct cu_stage *s, kn_bf16 *dst, int64_t R, int64_t C, int64_t r0, int64_t nr,
			     int64_t c0, int64_t nc, const char *fmt, int l, int rand, uint64_t seed, int id)
{
	if (nr == R && nc == C)
		return fill_or_load_mat(s, dst, R, C, fmt, l, rand, seed, id);
	if (rand) {
		/* the whole matrix's fill, then the share: the same weights as one rank */
		kn_bf16 *tmp = NULL;
		int rc = cu_dalloc(s, (void **)&tmp, (size_t)R * C * 2, "weight share staging");
		if (rc || (rc = fill_or_load_mat(s, tmp, R, C, fmt, l, rand, seed, id))) {
			cu_dfree(s, tmp);
			return rc;
		}
		cudaError_t e = cudaMemcpy2DAsync(dst, (size_t)nc * 2, tmp + (size_t)r0 * C + c0, (size_t)C * 2,
						  (size_t)nc * 2, (size_t)nr, cudaMemcpyDeviceToDevice, s->st);
		if (e == cudaSuccess)
			e = cudaStreamSynchronize(s->st);
		cu_dfree(s, tmp);
		if (e != cudaSuccess) {
			cu_seterr(s, "cudaMemcpy2D(weight share, layer %d) failed: %s", l, cudaGetErrorString(e));
			return -EIO;
		}
		return 0;
	}
	const struct kn_tensor *t = need(s, fmt, l);
	if (!t)
		return -EINVAL;
	size_t have = 1;
	for (int i = 0; i < t->n_dims; i++)
		have *= (size_t)t->shape[i];
	if (have != (size_t)R * C) {
		cu_seterr(s, "tensor %s has %zu elements, the config implies %lld x %lld", t->name, have, (long long)R,
			  (long long)C);
		return -EINVAL;
	}
	if (t->dtype == KN_DT_BF16) {
		CK(cudaMemcpy2D(dst, (size_t)nc * 2, (const uint16_t *)t->data + (size_t)r0 * C + c0, (size_t)C * 2,
				(size_t)nc * 2, (size_t)nr, cudaMemcpyHostToDevice));
		return 0;
	}
	uint16_t *row = (uint16_t *)malloc((size_t)nc * 2);
	if (!row) {
		cu_seterr(s, "malloc(%lld) for weight conversion failed", (long long)nc * 2);
		return -ENOMEM;
	}
	for (int64_t r = 0; r < nr; r++) {
		const size_t at = (size_t)(r0 + r) * C + c0;
		for (int64_t i = 0; i < nc; i++)
			row[i] = kn_f32_to_bf16(t->dtype == KN_DT_F32 ? ((const float *)t->data)[at + i]
								   : kn_f16_to_f32(((const uint16_t *)t->data)[at + i]));
		cudaError_t e = cudaMemcpy(dst + (size_t)r * nc, row, (size_t)nc * 2, cudaMemcpyHostToDevice);
		if (e != cudaSuccess) {
			free(row);
			cu_seterr(s, "cudaMemcpy(%s) failed: %s", t->name, cudaGetErrorString(e));
			return -EIO;
		}
	}
	free(row);
	return 0;
}

static int fill_or_load_vec(struct cu_stage *s, float *dst, int64_t n, const char *fmt, int l,
			    int rand, uint64_t seed, int id, float base, float scale)
{
	if (rand) {
		CK(kn_cuda_fill_f32(dst, (size_t)n, wseed(seed, l, id), base, scale, s->st));
		return 0;
	}
	const struct kn_tensor *t = need(s, fmt, l);
	return t ? upload_f32(s, dst, t, n) : -EINVAL;
}

/* Elements [e0, e0 + ne) of an N-element bias (or its random fill): a rank's share. */
static int fill_or_load_vec_part(struct cu_stage *s, float *dst, int64_t N, int64_t e0, int64_t ne, const char *fmt,
				 int l, int rand, uint64_t seed, int id)
{
	float *tmp = NULL;
	int rc;

	if (ne == N)
		return fill_or_load_vec(s, dst, N, fmt, l, rand, seed, id, 0.f, 0.1f);
	if ((rc = cu_dalloc(s, (void **)&tmp, (size_t)N * 4, "bias share staging")) ||
	    (rc = fill_or_load_vec(s, tmp, N, fmt, l, rand, seed, id, 0.f, 0.1f))) {
		cu_dfree(s, tmp);
		return rc;
	}
	cudaError_t e = cudaMemcpyAsync(dst, tmp + e0, (size_t)ne * 4, cudaMemcpyDeviceToDevice, s->st);
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(s->st);
	cu_dfree(s, tmp);
	if (e != cudaSuccess) {
		cu_seterr(s, "cudaMemcpy(bias share, layer %d) failed: %s", l, cudaGetErrorString(e));
		return -EIO;
	}
	return 0;
}

int cu_load_weights(struct cu_stage *s, int rand, uint64_t seed)
{
	const struct kn_model_config *c = s->base.cfg;
	const int H = s->hidden, I = s->inter;
	int rc;
	s->L = (struct layer_w *)calloc((size_t)s->nl, sizeof(*s->L));
	if (!s->L) {
		cu_seterr(s, "calloc(%d layers) failed", s->nl);
		return -ENOMEM;
	}
	for (int i = 0; i < s->nl; i++) {
		const int l = s->base.opts.layer_start + i;
		struct layer_w *w = &s->L[i];
		const size_t qkv_e = (size_t)s->qkv_dim * H, o_e = (size_t)H * s->q_dim;
		const size_t gu_e = (size_t)2 * I * H, d_e = (size_t)H * I;
		if ((rc = cu_dalloc(s, (void **)&w->wqkv, qkv_e * 2, "wqkv")) ||
		    (rc = cu_dalloc(s, (void **)&w->wo, o_e * 2, "wo")) ||
		    (rc = cu_dalloc(s, (void **)&w->wgu, gu_e * 2, "wgate_up")) ||
		    (rc = cu_dalloc(s, (void **)&w->wd, d_e * 2, "wdown")) ||
		    (rc = cu_dalloc(s, (void **)&w->ln1, H * 4, "ln1")) ||
		    (rc = cu_dalloc(s, (void **)&w->ln2, H * 4, "ln2")))
			return rc;
		s->weight_bytes += (qkv_e + o_e + gu_e + d_e) * 2 + 2 * H * 4;
		/* a rank's share (tp.cu): its heads' rows of q, k, v and columns of
		 * o, its MLP columns' rows of gate and up and columns of down */
		const int T = s->tp, r = s->rank, Q = s->q_dim, K = s->kv_dim;
		if ((rc = fill_or_load_part(s, w->wqkv, (int64_t)Q * T, H, (int64_t)Q * r, Q, 0, H, "model.layers.%d.self_attn.q_proj.weight", l, rand, seed, 0)) ||
		    (rc = fill_or_load_part(s, w->wqkv + (size_t)Q * H, (int64_t)K * T, H, (int64_t)K * r, K, 0, H, "model.layers.%d.self_attn.k_proj.weight", l, rand, seed, 1)) ||
		    (rc = fill_or_load_part(s, w->wqkv + (size_t)(Q + K) * H, (int64_t)K * T, H, (int64_t)K * r, K, 0, H, "model.layers.%d.self_attn.v_proj.weight", l, rand, seed, 2)) ||
		    (rc = fill_or_load_part(s, w->wo, H, (int64_t)Q * T, 0, H, (int64_t)Q * r, Q, "model.layers.%d.self_attn.o_proj.weight", l, rand, seed, 3)) ||
		    (rc = fill_or_load_part(s, w->wgu, (int64_t)I * T, H, (int64_t)I * r, I, 0, H, "model.layers.%d.mlp.gate_proj.weight", l, rand, seed, 4)) ||
		    (rc = fill_or_load_part(s, w->wgu + (size_t)I * H, (int64_t)I * T, H, (int64_t)I * r, I, 0, H, "model.layers.%d.mlp.up_proj.weight", l, rand, seed, 5)) ||
		    (rc = fill_or_load_part(s, w->wd, H, (int64_t)I * T, 0, H, (int64_t)I * r, I, "model.layers.%d.mlp.down_proj.weight", l, rand, seed, 6)) ||
		    (rc = fill_or_load_vec(s, w->ln1, H, "model.layers.%d.input_layernorm.weight", l, rand, seed, 7, 1.f, 0.1f)) ||
		    (rc = fill_or_load_vec(s, w->ln2, H, "model.layers.%d.post_attention_layernorm.weight", l, rand, seed, 8, 1.f, 0.1f)))
			return rc;
		if (c->qkv_bias) {
			if ((rc = cu_dalloc(s, (void **)&w->bqkv, (size_t)s->qkv_dim * 4, "bqkv")) ||
			    (rc = fill_or_load_vec_part(s, w->bqkv, (int64_t)Q * T, (int64_t)Q * r, Q, "model.layers.%d.self_attn.q_proj.bias", l, rand, seed, 9)) ||
			    (rc = fill_or_load_vec_part(s, w->bqkv + Q, (int64_t)K * T, (int64_t)K * r, K, "model.layers.%d.self_attn.k_proj.bias", l, rand, seed, 10)) ||
			    (rc = fill_or_load_vec_part(s, w->bqkv + Q + K, (int64_t)K * T, (int64_t)K * r, K, "model.layers.%d.self_attn.v_proj.bias", l, rand, seed, 11)))
				return rc;
			s->weight_bytes += (size_t)s->qkv_dim * 4;
		}
		if (c->qk_norm) {
			if ((rc = cu_dalloc(s, (void **)&w->qn, (size_t)s->hd * 4, "q_norm")) ||
			    (rc = cu_dalloc(s, (void **)&w->kn, (size_t)s->hd * 4, "k_norm")) ||
			    (rc = fill_or_load_vec(s, w->qn, s->hd, "model.layers.%d.self_attn.q_norm.weight", l, rand, seed, 12, 1.f, 0.1f)) ||
			    (rc = fill_or_load_vec(s, w->kn, s->hd, "model.layers.%d.self_attn.k_norm.weight", l, rand, seed, 13, 1.f, 0.1f)))
				return rc;
			s->weight_bytes += (size_t)s->hd * 8;
		}
	}
	const size_t emb_e = (size_t)s->vocab * H;
	if (s->base.first) {
		if ((rc = cu_dalloc(s, (void **)&s->embed, emb_e * 2, "embed_tokens")))
			return rc;
		s->weight_bytes += emb_e * 2;
		if (rand) {
			CK(kn_cuda_fill_bf16(s->embed, emb_e, wseed(seed, -1, 0), 1.0f, s->st));
		} else {
			const struct kn_tensor *t = need(s, "model.embed_tokens.weight%.0d", 0);
			if (!t || (rc = upload_bf16(s, s->embed, t, s->vocab, H)))
				return t ? rc : -EINVAL;
		}
	}
	if (s->base.last) {
		if ((rc = cu_dalloc(s, (void **)&s->fnorm, H * 4, "norm")) ||
		    (rc = fill_or_load_vec(s, s->fnorm, H, "model.norm.weight%.0d", 0, rand, seed, 1, 1.f, 0.1f)))
			return rc;
		s->weight_bytes += H * 4;
		if (c->tie_embeddings && s->base.first) {
			s->lm_head = s->embed;
		} else {
			if ((rc = cu_dalloc(s, (void **)&s->lm_head, emb_e * 2, "lm_head")))
				return rc;
			s->weight_bytes += emb_e * 2;
			const char *nm = c->tie_embeddings ? "model.embed_tokens.weight%.0d" : "lm_head.weight%.0d";
			if (rand && c->tie_embeddings)
				CK(kn_cuda_fill_bf16(s->lm_head, emb_e, wseed(seed, -1, 0), 1.0f, s->st));
			else if ((rc = fill_or_load_mat(s, s->lm_head, s->vocab, H, nm, 0, rand, seed, 2)))
				return rc;
		}
	}
	CK(cudaStreamSynchronize(s->st));
	return 0;
}

/* ---- pool, workspace ---- */

int cu_alloc_pool(struct cu_stage *s, int32_t n_blocks)
{
	s->kv_bytes = (size_t)n_blocks * s->blk_bytes;
	int rc = cu_dalloc(s, (void **)&s->kv, s->kv_bytes, "KV pool");
	if (rc)
		s->kv_bytes = 0;
	return rc;
}

int cu_alloc_workspace(struct cu_stage *s)
{
	const size_t W = (size_t)s->wmax, H = (size_t)s->hidden;
	const size_t xin = H > (size_t)s->q_dim ? (H > (size_t)s->inter ? H : (size_t)s->inter)
						  : ((size_t)s->q_dim > (size_t)s->inter ? (size_t)s->q_dim : (size_t)s->inter);
	int rc;
	/* partials for the widest plan, by the split each plan width uses */
	size_t aws = kn_cuda_attn_workspace(s->wmax, s->nh, s->nkv, s->hd, s->max_ctx, 0);
	if (s->attn_tile != 1)
		for (int i = 0; i < s->n_plans; i++) {
			const int pw = s->plans[i].width;
			const size_t b = kn_cuda_attn_workspace(pw, s->nh, s->nkv, s->hd, s->max_ctx,
								cu_attn_split(s, pw));
			aws = b > aws ? b : aws;
		}
	struct {
		void **p;
		size_t b;
		const char *what;
	} a[] = {
		{ (void **)&s->resid, W * H * 4, "residual" },
		{ (void **)&s->delta, W * H * 4, "delta" },
		{ (void **)&s->qkv, W * s->qkv_dim * 4, "qkv" },
		{ (void **)&s->gu, W * 2 * s->inter * 4, "gate_up" },
		{ (void **)&s->x, W * H * 4, "normed" },
		{ (void **)&s->att, W * s->q_dim * 4, "attention out" },
		{ (void **)&s->act, W * s->inter * 4, "swiglu out" },
		{ (void **)&s->xb, W > KN_CU_GEMV_MAX_N || s->linear_wg ? 2 * W * xin * 2 : 16, "bf16 linear input" },
		{ (void **)&s->attn_ws, aws, "attention partials" },
		{ (void **)&s->attn_cnt, (size_t)kn_cuda_attn_counters(W, s->nh, s->nkv) * sizeof(unsigned),
		  "attention split counters" },
		{ (void **)&s->d_in, (W + 1) * sizeof(struct kn_column), "columns" },
		{ (void **)&s->d_out, W * (2 + 2 * KN_CU_MAX_TOP) * 4, "sampler outputs" },
		{ (void **)&s->d_table, (size_t)s->base.opts.n_slots * s->base.opts.max_blocks_per_slot * 4, "block table" },
		{ &s->blas_ws, BLAS_WS_BYTES, "cuBLAS workspace" },
	};
	for (size_t i = 0; i < sizeof(a) / sizeof(a[0]); i++) {
		if ((rc = cu_dalloc(s, a[i].p, a[i].b, a[i].what)))
			return rc;
		s->ws_bytes += a[i].b;
	}
	/* the attention column kernel's split counters start at zero; every
	 * launch leaves them so */
	CK(cudaMemset(s->attn_cnt, 0, (size_t)kn_cuda_attn_counters(W, s->nh, s->nkv) * sizeof(unsigned)));
	if (s->wide_mma && W > KN_CU_GEMV_MAX_N) {
		s->mma_part_floats = kn_cuda_gemm_mma_parts();
		if ((rc = cu_dalloc(s, (void **)&s->mma_part, s->mma_part_floats * 4, "one-family linear parts")))
			return rc;
		s->ws_bytes += s->mma_part_floats * 4;
	}
	if (s->linear_wg) {
		/* the most any plan's product run in segment parts needs */
		const int h = s->hidden;
		const int lin[][2] = { { h, s->qkv_dim }, { s->q_dim, h }, { h, 2 * s->inter }, { s->inter, h },
				       { h, s->base.last ? s->vocab : 1 } };
		for (int i = 0; i <= s->n_plans; i++) /* and the LM head on the packed rows */
			for (size_t j = 0; j < sizeof(lin) / sizeof(lin[0]); j++) {
				const int pw = i < s->n_plans ? s->plans[i].width : CU_LOGIT_K;
				const size_t f = kn_cuda_gemm_wg_part_floats(pw, lin[j][0], lin[j][1]);
				s->wg_part_floats = f > s->wg_part_floats ? f : s->wg_part_floats;
			}
		if (s->wg_part_floats &&
		    (rc = cu_dalloc(s, (void **)&s->wg_part, s->wg_part_floats * 4, "one-family linear segment sums")))
			return rc;
		s->ws_bytes += s->wg_part_floats * 4;
	}
	if (s->base.last) {
		if ((rc = cu_dalloc(s, (void **)&s->logits, W * s->vocab * 4, "logits")))
			return rc;
		s->ws_bytes += W * s->vocab * 4;
		if (s->sample_pieces) {
			const size_t b = kn_cuda_sample_scratch_bytes((int)W);
			if ((rc = cu_dalloc(s, &s->sample_ws, b, "sampler pieces")))
				return rc;
			s->ws_bytes += b;
		}
		if (W > CU_LOGIT_K) {
			if ((rc = cu_dalloc(s, (void **)&s->x_k, (size_t)CU_LOGIT_K * H * 4, "packed LM head rows")) ||
			    (rc = cu_dalloc(s, (void **)&s->cols_k, CU_LOGIT_K * sizeof(struct kn_column),
					    "packed LM head columns")) ||
			    (rc = cu_dalloc(s, (void **)&s->out_col, CU_LOGIT_K * 4, "packed LM head indices")))
				return rc;
			s->ws_bytes += (size_t)CU_LOGIT_K * (H * 4 + sizeof(struct kn_column) + 4);
		}
	}
	CK(cudaMemset(s->d_table, 0xff, (size_t)s->base.opts.n_slots * s->base.opts.max_blocks_per_slot * 4));
	CK(cudaDeviceSynchronize()); /* legacy-stream memsets before the step stream's work (cu_dalloc) */
	s->d_cols = s->d_in + 1;
	for (int i = 0; i < KN_STEP_DEPTH; i++) {
		struct cu_slot *sl = &s->ring[i];
		CK(cudaHostAlloc((void **)&sl->h_in, (W + 1) * sizeof(struct kn_column), cudaHostAllocDefault));
		CK(cudaHostAlloc((void **)&sl->h_out, W * (2 + 2 * KN_CU_MAX_TOP) * 4, cudaHostAllocDefault));
		CK(cudaEventCreateWithFlags(&sl->ev, cudaEventDisableTiming));
	}
	CK(cudaHostAlloc((void **)&s->h_hidden, W * H * 4, cudaHostAllocDefault));
	CK(cudaHostAlloc((void **)&s->h_row, (size_t)s->vocab * 4, cudaHostAllocDefault));
	s->scratch = malloc((size_t)s->vocab * 8 + 64);
	if (!s->scratch) {
		cu_seterr(s, "malloc(sampling scratch) failed");
		return -ENOMEM;
	}
	return 0;
}
