/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers for the kernels/ unit tests: a scratch directory and a generated
 * model in it (kvferry-mkmodel, path from $KVF_MKMODEL set by meson). */
#ifndef KN_TESTUTIL_H
#define KN_TESTUTIL_H

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kn_model.h"
#include "kn_stage.h"

static int kt_rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
	(void)sb;
	(void)flag;
	(void)f;
	return remove(p);
}

/** Remove a directory tree. */
static inline void kt_rmtree(const char *dir)
{
	nftw(dir, kt_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/** Make a scratch directory into @p buf (size >= 64). @return 0 or -1. */
static inline int kt_tmpdir(char *buf, size_t n)
{
	snprintf(buf, n, "%s/kvf-kn-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	return mkdtemp(buf) ? 0 : -1;
}

/** Run kvferry-mkmodel --out @p dir @p flags. @return 0, 77 if the tool is unknown, else 1. */
static inline int kt_mkmodel(const char *dir, const char *flags)
{
	const char *mk = getenv("KVF_MKMODEL");
	char cmd[4096];
	if (!mk || access(mk, X_OK))
		return 77;
	snprintf(cmd, sizeof(cmd), "'%s' --out '%s' %s >/dev/null", mk, dir, flags);
	return system(cmd) == 0 ? 0 : 1;
}

/** Read a whole file. @return malloc'd bytes or NULL. */
static inline void *kt_read(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	void *p = NULL;
	long n;
	*len = 0;
	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
		p = malloc((size_t)n + 1);
		if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
			free(p);
			p = NULL;
		}
		*len = (size_t)n;
	}
	fclose(f);
	return p;
}

/** Write a whole file. @return 0 or -1. */
static inline int kt_write(const char *path, const void *p, size_t len)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	size_t w = fwrite(p, 1, len, f);
	return (fclose(f) == 0 && w == len) ? 0 : -1;
}

/** A generated model, opened, for a test group's fixture. */
struct kt_model {
	char dir[128];
	struct kn_model *m;
	int32_t vocab, hidden, layers;
};

/**
 * Generate a model with kvferry-mkmodel @p flags into a scratch directory and
 * open it. @return 0, or -1 (reason printed; nothing left behind).
 */
static inline int kt_model_open(struct kt_model *t, const char *flags)
{
	char err[512];
	if (kt_tmpdir(t->dir, sizeof(t->dir)))
		return -1;
	if (kt_mkmodel(t->dir, flags)) {
		fprintf(stderr, "kvferry-mkmodel %s failed (KVF_MKMODEL=%s)\n", flags,
			getenv("KVF_MKMODEL") ? getenv("KVF_MKMODEL") : "unset");
		kt_rmtree(t->dir);
		return -1;
	}
	t->m = kn_model_open(t->dir, err, sizeof(err));
	if (!t->m) {
		fprintf(stderr, "kn_model_open(%s): %s\n", t->dir, err);
		kt_rmtree(t->dir);
		return -1;
	}
	const struct kn_model_config *c = kn_model_config(t->m);
	t->vocab = c->vocab_size;
	t->hidden = c->hidden_size;
	t->layers = c->n_layers;
	return 0;
}

static inline void kt_model_close(struct kt_model *t)
{
	kn_model_close(t->m);
	kt_rmtree(t->dir);
}

/**
 * A cmocka group setup's body: a zeroed fixture of @p size bytes whose first
 * member is a struct kt_model, opened on the model of @p flags.
 * @return 0 (*state set) or -1.
 */
static inline int kt_fixture_setup(void **state, size_t size, const char *flags)
{
	struct kt_model *t = calloc(1, size);
	if (!t || kt_model_open(t, flags)) {
		free(t);
		return -1;
	}
	*state = t;
	return 0;
}

