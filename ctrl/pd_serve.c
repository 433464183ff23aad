/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A ctrld's PD service (ctrl_pd_serve.h): one end of the rooms over the
 * node's dataplane link, behind the HTTP backend interface. The decode end
 * also forwards each prompt to its prefill node's API (libcurl multi, on the
 * poller thread) and probes the prefill nodes' /health. What operators see
 * of it (/stats, ctrlctl rooms / pd release / pd restore) is in
 * pd_serve_view.c.
 */
#include <curl/curl.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "ctrl_pd.h"
#include "dp_ipc.h"
#include "kvf_log.h"
#include "ctrl_pd_link.h"
#include "ctrl_proc_chain.h"
#include "ctrl_pd_serve.h"
#include "ctrl_pd_xfer.h"
#include "kn_stage.h"
#include "kvf_clock.h"
#include "pd_serve_int.h"
#include "shm_live.h"
#include "shm_region.h"

/* prefill: @p node is the decode node's dataplane id (the manifest's sender);
 * decode: the prefill node's index in [pd] prefill (what the rooms and the
 * heartbeat count by), whose dataplane id its bootstrap info gave */
static int send_ctl(void *arg, uint32_t node, const uint8_t *m, size_t len)
{
	struct ctrl_pd_serve *s = arg;

	if (s->dec != NULL) {
		if (node >= CTRL_PD_MAX_PEERS || !s->node[node].ready)
			return -EHOSTUNREACH;
		node = (uint32_t)s->node[node].dp_node;
	}
	return ctrl_pd_link_send_ctl(s->link, node, m, len);
}

static int ship(void *arg, uint32_t node, uint64_t room, uint32_t session, const int32_t *src, const uint32_t *dst,
		int32_t from, int32_t to, int last, char *err, size_t errlen)
{
	struct ctrl_pd_serve *s = arg;

	return ctrl_pd_link_ship(s->link, s->o.chain, s->o.n_stages, node, room, session, src, dst, from, to, last, err,
				 errlen);
}

static void on_control(void *arg, uint32_t node, const uint8_t *m, size_t len)
{
	struct ctrl_pd_serve *s = arg;

	if (s->pre != NULL)
		ctrl_pd_prefill_on_control(s->pre, node, m, len);
	else
		ctrl_pd_decode_on_control(s->dec, m, len);
}

static int expects(void *arg, uint64_t room, uint32_t session)
{
	struct ctrl_pd_serve *s = arg;

	return s->dec != NULL && ctrl_pd_decode_expects(s->dec, room, session);
}

static void on_pages(void *arg, uint64_t room, uint32_t session, int32_t stream, int last, uint32_t n_blocks,
		     uint64_t bytes)
{
	struct ctrl_pd_serve *s = arg;

	ctrl_pd_decode_on_pages(s->dec, room, session, stream, last, n_blocks, bytes);
}

static void on_refused(void *arg, uint64_t room, uint32_t session, const char *why)
{
	struct ctrl_pd_serve *s = arg;

	(void)session;
	ctrl_pd_decode_fail(s->dec, room, why);
}

static void on_lost(void *arg, uint64_t room, uint32_t session, const char *why)
{
	struct ctrl_pd_serve *s = arg;

	(void)session;
	if (s->dec != NULL)
		ctrl_pd_decode_pages_lost(s->dec, room, why);
}

static const char *node_name(void *arg, uint32_t node)
{
	struct ctrl_pd_serve *s = arg;

	return ctrl_pd_peer_addr(s->peers, (int32_t)node);
}

/* Prefill node @p node's dataplane as this node's sees it (rooms lost with
 * its session fail at once: ctrl_pd_decode_opts.peer_state). */
static int peer_state(void *arg, uint32_t node, uint64_t *epoch, uint64_t *silent_ms)
{
	struct ctrl_pd_serve *s = arg;

	if (node >= CTRL_PD_MAX_PEERS || !s->node[node].ready)
		return -ENOENT;
	return ctrl_pd_link_peer(s->link, (uint32_t)s->node[node].dp_node, epoch, silent_ms);
}

static int probe(void *arg, const char *addr, double timeout_s, char *err, size_t errlen)
{
	(void)arg;
	return ctrl_pd_health(addr, timeout_s, err, errlen);
}

static size_t sink(char *p, size_t size, size_t n, void *arg)
{
	(void)p;
	(void)arg;
	return size * n;
}

static void fwd_free(struct pd_fwd *f)
{
	if (f->e != NULL)
		curl_easy_cleanup(f->e);
	curl_slist_free_all(f->hd);
	free(f->body);
	free(f);
}

