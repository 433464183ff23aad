/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Bad model files and bad steps are refused with a message that names the
 * problem; nothing crashes (the sanitizer build runs this too, so error paths
 * must not leak either).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kvf_config.h"
#include "kn_model.h"
#include "kn_stage.h"
#include "kn_testutil.h"

struct fixture {
	char good[128]; /* a valid f32 tiny model */
	char bad[160];  /* a copy each test may break */
};

static void copy(const char *from, const char *to, const char *name)
{
	char a[512], b[512];
	size_t n = 0;
	snprintf(a, sizeof(a), "%s/%s", from, name);
	snprintf(b, sizeof(b), "%s/%s", to, name);
	void *p = kt_read(a, &n);
	assert_non_null(p);
	assert_int_equal(kt_write(b, p, n), 0);
	free(p);
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	if (kt_tmpdir(f->good, sizeof(f->good)) || kt_mkmodel(f->good, "--preset tiny --arch llama --dtype f32 --no-tie"))
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	kt_rmtree(f->good);
	free(f);
	return 0;
}

/* Fresh copy of the good model in f->bad for each test. */
static int per_test_setup(void **state)
{
	struct fixture *f = *state;
	snprintf(f->bad, sizeof(f->bad), "%s-bad", f->good);
	kt_rmtree(f->bad);
	if (mkdir(f->bad, 0755))
		return -1;
	copy(f->good, f->bad, "config.json");
	copy(f->good, f->bad, "model.safetensors");
	return 0;
}

static int per_test_teardown(void **state)
{
	struct fixture *f = *state;
	kt_rmtree(f->bad);
	return 0;
}

static void expect_open_error(const char *dir, int want_errno, const char *needle1, const char *needle2)
{
	char err[1024] = "";
	errno = 0;
	struct kn_model *m = kn_model_open(dir, err, sizeof(err));
	if (m) {
		kn_model_close(m);
		fail_msg("kn_model_open(%s) accepted a bad model", dir);
	}
	assert_int_equal(errno, want_errno);
	if (!strstr(err, needle1) || (needle2 && !strstr(err, needle2)))
		fail_msg("error \"%s\" does not name \"%s\"%s%s", err, needle1, needle2 ? " and " : "", needle2 ? needle2 : "");
}

/* Rewrite model.safetensors with its header passed through @p edit. */
static void edit_header(const char *dir, void (*edit)(json_t *hdr))
{
	char path[512];
	size_t n = 0;
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	uint8_t *p = kt_read(path, &n);
	assert_non_null(p);
	uint64_t hl;
	memcpy(&hl, p, 8);
	json_t *hdr = json_loadb((const char *)p + 8, hl, 0, NULL);
	assert_non_null(hdr);
	edit(hdr);
	char *hs = json_dumps(hdr, JSON_COMPACT);
	size_t nl = strlen(hs), dl = n - 8 - hl;
	uint8_t *q = malloc(8 + nl + dl);
	uint64_t nl64 = nl;
	memcpy(q, &nl64, 8);
	memcpy(q + 8, hs, nl);
	memcpy(q + 8 + nl, p + 8 + hl, dl);
	assert_int_equal(kt_write(path, q, 8 + nl + dl), 0);
	free(q);
	free(hs);
	json_decref(hdr);
	free(p);
}

static void edit_config(const char *dir, const char *key, json_t *val)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/config.json", dir);
	json_t *c = json_load_file(path, 0, NULL);
	assert_non_null(c);
	json_object_set_new(c, key, val);
	assert_int_equal(json_dump_file(c, path, 0), 0);
	json_decref(c);
}

static void a_truncated_safetensors_file_is_refused_naming_the_tensor(void **state)
{
	struct fixture *f = *state;
	char path[512];
	size_t n = 0;
	snprintf(path, sizeof(path), "%s/model.safetensors", f->bad);
	void *p = kt_read(path, &n);
	assert_int_equal(kt_write(path, p, n - 100), 0);
	expect_open_error(f->bad, EINVAL, "truncated", "model.");
	assert_int_equal(kt_write(path, p, 5), 0); /* not even a header length */
	expect_open_error(f->bad, EINVAL, "truncated", NULL);
	free(p);
}

