/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-generate: run a model in one process through the stage API, the
 * way the serving path does (paged KV, block ops, hidden rows handed from
 * stage to stage), and print the generated ids and text. --logits writes the
 * f32 logits of every prompt position, row-major [positions][vocab], for the
 * PyTorch reference comparison.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kn_model.h"
#include "kvf_config.h"
#include "kn_stage.h"
#include "kn_tok.h"

#define MAX_STAGES 16

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvferry-generate --model DIR (--prompt TEXT | --ids 1,2,3) [--max-tokens N] [--stages N]\n"
		"                        [--logits FILE] [--backend cpu|cuda] [--temperature T] [--top-k K]\n"
		"                        [--top-p P] [--seed S] [--threads N] [--chunk N] [--no-bos] [--ignore-eos]\n");
}

static int parse_ids(const char *s, int32_t **ids, size_t *n)
{
	size_t cap = 16;
	*n = 0;
	*ids = malloc(cap * sizeof(**ids));
	while (*ids && *s) {
		char *end;
		long v = strtol(s, &end, 10);
		if (end == s)
			return -EINVAL;
		if (*n == cap) {
			int32_t *p = realloc(*ids, (cap *= 2) * sizeof(**ids));
			if (!p)
				return -ENOMEM;
			*ids = p;
		}
		(*ids)[(*n)++] = (int32_t)v;
		s = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return -EINVAL;
	}
	return *ids ? 0 : -ENOMEM;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
	const char *model_dir = NULL, *prompt = NULL, *ids_arg = NULL, *logits_path = NULL;
	int max_tokens = 16, n_stages = 1, threads = 0, chunk = 64, add_bos = 1, ignore_eos = 0;
	enum kn_backend be = KN_BACKEND_CPU;
	struct kn_column tmpl = { .top_p = 1.0f };
	static const struct option lo[] = {
		{ "model", required_argument, 0, 'm' }, { "prompt", required_argument, 0, 'p' },
		{ "ids", required_argument, 0, 'i' }, { "max-tokens", required_argument, 0, 'n' },
		{ "stages", required_argument, 0, 'S' }, { "logits", required_argument, 0, 'L' },
		{ "backend", required_argument, 0, 'b' }, { "temperature", required_argument, 0, 'T' },
		{ "top-k", required_argument, 0, 'k' }, { "top-p", required_argument, 0, 'P' },
		{ "seed", required_argument, 0, 's' }, { "threads", required_argument, 0, 't' },
		{ "chunk", required_argument, 0, 'c' }, { "no-bos", no_argument, 0, 'B' },
		{ "ignore-eos", no_argument, 0, 'E' }, { "help", no_argument, 0, 'h' },
		{ "version", no_argument, 0, 'V' }, { 0, 0, 0, 0 }
	};
	int ch;
	while ((ch = getopt_long(argc, argv, "m:p:i:n:h", lo, NULL)) != -1) {
		switch (ch) {
		case 'm': model_dir = optarg; break;
		case 'p': prompt = optarg; break;
		case 'i': ids_arg = optarg; break;
		case 'n': max_tokens = atoi(optarg); break;
		case 'S': n_stages = atoi(optarg); break;
		case 'L': logits_path = optarg; break;
		case 'b':
			if (!strcmp(optarg, "cpu"))
				be = KN_BACKEND_CPU;
			else if (!strcmp(optarg, "cuda"))
				be = KN_BACKEND_CUDA;
			else {
				fprintf(stderr, "kvferry-generate: --backend %s: use cpu or cuda\n", optarg);
				return 2;
			}
			break;
		case 'T': tmpl.temperature = strtof(optarg, NULL); break;
		case 'k': tmpl.top_k = atoi(optarg); break;
		case 'P': tmpl.top_p = strtof(optarg, NULL); break;
		case 's': tmpl.seed = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 't': threads = atoi(optarg); break;
		case 'c': chunk = atoi(optarg); break;
		case 'B': add_bos = 0; break;
		case 'E': ignore_eos = 1; break;
		case 'h': usage(stdout); return 0;
		case 'V': printf("kvferry-generate %s\n", KVF_VERSION); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!model_dir || !!prompt == !!ids_arg || max_tokens < 0 || n_stages < 1 || n_stages > MAX_STAGES
	    || chunk < 1) {
		fprintf(stderr, "kvferry-generate: need --model and exactly one of --prompt/--ids; --stages 1..%d; --chunk >= 1\n",
			MAX_STAGES);
		usage(stderr);
		return 2;
	}

	char err[1024] = "";
	int rc = 1;
	struct kn_model *m = kn_model_open(model_dir, err, sizeof(err));
	struct kn_tok *tok = NULL;
	struct kn_stage *st[MAX_STAGES] = { 0 };
	int32_t *ids = NULL, *gen = NULL;
	size_t n_ids = 0, n_gen = 0;
	float *hid[2] = { 0 }, *logits = NULL;
	struct kn_column *cols = NULL;
	int32_t *toks = NULL;
	FILE *lf = NULL;
	if (!m) {
		fprintf(stderr, "kvferry-generate: %s\n", err);
		return 1;
	}
	const struct kn_model_config *c = kn_model_config(m);
	tok = kn_tok_open(model_dir, err, sizeof(err));
	if (prompt) {
		if (!tok) {
			fprintf(stderr, "kvferry-generate: --prompt needs the model's tokenizer: %s\n", err);
			goto out;
		}
		int e = kn_tok_encode(tok, prompt, strlen(prompt), add_bos ? KN_TOK_ADD_BOS : 0, &ids, &n_ids);
		if (e) {
			fprintf(stderr, "kvferry-generate: kn_tok_encode failed: %s\n", strerror(-e));
			goto out;
		}
	} else if (parse_ids(ids_arg, &ids, &n_ids)) {
		fprintf(stderr, "kvferry-generate: --ids %s: expected comma-separated integers\n", ids_arg);
		goto out;
	}
	if (n_ids == 0) {
		fprintf(stderr, "kvferry-generate: the prompt is empty\n");
		goto out;
	}
	if (n_stages > c->n_layers) {
		fprintf(stderr, "kvferry-generate: --stages %d exceeds the model's %d layers\n", n_stages, c->n_layers);
		goto out;
	}

	size_t total = n_ids + (size_t)max_tokens;
	int32_t nblk = (int32_t)((total + KN_PAGE_BLK - 1) / KN_PAGE_BLK);
	if (chunk > (int)n_ids)
		chunk = (int)n_ids;
	struct kn_op *ops = calloc((size_t)nblk, sizeof(*ops));
	hid[0] = calloc((size_t)chunk * (size_t)c->hidden_size, sizeof(float));
	hid[1] = calloc((size_t)chunk * (size_t)c->hidden_size, sizeof(float));
	logits = calloc((size_t)chunk * (size_t)c->vocab_size, sizeof(float));
	gen = calloc((size_t)max_tokens + 1, sizeof(*gen));
	cols = calloc((size_t)chunk, sizeof(*cols));
	toks = calloc((size_t)chunk, sizeof(*toks));
	if (!ops || !hid[0] || !hid[1] || !logits || !gen || !cols || !toks) {
		free(ops);
		fprintf(stderr, "kvferry-generate: out of memory\n");
		goto out;
	}
	for (int32_t b = 0; b < nblk; b++)
		ops[b] = (struct kn_op){ .type = KN_OP_SET_BLOCK, .slot = 0, .idx = b, .val = b };
	for (int s = 0; s < n_stages; s++) {
		struct kn_stage_opts o;
		kn_stage_opts_init(&o);
		o.layer_start = c->n_layers * s / n_stages;
		o.layer_end = c->n_layers * (s + 1) / n_stages;
		o.n_blocks = nblk;
		o.n_slots = 1;
		o.max_blocks_per_slot = nblk;
		o.n_plans = 1;
		o.plan_widths[0] = chunk;
		o.n_threads = threads;
		st[s] = kn_stage_create(m, be, &o, err, sizeof(err));
		if (!st[s]) {
			free(ops);
			fprintf(stderr, "kvferry-generate: stage %d: %s\n", s, err);
			goto out;
		}
		if (kn_stage_apply_ops(st[s], ops, (size_t)nblk)) {
			free(ops);
			fprintf(stderr, "kvferry-generate: stage %d: %s\n", s, kn_stage_error(st[s]));
			goto out;
		}
	}
	free(ops);
	if (logits_path && !(lf = fopen(logits_path, "wb"))) {
		fprintf(stderr, "kvferry-generate: fopen(%s) failed: %s\n", logits_path, strerror(errno));
		goto out;
	}

	int32_t pos = 0, next = -1;
	double t0 = now(), t_prefill = 0;
	/* One pass per chunk of the prompt, then one column per decoded token. */
	while (n_gen < (size_t)max_tokens || pos < (int32_t)n_ids) {
		int32_t n = 0;
		if (pos < (int32_t)n_ids) {
			for (; n < chunk && pos + n < (int32_t)n_ids; n++) {
				cols[n] = tmpl;
				cols[n].token = ids[pos + n];
				cols[n].pos = pos + n;
				cols[n].flags = (lf || pos + n == (int32_t)n_ids - 1) ? KN_COL_NEED_LOGIT : 0;
			}
		} else {
			cols[0] = tmpl;
			cols[0].token = next;
			cols[0].pos = pos;
			cols[0].flags = KN_COL_NEED_LOGIT;
			n = 1;
		}
		int prefill = pos < (int32_t)n_ids;
		for (int s = 0; s < n_stages; s++) {
			struct kn_step step = { .n_cols = n, .cols = cols, .hidden_in = hid[s & 1],
						.hidden_out = hid[(s + 1) & 1], .tokens_out = toks,
						.logits_out = (prefill && lf) ? logits : NULL };
			int e = kn_stage_step(st[s], &step);
			if (e) {
				fprintf(stderr, "kvferry-generate: stage %d step at position %d: %s\n", s, pos,
					kn_stage_error(st[s]));
				goto out;
			}
		}
		if (prefill && lf
		    && fwrite(logits, sizeof(float), (size_t)n * (size_t)c->vocab_size, lf) != (size_t)n * (size_t)c->vocab_size) {
			fprintf(stderr, "kvferry-generate: writing %s failed\n", logits_path);
			goto out;
		}
		pos += n;
		if (prefill && pos < (int32_t)n_ids)
			continue;
		if (prefill)
			t_prefill = now() - t0;
		next = toks[n - 1];
		if (max_tokens == 0)
			break;
		gen[n_gen++] = next;
		int stop = 0;
		for (int k = 0; k < c->n_eos && !ignore_eos; k++)
			stop |= next == c->eos_token_ids[k];
		if (stop || (size_t)pos >= total)
			break;
	}
	double t_all = now() - t0;
	printf("ids:");
	for (size_t i = 0; i < n_gen; i++)
		printf("%s%d", i ? "," : " ", gen[i]);
	printf("\n");
	if (tok) {
		char *text = NULL;
		if (!kn_tok_decode(tok, gen, n_gen, KN_TOK_SKIP_SPECIAL, &text, NULL))
			printf("text: %s\n", text);
		free(text);
	}
	fprintf(stderr, "prompt %zu tokens in %.3f s (%.1f tok/s); %zu generated in %.3f s (%.1f tok/s)\n", n_ids,
		t_prefill, t_prefill > 0 ? (double)n_ids / t_prefill : 0.0, n_gen, t_all - t_prefill,
		t_all > t_prefill ? (double)(n_gen > 0 ? n_gen - 1 : 0) / (t_all - t_prefill) : 0.0);
	rc = 0;
out:
	if (lf && fclose(lf) && !rc) {
		fprintf(stderr, "kvferry-generate: closing %s failed\n", logits_path);
		rc = 1;
	}
	for (int s = 0; s < n_stages; s++)
		kn_stage_destroy(st[s]);
	free(ids);
	free(gen);
	free(hid[0]);
	free(hid[1]);
	free(logits);
	free(cols);
	free(toks);
	kn_tok_close(tok);
	kn_model_close(m);
	return rc;
}
