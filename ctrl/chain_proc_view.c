/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The worker chain as ctrlctl sees it: each stage's worker, layer range,
 * load and liveness (`ctrlctl workers`), and the node's rings and pools
 * (`ctrlctl pool`). Reads the chain's state; changes nothing.
 */
#include <stdio.h>
#include <string.h>

#include "chain_proc_int.h"
#include "dp_ipc.h"
#include "kn_model.h"
#include "wk_tp_area.h"

int ctrl_proc_chain_stage(struct ctrl_chain *cc, int32_t i, struct ctrl_proc_stage *out)
{
	struct proc_chain *c = (struct proc_chain *)cc;
	const struct shm_mb_stage *s;

	if (cc == NULL || cc->vt != &ctrl_proc_chain_vtbl || i < 0 || i >= c->o.n_stages)
		return -EINVAL;
	s = &c->st[i];
	memset(out, 0, sizeof(*out));
	out->layer_start = s->layer_start;
	out->layer_end = s->layer_end;
	out->pid = s->pid;
	out->node = s->node;
	out->n_blocks = s->n_blocks;
	snprintf(out->role, sizeof(out->role), "%s", s->role);
	snprintf(out->backend, sizeof(out->backend), "%s", s->backend);
	out->up = c->state == PC_UP && c->stage_up[i];
	out->weight_bytes = s->weight_bytes;
	out->kv_bytes = s->kv_bytes;
	out->load_ns = s->load_ns;
	kn_model_range_tensors(c->m, i == 0 ? 0 : c->ends[i - 1], c->ends[i], &out->n_tensors,
			       &out->tensor_bytes);
	out->tp_size = 1;
	if (c->reg != NULL) { /* a stage fed over the dataplane has no such area on this node */
		char name[SHM_AREA_NAME_MAX + 8];
		uint64_t off;
		size_t size;

		snprintf(name, sizeof(name), "%s.s%d.in" WK_TP_AREA_SUFFIX, c->o.prefix, (int)i);
		if (shm_region_find_area(c->reg, name, &off, &size) == 0 && size >= sizeof(struct wk_tp_area)) {
			const struct wk_tp_area *a = shm_ptr(c->reg, off);

			if (__atomic_load_n(&a->magic, __ATOMIC_ACQUIRE) == WK_TP_MAGIC && a->size > 1
			    && a->size <= WK_TP_MAX && a->leader_pid == s->pid) {
				out->tp_size = (int32_t)a->size;
				out->tp_pids[0] = a->leader_pid;
				for (uint32_t r = 1; r < a->size; r++)
					out->tp_pids[r] = a->r[r].pid;
			}
		}
	}
	if (c->state == PC_UP) {
		out->state = "ready";
	} else {
		/* Re-forming: a lost stage is down until every stage answered the
		 * join (its restarted worker loads its range first); the others
		 * kept their weights and wait in the join. */
		out->state = !c->stage_up[i] ? "down" : c->state == PC_JOINING ? "rejoining" : "pooling";
		out->state_ms = c->down_ns != 0 ? (kvf_mono_ns() - c->down_ns) / 1000000u : 0;
	}
	return 0;
}

static void shm_ring_obj(struct ctrl_proc_shm *out, struct shm_region *r, const char *name)
{
	struct shm_ring *q;
	struct ctrl_proc_shm_obj *o;

	if (out->n_rings >= CTRL_PROC_SHM_MAX || (q = shm_ring_lookup(r, name)) == NULL)
		return;
	o = &out->ring[out->n_rings++];
	snprintf(o->name, sizeof(o->name), "%s", name);
	o->used = shm_ring_count(q);
	o->capacity = shm_ring_capacity(q);
	out->ring_entries += o->used;
	shm_ring_close(q);
}

