/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-ctrld's own admin commands: /ctrl/status (daemon, model, load,
 * each worker process's stage), /dp/peers, /ctrl/drain and /ctrl/resume;
 * and the registration of every module's views (the scheduler's, the HTTP
 * layer's, the configuration's) on the admin socket. Each runs on the admin
 * socket's thread.
 */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "ctrl_pd_serve.h"
#include "ctrl_proc_chain.h"
#include "ctrld_int.h"
#include "dp_ipc.h"
#include "kvf_clock.h"
#include "kvf_config.h"
#include "shm_region.h"

/* Stages in worker processes: what each loaded (tensors and bytes of its
 * range, resident bytes, load time and rate) and where it stands, so an
 * operator sees a slow or stuck load without reading worker logs. */
static void status_workers(struct daemon *d, json_t *data)
{
	json_t *ws = json_array();
	struct ctrl_proc_stage ps;

	for (int r = 0; r < d->n_rep; r++)
		for (int s = 0; ctrl_proc_chain_stage(d->chains[r], s, &ps) == 0; s++) {
			char layers[32];
			double ms = (double)ps.load_ns / 1e6;

			snprintf(layers, sizeof(layers), "%d-%d", ps.layer_start, ps.layer_end);
			json_array_append_new(ws, json_pack("{s:i, s:s, s:i, s:i, s:s, s:s, s:s, s:I, s:i, s:f, s:f, "
				"s:f, s:f, s:I}", "stage", s, "worker", ps.role, "pid", ps.pid, "node", ps.node, "layers",
				layers, "backend", ps.backend, "state", ps.state, "state_ms", (json_int_t)ps.state_ms,
				"tensors", ps.n_tensors, "tensor_mib", (double)ps.tensor_bytes / 1048576.0,
				"resident_mib", (double)ps.weight_bytes / 1048576.0, "load_ms", ms, "load_mib_s",
				ms > 0 ? (double)ps.tensor_bytes / 1048576.0 / (ms / 1e3) : 0.0,
				"kv_blocks", (json_int_t)ps.n_blocks));
		}
	if (json_array_size(ws) > 0)
		json_object_set_new(data, "workers", ws);
	else
		json_decref(ws);
}

static int cmd_status(void *arg, const char *cmd, json_t *params, json_t **data, char *err, size_t errlen)
{
	struct daemon *d = arg;
	const struct kn_model_config *mc = kn_model_config(d->model);
	json_t *st = ctrl_http_sched_stats_json(d->disp);

	(void)cmd;
	(void)params;
	(void)err;
	(void)errlen;
	*data = json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:s, s:i, s:f, s:i, s:O, s:O, s:O, s:O}",
			  "state", atomic_load(&d->stopping) ? "stopping" : ctrl_http_draining(d->http) ? "draining" : "serving",
			  "version", KVF_VERSION, "model", d->model_name, "model_dir", d->set->model_dir,
			  "arch", kn_arch_name(mc->arch), "layers", mc->n_layers, "stages", d->n_stages,
			  "replicas", d->n_rep, "max_context", d->max_context, "listen", d->set->listen_address,
			  "port", ctrl_http_port(d->http), "uptime_s", kvf_mono_s() - d->t0,
			  "active_requests", ctrl_http_active(d->http),
			  "live", json_object_get(st, "live"), "queued", json_object_get(st, "queued"),
			  "replaying", json_object_get(st, "replaying"),
			  "requests_replayed", json_object_get(st, "requests_replayed_total"));
	json_decref(st);
	status_workers(d, *data);
	return 0;
}

/* The dataplane's stats area in this node's region (the workers' chain's,
 * else the PD link's), or NULL when ctrld runs without a dataplane. */
