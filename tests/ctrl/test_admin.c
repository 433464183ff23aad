/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The admin socket and ctrlctl. argv[1]: the ctrlctl binary.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ctrl_admin.h"

static char g_dir[64];
static char g_sock[128];
static const char *g_ctrlctl;

static int cmd_echo(void *arg, const char *cmd, json_t *params, json_t **data, char *err, size_t errlen)
{
	int *calls = arg;

	(void)err;
	(void)errlen;
	(*calls)++;
	*data = json_pack("{s:s, s:O, s:[{s:i, s:s}, {s:i, s:s}]}", "cmd", cmd, "params", params, "rows",
			  "stage", 0, "state", "busy", "stage", 1, "state", "idle");
	return 0;
}

static int cmd_fail(void *arg, const char *cmd, json_t *params, json_t **data, char *err, size_t errlen)
{
	(void)arg;
	(void)cmd;
	(void)params;
	(void)data;
	snprintf(err, errlen, "pool is exhausted: raise kv_blocks");
	return -ENOSPC;
}

static int setup(void **state)
{
	(void)state;
	snprintf(g_dir, sizeof(g_dir), "/tmp/kvf-adm-XXXXXX");
	assert_non_null(mkdtemp(g_dir));
	snprintf(g_sock, sizeof(g_sock), "%s/ctrl.sock", g_dir);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	unlink(g_sock);
	return rmdir(g_dir);
}