/* The decode end's forwards: start the queued ones, finish the done ones. */
static int forward_step(struct ctrl_pd_serve *s)
{
	struct pd_fwd *f, *next;
	CURLMsg *msg;
	int left, moved = 0;

	pthread_mutex_lock(&s->mu);
	f = s->fwd_new;
	s->fwd_new = NULL;
	pthread_mutex_unlock(&s->mu);
	for (; f != NULL; f = next) {
		next = f->next;
		f->next = s->fwd_run;
		s->fwd_run = f;
		curl_multi_add_handle(s->multi, f->e);
		moved = 1;
	}
	curl_multi_perform(s->multi, &s->fwd_running);
	while ((msg = curl_multi_info_read(s->multi, &left)) != NULL) {
		long code = 0;
		char why[768];

		if (msg->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&f);
		curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &code);
		if (msg->data.result != CURLE_OK || code != 200) {
			snprintf(why, sizeof(why), "forwarding the prompt to %s failed: %s", f->url,
				 msg->data.result != CURLE_OK ? (f->errbuf[0] ? f->errbuf : curl_easy_strerror(msg->data.result))
							      : "the prefill node did not answer 200");
			if (msg->data.result == CURLE_OK)
				snprintf(why + strlen(why), sizeof(why) - strlen(why), " (HTTP %ld)", code);
			pthread_mutex_lock(&s->mu);
			/* a refused or reset connection: the node's process is gone;
			 * waiting for its heartbeats to miss would send it every
			 * request meanwhile (its rooms end at once, so it always has
			 * the fewest) */
			if ((msg->data.result == CURLE_COULDNT_CONNECT || msg->data.result == CURLE_RECV_ERROR
			     || msg->data.result == CURLE_SEND_ERROR || msg->data.result == CURLE_GOT_NOTHING)
			    && ctrl_pd_peers_unreachable(s->peers, f->peer, why, s->rooms) > 0)
				s->nodes_lost++;
			/* the node answered, with a server error (its chain failed
			 * the prompt: a worker died, its dataplane restarted): the
			 * prompt is computed here, its client sees no error */
			if (msg->data.result == CURLE_OK && code >= 500
			    && ctrl_pd_decode_compute_here(s->dec, f->room, why) == 0)
				kvf_log(KVF_LOG_WARNING, "kvferry-ctrld", "PD: room %llu: %s: its prompt is computed on "
					"this node instead", (unsigned long long)f->room, why);
			else
				ctrl_pd_decode_fail(s->dec, f->room, why);
			s->forward_failures++;
			pthread_mutex_unlock(&s->mu);
		}
		curl_multi_remove_handle(s->multi, f->e);
		for (struct pd_fwd **pp = &s->fwd_run; *pp != NULL; pp = &(*pp)->next)
			if (*pp == f) {
				*pp = f->next;
				break;
			}
		fwd_free(f);
		moved = 1;
	}
	return moved;
}

/* Empty polls in a row after which the poller sleeps on the control ring
 * (up to PD_IDLE_WAIT_NS) instead of every 50 us: an idle node wakes ~1k
 * times a second, a busy one keeps its 50 us latency. */
#define PD_IDLE_POLLS 2000
#define PD_IDLE_WAIT_NS 1000000

#define PD_REGION_EVERY_NS 250000000ull

/* Pin ctrld's own mapping of the region, where the in-process CUDA stages
 * copy pages to and from (opts.pin_cuda). @return 1 if pinned; a failure
 * is logged (the copies still work, slower). */
static int pin(struct ctrl_pd_serve *s, struct shm_region *reg)
{
	char err[256];
	uint64_t t0 = kvf_mono_ns();

	if (s->o.pin_cuda == NULL || reg == NULL)
		return 0;
	if (kn_stage_pin(shm_region_base(reg), shm_region_size(reg), s->o.pin_cuda, err, sizeof(err)) < 0) {
		kvf_log(KVF_LOG_WARNING, "kvferry-ctrld", "PD: pinning region %s for the CUDA stages' page copies "
			"failed: %s (pages move through pageable memory, slower; check LimitMEMLOCK / ulimit -l)",
			s->o.region, err);
		return 0;
	}
	kvf_log(KVF_LOG_INFO, "kvferry-ctrld", "PD: pinned region %s (%.1f MiB) for the CUDA stages' page copies "
		"in %.1f ms", s->o.region, shm_region_size(reg) / 1048576.0, (double)(kvf_mono_ns() - t0) / 1e6);
	return 1;
}

static void unpin_detach(struct shm_region *reg, int pinned)
{
	if (reg != NULL && pinned)
		kn_stage_unpin(shm_region_base(reg));
	shm_region_detach(reg);
}

/*
 * This node's dataplane made its region again (it restarted): the link
 * still maps the old one, which nothing reads. Open a link on the new one
 * (the workers' chain's, once it re-attached: page copies need buffers in
 * its mapping) and close the old link; rooms in flight over the old one
 * lost their messages with the dataplane and fail by their timeouts or
 * the peer's loss. The old mapping is kept until the next re-attach (a view
 * may still be reading its stats area), then unmapped. A new region still
 * filling, or a chain not re-attached yet, is tried again at the next
 * check. Before this PD traffic needed a ctrld restart after its
 * dataplane's. Called by the poller with the lock held.
 */