static void a_header_length_beyond_the_file_is_refused(void **state)
{
	struct fixture *f = *state;
	char path[512];
	size_t n = 0;
	snprintf(path, sizeof(path), "%s/model.safetensors", f->bad);
	uint8_t *p = kt_read(path, &n);
	uint64_t big = (uint64_t)n;
	memcpy(p, &big, 8);
	assert_int_equal(kt_write(path, p, n), 0);
	free(p);
	expect_open_error(f->bad, EINVAL, "header length", NULL);
}

static void lie_offsets(json_t *h)
{
	json_t *off = json_object_get(json_object_get(h, "model.layers.1.mlp.up_proj.weight"), "data_offsets");
	json_array_set_new(off, 1, json_integer(json_integer_value(json_array_get(off, 1)) + (1 << 20)));
}

static void a_header_lying_about_offsets_is_refused_naming_the_tensor(void **state)
{
	struct fixture *f = *state;
	edit_header(f->bad, lie_offsets);
	expect_open_error(f->bad, EINVAL, "model.layers.1.mlp.up_proj.weight", "data_offsets");
}

static void lie_shape(json_t *h)
{
	/* Shape says more elements than the offsets hold. */
	json_t *sh = json_object_get(json_object_get(h, "model.norm.weight"), "shape");
	json_array_set_new(sh, 0, json_integer(65));
}

static void a_header_lying_about_a_size_is_refused(void **state)
{
	struct fixture *f = *state;
	edit_header(f->bad, lie_shape);
	expect_open_error(f->bad, EINVAL, "model.norm.weight", NULL);
}

static void drop_k(json_t *h)
{
	json_object_del(h, "model.layers.1.self_attn.k_proj.weight");
}

static void a_missing_tensor_is_named_with_its_expected_shape(void **state)
{
	struct fixture *f = *state;
	edit_header(f->bad, drop_k);
	expect_open_error(f->bad, EINVAL, "missing tensor model.layers.1.self_attn.k_proj.weight", "expected shape [32, 64]");
}

static void drop_all(json_t *h)
{
	json_object_clear(h);
	json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
}

/* Found by tests/fuzz/fuzz_model.c: no tensor at all passed NULL to qsort()
 * (the sanitizer pass reports it). */
static void a_header_of_no_tensor_is_refused_naming_the_first_missing(void **state)
{
	struct fixture *f = *state;
	edit_header(f->bad, drop_all);
	expect_open_error(f->bad, EINVAL, "missing tensor model.embed_tokens.weight", NULL);
}

static void int_dtype(json_t *h)
{
	json_object_set_new(json_object_get(h, "model.norm.weight"), "dtype", json_string("I64"));
}

static void an_unsupported_dtype_is_refused_naming_the_tensor(void **state)
{
	struct fixture *f = *state;
	edit_header(f->bad, int_dtype);
	expect_open_error(f->bad, EINVAL, "model.norm.weight", "I64");
}

static void a_wrong_shape_names_expected_and_found(void **state)
{
	struct fixture *f = *state;
	edit_config(f->bad, "intermediate_size", json_integer(96));
	expect_open_error(f->bad, EINVAL, "model.layers.0.mlp.gate_proj.weight has shape [128, 64]", "expected [96, 64]");
}

static void an_unknown_architecture_is_refused_by_name(void **state)
{
	struct fixture *f = *state;
	edit_config(f->bad, "architectures", json_pack("[s]", "GPT2LMHeadModel"));
	expect_open_error(f->bad, EINVAL, "unknown architecture \"GPT2LMHeadModel\"", NULL);
}

static void a_directory_without_config_is_enoent(void **state)
{
	struct fixture *f = *state;
	char path[512];
	snprintf(path, sizeof(path), "%s/config.json", f->bad);
	unlink(path);
	expect_open_error(f->bad, ENOENT, "config.json", NULL);
}

/* ---- step-time errors on a valid model ---- */

static struct kn_stage *one_stage(struct kn_model *m, int32_t start, int32_t end)
{
	char err[512];
	struct kn_stage_opts o;
	kn_stage_opts_init(&o);
	o.layer_start = start;
	o.layer_end = end;
	o.n_blocks = 4;
	o.n_slots = 2;
	o.max_blocks_per_slot = 2;
	o.n_threads = 1;
	struct kn_stage *s = kn_stage_create(m, KN_BACKEND_CPU, &o, err, sizeof(err));
	if (!s)
		fail_msg("kn_stage_create: %s", err);
	return s;
}

