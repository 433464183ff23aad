/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-ctrld: the serving daemon. Reads the configuration, opens the
 * model and its tokenizer, builds one scheduler per replica over an
 * in-process chain of kn_ stage engines, serves the HTTP API and the admin
 * socket, and drives the schedulers from the main thread.
 *
 * Lifecycle: READY=1 goes to systemd once HTTP and the admin socket
 * listen. SIGTERM/SIGINT drain: new requests get 503, requests in flight
 * finish (or are cancelled after drain_timeout), then everything closes in
 * reverse order of opening. `ctrlctl drain` / `resume` toggle admission
 * without exiting (the daemon's own admin commands: ctrld_admin.c).
 */
#include <curl/curl.h>
#include <errno.h>
#include <libgen.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "ctrl_admin.h"
#include "ctrl_chain.h"
#include "ctrl_config.h"
#include "ctrl_http.h"
#include "ctrl_pd_boot.h"
#include "ctrl_pd_serve.h"
#include "ctrl_proc_chain.h"
#include "ctrl_sched.h"
#include "kn_model.h"
#include "kn_tok.h"
#include "kvf_config.h"
#include "kvf_clock.h"
#include "kvf_log.h"
#include "ctrld_int.h"

/* Idle poll back-off: a poll that found nothing sleeps this long. The CPU
 * engine's steps take milliseconds, so 50 µs adds under 5% to a round
 * while keeping an idle daemon off the CPU. */
#define IDLE_SLEEP_NS 50000L

static volatile sig_atomic_t g_term;

static void on_signal(int sig)
{
	(void)sig;
	g_term = 1;
}

/* A readiness answer serves the probes of the next 100 ms: looking at the
 * chains counts each stage's tensors by name (kn_model_range_tensors():
 * 118 us for a 32-layer range, 448 names looked up, on this 2-core CI
 * machine), so a flood of probes costs at most that 10 times a second. */
#define READY_KEEP_S 0.1

/* ---- startup ---- */

static int load_config(struct daemon *d, int argc, char **argv)
{
	static const char *const skip[] = {"--config", NULL};
	static const char *const bare[] = {"--print-config", "--help", "-h", "--version", "--check", NULL};
	extern char **environ;
	const char *path = getenv("KVFERRY_CONFIG");
	int must = path != NULL, rc;
	char err[1024];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--config") && i + 1 < argc) {
			path = argv[i + 1];
			must = 1;
		} else if (!strncmp(argv[i], "--config=", 9)) {
			path = argv[i] + 9;
			must = 1;
		}
	}
	d->cfg = ctrl_config_new();
	if (!d->cfg)
		return -ENOMEM;
	rc = ctrl_config_load_file(d->cfg, path ? path : CTRL_CONFIG_PATH, must, err, sizeof(err));
	if (!rc)
		rc = ctrl_config_load_env(d->cfg, environ, err, sizeof(err));
	if (!rc)
		rc = ctrl_config_load_args(d->cfg, argc, argv, skip, bare, err, sizeof(err));
	if (!rc)
		rc = ctrl_config_check(d->cfg, err, sizeof(err));
	if (rc) {
		logerr("configuration error: %s", err);
		return rc;
	}
	d->set = ctrl_config_settings(d->cfg);
	return 0;
}

/* The chat template: the model's, or the file chat_template names (none:
 * no chat). One of a family kn_tok cannot render refuses the start rather
 * than serving a 400 to every chat request: the operator learns it from
 * --check and the journal, not from clients. A model without any template (a
 * base model) still serves, chat answering 400 as API.md says. */
static int open_chat_template(struct daemon *d)
{
	const char *ct = d->set->chat_template, *origin = NULL;
	char err[1024];
	int rc = 0;

	ctrl_config_source(d->cfg, "chat_template", &origin);
	if (!strcmp(ct, "none"))
		rc = kn_tok_set_chat_template(d->tok, NULL, "chat_template = none");
	else if (ct[0])
		rc = kn_tok_load_chat_template(d->tok, ct, err, sizeof(err));
	if (rc) {
		logerr("chat_template = %s (from %s): %s", ct, origin ? origin : "default",
		       rc == -ENOMEM ? "out of memory" : err);
		return rc;
	}
	if (kn_tok_chat_family(d->tok) == KN_CHAT_UNKNOWN) {
		logerr("%s; refusing to start, as no chat request could be served. Pass --chat-template FILE "
		       "(chat_template in [model] of %s, or KVFERRY_CHAT_TEMPLATE) with a ChatML or Llama 3 "
		       "template written for this model, or --chat-template none to serve completions only",
		       kn_tok_chat_error(d->tok), CTRL_CONFIG_PATH);
		return -ENOTSUP;
	}
	return 0;
}