/**
 * @p n_stages CPU stages over @p t's layers, split evenly, each with
 * @p n_blocks KV blocks, @p n_slots slots of @p bps blocks, 2 threads.
 * @return 0, or -1 (the failing stage's message printed; stages made so far
 *         left in st[] for the caller's teardown).
 */
static inline int kt_cpu_chain(const struct kt_model *t, int n_stages, int32_t n_blocks, int32_t n_slots,
			       int32_t bps, struct kn_stage **st)
{
	char err[512];
	for (int s = 0; s < n_stages; s++) {
		struct kn_stage_opts o;
		kn_stage_opts_init(&o);
		o.layer_start = t->layers * s / n_stages;
		o.layer_end = t->layers * (s + 1) / n_stages;
		o.n_blocks = n_blocks;
		o.n_slots = n_slots;
		o.max_blocks_per_slot = bps;
		o.n_threads = 2;
		st[s] = kn_stage_create(t->m, KN_BACKEND_CPU, &o, err, sizeof(err));
		if (!st[s]) {
			fprintf(stderr, "kn_stage_create(stage %d of %d): %s\n", s, n_stages, err);
			return -1;
		}
	}
	return 0;
}

/** Point slot @p slot of every stage at blocks @p blocks[0..bps). @return 0 or the first error. */
static inline int kt_point_slot(struct kn_stage **st, int n_stages, int32_t slot, const int32_t *blocks,
				int32_t bps)
{
	for (int s = 0; s < n_stages; s++)
		for (int32_t i = 0; i < bps; i++) {
			struct kn_op op = { KN_OP_SET_BLOCK, slot, i, blocks[i] };
			int rc = kn_stage_apply_ops(st[s], &op, 1);
			if (rc)
				return rc;
		}
	return 0;
}

/**
 * Run @p n columns (a prompt, or one decode) of slot @p slot from position
 * @p pos0 through the chain; the last column's logits to @p logits.
 * @return its token, or -1 (the failing stage's message printed).
 */
static inline int32_t kt_run(const struct kt_model *t, struct kn_stage **st, int n_stages, const int32_t *toks,
			     int32_t n, int32_t pos0, int32_t slot, float *logits)
{
	struct kn_column *cols = calloc((size_t)n, sizeof(*cols));
	float *h[2] = { calloc((size_t)n * t->hidden, 4), calloc((size_t)n * t->hidden, 4) };
	float *lg = calloc((size_t)n * t->vocab, 4);
	int32_t *out = calloc((size_t)n, 4), tok = -1;
	int rc = !cols || !h[0] || !h[1] || !lg || !out ? -ENOMEM : 0;

	for (int32_t j = 0; j < n && !rc; j++)
		cols[j] = (struct kn_column){ .token = toks[j], .pos = pos0 + j, .slot = slot,
					      .flags = j == n - 1 ? KN_COL_NEED_LOGIT : 0, .top_p = 1 };
	for (int s = 0; s < n_stages && !rc; s++) {
		struct kn_step step = { .n_cols = n, .cols = cols, .hidden_in = h[s & 1], .hidden_out = h[(s + 1) & 1],
					.tokens_out = out, .logits_out = lg };
		rc = kn_stage_step(st[s], &step);
		if (rc)
			fprintf(stderr, "stage %d: %s\n", s, kn_stage_error(st[s]));
	}
	if (!rc) {
		memcpy(logits, lg + (size_t)(n - 1) * t->vocab, (size_t)t->vocab * 4);
		tok = out[n - 1];
	}
	free(cols);
	free(h[0]);
	free(h[1]);
	free(lg);
	free(out);
	return tok;
}

/** @return 0 when $KVF_MKMODEL names an executable, else 77 (skip) after saying so. */
static inline int kt_need_mkmodel(void)
{
	const char *mk = getenv("KVF_MKMODEL");
	if (mk && !access(mk, X_OK))
		return 0;
	printf("SKIP: KVF_MKMODEL does not name kvferry-mkmodel\n");
	return 77;
}

#endif