static void nan_weights_fail_the_step_naming_the_layer(void **state)
{
	struct fixture *f = *state;
	char path[512], err[512];
	size_t n = 0;
	snprintf(path, sizeof(path), "%s/model.safetensors", f->bad);
	uint8_t *p = kt_read(path, &n);
	{ /* poison one f32 of layer 1's down projection */
		struct kn_model *m = kn_model_open(f->bad, err, sizeof(err));
		assert_non_null(m);
		const struct kn_tensor *t = kn_model_tensor(m, "model.layers.1.mlp.down_proj.weight");
		float nanv = NAN;
		/* Locate the tensor's bytes in the file copy by content. */
		for (size_t i = 0; i + t->nbytes <= n; i += 4)
			if (!memcmp(p + i, t->data, t->nbytes)) {
				memcpy(p + i + 8, &nanv, 4);
				break;
			}
		kn_model_close(m);
	}
	assert_int_equal(kt_write(path, p, n), 0);
	free(p);
	struct kn_model *m = kn_model_open(f->bad, err, sizeof(err));
	assert_non_null(m);
	struct kn_stage *s = one_stage(m, 0, kn_model_config(m)->n_layers);
	struct kn_op op = { .type = KN_OP_SET_BLOCK, .slot = 0, .idx = 0, .val = 0 };
	assert_int_equal(kn_stage_apply_ops(s, &op, 1), 0);
	struct kn_column col = { .token = 5, .pos = 0, .slot = 0, .flags = KN_COL_NEED_LOGIT, .top_p = 1 };
	int32_t tok;
	struct kn_step step = { .n_cols = 1, .cols = &col, .tokens_out = &tok };
	assert_int_equal(kn_stage_step(s, &step), -EINVAL);
	if (!strstr(kn_stage_error(s), "non-finite") || !strstr(kn_stage_error(s), "layer 1"))
		fail_msg("error \"%s\" does not name the non-finite value and layer 1", kn_stage_error(s));
	kn_stage_destroy(s);
	kn_model_close(m);
}

static void bad_columns_and_ops_are_refused_and_write_nothing(void **state)
{
	struct fixture *f = *state;
	char err[512];
	struct kn_model *m = kn_model_open(f->good, err, sizeof(err));
	assert_non_null(m);
	int32_t V = kn_model_config(m)->vocab_size;
	struct kn_stage *s = one_stage(m, 0, kn_model_config(m)->n_layers);
	int32_t tok;
	struct kn_column col = { .token = 5, .pos = 0, .slot = 0, .flags = KN_COL_NEED_LOGIT, .top_p = 1 };
	struct kn_step step = { .n_cols = 1, .cols = &col, .tokens_out = &tok };

	/* no block set yet */
	assert_int_equal(kn_stage_step(s, &step), -EINVAL);
	assert_non_null(strstr(kn_stage_error(s), "not set"));

	/* ops: the bad one and everything after it are not applied */
	struct kn_op ops[3] = { { KN_OP_SET_BLOCK, 0, 0, 1 }, { KN_OP_SET_BLOCK, 0, 1, 4 }, { KN_OP_SET_BLOCK, 1, 0, 2 } };
	assert_int_equal(kn_stage_apply_ops(s, ops, 3), -EINVAL);
	assert_non_null(strstr(kn_stage_error(s), "block 4"));
	col.slot = 1;
	assert_int_equal(kn_stage_step(s, &step), -EINVAL); /* slot 1 untouched */
	col.slot = 0;
	assert_int_equal(kn_stage_step(s, &step), 0);          /* slot 0 block 0 applied */
	struct kn_op badslot = { KN_OP_ZERO_SLOT, 7, 0, 0 }, badtype = { 99, 0, 0, 0 };
	assert_int_equal(kn_stage_apply_ops(s, &badslot, 1), -EINVAL);
	assert_int_equal(kn_stage_apply_ops(s, &badtype, 1), -EINVAL);

	col.token = V;
	assert_int_equal(kn_stage_step(s, &step), -EINVAL);
	assert_non_null(strstr(kn_stage_error(s), "token id"));
	col.token = -1;
	assert_int_equal(kn_stage_step(s, &step), -EINVAL);
	col.token = 5;
	col.pos = 2 * KN_PAGE_BLK; /* beyond a 2-block row */
	assert_int_equal(kn_stage_step(s, &step), -EINVAL);
	assert_non_null(strstr(kn_stage_error(s), "beyond the block table"));
	col.pos = 0;
	col.slot = 2;
	assert_int_equal(kn_stage_step(s, &step), -EINVAL);
	col.slot = 0;
	step.n_cols = 65; /* wider than the widest plan (64) */
	assert_int_equal(kn_stage_step(s, &step), -EINVAL);
	step.n_cols = 0;
	assert_int_equal(kn_stage_step(s, &step), -EINVAL);
	step.n_cols = 1;
	assert_int_equal(kn_stage_set_pool(s, 0), -EINVAL);
	assert_int_equal(kn_stage_set_pool(s, 8), 0);
	assert_int_equal(kn_stage_step(s, &step), -EINVAL); /* the pool resize cleared the table */
	kn_stage_destroy(s);

	/* a middle stage needs hidden_in/out */
	s = one_stage(m, 1, 2);
	assert_int_equal(kn_stage_apply_ops(s, ops, 1), 0);
	assert_int_equal(kn_stage_step(s, &step), -EINVAL);
	assert_non_null(strstr(kn_stage_error(s), "hidden_in"));
	kn_stage_destroy(s);
	kn_model_close(m);
}