static const struct dp_stats_shm *dp_stats(struct daemon *d, const char **region)
{
	struct shm_region *reg = NULL;
	uint64_t off;
	size_t size;
	const struct dp_stats_shm *st;

	if (d->set->worker_region[0] && d->chains[0] != NULL) {
		reg = ctrl_proc_chain_region(d->chains[0]);
		*region = d->set->worker_region;
	} else if (d->pd != NULL) {
		reg = ctrl_pd_serve_region(d->pd);
		*region = d->set->pd_dataplane_region;
	}
	if (reg == NULL || shm_region_find_area(reg, DP_AREA_STATS, &off, &size) < 0 || size < sizeof(*st))
		return NULL;
	st = shm_ptr(reg, off);
	return st->magic == DP_STATS_MAGIC && st->version == DP_STATS_VERSION ? st : NULL;
}

#define LD(field) __atomic_load_n(&ps->field, __ATOMIC_RELAXED)

/* One peer as the dataplane sees it: the link's state, RTT and RTO, the
 * credit it grants, traffic, and what was lost on the way (resent frames
 * over frames sent: the sender's estimate of the link's loss). Names as
 * /metrics wants them (counters end in _total). */
static json_t *peer_json(const struct dp_peer_stats *ps)
{
	uint64_t drops = 0, tx = LD(tx_frames), rtx = LD(retransmits);
	uint32_t up = LD(up), silent = LD(silent);
	uint64_t epoch = LD(epoch);
	json_t *j;

	for (unsigned k = 0; k < DP_DROP_MAX_; k++)
		drops += LD(drops[k]);
	j = json_pack("{s:i, s:s, s:b, s:f, s:f, s:I, s:i, s:I, s:I, s:I, s:f, s:I, s:I, s:I, s:I, s:I, s:I}",
		      "node", (int)ps->node,
		      "state", up ? "up" : silent ? "silent" : epoch ? "down" : "never heard", "up", (int)up,
		      "rtt_us", (double)LD(rtt_ns) / 1e3, "rto_ms", (double)LD(rto_ns) / 1e6,
		      "credit_msgs", (json_int_t)LD(credit), "streams", (int)LD(streams),
		      "tx_bytes_total", (json_int_t)LD(tx_bytes), "rx_bytes_total", (json_int_t)LD(rx_bytes),
		      "retransmits_total", (json_int_t)rtx, "loss_frac", tx ? (double)rtx / (double)tx : 0.0,
		      "timeouts_total", (json_int_t)LD(timeouts), "restarts_total", (json_int_t)LD(restarts),
		      "msgs_sent_total", (json_int_t)LD(msgs_sent), "msgs_failed_total", (json_int_t)LD(msgs_failed),
		      "msgs_received_total", (json_int_t)LD(msgs_received), "drops_total", (json_int_t)drops);
	if (j != NULL && epoch)
		json_object_set_new(j, "heard_ms", json_integer((json_int_t)LD(heard_ago_ms)));
	return j;
}

/* What the CPU did with each payload byte this node's dataplane moved (the
 * stats area's copy counters): bytes sent and received, the dataplane's own
 * copies and CRC reads, its driver's copies per byte, and the copies per byte
 * sent and received (the driver's and the dataplane's): over net_memif in
 * copy mode 1 sent and 2 received (reassembled) or 1 (received in place), a
 * zero-copy memif client's server 1 sent and the client 0 received in place,
 * a NIC 0 sent and 1 received (reassembled) or 0. */
static json_t *copies_json(const struct dp_stats_shm *ps)
{
	const uint64_t ptx = LD(payload_tx_bytes), prx = LD(payload_rx_bytes);
	const uint64_t ctx = LD(copy_tx_bytes), crx = LD(copy_rx_bytes);
	const uint32_t dtx = LD(pmd_tx_copies), drx = LD(pmd_rx_copies);

	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:i, s:f, s:f}", "payload_sent_bytes_total",
			 (json_int_t)ptx, "payload_received_bytes_total", (json_int_t)prx, "copied_sending_bytes_total",
			 (json_int_t)ctx, "copied_receiving_bytes_total", (json_int_t)crx, "crc_read_bytes_total",
			 (json_int_t)LD(crc_read_bytes), "crc_given_bytes_total", (json_int_t)LD(crc_given_bytes),
			 "driver_copies_sending", (int)dtx, "driver_copies_receiving",
			 (int)drx, "sending_per_byte", ptx ? dtx + (double)ctx / (double)ptx : 0.0, "receiving_per_byte",
			 prx ? drx + (double)crx / (double)prx : 0.0);
}