static void shm_pool_obj(struct ctrl_proc_shm *out, struct shm_region *r, const char *name)
{
	struct shm_pool *p;
	struct ctrl_proc_shm_obj *o;

	if (out->n_pools >= CTRL_PROC_SHM_MAX || (p = shm_pool_lookup(r, name)) == NULL)
		return;
	o = &out->pool[out->n_pools++];
	snprintf(o->name, sizeof(o->name), "%s", name);
	o->capacity = shm_pool_count(p);
	o->used = o->capacity - shm_pool_available(p);
	out->pool_buffers += o->capacity;
	out->pool_available += o->capacity - o->used;
	shm_pool_close(p);
}

/* The dataplane's send lanes that a process holds now (dp_ipc.h). */
static void dp_lanes_obj(struct ctrl_proc_shm *out, struct shm_region *r)
{
	const struct dp_tx_lanes *t;
	char name[SHM_NAME_MAX];
	uint64_t off;

	if (shm_region_find_area(r, DP_AREA_TXLANES, &off, NULL) < 0)
		return;
	t = shm_ptr(r, off);
	for (unsigned i = 0; i < DP_TX_LANES; i++)
		if (__atomic_load_n(&t->pid[i], __ATOMIC_RELAXED) > 0) {
			snprintf(name, sizeof(name), DP_RING_TX_LANE, i);
			shm_ring_obj(out, r, name);
			snprintf(name, sizeof(name), DP_RING_TXC_LANE, i);
			shm_ring_obj(out, r, name);
		}
}

int ctrl_proc_chain_shm(struct ctrl_chain *cc, struct ctrl_proc_shm *out)
{
	struct proc_chain *c = (struct proc_chain *)cc;
	static const char *const dp_rings[] = { DP_RING_RX, DP_RING_EV };
	char name[SHM_NAME_MAX];

	if (cc == NULL || cc->vt != &ctrl_proc_chain_vtbl)
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&c->mu); /* the poller may re-attach a re-created region */
	/* By name, not by the chain's handles: the stage rings between workers
	 * of this node are not ctrld's, and a lookup opens its own handle. */
	for (int32_t k = 0; k < c->o.n_stages; k++) {
		char side[SHM_NAME_MAX + 8];

		snprintf(name, sizeof(name), "%s.s%d.in", c->o.prefix, k);
		if (k > 0 || strcmp(name, c->o.first_ring) != 0)
			shm_ring_obj(out, c->reg, name);
		/* the stage's KV side rings (chain_proc_kv.c), where its worker made them */
		snprintf(side, sizeof(side), "%s.kv", k == 0 ? c->o.first_ring : name);
		shm_ring_obj(out, c->reg, side);
		snprintf(side, sizeof(side), "%s.kvr", k == 0 ? c->o.first_ring : name);
		shm_ring_obj(out, c->reg, side);
	}
	shm_ring_obj(out, c->reg, c->o.first_ring);
	if (c->o.return_ring != NULL)
		shm_ring_obj(out, c->reg, c->o.return_ring);
	for (size_t i = 0; i < sizeof(dp_rings) / sizeof(dp_rings[0]); i++)
		shm_ring_obj(out, c->reg, dp_rings[i]);
	dp_lanes_obj(out, c->reg);
	shm_pool_obj(out, c->reg, DP_POOL_RX_SMALL);
	shm_pool_obj(out, c->reg, DP_POOL_RX_LARGE);
	for (int32_t i = 0; i < c->o.max_groups; i++)
		out->groups_busy += c->g[i].busy != 0;
	for (int32_t i = 0; i < c->info.n_slots; i++)
		out->tainted_slots += c->tainted[i] != 0;
	pthread_mutex_unlock(&c->mu);
	return 0;
}

struct shm_region *ctrl_proc_chain_region(struct ctrl_chain *cc)
{
	struct proc_chain *c = (struct proc_chain *)cc;

	if (cc == NULL || cc->vt != &ctrl_proc_chain_vtbl)
		return NULL;
	/* Its user (the PD link) keeps it: a re-attach leaves it mapped. */
	pthread_mutex_lock(&c->mu);
	c->lent = c->reg;
	pthread_mutex_unlock(&c->mu);
	return c->lent;
}
