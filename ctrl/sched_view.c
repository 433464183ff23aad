/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The schedulers' admin commands (`ctrlctl stages`, `ctrlctl pool`): per
 * replica and stage what ran, and where every KV block, ring slot and
 * buffer is, registered by the module itself (ctrl_sched.h
 * ctrl_sched_admin_register()).
 */
#include <errno.h>
#include <stdio.h>

#include "ctrl_admin.h"
#include "ctrl_proc_chain.h"
#include "ctrl_sched.h"

static int cmd_stages(void *arg, const char *cmd, json_t *params, json_t **data, char *err, size_t errlen)
{
	const struct ctrl_sched_view *d = arg;
	json_t *reps = json_array(), *stages = json_array();

	(void)cmd;
	(void)params;
	(void)err;
	(void)errlen;
	for (int r = 0; r < d->n; r++) {
		struct ctrl_sched_stats st;
		ctrl_sched_stats(d->scheds[r], &st);
		json_array_append_new(reps, json_pack("{s:i, s:i, s:i, s:f, s:f, s:f, s:I}", "replica", r,
			"stages", st.n_stages, "groups", st.n_groups, "occupancy", st.occupancy,
			"ideal_occupancy", st.ideal_occupancy, "round_trip_us", st.mean_round_trip_us,
			"launches", (json_int_t)st.launches));
		for (int s = 0; s < st.n_stages; s++) {
			char layers[32];
			snprintf(layers, sizeof(layers), "%d-%d", s ? d->ends[s - 1] : 0, d->ends[s]);
			json_t *js = json_pack("{s:i, s:i, s:s, s:I, s:I, s:f, s:f}", "replica", r,
				"stage", s, "layers", layers, "steps", (json_int_t)st.stage[s].steps,
				"cols", (json_int_t)st.stage[s].cols, "mean_step_us", st.stage[s].mean_step_us,
				"busy_frac", st.stage[s].busy_frac);
			struct ctrl_proc_stage ps;

			/* Stages in worker processes: which process, where, and whether it answers. */
			if (ctrl_proc_chain_stage(d->chains[r], s, &ps) == 0) {
				char pids[8 * 12] = "";

				/* tensor parallelism: its ranks' processes, rank 0 first */
				for (int k = 0, at = 0; k < ps.tp_size && k < 8; k++)
					at += snprintf(pids + at, sizeof(pids) - (size_t)at, "%s%d", k ? "," : "",
						       (int)ps.tp_pids[k]);
				json_object_update_new(js, json_pack("{s:s, s:i, s:i, s:s, s:b, s:i, s:i, s:s}", "worker",
					ps.role, "pid", ps.pid, "node", ps.node, "backend", ps.backend, "up", ps.up,
					"kv_blocks", ps.n_blocks, "tp", ps.tp_size, "tp_pids", ps.tp_size > 1 ? pids : "-"));
			}
			json_array_append_new(stages, js);
		}
	}
	*data = json_pack("{s:o, s:o}", "pipelines", reps, "stages", stages);
	return 0;
}

/* Worker-process chains: what sits in ctrld's region's rings and pools, so
 * an operator (and the leak test) sees every slot and buffer come back. */
static void pool_shm(struct ctrl_chain *c, json_t *row)
{
	struct ctrl_proc_shm sh;
	json_t *rings, *pools;

	if (ctrl_proc_chain_shm(c, &sh) < 0)
		return;
	rings = json_array();
	pools = json_array();
	for (int i = 0; i < sh.n_rings; i++)
		json_array_append_new(rings, json_pack("{s:s, s:i, s:i}", "name", sh.ring[i].name, "queued",
						       (int)sh.ring[i].used, "capacity", (int)sh.ring[i].capacity));
	for (int i = 0; i < sh.n_pools; i++)
		json_array_append_new(pools, json_pack("{s:s, s:i, s:i}", "name", sh.pool[i].name, "available",
						       (int)(sh.pool[i].capacity - sh.pool[i].used), "count",
						       (int)sh.pool[i].capacity));
	json_object_update_new(row, json_pack("{s:i, s:i, s:i, s:i, s:i, s:o, s:o}", "ring_entries",
		(int)sh.ring_entries, "shm_bufs", (int)sh.pool_buffers, "shm_bufs_free", (int)sh.pool_available,
		"groups_busy", sh.groups_busy, "tainted_slots", sh.tainted_slots, "rings", rings, "pools", pools));
}

static int cmd_pool(void *arg, const char *cmd, json_t *params, json_t **data, char *err, size_t errlen)
{
	const struct ctrl_sched_view *d = arg;
	json_t *rows = json_array();

	(void)cmd;
	(void)params;
	(void)err;
	(void)errlen;
	for (int r = 0; r < d->n; r++) {
		struct ctrl_sched_stats st;
		ctrl_sched_stats(d->scheds[r], &st);
		json_array_append_new(rows, json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:I}",
			"replica", r, "blocks_total", st.blocks_total, "blocks_in_use", st.blocks_in_use,
			"blocks_cached", st.blocks_cached,
			"blocks_reserved", st.blocks_reserved, "live", st.live, "queued", st.queued,
			"replaying", st.replaying, "replayed", (json_int_t)st.replayed,
			"live_bytes", (json_int_t)st.live_bytes, "queued_bytes", (json_int_t)st.queued_bytes));
		pool_shm(d->chains[r], json_array_get(rows, json_array_size(rows) - 1));
	}
	*data = rows;
	return 0;
}

int ctrl_sched_admin_register(struct ctrl_admin *a, const struct ctrl_sched_view *v)
{
	int rc = ctrl_admin_register(a, "/sched/stages",
				     "per-stage steps, columns, step time, busy share; pipeline occupancy and round trip",
				     cmd_stages, (void *)v);

	return rc ? rc : ctrl_admin_register(a, "/sched/pool",
					    "KV block pool per replica: total, in use, reserved for admitted worst cases",
					    cmd_pool, (void *)v);
}