static int open_model(struct daemon *d)
{
	const struct kn_model_config *mc;
	char err[1024], dirbuf[CTRL_CFG_STRLEN];
	int rc;

	d->model = kn_model_open(d->set->model_dir, err, sizeof(err));
	if (!d->model) {
		logerr("kn_model_open(%s) failed: %s (set model_dir in %s or --model-dir)", d->set->model_dir, err,
		       CTRL_CONFIG_PATH);
		return -errno;
	}
	d->tok = kn_tok_open(d->set->model_dir, err, sizeof(err));
	if (!d->tok) {
		logerr("kn_tok_open(%s) failed: %s", d->set->model_dir, err);
		return -errno;
	}
	rc = open_chat_template(d);
	if (rc)
		return rc;
	mc = kn_model_config(d->model);
	if (ctrl_config_stages(d->set->stages, mc->n_layers, d->ends, &d->n_stages, err, sizeof(err))) {
		const char *origin;
		ctrl_config_source(d->cfg, "stages", &origin);
		logerr("stages = %s (from %s): %s", d->set->stages, origin, err);
		return -EINVAL;
	}
	d->max_context = mc->max_position;
	if (d->set->max_context) {
		if (d->set->max_context > mc->max_position) {
			logerr("max_context %lld exceeds the model's max_position_embeddings %d; lower max_context",
			       (long long)d->set->max_context, mc->max_position);
			return -EINVAL;
		}
		d->max_context = (int32_t)d->set->max_context;
	}
	snprintf(dirbuf, sizeof(dirbuf), "%s", d->set->model_dir);
	snprintf(d->model_name, sizeof(d->model_name), "%s",
		 d->set->served_model_name[0] ? d->set->served_model_name : basename(dirbuf));
	return 0;
}

/* mb_k, with 0 resolved for the backend: 32 columns on cpu; 512 on cuda,
 * where a decode step costs little more at 512 columns than at 64 (1B:
 * 2.45 ms at 256 vs 1.51 at 64), so every live sequence decodes each step
 * and prefill chunks fill the rest. */
static int32_t mb_cols(const struct daemon *d)
{
	if (d->set->mb_k > 0)
		return (int32_t)d->set->mb_k;
	return d->set->backend == CTRL_CFG_BACKEND_CUDA ? 512 : 32;
}

/* Stages in kvferry-worker processes (worker_region set): the same stage
 * template, reached through this node's shm region. Replica @p r > 0 is a
 * second pipeline of workers on the same region, under names of its own:
 * rings serve.rR.sK.in and serve.rR.ret (its workers' --in / --out), its
 * output area serve.rR.ctrl.out; replica 0 keeps the plain serve.* names. */
static struct ctrl_chain *worker_chain(struct daemon *d, int r, const struct ctrl_kn_chain_opts *ko, char *err,
				       size_t errlen)
{
	struct ctrl_proc_chain_opts po;
	char (*nm)[32] = d->wk_names[r];

	if (d->n_rep > 1 && d->set->worker_return != 0) {
		snprintf(err, errlen, "replicas = %d with worker_return = dataplane: a pipeline of workers "
			 "across nodes serves alone; set replicas = 1, or worker_return = ring with every "
			 "replica's workers on this node", d->n_rep);
		errno = EINVAL;
		return NULL;
	}
	if (r == 0)
		snprintf(nm[0], sizeof(nm[0]), "serve");
	else
		snprintf(nm[0], sizeof(nm[0]), "serve.r%d", r);
	snprintf(nm[1], sizeof(nm[1]), "%s.s0.in", nm[0]);
	snprintf(nm[2], sizeof(nm[2]), "%s.ret", nm[0]);
	ctrl_proc_chain_opts_init(&po);
	po.region = d->set->worker_region;
	po.region_bytes = r == 0 ? (size_t)d->set->worker_region_size : 0; /* replica 0 makes it */
	po.prefix = nm[0];
	po.first_ring = nm[1];
	po.return_ring = d->set->worker_return == 0 ? nm[2] : NULL;
	po.n_stages = d->n_stages;
	memcpy(po.layer_ends, d->ends, sizeof(int32_t) * (size_t)d->n_stages);
	po.stage = ko->stage;
	po.max_groups = ko->max_groups;
	po.join_timeout_ms = (uint64_t)d->set->worker_join_timeout * 1000u;
	po.group_timeout_ms = (uint64_t)d->set->worker_group_timeout * 1000u;
	return ctrl_proc_chain_create(d->model, &po, err, errlen);
}