static void relink(struct ctrl_pd_serve *s)
{
	struct shm_region *old = ctrl_pd_link_region(s->link), *reg, *own = NULL;
	struct ctrl_pd_link_opts lo;
	struct ctrl_pd_link *nl;
	char err[256];
	int n_failed = 0;

	if (!shm_region_replaced(old))
		return;
	reg = ctrl_proc_chain_region(s->o.chain);
	if (reg == NULL)
		reg = own = shm_region_attach(s->o.region, err, sizeof(err));
	if (reg == NULL || reg == old || shm_region_replaced(reg)) {
		if (reg != old)
			shm_region_detach(own);
		return;
	}
	ctrl_pd_link_opts_init(&lo);
	if (s->o.page_buffers > 0)
		lo.n_large = (uint32_t)s->o.page_buffers;
	lo.region = s->o.region;
	lo.reg = reg;
	lo.wait_s = 0.2; /* the lock is held: a region without its rings yet is tried again later */
	nl = ctrl_pd_link_open(&lo, err, sizeof(err));
	if (nl == NULL) {
		shm_region_detach(own);
		return;
	}
	ctrl_pd_link_close(s->link);
	s->link = nl;
	if (s->rx_on && ctrl_pd_link_rooms_open(nl) < 0)
		s->rx_on = 0; /* the new dataplane routes no stream: ctrld lands every page */
	s->dp_slot = -1; /* the new dataplane's slot is in the new region (watch()) */
	/* what they sent or waited for went down with the old dataplane */
	if (s->dec != NULL) { /* each runs again in a fresh room where it may ([pd] room_retries) */
		n_failed = ctrl_pd_decode_retry_all(s->dec, "this node's kvferry-dataplane restarted while the room "
						    "was in flight: its messages were lost (try the request again)");
		ctrl_pd_decode_resend_aborts(s->dec, CTRL_PD_ALL_NODES);
	}
	if (s->pre != NULL) /* their pages and statuses too: fail them now, their KV back at once */
		n_failed = ctrl_pd_prefill_fail_all(s->pre, "the prefill node's kvferry-dataplane restarted while the "
						    "room was in flight: its pages were lost (send the request again)");
	unpin_detach(s->retired, s->retired_pinned);
	s->retired = old; /* ours (s->own) or the chain's lent one, which the chain let go */
	s->retired_pinned = s->own_pinned;
	s->own = own;
	s->own_pinned = pin(s, own);
	kvf_log(KVF_LOG_WARNING, "kvferry-ctrld", "PD: region %s was re-created (this node's kvferry-dataplane "
		"restarted): its KV pages and control messages now use the new one; %d room(s) in flight failed",
		s->o.region, n_failed);
}

/* The decode end's requests in flight. Holds mu. */
static int n_rooms(const struct ctrl_pd_serve *s);

/*
 * Say at once what the dataplanes' own state already tells (both ends):
 * this node's kvferry-dataplane died (its live slot), or, on the decode end,
 * a prefill node's dataplane went silent. The rooms in flight then wait:
 * each runs again in a fresh room once the session is back as a new one
 * (ctrl_pd_decode_retry_all(), check_peer() in pd_decode.c), or fails
 * after CTRL_PD_PEER_GONE_MS; before this line an operator learnt of either
 * only from those later events (the PD fault drill: 1.5 and 4.1 s). Holds mu.
 */
static void watch(struct ctrl_pd_serve *s)
{
	struct shm_region *reg = ctrl_pd_link_region(s->link);

	if (s->dp_slot < 0 && reg != NULL && !shm_region_replaced(reg)) {
		int32_t pid = 0;
		int slot = shm_live_find_alive(reg, "dataplane", &pid);

		if (slot >= 0 && pid != s->dp_pid) { /* not the one already seen dead */
			s->dp_slot = slot;
			s->dp_pid = pid;
		}
	}
	if (s->dp_slot >= 0 && reg != NULL) {
		if (shm_live_gone(reg, s->dp_slot, s->dp_pid)) {
			if (s->dec != NULL)
				kvf_log(KVF_LOG_WARNING, "kvferry-ctrld", "PD: this node's kvferry-dataplane (pid %d) died: "
					"%d request(s) in flight wait for it; each runs again in a fresh room once it is back "
					"([pd] room_retries)", (int)s->dp_pid, n_rooms(s));
			else
				kvf_log(KVF_LOG_WARNING, "kvferry-ctrld", "PD: this node's kvferry-dataplane (pid %d) died: "
					"the rooms in flight fail once it is back (their pages went with it)", (int)s->dp_pid);
			s->dp_slot = -1;
			s->dp_deaths++;
		}
	}
	for (int32_t i = 0; s->dec != NULL && i < ctrl_pd_peers_count(s->peers) && i < CTRL_PD_MAX_PEERS; i++) {
		uint64_t epoch = 0, silent_ms = 0;
		int silent = peer_state(s, (uint32_t)i, &epoch, &silent_ms) == 0 && silent_ms > 0;

		if (silent && !s->peer_silent[i]) {
			kvf_log(KVF_LOG_WARNING, "kvferry-ctrld", "PD: prefill node %s: its kvferry-dataplane (node %d) "
				"went silent (the link is down, or it was not heard for 0.6 s): its rooms in flight wait "
				"(they run again in fresh rooms if it comes back as a new session, and fail after %.0f s "
				"of silence)", ctrl_pd_peer_addr(s->peers, i), (int)s->node[i].dp_node,
				CTRL_PD_PEER_GONE_MS / 1e3);
			s->peer_silences++;
		} else if (!silent && s->peer_silent[i]) {
			/* the rooms given up there meanwhile: their aborts again, or
			 * it holds their KV for manifests that cannot come */
			int n = ctrl_pd_decode_resend_aborts(s->dec, (uint32_t)i);

			kvf_log(KVF_LOG_INFO, "kvferry-ctrld", "PD: prefill node %s: its kvferry-dataplane is heard again "
				"(%d abort(s) of rooms given up meanwhile sent again)", ctrl_pd_peer_addr(s->peers, i), n);
		}
		s->peer_silent[i] = (uint8_t)silent;
		/* past the give-up bound its rooms fail at once: it gets no new one */
		s->peer_gone[i] = (uint8_t)(silent && silent_ms >= CTRL_PD_PEER_GONE_MS);
		if (ctrl_pd_peers_dataplane_gone(s->peers, i, s->peer_gone[i]) == 0 && s->peer_gone[i])
			kvf_log(KVF_LOG_WARNING, "kvferry-ctrld", "PD: prefill node %s: its kvferry-dataplane silent for "
				"%.1f s: no new request goes there until it is heard again", ctrl_pd_peer_addr(s->peers, i),
				(double)silent_ms / 1e3);
	}
}