static void commands_answer_by_full_name_and_by_bare_verb(void **state)
{
	char err[256];
	int calls = 0;
	struct ctrl_admin *a = ctrl_admin_start(g_sock, 0660, err, sizeof(err));
	json_t *r, *p = json_pack("{s:i}", "n", 3);
	struct stat st;

	(void)state;
	assert_non_null(a);
	assert_int_equal(stat(g_sock, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0660);
	assert_int_equal(ctrl_admin_register(a, "/sched/pool", "the pool", cmd_echo, &calls), 0);
	assert_int_equal(ctrl_admin_register(a, "/sched/pool", "again", cmd_echo, &calls), -EEXIST);
	assert_int_equal(ctrl_admin_register(a, "pool", "no module", cmd_echo, &calls), -EINVAL);
	assert_int_equal(ctrl_admin_register(a, "/a/b/c", "too deep", cmd_echo, &calls), -EINVAL);

	assert_int_equal(ctrl_admin_call(g_sock, "/sched/pool", p, &r, 2000, err, sizeof(err)), 0);
	assert_true(json_is_true(json_object_get(r, "ok")));
	assert_int_equal(json_integer_value(json_object_get(json_object_get(json_object_get(r, "data"), "params"), "n")), 3);
	json_decref(r);
	assert_int_equal(ctrl_admin_call(g_sock, "pool", NULL, &r, 2000, err, sizeof(err)), 0);
	assert_string_equal(json_string_value(json_object_get(r, "cmd")), "/sched/pool");
	json_decref(r);
	assert_int_equal(calls, 2);
	json_decref(p);
	ctrl_admin_stop(a);
	/* The socket file goes with the server. */
	assert_int_not_equal(access(g_sock, F_OK), 0);
}

static void errors_come_back_as_messages_not_silence(void **state)
{
	char err[256];
	int calls = 0;
	struct ctrl_admin *a = ctrl_admin_start(g_sock, 0660, err, sizeof(err));
	json_t *r;

	(void)state;
	assert_non_null(a);
	ctrl_admin_register(a, "/sched/stages", "", cmd_echo, &calls);
	ctrl_admin_register(a, "/dp/stages", "", cmd_echo, &calls);
	ctrl_admin_register(a, "/sched/grow", "", cmd_fail, NULL);
	assert_int_equal(ctrl_admin_call(g_sock, "stages", NULL, &r, 2000, err, sizeof(err)), 0);
	assert_false(json_is_true(json_object_get(r, "ok")));
	assert_non_null(strstr(json_string_value(json_object_get(r, "error")), "ambiguous"));
	assert_non_null(strstr(json_string_value(json_object_get(r, "error")), "/dp/stages"));
	json_decref(r);
	assert_int_equal(ctrl_admin_call(g_sock, "/nope/x", NULL, &r, 2000, err, sizeof(err)), 0);
	assert_non_null(strstr(json_string_value(json_object_get(r, "error")), "unknown command"));
	json_decref(r);
	assert_int_equal(ctrl_admin_call(g_sock, "grow", NULL, &r, 2000, err, sizeof(err)), 0);
	assert_string_equal(json_string_value(json_object_get(r, "error")), "pool is exhausted: raise kv_blocks");
	json_decref(r);
	assert_int_equal(ctrl_admin_call(g_sock, "help", NULL, &r, 2000, err, sizeof(err)), 0);
	assert_int_equal(json_array_size(json_object_get(r, "data")), 4);
	json_decref(r);
	assert_int_equal(calls, 0);
	ctrl_admin_stop(a);
}

static void a_second_daemon_cannot_take_a_live_socket_but_may_take_a_stale_one(void **state)
{
	char err[256];
	struct ctrl_admin *a = ctrl_admin_start(g_sock, 0660, err, sizeof(err)), *b;
	FILE *f;

	(void)state;
	assert_non_null(a);
	b = ctrl_admin_start(g_sock, 0660, err, sizeof(err));
	assert_null(b);
	assert_int_equal(errno, EADDRINUSE);
	assert_non_null(strstr(err, "already answers"));
	ctrl_admin_stop(a);
	/* A leftover file from a crashed daemon is replaced. */
	f = fopen(g_sock, "w");
	fclose(f);
	a = ctrl_admin_start(g_sock, 0660, err, sizeof(err));
	assert_non_null(a);
	ctrl_admin_stop(a);
}

static int run_ctrlctl(char *out, size_t cap, const char *fmt, ...)
{
	char args[512], cmd[1024];
	va_list ap;
	FILE *p;
	size_t n;
	int st;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof(cmd), "%s %s 2>&1", g_ctrlctl, args);
	p = popen(cmd, "r");
	assert_non_null(p);
	n = fread(out, 1, cap - 1, p);
	out[n] = 0;
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void ctrlctl_says_the_daemon_is_not_running_and_exits_nonzero(void **state)
{
	char out[4096];

	(void)state;
	assert_int_equal(run_ctrlctl(out, sizeof(out), "--socket %s status", g_sock), 3);
	assert_non_null(strstr(out, "kvferry-ctrld is not running"));
	assert_non_null(strstr(out, g_sock));
	assert_non_null(strstr(out, "systemctl start kvferry-ctrld"));
	/* The socket path can come from the environment too. */
	setenv("KVFERRY_ADMIN_SOCKET", g_sock, 1);
	assert_int_equal(run_ctrlctl(out, sizeof(out), "status"), 3);
	assert_non_null(strstr(out, g_sock));
	unsetenv("KVFERRY_ADMIN_SOCKET");
	assert_int_equal(run_ctrlctl(out, sizeof(out), ""), 2);
}

static void ctrlctl_prints_tables_for_people_and_json_for_scripts(void **state)
{
	char err[256], out[8192];
	int calls = 0;
	struct ctrl_admin *a = ctrl_admin_start(g_sock, 0660, err, sizeof(err));
	json_t *j;

	(void)state;
	assert_non_null(a);
	ctrl_admin_register(a, "/sched/stages", "per-stage counters", cmd_echo, &calls);
	ctrl_admin_register(a, "/sched/grow", "", cmd_fail, NULL);
	assert_int_equal(run_ctrlctl(out, sizeof(out), "--socket %s stages limit=2", g_sock), 0);
	/* A header row with both columns, then one row per stage. */
	assert_non_null(strstr(out, "stage  state"));
	assert_non_null(strstr(out, "1      idle"));
	assert_non_null(strstr(out, "cmd"));
	assert_int_equal(run_ctrlctl(out, sizeof(out), "--socket %s --json stages limit=2", g_sock), 0);
	j = json_loads(out, 0, NULL);
	assert_non_null(j);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(json_object_get(j, "data"), "params"), "limit")), 2);
	json_decref(j);
	assert_int_equal(run_ctrlctl(out, sizeof(out), "--socket %s grow", g_sock), 1);
	assert_non_null(strstr(out, "raise kv_blocks"));
	ctrl_admin_stop(a);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(commands_answer_by_full_name_and_by_bare_verb),
		cmocka_unit_test(errors_come_back_as_messages_not_silence),
		cmocka_unit_test(a_second_daemon_cannot_take_a_live_socket_but_may_take_a_stale_one),
		cmocka_unit_test(ctrlctl_says_the_daemon_is_not_running_and_exits_nonzero),
		cmocka_unit_test(ctrlctl_prints_tables_for_people_and_json_for_scripts),
	};

	if (argc < 2) {
		fprintf(stderr, "usage: %s CTRLCTL\n", argv[0]);
		return 1;
	}
	g_ctrlctl = argv[1];
	return cmocka_run_group_tests(tests, setup, teardown);
}
