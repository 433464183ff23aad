/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA engine benchmarks, each beside the ceiling measured in the same run:
 *  - device copy bandwidth (read + write) and cuBLAS bf16 peak (8192^3);
 *  - paged attention alone at 4k and 32k context vs copy bandwidth;
 *  - decode step time at batch 1..256, Llama-3 1B and 8B shapes with random
 *    weights, context 512 and 4096: tokens/s vs the HBM roofline (weight +
 *    K/V bytes a step must read / copy bandwidth);
 *  - prefill of one 2048-token prompt vs the cuBLAS peak.
 * Prints "RESULT key=value ..." lines (scripts/gpu-check tabulates them).
 * usage: bench_cuda [--quick | --narrow | --wide | --attention | --attn-probes | --one ... | --prefill MODEL |
 *                   --serve ... | --kv-pieces]
 *   --quick: 1B shape and 512 context only; --narrow: decode at batch 1, 8
 *   and 16 (the skinny-kernel plans), context 512, both shapes: run it with
 *   KVFERRY_CUDA_GEMV=ffma|mma to compare the two skinny kernels; --wide:
 *   8B decode at batch 64 and 256 (context 512) and both prefills, to price
 *   KVFERRY_CUDA_WIDE_X=split; --attention: the attention probes, then 8B
 *   decode at context 4096, batch 1 and 32 (for attention kernel variants);
 *   --attn-probes: the attention probes alone, back to back only
 *   (KVFERRY_BENCH_PROBE=4096x1:column picks one, for ncu);
 *   --one MODEL CTX BATCH: that decode step alone, no probes (for a profiler:
 *   ncu --graph-profiling node sees only the engine's kernels); BATCH may
 *   be rising batches B1,B2,... run on one stage;
 *   --serve MODEL CLIENTS PROMPT OUT REQUESTS: the served workload run by the
 *   engine itself with an ideal host (no HTTP, rings or scheduler): CLIENTS
 *   closed-loop sequences, REQUESTS in all, each PROMPT positions of prefill
 *   then OUT tokens; every step carries each decoding sequence's column and
 *   prompt positions up to 512 columns, so the step widths match the served
 *   path's (plans 1..512, mb_k 512). Prints completion tokens/s;
 *   --kv-pieces: a KV page message imported whole, reassembled, and in
 *   pieces by the gather kernel and by a DMA each (bench_kv_pieces());
 *   --prefill MODEL: that model's 2,048-token prefill alone (BENCH_ITERS
 *   steps timed, default 5; a profiler takes BENCH_ITERS=1);
 *   --gemm [N,N...]: each linear layer of both shapes at plan widths 1 to
 *   2048 (or those listed): the engine's default, cuBLAS with X split, and
 *   the two kernels whose bits do not depend on the plan width (bench_gemm());
 *   --tp MODEL CTX BATCH T: that decode step as one stage, then as T
 *   tensor-parallel ranks (threads, rank r on device r mod the devices:
 *   NCCL's all-reduce when each has its own, else summed on the host), and
 *   the ratio (bench_tp(); KVFERRY_CUDA_TP=nccl with T 1 prices a one-rank
 *   NCCL all-reduce in the graphs).
 * Exits 77 without a CUDA device.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kn_cuda.h"
#include "kn_model.h"
#include "kn_stage.h"
#include "kt_tp.h"

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static struct kn_model_config shape(const char *name)
{
	struct kn_model_config c;
	memset(&c, 0, sizeof(c));
	c.arch = KN_ARCH_LLAMA;
	c.vocab_size = 128256;
	c.n_kv_heads = 8;
	c.max_position = 131072;
	c.rms_eps = 1e-5f;
	c.rope_theta = 500000.f;
	c.rope_factor = 32.f;
	c.rope_low_freq_factor = 1.f;
	c.rope_high_freq_factor = 4.f;
	c.rope_orig_max_position = 8192;
	c.dtype = KN_DT_BF16;
	if (!strcmp(name, "llama3-8b")) {
		c.hidden_size = 4096;
		c.intermediate_size = 14336;
		c.n_layers = 32;
		c.n_heads = 32;
		c.head_dim = 128;
		c.rope_factor = 8.f;
	} else {
		c.hidden_size = 2048;
		c.intermediate_size = 8192;
		c.n_layers = 16;
		c.n_heads = 32;
		c.head_dim = 64;
		c.tie_embeddings = 1;
	}
	return c;
}

/* Matrix parameters read per step (the LM head once; embedding rows are negligible). */
static double matmul_params(const struct kn_model_config *c)
{
	double H = c->hidden_size, I = c->intermediate_size, q = (double)c->n_heads * c->head_dim,
	       kv = (double)c->n_kv_heads * c->head_dim;
	return c->n_layers * (H * (q + 2 * kv) + q * H + 3 * H * I) + (double)c->vocab_size * H;
}

/* Timed steps: BENCH_ITERS (fewer for a profiler taking every kernel), else @p dflt. */
static int bench_iters(int dflt)
{
	const char *it = getenv("BENCH_ITERS");
	return it != NULL && atoi(it) > 0 ? atoi(it) : dflt;
}

static int setup_slots(struct kn_stage *s, int n_slots, int bps)
{
	struct kn_op *ops = malloc((size_t)n_slots * bps * sizeof(*ops));
	if (!ops)
		return -ENOMEM;
	for (int j = 0; j < n_slots; j++)
		for (int b = 0; b < bps; b++)
			ops[(size_t)j * bps + b] = (struct kn_op){ KN_OP_SET_BLOCK, j, b, j * bps + b };
	int rc = kn_stage_apply_ops(s, ops, (size_t)n_slots * bps);
	free(ops);
	return rc;
}

/* A decode row whose batch's KV does not fit the card. */
static void decode_skipped(const char *name, int ctx, int b)
{
	printf("RESULT kind=decode model=%s ctx=%d batch=%d skipped=\"KV for %d x %d positions exceeds device memory\"\n",
	       name, ctx, b, b, ctx);
}

static void bench_decode(const char *name, int ctx, const int *batches, int nb, double copy_bw,
			 size_t budget)
{
	struct kn_model_config c = shape(name);
	const int bps = ctx / 16;
	const size_t blk = (size_t)c.n_layers * 2 * c.n_kv_heads * 16 * c.head_dim * 2;
	int maxb = batches[nb - 1];
	size_t want = (size_t)maxb * bps;
	if (want * blk > budget)
		want = budget / blk;
	int slots = (int)(want / (size_t)bps);
	if (slots < 1)
		return;
	struct kn_stage_opts o;
	kn_stage_opts_init(&o);
	o.n_slots = slots;
	o.max_blocks_per_slot = bps;
	/* BENCH_MAX_CTX: the stage's longest context (the served default is the
	 * model's, e.g. 131072) above the context its steps run at: what the
	 * kernels' grids, sized for the longest, cost a short one */
	const char *mc = getenv("BENCH_MAX_CTX");
	if (mc != NULL && atoi(mc) / 16 > bps)
		o.max_blocks_per_slot = atoi(mc) / 16;
	o.n_blocks = slots * bps;
	o.n_plans = nb;
	for (int i = 0; i < nb; i++)
		o.plan_widths[i] = batches[i];
	char err[512];
	struct kn_stage *s = kn_cuda_stage_create_random(&c, 42, &o, err, sizeof(err));
	/* the budget is an H200's: where the KV pool does not fit (an H100's
	 * 80 GB), fewer slots, down to the smallest batch; the rows above them
	 * say they were skipped */
	while (!s && slots > batches[0] && strstr(err, "out of memory") != NULL) {
		slots = slots * 3 / 4 > batches[0] ? slots * 3 / 4 : batches[0];
		o.n_slots = slots;
		o.n_blocks = slots * bps;
		s = kn_cuda_stage_create_random(&c, 42, &o, err, sizeof(err));
	}
	if (!s && strstr(err, "out of memory") != NULL) {
		/* not even the smallest batch's KV fits this card (the 8B's 128 x
		 * 4,096 positions, 69 GB, on an 80 GB H100): each row says so */
		for (int i = 0; i < nb; i++)
			decode_skipped(name, ctx, batches[i]);
		return;
	}
	if (!s) {
		printf("RESULT kind=decode model=%s ctx=%d error=\"%s\"\n", name, ctx, err);
		return;
	}
	struct kn_stage_info info;
	kn_stage_info(s, &info);
	if (setup_slots(s, slots, bps)) {
		printf("setup: %s\n", kn_stage_error(s));
		kn_stage_destroy(s);
		return;
	}
	struct kn_column *cols = calloc((size_t)maxb, sizeof(*cols));
	int32_t *tok = calloc((size_t)maxb, 4);
	for (int i = 0; i < nb; i++) {
		const int b = batches[i];
		if (b > slots) {
			decode_skipped(name, ctx, b);
			continue;
		}
		for (int j = 0; j < b; j++)
			cols[j] = (struct kn_column){ .token = j + 1, .pos = ctx - 1, .slot = j,
						      .flags = KN_COL_NEED_LOGIT, .top_p = 1 };
		struct kn_step st = { .n_cols = b, .cols = cols, .tokens_out = tok };
		int rc = 0;
		for (int w = 0; w < 3 && !rc; w++)
			rc = kn_stage_step(s, &st);
		const int iters = bench_iters(b <= 64 ? 30 : 10);
		double t0 = now();
		for (int k = 0; k < iters && !rc; k++)
			rc = kn_stage_step(s, &st);
		double dt = (now() - t0) / iters;
		if (rc) {
			printf("RESULT kind=decode model=%s ctx=%d batch=%d error=\"%s\"\n", name, ctx, b, kn_stage_error(s));
			continue;
		}
		double bytes = matmul_params(&c) * 2 + (double)b * ctx * blk / 16;
		double roof_t = bytes / copy_bw;
		printf("RESULT kind=decode model=%s ctx=%d batch=%d step_ms=%.3f tok_s=%.1f roof_tok_s=%.1f frac=%.3f bytes=%.3e\n",
		       name, ctx, b, dt * 1e3, b / dt, b / roof_t, roof_t / dt, bytes);
		fflush(stdout);
	}
	free(cols);
	free(tok);
	kn_stage_destroy(s);
}

/* ---- tensor-parallel ranks as threads (bench_tp) ---- */

struct tp_bench {
	struct kt_tp_group k;
	const char *name;
	int ctx, batch, ndev;
	double step_s;
	char transport[16], err[512];
};

struct tp_arg {
	struct kt_tp_rank k; /* first: the tp_arg */
	struct tp_bench *b;
};

/* One rank: a random-weight stage of the shape (its share), the decode step
 * at BATCH columns of context CTX, 3 warm-up steps then 30 timed (the ranks
 * step together: each sum waits for every rank). Rank 0 keeps the time. */
static void *tp_rank_run(void *arg)
{
	struct tp_arg *a = arg;
	struct tp_bench *b = a->b;
	struct kn_model_config c = shape(b->name);
	const int bps = b->ctx / 16;
	struct kn_stage_opts o;
	struct kn_stage *s;
	char err[512];

	kn_stage_opts_init(&o);
	o.n_slots = b->batch;
	o.max_blocks_per_slot = bps;
	o.n_blocks = b->batch * bps;
	o.n_plans = 1;
	o.plan_widths[0] = b->batch;
	o.device = a->k.rank % b->ndev;
	o.tp_size = b->k.T;
	o.tp_rank = a->k.rank;
	o.tp_reduce = b->k.T > 1 ? kt_tp_reduce : NULL;
	o.tp_share = kt_tp_share;
	o.tp_arg = a;
	a->k.sum_cap = (size_t)b->batch * (c.hidden_size + 64);
	a->k.sum = calloc(a->k.sum_cap, 4);
	s = kn_cuda_stage_create_random(&c, 42, &o, err, sizeof(err));
	if (s == NULL) {
		if (a->k.rank == 0)
			snprintf(b->err, sizeof(b->err), "%s", err);
		free(a->k.sum);
		return NULL;
	}
	struct kn_stage_info info;
	kn_stage_info(s, &info);
	struct kn_column *cols = calloc((size_t)b->batch, sizeof(*cols));
	int32_t *tok = calloc((size_t)b->batch, 4);
	int rc = setup_slots(s, b->batch, bps);
	for (int j = 0; j < b->batch; j++)
		cols[j] = (struct kn_column){ .token = j + 1, .pos = b->ctx - 1, .slot = j, .flags = KN_COL_NEED_LOGIT,
					      .top_p = 1 };
	struct kn_step st = { .n_cols = b->batch, .cols = cols, .tokens_out = tok };
	for (int w = 0; w < 3 && !rc; w++)
		rc = kn_stage_step(s, &st);
	double t0 = now();
	for (int k = 0; k < 30 && !rc; k++)
		rc = kn_stage_step(s, &st);
	if (a->k.rank == 0) {
		b->step_s = rc ? -1 : (now() - t0) / 30;
		snprintf(b->transport, sizeof(b->transport), "%s", info.tp_transport[0] ? info.tp_transport : "none");
		if (rc)
			snprintf(b->err, sizeof(b->err), "%s", kn_stage_error(s));
	}
	free(cols);
	free(tok);
	kn_stage_destroy(s);
	free(a->k.sum);
	return NULL;
}

static double tp_time(struct tp_bench *b, int T)
{
	pthread_t th[KT_TP_MAX];
	struct tp_arg a[KT_TP_MAX];

	b->k.T = T;
	b->step_s = -1;
	b->err[0] = 0;
	pthread_barrier_init(&b->k.bar, NULL, (unsigned)T);
	for (int r = 0; r < T; r++) {
		a[r] = (struct tp_arg){ .k = { .g = &b->k, .rank = r }, .b = b };
		pthread_create(&th[r], NULL, tp_rank_run, &a[r]);
	}
	for (int r = 0; r < T; r++)
		pthread_join(th[r], NULL);
	pthread_barrier_destroy(&b->k.bar);
	return b->step_s;
}

static void bench_tp(const char *name, int ctx, int batch, int T)
{
	struct tp_bench b = { .name = name, .ctx = ctx, .batch = batch, .ndev = kn_cuda_device_count() };
	double one, many;

	if (T < 1 || T > KT_TP_MAX || (T & (T - 1))) {
		printf("RESULT kind=tp model=%s error=\"T must be 1, 2, 4 or 8\"\n", name);
		return;
	}
	one = tp_time(&b, 1);
	printf("RESULT kind=tp model=%s ctx=%d batch=%d ranks=1 sum=%s step_ms=%.3f%s%s%s\n", name, ctx, batch, b.transport,
	       one * 1e3, b.err[0] ? " error=\"" : "", b.err, b.err[0] ? "\"" : "");
	if (T == 1 || one <= 0)
		return;
	many = tp_time(&b, T);
	printf("RESULT kind=tp model=%s ctx=%d batch=%d ranks=%d devices=%d sum=%s step_ms=%.3f ratio=%.3f%s%s%s\n", name,
	       ctx, batch, T, b.ndev < T ? b.ndev : T, b.transport, many * 1e3, many > 0 ? many / one : 0.0,
	       b.err[0] ? " error=\"" : "", b.err, b.err[0] ? "\"" : "");
}

/* One client's state in bench_serve: prompt positions sent, tokens produced. */
struct serve_seq {
	int prefilled, produced, token;
};

static void bench_serve(const char *name, int clients, int prompt, int out, int requests)
{
	static const int plans[] = { 1, 8, 16, 32, 64, 128, 256, 512 };
	const int width = 512;
	struct kn_model_config c = shape(name);
	const int bps = (prompt + out + 15) / 16;
	struct kn_stage_opts o;
	kn_stage_opts_init(&o);
	o.n_slots = clients;
	o.max_blocks_per_slot = bps;
	o.n_blocks = clients * bps;
	o.n_plans = 8;
	memcpy(o.plan_widths, plans, sizeof(plans));
	char err[512];
	struct kn_stage *s = kn_cuda_stage_create_random(&c, 42, &o, err, sizeof(err));
	if (!s) {
		printf("RESULT kind=serve model=%s clients=%d error=\"%s\"\n", name, clients, err);
		return;
	}
	struct kn_column *cols = calloc(width, sizeof(*cols));
	int32_t *tok = calloc(width, 4);
	float *lp = calloc(width, 4);
	int *owner = calloc(width, sizeof(int));
	struct serve_seq *q = calloc((size_t)clients, sizeof(*q));
	int rc = setup_slots(s, clients, bps);
	if (!cols || !tok || !lp || !owner || !q)
		rc = -ENOMEM;
	/* warm-up: capture every plan's graph before the clock starts */
	for (int i = 0; i < 8 && !rc; i++) {
		for (int j = 0; j < plans[i]; j++)
			cols[j] = (struct kn_column){ .token = 1, .pos = j % 16, .slot = j % clients,
						      .flags = KN_COL_NEED_LOGIT, .top_p = 1 };
		struct kn_step st = { .n_cols = plans[i], .cols = cols, .tokens_out = tok, .token_logprob_out = lp };
		rc = kn_stage_step(s, &st);
	}
	int started = 0, done = 0;
	long long produced = 0, steps = 0, ncols = 0;
	for (int j = 0; j < clients && started < requests; j++, started++)
		q[j] = (struct serve_seq){ 0, 0, 0 };
	const int active = started;
	double t0 = now();
	while (!rc && done < requests) {
		int n = 0;
		/* decodes first, one column each, then prompt positions in client order */
		for (int j = 0; j < active; j++)
			if (q[j].prefilled == prompt && q[j].produced < out) {
				owner[n] = j;
				cols[n++] = (struct kn_column){ .token = q[j].token, .pos = prompt + q[j].produced - 1,
								.slot = j, .flags = KN_COL_NEED_LOGIT, .top_p = 1 };
			}
		for (int j = 0; j < active && n < width; j++)
			while (q[j].prefilled < prompt && n < width) {
				const int p = q[j].prefilled++;
				owner[n] = p == prompt - 1 ? j : -1;
				cols[n++] = (struct kn_column){ .token = (p * 31 + j) % 1000, .pos = p, .slot = j,
								.flags = p == prompt - 1 ? KN_COL_NEED_LOGIT : 0,
								.top_p = 1 };
			}
		if (!n)
			break;
		struct kn_step st = { .n_cols = n, .cols = cols, .tokens_out = tok, .token_logprob_out = lp };
		rc = kn_stage_step(s, &st);
		steps++;
		ncols += n;
		for (int i = 0; i < n && !rc; i++) {
			const int j = owner[i];
			if (j < 0)
				continue;
			q[j].token = tok[i];
			produced++;
			if (++q[j].produced == out) {
				done++;
				/* the client sends its next request at once */
				q[j] = (struct serve_seq){ started < requests ? 0 : prompt, started < requests ? 0 : out, 0 };
				started += started < requests;
			}
		}
	}
	double dt = now() - t0;
	if (rc)
		printf("RESULT kind=serve model=%s clients=%d error=\"%s\"\n", name, clients,
		       rc == -ENOMEM ? "out of host memory" : kn_stage_error(s));
	else
		printf("RESULT kind=serve model=%s clients=%d prompt=%d out=%d requests=%d tok_s=%.1f steps=%lld cols_per_step=%.1f step_ms=%.3f\n",
		       name, clients, prompt, out, requests, produced / dt, steps, (double)ncols / steps,
		       dt * 1e3 / steps);
	fflush(stdout);
	free(cols);
	free(tok);
	free(lp);
	free(owner);
	free(q);
	kn_stage_destroy(s);
}

static void bench_prefill(const char *name, int len, double peak)
{
	struct kn_model_config c = shape(name);
	struct kn_stage_opts o;
	kn_stage_opts_init(&o);
	o.n_slots = 1;
	o.max_blocks_per_slot = len / 16;
	o.n_blocks = len / 16;
	o.n_plans = 1;
	o.plan_widths[0] = len;
	char err[512];
	struct kn_stage *s = kn_cuda_stage_create_random(&c, 42, &o, err, sizeof(err));
	if (!s) {
		printf("RESULT kind=prefill model=%s error=\"%s\"\n", name, err);
		return;
	}
	setup_slots(s, 1, len / 16);
	struct kn_column *cols = calloc((size_t)len, sizeof(*cols));
	int32_t *tok = calloc((size_t)len, 4);
	for (int j = 0; j < len; j++)
		cols[j] = (struct kn_column){ .token = (j * 31) % 1000, .pos = j, .slot = 0,
					      .flags = j == len - 1 ? KN_COL_NEED_LOGIT : 0, .top_p = 1 };
	struct kn_step st = { .n_cols = len, .cols = cols, .tokens_out = tok };
	int rc = kn_stage_step(s, &st) || kn_stage_step(s, &st);
	double best = 1e9;
	const int iters = bench_iters(5);
	for (int k = 0; k < iters && !rc; k++) {
		double t0 = now();
		rc = kn_stage_step(s, &st);
		double dt = now() - t0;
		best = dt < best ? dt : best;
	}
	if (rc) {
		printf("RESULT kind=prefill model=%s error=\"%s\"\n", name, kn_stage_error(s));
	} else {
		/* the work the prompt needs: every layer's products on every
		 * position, the LM head on the one that wants a token, attention
		 * QK and PV. (Until the LM head ran on the wanting rows alone it
		 * ran on every column, and this counted it there: frac was the
		 * rate of the work done, now it is that of the work needed.) */
		const double lm = (double)c.vocab_size * c.hidden_size;
		double fl = 2 * (matmul_params(&c) - lm) * len + 2 * lm +
			    4.0 * c.n_layers * c.n_heads * c.head_dim * ((double)len * (len + 1) / 2);
		printf("RESULT kind=prefill model=%s len=%d ms=%.2f tok_s=%.0f tflops=%.1f peak_tflops=%.1f frac=%.3f\n",
		       name, len, best * 1e3, len / best, fl / best / 1e12, peak / 1e12, fl / best / peak);
	}
	free(cols);
	free(tok);
	kn_stage_destroy(s);
}

/* A stage of the 1B shape's first 8 layers, a pool of 64 blocks; NULL on failure. */
static struct kn_stage *kv_stage(char *err, size_t errlen)
{
	struct kn_model_config c = shape("llama3-1b");
	struct kn_stage_opts o;

	c.n_layers = 8;
	c.tie_embeddings = 0;
	kn_stage_opts_init(&o);
	o.n_slots = 4;
	o.max_blocks_per_slot = 16;
	o.n_blocks = 64;
	o.n_plans = 1;
	o.plan_widths[0] = 1;
	return kn_cuda_stage_create_random(&c, 42, &o, err, errlen);
}

/*
 * --kv-pieces: a 2 MiB KV page message imported into a CUDA stage, as the
 * dataplane hands it over: (a) whole in one pinned buffer (the reference:
 * one DMA), (b) reassembled by one host copy from its frames, then (a) —
 * what a receiver that does not read in place pays — and in pieces where
 * the frames lie (one 8,878-byte payload per 10 KiB buffer, 250 bytes in,
 * as a received frame's): (c) by the gather kernel, (d) by one DMA per
 * piece. Prints each one's GB/s beside (a), and the same pages' export
 * into the pinned buffer (one 2-D DMA per block and K/V).
 */
static void bench_kv_pieces(void)
{
	enum { FRAME = 8878, STRIDE = 10240, AT = 250, N = 8, REPS = 50 };
	char err[512];
	struct kn_kv_format f;
	struct kn_stage *g = kv_stage(err, sizeof(err)), *d;
	const int32_t blocks[N] = { 3, 9, 12, 40, 41, 42, 7, 63 };

	setenv("KVFERRY_CUDA_KV_GATHER", "0", 1);
	d = kv_stage(err, sizeof(err));
	unsetenv("KVFERRY_CUDA_KV_GATHER");
	if (g == NULL || d == NULL) {
		printf("RESULT kind=kv_pieces error=\"%s\"\n", err);
		kn_stage_destroy(g);
		kn_stage_destroy(d);
		return;
	}
	kn_stage_kv_format(g, &f);
	const size_t len = (size_t)N * f.block_bytes, nf = (len + FRAME - 1) / FRAME;
	char *whole = malloc(len), *frames = malloc(nf * STRIDE);
	struct kn_seg *seg = calloc(nf, sizeof(*seg));
	double t[5] = { 0 };

	for (size_t i = 0; i < len; i++)
		whole[i] = (char)(i * 2654435761u >> 24);
	for (size_t k = 0; k < nf; k++) {
		size_t q = len - k * FRAME < FRAME ? len - k * FRAME : FRAME;
		memcpy(frames + k * STRIDE + AT, whole + k * FRAME, q);
		seg[k] = (struct kn_seg){ frames + k * STRIDE + AT, q };
	}
	if (kn_cuda_host_register(whole, len, err, sizeof(err)) || kn_cuda_host_register(frames, nf * STRIDE, err, sizeof(err))) {
		printf("RESULT kind=kv_pieces error=\"%s\"\n", err);
		goto out;
	}
	for (int r = 0; r <= REPS; r++) {
		double t0 = now();
		int rc = kn_stage_kv_import(g, blocks, N, whole, len, &f);
		double t1 = now();
		for (size_t k = 0; k < nf; k++)
			memcpy(whole + k * FRAME, seg[k].p, seg[k].len);
		rc |= kn_stage_kv_import(g, blocks, N, whole, len, &f);
		double t2 = now();
		rc |= kn_stage_kv_import_segs(g, blocks, N, seg, (int32_t)nf, 0, len, &f);
		double t3 = now();
		rc |= kn_stage_kv_import_segs(d, blocks, N, seg, (int32_t)nf, 0, len, &f);
		double t4 = now();
		rc |= kn_stage_kv_export(g, blocks, N, whole, len);
		double t5 = now();
		if (rc) {
			printf("RESULT kind=kv_pieces error=\"%s / %s\"\n", kn_stage_error(g), kn_stage_error(d));
			goto unpin;
		}
		if (r > 0) { /* the first round warms up */
			t[0] += t1 - t0;
			t[1] += t2 - t1;
			t[2] += t3 - t2;
			t[3] += t4 - t3;
			t[4] += t5 - t4;
		}
	}
	printf("RESULT kind=kv_pieces bytes=%zu pieces=%zu whole_gb_s=%.2f reassembled_gb_s=%.2f gather_gb_s=%.2f "
	       "dma_each_gb_s=%.2f gather_vs_whole=%.2f export_gb_s=%.2f\n", len, nf,
	       len * REPS / t[0] / 1e9, len * REPS / t[1] / 1e9, len * REPS / t[2] / 1e9, len * REPS / t[3] / 1e9,
	       t[0] / t[2], len * REPS / t[4] / 1e9);
unpin:
	kn_cuda_host_unregister(whole);
	kn_cuda_host_unregister(frames);
out:
	free(whole);
	free(frames);
	free(seg);
	kn_stage_destroy(g);
	kn_stage_destroy(d);
}

/*
 * --gemm: the linear layers of the 1B and 8B shapes at plan widths 1 to
 * 2048, timed four ways in one run: the engine's default (the skinny
 * kernels up to 16 columns, above them cuBLAS with X rounded to bf16),
 * cuBLAS with X split into hi + lo (the f32-grade one), kn_cuda_gemm_mma
 * (f32-grade, a column's bits the same at every width) and kn_cuda_gemm_wg
 * (X rounded, a column's bits the same at every width). Prints
 * microseconds, the warpgroup kernel's TFLOP/s and its weight stream in
 * TB/s, and its time over the default's. KVFERRY_BENCH_LAYER=NAME times
 * that layer alone (a profiler's run).
 */
static void bench_gemm(const char *widths)
{
	static const struct { const char *name; int in, out; } L[] = {
		{ "1b.qkv", 2048, 3072 }, { "1b.o", 2048, 2048 }, { "1b.gate_up", 2048, 16384 }, { "1b.down", 8192, 2048 },
		{ "8b.qkv", 4096, 6144 }, { "8b.o", 4096, 4096 }, { "8b.gate_up", 4096, 28672 }, { "8b.down", 14336, 4096 },
		{ "1b.lm_head", 2048, 128256 },
	};
	static const char *kinds[] = { "default", "cublas_split", "mma_one_family", "wg_one_family" };
	int ns[16] = { 1, 8, 16, 32, 64, 128, 256, 2048 };
	size_t nn = 8;
	char err[512];

	if (widths) { /* --gemm 64,2048: those plan widths only */
		nn = 0;
		for (const char *p = widths; *p && nn < 16; p += strcspn(p, ","), p += *p == ',')
			if (atoi(p) > 0)
				ns[nn++] = atoi(p);
	}
	const char *only = getenv("KVFERRY_BENCH_LAYER"); /* e.g. 8b.gate_up: that layer alone (for a profiler) */
	for (size_t i = 0; i < sizeof(L) / sizeof(L[0]); i++)
		for (size_t j = 0; j < nn && (!only || !strcmp(only, L[i].name)); j++) {
			double sec[4] = { 0 };
			int ok = 1;

			for (int k = 0; k < 4 && ok; k++)
				if ((k != 1 && k != 2) || ns[j] >= 64)
					if (kn_cuda_probe_linear(0, ns[j], L[i].in, L[i].out, k, 20, &sec[k], err, sizeof(err))) {
						printf("RESULT kind=gemm layer=%s n=%d way=%s error=\"%s\"\n", L[i].name, ns[j],
						       kinds[k], err);
						ok = 0;
					}
			if (!ok)
				continue;
			const double fl = 2.0 * ns[j] * L[i].in * (double)L[i].out, wb = 2.0 * L[i].in * (double)L[i].out;
			printf("RESULT kind=gemm layer=%s n=%d default_us=%.1f split_us=%.1f mma_us=%.1f wg_us=%.1f "
			       "wg_tflops=%.1f wg_w_tb_s=%.2f default_w_tb_s=%.2f wg_vs_default=%.2f\n", L[i].name, ns[j],
			       sec[0] * 1e6, sec[1] * 1e6, sec[2] * 1e6, sec[3] * 1e6, fl / sec[3] / 1e12, wb / sec[3] / 1e12,
			       wb / sec[0] / 1e12, sec[3] / sec[0]);
			fflush(stdout);
		}
}

/* KVFERRY_BENCH_PROBE="CTXxCOLS[:tile|column]" runs that attention probe
 * alone (for a profiler). */
static int probe_wanted(int ctx, int ncol, const char *kernel)
{
	const char *f = getenv("KVFERRY_BENCH_PROBE");
	char want[64];
	if (!f || !*f)
		return 1;
	snprintf(want, sizeof(want), "%dx%d", ctx, ncol);
	const size_t n = strlen(want);
	if (strncmp(f, want, n) || (f[n] && f[n] != ':'))
		return 0;
	return !f[n] || !strcmp(f + n + 1, kernel);
}

int main(int argc, char **argv)
{
	int quick = argc > 1 && !strcmp(argv[1], "--quick");
	int narrow = argc > 1 && !strcmp(argv[1], "--narrow");
	int wide = argc > 1 && !strcmp(argv[1], "--wide");
	int attn_only = argc > 1 && !strcmp(argv[1], "--attention");
	/* --attn-probes: the attention probes alone, back to back (no decode) */
	int probes_only = argc > 1 && !strcmp(argv[1], "--attn-probes");
	char err[512];
	double bw = 0, peak = 0;
	if (argc == 5 && !strcmp(argv[1], "--one")) {
		/* BATCH, or rising batches B1,B2,... on one stage */
		int b[16], nb = 0;
		for (const char *p = argv[4]; *p && nb < 16; p = strchr(p, ',') ? strchr(p, ',') + 1 : "")
			if (atoi(p) > 0 && (nb == 0 || atoi(p) > b[nb - 1]))
				b[nb++] = atoi(p);
		if (nb == 0) {
			fprintf(stderr, "bench_cuda --one: BATCH must be a positive number or rising numbers B1,B2,...\n");
			return 2;
		}
		if (kn_cuda_device_count() < 1)
			return 77;
		/* copy bandwidth unmeasured: the fraction printed assumes 4.2 TB/s */
		bench_decode(argv[2], atoi(argv[3]), b, nb, 4.2e12, (size_t)96 << 30);
		return 0;
	}
	if (argc == 3 && !strcmp(argv[1], "--prefill")) {
		/* one model's 2,048-token prefill against a peak probed here (for a
		 * profiler: BENCH_ITERS=1 times one step after the two warm ones) */
		if (kn_cuda_device_count() < 1)
			return 77;
		if (kn_cuda_probe_gemm(0, 8192, 8192, 8192, 10, &peak, err, sizeof(err)) != 0)
			peak = 0;
		bench_prefill(argv[2], 2048, peak);
		return 0;
	}
	if ((argc == 2 || argc == 3) && !strcmp(argv[1], "--gemm")) {
		if (kn_cuda_device_count() < 1)
			return 77;
		bench_gemm(argc == 3 ? argv[2] : NULL);
		return 0;
	}
	if (argc == 2 && !strcmp(argv[1], "--kv-pieces")) {
		if (kn_cuda_device_count() < 1)
			return 77;
		bench_kv_pieces();
		return 0;
	}
	if (argc == 6 && !strcmp(argv[1], "--tp")) {
		if (kn_cuda_device_count() < 1)
			return 77;
		bench_tp(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
		return 0;
	}
	if (argc == 7 && !strcmp(argv[1], "--serve")) {
		if (kn_cuda_device_count() < 1)
			return 77;
		bench_serve(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]));
		return 0;
	}
	if (kn_cuda_probe_copy_bw(0, (size_t)2 << 30, 20, &bw, err, sizeof(err))) {
		printf("no CUDA device or copy probe failed: %s\n", err);
		return 77;
	}
	printf("RESULT kind=ceiling copy_bw_tb_s=%.3f\n", bw / 1e12);
	if (!probes_only && kn_cuda_probe_gemm(0, 8192, 8192, 8192, 10, &peak, err, sizeof(err)) == 0)
		printf("RESULT kind=ceiling gemm_tflops=%.1f\n", peak / 1e12);
	int probe_wanted_any = 0;
	/* each probe with both kernels: tile (the default) and column */
	const int probes[][2] = { { 4096, 16 }, { 4096, 1 }, { 4096, 64 }, { 32768, 2 }, { 32768, 1 } };
	/* and each both ways: one launch timed alone (the host's launch gap in
	 * it), and launches back to back over K/V past L2 (as in a graph) */
	for (int i = 0; i < 5; i++)
		for (int tile = 1; tile >= 0; tile--)
			for (int b2b = probes_only; b2b <= 1; b2b++) {
				double abw, sec;
				const int ctx = probes[i][0], ncol = probes[i][1];
				const char *kn = tile ? "tile" : "column", *how = b2b ? "stream" : "alone";
				if (!probe_wanted(ctx, ncol, kn))
					continue;
				probe_wanted_any = 1;
				if (kn_cuda_probe_attention(0, ncol, ctx, 32, 8, 128, tile, b2b, 20, &abw, &sec, err,
							    sizeof(err)) == 0)
					printf("RESULT kind=attention kernel=%s timing=%s ctx=%d cols=%d us=%.1f tb_s=%.3f "
					       "frac=%.3f\n", kn, how, ctx, ncol, sec * 1e6, abw / 1e12, abw / bw);
				else
					printf("RESULT kind=attention kernel=%s timing=%s ctx=%d cols=%d error=\"%s\"\n",
					       kn, how, ctx, ncol, err);
			}
	fflush(stdout);
	if (!probe_wanted_any) {
		fprintf(stderr, "bench_cuda: KVFERRY_BENCH_PROBE=%s names no probe; use CTXxCOLS[:tile|column] with "
				"CTXxCOLS one of 4096x16 4096x1 4096x64 32768x2 32768x1\n", getenv("KVFERRY_BENCH_PROBE"));
		return 2;
	}
	if (probes_only)
		return 0;
	const int small[] = { 1, 8, 32, 64 }, large[] = { 128, 256 }, skinny[] = { 1, 8, 16 };
	const char *models[] = { "llama3-1b", "llama3-8b" };
	const size_t budget = (size_t)96 << 30;
	if (narrow) {
		for (int mi = 0; mi < 2; mi++)
			bench_decode(models[mi], 512, skinny, 3, bw, budget);
		return 0;
	}
	if (attn_only) {
		const int b1[] = { 1, 32 };
		bench_decode("llama3-8b", 4096, b1, 2, bw, budget);
		return 0;
	}
	if (wide) {
		bench_decode("llama3-8b", 512, large + 1, 1, bw, budget);
		const int b64[] = { 64 };
		bench_decode("llama3-8b", 512, b64, 1, bw, budget);
		for (int mi = 0; mi < 2; mi++)
			bench_prefill(models[mi], 2048, peak);
		return 0;
	}
	for (int mi = 0; mi < (quick ? 1 : 2); mi++)
		for (int ci = 0; ci < (quick ? 1 : 2); ci++) {
			int ctx = ci ? 4096 : 512;
			bench_decode(models[mi], ctx, small, 4, bw, budget);
			bench_decode(models[mi], ctx, large, 2, bw, budget);
		}
	for (int mi = 0; mi < (quick ? 1 : 2); mi++)
		bench_prefill(models[mi], 2048, peak);
	return 0;
}