static int build_pipelines(struct daemon *d)
{
	char err[1024];

	d->n_rep = (int)d->set->replicas;
	for (int r = 0; r < d->n_rep; r++) {
		struct ctrl_kn_chain_opts ko;
		struct ctrl_sched_opts so;
		int32_t plans[CTRL_SCHED_MAX_PLANS], plans_n = 0;

		ctrl_kn_chain_opts_init(&ko);
		ko.n_stages = d->n_stages;
		memcpy(ko.layer_ends, d->ends, sizeof(int32_t) * (size_t)d->n_stages);
		ko.backend = d->set->backend == CTRL_CFG_BACKEND_CUDA ? KN_BACKEND_CUDA : KN_BACKEND_CPU;
		ko.threaded = d->n_stages > 1;
		ko.stage.n_slots = (int32_t)d->set->max_slots;
		ko.stage.max_blocks_per_slot = (d->max_context + KN_PAGE_BLK - 1) / KN_PAGE_BLK;
		ko.stage.n_blocks = d->set->kv_blocks ? (int32_t)d->set->kv_blocks : -1;
		ko.stage.kv_budget_bytes = (size_t)d->set->kv_memory;
		ko.stage.kv_mem_fraction = (float)d->set->kv_mem_fraction;
		ko.stage.n_threads = (int32_t)d->set->threads;
		ko.stage.device = (int32_t)d->set->device;
		ko.stage.cuda_gemv = (int32_t)d->set->cuda_gemv;
		ko.stage.cuda_wide_x = (int32_t)d->set->cuda_wide_x;
		ko.stage.cuda_attn = (int32_t)d->set->cuda_attn;
		ko.stage.cuda_batch_invariant = (int32_t)d->set->cuda_batch_invariant;
		ko.stage.cuda_module = d->set->cuda_module;
		{
			int32_t w[8], np = 0, mb = mb_cols(d);

			ctrl_config_plans(d->set->plans, w, &np, err, sizeof(err)); /* validated at load */
			if (np == 0 && ko.backend == KN_BACKEND_CUDA) {
				/* A step's cost grows with its padded width on the GPU:
				 * measured on the H200, 1B decode at 3 columns 1.25 ms in
				 * plan 8 and 1.00 ms at 1 column in plan 1. Keep the padding
				 * under 2x at every batch; prefill 512 positions a launch. */
				const int32_t a[] = { 1, 8, 16, 32, 64, 128, 256, 512 };
				for (int i = 0; i < 8; i++)
					w[np++] = a[i];
				if (mb > 512)
					w[np - 1] = mb;
			} else if (np == 0) {
				w[np++] = 8;
				w[np++] = mb > 64 ? mb : 64;
			}
			ko.stage.n_plans = np;
			memcpy(ko.stage.plan_widths, w, sizeof(int32_t) * (size_t)np);
			plans_n = np < CTRL_SCHED_MAX_PLANS ? np : CTRL_SCHED_MAX_PLANS;
			memcpy(plans, w, sizeof(int32_t) * (size_t)plans_n);
		}
		if (d->set->groups + 1 > ko.max_groups)
			ko.max_groups = (int32_t)d->set->groups + 1;
		d->chains[r] = d->set->worker_region[0] ? worker_chain(d, r, &ko, err, sizeof(err))
							 : ctrl_kn_chain_create(d->model, &ko, err, sizeof(err));
		if (!d->chains[r]) {
			logerr("replica %d: ctrl_kn_chain_create(%d stages, %s) failed: %s", r, d->n_stages,
			       ko.backend == KN_BACKEND_CUDA ? "cuda" : "cpu", err);
			return -errno;
		}
		ctrl_sched_opts_init(&so);
		so.n_groups = (int32_t)d->set->groups;
		so.mb_cols = mb_cols(d);
		so.one_launch_decode = ko.backend == KN_BACKEND_CUDA;
		so.step_budget = d->set->step_budget;
		so.n_plans = plans_n;
		memcpy(so.plans, plans, sizeof(int32_t) * (size_t)plans_n);
		so.n_slots = (int32_t)d->set->max_slots;
		so.max_queue = (int32_t)d->set->max_queue;
		so.spec = d->set->spec;
		so.prefix_cache = d->set->prefix_cache;
		so.spec_depth = (int32_t)d->set->spec_depth;
		so.spec_c_full = (int32_t)d->set->spec_c_full;
		so.spec_c_half = (int32_t)d->set->spec_c_half;
		so.replay_max = (int32_t)d->set->replay_max;
		so.hold_chunk = (int32_t)d->set->pd_ship_chunk;
		so.hold_taper = (int)d->set->pd_ship_taper;
		so.prefill_pipeline = d->set->prefill_pipeline;
		/* A held prompt's chunks pipeline on worker processes too: a
		 * worker takes a page copy on its KV side ring between two
		 * steps, ahead of the chunks queued for it. In band, behind
		 * them, the pages left only after the whole prompt (H200, 1B,
		 * 2048-token prompt, two CUDA workers: first page 36.9 ms after
		 * the submission with the prefill done at 34.9; lone TTFT 1.68 x
		 * co-located), so it was off there. */
		so.pipeline_held = 1;
		so.replay_timeout_ms = (uint64_t)d->set->replay_timeout * 1000u;
		so.id_tag = (uint8_t)r;
		d->scheds[r] = ctrl_sched_create(d->chains[r], &so, err, sizeof(err));
		if (!d->scheds[r]) {
			logerr("replica %d: ctrl_sched_create failed: %s", r, err);
			return -errno;
		}
	}
	d->disp = ctrl_dispatch_create(d->scheds, d->n_rep);
	if (!d->disp) {
		logerr("ctrl_dispatch_create(%d replicas) failed: %s", d->n_rep, strerror(errno));
		return -errno;
	}
	return 0;
}

