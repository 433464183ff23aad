/* SPDX-License-Identifier: Apache-2.0 */
/* Private to a ctrld's PD service: pd_serve.c (the rooms' ends, the
 * poller, the forwards to prefill nodes, the HTTP backend) and
 * pd_serve_view.c (what /stats and ctrlctl show of it, pd release and
 * restore). */
#ifndef CTRL_PD_SERVE_INT_H
#define CTRL_PD_SERVE_INT_H

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <jansson.h>

#include "ctrl_pd.h"
#include "ctrl_pd_link.h"
#include "ctrl_pd_serve.h"
#include "ctrl_pd_xfer.h"

/* What the decode end learned of a prefill node from its bootstrap routes. */
struct pd_node {
	int ready;
	int32_t dp_node, api_port;
	char host[128];            /* of its bootstrap address */
	char err[384];             /* why it is not usable */
};

/* A prompt on its way to a prefill node's API. */
struct pd_fwd {
	struct pd_fwd *next;
	uint64_t room;
	int32_t peer;              /* the prefill node's index */
	char *body;
	char url[300];
	CURL *e;
	struct curl_slist *hd;
	char errbuf[CURL_ERROR_SIZE];
};

struct ctrl_pd_serve {
	struct ctrl_pd_serve_opts o;
	pthread_mutex_t mu;
	struct ctrl_pd_link *link;
	struct shm_region *own;    /* the link's region when ctrld attached it (not the chain's) */
	struct shm_region *retired; /* the region before the last re-attach, unmapped at the next */
	int own_pinned, retired_pinned; /* registered with CUDA (ctrl_pd_serve_opts.pin_cuda) */
	struct pd_wrap *wraps;     /* the decode end's requests (pd_serve.c), under mu */
	uint64_t t_region;         /* when the poller last checked the region was still the dataplane's */
	struct ctrl_pd_link_handlers h;
	pthread_t th;
	int started;
	atomic_int stop;
	/* prefill */
	struct ctrl_pd_prefill *pre;
	/* decode */
	struct ctrl_rooms *rooms;
	struct ctrl_pd_decode *dec;
	struct ctrl_pd_peers *peers;
	struct pd_node node[CTRL_PD_MAX_PEERS];
	uint32_t session;
	int released;              /* ctrlctl pd release: no new rooms until restore */
	CURLM *multi;
	struct pd_fwd *fwd_new;    /* queued by the HTTP threads (under mu) */
	struct pd_fwd *fwd_run;    /* in the multi handle (poller thread only) */
	int fwd_running;
	uint64_t forward_failures;
	uint64_t nodes_lost;       /* prefill nodes the heartbeat lost, cumulative */
	/* what the poller watches of the dataplanes, to say so at once (watch()) */
	int dp_slot;               /* this node's kvferry-dataplane's live slot, -1: not seen yet or gone */
	int32_t dp_pid;
	uint64_t dp_deaths;        /* this node's dataplane seen dead, cumulative */
	uint8_t peer_silent[CTRL_PD_MAX_PEERS]; /* decode: that prefill node's dataplane is silent now */
	uint8_t peer_gone[CTRL_PD_MAX_PEERS];   /* ... past the rooms' give-up: it gets no new room */
	uint64_t peer_silences;    /* decode: prefill nodes' dataplanes gone silent, cumulative */
	/* decode, stages in worker processes ([pd] worker_rx): each takes its own pages (routes()) */
	int rx_on;                 /* the rooms area is made: stages are asked to route their streams */
	uint64_t t_routes;         /* when routes() last looked */
	int route_rc[CTRL_CHAIN_MAX_STAGES]; /* each stage's last answer (logged when it changes) */
	uint64_t route_no[CTRL_CHAIN_MAX_STAGES]; /* 1 + the chain generation in which the stage said it
						   * cannot take its pages (-ENOTSUP): not asked again until then */
};

/* pd_serve_view.c */

/* The HTTP backend's stats (ctrl_http_backend.stats): the base backend's,
 * with a "pd" object of this end's rooms, counters and prefill nodes. */
json_t *pd_serve_stats(void *ctx);

#endif /* CTRL_PD_SERVE_INT_H */