static void steps_in_flight_are_bounded_and_misuse_is_refused_by_name(void **state)
{
	struct fixture *f = *state;
	char err[512];
	struct kn_model *m = kn_model_open(f->good, err, sizeof(err));
	assert_non_null(m);
	struct kn_stage *s = one_stage(m, 0, kn_model_config(m)->n_layers);
	int32_t tok[KN_STEP_DEPTH + 1], solo;
	struct kn_column col = { .token = 5, .pos = 0, .slot = 0, .flags = KN_COL_NEED_LOGIT, .top_p = 1 };
	struct kn_step step[KN_STEP_DEPTH + 1];
	struct kn_op op = { KN_OP_SET_BLOCK, 0, 0, 1 };

	assert_int_equal(kn_stage_apply_ops(s, &op, 1), 0);
	assert_int_equal(kn_stage_step_wait(s), -EINVAL);
	assert_non_null(strstr(kn_stage_error(s), "no step in flight"));
	assert_int_equal(kn_stage_step_ready(s), 0);
	for (int i = 0; i <= KN_STEP_DEPTH; i++)
		step[i] = (struct kn_step){ .n_cols = 1, .cols = &col, .tokens_out = &tok[i] };
	for (int i = 0; i < KN_STEP_DEPTH; i++)
		assert_int_equal(kn_stage_step_submit(s, &step[i]), 0);
	assert_int_equal(kn_stage_step_inflight(s), KN_STEP_DEPTH);
	assert_int_equal(kn_stage_step_submit(s, &step[KN_STEP_DEPTH]), -EBUSY);
	assert_non_null(strstr(kn_stage_error(s), "in flight"));
	assert_int_equal(kn_stage_step(s, &step[KN_STEP_DEPTH]), -EBUSY);
	assert_int_equal(kn_stage_set_pool(s, 8), -EBUSY);
	assert_non_null(strstr(kn_stage_error(s), "wait for them first"));
	/* a bad step is refused at submit and never counted */
	col.token = kn_model_config(m)->vocab_size;
	step[KN_STEP_DEPTH].cols = &col;
	for (int i = 0; i < KN_STEP_DEPTH; i++) {
		assert_int_equal(kn_stage_step_ready(s), 1);
		assert_int_equal(kn_stage_step_wait(s), 0);
	}
	assert_int_equal(kn_stage_step_submit(s, &step[KN_STEP_DEPTH]), -EINVAL);
	assert_int_equal(kn_stage_step_inflight(s), 0);
	/* the submitted steps computed what one kn_stage_step computes */
	col.token = 5;
	step[KN_STEP_DEPTH].tokens_out = &solo;
	assert_int_equal(kn_stage_step(s, &step[KN_STEP_DEPTH]), 0);
	for (int i = 0; i < KN_STEP_DEPTH; i++)
		assert_int_equal(tok[i], solo);
	kn_stage_destroy(s);
	kn_model_close(m);
}