#undef LD

json_t *ctrld_dataplane_json(void *arg)
{
	struct daemon *d = arg;
	const char *region = "";
	const struct dp_stats_shm *st = dp_stats(d, &region);
	json_t *peers;

	if (st == NULL)
		return NULL;
	peers = json_array();
	uint32_t n = __atomic_load_n(&st->n_peers, __ATOMIC_ACQUIRE);
	for (uint32_t i = 0; i < n && i < DP_MAX_PEERS; i++)
		json_array_append_new(peers, peer_json(&st->peer[i]));
	return json_pack("{s:i, s:s, s:o, s:o}", "node", (int)st->self_node, "region", region, "copies", copies_json(st),
			 "peers", peers);
}

static int cmd_peers(void *arg, const char *cmd, json_t *params, json_t **data, char *err, size_t errlen)
{
	struct daemon *d = arg;
	json_t *dp = ctrld_dataplane_json(d);

	(void)cmd;
	(void)params;
	(void)err;
	(void)errlen;
	if (dp != NULL) {
		*data = dp;
		return 0;
	}
	*data = json_pack("{s:s, s:s, s:o}", "node", "(single node)", "dataplane",
			  d->set->worker_region[0] || d->pd != NULL ? "its region holds no dataplane stats"
								   : "not attached: stages run in this process",
			  "peers", json_array());
	return 0;
}

static int cmd_drain(void *arg, const char *cmd, json_t *params, json_t **data, char *err, size_t errlen)
{
	struct daemon *d = arg;
	int on = !strcmp(cmd, "/ctrl/drain");

	(void)params;
	(void)err;
	(void)errlen;
	ctrl_http_set_draining(d->http, on);
	sd_notifyf(0, "STATUS=%s %s on %s:%u", on ? "draining;" : "serving", d->model_name,
		   d->set->listen_address, ctrl_http_port(d->http));
	logmsg("%s (admin socket)", on ? "draining: new requests get 503" : "resumed admitting requests");
	*data = json_pack("{s:s, s:i}", "state", on ? "draining" : "serving", "active_requests",
			  ctrl_http_active(d->http));
	return 0;
}

int ctrld_admin_register(struct daemon *d)
{
	static const struct {
		const char *cmd, *help;
		ctrl_admin_fn fn;
	} t[] = {
		{"/ctrl/status", "daemon, model and load summary", cmd_status},
		{"/dp/peers", "this node's dataplane peers: link state, RTT, credit, traffic and loss", cmd_peers},
		{"/ctrl/drain", "stop admitting requests (503); requests in flight finish", cmd_drain},
		{"/ctrl/resume", "admit requests again after drain", cmd_drain},
	};
	int rc;

	/* the daemon's own; each module registers its views (/pd/bootstrap
	 * once start_pd() knows the role's server) */
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		rc = ctrl_admin_register(d->admin, t[i].cmd, t[i].help, t[i].fn, d);
		if (rc)
			return rc;
	}
	d->sv = (struct ctrl_sched_view){ .scheds = d->scheds, .chains = d->chains, .n = d->n_rep, .ends = d->ends };
	rc = ctrl_sched_admin_register(d->admin, &d->sv);
	if (!rc)
		rc = ctrl_http_admin_register(d->admin, d->http);
	if (!rc)
		rc = ctrl_config_admin_register(d->admin, d->cfg);
	return rc;
}