/* ---- readiness ---- */

/*
 * Can a replica serve? One can while every stage of its worker chain is up
 * (in-process chains have no stage that can fail alone); the others' waiting
 * requests move to it (ctrl_dispatch_poll), so with one replica of several
 * down the node still serves. Not ready while no replica can.
 * Fills @p why with each stage that is not ready. The chains' state belongs
 * to the scheduler thread; this reads it from an HTTP thread as /ctrl/status
 * (status_workers) reads it from the admin thread: plain loads of words the
 * scheduler writes, so a probe racing a re-form may see it one step old. It
 * is not done on the scheduler thread, where counting the tensors of every
 * stage (READY_KEEP_S's measurement) would hold a launch back.
 */
static int chains_ready(struct daemon *d, char *why, size_t whylen)
{
	size_t n = 0;
	int ok = 0, down = 0;
	struct ctrl_proc_stage ps;

	why[0] = 0;
	for (int r = 0; r < d->n_rep; r++) {
		int rep_ok = 1;

		for (int s = 0; ctrl_proc_chain_stage(d->chains[r], s, &ps) == 0; s++) {
			if (ps.up)
				continue;
			rep_ok = 0;
			if (n < whylen)
				n += (size_t)snprintf(why + n, whylen - n, "%s replica %d stage %d (layers %d-%d, "
						      "kvferry-worker pid %d) %s for %.1f s",
						      down++ ? ";" : "the stage chain cannot serve:", r, s, ps.layer_start,
						      ps.layer_end, ps.pid, ps.state, (double)ps.state_ms / 1e3);
		}
		ok |= rep_ok;
	}
	if (!ok && n < whylen)
		snprintf(why + n, whylen - n, " (it re-forms by itself once every stage's worker answers; "
			 "ctrlctl stages)");
	return ok;
}

/* HTTP threads: the backend's ready callback (ctrl_http.h). */
static int daemon_ready(void *ctx, char *why, size_t whylen)
{
	struct daemon *d = ctx;
	double now = kvf_mono_s();
	int ok;

	pthread_mutex_lock(&d->ready_mu);
	if (d->ready_at == 0 || now - d->ready_at >= READY_KEEP_S) {
		d->ready = chains_ready(d, d->ready_why, sizeof(d->ready_why));
		d->ready_at = now;
	}
	ok = d->ready;
	if (!ok)
		snprintf(why, whylen, "%s", d->ready_why);
	pthread_mutex_unlock(&d->ready_mu);
	return ok;
}

