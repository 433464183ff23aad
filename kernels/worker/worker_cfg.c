/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-worker's configuration table ([worker] in kvferry.conf,
 * KVFERRY_WK_* variables, flags) and its reading (worker_cfg.h).
 *
 * One node runs one worker per stage, each from the same file:
 * kvferry-worker@K.service passes --instance K, which reads [worker.K] over
 * [worker] (the settings every stage shares there, its hops and device in
 * its own section), and makes "stageK" its role unless one is set: two
 * workers of one role would claim one liveness slot and one area prefix.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shm_live.h"
#include "worker_cfg.h"

#define OFF(f) offsetof(struct wk_settings, f)

static const char *const backend_names[] = { "cpu", "cuda", NULL };
static const char *const cuda_gemv_names[] = { "auto", "ffma", "mma", NULL };
static const char *const cuda_wide_x_names[] = { "round", "split", NULL };
static const char *const cuda_attn_names[] = { "auto", "column", "tile", NULL };
static const char *const pieces_names[] = { "auto", "yes", "no", NULL };

static const struct cfg_key keys[] = {
	{ "region", "worker", CFG_STRING, OFF(region), "", 0, 0, "KVFERRY_WK_REGION", "--region", NULL, NULL,
	  "the node's shm region (created by kvferry-dataplane or ctrld); required" },
	{ "model", "worker", CFG_STRING, OFF(model), "", 0, 0, "KVFERRY_WK_MODEL", "--model", NULL, NULL,
	  "the model directory (the same model as ctrld's: checked at join); required" },
	{ "in", "worker", CFG_STRING, OFF(in), "", 0, 0, "KVFERRY_WK_IN", "--in", NULL, NULL,
	  "where micro-batches arrive: ring:NAME (a ring on this node) or dp (the dataplane's receive "
	  "ring); required" },
	{ "out", "worker", CFG_STRING, OFF(out), "", 0, 0, "KVFERRY_WK_OUT", "--out", NULL, NULL,
	  "where they go next: ring:NAME, or peer:NODE[/STREAM] (the dataplane toward another node); "
	  "required" },
	{ "role", "worker", CFG_STRING, OFF(role), "stage0", 0, 0, "KVFERRY_WK_ROLE", "--role", NULL, NULL,
	  "liveness role and area prefix" },
	{ "backend", "worker", CFG_ENUM, OFF(backend), "cpu", 0, 1, "KVFERRY_WK_BACKEND", "--backend",
	  backend_names, NULL, "stage engine" },
	{ "node", "worker", CFG_INT, OFF(node), "-1", -1, 65535, "KVFERRY_WK_NODE", "--node", NULL, NULL,
	  "this node's dataplane id, for reports (-1: none)" },
	{ "threads", "worker", CFG_INT, OFF(threads), "0", 0, 1024, "KVFERRY_WK_THREADS", "--threads", NULL,
	  NULL, "CPU engine threads (0: what ctrld asks, else online cores)" },
	{ "kv_mib", "worker", CFG_INT, OFF(kv_mib), "0", 0, 16777216, "KVFERRY_WK_KV_MIB", "--kv-mib", NULL,
	  NULL, "CPU KV pool budget in MiB (0: what ctrld asks)" },
	{ "device", "worker", CFG_INT, OFF(device), "0", 0, 63, "KVFERRY_WK_DEVICE", "--device", NULL, NULL,
	  "CUDA device ordinal" },
	{ "cuda_gemv", "worker", CFG_ENUM, OFF(cuda_gemv), "auto", 0, 2, "KVFERRY_WK_CUDA_GEMV", "--cuda-gemv",
	  cuda_gemv_names, NULL, "cuda: skinny products (plans <= 16 columns): auto (FFMA at 1 column, tensor "
	  "cores at 2..16), ffma or mma everywhere" },
	{ "cuda_wide_x", "worker", CFG_ENUM, OFF(cuda_wide_x), "round", 0, 1, "KVFERRY_WK_CUDA_WIDE_X",
	  "--cuda-wide-x", cuda_wide_x_names, NULL, "cuda: plans > 16 columns round X to bf16 (round), or "
	  "add the remainder's product (split: f32-grade X, twice the tensor work)" },
	{ "cuda_attn", "worker", CFG_ENUM, OFF(cuda_attn), "auto", 0, 2, "KVFERRY_WK_CUDA_ATTN", "--cuda-attn",
	  cuda_attn_names, NULL, "cuda: attention kernel: auto (tile kernel on plans > 16 columns, column "
	  "kernel below), column or tile everywhere" },
	{ "cuda_batch_invariant", "worker", CFG_BOOL, OFF(cuda_batch_invariant), "no", 0, 1,
	  "KVFERRY_WK_CUDA_BATCH_INVARIANT", "--cuda-batch-invariant", NULL, NULL,
	  "cuda: yes: one numerics family at every plan width (warpgroup-MMA linears, tile attention in "
	  "fixed pieces), so a request's tokens do not depend on what it is batched with; Hopper only "
	  "(refused at start elsewhere); decode steps take 0.94-1.17x as long, prompt chunks 1.3-1.4x (H100)" },
	{ "cuda_module", "worker", CFG_STRING, OFF(cuda_module), "", 0, 0, "KVFERRY_WK_CUDA_MODULE",
	  "--cuda-module", NULL, NULL, "cuda: the CUDA backend's module, kvferry-cuda.so (empty: beside the "
	  "program, else the kvferry-cuda package's)" },
	{ "wait", "worker", CFG_INT, OFF(wait_s), "60", 0, 86400, "KVFERRY_WK_WAIT", "--wait", NULL, NULL,
	  "seconds to wait for the region to appear" },
	{ "depth", "worker", CFG_INT, OFF(depth), "0", 0, KN_STEP_DEPTH, "KVFERRY_WK_DEPTH", "--depth", NULL,
	  NULL, "micro-batches in flight on the engine (0: 2 on cuda, where the next step queues behind the "
	  "running one; 1 on cpu)" },
	{ "spin_us", "worker", CFG_INT, OFF(spin_us), "-1", -1, 1000000, "KVFERRY_WK_SPIN_US", "--spin-us", NULL,
	  NULL, "poll the input this long after the last message before sleeping in the ring's futex (-1: "
	  "2000 on cuda, where a futex wake-up costs tens of us a step; 0 on cpu)" },
	{ "kv_rx_pieces", "worker", CFG_ENUM, OFF(kv_rx_pieces), "auto", 0, 2, "KVFERRY_WK_KV_RX_PIECES",
	  "--kv-rx-pieces", pieces_names, NULL, "KV page messages a dataplane received in place ([dp] rx_in_place): "
	  "import them from their frames where they lie (yes: on cuda one gather kernel a message), or take them "
	  "reassembled (no); auto: yes on cpu, no on cuda (the kernel time-slices against other processes' kernels on "
	  "a shared GPU; yes where the GPU is the worker's own or MPS is on: dataplane/BENCH.md)" },
	{ "tp_size", "worker", CFG_INT, OFF(tp_size), "1", 1, 8, "KVFERRY_WK_TP_SIZE", "--tp-size", NULL, NULL,
	  "tensor parallelism: the stage runs as this many worker processes (1, 2, 4 or 8), each holding "
	  "its share of every layer's heads and MLP columns; rank 0 reads the stage's input and answers "
	  "for the stage, the others take what it hands them. Set it in [worker.K] and start instance K "
	  "(rank 0) and K-1 .. K-(tp_size - 1) (kvferry-worker@K-R.service): each rank reads [worker.K]" },
	{ "tp_rank", "worker", CFG_INT, OFF(tp_rank), "0", 0, 7, "KVFERRY_WK_TP_RANK", "--tp-rank", NULL, NULL,
	  "tensor parallelism: this worker's rank in its stage (0 .. tp_size - 1; give each rank its own role); "
	  "instance K-R is rank R (role stageK.tpR) unless set" },
	{ "tp_devices", "worker", CFG_STRING, OFF(tp_devices), "", 0, 0, "KVFERRY_WK_TP_DEVICES", "--tp-devices",
	  NULL, NULL, "cuda, tensor parallelism: the CUDA devices of the stage's ranks in rank order, e.g. "
	  "0,1,2,3 (rank R on the R-th; the ranks sum with NCCL when each has its own); empty: device for "
	  "every rank" },
	{ "trace", "worker", CFG_STRING, OFF(trace), "", 0, 0, "KVFERRY_WK_TRACE", "--trace", NULL, NULL,
	  "a diagnostic: write each step's times (taken, done, columns, sequences decoding; CLOCK_MONOTONIC ns) to this file" },
};

