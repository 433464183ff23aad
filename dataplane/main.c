/* SPDX-License-Identifier: Apache-2.0 */
/* kvferry-dataplane: configuration (dp_cfg.c) → dp_opts, signals → stop flag, dp_run(). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp.h"
#include "kvf_cfg.h"
#include "kvf_log.h"

static volatile sig_atomic_t g_stop, g_outage;

static void on_signal(int sig)
{
	(void)sig;
	g_stop = 1;
}

/* Test-only (with --impair): SIGUSR1 starts an outage, SIGUSR2 ends it. */
static void on_outage(int sig)
{
	g_outage = sig == SIGUSR1;
}

int main(int argc, char **argv)
{
	struct dp_opts o;
	/* Logs go to files under the serving scripts: line-buffer them so
	 * "peer up" shows when it happens, not at exit. DPDK logs to stdout. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	setvbuf(stderr, NULL, _IOLBF, 0);
	struct cfg *cfg = NULL;
	char err[600];
	int impair_given = 0;
	int rc = dp_cfg_load(argc, argv, &o, &cfg, &impair_given, err, sizeof(err));
	if (rc != 0) {
		cfg_free(cfg);
		if (rc > 0)
			return 0;
		kvf_log(KVF_LOG_ERR, "kvferry-dataplane", "%s", err);
		return 2;
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN); /* a closed log pipe or socket is an error return, not the end */
	kvf_log_crash_trace("kvferry-dataplane"); /* a crash leaves its frames in the journal */
	if (impair_given) {
		sa.sa_handler = on_outage;
		sigaction(SIGUSR1, &sa, NULL);
		sigaction(SIGUSR2, &sa, NULL);
		o.outage = &g_outage;
	}
	int r = dp_run(&o, &g_stop);
	cfg_free(cfg);
	return r ? 1 : 0;
}