/* This node's page layout, as a prefill node's bootstrap info says its own. */
static struct ctrl_pd_info local_pd_info(const struct daemon *d)
{
	const struct kn_model_config *mc = kn_model_config(d->model);
	struct ctrl_pd_info info = {
		.tp_size = 1, .cp_size = 1, .dp_size = d->n_rep, .pp_size = d->n_stages, .page_size = KN_PAGE_BLK,
		.n_layers = mc->n_layers, .n_kv_heads = mc->n_kv_heads, .head_dim = mc->head_dim,
		.dataplane_node = -1,
	};

	snprintf(info.kv_dtype, sizeof(info.kv_dtype), "%s",
		 d->set->backend == CTRL_CFG_BACKEND_CUDA ? "bfloat16" : "float32");
	return info;
}

static int start_front(struct daemon *d)
{
	struct ctrl_http_opts ho;
	struct ctrl_http_backend be;
	int32_t eos[16];
	size_t n_eos;
	char err[1024];
	const struct kn_model_config *mc = kn_model_config(d->model);

	/* Stop on the tokenizer's EOS ids and the model's own (config and
	 * generation_config), without duplicates. */
	n_eos = kn_tok_eos_ids(d->tok, eos, 8);
	if (n_eos > 8)
		n_eos = 8;
	for (int i = 0; i < mc->n_eos; i++) {
		int dup = 0;
		for (size_t j = 0; j < n_eos; j++)
			dup |= eos[j] == mc->eos_token_ids[i];
		if (!dup && n_eos < 16)
			eos[n_eos++] = mc->eos_token_ids[i];
	}
	ctrl_http_opts_init(&ho);
	ho.address = d->set->listen_address;
	ho.port = (uint16_t)d->set->port;
	ho.threads = (int32_t)d->set->http_threads;
	ho.body_limit = (size_t)d->set->request_body_limit;
	ho.connection_timeout_s = (int32_t)d->set->connection_timeout;
	ho.request_timeout_s = (double)d->set->request_timeout;
	ho.cors_origins = d->set->cors_allow_origins;
	ho.max_connections = (int32_t)d->set->max_connections;
	ho.model_name = d->model_name;
	ho.max_context = d->max_context;
	ho.max_tokens_default = (int32_t)d->set->max_tokens_default;
	ho.tok = d->tok;
	ho.stop_ids = eos;
	ho.n_stop = (int32_t)n_eos;
	ho.model_path = d->set->model_dir;
	ho.pp_size = d->n_stages;
	if (d->set->pd_role != CTRL_CFG_PD_BOTH) {
		ho.pd_mode = d->set->pd_role == CTRL_CFG_PD_DECODE ? "decode" : "prefill";
	}
	ctrl_http_backend_sched(&be, d->disp);
	if (d->set->pd_role != CTRL_CFG_PD_BOTH && d->set->pd_dataplane_region[0]) {
		int dec = d->set->pd_role == CTRL_CFG_PD_DECODE;
		struct ctrl_pd_serve_opts po = {
			.role = dec ? CTRL_PD_SERVE_DECODE : CTRL_PD_SERVE_PREFILL,
			.region = d->set->pd_dataplane_region, .sched = d->scheds[0], .chain = d->chains[0],
			.n_stages = d->n_stages, .rank = 0, .base = be, .prefill = d->set->pd_prefill,
			.model_name = d->model_name, .local = local_pd_info(d),
			.heartbeat_s = (double)d->set->pd_heartbeat_interval,
			.heartbeat_failures = (int32_t)d->set->pd_heartbeat_failures,
			.room_timeout_s = (double)d->set->pd_room_timeout, .vocab_size = mc->vocab_size,
			.room_retries = (uint32_t)d->set->pd_room_retries,
			.page_buffers = (int32_t)d->set->pd_page_buffers,
			.worker_rx = (int)d->set->pd_worker_rx,
			.first_early = (int)d->set->pd_first_early,
			.pin_cuda = d->set->backend == CTRL_CFG_BACKEND_CUDA ? d->set->cuda_module : NULL,
		};

		d->pd = ctrl_pd_serve_start(&po, err, sizeof(err));
		if (d->pd == NULL) {
			logerr("role %s: %s", dec ? "decode" : "prefill", err);
			return -ENOENT;
		}
		ctrl_pd_serve_backend(d->pd, &be);
		if (dec)
			logmsg("role decode: prompts go to the prefill nodes %s, their KV pages arrive over the "
			       "dataplane on region %s", d->set->pd_prefill, d->set->pd_dataplane_region);
		else
			logmsg("role prefill: rooms' KV pages leave over the dataplane on region %s",
			       d->set->pd_dataplane_region);
	}
	/* after the PD wrap, which replaces the backend's ctx but not these */
	be.ready = daemon_ready;
	be.ready_ctx = d;
	be.node_stats = ctrld_dataplane_json;
	be.node_ctx = d;
	d->http = ctrl_http_start(&ho, &be, err, sizeof(err));
	if (!d->http) {
		logerr("%s", err);
		return -errno;
	}
	d->admin = ctrl_admin_start(d->set->admin_socket, 0660, err, sizeof(err));
	if (!d->admin) {
		logerr("%s", err);
		return -errno;
	}
	return ctrld_admin_register(d);
}

