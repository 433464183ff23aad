/* SPDX-License-Identifier: Apache-2.0 */
/* Configuration layers, validation and the messages an operator sees. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ctrl_config.h"

static char g_dir[64];

static char *write_file(const char *name, const char *text)
{
	static char path[128];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", g_dir, name);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	return path;
}

static int setup(void **state)
{
	(void)state;
	snprintf(g_dir, sizeof(g_dir), "/tmp/kvf-cfg-XXXXXX");
	assert_non_null(mkdtemp(g_dir));
	return 0;
}

static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
	return system(cmd) == 0 ? 0 : -1;
}

static void defaults_are_the_documented_ones(void **state)
{
	struct ctrl_config *c = ctrl_config_new();
	const struct ctrl_settings *v;
	const char *origin;

	(void)state;
	assert_non_null(c);
	v = ctrl_config_settings(c);
	assert_string_equal(v->listen_address, "127.0.0.1");
	assert_int_equal(v->port, 8000);
	assert_string_equal(v->admin_socket, "/run/kvferry/ctrl.sock");
	assert_int_equal(v->request_body_limit, 1024 * 1024);
	assert_int_equal(v->backend, CTRL_CFG_BACKEND_CPU);
	assert_int_equal(ctrl_config_source(c, "port", &origin), CTRL_CFG_DEFAULT);
	assert_string_equal(origin, "default");
	assert_int_equal(ctrl_config_check(c, NULL, 0), 0);
	ctrl_config_free(c);
}

static void flag_beats_env_beats_file_beats_default(void **state)
{
	struct ctrl_config *c = ctrl_config_new();
	const struct ctrl_settings *v = ctrl_config_settings(c);
	char err[512];
	const char *origin;
	char *path = write_file("a.conf", "[http]\nport = 9001\nhttp_threads = 3\n"
					  "[sched]\nmb_k = 16\nmax_slots = 8\n");
	char *env[] = {"KVFERRY_PORT=9002", "KVFERRY_MB_K=24", "HOME=/x", NULL};
	char *argv[] = {"kvferry-ctrld", "--port", "9003", NULL};

	(void)state;
	/* Flags first, then env, then file: the order of reading must not matter. */
	assert_int_equal(ctrl_config_load_args(c, 3, argv, NULL, NULL, err, sizeof(err)), 0);
	assert_int_equal(ctrl_config_load_env(c, env, err, sizeof(err)), 0);
	assert_int_equal(ctrl_config_load_file(c, path, 1, err, sizeof(err)), 0);

	assert_int_equal(v->port, 9003);
	assert_int_equal(ctrl_config_source(c, "port", &origin), CTRL_CFG_FLAG);
	assert_string_equal(origin, "--port");
	assert_int_equal(v->mb_k, 24);
	assert_int_equal(ctrl_config_source(c, "mb_k", &origin), CTRL_CFG_ENV);
	assert_string_equal(origin, "KVFERRY_MB_K");
	assert_int_equal(v->max_slots, 8);
	assert_int_equal(ctrl_config_source(c, "max_slots", &origin), CTRL_CFG_FILE);
	assert_non_null(strstr(origin, "a.conf:6"));
	assert_int_equal(v->http_threads, 3);
	assert_int_equal(v->replicas, 1);
	assert_int_equal(ctrl_config_source(c, "replicas", NULL), CTRL_CFG_DEFAULT);
	ctrl_config_free(c);
}

static void an_out_of_range_file_value_names_the_key_and_the_line(void **state)
{
	struct ctrl_config *c = ctrl_config_new();
	char err[512];
	char *path = write_file("b.conf", "# comment\n\n[http]\nport = 70000\n");

	(void)state;
	assert_int_equal(ctrl_config_load_file(c, path, 1, err, sizeof(err)), -ERANGE);
	assert_non_null(strstr(err, "b.conf:4"));
	assert_non_null(strstr(err, "'port'"));
	assert_non_null(strstr(err, "0..65535"));
	/* The rejected value left the default in place. */
	assert_int_equal(ctrl_config_settings(c)->port, 8000);
	ctrl_config_free(c);
}

static void an_out_of_range_env_value_names_the_variable(void **state)
{
	struct ctrl_config *c = ctrl_config_new();
	char err[512];
	char *env[] = {"KVFERRY_MAX_SLOTS=0", NULL};

	(void)state;
	assert_int_equal(ctrl_config_load_env(c, env, err, sizeof(err)), -ERANGE);
	assert_non_null(strstr(err, "KVFERRY_MAX_SLOTS"));
	assert_non_null(strstr(err, "max_slots"));
	ctrl_config_free(c);
}

