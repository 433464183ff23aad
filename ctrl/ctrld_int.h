/* SPDX-License-Identifier: Apache-2.0 */
/* Private to kvferry-ctrld: ctrld.c (the daemon's life: configuration,
 * model, pipelines, front ends, the poll loop, drain and teardown) and
 * ctrld_admin.c (its own admin commands). */
#ifndef CTRL_CTRLD_INT_H
#define CTRL_CTRLD_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#if __has_include(<systemd/sd-daemon.h>)
#include <systemd/sd-daemon.h>
#else
static inline int sd_notify(int unset, const char *state)
{
	(void)unset;
	(void)state;
	return 0;
}
static inline int sd_notifyf(int unset, const char *fmt, ...)
{
	(void)unset;
	(void)fmt;
	return 0;
}
#endif

#include "ctrl_admin.h"
#include "ctrl_chain.h"
#include "ctrl_config.h"
#include "ctrl_http.h"
#include "ctrl_pd_boot.h"
#include "ctrl_pd_serve.h"
#include "ctrl_sched.h"
#include "kn_model.h"
#include "kn_tok.h"
#include "kvf_log.h"

struct daemon {
	double spin_s;                /* poll_spin_us, resolved for the backend */
	struct ctrl_config *cfg;
	const struct ctrl_settings *set;
	struct kn_model *model;
	struct kn_tok *tok;
	char model_name[CTRL_CFG_STRLEN];
	int32_t max_context;
	int32_t n_stages;
	int32_t ends[CTRL_CFG_MAX_STAGES];
	int n_rep;
	struct ctrl_chain *chains[CTRL_DISPATCH_MAX];
	char wk_names[CTRL_DISPATCH_MAX][3][32]; /* worker replicas: prefix, first ring, return ring */
	struct ctrl_sched *scheds[CTRL_DISPATCH_MAX];
	struct ctrl_dispatch *disp;
	struct ctrl_http *http;
	struct ctrl_admin *admin;
	struct ctrl_pd_boot *pd_boot;         /* role = prefill: this node's ranks ... */
	struct ctrl_pd_boot_server *pd_srv;   /* ... and the routes that answer for them */
	struct ctrl_pd_serve *pd;             /* role = prefill with a dataplane: rooms' KV out */
	struct ctrl_sched_view sv;            /* what /sched/stages and /sched/pool read */
	double t0;
	atomic_int stopping;
	atomic_int stop_poller;
	/* readiness (GET /health, /readyz): the last answer, kept READY_KEEP_S */
	pthread_mutex_t ready_mu;
	int ready;
	char ready_why[512];
	double ready_at;
};

/* One line on stderr at its syslog priority (kvf_log.h): under systemd it
 * starts with <3> error, <4> warning, <6> info, which journald takes as the
 * entry's priority, so `journalctl -p err` shows the errors; in a terminal
 * the lines stay plain. */
#define logmsg(...) kvf_log(KVF_LOG_INFO, "kvferry-ctrld", __VA_ARGS__)
#define logwarn(...) kvf_log(KVF_LOG_WARNING, "kvferry-ctrld", __VA_ARGS__)
#define logerr(...) kvf_log(KVF_LOG_ERR, "kvferry-ctrld", __VA_ARGS__)

/* ctrld_admin.c */

/* Register the daemon's own commands (/ctrl/status, /dp/peers, /ctrl/drain,
 * /ctrl/resume) and each module's views on @p d's admin socket.
 * @return 0 or -errno from ctrl_admin_register(). */
int ctrld_admin_register(struct daemon *d);

/* This node's dataplane (its stats area) as /stats "dataplane" and ctrlctl
 * peers show it: a new object, or NULL without a dataplane (@p arg: the
 * daemon; an HTTP thread or the admin socket's may call it). */
json_t *ctrld_dataplane_json(void *arg);

#endif /* CTRL_CTRLD_INT_H */
