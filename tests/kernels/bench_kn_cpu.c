/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CPU stage engine benchmark: prefill tokens/s (one prompt of P tokens in
 * chunks of 64) and decode tokens/s at batch 1, 8 and 32 (B sequences with a
 * P-token context each, D steps of B columns), plus resident memory against
 * the budget weights-as-stored + KV pool + 64 MiB.
 *
 *   bench_kn_cpu MODEL_DIR THREADS [P D]
 *
 * Prints one JSON object on stdout (bench_cpu.py reads it and puts PyTorch
 * beside it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kn_model.h"
#include "kn_stage.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long rss_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long v = -1;
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmRSS:", 6))
			v = strtol(line + 6, NULL, 10);
	if (f)
		fclose(f);
	return v;
}

static int step(struct kn_stage *s, struct kn_column *cols, int32_t n, int32_t *toks)
{
	struct kn_step st = { .n_cols = n, .cols = cols, .tokens_out = toks };
	int rc = kn_stage_step(s, &st);
	if (rc)
		fprintf(stderr, "bench_kn_cpu: step failed: %s\n", kn_stage_error(s));
	return rc;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: bench_kn_cpu MODEL_DIR THREADS [PROMPT DECODE_STEPS]\n");
		return 2;
	}
	int threads = atoi(argv[2]);
	int32_t P = argc > 3 ? atoi(argv[3]) : 128, D = argc > 4 ? atoi(argv[4]) : 16;
	char err[1024];
	struct kn_model *m = kn_model_open(argv[1], err, sizeof(err));
	if (!m) {
		fprintf(stderr, "bench_kn_cpu: %s\n", err);
		return 1;
	}
	const struct kn_model_config *c = kn_model_config(m);
	enum { BMAX = 32 };
	int32_t per_seq = (P + D + KN_PAGE_BLK - 1) / KN_PAGE_BLK;
	struct kn_stage_opts o;
	kn_stage_opts_init(&o);
	o.n_slots = BMAX;
	o.max_blocks_per_slot = per_seq;
	o.n_blocks = BMAX * per_seq;
	o.plan_widths[0] = 8;
	o.plan_widths[1] = 64;
	o.n_threads = threads;
	struct kn_stage *s = kn_stage_create(m, KN_BACKEND_CPU, &o, err, sizeof(err));
	if (!s) {
		fprintf(stderr, "bench_kn_cpu: %s\n", err);
		return 1;
	}
	for (int32_t q = 0; q < BMAX; q++)
		for (int32_t b = 0; b < per_seq; b++) {
			struct kn_op op = { KN_OP_SET_BLOCK, q, b, q * per_seq + b };
			kn_stage_apply_ops(s, &op, 1);
		}
	struct kn_column cols[64];
	int32_t toks[64], last[BMAX];
	double t_prefill = 0;
	/* Prefill every slot's prompt (slot 0 timed: one sequence's prefill). */
	for (int32_t q = 0; q < BMAX; q++) {
		double t0 = now();
		for (int32_t p0 = 0; p0 < P; p0 += 64) {
			int32_t n = P - p0 < 64 ? P - p0 : 64;
			for (int32_t j = 0; j < n; j++)
				cols[j] = (struct kn_column){ .token = (q * 31 + (p0 + j) * 7 + 1) % c->vocab_size,
							      .pos = p0 + j, .slot = q, .top_p = 1,
							      .flags = p0 + j == P - 1 ? KN_COL_NEED_LOGIT : 0 };
			if (step(s, cols, n, toks))
				return 1;
			last[q] = toks[n - 1];
		}
		if (q == 0)
			t_prefill = now() - t0;
	}
	printf("{\"model\": \"%s\", \"threads\": %d, \"prompt\": %d, \"decode_steps\": %d, \"prefill_tok_s\": %.2f",
	       argv[1], threads, P, D, (double)P / t_prefill);
	static const int32_t batches[] = { 1, 8, 32 };
	for (size_t bi = 0; bi < 3; bi++) {
		int32_t B = batches[bi];
		double t0 = now();
		for (int32_t d = 0; d < D; d++) {
			for (int32_t j = 0; j < B; j++)
				cols[j] = (struct kn_column){ .token = last[j], .pos = P + d, .slot = j, .top_p = 1,
							      .flags = KN_COL_NEED_LOGIT };
			if (step(s, cols, B, toks))
				return 1;
			for (int32_t j = 0; j < B; j++)
				last[j] = toks[j];
		}
		printf(", \"decode_b%d_tok_s\": %.2f", B, (double)(B * D) / (now() - t0));
	}
	struct kn_stage_info info;
	kn_stage_info(s, &info);
	long rss = rss_kib();
	printf(", \"weight_bytes\": %zu, \"kv_bytes\": %zu, \"workspace_bytes\": %zu, \"rss_bytes\": %ld, \"budget_bytes\": %zu}\n",
	       info.weight_bytes, info.kv_bytes, info.workspace_bytes, rss * 1024, info.weight_bytes + info.kv_bytes + ((size_t)64 << 20));
	kn_stage_destroy(s);
	kn_model_close(m);
	return 0;
}