static const char *const sections[] = { "worker", NULL };
/* ctrld's and the dataplane's sections of the same file */
static const char *const foreign[] = { "http", "model", "engine", "sched", "ctrl", "pd", "dp", NULL };

static const struct cfg_table table = {
	.program = "kvferry-worker",
	.keys = keys,
	.n_keys = sizeof(keys) / sizeof(keys[0]),
	.sections = sections,
	.foreign_sections = foreign,
	.env_prefix = "KVFERRY_WK_",
	.env_skip = NULL,
	.settings_size = sizeof(struct wk_settings),
	.instances = 1,
};

/* tp_devices: this rank's device, the tp_rank-th of the list (device, if set too, must agree). */
static int tp_device(struct cfg *c, const struct wk_settings *s, struct wk_opts *o, char *err, size_t errlen)
{
	const char *p = s->tp_devices, *origin;
	int32_t n = 0, dev = -1;

	while (*p) {
		char *end;
		long d = strtol(p, &end, 10);

		if (end == p || d < 0 || d > 63 || (*end != ',' && *end != 0)) {
			cfg_source(c, "tp_devices", &origin);
			snprintf(err, errlen, "tp_devices '%s' (from %s) is not a list of CUDA devices 0..63 such as "
				 "0,1,2,3", s->tp_devices, origin);
			return -EINVAL;
		}
		if (n++ == o->tp_rank)
			dev = (int32_t)d;
		p = *end ? end + 1 : end;
	}
	if (n != o->tp_size) {
		cfg_source(c, "tp_devices", &origin);
		snprintf(err, errlen, "tp_devices '%s' (from %s) names %d devices for the stage's %d ranks: give one "
			 "per rank, in rank order", s->tp_devices, origin, (int)n, (int)o->tp_size);
		return -EINVAL;
	}
	if (cfg_source(c, "device", &origin) != CFG_SRC_DEFAULT && o->device != dev) {
		snprintf(err, errlen, "device %d (from %s) is not rank %d's of tp_devices '%s': set one of them",
			 (int)o->device, origin, (int)o->tp_rank, s->tp_devices);
		return -EINVAL;
	}
	o->device = dev;
	return 0;
}