/*
 * role = prefill: register this node's ranks (one per replica x stage: dp =
 * replicas, pp = stages, as SGLang counts them) and answer the bootstrap
 * routes on listen_address:bootstrap_port.
 */
static int start_pd(struct daemon *d)
{
	struct ctrl_pd_info info = local_pd_info(d);
	char err[512], host[CTRL_CFG_STRLEN];
	const char *colon;
	int port;

	if (d->pd != NULL && ctrl_pd_serve_admin_register(d->pd, d->admin) < 0)
		logwarn("ctrlctl rooms: could not register the admin command");
	if (d->set->pd_role != CTRL_CFG_PD_PREFILL)
		return ctrl_pd_boot_admin_register(d->admin, NULL, (int)d->set->pd_role);
	info.dataplane_node = ctrl_pd_serve_node(d->pd);
	info.api_port = ctrl_http_port(d->http);
	d->pd_boot = ctrl_pd_boot_create();
	if (d->pd_boot == NULL) {
		logerr("out of memory creating the bootstrap registry");
		return -ENOMEM;
	}
	d->pd_srv = ctrl_pd_boot_serve(d->pd_boot, d->set->listen_address, (int)d->set->bootstrap_port, err,
				       sizeof(err));
	if (d->pd_srv == NULL) {
		logerr("%s", err);
		return -EADDRINUSE;
	}
	/* rank_address "host:port" ("[v6]:port"), or listen_address and the routes' port */
	port = ctrl_pd_boot_server_port(d->pd_srv);
	ctrl_http_set_bootstrap_port(d->http, port); /* GET /get_server_info */
	snprintf(host, sizeof(host), "%s", d->set->listen_address);
	colon = strrchr(d->set->rank_address, ':');
	if (d->set->rank_address[0]) {
		char *end;
		long p = colon ? strtol(colon + 1, &end, 10) : -1;
		const char *h = d->set->rank_address;
		size_t hl = colon ? (size_t)(colon - h) : 0;

		if (colon == NULL || *end || p < 0 || p > 65535 || hl == 0) {
			logerr("rank_address '%s' is not host:port (write e.g. 10.0.0.5:7000)", d->set->rank_address);
			return -EINVAL;
		}
		if (h[0] == '[' && hl > 2 && h[hl - 1] == ']') {
			h++;
			hl -= 2;
		}
		snprintf(host, sizeof(host), "%.*s", (int)hl, h);
		port = (int)p;
	}
	if (strlen(host) >= sizeof(((struct ctrl_pd_rank *)0)->ip)) {
		logerr("rank address host '%s' is longer than %zu bytes", host, sizeof(((struct ctrl_pd_rank *)0)->ip) - 1);
		return -EINVAL;
	}
	for (int r = 0; r < d->n_rep; r++)
		for (int k = 0; k < d->n_stages; k++) {
			struct ctrl_pd_rank rk = { .dp = r, .cp = 0, .tp = 0, .pp = k, .port = port,
						   .layer_start = k ? d->ends[k - 1] : 0, .layer_end = d->ends[k] };

			snprintf(rk.ip, sizeof(rk.ip), "%.63s", host);
			if (ctrl_pd_boot_register(d->pd_boot, &info, &rk, err, sizeof(err))) {
				logerr("registering prefill rank dp %d pp %d: %s", r, k, err);
				return -EINVAL;
			}
		}
	logmsg("role prefill: bootstrap routes on http://%s:%d (PUT/GET /route, GET /health), %d rank(s) "
	       "registered as %s:%d", d->set->listen_address, ctrl_pd_boot_server_port(d->pd_srv),
	       d->n_rep * d->n_stages, host, port);
	return ctrl_pd_boot_admin_register(d->admin, d->pd_srv, (int)d->set->pd_role);
}