static void a_bad_flag_value_names_the_flag_and_the_expected_type(void **state)
{
	struct ctrl_config *c = ctrl_config_new();
	char err[512];
	char *argv1[] = {"x", "--backend=tpu", NULL};
	char *argv2[] = {"x", "--mb-k", "wide", NULL};
	char *argv3[] = {"x", "--threads", NULL};

	(void)state;
	assert_int_equal(ctrl_config_load_args(c, 2, argv1, NULL, NULL, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "--backend"));
	assert_non_null(strstr(err, "cpu or cuda"));
	assert_int_equal(ctrl_config_load_args(c, 3, argv2, NULL, NULL, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "--mb-k"));
	assert_non_null(strstr(err, "integer"));
	assert_int_equal(ctrl_config_load_args(c, 2, argv3, NULL, NULL, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "needs a value"));
	ctrl_config_free(c);
}

static void unknown_keys_are_rejected_wherever_they_come_from(void **state)
{
	struct ctrl_config *c = ctrl_config_new();
	char err[512];
	char *path = write_file("c.conf", "[http]\nprot = 1\n");
	char *env[] = {"KVFERRY_PROT=1", NULL};
	char *env_ok[] = {"KVFERRY_CONFIG=/nowhere", NULL};
	char *argv[] = {"x", "--prot", "1", NULL};

	(void)state;
	assert_int_equal(ctrl_config_load_file(c, path, 1, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "c.conf:2"));
	assert_non_null(strstr(err, "'prot'"));
	assert_int_equal(ctrl_config_load_env(c, env, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "KVFERRY_PROT"));
	assert_int_equal(ctrl_config_load_env(c, env_ok, err, sizeof(err)), 0);
	assert_int_equal(ctrl_config_load_args(c, 3, argv, NULL, NULL, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "--prot"));
	ctrl_config_free(c);
}

/* A deployment turns the CUDA one numerics family on in the file or the
 * environment; the engine's own measurement variables beside it are not
 * ctrld's to refuse (they once kept ctrld from starting). */
static void batch_invariant_numerics_is_a_key_and_the_engines_knobs_pass(void **state)
{
	struct ctrl_config *c = ctrl_config_new();
	const struct ctrl_settings *v = ctrl_config_settings(c);
	char err[512];
	char *path = write_file("bi.conf", "[engine]\ncuda_batch_invariant = yes\n");
	char *env[] = {"KVFERRY_CUDA_LINEAR=wg", "KVFERRY_CUDA_PDL=0", "KVFERRY_CUDA_ATTN_EXACT=0",
		       "KVFERRY_CUDA_WIDE_X=split", "KVFERRY_CUDA_TP=host", NULL};
	char *env_bad[] = {"KVFERRY_CUDA_BATCH_INVARIANT=maybe", NULL};

	(void)state;
	assert_int_equal(v->cuda_batch_invariant, 0);
	assert_int_equal(ctrl_config_load_file(c, path, 1, err, sizeof(err)), 0);
	assert_int_equal(v->cuda_batch_invariant, 1);
	assert_int_equal(ctrl_config_load_env(c, env, err, sizeof(err)), 0);
	assert_int_not_equal(ctrl_config_load_env(c, env_bad, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "KVFERRY_CUDA_BATCH_INVARIANT"));
	/* a misspelt engine knob is no engine's: refused by name */
	char *env_typo[] = {"KVFERRY_CUDA_ATTN_EXCT=0", NULL};
	assert_int_not_equal(ctrl_config_load_env(c, env_typo, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "KVFERRY_CUDA_ATTN_EXCT"));
	ctrl_config_free(c);
}

static void ini_syntax_errors_give_the_line_number(void **state)
{
	struct ctrl_config *c = ctrl_config_new();
	char err[512];
	char *p1 = write_file("d.conf", "[http]\nport 8000\n");
	char *p2;

	(void)state;
	assert_int_equal(ctrl_config_load_file(c, p1, 1, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "d.conf:2"));
	assert_non_null(strstr(err, "key = value"));
	p2 = write_file("e.conf", "\n\n[http\n");
	assert_int_equal(ctrl_config_load_file(c, p2, 1, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "e.conf:3"));
	p2 = write_file("f.conf", "[nope]\n");
	assert_int_equal(ctrl_config_load_file(c, p2, 1, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "[nope]"));
	p2 = write_file("g.conf", "[model]\nport = 1\n");
	assert_int_equal(ctrl_config_load_file(c, p2, 1, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "belongs in section [http]"));
	ctrl_config_free(c);
}

