/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: kvferry.conf as each daemon reads it, through the
 * floor's engine (shm/floor/cfg.c: sections, instances' sections, quoting,
 * typed values, ranges) and each daemon's own table and checks:
 * kvferry-ctrld's (ctrl/config_table.c: ctrl_config_load_file(), then
 * ctrl_config_check() and the /ctrl/config view), kvferry-worker's
 * (wk_load_opts() with --instance, which reads [worker] then
 * [worker.stage1]) and kvferry-dataplane's (dp_cfg_load(): peers, impair,
 * pools, the address).
 *
 * Input: byte 0 picks the daemon (mod 3); the rest is the file, which each
 * reader opens by path: it lies in a memfd, rewritten for each input.
 *
 * Beyond the sanitizers: every refusal says why.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ctrl_config.h"
#include "dp.h"
#include "worker_cfg.h"

static int g_fd = -1;
static char g_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	g_fd = memfd_create("kvferry.conf", MFD_CLOEXEC);
	if (g_fd < 0) {
		perror("fuzz_ini: memfd_create");
		exit(1);
	}
	snprintf(g_path, sizeof(g_path), "/proc/self/fd/%d", g_fd);
	/* the daemons read KVFERRY_* too: none may come from the caller */
	unsetenv("KVFERRY_CONFIG");
	return 0;
}

static void ctrld(void)
{
	struct ctrl_config *c = ctrl_config_new();
	char err[1024] = "";
	json_t *j;

	if (!c)
		abort();
	if (ctrl_config_load_file(c, g_path, 1, err, sizeof(err)) == 0) {
		if (ctrl_config_check(c, err, sizeof(err)) && !err[0])
			abort();
		j = ctrl_config_json(c);
		if (!j)
			abort();
		json_decref(j);
	} else if (!err[0]) {
		abort();
	}
	ctrl_config_free(c);
}

static void worker(void)
{
	char *argv[] = {"kvferry-worker", "--config", g_path, "--instance", "stage1", NULL};
	char err[1024] = "";
	struct wk_opts o;
	struct cfg *c = NULL;

	if (wk_load_opts(5, argv, 2, &o, &c, err, sizeof(err)) < 0 && !err[0])
		abort();
	cfg_free(c);
}

static void dataplane(void)
{
	char *argv[] = {"kvferry-dataplane", "--config", g_path, NULL};
	char err[1024] = "";
	struct dp_opts o;
	struct cfg *c = NULL;
	int impair;

	if (dp_cfg_load(3, argv, &o, &c, &impair, err, sizeof(err)) < 0 && !err[0])
		abort();
	cfg_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	if (ftruncate(g_fd, 0) || pwrite(g_fd, data + 1, size - 1, 0) != (ssize_t)(size - 1))
		abort();
	switch (data[0] % 3) {
	case 0: ctrld(); break;
	case 1: worker(); break;
	default: dataplane(); break;
	}
	return 0;
}