int wk_load_opts(int argc, char **argv, int max_depth, struct wk_opts *o, struct cfg **cfgp, char *err,
		 size_t errlen)
{
	int rc;

	static const struct {
		const char *key, *env;
		size_t off;
	} required[] = { { "region", "KVFERRY_WK_REGION", OFF(region) }, { "model", "KVFERRY_WK_MODEL", OFF(model) },
			 { "in", "KVFERRY_WK_IN", OFF(in) }, { "out", "KVFERRY_WK_OUT", OFF(out) } };
	const struct wk_settings *s;
	const char *inst;
	struct cfg *c;
	int done = cfg_load_daemon(&table, "usage: kvferry-worker --region NAME --model DIR --in HOP --out HOP "
				   "[options]", argc, argv, NULL, &c, err, errlen);

	*cfgp = NULL;
	if (done < 0 || c == NULL)
		return done;
	inst = cfg_instance(c);
	if (inst != NULL && cfg_source(c, "role", NULL) == CFG_SRC_DEFAULT) {
		char role[CFG_INSTANCE_MAX + 16];
		int stage, rank = cfg_instance_rank(inst, &stage);

		/* K-R: rank R of stage K (rank 0 is the stage's own role) */
		if (rank > 0)
			snprintf(role, sizeof(role), "stage%d.tp%d", stage, rank);
		else if (rank == 0)
			snprintf(role, sizeof(role), "stage%d", stage);
		else
			snprintf(role, sizeof(role), "stage%s", inst);
		if (cfg_set(c, "role", role, CFG_SRC_DEFAULT, "--instance", err, errlen)) {
			cfg_free(c);
			return -EINVAL;
		}
	}
	if (inst != NULL && cfg_instance_rank(inst, NULL) >= 0 && cfg_source(c, "tp_rank", NULL) == CFG_SRC_DEFAULT) {
		char rank[16];

		snprintf(rank, sizeof(rank), "%d", cfg_instance_rank(inst, NULL));
		if (cfg_set(c, "tp_rank", rank, CFG_SRC_DEFAULT, "--instance", err, errlen)) {
			cfg_free(c);
			return -EINVAL;
		}
	}
	s = cfg_settings(c);
	for (size_t k = 0; k < sizeof(required) / sizeof(required[0]); k++) {
		if (!*((const char *)s + required[k].off)) {
			if (inst != NULL)
				snprintf(err, errlen, "%s is not set: give --%s, %s, [worker] %s or [worker.%s] %s",
					 required[k].key, required[k].key, required[k].env, required[k].key, inst,
					 required[k].key);
			else
				snprintf(err, errlen, "%s is not set: give --%s, %s or [worker] %s", required[k].key,
					 required[k].key, required[k].env, required[k].key);
			cfg_free(c);
			return -EINVAL;
		}
	}
	if (strlen(s->role) >= SHM_ROLE_MAX) {
		const char *origin;

		cfg_source(c, "role", &origin);
		snprintf(err, errlen, "role '%s' (from %s) is longer than %d bytes", s->role, origin, SHM_ROLE_MAX - 1);
		cfg_free(c);
		return -EINVAL;
	}
	memset(o, 0, sizeof(*o));
	o->region = s->region;
	o->model = s->model;
	o->in = s->in;
	o->out = s->out;
	o->role = s->role;
	o->trace = s->trace;
	o->cuda_module = s->cuda_module;
	o->backend = s->backend == 1 ? KN_BACKEND_CUDA : KN_BACKEND_CPU;
	o->node = (int32_t)s->node;
	o->threads = (int32_t)s->threads;
	o->kv_bytes = (size_t)s->kv_mib << 20;
	o->device = (int32_t)s->device;
	o->cuda_gemv = (int32_t)s->cuda_gemv;
	o->cuda_wide_x = (int32_t)s->cuda_wide_x;
	o->cuda_attn = (int32_t)s->cuda_attn;
	o->cuda_batch_invariant = (int32_t)s->cuda_batch_invariant;
	o->kv_rx_pieces = s->kv_rx_pieces == 1 || (s->kv_rx_pieces == 0 && o->backend != KN_BACKEND_CUDA);
	o->tp_size = (int32_t)s->tp_size;
	o->tp_rank = (int32_t)s->tp_rank;
	if ((o->tp_size & (o->tp_size - 1)) || o->tp_rank >= o->tp_size
	    || (o->tp_size > 1 && strncmp(o->in, "ring:", 5) != 0)) {
		snprintf(err, errlen, "tp_size %d, tp_rank %d: tensor parallelism takes tp_size 1, 2, 4 or 8, a rank "
			 "below it and a ring input (in = ring:NAME); run this stage with tp_size 1",
			 o->tp_size, o->tp_rank);
		cfg_free(c);
		return -EINVAL;
	}
	if (s->tp_devices[0] != 0 && (rc = tp_device(c, s, o, err, errlen)) < 0) {
		cfg_free(c);
		return rc;
	}
	o->wait_s = (int32_t)s->wait_s;
	o->depth = s->depth ? (int32_t)s->depth : o->backend == KN_BACKEND_CUDA ? 2 : 1;
	if (o->depth > max_depth)
		o->depth = max_depth;
	o->spin_us = s->spin_us >= 0 ? (int32_t)s->spin_us : o->backend == KN_BACKEND_CUDA ? 2000 : 0;
	*cfgp = c;
	if (done) {
		printf("configuration OK\n");
		printf("stage worker %s: in %s, out %s, %s backend", o->role, o->in, o->out,
		       o->backend == KN_BACKEND_CUDA ? "cuda" : "cpu");
		if (o->backend == KN_BACKEND_CUDA)
			printf(" on device %d", o->device);
		if (o->tp_size > 1)
			printf(", tensor-parallel rank %d of %d", o->tp_rank, o->tp_size);
		printf("\n");
	}
	return done;
}