static void teardown(struct daemon *d)
{
	ctrl_pd_boot_server_stop(d->pd_srv);
	ctrl_pd_boot_destroy(d->pd_boot);
	ctrl_admin_stop(d->admin);
	ctrl_dispatch_destroy(d->disp);
	for (int r = 0; r < d->n_rep; r++)
		ctrl_sched_destroy(d->scheds[r]);
	/* after the schedulers (their callbacks reach it), before the chains:
	 * its link lives in the region a worker chain maps, and its poller
	 * waits on that region's rings until it is stopped (a chain destroyed
	 * first unmapped them under it: a SIGSEGV at SIGTERM, seen by the PD
	 * fault drill with worker processes) */
	ctrl_pd_serve_stop(d->pd);
	for (int r = 0; r < d->n_rep; r++)
		ctrl_chain_destroy(d->chains[r]);
	kn_tok_close(d->tok);
	kn_model_close(d->model);
	ctrl_config_free(d->cfg);
	curl_global_cleanup();
}

/* Poll the schedulers until @p done says stop; a poll failure is logged once.
 * Within poll_spin_us of the last poll that did something the loop polls
 * again at once: a GPU step returns in a millisecond or two, and a sleep
 * there delays the next launch by its wake-up (measured on the H200 before
 * this: 1B batch 1 served 0.86 of the engine, ~165 us of host turnaround a
 * step). Past it, the 50 us sleep keeps an idle daemon off the CPU. */
static void poll_once(struct daemon *d)
{
	static atomic_int reported;
	static _Thread_local double last_busy;
	int rc = ctrl_dispatch_poll(d->disp);

	if (rc < 0 && !atomic_exchange(&reported, 1))
		logerr("ctrl_dispatch_poll failed: %s (the requests involved were ended with an error)", strerror(-rc));
	if (rc != CTRL_SCHED_IDLE) {
		last_busy = d->spin_s > 0 ? kvf_mono_s() : 0;
	} else if (d->spin_s > 0 && kvf_mono_s() - last_busy < d->spin_s) {
		sched_yield();
	} else {
		struct timespec ts = {0, IDLE_SLEEP_NS};

		/* (an idle scheduler still ticks its chain: a worker chain re-forms) */
		nanosleep(&ts, NULL);
	}
}

static void *poller(void *arg)
{
	struct daemon *d = arg;

	while (!atomic_load(&d->stop_poller))
		poll_once(d);
	return NULL;
}

static void serve(struct daemon *d)
{
	double deadline = 0;
	int cancelled = 0;

	while (!g_term)
		poll_once(d);
	/* Drain: refuse new work, let what is in flight finish. */
	ctrl_http_set_draining(d->http, 1);
	atomic_store(&d->stopping, 1);
	sd_notify(0, "STOPPING=1\nSTATUS=draining before exit");
	logmsg("SIGTERM: draining %d request(s), at most %lld s", ctrl_http_active(d->http),
	       (long long)d->set->drain_timeout);
	deadline = kvf_mono_s() + (double)d->set->drain_timeout;
	while (ctrl_http_active(d->http) > 0) {
		poll_once(d);
		if (!cancelled && kvf_mono_s() > deadline) {
			logwarn("drain_timeout (%lld s) passed: cancelling %d request(s); raise drain_timeout to wait longer",
			       (long long)d->set->drain_timeout, ctrl_http_cancel_all(d->http));
			cancelled = 1;
			deadline = kvf_mono_s() + 5;
		} else if (cancelled && kvf_mono_s() > deadline) {
			logwarn("requests did not end 5 s after cancel: exiting anyway");
			break;
		}
	}
	/* ctrl_http_stop cancels what is left and waits for the backend's
	 * last callbacks: keep the schedulers turning on a helper thread
	 * meanwhile (this thread is blocked in the stop). */
	{
		pthread_t th;
		struct ctrl_http *h = d->http;

		atomic_store(&d->stop_poller, 0);
		if (pthread_create(&th, NULL, poller, d) == 0) {
			ctrl_http_stop(h);
			atomic_store(&d->stop_poller, 1);
			pthread_join(th, NULL);
		} else {
			logerr("pthread_create(poller) failed: leaving the HTTP server to process exit");
		}
		d->http = NULL;
	}
}

static void usage(void)
{
	printf("usage: kvferry-ctrld [--config PATH] [--print-config] [--check] [OPTION VALUE ...]\n"
	       "Serves an OpenAI-compatible API for the model in model_dir.\n"
	       "Configuration: %s (INI), then KVFERRY_* variables, then these options:\n", CTRL_CONFIG_PATH);
	ctrl_config_print_usage(stdout);
}

