/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file ctrl_pd_serve.h
 * The PD side of a running kvferry-ctrld: its dataplane link, the prefill
 * end of its rooms (ctrl_pd_xfer.h) and the thread that polls the link.
 *
 * role = prefill: a completion that carries bootstrap_room (the decode
 * node or a router sent it) is prefilled with its KV held; once the decode
 * node's manifest for that room comes over the dataplane the pages go to
 * it from this node's chain, then the status with the first token. Other
 * requests are served as usual. The pages move from the in-process chain;
 * a node whose stages run in worker processes reports a failed status
 * naming that (pages from workers are the next step).
 *
 * Threading: one mutex covers the prefill end and the link; the poller
 * thread, the scheduler's callbacks and the HTTP threads take it.
 */
#ifndef CTRL_PD_SERVE_H
#define CTRL_PD_SERVE_H

#include <stdint.h>

#include "ctrl_http.h"
#include "ctrl_sched.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ctrl_pd_serve_opts {
	const char *region;             /**< the region kvferry-dataplane created on this node */
	struct ctrl_sched *sched;       /**< where disaggregated requests run (one replica) */
	struct ctrl_chain *chain;       /**< its chain: pages are read from it */
	int32_t n_stages;
	uint32_t rank;                  /**< this node's rank in a room */
	struct ctrl_http_backend base;  /**< every other request */
};

struct ctrl_pd_serve;

/** @return the service (its poller running), or NULL with @p err (no dataplane on the region...). */
struct ctrl_pd_serve *ctrl_pd_serve_start(const struct ctrl_pd_serve_opts *o, char *err, size_t errlen);

/** The HTTP backend that routes bootstrap_room requests here and the rest to base. */
void ctrl_pd_serve_backend(struct ctrl_pd_serve *s, struct ctrl_http_backend *be);

/** This node's dataplane node id (what decode nodes address), or -1. */
int32_t ctrl_pd_serve_node(const struct ctrl_pd_serve *s);

/** Stop the poller and free everything (NULL is a no-op); the scheduler must be stopped first. */
void ctrl_pd_serve_stop(struct ctrl_pd_serve *s);

#ifdef __cplusplus
}
#endif
#endif /* CTRL_PD_SERVE_H */