/*
 * Decode, stages in worker processes ([pd] worker_rx): ask each stage whose
 * layers' stream is not routed to a live process (at start, or its worker
 * restarted) to take that stream's pages from the dataplane itself. Without
 * the lock: the call waits for the stage's answer. At most once a second.
 */
static void routes(struct ctrl_pd_serve *s)
{
	int32_t pid[CTRL_CHAIN_MAX_STAGES];
	int32_t n = s->o.n_stages < CTRL_CHAIN_MAX_STAGES ? s->o.n_stages : CTRL_CHAIN_MAX_STAGES;

	if (!s->rx_on || kvf_mono_ns() - s->t_routes < 1000000000ull)
		return;
	s->t_routes = kvf_mono_ns();
	pthread_mutex_lock(&s->mu);
	for (int32_t k = 0; k < n; k++)
		pid[k] = ctrl_pd_link_route_pid(s->link, DP_STREAM_KV_STAGE + (uint32_t)k);
	pthread_mutex_unlock(&s->mu);
	const uint64_t gen = ctrl_chain_kv_generation(s->o.chain);

	for (int32_t k = 0; k < n; k++) {
		int rc;

		if (pid[k] > 0 && (kill(pid[k], 0) == 0 || errno != ESRCH))
			continue;
		if (s->route_no[k] == gen + 1)
			continue; /* it said no; its workers are the same ones */
		rc = ctrl_chain_kv_rxroute(s->o.chain, k, DP_STREAM_KV_STAGE + (uint32_t)k);
		if (rc == -ENOTSUP) {
			/* a tensor-parallel stage, or an older kvferry-worker or
			 * dataplane (the worker's log says which): the stream stays
			 * ctrld's, the other stages' are still asked */
			if (s->route_rc[k] != rc)
				kvf_log(KVF_LOG_INFO, "kvferry-ctrld", "PD: stage %d's worker does not take its own KV "
					"pages (a tensor-parallel stage, or an older kvferry-worker or dataplane; its log "
					"says which): ctrld lands that stage's pages", (int)k);
			s->route_rc[k] = rc;
			s->route_no[k] = gen + 1;
			continue;
		}
		if (rc != s->route_rc[k] || rc == 0)
			kvf_log(rc == 0 ? KVF_LOG_INFO : KVF_LOG_WARNING, "kvferry-ctrld", "PD: stage %d's worker %s%s",
				(int)k, rc == 0 ? "takes its layers' KV pages from the dataplane itself" :
				"could not take its own KV pages yet (ctrld lands them meanwhile): ", rc == 0 ? "" : strerror(-rc));
		s->route_rc[k] = rc;
	}
}

/* How often the poller looks at the dataplanes' liveness (watch()). */
#define PD_WATCH_EVERY_NS 50000000ull

static void *poller(void *arg)
{
	uint64_t t_watch = 0;

	struct ctrl_pd_serve *s = arg;
	int idle = 0;

	while (!atomic_load(&s->stop)) {
		int moved;

		pthread_mutex_lock(&s->mu);
		if (kvf_mono_ns() - s->t_region >= PD_REGION_EVERY_NS) {
			s->t_region = kvf_mono_ns();
			relink(s);
		}
		if (kvf_mono_ns() - t_watch >= PD_WATCH_EVERY_NS) {
			t_watch = kvf_mono_ns();
			watch(s);
		}
		moved = ctrl_pd_link_poll(s->link, &s->h);
		if (s->pre != NULL)
			ctrl_pd_prefill_tick(s->pre, kvf_mono_ns());
		if (s->dec != NULL) {
			uint64_t t = kvf_mono_ns();

			/* a probe blocks while the lock is held: its timeout is short */
			int lost = ctrl_pd_peers_tick(s->peers, (double)t / 1e9, s->rooms);

			if (lost > 0) {
				s->nodes_lost += (uint64_t)lost;
				moved = 1;
			}
			ctrl_pd_decode_tick(s->dec, t);
		}
		pthread_mutex_unlock(&s->mu);
		routes(s);
		if (s->multi != NULL)
			moved |= forward_step(s);
		idle = moved ? 0 : idle + 1;
		if (idle > PD_IDLE_POLLS)
			ctrl_pd_link_wait(s->link, PD_IDLE_WAIT_NS);
		else if (!moved)
			usleep(50);
	}
	return NULL;
}

