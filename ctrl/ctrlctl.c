/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ctrlctl: the operator's tool for kvferry-ctrld. Sends one admin command
 * over the Unix socket and prints the reply as tables (or raw JSON with
 * --json, for scripts).
 *
 *   ctrlctl [--socket PATH] [--json] [--wide] COMMAND [key=value ...]
 *
 * Exit status: 0 the command succeeded, 1 the daemon refused it, 2 usage,
 * 3 the daemon is not running (no socket, or nobody answering).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrl_admin.h"
#include "ctrlctl_doctor.h"
#include "kvf_config.h"
#include "ctrl_config.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: ctrlctl [--socket PATH] [--config PATH] [--json] [--wide] COMMAND [key=value ...]\n"
		   "commands (ctrlctl help lists what the running daemon offers):\n"
		   "  status    daemon, model and load summary\n"
		   "  stages    per-stage steps, columns, busy time, pipeline occupancy\n"
		   "  requests  requests in flight\n"
		   "  pool      KV block pool per replica\n"
		   "  peers     dataplane peers: link state, RTT, credit, traffic, loss\n"
		   "  bootstrap PD role; on a prefill node the bootstrap routes' port, ranks, counters\n"
		   "  rooms     PD rooms in flight (decode: prefill node, state, age; prefill: KV held)\n"
		   "  pd release / pd restore  a decode node stops opening rooms (refused while any can\n"
		   "            still land) / opens them again under a fresh session id\n"
		   "  config    effective configuration and where each value came from\n"
		   "  drain     stop admitting requests (503), finish those in flight\n"
		   "  resume    admit requests again\n"
		   "  doctor    check this node without the daemon: hugepages, NIC, memlock, model, ports,\n"
		   "            runtime directory, GPU; each OK / WARN / FAIL with the fix (exit 1 on a FAIL)\n"
		   "The socket is admin_socket from " CTRL_CONFIG_PATH ", KVFERRY_ADMIN_SOCKET or --socket.\n");
}

/* Columns a person rarely needs in a table; --wide or --json shows them. */
static int narrow_skip(const char *col)
{
	return !strcmp(col, "help") || !strcmp(col, "env") || !strcmp(col, "default") ||
	       !strcmp(col, "section");
}

static void cell(const json_t *v, char *buf, size_t n)
{
	if (json_is_string(v))
		snprintf(buf, n, "%s", json_string_value(v));
	else if (json_is_integer(v))
		snprintf(buf, n, "%lld", (long long)json_integer_value(v));
	else if (json_is_real(v))
		snprintf(buf, n, "%.3f", json_real_value(v));
	else if (json_is_boolean(v))
		snprintf(buf, n, "%s", json_is_true(v) ? "yes" : "no");
	else if (json_is_null(v) || !v)
		snprintf(buf, n, "-");
	else {
		char *s = json_dumps(v, JSON_COMPACT);
		snprintf(buf, n, "%s", s ? s : "?");
		free(s);
	}
}

/* An array of objects as a table: one column per key of the first row. */
static void print_rows(const json_t *arr, int wide)
{
	const char *cols[32];
	size_t width[32], ncol = 0, i;
	json_t *row, *first = json_array_get(arr, 0), *v;
	const char *k;
	char buf[256];

	if (!json_is_object(first)) {
		json_array_foreach(arr, i, row) {
			cell(row, buf, sizeof(buf));
			printf("%s\n", buf);
		}
		return;
	}
	json_object_foreach(first, k, v) {
		if (ncol < 32 && (wide || !narrow_skip(k)) && !json_is_array(v) && !json_is_object(v)) {
			cols[ncol] = k;
			width[ncol++] = strlen(k);
		}
	}
	json_array_foreach(arr, i, row)
		for (size_t c = 0; c < ncol; c++) {
			cell(json_object_get(row, cols[c]), buf, sizeof(buf));
			if (strlen(buf) > width[c])
				width[c] = strlen(buf);
		}
	for (size_t c = 0; c < ncol; c++)
		printf("%-*s%s", (int)width[c], cols[c], c + 1 < ncol ? "  " : "\n");
	for (size_t c = 0; c < ncol; c++) {
		for (size_t w = 0; w < width[c]; w++)
			putchar('-');
		printf("%s", c + 1 < ncol ? "  " : "\n");
	}
	json_array_foreach(arr, i, row)
		for (size_t c = 0; c < ncol; c++) {
			cell(json_object_get(row, cols[c]), buf, sizeof(buf));
			printf("%-*s%s", (int)width[c], buf, c + 1 < ncol ? "  " : "\n");
		}
}

/* An object: its scalars as key/value lines, then each nested part titled. */
static void print_data(const json_t *d, const char *title, int wide)
{
	const char *k;
	json_t *v;
	size_t w = 0;
	char buf[512];

	if (json_is_array(d)) {
		if (title)
			printf("\n%s:\n", title);
		if (!json_array_size(d))
			printf("(none)\n");
		else
			print_rows(d, wide);
		return;
	}
	if (!json_is_object(d)) {
		cell(d, buf, sizeof(buf));
		printf("%s\n", buf);
		return;
	}
	if (title)
		printf("\n%s:\n", title);
	json_object_foreach((json_t *)d, k, v)
		if (!json_is_object(v) && !json_is_array(v) && strlen(k) > w)
			w = strlen(k);
	json_object_foreach((json_t *)d, k, v) {
		if (json_is_object(v) || json_is_array(v))
			continue;
		cell(v, buf, sizeof(buf));
		printf("%-*s  %s\n", (int)w, k, buf);
	}
	json_object_foreach((json_t *)d, k, v) {
		char t[128];
		if (!json_is_object(v) && !json_is_array(v))
			continue;
		snprintf(t, sizeof(t), "%s%s%s", title ? title : "", title ? "." : "", k);
		print_data(v, t, wide);
	}
}