static void a_missing_default_file_is_fine_but_a_named_one_is_not(void **state)
{
	struct ctrl_config *c = ctrl_config_new();
	char err[512];

	(void)state;
	assert_int_equal(ctrl_config_load_file(c, "/nonexistent/kvferry.conf", 0, err, sizeof(err)), 0);
	assert_int_equal(ctrl_config_load_file(c, "/nonexistent/kvferry.conf", 1, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "/nonexistent/kvferry.conf"));
	ctrl_config_free(c);
}

static void values_parse_by_type(void **state)
{
	struct ctrl_config *c = ctrl_config_new();
	const struct ctrl_settings *v = ctrl_config_settings(c);
	char err[512];
	char *path = write_file("h.conf", "[engine]\nkv_memory = 64M\nbackend = CUDA\nkv_mem_fraction = 0.5\n"
					  "[sched]\nspec = off\n[model]\nserved_model_name = \"tiny model\"\n");
	char *argv[] = {"x", "--spec", "--config", "/somewhere", "--help", NULL};

	(void)state;
	assert_int_equal(ctrl_config_load_file(c, path, 1, err, sizeof(err)), 0);
	assert_int_equal(v->kv_memory, 64 * 1024 * 1024);
	assert_int_equal(v->backend, CTRL_CFG_BACKEND_CUDA);
	assert_true(v->kv_mem_fraction == 0.5);
	assert_int_equal(v->spec, 0);
	assert_string_equal(v->served_model_name, "tiny model");
	/* A bare boolean flag turns it on; the caller's own flags pass through. */
	{
		const char *skip[] = {"--config", NULL};
		const char *bare[] = {"--help", NULL};
		assert_int_equal(ctrl_config_load_args(c, 5, argv, skip, bare, err, sizeof(err)), 0);
	}
	assert_int_equal(v->spec, 1);
	ctrl_config_free(c);
}