static int retry(void *arg, uint32_t node, uint64_t old_room, uint64_t *room);

/* ctrl_pd_prefill_opts.kv_gen: the chain's KV generation. */
static uint64_t kv_gen(void *arg)
{
	struct ctrl_pd_serve *s = arg;

	return ctrl_chain_kv_generation(s->o.chain);
}

/* ctrl_pd_decode_opts.gate: the rooms area of stages taking their own pages. Holds mu. */
static int gate(void *arg, uint64_t room, uint32_t session, int open)
{
	struct ctrl_pd_serve *s = arg;

	return ctrl_pd_link_room_gate(s->link, room, session, open);
}

static int start_decode(struct ctrl_pd_serve *s, char *err, size_t errlen)
{
	struct ctrl_rooms_opts ro;
	struct ctrl_pd_peers_opts po;
	struct ctrl_pd_decode_opts dopt = { 0 };

	if (getrandom(&s->session, sizeof(s->session), 0) != (ssize_t)sizeof(s->session))
		s->session = (uint32_t)kvf_mono_ns();
	ctrl_rooms_opts_init(&ro);
	ro.vocab_size = s->o.vocab_size;
	ro.timeout_ns = (uint64_t)(s->o.room_timeout_s * 1e9);
	ro.timeout_knob = "[pd] room_timeout";
	s->rooms = ctrl_rooms_create(&ro);
	ctrl_pd_peers_opts_init(&po);
	po.interval_s = s->o.heartbeat_s;
	po.max_failures = s->o.heartbeat_failures;
	po.timeout_s = 1.0;
	po.probe = probe;
	s->peers = ctrl_pd_peers_create(s->o.prefill, &po, err, errlen);
	if (s->rooms == NULL || s->peers == NULL) {
		if (s->rooms == NULL)
			snprintf(err, errlen, "the rooms table: %s", strerror(errno));
		return -EINVAL;
	}
	dopt.sched = s->o.sched;
	dopt.rooms = s->rooms;
	dopt.session = s->session;
	dopt.n_streams = s->o.n_stages;
	dopt.send = send_ctl;
	dopt.send_arg = s;
	dopt.lock = &s->mu;
	dopt.compute_here = 1; /* a prefill node whose chain failed a prompt costs its client nothing */
	dopt.first_early = s->o.first_early;
	dopt.node_name = node_name;
	dopt.node_arg = s;
	dopt.peer_state = peer_state;
	dopt.peer_arg = s;
	dopt.retry = retry;
	dopt.retry_arg = s;
	dopt.max_retries = s->o.room_retries;
	dopt.gate = gate;
	dopt.gate_arg = s;
	/* stages in worker processes take their own pages: the rooms area first,
	 * so every room's gate opens there */
	s->rx_on = s->o.worker_rx && ctrl_proc_chain_region(s->o.chain) != NULL
		   && ctrl_pd_link_rooms_open(s->link) == 0;
	s->dec = ctrl_pd_decode_create(&dopt);
	s->multi = curl_multi_init();
	if (s->dec == NULL || s->multi == NULL) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	return 0;
}

struct ctrl_pd_serve *ctrl_pd_serve_start(const struct ctrl_pd_serve_opts *o, char *err, size_t errlen)
{
	struct ctrl_pd_serve *s = calloc(1, sizeof(*s));
	struct ctrl_pd_link_opts lo;
	struct kn_kv_format f;