static json_t *parse_value(const char *s)
{
	char *end;
	long long i;
	double d;

	if (!strcmp(s, "true"))
		return json_true();
	if (!strcmp(s, "false"))
		return json_false();
	i = strtoll(s, &end, 10);
	if (*s && !*end)
		return json_integer(i);
	d = strtod(s, &end);
	if (*s && !*end)
		return json_real(d);
	return json_string(s);
}

static const char *default_socket(void)
{
	static char path[CTRL_CFG_STRLEN];
	struct ctrl_config *c = ctrl_config_new();
	const char *env = getenv("KVFERRY_ADMIN_SOCKET");
	char err[512];

	snprintf(path, sizeof(path), "%s", CTRL_ADMIN_PATH);
	if (!c)
		return path;
	if (ctrl_config_load_file(c, getenv("KVFERRY_CONFIG") ? getenv("KVFERRY_CONFIG") : CTRL_CONFIG_PATH, 0,
				  err, sizeof(err)) == 0)
		snprintf(path, sizeof(path), "%s", ctrl_config_settings(c)->admin_socket);
	if (env && *env)
		snprintf(path, sizeof(path), "%s", env);
	ctrl_config_free(c);
	return path;
}

int main(int argc, char **argv)
{
	const char *sock = NULL, *cmd = NULL;
	char two_word[128];
	int as_json = 0, wide = 0, i, rc;
	json_t *params = json_object(), *reply;
	char err[512];

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--version")) {
			printf("ctrlctl %s\n", KVF_VERSION);
			json_decref(params);
			return 0;
		}
		if (!strcmp(argv[i], "--json"))
			as_json = 1;
		else if (!strcmp(argv[i], "--wide"))
			wide = 1;
		else if (!strcmp(argv[i], "--config") && i + 1 < argc)
			setenv("KVFERRY_CONFIG", argv[++i], 1); /* the socket's and the doctor's configuration */
		else if (!strcmp(argv[i], "--socket") && i + 1 < argc)
			sock = argv[++i];
		else if (!strncmp(argv[i], "--socket=", 9))
			sock = argv[i] + 9;
		else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			json_decref(params);
			return 0;
		} else if (argv[i][0] == '-') {
			fprintf(stderr, "ctrlctl: unknown option '%s'\n", argv[i]);
			usage(stderr);
			json_decref(params);
			return 2;
		} else if (!cmd)
			cmd = argv[i];
		else if (!strchr(argv[i], '=') && !strchr(cmd, '/') && cmd != two_word) {
			/* "pd release": a module's command in two words, the daemon's /pd/release */
			if (strlen(cmd) + strlen(argv[i]) + 3 > sizeof(two_word)) {
				fprintf(stderr, "ctrlctl: command '%s %s' is too long\n", cmd, argv[i]);
				json_decref(params);
				return 2;
			}
			strcpy(two_word, "/");
			strcat(strcat(strcat(two_word, cmd), "/"), argv[i]);
			cmd = two_word;
		} else {
			char *eq = strchr(argv[i], '=');
			if (!eq) {
				fprintf(stderr, "ctrlctl: argument '%s' is not key=value\n", argv[i]);
				json_decref(params);
				return 2;
			}
			*eq = 0;
			json_object_set_new(params, argv[i], parse_value(eq + 1));
		}
	}
	if (!cmd) {
		usage(stderr);
		json_decref(params);
		return 2;
	}
	if (!strcmp(cmd, "doctor")) {
		json_decref(params);
		return ctrlctl_doctor(argc, argv, as_json);
	}
	if (!sock)
		sock = default_socket();
	rc = ctrl_admin_call(sock, cmd, params, &reply, 10000, err, sizeof(err));
	json_decref(params);
	if (rc == -ENOENT || rc == -ECONNREFUSED) {
		fprintf(stderr, "kvferry-ctrld is not running (%s at %s): start it with systemctl start kvferry-ctrld\n",
			rc == -ENOENT ? "no socket" : "nobody answers", sock);
		return 3;
	}
	if (rc == -EACCES) {
		fprintf(stderr, "ctrlctl: permission denied on %s: run as root or as a member of the kvferry group\n", sock);
		return 3;
	}
	if (rc) {
		fprintf(stderr, "ctrlctl: %s\n", err);
		return 3;
	}
	if (as_json) {
		char *s = json_dumps(reply, JSON_INDENT(2));
		printf("%s\n", s ? s : "null");
		free(s);
	} else if (json_is_true(json_object_get(reply, "ok"))) {
		print_data(json_object_get(reply, "data"), NULL, wide);
	}
	if (!json_is_true(json_object_get(reply, "ok"))) {
		fprintf(stderr, "ctrlctl: %s: %s\n", json_string_value(json_object_get(reply, "cmd")),
			json_string_value(json_object_get(reply, "error")));
		json_decref(reply);
		return 1;
	}
	json_decref(reply);
	return 0;
}