static void stage_lists_are_checked_against_the_model(void **state)
{
	int32_t ends[CTRL_CFG_MAX_STAGES], n;
	char err[256];

	(void)state;
	assert_int_equal(ctrl_config_stages("0-8,8-16", 16, ends, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 2);
	assert_int_equal(ends[0], 8);
	assert_int_equal(ends[1], 16);
	assert_int_equal(ctrl_config_stages("3", 10, ends, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 3);
	assert_int_equal(ends[2], 10);
	assert_int_equal(ctrl_config_stages("0-8,9-16", 16, ends, &n, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "contiguous"));
	assert_int_equal(ctrl_config_stages("0-8,8-12", 16, ends, &n, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "must end at 16"));
	assert_int_equal(ctrl_config_stages("4", 2, ends, &n, err, sizeof(err)), -EINVAL);
	{
		struct ctrl_config *c = ctrl_config_new();
		char *env[] = {"KVFERRY_STAGES=0-4,2-8", NULL};
		assert_int_equal(ctrl_config_load_env(c, env, err, sizeof(err)), -EINVAL);
		assert_non_null(strstr(err, "KVFERRY_STAGES"));
		ctrl_config_free(c);
	}
}

static void plan_lists_ascend_and_a_bad_one_names_the_key(void **state)
{
	int32_t w[8], n;
	char err[256];

	(void)state;
	assert_int_equal(ctrl_config_plans("auto", w, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 0);
	assert_int_equal(ctrl_config_plans("1,8,64,512", w, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 4);
	assert_int_equal(w[3], 512);
	assert_int_equal(ctrl_config_plans("8,4", w, &n, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "ascend"));
	assert_int_equal(ctrl_config_plans("1,2,3,4,5,6,7,8,9", w, &n, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "more than 8"));
	assert_int_equal(ctrl_config_plans("8,wide", w, &n, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "\"wide\""));
	assert_int_equal(ctrl_config_plans("0", w, &n, err, sizeof(err)), -EINVAL);
	{
		struct ctrl_config *c = ctrl_config_new();
		char *env[] = {"KVFERRY_PLANS=64,8", NULL};
		assert_int_equal(ctrl_config_load_env(c, env, err, sizeof(err)), -EINVAL);
		assert_non_null(strstr(err, "KVFERRY_PLANS"));
		ctrl_config_free(c);
	}
}

static void the_json_view_says_where_each_value_came_from(void **state)
{
	struct ctrl_config *c = ctrl_config_new();
	char err[256];
	char *env[] = {"KVFERRY_GROUPS=5", NULL};
	json_t *j, *e;
	size_t i;
	int seen = 0;

	(void)state;
	assert_int_equal(ctrl_config_load_env(c, env, err, sizeof(err)), 0);
	j = ctrl_config_json(c);
	assert_non_null(j);
	json_array_foreach(j, i, e) {
		const char *key = json_string_value(json_object_get(e, "key"));
		if (strcmp(key, "groups") == 0) {
			assert_string_equal(json_string_value(json_object_get(e, "value")), "5");
			assert_string_equal(json_string_value(json_object_get(e, "source")), "env");
			assert_string_equal(json_string_value(json_object_get(e, "origin")), "KVFERRY_GROUPS");
			seen = 1;
		}
		assert_non_null(json_object_get(e, "help"));
	}
	assert_true(seen);
	json_decref(j);
	ctrl_config_free(c);
}

/* Found by tests/fuzz/fuzz_ini.c: a Latin-1 value was taken, then every
 * JSON holding it failed (ctrlctl config said "out of memory"; a
 * served_model_name so spelled would empty every answer). */
static void a_value_that_is_not_utf8_is_refused_by_name(void **state)
{
	struct ctrl_config *c = ctrl_config_new();
	char err[512];
	char *path = write_file("latin1.conf", "[model]\nserved_model_name = caf\xe9\n");
	char *env[] = {"KVFERRY_LISTEN_ADDRESS=\xc3(", NULL};
	json_t *j;

	(void)state;
	assert_int_equal(ctrl_config_load_file(c, path, 1, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "latin1.conf:2"));
	assert_non_null(strstr(err, "'served_model_name' is not UTF-8"));
	assert_int_equal(ctrl_config_load_env(c, env, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "KVFERRY_LISTEN_ADDRESS"));
	/* UTF-8 beyond ASCII is text like any other, and the view carries it */
	path = write_file("utf8.conf", "[model]\nserved_model_name = caf\xc3\xa9-\xe2\x82\xac\n");
	assert_int_equal(ctrl_config_load_file(c, path, 1, err, sizeof(err)), 0);
	j = ctrl_config_json(c);
	assert_non_null(j);
	json_decref(j);
	ctrl_config_free(c);
}

static void the_generated_default_file_reads_back_as_the_defaults(void **state)
{
	struct ctrl_config *c = ctrl_config_new(), *d = ctrl_config_new();
	char path[128], err[256], *text = NULL;
	size_t len = 0;
	FILE *f;

	(void)state;
	snprintf(path, sizeof(path), "%s/default.conf", g_dir);
	f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(ctrl_config_print_defaults(f), 0);
	fclose(f);
	assert_int_equal(ctrl_config_load_file(c, path, 1, err, sizeof(err)), 0);
	assert_memory_equal(ctrl_config_settings(c), ctrl_config_settings(d), sizeof(struct ctrl_settings));

	/* Uncommenting every line must still give the defaults, so each
	 * printed default is valid input. */
	f = open_memstream(&text, &len);
	ctrl_config_print_defaults(f);
	fclose(f);
	for (char *p = text; (p = strstr(p, "\n#")); p++) {
		if (p[2] != ' ' && p[2] != '\n')
			p[1] = ' ';
	}
	f = fopen(path, "w");
	fputs(text, f);
	fclose(f);
	free(text);
	assert_int_equal(ctrl_config_load_file(c, path, 1, err, sizeof(err)), 0);
	assert_int_equal(ctrl_config_source(c, "port", NULL), CTRL_CFG_FILE);
	assert_memory_equal(ctrl_config_settings(c), ctrl_config_settings(d), sizeof(struct ctrl_settings));
	ctrl_config_free(c);
	ctrl_config_free(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(defaults_are_the_documented_ones),
		cmocka_unit_test(flag_beats_env_beats_file_beats_default),
		cmocka_unit_test(an_out_of_range_file_value_names_the_key_and_the_line),
		cmocka_unit_test(an_out_of_range_env_value_names_the_variable),
		cmocka_unit_test(a_bad_flag_value_names_the_flag_and_the_expected_type),
		cmocka_unit_test(unknown_keys_are_rejected_wherever_they_come_from),
		cmocka_unit_test(batch_invariant_numerics_is_a_key_and_the_engines_knobs_pass),
		cmocka_unit_test(ini_syntax_errors_give_the_line_number),
		cmocka_unit_test(a_missing_default_file_is_fine_but_a_named_one_is_not),
		cmocka_unit_test(values_parse_by_type),
		cmocka_unit_test(stage_lists_are_checked_against_the_model),
		cmocka_unit_test(plan_lists_ascend_and_a_bad_one_names_the_key),
		cmocka_unit_test(the_json_view_says_where_each_value_came_from),
		cmocka_unit_test(a_value_that_is_not_utf8_is_refused_by_name),
		cmocka_unit_test(the_generated_default_file_reads_back_as_the_defaults),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