int main(int argc, char **argv)
{
	struct daemon d;
	struct sigaction sa;
	int check_only = 0, rc;

	memset(&d, 0, sizeof(d));
	d.t0 = kvf_mono_s();
	pthread_mutex_init(&d.ready_mu, NULL);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--print-config")) {
			return ctrl_config_print_defaults(stdout) ? 1 : 0;
		} else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage();
			return 0;
		} else if (!strcmp(argv[i], "--version")) {
			printf("kvferry-ctrld %s\n", KVF_VERSION);
			return 0;
		} else if (!strcmp(argv[i], "--check")) {
			check_only = 1;
		}
	}
	if (load_config(&d, argc, argv)) {
		ctrl_config_free(d.cfg);
		return 2;
	}
	if (d.set->pd_role == CTRL_CFG_PD_DECODE && (!d.set->pd_dataplane_region[0] || !d.set->pd_prefill[0])) {
		/* refused rather than served co-located: an operator who asked for
		 * disaggregation must not get something else without noticing */
		fprintf(stderr, "kvferry-ctrld: [pd] role = decode needs [pd] dataplane_region (the region "
			"kvferry-dataplane created on this node: KV pages arrive there) and [pd] prefill (the "
			"prefill nodes' bootstrap addresses, host:port, ...)\n");
		ctrl_config_free(d.cfg);
		return 2;
	}
	if (d.set->pd_role == CTRL_CFG_PD_DECODE && d.set->replicas > 1) {
		fprintf(stderr, "kvferry-ctrld: [pd] role = decode serves one replica for now: unset replicas\n");
		ctrl_config_free(d.cfg);
		return 2;
	}
	if (d.set->pd_role != CTRL_CFG_PD_BOTH && d.set->pd_dataplane_region[0] && d.set->worker_region[0]
	    && strcmp(d.set->pd_dataplane_region, d.set->worker_region) != 0) {
		/* the workers copy pages straight to and from the dataplane's buffers */
		fprintf(stderr, "kvferry-ctrld: [pd] dataplane_region = %s but worker_region = %s: KV pages move "
			"between the workers and the dataplane in one region: run the workers on the dataplane's "
			"region and set both to it\n", d.set->pd_dataplane_region, d.set->worker_region);
		ctrl_config_free(d.cfg);
		return 2;
	}
	if (check_only) {
		/* the model directory is part of the configuration: a --check that
		 * passes must mean the daemon would start serving it */
		rc = open_model(&d);
		if (rc == 0)
			printf("configuration OK (model %s: %d layers in %d stage(s), context %d)\n", d.model_name,
			       kn_model_config(d.model)->n_layers, d.n_stages, d.max_context);
		kn_tok_close(d.tok);
		kn_model_close(d.model);
		ctrl_config_free(d.cfg);
		return rc == 0 ? 0 : 2;
	}
	/* before any thread: libcurl's global set-up is not thread-safe */
	curl_global_init(CURL_GLOBAL_DEFAULT);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	kvf_log_crash_trace("kvferry-ctrld"); /* a crash leaves its frames in the journal */

	/* 1 us timer slack: the idle poll's 50 us sleep would otherwise last
	 * up to 100 us (the default slack is 50 us) */
	prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
	d.spin_s = (double)(d.set->poll_spin_us >= 0 ? d.set->poll_spin_us
			    : d.set->backend == CTRL_CFG_BACKEND_CUDA ? 2000 : 0) * 1e-6;
	rc = open_model(&d);
	if (!rc)
		rc = build_pipelines(&d);
	if (!rc)
		rc = start_front(&d);
	if (!rc)
		rc = start_pd(&d);
	if (rc) {
		ctrl_http_stop(d.http);
		teardown(&d);
		return 1;
	}
	logmsg("serving %s (%s, %d layers in %d stage(s) x %d replica(s), context %d) on http://%s:%u, admin %s",
	       d.model_name, kn_arch_name(kn_model_config(d.model)->arch), kn_model_config(d.model)->n_layers,
	       d.n_stages, d.n_rep, d.max_context, d.set->listen_address, ctrl_http_port(d.http),
	       d.set->admin_socket);
	sd_notifyf(0, "READY=1\nSTATUS=serving %s on %s:%u", d.model_name, d.set->listen_address,
		   ctrl_http_port(d.http));
	serve(&d);
	teardown(&d);
	logmsg("stopped");
	return 0;
}
