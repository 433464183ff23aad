/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file ctrl_pd_serve.h
 * The PD side of a running kvferry-ctrld: its dataplane link, one end of
 * its rooms (ctrl_pd_xfer.h) and the thread that polls the link.
 *
 * role = prefill: a completion that carries bootstrap_room (the decode
 * node or a router sent it) is prefilled with its KV held; once the decode
 * node's manifest for that room comes over the dataplane the pages go to
 * it from this node's chain, then the status with the first token. Other
 * requests are served as usual.
 *
 * role = decode: a client's request picks the healthy prefill node with the
 * fewest rooms in flight ([pd] prefill: their bootstrap addresses; the
 * parallel info there names each one's dataplane node and API port, and
 * its page layout must be this node's), opens a room, reserves its pages,
 * sends the manifest and forwards the prompt (token ids) to the prefill
 * node's /v1/completions with the room; it decodes once the pages and the
 * status are in. A request that carries bootstrap_room itself (a router
 * drives the pair) uses that room and the prefill node its bootstrap_host
 * names, and nothing is forwarded. Heartbeats read each prefill node's
 * /health; a lost node fails exactly its unfinished rooms.
 *
 * Pages move from and to the in-process chain; a node whose stages run in
 * worker processes fails its rooms naming that (pages from workers are the
 * next step).
 *
 * Threading: one mutex covers the room end, the rooms, the peers and the
 * link; the poller thread, the scheduler's callbacks and the HTTP threads
 * take it.
 */
#ifndef CTRL_PD_SERVE_H
#define CTRL_PD_SERVE_H

#include <stdint.h>

#include "ctrl_http.h"
#include "ctrl_pd_boot.h"
#include "ctrl_sched.h"

#ifdef __cplusplus
extern "C" {
#endif

enum ctrl_pd_serve_role { CTRL_PD_SERVE_PREFILL = 1, CTRL_PD_SERVE_DECODE = 2 };

struct ctrl_pd_serve_opts {
	int role;                       /**< enum ctrl_pd_serve_role */
	const char *region;             /**< the region kvferry-dataplane created on this node */
	struct ctrl_sched *sched;       /**< where disaggregated requests run (one replica) */
	struct ctrl_chain *chain;       /**< its chain: pages are read from / written into it */
	int32_t n_stages;
	uint32_t rank;                  /**< prefill: this node's rank in a room */
	int32_t page_buffers;           /**< prefill: KV page messages on their way at once (0: 16) */
	struct ctrl_http_backend base;  /**< every other request (prefill) */
	/* decode */
	const char *prefill;            /**< "host:port, ..." the prefill nodes' bootstrap routes */
	const char *model_name;         /**< what the forwarded prompt names */
	struct ctrl_pd_info local;      /**< this node's layout: a prefill node's must match */
	double heartbeat_s;             /**< between two /health probes of a node (>= 2) */
	int32_t heartbeat_failures;     /**< misses in a row that lose a node */
	double room_timeout_s;          /**< a room not done in this time fails */
	int32_t vocab_size;             /**< first tokens must be below it */
	uint32_t room_retries;          /**< fresh rooms for a request whose room a dataplane restart lost */
	int worker_rx;                  /**< decode: stages in worker processes take their own KV pages */
	int first_early;                /**< decode: a room's first token goes out when it succeeds, not
	                                     when its last page landed */
	/** non-NULL: the stages run in this process on CUDA; the region, where
	 * their pages are copied to and from, is pinned (cudaHostRegister) with
	 * this module ("" finds it). Pageable, each page copy went through the
	 * driver's bounce buffer while the stage's step waited. */
	const char *pin_cuda;
};

struct ctrl_pd_serve;
struct shm_region;

/** @return the service (its poller running), or NULL with @p err (no dataplane on the region...). */
struct ctrl_pd_serve *ctrl_pd_serve_start(const struct ctrl_pd_serve_opts *o, char *err, size_t errlen);

/** The HTTP backend: prefill routes bootstrap_room requests here and the rest to base; decode takes all. */
void ctrl_pd_serve_backend(struct ctrl_pd_serve *s, struct ctrl_http_backend *be);

struct ctrl_admin;

/** Register `ctrlctl rooms` (/pd/rooms) on @p a. @return 0 or -errno. */
int ctrl_pd_serve_admin_register(struct ctrl_pd_serve *s, struct ctrl_admin *a);

/** This node's dataplane node id (what other nodes address), or -1. */
int32_t ctrl_pd_serve_node(const struct ctrl_pd_serve *s);

/** The dataplane's region as the service maps it (its stats area), or NULL. */
struct shm_region *ctrl_pd_serve_region(const struct ctrl_pd_serve *s);

/** Stop the poller and free everything (NULL is a no-op); the scheduler must be stopped first. */
void ctrl_pd_serve_stop(struct ctrl_pd_serve *s);

#ifdef __cplusplus
}
#endif
#endif /* CTRL_PD_SERVE_H */