	if (s == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	s->o = *o;
	s->dp_slot = -1;
	pthread_mutex_init(&s->mu, NULL);
	if (ctrl_chain_kv_format(o->chain, 0, &f) < 0)
		kvf_log(KVF_LOG_WARNING, "kvferry-ctrld", "stage 0 cannot move KV pages (its format is unknown): "
			"disaggregated requests will fail their rooms");
	ctrl_pd_link_opts_init(&lo);
	if (o->page_buffers > 0)
		lo.n_large = (uint32_t)o->page_buffers;
	lo.region = o->region;
	lo.reg = ctrl_proc_chain_region(o->chain); /* ctrld checked it is the same region */
	if (lo.reg == NULL) {
		char rerr[256];

		if ((s->own = shm_region_attach(o->region, rerr, sizeof(rerr))) == NULL) {
			snprintf(err, errlen, "attaching the dataplane's region %s: %s (start kvferry-dataplane first)",
				 o->region, rerr);
			goto fail;
		}
		lo.reg = s->own;
		s->own_pinned = pin(s, s->own);
	}
	s->link = ctrl_pd_link_open(&lo, err, errlen);
	if (s->link == NULL)
		goto fail;
	if (o->role == CTRL_PD_SERVE_DECODE) {
		if (start_decode(s, err, errlen) < 0)
			goto fail;
	} else {
		struct ctrl_pd_prefill_opts po = { .sched = o->sched, .rank = o->rank, .send = send_ctl, .send_arg = s,
						   .ship = ship, .ship_arg = s, .lock = &s->mu, .defer_ship = 1,
						   .kv_gen = kv_gen, .kv_gen_arg = s,
						   .hold_ns = (uint64_t)(o->room_timeout_s * 1e9) };

		s->pre = ctrl_pd_prefill_create(&po);
		if (s->pre == NULL) {
			snprintf(err, errlen, "ctrl_pd_prefill_create: %s", strerror(errno));
			goto fail;
		}
	}
	s->h = (struct ctrl_pd_link_handlers){ .control = on_control, .expects = expects, .pages = on_pages,
					       .refused = o->role == CTRL_PD_SERVE_DECODE ? on_refused : NULL,
					       .lost = o->role == CTRL_PD_SERVE_DECODE ? on_lost : NULL, .arg = s,
					       .chain = o->role == CTRL_PD_SERVE_DECODE ? o->chain : NULL,
					       .n_stages = o->n_stages };
	if (pthread_create(&s->th, NULL, poller, s) != 0) {
		snprintf(err, errlen, "pthread_create(pd poller) failed");
		goto fail;
	}
	s->started = 1;
	return s;
fail:
	ctrl_pd_serve_stop(s);
	return NULL;
}

/* ---- the decode end's requests ---- */

/* The client's callback, the node whose room count it holds, and — for a
 * room this node forwarded itself — what it takes to send the prompt again
 * in a fresh room (retry()). Listed in s->wraps, under s->mu. */
struct pd_wrap {
	struct pd_wrap *next;
	ctrl_token_cb cb;
	void *arg;
	struct ctrl_pd_serve *s;
	int32_t peer;
	uint64_t room;
	struct ctrl_request req;   /* forwarded: the request, req.prompt = prompt */
	int32_t *prompt;           /* NULL: a router drove the room (no retry here) */
};

static int n_rooms(const struct ctrl_pd_serve *s)
{
	int n = 0;

	for (const struct pd_wrap *w = s->wraps; w != NULL; w = w->next)
		n++;
	return n;
}

static void wrap_free(struct ctrl_pd_serve *s, struct pd_wrap *w)
{
	for (struct pd_wrap **pp = &s->wraps; *pp != NULL; pp = &(*pp)->next)
		if (*pp == w) {
			*pp = w->next;
			break;
		}
	free(w->prompt);
	free(w);
}

static void wrap_cb(void *arg, const struct ctrl_event *ev)
{
	struct pd_wrap *w = arg;

	w->cb(w->arg, ev);
	if (ev->finish != CTRL_FINISH_NONE) {
		ctrl_pd_peer_rooms(w->s->peers, w->peer, -1); /* under the lock: pd_decode's callback holds it */
		wrap_free(w->s, w);
	}
}

/* Learn node @p i's dataplane node, API port and layout (once). @return 0 or -errno with @p err. */
static int node_ready(struct ctrl_pd_serve *s, int32_t i, char *err, size_t errlen)
{
	struct pd_node *n = &s->node[i];
	const char *addr = ctrl_pd_peer_addr(s->peers, i);
	struct ctrl_pd_info info;
	const char *colon;
	int rc;

	if (n->ready)
		return 0;
	rc = ctrl_pd_fetch_info(addr, 2.0, &info, err, errlen);
	if (rc == 0 && (info.dataplane_node < 0 || info.api_port <= 0)) {
		snprintf(err, errlen, "prefill node %s names no kvferry_dataplane_node / kvferry_api_port in its "
			 "parallel info: give it [pd] dataplane_region", addr);
		rc = -EPROTO;
	}
	if (rc == 0)
		rc = ctrl_pd_check_contract(&info, &s->o.local, addr, err, errlen);
	if (rc < 0) {
		snprintf(n->err, sizeof(n->err), "%s", err);
		return rc;
	}
	colon = strrchr(addr, ':');
	snprintf(n->host, sizeof(n->host), "%.*s", (int)(colon - addr), addr);
	n->dp_node = info.dataplane_node;
	n->api_port = info.api_port;
	n->ready = 1;
	return 0;
}

/* The prompt as the prefill node's /v1/completions takes it, with the room. */
static struct pd_fwd *forward_of(struct ctrl_pd_serve *s, int32_t i, const struct ctrl_request *r, uint64_t room)
{
	struct pd_node *n = &s->node[i];
	struct pd_fwd *f = calloc(1, sizeof(*f));
	json_t *ids = json_array(), *b;
	const char *addr = ctrl_pd_peer_addr(s->peers, i);
	const char *colon = strrchr(addr, ':');