static void bad_stage_options_are_refused(void **state)
{
	struct fixture *f = *state;
	char err[512];
	struct kn_model *m = kn_model_open(f->good, err, sizeof(err));
	assert_non_null(m);
	struct kn_stage_opts o;
	kn_stage_opts_init(&o);
	o.layer_start = 2;
	o.layer_end = 1;
	errno = 0;
	assert_null(kn_stage_create(m, KN_BACKEND_CPU, &o, err, sizeof(err)));
	assert_int_equal(errno, EINVAL);
	assert_non_null(strstr(err, "layer range [2, 1)"));
	kn_stage_opts_init(&o);
	o.layer_end = 99;
	assert_null(kn_stage_create(m, KN_BACKEND_CPU, &o, err, sizeof(err)));
	kn_stage_opts_init(&o);
	o.plan_widths[1] = 4; /* not ascending */
	assert_null(kn_stage_create(m, KN_BACKEND_CPU, &o, err, sizeof(err)));
	assert_non_null(strstr(err, "ascending"));
#if !KVF_HAVE_CUDA
	kn_stage_opts_init(&o);
	errno = 0;
	assert_null(kn_stage_create(m, KN_BACKEND_CUDA, &o, err, sizeof(err)));
	assert_int_equal(errno, ENODEV);
	assert_non_null(strstr(err, "CUDA"));
#endif
	kn_model_close(m);
}

/* The CUDA backend's module (kvferry-cuda.so): a path that is not there, or
 * a file that is not a module, is refused naming it, and nothing is loaded
 * (a later call may still find the real one). */
static void a_cuda_module_that_is_missing_or_not_a_module_is_named(void **state)
{
	struct fixture *f = *state;
	char err[768], bad[600];
	struct kn_cuda_info ci;

	assert_int_equal(kn_cuda_open("/nonexistent/kvferry-cuda.so", &ci, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "/nonexistent/kvferry-cuda.so"));
	snprintf(bad, sizeof(bad), "%s/config.json", f->good); /* a file, not a module */
	assert_int_equal(kn_cuda_open(bad, &ci, err, sizeof(err)), -ELIBBAD);
	assert_non_null(strstr(err, bad));
	assert_non_null(strstr(err, "libcublas"));
	/* a stage asked for on it fails the same way, with errno */
	struct kn_model *m = kn_model_open(f->good, err, sizeof(err));
	assert_non_null(m);
	struct kn_stage_opts o;
	kn_stage_opts_init(&o);
	o.cuda_module = "/nonexistent/kvferry-cuda.so";
	errno = 0;
	assert_null(kn_stage_create(m, KN_BACKEND_CUDA, &o, err, sizeof(err)));
	assert_int_equal(errno, ENOENT);
	assert_non_null(strstr(err, "cuda_module /nonexistent/kvferry-cuda.so"));
	kn_model_close(m);
}

int main(void)
{
	if (kt_need_mkmodel())
		return 77;
#define T(fn) cmocka_unit_test_setup_teardown(fn, per_test_setup, per_test_teardown)
	const struct CMUnitTest tests[] = {
		T(a_truncated_safetensors_file_is_refused_naming_the_tensor),
		T(a_header_length_beyond_the_file_is_refused),
		T(a_header_lying_about_offsets_is_refused_naming_the_tensor),
		T(a_header_lying_about_a_size_is_refused),
		T(a_missing_tensor_is_named_with_its_expected_shape),
		T(a_header_of_no_tensor_is_refused_naming_the_first_missing),
		T(an_unsupported_dtype_is_refused_naming_the_tensor),
		T(a_wrong_shape_names_expected_and_found),
		T(an_unknown_architecture_is_refused_by_name),
		T(a_directory_without_config_is_enoent),
		T(nan_weights_fail_the_step_naming_the_layer),
		T(bad_columns_and_ops_are_refused_and_write_nothing),
		T(bad_stage_options_are_refused),
		T(steps_in_flight_are_bounded_and_misuse_is_refused_by_name),
		T(a_cuda_module_that_is_missing_or_not_a_module_is_named),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