	if (f == NULL || ids == NULL) {
		free(f);
		json_decref(ids);
		return NULL;
	}
	f->peer = i;
	for (int32_t k = 0; k < r->n_prompt; k++)
		json_array_append_new(ids, json_integer(r->prompt[k]));
	b = json_pack("{s:s, s:o, s:i, s:f, s:f, s:i, s:I, s:b, s:s, s:i, s:I}", "model", s->o.model_name, "prompt", ids,
		      "max_tokens", 1, "temperature", (double)r->temperature, "top_p", (double)r->top_p, "top_k",
		      r->top_k, "seed", (json_int_t)r->seed, "ignore_eos", 1, "bootstrap_host", n->host,
		      "bootstrap_port", atoi(colon + 1), "bootstrap_room", (json_int_t)room);
	if (b != NULL) /* ours: the prefill node drops this session's rooms once we restart */
		json_object_set_new(b, "kvferry_session", json_integer((json_int_t)s->session));
	if (b != NULL && r->n_logprobs > 0) /* the first token's top logprobs come from the prefill node */
		json_object_set_new(b, "logprobs", json_integer(r->n_logprobs));
	f->body = b != NULL ? json_dumps(b, JSON_COMPACT) : NULL;
	json_decref(b);
	f->e = curl_easy_init();
	f->hd = curl_slist_append(NULL, "Content-Type: application/json");
	if (f->body == NULL || f->e == NULL || f->hd == NULL) {
		fwd_free(f);
		return NULL;
	}
	f->room = room;
	snprintf(f->url, sizeof(f->url), "http://%s:%d/v1/completions", n->host, n->api_port);
	curl_easy_setopt(f->e, CURLOPT_URL, f->url);
	curl_easy_setopt(f->e, CURLOPT_HTTPHEADER, f->hd);
	curl_easy_setopt(f->e, CURLOPT_POSTFIELDS, f->body);
	curl_easy_setopt(f->e, CURLOPT_WRITEFUNCTION, sink);
	curl_easy_setopt(f->e, CURLOPT_ERRORBUFFER, f->errbuf);
	curl_easy_setopt(f->e, CURLOPT_PRIVATE, f);
	curl_easy_setopt(f->e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(f->e, CURLOPT_TIMEOUT, (long)(s->o.room_timeout_s + 1));
	return f;
}

static uint64_t new_room(void)
{
	uint64_t room;

	if (getrandom(&room, sizeof(room), 0) != (ssize_t)sizeof(room))
		room = kvf_mono_ns();
	return room & INT64_MAX; /* as SGLang draws them: 0 .. 2^63-1 */
}

/* The decode end's retry (ctrl_pd_decode_opts.retry): send the prompt of
 * @p old_room's request again, under a fresh room. Holds mu. */
static int retry(void *arg, uint32_t node, uint64_t old_room, uint64_t *room)
{
	struct ctrl_pd_serve *s = arg;
	struct pd_fwd *f;

	for (struct pd_wrap *w = s->wraps; w != NULL; w = w->next) {
		if (w->room != old_room)
			continue;
		if (w->prompt == NULL || (int32_t)node != w->peer)
			return -ENOTSUP;
		*room = new_room();
		if ((f = forward_of(s, w->peer, &w->req, *room)) == NULL)
			return -ENOMEM;
		f->next = s->fwd_new;
		s->fwd_new = f;
		w->room = *room;
		kvf_log(KVF_LOG_WARNING, "kvferry-ctrld", "PD: room %llu was lost with a dataplane's session: its "
			"request runs again in room %llu on prefill node %s", (unsigned long long)old_room,
			(unsigned long long)*room, ctrl_pd_peer_addr(s->peers, w->peer));
		return 0;
	}
	return -ENOENT;
}

/* Serve @p r disaggregated in @p room on node @p i; @p forward: send the prompt there. Holds mu. */
static int64_t decode_submit(struct ctrl_pd_serve *s, const struct ctrl_request *r, int32_t i, uint64_t room,
			     int forward)
{
	struct pd_wrap *w = calloc(1, sizeof(*w));
	struct ctrl_request mine = *r;
	struct pd_fwd *f = NULL;
	int64_t id;

	if (w == NULL || (forward && (f = forward_of(s, i, r, room)) == NULL)) {
		free(w);
		return -ENOMEM;
	}
	*w = (struct pd_wrap){ .cb = r->cb, .arg = r->cb_arg, .s = s, .peer = i, .room = room };
	if (forward && (w->prompt = malloc(sizeof(int32_t) * (size_t)r->n_prompt)) != NULL) {
		memcpy(w->prompt, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
		w->req = *r;
		w->req.prompt = w->prompt;
		w->req.stop_ids = NULL; /* forward_of() reads neither these nor the callback */
		w->req.n_stop = 0;
	}
	mine.cb = wrap_cb;
	mine.cb_arg = w;
	w->next = s->wraps;
	s->wraps = w;
	id = ctrl_pd_decode_submit(s->dec, &mine, room, (uint32_t)i, 1, kvf_mono_ns());
	if (id < 0) {
		wrap_free(s, w);
		if (f != NULL)
			fwd_free(f);
		return id;
	}
	ctrl_pd_peer_rooms(s->peers, i, +1);
	if (f != NULL) {
		f->next = s->fwd_new;
		s->fwd_new = f;
	}
	return id;
}

static int64_t be_submit(void *ctx, const struct ctrl_request *r)
{
	struct ctrl_pd_serve *s = ctx;
	char err[512];
	int64_t id;
	uint64_t room;
	int32_t i;

	/* a prefill node's own clients, and on a decode node the requests
	 * whose prompt is the answer (its logprobs, or no token at all):
	 * computed here, as no prefill node reports a prompt's logprobs */
	if (s->pre != NULL || r->prompt_logprobs || r->max_tokens == 0)
		return s->o.base.submit(s->o.base.ctx, r);
	pthread_mutex_lock(&s->mu);
	if (s->released) {
		pthread_mutex_unlock(&s->mu);
		return -ESHUTDOWN; /* ctrlctl pd release: 503 until restore */
	}
	i = ctrl_pd_peers_pick(s->peers);
	if (i < 0) {
		pthread_mutex_unlock(&s->mu);
		return -ENETDOWN; /* no healthy prefill node: 503, retry */
	}
	if (node_ready(s, i, err, sizeof(err)) < 0) {
		pthread_mutex_unlock(&s->mu);
		kvf_log(KVF_LOG_ERR, "kvferry-ctrld", "%s", err);
		return -EPROTO;
	}
	room = new_room();
	id = decode_submit(s, r, i, room, 1);
	pthread_mutex_unlock(&s->mu);
	return id;
}

static int64_t be_submit_pd(void *ctx, const struct ctrl_request *r, const struct ctrl_http_pd *pd)
{
	struct ctrl_pd_serve *s = ctx;
	char err[512];
	int64_t id = -EINVAL;
	/* a router drives the pair: its prefill node is the one bootstrap_host
	 * (and bootstrap_port, when it says) names, one of [pd] prefill
	 * (looked up before the lock: it may resolve names) */
	int32_t i = s->pre == NULL ? ctrl_pd_peers_find_host(s->peers, pd->host, pd->port) : -1;

	pthread_mutex_lock(&s->mu);
	if (s->pre != NULL) {
		id = ctrl_pd_prefill_submit_from(s->pre, r, pd->room, 0, pd->session);
		id = id == -EEXIST ? -EINVAL : id;
	} else if (s->released) {
		id = -ESHUTDOWN;
	} else if (i < 0) {
		id = -EHOSTUNREACH;
	} else {
		id = node_ready(s, i, err, sizeof(err)) < 0 ? -EPROTO : decode_submit(s, r, i, pd->room, 0);
	}
	pthread_mutex_unlock(&s->mu);
	return id;
}

static int be_cancel(void *ctx, uint64_t id)
{
	struct ctrl_pd_serve *s = ctx;

	/* ids are the one scheduler's (replica 0, tag 0) for both kinds */
	return s->o.base.cancel(s->o.base.ctx, id);
}

void ctrl_pd_serve_backend(struct ctrl_pd_serve *s, struct ctrl_http_backend *be)
{
	be->submit = be_submit;
	be->submit_pd = be_submit_pd;
	be->cancel = be_cancel;
	be->stats = pd_serve_stats;
	be->ctx = s;
}

int32_t ctrl_pd_serve_node(const struct ctrl_pd_serve *s)
{
	struct ctrl_pd_serve *m = (struct ctrl_pd_serve *)s; /* the poller may swap the link */
	int32_t node;

	if (s == NULL)
		return -1;
	pthread_mutex_lock(&m->mu);
	node = ctrl_pd_link_self_node(m->link);
	pthread_mutex_unlock(&m->mu);
	return node;
}

struct shm_region *ctrl_pd_serve_region(const struct ctrl_pd_serve *s)
{
	struct ctrl_pd_serve *m = (struct ctrl_pd_serve *)s;
	struct shm_region *r;

	if (s == NULL)
		return NULL;
	pthread_mutex_lock(&m->mu);
	r = ctrl_pd_link_region(m->link); /* mapped until a second re-attach after this one */
	pthread_mutex_unlock(&m->mu);
	return r;
}

void ctrl_pd_serve_stop(struct ctrl_pd_serve *s)
{
	if (s == NULL)
		return;
	if (s->started) {
		atomic_store(&s->stop, 1);
		pthread_join(s->th, NULL);
	}
	while (s->fwd_new != NULL) {
		struct pd_fwd *f = s->fwd_new;

		s->fwd_new = f->next;
		fwd_free(f);
	}
	while (s->fwd_run != NULL) {
		struct pd_fwd *f = s->fwd_run;

		s->fwd_run = f->next;
		curl_multi_remove_handle(s->multi, f->e);
		fwd_free(f);
	}
	if (s->multi != NULL)
		curl_multi_cleanup(s->multi);
	ctrl_pd_prefill_destroy(s->pre);
	ctrl_pd_decode_destroy(s->dec);
	while (s->wraps != NULL) /* requests the scheduler never finished (it stopped first) */
		wrap_free(s, s->wraps);
	ctrl_pd_peers_destroy(s->peers);
	ctrl_rooms_destroy(s->rooms);
	ctrl_pd_link_close(s->link);
	unpin_detach(s->own, s->own_pinned);
	unpin_detach(s->retired, s->retired_pinned);
	pthread_mutex_destroy(&s->mu);
	free(s);
}
